//! G8 — store outages are a policy: with the store unreachable a route fails
//! closed (`503` + `Retry-After`) or, where configured, fails open, and the
//! same gateway recovers by itself. A private PostgreSQL cluster (stopped
//! `pg_ctl stop -m immediate`) and a private `redis-server` (stopped, frozen,
//! restarted) under a running gateway; the shared servers other tests use
//! are never touched. And what is not an outage never fails open: a record
//! the build cannot read, a full memory store.

use std::time::Duration;

use http::StatusCode;

use crate::support::servers::{PgCluster, PrivateRedis};
use crate::support::{
    Backend, Gateway, HttpClient, Set, Setup, TestConfig, TestStore, Upstream, client, eventually,
    post,
};

async fn created_eventually(c: &HttpClient, url: &str, key: &str) -> bool {
    eventually(Duration::from_secs(20), || async {
        (post(c, url, key, "{}").await.status == StatusCode::CREATED).then_some(())
    })
    .await
    .is_some()
}

#[tokio::test]
async fn stopped_redis_fails_closed_then_recovers_without_restart() {
    let mut redis = PrivateRedis::start();
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&TestConfig::new(&redis.url(), &upstream.url())).await;
    let c = client();
    let url = gateway.url("/v1/payments");
    assert_eq!(
        post(&c, &url, "before", "{}").await.status,
        StatusCode::CREATED
    );
    assert_eq!(gateway.readyz().await, StatusCode::OK);

    redis.kill();
    assert_eq!(gateway.readyz().await, StatusCode::SERVICE_UNAVAILABLE);
    let down = post(&c, &url, "during", "{}").await;
    assert_eq!(down.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        down.problem_type(),
        "urn:idemgate:problem:store-unavailable"
    );
    assert!(down.header("retry-after").is_some());
    assert_eq!(
        upstream.count("during"),
        0,
        "nothing is forwarded without a claim"
    );

    redis.restart();
    assert!(
        created_eventually(&c, &url, "after").await,
        "the gateway recovered by itself"
    );
    assert_eq!(gateway.readyz().await, StatusCode::OK);
    assert_eq!(upstream.count("after"), 1);
}

#[tokio::test]
async fn frozen_redis_answers_503_within_the_store_timeout() {
    let redis = PrivateRedis::start();
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&TestConfig::new(&redis.url(), &upstream.url())).await;
    let c = client();
    let url = gateway.url("/v1/payments");
    assert_eq!(
        post(&c, &url, "warm", "{}").await.status,
        StatusCode::CREATED
    );

    redis.signal("-STOP");
    let frozen = post(&c, &url, "frozen", "{}").await;
    assert_eq!(frozen.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(upstream.count("frozen"), 0);

    redis.signal("-CONT");
    assert!(created_eventually(&c, &url, "thawed").await);
    assert!(
        post(&c, &url, "warm", "{}").await.is_replay(),
        "records survive a freeze"
    );
}

#[tokio::test]
async fn stopped_redis_fails_open_when_configured() {
    let mut redis = PrivateRedis::start();
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&redis.url(), &upstream.url()).route(|r| {
        r.set("on_store_error", "fail_open");
    });
    let gateway = Gateway::start(&config).await;
    let c = client();
    let url = gateway.url("/v1/payments");
    redis.kill();
    let open = post(&c, &url, "open", "{}").await;
    assert_eq!(open.status, StatusCode::CREATED);
    assert!(!open.is_replay());
    assert_eq!(upstream.count("open"), 1);
}

/// After Redis restarts, the gateway reconnects with at most one connection
/// per lane (`pool_size`) per reset, however many requests arrive at once:
/// no reconnect storm.
#[tokio::test]
async fn a_restart_is_followed_by_at_most_pool_size_connects() {
    let mut redis = PrivateRedis::start();
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&redis.url(), &upstream.url()).store(|s| {
        s.set("pool_size", 4);
    });
    let gateway = Gateway::start(&config).await;
    let c = client();
    let url = gateway.url("/v1/payments");
    assert_eq!(
        post(&c, &url, "warm", "{}").await.status,
        StatusCode::CREATED
    );

    redis.kill();
    redis.restart();
    // The first request finds the old connections broken and resets them.
    let _ = post(&c, &url, "first", "{}").await;
    let burst = (0..50).map(|i| {
        let (c, url) = (c.clone(), url.clone());
        async move { post(&c, &url, &format!("burst-{i}"), "{}").await.status }
    });
    let statuses = futures_util::future::join_all(burst).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::CREATED),
        "{statuses:?}"
    );

    let info_client = deadpool_redis::redis::Client::open(redis.url()).unwrap();
    let mut conn = info_client
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = deadpool_redis::redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let received: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Each reset reconnects at most the four lanes; a stale lane failing
    // after a fresh one connected resets once more. Plus the restart's TCP
    // readiness probe and this test's own connection.
    assert!(
        received <= 2 * 4 + 2,
        "{received} connections after the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_postgres_fails_closed_then_recovers() {
    let mut cluster = PgCluster::new().await;
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&TestConfig::new(&cluster.url(), &upstream.url())).await;
    let http = client();
    let url = gateway.url("/v1/payments");
    let body = r#"{"amount":1}"#;

    let first = post(&http, &url, "before", body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(gateway.readyz().await, StatusCode::OK);

    cluster.stop_immediate().await;
    assert_eq!(gateway.readyz().await, StatusCode::SERVICE_UNAVAILABLE);
    let down = post(&http, &url, "during", body).await;
    assert_eq!(down.status, StatusCode::SERVICE_UNAVAILABLE, "{down:?}");
    assert_eq!(
        down.problem_type(),
        "urn:idemgate:problem:store-unavailable"
    );
    assert!(down.header("retry-after").is_some(), "{down:?}");
    assert_eq!(upstream.count("during"), 0, "fail closed forwarded anyway");
    assert_eq!(upstream.total(), 1);

    // Same gateway, no restart: it must reconnect by itself.
    cluster.start().await;
    let mut attempt = 0;
    let recovered = eventually(Duration::from_secs(30), || {
        attempt += 1;
        let (http, url) = (http.clone(), url.clone());
        async move {
            let reply = post(&http, &url, &format!("after-{attempt}"), body).await;
            match reply.status {
                StatusCode::CREATED => Some(reply),
                StatusCode::SERVICE_UNAVAILABLE => {
                    assert_eq!(
                        reply.problem_type(),
                        "urn:idemgate:problem:store-unavailable"
                    );
                    None
                }
                _ => panic!("unexpected answer while the store recovers: {reply:?}"),
            }
        }
    })
    .await;
    let recovered = recovered.expect("the gateway did not recover within 30 s of the restart");
    assert!(!recovered.is_replay());
    // Only the one that got through was forwarded.
    assert_eq!(upstream.total(), 2);
    assert_eq!(upstream.count("during"), 0);

    // What was recorded before the outage survived it.
    let replay = post(&http, &url, "before", body).await;
    assert_eq!(replay.status, StatusCode::CREATED, "{replay:?}");
    assert!(replay.is_replay(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(upstream.count("before"), 1);
    assert_eq!(gateway.readyz().await, StatusCode::OK);

    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_postgres_fails_open_when_configured() {
    let mut cluster = PgCluster::new().await;
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&cluster.url(), &upstream.url()).route(|r| {
        r.set("on_store_error", "fail_open");
    });
    let gateway = Gateway::start(&config).await;
    let http = client();
    let url = gateway.url("/v1/payments");
    let body = r#"{"amount":2}"#;

    let first = post(&http, &url, "before", body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.is_replay());

    cluster.stop_immediate().await;
    let open = post(&http, &url, "during", body).await;
    assert_eq!(open.status, StatusCode::CREATED, "{open:?}");
    assert!(
        open.header("idempotent-replayed").is_none(),
        "a fail-open answer is the upstream's own: {open:?}"
    );
    assert_eq!(upstream.count("during"), 1, "fail open did not forward");
    assert_eq!(open.json()["n"], 1, "{open:?}");

    gateway.shutdown().await;
}

#[tokio::test]
async fn only_an_outage_fails_open() {
    use sqlx::Connection;
    let store = TestStore::new(Backend::Postgres).await;
    let upstream = Upstream::start().await;
    let fail_open = |config: TestConfig| {
        config.route(|r| {
            r.set("on_store_error", "fail_open");
        })
    };
    let gateway = Gateway::start(&fail_open(store.config(&upstream.url()))).await;
    let c = client();
    let url = gateway.url("/v1/payments");
    assert_eq!(
        post(&c, &url, "bent", "{}").await.status,
        StatusCode::CREATED
    );
    // A record this build cannot read: never a reason to forward again.
    let mut conn = sqlx::PgConnection::connect(&store.url).await.unwrap();
    sqlx::query("UPDATE idemgate_records SET headers = '\\x00ff'::bytea WHERE key = 'bent'")
        .execute(&mut conn)
        .await
        .unwrap();
    let reply = post(&c, &url, "bent", "{}").await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(reply.problem_type(), "urn:idemgate:problem:store-corrupt");
    assert_eq!(upstream.count("bent"), 1);

    // A full memory store under fail_open: refused, not bypassed.
    let memory = TestStore::new(Backend::Memory).await;
    let config = fail_open(memory.config(&upstream.url())).store(|s| {
        s.set("max_records", 1);
    });
    let small = Gateway::start(&config).await;
    assert_eq!(
        post(&c, &small.url("/v1/payments"), "f1", "{}")
            .await
            .status,
        StatusCode::CREATED
    );
    let full = post(&c, &small.url("/v1/payments"), "f2", "{}").await;
    assert_eq!(full.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(upstream.count("f2"), 0);
}

#[tokio::test]
async fn full_memory_store_answers_503_not_unbounded_growth() {
    let s = Setup::with(Backend::Memory, |config| {
        config.store(|s| {
            s.set("max_records", 2);
        })
    })
    .await;
    let (upstream, c) = (&s.upstream, &s.client);
    let url = s.gateway.url("/v1/payments");
    for key in ["m1", "m2"] {
        assert_eq!(post(c, &url, key, "{}").await.status, StatusCode::CREATED);
    }
    let full = post(c, &url, "m3", "{}").await;
    assert_eq!(full.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        full.problem_type(),
        "urn:idemgate:problem:store-unavailable"
    );
    assert!(full.header("retry-after").is_some());
    assert!(
        full.json()["detail"]
            .as_str()
            .unwrap()
            .contains("max_records")
    );
    assert_eq!(upstream.count("m3"), 0);
    assert!(post(c, &url, "m1", "{}").await.is_replay());
}
