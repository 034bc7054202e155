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

use std::time::{Duration, Instant};

use http::StatusCode;

use crate::support::failover::{BODY, Failover, Load};
use crate::support::servers::{PrivateRedis, PrivateSentinel, try_redis_cli};
use crate::support::{Gateway, Set, TestConfig, Upstream, client, eventually, post};

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

    let load = Load::start(&url, 4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    primary.kill();
    let killed = Instant::now();
    // Promoted, and named by every sentinel: a replica reporting
    // role:master is not enough. Until the failover is complete, a
    // sentinel can still name the old address, and the empty server
    // restarted below would be taken back as the primary, the promoted
    // replica made to sync from it (wiping every key it had).
    // A server changing roles closes its clients' connections, so a
    // question that fails is asked again on the next poll.
    let promoted = eventually(Duration::from_secs(30), || async {
        let port = standbys
            .iter()
            .find(|s| {
                try_redis_cli(s.port(), &["INFO", "replication"])
                    .is_some_and(|info| info.contains("role:master"))
            })?
            .port()
            .to_string();
        sentinels
            .iter()
            .all(|sentinel| {
                try_redis_cli(
                    sentinel.port(),
                    &[
                        "SENTINEL",
                        "get-master-addr-by-name",
                        PrivateSentinel::PRIMARY,
                    ],
                )
                .is_some_and(|addr| addr.lines().any(|line| line.trim() == port))
            })
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
    let failover = load.finish(&upstream, promoted_in, recovered_in).await;
    gateway.shutdown().await;
    if !failover.lost.is_empty() {
        // What the servers and sentinels did, to read beside the keys.
        let servers = std::iter::once(&primary).chain(&standbys);
        for (i, server) in servers.enumerate() {
            eprintln!("== server {i} (port {}):\n{}", server.port(), server.log());
        }
        for (i, sentinel) in sentinels.iter().enumerate() {
            eprintln!("== sentinel {i}:\n{}", sentinel.log());
        }
    }
    failover
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_with_a_replica_asked_for_keeps_every_key() {
    let failover = fail_over(1, 1).await;
    failover.report("replicas = 1");
    failover.assert_kept_everything();
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
    failover.assert_kept_everything();
}
