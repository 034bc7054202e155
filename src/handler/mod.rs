//! The request pipeline: [`Gateway::handle`] turns every error into its
//! problem response and logs one line per request; `handle_inner` walks the
//! steps in order, each in a file of its own:
//!
//! - 1: match the route (here);
//! - 2: pass unprotected methods through ([`passthrough`]);
//! - 3–4: read the key, the body and the fingerprint ([`intake`]);
//! - 5: claim, or wait for an in-flight key ([`claim`]);
//! - 6–7: forward the claimed attempt while renewing its lease, then
//!   record, release or hold ([`attempt`], [`renew`]).
//!
//! A claimed request is forwarded in a task of its own (G6): the client's
//! connection only waits for the answer, so a disconnect cannot interrupt the
//! upstream exchange or its record. Claims whose answer the store lost are
//! cleaned up by [`lost_claims`]; everything shadow mode decides differently
//! is in [`shadow`].

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
mod claim;
mod intake;
mod lost_claims;
mod outcome;
mod passthrough;
mod renew;
mod routes;
mod shadow;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{Request, Response};
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::clock::Instant;
use crate::config::{Config, Route};
use crate::logging::RequestLine;
use crate::metrics::{Metrics, RouteMetrics};
use crate::problem::GatewayError;
use crate::request::body::{self, Body, RequestBody};
use crate::store::waiters::Waiters;
use crate::store::{Store, Token};
use crate::telemetry::spans;

pub use crate::upstream::IDEMPOTENCY_ATTEMPT;
use intake::Intake;
use lost_claims::LostClaims;
use outcome::Answered;
pub use outcome::Outcome;
pub(crate) use routes::connect_timeout;
use routes::{RouteTable, Routed};

/// The header marking a replayed response.
pub const REPLAYED: &str = "idempotent-replayed";

/// What one request's log line reports besides its outcome.
#[derive(Default)]
struct Trace {
    route: Option<Arc<Routed>>,
    key_digest: Option<String>,
    token: Option<Token>,
}

/// The gateway: routes, store, upstream client and the forward tasks in flight.
pub struct Gateway {
    /// The routes in force, swapped whole by a reload ([`routes`]).
    table: ArcSwap<RouteTable>,
    store: Arc<dyn Store>,
    tasks: TaskTracker,
    docs_url: Option<String>,
    body_read_timeout: Duration,
    /// Bytes of protected request bodies held at once.
    body_budget: Arc<Semaphore>,
    /// Claimed forwards at once.
    forward_slots: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    /// The handles of requests no route matched (`route="-"`).
    unrouted: RouteMetrics,
    lost_claims: LostClaims,
    /// Requests waiting for a key (`concurrent = "wait"`), by key.
    waiters: Arc<Waiters>,
    /// Requests that may wait at once (`max_waiting`).
    wait_slots: Arc<Semaphore>,
    /// Body bytes waiting requests may hold at once: half of
    /// `max_buffered_request_bytes`, so duplicates parked in a wait can
    /// never take the whole budget from new requests.
    wait_bytes: Arc<Semaphore>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("routes", &self.table.load().len())
            .finish_non_exhaustive()
    }
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
        let unrouted = metrics.for_route("-", &Outcome::ALL.map(Outcome::as_str));
        let pools = config.server_threads + 1;
        Self {
            table: ArcSwap::from_pointee(RouteTable::new(&config.routes, pools, &metrics)),
            lost_claims: LostClaims::start(
                store.clone(),
                config.store.timeout,
                metrics.clone(),
                &tasks,
            ),
            store,
            tasks,
            docs_url: config.docs_url.clone(),
            body_read_timeout: config.body_read_timeout,
            body_budget: Arc::new(Semaphore::new(config.max_buffered_request_bytes)),
            forward_slots: Arc::new(Semaphore::new(config.max_forwards_in_flight)),
            metrics,
            unrouted,
            waiters,
            wait_slots: Arc::new(Semaphore::new(config.max_waiting)),
            wait_bytes: Arc::new(Semaphore::new(config.max_buffered_request_bytes / 2)),
        }
    }

    /// Serve `routes` from now on: requests already routed finish under
    /// the routes they started with (a reload, [`crate::reload`]).
    pub(crate) fn set_routes(&self, routes: &[Route]) {
        let next = self.table.load().next(routes, &self.metrics);
        self.table.store(Arc::new(next));
    }

    /// The forward tasks (and the lost-claim worker); graceful shutdown
    /// waits for them, after [`Gateway::finish`].
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Shutting down: background work ends once it has nothing pending.
    pub fn finish(&self) {
        self.lost_claims.finish();
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
        // 1. Route (here, so the request's span is named after it).
        let route = self.table.load().route_for(uri.path()).cloned();
        let span = spans::server(
            &method,
            uri.path(),
            request.headers(),
            route.as_deref().map(|r| &**r),
        );
        let mut trace = Trace::default();
        // Boxed: the pipeline's future is large, and the server moves the
        // one this returns several times before polling it; a box makes
        // each of those moves a pointer's copy (unboxed, the copies took
        // about a sixth of a pass-through's instructions: callgrind,
        // bench/instructions.sh).
        let inner = Box::pin(
            self.clone()
                .handle_inner(request, client, route, &mut trace),
        );
        let inner = spans::traced!(inner, span);
        let (response, outcome) = match inner {
            Ok(answered) => {
                trace.token = answered.token;
                (answered.response, answered.outcome)
            }
            Err(error) => {
                let outcome = Outcome::of(&error);
                if error.status().is_server_error() {
                    tracing::warn!(error = %error, route = trace.route.as_deref().map(|r| r.name.as_str()), "request failed");
                }
                (error.to_response(self.docs_url.as_deref()), outcome)
            }
        };
        let metrics = trace
            .route
            .as_deref()
            .map_or(&self.unrouted, |r| &r.metrics);
        metrics.request(outcome.index());
        let route = trace.route.as_deref().map(|r| r.name.as_str());
        let status = response.status().as_u16();
        let key = trace.key_digest.as_deref();
        spans::finish(&span, status, outcome.as_str(), key, trace.token);
        let trace_id = spans::trace_id(&span);
        RequestLine {
            method: &method,
            path: uri.path(),
            route: route.unwrap_or("-"),
            outcome: outcome.as_str(),
            status,
            latency: started.elapsed(),
            key: key.unwrap_or("-"),
            token: trace.token,
            trace_id: trace_id.as_deref(),
        }
        .log();
        response
    }

    /// The pipeline's steps, in order, from the route (step 1) on.
    async fn handle_inner(
        self: Arc<Self>,
        request: Request<RequestBody>,
        client: SocketAddr,
        route: Option<Arc<Routed>>,
        trace: &mut Trace,
    ) -> Result<Answered, GatewayError> {
        let route = route.ok_or_else(|| GatewayError::NoRoute {
            path: request.uri().path().to_string(),
        })?;
        trace.route = Some(route.clone());

        // 2. Unprotected methods pass through untouched.
        if !route.protects(request.method()) {
            let request = request.map(body::boxed);
            return self.pass_through(&route, request, client).await;
        }

        // 3–4. The key, the body within its limit, the fingerprint.
        let claiming = match self.intake(route, request, client, trace).await? {
            Intake::Claim(claiming) => claiming,
            Intake::Answered(answered) => return Ok(answered),
        };

        // 5. A replay the replay cache holds is answered here: it writes
        // nothing, so it needs no task of its own.
        if let Some(answered) = self.replay_at_hand(&claiming) {
            return Ok(answered);
        }

        // 5–7. Claim, forward, record: in a task of its own (G6), so from
        // the claim on a client that goes away changes nothing.
        if claiming.waits() {
            self.claim_or_wait(claiming).await
        } else {
            self.claim_in_task(claiming).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{MINIMAL, parse};
    use crate::serving_threads::ServingThreads;
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
        assert_eq!(gateway.table.load().upstreams().len(), 3);
        let pool_of = |gateway: &Gateway| {
            let table = gateway.table.load();
            let route = table.route_for("/v1/payments/1").unwrap();
            let used = route.upstream();
            table
                .upstreams()
                .iter()
                .position(|pool| std::ptr::eq(pool, used))
        };
        let elsewhere = gateway.clone();
        let off_threads = std::thread::spawn(move || pool_of(&elsewhere))
            .join()
            .unwrap();
        assert_eq!(off_threads, Some(2));
        assert_eq!(pool_of(&gateway), Some(2), "the test's own runtime");
        let threads = ServingThreads::start(2).unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        threads
            .on_each(|| {
                let (gateway, seen) = (gateway.clone(), seen.clone());
                async move {
                    let pool = pool_of(&gateway);
                    let core = crate::serving_threads::current();
                    seen.lock().unwrap().push((core, pool));
                }
            })
            .await;
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_unstable();
        assert_eq!(seen, [(Some(0), Some(0)), (Some(1), Some(1))]);
        threads.stop().await;
    }
}
