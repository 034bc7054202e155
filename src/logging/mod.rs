//! Logging: one line per request ([`RequestLine`]) and the gateway's
//! warnings, written to stderr by a background thread so that no request
//! waits on the terminal or a log pipe.
//!
//! A request's thread formats its line (tracing-subscriber's `fmt`, text or
//! JSON) and appends it to one shared buffer, bounded in bytes
//! ([`LOG_BUFFER_BYTES`]); a line that does not fit is dropped, never
//! waited for, and counted (`idemgate_log_lines_dropped_total`). The writer
//! thread is woken only when the buffer goes from empty to not empty, or
//! passes [`FLUSH_AT_BYTES`]; otherwise it takes the whole buffer every
//! [`LINGER`] and writes it with one `write(2)`. So a busy gateway pays no
//! wake-up, no allocation and no system call per line, and a line is
//! written at most [`LINGER`] after it was logged (once stderr takes what
//! came before it). Lines a failed write lost are counted as dropped too.
//!
//! The subscriber is process-wide, and so is its drop counter.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use tracing_subscriber::filter::FilterExt;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::LogFormat;
use crate::telemetry::Tracing;

mod request_line;

pub use request_line::RequestLine;

/// Bytes of formatted lines the buffer holds before it drops (at 100–300
/// bytes a request line, 7,000–20,000 lines).
pub const LOG_BUFFER_BYTES: usize = 2 * 1024 * 1024;

/// Buffered bytes past which the writer is woken at once rather than at
/// its next [`LINGER`].
const FLUSH_AT_BYTES: usize = 64 * 1024;

/// How long the writer lets lines gather before it writes them.
const LINGER: Duration = Duration::from_millis(5);

static SHARED: OnceLock<Arc<Shared>> = OnceLock::new();

/// The format of the lines [`init`] installed, when they are plain text or
/// JSON (no colours): lines of our own ([`RequestLine`]) can then be
/// written straight into [`SHARED`].
static PLAIN: OnceLock<LogFormat> = OnceLock::new();

/// The writer's buffer and the format to write into it, when [`init`]
/// installed a logger that writes no colours.
fn plain_writer() -> Option<(&'static Shared, LogFormat)> {
    Some((SHARED.get()?, *PLAIN.get()?))
}

/// What the request threads and the writer thread share.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    dropped: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Whole lines, in the order they were logged.
    buffer: Vec<u8>,
    /// The writer waits for a first line (woken by it).
    idle: bool,
    /// The writer was asked to write now (the buffer passed
    /// [`FLUSH_AT_BYTES`], or the guard is dropped).
    flush: bool,
    /// The guard was dropped: write what is left and end.
    done: bool,
}

impl Shared {
    /// Append one whole line, or drop and count it.
    fn append(&self, line: &[u8]) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.buffer.len() + line.len() > LOG_BUFFER_BYTES {
            drop(state);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let was_empty = state.buffer.is_empty();
        state.buffer.extend_from_slice(line);
        let wake = (was_empty && state.idle)
            || (!state.flush && state.buffer.len() >= FLUSH_AT_BYTES && {
                state.flush = true;
                true
            });
        drop(state);
        if wake {
            self.wake.notify_one();
        }
    }

    /// The writer thread: wait for lines, let more gather for [`LINGER`]
    /// (unless asked to write now), write them all, repeat; after the guard
    /// is dropped, write what is left and return.
    fn write_forever(&self, out: &mut dyn Write) {
        let mut taken = Vec::new();
        loop {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            while state.buffer.is_empty() && !state.done {
                state.idle = true;
                state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            state.idle = false;
            if !state.flush && !state.done {
                state = self
                    .wake
                    .wait_timeout_while(state, LINGER, |s| !s.flush && !s.done)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            std::mem::swap(&mut state.buffer, &mut taken);
            state.flush = false;
            let done = state.done;
            drop(state);
            // A failed write (stderr closed) loses these lines, as a
            // terminal that went away would: they are counted as dropped.
            if out.write_all(&taken).and_then(|()| out.flush()).is_err() {
                let lines = taken.iter().filter(|&&b| b == b'\n').count();
                self.dropped.fetch_add(lines as u64, Ordering::Relaxed);
            }
            taken.clear();
            // Keep the spare buffer from holding a burst's size forever.
            taken.shrink_to(FLUSH_AT_BYTES);
            if done && self.state.lock().map_or(true, |s| s.buffer.is_empty()) {
                return;
            }
        }
    }
}

/// What `fmt` makes a writer from for each line.
struct Appender(Arc<Shared>);

/// What `fmt` writes one formatted line through (borrowed: no reference
/// count touched per line).
struct Append<'a>(&'a Shared);

impl Write for Append<'_> {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        self.0.append(line);
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Appender {
    type Writer = Append<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Append(&self.0)
    }
}

/// How long dropping the [`LogGuard`] waits for the buffered lines to be
/// written (a stuck stderr must not keep the process from ending).
const FINAL_WRITE: Duration = Duration::from_secs(1);

/// Writes what is still buffered when dropped (waiting at most
/// [`FINAL_WRITE`]): keep it alive until the process ends.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard {
    writer: Option<(Arc<Shared>, std::sync::mpsc::Receiver<()>)>,
}

impl std::fmt::Debug for LogGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogGuard").finish_non_exhaustive()
    }
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        if let Some((shared, finished)) = self.writer.take() {
            shared.state.lock().unwrap_or_else(|e| e.into_inner()).done = true;
            shared.wake.notify_one();
            // Gone (or never ending, blocked on stderr): the process goes on
            // ending either way.
            let _ = finished.recv_timeout(FINAL_WRITE);
        }
    }
}

/// What `serve` logs unless `RUST_LOG` says otherwise: `info` (one line
/// per request), sqlx's migration notices kept to warnings.
pub const SERVE_FILTER: &str = "info,sqlx=warn";

/// What every other command logs unless `RUST_LOG` says otherwise:
/// warnings and errors only; what they print on stdout is their result.
pub const COMMAND_FILTER: &str = "warn";

/// Install the process's logger: `RUST_LOG` filters, else `default` (one
/// of [`SERVE_FILTER`] and [`COMMAND_FILTER`]). With `tracing`, its layer
/// is installed beside the log lines, which never show its spans. A
/// second call installs nothing and returns an empty guard.
pub fn init(format: LogFormat, default: &str, tracing: Option<&Tracing>) -> LogGuard {
    if SHARED.get().is_some() {
        return LogGuard { writer: None };
    }
    let shared = Arc::new(Shared::default());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let installed = match tracing {
        None => {
            let builder = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(std::io::stderr().is_terminal())
                .with_writer(Appender(shared.clone()));
            match format {
                LogFormat::Text => builder.try_init(),
                LogFormat::Json => builder.json().flatten_event(true).try_init(),
            }
        }
        Some(tracing) => {
            use tracing_subscriber::layer::SubscriberExt;
            use tracing_subscriber::util::SubscriberInitExt;
            // Per-layer filters: the log lines never see the exported
            // spans (they would prefix every line), the exporter sees
            // nothing else.
            let filter = filter.and(tracing_subscriber::filter::filter_fn(|meta| {
                !meta.target().starts_with(crate::telemetry::TARGET)
            }));
            let lines = tracing_subscriber::fmt::layer()
                .with_ansi(std::io::stderr().is_terminal())
                .with_writer(Appender(shared.clone()));
            let lines = match format {
                LogFormat::Text => lines.with_filter(filter).boxed(),
                LogFormat::Json => lines.json().flatten_event(true).with_filter(filter).boxed(),
            };
            tracing_subscriber::registry()
                .with(lines)
                .with(tracing.layer())
                .try_init()
                .map_err(Into::into)
        }
    };
    if installed.is_err() || SHARED.set(shared.clone()).is_err() {
        return LogGuard { writer: None };
    }
    if !std::io::stderr().is_terminal() {
        let _ = PLAIN.set(format);
    }
    let writer = shared.clone();
    let (finished, finished_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("idemgate-log".into())
        .spawn(move || {
            writer.write_forever(&mut std::io::stderr());
            let _ = finished.send(());
        })
        .expect("cannot start the log writer thread");
    LogGuard {
        writer: Some((shared, finished_rx)),
    }
}

/// Log lines dropped because the buffer was full, since [`init`].
pub fn dropped_lines() -> u64 {
    SHARED
        .get()
        .map_or(0, |shared| shared.dropped.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer the test can read after the thread wrote to it.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn writer(shared: &Arc<Shared>, sink: &Sink) -> std::thread::JoinHandle<()> {
        let (shared, mut sink) = (shared.clone(), sink.clone());
        std::thread::spawn(move || shared.write_forever(&mut sink))
    }

    fn finish(shared: &Arc<Shared>, thread: std::thread::JoinHandle<()>) {
        shared.state.lock().unwrap().done = true;
        shared.wake.notify_one();
        thread.join().unwrap();
    }

    /// Lines from many threads arrive whole, each thread's in order, and
    /// the last ones are written when the writer is stopped.
    #[test]
    fn lines_from_many_threads_arrive_whole_and_in_order() {
        let shared = Arc::new(Shared::default());
        let sink = Sink::default();
        let thread = writer(&shared, &sink);
        std::thread::scope(|scope| {
            for t in 0..4 {
                let shared = &shared;
                scope.spawn(move || {
                    for i in 0..5_000 {
                        Append(shared)
                            .write_all(
                                format!("thread={t} line={i} {}\n", "x".repeat(i % 97)).as_bytes(),
                            )
                            .unwrap();
                    }
                });
            }
        });
        finish(&shared, thread);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let mut next = [0usize; 4];
        for line in text.lines() {
            let mut words = line.split(' ');
            let t: usize = words.next().unwrap()["thread=".len()..].parse().unwrap();
            let i: usize = words.next().unwrap()["line=".len()..].parse().unwrap();
            assert_eq!(i, next[t], "thread {t}: line {i} out of order");
            assert_eq!(words.next().unwrap_or("").len(), i % 97, "a torn line");
            next[t] += 1;
        }
        assert_eq!(next, [5_000; 4]);
        assert_eq!(shared.dropped.load(Ordering::Relaxed), 0);
    }

    /// With nobody writing the buffer out, lines past its bound are
    /// dropped and counted, never waited for; what fitted is written once
    /// the writer runs.
    #[test]
    fn a_full_buffer_drops_and_counts() {
        let shared = Arc::new(Shared::default());
        let line = vec![b'x'; 1023];
        let fits = LOG_BUFFER_BYTES / 1024;
        for _ in 0..fits + 10 {
            Append(&shared)
                .write_all(&[&line[..], b"\n"].concat())
                .unwrap();
        }
        assert_eq!(shared.dropped.load(Ordering::Relaxed), 10);
        let sink = Sink::default();
        let thread = writer(&shared, &sink);
        finish(&shared, thread);
        assert_eq!(sink.0.lock().unwrap().len(), fits * 1024);
    }
}
