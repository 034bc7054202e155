//! The command line (clap): `serve` (the default), `check`, `migrate`,
//! `sweep`, `health`.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// idemgate: an idempotency gateway for HTTP APIs.
#[derive(Debug, Parser)]
#[command(name = "idemgate", version, about)]
pub struct Cli {
    /// The configuration file.
    #[arg(
        long,
        short,
        global = true,
        env = "IDEMGATE_CONFIG",
        default_value = "gateway.toml"
    )]
    pub config: PathBuf,
    /// Log format: `text` for a terminal, `json` for production.
    #[arg(
        long,
        global = true,
        env = "IDEMGATE_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// What to do (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// A log format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway (the default).
    Serve,
    /// Validate the configuration and exit (non-zero, naming the key, if invalid).
    Check,
    /// Apply the store's migrations and exit (PostgreSQL).
    Migrate,
    /// Delete expired records once and exit (the server also sweeps in the background).
    Sweep,
    /// Ask a running gateway's admin listener for `/healthz`; exit 0 if healthy.
    /// For container health checks (no shell or curl needed).
    Health {
        /// The admin address (default: `admin_listen` from the config, with
        /// an unspecified IP such as 0.0.0.0 probed on loopback).
        #[arg(long)]
        admin: Option<std::net::SocketAddr>,
    },
}
