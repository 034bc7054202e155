//! The lease renewer: while an attempt is at the upstream, its lease is
//! extended every third of its length, so a live gateway never loses the
//! key to a takeover or a hold (G7). Stops when dropped.

use std::sync::Arc;

use super::Gateway;
use crate::config::Route;
use crate::metrics::RenewalLabels;
use crate::store::{Cas, RecordKey, Token};

impl Gateway {
    /// Renew the lease every third of it while the upstream works; stops when dropped.
    pub(super) fn renew_while_working(
        self: &Arc<Self>,
        route: &Route,
        key: &RecordKey,
        token: Token,
    ) -> AbortOnDrop {
        let gateway = self.clone();
        let key = key.clone();
        let lease = route.lease;
        let route_name = route.name.clone();
        AbortOnDrop(tokio::spawn(async move {
            let mut tick = tokio::time::interval(lease / 3);
            tick.tick().await;
            loop {
                tick.tick().await;
                // The chaos harness's negative control (test builds only):
                // `renew-skip=return` stops renewing, so a lease lapses under
                // a live attempt.
                fail::fail_point!("renew-skip", |_| ());
                let renewed = gateway.store.renew(&key, token, lease).await;
                let result = match &renewed {
                    Ok(Cas::Applied) => "applied",
                    Ok(Cas::Fenced) => "fenced",
                    Err(_) => "error",
                };
                gateway
                    .metrics
                    .lease_renewals
                    .get_or_create(&RenewalLabels {
                        route: route_name.clone(),
                        result,
                    })
                    .inc();
                match renewed {
                    // Window (d): a renewal has just committed.
                    Ok(Cas::Applied) => kill_window!("during-renewal"),
                    Ok(Cas::Fenced) => {
                        tracing::warn!(route = %route_name, token, "lease lost: the key was taken over or held");
                        return;
                    }
                    Err(error) => {
                        tracing::warn!(route = %route_name, token, error = %error, "lease renewal failed")
                    }
                }
            }
        }))
    }
}

/// Aborts a task when dropped.
pub(super) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
