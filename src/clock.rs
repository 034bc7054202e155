//! The one clock for everything that measures time inside the gateway:
//! leases, the replay cache, metrics and retries. It is tokio's monotonic
//! clock, so tests can pause and advance it (`tokio::time::pause`) instead
//! of sleeping; `clippy.toml` forbids `std::time::Instant` elsewhere.
//!
//! Wall-clock times (`SystemTime`) appear only where a record's timestamps
//! are shown to an operator, and in the instant a Redis claim must run by
//! (`store::transitions::claim_write_limit`), which the server compares with
//! its own clock.

pub use tokio::time::Instant;
