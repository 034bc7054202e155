//! HTTP/1.1 connections, one request per hyper connection, *parked*
//! between requests: an idle keep-alive connection holds its socket and
//! this task, not hyper's read and write buffers (≈ 2.7 KB a connection
//! against ≈ 27.5 KB when one hyper connection lived as long as the socket;
//! `bench/results/2026-11-23-memory.md`).
//!
//! Each request is served by a fresh hyper `http1` connection over the
//! socket. Once hyper has written the response head, it is told to end the
//! connection after this response (`graceful_shutdown`, i.e. no keep-alive
//! past this message), and `poll_without_shutdown` gives the socket back
//! without closing it. The connection is then parked: it waits for the
//! next request's first byte, without a buffer, for at most
//! `idle_timeout`, and closes at once on `stop`. When bytes arrive, the next
//! hyper connection starts, and its own timer gives that request's head
//! `header_read_timeout`. Bytes hyper had read past the response
//! (pipelined requests) go back in front of the socket ([`Prefixed`]), and
//! the next connection starts at once.
//!
//! How (hyper 1.12, `proto/h1/{dispatch,conn}.rs`): the response body is
//! wrapped ([`Gated`]). The dispatcher writes the head (`Conn::write_head`)
//! before it first polls the body, or drops it unpolled when it has nothing
//! to send (an empty body, `HEAD`, 204, 304). That first poll (or drop)
//! tells this task, and the body yields nothing until this task has called
//! `graceful_shutdown`: the head went out with keep-alive (no
//! `connection: close`), and hyper finishes the message with keep-alive
//! disabled, so it closes its state (`State::try_keep_alive`) instead of
//! going idle and reading the next request. That happens in
//! `Conn::poll_flush` once everything written is flushed — as long as the
//! request body had been read to its end before the response began (a
//! response that started before the whole request body was read could end
//! from the read side with bytes unflushed). So what a handler left unread
//! of a body is read first, if it is small and arrives at once
//! ([`read_to_end`]); a connection whose body was not read to its end (and
//! one whose client asked for `Connection: close`, an HTTP/1.0 one without
//! keep-alive, or a failed one) is not parked but finished as hyper would
//! (flushed, then shut down). `into_parts` then returns what hyper read but
//! did not use (`read_buf`: pipelined requests).
//!
//! A body dropped unpolled cannot hold hyper back: if a pipelined request
//! was already in hyper's buffer, hyper may begin it before keep-alive is
//! disabled. It is still answered, with `connection: close`, and the
//! connection then closes (whatever the client sent after it is not
//! served).

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;

use http::header::{CONNECTION, EXPECT, HeaderMap};
use http::{Request, Response, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::prefixed::Prefixed;
use super::{Settings, sleep_until};
use crate::body::{Body, BodyTracker, BoxError, RequestBody};
use crate::clock::Instant;

/// Serve an HTTP/1.1 connection until it closes, its deadlines pass, or
/// `stop` (graceful shutdown) is cancelled.
pub(super) async fn serve<H, F>(
    settings: &Settings,
    stream: TcpStream,
    handle: &Arc<H>,
    opened: Instant,
    stop: &CancellationToken,
) where
    H: Fn(Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut io = Prefixed::new(stream);
    // The first request's head is due `header_read_timeout` after the accept.
    let mut head_due = Some(opened + settings.deadlines.first_head);
    loop {
        if stop.is_cancelled() {
            return;
        }
        let Some(parked) = one_request(settings, io, handle, head_due.take(), stop).await else {
            return;
        };
        io = parked;
        if !io.has_unread() && !park(io.stream(), settings.deadlines.idle, stop).await {
            return;
        }
    }
}

/// Wait for the next request's first byte, for at most `idle`; `false` if
/// the connection is to close instead (deadline, `stop`, the client closed,
/// an error).
async fn park(stream: &TcpStream, idle: Duration, stop: &CancellationToken) -> bool {
    let mut byte = [0u8; 1];
    tokio::select! {
        peeked = stream.peek(&mut byte) => matches!(peeked, Ok(n) if n > 0),
        () = tokio::time::sleep(idle) => {
            tracing::debug!("idle past idle_timeout: connection closed");
            false
        }
        () = stop.cancelled() => false,
    }
}

/// What one hyper connection's service and response body tell the
/// connection loop, and what the loop tells the body.
#[derive(Default)]
struct Exchange {
    /// Request heads that arrived (the service was called): one, unless
    /// hyper began a pipelined request before keep-alive was disabled.
    started: AtomicUsize,
    /// Whether the connection can take another request after this one.
    reusable: AtomicBool,
    /// Signalled when hyper first polls (or drops) the response body: its
    /// head has been written.
    answered: Notify,
    /// Keep-alive is disabled: the response body may flow.
    released: AtomicBool,
}

/// A response body held back, once its head has been written, until the
/// connection loop has disabled keep-alive (see the module's doc).
struct Gated {
    inner: Body,
    exchange: Arc<Exchange>,
    signalled: bool,
}

impl Gated {
    fn signal(&mut self) {
        if !self.signalled {
            self.signalled = true;
            self.exchange.answered.notify_one();
        }
    }
}

impl HttpBody for Gated {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if !self.exchange.released.load(Ordering::Acquire) {
            // No waker to keep: the signal wakes this very task, whose loop
            // polls the connection again once keep-alive is disabled.
            self.signal();
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        // Not before it is released: hyper drops an ended body unpolled.
        self.exchange.released.load(Ordering::Acquire) && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        self.signal();
    }
}

/// Serve one request on a fresh hyper connection over `io`; the socket back
/// (with whatever was read past the request in front) if the connection
/// can take another request, `None` if it is closed. `head_due`: when the
/// request head must have arrived (besides hyper's own timer).
async fn one_request<H, F>(
    settings: &Settings,
    io: Prefixed,
    handle: &Arc<H>,
    mut head_due: Option<Instant>,
    stop: &CancellationToken,
) -> Option<Prefixed>
where
    H: Fn(Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let exchange = Arc::new(Exchange::default());
    let service = {
        let (exchange, handle) = (exchange.clone(), handle.clone());
        service_fn(move |request: Request<Incoming>| {
            exchange.started.fetch_add(1, Ordering::AcqRel);
            let keep_alive = wants_keep_alive(request.version(), request.headers());
            let may_drain = !request.headers().contains_key(EXPECT);
            let body = Arc::new(BodyTracker::default());
            let answer = handle(request.map(|b| RequestBody::new(b, Some(body.clone()))));
            let exchange = exchange.clone();
            let answered: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(async move {
                let response = answer.await;
                // Only a request read to its end before the response begins
                // leaves the connection reusable (see the module's doc).
                let reusable = keep_alive
                    && response.status() != StatusCode::SWITCHING_PROTOCOLS
                    && !has_token(response.headers(), "close")
                    && read_to_end(&body, may_drain).await;
                drop(body);
                exchange.reusable.store(reusable, Ordering::Release);
                Ok::<_, Infallible>(response.map(|inner| Gated {
                    inner,
                    exchange,
                    signalled: false,
                }))
            });
            answered
        })
    };
    // Boxed: a parked connection's task does not keep room for it.
    let mut connection = Box::new(settings.http1.serve_connection(TokioIo::new(io), service));
    let mut closing = false;
    let mut reusable = false;
    let result = loop {
        tokio::select! {
            biased;
            result = poll_fn(|cx| connection.poll_without_shutdown(cx)) => break result,
            // hyper has written the response head by now: ending keep-alive
            // cannot add `connection: close` to it.
            () = exchange.answered.notified(), if !closing => {
                reusable = exchange.reusable.load(Ordering::Acquire);
                Pin::new(&mut *connection).graceful_shutdown();
                exchange.released.store(true, Ordering::Release);
                closing = true;
            }
            // A request in progress finishes (its response says
            // `connection: close`); an idle connection closes.
            () = stop.cancelled(), if !closing => {
                Pin::new(&mut *connection).graceful_shutdown();
                exchange.released.store(true, Ordering::Release);
                closing = true;
            }
            () = sleep_until(head_due), if head_due.is_some() => {
                if exchange.started.load(Ordering::Acquire) == 0 {
                    tracing::debug!("no request head within header_read_timeout: connection closed");
                    return None;
                }
                head_due = None;
            }
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "connection ended with an error");
        return None;
    }
    // A second request (pipelined, begun before keep-alive was disabled)
    // was answered with `connection: close`: what follows it is not served.
    let one = exchange.started.load(Ordering::Acquire) == 1;
    if !(reusable && one) || stop.is_cancelled() {
        // Flush what is left and shut the socket down, as hyper does.
        if let Err(error) = (&mut *connection).await {
            tracing::debug!(%error, "connection ended with an error");
        }
        return None;
    }
    let parts = connection.into_parts();
    Some(parts.io.into_inner().unread(parts.read_buf))
}

/// The most of a request body its handler left unread (an early answer:
/// `413`, a missing key) that is read and dropped so that the connection can
/// take another request, and how long that may take; a larger or slower
/// rest closes the connection after the answer instead.
const DRAIN_LIMIT: usize = 64 * 1024;
const DRAIN_TIME: Duration = Duration::from_millis(100);

/// Whether the request body has been read to its end, reading what its
/// handler left unread first if that is at most [`DRAIN_LIMIT`] bytes
/// arriving within [`DRAIN_TIME`] (never for a client that waits for
/// `100 Continue`: hyper would send it). Before the response is handed to
/// hyper, so that hyper's reading is done before its writing.
async fn read_to_end(body: &BodyTracker, may_drain: bool) -> bool {
    if body.ended() {
        return true;
    }
    // `None`: still held (a forward streaming it), so not read to its end.
    let Some(mut rest) = body.take_left() else {
        return false;
    };
    if !may_drain || rest.size_hint().lower() > DRAIN_LIMIT as u64 {
        return false;
    }
    let drain = async {
        let mut read = 0;
        while !rest.is_end_stream() {
            match rest.frame().await {
                None => break,
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
                Some(Err(_)) => return false,
            }
            if read > DRAIN_LIMIT {
                return false;
            }
        }
        true
    };
    matches!(tokio::time::timeout(DRAIN_TIME, drain).await, Ok(true))
}

/// Whether the client wants the connection kept open after this request:
/// HTTP/1.1 unless it says `Connection: close`, HTTP/1.0 only if it says
/// `Connection: keep-alive`.
fn wants_keep_alive(version: Version, headers: &HeaderMap) -> bool {
    match version {
        Version::HTTP_11 => !has_token(headers, "close"),
        Version::HTTP_10 => has_token(headers, "keep-alive") && !has_token(headers, "close"),
        _ => false,
    }
}

/// Whether a `Connection` header lists `token`.
fn has_token(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(connection: &[&'static str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in connection {
            headers.append(CONNECTION, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn keep_alive_follows_the_version_and_the_connection_header() {
        assert!(wants_keep_alive(Version::HTTP_11, &headers(&[])));
        assert!(wants_keep_alive(
            Version::HTTP_11,
            &headers(&["Keep-Alive"])
        ));
        assert!(!wants_keep_alive(Version::HTTP_11, &headers(&["Close"])));
        assert!(!wants_keep_alive(
            Version::HTTP_11,
            &headers(&["te", "upgrade, close"])
        ));
        assert!(!wants_keep_alive(Version::HTTP_10, &headers(&[])));
        assert!(wants_keep_alive(
            Version::HTTP_10,
            &headers(&["keep-alive"])
        ));
        assert!(!wants_keep_alive(Version::HTTP_2, &headers(&[])));
    }
}
