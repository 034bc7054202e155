//! The Redis store's connections ("lanes").

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::conn::Conn;

/// `pool_size` multiplexed connections (to one server, or each to every
/// node of a cluster), each carrying many concurrent operations (pipelined
/// by the redis crate), used round-robin.
///
/// deadpool-redis recycles a connection on every `get()` with an `UNWATCH` +
/// `PING` round trip, which doubled the round trips of every operation. A
/// lane instead keeps its connection (made by the pool, then taken out of
/// it) until an operation fails at the transport or times out; then every
/// lane forgets its connection, and the next operation on a lane makes a
/// new one.
pub(super) struct Lanes {
    /// Each lane's connection and the generation it was opened in.
    pub(super) slots: Vec<Mutex<Option<(Conn, u64)>>>,
    /// Bumped by each reset; a failure resets only if its connection is of
    /// the current generation, so the late failures of connections already
    /// forgotten cannot throw away their replacements.
    pub(super) generation: AtomicU64,
    /// One connect at a time per lane: after a reset, the operations that
    /// find a lane empty wait for its one new connection instead of each
    /// opening their own (at most `pool_size` connects, however many
    /// requests are in flight).
    pub(super) connecting: Vec<tokio::sync::Mutex<()>>,
    next: AtomicUsize,
}

impl Lanes {
    pub(super) fn new(count: usize) -> Self {
        let count = count.max(1);
        Self {
            slots: (0..count).map(|_| Mutex::new(None)).collect(),
            connecting: (0..count).map(|_| tokio::sync::Mutex::new(())).collect(),
            generation: AtomicU64::new(0),
            next: AtomicUsize::new(0),
        }
    }

    /// The next lane, its connection if it has one, and the generation an
    /// operation on it belongs to.
    pub(super) fn pick(&self) -> (usize, Option<Conn>, u64) {
        let lane = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        match self.slot(lane).clone() {
            Some((conn, generation)) => (lane, Some(conn), generation),
            None => (lane, None, self.generation.load(Ordering::SeqCst)),
        }
    }

    pub(super) fn slot(&self, lane: usize) -> std::sync::MutexGuard<'_, Option<(Conn, u64)>> {
        // A panic while holding this lock cannot leave the Option invalid.
        self.slots[lane]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forget every lane's connection: when one breaks at the transport
    /// (the server restarted, the network dropped), the others almost
    /// certainly did too, and each would otherwise fail one operation before
    /// being replaced.
    pub(super) fn reset(&self, failed: u64) {
        let current = self.generation.load(Ordering::SeqCst);
        if failed != current
            || self
                .generation
                .compare_exchange(current, current + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return; // already reset since that connection was opened
        }
        for lane in 0..self.slots.len() {
            let mut slot = self.slot(lane);
            if slot.as_ref().is_some_and(|(_, g)| *g <= current) {
                *slot = None;
            }
        }
    }

    pub(super) fn open(&self) -> usize {
        (0..self.slots.len())
            .filter(|&lane| self.slot(lane).is_some())
            .count()
    }
}
