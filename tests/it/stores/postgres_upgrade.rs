//! A PostgreSQL database of the release before the status inquiry (schema
//! 5) is upgraded in place by `migrate`: the state's CHECK is replaced, the
//! new columns come with their defaults, and the open-records index is
//! built (migration 0008, which an operator may build ahead), and the
//! table becomes the first generation's partition (migrations 0010–0012),
//! with every record kept and claims answered as before, and without
//! reading the table while it is held exclusively.

use sqlx::Connection;
use sqlx::migrate::Migrator;

use idemgate::store::postgres::MIGRATOR;
use idemgate::store::{RecordKey, RecordState};

use crate::support::{Backend, TestStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_5_database_is_upgraded_with_its_records() {
    let store = TestStore::new(Backend::Postgres).await;
    let mut conn = sqlx::PgConnection::connect(&store.url).await.unwrap();
    migrate_to(&mut conn, 5).await;
    sqlx::query(
        "INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token,
                                       expires_at, held_reason)
         VALUES ('api', '', 'old-held', '\\x00', 'held', 7, now() + interval '1 day',
                 'upstream_timeout')",
    )
    .execute(&mut conn)
    .await
    .unwrap();

    // Opening the store migrates (as `[store] migrate = true` does).
    let backend = idemgate::store::open(&store.store_config()).await.unwrap();
    backend.ping().await.unwrap();
    let key = RecordKey {
        route: "api".into(),
        scope: Vec::new(),
        key: "old-held".into(),
    };
    let info = backend
        .inspect(&key)
        .await
        .unwrap()
        .expect("the record was kept");
    assert_eq!(info.state, RecordState::Held);
    assert_eq!(info.held_reason, Some("upstream_timeout"));
    let valid: (bool, bool) = sqlx::query_as(
        "SELECT (SELECT bool_and(convalidated) FROM pg_constraint
                  WHERE conname IN ('idemgate_records_state_check',
                                    'idemgate_records_0_slot')),
                (SELECT indisvalid FROM pg_index
                  WHERE indexrelid = 'idemgate_records_open'::regclass)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        valid,
        (true, true),
        "the CHECKs are validated and the index valid"
    );
    assert_eq!(
        first_generation(&mut conn).await,
        1,
        "the table did not become slot 0's partition"
    );
}

/// The records in slot 0's partition, the table the upgrade started from.
async fn first_generation(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idemgate_records_0")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Rows of the table `relid` read by sequential scans so far, as the
/// cumulative statistics have them. This connection's own counts are
/// reported when its next transaction ends (forced, not at most once a
/// second), so they include every migration it ran. (Forcing it needs
/// PostgreSQL 15; the tests' servers are.)
async fn rows_read(conn: &mut sqlx::PgConnection, relid: u32) -> i64 {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar(
        "SELECT coalesce(seq_tup_read, 0)::int8 FROM pg_stat_user_tables WHERE relid = $1",
    )
    .bind(sqlx::postgres::types::Oid(relid))
    .fetch_one(conn)
    .await
    .unwrap()
}

/// Apply the migrations up to `version` on `conn`.
async fn migrate_to(conn: &mut sqlx::PgConnection, version: i64) {
    let upto: Vec<_> = MIGRATOR
        .iter()
        .filter(|m| m.version <= version)
        .cloned()
        .collect();
    Migrator::with_migrations(upto).run(conn).await.unwrap();
}

/// The upgrade to generations (0010–0012) reads the existing records once,
/// in 0011, whose lock lets claims and writes go on; 0010 and 0012, which
/// hold the table exclusively while every statement on it waits, read none
/// of it. 0011's read is counted too, or the counter proves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generations_upgrade_reads_the_records_only_while_writes_go_on() {
    let store = TestStore::new(Backend::Postgres).await;
    let mut conn = sqlx::PgConnection::connect(&store.url).await.unwrap();
    migrate_to(&mut conn, 9).await;
    sqlx::query(
        "INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token, expires_at)
         SELECT 'r', '', 'k' || i, '\\x00', 'completed', i, now() + interval '1 day'
           FROM generate_series(1, 1000) AS i",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let relid: sqlx::postgres::types::Oid =
        sqlx::query_scalar("SELECT 'idemgate_records'::regclass::oid")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    let relid = relid.0;
    let before = rows_read(&mut conn, relid).await;
    migrate_to(&mut conn, 10).await;
    assert_eq!(
        rows_read(&mut conn, relid).await - before,
        0,
        "0010 read the records under its exclusive lock"
    );
    migrate_to(&mut conn, 11).await;
    let validated = rows_read(&mut conn, relid).await;
    assert!(
        validated - before >= 1000,
        "0011's validation was not counted ({}), so this test proves nothing",
        validated - before
    );
    migrate_to(&mut conn, i64::MAX).await;
    assert_eq!(
        rows_read(&mut conn, relid).await - validated,
        0,
        "0012 read the records under its exclusive lock"
    );
    assert_eq!(
        first_generation(&mut conn).await,
        1000,
        "the table did not become slot 0's partition"
    );
}
