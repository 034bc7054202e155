//! The gateway's logs (the real binary's stderr): one line per request, in
//! text or JSON, and never a raw key — only a short digest of it.

use std::time::Duration;

use http::StatusCode;

use crate::support::process::GatewayProcess;
use crate::support::{Backend, Set, TestConfig, TestStore, Upstream, client, eventually, post};

const SECRET_KEY: &str = "customer-42-secret-idempotency-key";

async fn run_requests(gateway: &GatewayProcess, upstream: &Upstream) {
    let c = client();
    let url = gateway.url("/v1/payments");
    assert_eq!(
        post(&c, &url, SECRET_KEY, "{}").await.status,
        StatusCode::CREATED
    );
    assert!(
        post(&c, &url, &format!("\"{SECRET_KEY}\""), "{}")
            .await
            .is_replay()
    );
    assert_eq!(
        post(&c, &url, SECRET_KEY, "{\"x\":1}").await.status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let held = post(
        &c,
        &gateway.url("/v1/reset"),
        &format!("{SECRET_KEY}-b"),
        "{}",
    )
    .await;
    assert_eq!(held.status, StatusCode::BAD_GATEWAY);
    assert_eq!(upstream.count(SECRET_KEY), 1);
}

fn request_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("idemgate::request"))
        .collect()
}

/// The log of a gateway process (on memory://, its config edited by `edit`)
/// that served [`run_requests`], once it has their four lines; no raw key
/// may be in it.
async fn log_of_requests(name: &str, edit: impl FnOnce(TestConfig) -> TestConfig) -> String {
    let store = TestStore::new(Backend::Memory).await;
    let upstream = Upstream::start().await;
    let gateway = GatewayProcess::start(name, &edit(store.config(&upstream.url()))).await;
    run_requests(&gateway, &upstream).await;
    let log = eventually(Duration::from_secs(5), || async {
        let log = gateway.stderr();
        (request_lines(&log).len() >= 4).then_some(log)
    })
    .await
    .expect("four request lines");
    assert!(
        !log.contains(SECRET_KEY),
        "a raw key reached the log:\n{log}"
    );
    log
}

#[tokio::test]
async fn json_logs_have_one_line_per_request_and_no_raw_key() {
    let log = log_of_requests("json-logs", |config| {
        config.top(|t| {
            t.set("log_format", "json");
        })
    })
    .await;
    let lines: Vec<serde_json::Value> = request_lines(&log)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let outcomes: Vec<&str> = lines
        .iter()
        .map(|v| v["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["forwarded", "replayed", "mismatch", "rejected"],
        "{log}"
    );
    let first = &lines[0];
    assert_eq!(first["route"], "api");
    assert_eq!(first["status"], 201);
    assert!(first["latency_ms"].as_f64().is_some());
    assert!(
        first["token"].as_i64().is_some(),
        "the attempt's fencing token is logged"
    );
    let digest = first["key"].as_str().unwrap();
    assert_eq!(digest.len(), 12);
    assert!(
        lines.iter().take(3).all(|v| v["key"] == digest),
        "one key, one digest (quoted or bare)"
    );
}

#[tokio::test]
async fn text_logs_never_contain_a_raw_key() {
    let log = log_of_requests("text-logs", |config| config).await;
    assert!(log.contains("outcome=\"forwarded\""), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "no colour codes when stderr is not a terminal"
    );
}
