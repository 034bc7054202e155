//! One upstream exchange, shared by the claimed forward, the pass-through
//! and the status inquiry: send the request and read what the caller needs
//! of the answer, all within one deadline, then make the head fit for the
//! client ([`to_client`]). What differs between them is only how much of
//! the body is read inside the deadline: none (the pass-through streams
//! it), all of it up to the route's cap (the forward), or that only for a
//! final answer (the inquiry).

use std::future::Future;
use std::time::Duration;

use http::Request;
use http::response::Parts;
use hyper::body::Incoming;

use super::{Upstream, UpstreamError, to_client};
use crate::config::UpstreamCa;
use crate::request::body::{Body, Collected, collect_up_to};

/// Why an exchange gave no answer.
#[derive(Debug)]
pub enum ExchangeError {
    /// The deadline passed before the head (and what was to be read of the
    /// body) arrived.
    TimedOut,
    /// Not sent, or failed after sending ([`UpstreamError`]).
    Upstream(UpstreamError),
}

impl Upstream {
    /// Send `request` (trusting `ca` for `https://`) and `read` the answer
    /// within `deadline`: `read` gets the head and the body and returns
    /// what the caller keeps of it (the body itself to stream it on,
    /// [`read_up_to`]'s collection, …).
    pub async fn exchange<T, F, Fut>(
        &self,
        ca: Option<&UpstreamCa>,
        request: Request<Body>,
        deadline: Duration,
        read: F,
    ) -> Result<(Parts, T), ExchangeError>
    where
        F: FnOnce(&Parts, Incoming) -> Fut,
        Fut: Future<Output = Result<T, UpstreamError>>,
    {
        let exchanged = tokio::time::timeout(deadline, async {
            let (parts, incoming) = self.send(ca, request).await?.into_parts();
            let kept = read(&parts, incoming).await?;
            Ok::<_, UpstreamError>((parts, kept))
        })
        .await;
        let (mut parts, kept) = exchanged
            .map_err(|_| ExchangeError::TimedOut)?
            .map_err(ExchangeError::Upstream)?;
        to_client(&mut parts);
        Ok((parts, kept))
    }
}

/// Read an answer's body up to `limit` bytes (beyond it: the prefix and
/// the rest, still unread); a body that breaks off is a failed exchange.
pub async fn read_up_to(
    body: Incoming,
    limit: usize,
) -> Result<Collected<Incoming>, UpstreamError> {
    collect_up_to(body, limit, |_| {})
        .await
        .map_err(|e| UpstreamError::Failed(format!("reading the response body: {e}")))
}
