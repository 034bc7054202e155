//! A record's states as stored and shown ([`RecordState`]), and why a key
//! is `held` ([`HeldReason`]) (docs/src/guide/record-states.md).

use serde::{Deserialize, Serialize};

/// A record's state (docs/src/guide/record-states.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordState {
    /// An attempt holds (or held, if `lease_until` has passed) a lease.
    InFlight,
    /// A response is recorded.
    Completed,
    /// The outcome is unknown or the response was not retained.
    Held,
    /// The outcome is unknown and the upstream is being asked; its next
    /// question is at `lease_until`.
    Inquiring,
}

impl RecordState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Completed => "completed",
            Self::Held => "held",
            Self::Inquiring => "inquiring",
        }
    }

    /// Parse a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::InFlight, Self::Completed, Self::Held, Self::Inquiring]
            .into_iter()
            .find(|state| state.as_str() == s)
    }
}

/// Why a key is `held` (docs/src/guide/record-states.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeldReason {
    /// The exchange failed after the request was sent (reset, protocol error).
    UpstreamFailed,
    /// The upstream did not answer within `upstream_timeout`.
    UpstreamTimeout,
    /// The attempt's lease lapsed (its gateway died or stalled).
    LeaseLapsed,
    /// The response was larger than `max_recorded_response`.
    ResponseTooLarge,
    /// The route inquired about the outcome for `give_up_after` and never
    /// got an answer that settles it.
    InquiryGaveUp,
}

impl HeldReason {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UpstreamFailed => "upstream_failed",
            Self::UpstreamTimeout => "upstream_timeout",
            Self::LeaseLapsed => "lease_lapsed",
            Self::ResponseTooLarge => "response_too_large",
            Self::InquiryGaveUp => "inquiry_gave_up",
        }
    }

    /// Parse a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::UpstreamFailed,
            Self::UpstreamTimeout,
            Self::LeaseLapsed,
            Self::ResponseTooLarge,
            Self::InquiryGaveUp,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_reasons_round_trip() {
        for r in [
            HeldReason::UpstreamFailed,
            HeldReason::UpstreamTimeout,
            HeldReason::LeaseLapsed,
            HeldReason::ResponseTooLarge,
            HeldReason::InquiryGaveUp,
        ] {
            assert_eq!(HeldReason::parse(r.as_str()), Some(r));
        }
        for s in [
            RecordState::InFlight,
            RecordState::Completed,
            RecordState::Held,
            RecordState::Inquiring,
        ] {
            assert_eq!(RecordState::parse(s.as_str()), Some(s));
        }
    }
}
