//! The PostgreSQL sweeper at scale: its statement must find expired
//! records through the `expires_at` index, never by reading the whole
//! table (a full scan per pass outlasted `[store] timeout` at 10 M
//! records). The plan is read with EXPLAIN on a table of 50,000 records
//! with fresh statistics; the same statement with the volatile
//! `clock_timestamp()` it used to have must not get the index, or this
//! test could not tell the two apart.

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
