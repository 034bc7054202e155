//! PostgreSQL plans at scale: the statements on the request path and the
//! sweeper's must find their rows through an index whatever the table's
//! size and statistics, never by reading the whole table.
//!
//! - The sweeper finds expired records through the `expires_at` index (a
//!   full scan per pass outlasted `[store] timeout` at 10 M records). The
//!   plan is read with EXPLAIN on a table of 50,000 records with fresh
//!   statistics; the same statement with the volatile `clock_timestamp()`
//!   it used to have must not get the index, or this test could not tell
//!   the two apart.
//! - A claim finds its key through the primary key even on a connection
//!   that cached its plans while the table was empty and analyzed (new
//!   keys fell from 4.3k/s to 0.7k/s within 15 s as such a table grew):
//!   counted by the table's scan statistics.
//! - So does a renewal (the single statements are sent unnamed, planned at
//!   each execution), where a named statement of the same shape, prepared
//!   on the small table, reads the whole grown table.

use std::time::Duration;

use idemgate::store::{Cas, Claim, ClaimRequest, RecordKey, Store, StoreConfig, UnknownOutcome};
use sqlx::Connection;

use crate::support::{Backend, TestStore};

/// The sweeper's plan for one pass of 1,000 on `conn`'s records table.
async fn plan(conn: &mut sqlx::PgConnection, statement: &str) -> String {
    let explain = format!("EXPLAIN {}", statement.replace("$1", "1000"));
    let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
        .fetch_all(conn)
        .await
        .unwrap();
    rows.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_finds_expired_records_by_index() {
    let store = TestStore::new(Backend::Postgres).await;
    // Opening the store applies the migrations (the table and its index).
    let _backend = idemgate::store::open(&store.store_config()).await.unwrap();
    let mut conn = sqlx::PgConnection::connect(&store.url).await.unwrap();
    // 50,000 records, 1 % of them expired.
    sqlx::query(
        "INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token, expires_at)
         SELECT 'r', '', 'k' || i, '\\x00', 'completed', i,
                CASE WHEN i % 100 = 0 THEN now() - interval '1 hour'
                     ELSE now() + interval '1 day' END
           FROM generate_series(1, 50000) AS i",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("ANALYZE idemgate_records")
        .execute(&mut conn)
        .await
        .unwrap();

    let sweep = plan(&mut conn, idemgate::store::postgres::SWEEP).await;
    assert!(
        sweep.contains("idemgate_records_expires_at"),
        "the sweep does not use the expires_at index:\n{sweep}"
    );
    // The negative control: the volatile clock the statement used to read.
    let volatile =
        idemgate::store::postgres::SWEEP.replace("statement_timestamp()", "clock_timestamp()");
    let before = plan(&mut conn, &volatile).await;
    assert!(
        !before.contains("idemgate_records_expires_at"),
        "with clock_timestamp() the index is used too, so this test proves nothing:\n{before}"
    );
}

/// Sequential and index scans of the records table so far, as the
/// cumulative statistics have them.
async fn scans(conn: &mut sqlx::PgConnection) -> (i64, i64) {
    sqlx::query_as(
        "SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0)
           FROM pg_stat_user_tables WHERE relname = 'idemgate_records'",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

fn record_key(key: &str) -> RecordKey {
    RecordKey {
        route: "r".into(),
        scope: Vec::new(),
        key: key.to_string(),
    }
}

async fn claim(store: &dyn Store, key: &str) -> Claim {
    let key = record_key(key);
    store
        .claim(&ClaimRequest {
            key: &key,
            fingerprint: &[1; 32],
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
            on_unknown_outcome: UnknownOutcome::Hold,
            attempt: 1,
        })
        .await
        .unwrap()
}

/// Make the store's connection report every scan it counted so far: a
/// backend reports when a transaction ends at least a second after its
/// last report (else up to 10 s later, when idle), before it answers; so
/// one more claim, a second on, reports everything before it returns.
async fn flush_counts(store: &dyn Store, phase: &str) {
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    claim(store, &format!("{phase}-flush")).await;
}

/// A fresh store on one connection (the one whose cached plans are under
/// test), and a connection of the test's own to its database.
async fn fresh_store() -> (TestStore, std::sync::Arc<dyn Store>, sqlx::PgConnection) {
    let storage = TestStore::new(Backend::Postgres).await;
    let config = StoreConfig {
        pool_size: 1,
        ..storage.store_config()
    };
    let store = idemgate::store::open(&config).await.unwrap();
    let conn = sqlx::PgConnection::connect(&storage.url).await.unwrap();
    (storage, store, conn)
}

/// Grow the table to 200,000 more rows with no new statistics (autovacuum
/// would take a while, and is off on some servers).
async fn grow(conn: &mut sqlx::PgConnection) {
    sqlx::query(
        "INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token, expires_at)
         SELECT 'r', '', 'k' || i, '\\x00', 'completed', i, now() + interval '1 day'
           FROM generate_series(1, 200000) AS i",
    )
    .execute(conn)
    .await
    .unwrap();
}

/// On a fresh store: plans cached on an analyzed empty table, the table
/// grown to 200,000 rows without new statistics, then 50 claims; their
/// sequential and index scans of the table. `seq_scans_allowed`: the
/// functions' `enable_seqscan = off` (migration 0009) reset first.
async fn claim_scans(seq_scans_allowed: bool) -> (i64, i64) {
    let (_storage, store, mut conn) = fresh_store().await;
    if seq_scans_allowed {
        // The migration's statements, undone.
        let migration = include_str!("../../../migrations/0009_plans.sql");
        for statement in migration
            .split(';')
            .filter(|s| s.contains("ALTER FUNCTION"))
        {
            let start = statement.find("ALTER FUNCTION").unwrap();
            let reset =
                statement[start..].replace("SET enable_seqscan = off", "RESET enable_seqscan");
            sqlx::query(sqlx::AssertSqlSafe(reset))
                .execute(&mut conn)
                .await
                .unwrap();
        }
    }
    sqlx::query("ANALYZE idemgate_records")
        .execute(&mut conn)
        .await
        .unwrap();
    // Enough claims for every statement to settle on its cached plan.
    for i in 0..20 {
        claim(store.as_ref(), &format!("early-{i}")).await;
    }
    grow(&mut conn).await;
    flush_counts(store.as_ref(), "early").await;
    let (seq_before, idx_before) = scans(&mut conn).await;
    for i in 0..50 {
        claim(store.as_ref(), &format!("late-{i}")).await;
    }
    flush_counts(store.as_ref(), "late").await;
    let (seq, idx) = scans(&mut conn).await;
    assert!(idx > idx_before, "the claims' scans were not counted");
    (seq - seq_before, idx - idx_before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_find_their_key_by_index_after_stats_of_an_empty_table() {
    let (seq, idx) = claim_scans(false).await;
    assert_eq!(
        seq, 0,
        "claims scanned the whole table ({seq} sequential scans, {idx} index scans)"
    );
    // The negative control: without the setting, the same steps must
    // scan, or this test could not tell the two apart.
    let (seq, idx) = claim_scans(true).await;
    assert!(
        seq > 0,
        "without enable_seqscan = off the claims scanned by index too ({idx}), so this test proves nothing"
    );
}

/// A key claimed and renewed `times` times: by the store (`named` false),
/// or by a named statement of the renewal's shape on `conn`.
async fn claim_and_renew(
    store: &dyn Store,
    conn: &mut sqlx::PgConnection,
    key: &str,
    named: bool,
    times: usize,
) {
    let Claim::Claimed { token, .. } = claim(store, key).await else {
        panic!("{key} was not claimed");
    };
    for _ in 0..times {
        if named {
            sqlx::query(
                "UPDATE idemgate_records
                    SET lease_until = clock_timestamp() + interval '30 s',
                        updated_at = clock_timestamp()
                  WHERE route = $1 AND scope = $2 AND key = $3
                    AND token = $4 AND state = 'in_flight'",
            )
            .bind("r")
            .bind(Vec::<u8>::new())
            .bind(key)
            .bind(token)
            .execute(&mut *conn)
            .await
            .unwrap();
        } else {
            let renewed = store
                .renew(&record_key(key), token, Duration::from_secs(30))
                .await
                .unwrap();
            assert_eq!(renewed, Cas::Applied);
        }
    }
}

/// As [`claim_scans`] for renewals: 20 keys claimed and renewed 5 times
/// each on the analyzed empty table, the table grown to 200,000 rows
/// without new statistics, then 10 keys renewed 5 times each; the
/// sequential scans the late renewals made (claims make none: the test
/// above).
async fn renewal_scans(named: bool) -> i64 {
    let (_storage, store, mut conn) = fresh_store().await;
    sqlx::query("ANALYZE idemgate_records")
        .execute(&mut conn)
        .await
        .unwrap();
    for i in 0..20 {
        claim_and_renew(store.as_ref(), &mut conn, &format!("early-{i}"), named, 5).await;
    }
    grow(&mut conn).await;
    // Both connections report their counts (see flush_counts).
    flush_counts(store.as_ref(), "early").await;
    sqlx::query("SELECT 1").execute(&mut conn).await.unwrap();
    let (seq_before, _) = scans(&mut conn).await;
    for i in 0..10 {
        claim_and_renew(store.as_ref(), &mut conn, &format!("late-{i}"), named, 5).await;
    }
    flush_counts(store.as_ref(), "late").await;
    sqlx::query("SELECT 1").execute(&mut conn).await.unwrap();
    let (seq, _) = scans(&mut conn).await;
    seq - seq_before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_find_their_key_by_index_after_stats_of_an_empty_table() {
    let seq = renewal_scans(false).await;
    assert_eq!(seq, 0, "renewals scanned the whole table {seq} times");
    // The negative control: a named statement of the same shape keeps the
    // plan it settled on while the table was small.
    let seq = renewal_scans(true).await;
    assert!(
        seq > 0,
        "a named renewal found its keys by index too, so this test proves nothing"
    );
}
