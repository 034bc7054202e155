//! Process faults (G5, G7, G1 across instances, graceful shutdown): the real
//! `idemgate` binary as child processes on one fresh PostgreSQL database,
//! killed with SIGKILL or stopped with SIGTERM mid-forward, in front of a
//! real upstream that counts what it receives.

use std::time::Duration;

use http::StatusCode;

use crate::support::http::try_post;
use crate::support::process::{GatewayProcess, READY_LIMIT};
use crate::support::{
    HttpClient, Reply, Set, TestConfig, TestDb, Upstream, client, eventually, post, record_state,
};

/// Config for gateway processes on `db`, with these `lease` and
/// `upstream_timeout` on the route. The store timeout is raised from the
/// harness's 1 s: the machine is small and shared, and a slow store answer
/// is not what these tests are about.
fn process_config(db: &TestDb, upstream: &Upstream, lease: &str, timeout: &str) -> TestConfig {
    TestConfig::new(&db.url, &upstream.url())
        .store(|s| {
            s.set("timeout", "5s");
        })
        .route(|r| {
            r.set("lease", lease).set("upstream_timeout", timeout);
        })
}

/// Wait until the upstream has received `n` requests carrying `key`.
async fn upstream_saw(upstream: &Upstream, key: &str, n: u64) {
    let seen = eventually(READY_LIMIT, || async move {
        (upstream.count(key) >= n).then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "the upstream never received request #{n} with key {key} (count {})",
        upstream.count(key)
    );
}

/// The Retry-After of a reply, in seconds (it must be present and numeric).
fn retry_after(reply: &Reply) -> u64 {
    reply
        .header("retry-after")
        .unwrap_or_else(|| panic!("no Retry-After: {reply:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After is not delay-seconds: {reply:?}"))
}

/// POST until the answer is not a 409 (every answer before must be a proper
/// in-flight 409), for at most `limit`; returns the first other answer.
async fn post_until_not_409(
    http: &HttpClient,
    url: &str,
    key: &str,
    body: &str,
    limit: Duration,
) -> Reply {
    let reply = eventually(limit, || async move {
        let reply = post(http, url, key, body).await;
        if reply.status == StatusCode::CONFLICT {
            assert_eq!(reply.problem_type(), "urn:idemgate:problem:in-flight");
            retry_after(&reply);
            None
        } else {
            Some(reply)
        }
    })
    .await;
    reply.unwrap_or_else(|| panic!("key {key} was still in flight after {limit:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_gateway_leaves_key_in_flight_then_held() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    // The lease is 3 s (renewed every second): the 409 below must come from
    // B while A's last lease still runs, i.e. within 2 s of the kill even
    // on a loaded machine. upstream_timeout is long: A never settles by itself.
    let config = process_config(&db, &upstream, "3s", "60s");
    // B runs before the kill, so that "within the lease" does not depend
    // on how fast a process starts.
    let (mut a, b) = tokio::join!(
        GatewayProcess::start("a", &config),
        GatewayProcess::start("b", &config)
    );
    let http = client();
    let (key, body) = ("crash-held", r#"{"amount":100}"#);

    let pending = tokio::spawn({
        let (http, url) = (http.clone(), a.url("/v1/slow/30000"));
        async move { try_post(&http, &url, key, body).await }
    });
    upstream_saw(&upstream, key, 1).await;
    a.kill9();

    // Within the lease: in flight elsewhere.
    let url_b = b.url("/v1/slow/30000");
    let early = post(&http, &url_b, key, body).await;
    assert_eq!(early.status, StatusCode::CONFLICT, "{early:?}");
    assert_eq!(early.problem_type(), "urn:idemgate:problem:in-flight");
    let after = retry_after(&early);
    assert!(
        (1..=3).contains(&after),
        "Retry-After {after} outside the lease"
    );
    assert_eq!(db_state(&db, key).await.as_deref(), Some("in_flight"));

    // Once the lease has lapsed: held, never forwarded again.
    let lapsed = post_until_not_409(&http, &url_b, key, body, Duration::from_secs(30)).await;
    assert_eq!(lapsed.status, StatusCode::BAD_GATEWAY, "{lapsed:?}");
    assert_eq!(
        lapsed.problem_type(),
        "urn:idemgate:problem:outcome-unknown"
    );
    assert_eq!(db_state(&db, key).await.as_deref(), Some("held"));
    let again = post(&http, &url_b, key, body).await;
    assert_eq!(again.status, StatusCode::BAD_GATEWAY, "{again:?}");
    assert_eq!(again.problem_type(), "urn:idemgate:problem:outcome-unknown");
    assert_eq!(upstream.count(key), 1, "a held key was forwarded again");
    assert_eq!(db_state(&db, key).await.as_deref(), Some("held"));

    // The client of the killed gateway got no answer at all.
    let orphan = pending.await.unwrap();
    assert!(orphan.is_err(), "the killed gateway answered: {orphan:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_gateway_key_is_taken_over_under_release() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    // The same request must hang on the first attempt (A is killed while
    // the upstream works for 4 s) and complete on the retry (B waits the 4 s
    // out, renewing its own lease), hence one slow path for both.
    let config = process_config(&db, &upstream, "3s", "10s").route(|r| {
        r.set("on_unknown_outcome", "release");
    });
    let (mut a, b) = tokio::join!(
        GatewayProcess::start("a", &config),
        GatewayProcess::start("b", &config)
    );
    let http = client();
    let (key, body) = ("crash-release", r#"{"amount":200}"#);
    let path = "/v1/slow/4000";

    let pending = tokio::spawn({
        let (http, url) = (http.clone(), a.url(path));
        async move { try_post(&http, &url, key, body).await }
    });
    upstream_saw(&upstream, key, 1).await;
    a.kill9();

    // Before the lease lapses nobody may take the key over, `release` or
    // not: A might still be alive and about to record its answer.
    let url_b = b.url(path);
    let early = post(&http, &url_b, key, body).await;
    assert_eq!(early.status, StatusCode::CONFLICT, "{early:?}");
    assert_eq!(early.problem_type(), "urn:idemgate:problem:in-flight");
    retry_after(&early);
    assert_eq!(upstream.count(key), 1);

    // After the lapse the retry takes the key over and reaches the upstream.
    let retry = post_until_not_409(&http, &url_b, key, body, Duration::from_secs(30)).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.is_replay(), "a takeover is a forward: {retry:?}");
    assert_eq!(retry.json()["n"], 2, "{retry:?}");
    assert_eq!(upstream.count(key), 2);
    assert_eq!(db_state(&db, key).await.as_deref(), Some("completed"));

    // And its answer is what every later retry gets.
    let third = post(&http, &url_b, key, body).await;
    assert_eq!(third.status, StatusCode::CREATED, "{third:?}");
    assert!(third.is_replay(), "{third:?}");
    assert_eq!(third.body, retry.body);
    assert_eq!(upstream.count(key), 2);

    let orphan = pending.await.unwrap();
    assert!(orphan.is_err(), "the killed gateway answered: {orphan:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_processes_never_forward_one_key_twice() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    let config = process_config(&db, &upstream, "10s", "20s");
    let (a, b) = tokio::join!(
        GatewayProcess::start("a", &config),
        GatewayProcess::start("b", &config)
    );
    let http = client();
    let (key, body) = ("storm", r#"{"amount":300}"#);
    let urls = [a.url("/v1/slow/500"), b.url("/v1/slow/500")];

    let storm = futures_util::future::join_all((0..40).map(|i| {
        let (http, url) = (http.clone(), urls[i % 2].clone());
        async move { post(&http, &url, key, body).await }
    }))
    .await;

    assert_eq!(upstream.count(key), 1, "one key forwarded more than once");
    let mut originals = Vec::new();
    for reply in &storm {
        match reply.status {
            StatusCode::CREATED if reply.is_replay() => {}
            StatusCode::CREATED => originals.push(reply.clone()),
            StatusCode::CONFLICT => {
                assert_eq!(reply.problem_type(), "urn:idemgate:problem:in-flight");
                retry_after(reply);
            }
            _ => panic!("unexpected answer in the storm: {reply:?}"),
        }
    }
    assert_eq!(originals.len(), 1, "exactly one client got the forward");
    let original = &originals[0];
    for reply in storm.iter().filter(|r| r.status == StatusCode::CREATED) {
        assert_eq!(reply.body, original.body, "a replay differs: {reply:?}");
    }

    // Settled: from either process, every retry is the byte-identical replay.
    for i in 0..10 {
        let reply = post(&http, &urls[i % 2], key, body).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        assert!(reply.is_replay(), "{reply:?}");
        assert_eq!(reply.body, original.body);
        assert_eq!(reply.header("location"), original.header("location"));
    }
    assert_eq!(upstream.count(key), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_forward_and_its_record() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    let config = process_config(&db, &upstream, "10s", "20s");
    let mut gateway = GatewayProcess::start("p", &config).await;
    let http = client();
    let (key, body) = ("sigterm", r#"{"amount":400}"#);
    let path = "/v1/slow/2000";

    let pending = tokio::spawn({
        let (http, url) = (http.clone(), gateway.url(path));
        async move { try_post(&http, &url, key, body).await }
    });
    upstream_saw(&upstream, key, 1).await;
    gateway.terminate();

    let reply = pending
        .await
        .unwrap()
        .expect("the in-flight client is answered");
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    assert!(!reply.is_replay());
    let status = gateway
        .wait(Duration::from_secs(30))
        .await
        .expect("the gateway exits after SIGTERM");
    assert!(
        status.success(),
        "exit status {status}: {}",
        gateway.stderr()
    );
    assert_eq!(db_state(&db, key).await.as_deref(), Some("completed"));

    let next = GatewayProcess::start("q", &config).await;
    let replay = post(&http, &next.url(path), key, body).await;
    assert_eq!(replay.status, StatusCode::CREATED, "{replay:?}");
    assert!(replay.is_replay(), "{replay:?}");
    assert_eq!(replay.body, reply.body);
    assert_eq!(upstream.count(key), 1);
}

async fn db_state(db: &TestDb, key: &str) -> Option<String> {
    record_state(&db.url, key).await
}

/// `shutdown_timeout` is the longest a graceful shutdown waits in all: a
/// forward that never ends holds both its connection and its forward task,
/// and the two waits share one deadline (they used to take it twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_at_most_shutdown_timeout_in_all() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    let config = process_config(&db, &upstream, "60s", "60s").top(|t| {
        t.set("shutdown_timeout", "4s");
    });
    let mut gateway = GatewayProcess::start("s", &config).await;
    let http = client();
    let pending = tokio::spawn({
        let (http, url) = (http.clone(), gateway.url("/v1/hang"));
        async move { try_post(&http, &url, "never-ends", "{}").await }
    });
    upstream_saw(&upstream, "never-ends", 1).await;
    let stopping = tokio::time::Instant::now();
    gateway.terminate();
    let status = gateway
        .wait(Duration::from_secs(60))
        .await
        .expect("the gateway exits after SIGTERM");
    let took = stopping.elapsed();
    // 4 s once; twice would be 8 s.
    assert!(
        took < Duration::from_millis(7_000),
        "shutdown took {took:?} with shutdown_timeout = 4s: {}",
        gateway.stderr()
    );
    assert!(
        took >= Duration::from_secs(3),
        "it did wait for the forward: {took:?}"
    );
    assert!(status.success() || status.code().is_some());
    pending.abort();
}
