//! The command line, and the delay file followed while running.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How to run it.
pub const USAGE: &str = "usage: delay-line --listen ADDR --to ADDR --delay DURATION \
[--delay-file PATH] [--report SECONDS]   (DURATION: 250us, 1ms, 2.5ms, 0)";

/// What the command line asked for.
#[derive(Debug, PartialEq)]
pub struct Settings {
    /// Where clients connect.
    pub listen: SocketAddr,
    /// Where their connections are joined to.
    pub to: SocketAddr,
    /// One-way delay at the start.
    pub delay: Duration,
    /// A file holding a duration, re-read every 100 ms.
    pub delay_file: Option<PathBuf>,
    /// Print the CPU time used this often.
    pub report: Option<Duration>,
}

impl Settings {
    /// Parse the arguments (without the program's name).
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let (mut listen, mut to, mut delay, mut delay_file, mut report) =
            (None, None, None, None, None);
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--listen" => listen = Some(address(&value)?),
                "--to" => to = Some(address(&value)?),
                "--delay" => delay = Some(duration(&value)?),
                "--delay-file" => delay_file = Some(PathBuf::from(value)),
                "--report" => report = Some(duration(&format!("{value}s"))?),
                other => return Err(format!("unknown flag {other}")),
            }
        }
        Ok(Self {
            listen: listen.ok_or("--listen is required")?,
            to: to.ok_or("--to is required")?,
            delay: delay.ok_or("--delay is required")?,
            delay_file,
            report,
        })
    }
}

fn address(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|e| format!("{text:?} is not an address (127.0.0.1:5432): {e}"))
}

/// `250us`, `1ms`, `2.5ms`, `1s`, or `0`.
pub fn duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?} has no unit (us, ms or s)"))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|e| format!("{text:?} is not a duration: {e}"))?;
    let scale = match unit {
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(format!("{text:?}: the unit is us, ms or s")),
    };
    Duration::try_from_secs_f64(number * scale).map_err(|e| format!("{text:?}: {e}"))
}

/// Re-read `path` every 100 ms and put its duration in force; a file that
/// is missing or unreadable leaves the delay as it was (and says so once).
pub fn follow(path: PathBuf, delay: Arc<AtomicU64>) {
    std::thread::spawn(move || {
        let mut complained = false;
        loop {
            match std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|t| duration(&t))
            {
                Ok(d) => {
                    let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                    if delay.swap(nanos, Ordering::Relaxed) != nanos {
                        eprintln!("delay-line: delay now {d:?}");
                    }
                    complained = false;
                }
                Err(e) if !complained => {
                    eprintln!("delay-line: {}: {e}; the delay stays", path.display());
                    complained = true;
                }
                Err(_) => {}
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_their_unit() {
        assert_eq!(duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(duration("2.5ms"), Ok(Duration::from_micros(2500)));
        assert_eq!(duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        assert!(duration("5").is_err());
        assert!(duration("5m").is_err());
    }

    #[test]
    fn every_address_is_required() {
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert!(Settings::from_args(args("--listen 127.0.0.1:1 --delay 1ms")).is_err());
        let s = Settings::from_args(args("--listen 127.0.0.1:1 --to 127.0.0.1:2 --delay 1ms"));
        assert_eq!(s.unwrap().delay, Duration::from_millis(1));
    }
}
