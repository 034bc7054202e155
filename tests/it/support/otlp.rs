//! A real OTLP/HTTP receiver for the tracing tests: it accepts
//! `POST /v1/traces` (protobuf), decodes every span with the
//! OpenTelemetry protocol's own messages and keeps them ([`Receiver`]).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

/// `SPAN_KIND_SERVER` and `SPAN_KIND_CLIENT` in the protocol.
pub const SERVER: i32 = 2;
pub const CLIENT: i32 = 3;

/// One span as the collector received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub service_name: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub kind: i32,
    pub attributes: Vec<(String, String)>,
}

impl Received {
    /// An attribute's value, as text.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn text(value: Option<Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s,
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// The receiver; it serves until the test's runtime ends.
pub struct Receiver {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let sink = spans.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let sink = sink.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let sink = sink.clone();
                        async move { Ok::<_, hyper::Error>(take(request, &sink).await) }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        Self { addr, spans }
    }

    /// What to give `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The spans received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// Wait (up to 30 s) until `done` holds for the spans received.
    pub async fn until(&self, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let got = super::eventually(Duration::from_secs(30), || {
            let spans = self.spans();
            let finished = done(&spans);
            async move { finished.then_some(spans) }
        })
        .await;
        got.unwrap_or_else(|| panic!("the spans never arrived: {:#?}", self.spans()))
    }
}

/// Decode one export request and keep its spans.
async fn take(request: Request<Incoming>, sink: &Mutex<Vec<Received>>) -> Response<Full<Bytes>> {
    let ok_path = request.uri().path() == "/v1/traces";
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let Some(export) = ok_path
        .then(|| ExportTraceServiceRequest::decode(body).ok())
        .flatten()
    else {
        let mut refused = Response::new(Full::new(Bytes::new()));
        *refused.status_mut() = http::StatusCode::BAD_REQUEST;
        return refused;
    };
    let mut out = sink.lock().unwrap();
    for resource_spans in export.resource_spans {
        let service_name = resource_spans
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.clone().and_then(|v| v.value)))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                out.push(Received {
                    service_name: service_name.clone(),
                    name: span.name,
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    kind: span.kind,
                    attributes: span
                        .attributes
                        .into_iter()
                        .map(|kv| (kv.key, text(kv.value.and_then(|v| v.value))))
                        .collect(),
                });
            }
        }
    }
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    Response::builder()
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::from(answer)))
        .unwrap()
}
