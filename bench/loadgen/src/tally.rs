//! What happened to every request, counted twice: in the second it was due
//! (the per-second series, each line final once all its requests are
//! resolved) and in the run's totals. A request is counted when it is
//! scheduled and again when it is resolved, so none goes missing: an
//! overrun (no connection to be had) is a resolution like an answer.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

/// A request dispatched this much after its due instant counts as late: the
/// generator fell behind its schedule (tokio's timer alone is ~1 ms late).
pub const LATE: Duration = Duration::from_millis(10);

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An answer, whole (its body read).
    Answered {
        /// Its status.
        status: u16,
        /// Whether it carried `Retry-After`.
        retry_after: bool,
    },
    /// No answer within the timeout.
    Timeout,
    /// The connection was closed or reset before a whole answer.
    Reset,
    /// No connection could be opened.
    ConnectError,
    /// Anything else (an answer that does not parse).
    Error,
    /// Every connection was busy and no more could open: not sent.
    Overrun,
}

/// Latencies in microseconds, 1 µs to an hour.
fn histogram(significant: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, significant).expect("valid bounds")
}

/// The counts of one group of requests (a second, or the whole run).
#[derive(Debug, Clone)]
pub struct Counts {
    /// Requests due.
    pub scheduled: u64,
    /// Of those, resolved so far (answered, failed or overrun).
    pub resolved: u64,
    /// Dispatched more than [`LATE`] after their due instant.
    pub late: u64,
    /// Answers by exact status.
    pub status: BTreeMap<u16, u64>,
    /// `503` answers with `Retry-After`.
    pub unavailable_retry_after: u64,
    /// `503` answers without it.
    pub unavailable_bare: u64,
    /// No answer within the timeout.
    pub timeouts: u64,
    /// Closed or reset before a whole answer.
    pub resets: u64,
    /// No connection could be opened.
    pub connect_errors: u64,
    /// Other failures.
    pub errors: u64,
    /// Not sent: no connection to be had.
    pub overrun: u64,
    /// Latency of `2xx` answers, µs.
    pub ok_latency: Histogram<u64>,
    /// Latency of `503` answers, µs.
    pub unavailable_latency: Histogram<u64>,
}

impl Counts {
    fn new(significant: u8) -> Self {
        Self {
            scheduled: 0,
            resolved: 0,
            late: 0,
            status: BTreeMap::new(),
            unavailable_retry_after: 0,
            unavailable_bare: 0,
            timeouts: 0,
            resets: 0,
            connect_errors: 0,
            errors: 0,
            overrun: 0,
            ok_latency: histogram(significant),
            unavailable_latency: histogram(significant),
        }
    }

    /// Answers with a `2xx` status.
    pub fn ok(&self) -> u64 {
        self.status.range(200..300).map(|(_, n)| n).sum()
    }

    /// Answers by class: `[1xx, 2xx, 3xx, 4xx, 5xx]`.
    pub fn classes(&self) -> [u64; 5] {
        let mut classes = [0; 5];
        for (status, n) in &self.status {
            if let Some(c) = classes.get_mut(usize::from(status / 100).wrapping_sub(1)) {
                *c += n;
            }
        }
        classes
    }

    /// Requests that were sent (given a connection, or trying to open one).
    pub fn sent(&self) -> u64 {
        self.resolved - self.overrun
    }

    fn resolve(&mut self, outcome: Outcome, latency: Duration) {
        self.resolved += 1;
        let micros = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        match outcome {
            Outcome::Answered {
                status,
                retry_after,
            } => {
                *self.status.entry(status).or_default() += 1;
                if (200..300).contains(&status) {
                    self.ok_latency.saturating_record(micros);
                } else if status == 503 {
                    self.unavailable_latency.saturating_record(micros);
                    if retry_after {
                        self.unavailable_retry_after += 1;
                    } else {
                        self.unavailable_bare += 1;
                    }
                }
            }
            Outcome::Timeout => self.timeouts += 1,
            Outcome::Reset => self.resets += 1,
            Outcome::ConnectError => self.connect_errors += 1,
            Outcome::Error => self.errors += 1,
            Outcome::Overrun => self.overrun += 1,
        }
    }
}

/// One second of the run, by due instant.
#[derive(Debug, Clone)]
pub struct Second {
    /// The rate asked for when its last request was due.
    pub rate: f64,
    /// Its requests.
    pub counts: Counts,
    /// `2xx` answers that arrived during this second (whenever due):
    /// goodput by arrival.
    pub ok_arrived: u64,
}

struct State {
    seconds: Vec<Second>,
    totals: Counts,
    /// How far behind schedule each dispatch was, µs.
    behind: Histogram<u64>,
    /// Seconds handed out as final.
    handed: usize,
    /// Every request, with `--log`.
    log: Option<Vec<Entry>>,
}

/// One request, as `--log` writes it.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Its due instant, from the run's start.
    pub due: Duration,
    /// From its due instant (or its send, in a closed loop) to its end.
    pub latency: Duration,
    /// How it ended.
    pub outcome: Outcome,
}

/// The counts of one run.
pub struct Tally {
    /// The run's start: request 0's due instant.
    pub t0: Instant,
    state: Mutex<State>,
}

impl Tally {
    /// A run starting at `t0`; `log`: keep every request's [`Entry`].
    pub fn new(t0: Instant, log: bool) -> Self {
        Self {
            t0,
            state: Mutex::new(State {
                seconds: Vec::new(),
                totals: Counts::new(3),
                behind: histogram(3),
                handed: 0,
                log: log.then(Vec::new),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn index(&self, at: Instant) -> usize {
        usize::try_from(at.saturating_duration_since(self.t0).as_secs()).unwrap_or(usize::MAX)
    }

    /// A request due at `due` (at `rate`), dispatched `behind` after it.
    pub fn scheduled(&self, due: Instant, behind: Duration, rate: f64) {
        let i = self.index(due);
        let mut state = self.state();
        let second = second(&mut state.seconds, i);
        second.rate = rate;
        second.counts.scheduled += 1;
        let late = behind > LATE;
        second.counts.late += u64::from(late);
        state.totals.scheduled += 1;
        state.totals.late += u64::from(late);
        let micros = u64::try_from(behind.as_micros()).unwrap_or(u64::MAX);
        state.behind.saturating_record(micros.max(1));
    }

    /// The request due at `due` ended at `done` with `outcome`; its latency
    /// counts from `from` (the due instant, in an open loop).
    pub fn resolved(&self, due: Instant, from: Instant, done: Instant, outcome: Outcome) {
        let latency = done.saturating_duration_since(from);
        let (i, arrived) = (self.index(due), self.index(done));
        let mut state = self.state();
        second(&mut state.seconds, i)
            .counts
            .resolve(outcome, latency);
        if matches!(outcome, Outcome::Answered { status, .. } if (200..300).contains(&status)) {
            second(&mut state.seconds, arrived).ok_arrived += 1;
        }
        state.totals.resolve(outcome, latency);
        if let Some(log) = &mut state.log {
            log.push(Entry {
                due: due.saturating_duration_since(self.t0),
                latency,
                outcome,
            });
        }
    }

    /// Requests scheduled and not resolved yet.
    pub fn outstanding(&self) -> u64 {
        let state = self.state();
        state.totals.scheduled - state.totals.resolved
    }

    /// The seconds that became final since the last call, in order: every
    /// request due in them resolved, and `now` past their end (or
    /// `ended`: nothing more will be scheduled).
    pub fn final_seconds(&self, now: Instant, ended: bool) -> Vec<(usize, Second)> {
        let mut state = self.state();
        let mut out = Vec::new();
        while let Some(s) = state.seconds.get(state.handed) {
            let over = ended || now >= self.t0 + Duration::from_secs(state.handed as u64 + 1);
            if !over || s.counts.resolved < s.counts.scheduled {
                break;
            }
            out.push((state.handed, s.clone()));
            state.handed += 1;
        }
        out
    }

    /// Every request resolved so far, by end (with `--log`; else none).
    pub fn entries(&self) -> Vec<Entry> {
        self.state().log.take().unwrap_or_default()
    }

    /// The run's totals, and how far behind schedule dispatches were.
    pub fn totals(&self) -> (Counts, Histogram<u64>) {
        let state = self.state();
        (state.totals.clone(), state.behind.clone())
    }
}

fn second(seconds: &mut Vec<Second>, i: usize) -> &mut Second {
    while seconds.len() <= i {
        seconds.push(Second {
            rate: 0.0,
            counts: Counts::new(2),
            ok_arrived: 0,
        });
    }
    &mut seconds[i]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_has_its_count_and_503s_split_by_retry_after() {
        let t0 = Instant::now();
        let tally = Tally::new(t0, false);
        let outcomes = [
            Outcome::Answered {
                status: 201,
                retry_after: false,
            },
            Outcome::Answered {
                status: 503,
                retry_after: true,
            },
            Outcome::Answered {
                status: 503,
                retry_after: false,
            },
            Outcome::Answered {
                status: 409,
                retry_after: true,
            },
            Outcome::Timeout,
            Outcome::Reset,
            Outcome::ConnectError,
            Outcome::Overrun,
        ];
        for outcome in outcomes {
            tally.scheduled(t0, Duration::ZERO, 8.0);
            tally.resolved(t0, t0, t0 + Duration::from_millis(5), outcome);
        }
        let (totals, _) = tally.totals();
        assert_eq!(totals.scheduled, 8);
        assert_eq!(totals.ok(), 1);
        assert_eq!(totals.classes(), [0, 1, 0, 1, 2]);
        assert_eq!(
            (totals.unavailable_retry_after, totals.unavailable_bare),
            (1, 1)
        );
        assert_eq!(
            (totals.timeouts, totals.resets, totals.connect_errors),
            (1, 1, 1)
        );
        assert_eq!((totals.overrun, totals.sent()), (1, 7));
        assert_eq!(totals.ok_latency.len(), 1);
        assert_eq!(totals.unavailable_latency.len(), 2);
    }

    #[test]
    fn a_second_is_final_once_over_and_all_its_requests_resolved() {
        let t0 = Instant::now();
        let tally = Tally::new(t0, false);
        let later = t0 + Duration::from_millis(1500);
        tally.scheduled(t0, Duration::ZERO, 1.0);
        tally.scheduled(later, Duration::ZERO, 1.0);
        assert!(
            tally.final_seconds(later, false).is_empty(),
            "one unresolved"
        );
        tally.resolved(t0, t0, later, Outcome::Timeout);
        let done = tally.final_seconds(later, false);
        assert_eq!(done.len(), 1, "second 0 only: second 1 is not over");
        tally.resolved(later, later, later, Outcome::Reset);
        assert_eq!(tally.final_seconds(later, true).len(), 1);
        assert_eq!(tally.outstanding(), 0);
    }
}
