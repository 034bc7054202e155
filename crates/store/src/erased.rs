//! One step of erasure ([`StoreAdmin::erase`]): what it asks for (a
//! route's records of one scope, at most so many, after where the last
//! step stopped) and what it did (the keys of the records it removed,
//! where the next step resumes and, once a step finds no more it may
//! remove, how many records of the scope the route still holds); or, when
//! the store failed, why, with the keys of the records removed before the
//! failure, which stay removed and are counted ([`EraseStepFailed`]).
//!
//! The cursor matters where a scope's records are one range of an index
//! in key order (PostgreSQL, SQLite): a step that began at the range's
//! start would read again what earlier steps passed over, the records
//! they kept (a live lease, without force) and, on PostgreSQL, the index
//! entries of the records they removed, until vacuum may reclaim them
//! (never, under a long-lived snapshot): each step longer than the last,
//! the whole erasure quadratic in the scope's size. Resumed after the
//! last key removed, each step reads its own part of the range once.
//!
//! [`StoreAdmin::erase`]: super::StoreAdmin::erase

use super::StoreError;

/// What one [`StoreAdmin::erase`](super::StoreAdmin::erase) step removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EraseStep<'a> {
    /// The route's name.
    pub route: &'a str,
    /// The scope's digest (not empty: never an unscoped record).
    pub scope: &'a [u8],
    /// Also records the upstream may still be working on.
    pub force: bool,
    /// At most this many.
    pub limit: usize,
    /// Resume after this key: the previous step's [`Erased::last`]; none
    /// at first. A store that does not read a scope in key order (Redis,
    /// memory) ignores it.
    pub after: Option<&'a str>,
}

/// What one [`StoreAdmin::erase`](super::StoreAdmin::erase) step did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Erased {
    /// The keys of the records removed (at most the step's `limit`).
    pub keys: Vec<String>,
    /// When fewer than `limit` went (the last step): how many records of
    /// the scope the route still holds, those the upstream may still be
    /// working on (kept without `force`) and any claimed since. Zero
    /// after a full step.
    pub left: u64,
    /// Where the next step resumes ([`EraseStep::after`]): the greatest
    /// key removed, in the store's order, by a store that reads a scope
    /// in key order; none from the others, and from a step that removed
    /// nothing. The keys it passed over and kept are behind it: a step
    /// never reads them again (nor a key removed and claimed again behind
    /// it, which `left` counts).
    pub last: Option<String>,
}

impl Erased {
    /// The step of a store that reads a scope in key order: `keys`, the
    /// records it removed in the store's order, whose last is where the
    /// next step resumes; `left` still to count.
    pub(crate) fn in_key_order(keys: Vec<String>) -> Self {
        Self {
            last: keys.last().cloned(),
            keys,
            left: 0,
        }
    }

    /// Whether another step may find more to remove: this one was full.
    pub fn more(&self, limit: usize) -> bool {
        self.keys.len() >= limit
    }
}

/// A [`StoreAdmin::erase`](super::StoreAdmin::erase) step the store failed
/// in: why, and the keys of the records it had removed by then (a step of
/// several statements or scripts: PostgreSQL's count after its delete, a
/// Redis Cluster's buckets, the front's fences after PostgreSQL). They
/// stay removed: the caller counts them and forgets them as it does a
/// step's. A failure before anything was removed converts from its
/// [`StoreError`] (`?`).
#[derive(Debug, thiserror::Error)]
#[error("an erasure step failed after removing {} records", removed.len())]
pub struct EraseStepFailed {
    /// The keys of the records removed before the failure.
    pub removed: Vec<String>,
    /// Why it failed.
    #[source]
    pub source: StoreError,
}

impl From<StoreError> for EraseStepFailed {
    fn from(source: StoreError) -> Self {
        Self {
            removed: Vec::new(),
            source,
        }
    }
}
