//! The `idemgate` binary: parse the command line, set up logging, and hand
//! over to the library. Errors end here, printed once, with a non-zero exit.

use std::io::IsTerminal;

use anyhow::Context;
use clap::Parser;
use idemgate::cli::{Cli, Command, LogFormat};
use idemgate::{Config, store};
use tracing_subscriber::EnvFilter;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let runtime = tokio::runtime::Runtime::new().expect("cannot start the tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("idemgate: {error:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn init_logging(format: LogFormat) {
    // sqlx reports migration notices at INFO on every start: keep it to warnings.
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = Config::load(&cli.config)?;
    match cli.command.unwrap_or(Command::Serve) {
        Command::Check => {
            println!(
                "{}: OK ({} route{}, store {})",
                cli.config.display(),
                config.routes.len(),
                if config.routes.len() == 1 { "" } else { "s" },
                store::redact_url(&config.store.url)
            );
            Ok(())
        }
        Command::Migrate => {
            if !config.store.url.starts_with("postgres") {
                println!(
                    "{}: nothing to migrate (only PostgreSQL has migrations)",
                    store::redact_url(&config.store.url)
                );
                return Ok(());
            }
            let pg = store::postgres::PgStore::connect(&config.store).await?;
            pg.migrate().await?;
            println!(
                "migrations applied to {}",
                store::redact_url(&config.store.url)
            );
            Ok(())
        }
        Command::Sweep => {
            let store = store::open(&config.store).await?;
            let swept = idemgate::sweep_once(store.as_ref(), config.store.sweep_batch).await?;
            println!("{swept} expired records deleted");
            Ok(())
        }
        Command::Serve => {
            let listener = tokio::net::TcpListener::bind(config.listen)
                .await
                .with_context(|| format!("cannot listen on {}", config.listen))?;
            idemgate::run(listener, config, shutdown_signal()).await?;
            Ok(())
        }
    }
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
