//! `idemgate keys …`: key administration for operators, on the store the
//! configuration names. Finds a record by route, scope value and key exactly
//! as the gateway does, and prints it for a person (or as JSON).
//!
//! PostgreSQL and Redis are reached directly. A `memory://` store lives in
//! the gateway process: the command is sent to that gateway's admin listener
//! (`POST /keys`), which runs [`execute`] on its own store.

use std::fmt::Write as _;
use std::time::SystemTime;

use http::HeaderValue;

use crate::cli::{KeyArgs, KeysCommand};
use crate::config::Config;
use crate::store::{self, RecordInfo, RecordKey, StoreError};

/// Why a keys command could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// The route is not in the configuration.
    #[error("no route named {0:?} in the configuration")]
    NoRoute(String),
    /// `--scope` on a route without `scope_header`.
    #[error("route {0:?} has no scope_header, so --scope does not apply")]
    NoScope(String),
    /// The key is not a valid idempotency key.
    #[error("invalid key: {0}")]
    InvalidKey(#[from] crate::key::KeyError),
    /// No record for the key.
    #[error(
        "no record for key {key:?} on route {route:?} (never seen, released, deleted or expired)"
    )]
    NotFound {
        /// The route.
        route: String,
        /// The key.
        key: String,
    },
    /// release/delete on a key whose lease is live, without --force.
    #[error(
        "key {key:?} is in flight: an attempt holds its lease until {until} and may be at the upstream now; wait for it, or add --force"
    )]
    LiveLease {
        /// The key.
        key: String,
        /// When the lease ends.
        until: String,
    },
    /// `release` on a completed record.
    #[error(
        "key {0:?} has a recorded response, which release leaves alone; use `keys delete` to forget it"
    )]
    Completed(String),
    /// The gateway's admin listener (memory store) refused or failed.
    #[error("{0}")]
    Admin(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl KeysError {
    /// The admin listener's answer status for this error.
    pub fn status(&self) -> http::StatusCode {
        use http::StatusCode as S;
        match self {
            Self::NoRoute(_) | Self::NotFound { .. } => S::NOT_FOUND,
            Self::NoScope(_) | Self::InvalidKey(_) => S::BAD_REQUEST,
            Self::LiveLease { .. } | Self::Completed(_) => S::CONFLICT,
            Self::Store(_) | Self::Admin(_) => S::SERVICE_UNAVAILABLE,
        }
    }
}

/// Run one keys command; returns what to print.
pub async fn run(config: &Config, command: KeysCommand) -> Result<String, KeysError> {
    if config.store.url.starts_with("memory:") {
        return remote(config.admin_listen, &command).await;
    }
    let store = store::open(&config.store).await?;
    execute(config, store.as_ref(), command).await
}

/// Send a keys command to a running gateway's admin listener.
async fn remote(admin: std::net::SocketAddr, command: &KeysCommand) -> Result<String, KeysError> {
    use http_body_util::BodyExt;
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    let addr = crate::admin::probe_address(admin);
    let unreachable = |e: &dyn std::fmt::Display| {
        KeysError::Admin(format!(
            "a memory:// store lives inside the gateway: cannot reach its admin listener at {addr} ({e}); is the gateway running with this config?"
        ))
    };
    let client: Client<HttpConnector, crate::body::Body> =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new());
    let body = serde_json::to_vec(command).expect("commands serialise");
    let request = http::Request::post(format!("http://{addr}/keys"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(crate::body::full(body))
        .expect("a valid request");
    let response = client.request(request).await.map_err(|e| unreachable(&e))?;
    let status = response.status();
    let text = response
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(&e))?
        .to_bytes();
    let text = String::from_utf8_lossy(&text).into_owned();
    if status.is_success() {
        Ok(text)
    } else {
        Err(KeysError::Admin(text.trim_end().to_string()))
    }
}

/// Run one keys command on `store`; returns what to print.
pub async fn execute(
    config: &Config,
    store: &dyn store::Store,
    command: KeysCommand,
) -> Result<String, KeysError> {
    match command {
        KeysCommand::Show(args) => {
            let key = record_key(config, &args)?;
            let info = store.inspect(&key).await?.ok_or_else(|| not_found(&key))?;
            Ok(if args.json {
                json(&info)
            } else {
                describe(&info)
            })
        }
        KeysCommand::List {
            route,
            state,
            limit,
            json: as_json,
        } => {
            if !config.routes.iter().any(|r| r.name == route) {
                return Err(KeysError::NoRoute(route));
            }
            let found = store.list(&route, state, limit).await?;
            Ok(if as_json { json(&found) } else { table(&found) })
        }
        KeysCommand::Release(args) => {
            let key = record_key(config, &args)?;
            if store.clear(&key, args.force).await? {
                return Ok(format!(
                    "released {:?} on route {:?}: the next request with it is forwarded\n",
                    key.key, key.route
                ));
            }
            Err(why_not(store.inspect(&key).await?, key))
        }
        KeysCommand::Delete(args) => {
            let key = record_key(config, &args)?;
            if store.delete(&key, args.force).await? {
                Ok(format!("deleted {:?} on route {:?}\n", key.key, key.route))
            } else {
                Err(why_not(store.inspect(&key).await?, key))
            }
        }
    }
}

/// Why a release or delete removed nothing.
fn why_not(found: Option<RecordInfo>, key: RecordKey) -> KeysError {
    match found {
        None => not_found(&key),
        Some(info) => match info.lease_until {
            Some(until) if info.state == store::RecordState::InFlight => KeysError::LiveLease {
                key: key.key,
                until: time(until),
            },
            _ => KeysError::Completed(key.key),
        },
    }
}

fn not_found(key: &RecordKey) -> KeysError {
    KeysError::NotFound {
        route: key.route.clone(),
        key: key.key.clone(),
    }
}

/// The record key the gateway would use for this route, scope value and key.
fn record_key(config: &Config, args: &KeyArgs) -> Result<RecordKey, KeysError> {
    let route = config
        .routes
        .iter()
        .find(|r| r.name == args.route)
        .ok_or_else(|| KeysError::NoRoute(args.route.clone()))?;
    let scope = match (&route.scope_header, &args.scope) {
        (Some(_), value) => store::scope_digest(value.iter().map(|v| v.as_bytes())),
        (None, Some(_)) => return Err(KeysError::NoScope(route.name.clone())),
        (None, None) => Vec::new(),
    };
    let value = HeaderValue::from_str(&args.key).map_err(|_| crate::key::KeyError::BadCharacter)?;
    Ok(RecordKey {
        route: route.name.clone(),
        scope,
        key: crate::key::parse(&value)?,
    })
}

fn json<T: serde::Serialize>(value: &T) -> String {
    let mut out = serde_json::to_string_pretty(value).expect("records serialise");
    out.push('\n');
    out
}

fn time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn describe(info: &RecordInfo) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: String| {
        let _ = writeln!(out, "{label:<9}{value}");
    };
    line("route", info.route.clone());
    line("key", info.key.clone());
    line(
        "scope",
        if info.scope.is_empty() {
            "(unscoped route)".into()
        } else {
            format!("sha256:{}", info.scope)
        },
    );
    line(
        "state",
        match info.held_reason {
            Some(reason) => format!("{} ({reason})", info.state.as_str()),
            None => info.state.as_str().to_string(),
        },
    );
    line("token", info.token.to_string());
    line("created", time(info.created_at));
    line("updated", time(info.updated_at));
    line("expires", time(info.expires_at));
    if let Some(lease) = info.lease_until {
        let lapsed = if lease < SystemTime::now() {
            " (lapsed)"
        } else {
            ""
        };
        line("lease", format!("{}{lapsed}", time(lease)));
    }
    if let (Some(status), Some(bytes)) = (info.status, info.body_bytes) {
        line("response", format!("{status}, {bytes} bytes"));
    }
    out
}

fn table(found: &[RecordInfo]) -> String {
    let mut out = format!("{:<10} {:>8} {:<22} KEY\n", "STATE", "TOKEN", "UPDATED");
    for info in found {
        let _ = writeln!(
            out,
            "{:<10} {:>8} {:<22} {}",
            info.state.as_str(),
            info.token,
            time(info.updated_at),
            info.key
        );
    }
    let _ = writeln!(
        out,
        "({} record{})",
        found.len(),
        if found.len() == 1 { "" } else { "s" }
    );
    out
}
