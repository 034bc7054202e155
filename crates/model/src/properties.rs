//! The model for Stateright, and the properties it checks, each named
//! after the guarantee it stands for (docs/src/guide/guarantees.md).

use idemgate_core::UnknownOutcome;
use stateright::{Model, Property};

use crate::model::{Action, RecordModel};
use crate::world::{Rec, World};

impl Model for RecordModel {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        vec![self.initial()]
    }

    fn actions(&self, state: &World, actions: &mut Vec<Action>) {
        self.enabled(state, actions);
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        Some(self.step(last, action))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(G1, |_, w: &World| one_execution_per_epoch(w)),
            Property::always(G2, |_, w: &World| {
                !w.ledger.bad_replay && !w.ledger.foreign_answer
            }),
            Property::always(G3, |_, w: &World| one_request_per_epoch(w)),
            Property::always(G7, |_, w: &World| !w.ledger.stale_write),
            Property::always(RELEASE, |_, w: &World| !w.ledger.unsafe_release),
            Property::eventually(SETTLES, |_, w: &World| settled(w)),
        ];
        if self.rules.policy != UnknownOutcome::Release {
            properties.push(Property::sometimes(HELD, |_, w: &World| w.ledger.held));
        }
        if self.rules.policy == UnknownOutcome::Inquire {
            properties.push(Property::sometimes(ACTED, |_, w: &World| {
                w.ledger.inquiry_acted
            }));
            properties.push(Property::sometimes(NOT_ACTED, |_, w: &World| {
                w.ledger.inquiry_not_acted
            }));
        }
        if let Some(only) = self.only {
            properties.retain(|p| p.name == only);
        }
        properties
    }
}

/// G1: the upstream executes the request at most once per epoch (a new
/// epoch only by the route's `release` policy, an operator's release or
/// retention).
pub const G1: &str = "G1 at most one execution per key";
/// G2: a replay returns the recorded answer, and the recorded answer is
/// the execution of its own attempt's epoch.
pub const G2: &str = "G2 a replay is the recorded execution";
/// G3: another request under the key never reaches the upstream.
pub const G3: &str = "G3 another request never reaches the upstream";
/// G7: no write with a token that is not the record's ever applies.
pub const G7: &str = "G7 no stale write applies";
/// `keys release` without `--force` waits until the upstream cannot be
/// working on the key any more.
pub const RELEASE: &str = "release without --force waits for after";
/// Under fairness, no key stays in flight or inquiring.
pub const SETTLES: &str = "every key settles";
/// A key can end `held` (the checker reaches it).
pub const HELD: &str = "sometimes held";
/// An inquiry can find the upstream acted, and record it.
pub const ACTED: &str = "sometimes an inquiry finds it acted";
/// An inquiry can find the upstream did not act, and release the key.
pub const NOT_ACTED: &str = "sometimes an inquiry finds it did not act";

fn one_execution_per_epoch(w: &World) -> bool {
    let effects = &w.upstream.effects;
    effects
        .iter()
        .enumerate()
        .all(|(i, e)| effects[..i].iter().all(|f| f.epoch != e.epoch))
}

fn one_request_per_epoch(w: &World) -> bool {
    let effects = &w.upstream.effects;
    effects.iter().all(|e| {
        effects
            .iter()
            .filter(|f| f.epoch == e.epoch)
            .all(|f| f.fingerprint == e.fingerprint)
    })
}

fn settled(w: &World) -> bool {
    !matches!(
        w.record.map(|r| r.state),
        Some(Rec::InFlight(_) | Rec::Inquiring { .. })
    )
}
