//! Noticing that the Redis server lost idemgate's records: a failover to a
//! server that came back empty, a restart without persistence, a flush.
//! Nothing can bring the records back, and a retry of a key acknowledged
//! before is forwarded again; but the operator must hear of it at once,
//! not from a customer charged twice.
//!
//! The store keeps one marker key, `{prefix}dataset`, without a TTL, whose
//! value is a random id set once. Every new connection reads it (setting
//! it if it is absent), and so does every sweeper pass (a flush closes no
//! connection), and compares it with the id this instance saw last:
//! another id means records this instance wrote are gone (all of them, or
//! all since the marker was set: a restart from an older snapshot). Each
//! instance reports each change of id once, as an error in its log and in
//! `idemgate_store_data_lost_total`. Only an observer: a server that
//! refuses the marker (an ACL without the key, a full server) is warned
//! about once and the check skipped, never the store taken down.
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

use deadpool_redis::redis::{self, RedisResult, Script};

use super::{RedisStore, unusable};
use crate::{StoreError, redact_url};

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
    watched: bool,
    /// The marker's id this instance saw last.
    seen: Mutex<Option<String>>,
    /// Losses noticed.
    lost: AtomicU64,
    /// Whether a refused check was warned about.
    warned: AtomicBool,
}

impl Dataset {
    /// One that looks.
    pub(super) fn watched() -> Self {
        Self {
            watched: true,
            ..Self::default()
        }
    }

    /// Losses of the records noticed (`None` when not looked for).
    pub(super) fn losses(&self) -> Option<u64> {
        self.watched.then(|| self.lost.load(Ordering::Relaxed))
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
    /// Fails only when the connection is unusable (a transport failure, a
    /// timeout, a server now a replica).
    pub(super) async fn check_dataset(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> Result<(), StoreError> {
        if !self.dataset.watched {
            return Ok(());
        }
        match self.judge(read_marker(&self.layout.dataset_key(), conn).await) {
            Some(e) => Err(StoreError::Unavailable(e.to_string())),
            None => Ok(()),
        }
    }

    /// The sweeper's pass: the marker read on a lane, a loss reported.
    pub(super) async fn look_for_lost_records(&self) -> Result<(), StoreError> {
        if !self.dataset.watched {
            return Ok(());
        }
        let key = self.layout.dataset_key();
        let key = &key;
        let answer = self
            .bounded(|mut conn| async move {
                match read_marker(key, &mut conn).await {
                    // The lane's own failure: `bounded` resets it.
                    Err(e) if unusable(&e) => Err(e),
                    answer => Ok(answer),
                }
            })
            .await?;
        self.judge(answer);
        Ok(())
    }

    /// Take the marker's `answer`: a loss is reported, a refusal warned
    /// about once; an error that leaves the connection unusable is
    /// returned.
    fn judge(&self, answer: RedisResult<String>) -> Option<redis::RedisError> {
        match answer {
            Ok(id) => {
                if self.dataset.saw(id) {
                    tracing::error!(
                        store = %redact_url(&self.url),
                        "the Redis server lost idemgate's records since this instance last \
                         connected: its marker key is gone (a failover to a server that came \
                         back empty, a restart without persistence or from an older snapshot, \
                         a flush). Keys acknowledged before are forgotten, and their retries \
                         are forwarded to the upstream again. Give Redis persistence and \
                         replicas ([store] replicas), and let no server without its data \
                         become the primary"
                    );
                }
                None
            }
            Err(e) if unusable(&e) => Some(e),
            Err(e) => {
                if !self.dataset.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        store = %redact_url(&self.url),
                        key = %self.layout.dataset_key(),
                        error = %e,
                        "cannot look for lost records: Redis refused the marker key (allow \
                         the gateway's user GET and SET on it, and EVALSHA)"
                    );
                }
                None
            }
        }
    }
}

/// The marker's id, set now if it was absent.
async fn read_marker(key: &str, conn: &mut impl redis::aio::ConnectionLike) -> RedisResult<String> {
    let id = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    MARK.key(key).arg(id).invoke_async(conn).await
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
