//! The SQLite store's schema, versioned by `PRAGMA user_version`: the
//! scripts under `migrations/sqlite/`, embedded, applied in order.
//!
//! Not sqlx's migrator: its SQLite backend takes no lock (its `lock` is a
//! no-op in sqlx-sqlite 0.9), so two processes opening a new file at the
//! same moment could both apply the first script. Here the version is read
//! and every missing script applied inside one `BEGIN IMMEDIATE`
//! transaction, which holds SQLite's write lock: a second process waits
//! (`busy_timeout`), then finds the schema current and applies nothing.

use sqlx::Connection;
use sqlx::sqlite::SqliteConnection;

/// The scripts, in order; the schema's version is how many are applied.
const SCRIPTS: &[&str] = &[
    include_str!("../../../../migrations/sqlite/0001_records.sql"),
    include_str!("../../../../migrations/sqlite/0002_inquiry.sql"),
];

/// The schema version this build needs.
pub(super) const VERSION: i64 = SCRIPTS.len() as i64;

/// The file's schema version.
pub(super) async fn version(conn: &mut SqliteConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(conn)
        .await
}

/// Apply the scripts the file lacks, atomically; returns how many.
pub(super) async fn migrate(conn: &mut SqliteConnection) -> Result<usize, sqlx::Error> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    let current = usize::try_from(version(&mut tx).await?).unwrap_or(0);
    let missing = SCRIPTS.get(current..).unwrap_or_default();
    for script in missing {
        sqlx::raw_sql(sqlx::AssertSqlSafe(*script))
            .execute(&mut *tx)
            .await?;
    }
    if !missing.is_empty() {
        // PRAGMA takes no parameters; the value is a constant of this build.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "PRAGMA user_version = {VERSION}"
        )))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(missing.len())
}
