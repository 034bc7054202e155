//! Fresh storage per test on the shared servers: a throwaway PostgreSQL
//! database ([`TestDb`]), a Redis key prefix of its own ([`RedisPrefix`],
//! on the shared Redis or the shared Redis Cluster), or the in-memory
//! store, behind one [`TestStore`] per [`Backend`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_redis::redis;
use idemgate::config::StoreConfig;
use idemgate::store::Backend as Store;
use idemgate::store::FrontConfig;
use sqlx::Connection;

use super::serial;
use super::{Set, TestConfig};

pub use super::provision::{postgres_url as admin_url, redis_cluster_urls, redis_url};

fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A throwaway database, dropped (forcibly) when this value is dropped.
pub struct TestDb {
    pub url: String,
    name: String,
    _turn: serial::Shared,
}

impl TestDb {
    pub async fn new() -> Self {
        let turn = serial::shared();
        let name = unique("idemgate_test");
        let admin = admin_url();
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .unwrap_or_else(|e| {
                panic!("tests need PostgreSQL at {admin} ({e}); run .ci/run or start it")
            });
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .unwrap();
        let base = admin.rsplit_once('/').unwrap().0;
        Self {
            url: format!("{base}/{name}"),
            name,
            _turn: turn,
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        let admin = admin_url();
        // Async drop is not a thing: a short-lived runtime on its own thread.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin).await {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        })
        .join();
    }
}

/// A key prefix of its own for one test; its keys are deleted on drop.
pub struct RedisPrefix {
    pub prefix: String,
    /// The servers holding its keys: the shared Redis, or every node of
    /// the shared cluster.
    nodes: Vec<String>,
    _turn: serial::Shared,
}

impl RedisPrefix {
    pub fn new() -> Self {
        Self::on(vec![redis_url()])
    }

    /// A prefix on the shared Redis Cluster.
    pub fn on_cluster() -> Self {
        Self::on(redis_cluster_urls())
    }

    fn on(nodes: Vec<String>) -> Self {
        Self {
            _turn: serial::shared(),
            prefix: format!("{}:", unique("idemgate_test")),
            nodes,
        }
    }
}

impl Drop for RedisPrefix {
    fn drop(&mut self) {
        let pattern = format!("{}*", self.prefix);
        let nodes = self.nodes.clone();
        let _ = std::thread::spawn(move || {
            for node in nodes {
                let client = redis::Client::open(node).ok()?;
                let mut conn = client.get_connection().ok()?;
                let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg(&pattern).query(&mut conn).ok()?;
                // One key per DEL: a cluster node refuses keys of two slots.
                let mut pipe = redis::pipe();
                for key in &keys {
                    pipe.del(key).ignore();
                }
                let _: redis::RedisResult<()> = pipe.query(&mut conn);
            }
            Some(())
        })
        .join();
    }
}

/// A store backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Redis,
    /// The Redis store with `cluster = true`, on three primaries.
    RedisCluster,
    Sqlite,
    Memory,
    /// PostgreSQL with a Redis front (`[store.front]`) on the shared Redis.
    Front,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Redis => "redis",
            Backend::RedisCluster => "redis_cluster",
            Backend::Sqlite => "sqlite",
            Backend::Memory => "memory",
            Backend::Front => "front",
        }
    }
}

/// Fresh storage on one backend, cleaned up on drop.
pub struct TestStore {
    pub backend: Backend,
    pub url: String,
    prefix: String,
    _db: Option<TestDb>,
    _redis: Option<RedisPrefix>,
    _dir: Option<tempfile::TempDir>,
    _turn: serial::Shared,
}

impl TestStore {
    pub async fn new(backend: Backend) -> Self {
        let turn = serial::shared();
        let (mut db, mut redis, mut dir) = (None, None, None);
        let (url, prefix) = match backend {
            Backend::Postgres => {
                let new = TestDb::new().await;
                (db.insert(new).url.clone(), String::new())
            }
            Backend::Redis => {
                let new = RedisPrefix::new();
                (redis_url(), redis.insert(new).prefix.clone())
            }
            Backend::RedisCluster => {
                let new = RedisPrefix::on_cluster();
                let seed = new.nodes[0].clone();
                (seed, redis.insert(new).prefix.clone())
            }
            Backend::Sqlite => {
                let new = tempfile::tempdir().unwrap();
                let file = dir.insert(new).path().join("idemgate.db");
                (format!("sqlite://{}", file.display()), String::new())
            }
            Backend::Memory => ("memory://".to_string(), String::new()),
            Backend::Front => {
                let new = TestDb::new().await;
                let url = db.insert(new).url.clone();
                (url, redis.insert(RedisPrefix::new()).prefix.clone())
            }
        };
        Self {
            backend,
            url,
            prefix,
            _db: db,
            _redis: redis,
            _dir: dir,
            _turn: turn,
        }
    }

    /// The Redis key prefix (empty for other backends).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The PostgreSQL URL, when the backend is PostgreSQL (alone or with a front).
    pub fn pg_url(&self) -> Option<&str> {
        matches!(self.backend, Backend::Postgres | Backend::Front).then_some(self.url.as_str())
    }

    /// [`TestConfig::new`] on this store (with its Redis prefix).
    pub fn config(&self, upstream: &str) -> TestConfig {
        let cluster = self.backend == Backend::RedisCluster;
        let front = self.backend == Backend::Front;
        TestConfig::new(&self.url, upstream).store(|s| {
            s.set("prefix", self.prefix.as_str());
            if cluster {
                s.set("cluster", true);
            }
            if front {
                let mut table = toml::Table::new();
                // Generous: a test's front going down on a busy machine
                // would only cost PostgreSQL round trips, but some tests
                // count what the front answered.
                table.set("url", redis_url()).set("timeout", "5s");
                s.set("front", table);
            }
        })
    }

    /// A `[store]` for opening this store directly (no gateway): 8
    /// connections, a 5 s timeout, 10,000 records at most (memory), and no
    /// replay cache (it sits in front of a store, not in it:
    /// crates/store/src/cache.rs).
    pub fn store_config(&self) -> StoreConfig {
        StoreConfig {
            url: self.url.clone(),
            migrate: true,
            pool_size: 8,
            timeout: Duration::from_secs(5),
            batches_in_flight: 1,
            claim_queue_budget: Duration::from_secs(5),
            prefix: self.prefix.clone(),
            cluster: self.backend == Backend::RedisCluster,
            replicas: 0,
            replica_timeout: Duration::from_millis(100),
            max_records: 10_000,
            sweep_interval: Duration::from_secs(60),
            sweep_batch: 100,
            // Every sweep retires a generation (PostgreSQL): the tests
            // cross generation boundaries whenever they sweep.
            generation: Duration::ZERO,
            replay_cache_ttl: Duration::ZERO,
            replay_cache_size: 0,
            wait_routes: idemgate::store::WaitRoutes::default(),
            encryption_keys: None,
            compress: true,
            compression: idemgate::config::DEFAULT_STORE_COMPRESSION,
            accept_plain_records: true,
            front: (self.backend == Backend::Front).then(|| FrontConfig {
                url: redis_url(),
                timeout: Duration::from_secs(5),
                mark_after: Duration::from_millis(10),
                fence_life: Duration::from_secs(120),
            }),
        }
    }

    /// Open the store with `config` (a changed [`Self::store_config`]).
    pub async fn open_with(&self, config: &StoreConfig) -> Arc<dyn Store> {
        idemgate::store::open(config)
            .await
            .unwrap_or_else(|e| panic!("the {} store opens: {e}", self.backend.name()))
    }

    /// Open the store with [`Self::store_config`].
    pub async fn open(&self) -> Arc<dyn Store> {
        self.open_with(&self.store_config()).await
    }
}

/// Read a record's state straight from the database.
pub async fn record_state(db_url: &str, key: &str) -> Option<String> {
    let mut conn = sqlx::PgConnection::connect(db_url).await.unwrap();
    sqlx::query_scalar("SELECT state FROM idemgate_records WHERE key = $1")
        .bind(key)
        .fetch_optional(&mut conn)
        .await
        .unwrap()
}
