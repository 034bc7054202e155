//! Batched claims and completions on PostgreSQL (crates/store/src/postgres/batch.rs):
//! operations submitted together share commits, and each keeps the meaning
//! it has alone — duplicates inside a batch resolve as if sequential, a key
//! the database refuses fails alone, and concurrent batches never deadlock.
//! Every test of the store also checks, through its batch counters, that
//! the situation it is about really happened (operations did share
//! batches); the last checks that a serving thread's batches run on its
//! own connection.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use http::{HeaderMap, StatusCode};
use idemgate::config::{StoreConfig, UnknownOutcome};
use idemgate::store::{
    Backend as StoreBackend, BatchStats, Cas, Claim, ClaimRequest, RecordKey, StoredResponse,
};
use sqlx::Connection;

use crate::support::{Backend, TestStore};

/// A PostgreSQL store sending up to `batches_in_flight` batches at once.
async fn open(db: &TestStore, batches_in_flight: u32) -> Arc<dyn StoreBackend> {
    idemgate::store::open(&StoreConfig {
        pool_size: 8,
        batches_in_flight,
        timeout: Duration::from_secs(30),
        ..db.store_config()
    })
    .await
    .unwrap()
}

fn key(k: &str) -> RecordKey {
    RecordKey {
        route: "r".into(),
        scope: Vec::new(),
        key: k.into(),
    }
}

async fn claim(store: &dyn StoreBackend, k: &RecordKey, fingerprint: u8) -> Claim {
    try_claim(store, k, fingerprint).await.unwrap()
}

async fn try_claim(
    store: &dyn StoreBackend,
    k: &RecordKey,
    fingerprint: u8,
) -> Result<Claim, idemgate::store::StoreError> {
    store
        .claim(&ClaimRequest {
            key: k,
            fingerprint: &[fingerprint; 32],
            attempt: idemgate::store::new_attempt_id(),
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
            on_unknown_outcome: UnknownOutcome::Hold,
            inquire_after: Duration::ZERO,
        })
        .await
}

fn response(body: String) -> StoredResponse {
    StoredResponse {
        status: StatusCode::CREATED,
        headers: HeaderMap::new(),
        body: Bytes::from(body),
    }
}

fn stats(store: &dyn StoreBackend) -> BatchStats {
    store.batch_stats().expect("the PostgreSQL store batches")
}

/// Some batch carried more than one operation.
fn shared(before: BatchStats, after: BatchStats) -> bool {
    after.operations - before.operations > after.batches - before.batches
}

#[tokio::test]
async fn concurrent_claims_and_completions_share_commits() {
    let db = TestStore::new(Backend::Postgres).await;
    let store = open(&db, 2).await;
    let keys: Vec<RecordKey> = (0..128).map(|i| key(&format!("k{i:03}"))).collect();

    let before = stats(store.as_ref());
    let claims = join_all(keys.iter().map(|k| claim(store.as_ref(), k, 1))).await;
    let tokens: Vec<i64> = claims
        .into_iter()
        .map(|c| match c {
            Claim::Claimed { token, .. } => token,
            other => panic!("a new key is claimed, got {other:?}"),
        })
        .collect();
    let completions = join_all(keys.iter().zip(&tokens).map(|(k, &token)| {
        let store = store.clone();
        async move {
            store
                .complete(
                    k,
                    token,
                    &response(format!("body of {}", k.key)),
                    Duration::from_secs(3600),
                )
                .await
                .unwrap()
        }
    }))
    .await;
    assert!(completions.iter().all(|c| *c == Cas::Applied));
    let after = stats(store.as_ref());
    assert_eq!(after.operations - before.operations, 256);
    assert!(shared(before, after), "{before:?} → {after:?}");
    assert_eq!(after.split, 0);

    // Every caller got its own answer: each key replays its own body.
    let replays = join_all(keys.iter().map(|k| claim(store.as_ref(), k, 1))).await;
    for (k, replay) in keys.iter().zip(replays) {
        match replay {
            Claim::Replay(r) => assert_eq!(r.body, format!("body of {}", k.key)),
            other => panic!("a completed key replays, got {other:?}"),
        }
    }
    // A completion with a stale token is fenced inside a batch too.
    let stale = join_all(keys.iter().zip(&tokens).map(|(k, &token)| {
        let store = store.clone();
        async move {
            store
                .complete(
                    k,
                    token - 1_000_000,
                    &response("late".into()),
                    Duration::from_secs(60),
                )
                .await
                .unwrap()
        }
    }))
    .await;
    assert!(stale.iter().all(|c| *c == Cas::Fenced));
}

#[tokio::test]
async fn duplicates_inside_a_batch_resolve_as_if_sequential() {
    let db = TestStore::new(Backend::Postgres).await;
    let store = open(&db, 1).await;
    let k = key("storm");
    let before = stats(store.as_ref());
    // 64 claims of one key, every fourth with another request's fingerprint.
    let outcomes = join_all((0..64u8).map(|i| {
        let fingerprint = if i % 4 == 3 { 2 } else { 1 };
        claim(store.as_ref(), &k, fingerprint)
    }))
    .await;
    let after = stats(store.as_ref());
    assert!(shared(before, after), "{before:?} → {after:?}");
    let winners: Vec<usize> = (0..64)
        .filter(|&i| matches!(outcomes[i], Claim::Claimed { .. }))
        .collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    let winner_fingerprint = if winners[0] % 4 == 3 { 2 } else { 1 };
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == winners[0] {
            continue;
        }
        let fingerprint = if i % 4 == 3 { 2 } else { 1 };
        if fingerprint == winner_fingerprint {
            assert!(matches!(outcome, Claim::InFlight { .. }), "{outcome:?}");
        } else {
            assert!(matches!(*outcome, Claim::Mismatch { .. }));
        }
    }
}

/// A trigger that refuses the insert of one key, as a per-key database
/// error (a constraint, a failed cast) would.
const POISON: &str = "
    CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'the test refuses this key';
    END $$;
    CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON idemgate_records
        FOR EACH ROW WHEN (NEW.key = 'poison') EXECUTE FUNCTION refuse_poison();";

#[tokio::test]
async fn a_refused_key_fails_alone() {
    let db = TestStore::new(Backend::Postgres).await;
    let store = open(&db, 1).await;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql(POISON).execute(&mut conn).await.unwrap();

    let keys: Vec<RecordKey> = (0..32)
        .map(|i| {
            key(&if i == 17 {
                "poison".into()
            } else {
                format!("k{i:02}")
            })
        })
        .collect();
    let before = stats(store.as_ref());
    let outcomes = join_all(keys.iter().map(|k| try_claim(store.as_ref(), k, 1))).await;
    let after = stats(store.as_ref());
    for (k, outcome) in keys.iter().zip(&outcomes) {
        if k.key == "poison" {
            assert!(outcome.is_err(), "the refused key fails: {outcome:?}");
        } else {
            assert!(
                matches!(outcome, Ok(Claim::Claimed { .. })),
                "its neighbour {} is claimed: {outcome:?}",
                k.key
            );
        }
    }
    assert!(
        after.split > before.split,
        "the refused key shared a batch with others: {before:?} → {after:?}"
    );
}

#[tokio::test]
async fn concurrent_batches_on_overlapping_keys_never_deadlock() {
    let db = TestStore::new(Backend::Postgres).await;
    // Two instances, four batches at once each.
    let stores = [open(&db, 4).await, open(&db, 4).await];
    let before = stores.each_ref().map(|s| stats(s.as_ref()));
    for round in 0..20 {
        let keys: Vec<RecordKey> = (0..24).map(|i| key(&format!("r{round}k{i}"))).collect();
        // 8 waves per instance; each wave claims every key, in its own
        // random order, so batches overlap in opposite orders.
        let waves = (0..16).map(|wave| {
            let store = stores[wave % 2].clone();
            let mut order = keys.clone();
            fastrand::shuffle(&mut order);
            async move {
                let outcomes =
                    join_all(order.iter().map(|k| try_claim(store.as_ref(), k, 1))).await;
                let mut won = 0;
                for (k, outcome) in order.iter().zip(outcomes) {
                    match outcome.unwrap_or_else(|e| panic!("claim of {}: {e}", k.key)) {
                        Claim::Claimed { token, .. } => {
                            won += 1;
                            let done = store
                                .complete(k, token, &response("ok".into()), Duration::from_secs(60))
                                .await
                                .unwrap();
                            assert_eq!(done, Cas::Applied);
                        }
                        Claim::InFlight { .. } | Claim::Replay(_) => {}
                        other => panic!("{other:?}"),
                    }
                }
                won
            }
        });
        let won: usize = join_all(waves).await.into_iter().sum();
        assert_eq!(won, 24, "each key is won exactly once");
    }
    for (store, before) in stores.iter().zip(before) {
        let after = stats(store.as_ref());
        assert_eq!(after.split, before.split, "no batch was refused (deadlock)");
        assert!(shared(before, after), "{before:?} → {after:?}");
    }
}

/// On a serving thread, a request's claim and completion go through that
/// thread's own dispatcher and connection (crates/store/src/postgres/lanes.rs),
/// which PostgreSQL lists as `idemgate serving thread`: after a few new
/// keys through the gateway, such a connection has run a batch. Sent
/// through the shared dispatcher instead, the lanes' connections would
/// show only the statement that opened them.
#[tokio::test]
async fn a_serving_threads_keys_go_through_its_own_connection() {
    use crate::support::{Gateway, TestConfig, Upstream, client, post};
    let db = TestStore::new(Backend::Postgres).await;
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&TestConfig::new(&db.url, &upstream.url())).await;
    let http = client();
    for i in 0..4 {
        let reply = post(
            &http,
            &gateway.url("/v1/payments"),
            &format!("lane-{i}"),
            "{}",
        )
        .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (lanes, batched): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE query LIKE '%idemgate_batch%')
           FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1",
    )
    .bind(idemgate::store::postgres::LANE_APPLICATION)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(
        lanes >= 1,
        "no serving thread opened a connection of its own"
    );
    assert!(
        batched >= 1,
        "no serving thread's own connection ran a batch ({lanes} open)"
    );
    gateway.shutdown().await;
}
