//! In-flight markers written late and in batches, off the request's path.
//!
//! A marker lets the front answer `409` to a duplicate of a long request
//! without a PostgreSQL round trip. Most attempts settle within a few
//! milliseconds, before any duplicate arrives, and a marker for them
//! would be two Redis writes (the marker, then the settled record in its
//! place) that nobody reads. So a claimed attempt waits here for
//! `[store.front] mark_after`; one task marks every attempt still
//! unsettled by then, many in one script, and an attempt that settles
//! first is taken out of the queue and never marked (a duplicate that
//! arrives meanwhile goes to PostgreSQL, which answers `409` itself).
//!
//! Ordering: an attempt that settles or is released while its marker is
//! being written waits for that write ([`Marks::settle`]), so a marker
//! never lands after its attempt's settled record or fence.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::Inner;
use crate::Fingerprint;
use crate::redis::front::Mark;
use crate::{RecordKey, Token};

/// Most attempts waiting for their marker. Past it, an attempt is marked
/// on its path, before the request is forwarded.
const MAX_WAITING: usize = 65_536;
/// Most markers written by one script.
const MARK_BATCH: usize = 512;
/// The task wakes at most this often while attempts wait (at least): a
/// marker may come up to this much later than `mark_after`.
const FINEST_TICK: Duration = Duration::from_millis(1);
/// An idle task looks whether its store is gone this often.
const IDLE: Duration = Duration::from_secs(1);

/// An attempt waiting for its marker.
#[derive(Debug, Clone)]
pub(super) struct Waiting {
    /// The record.
    pub key: RecordKey,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// When its marker would end (ms since the epoch): its lease's end.
    pub until_ms: i64,
    /// When its record expires at the earliest (ms since the epoch); none
    /// when the front cannot tell (a takeover).
    pub expires_ms: Option<i64>,
}

impl Waiting {
    /// Attempt `token`'s marker.
    pub(super) fn mark(&self, token: Token) -> Mark<'_> {
        Mark {
            key: &self.key,
            token,
            fingerprint: &self.fingerprint,
            until_ms: self.until_ms,
            expires_ms: self.expires_ms,
        }
    }
}

/// The queue of attempts waiting for their markers.
pub(super) struct Marks {
    state: Mutex<State>,
    /// A first attempt joined an empty queue.
    wake: Notify,
    /// Batches finished so far (settling attempts wait on it).
    done: watch::Sender<u64>,
    /// `[store.front] mark_after`.
    delay: Duration,
    /// How often the task wakes while attempts wait.
    tick: Duration,
    /// Held by the task from taking a batch until it is written, so that
    /// [`Marks::age`] can keep markers from being written meanwhile.
    writing: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    waiting: HashMap<Token, Waiting>,
    /// Tokens in claim order, with the moment each is due; settled ones
    /// stay until they come up and are skipped.
    due: VecDeque<(Instant, Token)>,
    /// The batch being written.
    marking: HashSet<Token>,
    batches: u64,
}

impl Marks {
    pub(super) fn new(delay: Duration) -> Self {
        Self {
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            done: watch::Sender::new(0),
            delay,
            tick: (delay / 2).max(FINEST_TICK),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue attempt `token`'s marker; gives it back if the queue is full.
    pub(super) fn queue(&self, token: Token, waiting: Waiting) -> Option<Waiting> {
        let was_empty = {
            let mut state = self.state();
            if state.waiting.len() >= MAX_WAITING {
                return Some(waiting);
            }
            if state.due.len() >= 2 * MAX_WAITING {
                // Settled attempts' places, not yet come up: drop them.
                let State { waiting, due, .. } = &mut *state;
                due.retain(|(_, token)| waiting.contains_key(token));
            }
            state.waiting.insert(token, waiting);
            state.due.push_back((Instant::now() + self.delay, token));
            state.due.len() == 1
        };
        if was_empty {
            self.wake.notify_one();
        }
        None
    }

    /// Attempt `token` settles or is released. `Some`: it was never marked
    /// (and now never will be); `None`: it was, or may have been (its
    /// marker write, if under way, has finished by the time this returns),
    /// or it was never queued.
    pub(super) async fn settle(&self, token: Token) -> Option<Waiting> {
        let batch = {
            let mut state = self.state();
            if let Some(waiting) = state.waiting.remove(&token) {
                return Some(waiting);
            }
            self.batch_of(&state, token)
        };
        self.written(batch).await;
        None
    }

    /// Attempt `token` renewed its lease: `true` if its marker is still
    /// waiting (it will end at `until_ms`: nothing to write now); else its
    /// marker, if being written, has landed or failed when this returns
    /// (so that the renewal's own write comes after it).
    pub(super) async fn renew(&self, token: Token, until_ms: i64) -> bool {
        let batch = {
            let mut state = self.state();
            if let Some(waiting) = state.waiting.get_mut(&token) {
                waiting.until_ms = until_ms;
                return true;
            }
            self.batch_of(&state, token)
        };
        self.written(batch).await;
        false
    }

    /// Test builds only (`StoreAdmin::age`): the markers still waiting for
    /// `key` end `by_ms` earlier. None is being written when this returns,
    /// and none is until the guard it returns is dropped: the caller ages
    /// what the front holds meanwhile, and each marker is aged once, here
    /// or there.
    #[cfg(feature = "test-hooks")]
    pub(super) async fn age(&self, key: &RecordKey, by_ms: i64) -> tokio::sync::MutexGuard<'_, ()> {
        let writing = self.writing.lock().await;
        for waiting in self.state().waiting.values_mut() {
            if waiting.key == *key {
                waiting.until_ms -= by_ms;
                waiting.expires_ms = waiting.expires_ms.map(|at| at - by_ms);
            }
        }
        writing
    }

    /// If `token`'s marker is being written: a receiver of the batch count
    /// and the count that batch will end (read under the lock).
    fn batch_of(&self, state: &State, token: Token) -> Option<(watch::Receiver<u64>, u64)> {
        state
            .marking
            .contains(&token)
            .then(|| (self.done.subscribe(), state.batches))
    }

    /// Wait until the batch [`Self::batch_of`] found has been written
    /// (within the front's timeout; a dropped store writes nothing more).
    async fn written(&self, batch: Option<(watch::Receiver<u64>, u64)>) {
        if let Some((mut done, seen)) = batch {
            let _ = done.wait_for(|batches| *batches > seen).await;
        }
    }

    /// Take the attempts due by `now` (at most [`MARK_BATCH`]), now being
    /// marked; and when the next one is due.
    fn take_due(&self, now: Instant) -> (Vec<(Token, Waiting)>, Option<Instant>) {
        let mut state = self.state();
        let mut batch = Vec::new();
        while batch.len() < MARK_BATCH {
            match state.due.front() {
                Some(&(due, token)) if due <= now => {
                    state.due.pop_front();
                    if let Some(waiting) = state.waiting.remove(&token) {
                        state.marking.insert(token);
                        batch.push((token, waiting));
                    }
                }
                _ => break,
            }
        }
        let next = state.due.front().map(|&(due, _)| due);
        (batch, next)
    }

    /// The batch taken last has been written (or failed).
    fn finished(&self) {
        let mut state = self.state();
        state.marking.clear();
        state.batches += 1;
        self.done.send_replace(state.batches);
    }
}

/// The marker task: writes the markers that come due until the store is
/// dropped.
pub(super) async fn run(inner: Weak<Inner>, marks: Arc<Marks>) {
    loop {
        let writing = marks.writing.lock().await;
        let (batch, next) = marks.take_due(Instant::now());
        if !batch.is_empty() {
            // Finished however the write ends, so no settling attempt
            // waits for it forever.
            let _finished = Finished(&marks);
            let Some(store) = inner.upgrade() else { return };
            write(&store, &batch).await;
            continue;
        }
        drop(writing);
        match next {
            // Wake at most every tick: the markers due by then go together.
            Some(due) => tokio::time::sleep_until(due.max(Instant::now() + marks.tick)).await,
            None => {
                if inner.strong_count() == 0 {
                    return;
                }
                let _ = tokio::time::timeout(IDLE, marks.wake.notified()).await;
            }
        }
    }
}

/// Marks the batch taken last as finished when dropped.
struct Finished<'a>(&'a Marks);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.finished();
    }
}

/// Write one batch of markers, unless the front went down meanwhile.
async fn write(store: &Inner, batch: &[(Token, Waiting)]) {
    if batch.iter().any(|(_, w)| mark_delayed(&w.key)) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if !store.health.usable() {
        return;
    }
    let marks: Vec<Mark<'_>> = batch.iter().map(|(token, w)| w.mark(*token)).collect();
    store.mark(&marks).await;
}

/// Test builds only: the `front-mark-delay` failpoint, armed with
/// `return(PREFIX)`, holds back a batch with a key starting with it for
/// 200 ms (tests/it/stores/front.rs: their attempts settle meanwhile, and must
/// wait for it). Always false without the `failpoints` feature.
fn mark_delayed(key: &RecordKey) -> bool {
    fail::fail_point!("front-mark-delay", |armed: Option<String>| {
        armed.is_some_and(|prefix| key.key.starts_with(&prefix))
    });
    let _ = key; // used only by the failpoint
    false
}
