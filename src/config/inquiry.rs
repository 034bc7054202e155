//! A route's status inquiry (`[routes.inquiry]`, docs/src/guide/status-inquiry.md):
//! where and how often to ask the upstream what happened to an attempt
//! whose outcome is unknown, and the question's URL for one key.

use std::time::Duration;

use http::{HeaderName, HeaderValue, Uri};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Everything but RFC 3986's unreserved characters is encoded, so a key
/// can never add a path segment, a query or a fragment to the URL.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A route's validated `[routes.inquiry]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inquiry {
    /// The URL, with `{key}` and perhaps `{scope}` still in it.
    pub url: String,
    /// How long after the attempt ended (or its lease lapsed) the first
    /// question is asked.
    pub after: Duration,
    /// How often to ask again while the answer settles nothing.
    pub every: Duration,
    /// When to stop asking and hold the key, counted from when its outcome
    /// became unknown.
    pub give_up_after: Duration,
    /// Static headers sent with every question (e.g. `Authorization`).
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Inquiry {
    /// The question's URL for `key` under the scope digest `scope`: `{key}`
    /// percent-encoded, `{scope}` the hex SHA-256 of the scope (idemgate
    /// never keeps the scope's value itself), empty when unscoped.
    pub fn url_for(&self, key: &str, scope: &[u8]) -> Result<Uri, http::uri::InvalidUri> {
        self.url
            .replace("{key}", &encode_key(key))
            .replace("{scope}", &hex::encode(scope))
            .parse()
    }
}

impl Inquiry {
    /// Whether `key` cannot be asked about: where `{key}` is in the URL's
    /// path, a key that is, or has between its `/` or `\`, a `.` or `..`
    /// segment. Encoded or not, it is a dot-segment to a normaliser that
    /// decodes before it resolves dots (RFC 3986 §6.2.2.2 decodes `%2E`;
    /// some proxies decode `%2F` too), and would reach another resource.
    pub fn refuses_key(&self, key: &str) -> bool {
        let path = self.url.split('?').next().unwrap_or_default();
        path.contains("{key}") && key.split(['/', '\\']).any(|s| s == "." || s == "..")
    }
}

/// `key` as one path segment or query value: every character but RFC
/// 3986's unreserved ones percent-encoded, and the keys `.` and `..`
/// (dot-segments, which a path normaliser would resolve to this or the
/// parent resource) with their dots encoded too, so a key can neither add
/// nor remove a segment.
fn encode_key(key: &str) -> String {
    if key == "." || key == ".." {
        return "%2E".repeat(key.len());
    }
    utf8_percent_encode(key, COMPONENT).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inquiry(url: &str) -> Inquiry {
        Inquiry {
            url: url.into(),
            after: Duration::ZERO,
            every: Duration::from_secs(1),
            give_up_after: Duration::from_secs(60),
            headers: Vec::new(),
        }
    }

    #[test]
    fn a_key_stays_inside_its_path_segment() {
        let q = inquiry("http://up:9000/v1/idempotency/{key}?scope={scope}");
        let url = q.url_for("a/b?c=d#e f%", &[0xab, 0x01]).unwrap();
        assert_eq!(
            url.to_string(),
            "http://up:9000/v1/idempotency/a%2Fb%3Fc%3Dd%23e%20f%25?scope=ab01"
        );
        let plain = q.url_for("order-1_2.3~", &[]).unwrap();
        assert_eq!(
            plain.to_string(),
            "http://up:9000/v1/idempotency/order-1_2.3~?scope="
        );
    }

    /// The book's test vector (docs/src/guide/status-inquiry.md): the
    /// scope `tenant-a` from one header, as `{scope}` sends it.
    #[test]
    fn the_scope_is_sent_as_the_books_digest() {
        let digest = idemgate_core::scope_digest([&b"tenant-a"[..]]);
        let q = inquiry("http://up/k/{key}?scope={scope}");
        assert_eq!(
            q.url_for("k1", &digest).unwrap().query(),
            Some("scope=aa5ec1d6e76e78a1ed2b0f4e2adfa3e07e82bd2f8ca1a20abb1db27d6fb0ecd0")
        );
    }

    #[test]
    fn dot_segment_keys_are_refused_only_in_the_path() {
        let path = inquiry("http://up/v1/idempotency/{key}?s={scope}");
        let query = inquiry("http://up/v1/idempotency?key={key}");
        for key in [".", ".."] {
            assert!(path.refuses_key(key) && !query.refuses_key(key), "{key}");
        }
        assert!(!path.refuses_key("...") && !path.refuses_key(".a"));
        for key in ["a/../b", "../x", "a/.", "a\\..\\b"] {
            assert!(path.refuses_key(key) && !query.refuses_key(key), "{key}");
        }
        assert!(!path.refuses_key("a/b") && !path.refuses_key("a/..b"));
    }

    #[test]
    fn dot_segment_keys_are_encoded() {
        let q = inquiry("http://up:9000/v1/idempotency/{key}");
        for (key, sent) in [(".", "%2E"), ("..", "%2E%2E"), ("...", "..."), (".a", ".a")] {
            let url = q.url_for(key, &[]).unwrap();
            assert_eq!(url.path(), format!("/v1/idempotency/{sent}"), "{key}");
        }
    }

    #[test]
    fn quoted_and_composite_keys_are_asked_by_the_value_kept() {
        let q = inquiry("http://up:9000/k/{key}");
        // `Idempotency-Key: "t-1"` is kept (and asked) as `t-1`.
        assert_eq!(q.url_for("t-1", &[]).unwrap().path(), "/k/t-1");
        // Two key parts: their RFC 8941 list, `"saga-7", "3"`.
        assert_eq!(
            q.url_for("\"saga-7\", \"3\"", &[]).unwrap().path(),
            "/k/%22saga-7%22%2C%20%223%22"
        );
    }
}
