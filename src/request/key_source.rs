//! Where a route's idempotency key and scope come from (docs/src/guide/webhooks.md):
//! `key_from` and `scope_from`, lists of parts `header:NAME`, `query:NAME`
//! and `json:/pointer`, so that a webhook's delivery id, a broker's message
//! id inside the JSON body, or a saga id plus a step can be the key; and,
//! for the scope only, `cert:subject`, `cert:san-uri` and `cert:san-dns`,
//! the verified client certificate's identity ([`super::client_cert`]).
//!
//! - A key part gives exactly one value: a header or query parameter that
//!   appears twice, a JSON value that is not a string or an integer, or a
//!   body that is not JSON make the key invalid (`400`); an absent one makes
//!   it missing. Each value obeys the key rules ([`super::key`]): 1 to
//!   255 printable ASCII characters (a header part is read like
//!   `Idempotency-Key`: bare or as an sf-string).
//! - One part: the key is its value, so `key_from = ["header:Idempotency-Key"]`
//!   and `key_header = "Idempotency-Key"` name the same records. Several
//!   parts: the key is their values as an RFC 8941 list of strings
//!   (`"saga-7", "3"`), so `("a:b", "c")` and `("a", "b:c")` never meet.
//! - A scope part gives all its values (none when absent); the scope is the
//!   SHA-256 of one part's values as [`scope_digest`] takes them (the
//!   same digest `scope_header` gave), or of each part's digest in turn.
//!   A `cert:` part is the exception: no value (no verified certificate,
//!   or none of its names of that kind) is an invalid part (`400`), never
//!   the anonymous scope, which every such caller would share.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use http::{HeaderName, HeaderValue};
use idemgate_core::scope_digest;

use crate::request::client_cert::ClientIdentity;
use crate::request::json_body::JsonBody;
use crate::request::key::{self as key, KeyError};

/// Most parts in one `key_from` or `scope_from`.
pub const MAX_PARTS: usize = 8;

/// One place in a request that a key or scope is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// `header:NAME`.
    Header(HeaderName),
    /// `query:NAME`: a query parameter, percent-decoded.
    Query(String),
    /// `json:/pointer`: an RFC 6901 pointer into a JSON body.
    Json(String),
    /// `cert:…`: the verified client certificate's identity (scope only).
    Cert(CertPart),
}

/// What a `cert:` part reads from the client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertPart {
    /// `cert:subject`: the subject DN, RFC 4514.
    Subject,
    /// `cert:san-uri`: every URI subject alternative name.
    SanUri,
    /// `cert:san-dns`: every DNS subject alternative name.
    SanDns,
}

impl CertPart {
    const ALL: [(&'static str, CertPart); 3] = [
        ("subject", CertPart::Subject),
        ("san-uri", CertPart::SanUri),
        ("san-dns", CertPart::SanDns),
    ];

    fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, p)| *p == self)
            .map_or("", |(name, _)| name)
    }

    /// Its values in `identity` (`Err`: none, and why).
    fn values(self, identity: Option<&ClientIdentity>) -> Result<Vec<&str>, KeyError> {
        let identity = identity.ok_or(KeyError::NoCertValue(
            "the connection presented no client certificate",
        ))?;
        let (values, none): (Vec<&str>, _) = match self {
            Self::Subject => (
                Some(identity.subject.as_str())
                    .filter(|s| !s.is_empty())
                    .into_iter()
                    .collect(),
                "the client certificate's subject is empty",
            ),
            Self::SanUri => (
                identity.san_uri.iter().map(String::as_str).collect(),
                "the client certificate has no URI subject alternative name",
            ),
            Self::SanDns => (
                identity.san_dns.iter().map(String::as_str).collect(),
                "the client certificate has no DNS subject alternative name",
            ),
        };
        if values.is_empty() {
            return Err(KeyError::NoCertValue(none));
        }
        Ok(values)
    }
}

impl KeyPart {
    /// Parse `header:NAME`, `query:NAME`, `json:/pointer` or `cert:WHAT`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (kind, rest) = text.split_once(':').ok_or_else(|| {
            format!("`{text}` is not `header:NAME`, `query:NAME` or `json:/pointer`")
        })?;
        match kind {
            "header" => HeaderName::from_bytes(rest.as_bytes())
                .map(Self::Header)
                .map_err(|_| format!("`{rest}` in `{text}` is not a header name")),
            "query" if !rest.is_empty() => Ok(Self::Query(rest.to_string())),
            "query" => Err(format!("`{text}` names no query parameter")),
            "json" if rest.starts_with('/') || rest.is_empty() => {
                if has_bad_escape(rest) {
                    return Err(format!(
                        "`{rest}` in `{text}` has a `~` that is not `~0` or `~1` (RFC 6901)"
                    ));
                }
                Ok(Self::Json(rest.to_string()))
            }
            "json" => Err(format!(
                "`{rest}` in `{text}` is not a JSON pointer (RFC 6901: empty or starting with `/`)"
            )),
            "cert" => CertPart::ALL
                .iter()
                .find(|(name, _)| *name == rest)
                .map(|(_, part)| Self::Cert(*part))
                .ok_or_else(|| {
                    format!(
                        "`{text}` is not a certificate part (cert:subject, cert:san-uri or cert:san-dns)"
                    )
                }),
            _ => Err(format!(
                "`{kind}:` in `{text}` is not a part kind (header:, query:, json: or cert:)"
            )),
        }
    }

    /// Whether the part is read from the body (the body must be read first).
    pub fn reads_body(&self) -> bool {
        matches!(self, Self::Json(_))
    }

    /// Whether the part is read from the client certificate (scope only).
    pub fn reads_cert(&self) -> bool {
        matches!(self, Self::Cert(_))
    }

    /// The header, for a `header:` part.
    pub fn header(&self) -> Option<&HeaderName> {
        match self {
            Self::Header(name) => Some(name),
            _ => None,
        }
    }
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header(name) => write!(f, "header:{name}"),
            Self::Query(name) => write!(f, "query:{name}"),
            Self::Json(pointer) => write!(f, "json:{pointer}"),
            Self::Cert(part) => write!(f, "cert:{}", part.name()),
        }
    }
}

fn has_bad_escape(pointer: &str) -> bool {
    let bytes = pointer.as_bytes();
    bytes
        .iter()
        .enumerate()
        .any(|(i, b)| *b == b'~' && !matches!(bytes.get(i + 1), Some(b'0' | b'1')))
}

/// A part that gave no usable value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{part}: {reason}")]
pub struct PartError {
    /// The part.
    pub part: KeyPart,
    /// What was wrong with its value.
    pub reason: KeyError,
}

/// What the key parts found in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The key.
    Key(String),
    /// This part is absent.
    Missing(KeyPart),
}

/// The request's key. `json` is the parsed body (`None`: the body is not
/// JSON, or was not read because no part needs it).
pub fn key(parts: &[KeyPart], head: &Parts, json: Option<&JsonBody>) -> Result<Found, PartError> {
    let mut values = Vec::with_capacity(parts.len());
    for part in parts {
        let invalid = |reason| PartError {
            part: part.clone(),
            reason,
        };
        let value = match part {
            KeyPart::Header(name) => {
                let mut found = head.headers.get_all(name).iter();
                match (found.next(), found.next()) {
                    (None, _) => None,
                    (Some(_), Some(_)) => return Err(invalid(KeyError::Repeated)),
                    (Some(value), None) => Some(key::parse(value).map_err(invalid)?),
                }
            }
            KeyPart::Query(name) => {
                let mut found = query_values(head, name);
                match (found.next(), found.next()) {
                    (None, _) => None,
                    (Some(_), Some(_)) => return Err(invalid(KeyError::Repeated)),
                    (Some(value), None) => Some(key::plain(&value).map_err(invalid)?),
                }
            }
            KeyPart::Json(pointer) => match json_text(part, pointer, json)? {
                None => None,
                Some(text) => Some(key::plain(text).map_err(invalid)?),
            },
            // Never a key part (the configuration refuses it there).
            KeyPart::Cert(_) => None,
        };
        match value {
            Some(value) => values.push(value),
            None => return Ok(Found::Missing(part.clone())),
        }
    }
    Ok(Found::Key(composite(values)))
}

/// The request's scope digest (empty when the route has no scope parts).
/// A `cert:` part reads the `Arc<ClientIdentity>` among `head`'s
/// extensions (the server puts it there, `src/server/tls.rs`).
pub fn scope(
    parts: &[KeyPart],
    head: &Parts,
    json: Option<&JsonBody>,
) -> Result<Vec<u8>, PartError> {
    let mut per_part = Vec::with_capacity(parts.len());
    for part in parts {
        let values: Vec<Vec<u8>> = match part {
            KeyPart::Header(name) => head
                .headers
                .get_all(name)
                .iter()
                .map(|v| v.as_bytes().to_vec())
                .collect(),
            KeyPart::Query(name) => query_values(head, name).map(String::into_bytes).collect(),
            KeyPart::Json(pointer) => json_text(part, pointer, json)?
                .map(|text| text.as_bytes().to_vec())
                .into_iter()
                .collect(),
            KeyPart::Cert(what) => what
                .values(head.extensions.get::<Arc<ClientIdentity>>().map(|i| &**i))
                .map_err(|reason| PartError {
                    part: part.clone(),
                    reason,
                })?
                .into_iter()
                .map(|v| scoped_value(part, v.as_bytes()))
                .collect(),
        };
        per_part.push(values);
    }
    Ok(scope_of(per_part))
}

/// The string or integer at `pointer` (`None`: absent).
fn json_text<'j>(
    part: &KeyPart,
    pointer: &str,
    json: Option<&'j JsonBody<'_>>,
) -> Result<Option<&'j str>, PartError> {
    let invalid = |reason| PartError {
        part: part.clone(),
        reason,
    };
    let json = json.ok_or_else(|| invalid(KeyError::NotJson))?;
    match json.pointer(pointer) {
        None => Ok(None),
        Some(node) => node
            .as_key_text()
            .map(Some)
            .ok_or_else(|| invalid(KeyError::NotKeyValue(node.kind()))),
    }
}

/// The scope digest of each part's values.
fn scope_of(per_part: Vec<Vec<Vec<u8>>>) -> Vec<u8> {
    match per_part.as_slice() {
        [] => Vec::new(),
        [values] => scope_digest(values.iter().map(Vec::as_slice)),
        _ => {
            let digests: Vec<Vec<u8>> = per_part
                .iter()
                .map(|values| scope_digest(values.iter().map(Vec::as_slice)))
                .collect();
            scope_digest(digests.iter().map(Vec::as_slice))
        }
    }
}

fn query_values<'a>(head: &'a Parts, name: &'a str) -> impl Iterator<Item = String> + 'a {
    url::form_urlencoded::parse(head.uri.query().unwrap_or("").as_bytes())
        .filter(move |(n, _)| n == name)
        .map(|(_, v)| v.into_owned())
}

/// One value: itself; several: an RFC 8941 list of strings.
fn composite(mut values: Vec<String>) -> String {
    if values.len() == 1 {
        return values.pop().expect("one value");
    }
    let mut out = String::new();
    for (i, value) in values.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('"');
        for c in value.chars() {
            if matches!(c, '"' | '\\') {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
    }
    out
}

/// The key an operator names with one value per part (`idemgate keys
/// … --part`), checked as the gateway checks a request's.
pub fn key_of_values(parts: &[KeyPart], values: &[String]) -> Result<String, KeyOfValuesError> {
    if values.len() != parts.len() {
        return Err(KeyOfValuesError::Count {
            parts: parts.len(),
            given: values.len(),
        });
    }
    let mut checked = Vec::with_capacity(values.len());
    for (part, value) in parts.iter().zip(values) {
        let valid = match part {
            KeyPart::Header(_) => HeaderValue::from_str(value)
                .map_err(|_| KeyError::BadCharacter)
                .and_then(|v| key::parse(&v)),
            KeyPart::Query(_) | KeyPart::Json(_) | KeyPart::Cert(_) => key::plain(value),
        };
        checked.push(valid.map_err(|reason| {
            KeyOfValuesError::Part(PartError {
                part: part.clone(),
                reason,
            })
        })?);
    }
    Ok(composite(checked))
}

/// The scope an operator names with one value per part; no values: the
/// anonymous scope (every part absent).
pub fn scope_of_values(parts: &[KeyPart], values: &[String]) -> Result<Vec<u8>, KeyOfValuesError> {
    if values.is_empty() {
        return Ok(scope_of(parts.iter().map(|_| Vec::new()).collect()));
    }
    if values.len() != parts.len() {
        return Err(KeyOfValuesError::Count {
            parts: parts.len(),
            given: values.len(),
        });
    }
    Ok(scope_of(
        parts
            .iter()
            .zip(values)
            .map(|(part, v)| vec![scoped_value(part, v.as_bytes())])
            .collect(),
    ))
}

/// A value as its part enters it into the scope digest: a `cert:` part's
/// behind its part's name and a NUL, which no header value holds, so a
/// certificate's identity never has the digest a header with the same text
/// had (a route moved from a header an mTLS proxy set to `cert:` starts
/// afresh rather than sharing that header's records); every other part's
/// as it is (a header's digest stays `scope_header`'s).
fn scoped_value(part: &KeyPart, value: &[u8]) -> Vec<u8> {
    match part {
        KeyPart::Cert(_) => {
            let name = part.to_string();
            let mut tagged = Vec::with_capacity(name.len() + 1 + value.len());
            tagged.extend_from_slice(name.as_bytes());
            tagged.push(0);
            tagged.extend_from_slice(value);
            tagged
        }
        _ => value.to_vec(),
    }
}

/// Values an operator gave that do not name a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyOfValuesError {
    /// Not one value per part.
    #[error(
        "the route reads {parts} part(s), and {given} value(s) were given: give one per part, in order"
    )]
    Count {
        /// The route's parts.
        parts: usize,
        /// The values given.
        given: usize,
    },
    /// A value that the gateway would refuse.
    #[error("invalid value for {0}")]
    Part(PartError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(texts: &[&str]) -> Vec<KeyPart> {
        texts.iter().map(|t| KeyPart::parse(t).unwrap()).collect()
    }

    fn head(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut request = http::Request::builder().method("POST").uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn parts_parse_and_display() {
        assert_eq!(
            KeyPart::parse("header:X-GitHub-Delivery")
                .unwrap()
                .to_string(),
            "header:x-github-delivery"
        );
        assert_eq!(
            KeyPart::parse("query:id").unwrap(),
            KeyPart::Query("id".into())
        );
        assert_eq!(
            KeyPart::parse("json:/message/messageId").unwrap(),
            KeyPart::Json("/message/messageId".into())
        );
        for bad in [
            "x-key",
            "cookie:a",
            "header:bad name",
            "query:",
            "json:id",
            "json:/a~2",
            "json:/a~",
        ] {
            assert!(KeyPart::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn one_part_is_the_value_itself() {
        let h = head("/", &[("idempotency-key", "\"abc\"")]);
        let found = key(&parts(&["header:Idempotency-Key"]), &h, None).unwrap();
        assert_eq!(found, Found::Key("abc".into()));
    }

    #[test]
    fn composite_keys_never_collide_by_shifting_separators() {
        let p = parts(&["query:a", "query:b"]);
        let one = key(&p, &head("/?a=a%3Ab&b=c", &[]), None).unwrap();
        let two = key(&p, &head("/?a=a&b=b%3Ac", &[]), None).unwrap();
        assert_ne!(one, two);
        let quote = key(&p, &head("/?a=%22&b=%5C", &[]), None).unwrap();
        assert_eq!(quote, Found::Key(r#""\"", "\\""#.into()));
        assert_ne!(
            key(&p, &head("/?a=%22%2C%20%22&b=x", &[]), None).unwrap(),
            quote
        );
    }

    #[test]
    fn a_saga_key_from_a_header_and_the_body() {
        let p = parts(&["header:X-Saga-Id", "json:/step"]);
        let h = head("/", &[("x-saga-id", "saga-7")]);
        let body = JsonBody::parse(br#"{"step": 3, "name": "reserve"}"#).unwrap();
        assert_eq!(
            key(&p, &h, Some(&body)).unwrap(),
            Found::Key(r#""saga-7", "3""#.into())
        );
        assert_eq!(
            key_of_values(&p, &["saga-7".into(), "3".into()]).unwrap(),
            r#""saga-7", "3""#
        );
    }

    #[test]
    fn missing_and_invalid_parts_are_named() {
        let p = parts(&["header:X-Saga-Id", "json:/step"]);
        let body = JsonBody::parse(br#"{"step": {"n": 1}}"#).unwrap();
        let none = head("/", &[]);
        assert_eq!(
            key(&p, &none, Some(&body)).unwrap(),
            Found::Missing(p[0].clone())
        );
        let h = head("/", &[("x-saga-id", "s")]);
        let err = key(&p, &h, Some(&body)).unwrap_err();
        assert_eq!(err.part, p[1]);
        assert_eq!(err.reason, KeyError::NotKeyValue("an object"));
        assert_eq!(key(&p, &h, None).unwrap_err().reason, KeyError::NotJson);
        let empty = JsonBody::parse(b"{}").unwrap();
        assert_eq!(
            key(&p, &h, Some(&empty)).unwrap(),
            Found::Missing(p[1].clone())
        );
        let twice = head("/?id=1&id=2", &[]);
        let err = key(&parts(&["query:id"]), &twice, None).unwrap_err();
        assert_eq!(err.reason, KeyError::Repeated);
        let float = JsonBody::parse(br#"{"step": 1.5}"#).unwrap();
        let err = key(&p, &h, Some(&float)).unwrap_err();
        assert_eq!(
            err.reason,
            KeyError::NotKeyValue("a number with a fraction or exponent")
        );
    }

    #[test]
    fn one_scope_part_digests_like_scope_header_did() {
        let h = head("/", &[("authorization", "Bearer a")]);
        let digest = scope(&parts(&["header:Authorization"]), &h, None).unwrap();
        assert_eq!(digest, scope_digest([b"Bearer a".as_slice()]));
        assert_eq!(scope(&[], &h, None).unwrap(), Vec::<u8>::new());
        assert_eq!(
            scope_of_values(&parts(&["header:Authorization"]), &["Bearer a".into()]).unwrap(),
            digest
        );
    }

    #[test]
    fn several_scope_parts_are_framed() {
        let p = parts(&["query:a", "query:b"]);
        let one = scope(&p, &head("/?a=xy", &[]), None).unwrap();
        let two = scope(&p, &head("/?a=x&b=y", &[]), None).unwrap();
        assert_ne!(one, two);
        let body = JsonBody::parse(br#"{"subscription":"projects/p/subscriptions/s"}"#).unwrap();
        let sub = parts(&["json:/subscription"]);
        assert_eq!(
            scope(&sub, &head("/", &[]), Some(&body)).unwrap(),
            scope_of_values(&sub, &["projects/p/subscriptions/s".into()]).unwrap()
        );
        assert_eq!(
            scope_of_values(&p, &[]).unwrap(),
            scope(&p, &head("/", &[]), None).unwrap()
        );
        assert!(scope_of_values(&p, &["x".into()]).is_err());
    }

    #[test]
    fn cert_parts_need_a_certificate_with_the_name() {
        for text in ["cert:subject", "cert:san-uri", "cert:san-dns"] {
            assert_eq!(KeyPart::parse(text).unwrap().to_string(), text);
        }
        assert!(KeyPart::parse("cert:issuer").is_err());
        let p = parts(&["cert:san-uri"]);
        let anonymous = head("/", &[]);
        let err = scope(&p, &anonymous, None).unwrap_err();
        assert_eq!(err.part, p[0]);
        assert!(matches!(err.reason, KeyError::NoCertValue(_)), "{err}");
        let with = |uris: &[&str]| {
            let mut h = head("/", &[]);
            h.extensions.insert(Arc::new(ClientIdentity {
                subject: "CN=a".into(),
                san_uri: uris.iter().map(ToString::to_string).collect(),
                san_dns: Vec::new(),
            }));
            h
        };
        let a = scope(&p, &with(&["spiffe://t/a"]), None).unwrap();
        assert_eq!(a, scope_digest([b"cert:san-uri\0spiffe://t/a".as_slice()]));
        // Never a header's digest with the same text, and what an operator
        // names with `--scope` is what a request gets.
        let header = scope(
            &parts(&["header:x-uri"]),
            &head("/", &[("x-uri", "spiffe://t/a")]),
            None,
        );
        assert_ne!(a, header.unwrap());
        assert_eq!(a, scope_of_values(&p, &["spiffe://t/a".into()]).unwrap());
        assert_ne!(a, scope(&p, &with(&["spiffe://t/b"]), None).unwrap());
        assert!(scope(&p, &with(&[]), None).is_err());
        assert!(scope(&parts(&["cert:san-dns"]), &with(&["u"]), None).is_err());
        let subject = scope(&parts(&["cert:subject"]), &with(&[]), None).unwrap();
        assert_eq!(subject, scope_digest([b"cert:subject\0CN=a".as_slice()]));
    }
}
