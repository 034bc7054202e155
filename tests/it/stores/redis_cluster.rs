//! The Redis store on a real Redis Cluster (`[store] cluster = true`): a
//! primary killed while requests flow (no second execution, failures are
//! `503 store-unavailable`, readiness drops), `keys list` across every
//! primary, the wake-up subscriber moving off a dead node, and the config
//! check. The conformance suite, a same-key storm, waiting and the `keys`
//! commands run on the shared cluster from their own modules
//! (`redis_cluster::…` in stores::conformance, guarantees::g1_one_at_a_time,
//! guarantees::g4_in_flight and features::keys).

use std::collections::HashSet;
use std::time::Duration;

use deadpool_redis::redis;
use http::StatusCode;
use idemgate::store::{ClaimRequest, RecordKey, RecordState, StoredResponse, UnknownOutcome};
use tokio::task::JoinSet;

use crate::support::process::run_command;
use crate::support::servers::RedisCluster;
use crate::support::upstream::DELAY_HEADER;
use crate::support::{
    Backend, Gateway, Reply, Set, TestConfig, TestStore, Upstream, client, eventually, post,
    sample, send,
};

/// A gateway config on `cluster` (`cluster = true`).
fn on_cluster(cluster: &RedisCluster, upstream: &Upstream) -> TestConfig {
    TestConfig::new(&cluster.url(), &upstream.url()).store(|s| {
        s.set("cluster", true).set("prefix", "idemgate:");
    })
}

/// Every key of the kill test is sent this many times at once.
const COPIES: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_mid_run_fails_closed_and_never_executes_twice() {
    let mut cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&on_cluster(&cluster, &upstream)).await;
    assert_eq!(gateway.readyz().await, StatusCode::OK);
    let url = gateway.url("/v1/payments");

    // Batches of 16 keys, each key sent twice at once and again after its
    // batch (a client's retry), 12 batches in all.
    let flow = {
        let (c, url) = (client(), url.clone());
        tokio::spawn(async move {
            let mut replies: Vec<(String, Reply)> = Vec::new();
            for batch in 0..12 {
                let keys: Vec<String> = (0..16).map(|i| format!("k{batch}-{i}")).collect();
                for _ in 0..2 {
                    let mut sends = JoinSet::new();
                    for key in &keys {
                        for _ in 0..COPIES {
                            let (c, url, key) = (c.clone(), url.clone(), key.clone());
                            sends.spawn(async move {
                                let reply = post(&c, &url, &key, "{}").await;
                                (key, reply)
                            });
                        }
                    }
                    replies.extend(sends.join_all().await);
                }
            }
            replies
        })
    };
    // Kill a primary (not the seed) once requests are flowing.
    let flowing = eventually(Duration::from_secs(30), || {
        let n = upstream.total();
        async move { (n >= 40).then_some(()) }
    })
    .await;
    assert!(flowing.is_some(), "requests flow before the kill");
    cluster.kill(1);
    let killed_at = upstream.total();
    let replies = flow.await.unwrap();

    let mut unavailable = 0;
    for (key, reply) in &replies {
        match reply.status {
            StatusCode::CREATED | StatusCode::CONFLICT => {}
            // Failing closed: the claim could not be made (`store-unavailable`),
            // or the primary died after the claim and before the record
            // (`record-failed`: the key stays claimed, never forwarded again).
            StatusCode::SERVICE_UNAVAILABLE => {
                let problem = reply.problem_type();
                assert!(
                    problem == "urn:idemgate:problem:store-unavailable"
                        || problem == "urn:idemgate:problem:record-failed",
                    "{key}: {problem}"
                );
                unavailable += 1;
            }
            other => panic!("{key}: unexpected {other}: {reply:?}"),
        }
    }
    let keys: HashSet<&String> = replies.iter().map(|(key, _)| key).collect();
    for key in &keys {
        assert!(
            upstream.count(key) <= 1,
            "{key} executed {} times",
            upstream.count(key)
        );
    }
    assert!(unavailable > 0, "the dead primary's keys failed closed");
    assert!(
        upstream.total() > killed_at,
        "the live primaries' keys went on being served"
    );
    assert_eq!(
        gateway.readyz().await,
        StatusCode::SERVICE_UNAVAILABLE,
        "not ready while a primary is down"
    );
}

#[tokio::test]
async fn keys_list_finds_records_on_every_primary() {
    let storage = TestStore::new(Backend::RedisCluster).await;
    let store = storage.open().await;
    let mut written = HashSet::new();
    for i in 0..48 {
        let key = RecordKey {
            route: "r".into(),
            scope: Vec::new(),
            key: format!("k{i}"),
        };
        let claim = store
            .claim(&ClaimRequest {
                key: &key,
                fingerprint: &[1; 32],
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(3600),
                on_unknown_outcome: UnknownOutcome::Hold,
                inquire_after: Duration::ZERO,
                attempt: i,
            })
            .await
            .unwrap();
        let idemgate::store::Claim::Claimed { token, .. } = claim else {
            panic!("k{i}: {claim:?}");
        };
        let response = StoredResponse {
            status: StatusCode::CREATED,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::from_static(b"ok"),
        };
        store
            .complete(&key, token, &response, Duration::from_secs(3600))
            .await
            .unwrap();
        written.insert(key.key);
    }
    // The records are spread over all three primaries…
    for node in crate::support::store::redis_cluster_urls() {
        let client = redis::Client::open(node.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let here: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*rec:*", storage.prefix()))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(!here.is_empty(), "no record on {node}");
    }
    // …and listing the route finds every one of them.
    let listed = store.list("r", RecordState::Completed, 1000).await.unwrap();
    let listed: HashSet<String> = listed.into_iter().map(|info| info.key).collect();
    assert_eq!(listed, written);
    store.ping().await.expect("a healthy cluster is ready");
}

/// The waiters woken so far, by cause: (store, poll).
async fn wakeups(gateway: &Gateway) -> (f64, f64) {
    let metrics = gateway.metrics().await;
    (
        sample(&metrics, "idemgate_wait_wakeups_total{cause=\"store\"}"),
        sample(&metrics, "idemgate_wait_wakeups_total{cause=\"poll\"}"),
    )
}

/// A slow request on `key` and a duplicate waiting on it; whether the
/// duplicate was woken by the store and never by the slow poll, or `None`
/// when the key's slot is on a dead node (503).
async fn wait_round(gateway: &Gateway, upstream: &Upstream, key: &str) -> Option<bool> {
    let (c, url) = (client(), gateway.url("/v1/payments"));
    let before = wakeups(gateway).await;
    let first = {
        let (c, url, key) = (c.clone(), url.clone(), key.to_string());
        tokio::spawn(async move {
            let headers = [("idempotency-key", key.as_str()), (DELAY_HEADER, "700")];
            send(&c, "POST", &url, &headers, "{}").await
        })
    };
    // The duplicate goes once the first is at the upstream (its claim
    // granted), or answered: never ahead of the first's claim, however
    // slow the machine.
    while upstream.count(key) == 0 && !first.is_finished() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let duplicate = post(&c, &url, key, "{}").await;
    let first = first.await.unwrap();
    if first.status != StatusCode::CREATED {
        assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
        return None;
    }
    assert_eq!(duplicate.status, StatusCode::CREATED, "{duplicate:?}");
    assert!(duplicate.is_replay(), "{duplicate:?}");
    assert_eq!(upstream.count(key), 1, "one execution");
    let after = wakeups(gateway).await;
    Some(after.0 > before.0 && after.1 == before.1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wake_up_subscriber_moves_off_a_dead_node() {
    let mut cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let config = on_cluster(&cluster, &upstream).route(|r| {
        r.set("concurrent", "wait").set("wait_timeout", "5s");
    });
    let gateway = Gateway::start(&config).await;

    // The subscriber's first node is the seed: kill it. Until the
    // subscriber listens on a live node, waiters only wake by polling.
    cluster.kill(0);
    let mut round = 0;
    let woken = eventually(Duration::from_secs(60), || {
        round += 1;
        let (gateway, upstream, key) = (&gateway, &upstream, format!("w{round}"));
        async move {
            wait_round(gateway, upstream, &key)
                .await
                .filter(|woken| *woken)
        }
    })
    .await;
    assert!(
        woken.is_some(),
        "no waiter was woken by the store after the seed node died"
    );
    // Not a one-off (the wake-up every new subscription gives): the next
    // live key's waiter is woken by an announcement too.
    let mut next = None;
    for i in 0..20 {
        next = wait_round(&gateway, &upstream, &format!("again{i}")).await;
        if next.is_some() {
            break;
        }
    }
    assert_eq!(next, Some(true), "announcements reach the moved subscriber");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_needs_a_redis_url() {
    let config = TestConfig::new(
        "postgres://postgres@127.0.0.1:5432/postgres",
        "http://127.0.0.1:9",
    )
    .store(|s| {
        s.set("cluster", true);
    });
    let (status, _, stderr) = run_command("check", &config, Duration::from_secs(30)).await;
    assert!(
        !status.success(),
        "check accepted cluster = true on PostgreSQL"
    );
    assert!(stderr.contains("store.cluster"), "stderr: {stderr}");
}

/// A primary that stops answering (SIGSTOP: a frozen host, a partition)
/// takes only its own slots down: the other primaries' keys go on being
/// served while connections are made again around it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_takes_down_only_its_own_keys() {
    let cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&on_cluster(&cluster, &upstream)).await;
    let url = gateway.url("/v1/payments");
    let http = client();
    assert_eq!(
        post(&http, &url, "before", "{}").await.status,
        StatusCode::CREATED
    );

    cluster.signal(1, "-STOP");
    let mut served = 0;
    let mut sent = 0;
    for round in 0..4 {
        let mut sends = JoinSet::new();
        for i in 0..16 {
            let (http, url) = (http.clone(), url.clone());
            sends.spawn(
                async move { post(&http, &url, &format!("frozen-{round}-{i}"), "{}").await },
            );
        }
        for reply in sends.join_all().await {
            sent += 1;
            match reply.status {
                StatusCode::CREATED => served += 1,
                StatusCode::SERVICE_UNAVAILABLE => {}
                other => panic!("unexpected {other}: {reply:?}"),
            }
        }
    }
    cluster.signal(1, "-CONT");
    // Two thirds of the keys are on the live primaries.
    assert!(
        served * 2 >= sent,
        "only {served} of {sent} keys were served while one primary of three was frozen"
    );
}
