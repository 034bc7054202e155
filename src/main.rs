//! The `idemgate` binary: parse the command line, set up logging, and hand
//! over to the library. Errors end here, printed once, with a non-zero exit
//! status: 2 for a configuration the gateway refuses (clap uses 2 for a bad
//! command line too), 3 for a key that is not in the store (`keys`), 1 for
//! anything else.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use idemgate::admin::keys::KeysError;
use idemgate::cli::{Cli, Command};
use idemgate::config::{ConfigError, LogFormat};
use idemgate::{Config, logging, store, telemetry};

/// jemalloc, not glibc's malloc: past capacity, with thousands of
/// connections, glibc's allocator took 18 % of the gateway's CPU
/// (`_int_malloc`, `malloc_consolidate`, `unlink_chunk`; perf, see the
/// performance chapter, "Past capacity").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Failpoints exist only in test builds (the `fail` crate's `failpoints`
    // feature, turned on by the dev-dependency alone): there FAILPOINTS arms
    // the chaos harness's kill windows; a release build ignores it, and says so.
    let _failpoints = fail::has_failpoints().then(fail::FailScenario::setup);
    if !fail::has_failpoints() && std::env::var_os("FAILPOINTS").is_some() {
        eprintln!("idemgate: FAILPOINTS ignored: this build has no failpoints");
    }
    let runtime = tokio::runtime::Runtime::new().expect("cannot start the tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("idemgate: {error:#}");
            std::process::ExitCode::from(exit_status(&error))
        }
    }
}

/// The exit status of a failed command.
fn exit_status(error: &anyhow::Error) -> u8 {
    if error
        .downcast_ref::<KeysError>()
        .is_some_and(KeysError::is_not_found)
    {
        3
    } else if error.downcast_ref::<ConfigError>().is_some() {
        2
    } else {
        1
    }
}

/// `idemgate serve`: bind, serve until SIGTERM or Ctrl-C, then send the
/// last traces (bounded, off the runtime's threads).
async fn serve(config: Config, tracing: Option<telemetry::Tracing>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let served = idemgate::app::run(listener, config, shutdown_signal()).await;
    if let Some(tracing) = tracing {
        let _ = tokio::task::spawn_blocking(move || tracing.shutdown()).await;
    }
    Ok(served?)
}

/// `idemgate migrate`: apply the schema of a PostgreSQL or SQLite store.
async fn migrate(config: &Config) -> anyhow::Result<()> {
    let shown = store::redact_url(&config.store.url);
    match store::migrate(&config.store).await? {
        store::Migrated::Postgres => println!("migrations applied to {shown}"),
        store::Migrated::Sqlite(applied) => println!("{applied} schema scripts applied to {shown}"),
        store::Migrated::Nothing => {
            println!("{shown}: nothing to migrate (only PostgreSQL and SQLite have schemas)")
        }
    }
    Ok(())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Logging starts with the config, whose `log_format` the flag overrides;
    // its guard lives until `run` returns, so queued lines are written.
    let command = cli.command.unwrap_or(Command::Serve);
    // `serve` logs a line per request; the other commands are quiet
    // (warnings and errors) unless RUST_LOG asks for more.
    let default_filter = match command {
        Command::Serve => logging::SERVE_FILTER,
        _ => logging::COMMAND_FILTER,
    };
    let mut log_guard = None;
    // Only `serve` exports traces.
    let serving = matches!(command, Command::Serve);
    let mut tracing = None;
    let mut load = || -> anyhow::Result<Config> {
        let config = Config::load(&cli.config)?;
        let format = cli.log_format.map_or(config.log_format, LogFormat::from);
        if serving {
            tracing = telemetry::start(config.telemetry.as_ref())?;
        }
        log_guard = Some(logging::init(format, default_filter, tracing.as_ref()));
        Ok(config)
    };
    match command {
        Command::Serve => {
            let config = load()?;
            serve(config, tracing.take()).await?;
        }
        Command::Check => {
            let config = load()?;
            let n = config.routes.len();
            let store = store::redact_url(&config.store.url);
            let plural = if n == 1 { "" } else { "s" };
            for warning in config.warnings() {
                println!("warning: {warning}");
            }
            println!(
                "{}: OK ({n} route{plural}, store {store})",
                cli.config.display()
            );
        }
        Command::Migrate => migrate(&load()?).await?,
        Command::Sweep => {
            let config = load()?;
            let store = store::open(&config.store).await?;
            let swept =
                idemgate::app::sweep_once(store.as_ref(), config.store.sweep_batch, None).await;
            store.close().await;
            // PostgreSQL's count is an estimate (a whole generation).
            println!("{} expired records removed", swept?);
        }
        Command::Keys {
            command,
            admin_timeout,
        } => {
            let output = idemgate::cli::keys::run(&load()?, command, admin_timeout).await?;
            print!("{output}");
        }
        Command::Health { admin } => {
            let addr = match admin {
                Some(addr) => addr,
                None => load()?.admin_listen,
            };
            let format = cli.log_format.map(LogFormat::from);
            let format = format.unwrap_or(idemgate::config::DEFAULT_LOG_FORMAT);
            let _health_log = logging::init(format, default_filter, None);
            let addr = idemgate::admin::probe_address(addr);
            let status = idemgate::admin::probe(addr, "/healthz", Duration::from_secs(3))
                .await
                .map_err(anyhow::Error::msg)?;
            anyhow::ensure!(
                status.is_success(),
                "http://{addr}/healthz answered {status}"
            );
            println!("healthy (http://{addr}/healthz)");
        }
    }
    // Write what is still queued before the process exits.
    drop(log_guard);
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("cannot install the SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutdown signal received");
}
