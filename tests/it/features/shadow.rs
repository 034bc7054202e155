//! Shadow mode (`mode = "shadow"`): every request reaches the upstream and
//! gets the upstream's own answer, while keyed requests are still claimed
//! and recorded and `idemgate_shadow_total{route, would}` counts what
//! enforcing would have done; on every store.

use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::upstream::digest;
use crate::support::{Backend, Set, Setup, per_backend, post, sample, send, spawn_slow_post};

fn shadow(config: crate::support::TestConfig) -> crate::support::TestConfig {
    config.route(|r| {
        r.set("mode", "shadow").set("upstream_timeout", "1s");
    })
}

async fn would(s: &Setup, what: &str) -> f64 {
    let metrics = s.gateway.metrics().await;
    sample(
        &metrics,
        &format!("idemgate_shadow_total{{route=\"api\",would=\"{what}\"}}"),
    )
}

async fn shadow_forwards_everything_and_counts_what_enforcing_would_do(b: Backend) {
    let s = Setup::with(b, shadow).await;
    let (c, url) = (&s.client, s.gateway.url("/v1/payments"));

    let first = post(c, &url, "k1", r#"{"amount":10}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = post(c, &url, "k1", r#"{"amount":10}"#).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(!again.is_replay(), "shadow never replays");
    assert_ne!(again.body, first.body, "the upstream answered again itself");
    let other = post(c, &url, "k1", r#"{"amount":99}"#).await;
    assert_eq!(
        other.status,
        StatusCode::CREATED,
        "shadow never answers 422"
    );
    let missing = send(c, "POST", &url, &[], "{}").await;
    assert_eq!(
        missing.status,
        StatusCode::CREATED,
        "shadow never answers 400"
    );
    let invalid = send(c, "POST", &url, &[("idempotency-key", "a b")], "{}").await;
    assert_eq!(invalid.status, StatusCode::CREATED);
    assert_eq!(s.upstream.total(), 5, "every request reached the upstream");

    // A duplicate while the first is at the upstream: forwarded too.
    let slow = spawn_slow_post(&s.client, &url, "k2", "600");
    s.upstream.arrived("k2").await;
    let during = post(c, &url, "k2", "{}").await;
    assert_eq!(
        during.status,
        StatusCode::CREATED,
        "shadow never answers 409"
    );
    assert_eq!(slow.await.unwrap().status, StatusCode::CREATED);

    // A key whose outcome is unknown (the upstream never answers): held,
    // and a retry is forwarded all the same.
    let hang = s.gateway.url("/v1/hang");
    let timed_out = post(c, &hang, "k3", "{}").await;
    assert_eq!(timed_out.status, StatusCode::GATEWAY_TIMEOUT);
    let retry = post(c, &hang, "k3", "{}").await;
    assert_eq!(retry.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        s.upstream.count("k3"),
        2,
        "the held key was forwarded again"
    );

    for (what, n) in [
        ("forward", 3.0),
        ("replay", 1.0),
        ("mismatch", 1.0),
        ("missing_key", 1.0),
        ("invalid_key", 1.0),
        ("conflict", 1.0),
        ("held", 1.0),
    ] {
        assert_eq!(would(&s, what).await, n, "would={what}");
    }
    // `replay` was counted, so the first request's record was written:
    // switching the route to enforce replays it.
}

async fn shadow_forwards_bodies_over_the_limit(b: Backend) {
    let s = Setup::with(b, |config| {
        shadow(config).route(|r| {
            r.set("max_request_body", "16B");
        })
    })
    .await;
    let big = "x".repeat(100);
    let declared = post(&s.client, &s.gateway.url("/v1/payments"), "big", &big).await;
    assert_eq!(declared.status, StatusCode::CREATED);
    // Chunked: found over the limit only while reading.
    let mut tcp = TcpStream::connect(s.gateway.addr).await.unwrap();
    let chunk = "y".repeat(40);
    let request = format!(
        "POST /v1/payments HTTP/1.1\r\nHost: t\r\nConnection: close\r\nIdempotency-Key: big2\r\n\
         Transfer-Encoding: chunked\r\n\r\n28\r\n{chunk}\r\n28\r\n{chunk}\r\n28\r\n{chunk}\r\n0\r\n\r\n"
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let last = s.upstream.executions().pop().expect("an execution");
    assert_eq!(
        last.body,
        digest(chunk.repeat(3).as_bytes()),
        "the whole body arrived"
    );
    assert_eq!(s.upstream.total(), 2);
}

/// A full memory store is a store error: a shadow route forwards anyway.
#[tokio::test]
async fn a_store_error_never_blocks_a_shadow_route() {
    let s = Setup::with(Backend::Memory, |config| {
        shadow(config).store(|t| {
            t.set("max_records", 1);
        })
    })
    .await;
    let url = s.gateway.url("/v1/payments");
    assert_eq!(
        post(&s.client, &url, "a", "{}").await.status,
        StatusCode::CREATED
    );
    let b = post(&s.client, &url, "b", "{}").await;
    assert_eq!(
        b.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&b.body)
    );
    assert_eq!(s.upstream.total(), 2);
}

/// The same requests on an enforcing route: the control that makes the
/// shadow counts mean something.
async fn enforce_answers_what_shadow_counted(b: Backend) {
    let s = Setup::start(b).await;
    let (c, url) = (&s.client, s.gateway.url("/v1/payments"));
    assert_eq!(
        post(c, &url, "k1", r#"{"amount":10}"#).await.status,
        StatusCode::CREATED
    );
    assert!(post(c, &url, "k1", r#"{"amount":10}"#).await.is_replay());
    assert_eq!(
        post(c, &url, "k1", r#"{"amount":99}"#).await.status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        send(c, "POST", &url, &[], "{}").await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(s.upstream.total(), 1);
    assert_eq!(would(&s, "forward").await, 0.0, "enforce counts no shadow");
}

/// A shadow route answers as if idemgate were absent, so its answers carry
/// no `Idempotency-Expires` of idemgate's, unless the route asks for it.
async fn shadow_names_no_expiry_unless_configured(b: Backend) {
    let s = Setup::with(b, shadow).await;
    let url = s.gateway.url("/v1/payments");
    let first = post(&s.client, &url, "e1", "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.header("idempotency-expires"), None);
    let told = Setup::with(b, |config| {
        shadow(config).route(|r| {
            r.set("expires_header", true);
        })
    })
    .await;
    let first = post(&told.client, &told.gateway.url("/v1/payments"), "e1", "{}").await;
    let date = first.header("idempotency-expires").expect("configured");
    assert!(httpdate::parse_http_date(date).is_ok(), "{date}");
}

per_backend!(
    shadow_names_no_expiry_unless_configured,
    shadow_forwards_everything_and_counts_what_enforcing_would_do,
    shadow_forwards_bodies_over_the_limit,
    enforce_answers_what_shadow_counted,
);

/// A store that fails after the forward costs a shadow route its record,
/// never the upstream's answer (under enforce the answer waits for the
/// record: G5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failing_after_the_forward_never_costs_the_answer() {
    let mut cluster = crate::support::servers::PgCluster::new().await;
    let upstream = crate::support::Upstream::start().await;
    let config = crate::support::TestConfig::new(&cluster.url(), &upstream.url()).route(|r| {
        r.set("mode", "shadow");
    });
    let gateway = crate::support::Gateway::start(&config).await;
    let http = crate::support::client();
    let url = gateway.url("/v1/payments");
    let answer = spawn_slow_post(&http, &url, "late", "1500");
    upstream.arrived("late").await;
    cluster.stop_immediate().await;
    let answer = answer.await.unwrap();
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.text());
    assert_eq!(upstream.count("late"), 1);
}
