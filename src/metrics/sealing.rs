//! Sealed records (`[store] encryption_keys`): replays opened per key id,
//! which tells when an old key has no more records to open, and replays
//! refused because their record did not open.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::request::key::digest as key_digest;
use crate::store::RecordKey;
use crate::store::seal::OpenError;

/// The key id a replay was sealed under (`plain`: recorded unsealed).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyIdLabels {
    /// The key id.
    pub key_id: String,
}

/// Why a sealed record did not open, and the key id it names.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnopenedLabels {
    /// `unknown_key`, `unauthentic` or `plain`.
    pub reason: &'static str,
    /// The key id the record names.
    pub key_id: String,
}

/// `idemgate_sealed_replays_total` and `idemgate_sealed_unopened_total`.
#[derive(Debug, Clone, Default)]
pub struct SealingMetrics {
    /// `idemgate_sealed_replays_total{key_id}`.
    pub replays: Family<KeyIdLabels, Counter>,
    /// `idemgate_sealed_unopened_total{reason, key_id}`.
    pub unopened: Family<UnopenedLabels, Counter>,
}

impl SealingMetrics {
    /// Register both in `registry`.
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "sealed_replays",
            "Replays of recorded responses by the key id they were sealed under (plain: recorded without encryption_keys)",
            self.replays.clone(),
        );
        registry.register(
            "sealed_unopened",
            "Replays refused because the recorded response did not open: unknown_key (its key id is not configured), unauthentic (sealed for another record, or altered) or plain (not sealed, and accept_plain_records = false)",
            self.unopened.clone(),
        );
    }

    /// Count, and for a failure log, one replay the sealing wrapper opened.
    pub fn opened(&self, key: &RecordKey, opened: Result<Option<&str>, &OpenError>) {
        match opened {
            Ok(key_id) => {
                let key_id = key_id.unwrap_or("plain").to_string();
                self.replays.get_or_create(&KeyIdLabels { key_id }).inc();
            }
            Err(error) => {
                tracing::error!(route = %key.route, key = %key_digest(&key.key), key_id = error.key_id(), reason = error.reason(), "{error}; answered 500, not forwarded");
                let labels = UnopenedLabels {
                    reason: error.reason(),
                    key_id: error.key_id().to_string(),
                };
                self.unopened.get_or_create(&labels).inc();
            }
        }
    }
}
