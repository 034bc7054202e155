//! Logging: one line per request and the gateway's warnings, written to
//! stderr by a background thread so that no request waits on the terminal
//! or a log pipe. The queue between them is bounded ([`LOG_QUEUE_LINES`]);
//! when it is full a line is dropped, never waited for, and counted
//! (`idemgate_log_lines_dropped_total`).
//!
//! The subscriber is process-wide, and so is its drop counter.

use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Lines the log queue holds before it drops (at a few hundred bytes a
/// line, a few MiB at most).
pub const LOG_QUEUE_LINES: usize = 16_384;

/// Bytes the writer thread gathers before a write(2); it flushes whenever
/// the queue runs empty, so a line never waits for more to come.
const LOG_BUFFER_BYTES: usize = 64 * 1024;

static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Flushes the queued lines when dropped: keep it alive until the process
/// ends.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard {
    _writer: Option<WorkerGuard>,
}

/// Install the process's logger (`RUST_LOG` filters; default `info`, sqlx
/// at `warn`). A second call installs nothing and returns an empty guard.
pub fn init(format: LogFormat) -> LogGuard {
    if DROPPED.get().is_some() {
        return LogGuard { _writer: None };
    }
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .thread_name("idemgate-log")
        // Buffered: the writer thread flushes once per batch of queued
        // lines, one write(2) for all of them instead of one per line.
        .finish(std::io::BufWriter::with_capacity(
            LOG_BUFFER_BYTES,
            std::io::stderr(),
        ));
    // sqlx reports migration notices at INFO on every start: keep it to warnings.
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let counter = writer.error_counter();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if installed.is_err() {
        return LogGuard { _writer: None };
    }
    let _ = DROPPED.set(counter);
    LogGuard {
        _writer: Some(guard),
    }
}

/// Log lines dropped because the queue was full, since [`init`].
pub fn dropped_lines() -> u64 {
    DROPPED
        .get()
        .map_or(0, |counter| counter.dropped_lines() as u64)
}
