//! The admin listener (DESIGN.md §7), separate from the proxy port:
//! `/healthz` (the process answers) and `/readyz` (the store answers).

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
use crate::store::Store;

/// Serve the admin endpoints until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    store: Arc<dyn Store>,
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
        let store = store.clone();
        let service = service_fn(move |request| {
            let store = store.clone();
            async move { Ok::<_, Infallible>(answer(request, store.as_ref()).await) }
        });
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        "text/plain; charset=utf-8".parse().expect("static"),
    );
    response
}

async fn answer(request: Request<Incoming>, store: &dyn Store) -> Response<Body> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n".into());
    }
    match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => match store.ping().await {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(error) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {error}\n"),
            ),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "admin endpoints: /healthz, /readyz\n".into(),
        ),
    }
}
