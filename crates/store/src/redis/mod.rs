//! The Redis store (`redis://`), on the redis crate (as deadpool-redis
//! re-exports it). Every transition is one Lua script ([`scripts`]), so it
//! is atomic on the server; each is fenced
//! by the same token rules as the PostgreSQL store, and reads the clock with
//! Redis's own `TIME`, so every gateway instance agrees on leases.
//! Operations go over a few shared multiplexed connections ([`lanes`]), to
//! one server, to the primary its sentinels name (`redis+sentinel://`,
//! [`sentinel`]) or, with `[store] cluster = true`, to a Redis Cluster found
//! from one seed node ([`conn`]).
//!
//! A record is one hash whose TTL is the retention; the lease is a field,
//! separate from the TTL. Its claims take tokens from a counter that never
//! expires. Key names ([`layout`]):
//!
//! - one server: record `{prefix}rec:{len(route)}:{route}:{hex(scope)}:{key}`,
//!   one counter `{prefix}token`;
//! - a cluster: record `{prefix}{bN}rec:…` and its counter `{prefix}{bN}token`,
//!   `N` one of 1024 buckets by a stable hash of the record's name, so that
//!   every script's keys share the hash slot of the tag `{bN}`;
//! - a route that inquires: its due questions and its `inquiring` records,
//!   two sorted sets per route (per bucket on a cluster), from which an
//!   instance takes and counts for its own routes only ([`inquiries`]).
//!
//! On a cluster, key administration scans every primary, readiness asks
//! every primary's `CLUSTER INFO` for `cluster_state:ok`, and the wake-up
//! subscriber (classic Pub/Sub reaches every node) moves to another node
//! when its own is lost. Durability is whatever the servers' persistence
//! and replication give: see docs/src/stores/redis.md.

mod admin;
mod conn;
mod dataset;
mod erase;
mod eviction;
#[cfg(feature = "front")]
pub(crate) mod front;
mod inquiries;
mod lanes;
mod layout;
mod scope_index;
mod scripts;
mod sentinel;
mod store;
mod tcp;
mod wakeups;

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_redis::redis;
use deadpool_redis::redis::cluster::ClusterClient;

use self::conn::{Conn, Node, url_of};
use self::lanes::{Lane, Lanes};
pub(crate) use self::layout::Layout;
use self::sentinel::Sentinels;
pub(crate) use self::store::{corrupt, millis};

use super::runtime::StoreRuntime;
use super::{StoreAdmin, StoreConfig, StoreError, redact_url};

/// Buckets a script runs on at once on a cluster ([`RedisStore::per_bucket`]).
const BUCKETS_AT_ONCE: usize = 16;

/// A Redis-backed [`Store`].
pub struct RedisStore {
    source: Source,
    lanes: Lanes,
    pub(crate) layout: Layout,
    /// For the wake-up subscriber's own connection.
    url: String,
    /// A cluster's primaries, as last seen (empty for one server).
    nodes: Mutex<Vec<Node>>,
    /// How many times the wake-up subscriber connected: on a cluster, the
    /// next attempt goes to the next node.
    listens: AtomicUsize,
    /// As a front (crates/store/src/front/): the server process (`run_id`) every
    /// new connection must reach; another one fails the connection, so
    /// that a restarted server is never used before it has been checked.
    expected_run_id: Mutex<Option<String>>,
    /// Whether the server lost the records since this instance last
    /// connected ([`dataset`]).
    dataset: dataset::Dataset,
    /// The routes whose settled records are announced.
    wait_routes: crate::WaitRoutes,
    timeout: Duration,
    /// `[store] replicas` and `replica_timeout` (ms): the `WAIT` after a
    /// claim, a record or a hold ([`store`]); `None` when no replica is
    /// asked for.
    replicas: Option<(u32, u64)>,
    /// Where lanes are connected (and their driver tasks run), whoever asks.
    runtime: StoreRuntime,
    /// Connections opened for serving threads' own lanes.
    local_opens: AtomicU64,
    /// When the cluster connections were last dropped ([`Self::reset`]).
    cluster_reset: Mutex<Option<tokio::time::Instant>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

/// Where new connections come from.
enum Source {
    /// One server (or the primary its sentinels name): a multiplexed
    /// connection each, whose connect and response timeouts are `[store]
    /// timeout` (the redis crate's own default response timeout, 500 ms,
    /// would otherwise cut every operation short whatever the setting says).
    Single(Box<(OneServer, redis::AsyncConnectionConfig)>),
    /// A cluster: each is a cluster connection of the redis crate.
    Cluster(Box<ClusterClient>),
}

/// The one server connections go to.
// One per store, inside `Source`'s box: its size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum OneServer {
    /// The URL's.
    Fixed(redis::Client),
    /// The primary the sentinels name when a connection is opened.
    Sentinels(Arc<Sentinels>),
}

impl OneServer {
    /// A client for the server, now.
    async fn client(&self) -> redis::RedisResult<redis::Client> {
        match self {
            OneServer::Fixed(client) => Ok(client.clone()),
            OneServer::Sentinels(sentinels) => sentinels.primary().await,
        }
    }

    /// A connection to the server, now.
    async fn connect(
        &self,
        settings: &redis::AsyncConnectionConfig,
    ) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        self.client()
            .await?
            .get_multiplexed_async_connection_with_config(settings)
            .await
    }
}

/// Least time between two drops of a cluster's connections.
const CLUSTER_RESET_PAUSE: Duration = Duration::from_secs(10);

/// A cluster client starting from `urls` (the seed node, then every
/// primary seen at start), each connection and answer bounded by a quarter
/// of the store's timeout: a new cluster connection waits for every
/// starting node, so one that does not answer (frozen, cut off) must cost
/// an operation on a new lane only part of its `[store] timeout`.
fn cluster_client(urls: Vec<String>, timeout: Duration) -> redis::RedisResult<ClusterClient> {
    let part = timeout / 4;
    ClusterClient::builder(urls)
        .tcp_settings(tcp::settings())
        .connection_timeout(part)
        .response_timeout(part)
        // MOVED/ASK after a resharding or failover, and a few transport
        // retries; `bounded` ends whatever is still waiting at the timeout.
        // A script re-sent after its reply was lost finds its own write: a
        // claim then answers `in_flight` for its own record (nothing is
        // forwarded: fail closed until the lease lapses), and every other
        // script is idempotent or answers fenced.
        .retries(3)
        .build()
}

/// How many lanes: `pool_size`, but no more than this host's cores (or
/// two, on a smaller host). Redis
/// runs one command at a time, and every lane pipelines the operations in
/// flight on it: lanes beyond the cores add no parallelism, they only
/// spread the pipelining thinner (measured on 2 cores, new keys at 32
/// clients: 2 lanes 6.5–6.8k/s, 16 lanes 5.9k/s, with 10–20 % less CPU
/// per key in idemgate and in Redis).
fn lane_count(pool_size: u32) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    // At least two, so that one large write never holds up every read.
    (pool_size as usize).clamp(1, cores.max(2))
}

impl RedisStore {
    /// Connect (and check the server answers), failing with a clear message.
    pub async fn connect(config: &StoreConfig) -> Result<Self, StoreError> {
        let shown = redact_url(&config.url);
        let mut store = Self::unchecked(config)?;
        if !config.cluster {
            // From the first connection on (the ping's), which sees the
            // records' marker first.
            store.dataset = dataset::Dataset::watched();
        }
        store.ping().await.map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot reach store at {shown}: {e}; start Redis or point [store] url at a reachable server"
            ))
        })?;
        store.warn_if_evicting(&shown).await;
        if config.cluster {
            // Later connections start from every primary, not only the seed,
            // so that losing the seed node loses no more than its slots.
            let urls = store.node_urls();
            store.source =
                Source::Cluster(Box::new(cluster_client(urls, config.timeout).map_err(
                    |e| StoreError::Unavailable(format!("invalid store URL {shown}: {e}")),
                )?));
        }
        Ok(store)
    }

    /// The store, without asking whether the server answers: connections
    /// are made by the first operations that need them.
    pub(crate) fn unchecked(config: &StoreConfig) -> Result<Self, StoreError> {
        let shown = redact_url(&config.url);
        let invalid = |e: &dyn std::fmt::Display| {
            StoreError::Unavailable(format!("invalid store URL {shown}: {e}"))
        };
        let source = if config.cluster {
            Source::Cluster(Box::new(
                cluster_client(vec![config.url.clone()], config.timeout)
                    .map_err(|e| invalid(&e))?,
            ))
        } else {
            let server = if crate::config::is_sentinel_url(&config.url) {
                OneServer::Sentinels(Arc::new(
                    Sentinels::new(&config.url, config.timeout).map_err(|e| invalid(&e))?,
                ))
            } else {
                OneServer::Fixed(tcp::client(config.url.as_str()).map_err(|e| invalid(&e))?)
            };
            let settings = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(config.timeout))
                .set_response_timeout(Some(config.timeout));
            Source::Single(Box::new((server, settings)))
        };
        Ok(Self {
            source,
            // (A cluster connection is many connections: shared ones only.)
            lanes: Lanes::new(lane_count(config.pool_size), !config.cluster),
            local_opens: AtomicU64::new(0),
            cluster_reset: Mutex::new(None),
            layout: Layout {
                prefix: config.prefix.clone(),
                cluster: config.cluster,
            },
            timeout: config.timeout,
            replicas: (config.replicas > 0)
                .then(|| (config.replicas, millis(config.replica_timeout))),
            url: config.url.clone(),
            nodes: Mutex::new(Vec::new()),
            listens: AtomicUsize::new(0),
            expected_run_id: Mutex::new(None),
            dataset: dataset::Dataset::default(),
            wait_routes: config.wait_routes.clone(),
            runtime: StoreRuntime::here(),
        })
    }

    /// The one server (not a cluster), to connect to apart from the lanes.
    fn one_server(&self) -> Option<&OneServer> {
        match &self.source {
            Source::Single(single) => Some(&single.0),
            Source::Cluster(_) => None,
        }
    }

    /// The seed URL, then a URL for each primary seen.
    fn node_urls(&self) -> Vec<String> {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let mut urls = vec![self.url.clone()];
        urls.extend(nodes.iter().map(|node| url_of(&self.url, node)));
        urls
    }

    /// The lane's connection, opened if it has none current. Only one
    /// operation per lane connects; the others wait and share it. A
    /// serving thread's own lane connects on that thread's runtime; the
    /// shared ones on the store's runtime.
    async fn open_lane(&self, lane: &Lane, local: bool) -> Result<(Conn, u64), StoreError> {
        let _turn = lane.connecting.lock().await;
        let generation = self.lanes.generation.load(Ordering::SeqCst);
        if let Some(opened) = lane.current(generation) {
            return Ok(opened);
        }
        let unavailable = |e: &dyn std::fmt::Display| StoreError::Unavailable(e.to_string());
        let connecting = |e: tokio::task::JoinError| unavailable(&e);
        let conn = match &self.source {
            Source::Single(single) => {
                let (server, settings) = single.as_ref().clone();
                let connect = async move { server.connect(&settings).await };
                let mut conn = if local {
                    connect.await
                } else {
                    self.runtime.run(connect).await.map_err(connecting)?
                }
                .map_err(|e| unavailable(&e))?;
                let expected = self
                    .expected_run_id
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                if let Some(expected) = expected {
                    let info: String = redis::cmd("INFO")
                        .arg("server")
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| unavailable(&e))?;
                    if run_id(&info) != Some(expected.as_str()) {
                        return Err(StoreError::Unavailable(
                            "the Redis server is another process than the one checked (restarted or failed over)"
                                .into(),
                        ));
                    }
                }
                self.check_dataset(&mut conn).await?;
                Conn::Single(conn)
            }
            Source::Cluster(client) => {
                let client = client.clone();
                let connect = async move { client.get_async_connection().await };
                Conn::Cluster(
                    if local {
                        connect.await
                    } else {
                        self.runtime.run(connect).await.map_err(connecting)?
                    }
                    .map_err(|e| unavailable(&e))?,
                )
            }
        };
        if local {
            self.local_opens.fetch_add(1, Ordering::Relaxed);
        }
        *lane.slot() = Some((conn.clone(), generation));
        Ok((conn, generation))
    }

    /// The script `invocation` makes for each bucket (one on a single
    /// server), run on every bucket, [`BUCKETS_AT_ONCE`] at a time on a
    /// cluster (a script may only touch keys of one slot); each answer.
    async fn per_bucket<T: redis::FromRedisValue>(
        &self,
        invocation: impl Fn(&layout::Bucket) -> redis::ScriptInvocation<'static>,
    ) -> Vec<Result<T, StoreError>> {
        use futures_util::stream::{self, StreamExt};
        stream::iter(self.layout.buckets())
            .map(|bucket| {
                let invocation = invocation(&bucket);
                async move {
                    let invocation = &invocation;
                    self.bounded(|mut conn| async move { invocation.invoke_async(&mut conn).await })
                        .await
                }
            })
            .buffer_unordered(BUCKETS_AT_ONCE)
            .collect()
            .await
    }

    /// Run `op` on a lane's connection, bounded by `[store] timeout`. A
    /// connection that fails or does not answer in time is dropped from its
    /// lane (a half-open TCP connection would otherwise time out forever).
    /// On a cluster too, at most once per [`CLUSTER_RESET_PAUSE`]: the
    /// redis crate's cluster connection reconnects to a node by itself,
    /// but after a killed primary was restarted at once it went on sending
    /// that primary's slots to the wrong place (a third of new keys
    /// answered `503` for more than a minute after the promotion); a new
    /// one asks the nodes afresh. Not more often: a new cluster connection
    /// waits for every starting node, so with one frozen, dropping the
    /// connections after each of its timeouts took every key down.
    pub(crate) async fn bounded<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let picked = self.lanes.pick();
        // The generation of the connection the operation ends up on.
        let generation = AtomicU64::new(picked.generation);
        let work = async {
            let conn = match picked.conn {
                Some(conn) => conn,
                None => {
                    let (conn, opened) = self.open_lane(&picked.lane, picked.local).await?;
                    generation.store(opened, Ordering::Relaxed);
                    conn
                }
            };
            op(conn).await.map_err(|e| {
                if unusable(&e) {
                    self.reset(generation.load(Ordering::Relaxed));
                }
                StoreError::Unavailable(e.to_string())
            })
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => result,
            Err(_) => {
                self.reset(generation.load(Ordering::Relaxed));
                Err(StoreError::Unavailable(format!(
                    "no answer within {:?}",
                    self.timeout
                )))
            }
        }
    }

    /// `INFO section` of one server, asked on a connection of its own
    /// (which [`Self::expect_run_id`] does not apply to), within the
    /// store's timeout; `Err` for a cluster.
    pub(super) async fn info(&self, section: &str) -> Result<String, StoreError> {
        let Source::Single(single) = &self.source else {
            return Err(StoreError::Unavailable(
                "INFO is asked of one Redis server, not a cluster".into(),
            ));
        };
        let (server, settings) = single.as_ref();
        let ask = async {
            let mut conn = server.connect(settings).await?;
            deadpool_redis::redis::cmd("INFO")
                .arg(section)
                .query_async::<String>(&mut conn)
                .await
        };
        tokio::time::timeout(self.timeout, ask)
            .await
            .map_err(|_| StoreError::Unavailable(format!("no answer within {:?}", self.timeout)))?
            .map_err(|e| StoreError::Unavailable(e.to_string()))
    }

    /// The server's `run_id`: a new one each time a server process starts,
    /// so a changed one means a restart (perhaps from an old snapshot) or
    /// another server behind the same address. A front is one server.
    pub(crate) async fn front_run_id(&self) -> Result<String, StoreError> {
        let info = self.info("server").await?;
        run_id(&info)
            .map(str::to_string)
            .ok_or_else(|| corrupt("INFO server without a run_id"))
    }

    /// From now on, every new connection must reach the server process
    /// with this `run_id` ([`RedisStore::open_lane`]); `None`: any.
    pub(crate) fn expect_run_id(&self, run_id: Option<&str>) {
        *self
            .expected_run_id
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = run_id.map(str::to_string);
    }

    /// Forget every lane's connection (see [`Self::bounded`]).
    fn reset(&self, generation: u64) {
        if self.layout.cluster {
            let mut last = self
                .cluster_reset
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < CLUSTER_RESET_PAUSE) {
                return;
            }
            *last = Some(tokio::time::Instant::now());
        }
        self.lanes.reset(generation);
    }
}

/// Whether `e` leaves the connection it came on unusable: a transport
/// failure, or a server that turned replica (READONLY: failed over). The
/// lanes then connect again, through the sentinels when they name the
/// primary; any other server answer leaves the connection as it was.
fn unusable(e: &redis::RedisError) -> bool {
    let read_only = redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
    !matches!(e.kind(), redis::ErrorKind::Server(_)) || e.kind() == read_only
}

/// The `run_id` line of an `INFO server` reply.
fn run_id(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime;
    use std::sync::Arc;

    /// The Redis the integration tests use (.ci/run starts one there).
    fn config() -> StoreConfig {
        let url = std::env::var("IDEMGATE_TEST_REDIS")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_string());
        StoreConfig {
            pool_size: 2,
            timeout: Duration::from_secs(5),
            prefix: format!("lanes-test-{}:", std::process::id()),
            ..StoreConfig::for_test(&url)
        }
    }

    /// Run `work` on a thread of its own with a current-thread runtime,
    /// as a serving thread (`serving`) or not; returns its output.
    fn on_thread<T, F>(serving: bool, work: impl FnOnce() -> F + Send + 'static) -> T
    where
        T: Send + 'static,
        F: Future<Output = T>,
    {
        std::thread::spawn(move || {
            if serving {
                runtime::enter_serving_thread();
            }
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(work())
        })
        .join()
        .expect("the thread ends")
    }

    /// Three PINGs from a thread of its own, a serving one or not.
    fn pings(serving: bool, store: Arc<RedisStore>) {
        on_thread(serving, move || async move {
            for _ in 0..3 {
                store.ping().await.expect("Redis answers");
            }
        });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_serving_thread_has_a_connection_of_its_own() {
        // Unchecked: no marker key left behind on the shared server.
        let store = Arc::new(RedisStore::unchecked(&config()).expect("a Redis URL"));
        let opens = || store.local_opens.load(Ordering::Relaxed);
        // The store's own runtime and other threads use the shared lanes.
        store.ping().await.expect("Redis answers");
        pings(false, store.clone());
        assert_eq!(opens(), 0);
        assert!(store.lanes.open() >= 1);
        // A serving thread opens one, on its runtime, and keeps it.
        pings(true, store.clone());
        assert_eq!(opens(), 1);
        // Another serving thread: one more.
        pings(true, store.clone());
        assert_eq!(opens(), 2);
        // After a reset (a connection failed), a serving thread opens a
        // new one, and so does a shared lane.
        let generation = store.lanes.generation.load(Ordering::SeqCst);
        store.lanes.reset(generation);
        assert_eq!(store.lanes.open(), 0);
        pings(true, store.clone());
        assert_eq!(opens(), 3);
    }

    /// `open_serving_thread` opens the thread's lane before any request:
    /// the thread's first operation finds it open.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_serving_thread_opens_its_connection_before_serving() {
        // Unchecked: no marker key left behind on the shared server.
        let store = Arc::new(RedisStore::unchecked(&config()).expect("a Redis URL"));
        let served = store.clone();
        let before_first = on_thread(true, move || async move {
            served.open_serving_thread(2).await;
            served.lanes.pick().conn.is_some()
        });
        assert!(before_first, "the lane is open before the first request");
        assert_eq!(store.local_opens.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_them_a_serving_thread_uses_the_shared_lanes() {
        let lanes = Lanes::new(2, false);
        let picked = std::thread::spawn(move || {
            runtime::enter_serving_thread();
            lanes.pick().local
        })
        .join()
        .expect("the thread ends");
        assert!(!picked);
    }
}
