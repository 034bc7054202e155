//! The PostgreSQL store (docs/src/design/stores.md), the default and the source of truth.
//!
//! The claim is one call of the `idemgate_claim` function (migrations/), one
//! round trip; every later transition is one `UPDATE`/`DELETE` that is a
//! compare-and-set on the fencing token. Connections come from a bounded
//! pool ([`pool`]); claims and completions go in batches ([`batch`]); every
//! operation is bounded by `[store] timeout`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnection, PgSslMode};

mod batch;
mod generations;
mod hosts;
mod lanes;
#[cfg(feature = "front")]
pub(crate) mod outbox;
mod pool;

use super::{Cas, RecordKey, StoreConfig, StoreError, redact_url};
use crate::waiters::{Waiters, parse_wake_id};
use batch::Batcher;
pub(crate) use batch::lock_order;
use hosts::Hosts;
use pool::PgPool;

/// The migrations under `migrations/`, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// A PostgreSQL-backed [`Store`].
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    timeout: Duration,
    /// Its hosts: the pool's, and the wake-up listener's own connection.
    hosts: Arc<Hosts>,
    /// The routes whose settled records are announced.
    wait_routes: crate::WaitRoutes,
    /// Claims and completions go through it (or through a serving
    /// thread's own: [`lanes`]).
    batcher: Batcher,
    /// Tells this store's lanes apart on a serving thread.
    id: u64,
    /// `batches_in_flight`, which lanes share.
    in_flight: u32,
    /// `[store] generation`: how long new keys go to one generation.
    generation: Duration,
    /// The lanes' pools, for the pool figures (while each lives).
    lane_pools: Arc<std::sync::Mutex<Vec<pool::WeakPgPool>>>,
}

/// The channel of the announcements of settled records (`concurrent = "wait"`).
const WAKE_CHANNEL: &str = "idemgate_keys";

/// How often the wake-up listener checks that the store's connections
/// still go to the host it listens on (several hosts only).
const HOST_WATCH: Duration = Duration::from_secs(1);

/// A duration in whole milliseconds, as the statements (and the front's
/// absolute expiry times) take it.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The condition that finds one record; [`bind_key!`] binds `$1`–`$3`.
macro_rules! key_match {
    () => {
        "route = $1 AND scope = $2 AND key = $3"
    };
}

/// `$head WHERE <one record> $tail`, as a `&'static str`.
macro_rules! at_key {
    ($head:literal, $tail:literal $(,)?) => {
        concat!($head, " WHERE ", key_match!(), " ", $tail)
    };
}

/// Bind a [`RecordKey`] as `$1`–`$3` of a statement written with [`at_key!`].
macro_rules! bind_key {
    ($query:expr, $key:expr) => {
        $query.bind(&$key.route).bind(&$key.scope).bind(&$key.key)
    };
}

/// A settling statement written with [`at_key!`], and the same statement
/// announcing the record it changed on the wake-up channel (`NOTIFY`, sent
/// at its commit, so a woken waiter sees the change) in the same round
/// trip; `$channel` and `$id` number the two extra parameters. The
/// announcing form returns a row per changed record, as many as the plain
/// form affects.
macro_rules! settling {
    ($statement:expr, $channel:literal, $id:literal) => {
        (
            $statement,
            concat!(
                "WITH changed AS (",
                $statement,
                " RETURNING 1) SELECT pg_notify($",
                $channel,
                ", $",
                $id,
                ") FROM changed"
            ),
        )
    };
}

/// A single statement on a record (a renewal, release, hold, inquiry or
/// abandonment), sent unnamed: PostgreSQL plans it at every execution with
/// the table's current size. A named (prepared) statement settles on a
/// generic plan after five executions; planned while the table was small,
/// that plan reads the whole table and keeps doing so as it grows (the
/// claim and the completion run in functions with `enable_seqscan = off`
/// instead: migrations/0009_plans.sql). These statements are rare beside
/// claims, so planning each costs little; sqlx still prepares an unnamed
/// statement before running it, so each takes two round trips, not one.
/// Tested in tests/it/stores/postgres_plans.rs.
fn unnamed<'q>(
    sql: &'static str,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql).persistent(false)
}

/// Choose the plain or the announcing form of a [`settling!`] statement
/// ([`unnamed`]), and bind the announcement's parameters (after all the
/// others).
fn settle_query<'q>(
    forms: (&'static str, &'static str),
    wake_id: Option<&'q str>,
    bind: impl FnOnce(
        sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    match wake_id {
        None => bind(unnamed(forms.0)),
        Some(id) => bind(unnamed(forms.1)).bind(WAKE_CHANNEL).bind(id),
    }
}

/// Whether the URL (`sslmode`, or sqlx's `ssl-mode`) or the environment
/// (`PGSSLMODE`) says how to use TLS. If neither does, idemgate connects in
/// cleartext, as it did before it could speak TLS to PostgreSQL, rather than
/// libpq's and sqlx's default `prefer` (TLS whenever the server offers it,
/// unverified): a server with `ssl = on` must not silently change what
/// every connection costs. Asking for `require` or `verify-full` is what
/// protects the connection anyway.
fn tls_asked_for(url: &str) -> bool {
    // Not `url::Url`: it cannot parse a multi-host URL.
    let query = url.split_once('?').map_or("", |(_, query)| query);
    std::env::var_os("PGSSLMODE").is_some()
        || query.split('&').any(|pair| {
            let name = pair.split_once('=').map_or(pair, |(name, _)| name);
            name == "sslmode" || name == "ssl-mode"
        })
}

/// Whether connecting failed in TLS: sqlx's own TLS errors (a CA file it
/// cannot use), or a rustls error during the handshake (a certificate that
/// fails verification), which reaches sqlx as an I/O error.
fn tls_failed(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Tls(_) => true,
        sqlx::Error::Io(io) => io
            .get_ref()
            .is_some_and(|inner| inner.is::<rustls::Error>()),
        _ => false,
    }
}

// After the statement macros above, which they use.
mod admin;
mod store;

pub use admin::{COUNT_INQUIRING, ERASE};
pub use generations::{MOST_MOVED, Rotation, live_records_sql};
pub use pool::LANE_APPLICATION;

fn cas(rows: u64) -> Cas {
    if rows == 1 { Cas::Applied } else { Cas::Fenced }
}

impl PgStore {
    /// Connect, failing with a message that says what to do when the database is unreachable.
    pub async fn connect(config: &StoreConfig) -> Result<Self, StoreError> {
        Self::connect_as(config, false).await
    }

    /// [`Self::connect`]; with `outbox`, every connection sets
    /// `idemgate.front = on`, so that every change that can make a front
    /// stale writes its outbox row (migrations/0004_front_outbox.sql).
    pub(crate) async fn connect_as(config: &StoreConfig, outbox: bool) -> Result<Self, StoreError> {
        let shown = redact_url(&config.url);
        let tls = tls_asked_for(&config.url);
        let hosts = Hosts::parse(&config.url, |options| {
            let options = options.application_name("idemgate");
            let options = if outbox {
                options.options([("idemgate.front", "on")])
            } else {
                options
            };
            if tls {
                options
            } else {
                options.ssl_mode(PgSslMode::Disable)
            }
        })
        .map_err(|e| StoreError::Unavailable(format!("invalid store URL {shown}: {e}")))?;
        let hosts = Arc::new(hosts);
        let pool = PgPool::new(hosts.clone(), config.pool_size as usize, config.timeout);
        // Connect now, so that a wrong URL or a database that is down is
        // reported at start, with what to do.
        let mut first = pool.get().await.map_err(|e| {
            let hint = match &e {
                deadpool::managed::PoolError::Backend(e) if tls_failed(e) => {
                    "the TLS connection failed: check sslmode and sslrootcert (the CA that signed the server's certificate) in [store] url"
                }
                _ => "start PostgreSQL or point [store] url at a reachable database",
            };
            StoreError::Unavailable(format!("cannot reach store at {shown}: {e}; {hint}"))
        })?;
        first.clean();
        drop(first);
        let batcher = Batcher::start(
            pool.clone(),
            config.timeout,
            config.claim_queue_budget,
            config.batches_in_flight as usize,
        );
        Ok(Self {
            pool,
            timeout: config.timeout,
            hosts,
            wait_routes: config.wait_routes.clone(),
            batcher,
            id: crate::runtime::new_lane_id(),
            in_flight: config.batches_in_flight,
            generation: config.generation,
            lane_pools: Arc::default(),
        })
    }

    /// Where this thread's claims and completions go: its own lane on a
    /// serving thread that opened one, else the shared dispatcher.
    fn batcher(&self) -> Batcher {
        lanes::local(self.id)
            .filter(|lane| !lane.is_closed())
            .unwrap_or_else(|| self.batcher.clone())
    }

    /// Open this serving thread's lane (one of `threads`): a dispatcher
    /// on its runtime sending its share of `batches_in_flight` at once, on
    /// a pool of as many connections (each batch holds one), one made now
    /// (bounded by `[store] timeout`; a failure is left for the first
    /// request).
    async fn open_lane(&self, threads: usize) {
        if !crate::runtime::on_serving_thread() {
            return;
        }
        let in_flight = lanes::share(self.in_flight, threads);
        let pool = PgPool::for_lane(self.hosts.clone(), in_flight, self.timeout);
        if let Ok(mut first) = pool.get().await {
            first.clean();
        }
        let mut pools = self.lane_pools.lock().expect("never poisoned");
        pools.retain(|weak| weak.stats().is_some());
        pools.push(pool.downgrade());
        drop(pools);
        crate::runtime::keep_serving_lane(self.id, self.batcher.lane(pool, in_flight));
    }

    /// Open, idle and most connections: the shared pool's and every
    /// living lane's.
    fn pool_figures(&self) -> (u64, u64, u64) {
        let pools = self.lane_pools.lock().expect("never poisoned");
        pools
            .iter()
            .filter_map(pool::WeakPgPool::stats)
            .fold(self.pool.stats(), |(c, i, m), (c2, i2, m2)| {
                (c + c2, i + i2, m + m2)
            })
    }

    /// The wake id to announce with a settling write of `key`: on a route
    /// with waiters only, since a notifying commit is serialised with every
    /// other one.
    fn wake_id_for(&self, key: &RecordKey) -> Option<String> {
        self.wait_routes
            .contains(&key.route)
            .then(|| hex::encode(key.wake_id()))
    }

    /// Listen on `idemgate_keys` and wake the waiters each notification
    /// names, until the connection is lost (`Ok`) or cannot be made.
    ///
    /// With several hosts, the listener also ends (`Ok`) once the store's
    /// connections went to another host: after a switchover that keeps
    /// the old primary's sessions open, its connection would otherwise
    /// stay there, hearing nothing, and waiters would only poll.
    async fn listen(&self, waiters: &Waiters) -> Result<(), sqlx::Error> {
        if self.hosts.several() {
            // Notifications come from the host that takes the writes:
            // find it first.
            sqlx::Connection::close(self.hosts.connect(self.timeout).await?).await?;
        }
        let serving = self.hosts.serving();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(self.timeout)
            .connect_lazy_with(self.hosts.options(serving).clone());
        let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
        listener.listen(WAKE_CHANNEL).await?;
        // Closing the pool ends a `try_recv` in progress (PoolClosed).
        let moved = Arc::new(AtomicBool::new(false));
        // Aborted when this ends, however it ends (the relay is aborted
        // at shutdown).
        let _watch = self.hosts.several().then(|| {
            let (hosts, pool, moved) = (self.hosts.clone(), pool.clone(), moved.clone());
            tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
                while hosts.serving() == serving {
                    tokio::time::sleep(HOST_WATCH).await;
                }
                moved.store(true, Ordering::Release);
                pool.close().await;
            }))
        });
        // Anything announced before this connection listened is lost.
        waiters.wake_all();
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    if let Some(id) = parse_wake_id(notification.payload()) {
                        waiters.wake(&id);
                    }
                }
                Ok(None) => break Ok(()),
                Err(sqlx::Error::PoolClosed) if moved.load(Ordering::Acquire) => {
                    tracing::warn!(
                        "store wake-up listener follows the store to another PostgreSQL host"
                    );
                    break Ok(());
                }
                Err(error) => break Err(error),
            }
        }
    }

    /// Apply the embedded migrations (safe to run from many instances at once).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut checkout = self
            .pool
            .get()
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))?;
        // A migration may take long (an index on a big table), and waits
        // for another instance's: unbounded while it runs, bounded again
        // before the connection goes back to the pool.
        sqlx::raw_sql("SET statement_timeout = 0; SET idle_in_transaction_session_timeout = 0")
            .execute(checkout.conn())
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))?;
        MIGRATOR
            .run(checkout.conn())
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))?;
        if sqlx::raw_sql(sqlx::AssertSqlSafe(pool::session_bounds(self.timeout)))
            .execute(checkout.conn())
            .await
            .is_ok()
        {
            checkout.clean();
        }
        Ok(())
    }

    /// Run `op` on a pooled connection, bounded by `[store] timeout`
    /// ([`PgPool::run`]).
    pub(crate) async fn bounded<T>(
        &self,
        op: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    ) -> Result<T, StoreError> {
        Ok(self.pool.run(self.timeout, op).await?)
    }
}
