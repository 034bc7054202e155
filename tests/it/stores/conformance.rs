//! One conformance suite for every store (docs/src/design/stores.md): the same tests,
//! unchanged, instantiated per backend by `per_backend!` at the bottom.
//! Adding a backend means adding it to `per_backend!` and `TestStore` (and
//! to the list at the bottom, if `per_backend!` does not run it by default).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use idemgate::config::{StoreConfig, UnknownOutcome};
use idemgate::store::{
    AttemptId, Backend as Store, Cas, Claim, ClaimRequest, EraseStep, HeldReason, RecordKey,
    StoredResponse,
};

use crate::support::{Backend, TestStore, per_backend};

pub(super) const LEASE: Duration = Duration::from_secs(30);
pub(super) const RETENTION: Duration = Duration::from_secs(3600);

/// A store on fresh storage, and what keeps that storage alive.
pub(super) struct Fixture {
    pub(super) store: Arc<dyn Store>,
    /// The backend expires records by itself (Redis TTLs): sweeps find nothing.
    expires_by_itself: bool,
    /// The backend retires records a generation at a time (PostgreSQL):
    /// a sweep's count is an estimate.
    retires_generations: bool,
    storage: TestStore,
}

impl Fixture {
    pub(super) async fn new(backend: Backend) -> Self {
        let storage = TestStore::new(backend).await;
        Self {
            store: storage.open().await,
            expires_by_itself: matches!(backend, Backend::Redis | Backend::RedisCluster),
            retires_generations: matches!(backend, Backend::Postgres | Backend::Front),
            storage,
        }
    }
}

impl Fixture {
    /// The slot new keys go to, read from the database, where records are
    /// retired by generation (PostgreSQL, the front on it); else `None`.
    async fn generation_slot(&self) -> Option<i16> {
        if !self.retires_generations {
            return None;
        }
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&self.storage.url)
            .await
            .unwrap();
        let slot = sqlx::query_scalar("SELECT slot FROM idemgate_generation");
        Some(slot.fetch_one(&mut conn).await.unwrap())
    }

    /// One sweep, which on a store that retires generations must rotate
    /// (the tests' generation is zero), or a test across a boundary proves
    /// nothing there.
    async fn sweep_across(&self) {
        let before = self.generation_slot().await;
        idemgate::sweep_once(self.store.as_ref(), 1000, None)
            .await
            .unwrap();
        let after = self.generation_slot().await;
        if before.is_some() {
            assert_ne!(before, after, "the sweep did not rotate the generations");
        }
    }
}

pub(super) fn key(k: &str) -> RecordKey {
    RecordKey {
        route: "r".into(),
        scope: Vec::new(),
        key: k.into(),
    }
}

pub(super) fn fp(n: u8) -> [u8; 32] {
    [n; 32]
}

pub(super) async fn claim_with(
    store: &dyn Store,
    k: &RecordKey,
    f: u8,
    lease: Duration,
    on_unknown: UnknownOutcome,
) -> Claim {
    let attempt = idemgate::store::new_attempt_id();
    claim_as(store, k, f, attempt, lease, on_unknown).await
}

/// A claim by a named attempt.
pub(super) async fn claim_as(
    store: &dyn Store,
    k: &RecordKey,
    f: u8,
    attempt: AttemptId,
    lease: Duration,
    on_unknown: UnknownOutcome,
) -> Claim {
    store
        .claim(&ClaimRequest {
            key: k,
            fingerprint: &fp(f),
            attempt,
            lease,
            retention: RETENTION,
            on_unknown_outcome: on_unknown,
            inquire_after: Duration::ZERO,
        })
        .await
        .expect("claim")
}

pub(super) async fn claim(store: &dyn Store, k: &RecordKey, f: u8) -> Claim {
    claim_with(store, k, f, LEASE, UnknownOutcome::Hold).await
}

pub(super) fn token(c: Claim) -> i64 {
    match c {
        Claim::Claimed { token, .. } => token,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

pub(super) fn response(body: impl Into<Bytes>) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.append("location", HeaderValue::from_static("/things/1"));
    headers.append("x-multi", HeaderValue::from_static("a"));
    headers.append("x-multi", HeaderValue::from_static("b"));
    StoredResponse {
        status: StatusCode::CREATED,
        headers,
        body: body.into(),
    }
}

async fn claim_outcomes(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let k = key("a");
    let t = token(claim(s, &k, 1).await);
    match claim(s, &k, 1).await {
        Claim::InFlight { retry_after, .. } => {
            assert!(retry_after <= LEASE && retry_after > Duration::ZERO)
        }
        other => panic!("expected InFlight, got {other:?}"),
    }
    assert!(matches!(claim(s, &k, 2).await, Claim::Mismatch { .. }));
    let r = response(&b"\x00\xffbinary\r\n"[..]);
    assert_eq!(
        s.complete(&k, t, &r, RETENTION).await.unwrap(),
        Cas::Applied
    );
    assert_eq!(claim(s, &k, 1).await, Claim::Replay(r));
    assert!(matches!(claim(s, &k, 2).await, Claim::Mismatch { .. }));
}

/// `expires_in`, as a claim refused by a record states it: never more
/// than the retention last given, and no more than a few seconds less.
pub(super) fn kept_about(claim: &Claim, retention: Duration) {
    let expires_in = match claim {
        Claim::InFlight { expires_in, .. }
        | Claim::Inquiring { expires_in, .. }
        | Claim::Mismatch { expires_in }
        | Claim::Held { expires_in, .. } => *expires_in,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(
        expires_in <= retention && expires_in + Duration::from_secs(5) >= retention,
        "{claim:?}: expected about {retention:?}"
    );
}

/// Every refusal says how long its record is kept: the claim's retention
/// while in flight, the completion's or the hold's after.
async fn refusals_say_when_the_record_expires(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let k = key("kept");
    let t = token(claim(s, &k, 1).await);
    kept_about(&claim(s, &k, 1).await, RETENTION);
    kept_about(&claim(s, &k, 2).await, RETENTION);
    let shorter = Duration::from_secs(600);
    assert_eq!(
        s.complete(&k, t, &response("done"), shorter).await.unwrap(),
        Cas::Applied
    );
    kept_about(&claim(s, &k, 2).await, shorter);
    let held = key("kept-held");
    let t = token(claim(s, &held, 1).await);
    let hold = Duration::from_secs(900);
    assert_eq!(
        s.hold(&held, t, HeldReason::UpstreamTimeout, hold)
            .await
            .unwrap(),
        Cas::Applied
    );
    let again = claim(s, &held, 1).await;
    assert!(matches!(again, Claim::Held { .. }), "{again:?}");
    kept_about(&again, hold);
    kept_about(&claim(s, &held, 2).await, hold);
}

async fn fenced_late_writer_cannot_overwrite(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let k = key("fence");
    let short = Duration::from_millis(200);
    let old = token(claim_with(s, &k, 1, short, UnknownOutcome::Release).await);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let new = match claim_with(s, &k, 1, LEASE, UnknownOutcome::Release).await {
        Claim::Claimed { token, takeover } => {
            assert!(takeover, "a lapsed lease is taken over");
            token
        }
        other => panic!("expected a takeover, got {other:?}"),
    };
    assert!(new > old, "takeover gets a higher token");
    assert_eq!(
        s.complete(&k, old, &response("late"), RETENTION)
            .await
            .unwrap(),
        Cas::Fenced
    );
    assert_eq!(s.renew(&k, old, LEASE).await.unwrap(), Cas::Fenced);
    assert_eq!(
        s.hold(&k, old, HeldReason::UpstreamFailed, RETENTION)
            .await
            .unwrap(),
        Cas::Fenced
    );
    assert_eq!(s.release(&k, old).await.unwrap(), Cas::Fenced);
    assert_eq!(
        s.complete(&k, new, &response("current"), RETENTION)
            .await
            .unwrap(),
        Cas::Applied
    );
    assert_eq!(claim(s, &k, 1).await, Claim::Replay(response("current")));
    assert_eq!(
        s.complete(&k, old, &response("late"), RETENTION)
            .await
            .unwrap(),
        Cas::Fenced
    );
    assert_eq!(claim(s, &k, 1).await, Claim::Replay(response("current")));
}

async fn lapsed_lease_is_held_under_hold(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let k = key("lapse");
    let t = token(claim_with(s, &k, 1, Duration::from_millis(200), UnknownOutcome::Hold).await);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        claim(s, &k, 1).await,
        Claim::Held {
            reason: HeldReason::LeaseLapsed,
            ..
        }
    ));
    assert!(matches!(
        claim(s, &k, 1).await,
        Claim::Held {
            reason: HeldReason::LeaseLapsed,
            ..
        }
    ));
    assert!(matches!(claim(s, &k, 2).await, Claim::Mismatch { .. }));
    // The attempt that lapsed may still deliver the real answer.
    assert_eq!(s.renew(&k, t, LEASE).await.unwrap(), Cas::Fenced);
    assert_eq!(
        s.complete(&k, t, &response("late but real"), RETENTION)
            .await
            .unwrap(),
        Cas::Applied
    );
    assert_eq!(
        claim(s, &k, 1).await,
        Claim::Replay(response("late but real"))
    );
}

async fn renew_extends_the_lease(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let k = key("renew");
    let short = Duration::from_millis(300);
    let t = token(claim_with(s, &k, 1, short, UnknownOutcome::Release).await);
    assert_eq!(s.renew(&k, t, LEASE).await.unwrap(), Cas::Applied);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(matches!(
        claim_with(s, &k, 1, LEASE, UnknownOutcome::Release).await,
        Claim::InFlight { .. }
    ));
}

async fn release_frees_the_key_with_a_new_token(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let k = key("release");
    let t1 = token(claim(s, &k, 1).await);
    assert_eq!(s.release(&k, t1).await.unwrap(), Cas::Applied);
    // Released: even a different request may use the key now.
    let t2 = token(claim(s, &k, 2).await);
    assert!(t2 > t1);
    assert_eq!(
        s.complete(&k, t1, &response("stale"), RETENTION)
            .await
            .unwrap(),
        Cas::Fenced
    );
}

async fn hold_blocks_until_retention(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let k = key("hold");
    let t = token(claim(s, &k, 1).await);
    assert_eq!(
        s.hold(&k, t, HeldReason::ResponseTooLarge, RETENTION)
            .await
            .unwrap(),
        Cas::Applied
    );
    assert!(matches!(
        claim(s, &k, 1).await,
        Claim::Held {
            reason: HeldReason::ResponseTooLarge,
            ..
        }
    ));
    assert!(matches!(claim(s, &k, 3).await, Claim::Mismatch { .. }));
    assert_eq!(
        s.release(&k, t).await.unwrap(),
        Cas::Fenced,
        "release clears in-flight attempts only"
    );
}

async fn expired_records_are_claimable_again(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let k = key("expiry");
    let t = token(claim(s, &k, 1).await);
    let short = Duration::from_millis(200);
    assert_eq!(
        s.complete(&k, t, &response("old"), short).await.unwrap(),
        Cas::Applied
    );
    assert!(matches!(claim(s, &k, 1).await, Claim::Replay(_)));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let t2 = token(claim(s, &k, 2).await);
    assert!(t2 > t);
}

async fn scopes_and_routes_are_isolated(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let a = key("same");
    let b = RecordKey {
        scope: vec![7; 32],
        ..a.clone()
    };
    let c = RecordKey {
        route: "other".into(),
        ..a.clone()
    };
    token(claim(s, &a, 1).await);
    token(claim(s, &b, 2).await);
    token(claim(s, &c, 3).await);
}

async fn concurrent_claims_have_one_winner(b: Backend) {
    let f = Fixture::new(b).await;
    let store = f.store.clone();
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            claim(store.as_ref(), &key("race"), 1).await
        }));
    }
    let mut winners = 0;
    for t in tasks {
        match t.await.unwrap() {
            Claim::Claimed { .. } => winners += 1,
            Claim::InFlight { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners, 1);
}

async fn large_bodies_round_trip(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let k = key("large");
    let t = token(claim(s, &k, 1).await);
    let body: Vec<u8> = (0..8 * 1024 * 1024u32)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let r = response(body);
    assert_eq!(
        s.complete(&k, t, &r, RETENTION).await.unwrap(),
        Cas::Applied
    );
    assert_eq!(claim(s, &k, 1).await, Claim::Replay(r));
}

async fn completion_is_idempotent_for_its_own_attempt(b: Backend) {
    // A retried completion (its first answer lost) must not report fencing.
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let k = key("twice");
    let t = token(claim(s, &k, 1).await);
    assert_eq!(
        s.complete(&k, t, &response("x"), RETENTION).await.unwrap(),
        Cas::Applied
    );
    assert_eq!(
        s.complete(&k, t, &response("x"), RETENTION).await.unwrap(),
        Cas::Applied
    );
}

async fn sweep_deletes_only_expired_records(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let short = Duration::from_millis(200);
    for i in 0..5 {
        let k = key(&format!("old{i}"));
        let t = token(claim(s, &k, 1).await);
        assert_eq!(
            s.complete(&k, t, &response("x"), short).await.unwrap(),
            Cas::Applied
        );
    }
    let live = key("live");
    let t = token(claim(s, &live, 1).await);
    s.complete(&live, t, &response("keep"), RETENTION)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Two passes: PostgreSQL drops records with the generation they were
    // written in, which the second pass retires (the tests' generation is
    // zero: every pass rotates).
    let swept = idemgate::sweep_once(s, 2, None).await.unwrap()
        + idemgate::sweep_once(s, 2, None).await.unwrap();
    if !f.retires_generations {
        assert_eq!(swept, if f.expires_by_itself { 0 } else { 5 });
    }
    for i in 0..5 {
        let old = key(&format!("old{i}"));
        assert_eq!(s.inspect(&old).await.unwrap(), None, "old{i} was not swept");
    }
    assert!(
        s.inspect(&live).await.unwrap().is_some(),
        "the live record went"
    );
    assert_eq!(claim(s, &live, 1).await, Claim::Replay(response("keep")));
    token(claim(s, &key("old0"), 2).await);
}

/// Every sweep here retires a generation on PostgreSQL (the tests'
/// `[store] generation` is zero) and deletes expired records elsewhere;
/// either way a key's record holds across it: replayed, refused with
/// another request, in flight, fenced, and free again only once expired.
async fn records_hold_across_generation_boundaries(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let brief = Duration::from_millis(300);
    let [done, open, short, fresh] = ["done", "open", "short", "fresh"].map(key);
    let t = token(claim(s, &done, 1).await);
    let applied = s.complete(&done, t, &response("done"), RETENTION).await;
    assert_eq!(applied.unwrap(), Cas::Applied);
    let open_token = token(claim(s, &open, 1).await);
    let stale = token(claim(s, &short, 1).await);
    let applied = s.complete(&short, stale, &response("short"), brief).await;
    assert_eq!(applied.unwrap(), Cas::Applied);

    f.sweep_across().await;
    assert_eq!(claim(s, &done, 1).await, Claim::Replay(response("done")));
    assert!(matches!(claim(s, &done, 2).await, Claim::Mismatch { .. }));
    assert!(matches!(claim(s, &open, 1).await, Claim::InFlight { .. }));
    let fresh_token = token(claim(s, &fresh, 1).await);
    tokio::time::sleep(brief * 2).await;
    // Expired: free again for another request, once.
    let again = token(claim(s, &short, 2).await);
    assert!(matches!(claim(s, &short, 2).await, Claim::InFlight { .. }));

    f.sweep_across().await;
    f.sweep_across().await;
    let late = s
        .complete(&short, stale, &response("late"), RETENTION)
        .await;
    assert_eq!(
        late.unwrap(),
        Cas::Fenced,
        "the expired attempt's token still wrote"
    );
    for (k, t, body) in [(&open, open_token, "open"), (&short, again, "again")] {
        let applied = s.complete(k, t, &response(body), RETENTION).await;
        assert_eq!(applied.unwrap(), Cas::Applied, "{body}");
    }
    let applied = s
        .complete(&fresh, fresh_token, &response("fresh"), RETENTION)
        .await;
    assert_eq!(applied.unwrap(), Cas::Applied);

    f.sweep_across().await;
    for (k, fp, body) in [(&done, 1, "done"), (&open, 1, "open"), (&short, 2, "again")] {
        assert_eq!(
            claim(s, k, fp).await,
            Claim::Replay(response(body)),
            "{body}"
        );
    }
    assert_eq!(claim(s, &fresh, 1).await, Claim::Replay(response("fresh")));
    assert!(matches!(claim(s, &short, 1).await, Claim::Mismatch { .. }));
}

async fn a_live_lease_outlives_retention(b: Backend) {
    let f = Fixture::new(b).await;
    // An attempt that runs longer than the retention must keep its key (G1).
    let s = f.store.as_ref();
    let k = key("outlive");
    let short = Duration::from_millis(300);
    let request = ClaimRequest {
        key: &k,
        fingerprint: &fp(1),
        attempt: 1,
        lease: short,
        retention: short,
        on_unknown_outcome: UnknownOutcome::Release,
        inquire_after: Duration::ZERO,
    };
    let t = token(s.claim(&request).await.unwrap());
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(s.renew(&k, t, short).await.unwrap(), Cas::Applied);
    }
    assert!(matches!(
        s.claim(&request).await.unwrap(),
        Claim::InFlight { .. }
    ));
    assert_eq!(idemgate::sweep_once(s, 10, None).await.unwrap(), 0);
    assert_eq!(
        s.complete(&k, t, &response("done"), RETENTION)
            .await
            .unwrap(),
        Cas::Applied
    );
    assert_eq!(
        s.claim(&request).await.unwrap(),
        Claim::Replay(response("done"))
    );
}

async fn key_administration(b: Backend) {
    let f = Fixture::new(b).await;
    use idemgate::store::RecordState;
    let s = f.store.as_ref();
    let flying = key("adm-flying");
    let done = RecordKey {
        scope: vec![7; 32],
        ..key("adm-done")
    };
    let held = key("adm-held");
    let t_flying = token(claim(s, &flying, 1).await);
    let t_done = token(claim(s, &done, 1).await);
    s.complete(&done, t_done, &response("hello"), RETENTION)
        .await
        .unwrap();
    let t_held = token(claim(s, &held, 1).await);
    s.hold(&held, t_held, HeldReason::UpstreamTimeout, RETENTION)
        .await
        .unwrap();

    let info = s.inspect(&flying).await.unwrap().expect("in-flight record");
    assert_eq!((info.state, info.token), (RecordState::InFlight, t_flying));
    assert!(info.lease_until.is_some() && info.status.is_none());
    assert!(info.expires_at > info.created_at);
    let info = s.inspect(&done).await.unwrap().expect("completed record");
    assert_eq!(info.state, RecordState::Completed);
    assert_eq!((info.status, info.body_bytes), (Some(201), Some(5)));
    assert_eq!(info.scope, "07".repeat(32));
    assert_eq!(info.record_key(), Some(done.clone()));
    let info = s.inspect(&held).await.unwrap().expect("held record");
    assert_eq!(
        (info.state, info.held_reason),
        (RecordState::Held, Some("upstream_timeout"))
    );
    assert_eq!(s.inspect(&key("absent")).await.unwrap(), None);

    let keys =
        |v: Vec<idemgate::store::RecordInfo>| v.into_iter().map(|i| i.key).collect::<Vec<_>>();
    assert_eq!(
        keys(s.list("r", RecordState::Held, 10).await.unwrap()),
        vec!["adm-held"]
    );
    assert_eq!(
        keys(s.list("r", RecordState::InFlight, 10).await.unwrap()),
        vec!["adm-flying"]
    );
    assert_eq!(
        keys(s.list("r", RecordState::Completed, 10).await.unwrap()),
        vec!["adm-done"]
    );
    assert!(
        s.list("other", RecordState::Held, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(s.list("r", RecordState::Held, 0).await.unwrap().len(), 0);

    // release (clear): held keys, lapsed leases, live leases only when forced.
    assert!(
        !s.clear(&done, true).await.unwrap(),
        "a completed record is not released"
    );
    assert!(s.clear(&held, false).await.unwrap());
    assert!(matches!(claim(s, &held, 1).await, Claim::Claimed { .. }));
    assert!(
        !s.clear(&flying, false).await.unwrap(),
        "a live lease is kept without force"
    );
    assert!(
        !s.delete(&flying, false).await.unwrap(),
        "a live lease is kept without force"
    );
    assert!(s.clear(&flying, true).await.unwrap());
    assert_eq!(
        s.complete(&flying, t_flying, &response("late"), RETENTION)
            .await
            .unwrap(),
        Cas::Fenced
    );
    let lapsing = key("adm-lapsing");
    token(
        claim_with(
            s,
            &lapsing,
            1,
            Duration::from_millis(100),
            UnknownOutcome::Release,
        )
        .await,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        s.clear(&lapsing, false).await.unwrap(),
        "a lapsed lease is released"
    );
    // delete: any state.
    assert!(s.delete(&done, false).await.unwrap());
    assert!(!s.delete(&done, false).await.unwrap());
    assert!(matches!(claim(s, &done, 2).await, Claim::Claimed { .. }));
}

/// One erasure step's request.
fn erase_step<'a>(route: &'a str, scope: &'a [u8], force: bool, limit: usize) -> EraseStep<'a> {
    EraseStep {
        route,
        scope,
        force,
        limit,
        after: None,
    }
}

/// Erasure by scope (`keys erase`): a scope's records on one route go,
/// in any state but one the upstream may be working on (a live lease),
/// which goes only with force; other scopes, unscoped records and other
/// routes keep theirs and replay; the front answers from none of the
/// erased records; a step removes at most its limit.
async fn erase_removes_one_scope_on_one_route(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let at = |route: &str, scope: &[u8], k: &str| RecordKey {
        route: route.into(),
        scope: scope.to_vec(),
        key: k.into(),
    };
    let (a, b_scope) = ([0xa; 32], [0xb; 32]);
    let completed = |k: RecordKey| async move {
        let t = token(claim(s, &k, 1).await);
        assert_eq!(
            s.complete(&k, t, &response("mine"), RETENTION)
                .await
                .unwrap(),
            Cas::Applied
        );
        k
    };
    // One key name, "k1", in four places: scope A on two routes, scope B,
    // and unscoped.
    let a1 = completed(at("r", &a, "k1")).await;
    let a2 = at("r", &a, "k2");
    let t = token(claim(s, &a2, 1).await);
    s.hold(&a2, t, HeldReason::UpstreamTimeout, RETENTION)
        .await
        .unwrap();
    let flying = at("r", &a, "k3");
    let t_flying = token(claim(s, &flying, 1).await);
    let a_other_route = completed(at("r2", &a, "k1")).await;
    let b1 = completed(at("r", &b_scope, "k1")).await;
    let unscoped = completed(at("r", &[], "k1")).await;
    // Seen once, so a front has it to answer from.
    assert_eq!(claim(s, &a1, 1).await, Claim::Replay(response("mine")));

    let sorted = |mut keys: Vec<String>| {
        keys.sort();
        keys
    };
    let erased = s.erase(&erase_step("r", &a, false, 100)).await.unwrap();
    assert_eq!(sorted(erased.keys), ["k1", "k2"]);
    assert_eq!(erased.left, 1, "the live lease is left without force");
    assert_eq!(s.inspect(&a1).await.unwrap(), None);
    assert_eq!(s.inspect(&a2).await.unwrap(), None);
    assert!(s.inspect(&flying).await.unwrap().is_some());
    // Another route's records of the scope are that route's erasure.
    assert!(s.inspect(&a_other_route).await.unwrap().is_some());
    let erased = s.erase(&erase_step("r2", &a, false, 100)).await.unwrap();
    assert_eq!((erased.keys, erased.left), (vec!["k1".to_string()], 0));
    for untouched in [&b1, &unscoped] {
        assert_eq!(
            claim(s, untouched, 1).await,
            Claim::Replay(response("mine")),
            "{untouched:?}"
        );
    }

    let forced = s.erase(&erase_step("r", &a, true, 100)).await.unwrap();
    assert_eq!((forced.keys, forced.left), (vec!["k3".to_string()], 0));
    assert_eq!(
        s.complete(&flying, t_flying, &response("late"), RETENTION)
            .await
            .unwrap(),
        Cas::Fenced,
        "the erased attempt's answer is not recorded"
    );
    assert!(
        matches!(claim(s, &a1, 1).await, Claim::Claimed { .. }),
        "an erased record never replays"
    );
    let nothing = s
        .erase(&erase_step("r", &b_scope, false, 100))
        .await
        .unwrap();
    assert_eq!(nothing.keys, ["k1"]);
    assert!(
        s.erase(&erase_step("r", &b_scope, false, 100))
            .await
            .unwrap()
            .keys
            .is_empty()
    );

    // Steps of at most `limit` (on a Redis Cluster too, whose records are
    // in several buckets), repeated while one may have left more, remove
    // the whole scope.
    let c = [0xc; 32];
    for k in ["c1", "c2", "c3"] {
        completed(at("r", &c, k)).await;
    }
    let first = s.erase(&erase_step("r", &c, false, 2)).await.unwrap();
    assert_eq!(first.keys.len(), 2, "{first:?}");
    let mut removed = first.keys;
    loop {
        let step = s.erase(&erase_step("r", &c, false, 2)).await.unwrap();
        assert!(step.keys.len() <= 2, "{step:?}");
        removed.extend(step.keys.iter().cloned());
        if !step.more(2) {
            assert_eq!(step.left, 0);
            break;
        }
    }
    assert_eq!(sorted(removed), ["c1", "c2", "c3"]);
}

/// Erasure in steps that each resume where the last stopped
/// ([`EraseStep::after`]): over more steps than one, with records kept
/// between those removed (a live lease, without force), it removes every
/// record it may, keeps the others, and ends, in as many steps as the
/// removals need (the kept ones never fill a step). Where a store reads a
/// scope in key order (PostgreSQL, SQLite, the front on PostgreSQL), each
/// step removes only keys past the last step's, names the greatest as its
/// cursor, and a step resumed after a key never reaches back behind it.
async fn erase_resumes_where_the_last_step_stopped(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let d = [0xd; 32];
    let at = |k: &str| RecordKey {
        route: "r".into(),
        scope: d.to_vec(),
        key: k.into(),
    };
    let (mut kept, mut gone) = (Vec::new(), Vec::new());
    for i in 0..10 {
        let k = at(&format!("d{i}"));
        let t = token(claim(s, &k, 1).await);
        if i % 3 == 1 {
            kept.push(k.key);
        } else {
            let done = s.complete(&k, t, &response("mine"), RETENTION).await;
            assert_eq!(done.unwrap(), Cas::Applied);
            gone.push(k.key);
        }
    }
    let ordered = matches!(b, Backend::Postgres | Backend::Sqlite | Backend::Front);
    let (mut removed, mut after, mut steps) = (Vec::new(), None::<String>, 0);
    loop {
        steps += 1;
        assert!(steps <= 10, "the erasure does not end: {removed:?}");
        let step = EraseStep {
            after: after.as_deref(),
            ..erase_step("r", &d, false, 2)
        };
        let step = s.erase(&step).await.unwrap();
        assert!(step.keys.len() <= 2, "{step:?}");
        if ordered {
            for k in &step.keys {
                assert!(
                    after.as_deref().is_none_or(|a| k.as_str() > a),
                    "{k} is behind the cursor {after:?}"
                );
            }
            assert_eq!(step.last.as_ref(), step.keys.iter().max(), "{step:?}");
        } else {
            assert_eq!(step.last, None, "{step:?}");
        }
        removed.extend(step.keys.iter().cloned());
        if step.last.is_some() {
            after.clone_from(&step.last);
        }
        if !step.more(2) {
            assert_eq!(step.left, kept.len() as u64, "{step:?}");
            break;
        }
    }
    removed.sort();
    assert_eq!(removed, gone);
    assert_eq!(steps, gone.len().div_ceil(2), "kept records filled a step");
    for k in &kept {
        assert!(s.inspect(&at(k)).await.unwrap().is_some(), "{k}");
    }
    if !ordered {
        return;
    }
    // A step resumed after `e5` leaves what sorts before it.
    let e = [0xe; 32];
    let at_e = |k: &str| RecordKey {
        route: "r".into(),
        scope: e.to_vec(),
        key: k.into(),
    };
    for i in 0..10 {
        let k = at_e(&format!("e{i}"));
        let t = token(claim(s, &k, 1).await);
        let done = s.complete(&k, t, &response("mine"), RETENTION).await;
        assert_eq!(done.unwrap(), Cas::Applied);
    }
    let resumed = EraseStep {
        after: Some("e5"),
        ..erase_step("r", &e, false, 100)
    };
    let resumed = s.erase(&resumed).await.unwrap();
    assert_eq!(resumed.keys, ["e6", "e7", "e8", "e9"]);
    assert_eq!(resumed.last.as_deref(), Some("e9"));
    assert_eq!(resumed.left, 6, "the keys behind the cursor are left");
    assert!(s.inspect(&at_e("e5")).await.unwrap().is_some());
}

#[tokio::test]
async fn memory_store_refuses_new_keys_when_full_of_live_records() {
    let memory = TestStore::new(Backend::Memory).await;
    let config = StoreConfig {
        max_records: 3,
        ..memory.store_config()
    };
    let store = memory.open_with(&config).await;
    let s = store.as_ref();
    let short = Duration::from_millis(200);
    for i in 0..3 {
        let k = key(&format!("m{i}"));
        let t = token(claim_with(s, &k, 1, LEASE, UnknownOutcome::Hold).await);
        let retention = if i == 0 { short } else { RETENTION };
        s.complete(&k, t, &response("x"), retention).await.unwrap();
    }
    let refused = s
        .claim(&ClaimRequest {
            key: &key("m3"),
            fingerprint: &fp(1),
            attempt: 1,
            lease: LEASE,
            retention: RETENTION,
            on_unknown_outcome: UnknownOutcome::Hold,
            inquire_after: Duration::ZERO,
        })
        .await;
    assert!(
        matches!(refused, Err(idemgate::store::StoreError::Full(3))),
        "{refused:?}"
    );
    // Existing keys still replay; once one expires there is room again.
    assert!(matches!(claim(s, &key("m1"), 1).await, Claim::Replay(_)));
    tokio::time::sleep(Duration::from_millis(400)).await;
    token(claim(s, &key("m3"), 1).await);
}

/// `keys list` is least recently changed first across the whole route,
/// not among the first records a scan happens to find (Redis scans in
/// batches of 1000: the old records must be found behind 1200 newer ones).
async fn list_is_least_recently_changed_first_across_the_route(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    for i in 0..3 {
        token(claim(s, &key(&format!("old-{i}")), 1).await);
        // Distinct times, even at millisecond resolution.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    for i in 0..1200 {
        token(claim(s, &key(&format!("new-{i:04}")), 1).await);
    }
    let oldest: Vec<String> = s
        .list("r", idemgate::store::RecordState::InFlight, 3)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.key)
        .collect();
    assert_eq!(oldest, ["old-0", "old-1", "old-2"]);
}

/// A claim whose answer was lost is abandoned by its attempt id: the
/// record goes if it is still that attempt's and was never forwarded (in
/// flight, or held only because its lease lapsed); anything else stays.
async fn abandon_removes_only_the_attempts_unforwarded_record(b: Backend) {
    let f = Fixture::new(b).await;
    let s = f.store.as_ref();
    let short = Duration::from_millis(200);
    let hold = UnknownOutcome::Hold;

    // In flight: only its own attempt abandons it, and the key is free again.
    let flying = key("ab-flying");
    token(claim_as(s, &flying, 1, 11, LEASE, hold).await);
    assert_eq!(s.abandon(&flying, 12).await.unwrap(), Cas::Fenced);
    assert_eq!(s.abandon(&flying, 11).await.unwrap(), Cas::Applied);
    assert!(matches!(
        claim(s, &flying, 2).await,
        Claim::Claimed {
            takeover: false,
            ..
        }
    ));
    assert_eq!(s.abandon(&key("ab-absent"), 11).await.unwrap(), Cas::Fenced);

    // Its lease lapsed and a retry turned it held: still never forwarded.
    let lapsed = key("ab-lapsed");
    token(claim_as(s, &lapsed, 1, 31, short, hold).await);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        claim(s, &lapsed, 1).await,
        Claim::Held {
            reason: HeldReason::LeaseLapsed,
            ..
        }
    ));
    assert_eq!(s.abandon(&lapsed, 31).await.unwrap(), Cas::Applied);
    token(claim(s, &lapsed, 1).await);

    // Completed, or held for another reason: it was forwarded after all.
    let done = key("ab-done");
    let t = token(claim_as(s, &done, 1, 21, LEASE, hold).await);
    s.complete(&done, t, &response("x"), RETENTION)
        .await
        .unwrap();
    assert_eq!(s.abandon(&done, 21).await.unwrap(), Cas::Fenced);
    assert_eq!(claim(s, &done, 1).await, Claim::Replay(response("x")));
    let held = key("ab-held");
    let t = token(claim_as(s, &held, 1, 41, LEASE, hold).await);
    s.hold(&held, t, HeldReason::UpstreamTimeout, RETENTION)
        .await
        .unwrap();
    assert_eq!(s.abandon(&held, 41).await.unwrap(), Cas::Fenced);
    assert!(matches!(
        claim(s, &held, 1).await,
        Claim::Held {
            reason: HeldReason::UpstreamTimeout,
            ..
        }
    ));

    // Taken over by another attempt: the first one's abandon is fenced.
    let release = UnknownOutcome::Release;
    let taken = key("ab-taken");
    token(claim_as(s, &taken, 1, 51, short, release).await);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let takeover = claim_as(s, &taken, 1, 52, LEASE, release).await;
    assert!(matches!(takeover, Claim::Claimed { takeover: true, .. }));
    assert_eq!(s.abandon(&taken, 51).await.unwrap(), Cas::Fenced);
    assert_eq!(s.abandon(&taken, 52).await.unwrap(), Cas::Applied);
}

// Every backend, the Redis store on a Redis Cluster too, and PostgreSQL
// with its Redis front.
per_backend!(
    only [postgres, redis, redis_cluster, sqlite, memory, front]:
    claim_outcomes,
    refusals_say_when_the_record_expires,
    fenced_late_writer_cannot_overwrite,
    lapsed_lease_is_held_under_hold,
    renew_extends_the_lease,
    release_frees_the_key_with_a_new_token,
    hold_blocks_until_retention,
    expired_records_are_claimable_again,
    scopes_and_routes_are_isolated,
    concurrent_claims_have_one_winner,
    large_bodies_round_trip,
    completion_is_idempotent_for_its_own_attempt,
    sweep_deletes_only_expired_records,
    records_hold_across_generation_boundaries,
    a_live_lease_outlives_retention,
    key_administration,
    erase_removes_one_scope_on_one_route,
    erase_resumes_where_the_last_step_stopped,
    list_is_least_recently_changed_first_across_the_route,
    abandon_removes_only_the_attempts_unforwarded_record,
);
