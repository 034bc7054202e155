//! `--log FILE`: every request on a line of its own, written when the run
//! ends (`due_s latency_ms result`), so that a report can cut the run into
//! phases (a store slowing down mid-run) and time the recovery after the
//! load drops to any resolution. `result` is the status (`503ra`: a 503
//! with `Retry-After`), or `timeout`, `reset`, `connect-error`, `error`,
//! `overrun` (not sent; latency 0).

use std::io::{self, BufWriter, Write};
use std::path::Path;

use crate::tally::{Entry, Outcome};

/// Write `entries`, sorted by due instant, to `path`.
pub fn write(path: &Path, mut entries: Vec<Entry>) -> io::Result<()> {
    entries.sort_by_key(|e| e.due);
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    for e in entries {
        let result = match e.outcome {
            Outcome::Answered {
                status: 503,
                retry_after: true,
            } => "503ra".to_string(),
            Outcome::Answered { status, .. } => status.to_string(),
            Outcome::Timeout => "timeout".into(),
            Outcome::Reset => "reset".into(),
            Outcome::ConnectError => "connect-error".into(),
            Outcome::Error => "error".into(),
            Outcome::Overrun => "overrun".into(),
        };
        writeln!(
            out,
            "{:.6} {:.3} {result}",
            e.due.as_secs_f64(),
            e.latency.as_secs_f64() * 1e3
        )?;
    }
    out.flush()
}
