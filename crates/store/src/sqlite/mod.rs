//! The SQLite store (`sqlite://PATH`, docs/src/stores/sqlite.md): the embedded
//! durable default. One file, kept across restarts, shared by the gateway
//! processes of one host; several hosts need PostgreSQL or Redis.
//!
//! - **Durable**: WAL journal, `synchronous = FULL` (a commit is on disk
//!   before the claim or the record is acknowledged, as with PostgreSQL's
//!   default), the schema versioned by [`schema`].
//! - **One state machine**: like the memory store, it executes the rules of
//!   [`super::transitions`] itself ([`ops`]): every transition reads the
//!   record and writes what the rules decide inside a `BEGIN IMMEDIATE`
//!   transaction, which holds the file's write lock from its first
//!   statement, so two writers (processes) never interleave. Each process
//!   writes through one connection, owned by its [`writer`] task, which
//!   commits the operations that queued meanwhile together (group commit:
//!   one `fsync` for many keys); other processes wait for the lock up to
//!   `[store] timeout`.
//! - **Reads first**: a claim reads on a reader connection (WAL readers run
//!   beside the writer) and answers a replay, a mismatch, a held key or a
//!   live lease from that consistent snapshot; only a claim that writes
//!   (a new key, a takeover, a lapsed lease turning held) takes the lock.
//! - **Wake-ups** (`concurrent = "wait"`): settled records are announced to
//!   this process's waiters directly, and, on waiting routes, written to
//!   `idemgate_wakeups` in the settling transaction, which every process's
//!   relay reads every [`WAKE_POLL`] (the sweeper prunes it).
//! - **Clock**: the wall clock, in microseconds, shared by the processes of
//!   one host.
//! - **Room**: the sweeper's deletions free pages that new records reuse;
//!   beyond a quarter of the file they are given back ([`room`]).

mod admin;
mod erase;
mod inquiries;
mod ops;
mod room;
mod rows;
mod schema;
mod store;
mod writer;

use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use sqlx::Connection;
use sqlx::sqlite::{
    SqliteAutoVacuum, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool,
    SqlitePoolOptions, SqliteSynchronous,
};

use self::ops::{AttemptWrite, ClaimOp, Op, Removal, Reply, claim_step, read_only_answer};
use self::rows::{Context, Head, KEY, bind_key, corrupt, now_us, read_row, unavailable};
use self::writer::Writer;
use super::{
    AttemptId, Cas, Claim, ClaimRequest, EraseStep, EraseStepFailed, Erased, HeldReason,
    InquiringRoute, Inquiry, RecordInfo, RecordKey, RecordState, Store, StoreAdmin, StoreConfig,
    StoreError, StoredResponse, Swept, Token,
};
use crate::waiters::{Waiters, WakeId};

pub use self::erase::ERASE;

/// How often each process's relay reads the announcements of other
/// processes (only while some route waits).
pub const WAKE_POLL: Duration = Duration::from_millis(50);

/// A SQLite-backed [`Store`].
#[derive(Debug)]
pub struct SqliteStore {
    /// The writer task: every write, in group-committed transactions.
    writer: Writer,
    /// Claims' first reads, key administration's reads, wake-up reads.
    readers: SqlitePool,
    timeout: Duration,
    /// The routes whose settled records are announced to other processes.
    wait_routes: crate::WaitRoutes,
    /// This process's waiters, woken where records settle.
    waiters: OnceLock<Arc<Waiters>>,
}

/// Open the writer's connection, creating the file if missing. Putting a
/// file in WAL mode needs an exclusive lock that `busy_timeout` does not
/// wait for (sqlx's `SqliteConnectOptions` says so): while another
/// connection writes a file not yet in WAL mode (processes opening a new
/// file together), SQLite answers "database is locked" at once. Such an answer is retried until `timeout` has passed.
async fn open_writer(
    options: &SqliteConnectOptions,
    timeout: Duration,
) -> Result<SqliteConnection, sqlx::Error> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match SqliteConnection::connect_with(options).await {
            Err(e) if is_busy(&e) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            opened => return opened,
        }
    }
}

/// SQLITE_BUSY or SQLITE_LOCKED, with any extended code.
fn is_busy(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(e) = error else {
        return false;
    };
    let code = e.code().and_then(|c| c.parse::<i32>().ok());
    matches!(code.map(|c| c & 0xff), Some(5 | 6))
}

impl SqliteStore {
    /// Open (creating it if missing) the file the URL names, failing with
    /// a message that says what to do.
    pub async fn connect(config: &StoreConfig) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(&config.url)
            .map_err(|e| {
                StoreError::Unavailable(format!("invalid store URL {:?}: {e}", config.url))
            })?
            .create_if_missing(true)
            // Before the first table only: a new file gives the room of
            // swept records back ([`room`]); an existing one keeps its mode.
            .auto_vacuum(SqliteAutoVacuum::Incremental)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            // Another process holding the write lock: wait, up to the
            // store's own deadline.
            .busy_timeout(config.timeout);
        let shown = options.get_filename().display().to_string();
        // The writer's connection creates the file and sets WAL mode, so
        // the readers open a file that is already in it.
        let mut conn = open_writer(&options, config.timeout).await.map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot open the SQLite store at {shown}: {e}; check the path and its directory's permissions"
            ))
        })?;
        if config.migrate {
            let applied = schema::migrate(&mut conn)
                .await
                .map_err(|e| StoreError::Migration(format!("{shown}: {e}")))?;
            if applied > 0 {
                tracing::info!(file = %shown, applied, "SQLite store schema created or upgraded");
            }
        }
        if !room::gives_room_back(&mut conn).await.unwrap_or(true) {
            tracing::info!(
                file = %shown,
                "this SQLite file keeps the room of swept records for new ones but never gives it back \
                 (it was created without auto_vacuum = INCREMENTAL); to convert it, stop every gateway \
                 using it and run: sqlite3 FILE 'PRAGMA auto_vacuum = INCREMENTAL; VACUUM;'"
            );
        }
        let context = Context {
            wait_routes: config.wait_routes.clone(),
        };
        let readers = SqlitePoolOptions::new()
            .max_connections(config.pool_size.max(1))
            .min_connections(0)
            .acquire_timeout(config.timeout)
            // A SQLite connection is a file handle: nothing to probe.
            .test_before_acquire(false)
            .connect_lazy_with(options);
        Ok(Self {
            writer: Writer::start(conn, context),
            readers,
            timeout: config.timeout,
            wait_routes: config.wait_routes.clone(),
            waiters: OnceLock::new(),
        })
    }

    /// Apply the schema scripts the file lacks (safe from many processes).
    pub async fn migrate(&self) -> Result<usize, StoreError> {
        let mut conn = self
            .readers
            .acquire()
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))?;
        schema::migrate(&mut conn)
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))
    }

    /// `op` on a reader connection, bounded by `[store] timeout`.
    async fn read<T>(
        &self,
        op: impl AsyncFnOnce(&mut SqliteConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.bounded(async {
            let mut conn = self.readers.acquire().await.map_err(unavailable)?;
            op(&mut conn).await
        })
        .await
    }

    /// `op` committed by the writer, bounded by `[store] timeout` (the
    /// queue, the file's write lock and the commit included).
    async fn write(&self, op: Op) -> Result<Reply, StoreError> {
        self.bounded(self.writer.submit(op)).await
    }

    async fn bounded<T>(
        &self,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unavailable(format!(
                    "no answer within {:?}",
                    self.timeout
                )))
            })
    }

    /// `key`'s record left `in_flight` (committed): wake this process's waiters.
    fn announce_here(&self, key: &RecordKey) {
        if let Some(waiters) = self.waiters.get() {
            waiters.wake(&key.wake_id());
        }
    }

    /// An attempt's write by its token; announced here if it settles the key.
    async fn attempt_write(
        &self,
        key: &RecordKey,
        token: Token,
        write: AttemptWrite,
    ) -> Result<Cas, StoreError> {
        let settles = !matches!(write, AttemptWrite::Renew { .. });
        let op = Op::Write {
            key: key.clone(),
            token,
            write,
        };
        let applied = self.applied(op).await?;
        if applied && settles {
            self.announce_here(key);
        }
        Ok(if applied { Cas::Applied } else { Cas::Fenced })
    }

    /// Remove `key`'s record if `removal` allows; announced here if it went.
    async fn remove(&self, key: &RecordKey, removal: Removal) -> Result<bool, StoreError> {
        let op = Op::Remove {
            key: key.clone(),
            removal,
        };
        let removed = self.applied(op).await?;
        if removed {
            self.announce_here(key);
        }
        Ok(removed)
    }

    async fn applied(&self, op: Op) -> Result<bool, StoreError> {
        match self.write(op).await? {
            Reply::Applied(applied) => Ok(applied),
            other => Err(corrupt(&format!("the writer answered {other:?}"))),
        }
    }

    /// Read the announcements after `after`; returns the last one's number.
    async fn read_wakeups(&self, after: i64, waiters: &Waiters) -> Result<i64, StoreError> {
        let rows: Vec<(i64, Vec<u8>)> = self
            .read(async |conn| {
                sqlx::query_as(
                    "SELECT seq, wake_id FROM idemgate_wakeups WHERE seq > ?1 ORDER BY seq",
                )
                .bind(after)
                .fetch_all(conn)
                .await
                .map_err(unavailable)
            })
            .await?;
        let mut last = after;
        for (seq, id) in rows {
            if let Ok(id) = WakeId::try_from(id.as_slice()) {
                waiters.wake(&id);
            }
            last = last.max(seq);
        }
        Ok(last)
    }
}

#[cfg(test)]
mod tests {
    //! The writer's group commit on a real file. (The conformance suite
    //! holds the SQLite store to the same rules as every other store.)

    use std::time::Duration;

    use super::*;
    use crate::UnknownOutcome;

    fn key(name: &str) -> RecordKey {
        RecordKey {
            route: "r".into(),
            scope: Vec::new(),
            key: name.into(),
        }
    }

    /// A file not yet in WAL mode, in a write transaction of another
    /// connection while the store opens it: the switch to WAL mode is
    /// refused at once ("database is locked", as one of several processes
    /// creating a file together saw it), and the store retries until the
    /// writer is done (within `timeout`). Without the retry this fails.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn opening_waits_out_a_writer_of_a_file_not_yet_in_wal_mode() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let mut writer = SqliteConnection::connect_with(
            &SqliteConnectOptions::from_str(&url)
                .unwrap()
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Delete),
        )
        .await
        .unwrap();
        sqlx::query("CREATE TABLE t (x INTEGER)")
            .execute(&mut writer)
            .await
            .unwrap();
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut writer)
            .await
            .unwrap();
        let released = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            sqlx::query("COMMIT").execute(&mut writer).await.unwrap();
            writer
        });
        let opened = SqliteStore::connect(&config(url)).await;
        assert!(opened.is_ok(), "{:?}", opened.err());
        drop(released.await.unwrap());
    }

    fn config(url: String) -> StoreConfig {
        StoreConfig {
            migrate: true,
            pool_size: 4,
            timeout: Duration::from_secs(10),
            sweep_interval: Duration::from_secs(60),
            sweep_batch: 100,
            ..StoreConfig::for_test(&url)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_share_commits_and_a_failing_one_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = Arc::new(SqliteStore::connect(&config(url.clone())).await.unwrap());
        // A record no rule can read (an unknown held reason): every write
        // to it fails.
        let mut conn = SqliteConnection::connect(&url).await.unwrap();
        sqlx::query(
            "INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token,
                 expires_at, created_at, updated_at, held_reason)
             VALUES ('r', x'', 'broken', zeroblob(32), 'held', 1, 9e15, 0, 0, 'bogus')",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        let before = store.writer.commits();
        let claims = (0..200).map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let k = key(&format!("k{i}"));
                let request = ClaimRequest {
                    key: &k,
                    fingerprint: &[1; 32],
                    attempt: i + 1,
                    lease: Duration::from_secs(30),
                    retention: Duration::from_secs(3600),
                    on_unknown_outcome: UnknownOutcome::Hold,
                    inquire_after: Duration::ZERO,
                };
                store.claim(&request).await
            })
        });
        let broken = {
            let store = store.clone();
            tokio::spawn(async move { store.release(&key("broken"), 1).await })
        };
        let claims: Vec<_> = futures_util::future::join_all(claims).await;
        let broken = broken.await.unwrap();
        assert!(matches!(broken, Err(StoreError::Corrupt(_))), "{broken:?}");
        for claim in claims {
            assert!(matches!(claim.unwrap(), Ok(Claim::Claimed { .. })));
        }
        let commits = store.writer.commits() - before;
        assert!(commits >= 1, "the writer counts its commits");
        assert!(
            commits < 201,
            "201 writes took {commits} commits: nothing was committed together"
        );
    }
}
