//! The PostgreSQL connection pool: sqlx connections, pooled by deadpool.
//!
//! sqlx's own pool pings every connection when it is returned (and spawns a
//! task to do it), which doubled the round trips of every store operation:
//! a new key cost four instead of two. Here a connection goes back to the
//! pool without a round trip, and only if the operation that used it ended
//! cleanly; a connection whose operation failed at the transport, or was
//! cancelled (by `[store] timeout` or a shutdown) part way through the
//! protocol, is closed instead, so the pool never hands out a connection in
//! an unknown state.
//!
//! Closing the socket does not stop a statement the server already runs:
//! a claim waiting on a row lock would still commit once the lock goes,
//! long after its caller answered 503 and stopped looking for it. So every
//! connection bounds its own statements and open transactions on the
//! server by `[store] timeout` too ([`session_bounds`]): nothing the
//! gateway gave up on commits more than that after it was sent.

use std::sync::Arc;
use std::time::Duration;

use deadpool::managed::{self, Manager, Metrics, Object, Pool, RecycleResult};
use sqlx::postgres::PgConnection;

use super::hosts::Hosts;
use crate::StoreError;
use crate::runtime::StoreRuntime;

/// Opens connections for the pool.
#[derive(Debug)]
pub(super) struct Connector {
    /// The hosts, and which takes writes ([`Hosts`]).
    hosts: Arc<Hosts>,
    /// Opening one connection, the host search included.
    timeout: Duration,
    /// Where connections are opened, whoever asks.
    runtime: StoreRuntime,
    /// Sent on every new connection ([`session_bounds`]).
    bounds: String,
}

/// What a serving thread's own connections are called on the server (the
/// shared pool's are `idemgate`).
pub const LANE_APPLICATION: &str = "idemgate serving thread";

/// The statement that bounds, on the server, every statement and every
/// open transaction of a session by `timeout`: a statement still running
/// when its caller gave up is cancelled (SQLSTATE 57014), and a session
/// left idle inside a transaction (its connection hung) is ended, its row
/// locks released. One round trip per new connection, none per operation.
/// Behind PgBouncer in transaction mode these are session settings on
/// whichever server connection runs them: give idemgate a pool (user) of
/// its own there.
pub(super) fn session_bounds(timeout: Duration) -> String {
    let ms = timeout.as_millis().max(1);
    format!("SET statement_timeout = {ms}; SET idle_in_transaction_session_timeout = {ms}")
}

/// A pooled connection and the hosts' generation it was opened in
/// ([`Hosts::reset`]).
#[derive(Debug)]
pub(super) struct Pooled {
    conn: PgConnection,
    generation: u64,
}

impl Manager for Connector {
    type Type = Pooled;
    type Error = sqlx::Error;

    async fn create(&self) -> Result<Pooled, sqlx::Error> {
        let (hosts, timeout) = (self.hosts.clone(), self.timeout);
        // Read before connecting: a reset while it connects makes it old.
        let generation = hosts.generation();
        let bounds = sqlx::AssertSqlSafe(self.bounds.clone());
        self.runtime
            .run(async move {
                let mut conn = hosts.connect(timeout).await?;
                sqlx::raw_sql(bounds).execute(&mut conn).await?;
                Ok(Pooled { conn, generation })
            })
            .await
            .map_err(|e| sqlx::Error::Io(std::io::Error::other(e)))?
    }

    async fn recycle(&self, pooled: &mut Pooled, _: &Metrics) -> RecycleResult<sqlx::Error> {
        // Only connections whose last operation ended cleanly come back
        // (see `Checkout`); one opened before a pool of the same hosts saw
        // the sessions end is not reused (no round trip).
        if pooled.generation < self.hosts.generation() {
            return Err(deadpool::managed::RecycleError::message(
                "opened before the store's connections were reset",
            ));
        }
        Ok(())
    }
}

/// A bounded pool of PostgreSQL connections (cheap to clone: shared).
#[derive(Debug, Clone)]
pub(super) struct PgPool {
    pool: Pool<Connector>,
}

/// A pool that may have ended ([`PgPool::downgrade`]).
#[derive(Debug)]
pub(super) struct WeakPgPool(deadpool::managed::WeakPool<Connector>);

impl WeakPgPool {
    /// [`PgPool::stats`], while the pool lives.
    pub(super) fn stats(&self) -> Option<(u64, u64, u64)> {
        self.0.upgrade().map(|pool| PgPool { pool }.stats())
    }
}

/// Why no connection could be had.
pub(super) type GetError = managed::PoolError<sqlx::Error>;

/// Why [`PgPool::run`] failed.
#[derive(Debug)]
pub(super) enum RunError {
    /// No connection could be had.
    Get(GetError),
    /// The operation failed; a [`sqlx::Error::Database`] is the database
    /// refusing a statement, anything else a transport or protocol failure.
    Sql(sqlx::Error),
    /// The whole operation (the connection included) took longer than this.
    TimedOut(Duration),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Get(e) => e.fmt(f),
            RunError::Sql(e) => e.fmt(f),
            RunError::TimedOut(limit) => write!(f, "no answer within {limit:?}"),
        }
    }
}

impl From<RunError> for StoreError {
    fn from(e: RunError) -> Self {
        StoreError::Unavailable(e.to_string())
    }
}

impl PgPool {
    /// A pool of at most `max` connections; waiting for one and opening one
    /// are each bounded by `timeout`. Connects lazily, on the runtime this
    /// is called on ([`StoreRuntime`]).
    pub(super) fn new(hosts: Arc<Hosts>, max: usize, timeout: Duration) -> Self {
        Self::with_setup(hosts, max, timeout, session_bounds(timeout))
    }

    /// [`PgPool::new`] for a serving thread's lane
    /// (crates/store/src/postgres/lanes.rs): its connections are named
    /// [`LANE_APPLICATION`] in `pg_stat_activity`.
    pub(super) fn for_lane(hosts: Arc<Hosts>, max: usize, timeout: Duration) -> Self {
        let setup = format!(
            "{}; SET application_name = '{LANE_APPLICATION}'",
            session_bounds(timeout)
        );
        Self::with_setup(hosts, max, timeout, setup)
    }

    /// A pool whose every new connection first runs `setup` (one round trip).
    fn with_setup(hosts: Arc<Hosts>, max: usize, timeout: Duration, setup: String) -> Self {
        let runtime = StoreRuntime::here();
        let connector = Connector {
            hosts,
            timeout,
            runtime,
            bounds: setup,
        };
        let pool = Pool::builder(connector)
            .max_size(max)
            .wait_timeout(Some(timeout))
            .create_timeout(Some(timeout))
            .runtime(deadpool::Runtime::Tokio1)
            .build()
            .expect("a pool with a runtime and a size always builds");
        Self { pool }
    }

    /// A connection, reused or new.
    pub(super) async fn get(&self) -> Result<Checkout, GetError> {
        Ok(Checkout {
            object: Some(self.pool.get().await?),
            clean: false,
        })
    }

    /// Run `op` on a pooled connection, bounded by `timeout` (getting the
    /// connection included). The connection goes back to the pool only if
    /// `op` ended at a protocol boundary: it succeeded or the database
    /// refused the statement (not an error that ends the session). After a
    /// transport failure, or the server ending the session, every idle
    /// connection is closed too.
    pub(super) async fn run<T>(
        &self,
        timeout: Duration,
        op: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    ) -> Result<T, RunError> {
        let work = async {
            let mut checkout = self.get().await.map_err(RunError::Get)?;
            let result = op(checkout.conn()).await;
            match &result {
                Err(sqlx::Error::Database(db)) if ends_the_session(db.code().as_deref()) => {
                    // The server ended this session (a restart, a
                    // failover, pg_terminate_backend): the others went
                    // with it.
                    self.close_idle(checkout.generation());
                }
                // Only this session ended (it idled in a transaction past
                // its bound): closed, the others are fine.
                Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(IDLE_TIMED_OUT) => {}
                Ok(_) => checkout.clean(),
                Err(sqlx::Error::Database(_)) => {
                    // A refused statement inside a transaction leaves it
                    // open (aborted), its ROLLBACK only queued by sqlx:
                    // sent now, or the session would sit idle in a
                    // transaction, holding its locks, until the server
                    // ends it (`idle_in_transaction_session_timeout`)
                    // and the connection's next operation fails.
                    if sqlx::Connection::ping(checkout.conn()).await.is_ok() {
                        checkout.clean();
                    }
                }
                Err(sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_)) => {
                    self.close_idle(checkout.generation());
                }
                Err(_) => {}
            }
            result.map_err(RunError::Sql)
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or(Err(RunError::TimedOut(timeout)))
    }

    /// Close every idle connection: after one (of generation `seen`)
    /// failed at the transport (the server restarted, the network
    /// dropped), the others almost certainly did too, and each would
    /// otherwise fail one operation first. Every other pool of these hosts
    /// (each serving thread's lane) drops its own when it next hands one
    /// out ([`Hosts::reset`]).
    pub(super) fn close_idle(&self, seen: u64) {
        self.pool.manager().hosts.reset(seen);
        let _ = self.pool.retain(|_, _| false);
    }

    /// A handle that does not keep the pool alive (a serving thread's
    /// lane, counted in the store's pool figures while it lives).
    pub(super) fn downgrade(&self) -> WeakPgPool {
        WeakPgPool(self.pool.weak())
    }

    /// Open connections, idle ones, and the most the pool opens.
    pub(super) fn stats(&self) -> (u64, u64, u64) {
        let status = self.pool.status();
        (
            status.size as u64,
            status.available as u64,
            status.max_size as u64,
        )
    }
}

/// Whether an error's SQLSTATE says the session is of no more use, so the
/// connection is closed although the error arrived cleanly: class 57
/// (operator intervention: `admin_shutdown` on a restart or
/// `pg_terminate_backend`, `crash_shutdown`, `cannot_connect_now`), class
/// 08 (connection exception), and `read_only_sql_transaction` (25006): the
/// server no longer takes writes (a standby, or a primary made read-only),
/// so the pool connects again, to the host that does ([`Hosts`]).
/// A statement cancelled by its `statement_timeout` (57014) ends nothing.
fn ends_the_session(code: Option<&str>) -> bool {
    code.is_some_and(|code| {
        (code.starts_with("57") && code != QUERY_CANCELED)
            || code.starts_with("08")
            || code == "25006"
    })
}

/// SQLSTATE of a statement cancelled (here: by `statement_timeout`).
const QUERY_CANCELED: &str = "57014";
/// SQLSTATE of a session ended for idling in a transaction.
const IDLE_TIMED_OUT: &str = "25P03";

/// A checked-out connection. It returns to the pool only after
/// [`Checkout::clean`]; dropped without it, the connection is closed.
pub(super) struct Checkout {
    object: Option<Object<Connector>>,
    clean: bool,
}

impl Checkout {
    /// The connection.
    pub(super) fn conn(&mut self) -> &mut PgConnection {
        &mut self
            .object
            .as_mut()
            .expect("present until the checkout is dropped")
            .conn
    }

    /// The hosts' generation it was opened in.
    fn generation(&self) -> u64 {
        self.object
            .as_ref()
            .expect("present until the checkout is dropped")
            .generation
    }

    /// The operation ended at a protocol boundary: the connection may be
    /// reused.
    pub(super) fn clean(&mut self) {
        self.clean = true;
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if let Some(object) = self.object.take()
            && !self.clean
        {
            // Out of the pool for good; dropping it closes the socket.
            drop(Object::take(object));
        }
    }
}
