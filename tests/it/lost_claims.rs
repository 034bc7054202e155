//! A claim whose answer was lost (the store froze past `[store] timeout`)
//! may still commit when the store resumes. Its request was never
//! forwarded, so its key must not stay in flight or turn `held`: the
//! gateway abandons exactly that attempt's record once the store answers.
//! The issue's reproduction, on a private Redis and a private PostgreSQL
//! cluster, each frozen with SIGSTOP for 1.5 s.

use std::time::Duration;

use http::StatusCode;

use crate::support::servers::{PgCluster, PrivateRedis};
use crate::support::{
    Gateway, HttpClient, Set, TestConfig, Upstream, client, eventually, post, sample,
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

/// Freeze the store, send a keyed POST (503), thaw after 1.5 s, then retry
/// until the key is forwarded: never a held answer, one execution, and the
/// orphan counted as abandoned.
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
    thaw_after(Duration::from_millis(1500), &thaw).await;
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

async fn thaw_after(wait: Duration, thaw: &impl Fn()) {
    tokio::time::sleep(wait).await;
    thaw();
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

/// G6 from the claim on: a client that hangs up while its claim waits on a
/// frozen store changes nothing. The claim and the forward run in a task of
/// their own, so once the store resumes the request is forwarded exactly
/// once and recorded, and the client's retry gets the replay: the key never
/// stays in flight or turns `held`.
#[tokio::test]
async fn a_client_gone_during_its_claim_changes_nothing() {
    use tokio::io::AsyncWriteExt;

    let redis = PrivateRedis::start();
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&redis.url(), &upstream.url())
        .store(|s| {
            s.set("timeout", "10s").set("pool_size", 1);
        })
        .route(|r| {
            r.set("lease", "3s");
        });
    let gateway = Gateway::start(&config).await;
    let c: HttpClient = client();
    let url = gateway.url("/v1/payments");
    assert_eq!(
        post(&c, &url, "warm", "{}").await.status,
        StatusCode::CREATED
    );

    redis.signal("-STOP");
    let mut conn = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
    conn.write_all(
        b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: gone\r\n\
          Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(conn);
    thaw_after(Duration::from_millis(1000), &|| redis.signal("-CONT")).await;

    let replayed = eventually(Duration::from_secs(30), || {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let reply = post(&c, &url, "gone", "{}").await;
            assert_ne!(reply.status, StatusCode::BAD_GATEWAY, "held: {reply:?}");
            (reply.status == StatusCode::CREATED).then_some(reply)
        }
    })
    .await
    .expect("the retry is answered");
    assert!(
        replayed.is_replay(),
        "the gone client's request was forwarded and recorded: {replayed:?}"
    );
    assert_eq!(upstream.count("gone"), 1);
}
