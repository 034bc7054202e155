//! The admin listener (docs/src/reference/admin-api.md), separate from the proxy port:
//! `/metrics` (Prometheus text format), `/healthz` (the process answers),
//! `/readyz` (the store answers and is migrated), and `POST /keys`, which
//! runs an `idemgate keys` command on this gateway's store (how the CLI
//! reaches a `memory://` store), and `POST /config/reload`, which reloads
//! the configuration ([`crate::reload`]). Both are for a caller with the
//! `admin_token`, and are refused when no token is configured. Health,
//! metrics and `GET /openapi.json` (the API's contract, [`openapi`]) stay
//! open. Refusals and errors are `application/problem+json`
//! ([`problem::AdminProblem`]).

pub mod keys;
pub mod openapi;
pub mod problem;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;

use crate::clock::Instant;
use crate::config::Config;
use crate::metrics::{Metrics, plain_result};
use crate::reload::Reloader;
use crate::request::body::{Body, RequestBody, full};
use crate::server;
use crate::store::{Store, StoreAdmin};
use problem::AdminProblem;

/// Largest `POST /keys` body read.
const MAX_COMMAND: usize = 64 * 1024;

/// What the admin endpoints work with.
pub struct Admin {
    /// The gateway's request path (key administration makes it forget
    /// what it caches of a removed key).
    pub store: Arc<dyn Store>,
    /// The store's administration side.
    pub records: Arc<dyn StoreAdmin>,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    /// The configuration it started with (the admin listener's own
    /// settings and token change only on restart).
    pub settings: Config,
    /// Reloads, and the configuration in force (routes, for key
    /// administration).
    pub reloader: Arc<Reloader>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

/// Serve the admin endpoints until `shutdown` resolves: at most
/// `admin_max_connections` at once, with the proxy's connection deadlines
/// and protocol limits, and accept errors backed off.
pub async fn serve(listener: TcpListener, admin: Arc<Admin>, shutdown: impl Future<Output = ()>) {
    let settings = Arc::new(server::Settings::of(&admin.settings));
    let cap = admin.settings.admin_max_connections;
    let open = server::accept_until(listener, cap, None, shutdown, move |stream, _, stop| {
        let (admin, settings) = (admin.clone(), settings.clone());
        let handle = move |request| {
            let admin = admin.clone();
            async move { answer(request, &admin).await }
        };
        async move { server::serve_connection(&settings, stream, handle, stop).await }
    })
    .await;
    open.stop.cancel();
}

/// `GET http://{addr}{path}` with a deadline; the status, or why there is none.
pub async fn probe(addr: SocketAddr, path: &str, deadline: Duration) -> Result<StatusCode, String> {
    let client: Client<HttpConnector, Body> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let request = Request::get(format!("http://{addr}{path}"))
        .body(crate::request::body::empty())
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(deadline, client.request(request)).await {
        Ok(Ok(response)) => Ok(response.status()),
        Ok(Err(error)) => Err(format!(
            "cannot reach the admin listener at {addr}: {error}"
        )),
        Err(_) => Err(format!(
            "no answer from the admin listener at {addr} within {deadline:?}"
        )),
    }
}

/// Where to probe a listener bound to `addr` from this machine.
pub fn probe_address(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, addr.port())
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

/// The admin endpoints and the methods each answers (`Allow` on a 405).
const ENDPOINTS: [(&str, &str); 6] = [
    ("/metrics", "GET, HEAD"),
    ("/healthz", "GET, HEAD"),
    ("/readyz", "GET, HEAD"),
    ("/openapi.json", "GET, HEAD"),
    ("/keys", "POST"),
    ("/config/reload", "POST"),
];

async fn answer(request: Request<RequestBody>, admin: &Admin) -> Response<Body> {
    let (store, metrics) = (admin.records.as_ref(), &admin.metrics);
    match (request.method().clone(), request.uri().path()) {
        (Method::POST, "/keys") => match refusal(&request, admin, "key administration") {
            None => keys(request, admin).await,
            Some(refused) => refused,
        },
        (Method::POST, "/config/reload") => {
            match refusal(&request, admin, "configuration reload") {
                None => reload(admin).await,
                Some(refused) => refused,
            }
        }
        (Method::GET | Method::HEAD, "/metrics") => {
            metrics.scrape(store);
            text(StatusCode::OK, OPENMETRICS, metrics.encode())
        }
        (Method::GET | Method::HEAD, "/healthz") => text(StatusCode::OK, PLAIN, "ok\n".into()),
        (Method::GET | Method::HEAD, "/readyz") => match ping(store, metrics).await {
            Ok(()) => text(StatusCode::OK, PLAIN, "ready\n".into()),
            Err(error) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("not ready: {error}\n"),
            ),
        },
        (Method::GET | Method::HEAD, "/openapi.json") => openapi::response(),
        (method, path) => elsewhere(&method, path),
    }
}

/// A path the listener does not serve (404), or a method it does not
/// serve there (405 with `Allow`).
fn elsewhere(method: &Method, path: &str) -> Response<Body> {
    let listing = "admin endpoints: GET /metrics, /healthz, /readyz, /openapi.json; \
                   POST /keys, /config/reload";
    let Some((_, allow)) = ENDPOINTS.iter().find(|(p, _)| *p == path) else {
        return AdminProblem::NoEndpoint.to_response(format!(
            "The admin listener has no endpoint at {path}; {listing}."
        ));
    };
    let mut refused = AdminProblem::MethodNotAllowed
        .to_response(format!("{path} answers {allow}, not {method}; {listing}."));
    refused
        .headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allow));
    refused
}

/// Readiness, measured like every store operation.
async fn ping(store: &dyn StoreAdmin, metrics: &Metrics) -> Result<(), crate::store::StoreError> {
    let started = Instant::now();
    let result = store.ping().await;
    metrics.store_op("ping", plain_result(&result), started.elapsed());
    result
}

/// `None` if the caller sent the admin token; else the refusal: 403
/// when no token is configured (`what` is then off), 401 otherwise.
fn refusal(request: &Request<RequestBody>, admin: &Admin, what: &str) -> Option<Response<Body>> {
    let Some(token) = &admin.settings.admin_token else {
        return Some(AdminProblem::Off.to_response(format!(
            "{what} over HTTP is off: set admin_token in the gateway's config \
             (for example admin_token = \"${{IDEMGATE_ADMIN_TOKEN}}\") and send it as \
             Authorization: Bearer <token>; `idemgate keys` does so from the same config"
        )));
    };
    let authorization = request.headers().get(header::AUTHORIZATION);
    if token.authorizes(authorization.map(|v| v.as_bytes())) {
        return None;
    }
    let mut refused = AdminProblem::Unauthorized.to_response(format!(
        "{} needs Authorization: Bearer <admin_token>, the admin_token of the gateway's config",
        request.uri().path()
    ));
    refused.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"idemgate-admin\""),
    );
    Some(refused)
}

/// Reload the configuration: 200 with what was applied and what waits for
/// a restart, or 422 with why nothing changed (as JSON either way).
async fn reload(admin: &Admin) -> Response<Body> {
    let (status, body) = match admin.reloader.reload("POST /config/reload").await {
        Ok(reloaded) => (
            StatusCode::OK,
            serde_json::json!({
                "reloaded": true,
                "routes": reloaded.routes,
                "restart_required": reloaded.restart_required,
                "key_changes": reloaded.key_changes,
            }),
        ),
        Err(error) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            serde_json::json!({ "reloaded": false, "error": error.to_string() }),
        ),
    };
    text(status, "application/json", format!("{body}\n"))
}

/// Run the `idemgate keys` command in the body on this gateway's store
/// (the caller sent the token, [`refusal`]).
async fn keys(request: Request<RequestBody>, admin: &Admin) -> Response<Body> {
    use http_body_util::BodyExt;
    let body = match http_body_util::Limited::new(request.into_body(), MAX_COMMAND)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            return AdminProblem::CommandTooLarge.to_response(format!(
                "A keys command is at most {MAX_COMMAND} bytes of JSON; this one is larger."
            ));
        }
        Err(error) => {
            return AdminProblem::BadCommand
                .to_response(format!("The command could not be read: {error}."));
        }
    };
    let command: keys::KeyCommand = match serde_json::from_slice(&body) {
        Ok(command) => command,
        Err(error) => {
            return AdminProblem::BadCommand.to_response(format!(
                "Not a keys command ({error}): send one JSON object with one member, \
                 show, list, release, delete or erase (GET /openapi.json, schema KeyCommand)."
            ));
        }
    };
    let json = command.wants_json();
    let (records, path) = (admin.records.as_ref(), admin.store.as_ref());
    let config = admin.reloader.current();
    match keys::execute(&config, records, path, command).await {
        Ok(output) if json => text(StatusCode::OK, "application/json", output),
        Ok(output) => text(StatusCode::OK, PLAIN, output),
        Err(error) => {
            let mut answer = AdminProblem::of_keys(&error).to_response(error.to_string());
            if error.is_not_found() {
                answer.headers_mut().insert(
                    keys::NOT_FOUND_HEADER,
                    header::HeaderValue::from_static("not-found"),
                );
            }
            answer
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_addresses_are_probed_on_loopback() {
        let p = |s: &str| probe_address(s.parse().unwrap()).to_string();
        assert_eq!(p("0.0.0.0:9090"), "127.0.0.1:9090");
        assert_eq!(p("[::]:9090"), "[::1]:9090");
        assert_eq!(p("10.1.2.3:9090"), "10.1.2.3:9090");
    }
}
