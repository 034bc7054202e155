//! The replay cache (`[store] replay_cache_ttl`, docs/src/design/stores.md),
//! on PostgreSQL and Redis: once an instance has replayed a completed record
//! it answers that key from memory, for at most the TTL and never past the
//! record's retention. To tell a cached answer from a store answer, the tests
//! delete the record behind the gateway's back, straight in the store.

use std::time::Duration;

use http::StatusCode;
use toml::Table;

use crate::support::{Backend, Gateway, Set, Setup, TestStore, per_backend, post, sample};

/// A gateway with `replay_cache_ttl = ttl`, its route edited by `route`.
async fn setup(backend: Backend, ttl: &str, route: impl FnOnce(&mut Table)) -> Setup {
    Setup::with(backend, |config| {
        config
            .store(|s| {
                s.set("replay_cache_ttl", ttl);
            })
            .route(route)
    })
    .await
}

/// Remove every record of this test from the store itself.
async fn wipe_records(store: &TestStore) {
    match store.backend {
        Backend::Postgres => {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&store.url).await.unwrap();
            sqlx::query("DELETE FROM idemgate_records")
                .execute(&mut conn)
                .await
                .unwrap();
        }
        Backend::Redis => {
            let client = deadpool_redis::redis::Client::open(store.url.as_str()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let pattern = format!("{}rec:*", store.prefix());
            let keys: Vec<Vec<u8>> = deadpool_redis::redis::cmd("KEYS")
                .arg(&pattern)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(!keys.is_empty(), "no records under {pattern}");
            let _: i64 = deadpool_redis::redis::cmd("DEL")
                .arg(keys)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        Backend::Sqlite => {
            use sqlx::Connection;
            let mut conn = sqlx::SqliteConnection::connect(&store.url).await.unwrap();
            sqlx::query("DELETE FROM idemgate_records")
                .execute(&mut conn)
                .await
                .unwrap();
        }
        Backend::Memory => unreachable!("the memory store has no replay cache"),
        Backend::RedisCluster => unreachable!("the replay cache is not run on the cluster"),
        Backend::Front => {
            unreachable!("wiping PostgreSQL behind its front is not a replay-cache test")
        }
    }
}

async fn hits(gateway: &Gateway) -> f64 {
    sample(&gateway.metrics().await, "idemgate_replay_cache_hits_total")
}

async fn a_replayed_record_is_answered_from_memory_until_the_ttl(b: Backend) {
    let s = setup(b, "1500ms", |_| {}).await;
    let url = s.gateway.url("/v1/payments");
    let first = post(&s.client, &url, "c1", r#"{"amount":10}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    // The first replay comes from the store and fills the cache.
    let replay = post(&s.client, &url, "c1", r#"{"amount":10}"#).await;
    assert!(replay.is_replay());
    assert_eq!(hits(&s.gateway).await, 0.0);
    // Another body's 422 comes from the store, which says when the record
    // expires (the cache does not know): no hit.
    let other = post(&s.client, &url, "c1", r#"{"amount":99}"#).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.problem_type(), "urn:idemgate:problem:key-reused");
    assert!(other.json()["expires"].is_string(), "{other:?}");
    assert_eq!(hits(&s.gateway).await, 0.0);

    wipe_records(&s.store).await;
    let cached = post(&s.client, &url, "c1", r#"{"amount":10}"#).await;
    assert_eq!(cached.status, StatusCode::CREATED);
    assert!(cached.is_replay());
    assert_eq!(cached.body, first.body);
    assert_eq!(hits(&s.gateway).await, 1.0);
    assert_eq!(s.upstream.count("c1"), 1);

    // Past the TTL the store decides again: the record is gone, so the key
    // is new.
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let again = post(&s.client, &url, "c1", r#"{"amount":10}"#).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(!again.is_replay());
    assert_eq!(s.upstream.count("c1"), 2);
}

/// A replay the cache holds needs no forward slot: with the only one
/// taken by a slow forward, it is still answered, while one the store
/// must answer gets `503 overloaded` (the control: the slot is taken).
async fn a_cached_replay_needs_no_forward_slot(b: Backend) {
    let s = Setup::with(b, |config| {
        config
            .top(|t| {
                t.set("max_forwards_in_flight", 1);
            })
            .store(|s| {
                s.set("replay_cache_ttl", "1h");
            })
    })
    .await;
    let url = s.gateway.url("/v1/payments");
    for key in ["c5", "c6"] {
        let first = post(&s.client, &url, key, "{}").await;
        assert_eq!(first.status, StatusCode::CREATED);
    }
    // c5's replay from the store fills the cache; c6 is never replayed.
    assert!(post(&s.client, &url, "c5", "{}").await.is_replay());
    let slow = tokio::spawn({
        let (c, url) = (s.client.clone(), s.gateway.url("/v1/slow/1500"));
        async move { post(&c, &url, "c5-slow", "{}").await }
    });
    crate::support::eventually(Duration::from_secs(10), || async {
        (s.upstream.count("c5-slow") == 1).then_some(())
    })
    .await
    .expect("the slow forward reached the upstream");
    let cached = post(&s.client, &url, "c5", "{}").await;
    assert_eq!(cached.status, StatusCode::CREATED, "{cached:?}");
    assert!(cached.is_replay());
    assert_eq!(hits(&s.gateway).await, 1.0);
    let uncached = post(&s.client, &url, "c6", "{}").await;
    assert_eq!(uncached.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(uncached.problem_type(), "urn:idemgate:problem:overloaded");
    assert_eq!(slow.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(s.upstream.count("c5"), 1);
}

async fn a_cached_record_never_outlives_its_retention(b: Backend) {
    let s = setup(b, "1h", |r| {
        r.set("lease", "1s").set("retention", "2s");
    })
    .await;
    let url = s.gateway.url("/v1/payments");
    assert_eq!(
        post(&s.client, &url, "c2", "{}").await.status,
        StatusCode::CREATED
    );
    assert!(post(&s.client, &url, "c2", "{}").await.is_replay());
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    let after = post(&s.client, &url, "c2", "{}").await;
    assert_eq!(after.status, StatusCode::CREATED);
    assert!(!after.is_replay(), "replayed past the record's retention");
    assert_eq!(s.upstream.count("c2"), 2);
}

async fn a_zero_ttl_turns_the_cache_off(b: Backend) {
    let s = setup(b, "0s", |_| {}).await;
    let url = s.gateway.url("/v1/payments");
    assert_eq!(
        post(&s.client, &url, "c3", "{}").await.status,
        StatusCode::CREATED
    );
    assert!(post(&s.client, &url, "c3", "{}").await.is_replay());
    wipe_records(&s.store).await;
    let after = post(&s.client, &url, "c3", "{}").await;
    assert!(!after.is_replay());
    assert_eq!(s.upstream.count("c3"), 2);
    assert_eq!(hits(&s.gateway).await, 0.0);
}

/// A record deleted elsewhere and its key claimed anew by another body:
/// the claim drops the cached record, so the first body gets the new
/// record's `422`, never the old replay.
async fn a_key_claimed_anew_drops_its_cached_record(b: Backend) {
    let s = setup(b, "1h", |_| {}).await;
    let url = s.gateway.url("/v1/payments");
    post(&s.client, &url, "c4", r#"{"amount":1}"#).await;
    assert!(
        post(&s.client, &url, "c4", r#"{"amount":1}"#)
            .await
            .is_replay()
    );
    wipe_records(&s.store).await;
    let other = post(&s.client, &url, "c4", r#"{"amount":2}"#).await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert!(!other.is_replay());
    let first = post(&s.client, &url, "c4", r#"{"amount":1}"#).await;
    assert_eq!(first.status, StatusCode::UNPROCESSABLE_ENTITY, "{first:?}");
    assert_eq!(hits(&s.gateway).await, 0.0);
}

// The memory store has no replay cache.
per_backend!(only [postgres, redis, sqlite]:
    a_key_claimed_anew_drops_its_cached_record,
    a_replayed_record_is_answered_from_memory_until_the_ttl,
    a_cached_replay_needs_no_forward_slot,
    a_cached_record_never_outlives_its_retention,
    a_zero_ttl_turns_the_cache_off,
);
