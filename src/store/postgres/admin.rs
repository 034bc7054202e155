//! The PostgreSQL store's administration: inspecting, listing, clearing
//! and deleting records, the sweeper's batches, readiness, pool and batch
//! figures, and the wake-up relay.

use std::sync::Arc;

use super::{MIGRATOR, PgStore};

/// One pass of the sweeper (transitions::expired): delete up to `$1`
/// expired records, bounded, skipping rows other transactions hold, so
/// never a long lock. The instant is `statement_timestamp()`, which the
/// planner can see (a stable function): with `clock_timestamp()`, which
/// is volatile, the `expires_at` index went unused and every pass read the
/// whole table, past `[store] timeout` at 10 M records. Public for the
/// test that checks its plan (tests/it/stores/postgres_sweep.rs).
pub const SWEEP: &str = "DELETE FROM idemgate_records
      WHERE ctid IN (SELECT ctid FROM idemgate_records
                      WHERE expires_at <= statement_timestamp()
                        AND NOT (state = 'in_flight' AND lease_until > statement_timestamp())
                      LIMIT $1 FOR UPDATE SKIP LOCKED)";
use crate::store::info::from_epoch_millis;
use crate::store::{
    BatchStats, PoolStats, RecordInfo, RecordKey, RecordState, StoreAdmin, StoreError,
};
use crate::waiters::{self, Waiters};

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
}

const INFO_COLUMNS: &str = "route, scope, key, state, held_reason, token,
    (EXTRACT(EPOCH FROM created_at) * 1000)::int8 AS created_ms,
    (EXTRACT(EPOCH FROM updated_at) * 1000)::int8 AS updated_ms,
    (EXTRACT(EPOCH FROM expires_at) * 1000)::int8 AS expires_ms,
    (EXTRACT(EPOCH FROM lease_until) * 1000)::int8 AS lease_ms,
    status, octet_length(body)::int8 AS body_bytes
    FROM idemgate_records";

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
        .ok_or_else(|| StoreError::Corrupt(format!("record in unknown state {:?}", self.state)))
    }
}

#[async_trait::async_trait]
impl StoreAdmin for PgStore {
    async fn relay_wakeups(&self, waiters: Arc<Waiters>) {
        waiters::relay(|| self.listen(&waiters)).await;
    }

    async fn sweep(&self, batch: usize) -> Result<u64, StoreError> {
        let done = self
            .bounded(async |conn| {
                sqlx::query(SWEEP)
                    .bind(i64::try_from(batch).unwrap_or(i64::MAX))
                    .execute(conn)
                    .await
            })
            .await?;
        Ok(done.rows_affected())
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
            // transitions::clearable
            .bounded(async |conn| bind_key!(sqlx::query(at_key!(
                    "DELETE FROM idemgate_records",
                    "AND (state = 'held'
                             OR (state = 'in_flight' AND ($4 OR lease_until <= clock_timestamp())))",
                )), key)
                .bind(force)
                .execute(conn).await)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        let done = self
            // transitions::deletable
            .bounded(async |conn| {
                bind_key!(
                    sqlx::query(at_key!(
                        "DELETE FROM idemgate_records",
                        "AND ($4 OR state <> 'in_flight' OR lease_until <= clock_timestamp())"
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

    fn batch_stats(&self) -> Option<BatchStats> {
        Some(self.batcher.stats())
    }

    fn pool_stats(&self) -> Option<PoolStats> {
        let (connections, idle, max) = self.pool.stats();
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
