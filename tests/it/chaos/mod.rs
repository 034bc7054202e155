//! The chaos harness (docs/src/guide/guarantees.md, issue #4): two real gateway processes
//! share a private store and sit in front of a recording upstream behind a
//! TCP fault proxy; client tasks send new keys, retries, reused keys and
//! same-key storms while a nemesis kills gateways, stops or freezes the
//! store and makes the upstream hang or reset. Afterwards, with every fault
//! cleared and both gateways restarted (no replay cache), each key is probed
//! once more, and a checker reads the whole history (see `checker.rs` for
//! the properties, G5 among them as it happens: once a 2xx reached a
//! client, no later 409 or held answer).
//!
//! Every gateway started during the chaos is armed (`FAILPOINTS`) to abort
//! in one of four kill windows ([`cluster::WINDOWS`]); a supervisor counts
//! the window each dead gateway names and restarts it, and every window
//! must be hit. Slow routes (their upstream slower than their lease) keep
//! leases alive by renewal, and the checker reads the store's records at
//! the end and reconciles them with the upstream's ledger.
//!
//! The `inquire` route (`on_unknown_outcome = "inquire"`,
//! docs/src/guide/status-inquiry.md) asks the recording upstream's lookup,
//! `GET …/inquire/idempotency/{key}` (answered from its ledger), through
//! the same fault proxy as its requests: faulted like them (and then asked
//! again), but never lying, since the proxy loses answers and never
//! delivers a request late. Two clients send its keys to paths where the
//! upstream acts, resets after acting (`/reset`), drops before acting
//! (`/drop-once`) or hangs (`/hang`), and retry each until a 2xx; storms
//! and the other clients' retries reach it too, and the nemesis kills its
//! gateways mid-forward like any other. The checker's property 12: no key
//! of the route executed twice, none left `held` or `inquiring` in the
//! store at the end (the lookup answers again by then: the final probes
//! retry `409 outcome-pending` until it has settled each key), and a key
//! answered 2xx is replayed with the same bytes (its execution's answer,
//! or the lookup's, which the gateway recorded).
//!
//! The front store (PostgreSQL with a Redis front, `[store.front]`) runs
//! the same way, on the postgres run's private cluster behind the same
//! store proxy, with a private redis-server as its front (no persistence,
//! reached directly, the default front timeout). Every other fault there
//! is the front's, in turn: its Redis frozen (SIGSTOP for 1–3 s, then
//! SIGCONT), SIGKILLed and restarted empty, or flushed (`FLUSHALL`); the
//! others are the postgres run's. Right after each front fault, the keys
//! answered 2xx shortly before and during it are retried on both
//! instances (a front used again before it caught up would answer some
//! 409 after their 2xx). The checker excuses nothing by a front fault
//! (PostgreSQL holds the truth) and adds two properties for this run: no
//! answer blames the store while only the front is faulted (the store
//! proxy loses no reply meanwhile, so none can be excused by one), and at
//! the end, once the outbox has drained, every entry the front holds is
//! PostgreSQL's current state of its record (it may only lack entries).
//! The report adds what the front did (its `idemgate_front_*` counters,
//! scraped from every gateway process), and `front-health.log` what the
//! gateways logged about it (down, back up).
//!
//! The failover runs (`postgres_failover`, `redis_failover`) put the
//! gateways on a replicated store, reached directly: a PostgreSQL primary
//! with a synchronous standby (multi-host URL), or Redis under Sentinel
//! with two replicas and `[store] replicas = 1`; every other fault fails
//! the store over (`ChaosStore::fail_over`), and nothing may be lost.
//!
//! Four negative controls run too: the same harness on a Redis without
//! persistence, restarted by SIGKILL, must be caught with duplicate
//! executions; with lease renewal disabled, retries on the slow `release`
//! route must be caught executing beside a live attempt; and with the
//! upstream's lookup lying (`404` for keys it acted on) until the final
//! check, the inquiring route's retries must be caught executing keys a
//! second time; and on the Sentinel setup, a primary restarted at once,
//! empty, before the sentinels act, must be caught with duplicate
//! executions (its replicas wipe themselves) (a checker that cannot fail
//! proves nothing).
//!
//! Durations, as docs/src/development/testing.md gives them:
//! `CHAOS_SECONDS` (default 30) of chaos per store run and
//! `CHAOS_CONTROL_SECONDS` (default 8) per negative control, each run alone
//! (no other test runs meanwhile: see `support::serial`), then the
//! restarts and the final probes; `CHAOS_REQUESTS` sizes a run by
//! requests instead (the long mode, storms up to 64).
//!
//! `CHAOS_SEED` replays a
//! schedule (the seed is printed; timing still differs between runs). Each
//! run writes its history (JSON lines: every request, every fault's start
//! and end) and a report to `target/tmp/chaos/`; the front run also writes
//! what every gateway process logged about the front (`front-health.log`).

mod checker;
mod cluster;
mod history;
mod nemesis;
mod proxy;
mod workload;

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use checker::{FinalProbe, Input, StoreRecord, Verdict};
use cluster::{ChaosStore, Failpoints, Gateways, WINDOWS, gateway_config};
use history::{Op, Route};
use nemesis::FaultRecord;
use proxy::{FaultProxy, Mode, Rates};
use workload::{KeyInfo, Workload};

use crate::support::store::Backend;
use crate::support::upstream::{Execution, Lookup, Upstream};
use crate::support::{Set, serial};

/// The lease of the `hold` and `release` routes: short, so that lapses
/// happen during the run (and the longest lease of any route).
const LEASE: Duration = Duration::from_secs(2);

/// The lease of the slow routes, whose upstream takes 1.8–2.6 leases: their
/// leases live only by renewal (every third of a lease).
const SLOW_LEASE: Duration = Duration::from_secs(1);

/// The slow routes' `upstream_timeout`, above their upstream's delay.
const SLOW_TIMEOUT: Duration = Duration::from_secs(4);

/// How the run is sized.
struct Settings {
    /// Stop after this many requests (long mode) …
    requests: Option<u64>,
    /// … or after this long (short mode).
    duration: Duration,
    clients: usize,
    /// Clients of the slow routes ([`Workload::slow_client`]).
    slow_clients: usize,
    /// Clients of the inquiring route ([`Workload::inquiring_client`]).
    inquiring_clients: usize,
    max_storm: usize,
    seed: u64,
}

impl Settings {
    fn from_env(kind: Backend) -> Self {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        let requests = var("CHAOS_REQUESTS");
        let seed = var("CHAOS_SEED").unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        }) ^ (kind as u64);
        Self {
            requests,
            duration: Duration::from_secs(var("CHAOS_SECONDS").unwrap_or(30)),
            clients: 12,
            slow_clients: 2,
            inquiring_clients: 2,
            max_storm: if requests.is_some() { 64 } else { 32 },
            seed,
        }
    }

    fn done(&self, workload: &Workload, started: Instant) -> bool {
        match self.requests {
            Some(n) => workload.issued.load(Ordering::Relaxed) >= n,
            None => started.elapsed() >= self.duration,
        }
    }
}

// Each run wants the machine's two cores to itself, so that lease
// arithmetic is not skewed by other load: it runs alone, not beside the
// other run nor any other test.

#[test]
fn postgres() {
    serial::alone(|| async { passes(chaos(Backend::Postgres, Variant::Normal).await) });
}

/// PostgreSQL with a Redis front (`[store.front]`, crates/store/src/front/): the
/// postgres run's cluster, store proxy and faults, plus the front's own
/// (frozen, killed and restarted empty, flushed: see `nemesis.rs`), which
/// must cost no client anything (property 10) and leave the front showing
/// nothing PostgreSQL does not hold (property 11).
#[test]
fn front() {
    serial::alone(|| async { passes(chaos(Backend::Front, Variant::Normal).await) });
}

#[test]
fn redis() {
    serial::alone(|| async { passes(chaos(Backend::Redis, Variant::Normal).await) });
}

/// Two gateway processes on one SQLite file: no network between them and
/// the store, so no store proxy; the store fault is its write lock held.
#[test]
fn sqlite() {
    serial::alone(|| async { passes(chaos(Backend::Sqlite, Variant::Normal).await) });
}

/// PostgreSQL failed over under the chaos: a primary with a synchronous
/// standby, both named in the gateways' URL; every other fault stops the
/// primary (`-m immediate`), promotes the standby and rebuilds the old
/// primary as its standby (crates/store/src/postgres/hosts.rs finds the writable
/// one). Nothing acknowledged may be lost.
#[test]
fn postgres_failover() {
    serial::alone(|| async { passes(chaos(Backend::Postgres, Variant::Failover).await) });
}

/// Redis under Sentinel failed over under the chaos: a primary, two
/// replicas (no persistence) and three sentinels, `[store] replicas = 1`;
/// every other fault SIGKILLs the primary, lets the sentinels promote a
/// replica and restarts the killed server empty. Nothing acknowledged may
/// be lost.
#[test]
fn redis_failover() {
    serial::alone(|| async { passes(chaos(Backend::Redis, Variant::Failover).await) });
}

/// The failover run's negative control: the same setup, but the killed
/// primary is restarted at once, empty, before the sentinels act (what
/// Redis's replication docs warn against for servers without
/// persistence): its replicas sync from it again and wipe themselves, so
/// acknowledged records are lost and their retries execute again, which
/// the checker must report. (`replicas = 0` would be the natural control,
/// but on one host a replica is rarely behind at the kill, so it loses
/// nothing reliably: tests/it/stores/redis_replicas.rs cuts a replica off
/// to show what `WAIT` buys.)
#[test]
fn negative_control_redis_restarted_empty_at_once_is_caught() {
    serial::alone(|| async {
        let run = chaos(Backend::Redis, Variant::UnsafeRestart).await;
        assert!(
            run.verdict.duplicates_hold > 0
                && run
                    .verdict
                    .violations
                    .iter()
                    .any(|v| v.starts_with("property 1")),
            "the checker missed the records an empty restarted primary wiped:\n{}",
            run.report
        );
    });
}

/// The negative control: a checker that cannot fail proves nothing. A
/// Redis that keeps nothing on disk, SIGKILLed and restarted during the
/// run, forgets completed records, so their retries execute again; the
/// checker must report those duplicate executions.
#[test]
fn negative_control_redis_without_persistence_is_caught() {
    serial::alone(|| async {
        let run = chaos(Backend::Redis, Variant::RedisWithoutPersistence).await;
        assert!(
            run.verdict.duplicates_hold > 0
                && run
                    .verdict
                    .violations
                    .iter()
                    .any(|v| v.starts_with("property 1")),
            "the checker missed the records a non-durable Redis lost:\n{}",
            run.report
        );
    });
}

/// The second negative control: with lease renewal disabled (the
/// `renew-skip` failpoint), a slow attempt's lease lapses while it still
/// runs, and its retry on the `slow-release` route takes over and executes
/// beside it; the checker must report the overlap (property 8), with no
/// fault injected to excuse it.
#[test]
fn negative_control_renewal_disabled_is_caught() {
    serial::alone(|| async {
        let run = chaos(Backend::Redis, Variant::RenewalDisabled).await;
        assert!(
            run.verdict
                .violations
                .iter()
                .any(|v| v.starts_with("property 8")),
            "the checker missed executions overlapping after leases lapsed under live attempts:\n{}",
            run.report
        );
    });
}

/// The third negative control: the upstream's lookup lies
/// ([`Lookup::Lying`]: `404`, "never acted", about keys it did act on),
/// breaking the contract the inquiring route relies on
/// (docs/src/guide/status-inquiry.md). Keys posted to `/reset` or `/hang`
/// are released instead of replayed, and the inquiring clients' retries
/// execute them again; the checker must report those duplicate executions
/// (property 12 (a)). No faults: the paths alone make outcomes unknown.
#[test]
fn negative_control_lying_lookup_is_caught() {
    serial::alone(|| async {
        let run = chaos(Backend::Redis, Variant::LyingLookup).await;
        assert!(
            run.verdict.duplicates_inquire > 0
                && run
                    .verdict
                    .violations
                    .iter()
                    .any(|v| v.starts_with("property 12 (a)")),
            "the checker missed the executions a lying lookup let through:\n{}",
            run.report
        );
    });
}

/// What a run is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The real thing: every fault, durable stores, gateways killed in
    /// every window; no violation allowed.
    Normal,
    /// The negative control: Redis without persistence, restarted by
    /// SIGKILL, and nothing else.
    RedisWithoutPersistence,
    /// The negative control of lease renewal: no faults, renewal disabled,
    /// only the slow `release` route.
    RenewalDisabled,
    /// The negative control of the status inquiry: no faults, a lookup
    /// that lies until the final check, only the inquiring route.
    LyingLookup,
    /// A replicated store, failed over by the nemesis; Redis with
    /// `[store] replicas = 1`.
    Failover,
    /// The failover run's negative control: the Redis primary restarted
    /// at once, empty, instead of failed over.
    UnsafeRestart,
}

/// `CHAOS_CONTROL_SECONDS`: how long a negative control runs.
fn control_duration() -> Duration {
    Duration::from_secs(
        std::env::var("CHAOS_CONTROL_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8),
    )
}

/// A finished run.
struct Run {
    kind: Backend,
    seed: u64,
    verdict: Verdict,
    report: String,
    history: std::path::PathBuf,
    logs: String,
}

/// Panic with everything needed to diagnose, if the run found violations.
fn passes(run: Run) {
    if !run.verdict.violations.is_empty() {
        panic!(
            "chaos {} found {} violation(s) (seed {}; history in {}):\n{}\n{}",
            run.kind.name(),
            run.verdict.violations.len(),
            run.seed,
            run.history.display(),
            run.verdict.violations.join("\n"),
            run.logs
        );
    }
}

async fn chaos(kind: Backend, variant: Variant) -> Run {
    let mut settings = Settings::from_env(kind);
    let (durable, faults_drawn, failpoints, label) = match variant {
        Variant::Normal => (
            true,
            Some(nemesis::Faults::All),
            Failpoints::KillWindows,
            kind.name().to_string(),
        ),
        Variant::RedisWithoutPersistence => {
            settings.requests = None;
            settings.duration = control_duration();
            (
                false,
                Some(nemesis::Faults::StoreRestarts),
                Failpoints::Off,
                "redis-control".to_string(),
            )
        }
        Variant::RenewalDisabled => {
            settings.requests = None;
            settings.duration = control_duration();
            settings.clients = 0;
            settings.slow_clients = 3;
            settings.inquiring_clients = 0;
            (
                true,
                None,
                Failpoints::RenewalDisabled,
                "renewal-control".to_string(),
            )
        }
        Variant::LyingLookup => {
            settings.requests = None;
            settings.duration = control_duration();
            settings.clients = 0;
            settings.slow_clients = 0;
            settings.inquiring_clients = 3;
            (true, None, Failpoints::Off, "inquiry-control".to_string())
        }
        Variant::Failover => (
            true,
            Some(nemesis::Faults::Failovers),
            Failpoints::KillWindows,
            format!("{}-failover", kind.name()),
        ),
        Variant::UnsafeRestart => {
            settings.requests = None;
            settings.duration = control_duration();
            (
                true,
                Some(nemesis::Faults::UnsafeRestarts),
                Failpoints::Off,
                "failover-control".to_string(),
            )
        }
    };
    let fails_over = matches!(variant, Variant::Failover | Variant::UnsafeRestart);
    println!("chaos {label}: seed {}", settings.seed);
    let epoch = Instant::now();
    let wall_epoch = std::time::SystemTime::now();
    let store = if fails_over {
        ChaosStore::replicated(kind).await
    } else {
        ChaosStore::start(kind, durable).await
    };
    let store_url = store.url();
    let upstream = Upstream::start().await;
    if variant == Variant::LyingLookup {
        upstream.lookup(Lookup::Lying);
    }
    let rates = Rates {
        reset_before: 0.003,
        reset_after: 0.003,
        hang_before: 0.002,
        hang_after: 0.002,
        grace_chunks: 0,
    };
    let proxy = Arc::new(FaultProxy::start(upstream.addr, rates, settings.seed).await);
    // Between the gateways and the store: now and then a reply is lost after
    // the store acted on the request (the connection hangs or is reset), so
    // claims commit whose answer never arrives, and writes are retried.
    let store_rates = Rates {
        reset_before: 0.0,
        reset_after: 0.002,
        hang_before: 0.0,
        hang_after: 0.002,
        grace_chunks: 64,
    };
    let store_proxy = match store.addr() {
        Some(addr) => Some(Arc::new(
            FaultProxy::start(addr, store_rates, settings.seed ^ 0x5707e).await,
        )),
        None => None,
    };
    let gateway_store_url = match &store_proxy {
        Some(store_proxy) => store.url_through(store_proxy.addr),
        None => store_url.clone(),
    };
    let mut config = gateway_config(&gateway_store_url, &format!("http://{}", proxy.addr), LEASE);
    if fails_over && kind == Backend::Redis {
        // What a claim and a record wait for: one replica's acknowledgement.
        // (`IDEMGATE_CHAOS_REPLICAS` asks for more: with 2, every claim
        // waits its full `replica_timeout` while a restarted replica
        // resyncs, which is where late claims were found.)
        let replicas: u32 = std::env::var("IDEMGATE_CHAOS_REPLICAS").map_or(1, |n| {
            n.parse()
                .unwrap_or_else(|_| panic!("IDEMGATE_CHAOS_REPLICAS={n:?} is not a count"))
        });
        config = config.store(|s| {
            s.set("replicas", i64::from(replicas));
        });
    }
    // The front store: its Redis is reached directly (the nemesis faults
    // the server itself), with the default `[store.front] timeout`.
    let front_url = store.front_url();
    if let Some(front_url) = &front_url {
        config = config.store(|s| {
            let mut front = toml::Table::new();
            front.insert("url".into(), front_url.as_str().into());
            s.insert("front".into(), front.into());
        });
    }
    let calm_store = || {
        if let Some(store_proxy) = &store_proxy {
            store_proxy.set_mode(Mode::Calm);
        }
    };
    if faults_drawn.is_none() {
        proxy.set_mode(Mode::Calm);
        calm_store();
    }
    let gateways = Arc::new(Gateways::start(config, 2, failpoints, settings.seed).await);
    let run = format!("{}{}", kind.name(), settings.seed % 1_000_000);
    let workload = Arc::new(Workload::new(
        gateways.clone(),
        epoch,
        &run,
        settings.max_storm,
    ));

    // The chaos phase.
    let started = Instant::now();
    let clients: Vec<_> = (0..settings.clients)
        .map(|i| {
            tokio::spawn(
                workload
                    .clone()
                    .client(i, settings.seed.wrapping_add(i as u64 + 1)),
            )
        })
        .collect();
    let slow_routes: &'static [Route] = match variant {
        Variant::RenewalDisabled => &[Route::SlowRelease],
        _ => &[Route::SlowHold, Route::SlowRelease],
    };
    let slow_clients: Vec<_> = (0..settings.slow_clients)
        .map(|i| {
            let seed = settings.seed.wrapping_add(1_000 + i as u64);
            tokio::spawn(workload.clone().slow_client(1_000 + i, seed, slow_routes))
        })
        .collect();
    let inquiring_clients: Vec<_> = (0..settings.inquiring_clients)
        .map(|i| {
            let seed = settings.seed.wrapping_add(2_000 + i as u64);
            tokio::spawn(workload.clone().inquiring_client(2_000 + i, seed))
        })
        .collect();
    // The store lives as long as the run (the nemesis hands it back).
    let (nemesis, _calm_store) = match faults_drawn {
        Some(faults_drawn) => {
            let nemesis = tokio::spawn(nemesis::run(
                workload.clone(),
                store,
                proxy.clone(),
                store_proxy.clone(),
                settings.seed.wrapping_mul(31),
                faults_drawn,
            ));
            (Some(nemesis), None)
        }
        None => (None, Some(store)),
    };
    // The front's counters, scraped from every process while it lives.
    let scraper = front_url.is_some().then(|| {
        let workload = workload.clone();
        tokio::spawn(async move {
            while !workload.stop.load(Ordering::Relaxed) {
                workload.gateways.scrape_front().await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    });
    // Gateways a kill window took down are counted and started again.
    let supervisor = tokio::spawn({
        let workload = workload.clone();
        async move {
            while !workload.stop.load(Ordering::Relaxed) {
                workload.gateways.reap().await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    while !settings.done(&workload, started) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    workload.stop.store(true, Ordering::Relaxed);
    for client in clients
        .into_iter()
        .chain(slow_clients)
        .chain(inquiring_clients)
    {
        client.await.unwrap();
    }
    let (faults, _store) = match nemesis {
        Some(nemesis) => {
            let (faults, store) = nemesis.await.unwrap();
            (faults, Some(store))
        }
        None => (Vec::new(), None),
    };
    supervisor.await.unwrap();
    if let Some(scraper) = scraper {
        scraper.await.unwrap();
        gateways.scrape_front().await;
    }
    gateways.windows.disarm();
    let chaos_time = started.elapsed();

    // Faults cleared: every key must now answer as its policy says (and
    // the lookup tells the truth again: the inquiring route's keys settle).
    proxy.set_mode(Mode::Calm);
    calm_store();
    upstream.lookup(Lookup::Truthful);
    // Fresh processes: no replay cache answers the final check.
    gateways.restart_all().await;
    let healed = workload.elapsed();
    let ready = gateways.ready(Duration::from_secs(30)).await;
    tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
    let executions_before = upstream.executions_per_key();
    let finals = final_probes(&workload, &executions_before, healed).await;

    let front = match &front_url {
        Some(front_url) => {
            // The final check's processes count too; then the front must
            // be at rest: every outbox row applied.
            gateways.scrape_front().await;
            Some(match outbox_drained(&store_url).await {
                Ok(()) => read_front(front_url).await,
                Err(error) => Err(error),
            })
        }
        None => None,
    };
    let records = read_records(&store_url).await;
    let ops = workload.history.ops();
    let executions = upstream.executions();
    let store_losses: Vec<Duration> = store_proxy
        .iter()
        .flat_map(|store_proxy| store_proxy.fault_times())
        .map(|t| t.saturating_duration_since(epoch))
        .collect();
    let deaths: Vec<(usize, Duration)> = gateways
        .windows
        .deaths
        .lock()
        .unwrap()
        .iter()
        .map(|(instance, t)| (*instance, t.saturating_duration_since(epoch)))
        .collect();
    let mut verdict = checker::check(&Input {
        ops: &ops,
        executions: &executions,
        faults: &faults,
        finals: &finals,
        lease: LEASE,
        epoch,
        store_losses: &store_losses,
        deaths: &deaths,
        records: records.as_deref().ok(),
        front: front.as_ref().and_then(|front| front.as_deref().ok()),
    });
    if let Err(error) = &records {
        verdict.violations.push(format!(
            "property 9: the store's records could not be read: {error}"
        ));
    }
    if let Some(Err(error)) = &front {
        verdict.violations.push(format!(
            "property 11: the front could not be read at rest: {error}"
        ));
    }
    let front_answers = front_url.is_some().then(|| FrontAnswers::of(&gateways));
    if let Some(answers) = &front_answers
        && answers.answered() == 0.0
    {
        verdict.violations.push(
            "the front answered no claim at all: the run did not exercise it (is [store.front] set?)"
                .into(),
        );
    }
    let lookups: u64 = workload
        .keys()
        .iter()
        .filter(|info| info.route.inquires())
        .map(|info| upstream.lookups(&info.key))
        .sum();
    if settings.inquiring_clients > 0 && lookups == 0 {
        verdict.violations.push(
            "the upstream's lookup was never asked: the run did not exercise the inquiring route"
                .into(),
        );
    }
    if variant == Variant::Failover && !faults.iter().any(|f| f.name.contains(" failover (")) {
        verdict
            .violations
            .push("the store was never failed over: the run did not exercise the failover".into());
    }
    for crash in gateways.windows.crashes.lock().unwrap().iter() {
        verdict
            .violations
            .push(format!("a gateway crashed: {crash}"));
    }
    if failpoints == Failpoints::KillWindows {
        for (w, (name, what)) in WINDOWS.iter().enumerate() {
            if gateways.windows.hits[w].load(Ordering::SeqCst) == 0 {
                verdict.violations.push(format!(
                    "kill window {name} {what} was never hit (armed {} times): are the failpoints compiled in (the `fail` dev-dependency's `failpoints` feature)?",
                    gateways.windows.armed[w].load(Ordering::SeqCst)
                ));
            }
        }
    }
    if !ready {
        verdict
            .violations
            .push("property 5: a gateway was not ready 30 s after the faults cleared".into());
    }
    let report = report(
        &label,
        &settings,
        chaos_time,
        &ops,
        executions.len(),
        &faults,
        &finals,
        &verdict,
        &proxy,
        store_proxy.as_deref(),
        &gateways.windows,
        front_answers.as_ref(),
        lookups,
    );
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("chaos");
    std::fs::create_dir_all(&dir).unwrap();
    let history = dir.join(format!("{label}-history.jsonl"));
    workload
        .history
        .write(&history, history_events(&faults, &store_losses, wall_epoch))
        .unwrap();
    std::fs::write(dir.join(format!("{label}-report.md")), &report).unwrap();
    if front_url.is_some() {
        let log = gateways.front_log().await;
        std::fs::write(dir.join("front-health.log"), log).unwrap();
    }
    println!("{report}");
    let logs = if verdict.violations.is_empty() {
        String::new()
    } else {
        gateways.keep_logs(&dir, &label).await;
        gateways.logs().await
    };
    Run {
        kind,
        seed: settings.seed,
        verdict,
        report,
        history,
        logs,
    }
}

/// The history's events besides the requests: when the run began (by the
/// wall clock, to line the gateways' logs up with it), each fault's start
/// and end, as the report's table counts them, and each store reply the
/// store proxy lost.
fn history_events(
    faults: &[FaultRecord],
    store_losses: &[Duration],
    wall_epoch: std::time::SystemTime,
) -> Vec<(Duration, serde_json::Value)> {
    let unix_ms = wall_epoch
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut events = vec![(
        Duration::ZERO,
        serde_json::json!({"type": "start", "time_ms": 0.0, "unix_ms": unix_ms}),
    )];
    for fault in faults {
        let mut event = serde_json::json!({
            "type": "fault",
            "name": fault.name,
            "time_ms": ms(fault.start),
            "store": fault.store,
            "front": fault.front,
        });
        events.push((fault.start, event.clone()));
        event["type"] = "fault-end".into();
        event["time_ms"] = ms(fault.end).into();
        event["recovery_ms"] = fault.recovery.map(ms).into();
        events.push((fault.end, event));
    }
    for lost in store_losses {
        let event = serde_json::json!({"type": "store-reply-lost", "time_ms": ms(*lost)});
        events.push((*lost, event));
    }
    events
}

/// Every record of the run's routes, read straight from the store (not
/// through the fault proxy) after the final check.
async fn read_records(url: &str) -> Result<Vec<StoreRecord>, String> {
    use idemgate::store::{RecordState, StoreConfig};
    let config = StoreConfig {
        url: url.to_string(),
        migrate: false,
        pool_size: 2,
        batches_in_flight: 1,
        claim_queue_budget: Duration::from_secs(30),
        timeout: Duration::from_secs(30),
        prefix: cluster::STORE_PREFIX.into(),
        cluster: false,
        replicas: 0,
        replica_timeout: Duration::from_millis(100),
        max_records: 10_000_000,
        sweep_interval: Duration::from_secs(3600),
        sweep_batch: 1000,
        generation: Duration::from_secs(3600),
        replay_cache_ttl: Duration::ZERO,
        replay_cache_size: 0,
        wait_routes: idemgate::store::WaitRoutes::default(),
        encryption_keys: None,
        compress: true,
        compression: idemgate::config::DEFAULT_STORE_COMPRESSION,
        accept_plain_records: true,
        front: None,
    };
    let store = idemgate::store::open(&config)
        .await
        .map_err(|e| e.to_string())?;
    let mut records = Vec::new();
    for route in Route::ALL {
        for state in [
            RecordState::InFlight,
            RecordState::Completed,
            RecordState::Held,
            RecordState::Inquiring,
        ] {
            let listed = store
                .list(route.name(), state, 10_000_000)
                .await
                .map_err(|e| e.to_string())?;
            records.extend(listed.into_iter().map(|info| StoreRecord {
                route,
                key: info.key,
                state: info.state.as_str(),
                held_reason: info.held_reason,
                status: info.status,
                body_bytes: info.body_bytes,
                token: info.token,
            }));
        }
    }
    Ok(records)
}

/// The front store's counters, summed over the run's gateway processes.
struct FrontAnswers {
    replay: f64,
    conflict: f64,
    mismatch: f64,
    held: f64,
    misses: f64,
    errors: f64,
    outages: f64,
    relayed: f64,
    repairs: f64,
}

impl FrontAnswers {
    fn of(gateways: &Gateways) -> Self {
        let answer = |a: &str| {
            gateways.front_total(&format!("idemgate_front_answers_total{{answer=\"{a}\"}}"))
        };
        let total = |name: &str| gateways.front_total(&format!("idemgate_front_{name}_total"));
        Self {
            replay: answer("replay"),
            conflict: answer("conflict"),
            mismatch: answer("mismatch"),
            held: answer("held"),
            misses: total("misses"),
            errors: total("errors"),
            outages: total("outages"),
            relayed: total("outbox_relayed"),
            repairs: total("repairs"),
        }
    }

    fn answered(&self) -> f64 {
        self.replay + self.conflict + self.mismatch + self.held
    }
}

/// Wait (up to 30 s) until the front's outbox is empty: every change
/// PostgreSQL made has reached the front.
async fn outbox_drained(pg_url: &str) -> Result<(), String> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(pg_url)
        .await
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idemgate_front_outbox")
            .fetch_one(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        if rows == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("{rows} outbox rows still unapplied after 30 s"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every entry the front holds for the run's records
/// (`{prefix}front:rec:{len(route)}:{route}:{hex(scope)}:{key}`, see
/// crates/store/src/redis/front.rs), read straight from its Redis.
async fn read_front(url: &str) -> Result<Vec<checker::FrontRecord>, String> {
    use deadpool_redis::redis;
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let prefix = format!("{}front:rec:", cluster::STORE_PREFIX);
    let mut names: Vec<String> = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        names.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let mut entries = Vec::new();
    for name in names {
        let parsed = name.strip_prefix(&prefix).and_then(|rest| {
            let (len, rest) = rest.split_once(':')?;
            let len: usize = len.parse().ok()?;
            let route = rest.get(..len)?;
            let (_scope, key) = rest.get(len + 1..)?.split_once(':')?;
            let route = Route::ALL.into_iter().find(|r| r.name() == route)?;
            Some((route, key.to_string()))
        });
        let Some((route, key)) = parsed else {
            return Err(format!("a front entry named {name:?}"));
        };
        type Fields = (Option<String>, Option<String>, Option<String>);
        let (fields, body_bytes): (Fields, u64) = redis::pipe()
            .cmd("HMGET")
            .arg(&name)
            .arg("kind")
            .arg("token")
            .arg("status")
            .cmd("HSTRLEN")
            .arg(&name)
            .arg("body")
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let (Some(kind), Some(token)) = (fields.0, fields.1) else {
            continue; // expired meanwhile
        };
        entries.push(checker::FrontRecord {
            route,
            key,
            kind,
            token: token
                .parse()
                .map_err(|_| format!("{name}: token {token:?}"))?,
            status: fields.2.and_then(|s| s.parse().ok()),
            body_bytes,
        });
    }
    Ok(entries)
}

/// Probe every key (16 at a time) until it answers as its policy says:
/// `hold` keys a replay, a held problem, or 422 (a reused key whose record
/// another body owns); `release` and `inquire` keys a 2xx. In flight, 503,
/// upstream errors and `409 outcome-pending` are retried until the limit.
/// The inquiring route's keys are probed beside the others, 64 at a time:
/// they mostly wait (a key never forwarded during the chaos, posted to
/// `/reset` or `/hang`, now turns `inquiring` and waits a second or two
/// for the lookup), which would hold up the others' turns.
async fn final_probes(
    workload: &Arc<Workload>,
    executions: &std::collections::HashMap<String, Vec<Execution>>,
    healed: Duration,
) -> Vec<FinalProbe> {
    let limit = healed + 2 * LEASE + Duration::from_secs(20);
    let (inquiring, others): (Vec<_>, Vec<_>) = workload
        .keys()
        .into_iter()
        .enumerate()
        .partition(|(_, info)| info.route.inquires());
    let (mut finals, inquired) = tokio::join!(
        probe_keys(workload, executions, others, 16, healed, limit),
        probe_keys(workload, executions, inquiring, 64, healed, limit),
    );
    finals.extend(inquired);
    finals
}

/// Probe `keys` (numbered: the number picks the first instance),
/// `at_once` at a time.
async fn probe_keys(
    workload: &Arc<Workload>,
    executions: &std::collections::HashMap<String, Vec<Execution>>,
    keys: Vec<(usize, KeyInfo)>,
    at_once: usize,
    healed: Duration,
    limit: Duration,
) -> Vec<FinalProbe> {
    use futures_util::StreamExt;
    futures_util::stream::iter(keys.into_iter().map(|(i, info)| {
        let workload = workload.clone();
        // The body the record must hold: what the upstream executed, else
        // the request's own body.
        let body = executions
            .get(&info.key)
            .and_then(|e| info.body_with_digest(&e[0].body))
            .unwrap_or_else(|| info.canonical.clone());
        async move {
            probe(
                &workload,
                i % workload.gateways.len(),
                &info,
                body,
                healed,
                limit,
            )
            .await
        }
    }))
    .buffer_unordered(at_once)
    .collect()
    .await
}

async fn probe(
    workload: &Workload,
    instance: usize,
    info: &KeyInfo,
    body: bytes::Bytes,
    healed: Duration,
    limit: Duration,
) -> FinalProbe {
    let mut instance = instance;
    loop {
        let op = workload
            .request(usize::MAX - 1, instance, info, body.clone(), 0, true)
            .await;
        let resolved = op.is_2xx()
            || (info.route.holds()
                && matches!(
                    op.problem(),
                    Some("outcome-unknown" | "response-not-retained" | "key-reused")
                ));
        let last = describe(&op);
        if resolved {
            return FinalProbe {
                route: info.route,
                key: info.key.clone(),
                resolved_after: Some(op.complete.saturating_sub(healed)),
                last,
            };
        }
        if workload.elapsed() >= limit {
            return FinalProbe {
                route: info.route,
                key: info.key.clone(),
                resolved_after: None,
                last,
            };
        }
        instance = (instance + 1) % workload.gateways.len();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn describe(op: &Op) -> String {
    match (op.status(), op.problem()) {
        (Some(status), Some(problem)) => format!("{status} {problem}"),
        (Some(status), None) => status.to_string(),
        (None, _) => format!("no answer: {:?}", op.outcome),
    }
}

fn millis(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

#[allow(clippy::too_many_arguments)]
fn report(
    label: &str,
    settings: &Settings,
    chaos_time: Duration,
    ops: &[Op],
    executions: usize,
    faults: &[FaultRecord],
    finals: &[FinalProbe],
    verdict: &Verdict,
    proxy: &FaultProxy,
    store_proxy: Option<&FaultProxy>,
    windows: &cluster::Windows,
    front: Option<&FrontAnswers>,
    lookups: u64,
) -> String {
    let mut out = String::new();
    let mode = match settings.requests {
        Some(n) => format!("long mode ({n} requests)"),
        None => format!("short mode ({} s)", settings.duration.as_secs()),
    };
    let chaos_ops = ops.iter().filter(|op| !op.last_phase).count();
    let _ = writeln!(out, "## chaos {label}: {mode}, seed {}\n", settings.seed);
    let hits: Vec<String> = WINDOWS
        .iter()
        .enumerate()
        .map(|(w, (name, _))| format!("{name} {}", windows.hits[w].load(Ordering::SeqCst)))
        .collect();
    let _ = writeln!(
        out,
        "- **{executions} upstream executions of {} keys** ({} on `hold` routes, {} on `release` routes, {} on `inquire`); **duplicate executions on `hold`: {}**; re-executions on `release` (allowed by policy): {}; executions that began while another of their key ran: {} ({} unexplained: property 8)",
        verdict.keys_hold + verdict.keys_release + verdict.keys_inquire,
        verdict.keys_hold,
        verdict.keys_release,
        verdict.keys_inquire,
        verdict.duplicates_hold,
        verdict.reexecutions_release,
        verdict.overlaps,
        verdict
            .violations
            .iter()
            .filter(|v| v.starts_with("property 8"))
            .count(),
    );
    let _ = writeln!(
        out,
        "- **inquiring route** (property 12): {} keys, {} upstream executions, **duplicate executions: {}**; the upstream's lookup asked {lookups} times; records at the end completed with the lookup's answer {}, still held or inquiring {}",
        verdict.keys_inquire,
        verdict.executions_inquire,
        verdict.duplicates_inquire,
        verdict.inquire_settled_by_lookup,
        verdict.inquire_unsettled,
    );
    let _ = writeln!(
        out,
        "- **gateways killed in a window**: {} (armed {} times)",
        hits.join(", "),
        windows
            .armed
            .iter()
            .map(|a| a.load(Ordering::SeqCst))
            .sum::<u64>()
    );
    let records: Vec<String> = verdict
        .records
        .iter()
        .map(|(state, n)| format!("{state} {n}"))
        .collect();
    let _ = writeln!(
        out,
        "- the store's records at the end, reconciled with the upstream's ledger (property 9): {}",
        records.join(", ")
    );
    let _ = writeln!(
        out,
        "- {} requests during {:.0} s of chaos ({:.0}/s), {} more in the final check",
        chaos_ops,
        chaos_time.as_secs_f64(),
        chaos_ops as f64 / chaos_time.as_secs_f64(),
        ops.len() - chaos_ops,
    );
    let kinds: Vec<String> = verdict
        .by_kind
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let _ = writeln!(out, "- completions: {}", kinds.join(", "));
    let answers: Vec<String> = verdict
        .by_answer
        .iter()
        .map(|(a, n)| format!("{a}: {n}"))
        .collect();
    let _ = writeln!(out, "- answers: {}", answers.join("; "));
    let c = proxy.counters();
    let _ = writeln!(
        out,
        "- fault proxy: {} connections; resets before/after the upstream {}/{}; hangs before/after {}/{}",
        c.connections.load(Ordering::Relaxed),
        c.reset_before.load(Ordering::Relaxed),
        c.reset_after.load(Ordering::Relaxed),
        c.hang_before.load(Ordering::Relaxed),
        c.hang_after.load(Ordering::Relaxed)
    );
    match store_proxy.map(FaultProxy::counters) {
        Some(s) => {
            let _ = writeln!(
                out,
                "- store proxy: {} connections; replies lost after the store acted: {} reset, {} hung",
                s.connections.load(Ordering::Relaxed),
                s.reset_after.load(Ordering::Relaxed),
                s.hang_after.load(Ordering::Relaxed)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "- store: a file shared by the gateway processes, or a replicated store reached directly (no store proxy)"
            );
        }
    }
    if let Some(front) = front {
        let _ = writeln!(
            out,
            "- front (summed over every gateway process, scraped twice a second): answered {:.0} claims (replays {:.0}, 409s {:.0}, 422s {:.0}, held {:.0}), passed {:.0} to PostgreSQL; {:.0} failed operations, {:.0} outages; {:.0} outbox rows relayed, {:.0} read-repairs",
            front.answered(),
            front.replay,
            front.conflict,
            front.mismatch,
            front.held,
            front.misses,
            front.errors,
            front.outages,
            front.relayed,
            front.repairs
        );
        let (errors, explained) = verdict.front_fault_errors;
        let _ = writeln!(
            out,
            "- answers blaming the store while only the front was faulted (property 10): {errors}, of which a lost PostgreSQL reply explains {explained}"
        );
        let entries: Vec<String> = verdict
            .front_entries
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect();
        let _ = writeln!(
            out,
            "- the front's entries at the end, each checked against PostgreSQL (property 11): {}",
            if entries.is_empty() {
                "none".to_string()
            } else {
                entries.join(", ")
            }
        );
    }
    let _ = writeln!(out, "\n| fault | count | recovery min | median | max |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    let mut names: Vec<&str> = faults.iter().map(|f| f.name).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let mut times: Vec<Duration> = faults
            .iter()
            .filter(|f| f.name == name)
            .filter_map(|f| f.recovery)
            .collect();
        let count = faults.iter().filter(|f| f.name == name).count();
        times.sort();
        let cell = |t: Option<&Duration>| t.map(|t| millis(*t)).unwrap_or("—".into());
        let _ = writeln!(
            out,
            "| {name} | {count} | {} | {} | {} |",
            cell(times.first()),
            cell(times.get(times.len() / 2)),
            cell(times.last())
        );
    }
    let resolved: Vec<Duration> = finals.iter().filter_map(|f| f.resolved_after).collect();
    let _ = writeln!(
        out,
        "\nFinal check: {} keys probed after the faults cleared; {} answered per policy; the last after {} (includes a wait of one lease + 0.5 s).",
        finals.len(),
        resolved.len(),
        resolved
            .iter()
            .max()
            .map(|d| millis(*d))
            .unwrap_or("—".into())
    );
    let held = finals
        .iter()
        .filter(|f| f.last.contains("outcome-unknown"))
        .count();
    let _ = writeln!(
        out,
        "Keys `held` at the end (hold route, by design): {held}; of those with no execution at all: {} (each must be explained by an attempt whose outcome was unknown: property 6).",
        verdict.held_unexecuted
    );
    if verdict.violations.is_empty() {
        let _ = writeln!(out, "\nViolations: none");
    } else {
        // Listed here too, so a failed run's report file says what failed
        // (the panic's text may not have been kept).
        let _ = writeln!(out, "\nViolations: {}", verdict.violations.len());
        for violation in &verdict.violations {
            let _ = writeln!(out, "- {violation}");
        }
    }
    out
}
