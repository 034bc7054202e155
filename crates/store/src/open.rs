//! Opening the store a URL names: one function per backend, each compiled
//! only with its cargo feature. A URL whose backend this build left out is
//! refused with the feature to build it with ([`StoreError::NotBuilt`]).
//! Applying a store's schema on its own (`idemgate migrate`) is here too.

use std::sync::Arc;

#[cfg(feature = "sqlite")]
use crate::StoreAdmin as _;
use crate::{Backend, StoreConfig, StoreError, redact_url};

/// Open the store the configuration names (by URL scheme), applying
/// migrations if asked.
pub async fn open(config: &StoreConfig) -> Result<Arc<dyn Backend>, StoreError> {
    let url = config.url.as_str();
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    match scheme {
        "postgres" | "postgresql" if config.front.is_some() => front(config).await,
        "postgres" | "postgresql" => postgres(config).await,
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" => redis(config).await,
        "sqlite" => sqlite(config).await,
        "memory" => memory(config),
        _ => Err(StoreError::UnsupportedUrl(redact_url(url))),
    }
}

/// What [`migrate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Migrated {
    /// PostgreSQL's migrations are applied (those already there are kept).
    Postgres,
    /// SQLite: this many schema scripts were applied now.
    Sqlite(usize),
    /// The store has no schema (Redis, memory).
    Nothing,
}

/// `idemgate migrate`: apply the schema of a PostgreSQL or SQLite store.
pub async fn migrate(config: &StoreConfig) -> Result<Migrated, StoreError> {
    let url = config.url.as_str();
    if url.starts_with("postgres") {
        migrate_postgres(config).await
    } else if url.starts_with("sqlite:") {
        migrate_sqlite(config).await
    } else {
        Ok(Migrated::Nothing)
    }
}

#[cfg(feature = "postgres")]
async fn migrate_postgres(config: &StoreConfig) -> Result<Migrated, StoreError> {
    let store = crate::postgres::PgStore::connect(config).await?;
    store.migrate().await?;
    Ok(Migrated::Postgres)
}

#[cfg(not(feature = "postgres"))]
async fn migrate_postgres(config: &StoreConfig) -> Result<Migrated, StoreError> {
    Err(not_built(config, "postgres"))
}

#[cfg(feature = "sqlite")]
async fn migrate_sqlite(config: &StoreConfig) -> Result<Migrated, StoreError> {
    // Opened without applying the schema, so the count says what this
    // call applied.
    let opening = StoreConfig {
        migrate: false,
        ..config.clone()
    };
    let sqlite = crate::sqlite::SqliteStore::connect(&opening).await?;
    let applied = sqlite.migrate().await;
    sqlite.close().await;
    Ok(Migrated::Sqlite(applied?))
}

#[cfg(not(feature = "sqlite"))]
async fn migrate_sqlite(config: &StoreConfig) -> Result<Migrated, StoreError> {
    Err(not_built(config, "sqlite"))
}

/// The error for a backend this build left out.
#[cfg(not(all(
    feature = "postgres",
    feature = "redis",
    feature = "sqlite",
    feature = "memory",
    feature = "front"
)))]
fn not_built(config: &StoreConfig, feature: &'static str) -> StoreError {
    StoreError::NotBuilt {
        url: redact_url(&config.url),
        feature,
    }
}

#[cfg(feature = "front")]
async fn front(config: &StoreConfig) -> Result<Arc<dyn Backend>, StoreError> {
    let url = config.url.as_str();
    let front = config.front.as_ref().expect("matched on is_some");
    let store = crate::front::FrontStore::connect(config, front).await?;
    tracing::info!(
        url = %redact_url(url),
        front = %redact_url(&front.url),
        "postgres:// store with a Redis front: PostgreSQL is the truth; the front answers \
         replays, 409s, 422s and held keys it knows of, and is kept true by an outbox"
    );
    Ok(Arc::new(store))
}

#[cfg(not(feature = "front"))]
async fn front(config: &StoreConfig) -> Result<Arc<dyn Backend>, StoreError> {
    Err(not_built(config, "front"))
}

#[cfg(feature = "postgres")]
async fn postgres(config: &StoreConfig) -> Result<Arc<dyn Backend>, StoreError> {
    let url = config.url.as_str();
    let store = crate::postgres::PgStore::connect(config).await?;
    if config.migrate {
        store.migrate().await?;
    }
    tracing::info!(
        url = %redact_url(url),
        "postgres:// store: durable, shared by every gateway instance pointed at it"
    );
    Ok(Arc::new(store))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(config: &StoreConfig) -> Result<Arc<dyn Backend>, StoreError> {
    Err(not_built(config, "postgres"))
}

#[cfg(feature = "redis")]
async fn redis(config: &StoreConfig) -> Result<Arc<dyn Backend>, StoreError> {
    let url = config.url.as_str();
    let store = crate::redis::RedisStore::connect(config).await?;
    if crate::config::is_sentinel_url(url) {
        tracing::info!(
            url = %redact_url(url),
            "redis+sentinel:// store: the primary the sentinels name, followed across \
             failovers; set [store] replicas so that a failover keeps acknowledged records"
        );
    } else if config.cluster {
        tracing::info!(
            url = %redact_url(url),
            "redis:// store on a Redis Cluster (this seed node): shared by every gateway \
             instance pointed at it; a failover to a replica can lose acknowledged records \
             (asynchronous replication)"
        );
    } else {
        tracing::info!(
            url = %redact_url(url),
            "redis:// store: shared by every gateway instance pointed at it; as durable as \
             the server's persistence (appendonly, appendfsync)"
        );
    }
    Ok(Arc::new(store))
}

#[cfg(not(feature = "redis"))]
async fn redis(config: &StoreConfig) -> Result<Arc<dyn Backend>, StoreError> {
    Err(not_built(config, "redis"))
}

#[cfg(feature = "sqlite")]
async fn sqlite(config: &StoreConfig) -> Result<Arc<dyn Backend>, StoreError> {
    let url = config.url.as_str();
    let store = crate::sqlite::SqliteStore::connect(config).await?;
    tracing::info!(
        url = %redact_url(url),
        "sqlite:// store: durable in one file, shared by the gateway processes of this \
         host only; instances on several hosts need PostgreSQL or Redis"
    );
    Ok(Arc::new(store))
}

#[cfg(not(feature = "sqlite"))]
async fn sqlite(config: &StoreConfig) -> Result<Arc<dyn Backend>, StoreError> {
    Err(not_built(config, "sqlite"))
}

#[cfg(feature = "memory")]
fn memory(config: &StoreConfig) -> Result<Arc<dyn Backend>, StoreError> {
    tracing::warn!(
        max_records = config.max_records,
        "memory:// store: records live in this process only and are lost on restart; \
             instances do not share them. Use sqlite:// (one host), PostgreSQL or Redis \
             to keep them."
    );
    Ok(Arc::new(crate::memory::MemoryStore::new(
        config.max_records,
    )))
}

#[cfg(not(feature = "memory"))]
fn memory(config: &StoreConfig) -> Result<Arc<dyn Backend>, StoreError> {
    Err(not_built(config, "memory"))
}
