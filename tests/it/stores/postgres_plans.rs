//! PostgreSQL plans at scale: the statements on the request path and the
//! rotation's must find their rows through an index whatever the table's
//! size and statistics, never by reading the whole table.
//!
//! - The rotation of generations counts the live records of the partition
//!   it retires through the indexes (it runs while claims wait): the plan
//!   is read with EXPLAIN on 50,000 records with fresh statistics, with
//!   sequential scans off as the rotation has them, and on as the negative
//!   control.
//! - The inquirer's count of inquiring keys reads only the partial index
//!   of open records (sequential scans allowed, fresh statistics; the
//!   count of completed records, which reads the table, is the control).
//! - Erasure reads a scope's range of the primary key, each step from its
//!   cursor on (the Index Cond bounds the key), not the table.
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

/// Fresh statistics of both generations' partitions.
async fn analyze(conn: &mut sqlx::PgConnection) {
    for partition in ["idemgate_records_0", "idemgate_records_1"] {
        sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE {partition}")))
            .execute(&mut *conn)
            .await
            .unwrap();
    }
}

/// `statement`'s plan on `conn`, with sequential scans off as the
/// rotation has them or not.
async fn plan(conn: &mut sqlx::PgConnection, statement: &str, seqscan: bool) -> String {
    let setting = if seqscan { "on" } else { "off" };
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SET enable_seqscan = {setting}"
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    let explain = format!("EXPLAIN {statement}");
    let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
        .fetch_all(conn)
        .await
        .unwrap();
    rows.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rotation_counts_live_records_by_index() {
    let store = TestStore::new(Backend::Postgres).await;
    // Opening the store applies the migrations (the partitions and indexes).
    let _backend = idemgate::store::open(&store.store_config()).await.unwrap();
    let mut conn = sqlx::PgConnection::connect(&store.url).await.unwrap();
    // 50,000 records in slot 0, most of them still live: the check runs
    // while claims wait, so it must read the indexes, not the partition.
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
    sqlx::query("ANALYZE idemgate_records_0")
        .execute(&mut conn)
        .await
        .unwrap();
    let check = idemgate::store::postgres::live_records_sql(0);
    let indexed = plan(&mut conn, &check, false).await;
    assert!(
        !indexed.contains("Seq Scan") && indexed.contains("Index"),
        "the rotation's check reads the whole partition:\n{indexed}"
    );
    // The negative control: with sequential scans allowed, the planner
    // reads the partition, or this test could not tell the two apart.
    let scanned = plan(&mut conn, &check, true).await;
    assert!(
        scanned.contains("Seq Scan"),
        "the check reads indexes even with sequential scans on, so this test proves nothing:\n{scanned}"
    );
}

/// The inquirer counts the `inquiring` keys of its routes every second
/// (`idemgate_inquiries_pending`): through each partition's partial index
/// of open records, never by reading the records, with sequential scans
/// allowed and fresh statistics on 50,000 records, 50 of them inquiring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inquiring_count_reads_the_open_records_only() {
    let store = TestStore::new(Backend::Postgres).await;
    let _backend = idemgate::store::open(&store.store_config()).await.unwrap();
    let mut conn = sqlx::PgConnection::connect(&store.url).await.unwrap();
    sqlx::query(
        "INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token, expires_at,
                                       lease_until, inquiring_since)
         SELECT 'r', '', 'k' || i, '\\x00',
                CASE WHEN i % 1000 = 0 THEN 'inquiring' ELSE 'completed' END, i,
                now() + interval '1 day',
                CASE WHEN i % 1000 = 0 THEN now() END, CASE WHEN i % 1000 = 0 THEN now() END
           FROM generate_series(1, 50000) AS i",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    analyze(&mut conn).await;
    let count = idemgate::store::postgres::COUNT_INQUIRING.replace("$1", "ARRAY['r']");
    let counted = plan(&mut conn, &count, true).await;
    assert!(
        !counted.contains("Seq Scan on idemgate_records_0") && counted.contains("open"),
        "the count reads the records, not the open ones:\n{counted}"
    );
    // The negative control: counting completed records reads the table.
    let completed = count.replace("'inquiring'", "'completed'");
    let scanned = plan(&mut conn, &completed, true).await;
    assert!(
        scanned.contains("Seq Scan on idemgate_records_0"),
        "this test cannot tell an index from a scan:\n{scanned}"
    );
    let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count))
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 50);
}

/// Erasure (`keys erase`) finds a scope's records on a route through the
/// primary key, `(route, scope, key)`, in both generations' partitions:
/// its cost is the scope's records, not the table's (sequential scans
/// allowed, fresh statistics, 50,000 records of 500 scopes); and a step
/// after the first starts its index scan at its cursor (`key > …` in the
/// Index Cond), so it never reads again what earlier steps passed over.
/// The negative control: the same statement once the primary keys are
/// dropped reads the partitions whole, its cursor a filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_finds_a_scope_by_index() {
    let store = TestStore::new(Backend::Postgres).await;
    let _backend = idemgate::store::open(&store.store_config()).await.unwrap();
    let mut conn = sqlx::PgConnection::connect(&store.url).await.unwrap();
    sqlx::query(
        "INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token, expires_at)
         SELECT 'r', sha256(int4send(i % 500)), 'k' || i, '\\x00', 'completed', i,
                now() + interval '1 day'
           FROM generate_series(1, 50000) AS i",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    analyze(&mut conn).await;
    // A step after the first: it resumes past the last key the previous
    // one removed.
    let erase = idemgate::store::postgres::ERASE
        .replace("$1", "'r'")
        .replace("$2", "sha256(int4send(7))")
        .replace("$3", "false")
        .replace("$4", "1000")
        .replace("$5", "'k25007'");
    let found = plan(&mut conn, &erase, true).await;
    // (The new generation's partition is empty: a scan of it reads nothing.)
    assert!(
        !found.contains("Seq Scan on idemgate_records_0")
            && found.contains("Index Scan using idemgate_records_pkey on idemgate_records_0")
            && found.contains("key = ANY"),
        "erasure reads the records, not the scope's range of the primary key:\n{found}"
    );
    assert!(
        starts_at_the_cursor(&found),
        "the step reads the scope's range from its start, not from the cursor:\n{found}"
    );
    let past: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idemgate_records
          WHERE route = 'r' AND scope = sha256(int4send(7)) AND key > 'k25007'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!((1..100).contains(&past), "{past}");
    let removed: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(erase.clone()))
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        removed.len() as i64,
        past,
        "the scope's records past the cursor, and only them"
    );
    assert!(removed.iter().all(|k| k.as_str() > "k25007"), "{removed:?}");
    // The negative control, on this test's own database.
    let keys: Vec<(String, String)> = sqlx::query_as(
        "SELECT conrelid::regclass::text, conname::text FROM pg_constraint
          WHERE contype = 'p' AND conrelid::regclass::text LIKE 'idemgate_records_%'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    for (table, name) in keys {
        let drop = format!("ALTER TABLE {table} DROP CONSTRAINT {name}");
        sqlx::query(sqlx::AssertSqlSafe(drop))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let scanned = plan(&mut conn, &erase, true).await;
    assert!(
        scanned.contains("Seq Scan on idemgate_records_0"),
        "this test cannot tell an index from a scan:\n{scanned}"
    );
    assert!(
        !starts_at_the_cursor(&scanned) && scanned.contains("key > 'k25007'"),
        "this test cannot tell a cursor the index starts at from a filter:\n{scanned}"
    );
}

/// Whether an index scan of `plan` starts at the erasure's cursor: an
/// `Index Cond` bounds the key from below, so the rows before it (those
/// earlier steps kept, and the dead entries of those they removed) are
/// never read again.
fn starts_at_the_cursor(plan: &str) -> bool {
    plan.lines()
        .any(|line| line.contains("Index Cond:") && line.contains("(key > 'k25007'"))
}

/// Rows read by sequential scans of the records' partitions so far, and
/// index scans, as the cumulative statistics have them. Rows, not scans:
/// a sequential scan of an empty partition (the new generation) reads
/// nothing and is the cheapest plan for it.
async fn scans(conn: &mut sqlx::PgConnection) -> (i64, i64) {
    sqlx::query_as(
        "SELECT coalesce(sum(seq_tup_read), 0)::int8, coalesce(sum(idx_scan), 0)::int8
           FROM pg_stat_user_tables WHERE relname IN ('idemgate_records_0', 'idemgate_records_1')",
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
            inquire_after: Duration::ZERO,
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
/// functions' `enable_seqscan = off` (migration 0009, and the claim and
/// batch of 0013 and 0015's batch that the gateway calls now, which carry
/// it in their definitions) reset first.
async fn claim_scans(seq_scans_allowed: bool) -> (i64, i64) {
    let (_storage, store, mut conn) = fresh_store().await;
    if seq_scans_allowed {
        // The migration's statements, undone, and the same for 0013's.
        let migration = include_str!("../../../migrations/0009_plans.sql");
        let current = [
            "ALTER FUNCTION idemgate_claim(TEXT, BYTEA, TEXT, BYTEA, BIGINT, BIGINT, BOOLEAN,
                 BIGINT, BIGINT) SET enable_seqscan = off",
            "ALTER FUNCTION idemgate_batch(TEXT[], TEXT[], BYTEA[], TEXT[], BYTEA[], BIGINT[],
                 BIGINT[], BOOLEAN[], BIGINT[], BIGINT[], SMALLINT[], BYTEA[], BYTEA[], TEXT[],
                 BIGINT[]) SET enable_seqscan = off",
            "ALTER FUNCTION idemgate_batch_expiry(TEXT[], TEXT[], BYTEA[], TEXT[], BYTEA[],
                 BIGINT[], BIGINT[], BOOLEAN[], BIGINT[], BIGINT[], SMALLINT[], BYTEA[], BYTEA[],
                 TEXT[], BIGINT[]) SET enable_seqscan = off",
            "ALTER FUNCTION idemgate_kept_ms(TEXT, BYTEA, TEXT, BIGINT) SET enable_seqscan = off",
        ];
        for statement in migration
            .split(';')
            .filter(|s| s.contains("ALTER FUNCTION"))
            .chain(current)
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
        "claims scanned the whole table ({seq} rows read by sequential scans, {idx} index scans)"
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
    assert_eq!(seq, 0, "renewals read {seq} rows by sequential scans");
    // The negative control: a named statement of the same shape keeps the
    // plan it settled on while the table was small.
    let seq = renewal_scans(true).await;
    assert!(
        seq > 0,
        "a named renewal found its keys by index too, so this test proves nothing"
    );
}
