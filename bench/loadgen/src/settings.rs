//! The command line: where to send, at what rate, for how long, and the
//! shape of each request.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use hyper::Uri;

/// An open-loop HTTP/1.1 load generator: request i is due at t0 + i/R,
/// whether or not earlier ones were answered, and its latency counts from
/// that instant.
#[derive(Debug, Parser)]
#[command(name = "loadgen", version)]
pub struct Settings {
    /// Where every request goes (POST), e.g. http://127.0.0.1:8080/v1/payments.
    #[arg(long, value_parser = url)]
    pub url: Uri,
    /// Requests per second at the start.
    #[arg(long, value_parser = rate)]
    pub rate: f64,
    /// How long requests are sent (seconds, or 500ms, 2s, 1m).
    #[arg(long, value_parser = seconds)]
    pub duration: Duration,
    /// A file holding a rate, re-read every 100 ms: the load changes while
    /// running (0 sends nothing until it changes).
    #[arg(long)]
    pub rate_file: Option<PathBuf>,
    /// Size of each request's JSON body.
    #[arg(long, default_value_t = 512)]
    pub body_bytes: usize,
    /// `new`: a fresh Idempotency-Key per request; `none`: no key.
    #[arg(long, value_enum, default_value_t = Key::New)]
    pub key: Key,
    /// Connections open at once at most; a request due when every one is
    /// busy and no more may open is counted as a client overrun, not sent.
    #[arg(long, default_value_t = 1000)]
    pub connections_max: usize,
    /// A request unanswered this long after it was due is a timeout.
    #[arg(long, value_parser = seconds, default_value = "2s")]
    pub timeout: Duration,
    /// One JSON object per line (each second, then the summary) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Write every request (`due_s latency_ms result`) to this file at the end.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Runtime threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// The negative control of the tests: a closed loop, as wrk runs.
    /// A request waits for a free connection (the schedule slips) and its
    /// latency counts from when it was sent (coordinated omission).
    #[arg(long, hide = true)]
    pub closed_loop: bool,
}

/// Whether requests carry an `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Key {
    /// A fresh key per request.
    New,
    /// No key.
    None,
}

fn url(text: &str) -> Result<Uri, String> {
    let uri: Uri = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!("{text:?}: http://HOST:PORT/PATH only"));
    }
    Ok(uri)
}

/// A rate in requests per second (the flag, and the rate file's content).
pub fn rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 0.0 => Ok(r),
        _ => Err(format!("{text:?} is not a rate (requests per second, ≥ 0)")),
    }
}

/// A bare number of seconds (`10`, `0.5`) or a humantime duration (`2s`, `500ms`).
pub fn seconds(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    match text.parse::<f64>() {
        Ok(s) => Duration::try_from_secs_f64(s).map_err(|e| format!("{text:?}: {e}")),
        Err(_) => humantime::parse_duration(text).map_err(|e| format!("{text:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_seconds_or_carry_their_unit() {
        assert_eq!(seconds("10"), Ok(Duration::from_secs(10)));
        assert_eq!(seconds("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(seconds("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(seconds("250ms"), Ok(Duration::from_millis(250)));
        assert!(seconds("soon").is_err());
        assert!(seconds("-1").is_err());
    }

    #[test]
    fn only_plain_http_urls_and_rates_of_zero_or_more() {
        assert!(url("http://127.0.0.1:8080/v1/payments").is_ok());
        assert!(url("https://127.0.0.1/").is_err());
        assert!(url("/v1/payments").is_err());
        assert_eq!(rate("2500"), Ok(2500.0));
        assert_eq!(rate(" 0\n"), Ok(0.0));
        assert!(rate("-5").is_err());
        assert!(rate("fast").is_err());
    }
}
