//! Every synthetic answer idemgate gives: the [`GatewayError`] enum, its one
//! exhaustive mapping to an HTTP status, and its RFC 9457
//! `application/problem+json` rendering (docs/src/design/pipeline.md, step 8).

use std::time::{Duration, SystemTime};

use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

use crate::request::body::{Body, full};
use crate::request::key::KeyError;
use crate::request::key_source::KeyPart;
use crate::store::seal::OpenError;
use crate::store::{HeldReason, StoreError};
use crate::upstream::announce_expiry;

/// Every way the gateway answers instead of (or after) the upstream.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// No route matches the path.
    #[error("no route matches {path}")]
    NoRoute {
        /// The request path.
        path: String,
    },
    /// The route requires a key and the request lacks one of its parts.
    #[error("missing key part {part}")]
    MissingKey {
        /// The first absent part.
        part: KeyPart,
    },
    /// A key or scope part's value is not usable.
    #[error("invalid key part {part}: {reason}")]
    InvalidKey {
        /// The part.
        part: KeyPart,
        /// What is wrong with it.
        reason: KeyError,
    },
    /// The request body is larger than `max_request_body`.
    #[error("request body larger than {limit} bytes")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The client's body could not be read.
    #[error("could not read the request body: {0}")]
    BodyRead(String),
    /// The client did not send the whole body within `body_read_timeout`.
    #[error("request body not received within {timeout:?}")]
    BodyTimeout {
        /// The limit.
        timeout: Duration,
    },
    /// Another request with this key is in flight.
    #[error("a request with this key is in flight")]
    InFlight {
        /// Time left on its lease.
        retry_after: Duration,
        /// When its record expires (at the earliest).
        expires: RecordExpiry,
    },
    /// The key's outcome is unknown and the upstream is being asked.
    #[error("the outcome of a request with this key is being asked about")]
    Inquiring {
        /// Time until the next question.
        retry_after: Duration,
        /// When its record expires (at the earliest).
        expires: RecordExpiry,
    },
    /// `concurrent = "wait"`: waited `wait_timeout`, still in flight.
    #[error("waited {waited:?} for a request with this key in flight")]
    WaitTimeout {
        /// How long this request waited.
        waited: Duration,
        /// Time left on the first attempt's lease.
        retry_after: Duration,
        /// When its record expires (at the earliest).
        expires: RecordExpiry,
    },
    /// The key was used with a different request.
    #[error("key reused with a different request")]
    Mismatch {
        /// When the other request's record expires.
        expires: RecordExpiry,
    },
    /// The key is held.
    #[error("key held: {}", .reason.as_str())]
    Held {
        /// Why.
        reason: HeldReason,
        /// When the record expires.
        expires: RecordExpiry,
    },
    /// A configured budget is spent (buffered bodies, forwards in flight):
    /// nothing was claimed or forwarded.
    #[error("overloaded: {0} is spent")]
    Overloaded(&'static str),
    /// The store is unreachable and the route fails closed.
    #[error("store unavailable: {0}")]
    StoreUnavailable(StoreError),
    /// The upstream could not be reached; nothing was sent, the key is free again.
    #[error("upstream unreachable: {0}")]
    UpstreamUnreachable(String),
    /// The exchange failed after the request was sent; the outcome is unknown.
    #[error("upstream failed: {detail}")]
    UpstreamFailed {
        /// What failed.
        detail: String,
        /// What became of the key.
        key: KeyAfter,
        /// When its record expires, if the key is held or inquiring.
        expires: Option<RecordExpiry>,
    },
    /// The upstream did not answer in time; the outcome is unknown.
    #[error("upstream timed out after {timeout:?}")]
    UpstreamTimeout {
        /// The route's `upstream_timeout`.
        timeout: Duration,
        /// What became of the key.
        key: KeyAfter,
        /// When its record expires, if the key is held or inquiring.
        expires: Option<RecordExpiry>,
    },
    /// The attempt's lease lapsed and another attempt owns the key now.
    #[error("lease lost before the response could be recorded")]
    LeaseLost,
    /// The upstream answered but the store did not take the record.
    #[error("response could not be recorded: {0}")]
    RecordFailed(StoreError),
    /// A bug: the forward task ended without an answer.
    #[error("internal error: {0}")]
    Internal(String),
}

/// When the record a refusal (`409`, `422`, a held key's `502`) is about
/// expires, as the problem's `expires` member and, where the route
/// announces expiry (`expires_header`), the `Idempotency-Expires` header:
/// after it the key may be used again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordExpiry {
    /// The instant, by the gateway's clock.
    pub at: SystemTime,
    /// Whether the header carries it too.
    pub header: bool,
}

impl RecordExpiry {
    /// The record the store answered about expires `expires_in` after
    /// `asked`, the instant (by this host's clock) before the claim was
    /// sent: the store reckoned the time left later than that, and rounded
    /// it down, so this never overstates however long the answer took.
    pub fn after(asked: SystemTime, expires_in: Duration, header: bool) -> Self {
        Self {
            at: asked + expires_in,
            header,
        }
    }
}

/// What became of the key when an upstream exchange broke and its outcome
/// is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAfter {
    /// Held (`on_unknown_outcome = "hold"`): retries get `502
    /// outcome-unknown`.
    Held,
    /// Released (`"release"`): a retry is forwarded again.
    Released,
    /// There was none: the request was forwarded without idempotency.
    Unkeyed,
    /// A shadow route's: recorded, but a retry is forwarded all the same.
    Observed,
    /// Inquiring (`"inquire"`): the gateway asks the upstream what happened.
    Inquiring,
    /// The write that would have held, released or inquired was fenced: a
    /// newer attempt or an inquirer had taken the key meanwhile.
    Superseded,
}

/// The fields of one problem type.
struct Kind {
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    retry_after: Option<Duration>,
}

impl Kind {
    fn new(status: StatusCode, slug: &'static str, title: &'static str) -> Self {
        Self {
            status,
            slug,
            title,
            retry_after: None,
        }
    }

    /// An answer a client should retry after a pause.
    fn later(status: StatusCode, slug: &'static str, title: &'static str, after: Duration) -> Self {
        Self {
            retry_after: Some(after),
            ..Self::new(status, slug, title)
        }
    }
}

impl GatewayError {
    /// The one exhaustive mapping from error to status, type and title.
    fn kind(&self) -> Kind {
        use GatewayError as E;
        use StatusCode as S;
        let (k, later, second) = (Kind::new, Kind::later, Duration::from_secs(1));
        match self {
            E::NoRoute { .. } => k(S::NOT_FOUND, "no-route", "No route for this path"),
            E::MissingKey { .. } => k(S::BAD_REQUEST, "missing-key", "Idempotency key required"),
            E::InvalidKey { .. } => k(S::BAD_REQUEST, "invalid-key", "Invalid idempotency key"),
            E::BodyTooLarge { .. } => k(
                S::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
            ),
            E::BodyRead(_) => k(
                S::BAD_REQUEST,
                "body-unreadable",
                "Request body could not be read",
            ),
            E::BodyTimeout { .. } => k(S::REQUEST_TIMEOUT, "body-timeout", "Request body too slow"),
            // The lease bounds the wait; most requests finish far sooner, so
            // clients are asked to come back in a second, not at the bound.
            E::InFlight { retry_after, .. } | E::WaitTimeout { retry_after, .. } => later(
                S::CONFLICT,
                "in-flight",
                "A request with this key is in progress",
                (*retry_after).min(IN_FLIGHT_RETRY),
            ),
            // Until the next question: its answer may settle the key.
            E::Inquiring { retry_after, .. } => later(
                S::CONFLICT,
                "outcome-pending",
                "The outcome of the request with this key is being resolved",
                (*retry_after).max(second),
            ),
            E::Mismatch { .. } => k(
                S::UNPROCESSABLE_ENTITY,
                "key-reused",
                "Idempotency key reused with a different request",
            ),
            E::Held { reason, .. } => held_kind(*reason),
            E::StoreUnavailable(error) => store_kind(error),
            E::Overloaded(_) => later(
                S::SERVICE_UNAVAILABLE,
                "overloaded",
                "Gateway overloaded",
                second,
            ),
            E::UpstreamUnreachable(_) => k(
                S::BAD_GATEWAY,
                "upstream-unreachable",
                "Upstream unreachable",
            ),
            E::UpstreamFailed { .. } => k(
                S::BAD_GATEWAY,
                "upstream-failed",
                "Upstream exchange failed",
            ),
            E::UpstreamTimeout { .. } => {
                k(S::GATEWAY_TIMEOUT, "upstream-timeout", "Upstream timed out")
            }
            E::LeaseLost => k(S::BAD_GATEWAY, "lease-lost", "Attempt superseded"),
            E::RecordFailed(_) => later(
                S::SERVICE_UNAVAILABLE,
                "record-failed",
                "Response could not be recorded",
                second,
            ),
            E::Internal(_) => k(
                S::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal gateway error",
            ),
        }
    }

    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        self.kind().status
    }

    /// What happened and what the client should do.
    fn detail(&self) -> String {
        use GatewayError as E;
        let unknown = |key: KeyAfter| match key {
            KeyAfter::Held => {
                "The upstream may have acted. The key is now held: retries with it get 502 outcome-unknown until an operator releases it or its retention ends."
            }
            KeyAfter::Released => {
                "The upstream may have acted. The key was released: a retry with the same key is forwarded again."
            }
            KeyAfter::Unkeyed => {
                "The upstream may have acted. This request was forwarded without idempotency: a retry is forwarded again."
            }
            KeyAfter::Observed => {
                "The upstream may have acted. This route only observes keys (shadow mode): a retry is forwarded again."
            }
            KeyAfter::Inquiring => {
                "The upstream may have acted. idemgate will ask it what happened: a retry with the same key gets 409 until then, and afterwards the upstream's answer as a replay, or is forwarded if the upstream never acted."
            }
            KeyAfter::Superseded => {
                "The upstream may have acted. This attempt's lease had lapsed, and the key was taken over meanwhile (by a newer attempt or by idemgate asking the upstream): retry with the same key to get its current outcome."
            }
        };
        match self {
            E::NoRoute { path } => format!("No configured route matches {path}. Check the URL, or the gateway's [[routes]] configuration."),
            E::MissingKey { part: KeyPart::Header(header) } => format!("This endpoint requires an {header} header. Send a unique key (e.g. a UUID) per operation and reuse it when you retry."),
            E::MissingKey { part } => format!("This endpoint takes its idempotency key from {part}, which this request lacks. Send it, with the same value on every retry of one operation."),
            E::InvalidKey { part: KeyPart::Header(header), reason } => format!("The {header} header is invalid: {reason}. Send 1 to 255 visible ASCII characters, bare or as a quoted string (\"key\")."),
            E::InvalidKey { part: part @ KeyPart::Cert(_), reason } => format!("This endpoint scopes its idempotency keys by the client certificate's {part}, and {reason}. Connect with a client certificate that has it, issued by a CA the gateway trusts."),
            E::InvalidKey { part, reason } => format!("This endpoint reads its idempotency key (or its scope) from {part}, and that is invalid: {reason}. Send a string (1 to 255 printable ASCII characters) or an integer there."),
            E::BodyTooLarge { limit } => format!("The request body exceeds this endpoint's limit of {limit} bytes. Send a smaller body."),
            E::BodyRead(e) => format!("The request body could not be read ({e}). Retry the request."),
            E::BodyTimeout { timeout } => format!("The request body did not arrive within {} seconds, so the request was not forwarded. Retry with the same key.", timeout.as_secs_f64()),
            E::InFlight { retry_after, .. } => format!("A request with this key is still being processed (its lease runs at most {} more seconds). Retry with the same key shortly to get its result.", retry_secs(*retry_after)),
            E::WaitTimeout { waited, retry_after, .. } => format!("A request with this key is still being processed: this request waited {:.1} seconds for its answer (the route's wait_timeout), and its lease runs at most {} more seconds. Retry with the same key to get its result.", waited.as_secs_f64(), retry_secs(*retry_after)),
            E::Mismatch { .. } => "This key was already used with a different request (method, path, query or body). Use a new key for a new request, or resend exactly the original request.".to_string(),
            E::Inquiring { retry_after, .. } => format!("The outcome of a previous request with this key is unknown, and idemgate is asking the upstream what happened (next question in at most {} seconds). Retry with the same key then: you will get the upstream's answer as a replay, or your request is forwarded if the upstream never acted on it.", retry_secs(*retry_after)),
            E::Held { reason: HeldReason::InquiryGaveUp, .. } => "A previous request with this key may or may not have been processed: idemgate asked the upstream for the route's give_up_after and never got an answer that settles it (inquiry_gave_up), so it will not forward the key again. Check the result with the API, ask the operator to release the key, or use a new key.".to_string(),
            E::Held { reason: HeldReason::ResponseTooLarge, .. } => "The first request with this key was processed, but its response was too large to record, so it cannot be replayed. Look up the result with the API, or use a new key.".to_string(),
            E::Held { reason, .. } => format!("A previous request with this key may or may not have been processed ({}); idemgate will not forward it again. Check the result with the API, ask the operator to release the key, or use a new key.", reason.as_str()),
            E::StoreUnavailable(StoreError::Corrupt(_)) => "The stored record for this key cannot be read by this version of idemgate, so the request was not forwarded. The operator should inspect the key (idemgate keys show).".to_string(),
            E::StoreUnavailable(StoreError::Sealed(OpenError::UnknownKey(id))) => format!("The response recorded for this key was sealed with encryption key {id:?}, which this gateway is not configured with, so it cannot be replayed and the request was not forwarded. Do not use a new key for the same operation: the operator should put key {id:?} back in [store] encryption_keys."),
            E::StoreUnavailable(StoreError::Sealed(OpenError::Unauthentic(_))) => "The response recorded for this key does not authenticate (it was sealed for another record, or altered in the store), so it is not replayed and the request was not forwarded. The operator should inspect the key (idemgate keys show) and the store's integrity.".to_string(),
            E::StoreUnavailable(StoreError::Sealed(OpenError::Plain)) => "The response recorded for this key is not sealed, and this gateway replays sealed records only ([store] accept_plain_records = false), so it is not replayed and the request was not forwarded. The operator should inspect the key (idemgate keys show) and the store's integrity.".to_string(),
            E::StoreUnavailable(StoreError::NotReplicated(_)) => "The idempotency store's replicas did not acknowledge the claim in time, so this request was not forwarded. Retry with the same key shortly; the operator should check the store's replicas ([store] replicas).".to_string(),
            E::StoreUnavailable(StoreError::LateClaim(_)) => "The idempotency store refused the claim because, by its own clock, it arrived after the instant it had to run by, so this request was not forwarded. Retry with the same key; if every request gets this, the operator should check that the store's clock agrees with the gateway's.".to_string(),
            E::StoreUnavailable(StoreError::Full(_)) => "The gateway's in-memory idempotency store is full, so this request was not forwarded. Retry with the same key later; the operator should raise [store] max_records or use PostgreSQL.".to_string(),
            E::Overloaded(what) => format!("The gateway's {what} is spent, so this request was not claimed or forwarded. Retry with the same key shortly."),
            E::StoreUnavailable(_) => "The idempotency store cannot be reached, so this request was not forwarded. Retry with the same key shortly.".to_string(),
            E::UpstreamUnreachable(e) => format!("The upstream could not be reached ({e}); the request was not sent and the key was released. Retry with the same key."),
            E::UpstreamFailed { detail, key, .. } => format!("The upstream exchange failed ({detail}). {}", unknown(*key)),
            E::UpstreamTimeout { timeout, key, .. } => format!("The upstream did not answer within {}s. {}", timeout.as_secs_f64(), unknown(*key)),
            E::LeaseLost => "This attempt took longer than its lease and another attempt now owns the key; its response was not recorded and is not sent. Retry with the same key to get the key's current state.".to_string(),
            E::RecordFailed(_) => "The upstream answered, but the answer could not be recorded, so it is not sent. Retry with the same key: you will get the result once the key settles.".to_string(),
            E::Internal(_) => "idemgate failed unexpectedly. Retry with the same key; if it persists, contact the operator.".to_string(),
        }
    }

    /// When the record this answer is about expires, for the answers
    /// about one.
    pub fn expires(&self) -> Option<RecordExpiry> {
        use GatewayError as E;
        match self {
            E::InFlight { expires, .. }
            | E::Inquiring { expires, .. }
            | E::WaitTimeout { expires, .. }
            | E::Mismatch { expires }
            | E::Held { expires, .. } => Some(*expires),
            E::UpstreamFailed { expires, .. } | E::UpstreamTimeout { expires, .. } => *expires,
            _ => None,
        }
    }

    /// Render as `application/problem+json`.
    pub fn to_response(&self, docs_url: Option<&str>) -> Response<Body> {
        let kind = self.kind();
        let expires = self.expires();
        let detail = self.detail();
        let problem = Problem {
            expires: expires.map(|e| humantime::format_rfc3339_seconds(e.at).to_string()),
            ..Problem::new(kind.status, kind.slug, kind.title, &detail)
        };
        let mut response = problem.to_response();
        let headers = response.headers_mut();
        if let Some(expires) = expires.filter(|e| e.header) {
            announce_expiry(headers, expires.at);
        }
        if let Some(after) = kind.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_secs(after)));
        }
        if let Some(docs) = docs_url {
            let link = format!(
                "<{}#{}>; rel=\"describedby\"",
                docs.trim_end_matches('#'),
                kind.slug
            );
            if let Ok(v) = HeaderValue::from_str(&link) {
                headers.insert(header::LINK, v);
            }
        }
        response
    }
}

/// A held key's problem type, by why it is held.
fn held_kind(reason: HeldReason) -> Kind {
    use StatusCode as S;
    match reason {
        HeldReason::ResponseTooLarge => Kind::new(
            S::CONFLICT,
            "response-not-retained",
            "The response for this key was not retained",
        ),
        HeldReason::UpstreamFailed
        | HeldReason::UpstreamTimeout
        | HeldReason::LeaseLapsed
        | HeldReason::InquiryGaveUp => Kind::new(
            S::BAD_GATEWAY,
            "outcome-unknown",
            "The outcome of the request with this key is unknown",
        ),
    }
}

/// The problem of a store failure: an unreadable or unopened record is a
/// `500` of its own (never retried by `Retry-After`); anything else is the
/// store being unavailable.
fn store_kind(error: &StoreError) -> Kind {
    use StatusCode as S;
    match error {
        StoreError::Corrupt(_) => Kind::new(
            S::INTERNAL_SERVER_ERROR,
            "store-corrupt",
            "Idempotency record unreadable",
        ),
        StoreError::Sealed(OpenError::UnknownKey(_)) => Kind::new(
            S::INTERNAL_SERVER_ERROR,
            "record-key-unknown",
            "Recorded response sealed with a key the gateway does not have",
        ),
        StoreError::Sealed(OpenError::Unauthentic(_) | OpenError::Plain) => Kind::new(
            S::INTERNAL_SERVER_ERROR,
            "record-unauthentic",
            "Recorded response failed its integrity check",
        ),
        _ => Kind::later(
            S::SERVICE_UNAVAILABLE,
            "store-unavailable",
            "Idempotency store unavailable",
            Duration::from_secs(1),
        ),
    }
}

/// The `Retry-After` sent with an in-flight `409` (at most).
const IN_FLIGHT_RETRY: Duration = Duration::from_secs(1);

/// Whole seconds to wait, rounded up, at least 1.
fn retry_secs(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000).max(1) as u64
}

/// An `application/problem+json` answer (RFC 9457), the one shape of every
/// problem idemgate sends, the proxy's and the admin listener's:
/// `urn:idemgate:problem:<slug>`, its title, status and `detail`.
pub fn render(status: StatusCode, slug: &str, title: &str, detail: &str) -> Response<Body> {
    Problem::new(status, slug, title, detail).to_response()
}

#[derive(Serialize)]
struct Problem<'a> {
    r#type: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
    /// When the record the answer is about expires (RFC 3339, UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    expires: Option<String>,
}

impl<'a> Problem<'a> {
    fn new(status: StatusCode, slug: &str, title: &'a str, detail: &'a str) -> Self {
        Self {
            r#type: format!("urn:idemgate:problem:{slug}"),
            title,
            status: status.as_u16(),
            detail,
            expires: None,
        }
    }

    fn to_response(&self) -> Response<Body> {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = Response::new(full(serde_json::to_vec(self).unwrap_or_default()));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A broken exchange's detail says what a retry gets: the held key's
    /// `502 outcome-unknown`, a released key's forward, or (no key at
    /// all) a plain forward, never a key that does not exist.
    #[test]
    fn an_unknown_outcome_says_what_a_retry_gets() {
        let detail = |key| {
            GatewayError::UpstreamTimeout {
                timeout: Duration::from_secs(1),
                key,
                expires: None,
            }
            .detail()
        };
        assert!(detail(KeyAfter::Held).contains("502 outcome-unknown"));
        assert!(detail(KeyAfter::Released).contains("key was released"));
        assert!(detail(KeyAfter::Observed).contains("shadow mode"));
        let superseded = detail(KeyAfter::Superseded);
        assert!(
            superseded.contains("taken over") && !superseded.contains("will ask"),
            "{superseded}"
        );
        let unkeyed = detail(KeyAfter::Unkeyed);
        assert!(!unkeyed.contains("key"), "{unkeyed}");
    }

    #[tokio::test]
    async fn conflict_carries_retry_after_and_problem_json() {
        let r = GatewayError::InFlight {
            retry_after: Duration::from_millis(1500),
            expires: RecordExpiry::after(SystemTime::now(), Duration::from_secs(60), false),
        }
        .to_response(Some("https://docs.example/errors"));
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()["retry-after"], "1");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        assert_eq!(
            r.headers()["link"],
            "<https://docs.example/errors#in-flight>; rel=\"describedby\""
        );
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "urn:idemgate:problem:in-flight");
        assert_eq!(v["status"], 409);
        assert!(
            v["detail"]
                .as_str()
                .unwrap()
                .contains("at most 2 more seconds")
        );
    }

    /// A refusal names its record's expiry in the body, and in the
    /// header where the route announces it; an answer about no record
    /// carries neither.
    #[tokio::test]
    async fn a_refusal_says_when_its_record_expires() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_024_469);
        for header in [true, false] {
            let expires = RecordExpiry { at, header };
            let r = GatewayError::Mismatch { expires }.to_response(None);
            assert_eq!(
                r.headers().get("idempotency-expires").is_some(),
                header,
                "{r:?}"
            );
            if header {
                assert_eq!(
                    r.headers()["idempotency-expires"],
                    "Mon, 30 Nov 2026 07:41:09 GMT"
                );
            }
            let body = r.into_body().collect().await.unwrap().to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["expires"], "2026-11-30T07:41:09Z");
        }
        let r = GatewayError::LeaseLost.to_response(None);
        assert!(r.headers().get("idempotency-expires").is_none());
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(v.get("expires").is_none(), "{v}");
    }

    #[test]
    fn statuses_follow_design() {
        let expires = RecordExpiry::after(SystemTime::now(), Duration::ZERO, true);
        assert_eq!(
            GatewayError::Mismatch { expires }.status(),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(
            GatewayError::Held {
                reason: HeldReason::LeaseLapsed,
                expires
            }
            .status(),
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(
            GatewayError::Held {
                reason: HeldReason::ResponseTooLarge,
                expires
            }
            .status(),
            StatusCode::CONFLICT
        );
        let e = GatewayError::StoreUnavailable(StoreError::Unavailable("x".into()));
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.to_response(None).headers()["retry-after"], "1");
        assert_eq!(
            GatewayError::BodyTooLarge { limit: 1 }.status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }

    /// A sealed record that does not open is a 500 of its own type, never
    /// retried by `Retry-After` and never the generic store outage.
    #[test]
    fn unopened_records_have_problems_of_their_own() {
        for (error, slug) in [
            (OpenError::UnknownKey("k1".into()), "record-key-unknown"),
            (OpenError::Unauthentic("k1".into()), "record-unauthentic"),
            (OpenError::Plain, "record-unauthentic"),
        ] {
            let e = GatewayError::StoreUnavailable(StoreError::Sealed(error));
            assert_eq!(e.kind().slug, slug);
            assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
            assert!(e.to_response(None).headers().get("retry-after").is_none());
        }
    }
}
