//! A tiny "payments API" to put behind idemgate in the README walkthrough.
//!
//! It knows nothing about idempotency: every `POST /v1/payments` (or
//! `/v1/transfers`) creates a new payment (`pay_1`, `pay_2`, …) and answers
//! `201` with its JSON and a `Location` header, echoing the request's
//! `amount` when the body is JSON. `GET /v1/payments/{id}` returns a payment
//! or `404`.
//!
//! `GET /v1/idempotency/{key}` is the status inquiry's lookup
//! (docs/src/guide/status-inquiry.md), and keeps its contract: a key is the
//! `Idempotency-Key` header's value (`"t-1"` is the key `t-1`, RFC 8941);
//! `201` with the payment a key created, or `404` if the key never created
//! one, and then every request for the key whose `Idempotency-Attempt` is
//! at most the question's is refused (`409`, nothing created). With
//! `--ledger FILE` it keeps that contract across a crash: each payment is
//! appended to the file with its key *before* it is answered, and the file
//! is read back at start. A `?delay_ms=N` query
//! parameter (at most 60000) makes the answer wait, so a duplicate can arrive
//! while the first request is still in flight. `POST /v1/events` is a
//! webhook receiver: it processes every delivery it gets (`200`, with the
//! count of events processed so far).
//!
//! Every request prints one line to stdout with the `Idempotency-Key` it
//! carried, so you can watch the upstream being hit exactly once per key.
//!
//! ```text
//! cargo run --release --bin demo_upstream                       # 127.0.0.1:9000
//! cargo run --release --bin demo_upstream -- --listen 127.0.0.1:9100 --ledger demo-ledger.jsonl
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, LOCATION};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// A demo upstream API that creates payments (and is not idempotent).
#[derive(Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// Keep payments in this file (JSON lines: key and payment), read at
    /// start; without it they live in memory only.
    #[arg(long)]
    ledger: Option<PathBuf>,
}

#[derive(Default)]
struct Payments {
    next_id: u64,
    events: u64,
    by_id: HashMap<String, Value>,
    /// The payment each `Idempotency-Key` created.
    by_key: HashMap<String, Value>,
    /// Per key the lookup answered `404` about: the question's
    /// `Idempotency-Attempt`; attempts up to it are refused.
    fenced: HashMap<String, u64>,
    ledger: Option<File>,
}

impl Payments {
    /// The ledger at `path`, read back: payments, and the keys that made them.
    fn open(path: &Path) -> std::io::Result<Self> {
        let mut payments = Payments::default();
        if let Ok(text) = std::fs::read_to_string(path) {
            for line in text.lines() {
                let Ok(entry) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                match entry["fence"].as_str() {
                    Some(key) => payments.fence(key, entry["attempt"].as_u64().unwrap_or(0)),
                    None => payments.remember(entry["key"].as_str(), entry["payment"].clone()),
                }
            }
        }
        payments.ledger = Some(OpenOptions::new().create(true).append(true).open(path)?);
        Ok(payments)
    }

    fn remember(&mut self, key: Option<&str>, payment: Value) {
        self.next_id += 1;
        if let Some(id) = payment["id"].as_str() {
            self.by_id.insert(id.to_string(), payment.clone());
        }
        if let Some(key) = key {
            self.by_key.insert(key.to_string(), payment);
        }
    }

    /// Refuse attempts of `key` up to `attempt` from now on.
    fn fence(&mut self, key: &str, attempt: u64) {
        let fenced = self.fenced.entry(key.to_string()).or_default();
        *fenced = (*fenced).max(attempt);
    }

    /// [`Self::fence`], written to the ledger before the lookup answers.
    fn fence_durably(&mut self, key: &str, attempt: u64) {
        if let Some(ledger) = &mut self.ledger {
            let line = json!({"fence": key, "attempt": attempt});
            if let Err(e) = writeln!(ledger, "{line}").and_then(|()| ledger.sync_data()) {
                eprintln!("cannot write the ledger: {e}");
            }
        }
        self.fence(key, attempt);
    }

    /// Create a payment for `amount`, written to the ledger with `key`
    /// before anyone is told.
    fn create(&mut self, key: Option<&str>, amount: Value) -> Value {
        let payment = json!({"id": format!("pay_{}", self.next_id + 1), "amount": amount, "status": "succeeded"});
        if let Some(ledger) = &mut self.ledger {
            let line = json!({"key": key, "payment": payment});
            // A demo: a failed write is reported, not fatal.
            if let Err(e) = writeln!(ledger, "{line}").and_then(|()| ledger.sync_data()) {
                eprintln!("cannot write the ledger: {e}");
            }
        }
        self.remember(key, payment.clone());
        payment
    }
}

type State = Arc<Mutex<Payments>>;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let payments = match &args.ledger {
        Some(path) => Payments::open(path)?,
        None => Payments::default(),
    };
    let state: State = Arc::new(Mutex::new(payments));
    let listen = listener.local_addr()?;
    match &args.ledger {
        Some(path) => println!(
            "demo upstream listening on http://{listen} (ledger {})",
            path.display()
        ),
        None => println!("demo upstream listening on http://{listen}"),
    }
    loop {
        let (stream, _) = listener.accept().await?;
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, state.clone()));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(req: Request<Incoming>, state: State) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    // The key's value, as the IETF draft defines the header (an RFC 8941
    // string, quoted or bare): what the lookup is asked about.
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| idemgate::request::key::parse(v).ok())
        .unwrap_or_else(|| "-".to_string());
    let attempt: u64 = req
        .headers()
        .get("idempotency-attempt")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let delay_ms = req
        .uri()
        .query()
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("delay_ms="))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        .min(60_000);
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();

    let under = |base: &str| path == base || path.starts_with(&format!("{base}/"));
    let under_payments = under("/v1/payments") || under("/v1/transfers");
    let (status, payload, location, note) = match method {
        Method::POST if under_payments => pay(&state, &key, attempt, &body),
        Method::POST if path == "/v1/events" => {
            let events = {
                let mut state = state.lock().expect("lock");
                state.events += 1;
                state.events
            };
            (
                StatusCode::OK,
                json!({"processed": events}),
                None,
                format!("processed event #{events}"),
            )
        }
        Method::GET if path.starts_with("/v1/idempotency/") => lookup(&state, &path, attempt),
        Method::GET if path.starts_with("/v1/payments/") => {
            let id = &path["/v1/payments/".len()..];
            match state.lock().expect("lock").by_id.get(id) {
                Some(p) => (StatusCode::OK, p.clone(), None, format!("found {id}")),
                None => (
                    StatusCode::NOT_FOUND,
                    json!({"error": "no such payment"}),
                    None,
                    format!("no {id}"),
                ),
            }
        }
        _ => (
            StatusCode::NOT_FOUND,
            json!({"error": "not found"}),
            None,
            "not found".to_string(),
        ),
    };
    let wait = if delay_ms > 0 {
        format!(" (answering in {delay_ms} ms)")
    } else {
        String::new()
    };
    println!(
        "upstream: {method} {path}  Idempotency-Key: {key}  -> {} {note}{wait}",
        status.as_u16()
    );
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;

    let mut response = Response::new(Full::new(Bytes::from(format!("{payload}\n"))));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, "application/json".parse().expect("static"));
    if let Some(location) = location.and_then(|l| l.parse().ok()) {
        headers.insert(LOCATION, location);
    }
    Ok(response)
}

/// What an answer is: status, JSON body, `Location`, and the log note.
type Answer = (StatusCode, Value, Option<String>, String);

/// `POST /v1/payments` (or `/v1/transfers`): a new payment, unless a
/// lookup fenced this key's attempt.
fn pay(state: &State, key: &str, attempt: u64, body: &[u8]) -> Answer {
    let amount = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("amount").cloned())
        .unwrap_or(Value::Null);
    let known = (key != "-").then_some(key);
    // The fence and the payment under one lock: a lookup's 404
    // cannot slip in between.
    let mut state = state.lock().expect("lock");
    if state.fenced.get(key).is_some_and(|f| attempt <= *f) {
        // The lookup said this key never acted, fenced up to `f`.
        (
            StatusCode::CONFLICT,
            json!({"error": "a newer attempt of this key exists; nothing was created"}),
            None,
            format!("refused attempt {attempt} (fenced)"),
        )
    } else {
        let payment = state.create(known, amount);
        let id = payment["id"].as_str().unwrap_or_default().to_string();
        let location = format!("/v1/payments/{id}");
        (
            StatusCode::CREATED,
            payment,
            Some(location),
            format!("created {id}"),
        )
    }
}

/// `GET /v1/idempotency/{key}`: the status inquiry's lookup.
fn lookup(state: &State, path: &str, attempt: u64) -> Answer {
    let asked = &path["/v1/idempotency/".len()..];
    let asked = percent_encoding::percent_decode_str(asked).decode_utf8_lossy();
    let mut state = state.lock().expect("lock");
    match state.by_key.get(asked.as_ref()).cloned() {
        // The answer the original request got.
        Some(p) => {
            let id = p["id"].as_str().unwrap_or_default();
            let location = format!("/v1/payments/{id}");
            let note = format!("key {asked} created {id}");
            (StatusCode::CREATED, p.clone(), Some(location), note)
        }
        None => {
            // "Never acted, and never will": fence first.
            state.fence_durably(&asked, attempt);
            (
                StatusCode::NOT_FOUND,
                json!({"error": "no payment was created with this key"}),
                None,
                format!("key {asked} created nothing (attempts up to {attempt} refused)"),
            )
        }
    }
}
