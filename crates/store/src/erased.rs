//! One step of erasure ([`StoreAdmin::erase`]): what it asks for (a
//! route's records of one scope, at most so many) and what it did (the
//! keys of the records it removed and, once a step finds no more it may
//! remove, how many records of the scope the route still holds).
//!
//! [`StoreAdmin::erase`]: super::StoreAdmin::erase

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
}

impl Erased {
    /// Whether another step may find more to remove: this one was full.
    pub fn more(&self, limit: usize) -> bool {
        self.keys.len() >= limit
    }
}
