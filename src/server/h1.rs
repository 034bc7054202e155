//! HTTP/1.1 connections: served by hyper with keep-alive while busy, and
//! *parked* without hyper state once idle, so that an idle keep-alive
//! connection holds its socket and this task, not hyper's read and write
//! buffers (≈ 2.7 KB a connection against ≈ 27.5 KB when one hyper
//! connection lived as long as the socket;
//! `bench/results/2026-11-23-memory.md`).
//!
//! Requests are served one after the other (pipelined ones too) by one
//! hyper `http1` connection, as hyper does. Once no request has been in
//! progress for [`PARK_AFTER`] (at most half of `header_read_timeout`), keep-alive
//! is disabled on it (`graceful_shutdown`), which closes an idle hyper
//! connection at once, and `poll_without_shutdown` gives the socket back
//! without closing it. The connection is then parked: it waits for the
//! next request's first byte, without a buffer, for at most `idle_timeout`
//! (counted from the end of its last response), and closes at once on
//! `stop`. When bytes arrive, a fresh hyper connection starts, and its own
//! timer gives that request's head `header_read_timeout`. Bytes hyper had
//! read but not used (the start of a head) go back in front of the socket
//! ([`Prefixed`]), and the next connection starts at once with them (their
//! head still due `header_read_timeout` after the idle spell began).
//!
//! Parking well before `header_read_timeout` is what lets `idle_timeout`
//! govern an idle connection: hyper's own head timer also runs while a
//! hyper connection waits for its *next* request head, and would close it
//! after `header_read_timeout`.
//!
//! Nothing written can be lost by parking (hyper 1.12,
//! `proto/h1/{dispatch,conn}.rs`): a connection is parked only when its
//! socket did not refuse hyper's last write ([`Tracked`]); hyper flushes at
//! the end of every poll until the socket refuses, so its write buffer is
//! then empty. A connection is never parked once one of its requests was
//! not read to its end (hyper may stop reading a body its handler dropped,
//! and the rest must not be taken for a request), nor when the client or
//! the response asked for `Connection: close` (hyper closes it itself).
//! What a handler left unread of a small body is read past before its
//! answer ([`read_to_end`]), so that an early answer (a `413`, a missing
//! key) keeps the connection.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;

use http::header::{CONNECTION, EXPECT, HeaderMap};
use http::{Request, Response, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::prefixed::{Prefixed, Transport};
use super::{Settings, sleep_until};
use crate::clock::Instant;
use crate::request::body::{Body, BodyTracker, BoxError, RequestBody};

/// How long a hyper connection stays in place with no request in progress
/// before it is parked (or half of `header_read_timeout`, if less).
pub(crate) const PARK_AFTER: Duration = Duration::from_secs(1);

/// Serve an HTTP/1.1 connection until it closes, its deadlines pass, or
/// `stop` (graceful shutdown) is cancelled.
pub(super) async fn serve<H, F, S>(
    settings: &Settings,
    stream: S,
    handle: &Arc<H>,
    opened: Instant,
    stop: &CancellationToken,
) where
    H: Fn(Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
    S: Transport,
{
    let mut io = Prefixed::new(stream);
    // The first request's head is due `header_read_timeout` after the accept.
    let mut head_due = Some(opened + settings.deadlines.first_head);
    loop {
        if stop.is_cancelled() {
            return;
        }
        let Some(parked) = busy(settings, io, handle, head_due.take(), stop).await else {
            return;
        };
        io = parked.io;
        if io.has_unread() {
            // The start of a head came during the idle spell.
            head_due = Some(parked.idle_since + settings.deadlines.first_head);
        } else {
            let until = parked.idle_since + settings.deadlines.idle;
            if !park(io.socket(), until, stop).await {
                return;
            }
        }
    }
}

/// Wait for the next request's first byte until `until`; `false` if the
/// connection is to close instead (deadline, `stop`, the client closed, an
/// error).
async fn park(stream: &TcpStream, until: Instant, stop: &CancellationToken) -> bool {
    let mut byte = [0u8; 1];
    tokio::select! {
        peeked = stream.peek(&mut byte) => matches!(peeked, Ok(n) if n > 0),
        () = tokio::time::sleep_until(until) => {
            tracing::debug!("idle past idle_timeout: connection closed");
            false
        }
        () = stop.cancelled() => false,
    }
}

/// A socket given back by an idle hyper connection.
struct Parked<S> {
    /// With what hyper read and did not use in front.
    io: Prefixed<S>,
    /// When its last response ended.
    idle_since: Instant,
}

/// What one hyper connection's requests, responses and socket tell the
/// connection loop.
struct Activity {
    /// When the hyper connection started.
    base: Instant,
    /// Request heads that arrived (the service was called).
    started: AtomicUsize,
    /// Requests whose response has not ended.
    open: AtomicUsize,
    /// When the last response ended, in µs since `base`.
    last_ended_us: AtomicU64,
    /// A request was not read to its end, or the client or the response
    /// asked to close: the connection is not parked.
    unparkable: AtomicBool,
    /// The socket refused hyper's last write: hyper holds unwritten bytes.
    write_blocked: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Self {
            base: Instant::now(),
            started: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            last_ended_us: AtomicU64::new(0),
            unparkable: AtomicBool::new(false),
            write_blocked: AtomicBool::new(false),
        }
    }

    /// Nothing keeps the connection from being parked (so far).
    fn parkable(&self) -> bool {
        !self.unparkable.load(Ordering::Acquire) && !self.write_blocked.load(Ordering::Acquire)
    }

    fn begin(&self) {
        self.started.fetch_add(1, Ordering::AcqRel);
        self.open.fetch_add(1, Ordering::AcqRel);
    }

    fn end(&self) {
        let us = u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.last_ended_us.store(us, Ordering::Release);
        self.open.fetch_sub(1, Ordering::AcqRel);
    }

    /// Since when no request has been in progress; `None` while one is.
    fn idle_since(&self) -> Option<Instant> {
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let us = self.last_ended_us.load(Ordering::Acquire);
        Some(self.base + Duration::from_micros(us))
    }
}

/// A response body that tells [`Activity`] when hyper is done with it.
struct Counted {
    inner: Body,
    activity: Arc<Activity>,
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.activity.end();
    }
}

/// The socket as hyper sees it: whether its last write was refused is told
/// to [`Activity`].
struct Tracked<S> {
    io: Prefixed<S>,
    activity: Arc<Activity>,
}

impl<S> Tracked<S> {
    fn written<T>(&self, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        self.activity
            .write_blocked
            .store(poll.is_pending(), Ordering::Release);
        poll
    }
}

impl<S: Transport> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: Transport> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.written(poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.written(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    // hyper flushes its socket once its own buffer is empty: a refused
    // flush means a layer below (TLS) still holds bytes to write.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.written(poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// What the idle timer of a busy connection decides.
enum Idle {
    /// Idle past `idle_timeout`: close.
    Close,
    /// Check again at `at`; with `park`, start parking the connection
    /// (hyper lets go of it once the request in progress ends).
    Rearm { at: Instant, park: bool },
}

/// The idle timer fired: close a connection idle past `idle_timeout`,
/// park one idle for `park_after`, or wait on. Not before a first request:
/// a head in progress is left to hyper's timer (and `head_due`).
fn idle_check(
    settings: &Settings,
    activity: &Activity,
    park_after: Duration,
    stopping: bool,
    parking: bool,
) -> Idle {
    let now = Instant::now();
    let since = if activity.started.load(Ordering::Acquire) == 0 {
        None
    } else {
        activity.idle_since()
    };
    let Some(since) = since else {
        return Idle::Rearm {
            at: now + park_after,
            park: false,
        };
    };
    if now >= since + settings.deadlines.idle {
        tracing::debug!("idle past idle_timeout: connection closed");
        return Idle::Close;
    }
    let park = !parking && !stopping && activity.parkable() && now >= since + park_after;
    let at = if parking || park || now >= since + park_after {
        (now + park_after).min(since + settings.deadlines.idle)
    } else {
        since + park_after
    };
    Idle::Rearm { at, park }
}

/// Serve requests on one hyper connection over `io` until it has been idle
/// for [`PARK_AFTER`]; the socket back (with whatever was read and not used
/// in front) to be parked, `None` if the connection is closed. `head_due`:
/// when the first request's head must have arrived (besides hyper's own
/// timer).
async fn busy<H, F, S>(
    settings: &Settings,
    io: Prefixed<S>,
    handle: &Arc<H>,
    mut head_due: Option<Instant>,
    stop: &CancellationToken,
) -> Option<Parked<S>>
where
    H: Fn(Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
    S: Transport,
{
    let activity = Arc::new(Activity::new());
    let service = {
        let (activity, handle) = (activity.clone(), handle.clone());
        service_fn(move |request: Request<Incoming>| {
            activity.begin();
            let keep_alive = wants_keep_alive(request.version(), request.headers());
            let may_drain = !request.headers().contains_key(EXPECT);
            let body = Arc::new(BodyTracker::default());
            let answer = handle(request.map(|b| RequestBody::new(b, Some(body.clone()))));
            let activity = activity.clone();
            let answered: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(async move {
                let response = answer.await;
                let parkable = keep_alive
                    && response.status() != StatusCode::SWITCHING_PROTOCOLS
                    && !has_token(response.headers(), "close")
                    && read_to_end(&body, may_drain).await;
                drop(body);
                if !parkable {
                    activity.unparkable.store(true, Ordering::Release);
                }
                Ok::<_, Infallible>(response.map(|inner| Counted { inner, activity }))
            });
            answered
        })
    };
    let tracked = Tracked {
        io,
        activity: activity.clone(),
    };
    let park_after = PARK_AFTER.min(settings.deadlines.first_head / 2);
    // Boxed: a parked connection's task does not keep room for it.
    let mut connection = Box::new(
        settings
            .http1
            .serve_connection(TokioIo::new(tracked), service),
    );
    let timer = tokio::time::sleep(park_after);
    tokio::pin!(timer);
    let mut stopping = false;
    let mut parking = false;
    let result = loop {
        tokio::select! {
            biased;
            result = poll_fn(|cx| connection.poll_without_shutdown(cx)) => break result,
            // A request in progress finishes (its response says
            // `connection: close`); an idle connection closes.
            () = stop.cancelled(), if !stopping => {
                Pin::new(&mut *connection).graceful_shutdown();
                stopping = true;
            }
            () = sleep_until(head_due), if head_due.is_some() => {
                if activity.started.load(Ordering::Acquire) == 0 {
                    tracing::debug!("no request head within header_read_timeout: connection closed");
                    return None;
                }
                head_due = None;
            }
            () = &mut timer => match idle_check(settings, &activity, park_after, stopping, parking) {
                Idle::Close => return None,
                Idle::Rearm { at, park } => {
                    if park {
                        // Idle: hyper closes its state at once; busy (reading
                        // the rest of a body): after this request.
                        Pin::new(&mut *connection).graceful_shutdown();
                        parking = true;
                    }
                    timer.as_mut().reset(at);
                }
            },
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "connection ended with an error");
        return None;
    }
    let parkable = parking && !stop.is_cancelled() && activity.parkable();
    let idle_since = activity.idle_since();
    let (true, Some(idle_since)) = (parkable, idle_since) else {
        // Flush what is left and shut the socket down, as hyper does.
        if let Err(error) = (&mut *connection).await {
            tracing::debug!(%error, "connection ended with an error");
        }
        return None;
    };
    let parts = connection.into_parts();
    let io = parts.io.into_inner().io.unread(parts.read_buf);
    Some(Parked { io, idle_since })
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
