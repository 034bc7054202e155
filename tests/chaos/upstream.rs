//! The chaos upstream: a real HTTP server on port 0 that performs an
//! "operation" for every request it receives and remembers each execution
//! (key, the client operation that caused it, body hash, the exact response
//! it sent). The checker compares what clients saw against this ledger.
//!
//! Every execution answers `201` with a body naming its own execution
//! number, so two executions of one key can never produce the same bytes: a
//! replay of the wrong execution, or a second execution, is visible.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::history::{OP_HEADER, digest, response_digest};

/// Header by which a client asks the upstream to take this long (ms).
pub const DELAY_HEADER: &str = "x-chaos-delay-ms";

/// One execution of an operation by the upstream.
#[derive(Debug, Clone)]
pub struct Execution {
    /// Its number, unique over the whole run.
    pub number: u64,
    /// The client operation (history id) whose request arrived.
    pub op: u64,
    /// The `Idempotency-Key` value, as received.
    pub key: String,
    /// Digest of the request body.
    pub body: String,
    /// Digest of status and body sent back ([`response_digest`]).
    pub response: String,
}

/// A running chaos upstream.
pub struct ChaosUpstream {
    pub addr: SocketAddr,
    ledger: Arc<Mutex<Vec<Execution>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ChaosUpstream {
    /// Listen on a free port.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ledger = Arc::new(Mutex::new(Vec::new()));
        let state = ledger.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| execute(req, state.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, ledger, task }
    }

    /// Every execution so far.
    pub fn executions(&self) -> Vec<Execution> {
        self.ledger.lock().unwrap().clone()
    }

    /// Executions per key.
    pub fn per_key(&self) -> HashMap<String, Vec<Execution>> {
        let mut map: HashMap<String, Vec<Execution>> = HashMap::new();
        for execution in self.executions() {
            map.entry(execution.key.clone())
                .or_default()
                .push(execution);
        }
        map
    }
}

impl Drop for ChaosUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn execute(
    req: Request<Incoming>,
    ledger: Arc<Mutex<Vec<Execution>>>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let key = header("idempotency-key");
    let op: u64 = header(OP_HEADER).parse().unwrap_or(u64::MAX);
    let delay: u64 = header(DELAY_HEADER).parse().unwrap_or(0);
    // The operation happens when the whole request has arrived.
    let body = req.into_body().collect().await?.to_bytes();
    let body_digest = digest(&body);
    let number = {
        let mut ledger = ledger.lock().unwrap();
        let number = ledger.len() as u64 + 1;
        let status = StatusCode::CREATED;
        let response = answer_body(number, &key, &body_digest);
        ledger.push(Execution {
            number,
            op,
            key: key.clone(),
            body: body_digest.clone(),
            response: response_digest(status.as_u16(), response.as_bytes()),
        });
        number
    };
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    Ok(Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .header("location", format!("/things/{number}"))
        .body(Full::new(Bytes::from(answer_body(
            number,
            &key,
            &body_digest,
        ))))
        .unwrap())
}

fn answer_body(number: u64, key: &str, body_digest: &str) -> String {
    format!(r#"{{"execution":{number},"key":{key:?},"request":"{body_digest}"}}"#)
}
