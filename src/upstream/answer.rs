//! An upstream's answer made fit for whoever gets it next: the client (no
//! hop-by-hop headers, the client connection's own HTTP version) and the
//! record (minus the route's `replay_headers` deny list). The forward, the
//! pass-through and the status inquiry all answer through these, and the
//! attempt's token travels in one header, [`IDEMPOTENCY_ATTEMPT`].

use http::{HeaderMap, HeaderName};

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

/// The headers worth recording: the response's (already without hop-by-hop
/// headers), minus the route's `replay_headers` deny list.
pub fn replayable(headers: &HeaderMap, deny: &[HeaderName]) -> HeaderMap {
    let mut kept = headers.clone();
    for name in deny {
        kept.remove(name);
    }
    kept
}
