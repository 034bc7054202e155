//! The PostgreSQL store's request path: the claim is one call of
//! `idemgate_claim` (batched, [`super::batch`]); every later transition is
//! one statement, a compare-and-set on the fencing token, that announces
//! the record it settles where the route has waiters. None applies to a
//! record past its retention and not held by a live lease: it is gone for
//! every purpose (`transitions::expired`), though kept until swept.

use std::time::Duration;

use super::{PgStore, batch, cas, millis, settle_query, unnamed};
use crate::{
    AttemptId, Cas, Claim, ClaimRequest, HeldReason, RecordKey, Store, StoreError, StoredResponse,
    Token, encode_headers,
};

#[async_trait::async_trait]
impl Store for PgStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        // idemgate_claim (migrations/0013_lapsed_question.sql) implements
        // transitions::claim; idemgate_batch calls it per claim, and
        // idemgate_batch_expiry (0015) calls that batch.
        let op = batch::Op::Claim {
            key: req.key.clone(),
            fingerprint: *req.fingerprint,
            attempt: req.attempt,
            lease_ms: millis(req.lease),
            retention_ms: millis(req.retention),
            on_unknown: req.on_unknown_outcome,
            inquire_after_ms: millis(req.inquire_after),
        };
        match self.batcher().submit(op).await? {
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
            .bounded(async |conn| bind_key!(unnamed(at_key!(
                    "UPDATE idemgate_records
                        SET lease_until = clock_timestamp() + $5 * INTERVAL '1 millisecond',
                            expires_at = GREATEST(expires_at, clock_timestamp() + $5 * INTERVAL '1 millisecond'),
                            updated_at = clock_timestamp()",
                    "AND token = $4 AND state = 'in_flight'
                     AND (expires_at > clock_timestamp()
                          OR (state = 'in_flight' AND lease_until > clock_timestamp()))",
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
        // transitions::write_applies(Complete), in idemgate_batch (0014).
        let op = batch::Op::Complete {
            key: key.clone(),
            token,
            status: response.status.as_u16() as i16,
            headers: encode_headers(&response.headers),
            body: response.body.clone(),
            retention_ms: millis(retention),
            wake: self.wake_id_for(key),
        };
        match self.batcher().submit(op).await? {
            batch::Reply::Complete(cas) => Ok(cas),
            batch::Reply::Claim(_) => Err(StoreError::Corrupt(
                "a completion was answered as a claim".into(),
            )),
        }
    }

    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError> {
        // transitions::write_applies(Release): the token, in flight or
        // inquiring.
        let forms = settling!(
            at_key!(
                "DELETE FROM idemgate_records",
                "AND token = $4 AND state IN ('in_flight', 'inquiring')
                     AND (expires_at > clock_timestamp()
                          OR (state = 'in_flight' AND lease_until > clock_timestamp()))"
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
        // transitions::write_applies(Hold): the token; in flight, held or
        // inquiring.
        let forms = settling!(
            at_key!(
                "UPDATE idemgate_records
                SET state = 'held', held_reason = $5, lease_until = NULL,
                    expires_at = clock_timestamp() + $6 * INTERVAL '1 millisecond',
                    updated_at = clock_timestamp()",
                "AND token = $4 AND state IN ('in_flight', 'held', 'inquiring')
                     AND (expires_at > clock_timestamp()
                          OR (state = 'in_flight' AND lease_until > clock_timestamp()))"
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

    async fn inquire(
        &self,
        key: &RecordKey,
        token: Token,
        next: Duration,
        asked: bool,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        // transitions::write_applies(Inquire): the token; in flight or
        // inquiring. (`state` on the right of SET is the old row's.)
        let forms = settling!(
            at_key!(
                "UPDATE idemgate_records
                SET lease_until = clock_timestamp() + $5 * INTERVAL '1 millisecond',
                    inquiries = CASE WHEN state = 'inquiring' THEN inquiries ELSE 0 END
                                + $6::int4,
                    inquiring_since = CASE WHEN state = 'inquiring' THEN inquiring_since
                                           ELSE clock_timestamp() END,
                    expires_at = GREATEST(expires_at,
                                          clock_timestamp() + $7 * INTERVAL '1 millisecond'),
                    state = 'inquiring', updated_at = clock_timestamp()",
                "AND token = $4 AND state IN ('in_flight', 'inquiring')
                     AND (expires_at > clock_timestamp()
                          OR (state = 'in_flight' AND lease_until > clock_timestamp()))"
            ),
            "8",
            "9"
        );
        let wake = self.wake_id_for(key);
        let done = self
            .bounded(async |conn| {
                settle_query(forms, wake.as_deref(), |q| {
                    bind_key!(q, key)
                        .bind(token)
                        .bind(millis(next))
                        .bind(i32::from(asked))
                        .bind(millis(retention))
                })
                .execute(conn)
                .await
            })
            .await?;
        Ok(cas(done.rows_affected()))
    }

    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError> {
        // transitions::abandon_applies: the attempt's own record, in flight,
        // or held or inquiring only because its lease lapsed.
        let forms = settling!(
            at_key!(
                "DELETE FROM idemgate_records",
                "AND attempt = $4
                AND (state IN ('in_flight', 'inquiring')
                     OR (state = 'held' AND held_reason = 'lease_lapsed'))
                     AND (expires_at > clock_timestamp()
                          OR (state = 'in_flight' AND lease_until > clock_timestamp()))"
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
