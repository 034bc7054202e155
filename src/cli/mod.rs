//! The command line (clap): `serve` (the default), `check`, `migrate`,
//! `sweep`, `keys`, `health`. The CLI owns these types; domain types derive
//! no clap traits, and each flag is converted to its domain value here.

pub mod keys;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::LogFormat;
use crate::store::RecordState;

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
    /// Log format: `text` for a terminal, `json` for production (default:
    /// the config's `log_format`, else `text`).
    #[arg(long, global = true, env = "IDEMGATE_LOG_FORMAT")]
    pub log_format: Option<LogFormatArg>,
    /// What to do (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormatArg {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(arg: LogFormatArg) -> Self {
        match arg {
            LogFormatArg::Text => Self::Text,
            LogFormatArg::Json => Self::Json,
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway (the default).
    Serve,
    /// Validate the configuration and exit (non-zero, naming the key, if invalid).
    Check,
    /// Apply the store's schema and exit (PostgreSQL, SQLite; Redis and
    /// memory have none).
    Migrate,
    /// Delete expired records once and exit (the server also sweeps in the background).
    Sweep,
    /// Key administration: inspect, list, release, delete and erase records in the
    /// store the config names (SQLite, PostgreSQL or Redis directly; a
    /// memory:// store through the running gateway's admin listener). Exit
    /// status 3: no record for that key.
    Keys {
        /// What to do with keys.
        #[command(subcommand)]
        command: KeysCommand,
        /// How long to wait for a running gateway's admin listener (memory:// stores).
        #[arg(long, global = true, default_value = "10s", value_parser = humantime::parse_duration)]
        admin_timeout: Duration,
    },
    /// Ask a running gateway's admin listener for `/healthz`; exit 0 if healthy.
    /// For container health checks (no shell or curl needed).
    Health {
        /// The admin address (default: `admin_listen` from the config, with
        /// an unspecified IP such as 0.0.0.0 probed on loopback).
        #[arg(long)]
        admin: Option<std::net::SocketAddr>,
    },
}

/// `idemgate keys …`, converted to the admin API's
/// [`crate::admin::keys::KeyCommand`] by [`keys::command`].
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Show one key's record: state, token, timestamps, response status and size.
    Show(KeyArgs),
    /// List a route's keys in one state, least recently changed first.
    List {
        /// The route's name.
        #[arg(long)]
        route: String,
        /// Which state.
        #[arg(long, value_enum)]
        state: StateArg,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Clear a held or inquiring key (or an in-flight one whose lease
    /// lapsed) so the next request with it is forwarded.
    ///
    /// A live lease, or an inquiring key inside its route's `after` (its
    /// first question neither asked nor due yet), is refused without
    /// --force: the upstream may still be working on the request.
    Release(KeyArgs),
    /// Forget a key in any state (a recorded response too).
    ///
    /// A live lease, or an inquiring key inside its route's `after`, is
    /// refused without --force, as by `release`.
    Delete(KeyArgs),
    /// Forget every record of one scope (a tenant's: an erasure request),
    /// on every route that reads a scope, in any state; prints how many
    /// records each route lost.
    ///
    /// The scope's values give each route's digest as the gateway computes
    /// it (routes reading their scope from another number of parts are
    /// skipped); a digest (as `keys show` prints it) is taken as it is on
    /// every scoped route. Records the upstream may still be working on (a
    /// live lease, an inquiring key inside its route's `after`) are left,
    /// and counted, without --force.
    Erase(EraseArgs),
}

/// Which scope to erase.
#[derive(Debug, Args)]
pub struct EraseArgs {
    /// The scope's value (e.g. the `Authorization` value), or one
    /// `--scope` per `scope_from` part, in order.
    #[arg(
        long,
        required_unless_present = "scope_digest",
        conflicts_with = "scope_digest"
    )]
    pub scope: Vec<String>,
    /// The scope's digest, as `keys show` prints it (`sha256:` and 64 hex
    /// digits, or the digits alone).
    #[arg(long, value_name = "HEX")]
    pub scope_digest: Option<String>,
    /// Also remove records the upstream may still be working on: the next
    /// request with such a key will be forwarded while the first may still
    /// act.
    #[arg(long)]
    pub force: bool,
}

/// `--state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    /// An attempt holds (or held) a lease.
    #[value(name = "in_flight")]
    InFlight,
    /// A response is recorded.
    Completed,
    /// The outcome is unknown or the response was not retained.
    Held,
    /// The outcome is unknown and the upstream is being asked.
    Inquiring,
}

impl From<StateArg> for RecordState {
    fn from(arg: StateArg) -> Self {
        match arg {
            StateArg::InFlight => Self::InFlight,
            StateArg::Completed => Self::Completed,
            StateArg::Held => Self::Held,
            StateArg::Inquiring => Self::Inquiring,
        }
    }
}

/// Which key.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The route's name.
    #[arg(long)]
    pub route: String,
    /// The scope: the `scope_header` value (e.g. the `Authorization`
    /// value), or one `--scope` per `scope_from` part, in order; omitted:
    /// the anonymous scope.
    #[arg(long)]
    pub scope: Vec<String>,
    /// The key, bare or quoted as clients send it (a route whose key has
    /// one part).
    #[arg(required_unless_present = "parts", conflicts_with = "parts")]
    pub key: Option<String>,
    /// A composite key: one `--part` per `key_from` part, in order (e.g.
    /// `--part saga-7 --part 3` for `key_from = ["header:X-Saga-Id",
    /// "json:/step"]`).
    #[arg(long = "part", value_name = "VALUE")]
    pub parts: Vec<String>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// release/delete: also remove an in-flight key whose lease is live, or
    /// an inquiring key inside its route's `after` (its first question
    /// neither asked nor due yet): the upstream may still be working on the
    /// request, and the next request will be forwarded while it may still
    /// act.
    #[arg(long)]
    pub force: bool,
}
