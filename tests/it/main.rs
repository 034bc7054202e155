//! idemgate's integration tests, as one test binary (one link, one run):
//! the real gateway against real PostgreSQL and Redis, a real upstream on
//! port 0, and the real binary as a child process. A directory per area,
//! so that a behaviour's tests are found by its name:
//!
//! - `guarantees/`: a module per guarantee of docs/src/guide/guarantees.md,
//!   `g1_one_at_a_time` to `g8_store_outages`;
//! - `stores/`: the conformance suite every store runs, and what only one
//!   store does;
//! - `http/`: request hygiene, connection handling, TLS;
//! - `features/`: webhooks, shadow mode, the `keys` commands;
//! - `ops/`: the command line, logs, metrics, readiness, shutdown;
//! - `chaos/`: the chaos harness (it runs alone, see `support/serial.rs`).
//!
//! `support` is what they share. Run one area or one guarantee with a
//! filter, e.g. `cargo test --test it guarantees::g4`,
//! `cargo test --test it stores::` or
//! `cargo test --test it chaos -- --nocapture`.

// Test support shares items across modules with `pub`, tests measure the
// real elapsed time of external processes with std's clock, and a test
// (support included) may unwrap: a failing unwrap is a failing test.
#![allow(unreachable_pub, clippy::disallowed_types, clippy::unwrap_used)]

mod support;

mod chaos;
mod features;
mod guarantees;
mod http;
mod ops;
mod stores;
