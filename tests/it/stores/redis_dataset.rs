//! A Redis server that lost idemgate's records (restarted without
//! persistence) is reported: the gateway's next connection finds the
//! records' marker gone, logs an error and counts it in
//! `idemgate_store_data_lost_total`. The same restart of a server with
//! persistence keeps the records and the marker, and reports nothing (the
//! negative control: the check does not report every reconnection).

use std::time::Duration;

use http::StatusCode;

use crate::support::servers::PrivateRedis;
use crate::support::{Gateway, TestConfig, Upstream, client, eventually, post, sample};

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
