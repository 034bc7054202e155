//! Live configuration (docs/src/operations/reload.md): on SIGHUP
//! ([`hangup`]) or an authenticated `POST /config/reload` on the admin
//! listener, read the config file again and, if it is valid, swap the
//! routes in at once.
//!
//! A request matches its route in the routes in force when it arrives and
//! keeps that route to its end; the next request sees the new ones. No
//! connection is closed. A file that fails validation, or whose routes do
//! not fit what only a restart changes ([`Config::reload`]), changes
//! nothing: the error is logged with the key it names and counted
//! (`idemgate_config_reloads_total{result="error"}`). Settings that only
//! a restart applies are logged by key, counted in
//! `idemgate_config_restart_pending`, and left as they are.
//!
//! With `watch_config`, a change of the file's bytes reloads too
//! ([`watch`]). The same reload reads the `[tls]` certificate's files
//! again, as it always has on SIGHUP, and the client CAs' (`client_ca`).

pub(crate) mod hangup;
pub(crate) mod watch;

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::{Config, ConfigError};
use crate::handler::{Gateway, connect_timeout};
use crate::inquirer::Inquirer;
use crate::metrics::Metrics;
use crate::server::tls::Certificate;
use crate::tls::TlsFileError;

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The configuration did not come from a file.
    #[error(
        "this gateway's configuration was not read from a file: there is nothing to read again"
    )]
    NoFile,
    /// The file could not be read, or is not valid, or its routes do not
    /// fit the settings in force.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// What a reload applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// The routes now in force.
    pub routes: usize,
    /// Keys the file changes that only a restart applies.
    pub restart_required: Vec<&'static str>,
    /// Applied changes that change which record a request finds.
    pub key_changes: Vec<String>,
}

/// Everything a reload changes, and the configuration in force.
pub struct Reloader {
    current: ArcSwap<Config>,
    /// One reload at a time.
    applying: tokio::sync::Mutex<()>,
    gateway: Arc<Gateway>,
    inquirer: Arc<Inquirer>,
    metrics: Arc<Metrics>,
    certificate: Option<Arc<Certificate>>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("source", &self.current.load().source)
            .finish_non_exhaustive()
    }
}

impl Reloader {
    /// A reloader for a gateway started with `config`.
    pub(crate) fn new(
        config: Config,
        gateway: Arc<Gateway>,
        inquirer: Arc<Inquirer>,
        metrics: Arc<Metrics>,
        certificate: Option<Arc<Certificate>>,
    ) -> Self {
        Self {
            current: ArcSwap::from_pointee(config),
            applying: tokio::sync::Mutex::new(()),
            gateway,
            inquirer,
            metrics,
            certificate,
        }
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<Config> {
        self.current.load_full()
    }

    /// Read the config file again and apply its routes; then read the
    /// certificate again. Logged and counted either way.
    pub async fn reload(&self, trigger: &'static str) -> Result<Reloaded, ReloadError> {
        let _one_at_a_time = self.applying.lock().await;
        let result = self.apply().await;
        match &result {
            Ok(reloaded) => {
                tracing::info!(
                    trigger,
                    routes = reloaded.routes,
                    "configuration reloaded: new requests use the new routes"
                );
                for change in &reloaded.key_changes {
                    tracing::warn!(
                        trigger,
                        "configuration reloaded with a key change: {change}"
                    );
                }
                for key in &reloaded.restart_required {
                    tracing::warn!(
                        trigger,
                        key,
                        "config key `{key}` changed: it takes effect on restart and is ignored until then"
                    );
                }
                self.metrics
                    .reloads
                    .count(Some(reloaded.restart_required.len()));
            }
            Err(error) => {
                tracing::error!(trigger, %error, "configuration reload refused; still serving the previous configuration");
                self.metrics.reloads.count(None);
            }
        }
        if let Some(certificate) = &self.certificate {
            reload_certificate(certificate).await;
        }
        result
    }

    async fn apply(&self) -> Result<Reloaded, ReloadError> {
        let running = self.current.load_full();
        let source = running.source.as_ref().ok_or(ReloadError::NoFile)?;
        let path = source.path.clone();
        let next = tokio::task::spawn_blocking(move || Config::load(&path))
            .await
            .map_err(|join| {
                ConfigError::Syntax(format!("reading the file was interrupted: {join}"))
            })??;
        for warning in next.warnings() {
            tracing::warn!("{warning}");
        }
        let wait_routes = next.store.wait_routes.clone();
        let reload = running.reload(next)?;
        let routes = &reload.config.routes;
        // Announcements first: a route that starts waiting is announced
        // before its first request waits. (A waiter missing an
        // announcement would still claim again at its slow poll.)
        running.store.wait_routes.follow(&wait_routes);
        self.gateway.set_routes(routes);
        self.inquirer.set_routes(routes, connect_timeout(routes));
        let reloaded = Reloaded {
            routes: routes.len(),
            restart_required: reload.restart_required,
            key_changes: reload.key_changes,
        };
        self.current.store(Arc::new(reload.config));
        Ok(reloaded)
    }
}

/// Read the certificate's files again, then the client CAs' (each apart),
/// off the runtime's threads; a failure keeps what is in use.
async fn reload_certificate(certificate: &Arc<Certificate>) {
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
            "TLS certificate reloaded; new connections use it"
        ),
        Err(error) => tracing::error!(
            %error,
            "TLS certificate reload failed; still serving the previous certificate"
        ),
    }
    let Some(ca) = certificate.client_ca_path() else {
        return;
    };
    let reading = certificate.clone();
    let reloaded = tokio::task::spawn_blocking(move || reading.reload_client_ca()).await;
    match reloaded.unwrap_or_else(|join| Some(Err(TlsFileError::invalid(ca, join.to_string())))) {
        None => {}
        Some(Ok(())) => tracing::info!(
            client_ca = %ca.display(),
            "TLS client CAs reloaded; new connections' client certificates are verified against them"
        ),
        Some(Err(error)) => tracing::error!(
            %error,
            "TLS client CA reload failed; still verifying client certificates against the previous CAs"
        ),
    }
}
