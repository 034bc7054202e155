//! The request pipeline of docs/DESIGN.md §2 (steps 1–5 here; the claimed
//! attempt in [`attempt`], its lease renewer in [`renew`]).
//! [`Gateway::handle`] turns every error into its problem response and logs
//! one line per request; `handle_inner` walks the steps with `?`.
//!
//! A claimed request is forwarded in a task of its own (G6): the client's
//! connection only waits for the answer, so a disconnect cannot interrupt the
//! upstream exchange or its record.

mod attempt;
mod orphans;
mod outcome;
mod renew;

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
use crate::config::{Config, OnStoreError, Route};
use crate::fingerprint::Fingerprinter;
use crate::idempotency_key as key;
use crate::metrics::{Metrics, RouteLabels};
use crate::problem::GatewayError;
use crate::store::{
    self, Claim, ClaimRequest, RecordKey, Store, StoreError, StoredResponse, Token,
};
use crate::upstream::{self, Upstream, UpstreamError, strip_hop_by_hop};

use orphans::Orphans;
pub use outcome::Outcome;

/// The header marking a replayed response.
pub const REPLAYED: &str = "idempotent-replayed";

/// What one request's log line reports besides its outcome.
#[derive(Default)]
struct Trace {
    route: Option<String>,
    key_digest: Option<String>,
    token: Option<Token>,
}

/// The gateway: routes, store, upstream client and the forward tasks in flight.
pub struct Gateway {
    routes: Vec<Arc<Route>>,
    store: Arc<dyn Store>,
    upstream: Upstream,
    tasks: TaskTracker,
    docs_url: Option<String>,
    body_read_timeout: Duration,
    /// Bytes of protected request bodies held at once.
    body_budget: Arc<Semaphore>,
    /// Claimed forwards at once.
    forward_slots: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    orphans: Orphans,
}

impl Gateway {
    /// Build a gateway over an opened store.
    pub fn new(config: &Config, store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        let tasks = TaskTracker::new();
        Self {
            routes: config.routes.iter().cloned().map(Arc::new).collect(),
            orphans: Orphans::start(store.clone(), metrics.clone(), &tasks),
            store,
            upstream: Upstream::new(connect_timeout(config)),
            tasks,
            docs_url: config.docs_url.clone(),
            body_read_timeout: config.body_read_timeout,
            body_budget: Arc::new(Semaphore::new(config.max_buffered_request_bytes)),
            forward_slots: Arc::new(Semaphore::new(config.max_forwards_in_flight)),
            metrics,
        }
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
        let path = request.uri().path().to_string();
        let mut trace = Trace::default();
        let (response, outcome) = match self.clone().handle_inner(request, client, &mut trace).await
        {
            Ok(done) => done,
            Err(error) => {
                let outcome = Outcome::of(&error);
                if error.status().is_server_error() {
                    tracing::warn!(error = %error, route = trace.route.as_deref(), "request failed");
                }
                (error.to_response(self.docs_url.as_deref()), outcome)
            }
        };
        self.metrics
            .request(trace.route.as_deref().unwrap_or("-"), outcome.as_str());
        tracing::info!(
            target: "idemgate::request",
            method = %method,
            path = %path,
            route = trace.route.as_deref().unwrap_or("-"),
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
        trace.route = Some(route.name.clone());

        // 2. Unprotected methods pass through untouched.
        if !route.protects(request.method()) {
            let response = self
                .forward_plain(&route, request.map(body::boxed), client)
                .await?;
            return Ok((response, Outcome::Passthrough));
        }

        // 3. The key.
        let (parts, incoming) = request.into_parts();
        let mut values = parts.headers.get_all(&route.key_header).iter();
        let key = match (values.next(), values.next()) {
            (None, _) if route.key_required => {
                return Err(GatewayError::MissingKey {
                    header: route.key_header.to_string(),
                });
            }
            (None, _) => {
                let request = Request::from_parts(parts, body::boxed(incoming));
                let response = self.forward_plain(&route, request, client).await?;
                return Ok((response, Outcome::Passthrough));
            }
            (Some(_), Some(_)) => Err(key::KeyError::Repeated),
            (Some(value), None) => key::parse(value),
        }
        .map_err(|reason| GatewayError::InvalidKey {
            header: route.key_header.to_string(),
            reason,
        })?;
        trace.key_digest = Some(hex::encode(&Sha256::digest(key.as_bytes())[..6]));

        // 4. The body, fingerprinted as it streams, within the limit.
        let limit = route.max_request_body;
        let too_large = GatewayError::BodyTooLarge { limit };
        let declared = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
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
            Ok(Ok(Collected::Over { .. })) => return Err(too_large),
            Ok(Err(BudgetedError::Spent)) => {
                return Err(GatewayError::Overloaded(
                    "budget for buffered request bodies (max_buffered_request_bytes)",
                ));
            }
            Ok(Err(BudgetedError::Body(e))) => return Err(GatewayError::BodyRead(e.to_string())),
            Err(_elapsed) => return Err(GatewayError::BodyTimeout { timeout }),
        };
        let fingerprint = fingerprinter.finish(&body);

        // 5. Claim.
        let record_key = RecordKey {
            route: route.name.clone(),
            scope: match &route.scope_header {
                Some(name) => store::scope_digest(
                    parts
                        .headers
                        .get_all(name)
                        .iter()
                        .map(HeaderValue::as_bytes),
                ),
                None => Vec::new(),
            },
            key,
        };
        // 5–7 in a task of its own (G6): from the claim on, a client that
        // goes away changes nothing — a committed claim is always forwarded
        // and settled, never left to lapse into `held`.
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
            let result = gateway
                .claim_and_forward(route, record_key, fingerprint, parts, body, client)
                .await;
            // The body and the response are no longer buffered here.
            drop((body_reservation, forward_slot));
            let _ = reply.send(result);
        });
        let (response, outcome, token) = answer.await.map_err(|_| {
            GatewayError::Internal("the forward task ended without an answer".into())
        })??;
        trace.token = token;
        Ok((response, outcome))
    }

    /// Claim the key, then answer from the claim or forward and settle.
    async fn claim_and_forward(
        self: Arc<Self>,
        route: Arc<Route>,
        record_key: RecordKey,
        fingerprint: crate::fingerprint::Fingerprint,
        parts: Parts,
        body: Bytes,
        client: SocketAddr,
    ) -> Result<(Response<Body>, Outcome, Option<Token>), GatewayError> {
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
                let (response, outcome) = self
                    .on_store_error(&route, parts, body, client, error)
                    .await?;
                return Ok((response, outcome, None));
            }
        };
        match claim {
            Claim::Replay(stored) => Ok((replay(stored), Outcome::Replayed, None)),
            Claim::InFlight { retry_after } => Err(GatewayError::InFlight { retry_after }),
            Claim::Mismatch => Err(GatewayError::Mismatch),
            Claim::Held(reason) => Err(GatewayError::Held(reason)),
            Claim::Claimed { token, takeover } => {
                if takeover {
                    tracing::warn!(route = %route.name, token, "took over a key whose lease lapsed");
                    self.metrics
                        .lease_takeovers
                        .get_or_create(&RouteLabels {
                            route: route.name.clone(),
                        })
                        .inc();
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
        let response = tokio::time::timeout(route.upstream_timeout, self.upstream.send(request))
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
