//! Figures kept elsewhere (the store pool, its batches, Redis's lost
//! records, the Redis front's tallies, the logger's dropped lines, the
//! trace exporter's dropped spans), read when `/metrics` is scraped.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::store::{BatchStats, FrontStats, PoolStats, Shed};

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

/// `idemgate_trace_spans_dropped_total{reason}`, read from the span
/// exporter at scrape time.
#[derive(Debug)]
struct DroppedSpans;

impl EncodeMetric for DroppedSpans {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (queue_full, export_failed) = crate::telemetry::export::dropped();
        for (reason, value) in [("queue_full", queue_full), ("export_failed", export_failed)] {
            encoder
                .encode_family(&[("reason", reason)])?
                .encode_counter::<NoLabelSet, _, u64>(&value, None)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// Register `idemgate_trace_spans_dropped_total`.
pub(super) fn register_dropped_spans(registry: &mut Registry) {
    registry.register(
        "trace_spans_dropped",
        "Finished trace spans not delivered to the OTLP collector, by reason: queue_full (dropped, never waited for) or export_failed (the collector refused or did not answer)",
        DroppedSpans,
    );
}

/// Register `idemgate_log_lines_dropped_total`.
pub(super) fn register_dropped_log_lines(registry: &mut Registry) {
    registry.register(
        "log_lines_dropped",
        "Log lines dropped because the log writer's queue was full",
        DroppedLogLines,
    );
}

/// `idemgate_store_pool_*` and `idemgate_store_batch*`: the store pool's
/// connections and the batches of claims and completions (PostgreSQL).
#[derive(Debug, Clone, Default)]
pub struct StoreFigures {
    /// `idemgate_store_pool_connections`: connections the store pool holds.
    pub pool_connections: Gauge,
    /// `idemgate_store_pool_idle_connections`.
    pub pool_idle: Gauge,
    /// `idemgate_store_pool_max_connections`: the pool's size limit.
    pub pool_max: Gauge,
    /// `idemgate_store_batches_total`: batches of claims and completions
    /// (PostgreSQL), each one round trip and one commit.
    pub batches: ScrapedCounter,
    /// `idemgate_store_batched_operations_total`: operations they carried.
    pub batched_operations: ScrapedCounter,
    /// `idemgate_store_batch_splits_total`: batches refused as a whole and
    /// run again one operation at a time.
    pub batch_splits: ScrapedCounter,
    /// `idemgate_store_claims_shed_total{reason}`: claims taken off the
    /// batch queue and answered without being sent (`queue_budget`,
    /// `caller_gone`).
    pub claims_shed: Family<ShedLabels, ScrapedCounter>,
    /// `idemgate_store_data_lost_total`: times the store (Redis) was found
    /// to have lost every record since this instance last connected.
    pub data_lost: ScrapedCounter,
}

impl StoreFigures {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "store_pool_connections",
            "Connections held by the store pool",
            self.pool_connections.clone(),
        );
        registry.register(
            "store_pool_idle_connections",
            "Idle connections in the store pool",
            self.pool_idle.clone(),
        );
        registry.register(
            "store_pool_max_connections",
            "The store pool's size limit",
            self.pool_max.clone(),
        );
        registry.register(
            "store_batches",
            "Batches of claims and completions sent to PostgreSQL, each one round trip and one commit",
            self.batches.clone(),
        );
        registry.register(
            "store_batched_operations",
            "Claims and completions carried by those batches",
            self.batched_operations.clone(),
        );
        registry.register(
            "store_batch_splits",
            "Batches the database refused as a whole, whose operations then ran one at a time",
            self.batch_splits.clone(),
        );
        registry.register(
            "store_claims_shed",
            "Claims taken off the store's batch queue and answered 503 overloaded without being sent, by reason: queue_budget (waited longer than [store] claim_queue_budget), caller_gone (the client left first)",
            self.claims_shed.clone(),
        );
        registry.register(
            "store_data_lost",
            "Times Redis was found to have lost every record since this instance last connected (a failover to an empty server, a restart without persistence, a flush): acknowledged keys are forgotten",
            self.data_lost.clone(),
        );
    }

    /// Copy in the pool's figures.
    pub fn scrape_pool(&self, pool: &PoolStats) {
        self.pool_connections.set(pool.connections as i64);
        self.pool_idle.set(pool.idle as i64);
        self.pool_max.set(pool.max as i64);
    }

    /// Copy in the batches' tallies.
    pub fn scrape_batches(&self, batches: &BatchStats) {
        self.batches.set(batches.batches);
        self.batched_operations.set(batches.operations);
        self.batch_splits.set(batches.split);
        for (reason, value) in [
            (Shed::QueueBudget, batches.shed_queue_budget),
            (Shed::CallerGone, batches.shed_caller_gone),
        ] {
            self.claims_shed
                .get_or_create(&ShedLabels {
                    reason: reason.label(),
                })
                .set(value);
        }
    }
}

/// Why a claim was shed unsent.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShedLabels {
    /// `queue_budget` or `caller_gone`.
    pub reason: &'static str,
}

/// How the Redis front answered a claim.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FrontAnswerLabels {
    /// `replay`, `conflict`, `mismatch` or `held`.
    pub answer: &'static str,
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
    pub(super) fn register(&self, registry: &mut Registry) {
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
    pub fn scrape(&self, stats: &FrontStats) {
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
