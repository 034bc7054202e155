//! The Redis store's administration: inspecting, listing (a `SCAN` of
//! every primary), clearing and deleting records, readiness and pool
//! figures, and the wake-up relay.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{self, Value};

use super::RedisStore;
use super::conn::{Node, primaries};
use super::layout::Layout;
use super::scripts::{CLEAR, INSPECT, TAKE};
use super::store::{bytes, corrupt, int, millis};
use crate::store::info::from_epoch_millis;
use crate::store::{
    InquiringRoute, Inquiry, PoolStats, RecordInfo, RecordKey, RecordState, StoreAdmin, StoreError,
    Swept,
};
use crate::waiters::{self, Waiters};

/// Keep the `limit` least recently changed records, oldest first.
fn least_recent_first(found: &mut Vec<RecordInfo>, limit: usize) {
    found.sort_by_key(|info| info.updated_at);
    found.truncate(limit);
}

/// Buckets asked at once on a cluster.
const TAKE_CONCURRENCY: usize = 16;

impl RedisStore {
    /// [`TAKE`] on every bucket's due questions (the one set of a single
    /// server): a script may only touch keys of one slot. A cluster's 1,024
    /// buckets are asked [`TAKE_CONCURRENCY`] at a time, each for its share
    /// of what is left of `limit` (so a tick takes at most `limit` plus one
    /// share per concurrent call). A bucket that fails is logged and left
    /// for the next tick; the others' questions are kept.
    async fn take_per_bucket(
        &self,
        routes: &[InquiringRoute],
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Vec<Vec<Value>>>, StoreError> {
        use futures_util::stream::{self, StreamExt};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let sets = self.layout.due_sets();
        let buckets = sets.len();
        let lease = millis(lease).to_string();
        let share = limit.div_ceil(TAKE_CONCURRENCY.min(buckets)).max(1);
        let left = AtomicUsize::new(limit);
        let results: Vec<Result<Vec<Vec<Value>>, StoreError>> = stream::iter(sets)
            .map(|(due, token, tagged)| {
                let (lease, left) = (&lease, &left);
                async move {
                    let asking = left.load(Ordering::Relaxed).min(share);
                    if asking == 0 {
                        return Ok(Vec::new());
                    }
                    let mut args = vec![lease.clone(), asking.to_string()];
                    for route in routes {
                        args.push(Layout::route_start(&tagged, &route.name));
                        args.push(millis(route.retention).to_string());
                    }
                    let reply: Vec<Vec<Value>> = self
                        .bounded(|mut conn| {
                            let mut invocation = TAKE.key(&due);
                            invocation.key(&token).arg(&args);
                            async move { invocation.invoke_async(&mut conn).await }
                        })
                        .await?;
                    let _ = left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                        Some(n.saturating_sub(reply.len()))
                    });
                    Ok(reply)
                }
            })
            .buffer_unordered(TAKE_CONCURRENCY)
            .collect()
            .await;
        let mut replies = Vec::with_capacity(results.len());
        let mut failed = None;
        for result in results {
            match result {
                Ok(reply) => replies.push(reply),
                Err(error) => failed = Some(error),
            }
        }
        match failed {
            Some(error) if replies.is_empty() => Err(error),
            Some(error) => {
                tracing::warn!(%error, "some Redis buckets could not be asked for due inquiries; the next tick asks again");
                Ok(replies)
            }
            None => Ok(replies),
        }
    }

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

    async fn clear_script(
        &self,
        key: &RecordKey,
        force: bool,
        completed_too: bool,
    ) -> Result<bool, StoreError> {
        let record = self.layout.record_key(key);
        let due = self.layout.due_key(key);
        let wake = self.wake_args(key);
        let (wake, due) = (&wake, &due);
        let flag = |b: bool| if b { "1" } else { "0" };
        let n: i64 = self
            .bounded(|mut conn| async move {
                CLEAR
                    .key(&record[..])
                    .key(due)
                    .arg(flag(force))
                    .arg(flag(completed_too))
                    .arg(&wake.0)
                    .arg(&wake.1)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(n == 1)
    }
}

#[async_trait::async_trait]
impl StoreAdmin for RedisStore {
    async fn relay_wakeups(&self, waiters: Arc<Waiters>) {
        waiters::relay(|| self.listen(&waiters)).await;
    }

    async fn take_inquiries(
        &self,
        routes: &[InquiringRoute],
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Inquiry>, StoreError> {
        let replies = self.take_per_bucket(routes, lease, limit).await?;
        let mut taken = Vec::new();
        for row in replies.into_iter().flatten() {
            let name =
                bytes(row.first()).ok_or_else(|| corrupt("a taken question without a key"))?;
            let key = routes
                .iter()
                .find_map(|route| self.layout.parse_record_key(&route.name, &name))
                .ok_or_else(|| corrupt("a taken question of no inquiring route"))?;
            taken.push(Inquiry {
                key,
                token: int(row.get(1))
                    .ok_or_else(|| corrupt("a taken question without a token"))?,
                asked: u32::try_from(int(row.get(2)).unwrap_or(0)).unwrap_or(0),
                inquiring_for: Duration::from_millis(
                    u64::try_from(int(row.get(3)).unwrap_or(0)).unwrap_or(0),
                ),
            });
        }
        Ok(taken)
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

    async fn list(
        &self,
        route: &str,
        state: RecordState,
        limit: usize,
    ) -> Result<Vec<RecordInfo>, StoreError> {
        let pattern = self.layout.route_pattern(route);
        // The whole route is scanned (on a cluster, on every primary): the
        // least recently changed records may be anywhere in it. At most
        // 2 × limit are kept in memory.
        let mut found = Vec::new();
        for node in self.scan_nodes().await? {
            let mut cursor = 0u64;
            loop {
                let (pattern, node) = (pattern.clone(), node.as_ref());
                let (next, keys): (u64, Vec<Vec<u8>>) = self
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
                cursor = next;
                if cursor == 0 {
                    break;
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
