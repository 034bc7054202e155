//! The file's shape: serde structs that mirror the TOML one to one, every key
//! optional and unknown keys refused (the error names the key's full path),
//! and [`RawRoute::or_defaults`], which fills a route's absent keys from the
//! `[defaults]` table. Nothing here is checked beyond its TOML type.

use serde::Deserialize;

use super::route::{Concurrent, LogFormat, OnStoreError, RouteMode};
use crate::request::fingerprint::BodyMode;
use crate::store::UnknownOutcome;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) listen: Option<String>,
    pub(super) admin_listen: Option<String>,
    pub(super) admin_token: Option<String>,
    pub(super) max_connections: Option<usize>,
    pub(super) server_threads: Option<usize>,
    pub(super) header_read_timeout: Option<String>,
    pub(super) idle_timeout: Option<String>,
    pub(super) body_read_timeout: Option<String>,
    pub(super) http2_keep_alive_interval: Option<String>,
    pub(super) http2_keep_alive_timeout: Option<String>,
    pub(super) http2_max_concurrent_streams: Option<u32>,
    pub(super) http2_stream_window: Option<String>,
    pub(super) http2_connection_window: Option<String>,
    pub(super) max_buffered_request_bytes: Option<String>,
    pub(super) max_forwards_in_flight: Option<usize>,
    pub(super) max_waiting: Option<usize>,
    pub(super) admin_max_connections: Option<usize>,
    pub(super) max_header_bytes: Option<String>,
    pub(super) shutdown_timeout: Option<String>,
    pub(super) watch_config: Option<String>,
    pub(super) docs_url: Option<String>,
    pub(super) log_format: Option<LogFormat>,
    pub(super) tls: Option<RawTls>,
    pub(super) telemetry: Option<RawTelemetry>,
    #[serde(default)]
    pub(super) store: RawStore,
    #[serde(default)]
    pub(super) defaults: RawRoute,
    #[serde(default)]
    pub(super) routes: Vec<RawRoute>,
}

/// The `[store]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    pub(super) url: Option<String>,
    pub(super) migrate: Option<bool>,
    pub(super) pool_size: Option<u32>,
    pub(super) batches_in_flight: Option<u32>,
    pub(super) claim_queue_budget: Option<String>,
    pub(super) timeout: Option<String>,
    pub(super) prefix: Option<String>,
    pub(super) cluster: Option<bool>,
    pub(super) replicas: Option<u32>,
    pub(super) replica_timeout: Option<String>,
    pub(super) max_records: Option<usize>,
    pub(super) sweep_interval: Option<String>,
    pub(super) sweep_batch: Option<usize>,
    pub(super) generation: Option<String>,
    pub(super) replay_cache_ttl: Option<String>,
    pub(super) replay_cache_size: Option<String>,
    pub(super) encryption_keys: Option<super::record_keys::RawKeys>,
    pub(super) compress: Option<bool>,
    pub(super) compression: Option<crate::store::seal::Codec>,
    pub(super) accept_plain_records: Option<bool>,
    pub(super) front: Option<RawFront>,
}

/// The `[store.front]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFront {
    pub(super) url: Option<String>,
    pub(super) timeout: Option<String>,
    pub(super) mark_after: Option<String>,
}

/// The `[tls]` table: the proxy listener's certificate, and the CAs of
/// client certificates.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) cert: Option<String>,
    pub(super) key: Option<String>,
    pub(super) client_ca: Option<String>,
    pub(super) client_auth: Option<super::ClientAuth>,
}

/// The `[telemetry]` table: where traces go.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    pub(super) endpoint: Option<String>,
    pub(super) service_name: Option<String>,
    pub(super) sample_ratio: Option<f64>,
    pub(super) queue: Option<usize>,
}

/// One `[[routes]]` table, or the `[defaults]` table.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) name: Option<String>,
    #[serde(rename = "match")]
    pub(super) path: Option<String>,
    pub(super) upstream: Option<String>,
    pub(super) upstream_ca: Option<String>,
    pub(super) methods: Option<Vec<String>>,
    pub(super) key_header: Option<String>,
    pub(super) key_from: Option<Vec<String>>,
    pub(super) key_required: Option<bool>,
    pub(super) scope_header: Option<String>,
    pub(super) scope_from: Option<Vec<String>>,
    pub(super) retention: Option<String>,
    pub(super) lease: Option<String>,
    pub(super) upstream_timeout: Option<String>,
    pub(super) max_request_body: Option<String>,
    pub(super) max_recorded_response: Option<String>,
    pub(super) on_unknown_outcome: Option<UnknownOutcome>,
    pub(super) on_store_error: Option<OnStoreError>,
    pub(super) concurrent: Option<Concurrent>,
    pub(super) mode: Option<RouteMode>,
    pub(super) wait_timeout: Option<String>,
    pub(super) record: Option<Vec<String>>,
    pub(super) replay_headers: Option<Vec<String>>,
    pub(super) fingerprint: Option<RawFingerprint>,
    pub(super) inquiry: Option<RawInquiry>,
    pub(super) forward_attempt: Option<bool>,
    pub(super) expires_header: Option<bool>,
    pub(super) record_body: Option<bool>,
}

/// A route's `inquiry` table.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawInquiry {
    pub(super) url: Option<String>,
    pub(super) after: Option<String>,
    pub(super) every: Option<String>,
    pub(super) give_up_after: Option<String>,
    pub(super) headers: Option<std::collections::BTreeMap<String, String>>,
}

/// A route's `fingerprint` table.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFingerprint {
    pub(super) method: Option<bool>,
    pub(super) path: Option<bool>,
    pub(super) query: Option<bool>,
    pub(super) headers: Option<Vec<String>>,
    pub(super) body: Option<BodyMode>,
    pub(super) exclude: Option<Vec<String>>,
}

macro_rules! merge_fields {
    ($own:expr, $defaults:expr, $($field:ident),*) => {
        RawRoute { $($field: $own.$field.clone().or_else(|| $defaults.$field.clone()),)* }
    };
}

impl RawRoute {
    /// This route with every absent key taken from `d` (the `[defaults]`
    /// table); a key the route sets wins. Tables (`fingerprint`) are taken
    /// whole, not merged key by key. A route that names its key in either
    /// form (`key_from`, `key_header`) takes neither from the defaults; the
    /// scope likewise; a `wait_timeout` only reaches routes that wait.
    pub(super) fn or_defaults(&self, d: &RawRoute) -> RawRoute {
        let mut merged = merge_fields!(
            self,
            d,
            name,
            path,
            upstream,
            upstream_ca,
            methods,
            key_header,
            key_from,
            key_required,
            scope_header,
            scope_from,
            retention,
            lease,
            upstream_timeout,
            max_request_body,
            max_recorded_response,
            on_unknown_outcome,
            on_store_error,
            concurrent,
            mode,
            wait_timeout,
            record,
            replay_headers,
            fingerprint,
            inquiry,
            forward_attempt,
            expires_header,
            record_body
        );
        if self.key_header.is_some() || self.key_from.is_some() {
            merged.key_header.clone_from(&self.key_header);
            merged.key_from.clone_from(&self.key_from);
        }
        if self.scope_header.is_some() || self.scope_from.is_some() {
            merged.scope_header.clone_from(&self.scope_header);
            merged.scope_from.clone_from(&self.scope_from);
        }
        // A `wait_timeout` in `[defaults]` is for the routes that wait.
        if merged.concurrent != Some(Concurrent::Wait) && self.wait_timeout.is_none() {
            merged.wait_timeout = None;
        }
        // An `inquiry` in `[defaults]` is for the routes that inquire.
        if merged.on_unknown_outcome != Some(UnknownOutcome::Inquire) && self.inquiry.is_none() {
            merged.inquiry = None;
        }
        merged
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::OnStoreError;
    use crate::config::tests::{MINIMAL, error, parse};

    #[test]
    fn unknown_key_is_rejected_with_its_path() {
        let text = format!("{MINIMAL}\nretension = \"1h\"\n");
        let err = error(&text);
        assert!(
            err.contains("routes[0]") && err.contains("retension"),
            "{err}"
        );
        let err = error(&format!("bogus = 1\n{MINIMAL}"));
        assert!(err.contains("bogus"), "{err}");
        let err = error(&format!("[store]\nurll = \"x\"\n{MINIMAL}"));
        assert!(err.contains("store") && err.contains("urll"), "{err}");
    }

    #[test]
    fn defaults_apply_and_routes_override() {
        let text = format!(
            "[defaults]\nlease = \"10s\"\non_store_error = \"fail_open\"\n{MINIMAL}\n[[routes]]\nname = \"b\"\nmatch = \"/b\"\nupstream = \"http://h:1\"\nlease = \"5s\"\n"
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.routes[0].lease, Duration::from_secs(10));
        assert_eq!(c.routes[1].lease, Duration::from_secs(5));
        assert_eq!(c.routes[1].on_store_error, OnStoreError::FailOpen);
    }
}
