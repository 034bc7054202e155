//! idemgate: an idempotency gateway. A reverse proxy that claims each
//! `Idempotency-Key` in a shared store before forwarding, lets one request per
//! key reach the upstream, records the response, and replays it to every
//! retry. `../shared/DESIGN.md` (shipped in the README) is the contract.
//!
//! # Layout
//! - [`config`]: the TOML file → a validated [`Config`].
//! - [`server`]: accept loop, connection cap, graceful shutdown.
//! - [`handler`]: the request pipeline (route, key, body, claim, forward, record).
//! - [`key`], [`fingerprint`]: key parsing and the request fingerprint.
//! - [`store`]: the [`store::Store`] trait, claim outcomes, and the PostgreSQL,
//!   Redis and in-memory stores.
//! - [`upstream`]: the upstream client and header hygiene.
//! - [`problem`]: every synthetic answer, as `application/problem+json`.
//! - [`admin`]: metrics, health and readiness on the admin listener.
//! - [`metrics`]: the Prometheus metrics and the store wrapper that feeds them.
//! - [`body`]: the body type and bounded reading.
//! - [`cli`]: the command line; [`keys`]: its key administration commands.

pub mod admin;
pub mod body;
pub mod cli;
pub mod config;
pub mod fingerprint;
pub mod handler;
pub mod key;
pub mod keys;
pub mod metrics;
pub mod problem;
pub mod server;
pub mod store;
pub mod upstream;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::Config;
pub use handler::Gateway;

/// Why the gateway could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The store could not be opened or migrated.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The admin listener could not be bound.
    #[error("cannot listen on admin_listen {addr}: {source}")]
    AdminBind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Open the store, then serve the proxy on `listener` (and the admin
/// endpoints on `config.admin_listen`) until `shutdown` resolves; return once
/// every in-flight forward has finished and been recorded.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let store = store::open(&config.store).await?;
    let admin = TcpListener::bind(config.admin_listen)
        .await
        .map_err(|source| RunError::AdminBind {
            addr: config.admin_listen,
            source,
        })?;
    run_with(listener, admin, config, store, shutdown).await;
    Ok(())
}

/// [`run`] with listeners and store already in hand.
pub async fn run_with(
    listener: TcpListener,
    admin: TcpListener,
    config: Config,
    store: Arc<dyn store::Store>,
    shutdown: impl Future<Output = ()>,
) {
    if let (Ok(proxy), Ok(admin)) = (listener.local_addr(), admin.local_addr()) {
        tracing::info!(%proxy, %admin, routes = config.routes.len(), store = %store::redact_url(&config.store.url), "idemgate listening");
    }
    let metrics = Arc::new(metrics::Metrics::new());
    let store: Arc<dyn store::Store> =
        Arc::new(metrics::InstrumentedStore::new(store, metrics.clone()));
    let store = store::with_replay_cache(store, &config.store, metrics.replay_cache_hits.clone());
    let stop_admin = CancellationToken::new();
    let endpoints = Arc::new(admin::Admin {
        store: store.clone(),
        metrics: metrics.clone(),
        config: Arc::new(config.clone()),
    });
    let admin_task = tokio::spawn(admin::serve(
        admin,
        endpoints,
        stop_admin.clone().cancelled_owned(),
    ));
    let sweeper = tokio::spawn(sweep_forever(
        store.clone(),
        config.store.sweep_interval,
        config.store.sweep_batch,
    ));
    let gateway = Arc::new(Gateway::new(&config, store, metrics));
    server::serve(listener, gateway, &config, shutdown).await;
    sweeper.abort();
    stop_admin.cancel();
    let _ = admin_task.await;
}

/// Delete expired records until fewer than a batch remain; returns how many went.
pub async fn sweep_once(store: &dyn store::Store, batch: usize) -> Result<u64, store::StoreError> {
    let mut total = 0;
    loop {
        let deleted = store.sweep(batch).await?;
        total += deleted;
        if deleted < batch as u64 {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}

/// The background sweeper: one pass every `interval`.
async fn sweep_forever(store: Arc<dyn store::Store>, interval: std::time::Duration, batch: usize) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match sweep_once(store.as_ref(), batch).await {
            Ok(0) => {}
            Ok(swept) => tracing::info!(swept, "expired records swept"),
            Err(error) => tracing::warn!(%error, "sweep failed; will retry"),
        }
    }
}
