//! Live configuration: `POST /config/reload` (in process) and SIGHUP (the
//! binary) swap the routes in while the gateway serves; a broken file and
//! settings only a restart applies change nothing, and each reload is
//! counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use toml::{Table, Value};

use crate::support::process::GatewayProcess;
use crate::support::upstream::DELAY_HEADER;
use crate::support::{Gateway, Set, TestConfig, Upstream, client, post, sample, send};

const TOKEN: &str = "reload-test-token";

/// One `api` route on `/v1/*` to `upstream`, in memory, with the admin
/// token and room for a slow upstream.
fn config(upstream: &Upstream) -> TestConfig {
    TestConfig::new("memory://", &upstream.url())
        .top(|t| {
            t.set("admin_token", TOKEN);
        })
        .defaults(|d| {
            d.set("upstream_timeout", "10s").set("lease", "15s");
        })
}

/// A second route, `orders`, on `/v2/*` to `upstream`.
fn with_orders(config: TestConfig, upstream: &Upstream) -> TestConfig {
    config.routes(|routes| {
        let mut orders = Table::new();
        orders
            .set("name", "orders")
            .set("match", "/v2/*")
            .set("upstream", upstream.url());
        routes.push(Value::Table(orders));
    })
}

/// A request in flight finishes with the upstream its route had when it
/// arrived; the next one goes to the route's new upstream; the key the
/// slow one recorded replays after the swap; the slow request's own
/// connection was not dropped by the swap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_request_survives_a_reload_that_changes_its_upstream() {
    let (before, after) = (Upstream::start().await, Upstream::start().await);
    let gateway = Gateway::start(&config(&before)).await;
    let http = client();
    let url = gateway.url("/v1/payments");
    let slow = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        async move {
            let headers = [("idempotency-key", "slow"), (DELAY_HEADER, "1500")];
            send(&http, "POST", &url, &headers, "{}").await
        }
    });
    before.arrived("slow").await;

    let moved = config(&before).route(|r| {
        r.set("upstream", after.url());
    });
    gateway.rewrite(&moved.to_string());
    let (status, answer) = gateway.reload(Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["reloaded"], true);
    assert_eq!(answer["routes"], 1);
    assert_eq!(answer["restart_required"], serde_json::json!([]));
    assert_eq!(answer["key_changes"], serde_json::json!([]));

    let fresh = post(&http, &url, "fresh", "{}").await;
    assert_eq!(fresh.status, StatusCode::CREATED);
    assert_eq!((before.count("fresh"), after.count("fresh")), (0, 1));

    let slow = slow.await.unwrap();
    assert_eq!(slow.status, StatusCode::CREATED, "{}", slow.text());
    let replay = send(&http, "POST", &url, &[("idempotency-key", "slow")], "{}").await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.body, slow.body, "the recorded answer replays");
    assert_eq!((before.count("slow"), after.count("slow")), (1, 0));

    let metrics = gateway.metrics().await;
    assert_eq!(
        sample(&metrics, "idemgate_config_reloads_total{result=\"ok\"}"),
        1.0
    );
    gateway.shutdown().await;
}

/// A file that fails validation changes nothing: the answer names the
/// key, the old routes serve on, and the error is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_file_keeps_the_old_config_and_counts_an_error() {
    let (upstream, other) = (Upstream::start().await, Upstream::start().await);
    let gateway = Gateway::start(&config(&upstream)).await;
    let broken = with_orders(config(&upstream), &other).route(|r| {
        r.set("lease", "forever");
    });
    gateway.rewrite(&broken.to_string());
    let (status, answer) = gateway.reload(Some(TOKEN)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["reloaded"], false);
    let error = answer["error"].as_str().unwrap();
    assert!(error.contains("lease"), "the error names the key: {error}");

    let http = client();
    let kept = post(&http, &gateway.url("/v1/payments"), "kept", "{}").await;
    assert_eq!(kept.status, StatusCode::CREATED);
    assert_eq!(upstream.count("kept"), 1);
    let unrouted = post(&http, &gateway.url("/v2/orders"), "new", "{}").await;
    assert_eq!(
        unrouted.status,
        StatusCode::NOT_FOUND,
        "orders was not added"
    );
    assert_eq!(other.total(), 0);

    let metrics = gateway.metrics().await;
    let count = |result: &str| {
        sample(
            &metrics,
            &format!("idemgate_config_reloads_total{{result=\"{result}\"}}"),
        )
    };
    assert_eq!((count("ok"), count("error")), (0.0, 1.0));
    gateway.shutdown().await;
}

/// Settings only a restart applies are named in the answer and counted,
/// and not applied; the routes in the same file are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_only_change_is_reported_and_ignored() {
    let (upstream, other) = (Upstream::start().await, Upstream::start().await);
    let gateway = Gateway::start(&config(&upstream)).await;
    let changed = with_orders(config(&upstream), &other)
        .top(|t| {
            t.set("max_header_bytes", "32KiB")
                .set("admin_token", "another-token-0123456789");
        })
        .store(|s| {
            s.set("url", "sqlite://elsewhere.db");
        });
    gateway.rewrite(&changed.to_string());
    let (status, answer) = gateway.reload(Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["restart_required"],
        serde_json::json!(["admin_token", "max_header_bytes", "store.url"])
    );
    assert_eq!(answer["routes"], 2);

    let http = client();
    let added = post(&http, &gateway.url("/v2/orders"), "o-1", "{}").await;
    assert_eq!(added.status, StatusCode::CREATED, "the new route serves");
    assert_eq!(other.count("o-1"), 1);
    // The token in force is still the one it started with.
    let (status, _) = gateway.reload(Some("another-token-0123456789")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = gateway.reload(Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    let metrics = gateway.metrics().await;
    assert_eq!(
        sample(&metrics, "idemgate_config_restart_pending"),
        3.0,
        "{metrics}"
    );
    gateway.shutdown().await;
}

/// Reloading is a state change: without the admin token it is refused,
/// and with no token configured it is off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloading_over_http_needs_the_admin_token() {
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&config(&upstream)).await;
    for token in [None, Some("wrong")] {
        let (status, _) = gateway.reload(token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
    }
    gateway.shutdown().await;

    let open = TestConfig::new("memory://", &upstream.url());
    let gateway = Gateway::start(&open).await;
    let (status, _) = gateway.reload(Some(TOKEN)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let metrics = gateway.metrics().await;
    let attempts = sample(&metrics, "idemgate_config_reloads_total{result=\"ok\"}")
        + sample(&metrics, "idemgate_config_reloads_total{result=\"error\"}");
    assert_eq!(attempts, 0.0, "a refused caller reloads nothing");
    gateway.shutdown().await;
}

/// SIGHUP on the binary: a route added to the file serves soon after
/// (the time is printed; speed is the benchmark's business), the process
/// goes on, and a later SIGHUP with a broken file keeps the route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_adds_a_route_and_never_ends_the_process() {
    let (upstream, orders) = (Upstream::start().await, Upstream::start().await);
    let base = config(&upstream);
    let gateway = GatewayProcess::start("reload", &base).await;
    let http = client();
    let url = gateway.url("/v2/orders");
    assert_eq!(
        post(&http, &url, "before", "{}").await.status,
        StatusCode::NOT_FOUND
    );

    gateway.rewrite(&with_orders(base.clone(), &orders));
    let signalled = Instant::now();
    gateway.hangup();
    let served = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let first = crate::support::eventually(Duration::from_secs(30), || {
        let (http, url, served) = (http.clone(), url.clone(), served.clone());
        async move {
            let n = served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let reply = post(&http, &url, &format!("after-{n}"), "{}").await;
            (reply.status == StatusCode::CREATED).then(|| signalled.elapsed())
        }
    })
    .await;
    let took = first.unwrap_or_else(|| panic!("the new route never served\n{}", gateway.stderr()));
    eprintln!("a new route served {took:?} after SIGHUP");
    gateway
        .stderr_until("the reload", |s| s.contains("configuration reloaded"))
        .await;

    let broken = with_orders(base, &orders).top(|t| {
        t.set("max_connections", 0);
    });
    gateway.rewrite(&broken);
    gateway.hangup();
    let refused = gateway
        .stderr_until("the refusal", |s| s.contains("reload refused"))
        .await;
    assert!(refused.contains("max_connections"), "{refused}");
    let still = post(&http, &url, "still", "{}").await;
    assert_eq!(still.status, StatusCode::CREATED);
    let health = crate::support::http::get_status(&http, &gateway.admin_url("/healthz")).await;
    assert_eq!(
        health,
        Some(StatusCode::OK),
        "SIGHUP never ends the process"
    );
}

/// `watch_config`: a change of the file reloads without a signal; a
/// refused change is tried once, not at every look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_file_reloads_when_it_changes() {
    let (upstream, orders) = (Upstream::start().await, Upstream::start().await);
    let base = config(&upstream).top(|t| {
        t.set("watch_config", "1s");
    });
    let gateway = Gateway::start(&base).await;
    gateway.rewrite(&with_orders(base.clone(), &orders).to_string());
    let http = client();
    let url = gateway.url("/v2/orders");
    let tries = std::sync::atomic::AtomicU32::new(0);
    let served = crate::support::eventually(Duration::from_secs(30), || {
        let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (http, url) = (http.clone(), url.clone());
        async move {
            let reply = post(&http, &url, &format!("w-{n}"), "{}").await;
            (reply.status == StatusCode::CREATED).then_some(())
        }
    })
    .await;
    assert!(served.is_some(), "the changed file was never applied");

    let broken = with_orders(base, &orders).route(|r| {
        r.set("lease", "forever");
    });
    gateway.rewrite(&broken.to_string());
    let count = |metrics: &str, result: &str| {
        let series = format!("idemgate_config_reloads_total{{result=\"{result}\"}}");
        sample(metrics, &series)
    };
    let refused = crate::support::eventually(Duration::from_secs(30), || async {
        let metrics = gateway.metrics().await;
        (count(&metrics, "error") >= 1.0).then_some(())
    })
    .await;
    assert!(refused.is_some(), "the broken file was never looked at");
    // Several more looks at the same broken bytes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let metrics = gateway.metrics().await;
    assert_eq!(
        (count(&metrics, "ok"), count(&metrics, "error")),
        (1.0, 1.0)
    );
    let still = post(&http, &url, "still", "{}").await;
    assert_eq!(
        still.status,
        StatusCode::CREATED,
        "the last good routes serve on"
    );
    gateway.shutdown().await;
}
