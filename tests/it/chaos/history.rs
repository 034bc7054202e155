//! A Jepsen-style history: every request a chaos client makes is one
//! operation with an `invoke` and a completion, `ok` (the operation
//! happened: a 2xx), `fail` (it certainly did not reach the upstream: the
//! gateway refused it, or nothing was connected) or `info` (unknown: the
//! upstream may have acted). Written out as JSON lines for a human to read
//! after a failure.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Which route (and so which `on_unknown_outcome`) a key lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `on_unknown_outcome = "hold"`: at most one execution per key.
    Hold,
    /// `on_unknown_outcome = "release"`: a key is forwarded again after an
    /// unknown outcome, so it must never stay blocked.
    Release,
    /// `hold` with an upstream slower than the lease (see
    /// [`SLOW_LEASE`](super::SLOW_LEASE)): the lease lives only because it
    /// is renewed.
    SlowHold,
    /// `release`, as slow: a lease that lapses under a live attempt lets a
    /// retry take over while the first execution still runs.
    SlowRelease,
    /// `hold`, with the key in the JSON body (`key_from = ["json:/key"]`)
    /// and every delivery signed anew (a header that changes): a webhook.
    Webhook,
    /// `hold` with `concurrent = "wait"`: duplicates wait for the first
    /// attempt instead of getting `409`.
    Wait,
    /// `on_unknown_outcome = "inquire"`: a key whose outcome is unknown
    /// turns `inquiring`, and the gateway asks the upstream's lookup
    /// (through the fault proxy, like every request) whether it acted: at
    /// most one execution per key, and none left blocked once the lookup
    /// answers. Its keys post to a path that makes the upstream act
    /// normally, reset after acting, drop before acting or hang
    /// ([`KeyInfo::path`](super::workload::KeyInfo::path)).
    Inquire,
}

impl Route {
    pub const ALL: [Route; 7] = [
        Route::Hold,
        Route::Release,
        Route::SlowHold,
        Route::SlowRelease,
        Route::Webhook,
        Route::Wait,
        Route::Inquire,
    ];

    pub fn path(self) -> &'static str {
        match self {
            Route::Hold => "/hold/orders",
            Route::Release => "/release/orders",
            Route::SlowHold => "/slow-hold/orders",
            Route::SlowRelease => "/slow-release/orders",
            Route::Webhook => "/webhook/orders",
            Route::Wait => "/wait/orders",
            Route::Inquire => "/inquire/orders",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Route::Hold => "hold",
            Route::Release => "release",
            Route::SlowHold => "slow-hold",
            Route::SlowRelease => "slow-release",
            Route::Webhook => "webhook",
            Route::Wait => "wait",
            Route::Inquire => "inquire",
        }
    }

    /// Whether the route holds a key whose outcome is unknown (at most one
    /// execution per key).
    pub fn holds(self) -> bool {
        matches!(
            self,
            Route::Hold | Route::SlowHold | Route::Webhook | Route::Wait
        )
    }

    /// Whether the route asks the upstream about unknown outcomes.
    pub fn inquires(self) -> bool {
        self == Route::Inquire
    }

    /// Whether the upstream is slower than the route's lease.
    pub fn slow(self) -> bool {
        matches!(self, Route::SlowHold | Route::SlowRelease)
    }
}

/// What the client learned.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// An HTTP answer.
    Answer {
        status: u16,
        /// The problem slug (`in-flight`, `key-reused`, …) of a problem+json
        /// answer.
        problem: Option<String>,
        replayed: bool,
        /// [`response_digest`](crate::support::upstream::response_digest)
        /// of status, replayed headers and body.
        response: String,
        /// It carried a header the route never replays
        /// ([`DENIED_HEADER`](crate::support::upstream::DENIED_HEADER)).
        denied_header: bool,
    },
    /// No answer: the connection was refused (`definite`: nothing was sent)
    /// or broke, or the client gave up waiting.
    NoAnswer { error: String, definite: bool },
}

/// Jepsen's three completion types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ok,
    Fail,
    Info,
}

/// One client request, from invocation to completion.
#[derive(Debug, Clone)]
pub struct Op {
    pub id: u64,
    /// The client task that made it.
    pub process: usize,
    pub route: Route,
    pub key: String,
    /// Digest of the request body.
    pub body: String,
    /// The gateway instance it was sent to.
    pub instance: usize,
    /// Part of the final check (after every fault was cleared).
    pub last_phase: bool,
    pub invoke: Duration,
    pub complete: Duration,
    pub outcome: Outcome,
}

impl Op {
    pub fn status(&self) -> Option<u16> {
        match &self.outcome {
            Outcome::Answer { status, .. } => Some(*status),
            Outcome::NoAnswer { .. } => None,
        }
    }

    pub fn problem(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Answer { problem, .. } => problem.as_deref(),
            Outcome::NoAnswer { .. } => None,
        }
    }

    pub fn is_2xx(&self) -> bool {
        self.status().is_some_and(|s| (200..300).contains(&s))
    }

    /// ok / fail / info, from what the answer says about the upstream.
    pub fn kind(&self) -> Kind {
        match &self.outcome {
            Outcome::NoAnswer { definite: true, .. } => Kind::Fail,
            Outcome::NoAnswer { .. } => Kind::Info,
            Outcome::Answer { status, .. } if (200..300).contains(status) => Kind::Ok,
            Outcome::Answer { problem, .. } => match problem.as_deref() {
                // Refused before anything was forwarded.
                Some(
                    "in-flight"
                    | "outcome-pending"
                    | "key-reused"
                    | "store-unavailable"
                    | "upstream-unreachable"
                    | "missing-key"
                    | "invalid-key"
                    | "body-too-large"
                    | "no-route",
                ) => Kind::Fail,
                _ => Kind::Info,
            },
        }
    }

    fn json(&self, event: &str, time: Duration) -> serde_json::Value {
        let mut value = serde_json::json!({
            "type": event,
            "time_ms": time.as_secs_f64() * 1000.0,
            "id": self.id,
            "process": self.process,
            "route": self.route.name(),
            "key": self.key,
            "body": self.body,
            "instance": self.instance,
            "final": self.last_phase,
        });
        if event != "invoke" {
            match &self.outcome {
                Outcome::Answer {
                    status,
                    problem,
                    replayed,
                    response,
                    ..
                } => {
                    value["status"] = (*status).into();
                    value["problem"] = problem.clone().into();
                    value["replayed"] = (*replayed).into();
                    value["response"] = response.clone().into();
                }
                Outcome::NoAnswer { error, .. } => value["error"] = error.clone().into(),
            }
        }
        value
    }
}

/// The shared, append-only history of one run.
#[derive(Clone, Default)]
pub struct History {
    ops: Arc<Mutex<Vec<Op>>>,
}

impl History {
    pub fn push(&self, op: Op) {
        self.ops.lock().unwrap().push(op);
    }

    pub fn ops(&self) -> Vec<Op> {
        let mut ops = self.ops.lock().unwrap().clone();
        ops.sort_by_key(|op| op.id);
        ops
    }

    /// Write the history as JSON lines, invocations and completions in
    /// time order, with `extra` events (the nemesis's faults) among them.
    pub fn write(
        &self,
        path: &Path,
        extra: Vec<(Duration, serde_json::Value)>,
    ) -> std::io::Result<()> {
        let ops = self.ops();
        let mut events: Vec<(Duration, serde_json::Value)> = extra;
        events.reserve(ops.len() * 2);
        for op in &ops {
            events.push((op.invoke, op.json("invoke", op.invoke)));
            let kind = match op.kind() {
                Kind::Ok => "ok",
                Kind::Fail => "fail",
                Kind::Info => "info",
            };
            events.push((op.complete, op.json(kind, op.complete)));
        }
        events.sort_by_key(|(time, _)| *time);
        let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
        for (_, event) in events {
            writeln!(file, "{event}")?;
        }
        file.flush()
    }
}
