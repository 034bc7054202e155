//! The checker: reads a finished history, the upstream's ledger of
//! executions and the fault log, and lists every violation of
//! 1. at most one upstream execution per key under `hold`;
//! 2. every 2xx answer for a key is byte-identical (and is what an
//!    execution of that key really sent);
//! 3. `409 in-flight` only while a live lease can exist;
//! 4. `422` exactly when the fingerprint differs from the key's record;
//! 5. no key blocked beyond its policy once the faults are cleared;
//! 6. a key never forwarded never ends held;
//! 7. G5 as it happens: no 409 or held answer after a 2xx reached a client;
//! 8. G1: two executions of a key never overlap at the upstream unless the
//!    first attempt's gateway let go of it (its outcome unknown: it died,
//!    timed out, failed) or a fault could have cost it its lease renewals
//!    (a frozen gateway, a store outage, a lost store reply);
//! 9. the store's records, read at the end, agree with the upstream's
//!    ledger and the final check: a completed record has an execution of
//!    its key that answered its status and body size, and the final check
//!    got a 2xx for it; a held record's key was executed or had an attempt
//!    whose outcome was unknown, and the final check got a held answer; no
//!    record is left in flight, none is for a key no client used, and every
//!    key probed at the end has its record;
//! 10. (front store) a front fault turns into no client error: no answer
//!     that blames the store (503 `store-unavailable` or `record-failed`,
//!     `lease-lost`, `store-corrupt`, `overloaded`, `internal`) comes while
//!     only the front is faulted or in the second after (the store proxy
//!     is calm meanwhile), unless a PostgreSQL reply lost just before
//!     explains it;
//! 11. (front store) at the end, once the outbox has drained, the front
//!     agrees with PostgreSQL: every completed, held or in-flight entry it
//!     holds is the record's current state there (same attempt, status and
//!     body size); it may only lack entries;
//! 12. (the inquiring route, `on_unknown_outcome = "inquire"`) (a) at most
//!     one execution per key: an unknown outcome is settled by the
//!     upstream's lookup, never by forwarding again a key it acted on;
//!     (b) at the end, with the lookup answering again, no key of the
//!     route is `held` or still `inquiring` in the store; (c) a key
//!     answered 2xx before the final check is replayed there
//!     (`Idempotent-Replayed`), and (property 2) every 2xx of a key is the
//!     same bytes, either what its execution answered or what the lookup
//!     answered about it ([`lookup_answers`]), which the gateway records;
//!
//! plus: answers that promise nothing was forwarded (409, 422, 503,
//! unreachable) really were not, the upstream never ran a request nobody
//! sent, and no answer is a 500.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::history::{Kind, Op, Route};
use super::nemesis::{FRONT_AFTERMATH, FaultRecord};
use crate::support::upstream::{Execution, lookup_body, response_digest};

/// Scheduling slack added to lease arithmetic (renewal period, a busy
/// 2-core machine).
const SLACK: Duration = Duration::from_millis(1_500);

/// One record as the store holds it at the end (from `StoreAdmin::list`).
#[derive(Debug, Clone)]
pub struct StoreRecord {
    pub route: Route,
    pub key: String,
    /// `in_flight`, `completed`, `held` or `inquiring`.
    pub state: &'static str,
    pub held_reason: Option<&'static str>,
    /// Completed records: the recorded status and body size.
    pub status: Option<u16>,
    pub body_bytes: Option<u64>,
    /// The current attempt's fencing token.
    pub token: i64,
}

/// One entry of the front store's Redis at the end (property 11).
#[derive(Debug, Clone)]
pub struct FrontRecord {
    pub route: Route,
    pub key: String,
    /// `in_flight`, `completed` or `held` (any other kind is counted, not
    /// compared).
    pub kind: String,
    pub token: i64,
    /// Completed entries: the status and body size it would replay.
    pub status: Option<u16>,
    pub body_bytes: u64,
}

/// What the final phase found for one key.
#[derive(Debug, Clone)]
pub struct FinalProbe {
    pub route: Route,
    pub key: String,
    /// When the key first answered as its policy says, after the faults
    /// were cleared; `None` if it never did within the limit.
    pub resolved_after: Option<Duration>,
    /// The last answer's status and problem, for the report.
    pub last: String,
}

/// Everything the checker looks at.
pub struct Input<'a> {
    pub ops: &'a [Op],
    pub executions: &'a [Execution],
    pub faults: &'a [FaultRecord],
    pub finals: &'a [FinalProbe],
    pub lease: Duration,
    /// The run's time zero (ops' `invoke` and `complete` count from it).
    pub epoch: Instant,
    /// When a store reply was lost (the store fault proxy), from `epoch`.
    pub store_losses: &'a [Duration],
    /// When a gateway instance died (SIGKILL or a kill window), from `epoch`.
    pub deaths: &'a [(usize, Duration)],
    /// The store's records after the final check (`None`: not read, no
    /// property 9).
    pub records: Option<&'a [StoreRecord]>,
    /// The front's entries after the final check (`None`: no front, or
    /// not read; no property 11).
    pub front: Option<&'a [FrontRecord]>,
}

/// The verdict: violations (empty = pass) and the numbers for the report.
#[derive(Debug, Default)]
pub struct Verdict {
    pub violations: Vec<String>,
    pub keys_hold: usize,
    pub keys_release: usize,
    pub duplicates_hold: usize,
    pub reexecutions_release: usize,
    /// Keys of the inquiring route, their executions, and executions
    /// beyond the first of a key (property 12 (a)).
    pub keys_inquire: usize,
    pub executions_inquire: usize,
    pub duplicates_inquire: usize,
    /// The inquiring route's records at the end: completed with the
    /// lookup's answer (the outcome was settled by asking), and left held
    /// or inquiring (property 12 (b)).
    pub inquire_settled_by_lookup: usize,
    pub inquire_unsettled: usize,
    /// Executions that began while another of the same key was running.
    pub overlaps: usize,
    /// The store's records at the end, by state (property 9).
    pub records: BTreeMap<&'static str, usize>,
    /// Hold keys that end held with no execution (each must be explained
    /// by an attempt whose outcome was unknown).
    pub held_unexecuted: usize,
    /// Answers blaming the store that came while only the front was
    /// faulted, and how many of those a lost PostgreSQL reply explains
    /// (property 10).
    pub front_fault_errors: (usize, usize),
    /// The front's entries at the end, by kind (property 11).
    pub front_entries: BTreeMap<String, usize>,
    pub by_answer: BTreeMap<String, u64>,
    pub by_kind: BTreeMap<&'static str, u64>,
}

impl Verdict {
    fn violation(&mut self, text: String) {
        // Enough to diagnose; the history file has the rest.
        if self.violations.len() < 50 {
            self.violations.push(text);
        } else if self.violations.len() == 50 {
            self.violations.push("… (more violations omitted)".into());
        }
    }
}

pub fn check(input: &Input<'_>) -> Verdict {
    let mut verdict = Verdict::default();
    let mut ops_by_key: HashMap<(Route, &str), Vec<&Op>> = HashMap::new();
    for op in input.ops {
        ops_by_key
            .entry((op.route, op.key.as_str()))
            .or_default()
            .push(op);
        let answer = match (op.status(), op.problem()) {
            (Some(status), Some(problem)) => format!("{status} {problem}"),
            (Some(status), None) if op.is_2xx() && is_replay(op) => format!("{status} replay"),
            (Some(status), None) => format!("{status}"),
            (None, _) => "no answer".to_string(),
        };
        *verdict.by_answer.entry(answer).or_default() += 1;
        let kind = match op.kind() {
            Kind::Ok => "ok",
            Kind::Fail => "fail",
            Kind::Info => "info",
        };
        *verdict.by_kind.entry(kind).or_default() += 1;
        if op.status() == Some(500) {
            verdict.violation(format!(
                "op {} on {} got a 500: {:?}",
                op.id, op.key, op.outcome
            ));
        }
    }
    let mut executions_by_key: HashMap<&str, Vec<&Execution>> = HashMap::new();
    for execution in input.executions {
        executions_by_key
            .entry(execution.key.as_str())
            .or_default()
            .push(execution);
    }
    let route_of: HashMap<&str, Route> = input
        .ops
        .iter()
        .map(|op| (op.key.as_str(), op.route))
        .collect();

    // Executions are all accounted for; refused requests never executed.
    let ops_by_id: HashMap<u64, &Op> = input.ops.iter().map(|op| (op.id, op)).collect();
    let executed_ops: HashSet<u64> = input.executions.iter().map(|e| e.op).collect();
    for execution in input.executions {
        match ops_by_id.get(&execution.op) {
            None => verdict.violation(format!(
                "the upstream executed op {} (key {}) that no client sent",
                execution.op, execution.key
            )),
            Some(op) if op.key != execution.key => verdict.violation(format!(
                "execution {} of op {} carried key {}, the op was for {}",
                execution.number, op.id, execution.key, op.key
            )),
            Some(_) => {}
        }
    }
    for op in input.ops {
        if op.kind() == Kind::Fail && op.status().is_some() && executed_ops.contains(&op.id) {
            verdict.violation(format!(
                "op {} on {} was answered {:?} (nothing forwarded) but the upstream executed it",
                op.id,
                op.key,
                op.problem()
            ));
        }
    }

    for ((route, key), ops) in &ops_by_key {
        let executions = executions_by_key.get(key).cloned().unwrap_or_default();
        if route.inquires() {
            verdict.keys_inquire += 1;
            verdict.executions_inquire += executions.len();
        } else if route.holds() {
            verdict.keys_hold += 1;
        } else {
            verdict.keys_release += 1;
        }
        // 1. At most one execution per key under hold (12 (a): and on the
        // inquiring route).
        if executions.len() > 1 {
            if route.inquires() {
                verdict.duplicates_inquire += executions.len() - 1;
                verdict.violation(format!(
                    "property 12 (a): inquire key {key} executed {} times (ops {:?}): a key the upstream acted on was forwarded again",
                    executions.len(),
                    executions.iter().map(|e| e.op).collect::<Vec<_>>()
                ));
            } else if route.holds() {
                verdict.duplicates_hold += executions.len() - 1;
                verdict.violation(format!(
                    "property 1: {} key {key} executed {} times (ops {:?})",
                    route.name(),
                    executions.len(),
                    executions.iter().map(|e| e.op).collect::<Vec<_>>()
                ));
            } else {
                verdict.reexecutions_release += executions.len() - 1;
            }
        }
        check_overlaps(&mut verdict, key, &executions, &ops_by_id, input);
        check_identical_2xx(&mut verdict, *route, key, ops, &executions);
        if route.inquires() {
            check_replayed_at_the_end(&mut verdict, key, ops);
        }
        check_in_flight(&mut verdict, key, ops, input);
        check_durable_after_2xx(&mut verdict, key, ops);
        check_fingerprints(&mut verdict, key, ops, &executions);
    }
    for key in executions_by_key.keys() {
        if !route_of.contains_key(key) {
            verdict.violation(format!(
                "the upstream executed key {key} that no client used"
            ));
        }
    }

    // 6. A key whose request was never forwarded never ends held.
    for probe in input.finals {
        let held = probe.last.contains("outcome-unknown");
        let executed = executions_by_key.contains_key(probe.key.as_str());
        if !probe.route.holds() || !held || executed {
            continue;
        }
        verdict.held_unexecuted += 1;
        let ops = ops_by_key
            .get(&(probe.route, probe.key.as_str()))
            .map(Vec::as_slice)
            .unwrap_or_default();
        if !ops.iter().any(|op| may_be_unknown(op, input.deaths)) {
            verdict.violation(format!(
                "property 6: hold key {} ends held with no execution, and no attempt on it had an unknown outcome (answers: {:?})",
                probe.key,
                ops.iter()
                    .map(|op| (op.id, op.status(), op.problem()))
                    .collect::<Vec<_>>()
            ));
        }
    }

    if let Some(records) = input.records {
        check_records(
            &mut verdict,
            input,
            records,
            &ops_by_key,
            &executions_by_key,
        );
    }

    check_front_faults(&mut verdict, input);
    if let (Some(records), Some(front)) = (input.records, input.front) {
        check_front_records(&mut verdict, records, front);
    }

    // 5. Nothing stays blocked beyond its policy.
    for probe in input.finals {
        if probe.resolved_after.is_none() {
            verdict.violation(format!(
                "property 5: {} key {} still blocked after the faults cleared (last answer: {})",
                probe.route.name(),
                probe.key,
                probe.last
            ));
        }
    }
    for fault in input.faults {
        if fault.recovery.is_none() {
            verdict.violation(format!(
                "property 5: no new key went through within {:?} after \"{}\" cleared at {:?}",
                super::nemesis::RECOVERY_LIMIT,
                fault.name,
                fault.end
            ));
        }
    }
    verdict
}

/// Whether the gateway could not know the outcome of this request's
/// attempt: the exchange failed or timed out after it was sent, the lease
/// was lost, the record could not be written, or no answer came back (the
/// gateway died or froze, or the client gave up). Or a claim whose reply
/// was lost (`503 store-unavailable`) may have committed, and its gateway
/// died before it could abandon the record (docs/src/guide/record-states.md: the one residual
/// case), so the record lapses into `held`.
fn may_be_unknown(op: &Op, deaths: &[(usize, Duration)]) -> bool {
    op.status().is_none()
        || matches!(
            op.problem(),
            Some("upstream-failed" | "upstream-timeout" | "lease-lost" | "record-failed")
        )
        || (op.problem() == Some("store-unavailable")
            && deaths.iter().any(|(instance, at)| {
                *instance == op.instance && *at >= op.invoke && *at <= op.complete + ABANDON_GRACE
            }))
}

/// Answers that blame the store (or the gateway itself) for not doing the
/// request.
fn blames_the_store(op: &Op) -> bool {
    op.status() == Some(500)
        || matches!(
            op.problem(),
            Some(
                "store-unavailable"
                    | "store-corrupt"
                    | "record-failed"
                    | "lease-lost"
                    | "overloaded"
                    | "internal"
            )
        )
}

/// How long after a fault its effects may still show: PostgreSQL
/// connections broken by a restart fail their next use, a frozen gateway's
/// timers all fire at once when it resumes.
const AFTERMATH: Duration = Duration::from_secs(2);

/// How long before an operation began a lost PostgreSQL reply may still
/// explain its failure: the batch it waited behind hangs for the store's
/// timeout (1 s).
const LOSS_REACH: Duration = Duration::from_millis(1_500);

/// Property 10: no request answered while only the front is faulted (from
/// its start to [`FRONT_AFTERMATH`] after it cleared, when the nemesis
/// keeps the store proxy calm; no other store or gateway fault near: none
/// ended less than [`AFTERMATH`] before) is answered with an error that
/// blames the store, unless a PostgreSQL reply lost during the request or
/// just before it explains it (only one lost before the fault can). Only
/// the PostgreSQL faults (a stop, a lost reply) may cost clients anything:
/// the front is a cache of the truth. Requests answered after the calm
/// window are not judged: a reply lost after it may explain them.
fn check_front_faults(verdict: &mut Verdict, input: &Input<'_>) {
    let overlaps = |op: &Op, from: Duration, to: Duration| op.invoke <= to && op.complete >= from;
    for op in input.ops.iter().filter(|op| !op.last_phase) {
        let Some(fault) = input
            .faults
            .iter()
            .find(|f| f.front && op.complete >= f.start && op.complete <= f.end + FRONT_AFTERMATH)
        else {
            continue;
        };
        if !blames_the_store(op) {
            continue;
        }
        let other_fault = input.faults.iter().any(|f| {
            !f.front
                && (f.store || f.name.starts_with("gateway"))
                && overlaps(op, f.start, f.end + AFTERMATH)
        });
        if other_fault {
            continue;
        }
        verdict.front_fault_errors.0 += 1;
        let lost_reply = input
            .store_losses
            .iter()
            .any(|t| *t + LOSS_REACH >= op.invoke && *t <= op.complete);
        if lost_reply {
            verdict.front_fault_errors.1 += 1;
            continue;
        }
        verdict.violation(format!(
            "property 10: op {} on {} ({}, gateway {}) got {:?} {:?} at {:?}–{:?}, during \"{}\" ({:?}–{:?}) with no PostgreSQL fault or lost reply to explain it",
            op.id,
            op.key,
            op.route.name(),
            op.instance,
            op.status(),
            op.problem(),
            op.invoke,
            op.complete,
            fault.name,
            fault.start,
            fault.end
        ));
    }
}

/// Property 11: the front, at rest, shows nothing PostgreSQL does not
/// hold. Only the kinds the front answers from are compared.
fn check_front_records(verdict: &mut Verdict, records: &[StoreRecord], front: &[FrontRecord]) {
    let truth: HashMap<(Route, &str), &StoreRecord> = records
        .iter()
        .map(|r| ((r.route, r.key.as_str()), r))
        .collect();
    for entry in front {
        *verdict.front_entries.entry(entry.kind.clone()).or_default() += 1;
        if !matches!(entry.kind.as_str(), "in_flight" | "completed" | "held") {
            continue;
        }
        let name = format!("{} key {}", entry.route.name(), entry.key);
        let shown = format!(
            "{} (token {}, status {:?}, {} body bytes)",
            entry.kind, entry.token, entry.status, entry.body_bytes
        );
        let Some(record) = truth.get(&(entry.route, entry.key.as_str())) else {
            verdict.violation(format!(
                "property 11: the front shows {name} {shown}, PostgreSQL has no record of it"
            ));
            continue;
        };
        let agrees = record.state == entry.kind
            && record.token == entry.token
            && (entry.kind != "completed"
                || (record.status == entry.status && record.body_bytes == Some(entry.body_bytes)));
        if !agrees {
            verdict.violation(format!(
                "property 11: the front shows {name} {shown}, PostgreSQL holds it {} (token {}, status {:?}, {:?} body bytes)",
                record.state, record.token, record.status, record.body_bytes
            ));
        }
    }
}

/// How long after a lost claim reply its gateway may still be abandoning
/// the record (the store may be down meanwhile: the abandon is retried).
const ABANDON_GRACE: Duration = Duration::from_secs(10);

fn is_replay(op: &Op) -> bool {
    matches!(
        op.outcome,
        super::history::Outcome::Answer { replayed: true, .. }
    )
}

fn response_of(op: &Op) -> &str {
    match &op.outcome {
        super::history::Outcome::Answer { response, .. } => response,
        super::history::Outcome::NoAnswer { .. } => "",
    }
}

/// Property 9: the store's records against the ledger and the final check.
fn check_records(
    verdict: &mut Verdict,
    input: &Input<'_>,
    records: &[StoreRecord],
    ops_by_key: &HashMap<(Route, &str), Vec<&Op>>,
    executions_by_key: &HashMap<&str, Vec<&Execution>>,
) {
    let finals: HashMap<(Route, &str), &FinalProbe> = input
        .finals
        .iter()
        .map(|probe| ((probe.route, probe.key.as_str()), probe))
        .collect();
    let mut recorded = HashSet::new();
    for record in records {
        let at = (record.route, record.key.as_str());
        recorded.insert(at);
        *verdict.records.entry(record.state).or_default() += 1;
        let name = format!("{} key {}", record.route.name(), record.key);
        let Some(ops) = ops_by_key.get(&at) else {
            verdict.violation(format!(
                "property 9: the store has a {} record for {name}, which no client used",
                record.state
            ));
            continue;
        };
        let executions = executions_by_key
            .get(record.key.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let last = finals.get(&at).map(|probe| probe.last.as_str());
        if record.route.inquires() && matches!(record.state, "held" | "inquiring") {
            verdict.inquire_unsettled += 1;
            verdict.violation(format!(
                "property 12 (b): {name} is still {} ({:?}) after the final check, with the lookup answering (final check got {last:?})",
                record.state, record.held_reason
            ));
            continue;
        }
        match record.state {
            "completed" => {
                let answered = record.status.zip(record.body_bytes);
                let by_lookup = record.route.inquires()
                    && lookup_answers(&record.key, executions)
                        .iter()
                        .any(|(lookup, _)| Some(*lookup) == answered);
                verdict.inquire_settled_by_lookup += usize::from(by_lookup);
                if !by_lookup && !executions.iter().any(|e| e.answered == answered) {
                    verdict.violation(format!(
                        "property 9: {name} is recorded completed ({answered:?}: status, body bytes) but no execution of it answered that (executions: {:?})",
                        executions.iter().map(|e| e.answered).collect::<Vec<_>>()
                    ));
                }
                if last.is_some_and(|last| !last.starts_with('2') && !last.contains("key-reused")) {
                    verdict.violation(format!(
                        "property 9: {name} is recorded completed but the final check got {last:?}"
                    ));
                }
            }
            "held" => {
                if executions.is_empty() && !ops.iter().any(|op| may_be_unknown(op, input.deaths)) {
                    verdict.violation(format!(
                        "property 9: {name} is recorded held ({:?}) with no execution and no attempt whose outcome was unknown",
                        record.held_reason
                    ));
                }
                if last.is_some_and(|last| {
                    !last.contains("outcome-unknown")
                        && !last.contains("response-not-retained")
                        && !last.contains("key-reused")
                }) {
                    verdict.violation(format!(
                        "property 9: {name} is recorded held but the final check got {last:?}"
                    ));
                }
            }
            // An attempt of another body claimed the key and died: its
            // record waits, in flight, for a retry with its own body, and
            // the final check's body gets 422.
            "in_flight"
                if last.is_some_and(|last| last.contains("key-reused"))
                    && ops.iter().any(|op| may_be_unknown(op, input.deaths)) => {}
            state => verdict.violation(format!(
                "property 9: {name} is still {state} after the final check"
            )),
        }
    }
    for probe in input.finals {
        if probe.resolved_after.is_some() && !recorded.contains(&(probe.route, probe.key.as_str()))
        {
            verdict.violation(format!(
                "property 9: {} key {} answered {} in the final check, but the store has no record of it",
                probe.route.name(),
                probe.key,
                probe.last
            ));
        }
    }
}

/// Property 8 (G1): an execution that begins while another of the same key
/// is still running at the upstream needs the first attempt to have been
/// let go of: its client got no answer (its gateway died or froze) or an
/// unknown outcome the route may release (the upstream failed or timed
/// out, the record failed), or a fault that can cost lease renewals (a
/// gateway frozen, the store stopped or frozen, a store reply lost) came
/// between the first's start and the second's. A live gateway renews its
/// lease, so no retry can take over from it.
fn check_overlaps(
    verdict: &mut Verdict,
    key: &str,
    executions: &[&Execution],
    ops_by_id: &HashMap<u64, &Op>,
    input: &Input<'_>,
) {
    let at = |instant: Instant| instant.saturating_duration_since(input.epoch);
    let mut sorted = executions.to_vec();
    sorted.sort_by_key(|e| e.arrived);
    for (i, second) in sorted.iter().enumerate() {
        let Some(first) = sorted[..i]
            .iter()
            .find(|first| first.until > second.arrived)
        else {
            continue;
        };
        verdict.overlaps += 1;
        let let_go = ops_by_id.get(&first.op).is_some_and(|op| {
            op.status().is_none()
                || matches!(
                    op.problem(),
                    Some("upstream-failed" | "upstream-timeout" | "record-failed")
                )
        });
        let (from, to) = (at(first.arrived), at(second.arrived));
        let faulted = input.faults.iter().any(|f| {
            (f.store || f.name.starts_with("gateway SIGSTOP")) && f.start <= to && f.end >= from
        }) || input
            .store_losses
            .iter()
            .any(|t| *t + input.lease >= from && *t <= to);
        if !let_go && !faulted {
            let answer = ops_by_id
                .get(&first.op)
                .map(|op| format!("{:?} {:?}", op.status(), op.problem()))
                .unwrap_or_default();
            verdict.violation(format!(
                "property 8 (G1): key {key}: execution {} (op {}) began at {to:?} while execution {} (op {}, answered {answer}) still ran ({from:?} to {:?}), with no fault to explain a lost lease",
                second.number,
                second.op,
                first.number,
                first.op,
                at(first.until)
            ));
        }
    }
}

/// Property 2: every 2xx for a key is byte-identical (status, replayed
/// headers, body) and came from an execution (on the inquiring route: or
/// from the lookup, asked about it); a replay never carries a header the
/// route does not replay.
fn check_identical_2xx(
    verdict: &mut Verdict,
    route: Route,
    key: &str,
    ops: &[&Op],
    executions: &[&Execution],
) {
    for op in ops.iter().filter(|op| {
        matches!(
            op.outcome,
            super::history::Outcome::Answer {
                replayed: true,
                denied_header: true,
                ..
            }
        )
    }) {
        verdict.violation(format!(
            "property 2: op {} on {key}: a replay carried a header the route never replays",
            op.id
        ));
    }
    let answers: HashSet<&str> = ops
        .iter()
        .filter(|op| op.is_2xx())
        .map(|op| response_of(op))
        .collect();
    if answers.len() > 1 {
        verdict.violation(format!(
            "property 2: key {key} got {} different 2xx answers",
            answers.len()
        ));
    }
    let mut sent: HashSet<String> = executions.iter().map(|e| e.response.clone()).collect();
    if route.inquires() {
        sent.extend(lookup_answers(key, executions).into_iter().map(|(_, d)| d));
    }
    for answer in answers {
        if !sent.contains(answer) {
            verdict.violation(format!(
                "property 2: key {key} got a 2xx answer no execution of it sent"
            ));
        }
    }
}

/// What the upstream's lookup may have answered about a key it executed
/// (`lookup` in tests/it/support/upstream.rs), which the gateway records
/// and replays: `200`, `content-type: application/json` and a body naming
/// the key's first execution and how many it had by then (one, unless
/// property 12 (a) fails). Each as its (status, body bytes) and its
/// [`response_digest`] (as a client computes it).
fn lookup_answers(key: &str, executions: &[&Execution]) -> Vec<((u16, u64), String)> {
    let Some(first) = executions.iter().map(|e| e.number).min() else {
        return Vec::new();
    };
    (1..=executions.len())
        .map(|times| {
            let body = lookup_body(key, first, times);
            let digest = response_digest(
                200,
                [("content-type", &b"application/json"[..])],
                body.as_bytes(),
            );
            ((200, body.len() as u64), digest)
        })
        .collect()
}

/// Property 12 (c): an inquiring key answered 2xx before the final check
/// is a replay there (its record survived the restarts); property 2 sees
/// that the bytes are the same.
fn check_replayed_at_the_end(verdict: &mut Verdict, key: &str, ops: &[&Op]) {
    if !ops.iter().any(|op| !op.last_phase && op.is_2xx()) {
        return;
    }
    for op in ops.iter().filter(|op| op.last_phase && op.is_2xx()) {
        if !is_replay(op) {
            verdict.violation(format!(
                "property 12 (c): inquire key {key} was answered 2xx during the run, but the final check's op {} got a 2xx that is not a replay",
                op.id
            ));
        }
    }
}

/// G5, as it happens: a 2xx reaches a client only after its record is
/// durable, so a request invoked after a 2xx for the key reached a client
/// can be replayed or refused `422`, never answered `409 in-flight`, `409
/// outcome-pending` nor `502 outcome-unknown` (which would mean the record
/// was lost or never written). A `409 response-not-retained` stays
/// possible: an over-cap response is sent once, then held.
fn check_durable_after_2xx(verdict: &mut Verdict, key: &str, ops: &[&Op]) {
    let Some(first_2xx) = ops
        .iter()
        .filter(|op| op.is_2xx())
        .map(|op| op.complete)
        .min()
    else {
        return;
    };
    for op in ops.iter().filter(|op| op.invoke > first_2xx) {
        if let Some(problem @ ("in-flight" | "outcome-pending" | "outcome-unknown")) = op.problem()
        {
            verdict.violation(format!(
                "property 7 (G5): op {} on {key} got {problem} at {:?}, after a 2xx reached a client at {:?}",
                op.id, op.invoke, first_2xx
            ));
        }
    }
}

/// Property 3: a `409 in-flight` needs another request on the key whose
/// lease may still live: invoked before the 409 completed, and completed (or
/// its store resumed) less than a lease (plus slack) before the 409 was
/// invoked.
fn check_in_flight(verdict: &mut Verdict, key: &str, ops: &[&Op], input: &Input<'_>) {
    for op in ops.iter().filter(|op| op.problem() == Some("in-flight")) {
        let explained = ops.iter().any(|other| {
            if other.id == op.id || other.invoke > op.complete {
                return false;
            }
            // A write sent to a frozen or stopped store may land when it
            // resumes: the lease then starts there.
            let resumed = input
                .faults
                .iter()
                .filter(|f| f.store && f.start <= other.complete && f.end >= other.invoke)
                .map(|f| f.end)
                .max()
                .unwrap_or_default();
            let lease_end = other.complete.max(resumed) + input.lease + SLACK;
            op.invoke <= lease_end
        });
        if !explained {
            verdict.violation(format!(
                "property 3: op {} on {key} got 409 in-flight at {:?} with no live attempt",
                op.id, op.invoke
            ));
        }
    }
}

/// Property 4: one fingerprint F owns the key: executions, 2xx answers and
/// every answer about the key's record (409 in-flight, held) carry F; 422s
/// never do.
fn check_fingerprints(verdict: &mut Verdict, key: &str, ops: &[&Op], executions: &[&Execution]) {
    let mut bodies: Vec<&str> = ops.iter().map(|op| op.body.as_str()).collect();
    bodies.sort_unstable();
    bodies.dedup();
    let about_record = |op: &Op| {
        op.is_2xx()
            || matches!(
                op.problem(),
                Some("in-flight" | "outcome-pending" | "outcome-unknown" | "response-not-retained")
            )
    };
    // An attempt whose upstream could not be reached released the key
    // (nothing was sent): until then its fingerprint owned the record, and
    // afterwards another body may own it.
    // Likewise a claim whose reply was lost (`503 store-unavailable`) may
    // have committed: its fingerprint owns the record until its gateway
    // abandons it (docs/src/guide/record-states.md), a little after the 503.
    let mut released_until: HashMap<&str, Duration> = HashMap::new();
    for op in ops.iter() {
        let until = match op.problem() {
            Some("upstream-unreachable") => op.complete,
            Some("store-unavailable") => op.complete + ABANDON_GRACE,
            _ => continue,
        };
        let latest = released_until.entry(op.body.as_str()).or_default();
        *latest = (*latest).max(until);
    }
    let owned_then_by_released =
        |body: &str, at: Duration| released_until.get(body).is_some_and(|until| at <= *until);
    let consistent = |f: &str| {
        executions.iter().all(|e| e.body == f)
            && ops.iter().all(|op| {
                if op.problem() == Some("key-reused") {
                    op.body != f
                        || released_until
                            .iter()
                            .any(|(g, until)| *g != f && op.invoke <= *until)
                } else if about_record(op) {
                    op.body == f || owned_then_by_released(&op.body, op.invoke)
                } else {
                    true
                }
            })
    };
    if !bodies.iter().any(|f| consistent(f)) {
        let summary: Vec<String> = ops
            .iter()
            .map(|op| {
                format!(
                    "op {} body {} → {:?} {:?}",
                    op.id,
                    op.body,
                    op.status(),
                    op.problem()
                )
            })
            .collect();
        verdict.violation(format!(
            "property 4: key {key}: no single fingerprint explains its answers: {summary:?}; executions with bodies {:?}",
            executions.iter().map(|e| &e.body).collect::<Vec<_>>()
        ));
    }
}

/// The checker must catch what it claims to catch: each property gets a
/// small hand-made history that breaks it, next to a clean one.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::history::Outcome;

    const MS: Duration = Duration::from_millis(1);
    const LEASE: Duration = Duration::from_secs(2);

    /// The hand-made histories' time zero.
    static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

    fn answer(status: u16, problem: Option<&str>, response: &str) -> Outcome {
        Outcome::Answer {
            status,
            problem: problem.map(str::to_string),
            replayed: false,
            response: response.into(),
            denied_header: false,
        }
    }

    fn op(id: u64, body: &str, at_ms: u64, took_ms: u64, outcome: Outcome) -> Op {
        Op {
            id,
            process: 0,
            route: Route::Hold,
            key: "k1".into(),
            body: body.into(),
            instance: 0,
            last_phase: false,
            invoke: MS * at_ms as u32,
            complete: MS * (at_ms + took_ms) as u32,
            outcome,
        }
    }

    /// An execution that runs from `number` × 10 s for 1 ms (never
    /// overlapping another).
    fn execution(number: u64, op: u64, body: &str, response: &str) -> Execution {
        let from = number * 10_000;
        execution_at(number, op, body, response, (from, from + 1))
    }

    /// An execution running from `from` to `to` ms.
    fn execution_at(
        number: u64,
        op: u64,
        body: &str,
        response: &str,
        (from, to): (u64, u64),
    ) -> Execution {
        Execution {
            number,
            op,
            key: "k1".into(),
            scope: String::new(),
            body: body.into(),
            response: response.into(),
            original: 201,
            answered: Some((201, 10)),
            arrived: *EPOCH + MS * from as u32,
            until: *EPOCH + MS * to as u32,
        }
    }

    fn resolved() -> Vec<FinalProbe> {
        vec![FinalProbe {
            route: Route::Hold,
            key: "k1".into(),
            resolved_after: Some(MS),
            last: "201".into(),
        }]
    }

    fn verdict(ops: &[Op], executions: &[Execution], finals: &[FinalProbe]) -> Verdict {
        verdict_with(ops, executions, finals, &[], &[], &[])
    }

    fn verdict_records(
        ops: &[Op],
        executions: &[Execution],
        finals: &[FinalProbe],
        records: &[StoreRecord],
    ) -> Verdict {
        check(&Input {
            ops,
            executions,
            faults: &[],
            finals,
            lease: LEASE,
            epoch: *EPOCH,
            store_losses: &[],
            deaths: &[],
            records: Some(records),
            front: None,
        })
    }

    fn verdict_with(
        ops: &[Op],
        executions: &[Execution],
        finals: &[FinalProbe],
        faults: &[FaultRecord],
        store_losses: &[Duration],
        deaths: &[(usize, Duration)],
    ) -> Verdict {
        check(&Input {
            ops,
            executions,
            faults,
            finals,
            lease: LEASE,
            epoch: *EPOCH,
            store_losses,
            deaths,
            records: None,
            front: None,
        })
    }

    fn assert_flags(verdict: &Verdict, needle: &str) {
        assert!(
            verdict.violations.iter().any(|v| v.contains(needle)),
            "expected a violation mentioning {needle:?}, got {:?}",
            verdict.violations
        );
    }

    /// A key executed once, a concurrent duplicate refused, a replay, a
    /// reuse with another body refused.
    fn clean() -> (Vec<Op>, Vec<Execution>) {
        let ops = vec![
            op(1, "A", 0, 100, answer(201, None, "r1")),
            op(2, "A", 10, 5, answer(409, Some("in-flight"), "p")),
            op(3, "A", 200, 5, answer(201, None, "r1")),
            op(4, "B", 300, 5, answer(422, Some("key-reused"), "p")),
        ];
        (ops, vec![execution(1, 1, "A", "r1")])
    }

    #[test]
    fn a_clean_history_passes() {
        let (ops, executions) = clean();
        let verdict = verdict(&ops, &executions, &resolved());
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
        assert_eq!(verdict.duplicates_hold, 0);
    }

    #[test]
    fn property_1_a_second_execution_on_hold() {
        let (mut ops, mut executions) = clean();
        ops[1] = op(2, "A", 10, 100, answer(201, None, "r1"));
        executions.push(execution(2, 2, "A", "r2"));
        let verdict = verdict(&ops, &executions, &resolved());
        assert_flags(&verdict, "property 1");
        assert_eq!(verdict.duplicates_hold, 1);
    }

    #[test]
    fn property_2_two_different_2xx_answers() {
        let (mut ops, executions) = clean();
        ops[2] = op(3, "A", 200, 5, answer(201, None, "other"));
        assert_flags(&verdict(&ops, &executions, &resolved()), "property 2");
    }

    #[test]
    fn property_3_a_409_with_no_live_attempt() {
        let (mut ops, executions) = clean();
        // Long after the only attempt completed and its lease lapsed.
        ops.push(op(5, "A", 60_000, 5, answer(409, Some("in-flight"), "p")));
        assert_flags(&verdict(&ops, &executions, &resolved()), "property 3");
    }

    #[test]
    fn property_4_a_422_for_the_recorded_body() {
        let (mut ops, executions) = clean();
        ops.push(op(5, "A", 400, 5, answer(422, Some("key-reused"), "p")));
        assert_flags(&verdict(&ops, &executions, &resolved()), "property 4");
    }

    #[test]
    fn property_4_a_replay_for_another_body() {
        let (mut ops, executions) = clean();
        ops[3] = op(4, "B", 300, 5, answer(201, None, "r1"));
        assert_flags(&verdict(&ops, &executions, &resolved()), "property 4");
    }

    #[test]
    fn property_5_a_key_still_blocked() {
        let (ops, executions) = clean();
        let mut finals = resolved();
        finals[0].resolved_after = None;
        assert_flags(&verdict(&ops, &executions, &finals), "property 5");
    }

    #[test]
    fn a_refused_request_that_the_upstream_executed() {
        let (ops, mut executions) = clean();
        executions.push(execution(2, 2, "A", "r2"));
        assert_flags(
            &verdict(&ops, &executions, &resolved()),
            "nothing forwarded",
        );
    }

    #[test]
    fn g5_a_409_or_a_held_answer_after_a_2xx_reached_a_client() {
        for (status, problem) in [(409, "in-flight"), (502, "outcome-unknown")] {
            let (mut ops, executions) = clean();
            ops.push(op(5, "A", 400, 5, answer(status, Some(problem), "p")));
            assert_flags(&verdict(&ops, &executions, &resolved()), "G5");
        }
    }

    #[test]
    fn property_4_a_released_attempt_hands_the_key_to_another_body() {
        // B's attempt could not reach the upstream: B's 409 came while it
        // held the key; after its release, A owns the key.
        let ops = vec![
            op(
                1,
                "B",
                0,
                50,
                answer(502, Some("upstream-unreachable"), "p"),
            ),
            op(2, "B", 10, 5, answer(409, Some("in-flight"), "p")),
            op(3, "A", 20, 5, answer(422, Some("key-reused"), "p")),
            op(4, "A", 100, 100, answer(201, None, "r1")),
            op(5, "A", 300, 5, answer(201, None, "r1")),
            op(6, "B", 400, 5, answer(422, Some("key-reused"), "p")),
        ];
        let executions = vec![execution(1, 4, "A", "r1")];
        let clean = verdict(&ops, &executions, &resolved());
        assert!(clean.violations.is_empty(), "{:?}", clean.violations);
        // The same B 409 after the release has no owner to explain it.
        let mut late = ops.clone();
        late.push(op(7, "B", 500, 5, answer(409, Some("in-flight"), "p")));
        assert_flags(&verdict(&late, &executions, &resolved()), "property 4");
    }

    #[test]
    fn property_6_held_without_an_execution_or_an_unknown_outcome() {
        // Only refusals (503 store-unavailable) and then a held answer: the
        // key never reached the upstream, so it must not be held.
        let ops = vec![
            op(1, "A", 0, 500, answer(503, Some("store-unavailable"), "p")),
            op(2, "A", 5_000, 5, answer(502, Some("outcome-unknown"), "p")),
        ];
        let mut finals = resolved();
        finals[0].last = "502 outcome-unknown".into();
        assert_flags(&verdict(&ops, &[], &finals), "property 6");
        // An attempt that timed out at the upstream explains it.
        let mut explained = ops.clone();
        explained.push(op(
            3,
            "A",
            100,
            1_000,
            answer(504, Some("upstream-timeout"), "p"),
        ));
        let v = verdict(&explained, &[], &finals);
        assert!(
            !v.violations.iter().any(|x| x.starts_with("property 6")),
            "{:?}",
            v.violations
        );
        // So does the death of the gateway whose claim reply was lost (503),
        // before it could abandon the record; another instance's does not.
        for (instance, explains) in [(0, true), (1, false)] {
            let v = verdict_with(&ops, &[], &finals, &[], &[], &[(instance, MS * 600)]);
            let flagged = v.violations.iter().any(|x| x.starts_with("property 6"));
            assert_eq!(flagged, !explains, "{:?}", v.violations);
        }
    }

    #[test]
    fn a_500_is_a_violation() {
        let (mut ops, executions) = clean();
        ops.push(op(5, "A", 400, 5, answer(500, Some("internal"), "p")));
        assert_flags(&verdict(&ops, &executions, &resolved()), "got a 500");
    }

    #[test]
    fn property_2_a_replay_with_other_headers_or_a_denied_one() {
        use crate::support::upstream::response_digest;
        // The digest tells answers apart by their replayed headers too.
        let sent = response_digest(201, [("location", &b"/v1/things/1"[..])], b"{}");
        let replayed = response_digest(201, [("location", &b"/v1/things/2"[..])], b"{}");
        assert_ne!(sent, replayed);
        let (mut ops, executions) = clean();
        ops[2] = op(3, "A", 200, 5, answer(201, None, &replayed));
        assert_flags(&verdict(&ops, &executions, &resolved()), "property 2");
        // A replay carrying set-cookie.
        let (mut ops, executions) = clean();
        ops[2].outcome = Outcome::Answer {
            status: 201,
            problem: None,
            replayed: true,
            response: "r1".into(),
            denied_header: true,
        };
        assert_flags(&verdict(&ops, &executions, &resolved()), "never replays");
    }

    #[test]
    fn property_8_a_retry_executes_while_a_live_attempt_runs() {
        // A release key: op 1 runs 0–2500 ms at the upstream and ends with
        // its lease lost; op 2 took over at 1300 ms and executed beside it.
        let release = |mut op: Op| {
            op.route = Route::Release;
            op
        };
        let ops = vec![
            release(op(1, "A", 0, 2_600, answer(502, Some("lease-lost"), "p"))),
            release(op(2, "A", 1_300, 200, answer(201, None, "r2"))),
        ];
        let executions = vec![
            execution_at(1, 1, "A", "r1", (10, 2_500)),
            execution_at(2, 2, "A", "r2", (1_310, 1_410)),
        ];
        let finals = vec![FinalProbe {
            route: Route::Release,
            key: "k1".into(),
            resolved_after: Some(MS),
            last: "201".into(),
        }];
        let flagged = verdict(&ops, &executions, &finals);
        assert_flags(&flagged, "property 8");
        assert_eq!(flagged.duplicates_hold, 0, "release keys may re-execute");
        // Not an overlap: the second began after the first ended.
        let apart = vec![
            execution_at(1, 1, "A", "r1", (10, 1_200)),
            execution_at(2, 2, "A", "r2", (1_310, 1_410)),
        ];
        let v = verdict(&ops, &apart, &finals);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        // Explained: the first's gateway died (no answer) …
        let mut died = ops.clone();
        died[0].outcome = Outcome::NoAnswer {
            error: "reset".into(),
            definite: false,
        };
        let v = verdict(&died, &executions, &finals);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        // … or a store reply was lost meanwhile, or the store stopped.
        let v = verdict_with(&ops, &executions, &finals, &[], &[MS * 700], &[]);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        let outage = FaultRecord {
            name: "PostgreSQL stop -m immediate + start",
            start: MS * 500,
            end: MS * 1_000,
            recovery: Some(MS),
            store: true,
            front: false,
        };
        let v = verdict_with(&ops, &executions, &finals, &[outage], &[], &[]);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
    }

    #[test]
    fn property_9_the_store_disagrees_with_the_ledger() {
        let (ops, executions) = clean();
        let record = |state: &'static str, status: Option<u16>| StoreRecord {
            route: Route::Hold,
            key: "k1".into(),
            state,
            held_reason: None,
            status,
            body_bytes: status.map(|_| 10),
            token: 1,
        };
        let completed = [record("completed", Some(201))];
        let v = verdict_records(&ops, &executions, &resolved(), &completed);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        // A completed record whose status no execution answered.
        let wrong = [record("completed", Some(200))];
        assert_flags(
            &verdict_records(&ops, &executions, &resolved(), &wrong),
            "no execution of it answered",
        );
        // A completed record with no execution at all.
        assert_flags(
            &verdict_records(&ops, &[], &resolved(), &completed),
            "no execution of it answered",
        );
        // The record is gone although the final check was answered.
        assert_flags(
            &verdict_records(&ops, &executions, &resolved(), &[]),
            "no record of it",
        );
        // Left in flight; held while the final check got a 2xx.
        assert_flags(
            &verdict_records(&ops, &executions, &resolved(), &[record("in_flight", None)]),
            "still in_flight",
        );
        assert_flags(
            &verdict_records(&ops, &executions, &resolved(), &[record("held", None)]),
            "final check got",
        );
        // Held with no execution and no unknown outcome to explain it.
        let refused = vec![op(
            1,
            "A",
            0,
            5,
            answer(503, Some("store-unavailable"), "p"),
        )];
        let mut finals = resolved();
        finals[0].last = "502 outcome-unknown".into();
        assert_flags(
            &verdict_records(&refused, &[], &finals, &[record("held", None)]),
            "recorded held",
        );
        // A record for a key no client used.
        let mut stranger = record("completed", Some(201));
        stranger.key = "k2".into();
        assert_flags(
            &verdict_records(
                &ops,
                &executions,
                &resolved(),
                &[completed[0].clone(), stranger],
            ),
            "no client used",
        );
    }

    #[test]
    fn property_4_a_lost_claim_reply_owns_the_key_until_abandoned() {
        // B's claim committed but its reply was lost (503): A gets 422 until
        // B's gateway abandons the record, then A owns the key.
        let ops = vec![
            op(1, "B", 0, 50, answer(503, Some("store-unavailable"), "p")),
            op(2, "A", 100, 5, answer(422, Some("key-reused"), "p")),
            op(3, "A", 20_000, 100, answer(201, None, "r1")),
        ];
        let executions = vec![execution(1, 3, "A", "r1")];
        let v = verdict(&ops, &executions, &resolved());
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        // Long after the 503, B's claim has been abandoned: a 422 for A then
        // has no owner to explain it.
        let mut late = ops.clone();
        late[1] = op(2, "A", 15_000, 5, answer(422, Some("key-reused"), "p"));
        assert_flags(&verdict(&late, &executions, &resolved()), "property 4");
    }

    #[test]
    fn property_9_an_in_flight_record_of_a_dead_attempt_of_another_body() {
        let record = StoreRecord {
            route: Route::Hold,
            key: "k1".into(),
            state: "in_flight",
            held_reason: None,
            status: None,
            body_bytes: None,
            token: 1,
        };
        // B's gateway died after its claim; A's final probe gets 422.
        let dead = Outcome::NoAnswer {
            error: "reset".into(),
            definite: false,
        };
        let ops = vec![
            op(1, "B", 0, 50, dead),
            op(2, "A", 60_000, 5, answer(422, Some("key-reused"), "p")),
        ];
        let mut finals = resolved();
        finals[0].last = "422 key-reused".into();
        let v = verdict_records(&ops, &[], &finals, std::slice::from_ref(&record));
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        // With no attempt that died, the record should not be in flight.
        let mut alive = ops.clone();
        alive[0].outcome = answer(409, Some("in-flight"), "p");
        assert_flags(
            &verdict_records(&alive, &[], &finals, &[record]),
            "still in_flight",
        );
    }

    #[test]
    fn property_10_a_client_error_while_only_the_front_is_faulted() {
        let fault = |name: &'static str, front: bool, store: bool| FaultRecord {
            name,
            start: MS * 1_000,
            end: MS * 3_000,
            recovery: Some(MS),
            store,
            front,
        };
        let frozen = fault("front Redis SIGSTOP + SIGCONT", true, false);
        let (mut ops, executions) = clean();
        // The verdict on `ops` with these faults and lost PostgreSQL replies.
        let judge = |ops: &[Op], faults: &[FaultRecord], losses: &[Duration]| {
            verdict_with(ops, &executions, &resolved(), faults, losses, &[])
        };
        ops.push(op(
            5,
            "A",
            2_000,
            300,
            answer(503, Some("store-unavailable"), "p"),
        ));
        let v = judge(&ops, std::slice::from_ref(&frozen), &[]);
        assert_flags(&v, "property 10");
        assert_eq!(v.front_fault_errors, (1, 0));
        // A lost PostgreSQL reply just before explains it …
        let v = judge(&ops, std::slice::from_ref(&frozen), &[MS * 1_900]);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(v.front_fault_errors, (1, 1));
        // … as does a PostgreSQL stop; and outside the front's fault and
        // the calm second after it, or for answers that do not blame the
        // store, it does not apply.
        let stop = fault("PostgreSQL stop -m immediate + start", false, true);
        let v = judge(&ops, &[stop], &[]);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        for (at, took) in [(9_000, 300), (2_000, 2_500)] {
            let mut late = ops.clone();
            late[4] = op(
                5,
                "A",
                at,
                took,
                answer(503, Some("store-unavailable"), "p"),
            );
            let v = judge(&late, std::slice::from_ref(&frozen), &[]);
            assert!(v.violations.is_empty(), "{:?}", v.violations);
        }
        // Answered within the calm second after it: judged.
        let mut after = ops.clone();
        after[4] = op(5, "A", 3_200, 300, answer(503, Some("record-failed"), "p"));
        let v = judge(&after, std::slice::from_ref(&frozen), &[]);
        assert_flags(&v, "property 10");
        let mut upstream = ops.clone();
        upstream[4] = op(
            5,
            "A",
            2_000,
            300,
            answer(502, Some("upstream-failed"), "p"),
        );
        let v = judge(&upstream, std::slice::from_ref(&frozen), &[]);
        assert!(
            !v.violations.iter().any(|x| x.starts_with("property 10")),
            "{:?}",
            v.violations
        );
    }

    #[test]
    fn property_11_the_front_shows_what_postgres_does_not_hold() {
        let (ops, executions) = clean();
        let record = StoreRecord {
            route: Route::Hold,
            key: "k1".into(),
            state: "completed",
            held_reason: None,
            status: Some(201),
            body_bytes: Some(10),
            token: 7,
        };
        let entry = |kind: &str, token: i64, status: Option<u16>| FrontRecord {
            route: Route::Hold,
            key: "k1".into(),
            kind: kind.into(),
            token,
            status,
            body_bytes: if status.is_some() { 10 } else { 0 },
        };
        let check_with = |front: &[FrontRecord]| {
            check(&Input {
                ops: &ops,
                executions: &executions,
                faults: &[],
                finals: &resolved(),
                lease: LEASE,
                epoch: *EPOCH,
                store_losses: &[],
                deaths: &[],
                records: Some(std::slice::from_ref(&record)),
                front: Some(front),
            })
        };
        for fine in [
            vec![entry("completed", 7, Some(201))],
            vec![entry("settling", 7, None)],
            vec![],
        ] {
            let v = check_with(&fine);
            assert!(v.violations.is_empty(), "{fine:?}: {:?}", v.violations);
        }
        for wrong in [
            entry("completed", 6, Some(201)),
            entry("completed", 7, Some(200)),
            entry("held", 7, None),
            entry("in_flight", 7, None),
        ] {
            assert_flags(&check_with(&[wrong]), "property 11");
        }
        let mut stranger = entry("completed", 7, Some(201));
        stranger.key = "k2".into();
        assert_flags(&check_with(&[stranger]), "no record of it");
    }

    /// An op on the inquiring route.
    fn inquire(mut op: Op) -> Op {
        op.route = Route::Inquire;
        op
    }

    fn replay(status: u16, response: &str) -> Outcome {
        Outcome::Answer {
            status,
            problem: None,
            replayed: true,
            response: response.into(),
            denied_header: false,
        }
    }

    /// An inquiring key posted to `/reset`: the upstream acted (execution
    /// 1, no answer), the client got 502, then 409 while the gateway asked,
    /// then the lookup's answer as a replay, again in the final check.
    fn settled_by_the_lookup() -> (Vec<Op>, Vec<Execution>, Vec<FinalProbe>, String) {
        let mut executions = vec![execution(1, 1, "A", "")];
        executions[0].answered = None;
        let refs: Vec<&Execution> = executions.iter().collect();
        let answers = lookup_answers("k1", &refs);
        assert_eq!(answers.len(), 1);
        let ((status, bytes), digest) = answers[0].clone();
        assert_eq!((status, bytes), (200, 36));
        let mut ops = vec![
            inquire(op(1, "A", 0, 50, answer(502, Some("upstream-failed"), "p"))),
            inquire(op(
                2,
                "A",
                100,
                5,
                answer(409, Some("outcome-pending"), "p"),
            )),
            inquire(op(3, "A", 2_000, 5, replay(200, &digest))),
            inquire(op(4, "A", 9_000, 5, replay(200, &digest))),
        ];
        ops[3].last_phase = true;
        let finals = vec![FinalProbe {
            route: Route::Inquire,
            key: "k1".into(),
            resolved_after: Some(MS),
            last: "200".into(),
        }];
        (ops, executions, finals, digest)
    }

    fn inquire_record(state: &'static str, status: Option<u16>, bytes: u64) -> StoreRecord {
        StoreRecord {
            route: Route::Inquire,
            key: "k1".into(),
            state,
            held_reason: None,
            status,
            body_bytes: status.map(|_| bytes),
            token: 2,
        }
    }

    #[test]
    fn property_12_the_lookups_answer_is_replayed() {
        let (ops, executions, finals, _) = settled_by_the_lookup();
        let completed = [inquire_record("completed", Some(200), 36)];
        let v = verdict_records(&ops, &executions, &finals, &completed);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!((v.keys_inquire, v.executions_inquire), (1, 1));
        assert_eq!(v.inquire_settled_by_lookup, 1);
        // On a route that does not inquire, nobody asked: no execution
        // sent that answer.
        let held: Vec<Op> = ops
            .iter()
            .cloned()
            .map(|mut op| {
                op.route = Route::Hold;
                op
            })
            .collect();
        assert_flags(&verdict(&held, &executions, &finals), "property 2");
        // Another body than the lookup's (another execution named, say).
        let mut other = ops.clone();
        let wrong = response_digest(200, [("content-type", &b"application/json"[..])], b"{}");
        other[2] = inquire(op(3, "A", 2_000, 5, replay(200, &wrong)));
        assert_flags(&verdict(&other, &executions, &finals), "property 2");
        // A record whose answer neither the lookup nor an execution gave.
        let odd = [inquire_record("completed", Some(200), 37)];
        assert_flags(
            &verdict_records(&ops, &executions, &finals, &odd),
            "no execution of it answered",
        );
    }

    #[test]
    fn property_12_a_a_second_execution_on_the_inquiring_route() {
        // The lookup lied (404): the key was released and the retry
        // executed again.
        let ops = vec![
            inquire(op(1, "A", 0, 50, answer(502, Some("upstream-failed"), "p"))),
            inquire(op(
                2,
                "A",
                2_000,
                50,
                answer(502, Some("upstream-failed"), "p"),
            )),
        ];
        let executions = vec![execution(1, 1, "A", ""), execution(2, 2, "A", "")];
        let v = verdict(&ops, &executions, &resolved());
        assert_flags(&v, "property 12 (a)");
        assert_eq!((v.duplicates_inquire, v.duplicates_hold), (1, 0));
    }

    #[test]
    fn property_12_b_a_key_left_held_or_inquiring() {
        let (ops, executions, finals, _) = settled_by_the_lookup();
        for state in ["inquiring", "held"] {
            let left = [inquire_record(state, None, 0)];
            let v = verdict_records(&ops, &executions, &finals, &left);
            assert_flags(&v, "property 12 (b)");
            assert_eq!(v.inquire_unsettled, 1);
        }
    }

    #[test]
    fn property_12_c_a_final_2xx_that_is_not_a_replay() {
        let (mut ops, executions, finals, digest) = settled_by_the_lookup();
        ops[3] = inquire(op(4, "A", 9_000, 5, answer(200, None, &digest)));
        ops[3].last_phase = true;
        assert_flags(&verdict(&ops, &executions, &finals), "property 12 (c)");
    }

    #[test]
    fn outcome_pending_promises_nothing_was_forwarded_nor_follows_a_2xx() {
        // A 409 outcome-pending whose request the upstream executed.
        let (mut ops, mut executions) = clean();
        ops.push(op(
            5,
            "A",
            400,
            5,
            answer(409, Some("outcome-pending"), "p"),
        ));
        executions.push(execution(2, 5, "A", "r2"));
        assert_flags(
            &verdict(&ops, &executions, &resolved()),
            "nothing forwarded",
        );
        // After a 2xx reached a client, the key is never pending again (G5),
        // and a pending answer is about the record's own body (property 4).
        let (mut ops, executions) = clean();
        ops.push(op(
            5,
            "A",
            400,
            5,
            answer(409, Some("outcome-pending"), "p"),
        ));
        assert_flags(&verdict(&ops, &executions, &resolved()), "G5");
        let (mut ops, executions) = clean();
        ops.push(op(
            5,
            "B",
            400,
            5,
            answer(409, Some("outcome-pending"), "p"),
        ));
        assert_flags(&verdict(&ops, &executions, &resolved()), "property 4");
    }
}
