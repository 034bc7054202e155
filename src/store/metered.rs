//! The metrics wrapper: a [`Store`] that measures every operation of the
//! store it wraps (`idemgate_store_duration_seconds{op, result}`), so no
//! backend carries metrics code.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;
use crate::metrics::{Metrics, plain_result};
use crate::store::{
    AttemptId, Cas, Claim, ClaimRequest, HeldReason, RecordKey, Store, StoreError, StoredResponse,
    Token,
};

/// A [`Store`] that measures every operation of the store it wraps.
pub struct InstrumentedStore {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for InstrumentedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstrumentedStore").finish_non_exhaustive()
    }
}

impl InstrumentedStore {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }
}

fn cas_result(r: &Result<Cas, StoreError>) -> &'static str {
    match r {
        Ok(Cas::Applied) => "ok",
        Ok(Cas::Fenced) => "fenced",
        Err(_) => "error",
    }
}

#[async_trait::async_trait]
impl Store for InstrumentedStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let started = Instant::now();
        let r = self.inner.claim(request).await;
        self.metrics
            .store_op("claim", plain_result(&r), started.elapsed());
        r
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: Token,
        lease: Duration,
    ) -> Result<Cas, StoreError> {
        let started = Instant::now();
        let r = self.inner.renew(key, token, lease).await;
        self.metrics
            .store_op("renew", cas_result(&r), started.elapsed());
        r
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: Token,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let started = Instant::now();
        let r = self.inner.complete(key, token, response, retention).await;
        self.metrics
            .store_op("complete", cas_result(&r), started.elapsed());
        r
    }

    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError> {
        let started = Instant::now();
        let r = self.inner.release(key, token).await;
        self.metrics
            .store_op("release", cas_result(&r), started.elapsed());
        r
    }

    async fn hold(
        &self,
        key: &RecordKey,
        token: Token,
        reason: HeldReason,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let started = Instant::now();
        let r = self.inner.hold(key, token, reason, retention).await;
        self.metrics
            .store_op("hold", cas_result(&r), started.elapsed());
        r
    }

    async fn inquire(
        &self,
        key: &RecordKey,
        token: Token,
        next: Duration,
        asked: bool,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let started = Instant::now();
        let r = self.inner.inquire(key, token, next, asked, retention).await;
        self.metrics
            .store_op("inquire", cas_result(&r), started.elapsed());
        r
    }

    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError> {
        let started = Instant::now();
        let r = self.inner.abandon(key, attempt).await;
        self.metrics
            .store_op("abandon", cas_result(&r), started.elapsed());
        r
    }

    fn forget(&self, key: &RecordKey) {
        self.inner.forget(key);
    }
}
