//! What happened to a request: the `outcome` label of its log line and
//! of `idemgate_requests_total`, and the answer it carries.

use http::Response;

use crate::problem::GatewayError;
use crate::request::body::Body;
use crate::store::Token;

/// A request answered without an error: the response, what happened, and
/// the fencing token of the attempt that forwarded it (if one did).
pub(super) struct Answered {
    pub(super) response: Response<Body>,
    pub(super) outcome: Outcome,
    pub(super) token: Option<Token>,
}

impl Answered {
    /// An answer no attempt of this request forwarded.
    pub(super) fn new(response: Response<Body>, outcome: Outcome) -> Self {
        Self {
            response,
            outcome,
            token: None,
        }
    }

    /// The answer of the attempt with `token`.
    pub(super) fn forwarded(response: Response<Body>, token: Token) -> Self {
        Self {
            response,
            outcome: Outcome::Forwarded,
            token: Some(token),
        }
    }
}

/// What happened to a request: the `outcome` of its log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Claimed and forwarded.
    Forwarded,
    /// Answered from the record.
    Replayed,
    /// Waited (`concurrent = "wait"`) for the first attempt, then replayed it.
    WaitedReplay,
    /// Waited `wait_timeout` and the key was still in flight: `409`.
    WaitTimeout,
    /// `409`: in flight elsewhere.
    Conflict,
    /// `422`: different fingerprint.
    Mismatch,
    /// `400`: no key on a route that requires one.
    MissingKey,
    /// `400`: malformed key.
    InvalidKey,
    /// Not protected: proxied untouched.
    Passthrough,
    /// Answered from a `held` record.
    Held,
    /// `409`: the key's outcome is being asked about (status inquiry).
    Inquiring,
    /// The store failed and the route fails closed.
    StoreError,
    /// `503`: a configured budget is spent; nothing was claimed or forwarded.
    Overloaded,
    /// The store failed and the route fails open: forwarded without idempotency.
    FailOpen,
    /// Any other problem (no route, body too large, upstream failures).
    Rejected,
}

impl Outcome {
    /// Every outcome, in declaration order ([`Outcome::index`]).
    pub const ALL: [Outcome; 15] = [
        Self::Forwarded,
        Self::Replayed,
        Self::WaitedReplay,
        Self::WaitTimeout,
        Self::Conflict,
        Self::Mismatch,
        Self::MissingKey,
        Self::InvalidKey,
        Self::Passthrough,
        Self::Held,
        Self::Inquiring,
        Self::StoreError,
        Self::Overloaded,
        Self::FailOpen,
        Self::Rejected,
    ];

    /// This outcome's position in [`Outcome::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The stable label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Forwarded => "forwarded",
            Self::Replayed => "replayed",
            Self::WaitedReplay => "waited_replay",
            Self::WaitTimeout => "wait_timeout",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::MissingKey => "missing_key",
            Self::InvalidKey => "invalid_key",
            Self::Passthrough => "passthrough",
            Self::Held => "held",
            Self::Inquiring => "inquiring",
            Self::StoreError => "store_error",
            Self::Overloaded => "overloaded",
            Self::FailOpen => "fail_open",
            Self::Rejected => "rejected",
        }
    }

    /// The outcome of a request answered with `error`. Exhaustive on
    /// purpose: a new error must be classified when it is added.
    pub fn of(error: &GatewayError) -> Self {
        match error {
            GatewayError::InFlight { .. } => Self::Conflict,
            GatewayError::WaitTimeout { .. } => Self::WaitTimeout,
            GatewayError::Mismatch { .. } => Self::Mismatch,
            GatewayError::MissingKey { .. } => Self::MissingKey,
            GatewayError::InvalidKey { .. } => Self::InvalidKey,
            GatewayError::Held { .. } => Self::Held,
            GatewayError::Inquiring { .. } => Self::Inquiring,
            GatewayError::StoreUnavailable(_) => Self::StoreError,
            GatewayError::Overloaded(_) => Self::Overloaded,
            GatewayError::NoRoute { .. }
            | GatewayError::BodyTooLarge { .. }
            | GatewayError::BodyRead(_)
            | GatewayError::BodyTimeout { .. }
            | GatewayError::UpstreamUnreachable(_)
            | GatewayError::UpstreamFailed { .. }
            | GatewayError::UpstreamTimeout { .. }
            | GatewayError::LeaseLost
            | GatewayError::RecordFailed(_)
            | GatewayError::Internal(_) => Self::Rejected,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `index` is the position in `ALL`, and `ALL` lists each outcome once:
    /// the per-route request counters are indexed by it.
    #[test]
    fn every_outcome_is_listed_once_at_its_index() {
        for (i, outcome) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome.index(), i, "{outcome:?}");
        }
        let labels: std::collections::HashSet<_> =
            Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(labels.len(), Outcome::ALL.len());
    }
}
