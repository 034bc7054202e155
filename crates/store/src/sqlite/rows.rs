//! The SQLite store's rows: what operations read of a record, the time
//! and key helpers every statement uses, and the announcements of settled
//! records ([`Context`]), shared by the operations ([`super::ops`]), the
//! inquiry's ([`super::inquiries`]) and the administration.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::StatusCode;
use sqlx::sqlite::SqliteConnection;

use crate::transitions::{self, Phase};
use crate::{HeldReason, RecordKey, StoreError, StoredResponse, Token, decode_headers};

/// What every operation reads of a record.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct Head {
    pub(super) state: String,
    pub(super) token: i64,
    pub(super) attempt: Option<i64>,
    pub(super) lease_until: Option<i64>,
    pub(super) expires_at: i64,
    pub(super) held_reason: Option<String>,
    pub(super) inquiries: i64,
    pub(super) inquiring_since: Option<i64>,
}

/// What a claim reads of a record.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct Row {
    #[sqlx(flatten)]
    pub(super) head: Head,
    pub(super) fingerprint: Vec<u8>,
    status: Option<i64>,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
}

pub(super) const HEAD: &str =
    "state, token, attempt, lease_until, expires_at, held_reason, inquiries, inquiring_since";
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
            "inquiring" => {
                let left = self.lease_until.unwrap_or(0).saturating_sub(now);
                Phase::inquiring(Duration::from_micros(u64::try_from(left).unwrap_or(0)))
            }
            other => return Err(corrupt(&format!("state {other:?}"))),
        })
    }

    /// Questions asked about its outcome (zero unless inquiring).
    pub(super) fn asked(&self) -> u32 {
        u32::try_from(self.inquiries).unwrap_or(0)
    }

    /// Gone for every purpose ([`transitions::expired`]).
    pub(super) fn expired(&self, now: i64) -> Result<bool, StoreError> {
        Ok(transitions::expired(
            self.expires_at <= now,
            self.phase(now)?,
        ))
    }
}

impl Row {
    pub(super) fn response(self) -> Result<StoredResponse, StoreError> {
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

pub(super) async fn read_head(
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
pub(super) async fn next_token(conn: &mut SqliteConnection) -> Result<Token, StoreError> {
    sqlx::query_scalar("UPDATE idemgate_tokens SET last = last + 1 WHERE id = 1 RETURNING last")
        .fetch_one(conn)
        .await
        .map_err(unavailable)
}

pub(super) type Query<'q> = sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>;

/// Run `head WHERE <the key>`, the key bound as `?1`–`?3`, then `bind`.
pub(super) async fn at_key(
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

/// What the operations need to know of the store.
#[derive(Debug, Clone)]
pub(super) struct Context {
    /// The routes whose settled records are announced to other processes.
    pub(super) wait_routes: crate::WaitRoutes,
}

/// How long an announcement is kept for relays that have not read it.
pub(super) const WAKE_KEPT: Duration = Duration::from_secs(60);

impl Context {
    /// `key`'s record left `in_flight`: on a waiting route, write the
    /// announcement for other processes (in the same transaction).
    pub(super) async fn announce(
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
