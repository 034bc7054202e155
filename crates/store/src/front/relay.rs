//! The front store's background work, one task each per instance: the
//! outbox relay, the probe that brings a failed front back, and the
//! backlog gauge. Each holds the store weakly and ends when it is dropped.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Inner;
use super::health::bump;
use crate::postgres::outbox::{Dirty, Relayed, Settling, SyncError, Truth};
use crate::redis::RedisStore;
use crate::redis::front::{FrontEntry, Publish, Settled};
use crate::{StoreAdmin, StoreError, Token};

/// Most outbox rows one relay pass takes.
const RELAY_BATCH: usize = 256;
/// How often an idle relay looks at the outbox.
const RELAY_IDLE: Duration = Duration::from_millis(50);
/// How long the relay and the probe rest after a failure.
const BACKOFF: Duration = Duration::from_millis(250);
/// How long a read-repair waits before it looks at the front again.
const REPAIR_AFTER: Duration = Duration::from_millis(100);
/// How often the backlog gauge is refreshed.
const BACKLOG_EVERY: Duration = Duration::from_secs(1);
/// The backlog is counted up to this many rows.
const BACKLOG_CAP: i64 = 1_000_000;

/// A settled record's token, fingerprint, state and end of retention.
fn settled(truth: &Truth) -> Option<(Token, &[u8], Settled<'_>, i64)> {
    match truth {
        Truth::Completed {
            token,
            fingerprint,
            response,
            expires_ms,
        } => Some((
            *token,
            fingerprint,
            Settled::Completed(response),
            *expires_ms,
        )),
        Truth::Held {
            token,
            fingerprint,
            reason,
            expires_ms,
        } => Some((*token, fingerprint, Settled::Held(*reason), *expires_ms)),
        Truth::Nothing => None,
    }
}

/// Bring the front in line with PostgreSQL for each key: show a settled
/// record; forget every attempt the outbox says is over. The settled
/// records go first, many per script; each key's fence, if any, after its
/// record.
pub(super) async fn apply(
    front: &RedisStore,
    dirty: &[Dirty],
    fence_life: Duration,
) -> Result<(), StoreError> {
    let mut records = Vec::new();
    let mut fences = Vec::new();
    for d in dirty {
        let settled = settled(&d.truth);
        if let Some((token, fingerprint, settled, until_ms)) = settled {
            records.push(Publish {
                key: &d.key,
                token,
                fingerprint,
                settled,
                until_ms,
                own: false,
            });
        }
        let newer_settled = settled.is_some_and(|(token, ..)| token >= d.over);
        if d.over > 0 && !newer_settled {
            fences.push((&d.key, d.over));
        }
    }
    front.front_publish(&records).await?;
    for (key, over) in fences {
        front.front_invalidate(key, over, fence_life).await?;
    }
    Ok(())
}

/// The outbox relay: apply and delete rows until the store is dropped.
pub(super) async fn relay(inner: Weak<Inner>) {
    loop {
        let Some(store) = inner.upgrade() else { return };
        if paused(store.front.prefix()) {
            drop(store);
            tokio::time::sleep(RELAY_IDLE).await;
            continue;
        }
        // While the front is down, take no locks until it answers.
        if !store.health.usable() && store.front.ping().await.is_err() {
            drop(store);
            tokio::time::sleep(BACKOFF).await;
            continue;
        }
        let front = &store.front;
        let fence_life = store.fence_life;
        let shown = async |settling: &[Settling]| {
            let completed: Vec<_> = settling.iter().map(|s| (&s.key, s.token)).collect();
            front.front_shown(&completed).await
        };
        let pass = store
            .truth
            .relay_outbox(RELAY_BATCH, shown, async |dirty| {
                apply(front, dirty, fence_life).await
            })
            .await;
        let rest = match pass {
            Ok(Relayed { rows, shown }) => {
                let counts = &store.health.counts;
                counts.relayed.fetch_add(rows, Ordering::Relaxed);
                counts.relayed_shown.fetch_add(shown, Ordering::Relaxed);
                if rows as usize >= RELAY_BATCH {
                    Duration::ZERO
                } else {
                    RELAY_IDLE
                }
            }
            Err(SyncError::Apply(error)) => {
                store.health.failed(&error);
                BACKOFF
            }
            Err(SyncError::Store(error)) => {
                tracing::debug!(%error, "front outbox relay: PostgreSQL failed; will retry");
                BACKOFF
            }
        };
        drop(store);
        if rest.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(rest).await;
        }
    }
}

/// Test builds only: the `front-relay-pause` failpoint, armed with
/// `return(PREFIX,PREFIX,…)`, stops the relays of fronts under those key
/// prefixes (tests/it/stores/front.rs: what the request path wrote is seen
/// alone). Always false without the `failpoints` feature.
fn paused(prefix: &str) -> bool {
    fail::fail_point!("front-relay-pause", |armed: Option<String>| {
        armed.is_some_and(|list| list.split(',').any(|p| p == prefix))
    });
    let _ = prefix; // used only by the failpoint
    false
}

/// While the front is down: once it answers, note the outbox's newest row,
/// and bring the front up when the relays have applied every row up to it.
pub(super) async fn probe(inner: Weak<Inner>, up_at_start: bool) {
    let mut first = !up_at_start;
    loop {
        let Some(store) = inner.upgrade() else { return };
        if !store.health.usable() && caught_up(&store).await {
            store.health.recovered(first);
            first = false;
        }
        drop(store);
        tokio::time::sleep(BACKOFF).await;
    }
}

/// Whether the front answers and has every change committed before now.
pub(super) async fn caught_up(store: &Arc<Inner>) -> bool {
    if !same_server(store).await || store.front.ping().await.is_err() {
        return false;
    }
    let Ok(head) = store.truth.outbox_head().await else {
        return false;
    };
    // The relays (this instance's among them) drain it; give them the
    // front's timeout per batch, then try again from the top.
    for _ in 0..40 {
        match store.truth.outbox_drained(head).await {
            Ok(true) => return true,
            Ok(false) => tokio::time::sleep(RELAY_IDLE).await,
            Err(_) => return false,
        }
    }
    false
}

/// Whether the front is the Redis server PostgreSQL last knew it as; if
/// it is another (a restart, perhaps from an old snapshot, or a failover),
/// wipe it first: its entries may predate outbox rows that are gone.
async fn same_server(store: &Arc<Inner>) -> bool {
    let (Ok(now), Ok(known)) = (
        store.front.front_run_id().await,
        store.truth.front_run_id().await,
    ) else {
        return false;
    };
    if known.as_deref() == Some(now.as_str()) {
        store.front.expect_run_id(Some(&now));
        return true;
    }
    // Connections to the new server are allowed for the wipe; the front is
    // down meanwhile, so only this probe and the relay use them.
    store.front.expect_run_id(None);
    match store.front.front_wipe().await {
        Ok(wiped) => {
            tracing::info!(
                wiped,
                "front store (Redis) is a server not seen before (first use, a restart or a \
                 failover): its entries were wiped before use"
            );
        }
        Err(error) => {
            tracing::debug!(%error, "wiping the front failed; will retry");
            return false;
        }
    }
    if store.truth.set_front_run_id(&now).await.is_err() {
        return false;
    }
    store.front.expect_run_id(Some(&now));
    true
}

/// Refresh the backlog gauges: rows waiting, and the oldest one's age.
pub(super) async fn backlog(inner: Weak<Inner>) {
    loop {
        let Some(store) = inner.upgrade() else { return };
        if let Ok((rows, age)) = store.truth.outbox_backlog(BACKLOG_CAP).await {
            let counts = &store.health.counts;
            counts.backlog.store(rows, Ordering::Relaxed);
            // (The age of no row is zero.)
            counts
                .lag_ms
                .store(age.as_millis() as u64, Ordering::Relaxed);
        }
        drop(store);
        tokio::time::sleep(BACKLOG_EVERY).await;
    }
}

/// Read-repair: the front did not have a settled record PostgreSQL
/// replayed. A record settled moments ago is normally on its way (the
/// settling instance's write, its outbox row), and its duplicates meet
/// PostgreSQL meanwhile: so wait [`REPAIR_AFTER`], and publish the record
/// (read under a share lock, like the relay) only if the front still has
/// no settled entry for the key then; what it has is the outbox's to fix.
pub(super) async fn repair(store: Arc<Inner>, key: crate::RecordKey) {
    tokio::time::sleep(REPAIR_AFTER).await;
    let read = async {
        if !store.health.usable() {
            return None; // down: the outbox brings it up to date
        }
        store
            .health
            .check(store.front.front_read(&key, super::now_ms()).await)
    };
    let lacks = read.await.is_some_and(|entry| {
        !matches!(
            entry,
            Some(FrontEntry::Completed { .. } | FrontEntry::Held { .. })
        )
    });
    if lacks && let Ok(_slot) = store.repair_slots.acquire().await {
        let front = &store.front;
        let fence_life = store.fence_life;
        let result = store
            .truth
            .sync_keys(vec![key.clone()], async |dirty| {
                apply(front, dirty, fence_life).await
            })
            .await;
        match result {
            Ok(()) => bump(&store.health.counts.repairs),
            Err(SyncError::Apply(error)) => store.health.failed(&error),
            Err(SyncError::Store(error)) => {
                tracing::debug!(%error, "front read-repair: PostgreSQL failed");
            }
        }
    }
    store
        .repairing
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&key);
}
