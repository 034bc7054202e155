//! The SQLite store's operations as data ([`Op`]) and their execution
//! inside the writer's transaction ([`execute`]): each reads the record and
//! writes what the rules of [`transitions`] decide, as the memory store
//! does. Also the reads a claim makes first, outside any transaction.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::StatusCode;
use sqlx::sqlite::SqliteConnection;

use crate::store::transitions::{self, ClaimStep, Phase, Write};
use crate::store::{
    AttemptId, Claim, HeldReason, RecordKey, StoreError, StoredResponse, Token, UnknownOutcome,
    decode_headers, encode_headers,
};

/// What every operation reads of a record.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct Head {
    pub(super) state: String,
    pub(super) token: i64,
    pub(super) attempt: Option<i64>,
    pub(super) lease_until: Option<i64>,
    pub(super) expires_at: i64,
    pub(super) held_reason: Option<String>,
}

/// What a claim reads of a record.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct Row {
    #[sqlx(flatten)]
    head: Head,
    fingerprint: Vec<u8>,
    status: Option<i64>,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
}

pub(super) const HEAD: &str = "state, token, attempt, lease_until, expires_at, held_reason";
pub(super) const KEY: &str = "route = ?1 AND scope = ?2 AND key = ?3";

/// Bind a [`RecordKey`] as `?1`–`?3`.
macro_rules! bind_key {
    ($query:expr, $key:expr) => {
        $query.bind(&$key.route).bind(&$key.scope).bind(&$key.key)
    };
}
pub(super) use bind_key;

pub(super) fn unavailable(e: sqlx::Error) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

pub(super) fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("record with {what}"))
}

/// Now, in microseconds since the epoch (the stored times).
pub(super) fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

pub(super) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl Head {
    /// The state as the rules of [`transitions`] see it at `now`.
    pub(super) fn phase(&self, now: i64) -> Result<Phase, StoreError> {
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

/// A claim, owned (it waits in the writer's queue).
#[derive(Debug)]
pub(super) struct ClaimOp {
    pub(super) key: RecordKey,
    pub(super) fingerprint: [u8; 32],
    pub(super) attempt: AttemptId,
    pub(super) lease: Duration,
    pub(super) retention: Duration,
    pub(super) on_unknown: UnknownOutcome,
}

/// What a claim for `fingerprint` does, given the record under the key (if
/// any) at `now`.
pub(super) fn claim_step(
    row: Option<&Row>,
    fingerprint: &[u8; 32],
    on_unknown: UnknownOutcome,
    now: i64,
) -> Result<ClaimStep, StoreError> {
    let live = match row {
        Some(row) if !row.head.expired(now)? => Some(row),
        _ => None,
    };
    let found = match live {
        Some(row) => Some((row.head.phase(now)?, row.fingerprint == fingerprint[..])),
        None => None,
    };
    Ok(transitions::claim(found, on_unknown))
}

/// The answer of a claim that writes nothing; `None` for the steps that write.
pub(super) fn read_only_answer(
    step: ClaimStep,
    row: Option<Row>,
) -> Result<Option<Claim>, StoreError> {
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

/// The record under `key`, as a claim reads it.
pub(super) async fn read_row(
    conn: &mut SqliteConnection,
    key: &RecordKey,
) -> Result<Option<Row>, StoreError> {
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

/// The next fencing token.
async fn next_token(conn: &mut SqliteConnection) -> Result<Token, StoreError> {
    sqlx::query_scalar("UPDATE idemgate_tokens SET last = last + 1 WHERE id = 1 RETURNING last")
        .fetch_one(conn)
        .await
        .map_err(unavailable)
}

type Query<'q> = sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>;

/// Run `head WHERE <the key>`, the key bound as `?1`–`?3`, then `bind`.
async fn at_key(
    conn: &mut SqliteConnection,
    head: &str,
    key: &RecordKey,
    bind: impl FnOnce(Query<'_>) -> Query<'_>,
) -> Result<(), StoreError> {
    let sql = format!("{head} WHERE {KEY}");
    bind(bind_key!(sqlx::query(sqlx::AssertSqlSafe(sql)), key))
        .execute(conn)
        .await
        .map_err(unavailable)?;
    Ok(())
}

/// Which records leave `in_flight` for good when an operation removes them.
#[derive(Debug, Clone, Copy)]
pub(super) enum Removal {
    /// `abandon`: [`transitions::abandon_applies`] to this attempt.
    Abandon(AttemptId),
    /// `keys release`: [`transitions::clearable`].
    Clear { force: bool },
    /// `keys delete`: [`transitions::deletable`].
    Delete { force: bool },
}

/// One write operation of the store.
#[derive(Debug)]
pub(super) enum Op {
    /// A claim that found no record it could answer from (reads first).
    Claim(ClaimOp),
    /// An attempt's write, by its token.
    Write {
        key: RecordKey,
        token: Token,
        write: AttemptWrite,
    },
    /// Remove a record if the rule allows.
    Remove { key: RecordKey, removal: Removal },
    /// Delete up to this many expired records (and old announcements).
    Sweep { batch: usize },
}

/// An attempt's write and what it carries.
#[derive(Debug)]
pub(super) enum AttemptWrite {
    Renew {
        lease: Duration,
    },
    Complete {
        response: StoredResponse,
        retention: Duration,
    },
    Release,
    Hold {
        reason: HeldReason,
        retention: Duration,
    },
}

impl Op {
    /// The response body bytes it writes (a batch is bounded by them).
    pub(super) fn body_bytes(&self) -> usize {
        match self {
            Op::Write {
                write: AttemptWrite::Complete { response, .. },
                ..
            } => response.body.len(),
            Op::Claim(_) | Op::Write { .. } | Op::Remove { .. } | Op::Sweep { .. } => 0,
        }
    }
}

/// An operation's answer.
#[derive(Debug)]
pub(super) enum Reply {
    /// A claim's outcome, and whether it took the record out of `in_flight`
    /// (a lapsed lease turned held).
    Claim(Claim, bool),
    /// A write or removal: whether it applied.
    Applied(bool),
    /// A sweep: how many records went.
    Swept(u64),
}

/// What the operations need to know of the store.
#[derive(Debug, Clone)]
pub(super) struct Context {
    /// The routes whose settled records are announced to other processes.
    pub(super) wait_routes: Vec<String>,
}

/// How long an announcement is kept for relays that have not read it.
const WAKE_KEPT: Duration = Duration::from_secs(60);

impl Context {
    /// `key`'s record left `in_flight`: on a waiting route, write the
    /// announcement for other processes (in the same transaction).
    async fn announce(
        &self,
        conn: &mut SqliteConnection,
        key: &RecordKey,
        now: i64,
    ) -> Result<(), StoreError> {
        if !self.wait_routes.contains(&key.route) {
            return Ok(());
        }
        sqlx::query("INSERT INTO idemgate_wakeups (wake_id, at) VALUES (?1, ?2)")
            .bind(&key.wake_id()[..])
            .bind(now)
            .execute(conn)
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}

/// Execute `op` on `conn` (inside the writer's transaction).
pub(super) async fn execute(
    conn: &mut SqliteConnection,
    op: &Op,
    context: &Context,
) -> Result<Reply, StoreError> {
    let now = now_us();
    match op {
        Op::Claim(claim) => claim_for_writing(conn, claim, context, now).await,
        Op::Write { key, token, write } => {
            let applied = attempt_write(conn, key, *token, write, now).await?;
            if applied && !matches!(write, AttemptWrite::Renew { .. }) {
                context.announce(conn, key, now).await?;
            }
            Ok(Reply::Applied(applied))
        }
        Op::Remove { key, removal } => {
            let Some(head) = read_head(conn, key).await? else {
                return Ok(Reply::Applied(false));
            };
            let phase = head.phase(now)?;
            let allowed = match *removal {
                Removal::Abandon(attempt) => {
                    transitions::abandon_applies(head.attempt == Some(attempt), phase)
                }
                Removal::Clear { force } => transitions::clearable(phase, force),
                Removal::Delete { force } => transitions::deletable(phase, force),
            };
            if allowed {
                at_key(conn, "DELETE FROM idemgate_records", key, |q| q).await?;
                context.announce(conn, key, now).await?;
            }
            Ok(Reply::Applied(allowed))
        }
        Op::Sweep { batch } => {
            // transitions::expired
            let done = sqlx::query(
                "DELETE FROM idemgate_records WHERE rowid IN (
                     SELECT rowid FROM idemgate_records
                      WHERE expires_at <= ?1
                        AND NOT (state = 'in_flight' AND lease_until > ?1)
                      LIMIT ?2)",
            )
            .bind(now)
            .bind(i64::try_from(*batch).unwrap_or(i64::MAX))
            .execute(&mut *conn)
            .await
            .map_err(unavailable)?;
            sqlx::query("DELETE FROM idemgate_wakeups WHERE at <= ?1")
                .bind(now.saturating_sub(micros(WAKE_KEPT)))
                .execute(&mut *conn)
                .await
                .map_err(unavailable)?;
            Ok(Reply::Swept(done.rows_affected()))
        }
    }
}

/// transitions::claim under the write lock, and its write.
async fn claim_for_writing(
    conn: &mut SqliteConnection,
    claim: &ClaimOp,
    context: &Context,
    now: i64,
) -> Result<Reply, StoreError> {
    let key = &claim.key;
    let row = read_row(conn, key).await?;
    let step = claim_step(row.as_ref(), &claim.fingerprint, claim.on_unknown, now)?;
    let lease_until = now.saturating_add(micros(claim.lease));
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
                     lease_until = excluded.lease_until, expires_at = excluded.expires_at,
                     created_at = excluded.created_at, updated_at = excluded.updated_at,
                     held_reason = NULL, status = NULL, headers = NULL, body = NULL",
            )
            .bind(&key.route)
            .bind(&key.scope)
            .bind(&key.key)
            .bind(&claim.fingerprint[..])
            .bind(token)
            .bind(claim.attempt)
            .bind(lease_until)
            .bind(now.saturating_add(micros(claim.retention)))
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(unavailable)?;
            let claimed = Claim::Claimed {
                token,
                takeover: false,
            };
            Reply::Claim(claimed, false)
        }
        ClaimStep::TakeOver => {
            let token = next_token(conn).await?;
            at_key(
                conn,
                "UPDATE idemgate_records SET token = ?4, attempt = ?5, lease_until = ?6,
                     expires_at = max(expires_at, ?6), updated_at = ?7",
                key,
                |q| {
                    q.bind(token)
                        .bind(claim.attempt)
                        .bind(lease_until)
                        .bind(now)
                },
            )
            .await?;
            let claimed = Claim::Claimed {
                token,
                takeover: true,
            };
            Reply::Claim(claimed, false)
        }
        ClaimStep::HoldLapsed => {
            at_key(
                conn,
                "UPDATE idemgate_records SET state = 'held', held_reason = 'lease_lapsed',
                     lease_until = NULL, updated_at = ?4",
                key,
                |q| q.bind(now),
            )
            .await?;
            context.announce(conn, key, now).await?;
            Reply::Claim(Claim::Held(HeldReason::LeaseLapsed), true)
        }
        // The record changed since the first read: answer as it is now.
        step => Reply::Claim(
            read_only_answer(step, row)?.ok_or_else(|| corrupt("no claim step"))?,
            false,
        ),
    })
}

/// An attempt's write, if [`transitions::write_applies`] to the record now.
async fn attempt_write(
    conn: &mut SqliteConnection,
    key: &RecordKey,
    token: Token,
    write: &AttemptWrite,
    now: i64,
) -> Result<bool, StoreError> {
    let Some(head) = read_head(conn, key).await? else {
        return Ok(false);
    };
    let rule = match write {
        AttemptWrite::Renew { .. } => Write::Renew,
        AttemptWrite::Complete { .. } => Write::Complete,
        AttemptWrite::Release => Write::Release,
        AttemptWrite::Hold { .. } => Write::Hold,
    };
    if !transitions::write_applies(rule, head.token == token, head.phase(now)?) {
        return Ok(false);
    }
    match write {
        AttemptWrite::Renew { lease } => {
            let until = now.saturating_add(micros(*lease));
            at_key(
                conn,
                "UPDATE idemgate_records SET lease_until = ?4,
                     expires_at = max(expires_at, ?4), updated_at = ?5",
                key,
                |q| q.bind(until).bind(now),
            )
            .await?;
        }
        AttemptWrite::Complete {
            response,
            retention,
        } => {
            at_key(
                conn,
                "UPDATE idemgate_records SET state = 'completed', status = ?4, headers = ?5,
                     body = ?6, lease_until = NULL, held_reason = NULL, expires_at = ?7,
                     updated_at = ?8",
                key,
                |q| {
                    q.bind(i64::from(response.status.as_u16()))
                        .bind(encode_headers(&response.headers))
                        .bind(&response.body[..])
                        .bind(now.saturating_add(micros(*retention)))
                        .bind(now)
                },
            )
            .await?;
        }
        AttemptWrite::Release => {
            at_key(conn, "DELETE FROM idemgate_records", key, |q| q).await?;
        }
        AttemptWrite::Hold { reason, retention } => {
            at_key(
                conn,
                "UPDATE idemgate_records SET state = 'held', held_reason = ?4,
                     lease_until = NULL, expires_at = ?5, updated_at = ?6",
                key,
                |q| {
                    q.bind(reason.as_str())
                        .bind(now.saturating_add(micros(*retention)))
                        .bind(now)
                },
            )
            .await?;
        }
    }
    Ok(true)
}
