//! The rules the model's store applies: the core's own transition
//! functions, called with the model's abstract time turned into the
//! phases they take, and, for the negative controls, a [`Mutation`] that
//! breaks one of them on purpose. Without a mutation every decision is
//! exactly `idemgate_core::transitions`'.

use std::time::Duration;

use idemgate_core::UnknownOutcome;
use idemgate_core::transitions::{self, ClaimStep, Phase, Write};

use crate::world::{Lease, Rec, Record};

/// A deliberate bug in the rules, which the checker must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// A write applies whatever its token (no fencing).
    WriteIgnoresToken,
    /// A claim takes a key over whose lease is still live.
    ClaimOverLiveLease,
    /// `keys release` without `--force` removes an inquiring record inside
    /// its route's `after`.
    ReleaseInquiringInsideAfter,
    /// An inquirer's settling write applies though a newer token took the
    /// key.
    InquiryAnswerAfterNewerToken,
}

impl Mutation {
    /// Every mutation.
    pub const ALL: [Mutation; 4] = [
        Mutation::WriteIgnoresToken,
        Mutation::ClaimOverLiveLease,
        Mutation::ReleaseInquiringInsideAfter,
        Mutation::InquiryAnswerAfterNewerToken,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mutation::WriteIgnoresToken => "write-ignores-token",
            Mutation::ClaimOverLiveLease => "claim-over-live-lease",
            Mutation::ReleaseInquiringInsideAfter => "release-inquiring-inside-after",
            Mutation::InquiryAnswerAfterNewerToken => "inquiry-answer-after-newer-token",
        }
    }
}

/// The length the model gives every lease and every route's `after`: only
/// zero or not matters to the rules.
const SOME: Duration = Duration::from_secs(1);

/// A record's phase as the core's rules see it.
pub fn phase(state: Rec) -> Phase {
    match state {
        Rec::InFlight(Lease::Live) => Phase::in_flight(SOME),
        Rec::InFlight(Lease::Lapsed | Lease::LapsedDue) => Phase::in_flight(Duration::ZERO),
        Rec::Completed(_) => Phase::Completed,
        Rec::Held(reason) => Phase::Held(reason),
        Rec::Inquiring { due } => Phase::inquiring(if due { Duration::ZERO } else { SOME }),
    }
}

/// The rules, possibly broken by one mutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rules {
    /// The route's policy for unknown outcomes.
    pub policy: UnknownOutcome,
    /// The bug planted, if any.
    pub mutation: Option<Mutation>,
}

impl Rules {
    /// What a claim with fingerprint `fingerprint` does to `record`.
    pub fn claim(&self, record: Option<&Record>, fingerprint: u8) -> ClaimStep {
        let found = record.map(|r| (phase(r.state), r.fingerprint == fingerprint));
        let step = transitions::claim(found, self.policy);
        match (self.mutation, step) {
            (Some(Mutation::ClaimOverLiveLease), ClaimStep::InFlight(_)) => ClaimStep::TakeOver,
            _ => step,
        }
    }

    /// Whether an attempt's `write` with `token` applies to `record`.
    pub fn write_applies(&self, write: Write, token: i64, record: &Record) -> bool {
        let same = token == record.token || self.mutation == Some(Mutation::WriteIgnoresToken);
        transitions::write_applies(write, same, phase(record.state))
    }

    /// Whether the inquirer's settling `write` with `token` applies.
    pub fn inquiry_write_applies(&self, write: Write, token: i64, record: &Record) -> bool {
        let newer_ignored = self.mutation == Some(Mutation::InquiryAnswerAfterNewerToken)
            && matches!(record.state, Rec::Inquiring { .. } | Rec::InFlight(_));
        let same = token == record.token || newer_ignored;
        transitions::write_applies(write, same, phase(record.state))
    }

    /// Whether the inquirer may take the question about `record`.
    pub fn take_applies(&self, record: &Record) -> bool {
        let lapsed_for = match record.state {
            Rec::InFlight(Lease::LapsedDue) => SOME,
            _ => Duration::ZERO,
        };
        transitions::take_applies(phase(record.state), lapsed_for, SOME)
    }

    /// Whether `keys release` (with or without `--force`) removes `record`.
    pub fn clearable(&self, record: &Record, force: bool) -> bool {
        let inside_after = matches!(record.state, Rec::Inquiring { .. });
        if self.mutation == Some(Mutation::ReleaseInquiringInsideAfter) && inside_after {
            return true;
        }
        transitions::clearable(phase(record.state), u32::from(record.asked), force)
    }

    /// Whether retention may remove `record` (its retention has passed).
    pub fn expirable(&self, record: &Record) -> bool {
        transitions::expired(true, phase(record.state))
    }
}
