//! Erasure on the SQLite store (`keys erase`): one step removes up to its
//! limit of a route's records of one scope, found through the primary key
//! `(route, scope, key)` from the previous step's last key on, inside the
//! writer's transaction (crates/store/src/erased.rs).

use sqlx::sqlite::SqliteConnection;

use super::rows::{Context, unavailable};
use crate::{EraseStep, Erased, RecordKey, StoreError};

/// One step of erasure: up to `limit` records of `route` and `scope`
/// whose key sorts after `after`, those the upstream may be working on
/// only with `force` (transitions::deletable in SQL: a live lease, or an
/// inquiry neither asked nor due). Both statements read the primary key's
/// range of the route and scope, `(route, scope, key)`: the scope's
/// records, never the table; the step's, from its cursor on, never what
/// earlier steps passed over (crates/store/src/erased.rs).
pub(super) async fn erase(
    conn: &mut SqliteConnection,
    step: &EraseStep<'_>,
    context: &Context,
    now: i64,
) -> Result<Erased, StoreError> {
    let (route, scope, limit) = (step.route, step.scope, step.limit);
    let mut keys: Vec<String> = sqlx::query_scalar(ERASE)
        .bind(route)
        .bind(scope)
        .bind(step.force)
        .bind(now)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind(step.after.unwrap_or(""))
        .fetch_all(&mut *conn)
        .await
        .map_err(unavailable)?;
    for key in &keys {
        let key = RecordKey {
            route: route.to_string(),
            scope: scope.to_vec(),
            key: key.clone(),
        };
        context.announce(conn, &key, now).await?;
    }
    // RETURNING has no order; the key column's collation is BINARY, the
    // bytes' order, which is a `String`'s.
    keys.sort_unstable();
    let mut erased = Erased::in_key_order(keys);
    if !erased.more(limit) {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM idemgate_records WHERE route = ?1 AND scope = ?2",
        )
        .bind(route)
        .bind(scope)
        .fetch_one(&mut *conn)
        .await
        .map_err(unavailable)?;
        erased.left = u64::try_from(left).unwrap_or(0);
    }
    Ok(erased)
}

/// [`erase`]'s statement: `?1` route, `?2` scope, `?3` force, `?4` now
/// (µs), `?5` limit, `?6` the cursor (`''` at first). Public for the test
/// that reads its plan (tests/it/stores/sqlite.rs).
pub const ERASE: &str = "DELETE FROM idemgate_records
  WHERE rowid IN (SELECT rowid FROM idemgate_records
                   WHERE route = ?1 AND scope = ?2 AND key > ?6
                     AND (?3 OR lease_until <= ?4 OR state IN ('completed', 'held')
                          OR (state = 'inquiring' AND inquiries > 0))
                   ORDER BY key LIMIT ?5)
  RETURNING key";
