//! Export that never blocks a request: the SDK's batch processor behind a
//! gate that admits at most `queue` finished spans between a request and
//! the exporter. One more is dropped and counted, never waited for; a
//! batch the collector refused or never answered is counted too. Both
//! are `idemgate_trace_spans_dropped_total{reason}`.
//!
//! The SDK's own processor drops silently when full (its count is private
//! in opentelemetry_sdk 0.33), so the gate holds its queue below its bound
//! and the count is ours.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor};

/// Spans dropped because the export queue was full, since start.
static QUEUE_FULL: AtomicU64 = AtomicU64::new(0);
/// Spans in batches the collector refused or did not take in time.
static EXPORT_FAILED: AtomicU64 = AtomicU64::new(0);

/// Spans dropped since start: (queue full, export failed).
pub(crate) fn dropped() -> (u64, u64) {
    (
        QUEUE_FULL.load(Ordering::Relaxed),
        EXPORT_FAILED.load(Ordering::Relaxed),
    )
}

/// The SDK's batch processor, admitting at most `cap` spans at once.
#[derive(Debug)]
pub(super) struct Gate {
    inner: BatchSpanProcessor,
    queued: Arc<AtomicUsize>,
    cap: usize,
}

impl Gate {
    /// A batch processor (its queue `cap` long, so the gate keeps it from
    /// filling) over `exporter`.
    pub(super) fn new<E: SpanExporter + 'static>(exporter: E, cap: usize) -> Self {
        let queued = Arc::new(AtomicUsize::new(0));
        let config = opentelemetry_sdk::trace::BatchConfigBuilder::default()
            .with_max_queue_size(cap)
            .build();
        let inner = BatchSpanProcessor::builder(Counted {
            inner: exporter,
            queued: queued.clone(),
        })
        .with_batch_config(config)
        .build();
        Self { inner, queued, cap }
    }
}

impl SpanProcessor for Gate {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.cap {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            QUEUE_FULL.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // At most `cap` spans are past the gate: the inner queue never fills.
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter, opening the gate for each batch taken off the queue and
/// counting the spans of a batch that failed.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    queued: Arc<AtomicUsize>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        self.queued.fetch_sub(n, Ordering::AcqRel);
        let result = self.inner.export(batch).await;
        if result.is_err() {
            EXPORT_FAILED.fetch_add(n as u64, Ordering::Relaxed);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        // Without it, spans would carry no service.name.
        self.inner.set_resource(resource);
    }
}
