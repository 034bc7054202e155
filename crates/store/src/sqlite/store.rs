//! The SQLite store's request path: a claim's first read on a reader
//! connection (a replay, a conflict or a mismatch need no write), every
//! write through the group-committing writer ([`super::writer`]).

use super::*;

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        // Reads first: a replay, a mismatch, a held key or a live lease is
        // answered from a snapshot, without the write lock (nor a copy of
        // the request for the writer's queue).
        let row = self
            .read(async |conn| read_row(conn, req.key).await)
            .await?;
        let now = now_us();
        let step = claim_step(row.as_ref(), req.fingerprint, req.on_unknown_outcome, now)?;
        if let Some(answer) = read_only_answer(step, row, now)? {
            return Ok(answer);
        }
        let claim = ClaimOp {
            key: req.key.clone(),
            fingerprint: *req.fingerprint,
            attempt: req.attempt,
            lease: req.lease,
            retention: req.retention,
            on_unknown: req.on_unknown_outcome,
            inquire_after: req.inquire_after,
        };
        match self.write(Op::Claim(claim)).await? {
            Reply::Claim(claim, settled) => {
                if settled {
                    self.announce_here(req.key);
                }
                Ok(claim)
            }
            other => Err(corrupt(&format!("the writer answered {other:?}"))),
        }
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: Token,
        lease: Duration,
    ) -> Result<Cas, StoreError> {
        self.attempt_write(key, token, AttemptWrite::Renew { lease })
            .await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: Token,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let write = AttemptWrite::Complete {
            response: response.clone(),
            retention,
        };
        self.attempt_write(key, token, write).await
    }

    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError> {
        self.attempt_write(key, token, AttemptWrite::Release).await
    }

    async fn hold(
        &self,
        key: &RecordKey,
        token: Token,
        reason: HeldReason,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        self.attempt_write(key, token, AttemptWrite::Hold { reason, retention })
            .await
    }

    async fn inquire(
        &self,
        key: &RecordKey,
        token: Token,
        next: Duration,
        asked: bool,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let write = AttemptWrite::Inquire {
            next,
            asked,
            retention,
        };
        self.attempt_write(key, token, write).await
    }

    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError> {
        let abandoned = self.remove(key, Removal::Abandon(attempt)).await?;
        Ok(if abandoned { Cas::Applied } else { Cas::Fenced })
    }
}
