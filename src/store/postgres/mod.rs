//! The PostgreSQL store (docs/DESIGN.md §6), the default and the source of truth.
//!
//! The claim is one call of the `idemgate_claim` function (migrations/), one
//! round trip; every later transition is one `UPDATE`/`DELETE` that is a
//! compare-and-set on the fencing token. Connections come from a bounded
//! pool ([`pool`]); claims and completions go in batches ([`batch`]); every
//! operation is bounded by `[store] timeout`.

use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgSslMode};

mod batch;
mod outbox;
mod pool;

pub(in crate::store) use outbox::{Dirty, Relayed, Settling, SyncError, Truth};

use super::info::from_epoch_millis;
use super::{
    AttemptId, Cas, Claim, ClaimRequest, HeldReason, RecordInfo, RecordKey, RecordState, Store,
    StoreAdmin, StoreError, StoredResponse, Token, decode_headers, encode_headers, redact_url,
};
use super::{StoreConfig, UnknownOutcome};
use crate::waiters::{self, Waiters, parse_wake_id, wake_id};
use batch::Batcher;
use pool::PgPool;
use std::sync::Arc;

/// The migrations under `migrations/`, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// A PostgreSQL-backed [`Store`].
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    timeout: Duration,
    /// For the wake-up listener's own connection.
    options: PgConnectOptions,
    /// The routes whose settled records are announced.
    wait_routes: Vec<String>,
    /// Claims and completions go through it.
    batcher: Batcher,
}

#[derive(sqlx::FromRow)]
struct ClaimRow {
    o_outcome: String,
    o_token: Option<i64>,
    o_lease_ms: Option<i64>,
    o_held_reason: Option<String>,
    o_status: Option<i16>,
    o_headers: Option<Vec<u8>>,
    o_body: Option<Vec<u8>>,
}

#[derive(sqlx::FromRow)]
struct InfoRow {
    route: String,
    scope: Vec<u8>,
    key: String,
    state: String,
    held_reason: Option<String>,
    token: i64,
    created_ms: i64,
    updated_ms: i64,
    expires_ms: i64,
    lease_ms: Option<i64>,
    status: Option<i16>,
    body_bytes: Option<i64>,
}

const INFO_COLUMNS: &str = "route, scope, key, state, held_reason, token,
    (EXTRACT(EPOCH FROM created_at) * 1000)::int8 AS created_ms,
    (EXTRACT(EPOCH FROM updated_at) * 1000)::int8 AS updated_ms,
    (EXTRACT(EPOCH FROM expires_at) * 1000)::int8 AS expires_ms,
    (EXTRACT(EPOCH FROM lease_until) * 1000)::int8 AS lease_ms,
    status, octet_length(body)::int8 AS body_bytes
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
            &self.state,
            self.held_reason.as_deref(),
            self.token,
            [self.created_ms, self.updated_ms, self.expires_ms].map(from_epoch_millis),
            self.lease_ms.map(from_epoch_millis),
            self.status.and_then(|s| u16::try_from(s).ok()),
            self.body_bytes.and_then(|b| u64::try_from(b).ok()),
        )
        .ok_or_else(|| StoreError::Corrupt(format!("record in unknown state {:?}", self.state)))
    }
}

/// The channel of the announcements of settled records (`concurrent = "wait"`).
const WAKE_CHANNEL: &str = "idemgate_keys";

/// A duration in whole milliseconds, as the statements (and the front's
/// absolute expiry times) take it.
pub(in crate::store) fn millis(d: Duration) -> i64 {
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

/// Choose the plain or the announcing form of a [`settling!`] statement,
/// and bind the announcement's parameters (after all the others).
fn settle_query<'q>(
    forms: (&'static str, &'static str),
    wake_id: Option<&'q str>,
    bind: impl FnOnce(
        sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    match wake_id {
        None => bind(sqlx::query(forms.0)),
        Some(id) => bind(sqlx::query(forms.1)).bind(WAKE_CHANNEL).bind(id),
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
    std::env::var_os("PGSSLMODE").is_some()
        || url::Url::parse(url).is_ok_and(|url| {
            url.query_pairs()
                .any(|(name, _)| name == "sslmode" || name == "ssl-mode")
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
    pub(in crate::store) async fn connect_as(
        config: &StoreConfig,
        outbox: bool,
    ) -> Result<Self, StoreError> {
        let shown = redact_url(&config.url);
        let options = PgConnectOptions::from_str(&config.url)
            .map_err(|e| StoreError::Unavailable(format!("invalid store URL {shown}: {e}")))?
            .application_name("idemgate");
        let options = if outbox {
            options.options([("idemgate.front", "on")])
        } else {
            options
        };
        let options = if tls_asked_for(&config.url) {
            options
        } else {
            options.ssl_mode(PgSslMode::Disable)
        };
        let pool = PgPool::new(options.clone(), config.pool_size as usize, config.timeout);
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
            config.batches_in_flight as usize,
        );
        Ok(Self {
            pool,
            timeout: config.timeout,
            options,
            wait_routes: config.wait_routes.clone(),
            batcher,
        })
    }

    /// The wake id to announce with a settling write of `key`: on a route
    /// with waiters only, since a notifying commit is serialised with every
    /// other one.
    fn wake_id_for(&self, key: &RecordKey) -> Option<String> {
        self.wait_routes
            .contains(&key.route)
            .then(|| hex::encode(wake_id(key)))
    }

    /// Listen on `idemgate_keys` and wake the waiters each notification
    /// names, until the connection is lost (`Ok`) or cannot be made.
    async fn listen(&self, waiters: &Waiters) -> Result<(), sqlx::Error> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(self.timeout)
            .connect_lazy_with(self.options.clone());
        let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
        listener.listen(WAKE_CHANNEL).await?;
        // Anything announced before this connection listened is lost.
        waiters.wake_all();
        while let Some(notification) = listener.try_recv().await? {
            if let Some(id) = parse_wake_id(notification.payload()) {
                waiters.wake(&id);
            }
        }
        Ok(())
    }

    /// Apply the embedded migrations (safe to run from many instances at once).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut checkout = self
            .pool
            .get()
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))?;
        MIGRATOR
            .run(checkout.conn())
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))?;
        checkout.clean();
        Ok(())
    }

    /// Run `op` on a pooled connection, bounded by `[store] timeout`
    /// ([`PgPool::run`]).
    async fn bounded<T>(
        &self,
        op: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    ) -> Result<T, StoreError> {
        Ok(self.pool.run(self.timeout, op).await?)
    }
}

fn claim_from_row(row: ClaimRow) -> Result<Claim, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("claim returned {what}"));
    Ok(match row.o_outcome.as_str() {
        "claimed" | "takeover" => Claim::Claimed {
            token: row.o_token.ok_or_else(|| corrupt("no token"))?,
            takeover: row.o_outcome == "takeover",
        },
        "replay" => {
            let status = row
                .o_status
                .and_then(|s| u16::try_from(s).ok())
                .and_then(|s| StatusCode::from_u16(s).ok())
                .ok_or_else(|| corrupt("a bad status"))?;
            let headers = decode_headers(row.o_headers.as_deref().unwrap_or_default())
                .ok_or_else(|| corrupt("undecodable headers"))?;
            Claim::Replay(StoredResponse {
                status,
                headers,
                body: Bytes::from(row.o_body.unwrap_or_default()),
            })
        }
        "in_flight" => Claim::InFlight {
            retry_after: Duration::from_millis(row.o_lease_ms.unwrap_or(0).max(0) as u64),
        },
        "mismatch" => Claim::Mismatch,
        "held" => Claim::Held(
            row.o_held_reason
                .as_deref()
                .and_then(HeldReason::parse)
                .ok_or_else(|| corrupt("an unknown held reason"))?,
        ),
        other => return Err(corrupt(&format!("outcome {other:?}"))),
    })
}

#[async_trait::async_trait]
impl Store for PgStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        // idemgate_claim (migrations/0002_attempts.sql) implements
        // transitions::claim; idemgate_batch (0003) calls it per claim.
        let op = batch::Op::Claim {
            key: req.key.clone(),
            fingerprint: *req.fingerprint,
            attempt: req.attempt,
            lease_ms: millis(req.lease),
            retention_ms: millis(req.retention),
            release_lapsed: req.on_unknown_outcome == UnknownOutcome::Release,
        };
        match self.batcher.submit(op).await? {
            batch::Reply::Claim(claim) => Ok(claim),
            batch::Reply::Complete(_) => Err(StoreError::Corrupt(
                "a claim was answered as a completion".into(),
            )),
        }
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: Token,
        lease: Duration,
    ) -> Result<Cas, StoreError> {
        let done = self
            // transitions::write_applies(Renew): the token, in flight.
            .bounded(async |conn| bind_key!(sqlx::query(at_key!(
                    "UPDATE idemgate_records
                        SET lease_until = clock_timestamp() + $5 * INTERVAL '1 millisecond',
                            expires_at = GREATEST(expires_at, clock_timestamp() + $5 * INTERVAL '1 millisecond'),
                            updated_at = clock_timestamp()",
                    "AND token = $4 AND state = 'in_flight'",
                )), key)
                .bind(token)
                .bind(millis(lease))
                .execute(conn).await)
            .await?;
        Ok(cas(done.rows_affected()))
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: Token,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        // transitions::write_applies(Complete), in idemgate_batch (0003).
        let op = batch::Op::Complete {
            key: key.clone(),
            token,
            status: response.status.as_u16() as i16,
            headers: encode_headers(&response.headers),
            body: response.body.clone(),
            retention_ms: millis(retention),
            wake: self.wake_id_for(key),
        };
        match self.batcher.submit(op).await? {
            batch::Reply::Complete(cas) => Ok(cas),
            batch::Reply::Claim(_) => Err(StoreError::Corrupt(
                "a completion was answered as a claim".into(),
            )),
        }
    }

    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError> {
        // transitions::write_applies(Release): the token, in flight.
        let forms = settling!(
            at_key!(
                "DELETE FROM idemgate_records",
                "AND token = $4 AND state = 'in_flight'"
            ),
            "5",
            "6"
        );
        let wake = self.wake_id_for(key);
        let done = self
            .bounded(async |conn| {
                settle_query(forms, wake.as_deref(), |q| bind_key!(q, key).bind(token))
                    .execute(conn)
                    .await
            })
            .await?;
        Ok(cas(done.rows_affected()))
    }

    async fn hold(
        &self,
        key: &RecordKey,
        token: Token,
        reason: HeldReason,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        // transitions::write_applies(Hold): the token; in flight or held.
        let forms = settling!(
            at_key!(
                "UPDATE idemgate_records
                SET state = 'held', held_reason = $5, lease_until = NULL,
                    expires_at = clock_timestamp() + $6 * INTERVAL '1 millisecond',
                    updated_at = clock_timestamp()",
                "AND token = $4 AND state IN ('in_flight', 'held')"
            ),
            "7",
            "8"
        );
        let wake = self.wake_id_for(key);
        let done = self
            .bounded(async |conn| {
                settle_query(forms, wake.as_deref(), |q| {
                    bind_key!(q, key)
                        .bind(token)
                        .bind(reason.as_str())
                        .bind(millis(retention))
                })
                .execute(conn)
                .await
            })
            .await?;
        Ok(cas(done.rows_affected()))
    }

    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError> {
        // transitions::abandon_applies: the attempt's own record, in flight
        // or held only because its lease lapsed.
        let forms = settling!(
            at_key!(
                "DELETE FROM idemgate_records",
                "AND attempt = $4
                AND (state = 'in_flight'
                     OR (state = 'held' AND held_reason = 'lease_lapsed'))"
            ),
            "5",
            "6"
        );
        let wake = self.wake_id_for(key);
        let done = self
            .bounded(async |conn| {
                settle_query(forms, wake.as_deref(), |q| bind_key!(q, key).bind(attempt))
                    .execute(conn)
                    .await
            })
            .await?;
        Ok(cas(done.rows_affected()))
    }
}

#[async_trait::async_trait]
impl StoreAdmin for PgStore {
    async fn relay_wakeups(&self, waiters: Arc<Waiters>) {
        waiters::relay(|| self.listen(&waiters)).await;
    }

    async fn sweep(&self, batch: usize) -> Result<u64, StoreError> {
        // transitions::expired. Bounded, and skipping rows other transactions hold: never a long lock.
        let done = self
            .bounded(async |conn| sqlx::query(
                    "DELETE FROM idemgate_records
                      WHERE ctid IN (SELECT ctid FROM idemgate_records
                                      WHERE expires_at <= clock_timestamp()
                                        AND NOT (state = 'in_flight' AND lease_until > clock_timestamp())
                                      LIMIT $1 FOR UPDATE SKIP LOCKED)",
                )
                .bind(i64::try_from(batch).unwrap_or(i64::MAX))
                .execute(conn).await)
            .await?;
        Ok(done.rows_affected())
    }

    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        let sql = format!(concat!("SELECT {} WHERE ", key_match!()), INFO_COLUMNS);
        let row: Option<InfoRow> = self
            .bounded(async |conn| {
                bind_key!(sqlx::query_as(sqlx::AssertSqlSafe(sql)), key)
                    .fetch_optional(conn)
                    .await
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
            "SELECT {INFO_COLUMNS} WHERE route = $1 AND state = $2 ORDER BY updated_at LIMIT $3"
        );
        let rows: Vec<InfoRow> = self
            .bounded(async |conn| {
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(route)
                    .bind(state.as_str())
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(conn)
                    .await
            })
            .await?;
        rows.into_iter().map(InfoRow::into_info).collect()
    }

    async fn clear(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        let done = self
            // transitions::clearable
            .bounded(async |conn| bind_key!(sqlx::query(at_key!(
                    "DELETE FROM idemgate_records",
                    "AND (state = 'held'
                             OR (state = 'in_flight' AND ($4 OR lease_until <= clock_timestamp())))",
                )), key)
                .bind(force)
                .execute(conn).await)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        let done = self
            // transitions::deletable
            .bounded(async |conn| {
                bind_key!(
                    sqlx::query(at_key!(
                        "DELETE FROM idemgate_records",
                        "AND ($4 OR state <> 'in_flight' OR lease_until <= clock_timestamp())"
                    )),
                    key
                )
                .bind(force)
                .execute(conn)
                .await
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    fn batch_stats(&self) -> Option<super::BatchStats> {
        Some(self.batcher.stats())
    }

    fn pool_stats(&self) -> Option<super::PoolStats> {
        let (connections, idle, max) = self.pool.stats();
        Some(super::PoolStats {
            connections,
            idle,
            max,
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let expected = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
        let table: Option<String> = self
            .bounded(async |conn| {
                sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
                    .fetch_one(conn)
                    .await
            })
            .await?;
        let applied: Option<i64> = match table {
            None => None,
            Some(_) => Some(
                self.bounded(async |conn| {
                    sqlx::query_scalar(
                        "SELECT COALESCE(max(version), 0) FROM _sqlx_migrations WHERE success",
                    )
                    .fetch_one(conn)
                    .await
                })
                .await?,
            ),
        };
        match applied {
            Some(v) if v >= expected => Ok(()),
            Some(v) => Err(StoreError::NotMigrated(format!(
                "schema version {v}, this build needs {expected}"
            ))),
            None => Err(StoreError::NotMigrated("no migrations applied".into())),
        }
    }
}
