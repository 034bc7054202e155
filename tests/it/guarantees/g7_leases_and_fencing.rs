//! G7 — leases and fencing: an attempt's lease, renewed while the upstream
//! works, keeps a slow request from being taken over; when the outcome is
//! unknown (an upstream reset or timeout, a gateway killed mid-forward) the
//! key turns `held` under `on_unknown_outcome = "hold"` and is never
//! forwarded again, or is taken over with a new fencing token under
//! `release`. The store-level fencing (a late writer with an older token) is
//! in `stores/conformance.rs`.
//!
//! Lost claims: a claim whose answer was lost (the store froze past `[store]
//! timeout`) may still commit when the store resumes. Its request was never
//! forwarded, so its key must not stay in flight or turn `held`: the
//! gateway abandons exactly that attempt's record once the store answers.
//! The issue's reproduction, on a private Redis and a private PostgreSQL
//! cluster, each frozen with SIGSTOP for 1 s.

use std::time::Duration;

use http::StatusCode;

use super::{db_state, post_until_not_409, process_config, retry_after, thaw_after, upstream_saw};
use crate::support::http::try_post;
use crate::support::process::GatewayProcess;
use crate::support::servers::{PgCluster, PrivateRedis};
use crate::support::{
    Backend, Gateway, HttpClient, Set, Setup, TestConfig, TestDb, Upstream, client, eventually,
    per_backend, post, record_state, sample,
};

/// A gateway whose store times out after 500 ms, with a 3 s lease, and one
/// store connection, so the claim under test goes out on the connection the
/// warm-up opened (a claim that cannot even connect is never sent).
async fn gateway(store_url: &str, upstream: &Upstream) -> Gateway {
    let config = TestConfig::new(store_url, &upstream.url())
        .store(|s| {
            s.set("timeout", "500ms").set("pool_size", 1);
        })
        .route(|r| {
            r.set("lease", "3s");
        });
    Gateway::start(&config).await
}

/// Freeze the store, send a keyed POST (503 after `[store] timeout`), thaw
/// 0.5 s later (1 s frozen, well within the instant a Redis claim must run
/// by: 2 s here), then retry until the key is forwarded: never a held answer,
/// one execution, and the orphan counted as abandoned.
async fn a_lost_claim_never_blocks_its_key(
    freeze: impl Fn(),
    thaw: impl Fn(),
    upstream: &Upstream,
    gateway: &Gateway,
) {
    let c: HttpClient = client();
    let url = gateway.url("/v1/payments");
    assert_eq!(
        post(&c, &url, "warm", "{}").await.status,
        StatusCode::CREATED
    );

    freeze();
    let lost = post(&c, &url, "blip", "{}").await;
    thaw_after(Duration::from_millis(500), &thaw).await;
    assert_eq!(lost.status, StatusCode::SERVICE_UNAVAILABLE, "{lost:?}");
    assert_eq!(upstream.count("blip"), 0);

    let seen = std::sync::Mutex::new(Vec::new());
    let forwarded = eventually(Duration::from_secs(30), || {
        let (c, url, seen) = (c.clone(), url.clone(), &seen);
        async move {
            let reply = post(&c, &url, "blip", "{}").await;
            seen.lock().unwrap().push(reply.status);
            assert_ne!(
                reply.status,
                StatusCode::BAD_GATEWAY,
                "a key that never reached the upstream was held: {reply:?}"
            );
            (reply.status == StatusCode::CREATED).then_some(reply)
        }
    })
    .await
    .unwrap_or_else(|| panic!("the key was never forwarded; answers: {seen:?}"));
    let seen = seen.into_inner().unwrap();
    assert!(!forwarded.is_replay());
    assert_eq!(upstream.count("blip"), 1);
    let metrics = gateway.metrics().await;
    let abandoned = sample(
        &metrics,
        r#"idemgate_orphaned_claims_total{route="api",result="abandoned"}"#,
    );
    assert_eq!(
        abandoned, 1.0,
        "the lost claim committed and its record was abandoned; answers: {seen:?}\n{metrics}"
    );
}

#[tokio::test]
async fn redis_frozen_during_a_claim() {
    let redis = PrivateRedis::start();
    let upstream = Upstream::start().await;
    let gateway = gateway(&redis.url(), &upstream).await;
    a_lost_claim_never_blocks_its_key(
        || redis.signal("-STOP"),
        || redis.signal("-CONT"),
        &upstream,
        &gateway,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_frozen_during_a_claim() {
    let cluster = PgCluster::new().await;
    let upstream = Upstream::start().await;
    let gateway = gateway(&cluster.url(), &upstream).await;
    a_lost_claim_never_blocks_its_key(
        || cluster.signal("-STOP"),
        || cluster.signal("-CONT"),
        &upstream,
        &gateway,
    )
    .await;
    gateway.shutdown().await;
}

async fn upstream_reset_and_timeout_hold_the_key(b: Backend) {
    let s = Setup::start(b).await;
    let reset = post(&s.client, &s.gateway.url("/v1/reset"), "r1", "{}").await;
    assert_eq!(reset.status, StatusCode::BAD_GATEWAY);
    assert_eq!(reset.problem_type(), "urn:idemgate:problem:upstream-failed");
    let timeout = post(&s.client, &s.gateway.url("/v1/hang"), "t1", "{}").await;
    assert_eq!(timeout.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        timeout.problem_type(),
        "urn:idemgate:problem:upstream-timeout"
    );
    // Each detail says what a retry gets, and the retries below get it;
    // each says until when the held record is kept, as its retries do.
    for answer in [&reset, &timeout] {
        let detail = answer.json()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(detail.contains("502 outcome-unknown"), "{detail}");
        assert!(answer.json()["expires"].is_string(), "{}", answer.text());
        assert!(answer.header("idempotency-expires").is_some());
    }
    for (path, key) in [("/v1/reset", "r1"), ("/v1/hang", "t1")] {
        let retry = post(&s.client, &s.gateway.url(path), key, "{}").await;
        assert_eq!(retry.status, StatusCode::BAD_GATEWAY, "{key}");
        assert_eq!(retry.problem_type(), "urn:idemgate:problem:outcome-unknown");
        assert!(retry.json()["expires"].is_string(), "{}", retry.text());
        assert_eq!(
            s.upstream.count(key),
            1,
            "a held key is never forwarded again"
        );
        if let Some(db) = s.store.pg_url() {
            assert_eq!(record_state(db, key).await.as_deref(), Some("held"));
        }
    }
}

async fn release_policy_lets_the_retry_through_after_reset_and_timeout(b: Backend) {
    let s = Setup::with(b, |config| {
        config.route(|r| {
            r.set("on_unknown_outcome", "release");
        })
    })
    .await;
    let reset = post(&s.client, &s.gateway.url("/v1/reset"), "r2", "{}").await;
    assert_eq!(reset.status, StatusCode::BAD_GATEWAY);
    // A released key leaves no record: no expiry.
    assert!(reset.json().get("expires").is_none(), "{}", reset.text());
    assert!(reset.header("idempotency-expires").is_none());
    assert_eq!(
        post(&s.client, &s.gateway.url("/v1/reset"), "r2", "{}")
            .await
            .status,
        StatusCode::BAD_GATEWAY
    );
    assert_eq!(s.upstream.count("r2"), 2);
    let timeout = post(&s.client, &s.gateway.url("/v1/hang"), "t2", "{}").await;
    assert_eq!(timeout.status, StatusCode::GATEWAY_TIMEOUT);
    let retry = post(&s.client, &s.gateway.url("/v1/hang"), "t2", "{}").await;
    assert_eq!(
        retry.status,
        StatusCode::GATEWAY_TIMEOUT,
        "released: forwarded again"
    );
    assert_eq!(s.upstream.count("t2"), 2);
}

async fn lease_renewal_keeps_a_slow_request_from_being_taken_over(b: Backend) {
    // The upstream takes 3.5 s; the lease is 1 s. Without renewal, the
    // duplicate at 2.5 s would take the key over under `release`.
    let s = Setup::with(b, |config| {
        config.route(|r| {
            r.set("lease", "1s")
                .set("upstream_timeout", "10s")
                .set("on_unknown_outcome", "release");
        })
    })
    .await;
    let url = s.gateway.url("/v1/slow/3500");
    let (client, u) = (s.client.clone(), url.clone());
    let first = tokio::spawn(async move { post(&client, &u, "slow", "{}").await });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let duplicate = post(&s.client, &url, "slow", "{}").await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{duplicate:?}");
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.is_replay());
    assert_eq!(s.upstream.count("slow"), 1);
    assert!(post(&s.client, &url, "slow", "{}").await.is_replay());
}

per_backend!(
    upstream_reset_and_timeout_hold_the_key,
    release_policy_lets_the_retry_through_after_reset_and_timeout,
    lease_renewal_keeps_a_slow_request_from_being_taken_over,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_gateway_leaves_key_in_flight_then_held() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    // The lease is 3 s (renewed every second): the 409 below must come from
    // B while A's last lease still runs, i.e. within 2 s of the kill even
    // on a loaded machine. upstream_timeout is long: A never settles by itself.
    let config = process_config(&db, &upstream, "3s", "60s");
    // B runs before the kill, so that "within the lease" does not depend
    // on how fast a process starts.
    let (mut a, b) = tokio::join!(
        GatewayProcess::start("a", &config),
        GatewayProcess::start("b", &config)
    );
    let http = client();
    let (key, body) = ("crash-held", r#"{"amount":100}"#);

    let pending = tokio::spawn({
        let (http, url) = (http.clone(), a.url("/v1/slow/30000"));
        async move { try_post(&http, &url, key, body).await }
    });
    upstream_saw(&upstream, key, 1).await;
    a.kill9();

    // Within the lease: in flight elsewhere.
    let url_b = b.url("/v1/slow/30000");
    let early = post(&http, &url_b, key, body).await;
    assert_eq!(early.status, StatusCode::CONFLICT, "{early:?}");
    assert_eq!(early.problem_type(), "urn:idemgate:problem:in-flight");
    let after = retry_after(&early);
    assert!(
        (1..=3).contains(&after),
        "Retry-After {after} outside the lease"
    );
    assert_eq!(db_state(&db, key).await.as_deref(), Some("in_flight"));

    // Once the lease has lapsed: held, never forwarded again.
    let lapsed = post_until_not_409(&http, &url_b, key, body, Duration::from_secs(30)).await;
    assert_eq!(lapsed.status, StatusCode::BAD_GATEWAY, "{lapsed:?}");
    assert_eq!(
        lapsed.problem_type(),
        "urn:idemgate:problem:outcome-unknown"
    );
    assert_eq!(db_state(&db, key).await.as_deref(), Some("held"));
    let again = post(&http, &url_b, key, body).await;
    assert_eq!(again.status, StatusCode::BAD_GATEWAY, "{again:?}");
    assert_eq!(again.problem_type(), "urn:idemgate:problem:outcome-unknown");
    assert_eq!(upstream.count(key), 1, "a held key was forwarded again");
    assert_eq!(db_state(&db, key).await.as_deref(), Some("held"));

    // The client of the killed gateway got no answer at all.
    let orphan = pending.await.unwrap();
    assert!(orphan.is_err(), "the killed gateway answered: {orphan:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_gateway_key_is_taken_over_under_release() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    // The same request must hang on the first attempt (A is killed while
    // the upstream works for 4 s) and complete on the retry (B waits the 4 s
    // out, renewing its own lease), hence one slow path for both.
    let config = process_config(&db, &upstream, "3s", "10s").route(|r| {
        r.set("on_unknown_outcome", "release");
    });
    let (mut a, b) = tokio::join!(
        GatewayProcess::start("a", &config),
        GatewayProcess::start("b", &config)
    );
    let http = client();
    let (key, body) = ("crash-release", r#"{"amount":200}"#);
    let path = "/v1/slow/4000";

    let pending = tokio::spawn({
        let (http, url) = (http.clone(), a.url(path));
        async move { try_post(&http, &url, key, body).await }
    });
    upstream_saw(&upstream, key, 1).await;
    a.kill9();

    // Before the lease lapses nobody may take the key over, `release` or
    // not: A might still be alive and about to record its answer.
    let url_b = b.url(path);
    let early = post(&http, &url_b, key, body).await;
    assert_eq!(early.status, StatusCode::CONFLICT, "{early:?}");
    assert_eq!(early.problem_type(), "urn:idemgate:problem:in-flight");
    retry_after(&early);
    assert_eq!(upstream.count(key), 1);

    // After the lapse the retry takes the key over and reaches the upstream.
    let retry = post_until_not_409(&http, &url_b, key, body, Duration::from_secs(30)).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.is_replay(), "a takeover is a forward: {retry:?}");
    assert_eq!(retry.json()["n"], 2, "{retry:?}");
    assert_eq!(upstream.count(key), 2);
    assert_eq!(db_state(&db, key).await.as_deref(), Some("completed"));

    // And its answer is what every later retry gets.
    let third = post(&http, &url_b, key, body).await;
    assert_eq!(third.status, StatusCode::CREATED, "{third:?}");
    assert!(third.is_replay(), "{third:?}");
    assert_eq!(third.body, retry.body);
    assert_eq!(upstream.count(key), 2);

    let orphan = pending.await.unwrap();
    assert!(orphan.is_err(), "the killed gateway answered: {orphan:?}");
}
