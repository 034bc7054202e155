//! The nemesis: while the clients run, it injects one fault at a time —
//! SIGKILL and restart of a gateway, a gateway frozen (SIGSTOP) past its
//! lease and resumed (a stalled lease holder coming back after a takeover
//! or a hold), a store stopped (PostgreSQL `-m immediate`, Redis SIGKILL)
//! or frozen (Redis SIGSTOP, SQLite's write lock held by another
//! connection) and brought back, an upstream that hangs,
//! resets everything or refuses connections — and after each, measures how
//! long until a new key goes through again. On a replicated store (the
//! failover runs) every other fault is a failover of the store instead.
//!
//! On the front store (PostgreSQL with a Redis front) every other fault is
//! one of the front's, in turn (the one injected least so far): its
//! redis-server frozen (SIGSTOP for 1–3 s, then SIGCONT), SIGKILLed and
//! restarted empty (it keeps nothing on disk), or flushed (`FLUSHALL`).
//! The others are drawn as for PostgreSQL alone. A front fault is not a
//! store fault: PostgreSQL holds the truth, so the checker excuses nothing
//! by it. While one lasts, and for [`FRONT_AFTERMATH`] after, the store
//! proxy loses no PostgreSQL reply, so that any answer blaming the store
//! meanwhile is the front's doing (the checker's property 10); and meanwhile the keys
//! answered 2xx shortly before and during it are retried, in rounds, on
//! both instances ([`sweep`]): a front back in use before it caught up
//! would answer some of them 409 after their 2xx (property 7).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::LEASE;
use super::cluster::ChaosStore;
use super::history::Route;
use super::proxy::{FaultProxy, Mode};
use super::workload::{KeyInfo, Workload};

/// Longest a recovery may take before it counts as "never recovered".
pub const RECOVERY_LIMIT: Duration = Duration::from_secs(30);

/// How long after a front fault cleared the store proxy stays calm (and
/// the checker's property 10 still looks): a restarted front's broken
/// connections, a resumed one's late writes show within it.
pub const FRONT_AFTERMATH: Duration = Duration::from_secs(1);

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
    /// A fault of the front store's Redis (never a store fault: it excuses
    /// nothing).
    pub front: bool,
}

/// A fault of the front's redis-server.
#[derive(Debug, Clone, Copy)]
enum FrontFault {
    Freeze,
    Restart,
    Flush,
}

impl FrontFault {
    const ALL: [FrontFault; 3] = [FrontFault::Freeze, FrontFault::Restart, FrontFault::Flush];

    fn name(self) -> &'static str {
        match self {
            FrontFault::Freeze => "front Redis SIGSTOP + SIGCONT",
            FrontFault::Restart => "front Redis SIGKILL + restart (empty)",
            FrontFault::Flush => "front Redis FLUSHALL",
        }
    }
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
    /// On a replicated store: every other fault a failover
    /// ([`ChaosStore::fail_over`]), the others drawn from the gateway and
    /// upstream faults of `All`.
    Failovers,
    /// `Failovers`, with the Redis primary restarted at once, empty,
    /// instead (the negative control: its replicas wipe themselves).
    UnsafeRestarts,
}

/// Inject faults until the workload stops; return what was done.
pub async fn run(
    workload: Arc<Workload>,
    mut store: ChaosStore,
    proxy: Arc<FaultProxy>,
    store_proxy: Option<Arc<FaultProxy>>,
    seed: u64,
    faults_drawn: Faults,
) -> (Vec<FaultRecord>, ChaosStore) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut faults: Vec<FaultRecord> = Vec::new();
    let has_front = matches!(store, ChaosStore::Front { .. });
    let pause = |rng: &mut fastrand::Rng, from: u64, to: u64| {
        tokio::time::sleep(Duration::from_millis(rng.u64(from..to)))
    };
    loop {
        pause(&mut rng, 1_000, 2_500).await;
        if workload.stop.load(Ordering::Relaxed) {
            break;
        }
        let start = workload.elapsed();
        if has_front && faults_drawn == Faults::All && faults.len() % 2 == 1 {
            let calm = |mode| {
                if let Some(store_proxy) = &store_proxy {
                    store_proxy.set_mode(mode);
                }
            };
            calm(Mode::Calm);
            let name = front_fault(&mut store, &mut rng, &faults).await;
            let end = workload.elapsed();
            // Calm for exactly FRONT_AFTERMATH after the fault: the window
            // the checker's property 10 judges.
            let calm_until = end + FRONT_AFTERMATH;
            let (recovery, (), ()) = tokio::join!(
                recover(&workload, &mut rng),
                sweep(&workload, start.saturating_sub(LEASE), calm_until),
                async {
                    tokio::time::sleep(calm_until.saturating_sub(workload.elapsed())).await;
                    calm(Mode::Normal);
                }
            );
            faults.push(FaultRecord {
                name,
                start,
                end,
                recovery,
                store: false,
                front: true,
            });
            continue;
        }
        let draw = match faults_drawn {
            Faults::All => rng.u32(..6),
            Faults::StoreRestarts => 1,
            Faults::Failovers | Faults::UnsafeRestarts if faults.len().is_multiple_of(2) => 6,
            Faults::Failovers | Faults::UnsafeRestarts => [0, 2, 3, 4, 5][rng.usize(..5)],
        };
        let (name, store_fault) = match draw {
            6 => {
                let safely = faults_drawn == Faults::Failovers;
                (store.fail_over(&mut rng, safely).await, true)
            }
            0 => {
                let instance = rng.usize(..workload.gateways.len());
                workload.gateways.kill(instance).await;
                pause(&mut rng, 300, 1_500).await;
                workload.gateways.restart(instance).await;
                ("gateway SIGKILL + restart", false)
            }
            1 => match &mut store {
                ChaosStore::Postgres(pg) | ChaosStore::Front { pg, .. } => {
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
                ChaosStore::PostgresPair { .. } | ChaosStore::RedisSentinel { .. } => {
                    unreachable!("a replicated store only fails over")
                }
                ChaosStore::Redis(redis) => {
                    redis.kill();
                    pause(&mut rng, 500, 2_000).await;
                    redis.restart();
                    let name = match faults_drawn {
                        Faults::All => "Redis SIGKILL + restart (AOF always)",
                        Faults::StoreRestarts => "Redis SIGKILL + restart (no persistence)",
                        Faults::Failovers | Faults::UnsafeRestarts => {
                            unreachable!("a single Redis does not fail over")
                        }
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
            front: false,
        });
    }
    (faults, store)
}

/// One of the front's faults: the one injected least so far (ties drawn).
async fn front_fault(
    store: &mut ChaosStore,
    rng: &mut fastrand::Rng,
    faults: &[FaultRecord],
) -> &'static str {
    let ChaosStore::Front { front, .. } = store else {
        unreachable!("front faults on the front store only")
    };
    let count = |fault: FrontFault| faults.iter().filter(|f| f.name == fault.name()).count();
    let least = FrontFault::ALL.into_iter().map(count).min().unwrap();
    let candidates: Vec<FrontFault> = FrontFault::ALL
        .into_iter()
        .filter(|&fault| count(fault) == least)
        .collect();
    let fault = candidates[rng.usize(..candidates.len())];
    match fault {
        FrontFault::Freeze => {
            front.signal("-STOP");
            tokio::time::sleep(Duration::from_millis(rng.u64(1_000..3_000))).await;
            front.signal("-CONT");
        }
        FrontFault::Restart => {
            front.kill();
            tokio::time::sleep(Duration::from_millis(rng.u64(500..2_000))).await;
            front.restart();
        }
        FrontFault::Flush => {
            use deadpool_redis::redis;
            let client = redis::Client::open(front.url()).expect("the front's URL");
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("the front answers");
            let () = redis::cmd("FLUSHALL")
                .query_async(&mut conn)
                .await
                .expect("FLUSHALL");
        }
    }
    fault.name()
}

/// Most keys one [`sweep`] retries.
const SWEEP_KEYS: usize = 256;

/// Right after a front fault, retry (in rounds, alternating instances,
/// until `until`) the latest keys answered 2xx since `since`: the ones
/// whose attempts may have settled while the front was down or had lost
/// its entries, so that a front brought back before it caught up, still
/// showing such a key in flight, is caught answering 409 after a 2xx
/// (property 7) while that can still show, before the markers' leases end.
async fn sweep(workload: &Workload, since: Duration, until: Duration) {
    use futures_util::StreamExt;
    let keys: std::collections::HashMap<String, KeyInfo> = workload
        .keys()
        .into_iter()
        .map(|info| (info.key.clone(), info))
        .collect();
    let mut ops = workload.history.ops();
    ops.retain(|op| op.is_2xx() && op.complete >= since);
    ops.sort_by_key(|op| std::cmp::Reverse(op.complete));
    let mut seen = std::collections::HashSet::new();
    let targets: Vec<(KeyInfo, bytes::Bytes)> = ops
        .iter()
        .filter(|op| seen.insert(op.key.clone()))
        .filter_map(|op| {
            let info = keys.get(&op.key)?;
            Some((info.clone(), info.body_with_digest(&op.body)?))
        })
        .take(SWEEP_KEYS)
        .collect();
    if targets.is_empty() {
        return;
    }
    let mut round = 0;
    loop {
        futures_util::stream::iter(targets.iter().enumerate())
            .for_each_concurrent(32, |(i, (info, body))| async move {
                let instance = (i + round) % workload.gateways.len();
                workload
                    .request(usize::MAX - 2, instance, info, body.clone(), 0, false)
                    .await;
            })
            .await;
        round += 1;
        if workload.elapsed() >= until {
            return;
        }
    }
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
