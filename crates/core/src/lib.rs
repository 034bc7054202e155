//! idemgate's core: what a record is and the rules it changes by, with no
//! I/O. A record lives under a [`RecordKey`] (route, scope, key), holds a
//! request's [`Fingerprint`] and the current attempt's fencing [`Token`],
//! and is in one [`RecordState`]; [`transitions`] is the state machine every
//! store follows (the memory store executes it, the SQL and Lua of the
//! other stores implement it and cite it).
//!
//! Everything else of idemgate depends on this crate; it depends on nothing
//! of idemgate's, and on no async runtime, database or HTTP crate, so the
//! model checker can explore exactly the rules the stores run.

mod key;
mod outcome;
mod state;
pub mod transitions;

pub use key::{AttemptId, Fingerprint, RecordKey, Token, WakeId, scope_digest, wake_id};
pub use outcome::{Cas, UnknownOutcome};
pub use state::{HeldReason, RecordState};
