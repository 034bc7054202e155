//! Erasure on the front store (`keys erase`): the records go from
//! PostgreSQL, and the front forgets them.
//!
//! PostgreSQL first: its outbox trigger queues each deleted row's
//! invalidation for the relay, in the deleting transaction. Then every
//! removed key is fenced in the front under a token ceiling read after the
//! delete: no attempt issued until then, the removed record's included,
//! writes its entry again, and an entry shown there already is replaced,
//! so no instance replays an erased record from the front. (A front that
//! is down is brought in line by the relay before it is used again.)

use super::FrontStore;
use crate::{EraseStep, Erased, RecordKey, StoreAdmin, StoreError};

impl FrontStore {
    /// [`StoreAdmin::erase`] on PostgreSQL, then the removed keys fenced.
    pub(super) async fn erase_and_fence(&self, step: &EraseStep<'_>) -> Result<Erased, StoreError> {
        let erased = self.inner.truth.erase(step).await?;
        if !erased.keys.is_empty() && self.inner.health.usable() {
            // One ceiling for the step: read after the delete, it covers
            // every removed record's token.
            let ceiling = self.inner.truth.token_ceiling().await?;
            let mut key = RecordKey {
                route: step.route.to_string(),
                scope: step.scope.to_vec(),
                key: String::new(),
            };
            for removed in &erased.keys {
                key.key.clone_from(removed);
                self.fence(&key, ceiling).await;
            }
        }
        Ok(erased)
    }
}
