//! The store's settings: [`StoreConfig`] (the `[store]` table, parsed and
//! with its defaults applied by the gateway's configuration), and the checks
//! that decide whether the store can work with them.
//!
//! The store crate knows nothing of the configuration file: the gateway's
//! config module builds a `StoreConfig` and asks [`StoreConfig::validate`] whether it is usable.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::redact_url;
use crate::seal::{Codec, Keyring};

/// Where records are kept.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `postgres://…`, `redis://…`, `redis+sentinel://…`, `sqlite://…` or
    /// `memory://`.
    pub url: String,
    /// Apply embedded migrations at start.
    pub migrate: bool,
    /// Most connections the store pool opens.
    pub pool_size: u32,
    /// Longest any single store operation (including getting a connection) may take.
    pub timeout: Duration,
    /// PostgreSQL only: most batches of claims and completions sent at
    /// once (crates/store/src/postgres/batch.rs); fewer, larger batches commit
    /// more keys per second.
    pub batches_in_flight: u32,
    /// PostgreSQL only: longest a claim may wait in the batch queue; one
    /// that waited longer is shed unsent (`StoreError::Shed`). The gateway
    /// derives it when unset: a quarter of `timeout`, at most 100 ms.
    pub claim_queue_budget: Duration,
    /// Redis only: prefix of every key idemgate writes.
    pub prefix: String,
    /// Redis only: the URL names one seed node of a Redis Cluster; keys are
    /// laid out so that every script touches one hash slot.
    pub cluster: bool,
    /// Redis only: how many replicas must acknowledge a claim, a renewal,
    /// a record or a hold (`WAIT`, on the connection that wrote) before it
    /// counts; fewer fail the operation as the store being unavailable.
    /// Zero: no `WAIT`.
    pub replicas: u32,
    /// Redis only: how long `WAIT` waits for the replicas.
    pub replica_timeout: Duration,
    /// memory only: most live records kept.
    pub max_records: usize,
    /// How often the sweeper deletes expired records (PostgreSQL, SQLite, memory).
    pub sweep_interval: Duration,
    /// Most records one sweep statement deletes.
    pub sweep_batch: usize,
    /// PostgreSQL only: how long new keys go to one generation of records
    /// before the sweeper retires the previous one
    /// (crates/store/src/postgres/generations.rs). Unset in the file: the longest
    /// route retention.
    pub generation: Duration,
    /// PostgreSQL, Redis, SQLite: how long this instance may answer from memory for
    /// a completed record it replayed (zero: no replay cache).
    pub replay_cache_ttl: Duration,
    /// PostgreSQL, Redis, SQLite: most bytes the replay cache holds (zero: none).
    pub replay_cache_size: u64,
    /// PostgreSQL, Redis, SQLite: the routes whose settled records are announced to
    /// waiters (`NOTIFY`, `PUBLISH`), the ones with `concurrent = "wait"`;
    /// taken from the routes, not a key of `[store]`. A notifying commit is
    /// serialised with every other one, so no other route pays for it.
    pub wait_routes: WaitRoutes,
    /// PostgreSQL only: a Redis front (`[store.front]`, crates/store/src/front/).
    pub front: Option<FrontConfig>,
    /// The keys recorded responses are sealed with (`[store]
    /// encryption_keys`, crates/store/src/seal/); none: stored as they are.
    pub encryption_keys: Option<Arc<Keyring>>,
    /// With `encryption_keys`: compress each response before sealing it,
    /// where that saves bytes.
    pub compress: bool,
    /// With `compress`: the codec (`[store] compression`).
    pub compression: Codec,
    /// With `encryption_keys`: replay records stored before keys were set
    /// (plain); `false` refuses them, so a response planted in the store
    /// unsealed is never replayed.
    pub accept_plain_records: bool,
}

/// The routes whose settled records are announced to waiters. A store
/// keeps the handle it was opened with, and a configuration reload
/// ([`WaitRoutes::follow`]) changes what every holder sees: a route that
/// starts waiting is announced from the next settled record on.
#[derive(Debug, Clone, Default)]
pub struct WaitRoutes(Arc<ArcSwap<Vec<String>>>);

impl WaitRoutes {
    /// A handle of its own on `names`.
    pub fn new(names: Vec<String>) -> Self {
        Self(Arc::new(ArcSwap::from_pointee(names)))
    }

    /// Whether `route`'s settled records are announced.
    pub fn contains(&self, route: &str) -> bool {
        self.0.load().iter().any(|name| name == route)
    }

    /// Whether no route waits.
    pub fn is_empty(&self) -> bool {
        self.0.load().is_empty()
    }

    /// Take `other`'s routes (a reloaded configuration's): every clone of
    /// this handle sees them from now on.
    pub fn follow(&self, other: &WaitRoutes) {
        self.0.store(other.0.load_full());
    }
}

/// `[store.front]`: a Redis server in front of the PostgreSQL store, which
/// answers what it safely can (replays, `409`s, `422`s, held keys) without
/// a PostgreSQL round trip.
#[derive(Debug, Clone)]
pub struct FrontConfig {
    /// `redis://…` or `rediss://…`: one server.
    pub url: String,
    /// Longest any front operation may take; past it the front counts as
    /// down and requests go to PostgreSQL alone.
    pub timeout: Duration,
    /// How long a claimed attempt runs before the front marks it in
    /// flight; zero: at once (off the request's path either way).
    pub mark_after: Duration,
    /// How long a fence keeps a finished attempt's late writes out of the
    /// front: the longest lease of any route plus a minute (taken from the
    /// routes, not a key of `[store.front]`).
    pub fence_life: Duration,
}

/// A store setting no store can work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{key}`: {message}")]
pub struct InvalidStoreSetting {
    /// The setting's name in the `[store]` table (`pool_size`).
    pub key: &'static str,
    /// What is wrong and what would be right.
    pub message: String,
}

/// The URL schemes [`super::open`] knows.
const SCHEMES: &[&str] = &[
    "postgres",
    "postgresql",
    "redis",
    "rediss",
    "redis+sentinel",
    "rediss+sentinel",
    "sqlite",
    "memory",
];

impl StoreConfig {
    /// Whether a store can be opened with these settings; the first setting
    /// that cannot work otherwise.
    pub fn validate(&self) -> Result<(), InvalidStoreSetting> {
        let fail = |key, message: &str| {
            Err(InvalidStoreSetting {
                key,
                message: message.to_string(),
            })
        };
        if self.max_records == 0 {
            return fail("max_records", "must be at least 1");
        }
        if !self.accept_plain_records && self.encryption_keys.is_none() {
            return fail(
                "accept_plain_records",
                "= false needs encryption_keys: without keys every record is plain",
            );
        }
        if self.sweep_batch == 0 {
            return fail("sweep_batch", "must be at least 1");
        }
        if self.sweep_interval.is_zero() {
            return fail("sweep_interval", "must be greater than zero");
        }
        if self.generation.is_zero() {
            return fail(
                "generation",
                "must be greater than zero: every pass would retire a generation",
            );
        }
        if self.pool_size == 0 {
            return fail("pool_size", "must be at least 1");
        }
        if self.batches_in_flight == 0 || self.batches_in_flight > self.pool_size {
            return fail(
                "batches_in_flight",
                "must be at least 1 and at most pool_size (each batch uses one pooled connection)",
            );
        }
        self.validate_url()?;
        if self.cluster && !(self.url.starts_with("redis://") || self.url.starts_with("rediss://"))
        {
            return fail(
                "cluster",
                "is only for Redis: set url to redis://HOST:PORT (a seed node of the cluster) or remove cluster = true",
            );
        }
        if self.cluster && self.prefix.contains(['{', '}']) {
            return fail(
                "prefix",
                "may not hold { or } with cluster = true: the store puts its own hash tag after it",
            );
        }
        if self.timeout.is_zero() {
            return fail("timeout", "must be greater than zero");
        }
        if self.claim_queue_budget.is_zero() || self.claim_queue_budget > self.timeout {
            return fail(
                "claim_queue_budget",
                "must be greater than zero and at most [store] timeout, which bounds the whole claim, its wait in the queue included",
            );
        }
        let redis = self.url.starts_with("redis://")
            || self.url.starts_with("rediss://")
            || is_sentinel_url(&self.url);
        if self.replicas > 0 && !redis {
            return fail(
                "replicas",
                "is for Redis (WAIT): PostgreSQL keeps acknowledged records across a failover with a synchronous standby (synchronous_standby_names)",
            );
        }
        if self.replicas > 0
            && (self.replica_timeout.is_zero() || self.replica_timeout >= self.timeout)
        {
            return fail(
                "replica_timeout",
                "must be greater than zero and shorter than [store] timeout, which bounds the whole operation, WAIT included",
            );
        }
        if let Some(front) = &self.front {
            if !(self.url.starts_with("postgres://") || self.url.starts_with("postgresql://")) {
                return fail(
                    "front",
                    "is a Redis front for the PostgreSQL store: set [store] url to postgres://… or remove [store.front]",
                );
            }
            if !(front.url.starts_with("redis://") || front.url.starts_with("rediss://")) {
                return Err(InvalidStoreSetting {
                    key: "front.url",
                    message: format!(
                        "{} must start with redis:// or rediss:// (one Redis server)",
                        redact_url(&front.url)
                    ),
                });
            }
            if front.timeout.is_zero() {
                return fail("front.timeout", "must be greater than zero");
            }
        }
        Ok(())
    }

    fn validate_url(&self) -> Result<(), InvalidStoreSetting> {
        let scheme = self.url.split_once("://").map(|(scheme, _)| scheme);
        if scheme.is_some_and(|s| SCHEMES.contains(&s)) {
            return Ok(());
        }
        Err(InvalidStoreSetting {
            key: "url",
            message: format!(
                "{} must start with postgres://, redis://, rediss://, redis+sentinel://, sqlite:// or memory://",
                redact_url(&self.url)
            ),
        })
    }
}

/// Whether `url` names Redis through Sentinel.
pub(crate) fn is_sentinel_url(url: &str) -> bool {
    url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://")
}

#[cfg(test)]
impl StoreConfig {
    /// Unit tests' `[store]`: `url`, one connection, a second per
    /// operation, one record, nothing else on (each test changes what it
    /// needs).
    pub(crate) fn for_test(url: &str) -> Self {
        Self {
            url: url.to_string(),
            migrate: false,
            pool_size: 1,
            timeout: Duration::from_secs(1),
            batches_in_flight: 1,
            claim_queue_budget: Duration::from_millis(100),
            prefix: String::new(),
            cluster: false,
            replicas: 0,
            replica_timeout: Duration::from_millis(100),
            max_records: 1,
            sweep_interval: Duration::from_secs(1),
            sweep_batch: 1,
            generation: Duration::from_secs(1),
            replay_cache_ttl: Duration::ZERO,
            replay_cache_size: 0,
            wait_routes: WaitRoutes::default(),
            front: None,
            encryption_keys: None,
            compress: true,
            compression: Codec::Lz4,
            accept_plain_records: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usable() -> StoreConfig {
        StoreConfig::for_test("memory://")
    }

    fn rejected_key(change: impl FnOnce(&mut StoreConfig)) -> &'static str {
        let mut config = usable();
        change(&mut config);
        config.validate().unwrap_err().key
    }

    #[test]
    fn usable_settings_pass() {
        assert_eq!(usable().validate(), Ok(()));
        for url in [
            "postgres://h/db",
            "postgresql://h/db",
            "redis://h",
            "rediss://h",
            "sqlite://idemgate.db",
        ] {
            let config = StoreConfig {
                url: url.to_string(),
                ..usable()
            };
            assert_eq!(config.validate(), Ok(()), "{url}");
        }
    }

    #[test]
    fn zero_counts_and_durations_are_rejected() {
        assert_eq!(rejected_key(|c| c.max_records = 0), "max_records");
        assert_eq!(rejected_key(|c| c.sweep_batch = 0), "sweep_batch");
        assert_eq!(
            rejected_key(|c| c.sweep_interval = Duration::ZERO),
            "sweep_interval"
        );
        assert_eq!(rejected_key(|c| c.pool_size = 0), "pool_size");
        assert_eq!(
            rejected_key(|c| c.batches_in_flight = 0),
            "batches_in_flight"
        );
        assert_eq!(
            rejected_key(|c| c.batches_in_flight = c.pool_size + 1),
            "batches_in_flight"
        );
        assert_eq!(rejected_key(|c| c.timeout = Duration::ZERO), "timeout");
    }

    #[test]
    fn a_claim_queue_budget_is_positive_and_within_the_timeout() {
        assert_eq!(
            rejected_key(|c| c.claim_queue_budget = Duration::ZERO),
            "claim_queue_budget"
        );
        assert_eq!(
            rejected_key(|c| c.claim_queue_budget = c.timeout + Duration::from_millis(1)),
            "claim_queue_budget"
        );
        let mut whole = usable();
        whole.claim_queue_budget = whole.timeout;
        assert_eq!(whole.validate(), Ok(()));
    }

    #[test]
    fn cluster_is_only_for_redis() {
        for url in ["memory://", "postgres://h/db", "sqlite://idemgate.db"] {
            let key = rejected_key(|c| {
                c.url = url.to_string();
                c.cluster = true;
            });
            assert_eq!(key, "cluster", "{url}");
        }
        for url in ["redis://h:7000", "rediss://h:7000"] {
            let config = StoreConfig {
                url: url.to_string(),
                cluster: true,
                ..usable()
            };
            assert_eq!(config.validate(), Ok(()), "{url}");
        }
        let key = rejected_key(|c| {
            c.url = "redis://h:7000".to_string();
            c.cluster = true;
            c.prefix = "app{x}:".to_string();
        });
        assert_eq!(key, "prefix");
    }

    #[test]
    fn replicas_are_for_redis_and_wait_within_the_timeout() {
        for url in ["memory://", "postgres://h/db", "sqlite://idemgate.db"] {
            let key = rejected_key(|c| {
                c.url = url.to_string();
                c.replicas = 1;
            });
            assert_eq!(key, "replicas", "{url}");
        }
        let redis = |replicas, replica_timeout| StoreConfig {
            url: "redis://h:6379".to_string(),
            replicas,
            replica_timeout,
            ..usable()
        };
        assert_eq!(redis(1, Duration::from_millis(100)).validate(), Ok(()));
        // Unused without replicas, so not checked.
        assert_eq!(redis(0, Duration::ZERO).validate(), Ok(()));
        let on_a_cluster = StoreConfig {
            cluster: true,
            ..redis(1, Duration::from_millis(100))
        };
        assert_eq!(on_a_cluster.validate(), Ok(()));
        for wait in [
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::from_secs(2),
        ] {
            let key = redis(2, wait).validate().unwrap_err().key;
            assert_eq!(key, "replica_timeout", "{wait:?} against a 1 s timeout");
        }
    }

    #[test]
    fn a_front_needs_postgres_behind_it_and_redis_in_it() {
        let front = |url: &str| FrontConfig {
            url: url.to_string(),
            timeout: Duration::from_millis(250),
            mark_after: Duration::from_millis(10),
            fence_life: Duration::from_secs(90),
        };
        let config = StoreConfig {
            url: "postgres://h/db".to_string(),
            front: Some(front("redis://h:6379")),
            ..usable()
        };
        assert_eq!(config.validate(), Ok(()));
        for url in ["memory://", "redis://h", "sqlite://x.db"] {
            let key = rejected_key(|c| {
                c.url = url.to_string();
                c.front = Some(front("redis://h:6379"));
            });
            assert_eq!(key, "front", "{url}");
        }
        let key = rejected_key(|c| {
            c.url = "postgres://h/db".to_string();
            c.front = Some(front("postgres://h/db"));
        });
        assert_eq!(key, "front.url");
        let key = rejected_key(|c| {
            c.url = "postgres://h/db".to_string();
            c.front = Some(FrontConfig {
                timeout: Duration::ZERO,
                ..front("redis://h")
            });
        });
        assert_eq!(key, "front.timeout");
    }

    #[test]
    fn unknown_scheme_is_rejected_without_the_password() {
        let config = StoreConfig {
            url: "postgress://u:secret@h/db".to_string(),
            ..usable()
        };
        let err = config.validate().unwrap_err();
        assert_eq!(err.key, "url");
        assert!(err.message.contains("postgres://"), "{err}");
        assert!(!err.message.contains("secret"), "{err}");
    }

    #[test]
    fn knows_a_sentinel_url() {
        assert!(is_sentinel_url("redis+sentinel://s/m"));
        assert!(is_sentinel_url("rediss+sentinel://s/m"));
        assert!(!is_sentinel_url("redis://h"));
    }
}
