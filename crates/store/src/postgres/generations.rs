//! Retention by generations (docs/src/design/retention.md): the records
//! live in two partitions of `idemgate_records`, one per generation
//! (migrations/0012_generations.sql). New keys go to the current one and
//! the claim reads both. Once the current generation is `[store]
//! generation` old, a rotation moves into the current one the few records
//! still live in the previous partition (completed late, kept by an
//! inquiry), swaps that partition for an empty one of the same name, and
//! makes it current; the old partition is dropped after the rotation has
//! committed, so the files' removal (seconds for gigabytes) holds nobody
//! up. Nothing is deleted row by row, so vacuum has no dead rows to chase
//! and the table does not grow across retention cycles.
//!
//! The rotation is one transaction. It locks `idemgate_generation` and
//! `idemgate_records` (with both partitions) exclusively, in that order,
//! the order every statement takes them. Every claim, and every batch,
//! reads `idemgate_generation` first and holds it to the end of its
//! transaction, so a claim happens wholly before or wholly after a rotation
//! and never inserts into a generation it read as current after the other
//! became so; and no other write (a completion, a renewal) can revive a
//! record between the check and the swap. The locks wait at most
//! [`lock_wait`]: a rotation that cannot have them gives way and the next
//! pass tries again. While it waits it holds nothing of the records: only
//! claims and completions (whose batches read the generation first) queue
//! behind its request, for that long at most. Once it holds them, every
//! statement on the records queues behind it for the count, the move (at
//! most [`MOST_MOVED`] records) and the swap, which changes catalog rows
//! only.

use std::time::Duration;

use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Postgres, Transaction};

use super::{PgStore, millis};
use crate::StoreError;

/// Most live records one rotation moves. They move while claims wait, so
/// the number is bounded; more means the generation is shorter than the
/// records' retention (`[store] generation`), and the rotation waits.
pub const MOST_MOVED: i64 = 10_000;

/// The longest a rotation waits for a lock: claims queue behind it that long.
pub(super) fn lock_wait(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(1), Duration::from_millis(250))
}

/// A record a claim would not take over: unexpired, or in flight under a
/// live lease (the claim's `expires_at <= now AND NOT (in flight, leased)`,
/// negated). `now()` is the transaction's start, before the locks: an
/// earlier instant counts more records live, never fewer.
const LIVE: &str = "expires_at > now() OR (state = 'in_flight' AND lease_until > now())";

/// How many records of slot `old` are live, counted up to one past
/// [`MOST_MOVED`]. Public for the test that checks its plan reads indexes
/// only (tests/it/stores/postgres_plans.rs).
pub fn live_records_sql(old: i16) -> String {
    format!(
        "SELECT count(*) FROM (SELECT 1 FROM idemgate_records_{old} WHERE {LIVE} LIMIT {}) live",
        MOST_MOVED + 1
    )
}

/// Every column but `slot`.
const COLUMNS: &str = "route, scope, key, fingerprint, state, token, lease_until, expires_at,
    created_at, updated_at, held_reason, status, headers, body, attempt, inquiries,
    inquiring_since";

/// The previous generation's partition once detached, until it is dropped.
const RETIRED: &str = "idemgate_records_retired";

/// The longest the drop of a retired partition may take: removing the
/// files of a large generation takes seconds, and nothing waits for it.
const DROP_LIMIT: Duration = Duration::from_secs(600);

/// PostgreSQL's `lock_not_available`: a lock not had within `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// What one rotation pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// The current generation is younger than `[store] generation`.
    NotDue,
    /// The previous generation was emptied and is now the current one.
    Rotated {
        /// About how many records went (from the table's statistics).
        dropped: u64,
        /// Live records moved into the other generation and kept.
        moved: u64,
    },
    /// The previous generation still holds more than [`MOST_MOVED`] live
    /// records: nothing was done.
    TooManyLive,
    /// A lock was not had within [`lock_wait`]: nothing was done.
    Busy,
}

impl PgStore {
    /// Rotate the generations if the current one is at least `generation` old.
    pub async fn rotate(&self, generation: Duration) -> Result<Rotation, StoreError> {
        // One left by a pass that stopped between its commit and its drop.
        self.drop_retired().await?;
        let wait = lock_wait(self.timeout);
        let done = self
            .bounded(async |conn| rotate(conn, generation, wait).await)
            .await?;
        if let Rotation::Rotated { .. } = done {
            self.drop_retired().await?;
        }
        Ok(done)
    }

    /// Drop the retired partition, if there is one, outside any rotation.
    async fn drop_retired(&self) -> Result<(), StoreError> {
        // `SET LOCAL`: the session's own bound comes back at the end of the
        // transaction, whether the drop commits or fails.
        Ok(self
            .pool
            .run(DROP_LIMIT, async |conn| {
                let mut tx = sqlx::Connection::begin(conn).await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "SET LOCAL statement_timeout = 0; DROP TABLE IF EXISTS {RETIRED}"
                )))
                .execute(&mut *tx)
                .await?;
                tx.commit().await
            })
            .await?)
    }
}

/// [`PgStore::rotate`] on one connection: the transaction, ended on every path.
async fn rotate(
    conn: &mut PgConnection,
    generation: Duration,
    wait: Duration,
) -> Result<Rotation, sqlx::Error> {
    // Not due (nearly every pass): outside any transaction, holding nothing.
    if !due(&mut *conn, generation).await?.1 {
        return Ok(Rotation::NotDue);
    }
    let mut tx = sqlx::Connection::begin(conn).await?;
    match steps(&mut tx, generation, wait).await {
        Ok(done @ Rotation::Rotated { .. }) => {
            tx.commit().await?;
            Ok(done)
        }
        Ok(other) => {
            // Now, not when the connection is next used: the locks go with it.
            tx.rollback().await?;
            Ok(other)
        }
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
            tx.rollback().await?;
            Ok(Rotation::Busy)
        }
        // Dropped: the pool's error path sends the ROLLBACK at once.
        Err(e) => Err(e),
    }
}

/// The current slot, and whether its generation is `generation` old.
async fn due(conn: &mut PgConnection, generation: Duration) -> Result<(i16, bool), sqlx::Error> {
    sqlx::query_as(
        "SELECT slot, clock_timestamp() - since >= $1 * INTERVAL '1 millisecond'
           FROM idemgate_generation WHERE one",
    )
    .persistent(false)
    .bind(millis(generation))
    .fetch_one(conn)
    .await
}

/// The rotation's statements, in its transaction.
async fn steps(
    tx: &mut Transaction<'_, Postgres>,
    generation: Duration,
    wait: Duration,
) -> Result<Rotation, sqlx::Error> {
    let ms = wait.as_millis().max(1);
    // The check of the old partition must read its indexes, never the
    // partition itself: it runs while claims wait. (No JIT: with sequential
    // scans off, a plan that has no other way costs enough to compile.)
    let setup = format!(
        "SET LOCAL lock_timeout = {ms}; SET LOCAL enable_seqscan = off; SET LOCAL jit = off"
    );
    sqlx::raw_sql(AssertSqlSafe(setup))
        .execute(&mut **tx)
        .await?;
    // Everything at once, in the order every statement takes them: the
    // generation (claims, batches), then the records and both partitions.
    // The detach below needs the partitioned table itself; taken last, a
    // write that had it and waited for a partition would deadlock with us.
    sqlx::raw_sql("LOCK TABLE idemgate_generation, idemgate_records IN ACCESS EXCLUSIVE MODE")
        .execute(&mut **tx)
        .await?;
    // Again under the locks: another instance may have rotated meanwhile.
    let (current, due) = due(tx, generation).await?;
    if !due {
        return Ok(Rotation::NotDue);
    }
    // The CHECK of idemgate_generation allows 0 and 1 only.
    let current = current.clamp(0, 1);
    let old = 1 - current;
    let live: i64 = sqlx::query_scalar(AssertSqlSafe(live_records_sql(old)))
        .persistent(false)
        .fetch_one(&mut **tx)
        .await?;
    if live > MOST_MOVED {
        return Ok(Rotation::TooManyLive);
    }
    let estimate: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT pg_stat_get_live_tuples('idemgate_records_{old}'::regclass)"
    )))
    .persistent(false)
    .fetch_one(&mut **tx)
    .await?;
    let moved = sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO idemgate_records_{current} ({COLUMNS}, slot)
         SELECT {COLUMNS}, {current} FROM idemgate_records_{old} WHERE {LIVE}"
    )))
    .persistent(false)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    // The swap: the old partition leaves under another name, an empty one
    // takes its name and slot (the partitioned table gives it its indexes
    // and the front's trigger). Only catalog rows change here.
    let retire = format!(
        "ALTER TABLE idemgate_records DETACH PARTITION idemgate_records_{old};
         ALTER TABLE idemgate_records_{old} RENAME TO {RETIRED};
         CREATE TABLE idemgate_records_{old}
             (LIKE idemgate_records INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
              PRIMARY KEY (route, scope, key));
         ALTER TABLE idemgate_records ATTACH PARTITION idemgate_records_{old} FOR VALUES IN ({old});
         UPDATE idemgate_generation SET slot = {old}, since = clock_timestamp() WHERE one"
    );
    sqlx::raw_sql(AssertSqlSafe(retire))
        .execute(&mut **tx)
        .await?;
    Ok(Rotation::Rotated {
        dropped: u64::try_from(estimate).unwrap_or(0).saturating_sub(moved),
        moved,
    })
}
