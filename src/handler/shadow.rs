//! Shadow mode (docs/DESIGN.md §11): a route with `mode = "shadow"` forwards
//! every request as if idemgate were absent, while keyed requests are still
//! claimed and recorded; what enforcing would have done is counted
//! (`idemgate_shadow_total{route, would}`) and, for every would-be
//! intervention, logged with the key's digest.

use crate::metrics::{Metrics, ShadowLabels};

/// What enforcing the route would have done with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Would {
    /// Forward it (a new key): not an intervention.
    Forward,
    /// Replay the recorded response instead of forwarding.
    Replay,
    /// `409`: the key is in flight.
    Conflict,
    /// `422`: the key was used with another request.
    Mismatch,
    /// Answer from a `held` record.
    Held,
    /// `400`: no key.
    MissingKey,
    /// `400`: a malformed key.
    InvalidKey,
}

impl Would {
    /// The `would` label.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Forward => "forward",
            Self::Replay => "replay",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::Held => "held",
            Self::MissingKey => "missing_key",
            Self::InvalidKey => "invalid_key",
        }
    }
}

/// Count what a shadow route would have done, and log an intervention.
pub(super) fn report(metrics: &Metrics, route: &str, would: Would, key_digest: Option<&str>) {
    metrics
        .shadow
        .get_or_create(&ShadowLabels {
            route: route.to_string(),
            would: would.as_str(),
        })
        .inc();
    if would != Would::Forward {
        tracing::info!(
            target: "idemgate::shadow",
            route,
            would = would.as_str(),
            key = key_digest.unwrap_or("-"),
            "shadow: enforcing would have answered this request itself; it was forwarded"
        );
    }
}
