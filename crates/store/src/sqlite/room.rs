//! Giving a SQLite file's free room back: the sweeper's deletions leave
//! free pages, which later records reuse, so the file holds flat across
//! retention cycles; but after a peak (a burst of keys, a long retention
//! shortened) the file would keep its largest size for good.
//!
//! Files the store creates use `auto_vacuum = INCREMENTAL`: after each
//! sweep statement the writer returns free pages beyond a quarter of the
//! file ([`KEPT_FREE`]) to the file system, at most [`RELEASE_PAGES`] at a
//! time, inside the sweep's own write transaction, so the write lock is
//! held briefly and the next records still find room without growing the
//! file again. A file created without it (by an older release, or by hand)
//! keeps its free pages; the store says so when it opens it, with how to
//! convert it (`VACUUM`, offline).

use sqlx::sqlite::SqliteConnection;

use super::rows::unavailable;
use crate::StoreError;

/// The share of the file kept free once the rest is given back: a
/// quarter (of the file after the release).
const KEPT_FREE: i64 = 4;

/// Most pages one sweep statement gives back (8 MiB of 4 KiB pages).
const RELEASE_PAGES: i64 = 2048;

/// `PRAGMA auto_vacuum` of a file that gives free pages back.
const INCREMENTAL: i64 = 2;

/// Whether the file gives free pages back (`auto_vacuum = INCREMENTAL`).
pub(super) async fn gives_room_back(conn: &mut SqliteConnection) -> Result<bool, sqlx::Error> {
    let mode: i64 = sqlx::query_scalar("PRAGMA auto_vacuum")
        .fetch_one(conn)
        .await?;
    Ok(mode == INCREMENTAL)
}

/// Give back free pages beyond a quarter of the file, [`RELEASE_PAGES`]
/// at most; returns how many were asked back (none on a file without
/// `auto_vacuum = INCREMENTAL`, where SQLite ignores the request).
pub(super) async fn release(conn: &mut SqliteConnection) -> Result<i64, StoreError> {
    let free: i64 = sqlx::query_scalar("PRAGMA freelist_count")
        .fetch_one(&mut *conn)
        .await
        .map_err(unavailable)?;
    let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
        .fetch_one(&mut *conn)
        .await
        .map_err(unavailable)?;
    // Kept: `k` free pages with k = (used + k) / KEPT_FREE, so the file
    // that remains is a quarter free.
    let kept = (pages - free) / (KEPT_FREE - 1);
    let excess = (free - kept).min(RELEASE_PAGES);
    if excess <= 0 {
        return Ok(0);
    }
    // PRAGMA takes no parameters; the count is a number computed here.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "PRAGMA incremental_vacuum({excess})"
    )))
    .execute(&mut *conn)
    .await
    .map_err(unavailable)?;
    Ok(excess)
}
