//! A Redis server that lost idemgate's records is reported: restarted
//! without persistence, the gateway's next connection finds the records'
//! marker gone; flushed (no connection closes), the sweeper's next pass
//! does. Each logs an error and counts it in
//! `idemgate_store_data_lost_total`. The same restart of a server with
//! persistence keeps the records and the marker, and reports nothing (the
//! negative control: the check does not report every reconnection). A
//! server that refuses the marker (an ACL without it) still serves: the
//! check only observes.

use std::time::Duration;

use http::StatusCode;

use crate::support::servers::PrivateRedis;
use crate::support::{Gateway, Set, TestConfig, Upstream, client, eventually, post, sample};

const BODY: &str = r#"{"amount":1}"#;
const LOST: &str = "idemgate_store_data_lost_total";

/// A key before and one after a restart of `redis`: the losses reported,
/// and whether the first key replayed after it.
async fn restart_under_the_gateway(mut redis: PrivateRedis) -> (f64, bool) {
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&TestConfig::new(&redis.url(), &upstream.url())).await;
    let (http, url) = (client(), gateway.url("/v1/payments"));
    assert_eq!(
        post(&http, &url, "before", BODY).await.status,
        StatusCode::CREATED
    );
    assert_eq!(sample(&gateway.metrics().await, LOST), 0.0);

    redis.kill();
    redis.restart();
    let after = eventually(Duration::from_secs(10), || async {
        let reply = post(&http, &url, "after", BODY).await;
        (reply.status == StatusCode::CREATED).then_some(())
    })
    .await;
    assert!(after.is_some(), "no key served after the restart");
    let replayed = post(&http, &url, "before", BODY).await.is_replay();
    let lost = sample(&gateway.metrics().await, LOST);
    gateway.shutdown().await;
    (lost, replayed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_came_back_empty_is_reported() {
    let (lost, replayed) = restart_under_the_gateway(PrivateRedis::start()).await;
    assert!(!replayed, "the restarted server kept the records");
    assert_eq!(lost, 1.0, "the lost records were not reported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_kept_its_records_is_not_reported() {
    let (lost, replayed) = restart_under_the_gateway(PrivateRedis::start_durable()).await;
    assert!(replayed, "the durable server lost the records");
    assert_eq!(lost, 0.0, "a restart that lost nothing was reported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_redis_is_reported_by_the_sweeper() {
    let redis = PrivateRedis::start();
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&redis.url(), &upstream.url()).store(|s| {
        s.set("sweep_interval", "200ms");
    });
    let gateway = Gateway::start(&config).await;
    let (http, url) = (client(), gateway.url("/v1/payments"));
    assert_eq!(
        post(&http, &url, "before", BODY).await.status,
        StatusCode::CREATED
    );
    // Passes over records that are all there report nothing.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(sample(&gateway.metrics().await, LOST), 0.0);

    redis.cli(&["FLUSHALL"]);
    let reported = eventually(Duration::from_secs(10), || async {
        (sample(&gateway.metrics().await, LOST) == 1.0).then_some(())
    })
    .await;
    assert!(reported.is_some(), "the flush was not reported");
    assert!(!post(&http, &url, "before", BODY).await.is_replay());
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_refuses_the_marker_still_serves() {
    let redis = PrivateRedis::start();
    // Every key of the store but the marker.
    redis.cli(&[
        "ACL",
        "SETUSER",
        "gateway",
        "on",
        ">secret",
        "~acl:rec:*",
        "~acl:token",
        "~acl:due*",
        "~acl:inquiring:*",
        "&*",
        "+@all",
    ]);
    let url = format!("redis://gateway:secret@127.0.0.1:{}/", redis.port());
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&url, &upstream.url()).store(|s| {
        s.set("prefix", "acl:").set("sweep_interval", "200ms");
    });
    let gateway = Gateway::start(&config).await;
    let (http, url) = (client(), gateway.url("/v1/payments"));
    assert_eq!(
        post(&http, &url, "first", BODY).await.status,
        StatusCode::CREATED
    );
    assert!(post(&http, &url, "first", BODY).await.is_replay());
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        post(&http, &url, "second", BODY).await.status,
        StatusCode::CREATED
    );
    assert_eq!(sample(&gateway.metrics().await, LOST), 0.0);
    gateway.shutdown().await;
}
