//! Settled records of attempts that were never marked, shown in the front
//! off the request's path and many in one script.
//!
//! An attempt that settled before its marker came due ([`super::marks`])
//! has nothing in the front to replace, so its caller need not wait for a
//! Redis write: nothing there can answer `409` for it. Its settled record
//! is queued here, and one task shows the queued records together, each
//! unless the fence covers it or a newer attempt's entry is there (as the
//! relay does). Until then, and if the queue is full, a retry goes to
//! PostgreSQL, which replays it; the record's outbox row brings it to the
//! front in any case.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::Inner;
use crate::Fingerprint;
use crate::redis::front::{Publish, Settled};
use crate::{HeldReason, RecordKey, StoredResponse, Token};

/// Most bytes of bodies and headers queued; past it, records are left to
/// the relay.
const MAX_QUEUED_BYTES: usize = 16 * 1024 * 1024;
/// Most records one pass takes (the front's scripts bound their bytes).
const BATCH_RECORDS: usize = 256;
/// An idle task looks whether its store is gone this often.
const IDLE: Duration = Duration::from_secs(1);

/// A settled state, owned.
#[derive(Debug, Clone)]
pub(super) enum Outcome {
    /// A recorded response.
    Completed(StoredResponse),
    /// A held key.
    Held(HeldReason),
}

impl Outcome {
    /// An owned copy of `settled`.
    pub(super) fn of(settled: Settled<'_>) -> Self {
        match settled {
            Settled::Completed(response) => Self::Completed(response.clone()),
            Settled::Held(reason) => Self::Held(reason),
        }
    }

    /// It, borrowed, to write.
    pub(super) fn settled(&self) -> Settled<'_> {
        match self {
            Self::Completed(response) => Settled::Completed(response),
            Self::Held(reason) => Settled::Held(*reason),
        }
    }
}

/// A settled record waiting to be shown.
#[derive(Debug, Clone)]
pub(super) struct Record {
    pub key: RecordKey,
    pub token: Token,
    pub fingerprint: Fingerprint,
    pub outcome: Outcome,
    /// The end of its retention (ms since the epoch).
    pub until_ms: i64,
}

impl Record {
    fn bytes(&self) -> usize {
        let size = match &self.outcome {
            Outcome::Completed(response) => response.size(),
            Outcome::Held(_) => 0,
        };
        size + self.key.key.len() + self.key.route.len() + self.key.scope.len() + 64
    }
}

/// The queue of records to show.
#[derive(Default)]
pub(super) struct Publisher {
    queue: Mutex<Queue>,
    wake: Notify,
    /// Held by the task from taking a batch until it is written, so that
    /// [`Publisher::age`] sees every record either queued or written.
    writing: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Queue {
    records: Vec<Record>,
    bytes: usize,
}

impl Publisher {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `record`; `false` if the queue is full (the relay shows it).
    pub(super) fn push(&self, record: Record) -> bool {
        let size = record.bytes();
        {
            let mut queue = self.queue();
            if queue.bytes + size > MAX_QUEUED_BYTES {
                return false;
            }
            queue.bytes += size;
            queue.records.push(record);
        }
        self.wake.notify_one();
        true
    }

    /// Test builds only (`StoreAdmin::age`): the records of `key` still to
    /// show end `by_ms` earlier. None is being written when this returns,
    /// and none is until the guard it returns is dropped (as
    /// `Marks::age`).
    #[cfg(feature = "test-hooks")]
    pub(super) async fn age(&self, key: &RecordKey, by_ms: i64) -> tokio::sync::MutexGuard<'_, ()> {
        let writing = self.writing.lock().await;
        for record in &mut self.queue().records {
            if record.key == *key {
                record.until_ms -= by_ms;
            }
        }
        writing
    }

    /// The next batch, oldest first.
    fn take(&self) -> Vec<Record> {
        let mut queue = self.queue();
        let n = queue.records.len().min(BATCH_RECORDS);
        let batch: Vec<Record> = queue.records.drain(..n).collect();
        queue.bytes -= batch.iter().map(Record::bytes).sum::<usize>();
        batch
    }
}

/// The publishing task: shows queued records until the store is dropped.
pub(super) async fn run(inner: Weak<Inner>, publisher: Arc<Publisher>) {
    loop {
        let writing = publisher.writing.lock().await;
        let batch = publisher.take();
        if batch.is_empty() {
            drop(writing);
            if inner.strong_count() == 0 {
                return;
            }
            let _ = tokio::time::timeout(IDLE, publisher.wake.notified()).await;
            continue;
        }
        if batch.iter().any(|r| super::delayed(&r.key)) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let Some(store) = inner.upgrade() else { return };
        if !store.health.usable() {
            continue; // the relay shows them once the front is back
        }
        let records: Vec<Publish<'_>> = batch
            .iter()
            .map(|r| Publish {
                key: &r.key,
                token: r.token,
                fingerprint: &r.fingerprint,
                settled: r.outcome.settled(),
                until_ms: r.until_ms,
                own: false,
            })
            .collect();
        store
            .health
            .check(store.front.front_publish(&records).await);
    }
}
