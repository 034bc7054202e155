//! Configuration: the TOML file of docs/src/reference/configuration.md, parsed into raw structs
//! that mirror the file one to one, then validated into a [`Config`] the rest
//! of the gateway can trust (no `Option`s left to interpret, no strings left
//! to parse on the request path).
//!
//! Rules, each with a test beside the code that applies it:
//! - unknown keys are errors that name the key's full path (`raw`);
//! - every string value expands `${VAR}` and `${VAR:-default}` (`env`);
//! - durations (`"30s"`, `"24h"`) and sizes (`"1MiB"`) are human strings (`values`);
//! - `[defaults]` sets any route setting for all routes; a route's own value
//!   wins (`raw`);
//! - every setting is declared once, with its default, reload class and
//!   description, in the settings table (`settings`); `defaults` reads typed
//!   constants out of it;
//! - values are checked, and the first bad one named, by `validate`.
//!
//! The store's own settings type, [`StoreConfig`], lives in [`crate::store`];
//! this module parses the `[store]` table into it.

pub mod defaults;
mod env;
mod inquiry;
mod raw;
mod record_keys;
mod reload;
mod route;
mod secret;
pub mod settings;
mod telemetry;
mod tls;
mod validate;
mod values;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use sha2::Digest;

pub use crate::store::{StoreConfig, UnknownOutcome};
pub use defaults::*;
pub use inquiry::Inquiry;
pub use reload::Reload;
pub use route::{Concurrent, LogFormat, OnStoreError, PathMatch, RecordPolicy, Route, RouteMode};
pub use secret::AdminToken;
pub use telemetry::Telemetry;
pub use tls::{ClientAuth, ClientCerts, ListenerTls, UpstreamCa};

/// A configuration problem, with the key it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read. (Its reason is part of the message, not
    /// a source, so it is printed once.)
    #[error("cannot read config file {path}: {reason}{hint}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: std::io::Error,
        /// What to do, when the file is missing.
        hint: &'static str,
    },
    /// The file is not valid TOML.
    #[error("config is not valid TOML: {0}")]
    Syntax(String),
    /// A key is unknown or has a value of the wrong type.
    #[error("config key `{path}`: {message}")]
    Shape {
        /// Dotted path of the offending key.
        path: String,
        /// What serde said about it.
        message: String,
    },
    /// A value is well-formed TOML but not acceptable.
    #[error("config key `{key}`: {message}")]
    Invalid {
        /// Dotted path of the offending key.
        key: String,
        /// What is wrong and what would be right.
        message: String,
    },
}

/// A [`ConfigError::Invalid`] for `key`.
fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// An inquiry whose first question may come while the upstream is still
/// working on the request (`after` shorter than `upstream_timeout`), and
/// one whose questions carry a fence its forwards do not (`forward_attempt
/// = false`). Not errors: only the user knows the upstream's own
/// processing timeout, and whether it fences by other means.
fn inquiry_warnings(routes: &[Route]) -> Vec<String> {
    let mut warnings = Vec::new();
    for route in routes {
        let Some(inquiry) = &route.inquiry else {
            continue;
        };
        let after = inquiry.after;
        if after < route.upstream_timeout {
            warnings.push(format!(
                "route {:?}: inquiry.after ({after:?}) is shorter than its upstream_timeout \
                 ({:?}); the upstream may still be working on a request whose connection \
                 broke when it is asked, and a 404 then releases a key it is acting on. \
                 Make after longer than the upstream's own processing timeout",
                route.name, route.upstream_timeout
            ));
        }
        if !route.forward_attempt {
            warnings.push(format!(
                "route {:?}: forward_attempt = false on a route that inquires: its questions \
                 carry Idempotency-Attempt, its forwards do not, so an upstream that fences by \
                 token (as the lookup's contract asks) cannot tell a late original from a \
                 retry. Leave forward_attempt unset (true on such a route)",
                route.name
            ));
        }
    }
    warnings
}

/// The validated configuration of one gateway process.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address of the proxy listener.
    pub listen: SocketAddr,
    /// The proxy listener's certificate (`[tls]`); `None`: cleartext.
    pub tls: Option<ListenerTls>,
    /// Address of the admin listener (health, readiness).
    pub admin_listen: SocketAddr,
    /// The bearer token `POST /keys` requires; `None`: key administration
    /// over HTTP is refused.
    pub admin_token: Option<AdminToken>,
    /// Most client connections served at once; further ones wait in the backlog.
    pub max_connections: usize,
    /// Threads serving client connections, each with its own runtime and
    /// upstream pool (`crate::serving_threads`); 0: they are served on the
    /// process's shared runtime.
    pub server_threads: usize,
    /// Time a client has to send its request headers.
    pub header_read_timeout: Duration,
    /// A connection with no request in progress for this long is closed.
    pub idle_timeout: Duration,
    /// Time a client has to send a protected request's whole body.
    pub body_read_timeout: Duration,
    /// HTTP/2 ping interval.
    pub http2_keep_alive_interval: Duration,
    /// An unanswered HTTP/2 ping closes the connection after this long.
    pub http2_keep_alive_timeout: Duration,
    /// Requests one HTTP/2 connection may have open at once.
    pub http2_max_concurrent_streams: u32,
    /// Unread request body bytes one HTTP/2 stream may have in flight.
    pub http2_stream_window: u32,
    /// The same for all streams of one HTTP/2 connection.
    pub http2_connection_window: u32,
    /// Protected request bodies held in memory at once, in bytes.
    pub max_buffered_request_bytes: usize,
    /// Claimed forwards at once.
    pub max_forwards_in_flight: usize,
    /// Requests waiting for an in-flight key at once (`concurrent = "wait"`).
    pub max_waiting: usize,
    /// Connections the admin listener serves at once.
    pub admin_max_connections: usize,
    /// A request head's size limit, in bytes.
    pub max_header_bytes: usize,
    /// The longest a graceful shutdown waits, in all, for open connections
    /// and in-flight forwards.
    pub shutdown_timeout: Duration,
    /// How often the config file is read to reload it when it changed
    /// (`crate::reload`); `None`: on SIGHUP and `POST /config/reload` only.
    pub watch_config: Option<Duration>,
    /// Base URL of the error documentation, sent as `Link: rel="describedby"`.
    pub docs_url: Option<String>,
    /// How logs are written (the command line's `--log-format` wins).
    pub log_format: LogFormat,
    /// Where traces go (`[telemetry]`); the `OTEL_*` variables also turn
    /// tracing on (src/telemetry/).
    pub telemetry: Option<Telemetry>,
    /// The record store.
    pub store: StoreConfig,
    /// Routes, in file order.
    pub routes: Vec<Route>,
    /// The file this configuration was read from ([`Config::load`]),
    /// which a reload reads again; `None`: it came from text, and there is
    /// nothing to reload.
    pub source: Option<Source>,
    /// Settings the file writes that this configuration does not act on,
    /// one sentence each (part of [`Config::warnings`]).
    pub unused: Vec<String>,
}

/// The file a configuration was read from, and what it held then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The path, as given.
    pub path: std::path::PathBuf,
    /// SHA-256 of the bytes read.
    pub digest: [u8; 32],
}

impl Config {
    /// Settings that are valid but probably not what was meant, one
    /// sentence each: `idemgate check` prints them, `serve` logs them.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = self.unused.clone();
        warnings.extend(inquiry_warnings(&self.routes));
        warnings
    }

    /// Read, expand and validate a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|reason| ConfigError::Read {
            path: path.display().to_string(),
            hint: match reason.kind() {
                std::io::ErrorKind::NotFound => {
                    " (name the file with --config FILE or IDEMGATE_CONFIG)"
                }
                _ => "",
            },
            reason,
        })?;
        let mut config = Self::parse(&text)?;
        config.source = Some(Source {
            path: path.to_path_buf(),
            digest: sha2::Sha256::digest(text.as_bytes()).into(),
        });
        Ok(config)
    }

    /// Expand and validate config text, reading `${VAR}` from the process environment.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        Self::parse_with_env(text, &|name| std::env::var(name).ok())
    }

    /// Expand and validate config text with an explicit environment.
    pub fn parse_with_env(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut value: toml::Value = toml::from_str(text).map_err(|e| syntax(text, &e))?;
        env::expand_value(&mut value, "", env)?;
        let raw: raw::RawConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let message = e.into_inner().to_string();
            ConfigError::Shape {
                message: if holds_secret(&path) {
                    unquoted(&message)
                } else {
                    message
                },
                path,
            }
        })?;
        validate::validate(raw)
    }
}

/// A syntax error by line and column, without the line itself (it may
/// hold a secret written in the file).
fn syntax(text: &str, error: &toml::de::Error) -> ConfigError {
    let Some(span) = error.span() else {
        return ConfigError::Syntax(error.message().to_string());
    };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |at| at + 1) + 1;
    ConfigError::Syntax(format!("line {line}, column {column}: {}", error.message()))
}

/// Whether a setting's value may hold a secret (a token, a record key, a
/// password in a URL, an inquiry's `Authorization` header): its shape
/// errors never quote it.
fn holds_secret(path: &str) -> bool {
    path.contains("token")
        || path.contains("encryption_keys")
        || path.contains("headers")
        || path.ends_with("url")
}

/// A shape error without the value it quotes: what was expected only.
fn unquoted(message: &str) -> String {
    let expected = message
        .split_once(", expected ")
        .map_or(String::new(), |(_, expected)| {
            format!(" (expected {expected})")
        });
    format!("the value does not fit{expected}; it is not shown, as this setting may hold a secret")
}

/// What the tests of every config file share: the smallest valid file and
/// a parser with an empty environment.
#[cfg(test)]
pub(crate) mod tests {
    use super::{Config, ConfigError};

    pub(crate) const MINIMAL: &str = r#"
        [[routes]]
        name = "payments"
        match = "/v1/payments/*"
        upstream = "http://127.0.0.1:9000"
    "#;

    pub(crate) fn no_env(_: &str) -> Option<String> {
        None
    }

    pub(crate) fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse_with_env(text, &no_env)
    }

    /// The message of the error `text` must fail with.
    pub(crate) fn error(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    /// The message of the error [`MINIMAL`] fails with once `line` is added
    /// to its route.
    pub(crate) fn route_error(line: &str) -> String {
        error(&format!("{MINIMAL}\n{line}\n"))
    }

    #[test]
    fn syntax_errors_and_unreadable_files_are_reported() {
        let err = parse("listen = ").unwrap_err();
        assert!(matches!(err, ConfigError::Syntax(_)), "{err}");
        let err = Config::load(std::path::Path::new("/nonexistent/gateway.toml")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/gateway.toml"),
            "{err}"
        );
    }

    /// A secret given in the wrong shape, or on a line with a syntax
    /// error, never appears in the error: it reaches logs, `check` output
    /// and a reload's answer. (The control: a setting that holds no secret
    /// still quotes its value, which helps.)
    #[test]
    fn errors_never_quote_a_secret() {
        let key = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
        let secret = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";
        let env = |name: &str| (name == "KEY").then(|| key.to_string());
        let shapes = [
            format!("[store]\nencryption_keys = \"{key}\"\n{MINIMAL}"),
            format!("[store]\nencryption_keys = \"${{KEY}}\"\n{MINIMAL}"),
            format!("admin_token = [\"{key}\"]\n{MINIMAL}"),
            format!("[store]\nurl = [\"postgres://u:{secret}@h/db\"]\n{MINIMAL}"),
            format!("[store]\nencryption_keys = [\"{key}\" \"x\"]\n{MINIMAL}"),
        ];
        for text in &shapes {
            let err = Config::parse_with_env(text, &env).unwrap_err().to_string();
            assert!(!err.contains(secret), "{err}");
            assert!(err.contains("line") || err.contains("not shown"), "{err}");
        }
        let err = error(&format!("[store]\nmigrate = \"{secret}\"\n{MINIMAL}"));
        assert!(err.contains(secret), "{err}");
    }
}
