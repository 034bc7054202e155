//! Batched claims and completions on PostgreSQL: every claim or completion
//! that arrives while earlier ones are being committed joins the next
//! batch, and a batch is one call of `idemgate_batch_expiry`
//! (migrations/0003_batches.sql; 0015's also says when a record that
//! refuses a claim expires): one round trip and one commit, however
//! many keys it carries. Two commits per new key are the floor for an
//! opaque upstream; nothing says each commit must carry one key.
//!
//! - **No added latency at low load.** A dispatcher task takes the first
//!   queued operation as soon as a batch slot is free (at most `[store]
//!   batches_in_flight` batches run at once) and adds whatever else is queued by
//!   then: a lone operation goes at once, alone. Under load the slots are
//!   busy, operations queue, and batches grow by themselves.
//! - **Per-key semantics unchanged.** A batch sorts its operations by
//!   (route, scope, key), arrival order kept among one key's, and runs them
//!   in that order inside one transaction: duplicates inside a batch
//!   resolve as if sequential, and every batch takes its row locks in one
//!   global order, so concurrent batches cannot deadlock (single-row
//!   statements hold one lock and wait for none while holding it).
//! - **One key's failure never fails its neighbours.** If PostgreSQL
//!   refuses a batch with an error that one key can cause (raised by the
//!   claim function, a data or constraint error, a deadlock or
//!   serialization failure: the whole transaction rolled back, so nothing
//!   of it happened), each of its operations runs again alone, in its own
//!   transaction; only the one that fails again fails. Any other failure —
//!   the transport, a timeout, a server shutting down or read-only, a
//!   missing function — fails the whole batch as it would fail one
//!   operation: the answer is lost, and the handler reports it as a
//!   lost claim (src/handler/lost_claims.rs).
//! - **No commit after its caller gave up.** Each operation carries its
//!   caller's deadline (`[store] timeout` from when it was submitted). A
//!   batch runs only until the latest deadline among its operations, and
//!   an operation whose caller has left is never sent — not when the batch
//!   starts, and not when a refused batch is run again one by one.
//! - **Shed, not sent.** A claim taken off the queue after waiting past
//!   `[store] claim_queue_budget`, or whose requester left ([`crate::caller`]),
//!   is answered [`StoreError::Shed`] at once, unsent; completions never are.
//! - **Bounded.** A batch holds at most [`MAX_OPS`] operations and
//!   [`MAX_BYTES`] of response bodies; the queue holds [`QUEUE`] operations
//!   (callers wait for room within `[store] timeout`). An operation whose
//!   caller stopped waiting before its batch started is dropped, never
//!   committed: nobody would settle a key claimed for nobody.

use std::cmp::Ordering as CmpOrdering;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use tokio::sync::{Semaphore, mpsc, oneshot};

use tokio::time::Instant;

use super::pool::{PgPool, RunError};
use crate::batch_queue::take_batch;
use crate::caller::{self, CancellationToken};
use crate::{
    BatchStats, Cas, Claim, HeldReason, RecordKey, Shed, StoreError, StoredResponse,
    UnknownOutcome, decode_headers,
};

/// Most operations in one batch.
const MAX_OPS: usize = 256;
/// Most bytes of response bodies in one batch (a larger body goes alone).
const MAX_BYTES: usize = 8 << 20;
/// Most operations queued for the dispatcher.
const QUEUE: usize = 4096;

/// One claim or completion, owned: it waits in the queue.
#[derive(Debug)]
pub(super) enum Op {
    /// `idemgate_claim` for one key.
    Claim {
        key: RecordKey,
        fingerprint: [u8; 32],
        attempt: i64,
        lease_ms: i64,
        retention_ms: i64,
        /// What a lapsed lease turns into.
        on_unknown: UnknownOutcome,
        /// On a route that inquires, its `after` (a lapsed lease's first
        /// question is due that long past the lapse).
        inquire_after_ms: i64,
    },
    /// The compare-and-set completion of one attempt.
    Complete {
        key: RecordKey,
        token: i64,
        status: i16,
        headers: Vec<u8>,
        body: Bytes,
        retention_ms: i64,
        /// The wake id to announce (routes with waiters only).
        wake: Option<String>,
    },
}

impl Op {
    fn key(&self) -> &RecordKey {
        match self {
            Op::Claim { key, .. } | Op::Complete { key, .. } => key,
        }
    }

    fn body_bytes(&self) -> usize {
        match self {
            Op::Claim { .. } => 0,
            Op::Complete { body, headers, .. } => body.len() + headers.len(),
        }
    }
}

/// The answer to an [`Op`].
#[derive(Debug)]
pub(super) enum Reply {
    Claim(Claim),
    Complete(Cas),
}

/// The global order of row locks: (route, scope, key), bytewise.
pub(crate) fn lock_order(a: &RecordKey, b: &RecordKey) -> CmpOrdering {
    (a.route.as_bytes(), &a.scope[..], a.key.as_bytes()).cmp(&(
        b.route.as_bytes(),
        &b.scope[..],
        b.key.as_bytes(),
    ))
}

/// One queued operation and where its answer goes.
struct Job {
    op: Op,
    reply: oneshot::Sender<Result<Reply, StoreError>>,
    /// When its caller stops waiting.
    deadline: Instant,
    /// When it was submitted (its wait for room in the queue counts).
    submitted: Instant,
    /// A claim's requester, cancelled once it has left ([`caller`]).
    requester: Option<CancellationToken>,
}

impl Job {
    /// Why this job, taken off the queue `now`, is not to be sent: only a
    /// claim, never a completion.
    fn shed(&self, now: Instant, budget: Duration) -> Option<Shed> {
        if !matches!(self.op, Op::Claim { .. }) {
            return None;
        }
        if self
            .requester
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
        {
            Some(Shed::CallerGone)
        } else if now.saturating_duration_since(self.submitted) > budget {
            Some(Shed::QueueBudget)
        } else {
            None
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    operations: AtomicU64,
    split: AtomicU64,
    shed_queue_budget: AtomicU64,
    shed_caller_gone: AtomicU64,
}

impl Counters {
    fn shed(&self, reason: Shed) {
        match reason {
            Shed::QueueBudget => &self.shed_queue_budget,
            Shed::CallerGone => &self.shed_caller_gone,
        }
        .fetch_add(1, Ordering::Relaxed);
    }
}

/// The handle of a store's batch dispatcher (cheap to clone: shared). The
/// dispatcher ends when every handle is dropped.
#[derive(Debug, Clone)]
pub(super) struct Batcher {
    jobs: mpsc::Sender<Job>,
    counters: Arc<Counters>,
    /// How long a caller waits (`[store] timeout`).
    timeout: Duration,
    /// How long a claim may wait in the queue (`[store] claim_queue_budget`).
    budget: Duration,
}

impl Batcher {
    /// Start the dispatcher: batches run on `pool`, at most `concurrency`
    /// at once; callers wait `timeout` for their answer, and a claim that
    /// waited `budget` in the queue is shed.
    pub(super) fn start(
        pool: PgPool,
        timeout: Duration,
        budget: Duration,
        concurrency: usize,
    ) -> Self {
        Self::counted(pool, timeout, budget, concurrency, Arc::default())
    }

    /// Another dispatcher on `pool`, started on the runtime this is
    /// called on (a serving thread's lane: crates/store/src/postgres/lanes.rs),
    /// counted with this one.
    pub(super) fn lane(&self, pool: PgPool, concurrency: usize) -> Self {
        Self::counted(
            pool,
            self.timeout,
            self.budget,
            concurrency,
            self.counters.clone(),
        )
    }

    fn counted(
        pool: PgPool,
        timeout: Duration,
        budget: Duration,
        concurrency: usize,
        counters: Arc<Counters>,
    ) -> Self {
        let (jobs, queue) = mpsc::channel(QUEUE);
        let slots = Arc::new(Semaphore::new(concurrency.max(1)));
        tokio::spawn(dispatch(queue, slots, pool, budget, counters.clone()));
        Self {
            jobs,
            counters,
            timeout,
            budget,
        }
    }

    /// Queue `op` and wait for its committed answer, at most `[store]
    /// timeout` (the wait for room in the queue included). An operation
    /// whose caller left is never sent if its batch has not started, and
    /// may be committed if it has.
    pub(super) async fn submit(&self, op: Op) -> Result<Reply, StoreError> {
        let submitted = Instant::now();
        let deadline = submitted + self.timeout;
        let requester = match op {
            Op::Claim { .. } => caller::requester(),
            Op::Complete { .. } => None,
        };
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::Unavailable("the PostgreSQL batch dispatcher stopped".into());
        let exchange = async {
            self.jobs
                .send(Job {
                    op,
                    reply,
                    deadline,
                    submitted,
                    requester,
                })
                .await
                .map_err(|_| stopped())?;
            answer.await.map_err(|_| stopped())?
        };
        tokio::time::timeout_at(deadline, exchange)
            .await
            .unwrap_or_else(|_| Err(RunError::TimedOut(self.timeout).into()))
    }

    /// Whether its dispatcher has ended (its runtime stopped, or it
    /// panicked): nothing submitted would be answered.
    pub(super) fn is_closed(&self) -> bool {
        self.jobs.is_closed()
    }

    /// What the dispatcher has done so far.
    pub(super) fn stats(&self) -> BatchStats {
        BatchStats {
            batches: self.counters.batches.load(Ordering::Relaxed),
            operations: self.counters.operations.load(Ordering::Relaxed),
            split: self.counters.split.load(Ordering::Relaxed),
            shed_queue_budget: self.counters.shed_queue_budget.load(Ordering::Relaxed),
            shed_caller_gone: self.counters.shed_caller_gone.load(Ordering::Relaxed),
        }
    }
}

/// Take batches off the queue as slots free up, each run in a task of its own.
async fn dispatch(
    mut queue: mpsc::Receiver<Job>,
    slots: Arc<Semaphore>,
    pool: PgPool,
    budget: Duration,
    counters: Arc<Counters>,
) {
    let mut next: Option<Job> = None;
    loop {
        let first = match next.take() {
            Some(job) => job,
            None => match queue.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        // Whatever queued while waiting for the slot joins this batch.
        let (mut batch, rest) = take_batch(&mut queue, first, MAX_OPS, MAX_BYTES, |job| {
            job.op.body_bytes()
        });
        next = rest;
        let now = Instant::now();
        batch.retain(|job| !job.reply.is_closed());
        let batch: Vec<Job> = batch
            .into_iter()
            .filter_map(|job| match job.shed(now, budget) {
                None => Some(job),
                Some(reason) => {
                    counters.shed(reason);
                    let _ = job.reply.send(Err(StoreError::Shed(reason)));
                    None
                }
            })
            .collect();
        if batch.is_empty() {
            continue;
        }
        let (pool, counters) = (pool.clone(), counters.clone());
        tokio::spawn(async move {
            run(&pool, batch, &counters).await;
            drop(slot);
        });
    }
}

/// Run one batch and answer each of its callers.
async fn run(pool: &PgPool, mut batch: Vec<Job>, counters: &Counters) {
    // Stable: one key's operations keep their arrival order.
    batch.sort_by(|a, b| lock_order(a.op.key(), b.op.key()));
    counters.batches.fetch_add(1, Ordering::Relaxed);
    counters
        .operations
        .fetch_add(batch.len() as u64, Ordering::Relaxed);
    let latest = batch.iter().map(|job| job.deadline).max();
    match call(pool, time_left(latest.unwrap_or_else(Instant::now)), &batch).await {
        Ok(rows) => answer(batch, rows),
        Err(e) if refused_for_one_key(&e) && batch.len() > 1 => {
            // Refused as a whole: nothing of it happened. Each operation
            // again, alone, so only the one that is refused again fails;
            // never one whose caller has left meanwhile.
            counters.split.fetch_add(1, Ordering::Relaxed);
            for job in batch {
                if job.reply.is_closed() {
                    continue;
                }
                let alone = [job];
                match call(pool, time_left(alone[0].deadline), &alone).await {
                    Ok(rows) => answer(alone, rows),
                    Err(e) => fail(alone, e),
                }
            }
        }
        Err(e) => fail(batch, e),
    }
}

/// The time from now until `deadline` (none left: zero, so the call fails
/// at once as timed out).
fn time_left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Whether PostgreSQL refused the batch with an error one of its keys can
/// cause, so that running each operation alone isolates it: an exception
/// raised by the claim function (class P0), a data or integrity error
/// (22, 23), a deadlock or serialization failure (40). Any other error
/// (connection, a server shutting down or read-only, a missing function)
/// would fail every operation alone just the same.
fn refused_for_one_key(e: &RunError) -> bool {
    let RunError::Sql(sqlx::Error::Database(db)) = e else {
        return false;
    };
    db.code().is_some_and(|code| {
        ["P0", "22", "23", "40"]
            .iter()
            .any(|class| code.starts_with(class))
    })
}

/// Every caller of `batch` hears `error`.
fn fail(batch: impl IntoIterator<Item = Job>, error: RunError) {
    let message = error.to_string();
    for job in batch {
        let _ = job
            .reply
            .send(Err(StoreError::Unavailable(message.clone())));
    }
}

#[derive(sqlx::FromRow)]
struct BatchRow {
    o_index: i64,
    #[sqlx(flatten)]
    outcome: ClaimRow,
}

/// idemgate_claim's `p_release_lapsed`: true takes over, false holds, NULL
/// inquires.
fn release_lapsed(on_unknown: UnknownOutcome) -> Option<bool> {
    match on_unknown {
        UnknownOutcome::Release => Some(true),
        UnknownOutcome::Hold => Some(false),
        UnknownOutcome::Inquire => None,
    }
}

/// One call of `idemgate_batch_expiry` for `batch`, in its order.
async fn call(pool: &PgPool, timeout: Duration, batch: &[Job]) -> Result<Vec<BatchRow>, RunError> {
    if timeout.is_zero() {
        // Its callers have stopped waiting: nothing is sent.
        return Err(RunError::TimedOut(timeout));
    }
    let n = batch.len();
    let mut kinds = Vec::with_capacity(n);
    let mut routes = Vec::with_capacity(n);
    let mut scopes = Vec::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    let mut fingerprints: Vec<Option<&[u8]>> = Vec::with_capacity(n);
    let mut attempts = Vec::with_capacity(n);
    let mut leases = Vec::with_capacity(n);
    let mut release = Vec::with_capacity(n);
    let mut retentions = Vec::with_capacity(n);
    let mut tokens = Vec::with_capacity(n);
    let mut statuses = Vec::with_capacity(n);
    let mut headers: Vec<Option<&[u8]>> = Vec::with_capacity(n);
    let mut bodies: Vec<Option<&[u8]>> = Vec::with_capacity(n);
    let mut wakes = Vec::with_capacity(n);
    let mut afters = Vec::with_capacity(n);
    for job in batch {
        let key = job.op.key();
        routes.push(key.route.as_str());
        scopes.push(&key.scope[..]);
        keys.push(key.key.as_str());
        match &job.op {
            Op::Claim {
                fingerprint,
                attempt,
                lease_ms,
                retention_ms,
                on_unknown,
                inquire_after_ms,
                ..
            } => {
                kinds.push("claim");
                fingerprints.push(Some(&fingerprint[..]));
                attempts.push(Some(*attempt));
                leases.push(Some(*lease_ms));
                release.push(release_lapsed(*on_unknown));
                retentions.push(*retention_ms);
                tokens.push(None);
                statuses.push(None);
                headers.push(None);
                bodies.push(None);
                wakes.push(None);
                afters.push(Some(*inquire_after_ms));
            }
            Op::Complete {
                token,
                status,
                headers: encoded,
                body,
                retention_ms,
                wake,
                ..
            } => {
                kinds.push("complete");
                fingerprints.push(None);
                attempts.push(None);
                leases.push(None);
                release.push(None);
                retentions.push(*retention_ms);
                tokens.push(Some(*token));
                statuses.push(Some(*status));
                headers.push(Some(&encoded[..]));
                bodies.push(Some(&body[..]));
                wakes.push(wake.as_deref());
                afters.push(None);
            }
        }
    }
    pool.run(timeout, async |conn| {
        sqlx::query_as(
            "SELECT * FROM idemgate_batch_expiry($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,
                                                 $13, $14, $15)",
        )
        .bind(&kinds)
        .bind(&routes)
        .bind(&scopes)
        .bind(&keys)
        .bind(&fingerprints)
        .bind(&attempts)
        .bind(&leases)
        .bind(&release)
        .bind(&retentions)
        .bind(&tokens)
        .bind(&statuses)
        .bind(&headers)
        .bind(&bodies)
        .bind(&wakes)
        .bind(&afters)
        .fetch_all(conn)
        .await
    })
    .await
}

/// Give each caller its operation's row: a claim has exactly one; a
/// completion has one if it applied and none if it was fenced.
fn answer(batch: impl IntoIterator<Item = Job>, rows: Vec<BatchRow>) {
    let mut rows = rows.into_iter().peekable();
    for (i, job) in batch.into_iter().enumerate() {
        let index = i as i64 + 1;
        // Rows come in operation order; skip any this operation cannot own.
        while rows.next_if(|row| row.o_index < index).is_some() {}
        let row = rows.next_if(|row| row.o_index == index);
        let reply = match (&job.op, row) {
            (Op::Claim { .. }, Some(row)) => claim_from_row(row.outcome).map(Reply::Claim),
            (Op::Claim { .. }, None) => Err(StoreError::Corrupt(
                "idemgate_batch returned no outcome for a claim".into(),
            )),
            (Op::Complete { .. }, Some(_)) => Ok(Reply::Complete(Cas::Applied)),
            (Op::Complete { .. }, None) => Ok(Reply::Complete(Cas::Fenced)),
        };
        let _ = job.reply.send(reply);
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct ClaimRow {
    o_outcome: String,
    o_token: Option<i64>,
    o_lease_ms: Option<i64>,
    o_held_reason: Option<String>,
    o_status: Option<i16>,
    o_headers: Option<Vec<u8>>,
    o_body: Option<Vec<u8>>,
    o_expires_ms: Option<i64>,
}

/// A count of ms from a row as a duration (none or negative: zero).
fn ms(value: Option<i64>) -> Duration {
    Duration::from_millis(value.unwrap_or(0).max(0) as u64)
}

/// The claim's outcome, from the row `idemgate_batch_expiry` returns.
pub(super) fn claim_from_row(row: ClaimRow) -> Result<Claim, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("claim returned {what}"));
    Ok(match row.o_outcome.as_str() {
        "claimed" | "takeover" => Claim::Claimed {
            token: row.o_token.ok_or_else(|| corrupt("no token"))?,
            takeover: row.o_outcome == "takeover",
        },
        "replay" => {
            let status = row
                .o_status
                .and_then(|s| u16::try_from(s).ok())
                .and_then(|s| StatusCode::from_u16(s).ok())
                .ok_or_else(|| corrupt("a bad status"))?;
            let headers = decode_headers(row.o_headers.as_deref().unwrap_or_default())
                .ok_or_else(|| corrupt("undecodable headers"))?;
            Claim::Replay(StoredResponse {
                status,
                headers,
                body: Bytes::from(row.o_body.unwrap_or_default()),
            })
        }
        "in_flight" => Claim::InFlight {
            retry_after: ms(row.o_lease_ms),
            expires_in: ms(row.o_expires_ms),
        },
        "inquiring" => Claim::Inquiring {
            retry_after: ms(row.o_lease_ms),
            expires_in: ms(row.o_expires_ms),
        },
        "mismatch" => Claim::Mismatch {
            expires_in: ms(row.o_expires_ms),
        },
        "held" => Claim::Held {
            reason: row
                .o_held_reason
                .as_deref()
                .and_then(HeldReason::parse)
                .ok_or_else(|| corrupt("an unknown held reason"))?,
            expires_in: ms(row.o_expires_ms),
        },
        other => return Err(corrupt(&format!("outcome {other:?}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(route: &str, scope: &[u8], key: &str) -> RecordKey {
        RecordKey {
            route: route.into(),
            scope: scope.to_vec(),
            key: key.into(),
        }
    }

    #[test]
    fn locks_are_taken_route_then_scope_then_key() {
        let mut keys = [
            key("b", b"", "a"),
            key("a", b"\x02", "a"),
            key("a", b"\x01", "z"),
            key("a", b"\x01", "b"),
        ];
        keys.sort_by(lock_order);
        let order: Vec<_> = keys
            .iter()
            .map(|k| (k.route.as_str(), k.scope.clone(), k.key.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                ("a", vec![1], "b"),
                ("a", vec![1], "z"),
                ("a", vec![2], "a"),
                ("b", vec![], "a"),
            ]
        );
    }
}
