//! What the nemesis breaks: two real idemgate processes sharing one store
//! (a private PostgreSQL cluster, a private, durable Redis, a SQLite file,
//! a private PostgreSQL cluster with a private Redis front that keeps
//! nothing on disk, or a replicated store to fail over: a PostgreSQL
//! primary with a synchronous standby, or Redis under Sentinel), each of
//! which can be killed and restarted while clients keep sending.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

use http::StatusCode;
use toml::{Table, Value};

use crate::support::http::{get_status, try_send};
use crate::support::process::GatewayProcess;
use crate::support::servers::{PgCluster, PrivateRedis, PrivateSentinel, kill, try_redis_cli};
use crate::support::store::Backend;
use crate::support::{Set, TestConfig, client, eventually};

use super::history::Route;
use super::{SLOW_LEASE, SLOW_TIMEOUT};

/// A private store the nemesis may stop, freeze and restart.
pub enum ChaosStore {
    Postgres(PgCluster),
    Redis(PrivateRedis),
    Sqlite(SqliteFile),
    /// The front store: PostgreSQL, the truth (behind the store proxy like
    /// the postgres run's), and a Redis front without persistence (reached
    /// directly), which the nemesis freezes, kills and flushes.
    Front {
        pg: PgCluster,
        front: PrivateRedis,
    },
    /// A PostgreSQL primary and its synchronous standby, both named in the
    /// gateways' URL (libpq's multi-host form, `read-write`); a failover
    /// swaps them ([`ChaosStore::fail_over`]).
    PostgresPair {
        primary: PgCluster,
        standby: PgCluster,
    },
    /// A Redis primary with two replicas (no persistence), followed by
    /// three sentinels; the gateways use `redis+sentinel://`.
    RedisSentinel {
        servers: Vec<PrivateRedis>,
        sentinels: Vec<PrivateSentinel>,
    },
}

/// A SQLite file the gateway processes share. There is no connection to
/// fault: the nemesis stalls it by holding its write lock from another
/// connection, as a backup or a hung process would.
pub struct SqliteFile {
    dir: tempfile::TempDir,
}

impl SqliteFile {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("idemgate-chaos-sqlite-")
            .tempdir()
            .unwrap();
        Self { dir }
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.dir.path().join("chaos.db").display())
    }

    /// Take the file's write lock (`BEGIN IMMEDIATE`) and keep it `held`:
    /// every gateway's writes wait, then fail at their `[store] timeout`.
    pub async fn hold_write_lock(&self, held: Duration) {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&self.url())
            .await
            .expect("the chaos SQLite file opens");
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .expect("the write lock is taken");
        tokio::time::sleep(held).await;
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut conn)
            .await
            .expect("the write lock is released");
    }
}

impl ChaosStore {
    /// A private store of `kind`. Redis is durable (the recommended
    /// settings of docs/src/stores/redis.md: a restart loses nothing that was
    /// acknowledged) unless `durable` is false, for the negative control.
    pub async fn start(kind: Backend, durable: bool) -> Self {
        match kind {
            Backend::Postgres => ChaosStore::Postgres(PgCluster::new().await),
            Backend::Redis if durable => ChaosStore::Redis(PrivateRedis::start_durable()),
            Backend::Redis => ChaosStore::Redis(PrivateRedis::start()),
            Backend::Memory => unreachable!("gateway processes cannot share memory://"),
            Backend::RedisCluster => unreachable!("the chaos harness runs no Redis Cluster"),
            Backend::Front => ChaosStore::Front {
                pg: PgCluster::new().await,
                front: PrivateRedis::start(),
            },
            Backend::Sqlite => ChaosStore::Sqlite(SqliteFile::new()),
        }
    }

    /// A replicated store of `kind` (PostgreSQL or Redis) for the
    /// failover runs.
    pub async fn replicated(kind: Backend) -> Self {
        match kind {
            Backend::Postgres => {
                let primary = PgCluster::new().await;
                let standby = PgCluster::standby_of(&primary, true).await;
                ChaosStore::PostgresPair { primary, standby }
            }
            Backend::Redis => {
                let primary = PrivateRedis::start();
                let replicas = [
                    PrivateRedis::replica_of(&primary),
                    PrivateRedis::replica_of(&primary),
                ];
                let sentinels: Vec<PrivateSentinel> = (0..3)
                    .map(|_| PrivateSentinel::watching(&primary))
                    .collect();
                for sentinel in &sentinels {
                    sentinel.wait_for(replicas.len(), sentinels.len());
                }
                let mut servers = vec![primary];
                servers.extend(replicas);
                ChaosStore::RedisSentinel { servers, sentinels }
            }
            other => unreachable!("no failover run on {}", other.name()),
        }
    }

    pub fn url(&self) -> String {
        match self {
            ChaosStore::Postgres(pg) | ChaosStore::Front { pg, .. } => pg.url(),
            ChaosStore::Redis(redis) => redis.url(),
            ChaosStore::Sqlite(file) => file.url(),
            ChaosStore::PostgresPair { primary, standby } => format!(
                "postgres://postgres@{},{}/postgres?target_session_attrs=read-write",
                standby.host(),
                primary.host()
            ),
            ChaosStore::RedisSentinel { sentinels, .. } => {
                let hosts: Vec<String> = sentinels.iter().map(PrivateSentinel::host).collect();
                format!(
                    "redis+sentinel://{}/{}",
                    hosts.join(","),
                    PrivateSentinel::PRIMARY
                )
            }
        }
    }

    /// Fail the replicated store over: kill its primary (SIGKILL, or
    /// PostgreSQL's `stop -m immediate`), let the replica take over
    /// (PostgreSQL: `pg_ctl promote`; Redis: the sentinels' choice), and
    /// bring the killed server back as the new primary's replica
    /// (PostgreSQL: rebuilt by `pg_basebackup`, synchronous; Redis:
    /// restarted empty, as a supervisor would, for the sentinels to turn
    /// into a replica). Returns once the killed server is back.
    ///
    /// Not `safely` (Redis only, the negative control): the killed primary
    /// is restarted at once, empty, before the sentinels can act, as
    /// Redis's replication docs warn against for servers without
    /// persistence: its replicas sync from it again and wipe themselves.
    pub async fn fail_over(&mut self, rng: &mut fastrand::Rng, safely: bool) -> &'static str {
        match self {
            ChaosStore::PostgresPair { primary, standby } => {
                primary.stop_immediate().await;
                tokio::time::sleep(Duration::from_millis(rng.u64(200..1_000))).await;
                standby.promote().await;
                std::mem::swap(primary, standby);
                standby.rejoin_as_standby_of(primary, true).await;
                "PostgreSQL failover (primary stopped -m immediate, synchronous standby promoted, old primary rebuilt)"
            }
            ChaosStore::RedisSentinel { servers, sentinels } => {
                // Asked without failing: a server restarting or changing
                // roles may close the connection (an empty answer).
                let ask = |port: u16, args: &[&str]| try_redis_cli(port, args).unwrap_or_default();
                // Only a whole topology is failed over: a primary with
                // every other server its replica, synced (a replica still
                // syncing after its restart has no data, and Sentinel may
                // promote a replica whose link has been down for less
                // than ten down-after periods).
                let whole = |redis: &PrivateRedis| {
                    let info = ask(redis.port(), &["INFO", "replication"]);
                    info.contains("role:master")
                        && info.matches("state=online").count() == servers.len() - 1
                };
                let healthy = eventually(Duration::from_secs(30), || async {
                    servers.iter().position(whole)
                })
                .await;
                let Some(killed) = healthy else {
                    return "Redis failover skipped: no primary with every replica synced";
                };
                servers[killed].kill();
                if !safely {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    servers[killed].restart();
                    return "Redis primary SIGKILLed and restarted empty at once (unsafe)";
                }
                // Restarted only once the failover is complete: every
                // sentinel names the new primary and the other replica
                // follows it. An empty server restarted earlier is where
                // a replica still pointing at the old address syncs from
                // (wiping itself), as Redis's replication docs warn for
                // servers without persistence that restart on their own.
                let others: Vec<usize> = (0..servers.len()).filter(|i| *i != killed).collect();
                let complete = eventually(Duration::from_secs(30), || async {
                    let promoted = others.iter().copied().find(|&i| {
                        ask(servers[i].port(), &["INFO", "replication"]).contains("role:master")
                    })?;
                    let port = servers[promoted].port().to_string();
                    let named = sentinels.iter().all(|sentinel| {
                        ask(
                            sentinel.port(),
                            &[
                                "SENTINEL",
                                "get-master-addr-by-name",
                                PrivateSentinel::PRIMARY,
                            ],
                        )
                        .lines()
                        .any(|line| line.trim() == port)
                    });
                    let followed = others.iter().filter(|&&i| i != promoted).all(|&i| {
                        let info = ask(servers[i].port(), &["INFO", "replication"]);
                        info.contains(&format!("master_port:{port}"))
                            && info.contains("master_link_status:up")
                    });
                    (named && followed).then_some(())
                })
                .await;
                assert!(
                    complete.is_some(),
                    "the sentinels did not complete the failover within 30 s"
                );
                tokio::time::sleep(Duration::from_millis(rng.u64(200..1_000))).await;
                servers[killed].restart();
                "Redis failover (primary SIGKILLed, Sentinel promoted a replica, old primary restarted empty once it was done)"
            }
            _ => unreachable!("only a replicated store fails over"),
        }
    }

    /// The front's `redis://` URL (the front store only).
    pub fn front_url(&self) -> Option<String> {
        match self {
            ChaosStore::Front { front, .. } => Some(front.url()),
            _ => None,
        }
    }

    /// Where the store listens; `None` for a file.
    pub fn addr(&self) -> Option<SocketAddr> {
        // A file, and the replicated stores, whose URLs name several hosts
        // (reached directly: their fault is the failover).
        if let ChaosStore::Sqlite(_)
        | ChaosStore::PostgresPair { .. }
        | ChaosStore::RedisSentinel { .. } = self
        {
            return None;
        }
        let url = url::Url::parse(&self.url()).expect("a store URL");
        let host = url.host_str().expect("a host");
        let addr = format!("{host}:{}", url.port().expect("a port"));
        Some(addr.parse().expect("an IP address"))
    }

    /// The store's URL, reached through `proxy` (a [`super::proxy::FaultProxy`]).
    pub fn url_through(&self, proxy: SocketAddr) -> String {
        let addr = self.addr().expect("a networked store");
        self.url()
            .replacen(&addr.to_string(), &proxy.to_string(), 1)
    }
}

/// The Redis key prefix of a chaos run's records.
pub const STORE_PREFIX: &str = "chaos:";

/// The gateway's configuration for a chaos run: routes to the same
/// upstream (through the fault proxy), one per `on_unknown_outcome`
/// (`hold`, `release`, and `inquire` with its [`inquiry`] table), the first
/// two again with a lease shorter than the upstream takes ([`SLOW_LEASE`],
/// [`SLOW_TIMEOUT`]), so that leases live by renewal, a webhook route (key
/// in the JSON body) and a `concurrent = "wait"` route.
pub fn gateway_config(store_url: &str, upstream: &str, lease: Duration) -> TestConfig {
    TestConfig::new(store_url, upstream)
        .top(|t| {
            t.set("header_read_timeout", "5s")
                .set("shutdown_timeout", "5s");
        })
        .store(|s| {
            s.set("pool_size", 8)
                .set("timeout", "1s")
                .set("prefix", STORE_PREFIX)
                .set("sweep_interval", "1h");
        })
        .defaults(|d| {
            d.set("lease", format!("{}ms", lease.as_millis()))
                .set("upstream_timeout", "1s")
                .set("retention", "1h");
        })
        .routes(|routes| {
            *routes = Route::ALL
                .into_iter()
                .map(|r| {
                    let mut route = Table::new();
                    let policy = if r.inquires() {
                        route
                            .set("inquiry", inquiry(upstream))
                            .set("scope_header", "X-Tenant");
                        "inquire"
                    } else if r.holds() {
                        "hold"
                    } else {
                        "release"
                    };
                    route
                        .set("name", r.name())
                        .set("match", format!("/{}/*", r.name()))
                        .set("upstream", upstream)
                        .set("on_unknown_outcome", policy);
                    match r {
                        Route::Webhook => {
                            let mut fingerprint = Table::new();
                            fingerprint.set("body", "json");
                            route
                                .set("key_from", vec!["json:/key"])
                                .set("fingerprint", fingerprint);
                        }
                        Route::Wait => {
                            route.set("concurrent", "wait").set("wait_timeout", "2s");
                        }
                        _ => {}
                    }
                    if r.slow() {
                        route
                            .set("lease", format!("{}ms", SLOW_LEASE.as_millis()))
                            .set(
                                "upstream_timeout",
                                format!("{}ms", SLOW_TIMEOUT.as_millis()),
                            );
                    }
                    Value::Table(route)
                })
                .collect();
        })
}

/// The inquiring route's `[routes.inquiry]`: the recording upstream's
/// lookup, `GET {upstream}/inquire/idempotency/{key}?scope={scope}` (the
/// key is the last path segment; the route is scoped by tenant and the
/// lookup answers per tenant), reached through the fault proxy like the
/// route's own requests (the proxy loses answers, it never alters one nor
/// delivers a request late, so a faulted lookup is only asked again). The
/// first question 200 ms after the outcome became unknown, then every
/// second; giving up only after [`INQUIRY_GIVE_UP`], far beyond the final
/// check, so that a key still held or inquiring at the end means the
/// inquiry failed.
///
/// `after` is shorter than `upstream_timeout` (the gateways log a warning
/// about it) on purpose: the upstream records an execution as soon as the
/// whole request has arrived, so nothing it will act on is still on its
/// way by then. The residual window (a gateway frozen, SIGSTOP, between
/// its claim and its request's last byte for longer than its lease and
/// `after`, sending that request after the lookup said `404`) is closed
/// by the fence: the route forwards each attempt's token, the question
/// carries a higher one, and the upstream refuses attempts up to it after
/// a `404`, as the contract in docs/src/guide/status-inquiry.md asks.
fn inquiry(upstream: &str) -> Table {
    let mut inquiry = Table::new();
    inquiry
        .set(
            "url",
            format!("{upstream}/inquire/idempotency/{{key}}?scope={{scope}}"),
        )
        .set("after", "200ms")
        .set("every", "1s")
        .set("give_up_after", format!("{}s", INQUIRY_GIVE_UP.as_secs()));
    inquiry
}

/// The inquiring route's `give_up_after`: longer than the restarts, the
/// wait and the final probes after the chaos (at most two leases and 20 s
/// more) put together, several times over.
const INQUIRY_GIVE_UP: Duration = Duration::from_secs(120);

/// The kill windows: failpoints in the gateway's pipeline (test builds
/// only; see `kill_window!` in src/handler/mod.rs) at which an armed gateway
/// aborts, as abruptly as a SIGKILL.
pub const WINDOWS: [(&str, &str); 4] = [
    ("after-claim", "(a) the claim committed, nothing sent"),
    (
        "after-upstream",
        "(b) the upstream answered, nothing recorded",
    ),
    (
        "after-complete",
        "(c) the record committed, the client has nothing",
    ),
    ("during-renewal", "(d) a lease renewal just committed"),
];

/// Which failpoints the gateways start with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failpoints {
    /// None.
    Off,
    /// Every start (and restart) during the chaos arms one kill window
    /// (the one hit least so far) to fire after a random number of passes.
    KillWindows,
    /// Lease renewal disabled (`renew-skip=return`): the negative control.
    RenewalDisabled,
}

/// Kill windows armed and hit, and gateways that died without one.
pub struct Windows {
    mode: Failpoints,
    /// Arm windows on (re)starts: on during the chaos only.
    arming: AtomicBool,
    rng: Mutex<fastrand::Rng>,
    pub armed: [AtomicU64; 4],
    pub hits: [AtomicU64; 4],
    /// Gateways that exited on their own with no failpoint named (a crash).
    pub crashes: Mutex<Vec<String>>,
    /// Every gateway death (kill window, crash or SIGKILL): instance, when.
    pub deaths: Mutex<Vec<(usize, std::time::Instant)>>,
}

impl Windows {
    /// The `FAILPOINTS` value for a gateway starting now, if any.
    fn failpoints(&self) -> Option<String> {
        match self.mode {
            Failpoints::Off => None,
            Failpoints::RenewalDisabled => Some("renew-skip=return".into()),
            Failpoints::KillWindows if !self.arming.load(Ordering::SeqCst) => None,
            Failpoints::KillWindows => {
                let mut rng = self.rng.lock().unwrap();
                let load = |w: usize| {
                    (
                        self.hits[w].load(Ordering::SeqCst),
                        self.armed[w].load(Ordering::SeqCst),
                    )
                };
                let least = (0..WINDOWS.len()).map(load).min().unwrap();
                let candidates: Vec<usize> =
                    (0..WINDOWS.len()).filter(|&w| load(w) == least).collect();
                let w = candidates[rng.usize(..candidates.len())];
                self.armed[w].fetch_add(1, Ordering::SeqCst);
                // Renewals are rarer than claims, answers and completions.
                let skip = if w == 3 {
                    rng.u32(0..6)
                } else {
                    rng.u32(20..300)
                };
                Some(format!("{}={skip}*off->return", WINDOWS[w].0))
            }
        }
    }

    /// A gateway process has exited: count the window it names, or a crash.
    fn account(&self, instance: usize, process: &GatewayProcess) {
        self.died(instance);
        let stderr = process.stderr();
        let named = WINDOWS
            .iter()
            .position(|(name, _)| stderr.contains(&format!("idemgate: failpoint {name} hit")));
        match named {
            Some(w) => {
                self.hits[w].fetch_add(1, Ordering::SeqCst);
            }
            None => {
                let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                self.crashes.lock().unwrap().push(format!(
                    "gateway {instance} exited on its own ({:?}):\n{}",
                    process.exit_status(),
                    tail.join("\n")
                ));
            }
        }
    }

    fn died(&self, instance: usize) {
        self.deaths
            .lock()
            .unwrap()
            .push((instance, std::time::Instant::now()));
    }

    /// Stop arming windows (the chaos is over).
    pub fn disarm(&self) {
        self.arming.store(false, Ordering::SeqCst);
    }
}

/// Gateway processes sharing one store. Clients look up an instance's
/// current proxy port for every request; a restarted instance gets new
/// ports.
pub struct Gateways {
    config: TestConfig,
    ports: Vec<AtomicU16>,
    processes: Vec<tokio::sync::Mutex<Option<GatewayProcess>>>,
    pub windows: Windows,
    /// The front store's counters (`idemgate_front_*`) last scraped from
    /// each process the run started, by pid ([`Self::scrape_front`]).
    front: Mutex<BTreeMap<u32, BTreeMap<String, f64>>>,
    /// What gone processes logged about the front ([`Self::front_log`]).
    front_lines: Mutex<Vec<String>>,
}

impl Gateways {
    pub async fn start(
        config: TestConfig,
        count: usize,
        failpoints: Failpoints,
        seed: u64,
    ) -> Self {
        let windows = Windows {
            mode: failpoints,
            arming: AtomicBool::new(true),
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            armed: Default::default(),
            hits: Default::default(),
            crashes: Mutex::new(Vec::new()),
            deaths: Mutex::new(Vec::new()),
        };
        let mut ports = Vec::new();
        let mut processes = Vec::new();
        for i in 0..count {
            let process = start(i, &config, &windows).await;
            ports.push(AtomicU16::new(process.port));
            processes.push(tokio::sync::Mutex::new(Some(process)));
        }
        Self {
            config,
            ports,
            processes,
            windows,
            front: Mutex::new(BTreeMap::new()),
            front_lines: Mutex::new(Vec::new()),
        }
    }

    /// Keep what a process that is going away logged about the front.
    fn keep_front_lines(&self, instance: usize, process: &GatewayProcess) {
        let lines = front_lines(instance, process);
        self.front_lines.lock().unwrap().extend(lines);
    }

    /// Every line any process of the run logged about the front (its
    /// health: down, back up), gone processes' and live ones', in time
    /// order (each line starts with its instance and its timestamp).
    pub async fn front_log(&self) -> String {
        let mut lines = self.front_lines.lock().unwrap().clone();
        for (instance, slot) in self.processes.iter().enumerate() {
            if let Some(process) = slot.lock().await.as_ref() {
                lines.extend(front_lines(instance, process));
            }
        }
        lines.sort_by(|a, b| a.get(2..).cmp(&b.get(2..)));
        lines.join("\n")
    }

    /// Scrape every live instance's `idemgate_front_*` samples and keep
    /// them as that process's latest (a frozen or dead one is skipped).
    pub async fn scrape_front(&self) {
        let http = client();
        for slot in &self.processes {
            let target = match slot.lock().await.as_mut() {
                Some(process) => process
                    .try_status()
                    .is_none()
                    .then(|| (process.pid(), process.admin_url("/metrics"))),
                None => None,
            };
            let Some((pid, url)) = target else { continue };
            let scraped = tokio::time::timeout(
                Duration::from_secs(1),
                try_send(&http, "GET", &url, &[], bytes::Bytes::new()),
            )
            .await;
            let Ok(Ok(reply)) = scraped else { continue };
            let samples: BTreeMap<String, f64> = reply
                .text()
                .lines()
                .filter(|line| line.starts_with("idemgate_front_"))
                .filter_map(|line| {
                    let (series, value) = line.rsplit_once(' ')?;
                    Some((series.to_string(), value.parse().ok()?))
                })
                .collect();
            self.front.lock().unwrap().insert(pid, samples);
        }
    }

    /// One front counter (a series, e.g.
    /// `idemgate_front_answers_total{answer="replay"}`), summed over every
    /// process scraped.
    pub fn front_total(&self, series: &str) -> f64 {
        self.front
            .lock()
            .unwrap()
            .values()
            .filter_map(|samples| samples.get(series))
            .sum()
    }

    /// Restart every instance that has exited on its own (a kill window
    /// fired, or a crash), counting why.
    pub async fn reap(&self) {
        for (instance, slot) in self.processes.iter().enumerate() {
            let mut slot = slot.lock().await;
            let exited = slot
                .as_mut()
                .is_some_and(|process| process.try_status().is_some());
            if exited {
                let process = slot.take().expect("checked");
                self.windows.account(instance, &process);
                self.keep_front_lines(instance, &process);
                let process = start(instance, &self.config, &self.windows).await;
                self.ports[instance].store(process.port, Ordering::SeqCst);
                *slot = Some(process);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.ports.len()
    }

    /// The instance's proxy port (stale while it is down: connections are
    /// refused).
    pub fn port(&self, instance: usize) -> u16 {
        self.ports[instance].load(Ordering::SeqCst)
    }

    /// SIGKILL one instance (if a kill window got it first, that is
    /// counted).
    pub async fn kill(&self, instance: usize) {
        if let Some(mut process) = self.processes[instance].lock().await.take() {
            if process.try_status().is_some() {
                self.windows.account(instance, &process);
            } else {
                self.windows.died(instance);
            }
            process.kill9();
            self.keep_front_lines(instance, &process);
        }
    }

    /// Send a signal (`-STOP`, `-CONT`) to a running instance.
    pub async fn signal(&self, instance: usize, signal: &str) {
        if let Some(process) = self.processes[instance].lock().await.as_mut()
            && process.try_status().is_none()
        {
            kill(signal, &process.pid().to_string());
        }
    }

    /// Start a killed instance again (on new ports) and wait until it is
    /// live.
    pub async fn restart(&self, instance: usize) {
        let mut slot = self.processes[instance].lock().await;
        if slot.is_none() {
            let process = start(instance, &self.config, &self.windows).await;
            self.ports[instance].store(process.port, Ordering::SeqCst);
            *slot = Some(process);
        }
    }

    /// Stop every instance gracefully (SIGTERM: its forwards settle first)
    /// and start it again, so that what follows is answered from the store,
    /// not from an instance's replay cache.
    pub async fn restart_all(&self) {
        for instance in 0..self.len() {
            let stopped = self.processes[instance].lock().await.take();
            if let Some(mut process) = stopped {
                if process.try_status().is_some() {
                    self.windows.account(instance, &process);
                } else {
                    process.terminate();
                    let _ = process.wait(Duration::from_secs(15)).await;
                }
                self.keep_front_lines(instance, &process);
            }
            self.restart(instance).await;
        }
    }

    /// Wait until every instance answers `/readyz` 200 (its store is back).
    pub async fn ready(&self, limit: Duration) -> bool {
        let http = client();
        for slot in &self.processes {
            let url = match slot.lock().await.as_ref() {
                Some(process) => process.admin_url("/readyz"),
                None => return false,
            };
            let ready = eventually(limit, || async {
                (get_status(&http, &url).await == Some(StatusCode::OK)).then_some(())
            })
            .await;
            if ready.is_none() {
                return false;
            }
        }
        true
    }

    /// Write each running gateway's whole stderr to
    /// `dir/{label}-gateway-{i}.log` (a failed run's, for reading after).
    pub async fn keep_logs(&self, dir: &std::path::Path, label: &str) {
        for (i, slot) in self.processes.iter().enumerate() {
            if let Some(process) = slot.lock().await.as_ref() {
                let path = dir.join(format!("{label}-gateway-{i}.log"));
                std::fs::write(path, process.stderr()).unwrap();
            }
        }
    }

    /// Every instance's stderr, for a failure report.
    pub async fn logs(&self) -> String {
        let mut out = String::new();
        for (i, slot) in self.processes.iter().enumerate() {
            if let Some(process) = slot.lock().await.as_ref() {
                let stderr = process.stderr();
                let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
                out.push_str(&format!("--- gateway {i} (last lines) ---\n"));
                for line in tail.into_iter().rev() {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }
}

/// The lines of a process's log about the front store, each prefixed with
/// its instance (`0 2026-…Z WARN … front store (Redis) failed …`).
fn front_lines(instance: usize, process: &GatewayProcess) -> Vec<String> {
    process
        .stderr()
        .lines()
        .filter(|line| line.contains("front store"))
        .map(|line| format!("{instance} {line}"))
        .collect()
}

/// Start instance `instance`, with the failpoints `windows` arms now. A
/// gateway cannot start while its store is down (the nemesis may be
/// stopping it meanwhile): try again for up to a minute.
async fn start(instance: usize, config: &TestConfig, windows: &Windows) -> GatewayProcess {
    let name = format!("chaos-{instance}");
    let failpoints = windows.failpoints();
    let env: Vec<(&str, &str)> = failpoints
        .iter()
        .map(|failpoints| ("FAILPOINTS", failpoints.as_str()))
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match GatewayProcess::try_start_with_env(&name, config, &env).await {
            Ok(process) => return process,
            Err(error) if std::time::Instant::now() >= deadline => panic!("{error}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
