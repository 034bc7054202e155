//! Requests waiting for a key to settle (`concurrent = "wait"`,
//! docs/src/design/decisions.md), woken by the store rather than by
//! polling: the store announces a
//! record leaving `in_flight` (PostgreSQL `NOTIFY` from the settling
//! statement and Redis `PUBLISH` from the settling script, on waiting routes
//! only; the memory store directly), a relay task per
//! instance hands each announcement to [`Waiters::wake`], and every waiter on
//! that key re-claims it. Waiters on other instances are woken the same way.
//!
//! An announcement names a key by its [`WakeId`], the SHA-256 of the record
//! key, computed by the gateway that settles the record. A relay that lost
//! its connection wakes everyone ([`Waiters::wake_all`]): announcements sent
//! meanwhile are lost, and a waiter woken for nothing just re-claims and
//! waits again.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;

pub use idemgate_core::{WakeId, wake_id};

/// Parse a hex announcement (the wire form of a [`WakeId`]).
pub fn parse_wake_id(text: &str) -> Option<WakeId> {
    let bytes = hex::decode(text.trim()).ok()?;
    bytes.try_into().ok()
}

/// The pauses between a relay's reconnection attempts.
const RELAY_PAUSE_MIN: Duration = Duration::from_millis(100);
const RELAY_PAUSE_MAX: Duration = Duration::from_secs(5);

/// A listening connection that lived this long was healthy: the next
/// reconnection starts again from the shortest pause.
const RELAY_HEALTHY: Duration = Duration::from_secs(10);

/// Run a store's announcement listener forever: `listen` connects, wakes
/// every waiter once it listens (announcements sent while it did not are
/// lost), hands announcements to `waiters`, and returns when its connection
/// is lost (`Ok`) or cannot be made (`Err`). Between attempts the relay
/// pauses, backing off unless the connection had lived [`RELAY_HEALTHY`],
/// so a connection that keeps dropping cannot make every waiter claim again
/// ten times a second.
pub async fn relay<F, Fut, E>(mut listen: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut pause = RELAY_PAUSE_MIN;
    loop {
        let started = tokio::time::Instant::now();
        match listen().await {
            Ok(()) => {
                tracing::warn!("store wake-up listener lost its connection; reconnecting");
                if started.elapsed() >= RELAY_HEALTHY {
                    pause = RELAY_PAUSE_MIN;
                }
            }
            Err(error) => {
                tracing::warn!(%error, "store wake-up listener cannot connect; retrying");
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RELAY_PAUSE_MAX);
    }
}

/// The waiters of one instance, by key.
#[derive(Debug, Default)]
pub struct Waiters {
    by_key: Mutex<HashMap<WakeId, Weak<Notify>>>,
}

impl Waiters {
    /// A shared, empty registry.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The signal for `id`'s waiters. Enable its `notified()` before
    /// claiming, so an announcement between the claim and the wait is kept.
    pub fn register(&self, id: WakeId) -> Arc<Notify> {
        let mut by_key = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(notify) = by_key.get(&id).and_then(Weak::upgrade) {
            return notify;
        }
        // Drop the entries of keys nobody waits for any more, now and then.
        if by_key.len() >= 1024 && by_key.len().is_power_of_two() {
            by_key.retain(|_, waiters| waiters.strong_count() > 0);
        }
        let notify = Arc::new(Notify::new());
        by_key.insert(id, Arc::downgrade(&notify));
        notify
    }

    /// A key's record left `in_flight`: wake its waiters.
    pub fn wake(&self, id: &WakeId) {
        let mut by_key = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        match by_key.get(id).map(Weak::upgrade) {
            Some(Some(notify)) => notify.notify_waiters(),
            Some(None) => {
                by_key.remove(id);
            }
            None => {}
        }
    }

    /// Announcements may have been lost: wake every waiter.
    pub fn wake_all(&self) {
        let by_key = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        for notify in by_key.values().filter_map(Weak::upgrade) {
            notify.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_ids_are_framed() {
        assert_ne!(wake_id("ab", b"", "c"), wake_id("a", b"", "bc"));
        assert_ne!(wake_id("a", b"x", "c"), wake_id("a", b"", "xc"));
        let id = wake_id("payments", b"", "k1");
        assert_eq!(parse_wake_id(&hex::encode(id)), Some(id));
        assert_eq!(parse_wake_id("zz"), None);
        assert_eq!(parse_wake_id("abcd"), None);
    }

    #[tokio::test]
    async fn a_wake_reaches_every_enabled_waiter_of_that_key_only() {
        let waiters = Waiters::new();
        let (a, b) = ([1; 32], [2; 32]);
        let on_a = waiters.register(a);
        let again_a = waiters.register(a);
        let on_b = waiters.register(b);
        {
            let first = on_a.notified();
            let second = again_a.notified();
            let other = on_b.notified();
            tokio::pin!(first, second, other);
            first.as_mut().enable();
            second.as_mut().enable();
            other.as_mut().enable();
            waiters.wake(&a);
            first.await;
            second.await;
            assert!(
                tokio::time::timeout(std::time::Duration::from_millis(50), other)
                    .await
                    .is_err(),
                "b was not woken"
            );
        }
        drop((on_a, again_a));
        // Nobody waits on `a` any more: its entry goes at the next wake.
        waiters.wake(&a);
        assert!(!waiters.by_key.lock().unwrap().contains_key(&a));
        waiters.wake_all();
    }
}
