//! A `keys erase` the store fails in the middle of counts what it had
//! removed by then, on every path a failure can take: a later route's
//! step (Redis), a step that fails after its records went (PostgreSQL's
//! count after its delete, and through a Redis front), and a step whose
//! scripts succeed on some of a Redis Cluster's buckets and fail on
//! another. The answer (the admin API's `503` problem) names the route it
//! stopped on and the count, which matches the records actually gone.
//! (A SQLite step that fails is rolled back with its savepoint: it
//! removes nothing; the memory store does not fail.)

use deadpool_redis::redis;
use http::StatusCode;

use super::keys::{Cli, admin_keys, scoped_by_authorization, stdout, two_scoped_routes};
use crate::support::store::{redis_cluster_urls, redis_url};
use crate::support::{Backend, Setup, send};

/// The problem detail of a failed erasure of `scope`, through `s`'s
/// admin API.
async fn failed_erasure(s: &Setup, scope: &str) -> String {
    let body = serde_json::json!({"erase": {"scope": scope}}).to_string();
    let erase = admin_keys(s, body).await;
    assert_eq!(
        erase.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        erase.text()
    );
    let problem: serde_json::Value = serde_json::from_slice(&erase.body).unwrap();
    problem["detail"].as_str().unwrap_or_default().to_string()
}

/// Record `keys` for `who` on `path` through `s`'s gateway.
async fn record(s: &Setup, who: &str, path: &str, keys: &[String]) {
    for key in keys {
        let headers = [("authorization", who), ("idempotency-key", key.as_str())];
        let sent = send(&s.client, "POST", &s.gateway.url(path), &headers, "{}").await;
        assert_eq!(sent.status, StatusCode::CREATED, "{key}");
    }
}

/// How many of `keys` (on route `api`, scope `who`) still have a record.
async fn still_there(s: &Setup, who: &str, keys: &[String]) -> usize {
    let mut there = 0;
    for key in keys {
        let body = serde_json::json!({"show": {"route": "api", "scope": who, "key": key}});
        let shown = admin_keys(s, body.to_string()).await;
        match shown.status {
            StatusCode::OK => there += 1,
            StatusCode::NOT_FOUND => {}
            other => panic!("show {key}: {other} {}", shown.text()),
        }
    }
    there
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// An erasure the store fails in the middle of (here on its second
/// route, whose scope set is not a set) says how many records it had
/// removed by then, and which route it stopped on.
#[tokio::test]
async fn a_failed_erasure_counts_what_it_removed() {
    let s = Setup::with(Backend::Redis, two_scoped_routes).await;
    record(&s, "Bearer alice", "/v1/payments", &["a-pay".into()]).await;
    record(&s, "Bearer alice", "/v2/orders", &["a-order".into()]).await;
    let show = Cli::of(&s)
        .run(&[
            "show",
            "--route",
            "orders",
            "--scope",
            "Bearer alice",
            "a-order",
        ])
        .await;
    let shown = stdout(&show);
    let digest = shown
        .lines()
        .find_map(|l| l.strip_prefix("scope    sha256:"))
        .unwrap_or_else(|| panic!("no scope line: {shown}"));
    let set = format!("{}scope:6:orders:{digest}", s.store.prefix());
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SET")
        .arg(&set)
        .arg("not a set")
        .query_async(&mut conn)
        .await
        .unwrap();

    let detail = failed_erasure(&s, "Bearer alice").await;
    assert!(
        detail.contains("stopped on route \"orders\" after removing 1 record(s)"),
        "{detail}"
    );
}

/// A PostgreSQL step that fails after its delete committed (the
/// `pg-erase-after-delete` failpoint, armed for this test's scope only)
/// counts the records that delete removed, which are gone, and the
/// replay cache forgets them; so does the front store's erasure, which
/// passes PostgreSQL's failure on with its keys. (That the front fences
/// them too is not seen here: its relay invalidates them soon after
/// anyway.)
async fn a_step_failing_after_its_delete_counts_its_records(b: Backend) {
    let s = Setup::with(b, scoped_by_authorization).await;
    let who = format!("Bearer failpoint-{}", b.name());
    let mine = keys("gone", 3);
    record(&s, &who, "/v1/payments", &mine).await;
    // Replayed once: the gateway's replay cache (and the front) hold it.
    let headers = [
        ("authorization", who.as_str()),
        ("idempotency-key", "gone-0"),
    ];
    let url = s.gateway.url("/v1/payments");
    assert!(
        send(&s.client, "POST", &url, &headers, "{}")
            .await
            .is_replay()
    );
    let body =
        serde_json::json!({"show": {"route": "api", "scope": who, "key": mine[0], "json": true}});
    let shown = admin_keys(&s, body.to_string()).await.json();
    let digest = shown["scope"]
        .as_str()
        .expect("a scoped record")
        .to_string();

    fail::cfg("pg-erase-after-delete", &format!("return({digest})")).unwrap();
    let detail = failed_erasure(&s, &who).await;
    fail::remove("pg-erase-after-delete");
    assert!(
        detail.contains("stopped on route \"api\" after removing 3 record(s)"),
        "{detail}"
    );
    assert!(detail.contains("failpoint"), "{detail}");
    assert_eq!(still_there(&s, &who, &mine).await, 0);
    // Forgotten by the replay cache and the front: forwarded again.
    let retry = send(&s.client, "POST", &url, &headers, "{}").await;
    assert!(!retry.is_replay(), "an erased record replays");
}

mod after_the_delete {
    use super::a_step_failing_after_its_delete_counts_its_records;
    crate::support::per_backend!(
        only [postgres, front]:
        a_step_failing_after_its_delete_counts_its_records,
    );
}

/// On a Redis Cluster a step runs a script per bucket: one that fails
/// (the scope's set in the last of its buckets is not a set) ends the
/// step, which counts what the other buckets' scripts removed. The count
/// is the records actually gone, and some are.
#[tokio::test]
async fn a_cluster_step_failing_on_one_bucket_counts_the_others() {
    let s = Setup::with(Backend::RedisCluster, scoped_by_authorization).await;
    let (who, mine) = ("Bearer buckets", keys("spread", 24));
    record(&s, who, "/v1/payments", &mine).await;
    // The route's index is built (a first erasure, of another scope)
    // while every set is one.
    let built = admin_keys(&s, r#"{"erase": {"scope": "Bearer nobody"}}"#).await;
    assert_eq!(built.status, StatusCode::OK, "{}", built.text());

    let body =
        serde_json::json!({"show": {"route": "api", "scope": who, "key": mine[0], "json": true}});
    let digest = admin_keys(&s, body.to_string()).await.json()["scope"]
        .as_str()
        .unwrap()
        .to_string();
    // Every set of the scope, on every node; the last bucket's is broken.
    let suffix = format!("scope:3:api:{digest}");
    let mut sets = Vec::new();
    for node in redis_cluster_urls() {
        let client = redis::Client::open(node.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let found: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*{suffix}", s.store.prefix()))
            .query_async(&mut conn)
            .await
            .unwrap();
        sets.extend(
            found
                .into_iter()
                .map(|set| (bucket(&set), set, node.clone())),
        );
    }
    sets.sort();
    assert!(sets.len() >= 2, "the records share one bucket: {sets:?}");
    let (_, last, node) = sets.last().unwrap();
    let client = redis::Client::open(node.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SET")
        .arg(last)
        .arg("not a set")
        .query_async(&mut conn)
        .await
        .unwrap();

    let detail = failed_erasure(&s, who).await;
    let gone = mine.len() - still_there(&s, who, &mine).await;
    assert!(gone > 0, "no bucket's records went: {detail}");
    assert!(
        detail.contains(&format!(
            "stopped on route \"api\" after removing {gone} record(s)"
        )),
        "{gone} went: {detail}"
    );
}

/// The bucket number of a cluster key `…{bN}…`.
fn bucket(key: &str) -> u64 {
    let tag = key.split("{b").nth(1).and_then(|t| t.split('}').next());
    tag.and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no bucket tag in {key}"))
}
