//! Configuration reloads (SIGHUP, `POST /config/reload`): how many were
//! applied and how many were refused.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A reload's result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `ok` (applied) or `error` (refused: the old configuration stays).
    pub result: &'static str,
}

/// `idemgate_config_reloads_total` and `idemgate_config_restart_pending`.
#[derive(Debug, Clone, Default)]
pub struct ReloadMetrics {
    /// `idemgate_config_reloads_total{result}`.
    pub total: Family<ReloadLabels, Counter>,
    /// `idemgate_config_restart_pending`: settings the file changes that
    /// only a restart applies (0: the file is all in force).
    pub restart_pending: Gauge,
}

impl ReloadMetrics {
    /// Register both in `registry`, with both results at zero.
    pub(super) fn register(&self, registry: &mut Registry) {
        for result in ["ok", "error"] {
            let _ = self.total.get_or_create(&ReloadLabels { result });
        }
        registry.register(
            "config_reloads",
            "Configuration reloads by result: ok (applied) or error (refused; the old configuration stays)",
            self.total.clone(),
        );
        registry.register(
            "config_restart_pending",
            "Settings the config file changes that take effect only on restart",
            self.restart_pending.clone(),
        );
    }

    /// Count one reload: applied with `pending` settings left for a
    /// restart, or refused (`None`).
    pub fn count(&self, pending: Option<usize>) {
        let result = if pending.is_some() { "ok" } else { "error" };
        self.total.get_or_create(&ReloadLabels { result }).inc();
        if let Some(pending) = pending {
            self.restart_pending
                .set(i64::try_from(pending).unwrap_or(i64::MAX));
        }
    }
}
