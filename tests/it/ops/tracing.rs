//! OpenTelemetry traces, from the binary to a real OTLP receiver: the
//! caller's trace is continued, the store and upstream calls are children
//! of the request's span, the upstream gets the trace context, a replay
//! has no upstream span, a dead collector changes no answer, and with
//! tracing off nothing is added to what the upstream receives.

use std::collections::HashSet;
use std::time::Duration;

use http::StatusCode;

use crate::support::otlp::{CLIENT, Received, Receiver, SERVER};
use crate::support::process::{GatewayProcess, free_port};
use crate::support::{Set, TestConfig, Upstream, client, eventually, sample, send};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";

/// Export every 100 ms to `endpoint`.
fn tracing_to(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_string()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_string()),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "500".to_string()),
    ]
}

async fn start(name: &str, upstream: &Upstream, env: &[(&str, String)]) -> GatewayProcess {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let config = TestConfig::new("memory://", &upstream.url());
    GatewayProcess::start_with_env(name, &config, &env).await
}

/// The children of `parent` among `spans`.
fn children<'a>(spans: &'a [Received], parent: &Received) -> Vec<&'a Received> {
    spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id && s.trace_id == parent.trace_id)
        .collect()
}

/// The server span whose outcome is `outcome`.
fn server<'a>(spans: &'a [Received], outcome: &str) -> Option<&'a Received> {
    spans
        .iter()
        .find(|s| s.kind == SERVER && s.attr("idemgate.outcome") == Some(outcome))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_and_its_replay_continue_the_callers_trace() {
    let (receiver, upstream) = (Receiver::start().await, Upstream::start().await);
    let gateway = start("traced", &upstream, &tracing_to(&receiver.endpoint())).await;
    let http = client();
    let url = gateway.url("/v1/payments");
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    let headers = [
        ("idempotency-key", "pay-secret-key-1"),
        ("traceparent", traceparent.as_str()),
        ("tracestate", "vendor=1"),
    ];
    let first = send(&http, "POST", &url, &headers, "{\"amount\":1}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let sent = upstream.last_headers();
    let replay = send(&http, "POST", &url, &headers, "{\"amount\":1}").await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(upstream.count("pay-secret-key-1"), 1);

    let spans = receiver
        .until(|s| server(s, "forwarded").is_some() && server(s, "replayed").is_some())
        .await;
    let forward = server(&spans, "forwarded").unwrap();
    assert_eq!(forward.trace_id, TRACE, "the caller's trace is continued");
    assert_eq!(forward.parent_span_id, CALLER, "under the caller's span");
    assert_eq!(forward.service_name, "idemgate");
    assert_eq!(forward.name, "POST /v1/*", "named after the route");
    assert_eq!(forward.attr("http.route"), Some("/v1/*"));
    assert_eq!(forward.attr("http.request.method"), Some("POST"));
    assert_eq!(forward.attr("url.path"), Some("/v1/payments"));
    assert_eq!(forward.attr("http.response.status_code"), Some("201"));
    assert_eq!(forward.attr("idemgate.route"), Some("api"));
    let digest = forward.attr("idemgate.key_digest").expect("a key digest");
    assert_eq!(digest.len(), 12);
    assert!(
        forward.attr("idemgate.token").is_some(),
        "the fencing token"
    );
    for span in &spans {
        for (name, value) in &span.attributes {
            assert!(
                !value.contains("pay-secret-key"),
                "{name} carries the raw key"
            );
        }
    }

    let spans = receiver
        .until(|s| {
            let forward = server(s, "forwarded").unwrap();
            children(s, forward).len() >= 3
        })
        .await;
    let forward = server(&spans, "forwarded").unwrap();
    let below = children(&spans, forward);
    let names: HashSet<&str> = below.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains("claim"), "{names:?}");
    assert!(names.contains("complete"), "{names:?}");
    let call = below
        .iter()
        .find(|s| s.kind == CLIENT && s.attr("url.full").is_some())
        .unwrap_or_else(|| panic!("no upstream span: {below:#?}"));
    assert_eq!(call.attr("http.response.status_code"), Some("201"));
    let propagated = sent
        .get("traceparent")
        .expect("the upstream got a traceparent")
        .to_str()
        .unwrap();
    assert_eq!(
        propagated,
        format!("00-{TRACE}-{}-01", call.span_id),
        "the upstream's parent is the gateway's upstream span"
    );
    assert_eq!(sent.get("tracestate").unwrap(), "vendor=1");

    let replayed = server(&spans, "replayed").unwrap();
    assert_eq!(replayed.trace_id, TRACE);
    assert_eq!(replayed.attr("idemgate.key_digest"), Some(digest));
    // Give a late upstream span time to arrive: there must be none.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let spans = receiver.spans();
    let replayed = server(&spans, "replayed").unwrap();
    let under_replay = children(&spans, replayed);
    assert!(
        under_replay.iter().all(|s| s.attr("url.full").is_none()),
        "a replay has no upstream span: {under_replay:#?}"
    );

    let traced = format!("trace_id=\"{TRACE}\"");
    gateway
        .stderr_until("a trace_id in the log line", |s| s.contains(&traced))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_trace_context_starts_a_trace() {
    let (receiver, upstream) = (Receiver::start().await, Upstream::start().await);
    let gateway = start("new-trace", &upstream, &tracing_to(&receiver.endpoint())).await;
    let http = client();
    let url = gateway.url("/v1/payments");
    let reply = send(&http, "POST", &url, &[("idempotency-key", "fresh")], "{}").await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let sent = upstream.last_headers();
    let spans = receiver.until(|s| server(s, "forwarded").is_some()).await;
    let root = server(&spans, "forwarded").unwrap();
    assert_eq!(root.parent_span_id, "", "a new trace's root");
    assert!(sent.get("tracestate").is_none(), "no empty tracestate");
    let propagated = sent.get("traceparent").unwrap().to_str().unwrap();
    assert!(
        propagated.starts_with(&format!("00-{}-", root.trace_id)),
        "{propagated} is not in trace {}",
        root.trace_id
    );
}

/// The dropped-span counts of a gateway's `/metrics`: (queue full,
/// export failed).
async fn dropped(gateway: &GatewayProcess) -> (f64, f64) {
    let url = gateway.admin_url("/metrics");
    let text = send(&client(), "GET", &url, &[], "").await.text();
    let count = |reason: &str| {
        let series = format!("idemgate_trace_spans_dropped_total{{reason=\"{reason}\"}}");
        sample(&text, &series)
    };
    (count("queue_full"), count("export_failed"))
}

/// `count` keyed requests (three keys, each sent `count / 3` times) and an
/// unkeyed one: every answer is what it is without tracing.
async fn answers_are_unchanged(gateway: &GatewayProcess, upstream: &Upstream, count: usize) {
    let http = client();
    let url = gateway.url("/v1/payments");
    for n in 0..count {
        let key = ["a", "b", "c"][n % 3];
        let reply = send(&http, "POST", &url, &[("idempotency-key", key)], "{}").await;
        assert_eq!(reply.status, StatusCode::CREATED, "request {n}, key {key}");
    }
    let unkeyed = send(&http, "POST", &url, &[], "{}").await;
    assert_eq!(unkeyed.status, StatusCode::BAD_REQUEST);
    assert_eq!(upstream.total(), 3, "each key executed once");
}

/// A collector nobody listens for: every answer is what it is without
/// tracing, and the spans of the refused exports are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_changes_no_answer() {
    let upstream = Upstream::start().await;
    let dead = format!("http://127.0.0.1:{}", free_port());
    let gateway = start("dead-collector", &upstream, &tracing_to(&dead)).await;
    answers_are_unchanged(&gateway, &upstream, 9).await;
    let counted = eventually(Duration::from_secs(30), || async {
        let (_, failed) = dropped(&gateway).await;
        (failed > 0.0).then_some(())
    })
    .await;
    assert!(
        counted.is_some(),
        "no failed export counted\n{}",
        gateway.stderr()
    );
}

/// A collector that takes the connection and never answers, and a queue
/// of one span: requests are answered as without tracing, spans that find
/// the queue full are dropped and counted, never waited for, and the
/// stalled export is counted as failed once it times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_collector_and_a_full_queue_change_no_answer() {
    let stalled = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", stalled.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = stalled.accept().await {
            held.push(socket);
        }
    });
    let upstream = Upstream::start().await;
    let mut env = tracing_to(&endpoint);
    env.push(("OTEL_BSP_MAX_QUEUE_SIZE", "1".to_string()));
    let gateway = start("stalled-collector", &upstream, &env).await;
    answers_are_unchanged(&gateway, &upstream, 30).await;
    let counted = eventually(Duration::from_secs(30), || async {
        let (full, failed) = dropped(&gateway).await;
        (full > 0.0 && failed > 0.0).then_some(())
    })
    .await;
    assert!(
        counted.is_some(),
        "drops not counted: {:?}\n{}",
        dropped(&gateway).await,
        gateway.stderr()
    );
}

/// Tracing off: the gateway reads and writes no trace header; a caller's
/// `traceparent` reaches the upstream as it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tracing_off_trace_headers_pass_untouched() {
    let upstream = Upstream::start().await;
    let gateway = start("untraced", &upstream, &[]).await;
    let http = client();
    let url = gateway.url("/v1/payments");
    let reply = send(&http, "POST", &url, &[("idempotency-key", "k1")], "{}").await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert!(upstream.last_headers().get("traceparent").is_none());
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    let headers = [
        ("idempotency-key", "k2"),
        ("traceparent", traceparent.as_str()),
    ];
    let reply = send(&http, "POST", &url, &headers, "{}").await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(
        upstream.last_headers().get("traceparent").unwrap(),
        &traceparent
    );
    assert!(upstream.last_headers().get("tracestate").is_none());
    let logged = gateway
        .stderr_until("both request lines", |s| {
            s.matches("outcome=\"forwarded\"").count() == 2
        })
        .await;
    assert!(!logged.contains("trace_id"), "{logged}");
}

/// A key read from the query never leaves in a span: the upstream's URL
/// is exported without its query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_the_query_is_not_exported() {
    let (receiver, upstream) = (Receiver::start().await, Upstream::start().await);
    let config = TestConfig::new("memory://", &upstream.url()).route(|r| {
        r.set("key_from", vec!["query:id"]);
    });
    let env = tracing_to(&receiver.endpoint());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let gateway = GatewayProcess::start_with_env("query-key", &config, &env).await;
    let url = gateway.url("/v1/payments?id=raw-secret-key-9");
    let reply = send(&client(), "POST", &url, &[], "{}").await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    assert_eq!(upstream.total(), 1);
    let spans = receiver
        .until(|s| {
            s.iter()
                .any(|span| span.kind == CLIENT && span.attr("url.full").is_some())
                && server(s, "forwarded").is_some()
        })
        .await;
    let call = spans.iter().find(|s| s.attr("url.full").is_some()).unwrap();
    let exported = call.attr("url.full").unwrap();
    assert!(exported.ends_with("/v1/payments"), "{exported}");
    for span in &spans {
        for (name, value) in &span.attributes {
            assert!(!value.contains("raw-secret-key"), "{name} = {value}");
        }
    }
}
