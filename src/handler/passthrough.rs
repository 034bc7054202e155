//! Requests forwarded without idempotency: methods a route does not
//! protect, keyless requests on a route that does not require a key,
//! fail-open store outages (G8) and everything a shadow route lets
//! through. Streamed both ways, bounded by `upstream_timeout` until the
//! response head arrives.

use std::net::SocketAddr;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};

use super::{Answered, Gateway, Outcome, Routed};
use crate::config::OnStoreError;
use crate::problem::{GatewayError, KeyAfter};
use crate::request::body::{self, Body};
use crate::store::StoreError;
use crate::telemetry::spans;
use crate::upstream::{
    self, ExchangeError, IDEMPOTENCY_ATTEMPT, IDEMPOTENCY_EXPIRES, UpstreamError,
};

impl Gateway {
    /// Forward `request` without idempotency: a pass-through.
    pub(super) async fn pass_through(
        &self,
        route: &Routed,
        request: Request<Body>,
        client: SocketAddr,
    ) -> Result<Answered, GatewayError> {
        let response = self.forward_plain(route, request, client).await?;
        Ok(Answered::new(response, Outcome::Passthrough))
    }

    /// G8: fail closed (503) or fail open (forward without idempotency).
    /// Only an outage fails open: a store that answered with something
    /// unreadable, or a full memory store, never lets a request bypass it.
    pub(super) async fn on_store_error(
        &self,
        route: &Routed,
        parts: Parts,
        body: Bytes,
        client: SocketAddr,
        error: StoreError,
    ) -> Result<Answered, GatewayError> {
        match (route.on_store_error, &error) {
            (OnStoreError::FailOpen, StoreError::Unavailable(_)) => {
                tracing::warn!(route = %route.name, error = %error, "store unavailable: forwarding WITHOUT idempotency (on_store_error = fail_open)");
                let request = Request::from_parts(parts, body::full(body));
                let response = self.forward_plain(route, request, client).await?;
                Ok(Answered::new(response, Outcome::FailOpen))
            }
            _ => Err(GatewayError::StoreUnavailable(error)),
        }
    }

    /// Proxy a request with no idempotency: streamed both ways, bounded by
    /// `upstream_timeout` until the response head arrives.
    pub(super) async fn forward_plain(
        &self,
        route: &Routed,
        request: Request<Body>,
        client: SocketAddr,
    ) -> Result<Response<Body>, GatewayError> {
        let end_to_end = |name: &http::HeaderName| route.travels_end_to_end(name);
        let mut request = upstream::prepare(request, &route.upstream, client, end_to_end);
        if route.forward_attempt {
            // Not an attempt: no token. A client's own value must not reach
            // an upstream that trusts the header (it could fence real ones).
            request.headers_mut().remove(IDEMPOTENCY_ATTEMPT);
        }
        let span = spans::upstream(&mut request);
        // Only the head within upstream_timeout: the body streams on.
        let exchange = route.upstream().exchange(
            route.upstream_ca.as_ref(),
            request,
            route.upstream_timeout,
            |_, body| async move { Ok(body) },
        );
        let exchange = spans::traced!(exchange, span);
        let answered = exchange.as_ref().ok();
        spans::upstream_done(&span, answered.map(|(parts, _)| parts.status.as_u16()));
        let (parts, incoming) = exchange.map_err(|e| match e {
            ExchangeError::TimedOut => GatewayError::UpstreamTimeout {
                timeout: route.upstream_timeout,
                key: KeyAfter::Unkeyed,
                expires: None,
            },
            ExchangeError::Upstream(UpstreamError::NotSent(detail)) => {
                GatewayError::UpstreamUnreachable(detail)
            }
            ExchangeError::Upstream(UpstreamError::Failed(detail)) => {
                GatewayError::UpstreamFailed {
                    detail,
                    key: KeyAfter::Unkeyed,
                    expires: None,
                }
            }
        })?;
        let mut parts = parts;
        if route.expires_header {
            // No record, so no expiry: not even the upstream's own header
            // under the name this route's answers give theirs.
            parts.headers.remove(IDEMPOTENCY_EXPIRES);
        }
        Ok(Response::from_parts(parts, body::boxed(incoming)))
    }
}
