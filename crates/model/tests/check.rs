//! The model checked over its whole bounded space, for each policy, and
//! each negative control: a planted bug the checker must catch with a
//! counterexample (printed as the steps that lead to it).

use idemgate_core::UnknownOutcome;
use idemgate_model::properties::{G1, G2, G7, RELEASE};
use idemgate_model::{Mutation, bounded};
use stateright::{Checker, Model};

fn check(policy: UnknownOutcome) {
    let checker = bounded(policy, None).checker().spawn_bfs().join();
    println!(
        "{policy:?}: {} states ({} unique), max depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_properties();
}

#[test]
fn hold_keeps_every_property() {
    check(UnknownOutcome::Hold);
}

#[test]
fn release_keeps_every_property() {
    check(UnknownOutcome::Release);
}

#[test]
fn inquire_keeps_every_property() {
    check(UnknownOutcome::Inquire);
}

/// The planted bug breaks `property`: the checker finds a path to it.
fn caught(policy: UnknownOutcome, mutation: Mutation, property: &'static str) {
    let mut model = bounded(policy, Some(mutation));
    model.only = Some(property);
    let checker = model.checker().spawn_bfs().join();
    let path = checker.discovery(property).unwrap_or_else(|| {
        panic!(
            "{} went unnoticed: no counterexample to {property:?}",
            mutation.name()
        )
    });
    println!("{} breaks {property:?}:", mutation.name());
    for action in path.into_actions() {
        println!("  {action:?}");
    }
}

#[test]
fn a_write_that_ignores_the_token_is_caught() {
    caught(UnknownOutcome::Hold, Mutation::WriteIgnoresToken, G7);
}

#[test]
fn a_claim_over_a_live_lease_is_caught() {
    caught(UnknownOutcome::Hold, Mutation::ClaimOverLiveLease, G1);
}

#[test]
fn a_release_inside_after_without_force_is_caught() {
    caught(
        UnknownOutcome::Inquire,
        Mutation::ReleaseInquiringInsideAfter,
        RELEASE,
    );
}

#[test]
fn an_inquiry_answer_after_a_newer_token_is_caught() {
    caught(
        UnknownOutcome::Inquire,
        Mutation::InquiryAnswerAfterNewerToken,
        G7,
    );
}

/// A replay of another epoch's answer is G2's to catch: the token-blind
/// write lets a stale attempt record its answer over a newer claim.
#[test]
fn a_foreign_answer_is_caught_by_g2() {
    caught(UnknownOutcome::Release, Mutation::WriteIgnoresToken, G2);
}
