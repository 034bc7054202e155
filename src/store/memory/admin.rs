//! The memory store's administration: inspecting, listing, clearing and
//! deleting records, the sweeper, readiness, and the in-process wake-ups.

use super::*;

#[async_trait::async_trait]
impl StoreAdmin for MemoryStore {
    async fn relay_wakeups(&self, waiters: Arc<Waiters>) {
        // Every change happens in this process: announced where it happens.
        let _ = self.waiters.set(waiters);
    }

    async fn sweep(&self, batch: usize) -> Result<u64, StoreError> {
        Ok(self.lock().sweep(Instant::now(), batch))
    }

    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        Ok(self.lock().records.get(key).and_then(|r| r.info(key)))
    }

    async fn list(
        &self,
        route: &str,
        state: RecordState,
        limit: usize,
    ) -> Result<Vec<RecordInfo>, StoreError> {
        let inner = self.lock();
        let mut found: Vec<(Instant, RecordInfo)> = inner
            .records
            .iter()
            .filter(|(k, _)| k.route == route)
            .filter_map(|(k, r)| Some((r.updated_at, r.info(k)?)))
            .filter(|(_, info)| info.state == state)
            .collect();
        found.sort_by_key(|(updated, _)| *updated);
        Ok(found
            .into_iter()
            .take(limit)
            .map(|(_, info)| info)
            .collect())
    }

    async fn clear(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        Ok(self.remove_if(key, |_, phase| transitions::clearable(phase, force)))
    }

    async fn delete(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        Ok(self.remove_if(key, |_, phase| transitions::deletable(phase, force)))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
