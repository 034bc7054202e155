//! The memory store's request path: every transition under one lock,
//! by the shared state machine.

use super::*;

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        let fresh = |token| Record {
            fingerprint: *req.fingerprint,
            token,
            attempt: req.attempt,
            state: State::InFlight {
                lease_until: now + req.lease,
            },
            expires_at: now + req.retention,
            created_at: now,
            updated_at: now,
        };
        let live = inner.records.get(req.key).filter(|r| !r.expired(now));
        let step = transitions::claim(
            live.map(|r| (r.phase(now), r.fingerprint == *req.fingerprint)),
            req.on_unknown_outcome,
        );
        Ok(match step {
            ClaimStep::Insert => {
                if !inner.records.contains_key(req.key) && inner.records.len() >= self.max_records {
                    let room = inner.records.len() - self.max_records + 1;
                    if inner.sweep(now, room.max(64)) < room as u64 {
                        return Err(StoreError::Full(self.max_records));
                    }
                }
                let token = inner.next_token();
                inner.records.insert(req.key.clone(), fresh(token));
                Claim::Claimed {
                    token,
                    takeover: false,
                }
            }
            ClaimStep::Mismatch => Claim::Mismatch {
                expires_in: live
                    .expect("a mismatch is decided on a record")
                    .expires_in(now),
            },
            ClaimStep::Replay => match live.map(|r| &r.state) {
                Some(State::Completed(response)) => Claim::Replay(response.clone()),
                _ => unreachable!("a replay is decided on a completed record"),
            },
            ClaimStep::Held(reason) => Claim::Held {
                reason,
                expires_in: live.expect("held is decided on a record").expires_in(now),
            },
            ClaimStep::InFlight(retry_after) => Claim::InFlight {
                retry_after,
                expires_in: live
                    .expect("in flight is decided on a record")
                    .expires_in(now),
            },
            ClaimStep::TakeOver => {
                let token = inner.next_token();
                let entry = inner.records.get_mut(req.key).expect("read above");
                entry.token = token;
                entry.attempt = req.attempt;
                entry.updated_at = now;
                entry.expires_at = entry.expires_at.max(now + req.lease);
                entry.state = State::InFlight {
                    lease_until: now + req.lease,
                };
                Claim::Claimed {
                    token,
                    takeover: true,
                }
            }
            ClaimStep::HoldLapsed => {
                let entry = inner.records.get_mut(req.key).expect("read above");
                entry.state = State::Held(HeldReason::LeaseLapsed);
                entry.updated_at = now;
                let expires_in = entry.expires_in(now);
                drop(inner);
                self.announce(req.key);
                Claim::Held {
                    reason: HeldReason::LeaseLapsed,
                    expires_in,
                }
            }
            ClaimStep::Inquiring(retry_after) => Claim::Inquiring {
                retry_after,
                expires_in: live
                    .expect("inquiring is decided on a record")
                    .expires_in(now),
            },
            ClaimStep::InquireLapsed => {
                let entry = inner.records.get_mut(req.key).expect("read above");
                let retry_after = entry.inquire_lapsed(now, req.inquire_after, req.retention);
                entry.updated_at = now;
                let expires_in = entry.expires_in(now);
                drop(inner);
                self.announce(req.key);
                Claim::Inquiring {
                    retry_after,
                    expires_in,
                }
            }
        })
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: Token,
        lease: Duration,
    ) -> Result<Cas, StoreError> {
        Ok(self.write(key, token, Write::Renew, |r, now| {
            r.state = State::InFlight {
                lease_until: now + lease,
            };
            r.expires_at = r.expires_at.max(now + lease);
        }))
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: Token,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        Ok(self.write(key, token, Write::Complete, |r, now| {
            r.state = State::Completed(response.clone());
            r.expires_at = now + retention;
        }))
    }

    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError> {
        Ok(self.write(key, token, Write::Release, |_, _| {}))
    }

    async fn hold(
        &self,
        key: &RecordKey,
        token: Token,
        reason: HeldReason,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        Ok(self.write(key, token, Write::Hold, |r, now| {
            r.state = State::Held(reason);
            r.expires_at = now + retention;
        }))
    }

    async fn inquire(
        &self,
        key: &RecordKey,
        token: Token,
        next: Duration,
        asked: bool,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        Ok(self.write(key, token, Write::Inquire, |r, now| {
            r.inquire(now, next, asked, retention)
        }))
    }

    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError> {
        let now = Instant::now();
        let abandoned = self.remove_if(key, |record, phase| {
            !record.expired(now) && transitions::abandon_applies(record.attempt == attempt, phase)
        });
        Ok(if abandoned { Cas::Applied } else { Cas::Fenced })
    }
}
