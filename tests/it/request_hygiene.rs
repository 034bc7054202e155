//! What a request must look like, and what of it reaches the upstream:
//! keys that are lists are refused, `Connection` cannot strip the key or
//! scope header, a chunked body reaches the upstream whatever the method,
//! and an HTTP/2 request with a connection-specific header is malformed
//! (the h2 layer resets its stream; it never reaches the upstream).

use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::upstream::digest;
use crate::support::{Backend, Set, Setup, send};

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
