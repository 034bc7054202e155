//! The server's connection handling: h2c next to HTTP/1.1, the connection
//! cap, and the header-read timeout.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use toml::Table;

use crate::support::{Gateway, Set, TestConfig, TestDb, Upstream};

/// A gateway on a fresh database, its top level edited by `top`.
async fn start(top: impl FnOnce(&mut Table)) -> (TestDb, Upstream, Gateway) {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&TestConfig::new(&db.url, &upstream.url()).top(top)).await;
    (db, upstream, gateway)
}

#[tokio::test]
async fn h2c_prior_knowledge_gets_the_same_pipeline() {
    let (_db, upstream, gateway) = start(|_| {}).await;
    let h2: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(HttpConnector::new());
    let mut replies = Vec::new();
    for _ in 0..2 {
        let request = Request::post(gateway.url("/v1/payments"))
            .header("idempotency-key", "h2-key")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let response = h2.request(request).await.unwrap();
        assert_eq!(response.version(), http::Version::HTTP_2);
        let replayed = response.headers().contains_key("idempotent-replayed");
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        replies.push((status, replayed, body));
    }
    assert_eq!(replies[0].0, StatusCode::CREATED);
    assert!(!replies[0].1 && replies[1].1, "second answer is a replay");
    assert_eq!(replies[0].2, replies[1].2);
    assert_eq!(upstream.count("h2-key"), 1);
}

async fn read_answer(tcp: &mut TcpStream) -> String {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
        .await
        .expect("an answer")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_free_slot() {
    let (_db, _upstream, gateway) = start(|t| {
        t.set("max_connections", 1);
    })
    .await;
    let get = b"GET /v1/payments HTTP/1.1\r\nHost: t\r\n\r\n";
    let mut first = TcpStream::connect(gateway.addr).await.unwrap();
    first.write_all(get).await.unwrap();
    assert!(read_answer(&mut first).await.starts_with("HTTP/1.1 201"));
    // The first connection stays open (keep-alive) and holds the only slot.
    let mut second = TcpStream::connect(gateway.addr).await.unwrap();
    second.write_all(get).await.unwrap();
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(500), second.read(&mut buf)).await;
    assert!(
        early.is_err(),
        "the second connection was served while the cap was reached"
    );
    drop(first);
    assert!(read_answer(&mut second).await.starts_with("HTTP/1.1 201"));
}

#[tokio::test]
async fn slow_headers_are_cut_off() {
    let (_db, upstream, gateway) = start(|t| {
        t.set("header_read_timeout", "1s");
    })
    .await;
    let mut tcp = TcpStream::connect(gateway.addr).await.unwrap();
    tcp.write_all(b"POST /v1/payments HTTP/1.1\r\nHost: t\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(8), tcp.read_to_end(&mut buf)).await;
    assert!(closed.is_ok(), "the gateway closed the connection");
    assert_eq!(upstream.total(), 0);
}

#[tokio::test]
async fn silent_connections_do_not_hold_slots() {
    let (_db, _upstream, gateway) = start(|t| {
        t.set("max_connections", 1).set("header_read_timeout", "1s");
    })
    .await;
    // Connects and never sends a byte (no protocol preface at all).
    let mut silent = TcpStream::connect(gateway.addr).await.unwrap();
    let mut second = TcpStream::connect(gateway.addr).await.unwrap();
    second
        .write_all(b"GET /v1/payments HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    assert!(
        read_answer(&mut second).await.starts_with("HTTP/1.1 201"),
        "served once the silent one was cut off"
    );
    let mut buf = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the silent connection was closed"
    );
}
