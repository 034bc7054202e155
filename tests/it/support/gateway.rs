//! The real gateway in this process, on port 0 ([`Gateway`]), and the usual
//! arrangement of a test: a fresh store, the upstream, a gateway in front of
//! it and a client ([`Setup`]).

use std::net::SocketAddr;

use http::StatusCode;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::store::Backend;
use super::{HttpClient, TestConfig, TestStore, Upstream, client, send};

/// The real gateway, in this process; its listeners on port 0 whatever the
/// config says.
pub struct Gateway {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    /// The config file it was loaded from, which a reload reads again.
    file: tempfile::NamedTempFile,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), idemgate::RunError>>>,
}

impl Gateway {
    /// Start it with `config`, loaded from a file of its own (so
    /// `POST /config/reload` reads it again: [`Gateway::rewrite`]).
    pub async fn start(config: &TestConfig) -> Self {
        let file = tempfile::Builder::new()
            .prefix("idemgate-")
            .suffix(".toml")
            .tempfile()
            .unwrap();
        std::fs::write(file.path(), config.to_string()).unwrap();
        let config = idemgate::Config::load(file.path()).expect("test config is valid");
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
            file,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The status of `GET /readyz` on the admin listener.
    pub async fn readyz(&self) -> StatusCode {
        let url = format!("http://{}/readyz", self.admin);
        send(&client(), "GET", &url, &[], "").await.status
    }

    /// The admin listener's `/metrics` text.
    pub async fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.admin);
        let reply = send(&client(), "GET", &url, &[], "").await;
        assert_eq!(reply.status, StatusCode::OK);
        String::from_utf8(reply.body.to_vec()).unwrap()
    }

    /// Replace its config file's text (nothing is reloaded yet), at once:
    /// written aside, then renamed over it, so a watcher never reads half.
    pub fn rewrite(&self, text: &str) {
        let aside = self.file.path().with_extension("next");
        std::fs::write(&aside, text).unwrap();
        std::fs::rename(&aside, self.file.path()).unwrap();
    }

    /// `POST /config/reload` with `token` as the bearer token: the status
    /// and the JSON answer.
    pub async fn reload(&self, token: Option<&str>) -> (StatusCode, serde_json::Value) {
        let url = format!("http://{}/config/reload", self.admin);
        let bearer = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = bearer
            .as_deref()
            .map(|b| vec![("authorization", b)])
            .unwrap_or_default();
        let reply = send(&client(), "POST", &url, &headers, "").await;
        let body = serde_json::from_slice(&reply.body).unwrap_or(serde_json::Value::Null);
        (reply.status, body)
    }

    /// Graceful shutdown; returns when the gateway has drained.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().expect("the gateway ran");
        }
    }
}

/// A fresh store, the upstream, one gateway in front of it, a client.
pub struct Setup {
    pub store: TestStore,
    pub upstream: Upstream,
    /// The gateway's config (its listeners on port 0).
    pub config: TestConfig,
    pub gateway: Gateway,
    pub client: HttpClient,
}

impl Setup {
    /// With the config of [`TestStore::config`], unchanged.
    pub async fn start(backend: Backend) -> Self {
        Self::with(backend, |config| config).await
    }

    /// With the config of [`TestStore::config`], edited by `edit`.
    pub async fn with(backend: Backend, edit: impl FnOnce(TestConfig) -> TestConfig) -> Self {
        let store = TestStore::new(backend).await;
        let upstream = Upstream::start().await;
        let config = edit(store.config(&upstream.url()));
        let gateway = Gateway::start(&config).await;
        Setup {
            store,
            upstream,
            config,
            gateway,
            client: client(),
        }
    }
}
