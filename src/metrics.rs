//! Prometheus metrics, served on the admin listener's `/metrics`. Names
//! and labels are stable; docs/src/reference/metrics.md lists them. Store operations are measured by [`InstrumentedStore`], a
//! [`Store`] that wraps the real one, so no backend carries metrics code.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::store::{
    AttemptId, Cas, Claim, ClaimRequest, HeldReason, RecordKey, Store, StoreError, StoredResponse,
    Token,
};

/// `route` and `outcome` of a request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The route's name (`-` when no route matched).
    pub route: String,
    /// The request's outcome (see `handler::Outcome`).
    pub outcome: &'static str,
}

/// A route.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route's name.
    pub route: String,
}

/// A lease renewal's route and result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RenewalLabels {
    /// The route's name.
    pub route: String,
    /// `applied`, `fenced` or `error`.
    pub result: &'static str,
}

/// What became of a claim whose answer was lost.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LostClaimLabels {
    /// The route's name.
    pub route: String,
    /// `abandoned` (the record it created was removed), `absent` (it
    /// created none), `dropped` (too many pending: not tried) or `gave_up`
    /// (the store did not answer in time).
    pub result: &'static str,
}

/// What a route in shadow mode would have done.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShadowLabels {
    /// The route's name.
    pub route: String,
    /// `forward`, `replay`, `conflict`, `mismatch`, `held`, `missing_key`
    /// or `invalid_key`.
    pub would: &'static str,
}

/// Why a waiting request claimed again.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WakeupLabels {
    /// `store` (the store announced the key settled) or `poll` (the slow
    /// poll, when no announcement came).
    pub cause: &'static str,
}

/// How the Redis front answered a claim.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FrontAnswerLabels {
    /// `replay`, `conflict`, `mismatch` or `held`.
    pub answer: &'static str,
}

/// A store operation and its result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    /// `claim`, `renew`, `complete`, `release`, `hold`, `abandon`, `sweep` or `ping`.
    pub op: &'static str,
    /// `ok`, `fenced` or `error`.
    pub result: &'static str,
}

/// `idemgate_log_lines_dropped_total`, read from the logger at scrape time.
#[derive(Debug)]
struct DroppedLogLines;

impl EncodeMetric for DroppedLogLines {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&crate::logging::dropped_lines(), None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// A counter whose value is kept elsewhere (a store's own tally) and
/// copied in at scrape time.
#[derive(Debug, Clone, Default)]
pub struct ScrapedCounter(Arc<std::sync::atomic::AtomicU64>);

impl ScrapedCounter {
    /// The tally's current value (it only grows).
    pub fn set(&self, value: u64) {
        self.0.store(value, std::sync::atomic::Ordering::Relaxed);
    }
}

impl prometheus_client::metrics::TypedMetric for ScrapedCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for ScrapedCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let value = self.0.load(std::sync::atomic::Ordering::Relaxed);
        encoder.encode_counter::<NoLabelSet, _, u64>(&value, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

fn latency_histogram() -> Histogram {
    // 0.25 ms … ~8 s.
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

/// Every metric idemgate exports.
pub struct Metrics {
    registry: Registry,
    /// `idemgate_requests_total{route, outcome}`.
    pub requests: Family<RequestLabels, Counter>,
    /// `idemgate_upstream_duration_seconds{route}`: claimed forwards, until the response is read.
    pub upstream_seconds: Family<RouteLabels, Histogram, fn() -> Histogram>,
    /// `idemgate_store_duration_seconds{op, result}`.
    pub store_seconds: Family<StoreLabels, Histogram, fn() -> Histogram>,
    /// `idemgate_forwards_in_flight`: claimed forwards running now.
    pub forwards_in_flight: Gauge,
    /// `idemgate_waiting`: requests waiting for a key (`concurrent = "wait"`).
    pub waiting: Gauge,
    /// `idemgate_wait_wakeups_total{cause}`.
    pub wait_wakeups: Family<WakeupLabels, Counter>,
    /// `idemgate_lease_renewals_total{route, result}`.
    pub lease_renewals: Family<RenewalLabels, Counter>,
    /// `idemgate_lease_takeovers_total{route}`: keys taken over after a lapsed lease.
    pub lease_takeovers: Family<RouteLabels, Counter>,
    /// `idemgate_orphaned_claims_total`.
    pub orphaned_claims: Family<LostClaimLabels, Counter>,
    /// `idemgate_shadow_total{route, would}`: what shadow routes would have done.
    pub shadow: Family<ShadowLabels, Counter>,
    /// `idemgate_records_swept_total`.
    pub records_swept: Counter,
    /// `idemgate_replay_cache_hits_total`: claims answered from the replay cache.
    pub replay_cache_hits: Counter,
    /// `idemgate_store_pool_connections`: connections the store pool holds.
    pub pool_connections: Gauge,
    /// `idemgate_store_pool_idle_connections`.
    pub pool_idle: Gauge,
    /// `idemgate_store_pool_max_connections`: the pool's size limit.
    pub pool_max: Gauge,
    /// `idemgate_store_batches_total`: batches of claims and completions
    /// (PostgreSQL), each one round trip and one commit.
    pub store_batches: ScrapedCounter,
    /// `idemgate_store_batched_operations_total`: operations they carried.
    pub store_batched_operations: ScrapedCounter,
    /// `idemgate_store_batch_splits_total`: batches refused as a whole and
    /// run again one operation at a time.
    pub store_batch_splits: ScrapedCounter,
    /// The Redis front's figures (`[store.front]`), copied in at scrape time.
    pub front: FrontMetrics,
}

/// `idemgate_front_*`: what the Redis front of the PostgreSQL store did
/// (zero without `[store.front]`).
#[derive(Debug, Clone, Default)]
pub struct FrontMetrics {
    /// `idemgate_front_up`: 1 while this instance uses the front.
    pub up: Gauge,
    /// `idemgate_front_answers_total{answer}`: claims the front answered.
    pub answers: Family<FrontAnswerLabels, ScrapedCounter>,
    /// `idemgate_front_misses_total`: claims it passed to PostgreSQL.
    pub misses: ScrapedCounter,
    /// `idemgate_front_marks_total`: in-flight markers written (attempts
    /// still unsettled after `mark_after`).
    pub marks: ScrapedCounter,
    /// `idemgate_front_errors_total`: front operations that failed.
    pub errors: ScrapedCounter,
    /// `idemgate_front_outages_total`: times this instance stopped using it.
    pub outages: ScrapedCounter,
    /// `idemgate_front_outbox_relayed_total`: outbox rows applied to it.
    pub relayed: ScrapedCounter,
    /// `idemgate_front_outbox_shown_total`: … of which the front already
    /// showed what they said (deleted without a read or a write).
    pub shown: ScrapedCounter,
    /// `idemgate_front_outbox_backlog`: rows waiting in the outbox.
    pub backlog: Gauge,
    /// `idemgate_front_outbox_lag_seconds`: the oldest waiting row's age.
    pub lag_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// `idemgate_front_repairs_total`: settled records PostgreSQL answered
    /// that were then given to the front.
    pub repairs: ScrapedCounter,
}

impl FrontMetrics {
    fn register(&self, registry: &mut Registry) {
        let front = registry.sub_registry_with_prefix("front");
        front.register(
            "up",
            "1 while this instance uses the Redis front, 0 while it answers from PostgreSQL alone",
            self.up.clone(),
        );
        front.register(
            "answers",
            "Claims the Redis front answered, by answer",
            self.answers.clone(),
        );
        front.register(
            "misses",
            "Claims the Redis front passed on to PostgreSQL",
            self.misses.clone(),
        );
        front.register(
            "marks",
            "In-flight markers written to the Redis front (attempts still unsettled after mark_after)",
            self.marks.clone(),
        );
        front.register(
            "errors",
            "Redis front operations that failed or timed out",
            self.errors.clone(),
        );
        front.register(
            "outages",
            "Times this instance stopped using the Redis front after a failure",
            self.outages.clone(),
        );
        front.register(
            "outbox_relayed",
            "Outbox rows applied to the Redis front",
            self.relayed.clone(),
        );
        front.register(
            "outbox_shown",
            "Outbox rows whose change the Redis front already showed (the completing instance wrote it), deleted without a read or a write",
            self.shown.clone(),
        );
        front.register(
            "outbox_backlog",
            "Rows waiting in the front's outbox",
            self.backlog.clone(),
        );
        front.register(
            "outbox_lag_seconds",
            "Age of the oldest row waiting in the front's outbox",
            self.lag_seconds.clone(),
        );
        front.register(
            "repairs",
            "Settled records PostgreSQL answered that were then given to the Redis front",
            self.repairs.clone(),
        );
    }

    /// Copy in the store's tallies.
    pub fn scrape(&self, stats: &crate::store::FrontStats) {
        self.up.set(i64::from(stats.up));
        for (answer, value) in [
            ("replay", stats.replays),
            ("conflict", stats.conflicts),
            ("mismatch", stats.mismatches),
            ("held", stats.held),
        ] {
            self.answers
                .get_or_create(&FrontAnswerLabels { answer })
                .set(value);
        }
        self.misses.set(stats.misses);
        self.marks.set(stats.marks);
        self.errors.set(stats.errors);
        self.outages.set(stats.outages);
        self.relayed.set(stats.relayed);
        self.shown.set(stats.relayed_shown);
        self.backlog.set(stats.backlog);
        self.lag_seconds.set(stats.lag.as_secs_f64());
        self.repairs.set(stats.repairs);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("idemgate");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests by route and outcome",
            requests.clone(),
        );
        let upstream_seconds = Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "upstream_duration_seconds",
            "Time from forwarding a claimed request to having read the upstream's response",
            upstream_seconds.clone(),
        );
        let store_seconds = Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "store_duration_seconds",
            "Store operation latency by operation and result",
            store_seconds.clone(),
        );
        let forwards_in_flight = Gauge::default();
        registry.register(
            "forwards_in_flight",
            "Claimed forwards waiting for the upstream or their record",
            forwards_in_flight.clone(),
        );
        let waiting = Gauge::default();
        registry.register(
            "waiting",
            "Requests waiting for an in-flight key to settle (concurrent = \"wait\")",
            waiting.clone(),
        );
        let wait_wakeups = Family::<WakeupLabels, Counter>::default();
        registry.register(
            "wait_wakeups",
            "Waiting requests woken to claim again, by cause (store announcement or slow poll)",
            wait_wakeups.clone(),
        );
        let lease_renewals = Family::<RenewalLabels, Counter>::default();
        registry.register(
            "lease_renewals",
            "Lease renewals by route and result",
            lease_renewals.clone(),
        );
        let lease_takeovers = Family::<RouteLabels, Counter>::default();
        registry.register(
            "lease_takeovers",
            "Keys taken over after their previous attempt's lease lapsed",
            lease_takeovers.clone(),
        );
        let orphaned_claims = Family::<LostClaimLabels, Counter>::default();
        registry.register(
            "orphaned_claims",
            "Claims whose answer was lost (never forwarded), by what became of the record they may have created",
            orphaned_claims.clone(),
        );
        let shadow = Family::<ShadowLabels, Counter>::default();
        registry.register(
            "shadow",
            "Keyed requests on shadow-mode routes, by what enforcing would have done (all were forwarded)",
            shadow.clone(),
        );
        registry.register(
            "log_lines_dropped",
            "Log lines dropped because the log writer's queue was full",
            DroppedLogLines,
        );
        let records_swept = Counter::default();
        registry.register(
            "records_swept",
            "Expired records deleted by the sweeper",
            records_swept.clone(),
        );
        let replay_cache_hits = Counter::default();
        registry.register(
            "replay_cache_hits",
            "Claims answered from this instance's replay cache, without a store round trip",
            replay_cache_hits.clone(),
        );
        let pool_connections = Gauge::default();
        registry.register(
            "store_pool_connections",
            "Connections held by the store pool",
            pool_connections.clone(),
        );
        let pool_idle = Gauge::default();
        registry.register(
            "store_pool_idle_connections",
            "Idle connections in the store pool",
            pool_idle.clone(),
        );
        let pool_max = Gauge::default();
        registry.register(
            "store_pool_max_connections",
            "The store pool's size limit",
            pool_max.clone(),
        );
        let store_batches = ScrapedCounter::default();
        registry.register(
            "store_batches",
            "Batches of claims and completions sent to PostgreSQL, each one round trip and one commit",
            store_batches.clone(),
        );
        let store_batched_operations = ScrapedCounter::default();
        registry.register(
            "store_batched_operations",
            "Claims and completions carried by those batches",
            store_batched_operations.clone(),
        );
        let store_batch_splits = ScrapedCounter::default();
        registry.register(
            "store_batch_splits",
            "Batches the database refused as a whole, whose operations then ran one at a time",
            store_batch_splits.clone(),
        );
        let front = FrontMetrics::default();
        front.register(&mut registry);
        Self {
            registry,
            requests,
            upstream_seconds,
            store_seconds,
            forwards_in_flight,
            waiting,
            wait_wakeups,
            lease_renewals,
            lease_takeovers,
            orphaned_claims,
            shadow,
            records_swept,
            replay_cache_hits,
            pool_connections,
            pool_idle,
            pool_max,
            store_batches,
            store_batched_operations,
            store_batch_splits,
            front,
        }
    }

    /// One route's handles (`-`: requests no route matched), for request
    /// outcomes labelled by `outcomes` in the order the caller indexes them.
    pub fn for_route(&self, route: &str, outcomes: &[&'static str]) -> RouteMetrics {
        RouteMetrics {
            requests: outcomes
                .iter()
                .map(|&outcome| {
                    self.requests
                        .get_or_create(&RequestLabels {
                            route: route.to_string(),
                            outcome,
                        })
                        .clone()
                })
                .collect(),
            upstream_seconds: self
                .upstream_seconds
                .get_or_create(&RouteLabels {
                    route: route.to_string(),
                })
                .clone(),
            lease_takeovers: self
                .lease_takeovers
                .get_or_create(&RouteLabels {
                    route: route.to_string(),
                })
                .clone(),
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// Observe one store operation's latency (`op`: claim, renew, …, sweep, ping).
    pub fn store_op(&self, op: &'static str, result: &'static str, took: Duration) {
        self.store_seconds
            .get_or_create(&StoreLabels { op, result })
            .observe(took.as_secs_f64());
    }
}

/// One route's metric handles, looked up once when the gateway is built,
/// so that counting a request allocates nothing and takes no lock (the
/// families' label sets are built here, not per request).
#[derive(Debug, Clone)]
pub struct RouteMetrics {
    /// `idemgate_requests_total{route, outcome}`, by the caller's outcome index.
    requests: Vec<Counter>,
    /// `idemgate_upstream_duration_seconds{route}`.
    pub upstream_seconds: Histogram,
    /// `idemgate_lease_takeovers_total{route}`.
    pub lease_takeovers: Counter,
}

impl RouteMetrics {
    /// Count one request with the outcome at `index` (as passed to
    /// [`Metrics::for_route`]).
    pub fn request(&self, index: usize) {
        self.requests[index].inc();
    }
}

/// A [`Store`] that measures every operation of the store it wraps.
pub struct InstrumentedStore {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl InstrumentedStore {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }
}

fn cas_result(r: &Result<Cas, StoreError>) -> &'static str {
    match r {
        Ok(Cas::Applied) => "ok",
        Ok(Cas::Fenced) => "fenced",
        Err(_) => "error",
    }
}

/// The `result` label of an operation that either succeeds or fails.
pub fn plain_result<T>(r: &Result<T, StoreError>) -> &'static str {
    if r.is_ok() { "ok" } else { "error" }
}

#[async_trait::async_trait]
impl Store for InstrumentedStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let started = Instant::now();
        let r = self.inner.claim(request).await;
        self.metrics
            .store_op("claim", plain_result(&r), started.elapsed());
        r
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: Token,
        lease: Duration,
    ) -> Result<Cas, StoreError> {
        let started = Instant::now();
        let r = self.inner.renew(key, token, lease).await;
        self.metrics
            .store_op("renew", cas_result(&r), started.elapsed());
        r
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: Token,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let started = Instant::now();
        let r = self.inner.complete(key, token, response, retention).await;
        self.metrics
            .store_op("complete", cas_result(&r), started.elapsed());
        r
    }

    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError> {
        let started = Instant::now();
        let r = self.inner.release(key, token).await;
        self.metrics
            .store_op("release", cas_result(&r), started.elapsed());
        r
    }

    async fn hold(
        &self,
        key: &RecordKey,
        token: Token,
        reason: HeldReason,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let started = Instant::now();
        let r = self.inner.hold(key, token, reason, retention).await;
        self.metrics
            .store_op("hold", cas_result(&r), started.elapsed());
        r
    }

    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError> {
        let started = Instant::now();
        let r = self.inner.abandon(key, attempt).await;
        self.metrics
            .store_op("abandon", cas_result(&r), started.elapsed());
        r
    }

    fn forget(&self, key: &RecordKey) {
        self.inner.forget(key);
    }
}
