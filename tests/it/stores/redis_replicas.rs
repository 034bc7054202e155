//! `[store] replicas`: a Redis primary and its replica (private servers),
//! one gateway on the primary. Keys are sent while the replica follows,
//! then while it is cut off (`REPLICAOF NO ONE`: it keeps what it has and
//! takes no more); the primary is killed, and a second gateway on the
//! former replica (what following the new primary amounts to) retries
//! every key the first one acknowledged.
//! - `replicas = 1`: a claim the replica did not acknowledge fails closed
//!   (`503`, nothing forwarded, although the route fails open on a store
//!   outage), so every acknowledged key replays from
//!   the replica and none executes twice;
//! - `replicas = 0` (the negative control): the keys acknowledged while
//!   the replica was cut off are not on it, and their retries execute
//!   again. The same check must flag exactly those.
//!
//! A record waits too: a replica cut off while the upstream works (after
//! the claim was acknowledged) fails the record closed, and the answer is
//! not sent. So does a renewal: cut off, the replica leaves it failed.

use http::StatusCode;

use crate::support::servers::PrivateRedis;
use crate::support::{
    Gateway, Reply, Set, TestConfig, Upstream, client, eventually, not_replayed, post, sample,
    spawn_slow_post,
};

const BODY: &str = r#"{"amount":1}"#;

/// Acknowledged keys that did not replay from the former replica.
#[derive(Debug)]
struct Failover {
    acknowledged: usize,
    /// Keys sent while the replica was cut off, and how many of them the
    /// gateway acknowledged.
    cut_off: (usize, usize),
    lost: Vec<String>,
}

/// The route fails open on a store outage: a write the replicas did not
/// acknowledge is no outage, and must still fail closed.
fn config(store: &str, upstream: &Upstream, replicas: u32) -> TestConfig {
    TestConfig::new(store, &upstream.url())
        .store(|store| {
            store
                .set("replicas", i64::from(replicas))
                .set("replica_timeout", "100ms");
        })
        .defaults(|d| {
            d.set("on_store_error", "fail_open");
        })
}

async fn fail_over(replicas: u32) -> Failover {
    let mut primary = PrivateRedis::start();
    let replica = PrivateRedis::replica_of(&primary);
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&config(&primary.url(), &upstream, replicas)).await;
    let (http, url) = (client(), gateway.url("/v1/payments"));

    let mut acknowledged = Vec::new();
    for i in 0..20 {
        let key = format!("before-{i}");
        let reply = post(&http, &url, &key, BODY).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{key}: {reply:?}");
        acknowledged.push(key);
    }

    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    let sent = 5;
    let mut kept = 0;
    for i in 0..sent {
        let key = format!("cut-off-{i}");
        let reply = post(&http, &url, &key, BODY).await;
        match reply.status {
            StatusCode::CREATED => {
                kept += 1;
                acknowledged.push(key);
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(upstream.count(&key), 0, "{key} was forwarded unclaimed");
            }
            other => panic!("{key}: {other} while the replica was cut off: {reply:?}"),
        }
    }
    primary.kill();
    gateway.shutdown().await;

    // The former replica is the primary now.
    let after = Gateway::start(&config(&replica.url(), &upstream, 0)).await;
    let url = after.url("/v1/payments");
    let lost = not_replayed(&http, &url, &upstream, &acknowledged, BODY).await;
    after.shutdown().await;
    Failover {
        acknowledged: acknowledged.len(),
        cut_off: (sent, kept),
        lost,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_replica_asked_for_every_acknowledged_key_survives() {
    let failover = fail_over(1).await;
    eprintln!("replicas = 1: {failover:?}");
    assert_eq!(failover.cut_off, (5, 0), "{failover:?}");
    assert_eq!(failover.acknowledged, 20);
    assert!(failover.lost.is_empty(), "{failover:?}");
}

/// The negative control: without `replicas`, what the cut-off replica
/// never received is lost, and the check finds exactly that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replicas_what_the_replica_missed_is_lost() {
    let failover = fail_over(0).await;
    eprintln!("replicas = 0: {failover:?}");
    assert_eq!(failover.cut_off, (5, 5), "{failover:?}");
    let expected: Vec<String> = (0..5).map(|i| format!("cut-off-{i}")).collect();
    assert_eq!(failover.lost, expected, "{failover:?}");
}

/// `WAIT` calls the primary has run (`INFO commandstats`).
fn waits(primary: &PrivateRedis) -> u64 {
    let stats = primary.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_wait:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().expect("a count"))
}

/// Only writes wait: a new key's claim and record do (so the count moves,
/// which is what makes the replays' check mean anything); a replay, which
/// writes nothing, holds no connection for the replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_do_not_wait_for_replicas() {
    let primary = PrivateRedis::start();
    let _replica = PrivateRedis::replica_of(&primary);
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&config(&primary.url(), &upstream, 1)).await;
    let (http, url) = (client(), gateway.url("/v1/payments"));

    let before = waits(&primary);
    for i in 0..5 {
        let reply = post(&http, &url, &format!("key-{i}"), BODY).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    let after_new = waits(&primary);
    // (One more when a pipeline met NOSCRIPT and was sent again.)
    assert!(
        after_new - before >= 10,
        "a claim and a record per new key: {}",
        after_new - before
    );
    for i in 0..5 {
        let reply = post(&http, &url, &format!("key-{i}"), BODY).await;
        assert!(reply.is_replay(), "{reply:?}");
    }
    assert_eq!(
        waits(&primary),
        after_new,
        "a replay waited for the replicas"
    );
    gateway.shutdown().await;
}

/// A `503 record-failed`: the record's `WAIT` fell short, and the
/// upstream's answer was not sent.
fn assert_record_failed(reply: Reply) {
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(
        reply.problem_type(),
        "urn:idemgate:problem:record-failed",
        "{reply:?}"
    );
}

/// With the replica cut off after the claim was acknowledged, the record's
/// `WAIT` falls short: `503 record-failed`, the upstream's answer is not
/// sent (a record written without `WAIT` would be sent as `201`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_replica_did_not_acknowledge_is_not_sent() {
    let primary = PrivateRedis::start();
    let replica = PrivateRedis::replica_of(&primary);
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&config(&primary.url(), &upstream, 1)).await;
    let (http, url) = (client(), gateway.url("/v1/payments"));

    let slow = spawn_slow_post(&http, &url, "slow", "1000");
    let forwarded = eventually(std::time::Duration::from_secs(10), || async {
        (upstream.count("slow") == 1).then_some(())
    })
    .await;
    assert!(forwarded.is_some(), "the claim was not acknowledged");
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    assert_record_failed(slow.await.unwrap());
    gateway.shutdown().await;
}

/// With the replica cut off while the upstream works, renewals are no
/// longer acknowledged and count as failed (`result="error"`); before, they
/// were applied. A renewal written without `WAIT` would still count as
/// applied, and a failover could lose the lease it extended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_the_replica_did_not_acknowledge_fails() {
    let primary = PrivateRedis::start();
    let replica = PrivateRedis::replica_of(&primary);
    let upstream = Upstream::start().await;
    // Renewed every third of a second while the upstream takes 4 s (which
    // the route waits for).
    let config = config(&primary.url(), &upstream, 1).defaults(|d| {
        d.set("lease", "1s").set("upstream_timeout", "8s");
    });
    let gateway = Gateway::start(&config).await;
    let (http, url) = (client(), gateway.url("/v1/payments"));
    let renewals = |result: &'static str| {
        let gateway = &gateway;
        async move {
            let series =
                format!("idemgate_lease_renewals_total{{route=\"api\",result=\"{result}\"}}");
            sample(&gateway.metrics().await, &series)
        }
    };

    let slow = spawn_slow_post(&http, &url, "slow", "4000");
    let applied = eventually(std::time::Duration::from_secs(10), || async {
        (renewals("applied").await >= 1.0).then_some(())
    })
    .await;
    assert!(applied.is_some(), "no renewal was acknowledged");
    assert_eq!(renewals("error").await, 0.0);
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    let failed = eventually(std::time::Duration::from_secs(10), || async {
        (renewals("error").await >= 1.0).then_some(())
    })
    .await;
    assert!(
        failed.is_some(),
        "renewals the replica did not acknowledge were counted applied: {}",
        gateway.metrics().await
    );
    // The record falls short as well (the test above).
    assert_record_failed(slow.await.unwrap());
    gateway.shutdown().await;
}
