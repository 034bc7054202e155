//! What one step of retention did ([`StoreAdmin::sweep`]): how many
//! records went, and whether another step may find more now.
//!
//! [`StoreAdmin::sweep`]: super::StoreAdmin::sweep

/// What one [`StoreAdmin::sweep`] step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Swept {
    /// Records that went (PostgreSQL's rotations: an estimate, since
    /// counting them would read the whole generation).
    pub records: u64,
    /// Another step may find more now.
    pub more: bool,
}

impl Swept {
    /// A step that deleted `records` of at most `batch`: a full batch may
    /// have left more.
    pub fn of_batch(records: u64, batch: usize) -> Self {
        Self {
            records,
            more: records >= batch as u64,
        }
    }
}
