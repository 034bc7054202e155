//! The arrival schedule. Open loop: request i+1 is due 1/R after request
//! i, whatever became of earlier ones; each is dispatched at its due
//! instant (or at once, if the generator fell behind, which is counted)
//! and its latency counts from that instant. The rate can change while
//! running (`--rate-file`, re-read every 100 ms). Closed loop (the tests'
//! negative control): a request first waits for one of the connections,
//! so the schedule slips, and its latency counts from when it was sent.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::{Instant, sleep, sleep_until};

use crate::shoot::Shooter;
use crate::tally::Tally;

/// The longest the scheduler sleeps before it looks at the rate again.
const LOOK: Duration = Duration::from_millis(100);

/// The rate in force, shared with the file follower.
#[derive(Debug)]
pub struct Rate(AtomicU64);

impl Rate {
    /// `r` requests per second.
    pub fn new(r: f64) -> Self {
        Self(AtomicU64::new(r.to_bits()))
    }

    /// Requests per second now.
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    fn set(&self, r: f64) -> f64 {
        f64::from_bits(self.0.swap(r.to_bits(), Ordering::Relaxed))
    }

    /// Re-read `path` every 100 ms and put its rate in force; a missing or
    /// unreadable file leaves the rate as it was (said once).
    pub fn follow(self: &Arc<Self>, path: PathBuf) {
        let rate = Arc::clone(self);
        std::thread::spawn(move || {
            let mut complained = false;
            loop {
                match std::fs::read_to_string(&path)
                    .map_err(|e| e.to_string())
                    .and_then(|t| crate::settings::rate(&t))
                {
                    Ok(r) => {
                        if rate.set(r) != r {
                            eprintln!("loadgen: rate now {r}/s");
                        }
                        complained = false;
                    }
                    Err(e) if !complained => {
                        eprintln!("loadgen: {}: {e}; the rate stays", path.display());
                        complained = true;
                    }
                    Err(_) => {}
                }
                std::thread::sleep(LOOK);
            }
        });
    }
}

/// Send requests from `tally.t0` for `duration` at `rate`; returns when
/// the last one was dispatched (not answered).
pub async fn run(
    shooter: Arc<Shooter>,
    tally: Arc<Tally>,
    rate: Arc<Rate>,
    duration: Duration,
    timeout: Duration,
    closed_loop: Option<usize>,
) {
    let end = tally.t0 + duration;
    let connections = closed_loop.map(|n| Arc::new(Semaphore::new(n)));
    let mut last: Option<Instant> = None;
    let mut i = 0u64;
    loop {
        let r = rate.get();
        if r <= 0.0 {
            // Nothing is due; when the rate rises, the first one is due then.
            if Instant::now() >= end {
                break;
            }
            sleep(Duration::from_millis(10)).await;
            last = Some(Instant::now());
            continue;
        }
        let due = last.map_or(tally.t0, |l| l + Duration::from_secs_f64(1.0 / r));
        if due >= end {
            break;
        }
        let now = Instant::now();
        if due > now {
            let wake = due.min(now + LOOK);
            sleep_until(wake).await;
            if wake < due {
                continue; // the rate may have changed meanwhile
            }
        }
        let permit = match &connections {
            Some(c) => Some(Arc::clone(c).acquire_owned().await.expect("never closed")),
            None => None,
        };
        let dispatched = Instant::now();
        tally.scheduled(due, dispatched.saturating_duration_since(due), r);
        // Open loop: latency from the due instant; closed: from the send.
        let from = if connections.is_some() {
            dispatched
        } else {
            due
        };
        last = Some(from);
        let (shooter, tally) = (Arc::clone(&shooter), Arc::clone(&tally));
        tokio::spawn(async move {
            let outcome = shooter.shoot(i, from + timeout).await;
            tally.resolved(due, from, Instant::now(), outcome);
            drop(permit);
        });
        i += 1;
    }
}
