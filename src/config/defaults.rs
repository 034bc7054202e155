//! Every default of the configuration file as a typed constant, and the
//! bounds validation holds values to. The defaults are not typed here: each
//! is read, at compile time, out of the TOML text of its row in the
//! settings table (`settings`), the one place a default is written; lists
//! and header names, which no constant can hold, are read from the same rows
//! by validation. The test below checks that the parser really does take
//! each row's default when the file leaves the key out.
//!
//! Durations are [`Duration`]s and sizes are byte counts, so tests compare
//! against these constants rather than retyping them.

use std::time::Duration;

use super::route::{Concurrent, LogFormat, OnStoreError, RouteMode};
use super::settings as S;
use crate::request::fingerprint::BodyMode;
use crate::store::UnknownOutcome;
use crate::store::seal::Codec;
use std::net::SocketAddr;

const DAY: u64 = 24 * 3600;

// ---------------------------------------------------------------------------
// The process.

/// `listen`: the proxy listener.
pub const DEFAULT_LISTEN: SocketAddr = S::LISTEN.address();
/// `admin_listen`: metrics and health, never on the proxy port.
pub const DEFAULT_ADMIN_LISTEN: SocketAddr = S::ADMIN_LISTEN.address();
/// `max_connections`: client connections served at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = S::MAX_CONNECTIONS.integer() as usize;
/// `server_threads`: the most that may be asked for (unset: one per core).
pub const MAX_SERVER_THREADS: usize = 256;

/// `admin_token`: the shortest accepted (there is no default token: without
/// one, key administration over HTTP is off).
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;
/// `idle_timeout`: a client connection with no request in progress for this
/// long is closed (HTTP/2 gets a GOAWAY first; a parked HTTP/1.1 connection
/// is simply closed).
pub const DEFAULT_IDLE_TIMEOUT: Duration = S::IDLE_TIMEOUT.duration();
/// `body_read_timeout`: time a client has to send a protected request's
/// whole body once its headers arrived.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = S::BODY_READ_TIMEOUT.duration();
/// `http2_keep_alive_interval`: how often an HTTP/2 client is pinged.
pub const DEFAULT_HTTP2_KEEP_ALIVE_INTERVAL: Duration = S::HTTP2_KEEP_ALIVE_INTERVAL.duration();
/// `http2_keep_alive_timeout`: a ping unanswered this long closes the connection.
pub const DEFAULT_HTTP2_KEEP_ALIVE_TIMEOUT: Duration = S::HTTP2_KEEP_ALIVE_TIMEOUT.duration();
/// `http2_max_concurrent_streams`: requests one HTTP/2 connection may have open.
pub const DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS: u32 =
    S::HTTP2_MAX_CONCURRENT_STREAMS.integer() as u32;
/// `http2_stream_window`: request body bytes one HTTP/2 stream may have in
/// flight before the gateway reads them.
pub const DEFAULT_HTTP2_STREAM_WINDOW: usize = S::HTTP2_STREAM_WINDOW.size() as usize;
/// `http2_connection_window`: the same for all streams of one connection.
pub const DEFAULT_HTTP2_CONNECTION_WINDOW: usize = S::HTTP2_CONNECTION_WINDOW.size() as usize;
/// `max_buffered_request_bytes`: protected request bodies held in memory at
/// once, across all connections (each body's bytes are paid for as they
/// arrive, and held until its forward ends).
pub const DEFAULT_MAX_BUFFERED_REQUEST_BYTES: usize = S::MAX_BUFFERED_REQUEST_BYTES.size() as usize;
/// `max_forwards_in_flight`: claimed forwards at once (each may buffer up
/// to its route's `max_recorded_response`).
pub const DEFAULT_MAX_FORWARDS_IN_FLIGHT: usize = S::MAX_FORWARDS_IN_FLIGHT.integer() as usize;
/// `max_header_bytes`: the request head's size limit (HTTP/1.1 read buffer,
/// HTTP/2 header list).
pub const DEFAULT_MAX_HEADER_BYTES: usize = S::MAX_HEADER_BYTES.size() as usize;
/// `admin_max_connections`: connections the admin listener serves at once.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = S::ADMIN_MAX_CONNECTIONS.integer() as usize;
/// `header_read_timeout`: time a client has to send each request's headers,
/// counted from the accept for the first one (the HTTP/2 preface included),
/// and for a later HTTP/1.1 one from the arrival of its first bytes (from
/// the end of the previous answer if it begins before the connection is
/// parked: `server::h1::PARK_AFTER`).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = S::HEADER_READ_TIMEOUT.duration();
/// `shutdown_timeout`: the longest a graceful shutdown waits, in all, for
/// open connections and in-flight forwards.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = S::SHUTDOWN_TIMEOUT.duration();
/// `log_format`.
pub const DEFAULT_LOG_FORMAT: LogFormat =
    S::LOG_FORMAT.pick(&[("text", LogFormat::Text), ("json", LogFormat::Json)]);
/// `[telemetry] queue`: finished spans waiting for export at most (the
/// OpenTelemetry batch processor's usual 2,048).
pub const DEFAULT_TRACE_QUEUE: usize = S::TELEMETRY_QUEUE.integer() as usize;

// ---------------------------------------------------------------------------
// The `[store]` table.

/// `store.url` when the file names none: the embedded durable store, a file
/// in the working directory (docs/src/stores/sqlite.md).
pub const DEFAULT_STORE_URL: &str = S::STORE_URL.text();
/// `store.migrate`: apply embedded migrations at start.
pub const DEFAULT_STORE_MIGRATE: bool = S::STORE_MIGRATE.flag();
/// `store.pool_size`: most connections the store pool opens.
pub const DEFAULT_STORE_POOL_SIZE: u32 = S::STORE_POOL_SIZE.integer() as u32;
/// `store.batches_in_flight`: PostgreSQL batches of claims and completions
/// sent at once. One measured best (bench/results/2026-11-24.md): claims
/// and completions that arrive while a batch is committing all join the
/// next one.
pub const DEFAULT_BATCHES_IN_FLIGHT: u32 = S::STORE_BATCHES_IN_FLIGHT.integer() as u32;
/// `store.timeout`: longest any single store operation may take.
pub const DEFAULT_STORE_TIMEOUT: Duration = S::STORE_TIMEOUT.duration();
/// `store.claim_queue_budget` when unset: a quarter of `store.timeout`, at
/// most 100 ms (a claim queued that long is behind more than the store
/// drains before clients give up).
pub fn default_claim_queue_budget(timeout: Duration) -> Duration {
    (timeout / 4).min(Duration::from_millis(100))
}
/// `store.front.timeout`: longest a front (Redis) operation may take before
/// the front counts as down and requests go to PostgreSQL alone.
pub const DEFAULT_FRONT_TIMEOUT: Duration = S::FRONT_TIMEOUT.duration();
/// `store.front.mark_after`: how long a claimed attempt runs before the
/// front marks it in flight (most requests have settled by then, and
/// their duplicates go to PostgreSQL meanwhile).
pub const DEFAULT_FRONT_MARK_AFTER: Duration = S::FRONT_MARK_AFTER.duration();
/// Largest `store.front.mark_after`.
pub const MAX_FRONT_MARK_AFTER: Duration = Duration::from_secs(60);
/// `store.prefix`: prefix of every Redis key idemgate writes.
pub const DEFAULT_STORE_PREFIX: &str = S::STORE_PREFIX.text();
/// `store.cluster`: the Redis URL names a single server, not a cluster's seed node.
pub const DEFAULT_STORE_CLUSTER: bool = S::STORE_CLUSTER.flag();
/// `store.replicas`: Redis replicas that must acknowledge a claim or a
/// record (`WAIT`) before it counts; none by default.
pub const DEFAULT_STORE_REPLICAS: u32 = S::STORE_REPLICAS.integer() as u32;
/// `store.replica_timeout`: how long `WAIT` waits for them.
pub const DEFAULT_REPLICA_TIMEOUT: Duration = S::STORE_REPLICA_TIMEOUT.duration();
/// `store.max_records`: most live records the memory store keeps.
pub const DEFAULT_STORE_MAX_RECORDS: usize = S::STORE_MAX_RECORDS.integer() as usize;
/// `store.sweep_interval`: how often the sweeper deletes expired records.
pub const DEFAULT_SWEEP_INTERVAL: Duration = S::STORE_SWEEP_INTERVAL.duration();
/// `store.sweep_batch`: most records one sweep statement deletes.
pub const DEFAULT_SWEEP_BATCH: usize = S::STORE_SWEEP_BATCH.integer() as usize;
/// `store.replay_cache_ttl`: how long a replayed record may be answered from memory.
pub const DEFAULT_REPLAY_CACHE_TTL: Duration = S::STORE_REPLAY_CACHE_TTL.duration();
/// `store.replay_cache_size`: most bytes the replay cache holds (64 MiB).
pub const DEFAULT_REPLAY_CACHE_SIZE: u64 = S::STORE_REPLAY_CACHE_SIZE.size();
/// `[store] compress`: sealed responses are compressed where that saves bytes.
pub const DEFAULT_STORE_COMPRESS: bool = S::STORE_COMPRESS.flag();
/// `[store] compression`: the codec sealed responses are compressed with.
pub const DEFAULT_STORE_COMPRESSION: Codec =
    S::STORE_COMPRESSION.pick(&[("lz4", Codec::Lz4), ("zstd", Codec::Zstd)]);
/// `[store] accept_plain_records`: records stored before keys were set replay.
pub const DEFAULT_ACCEPT_PLAIN_RECORDS: bool = S::STORE_ACCEPT_PLAIN_RECORDS.flag();

// ---------------------------------------------------------------------------
// Routes (and `[defaults]`).

/// `key_required`: a missing key is a `400`.
pub const DEFAULT_KEY_REQUIRED: bool = S::KEY_REQUIRED.flag();
/// `retention`: how long a record (and a `held` key) is kept.
pub const DEFAULT_RETENTION: Duration = S::RETENTION.duration();
/// `lease`: how long an attempt owns its key without renewing.
pub const DEFAULT_LEASE: Duration = S::LEASE.duration();
/// `upstream_timeout`: longest wait for the upstream's whole response.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = S::UPSTREAM_TIMEOUT.duration();
/// `max_request_body`: largest request body accepted (1 MiB).
pub const DEFAULT_MAX_REQUEST_BODY: usize = S::MAX_REQUEST_BODY.size() as usize;
/// `max_recorded_response`: largest response recorded (8 MiB).
pub const DEFAULT_MAX_RECORDED_RESPONSE: usize = S::MAX_RECORDED_RESPONSE.size() as usize;
/// `on_unknown_outcome`: a lapsed lease holds the key.
pub const DEFAULT_ON_UNKNOWN_OUTCOME: UnknownOutcome = S::ON_UNKNOWN_OUTCOME.pick(&[
    ("hold", UnknownOutcome::Hold),
    ("release", UnknownOutcome::Release),
    ("inquire", UnknownOutcome::Inquire),
]);
/// `on_store_error`: a store outage answers `503`.
pub const DEFAULT_ON_STORE_ERROR: OnStoreError = S::ON_STORE_ERROR.pick(&[
    ("fail_closed", OnStoreError::FailClosed),
    ("fail_open", OnStoreError::FailOpen),
]);
/// `concurrent`: an in-flight duplicate gets `409`.
pub const DEFAULT_CONCURRENT: Concurrent =
    S::CONCURRENT.pick(&[("reject", Concurrent::Reject), ("wait", Concurrent::Wait)]);
/// `wait_timeout`: how long an in-flight duplicate waits under
/// `concurrent = "wait"` before it gets `409`.
pub const DEFAULT_WAIT_TIMEOUT: Duration = S::WAIT_TIMEOUT.duration();
// `[routes.inquiry] after` has no constant: it defaults to the route's
// `upstream_timeout` (validate/inquiry.rs).
/// `[routes.inquiry] every`: the next question, while none settles the key.
pub const DEFAULT_INQUIRY_EVERY: Duration = S::INQUIRY_EVERY.duration();
/// `[routes.inquiry] give_up_after`: then the key is held.
pub const DEFAULT_INQUIRY_GIVE_UP: Duration = S::INQUIRY_GIVE_UP_AFTER.duration();
/// A status question's lease beyond its route's `upstream_timeout`: time to
/// settle the key once the answer is in.
pub const INQUIRY_LEASE_MARGIN: Duration = Duration::from_secs(5);
/// `forward_attempt`: the attempt's token is not sent upstream (but on a
/// route that inquires it is, validate/route.rs).
pub const DEFAULT_FORWARD_ATTEMPT: bool = S::FORWARD_ATTEMPT.flag();
/// `expires_header`: keyed answers announce their record's expiry (but a
/// shadow route's do not, validate/route.rs).
pub const DEFAULT_EXPIRES_HEADER: bool = S::EXPIRES_HEADER.flag();
/// `record_body`: the body is recorded with the status and headers.
pub const DEFAULT_RECORD_BODY: bool = S::RECORD_BODY.flag();
/// `max_waiting`: requests that may wait for a key at once, per instance.
pub const DEFAULT_MAX_WAITING: usize = S::MAX_WAITING.integer() as usize;
/// `mode`: enforce idempotency.
pub const DEFAULT_MODE: RouteMode = S::MODE.pick(&[
    ("enforce", RouteMode::Enforce),
    ("shadow", RouteMode::Shadow),
]);
/// `fingerprint.method`: the method is fingerprinted.
pub const DEFAULT_FINGERPRINT_METHOD: bool = S::FINGERPRINT_METHOD.flag();
/// `fingerprint.path`: the path is fingerprinted.
pub const DEFAULT_FINGERPRINT_PATH: bool = S::FINGERPRINT_PATH.flag();
/// `fingerprint.query`: the query is fingerprinted.
pub const DEFAULT_FINGERPRINT_QUERY: bool = S::FINGERPRINT_QUERY.flag();
/// `fingerprint.body`: the body is fingerprinted byte for byte.
pub const DEFAULT_FINGERPRINT_BODY: BodyMode = S::FINGERPRINT_BODY.pick(&[
    ("raw", BodyMode::Raw),
    ("json", BodyMode::Json),
    ("ignore", BodyMode::Ignore),
]);

// ---------------------------------------------------------------------------
// Bounds.

/// The longest `retention`, in days.
pub const MAX_RETENTION_DAYS: u64 = 3650;
/// The longest retention accepted (timestamps far beyond it overflow stores).
pub const MAX_RETENTION: Duration = Duration::from_secs(MAX_RETENTION_DAYS * DAY);
/// The shortest `lease` accepted.
pub const MIN_LEASE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use crate::config::settings::{self, Section, Setting};
    use crate::config::tests::parse;

    /// The routes of the file every TOML default is added to: a plain one,
    /// and one that waits and inquires (`wait_timeout` and `inquiry.*` only
    /// apply there; it sets `forward_attempt`, whose default is `true` on a
    /// route that inquires). Its store seals records: `compress` and
    /// `compression` may only be written with `encryption_keys`.
    const BASE: &str = r#"
        [store]
        url = "postgres://h/db"
        encryption_keys = ["k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="]
        [store.front]
        url = "redis://h:6379"
        [telemetry]
        [[routes]]
        name = "plain"
        match = "/a/*"
        upstream = "http://127.0.0.1:9000"
        [[routes]]
        name = "waits"
        match = "/b/*"
        upstream = "http://127.0.0.1:9000"
        concurrent = "wait"
        on_unknown_outcome = "inquire"
        forward_attempt = true
        [routes.inquiry]
        url = "http://127.0.0.1:9000/k/{key}"
    "#;

    /// Sets `setting` to its TOML default in `table` unless it is set there.
    fn set_default(table: &mut toml::Table, setting: &Setting) {
        let settings::DefaultValue::Toml(text) = setting.default else {
            return;
        };
        let mut at = table;
        let mut parts: Vec<&str> = setting.key.split('.').collect();
        let last = parts.pop().expect("a key");
        for part in parts {
            let entry = at
                .entry(part)
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            at = entry.as_table_mut().expect("a table");
        }
        let value: toml::Table = toml::from_str(&format!("v = {text}")).expect("TOML");
        at.entry(last).or_insert(value["v"].clone());
    }

    /// Every TOML default in the settings table is what the parser takes
    /// when the key is left out: the base file, with every such setting
    /// written out at its default, parses to the same configuration as the
    /// base file itself. (A route row goes in each route's own table;
    /// `wait_timeout` and `inquiry.*` only where they apply.)
    #[test]
    fn the_table_defaults_are_the_parsers() {
        let mut full: toml::Table = toml::from_str(BASE).unwrap();
        for section in Section::ALL {
            for setting in section.rows() {
                match section {
                    Section::Top => set_default(&mut full, setting),
                    Section::Route => {
                        let routes = full["routes"].as_array_mut().unwrap();
                        for route in routes.iter_mut() {
                            let route = route.as_table_mut().unwrap();
                            let waits = route.contains_key("inquiry");
                            let special = setting.key == "wait_timeout"
                                || setting.key.starts_with("inquiry.");
                            if waits || !special {
                                set_default(route, setting);
                            }
                        }
                    }
                    _ => {
                        // Tables the base file has (not `[tls]`, which has
                        // no default to write).
                        let mut at = Some(&mut full);
                        for part in section.table().split('.') {
                            at = at.and_then(|t| t.get_mut(part)?.as_table_mut());
                        }
                        if let Some(at) = at {
                            set_default(at, setting);
                        }
                    }
                }
            }
        }
        let written = toml::to_string(&full).unwrap();
        let expected = format!("{:?}", parse(BASE).unwrap());
        let got = format!("{:?}", parse(&written).unwrap());
        assert_eq!(got, expected, "written out:\n{written}");
    }
}
