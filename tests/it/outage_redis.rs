//! Redis outages (G8) and several gateways sharing one Redis: a private
//! `redis-server` on a free port is stopped, frozen and restarted under a
//! running gateway, which must answer 503 (or fail open) and recover by
//! itself.

use std::process::{Command, Stdio};
use std::time::Duration;

use http::StatusCode;

use crate::support::serial;
use crate::support::servers::PrivateRedis;
use crate::support::{
    Backend, Gateway, HttpClient, Set, TestConfig, TestStore, Upstream, client, eventually,
    per_backend, post,
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

/// Two gateways on one store: a storm split between them reaches the
/// upstream once (memory:// cannot be shared).
async fn gateways_sharing_a_store_forward_a_key_once(backend: Backend) {
    let store = TestStore::new(backend).await;
    let upstream = Upstream::start().await;
    let config = store.config(&upstream.url());
    let (a, b) = (Gateway::start(&config).await, Gateway::start(&config).await);
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..40 {
        let url = if i % 2 == 0 {
            a.url("/v1/slow/300")
        } else {
            b.url("/v1/slow/300")
        };
        let c = c.clone();
        tasks.push(tokio::spawn(
            async move { post(&c, &url, "shared", "{}").await },
        ));
    }
    for task in tasks {
        let reply = task.await.unwrap();
        assert!(
            reply.status == StatusCode::CREATED || reply.status == StatusCode::CONFLICT,
            "{backend:?}: {reply:?}"
        );
    }
    assert_eq!(upstream.count("shared"), 1, "{backend:?}");
    let from_b = post(&c, &b.url("/v1/slow/300"), "shared", "{}").await;
    let from_a = post(&c, &a.url("/v1/slow/300"), "shared", "{}").await;
    assert!(from_a.is_replay() && from_b.is_replay());
    assert_eq!(from_a.body, from_b.body);
}

per_backend!(only [postgres, redis, sqlite]: gateways_sharing_a_store_forward_a_key_once);

#[tokio::test]
async fn rediss_urls_speak_tls() {
    // It starts a server of its own before any fixture: take a turn first.
    let _turn = serial::shared();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()
        .expect("openssl is installed");
    assert!(made.success());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--tls-auth-clients",
            "no",
        ])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let started = eventually(Duration::from_secs(10), || async {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(|_| ())
    })
    .await;
    assert!(started.is_some(), "TLS redis did not start");

    let upstream = Upstream::start().await;
    // The certificate is self-signed: `#insecure` skips verification (test only).
    let url = format!("rediss://127.0.0.1:{port}/#insecure");
    let gateway = Gateway::start(&TestConfig::new(&url, &upstream.url())).await;
    let c = client();
    let first = post(&c, &gateway.url("/v1/payments"), "tls", "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(
        post(&c, &gateway.url("/v1/payments"), "tls", "{}")
            .await
            .is_replay()
    );
    assert_eq!(upstream.count("tls"), 1);

    // Plain redis:// against the TLS port fails at startup, clearly.
    let plain = TestConfig::new(&format!("redis://127.0.0.1:{port}/"), &upstream.url());
    let plain = idemgate::Config::parse(&plain.to_string()).unwrap();
    let refused = idemgate::store::open(&plain.store)
        .await
        .err()
        .expect("no TLS, no store");
    assert!(
        refused.to_string().contains("cannot reach store"),
        "{refused}"
    );
    let _ = server.kill();
    let _ = server.wait();
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
