//! Redis under Sentinel: a primary, its replica and three sentinels
//! (private servers); one gateway on `redis+sentinel://`. Under load the
//! primary is killed (SIGKILL); the sentinels promote the replica, and the
//! gateway finds it by itself. The killed server is then started again
//! (empty, as a server without persistence restarts) and the sentinels make
//! it the new primary's replica: with `replicas = 1`, new keys are served
//! only from then on, since until then no replica can acknowledge them.
//! Then every key the gateway acknowledged is retried: with `replicas = 1`
//! each replays and none executed twice; with `replicas = 0` what was lost
//! is reported, not asserted (whether the last writes reached the replica
//! before the kill is a race).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::support::http::try_post;
use crate::support::servers::{PrivateRedis, PrivateSentinel};
use crate::support::{Gateway, Set, TestConfig, Upstream, client, eventually, not_replayed, post};

const BODY: &str = r#"{"amount":1}"#;

/// What a failover under load kept and lost.
#[derive(Debug)]
struct Failover {
    /// Keys answered `201` (not a replay) while the load ran.
    acknowledged: Vec<String>,
    /// Of those, the ones that did not replay afterwards or reached the
    /// upstream twice.
    lost: Vec<String>,
    /// Answered `502 lease-lost`: their claim was lost in the failover.
    superseded: usize,
    /// From the kill to the replica's promotion.
    promoted_in: Duration,
    /// From the kill to the first new key served by the new primary.
    recovered_in: Duration,
}

/// Send new keys, one at a time, until `stop`: the acknowledged ones, and
/// how many were answered `502 lease-lost` (forwarded under a claim the
/// new primary never had, so their record could not be written).
async fn load(url: String, worker: usize, stop: Arc<AtomicBool>) -> (Vec<String>, usize) {
    let http = client();
    let mut acknowledged = Vec::new();
    let mut superseded = 0;
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("load-{worker}-{i}");
        i += 1;
        match try_post(&http, &url, &key, BODY).await {
            Ok(reply) if reply.status == StatusCode::CREATED && !reply.is_replay() => {
                acknowledged.push(key);
            }
            Ok(reply) if reply.status == StatusCode::SERVICE_UNAVAILABLE => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(reply) if reply.is_replay() => {}
            Ok(reply) if reply.problem_type() == "urn:idemgate:problem:lease-lost" => {
                superseded += 1;
            }
            Ok(reply) => panic!("{key}: unexpected answer during the failover: {reply:?}"),
            Err(e) => panic!("{key}: {e}"),
        }
    }
    (acknowledged, superseded)
}

/// The failover above, with `[store] replicas` and `servers` replicas
/// under the primary. With one, the killed primary is started again once
/// its replica is promoted, to be the new primary's replica.
async fn fail_over(replicas: u32, servers: usize) -> Failover {
    let mut primary = PrivateRedis::start();
    let standbys: Vec<PrivateRedis> = (0..servers)
        .map(|_| PrivateRedis::replica_of(&primary))
        .collect();
    let sentinels: Vec<PrivateSentinel> = (0..3)
        .map(|_| PrivateSentinel::watching(&primary))
        .collect();
    for sentinel in &sentinels {
        sentinel.wait_for(servers, 3);
    }
    let hosts: Vec<String> = sentinels.iter().map(PrivateSentinel::host).collect();
    let store = format!(
        "redis+sentinel://{}/{}",
        hosts.join(","),
        PrivateSentinel::PRIMARY
    );
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&store, &upstream.url()).store(|s| {
        s.set("replicas", i64::from(replicas))
            .set("replica_timeout", "100ms");
    });
    let gateway = Gateway::start(&config).await;
    let url = gateway.url("/v1/payments");

    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|w| tokio::spawn(load(url.clone(), w, stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    primary.kill();
    let killed = Instant::now();
    let promoted = eventually(Duration::from_secs(30), || async {
        standbys
            .iter()
            .any(|s| s.cli(&["INFO", "replication"]).contains("role:master"))
            .then_some(())
    })
    .await;
    assert!(
        promoted.is_some(),
        "the sentinels did not promote a replica"
    );
    let promoted_in = killed.elapsed();
    if servers == 1 {
        // Only once it is down and replaced: restarted earlier, the empty
        // server could still be the primary the sentinels name.
        primary.restart();
    }
    let http = client();
    let mut attempt = 0;
    let back = eventually(Duration::from_secs(30), || {
        attempt += 1;
        let (http, url) = (http.clone(), url.clone());
        async move {
            let reply = post(&http, &url, &format!("probe-{attempt}"), BODY).await;
            (reply.status == StatusCode::CREATED).then_some(())
        }
    })
    .await;
    assert!(back.is_some(), "no new key served within 30 s of the kill");
    let recovered_in = killed.elapsed();
    // Some load on the new primary too.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut acknowledged, mut superseded) = (Vec::new(), 0);
    for worker in workers {
        let (acked, lost_claims) = worker.await.expect("the load ran");
        acknowledged.extend(acked);
        superseded += lost_claims;
    }

    let lost = not_replayed(&http, &url, &upstream, &acknowledged, BODY).await;
    gateway.shutdown().await;
    Failover {
        acknowledged,
        lost,
        superseded,
        promoted_in,
        recovered_in,
    }
}

impl Failover {
    /// What the failover kept and lost, for the test's output.
    fn report(&self, setup: &str) {
        eprintln!(
            "{setup}: {} keys acknowledged, {} lost ({:?}), {} claims lost (502); \
             promoted {:?} and new keys served {:?} after the kill",
            self.acknowledged.len(),
            self.lost.len(),
            self.lost,
            self.superseded,
            self.promoted_in,
            self.recovered_in
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_with_a_replica_asked_for_keeps_every_key() {
    let failover = fail_over(1, 1).await;
    failover.report("replicas = 1");
    assert!(failover.acknowledged.len() >= 10, "{failover:?}");
    assert!(failover.lost.is_empty(), "{failover:?}");
    assert_eq!(failover.superseded, 0, "a claim was lost: {failover:?}");
}

/// Without `replicas`, the same failover; what it lost is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_without_replicas_reports_what_it_lost() {
    let failover = fail_over(0, 1).await;
    failover.report("replicas = 0");
    assert!(failover.acknowledged.len() >= 10, "{failover:?}");
}

/// Two replicas under the primary and `replicas = 1`: after the failover
/// the other replica follows the new primary and acknowledges, so new keys
/// are served again without waiting for the killed server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_with_a_spare_replica_keeps_serving() {
    let failover = fail_over(1, 2).await;
    failover.report("replicas = 1 of 2");
    assert!(failover.acknowledged.len() >= 10, "{failover:?}");
    assert!(failover.lost.is_empty(), "{failover:?}");
    assert_eq!(failover.superseded, 0, "a claim was lost: {failover:?}");
}
