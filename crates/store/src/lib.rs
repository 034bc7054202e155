//! The record store: one trait the handler depends on, the claim outcomes
//! (docs/src/design/pipeline.md, step 5) and the record states (docs/src/guide/record-states.md).
//!
//! Every transition after the claim is a compare-and-set on the attempt's
//! fencing token: an attempt whose token is no longer the record's current
//! one can never overwrite it (G7). Tokens come from one store-wide counter,
//! so they never repeat for a key, even after it was released or expired.

// A build with only some backends leaves helpers unused that the others
// share (lanes, batches, epoch conversions); the full build, which CI lints
// with warnings denied, still finds real dead code.
#![cfg_attr(
    not(all(
        feature = "postgres",
        feature = "redis",
        feature = "sqlite",
        feature = "memory",
        feature = "front"
    )),
    allow(dead_code, unused_imports)
)]

mod batch_queue;
mod cache;
pub mod caller;
mod config;
mod erased;
#[cfg(feature = "front")]
pub mod front;
mod headers;
mod info;
mod inquiry;
#[cfg(feature = "memory")]
pub mod memory;
mod open;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
pub mod runtime;
pub mod seal;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod stats;
mod swept;
pub mod waiters;

use std::sync::Arc;

use std::time::Duration;

use waiters::Waiters;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

pub use cache::OnHit;
pub use caller::Shed;
pub use config::{FrontConfig, InvalidStoreSetting, StoreConfig, WaitRoutes};
// The record's vocabulary and its rules live in the core crate; the store
// speaks it, and re-exports it for the backends and their users.
pub use erased::{EraseStep, EraseStepFailed, Erased};
pub use headers::{decode_headers, encode_headers};
pub use idemgate_core::{
    AttemptId, Cas, Fingerprint, HeldReason, RecordKey, RecordState, Token, UnknownOutcome,
    transitions,
};
pub use info::RecordInfo;
pub use inquiry::{InquiringRoute, Inquiry};
pub use open::{Migrated, migrate, open};
pub use stats::{BatchStats, FrontStats, PoolStats};
pub use swept::Swept;

/// A fresh attempt id: random, never zero.
pub fn new_attempt_id() -> AttemptId {
    loop {
        let id = fastrand::i64(..);
        if id != 0 {
            return id;
        }
    }
}

/// Everything a claim needs to decide.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The key.
    pub key: &'a RecordKey,
    /// The request's fingerprint.
    pub fingerprint: &'a Fingerprint,
    /// The attempt's id, written with the claim.
    pub attempt: AttemptId,
    /// How long the claimed attempt owns the key without renewing.
    pub lease: Duration,
    /// How long the record lives: at least `lease` (configuration refuses
    /// a route with less; on Redis, whose records expire by their TTL, a
    /// renewal that shortens a longer lease would leave the record until
    /// that lease's end).
    pub retention: Duration,
    /// What a lapsed lease found by this claim turns into.
    pub on_unknown_outcome: UnknownOutcome,
    /// On a route that inquires, its `[routes.inquiry] after`: a lapsed
    /// lease's first question is due this long past the lapse
    /// ([`transitions::lapsed_question_in`]). Zero elsewhere.
    pub inquire_after: Duration,
}

/// A recorded upstream response, replayed byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The upstream's status.
    pub status: StatusCode,
    /// The replayable headers, in order.
    pub headers: HeaderMap,
    /// The body bytes.
    pub body: Bytes,
}

impl StoredResponse {
    /// Bytes of its body and its headers' names and values.
    pub fn size(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len())
            .sum();
        self.body.len() + headers
    }

    /// From a store's fields: the status as stored (a number), the headers
    /// as [`encode_headers`] wrote them, the body.
    pub fn from_fields(
        status: Option<i64>,
        headers: &[u8],
        body: Vec<u8>,
    ) -> Result<Self, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt(format!("a recorded response with {what}"));
        Ok(Self {
            status: status
                .and_then(|s| u16::try_from(s).ok())
                .and_then(|s| StatusCode::from_u16(s).ok())
                .ok_or_else(|| corrupt("a bad status"))?,
            headers: decode_headers(headers).ok_or_else(|| corrupt("undecodable headers"))?,
            body: Bytes::from(body),
        })
    }
}

/// The outcome of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This request owns the key and may forward.
    Claimed {
        /// Its fencing token.
        token: Token,
        /// It took over a lapsed attempt (`on_unknown_outcome = "release"`).
        takeover: bool,
    },
    /// A response is recorded: replay it.
    Replay(StoredResponse),
    /// Another attempt holds a live lease.
    InFlight {
        /// Time left on that lease.
        retry_after: Duration,
        /// Time left before the record expires (as far as the store knows
        /// now: its completion starts a new retention).
        expires_in: Duration,
    },
    /// The key was used with a different request.
    Mismatch {
        /// Time left before the record (the other request's) expires.
        expires_in: Duration,
    },
    /// The outcome is unknown or the response was not retained.
    Held {
        /// Why.
        reason: HeldReason,
        /// Time left before the record expires.
        expires_in: Duration,
    },
    /// The outcome is unknown and the gateway is asking the upstream
    /// (docs/src/guide/status-inquiry.md).
    Inquiring {
        /// Time until the next question (zero: due now).
        retry_after: Duration,
        /// Time left before the record expires (as far as the store knows
        /// now: the upstream's answer starts a new retention).
        expires_in: Duration,
    },
}

/// A store failure. Everything the handler sees is one of these.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or did not answer in time.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The write applied on the primary, but fewer replicas than `[store]
    /// replicas` acknowledged it: not an outage, so it never fails open.
    #[error("the store's replicas did not acknowledge the write: {0}")]
    NotReplicated(String),
    /// The store refused a claim that reached it after the instant it had
    /// to run by (Redis: `transitions::claim_write_limit`). Its caller
    /// normally gave up long before, so one seen means the server's clock
    /// is ahead of the gateway's: a misconfiguration, so it never fails
    /// open, and nothing was written, so it is no lost claim.
    #[error("the store refused a claim that reached it too late: {0}")]
    LateClaim(String),
    /// The claim was taken off the store's queue and never sent
    /// ([`Shed`]): nothing was written, so the key stays free and it is no
    /// lost claim; the gateway answers `503` overloaded, never failing open.
    #[error("the store shed a claim unsent: {0}")]
    Shed(Shed),
    /// The store answered with something idemgate cannot read.
    #[error("store returned an unreadable record: {0}")]
    Corrupt(String),
    /// A sealed response did not open ([`seal`]): its key is no longer
    /// configured, or it was not sealed for this record. Never an outage:
    /// the request is answered with a problem, never forwarded.
    #[error(transparent)]
    Sealed(seal::OpenError),
    /// Applying migrations failed.
    #[error("store migration failed: {0}")]
    Migration(String),
    /// The database lacks migrations this build needs.
    #[error("store is not migrated: {0}; run `idemgate migrate` (or set [store] migrate = true)")]
    NotMigrated(String),
    /// The in-memory store holds `max_records` live records already.
    #[error(
        "the in-memory store is full ({0} records); raise [store] max_records or use PostgreSQL"
    )]
    Full(usize),
    /// The store URL names no backend idemgate has.
    #[error("unsupported store URL {0:?}: use postgres://, redis://, sqlite:// or memory://")]
    UnsupportedUrl(String),
    /// The store URL names a backend this build left out (a build with
    /// `--no-default-features` and only some store features).
    #[error(
        "this idemgate was built without the `{feature}` store, which {url:?} needs: \
         build it with `--features {feature}` (the default build has every store)"
    )]
    NotBuilt {
        /// The URL, redacted.
        url: String,
        /// The cargo feature that brings the backend.
        feature: &'static str,
    },
}

impl StoreError {
    /// Whether the store may answer otherwise if asked again (an outage):
    /// not a record it cannot read or open, which stays as it is.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::NotReplicated(_))
    }
}

/// The request path of a record store shared by every gateway instance:
/// the claim and the transitions of a claimed attempt. Wrappers (metrics,
/// the replay cache) implement this trait only.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Atomically claim a key, or report why it cannot be claimed.
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError>;
    /// Extend an in-flight attempt's lease.
    async fn renew(
        &self,
        key: &RecordKey,
        token: Token,
        lease: Duration,
    ) -> Result<Cas, StoreError>;
    /// Record the response (`in_flight` → `completed`).
    async fn complete(
        &self,
        key: &RecordKey,
        token: Token,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Cas, StoreError>;
    /// Forget an in-flight attempt so the next request forwards again.
    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError>;
    /// Mark the key `held`: never forwarded again until released or expired.
    async fn hold(
        &self,
        key: &RecordKey,
        token: Token,
        reason: HeldReason,
        retention: Duration,
    ) -> Result<Cas, StoreError>;
    /// Remove the record of an attempt whose claim's answer was lost (a
    /// timeout or a cut connection): its request was never forwarded, so
    /// its key must not stay in flight, and must not turn `held` when the
    /// lease lapses. Applies only while the record is still that attempt's
    /// and in flight, or held only because its lease lapsed
    /// ([`transitions::abandon_applies`]).
    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError>;
    /// The outcome is unknown: turn the key `inquiring`, with its next
    /// question `next` from now (`in_flight` or `inquiring` → `inquiring`,
    /// [`transitions::write_applies`]). `asked`: a question was just asked
    /// and answered without settling the key (it counts). The record is
    /// kept at least `retention` from now: an inquiry, shorter than
    /// retention, never outlives its record.
    async fn inquire(
        &self,
        key: &RecordKey,
        token: Token,
        next: Duration,
        asked: bool,
        retention: Duration,
    ) -> Result<Cas, StoreError>;
    /// Drop whatever this layer remembers of `key`, after key administration
    /// removed its record. Backends remember nothing; wrappers that cache
    /// records drop them, and wrappers forward the call.
    fn forget(&self, _key: &RecordKey) {}
    /// A replay this layer can give at once, without a store round trip
    /// (the replay cache): the recorded response if `key`'s record is
    /// known completed under `fingerprint`, else `None` (ask
    /// [`Store::claim`]). Nothing is written either way, so the gateway
    /// answers it on the request's own task. Backends have none; wrappers
    /// that cache records answer from their cache. A wrapper that changes
    /// responses on their way out (sealing) must never pass this through
    /// from below it: it would hand out what the store keeps (the sealed
    /// envelope); it answers `None`, the default.
    fn replay_at_hand(
        &self,
        _key: &RecordKey,
        _fingerprint: &Fingerprint,
    ) -> Option<StoredResponse> {
        None
    }
}

/// The administration side of a record store: key administration,
/// sweeping and health. Operators and background tasks use it, never the
/// request path; backends implement it, wrappers do not.
#[async_trait::async_trait]
pub trait StoreAdmin: Send + Sync + 'static {
    /// Wake `waiters` for every record that leaves `in_flight` — completed,
    /// held, released, abandoned or deleted, by any instance — until the
    /// future is dropped (docs/src/design/decisions.md). A store that announces
    /// changes where they happen (memory) returns at once.
    async fn relay_wakeups(&self, waiters: Arc<Waiters>);
    /// One record, if present (an expired one until it is swept).
    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError>;
    /// The response a completed record holds, as the store keeps it
    /// (sealed, if it was): `keys show` opens a sealed one to tell its
    /// real status and size ([`RecordInfo::with_recorded`]). `None`: no
    /// record, or none completed.
    async fn recorded(&self, key: &RecordKey) -> Result<Option<StoredResponse>, StoreError>;
    /// Up to `limit` records of a route in one state, least recently changed first.
    async fn list(
        &self,
        route: &str,
        state: RecordState,
        limit: usize,
    ) -> Result<Vec<RecordInfo>, StoreError>;
    /// Remove a `held` or `inquiring` record, or an `in_flight` one whose
    /// lease has lapsed, so the next request with the key is forwarded. One
    /// the upstream may still be working on (a live lease, an inquiry
    /// inside its route's `after`) is removed only with `force`; a
    /// completed record never ([`transitions::clearable`]).
    async fn clear(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError>;
    /// Remove a record in any state; one the upstream may still be working
    /// on only with `force` ([`transitions::deletable`]).
    async fn delete(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError>;
    /// One step of erasure (`keys erase`): remove up to `step.limit`
    /// records of `step.route` whose scope digest is `step.scope`, found
    /// through an index on the route and scope, never a scan of the store;
    /// one the upstream may still be working on only with `step.force`
    /// ([`transitions::deletable`], as `delete`). Call again while
    /// [`Erased::more`], each step after the last one's [`Erased::last`]
    /// ([`EraseStep::after`]); the last step counts what is left. A step
    /// that fails after removing records says which
    /// ([`EraseStepFailed::removed`]).
    async fn erase(&self, step: &EraseStep<'_>) -> Result<Erased, EraseStepFailed>;
    /// One step of retention: delete up to `batch` expired records, or
    /// (PostgreSQL) retire the previous generation once the current one is
    /// `[store] generation` old (crates/store/src/postgres/generations.rs).
    async fn sweep(&self, batch: usize) -> Result<Swept, StoreError>;
    /// Take up to `limit` keys of `routes` whose question is due: an
    /// `inquiring` record whose next question has come (or whose inquirer's
    /// lease lapsed), or an `in_flight` one whose lease lapsed. Each taken
    /// record gets a new token and a lease of `lease`, so one instance asks
    /// at a time and a stale inquirer's writes are fenced
    /// ([`transitions::take_applies`]); one that starts its inquiry here is
    /// kept at least its route's retention from now.
    async fn take_inquiries(
        &self,
        routes: &[InquiringRoute],
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Inquiry>, StoreError>;
    /// How many keys of `routes` are `inquiring`, whichever instance asks
    /// (`idemgate_inquiries_pending`, each inquirer tick: an index's read).
    async fn count_inquiring(&self, routes: &[InquiringRoute]) -> Result<u64, StoreError>;
    /// Readiness: the store answers and (where it has a schema) is migrated.
    async fn ping(&self) -> Result<(), StoreError>;
    /// Test builds only (the `test-hooks` feature): move every instant of
    /// `key`'s record `by` into the past (its lease or next question, its
    /// retention, the lapse its inquiry is reckoned from, its timestamps),
    /// as if `by` had passed for it alone; a record whose retention that
    /// ends is gone as it would be by then. Lets a test move time without
    /// sleeping (tests/it/stores/differential/). `false`: no record.
    #[cfg(feature = "test-hooks")]
    async fn age(&self, key: &RecordKey, by: Duration) -> Result<bool, StoreError>;
    /// Called once on each serving thread before the gateway serves: a
    /// store that keeps a connection per serving thread (Redis) opens this
    /// thread's now, so no request waits behind its connect, and a request
    /// sent while the store is frozen is on the wire ahead of any later
    /// retry. A failure is left for the thread's first request to find.
    /// `threads`: how many serving threads there are (PostgreSQL splits
    /// its lanes' sizes by it).
    async fn open_serving_thread(&self, _threads: usize) {}
    /// After a graceful stop, once nothing uses the store any more: write
    /// out what must be and let go of files and connections (SQLite
    /// checkpoints its log and closes, leaving no `-wal`/`-shm` files).
    async fn close(&self) {}
    /// The connection pool's occupancy, for stores that have one.
    fn pool_stats(&self) -> Option<PoolStats> {
        None
    }
    /// What the store's batching has done, for stores that batch.
    fn batch_stats(&self) -> Option<BatchStats> {
        None
    }
    /// What a Redis front has done, for the front store.
    fn front_stats(&self) -> Option<FrontStats> {
        None
    }
    /// How often the store was found to have lost every record since this
    /// instance last connected, for stores that look (Redis on one server
    /// or under Sentinel).
    fn data_losses(&self) -> Option<u64> {
        None
    }
}

/// A backend: both sides of one store. [`open`] returns one; its request
/// path is wrapped (metrics, replay cache) and its administration side is
/// used as it is.
pub trait Backend: Store + StoreAdmin {}

impl<T: Store + StoreAdmin> Backend for T {}

/// Put the replay cache ([`cache::CachedStore`]) in front of a shared store,
/// if configured; `on_hit` is called on every claim it answers. The in-memory store needs none: it is memory already.
pub fn with_replay_cache(
    store: Arc<dyn Store>,
    config: &StoreConfig,
    on_hit: cache::OnHit,
) -> Arc<dyn Store> {
    let off = config.replay_cache_ttl.is_zero() || config.replay_cache_size == 0;
    if off || config.url.starts_with("memory:") {
        return store;
    }
    Arc::new(cache::CachedStore::new(
        store,
        config.replay_cache_ttl,
        config.replay_cache_size,
        on_hit,
    ))
}

/// Put the sealing wrapper ([`seal::SealedStore`]) over the request path:
/// below the replay cache ([`with_replay_cache`]), so the cache holds
/// opened responses in memory and the store only sealed ones. Without
/// `[store] encryption_keys` it records plain responses and still refuses
/// a sealed one (keys removed) rather than replay its envelope. `on_open`
/// is called on every replay.
pub fn with_sealing(
    store: Arc<dyn Store>,
    config: &StoreConfig,
    on_open: seal::OnOpen,
) -> Arc<dyn Store> {
    Arc::new(
        seal::SealedStore::new(
            store,
            config.encryption_keys.clone(),
            config.compress.then_some(config.compression),
            on_open,
        )
        .refusing_plain(!config.accept_plain_records),
    )
}

/// A store URL fit for logs and errors: the password replaced by `***`.
pub fn redact_url(url: &str) -> String {
    if let Ok(mut parsed) = url::Url::parse(url) {
        if parsed.password().is_some() {
            let _ = parsed.set_password(Some("***"));
        }
        if parsed.query_pairs().any(|(name, _)| name == "password") {
            let pairs: Vec<(String, String)> = parsed
                .query_pairs()
                .map(|(name, value)| {
                    let value = if name == "password" {
                        "***".into()
                    } else {
                        value
                    };
                    (name.into_owned(), value.into_owned())
                })
                .collect();
            parsed.query_pairs_mut().clear().extend_pairs(pairs);
        }
        return parsed.to_string();
    }
    // A host list (`postgres://h1,h2/db`, `redis+sentinel://s1,s2/m`) is
    // no URL to the url crate: everything before the last `@` but the user
    // is hidden, and so is a `password=` parameter. Anything else that
    // cannot be read is not shown at all.
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<unparseable url>".to_string();
    };
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((userinfo, rest)) => (Some(userinfo), rest),
        None => (None, rest),
    };
    if rest.contains('#') || !rest.is_ascii() {
        return "<unparseable url>".to_string();
    }
    let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
    let query: Vec<String> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some(("password", _)) => "password=***".to_string(),
            _ => pair.to_string(),
        })
        .collect();
    let user = match userinfo {
        Some(info) => match info.split_once(':') {
            Some((user, _)) => format!("{user}:***@"),
            None => format!("{info}@"),
        },
        None => String::new(),
    };
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{}", query.join("&"))
    };
    format!("{scheme}://{user}{hosts}{query}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_hides_only_the_password() {
        assert_eq!(
            redact_url("postgres://u:secret@db:5432/x"),
            "postgres://u:***@db:5432/x"
        );
        assert_eq!(redact_url("postgres://u@db/x"), "postgres://u@db/x");
        assert!(!redact_url("post gres://u:secret@").contains("secret"));
        // Host lists, which the url crate cannot parse.
        assert_eq!(
            redact_url("redis+sentinel://:p%40ss@s1:26379,s2:26379/mymaster?db=1"),
            "redis+sentinel://:***@s1:26379,s2:26379/mymaster?db=1"
        );
        assert_eq!(redact_url("postgres://u@h1,h2/db"), "postgres://u@h1,h2/db");
        // Separators inside the password, and a password parameter.
        for url in [
            "postgres://u:se/cr3t@h1:1,h2:2/db",
            "postgres://u:se?cr3t@h1,h2/db",
            "postgres://u:se#cr3t@h1,h2/db",
            "postgres://u:se@cr3t@h1,h2/db",
            "postgres://h1,h2/db?user=u&password=secr3t&sslmode=require",
        ] {
            let shown = redact_url(url);
            assert!(!shown.contains("cr3t"), "{url} → {shown}");
        }
        assert_eq!(
            redact_url("postgres://h1,h2/db?password=x&sslmode=require"),
            "postgres://h1,h2/db?password=***&sslmode=require"
        );
    }
}
