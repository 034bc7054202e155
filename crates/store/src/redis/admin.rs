//! The Redis store's administration: inspecting, listing (a `SCAN` of
//! every primary), clearing and deleting records, readiness and pool
//! figures, and the wake-up relay.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{self, Value};

use super::RedisStore;
use super::conn::{Node, primaries};
use super::scripts::{CLEAR, INSPECT};
use super::store::{bytes, corrupt, int};
use crate::info::from_epoch_millis;
use crate::waiters::{self, Waiters};
use crate::{
    EraseStep, EraseStepFailed, Erased, InquiringRoute, Inquiry, PoolStats, RecordInfo, RecordKey,
    RecordState, StoreAdmin, StoreError, StoredResponse, Swept,
};

/// Where a [`RedisStore::scan_route`] stands: the nodes still to scan
/// (the current one last) and the cursor on the current one.
pub(super) struct RouteScan {
    pattern: Vec<u8>,
    nodes: Vec<Option<Node>>,
    cursor: u64,
}

impl RouteScan {
    /// The keys of the next `SCAN` call (up to 1,000, maybe none), or
    /// `None` once every node was scanned.
    pub(super) async fn next(
        &mut self,
        store: &RedisStore,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        let Some(node) = self.nodes.last() else {
            return Ok(None);
        };
        let (pattern, node, cursor) = (&self.pattern, node.as_ref(), self.cursor);
        let (next, keys): (u64, Vec<Vec<u8>>) = store
            .bounded(|mut conn| async move {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000);
                conn.query_node(scan, node).await
            })
            .await?;
        self.cursor = next;
        if next == 0 {
            self.nodes.pop();
        }
        Ok(Some(keys))
    }
}

/// Keep the `limit` least recently changed records, oldest first.
fn least_recent_first(found: &mut Vec<RecordInfo>, limit: usize) {
    found.sort_by_key(|info| info.updated_at);
    found.truncate(limit);
}

impl RedisStore {
    /// A cluster's primaries, asked afresh (remembered for the wake-up
    /// subscriber); `[None]` for one server, the only node there is.
    async fn scan_nodes(&self) -> Result<Vec<Option<Node>>, StoreError> {
        if !self.layout.cluster {
            return Ok(vec![None]);
        }
        let slots: Value = self
            .bounded(|mut conn| async move {
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        let found = primaries(&slots);
        if found.is_empty() {
            return Err(StoreError::Unavailable(
                "the cluster names no primary in CLUSTER SLOTS".to_string(),
            ));
        }
        *self.nodes.lock().unwrap_or_else(|e| e.into_inner()) = found.clone();
        Ok(found.into_iter().map(Some).collect())
    }

    /// A `SCAN` of every record key of `route` (on a cluster, on every
    /// primary), read a call at a time with [`RouteScan::next`].
    pub(super) async fn scan_route(&self, route: &str) -> Result<RouteScan, StoreError> {
        Ok(RouteScan {
            pattern: self.layout.route_pattern(route),
            nodes: self.scan_nodes().await?,
            cursor: 0,
        })
    }

    async fn clear_script(
        &self,
        key: &RecordKey,
        force: bool,
        completed_too: bool,
    ) -> Result<bool, StoreError> {
        let record = self.layout.record_key(key);
        let sets = self.layout.sets(key);
        let wake = self.wake_args(key);
        let flag = |b: bool| if b { "1" } else { "0" };
        let mut invocation = CLEAR.key(&record[..]);
        invocation.key(&sets.due).key(&sets.inquiring);
        // A scoped record's scope set: the record leaves it with its key.
        if let Some(scope) = self.layout.scope_set(key) {
            invocation.key(scope);
        }
        invocation
            .arg(flag(force))
            .arg(flag(completed_too))
            .arg(&wake.0)
            .arg(&wake.1);
        let invocation = &invocation;
        let n: i64 = self
            .bounded(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await?;
        Ok(n == 1)
    }
}

#[async_trait::async_trait]
impl StoreAdmin for RedisStore {
    async fn relay_wakeups(&self, waiters: Arc<Waiters>) {
        waiters::relay(|| self.listen(&waiters)).await;
    }

    async fn erase(&self, step: &EraseStep<'_>) -> Result<Erased, EraseStepFailed> {
        self.erase_buckets(step).await
    }

    async fn take_inquiries(
        &self,
        routes: &[InquiringRoute],
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Inquiry>, StoreError> {
        self.take_due(routes, lease, limit).await
    }

    async fn count_inquiring(&self, routes: &[InquiringRoute]) -> Result<u64, StoreError> {
        self.count_in_buckets(routes).await
    }

    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        let record = self.layout.record_key(key);
        let reply: Option<Vec<Value>> = self
            .bounded(
                |mut conn| async move { INSPECT.key(&record[..]).invoke_async(&mut conn).await },
            )
            .await?;
        let Some(f) = reply else {
            return Ok(None);
        };
        let text = |i: usize| {
            bytes(f.get(i))
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_default()
        };
        let state = text(0);
        let held = text(1);
        let lease = int(f.get(5)).map(from_epoch_millis);
        let status = int(f.get(6)).and_then(|s| u16::try_from(s).ok());
        let completed = state == "completed";
        RecordInfo::from_parts(
            key,
            &state,
            (!held.is_empty()).then_some(held.as_str()),
            int(f.get(2)).unwrap_or(0),
            [int(f.get(3)), int(f.get(4)), int(f.get(8))]
                .map(|t| from_epoch_millis(t.unwrap_or(0))),
            lease.filter(|_| state == "in_flight" || state == "inquiring"),
            status.filter(|_| completed),
            int(f.get(7))
                .and_then(|n| u64::try_from(n).ok())
                .filter(|_| completed),
        )
        .map(|info| {
            let asked = u32::try_from(int(f.get(9)).unwrap_or(0)).unwrap_or(0);
            Some(info.with_inquiry(asked, int(f.get(10)).map(from_epoch_millis)))
        })
        .ok_or_else(|| corrupt(&format!("a record in unknown state {state:?}")))
    }

    async fn recorded(&self, key: &RecordKey) -> Result<Option<StoredResponse>, StoreError> {
        let record = self.layout.record_key(key);
        let record = &record;
        let fields: Vec<Option<Vec<u8>>> = self
            .bounded(|mut conn| async move {
                redis::cmd("HMGET")
                    .arg(&record[..])
                    .arg(&["state", "status", "headers", "body"][..])
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        let [state, status, headers, body]: [Option<Vec<u8>>; 4] = fields
            .try_into()
            .map_err(|_| corrupt("an HMGET reply of the wrong length"))?;
        if state.as_deref() != Some(b"completed") {
            return Ok(None);
        }
        let status = status
            .and_then(|s| String::from_utf8(s).ok())
            .and_then(|s| s.parse().ok());
        let headers = headers.unwrap_or_default();
        StoredResponse::from_fields(status, &headers, body.unwrap_or_default()).map(Some)
    }

    async fn list(
        &self,
        route: &str,
        state: RecordState,
        limit: usize,
    ) -> Result<Vec<RecordInfo>, StoreError> {
        // The whole route is scanned (on a cluster, on every primary): the
        // least recently changed records may be anywhere in it. At most
        // 2 × limit are kept in memory.
        let mut found = Vec::new();
        let mut scan = self.scan_route(route).await?;
        while let Some(keys) = scan.next(self).await? {
            for redis_key in keys {
                let Some(key) = self.layout.parse_record_key(route, &redis_key) else {
                    continue;
                };
                if let Some(info) = self.inspect(&key).await?
                    && info.state == state
                {
                    found.push(info);
                    if found.len() > limit.saturating_mul(2).max(64) {
                        least_recent_first(&mut found, limit);
                    }
                }
            }
        }
        least_recent_first(&mut found, limit);
        Ok(found)
    }

    async fn clear(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        self.clear_script(key, force, false).await
    }

    async fn delete(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        self.clear_script(key, force, true).await
    }

    #[cfg(feature = "test-hooks")]
    async fn age(&self, key: &RecordKey, by: Duration) -> Result<bool, StoreError> {
        let record = self.layout.record_key(key);
        let sets = self.layout.sets(key);
        let (record, sets) = (&record, &sets);
        let n: i64 = self
            .bounded(|mut conn| async move {
                super::scripts::AGE
                    .key(&record[..])
                    .key(&sets.due)
                    .key(&sets.inquiring)
                    .arg(super::millis(by))
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(n == 1)
    }

    async fn sweep(&self, _batch: usize) -> Result<Swept, StoreError> {
        // Retention is the keys' TTL: Redis expires records by itself. The
        // pass looks for records lost wholesale instead (a flush closes no
        // connection, so a new one would not see it).
        self.look_for_lost_records().await?;
        Ok(Swept::default())
    }

    fn data_losses(&self) -> Option<u64> {
        self.dataset.losses()
    }

    fn pool_stats(&self) -> Option<PoolStats> {
        // Multiplexed: an open connection is never busy, so all are idle.
        let open = self.lanes.open() as u64;
        Some(PoolStats {
            connections: open,
            idle: open,
            max: self.lanes.count() as u64,
        })
    }

    async fn open_serving_thread(&self, _threads: usize) {
        // (A cluster's serving threads share its lanes: nothing to open.)
        if !self.lanes.per_thread() {
            return;
        }
        // A PING opens this thread's lane (bounded by `timeout`).
        if let Err(error) = self.ping().await {
            tracing::debug!(%error, "a serving thread's Redis connection will open at its first request");
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        if !self.layout.cluster {
            return self
                .bounded(|mut conn| async move {
                    redis::cmd("PING").query_async::<String>(&mut conn).await
                })
                .await
                .map(|_| ());
        }
        // Every primary must answer and see the whole cluster working.
        for node in self.scan_nodes().await? {
            let info: String = self
                .bounded(|mut conn| async move {
                    let mut info = redis::cmd("CLUSTER");
                    info.arg("INFO");
                    conn.query_node(info, node.as_ref()).await
                })
                .await?;
            if !info.lines().any(|line| line.trim() == "cluster_state:ok") {
                let state = info
                    .lines()
                    .find(|line| line.starts_with("cluster_state:"))
                    .unwrap_or("no cluster_state")
                    .trim();
                return Err(StoreError::Unavailable(format!(
                    "a cluster node reports {state}"
                )));
            }
        }
        Ok(())
    }
}
