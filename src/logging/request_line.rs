//! The request line: one per answered request (target
//! `idemgate::request`), the gateway's access log.
//!
//! It says what tracing-subscriber's `fmt` would say for the same event,
//! byte for byte but the timestamp's instant (a test holds the two
//! together), in text or JSON. When the logger [`super::init`] installed
//! writes plain text or JSON (no colours), the line is written here, into
//! a buffer of the request's thread, and appended to the log writer's
//! shared buffer in one piece: no field visitor, no `fmt::Debug` per
//! value, no float formatting. That was about a tenth of a replay's CPU
//! through `fmt` (perf, bench/results/2026-11-29-replay-path.md).
//! Anywhere else (colours at a terminal, no logger of ours installed, a
//! test's subscriber) the same event goes through `tracing::info!`.
//!
//! `RUST_LOG` decides as for any event: the line is written only when
//! target `idemgate::request` is enabled at `info`.

use std::cell::RefCell;
use std::io::Write;
use std::time::{Duration, SystemTime};

use crate::config::LogFormat;

/// The target of the request lines.
const TARGET: &str = "idemgate::request";

/// One answered request, as logged.
#[derive(Debug, Clone, Copy)]
pub struct RequestLine<'a> {
    /// The request's method.
    pub method: &'a http::Method,
    /// The request's path (without the query).
    pub path: &'a str,
    /// The route it matched (`-` when none did).
    pub route: &'a str,
    /// What the gateway did (`Outcome::as_str`).
    pub outcome: &'a str,
    /// The answer's status.
    pub status: u16,
    /// From the request's head to its answer.
    pub latency: Duration,
    /// The key's short digest (`-` without a key).
    pub key: &'a str,
    /// The fencing token of the attempt that forwarded it.
    pub token: Option<i64>,
    /// The request's trace (when traces are exported).
    pub trace_id: Option<&'a str>,
}

thread_local! {
    /// Each thread's line, reused.
    static LINE: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(256));
}

/// The longest line buffer a thread keeps between lines.
const KEPT_LINE_BYTES: usize = 4096;

impl RequestLine<'_> {
    /// Log the line, if `idemgate::request` is enabled at `info`.
    pub fn log(&self) {
        // Asked with the event's own fields, so that a `RUST_LOG` directive
        // naming fields (`idemgate::request[{status}]=info`) sees the
        // metadata the event has (tested). (An `enabled!` with no event after it
        // leaves per-layer filter state set, tokio-rs/tracing#2519:
        // harmless while the log lines' and the exporter's filters never
        // both take one callsite; mind it before adding a filtered layer.)
        if !tracing::enabled!(
            target: TARGET,
            tracing::Level::INFO,
            message,
            method,
            path,
            route,
            outcome,
            status,
            latency_ms,
            key,
            token,
            trace_id
        ) {
            return;
        }
        let Some((shared, format)) = super::plain_writer() else {
            self.through_tracing();
            return;
        };
        LINE.with(|line| {
            let mut line = line.borrow_mut();
            line.clear();
            self.write(&mut line, format, SystemTime::now());
            shared.append(&line);
            line.shrink_to(KEPT_LINE_BYTES);
        });
    }

    /// The same event through tracing (and whatever subscriber is there).
    fn through_tracing(&self) {
        tracing::info!(
            target: TARGET,
            method = %self.method,
            path = %self.path,
            route = self.route,
            outcome = self.outcome,
            status = self.status,
            latency_ms = latency_ms(self.latency),
            key = self.key,
            token = self.token,
            trace_id = self.trace_id,
            "request"
        );
    }

    /// The line as `fmt` writes it in `format` (no colours), at `now`.
    fn write(&self, out: &mut Vec<u8>, format: LogFormat, now: SystemTime) {
        let timestamp = humantime::format_rfc3339_micros(now);
        let mut numbers = itoa::Buffer::new();
        match format {
            LogFormat::Text => {
                let _ = write!(out, "{timestamp}  INFO {TARGET}: request method=");
                out.extend_from_slice(self.method.as_str().as_bytes());
                out.extend_from_slice(b" path=");
                out.extend_from_slice(self.path.as_bytes());
                out.extend_from_slice(b" route=");
                debug_str(out, self.route);
                out.extend_from_slice(b" outcome=");
                debug_str(out, self.outcome);
                out.extend_from_slice(b" status=");
                out.extend_from_slice(numbers.format(self.status).as_bytes());
                out.extend_from_slice(b" latency_ms=");
                write_ms(out, self.latency);
                out.extend_from_slice(b" key=");
                debug_str(out, self.key);
                if let Some(token) = self.token {
                    out.extend_from_slice(b" token=");
                    out.extend_from_slice(numbers.format(token).as_bytes());
                }
                if let Some(trace_id) = self.trace_id {
                    out.extend_from_slice(b" trace_id=");
                    debug_str(out, trace_id);
                }
            }
            LogFormat::Json => {
                let _ = write!(
                    out,
                    r#"{{"timestamp":"{timestamp}","level":"INFO","message":"request","method":"#
                );
                json_str(out, self.method.as_str());
                out.extend_from_slice(br#","path":"#);
                json_str(out, self.path);
                out.extend_from_slice(br#","route":"#);
                json_str(out, self.route);
                out.extend_from_slice(br#","outcome":"#);
                json_str(out, self.outcome);
                out.extend_from_slice(br#","status":"#);
                out.extend_from_slice(numbers.format(self.status).as_bytes());
                out.extend_from_slice(br#","latency_ms":"#);
                write_ms(out, self.latency);
                out.extend_from_slice(br#","key":"#);
                json_str(out, self.key);
                if let Some(token) = self.token {
                    out.extend_from_slice(br#","token":"#);
                    out.extend_from_slice(numbers.format(token).as_bytes());
                }
                if let Some(trace_id) = self.trace_id {
                    out.extend_from_slice(br#","trace_id":"#);
                    json_str(out, trace_id);
                }
                out.extend_from_slice(br#","target":""#);
                out.extend_from_slice(TARGET.as_bytes());
                out.push(b'"');
                out.push(b'}');
            }
        }
        out.push(b'\n');
    }
}

/// The latency in milliseconds, to the microsecond.
fn latency_ms(latency: Duration) -> f64 {
    u64::try_from(latency.as_micros()).unwrap_or(u64::MAX) as f64 / 1000.0
}

/// [`latency_ms`] as `fmt` writes an `f64` (its `Debug`): the shortest
/// decimal, no trailing zeros but one after a whole number (`0.28`, `1.5`,
/// `2.0`).
fn write_ms(out: &mut Vec<u8>, latency: Duration) {
    let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    if micros >= 1 << 53 {
        // Past what an f64 holds exactly: as f64 writes it.
        let _ = write!(out, "{:?}", latency_ms(latency));
        return;
    }
    let mut numbers = itoa::Buffer::new();
    out.extend_from_slice(numbers.format(micros / 1000).as_bytes());
    let mut fraction = micros % 1000;
    if fraction == 0 {
        out.extend_from_slice(b".0");
        return;
    }
    let mut digits = 3;
    while fraction % 10 == 0 {
        fraction /= 10;
        digits -= 1;
    }
    out.push(b'.');
    let text = numbers.format(fraction);
    out.extend(std::iter::repeat_n(b'0', digits - text.len()));
    out.extend_from_slice(text.as_bytes());
}

/// A `&str` as `fmt::Debug` writes it (quoted, escaped): copied when
/// nothing in it needs escaping, as in the names and digests logged.
fn debug_str(out: &mut Vec<u8>, value: &str) {
    let plain = |b: u8| (b.is_ascii_graphic() && b != b'"' && b != b'\\') || b == b' ';
    if value.bytes().all(plain) {
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    } else {
        let _ = write!(out, "{value:?}");
    }
}

/// A `&str` as a JSON string (serde_json's escaping, as `fmt`'s JSON).
fn json_str(out: &mut Vec<u8>, value: &str) {
    let _ = serde_json::to_writer(&mut *out, value);
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What tracing-subscriber's `fmt` writes, captured.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The line `fmt` writes for `line` (through [`RequestLine::log`],
    /// which finds no logger of ours installed here), its timestamp cut.
    fn through_fmt(line: &RequestLine<'_>, format: LogFormat) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone());
        let dispatch = match format {
            LogFormat::Text => tracing::Dispatch::new(builder.finish()),
            LogFormat::Json => tracing::Dispatch::new(builder.json().flatten_event(true).finish()),
        };
        tracing::dispatcher::with_default(&dispatch, || line.log());
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        without_timestamp(&text)
    }

    fn written(line: &RequestLine<'_>, format: LogFormat) -> String {
        let mut out = Vec::new();
        line.write(&mut out, format, SystemTime::now());
        without_timestamp(&String::from_utf8(out).unwrap())
    }

    /// The line with its RFC 3339 timestamp (to the microsecond) replaced.
    fn without_timestamp(line: &str) -> String {
        let at = line.find("20").expect("a timestamp");
        let end = line[at..].find('Z').expect("a UTC timestamp") + at + 1;
        assert_eq!(end - at, "2026-11-29T16:39:18.987214Z".len(), "{line}");
        format!("{}<timestamp>{}", &line[..at], &line[end..])
    }

    fn lines() -> Vec<RequestLine<'static>> {
        let post = &http::Method::POST;
        let base = RequestLine {
            method: post,
            path: "/v1/payments",
            route: "api",
            outcome: "replayed",
            status: 201,
            latency: Duration::from_micros(280),
            key: "ba7816bf8f01",
            token: None,
            trace_id: None,
        };
        let odd = Box::leak(Box::new(http::Method::from_bytes(b"PURGE").unwrap()));
        vec![
            base,
            RequestLine {
                token: Some(42),
                trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736"),
                latency: Duration::from_micros(14_355),
                ..base
            },
            RequestLine {
                method: odd,
                route: "-",
                key: "-",
                outcome: "no_route",
                status: 404,
                latency: Duration::from_millis(3),
                ..base
            },
            RequestLine {
                route: "quote\" back\\slash tab\t é",
                path: "/with space/é",
                latency: Duration::from_micros(1_000_001),
                token: Some(-1),
                ..base
            },
            RequestLine {
                latency: Duration::from_micros(5),
                ..base
            },
        ]
    }

    /// Line for line, what this module writes is what `fmt` writes, in
    /// text and in JSON, from the timestamp's end on. (The control: a line
    /// with another field order or quoting differs, checked below.)
    #[test]
    fn the_line_is_what_fmt_writes() {
        for format in [LogFormat::Text, LogFormat::Json] {
            for line in lines() {
                assert_eq!(
                    written(&line, format),
                    through_fmt(&line, format),
                    "{format:?}"
                );
            }
        }
    }

    /// The control of the comparison above: lines that differ from `fmt`'s
    /// in one way each (a field left out, a value unquoted, a latency
    /// with a trailing zero, fields in another order) are told apart.
    #[test]
    fn a_line_unlike_fmt_is_told_apart() {
        let line = RequestLine {
            token: Some(7),
            ..lines()[0]
        };
        let fmt = through_fmt(&line, LogFormat::Text);
        let ours = written(&line, LogFormat::Text);
        assert_eq!(ours, fmt);
        for broken in [
            ours.replace(" token=7", ""),
            ours.replace(r#"route="api""#, "route=api"),
            ours.replace("latency_ms=0.28 ", "latency_ms=0.280 "),
            ours.replace(
                r#"route="api" outcome="replayed""#,
                r#"outcome="replayed" route="api""#,
            ),
        ] {
            assert_ne!(broken, ours, "the mutation applied");
            assert_ne!(broken, fmt, "a line unlike fmt's passed: {broken}");
        }
    }

    /// Whether `line` is logged under the `RUST_LOG`-style `filter`.
    fn logged_under(filter: &str, line: &RequestLine<'_>) -> bool {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || line.log());
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        text.contains("idemgate::request: request ")
    }

    /// `RUST_LOG` decides as it does for the event itself, directives that
    /// name its fields included (they match only metadata that has them).
    #[test]
    fn rust_log_decides_field_directives_included() {
        let line = lines()[1];
        assert!(logged_under("info", &line));
        assert!(!logged_under("warn", &line));
        assert!(logged_under("warn,idemgate::request=info", &line));
        assert!(logged_under("warn,idemgate::request[{status}]=info", &line));
        // The control: a field the line does not have.
        assert!(!logged_under(
            "warn,idemgate::request[{nosuch}]=info",
            &line
        ));
    }

    #[test]
    fn milliseconds_are_written_as_f64_debug_writes_them() {
        for micros in [
            0,
            1,
            5,
            10,
            280,
            999,
            1000,
            1500,
            14_355,
            1_000_001,
            123_456_789,
        ] {
            let mut out = Vec::new();
            write_ms(&mut out, Duration::from_micros(micros));
            assert_eq!(
                String::from_utf8(out).unwrap(),
                format!("{:?}", micros as f64 / 1000.0),
                "{micros} µs"
            );
        }
    }
}
