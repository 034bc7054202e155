//! Wiring one gateway together: open the store, wrap its request path
//! (metrics, sealing, replay cache), start the admin listener and the sweeper, and
//! serve the proxy until shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::clock::Instant;
use crate::config::Config;
use crate::handler::Gateway;
use crate::inquirer::{self, Inquirer};
use crate::metrics::metered::InstrumentedStore;
use crate::metrics::{Metrics, plain_result};
use crate::reload::{Reloader, hangup, watch};
use crate::store::waiters::Waiters;
use crate::store::{self, Backend, Store, StoreAdmin, StoreError};
use crate::{admin, server};

/// Why the gateway could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The store could not be opened or migrated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The proxy listener's certificate could not be loaded.
    #[error("cannot load the TLS certificate: {0}")]
    Tls(#[from] crate::tls::TlsFileError),
    /// The serving threads (`server_threads`) could not be started.
    #[error("cannot start the serving threads (server_threads): {0}")]
    Threads(std::io::Error),
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
    run_with(listener, admin, config, store, shutdown).await
}

/// [`run`] with listeners and store already in hand. Fails only if the
/// `[tls]` certificate cannot be loaded (before anything is served).
pub async fn run_with(
    listener: TcpListener,
    admin: TcpListener,
    config: Config,
    backend: Arc<dyn Backend>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let tls = config
        .tls
        .as_ref()
        .map(server::tls::Certificate::load)
        .transpose()?;
    if let (Ok(proxy), Ok(admin)) = (listener.local_addr(), admin.local_addr()) {
        tracing::info!(%proxy, %admin, tls = tls.is_some(), routes = config.routes.len(), store = %store::redact_url(&config.store.url), "idemgate listening");
    }
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let metrics = Arc::new(Metrics::new());
    let records: Arc<dyn StoreAdmin> = backend.clone();
    let waiters = Waiters::new();
    let relay = start_relay(backend.clone(), waiters.clone());
    let path = request_path(backend, &config, &metrics);
    let sweeper = tokio::spawn(sweep_forever(
        records.clone(),
        metrics.clone(),
        config.store.sweep_interval,
        config.store.sweep_batch,
    ));
    let threads = start_threads(&config, &records).await?;
    let inquirer = Arc::new(Inquirer::new(
        &config.routes,
        records.clone(),
        path.clone(),
        metrics.clone(),
        crate::handler::connect_timeout(&config.routes),
    ));
    let inquiring = inquirer::start(inquirer.clone());
    let gateway = Arc::new(Gateway::new(
        &config,
        path.clone(),
        metrics.clone(),
        waiters,
    ));
    let reloader = Arc::new(Reloader::new(
        config.clone(),
        gateway.clone(),
        inquirer,
        metrics.clone(),
        tls.clone(),
    ));
    let watching = config
        .watch_config
        .map(|every| tokio::spawn(watch::watch(reloader.clone(), every)));
    let hangups =
        hangup::listen().map(|signal| tokio::spawn(hangup::answer(signal, reloader.clone())));
    let stop_admin = CancellationToken::new();
    let endpoints = Arc::new(admin::Admin {
        store: path,
        records: records.clone(),
        metrics,
        settings: config.clone(),
        reloader,
    });
    let admin_task = tokio::spawn(admin::serve(
        admin,
        endpoints,
        stop_admin.clone().cancelled_owned(),
    ));
    server::serve(listener, gateway, threads, &config, tls, shutdown).await;
    // The SIGHUP handler stays installed: a SIGHUP while draining is ignored.
    let background = [Some(sweeper), Some(inquiring), hangups, watching, relay];
    for task in background.into_iter().flatten() {
        task.abort();
    }
    stop_admin.cancel();
    let _ = admin_task.await;
    // Bounded: a store that cannot close in time is left to the process's end.
    if tokio::time::timeout(config.store.timeout, records.close())
        .await
        .is_err()
    {
        tracing::warn!(
            "the store did not close within [store] timeout; leaving it to the process's end"
        );
    }
    tracing::info!("idemgate stopped");
    Ok(())
}

/// The store's request path, wrapped: measured, sealed, then cached. Sealed
/// below the cache: the store sees sealed bytes only, the cache holds
/// opened responses in this process's memory.
fn request_path(
    backend: Arc<dyn Backend>,
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Arc<dyn Store> {
    let path: Arc<dyn Store> = Arc::new(InstrumentedStore::new(backend, metrics.clone()));
    let hits = metrics.replay_cache_hits.clone();
    let on_hit: store::OnHit = Box::new(move || {
        hits.inc();
    });
    let opened = metrics.clone();
    let on_open: store::seal::OnOpen = Box::new(move |key, result| {
        opened.sealing.opened(key, result);
    });
    let path = store::with_sealing(path, &config.store, on_open);
    store::with_replay_cache(path, &config.store, on_hit)
}

/// The serving threads (`server_threads`), each with the store's
/// connections opened on it; `None` for 0 (the shared runtime serves).
async fn start_threads(
    config: &Config,
    records: &Arc<dyn StoreAdmin>,
) -> Result<Option<crate::serving_threads::ServingThreads>, RunError> {
    let threads = (config.server_threads > 0)
        .then(|| crate::serving_threads::ServingThreads::start(config.server_threads))
        .transpose()
        .map_err(RunError::Threads)?;
    if let Some(threads) = &threads {
        threads
            .on_each(|| {
                let (records, n) = (records.clone(), config.server_threads);
                async move { records.open_serving_thread(n).await }
            })
            .await;
    }
    Ok(threads)
}

/// Start the store's wake-up relay. Its first steps run here, before any
/// request is served, so a store that announces in process (memory) is
/// wired before the first request; one that listens on a connection goes on
/// in a task of its own (returned).
fn start_relay(
    backend: Arc<dyn Backend>,
    waiters: Arc<Waiters>,
) -> Option<tokio::task::JoinHandle<()>> {
    let mut relay = Box::pin(async move { backend.relay_wakeups(waiters).await });
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    // A pending future re-registers its interests when the task polls it.
    relay
        .as_mut()
        .poll(&mut cx)
        .is_pending()
        .then(|| tokio::spawn(relay))
}

/// Sweep until a step says nothing more is due; returns how many records
/// went. With `metrics`, each step is measured and counted.
pub async fn sweep_once(
    store: &dyn StoreAdmin,
    batch: usize,
    metrics: Option<&Metrics>,
) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let started = Instant::now();
        let step = store.sweep(batch).await;
        if let Some(metrics) = metrics {
            metrics.store_op("sweep", plain_result(&step), started.elapsed());
            if let Ok(step) = step {
                metrics.records_swept.inc_by(step.records);
            }
        }
        let step = step?;
        total += step.records;
        if !step.more {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}

/// The background sweeper: one pass every `interval`.
async fn sweep_forever(
    store: Arc<dyn StoreAdmin>,
    metrics: Arc<Metrics>,
    interval: Duration,
    batch: usize,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match sweep_once(store.as_ref(), batch, Some(&metrics)).await {
            Ok(0) => {}
            Ok(swept) => tracing::info!(swept, "expired records swept"),
            Err(error) => tracing::warn!(%error, "sweep failed; will retry"),
        }
    }
}
