//! G6 — disconnects change nothing: a client that goes away mid-forward, or
//! while its claim still waits on the store (PostgreSQL holding a table
//! lock, a frozen Redis), leaves a request that is still forwarded once and
//! recorded, and its retry gets the replay.

use std::time::Duration;

use http::StatusCode;

use super::thaw_after;
use crate::support::servers::PrivateRedis;
use crate::support::{
    Backend, Gateway, HttpClient, Set, Setup, TestConfig, Upstream, client, eventually,
    per_backend, post,
};

async fn client_disconnect_mid_forward_is_recorded_and_replayed(b: Backend) {
    let s = Setup::start(b).await;
    let url = s.gateway.url("/v1/slow/800");
    let (client, u) = (s.client.clone(), url.clone());
    let impatient = tokio::spawn(async move { post(&client, &u, "gone", "{}").await });
    let seen = eventually(Duration::from_secs(5), || async {
        (s.upstream.count("gone") == 1).then_some(())
    })
    .await;
    assert!(seen.is_some(), "the upstream got the request");
    impatient.abort(); // the client goes away mid-forward
    let replay = eventually(Duration::from_secs(10), || async {
        let r = post(&s.client, &url, "gone", "{}").await;
        r.is_replay().then_some(r)
    })
    .await
    .expect("the abandoned exchange was recorded");
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(s.upstream.count("gone"), 1);
}

per_backend!(client_disconnect_mid_forward_is_recorded_and_replayed);

#[tokio::test]
async fn client_gone_during_the_claim_still_gets_forwarded_and_recorded() {
    use sqlx::Connection;
    let s = Setup::with(Backend::Postgres, |config| {
        config.store(|s| {
            s.set("timeout", "5s");
        })
    })
    .await;
    let (upstream, c) = (&s.upstream, &s.client);
    let url = s.gateway.url("/v1/payments");
    // Hold the table so the claim waits in the database.
    let mut conn = sqlx::PgConnection::connect(&s.store.url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("LOCK TABLE idemgate_records IN EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let (c2, u2) = (c.clone(), url.clone());
    let impatient = tokio::spawn(async move { post(&c2, &u2, "gone-early", "{}").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    impatient.abort(); // the client leaves while the claim waits
    tokio::time::sleep(Duration::from_millis(200)).await;
    tx.commit().await.unwrap();
    let replay = eventually(Duration::from_secs(10), || async {
        let r = post(c, &url, "gone-early", "{}").await;
        r.is_replay().then_some(r)
    })
    .await
    .expect("the claim went on to forward and record");
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(upstream.count("gone-early"), 1);
}

/// G6 from the claim on: a client that hangs up while its claim waits on a
/// frozen store changes nothing. The claim and the forward run in a task of
/// their own, so once the store resumes the request is forwarded exactly
/// once and recorded, and the client's retry gets the replay: the key never
/// stays in flight or turns `held`.
#[tokio::test]
async fn a_client_gone_during_its_claim_changes_nothing() {
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
    let conn = crate::support::http::post_and_walk_away(gateway.addr, "gone").await;
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
