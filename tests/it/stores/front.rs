//! The front store (PostgreSQL with a Redis front, `[store.front]`): what
//! the front answers by itself, and its invariants. The conformance suite
//! and every `per_backend!` test run on it too (the `front` backend); here
//! are the properties only it has:
//!
//! - replays, `422`s and `409`s come from Redis, for any instance, without
//!   a PostgreSQL round trip (PostgreSQL's batch counter does not move);
//! - the front flushed, stale (a late write after an operator's delete),
//!   frozen (SIGSTOP) or gone (SIGKILL, restarted empty) never causes a
//!   second execution, a wrong replay, or a `409` for a key that is free
//!   or already completed;
//! - its entries expire with the record's retention;
//! - an outage degrades to PostgreSQL alone, counted once, never an error;
//! - the outbox is written only by instances with a front, and not for
//!   swept records.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use deadpool_redis::redis;
use http::{HeaderMap, StatusCode};
use idemgate::config::{StoreConfig, UnknownOutcome};
use idemgate::store::{
    Backend as Store, Cas, Claim, ClaimRequest, FrontConfig, FrontStats, HeldReason, RecordKey,
    StoredResponse,
};
use sqlx::Connection;

use super::conformance::kept_about;
use crate::support::servers::PrivateRedis;
use crate::support::{
    Backend, Gateway, TestDb, TestStore, Upstream, client, eventually, post, sample,
};

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);

/// How long a claimed attempt runs before the front marks it in flight
/// (`[store.front] mark_after`), unless a test says otherwise.
const MARK_AFTER: Duration = Duration::from_millis(10);

/// A front store on `db` with its front at `redis` (keys under `prefix`).
async fn open(db: &str, redis: &str, prefix: &str, timeout: Duration) -> Arc<dyn Store> {
    open_marking(db, redis, prefix, timeout, MARK_AFTER).await
}

/// [`open`], marking attempts still unsettled after `mark_after`.
async fn open_marking(
    db: &str,
    redis: &str,
    prefix: &str,
    timeout: Duration,
    mark_after: Duration,
) -> Arc<dyn Store> {
    let config = StoreConfig {
        url: db.to_string(),
        migrate: true,
        pool_size: 8,
        timeout: Duration::from_secs(5),
        batches_in_flight: 1,
        claim_queue_budget: Duration::from_secs(5),
        prefix: prefix.to_string(),
        cluster: false,
        replicas: 0,
        replica_timeout: Duration::from_millis(100),
        max_records: 10_000,
        sweep_interval: Duration::from_secs(60),
        sweep_batch: 100,
        generation: Duration::ZERO,
        replay_cache_ttl: Duration::ZERO,
        replay_cache_size: 0,
        wait_routes: idemgate::store::WaitRoutes::default(),
        encryption_keys: None,
        compress: true,
        compression: idemgate::config::DEFAULT_STORE_COMPRESSION,
        accept_plain_records: true,
        front: Some(FrontConfig {
            url: redis.to_string(),
            timeout,
            mark_after,
            fence_life: Duration::from_secs(120),
        }),
    };
    idemgate::store::open(&config)
        .await
        .expect("front store opens")
}

/// Two instances sharing one database and one front (the shared Redis).
struct Pair {
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
    storage: TestStore,
}

impl Pair {
    async fn new() -> Self {
        Self::marking(MARK_AFTER).await
    }

    /// Two instances that mark attempts still unsettled after `mark_after`.
    async fn marking(mark_after: Duration) -> Self {
        let storage = TestStore::new(Backend::Front).await;
        let redis = crate::support::store::redis_url();
        let timeout = Duration::from_secs(5);
        let a = open_marking(&storage.url, &redis, storage.prefix(), timeout, mark_after).await;
        let b = open_marking(&storage.url, &redis, storage.prefix(), timeout, mark_after).await;
        assert!(
            stats(&*a).up && stats(&*b).up,
            "the front is up from the start"
        );
        Self { a, b, storage }
    }
}

/// The key prefixes whose relays are paused now. The failpoint is one for
/// the whole test binary, and tests run in parallel: each pause adds its
/// prefix to the list the failpoint is armed with, and takes it out again.
static PAUSED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Relays paused for one prefix, until dropped.
struct RelayPause(String);

fn arm_relay_pause(paused: &BTreeSet<String>) {
    if paused.is_empty() {
        fail::remove("front-relay-pause");
    } else {
        let list: Vec<&str> = paused.iter().map(String::as_str).collect();
        fail::cfg("front-relay-pause", &format!("return({})", list.join(","))).unwrap();
    }
}

impl Drop for RelayPause {
    fn drop(&mut self) {
        let mut paused = PAUSED.lock().unwrap_or_else(|e| e.into_inner());
        paused.remove(&self.0);
        arm_relay_pause(&paused);
    }
}

impl Pair {
    /// Stop both instances' relays (the `front-relay-pause` failpoint, on
    /// this pair's prefix) until the pause is dropped.
    fn pause_relays(&self) -> RelayPause {
        let prefix = self.storage.prefix().to_string();
        let mut paused = PAUSED.lock().unwrap_or_else(|e| e.into_inner());
        paused.insert(prefix.clone());
        arm_relay_pause(&paused);
        RelayPause(prefix)
    }
}

fn stats(store: &dyn Store) -> FrontStats {
    store.front_stats().expect("a front store")
}

/// Operations PostgreSQL's batches carried for this instance (claims and
/// completions): unchanged while the front answers.
fn pg_ops(store: &dyn Store) -> u64 {
    store.batch_stats().expect("PostgreSQL batches").operations
}

fn key(k: &str) -> RecordKey {
    RecordKey {
        route: "r".into(),
        scope: Vec::new(),
        key: k.into(),
    }
}

async fn claim_lease(store: &dyn Store, k: &RecordKey, f: u8, lease: Duration) -> Claim {
    store
        .claim(&ClaimRequest {
            key: k,
            fingerprint: &[f; 32],
            attempt: idemgate::store::new_attempt_id(),
            lease,
            retention: RETENTION,
            on_unknown_outcome: UnknownOutcome::Hold,
            inquire_after: Duration::ZERO,
        })
        .await
        .expect("claim")
}

async fn claim(store: &dyn Store, k: &RecordKey, f: u8) -> Claim {
    claim_lease(store, k, f, LEASE).await
}

fn token(c: Claim) -> i64 {
    match c {
        Claim::Claimed { token, .. } => token,
        other => panic!("expected a claim, got {other:?}"),
    }
}

fn response(body: &'static str) -> StoredResponse {
    StoredResponse {
        status: StatusCode::CREATED,
        headers: HeaderMap::new(),
        body: Bytes::from_static(body.as_bytes()),
    }
}

/// Wait until `store`'s front answers `k` by itself (the fast path and the
/// relay run off the caller's path).
async fn front_has(store: &dyn Store, k: &RecordKey, f: u8) -> Claim {
    eventually(Duration::from_secs(5), || async {
        let before = stats(store);
        let answer = claim(store, k, f).await;
        let after = stats(store);
        let from_front = after.replays + after.mismatches + after.held + after.conflicts
            > before.replays + before.mismatches + before.held + before.conflicts;
        from_front.then_some(answer)
    })
    .await
    .unwrap_or_else(|| panic!("the front never answered {}", k.key))
}

/// The front's Redis keys for this test.
async fn front_keys(redis_url: &str, prefix: &str) -> Vec<String> {
    let client = redis::Client::open(redis_url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Delete every front key of this test (a flush of the front).
async fn flush(redis_url: &str, prefix: &str) {
    let keys = front_keys(redis_url, prefix).await;
    let client = redis::Client::open(redis_url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for k in keys {
        let _: i64 = redis::cmd("DEL")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

/// Wait until the relays have drained the outbox.
async fn outbox_drains(db: &str) {
    eventually(Duration::from_secs(5), || async {
        (outbox_rows(db).await == 0).then_some(())
    })
    .await
    .expect("the relays drain the outbox");
}

async fn outbox_rows(db: &str) -> i64 {
    let mut conn = sqlx::PgConnection::connect(db).await.unwrap();
    sqlx::query_scalar("SELECT count(*) FROM idemgate_front_outbox")
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn replays_mismatches_and_conflicts_come_from_the_front_for_every_instance() {
    let p = Pair::new().await;
    let (a, b) = (&*p.a, &*p.b);

    // In flight on A: once the marker has landed (it is written while the
    // request is forwarded), B's duplicates are refused by the front.
    let k = key("shared");
    let t = token(claim(a, &k, 1).await);
    match front_has(b, &k, 1).await {
        Claim::InFlight { retry_after, .. } => assert!(retry_after <= LEASE),
        other => panic!("expected 409, got {other:?}"),
    }
    let ops = pg_ops(b);
    let conflicts = stats(b).conflicts;
    // With the record's expiry, as PostgreSQL would say it.
    kept_about(&claim(b, &k, 1).await, RETENTION);
    kept_about(&claim(b, &k, 2).await, RETENTION);
    assert_eq!(stats(b).conflicts, conflicts + 1);
    assert_eq!(stats(b).mismatches, 1);
    assert_eq!(pg_ops(b), ops, "the front answered without PostgreSQL");

    // Completed on A: B replays it from the front.
    assert_eq!(
        a.complete(&k, t, &response("once"), RETENTION)
            .await
            .unwrap(),
        Cas::Applied
    );
    assert_eq!(front_has(b, &k, 1).await, Claim::Replay(response("once")));
    let ops = pg_ops(b);
    for _ in 0..20 {
        assert_eq!(claim(b, &k, 1).await, Claim::Replay(response("once")));
    }
    kept_about(&claim(b, &k, 3).await, RETENTION);
    assert_eq!(pg_ops(b), ops, "replays without PostgreSQL");
    assert!(stats(b).replays >= 21);

    // Held on A: B gets the held answer from the front.
    let h = key("held");
    let t = token(claim(a, &h, 1).await);
    assert_eq!(
        a.hold(&h, t, HeldReason::UpstreamTimeout, RETENTION)
            .await
            .unwrap(),
        Cas::Applied
    );
    let held = front_has(b, &h, 1).await;
    assert!(matches!(
        held,
        Claim::Held {
            reason: HeldReason::UpstreamTimeout,
            ..
        }
    ));
    kept_about(&held, RETENTION);
    outbox_drains(&p.storage.url).await;
}

/// G2 and "never a 409 for a free key", right after the write returned:
/// a completed key is replayed and a released one is claimable at once,
/// from any instance, although the other instance's front had it in flight.
#[tokio::test]
async fn a_settled_key_is_never_answered_in_flight_once_its_write_returned() {
    let p = Pair::new().await;
    let (a, b) = (&*p.a, &*p.b);
    for i in 0..40 {
        let k = key(&format!("k{i}"));
        let t = token(claim(a, &k, 1).await);
        assert!(matches!(front_has(b, &k, 1).await, Claim::InFlight { .. }));
        if i % 2 == 0 {
            a.complete(&k, t, &response("done"), RETENTION)
                .await
                .unwrap();
            assert_eq!(
                claim(b, &k, 1).await,
                Claim::Replay(response("done")),
                "a completed key answered in flight"
            );
        } else {
            assert_eq!(a.release(&k, t).await.unwrap(), Cas::Applied);
            assert!(
                matches!(claim(b, &k, 1).await, Claim::Claimed { .. }),
                "a released key answered in flight"
            );
        }
    }
    assert!(stats(b).conflicts >= 40, "the front did answer the 409s");
}

/// A held record whose reason changes under the same token (held for its
/// lapsed lease, then held by its own attempt for the upstream's timeout)
/// writes an outbox row (migration 0005), so a front that missed the
/// change hears of it; the relay reads held records again rather than
/// trusting the front's kind and token alone.
#[tokio::test]
async fn a_held_reason_that_changes_reaches_the_front() {
    let p = Pair::new().await;
    let (a, b) = (&*p.a, &*p.b);
    let pause = p.pause_relays();
    let k = key("lapsed");
    let t = token(claim_lease(a, &k, 1, Duration::from_millis(300)).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(matches!(
        claim(b, &k, 1).await,
        Claim::Held {
            reason: HeldReason::LeaseLapsed,
            ..
        }
    ));
    let before = outbox_rows(&p.storage.url).await;
    assert_eq!(
        a.hold(&k, t, HeldReason::UpstreamTimeout, RETENTION)
            .await
            .unwrap(),
        Cas::Applied
    );
    assert_eq!(
        outbox_rows(&p.storage.url).await,
        before + 1,
        "the new reason writes a row"
    );
    drop(pause);
    outbox_drains(&p.storage.url).await;
    assert!(matches!(
        front_has(b, &k, 1).await,
        Claim::Held {
            reason: HeldReason::UpstreamTimeout,
            ..
        }
    ));
}

/// The marker is written while the request is forwarded; an attempt that
/// completes or is released while it is being written waits for it first,
/// so it never lands after the settled record or the fence. Here markers
/// are due at once (`mark_after = 0`), a failpoint holds every marker back
/// 200 ms, and each attempt settles 50 ms after its claim, while its
/// marker is held back; the relays are paused, so only what the request
/// path wrote counts: after the late markers had time to land, no front
/// has any of the keys in flight. (A release's fence alone would refuse a
/// late marker; the flush right after the releases removes the fences, as
/// a `FLUSHALL` or an evicting Redis would.)
#[tokio::test]
async fn a_marker_written_off_the_path_never_lands_after_its_attempt_settled() {
    let p = Pair::marking(Duration::ZERO).await;
    let (a, b) = (&*p.a, &*p.b);
    let redis = crate::support::store::redis_url();
    let pause = p.pause_relays();
    fail::cfg("front-mark-delay", "return(late-mark-)").unwrap();
    let mut completed = Vec::new();
    for i in 0..5 {
        let k = key(&format!("late-mark-c{i}"));
        let t = token(claim(a, &k, 1).await);
        // The marker task takes the marker at once and holds it back
        // 200 ms; the completion comes meanwhile.
        tokio::time::sleep(Duration::from_millis(50)).await;
        a.complete(&k, t, &response("done"), RETENTION)
            .await
            .unwrap();
        completed.push(k);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    for k in &completed {
        let answer = front_has(b, k, 1).await;
        assert_eq!(answer, Claim::Replay(response("done")), "{}", k.key);
    }
    assert_eq!(stats(a).marks, 5, "every attempt was marked");
    // Few, so that all of them are released, and the front flushed, before
    // the first marker lands.
    let mut released = Vec::new();
    for i in 0..2 {
        let k = key(&format!("late-mark-r{i}"));
        let t = token(claim(a, &k, 1).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(a.release(&k, t).await.unwrap(), Cas::Applied);
        released.push(k);
    }
    flush(&redis, p.storage.prefix()).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    fail::remove("front-mark-delay");
    for k in &released {
        let answer = claim(b, k, 1).await;
        assert!(
            matches!(answer, Claim::Claimed { .. }),
            "{}: {answer:?}",
            k.key
        );
    }
    drop(pause);
    assert_eq!(stats(a).errors + stats(b).errors, 0);
}

/// A renewal while the attempt's marker is being written waits for that
/// write, so the marker ends with the renewed lease (a renewal's `EXTEND`
/// that reached Redis before the `MARK` would change nothing, and the
/// marker would end with the first lease).
#[tokio::test]
async fn a_renewal_during_the_marker_write_extends_the_marker() {
    let p = Pair::marking(Duration::ZERO).await;
    let (a, b) = (&*p.a, &*p.b);
    fail::cfg("front-mark-delay", "return(renewed-mark)").unwrap();
    let k = key("renewed-mark");
    let t = token(claim_lease(a, &k, 1, Duration::from_secs(2)).await);
    // The marker task has taken the marker and holds it back 200 ms.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(a.renew(&k, t, LEASE).await.unwrap(), Cas::Applied);
    fail::remove("front-mark-delay");
    match front_has(b, &k, 1).await {
        Claim::InFlight { retry_after, .. } => assert!(
            retry_after > Duration::from_secs(2),
            "the marker kept the first lease: {retry_after:?} left"
        ),
        other => panic!("expected 409, got {other:?}"),
    }
}

/// `mark_after`: attempts that settle sooner are never marked (no Redis
/// write on their path), yet their settled records reach the front from
/// the completing instance (the relays are paused here); an attempt still
/// running by then is marked, and the other instance's front refuses its
/// duplicates. Each quick attempt runs 50 ms, time enough for a marker
/// written at once to land.
#[tokio::test]
async fn only_attempts_still_running_after_mark_after_are_marked() {
    let p = Pair::marking(Duration::from_secs(1)).await;
    let (a, b) = (&*p.a, &*p.b);
    let redis = crate::support::store::redis_url();
    let pause = p.pause_relays();
    for i in 0..20 {
        let k = key(&format!("quick{i}"));
        let t = token(claim(a, &k, 1).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
        if i % 4 == 3 {
            a.hold(&k, t, HeldReason::UpstreamFailed, RETENTION)
                .await
                .unwrap();
        } else {
            a.complete(&k, t, &response("quick"), RETENTION)
                .await
                .unwrap();
        }
    }
    let settled = eventually(Duration::from_secs(5), || async {
        let kinds = entry_kinds(&redis, p.storage.prefix()).await;
        (kinds.len() == 20).then_some(kinds)
    })
    .await
    .expect("the quick attempts' records reach the front without the relays");
    assert_eq!(settled.iter().filter(|k| *k == "completed").count(), 15);
    assert_eq!(settled.iter().filter(|k| *k == "held").count(), 5);
    assert_eq!(stats(a).marks, 0, "no quick attempt was marked");
    let running = key("running");
    let _t = token(claim(a, &running, 1).await);
    assert!(matches!(
        front_has(b, &running, 1).await,
        Claim::InFlight { .. }
    ));
    // Counted once the marker's write returned, which may be after `b`
    // read the marker.
    let marked = eventually(Duration::from_secs(5), || async {
        (stats(a).marks >= 1).then_some(stats(a).marks)
    })
    .await;
    assert_eq!(marked, Some(1), "the running attempt was marked, once");
    drop(pause);
    assert_eq!(stats(a).errors + stats(b).errors, 0);
}

/// The front flushed (every key gone, fences too): every answer is the
/// same, from PostgreSQL, and read-repair refills the front.
#[tokio::test]
async fn a_flushed_front_changes_no_answer_and_is_refilled() {
    let p = Pair::new().await;
    let (a, b) = (&*p.a, &*p.b);
    let redis = crate::support::store::redis_url();
    let done = key("done");
    let t = token(claim(a, &done, 1).await);
    a.complete(&done, t, &response("kept"), RETENTION)
        .await
        .unwrap();
    let flying = key("flying");
    let ft = token(claim(a, &flying, 1).await);
    let held = key("held");
    let ht = token(claim(a, &held, 1).await);
    a.hold(&held, ht, HeldReason::UpstreamFailed, RETENTION)
        .await
        .unwrap();
    assert_eq!(
        front_has(b, &done, 1).await,
        Claim::Replay(response("kept"))
    );

    // The relay has applied every outbox row, so after the flush only
    // read-repair can fill the front again.
    outbox_drains(&p.storage.url).await;
    flush(&redis, p.storage.prefix()).await;
    assert!(front_keys(&redis, p.storage.prefix()).await.is_empty());
    assert_eq!(claim(b, &done, 1).await, Claim::Replay(response("kept")));
    assert!(matches!(claim(b, &done, 2).await, Claim::Mismatch { .. }));
    assert!(matches!(claim(b, &flying, 1).await, Claim::InFlight { .. }));
    assert!(matches!(
        claim(b, &held, 1).await,
        Claim::Held {
            reason: HeldReason::UpstreamFailed,
            ..
        }
    ));
    // Read-repair gave the front the settled records PostgreSQL answered.
    assert_eq!(
        front_has(b, &done, 1).await,
        Claim::Replay(response("kept"))
    );
    assert!(matches!(
        front_has(b, &held, 1).await,
        Claim::Held {
            reason: HeldReason::UpstreamFailed,
            ..
        }
    ));
    // (Counted once its transaction has committed, just after the write.)
    eventually(Duration::from_secs(5), || async {
        (stats(b).repairs >= 2).then_some(())
    })
    .await
    .expect("two read-repairs counted");
    // The in-flight attempt still settles, and is replayed everywhere.
    a.complete(&flying, ft, &response("late"), RETENTION)
        .await
        .unwrap();
    assert_eq!(claim(b, &flying, 1).await, Claim::Replay(response("late")));
    assert_eq!(claim(a, &flying, 1).await, Claim::Replay(response("late")));
}

/// The kinds of the front entries this test's keys have (`completed`,
/// `in_flight`, `held`), read straight from Redis: no claim, so no
/// read-repair.
async fn entry_kinds(redis_url: &str, prefix: &str) -> Vec<String> {
    let client = redis::Client::open(redis_url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut kinds = Vec::new();
    for k in front_keys(redis_url, prefix).await {
        if k.contains("front:") {
            let kind: Option<String> = redis::cmd("HGET")
                .arg(&k)
                .arg("kind")
                .query_async(&mut conn)
                .await
                .unwrap();
            kinds.extend(kind);
        }
    }
    kinds
}

/// Wait until the kinds of this test's front entries are `expected`.
async fn front_becomes(redis_url: &str, prefix: &str, expected: &[&str], what: &str) {
    eventually(Duration::from_secs(5), || async {
        (entry_kinds(redis_url, prefix).await == expected).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("{what}"));
}

/// The relay deletes the outbox rows of completions the front already
/// shows (the completing instance wrote them) without writing again, and
/// gives the front the ones it does not show: here the marker was lost
/// (a flush) before the completion, so the completing instance's write,
/// which only replaces its own entry, wrote nothing.
#[tokio::test]
async fn the_relay_skips_what_the_front_shows_and_publishes_what_it_lacks() {
    let p = Pair::new().await;
    let (a, b) = (&*p.a, &*p.b);
    let redis = crate::support::store::redis_url();
    let shown = |p: &Pair| stats(&*p.a).relayed_shown + stats(&*p.b).relayed_shown;

    // The relays wait until the front shows the completion (else one
    // could publish it itself): it was never marked, so the completing
    // instance shows it off its caller's path.
    let pause = p.pause_relays();
    let normal = key("normal");
    let t = token(claim(a, &normal, 1).await);
    a.complete(&normal, t, &response("one"), RETENTION)
        .await
        .unwrap();
    front_becomes(
        &redis,
        p.storage.prefix(),
        &["completed"],
        "the completing instance shows its completion",
    )
    .await;
    drop(pause);
    eventually(Duration::from_secs(5), || async {
        (outbox_rows(&p.storage.url).await == 0 && shown(&p) >= 1).then_some(())
    })
    .await
    .expect("the completion's row is deleted as shown");
    assert_eq!(entry_kinds(&redis, p.storage.prefix()).await, ["completed"]);

    // The marker has landed (it is written off the claim's path) when
    // the flush takes it away.
    let lost = key("lost");
    let t = token(claim(a, &lost, 1).await);
    assert!(matches!(
        front_has(b, &lost, 1).await,
        Claim::InFlight { .. }
    ));
    flush(&redis, p.storage.prefix()).await;
    let shown_before = shown(&p);
    a.complete(&lost, t, &response("two"), RETENTION)
        .await
        .unwrap();
    front_becomes(
        &redis,
        p.storage.prefix(),
        &["completed"],
        "the relay publishes the completion the front lacked",
    )
    .await;
    outbox_drains(&p.storage.url).await;
    assert_eq!(
        shown(&p),
        shown_before,
        "a row the front lacked is not shown"
    );
    let before = pg_ops(b);
    assert_eq!(claim(b, &lost, 1).await, Claim::Replay(response("two")));
    assert_eq!(pg_ops(b), before, "answered by the front");
    assert_eq!(stats(a).repairs + stats(b).repairs, 0, "no read-repair");
}

/// A late write never undoes an operator's delete: the completing
/// instance's write of the settled record to the front is held back (a
/// failpoint) past PostgreSQL's commit until after `keys delete` returned;
/// the fence keeps it out, and the key is new again everywhere. Both
/// writes are tried: in place of the attempt's marker (an attempt still
/// running after `mark_after`) and off the caller's path (one that settled
/// before it was marked).
#[tokio::test]
async fn a_delete_is_never_undone_by_a_late_front_write() {
    // Long enough that the unmarked attempt surely settles first.
    let p = Pair::marking(Duration::from_secs(1)).await;
    for marked in [true, false] {
        let k = key(&format!("late-write-after-delete-{marked}"));
        fail::cfg("front-publish-delay", &format!("return({})", k.key)).unwrap();
        let t = token(claim(&*p.a, &k, 1).await);
        if marked {
            assert!(matches!(
                front_has(&*p.b, &k, 1).await,
                Claim::InFlight { .. }
            ));
        }
        let (a, k2) = (p.a.clone(), k.clone());
        let completing = tokio::spawn(async move {
            a.complete(&k2, t, &response("deleted"), RETENTION)
                .await
                .unwrap()
        });
        // PostgreSQL has it; the front does not yet.
        eventually(Duration::from_secs(5), || async {
            let info = p.b.inspect(&k).await.unwrap()?;
            (info.state == idemgate::store::RecordState::Completed).then_some(())
        })
        .await
        .expect("the completion commits");
        assert!(
            p.b.delete(&k, false).await.unwrap(),
            "a completed record is deletable"
        );
        assert_eq!(completing.await.unwrap(), Cas::Applied);
        // The late write has had its chance (held back 500 ms).
        tokio::time::sleep(Duration::from_millis(700)).await;
        fail::remove("front-publish-delay");
        for store in [&*p.a, &*p.b] {
            let answer = claim(store, &k, 2).await;
            assert!(
                matches!(answer, Claim::Claimed { .. } | Claim::InFlight { .. }),
                "the deleted record came back (marked: {marked})"
            );
            // Released at once: never marked, it leaves the count alone.
            if let Claim::Claimed { token, .. } = answer {
                assert_eq!(store.release(&k, token).await.unwrap(), Cas::Applied);
            }
        }
    }
    assert_eq!(stats(&*p.a).marks, 1, "one attempt was marked");
}

/// Entries live no longer than the record's retention.
#[tokio::test]
async fn front_entries_expire_with_retention() {
    let p = Pair::new().await;
    let (a, b) = (&*p.a, &*p.b);
    let redis = crate::support::store::redis_url();
    let k = key("short");
    let t = token(claim(a, &k, 1).await);
    a.complete(&k, t, &response("brief"), Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(front_has(b, &k, 1).await, Claim::Replay(response("brief")));
    let client = redis::Client::open(redis.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let entry = front_keys(&redis, p.storage.prefix())
        .await
        .into_iter()
        .find(|k| k.contains("front:"))
        .expect("the front entry");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&entry)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 0 && ttl <= 2_000, "entry TTL {ttl} ms, retention 2 s");
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    assert!(
        matches!(claim(b, &k, 1).await, Claim::Claimed { .. }),
        "replayed past retention"
    );
}

/// A frozen front (SIGSTOP): requests go on from PostgreSQL after one
/// timeout, the outage is counted once; a key released meanwhile is free
/// once the front thaws, and the front is used again once caught up.
#[tokio::test]
async fn a_frozen_front_degrades_to_postgres_and_comes_back_caught_up() {
    let db = TestDb::new().await;
    let redis = PrivateRedis::start();
    let timeout = Duration::from_millis(300);
    let a = open(&db.url, &redis.url(), "f:", timeout).await;
    let b = open(&db.url, &redis.url(), "f:", timeout).await;
    let (a, b) = (&*a, &*b);

    let done = key("done");
    let t = token(claim(a, &done, 1).await);
    a.complete(&done, t, &response("before"), RETENTION)
        .await
        .unwrap();
    assert_eq!(
        front_has(b, &done, 1).await,
        Claim::Replay(response("before"))
    );
    // Marked in flight in the front before the freeze, released during it.
    let early = key("early");
    let et = token(claim(a, &early, 1).await);
    let freed = key("freed");
    let ft = token(claim(a, &freed, 1).await);
    assert!(matches!(claim(b, &freed, 1).await, Claim::InFlight { .. }));
    assert!(matches!(claim(b, &early, 1).await, Claim::InFlight { .. }));

    // (Relative counts: a busy machine may have cost an outage already.)
    let outages = [stats(a).outages, stats(b).outages];
    redis.signal("-STOP");
    assert_eq!(claim(b, &done, 1).await, Claim::Replay(response("before")));
    assert_eq!(a.release(&early, et).await.unwrap(), Cas::Applied);
    assert_eq!(a.release(&freed, ft).await.unwrap(), Cas::Applied);
    let during = key("during");
    let dt = token(claim(a, &during, 1).await);
    assert_eq!(
        a.complete(&during, dt, &response("frozen"), RETENTION)
            .await
            .unwrap(),
        Cas::Applied
    );
    for _ in 0..10 {
        assert_eq!(
            claim(b, &during, 1).await,
            Claim::Replay(response("frozen"))
        );
        assert_eq!(claim(a, &done, 1).await, Claim::Replay(response("before")));
    }
    for (store, before) in [a, b].into_iter().zip(outages) {
        assert!(!stats(store).up, "the front is down while frozen");
        assert_eq!(stats(store).outages, before + 1, "one outage, counted once");
    }

    // The releases' outbox rows are held up (the relays skip locked rows):
    // the front answers again, but has not caught up, so it stays unused.
    let mut blocker = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    let locked: Vec<i64> = sqlx::query_scalar("SELECT id FROM idemgate_front_outbox FOR UPDATE")
        .fetch_all(&mut blocker)
        .await
        .unwrap();
    assert!(locked.len() >= 2, "the releases wrote outbox rows");
    redis.signal("-CONT");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        !stats(a).up && !stats(b).up,
        "up before the outbox reached the front"
    );
    assert!(
        matches!(claim(b, &early, 1).await, Claim::Claimed { .. }),
        "a key released while the front was frozen answered in flight"
    );
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();

    for store in [a, b] {
        eventually(Duration::from_secs(10), || async {
            stats(store).up.then_some(())
        })
        .await
        .expect("the front comes back");
    }
    assert!(
        matches!(claim(b, &freed, 1).await, Claim::Claimed { .. }),
        "a key released while the front was frozen answered in flight"
    );
    assert_eq!(
        front_has(b, &during, 1).await,
        Claim::Replay(response("frozen"))
    );
    assert_eq!(stats(a).outages, outages[0] + 1);
    assert_eq!(stats(b).outages, outages[1] + 1);
}

/// A front that is gone (SIGKILL), then back empty: nothing fails, and it
/// refills.
#[tokio::test]
async fn a_lost_front_is_never_an_error_and_refills_when_back() {
    let db = TestDb::new().await;
    let mut redis = PrivateRedis::start();
    let a = open(&db.url, &redis.url(), "g:", Duration::from_millis(300)).await;
    let a = &*a;
    let done = key("done");
    let t = token(claim(a, &done, 1).await);
    a.complete(&done, t, &response("kept"), RETENTION)
        .await
        .unwrap();
    assert_eq!(
        front_has(a, &done, 1).await,
        Claim::Replay(response("kept"))
    );

    let outages = stats(a).outages;
    redis.kill();
    for i in 0..5 {
        assert_eq!(claim(a, &done, 1).await, Claim::Replay(response("kept")));
        let k = key(&format!("new{i}"));
        let t = token(claim(a, &k, 1).await);
        assert_eq!(
            a.complete(&k, t, &response("new"), RETENTION)
                .await
                .unwrap(),
            Cas::Applied
        );
    }
    assert!(!stats(a).up);
    assert_eq!(stats(a).outages, outages + 1);

    redis.restart();
    eventually(Duration::from_secs(10), || async {
        stats(a).up.then_some(())
    })
    .await
    .expect("the front comes back");
    assert_eq!(claim(a, &done, 1).await, Claim::Replay(response("kept")));
    assert_eq!(
        front_has(a, &done, 1).await,
        Claim::Replay(response("kept"))
    );
}

/// A front that does not answer at start is a warning, not an error.
#[tokio::test]
async fn a_front_down_at_start_is_not_an_error() {
    let db = TestDb::new().await;
    let mut redis = PrivateRedis::start();
    let url = redis.url();
    redis.kill();
    let a = open(&db.url, &url, "s:", Duration::from_millis(300)).await;
    let a = &*a;
    assert!(!stats(a).up);
    let k = key("k");
    let t = token(claim(a, &k, 1).await);
    a.complete(&k, t, &response("pg"), RETENTION).await.unwrap();
    assert_eq!(claim(a, &k, 1).await, Claim::Replay(response("pg")));
    redis.restart();
    eventually(Duration::from_secs(10), || async {
        stats(a).up.then_some(())
    })
    .await
    .expect("the front comes up");
}

/// Only connections of a front store write outbox rows, and sweeping
/// expired records writes none; changes in either generation's partition
/// write them.
#[tokio::test]
async fn the_outbox_is_written_only_for_a_front_and_not_by_sweeps() {
    let storage = TestStore::new(Backend::Postgres).await;
    let plain = storage.open().await;
    let k = key("plain");
    let t = token(claim(&*plain, &k, 1).await);
    plain
        .complete(&k, t, &response("x"), Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(outbox_rows(&storage.url).await, 0);

    // A front store on the same database, its relay stopped by pointing
    // its front nowhere: its rows stay for the test to count.
    let nowhere = format!("redis://127.0.0.1:{}", crate::support::process::free_port());
    let front = open(&storage.url, &nowhere, "o:", Duration::from_millis(100)).await;
    let f = key("front");
    let t = token(claim(&*front, &f, 1).await);
    front
        .complete(&f, t, &response("y"), Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(outbox_rows(&storage.url).await, 1, "the completion's row");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Two passes: the second retires the records' generation.
    for _ in 0..2 {
        idemgate::sweep_once(front.as_ref(), 100, None)
            .await
            .unwrap();
    }
    for gone in [&k, &f] {
        assert_eq!(
            front.inspect(gone).await.unwrap(),
            None,
            "an expired record stayed"
        );
    }
    assert_eq!(outbox_rows(&storage.url).await, 1, "a sweep writes no row");
    // A third: new keys go to the other partition, whose changes write rows too.
    idemgate::sweep_once(front.as_ref(), 100, None)
        .await
        .unwrap();
    let g = key("later");
    let t = token(claim(&*front, &g, 1).await);
    front
        .complete(&g, t, &response("z"), Duration::from_secs(60))
        .await
        .unwrap();
    let mut conn = sqlx::PgConnection::connect(&storage.url).await.unwrap();
    let slot: i16 = sqlx::query_scalar("SELECT slot FROM idemgate_records WHERE key = 'later'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(slot, 1, "the third pass did not make slot 1 current");
    assert_eq!(
        outbox_rows(&storage.url).await,
        2,
        "slot 1's completion wrote no row"
    );
}

/// Through the gateway: the front's answers carry the usual headers and
/// problems, and `/metrics` shows them.
#[tokio::test]
async fn the_gateway_serves_front_answers_and_exports_their_metrics() {
    let store = TestStore::new(Backend::Front).await;
    let upstream = Upstream::start().await;
    let a = Gateway::start(&store.config(&upstream.url())).await;
    let b = Gateway::start(&store.config(&upstream.url())).await;
    let c = client();
    let first = post(&c, &a.url("/v1/payments"), "m1", r#"{"n":1}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = eventually(Duration::from_secs(5), || async {
        let reply = post(&c, &b.url("/v1/payments"), "m1", r#"{"n":1}"#).await;
        let metrics = b.metrics().await;
        (sample(&metrics, "idemgate_front_answers_total{answer=\"replay\"}") >= 1.0)
            .then_some(reply)
    })
    .await
    .expect("a replay from the front");
    assert!(replay.is_replay());
    assert_eq!(replay.body, first.body);
    let other = post(&c, &b.url("/v1/payments"), "m1", r#"{"n":2}"#).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    // (The per-instance replay cache, in front of the front, answered it.)
    assert_eq!(other.problem_type(), "urn:idemgate:problem:key-reused");
    let metrics = b.metrics().await;
    assert_eq!(sample(&metrics, "idemgate_front_up"), 1.0);
    assert_eq!(sample(&metrics, "idemgate_front_outages_total"), 0.0);
    assert_eq!(upstream.count("m1"), 1);
    a.shutdown().await;
    b.shutdown().await;
}

/// Copy a directory tree.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A front that comes back as another server process with old data (here:
/// its append-only file from before an operator's delete) is wiped before
/// use: the outbox row that carried the delete is long gone.
#[tokio::test]
async fn a_front_restarted_from_an_old_snapshot_is_wiped_before_use() {
    let db = TestDb::new().await;
    let mut redis = PrivateRedis::start_durable();
    let a = open(&db.url, &redis.url(), "w:", Duration::from_millis(300)).await;
    let a = &*a;
    let k = key("deleted-later");
    let t = token(claim(a, &k, 1).await);
    a.complete(&k, t, &response("old"), RETENTION)
        .await
        .unwrap();
    assert_eq!(front_has(a, &k, 1).await, Claim::Replay(response("old")));

    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (_, dir): (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("dir")
        .query_async(&mut conn)
        .await
        .unwrap();
    let aof = std::path::Path::new(&dir).join("appendonlydir");
    let snapshot = tempfile::tempdir().unwrap();
    copy_dir(&aof, snapshot.path());

    assert!(a.delete(&k, false).await.unwrap());
    eventually(Duration::from_secs(5), || async {
        (outbox_rows(&db.url).await == 0).then_some(())
    })
    .await
    .expect("the delete reached the front");

    redis.kill();
    std::fs::remove_dir_all(&aof).unwrap();
    copy_dir(snapshot.path(), &aof);
    redis.restart();
    // Nothing used the front meanwhile: the first use finds the new server.
    assert!(
        matches!(claim(a, &k, 1).await, Claim::Claimed { .. }),
        "a deleted record came back with an old snapshot of the front"
    );
    eventually(Duration::from_secs(10), || async {
        (stats(a).up && stats(a).outages >= 1).then_some(())
    })
    .await
    .expect("the front comes back");
    let again = key("deleted-later-2");
    let t = token(claim(a, &again, 1).await);
    a.complete(&again, t, &response("new"), RETENTION)
        .await
        .unwrap();
    assert_eq!(
        front_has(a, &again, 1).await,
        Claim::Replay(response("new"))
    );
    assert!(
        matches!(claim(a, &k, 1).await, Claim::InFlight { .. }),
        "the key claimed after the delete is in flight, not the old record"
    );
}
