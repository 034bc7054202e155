//! The accept loop: a cap on concurrent connections, HTTP/1.1 and h2c told
//! apart by the first bytes (or, with `[tls]`, HTTP/2 and HTTP/1.1 by
//! ALPN, [`tls`]), a deadline on every phase of a connection, and graceful
//! shutdown that stops accepting, lets open requests finish, and waits for
//! every forward task and its record before returning.
//!
//! A cleartext connection's first bytes are peeked at, not read
//! ([`preface`]): the HTTP/2 client preface makes it an HTTP/2 connection
//! ([`h2`]), anything else HTTP/1.1 ([`h1`]); a TLS connection's protocol is
//! the one ALPN chose. HTTP/1.1 is served by hyper with keep-alive while busy and
//! *parked* with no hyper state at all once no request has been in progress
//! for `h1::PARK_AFTER` (1 s, at most half of `header_read_timeout`), so
//! that an idle keep-alive connection costs its socket and a small task.
//!
//! Deadlines (all from the configuration, none optional):
//! - from the accept to the first request's complete head:
//!   `header_read_timeout`, whatever the protocol, the TLS handshake
//!   included (a client that sends nothing, half a ClientHello, half an
//!   HTTP/2 preface, or SETTINGS and then nothing is cut off);
//! - HTTP/1.1's later request heads: `header_read_timeout` (hyper's own
//!   timer) from the moment the connection is idle, or, once it is parked,
//!   from the first bytes of that request; an idle connection is parked
//!   before that timer can cut it, which is what leaves it to `idle_timeout`;
//! - no request in progress for `idle_timeout`: the connection is closed
//!   (an HTTP/1.1 connection parked that long is closed; HTTP/2 gets a
//!   GOAWAY first);
//! - HTTP/2 pings every `http2_keep_alive_interval`, and a ping unanswered
//!   for `http2_keep_alive_timeout` closes the connection;
//! - a protected request's body: `body_read_timeout` (in the handler).

mod h1;
mod h2;
mod preface;
mod prefixed;
pub(crate) mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Instant;
use crate::config::Config;
use crate::handler::Gateway;
use crate::request::body::{Body, RequestBody};
use crate::serving_threads::ServingThreads;
use crate::upstream::ClientOverTls;

/// Serve `gateway` on `listener` until `shutdown` resolves, then drain.
/// With `tls`, the listener speaks TLS with that certificate (reloaded
/// with the configuration, [`crate::reload`]); with `threads`, connections are served on those
/// threads ([`crate::serving_threads`]), which end once everything is drained.
pub(crate) async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    threads: Option<ServingThreads>,
    config: &Config,
    tls: Option<Arc<tls::Certificate>>,
    shutdown: impl Future<Output = ()>,
) {
    let mut settings = Settings::of(config);
    settings.tls = tls;
    let settings = Arc::new(settings);
    let open = accept_until(
        listener,
        config.max_connections,
        threads.as_ref(),
        shutdown,
        {
            let gateway = gateway.clone();
            move |stream, client, stop| {
                let (gateway, settings) = (gateway.clone(), settings.clone());
                let handle = move |request| {
                    let gateway = gateway.clone();
                    async move { gateway.handle(request, client).await }
                };
                async move { serve_connection(&settings, stream, handle, stop).await }
            }
        },
    )
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
    if let Some(threads) = threads {
        threads.stop().await;
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
/// each served by `serve(stream, peer, stop)` in a task of its own: on this
/// runtime, or with `threads` on the serving thread [`ServingThreads::place`] picks.
/// Accept errors (EMFILE and friends) back off instead of spinning.
pub(crate) async fn accept_until<S, F>(
    listener: TcpListener,
    cap: usize,
    threads: Option<&ServingThreads>,
    shutdown: impl Future<Output = ()>,
    serve: S,
) -> OpenConnections
where
    S: Fn(TcpStream, SocketAddr, CancellationToken) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let open = OpenConnections {
        tracker: TaskTracker::new(),
        stop: CancellationToken::new(),
    };
    let serve = Arc::new(serve);
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
        let stop = open.stop.clone();
        let Some(threads) = threads else {
            let connection = serve(stream, peer, stop);
            open.tracker.spawn(async move {
                connection.await;
                drop(permit);
            });
            continue;
        };
        let (serve, tracked) = (serve.clone(), open.tracker.token());
        let placed = threads.place(stream, move |stream| async move {
            serve(stream, peer, stop).await;
            drop((permit, tracked));
        });
        if let Err(error) = placed {
            tracing::warn!(%error, "cannot hand a connection to a serving thread: closed");
        }
    }
    open
}

/// How every connection is served (proxy and admin alike): the protocol
/// settings and the deadlines.
pub(crate) struct Settings {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    deadlines: Deadlines,
    /// TLS on this listener; `None`: cleartext.
    tls: Option<Arc<tls::Certificate>>,
}

/// A connection's deadlines.
#[derive(Debug, Clone, Copy)]
struct Deadlines {
    /// From the accept to the first request head.
    first_head: Duration,
    /// With no request in progress.
    idle: Duration,
}

impl Settings {
    /// The configured ones.
    pub(crate) fn of(config: &Config) -> Self {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(config.header_read_timeout)
            .max_buf_size(config.max_header_bytes)
            .keep_alive(true);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .keep_alive_interval(config.http2_keep_alive_interval)
            .keep_alive_timeout(config.http2_keep_alive_timeout)
            .max_concurrent_streams(config.http2_max_concurrent_streams)
            .initial_stream_window_size(config.http2_stream_window)
            .initial_connection_window_size(config.http2_connection_window)
            .adaptive_window(false)
            .max_header_list_size(u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX));
        Self {
            http1,
            http2,
            deadlines: Deadlines {
                first_head: config.header_read_timeout,
                idle: config.idle_timeout,
            },
            tls: None,
        }
    }
}

/// Serve one connection with `handle` until it ends, its deadlines pass,
/// or `stop` (graceful shutdown) is cancelled.
pub(crate) async fn serve_connection<H, F>(
    settings: &Settings,
    stream: TcpStream,
    handle: H,
    stop: CancellationToken,
) where
    H: Fn(http::Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = http::Response<Body>> + Send + 'static,
{
    let opened = Instant::now();
    let first_head = opened + settings.deadlines.first_head;
    if let Some(tls) = &settings.tls {
        // Boxed: a cleartext connection's task does not carry the TLS
        // handshake's state (several KB a connection, 10,000 idle
        // connections went from 46 to 110 MiB when it was inline).
        Box::pin(serve_tls(
            settings,
            tls.acceptor(),
            stream,
            handle,
            opened,
            first_head,
            stop,
        ))
        .await;
        return;
    }
    let protocol = tokio::select! {
        protocol = tokio::time::timeout_at(first_head, preface::detect(&stream)) => match protocol {
            Ok(Some(protocol)) => protocol,
            Ok(None) => return,
            Err(_elapsed) => {
                tracing::debug!("no request head within header_read_timeout: connection closed");
                return;
            }
        },
        () = stop.cancelled() => return,
    };
    let handle = Arc::new(handle);
    match protocol {
        // Boxed: an HTTP/1.1 connection's task stays small while parked.
        preface::Protocol::Http2 => {
            Box::pin(h2::serve(settings, stream, handle, opened, stop)).await;
        }
        preface::Protocol::Http1 => h1::serve(settings, stream, &handle, opened, &stop).await,
    }
}

/// [`serve_connection`] on a TLS listener: the handshake within the
/// first-head deadline, then HTTP/2 or HTTP/1.1 as ALPN chose, every
/// request carrying the verified client certificate's identity, if any.
async fn serve_tls<H, F>(
    settings: &Settings,
    acceptor: tokio_rustls::TlsAcceptor,
    stream: TcpStream,
    handle: H,
    opened: Instant,
    first_head: Instant,
    stop: CancellationToken,
) where
    H: Fn(http::Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = http::Response<Body>> + Send + 'static,
{
    let handshake = tokio::select! {
        accepted = tokio::time::timeout_at(first_head, acceptor.accept(stream)) => accepted,
        () = stop.cancelled() => return,
    };
    let stream = match handshake {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            tracing::debug!(%error, "TLS handshake failed: connection closed");
            return;
        }
        Err(_elapsed) => {
            tracing::debug!(
                "no TLS handshake and request head within header_read_timeout: connection closed"
            );
            return;
        }
    };
    let h2 = tls::chose_h2(stream.get_ref().1.alpn_protocol());
    let identity = tls::identity(stream.get_ref().1);
    // The upstream hears that the client came over TLS.
    let handle = Arc::new(move |mut request: http::Request<RequestBody>| {
        request.extensions_mut().insert(ClientOverTls);
        if let Some(identity) = &identity {
            request.extensions_mut().insert(identity.clone());
        }
        handle(request)
    });
    if h2 {
        Box::pin(h2::serve(settings, stream, handle, opened, stop)).await;
    } else {
        Box::pin(h1::serve(settings, stream, &handle, opened, &stop)).await;
    }
}

/// Sleep until `at`; forever if `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With serving threads, the accept loop serves each connection on one
    /// of them (not on its own runtime), and still tracks it for the drain.
    #[tokio::test]
    async fn with_cores_connections_are_served_on_the_serving_threads() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let threads = ServingThreads::start(2).unwrap();
        let (seen, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let accepting = async {
            accept_until(
                listener,
                8,
                Some(&threads),
                async {
                    let _ = stopped.await;
                },
                move |_stream, _peer, stop: CancellationToken| {
                    let seen = seen.clone();
                    async move {
                        let name = std::thread::current().name().map(str::to_owned);
                        seen.send(name).unwrap();
                        stop.cancelled().await;
                    }
                },
            )
            .await
        };
        let clients = async {
            let mut clients = Vec::new();
            for _ in 0..4 {
                clients.push(TcpStream::connect(addr).await.unwrap());
                let name = seen_rx.recv().await.unwrap().unwrap_or_default();
                assert!(name.starts_with("idemgate-serve-"), "served on {name:?}");
            }
            let _ = stop.send(());
            clients
        };
        let (open, _clients) = tokio::join!(accepting, clients);
        // The connections are tracked: the drain waits for them.
        open.tracker.close();
        assert!(!open.tracker.is_empty(), "four connections still open");
        open.stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), open.tracker.wait())
            .await
            .expect("the connections end when told to stop");
        threads.stop().await;
    }

    /// Every open connection's task is at least this future: what it
    /// holds inline, 10,000 idle connections hold 10,000 times. The TLS
    /// handshake's state (boxed in [`serve_tls`]) once sat inline here and
    /// took an idle connection from 4.4 to 10.7 KB.
    #[tokio::test]
    async fn a_connections_task_stays_small() {
        let config = crate::config::Config::parse(
            "[store]\nurl = \"memory://\"\n[[routes]]\nname = \"r\"\nmatch = \"/*\"\nupstream = \"http://127.0.0.1:1\"\n",
        )
        .unwrap();
        let settings = Settings::of(&config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let handle = |_: http::Request<RequestBody>| async {
            http::Response::new(crate::request::body::empty())
        };
        let task = serve_connection(&settings, stream, handle, CancellationToken::new());
        let size = std::mem::size_of_val(&task);
        assert!(size <= 1024, "a connection's task is {size} bytes");
    }
}
