//! The request pipeline of docs/DESIGN.md §2 (steps 1–5 here; the claimed
//! attempt in [`attempt`], its lease renewer in [`renew`]).
//! [`Gateway::handle`] turns every error into its problem response and logs
//! one line per request; `handle_inner` walks the steps with `?`.
//!
//! A claimed request is forwarded in a task of its own (G6): the client's
//! connection only waits for the answer, so a disconnect cannot interrupt the
//! upstream exchange or its record.

/// A kill window for the chaos harness (test builds only): once the
/// `FAILPOINTS` environment variable arms `$name` (e.g.
/// `after-claim=20*off->return`), reaching it names the window on stderr and
/// aborts the process, as abruptly as a SIGKILL (no destructor, no pending
/// write runs). Without the `fail` crate's `failpoints` feature, which only
/// the dev-dependency turns on, this expands to nothing.
macro_rules! kill_window {
    ($name:literal) => {
        fail::fail_point!($name, |_| {
            eprintln!(concat!("idemgate: failpoint ", $name, " hit: aborting"));
            std::process::abort()
        })
    };
}

mod attempt;
mod orphans;
mod outcome;
mod renew;
mod shadow;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use sha2::{Digest, Sha256};
use tokio::sync::{Semaphore, oneshot};
use tokio_util::task::TaskTracker;

use crate::body::{self, Body, Budgeted, BudgetedError, Collected, RequestBody, collect_up_to};
use crate::clock::Instant;
use crate::config::{Concurrent, Config, OnStoreError, Route, RouteMode};
use crate::fingerprint::Fingerprinter;
use crate::json_body::JsonBody;
use crate::key_source::{self, Found, PartError};
use crate::metrics::{Metrics, RouteMetrics, WakeupLabels};
use crate::problem::GatewayError;
use crate::store::{
    self, Claim, ClaimRequest, RecordKey, Store, StoreError, StoredResponse, Token,
};
use crate::upstream::{self, Upstream, UpstreamError, strip_hop_by_hop};
use crate::waiters::{Waiters, wake_id};

use orphans::Orphans;
pub use outcome::Outcome;
use shadow::Would;

/// The header marking a replayed response.
pub const REPLAYED: &str = "idempotent-replayed";

/// What one request's log line reports besides its outcome.
#[derive(Default)]
struct Trace {
    route: Option<Arc<Route>>,
    key_digest: Option<String>,
    token: Option<Token>,
}

/// The gateway: routes, store, upstream client and the forward tasks in flight.
pub struct Gateway {
    routes: Vec<Arc<Route>>,
    store: Arc<dyn Store>,
    /// One upstream pool per serving thread (`server_threads`), and a last
    /// one for every other thread (the only one when connections are
    /// served on the shared runtime): [`Gateway::upstream`].
    upstreams: Vec<Upstream>,
    tasks: TaskTracker,
    docs_url: Option<String>,
    body_read_timeout: Duration,
    /// Bytes of protected request bodies held at once.
    body_budget: Arc<Semaphore>,
    /// Claimed forwards at once.
    forward_slots: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    /// Each route's metric handles, by route name.
    route_metrics: HashMap<String, RouteMetrics>,
    /// The handles of requests no route matched (`route="-"`).
    unrouted: RouteMetrics,
    orphans: Orphans,
    /// Requests waiting for a key (`concurrent = "wait"`), by key.
    waiters: Arc<Waiters>,
    /// Requests that may wait at once (`max_waiting`).
    wait_slots: Arc<Semaphore>,
    /// Body bytes waiting requests may hold at once: half of
    /// `max_buffered_request_bytes`, so duplicates parked in a wait can
    /// never take the whole budget from new requests.
    wait_bytes: Arc<Semaphore>,
}

impl Gateway {
    /// Build a gateway over an opened store; `waiters` are woken by the
    /// store's relay ([`crate::store::StoreAdmin::relay_wakeups`]).
    pub fn new(
        config: &Config,
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        waiters: Arc<Waiters>,
    ) -> Self {
        let tasks = TaskTracker::new();
        let outcomes = Outcome::ALL.map(Outcome::as_str);
        let route_metrics = config
            .routes
            .iter()
            .map(|r| (r.name.clone(), metrics.for_route(&r.name, &outcomes)))
            .collect();
        let unrouted = metrics.for_route("-", &outcomes);
        Self {
            routes: config.routes.iter().cloned().map(Arc::new).collect(),
            orphans: Orphans::start(store.clone(), metrics.clone(), &tasks),
            store,
            upstreams: (0..=config.server_threads)
                .map(|_| {
                    Upstream::new(
                        connect_timeout(config),
                        config
                            .routes
                            .iter()
                            .filter(|r| r.upstream.scheme_str() == Some("https"))
                            .map(|r| r.upstream_ca.as_ref()),
                    )
                })
                .collect(),
            tasks,
            docs_url: config.docs_url.clone(),
            body_read_timeout: config.body_read_timeout,
            body_budget: Arc::new(Semaphore::new(config.max_buffered_request_bytes)),
            forward_slots: Arc::new(Semaphore::new(config.max_forwards_in_flight)),
            metrics,
            route_metrics,
            unrouted,
            waiters,
            wait_slots: Arc::new(Semaphore::new(config.max_waiting)),
            wait_bytes: Arc::new(Semaphore::new(config.max_buffered_request_bytes / 2)),
        }
    }

    /// The upstream pool of the serving thread this runs on: a request's
    /// upstream connections stay on the thread that serves its client.
    /// Work on any other thread (the shared runtime) has a pool of its own,
    /// so it never uses connections a serving thread's runtime drives (and
    /// drops when that thread ends).
    fn upstream(&self) -> &Upstream {
        let last = self.upstreams.len() - 1;
        let pool = crate::server::cores::current().map_or(last, |core| core.min(last));
        &self.upstreams[pool]
    }

    /// A route's metric handles (`None`: no route matched).
    fn metrics_of(&self, route: Option<&str>) -> &RouteMetrics {
        route
            .and_then(|name| self.route_metrics.get(name))
            .unwrap_or(&self.unrouted)
    }

    /// The forward tasks (and the lost-claim worker); graceful shutdown
    /// waits for them, after [`Gateway::finish`].
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Shutting down: background work ends once it has nothing pending.
    pub fn finish(&self) {
        self.orphans.finish();
    }

    fn route_for(&self, path: &str) -> Option<&Arc<Route>> {
        self.routes
            .iter()
            .filter_map(|r| r.path.matches(path).map(|score| (score, r)))
            .max_by_key(|(score, _)| *score)
            .map(|(_, r)| r)
    }

    /// Answer one request; never fails (errors become problem responses).
    pub async fn handle(
        self: Arc<Self>,
        request: Request<RequestBody>,
        client: SocketAddr,
    ) -> Response<Body> {
        let started = Instant::now();
        let method = request.method().clone();
        let uri = request.uri().clone();
        let mut trace = Trace::default();
        let (response, outcome) = match self.clone().handle_inner(request, client, &mut trace).await
        {
            Ok(done) => done,
            Err(error) => {
                let outcome = Outcome::of(&error);
                if error.status().is_server_error() {
                    tracing::warn!(error = %error, route = trace.route.as_deref().map(|r| r.name.as_str()), "request failed");
                }
                (error.to_response(self.docs_url.as_deref()), outcome)
            }
        };
        let route = trace.route.as_deref().map(|r| r.name.as_str());
        self.metrics_of(route).request(outcome.index());
        tracing::info!(
            target: "idemgate::request",
            method = %method,
            path = %uri.path(),
            route = route.unwrap_or("-"),
            outcome = outcome.as_str(),
            status = response.status().as_u16(),
            latency_ms = started.elapsed().as_secs_f64() * 1000.0,
            key = trace.key_digest.as_deref().unwrap_or("-"),
            token = trace.token,
            "request"
        );
        response
    }

    async fn handle_inner(
        self: Arc<Self>,
        request: Request<RequestBody>,
        client: SocketAddr,
        trace: &mut Trace,
    ) -> Result<(Response<Body>, Outcome), GatewayError> {
        // 1. Route.
        let route = self
            .route_for(request.uri().path())
            .cloned()
            .ok_or_else(|| GatewayError::NoRoute {
                path: request.uri().path().to_string(),
            })?;
        trace.route = Some(route.clone());

        // 2. Unprotected methods pass through untouched.
        if !route.protects(request.method()) {
            let response = self
                .forward_plain(&route, request.map(body::boxed), client)
                .await?;
            return Ok((response, Outcome::Passthrough));
        }

        // 3. The key, when the head carries it (a part in the body is read
        // after the body, in 5).
        let (parts, incoming) = request.into_parts();
        let shadow = route.mode == RouteMode::Shadow;
        let head_key = if route.key_reads_body() {
            None
        } else {
            let found = key_source::key(&route.key_from, &parts, None);
            match self.key_or_forward(&route, found) {
                Ok(key) => Some(key),
                Err(answer) => {
                    let request = Request::from_parts(parts, body::boxed(incoming));
                    return self.answer(&route, answer, request, client).await;
                }
            }
        };
        if let Some(key) = &head_key {
            trace.key_digest = Some(key_digest(key));
        }

        // 4. The body, fingerprinted as it streams, within the limit.
        let limit = route.max_request_body;
        let too_large = GatewayError::BodyTooLarge { limit };
        let declared = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            if shadow {
                let request = Request::from_parts(parts, body::boxed(incoming));
                let response = self.forward_plain(&route, request, client).await?;
                return Ok((response, Outcome::Passthrough));
            }
            return Err(too_large);
        }
        // The body's bytes are paid for from the shared budget as they
        // arrive, and the payment is held until its forward ends: a body the
        // budget cannot cover gets 503 before anything is claimed.
        let mut body_reservation = None;
        let mut fingerprinter = Fingerprinter::new(&route.fingerprint, &parts);
        let timeout = self.body_read_timeout;
        let budgeted = Budgeted::new(incoming, &self.body_budget, &mut body_reservation);
        let read = collect_up_to(budgeted, limit, |chunk| fingerprinter.update(chunk));
        let body = match tokio::time::timeout(timeout, read).await {
            Ok(Ok(Collected::Complete(bytes))) => bytes,
            Ok(Ok(Collected::Over { prefix, rest })) if shadow => {
                // Forwarded as it streams: the part read, then the rest.
                let body = body::boxed(body::Prefixed::new(prefix, rest.into_inner()));
                let request = Request::from_parts(parts, body);
                let response = self.forward_plain(&route, request, client).await?;
                return Ok((response, Outcome::Passthrough));
            }
            Ok(Ok(Collected::Over { .. })) => return Err(too_large),
            Ok(Err(BudgetedError::Spent)) => {
                return Err(GatewayError::Overloaded(
                    "budget for buffered request bodies (max_buffered_request_bytes)",
                ));
            }
            Ok(Err(BudgetedError::Body(e))) => return Err(GatewayError::BodyRead(e.to_string())),
            Err(_elapsed) => return Err(GatewayError::BodyTimeout { timeout }),
        };

        // 4b. The key and scope parts in the body (parsed once, for them and
        // for the fingerprint).
        let json = if route.parses_json() {
            JsonBody::parse(&body)
        } else {
            None
        };
        let key = match head_key {
            Some(key) => key,
            None => {
                let found = key_source::key(&route.key_from, &parts, json.as_ref());
                match self.key_or_forward(&route, found) {
                    Ok(key) => {
                        trace.key_digest = Some(key_digest(&key));
                        key
                    }
                    Err(answer) => {
                        let request = Request::from_parts(parts, body::full(body));
                        let answered = self.answer(&route, answer, request, client).await;
                        drop(body_reservation);
                        return answered;
                    }
                }
            }
        };
        let scope = match key_source::scope(&route.scope_from, &parts, json.as_ref()) {
            Ok(scope) => scope,
            Err(error) => {
                let answer = self.instead_of_invalid(&route, error);
                let request = Request::from_parts(parts, body::full(body));
                let answered = self.answer(&route, answer, request, client).await;
                drop(body_reservation);
                return answered;
            }
        };
        let fingerprint = fingerprinter.finish(&body, json);

        // 5. Claim.
        let record_key = RecordKey {
            route: route.name.clone(),
            scope,
            key,
        };
        // 5–7 in a task of its own (G6): from the claim on, a client that
        // goes away changes nothing — a committed claim is always forwarded
        // and settled, never left to lapse into `held`.
        let claim = Claiming {
            route,
            record_key,
            fingerprint,
            parts,
            body,
            client,
            // The body's bytes stay paid for until the last task using them ends.
            reservation: Arc::new(body_reservation),
            after_waiting: false,
        };
        let waits =
            claim.route.concurrent == Concurrent::Wait && claim.route.mode == RouteMode::Enforce;
        let (response, outcome, token) = if waits {
            self.claim_or_wait(claim).await?
        } else {
            self.claim_in_task(claim).await?
        };
        trace.token = token;
        Ok((response, outcome))
    }

    /// Claim (and forward) in a task of its own.
    async fn claim_in_task(
        self: &Arc<Self>,
        claim: Claiming,
    ) -> Result<(Response<Body>, Outcome, Option<Token>), GatewayError> {
        let forward_slot = self
            .forward_slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                GatewayError::Overloaded("budget for forwards in flight (max_forwards_in_flight)")
            })?;
        let (reply, answer) = oneshot::channel();
        let gateway = self.clone();
        self.tasks.spawn(async move {
            // The claim's body reservation ends with it.
            let result = gateway.claim_and_forward(claim).await;
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
    async fn claim_or_wait(
        self: &Arc<Self>,
        claim: Claiming,
    ) -> Result<(Response<Body>, Outcome, Option<Token>), GatewayError> {
        let started = Instant::now();
        let deadline = started + claim.route.wait_timeout;
        let signal = self.waiters.register(wake_id(&claim.record_key));
        let mut waiting: Option<Waiting> = None;
        let mut claim = claim;
        let mut retry_after = Duration::ZERO;
        loop {
            // Listening before the claim: a wake between its answer and the
            // wait below is kept.
            let notified = signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            claim.after_waiting = waiting.is_some();
            match self.claim_in_task(claim.clone()).await {
                Err(GatewayError::InFlight { retry_after: left }) => retry_after = left,
                // The store is away while this request waits: the first
                // attempt may still answer; wait on.
                Err(GatewayError::StoreUnavailable(error)) if waiting.is_some() => {
                    tracing::debug!(%error, "store error while waiting; waiting on");
                }
                Ok((response, Outcome::Replayed, token)) if waiting.is_some() => {
                    return Ok((response, Outcome::WaitedReplay, token));
                }
                other => return other,
            }
            if waiting.is_none() {
                waiting = Some(
                    Waiting::start(self, claim.body.len())
                        .ok_or(GatewayError::InFlight { retry_after })?,
                );
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
    async fn claim_and_forward(
        self: Arc<Self>,
        claim: Claiming,
    ) -> Result<(Response<Body>, Outcome, Option<Token>), GatewayError> {
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
        let claim = self
            .store
            .claim(&ClaimRequest {
                key: &record_key,
                fingerprint: &fingerprint,
                attempt,
                lease: route.lease,
                retention: route.retention,
                on_unknown_outcome: route.on_unknown_outcome,
            })
            .await;
        let claim = match claim {
            Ok(claim) => claim,
            Err(error) => {
                if let StoreError::Unavailable(_) = error {
                    // The claim may commit once the store resumes although
                    // this request is never forwarded under it.
                    self.orphans
                        .report(&route.name, record_key, attempt, route.lease);
                }
                if after_waiting {
                    return Err(GatewayError::StoreUnavailable(error));
                }
                if route.mode == RouteMode::Shadow {
                    // A store error never blocks a shadow route.
                    tracing::warn!(route = %route.name, error = %error, "store error on a shadow route: forwarded");
                    let request = Request::from_parts(parts, body::full(body));
                    let response = self.forward_plain(&route, request, client).await?;
                    return Ok((response, Outcome::FailOpen, None));
                }
                let (response, outcome) = self
                    .on_store_error(&route, parts, body, client, error)
                    .await?;
                return Ok((response, outcome, None));
            }
        };
        if route.mode == RouteMode::Shadow {
            let would = match &claim {
                Claim::Claimed { .. } => Would::Forward,
                Claim::Replay(_) => Would::Replay,
                Claim::InFlight { .. } => Would::Conflict,
                Claim::Mismatch => Would::Mismatch,
                Claim::Held(_) => Would::Held,
            };
            shadow::report(
                &self.metrics,
                &route.name,
                would,
                Some(&key_digest(&record_key.key)),
            );
            if would != Would::Forward {
                let request = Request::from_parts(parts, body::full(body));
                let response = self.forward_plain(&route, request, client).await?;
                return Ok((response, Outcome::Passthrough, None));
            }
        }
        match claim {
            Claim::Replay(stored) => Ok((replay(stored), Outcome::Replayed, None)),
            Claim::InFlight { retry_after } => Err(GatewayError::InFlight { retry_after }),
            Claim::Mismatch => Err(GatewayError::Mismatch),
            Claim::Held(reason) => Err(GatewayError::Held(reason)),
            Claim::Claimed { token, takeover } => {
                // Window (a): the claim has committed, nothing was sent.
                kill_window!("after-claim");
                if takeover {
                    tracing::warn!(route = %route.name, token, "took over a key whose lease lapsed");
                    self.metrics_of(Some(&route.name)).lease_takeovers.inc();
                }
                let request = upstream::prepare(
                    Request::from_parts(parts, body::full(body)),
                    &route.upstream,
                    client,
                    |name| route.travels_end_to_end(name),
                );
                let response = self.attempt(&route, &record_key, token, request).await?;
                Ok((response, Outcome::Forwarded, Some(token)))
            }
        }
    }

    /// The key, or what to do instead: a problem (enforce), or a forward
    /// without idempotency (no key on a route that does not require one; in
    /// shadow mode, any key problem, counted as what enforcing would do).
    fn key_or_forward(
        &self,
        route: &Route,
        found: Result<Found, PartError>,
    ) -> Result<String, Instead> {
        match found {
            Ok(Found::Key(key)) => Ok(key),
            Ok(Found::Missing(_)) if !route.key_required => Err(Instead::Forward),
            Ok(Found::Missing(part)) => {
                Err(
                    self.instead(route, Would::MissingKey, || GatewayError::MissingKey {
                        part,
                    }),
                )
            }
            Err(error) => Err(self.instead_of_invalid(route, error)),
        }
    }

    /// What a key or scope part that is present but unusable gets.
    fn instead_of_invalid(&self, route: &Route, error: PartError) -> Instead {
        self.instead(route, Would::InvalidKey, || invalid_key(error))
    }

    /// `problem` when enforcing; a counted forward in shadow mode.
    fn instead(
        &self,
        route: &Route,
        would: Would,
        problem: impl FnOnce() -> GatewayError,
    ) -> Instead {
        if route.mode == RouteMode::Shadow {
            shadow::report(&self.metrics, &route.name, would, None);
            Instead::Forward
        } else {
            Instead::Problem(problem())
        }
    }

    /// Carry out an [`Instead`].
    async fn answer(
        &self,
        route: &Route,
        instead: Instead,
        request: Request<Body>,
        client: SocketAddr,
    ) -> Result<(Response<Body>, Outcome), GatewayError> {
        match instead {
            Instead::Problem(error) => Err(error),
            Instead::Forward => {
                let response = self.forward_plain(route, request, client).await?;
                Ok((response, Outcome::Passthrough))
            }
        }
    }

    /// G8: fail closed (503) or fail open (forward without idempotency).
    /// Only an outage fails open: a store that answered with something
    /// unreadable, or a full memory store, never lets a request bypass it.
    async fn on_store_error(
        &self,
        route: &Route,
        parts: Parts,
        body: Bytes,
        client: SocketAddr,
        error: StoreError,
    ) -> Result<(Response<Body>, Outcome), GatewayError> {
        match (route.on_store_error, &error) {
            (OnStoreError::FailOpen, StoreError::Unavailable(_)) => {
                tracing::warn!(route = %route.name, error = %error, "store unavailable: forwarding WITHOUT idempotency (on_store_error = fail_open)");
                let request = Request::from_parts(parts, body::full(body));
                let response = self.forward_plain(route, request, client).await?;
                Ok((response, Outcome::FailOpen))
            }
            _ => Err(GatewayError::StoreUnavailable(error)),
        }
    }

    /// Proxy a request with no idempotency: streamed both ways, bounded by
    /// `upstream_timeout` until the response head arrives.
    async fn forward_plain(
        &self,
        route: &Route,
        request: Request<Body>,
        client: SocketAddr,
    ) -> Result<Response<Body>, GatewayError> {
        let end_to_end = |name: &http::HeaderName| route.travels_end_to_end(name);
        let request = upstream::prepare(request, &route.upstream, client, end_to_end);
        let sent = self.upstream().send(route.upstream_ca.as_ref(), request);
        let response = tokio::time::timeout(route.upstream_timeout, sent)
            .await
            .map_err(|_| GatewayError::UpstreamTimeout {
                timeout: route.upstream_timeout,
                held: false,
            })?
            .map_err(|e| match e {
                UpstreamError::NotSent(detail) => GatewayError::UpstreamUnreachable(detail),
                UpstreamError::Failed(detail) => GatewayError::UpstreamFailed {
                    detail,
                    held: false,
                },
            })?;
        let (mut parts, incoming) = response.into_parts();
        to_client(&mut parts);
        Ok(Response::from_parts(parts, body::boxed(incoming)))
    }
}

/// At most 5 s, and half of the shortest `upstream_timeout`: connecting must
/// fail (nothing sent) before the exchange times out (outcome unknown).
fn connect_timeout(config: &Config) -> Duration {
    let shortest = config.routes.iter().map(|r| r.upstream_timeout).min();
    shortest.map_or(Duration::from_secs(5), |t| {
        (t / 2).min(Duration::from_secs(5))
    })
}

/// Make an upstream response head fit for the client: no hop-by-hop
/// headers, and the version left to the client's own connection (an
/// HTTP/1.0 upstream must not turn the answer into HTTP/1.0).
pub(crate) fn to_client(parts: &mut http::response::Parts) {
    strip_hop_by_hop(&mut parts.headers);
    parts.version = http::Version::default();
}

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
struct Claiming {
    route: Arc<Route>,
    record_key: RecordKey,
    fingerprint: crate::fingerprint::Fingerprint,
    parts: Parts,
    body: Bytes,
    client: SocketAddr,
    reservation: Arc<Option<tokio::sync::OwnedSemaphorePermit>>,
    /// Claimed again by a request that waited: the key is known to be in
    /// flight, so a store error is returned as such and never fails open.
    after_waiting: bool,
}

/// A request counted as waiting (`idemgate_waiting`, `max_waiting`, and
/// its body against the waiters' share of the body budget) while alive.
struct Waiting {
    _slot: tokio::sync::OwnedSemaphorePermit,
    _bytes: Option<tokio::sync::OwnedSemaphorePermit>,
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

/// What a request without a usable key gets instead of a claim.
enum Instead {
    /// This problem.
    Problem(GatewayError),
    /// Forwarded without idempotency.
    Forward,
}

/// A key as logs show it: the first 12 hex digits of its SHA-256.
fn key_digest(key: &str) -> String {
    hex::encode(&Sha256::digest(key.as_bytes())[..6])
}

fn invalid_key(error: PartError) -> GatewayError {
    GatewayError::InvalidKey {
        part: error.part,
        reason: error.reason,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{MINIMAL, parse};
    use crate::server::cores::Cores;
    use crate::store::memory::MemoryStore;

    /// Each serving thread forwards through its own upstream pool; any
    /// other thread (the shared runtime's background work) through the
    /// last, never a serving thread's.
    #[tokio::test]
    async fn each_thread_has_its_upstream_pool() {
        let config = parse(&format!("server_threads = 2\n{MINIMAL}")).unwrap();
        let gateway = Arc::new(Gateway::new(
            &config,
            Arc::new(MemoryStore::new(16)),
            Arc::new(Metrics::new()),
            Waiters::new(),
        ));
        assert_eq!(gateway.upstreams.len(), 3);
        let pool_of = |gateway: &Gateway| {
            let used = gateway.upstream();
            gateway
                .upstreams
                .iter()
                .position(|pool| std::ptr::eq(pool, used))
        };
        let elsewhere = gateway.clone();
        let off_threads = std::thread::spawn(move || pool_of(&elsewhere))
            .join()
            .unwrap();
        assert_eq!(off_threads, Some(2));
        assert_eq!(pool_of(&gateway), Some(2), "the test's own runtime");
        let cores = Cores::start(2).unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        cores
            .on_each(|| {
                let (gateway, seen) = (gateway.clone(), seen.clone());
                async move {
                    let pool = pool_of(&gateway);
                    let core = crate::server::cores::current();
                    seen.lock().unwrap().push((core, pool));
                }
            })
            .await;
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_unstable();
        assert_eq!(seen, [(Some(0), Some(0)), (Some(1), Some(1))]);
        cores.stop().await;
    }
}
