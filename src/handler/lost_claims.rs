//! Claims whose answer was lost. When the store times out or the connection
//! is cut during a claim, the claim may still commit once the store
//! resumes, leaving a key in flight (and, once its lease lapses, `held`)
//! that never reached the upstream. The gateway knows the attempt id it
//! sent with the claim, so it removes exactly that attempt's record
//! ([`Store::abandon`]) as soon as the store answers again.
//!
//! Bounded on every side: one worker per instance works through a queue of
//! at most [`MAX_PENDING`] lost claims (beyond it they are counted `dropped` and
//! logged), [`AT_ONCE`] store operations at a time, backing off while the store
//! fails, and gives each lost claim up after [`PATIENCE`] of failures. A record
//! that is not there once the store answers is looked for again for one
//! lease, and at least [`transitions::lost_claim_window`], since a claim delayed by the stall
//! can commit just after the store resumes. A graceful shutdown lets the worker finish its queue
//! (within `shutdown_timeout`). An instance that dies before the store
//! answers leaves its lost claims to lapse: the one residual case, stated in
//! docs/src/design/state-machine.md.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Instant;
use crate::metrics::{LostClaimLabels, Metrics};
use crate::store::{AttemptId, Cas, RecordKey, Store, transitions};

/// Lost claims queued at once by one instance.
pub(super) const MAX_PENDING: usize = 10_000;

/// How long a lost claim is retried while the store keeps failing.
const PATIENCE: Duration = Duration::from_secs(600);

/// Lost claims whose abandons are sent together.
const AT_ONCE: usize = 32;

/// The first and the longest pause between tries.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// One claim whose answer was lost.
struct LostClaim {
    route: String,
    key: RecordKey,
    attempt: AttemptId,
    /// How long its record is looked for once the store answers that it
    /// is not there.
    absent_for: Duration,
    /// When the claim failed.
    since: Instant,
    /// When the store first answered that the record is not this attempt's.
    absent_since: Option<Instant>,
    /// Not tried again before this.
    due: Instant,
    /// This lost claim's next pause while its record is absent.
    pause: Duration,
}

/// The queue of one instance's lost claims; its worker runs until the queue
/// is closed (every handle dropped) and empty.
#[derive(Clone)]
pub(super) struct LostClaims {
    queue: mpsc::Sender<LostClaim>,
    metrics: Arc<Metrics>,
    /// `[store] timeout`: a claim may still commit this long after its
    /// caller gave up.
    store_timeout: Duration,
    /// Cancelled at shutdown: the worker ends once its queue is empty.
    finishing: CancellationToken,
}

impl LostClaims {
    /// Start the worker on `store`, as a task of `tasks` (graceful
    /// shutdown waits for it, after [`LostClaims::finish`]).
    pub(super) fn start(
        store: Arc<dyn Store>,
        store_timeout: Duration,
        metrics: Arc<Metrics>,
        tasks: &TaskTracker,
    ) -> Self {
        let (queue, intake) = mpsc::channel(MAX_PENDING);
        let finishing = CancellationToken::new();
        tasks.spawn(work(intake, store, metrics.clone(), finishing.clone()));
        Self {
            queue,
            metrics,
            store_timeout,
            finishing,
        }
    }

    /// Shutting down: the worker ends as soon as no lost claim is pending.
    pub(super) fn finish(&self) {
        self.finishing.cancel();
    }

    /// The claim of `attempt` on `key` failed without an answer: pursue
    /// the record it may have created.
    pub(super) fn report(&self, route: &str, key: RecordKey, attempt: AttemptId, lease: Duration) {
        let now = Instant::now();
        let lost = LostClaim {
            route: route.to_string(),
            key,
            attempt,
            absent_for: transitions::lost_claim_window(lease, self.store_timeout),
            since: now,
            absent_since: None,
            due: now,
            pause: FIRST_PAUSE,
        };
        if self.queue.try_send(lost).is_err() {
            count(&self.metrics, route, "dropped");
            tracing::warn!(
                route,
                attempt,
                "too many lost claims pending: this one is not pursued; if it committed, its key stays in flight until its lease lapses"
            );
        }
    }
}

fn count(metrics: &Metrics, route: &str, result: &'static str) {
    metrics
        .orphaned_claims
        .get_or_create(&LostClaimLabels {
            route: route.to_string(),
            result,
        })
        .inc();
}

/// The worker: take in lost claims, try those due, [`AT_ONCE`] at a time.
async fn work(
    mut intake: mpsc::Receiver<LostClaim>,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    finishing: CancellationToken,
) {
    let mut queue: VecDeque<LostClaim> = VecDeque::new();
    let mut open = true;
    // While the store fails, every lost claim waits this long between rounds.
    let mut failing_pause = FIRST_PAUSE;
    while open || !queue.is_empty() {
        let next_due = queue.iter().map(|o| o.due).min();
        tokio::select! {
            received = intake.recv(), if open => match received {
                Some(lost) => queue.push_back(lost),
                None => open = false,
            },
            () = sleep_until(next_due), if next_due.is_some() => {}
            () = finishing.cancelled(), if open && queue.is_empty() => return,
        }
        // Up to AT_ONCE due lost claims are tried together: one at a time,
        // each behind whatever holds its connection (a WAIT, a recovering
        // server), a backlog of hundreds outlived their leases.
        let now = Instant::now();
        let due: Vec<usize> = (0..queue.len())
            .filter(|&i| queue[i].due <= now)
            .take(AT_ONCE)
            .collect();
        if due.is_empty() {
            continue;
        }
        let answers = futures_util::future::join_all(
            due.iter()
                .map(|&i| store.abandon(&queue[i].key, queue[i].attempt)),
        )
        .await;
        let mut store_failed = false;
        let mut finished: Vec<(usize, &'static str)> = Vec::new();
        for (&i, answer) in due.iter().zip(answers) {
            let lost = &mut queue[i];
            match answer {
                Ok(Cas::Applied) => finished.push((i, "abandoned")),
                Ok(Cas::Fenced) => {
                    // When this answer came, not when the round began.
                    let since = *lost.absent_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= lost.absent_for {
                        finished.push((i, "absent"));
                    } else {
                        lost.due = Instant::now() + lost.pause;
                        lost.pause = (lost.pause * 2).min(LONGEST_PAUSE);
                    }
                }
                Err(_) => {
                    store_failed = true;
                    if lost.since.elapsed() >= PATIENCE {
                        finished.push((i, "gave_up"));
                    }
                }
            }
        }
        if store_failed {
            // The store still fails: every lost claim waits a round.
            let later = Instant::now() + failing_pause;
            failing_pause = (failing_pause * 2).min(LONGEST_PAUSE);
            for waiting in queue.iter_mut() {
                waiting.due = waiting.due.max(later);
            }
        } else {
            failing_pause = FIRST_PAUSE;
        }
        // Highest index first, so the lower ones stay valid.
        for (i, result) in finished.into_iter().rev() {
            let lost = queue.remove(i).expect("index within the queue");
            count(&metrics, &lost.route, result);
            let (route, attempt) = (lost.route.as_str(), lost.attempt);
            match result {
                "abandoned" => tracing::info!(
                    route,
                    attempt,
                    "removed the record of a claim whose answer was lost (never forwarded)"
                ),
                "gave_up" => tracing::warn!(
                    route,
                    attempt,
                    "the store did not answer in time to remove a lost claim; if it committed, its key stays in flight until its lease lapses"
                ),
                _ => {}
            }
        }
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}
