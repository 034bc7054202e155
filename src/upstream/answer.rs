//! An upstream's answer made fit for whoever gets it next: the client (no
//! hop-by-hop headers, the client connection's own HTTP version) and the
//! record (minus the route's `replay_headers` deny list, plus the instant
//! it is kept until, [`IDEMPOTENCY_EXPIRES`]). The forward, the
//! pass-through and the status inquiry all answer through these, and the
//! attempt's token travels in one header, [`IDEMPOTENCY_ATTEMPT`].

use std::time::SystemTime;

use http::{HeaderMap, HeaderName, HeaderValue};

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

/// The headers worth recording: the response's (already without hop-by-hop
/// headers), minus the route's `replay_headers` deny list, and with
/// `expires` announced when the route announces it.
pub fn replayable(
    headers: &HeaderMap,
    deny: &[HeaderName],
    expires: Option<SystemTime>,
) -> HeaderMap {
    let mut kept = headers.clone();
    for name in deny {
        kept.remove(name);
    }
    if let Some(until) = expires {
        announce_expiry(&mut kept, until);
    }
    kept
}

/// Say that the record is kept until `until`: an HTTP-date, whose whole
/// seconds round down, so it never promises a moment the store may not
/// reach. It replaces any the upstream sent: the gateway keeps the record.
pub fn announce_expiry(headers: &mut HeaderMap, until: SystemTime) {
    let date = httpdate::fmt_http_date(until);
    if let Ok(value) = HeaderValue::from_str(&date) {
        headers.insert(IDEMPOTENCY_EXPIRES, value);
    }
}
