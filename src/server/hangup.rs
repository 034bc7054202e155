//! SIGHUP, which operators, log rotation and many supervisors send. With a
//! TLS listener it reloads the certificate (new handshakes get the new
//! one; a failed reload keeps the old one). Without one there is nothing
//! to reload: it is logged and otherwise ignored. Either way the handler
//! is installed before the gateway serves and stays installed, so SIGHUP
//! never takes its default action, which would end the process.

use std::sync::Arc;

use tokio::signal::unix::{Signal, SignalKind, signal};

use super::tls::Certificate;
use crate::tls::TlsFileError;

/// Install the SIGHUP handler now (so no SIGHUP sent from here on ends the
/// process); `None` if the system refuses, which is logged.
pub(super) fn listen() -> Option<Signal> {
    match signal(SignalKind::hangup()) {
        Ok(hangups) => Some(hangups),
        Err(error) => {
            tracing::error!(%error, "cannot listen for SIGHUP: a SIGHUP will end the process");
            None
        }
    }
}

/// Answer every SIGHUP, until the task is aborted.
pub(super) async fn answer(mut hangups: Signal, tls: Option<Arc<Certificate>>) {
    while hangups.recv().await.is_some() {
        match &tls {
            Some(certificate) => reload(certificate).await,
            None => tracing::info!(
                "SIGHUP: nothing to reload (no [tls]); routes and settings change on restart"
            ),
        }
    }
}

/// Read the certificate's files again, off the runtime's threads.
async fn reload(certificate: &Arc<Certificate>) {
    let reading = certificate.clone();
    let reloaded = tokio::task::spawn_blocking(move || reading.reload()).await;
    let reloaded = reloaded.unwrap_or_else(|join| {
        Err(TlsFileError::invalid(
            certificate.cert_path(),
            join.to_string(),
        ))
    });
    match reloaded {
        Ok(()) => tracing::info!(
            cert = %certificate.cert_path().display(),
            "SIGHUP: TLS certificate reloaded; new connections use it"
        ),
        Err(error) => tracing::error!(
            %error,
            "SIGHUP: TLS certificate reload failed; still serving the previous certificate"
        ),
    }
}
