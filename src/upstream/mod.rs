//! Talking to upstreams: the pooled hyper-util clients (cleartext, and one
//! per set of trusted roots for `https://`, [`connector`]), the request
//! rewrite (upstream URI, `X-Forwarded-*`), and hop-by-hop header hygiene in
//! both directions (RFC 9110 §7.6.1, including the headers `Connection`
//! names).

mod answer;
mod connector;
mod exchange;

pub use answer::{IDEMPOTENCY_ATTEMPT, IDEMPOTENCY_EXPIRES, announce_expiry, recorded, to_client};
pub use exchange::{ExchangeError, read_up_to};

use std::net::SocketAddr;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{Request, Response, Version};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::config::UpstreamCa;
use crate::request::body::Body;

/// Headers that belong to one connection, never forwarded (RFC 9110 §7.6.1
/// plus the classic RFC 2616 list and the non-standard `Proxy-Connection`).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Remove hop-by-hop headers and every header the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip_hop_by_hop_except(headers, |_| false);
}

/// [`strip_hop_by_hop`], except that `Connection` cannot remove the headers
/// `end_to_end` names (the idempotency key and scope travel unchanged to
/// the upstream, whatever the client's `Connection` says).
fn strip_hop_by_hop_except(headers: &mut HeaderMap, end_to_end: impl Fn(&HeaderName) -> bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .filter(|name| !end_to_end(name))
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

/// A request extension: the client's connection is TLS, so the upstream
/// is told `X-Forwarded-Proto: https`.
#[derive(Debug, Clone, Copy)]
pub struct ClientOverTls;

/// Why an exchange with the upstream failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The request never reached the upstream (connection refused, DNS, …).
    #[error("could not connect to the upstream: {0}")]
    NotSent(String),
    /// The exchange broke after the request may have been sent.
    #[error("the upstream exchange failed: {0}")]
    Failed(String),
}

/// The pooled clients every route shares: one for `http://` upstreams
/// (HTTP/1.1), and for `https://` ones one per `upstream_ca` (and one for
/// the system's roots alone), each with its own connection pool.
#[derive(Clone)]
pub struct Upstream {
    connect_timeout: Duration,
    cleartext: Client<HttpConnector, Body>,
    /// By `upstream_ca` (its path names it); `None`: the system's roots only.
    tls: Vec<(Option<UpstreamCa>, Client<connector::TlsConnector, Body>)>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream").finish_non_exhaustive()
    }
}

/// A connector with `TCP_NODELAY` and a connect timeout.
fn tcp(connect_timeout: Duration) -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    connector
}

/// A pooled client over TLS, trusting `ca` besides the system's roots.
fn tls_client(
    connect_timeout: Duration,
    ca: Option<&UpstreamCa>,
) -> Client<connector::TlsConnector, Body> {
    let extra = ca.map_or(&[][..], |ca| &ca.certs);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE)
        .build(connector::https(connect_timeout, extra))
}

/// How long an idle pooled connection is kept.
const POOL_IDLE: Duration = Duration::from_secs(60);

impl Upstream {
    /// Clients with connection pooling, `TCP_NODELAY` and a connect
    /// timeout (for `https://`, TCP and the TLS handshake together), and an
    /// HTTPS client for each of `https` (the `upstream_ca` of each route
    /// with an `https://` upstream; `None` for the system's roots alone).
    /// Keep `connect_timeout` below every route's `upstream_timeout`, so an
    /// upstream that cannot be reached (or whose certificate is refused) is
    /// reported as "not sent" (key released) rather than as an unknown
    /// outcome.
    pub fn new<'a>(
        connect_timeout: Duration,
        https: impl IntoIterator<Item = Option<&'a UpstreamCa>>,
    ) -> Self {
        let empty = Self {
            connect_timeout,
            cleartext: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(POOL_IDLE)
                .build(tcp(connect_timeout)),
            tls: Vec::new(),
        };
        empty.reconfigured(connect_timeout, https)
    }

    /// The clients for reloaded routes, as [`Upstream::new`] makes them,
    /// keeping this one's pooled connections wherever the settings are
    /// the same (the connect timeout, and each `upstream_ca`'s roots).
    /// Clients for roots the new routes no longer name are kept as well: a
    /// request still working under the previous routes finds its own.
    pub fn reconfigured<'a>(
        &self,
        connect_timeout: Duration,
        https: impl IntoIterator<Item = Option<&'a UpstreamCa>>,
    ) -> Self {
        let same = connect_timeout == self.connect_timeout;
        let mut next = Self {
            connect_timeout,
            cleartext: if same {
                self.cleartext.clone()
            } else {
                Self::new(connect_timeout, []).cleartext
            },
            tls: Vec::new(),
        };
        let path = |ca: &Option<UpstreamCa>| ca.as_ref().map(|ca| ca.path.clone());
        let wanted = https.into_iter().map(Option::<&UpstreamCa>::cloned);
        let previous = self.tls.iter().map(|(ca, _)| ca.clone());
        for ca in wanted.chain(previous) {
            if next.tls.iter().any(|(known, _)| path(known) == path(&ca)) {
                continue;
            }
            let kept = self.tls.iter().find(|(known, _)| same && *known == ca);
            let client = kept.map_or_else(
                || tls_client(connect_timeout, ca.as_ref()),
                |(_, client)| client.clone(),
            );
            next.tls.push((ca, client));
        }
        next
    }

    /// Send a prepared request (over TLS if its URI is `https://`, trusting
    /// `ca` besides the system's roots); distinguishes "never sent" from
    /// "failed after sending". A failed TLS handshake (an unknown CA, a
    /// name the certificate does not cover) is "never sent".
    pub async fn send(
        &self,
        ca: Option<&UpstreamCa>,
        request: Request<Body>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let sent = if request.uri().scheme_str() == Some("https") {
            let path = ca.map(|ca| ca.path.as_path());
            let (_, client) = self
                .tls
                .iter()
                .find(|(known, _)| known.as_ref().map(|ca| ca.path.as_path()) == path)
                .ok_or_else(|| UpstreamError::NotSent("no TLS client for this route".into()))?;
            client.request(request).await
        } else {
            self.cleartext.request(request).await
        };
        sent.map_err(|e| {
            let detail = error_chain(&e);
            if e.is_connect() {
                UpstreamError::NotSent(detail)
            } else {
                UpstreamError::Failed(detail)
            }
        })
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Rewrite a client request for `upstream` (`http://host:port[/prefix]`):
/// the upstream URI, HTTP/1.1, hop-by-hop headers removed, `Host` set by the
/// client to the upstream's authority, and `X-Forwarded-For/-Proto/-Host`
/// (`-Proto` is `https` for a request marked [`ClientOverTls`]).
/// Every other header — the idempotency key included — passes through.
///
/// A body of unknown length is sent chunked whatever the method: hyper would
/// otherwise send a `GET` with no body at all.
pub fn prepare<B: hyper::body::Body>(
    mut request: Request<B>,
    upstream: &Uri,
    client: SocketAddr,
    end_to_end: impl Fn(&HeaderName) -> bool,
) -> Request<B> {
    let proto = if request.extensions().get::<ClientOverTls>().is_some() {
        "https"
    } else {
        "http"
    };
    let body = request.body();
    let streamed = !body.is_end_stream() && body.size_hint().exact().is_none();
    let original_host = request.headers().get(header::HOST).cloned().or_else(|| {
        request
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    *request.uri_mut() = upstream_uri(upstream, request.uri());
    *request.version_mut() = Version::HTTP_11;
    let headers = request.headers_mut();
    strip_hop_by_hop_except(headers, end_to_end);
    headers.remove(header::HOST);
    if streamed && !headers.contains_key(header::CONTENT_LENGTH) {
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
    }
    let ip = client.ip().to_string();
    // Every X-Forwarded-For line so far, in order, then this hop's client.
    let mut forwarded_for: Vec<&str> = headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    forwarded_for.push(&ip);
    let forwarded_for = forwarded_for.join(", ");
    if let Ok(v) = HeaderValue::from_str(&forwarded_for) {
        headers.insert(X_FORWARDED_FOR, v);
    }
    if !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    }
    if let Some(host) = original_host
        && !headers.contains_key(&X_FORWARDED_HOST)
    {
        headers.insert(X_FORWARDED_HOST, host);
    }
    request
}

fn upstream_uri(upstream: &Uri, original: &Uri) -> Uri {
    let base = upstream.path().trim_end_matches('/');
    let pq = original.path_and_query().map_or("/", PathAndQuery::as_str);
    let mut parts = upstream.clone().into_parts();
    parts.path_and_query = format!("{base}{pq}").parse().ok();
    Uri::from_parts(parts).unwrap_or_else(|_| upstream.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, X-Secret-Hop"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("idempotency-key", HeaderValue::from_static("k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("idempotency-key"));
    }

    #[test]
    fn prepare_rewrites_uri_and_forwarding_headers() {
        let upstream: Uri = "http://10.0.0.1:9000/base/".parse().unwrap();
        let req = Request::builder()
            .uri("/v1/pay?x=1")
            .header("host", "api.example.com")
            .header("x-forwarded-for", "1.2.3.4")
            .header("x-forwarded-for", "5.6.7.8")
            .header("idempotency-key", "\"k\"")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let out = prepare(req, &upstream, "127.0.0.9:5000".parse().unwrap(), |_| false);
        assert_eq!(out.uri(), "http://10.0.0.1:9000/base/v1/pay?x=1");
        let h = out.headers();
        assert_eq!(h["x-forwarded-for"], "1.2.3.4, 5.6.7.8, 127.0.0.9");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "api.example.com");
        assert_eq!(h["idempotency-key"], "\"k\"");
        assert!(!h.contains_key("host"));
    }
}
