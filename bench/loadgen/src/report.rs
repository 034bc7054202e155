//! What the generator prints: a line per second of the run (by due
//! instant, once every request due in it is resolved) and a summary, as
//! text or as one JSON object per line (`--json`). The summary says
//! whether the schedule was kept: a rate the generator could not keep is
//! never reported as offered.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::rusage::Used;
use crate::tally::{Counts, LATE, Second};

/// The schedule counts as kept when at most this share of requests were late.
const KEPT_SHARE: f64 = 0.01;

fn ms(micros: u64) -> f64 {
    (micros as f64 / 10.0).round() / 100.0
}

fn latency(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return json!({"n": 0});
    }
    json!({
        "n": h.len(),
        "p50": ms(h.value_at_quantile(0.50)),
        "p99": ms(h.value_at_quantile(0.99)),
        "max": ms(h.max()),
    })
}

fn latency_text(h: &Histogram<u64>) -> String {
    if h.is_empty() {
        return "none".into();
    }
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (n {})",
        ms(h.value_at_quantile(0.50)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
        h.len()
    )
}

fn counts(c: &Counts) -> serde_json::Map<String, Value> {
    let [c1, c2, c3, c4, c5] = c.classes();
    let status: serde_json::Map<String, Value> = c
        .status
        .iter()
        .map(|(s, n)| (s.to_string(), json!(n)))
        .collect();
    let Value::Object(map) = json!({
        "scheduled": c.scheduled,
        "sent": c.sent(),
        "overrun": c.overrun,
        "late": c.late,
        "answered": c.status.values().sum::<u64>(),
        "classes": {"1xx": c1, "2xx": c2, "3xx": c3, "4xx": c4, "5xx": c5},
        "status": status,
        "503_retry_after": c.unavailable_retry_after,
        "503_without_retry_after": c.unavailable_bare,
        "timeouts": c.timeouts,
        "resets": c.resets,
        "connect_errors": c.connect_errors,
        "errors": c.errors,
        "latency_ms": {"2xx": latency(&c.ok_latency), "503": latency(&c.unavailable_latency)},
    }) else {
        unreachable!("an object")
    };
    map
}

/// One second's line.
pub fn second(index: usize, s: &Second, as_json: bool) -> String {
    let c = &s.counts;
    if as_json {
        let mut map = counts(c);
        map.insert("type".into(), json!("second"));
        map.insert("second".into(), json!(index));
        map.insert("rate".into(), json!(s.rate));
        map.insert("ok_arrived".into(), json!(s.ok_arrived));
        return Value::Object(map).to_string();
    }
    let p = |h: &Histogram<u64>, q| {
        if h.is_empty() {
            "-".into()
        } else {
            format!("{:.2}", ms(h.value_at_quantile(q)))
        }
    };
    format!(
        "second {index}: rate {} scheduled {} sent {} 2xx {} 503 {} (Retry-After {}) other {} \
timeouts {} resets {} connect-errors {} errors {} overrun {} late {} \
2xx p50/p99 {}/{} ms 503 p99 {} ms goodput {}/s",
        s.rate,
        c.scheduled,
        c.sent(),
        c.ok(),
        c.unavailable_retry_after + c.unavailable_bare,
        c.unavailable_retry_after,
        c.status.values().sum::<u64>() - c.ok() - c.unavailable_retry_after - c.unavailable_bare,
        c.timeouts,
        c.resets,
        c.connect_errors,
        c.errors,
        c.overrun,
        c.late,
        p(&c.ok_latency, 0.5),
        p(&c.ok_latency, 0.99),
        p(&c.unavailable_latency, 0.99),
        s.ok_arrived,
    )
}

/// The run, as the summary describes it.
pub struct Run<'a> {
    /// The target.
    pub url: String,
    /// The wall clock at the first due instant.
    pub started: std::time::SystemTime,
    /// The rate at the start.
    pub rate: f64,
    /// Whether a rate file could change it.
    pub rate_file: bool,
    /// How long requests were due.
    pub duration: Duration,
    /// From the first due instant to the last resolution.
    pub elapsed: Duration,
    /// The timeout of each request.
    pub timeout: Duration,
    /// Connections open at most.
    pub connections_max: usize,
    /// Connections opened in all.
    pub connections_opened: u64,
    /// The tests' negative control was on.
    pub closed_loop: bool,
    /// The totals.
    pub totals: &'a Counts,
    /// How far behind schedule dispatches were, µs.
    pub behind: &'a Histogram<u64>,
    /// The generator's own cost.
    pub used: Option<Used>,
}

impl Run<'_> {
    fn kept(&self) -> bool {
        (self.totals.late as f64) <= KEPT_SHARE * self.totals.scheduled as f64
    }

    /// The summary, as text or a JSON line.
    pub fn summary(&self, as_json: bool) -> String {
        let t = self.totals;
        let seconds = self.duration.as_secs_f64();
        let goodput = t.ok() as f64 / seconds;
        let offered = t.scheduled as f64 / seconds;
        let cpu = self.used.map(|u| u.cpu.as_secs_f64());
        let cpu_per_request = cpu.map(|c| c * 1e6 / (t.scheduled.max(1) as f64));
        if as_json {
            let mut map = counts(t);
            let extra = json!({
                "type": "summary",
                "url": self.url,
                "started_unix_s": self
                    .started
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or_default(),
                "rate": self.rate,
                "rate_file": self.rate_file,
                "duration_s": seconds,
                "elapsed_s": self.elapsed.as_secs_f64(),
                "timeout_ms": self.timeout.as_millis() as u64,
                "connections_max": self.connections_max,
                "connections_opened": self.connections_opened,
                "closed_loop": self.closed_loop,
                "offered_per_s": offered,
                "goodput_per_s": goodput,
                "behind_ms": {
                    "p50": ms(self.behind.value_at_quantile(0.5)),
                    "p99": ms(self.behind.value_at_quantile(0.99)),
                    "max": ms(self.behind.max()),
                },
                "rate_kept": self.kept(),
                "cpu_s": cpu,
                "cpu_us_per_request": cpu_per_request,
                "max_rss_kib": self.used.map(|u| u.max_rss_kib),
            });
            if let Value::Object(extra) = extra {
                map.extend(extra);
            }
            return Value::Object(map).to_string();
        }
        let [c1, c2, c3, c4, c5] = t.classes();
        let statuses: Vec<String> = t.status.iter().map(|(s, n)| format!("{s}:{n}")).collect();
        let schedule = if self.kept() {
            format!(
                "kept ({:.2} ms behind at p99, {:.2} ms at most; {} over {} ms late)",
                ms(self.behind.value_at_quantile(0.99)),
                ms(self.behind.max()),
                t.late,
                LATE.as_millis()
            )
        } else {
            format!(
                "NOT KEPT: {} of {} requests were dispatched over {} ms late, up to {:.2} ms \
behind schedule; the load offered was lower and burstier than asked",
                t.late,
                t.scheduled,
                LATE.as_millis(),
                ms(self.behind.max())
            )
        };
        let generator = match self.used {
            Some(u) => format!(
                "cpu {:.2} s ({:.1} µs per request), max rss {} KiB",
                u.cpu.as_secs_f64(),
                cpu_per_request.unwrap_or_default(),
                u.max_rss_kib
            ),
            None => "cpu unknown".into(),
        };
        [
            format!(
                "loadgen: POST {} at {}/s{} for {:.1} s ({}), timeout {:.1} s, at most {} connections ({} opened)",
                self.url,
                self.rate,
                if self.rate_file { " (rate file)" } else { "" },
                seconds,
                if self.closed_loop { "CLOSED loop" } else { "open loop" },
                self.timeout.as_secs_f64(),
                self.connections_max,
                self.connections_opened,
            ),
            format!(
                "scheduled {} = sent {} + client-overrun {}",
                t.scheduled,
                t.sent(),
                t.overrun
            ),
            format!(
                "answers {}: 1xx {c1} 2xx {c2} 3xx {c3} 4xx {c4} 5xx {c5}; 503 with Retry-After {}, without {}; by status {}",
                t.status.values().sum::<u64>(),
                t.unavailable_retry_after,
                t.unavailable_bare,
                statuses.join(" ")
            ),
            format!(
                "no answer: timeouts {}, resets {}, connect errors {}, errors {}",
                t.timeouts, t.resets, t.connect_errors, t.errors
            ),
            format!("latency 2xx: {}", latency_text(&t.ok_latency)),
            format!("latency 503: {}", latency_text(&t.unavailable_latency)),
            format!("goodput {goodput:.1}/s of {offered:.1}/s offered"),
            format!("schedule: {schedule}"),
            format!("generator: {generator}"),
        ]
        .join("\n")
    }
}
