//! Status inquiry (docs/src/guide/status-inquiry.md): on a route with
//! `on_unknown_outcome = "inquire"`, an attempt whose outcome is unknown is
//! not held for a human: the gateway asks the upstream's lookup and acts on
//! the answer. Against the real gateway and the test upstream, whose
//! `GET /v1/idempotency/{key}` answers from its own ledger.

use std::time::Duration;

use http::StatusCode;

use crate::support::process::GatewayProcess;
use crate::support::upstream::Lookup;
use crate::support::{
    Backend, Gateway, HttpClient, Reply, Set, TestConfig, TestStore, Upstream, client, eventually,
    per_backend, post, sample,
};

/// A route that inquires at `upstream`'s lookup: first after 100 ms, then
/// every second, giving up after `give_up`.
pub(super) fn inquiring(store: &TestStore, upstream: &Upstream, give_up: &str) -> TestConfig {
    let url = format!("{}/v1/idempotency/{{key}}", upstream.url());
    store.config(&upstream.url()).route(|r| {
        let mut inquiry = toml::Table::new();
        inquiry
            .set("url", url)
            .set("after", "100ms")
            .set("every", "1s")
            .set("give_up_after", give_up)
            .set("headers", {
                let mut h = toml::Table::new();
                h.set("x-inquiry-token", "t0ken");
                h
            });
        r.set("on_unknown_outcome", "inquire")
            .set("inquiry", inquiry);
    })
}

/// Retry until the answer is no longer `409 outcome-pending` (at most 20 s).
async fn settled(c: &HttpClient, url: &str, key: &str) -> Reply {
    eventually(Duration::from_secs(20), || async {
        let reply = post(c, url, key, "{}").await;
        (reply.status != StatusCode::CONFLICT).then_some(reply)
    })
    .await
    .expect("the key settles within 20 s")
}

/// `idemgate_inquiries_pending` now.
async fn pending(gateway: &Gateway) -> f64 {
    sample(&gateway.metrics().await, "idemgate_inquiries_pending")
}

async fn inquiries(gateway: &Gateway, result: &str) -> f64 {
    let series = format!("idemgate_inquiries_total{{route=\"api\",result=\"{result}\"}}");
    sample(&gateway.metrics().await, &series)
}

async fn an_upstream_that_acted_then_reset_is_replayed(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&inquiring(&store, &upstream, "20s")).await;
    let (c, url) = (client(), gateway.url("/v1/reset"));
    let broken = post(&c, &url, "acted", "{}").await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY);
    assert!(broken.text().contains("ask it"), "{}", broken.text());
    let pending = post(&c, &url, "acted", "{}").await;
    if pending.status == StatusCode::CONFLICT {
        assert_eq!(
            pending.problem_type(),
            "urn:idemgate:problem:outcome-pending"
        );
        assert!(pending.header("retry-after").is_some());
        assert!(pending.json()["expires"].is_string(), "{}", pending.text());
        assert!(
            pending.text().contains("asking the upstream"),
            "{}",
            pending.text()
        );
    }
    let replay = settled(&c, &url, "acted").await;
    assert_eq!(replay.status, StatusCode::OK, "{}", replay.text());
    assert!(replay.is_replay());
    assert_eq!(replay.json()["execution"], 1);
    let expires = replay.header("idempotency-expires");
    assert!(
        expires.is_some_and(|d| httpdate::parse_http_date(d).is_ok()),
        "the answer an inquiry recorded names its expiry: {expires:?}"
    );
    assert_eq!(upstream.executions_per_key()["acted"].len(), 1);
    assert_eq!(upstream.last_headers()["x-inquiry-token"], "t0ken");
    assert_eq!(upstream.lookups("acted"), 1);
    assert_eq!(inquiries(&gateway, "acted").await, 1.0);
    gateway.shutdown().await;
}

async fn an_upstream_that_never_acted_gets_the_retry(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&inquiring(&store, &upstream, "20s")).await;
    let (c, url) = (client(), gateway.url("/v1/drop-once"));
    assert_eq!(
        post(&c, &url, "dropped", "{}").await.status,
        StatusCode::BAD_GATEWAY
    );
    assert!(!upstream.executions_per_key().contains_key("dropped"));
    let retry = settled(&c, &url, "dropped").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.text());
    assert!(!retry.is_replay());
    assert_eq!(upstream.executions_per_key()["dropped"].len(), 1);
    assert_eq!(inquiries(&gateway, "not_acted").await, 1.0);
    gateway.shutdown().await;
}

async fn a_failing_lookup_is_asked_again_until_it_answers(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    upstream.lookup(Lookup::FailFirst(2));
    let gateway = Gateway::start(&inquiring(&store, &upstream, "20s")).await;
    let (c, url) = (client(), gateway.url("/v1/reset"));
    assert_eq!(
        post(&c, &url, "flaky", "{}").await.status,
        StatusCode::BAD_GATEWAY
    );
    let replay = settled(&c, &url, "flaky").await;
    assert_eq!(replay.status, StatusCode::OK, "{}", replay.text());
    assert!(replay.is_replay());
    assert_eq!(upstream.lookups("flaky"), 3);
    assert_eq!(inquiries(&gateway, "unknown").await, 2.0);
    assert_eq!(inquiries(&gateway, "acted").await, 1.0);
    assert_eq!(upstream.executions_per_key()["flaky"].len(), 1);
    gateway.shutdown().await;
}

async fn an_inquiry_gives_up_and_holds_the_key(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    upstream.lookup(Lookup::Down);
    let gateway = Gateway::start(&inquiring(&store, &upstream, "2s")).await;
    let (c, url) = (client(), gateway.url("/v1/reset"));
    assert_eq!(
        post(&c, &url, "lost", "{}").await.status,
        StatusCode::BAD_GATEWAY
    );
    let held = settled(&c, &url, "lost").await;
    assert_eq!(held.status, StatusCode::BAD_GATEWAY);
    assert_eq!(held.problem_type(), "urn:idemgate:problem:outcome-unknown");
    assert!(held.json()["expires"].is_string(), "{}", held.text());
    assert!(held.text().contains("inquiry_gave_up"), "{}", held.text());
    assert!(upstream.lookups("lost") >= 1);
    assert_eq!(inquiries(&gateway, "gave_up").await, 1.0);
    assert_eq!(upstream.executions_per_key()["lost"].len(), 1);
    gateway.shutdown().await;
}

/// `idemgate --config PATH keys ARGS…` (the real binary), run to its end.
async fn run_keys(path: &std::path::Path, args: &[&str]) -> std::process::Output {
    let path = path.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(crate::support::process::binary())
            .arg("--config")
            .arg(&path)
            .arg("keys")
            .args(&args)
            .output()
            .expect("the binary runs")
    })
    .await
    .unwrap()
}

/// `idemgate --config PATH keys ARGS…`, which succeeds; its stdout.
async fn keys(path: &std::path::Path, args: &[&str]) -> String {
    let out = run_keys(path, args).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `idemgate --config PATH keys ARGS…`, which fails (not with "not
/// found"); its stderr.
async fn keys_refused(path: &std::path::Path, args: &[&str]) -> String {
    let out = run_keys(path, args).await;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success() && out.status.code() != Some(3),
        "{args:?} was not refused ({:?}): {}{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// Inside `after` (no question asked yet, the first not due) the upstream
/// may still be working on the request: `keys release` and `keys delete`
/// refuse the inquiring key without `--force`, as they refuse a live lease
/// (issue 43), and say why; the key stays inquiring. With `--force` it is
/// released and the next request is forwarded. (After the first question a
/// plain release works: [`operators_see_and_release_inquiring_keys`].)
async fn an_inquiring_key_inside_after_is_released_only_with_force(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    upstream.lookup(Lookup::Down);
    let config = inquiring(&store, &upstream, "20s").route(|r| {
        let inquiry = r.get_mut("inquiry").and_then(toml::Value::as_table_mut);
        inquiry.expect("an inquiry").set("after", "10s");
    });
    let gateway = Gateway::start(&config).await;
    let (c, url) = (client(), gateway.url("/v1/drop-once"));
    assert_eq!(
        post(&c, &url, "early", "{}").await.status,
        StatusCode::BAD_GATEWAY
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config.to_string()).unwrap();
    for command in ["release", "delete"] {
        let refused = keys_refused(&path, &[command, "--route", "api", "early"]).await;
        assert!(
            refused.contains("--force") && refused.contains("may still be working"),
            "{command}: {refused}"
        );
    }
    let shown = keys(&path, &["show", "--route", "api", "early"]).await;
    assert!(
        shown.contains("inquiring") && shown.contains("asked    0"),
        "{shown}"
    );
    assert_eq!(
        post(&c, &url, "early", "{}").await.status,
        StatusCode::CONFLICT
    );
    keys(&path, &["release", "--route", "api", "--force", "early"]).await;
    let forwarded = post(&c, &url, "early", "{}").await;
    assert_eq!(
        forwarded.status,
        StatusCode::CREATED,
        "{}",
        forwarded.text()
    );
    assert_eq!(upstream.executions_per_key()["early"].len(), 1);
    assert_eq!(upstream.lookups("early"), 0);
    gateway.shutdown().await;
}

/// What an operator sees of an inquiring key, and that `keys release`
/// still frees it (the real binary, reading the store).
async fn operators_see_and_release_inquiring_keys(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    upstream.lookup(Lookup::Down);
    let config = inquiring(&store, &upstream, "20s");
    let gateway = Gateway::start(&config).await;
    let (c, url) = (client(), gateway.url("/v1/drop-once"));
    assert_eq!(
        post(&c, &url, "stuck", "{}").await.status,
        StatusCode::BAD_GATEWAY
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config.to_string()).unwrap();
    let listed = keys(&path, &["list", "--route", "api", "--state", "inquiring"]).await;
    assert!(listed.contains("stuck"), "{listed}");
    // After the first (failed) question: counted, and the next one shown.
    let shown = eventually(Duration::from_secs(10), || async {
        let shown = keys(&path, &["show", "--route", "api", "stuck"]).await;
        shown.contains("asked    1").then_some(shown)
    })
    .await
    .expect("one question is counted");
    assert!(
        shown.contains("inquiring") && shown.contains("next"),
        "{shown}"
    );
    keys(&path, &["release", "--route", "api", "stuck"]).await;
    let forwarded = post(&c, &url, "stuck", "{}").await;
    assert_eq!(
        forwarded.status,
        StatusCode::CREATED,
        "{}",
        forwarded.text()
    );
    assert_eq!(upstream.executions_per_key()["stuck"].len(), 1);
    gateway.shutdown().await;
}

/// The lookup's contract broken (404 for a key it executed): the key is
/// released and the retry executes a second time. What the harness must
/// catch, and why the contract matters.
async fn a_lookup_that_lies_causes_a_second_execution(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    upstream.lookup(Lookup::Lying);
    let gateway = Gateway::start(&inquiring(&store, &upstream, "20s")).await;
    let (c, url) = (client(), gateway.url("/v1/reset"));
    assert_eq!(
        post(&c, &url, "lied", "{}").await.status,
        StatusCode::BAD_GATEWAY
    );
    // Released, forwarded again: `/reset` acts and resets once more.
    let twice = eventually(Duration::from_secs(20), || async {
        post(&c, &url, "lied", "{}").await;
        (upstream.executions_per_key()["lied"].len() >= 2).then_some(())
    })
    .await;
    assert!(twice.is_some(), "the lie was never acted on");
    assert!(inquiries(&gateway, "not_acted").await >= 1.0);
    gateway.shutdown().await;
}

async fn two_instances_ask_once(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let config = inquiring(&store, &upstream, "20s");
    let (first, second) = (Gateway::start(&config).await, Gateway::start(&config).await);
    let c = client();
    for n in 0..8 {
        let key = format!("raced-{n}");
        let url = first.url("/v1/reset");
        assert_eq!(
            post(&c, &url, &key, "{}").await.status,
            StatusCode::BAD_GATEWAY
        );
    }
    for n in 0..8 {
        let key = format!("raced-{n}");
        let replay = settled(&c, &second.url("/v1/reset"), &key).await;
        assert!(replay.is_replay(), "{key}: {}", replay.text());
        assert_eq!(upstream.lookups(&key), 1, "{key} was asked about twice");
    }
    let asked = inquiries(&first, "acted").await + inquiries(&second, "acted").await;
    assert_eq!(asked, 8.0);
    first.shutdown().await;
    second.shutdown().await;
}

/// A gateway SIGKILLed while its request is at the upstream: its lease
/// lapses, and the other instance, which never saw the key, finds it and
/// asks.
async fn a_killed_gateways_key_is_resolved_by_another(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let config = inquiring(&store, &upstream, "20s").route(|r| {
        r.set("lease", "1s").set("upstream_timeout", "5s");
    });
    let survivor = Gateway::start(&config).await;
    let mut doomed = GatewayProcess::start("inquiry-doomed", &config).await;
    let c = client();
    let url = doomed.url("/v1/slow/3000");
    let sent = tokio::spawn({
        let c = c.clone();
        async move { crate::support::http::try_post(&c, &url, "orphan", "{}").await }
    });
    upstream.arrived("orphan").await;
    doomed.kill9();
    let _ = sent.await;
    let resolved = eventually(Duration::from_secs(20), || async {
        (inquiries(&survivor, "acted").await >= 1.0).then_some(())
    })
    .await;
    assert!(
        resolved.is_some(),
        "the survivor never asked about the orphan"
    );
    let replay = post(&c, &survivor.url("/v1/slow/3000"), "orphan", "{}").await;
    assert_eq!(replay.status, StatusCode::OK, "{}", replay.text());
    assert!(replay.is_replay());
    assert_eq!(upstream.executions_per_key()["orphan"].len(), 1);
    survivor.shutdown().await;
}

/// A gateway that stalls (SIGSTOP) longer than its lease while its request
/// is at the upstream, and resumes inside `after`: its own answer settles
/// the key (issue 43). Meanwhile the other instance answers `409` for the
/// key, with a `Retry-After` until the question, and neither its claim nor
/// its inquirer takes the key from the stalled attempt before `after` has
/// passed since the lapse: its client gets the upstream's `201`, which
/// every retry replays, and the lookup is never asked.
async fn a_stalled_gateways_answer_inside_after_settles_its_key(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let config = inquiring(&store, &upstream, "20s").route(|r| {
        r.set("lease", "1s").set("upstream_timeout", "5s");
        let inquiry = r.get_mut("inquiry").and_then(toml::Value::as_table_mut);
        inquiry.expect("an inquiry").set("after", "3s");
    });
    let survivor = Gateway::start(&config).await;
    let stalled = GatewayProcess::start("inquiry-stalled", &config).await;
    let c = client();
    let url = stalled.url("/v1/slow/2500");
    let sent = tokio::spawn({
        let c = c.clone();
        async move { crate::support::http::try_post(&c, &url, "stalled", "{}").await }
    });
    upstream.arrived("stalled").await;
    stalled.stall();
    let stalled_at = tokio::time::Instant::now();
    // The lease (1 s, renewed every third of it) has lapsed by now; the
    // question is due 3 s past the lapse, so after the upstream's answer.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let pending = post(&c, &survivor.url("/v1/slow/2500"), "stalled", "{}").await;
    assert_eq!(pending.status, StatusCode::CONFLICT, "{}", pending.text());
    assert_eq!(
        pending.problem_type(),
        "urn:idemgate:problem:outcome-pending"
    );
    let retry_after: u64 = pending
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After");
    assert!(retry_after >= 2, "the question is due in {retry_after} s");
    tokio::time::sleep(Duration::from_millis(400)).await;
    stalled.resume();
    let answered = sent.await.unwrap().expect("the stalled gateway answers");
    assert!(
        stalled_at.elapsed() < Duration::from_millis(3600),
        "too slow to tell: the question may have been due"
    );
    assert_eq!(answered.status, StatusCode::CREATED, "{}", answered.text());
    assert!(!answered.is_replay());
    let replay = post(&c, &survivor.url("/v1/slow/2500"), "stalled", "{}").await;
    assert_eq!(replay.status, StatusCode::CREATED, "{}", replay.text());
    assert!(replay.is_replay());
    assert_eq!(replay.body, answered.body);
    assert_eq!(upstream.executions_per_key()["stalled"].len(), 1);
    assert_eq!(upstream.lookups("stalled"), 0);
    assert_eq!(inquiries(&survivor, "acted").await, 0.0);
    survivor.shutdown().await;
}

/// `idemgate_inquiries_pending` counts a key the whole time it waits for
/// an answer (here during a long `after`, when no question is on the
/// wire), so an alert on it can fire; 0 once the key is settled.
async fn the_pending_gauge_counts_keys_while_they_wait(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let config = inquiring(&store, &upstream, "20s").route(|r| {
        let inquiry = r.get_mut("inquiry").and_then(toml::Value::as_table_mut);
        inquiry.expect("an inquiry").set("after", "6s");
    });
    let gateway = Gateway::start(&config).await;
    let (c, url) = (client(), gateway.url("/v1/reset"));
    assert_eq!(
        post(&c, &url, "waiting", "{}").await.status,
        StatusCode::BAD_GATEWAY
    );
    let unknown = tokio::time::Instant::now();
    // Within three ticks, and again half a second later: still in `after`.
    let seen = eventually(Duration::from_secs(3), || async {
        (pending(&gateway).await == 1.0).then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "idemgate_inquiries_pending read {} while the key waited",
        pending(&gateway).await
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiting = pending(&gateway).await;
    assert!(
        unknown.elapsed() < Duration::from_millis(5900),
        "too slow to tell"
    );
    assert_eq!(waiting, 1.0, "the gauge dropped while the key still waited");
    assert_eq!(upstream.lookups("waiting"), 0);
    let replay = settled(&c, &url, "waiting").await;
    assert!(replay.is_replay(), "{}", replay.text());
    let cleared = eventually(Duration::from_secs(3), || async {
        (pending(&gateway).await == 0.0).then_some(())
    })
    .await;
    assert!(cleared.is_some(), "the settled key is still counted");
    gateway.shutdown().await;
}

per_backend!(
    only [postgres, redis, sqlite, memory, front]:
    the_pending_gauge_counts_keys_while_they_wait,
    an_upstream_that_acted_then_reset_is_replayed,
    an_upstream_that_never_acted_gets_the_retry,
    a_failing_lookup_is_asked_again_until_it_answers,
    an_inquiry_gives_up_and_holds_the_key,
    a_lookup_that_lies_causes_a_second_execution,
);

/// Instances whose configurations inquire another route share the store
/// (two services on one Redis, a rolling deploy that adds an inquiring
/// route to new instances only): they must not delay this route's
/// questions. Each key is settled within 5 s of its outcome turning
/// unknown (`after` is 100 ms; the inquirer takes every second).
async fn instances_of_other_routes_never_delay_a_routes_questions(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let config = inquiring(&store, &upstream, "20s");
    let asking = Gateway::start(&config).await;
    let elsewhere = config.clone().route(|r| {
        r.set("name", "other").set("match", "/v2/*");
    });
    // Started a quarter of a second apart, as instances start at any time:
    // their inquirers' ticks fall at different moments of each second.
    let mut others = Vec::new();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        others.push(Gateway::start(&elsewhere).await);
    }
    let (c, url) = (client(), asking.url("/v1/reset"));
    for n in 0..4 {
        let key = format!("shared-{n}");
        assert_eq!(
            post(&c, &url, &key, "{}").await.status,
            StatusCode::BAD_GATEWAY
        );
        let answered = eventually(Duration::from_secs(5), || async {
            let reply = post(&c, &url, &key, "{}").await;
            (reply.status != StatusCode::CONFLICT).then_some(reply)
        })
        .await;
        let Some(replay) = answered else {
            panic!(
                "{key} still pending 5 s after its outcome turned unknown; its lookup was asked {} times",
                upstream.lookups(&key)
            );
        };
        assert!(replay.is_replay(), "{key}: {}", replay.text());
        assert_eq!(upstream.executions_per_key()[&key].len(), 1);
        assert_eq!(upstream.lookups(&key), 1, "{key}");
    }
    for gateway in others {
        gateway.shutdown().await;
    }
    asking.shutdown().await;
}

/// `forward_attempt = true`: the upstream gets each attempt's fencing token
/// (the gateway's, never the client's), growing from attempt to attempt.
async fn attempts_carry_their_token_upstream(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let config = store.config(&upstream.url()).route(|r| {
        r.set("forward_attempt", true).set("key_required", false);
    });
    let gateway = Gateway::start(&config).await;
    let c = client();
    let mut tokens = Vec::new();
    for key in ["first", "second"] {
        let headers = [
            ("idempotency-key", key),
            ("idempotency-attempt", "999999999999"),
        ];
        let reply = crate::support::send(&c, "POST", &gateway.url("/v1/pay"), &headers, "{}").await;
        assert_eq!(reply.status, StatusCode::CREATED);
        let sent = upstream.last_headers()["idempotency-attempt"]
            .to_str()
            .unwrap()
            .to_string();
        tokens.push(sent.parse::<i64>().unwrap());
    }
    assert!(tokens[0] > 0 && tokens[1] > tokens[0], "{tokens:?}");
    assert!(
        tokens[1] < 999_999_999_999,
        "the client's value reached the upstream"
    );
    // A forward without a claim (no key on a route that does not require
    // one) carries no token, and never the client's.
    let forged = [("idempotency-attempt", "999999999999")];
    let reply = crate::support::send(&c, "POST", &gateway.url("/v1/pay"), &forged, "{}").await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert!(upstream.last_headers().get("idempotency-attempt").is_none());
    gateway.shutdown().await;
}

mod attempt_header {
    use super::attempts_carry_their_token_upstream;
    use crate::support::per_backend;

    per_backend!(only [memory]: attempts_carry_their_token_upstream);
}

/// Several instances share the store: not the in-memory one.
mod shared {
    use super::{
        a_killed_gateways_key_is_resolved_by_another,
        a_stalled_gateways_answer_inside_after_settles_its_key,
        an_inquiring_key_inside_after_is_released_only_with_force,
        instances_of_other_routes_never_delay_a_routes_questions,
        operators_see_and_release_inquiring_keys, two_instances_ask_once,
    };
    use crate::support::per_backend;

    per_backend!(
        only [postgres, redis, sqlite, front]:
        two_instances_ask_once,
        a_killed_gateways_key_is_resolved_by_another,
        a_stalled_gateways_answer_inside_after_settles_its_key,
        an_inquiring_key_inside_after_is_released_only_with_force,
        operators_see_and_release_inquiring_keys,
        instances_of_other_routes_never_delay_a_routes_questions,
    );
}
