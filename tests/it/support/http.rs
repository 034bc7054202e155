//! A small HTTP client for the tests: send a request, collect the answer
//! into a [`Reply`].

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// An HTTP response, collected.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    pub fn is_replay(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// The problem `type` of a problem+json answer.
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        self.json()["type"].as_str().unwrap_or_default().to_string()
    }
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// Send one request; `headers` are (name, value) pairs. An error instead of
/// a panic when nothing answers (the gateway was killed).
pub async fn try_send(
    client: &HttpClient,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Result<Reply, String> {
    let mut builder = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let response = client
        .request(builder.body(Full::new(body.into())).unwrap())
        .await
        .map_err(|e| format!("no answer: {e}"))?;
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|e| format!("the body did not arrive: {e}"))?
        .to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// Send one request; `headers` are (name, value) pairs.
pub async fn send(
    client: &HttpClient,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Reply {
    try_send(client, method, url, headers, body)
        .await
        .unwrap_or_else(|e| panic!("the gateway answers {method} {url}: {e}"))
}

/// The headers of a POST with an `Idempotency-Key`.
fn keyed(key: &str) -> [(&str, &str); 2] {
    [
        ("idempotency-key", key),
        ("content-type", "application/json"),
    ]
}

/// POST with an `Idempotency-Key`.
pub async fn post(client: &HttpClient, url: &str, key: &str, body: &str) -> Reply {
    send(client, "POST", url, &keyed(key), body.to_string()).await
}

/// [`post`], but an error instead of a panic when nothing answers.
pub async fn try_post(
    client: &HttpClient,
    url: &str,
    key: &str,
    body: &str,
) -> Result<Reply, String> {
    try_send(client, "POST", url, &keyed(key), body.to_string()).await
}

/// GET `url`; the status, or `None` if nothing answered within 5 s.
pub async fn get_status(http: &HttpClient, url: &str) -> Option<StatusCode> {
    let request = Request::get(url).body(Full::new(Bytes::new())).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), http.request(request))
        .await
        .ok()?
        .ok()?;
    Some(response.status())
}

/// A keyed POST that the upstream holds for `delay_ms` before answering,
/// sent in a task of its own (the first attempt of a key, still in flight
/// while a test sends its duplicates).
pub fn spawn_slow_post(
    client: &HttpClient,
    url: &str,
    key: &'static str,
    delay_ms: &'static str,
) -> tokio::task::JoinHandle<Reply> {
    let (client, url) = (client.clone(), url.to_string());
    tokio::spawn(async move {
        let headers = [
            ("idempotency-key", key),
            (super::upstream::DELAY_HEADER, delay_ms),
        ];
        send(&client, "POST", &url, &headers, "{}").await
    })
}

/// A keyed `POST /v1/payments` (`{}`), sent whole on a raw connection to
/// `addr` and never read: the caller drops the connection to play a
/// client that leaves while its request is being worked on.
pub async fn post_and_walk_away(addr: std::net::SocketAddr, key: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        format!(
            "POST /v1/payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {key}\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    conn
}
