//! The SQLite store's operations as data ([`Op`]) and their execution
//! inside the writer's transaction ([`execute`]): each reads the record and
//! writes what the rules of [`transitions`] decide, as the memory store
//! does. Also the reads a claim makes first, outside any transaction.

use std::time::Duration;

use sqlx::sqlite::SqliteConnection;

use super::rows::{
    Context, Row, WAKE_KEPT, at_key, corrupt, micros, next_token, now_us, read_head, read_row,
    unavailable,
};
use crate::transitions::{self, ClaimStep, Write};
use crate::{
    AttemptId, Claim, EraseStep, Erased, HeldReason, InquiringRoute, Inquiry, RecordKey,
    StoreError, StoredResponse, Token, UnknownOutcome, encode_headers,
};

/// A claim, owned (it waits in the writer's queue).
#[derive(Debug)]
pub(super) struct ClaimOp {
    pub(super) key: RecordKey,
    pub(super) fingerprint: [u8; 32],
    pub(super) attempt: AttemptId,
    pub(super) lease: Duration,
    pub(super) retention: Duration,
    pub(super) on_unknown: UnknownOutcome,
    pub(super) inquire_after: Duration,
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

/// The answer of a claim that writes nothing at `now`; `None` for the
/// steps that write.
pub(super) fn read_only_answer(
    step: ClaimStep,
    row: Option<Row>,
    now: i64,
) -> Result<Option<Claim>, StoreError> {
    // Every answer that is no claim is decided on a record.
    let expires_in = |row: &Option<Row>| -> Result<Duration, StoreError> {
        let head = &row
            .as_ref()
            .ok_or_else(|| corrupt("an answer decided on no record"))?
            .head;
        Ok(transitions::kept_for(
            expires_in(head.expires_at, now),
            head.phase(now)?,
        ))
    };
    Ok(Some(match step {
        ClaimStep::Mismatch => Claim::Mismatch {
            expires_in: expires_in(&row)?,
        },
        ClaimStep::Replay => Claim::Replay(
            row.ok_or_else(|| corrupt("a replay decided on no record"))?
                .response()?,
        ),
        ClaimStep::Held(reason) => Claim::Held {
            reason,
            expires_in: expires_in(&row)?,
        },
        ClaimStep::InFlight(retry_after) => Claim::InFlight {
            retry_after,
            expires_in: expires_in(&row)?,
        },
        ClaimStep::Inquiring(retry_after) => Claim::Inquiring {
            retry_after,
            expires_in: expires_in(&row)?,
        },
        ClaimStep::Insert
        | ClaimStep::TakeOver
        | ClaimStep::HoldLapsed
        | ClaimStep::InquireLapsed => return Ok(None),
    }))
}

/// Time left at `now` before `expires_at` (both µs since the epoch).
fn expires_in(expires_at: i64, now: i64) -> Duration {
    Duration::from_micros(u64::try_from(expires_at.saturating_sub(now)).unwrap_or(0))
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
    /// Delete up to `limit` records of one route and scope (`keys erase`).
    Erase {
        route: String,
        scope: Vec<u8>,
        force: bool,
        limit: usize,
        after: Option<String>,
    },
    /// Delete up to this many expired records (and old announcements).
    Sweep { batch: usize },
    /// Take up to `limit` due questions of `routes`, each with a lease.
    TakeInquiries {
        routes: Vec<InquiringRoute>,
        lease: Duration,
        limit: usize,
    },
    /// Test builds: move the record's instants `by` into the past
    /// (`StoreAdmin::age`).
    #[cfg(feature = "test-hooks")]
    Age { key: RecordKey, by: Duration },
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
    Inquire {
        next: Duration,
        asked: bool,
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
            Op::Claim(_)
            | Op::Write { .. }
            | Op::Remove { .. }
            | Op::Erase { .. }
            | Op::Sweep { .. }
            | Op::TakeInquiries { .. } => 0,
            #[cfg(feature = "test-hooks")]
            Op::Age { .. } => 0,
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
    /// An erasure step.
    Erased(Erased),
    /// The questions taken.
    Taken(Vec<Inquiry>),
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
                    !head.expired(now)?
                        && transitions::abandon_applies(head.attempt == Some(attempt), phase)
                }
                Removal::Clear { force } => transitions::clearable(phase, head.asked(), force),
                Removal::Delete { force } => transitions::deletable(phase, head.asked(), force),
            };
            if allowed {
                at_key(conn, "DELETE FROM idemgate_records", key, |q| q).await?;
                context.announce(conn, key, now).await?;
            }
            Ok(Reply::Applied(allowed))
        }
        Op::Erase {
            route,
            scope,
            force,
            limit,
            after,
        } => {
            let step = EraseStep {
                route,
                scope,
                force: *force,
                limit: *limit,
                after: after.as_deref(),
            };
            super::erase::erase(conn, &step, context, now)
                .await
                .map(Reply::Erased)
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
            super::room::release(&mut *conn).await?;
            Ok(Reply::Swept(done.rows_affected()))
        }
        Op::TakeInquiries {
            routes,
            lease,
            limit,
        } => super::inquiries::take(conn, routes, *lease, *limit, context, now)
            .await
            .map(Reply::Taken),
        #[cfg(feature = "test-hooks")]
        Op::Age { key, by } => {
            // NULL (no lease, not inquiring) stays NULL.
            let sql = format!(
                "UPDATE idemgate_records SET lease_until = lease_until - ?4,
                     expires_at = expires_at - ?4, created_at = created_at - ?4,
                     updated_at = updated_at - ?4, inquiring_since = inquiring_since - ?4
                  WHERE {}",
                super::rows::KEY
            );
            let done = super::rows::bind_key!(sqlx::query(sqlx::AssertSqlSafe(sql)), key)
                .bind(micros(*by))
                .execute(&mut *conn)
                .await
                .map_err(unavailable)?;
            Ok(Reply::Applied(done.rows_affected() == 1))
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
                     held_reason = NULL, status = NULL, headers = NULL, body = NULL,
                     inquiries = 0, inquiring_since = NULL",
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
                "UPDATE idemgate_records SET state = 'in_flight', token = ?4, attempt = ?5,
                     lease_until = ?6, expires_at = max(expires_at, ?6), updated_at = ?7,
                     inquiries = 0, inquiring_since = NULL",
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
        ClaimStep::InquireLapsed | ClaimStep::HoldLapsed => {
            let lapsed_at = row.as_ref().and_then(|r| r.head.lease_until).unwrap_or(now);
            let lapsed = Lapsed {
                hold: step == ClaimStep::HoldLapsed,
                at: lapsed_at,
                expires_at: row.as_ref().map_or(now, |r| r.head.expires_at),
            };
            settle_lapsed(conn, claim, lapsed, context, now).await?
        }
        // The record changed since the first read: answer as it is now.
        step => Reply::Claim(
            read_only_answer(step, row, now)?.ok_or_else(|| corrupt("no claim step"))?,
            false,
        ),
    })
}

/// What a claim found lapsed: whether it holds the record, and when the
/// lease lapsed (µs since the epoch).
struct Lapsed {
    hold: bool,
    at: i64,
    /// When the record expired before the claim (µs since the epoch).
    expires_at: i64,
}

/// A claim found the lease lapsed (or a due inquiry nobody asks about):
/// the record turns held (`hold`) or inquiring, reckoned from the lapse and
/// due the route's `after` past it (transitions::lapsed_question_in), and
/// leaves `in_flight` for its waiters.
async fn settle_lapsed(
    conn: &mut SqliteConnection,
    claim: &ClaimOp,
    lapsed: Lapsed,
    context: &Context,
    now: i64,
) -> Result<Reply, StoreError> {
    let key = &claim.key;
    let answer = if lapsed.hold {
        at_key(
            conn,
            "UPDATE idemgate_records SET state = 'held', held_reason = 'lease_lapsed',
                 lease_until = NULL, inquiring_since = NULL, updated_at = ?4",
            key,
            |q| q.bind(now),
        )
        .await?;
        Claim::Held {
            reason: HeldReason::LeaseLapsed,
            expires_in: expires_in(lapsed.expires_at, now),
        }
    } else {
        let lapsed_for = Duration::from_micros(u64::try_from(now - lapsed.at).unwrap_or(0));
        let next = transitions::lapsed_question_in(lapsed_for, claim.inquire_after);
        let expires_at = lapsed
            .expires_at
            .max(now.saturating_add(micros(claim.retention)));
        at_key(
            conn,
            "UPDATE idemgate_records SET state = 'inquiring', lease_until = ?4,
                 inquiries = 0, inquiring_since = ?7, updated_at = ?6,
                 expires_at = max(expires_at, ?5)",
            key,
            |q| {
                q.bind(now.saturating_add(micros(next)))
                    .bind(expires_at)
                    .bind(now)
                    .bind(lapsed.at.min(now))
            },
        )
        .await?;
        Claim::Inquiring {
            retry_after: next,
            expires_in: expires_in(expires_at, now),
        }
    };
    context.announce(conn, key, now).await?;
    Ok(Reply::Claim(answer, true))
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
        AttemptWrite::Inquire { .. } => Write::Inquire,
    };
    // Past retention, a record is gone for every purpose: no write brings
    // it back (transitions::expired).
    if head.expired(now)?
        || !transitions::write_applies(rule, head.token == token, head.phase(now)?)
    {
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
                     inquiring_since = NULL,
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
        AttemptWrite::Inquire {
            next,
            asked,
            retention,
        } => {
            // `state` on the right of SET is the old row's.
            at_key(
                conn,
                "UPDATE idemgate_records SET lease_until = ?4,
                     inquiries = CASE WHEN state = 'inquiring' THEN inquiries ELSE 0 END + ?5,
                     inquiring_since = CASE WHEN state = 'inquiring' THEN inquiring_since
                                            ELSE ?6 END,
                     state = 'inquiring', updated_at = ?6, expires_at = max(expires_at, ?7)",
                key,
                |q| {
                    q.bind(now.saturating_add(micros(*next)))
                        .bind(i64::from(*asked))
                        .bind(now)
                        .bind(now.saturating_add(micros(*retention)))
                },
            )
            .await?;
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
