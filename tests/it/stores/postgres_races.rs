//! Interleavings the PostgreSQL claim must survive, forced with explicit
//! transactions: a write that commits between the claim's read and its
//! write must make the claim read again, never be overwritten.

use std::time::Duration;

use idemgate::config::{StoreConfig, UnknownOutcome};
use idemgate::store::{Claim, ClaimRequest, RecordKey, Store};
use sqlx::Connection;

use crate::support::{Backend, TestStore};

async fn store(db: &TestStore) -> std::sync::Arc<dyn Store> {
    store_with(db, 4, Duration::from_secs(10)).await
}

async fn store_with(
    db: &TestStore,
    pool_size: u32,
    timeout: Duration,
) -> std::sync::Arc<dyn Store> {
    db.open_with(&StoreConfig {
        pool_size,
        timeout,
        max_records: 1,
        sweep_batch: 10,
        ..db.store_config()
    })
    .await
}

fn key() -> RecordKey {
    RecordKey {
        route: "r".into(),
        scope: Vec::new(),
        key: "race".into(),
    }
}

async fn claim(s: &dyn Store, lease: Duration, retention: Duration) -> Claim {
    s.claim(&ClaimRequest {
        key: &key(),
        fingerprint: &[1; 32],
        attempt: idemgate::store::new_attempt_id(),
        lease,
        retention,
        on_unknown_outcome: UnknownOutcome::Release,
        inquire_after: Duration::ZERO,
    })
    .await
    .unwrap()
}

/// Claim key `k` of route `r` with a fresh attempt (30 s lease, 1 h
/// retention, a lapsed lease held).
async fn claim_named(
    s: std::sync::Arc<dyn Store>,
    k: &'static str,
) -> Result<Claim, idemgate::store::StoreError> {
    s.claim(&ClaimRequest {
        key: &RecordKey {
            route: "r".into(),
            scope: Vec::new(),
            key: k.into(),
        },
        fingerprint: &[1; 32],
        attempt: idemgate::store::new_attempt_id(),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        on_unknown_outcome: UnknownOutcome::Hold,
        inquire_after: Duration::ZERO,
    })
    .await
}

/// Claim with a short lease and retention, then let both lapse.
async fn lapsed(s: &dyn Store) {
    let short = Duration::from_millis(100);
    assert!(matches!(
        claim(s, short, short).await,
        Claim::Claimed { .. }
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Run `write` in a transaction on its own connection, start a claim while
/// that transaction holds the row, commit, and return the claim's outcome.
async fn claim_across(db: &TestStore, s: std::sync::Arc<dyn Store>, write: &'static str) -> Claim {
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let done = sqlx::query(write).execute(&mut *tx).await.unwrap();
    assert_eq!(done.rows_affected(), 1);
    let claiming = tokio::spawn(async move {
        claim(
            s.as_ref(),
            Duration::from_secs(30),
            Duration::from_secs(3600),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!claiming.is_finished(), "the claim waits for the row");
    tx.commit().await.unwrap();
    claiming.await.unwrap()
}

/// [`claim_across`] a `write` to a key whose lease and retention lapsed.
async fn claim_after_lapse_across(write: &'static str) -> Claim {
    let db = TestStore::new(Backend::Postgres).await;
    let s = store(&db).await;
    lapsed(s.as_ref()).await;
    claim_across(&db, s, write).await
}

#[tokio::test]
async fn a_completion_committed_during_expiry_reuse_is_replayed_not_overwritten() {
    let outcome = claim_after_lapse_across(
        "UPDATE idemgate_records SET state = 'completed', status = 201, headers = ''::bytea,
                body = 'done'::bytea, lease_until = NULL, expires_at = now() + interval '1 hour'
          WHERE key = 'race'",
    )
    .await;
    match outcome {
        Claim::Replay(r) => assert_eq!(&r.body[..], b"done"),
        other => panic!("the fresh record was overwritten: {other:?}"),
    }
}

#[tokio::test]
async fn a_renewal_committed_during_takeover_keeps_the_key_in_flight() {
    let db = TestStore::new(Backend::Postgres).await;
    let s = store(&db).await;
    let short = Duration::from_millis(100);
    assert!(matches!(
        claim(s.as_ref(), short, Duration::from_secs(3600)).await,
        Claim::Claimed { .. }
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let outcome = claim_across(
        &db,
        s.clone(),
        "UPDATE idemgate_records SET lease_until = now() + interval '30 seconds' WHERE key = 'race'",
    )
    .await;
    assert!(
        matches!(outcome, Claim::InFlight { .. }),
        "taken over despite a live renewal: {outcome:?}"
    );
}

#[tokio::test]
async fn a_hold_committed_during_expiry_reuse_stays_held() {
    let outcome = claim_after_lapse_across(
        "UPDATE idemgate_records SET state = 'held', held_reason = 'upstream_timeout', lease_until = NULL,
                expires_at = now() + interval '1 hour'
          WHERE key = 'race'",
    )
    .await;
    assert!(
        matches!(outcome, Claim::Held { .. }),
        "a held key was claimed again: {outcome:?}"
    );
}

/// A store operation cut off by `[store] timeout` in the middle of the
/// protocol (here: a renewal waiting on a row lock) closes its connection
/// instead of returning it to the pool half-way through an exchange, and
/// frees its slot: with a pool of one, the next operations work.
#[tokio::test]
async fn an_operation_cut_off_by_the_timeout_frees_its_connection() {
    let db = TestStore::new(Backend::Postgres).await;
    let s = store_with(&db, 1, Duration::from_millis(500)).await;
    let token = match claim(
        s.as_ref(),
        Duration::from_secs(30),
        Duration::from_secs(3600),
    )
    .await
    {
        Claim::Claimed { token, .. } => token,
        other => panic!("{other:?}"),
    };
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM idemgate_records WHERE key = 'race' FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let response = idemgate::store::StoredResponse {
        status: http::StatusCode::CREATED,
        headers: http::HeaderMap::new(),
        body: bytes::Bytes::from_static(b"late"),
    };
    // A renewal: if it still lands once the lock goes (closing the socket
    // does not cancel a statement the server already runs), nothing changes.
    let blocked = s.renew(&key(), token, Duration::from_secs(30)).await;
    assert!(
        matches!(blocked, Err(idemgate::store::StoreError::Unavailable(_))),
        "{blocked:?}"
    );
    tx.rollback().await.unwrap();
    // Several operations on the one slot, each with the answer it should get.
    for _ in 0..3 {
        assert!(matches!(
            claim(
                s.as_ref(),
                Duration::from_secs(30),
                Duration::from_secs(3600)
            )
            .await,
            Claim::InFlight { .. }
        ));
    }
    assert_eq!(
        s.complete(&key(), token, &response, Duration::from_secs(3600))
            .await
            .unwrap(),
        idemgate::store::Cas::Applied
    );
    match claim(
        s.as_ref(),
        Duration::from_secs(30),
        Duration::from_secs(3600),
    )
    .await
    {
        Claim::Replay(r) => assert_eq!(&r.body[..], b"late"),
        other => panic!("{other:?}"),
    }
}

/// The server ending a session (a restart, a failover,
/// `pg_terminate_backend`) reaches the next operation on that connection as
/// a clean `FATAL` error (SQLSTATE 57P01), not a broken socket. That
/// operation fails; the connection must not go back to the pool, or the
/// one after it fails too.
#[tokio::test]
async fn a_session_the_server_ended_costs_one_failed_operation() {
    let db = TestStore::new(Backend::Postgres).await;
    let s = store_with(&db, 1, Duration::from_secs(10)).await;
    let claim_key = |k: &'static str| claim_named(s.clone(), k);
    assert!(matches!(claim_key("a").await, Ok(Claim::Claimed { .. })));

    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let ended: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = 'idemgate') t",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(ended, 1, "the store's one pooled connection");
    tokio::time::sleep(Duration::from_millis(200)).await;

    assert!(
        claim_key("b").await.is_err(),
        "the operation on the ended session fails"
    );
    let next = claim_key("c").await;
    assert!(
        matches!(next, Ok(Claim::Claimed { .. })),
        "the next one gets a new connection: {next:?}"
    );
}

/// A claim the store does not answer within `[store] timeout` (here: its
/// insert waits on another transaction's uncommitted row for the same key)
/// is given up by its caller, which answers 503 and pursues the attempt as
/// a lost claim. The server must give it up too: closing the socket does
/// not cancel a statement the server runs, so without a bound of its own
/// the claim would commit once the lock goes, seconds later, after the
/// lost-claims worker stopped looking for it: a key in flight, then held,
/// that was never forwarded.
#[tokio::test]
async fn a_claim_its_caller_gave_up_never_commits_later() {
    let db = TestStore::new(Backend::Postgres).await;
    let s = store_with(&db, 2, Duration::from_millis(500)).await;
    let claim_of = |k: &'static str| claim_named(s.clone(), k);
    // A connection made and used first: the claim below reaches the server
    // well within its timeout.
    assert!(matches!(claim_of("warm").await, Ok(Claim::Claimed { .. })));
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token, expires_at)
         VALUES ('r', '', 'race', '\\x00', 'completed', 1, now() + interval '1 hour')",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let claiming = tokio::spawn(claim_of("race"));
    tokio::time::sleep(Duration::from_millis(250)).await;
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = 'idemgate'
            AND wait_event_type = 'Lock'",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(waiting, 1, "the claim waits on the server for the row");
    let claimed = claiming.await.unwrap();
    assert!(
        matches!(claimed, Err(idemgate::store::StoreError::Unavailable(_))),
        "{claimed:?}"
    );
    // Twice the timeout: a statement the server still ran would still wait.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    tx.rollback().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let records: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idemgate_records WHERE key = 'race'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        records, 0,
        "the claim committed after its caller had given it up"
    );
}

/// An erasure step whose picked record is claimed before its DELETE
/// reaches it (READ COMMITTED reads the row again, and keeps it) goes on
/// past it: the step still removes its limit while the scope holds more,
/// so the erasure does not end early with records it could remove left
/// behind (a short step is the last one).
#[tokio::test]
async fn an_erasure_step_goes_on_past_a_record_claimed_under_it() {
    use idemgate::store::{Cas, EraseStep, StoredResponse};
    let db = TestStore::new(Backend::Postgres).await;
    let s = db.open().await;
    let scope = vec![0xe; 32];
    let at = |i: usize| RecordKey {
        route: "r".into(),
        scope: scope.clone(),
        key: format!("e{i:02}"),
    };
    let response = StoredResponse {
        status: http::StatusCode::CREATED,
        headers: http::HeaderMap::new(),
        body: bytes::Bytes::from_static(b"done"),
    };
    for i in 0..15 {
        let token = match s
            .claim(&ClaimRequest {
                key: &at(i),
                fingerprint: &[1; 32],
                attempt: idemgate::store::new_attempt_id(),
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(3600),
                on_unknown_outcome: UnknownOutcome::Release,
                inquire_after: Duration::ZERO,
            })
            .await
            .unwrap()
        {
            Claim::Claimed { token, .. } => token,
            other => panic!("{other:?}"),
        };
        let done = s
            .complete(&at(i), token, &response, Duration::from_secs(3600))
            .await;
        assert_eq!(done.unwrap(), Cas::Applied);
    }
    // Another transaction takes e03 back in flight (as a claim after its
    // expiry would) and holds the row while the step runs.
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let taken = sqlx::query(
        "UPDATE idemgate_records SET state = 'in_flight', lease_until = now() + interval '30 seconds'
          WHERE key = 'e03'",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    assert_eq!(taken.rows_affected(), 1);
    let erasing = tokio::spawn({
        let (s, scope) = (s.clone(), scope.clone());
        async move {
            s.erase(&EraseStep {
                route: "r",
                scope: &scope,
                force: false,
                limit: 10,
                after: None,
            })
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!erasing.is_finished(), "the step waits for e03's row");
    tx.commit().await.unwrap();
    let step = erasing.await.unwrap().unwrap();
    assert!(!step.keys.contains(&"e03".to_string()), "{step:?}");
    // e00..e09 were picked, e03 kept: the step went on to e10.
    assert_eq!(step.keys.len(), 10, "the step ended short: {step:?}");
    assert!(step.more(10));
    assert_eq!(step.last.as_deref(), Some("e10"));
    // The next step takes the rest, and leaves e03 (in flight) alone.
    let rest = s
        .erase(&EraseStep {
            route: "r",
            scope: &scope,
            force: false,
            limit: 10,
            after: step.last.as_deref(),
        })
        .await
        .unwrap();
    assert_eq!(rest.keys, ["e11", "e12", "e13", "e14"]);
    assert!(!rest.more(10));
    assert_eq!(rest.left, 1);
}
