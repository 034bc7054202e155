//! The accept loop: hyper-util's auto builder (HTTP/1.1 and h2c), a cap on
//! concurrent connections, a header-read timeout, and graceful shutdown that
//! stops accepting, lets open requests finish, and waits for every forward
//! task and its record before returning.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

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
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(config.max_connections));
    tokio::pin!(shutdown);

    loop {
        // Past the cap, connections wait in the kernel's backlog.
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (stream, client) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let gateway = gateway.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let first_byte_deadline = config.header_read_timeout;
        tokio::spawn(async move {
            // hyper reads the protocol preface with no deadline: a connection
            // that never sends a byte would hold its slot forever.
            let mut probe = [0u8; 1];
            match tokio::time::timeout(first_byte_deadline, stream.peek(&mut probe)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return drop(permit),
            }
            let service = service_fn(move |request| {
                let gateway = gateway.clone();
                async move { Ok::<_, Infallible>(gateway.handle(request, client).await) }
            });
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(connection).await {
                tracing::debug!(%error, "connection ended with an error");
            }
            drop(permit);
        });
    }

    drop(listener);
    tracing::info!("shutting down: finishing open requests and forwards");
    // One deadline for both phases: `shutdown_timeout` is the longest wait.
    let deadline = Instant::now() + config.shutdown_timeout;
    if tokio::time::timeout_at(deadline, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?config.shutdown_timeout, "connections still open at the shutdown deadline");
    }
    gateway.tasks().close();
    if tokio::time::timeout_at(deadline, gateway.tasks().wait())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?config.shutdown_timeout, "forwards still running at the shutdown deadline");
    }
}
