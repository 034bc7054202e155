//! Whether this instance trusts its Redis front, and what the front has
//! done: the counters behind the `idemgate_front_*` metrics.
//!
//! The front starts *down* and comes up only when it answers and the
//! outbox holds nothing older than that moment ([`super::probe`]): every
//! change PostgreSQL made while this instance was not looking has then
//! reached the front. Any failed front operation takes it down again at
//! once; transitions are logged once each and counted.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use crate::StoreError;

/// The front's state on this instance.
#[derive(Debug, Default)]
pub(super) struct Health {
    up: AtomicBool,
    pub(super) counts: Counts,
}

/// Tallies, read at scrape time ([`crate::FrontStats`]).
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) replays: AtomicU64,
    pub(super) conflicts: AtomicU64,
    pub(super) mismatches: AtomicU64,
    pub(super) held: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) marks: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) outages: AtomicU64,
    pub(super) relayed: AtomicU64,
    pub(super) relayed_shown: AtomicU64,
    pub(super) repairs: AtomicU64,
    pub(super) backlog: AtomicI64,
    pub(super) lag_ms: AtomicU64,
}

/// One more.
pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Health {
    /// Whether requests may use the front.
    pub(super) fn usable(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// A front operation failed: the front is down until the probe says
    /// otherwise.
    pub(super) fn failed(&self, error: &StoreError) {
        bump(&self.counts.errors);
        if self.up.swap(false, Ordering::AcqRel) {
            bump(&self.counts.outages);
            tracing::warn!(
                %error,
                "front store (Redis) failed: answering from PostgreSQL alone until it answers again \
                 and the outbox has reached it"
            );
        }
    }

    /// A front operation's value, or `None` once [`Self::failed`] has
    /// taken the front down for its error.
    pub(super) fn check<T>(&self, result: Result<T, StoreError>) -> Option<T> {
        result.map_err(|error| self.failed(&error)).ok()
    }

    /// The front answers and has every change up to now.
    pub(super) fn recovered(&self, first: bool) {
        if !self.up.swap(true, Ordering::AcqRel) {
            if first {
                tracing::info!("front store (Redis) up: it answers what it safely can");
            } else {
                tracing::info!("front store (Redis) is back and caught up: using it again");
            }
        }
    }
}
