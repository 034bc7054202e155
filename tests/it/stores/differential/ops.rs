//! The operations a differential case is made of, and how proptest
//! generates (and shrinks) them: every call of the `Store` and
//! `StoreAdmin` traits that changes a record, with the arguments that
//! matter to the rules, and the clock moving by whole units
//! of ten seconds ([`tens`]) through `StoreAdmin::age`.

use std::fmt;
use std::time::Duration;

use idemgate::config::UnknownOutcome;
use idemgate::store::HeldReason;
use proptest::prelude::*;

/// The grain of every duration in a case: leases, retentions, the
/// inquiry's `after` and next question, and each step of the clock.
/// Large against the real time a case takes (well under a second), so a
/// store's own clock, which runs on meanwhile, never crosses a boundary
/// the reference does not.
pub const UNIT: Duration = Duration::from_secs(60);

/// `n` units.
pub fn units(n: u8) -> Duration {
    UNIT * u32::from(n)
}

/// What the clock moves by: tens of seconds, so that every instant of a
/// case is a multiple of ten seconds, and any boundary is either now
/// exactly (met from the late side, as a store's running clock meets it)
/// or ten seconds away at least, well beyond the comparisons' slack. Ages
/// of 50 s look at boundaries from ten seconds before them.
pub fn tens(n: u8) -> Duration {
    Duration::from_secs(10 * u64::from(n))
}

/// One of a case's two keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    A,
    B,
}

impl Key {
    pub const ALL: [Key; 2] = [Key::A, Key::B];

    pub fn name(self) -> &'static str {
        match self {
            Key::A => "a",
            Key::B => "b",
        }
    }
}

/// Which of a key's tokens (or attempts) a write carries: the newest
/// issued, one issued before (any, by index), one never issued below
/// every real one, or one above every token issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    Newest,
    Issued(u8),
    Never,
    Future,
}

/// One step of a case.
#[derive(Clone, PartialEq, Eq)]
pub enum Op {
    Claim {
        key: Key,
        fingerprint: u8,
        lease: u8,
        retention: u8,
    },
    Renew {
        key: Key,
        token: Pick,
        lease: u8,
    },
    Complete {
        key: Key,
        token: Pick,
        response: u8,
        retention: u8,
    },
    Release {
        key: Key,
        token: Pick,
    },
    Hold {
        key: Key,
        token: Pick,
        reason: HeldReason,
        retention: u8,
    },
    Inquire {
        key: Key,
        token: Pick,
        next: u8,
        asked: bool,
        retention: u8,
    },
    Abandon {
        key: Key,
        attempt: Pick,
    },
    Take {
        lease: u8,
    },
    Clear {
        key: Key,
        force: bool,
    },
    Delete {
        key: Key,
        force: bool,
    },
    /// Every record of the case `tens` × 10 s older.
    Age {
        tens: u8,
    },
    /// One pass of the sweeper (store-wide), and the route's count of
    /// inquiring keys.
    Sweep,
}

impl fmt::Debug for Op {
    /// One line per step, as a counterexample is read.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Claim {
                key,
                fingerprint,
                lease,
                retention,
            } => write!(
                f,
                "claim {} fingerprint {fingerprint} lease {lease}u retention {retention}u",
                key.name()
            ),
            Op::Renew { key, token, lease } => {
                write!(f, "renew {} token {token:?} lease {lease}u", key.name())
            }
            Op::Complete {
                key,
                token,
                response,
                retention,
            } => write!(
                f,
                "complete {} token {token:?} response {response} retention {retention}u",
                key.name()
            ),
            Op::Release { key, token } => write!(f, "release {} token {token:?}", key.name()),
            Op::Hold {
                key,
                token,
                reason,
                retention,
            } => write!(
                f,
                "hold {} token {token:?} {} retention {retention}u",
                key.name(),
                reason.as_str()
            ),
            Op::Inquire {
                key,
                token,
                next,
                asked,
                retention,
            } => write!(
                f,
                "inquire {} token {token:?} next {next}u asked {asked} retention {retention}u",
                key.name()
            ),
            Op::Abandon { key, attempt } => {
                write!(f, "abandon {} attempt {attempt:?}", key.name())
            }
            Op::Take { lease } => write!(f, "take_inquiries lease {lease}u"),
            Op::Clear { key, force } => write!(f, "clear {} force {force}", key.name()),
            Op::Delete { key, force } => write!(f, "delete {} force {force}", key.name()),
            Op::Age { tens } => write!(f, "age {}s", 10 * u16::from(*tens)),
            Op::Sweep => write!(f, "sweep"),
        }
    }
}

/// A case: its route's policy and inquiry settings, and its steps.
#[derive(Clone)]
pub struct Case {
    /// The route's `on_unknown_outcome`, which every claim carries. (A
    /// route whose policy changes under its records, by a reload, is not
    /// covered: docs/src/design/state-machine.md.)
    pub policy: UnknownOutcome,
    /// The route's `[routes.inquiry] after`, in units (claims that inquire
    /// carry it; the inquirer takes with it).
    pub after: u8,
    /// The route's retention, in units (the inquirer takes with it).
    pub retention: u8,
    pub ops: Vec<Op>,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "route: on_unknown_outcome {:?}, after {}u, retention {}u (1u = {:?})",
            self.policy, self.after, self.retention, UNIT
        )?;
        for (i, op) in self.ops.iter().enumerate() {
            writeln!(f, "  {:>2}. {op:?}", i + 1)?;
        }
        Ok(())
    }
}

fn key() -> impl Strategy<Value = Key> {
    prop_oneof![Just(Key::A), Just(Key::B)]
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        6 => Just(Pick::Newest),
        3 => (0u8..4).prop_map(Pick::Issued),
        1 => Just(Pick::Never),
        1 => Just(Pick::Future),
    ]
}

fn policy() -> impl Strategy<Value = UnknownOutcome> {
    prop_oneof![
        Just(UnknownOutcome::Hold),
        Just(UnknownOutcome::Release),
        Just(UnknownOutcome::Inquire),
    ]
}

fn reason() -> impl Strategy<Value = HeldReason> {
    prop_oneof![
        Just(HeldReason::UpstreamFailed),
        Just(HeldReason::UpstreamTimeout),
        Just(HeldReason::LeaseLapsed),
        Just(HeldReason::ResponseTooLarge),
        Just(HeldReason::InquiryGaveUp),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (key(), 0u8..2, 1u8..=2, 1u8..=3).prop_map(
            |(key, fingerprint, lease, retention)| Op::Claim {
                key,
                fingerprint,
                lease,
                // A route's retention is at least its lease (configuration
                // refuses less).
                retention: retention.max(lease),
            }
        ),
        2 => (key(), pick(), 1u8..=2).prop_map(|(key, token, lease)| Op::Renew { key, token, lease }),
        3 => (key(), pick(), 0u8..2, 1u8..=3).prop_map(|(key, token, response, retention)| {
            Op::Complete {
                key,
                token,
                response,
                retention,
            }
        }),
        1 => (key(), pick()).prop_map(|(key, token)| Op::Release { key, token }),
        2 => (key(), pick(), reason(), 1u8..=3).prop_map(|(key, token, reason, retention)| {
            Op::Hold {
                key,
                token,
                reason,
                retention,
            }
        }),
        3 => (key(), pick(), 0u8..=2, any::<bool>(), 1u8..=3).prop_map(
            |(key, token, next, asked, retention)| Op::Inquire {
                key,
                token,
                next,
                asked,
                retention,
            }
        ),
        1 => (key(), pick()).prop_map(|(key, attempt)| Op::Abandon { key, attempt }),
        2 => (1u8..=2).prop_map(|lease| Op::Take { lease }),
        1 => (key(), any::<bool>()).prop_map(|(key, force)| Op::Clear { key, force }),
        1 => (key(), any::<bool>()).prop_map(|(key, force)| Op::Delete { key, force }),
        4 => prop_oneof![Just(5u8), Just(6), Just(12), Just(18)].prop_map(|tens| Op::Age { tens }),
        1 => Just(Op::Sweep),
    ]
}

/// Cases of up to `most` steps.
pub fn cases(most: usize) -> impl Strategy<Value = Case> {
    let steps = prop::collection::vec(op(), 1..=most);
    (policy(), 0u8..=1, 1u8..=3, steps).prop_map(|(policy, after, retention, ops)| Case {
        policy,
        after,
        retention,
        ops,
    })
}
