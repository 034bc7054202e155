//! G1 — one at a time: for one key, at most one request is at the upstream
//! at a time. A same-key storm on every store (and on a Redis Cluster)
//! reaches the upstream once; an exchange longer than the key's retention
//! keeps its key; two gateway processes on one database, and two gateways
//! sharing a store, forward a key once between them.

use std::time::Duration;

use http::StatusCode;

use super::{process_config, retry_after};
use crate::support::process::GatewayProcess;
use crate::support::{
    Backend, Gateway, Set, Setup, TestDb, TestStore, Upstream, client, per_backend, post,
};

async fn storm_of_40_reaches_the_upstream_once(b: Backend) {
    let s = Setup::start(b).await;
    let url = s.gateway.url("/v1/slow/400");
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let (client, url) = (s.client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            post(&client, &url, "storm", "{\"a\":1}").await
        }));
    }
    let mut originals = Vec::new();
    for task in tasks {
        let reply = task.await.unwrap();
        match reply.status {
            StatusCode::CREATED => originals.push(reply),
            StatusCode::CONFLICT => {
                assert!(
                    reply.header("retry-after").is_some(),
                    "409 without Retry-After"
                );
                assert_eq!(reply.problem_type(), "urn:idemgate:problem:in-flight");
            }
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert_eq!(s.upstream.count("storm"), 1);
    assert!(originals.iter().filter(|r| !r.is_replay()).count() == 1);
    let after = post(&s.client, &url, "storm", "{\"a\":1}").await;
    assert!(after.is_replay());
    assert_eq!(after.body, originals[0].body);
}

async fn an_exchange_longer_than_retention_keeps_its_key(b: Backend) {
    // G1 even when retention is shorter than the upstream exchange.
    let s = Setup::with(b, |config| {
        config.route(|r| {
            r.set("lease", "1s")
                .set("retention", "1s")
                .set("upstream_timeout", "10s");
        })
    })
    .await;
    let url = s.gateway.url("/v1/slow/3000");
    let (client, u) = (s.client.clone(), url.clone());
    let first = tokio::spawn(async move { post(&client, &u, "long", "{}").await });
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let duplicate = post(&s.client, &url, "long", "{}").await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{duplicate:?}");
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(s.upstream.count("long"), 1);
}

per_backend!(
    storm_of_40_reaches_the_upstream_once,
    an_exchange_longer_than_retention_keeps_its_key,
);

// The Redis store on a Redis Cluster: a same-key storm still reaches the
// upstream once (the claim's record and token counter share a hash slot).
per_backend!(only [redis_cluster]: storm_of_40_reaches_the_upstream_once);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_processes_never_forward_one_key_twice() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    let config = process_config(&db, &upstream, "10s", "20s");
    let (a, b) = tokio::join!(
        GatewayProcess::start("a", &config),
        GatewayProcess::start("b", &config)
    );
    let http = client();
    let (key, body) = ("storm", r#"{"amount":300}"#);
    let urls = [a.url("/v1/slow/500"), b.url("/v1/slow/500")];

    let storm = futures_util::future::join_all((0..40).map(|i| {
        let (http, url) = (http.clone(), urls[i % 2].clone());
        async move { post(&http, &url, key, body).await }
    }))
    .await;

    assert_eq!(upstream.count(key), 1, "one key forwarded more than once");
    let mut originals = Vec::new();
    for reply in &storm {
        match reply.status {
            StatusCode::CREATED if reply.is_replay() => {}
            StatusCode::CREATED => originals.push(reply.clone()),
            StatusCode::CONFLICT => {
                assert_eq!(reply.problem_type(), "urn:idemgate:problem:in-flight");
                retry_after(reply);
            }
            _ => panic!("unexpected answer in the storm: {reply:?}"),
        }
    }
    assert_eq!(originals.len(), 1, "exactly one client got the forward");
    let original = &originals[0];
    for reply in storm.iter().filter(|r| r.status == StatusCode::CREATED) {
        assert_eq!(reply.body, original.body, "a replay differs: {reply:?}");
    }

    // Settled: from either process, every retry is the byte-identical replay.
    for i in 0..10 {
        let reply = post(&http, &urls[i % 2], key, body).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        assert!(reply.is_replay(), "{reply:?}");
        assert_eq!(reply.body, original.body);
        assert_eq!(reply.header("location"), original.header("location"));
    }
    assert_eq!(upstream.count(key), 1);
}

/// A gateway that stalls between its claim and its forward for longer than
/// the lease (an overloaded machine, a paused process) must not forward:
/// by then another instance may have taken the key over, or an inquiry may
/// have found it never acted. The stall is a failpoint (a 1.5 s sleep,
/// once) against a 1 s lease; the request is not sent, its attempt is
/// abandoned and the retry is forwarded, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_lease_ran_out_before_the_forward_is_not_sent() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    let config = process_config(&db, &upstream, "1s", "5s");
    let stalled = GatewayProcess::try_start_with_env(
        "stalled",
        &config,
        &[("FAILPOINTS", "before-forward=1*sleep(1500)")],
    )
    .await
    .expect("the gateway starts");
    let http = client();
    let url = stalled.url("/v1/pay");
    let first = post(&http, &url, "stalled", "{}").await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    assert_eq!(first.problem_type(), "urn:idemgate:problem:overloaded");
    assert_eq!(upstream.count("stalled"), 0, "a stale claim was forwarded");
    let retry = post(&http, &url, "stalled", "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.is_replay());
    assert_eq!(upstream.count("stalled"), 1);
    assert!(
        stalled
            .stderr()
            .contains("lease ran out before the request was forwarded")
    );
}

/// Across instances: the shared stores only.
mod across_instances {
    use super::*;

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
}
