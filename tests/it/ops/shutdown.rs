//! Graceful shutdown of the real binary (SIGTERM): `shutdown_timeout` bounds
//! the whole wait. (A SIGTERM mid-forward that still records its answer is
//! in `guarantees/g5_durable_before_sent.rs`; idle and busy connections at
//! shutdown in `http/server.rs`.)

use std::time::Duration;

use crate::guarantees::{process_config, upstream_saw};
use crate::support::http::try_post;
use crate::support::process::GatewayProcess;
use crate::support::{Set, TestDb, Upstream, client};

/// `shutdown_timeout` is the longest a graceful shutdown waits in all: a
/// forward that never ends holds both its connection and its forward task,
/// and the two waits share one deadline (they used to take it twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_at_most_shutdown_timeout_in_all() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    let config = process_config(&db, &upstream, "60s", "60s").top(|t| {
        t.set("shutdown_timeout", "4s");
    });
    let mut gateway = GatewayProcess::start("s", &config).await;
    let http = client();
    let pending = tokio::spawn({
        let (http, url) = (http.clone(), gateway.url("/v1/hang"));
        async move { try_post(&http, &url, "never-ends", "{}").await }
    });
    upstream_saw(&upstream, "never-ends", 1).await;
    let stopping = tokio::time::Instant::now();
    gateway.terminate();
    let status = gateway
        .wait(Duration::from_secs(60))
        .await
        .expect("the gateway exits after SIGTERM");
    let took = stopping.elapsed();
    // 4 s once; twice would be 8 s.
    assert!(
        took < Duration::from_millis(7_000),
        "shutdown took {took:?} with shutdown_timeout = 4s: {}",
        gateway.stderr()
    );
    assert!(
        took >= Duration::from_secs(3),
        "it did wait for the forward: {took:?}"
    );
    assert!(status.success() || status.code().is_some());
    pending.abort();
}
