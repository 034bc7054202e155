//! The metrics wrapper: a [`Store`] that measures every operation of the
//! store it wraps (`idemgate_store_duration_seconds{op, result}`), so no
//! backend carries metrics code.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{Metrics, plain_result};
use crate::clock::Instant;
use crate::store::{
    AttemptId, Cas, Claim, ClaimRequest, HeldReason, RecordKey, Store, StoreError, StoredResponse,
    Token,
};
use crate::telemetry::spans;

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

    /// Run one operation: timed and counted by `result`, and in a span of
    /// its own (a child of the request's) when tracing is on.
    async fn measured<T>(
        &self,
        op: &'static str,
        work: impl Future<Output = Result<T, StoreError>>,
        result: fn(&Result<T, StoreError>) -> &'static str,
    ) -> Result<T, StoreError> {
        let span = spans::store(op);
        let started = Instant::now();
        let r = spans::traced!(work, span);
        if r.is_err() {
            spans::store_failed(&span);
        }
        self.metrics.store_op(op, result(&r), started.elapsed());
        r
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
        let work = self.inner.claim(request);
        self.measured("claim", work, plain_result).await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: Token,
        lease: Duration,
    ) -> Result<Cas, StoreError> {
        let work = self.inner.renew(key, token, lease);
        self.measured("renew", work, cas_result).await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: Token,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let work = self.inner.complete(key, token, response, retention);
        self.measured("complete", work, cas_result).await
    }

    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError> {
        let work = self.inner.release(key, token);
        self.measured("release", work, cas_result).await
    }

    async fn hold(
        &self,
        key: &RecordKey,
        token: Token,
        reason: HeldReason,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let work = self.inner.hold(key, token, reason, retention);
        self.measured("hold", work, cas_result).await
    }

    async fn inquire(
        &self,
        key: &RecordKey,
        token: Token,
        next: Duration,
        asked: bool,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let work = self.inner.inquire(key, token, next, asked, retention);
        self.measured("inquire", work, cas_result).await
    }

    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError> {
        let work = self.inner.abandon(key, attempt);
        self.measured("abandon", work, cas_result).await
    }

    fn forget(&self, key: &RecordKey) {
        self.inner.forget(key);
    }
}
