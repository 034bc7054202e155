//! The accept loop: hyper-util's auto builder (HTTP/1.1 and h2c), a cap on
//! concurrent connections, a deadline on every phase of a connection, and
//! graceful shutdown that stops accepting, lets open requests finish, and
//! waits for every forward task and its record before returning.
//!
//! Deadlines (all from the configuration, none optional):
//! - from the accept to the first request's complete head:
//!   `header_read_timeout`, whatever the protocol (a client that sends
//!   nothing, half an HTTP/2 preface, or SETTINGS and then nothing is cut
//!   off); HTTP/1.1's later request heads have the same limit (hyper's own
//!   timer);
//! - no request in progress for `idle_timeout`: the connection is closed
//!   gracefully (HTTP/2 gets a GOAWAY);
//! - HTTP/2 pings every `http2_keep_alive_interval`, and a ping unanswered
//!   for `http2_keep_alive_timeout` closes the connection;
//! - a protected request's body: `body_read_timeout` (in the handler).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Instant;
use crate::config::Config;
use crate::handler::Gateway;

/// Serve `gateway` on `listener` until `shutdown` resolves, then drain.
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    config: &Config,
    shutdown: impl Future<Output = ()>,
) {
    let builder = Arc::new(builder(config));
    let deadlines = Deadlines::of(config);
    let open = accept_until(listener, config.max_connections, shutdown, {
        let gateway = gateway.clone();
        move |stream, client, stop| {
            let (gateway, builder) = (gateway.clone(), builder.clone());
            let handle = move |request| {
                let gateway = gateway.clone();
                async move { gateway.handle(request, client).await }
            };
            async move { serve_connection(&builder, stream, handle, deadlines, stop).await }
        }
    })
    .await;

    tracing::info!("shutting down: finishing open requests and forwards");
    // One deadline for both phases: `shutdown_timeout` is the longest wait.
    let deadline = Instant::now() + config.shutdown_timeout;
    open.stop.cancel();
    open.tracker.close();
    if tokio::time::timeout_at(deadline, open.tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?config.shutdown_timeout, "connections still open at the shutdown deadline");
    }
    gateway.finish();
    gateway.tasks().close();
    if tokio::time::timeout_at(deadline, gateway.tasks().wait())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?config.shutdown_timeout, "forwards still running at the shutdown deadline");
    }
}

/// The connections an accept loop left open when it stopped.
pub(crate) struct OpenConnections {
    /// Their tasks.
    pub(crate) tracker: TaskTracker,
    /// Cancelled: each closes gracefully.
    pub(crate) stop: CancellationToken,
}

/// Accept connections on `listener` until `shutdown` resolves, at most
/// `cap` at once (past the cap, connections wait in the kernel's backlog),
/// each served by `serve(stream, peer, stop)` in a task of its own. Accept
/// errors (EMFILE and friends) back off instead of spinning.
pub(crate) async fn accept_until<S, F>(
    listener: TcpListener,
    cap: usize,
    shutdown: impl Future<Output = ()>,
    serve: S,
) -> OpenConnections
where
    S: Fn(TcpStream, SocketAddr, CancellationToken) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let open = OpenConnections {
        tracker: TaskTracker::new(),
        stop: CancellationToken::new(),
    };
    let slots = Arc::new(Semaphore::new(cap));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let connection = serve(stream, peer, open.stop.clone());
        open.tracker.spawn(async move {
            connection.await;
            drop(permit);
        });
    }
    open
}

/// The protocol settings of every connection (proxy and admin alike).
pub(crate) fn builder(config: &Config) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout)
        .max_buf_size(config.max_header_bytes);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(config.http2_keep_alive_interval)
        .keep_alive_timeout(config.http2_keep_alive_timeout)
        .max_concurrent_streams(config.http2_max_concurrent_streams)
        .initial_stream_window_size(config.http2_stream_window)
        .initial_connection_window_size(config.http2_connection_window)
        .adaptive_window(false)
        .max_header_list_size(u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX));
    builder
}

/// A connection's deadlines.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    /// From the accept to the first request head.
    first_head: Duration,
    /// With no request in progress.
    idle: Duration,
}

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

impl Deadlines {
    /// The configured ones.
    pub(crate) fn of(config: &Config) -> Self {
        Self {
            first_head: config.header_read_timeout,
            idle: config.idle_timeout,
        }
    }
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
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

/// Serve one connection until it ends, its deadlines pass, or `stop`
/// (graceful shutdown) is cancelled.
pub(crate) async fn serve_connection<H, F>(
    builder: &auto::Builder<TokioExecutor>,
    stream: TcpStream,
    handle: H,
    deadlines: Deadlines,
    stop: CancellationToken,
) where
    H: Fn(http::Request<hyper::body::Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = http::Response<crate::body::Body>> + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let handle = Arc::new(handle);
    let service = {
        let activity = activity.clone();
        service_fn(move |request| {
            let guard = activity.begin();
            let answer = handle(request);
            async move {
                let response = answer.await;
                drop(guard);
                Ok::<_, Infallible>(response)
            }
        })
    };
    let connection = builder.serve_connection(TokioIo::new(stream), service);
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
            () = sleep_until(due), if due.is_some() => {
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

async fn sleep_until(due: Option<(Instant, Close)>) {
    match due {
        Some((at, _)) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
