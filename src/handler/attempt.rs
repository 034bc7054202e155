//! One claimed attempt (pipeline steps 6–7): forward the request while the
//! lease is renewed, read the answer up to the route's cap, then settle the
//! record by a table of complete/over-cap × recordable/not, and answer.
//! Writes after the forward are retried for up to one lease: the upstream
//! has acted, so the record is worth waiting for.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use http::{Request, Response};

use super::{Gateway, Routed};
use crate::clock::Instant;
use crate::config::{Route, RouteMode};
use crate::metrics::Metrics;
use crate::problem::{GatewayError, KeyAfter, RecordExpiry};
use crate::request::body::{self, Body, Collected, Prefixed};
use crate::store::{Cas, HeldReason, RecordKey, StoreError, StoredResponse, Token, UnknownOutcome};
use crate::telemetry::spans;
use crate::upstream::{
    ExchangeError, IDEMPOTENCY_EXPIRES, UpstreamError, announce_expiry, read_up_to, recorded,
};

/// What the upstream answered within `upstream_timeout` (head and body up
/// to the route's cap), or why it did not.
type Exchange = Result<(http::response::Parts, Collected<hyper::body::Incoming>), ExchangeError>;

impl Gateway {
    /// Send the claimed request and read the answer up to the route's cap,
    /// within `upstream_timeout`; timed, and in a span of its own.
    async fn exchange(&self, route: &Routed, mut request: Request<Body>) -> Exchange {
        let started = Instant::now();
        let span = spans::upstream(&mut request);
        let cap = route.max_recorded_response;
        let exchange = spans::traced!(
            route.upstream().exchange(
                route.upstream_ca.as_ref(),
                request,
                route.upstream_timeout,
                |_, body| read_up_to(body, cap),
            ),
            span
        );
        let answered = exchange.as_ref().ok();
        spans::upstream_done(&span, answered.map(|(parts, _)| parts.status.as_u16()));
        let elapsed = started.elapsed().as_secs_f64();
        route.metrics.upstream_seconds.observe(elapsed);
        exchange
    }

    /// One claimed attempt: forward, capture, decide, persist, answer.
    pub(super) async fn attempt(
        self: &Arc<Self>,
        route: &Routed,
        key: &RecordKey,
        token: Token,
        request: Request<Body>,
    ) -> Result<Response<Body>, GatewayError> {
        let _renewer = self.renew_while_working(route, key, token);
        let _in_flight = InFlightGuard::new(&self.metrics);
        let (parts, collected) = match self.exchange(route, request).await {
            Err(ExchangeError::TimedOut) => {
                let (after, expires) = self
                    .settle_unknown(route, key, token, HeldReason::UpstreamTimeout)
                    .await?;
                return Err(GatewayError::UpstreamTimeout {
                    timeout: route.upstream_timeout,
                    key: after,
                    expires,
                });
            }
            Err(ExchangeError::Upstream(UpstreamError::NotSent(detail))) => {
                // Nothing reached the upstream: the key is free again.
                self.persist(route, || self.store.release(key, token))
                    .await
                    .map_err(GatewayError::RecordFailed)?;
                return Err(GatewayError::UpstreamUnreachable(detail));
            }
            Err(ExchangeError::Upstream(UpstreamError::Failed(detail))) => {
                let (after, expires) = self
                    .settle_unknown(route, key, token, HeldReason::UpstreamFailed)
                    .await?;
                return Err(GatewayError::UpstreamFailed {
                    detail,
                    key: after,
                    expires,
                });
            }
            Ok(done) => done,
        };
        // Window (b): the upstream has answered, nothing is recorded yet.
        kill_window!("after-upstream");

        // Settle by a table: is the status one the route records, and is
        // the body complete (within the cap) or not needed?
        let recordable = route.record.records(parts.status);
        // A recorded or held answer says until when its record is kept.
        let expires = route.announced_expiry().filter(|_| recordable);
        let body = match (collected, recordable) {
            (Collected::Complete(bytes), true) => {
                let stored = recorded(parts.status, &parts.headers, bytes.clone(), route, expires);
                self.record(route, key, token, stored).await?;
                body::full(bytes)
            }
            (Collected::Over { prefix, rest }, true) if !route.record_body => {
                // The body is not recorded, so its size does not matter.
                let stored = recorded(parts.status, &parts.headers, Bytes::new(), route, expires);
                self.record(route, key, token, stored).await?;
                body::boxed(Prefixed::new(prefix, rest))
            }
            (Collected::Complete(bytes), false) => {
                // Not a recordable status (5xx, 429, …): release, then send.
                self.release_or_warn(route, key, token).await;
                body::full(bytes)
            }
            (Collected::Over { prefix, rest }, false) => {
                // Not a recordable status anyway: release, then stream it on.
                self.release_or_warn(route, key, token).await;
                body::boxed(Prefixed::new(prefix, rest))
            }
            (Collected::Over { prefix, rest }, true) => {
                // Too large to record: hold the key, then forward this once.
                if route.mode == RouteMode::Shadow {
                    self.shadow_settle(route, key, token, None).await;
                } else {
                    let reason = HeldReason::ResponseTooLarge;
                    let write = || self.store.hold(key, token, reason, route.retention);
                    self.settled(route, write).await?;
                }
                body::boxed(Prefixed::new(prefix, rest))
            }
        };
        let mut parts = parts;
        match expires {
            Some(until) => announce_expiry(&mut parts.headers, until),
            // No record was written: no expiry, not even the upstream's.
            None if route.expires_header => {
                parts.headers.remove(IDEMPOTENCY_EXPIRES);
            }
            None => {}
        }
        Ok(Response::from_parts(parts, body))
    }

    /// Record the answer before it is sent (G5); a shadow route records it
    /// without letting a failure reach the answer.
    async fn record(
        self: &Arc<Self>,
        route: &Route,
        key: &RecordKey,
        token: Token,
        stored: StoredResponse,
    ) -> Result<(), GatewayError> {
        if route.mode == RouteMode::Shadow {
            self.shadow_settle(route, key, token, Some(stored)).await;
            return Ok(());
        }
        let write = || self.store.complete(key, token, &stored, route.retention);
        self.settled(route, write).await?;
        // Window (c): the record is durable, the client has nothing.
        kill_window!("after-complete");
        Ok(())
    }

    /// A settling write that must apply before the response is sent: a
    /// store failure is `RecordFailed`, a fenced write `LeaseLost`.
    pub(super) async fn settled<'a, F, Fut>(
        &self,
        route: &Route,
        write: F,
    ) -> Result<(), GatewayError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Cas, StoreError>> + 'a,
    {
        match self
            .persist(route, write)
            .await
            .map_err(GatewayError::RecordFailed)?
        {
            Cas::Applied => Ok(()),
            Cas::Fenced => Err(GatewayError::LeaseLost),
        }
    }

    /// Release a key whose response is not recorded; a failure only delays
    /// the next attempt (the lease lapses), so it is logged, not answered.
    async fn release_or_warn(&self, route: &Route, key: &RecordKey, token: Token) {
        let released = self.persist(route, || self.store.release(key, token)).await;
        if let Err(error) = released {
            tracing::warn!(route = %route.name, token, error = %error, "could not release the key; it stays in flight until its lease lapses");
        }
    }

    /// The outcome is unknown: hold the key, release it or inquire, per
    /// route; with when the record it leaves (held or inquiring) expires.
    /// (A shadow route forwards a retry whatever its key's state.)
    async fn settle_unknown(
        &self,
        route: &Route,
        key: &RecordKey,
        token: Token,
        reason: HeldReason,
    ) -> Result<(KeyAfter, Option<RecordExpiry>), GatewayError> {
        // Both writes keep the record at least a retention from after now.
        let written_from = SystemTime::now();
        let (written, after) = match route.on_unknown_outcome {
            UnknownOutcome::Hold => (
                self.persist(route, || {
                    self.store.hold(key, token, reason, route.retention)
                })
                .await,
                KeyAfter::Held,
            ),
            UnknownOutcome::Release => (
                self.persist(route, || self.store.release(key, token)).await,
                KeyAfter::Released,
            ),
            UnknownOutcome::Inquire => {
                // Validation gives every inquiring route its table.
                let after = route.inquiry.as_ref().map_or(Duration::ZERO, |i| i.after);
                let written = self
                    .persist(route, || {
                        self.store
                            .inquire(key, token, after, false, route.retention)
                    })
                    .await;
                (written, KeyAfter::Inquiring)
            }
        };
        // Fenced: a newer attempt or an inquirer took the key meanwhile
        // (this attempt's lease had lapsed); the client is told so, not
        // what this write would have done.
        let after = match written.map_err(GatewayError::RecordFailed)? {
            Cas::Applied => after,
            Cas::Fenced => KeyAfter::Superseded,
        };
        let after = match route.mode {
            RouteMode::Shadow => KeyAfter::Observed,
            RouteMode::Enforce => after,
        };
        let expires = matches!(after, KeyAfter::Held | KeyAfter::Inquiring)
            .then(|| RecordExpiry::after(written_from, route.retention, route.expires_header));
        Ok((after, expires))
    }

    /// Run a post-forward store write, retrying store errors with backoff
    /// for up to one lease (the answer is worth waiting for: the upstream
    /// has acted). Fencing is not an error and is returned at once.
    async fn persist<'a, F, Fut>(&self, route: &Route, mut op: F) -> Result<Cas, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Cas, StoreError>> + 'a,
    {
        let deadline = Instant::now() + route.lease;
        let mut delay = Duration::from_millis(50);
        loop {
            match op().await {
                Ok(cas) => return Ok(cas),
                Err(error) if Instant::now() + delay < deadline => {
                    tracing::warn!(route = %route.name, error = %error, "store write failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// Counts a claimed forward in `idemgate_forwards_in_flight` while alive.
struct InFlightGuard<'a>(&'a Metrics);

impl<'a> InFlightGuard<'a> {
    fn new(metrics: &'a Metrics) -> Self {
        metrics.forwards_in_flight.inc();
        Self(metrics)
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.forwards_in_flight.dec();
    }
}
