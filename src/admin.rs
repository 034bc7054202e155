//! The admin listener (DESIGN.md §7), separate from the proxy port:
//! `/metrics` (Prometheus text format), `/healthz` (the process answers) and
//! `/readyz` (the store answers and is migrated).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::body::{Body, full};
use crate::metrics::Metrics;
use crate::store::Store;

/// Serve the admin endpoints until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(_) => continue,
            },
            () = &mut shutdown => return,
        };
        let (store, metrics) = (store.clone(), metrics.clone());
        let service = service_fn(move |request| {
            let (store, metrics) = (store.clone(), metrics.clone());
            async move { Ok::<_, Infallible>(answer(request, store.as_ref(), &metrics).await) }
        });
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}

const PLAIN: &str = "text/plain; charset=utf-8";
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

async fn answer(
    request: Request<Incoming>,
    store: &dyn Store,
    metrics: &Metrics,
) -> Response<Body> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "use GET\n".into());
    }
    match request.uri().path() {
        "/metrics" => {
            if let Some(pool) = store.pool_stats() {
                metrics.pool_connections.set(pool.connections as i64);
                metrics.pool_idle.set(pool.idle as i64);
                metrics.pool_max.set(pool.max as i64);
            }
            text(StatusCode::OK, OPENMETRICS, metrics.encode())
        }
        "/healthz" => text(StatusCode::OK, PLAIN, "ok\n".into()),
        "/readyz" => match store.ping().await {
            Ok(()) => text(StatusCode::OK, PLAIN, "ready\n".into()),
            Err(error) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("not ready: {error}\n"),
            ),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "admin endpoints: /metrics, /healthz, /readyz\n".into(),
        ),
    }
}
