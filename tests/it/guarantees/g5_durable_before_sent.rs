//! G5 — durable before sent: a client gets the upstream's answer only once
//! its record is committed, so a gateway that stops right after the answer
//! leaves a record the next process replays. Here with the real binary
//! stopped by SIGTERM mid-forward; the chaos harness checks G5 under every
//! fault (`chaos/checker.rs`, property 7).

use std::time::Duration;

use http::StatusCode;

use super::{db_state, process_config, upstream_saw};
use crate::support::http::try_post;
use crate::support::process::GatewayProcess;
use crate::support::{TestDb, Upstream, client, post};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_forward_and_its_record() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    let config = process_config(&db, &upstream, "10s", "20s");
    let mut gateway = GatewayProcess::start("p", &config).await;
    let http = client();
    let (key, body) = ("sigterm", r#"{"amount":400}"#);
    let path = "/v1/slow/2000";

    let pending = tokio::spawn({
        let (http, url) = (http.clone(), gateway.url(path));
        async move { try_post(&http, &url, key, body).await }
    });
    upstream_saw(&upstream, key, 1).await;
    gateway.terminate();

    let reply = pending
        .await
        .unwrap()
        .expect("the in-flight client is answered");
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    assert!(!reply.is_replay());
    let status = gateway
        .wait(Duration::from_secs(30))
        .await
        .expect("the gateway exits after SIGTERM");
    assert!(
        status.success(),
        "exit status {status}: {}",
        gateway.stderr()
    );
    assert_eq!(db_state(&db, key).await.as_deref(), Some("completed"));

    let next = GatewayProcess::start("q", &config).await;
    let replay = post(&http, &next.url(path), key, body).await;
    assert_eq!(replay.status, StatusCode::CREATED, "{replay:?}");
    assert!(replay.is_replay(), "{replay:?}");
    assert_eq!(replay.body, reply.body);
    assert_eq!(upstream.count(key), 1);
}
