//! The world the model explores: one key's record in the store, the
//! client's attempts and where each one is, the upstream (what it has
//! received, what it has done, and how far its lookup fenced), the
//! inquirer, and a ledger of what happened that the properties read.
//!
//! Time is abstract: a lease is live or lapsed, a question due or not,
//! and the actions that move them are chosen by the checker, so every
//! order of lapses, answers, crashes and writes is explored.

use idemgate_core::{HeldReason, Token};

/// An attempt's index among the client's requests with the key.
pub type AttemptIx = u8;

/// A record's lease, as the rules can tell it apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lease {
    /// Its attempt may be at the upstream right now.
    Live,
    /// It lapsed: its gateway died or stalled.
    Lapsed,
    /// It lapsed at least the route's `after` ago: its first question is
    /// due (routes that inquire).
    LapsedDue,
}

/// A record's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rec {
    /// An attempt holds (or held) a lease.
    InFlight(Lease),
    /// A response is recorded: the upstream's answer number.
    Completed(u8),
    /// The outcome is unknown or not retained.
    Held(HeldReason),
    /// The upstream is being asked; `due`: the next question is due.
    Inquiring {
        /// The question is due.
        due: bool,
    },
}

/// The store's record under the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    /// Its state.
    pub state: Rec,
    /// The current fencing token.
    pub token: Token,
    /// The fingerprint of the request that created it.
    pub fingerprint: u8,
    /// Questions asked and answered without settling it.
    pub asked: u8,
    /// The epoch it was claimed in ([`Ledger::epoch`]).
    pub epoch: u8,
}

/// Where one client request with the key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Sent by the client; the gateway has not claimed yet.
    Ready,
    /// Its claim succeeded with this token; not yet forwarded.
    Claimed(Token),
    /// Forwarded; waiting for the upstream's answer.
    Waiting(Token),
    /// The upstream answered: `Some(n)`, it acted and answered `201` with
    /// answer `n`; `None`, it refused a fenced attempt (`409`, not
    /// recorded).
    Answered(Token, Option<u8>),
    /// The exchange broke after the request was sent: the upstream may
    /// have acted, or may still act.
    Broken(Token),
    /// The client has its answer.
    Finished(Answer),
    /// Its gateway crashed: it writes nothing more.
    Crashed,
}

/// What the client was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// The upstream's own answer `n` (forwarded).
    Forwarded(u8),
    /// The upstream refused the attempt (a lookup fenced it).
    Refused,
    /// A replay of the recorded answer `n`.
    Replayed(u8),
    /// `409`: in flight or inquiring.
    Conflict,
    /// `422`: another request under the key.
    Mismatch,
    /// The key is held.
    Held,
    /// `502`/`504` after a broken exchange.
    Failed,
}

/// One client request with the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attempt {
    /// Its request's fingerprint.
    pub fingerprint: u8,
    /// Where it is.
    pub stage: Stage,
    /// The epoch its claim was in.
    pub epoch: u8,
}

/// A request the upstream has received and not yet acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Queued {
    /// Whose request.
    pub attempt: AttemptIx,
    /// The `Idempotency-Attempt` it carries.
    pub token: Token,
    /// Whether its answer can still reach the gateway.
    pub connected: bool,
}

/// One execution of the request by the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Effect {
    /// The epoch of the claim that forwarded it.
    pub epoch: u8,
    /// The request's fingerprint.
    pub fingerprint: u8,
}

/// The upstream: what it holds and what it did.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Upstream {
    /// Received, not acted on.
    pub queue: Vec<Queued>,
    /// Everything it executed, in order; answer `n` is effect `n - 1`.
    pub effects: Vec<Effect>,
    /// Attempts up to this token are refused (a lookup's `404` fenced them).
    pub fence: Token,
}

/// What happened, for the properties (never read by the rules).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Ledger {
    /// Licensed restarts of the key's history: a takeover on a route that
    /// releases unknown outcomes, an operator's release, retention expiry.
    /// Each starts a new epoch, in which the key may execute once more.
    pub epoch: u8,
    /// A replay answered something other than its epoch's execution.
    pub bad_replay: bool,
    /// A write applied with a token that was not the record's.
    pub stale_write: bool,
    /// The record completed with an answer of another epoch.
    pub foreign_answer: bool,
    /// `keys release` without `--force` removed a record whose upstream may
    /// still be working (inquiring, its first question not yet due).
    pub unsafe_release: bool,
    /// A key ended `held`.
    pub held: bool,
    /// An inquiry found the upstream had acted, and recorded it.
    pub inquiry_acted: bool,
    /// An inquiry found the upstream had not acted, and released the key.
    pub inquiry_not_acted: bool,
}

/// What is left of the bounded adversary: each bound keeps the explored
/// space finite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Budget {
    /// Leases that may still lapse.
    pub lapses: u8,
    /// Gateway crashes left.
    pub crashes: u8,
    /// Operator releases left.
    pub operator: u8,
    /// Inquirer stalls left.
    pub inquirer_lapses: u8,
}

/// The whole world, one state of the model.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct World {
    /// The store's record, if any.
    pub record: Option<Record>,
    /// The store's token counter: the next token it hands out.
    pub next_token: Token,
    /// The client's requests with the key.
    pub attempts: Vec<Attempt>,
    /// The upstream.
    pub upstream: Upstream,
    /// The tokens inquirers took questions with and still hold (one may
    /// have stalled while another took the key again).
    pub inquirers: Vec<Token>,
    /// What happened.
    pub ledger: Ledger,
    /// What the adversary may still do.
    pub budget: Budget,
}
