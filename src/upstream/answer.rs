//! An upstream's answer made fit for whoever gets it next: the client (no
//! hop-by-hop headers, the client connection's own HTTP version) and the
//! record ([`recorded`]: minus the route's `replay_headers` deny list,
//! plus the instant it is kept until, [`IDEMPOTENCY_EXPIRES`], the body only
//! where the route records it). The forward, the
//! pass-through and the status inquiry all answer through these, and the
//! attempt's token travels in one header, [`IDEMPOTENCY_ATTEMPT`].

use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};

use crate::config::Route;
use crate::store::StoredResponse;
use crate::store::seal::SEALED_HEADER;

use super::strip_hop_by_hop;

/// The header that carries an attempt's fencing token upstream
/// (`forward_attempt = true`), and a status question's fence.
pub const IDEMPOTENCY_ATTEMPT: HeaderName = HeaderName::from_static("idempotency-attempt");

/// Make an upstream response head fit for the client: no hop-by-hop
/// headers, and the version left to the client's own connection (an
/// HTTP/1.0 upstream must not turn the answer into HTTP/1.0).
pub fn to_client(parts: &mut http::response::Parts) {
    strip_hop_by_hop(&mut parts.headers);
    parts.version = http::Version::default();
}

/// The header that tells the client until when its key's record is kept
/// (an HTTP-date): on the answer that created the record and on every
/// replay of it (docs/src/guide/clients.md).
pub const IDEMPOTENCY_EXPIRES: HeaderName = HeaderName::from_static("idempotency-expires");

/// What a route records of an answer: its status, its headers minus the
/// route's `replay_headers` deny list and the seal's mark, with `expires` announced, and its
/// body, unless the route records none (`record_body = false`: then
/// neither the body nor the headers that describe one, [`DESCRIBE_BODY`]).
pub fn recorded(
    status: StatusCode,
    headers: &HeaderMap,
    body: Bytes,
    route: &Route,
    expires: Option<SystemTime>,
) -> StoredResponse {
    let mut kept = headers.clone();
    for name in &route.replay_headers_deny {
        kept.remove(name);
    }
    // The seal's own mark: an upstream's would make its record unreadable.
    kept.remove(SEALED_HEADER);
    if let Some(until) = expires {
        announce_expiry(&mut kept, until);
    }
    if route.record_body {
        return StoredResponse {
            status,
            headers: kept,
            body,
        };
    }
    for name in DESCRIBE_BODY {
        kept.remove(name);
    }
    StoredResponse {
        status,
        headers: kept,
        body: Bytes::new(),
    }
}

/// The headers that describe a body, not recorded without it: an empty
/// replay must not claim a length, an encoding, a type or a digest.
const DESCRIBE_BODY: [HeaderName; 10] = [
    header::CONTENT_LENGTH,
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_RANGE,
    header::CONTENT_LANGUAGE,
    header::CONTENT_DISPOSITION,
    HeaderName::from_static("content-digest"),
    HeaderName::from_static("repr-digest"),
    HeaderName::from_static("digest"),
    HeaderName::from_static("content-md5"),
];

/// Say that the record is kept until `until`: an HTTP-date, whose whole
/// seconds round down, so it never promises a moment the store may not
/// reach. It replaces any the upstream sent: the gateway keeps the record.
pub fn announce_expiry(headers: &mut HeaderMap, until: SystemTime) {
    let date = httpdate::fmt_http_date(until);
    if let Ok(value) = HeaderValue::from_str(&date) {
        headers.insert(IDEMPOTENCY_EXPIRES, value);
    }
}
