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
        let key = utf8_percent_encode(key, COMPONENT).to_string();
        self.url
            .replace("{key}", &key)
            .replace("{scope}", &hex::encode(scope))
            .parse()
    }
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
}
