//! Every default of the configuration file (docs/src/reference/configuration.md), and the bounds
//! validation holds values to, as named constants: what a key is when the
//! file leaves it out. The shipped `gateway.toml` lists the same values.
//!
//! Durations are [`Duration`]s and sizes are byte counts, so tests compare
//! against these constants rather than retyping them.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use http::{HeaderName, Method, header};

use super::route::{Concurrent, LogFormat, OnStoreError, RouteMode};
use crate::request::fingerprint::BodyMode;
use crate::store::UnknownOutcome;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

// ---------------------------------------------------------------------------
// The process.

/// `listen`: the proxy listener.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080));
/// `admin_listen`: metrics and health, never on the proxy port.
pub const DEFAULT_ADMIN_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9090));
/// `max_connections`: client connections served at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// `server_threads`: the most that may be asked for (unset: one per core).
pub const MAX_SERVER_THREADS: usize = 256;

/// `admin_token`: the shortest accepted (there is no default token: without
/// one, key administration over HTTP is off).
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;
/// `idle_timeout`: a client connection with no request in progress for this
/// long is closed (HTTP/2 gets a GOAWAY first; a parked HTTP/1.1 connection
/// is simply closed).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// `body_read_timeout`: time a client has to send a protected request's
/// whole body once its headers arrived.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// `http2_keep_alive_interval`: how often an HTTP/2 client is pinged.
pub const DEFAULT_HTTP2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// `http2_keep_alive_timeout`: a ping unanswered this long closes the connection.
pub const DEFAULT_HTTP2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// `http2_max_concurrent_streams`: requests one HTTP/2 connection may have open.
pub const DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS: u32 = 100;
/// `http2_stream_window`: request body bytes one HTTP/2 stream may have in
/// flight before the gateway reads them.
pub const DEFAULT_HTTP2_STREAM_WINDOW: usize = 256 * KIB;
/// `http2_connection_window`: the same for all streams of one connection.
pub const DEFAULT_HTTP2_CONNECTION_WINDOW: usize = MIB;
/// `max_buffered_request_bytes`: protected request bodies held in memory at
/// once, across all connections (each body's bytes are paid for as they
/// arrive, and held until its forward ends).
pub const DEFAULT_MAX_BUFFERED_REQUEST_BYTES: usize = 256 * MIB;
/// `max_forwards_in_flight`: claimed forwards at once (each may buffer up
/// to its route's `max_recorded_response`).
pub const DEFAULT_MAX_FORWARDS_IN_FLIGHT: usize = 1024;
/// `max_header_bytes`: the request head's size limit (HTTP/1.1 read buffer,
/// HTTP/2 header list).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * KIB;
/// `admin_max_connections`: connections the admin listener serves at once.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;
/// `header_read_timeout`: time a client has to send each request's headers,
/// counted from the accept for the first one (the HTTP/2 preface included),
/// and for a later HTTP/1.1 one from the arrival of its first bytes (from
/// the end of the previous answer if it begins before the connection is
/// parked: `server::h1::PARK_AFTER`).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// `shutdown_timeout`: the longest a graceful shutdown waits, in all, for
/// open connections and in-flight forwards.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(60);
/// `log_format`.
pub const DEFAULT_LOG_FORMAT: LogFormat = LogFormat::Text;
/// `[telemetry] queue`: finished spans waiting for export at most (the
/// OpenTelemetry batch processor's usual 2,048).
pub const DEFAULT_TRACE_QUEUE: usize = 2048;

// ---------------------------------------------------------------------------
// The `[store]` table.

/// `store.url` when the file names none: the embedded durable store, a file
/// in the working directory (docs/src/stores/sqlite.md).
pub const DEFAULT_STORE_URL: &str = "sqlite://idemgate.db";
/// `store.migrate`: apply embedded migrations at start.
pub const DEFAULT_STORE_MIGRATE: bool = true;
/// `store.pool_size`: most connections the store pool opens.
pub const DEFAULT_STORE_POOL_SIZE: u32 = 16;
/// `store.batches_in_flight`: PostgreSQL batches of claims and completions
/// sent at once. One measured best (bench/results/2026-11-24.md): claims
/// and completions that arrive while a batch is committing all join the
/// next one.
pub const DEFAULT_BATCHES_IN_FLIGHT: u32 = 1;
/// `store.timeout`: longest any single store operation may take.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// `store.front.timeout`: longest a front (Redis) operation may take before
/// the front counts as down and requests go to PostgreSQL alone.
pub const DEFAULT_FRONT_TIMEOUT: Duration = Duration::from_millis(250);
/// `store.front.mark_after`: how long a claimed attempt runs before the
/// front marks it in flight (most requests have settled by then, and
/// their duplicates go to PostgreSQL meanwhile).
pub const DEFAULT_FRONT_MARK_AFTER: Duration = Duration::from_millis(10);
/// Largest `store.front.mark_after`.
pub const MAX_FRONT_MARK_AFTER: Duration = Duration::from_secs(60);
/// `store.prefix`: prefix of every Redis key idemgate writes.
pub const DEFAULT_STORE_PREFIX: &str = "idemgate:";
/// `store.cluster`: the Redis URL names a single server, not a cluster's seed node.
pub const DEFAULT_STORE_CLUSTER: bool = false;
/// `store.replicas`: Redis replicas that must acknowledge a claim or a
/// record (`WAIT`) before it counts; none by default.
pub const DEFAULT_STORE_REPLICAS: u32 = 0;
/// `store.replica_timeout`: how long `WAIT` waits for them.
pub const DEFAULT_REPLICA_TIMEOUT: Duration = Duration::from_millis(100);
/// `store.max_records`: most live records the memory store keeps.
pub const DEFAULT_STORE_MAX_RECORDS: usize = 100_000;
/// `store.sweep_interval`: how often the sweeper deletes expired records.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// `store.sweep_batch`: most records one sweep statement deletes.
pub const DEFAULT_SWEEP_BATCH: usize = 1000;
/// `store.replay_cache_ttl`: how long a replayed record may be answered from memory.
pub const DEFAULT_REPLAY_CACHE_TTL: Duration = Duration::from_secs(5);
/// `store.replay_cache_size`: most bytes the replay cache holds (64 MiB).
pub const DEFAULT_REPLAY_CACHE_SIZE: u64 = 64 * MIB as u64;

// ---------------------------------------------------------------------------
// Routes (and `[defaults]`).

/// `methods`: the protected methods.
pub const DEFAULT_METHODS: [Method; 2] = [Method::POST, Method::PATCH];
/// `key_header`: the header carrying the key (`Idempotency-Key`).
pub const DEFAULT_KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");
/// `key_required`: a missing key is a `400`.
pub const DEFAULT_KEY_REQUIRED: bool = true;
/// `retention`: how long a record (and a `held` key) is kept.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(DAY);
/// `lease`: how long an attempt owns its key without renewing.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// `upstream_timeout`: longest wait for the upstream's whole response.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(25);
/// `max_request_body`: largest request body accepted (1 MiB).
pub const DEFAULT_MAX_REQUEST_BODY: usize = MIB;
/// `max_recorded_response`: largest response recorded (8 MiB).
pub const DEFAULT_MAX_RECORDED_RESPONSE: usize = 8 * MIB;
/// `on_unknown_outcome`: a lapsed lease holds the key.
pub const DEFAULT_ON_UNKNOWN_OUTCOME: UnknownOutcome = UnknownOutcome::Hold;
/// `on_store_error`: a store outage answers `503`.
pub const DEFAULT_ON_STORE_ERROR: OnStoreError = OnStoreError::FailClosed;
/// `concurrent`: an in-flight duplicate gets `409`.
pub const DEFAULT_CONCURRENT: Concurrent = Concurrent::Reject;
/// `wait_timeout`: how long an in-flight duplicate waits under
/// `concurrent = "wait"` before it gets `409`.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(10);
// `[routes.inquiry] after` has no constant: it defaults to the route's
// `upstream_timeout` (validate/inquiry.rs).
/// `[routes.inquiry] every`: the next question, while none settles the key.
pub const DEFAULT_INQUIRY_EVERY: Duration = Duration::from_secs(30);
/// `[routes.inquiry] give_up_after`: then the key is held.
pub const DEFAULT_INQUIRY_GIVE_UP: Duration = Duration::from_secs(3600);
/// A status question's lease beyond its route's `upstream_timeout`: time to
/// settle the key once the answer is in.
pub const INQUIRY_LEASE_MARGIN: Duration = Duration::from_secs(5);
/// `forward_attempt`: the attempt's token is not sent upstream (but on a
/// route that inquires it is, validate/route.rs).
pub const DEFAULT_FORWARD_ATTEMPT: bool = false;
/// `max_waiting`: requests that may wait for a key at once, per instance.
pub const DEFAULT_MAX_WAITING: usize = 10_000;
/// `mode`: enforce idempotency.
pub const DEFAULT_MODE: RouteMode = RouteMode::Enforce;
/// `record` (docs/src/reference/configuration.md): 2xx, 3xx and 4xx except 408, 409, 425 and 429.
pub const DEFAULT_RECORD: &[&str] = &["2xx", "3xx", "4xx", "!408", "!409", "!425", "!429"];
/// `replay_headers`: response headers never recorded nor replayed
/// (hop-by-hop ones are always dropped).
pub const DEFAULT_REPLAY_HEADERS_DENY: [HeaderName; 2] = [header::SET_COOKIE, header::DATE];
/// `fingerprint.method`: the method is fingerprinted.
pub const DEFAULT_FINGERPRINT_METHOD: bool = true;
/// `fingerprint.path`: the path is fingerprinted.
pub const DEFAULT_FINGERPRINT_PATH: bool = true;
/// `fingerprint.query`: the query is fingerprinted.
pub const DEFAULT_FINGERPRINT_QUERY: bool = true;
/// `fingerprint.body`: the body is fingerprinted byte for byte.
pub const DEFAULT_FINGERPRINT_BODY: BodyMode = BodyMode::Raw;

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
    use super::*;

    /// The one place the documented values are typed out: a change to a
    /// default must change this test, `gateway.toml` and docs/src/reference/configuration.md.
    #[test]
    fn defaults_are_the_documented_values() {
        let secs = |s: &str| humantime::parse_duration(s).unwrap();
        let bytes = |s: &str| s.parse::<bytesize::ByteSize>().unwrap().as_u64();
        assert_eq!(DEFAULT_LISTEN, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(DEFAULT_ADMIN_LISTEN, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(DEFAULT_METHODS, [Method::POST, Method::PATCH]);
        assert_eq!(DEFAULT_KEY_HEADER, "Idempotency-Key");
        let (migrate, key_required) = (DEFAULT_STORE_MIGRATE, DEFAULT_KEY_REQUIRED);
        assert_eq!([migrate, key_required], [true, true]);
        assert_eq!(DEFAULT_RETENTION, secs("24h"));
        assert_eq!(DEFAULT_LEASE, secs("30s"));
        assert_eq!(DEFAULT_UPSTREAM_TIMEOUT, secs("25s"));
        assert_eq!(DEFAULT_MAX_REQUEST_BODY as u64, bytes("1MiB"));
        assert_eq!(DEFAULT_MAX_RECORDED_RESPONSE as u64, bytes("8MiB"));
        assert_eq!(DEFAULT_ON_UNKNOWN_OUTCOME, UnknownOutcome::Hold);
        assert_eq!(DEFAULT_ON_STORE_ERROR, OnStoreError::FailClosed);
        assert_eq!(
            DEFAULT_REPLAY_HEADERS_DENY,
            [header::SET_COOKIE, header::DATE]
        );
        assert_eq!(DEFAULT_REPLAY_CACHE_TTL, secs("5s"));
        assert_eq!(DEFAULT_REPLAY_CACHE_SIZE, bytes("64MiB"));
        assert_eq!(MAX_RETENTION, Duration::from_secs(3650 * 24 * 3600));
    }
}
