//! A validated [`Route`] and the policy types its settings turn into
//! ([`PathMatch`], [`RecordPolicy`], [`OnStoreError`], [`Concurrent`]), plus
//! the process-wide [`LogFormat`]. Parsing a value into these types lives
//! here; checking a whole route lives in `validate`.

use std::time::{Duration, SystemTime};

use http::{HeaderName, Method, StatusCode, Uri};
use serde::Deserialize;

use super::UpstreamCa;
use super::inquiry::Inquiry;
use crate::request::fingerprint::{BodyMode, FingerprintSpec};
use crate::request::key_source::KeyPart;
use crate::store::UnknownOutcome;

/// How a route's path is matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// The path equals this string.
    Exact(String),
    /// The path starts with this string (which ends in `/`), or equals it without the `/`.
    Prefix(String),
}

impl std::fmt::Display for PathMatch {
    /// As the route's `match` was written: `/exact` or `/prefix/*`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exact(path) => f.write_str(path),
            Self::Prefix(prefix) => write!(f, "{prefix}*"),
        }
    }
}

impl PathMatch {
    /// `"/exact"` or `"/prefix/*"`; anything else is `None`.
    pub(super) fn parse(s: &str) -> Option<Self> {
        if !s.starts_with('/') {
            return None;
        }
        match s.strip_suffix('*') {
            Some(prefix) if prefix.ends_with('/') => Some(Self::Prefix(prefix.to_string())),
            Some(_) => None,
            None if s.contains('*') => None,
            None => Some(Self::Exact(s.to_string())),
        }
    }

    /// Whether `path` belongs to this route; `Some(specificity)` if it does.
    pub fn matches(&self, path: &str) -> Option<usize> {
        match self {
            Self::Exact(p) => (p == path).then_some(usize::MAX),
            Self::Prefix(p) => {
                (path.starts_with(p.as_str()) || path == &p[..p.len() - 1]).then_some(p.len())
            }
        }
    }
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// What a route does when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// Answer `503` with `Retry-After`.
    FailClosed,
    /// Forward without idempotency (logged).
    FailOpen,
}

/// What a duplicate arriving while the key is in flight gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Concurrent {
    /// `409` with `Retry-After`.
    Reject,
    /// Wait up to `wait_timeout` for the first attempt's answer (woken by
    /// the store), then `409`.
    Wait,
}

/// Whether a route enforces idempotency or only reports what it would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteMode {
    /// Claim, record, replay, and answer `400`/`409`/`422` as designed.
    Enforce,
    /// Forward every request as if idemgate were absent; still claim and
    /// record keyed requests, and count what enforcing would have done.
    Shadow,
}

/// Which upstream statuses are recorded (the rest release the key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordPolicy {
    include: Vec<(u16, u16)>,
    exclude: Vec<(u16, u16)>,
}

impl RecordPolicy {
    /// Statuses (`404`), classes (`4xx`), ranges (`400-499`) and exclusions (`!409`).
    pub(super) fn parse(items: &[String]) -> Result<Self, String> {
        let mut policy = Self {
            include: Vec::new(),
            exclude: Vec::new(),
        };
        for item in items {
            let (negated, spec) = match item.strip_prefix('!') {
                Some(rest) => (true, rest),
                None => (false, item.as_str()),
            };
            let range = parse_status_range(spec).ok_or_else(|| {
                format!("`{item}` is not a status (`404`), class (`4xx`), range (`400-499`) or exclusion (`!409`)")
            })?;
            if negated {
                policy.exclude.push(range);
            } else {
                policy.include.push(range);
            }
        }
        Ok(policy)
    }

    /// Whether a response with this status is recorded.
    pub fn records(&self, status: StatusCode) -> bool {
        let s = status.as_u16();
        let inside = |r: &(u16, u16)| r.0 <= s && s <= r.1;
        self.include.iter().any(inside) && !self.exclude.iter().any(inside)
    }
}

fn parse_status_range(spec: &str) -> Option<(u16, u16)> {
    let code = |s: &str| s.parse::<u16>().ok().filter(|c| (100..=599).contains(c));
    if let Some(class) = spec.strip_suffix("xx") {
        let c = class.parse::<u16>().ok().filter(|c| (1..=5).contains(c))?;
        return Some((c * 100, c * 100 + 99));
    }
    if let Some((a, b)) = spec.split_once('-') {
        let (a, b) = (code(a.trim())?, code(b.trim())?);
        return (a <= b).then_some((a, b));
    }
    code(spec).map(|c| (c, c))
}

/// One validated route.
#[derive(Debug, Clone)]
pub struct Route {
    /// Unique name; part of the key space.
    pub name: String,
    /// Which paths belong to the route.
    pub path: PathMatch,
    /// The upstream's base URI (`http[s]://host:port[/prefix]`).
    pub upstream: Uri,
    /// Trust anchors for an `https://` upstream besides the system's roots.
    pub upstream_ca: Option<UpstreamCa>,
    /// Protected methods; the others pass through untouched.
    pub methods: Vec<Method>,
    /// Where the key is read (`key_from`; `key_header` is its shorthand).
    pub key_from: Vec<KeyPart>,
    /// Missing key: `400` if true, pass-through if false.
    pub key_required: bool,
    /// Where the scope is read (`scope_from`, or `scope_header`); its
    /// SHA-256 digest scopes keys (per tenant). Empty: unscoped.
    pub scope_from: Vec<KeyPart>,
    /// How long a record (and a `held` key) is kept.
    pub retention: Duration,
    /// How long an attempt owns its key without renewing.
    pub lease: Duration,
    /// Longest wait for the upstream's whole response.
    pub upstream_timeout: Duration,
    /// Largest request body accepted (over it: `413`).
    pub max_request_body: usize,
    /// Largest response recorded (over it: forwarded once, then held).
    pub max_recorded_response: usize,
    /// What a lapsed lease turns into.
    pub on_unknown_outcome: UnknownOutcome,
    /// What a store outage does.
    pub on_store_error: OnStoreError,
    /// What an in-flight duplicate gets.
    pub concurrent: Concurrent,
    /// How long a duplicate waits under `concurrent = "wait"`.
    pub wait_timeout: Duration,
    /// Enforce, or shadow (forward everything, count what would happen).
    pub mode: RouteMode,
    /// Which upstream statuses are recorded.
    pub record: RecordPolicy,
    /// Response headers never recorded nor replayed (hop-by-hop ones are always dropped).
    pub replay_headers_deny: Vec<HeaderName>,
    /// What the request fingerprint covers.
    pub fingerprint: FingerprintSpec,
    /// Where to ask about unknown outcomes (`on_unknown_outcome = "inquire"` only).
    pub inquiry: Option<Inquiry>,
    /// Send the attempt's fencing token upstream as `Idempotency-Attempt`.
    pub forward_attempt: bool,
    /// Keyed answers that create or replay a record say until when it is
    /// kept (`Idempotency-Expires`).
    pub expires_header: bool,
    /// The body is recorded (`false`: status and headers only).
    pub record_body: bool,
}

impl Route {
    /// Whether requests with this method go through the idempotency pipeline.
    pub fn protects(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// Whether a request header must reach the upstream unchanged: the key
    /// and scope headers, which a client's `Connection` cannot remove.
    pub fn travels_end_to_end(&self, name: &HeaderName) -> bool {
        self.key_from
            .iter()
            .chain(&self.scope_from)
            .any(|part| part.header() == Some(name))
    }

    /// The instant a record written now is kept at least until, when the
    /// route announces it (`expires_header`): now plus `retention`, by the
    /// gateway's wall clock. The store reckons its own expiry a little
    /// later (after this call), so the announcement never overstates.
    pub fn announced_expiry(&self) -> Option<SystemTime> {
        self.expires_header
            .then(|| SystemTime::now() + self.retention)
    }

    /// Whether the key is read from the body (the body is read before it).
    pub fn key_reads_body(&self) -> bool {
        self.key_from.iter().any(KeyPart::reads_body)
    }

    /// Whether the body is parsed as JSON (for a key or scope part, or the
    /// fingerprint).
    pub fn parses_json(&self) -> bool {
        self.key_from
            .iter()
            .chain(&self.scope_from)
            .any(KeyPart::reads_body)
            || self.fingerprint.body == BodyMode::Json
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{MINIMAL, parse, route_error};

    #[test]
    fn match_is_exact_or_slash_star_prefix() {
        assert_eq!(
            PathMatch::parse("/a/b"),
            Some(PathMatch::Exact("/a/b".into()))
        );
        assert_eq!(
            PathMatch::parse("/a/*"),
            Some(PathMatch::Prefix("/a/".into()))
        );
        assert_eq!(PathMatch::parse("/*"), Some(PathMatch::Prefix("/".into())));
        assert_eq!(PathMatch::parse("/a*"), None);
        assert_eq!(PathMatch::parse("a/b"), None);
        assert_eq!(PathMatch::parse("/a/*/b"), None);
        let p = PathMatch::parse("/v1/payments/*").unwrap();
        assert!(p.matches("/v1/payments/123").is_some());
        assert!(p.matches("/v1/payments").is_some());
        assert!(p.matches("/v1/paymentsX").is_none());
        assert!(parse(&MINIMAL.replace("/v1/payments/*", "v1")).is_err());
    }

    #[test]
    fn record_policy_default_and_custom() {
        let d = &parse(MINIMAL).unwrap().routes[0].record;
        for (s, recorded) in [
            (200, true),
            (201, true),
            (302, true),
            (400, true),
            (404, true),
            (408, false),
            (409, false),
            (425, false),
            (429, false),
            (500, false),
            (503, false),
        ] {
            assert_eq!(d.records(StatusCode::from_u16(s).unwrap()), recorded, "{s}");
        }
        let text = format!("{MINIMAL}\nrecord = [\"200-299\", \"500\", \"!204\"]\n");
        let p = &parse(&text).unwrap().routes[0].record;
        assert!(p.records(StatusCode::OK) && p.records(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!p.records(StatusCode::NO_CONTENT) && !p.records(StatusCode::BAD_REQUEST));
        let err = route_error("record = [\"2xy\"]");
        assert!(err.contains("routes[0].record"), "{err}");
    }
}
