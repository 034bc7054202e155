//! SIGHUP, which operators, log rotation and many supervisors send: it
//! reloads the configuration ([`super::Reloader::reload`]). The handler is
//! installed before the gateway serves and stays installed, so SIGHUP
//! never takes its default action, which would end the process.

use std::sync::Arc;

use tokio::signal::unix::{Signal, SignalKind, signal};

use super::Reloader;

/// Install the SIGHUP handler now (so no SIGHUP sent from here on ends the
/// process); `None` if the system refuses, which is logged.
pub(crate) fn listen() -> Option<Signal> {
    match signal(SignalKind::hangup()) {
        Ok(hangups) => Some(hangups),
        Err(error) => {
            tracing::error!(%error, "cannot listen for SIGHUP: a SIGHUP will end the process");
            None
        }
    }
}

/// Reload on every SIGHUP, until the task is aborted. A failed reload is
/// logged and counted by the reloader; the gateway goes on.
pub(crate) async fn answer(mut hangups: Signal, reloader: Arc<Reloader>) {
    while hangups.recv().await.is_some() {
        let _ = reloader.reload("SIGHUP").await;
    }
}
