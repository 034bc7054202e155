//! The SQLite store's side of the status inquiry: taking the due
//! questions inside the writer's transaction (the other inquiry writes are
//! attempt writes, in [`super::ops`]).

use std::time::Duration;

use sqlx::sqlite::SqliteConnection;

use super::rows::{Context, KEY, micros, next_token, unavailable};
use crate::{InquiringRoute, Inquiry, RecordKey, StoreError};

/// Take the due questions of `routes` (transitions::take_applies), at most
/// `limit`: each gets a new token and a lease, and is kept at least its
/// route's retention; a lapsed in-flight record starts its inquiry here,
/// its route's `after` past the lapse, reckoned from the lapse.
/// The read is bounded by the routes and the limit in SQL (through the
/// partial index of in-flight and inquiring records): it runs inside the
/// one writer's transaction.
pub(super) async fn take(
    conn: &mut SqliteConnection,
    routes: &[InquiringRoute],
    lease: Duration,
    limit: usize,
    context: &Context,
    now: i64,
) -> Result<Vec<Inquiry>, StoreError> {
    if routes.is_empty() || limit == 0 {
        return Ok(Vec::new());
    }
    // Numbered after ?1 (now) and ?2 (the limit): per route its name, and
    // the latest lapse whose question is due (now - its `after`).
    let names: Vec<String> = (0..routes.len())
        .map(|i| {
            let (name, due) = (3 + 2 * i, 4 + 2 * i);
            format!("(route = ?{name} AND (state = 'inquiring' OR lease_until <= ?{due}))")
        })
        .collect();
    let names = names.join(" OR ");
    let sql = format!(
        "SELECT route, scope, key, state FROM idemgate_records
          WHERE state IN ('in_flight', 'inquiring') AND lease_until <= ?1 AND expires_at > ?1
            AND ({names})
          ORDER BY lease_until LIMIT ?2"
    );
    let mut select = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(now)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX));
    for route in routes {
        select = select
            .bind(route.name.as_str())
            .bind(now.saturating_sub(micros(route.after)));
    }
    let due: Vec<(String, Vec<u8>, String, String)> =
        select.fetch_all(&mut *conn).await.map_err(unavailable)?;
    let mut taken = Vec::with_capacity(due.len());
    for (route, scope, key, state) in due {
        // Selected by these routes' names: always one of them.
        let retention = InquiringRoute::retention_of(routes, &route).unwrap_or_default();
        let key = RecordKey { route, scope, key };
        let token = next_token(conn).await?;
        let sql = format!(
            "UPDATE idemgate_records SET token = ?4,
                 inquiring_since = CASE WHEN state = 'inquiring' THEN inquiring_since
                                        ELSE min(lease_until, ?5) END,
                 inquiries = CASE WHEN state = 'inquiring' THEN inquiries ELSE 0 END,
                 state = 'inquiring', lease_until = ?6, updated_at = ?5,
                 expires_at = max(expires_at, ?7)
              WHERE {KEY} RETURNING inquiries, inquiring_since"
        );
        let (asked, since): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(&key.route)
            .bind(&key.scope)
            .bind(&key.key)
            .bind(token)
            .bind(now)
            .bind(now.saturating_add(micros(lease)))
            .bind(now.saturating_add(micros(retention)))
            .fetch_one(&mut *conn)
            .await
            .map_err(unavailable)?;
        if state == "in_flight" {
            context.announce(conn, &key, now).await?;
        }
        taken.push(Inquiry {
            key,
            token,
            asked: u32::try_from(asked).unwrap_or(0),
            inquiring_for: Duration::from_micros(u64::try_from(now - since).unwrap_or(0)),
        });
    }
    Ok(taken)
}
