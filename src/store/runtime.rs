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
//! ending with its runtime: src/store/redis/lanes.rs,
//! src/store/postgres/lanes.rs.)

use std::cell::Cell;
use std::future::Future;

use tokio::runtime::Handle;
use tokio::task::JoinError;

thread_local! {
    /// This thread is a serving thread (src/server/serving_threads.rs).
    static SERVING: Cell<bool> = const { Cell::new(false) };
}

/// Called by a serving thread before its runtime runs: this thread serves
/// connections on a runtime of its own until it ends. (A store may keep a
/// connection of the thread's own for it: the Redis store's lanes.)
pub(crate) fn enter_serving_thread() {
    SERVING.set(true);
}

/// Whether this is a serving thread.
pub(crate) fn on_serving_thread() -> bool {
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
