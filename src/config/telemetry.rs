//! The validated `[telemetry]` table: where OpenTelemetry traces go
//! (src/telemetry/). The standard `OTEL_*` environment variables win over
//! it; either turns tracing on.

/// `[telemetry]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Telemetry {
    /// The OTLP/HTTP base URL (`/v1/traces` is appended), as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` takes it; `None`: the environment's,
    /// or `http://localhost:4318`.
    pub endpoint: Option<String>,
    /// `service.name`; `None`: `OTEL_SERVICE_NAME`, or `idemgate`.
    pub service_name: Option<String>,
    /// The share of new traces sampled (a trace continued from a client
    /// follows the client's decision); `None`: `OTEL_TRACES_SAMPLER`, or all.
    pub sample_ratio: Option<f64>,
    /// Finished spans waiting for export at most; more are dropped and
    /// counted, never waited for.
    pub queue: usize,
}
