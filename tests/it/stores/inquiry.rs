//! The status inquiry's states (docs/src/guide/status-inquiry.md), one
//! suite for every store that keeps them: an unknown outcome turns the key
//! `inquiring`, one instance at a time takes its question (a new token),
//! and only the taker's answer settles it. Every store, the Redis store on
//! a Redis Cluster too.

use std::time::Duration;

use idemgate::config::UnknownOutcome;
use idemgate::store::{
    Backend as Store, Cas, Claim, ClaimRequest, HeldReason, InquiringRoute, Inquiry, RecordKey,
    RecordState,
};

use super::conformance::{
    Fixture, LEASE, RETENTION, claim, claim_as, claim_with, key, response, token,
};
use crate::support::{Backend, eventually, per_backend};

pub(super) const INQUIRE: UnknownOutcome = UnknownOutcome::Inquire;
/// The inquirer's lease in these tests.
pub(super) const ASKING: Duration = Duration::from_secs(20);

fn routes() -> Vec<InquiringRoute> {
    routes_named(&["r"])
}

/// The routes `names`, as an instance that inquires them asks for them.
pub(super) fn routes_named(names: &[&str]) -> Vec<InquiringRoute> {
    names
        .iter()
        .map(|name| InquiringRoute {
            name: name.to_string(),
            retention: RETENTION,
            after: Duration::ZERO,
        })
        .collect()
}

/// The due questions, taken until `want` were (at most 5 s), as the
/// inquirer's passes take them. A taker skips a record another transaction
/// holds locked (`SKIP LOCKED`), and a front's relay holds one `FOR SHARE`
/// for a moment while it brings the front in line: the record is due still
/// and found at a later pass. Never more than `want` are taken.
pub(super) async fn take_due(s: &dyn Store, want: usize) -> Vec<Inquiry> {
    take_within(s, &routes(), want, 10, Duration::from_secs(5)).await
}

/// The due questions of `routes`, taken `limit` at a time until `want`
/// were, for at most `within` (see [`take_due`]).
pub(super) async fn take_within(
    s: &dyn Store,
    routes: &[InquiringRoute],
    want: usize,
    limit: usize,
    within: Duration,
) -> Vec<Inquiry> {
    let deadline = tokio::time::Instant::now() + within;
    let mut taken = Vec::new();
    loop {
        taken.extend(s.take_inquiries(routes, ASKING, limit).await.unwrap());
        if taken.len() >= want || tokio::time::Instant::now() >= deadline {
            assert_eq!(taken.len(), want, "{taken:?}");
            return taken;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A key of `route`, due for its first question now.
pub(super) async fn due_now(s: &dyn Store, route: &str, name: &str) -> RecordKey {
    let mut k = key(name);
    k.route = route.to_string();
    let t = token(claim_with(s, &k, 1, LEASE, INQUIRE).await);
    let inquired = s.inquire(&k, t, Duration::ZERO, false, RETENTION).await;
    assert_eq!(inquired.unwrap(), Cas::Applied);
    k
}

async fn a_broken_exchange_turns_the_key_inquiring(b: Backend) {
    let f = Fixture::new(b).await;
    let (s, k) = (f.store.as_ref(), key("broken"));
    let t = token(claim_with(s, &k, 1, LEASE, INQUIRE).await);
    let next = Duration::from_secs(5);
    assert_eq!(
        s.inquire(&k, t, next, false, RETENTION).await.unwrap(),
        Cas::Applied
    );
    match claim_with(s, &k, 1, LEASE, INQUIRE).await {
        Claim::Inquiring { retry_after, .. } => {
            assert!(
                retry_after <= next && retry_after > Duration::from_secs(3),
                "{retry_after:?}"
            )
        }
        other => panic!("expected Inquiring, got {other:?}"),
    }
    assert!(matches!(claim(s, &k, 2).await, Claim::Mismatch { .. }));
    // Not the attempt's to renew any more; not due, so nobody takes it.
    assert_eq!(s.renew(&k, t, LEASE).await.unwrap(), Cas::Fenced);
    assert!(
        s.take_inquiries(&routes(), ASKING, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let info = s.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.state, RecordState::Inquiring);
    assert_eq!(info.inquiries, Some(0));
    assert!(info.inquiring_since.is_some());
    assert_eq!(
        s.list("r", RecordState::Inquiring, 10).await.unwrap().len(),
        1
    );
}

async fn a_due_question_has_one_taker_and_only_it_settles(b: Backend) {
    let f = Fixture::new(b).await;
    let (s, k) = (f.store.as_ref(), key("due"));
    let t = token(claim_with(s, &k, 1, LEASE, INQUIRE).await);
    s.inquire(&k, t, Duration::ZERO, false, RETENTION)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let routes = routes();
    // Two takers at once, until one of them has it (see `take_due`).
    let first = eventually(Duration::from_secs(5), || async {
        let (a, b2) = tokio::join!(
            s.take_inquiries(&routes, ASKING, 10),
            s.take_inquiries(&routes, ASKING, 10)
        );
        let mut taken: Vec<_> = a.unwrap().into_iter().chain(b2.unwrap()).collect();
        assert!(taken.len() <= 1, "{taken:?}");
        taken.pop()
    })
    .await
    .expect("one of the takers takes the due question");
    assert_eq!((first.key.clone(), first.asked), (k.clone(), 0));
    assert!(first.token > t);
    // The attempt's late answer, and a second taker, are fenced now.
    assert_eq!(
        s.complete(&k, t, &response("late"), RETENTION)
            .await
            .unwrap(),
        Cas::Fenced
    );
    assert!(
        s.take_inquiries(&routes, ASKING, 10)
            .await
            .unwrap()
            .is_empty()
    );
    match claim_with(s, &k, 1, LEASE, INQUIRE).await {
        Claim::Inquiring { retry_after, .. } => assert!(retry_after > Duration::from_secs(10)),
        other => panic!("expected Inquiring, got {other:?}"),
    }
    // Unanswered: asked again at once (for the test), counted.
    assert_eq!(
        s.inquire(&k, first.token, Duration::ZERO, true, RETENTION)
            .await
            .unwrap(),
        Cas::Applied
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = take_due(s, 1).await;
    assert_eq!(second[0].asked, 1);
    assert!(second[0].token > first.token);
    // The first taker's answer comes too late.
    assert_eq!(
        s.complete(&k, first.token, &response("stale"), RETENTION)
            .await
            .unwrap(),
        Cas::Fenced
    );
    let answer = response("the upstream's answer");
    assert_eq!(
        s.complete(&k, second[0].token, &answer, RETENTION)
            .await
            .unwrap(),
        Cas::Applied
    );
    assert_eq!(claim(s, &k, 1).await, Claim::Replay(answer));
}

async fn an_answer_releases_or_holds_the_key(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let routes = routes();
    for name in ["never-acted", "gave-up"] {
        let k = key(name);
        let t = token(claim_with(s, &k, 1, LEASE, INQUIRE).await);
        s.inquire(&k, t, Duration::ZERO, false, RETENTION)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let taken = take_due(s, 2).await;
    for q in taken {
        if q.key.key == "never-acted" {
            assert_eq!(s.release(&q.key, q.token).await.unwrap(), Cas::Applied);
            let again = claim_with(s, &q.key, 1, LEASE, INQUIRE).await;
            assert!(
                matches!(
                    again,
                    Claim::Claimed {
                        takeover: false,
                        ..
                    }
                ),
                "{again:?}"
            );
        } else {
            let held = s
                .hold(&q.key, q.token, HeldReason::InquiryGaveUp, RETENTION)
                .await;
            assert_eq!(held.unwrap(), Cas::Applied);
            assert!(matches!(
                claim(s, &q.key, 1).await,
                Claim::Held {
                    reason: HeldReason::InquiryGaveUp,
                    ..
                }
            ));
            assert!(
                s.take_inquiries(&routes, ASKING, 10)
                    .await
                    .unwrap()
                    .is_empty()
            );
        }
    }
}

async fn a_lapsed_lease_turns_inquiring(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let short = Duration::from_millis(200);
    // Found by the next request: inquiring at once, the attempt's token kept.
    let k = key("lapsed");
    let t = token(claim_with(s, &k, 1, short, INQUIRE).await);
    // Found by no request: taken by the inquirer, on its route only.
    let quiet = key("quiet");
    let quiet_token = token(claim_with(s, &quiet, 1, short, INQUIRE).await);
    let mut other = key("other-route");
    other.route = "other".into();
    token(claim_with(s, &other, 1, short, UnknownOutcome::Hold).await);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        claim_with(s, &k, 1, LEASE, INQUIRE).await,
        Claim::Inquiring {
            retry_after: Duration::ZERO,
            ..
        }
    ));
    // The lapsed attempt may still deliver the real answer.
    let real = response("late but real");
    assert_eq!(
        s.complete(&k, t, &real, RETENTION).await.unwrap(),
        Cas::Applied
    );
    assert_eq!(claim(s, &k, 1).await, Claim::Replay(real));

    let taken = take_due(s, 1).await;
    assert_eq!(taken[0].key, quiet);
    assert!(taken[0].inquiring_for < Duration::from_secs(5));
    assert_eq!(
        s.complete(&quiet, quiet_token, &response("x"), RETENTION)
            .await
            .unwrap(),
        Cas::Fenced
    );
    assert!(matches!(
        claim_with(s, &quiet, 1, LEASE, INQUIRE).await,
        Claim::Inquiring { .. }
    ));
    assert_eq!(
        s.inspect(&other).await.unwrap().unwrap().state,
        RecordState::InFlight
    );
}

/// A claim by the attempt `lease` long on a route that inquires with
/// `after`, as the gateway makes it.
async fn claim_after(s: &dyn Store, k: &RecordKey, lease: Duration, after: Duration) -> Claim {
    let request = ClaimRequest {
        key: k,
        fingerprint: &[1; 32],
        attempt: idemgate::store::new_attempt_id(),
        lease,
        retention: RETENTION,
        on_unknown_outcome: INQUIRE,
        inquire_after: after,
    };
    s.claim(&request).await.unwrap()
}

/// The routes of [`routes`], inquiring with `after`.
fn routes_after(after: Duration) -> Vec<InquiringRoute> {
    let mut routes = routes();
    routes[0].after = after;
    routes
}

/// A claim that finds a lapsed lease on a route that inquires turns the key
/// `inquiring` due the route's `after` past the lapse, not at once (issue
/// 43), and nobody takes it before then: the stalled attempt's own answer,
/// which arrives inside `after`, settles its key (same token). A key left
/// unanswered is taken once due, its inquiry reckoned from the lapse.
async fn a_claim_over_a_lapsed_lease_leaves_the_question_after_away(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let (short, after) = (Duration::from_millis(200), Duration::from_millis(1500));
    let routes = routes_after(after);
    let (stalled, found) = (key("stalled"), key("found"));
    // Every lease below lapses `short` after this instant at the earliest.
    let start = tokio::time::Instant::now();
    let t = token(claim_after(s, &stalled, short, after).await);
    token(claim_after(s, &found, short, after).await);
    tokio::time::sleep(Duration::from_millis(400)).await;
    for k in [&stalled, &found] {
        match claim_after(s, k, LEASE, after).await {
            Claim::Inquiring { retry_after, .. } => assert!(
                retry_after > Duration::from_millis(900) && retry_after <= after,
                "{}: due in {retry_after:?}, not `after` past the lapse",
                k.key
            ),
            other => panic!("expected Inquiring, got {other:?}"),
        }
    }
    let early = s.take_inquiries(&routes, ASKING, 10).await.unwrap();
    assert!(early.is_empty(), "taken inside `after`: {early:?}");
    // The stalled attempt's answer, inside `after`, settles its key.
    let real = response("late but real");
    let written = s.complete(&stalled, t, &real, RETENTION).await.unwrap();
    assert_eq!(written, Cas::Applied);
    assert_eq!(claim(s, &stalled, 1).await, Claim::Replay(real));
    let taken = take_within(s, &routes, 1, 10, Duration::from_secs(4)).await;
    assert!(start.elapsed() >= short + after, "taken inside `after`");
    assert_eq!((&taken[0].key, taken[0].asked), (&found, 0));
    assert!(taken[0].inquiring_for >= after, "{taken:?}");
}

/// An in-flight record whose lease lapsed, found by no request, is taken
/// by the inquirer only its route's `after` past the lapse (issue 43),
/// its inquiry reckoned from the lapse (so its first question is asked at
/// once, not put off by another `after`); until then the attempt's token
/// stands.
async fn a_lapsed_lease_is_taken_only_after_past_the_lapse(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let (short, after) = (Duration::from_millis(200), Duration::from_millis(1500));
    let routes = routes_after(after);
    let (quiet, answered) = (key("quiet"), key("answered"));
    let start = tokio::time::Instant::now();
    let quiet_token = token(claim_after(s, &quiet, short, after).await);
    let t = token(claim_after(s, &answered, short, after).await);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let early = s.take_inquiries(&routes, ASKING, 10).await.unwrap();
    assert!(early.is_empty(), "taken inside `after`: {early:?}");
    let real = response("late but real");
    let written = s.complete(&answered, t, &real, RETENTION).await.unwrap();
    assert_eq!(written, Cas::Applied);
    let taken = take_within(s, &routes, 1, 10, Duration::from_secs(4)).await;
    assert!(start.elapsed() >= short + after, "taken inside `after`");
    assert_eq!((&taken[0].key, taken[0].asked), (&quiet, 0));
    assert!(taken[0].inquiring_for >= after, "{taken:?}");
    let stale = response("x");
    let late = s.complete(&quiet, quiet_token, &stale, RETENTION);
    assert_eq!(late.await.unwrap(), Cas::Fenced);
    assert_eq!(claim(s, &answered, 1).await, Claim::Replay(real));
}

async fn operators_and_abandons_clear_inquiring_keys(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let k = key("op");
    let t = token(claim_with(s, &k, 1, LEASE, INQUIRE).await);
    s.inquire(&k, t, Duration::from_secs(30), false, RETENTION)
        .await
        .unwrap();
    // Inside `after` (not asked, not due): the upstream may still be
    // working on the request, so only with force (issue 43).
    assert!(!s.clear(&k, false).await.unwrap());
    assert!(!s.delete(&k, false).await.unwrap());
    let info = s.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.state, RecordState::Inquiring);
    assert!(s.clear(&k, true).await.unwrap());
    assert!(matches!(
        claim_with(s, &k, 1, LEASE, INQUIRE).await,
        Claim::Claimed { .. }
    ));
    // Asked once already, or due: `after` has passed, no force needed.
    for (name, next, asked) in [
        ("asked", Duration::from_secs(30), true),
        ("due", Duration::ZERO, false),
    ] {
        for delete in [false, true] {
            let k = key(&format!("{name}-{delete}"));
            let t = token(claim_with(s, &k, 1, LEASE, INQUIRE).await);
            s.inquire(&k, t, next, asked, RETENTION).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            let removed = if delete {
                s.delete(&k, false).await
            } else {
                s.clear(&k, false).await
            };
            assert!(removed.unwrap(), "{name}, delete: {delete}");
            assert!(s.inspect(&k).await.unwrap().is_none());
        }
    }
    // A claim whose answer was lost, found lapsed by a retry, is abandoned.
    let lost = key("lost");
    claim_as(s, &lost, 1, 77, Duration::from_millis(200), INQUIRE).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        claim_with(s, &lost, 1, LEASE, INQUIRE).await,
        Claim::Inquiring { .. }
    ));
    assert_eq!(s.abandon(&lost, 77).await.unwrap(), Cas::Applied);
    assert!(s.inspect(&lost).await.unwrap().is_none());
}

async fn a_route_that_stopped_inquiring_settles_its_keys_by_its_policy(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    for (name, policy) in [
        ("now-held", UnknownOutcome::Hold),
        ("now-released", UnknownOutcome::Release),
    ] {
        let k = key(name);
        let t = token(claim_with(s, &k, 1, LEASE, INQUIRE).await);
        s.inquire(&k, t, Duration::ZERO, false, RETENTION)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Due, and no inquirer asks (the route no longer inquires): a
        // lapsed lease, by the route's policy now.
        match (policy, claim_with(s, &k, 1, LEASE, policy).await) {
            (
                UnknownOutcome::Hold,
                Claim::Held {
                    reason: HeldReason::LeaseLapsed,
                    ..
                },
            ) => {}
            (
                UnknownOutcome::Release,
                Claim::Claimed {
                    token: taken,
                    takeover: true,
                },
            ) => {
                assert!(taken > t);
                assert_eq!(
                    s.inspect(&k).await.unwrap().unwrap().state,
                    RecordState::InFlight
                );
                assert_eq!(
                    s.complete(&k, t, &response("old"), RETENTION)
                        .await
                        .unwrap(),
                    Cas::Fenced
                );
            }
            (policy, other) => panic!("{policy:?}: {other:?}"),
        }
    }
}

/// An inquiry is kept at least a retention from when it began, whatever
/// the claim's retention left: a key whose outcome is unknown is never
/// forgotten (and forwarded again) while it is being asked about.
async fn an_inquiry_outlives_the_claims_retention(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let k = key("kept");
    let claimed = s
        .claim(&ClaimRequest {
            key: &k,
            fingerprint: &[1; 32],
            attempt: 5,
            lease: LEASE,
            retention: Duration::from_secs(1),
            on_unknown_outcome: INQUIRE,
            inquire_after: Duration::ZERO,
        })
        .await
        .unwrap();
    let t = token(claimed);
    s.inquire(&k, t, Duration::from_secs(30), false, RETENTION)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(matches!(
        claim_with(s, &k, 1, LEASE, INQUIRE).await,
        Claim::Inquiring { .. }
    ));
    // Two passes: on PostgreSQL the second retires the record's generation.
    for _ in 0..2 {
        assert_eq!(idemgate::sweep_once(s, 100, None).await.unwrap(), 0);
    }
    assert!(s.inspect(&k).await.unwrap().is_some());
}

/// Another route's due questions, however many and however much earlier
/// due, never hide or delay a route's own (instances of other routes share
/// the store): an instance that asks for `r` takes its question in its
/// first passes, and one that asks for `other` still finds every one of
/// its own due, none put off.
async fn other_routes_questions_never_hide_a_routes_own(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    for n in 0..30 {
        due_now(s, "other", &format!("theirs-{n}")).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let ours = due_now(s, "r", "ours").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let within = Duration::from_secs(1);
    let taken = take_within(s, &routes(), 1, 4, within).await;
    assert_eq!(taken[0].key, ours);
    let theirs = take_within(s, &routes_named(&["other"]), 30, 30, within).await;
    assert!(theirs.iter().all(|q| q.key.route == "other"), "{theirs:?}");
}

/// `count_inquiring` counts the `inquiring` keys of the routes asked for,
/// however each turned inquiring (a broken exchange, a lapsed lease found
/// by a claim or by the inquirer), and nothing else: not an in-flight key,
/// not another route's; a key leaves the count once settled or deleted.
async fn inquiring_keys_are_counted_per_route(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let count = async |names: &[&str]| s.count_inquiring(&routes_named(names)).await.unwrap();
    let short = Duration::from_millis(200);
    token(claim_with(s, &key("flying"), 1, LEASE, INQUIRE).await);
    let broken = key("broken");
    let t = token(claim_with(s, &broken, 1, LEASE, INQUIRE).await);
    s.inquire(&broken, t, Duration::from_secs(30), false, RETENTION)
        .await
        .unwrap();
    due_now(s, "other", "theirs").await;
    let lapsed = key("lapsed");
    token(claim_with(s, &lapsed, 1, short, INQUIRE).await);
    token(claim_with(s, &key("quiet"), 1, short, INQUIRE).await);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(count(&["r"]).await, 1);
    assert!(matches!(
        claim_with(s, &lapsed, 1, LEASE, INQUIRE).await,
        Claim::Inquiring { .. }
    ));
    assert_eq!(count(&["r"]).await, 2);
    // The inquirer finds the quiet one, lapsed, and starts its inquiry.
    let taken = take_due(s, 2).await;
    assert!(taken.iter().any(|q| q.key.key == "quiet"), "{taken:?}");
    assert_eq!(count(&["r"]).await, 3);
    assert_eq!(count(&["r", "other"]).await, 4);
    assert_eq!(count(&["other"]).await, 1);
    assert_eq!(count(&[]).await, 0);
    let answered = taken.iter().find(|q| q.key.key == "lapsed").unwrap();
    let answer = response("x");
    let written = s.complete(&lapsed, answered.token, &answer, RETENTION);
    assert_eq!(written.await.unwrap(), Cas::Applied);
    // Inside `after` (not asked yet): deleted only with force.
    assert!(s.delete(&broken, true).await.unwrap());
    assert_eq!(count(&["r"]).await, 1);
}

per_backend!(
    only [postgres, redis, redis_cluster, sqlite, memory, front]:
    other_routes_questions_never_hide_a_routes_own,
    inquiring_keys_are_counted_per_route,
    a_broken_exchange_turns_the_key_inquiring,
    a_due_question_has_one_taker_and_only_it_settles,
    an_answer_releases_or_holds_the_key,
    a_lapsed_lease_turns_inquiring,
    a_claim_over_a_lapsed_lease_leaves_the_question_after_away,
    a_lapsed_lease_is_taken_only_after_past_the_lapse,
    operators_and_abandons_clear_inquiring_keys,
    a_route_that_stopped_inquiring_settles_its_keys_by_its_policy,
    an_inquiry_outlives_the_claims_retention,
);
