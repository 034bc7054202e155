//! The memory store's administration: inspecting, listing, clearing and
//! deleting records, the sweeper, readiness, and the in-process wake-ups.

use super::*;

#[async_trait::async_trait]
impl StoreAdmin for MemoryStore {
    async fn relay_wakeups(&self, waiters: Arc<Waiters>) {
        // Every change happens in this process: announced where it happens.
        let _ = self.waiters.set(waiters);
    }

    async fn sweep(&self, batch: usize) -> Result<Swept, StoreError> {
        let records = self.lock().sweep(Instant::now(), batch);
        Ok(Swept::of_batch(records, batch))
    }

    async fn take_inquiries(
        &self,
        routes: &[InquiringRoute],
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Inquiry>, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        let route = |key: &RecordKey| {
            let retention = InquiringRoute::retention_of(routes, &key.route)?;
            Some((retention, InquiringRoute::after_of(routes, &key.route)?))
        };
        let due: Vec<(RecordKey, Duration, Duration)> = inner
            .records
            .iter()
            .filter(|(_, r)| !r.expired(now))
            .filter_map(|(k, r)| {
                let (retention, after) = route(k)?;
                transitions::take_applies(r.phase(now), r.lapsed_for(now), after)
                    .then(|| (k.clone(), retention, after))
            })
            .take(limit)
            .collect();
        let mut taken = Vec::with_capacity(due.len());
        for (key, retention, after) in due {
            let token = inner.next_token();
            let record = inner.records.get_mut(&key).expect("listed above");
            if matches!(record.state, State::InFlight { .. }) {
                // Reckoned from the lapse, as a claim would have.
                record.inquire_lapsed(now, after, retention);
            }
            record.inquire(now, lease, false, retention);
            record.token = token;
            record.updated_at = now;
            let State::Inquiring { asked, since, .. } = record.state else {
                unreachable!("just turned inquiring")
            };
            taken.push(Inquiry {
                key,
                token,
                asked,
                inquiring_for: now - since,
            });
        }
        drop(inner);
        // A lapsed in-flight record left `in_flight`: its waiters re-claim.
        for inquiry in &taken {
            self.announce(&inquiry.key);
        }
        Ok(taken)
    }

    async fn count_inquiring(&self, routes: &[InquiringRoute]) -> Result<u64, StoreError> {
        let now = Instant::now();
        let inner = self.lock();
        let n = inner
            .records
            .iter()
            .filter(|(k, r)| {
                matches!(r.state, State::Inquiring { .. })
                    && !r.expired(now)
                    && routes.iter().any(|route| route.name == k.route)
            })
            .count();
        Ok(n as u64)
    }

    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        Ok(self.lock().records.get(key).and_then(|r| r.info(key)))
    }

    async fn recorded(&self, key: &RecordKey) -> Result<Option<StoredResponse>, StoreError> {
        Ok(match self.lock().records.get(key).map(|r| &r.state) {
            Some(State::Completed(response)) => Some(response.clone()),
            _ => None,
        })
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
        Ok(self.remove_if(key, |r, phase| {
            transitions::clearable(phase, r.asked(), force)
        }))
    }

    async fn delete(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        Ok(self.remove_if(key, |r, phase| {
            transitions::deletable(phase, r.asked(), force)
        }))
    }

    async fn erase(&self, step: &EraseStep<'_>) -> Result<Erased, EraseStepFailed> {
        // The map has no order: there is no cursor to resume at.
        let EraseStep {
            route,
            scope,
            force,
            limit,
            after: _,
        } = *step;
        // A scan, bounded by `max_records`: the map is the only index.
        let now = Instant::now();
        let mut inner = self.lock();
        let of_scope = |k: &RecordKey| k.route == route && k.scope == scope;
        let gone: Vec<RecordKey> = inner
            .records
            .iter()
            .filter(|(k, r)| of_scope(k) && transitions::deletable(r.phase(now), r.asked(), force))
            .map(|(k, _)| k.clone())
            .take(limit)
            .collect();
        for key in &gone {
            inner.records.remove(key);
        }
        let mut erased = Erased {
            keys: gone.iter().map(|k| k.key.clone()).collect(),
            ..Erased::default()
        };
        if !erased.more(limit) {
            erased.left = inner.records.keys().filter(|k| of_scope(k)).count() as u64;
        }
        drop(inner);
        for key in &gone {
            self.announce(key);
        }
        Ok(erased)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    #[cfg(feature = "test-hooks")]
    async fn age(&self, key: &RecordKey, by: Duration) -> Result<bool, StoreError> {
        let earlier = |at: &mut Instant| {
            *at = at
                .checked_sub(by)
                .expect("a record is aged by less than the machine's uptime");
        };
        let mut inner = self.lock();
        let Some(record) = inner.records.get_mut(key) else {
            return Ok(false);
        };
        match &mut record.state {
            State::InFlight { lease_until } => earlier(lease_until),
            State::Inquiring { due, since, .. } => {
                earlier(due);
                earlier(since);
            }
            State::Completed(_) | State::Held(_) => {}
        }
        for at in [
            &mut record.expires_at,
            &mut record.created_at,
            &mut record.updated_at,
        ] {
            earlier(at);
        }
        Ok(true)
    }
}
