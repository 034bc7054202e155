//! The sealing wrapper: a [`Store`] that seals every response on its way
//! into the store it wraps (a completion, the handler's or the status
//! inquirer's) and opens it on its way out (a claim's replay), so every
//! backend keeps only sealed bytes and the gateway above sees responses
//! as they were. Whatever sits above it (the replay cache) holds opened
//! responses, in this process's memory only. Without keys it records
//! responses as they are, and still refuses a sealed one it finds (keys
//! removed from the configuration): never the envelope as a response.

use std::sync::Arc;
use std::time::Duration;

use super::codec::Codec;
use super::envelope::{self, Marking, OpenError};
use super::keyring::Keyring;
use crate::{
    AttemptId, Cas, Claim, ClaimRequest, HeldReason, RecordKey, Store, StoreError, StoredResponse,
    Token,
};

/// Called on every replay the wrapper opens: `Ok(Some(id))` for one
/// sealed under key id `id`, `Ok(None)` for a plain one, `Err` for one
/// that does not open (the gateway logs and counts them).
pub type OnOpen = Box<dyn Fn(&RecordKey, Result<Option<&str>, &OpenError>) + Send + Sync>;

/// A [`Store`] whose recorded responses are sealed under `[store]
/// encryption_keys`.
pub struct SealedStore {
    inner: Arc<dyn Store>,
    keys: Option<Arc<Keyring>>,
    compression: Option<Codec>,
    accept_plain: bool,
    on_open: OnOpen,
}

impl std::fmt::Debug for SealedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedStore")
            .field("keys", &self.keys)
            .field("compression", &self.compression)
            .field("accept_plain", &self.accept_plain)
            .finish_non_exhaustive()
    }
}

impl SealedStore {
    /// Seal `inner`'s records under `keys` (the first seals, every one
    /// opens; none: records stay plain); `compression`: the codec tried
    /// before sealing, kept where it saves bytes (none: never compressed).
    /// Opening reads whichever codec a record names, so it takes none.
    /// Plain records are replayed, unless keys are set and
    /// [`SealedStore::refusing_plain`] says otherwise.
    pub fn new(
        inner: Arc<dyn Store>,
        keys: Option<Arc<Keyring>>,
        compression: Option<Codec>,
        on_open: OnOpen,
    ) -> Self {
        Self {
            inner,
            keys,
            compression,
            accept_plain: true,
            on_open,
        }
    }

    /// Refuse plain records when keys are set (`[store]
    /// accept_plain_records = false`): a response planted unsealed in the
    /// store is never replayed. Without keys every record is plain, and
    /// replayed.
    pub fn refusing_plain(mut self, refuse: bool) -> Self {
        self.accept_plain = !refuse || self.keys.is_none();
        self
    }
}

#[async_trait::async_trait]
impl Store for SealedStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        match self.inner.claim(request).await? {
            Claim::Replay(stored) => {
                let marking = envelope::marking(&stored);
                let sealed_with = match &marking {
                    Marking::Sealed(id) => Some(id.clone()),
                    Marking::Plain | Marking::Malformed => None,
                };
                let opened = match (&self.keys, marking) {
                    (_, Marking::Malformed) => {
                        Err(OpenError::Unauthentic(envelope::MALFORMED_ID.into()))
                    }
                    (_, Marking::Plain) if !self.accept_plain => Err(OpenError::Plain),
                    (Some(keys), _) => envelope::open(keys, request.key, stored),
                    (None, Marking::Sealed(id)) => Err(OpenError::UnknownKey(id)),
                    (None, Marking::Plain) => Ok(stored),
                };
                match opened {
                    Ok(response) => {
                        (self.on_open)(request.key, Ok(sealed_with.as_deref()));
                        Ok(Claim::Replay(response))
                    }
                    Err(error) => {
                        (self.on_open)(request.key, Err(&error));
                        Err(StoreError::Sealed(error))
                    }
                }
            }
            other => Ok(other),
        }
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
        let Some(keys) = &self.keys else {
            return self.inner.complete(key, token, response, retention).await;
        };
        let sealed = envelope::seal(keys, key, response, self.compression);
        self.inner.complete(key, token, &sealed, retention).await
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

    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError> {
        self.inner.abandon(key, attempt).await
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

    fn forget(&self, key: &RecordKey) {
        self.inner.forget(key);
    }
}
