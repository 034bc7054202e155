//! The replay cache: a per-instance, size-bounded cache of completed records
//! in front of a shared store (PostgreSQL or Redis), so that a replay costs
//! no store round trip once this instance has replayed the key before.
//!
//! It is sound because a completed record never changes: it is only ever
//! replayed (same fingerprint) or refused (`422`, another fingerprint) until
//! it expires or an operator deletes it. Only replays come from the cache:
//! another body goes to the store, whose `422` says when the record
//! expires, and any answer but a replay or a `422` drops the key's entry
//! (the record was deleted elsewhere and the key claimed anew). Each entry lives at most
//! `min([store] replay_cache_ttl, the route's retention)` from when the store
//! last confirmed it, so the cache can answer for a record that another
//! process deleted (`idemgate keys delete`), or that just passed its
//! retention, for at most that long. Deletes made through this instance
//! (its admin listener) drop the entry at once ([`Store::forget`]). Only
//! the claim is served from the cache; every other operation goes straight
//! to the store.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use quick_cache::Weighter;
use quick_cache::sync::Cache;

use super::{
    AttemptId, Cas, Claim, ClaimRequest, HeldReason, RecordKey, Store, StoreError, StoredResponse,
    Token,
};
use crate::Fingerprint;

/// Called on every claim answered from the cache (the gateway counts them).
pub type OnHit = Box<dyn Fn() + Send + Sync>;

/// A completed record as the store last confirmed it.
#[derive(Clone)]
struct Entry {
    fingerprint: Fingerprint,
    response: StoredResponse,
    /// Past this instant the entry is not used.
    until: Instant,
    /// Approximate bytes held, for the size bound.
    weight: u64,
}

#[derive(Clone)]
struct BySize;

impl Weighter<RecordKey, Entry> for BySize {
    fn weight(&self, _key: &RecordKey, entry: &Entry) -> u64 {
        entry.weight
    }
}

/// Bytes an entry holds, roughly: body, headers, key, and fixed overhead.
fn weight(key: &RecordKey, response: &StoredResponse) -> u64 {
    let header_overhead = 32 * response.headers.len();
    (response.size() + header_overhead + key.route.len() + key.scope.len() + key.key.len() + 160)
        as u64
}

/// A [`Store`] that answers claims on recently replayed completed records
/// from memory.
pub(super) struct CachedStore {
    inner: Arc<dyn Store>,
    cache: Cache<RecordKey, Entry, BySize>,
    ttl: Duration,
    hits: OnHit,
}

impl CachedStore {
    /// Cache up to `max_bytes` of completed records for up to `ttl` each;
    /// `hits` counts the claims answered from the cache.
    pub(super) fn new(inner: Arc<dyn Store>, ttl: Duration, max_bytes: u64, hits: OnHit) -> Self {
        // quick_cache sizes its tables from an estimate of the entry count.
        let estimated_entries = (max_bytes / 2048).clamp(16, 1 << 20) as usize;
        Self {
            inner,
            cache: Cache::with_weighter(estimated_entries, max_bytes, BySize),
            ttl,
            hits,
        }
    }

    fn cached(&self, key: &RecordKey, fingerprint: &Fingerprint) -> Option<StoredResponse> {
        let entry = self.cache.get(key)?;
        if entry.until <= Instant::now() {
            self.cache.remove(key);
            return None;
        }
        // Another request under the key goes to the store, whose `422`
        // says when the record expires (the entry does not know).
        if entry.fingerprint != *fingerprint {
            return None;
        }
        (self.hits)();
        Some(entry.response)
    }
}

#[async_trait::async_trait]
impl Store for CachedStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        if let Some(response) = self.cached(request.key, request.fingerprint) {
            return Ok(Claim::Replay(response));
        }
        let claim = self.inner.claim(request).await?;
        if !matches!(claim, Claim::Replay(_) | Claim::Mismatch { .. }) {
            // The store has moved on from the cached record (deleted
            // elsewhere, the key claimed anew): its replays come from the
            // store again. (A 422 is the record still there.)
            self.cache.remove(request.key);
        }
        if let Claim::Replay(response) = &claim {
            // A replay means the record's fingerprint is this request's.
            let life = self.ttl.min(request.retention);
            self.cache.insert(
                request.key.clone(),
                Entry {
                    fingerprint: *request.fingerprint,
                    response: response.clone(),
                    until: Instant::now() + life,
                    weight: weight(request.key, response),
                },
            );
        }
        Ok(claim)
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: Token,
        lease: Duration,
    ) -> Result<Cas, StoreError> {
        self.inner.renew(key, token, lease).await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: Token,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        self.inner.complete(key, token, response, retention).await
    }

    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError> {
        self.inner.release(key, token).await
    }

    async fn hold(
        &self,
        key: &RecordKey,
        token: Token,
        reason: HeldReason,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        self.inner.hold(key, token, reason, retention).await
    }

    async fn inquire(
        &self,
        key: &RecordKey,
        token: Token,
        next: Duration,
        asked: bool,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        self.inner.inquire(key, token, next, asked, retention).await
    }

    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError> {
        self.inner.abandon(key, attempt).await
    }

    fn replay_at_hand(&self, key: &RecordKey, fingerprint: &Fingerprint) -> Option<StoredResponse> {
        self.cached(key, fingerprint)
    }

    fn forget(&self, key: &RecordKey) {
        // After the administrative delete: a claim racing it may have
        // cached the record. (A completed record is never cleared, so
        // `keys release` needs this only for the race.)
        self.cache.remove(key);
        self.inner.forget(key);
    }
}
