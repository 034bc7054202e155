//! Who waits for a claim, and why a queued claim is shed unsent.
//!
//! A claim waits in a store's queue (PostgreSQL's batches:
//! crates/store/src/postgres/batch.rs) until a batch takes it. Two claims
//! are not worth sending then: one that waited longer than `[store]
//! claim_queue_budget` (its client is likely to time out, and sending it
//! only lengthens the queue), and one whose requester has left. Either is
//! answered [`StoreError::Shed`](crate::StoreError::Shed) and never sent:
//! nothing is written, so its key stays free.
//!
//! The requester is known by a [`CancellationToken`] the gateway cancels
//! when the request's handler is dropped (its client went away), carried to
//! the store with the claim's future ([`on_behalf_of`]) so that no
//! [`Store`](crate::Store) signature changes. A claim made outside such a
//! scope has no requester to lose. Once a claim is sent, its requester
//! leaving changes nothing (G6).

use std::future::Future;

pub use tokio_util::sync::CancellationToken;

tokio::task_local! {
    static REQUESTER: CancellationToken;
}

/// Why a queued claim was shed unsent (`idemgate_store_claims_shed_total`'s
/// `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Shed {
    /// It waited in the queue longer than `[store] claim_queue_budget`.
    #[error("it waited in the queue longer than [store] claim_queue_budget")]
    QueueBudget,
    /// Its requester left before it was sent.
    #[error("its requester left before it was sent")]
    CallerGone,
}

impl Shed {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Shed::QueueBudget => "queue_budget",
            Shed::CallerGone => "caller_gone",
        }
    }
}

/// Run `work` (a claim and what follows it) for the requester `gone`
/// stands for: a claim it makes that is still queued when `gone` is
/// cancelled is shed, never sent.
pub async fn on_behalf_of<F: Future>(gone: CancellationToken, work: F) -> F::Output {
    REQUESTER.scope(gone, work).await
}

/// The requester of the claim being made now, if it runs
/// [`on_behalf_of`] one.
pub(crate) fn requester() -> Option<CancellationToken> {
    REQUESTER.try_with(CancellationToken::clone).ok()
}
