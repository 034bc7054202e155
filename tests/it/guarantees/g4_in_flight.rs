//! G4 — in flight, with `concurrent = "wait"`: an in-flight duplicate
//! waits for the first attempt's answer (woken by the store) instead of
//! getting `409`; on every store, and across two instances on the shared
//! ones. (The default answer, `409` + `Retry-After`, is asserted by the
//! same-key storms of `g1_one_at_a_time` and the killed gateways of
//! `g7_leases_and_fencing`.)

use std::time::Duration;

use http::StatusCode;

use crate::support::upstream::DELAY_HEADER;
use crate::support::{
    Backend, Gateway, Reply, Set, Setup, TestConfig, per_backend, post, sample, send,
    spawn_slow_post,
};

/// `concurrent = "wait"` with `wait_timeout` (the test config's lease is
/// 3 s and its upstream timeout 2 s, so at most 5 s).
fn waiting(wait_timeout: &'static str) -> impl FnOnce(TestConfig) -> TestConfig {
    move |config| {
        config.route(|r| {
            r.set("concurrent", "wait")
                .set("wait_timeout", wait_timeout);
        })
    }
}

/// Wait until `n` requests wait on `gateway` (`idemgate_waiting`).
async fn waiting_now(gateway: &Gateway, n: f64) {
    let reached = crate::support::eventually(Duration::from_secs(30), || async move {
        (sample(&gateway.metrics().await, "idemgate_waiting") >= n).then_some(())
    })
    .await;
    assert!(
        reached.is_some(),
        "{n} requests were not waiting within 30 s"
    );
}

fn metric(metrics: &str, series: &str) -> f64 {
    sample(metrics, series)
}

async fn a_storm_of_64_gets_one_execution_and_64_identical_answers(b: Backend) {
    let s = Setup::with(b, waiting("5s")).await;
    let url = s.gateway.url("/v1/payments");
    let mut storm = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (client, url) = (s.client.clone(), url.clone());
        storm.spawn(async move {
            send(
                &client,
                "POST",
                &url,
                &[("idempotency-key", "storm"), (DELAY_HEADER, "1000")],
                "{}",
            )
            .await
        });
    }
    let answers: Vec<Reply> = storm.join_all().await;
    assert_eq!(s.upstream.count("storm"), 1, "one execution");
    let statuses: Vec<StatusCode> = answers.iter().map(|a| a.status).collect();
    assert!(
        statuses.iter().all(|s| *s == StatusCode::CREATED),
        "no 409, every answer the first one's: {statuses:?}"
    );
    assert!(
        answers.iter().all(|a| a.body == answers[0].body),
        "byte-identical"
    );
    assert_eq!(answers.iter().filter(|a| a.is_replay()).count(), 63);
    let metrics = s.gateway.metrics().await;
    let waited = metric(
        &metrics,
        "idemgate_requests_total{route=\"api\",outcome=\"waited_replay\"}",
    );
    let replayed = metric(
        &metrics,
        "idemgate_requests_total{route=\"api\",outcome=\"replayed\"}",
    );
    assert_eq!(waited + replayed, 63.0);
    assert!(waited >= 1.0, "{metrics}");
    assert!(
        metric(&metrics, "idemgate_wait_wakeups_total{cause=\"store\"}") >= 1.0,
        "waiters were woken by the store: {metrics}"
    );
    assert_eq!(
        metric(&metrics, "idemgate_wait_wakeups_total{cause=\"poll\"}"),
        0.0,
        "no waiter needed the slow poll"
    );
    assert_eq!(metric(&metrics, "idemgate_waiting"), 0.0);
}

async fn a_duplicate_still_in_flight_at_wait_timeout_gets_409(b: Backend) {
    let s = Setup::with(b, waiting("500ms")).await;
    let url = s.gateway.url("/v1/payments");
    let first = spawn_slow_post(&s.client, &url, "slow", "1500");
    s.upstream.arrived("slow").await;
    let duplicate = post(&s.client, &url, "slow", "{}").await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(duplicate.problem_type(), "urn:idemgate:problem:in-flight");
    assert!(duplicate.header("retry-after").is_some());
    assert!(duplicate.text().contains("waited"), "{}", duplicate.text());
    // It says when the first attempt's record expires, as any 409 does.
    assert!(
        duplicate.json()["expires"].is_string(),
        "{}",
        duplicate.text()
    );
    assert!(duplicate.header("idempotency-expires").is_some());
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    let metrics = s.gateway.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "idemgate_requests_total{route=\"api\",outcome=\"wait_timeout\"}"
        ),
        1.0
    );
    // A mismatch never waits: 422 at once.
    let other = post(&s.client, &url, "slow", r#"{"other":1}"#).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
}

async fn a_released_key_is_forwarded_to_one_waiter(b: Backend) {
    let s = Setup::with(b, waiting("5s")).await;
    // 500 is not recorded: the first attempt releases the key.
    let url = s.gateway.url("/v1/status/500");
    let first = spawn_slow_post(&s.client, &url, "flaky", "700");
    s.upstream.arrived("flaky").await;
    let waiter = post(&s.client, &url, "flaky", "{}").await;
    assert_eq!(
        first.await.unwrap().status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(waiter.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!waiter.is_replay(), "the waiter was forwarded itself");
    assert_eq!(s.upstream.count("flaky"), 2);
}

async fn waiters_on_a_held_key_get_the_held_answer(b: Backend) {
    let s = Setup::with(b, waiting("5s")).await;
    let url = s.gateway.url("/v1/hang");
    let first = {
        let (client, url) = (s.client.clone(), url.clone());
        tokio::spawn(async move { post(&client, &url, "stuck", "{}").await })
    };
    s.upstream.arrived("stuck").await;
    let waiter = post(&s.client, &url, "stuck", "{}").await;
    assert_eq!(first.await.unwrap().status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(waiter.status, StatusCode::BAD_GATEWAY, "{}", waiter.text());
    assert_eq!(
        waiter.problem_type(),
        "urn:idemgate:problem:outcome-unknown"
    );
    assert_eq!(s.upstream.count("stuck"), 1);
}

/// Beyond `max_waiting`, a duplicate gets `409` at once.
#[tokio::test]
async fn max_waiting_bounds_the_waiting_requests() {
    let s = Setup::with(Backend::Memory, |config| {
        waiting("5s")(config).top(|t| {
            t.set("max_waiting", 1);
        })
    })
    .await;
    let url = s.gateway.url("/v1/payments");
    let first = spawn_slow_post(&s.client, &url, "busy", "1500");
    s.upstream.arrived("busy").await;
    let waiter = {
        let (client, url) = (s.client.clone(), url.clone());
        tokio::spawn(async move { post(&client, &url, "busy", "{}").await })
    };
    waiting_now(&s.gateway, 1.0).await;
    let refused = post(&s.client, &url, "busy", "{}").await;
    assert_eq!(
        refused.status,
        StatusCode::CONFLICT,
        "the second waiter has no slot"
    );
    assert!(!refused.text().contains("waited"));
    assert!(waiter.await.unwrap().is_replay());
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
}

per_backend!(
    a_storm_of_64_gets_one_execution_and_64_identical_answers,
    a_duplicate_still_in_flight_at_wait_timeout_gets_409,
    a_released_key_is_forwarded_to_one_waiter,
    waiters_on_a_held_key_get_the_held_answer,
);

/// Across instances: the shared stores only.
mod across_instances {
    use super::*;

    /// Waiters on another instance are woken by the shared store.
    async fn a_waiter_on_another_instance_is_woken_by_the_store(b: Backend) {
        let s = Setup::with(b, waiting("5s")).await;
        let other = Gateway::start(&s.config).await;
        let first = spawn_slow_post(&s.client, &s.gateway.url("/v1/payments"), "shared", "1000");
        s.upstream.arrived("shared").await;
        let waiter = post(&s.client, &other.url("/v1/payments"), "shared", "{}").await;
        let first = first.await.unwrap();
        assert_eq!(waiter.status, StatusCode::CREATED);
        assert!(waiter.is_replay());
        assert_eq!(waiter.body, first.body);
        assert_eq!(s.upstream.count("shared"), 1);
        let metrics = other.metrics().await;
        // At least the announcement; one more if the other instance's relay
        // started listening after the waiter began (it wakes everyone once).
        assert!(
            metric(&metrics, "idemgate_wait_wakeups_total{cause=\"store\"}") >= 1.0,
            "{metrics}"
        );
        assert_eq!(
            metric(&metrics, "idemgate_wait_wakeups_total{cause=\"poll\"}"),
            0.0
        );
    }

    per_backend!(only [postgres, redis, sqlite]: a_waiter_on_another_instance_is_woken_by_the_store);
}

/// The store restarts while a duplicate waits: the waiter waits on (its
/// claims fail meanwhile), and the first attempt's answer still reaches it
/// once the store is back and the listener has reconnected. PostgreSQL is
/// stopped `-m immediate`; Redis (durable, `appendfsync always`) is killed
/// with SIGKILL and started again.
async fn a_waiter_outlives_a_store_restart(store_url: String, restart: impl AsyncFnOnce()) {
    let upstream = crate::support::Upstream::start().await;
    let config = TestConfig::new(&store_url, &upstream.url()).route(|r| {
        r.set("concurrent", "wait")
            .set("upstream_timeout", "8s")
            .set("wait_timeout", "10s");
    });
    let gateway = Gateway::start(&config).await;
    let http = crate::support::client();
    let url = gateway.url("/v1/payments");
    let first = spawn_slow_post(&http, &url, "restart", "5000");
    upstream.arrived("restart").await;
    let waiter = {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move { post(&http, &url, "restart", "{}").await })
    };
    waiting_now(&gateway, 1.0).await;
    restart().await;
    let first = first.await.unwrap();
    let waiter = waiter.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    assert_eq!(waiter.status, StatusCode::CREATED, "{}", waiter.text());
    assert!(waiter.is_replay());
    assert_eq!(waiter.body, first.body);
    assert_eq!(upstream.count("restart"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_outlives_a_postgres_restart() {
    let mut cluster = crate::support::servers::PgCluster::new().await;
    let url = cluster.url();
    a_waiter_outlives_a_store_restart(url, async || {
        cluster.stop_immediate().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        cluster.start().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_outlives_a_redis_restart() {
    let mut redis = crate::support::servers::PrivateRedis::start_durable();
    let url = redis.url();
    a_waiter_outlives_a_store_restart(url, async || {
        redis.kill();
        tokio::time::sleep(Duration::from_millis(500)).await;
        redis.restart();
    })
    .await;
}

/// A waiting client that hangs up stops waiting: nothing of it remains.
#[tokio::test]
async fn a_waiter_that_hangs_up_costs_nothing_further() {
    use tokio::io::AsyncWriteExt;
    let s = Setup::with(Backend::Memory, waiting("5s")).await;
    let url = s.gateway.url("/v1/payments");
    let first = spawn_slow_post(&s.client, &url, "gone", "1500");
    s.upstream.arrived("gone").await;
    let mut tcp = tokio::net::TcpStream::connect(s.gateway.addr)
        .await
        .unwrap();
    tcp.write_all(
        b"POST /v1/payments HTTP/1.1\r\nHost: t\r\nIdempotency-Key: gone\r\n\
          Content-Length: 2\r\n\r\n{}",
    )
    .await
    .unwrap();
    waiting_now(&s.gateway, 1.0).await;
    drop(tcp);
    let gone = crate::support::eventually(Duration::from_secs(1), || async {
        (sample(&s.gateway.metrics().await, "idemgate_waiting") == 0.0).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the waiter left when its client did");
    assert!(!first.is_finished(), "well before the first attempt ended");
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(s.upstream.count("gone"), 1);
}

// On a Redis Cluster, waiters are woken by the store's announcements
// (PUBLISH from a script on one primary, heard by the subscriber on any node).
per_backend!(only [redis_cluster]: a_storm_of_64_gets_one_execution_and_64_identical_answers);
