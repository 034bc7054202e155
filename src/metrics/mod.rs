//! Prometheus metrics, served on the admin listener's `/metrics`. Names
//! and labels are stable; docs/src/reference/metrics.md lists them. Store
//! operations are measured by a wrapper around the store
//! (`metered`, outside the store module), so no backend carries metrics code; figures
//! a store keeps itself are copied in at scrape time ([`scraped`]).

pub mod metered;

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::store::{StoreAdmin, StoreError};

mod inquiries;
mod reloads;
mod scraped;
mod sealing;

pub use inquiries::{InquiryLabels, InquiryMetrics};
pub use reloads::{ReloadLabels, ReloadMetrics};
pub use sealing::{KeyIdLabels, SealingMetrics, UnopenedLabels};

pub use scraped::{FrontMetrics, ScrapedCounter, StoreFigures};

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

/// A store operation and its result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    /// `claim`, `renew`, `complete`, `release`, `hold`, `abandon`, `sweep` or `ping`.
    pub op: &'static str,
    /// `ok`, `fenced` or `error`.
    pub result: &'static str,
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
    /// `idemgate_replay_cache_hits_total`: replays answered from the replay
    /// cache, without a store round trip or a claim.
    pub replay_cache_hits: Counter,
    /// The store pool's and batches' figures, copied in at scrape time.
    pub store: StoreFigures,
    /// The Redis front's figures (`[store.front]`), copied in at scrape time.
    pub front: FrontMetrics,
    /// Status inquiries.
    pub inquiries: InquiryMetrics,
    /// Configuration reloads.
    pub reloads: ReloadMetrics,
    /// Sealed records (`[store] encryption_keys`).
    pub sealing: SealingMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// `idemgate_records_swept` and `idemgate_replay_cache_hits`, registered.
fn register_store_counters(registry: &mut Registry) -> (Counter, Counter) {
    let records_swept = Counter::default();
    registry.register(
        "records_swept",
        "Expired records deleted by the sweeper",
        records_swept.clone(),
    );
    let replay_cache_hits = Counter::default();
    registry.register(
        "replay_cache_hits",
        "Replays answered from this instance's replay cache, without a store round trip or a claim",
        replay_cache_hits.clone(),
    );
    (records_swept, replay_cache_hits)
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
        scraped::register_dropped_log_lines(&mut registry);
        scraped::register_dropped_spans(&mut registry);
        let (records_swept, replay_cache_hits) = register_store_counters(&mut registry);
        let store = StoreFigures::default();
        store.register(&mut registry);
        let front = FrontMetrics::default();
        front.register(&mut registry);
        let inquiries = InquiryMetrics::default();
        inquiries.register(&mut registry);
        let reloads = ReloadMetrics::default();
        reloads.register(&mut registry);
        let sealing = SealingMetrics::default();
        sealing.register(&mut registry);
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
            store,
            front,
            inquiries,
            reloads,
            sealing,
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

    /// Copy in the figures `store` keeps itself (pool, batches, lost
    /// records, front).
    pub fn scrape(&self, store: &dyn StoreAdmin) {
        if let Some(pool) = store.pool_stats() {
            self.store.scrape_pool(&pool);
        }
        if let Some(batches) = store.batch_stats() {
            self.store.scrape_batches(&batches);
        }
        if let Some(lost) = store.data_losses() {
            self.store.data_lost.set(lost);
        }
        if let Some(front) = store.front_stats() {
            self.front.scrape(&front);
        }
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

/// The `result` label of an operation that either succeeds or fails.
pub fn plain_result<T>(r: &Result<T, StoreError>) -> &'static str {
    if r.is_ok() { "ok" } else { "error" }
}
