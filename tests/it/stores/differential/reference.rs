//! The reference every store is compared with: the core's own rules
//! (`idemgate::store::transitions`, the functions the model checker
//! checks) applied to records on a clock that moves only when a case says
//! so. What the rules leave to the store (when a lease ends, how long a
//! record is kept) is written here once, as the `Store` and `StoreAdmin`
//! documentation says it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use idemgate::config::UnknownOutcome;
use idemgate::store::transitions::{self, ClaimStep, Phase, Write};
use idemgate::store::{Cas, HeldReason};

use super::ops::Key;

/// A token as the reference numbers them (1, 2, …, per case); 0 was never
/// issued. The harness maps each to the store's own.
pub type RefToken = u64;

/// A record's state, on the reference's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    InFlight {
        lease_until: Duration,
    },
    Completed(u8),
    Held(HeldReason),
    Inquiring {
        due: Duration,
        asked: u32,
        since: Duration,
    },
}

/// A record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub fingerprint: u8,
    pub token: RefToken,
    pub attempt: u64,
    pub state: State,
    pub expires_at: Duration,
}

impl Record {
    /// Its state as the rules see it at `now`.
    pub fn phase(&self, now: Duration) -> Phase {
        match self.state {
            State::InFlight { lease_until } => Phase::in_flight(lease_until.saturating_sub(now)),
            State::Completed(_) => Phase::Completed,
            State::Held(reason) => Phase::Held(reason),
            State::Inquiring { due, .. } => Phase::inquiring(due.saturating_sub(now)),
        }
    }

    fn asked(&self) -> u32 {
        match self.state {
            State::Inquiring { asked, .. } => asked,
            _ => 0,
        }
    }

    /// How long ago its lease lapsed (zero unless in flight and lapsed).
    fn lapsed_for(&self, now: Duration) -> Duration {
        match self.state {
            State::InFlight { lease_until } => now.saturating_sub(lease_until),
            _ => Duration::ZERO,
        }
    }
}

/// What an operation answers, as the reference expects it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Claimed {
        token: RefToken,
        takeover: bool,
    },
    Replay(u8),
    /// Time left on the lease; the time the record is kept.
    InFlight(Duration, Duration),
    /// The time the record is kept (this and below).
    Mismatch(Duration),
    Held(HeldReason, Duration),
    /// Time until the question; the time the record is kept.
    Inquiring(Duration, Duration),
    Cas(Cas),
    /// A removal (clear, delete): whether the record went.
    Removed(bool),
    /// A removal of a record past its retention: a store may still hold it
    /// until swept (and remove it now) or have let it go already.
    RemovedEither,
    /// The questions taken: key, new token, asked, inquiring for.
    Taken(Vec<(Key, RefToken, u32, Duration)>),
    Aged,
}

/// The reference store of one case.
#[derive(Debug)]
pub struct Reference {
    pub now: Duration,
    /// The route's `after` and retention, as the inquirer takes with them.
    pub after: Duration,
    pub route_retention: Duration,
    last_token: RefToken,
    pub records: BTreeMap<Key, Record>,
    /// Keys whose record passed its retention since it was last written:
    /// gone for every purpose, though a store may show it until swept.
    pub expired: BTreeSet<Key>,
}

impl Reference {
    pub fn new(after: Duration, route_retention: Duration) -> Self {
        Self {
            now: Duration::ZERO,
            after,
            route_retention,
            last_token: 0,
            records: BTreeMap::new(),
            expired: BTreeSet::new(),
        }
    }

    fn next_token(&mut self) -> RefToken {
        self.last_token += 1;
        self.last_token
    }

    /// Drop every record past its retention and not held by a live lease
    /// (`transitions::expired`).
    pub fn purge(&mut self) {
        let now = self.now;
        let gone: Vec<Key> = self
            .records
            .iter()
            .filter(|(_, r)| transitions::expired(r.expires_at <= now, r.phase(now)))
            .map(|(k, _)| *k)
            .collect();
        for key in gone {
            self.records.remove(&key);
            self.expired.insert(key);
        }
    }

    /// How long the record under `key` is kept from now
    /// (`transitions::kept_for`).
    fn kept_for(&self, key: Key) -> Duration {
        let r = &self.records[&key];
        transitions::kept_for(r.expires_at.saturating_sub(self.now), r.phase(self.now))
    }

    /// A new record under `key`.
    fn write_new(&mut self, key: Key, record: Record) {
        self.expired.remove(&key);
        self.records.insert(key, record);
    }

    #[allow(clippy::too_many_arguments)]
    pub fn claim(
        &mut self,
        key: Key,
        fingerprint: u8,
        attempt: u64,
        lease: Duration,
        retention: Duration,
        policy: UnknownOutcome,
        after: Duration,
    ) -> Answer {
        self.purge();
        let now = self.now;
        let found = self
            .records
            .get(&key)
            .map(|r| (r.phase(now), r.fingerprint == fingerprint));
        match transitions::claim(found, policy) {
            ClaimStep::Insert => {
                let token = self.next_token();
                let record = Record {
                    fingerprint,
                    token,
                    attempt,
                    state: State::InFlight {
                        lease_until: now + lease,
                    },
                    expires_at: now + retention,
                };
                self.write_new(key, record);
                Answer::Claimed {
                    token,
                    takeover: false,
                }
            }
            ClaimStep::Mismatch => Answer::Mismatch(self.kept_for(key)),
            ClaimStep::Replay => match self.records[&key].state {
                State::Completed(response) => Answer::Replay(response),
                ref other => unreachable!("replay of {other:?}"),
            },
            ClaimStep::Held(reason) => Answer::Held(reason, self.kept_for(key)),
            ClaimStep::InFlight(left) => Answer::InFlight(left, self.kept_for(key)),
            ClaimStep::Inquiring(left) => Answer::Inquiring(left, self.kept_for(key)),
            ClaimStep::TakeOver => {
                let token = self.next_token();
                let r = self.records.get_mut(&key).expect("found");
                r.token = token;
                r.attempt = attempt;
                r.state = State::InFlight {
                    lease_until: now + lease,
                };
                r.expires_at = r.expires_at.max(now + lease);
                Answer::Claimed {
                    token,
                    takeover: true,
                }
            }
            ClaimStep::HoldLapsed => {
                let r = self.records.get_mut(&key).expect("found");
                r.state = State::Held(HeldReason::LeaseLapsed);
                Answer::Held(HeldReason::LeaseLapsed, self.kept_for(key))
            }
            ClaimStep::InquireLapsed => {
                let r = self.records.get_mut(&key).expect("found");
                let State::InFlight { lease_until } = r.state else {
                    unreachable!("only a lapsed lease turns inquiring on a claim")
                };
                let next = transitions::lapsed_question_in(r.lapsed_for(now), after);
                r.state = State::Inquiring {
                    due: now + next,
                    asked: 0,
                    since: lease_until,
                };
                r.expires_at = r.expires_at.max(now + retention);
                Answer::Inquiring(next, self.kept_for(key))
            }
        }
    }

    /// An attempt's write by `token`, applied with `apply` if
    /// `transitions::write_applies`; a release removes the record.
    fn write(
        &mut self,
        key: Key,
        token: RefToken,
        write: Write,
        apply: impl FnOnce(&mut Record, Duration),
    ) -> Answer {
        self.purge();
        let now = self.now;
        let Some(r) = self.records.get_mut(&key) else {
            return Answer::Cas(Cas::Fenced);
        };
        if !transitions::write_applies(write, r.token == token, r.phase(now)) {
            return Answer::Cas(Cas::Fenced);
        }
        if write == Write::Release {
            self.records.remove(&key);
        } else {
            apply(r, now);
        }
        Answer::Cas(Cas::Applied)
    }

    pub fn renew(&mut self, key: Key, token: RefToken, lease: Duration) -> Answer {
        self.write(key, token, Write::Renew, |r, now| {
            r.state = State::InFlight {
                lease_until: now + lease,
            };
            // A live lease outlives retention.
            r.expires_at = r.expires_at.max(now + lease);
        })
    }

    pub fn complete(
        &mut self,
        key: Key,
        token: RefToken,
        response: u8,
        retention: Duration,
    ) -> Answer {
        self.write(key, token, Write::Complete, |r, now| {
            r.state = State::Completed(response);
            r.expires_at = now + retention;
        })
    }

    pub fn release(&mut self, key: Key, token: RefToken) -> Answer {
        self.write(key, token, Write::Release, |_, _| {})
    }

    pub fn hold(
        &mut self,
        key: Key,
        token: RefToken,
        reason: HeldReason,
        retention: Duration,
    ) -> Answer {
        self.write(key, token, Write::Hold, |r, now| {
            r.state = State::Held(reason);
            r.expires_at = now + retention;
        })
    }

    pub fn inquire(
        &mut self,
        key: Key,
        token: RefToken,
        next: Duration,
        asked: bool,
        retention: Duration,
    ) -> Answer {
        self.write(key, token, Write::Inquire, |r, now| {
            let (count, since) = match r.state {
                State::Inquiring { asked, since, .. } => (asked, since),
                _ => (0, now),
            };
            r.state = State::Inquiring {
                due: now + next,
                asked: count + u32::from(asked),
                since,
            };
            r.expires_at = r.expires_at.max(now + retention);
        })
    }

    pub fn abandon(&mut self, key: Key, attempt: u64) -> Answer {
        self.purge();
        let now = self.now;
        let applies = self
            .records
            .get(&key)
            .is_some_and(|r| transitions::abandon_applies(r.attempt == attempt, r.phase(now)));
        if applies {
            self.records.remove(&key);
        }
        Answer::Cas(if applies { Cas::Applied } else { Cas::Fenced })
    }

    /// `keys release` (`delete`: false) or `keys delete` (true).
    pub fn remove(&mut self, key: Key, force: bool, delete: bool) -> Answer {
        self.purge();
        let now = self.now;
        let Some(r) = self.records.get(&key) else {
            return if self.expired.contains(&key) {
                Answer::RemovedEither
            } else {
                Answer::Removed(false)
            };
        };
        let (phase, asked) = (r.phase(now), r.asked());
        let allowed = if delete {
            transitions::deletable(phase, asked, force)
        } else {
            transitions::clearable(phase, asked, force)
        };
        if allowed {
            self.records.remove(&key);
        }
        Answer::Removed(allowed)
    }

    /// The inquirer takes every due question of the route, each with a new
    /// token and a lease of `lease` (`StoreAdmin::take_inquiries`).
    pub fn take(&mut self, lease: Duration) -> Answer {
        self.purge();
        let now = self.now;
        let (after, retention) = (self.after, self.route_retention);
        let due: Vec<Key> = self
            .records
            .iter()
            .filter(|(_, r)| transitions::take_applies(r.phase(now), r.lapsed_for(now), after))
            .map(|(k, _)| *k)
            .collect();
        let mut taken = Vec::new();
        for key in due {
            let token = self.next_token();
            let r = self.records.get_mut(&key).expect("listed above");
            let (asked, since) = match r.state {
                State::Inquiring { asked, since, .. } => (asked, since),
                // Reckoned from the lapse, as a claim would have.
                State::InFlight { lease_until } => (0, lease_until),
                ref other => unreachable!("taken: {other:?}"),
            };
            r.state = State::Inquiring {
                due: now + lease,
                asked,
                since,
            };
            r.token = token;
            r.expires_at = r.expires_at.max(now + retention);
            taken.push((key, token, asked, now - since));
        }
        Answer::Taken(taken)
    }

    /// How many of the route's keys are inquiring (and not expired).
    pub fn inquiring(&mut self) -> u64 {
        self.purge();
        let inquiring = self
            .records
            .values()
            .filter(|r| matches!(r.state, State::Inquiring { .. }));
        inquiring.count() as u64
    }

    pub fn age(&mut self, by: Duration) -> Answer {
        self.now += by;
        Answer::Aged
    }
}
