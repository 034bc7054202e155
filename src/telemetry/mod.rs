//! OpenTelemetry traces (docs/src/operations/tracing.md): one server span
//! per request, with child spans for the store operations and the
//! upstream call ([`spans`]), exported over OTLP/HTTP (protobuf) without
//! ever making a request wait ([`export`]).
//!
//! Tracing is on when `[telemetry]` is in the config or an
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `…_TRACES_ENDPOINT`) is set, and off
//! when `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. The
//! standard variables win over the table: `OTEL_SERVICE_NAME` (default
//! `idemgate`), `OTEL_TRACES_SAMPLER` and `…_ARG`,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`, `…_HEADERS`, `OTEL_BSP_MAX_QUEUE_SIZE`.
//! Off, no span is made and no header is read or written: a request costs
//! what it did without tracing.
//!
//! Spans for export have the target [`TARGET`] and nothing else does; the
//! log lines never show them (`crate::logging`), and the exporter's layer
//! sees nothing but them.

pub(crate) mod export;
pub mod spans;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

use crate::config::Telemetry;

/// The target of every span meant for export, and of nothing else.
pub const TARGET: &str = "idemgate::trace";

/// The longest the last spans' export may hold up the process's end.
const FINAL_EXPORT: Duration = Duration::from_secs(2);

static ON: AtomicBool = AtomicBool::new(false);

/// Whether traces are exported (spans are made only then).
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Why tracing could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up OpenTelemetry tracing ([telemetry], OTEL_*): {0}")]
pub struct TelemetryError(String);

/// The exporter, running: keep it until the process ends, then
/// [`Tracing::shutdown`] sends what is left (within [`FINAL_EXPORT`]).
#[derive(Debug)]
pub struct Tracing {
    provider: SdkTracerProvider,
}

/// A variable set to something.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Whether `table` or the environment asks for traces.
fn wanted(table: Option<&Telemetry>) -> bool {
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
    let endpoint = env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
        || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some();
    !disabled && (table.is_some() || endpoint)
}

/// Start exporting if `table` or the environment asks for it (`None`:
/// tracing stays off).
pub fn start(table: Option<&Telemetry>) -> Result<Option<Tracing>, TelemetryError> {
    if !wanted(table) {
        return Ok(None);
    }
    let defaults = Telemetry {
        endpoint: None,
        service_name: None,
        sample_ratio: None,
        queue: crate::config::DEFAULT_TRACE_QUEUE,
    };
    let table = table.unwrap_or(&defaults);
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(protocol) = env(name)
            && protocol != "http/protobuf"
        {
            return Err(TelemetryError(format!(
                "{name}={protocol}: idemgate exports http/protobuf only; unset it or set http/protobuf"
            )));
        }
    }
    // reqwest's TLS (an https:// collector) uses the process's provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
    // The environment wins: an endpoint set in code would override it.
    let from_env = env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
        || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some();
    if let (false, Some(base)) = (from_env, &table.endpoint) {
        exporter = exporter.with_endpoint(format!("{}/v1/traces", base.trim_end_matches('/')));
    }
    let exporter = exporter
        .build()
        .map_err(|e| TelemetryError(e.to_string()))?;
    let queue = env("OTEL_BSP_MAX_QUEUE_SIZE")
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(table.queue);
    let mut provider = SdkTracerProvider::builder()
        .with_span_processor(export::Gate::new(exporter, queue))
        .with_resource(resource(table));
    if let (None, Some(ratio)) = (env("OTEL_TRACES_SAMPLER"), table.sample_ratio) {
        let ratio = Sampler::TraceIdRatioBased(ratio);
        provider = provider.with_sampler(Sampler::ParentBased(Box::new(ratio)));
    }
    ON.store(true, Ordering::Relaxed);
    Ok(Some(Tracing {
        provider: provider.build(),
    }))
}

/// `service.name`: `OTEL_SERVICE_NAME`, else one in
/// `OTEL_RESOURCE_ATTRIBUTES`, else the table's, else `idemgate`.
fn resource(table: &Telemetry) -> Resource {
    if let Some(name) = env("OTEL_SERVICE_NAME") {
        return Resource::builder().with_service_name(name).build();
    }
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
    if named {
        return detected;
    }
    let name = table
        .service_name
        .clone()
        .unwrap_or_else(|| "idemgate".into());
    Resource::builder().with_service_name(name).build()
}

impl Tracing {
    /// The layer that turns [`TARGET`] spans into exported ones (and sees
    /// nothing else).
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("idemgate"))
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(Targets::new().with_target(TARGET, tracing::Level::TRACE))
    }

    /// Export what is left, waiting at most [`FINAL_EXPORT`] whatever the
    /// collector does.
    pub fn shutdown(self) {
        ON.store(false, Ordering::Relaxed);
        let _ = self.provider.shutdown_with_timeout(FINAL_EXPORT);
    }
}
