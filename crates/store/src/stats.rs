//! What a store reports of itself for the metrics: its pool's occupancy,
//! its batches (PostgreSQL) and its front (a Redis front over PostgreSQL).
//! The gateway's metrics read these; the store knows nothing of them.

use std::time::Duration;

/// A store connection pool's occupancy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Connections open.
    pub connections: u64,
    /// Of those, idle.
    pub idle: u64,
    /// The most the pool opens.
    pub max: u64,
}

/// What a batching store (PostgreSQL) has done since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchStats {
    /// Batches sent (each one round trip and one commit).
    pub batches: u64,
    /// Operations they carried.
    pub operations: u64,
    /// Batches the database refused as a whole, whose operations then ran
    /// one by one.
    pub split: u64,
    /// Claims shed unsent for waiting in the queue past `[store]
    /// claim_queue_budget`.
    pub shed_queue_budget: u64,
    /// Claims shed unsent because their requester had left.
    pub shed_caller_gone: u64,
}

/// What the front has done since the store opened (`idemgate_front_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrontStats {
    /// This instance uses the front now.
    pub up: bool,
    /// Claims the front answered with a replay.
    pub replays: u64,
    /// … with `409` (in flight).
    pub conflicts: u64,
    /// … with `422` (another fingerprint).
    pub mismatches: u64,
    /// … with the held answer.
    pub held: u64,
    /// Claims that went on to PostgreSQL while the front was up.
    pub misses: u64,
    /// In-flight markers written (attempts still unsettled after
    /// `mark_after`).
    pub marks: u64,
    /// Front operations that failed.
    pub errors: u64,
    /// Times the front went down.
    pub outages: u64,
    /// Outbox rows applied to the front.
    pub relayed: u64,
    /// … of which the front already showed what they said.
    pub relayed_shown: u64,
    /// Rows waiting in the outbox.
    pub backlog: i64,
    /// Age of the oldest waiting row.
    pub lag: Duration,
    /// Settled records PostgreSQL answered that the front was given.
    pub repairs: u64,
}
