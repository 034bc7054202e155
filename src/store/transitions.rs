//! The record state machine (docs/src/guide/record-states.md), written once.
//!
//! Every backend follows these rules. The memory store executes these
//! functions; the PostgreSQL store (`idemgate_claim` in
//! `migrations/0001_records.sql` and the statements in `postgres/`) and
//! the Redis store (the Lua scripts in `redis.rs`) implement the same rules
//! in their own language and cite the function they implement, so a change
//! here names every place that must follow. The conformance suite holds all
//! backends to them.
//!
//! Every write after the claim is a compare-and-set: it applies only if the
//! attempt's fencing token is the record's current one *and* the record is
//! in a state the write may leave ([`write_applies`]).

use std::time::Duration;

use super::{HeldReason, UnknownOutcome};

/// A record's state as the rules see it, at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// An attempt holds a lease: `lease_left` is the time left on it, or
    /// `None` once it has lapsed.
    InFlight {
        /// Time left on the lease; `None`: lapsed.
        lease_left: Option<Duration>,
    },
    /// A response is recorded.
    Completed,
    /// The outcome is unknown or the response was not retained.
    Held(HeldReason),
}

impl Phase {
    /// An in-flight record whose lease ends `left` from now (zero: lapsed).
    pub fn in_flight(left: Duration) -> Self {
        Self::InFlight {
            lease_left: (!left.is_zero()).then_some(left),
        }
    }

    /// An attempt may be at the upstream right now.
    pub fn lease_live(self) -> bool {
        matches!(
            self,
            Self::InFlight {
                lease_left: Some(_)
            }
        )
    }
}

/// What a claim does, given what it found under the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimStep {
    /// No live record: insert an in-flight record with a new token and lease.
    Insert,
    /// The key was used with another fingerprint: `422`.
    Mismatch,
    /// A response is recorded: replay it.
    Replay,
    /// The record is held: answer with its reason.
    Held(HeldReason),
    /// Another attempt's lease is live: `409` after this long.
    InFlight(Duration),
    /// The lease lapsed and the route releases unknown outcomes: a new
    /// token and lease on the same record (a takeover).
    TakeOver,
    /// The lease lapsed and the route holds unknown outcomes: the record
    /// turns `held` (`lease_lapsed`), and so does the answer.
    HoldLapsed,
}

/// The claim. `found` is the record under the key if it has not expired
/// ([`expired`]), with whether its fingerprint is this request's.
pub fn claim(found: Option<(Phase, bool)>, on_unknown: UnknownOutcome) -> ClaimStep {
    let Some((phase, same_fingerprint)) = found else {
        return ClaimStep::Insert;
    };
    if !same_fingerprint {
        return ClaimStep::Mismatch;
    }
    match (phase, on_unknown) {
        (Phase::Completed, _) => ClaimStep::Replay,
        (Phase::Held(reason), _) => ClaimStep::Held(reason),
        (
            Phase::InFlight {
                lease_left: Some(left),
            },
            _,
        ) => ClaimStep::InFlight(left),
        (Phase::InFlight { lease_left: None }, UnknownOutcome::Release) => ClaimStep::TakeOver,
        (Phase::InFlight { lease_left: None }, UnknownOutcome::Hold) => ClaimStep::HoldLapsed,
    }
}

/// A write by the attempt that holds a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Extend the lease.
    Renew,
    /// Record the response.
    Complete,
    /// Remove the record (nothing was sent, or the status is not recorded).
    Release,
    /// Mark the record held.
    Hold,
}

/// Whether an attempt's write applies, given whether its token is the
/// record's current one and the record's state. A lapsed lease does not
/// fence its own attempt by itself: only a takeover (a new token) or a hold
/// does.
///
/// - renew and release: only an in-flight record;
/// - complete: in flight, completed already (a retried write whose first
///   answer was lost must not look fenced), or held only because this
///   attempt's lease lapsed (the real answer replaces "unknown");
/// - hold: in flight or held already (idempotent retries).
pub fn write_applies(write: Write, same_token: bool, phase: Phase) -> bool {
    if !same_token {
        return false;
    }
    match (write, phase) {
        (_, Phase::InFlight { .. }) => true,
        (Write::Complete, Phase::Completed | Phase::Held(HeldReason::LeaseLapsed)) => true,
        (Write::Hold, Phase::Held(_)) => true,
        (Write::Renew | Write::Release | Write::Complete | Write::Hold, _) => false,
    }
}

/// Whether an abandon (the claim's answer was lost, nothing was forwarded)
/// removes the record: only the abandoning attempt's own record, while it
/// is in flight or held only because that attempt's lease lapsed. A
/// record the attempt completed or held for another reason was forwarded
/// after all, and is left alone.
pub fn abandon_applies(same_attempt: bool, phase: Phase) -> bool {
    same_attempt
        && matches!(
            phase,
            Phase::InFlight { .. } | Phase::Held(HeldReason::LeaseLapsed)
        )
}

/// Whether a record is gone for every purpose: past its retention and not
/// held by a live lease (a live lease outlives retention, G1).
pub fn expired(past_retention: bool, phase: Phase) -> bool {
    past_retention && !phase.lease_live()
}

/// `keys release`: a held record, or an in-flight one whose lease lapsed
/// (a live one only with `force`); a completed record never.
pub fn clearable(phase: Phase, force: bool) -> bool {
    match phase {
        Phase::Held(_) => true,
        Phase::InFlight { .. } => force || !phase.lease_live(),
        Phase::Completed => false,
    }
}

/// `keys delete`: a record in any state, but a live lease only with `force`.
pub fn deletable(phase: Phase, force: bool) -> bool {
    force || !phase.lease_live()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIVE: Phase = Phase::InFlight {
        lease_left: Some(Duration::from_secs(3)),
    };
    const LAPSED: Phase = Phase::InFlight { lease_left: None };
    const HELD: Phase = Phase::Held(HeldReason::UpstreamTimeout);
    const LAPSED_HELD: Phase = Phase::Held(HeldReason::LeaseLapsed);
    const ALL: [Phase; 5] = [LIVE, LAPSED, Phase::Completed, HELD, LAPSED_HELD];

    #[test]
    fn claims_follow_the_record() {
        use UnknownOutcome::{Hold, Release};
        assert_eq!(claim(None, Hold), ClaimStep::Insert);
        for phase in ALL {
            assert_eq!(claim(Some((phase, false)), Release), ClaimStep::Mismatch);
        }
        assert_eq!(
            claim(Some((Phase::Completed, true)), Hold),
            ClaimStep::Replay
        );
        assert_eq!(
            claim(Some((HELD, true)), Release),
            ClaimStep::Held(HeldReason::UpstreamTimeout)
        );
        assert_eq!(
            claim(Some((LIVE, true)), Release),
            ClaimStep::InFlight(Duration::from_secs(3))
        );
        assert_eq!(claim(Some((LAPSED, true)), Release), ClaimStep::TakeOver);
        assert_eq!(claim(Some((LAPSED, true)), Hold), ClaimStep::HoldLapsed);
    }

    #[test]
    fn a_zero_lease_is_lapsed() {
        assert_eq!(Phase::in_flight(Duration::ZERO), LAPSED);
        assert!(Phase::in_flight(Duration::from_millis(1)).lease_live());
    }

    #[test]
    fn writes_need_the_token_and_a_state_they_may_leave() {
        use Write::*;
        for write in [Renew, Complete, Release, Hold] {
            for phase in ALL {
                assert!(!write_applies(write, false, phase), "{write:?} {phase:?}");
            }
            assert!(write_applies(write, true, LIVE));
            assert!(write_applies(write, true, LAPSED));
        }
        assert!(write_applies(Complete, true, Phase::Completed));
        assert!(write_applies(Complete, true, LAPSED_HELD));
        assert!(!write_applies(Complete, true, HELD));
        assert!(write_applies(Hold, true, HELD));
        assert!(!write_applies(Hold, true, Phase::Completed));
        for write in [Renew, Release] {
            for phase in [Phase::Completed, HELD, LAPSED_HELD] {
                assert!(!write_applies(write, true, phase), "{write:?} {phase:?}");
            }
        }
    }

    #[test]
    fn only_the_attempts_own_unforwarded_record_is_abandoned() {
        for phase in ALL {
            assert!(!abandon_applies(false, phase), "{phase:?}");
        }
        assert!(abandon_applies(true, LIVE));
        assert!(abandon_applies(true, LAPSED));
        assert!(abandon_applies(true, LAPSED_HELD));
        assert!(!abandon_applies(true, HELD));
        assert!(!abandon_applies(true, Phase::Completed));
    }

    #[test]
    fn live_leases_outlive_retention() {
        assert!(!expired(true, LIVE));
        assert!(expired(true, LAPSED));
        assert!(expired(true, Phase::Completed));
        assert!(!expired(false, Phase::Completed));
    }

    #[test]
    fn administration_spares_live_leases_and_release_spares_records() {
        assert!(clearable(HELD, false));
        assert!(clearable(LAPSED, false));
        assert!(!clearable(LIVE, false));
        assert!(clearable(LIVE, true));
        assert!(!clearable(Phase::Completed, true));
        for phase in [LAPSED, Phase::Completed, HELD] {
            assert!(deletable(phase, false));
        }
        assert!(!deletable(LIVE, false));
        assert!(deletable(LIVE, true));
    }
}
