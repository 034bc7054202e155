//! The model: every action the world allows in a state, and what it
//! becomes after one. The store's decisions are the core's own
//! transitions ([`Rules`]); the gateways, the upstream, the inquirer, the
//! operator and time are the adversary, bounded by [`Budget`].

use idemgate_core::transitions::{ClaimStep, Write};
use idemgate_core::{HeldReason, Token, UnknownOutcome};

use crate::rules::Rules;
use crate::world::{
    Answer, Attempt, AttemptIx, Budget, Effect, Lease, Ledger, Queued, Rec, Record, Stage,
    Upstream, World,
};

/// The model of one key under one route's policy.
#[derive(Debug, Clone)]
pub struct RecordModel {
    /// The rules the store applies (possibly mutated).
    pub rules: Rules,
    /// One client request per entry, with its fingerprint (the same
    /// number: the same request; another: another request, same key).
    pub fingerprints: Vec<u8>,
    /// The adversary's bounds.
    pub budget: Budget,
    /// Check only this property (a negative control: the checker stops at
    /// the first counterexample, the shortest).
    pub only: Option<&'static str>,
}

/// What the inquirer's lookup answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reply {
    /// The truth: the upstream acted (and how), or it did not.
    Honest,
    /// "Still processing": ask again later.
    StillProcessing,
    /// No answer that settles it, for too long: give up (held).
    GiveUp,
}

/// One step of the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A gateway claims the key for this request.
    Claim(AttemptIx),
    /// It forwards the claimed request.
    Forward(AttemptIx),
    /// It renews its lease (after it lapsed: a stalled gateway resumes).
    Renew(AttemptIx),
    /// The upstream acts on (or, fenced, refuses) this request; its answer
    /// reaches the gateway unless `lost`.
    Handle {
        /// Whose request.
        attempt: AttemptIx,
        /// The answer is lost on the way back.
        lost: bool,
    },
    /// The exchange breaks; `reached`: the request reached the upstream,
    /// which may still act on it.
    Break {
        /// Whose exchange.
        attempt: AttemptIx,
        /// The request is at the upstream.
        reached: bool,
    },
    /// The gateway writes the outcome and answers the client (step 7).
    Settle(AttemptIx),
    /// The gateway crashes.
    Crash(AttemptIx),
    /// The record's lease lapses.
    Lapse,
    /// Time passes the route's `after` (or `every`): a question is due.
    Due,
    /// Retention removes the record.
    Expire,
    /// An inquirer takes the due question (a new token).
    Take,
    /// The inquirer holding this token asks, and settles by the reply.
    Ask(Token, Reply),
    /// An inquirer stalls: its question falls due again while it still
    /// holds its (now old) token.
    InquirerLapse,
    /// `idemgate keys release`.
    Release {
        /// `--force`.
        force: bool,
    },
}

impl RecordModel {
    /// A model of `fingerprints.len()` requests under `rules`.
    pub fn new(rules: Rules, fingerprints: Vec<u8>, budget: Budget) -> Self {
        Self {
            rules,
            fingerprints,
            budget,
            only: None,
        }
    }

    /// The world before anything happened.
    pub fn initial(&self) -> World {
        World {
            record: None,
            next_token: 1,
            attempts: self
                .fingerprints
                .iter()
                .map(|&fingerprint| Attempt {
                    fingerprint,
                    stage: Stage::Ready,
                    epoch: 0,
                })
                .collect(),
            upstream: Upstream::default(),
            inquirers: Vec::new(),
            ledger: Ledger::default(),
            budget: self.budget,
        }
    }

    /// Every action `world` allows.
    pub fn enabled(&self, world: &World, actions: &mut Vec<Action>) {
        for (i, attempt) in world.attempts.iter().enumerate() {
            let i = i as AttemptIx;
            self.gateway_actions(world, i, attempt, actions);
        }
        for queued in &world.upstream.queue {
            actions.push(Action::Handle {
                attempt: queued.attempt,
                lost: false,
            });
            if queued.connected {
                actions.push(Action::Handle {
                    attempt: queued.attempt,
                    lost: true,
                });
            }
        }
        for &token in &world.inquirers {
            let mut replies = vec![Reply::Honest];
            let asked = world.record.map_or(0, |r| r.asked);
            if asked < 2 {
                replies.push(Reply::StillProcessing);
            }
            if asked >= 1 {
                replies.push(Reply::GiveUp);
            }
            actions.extend(replies.into_iter().map(|reply| Action::Ask(token, reply)));
        }
        if let Some(record) = world.record {
            self.record_actions(world, &record, actions);
        }
    }

    fn gateway_actions(
        &self,
        world: &World,
        i: AttemptIx,
        attempt: &Attempt,
        actions: &mut Vec<Action>,
    ) {
        let crash = world.budget.crashes > 0;
        match attempt.stage {
            Stage::Ready => actions.push(Action::Claim(i)),
            Stage::Claimed(token) | Stage::Waiting(token) => {
                if matches!(attempt.stage, Stage::Claimed(_)) {
                    actions.push(Action::Forward(i));
                } else if world.upstream.queue.iter().any(|q| q.attempt == i) {
                    actions.push(Action::Break {
                        attempt: i,
                        reached: false,
                    });
                    actions.push(Action::Break {
                        attempt: i,
                        reached: true,
                    });
                }
                let lapsed = world.record.is_some_and(|r| {
                    r.token == token && matches!(r.state, Rec::InFlight(l) if l != Lease::Live)
                });
                if lapsed {
                    actions.push(Action::Renew(i));
                }
                if crash {
                    actions.push(Action::Crash(i));
                }
            }
            Stage::Answered(..) | Stage::Broken(_) => {
                actions.push(Action::Settle(i));
                if crash {
                    actions.push(Action::Crash(i));
                }
            }
            Stage::Finished(_) | Stage::Crashed => {}
        }
    }

    fn record_actions(&self, world: &World, record: &Record, actions: &mut Vec<Action>) {
        let inquires = self.rules.policy == UnknownOutcome::Inquire;
        let held_by_inquirer = world.inquirers.contains(&record.token);
        match record.state {
            // A crashed or finished holder's lease always lapses; a live
            // one's only when it stalls (bounded).
            Rec::InFlight(Lease::Live) if world.budget.lapses > 0 || !holder_live(world) => {
                actions.push(Action::Lapse)
            }
            Rec::InFlight(Lease::Lapsed) if inquires => actions.push(Action::Due),
            Rec::Inquiring { due: false } if !held_by_inquirer => actions.push(Action::Due),
            Rec::Inquiring { due: false } if world.budget.inquirer_lapses > 0 => {
                actions.push(Action::InquirerLapse)
            }
            _ => {}
        }
        if inquires && self.rules.take_applies(record) {
            actions.push(Action::Take);
        }
        if self.rules.expirable(record) {
            actions.push(Action::Expire);
        }
        let operator_sees = matches!(record.state, Rec::Held(_) | Rec::Inquiring { .. });
        if operator_sees && world.budget.operator > 0 {
            for force in [false, true] {
                if self.rules.clearable(record, force) {
                    actions.push(Action::Release { force });
                }
            }
        }
    }

    /// The world after `action`.
    pub fn step(&self, world: &World, action: Action) -> World {
        let mut w = world.clone();
        match action {
            Action::Claim(i) => self.claim(&mut w, i),
            Action::Forward(i) => forward(&mut w, i),
            Action::Renew(i) => self.renew(&mut w, i),
            Action::Handle { attempt, lost } => handle(&mut w, attempt, lost),
            Action::Break { attempt, reached } => broken(&mut w, attempt, reached),
            Action::Settle(i) => self.settle(&mut w, i),
            Action::Crash(i) => {
                w.budget.crashes -= 1;
                w.attempts[i as usize].stage = Stage::Crashed;
                disconnect(&mut w, i);
            }
            Action::Lapse => {
                if holder_live(&w) {
                    w.budget.lapses -= 1;
                }
                set_state(&mut w, Rec::InFlight(Lease::Lapsed));
            }
            Action::Due => match w.record.map(|r| r.state) {
                Some(Rec::InFlight(_)) => set_state(&mut w, Rec::InFlight(Lease::LapsedDue)),
                _ => set_state(&mut w, Rec::Inquiring { due: true }),
            },
            Action::InquirerLapse => {
                w.budget.inquirer_lapses -= 1;
                set_state(&mut w, Rec::Inquiring { due: true });
            }
            Action::Expire => {
                w.record = None;
                w.ledger.epoch += 1;
            }
            Action::Take => {
                let token = new_token(&mut w);
                if let Some(record) = w.record.as_mut() {
                    record.token = token;
                    record.state = Rec::Inquiring { due: false };
                }
                w.inquirers.push(token);
            }
            Action::Ask(token, reply) => self.ask(&mut w, token, reply),
            Action::Release { force } => {
                w.budget.operator -= 1;
                let record = w.record.take().expect("released only when present");
                if !force
                    && matches!(record.state, Rec::Inquiring { due: false })
                    && record.asked == 0
                {
                    w.ledger.unsafe_release = true;
                }
                w.ledger.epoch += 1;
            }
        }
        w
    }

    fn claim(&self, w: &mut World, i: AttemptIx) {
        let fingerprint = w.attempts[i as usize].fingerprint;
        let step = self.rules.claim(w.record.as_ref(), fingerprint);
        let answer = match step {
            ClaimStep::Insert | ClaimStep::TakeOver => {
                // A takeover of a lapsed lease on a route that releases
                // unknown outcomes licenses a second execution: a new
                // epoch. Over a live lease it licenses nothing.
                let lapsed =
                    matches!(w.record.map(|r| r.state), Some(Rec::InFlight(l)) if l != Lease::Live);
                if step == ClaimStep::TakeOver && lapsed {
                    w.ledger.epoch += 1;
                }
                let token = new_token(w);
                w.record = Some(Record {
                    state: Rec::InFlight(Lease::Live),
                    token,
                    fingerprint,
                    asked: 0,
                    epoch: w.ledger.epoch,
                });
                let attempt = &mut w.attempts[i as usize];
                attempt.stage = Stage::Claimed(token);
                attempt.epoch = w.ledger.epoch;
                return;
            }
            ClaimStep::Mismatch => Answer::Mismatch,
            ClaimStep::Replay => self.replay(w),
            ClaimStep::Held(_) => Answer::Held,
            ClaimStep::HoldLapsed => {
                set_state(w, Rec::Held(HeldReason::LeaseLapsed));
                w.ledger.held = true;
                Answer::Held
            }
            ClaimStep::InFlight(_) | ClaimStep::Inquiring(_) => Answer::Conflict,
            ClaimStep::InquireLapsed => {
                let due = matches!(
                    w.record.map(|r| r.state),
                    Some(Rec::InFlight(Lease::LapsedDue))
                );
                set_state(w, Rec::Inquiring { due });
                Answer::Conflict
            }
        };
        w.attempts[i as usize].stage = Stage::Finished(answer);
    }

    /// A replay: the recorded answer, which must be its epoch's execution.
    fn replay(&self, w: &mut World) -> Answer {
        let Some(Record {
            state: Rec::Completed(n),
            epoch,
            ..
        }) = w.record
        else {
            unreachable!("a replay is of a completed record")
        };
        if w.upstream.effects.get(n as usize - 1).map(|e| e.epoch) != Some(epoch) {
            w.ledger.bad_replay = true;
        }
        Answer::Replayed(n)
    }

    fn renew(&self, w: &mut World, i: AttemptIx) {
        let token = match w.attempts[i as usize].stage {
            Stage::Claimed(t) | Stage::Waiting(t) => t,
            _ => return,
        };
        self.attempt_write(w, Write::Renew, token, Rec::InFlight(Lease::Live));
    }

    /// Step 7 for an attempt with its exchange's outcome.
    fn settle(&self, w: &mut World, i: AttemptIx) {
        let answer = match w.attempts[i as usize].stage {
            Stage::Answered(token, Some(n)) => {
                if self.attempt_write(w, Write::Complete, token, Rec::Completed(n)) {
                    self.check_answer(w, n);
                }
                Answer::Forwarded(n)
            }
            Stage::Answered(token, None) => {
                // Refused: nothing executed, so nothing is licensed.
                self.attempt_remove(w, token);
                Answer::Refused
            }
            Stage::Broken(token) => {
                match self.rules.policy {
                    UnknownOutcome::Hold => {
                        let held = Rec::Held(HeldReason::UpstreamFailed);
                        if self.attempt_write(w, Write::Hold, token, held) {
                            w.ledger.held = true;
                        }
                    }
                    UnknownOutcome::Release => {
                        // The route's policy licenses the next request to
                        // execute again: a new epoch.
                        if self.attempt_remove(w, token) {
                            w.ledger.epoch += 1;
                        }
                    }
                    UnknownOutcome::Inquire => {
                        let inquiring = Rec::Inquiring { due: false };
                        self.attempt_write(w, Write::Inquire, token, inquiring);
                    }
                }
                Answer::Failed
            }
            _ => unreachable!("settled only with an outcome"),
        };
        w.attempts[i as usize].stage = Stage::Finished(answer);
    }

    /// A recorded answer must be the execution of the record's epoch.
    fn check_answer(&self, w: &mut World, n: u8) {
        let epoch = w.record.map(|r| r.epoch);
        if w.upstream.effects.get(n as usize - 1).map(|e| e.epoch) != epoch {
            w.ledger.foreign_answer = true;
        }
    }

    /// An attempt's compare-and-set write turning the record to `state`.
    fn attempt_write(&self, w: &mut World, write: Write, token: Token, state: Rec) -> bool {
        let Some(record) = w.record.as_mut() else {
            return false;
        };
        if !self.rules.write_applies(write, token, record) {
            return false;
        }
        if token != record.token {
            w.ledger.stale_write = true;
        }
        record.state = state;
        true
    }

    /// An attempt's release: the record removed, if the write applies.
    fn attempt_remove(&self, w: &mut World, token: Token) -> bool {
        let Some(record) = w.record else {
            return false;
        };
        if !self.rules.write_applies(Write::Release, token, &record) {
            return false;
        }
        if token != record.token {
            w.ledger.stale_write = true;
        }
        w.record = None;
        true
    }

    /// The inquirer holding `token` asks, and settles the key by the reply.
    fn ask(&self, w: &mut World, token: Token, reply: Reply) {
        w.inquirers.retain(|&t| t != token);
        let Some(record) = w.record else { return };
        let (write, state) = match reply {
            Reply::Honest => {
                let acted = w
                    .upstream
                    .effects
                    .iter()
                    .position(|e| e.epoch == record.epoch);
                match acted {
                    Some(ix) => (Write::Complete, Some(Rec::Completed(ix as u8 + 1))),
                    None => {
                        // "Never acted, and never will": the lookup fences
                        // every attempt up to the question's token first.
                        w.upstream.fence = w.upstream.fence.max(token);
                        (Write::Release, None)
                    }
                }
            }
            Reply::StillProcessing => (Write::Inquire, Some(Rec::Inquiring { due: false })),
            Reply::GiveUp => (Write::Hold, Some(Rec::Held(HeldReason::InquiryGaveUp))),
        };
        if !self.rules.inquiry_write_applies(write, token, &record) {
            return;
        }
        if token != record.token {
            w.ledger.stale_write = true;
        }
        match state {
            None => {
                w.record = None;
                w.ledger.inquiry_not_acted = true;
            }
            Some(state) => {
                let record = w.record.as_mut().expect("present above");
                record.state = state;
                match state {
                    Rec::Completed(n) => {
                        w.ledger.inquiry_acted = true;
                        self.check_answer(w, n);
                    }
                    Rec::Held(_) => w.ledger.held = true,
                    _ => record.asked += 1,
                }
            }
        }
    }
}

/// Whether a gateway still runs the attempt that holds the record's token.
fn holder_live(w: &World) -> bool {
    let Some(record) = w.record else {
        return false;
    };
    w.attempts.iter().any(|a| match a.stage {
        Stage::Claimed(t) | Stage::Waiting(t) | Stage::Answered(t, _) | Stage::Broken(t) => {
            t == record.token
        }
        _ => false,
    })
}

fn new_token(w: &mut World) -> Token {
    let token = w.next_token;
    w.next_token += 1;
    token
}

fn set_state(w: &mut World, state: Rec) {
    if let Some(record) = w.record.as_mut() {
        record.state = state;
    }
}

/// The claimed request goes to the upstream.
fn forward(w: &mut World, i: AttemptIx) {
    let Stage::Claimed(token) = w.attempts[i as usize].stage else {
        return;
    };
    w.attempts[i as usize].stage = Stage::Waiting(token);
    w.upstream.queue.push(Queued {
        attempt: i,
        token,
        connected: true,
    });
}

/// The upstream takes this request off its queue: refused if a lookup
/// fenced its token, executed otherwise; the answer goes back if the
/// exchange still stands and is not `lost`.
fn handle(w: &mut World, i: AttemptIx, lost: bool) {
    let Some(at) = w.upstream.queue.iter().position(|q| q.attempt == i) else {
        return;
    };
    let queued = w.upstream.queue.remove(at);
    let attempt = w.attempts[i as usize];
    let answer = if queued.token <= w.upstream.fence {
        None
    } else {
        w.upstream.effects.push(Effect {
            epoch: attempt.epoch,
            fingerprint: attempt.fingerprint,
        });
        Some(w.upstream.effects.len() as u8)
    };
    if queued.connected && attempt.stage == Stage::Waiting(queued.token) {
        w.attempts[i as usize].stage = if lost {
            Stage::Broken(queued.token)
        } else {
            Stage::Answered(queued.token, answer)
        };
    }
}

/// The exchange breaks.
fn broken(w: &mut World, i: AttemptIx, reached: bool) {
    let Stage::Waiting(token) = w.attempts[i as usize].stage else {
        return;
    };
    w.attempts[i as usize].stage = Stage::Broken(token);
    if reached {
        disconnect(w, i);
    } else {
        w.upstream.queue.retain(|q| q.attempt != i);
    }
}

/// The request stays at the upstream, but its answer has nowhere to go.
fn disconnect(w: &mut World, i: AttemptIx) {
    for queued in w.upstream.queue.iter_mut().filter(|q| q.attempt == i) {
        queued.connected = false;
    }
}
