//! The in-memory store (`memory://`): for trying idemgate on one machine
//! with no database, and for fast tests. Per-process and lost on restart,
//! which the gateway warns about at start. It follows exactly the state
//! machine of the PostgreSQL claim function (migrations/0001_records.sql):
//! same outcomes, same fencing, same expiry, on a monotonic clock.
//!
//! Memory is bounded by `[store] max_records`: when that many live records
//! exist, expired ones are swept first, and if none are, a new key is
//! refused with [`StoreError::Full`] (a `503`), never grown without bound.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::UnknownOutcome;
use super::{
    Cas, Claim, ClaimRequest, HeldReason, RecordInfo, RecordKey, RecordState, Store, StoreError,
    StoredResponse, Token,
};
use crate::fingerprint::Fingerprint;

#[derive(Debug, Clone)]
enum State {
    InFlight { lease_until: Instant },
    Completed(StoredResponse),
    Held(HeldReason),
}

#[derive(Debug, Clone)]
struct Record {
    fingerprint: Fingerprint,
    token: Token,
    state: State,
    expires_at: Instant,
    created_at: Instant,
    updated_at: Instant,
}

#[derive(Debug, Default)]
struct Inner {
    records: HashMap<RecordKey, Record>,
    last_token: Token,
}

/// The wall-clock time of a monotonic instant.
fn wall(at: Instant) -> SystemTime {
    let now = Instant::now();
    if at >= now {
        SystemTime::now() + (at - now)
    } else {
        SystemTime::now() - (now - at)
    }
}

impl Record {
    fn info(&self, key: &RecordKey) -> Option<RecordInfo> {
        let (state, held, lease, status, body) = match &self.state {
            State::InFlight { lease_until } => {
                ("in_flight", None, Some(wall(*lease_until)), None, None)
            }
            State::Completed(r) => (
                "completed",
                None,
                None,
                Some(r.status.as_u16()),
                Some(r.body.len() as u64),
            ),
            State::Held(reason) => ("held", Some(reason.as_str()), None, None, None),
        };
        RecordInfo::from_parts(
            key,
            state,
            held,
            self.token,
            [self.created_at, self.updated_at, self.expires_at].map(wall),
            lease,
            status,
            body,
        )
    }

    /// Past retention and not held by a live lease (a lease outlives retention).
    fn expired(&self, now: Instant) -> bool {
        let leased = matches!(self.state, State::InFlight { lease_until } if lease_until > now);
        self.expires_at <= now && !leased
    }
}

impl Inner {
    fn next_token(&mut self) -> Token {
        self.last_token += 1;
        self.last_token
    }

    fn sweep(&mut self, now: Instant, limit: usize) -> u64 {
        let expired: Vec<RecordKey> = self
            .records
            .iter()
            .filter(|(_, r)| r.expired(now))
            .map(|(k, _)| k.clone())
            .take(limit)
            .collect();
        for k in &expired {
            self.records.remove(k);
        }
        expired.len() as u64
    }
}

/// A per-process [`Store`].
#[derive(Debug)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    max_records: usize,
}

impl MemoryStore {
    /// An empty store holding at most `max_records` records.
    pub fn new(max_records: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            max_records,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a record half-written
        // (every transition is a single assignment), so poison is harmless.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn owned(record: &Record, token: Token) -> bool {
    record.token == token
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        let fresh = |token| Record {
            fingerprint: *req.fingerprint,
            token,
            state: State::InFlight {
                lease_until: now + req.lease,
            },
            expires_at: now + req.retention,
            created_at: now,
            updated_at: now,
        };
        let live = inner
            .records
            .get(req.key)
            .filter(|r| !r.expired(now))
            .cloned();
        let Some(record) = live else {
            if !inner.records.contains_key(req.key) && inner.records.len() >= self.max_records {
                let room = inner.records.len() - self.max_records + 1;
                if inner.sweep(now, room.max(64)) < room as u64 {
                    return Err(StoreError::Full(self.max_records));
                }
            }
            let token = inner.next_token();
            inner.records.insert(req.key.clone(), fresh(token));
            return Ok(Claim::Claimed {
                token,
                takeover: false,
            });
        };
        if record.fingerprint != *req.fingerprint {
            return Ok(Claim::Mismatch);
        }
        Ok(match record.state {
            State::Completed(response) => Claim::Replay(response),
            State::Held(reason) => Claim::Held(reason),
            State::InFlight { lease_until } if lease_until > now => Claim::InFlight {
                retry_after: lease_until - now,
            },
            State::InFlight { .. } => match req.on_unknown_outcome {
                UnknownOutcome::Release => {
                    let token = inner.next_token();
                    let entry = inner.records.get_mut(req.key).expect("read above");
                    entry.token = token;
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
                UnknownOutcome::Hold => {
                    let entry = inner.records.get_mut(req.key).expect("read above");
                    entry.state = State::Held(HeldReason::LeaseLapsed);
                    entry.updated_at = now;
                    Claim::Held(HeldReason::LeaseLapsed)
                }
            },
        })
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: Token,
        lease: Duration,
    ) -> Result<Cas, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        Ok(match inner.records.get_mut(key) {
            Some(r) if owned(r, token) && matches!(r.state, State::InFlight { .. }) => {
                r.state = State::InFlight {
                    lease_until: now + lease,
                };
                r.expires_at = r.expires_at.max(now + lease);
                r.updated_at = now;
                Cas::Applied
            }
            _ => Cas::Fenced,
        })
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: Token,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        Ok(match inner.records.get_mut(key) {
            Some(r)
                if owned(r, token)
                    && matches!(
                        r.state,
                        State::InFlight { .. }
                            | State::Completed(_)
                            | State::Held(HeldReason::LeaseLapsed)
                    ) =>
            {
                r.state = State::Completed(response.clone());
                r.expires_at = now + retention;
                r.updated_at = now;
                Cas::Applied
            }
            _ => Cas::Fenced,
        })
    }

    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError> {
        let mut inner = self.lock();
        match inner.records.get(key) {
            Some(r) if owned(r, token) && matches!(r.state, State::InFlight { .. }) => {
                inner.records.remove(key);
                Ok(Cas::Applied)
            }
            _ => Ok(Cas::Fenced),
        }
    }

    async fn hold(
        &self,
        key: &RecordKey,
        token: Token,
        reason: HeldReason,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        Ok(match inner.records.get_mut(key) {
            Some(r)
                if owned(r, token)
                    && matches!(r.state, State::InFlight { .. } | State::Held(_)) =>
            {
                r.state = State::Held(reason);
                r.expires_at = now + retention;
                r.updated_at = now;
                Cas::Applied
            }
            _ => Cas::Fenced,
        })
    }

    async fn sweep(&self, batch: usize) -> Result<u64, StoreError> {
        Ok(self.lock().sweep(Instant::now(), batch))
    }

    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        Ok(self.lock().records.get(key).and_then(|r| r.info(key)))
    }

    async fn list(
        &self,
        route: &str,
        state: RecordState,
        limit: usize,
    ) -> Result<Vec<RecordInfo>, StoreError> {
        let inner = self.lock();
        let mut found: Vec<(Instant, RecordInfo)> = inner
            .records
            .iter()
            .filter(|(k, _)| k.route == route)
            .filter_map(|(k, r)| Some((r.updated_at, r.info(k)?)))
            .filter(|(_, info)| info.state == state)
            .collect();
        found.sort_by_key(|(updated, _)| *updated);
        Ok(found
            .into_iter()
            .take(limit)
            .map(|(_, info)| info)
            .collect())
    }

    async fn clear(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        let clearable = match inner.records.get(key).map(|r| &r.state) {
            Some(State::Held(_)) => true,
            Some(State::InFlight { lease_until }) => force || *lease_until <= now,
            _ => false,
        };
        if clearable {
            inner.records.remove(key);
        }
        Ok(clearable)
    }

    async fn delete(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        let deletable = match inner.records.get(key).map(|r| &r.state) {
            None => false,
            Some(State::InFlight { lease_until }) => force || *lease_until <= now,
            Some(_) => true,
        };
        if deletable {
            inner.records.remove(key);
        }
        Ok(deletable)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
