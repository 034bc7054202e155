//! Every store held to the rules (docs/src/design/state-machine.md,
//! "Every store against the rules"): proptest generates cases (claims with
//! one fingerprint or another, completions, holds, releases, inquiries
//! and the inquirer's takes, renewals, abandons, operators' releases and
//! deletes, tokens current, stale and never issued, and a clock that moves
//! leases, questions and retention), runs each against the core's
//! transitions ([`reference`]) and against a store, and compares every
//! answer and, after every step, both keys' records. Time moves by
//! `StoreAdmin::age` (the `test-hooks` feature), never by sleeping.
//!
//! A divergence fails the test with the shortest case proptest shrinks it
//! to, one numbered step per line. The negative control replaces the
//! PostgreSQL claim, in its own test database, with a copy whose checks
//! are in the wrong order, and must be found.
//!
//! `IDEMGATE_DIFFERENTIAL_CASES` (default 128) and
//! `IDEMGATE_DIFFERENTIAL_SEED` (a number; default fixed, so CI runs the
//! same cases every time) explore further.

mod control;
mod found;
mod ops;
mod reference;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use idemgate::store::{
    AttemptId, Backend as Store, Claim, ClaimRequest, InquiringRoute, RecordInfo, RecordKey,
    RecordState, StoredResponse, Token,
};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use crate::support::{Backend, TestStore, per_backend};
use ops::{Case, Key, Op, Pick, tens, units};
use reference::{Answer, RefToken, Reference, State};

/// How far a store's durations may stray from the reference's, besides
/// the real time the case has taken so far (the store's clock runs on
/// while the reference's stands still): rounding and the way back.
const SLACK: Duration = Duration::from_secs(1);

/// The real time a case may take: its durations are compared within
/// [`SLACK`] and that, which must stay below the ten seconds between any
/// two boundaries of a case ([`ops::tens`]).
const MOST_REAL_TIME: Duration = Duration::from_secs(8);

/// Steps in a case, at most.
const MOST_STEPS: usize = 24;

/// A recorded response, `n` telling them apart.
fn response(n: u8) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.append("x-response", HeaderValue::from(u16::from(n)));
    headers.append("x-multi", HeaderValue::from_static("a"));
    headers.append("x-multi", HeaderValue::from_static("b"));
    StoredResponse {
        status: StatusCode::from_u16(200 + u16::from(n)).expect("a status"),
        headers,
        body: Bytes::from(format!("response {n}")),
    }
}

fn fingerprint(n: u8) -> [u8; 32] {
    [n + 1; 32]
}

/// An attempt id no claim of any case uses.
const NO_ATTEMPT: AttemptId = i64::MAX;

/// What a store may do that the rules leave open.
#[derive(Debug, Clone, Copy)]
pub(super) struct Leeway {
    /// The store takes due questions in more than one pass (PostgreSQL
    /// skips a record another transaction holds; the front's relay holds
    /// one for a moment).
    take_passes: usize,
    /// The store may state a shorter time a record is kept than the rules
    /// (never a longer one): the front's entries end no later than their
    /// records, by instants the instances wrote, and its test hook may age
    /// one twice when the relay rewrites it meanwhile.
    early_expiry: bool,
}

impl Leeway {
    pub(super) fn of(b: Backend) -> Self {
        let front = b == Backend::Front;
        Self {
            take_passes: if front { 20 } else { 1 },
            early_expiry: front,
        }
    }
}

/// One case against one store.
struct Run<'a> {
    store: &'a dyn Store,
    route: String,
    case: u64,
    reference: Reference,
    /// The route's policy.
    policy: idemgate::config::UnknownOutcome,
    /// Every token issued per key, in order: the reference's and the store's.
    tokens: BTreeMap<Key, Vec<(RefToken, Token)>>,
    /// Every attempt that claimed each key, in order.
    attempts: BTreeMap<Key, Vec<AttemptId>>,
    /// What the store may do that the rules leave open.
    leeway: Leeway,
    /// When the case started, in real time.
    started: std::time::Instant,
}

impl Run<'_> {
    /// How far the store's durations may stray now.
    fn slack(&self) -> Duration {
        SLACK + self.started.elapsed()
    }

    fn within(&self, expected: Duration, actual: Duration) -> bool {
        expected.abs_diff(actual) <= self.slack()
    }

    /// Whether the store's stated time a record is kept agrees: never
    /// more than the rules say; no less either, unless the store may say
    /// less ([`Leeway::early_expiry`]).
    fn kept(&self, expected: Duration, actual: Duration) -> bool {
        actual <= expected + self.slack()
            && (self.leeway.early_expiry || self.within(expected, actual))
    }

    /// The case's route, as an inquirer asks for it.
    fn routes(&self) -> [InquiringRoute; 1] {
        [InquiringRoute {
            name: self.route.clone(),
            retention: self.reference.route_retention,
            after: self.reference.after,
        }]
    }

    fn key(&self, key: Key) -> RecordKey {
        RecordKey {
            route: self.route.clone(),
            scope: Vec::new(),
            key: key.name().to_string(),
        }
    }

    fn token(&self, key: Key, pick: Pick) -> (RefToken, Token) {
        let issued = self.tokens.get(&key).map(Vec::as_slice).unwrap_or_default();
        match (pick, issued) {
            // Above every token: a store that fences with `>=` would let it in.
            (Pick::Future, _) => (RefToken::MAX, Token::MAX),
            (Pick::Never, _) | (_, []) => (0, 0),
            (Pick::Newest, issued) => issued[issued.len() - 1],
            (Pick::Issued(n), issued) => issued[usize::from(n) % issued.len()],
        }
    }

    fn attempt(&self, key: Key, pick: Pick) -> AttemptId {
        let claimed = self
            .attempts
            .get(&key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        match (pick, claimed) {
            (Pick::Never | Pick::Future, _) | (_, []) => NO_ATTEMPT,
            (Pick::Newest, claimed) => claimed[claimed.len() - 1],
            (Pick::Issued(n), claimed) => claimed[usize::from(n) % claimed.len()],
        }
    }

    /// A token the store issued for `key`, which the reference numbers
    /// `expected`: newer than every token of the key before it (G7).
    fn issued(&mut self, key: Key, expected: RefToken, actual: Token) -> Result<(), String> {
        let tokens = self.tokens.entry(key).or_default();
        if let Some(&(_, newest)) = tokens.iter().max_by_key(|(_, t)| *t)
            && actual <= newest
        {
            return Err(format!(
                "token {actual} for {} is not newer than {newest}",
                key.name()
            ));
        }
        tokens.push((expected, actual));
        Ok(())
    }

    /// The store's token for the reference's `expected`.
    fn store_token(&self, key: Key, expected: RefToken) -> Option<Token> {
        self.tokens
            .get(&key)?
            .iter()
            .find(|(r, _)| *r == expected)
            .map(|(_, t)| *t)
    }

    async fn step(&mut self, index: usize, op: &Op) -> Result<(), String> {
        let store = self.store;
        let fail = |e: idemgate::store::StoreError| format!("the store failed: {e}");
        match *op {
            Op::Claim {
                key,
                fingerprint: f,
                lease,
                retention,
            } => {
                let policy = self.policy;
                let attempt = (self.case as i64 + 1) * 1000 + index as i64 + 1;
                self.attempts.entry(key).or_default().push(attempt);
                let inquire_after = if policy == idemgate::config::UnknownOutcome::Inquire {
                    self.reference.after
                } else {
                    Duration::ZERO
                };
                let (lease, retention) = (units(lease), units(retention));
                let expected = self.reference.claim(
                    key,
                    f,
                    attempt as u64,
                    lease,
                    retention,
                    policy,
                    inquire_after,
                );
                let record = self.key(key);
                let request = ClaimRequest {
                    key: &record,
                    fingerprint: &fingerprint(f),
                    attempt,
                    lease,
                    retention,
                    on_unknown_outcome: policy,
                    inquire_after,
                };
                let actual = store.claim(&request).await.map_err(fail)?;
                self.claimed(key, expected, actual)
            }
            Op::Renew { key, token, lease } => {
                let (r, t) = self.token(key, token);
                let expected = self.reference.renew(key, r, units(lease));
                let actual = store.renew(&self.key(key), t, units(lease)).await;
                same(expected, Answer::Cas(actual.map_err(fail)?))
            }
            Op::Complete {
                key,
                token,
                response: n,
                retention,
            } => {
                let (r, t) = self.token(key, token);
                let expected = self.reference.complete(key, r, n, units(retention));
                let actual = store
                    .complete(&self.key(key), t, &response(n), units(retention))
                    .await;
                same(expected, Answer::Cas(actual.map_err(fail)?))
            }
            Op::Release { key, token } => {
                let (r, t) = self.token(key, token);
                let expected = self.reference.release(key, r);
                let actual = store.release(&self.key(key), t).await;
                same(expected, Answer::Cas(actual.map_err(fail)?))
            }
            Op::Hold {
                key,
                token,
                reason,
                retention,
            } => {
                let (r, t) = self.token(key, token);
                let expected = self.reference.hold(key, r, reason, units(retention));
                let actual = store
                    .hold(&self.key(key), t, reason, units(retention))
                    .await;
                same(expected, Answer::Cas(actual.map_err(fail)?))
            }
            Op::Inquire {
                key,
                token,
                next,
                asked,
                retention,
            } => {
                let (r, t) = self.token(key, token);
                let (next, retention) = (units(next), units(retention));
                let expected = self.reference.inquire(key, r, next, asked, retention);
                let actual = store
                    .inquire(&self.key(key), t, next, asked, retention)
                    .await;
                same(expected, Answer::Cas(actual.map_err(fail)?))
            }
            Op::Abandon { key, attempt } => {
                let attempt = self.attempt(key, attempt);
                let expected = self.reference.abandon(key, attempt as u64);
                let actual = store.abandon(&self.key(key), attempt).await;
                same(expected, Answer::Cas(actual.map_err(fail)?))
            }
            // Only an inquiring route's questions are taken: an inquirer
            // asks for the routes whose policy is `inquire`.
            Op::Take { .. } if self.policy != idemgate::config::UnknownOutcome::Inquire => Ok(()),
            Op::Take { lease } => {
                let expected = self.reference.take(units(lease));
                self.take(expected, units(lease)).await
            }
            Op::Clear { key, force } | Op::Delete { key, force } => {
                let delete = matches!(op, Op::Delete { .. });
                let expected = self.reference.remove(key, force, delete);
                let record = self.key(key);
                let actual = if delete {
                    store.delete(&record, force).await
                } else {
                    store.clear(&record, force).await
                }
                .map_err(fail)?;
                match expected {
                    Answer::RemovedEither => Ok(()),
                    expected => same(expected, Answer::Removed(actual)),
                }
            }
            Op::Age { tens: n } => {
                self.reference.age(tens(n));
                for key in Key::ALL {
                    store.age(&self.key(key), tens(n)).await.map_err(fail)?;
                }
                Ok(())
            }
            Op::Sweep => {
                idemgate::sweep_once(store, 100, None).await.map_err(fail)?;
                let routes = self.routes();
                let expected = self.reference.inquiring();
                let actual = store.count_inquiring(&routes).await.map_err(fail)?;
                if expected == actual {
                    Ok(())
                } else {
                    Err(format!(
                        "the rules count {expected} inquiring, the store {actual}"
                    ))
                }
            }
        }
    }

    fn claimed(&mut self, key: Key, expected: Answer, actual: Claim) -> Result<(), String> {
        let agrees = match (&expected, &actual) {
            (
                Answer::Claimed {
                    token: r,
                    takeover: a,
                },
                Claim::Claimed { token, takeover },
            ) if a == takeover => return self.issued(key, *r, *token),
            (Answer::Replay(n), Claim::Replay(stored)) => *stored == response(*n),
            (
                Answer::InFlight(left, kept),
                Claim::InFlight {
                    retry_after,
                    expires_in,
                },
            ) => self.within(*left, *retry_after) && self.kept(*kept, *expires_in),
            (
                Answer::Inquiring(left, kept),
                Claim::Inquiring {
                    retry_after,
                    expires_in,
                },
            ) => self.within(*left, *retry_after) && self.kept(*kept, *expires_in),
            (Answer::Mismatch(kept), Claim::Mismatch { expires_in }) => {
                self.kept(*kept, *expires_in)
            }
            (Answer::Held(a, kept), Claim::Held { reason, expires_in }) => {
                a == reason && self.kept(*kept, *expires_in)
            }
            _ => false,
        };
        if agrees {
            Ok(())
        } else {
            Err(format!(
                "the rules answer {expected:?}, the store {actual:?}"
            ))
        }
    }

    async fn take(&mut self, expected: Answer, lease: Duration) -> Result<(), String> {
        let Answer::Taken(expected) = expected else {
            unreachable!("a take answers Taken")
        };
        let routes = self.routes();
        let mut actual = Vec::new();
        for pass in 0..self.leeway.take_passes {
            if pass > 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let taken = self
                .store
                .take_inquiries(&routes, lease, 10)
                .await
                .map_err(|e| format!("the store failed: {e}"))?;
            actual.extend(taken);
            if actual.len() >= expected.len() {
                break;
            }
        }
        let shown = |actual: &[idemgate::store::Inquiry]| {
            actual
                .iter()
                .map(|q| {
                    format!(
                        "{} (asked {}, for {:?})",
                        q.key.key, q.asked, q.inquiring_for
                    )
                })
                .collect::<Vec<_>>()
        };
        let diverges = || {
            format!(
                "the rules take {expected:?}, the store {:?}",
                shown(&actual)
            )
        };
        if actual.len() != expected.len() {
            return Err(diverges());
        }
        for &(key, r, asked, inquiring_for) in &expected {
            let Some(q) = actual.iter().find(|q| q.key == self.key(key)) else {
                return Err(diverges());
            };
            if q.asked != asked || !self.within(inquiring_for, q.inquiring_for) {
                return Err(diverges());
            }
            let token = q.token;
            self.issued(key, r, token)?;
        }
        Ok(())
    }

    /// Both keys' records, in the reference and in the store.
    async fn compare_records(&mut self) -> Result<(), String> {
        self.reference.purge();
        for key in Key::ALL {
            let info = self
                .store
                .inspect(&self.key(key))
                .await
                .map_err(|e| format!("the store failed to inspect: {e}"))?;
            let expected = self.reference.records.get(&key).cloned();
            let now = SystemTime::now();
            let gone = self.reference.expired.contains(&key);
            match (expected, info) {
                (None, None) => {}
                // Past retention: gone for every purpose, though the store
                // may keep it until swept.
                (None, Some(info)) if gone && looks_expired(&info, now, self.slack()) => {}
                (expected, info) => {
                    if let Some(problem) =
                        self.record_differs(expected.as_ref(), info.as_ref(), now)
                    {
                        return Err(format!(
                            "record {}: {problem}\n  rules: {expected:?} (now {:?})\n  store: {info:?}",
                            key.name(),
                            self.reference.now
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn record_differs(
        &self,
        expected: Option<&reference::Record>,
        info: Option<&RecordInfo>,
        now: SystemTime,
    ) -> Option<String> {
        let (r, info) = match (expected, info) {
            (Some(r), Some(info)) => (r, info),
            (None, Some(_)) => return Some("the store has it, the rules do not".into()),
            (Some(_), None) => return Some("the rules have it, the store does not".into()),
            (None, None) => return None,
        };
        let vnow = self.reference.now;
        let (state, lease, asked, status, reason) = match r.state {
            State::InFlight { lease_until } => {
                (RecordState::InFlight, Some(lease_until), None, None, None)
            }
            State::Completed(n) => (
                RecordState::Completed,
                None,
                None,
                Some(200 + u16::from(n)),
                None,
            ),
            State::Held(reason) => (RecordState::Held, None, None, None, Some(reason.as_str())),
            State::Inquiring { due, asked, .. } => {
                (RecordState::Inquiring, Some(due), Some(asked), None, None)
            }
        };
        if info.state != state {
            return Some(format!("state {:?}, not {state:?}", info.state));
        }
        if info.held_reason != reason {
            return Some(format!("held for {:?}, not {reason:?}", info.held_reason));
        }
        if state == RecordState::Completed && info.status != status {
            return Some(format!("status {:?}, not {status:?}", info.status));
        }
        if state == RecordState::Inquiring && info.inquiries != asked {
            return Some(format!("asked {:?}, not {asked:?}", info.inquiries));
        }
        if state != RecordState::InFlight
            && state != RecordState::Inquiring
            && info.lease_until.is_some()
        {
            return Some(format!(
                "a settled record with a lease or question: {:?}",
                info.lease_until
            ));
        }
        let key = Key::ALL
            .into_iter()
            .find(|k| k.name() == info.key)
            .expect("one of the case's keys");
        if self.store_token(key, r.token) != Some(info.token) {
            return Some(format!(
                "token {}, not the store's for the rules' {}",
                info.token, r.token
            ));
        }
        let left = |at: SystemTime| -> i128 {
            match at.duration_since(now) {
                Ok(d) => d.as_millis() as i128,
                Err(e) => -(e.duration().as_millis() as i128),
            }
        };
        let expected_left = |at: Duration| at.as_millis() as i128 - vnow.as_millis() as i128;
        let slack = self.slack().as_millis() as i128;
        if let State::Inquiring { since, .. } = r.state {
            let Some(actual) = info.inquiring_since else {
                return Some("inquiring since no time".into());
            };
            if (left(actual) - expected_left(since)).abs() > slack {
                return Some(format!(
                    "inquiring since {} ms from now, not {} ms",
                    left(actual),
                    expected_left(since)
                ));
            }
        }
        if let Some(lease) = lease {
            let Some(actual) = info.lease_until else {
                return Some("no lease or next question".into());
            };
            if (left(actual) - expected_left(lease)).abs() > slack {
                return Some(format!(
                    "lease or next question in {} ms, not {} ms",
                    left(actual),
                    expected_left(lease)
                ));
            }
        }
        // When it goes: its retention, or its live lease if that ends later
        // (a store whose records expire by themselves, Redis, shows that).
        let (gone, expected_gone) = match (info.lease_until, lease) {
            (Some(actual), Some(lease)) if state == RecordState::InFlight => {
                (info.expires_at.max(actual), r.expires_at.max(lease))
            }
            _ => (info.expires_at, r.expires_at),
        };
        if (left(gone) - expected_left(expected_gone)).abs() > slack {
            return Some(format!(
                "gone in {} ms, not {} ms",
                left(gone),
                expected_left(expected_gone)
            ));
        }
        None
    }
}

/// A record past its retention and not held by a live lease, as a store
/// shows it.
fn looks_expired(info: &RecordInfo, now: SystemTime, slack: Duration) -> bool {
    let by = now + slack;
    let live = info.state == RecordState::InFlight && info.lease_until.is_some_and(|l| l > by);
    info.expires_at <= by && !live
}

fn same(expected: Answer, actual: Answer) -> Result<(), String> {
    if expected == actual {
        Ok(())
    } else {
        Err(format!(
            "the rules answer {expected:?}, the store {actual:?}"
        ))
    }
}

/// Run `case` against `store` (number `n`: its own route) and the rules.
async fn run_case(store: &dyn Store, n: u64, case: &Case, leeway: Leeway) -> Result<(), String> {
    let mut run = Run {
        store,
        route: format!("d{n}"),
        case: n,
        reference: Reference::new(units(case.after), units(case.retention)),
        policy: case.policy,
        tokens: BTreeMap::new(),
        attempts: BTreeMap::new(),
        leeway,
        started: std::time::Instant::now(),
    };
    for (i, op) in case.ops.iter().enumerate() {
        if run.started.elapsed() > MOST_REAL_TIME {
            return Err(format!(
                "step {}: the case has taken {:?} of real time, more than the {:?} \
                 its comparisons allow (a store this slow cannot be compared here)",
                i + 1,
                run.started.elapsed(),
                MOST_REAL_TIME
            ));
        }
        let checked = match run.step(i, op).await {
            Ok(()) => run.compare_records().await,
            Err(e) => Err(e),
        };
        checked.map_err(|e| format!("step {}, {op:?}: {e}", i + 1))?;
    }
    Ok(())
}

/// The cases to run, and the seed.
fn budget() -> (u32, [u8; 32]) {
    let cases = std::env::var("IDEMGATE_DIFFERENTIAL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128);
    let seed: u64 = std::env::var("IDEMGATE_DIFFERENTIAL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_261_129);
    let mut bytes = [0; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    (cases, bytes)
}

/// Run `cases` generated cases against `store`; a divergence comes back
/// shrunk, with the reason.
async fn explore(
    store: Arc<dyn Store>,
    cases: u32,
    seed: [u8; 32],
    leeway: Leeway,
) -> Result<(), (String, Case)> {
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let config = Config {
            cases,
            failure_persistence: None,
            max_shrink_iters: 4096,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
        let mut runner = TestRunner::new_with_rng(config, rng);
        let numbered = AtomicU64::new(0);
        let outcome = runner.run(&ops::cases(MOST_STEPS), |case| {
            let n = numbered.fetch_add(1, Ordering::Relaxed);
            handle
                .block_on(run_case(store.as_ref(), n, &case, leeway))
                .map_err(TestCaseError::fail)
        });
        match outcome {
            Ok(()) => Ok(()),
            Err(TestError::Fail(reason, case)) => Err((reason.to_string(), case)),
            Err(TestError::Abort(reason)) => panic!("proptest aborted: {reason}"),
        }
    })
    .await
    .expect("the explorer ran")
}

async fn every_store_answers_as_the_rules(b: Backend) {
    let storage = TestStore::new(b).await;
    let store = storage.open().await;
    let (cases, seed) = budget();
    if let Err((reason, case)) = explore(store, cases, seed, Leeway::of(b)).await {
        panic!(
            "the {} store and the rules diverge.\n{reason}\nshortest case found:\n{case:?}",
            b.name()
        );
    }
}

per_backend!(
    only [postgres, redis, redis_cluster, sqlite, memory, front]:
    every_store_answers_as_the_rules,
);
