//! HTTP/2 connections (h2c with prior knowledge, or h2 chosen by ALPN over
//! TLS): hyper's, with a keeper of their deadlines. The first request's
//! head is due `header_read_timeout` after the accept (a preface, or
//! SETTINGS, and then nothing is cut off);
//! once no request has been in progress for `idle_timeout` the connection
//! ends gracefully (GOAWAY, then open streams finish), and so it does on
//! `stop`.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Deadlines, Settings, sleep_until};
use crate::clock::Instant;
use crate::request::body::{Body, RequestBody};

/// What the connection's requests tell its deadline keeper.
#[derive(Debug)]
struct Activity {
    opened: Instant,
    /// Requests whose head arrived, in total.
    started: AtomicU64,
    /// Requests being answered now.
    open: AtomicUsize,
    /// When the last request was answered, in ms since `opened`.
    last_answered_ms: AtomicU64,
    /// Signalled when a request is answered.
    answered: Notify,
}

impl Activity {
    fn new(opened: Instant) -> Self {
        Self {
            opened,
            started: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            last_answered_ms: AtomicU64::new(0),
            answered: Notify::new(),
        }
    }

    fn begin(self: &Arc<Self>) -> RequestGuard {
        self.started.fetch_add(1, Ordering::AcqRel);
        self.open.fetch_add(1, Ordering::AcqRel);
        RequestGuard(self.clone())
    }

    /// When the connection is due to close, and whether gracefully; `None`
    /// while a request is being answered.
    fn due(&self, deadlines: Deadlines) -> Option<(Instant, Close)> {
        if self.started.load(Ordering::Acquire) == 0 {
            return Some((self.opened + deadlines.first_head, Close::Abort));
        }
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_answered_ms.load(Ordering::Acquire));
        Some((self.opened + last + deadlines.idle, Close::Graceful))
    }
}

/// How a connection past its deadline ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Close {
    /// No request ever came: drop it.
    Abort,
    /// Idle between requests: let the protocol say goodbye.
    Graceful,
}

/// Marks one request as being answered while alive.
struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let activity = &self.0;
        let now = u64::try_from(activity.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        activity.last_answered_ms.fetch_max(now, Ordering::AcqRel);
        activity.open.fetch_sub(1, Ordering::AcqRel);
        activity.answered.notify_one();
    }
}

/// Serve an HTTP/2 connection until it ends, its deadlines pass, or
/// `stop` (graceful shutdown) is cancelled.
pub(super) async fn serve<H, F, S>(
    settings: &Settings,
    stream: S,
    handle: Arc<H>,
    opened: Instant,
    stop: CancellationToken,
) where
    H: Fn(http::Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = http::Response<Body>> + Send + 'static,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let deadlines = settings.deadlines;
    let activity = Arc::new(Activity::new(opened));
    let service = {
        let activity = activity.clone();
        service_fn(move |request| {
            let guard = activity.begin();
            let answer = handle(request.map(|body| RequestBody::new(body, None)));
            async move {
                let response = answer.await;
                drop(guard);
                Ok::<_, Infallible>(response)
            }
        })
    };
    let connection = settings
        .http2
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        let due = if closing {
            None
        } else {
            activity.due(deadlines)
        };
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            () = stop.cancelled(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = sleep_until(due.map(|(at, _)| at)), if due.is_some() => {
                // Re-read: a request may have begun or ended meanwhile.
                match activity.due(deadlines) {
                    Some((at, Close::Abort)) if at <= Instant::now() => {
                        tracing::debug!("no request head within header_read_timeout: connection closed");
                        return;
                    }
                    Some((at, Close::Graceful)) if at <= Instant::now() => {
                        connection.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    _ => {}
                }
            }
            // A request ended: the idle deadline starts now (the first
            // head's deadline, or none while requests are open, no longer
            // applies). A notification sent while not waiting is kept.
            () = activity.answered.notified(), if !closing => {}
        }
    }
}
