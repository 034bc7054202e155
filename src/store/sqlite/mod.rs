//! The SQLite store (`sqlite://PATH`, docs/DESIGN.md §15): the embedded
//! durable default. One file, kept across restarts, shared by the gateway
//! processes of one host; several hosts need PostgreSQL or Redis.
//!
//! - **Durable**: WAL journal, `synchronous = FULL` (a commit is on disk
//!   before the claim or the record is acknowledged, as with PostgreSQL's
//!   default), the schema versioned by [`schema`].
//! - **One state machine**: like the memory store, it executes the rules of
//!   [`super::transitions`] itself: every transition reads the record and
//!   writes what the rules decide inside one `BEGIN IMMEDIATE` transaction,
//!   which holds the file's write lock from its first statement, so two
//!   writers (connections or processes) never interleave. Writes go through
//!   one connection per process (no in-process lock contention, whose
//!   busy-wait would add latency); other processes wait for the lock up to
//!   `[store] timeout`.
//! - **Reads first**: a claim reads on a reader connection (WAL readers run
//!   beside the writer) and answers a replay, a mismatch, a held key or a
//!   live lease from that consistent snapshot; only a claim that writes
//!   (a new key, a takeover, a lapsed lease turning held) takes the lock.
//! - **Wake-ups** (`concurrent = "wait"`): settled records are announced to
//!   this process's waiters directly, and, on waiting routes, written to
//!   `idemgate_wakeups` in the settling transaction, which every process's
//!   relay reads every [`WAKE_POLL`].
//! - **Clock**: the wall clock, in microseconds, shared by the processes of
//!   one host.

mod schema;

use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::StatusCode;
use sqlx::Connection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};

use super::transitions::{self, ClaimStep, Phase, Write};
use super::{
    AttemptId, Cas, Claim, ClaimRequest, HeldReason, RecordInfo, RecordKey, RecordState, Store,
    StoreAdmin, StoreConfig, StoreError, StoredResponse, Token, decode_headers, encode_headers,
};
use crate::waiters::{Waiters, WakeId, wake_id};

/// How often each process's relay reads the announcements of other
/// processes (only while some route waits).
pub const WAKE_POLL: Duration = Duration::from_millis(50);

/// How long an announcement is kept for relays that have not read it.
const WAKE_KEPT: Duration = Duration::from_secs(60);

/// A SQLite-backed [`Store`].
#[derive(Debug)]
pub struct SqliteStore {
    /// One connection: every write, in `BEGIN IMMEDIATE` transactions.
    writer: SqlitePool,
    /// Claims' first reads and key administration's reads.
    readers: SqlitePool,
    timeout: Duration,
    /// The routes whose settled records are announced to other processes.
    wait_routes: Vec<String>,
    /// This process's waiters, woken where records settle.
    waiters: OnceLock<Arc<Waiters>>,
}

/// What every transition reads of a record.
#[derive(Debug, sqlx::FromRow)]
struct Head {
    state: String,
    token: i64,
    attempt: Option<i64>,
    lease_until: Option<i64>,
    expires_at: i64,
    held_reason: Option<String>,
}

/// What a claim reads of a record.
#[derive(Debug, sqlx::FromRow)]
struct Row {
    #[sqlx(flatten)]
    head: Head,
    fingerprint: Vec<u8>,
    status: Option<i64>,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
}

/// What key administration reads of a record.
#[derive(Debug, sqlx::FromRow)]
struct InfoRow {
    #[sqlx(flatten)]
    head: Head,
    route: String,
    scope: Vec<u8>,
    key: String,
    created_at: i64,
    updated_at: i64,
    status: Option<i64>,
    body_bytes: Option<i64>,
}

const HEAD: &str = "state, token, attempt, lease_until, expires_at, held_reason";
const KEY: &str = "route = ?1 AND scope = ?2 AND key = ?3";

/// Bind a [`RecordKey`] as `?1`–`?3`.
macro_rules! bind_key {
    ($query:expr, $key:expr) => {
        $query.bind(&$key.route).bind(&$key.scope).bind(&$key.key)
    };
}

fn unavailable(e: sqlx::Error) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("record with {what}"))
}

/// Now, in microseconds since the epoch.
fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn wall(us: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

impl Head {
    /// The state as the rules of [`transitions`] see it at `now`.
    fn phase(&self, now: i64) -> Result<Phase, StoreError> {
        Ok(match self.state.as_str() {
            "in_flight" => {
                let left = self.lease_until.unwrap_or(0).saturating_sub(now);
                Phase::in_flight(Duration::from_micros(u64::try_from(left).unwrap_or(0)))
            }
            "completed" => Phase::Completed,
            "held" => Phase::Held(
                self.held_reason
                    .as_deref()
                    .and_then(HeldReason::parse)
                    .ok_or_else(|| corrupt("an unknown held reason"))?,
            ),
            other => return Err(corrupt(&format!("state {other:?}"))),
        })
    }

    /// Gone for every purpose ([`transitions::expired`]).
    fn expired(&self, now: i64) -> Result<bool, StoreError> {
        Ok(transitions::expired(
            self.expires_at <= now,
            self.phase(now)?,
        ))
    }
}

impl Row {
    fn response(self) -> Result<StoredResponse, StoreError> {
        let status = self
            .status
            .and_then(|s| u16::try_from(s).ok())
            .and_then(|s| StatusCode::from_u16(s).ok())
            .ok_or_else(|| corrupt("a bad status"))?;
        let headers = decode_headers(self.headers.as_deref().unwrap_or_default())
            .ok_or_else(|| corrupt("undecodable headers"))?;
        Ok(StoredResponse {
            status,
            headers,
            body: Bytes::from(self.body.unwrap_or_default()),
        })
    }
}

/// What a claim does, given the record under the key (if any) at `now`.
fn claim_step(
    row: Option<&Row>,
    request: &ClaimRequest<'_>,
    now: i64,
) -> Result<ClaimStep, StoreError> {
    let live = match row {
        Some(row) if !row.head.expired(now)? => Some(row),
        _ => None,
    };
    let found = match live {
        Some(row) => Some((
            row.head.phase(now)?,
            row.fingerprint == request.fingerprint[..],
        )),
        None => None,
    };
    Ok(transitions::claim(found, request.on_unknown_outcome))
}

/// The answer of a claim that writes nothing; `None` for the steps that write.
fn read_only_answer(step: ClaimStep, row: Option<Row>) -> Result<Option<Claim>, StoreError> {
    Ok(Some(match step {
        ClaimStep::Mismatch => Claim::Mismatch,
        ClaimStep::Replay => Claim::Replay(
            row.ok_or_else(|| corrupt("a replay decided on no record"))?
                .response()?,
        ),
        ClaimStep::Held(reason) => Claim::Held(reason),
        ClaimStep::InFlight(retry_after) => Claim::InFlight { retry_after },
        ClaimStep::Insert | ClaimStep::TakeOver | ClaimStep::HoldLapsed => return Ok(None),
    }))
}

async fn read_row(conn: &mut SqliteConnection, key: &RecordKey) -> Result<Option<Row>, StoreError> {
    let sql = format!(
        "SELECT {HEAD}, fingerprint, status, headers, body FROM idemgate_records WHERE {KEY}"
    );
    bind_key!(sqlx::query_as(sqlx::AssertSqlSafe(sql)), key)
        .fetch_optional(conn)
        .await
        .map_err(unavailable)
}

async fn read_head(
    conn: &mut SqliteConnection,
    key: &RecordKey,
) -> Result<Option<Head>, StoreError> {
    let sql = format!("SELECT {HEAD} FROM idemgate_records WHERE {KEY}");
    bind_key!(sqlx::query_as(sqlx::AssertSqlSafe(sql)), key)
        .fetch_optional(conn)
        .await
        .map_err(unavailable)
}

/// The next fencing token (inside the caller's transaction).
async fn next_token(conn: &mut SqliteConnection) -> Result<Token, StoreError> {
    sqlx::query_scalar("UPDATE idemgate_tokens SET last = last + 1 WHERE id = 1 RETURNING last")
        .fetch_one(conn)
        .await
        .map_err(unavailable)
}

/// Run one statement written against `?1`–`?3` = the key (inside the
/// caller's transaction).
async fn at_key(
    conn: &mut SqliteConnection,
    head: &str,
    key: &RecordKey,
    bind: impl FnOnce(
        sqlx::query::Query<'_, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    ) -> sqlx::query::Query<'_, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
) -> Result<(), StoreError> {
    let sql = format!("{head} WHERE {KEY}");
    bind(bind_key!(sqlx::query(sqlx::AssertSqlSafe(sql)), key))
        .execute(conn)
        .await
        .map_err(unavailable)?;
    Ok(())
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
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            // Another process holding the write lock: wait, up to the
            // store's own deadline.
            .busy_timeout(config.timeout);
        let shown = options.get_filename().display().to_string();
        let pool = |max: u32| {
            SqlitePoolOptions::new()
                .max_connections(max)
                .min_connections(0)
                .acquire_timeout(config.timeout)
                // A SQLite connection is a file handle: nothing to probe.
                .test_before_acquire(false)
                .connect_lazy_with(options.clone())
        };
        let writer = pool(1);
        // The first connection creates the file and sets WAL mode, so the
        // readers open a file that is already in it.
        let mut first = writer.acquire().await.map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot open the SQLite store at {shown}: {e}; check the path and its directory's permissions"
            ))
        })?;
        if config.migrate {
            let applied = schema::migrate(&mut first)
                .await
                .map_err(|e| StoreError::Migration(format!("{shown}: {e}")))?;
            if applied > 0 {
                tracing::info!(file = %shown, applied, "SQLite store schema created or upgraded");
            }
        }
        drop(first);
        Ok(Self {
            writer,
            readers: pool(config.pool_size.max(1)),
            timeout: config.timeout,
            wait_routes: config.wait_routes.clone(),
            waiters: OnceLock::new(),
        })
    }

    /// Apply the schema scripts the file lacks (safe from many processes).
    pub async fn migrate(&self) -> Result<usize, StoreError> {
        let mut conn = self
            .writer
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

    /// `op` inside a `BEGIN IMMEDIATE` transaction on the writer, committed
    /// if it succeeds, bounded by `[store] timeout` (waiting for the
    /// connection and for the file's write lock included).
    async fn immediate<T>(
        &self,
        op: impl AsyncFnOnce(&mut SqliteConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.bounded(async {
            let mut conn = self.writer.acquire().await.map_err(unavailable)?;
            let mut tx = conn
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(unavailable)?;
            let done = op(&mut tx).await?;
            tx.commit().await.map_err(unavailable)?;
            Ok(done)
        })
        .await
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

    /// `key`'s record left `in_flight`: on a waiting route, write the
    /// announcement for other processes (inside the settling transaction).
    async fn announce_to_others(
        &self,
        conn: &mut SqliteConnection,
        key: &RecordKey,
        now: i64,
    ) -> Result<(), StoreError> {
        if !self.wait_routes.contains(&key.route) {
            return Ok(());
        }
        sqlx::query("INSERT INTO idemgate_wakeups (wake_id, at) VALUES (?1, ?2)")
            .bind(&wake_id(key)[..])
            .bind(now)
            .execute(conn)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// `key`'s record left `in_flight` (committed): wake this process's waiters.
    fn announce_here(&self, key: &RecordKey) {
        if let Some(waiters) = self.waiters.get() {
            waiters.wake(&wake_id(key));
        }
    }

    /// An attempt's write: `apply` it (a statement against the key) if
    /// [`transitions::write_applies`] to the record as it is now.
    async fn write(
        &self,
        key: &RecordKey,
        token: Token,
        write: Write,
        apply: &str,
        bind: impl FnOnce(
            sqlx::query::Query<'_, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
            i64,
        )
            -> sqlx::query::Query<'_, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    ) -> Result<Cas, StoreError> {
        let cas = self
            .immediate(async |conn| {
                let now = now_us();
                let Some(head) = read_head(conn, key).await? else {
                    return Ok(Cas::Fenced);
                };
                if !transitions::write_applies(write, head.token == token, head.phase(now)?) {
                    return Ok(Cas::Fenced);
                }
                at_key(conn, apply, key, |q| bind(q, now)).await?;
                if write != Write::Renew {
                    self.announce_to_others(conn, key, now).await?;
                }
                Ok(Cas::Applied)
            })
            .await?;
        if cas == Cas::Applied && write != Write::Renew {
            self.announce_here(key);
        }
        Ok(cas)
    }

    /// Remove the record if `allowed` by its head at the time.
    async fn remove_if(
        &self,
        key: &RecordKey,
        allowed: impl FnOnce(&Head, Phase) -> bool,
    ) -> Result<bool, StoreError> {
        let removed = self
            .immediate(async |conn| {
                let now = now_us();
                let Some(head) = read_head(conn, key).await? else {
                    return Ok(false);
                };
                let phase = head.phase(now)?;
                if !allowed(&head, phase) {
                    return Ok(false);
                }
                at_key(conn, "DELETE FROM idemgate_records", key, |q| q).await?;
                self.announce_to_others(conn, key, now).await?;
                Ok(true)
            })
            .await?;
        if removed {
            self.announce_here(key);
        }
        Ok(removed)
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

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        // Reads first: a replay, a mismatch, a held key or a live lease is
        // answered from a snapshot, without the write lock.
        let row = self
            .read(async |conn| read_row(conn, req.key).await)
            .await?;
        let step = claim_step(row.as_ref(), req, now_us())?;
        if let Some(answer) = read_only_answer(step, row)? {
            return Ok(answer);
        }
        // transitions::claim, again under the write lock, and its write.
        let (claim, settled) = self
            .immediate(async |conn| {
                let now = now_us();
                let row = read_row(conn, req.key).await?;
                let step = claim_step(row.as_ref(), req, now)?;
                let lease_until = now.saturating_add(micros(req.lease));
                Ok(match step {
                    ClaimStep::Insert => {
                        let token = next_token(conn).await?;
                        sqlx::query(
                            "INSERT INTO idemgate_records (route, scope, key, fingerprint, state,
                                 token, attempt, lease_until, expires_at, created_at, updated_at)
                             VALUES (?1, ?2, ?3, ?4, 'in_flight', ?5, ?6, ?7, ?8, ?9, ?9)
                             ON CONFLICT (route, scope, key) DO UPDATE SET
                                 fingerprint = excluded.fingerprint, state = 'in_flight',
                                 token = excluded.token, attempt = excluded.attempt,
                                 lease_until = excluded.lease_until,
                                 expires_at = excluded.expires_at,
                                 created_at = excluded.created_at,
                                 updated_at = excluded.updated_at,
                                 held_reason = NULL, status = NULL, headers = NULL, body = NULL",
                        )
                        .bind(&req.key.route)
                        .bind(&req.key.scope)
                        .bind(&req.key.key)
                        .bind(&req.fingerprint[..])
                        .bind(token)
                        .bind(req.attempt)
                        .bind(lease_until)
                        .bind(now.saturating_add(micros(req.retention)))
                        .bind(now)
                        .execute(&mut *conn)
                        .await
                        .map_err(unavailable)?;
                        let claim = Claim::Claimed {
                            token,
                            takeover: false,
                        };
                        (claim, false)
                    }
                    ClaimStep::TakeOver => {
                        let token = next_token(conn).await?;
                        at_key(
                            conn,
                            "UPDATE idemgate_records SET token = ?4, attempt = ?5,
                                 lease_until = ?6, expires_at = max(expires_at, ?6),
                                 updated_at = ?7",
                            req.key,
                            |q| q.bind(token).bind(req.attempt).bind(lease_until).bind(now),
                        )
                        .await?;
                        let claim = Claim::Claimed {
                            token,
                            takeover: true,
                        };
                        (claim, false)
                    }
                    ClaimStep::HoldLapsed => {
                        at_key(
                            conn,
                            "UPDATE idemgate_records SET state = 'held',
                                 held_reason = 'lease_lapsed', lease_until = NULL,
                                 updated_at = ?4",
                            req.key,
                            |q| q.bind(now),
                        )
                        .await?;
                        self.announce_to_others(conn, req.key, now).await?;
                        (Claim::Held(HeldReason::LeaseLapsed), true)
                    }
                    // The record changed since the first read: answer as it is now.
                    step => (
                        read_only_answer(step, row)?.ok_or_else(|| corrupt("no claim step"))?,
                        false,
                    ),
                })
            })
            .await?;
        if settled {
            self.announce_here(req.key);
        }
        Ok(claim)
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: Token,
        lease: Duration,
    ) -> Result<Cas, StoreError> {
        let lease = micros(lease);
        self.write(
            key,
            token,
            Write::Renew,
            "UPDATE idemgate_records SET lease_until = ?4,
                 expires_at = max(expires_at, ?4), updated_at = ?5",
            |q, now| q.bind(now.saturating_add(lease)).bind(now),
        )
        .await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: Token,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let retention = micros(retention);
        let headers = encode_headers(&response.headers);
        self.write(
            key,
            token,
            Write::Complete,
            "UPDATE idemgate_records SET state = 'completed', status = ?4, headers = ?5,
                 body = ?6, lease_until = NULL, held_reason = NULL, expires_at = ?7,
                 updated_at = ?8",
            |q, now| {
                q.bind(i64::from(response.status.as_u16()))
                    .bind(headers)
                    .bind(&response.body[..])
                    .bind(now.saturating_add(retention))
                    .bind(now)
            },
        )
        .await
    }

    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError> {
        self.write(
            key,
            token,
            Write::Release,
            "DELETE FROM idemgate_records",
            |q, _| q,
        )
        .await
    }

    async fn hold(
        &self,
        key: &RecordKey,
        token: Token,
        reason: HeldReason,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let retention = micros(retention);
        self.write(
            key,
            token,
            Write::Hold,
            "UPDATE idemgate_records SET state = 'held', held_reason = ?4, lease_until = NULL,
                 expires_at = ?5, updated_at = ?6",
            |q, now| {
                q.bind(reason.as_str())
                    .bind(now.saturating_add(retention))
                    .bind(now)
            },
        )
        .await
    }

    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError> {
        let abandoned = self
            .remove_if(key, |head, phase| {
                transitions::abandon_applies(head.attempt == Some(attempt), phase)
            })
            .await?;
        Ok(if abandoned { Cas::Applied } else { Cas::Fenced })
    }
}

#[async_trait::async_trait]
impl StoreAdmin for SqliteStore {
    async fn relay_wakeups(&self, waiters: Arc<Waiters>) {
        let _ = self.waiters.set(waiters.clone());
        if self.wait_routes.is_empty() {
            // Nobody waits: nothing to read.
            return;
        }
        let mut last = None;
        let mut poll = tokio::time::interval(WAKE_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            poll.tick().await;
            let Some(after) = last else {
                // Start after the newest announcement; anything before is
                // unknown to this relay, so wake everyone once.
                let newest = self
                    .read(async |conn| {
                        sqlx::query_scalar("SELECT COALESCE(max(seq), 0) FROM idemgate_wakeups")
                            .fetch_one(conn)
                            .await
                            .map_err(unavailable)
                    })
                    .await;
                if let Ok(newest) = newest {
                    last = Some(newest);
                    waiters.wake_all();
                }
                continue;
            };
            match self.read_wakeups(after, &waiters).await {
                Ok(newest) => last = Some(newest),
                Err(error) => {
                    tracing::warn!(%error, "cannot read the SQLite store's wake-ups; retrying");
                }
            }
        }
    }

    async fn sweep(&self, batch: usize) -> Result<u64, StoreError> {
        // transitions::expired; bounded, so the write lock is held briefly.
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        self.immediate(async |conn| {
            let now = now_us();
            let done = sqlx::query(
                "DELETE FROM idemgate_records WHERE rowid IN (
                     SELECT rowid FROM idemgate_records
                      WHERE expires_at <= ?1
                        AND NOT (state = 'in_flight' AND lease_until > ?1)
                      LIMIT ?2)",
            )
            .bind(now)
            .bind(batch)
            .execute(&mut *conn)
            .await
            .map_err(unavailable)?;
            sqlx::query("DELETE FROM idemgate_wakeups WHERE at <= ?1")
                .bind(now.saturating_sub(micros(WAKE_KEPT)))
                .execute(&mut *conn)
                .await
                .map_err(unavailable)?;
            Ok(done.rows_affected())
        })
        .await
    }

    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        let sql = format!("SELECT {INFO_COLUMNS} WHERE {KEY}");
        let row: Option<InfoRow> = self
            .read(async |conn| {
                bind_key!(sqlx::query_as(sqlx::AssertSqlSafe(sql)), key)
                    .fetch_optional(conn)
                    .await
                    .map_err(unavailable)
            })
            .await?;
        row.map(InfoRow::into_info).transpose()
    }

    async fn list(
        &self,
        route: &str,
        state: RecordState,
        limit: usize,
    ) -> Result<Vec<RecordInfo>, StoreError> {
        let sql = format!(
            "SELECT {INFO_COLUMNS} WHERE route = ?1 AND state = ?2 ORDER BY updated_at LIMIT ?3"
        );
        let rows: Vec<InfoRow> = self
            .read(async |conn| {
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(route)
                    .bind(state.as_str())
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(conn)
                    .await
                    .map_err(unavailable)
            })
            .await?;
        rows.into_iter().map(InfoRow::into_info).collect()
    }

    async fn clear(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        self.remove_if(key, |_, phase| transitions::clearable(phase, force))
            .await
    }

    async fn delete(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        self.remove_if(key, |_, phase| transitions::deletable(phase, force))
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let version = self
            .read(async |conn| schema::version(conn).await.map_err(unavailable))
            .await?;
        if version >= schema::VERSION {
            Ok(())
        } else {
            Err(StoreError::NotMigrated(format!(
                "schema version {version}, this build needs {}",
                schema::VERSION
            )))
        }
    }

    fn pool_stats(&self) -> Option<super::PoolStats> {
        let max = self.readers.options().get_max_connections() + 1;
        let connections = self.readers.size() + self.writer.size();
        let idle = self.readers.num_idle() + self.writer.num_idle();
        Some(super::PoolStats {
            connections: u64::from(connections),
            idle: idle as u64,
            max: u64::from(max),
        })
    }
}

const INFO_COLUMNS: &str = "route, scope, key, state, token, attempt, lease_until, expires_at,
    held_reason, created_at, updated_at, status, length(body) AS body_bytes
    FROM idemgate_records";

impl InfoRow {
    fn into_info(self) -> Result<RecordInfo, StoreError> {
        let key = RecordKey {
            route: self.route,
            scope: self.scope,
            key: self.key,
        };
        RecordInfo::from_parts(
            &key,
            &self.head.state,
            self.head.held_reason.as_deref(),
            self.head.token,
            [self.created_at, self.updated_at, self.head.expires_at].map(wall),
            self.head.lease_until.map(wall),
            self.status.and_then(|s| u16::try_from(s).ok()),
            self.body_bytes.and_then(|b| u64::try_from(b).ok()),
        )
        .ok_or_else(|| corrupt(&format!("state {:?}", self.head.state)))
    }
}
