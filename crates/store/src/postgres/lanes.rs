//! Serving threads' own batchers ("lanes") for the PostgreSQL store.
//!
//! The store's pool and batch dispatcher live on the shared runtime
//! (crates/store/src/runtime.rs). A claim or completion made on a serving thread
//! would cross to that runtime twice: to the dispatcher, and back with the
//! answer, each crossing waking a thread (new keys ran 0.88× as fast with
//! serving threads as without them, `bench/results/2026-11-26-hot-path.md`).
//! So each serving thread gets a dispatcher and a small pool of its own,
//! opened and driven on its runtime: its requests' batches never leave
//! the thread. It sends `batches_in_flight / server_threads` batches at
//! once (at least one) and keeps as many connections, each batch holding
//! one: a gateway opens at most `pool_size` shared connections and about
//! `max(batches_in_flight, server_threads)` more. A lane whose dispatcher
//! has ended is passed over for the shared one. Everything
//! else (renewals, releases, holds, the sweeper, the admin listener, the
//! lost-claims worker) stays on the shared pool.

use super::batch::Batcher;
use crate::runtime;

/// Store `id`'s lane on this thread, if this is a serving thread that
/// opened one.
pub(super) fn local(id: u64) -> Option<Batcher> {
    runtime::serving_lane(id, || None)
}

/// One lane's share of a setting shared by `threads` serving threads.
pub(super) fn share(total: u32, threads: usize) -> usize {
    (total as usize / threads.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::hosts::Hosts;
    use super::super::pool::PgPool;
    use super::*;

    /// A batcher whose pool has not connected (nor will: nothing is sent).
    fn idle_batcher() -> Batcher {
        let hosts = Hosts::parse("postgres://u@127.0.0.1:1/db", |o| o).expect("a URL");
        let timeout = Duration::from_millis(100);
        Batcher::start(
            PgPool::new(Arc::new(hosts), 1, timeout),
            timeout,
            timeout,
            1,
        )
    }

    /// Run `work` on a thread of its own with a current-thread runtime, a
    /// serving thread or not.
    fn on_thread<T: Send + 'static>(serving: bool, work: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            if serving {
                runtime::enter_serving_thread();
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let _entered = rt.enter();
            work()
        })
        .join()
        .expect("the thread ends")
    }

    #[test]
    fn a_lane_serves_only_the_serving_thread_that_kept_it() {
        let (id, other) = (runtime::new_lane_id(), runtime::new_lane_id());
        let seen = on_thread(true, move || {
            let before = local(id).is_some();
            runtime::keep_serving_lane(id, idle_batcher());
            (before, local(id).is_some(), local(other).is_some())
        });
        assert_eq!(seen, (false, true, false), "(before, after, another store)");
        assert!(
            !on_thread(true, move || local(id).is_some()),
            "another serving thread has no lane of it"
        );
        let off = on_thread(false, move || {
            runtime::keep_serving_lane(id, idle_batcher());
            local(id).is_some()
        });
        assert!(
            !off,
            "a thread that does not serve uses the shared dispatcher"
        );
    }

    #[test]
    fn a_share_is_at_least_one() {
        assert_eq!(share(16, 2), 8);
        assert_eq!(share(16, 3), 5);
        assert_eq!(share(1, 4), 1);
        assert_eq!(share(4, 0), 4);
    }
}
