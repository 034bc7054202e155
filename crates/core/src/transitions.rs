//! The record state machine (docs/src/guide/record-states.md), written once.
//!
//! Every backend follows these rules. The memory store executes these
//! functions; the PostgreSQL store (`idemgate_claim` in
//! `migrations/0001_records.sql` and the statements in the store crate's `postgres/`) and
//! the Redis store (the Lua scripts in `redis/scripts.rs`) implement the same rules
//! in their own language and cite the function they implement, so a change
//! here names every place that must follow. The conformance suite holds all
//! backends to them.
//!
//! Every write after the claim is a compare-and-set: it applies only if the
//! attempt's fencing token is the record's current one *and* the record is
//! in a state the write may leave ([`write_applies`]).

use std::time::Duration;

use crate::{HeldReason, UnknownOutcome};

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
    /// The outcome is unknown and the upstream is being asked: `due_in` is
    /// the time until the next question (or until the current inquirer's
    /// lease lapses), `None` once it is due.
    Inquiring {
        /// Time until the question is due; `None`: due now.
        due_in: Option<Duration>,
    },
}

impl Phase {
    /// An inquiring record whose question is due `left` from now (zero: now).
    pub fn inquiring(left: Duration) -> Self {
        Self::Inquiring {
            due_in: (!left.is_zero()).then_some(left),
        }
    }

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
    /// The lease lapsed (or a due inquiry is no route's to ask any more)
    /// and the route releases unknown outcomes: a new token and lease on
    /// the same record, in flight again (a takeover).
    TakeOver,
    /// The lease lapsed (or a due inquiry is no route's to ask) and the
    /// route holds unknown outcomes: the record turns `held`
    /// (`lease_lapsed`), and so does the answer.
    HoldLapsed,
    /// The upstream is being asked about the outcome: `409` after this long
    /// (zero: the question is due).
    Inquiring(Duration),
    /// The lease lapsed and the route inquires: the record turns
    /// `inquiring` (same token: the lapsed attempt may still settle it),
    /// its first question due [`lapsed_question_in`], and the answer is
    /// `409` until then.
    InquireLapsed,
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
        (Phase::Inquiring { due_in: Some(left) }, _) => ClaimStep::Inquiring(left),
        (Phase::Inquiring { due_in: None }, UnknownOutcome::Inquire) => {
            ClaimStep::Inquiring(Duration::ZERO)
        }
        (
            Phase::InFlight {
                lease_left: Some(left),
            },
            _,
        ) => ClaimStep::InFlight(left),
        (Phase::InFlight { lease_left: None }, UnknownOutcome::Inquire) => ClaimStep::InquireLapsed,
        // An inquiry nobody is asking about (the route no longer inquires)
        // is an attempt whose lease lapsed: the route's policy decides.
        (Phase::InFlight { lease_left: None } | Phase::Inquiring { due_in: None }, policy) => {
            match policy {
                UnknownOutcome::Release => ClaimStep::TakeOver,
                UnknownOutcome::Hold | UnknownOutcome::Inquire => ClaimStep::HoldLapsed,
            }
        }
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
    /// Mark the record inquiring, or set its next question.
    Inquire,
}

/// Whether an attempt's write applies, given whether its token is the
/// record's current one and the record's state. A lapsed lease does not
/// fence its own attempt by itself: only a takeover (a new token) or a hold
/// does, or the record's retention ending meanwhile: an [`expired`] record
/// is gone, and no write applies to it (with `retention` equal to `lease`,
/// a lapsed attempt's late answer is refused).
///
/// - renew and release: only an in-flight record;
/// - complete: in flight, completed already (a retried write whose first
///   answer was lost must not look fenced), or held only because this
///   attempt's lease lapsed (the real answer replaces "unknown");
/// - hold: in flight or held already (idempotent retries);
/// - inquire: in flight (the attempt's exchange broke) or inquiring;
/// - on an inquiring record, every write but renew: its token is the
///   attempt's until an inquirer takes the question, then the inquirer's,
///   which settles it with the upstream's answer (complete, release, hold
///   once it gives up, inquire to ask again later).
pub fn write_applies(write: Write, same_token: bool, phase: Phase) -> bool {
    if !same_token {
        return false;
    }
    match (write, phase) {
        (_, Phase::InFlight { .. }) => true,
        (Write::Complete, Phase::Completed | Phase::Held(HeldReason::LeaseLapsed)) => true,
        (Write::Hold, Phase::Held(_)) => true,
        (
            Write::Complete | Write::Release | Write::Hold | Write::Inquire,
            Phase::Inquiring { .. },
        ) => true,
        (Write::Renew | Write::Release | Write::Complete | Write::Hold | Write::Inquire, _) => {
            false
        }
    }
}

/// When the first question about an attempt whose lease lapsed
/// `lapsed_for` ago is due, from now: `after` (the route's
/// `[routes.inquiry] after`, the time the upstream may still be working on
/// the request) past the moment the lease lapsed. Until then nobody takes
/// the key from the attempt (a new token would fence it): its own answer,
/// late because its gateway stalled, may still settle the key. The
/// inquiry is reckoned from that moment too (`inquiring_for`), so the
/// question is asked when it is due, not put off by another `after`.
pub fn lapsed_question_in(lapsed_for: Duration, after: Duration) -> Duration {
    after.saturating_sub(lapsed_for)
}

/// Whether an inquirer may take the question about a record
/// (the store's `take_inquiries`): an inquiring record whose
/// question is due, or an in-flight one whose lease lapsed (its gateway
/// died and no request came for the key) once its first question is due
/// ([`lapsed_question_in`]: `lapsed_for` is how long ago its lease lapsed,
/// `after` its route's). Taking gives the record a new token, so only the
/// taker's writes apply.
pub fn take_applies(phase: Phase, lapsed_for: Duration, after: Duration) -> bool {
    match phase {
        Phase::Inquiring { due_in: None } => true,
        Phase::InFlight { lease_left: None } => lapsed_question_in(lapsed_for, after).is_zero(),
        _ => false,
    }
}

/// Whether an abandon (the claim's answer was lost, nothing was forwarded)
/// removes the record: only the abandoning attempt's own record, while it
/// is in flight, or held or inquiring only because that attempt's lease
/// lapsed (an abandoned attempt never broke an exchange). A
/// record the attempt completed or held for another reason was forwarded
/// after all, and is left alone.
pub fn abandon_applies(same_attempt: bool, phase: Phase) -> bool {
    same_attempt
        && matches!(
            phase,
            Phase::InFlight { .. } | Phase::Held(HeldReason::LeaseLapsed) | Phase::Inquiring { .. }
        )
}

/// Whether a record is gone for every purpose: past its retention and not
/// held by a live lease (a live lease outlives retention, G1).
pub fn expired(past_retention: bool, phase: Phase) -> bool {
    past_retention && !phase.lease_live()
}

/// How long a record is kept from now, `retention_left` being the time
/// left on its retention: until then, or, held by a live lease, until that
/// lapses if later ([`expired`]). What a refusal tells the client.
pub fn kept_for(retention_left: Duration, phase: Phase) -> Duration {
    match phase {
        Phase::InFlight {
            lease_left: Some(lease),
        } => retention_left.max(lease),
        _ => retention_left,
    }
}

/// Whether the upstream may still be working on the key's request, so
/// that removing the record would let a retry be forwarded while the first
/// attempt may still act: a live lease, or an inquiring record inside its
/// route's `after` (its first question neither asked nor due yet; `asked`
/// is the questions asked so far). Once the first question is due or was
/// asked, `after` has passed.
pub fn upstream_may_be_working(phase: Phase, asked: u32) -> bool {
    match phase {
        Phase::InFlight { .. } => phase.lease_live(),
        Phase::Inquiring { due_in } => asked == 0 && due_in.is_some(),
        Phase::Completed | Phase::Held(_) => false,
    }
}

/// `keys release`: a held or inquiring record, or an in-flight one whose
/// lease lapsed; one the upstream may still be working on
/// ([`upstream_may_be_working`]: a live lease, an inquiry inside `after`)
/// only with `force`; a completed record never.
pub fn clearable(phase: Phase, asked: u32, force: bool) -> bool {
    match phase {
        Phase::Completed => false,
        _ => force || !upstream_may_be_working(phase, asked),
    }
}

/// `keys delete`: a record in any state, but one the upstream may still be
/// working on ([`upstream_may_be_working`]) only with `force`, as for
/// `keys release`.
pub fn deletable(phase: Phase, asked: u32, force: bool) -> bool {
    force || !upstream_may_be_working(phase, asked)
}

/// How long a lost claim's record is still looked for once the store
/// says it is not there (the lost-claims worker): one lease, and at least
/// `2 × [store] timeout` and a second.
///
/// A claim can commit after its caller gave up only within this window:
/// - On PostgreSQL a claim travels in a batch, sent before the latest
///   deadline among its operations (at most one `[store] timeout` after
///   this caller's, which is when it reported the claim lost), and the
///   server cancels its statement one `[store] timeout` after that at the
///   latest (`statement_timeout`, crates/store/src/postgres/pool.rs); the second
///   covers the network. (A commit waiting for a synchronous standby is
///   not bounded by `statement_timeout`: a stalled standby can still make
///   a claim visible later.)
/// - On Redis a script queued behind others on its connection (a `WAIT`
///   holds the connection up to `replica_timeout` each) or sent to a
///   paused server runs whenever the server reaches it, so the claim
///   carries its own limit ([`claim_write_limit`]).
pub fn lost_claim_window(lease: Duration, store_timeout: Duration) -> Duration {
    lease.max(store_timeout * 2 + Duration::from_secs(1))
}

/// How long after it was sent a claim may still write, where the store
/// cannot cancel it (Redis): `[store] timeout` plus half of
/// [`lost_claim_window`]. The limit is a wall-clock instant taken on the
/// gateway and compared with the server's clock. The worker watches for
/// the window from (at the earliest) the send, so a server clock behind
/// the gateway's by up to the window minus this limit (half the window
/// minus `[store] timeout`: at least half a second, 13 s with a 30 s lease
/// and a 2 s timeout) still stops a late claim inside it; a server clock
/// ahead by more than the limit minus the claim's time on the way would
/// refuse claims sent on time.
pub fn claim_write_limit(lease: Duration, store_timeout: Duration) -> Duration {
    store_timeout + lost_claim_window(lease, store_timeout) / 2
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
    const ASKING: Phase = Phase::Inquiring {
        due_in: Some(Duration::from_secs(5)),
    };
    const DUE: Phase = Phase::Inquiring { due_in: None };
    const ALL: [Phase; 7] = [
        LIVE,
        LAPSED,
        Phase::Completed,
        HELD,
        LAPSED_HELD,
        ASKING,
        DUE,
    ];

    #[test]
    fn claims_follow_the_record() {
        use UnknownOutcome::{Hold, Inquire, Release};
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
        assert_eq!(
            claim(Some((LAPSED, true)), Inquire),
            ClaimStep::InquireLapsed
        );
        assert_eq!(
            claim(Some((LIVE, true)), Inquire),
            ClaimStep::InFlight(Duration::from_secs(3))
        );
        for unknown in [Hold, Release, Inquire] {
            assert_eq!(
                claim(Some((ASKING, true)), unknown),
                ClaimStep::Inquiring(Duration::from_secs(5))
            );
        }
        assert_eq!(
            claim(Some((DUE, true)), Inquire),
            ClaimStep::Inquiring(Duration::ZERO)
        );
        // A route that stopped inquiring: its policy, as for a lapsed lease.
        assert_eq!(claim(Some((DUE, true)), Hold), ClaimStep::HoldLapsed);
        assert_eq!(claim(Some((DUE, true)), Release), ClaimStep::TakeOver);
    }

    #[test]
    fn only_due_questions_and_lapsed_leases_are_taken() {
        assert_eq!(Phase::inquiring(Duration::ZERO), DUE);
        let after = Duration::from_secs(3);
        for phase in ALL {
            assert_eq!(
                take_applies(phase, after, after),
                phase == DUE || phase == LAPSED,
                "{phase:?}"
            );
        }
        // A lapsed lease's question waits `after` past the lapse.
        assert!(!take_applies(LAPSED, Duration::from_secs(2), after));
        assert!(take_applies(LAPSED, Duration::from_secs(4), after));
        assert!(take_applies(DUE, Duration::ZERO, after));
    }

    #[test]
    fn a_lapsed_leases_question_is_due_after_past_the_lapse() {
        let after = Duration::from_secs(3);
        assert_eq!(lapsed_question_in(Duration::ZERO, after), after);
        assert_eq!(
            lapsed_question_in(Duration::from_secs(1), after),
            Duration::from_secs(2)
        );
        assert_eq!(
            lapsed_question_in(Duration::from_secs(5), after),
            Duration::ZERO
        );
    }

    #[test]
    fn an_inquiry_is_settled_by_its_tokens_holder_only() {
        use Write::*;
        for phase in [ASKING, DUE] {
            for write in [Complete, Release, Hold, Inquire] {
                assert!(write_applies(write, true, phase), "{write:?} {phase:?}");
                assert!(!write_applies(write, false, phase), "{write:?} {phase:?}");
            }
            assert!(!write_applies(Renew, true, phase));
            // Once a question was asked, `after` has passed.
            assert!(clearable(phase, 1, false));
            assert!(deletable(phase, 1, false));
        }
        for phase in [Phase::Completed, HELD, LAPSED_HELD] {
            assert!(!write_applies(Inquire, true, phase), "{phase:?}");
        }
    }

    #[test]
    fn a_zero_lease_is_lapsed() {
        assert_eq!(Phase::in_flight(Duration::ZERO), LAPSED);
        assert!(Phase::in_flight(Duration::from_millis(1)).lease_live());
    }

    #[test]
    fn writes_need_the_token_and_a_state_they_may_leave() {
        use Write::*;
        for write in [Renew, Complete, Release, Hold, Inquire] {
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
        assert!(abandon_applies(true, DUE));
        assert!(!abandon_applies(true, HELD));
        assert!(!abandon_applies(true, Phase::Completed));
    }

    #[test]
    fn a_late_claim_is_refused_inside_the_window_the_worker_watches() {
        for (lease, timeout) in [(1, 2), (30, 2), (2, 10), (5, 1)] {
            let (lease, timeout) = (Duration::from_secs(lease), Duration::from_secs(timeout));
            let window = lost_claim_window(lease, timeout);
            // The worker looks from (at the earliest) the moment the claim
            // was sent; the claim stops writing before that window ends,
            // with at least half a second to spare for the clocks.
            let limit = claim_write_limit(lease, timeout);
            assert!(
                limit >= timeout,
                "the caller's own wait is inside the limit"
            );
            assert!(
                limit + Duration::from_millis(500) <= window,
                "{lease:?} {timeout:?}"
            );
        }
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
        assert!(clearable(HELD, 0, false));
        assert!(clearable(LAPSED, 0, false));
        assert!(!clearable(LIVE, 0, false));
        assert!(clearable(LIVE, 0, true));
        assert!(!clearable(Phase::Completed, 0, true));
        for phase in [LAPSED, Phase::Completed, HELD] {
            assert!(deletable(phase, 0, false));
        }
        assert!(!deletable(LIVE, 0, false));
        assert!(deletable(LIVE, 0, true));
    }

    #[test]
    fn administration_spares_an_inquiry_inside_after() {
        // Not asked yet and not due: inside `after`, the upstream may
        // still be working on the request.
        assert!(upstream_may_be_working(ASKING, 0));
        assert!(!clearable(ASKING, 0, false));
        assert!(!deletable(ASKING, 0, false));
        assert!(clearable(ASKING, 0, true));
        assert!(deletable(ASKING, 0, true));
        // Due, or asked already: `after` has passed.
        for (phase, asked) in [(DUE, 0), (ASKING, 1), (DUE, 2)] {
            assert!(!upstream_may_be_working(phase, asked), "{phase:?} {asked}");
            assert!(clearable(phase, asked, false), "{phase:?} {asked}");
            assert!(deletable(phase, asked, false), "{phase:?} {asked}");
        }
        for phase in [LAPSED, Phase::Completed, HELD, LAPSED_HELD] {
            assert!(!upstream_may_be_working(phase, 0), "{phase:?}");
        }
        assert!(upstream_may_be_working(LIVE, 0));
    }
}
