//! The server's connection handling: h2c next to HTTP/1.1, the connection
//! cap, the header-read and idle deadlines, HTTP/1.1 keep-alive (parked
//! connections, pipelining, many requests on one connection), and graceful
//! shutdown of idle and busy connections.

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

/// Read until the gateway closes the connection (or resets it); `false` if
/// it is still open after `limit`.
async fn closed_within(tcp: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = Vec::new();
    matches!(
        tokio::time::timeout(limit, tcp.read_to_end(&mut buf)).await,
        Ok(Ok(_)) | Ok(Err(_))
    )
}

/// The HTTP/2 client preface and an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const H2_EMPTY_SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

#[tokio::test]
async fn partial_http2_prefaces_are_cut_off_at_the_first_head_deadline() {
    let (_db, upstream, gateway) = start(|t| {
        t.set("max_connections", 2).set("header_read_timeout", "1s");
    })
    .await;
    // One byte of the preface; the whole preface and SETTINGS, then nothing.
    let mut one_byte = TcpStream::connect(gateway.addr).await.unwrap();
    one_byte.write_all(b"P").await.unwrap();
    let mut settings = TcpStream::connect(gateway.addr).await.unwrap();
    settings.write_all(H2_PREFACE).await.unwrap();
    settings.write_all(H2_EMPTY_SETTINGS).await.unwrap();
    assert!(
        closed_within(&mut one_byte, Duration::from_secs(10)).await,
        "half a preface held the connection open"
    );
    assert!(
        closed_within(&mut settings, Duration::from_secs(10)).await,
        "a preface and SETTINGS without a request held the connection open"
    );
    // Both slots are free again.
    let mut next = TcpStream::connect(gateway.addr).await.unwrap();
    next.write_all(b"GET /v1/payments HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    assert!(read_answer(&mut next).await.starts_with("HTTP/1.1 201"));
    assert_eq!(upstream.total(), 1);
}

#[tokio::test]
async fn idle_connections_are_closed_http1_and_http2() {
    // A long head deadline, so that only the idle deadline can close them.
    let (_db, _upstream, gateway) = start(|t| {
        t.set("idle_timeout", "1s")
            .set("header_read_timeout", "30s");
    })
    .await;
    // HTTP/1.1 keep-alive, idle after one answer.
    let mut h1 = TcpStream::connect(gateway.addr).await.unwrap();
    h1.write_all(b"GET /v1/payments HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    assert!(read_answer(&mut h1).await.starts_with("HTTP/1.1 201"));
    assert!(
        closed_within(&mut h1, Duration::from_secs(10)).await,
        "an idle HTTP/1.1 connection stayed open"
    );
    // HTTP/2: the connection's driver ends once the gateway says GOAWAY and closes.
    let tcp = TcpStream::connect(gateway.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    let driver = tokio::spawn(connection);
    let request = Request::get(gateway.url("/v1/payments"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let ended = tokio::time::timeout(Duration::from_secs(10), driver).await;
    assert!(ended.is_ok(), "an idle HTTP/2 connection stayed open");
}

#[tokio::test]
async fn a_protected_body_that_never_finishes_is_timed_out() {
    let (_db, upstream, gateway) = start(|t| {
        t.set("body_read_timeout", "1s");
    })
    .await;
    let mut tcp = TcpStream::connect(gateway.addr).await.unwrap();
    tcp.write_all(
        b"POST /v1/payments HTTP/1.1\r\nHost: t\r\nIdempotency-Key: slow-body\r\n\
          Content-Length: 100\r\n\r\n{\"amount\":",
    )
    .await
    .unwrap();
    let answer = read_answer(&mut tcp).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body-timeout"), "{answer}");
    assert_eq!(upstream.total(), 0, "nothing was forwarded");
}

/// The gateway has answered (or closed) `tcp` within 100 ms.
async fn answered(tcp: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    tokio::time::timeout(Duration::from_millis(100), tcp.peek(&mut byte))
        .await
        .is_ok()
}

/// A keyed POST that declares `len` body bytes and sends `sent` of them
/// (a JSON string, unfinished).
async fn unfinished_post(gateway: &Gateway, key: &str, len: usize, sent: usize) -> TcpStream {
    let mut tcp = TcpStream::connect(gateway.addr).await.unwrap();
    let head = format!(
        "POST /v1/payments HTTP/1.1\r\nHost: t\r\nIdempotency-Key: {key}\r\n\
         Content-Length: {len}\r\n\r\n\"{}",
        "x".repeat(sent - 1)
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp
}

#[tokio::test]
async fn buffered_bodies_beyond_the_budget_get_503_at_once() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&db.url, &upstream.url())
        .top(|t| {
            t.set("max_buffered_request_bytes", "2KiB");
        })
        .route(|r| {
            r.set("max_request_body", "1KiB");
        });
    let gateway = Gateway::start(&config).await;
    let c = crate::support::client();
    let url = gateway.url("/v1/payments");
    let body = format!("\"{}\"", "x".repeat(998));
    // Declaring a large body costs nothing: only bytes that arrived are paid.
    let _declared_a = unfinished_post(&gateway, "declared-a", 1000, 1).await;
    let _declared_b = unfinished_post(&gateway, "declared-b", 1000, 1).await;
    // Let the gateway read both heads (were it to reserve declared lengths,
    // 2000 of the 2048 bytes would now be gone). A slow machine can only
    // make this check pass for the wrong reason, never fail.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fits = crate::support::post(&c, &url, "declared-fits", &body).await;
    assert_eq!(fits.status, StatusCode::CREATED, "{fits:?}");
    // Two unfinished bodies that sent 999 bytes each hold 1998 of the 2048.
    let mut first = unfinished_post(&gateway, "budget-1", 1000, 999).await;
    let mut second = unfinished_post(&gateway, "budget-2", 1000, 999).await;
    // A new key per try. A try whose body the gateway read before an
    // unfinished one's bytes is simply forwarded, and that unfinished body
    // is the one refused (connections are served on several threads, so
    // the order is not the order they were opened in): it is opened again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut tries = 0;
    let (key, over) = loop {
        tries += 1;
        let key = format!("budget-3-{tries}");
        let reply = crate::support::post(&c, &url, &key, &body).await;
        if reply.status == StatusCode::SERVICE_UNAVAILABLE {
            break (key, reply);
        }
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        for (n, unfinished) in [&mut first, &mut second].into_iter().enumerate() {
            if answered(unfinished).await {
                *unfinished =
                    unfinished_post(&gateway, &format!("budget-{n}-{tries}"), 1000, 999).await;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a third body beyond the budget is refused"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(over.problem_type(), "urn:idemgate:problem:overloaded");
    assert!(over.header("retry-after").is_some());
    assert_eq!(upstream.count(&key), 0);
    // A small body still fits in what is left.
    let small = crate::support::post(&c, &url, "budget-small", "{}").await;
    assert_eq!(small.status, StatusCode::CREATED);
    // The first finishes: its bytes are paid back, and the third fits.
    first.write_all(b"\"").await.unwrap();
    assert!(read_answer(&mut first).await.starts_with("HTTP/1.1 201"));
    let later = crate::support::post(&c, &url, &key, &body).await;
    assert_eq!(later.status, StatusCode::CREATED, "{later:?}");
    assert!(!later.is_replay(), "the refused attempt was never claimed");
}

#[tokio::test]
async fn forwards_beyond_the_budget_get_503_and_are_not_claimed() {
    let (_db, upstream, gateway) = start(|t| {
        t.set("max_forwards_in_flight", 1);
    })
    .await;
    let c = crate::support::client();
    let slow = tokio::spawn({
        let (c, url) = (c.clone(), gateway.url("/v1/slow/1500"));
        async move { crate::support::post(&c, &url, "slot-1", "{}").await }
    });
    crate::support::eventually(Duration::from_secs(10), || async {
        (upstream.count("slot-1") == 1).then_some(())
    })
    .await
    .expect("the first forward reached the upstream");
    let url = gateway.url("/v1/payments");
    let refused = crate::support::post(&c, &url, "slot-2", "{}").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.problem_type(), "urn:idemgate:problem:overloaded");
    assert_eq!(slow.await.unwrap().status, StatusCode::CREATED);
    // Not claimed: the same key is forwarded now, not answered 409.
    let later = crate::support::post(&c, &url, "slot-2", "{}").await;
    assert_eq!(later.status, StatusCode::CREATED, "{later:?}");
    assert!(!later.is_replay());
    assert_eq!(upstream.count("slot-2"), 1);
}

#[tokio::test]
async fn the_admin_listener_has_a_cap_and_deadlines() {
    let (_db, _upstream, gateway) = start(|t| {
        t.set("admin_max_connections", 1)
            .set("header_read_timeout", "3s");
    })
    .await;
    // A silent connection takes the only slot until its deadline.
    let mut silent = TcpStream::connect(gateway.admin).await.unwrap();
    let mut probe = TcpStream::connect(gateway.admin).await.unwrap();
    probe
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(500), probe.read(&mut buf)).await;
    assert!(early.is_err(), "served past admin_max_connections");
    assert!(
        read_answer(&mut probe).await.starts_with("HTTP/1.1 200"),
        "served once the silent connection was cut off"
    );
    assert!(closed_within(&mut silent, Duration::from_secs(10)).await);
}

/// One HTTP/1.1 response as read from a raw connection: its head, as text,
/// and its body.
struct RawResponse {
    head: String,
    body: String,
}

impl RawResponse {
    fn status(&self) -> &str {
        self.head.split(' ').nth(1).unwrap_or_default()
    }

    /// Whether the head says `connection: close`.
    fn closes(&self) -> bool {
        self.head
            .to_ascii_lowercase()
            .lines()
            .any(|line| line.starts_with("connection:") && line.contains("close"))
    }
}

/// A raw HTTP/1.1 connection to the gateway: bytes go out as written, and
/// responses (each with a `content-length`) are read one at a time.
struct Raw {
    tcp: TcpStream,
    /// Read past the last response.
    pending: Vec<u8>,
}

impl Raw {
    async fn connect(gateway: &Gateway) -> Self {
        Self {
            tcp: TcpStream::connect(gateway.addr).await.unwrap(),
            pending: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.tcp.write_all(bytes).await.unwrap();
    }

    /// `GET path` and its response.
    async fn get(&mut self, path: &str) -> RawResponse {
        let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n");
        self.send(request.as_bytes()).await;
        self.response().await
    }

    /// The next response.
    async fn response(&mut self) -> RawResponse {
        let pending = &mut self.pending;
        loop {
            if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&pending[..end]).into_owned();
                let length: usize = head
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().unwrap())
                    })
                    .unwrap_or_else(|| panic!("no content-length: {head}"));
                let whole = end + 4 + length;
                if pending.len() >= whole {
                    let body = String::from_utf8_lossy(&pending[end + 4..whole]).into_owned();
                    pending.drain(..whole);
                    return RawResponse { head, body };
                }
            }
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(10), self.tcp.read(&mut buf))
                .await
                .expect("an answer")
                .unwrap();
            assert!(
                n > 0,
                "closed before a whole response: {:?}",
                String::from_utf8_lossy(pending)
            );
            pending.extend_from_slice(&buf[..n]);
        }
    }

    async fn closed_within(&mut self, limit: Duration) -> bool {
        closed_within(&mut self.tcp, limit).await
    }
}

#[tokio::test]
async fn idle_http1_connections_outlive_the_head_deadline_until_idle_timeout() {
    let (_db, upstream, gateway) = start(|t| {
        t.set("header_read_timeout", "300ms")
            .set("idle_timeout", "3s");
    })
    .await;
    let mut raw = Raw::connect(&gateway).await;
    for round in 0..3 {
        if round > 0 {
            // Idle well past header_read_timeout, well within idle_timeout.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let answer = raw.get("/v1/payments").await;
        assert_eq!(answer.status(), "201", "round {round}: {}", answer.head);
        assert!(!answer.closes(), "round {round}: {}", answer.head);
    }
    assert!(
        raw.closed_within(Duration::from_secs(15)).await,
        "an idle HTTP/1.1 connection outlived idle_timeout"
    );
    assert_eq!(upstream.total(), 3);
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let (_db, upstream, gateway) = start(|_| {}).await;
    let mut raw = Raw::connect(&gateway).await;
    let names = ["first", "second", "third"];
    let requests: String = names
        .iter()
        .map(|name| format!("GET /v1/payments/{name} HTTP/1.1\r\nHost: t\r\n\r\n"))
        .collect();
    raw.send(requests.as_bytes()).await;
    for name in names {
        let answer = raw.response().await;
        assert_eq!(answer.status(), "201", "{}", answer.head);
        assert!(
            answer.body.contains(&format!("/v1/payments/{name}")),
            "{}",
            answer.body
        );
        assert!(!answer.closes(), "{name}: {}", answer.head);
    }
    // Still open for more.
    let after = raw.get("/v1/payments/fourth").await;
    assert!(after.body.contains("/v1/payments/fourth"), "{}", after.body);
    assert_eq!(upstream.total(), 4);
}

#[tokio::test]
async fn many_requests_share_one_keep_alive_connection() {
    let (_db, upstream, gateway) = start(|_| {}).await;
    let mut raw = Raw::connect(&gateway).await;
    for i in 0..40 {
        // Requests with and without bodies, protected and passed through.
        let answer = if i % 2 == 0 {
            raw.get(&format!("/v1/payments/{i}")).await
        } else {
            let body = format!("{{\"n\":{i}}}");
            let request = format!(
                "POST /v1/payments HTTP/1.1\r\nHost: t\r\nIdempotency-Key: seq-{i}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            raw.send(request.as_bytes()).await;
            raw.response().await
        };
        assert_eq!(answer.status(), "201", "request {i}: {}", answer.head);
        assert!(!answer.closes(), "request {i}: {}", answer.head);
    }
    assert_eq!(upstream.total(), 40);
    assert_eq!(upstream.count("seq-39"), 1);
}

#[tokio::test]
async fn a_partial_head_after_an_idle_spell_is_cut_at_the_head_deadline() {
    let (_db, upstream, gateway) = start(|t| {
        t.set("header_read_timeout", "1s")
            .set("idle_timeout", "30s");
    })
    .await;
    let mut raw = Raw::connect(&gateway).await;
    assert_eq!(raw.get("/v1/payments").await.status(), "201");
    // Idle longer than header_read_timeout, then half a head.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    raw.send(b"GET /v1/payments HTTP/1.1\r\nHost: t\r\n").await;
    assert!(
        raw.closed_within(Duration::from_secs(10)).await,
        "half a head held the connection open until idle_timeout"
    );
    assert_eq!(upstream.total(), 1);
}

#[tokio::test]
async fn a_head_begun_before_the_connection_is_parked_is_finished_after() {
    // Parked after 1 s without a request in progress (half of 2 s).
    let (_db, upstream, gateway) = start(|t| {
        t.set("header_read_timeout", "2s")
            .set("idle_timeout", "30s");
    })
    .await;
    let mut raw = Raw::connect(&gateway).await;
    assert_eq!(raw.get("/v1/payments/one").await.status(), "201");
    // Half a head while the hyper connection is still in place, the rest
    // after it was parked (its bytes are handed to the next one).
    tokio::time::sleep(Duration::from_millis(300)).await;
    raw.send(b"GET /v1/payments/two HTTP/1.1\r\n").await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    raw.send(b"Host: t\r\n\r\n").await;
    let answer = raw.response().await;
    assert_eq!(answer.status(), "201", "{}", answer.head);
    assert!(answer.body.contains("/v1/payments/two"), "{}", answer.body);
    assert!(!answer.closes(), "{}", answer.head);
    // And a third after a longer idle spell.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(raw.get("/v1/payments/three").await.status(), "201");
    assert_eq!(upstream.total(), 3);
}

/// A gateway whose route takes request bodies up to 1 KiB.
async fn start_with_bodies_up_to_1kib() -> (TestDb, Upstream, Gateway) {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&db.url, &upstream.url()).route(|r| {
        r.set("max_request_body", "1KiB");
    });
    let gateway = Gateway::start(&config).await;
    (db, upstream, gateway)
}

#[tokio::test]
async fn a_body_left_unread_is_never_taken_for_the_next_request() {
    let (_db, upstream, gateway) = start_with_bodies_up_to_1kib().await;
    let mut raw = Raw::connect(&gateway).await;
    // Refused on its declared length; what it sent of its body looks like
    // a request of its own.
    raw.send(
        b"POST /v1/payments HTTP/1.1\r\nHost: t\r\nIdempotency-Key: too-big\r\n\
          Content-Length: 5000\r\n\r\nGET /v1/payments/smuggled HTTP/1.1\r\nHost: t\r\n\r\n",
    )
    .await;
    let answer = raw.response().await;
    assert_eq!(answer.status(), "413", "{}", answer.head);
    assert!(raw.closed_within(Duration::from_secs(10)).await);
    assert_eq!(
        upstream.total(),
        0,
        "part of a body was served as a request"
    );
}

#[tokio::test]
async fn a_small_body_left_unread_is_read_and_the_connection_kept() {
    let (_db, upstream, gateway) = start_with_bodies_up_to_1kib().await;
    let mut raw = Raw::connect(&gateway).await;
    // Refused on its declared length before its body is read; the body is
    // all there, so it is read past and the connection serves the next.
    let body = format!("\"{}\"", "x".repeat(1998));
    let request = format!(
        "POST /v1/payments HTTP/1.1\r\nHost: t\r\nIdempotency-Key: big\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    raw.send(request.as_bytes()).await;
    let refused = raw.response().await;
    assert_eq!(refused.status(), "413", "{}", refused.head);
    assert!(!refused.closes(), "{}", refused.head);
    let next = raw.get("/v1/payments/next").await;
    assert_eq!(next.status(), "201", "{}", next.head);
    assert_eq!(upstream.total(), 1);
}

#[tokio::test]
async fn http1_0_without_keep_alive_is_closed_after_its_answer() {
    let (_db, _upstream, gateway) = start(|_| {}).await;
    let mut raw = Raw::connect(&gateway).await;
    raw.send(b"GET /v1/payments HTTP/1.0\r\nHost: t\r\n\r\n")
        .await;
    let answer = raw.response().await;
    assert!(answer.head.starts_with("HTTP/1.0 201"), "{}", answer.head);
    assert!(raw.closed_within(Duration::from_secs(10)).await);
}

#[tokio::test]
async fn shutdown_closes_idle_connections_and_finishes_requests_in_flight() {
    let (_db, upstream, gateway) = start(|_| {}).await;
    let mut idle = Raw::connect(&gateway).await;
    assert_eq!(idle.get("/v1/payments").await.status(), "201");
    let mut busy = Raw::connect(&gateway).await;
    busy.send(b"GET /v1/payments/slow/1500 HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    crate::support::eventually(Duration::from_secs(10), || async {
        (upstream.total() == 2).then_some(())
    })
    .await
    .expect("the slow request reached the upstream");
    let shutdown = tokio::spawn(gateway.shutdown());
    let busy = tokio::spawn(async move {
        let answer = busy.response().await;
        (answer, busy.closed_within(Duration::from_secs(10)).await)
    });
    // The idle connection closes at once, before the slow answer.
    assert!(idle.closed_within(Duration::from_secs(10)).await);
    assert!(
        !busy.is_finished(),
        "the idle connection closed only after the slow answer"
    );
    let (answer, closed) = busy.await.unwrap();
    assert_eq!(answer.status(), "201", "{}", answer.head);
    assert!(answer.closes(), "{}", answer.head);
    assert!(closed, "the busy connection closed after its answer");
    shutdown.await.unwrap();
}

#[tokio::test]
async fn an_http2_preface_in_pieces_is_recognised() {
    let (_db, _upstream, gateway) = start(|_| {}).await;
    let mut tcp = TcpStream::connect(gateway.addr).await.unwrap();
    tcp.write_all(&H2_PREFACE[..5]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tcp.write_all(&H2_PREFACE[5..]).await.unwrap();
    tcp.write_all(H2_EMPTY_SETTINGS).await.unwrap();
    // The server's first frame: its SETTINGS (type 4).
    let mut frame_head = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(10), tcp.read_exact(&mut frame_head))
        .await
        .expect("an answer")
        .unwrap();
    assert_eq!(frame_head[3], 4, "not a SETTINGS frame: {frame_head:?}");
}
