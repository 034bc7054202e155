//! The PostgreSQL store's administration: inspecting, listing, clearing
//! and deleting records, the sweeper's batches, readiness, pool and batch
//! figures, and the wake-up relay.

use std::sync::Arc;
use std::time::Duration;

use super::generations::{MOST_MOVED, Rotation};
use super::{MIGRATOR, PgStore, millis};

use crate::info::from_epoch_millis;
use crate::waiters::{self, Waiters};
use crate::{
    BatchStats, EraseStep, EraseStepFailed, Erased, InquiringRoute, Inquiry, PoolStats, RecordInfo,
    RecordKey, RecordState, StoreAdmin, StoreError, StoredResponse, Swept,
};

#[derive(sqlx::FromRow)]
struct InfoRow {
    route: String,
    scope: Vec<u8>,
    key: String,
    state: String,
    held_reason: Option<String>,
    token: i64,
    created_ms: i64,
    updated_ms: i64,
    expires_ms: i64,
    lease_ms: Option<i64>,
    status: Option<i16>,
    body_bytes: Option<i64>,
    inquiries: i32,
    since_ms: Option<i64>,
}

const INFO_COLUMNS: &str = "route, scope, key, state, held_reason, token,
    (EXTRACT(EPOCH FROM created_at) * 1000)::int8 AS created_ms,
    (EXTRACT(EPOCH FROM updated_at) * 1000)::int8 AS updated_ms,
    (EXTRACT(EPOCH FROM expires_at) * 1000)::int8 AS expires_ms,
    (EXTRACT(EPOCH FROM lease_until) * 1000)::int8 AS lease_ms,
    status, octet_length(body)::int8 AS body_bytes, inquiries,
    (EXTRACT(EPOCH FROM inquiring_since) * 1000)::int8 AS since_ms
    FROM idemgate_records";

/// Take the due questions of the routes `$1` (names, with their retention
/// in ms in `$4`), up to `$3`, each with a new token and a lease of `$2` ms
/// (transitions::take_applies): rows other instances are taking are
/// skipped, so each question has one taker. A lapsed in-flight record
/// starts its inquiry here once its route's `after` (ms, `$5`) has passed
/// since the lapse, reckoned from the lapse; every taken record is kept at least its
/// route's retention. The instant is `statement_timestamp()` (stable), so
/// the partial index of in-flight and inquiring records (migration 0008)
/// bounds the scan by `lease_until`.
const TAKE: &str = "UPDATE idemgate_records r
        SET token = nextval('idemgate_token_seq'),
            inquiring_since = CASE WHEN r.state = 'inquiring' THEN r.inquiring_since
                                   ELSE LEAST(r.lease_until, clock_timestamp()) END,
            inquiries = CASE WHEN r.state = 'inquiring' THEN r.inquiries ELSE 0 END,
            state = 'inquiring',
            lease_until = clock_timestamp() + $2 * INTERVAL '1 millisecond',
            expires_at = GREATEST(r.expires_at,
                                  clock_timestamp() + due.retention_ms * INTERVAL '1 millisecond'),
            updated_at = clock_timestamp()
       FROM (SELECT d.route, d.scope, d.key, q.retention_ms
               FROM idemgate_records d
               JOIN unnest($1::text[], $4::int8[], $5::int8[]) AS q(route, retention_ms, after_ms)
                 ON q.route = d.route
              WHERE d.state IN ('in_flight', 'inquiring')
                AND d.lease_until <= statement_timestamp()
                AND (d.state = 'inquiring'
                     OR d.lease_until
                        <= statement_timestamp() - q.after_ms * INTERVAL '1 millisecond')
                AND d.expires_at > statement_timestamp()
              ORDER BY d.lease_until LIMIT $3 FOR UPDATE OF d SKIP LOCKED) due
      WHERE r.route = due.route AND r.scope = due.scope AND r.key = due.key
  RETURNING r.route, r.scope, r.key, r.token, r.inquiries,
            (EXTRACT(EPOCH FROM clock_timestamp() - r.inquiring_since) * 1000)::int8 AS for_ms";

/// `transitions::deletable` in SQL, with `force` the parameter `$n`: a
/// live lease, or an inquiry neither asked nor due (inside its route's
/// `after`), only with force. (A completed or held record has no lease:
/// its `lease_until <= …` is NULL, and its state decides.)
macro_rules! deletable {
    ($n:literal) => {
        concat!(
            "($",
            $n,
            " OR lease_until <= clock_timestamp() OR state = 'completed'
              OR state = 'held' OR (state = 'inquiring' AND inquiries > 0))"
        )
    };
}

/// One step of erasure: up to `$4` records of route `$1` and scope `$2`
/// whose key sorts after `$5` (the previous step's last, `''` at first),
/// those the upstream may be working on only with `$3` ([`deletable!`],
/// re-checked on the row the DELETE finds). Both reads go through the
/// primary key, `(route, scope, key)`, whose first two columns are exactly
/// these (in each generation's partition): a scope's records are one range
/// of it, so the cost is that range's, whatever the table holds, and no
/// index of its own costs bytes on every record. The keys are picked first
/// in key order, from `$5` on (an array, read once: at most `$4` entries
/// of the range past the cursor), and then deleted by the whole primary
/// key each, so a step never reads more of a large scope than it removes,
/// nor what earlier steps passed over (crates/store/src/erased.rs). The
/// removed keys come back in key order, in the column's collation, the
/// last one the next step's cursor. Public for the test that reads its
/// plan (tests/it/stores/postgres_plans.rs).
pub const ERASE: &str = concat!(
    "WITH gone AS (
    DELETE FROM idemgate_records
      WHERE route = $1 AND scope = $2
        AND key = ANY (ARRAY(SELECT key FROM idemgate_records
                              WHERE route = $1 AND scope = $2 AND key > $5 AND ",
    deletable!(3),
    "
                              ORDER BY key LIMIT $4))
        AND ",
    deletable!(3),
    "
  RETURNING key)
SELECT key FROM gone ORDER BY key"
);

/// What an erasure leaves of a scope on a route (through the primary key,
/// as [`ERASE`]).
const ERASE_LEFT: &str = "SELECT count(*) FROM idemgate_records WHERE route = $1 AND scope = $2";

/// How many records of the routes `$1` are `inquiring` and unexpired, as
/// [`TAKE`] sees them: both generations' partitions, each through its
/// partial index of in-flight and inquiring records (migration 0008, and
/// 0012 for the partitions), so the count reads only open records, however
/// many completed ones the table holds. Public for the test that reads its
/// plan (tests/it/stores/postgres_plans.rs).
pub const COUNT_INQUIRING: &str = "SELECT count(*) FROM idemgate_records
      WHERE state = 'inquiring' AND route = ANY($1) AND expires_at > statement_timestamp()";

impl InfoRow {
    fn into_info(self) -> Result<RecordInfo, StoreError> {
        let key = RecordKey {
            route: self.route,
            scope: self.scope,
            key: self.key,
        };
        RecordInfo::from_parts(
            &key,
            &self.state,
            self.held_reason.as_deref(),
            self.token,
            [self.created_ms, self.updated_ms, self.expires_ms].map(from_epoch_millis),
            self.lease_ms.map(from_epoch_millis),
            self.status.and_then(|s| u16::try_from(s).ok()),
            self.body_bytes.and_then(|b| u64::try_from(b).ok()),
        )
        .map(|info| {
            let asked = u32::try_from(self.inquiries).unwrap_or(0);
            info.with_inquiry(asked, self.since_ms.map(from_epoch_millis))
        })
        .ok_or_else(|| StoreError::Corrupt(format!("record in unknown state {:?}", self.state)))
    }
}

#[async_trait::async_trait]
impl StoreAdmin for PgStore {
    async fn relay_wakeups(&self, waiters: Arc<Waiters>) {
        waiters::relay(|| self.listen(&waiters)).await;
    }

    async fn sweep(&self, _batch: usize) -> Result<Swept, StoreError> {
        // Retention by generations: one rotation, when due.
        let records = match self.rotate(self.generation).await? {
            Rotation::Rotated { dropped, moved } => {
                tracing::info!(dropped, moved, "records generation retired");
                dropped
            }
            Rotation::TooManyLive => {
                tracing::warn!(
                    most = MOST_MOVED,
                    "the previous records generation still holds more live records than a \
                     rotation moves; make [store] generation at least the longest retention"
                );
                0
            }
            Rotation::Busy => {
                tracing::warn!(
                    "records generation rotation waited too long for its locks; next pass"
                );
                0
            }
            Rotation::NotDue => 0,
        };
        Ok(Swept {
            records,
            more: false,
        })
    }

    async fn take_inquiries(
        &self,
        routes: &[InquiringRoute],
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Inquiry>, StoreError> {
        type Row = (String, Vec<u8>, String, i64, i32, i64);
        let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
        let retentions: Vec<i64> = routes.iter().map(|r| millis(r.retention)).collect();
        let afters: Vec<i64> = routes.iter().map(|r| millis(r.after)).collect();
        let rows: Vec<Row> = self
            .bounded(async |conn| {
                // Unnamed, as the sweep: planned at each round.
                sqlx::query_as(TAKE)
                    .persistent(false)
                    .bind(&names)
                    .bind(millis(lease))
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .bind(&retentions)
                    .bind(&afters)
                    .fetch_all(conn)
                    .await
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|(route, scope, key, token, asked, for_ms)| Inquiry {
                key: RecordKey { route, scope, key },
                token,
                asked: u32::try_from(asked).unwrap_or(0),
                inquiring_for: Duration::from_millis(u64::try_from(for_ms).unwrap_or(0)),
            })
            .collect())
    }

    async fn count_inquiring(&self, routes: &[InquiringRoute]) -> Result<u64, StoreError> {
        if routes.is_empty() {
            return Ok(0);
        }
        let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
        let n: i64 = self
            .bounded(async |conn| {
                // Unnamed, as the take: planned at each round.
                sqlx::query_scalar(COUNT_INQUIRING)
                    .persistent(false)
                    .bind(&names)
                    .fetch_one(conn)
                    .await
            })
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        let sql = format!(concat!("SELECT {} WHERE ", key_match!()), INFO_COLUMNS);
        let row: Option<InfoRow> = self
            .bounded(async |conn| {
                bind_key!(sqlx::query_as(sqlx::AssertSqlSafe(sql)), key)
                    .fetch_optional(conn)
                    .await
            })
            .await?;
        row.map(InfoRow::into_info).transpose()
    }

    async fn recorded(&self, key: &RecordKey) -> Result<Option<StoredResponse>, StoreError> {
        type Row = (Option<i16>, Option<Vec<u8>>, Option<Vec<u8>>);
        let row: Option<Row> = self
            .bounded(async |conn| {
                bind_key!(
                    sqlx::query_as(at_key!(
                        "SELECT status, headers, body FROM idemgate_records",
                        "AND state = 'completed'"
                    )),
                    key
                )
                .fetch_optional(conn)
                .await
            })
            .await?;
        row.map(|(status, headers, body)| {
            let headers = headers.unwrap_or_default();
            StoredResponse::from_fields(status.map(i64::from), &headers, body.unwrap_or_default())
        })
        .transpose()
    }

    async fn list(
        &self,
        route: &str,
        state: RecordState,
        limit: usize,
    ) -> Result<Vec<RecordInfo>, StoreError> {
        let sql = format!(
            "SELECT {INFO_COLUMNS} WHERE route = $1 AND state = $2 ORDER BY updated_at LIMIT $3"
        );
        let rows: Vec<InfoRow> = self
            .bounded(async |conn| {
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(route)
                    .bind(state.as_str())
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(conn)
                    .await
            })
            .await?;
        rows.into_iter().map(InfoRow::into_info).collect()
    }

    async fn clear(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        let done = self
            // transitions::clearable: an inquiry inside `after` (not asked,
            // not due) only with force, as a live lease.
            .bounded(async |conn| {
                bind_key!(
                    sqlx::query(at_key!(
                        "DELETE FROM idemgate_records",
                        "AND (state = 'held'
                          OR (state = 'inquiring'
                              AND ($4 OR inquiries > 0 OR lease_until <= clock_timestamp()))
                          OR (state = 'in_flight' AND ($4 OR lease_until <= clock_timestamp())))",
                    )),
                    key
                )
                .bind(force)
                .execute(conn)
                .await
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    #[cfg(feature = "test-hooks")]
    async fn age(&self, key: &RecordKey, by: Duration) -> Result<bool, StoreError> {
        let done = self
            .bounded(async |conn| {
                // NULL (no lease, not inquiring) stays NULL.
                bind_key!(
                    sqlx::query(at_key!(
                        "UPDATE idemgate_records
                            SET lease_until = lease_until - $4 * INTERVAL '1 millisecond',
                                expires_at = expires_at - $4 * INTERVAL '1 millisecond',
                                created_at = created_at - $4 * INTERVAL '1 millisecond',
                                updated_at = updated_at - $4 * INTERVAL '1 millisecond',
                                inquiring_since = inquiring_since - $4 * INTERVAL '1 millisecond'",
                        "",
                    )),
                    key
                )
                .bind(millis(by))
                .execute(conn)
                .await
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        let done = self
            // transitions::deletable: a live lease or an inquiry inside
            // `after` only with force.
            .bounded(async |conn| {
                bind_key!(
                    sqlx::query(concat!(
                        at_key!("DELETE FROM idemgate_records", "AND"),
                        deletable!(4)
                    )),
                    key
                )
                .bind(force)
                .execute(conn)
                .await
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn erase(&self, step: &EraseStep<'_>) -> Result<Erased, EraseStepFailed> {
        let (route, scope, limit) = (step.route, step.scope, step.limit);
        // ERASE removes fewer than it picked when a picked record was
        // claimed before its DELETE reached it (READ COMMITTED checks the
        // row again, and keeps it): a short step then says nothing of what
        // is left past it. So it goes on from its last key until it has
        // its limit or finds nothing more: one statement more, returning
        // nothing, at the end of each erasure.
        let mut keys: Vec<String> = Vec::new();
        while keys.len() < limit {
            let after = keys.last().map(String::as_str).or(step.after);
            let want = limit - keys.len();
            let found: Result<Vec<String>, StoreError> = self
                .bounded(async |conn| {
                    sqlx::query_scalar(ERASE)
                        .bind(route)
                        .bind(scope)
                        .bind(step.force)
                        .bind(i64::try_from(want).unwrap_or(i64::MAX))
                        .bind(after.unwrap_or(""))
                        .fetch_all(conn)
                        .await
                })
                .await;
            match found {
                Ok(found) if found.is_empty() => break,
                Ok(found) => keys.extend(found),
                // What the earlier statements removed stays removed.
                Err(source) => {
                    return Err(EraseStepFailed {
                        removed: keys,
                        source,
                    });
                }
            }
        }
        // In key order (ERASE sorts them, and each statement starts past
        // the last), in the column's collation.
        let mut erased = Erased::in_key_order(keys);
        // The records are gone (committed): a failure now keeps their keys.
        let left = async {
            if fails_after_delete(scope) {
                return Err(StoreError::Unavailable(
                    "the pg-erase-after-delete failpoint".into(),
                ));
            }
            if erased.more(limit) {
                return Ok(0);
            }
            self.bounded(async |conn| {
                sqlx::query_scalar::<_, i64>(ERASE_LEFT)
                    .bind(route)
                    .bind(scope)
                    .fetch_one(conn)
                    .await
            })
            .await
        };
        match left.await {
            Ok(left) => {
                erased.left = u64::try_from(left).unwrap_or(0);
                Ok(erased)
            }
            Err(source) => Err(EraseStepFailed {
                removed: erased.keys,
                source,
            }),
        }
    }

    fn batch_stats(&self) -> Option<BatchStats> {
        // Shared with every serving thread's lane.
        Some(self.batcher.stats())
    }

    async fn open_serving_thread(&self, threads: usize) {
        self.open_lane(threads).await;
    }

    fn pool_stats(&self) -> Option<PoolStats> {
        let (connections, idle, max) = self.pool_figures();
        Some(PoolStats {
            connections,
            idle,
            max,
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let expected = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
        let table: Option<String> = self
            .bounded(async |conn| {
                sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
                    .fetch_one(conn)
                    .await
            })
            .await?;
        let applied: Option<i64> = match table {
            None => None,
            Some(_) => Some(
                self.bounded(async |conn| {
                    sqlx::query_scalar(
                        "SELECT COALESCE(max(version), 0) FROM _sqlx_migrations WHERE success",
                    )
                    .fetch_one(conn)
                    .await
                })
                .await?,
            ),
        };
        match applied {
            Some(v) if v >= expected => Ok(()),
            Some(v) => Err(StoreError::NotMigrated(format!(
                "schema version {v}, this build needs {expected}"
            ))),
            None => Err(StoreError::NotMigrated("no migrations applied".into())),
        }
    }
}

/// Test builds only: the `pg-erase-after-delete` failpoint, armed with
/// `return(HEX)`, fails the erasure step of the scope whose digest is HEX
/// after its delete committed, as a lost connection would before the
/// count (tests/it/features/keys.rs: the records it removed are counted
/// all the same). Always false without the `fail` crate's `failpoints`
/// feature.
fn fails_after_delete(scope: &[u8]) -> bool {
    fail::fail_point!("pg-erase-after-delete", |armed: Option<String>| {
        armed.as_deref() == Some(hex::encode(scope).as_str())
    });
    let _ = scope; // used only by the failpoint
    false
}
