//! Validation: the raw file into a [`Config`], defaults applied and every
//! value checked. The first bad value is the error, named by its dotted key
//! (`routes[1].lease`), so checks run in a fixed order: `[defaults]`,
//! `[store]`, each route in file order, then the process settings.
//!
//! One file per concern: `store` (the `[store]` table), `route` (one route,
//! assembled from `target`, `keys`, `timing`, `record` and `fingerprint`).

mod fingerprint;
mod inquiry;
mod keys;
mod record;
mod route;
pub(in crate::config) mod store;
mod target;
mod telemetry;
mod timing;
pub(in crate::config) mod tls;

use std::collections::HashSet;

use super::defaults::MAX_SERVER_THREADS;
use super::raw::{RawConfig, RawRoute};
use super::settings::{self as S, Setting};
use super::values::{duration, size, socket_addr};
use super::{Config, ConfigError, Route, invalid};
use std::time::Duration;

/// `at.name`: the dotted key of setting `name` in the table at `at`.
fn key(at: &str, name: &str) -> String {
    format!("{at}.{name}")
}

/// The whole file.
pub(super) fn validate(mut raw: RawConfig) -> Result<Config, ConfigError> {
    if raw.defaults.name.is_some() || raw.defaults.path.is_some() {
        return Err(invalid(
            "defaults",
            "`name` and `match` are per route and cannot be set in [defaults]",
        ));
    }
    let generation_set = raw.store.generation.is_some();
    let unused = store::unused(&raw.store);
    let mut store = store::store(std::mem::take(&mut raw.store))?;
    let routes = routes(&raw.routes, &raw.defaults)?;
    if !generation_set {
        let longest = routes.iter().map(|r| r.retention).max();
        store.generation = longest.unwrap_or(store.generation);
    }
    store.wait_routes = crate::store::WaitRoutes::new(
        routes
            .iter()
            .filter(|r| r.concurrent == crate::config::Concurrent::Wait)
            .map(|r| r.name.clone())
            .collect(),
    );
    if let Some(front) = &mut store.front {
        let longest = routes.iter().map(|r| r.lease).max().unwrap_or_default();
        front.fence_life = store::fence_life(longest);
    }
    let limits = limits(&raw, &routes)?;
    let mut config = process(raw, limits, store, routes)?;
    config.unused = unused;
    Ok(config)
}

/// The process's bounds: connections, threads, streams, forwards, waiting
/// requests and buffered bytes.
struct Limits {
    max_connections: usize,
    server_threads: usize,
    streams: u32,
    max_forwards_in_flight: usize,
    max_waiting: usize,
    admin_max_connections: usize,
    max_buffered_request_bytes: usize,
}

/// The process's bounds, checked in file order after the routes.
fn limits(raw: &RawConfig, routes: &[Route]) -> Result<Limits, ConfigError> {
    let at_least_one = |s: &Setting, value: Option<usize>| match value {
        Some(0) => Err(invalid(s.path(), "must be at least 1")),
        value => Ok(value.unwrap_or(s.integer() as usize)),
    };
    let max_connections = at_least_one(&S::MAX_CONNECTIONS, raw.max_connections)?;
    let server_threads = raw.server_threads.unwrap_or_else(crate::host::cores);
    if server_threads > MAX_SERVER_THREADS {
        return Err(invalid(
            S::SERVER_THREADS.path(),
            format!("must be at most {MAX_SERVER_THREADS} (0: serve on the shared runtime)"),
        ));
    }
    let streams = at_least_one(
        &S::HTTP2_MAX_CONCURRENT_STREAMS,
        raw.http2_max_concurrent_streams.map(|n| n as usize),
    )? as u32;
    let max_forwards_in_flight =
        at_least_one(&S::MAX_FORWARDS_IN_FLIGHT, raw.max_forwards_in_flight)?;
    let max_waiting = at_least_one(&S::MAX_WAITING, raw.max_waiting)?;
    let admin_max_connections = at_least_one(&S::ADMIN_MAX_CONNECTIONS, raw.admin_max_connections)?;
    let max_buffered_request_bytes = size_of(
        &S::MAX_BUFFERED_REQUEST_BYTES,
        raw.max_buffered_request_bytes.as_deref(),
    )?;
    buffers_fit(max_buffered_request_bytes, routes)?;
    Ok(Limits {
        max_connections,
        server_threads,
        streams,
        max_forwards_in_flight,
        max_waiting,
        admin_max_connections,
        max_buffered_request_bytes,
    })
}

/// A size setting outside the routes, named and defaulted by its row.
fn size_of(s: &Setting, value: Option<&str>) -> Result<usize, ConfigError> {
    size(&s.path(), value, s.size() as usize)
}

/// Every route's largest body fits in `max_buffered_request_bytes`.
pub(in crate::config) fn buffers_fit(
    max_buffered_request_bytes: usize,
    routes: &[Route],
) -> Result<(), ConfigError> {
    match routes
        .iter()
        .find(|r| r.max_request_body > max_buffered_request_bytes)
    {
        Some(route) => Err(invalid(
            S::MAX_BUFFERED_REQUEST_BYTES.path(),
            format!(
                "{max_buffered_request_bytes} bytes is less than route {:?}'s max_request_body ({} bytes): no request could be buffered",
                route.name, route.max_request_body
            ),
        )),
        None => Ok(()),
    }
}

/// An HTTP/2 flow-control window.
fn window(s: &Setting, value: Option<&str>) -> Result<u32, ConfigError> {
    let bytes = size_of(s, value)?;
    // RFC 9113 §6.9.2: at least the 65,535-byte default, at most 2^31 - 1.
    match u32::try_from(bytes) {
        Ok(w) if (65_535..=0x7fff_ffff).contains(&w) => Ok(w),
        _ => Err(invalid(
            s.path(),
            "must be between 65535 bytes and 2GiB - 1",
        )),
    }
}

/// A connection phase's deadline: never zero.
fn deadline(s: &Setting, value: Option<&str>) -> Result<Duration, ConfigError> {
    let d = duration(&s.path(), value, s.duration())?;
    if d.is_zero() {
        return Err(invalid(
            s.path(),
            "must be longer than zero: every connection phase has a deadline",
        ));
    }
    Ok(d)
}

/// The process settings around the store and the routes.
fn process(
    raw: RawConfig,
    limits: Limits,
    store: crate::store::StoreConfig,
    routes: Vec<Route>,
) -> Result<Config, ConfigError> {
    let Limits {
        max_connections,
        server_threads,
        streams,
        max_forwards_in_flight,
        max_waiting,
        admin_max_connections,
        max_buffered_request_bytes,
    } = limits;
    let tls = tls::listener(raw.tls)?;
    tls::cert_parts_fit(tls.as_ref(), &routes)?;
    Ok(Config {
        listen: socket_addr(
            &S::LISTEN.path(),
            raw.listen.as_deref(),
            S::LISTEN.address(),
        )?,
        tls,
        admin_listen: socket_addr(
            &S::ADMIN_LISTEN.path(),
            raw.admin_listen.as_deref(),
            S::ADMIN_LISTEN.address(),
        )?,
        admin_token: super::secret::admin_token(raw.admin_token)?,
        max_connections,
        server_threads,
        header_read_timeout: deadline(&S::HEADER_READ_TIMEOUT, raw.header_read_timeout.as_deref())?,
        idle_timeout: deadline(&S::IDLE_TIMEOUT, raw.idle_timeout.as_deref())?,
        body_read_timeout: deadline(&S::BODY_READ_TIMEOUT, raw.body_read_timeout.as_deref())?,
        http2_keep_alive_interval: deadline(
            &S::HTTP2_KEEP_ALIVE_INTERVAL,
            raw.http2_keep_alive_interval.as_deref(),
        )?,
        http2_keep_alive_timeout: deadline(
            &S::HTTP2_KEEP_ALIVE_TIMEOUT,
            raw.http2_keep_alive_timeout.as_deref(),
        )?,
        http2_max_concurrent_streams: streams,
        http2_stream_window: window(&S::HTTP2_STREAM_WINDOW, raw.http2_stream_window.as_deref())?,
        http2_connection_window: window(
            &S::HTTP2_CONNECTION_WINDOW,
            raw.http2_connection_window.as_deref(),
        )?,
        max_buffered_request_bytes,
        max_forwards_in_flight,
        max_waiting,
        admin_max_connections,
        max_header_bytes: match size_of(&S::MAX_HEADER_BYTES, raw.max_header_bytes.as_deref())? {
            // hyper's HTTP/1.1 read buffer cannot be smaller.
            n if n < 8192 => {
                return Err(invalid(S::MAX_HEADER_BYTES.path(), "must be at least 8KiB"));
            }
            n => n,
        },
        shutdown_timeout: duration(
            &S::SHUTDOWN_TIMEOUT.path(),
            raw.shutdown_timeout.as_deref(),
            S::SHUTDOWN_TIMEOUT.duration(),
        )?,
        watch_config: watch_config(raw.watch_config.as_deref())?,
        docs_url: raw.docs_url.filter(|u| !u.is_empty()),
        log_format: raw.log_format.unwrap_or(super::DEFAULT_LOG_FORMAT),
        telemetry: telemetry::telemetry(raw.telemetry)?,
        store,
        routes,
        source: None,
        unused: Vec::new(),
    })
}

/// `watch_config`: off, or at least a second between looks.
fn watch_config(value: Option<&str>) -> Result<Option<Duration>, ConfigError> {
    let Some(text) = value else {
        return Ok(None);
    };
    let key = S::WATCH_CONFIG.path();
    let every = duration(&key, Some(text), Duration::ZERO)?;
    if every < Duration::from_secs(1) {
        return Err(invalid(
            key,
            "must be at least 1s (how often the file is read); leave it out to reload on SIGHUP only",
        ));
    }
    Ok(Some(every))
}

/// Every route, each merged with `[defaults]`: at least one, names unique,
/// and no two matching the same paths.
fn routes(raw: &[RawRoute], defaults: &RawRoute) -> Result<Vec<Route>, ConfigError> {
    if raw.is_empty() {
        return Err(invalid(
            "routes",
            "at least one [[routes]] table is required",
        ));
    }
    keys::one_form("defaults", defaults)?;
    let mut names = HashSet::new();
    let mut routes = Vec::with_capacity(raw.len());
    for (i, own) in raw.iter().enumerate() {
        let at = format!("routes[{i}]");
        keys::one_form(&at, own)?;
        let route = route::route(&at, &own.or_defaults(defaults))?;
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
    Ok(routes)
}

#[cfg(test)]
mod tests {
    use crate::config::defaults::*;
    use crate::config::tests::{MINIMAL, error, parse};

    #[test]
    fn minimal_config_gets_design_defaults() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.listen, DEFAULT_LISTEN);
        assert_eq!(c.admin_listen, DEFAULT_ADMIN_LISTEN);
        assert_eq!(c.store.url, DEFAULT_STORE_URL);
        assert_eq!(c.store.migrate, DEFAULT_STORE_MIGRATE);
        let r = &c.routes[0];
        assert_eq!(r.methods, [http::Method::POST, http::Method::PATCH]);
        assert_eq!(
            r.key_from,
            [crate::request::key_source::KeyPart::Header(
                http::HeaderName::from_static("idempotency-key")
            )]
        );
        assert_eq!(r.key_required, DEFAULT_KEY_REQUIRED);
        assert_eq!(r.retention, DEFAULT_RETENTION);
        assert_eq!(r.lease, DEFAULT_LEASE);
        assert_eq!(r.upstream_timeout, DEFAULT_UPSTREAM_TIMEOUT);
        assert_eq!(r.max_request_body, DEFAULT_MAX_REQUEST_BODY);
        assert_eq!(r.max_recorded_response, DEFAULT_MAX_RECORDED_RESPONSE);
        assert_eq!(r.on_unknown_outcome, DEFAULT_ON_UNKNOWN_OUTCOME);
        assert_eq!(r.on_store_error, DEFAULT_ON_STORE_ERROR);
        assert_eq!(
            r.replay_headers_deny,
            [http::header::SET_COOKIE, http::header::DATE]
        );
    }

    #[test]
    fn server_threads_default_to_the_cores_and_are_bounded() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.server_threads, crate::host::cores());
        assert!(c.server_threads >= 1);
        let shared = parse(&format!("server_threads = 0\n{MINIMAL}")).unwrap();
        assert_eq!(shared.server_threads, 0);
        let err = error(&format!("server_threads = 257\n{MINIMAL}"));
        assert!(err.contains("`server_threads`"), "{err}");
        assert!(err.contains("at most 256"), "{err}");
    }

    #[test]
    fn process_defaults() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(c.header_read_timeout, DEFAULT_HEADER_READ_TIMEOUT);
        assert_eq!(c.idle_timeout, DEFAULT_IDLE_TIMEOUT);
        assert_eq!(c.body_read_timeout, DEFAULT_BODY_READ_TIMEOUT);
        assert_eq!(
            c.http2_keep_alive_interval,
            DEFAULT_HTTP2_KEEP_ALIVE_INTERVAL
        );
        assert_eq!(c.http2_keep_alive_timeout, DEFAULT_HTTP2_KEEP_ALIVE_TIMEOUT);
        assert_eq!(
            c.http2_max_concurrent_streams,
            DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS
        );
        assert_eq!(c.shutdown_timeout, DEFAULT_SHUTDOWN_TIMEOUT);
        assert_eq!(c.log_format, DEFAULT_LOG_FORMAT);
        assert_eq!(c.docs_url, None);
        let err = error(&format!("max_connections = 0\n{MINIMAL}"));
        assert!(err.contains("`max_connections`"), "{err}");
        let err = error(&format!("listen = \"8080\"\n{MINIMAL}"));
        assert!(err.contains("`listen`"), "{err}");
    }

    #[test]
    fn defaults_cannot_name_a_route() {
        let err = error(&format!("[defaults]\nname = \"x\"\n{MINIMAL}"));
        assert!(err.contains("defaults"), "{err}");
    }

    #[test]
    fn route_names_are_unique_and_routes_required() {
        let err = error(&format!("{MINIMAL}{MINIMAL}"));
        assert!(err.contains("routes[1].name"), "{err}");
        assert!(error("listen = \"0.0.0.0:1\"\n").contains("routes"));
    }

    #[test]
    fn two_routes_cannot_match_the_same_paths() {
        let twin = MINIMAL.replace("\"payments\"", "\"twin\"");
        let err = error(&format!("{MINIMAL}{twin}"));
        assert!(err.contains("routes[1].match"), "{err}");
    }

    #[test]
    fn every_connection_phase_has_a_deadline_and_streams_a_bound() {
        for key in [
            "header_read_timeout",
            "idle_timeout",
            "body_read_timeout",
            "http2_keep_alive_interval",
            "http2_keep_alive_timeout",
        ] {
            let e = error(&format!("{key} = \"0s\"\n{MINIMAL}"));
            assert!(e.contains(key) && e.contains("longer than zero"), "{e}");
        }
        let e = error(&format!("http2_max_concurrent_streams = 0\n{MINIMAL}"));
        assert!(e.contains("http2_max_concurrent_streams"), "{e}");
        for key in ["max_forwards_in_flight", "admin_max_connections"] {
            let e = error(&format!("{key} = 0\n{MINIMAL}"));
            assert!(e.contains(key), "{e}");
        }
        let e = error(&format!("http2_stream_window = \"1KiB\"\n{MINIMAL}"));
        assert!(e.contains("http2_stream_window"), "{e}");
    }

    /// `watch_config` is off unless set, and never looks more than once a
    /// second.
    #[test]
    fn watch_config_is_off_or_at_least_a_second() {
        assert_eq!(parse(MINIMAL).unwrap().watch_config, None);
        let every = parse(&format!("watch_config = \"5s\"\n{MINIMAL}")).unwrap();
        assert_eq!(every.watch_config, Some(std::time::Duration::from_secs(5)));
        let e = error(&format!("watch_config = \"100ms\"\n{MINIMAL}"));
        assert!(
            e.contains("`watch_config`") && e.contains("at least 1s"),
            "{e}"
        );
    }

    #[test]
    fn the_body_budget_holds_at_least_one_body_of_every_route() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(
            c.max_buffered_request_bytes,
            DEFAULT_MAX_BUFFERED_REQUEST_BYTES
        );
        assert_eq!(c.max_forwards_in_flight, DEFAULT_MAX_FORWARDS_IN_FLIGHT);
        assert_eq!(c.admin_max_connections, DEFAULT_ADMIN_MAX_CONNECTIONS);
        assert_eq!(c.max_header_bytes, DEFAULT_MAX_HEADER_BYTES);
        assert_eq!(c.http2_stream_window as usize, DEFAULT_HTTP2_STREAM_WINDOW);
        assert_eq!(
            c.http2_connection_window as usize,
            DEFAULT_HTTP2_CONNECTION_WINDOW
        );
        let e = error(&format!(
            "max_buffered_request_bytes = \"512KiB\"\n{MINIMAL}"
        ));
        assert!(e.contains("max_request_body"), "{e}");
    }
}
