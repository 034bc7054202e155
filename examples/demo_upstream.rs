//! A tiny "payments API" to put behind idemgate in the README walkthrough.
//!
//! It knows nothing about idempotency: every `POST /v1/payments` creates a new
//! payment (`pay_1`, `pay_2`, …) and answers `201` with its JSON and a
//! `Location` header, echoing the request's `amount` when the body is JSON.
//! `GET /v1/payments/{id}` returns a payment or `404`. A `?delay_ms=N` query
//! parameter (at most 60000) makes the answer wait, so a duplicate can arrive
//! while the first request is still in flight. `POST /v1/events` is a
//! webhook receiver: it processes every delivery it gets (`200`, with the
//! count of events processed so far).
//!
//! Every request prints one line to stdout with the `Idempotency-Key` it
//! carried, so you can watch the upstream being hit exactly once per key.
//!
//! ```text
//! cargo run --example demo_upstream                       # 127.0.0.1:9000
//! cargo run --example demo_upstream -- --listen 127.0.0.1:9100
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
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
}

#[derive(Default)]
struct Payments {
    next_id: u64,
    events: u64,
    by_id: HashMap<String, Value>,
}

type State = Arc<Mutex<Payments>>;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("demo upstream listening on http://{}", args.listen);
    let state = State::default();
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
    let key = req
        .headers()
        .get("idempotency-key")
        .map_or("-".to_string(), |v| {
            String::from_utf8_lossy(v.as_bytes()).into_owned()
        });
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

    let under_payments = path == "/v1/payments" || path.starts_with("/v1/payments/");
    let (status, payload, location, note) = match method {
        Method::POST if under_payments => {
            let amount = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v.get("amount").cloned())
                .unwrap_or(Value::Null);
            let (id, payment) = {
                let mut payments = state.lock().expect("lock");
                payments.next_id += 1;
                let id = format!("pay_{}", payments.next_id);
                let payment = json!({"id": id, "amount": amount, "status": "succeeded"});
                payments.by_id.insert(id.clone(), payment.clone());
                (id, payment)
            };
            let location = format!("/v1/payments/{id}");
            (
                StatusCode::CREATED,
                payment,
                Some(location),
                format!("created {id}"),
            )
        }
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
