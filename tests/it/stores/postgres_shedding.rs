//! Shedding at the PostgreSQL batch queue (crates/store/src/postgres/batch.rs):
//! a claim that waited in the queue past `[store] claim_queue_budget` is
//! answered `503` overloaded at once and never sent (its key stays free),
//! and a claim whose client left while it was queued is never sent.
//!
//! The store is slowed by a transaction holding `idemgate_records` (`LOCK
//! TABLE … IN EXCLUSIVE MODE`): the first claim's batch waits in the
//! database, and the claims after it wait in the queue behind it.

use std::time::{Duration, Instant};

use http::StatusCode;
use sqlx::{Connection, PgConnection};
use tokio::task::JoinHandle;

use crate::support::{Backend, Reply, Set, Setup, eventually, post, sample};

/// Keys that queue behind the blocked batch.
const QUEUED: usize = 6;
/// `[store] timeout` of these tests: every shed answer must come well
/// before it.
const STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// A gateway on PostgreSQL serving on the shared runtime (one batch queue),
/// `[store] timeout` 5 s and the given `claim_queue_budget`.
async fn gateway(budget: &'static str) -> Setup {
    Setup::with(Backend::Postgres, |config| {
        config
            .top(|t| {
                t.set("server_threads", 0);
            })
            .store(|s| {
                s.set("timeout", "5s").set("claim_queue_budget", budget);
            })
    })
    .await
}

/// A connection holding the records table in a transaction, and the first
/// request, whose claim's batch has been sent and waits on it: every claim
/// after it waits in the queue until [`release`].
async fn hold_the_table(s: &Setup) -> (PgConnection, JoinHandle<Reply>) {
    let mut conn = PgConnection::connect(&s.store.url).await.unwrap();
    sqlx::raw_sql("BEGIN; LOCK TABLE idemgate_records IN EXCLUSIVE MODE")
        .execute(&mut conn)
        .await
        .unwrap();
    let (c, u) = (s.client.clone(), s.gateway.url("/v1/payments"));
    let first = tokio::spawn(async move { post(&c, &u, "first", "{}").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    (conn, first)
}

/// Let the table go; the first request is answered.
async fn release(mut conn: PgConnection, first: JoinHandle<Reply>) {
    sqlx::raw_sql("COMMIT").execute(&mut conn).await.unwrap();
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
}

/// [`QUEUED`] claims (`{prefix}-{i}`) queued for 700 ms behind a held
/// table; each one's answer with how long it took.
async fn queue_behind_a_held_table(s: &Setup, prefix: &str) -> Vec<(Reply, Duration)> {
    let url = s.gateway.url("/v1/payments");
    let (conn, first) = hold_the_table(s).await;
    let queued: Vec<_> = (0..QUEUED)
        .map(|i| {
            let (c, u, key) = (s.client.clone(), url.clone(), format!("{prefix}-{i}"));
            tokio::spawn(async move {
                let asked = Instant::now();
                let reply = post(&c, &u, &key, "{}").await;
                (reply, asked.elapsed())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    release(conn, first).await;
    let mut answers = Vec::new();
    for q in queued {
        answers.push(q.await.unwrap());
    }
    answers
}

#[tokio::test]
async fn claims_queued_past_the_budget_get_a_fast_503_and_their_keys_stay_free() {
    let s = gateway("100ms").await;
    let answers = queue_behind_a_held_table(&s, "shed").await;
    for (i, (reply, took)) in answers.iter().enumerate() {
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
        assert!(reply.text().contains("overloaded"), "{}", reply.text());
        assert!(reply.header("retry-after").is_some(), "{reply:?}");
        assert!(
            *took < STORE_TIMEOUT / 3,
            "shed-{i} answered after {took:?}, not well before the store timeout"
        );
        assert_eq!(s.upstream.count(&format!("shed-{i}")), 0, "never forwarded");
    }
    let metrics = s.gateway.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "idemgate_store_claims_shed_total{reason=\"queue_budget\"}"
        ),
        QUEUED as f64
    );
    // Nothing was written: each key is free, and its retry goes through once.
    let url = s.gateway.url("/v1/payments");
    for i in 0..QUEUED {
        let key = format!("shed-{i}");
        let retry = post(&s.client, &url, &key, "{}").await;
        assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
        assert!(!retry.is_replay());
        assert_eq!(s.upstream.count(&key), 1);
    }
}

/// The control: the same queue with a budget longer than the wait sheds
/// nothing.
#[tokio::test]
async fn claims_queued_within_the_budget_are_sent() {
    let s = gateway("4s").await;
    let answers = queue_behind_a_held_table(&s, "kept").await;
    for (i, (reply, _)) in answers.iter().enumerate() {
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        assert_eq!(s.upstream.count(&format!("kept-{i}")), 1);
    }
    let metrics = s.gateway.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "idemgate_store_claims_shed_total{reason=\"queue_budget\"}"
        ),
        0.0
    );
}

/// A client that hangs up while its claim waits in the queue (not yet
/// sent) leaves no work behind: the claim is dropped, the upstream never
/// sees the key, and the key is free.
#[tokio::test]
async fn a_claim_whose_client_left_before_it_was_sent_is_dropped() {
    let s = gateway("4s").await;
    let url = s.gateway.url("/v1/payments");
    let (conn, first) = hold_the_table(&s).await;
    let gone = crate::support::http::post_and_walk_away(s.gateway.addr, "gone").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(gone); // the client leaves while its claim is queued
    tokio::time::sleep(Duration::from_millis(300)).await;
    release(conn, first).await;
    let counted = eventually(Duration::from_secs(5), || async {
        let metrics = s.gateway.metrics().await;
        let gone = sample(
            &metrics,
            "idemgate_store_claims_shed_total{reason=\"caller_gone\"}",
        );
        (gone == 1.0).then_some(())
    })
    .await;
    assert!(
        counted.is_some(),
        "the queued claim was shed as caller_gone"
    );
    // Were it sent, its task would forward now; give it the chance.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(s.upstream.count("gone"), 0, "the upstream never saw it");
    let retry = post(&s.client, &url, "gone", "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.is_replay(), "nothing was recorded for it");
    assert_eq!(s.upstream.count("gone"), 1);
}
