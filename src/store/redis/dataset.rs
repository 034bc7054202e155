//! Noticing that the Redis server lost idemgate's records: a failover to a
//! server that came back empty, a restart without persistence, a flush.
//! Nothing can bring the records back, and a retry of a key acknowledged
//! before is forwarded again; but the operator must hear of it at once,
//! not from a customer charged twice.
//!
//! The store keeps one marker key, `{prefix}dataset`, without a TTL, whose
//! value is a random id set once. Every new connection reads it (setting
//! it if it is absent) and compares it with the id this instance saw last:
//! another id means the data this instance wrote is gone. Each instance
//! reports a loss once, as an error in its log and in
//! `idemgate_store_data_lost_total`.
//!
//! What it does not see: a loss while no instance was connected to compare
//! (an instance started afterwards has nothing to compare with), and a
//! partial loss (a failover to a replica that missed the last writes keeps
//! the marker; `[store] replicas` is what guards those). One server, or
//! the primary Sentinel names: a cluster's primaries lose their slots one
//! at a time (not checked), and a front's Redis is rebuilt from PostgreSQL.

use std::sync::LazyLock;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use deadpool_redis::redis::{self, Script};

use super::RedisStore;
use crate::store::{StoreError, redact_url};

/// KEYS = the marker; ARGV = an id to set if it is absent. Its id, set now
/// if it was absent (one script: two instances finding it absent at once
/// agree on one id).
static MARK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local seen = redis.call('GET', KEYS[1])
if seen then return seen end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]",
    )
});

/// What one instance knows of the records it writes to.
#[derive(Debug, Default)]
pub(super) struct Dataset {
    /// Whether to look (one server or Sentinel's primary, not a front).
    watched: AtomicBool,
    /// The marker's id this instance saw last.
    seen: Mutex<Option<String>>,
    /// Losses noticed.
    lost: AtomicU64,
}

impl Dataset {
    /// Look from now on.
    pub(super) fn watch(&self) {
        self.watched.store(true, Ordering::Relaxed);
    }

    /// The marker's id is `id` now: whether that is a loss (another id than
    /// the last one seen), counted once however many connections see it.
    fn saw(&self, id: String) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let lost = seen.as_ref().is_some_and(|before| *before != id);
        if lost {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
        *seen = Some(id);
        lost
    }
}

impl RedisStore {
    /// On a new connection: read (or set) the marker, and report a loss.
    pub(super) async fn check_dataset(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> Result<(), StoreError> {
        if !self.dataset.watched.load(Ordering::Relaxed) {
            return Ok(());
        }
        let id = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let id: String = MARK
            .key(self.layout.dataset_key())
            .arg(id)
            .invoke_async(conn)
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        if self.dataset.saw(id) {
            tracing::error!(
                store = %redact_url(&self.url),
                "the Redis server lost idemgate's records since this instance last connected \
                 (a failover to a server that came back empty, a restart without persistence, \
                 or a flush): every key acknowledged before is forgotten, and its retry is \
                 forwarded to the upstream again. Give Redis persistence and replicas \
                 ([store] replicas), and let no server without its data become the primary"
            );
        }
        Ok(())
    }

    /// Losses of the records noticed (`None` when not looked for).
    pub(super) fn data_losses(&self) -> Option<u64> {
        self.dataset
            .watched
            .load(Ordering::Relaxed)
            .then(|| self.dataset.lost.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_another_id_than_the_last_seen_is_a_loss_and_counted_once() {
        let dataset = Dataset::default();
        assert!(!dataset.saw("a".into()), "the first id is no loss");
        assert!(!dataset.saw("a".into()));
        assert!(dataset.saw("b".into()));
        assert!(!dataset.saw("b".into()), "a second connection");
        assert_eq!(dataset.lost.load(Ordering::Relaxed), 1);
    }
}
