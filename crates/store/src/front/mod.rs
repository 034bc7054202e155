//! The front store (docs/src/design/front-store.md): the PostgreSQL
//! store, the truth, with a Redis server in front that answers what it
//! safely can without a PostgreSQL round trip.
//!
//! **What the front answers.** A claim reads the front first. A completed
//! record there is replayed (or refused with `422` for another
//! fingerprint); a held one gets its held answer; a live in-flight marker
//! gets `409` (on routes that do not wait). Anything else (nothing there,
//! a waiting route's marker, the front down) goes to PostgreSQL, which
//! alone ever lets a request through: the front never claims, so it can
//! never cause a second execution.
//!
//! **How it stays true.** Writes go to PostgreSQL first, and the front
//! follows in ways that can only make it forget, never lie:
//!
//! - a claim PostgreSQL granted is marked in flight in the front if it is
//!   still unsettled after `[store.front] mark_after` ([`marks`]), until
//!   the lease would end (never later than PostgreSQL's);
//! - once PostgreSQL has committed a completion or a hold of a marked
//!   attempt, and before the caller is answered, the settled record
//!   replaces the attempt's own entry in the front (only that: a front
//!   that lost it stays without); so after a completion returned, no
//!   instance's front shows it in flight. An attempt never marked has no
//!   entry to replace: its settled record is shown off the caller's path
//!   ([`publish`]);
//! - before a release, and before an operator clears or deletes a key or a
//!   lost claim is abandoned, the front is fenced: no entry of that
//!   attempt (or of any attempt so far) is written again; an erasure
//!   fences each key it removed ([`erase`]);
//! - every change in PostgreSQL that can make the front stale writes an
//!   outbox row in its own transaction (migrations/0004_front_outbox.sql), and the relay
//!   ([`relay`]) applies it, so a crash or a failed Redis write between the
//!   two loses nothing.
//!
//! **When the front fails** (an error or no answer within
//! `[store.front] timeout`) this instance stops using it at once and
//! answers from PostgreSQL alone; it uses it again only when it answers
//! and the outbox has drained up to that moment ([`health`]).

mod erase;
mod health;
mod marks;
mod publish;
mod relay;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use health::{Health, bump};
use marks::{Marks, Waiting};
use publish::{Outcome, Publisher};

use super::postgres::{PgStore, millis};
use super::redis::RedisStore;
use super::runtime::StoreRuntime;
use super::{
    AttemptId, BatchStats, Cas, Claim, ClaimRequest, EraseStep, EraseStepFailed, Erased,
    FrontConfig, HeldReason, InquiringRoute, Inquiry, PoolStats, RecordInfo, RecordKey,
    RecordState, Store, StoreAdmin, StoreConfig, StoreError, StoredResponse, Swept, Token,
};
use crate::FrontStats;
use crate::redis::front::{FrontEntry, Mark, Publish, Settled};
use crate::waiters::Waiters;

/// Most keys waiting for or under read-repair.
const MAX_REPAIRS: usize = 256;
/// Most read-repairs reading PostgreSQL at once: each holds a connection
/// of the shared pool (the shared runtime's batches use it too), so few (a repair takes about a round trip
/// to each store; a hot set refills in a few of them).
const REPAIRS_AT_ONCE: usize = 4;

/// PostgreSQL with a Redis front.
pub struct FrontStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FrontStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontStore").finish_non_exhaustive()
    }
}

struct Inner {
    truth: PgStore,
    front: RedisStore,
    health: Health,
    fence_life: Duration,
    /// Routes with `concurrent = "wait"`: their in-flight duplicates wait
    /// on PostgreSQL's announcements, so the front does not answer them.
    wait_routes: crate::WaitRoutes,
    /// Keys waiting for or under read-repair.
    repairing: Mutex<HashSet<RecordKey>>,
    /// Read-repairs that may read PostgreSQL now.
    repair_slots: tokio::sync::Semaphore,
    /// The claimed attempts waiting for their markers.
    marks: Arc<Marks>,
    /// The settled records of attempts never marked, to show.
    publisher: Arc<Publisher>,
    /// Where read-repairs run, whichever thread's request asked for one.
    runtime: StoreRuntime,
}

impl Inner {
    /// Write markers, counting those written.
    async fn mark(&self, marks: &[Mark<'_>]) {
        if let Some(written) = self.health.check(self.front.front_mark(marks).await) {
            self.health
                .counts
                .marks
                .fetch_add(written, Ordering::Relaxed);
        }
    }
}

/// Milliseconds since the epoch, by this host's clock.
pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl FrontStore {
    /// Connect to PostgreSQL (with its outbox on) and, lazily, to the
    /// front; start the relay, the probe and the backlog gauge. A front
    /// that does not answer is not an error: requests use PostgreSQL alone
    /// until it does.
    pub async fn connect(config: &StoreConfig, front: &FrontConfig) -> Result<Self, StoreError> {
        let truth = PgStore::connect_as(config, true).await?;
        if config.migrate {
            truth.migrate().await?;
        }
        // Without its outbox (migrations/0004_front_outbox.sql) nothing would keep the front
        // true: refuse to start rather than serve a front that goes stale.
        if let Err(StoreError::NotMigrated(what)) = truth.ping().await {
            return Err(StoreError::NotMigrated(format!(
                "{what}; the Redis front needs its outbox table"
            )));
        }
        let front_config = StoreConfig {
            url: front.url.clone(),
            timeout: front.timeout,
            cluster: false,
            // The front holds copies only: nothing on it is waited for.
            replicas: 0,
            front: None,
            ..config.clone()
        };
        let front_store = RedisStore::unchecked(&front_config)?;
        let inner = Arc::new(Inner {
            truth,
            front: front_store,
            health: Health::default(),
            fence_life: front.fence_life,
            wait_routes: config.wait_routes.clone(),
            repairing: Mutex::new(HashSet::new()),
            repair_slots: tokio::sync::Semaphore::new(REPAIRS_AT_ONCE),
            marks: Arc::new(Marks::new(front.mark_after)),
            publisher: Arc::new(Publisher::default()),
            runtime: StoreRuntime::here(),
        });
        let weak = Arc::downgrade(&inner);
        tokio::spawn(relay::relay(weak.clone()));
        tokio::spawn(marks::run(weak.clone(), inner.marks.clone()));
        tokio::spawn(publish::run(weak.clone(), inner.publisher.clone()));
        // Up from the start if it answers and has every change so far.
        let up = relay::caught_up(&inner).await;
        if up {
            inner.health.recovered(true);
        } else {
            tracing::warn!(
                url = %super::redact_url(&front.url),
                "front store (Redis) does not answer or lags: answering from PostgreSQL alone until it does"
            );
        }
        tokio::spawn(relay::probe(weak.clone(), up));
        tokio::spawn(relay::backlog(weak));
        Ok(Self { inner })
    }

    /// Apply PostgreSQL's migrations.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.inner.truth.migrate().await
    }

    /// What the front has done.
    pub fn stats(&self) -> FrontStats {
        let c = &self.inner.health.counts;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        FrontStats {
            up: self.inner.health.usable(),
            replays: get(&c.replays),
            conflicts: get(&c.conflicts),
            mismatches: get(&c.mismatches),
            held: get(&c.held),
            misses: get(&c.misses),
            marks: get(&c.marks),
            errors: get(&c.errors),
            outages: get(&c.outages),
            relayed: get(&c.relayed),
            relayed_shown: get(&c.relayed_shown),
            backlog: c.backlog.load(Ordering::Relaxed),
            lag: Duration::from_millis(get(&c.lag_ms)),
            repairs: get(&c.repairs),
        }
    }

    /// The front's answer to `request`, if it has one it may give. A
    /// refusal needs the record's expiry: an entry of an older version,
    /// which lacks it, is left to PostgreSQL.
    fn answer(&self, entry: FrontEntry, request: &ClaimRequest<'_>) -> Option<Claim> {
        let counts = &self.inner.health.counts;
        let (fingerprint, expires_in, claim, counter) = match entry {
            FrontEntry::Completed {
                fingerprint,
                response,
                expires_in,
            } => (
                fingerprint,
                expires_in,
                Some(Claim::Replay(response)),
                &counts.replays,
            ),
            FrontEntry::Held {
                fingerprint,
                reason,
                expires_in,
            } => {
                let claim = expires_in.map(|expires_in| Claim::Held { reason, expires_in });
                (fingerprint, expires_in, claim, &counts.held)
            }
            FrontEntry::InFlight {
                fingerprint,
                left,
                expires_in,
            } => {
                if self.inner.wait_routes.contains(&request.key.route) {
                    return None;
                }
                let claim = expires_in.map(|expires_in| Claim::InFlight {
                    retry_after: left,
                    expires_in,
                });
                (fingerprint, expires_in, claim, &counts.conflicts)
            }
        };
        // Another request under the key: `422`, whatever its state.
        if fingerprint[..] != request.fingerprint[..] {
            let claim = Claim::Mismatch {
                expires_in: expires_in?,
            };
            bump(&counts.mismatches);
            return Some(claim);
        }
        let claim = claim?;
        bump(counter);
        Some(claim)
    }

    /// Give the front a settled record PostgreSQL answered, unless it has
    /// one by the time the repair looks (once per key at a time).
    fn repair(&self, key: &RecordKey) {
        {
            let mut repairing = self
                .inner
                .repairing
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if repairing.len() >= MAX_REPAIRS || !repairing.insert(key.clone()) {
                return;
            }
        }
        self.inner
            .runtime
            .spawn(relay::repair(self.inner.clone(), key.clone()));
    }

    /// After PostgreSQL committed attempt `token`'s completion or hold
    /// (`unmarked`: what [`Marks::settle`] gave back): a marked attempt's
    /// settled record replaces its entry in the front before the caller
    /// is answered; an unmarked one's is copied and queued to be shown.
    async fn settle(
        &self,
        key: &RecordKey,
        token: Token,
        unmarked: Option<Waiting>,
        settled: Settled<'_>,
        until_ms: i64,
    ) {
        if !self.inner.health.usable() {
            return;
        }
        if let Some(waiting) = unmarked {
            self.inner.publisher.push(publish::Record {
                key: waiting.key,
                token,
                fingerprint: waiting.fingerprint,
                outcome: Outcome::of(settled),
                until_ms,
            });
            return;
        }
        if delayed(key) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // The fingerprint comes from the attempt's entry itself.
        let record = Publish {
            key,
            token,
            fingerprint: &[],
            settled,
            until_ms,
            own: true,
        };
        let result = self.inner.front.front_publish(&[record]).await;
        self.inner.health.check(result);
    }

    /// Fence the front at `token`: no entry of that attempt, or of an
    /// older one, is written again while the fence lives.
    async fn fence(&self, key: &RecordKey, token: Token) {
        let front = &self.inner.front;
        let result = front
            .front_invalidate(key, token, self.inner.fence_life)
            .await;
        self.inner.health.check(result);
    }

    /// Fence the front before an operator's clear or delete, or an
    /// abandoned claim: no attempt issued so far writes to it again.
    async fn fence_everything(&self, key: &RecordKey) -> Result<(), StoreError> {
        if self.inner.health.usable() {
            let ceiling = self.inner.truth.token_ceiling().await?;
            self.fence(key, ceiling).await;
        }
        Ok(())
    }
}

/// Test builds only: the `front-publish-delay` failpoint, armed with
/// `return(KEY)`, holds back that key's settled record for half a second
/// after PostgreSQL's commit, on the caller's path or off it
/// (tests/it/stores/front.rs: an operator's delete meanwhile must win). Without
/// the `fail` crate's `failpoints` feature this is always false.
fn delayed(key: &RecordKey) -> bool {
    fail::fail_point!("front-publish-delay", |armed: Option<String>| {
        armed.as_deref() == Some(key.key.as_str())
    });
    let _ = key; // used only by the failpoint
    false
}

#[async_trait::async_trait]
impl Store for FrontStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let started = now_ms();
        let health = &self.inner.health;
        if health.usable() {
            let read = health.check(self.inner.front.front_read(request.key, started).await);
            if let Some(claim) = read.flatten().and_then(|entry| self.answer(entry, request)) {
                return Ok(claim);
            }
            bump(&health.counts.misses);
        }
        let claim = self.inner.truth.claim(request).await?;
        if health.usable() {
            match &claim {
                Claim::Claimed { token, takeover } => {
                    // Never past PostgreSQL's lease, which began after `started`.
                    let waiting = Waiting {
                        key: request.key.clone(),
                        fingerprint: *request.fingerprint,
                        until_ms: started.saturating_add(millis(request.lease)),
                        // A new record's retention (or its lease, if
                        // longer) began after `started` too; a taken-over
                        // one keeps its own, which the front does not know:
                        // its refusals are left to PostgreSQL.
                        expires_ms: (!takeover).then(|| {
                            started.saturating_add(millis(request.retention.max(request.lease)))
                        }),
                    };
                    // Off the request's path, and only if it is still
                    // unsettled after `mark_after` ([`marks`]); a full
                    // queue: marked now, before the request is forwarded.
                    if let Some(w) = self.inner.marks.queue(*token, waiting) {
                        self.inner.mark(&[w.mark(*token)]).await;
                    }
                }
                Claim::Replay(_) | Claim::Held { .. } => self.repair(request.key),
                Claim::InFlight { .. } | Claim::Mismatch { .. } | Claim::Inquiring { .. } => {}
            }
        }
        Ok(claim)
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: Token,
        lease: Duration,
    ) -> Result<Cas, StoreError> {
        let started = now_ms();
        let cas = self.inner.truth.renew(key, token, lease).await?;
        if cas == Cas::Applied && self.inner.health.usable() {
            let until = started.saturating_add(millis(lease));
            // A marker still waiting ends with the new lease when written.
            if !self.inner.marks.renew(token, until).await {
                let extended = self.inner.front.front_extend(key, token, until).await;
                self.inner.health.check(extended);
            }
        }
        Ok(cas)
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: Token,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let started = now_ms();
        // Settling: a marker not yet written never will be (one being
        // written has landed or failed by the time this returns).
        let unmarked = self.inner.marks.settle(token).await;
        let cas = self
            .inner
            .truth
            .complete(key, token, response, retention)
            .await?;
        if cas == Cas::Applied {
            // Never past PostgreSQL's retention, which began after `started`.
            let until = started.saturating_add(millis(retention));
            self.settle(key, token, unmarked, Settled::Completed(response), until)
                .await;
        }
        Ok(cas)
    }

    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError> {
        // An attempt never marked left nothing of its own in the front.
        let unmarked = self.inner.marks.settle(token).await;
        if unmarked.is_none() && self.inner.health.usable() {
            self.fence(key, token).await;
        }
        self.inner.truth.release(key, token).await
    }

    async fn hold(
        &self,
        key: &RecordKey,
        token: Token,
        reason: HeldReason,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let started = now_ms();
        let unmarked = self.inner.marks.settle(token).await;
        let cas = self.inner.truth.hold(key, token, reason, retention).await?;
        if cas == Cas::Applied {
            let until = started.saturating_add(millis(retention));
            self.settle(key, token, unmarked, Settled::Held(reason), until)
                .await;
        }
        Ok(cas)
    }

    async fn inquire(
        &self,
        key: &RecordKey,
        token: Token,
        next: Duration,
        asked: bool,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        // Like a release: the front shows nothing of an inquiring key (its
        // claims go to PostgreSQL), so the attempt's in-flight entry goes.
        let unmarked = self.inner.marks.settle(token).await;
        if unmarked.is_none() && self.inner.health.usable() {
            self.fence(key, token).await;
        }
        self.inner
            .truth
            .inquire(key, token, next, asked, retention)
            .await
    }

    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError> {
        // Its claim's answer was lost, perhaps after PostgreSQL granted it
        // and the marker was sent; the token is unknown here, so fence
        // every attempt so far (rare: lost claims only).
        self.fence_everything(key).await?;
        self.inner.truth.abandon(key, attempt).await
    }
}

#[async_trait::async_trait]
impl StoreAdmin for FrontStore {
    async fn relay_wakeups(&self, waiters: Arc<Waiters>) {
        self.inner.truth.relay_wakeups(waiters).await;
    }

    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        self.inner.truth.inspect(key).await
    }

    async fn recorded(&self, key: &RecordKey) -> Result<Option<StoredResponse>, StoreError> {
        self.inner.truth.recorded(key).await
    }

    async fn list(
        &self,
        route: &str,
        state: RecordState,
        limit: usize,
    ) -> Result<Vec<RecordInfo>, StoreError> {
        self.inner.truth.list(route, state, limit).await
    }

    async fn clear(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        self.fence_everything(key).await?;
        self.inner.truth.clear(key, force).await
    }

    async fn delete(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        self.fence_everything(key).await?;
        self.inner.truth.delete(key, force).await
    }

    async fn erase(&self, step: &EraseStep<'_>) -> Result<Erased, EraseStepFailed> {
        self.erase_and_fence(step).await
    }

    #[cfg(feature = "test-hooks")]
    async fn age(&self, key: &RecordKey, by: Duration) -> Result<bool, StoreError> {
        // What is still to be written to the front, then the truth, then
        // what the front shows, with the markers' and publisher's writes
        // held back meanwhile: each entry is aged once, queued or shown.
        let by_ms = millis(by);
        let _marks = self.inner.marks.age(key, by_ms).await;
        let _publishing = self.inner.publisher.age(key, by_ms).await;
        let found = self.inner.truth.age(key, by).await?;
        self.inner.front.front_age(key, by).await?;
        Ok(found)
    }

    async fn take_inquiries(
        &self,
        routes: &[InquiringRoute],
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Inquiry>, StoreError> {
        // The front never shows an inquiring key: PostgreSQL decides.
        self.inner.truth.take_inquiries(routes, lease, limit).await
    }

    async fn count_inquiring(&self, routes: &[InquiringRoute]) -> Result<u64, StoreError> {
        self.inner.truth.count_inquiring(routes).await
    }

    async fn sweep(&self, batch: usize) -> Result<Swept, StoreError> {
        // Expired records expired in the front too (their TTLs).
        self.inner.truth.sweep(batch).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        // PostgreSQL decides readiness: without the front, requests are
        // answered all the same.
        self.inner.truth.ping().await
    }

    async fn open_serving_thread(&self, threads: usize) {
        self.inner.truth.open_serving_thread(threads).await;
        self.inner.front.open_serving_thread(threads).await;
    }

    fn pool_stats(&self) -> Option<PoolStats> {
        self.inner.truth.pool_stats()
    }

    fn batch_stats(&self) -> Option<BatchStats> {
        self.inner.truth.batch_stats()
    }

    fn front_stats(&self) -> Option<FrontStats> {
        Some(self.stats())
    }
}
