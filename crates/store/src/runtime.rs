//! A store's runtime: the one it was opened on (the process's shared one),
//! where its connections are opened and its own tasks run, whoever asks.
//!
//! With `server_threads`, requests run on serving threads, each with a
//! current-thread runtime of its own. A connection opened from one of them
//! would have its socket (and, for Redis, its driver task) on that
//! thread's runtime: every other thread's operations on it would depend on
//! that thread being free, and it would die with that runtime at shutdown,
//! while the admin listener and the sweeper still use the store. (The
//! deliberate exceptions: a serving thread's own Redis lane and its own
//! PostgreSQL batcher and pool, used only by that thread's requests and
//! ending with its runtime: crates/store/src/redis/lanes.rs,
//! crates/store/src/postgres/lanes.rs.)

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::runtime::Handle;
use tokio::task::JoinError;

thread_local! {
    /// This thread is a serving thread (src/serving_threads.rs).
    static SERVING: Cell<bool> = const { Cell::new(false) };
    /// A serving thread's own lanes, by the id of the store they belong
    /// to, newest last ([`serving_lane`]).
    static LANES: RefCell<Vec<(u64, Rc<dyn Any>)>> = const { RefCell::new(Vec::new()) };
}

/// Ids that tell stores' lanes apart in a serving thread's registry.
static NEXT_LANE_ID: AtomicU64 = AtomicU64::new(1);

/// Most stores one serving thread keeps a lane of its own for (one in a
/// gateway; tests open more): the oldest beyond is let go.
const LANES_PER_THREAD: usize = 8;

/// A new store's id for [`serving_lane`] and [`keep_serving_lane`].
pub(crate) fn new_lane_id() -> u64 {
    NEXT_LANE_ID.fetch_add(1, Ordering::Relaxed)
}

/// Store `id`'s lane on this serving thread: the one kept, else what
/// `make` gives (kept from now on); `None` off serving threads, or when
/// there is none and `make` gives none.
pub(crate) fn serving_lane<T: Clone + 'static>(
    id: u64,
    make: impl FnOnce() -> Option<T>,
) -> Option<T> {
    if !on_serving_thread() {
        return None;
    }
    let kept = LANES.with_borrow(|lanes| {
        lanes
            .iter()
            .rev()
            .find(|(kept, _)| *kept == id)
            .and_then(|(_, lane)| lane.downcast_ref::<T>().cloned())
    });
    kept.or_else(|| {
        let lane = make()?;
        keep_serving_lane(id, lane.clone());
        Some(lane)
    })
}

/// Keep `lane` as store `id`'s on this serving thread, replacing any
/// (nothing is kept off serving threads).
pub(crate) fn keep_serving_lane<T: 'static>(id: u64, lane: T) {
    if !on_serving_thread() {
        return;
    }
    LANES.with_borrow_mut(|lanes| {
        lanes.retain(|(kept, _)| *kept != id);
        if lanes.len() >= LANES_PER_THREAD {
            lanes.remove(0);
        }
        lanes.push((id, Rc::new(lane)));
    });
}

/// Called by a serving thread before its runtime runs: this thread serves
/// connections on a runtime of its own until it ends. (A store may keep a
/// connection of the thread's own for it: the Redis store's lanes.)
pub fn enter_serving_thread() {
    SERVING.set(true);
}

/// Whether this is a serving thread.
pub fn on_serving_thread() -> bool {
    SERVING.get()
}

/// The runtime a store was opened on.
#[derive(Debug, Clone)]
pub(crate) struct StoreRuntime(Handle);

impl StoreRuntime {
    /// The runtime this is called on (a store's constructor).
    pub(crate) fn here() -> Self {
        Self(Handle::current())
    }

    /// Run `work` on the store's runtime and wait for it (opening a connection).
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, JoinError> {
        self.0.spawn(work).await
    }

    /// Start `work` on the store's runtime, in a task of its own.
    pub(crate) fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        drop(self.0.spawn(work));
    }
}
