//! The in-memory store (`memory://`): for trying idemgate on one machine
//! with no database, and for fast tests. Per-process and lost on restart,
//! which the gateway warns about at start. It executes the rules of
//! [`super::transitions`] directly, on tokio's monotonic clock (so tests
//! can pause time).
//!
//! Memory is bounded by `[store] max_records`: when that many live records
//! exist, expired ones are swept first, and if none are, a new key is
//! refused with [`StoreError::Full`] (a `503`), never grown without bound.

mod admin;
mod store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::transitions::{self, ClaimStep, Phase, Write};
use super::{
    AttemptId, Cas, Claim, ClaimRequest, EraseStep, EraseStepFailed, Erased, HeldReason,
    InquiringRoute, Inquiry, RecordInfo, RecordKey, RecordState, Store, StoreAdmin, StoreError,
    StoredResponse, Swept, Token,
};
use crate::Fingerprint;
use crate::waiters::Waiters;

#[derive(Debug, Clone)]
enum State {
    InFlight {
        lease_until: Instant,
    },
    Completed(StoredResponse),
    Held(HeldReason),
    /// The next question (or the inquirer's lease) ends at `due`.
    Inquiring {
        due: Instant,
        asked: u32,
        since: Instant,
    },
}

#[derive(Debug, Clone)]
struct Record {
    fingerprint: Fingerprint,
    token: Token,
    attempt: AttemptId,
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
            State::Inquiring { due, .. } => ("inquiring", None, Some(wall(*due)), None, None),
        };
        let info = RecordInfo::from_parts(
            key,
            state,
            held,
            self.token,
            [self.created_at, self.updated_at, self.expires_at].map(wall),
            lease,
            status,
            body,
        )?;
        Some(match &self.state {
            State::Inquiring { asked, since, .. } => info.with_inquiry(*asked, Some(wall(*since))),
            _ => info,
        })
    }

    /// The state as the rules of [`transitions`] see it at `now`.
    fn phase(&self, now: Instant) -> Phase {
        match &self.state {
            State::InFlight { lease_until } => {
                Phase::in_flight(lease_until.saturating_duration_since(now))
            }
            State::Completed(_) => Phase::Completed,
            State::Held(reason) => Phase::Held(*reason),
            State::Inquiring { due, .. } => Phase::inquiring(due.saturating_duration_since(now)),
        }
    }

    /// Turn inquiring (or set the next question) at `now`, kept at least
    /// `retention` from now.
    fn inquire(&mut self, now: Instant, next: Duration, asked: bool, retention: Duration) {
        let (count, since) = match self.state {
            State::Inquiring { asked, since, .. } => (asked, since),
            _ => (0, now),
        };
        self.state = State::Inquiring {
            due: now + next,
            asked: count + u32::from(asked),
            since,
        };
        self.expires_at = self.expires_at.max(now + retention);
    }

    /// Questions asked about its outcome (zero unless inquiring).
    fn asked(&self) -> u32 {
        match self.state {
            State::Inquiring { asked, .. } => asked,
            _ => 0,
        }
    }

    /// How long ago this in-flight record's lease lapsed at `now` (zero:
    /// live, or not in flight).
    fn lapsed_for(&self, now: Instant) -> Duration {
        match self.state {
            State::InFlight { lease_until } => now.saturating_duration_since(lease_until),
            _ => Duration::ZERO,
        }
    }

    /// An in-flight record whose lease lapsed turns inquiring at `now`,
    /// reckoned from the lapse and due `after` past it
    /// ([`transitions::lapsed_question_in`]); kept at least `retention`
    /// from now. Returns the time until the question.
    fn inquire_lapsed(&mut self, now: Instant, after: Duration, retention: Duration) -> Duration {
        let State::InFlight { lease_until } = self.state else {
            unreachable!("only a lapsed in-flight record turns inquiring here")
        };
        let next = transitions::lapsed_question_in(self.lapsed_for(now), after);
        self.state = State::Inquiring {
            due: now + next,
            asked: 0,
            since: lease_until,
        };
        self.expires_at = self.expires_at.max(now + retention);
        next
    }

    /// Time left at `now` before it expires ([`transitions::kept_for`]).
    fn expires_in(&self, now: Instant) -> Duration {
        transitions::kept_for(
            self.expires_at.saturating_duration_since(now),
            self.phase(now),
        )
    }

    /// Gone for every purpose ([`transitions::expired`]).
    fn expired(&self, now: Instant) -> bool {
        transitions::expired(self.expires_at <= now, self.phase(now))
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
    /// Told of every record that leaves `in_flight` (`relay_wakeups`).
    waiters: OnceLock<Arc<Waiters>>,
}

impl MemoryStore {
    /// An empty store holding at most `max_records` records.
    pub fn new(max_records: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            max_records,
            waiters: OnceLock::new(),
        }
    }

    /// `key`'s record left `in_flight` (or may have): wake its waiters.
    fn announce(&self, key: &RecordKey) {
        if let Some(waiters) = self.waiters.get() {
            waiters.wake(&key.wake_id());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a record half-written
        // (every transition is a single assignment), so poison is harmless.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl MemoryStore {
    /// An attempt's write: `apply` it at `now` if [`transitions::write_applies`]
    /// (a release removes the record instead).
    fn write(
        &self,
        key: &RecordKey,
        token: Token,
        write: Write,
        apply: impl FnOnce(&mut Record, Instant),
    ) -> Cas {
        let now = Instant::now();
        let mut inner = self.lock();
        // Past retention, a record is gone for every purpose: no write
        // brings it back (transitions::expired).
        let Some(record) = inner.records.get_mut(key).filter(|r| !r.expired(now)) else {
            return Cas::Fenced;
        };
        if !transitions::write_applies(write, record.token == token, record.phase(now)) {
            return Cas::Fenced;
        }
        if write == Write::Release {
            inner.records.remove(key);
        } else {
            apply(record, now);
            record.updated_at = now;
        }
        drop(inner);
        if write != Write::Renew {
            self.announce(key);
        }
        Cas::Applied
    }

    /// Remove the record if `allowed` by its phase.
    fn remove_if(&self, key: &RecordKey, allowed: impl FnOnce(&Record, Phase) -> bool) -> bool {
        let now = Instant::now();
        let mut inner = self.lock();
        let removable = inner
            .records
            .get(key)
            .is_some_and(|r| allowed(r, r.phase(now)));
        if removable {
            inner.records.remove(key);
            drop(inner);
            self.announce(key);
        }
        removable
    }
}

#[cfg(test)]
mod tests {
    //! Leases and retention on tokio's paused clock: time is advanced, never
    //! slept through. (The conformance suite checks the same rules on every
    //! store in real time.)

    use std::time::Duration;

    use super::*;
    use crate::UnknownOutcome;

    fn key(name: &str) -> RecordKey {
        RecordKey {
            route: "r".into(),
            scope: Vec::new(),
            key: name.into(),
        }
    }

    async fn claim(store: &MemoryStore, key: &RecordKey, unknown: UnknownOutcome) -> Claim {
        let request = ClaimRequest {
            key,
            fingerprint: &[7; 32],
            attempt: 1,
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
            on_unknown_outcome: unknown,
            inquire_after: Duration::ZERO,
        };
        store.claim(&request).await.unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_lives_its_length_then_lapses_into_held_or_a_takeover() {
        let store = MemoryStore::new(16);
        for (unknown, name) in [(UnknownOutcome::Hold, "h"), (UnknownOutcome::Release, "t")] {
            let key = key(name);
            let Claim::Claimed { token, .. } = claim(&store, &key, unknown).await else {
                panic!("a fresh key is claimed");
            };
            tokio::time::advance(Duration::from_secs(29)).await;
            assert_eq!(
                claim(&store, &key, unknown).await,
                Claim::InFlight {
                    retry_after: Duration::from_secs(1),
                    expires_in: Duration::from_secs(3600 - 29),
                }
            );
            tokio::time::advance(Duration::from_secs(1)).await;
            let lapsed = claim(&store, &key, unknown).await;
            match unknown {
                UnknownOutcome::Hold => {
                    assert_eq!(
                        lapsed,
                        Claim::Held {
                            reason: HeldReason::LeaseLapsed,
                            expires_in: Duration::from_secs(3600 - 30),
                        }
                    );
                }
                UnknownOutcome::Release => {
                    assert!(
                        matches!(lapsed, Claim::Claimed { token: t, takeover: true } if t > token)
                    );
                    // The first attempt is fenced by the takeover.
                    assert_eq!(store.release(&key, token).await.unwrap(), Cas::Fenced);
                }
                UnknownOutcome::Inquire => unreachable!("not among the cases"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewed_lease_outlives_retention_and_a_record_expires_after_it() {
        let store = MemoryStore::new(16);
        let key = key("k");
        let request = ClaimRequest {
            key: &key,
            fingerprint: &[1; 32],
            attempt: 2,
            lease: Duration::from_secs(10),
            retention: Duration::from_secs(5),
            on_unknown_outcome: UnknownOutcome::Hold,
            inquire_after: Duration::ZERO,
        };
        let Ok(Claim::Claimed { token, .. }) = store.claim(&request).await else {
            panic!("a fresh key is claimed");
        };
        tokio::time::advance(Duration::from_secs(8)).await;
        // Past retention, but the lease is live: nothing sweeps it.
        assert_eq!(store.sweep(10).await.unwrap().records, 0);
        assert_eq!(
            store
                .renew(&key, token, Duration::from_secs(10))
                .await
                .unwrap(),
            Cas::Applied
        );
        let response = StoredResponse {
            status: http::StatusCode::CREATED,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::from_static(b"done"),
        };
        let retention = Duration::from_secs(60);
        let completed = store.complete(&key, token, &response, retention).await;
        assert_eq!(completed.unwrap(), Cas::Applied);
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(
            store.claim(&request).await.unwrap(),
            Claim::Replay(response)
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(store.sweep(10).await.unwrap().records, 1);
        assert!(matches!(
            store.claim(&request).await.unwrap(),
            Claim::Claimed {
                takeover: false,
                ..
            }
        ));
    }
}
