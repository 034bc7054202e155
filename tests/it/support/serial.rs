//! Turn-taking inside the one test binary. The chaos harness wants the
//! machine to itself (its lease arithmetic must not be skewed by other tests'
//! load), as it had when every test file was its own binary and `cargo test`
//! ran the binaries one after the other. So it runs [`alone`]: it waits until
//! no other test holds a [`Shared`] turn, and while it runs, tests wait for
//! their first one. Every fixture that starts something real (a store, the
//! upstream, a gateway process, a private server) holds a [`Shared`] turn.
//!
//! This is per process: under `cargo nextest`, which runs each test in a
//! process of its own, it orders nothing.

use std::cell::Cell;
use std::future::Future;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

struct Turns {
    /// Fixtures alive that hold a shared turn.
    shared: usize,
    /// A test runs alone.
    alone: bool,
}

static TURNS: Mutex<Turns> = Mutex::new(Turns {
    shared: 0,
    alone: false,
});
static CHANGED: Condvar = Condvar::new();

thread_local! {
    /// This thread works for the test that runs alone: its fixtures take no
    /// turn (they would wait for themselves).
    static ALONE_HERE: Cell<bool> = const { Cell::new(false) };
}

fn turns() -> MutexGuard<'static, Turns> {
    TURNS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A shared turn, held by a fixture for as long as it lives.
pub struct Shared {
    counted: bool,
}

/// Take a shared turn: waits while a test runs alone, never otherwise (a
/// test may hold several, and one waiting to run alone holds back nobody).
pub fn shared() -> Shared {
    if ALONE_HERE.get() {
        return Shared { counted: false };
    }
    let mut turns = turns();
    while turns.alone {
        turns = CHANGED.wait(turns).unwrap_or_else(PoisonError::into_inner);
    }
    turns.shared += 1;
    Shared { counted: true }
}

/// A turn that holds back nobody: for the servers the whole binary shares
/// ([`super::provision`]), which live as long as it does.
pub fn none() -> Shared {
    Shared { counted: false }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.counted {
            turns().shared -= 1;
            CHANGED.notify_all();
        }
    }
}

/// Ends a run alone, panics included.
struct Alone;

impl Drop for Alone {
    fn drop(&mut self) {
        ALONE_HERE.set(false);
        turns().alone = false;
        CHANGED.notify_all();
    }
}

/// Run `test` on a two-worker multi-thread runtime once no other test holds
/// a turn, holding back every other test until it is done.
pub fn alone<F: Future<Output = ()>>(test: impl FnOnce() -> F) {
    let _alone = {
        let mut turns = turns();
        while turns.alone || turns.shared > 0 {
            turns = CHANGED.wait(turns).unwrap_or_else(PoisonError::into_inner);
        }
        turns.alone = true;
        Alone
    };
    ALONE_HERE.set(true);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(|| ALONE_HERE.set(true))
        .build()
        .expect("a tokio runtime");
    runtime.block_on(test());
}
