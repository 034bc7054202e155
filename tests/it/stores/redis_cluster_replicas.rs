//! A Redis Cluster with a replica under each of its three primaries
//! (private servers), one gateway with `cluster = true`. Under load a
//! primary (not the seed node) is killed (SIGKILL); the cluster promotes its
//! replica, and the gateway follows the new slot map. The killed server is
//! started again at once, as a supervisor would (empty, with its cluster
//! configuration): for a moment it still calls itself the primary of its
//! slots, then rejoins as the new primary's replica. With `replicas = 1`
//! new keys of those slots are served only from then on, since until then
//! no replica can acknowledge them. Then every key the gateway
//! acknowledged is retried: with `replicas = 1` each replays and none
//! executed twice; with `replicas = 0` what was lost is reported, not
//! asserted (whether the last writes reached the replica is a race).

use std::time::{Duration, Instant};

use http::StatusCode;
use tokio::task::JoinSet;

use crate::support::failover::{BODY, Failover, Load};
use crate::support::servers::RedisCluster;
use crate::support::{Gateway, Set, TestConfig, Upstream, client, eventually, post};

/// New keys sent at once to see every primary serve again: each primary
/// gets none of them with a chance of (2/3)^24, about 6 in a million.
const PROBES: usize = 24;

/// The failover above, with `[store] replicas`.
async fn fail_over(replicas: u32) -> Failover {
    let mut cluster = RedisCluster::with_replicas();
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&cluster.url(), &upstream.url()).store(|s| {
        s.set("cluster", true)
            .set("prefix", "idemgate:")
            .set("replicas", i64::from(replicas))
            .set("replica_timeout", "100ms");
    });
    let gateway = Gateway::start(&config).await;
    let url = gateway.url("/v1/payments");

    let load = Load::start(&url, 4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Node 1 is a primary, node 4 its replica; node 0 is the seed.
    cluster.kill(1);
    let killed = Instant::now();
    let promoted = eventually(Duration::from_secs(30), || async {
        cluster.is_primary(4).then_some(())
    })
    .await;
    assert!(promoted.is_some(), "the cluster did not promote node 4");
    let promoted_in = killed.elapsed();
    // As a supervisor would: the new primary needs a replica again.
    cluster.restart(1);
    let http = client();
    let mut round = 0;
    let back = eventually(Duration::from_secs(60), || {
        round += 1;
        let mut probes = JoinSet::new();
        for i in 0..PROBES {
            let (http, url) = (http.clone(), url.clone());
            probes.spawn(async move {
                post(&http, &url, &format!("probe-{round}-{i}"), BODY)
                    .await
                    .status
            });
        }
        async move {
            let served = probes.join_all().await;
            served
                .iter()
                .all(|s| *s == StatusCode::CREATED)
                .then_some(())
        }
    })
    .await;
    assert!(
        back.is_some(),
        "not every primary served new keys within 60 s of the kill"
    );
    let recovered_in = killed.elapsed();
    let rejoined = eventually(Duration::from_secs(30), || async {
        cluster.replication(1).contains("role:slave").then_some(())
    })
    .await;
    assert!(
        rejoined.is_some(),
        "the restarted node rejoined as a replica"
    );
    // Some load on the new primary too.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let failover = load.finish(&upstream, promoted_in, recovered_in).await;
    gateway.shutdown().await;
    failover
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_with_a_replica_asked_for_keeps_every_key() {
    let failover = fail_over(1).await;
    failover.report("cluster, replicas = 1");
    failover.assert_kept_everything();
}

/// Without `replicas`, the same failover; what it lost is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_without_replicas_reports_what_it_lost() {
    let failover = fail_over(0).await;
    failover.report("cluster, replicas = 0");
    assert!(failover.acknowledged.len() >= 10, "{failover:?}");
}

/// With `replicas = 1` and one primary's replica down, only that primary's
/// keys fail (closed: nothing forwarded); the other primaries' keys are
/// served. `WAIT` goes to the primary that took the write: sent to every
/// primary, as the cluster client would send it, the least answer fails
/// every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_without_its_replica_fails_only_its_own_keys() {
    let mut cluster = RedisCluster::with_replicas();
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&cluster.url(), &upstream.url()).store(|s| {
        s.set("cluster", true)
            .set("prefix", "idemgate:")
            .set("replicas", 1)
            .set("replica_timeout", "100ms");
    });
    let gateway = Gateway::start(&config).await;
    let url = gateway.url("/v1/payments");
    // Node 5 is node 2's replica.
    cluster.kill(5);
    let gone = eventually(Duration::from_secs(10), || async {
        cluster
            .replication(2)
            .contains("connected_slaves:0")
            .then_some(())
    })
    .await;
    assert!(gone.is_some(), "node 2 still counts its replica");

    let http = client();
    let keys: Vec<String> = (0..48).map(|i| format!("k{i}")).collect();
    let mut failed = Vec::new();
    for key in &keys {
        let reply = post(&http, &url, key, BODY).await;
        match reply.status {
            StatusCode::CREATED => assert_eq!(upstream.count(key), 1, "{key}"),
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(
                    reply.problem_type(),
                    "urn:idemgate:problem:store-unavailable",
                    "{key}"
                );
                assert_eq!(upstream.count(key), 0, "{key} was forwarded");
                failed.push(key);
            }
            other => panic!("{key}: unexpected {other}: {reply:?}"),
        }
    }
    assert!(!failed.is_empty(), "node 2's keys failed closed");
    assert!(
        failed.len() < keys.len() / 2,
        "only node 2's keys (about a third) fail: {} of {} did",
        failed.len(),
        keys.len()
    );

    // With the replica back, they are served (once the claims the failed
    // attempts left are abandoned).
    cluster.restart(5);
    for key in failed {
        let served = eventually(Duration::from_secs(30), || async {
            let reply = post(&http, &url, key, BODY).await;
            (reply.status == StatusCode::CREATED).then_some(())
        })
        .await;
        assert!(served.is_some(), "{key} not served with the replica back");
        assert_eq!(upstream.count(key), 1, "{key}");
    }
}
