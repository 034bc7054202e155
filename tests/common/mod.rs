//! Test support: a fresh PostgreSQL database per test, a real upstream on
//! port 0 that counts what it receives, the real gateway on port 0 (in
//! process or as a child process), and a small HTTP client.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use deadpool_redis::redis;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sqlx::Connection;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub mod process;

/// The server tests create their databases on.
pub fn admin_url() -> String {
    std::env::var("IDEMGATE_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A throwaway database, dropped (forcibly) when this value is dropped.
pub struct TestDb {
    pub url: String,
    name: String,
}

impl TestDb {
    pub async fn new() -> Self {
        let name = unique("idemgate_test");
        let admin = admin_url();
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .unwrap_or_else(|e| {
                panic!("tests need PostgreSQL at {admin} ({e}); run .ci/run or start it")
            });
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .unwrap();
        let base = admin.rsplit_once('/').unwrap().0;
        Self {
            url: format!("{base}/{name}"),
            name,
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        let admin = admin_url();
        // Async drop is not a thing: a short-lived runtime on its own thread.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin).await {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        })
        .join();
    }
}

/// The Redis server tests use.
pub fn redis_url() -> String {
    std::env::var("IDEMGATE_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// A key prefix of its own for one test; its keys are deleted on drop.
pub struct RedisPrefix {
    pub prefix: String,
}

impl RedisPrefix {
    pub fn new() -> Self {
        Self {
            prefix: format!("{}:", unique("idemgate_test")),
        }
    }
}

impl Drop for RedisPrefix {
    fn drop(&mut self) {
        let pattern = format!("{}*", self.prefix);
        let _ = std::thread::spawn(move || {
            let client = redis::Client::open(redis_url()).ok()?;
            let mut conn = client.get_connection().ok()?;
            let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg(&pattern).query(&mut conn).ok()?;
            for chunk in keys.chunks(500) {
                let _: redis::RedisResult<()> = redis::cmd("DEL").arg(chunk).query(&mut conn);
            }
            Some(())
        })
        .join();
    }
}

/// A store backend for gateway-level tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Redis,
    Memory,
}

/// Fresh storage on one backend, cleaned up on drop.
pub struct TestStore {
    pub backend: Backend,
    pub url: String,
    prefix: String,
    _db: Option<TestDb>,
    _redis: Option<RedisPrefix>,
}

impl TestStore {
    pub async fn new(backend: Backend) -> Self {
        match backend {
            Backend::Postgres => {
                let db = TestDb::new().await;
                Self {
                    backend,
                    url: db.url.clone(),
                    prefix: String::new(),
                    _db: Some(db),
                    _redis: None,
                }
            }
            Backend::Redis => {
                let p = RedisPrefix::new();
                Self {
                    backend,
                    url: redis_url(),
                    prefix: p.prefix.clone(),
                    _db: None,
                    _redis: Some(p),
                }
            }
            Backend::Memory => Self {
                backend,
                url: "memory://".into(),
                prefix: String::new(),
                _db: None,
                _redis: None,
            },
        }
    }

    /// The Redis key prefix (empty for other backends).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The PostgreSQL URL, when the backend is PostgreSQL.
    pub fn pg_url(&self) -> Option<&str> {
        (self.backend == Backend::Postgres).then_some(self.url.as_str())
    }

    /// [`config_text`] for this store.
    pub fn config(&self, upstream: &str, extra: &str) -> String {
        config_text(&self.url, upstream, extra).replace(
            "timeout = \"1s\"\n",
            &format!("timeout = \"1s\"\nprefix = \"{}\"\n", self.prefix),
        )
    }
}

/// What the test upstream saw.
#[derive(Default)]
pub struct Seen {
    /// Requests per `Idempotency-Key` header value (raw, as received).
    pub per_key: HashMap<String, u64>,
    /// Every request's headers, in arrival order.
    pub headers: Vec<HeaderMap>,
    /// Total requests.
    pub total: u64,
}

/// A real HTTP upstream on port 0. Behaviour by path:
/// - `/status/{code}`: answers `{code}` with a JSON body;
/// - `/slow/{ms}`: waits, then 201;
/// - `/hang`: never answers;
/// - `/reset`: drops the connection without answering;
/// - `/binary`: 201 with a binary body, `Location` and `ETag`;
/// - `/big/{n}`: 200 with `n` bytes;
/// - anything else: 201 with a JSON body naming the request count, plus
///   `Location`, `ETag` and `Set-Cookie`.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Seen>>,
    stop: Option<oneshot::Sender<()>>,
}

pub const BINARY_BODY: &[u8] = &[0, 159, 146, 150, 255, 0, 1, 2, 13, 10, 0, 254];

impl Upstream {
    pub async fn start() -> Self {
        Self::start_on(TcpListener::bind("127.0.0.1:0").await.unwrap()).await
    }

    pub async fn start_on(listener: TcpListener) -> Self {
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (stop, mut stopped) = oneshot::channel::<()>();
        let state = seen.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                    _ = &mut stopped => return,
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| upstream_answer(req, state.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            seen,
            stop: Some(stop),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many requests carrying this exact key header value arrived.
    pub fn count(&self, key_header_value: &str) -> u64 {
        self.seen
            .lock()
            .unwrap()
            .per_key
            .get(key_header_value)
            .copied()
            .unwrap_or(0)
    }

    pub fn total(&self) -> u64 {
        self.seen.lock().unwrap().total
    }

    pub fn last_headers(&self) -> HeaderMap {
        self.seen
            .lock()
            .unwrap()
            .headers
            .last()
            .cloned()
            .unwrap_or_default()
    }

    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Debug)]
struct Reset;
impl std::fmt::Display for Reset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reset on purpose")
    }
}
impl std::error::Error for Reset {}

async fn upstream_answer(
    req: Request<Incoming>,
    seen: Arc<Mutex<Seen>>,
) -> Result<Response<Full<Bytes>>, Reset> {
    let n = {
        let mut s = seen.lock().unwrap();
        s.total += 1;
        s.headers.push(req.headers().clone());
        let key = req
            .headers()
            .get("idempotency-key")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        let n = s.per_key.entry(key).or_default();
        *n += 1;
        *n
    };
    let path = req.uri().path().to_string();
    let _ = req.into_body().collect().await;
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let json = |status: u16| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(format!(
                "{{\"n\":{n},\"path\":\"{path}\"}}"
            ))))
            .unwrap()
    };
    let find = |name: &str| {
        segments
            .iter()
            .position(|s| *s == name)
            .and_then(|i| segments.get(i + 1))
    };
    if let Some(code) = find("status") {
        return Ok(json(code.parse().unwrap()));
    }
    if let Some(ms) = find("slow") {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
        return Ok(json(201));
    }
    if segments.contains(&"hang") {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    if segments.contains(&"reset") {
        return Err(Reset);
    }
    if segments.contains(&"binary") {
        return Ok(Response::builder()
            .status(201)
            .header("content-type", "application/octet-stream")
            .header("location", "/v1/things/42")
            .header("etag", "\"v1-abc\"")
            .body(Full::new(Bytes::from_static(BINARY_BODY)))
            .unwrap());
    }
    if let Some(size) = find("big") {
        let size: usize = size.parse().unwrap();
        return Ok(Response::builder()
            .status(200)
            .body(Full::new(Bytes::from(vec![b'x'; size])))
            .unwrap());
    }
    let mut response = json(201);
    let headers = response.headers_mut();
    headers.insert("location", format!("/v1/things/{n}").parse().unwrap());
    headers.insert("etag", format!("\"e{n}\"").parse().unwrap());
    headers.insert("set-cookie", "session=abc; HttpOnly".parse().unwrap());
    Ok(response)
}

/// Config text for one gateway in front of `upstream` on `store_url`;
/// `extra` lines are appended to the route table (they override the
/// short `lease` and `upstream_timeout` set in `[defaults]`).
pub fn config_text(store_url: &str, upstream: &str, extra: &str) -> String {
    format!(
        r#"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
shutdown_timeout = "10s"

[store]
url = "{store_url}"
timeout = "1s"

[defaults]
lease = "3s"
upstream_timeout = "2s"

[[routes]]
name = "api"
match = "/v1/*"
upstream = "{upstream}"
{extra}
"#
    )
}

/// The real gateway, in this process, on port 0.
pub struct Gateway {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Gateway {
    pub async fn start(config_text: &str) -> Self {
        let config = idemgate::Config::parse(config_text).expect("test config is valid");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let store = idemgate::store::open(&config.store)
            .await
            .expect("store opens");
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(idemgate::run_with(
            listener,
            admin,
            config,
            store,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            addr,
            admin: admin_addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The status of `GET /readyz` on the admin listener.
    pub async fn readyz(&self) -> StatusCode {
        send(
            &client(),
            "GET",
            &format!("http://{}/readyz", self.admin),
            &[],
            "",
        )
        .await
        .status
    }

    /// The admin listener's `/metrics` text.
    pub async fn metrics(&self) -> String {
        let reply = send(
            &client(),
            "GET",
            &format!("http://{}/metrics", self.admin),
            &[],
            "",
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK);
        String::from_utf8(reply.body.to_vec()).unwrap()
    }

    /// Graceful shutdown; returns when the gateway has drained.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

/// An HTTP response, collected.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
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

/// Send one request; `headers` are (name, value) pairs.
pub async fn send(
    client: &HttpClient,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Reply {
    let mut builder = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let response = client
        .request(builder.body(Full::new(body.into())).unwrap())
        .await
        .expect("gateway answers");
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("body reads").to_bytes(),
    }
}

/// POST with an `Idempotency-Key`.
pub async fn post(client: &HttpClient, url: &str, key: &str, body: &str) -> Reply {
    send(
        client,
        "POST",
        url,
        &[
            ("idempotency-key", key),
            ("content-type", "application/json"),
        ],
        body.to_string(),
    )
    .await
}

/// The path of the built `idemgate` binary.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_idemgate"))
}

/// Poll `f` every 50 ms until it returns `Some`, for at most `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of one sample (`name{labels}`) in a metrics text; 0 if absent.
pub fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| {
            v.split_whitespace().next().unwrap().parse().unwrap()
        })
}

/// Read a record's state straight from the database.
pub async fn record_state(db_url: &str, key: &str) -> Option<String> {
    let mut conn = sqlx::PgConnection::connect(db_url).await.unwrap();
    sqlx::query_scalar("SELECT state FROM idemgate_records WHERE key = $1")
        .bind(key)
        .fetch_optional(&mut conn)
        .await
        .unwrap()
}
