//! idemgate's integration tests, as one test binary (one link, one run):
//! the real gateway against real PostgreSQL and Redis, a real upstream on
//! port 0, and the real binary as a child process. One module per area;
//! `support` is what they share. Run one area with a filter, e.g.
//! `cargo test --test it pipeline` or `cargo test --test it chaos -- --nocapture`.

// Test support shares items across modules with `pub`, and tests measure
// the real elapsed time of external processes with std's clock.
#![allow(unreachable_pub, clippy::disallowed_types)]

mod support;

mod chaos;
mod cli;
mod crash;
mod front;
mod keys;
mod logs;
mod lost_claims;
mod metrics;
mod outage;
mod outage_redis;
mod pipeline;
mod postgres_batches;
mod postgres_races;
mod redis_cluster;
mod replay_cache;
mod request_hygiene;
mod server;
mod shadow;
mod sqlite;
mod store_conformance;
mod tls;
mod wait;
mod webhooks;
