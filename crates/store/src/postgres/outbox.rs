//! The PostgreSQL side of the front store (crates/store/src/front/): the
//! transactional outbox of migration 0004, and reading records' current
//! state for the front under a share lock.
//!
//! A sync runs in one transaction: it deletes outbox rows taken `FOR UPDATE
//! SKIP LOCKED` (so every instance may relay at once; the delete is rolled
//! back if a later step fails). Keys whose newest row says they were
//! completed, and whose front already shows that or something newer
//! (the caller's `shown` step), need nothing more. The others' records are
//! read `FOR SHARE` (in the lock order of the batches: route, scope, key,
//! bytewise) and handed to the caller, which applies them to Redis. While
//! it writes Redis, no transaction can delete or change those records: a
//! key deleted by an operator is deleted after the front was given its
//! last state, and the delete's own outbox row then removes it from the
//! front.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use sqlx::Connection;

use super::PgStore;
use crate::{
    HeldReason, RecordKey, RecordState, StoreError, StoredResponse, Token, decode_headers,
};

/// A record's current state, as the front may show it.
#[derive(Debug, Clone)]
pub(crate) enum Truth {
    /// No record, or one the front must not show (in flight or expired).
    Nothing,
    /// Completed: replay it until `expires_ms`.
    Completed {
        /// The attempt that completed it.
        token: Token,
        /// Its request's fingerprint.
        fingerprint: Vec<u8>,
        /// The recorded response.
        response: StoredResponse,
        /// Retention, in milliseconds since the epoch (PostgreSQL's clock).
        expires_ms: i64,
    },
    /// Held until `expires_ms`.
    Held {
        /// The attempt it was held for.
        token: Token,
        /// Its request's fingerprint.
        fingerprint: Vec<u8>,
        /// Why.
        reason: HeldReason,
        /// Retention, in milliseconds since the epoch.
        expires_ms: i64,
    },
}

/// One key to bring in line: its current state, and the newest attempt
/// the outbox says is over (0 when the sync was not asked by the outbox).
#[derive(Debug, Clone)]
pub(crate) struct Dirty {
    /// The key.
    pub(crate) key: RecordKey,
    /// The newest token of its outbox rows: that attempt, and every older
    /// one, is over.
    pub(crate) over: Token,
    /// What PostgreSQL holds now.
    pub(crate) truth: Truth,
}

/// A key whose newest outbox row says it was completed: if the front shows
/// that (or anything newer), the relay has nothing to do for it. (Only
/// completions: a held record's reason can change under the same token,
/// which such a check would not see; holds are rare and take the full
/// path.)
#[derive(Debug, Clone)]
pub(crate) struct Settling {
    /// The key.
    pub(crate) key: RecordKey,
    /// The attempt that completed it.
    pub(crate) token: Token,
    /// The newest token of its outbox rows (see [`Dirty::over`]).
    over: Token,
    /// How many outbox rows it had.
    rows: u64,
}

/// What one relay pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Relayed {
    /// Outbox rows taken and deleted.
    pub(crate) rows: u64,
    /// … of which the front already showed what they said.
    pub(crate) shown: u64,
}

/// An outbox row (migrations 0004 and 0005).
#[derive(sqlx::FromRow)]
struct OutboxRow {
    id: i64,
    route: String,
    scope: Vec<u8>,
    key: String,
    /// The attempt whose record changed: it, and every older one, is over.
    token: Token,
    /// What the record became (NULL: deleted, or a row older than 0005).
    state: Option<String>,
    state_token: Option<Token>,
}

/// Group rows (in id order, which for one key is the order of its changes:
/// each change waited for the previous one's commit) by key: the keys
/// whose newest row says they were completed, and the rest, each with the
/// newest token its rows name.
fn group(rows: Vec<OutboxRow>) -> (Vec<Settling>, Vec<(RecordKey, Token)>) {
    struct Group {
        over: Token,
        rows: u64,
        completed: Option<Token>,
    }
    let mut order: Vec<RecordKey> = Vec::new();
    let mut groups: HashMap<RecordKey, Group> = HashMap::new();
    for row in rows {
        let key = RecordKey {
            route: row.route,
            scope: row.scope,
            key: row.key,
        };
        let completed = row
            .state_token
            .filter(|_| row.state.as_deref() == Some(RecordState::Completed.as_str()));
        match groups.get_mut(&key) {
            Some(group) => {
                group.over = group.over.max(row.token);
                group.rows += 1;
                group.completed = completed;
            }
            None => {
                order.push(key.clone());
                groups.insert(
                    key,
                    Group {
                        over: row.token,
                        rows: 1,
                        completed,
                    },
                );
            }
        }
    }
    let (mut settling, mut rest) = (Vec::new(), Vec::new());
    for key in order {
        let Some(group) = groups.remove(&key) else {
            continue;
        };
        match group.completed {
            Some(token) => settling.push(Settling {
                key,
                token,
                over: group.over,
                rows: group.rows,
            }),
            None => rest.push((key, group.over)),
        }
    }
    (settling, rest)
}

#[derive(sqlx::FromRow)]
struct TruthRow {
    route: String,
    scope: Vec<u8>,
    key: String,
    state: String,
    token: i64,
    fingerprint: Vec<u8>,
    held_reason: Option<String>,
    status: Option<i16>,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
    expires_ms: i64,
}

impl TruthRow {
    fn into_truth(self) -> Result<(RecordKey, Truth), StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt(format!("front sync read {what}"));
        let truth = match self.state.as_str() {
            "completed" => Truth::Completed {
                token: self.token,
                fingerprint: self.fingerprint,
                response: StoredResponse {
                    status: self
                        .status
                        .and_then(|s| u16::try_from(s).ok())
                        .and_then(|s| StatusCode::from_u16(s).ok())
                        .ok_or_else(|| corrupt("a bad status"))?,
                    headers: decode_headers(self.headers.as_deref().unwrap_or_default())
                        .ok_or_else(|| corrupt("undecodable headers"))?,
                    body: Bytes::from(self.body.unwrap_or_default()),
                },
                expires_ms: self.expires_ms,
            },
            "held" => Truth::Held {
                token: self.token,
                fingerprint: self.fingerprint,
                reason: self
                    .held_reason
                    .as_deref()
                    .and_then(HeldReason::parse)
                    .ok_or_else(|| corrupt("an unknown held reason"))?,
                expires_ms: self.expires_ms,
            },
            _ => Truth::Nothing,
        };
        let key = RecordKey {
            route: self.route,
            scope: self.scope,
            key: self.key,
        };
        Ok((key, truth))
    }
}

/// Why a sync failed: PostgreSQL, or the caller's apply step.
#[derive(Debug)]
pub(crate) enum SyncError {
    /// PostgreSQL failed or did not answer in time.
    Store(StoreError),
    /// Applying to the front failed; nothing was deleted.
    Apply(StoreError),
}

impl PgStore {
    /// One relay pass: up to `limit` outbox rows, grouped by key. Keys
    /// whose newest row says they were completed are first given to `shown`,
    /// which says which of them the front already shows (the completing
    /// instance wrote them); those rows are just deleted. The rest are
    /// handed with their records' current state, read under a share lock,
    /// to `apply`. The rows are deleted if every step succeeds. Bounded by
    /// `[store] timeout`.
    pub(crate) async fn relay_outbox(
        &self,
        limit: usize,
        shown: impl AsyncFnOnce(&[Settling]) -> Result<Vec<bool>, StoreError>,
        apply: impl AsyncFnOnce(&[Dirty]) -> Result<(), StoreError>,
    ) -> Result<Relayed, SyncError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let result = self
            .bounded(async |conn| {
                let mut tx = conn.begin().await?;
                // Nothing here needs to survive a crash: rows whose delete
                // is lost are applied again (every step is idempotent), so
                // the relay's commits do not wait for a WAL flush beside
                // the batches' that do.
                sqlx::query("SET LOCAL synchronous_commit = off")
                    .execute(&mut *tx)
                    .await?;
                // Deleted at once, locked until the commit; a failed step
                // rolls the delete back.
                let mut rows: Vec<OutboxRow> = sqlx::query_as(
                    "DELETE FROM idemgate_front_outbox
                      WHERE id IN (SELECT id FROM idemgate_front_outbox
                                    ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
                  RETURNING id, route, scope, key, token, state, state_token",
                )
                .bind(limit)
                .fetch_all(&mut *tx)
                .await?;
                if rows.is_empty() {
                    // Ended now, not when the connection is next used.
                    tx.commit().await?;
                    return Ok(Ok(Relayed::default()));
                }
                rows.sort_unstable_by_key(|row| row.id);
                let taken = rows.len() as u64;
                let (settling, mut keys) = group(rows);
                let mut skipped = 0;
                if !settling.is_empty() {
                    let answers = match shown(&settling).await {
                        Ok(answers) => answers,
                        Err(e) => {
                            tx.rollback().await?;
                            return Ok(Err(SyncError::Apply(e)));
                        }
                    };
                    for (settled, is_shown) in settling.into_iter().zip(answers) {
                        if is_shown {
                            skipped += settled.rows;
                        } else {
                            keys.push((settled.key, settled.over));
                        }
                    }
                }
                if !keys.is_empty() {
                    let dirty = match read_truths(&mut tx, keys).await? {
                        Ok(dirty) => dirty,
                        Err(e) => {
                            tx.rollback().await?;
                            return Ok(Err(SyncError::Store(e)));
                        }
                    };
                    if let Err(e) = apply(&dirty).await {
                        tx.rollback().await?;
                        return Ok(Err(SyncError::Apply(e)));
                    }
                }
                tx.commit().await?;
                Ok(Ok(Relayed {
                    rows: taken,
                    shown: skipped,
                }))
            })
            .await;
        match result {
            Ok(inner) => inner,
            Err(e) => Err(SyncError::Store(e)),
        }
    }

    /// Hand `keys`' current state to `apply` while holding their records
    /// `FOR SHARE` (the read-repair of a replay the front did not have).
    pub(crate) async fn sync_keys(
        &self,
        keys: Vec<RecordKey>,
        apply: impl AsyncFnOnce(&[Dirty]) -> Result<(), StoreError>,
    ) -> Result<(), SyncError> {
        let keys = keys.into_iter().map(|k| (k, 0)).collect();
        let result = self
            .bounded(async |conn| {
                let mut tx = conn.begin().await?;
                let dirty = match read_truths(&mut tx, keys).await? {
                    Ok(dirty) => dirty,
                    Err(e) => {
                        tx.rollback().await?;
                        return Ok(Err(SyncError::Store(e)));
                    }
                };
                let applied = apply(&dirty).await;
                tx.commit().await?;
                Ok(applied.map_err(SyncError::Apply))
            })
            .await;
        match result {
            Ok(inner) => inner,
            Err(e) => Err(SyncError::Store(e)),
        }
    }

    /// A token at least as high as any issued so far: fencing the front
    /// with it (before an operator's delete) keeps every earlier attempt's
    /// late write out.
    pub(crate) async fn token_ceiling(&self) -> Result<Token, StoreError> {
        self.bounded(async |conn| {
            sqlx::query_scalar("SELECT last_value FROM idemgate_token_seq")
                .fetch_one(conn)
                .await
        })
        .await
    }

    /// The Redis run_id the front was last brought in line with.
    pub(crate) async fn front_run_id(&self) -> Result<Option<String>, StoreError> {
        self.bounded(async |conn| {
            sqlx::query_scalar("SELECT redis_run_id FROM idemgate_front_state")
                .fetch_optional(conn)
                .await
        })
        .await
    }

    /// Record that the front is the server with this run_id (after wiping it).
    pub(crate) async fn set_front_run_id(&self, run_id: &str) -> Result<(), StoreError> {
        self.bounded(async |conn| {
            sqlx::query(
                "INSERT INTO idemgate_front_state (redis_run_id) VALUES ($1)
                     ON CONFLICT (one) DO UPDATE SET redis_run_id = EXCLUDED.redis_run_id",
            )
            .bind(run_id)
            .execute(conn)
            .await
        })
        .await?;
        Ok(())
    }

    /// The newest outbox row's id (0: none).
    pub(crate) async fn outbox_head(&self) -> Result<i64, StoreError> {
        self.bounded(async |conn| {
            sqlx::query_scalar("SELECT COALESCE(max(id), 0)::int8 FROM idemgate_front_outbox")
                .fetch_one(conn)
                .await
        })
        .await
    }

    /// Whether every outbox row up to `head` has been relayed.
    pub(crate) async fn outbox_drained(&self, head: i64) -> Result<bool, StoreError> {
        self.bounded(async |conn| {
            sqlx::query_scalar(
                "SELECT NOT EXISTS (SELECT 1 FROM idemgate_front_outbox WHERE id <= $1)",
            )
            .bind(head)
            .fetch_one(conn)
            .await
        })
        .await
    }

    /// Rows waiting in the outbox (counted up to `cap`), and the oldest one's age.
    pub(crate) async fn outbox_backlog(&self, cap: i64) -> Result<(i64, Duration), StoreError> {
        let (rows, age_ms): (i64, i64) = self
            .bounded(async |conn| {
                sqlx::query_as(
                    "SELECT count(*)::int8,
                            COALESCE((EXTRACT(EPOCH FROM clock_timestamp() - min(created_at)) * 1000)::int8, 0)
                       FROM (SELECT created_at FROM idemgate_front_outbox LIMIT $1) AS waiting",
                )
                .bind(cap)
                .fetch_one(conn)
                .await
            })
            .await?;
        Ok((rows, Duration::from_millis(age_ms.max(0) as u64)))
    }
}

/// The current state of `keys` (each with the newest token its outbox rows
/// named), read `FOR SHARE` in the batches' lock order.
async fn read_truths(
    conn: &mut sqlx::PgConnection,
    mut keys: Vec<(RecordKey, Token)>,
) -> Result<Result<Vec<Dirty>, StoreError>, sqlx::Error> {
    keys.sort_by(|a, b| crate::postgres::lock_order(&a.0, &b.0));
    let routes: Vec<&str> = keys.iter().map(|(k, _)| k.route.as_str()).collect();
    let scopes: Vec<&[u8]> = keys.iter().map(|(k, _)| k.scope.as_slice()).collect();
    let names: Vec<&str> = keys.iter().map(|(k, _)| k.key.as_str()).collect();
    // COLLATE "C": bytewise, the order `lock_order` gives the batches.
    let rows: Vec<TruthRow> = sqlx::query_as(
        r#"SELECT r.route, r.scope, r.key, r.state, r.token, r.fingerprint, r.held_reason,
                  r.status, r.headers, r.body,
                  -- Rounded down: the front says when the record expires.
                  FLOOR(EXTRACT(EPOCH FROM r.expires_at) * 1000)::int8 AS expires_ms
             FROM idemgate_records r
             JOIN unnest($1::text[], $2::bytea[], $3::text[]) AS k(route, scope, key)
               ON r.route = k.route AND r.scope = k.scope AND r.key = k.key
            WHERE r.expires_at > clock_timestamp()
            ORDER BY r.route COLLATE "C", r.scope, r.key COLLATE "C"
              FOR SHARE OF r"#,
    )
    .bind(&routes)
    .bind(&scopes)
    .bind(&names)
    .fetch_all(&mut *conn)
    .await?;
    let mut found = HashMap::with_capacity(rows.len());
    for row in rows {
        match row.into_truth() {
            Ok((key, truth)) => found.insert(key, truth),
            Err(e) => return Ok(Err(e)),
        };
    }
    Ok(Ok(keys
        .into_iter()
        .map(|(key, over)| {
            let truth = found.remove(&key).unwrap_or(Truth::Nothing);
            Dirty { key, over, truth }
        })
        .collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, key: &str, token: Token, became: Option<(&str, Token)>) -> OutboxRow {
        OutboxRow {
            id,
            route: "r".into(),
            scope: Vec::new(),
            key: key.into(),
            token,
            state: became.map(|(state, _)| state.to_string()),
            state_token: became.map(|(_, token)| token),
        }
    }

    #[test]
    fn a_key_is_checked_only_if_its_newest_row_says_it_was_completed() {
        let (settling, rest) = group(vec![
            // Completed, then deleted: the delete decides.
            row(1, "deleted", 5, Some(("completed", 5))),
            // Taken over, then completed by the new attempt.
            row(2, "done", 3, Some(("in_flight", 4))),
            row(3, "deleted", 5, None),
            row(4, "done", 4, Some(("completed", 4))),
            // Held.
            row(5, "held", 7, Some(("held", 7))),
            // Reused after expiry: in flight again.
            row(6, "reused", 8, Some(("in_flight", 9))),
            // A row from before migration 0005.
            row(7, "old", 10, None),
            // An unknown state is not trusted.
            row(8, "odd", 11, Some(("settled", 11))),
        ]);
        let settling: Vec<_> = settling
            .iter()
            .map(|s| (s.key.key.as_str(), s.token, s.over, s.rows))
            .collect();
        assert_eq!(settling, [("done", 4, 4, 2)]);
        let rest: Vec<_> = rest
            .iter()
            .map(|(k, over)| (k.key.as_str(), *over))
            .collect();
        assert_eq!(
            rest,
            [
                ("deleted", 5),
                ("held", 7),
                ("reused", 8),
                ("old", 10),
                ("odd", 11)
            ]
        );
    }
}
