//! The Redis store's index of records by scope (crates/store/src/redis/
//! erase.rs), which `keys erase` reads instead of scanning: a scoped
//! record is in its route's and scope's set from its claim, scored by when
//! it expires, and the set lives at least as long as the record even when
//! a later write lengthens the record's life (a completion with a longer
//! retention); an unscoped record is in no set. Erasure walks a set in
//! runs of bounded length.

use std::time::Duration;

use deadpool_redis::redis;
use idemgate::config::StoreConfig;
use idemgate::store::{
    Backend, Cas, Claim, ClaimRequest, EraseStep, Erased, HeldReason, RecordKey, Token,
    UnknownOutcome,
};

use crate::stores::conformance::{fp, response};
use crate::stores::redis_late_claims::scripts_run;
use crate::support::servers::PrivateRedis;
use crate::support::store::{redis_cluster_urls, redis_url};
use crate::support::{Backend as TestBackend, TestStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_set_outlives_its_records() {
    let storage = TestStore::new(TestBackend::Redis).await;
    let store = storage.open().await;
    let prefix = storage.prefix().to_string();
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let set = format!("{prefix}scope:1:r:{}", "05".repeat(32));
    let record = format!("{prefix}rec:1:r:{}:k", "05".repeat(32));
    let pttl = |conn: &mut redis::aio::MultiplexedConnection, name: &str| {
        let name = name.to_string();
        let mut conn = conn.clone();
        async move {
            let ms: i64 = redis::cmd("PTTL")
                .arg(name)
                .query_async(&mut conn)
                .await
                .unwrap();
            ms
        }
    };

    let (scoped, token) = claim_live(store.as_ref(), &[5; 32], "k").await;
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(&set)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(members, std::slice::from_ref(&record));
    assert!(pttl(&mut conn, &set).await >= pttl(&mut conn, &record).await);
    // Completed with a retention ten times the claim's: the set follows.
    store
        .complete(&scoped, token, &response("x"), Duration::from_secs(6000))
        .await
        .unwrap();
    let (set_ttl, record_ttl) = (pttl(&mut conn, &set).await, pttl(&mut conn, &record).await);
    assert!(record_ttl > 5_000_000, "{record_ttl}");
    assert!(
        set_ttl >= record_ttl,
        "the set ({set_ttl} ms) dies before its record ({record_ttl} ms)"
    );
    let score: f64 = redis::cmd("ZSCORE")
        .arg(&set)
        .arg(&record)
        .query_async(&mut conn)
        .await
        .unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64;
    assert!(
        score >= now_ms + record_ttl as f64 - 1000.0,
        "a score short of the record's life"
    );

    // An unscoped record is in no set.
    claim_live(store.as_ref(), &[], "k").await;
    let sets: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}scope:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(sets, [set]);
}

/// Claim `k` in `scope` on route "r": an attempt's live lease.
async fn claim_live(store: &dyn Backend, scope: &[u8], k: &str) -> (RecordKey, Token) {
    let key = RecordKey {
        route: "r".into(),
        scope: scope.to_vec(),
        key: k.into(),
    };
    let claim = store
        .claim(&ClaimRequest {
            key: &key,
            fingerprint: &fp(1),
            attempt: 7,
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(600),
            on_unknown_outcome: UnknownOutcome::Hold,
            inquire_after: Duration::ZERO,
        })
        .await
        .unwrap();
    match claim {
        Claim::Claimed { token, .. } => (key, token),
        other => panic!("{other:?}"),
    }
}

/// Erase steps of `limit` until one says it is the last; every key
/// removed, and that last step.
async fn erase_all(store: &dyn Backend, scope: &[u8], limit: usize) -> (Vec<String>, Erased) {
    let mut removed = Vec::new();
    loop {
        let step = EraseStep {
            route: "r",
            scope,
            force: false,
            limit,
            after: None,
        };
        let erased = tokio::time::timeout(Duration::from_secs(20), store.erase(&step))
            .await
            .expect("an erasure step ends")
            .unwrap();
        assert!(erased.keys.len() <= limit, "{erased:?}");
        removed.extend(erased.keys.iter().cloned());
        if !erased.more(limit) {
            removed.sort();
            return (removed, erased);
        }
    }
}

/// One run of the erasure script visits a bounded number of members: a
/// set whose first members are records it keeps (live leases) is walked
/// in runs, each resumed after the last member kept, so a step neither
/// holds the server for the whole set nor walks the same kept members
/// forever; the records after them all go, and the last step counts the
/// kept ones as left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_run_visits_a_bounded_number_of_members() {
    let redis = PrivateRedis::start();
    let shared = TestStore::new(TestBackend::Redis).await;
    let store = idemgate::store::open(&StoreConfig {
        url: redis.url(),
        ..shared.store_config()
    })
    .await
    .unwrap();
    let store = store.as_ref();
    let scope = [7; 32];
    // Forty live leases first (the earliest to expire, so ranked first),
    // then three completed records.
    for i in 0..40 {
        claim_live(store, &scope, &format!("live-{i:02}")).await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    for k in ["done-1", "done-2", "done-3"] {
        let (key, token) = claim_live(store, &scope, k).await;
        store
            .complete(&key, token, &response("x"), Duration::from_secs(600))
            .await
            .unwrap();
    }
    // The script loaded (by an erasure of another scope) before counting.
    erase_all(store, &[8; 32], 2).await;
    let before = scripts_run(&redis);

    let (removed, last) = erase_all(store, &scope, 2).await;
    assert_eq!(removed, ["done-1", "done-2", "done-3"]);
    assert_eq!(last.left, 40, "the live leases are left, and counted");
    // With 4 visits per record a step may delete (8 for a limit of 2),
    // each step walks the forty kept members in at least five runs.
    let runs = scripts_run(&redis) - before;
    assert!(runs >= 10, "{runs} runs: one run walked the kept members");
}

/// A record that leaves by `keys delete`, `keys release` or its attempt's
/// abandon leaves its scope set too: erasure never walks a member whose
/// record is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_record_leaves_its_scope_set() {
    let storage = TestStore::new(TestBackend::Redis).await;
    let store = storage.open().await;
    let store = store.as_ref();
    let scope = [6; 32];
    let set = format!("{}scope:1:r:{}", storage.prefix(), "06".repeat(32));
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut members = async || -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg(&set)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap()
    };

    let (done, token) = claim_live(store, &scope, "deleted").await;
    store
        .complete(&done, token, &response("x"), Duration::from_secs(600))
        .await
        .unwrap();
    let (held, token) = claim_live(store, &scope, "released").await;
    store
        .hold(
            &held,
            token,
            HeldReason::UpstreamTimeout,
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    let (abandoned, _) = claim_live(store, &scope, "abandoned").await;
    let (kept, _) = claim_live(store, &scope, "kept").await;
    assert_eq!(members().await.len(), 4);

    assert!(store.delete(&done, false).await.unwrap());
    assert!(store.clear(&held, false).await.unwrap());
    assert_eq!(store.abandon(&abandoned, 7).await.unwrap(), Cas::Applied);
    let name = |k: &RecordKey| format!("{}rec:1:r:{}:{}", storage.prefix(), "06".repeat(32), k.key);
    assert_eq!(members().await, [name(&kept)]);
}

/// On a Redis Cluster a scope's records are spread over the buckets, and
/// one step still removes at most its limit in all: steps of five remove
/// forty records, each full until the last, which counts the live lease
/// it leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_step_removes_at_most_its_limit() {
    let storage = TestStore::new(TestBackend::RedisCluster).await;
    let store = storage.open().await;
    let store = store.as_ref();
    let scope = [9; 32];
    for i in 0..40 {
        let (key, token) = claim_live(store, &scope, &format!("k{i:02}")).await;
        store
            .complete(&key, token, &response("x"), Duration::from_secs(600))
            .await
            .unwrap();
    }
    claim_live(store, &scope, "live").await;
    let (removed, last) = erase_all(store, &scope, 5).await;
    assert_eq!(removed.len(), 40);
    assert_eq!(last.left, 1, "the live lease is left, and counted");
}

/// Delete every key of `prefix` that matches `pattern` after it, on each
/// of `nodes` (a cluster's keys one by one, on the node that holds them).
async fn drop_keys(nodes: &[String], prefix: &str, pattern: &str) {
    for node in nodes {
        let client = redis::Client::open(node.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}{pattern}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        for key in keys {
            let _: i64 = redis::cmd("DEL")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
}

/// Records in no scope set (written before the sets existed, or by an
/// instance of an earlier version) are found: the first erasure on a
/// route enters the route's scoped records in their sets, once, and marks
/// the route; a record left out after that is found again only once the
/// marker is deleted (the control: the index is built once, not a scan
/// per erasure).
async fn records_older_than_the_index_are_erased(backend: TestBackend) {
    let storage = TestStore::new(backend).await;
    let store = storage.open().await;
    let store = store.as_ref();
    let nodes = match backend {
        TestBackend::RedisCluster => redis_cluster_urls(),
        _ => vec![redis_url()],
    };
    let prefix = storage.prefix();
    let scope = [4; 32];
    let completed = async |scope: &[u8], k: &str| {
        let (key, token) = claim_live(store, scope, k).await;
        store
            .complete(&key, token, &response("x"), Duration::from_secs(600))
            .await
            .unwrap();
    };
    for k in ["old-1", "old-2", "old-3"] {
        completed(&scope, k).await;
    }
    completed(&[], "unscoped").await;
    // As an earlier version wrote them: in no set, and no marker.
    drop_keys(&nodes, prefix, "*scope:*").await;

    let (removed, last) = erase_all(store, &scope, 2).await;
    assert_eq!(removed, ["old-1", "old-2", "old-3"]);
    assert_eq!(last.left, 0);

    completed(&scope, "later").await;
    drop_keys(&nodes, prefix, "*scope:*").await;
    let (removed, _) = erase_all(store, &scope, 2).await;
    assert!(removed.is_empty(), "built once: {removed:?}");
    drop_keys(&nodes, prefix, "scope-index:*").await;
    let (removed, _) = erase_all(store, &scope, 2).await;
    assert_eq!(removed, ["later"]);
    assert!(
        store
            .inspect(&RecordKey {
                route: "r".into(),
                scope: Vec::new(),
                key: "unscoped".into(),
            })
            .await
            .unwrap()
            .is_some()
    );
}

mod older {
    use super::records_older_than_the_index_are_erased;
    crate::support::per_backend!(
        only [redis, redis_cluster]: records_older_than_the_index_are_erased
    );
}
