//! The Redis store's index of records by scope (crates/store/src/redis/
//! erase.rs), which `keys erase` reads instead of scanning: a scoped
//! record is in its route's and scope's set from its claim, scored by when
//! it expires, and the set lives at least as long as the record even when
//! a later write lengthens the record's life (a completion with a longer
//! retention); an unscoped record is in no set.

use std::time::Duration;

use deadpool_redis::redis;
use idemgate::store::{ClaimRequest, RecordKey, UnknownOutcome};

use crate::stores::conformance::{fp, response};
use crate::support::store::redis_url;
use crate::support::{Backend, TestStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_set_outlives_its_records() {
    let storage = TestStore::new(Backend::Redis).await;
    let store = storage.open().await;
    let prefix = storage.prefix().to_string();
    let key = |scope: Vec<u8>| RecordKey {
        route: "r".into(),
        scope,
        key: "k".into(),
    };
    let claim = |k: RecordKey| {
        let store = store.clone();
        async move {
            let request = ClaimRequest {
                key: &k,
                fingerprint: &fp(1),
                attempt: 7,
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(600),
                on_unknown_outcome: UnknownOutcome::Hold,
                inquire_after: Duration::ZERO,
            };
            match store.claim(&request).await.unwrap() {
                idemgate::store::Claim::Claimed { token, .. } => token,
                other => panic!("{other:?}"),
            }
        }
    };
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

    let scoped = key(vec![5; 32]);
    let token = claim(scoped.clone()).await;
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
    claim(key(Vec::new())).await;
    let sets: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}scope:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(sets, [set]);
}
