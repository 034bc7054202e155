//! What a request must look like, and what of it reaches the upstream:
//! a missing or invalid `Idempotency-Key` is `400` (and keys that are lists
//! are refused), its quoted and bare forms are one key, a route may make
//! it optional, unprotected methods and unrouted paths pass through or
//! `404`, an oversized body is `413`, the key and `X-Forwarded-*` headers
//! reach the upstream and hop-by-hop headers never do, `Connection` cannot
//! strip the key or scope header, a chunked body reaches the upstream
//! whatever the method, and an HTTP/2 request with a connection-specific
//! header is malformed (the h2 layer resets its stream; it never reaches
//! the upstream).

use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::upstream::digest;
use crate::support::{Backend, Set, Setup, per_backend, post, send};

/// Send raw HTTP/1.1 bytes; the whole answer (the request says `close`).
async fn raw_h1(s: &Setup, request: &str) -> String {
    let mut tcp = TcpStream::connect(s.gateway.addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn a_bare_key_with_a_comma_is_a_list_not_a_key() {
    let s = Setup::start(Backend::Memory).await;
    let url = s.gateway.url("/v1/payments");
    let list = send(&s.client, "POST", &url, &[("idempotency-key", "a,b")], "{}").await;
    assert_eq!(list.status, StatusCode::BAD_REQUEST);
    assert_eq!(list.problem_type(), "urn:idemgate:problem:invalid-key");
    let quoted = send(
        &s.client,
        "POST",
        &url,
        &[("idempotency-key", "\"a,b\"")],
        "{}",
    )
    .await;
    assert_eq!(quoted.status, StatusCode::CREATED);
    assert_eq!(s.upstream.total(), 1);
}

#[tokio::test]
async fn connection_cannot_strip_the_key_or_the_scope_header() {
    let s = Setup::with(Backend::Memory, |config| {
        config.route(|r| {
            r.set("scope_header", "Authorization");
        })
    })
    .await;
    let answer = raw_h1(
        &s,
        "POST /v1/payments HTTP/1.1\r\nHost: t\r\nIdempotency-Key: conn-key\r\n\
         Authorization: Bearer alice\r\nConnection: close, Idempotency-Key, Authorization, X-Hop\r\n\
         X-Hop: 1\r\nContent-Length: 2\r\n\r\n{}",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let h = s.upstream.last_headers();
    assert_eq!(h["idempotency-key"], "conn-key", "{h:?}");
    assert_eq!(h["authorization"], "Bearer alice", "{h:?}");
    assert!(
        !h.contains_key("x-hop"),
        "other named headers still go: {h:?}"
    );
}

#[tokio::test]
async fn a_chunked_body_reaches_the_upstream_whatever_the_method() {
    let s = Setup::start(Backend::Memory).await;
    // Methods the route does not protect: streamed through as they come.
    for method in ["GET", "DELETE", "PUT"] {
        let answer = raw_h1(
            &s,
            &format!(
                "{method} /v1/things HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
                 Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            ),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 201"), "{method}: {answer}");
        let last = s.upstream.executions().pop().expect("an execution");
        assert_eq!(
            last.body,
            digest(b"hello world"),
            "{method}: the body was lost"
        );
    }
}

/// One HTTP/2 frame: length, type, flags, stream, payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// An HPACK literal header (without indexing, new name, no Huffman).
fn literal(name: &str, value: &str) -> Vec<u8> {
    let mut out = vec![0x00, name.len() as u8];
    out.extend(name.as_bytes());
    out.push(value.len() as u8);
    out.extend(value.as_bytes());
    out
}

/// How the gateway answered one HTTP/2 request.
#[derive(Debug, PartialEq, Eq)]
enum H2Answer {
    /// A HEADERS frame; the first byte of its header block (`:status`).
    Headers(u8),
    /// RST_STREAM: the request was refused as malformed.
    Reset,
}

/// Send one HTTP/2 GET (prior knowledge) with `extra` headers.
async fn raw_h2_get(s: &Setup, extra: &[(&str, &str)]) -> H2Answer {
    let mut tcp = TcpStream::connect(s.gateway.addr).await.unwrap();
    let mut block = vec![0x82, 0x86]; // :method GET, :scheme http
    block.extend([0x04, 10]); // :path, literal value
    block.extend(b"/v1/things");
    block.extend([0x01, 1, b't']); // :authority t
    for (name, value) in extra {
        block.extend(literal(name, value));
    }
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    out.extend(frame(0x1, 0x5, 1, &block)); // HEADERS, END_STREAM | END_HEADERS
    tcp.write_all(&out).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), tcp.read(&mut chunk))
            .await
            .expect("an answer")
            .unwrap();
        assert!(n > 0, "closed without answering");
        buf.extend(&chunk[..n]);
        // Walk the frames for the HEADERS of stream 1.
        let mut at = 0;
        while at + 9 <= buf.len() {
            let len = u32::from_be_bytes([0, buf[at], buf[at + 1], buf[at + 2]]) as usize;
            let (kind, stream) = (
                buf[at + 3],
                u32::from_be_bytes(buf[at + 5..at + 9].try_into().unwrap()),
            );
            if at + 9 + len > buf.len() {
                break;
            }
            match (kind, stream) {
                (0x1, 1) => return H2Answer::Headers(buf[at + 9]),
                (0x3, 1) => return H2Answer::Reset,
                _ => {}
            }
            at += 9 + len;
        }
    }
}

#[tokio::test]
async fn http2_requests_with_connection_specific_headers_are_malformed() {
    let s = Setup::start(Backend::Memory).await;
    let control = raw_h2_get(&s, &[("x-plain", "1")]).await;
    assert!(matches!(control, H2Answer::Headers(_)), "{control:?}");
    assert_eq!(s.upstream.total(), 1, "a plain HTTP/2 GET is proxied");
    for (name, value) in [
        ("transfer-encoding", "chunked"),
        ("connection", "keep-alive"),
        ("keep-alive", "timeout=5"),
        ("upgrade", "websocket"),
        ("te", "gzip"),
    ] {
        let answer = raw_h2_get(&s, &[(name, value)]).await;
        assert_eq!(answer, H2Answer::Reset, "{name}: {answer:?}");
    }
    assert_eq!(s.upstream.total(), 1, "a malformed request was forwarded");
}

async fn missing_and_invalid_keys_are_400(b: Backend) {
    let s = Setup::start(b).await;
    let url = s.gateway.url("/v1/payments");
    let missing = send(&s.client, "POST", &url, &[], "{}").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.problem_type(), "urn:idemgate:problem:missing-key");
    let long = "k".repeat(256);
    // HTTP parsers already refuse most control characters; a tab gets through.
    for bad in [
        "",
        "\"\"",
        long.as_str(),
        "\"unterminated",
        "\"a\\nb\"",
        "\"a\"b",
        "a b",
        "a\tb",
        "\"a\tb\"",
        "caf\u{e9}",
    ] {
        let reply = send(&s.client, "POST", &url, &[("idempotency-key", bad)], "{}").await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "key {bad:?}");
        assert_eq!(
            reply.problem_type(),
            "urn:idemgate:problem:invalid-key",
            "key {bad:?}"
        );
    }
    let twice = send(
        &s.client,
        "POST",
        &url,
        &[("idempotency-key", "a"), ("idempotency-key", "b")],
        "{}",
    )
    .await;
    assert_eq!(twice.status, StatusCode::BAD_REQUEST);
    let ok = "k".repeat(255);
    assert_eq!(
        post(&s.client, &url, &ok, "{}").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        s.upstream.total(),
        1,
        "no invalid request reached the upstream"
    );
}

async fn optional_key_route_passes_keyless_requests_through(b: Backend) {
    let s = Setup::with(b, |config| {
        config.route(|r| {
            r.set("key_required", false);
        })
    })
    .await;
    let url = s.gateway.url("/v1/payments");
    for _ in 0..2 {
        let reply = send(&s.client, "POST", &url, &[], "{}").await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert!(!reply.is_replay());
    }
    assert_eq!(s.upstream.total(), 2);
}

async fn quoted_and_bare_forms_are_one_key(b: Backend) {
    let s = Setup::start(b).await;
    let url = s.gateway.url("/v1/payments");
    let first = post(&s.client, &url, "\"order-7\"", "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let second = post(&s.client, &url, "order-7", "{}").await;
    assert!(second.is_replay(), "{second:?}");
    assert_eq!(second.body, first.body);
    assert_eq!(s.upstream.total(), 1);
}

async fn unprotected_methods_pass_through_untouched(b: Backend) {
    let s = Setup::start(b).await;
    let url = s.gateway.url("/v1/payments?x=1");
    for _ in 0..3 {
        let reply = send(&s.client, "GET", &url, &[("idempotency-key", "g1")], "").await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert!(!reply.is_replay());
    }
    assert_eq!(s.upstream.count("g1"), 3);
    assert_eq!(s.upstream.last_headers()["idempotency-key"], "g1");
    let unrouted = send(
        &s.client,
        "POST",
        &s.gateway.url("/elsewhere"),
        &[("idempotency-key", "x")],
        "",
    )
    .await;
    assert_eq!(unrouted.status, StatusCode::NOT_FOUND);
    assert_eq!(unrouted.problem_type(), "urn:idemgate:problem:no-route");
}

async fn key_and_forwarding_headers_reach_the_upstream(b: Backend) {
    let s = Setup::start(b).await;
    post(&s.client, &s.gateway.url("/v1/payments"), "\"fwd-1\"", "{}").await;
    let h = s.upstream.last_headers();
    assert_eq!(
        h["idempotency-key"], "\"fwd-1\"",
        "the key header passes through intact"
    );
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-forwarded-host"], s.gateway.addr.to_string());
}

async fn oversized_request_body_is_413(b: Backend) {
    let s = Setup::with(b, |config| {
        config.route(|r| {
            r.set("max_request_body", "1KiB");
        })
    })
    .await;
    let url = s.gateway.url("/v1/payments");
    let big = "x".repeat(1025);
    let reply = post(&s.client, &url, "big", &big).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(reply.problem_type(), "urn:idemgate:problem:body-too-large");
    assert_eq!(
        post(&s.client, &url, "fits", &"x".repeat(1024))
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(s.upstream.count("big"), 0);
}

async fn hop_by_hop_headers_never_reach_the_upstream(b: Backend) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = Setup::start(b).await;
    for method in ["POST", "GET"] {
        let mut tcp = tokio::net::TcpStream::connect(s.gateway.addr)
            .await
            .unwrap();
        let request = format!(
            "{method} /v1/payments HTTP/1.1\r\nHost: api.test\r\nIdempotency-Key: hop-{method}\r\n\
             Connection: close, X-Private-Hop\r\nX-Private-Hop: secret\r\nKeep-Alive: timeout=5\r\n\
             Proxy-Connection: keep-alive\r\nTE: trailers\r\nX-Kept: yes\r\nContent-Length: 2\r\n\r\n{{}}"
        );
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer).await.unwrap();
        assert!(
            answer.starts_with(b"HTTP/1.1 201"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        let h = s.upstream.last_headers();
        for hop in [
            "x-private-hop",
            "keep-alive",
            "proxy-connection",
            "te",
            "transfer-encoding",
            "upgrade",
        ] {
            assert!(
                !h.contains_key(hop),
                "{method}: {hop} reached the upstream: {h:?}"
            );
        }
        assert!(
            h.get("connection")
                .is_none_or(|v| !v.to_str().unwrap().contains("X-Private-Hop"))
        );
        assert_eq!(h["x-kept"], "yes");
    }
}

per_backend!(
    missing_and_invalid_keys_are_400,
    optional_key_route_passes_keyless_requests_through,
    quoted_and_bare_forms_are_one_key,
    unprotected_methods_pass_through_untouched,
    key_and_forwarding_headers_reach_the_upstream,
    oversized_request_body_is_413,
    hop_by_hop_headers_never_reach_the_upstream,
);
