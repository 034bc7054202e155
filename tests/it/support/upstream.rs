//! The one test upstream: a real HTTP server on port 0 that counts what it
//! receives and keeps a ledger of what it executed, for the gateway tests
//! and the chaos harness alike.
//!
//! Behaviour by path:
//! - `/status/{code}`: answers `{code}` with a JSON body;
//! - `/slow/{ms}`: waits, then 201;
//! - `/hang`: never answers;
//! - `/reset`: drops the connection without answering (after acting);
//! - `/drop-once`: the first request with a key is dropped before acting
//!   (no execution); later ones act as on any other path;
//! - `/reset/original/{code}`: as `/reset`, for an operation whose answer
//!   would have been `{code}` (the lookup conveys it);
//! - `GET …/idempotency/{key}[?scope={digest}]`: the status inquiry lookup,
//!   not an execution: `200` with the key's execution if it has one (with
//!   `Idempotency-Original-Status` when that answer was not a 2xx, and
//!   cache metadata of its own), `404` if not ([`Upstream::lookup`] makes
//!   it fail, lie or answer `202`, for negative controls). It keeps the
//!   lookup's contract: a key is the `Idempotency-Key` header's value (an
//!   sf-string unquoted), or the RFC 8941 list of the values of the headers
//!   [`KEY_PARTS_HEADER`] names; a scope is the digest of [`TENANT_HEADER`]
//!   by idemgate's recipe (`{scope}`); after a `404` it refuses (`409`, no
//!   execution) every request for the key whose `Idempotency-Attempt` is at
//!   most the question's.
//! - `/binary`: 201 with a binary body, `Location` and `ETag`;
//! - `/big/{n}`: 200 with `n` bytes;
//! - anything else: 201 with a JSON body naming how many requests with this
//!   key arrived (so two executions of one key never answer the same bytes),
//!   plus `Location`, `ETag` and `Set-Cookie`.
//!
//! Paths are normalised first, as many proxies and frameworks do (RFC
//! 3986: `%2E` decoded, then dot-segments removed), so
//! `…/idempotency/%2E%2E` is `…/` and never a lookup.
//!
//! On any path, the header [`DELAY_HEADER`] makes it wait that many
//! milliseconds once the request has arrived, before it answers, and
//! [`OP_HEADER`] names the client operation in its ledger.
//!
//! [`Upstream::start_tls`] serves the same over TLS, with HTTP/2 or
//! HTTP/1.1 as ALPN chose; [`Upstream::last_version`] tells which.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

use super::serial;

/// The body of `/binary`.
pub const BINARY_BODY: &[u8] = &[0, 159, 146, 150, 255, 0, 1, 2, 13, 10, 0, 254];

/// Header carrying a client's operation id into the ledger (forwarded
/// untouched by the gateway, and not part of the fingerprint).
pub const OP_HEADER: &str = "x-test-op";

/// Header naming, for the ledger only, the key of a request whose route
/// reads its key from elsewhere (the gateway never looks at it).
pub const KEY_LABEL_HEADER: &str = "x-test-key";

/// Header naming, comma-separated, the headers whose values form the key
/// of a route with several `key_from` parts (their RFC 8941 list).
pub const KEY_PARTS_HEADER: &str = "x-test-key-parts";

/// The header this upstream knows its tenants by (a route's
/// `scope_header`): executions and lookups are per tenant.
pub const TENANT_HEADER: &str = "x-tenant";

/// Header by which a client asks the upstream to take this long (ms).
pub const DELAY_HEADER: &str = "x-test-delay-ms";

/// One execution: a request that arrived whole, so the upstream acted on it.
#[derive(Debug, Clone)]
pub struct Execution {
    /// Its number, unique over the upstream's life.
    pub number: u64,
    /// The client operation ([`OP_HEADER`]; `u64::MAX` without one).
    pub op: u64,
    /// The key: the `Idempotency-Key` header's value (unquoted), or what
    /// [`KEY_LABEL_HEADER`] or [`KEY_PARTS_HEADER`] name.
    pub key: String,
    /// The tenant's scope digest ([`scope_digest`] of [`TENANT_HEADER`]),
    /// hex; empty without one.
    pub scope: String,
    /// [`digest`] of the request body.
    pub body: String,
    /// [`response_digest`] of the answer it sent (or would have sent: see
    /// `/hang` and `/reset`).
    pub response: String,
    /// The status it answered, or would have (`/reset/original/{code}`).
    pub original: u16,
    /// The status and body size it answered (`None`: `/hang`, `/reset`).
    pub answered: Option<(u16, u64)>,
    /// When the whole request had arrived (the execution began).
    pub arrived: std::time::Instant,
    /// When the upstream answers (or would have: see `/hang`): until then
    /// the execution is in progress.
    pub until: std::time::Instant,
}

/// What the upstream saw.
#[derive(Default)]
struct Seen {
    /// Requests per key ([`Execution::key`], after `scope/` when scoped).
    per_key: HashMap<String, u64>,
    /// Per key (as in `per_key`): the highest `Idempotency-Attempt` a
    /// lookup answered `404` behind; requests up to it are refused.
    fenced: HashMap<String, u64>,
    /// Requests refused by that fence.
    refused: u64,
    /// The last lookup's headers.
    last_lookup_headers: HeaderMap,
    /// The last request's headers.
    last_headers: HeaderMap,
    /// The last request's HTTP version.
    last_version: Option<http::Version>,
    /// Total requests.
    total: u64,
    /// Every execution, in order.
    executions: Vec<Execution>,
    /// Status inquiry lookups per key.
    lookups: HashMap<String, u64>,
    /// How the lookup answers.
    lookup: Lookup,
}

/// How `GET …/idempotency/{key}` answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Lookup {
    /// Truthfully: 200 if the key was executed, 404 if not.
    #[default]
    Truthful,
    /// `503` for this many questions, then truthfully.
    FailFirst(u64),
    /// `503` always.
    Down,
    /// `404` always, even for keys it executed: a broken contract.
    Lying,
    /// `202 Accepted` (still processing) for this many questions, then
    /// truthfully.
    AcceptedFirst(u64),
}

/// A running upstream; stops accepting when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
    _turn: serial::Shared,
}

impl Upstream {
    /// Listen on a free port of 127.0.0.1.
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// Listen on a free port of 127.0.0.1 for TLS with `tls`; HTTP/2 if
    /// the handshake chose `h2` by ALPN, HTTP/1.1 otherwise.
    pub async fn start_tls(tls: Arc<rustls::ServerConfig>) -> Self {
        Self::start_with(Some(tokio_rustls::TlsAcceptor::from(tls))).await
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let turn = serial::shared();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let state = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = state.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| answer(req, state.clone()));
                    let Some(tls) = tls else {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                        return;
                    };
                    // A failed handshake (the gateway refused the
                    // certificate) just ends the connection.
                    let Ok(stream) = tls.accept(stream).await else {
                        return;
                    };
                    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }
                });
            }
        });
        Self {
            addr,
            seen,
            task,
            _turn: turn,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its `https://` URL (for [`Upstream::start_tls`]).
    pub fn https_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The HTTP version of the last request that arrived.
    pub fn last_version(&self) -> Option<http::Version> {
        self.seen.lock().unwrap().last_version
    }

    /// How many requests with this key arrived (its value: a quoted key
    /// unquoted; `scope/key` for a tenant's).
    pub fn count(&self, key_header_value: &str) -> u64 {
        self.seen
            .lock()
            .unwrap()
            .per_key
            .get(key_header_value)
            .copied()
            .unwrap_or(0)
    }

    /// Wait until a request with this key header value has arrived (it is
    /// at the upstream now); panics after 30 s.
    pub async fn arrived(&self, key_header_value: &str) {
        let here = super::eventually(Duration::from_secs(30), || {
            let n = self.count(key_header_value);
            async move { (n > 0).then_some(()) }
        })
        .await;
        assert!(
            here.is_some(),
            "no request with key {key_header_value:?} arrived within 30 s"
        );
    }

    /// How many requests arrived.
    pub fn total(&self) -> u64 {
        self.seen.lock().unwrap().total
    }

    /// The last status inquiry lookup's headers.
    pub fn last_lookup_headers(&self) -> HeaderMap {
        self.seen.lock().unwrap().last_lookup_headers.clone()
    }

    /// How many requests the lookup's fence refused (after a `404`).
    pub fn refused(&self) -> u64 {
        self.seen.lock().unwrap().refused
    }

    /// The last request's headers.
    pub fn last_headers(&self) -> HeaderMap {
        self.seen.lock().unwrap().last_headers.clone()
    }

    /// Set how the status inquiry lookup answers from now on.
    pub fn lookup(&self, lookup: Lookup) {
        self.seen.lock().unwrap().lookup = lookup;
    }

    /// How many status inquiry lookups asked about this key.
    pub fn lookups(&self, key: &str) -> u64 {
        self.seen
            .lock()
            .unwrap()
            .lookups
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Every execution so far.
    pub fn executions(&self) -> Vec<Execution> {
        self.seen.lock().unwrap().executions.clone()
    }

    /// Executions per key.
    pub fn executions_per_key(&self) -> HashMap<String, Vec<Execution>> {
        let mut map: HashMap<String, Vec<Execution>> = HashMap::new();
        for execution in self.executions() {
            map.entry(execution.key.clone())
                .or_default()
                .push(execution);
        }
        map
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug)]
struct Reset;
impl std::fmt::Display for Reset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reset on purpose")
    }
}
impl std::error::Error for Reset {}

/// What to do once the request has arrived.
enum Plan {
    /// Status, headers and body.
    Answer(u16, Vec<(&'static str, String)>, Bytes),
    Hang,
    Reset,
}

async fn answer(
    req: Request<Incoming>,
    seen: Arc<Mutex<Seen>>,
) -> Result<Response<Full<Bytes>>, Reset> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default()
    };
    // A route whose key is not in `Idempotency-Key` (a webhook's, in its
    // body) names it for the ledger in [`KEY_LABEL_HEADER`], or names the
    // headers it is made of in [`KEY_PARTS_HEADER`].
    let key = match (header(KEY_LABEL_HEADER), header(KEY_PARTS_HEADER)) {
        (label, _) if !label.is_empty() => label,
        (_, parts) if !parts.is_empty() => {
            let values: Vec<String> = parts.split(',').map(|h| header(h.trim())).collect();
            sf_list(&values)
        }
        _ => sf_value(&header("idempotency-key")),
    };
    let scope = match header(TENANT_HEADER) {
        tenant if tenant.is_empty() => String::new(),
        tenant => hex::encode(scope_digest(tenant.as_bytes())),
    };
    let ledger = if scope.is_empty() {
        key.clone()
    } else {
        format!("{scope}/{key}")
    };
    let path = remove_dot_segments(req.uri().path());
    if req.method() == http::Method::GET && path.contains("/idempotency/") {
        return Ok(lookup(&req, &path, &seen));
    }
    let attempt: u64 = header("idempotency-attempt").parse().unwrap_or(0);
    {
        let mut s = seen.lock().unwrap();
        if s.fenced.get(&ledger).is_some_and(|f| attempt <= *f) {
            // Refused without acting: the lookup promised this key never acts.
            s.refused += 1;
            let body = Full::new(Bytes::from_static(b"{\"error\":\"fenced\"}"));
            return Ok(Response::builder().status(409).body(body).unwrap());
        }
    }
    let op: u64 = header(OP_HEADER).parse().unwrap_or(u64::MAX);
    let mut delay = Duration::from_millis(header(DELAY_HEADER).parse().unwrap_or(0));
    let n = {
        let mut s = seen.lock().unwrap();
        s.total += 1;
        s.last_headers = req.headers().clone();
        s.last_version = Some(req.version());
        let n = s.per_key.entry(ledger).or_default();
        *n += 1;
        *n
    };
    // The operation happens when the whole request has arrived.
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|_| Reset)?
        .to_bytes();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let find = |name: &str| {
        segments
            .iter()
            .position(|s| *s == name)
            .and_then(|i| segments.get(i + 1))
    };
    let json = |status: u16, mut headers: Vec<(&'static str, String)>| {
        headers.insert(0, ("content-type", "application/json".into()));
        let body = format!("{{\"n\":{n},\"path\":\"{path}\"}}");
        Plan::Answer(status, headers, Bytes::from(body))
    };
    // What the operation answers (or, reset, would have answered).
    let original: u16 = find("original").map_or(201, |c| c.parse().unwrap());
    let plan = if let Some(code) = find("status") {
        json(code.parse().unwrap(), Vec::new())
    } else if let Some(ms) = find("slow") {
        delay += Duration::from_millis(ms.parse().unwrap());
        json(201, Vec::new())
    } else if segments.contains(&"hang") {
        Plan::Hang
    } else if segments.contains(&"reset") {
        Plan::Reset
    } else if segments.contains(&"drop-once") && n == 1 {
        // Dropped before acting: nothing is executed.
        return Err(Reset);
    } else if segments.contains(&"binary") {
        let headers = vec![
            ("content-type", "application/octet-stream".into()),
            ("location", "/v1/things/42".into()),
            ("etag", "\"v1-abc\"".into()),
        ];
        Plan::Answer(201, headers, Bytes::from_static(BINARY_BODY))
    } else if let Some(size) = find("big") {
        let size: usize = size.parse().unwrap();
        Plan::Answer(200, Vec::new(), Bytes::from(vec![b'x'; size]))
    } else {
        json(
            201,
            vec![
                ("location", format!("/v1/things/{n}")),
                ("etag", format!("\"e{n}\"")),
                ("set-cookie", "session=abc; HttpOnly".into()),
            ],
        )
    };
    {
        let mut s = seen.lock().unwrap();
        let number = s.executions.len() as u64 + 1;
        let response = match &plan {
            Plan::Answer(status, headers, body) => {
                let mut all = headers.clone();
                all.sort();
                response_digest(
                    *status,
                    all.iter()
                        .filter(|(name, _)| REPLAYED_HEADERS.contains(name))
                        .map(|(name, value)| (*name, value.as_bytes())),
                    body,
                )
            }
            Plan::Hang | Plan::Reset => String::new(),
        };
        let answered = match &plan {
            Plan::Answer(status, _, body) => Some((*status, body.len() as u64)),
            Plan::Hang | Plan::Reset => None,
        };
        let arrived = std::time::Instant::now();
        let until = match &plan {
            Plan::Hang => arrived + Duration::from_secs(3600),
            Plan::Answer(..) | Plan::Reset => arrived + delay,
        };
        let original = match &plan {
            Plan::Answer(status, ..) => *status,
            Plan::Hang | Plan::Reset => original,
        };
        s.executions.push(Execution {
            number,
            op,
            key,
            scope,
            original,
            body: digest(&body),
            response,
            answered,
            arrived,
            until,
        });
    }
    tokio::time::sleep(delay).await;
    match plan {
        Plan::Answer(status, headers, body) => {
            let mut response = Response::builder().status(status);
            for (name, value) in headers {
                response = response.header(name, value);
            }
            Ok(response.body(Full::new(body)).unwrap())
        }
        Plan::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Err(Reset)
        }
        Plan::Reset => Err(Reset),
    }
}

/// The status inquiry lookup for the key at the end of `path` (already
/// normalised), under the tenant of its `scope` query parameter: what the
/// upstream knows of it, as its [`Lookup`] mode lets it say.
fn lookup(req: &Request<Incoming>, path: &str, seen: &Mutex<Seen>) -> Response<Full<Bytes>> {
    let raw = path.rsplit('/').next().unwrap_or_default();
    let key = percent_encoding::percent_decode_str(raw)
        .decode_utf8_lossy()
        .into_owned();
    let scope = req
        .uri()
        .query()
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("scope="))
        .unwrap_or_default()
        .to_string();
    let fence: u64 = req
        .headers()
        .get("idempotency-attempt")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let mut s = seen.lock().unwrap();
    s.last_headers = req.headers().clone();
    s.last_lookup_headers = req.headers().clone();
    *s.lookups.entry(key.clone()).or_default() += 1;
    let executed: Vec<&Execution> = s
        .executions
        .iter()
        .filter(|e| e.key == key && e.scope == scope)
        .collect();
    let found = executed
        .first()
        .map(|e| (e.number, executed.len(), e.original));
    let mut extra = Vec::new();
    let (status, body) = match (s.lookup, found) {
        (
            Lookup::FailFirst(0) | Lookup::AcceptedFirst(0) | Lookup::Truthful,
            Some((number, times, original)),
        ) => {
            if !(200..300).contains(&original) {
                extra.push(("idempotency-original-status", original.to_string()));
            }
            // The lookup's own metadata: never part of the original answer.
            extra.push(("etag", format!("\"lookup-{number}\"")));
            extra.push(("cache-control", "max-age=60".to_string()));
            extra.push(("content-location", format!("/v1/idempotency/{raw}")));
            extra.push(("set-cookie", "lookup-session=1".to_string()));
            (200, lookup_body(&key, number, times))
        }
        (Lookup::FailFirst(0) | Lookup::AcceptedFirst(0) | Lookup::Truthful | Lookup::Lying, _) => {
            // "Never acted, and never will": fence the attempts up to the
            // question's token before saying so.
            let ledger = if scope.is_empty() {
                key.clone()
            } else {
                format!("{scope}/{key}")
            };
            if fence > 0 {
                let fenced = s.fenced.entry(ledger).or_default();
                *fenced = (*fenced).max(fence);
            }
            (404, String::new())
        }
        (Lookup::FailFirst(left), _) => {
            s.lookup = Lookup::FailFirst(left - 1);
            (503, String::new())
        }
        (Lookup::AcceptedFirst(left), _) => {
            s.lookup = Lookup::AcceptedFirst(left - 1);
            (202, "{\"status\":\"processing\"}".to_string())
        }
        (Lookup::Down, _) => (503, String::new()),
    };
    let mut response = Response::builder()
        .status(status)
        .header("content-type", "application/json");
    for (name, value) in extra {
        response = response.header(name, value);
    }
    response.body(Full::new(Bytes::from(body))).unwrap()
}

/// The lookup's `200` body about `key`: its first execution's number and
/// how many there were.
pub fn lookup_body(key: &str, number: u64, times: usize) -> String {
    let key = serde_json::to_string(key).unwrap();
    format!("{{\"key\":{key},\"execution\":{number},\"times\":{times}}}")
}

/// An `Idempotency-Key` header's value: an RFC 8941 sf-string unquoted and
/// unescaped, a bare key as it is (written apart from idemgate's parser).
pub fn sf_value(raw: &str) -> String {
    let raw = raw.trim();
    let Some(inner) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) else {
        return raw.to_string();
    };
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        out.push(if c == '\\' {
            chars.next().unwrap_or(c)
        } else {
            c
        });
    }
    out
}

/// Several key parts' values as idemgate keeps them: an RFC 8941 list of
/// strings, `"a", "b"`.
pub fn sf_list(values: &[String]) -> String {
    let quoted: Vec<String> = values
        .iter()
        .map(|v| format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    quoted.join(", ")
}

/// idemgate's scope digest of one header value, by the book's recipe:
/// SHA-256 over the value preceded by its length as 8 bytes big-endian.
pub fn scope_digest(value: &[u8]) -> Vec<u8> {
    let mut hasher = Sha256::new();
    hasher.update((value.len() as u64).to_be_bytes());
    hasher.update(value);
    hasher.finalize().to_vec()
}

/// RFC 3986 §6.2.2.2 and §5.2.4 on a raw path: percent-encoded dots
/// decoded, then `.` and `..` segments resolved, as a normalising proxy
/// (nginx) or framework does.
fn remove_dot_segments(path: &str) -> String {
    let decoded = path.replace("%2E", ".").replace("%2e", ".");
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = decoded.split('/').collect();
    let last = segments.len().saturating_sub(1);
    for (i, segment) in segments.iter().enumerate() {
        match *segment {
            "." | ".." => {
                if *segment == ".." && out.len() > 1 {
                    out.pop();
                }
                if i == last {
                    out.push("");
                }
            }
            other => out.push(other),
        }
    }
    out.join("/")
}

/// A short hex digest of some bytes.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(bytes)[..8])
}

/// The headers of the upstream's answers that a replay must carry with the
/// same values (the gateway records them; `set-cookie` is on its default
/// `replay_headers` deny list, so it is not among them).
pub const REPLAYED_HEADERS: [&str; 3] = ["content-type", "etag", "location"];

/// A header a replay must never carry (the default `replay_headers` deny
/// list keeps it out of the record).
pub const DENIED_HEADER: &str = "set-cookie";

/// The digest of an answer: its status, the [`REPLAYED_HEADERS`] it carries
/// (name and value, in name order: pass them so) and its body bytes.
pub fn response_digest<'a>(
    status: u16,
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    body: &[u8],
) -> String {
    let mut hasher = Sha256::new();
    hasher.update(status.to_be_bytes());
    for (name, value) in headers {
        for part in [name.as_bytes(), value] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
    }
    hasher.update(body);
    hex::encode(&hasher.finalize()[..8])
}
