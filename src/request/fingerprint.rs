//! The request fingerprint (docs/src/design/pipeline.md, step 4): a SHA-256 over the parts of
//! a request the route says identify it. A key that comes back with a
//! different fingerprint is a different request under the same key: `422`.
//!
//! Each part is framed (tag + length) before hashing, so no two different
//! requests can hash the same bytes by shifting data between parts.

use http::request::Parts;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::request::json_body::JsonBody;

/// How the body enters the fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyMode {
    /// The exact bytes.
    Raw,
    /// Canonical JSON: object keys sorted, insignificant whitespace removed,
    /// `exclude` pointers removed. A body that is not JSON is hashed raw.
    Json,
    /// The body is not part of the fingerprint.
    Ignore,
}

/// What a route's fingerprint covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FingerprintSpec {
    /// The method.
    pub method: bool,
    /// The path.
    pub path: bool,
    /// The query string.
    pub query: bool,
    /// These request headers (all values, in order).
    pub headers: Vec<http::HeaderName>,
    /// The body, and how.
    pub body: BodyMode,
    /// JSON pointers removed before hashing (`body = "json"` only).
    pub exclude: Vec<String>,
}

pub use idemgate_core::Fingerprint;

/// Computes a fingerprint while the body streams in.
pub struct Fingerprinter<'a> {
    spec: &'a FingerprintSpec,
    hasher: Sha256,
}

impl std::fmt::Debug for Fingerprinter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fingerprinter").finish_non_exhaustive()
    }
}

impl<'a> Fingerprinter<'a> {
    /// Start a fingerprint with the request head.
    pub fn new(spec: &'a FingerprintSpec, parts: &Parts) -> Self {
        let mut f = Self {
            spec,
            hasher: Sha256::new(),
        };
        if spec.method {
            f.part(b'M', parts.method.as_str().as_bytes());
        }
        if spec.path {
            f.part(b'P', parts.uri.path().as_bytes());
        }
        if spec.query {
            f.part(b'Q', parts.uri.query().unwrap_or("").as_bytes());
        }
        for name in &spec.headers {
            f.part(b'H', name.as_str().as_bytes());
            for value in parts.headers.get_all(name) {
                f.part(b'V', value.as_bytes());
            }
        }
        if spec.body == BodyMode::Raw {
            f.hasher.update([b'B']);
        }
        f
    }

    fn part(&mut self, tag: u8, bytes: &[u8]) {
        self.hasher.update([tag]);
        self.hasher.update((bytes.len() as u64).to_be_bytes());
        self.hasher.update(bytes);
    }

    /// Feed a body chunk (only the raw mode hashes as it streams).
    pub fn update(&mut self, chunk: &[u8]) {
        if self.spec.body == BodyMode::Raw {
            self.hasher.update(chunk);
        }
    }

    /// Finish with the whole body and, in the JSON mode, the body as parsed
    /// once for the whole request (`None`: not JSON, hashed raw).
    pub fn finish(mut self, body: &[u8], json: Option<JsonBody<'_>>) -> Fingerprint {
        if self.spec.body == BodyMode::Json {
            match json {
                Some(mut json) => {
                    for pointer in &self.spec.exclude {
                        json.remove(pointer);
                    }
                    self.part(b'J', &json.canonical());
                }
                None => self.part(b'B', body),
            }
        }
        self.hasher.finalize().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(body: BodyMode, exclude: &[&str]) -> FingerprintSpec {
        FingerprintSpec {
            method: true,
            path: true,
            query: true,
            headers: vec![http::header::CONTENT_TYPE],
            body,
            exclude: exclude.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn fp(spec: &FingerprintSpec, method: &str, uri: &str, ct: &str, body: &[u8]) -> Fingerprint {
        let (parts, ()) = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", ct)
            .body(())
            .unwrap()
            .into_parts();
        let mut f = Fingerprinter::new(spec, &parts);
        for chunk in body.chunks(3) {
            f.update(chunk);
        }
        f.finish(body, JsonBody::parse(body))
    }

    #[test]
    fn raw_mode_covers_every_part() {
        let s = spec(BodyMode::Raw, &[]);
        let base = fp(&s, "POST", "/a?x=1", "json", b"{}");
        assert_eq!(base, fp(&s, "POST", "/a?x=1", "json", b"{}"));
        assert_ne!(base, fp(&s, "PATCH", "/a?x=1", "json", b"{}"));
        assert_ne!(base, fp(&s, "POST", "/b?x=1", "json", b"{}"));
        assert_ne!(base, fp(&s, "POST", "/a?x=2", "json", b"{}"));
        assert_ne!(base, fp(&s, "POST", "/a?x=1", "text", b"{}"));
        assert_ne!(base, fp(&s, "POST", "/a?x=1", "json", b"{ }"));
    }

    #[test]
    fn parts_are_framed() {
        let s = spec(BodyMode::Raw, &[]);
        assert_ne!(
            fp(&s, "POST", "/a?", "j", b"son"),
            fp(&s, "POST", "/a?", "js", b"on")
        );
    }

    #[test]
    fn json_mode_is_canonical_and_honours_exclusions() {
        let s = spec(BodyMode::Json, &["/meta/ts"]);
        let a = fp(
            &s,
            "POST",
            "/a",
            "j",
            br#"{"b":1,"a":[1,2],"meta":{"ts":1}}"#,
        );
        let b = fp(
            &s,
            "POST",
            "/a",
            "j",
            br#"{ "a": [1, 2], "meta": {"ts": 99}, "b": 1 }"#,
        );
        assert_eq!(a, b);
        let c = fp(&s, "POST", "/a", "j", br#"{"a":[2,1],"b":1}"#);
        assert_ne!(a, c);
        // Numbers are kept as sent, not rounded through f64.
        let precise = fp(&s, "POST", "/a", "j", br#"{"amount":0.10000000000000001}"#);
        assert_ne!(precise, fp(&s, "POST", "/a", "j", br#"{"amount":0.1}"#));
        let big = fp(&s, "POST", "/a", "j", br#"{"n":18446744073709551617}"#);
        assert_ne!(
            big,
            fp(&s, "POST", "/a", "j", br#"{"n":18446744073709551616}"#)
        );
        // Not JSON: falls back to the raw bytes.
        assert_ne!(
            fp(&s, "POST", "/a", "j", b"x y"),
            fp(&s, "POST", "/a", "j", b"x  y")
        );
    }

    /// Fuzz crash (fuzz/fuzz_targets/fingerprint.rs, "same JSON value,
    /// different fingerprint"): with serde_json's `arbitrary_precision`, an
    /// object whose first key was `$serde_json::private::Number` was read as
    /// a number, so the same object with its keys in another order stopped
    /// parsing and was hashed raw.
    #[test]
    fn json_mode_key_order_with_the_serde_json_number_token() {
        let s = spec(BodyMode::Json, &[]);
        assert_eq!(
            fp(
                &s,
                "POST",
                "/a",
                "j",
                br#"{"":1,"$serde_json::private::Number":"1"}"#
            ),
            fp(
                &s,
                "POST",
                "/a",
                "j",
                br#"{"$serde_json::private::Number":"1","":1}"#
            )
        );
    }

    #[test]
    fn ignore_mode_skips_the_body() {
        let s = spec(BodyMode::Ignore, &[]);
        assert_eq!(
            fp(&s, "POST", "/a", "j", b"1"),
            fp(&s, "POST", "/a", "j", b"2")
        );
    }
}
