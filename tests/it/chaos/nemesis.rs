//! The nemesis: while the clients run, it injects one fault at a time —
//! SIGKILL and restart of a gateway, a gateway frozen (SIGSTOP) past its
//! lease and resumed (a stalled lease holder coming back after a takeover
//! or a hold), a store stopped (PostgreSQL `-m immediate`, Redis SIGKILL)
//! or frozen (Redis SIGSTOP, SQLite's write lock held by another
//! connection) and brought back, an upstream that hangs,
//! resets everything or refuses connections — and after each, measures how
//! long until a new key goes through again.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::cluster::ChaosStore;
use super::history::Route;
use super::proxy::{FaultProxy, Mode};
use super::workload::Workload;

/// Longest a recovery may take before it counts as "never recovered".
pub const RECOVERY_LIMIT: Duration = Duration::from_secs(30);

/// One injected fault.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    pub name: &'static str,
    pub start: Duration,
    /// When the fault was cleared (the component is back).
    pub end: Duration,
    /// From `end` to the first new key answered 2xx; `None` if that took
    /// longer than [`RECOVERY_LIMIT`].
    pub recovery: Option<Duration>,
    /// A store fault: stored writes may land late, when the store resumes.
    pub store: bool,
}

/// Which faults the nemesis draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Faults {
    /// Gateway kills, store stops and freezes, upstream hangs and resets.
    All,
    /// Only store restarts (SIGKILL for Redis): with a Redis that keeps
    /// nothing on disk, each one loses every record, which the checker must
    /// report (the negative control).
    StoreRestarts,
}

/// Inject faults until the workload stops; return what was done.
pub async fn run(
    workload: Arc<Workload>,
    mut store: ChaosStore,
    proxy: Arc<FaultProxy>,
    seed: u64,
    faults_drawn: Faults,
) -> (Vec<FaultRecord>, ChaosStore) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut faults = Vec::new();
    let pause = |rng: &mut fastrand::Rng, from: u64, to: u64| {
        tokio::time::sleep(Duration::from_millis(rng.u64(from..to)))
    };
    loop {
        pause(&mut rng, 1_000, 2_500).await;
        if workload.stop.load(Ordering::Relaxed) {
            break;
        }
        let start = workload.elapsed();
        let draw = match faults_drawn {
            Faults::All => rng.u32(..6),
            Faults::StoreRestarts => 1,
        };
        let (name, store_fault) = match draw {
            0 => {
                let instance = rng.usize(..workload.gateways.len());
                workload.gateways.kill(instance).await;
                pause(&mut rng, 300, 1_500).await;
                workload.gateways.restart(instance).await;
                ("gateway SIGKILL + restart", false)
            }
            1 => match &mut store {
                ChaosStore::Postgres(pg) => {
                    pg.stop_immediate().await;
                    pause(&mut rng, 1_000, 3_000).await;
                    pg.start().await;
                    ("PostgreSQL stop -m immediate + start", true)
                }
                ChaosStore::Redis(redis) if faults_drawn == Faults::All && rng.bool() => {
                    redis.signal("-STOP");
                    pause(&mut rng, 1_000, 3_000).await;
                    redis.signal("-CONT");
                    ("Redis SIGSTOP + SIGCONT", true)
                }
                ChaosStore::Sqlite(file) => {
                    let held = Duration::from_millis(rng.u64(1_000..3_000));
                    file.hold_write_lock(held).await;
                    ("SQLite write lock held by another connection", true)
                }
                ChaosStore::Redis(redis) => {
                    redis.kill();
                    pause(&mut rng, 500, 2_000).await;
                    redis.restart();
                    let name = match faults_drawn {
                        Faults::All => "Redis SIGKILL + restart (AOF always)",
                        Faults::StoreRestarts => "Redis SIGKILL + restart (no persistence)",
                    };
                    (name, true)
                }
            },
            4 => {
                let instance = rng.usize(..workload.gateways.len());
                workload.gateways.signal(instance, "-STOP").await;
                pause(&mut rng, 1_000, 3_500).await;
                workload.gateways.signal(instance, "-CONT").await;
                ("gateway SIGSTOP + SIGCONT", false)
            }
            5 => {
                proxy.set_mode(Mode::Refuse);
                pause(&mut rng, 500, 1_500).await;
                proxy.set_mode(Mode::Normal);
                ("upstream refuses connections", false)
            }
            2 => {
                proxy.set_mode(Mode::HangAll);
                pause(&mut rng, 1_000, 2_000).await;
                proxy.set_mode(Mode::Normal);
                ("upstream hangs", false)
            }
            _ => {
                proxy.set_mode(Mode::ResetAll);
                pause(&mut rng, 500, 1_000).await;
                proxy.set_mode(Mode::Normal);
                ("upstream resets connections", false)
            }
        };
        let end = workload.elapsed();
        let recovery = recover(&workload, &mut rng).await;
        faults.push(FaultRecord {
            name,
            start,
            end,
            recovery,
            store: store_fault,
        });
    }
    (faults, store)
}

/// Send new keys (alternating instances) until one is answered 2xx.
async fn recover(workload: &Workload, rng: &mut fastrand::Rng) -> Option<Duration> {
    let from = workload.elapsed();
    let mut instance = rng.usize(..workload.gateways.len());
    while workload.elapsed() - from < RECOVERY_LIMIT {
        let info = workload.new_key(Route::Release);
        let op = workload
            .request(
                usize::MAX,
                instance,
                &info,
                info.canonical.clone(),
                0,
                false,
            )
            .await;
        if op.is_2xx() {
            return Some(op.complete - from);
        }
        instance = (instance + 1) % workload.gateways.len();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
