//! The spans of one request: the server span ([`server`], continuing the
//! client's W3C `traceparent`/`tracestate`, or starting a trace), one
//! child per store operation ([`store`]) and one for the upstream call
//! ([`upstream`], whose request carries the trace on). A replay answered
//! from the record has no upstream span. With tracing off, each of these
//! is [`Span::none`] and no header is read or written.
//!
//! Attribute names follow OpenTelemetry's HTTP semantic conventions, plus
//! `idemgate.route`, `idemgate.outcome` (the log line's words),
//! `idemgate.key_digest` (never the raw key) and `idemgate.token` (the
//! fencing token of the attempt that answered). The upstream's URL is
//! exported without its query or userinfo: a key or scope read from the
//! query (`key_from = ["query:…"]`) must not leave in a span.

use std::future::Future;

use http::{HeaderMap, Method, Request};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::instrument::Instrument;
use tracing::{Span, field::Empty};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{TARGET, enabled};
use crate::config::Route;
use crate::store::Token;

/// The server span of a request to `route` (named `POST /v1/payments/*`,
/// or `POST` when no route matched), its parent the client's trace
/// context if the request carries one.
pub fn server(method: &Method, path: &str, headers: &HeaderMap, route: Option<&Route>) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = match route {
        Some(route) => tracing::info_span!(
            target: TARGET,
            "request",
            otel.name = %format_args!("{method} {}", route.path),
            otel.kind = "server",
            otel.status_code = Empty,
            http.request.method = %method,
            url.path = path,
            http.route = %route.path,
            http.response.status_code = Empty,
            idemgate.route = route.name.as_str(),
            idemgate.outcome = Empty,
            idemgate.key_digest = Empty,
            idemgate.token = Empty,
        ),
        None => tracing::info_span!(
            target: TARGET,
            "request",
            otel.name = %method,
            otel.kind = "server",
            otel.status_code = Empty,
            http.request.method = %method,
            url.path = path,
            http.response.status_code = Empty,
            idemgate.route = "-",
            idemgate.outcome = Empty,
        ),
    };
    // Before the span is entered: then it starts under this parent.
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    let _ = span.set_parent(parent);
    span
}

/// What the request came to, on its server span.
pub fn finish(
    span: &Span,
    status: u16,
    outcome: &str,
    key_digest: Option<&str>,
    token: Option<Token>,
) {
    if span.is_none() {
        return;
    }
    span.record("http.response.status_code", status);
    span.record("idemgate.outcome", outcome);
    if let Some(digest) = key_digest {
        span.record("idemgate.key_digest", digest);
    }
    if let Some(token) = token {
        span.record("idemgate.token", token);
    }
    if status >= 500 {
        span.record("otel.status_code", "error");
    }
}

/// The trace id (32 hex digits) of `span`, for the log line; `None` when
/// tracing is off.
pub fn trace_id(span: &Span) -> Option<String> {
    if span.is_none() {
        return None;
    }
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}

/// The span of one store operation (`claim`, `complete`, …), a child of
/// the request's; none outside a request.
pub fn store(operation: &'static str) -> Span {
    // Background work (lease renewals, the inquirer, the sweeper) is not
    // part of a request: no trace of its own for each operation.
    if !enabled() || Span::current().is_none() {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        "store",
        otel.name = operation,
        otel.kind = "client",
        otel.status_code = Empty,
        db.operation.name = operation,
    )
}

/// Mark a store operation's span failed.
pub fn store_failed(span: &Span) {
    if !span.is_none() {
        span.record("otel.status_code", "error");
    }
}

/// The span of the call to the upstream, a child of the request's; the
/// request to the upstream gets its `traceparent` (and the client's
/// `tracestate`), so the upstream's own spans join the trace under it.
pub fn upstream<B>(request: &mut Request<B>) -> Span {
    if !enabled() {
        return Span::none();
    }
    let uri = request.uri();
    // No query (a key or a scope may be read from it) and no userinfo.
    let authority = uri
        .authority()
        .map_or("", |a| a.as_str().rsplit('@').next().unwrap_or_default());
    let span = tracing::info_span!(
        target: TARGET,
        "upstream",
        otel.name = %request.method(),
        otel.kind = "client",
        otel.status_code = Empty,
        http.request.method = %request.method(),
        url.full = %format_args!("{}://{authority}{}", uri.scheme_str().unwrap_or("http"), uri.path()),
        http.response.status_code = Empty,
    );
    let context = span.context();
    let headers = request.headers_mut();
    TraceContextPropagator::new().inject_context(&context, &mut HeaderInjector(headers));
    // The propagator writes an empty `tracestate` when there is none.
    if headers
        .get(TRACESTATE)
        .is_some_and(|value| value.is_empty())
    {
        headers.remove(TRACESTATE);
    }
    span
}

const TRACESTATE: &str = "tracestate";

/// What the upstream answered (`None`: no answer), on its span.
pub fn upstream_done(span: &Span, status: Option<u16>) {
    if span.is_none() {
        return;
    }
    match status {
        Some(status) => {
            span.record("http.response.status_code", status);
            // A client span's 4xx is an error too (HTTP semantic conventions).
            if status >= 400 {
                span.record("otel.status_code", "error");
            }
        }
        None => {
            span.record("otel.status_code", "error");
        }
    }
}

/// Await `$work` in the span `$span` (a variable); with tracing off (a
/// none span) the future is awaited bare. A wrapper would make every
/// future that holds it larger, and each move of it a longer copy: off,
/// tracing must cost nothing on the request path. `$work` is written out
/// in each branch, not bound first: a future bound to a local and then
/// moved into the wrapper keeps its own storage in the enclosing future
/// as well, doubling it.
macro_rules! traced {
    ($work:expr, $span:ident) => {{
        if $span.is_none() {
            $work.await
        } else {
            tracing::Instrument::instrument($work, $span.clone()).await
        }
    }};
}
pub(crate) use traced;

/// Spawn `work` on `tasks`, in the current span when tracing is on: work
/// moved to a task of its own belongs to the request that started it.
pub(crate) fn spawn_carried<F>(tasks: &tokio_util::task::TaskTracker, work: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    if enabled() {
        tasks.spawn(work.instrument(Span::current()));
    } else {
        tasks.spawn(work);
    }
}
