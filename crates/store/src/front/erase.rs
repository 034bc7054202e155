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
//!
//! Deleting before fencing is safe. Nothing of the front writes a record to
//! PostgreSQL (markers, the publisher, the relay and read-repair write them
//! to Redis only), so it cannot bring an erased row back. A write to the
//! front after the fence is refused while the fence lives (the ceiling
//! covers the removed record's token), and an entry written before it is
//! dropped by it: the front can replay an erased record only until its
//! step's fence, during the call, as PostgreSQL itself replays it until the
//! step's delete. Unless this process finds the front unusable or a fence
//! write fails (the step still succeeds): then the relay applies the
//! outbox's invalidations, after the call
//! (docs/src/operations/erasure.md#with-a-redis-front).

use super::FrontStore;
use crate::{EraseStep, EraseStepFailed, Erased, RecordKey, StoreAdmin};

impl FrontStore {
    /// [`StoreAdmin::erase`] on PostgreSQL, then the removed keys fenced:
    /// those of a step that failed midway too. A failure after PostgreSQL
    /// removed records keeps their keys: they are gone, and the outbox
    /// queued their invalidations with the delete.
    pub(super) async fn erase_and_fence(
        &self,
        step: &EraseStep<'_>,
    ) -> Result<Erased, EraseStepFailed> {
        let (erased, failed) = match self.inner.truth.erase(step).await {
            Ok(erased) => (erased, None),
            Err(EraseStepFailed { removed, source }) => (
                Erased {
                    keys: removed,
                    ..Erased::default()
                },
                Some(source),
            ),
        };
        let fenced = self.fence_erased(step, &erased.keys).await;
        match failed.or(fenced.err()) {
            None => Ok(erased),
            Some(source) => Err(EraseStepFailed {
                removed: erased.keys,
                source,
            }),
        }
    }

    /// Fence each of `removed` in the front under one ceiling, read after
    /// the delete: it covers every removed record's token.
    async fn fence_erased(
        &self,
        step: &EraseStep<'_>,
        removed: &[String],
    ) -> Result<(), crate::StoreError> {
        if removed.is_empty() || !self.inner.health.usable() {
            return Ok(());
        }
        let ceiling = self.inner.truth.token_ceiling().await?;
        let mut key = RecordKey {
            route: step.route.to_string(),
            scope: step.scope.to_vec(),
            key: String::new(),
        };
        for removed in removed {
            key.key.clone_from(removed);
            self.fence(&key, ceiling).await;
        }
        Ok(())
    }
}
