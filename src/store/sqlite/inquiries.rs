//! The SQLite store's side of the status inquiry: taking the due
//! questions inside the writer's transaction (the other inquiry writes are
//! attempt writes, in [`super::ops`]).

use std::time::Duration;

use sqlx::sqlite::SqliteConnection;

use super::rows::{Context, KEY, micros, next_token, unavailable};
use crate::store::{Inquiry, RecordKey, StoreError};

/// Take the due questions (transitions::take_applies): each gets a new
/// token and a lease; a lapsed in-flight record starts its inquiry here.
pub(super) async fn take(
    conn: &mut SqliteConnection,
    routes: &[String],
    lease: Duration,
    limit: usize,
    context: &Context,
    now: i64,
) -> Result<Vec<Inquiry>, StoreError> {
    let due: Vec<(String, Vec<u8>, String, String)> = sqlx::query_as(
        "SELECT route, scope, key, state FROM idemgate_records
          WHERE state IN ('in_flight', 'inquiring') AND lease_until <= ?1 AND expires_at > ?1
          ORDER BY lease_until",
    )
    .bind(now)
    .fetch_all(&mut *conn)
    .await
    .map_err(unavailable)?;
    let mut taken = Vec::new();
    for (route, scope, key, state) in due {
        if taken.len() >= limit {
            break;
        }
        if !routes.contains(&route) {
            continue;
        }
        let key = RecordKey { route, scope, key };
        let token = next_token(conn).await?;
        let sql = format!(
            "UPDATE idemgate_records SET token = ?4,
                 inquiring_since = CASE WHEN state = 'inquiring' THEN inquiring_since ELSE ?5 END,
                 inquiries = CASE WHEN state = 'inquiring' THEN inquiries ELSE 0 END,
                 state = 'inquiring', lease_until = ?6, updated_at = ?5
              WHERE {KEY} RETURNING inquiries, inquiring_since"
        );
        let (asked, since): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(&key.route)
            .bind(&key.scope)
            .bind(&key.key)
            .bind(token)
            .bind(now)
            .bind(now.saturating_add(micros(lease)))
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
