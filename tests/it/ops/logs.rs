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

/// `line` past its RFC 3339 timestamp (to the microsecond, UTC).
fn after_timestamp(line: &str) -> &str {
    let (stamp, rest) = line.split_at("2026-11-29T16:39:18.987214Z".len());
    assert!(
        stamp.ends_with('Z') && stamp.as_bytes()[10] == b'T',
        "no timestamp: {line}"
    );
    rest
}

/// `rest` starts with `prefix`; what follows, up to `end`, is a decimal
/// number (the latency); returns what follows it.
fn past_latency<'a>(rest: &'a str, prefix: &str, end: char) -> &'a str {
    let rest = rest
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{rest:?} does not start with {prefix:?}"));
    let number = rest.find(end).expect("the latency's end");
    assert!(
        rest[..number].parse::<f64>().is_ok(),
        "latency {:?}",
        &rest[..number]
    );
    &rest[number..]
}

/// The request lines as written, whole: what tracing-subscriber's `fmt`
/// writes (the gateway writes them itself, `src/logging/request_line.rs`),
/// field for field and in its order, in text and in JSON.
#[tokio::test]
async fn request_lines_are_written_whole_in_fmt_s_shape() {
    let text = log_of_requests("text-shape", |config| config).await;
    let first = after_timestamp(request_lines(&text)[0]);
    let rest = past_latency(
        first,
        "  INFO idemgate::request: request method=POST path=/v1/payments route=\"api\" \
         outcome=\"forwarded\" status=201 latency_ms=",
        ' ',
    );
    let (digest, token) = rest
        .strip_prefix(" key=\"")
        .and_then(|r| r.split_once("\" token="))
        .unwrap_or_else(|| panic!("{rest:?}"));
    assert_eq!(digest.len(), 12, "{rest:?}");
    assert!(token.parse::<u64>().is_ok(), "{rest:?}");

    let json = log_of_requests("json-shape", |config| {
        config.top(|t| {
            t.set("log_format", "json");
        })
    })
    .await;
    let line = request_lines(&json)[1];
    let rest = line
        .strip_prefix("{\"timestamp\":\"")
        .unwrap_or_else(|| panic!("{line}"));
    let rest = past_latency(
        after_timestamp(rest),
        "\",\"level\":\"INFO\",\"message\":\"request\",\"method\":\"POST\",\
         \"path\":\"/v1/payments\",\"route\":\"api\",\"outcome\":\"replayed\",\
         \"status\":201,\"latency_ms\":",
        ',',
    );
    let (digest, end) = rest
        .strip_prefix(",\"key\":\"")
        .and_then(|r| r.split_once('"'))
        .unwrap_or_else(|| panic!("{rest:?}"));
    assert_eq!(digest.len(), 12, "{rest:?}");
    assert_eq!(end, ",\"target\":\"idemgate::request\"}", "{line}");
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

/// The log writer runs off the request path: with stderr a pipe nobody
/// reads (a stuck log shipper), requests are still answered, and the lines
/// that did not fit the queue are counted, not waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_log_pipe_never_stalls_requests_and_drops_are_counted() {
    use crate::support::process::{binary, free_port};
    let upstream = Upstream::start().await;
    let (port, admin_port) = (free_port(), free_port());
    let config = TestConfig::new("memory://", &upstream.url()).with_ports(port, admin_port);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config.to_string()).unwrap();
    // stderr is a pipe this test never reads: it fills after ~64 KiB.
    let mut child = std::process::Command::new(binary())
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let http = client();
    let health = format!("http://127.0.0.1:{admin_port}/healthz");
    let ready = eventually(Duration::from_secs(30), || {
        let (http, health) = (http.clone(), health.clone());
        async move {
            let status = crate::support::http::get_status(&http, &health).await;
            (status == Some(StatusCode::OK)).then_some(())
        }
    })
    .await;
    assert!(ready.is_some(), "the gateway did not start");
    // More request lines than the pipe and the buffer hold together (a
    // request line here is over 100 bytes).
    let total = idemgate::logging::LOG_BUFFER_BYTES / 100 + 4_000;
    let workers = 16;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let http = http.clone();
        let url = format!("http://127.0.0.1:{port}/v1/things");
        tasks.spawn(async move {
            for _ in 0..total.div_ceil(workers) {
                let reply = tokio::time::timeout(
                    Duration::from_secs(10),
                    crate::support::send(&http, "GET", &url, &[], ""),
                )
                .await
                .unwrap_or_else(|_| panic!("worker {w}: a request waited 10 s on the log"));
                assert_eq!(reply.status, StatusCode::CREATED);
            }
        });
    }
    tasks.join_all().await;
    let metrics = http
        .get(
            format!("http://127.0.0.1:{admin_port}/metrics")
                .parse()
                .unwrap(),
        )
        .await
        .unwrap();
    let text = {
        use http_body_util::BodyExt;
        let bytes = metrics.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let dropped = crate::support::sample(&text, "idemgate_log_lines_dropped_total");
    assert!(
        dropped > 0.0,
        "dropped lines are counted: {dropped}\n{text}"
    );
    let _ = child.kill();
    let _ = child.wait();
}
