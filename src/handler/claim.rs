//! Pipeline step 5: claim the key in a task of its own (G6), then answer
//! from the claim (replay, `409`, `422`, held) or hand the claimed attempt
//! to [`super::attempt`]. With `concurrent = "wait"`, a duplicate of an
//! in-flight key waits, woken by the store, and claims again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use super::{Answered, Gateway, Outcome, REPLAYED, Routed};
use crate::clock::Instant;
use crate::config::{Concurrent, Route, RouteMode};
use crate::metrics::WakeupLabels;
use crate::problem::{GatewayError, RecordExpiry};
use crate::request::body::{self, Body, Reservation};
use crate::request::fingerprint::Fingerprint;
use crate::store::{self, Claim, ClaimRequest, RecordKey, StoreError, StoredResponse};
use crate::telemetry::spans;
use crate::upstream;
use crate::upstream::IDEMPOTENCY_ATTEMPT;

/// The longest a waiting request goes without claiming again when the store
/// announces nothing (announcements lost while a relay reconnects are also
/// covered by its wake-all).
const WAIT_POLL: Duration = Duration::from_secs(5);

/// How long after the first attempt's lease ends a waiter claims again
/// (never less: no waiter can spin on a lease that is about to end).
const LEASE_GRACE: Duration = Duration::from_millis(100);

/// Everything a claim (and its forward) needs; cheap to clone (the body is
/// shared), so a waiting request can claim again.
#[derive(Clone)]
pub(super) struct Claiming {
    pub(super) route: Arc<Routed>,
    pub(super) record_key: RecordKey,
    pub(super) fingerprint: Fingerprint,
    pub(super) parts: Parts,
    pub(super) body: Bytes,
    pub(super) client: SocketAddr,
    /// The body's share of the body budget, held until the last task
    /// using the body ends.
    pub(super) reservation: Arc<Reservation>,
    /// Claimed again by a request that waited: the key is known to be in
    /// flight, so a store error is returned as such and never fails open.
    pub(super) after_waiting: bool,
}

impl Claiming {
    /// Whether a duplicate of an in-flight key waits (`concurrent =
    /// "wait"`, enforced) rather than getting `409` at once.
    pub(super) fn waits(&self) -> bool {
        self.route.concurrent == Concurrent::Wait && self.route.mode == RouteMode::Enforce
    }
}

impl Gateway {
    /// The replay of an enforced route's key the store's replay cache
    /// holds under this request's fingerprint, answered without a claim
    /// (what the claim would answer from the cache, without the task,
    /// its channel and its slot). A shadow route asks the store: what it
    /// would do is counted there.
    pub(super) fn replay_at_hand(&self, claim: &Claiming) -> Option<Answered> {
        if claim.route.mode != RouteMode::Enforce {
            return None;
        }
        let stored = self
            .store
            .replay_at_hand(&claim.record_key, &claim.fingerprint)?;
        Some(Answered::new(replay(stored), Outcome::Replayed))
    }

    /// Claim (and forward) in a task of its own.
    pub(super) async fn claim_in_task(
        self: &Arc<Self>,
        claim: Claiming,
    ) -> Result<Answered, GatewayError> {
        let forward_slot = self
            .forward_slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                GatewayError::Overloaded("budget for forwards in flight (max_forwards_in_flight)")
            })?;
        let (reply, answer) = oneshot::channel();
        let gateway = self.clone();
        // Cancelled when this handler is dropped (its client left): a
        // claim still queued then is shed, never sent; once sent, the task
        // goes on (G6).
        let requester = store::caller::CancellationToken::new();
        let _left = requester.clone().drop_guard();
        // Boxed: the claim-and-forward future holds every step's state (a
        // few KB), and a task's future is copied whole into the task and
        // again as its output is stored; boxed, those copies are a
        // pointer's. (Unboxed, the copies were about 8 % of a cached
        // replay's CPU, when those still came through here; they serve new
        // keys and uncached replays now.)
        let work = Box::pin(store::caller::on_behalf_of(
            requester,
            gateway.claim_and_forward(claim),
        ));
        spans::spawn_carried(&self.tasks, async move {
            // The claim's body reservation ends with it.
            let result = work.await;
            // The response is no longer buffered here.
            drop(forward_slot);
            let _ = reply.send(result);
        });
        answer.await.map_err(|_| {
            GatewayError::Internal("the forward task ended without an answer".into())
        })?
    }

    /// `concurrent = "wait"`: while the key is in flight, wait (woken by
    /// the store, or at the slow poll) and claim again, until the first
    /// attempt's answer is there, this request wins a released key, or
    /// `wait_timeout` passes (`409`). A client that goes away stops waiting.
    pub(super) async fn claim_or_wait(
        self: &Arc<Self>,
        claim: Claiming,
    ) -> Result<Answered, GatewayError> {
        let started = Instant::now();
        let deadline = started + claim.route.wait_timeout;
        let signal = self.waiters.register(claim.record_key.wake_id());
        let mut waiting: Option<Waiting> = None;
        let mut claim = claim;
        // The latest in-flight answer: its lease's time left, its record's expiry.
        let mut in_flight: Option<(Duration, RecordExpiry)> = None;
        loop {
            // Listening before the claim: a wake between its answer and the
            // wait below is kept.
            let notified = signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            claim.after_waiting = waiting.is_some();
            match self.claim_in_task(claim.clone()).await {
                Err(GatewayError::InFlight {
                    retry_after,
                    expires,
                }) => in_flight = Some((retry_after, expires)),
                // The store is away while this request waits: the first
                // attempt may still answer; wait on.
                Err(GatewayError::StoreUnavailable(error))
                    if waiting.is_some() && error.is_transient() =>
                {
                    tracing::debug!(%error, "store error while waiting; waiting on");
                }
                Ok(answered) if answered.outcome == Outcome::Replayed && waiting.is_some() => {
                    return Ok(Answered {
                        outcome: Outcome::WaitedReplay,
                        ..answered
                    });
                }
                other => return other,
            }
            // Only an in-flight answer (or, once waiting, a store error
            // after one) comes this far.
            let (retry_after, expires) = in_flight.ok_or_else(|| {
                GatewayError::Internal("a wait began without an in-flight answer".into())
            })?;
            if waiting.is_none() {
                waiting = Some(Waiting::start(self, claim.body.len()).ok_or(
                    GatewayError::InFlight {
                        retry_after,
                        expires,
                    },
                )?);
            }
            let cause = tokio::select! {
                () = &mut notified => "store",
                // The safety net, or when the first attempt's lease runs
                // out (a dead attempt announces nothing).
                () = tokio::time::sleep(WAIT_POLL.min(retry_after + LEASE_GRACE)) => "poll",
                () = tokio::time::sleep_until(deadline) => {
                    return Err(GatewayError::WaitTimeout {
                        waited: started.elapsed(),
                        retry_after,
                        expires,
                    });
                }
            };
            self.metrics
                .wait_wakeups
                .get_or_create(&WakeupLabels { cause })
                .inc();
        }
    }

    /// Claim the key, then answer from the claim or forward and settle.
    async fn claim_and_forward(self: Arc<Self>, claim: Claiming) -> Result<Answered, GatewayError> {
        let Claiming {
            route,
            record_key,
            fingerprint,
            parts,
            body,
            client,
            reservation: _reservation,
            after_waiting,
        } = claim;
        let attempt = store::new_attempt_id();
        // The lease begins when the claim commits, after this instant; the
        // store reckons a refusing record's time left after it too.
        let claim_sent = Instant::now();
        let asked = SystemTime::now();
        let claimed = self
            .store
            .claim(&ClaimRequest {
                key: &record_key,
                fingerprint: &fingerprint,
                attempt,
                lease: route.lease,
                retention: route.retention,
                on_unknown_outcome: route.on_unknown_outcome,
                inquire_after: route.inquiry.as_ref().map_or(Duration::ZERO, |i| i.after),
            })
            .await;
        let claimed = match claimed {
            Ok(claimed) => claimed,
            // Shed before it was sent: nothing was written, the key is
            // free; overloaded, not an outage, so it never fails open.
            Err(StoreError::Shed(_)) if route.mode == RouteMode::Enforce => {
                return Err(GatewayError::Overloaded(
                    "time a claim may wait for the store ([store] claim_queue_budget)",
                ));
            }
            Err(error) => {
                if let StoreError::Unavailable(_) | StoreError::NotReplicated(_) = error {
                    // The claim may commit once the store resumes (or, not
                    // replicated, stands on the primary) although this
                    // request is never forwarded under it.
                    self.lost_claims
                        .report(&route.name, record_key, attempt, route.lease);
                }
                if after_waiting {
                    return Err(GatewayError::StoreUnavailable(error));
                }
                if route.mode == RouteMode::Shadow {
                    let request = Request::from_parts(parts, body::full(body));
                    return self
                        .shadow_store_error(&route, request, client, error)
                        .await;
                }
                return self
                    .on_store_error(&route, parts, body, client, error)
                    .await;
            }
        };
        if route.mode == RouteMode::Shadow && !self.shadow_claims(&route, &record_key, &claimed) {
            let request = Request::from_parts(parts, body::full(body));
            return self.pass_through(&route, request, client).await;
        }
        match claimed {
            Claim::Replay(stored) => Ok(Answered::new(replay(stored), Outcome::Replayed)),
            refused @ (Claim::InFlight { .. }
            | Claim::Mismatch { .. }
            | Claim::Held { .. }
            | Claim::Inquiring { .. }) => Err(refusal(refused, &route, asked)),
            Claim::Claimed { token, takeover } => {
                // Window (a): the claim has committed, nothing was sent.
                kill_window!("after-claim");
                // (Tests stall here: a gateway starved before it forwards.)
                fail::fail_point!("before-forward");
                if claim_sent.elapsed() + route.lease / 4 >= route.lease {
                    return Err(self.too_late_to_forward(&route, record_key, attempt).await);
                }
                if takeover {
                    tracing::warn!(route = %route.name, token, "took over a key whose lease lapsed");
                    route.metrics.lease_takeovers.inc();
                }
                let mut request = upstream::prepare(
                    Request::from_parts(parts, body::full(body)),
                    &route.upstream,
                    client,
                    |name| route.travels_end_to_end(name),
                );
                if route.forward_attempt {
                    // Replaces any the client sent: the token is the gateway's.
                    request
                        .headers_mut()
                        .insert(IDEMPOTENCY_ATTEMPT, http::HeaderValue::from(token));
                }
                let response = self.attempt(&route, &record_key, token, request).await?;
                Ok(Answered::forwarded(response, token))
            }
        }
    }
}

impl Gateway {
    /// The claim's lease is (nearly) spent and nothing was sent: this
    /// gateway stalled between the claim and the forward (an overloaded
    /// machine, a paused process). Another instance may already have taken
    /// the key over or asked the upstream about it, so forwarding now could
    /// execute it twice: the request is not sent, and the attempt's record
    /// is abandoned as a lost claim's is (by attempt id, so a newer attempt
    /// or inquiry is untouched; at once, or by the lost-claims worker if
    /// the store does not answer, so the key never turns held for want of
    /// it).
    async fn too_late_to_forward(
        &self,
        route: &Route,
        key: RecordKey,
        attempt: store::AttemptId,
    ) -> GatewayError {
        tracing::warn!(route = %route.name, attempt, "the claim's lease ran out before the request was forwarded: not sent, the attempt abandoned");
        if let Err(error) = self.store.abandon(&key, attempt).await {
            tracing::warn!(route = %route.name, attempt, %error, "could not abandon the attempt yet; the lost-claims worker pursues it");
            self.lost_claims
                .report(&route.name, key, attempt, route.lease);
        }
        GatewayError::Overloaded(
            "time to forward within the lease (the gateway stalled after the claim)",
        )
    }
}

/// A request counted as waiting (`idemgate_waiting`, `max_waiting`, and
/// its body against the waiters' share of the body budget) while alive.
struct Waiting {
    _slot: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Waiting {
    /// `None` when `max_waiting` requests already wait, or their bodies
    /// already hold the waiters' share of the body budget.
    fn start(gateway: &Gateway, body_bytes: usize) -> Option<Self> {
        let slot = gateway.wait_slots.clone().try_acquire_owned().ok()?;
        let bytes = match u32::try_from(body_bytes).ok()? {
            0 => None,
            n => Some(gateway.wait_bytes.clone().try_acquire_many_owned(n).ok()?),
        };
        gateway.metrics.waiting.inc();
        Some(Self {
            _slot: slot,
            _bytes: bytes,
            gauge: gateway.metrics.waiting.clone(),
        })
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// A recorded response, marked as a replay.
fn replay(stored: StoredResponse) -> Response<Body> {
    let mut response = Response::new(body::full(stored.body));
    *response.status_mut() = stored.status;
    *response.headers_mut() = stored.headers;
    response
        .headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    response
}

/// A claim the record refused, as the client's answer: with when the
/// record expires (reckoned from `asked`, when the claim was sent), in the
/// header too where `route` announces expiry.
fn refusal(claim: Claim, route: &Route, asked: SystemTime) -> GatewayError {
    let expiry = |expires_in| RecordExpiry::after(asked, expires_in, route.expires_header);
    match claim {
        Claim::InFlight {
            retry_after,
            expires_in,
        } => GatewayError::InFlight {
            retry_after,
            expires: expiry(expires_in),
        },
        Claim::Mismatch { expires_in } => GatewayError::Mismatch {
            expires: expiry(expires_in),
        },
        Claim::Held { reason, expires_in } => GatewayError::Held {
            reason,
            expires: expiry(expires_in),
        },
        Claim::Inquiring {
            retry_after,
            expires_in,
        } => GatewayError::Inquiring {
            retry_after,
            expires: expiry(expires_in),
        },
        Claim::Claimed { .. } | Claim::Replay(_) => {
            GatewayError::Internal("a claim or replay answered as a refusal".into())
        }
    }
}
