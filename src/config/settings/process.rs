//! The settings of the process: the file's top level (listeners, limits,
//! deadlines), `[tls]` and `[telemetry]`. Rows of the settings table
//! (`super`); a reload applies none of them.

use super::DefaultValue::{Derived, Required, Toml, Unset};
use super::{Kind, Reload, Section, Setting};

super::rows! { TOP = Top {
    /// address of the proxy listener (HTTP/1.1 and cleartext HTTP/2; with [`[tls]`](#tls), TLS
    /// only)
    LISTEN "listen" Address Toml(r#""0.0.0.0:8080""#), Restart;
    /// address of `/metrics`, `/healthz`, `/readyz` and `POST /keys`
    ADMIN_LISTEN "admin_listen" Address Toml(r#""127.0.0.1:9090""#), Restart;
    /// bearer token `POST /keys` requires (at least 16 characters); unset or empty: `POST /keys` is
    /// refused (see [the admin API](admin-api.md#post-keys))
    ADMIN_TOKEN "admin_token" Text Unset("unset"), Restart;
    /// client connections served at once; further ones wait in the listen backlog (≥ 1)
    MAX_CONNECTIONS "max_connections" Integer Toml("10000"), Restart;
    /// threads serving client connections, each with a runtime and an upstream connection pool of
    /// its own; an accepted connection goes to the one with the fewest open connections and stays
    /// there, with its requests, their forward tasks and their upstream connections. The store and
    /// the admin listener stay on the shared runtime. On one Redis server (the Redis store, or a
    /// PostgreSQL store's `[store.front]`), each serving thread also keeps a Redis connection of
    /// its own for the requests it serves; on PostgreSQL, a batcher and a pool of its own for its
    /// claims and completions (its share of `pool_size` and `batches_in_flight`). `0`: serve on the
    /// shared multi-threaded runtime instead (measured on two shared cores: pass-through 1.2×
    /// faster with serving threads, replays equal, new keys on PostgreSQL 1.02–1.09×; see [serving
    /// threads](../design/connections.md#serving-threads)) (≤ 256)
    SERVER_THREADS "server_threads" Integer Derived("the host's cores"), Restart;
    /// time a client has to send each request's headers; for the first request it counts from the
    /// accept, whatever the protocol (nothing sent, half an HTTP/2 preface: closed); for a later
    /// HTTP/1.1 request, from the end of the previous answer if it begins within the next second
    /// (or half of this, if less), else from the arrival of its first bytes
    HEADER_READ_TIMEOUT "header_read_timeout" Duration Toml(r#""10s""#), Restart;
    /// a client connection with no request in progress for this long is closed (HTTP/2: GOAWAY
    /// first). An idle HTTP/1.1 keep-alive connection waits for its next request this long,
    /// whatever `header_read_timeout` is (it is parked after 1 s, or half of `header_read_timeout`,
    /// before hyper's head timer can cut it)
    IDLE_TIMEOUT "idle_timeout" Duration Toml(r#""60s""#), Restart;
    /// time a client has to send a protected request's whole body (else `408 body-timeout`)
    BODY_READ_TIMEOUT "body_read_timeout" Duration Toml(r#""30s""#), Restart;
    /// HTTP/2 clients are pinged this often
    HTTP2_KEEP_ALIVE_INTERVAL "http2_keep_alive_interval" Duration Toml(r#""20s""#), Restart;
    /// a ping unanswered this long closes the connection
    HTTP2_KEEP_ALIVE_TIMEOUT "http2_keep_alive_timeout" Duration Toml(r#""20s""#), Restart;
    /// requests one HTTP/2 connection may have open at once
    HTTP2_MAX_CONCURRENT_STREAMS "http2_max_concurrent_streams" Integer Toml("100"), Restart;
    /// unread request body bytes one HTTP/2 stream may have in flight
    HTTP2_STREAM_WINDOW "http2_stream_window" Size Toml(r#""256KiB""#), Restart;
    /// the same for all streams of one HTTP/2 connection
    HTTP2_CONNECTION_WINDOW "http2_connection_window" Size Toml(r#""1MiB""#), Restart;
    /// a request head's size limit (HTTP/1.1 read buffer, HTTP/2 header list; at least 8KiB)
    MAX_HEADER_BYTES "max_header_bytes" Size Toml(r#""64KiB""#), Restart;
    /// protected request bodies held in memory at once (at least every route's `max_request_body`);
    /// beyond it `503 overloaded`
    MAX_BUFFERED_REQUEST_BYTES "max_buffered_request_bytes" Size Toml(r#""256MiB""#), Restart;
    /// claimed forwards at once; beyond it `503 overloaded`
    MAX_FORWARDS_IN_FLIGHT "max_forwards_in_flight" Integer Toml("1024"), Restart;
    /// requests waiting for an in-flight key at once (`concurrent = "wait"`), per instance; beyond
    /// it a duplicate gets `409` at once
    MAX_WAITING "max_waiting" Integer Toml("10000"), Restart;
    /// connections the admin listener serves at once (it has the proxy's deadlines too)
    ADMIN_MAX_CONNECTIONS "admin_max_connections" Integer Toml("64"), Restart;
    /// on shutdown, the longest wait in all for open connections and in-flight forwards to finish
    SHUTDOWN_TIMEOUT "shutdown_timeout" Duration Toml(r#""60s""#), Restart;
    /// if set, every problem response carries `Link: <docs_url#slug>; rel="describedby"`
    DOCS_URL "docs_url" Text Unset("unset"), Restart;
    /// how often the config file is read to [reload](../operations/reload.md) it when its bytes
    /// changed (at least `1s`); off: on SIGHUP and `POST /config/reload` only
    WATCH_CONFIG "watch_config" Duration Unset("off"), Restart;
    /// `"text"` for a terminal, `"json"` (one object per line) for production; `--log-format` wins
    LOG_FORMAT "log_format" Choice Toml(r#""text""#), Restart;
}}

super::rows! { TLS = Tls {
    /// PEM file: the proxy listener's certificate chain, its own certificate first; read at start
    /// and again on SIGHUP
    TLS_CERT "cert" Text Required("required in `[tls]`"), Restart;
    /// PEM file: the private key of that certificate (PKCS#8, PKCS#1 or SEC1); a key that does not
    /// match the certificate is an error
    TLS_KEY "key" Text Required("required in `[tls]`"), Restart;
    /// PEM file of the CA certificates trusted for client certificates: the listener asks each
    /// client for one and verifies it (mTLS); its identity can be a route's scope (`cert:` parts of
    /// `scope_from`). Read at start and again with `cert` (see [client
    /// certificates](../stores/tls.md#client-certificates))
    TLS_CLIENT_CA "client_ca" Text Unset("unset: no client certificates asked"), Restart;
    /// `"required"`: a client without a valid certificate fails the handshake; `"optional"`: a
    /// client may present none and is served without an identity (one it presents must still be
    /// valid). Only with `client_ca`
    TLS_CLIENT_AUTH "client_auth" Choice Derived("`\"required\"` when `client_ca` is set"), Restart;
}}

super::rows! { TELEMETRY = Telemetry {
    /// the collector's OTLP/HTTP base URL (`http://` or `https://`); `/v1/traces` is appended
    TELEMETRY_ENDPOINT "endpoint" Text Derived("`http://localhost:4318`"), Restart;
    /// the spans' `service.name`
    TELEMETRY_SERVICE_NAME "service_name" Text Derived("`idemgate`"), Restart;
    /// share of new traces sampled, 0 to 1; a trace continued from a caller follows the caller's
    /// decision
    TELEMETRY_SAMPLE_RATIO "sample_ratio" Ratio Derived("all"), Restart;
    /// finished spans waiting for export at most; more are dropped and counted
    TELEMETRY_QUEUE "queue" Integer Toml("2048"), Restart;
}}
