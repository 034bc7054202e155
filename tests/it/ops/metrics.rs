//! `/metrics` on the admin listener: counters move as requests flow
//! (scrape, act, scrape again).

use std::time::Duration;

use http::StatusCode;

use crate::support::{Backend, Set, Setup, eventually, post, sample, send};

fn requests(m: &str, outcome: &str) -> f64 {
    sample(
        m,
        &format!("idemgate_requests_total{{route=\"api\",outcome=\"{outcome}\"}}"),
    )
}

#[tokio::test]
async fn counters_move_as_requests_flow() {
    let s = Setup::start(Backend::Postgres).await;
    let (upstream, gateway, c) = (&s.upstream, &s.gateway, &s.client);
    let url = gateway.url("/v1/payments");

    let before = gateway.metrics().await;
    assert_eq!(requests(&before, "forwarded"), 0.0);
    assert!(
        before.contains("# TYPE idemgate_forwards_in_flight gauge"),
        "{before}"
    );

    post(c, &url, "m1", "{}").await;
    post(c, &url, "m1", "{}").await;
    post(c, &url, "m1", "{\"other\":1}").await;
    post(c, &url, "m1", "{}").await;
    send(c, "POST", &url, &[], "{}").await;
    send(c, "GET", &url, &[], "").await;
    let slow = gateway.url("/v1/slow/600");
    let (c2, s2) = (c.clone(), slow.clone());
    let first = tokio::spawn(async move { post(&c2, &s2, "m2", "{}").await });
    eventually(Duration::from_secs(5), || async {
        (upstream.count("m2") == 1).then_some(())
    })
    .await
    .unwrap();
    let during = gateway.metrics().await;
    assert_eq!(
        sample(&during, "idemgate_forwards_in_flight"),
        1.0,
        "{during}"
    );
    assert_eq!(
        post(c, &slow, "m2", "{}").await.status,
        StatusCode::CONFLICT
    );
    first.await.unwrap();

    let after = gateway.metrics().await;
    assert_eq!(requests(&after, "forwarded"), 2.0, "{after}");
    assert_eq!(requests(&after, "replayed"), 2.0);
    assert_eq!(requests(&after, "mismatch"), 1.0);
    assert_eq!(requests(&after, "missing_key"), 1.0);
    assert_eq!(requests(&after, "passthrough"), 1.0);
    assert_eq!(requests(&after, "conflict"), 1.0);
    assert_eq!(sample(&after, "idemgate_forwards_in_flight"), 0.0);
    // Six claims, five of them reaching the store: the replay cache
    // answers m1's second replay, not its 422 (the store says when the
    // record expires).
    assert_eq!(
        sample(
            &after,
            "idemgate_store_duration_seconds_count{op=\"claim\",result=\"ok\"}"
        ),
        5.0
    );
    assert_eq!(sample(&after, "idemgate_replay_cache_hits_total"), 1.0);
    // PostgreSQL sends claims and completions in batches: the five claims
    // and two completions went in at most seven.
    assert_eq!(
        sample(&after, "idemgate_store_batched_operations_total"),
        7.0
    );
    let batches = sample(&after, "idemgate_store_batches_total");
    assert!((1.0..=7.0).contains(&batches), "{after}");
    assert_eq!(sample(&after, "idemgate_store_batch_splits_total"), 0.0);
    assert_eq!(
        sample(
            &after,
            "idemgate_store_duration_seconds_count{op=\"complete\",result=\"ok\"}"
        ),
        2.0
    );
    assert_eq!(
        sample(
            &after,
            "idemgate_upstream_duration_seconds_count{route=\"api\"}"
        ),
        2.0
    );
    assert!(sample(&after, "idemgate_store_pool_max_connections") >= 1.0);
    assert!(sample(&after, "idemgate_store_pool_connections") >= 1.0);
}

#[tokio::test]
async fn store_errors_and_renewals_are_counted() {
    let s = Setup::with(Backend::Memory, |config| {
        config
            .store(|s| {
                s.set("max_records", 1);
            })
            .route(|r| {
                r.set("lease", "1s").set("upstream_timeout", "5s");
            })
    })
    .await;
    let (gateway, c) = (&s.gateway, &s.client);
    // A 1.6 s exchange with a 1 s lease renews at least once.
    assert_eq!(
        post(c, &gateway.url("/v1/slow/1600"), "r1", "{}")
            .await
            .status,
        StatusCode::CREATED
    );
    // The one-record memory store is now full: a store error, failing closed.
    assert_eq!(
        post(c, &gateway.url("/v1/payments"), "r2", "{}")
            .await
            .status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let m = gateway.metrics().await;
    assert!(
        sample(
            &m,
            "idemgate_lease_renewals_total{route=\"api\",result=\"applied\"}"
        ) >= 1.0,
        "{m}"
    );
    assert_eq!(requests(&m, "store_error"), 1.0);
    assert_eq!(
        sample(
            &m,
            "idemgate_store_duration_seconds_count{op=\"claim\",result=\"error\"}"
        ),
        1.0
    );
}
