//! `[telemetry]`: an `http(s)://` endpoint, a ratio between 0 and 1, a
//! queue of at least one span.

use super::super::defaults::DEFAULT_TRACE_QUEUE;
use super::super::raw::RawTelemetry;
use super::super::{ConfigError, Telemetry, invalid};
use crate::config::settings as S;

/// `[telemetry]`, if present.
pub(super) fn telemetry(raw: Option<RawTelemetry>) -> Result<Option<Telemetry>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let endpoint = raw.endpoint.filter(|e| !e.is_empty());
    if let Some(endpoint) = &endpoint {
        let parsed = url::Url::parse(endpoint).map_err(|e| {
            invalid(S::TELEMETRY_ENDPOINT.path(),
                format!("{endpoint:?} is not a URL ({e}); give the collector's OTLP/HTTP base, like \"http://otel-collector:4318\""),
            )
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid(
                S::TELEMETRY_ENDPOINT.path(),
                "must be http:// or https:// (OTLP over HTTP, protobuf)",
            ));
        }
    }
    if let Some(ratio) = raw.sample_ratio
        && !(0.0..=1.0).contains(&ratio)
    {
        return Err(invalid(
            S::TELEMETRY_SAMPLE_RATIO.path(),
            "must be between 0 (no new trace sampled) and 1 (all)",
        ));
    }
    let queue = raw.queue.unwrap_or(DEFAULT_TRACE_QUEUE);
    if queue == 0 {
        return Err(invalid(S::TELEMETRY_QUEUE.path(), "must be at least 1"));
    }
    Ok(Some(Telemetry {
        endpoint,
        service_name: raw.service_name.filter(|s| !s.is_empty()),
        sample_ratio: raw.sample_ratio,
        queue,
    }))
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{MINIMAL, parse};

    fn error(table: &str) -> String {
        parse(&format!("{MINIMAL}\n[telemetry]\n{table}\n"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn bad_values_are_named() {
        assert!(error("endpoint = \"otel:4318\"").contains("telemetry.endpoint"));
        assert!(error("endpoint = \"grpc://otel:4317\"").contains("http://"));
        assert!(error("sample_ratio = 1.5").contains("telemetry.sample_ratio"));
        assert!(error("queue = 0").contains("telemetry.queue"));
        assert!(error("sampler = \"always\"").contains("telemetry"));
    }

    #[test]
    fn an_empty_table_turns_tracing_on_with_defaults() {
        let config = parse(&format!("{MINIMAL}\n[telemetry]\n")).unwrap();
        let telemetry = config.telemetry.unwrap();
        assert_eq!(telemetry.endpoint, None);
        assert_eq!(telemetry.queue, crate::config::DEFAULT_TRACE_QUEUE);
        assert!(parse(MINIMAL).unwrap().telemetry.is_none());
    }
}
