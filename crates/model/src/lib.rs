//! A model checker for idemgate's record: a [Stateright](stateright) model
//! whose store decides with the core's own transitions
//! (`idemgate_core::transitions`), never a second copy of them, explored
//! over every interleaving of client retries, gateway crashes and stalls,
//! lapsing leases, an upstream that may act and lose its answer, an
//! honest status lookup, inquirers that stall, operator releases and
//! retention.
//!
//! The properties ([`properties`]) are named after the guarantees they
//! check. Each [`Mutation`] plants one bug in the rules; the checker must
//! find a counterexample for every one (the negative controls).
//!
//! `cargo test --release -p idemgate-model` checks every policy and every
//! control; `cargo run --release -p idemgate-model -- explore` serves
//! Stateright's explorer (docs/src/design/state-machine.md).

pub mod model;
pub mod properties;
pub mod rules;
pub mod world;

pub use model::{Action, RecordModel, Reply};
pub use rules::{Mutation, Rules};
pub use world::{Budget, World};

use idemgate_core::UnknownOutcome;

/// The bounds CI checks: three requests (two the same, one another
/// request under the key), one stall of a lease, one gateway crash, one
/// operator release and one inquirer stall.
pub fn bounded(policy: UnknownOutcome, mutation: Option<Mutation>) -> RecordModel {
    RecordModel::new(
        Rules { policy, mutation },
        if policy == UnknownOutcome::Inquire {
            vec![0, 0]
        } else {
            vec![0, 0, 1]
        },
        Budget {
            lapses: 1,
            crashes: 1,
            operator: 1,
            inquirer_lapses: 1,
        },
    )
}
