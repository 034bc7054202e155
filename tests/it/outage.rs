//! PostgreSQL outages (G8): a private PostgreSQL cluster is stopped
//! (`pg_ctl stop -m immediate`) and started again under a running gateway,
//! which must fail closed (or open, where configured) and recover by itself.
//! The shared PostgreSQL other tests use is never touched.

use std::time::Duration;

use http::StatusCode;

use crate::support::servers::PgCluster;
use crate::support::{Gateway, Set, TestConfig, Upstream, client, eventually, post};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_postgres_fails_closed_then_recovers() {
    let mut cluster = PgCluster::new().await;
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&TestConfig::new(&cluster.url(), &upstream.url())).await;
    let http = client();
    let url = gateway.url("/v1/payments");
    let body = r#"{"amount":1}"#;

    let first = post(&http, &url, "before", body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(gateway.readyz().await, StatusCode::OK);

    cluster.stop_immediate().await;
    assert_eq!(gateway.readyz().await, StatusCode::SERVICE_UNAVAILABLE);
    let down = post(&http, &url, "during", body).await;
    assert_eq!(down.status, StatusCode::SERVICE_UNAVAILABLE, "{down:?}");
    assert_eq!(
        down.problem_type(),
        "urn:idemgate:problem:store-unavailable"
    );
    assert!(down.header("retry-after").is_some(), "{down:?}");
    assert_eq!(upstream.count("during"), 0, "fail closed forwarded anyway");
    assert_eq!(upstream.total(), 1);

    // Same gateway, no restart: it must reconnect by itself.
    cluster.start().await;
    let mut attempt = 0;
    let recovered = eventually(Duration::from_secs(30), || {
        attempt += 1;
        let (http, url) = (http.clone(), url.clone());
        async move {
            let reply = post(&http, &url, &format!("after-{attempt}"), body).await;
            match reply.status {
                StatusCode::CREATED => Some(reply),
                StatusCode::SERVICE_UNAVAILABLE => {
                    assert_eq!(
                        reply.problem_type(),
                        "urn:idemgate:problem:store-unavailable"
                    );
                    None
                }
                _ => panic!("unexpected answer while the store recovers: {reply:?}"),
            }
        }
    })
    .await;
    let recovered = recovered.expect("the gateway did not recover within 30 s of the restart");
    assert!(!recovered.is_replay());
    // Only the one that got through was forwarded.
    assert_eq!(upstream.total(), 2);
    assert_eq!(upstream.count("during"), 0);

    // What was recorded before the outage survived it.
    let replay = post(&http, &url, "before", body).await;
    assert_eq!(replay.status, StatusCode::CREATED, "{replay:?}");
    assert!(replay.is_replay(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(upstream.count("before"), 1);
    assert_eq!(gateway.readyz().await, StatusCode::OK);

    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_postgres_fails_open_when_configured() {
    let mut cluster = PgCluster::new().await;
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&cluster.url(), &upstream.url()).route(|r| {
        r.set("on_store_error", "fail_open");
    });
    let gateway = Gateway::start(&config).await;
    let http = client();
    let url = gateway.url("/v1/payments");
    let body = r#"{"amount":2}"#;

    let first = post(&http, &url, "before", body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.is_replay());

    cluster.stop_immediate().await;
    let open = post(&http, &url, "during", body).await;
    assert_eq!(open.status, StatusCode::CREATED, "{open:?}");
    assert!(
        open.header("idempotent-replayed").is_none(),
        "a fail-open answer is the upstream's own: {open:?}"
    );
    assert_eq!(upstream.count("during"), 1, "fail open did not forward");
    assert_eq!(open.json()["n"], 1, "{open:?}");

    gateway.shutdown().await;
}
