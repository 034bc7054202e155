//! Configuration: the TOML file of DESIGN.md §5, parsed into raw structs that
//! mirror the file one to one, then validated into a [`Config`] the rest of
//! the gateway can trust (no `Option`s left to interpret, no strings left to
//! parse on the request path).
//!
//! Rules, each with a test below:
//! - unknown keys are errors that name the key's full path;
//! - every string value expands `${VAR}` and `${VAR:-default}`;
//! - durations (`"30s"`, `"24h"`) and sizes (`"1MiB"`) are human strings;
//! - `[defaults]` sets any route setting for all routes; a route's own value wins.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, Uri};
use serde::Deserialize;

use crate::fingerprint::{BodyMode, FingerprintSpec};
pub use crate::store::{StoreConfig, UnknownOutcome};

/// A configuration problem, with the key it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
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

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// The validated configuration of one gateway process.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address of the proxy listener.
    pub listen: SocketAddr,
    /// Address of the admin listener (health, readiness).
    pub admin_listen: SocketAddr,
    /// Most client connections served at once; further ones wait in the backlog.
    pub max_connections: usize,
    /// Time a client has to send its request headers.
    pub header_read_timeout: Duration,
    /// Longest graceful shutdown waits for in-flight forwards before exiting.
    pub shutdown_timeout: Duration,
    /// Base URL of the error documentation, sent as `Link: rel="describedby"`.
    pub docs_url: Option<String>,
    /// How logs are written (the command line's `--log-format` wins).
    pub log_format: LogFormat,
    /// The record store.
    pub store: StoreConfig,
    /// Routes, in file order.
    pub routes: Vec<Route>,
}

/// How a route's path is matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// The path equals this string.
    Exact(String),
    /// The path starts with this string (which ends in `/`), or equals it without the `/`.
    Prefix(String),
}

impl PathMatch {
    fn parse(s: &str) -> Option<Self> {
        if !s.starts_with('/') {
            return None;
        }
        match s.strip_suffix('*') {
            Some(prefix) if prefix.ends_with('/') => Some(Self::Prefix(prefix.to_string())),
            Some(_) => None,
            None if s.contains('*') => None,
            None => Some(Self::Exact(s.to_string())),
        }
    }

    /// Whether `path` belongs to this route; `Some(specificity)` if it does.
    pub fn matches(&self, path: &str) -> Option<usize> {
        match self {
            Self::Exact(p) => (p == path).then_some(usize::MAX),
            Self::Prefix(p) => {
                (path.starts_with(p.as_str()) || path == &p[..p.len() - 1]).then_some(p.len())
            }
        }
    }
}

/// How logs are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// What a route does when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// Answer `503` with `Retry-After`.
    FailClosed,
    /// Forward without idempotency (logged).
    FailOpen,
}

/// What a duplicate arriving while the key is in flight gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Concurrent {
    /// `409` with `Retry-After`.
    Reject,
    /// Wait up to `wait_timeout`, then replay (not implemented yet; rejected by validation).
    Wait,
}

/// Which upstream statuses are recorded (the rest release the key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordPolicy {
    include: Vec<(u16, u16)>,
    exclude: Vec<(u16, u16)>,
}

impl RecordPolicy {
    /// DESIGN.md §5: 2xx, 3xx and 4xx except 408, 409, 425 and 429.
    pub const DEFAULT: &'static [&'static str] =
        &["2xx", "3xx", "4xx", "!408", "!409", "!425", "!429"];

    fn parse(items: &[String]) -> Result<Self, String> {
        let mut policy = Self {
            include: Vec::new(),
            exclude: Vec::new(),
        };
        for item in items {
            let (negated, spec) = match item.strip_prefix('!') {
                Some(rest) => (true, rest),
                None => (false, item.as_str()),
            };
            let range = parse_status_range(spec).ok_or_else(|| {
                format!("`{item}` is not a status (`404`), class (`4xx`), range (`400-499`) or exclusion (`!409`)")
            })?;
            if negated {
                policy.exclude.push(range);
            } else {
                policy.include.push(range);
            }
        }
        Ok(policy)
    }

    /// Whether a response with this status is recorded.
    pub fn records(&self, status: StatusCode) -> bool {
        let s = status.as_u16();
        let inside = |r: &(u16, u16)| r.0 <= s && s <= r.1;
        self.include.iter().any(inside) && !self.exclude.iter().any(inside)
    }
}

fn parse_status_range(spec: &str) -> Option<(u16, u16)> {
    let code = |s: &str| s.parse::<u16>().ok().filter(|c| (100..=599).contains(c));
    if let Some(class) = spec.strip_suffix("xx") {
        let c = class.parse::<u16>().ok().filter(|c| (1..=5).contains(c))?;
        return Some((c * 100, c * 100 + 99));
    }
    if let Some((a, b)) = spec.split_once('-') {
        let (a, b) = (code(a.trim())?, code(b.trim())?);
        return (a <= b).then_some((a, b));
    }
    code(spec).map(|c| (c, c))
}

/// One validated route.
#[derive(Debug, Clone)]
pub struct Route {
    /// Unique name; part of the key space.
    pub name: String,
    /// Which paths belong to the route.
    pub path: PathMatch,
    /// The upstream's base URI (`http://host:port[/prefix]`).
    pub upstream: Uri,
    /// Protected methods; the others pass through untouched.
    pub methods: Vec<Method>,
    /// The header carrying the key.
    pub key_header: HeaderName,
    /// Missing key: `400` if true, pass-through if false.
    pub key_required: bool,
    /// The header whose SHA-256 digest scopes keys (per tenant).
    pub scope_header: Option<HeaderName>,
    /// How long a record (and a `held` key) is kept.
    pub retention: Duration,
    /// How long an attempt owns its key without renewing.
    pub lease: Duration,
    /// Longest wait for the upstream's whole response.
    pub upstream_timeout: Duration,
    /// Largest request body accepted (over it: `413`).
    pub max_request_body: usize,
    /// Largest response recorded (over it: forwarded once, then held).
    pub max_recorded_response: usize,
    /// What a lapsed lease turns into.
    pub on_unknown_outcome: UnknownOutcome,
    /// What a store outage does.
    pub on_store_error: OnStoreError,
    /// What an in-flight duplicate gets.
    pub concurrent: Concurrent,
    /// Which upstream statuses are recorded.
    pub record: RecordPolicy,
    /// Response headers never recorded nor replayed (hop-by-hop ones are always dropped).
    pub replay_headers_deny: Vec<HeaderName>,
    /// What the request fingerprint covers.
    pub fingerprint: FingerprintSpec,
}

impl Route {
    /// Whether requests with this method go through the idempotency pipeline.
    pub fn protects(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }
}

// ---------------------------------------------------------------------------
// Raw file shape.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<String>,
    admin_listen: Option<String>,
    max_connections: Option<usize>,
    header_read_timeout: Option<String>,
    shutdown_timeout: Option<String>,
    docs_url: Option<String>,
    log_format: Option<LogFormat>,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    defaults: RawRoute,
    #[serde(default)]
    routes: Vec<RawRoute>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    url: Option<String>,
    migrate: Option<bool>,
    pool_size: Option<u32>,
    timeout: Option<String>,
    prefix: Option<String>,
    max_records: Option<usize>,
    sweep_interval: Option<String>,
    sweep_batch: Option<usize>,
    replay_cache_ttl: Option<String>,
    replay_cache_size: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: Option<String>,
    #[serde(rename = "match")]
    path: Option<String>,
    upstream: Option<String>,
    methods: Option<Vec<String>>,
    key_header: Option<String>,
    key_required: Option<bool>,
    scope_header: Option<String>,
    retention: Option<String>,
    lease: Option<String>,
    upstream_timeout: Option<String>,
    max_request_body: Option<String>,
    max_recorded_response: Option<String>,
    on_unknown_outcome: Option<UnknownOutcome>,
    on_store_error: Option<OnStoreError>,
    concurrent: Option<Concurrent>,
    wait_timeout: Option<String>,
    record: Option<Vec<String>>,
    replay_headers: Option<Vec<String>>,
    fingerprint: Option<RawFingerprint>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFingerprint {
    method: Option<bool>,
    path: Option<bool>,
    query: Option<bool>,
    headers: Option<Vec<String>>,
    body: Option<BodyMode>,
    exclude: Option<Vec<String>>,
}

macro_rules! merge_fields {
    ($own:expr, $defaults:expr, $($field:ident),*) => {
        RawRoute { $($field: $own.$field.clone().or_else(|| $defaults.$field.clone()),)* }
    };
}

impl RawRoute {
    fn or_defaults(&self, d: &RawRoute) -> RawRoute {
        merge_fields!(
            self,
            d,
            name,
            path,
            upstream,
            methods,
            key_header,
            key_required,
            scope_header,
            retention,
            lease,
            upstream_timeout,
            max_request_body,
            max_recorded_response,
            on_unknown_outcome,
            on_store_error,
            concurrent,
            wait_timeout,
            record,
            replay_headers,
            fingerprint
        )
    }
}

// ---------------------------------------------------------------------------
// Loading.

/// The longest retention accepted (timestamps far beyond it overflow stores).
const MAX_RETENTION: Duration = Duration::from_secs(3650 * 24 * 3600);

/// The default store URL when neither the file nor the environment names one.
pub const DEFAULT_STORE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

impl Config {
    /// Read, expand and validate a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
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
        let mut value: toml::Value =
            toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
        expand_value(&mut value, "", env)?;
        let raw: RawConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            ConfigError::Shape {
                path,
                message: e.into_inner().to_string(),
            }
        })?;
        validate(raw)
    }
}

fn expand_value(
    value: &mut toml::Value,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    match value {
        toml::Value::String(s) => *s = expand_env(s, env).map_err(|m| invalid(path, m))?,
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                expand_value(item, &format!("{path}[{i}]"), env)?;
            }
        }
        toml::Value::Table(table) => {
            for (k, v) in table.iter_mut() {
                let sub = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                expand_value(v, &sub, env)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Expand `${VAR}` and `${VAR:-default}`; `$$` is a literal `$`.
fn expand_env(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| format!("unterminated `${{` in {s:?}"))?;
            let expr = &body[..end];
            let (name, default) = match expr.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (expr, None),
            };
            let valid =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!("`${{{expr}}}` is not a variable reference"));
            }
            match (env(name).filter(|v| !v.is_empty()), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(format!(
                        "environment variable {name} is not set (use ${{{name}:-default}} for a fallback)"
                    ));
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn duration(key: &str, value: Option<&str>, default: &str) -> Result<Duration, ConfigError> {
    let text = value.unwrap_or(default);
    humantime::parse_duration(text).map_err(|e| {
        invalid(
            key,
            format!("{text:?} is not a duration like \"30s\" or \"24h\" ({e})"),
        )
    })
}

fn size(key: &str, value: Option<&str>, default: &str) -> Result<usize, ConfigError> {
    let text = value.unwrap_or(default);
    let bytes: bytesize::ByteSize = text
        .parse()
        .map_err(|e| invalid(key, format!("{text:?} is not a size like \"1MiB\" ({e})")))?;
    usize::try_from(bytes.as_u64()).map_err(|_| invalid(key, "size too large"))
}

fn socket_addr(key: &str, value: Option<&str>, default: &str) -> Result<SocketAddr, ConfigError> {
    let text = value.unwrap_or(default);
    text.parse().map_err(|_| {
        invalid(
            key,
            format!("{text:?} is not an address like \"0.0.0.0:8080\""),
        )
    })
}

fn header_name(key: &str, text: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(text.as_bytes())
        .map_err(|_| invalid(key, format!("{text:?} is not a valid header name")))
}

fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    if raw.defaults.name.is_some() || raw.defaults.path.is_some() {
        return Err(invalid(
            "defaults",
            "`name` and `match` are per route and cannot be set in [defaults]",
        ));
    }
    let store = StoreConfig {
        url: raw
            .store
            .url
            .unwrap_or_else(|| DEFAULT_STORE_URL.to_string()),
        migrate: raw.store.migrate.unwrap_or(true),
        pool_size: raw.store.pool_size.unwrap_or(16),
        timeout: duration("store.timeout", raw.store.timeout.as_deref(), "2s")?,
        prefix: raw.store.prefix.unwrap_or_else(|| "idemgate:".to_string()),
        max_records: raw.store.max_records.unwrap_or(100_000),
        sweep_interval: duration(
            "store.sweep_interval",
            raw.store.sweep_interval.as_deref(),
            "60s",
        )?,
        sweep_batch: raw.store.sweep_batch.unwrap_or(1000),
        replay_cache_ttl: duration(
            "store.replay_cache_ttl",
            raw.store.replay_cache_ttl.as_deref(),
            "5s",
        )?,
        replay_cache_size: size(
            "store.replay_cache_size",
            raw.store.replay_cache_size.as_deref(),
            "64MiB",
        )? as u64,
    };
    store
        .validate()
        .map_err(|e| invalid(format!("store.{}", e.key), e.message))?;
    if raw.routes.is_empty() {
        return Err(invalid(
            "routes",
            "at least one [[routes]] table is required",
        ));
    }
    let mut names = HashSet::new();
    let mut routes = Vec::with_capacity(raw.routes.len());
    for (i, own) in raw.routes.iter().enumerate() {
        let route = validate_route(&format!("routes[{i}]"), &own.or_defaults(&raw.defaults))?;
        if !names.insert(route.name.clone()) {
            return Err(invalid(
                format!("routes[{i}].name"),
                format!(
                    "route name {:?} is used twice; names must be unique",
                    route.name
                ),
            ));
        }
        if let Some(twin) = routes.iter().find(|r: &&Route| r.path == route.path) {
            return Err(invalid(
                format!("routes[{i}].match"),
                format!(
                    "route {:?} matches exactly what route {:?} matches; one of them could never be reached",
                    route.name, twin.name
                ),
            ));
        }
        routes.push(route);
    }
    let max_connections = raw.max_connections.unwrap_or(10_000);
    if max_connections == 0 {
        return Err(invalid("max_connections", "must be at least 1"));
    }
    Ok(Config {
        listen: socket_addr("listen", raw.listen.as_deref(), "0.0.0.0:8080")?,
        admin_listen: socket_addr(
            "admin_listen",
            raw.admin_listen.as_deref(),
            "127.0.0.1:9090",
        )?,
        max_connections,
        header_read_timeout: duration(
            "header_read_timeout",
            raw.header_read_timeout.as_deref(),
            "10s",
        )?,
        shutdown_timeout: duration("shutdown_timeout", raw.shutdown_timeout.as_deref(), "60s")?,
        docs_url: raw.docs_url.filter(|u| !u.is_empty()),
        log_format: raw.log_format.unwrap_or_default(),
        store,
        routes,
    })
}

fn validate_route(at: &str, r: &RawRoute) -> Result<Route, ConfigError> {
    let key = |k: &str| format!("{at}.{k}");
    let name = r
        .name
        .clone()
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| invalid(key("name"), "every route needs a non-empty name"))?;
    let path_text = r.path.as_deref().ok_or_else(|| {
        invalid(
            key("match"),
            "every route needs `match` (\"/exact\" or \"/prefix/*\")",
        )
    })?;
    let path = PathMatch::parse(path_text).ok_or_else(|| {
        invalid(
            key("match"),
            format!("{path_text:?} must be an exact path (\"/v1/pay\") or a prefix ending in /* (\"/v1/*\")"),
        )
    })?;
    let upstream_text = r
        .upstream
        .as_deref()
        .ok_or_else(|| invalid(key("upstream"), "every route needs an upstream URL"))?;
    let upstream: Uri = upstream_text
        .parse()
        .ok()
        .filter(|u: &Uri| u.scheme_str() == Some("http") && u.authority().is_some() && u.query().is_none())
        .ok_or_else(|| {
            invalid(
                key("upstream"),
                format!("{upstream_text:?} must be an http:// URL with a host (https upstreams are not supported)"),
            )
        })?;
    let methods: Vec<Method> = match &r.methods {
        None => vec![Method::POST, Method::PATCH],
        Some(list) => list
            .iter()
            .map(|m| {
                Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|_| invalid(key("methods"), format!("{m:?} is not an HTTP method")))
            })
            .collect::<Result<_, _>>()?,
    };
    if methods.is_empty() {
        return Err(invalid(
            key("methods"),
            "protects nothing; list at least one method (default [\"POST\", \"PATCH\"])",
        ));
    }
    let key_header = header_name(
        &key("key_header"),
        r.key_header.as_deref().unwrap_or("Idempotency-Key"),
    )?;
    let scope_header = r
        .scope_header
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(|s| header_name(&key("scope_header"), s))
        .transpose()?;
    if scope_header.as_ref() == Some(&key_header) {
        return Err(invalid(key("scope_header"), "must differ from key_header"));
    }
    let retention = duration(&key("retention"), r.retention.as_deref(), "24h")?;
    if retention > MAX_RETENTION {
        return Err(invalid(key("retention"), "must be at most 3650 days"));
    }
    let lease = duration(&key("lease"), r.lease.as_deref(), "30s")?;
    if lease < Duration::from_secs(1) {
        return Err(invalid(key("lease"), "must be at least 1s"));
    }
    if retention < lease {
        return Err(invalid(
            key("retention"),
            "must be at least as long as `lease`",
        ));
    }
    let upstream_timeout = duration(
        &key("upstream_timeout"),
        r.upstream_timeout.as_deref(),
        "25s",
    )?;
    if upstream_timeout.is_zero() {
        return Err(invalid(
            key("upstream_timeout"),
            "must be greater than zero",
        ));
    }
    let concurrent = r.concurrent.unwrap_or(Concurrent::Reject);
    if concurrent == Concurrent::Wait {
        return Err(invalid(
            key("concurrent"),
            "\"wait\" is not implemented yet; use \"reject\" (409 + Retry-After)",
        ));
    }
    if r.wait_timeout.is_some() {
        return Err(invalid(
            key("wait_timeout"),
            "only applies to concurrent = \"wait\", which is not implemented yet",
        ));
    }
    let record_items: Vec<String> = r.record.clone().unwrap_or_else(|| {
        RecordPolicy::DEFAULT
            .iter()
            .map(|s| s.to_string())
            .collect()
    });
    let record = RecordPolicy::parse(&record_items).map_err(|m| invalid(key("record"), m))?;
    let replay_headers_deny = match &r.replay_headers {
        None => vec![http::header::SET_COOKIE, http::header::DATE],
        Some(list) => list
            .iter()
            .map(|h| header_name(&key("replay_headers"), h))
            .collect::<Result<_, _>>()?,
    };
    let fp = r.fingerprint.clone().unwrap_or_default();
    let body = fp.body.unwrap_or(BodyMode::Raw);
    let exclude = fp.exclude.unwrap_or_default();
    if !exclude.is_empty() && body != BodyMode::Json {
        return Err(invalid(
            key("fingerprint.exclude"),
            "JSON-pointer exclusions need fingerprint.body = \"json\"",
        ));
    }
    if let Some(bad) = exclude.iter().find(|p| !p.starts_with('/')) {
        return Err(invalid(
            key("fingerprint.exclude"),
            format!("{bad:?} is not a JSON pointer (it must start with /)"),
        ));
    }
    let fingerprint = FingerprintSpec {
        method: fp.method.unwrap_or(true),
        path: fp.path.unwrap_or(true),
        query: fp.query.unwrap_or(true),
        headers: fp
            .headers
            .unwrap_or_default()
            .iter()
            .map(|h| header_name(&key("fingerprint.headers"), h))
            .collect::<Result<_, _>>()?,
        body,
        exclude,
    };
    let max_recorded_response = size(
        &key("max_recorded_response"),
        r.max_recorded_response.as_deref(),
        "8MiB",
    )?;
    if max_recorded_response == 0 {
        return Err(invalid(
            key("max_recorded_response"),
            "must be at least 1 byte (0 would hold every key)",
        ));
    }
    Ok(Route {
        name,
        path,
        upstream,
        methods,
        key_header,
        key_required: r.key_required.unwrap_or(true),
        scope_header,
        retention,
        lease,
        upstream_timeout,
        max_request_body: size(
            &key("max_request_body"),
            r.max_request_body.as_deref(),
            "1MiB",
        )?,
        max_recorded_response,
        on_unknown_outcome: r.on_unknown_outcome.unwrap_or(UnknownOutcome::Hold),
        on_store_error: r.on_store_error.unwrap_or(OnStoreError::FailClosed),
        concurrent,
        record,
        replay_headers_deny,
        fingerprint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        [[routes]]
        name = "payments"
        match = "/v1/payments/*"
        upstream = "http://127.0.0.1:9000"
    "#;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse_with_env(text, &no_env)
    }

    #[test]
    fn minimal_config_gets_design_defaults() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.listen, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(c.admin_listen, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(c.store.url, DEFAULT_STORE_URL);
        assert!(c.store.migrate);
        let r = &c.routes[0];
        assert_eq!(r.methods, vec![Method::POST, Method::PATCH]);
        assert_eq!(r.key_header, "idempotency-key");
        assert!(r.key_required);
        assert_eq!(r.retention, Duration::from_secs(24 * 3600));
        assert_eq!(r.lease, Duration::from_secs(30));
        assert_eq!(r.upstream_timeout, Duration::from_secs(25));
        assert_eq!(r.max_request_body, 1024 * 1024);
        assert_eq!(r.max_recorded_response, 8 * 1024 * 1024);
        assert_eq!(r.on_unknown_outcome, UnknownOutcome::Hold);
        assert_eq!(r.on_store_error, OnStoreError::FailClosed);
        assert_eq!(
            r.replay_headers_deny,
            vec![http::header::SET_COOKIE, http::header::DATE]
        );
    }

    #[test]
    fn replay_cache_defaults_and_off_switch() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.store.replay_cache_ttl, Duration::from_secs(5));
        assert_eq!(c.store.replay_cache_size, 64 * 1024 * 1024);
        let off = parse(&format!(
            "[store]\nreplay_cache_ttl = \"0s\"\nreplay_cache_size = \"1MiB\"\n{MINIMAL}"
        ))
        .unwrap();
        assert!(off.store.replay_cache_ttl.is_zero());
        assert_eq!(off.store.replay_cache_size, 1024 * 1024);
        let err = parse(&format!("[store]\nreplay_cache_ttl = \"soon\"\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("store.replay_cache_ttl"), "{err}");
    }

    #[test]
    fn unknown_key_is_rejected_with_its_path() {
        let text = format!("{MINIMAL}\nretension = \"1h\"\n");
        let err = parse(&text).unwrap_err().to_string();
        assert!(
            err.contains("routes[0]") && err.contains("retension"),
            "{err}"
        );
        let err = parse(&format!("bogus = 1\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("bogus"), "{err}");
        let err = parse(&format!("[store]\nurll = \"x\"\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("store") && err.contains("urll"), "{err}");
    }

    #[test]
    fn env_vars_expand_with_defaults() {
        let env = |n: &str| (n == "UP").then(|| "http://10.0.0.1:81".to_string());
        let text = r#"
            [store]
            url = "${DB_URL:-postgres://x@h/db}"
            [[routes]]
            name = "r"
            match = "/a"
            upstream = "${UP}"
        "#;
        let c = Config::parse_with_env(text, &env).unwrap();
        assert_eq!(c.store.url, "postgres://x@h/db");
        assert_eq!(c.routes[0].upstream, "http://10.0.0.1:81/");
        let missing = Config::parse_with_env(&text.replace("${UP}", "${NOPE}"), &env).unwrap_err();
        assert!(missing.to_string().contains("NOPE"), "{missing}");
        assert_eq!(expand_env("a$$b$c", &no_env).unwrap(), "a$b$c");
    }

    #[test]
    fn durations_and_sizes_are_human_strings() {
        let text = format!("{MINIMAL}\nlease = \"1m 30s\"\nmax_request_body = \"64 KiB\"\n");
        let r = &parse(&text).unwrap().routes[0];
        assert_eq!(r.lease, Duration::from_secs(90));
        assert_eq!(r.max_request_body, 64 * 1024);
        let err = parse(&format!("{MINIMAL}\nlease = \"soon\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("routes[0].lease"), "{err}");
        let err = parse(&format!("{MINIMAL}\nmax_request_body = \"big\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("routes[0].max_request_body"), "{err}");
    }

    #[test]
    fn defaults_apply_and_routes_override() {
        let text = format!(
            "[defaults]\nlease = \"10s\"\non_store_error = \"fail_open\"\n{MINIMAL}\n[[routes]]\nname = \"b\"\nmatch = \"/b\"\nupstream = \"http://h:1\"\nlease = \"5s\"\n"
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.routes[0].lease, Duration::from_secs(10));
        assert_eq!(c.routes[1].lease, Duration::from_secs(5));
        assert_eq!(c.routes[1].on_store_error, OnStoreError::FailOpen);
        let err = parse(&format!("[defaults]\nname = \"x\"\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("defaults"), "{err}");
    }

    #[test]
    fn route_names_are_unique_and_required() {
        let err = parse(&format!("{MINIMAL}{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("routes[1].name"), "{err}");
        let err = parse("[[routes]]\nmatch = \"/a\"\nupstream = \"http://h:1\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("routes[0].name"), "{err}");
        assert!(
            parse("listen = \"0.0.0.0:1\"\n")
                .unwrap_err()
                .to_string()
                .contains("routes")
        );
    }

    #[test]
    fn match_is_exact_or_slash_star_prefix() {
        assert_eq!(
            PathMatch::parse("/a/b"),
            Some(PathMatch::Exact("/a/b".into()))
        );
        assert_eq!(
            PathMatch::parse("/a/*"),
            Some(PathMatch::Prefix("/a/".into()))
        );
        assert_eq!(PathMatch::parse("/*"), Some(PathMatch::Prefix("/".into())));
        assert_eq!(PathMatch::parse("/a*"), None);
        assert_eq!(PathMatch::parse("a/b"), None);
        assert_eq!(PathMatch::parse("/a/*/b"), None);
        let p = PathMatch::parse("/v1/payments/*").unwrap();
        assert!(p.matches("/v1/payments/123").is_some());
        assert!(p.matches("/v1/payments").is_some());
        assert!(p.matches("/v1/paymentsX").is_none());
        assert!(parse(&MINIMAL.replace("/v1/payments/*", "v1")).is_err());
    }

    #[test]
    fn upstream_must_be_plain_http() {
        assert!(parse(&MINIMAL.replace("http://127.0.0.1:9000", "https://h")).is_err());
        assert!(parse(&MINIMAL.replace("http://127.0.0.1:9000", "not a url")).is_err());
        assert!(parse(&MINIMAL.replace("http://127.0.0.1:9000", "http://h:1/base")).is_ok());
    }

    #[test]
    fn record_policy_default_and_custom() {
        let d = &parse(MINIMAL).unwrap().routes[0].record;
        for (s, recorded) in [
            (200, true),
            (201, true),
            (302, true),
            (400, true),
            (404, true),
            (408, false),
            (409, false),
            (425, false),
            (429, false),
            (500, false),
            (503, false),
        ] {
            assert_eq!(d.records(StatusCode::from_u16(s).unwrap()), recorded, "{s}");
        }
        let text = format!("{MINIMAL}\nrecord = [\"200-299\", \"500\", \"!204\"]\n");
        let p = &parse(&text).unwrap().routes[0].record;
        assert!(p.records(StatusCode::OK) && p.records(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!p.records(StatusCode::NO_CONTENT) && !p.records(StatusCode::BAD_REQUEST));
        let err = parse(&format!("{MINIMAL}\nrecord = [\"2xy\"]\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("routes[0].record"), "{err}");
    }

    #[test]
    fn policies_are_closed_enums() {
        let err = parse(&format!("{MINIMAL}\non_unknown_outcome = \"retry\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("on_unknown_outcome"), "{err}");
        let c = parse(&format!("{MINIMAL}\non_unknown_outcome = \"release\"\n")).unwrap();
        assert_eq!(c.routes[0].on_unknown_outcome, UnknownOutcome::Release);
        let err = parse(&format!("{MINIMAL}\nconcurrent = \"wait\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("concurrent") && err.contains("not implemented"),
            "{err}"
        );
    }

    #[test]
    fn fingerprint_settings_validate() {
        let text = format!(
            "{MINIMAL}\nfingerprint = {{ body = \"json\", exclude = [\"/ts\"], headers = [\"content-type\"] }}\n"
        );
        let f = &parse(&text).unwrap().routes[0].fingerprint;
        assert_eq!(f.body, BodyMode::Json);
        assert_eq!(f.exclude, vec!["/ts".to_string()]);
        let err = parse(&format!(
            "{MINIMAL}\nfingerprint = {{ exclude = [\"/ts\"] }}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("fingerprint.exclude"), "{err}");
    }

    #[test]
    fn nonsense_values_are_rejected() {
        let bad = [
            ("[store]\nurl = \"postgress://h/db\"\n", "store.url"),
            ("[store]\ntimeout = \"0s\"\n", "store.timeout"),
        ];
        for (prefix, key) in bad {
            let err = parse(&format!("{prefix}{MINIMAL}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{err}");
        }
        for (line, key) in [
            ("methods = []", "routes[0].methods"),
            (
                "scope_header = \"idempotency-key\"",
                "routes[0].scope_header",
            ),
            ("retention = \"300000y\"", "routes[0].retention"),
            (
                "max_recorded_response = \"0\"",
                "routes[0].max_recorded_response",
            ),
        ] {
            let err = parse(&format!("{MINIMAL}\n{line}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{line}: {err}");
        }
        let twin = MINIMAL.replace("\"payments\"", "\"twin\"");
        let err = parse(&format!("{MINIMAL}{twin}")).unwrap_err().to_string();
        assert!(err.contains("routes[1].match"), "{err}");
    }

    #[test]
    fn lease_and_retention_bounds() {
        assert!(parse(&format!("{MINIMAL}\nlease = \"500ms\"\n")).is_err());
        assert!(parse(&format!("{MINIMAL}\nretention = \"10s\"\n")).is_err());
    }
}
