//! The Redis store's connections ("lanes").

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::conn::Conn;
use crate::runtime;

/// One connection, opened on first use and kept until an operation on it
/// fails at the transport or times out.
#[derive(Default)]
pub(super) struct Lane {
    /// The connection and the generation it was opened in.
    slot: Mutex<Option<(Conn, u64)>>,
    /// One connect at a time: after a reset, the operations that find the
    /// lane empty wait for its one new connection instead of each opening
    /// their own.
    pub(super) connecting: tokio::sync::Mutex<()>,
}

impl Lane {
    pub(super) fn slot(&self) -> MutexGuard<'_, Option<(Conn, u64)>> {
        // A panic while holding this lock cannot leave the Option invalid.
        self.slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Its connection, if it has one opened in `generation` or later.
    pub(super) fn current(&self, generation: u64) -> Option<(Conn, u64)> {
        self.slot().clone().filter(|(_, g)| *g >= generation)
    }
}

/// The lane an operation runs on.
pub(super) struct Picked {
    pub(super) lane: Arc<Lane>,
    /// Its connection, if it has a current one.
    pub(super) conn: Option<Conn>,
    /// The generation the operation belongs to.
    pub(super) generation: u64,
    /// A serving thread's own lane: connected on that thread's runtime.
    pub(super) local: bool,
}

/// `pool_size` multiplexed connections (to one server, or each to every
/// node of a cluster), each carrying many concurrent operations (pipelined
/// by the redis crate), used round-robin; with `local`, also one of its
/// own for each serving thread.
///
/// deadpool-redis recycles a connection on every `get()` with an `UNWATCH` +
/// `PING` round trip, which doubled the round trips of every operation. A
/// lane instead keeps its connection (made by the pool, then taken out of
/// it) until an operation fails at the transport or times out; then every
/// lane forgets its connection, and the next operation on a lane makes a
/// new one.
///
/// **Serving threads' lanes.** The shared lanes are connected on the
/// store's runtime (crates/store/src/runtime.rs), so an operation a serving
/// thread starts crosses to another thread twice: to the connection's
/// driver task, and back with the answer; when the threads are idle, each
/// crossing wakes a sleeping thread. A serving thread's own lane is
/// connected on its own runtime: its operations and the answers stay on
/// the thread (one round trip to Redis, no wake-up). Only that thread
/// uses it, and it ends with that thread's runtime, after the thread's
/// last request.
pub(super) struct Lanes {
    shared: Vec<Arc<Lane>>,
    /// Bumped by each reset; a failure resets only if its connection is of
    /// the current generation, so the late failures of connections already
    /// forgotten cannot throw away their replacements. A serving thread's
    /// lane opened before the current generation is not used again.
    pub(super) generation: AtomicU64,
    next: AtomicUsize,
    /// In serving threads' registries (0: serving threads use the shared
    /// lanes).
    id: u64,
}

impl Lanes {
    pub(super) fn new(count: usize, local: bool) -> Self {
        let count = count.max(1);
        Self {
            shared: (0..count).map(|_| Arc::new(Lane::default())).collect(),
            generation: AtomicU64::new(0),
            next: AtomicUsize::new(0),
            id: if local { runtime::new_lane_id() } else { 0 },
        }
    }

    /// The lane for an operation started here: this serving thread's own,
    /// or the next shared one.
    pub(super) fn pick(&self) -> Picked {
        let generation = self.generation.load(Ordering::SeqCst);
        let (lane, local) = match self.local_lane() {
            Some(lane) => (lane, true),
            None => {
                let n = self.next.fetch_add(1, Ordering::Relaxed) % self.shared.len();
                (self.shared[n].clone(), false)
            }
        };
        let (conn, generation) = match lane.current(generation) {
            Some((conn, opened)) => (Some(conn), opened),
            None => (None, generation),
        };
        Picked {
            lane,
            conn,
            generation,
            local,
        }
    }

    /// Whether serving threads have lanes of their own here.
    pub(super) fn per_thread(&self) -> bool {
        self.id != 0
    }

    /// This serving thread's lane (made on first use), if it is one and
    /// these lanes have them.
    fn local_lane(&self) -> Option<Arc<Lane>> {
        if !self.per_thread() {
            return None;
        }
        runtime::serving_lane(self.id, || Some(Arc::new(Lane::default())))
    }

    /// Forget every lane's connection: when one breaks at the transport
    /// (the server restarted, the network dropped), the others almost
    /// certainly did too, and each would otherwise fail one operation before
    /// being replaced. (Serving threads' lanes see the new generation at
    /// their next operation.)
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
        for lane in &self.shared {
            let mut slot = lane.slot();
            if slot.as_ref().is_some_and(|(_, g)| *g <= current) {
                *slot = None;
            }
        }
    }

    /// Shared lanes with a connection now.
    pub(super) fn open(&self) -> usize {
        self.shared
            .iter()
            .filter(|lane| lane.slot().is_some())
            .count()
    }

    /// Shared lanes in all.
    pub(super) fn count(&self) -> usize {
        self.shared.len()
    }
}
