//! The pipeline of docs/src/design/pipeline.md end to end: the real gateway on port 0 in
//! front of a real upstream on port 0, on fresh storage of each backend
//! (`per_backend!`), plus a few store-specific cases.

use std::time::Duration;

use http::StatusCode;

use crate::support::upstream::BINARY_BODY;
use crate::support::{
    Backend, Gateway, Set, Setup, TestConfig, TestDb, TestStore, Upstream, client, eventually,
    per_backend, post, record_state, send,
};

async fn replay_is_byte_exact_with_location_and_etag(b: Backend) {
    let s = Setup::start(b).await;
    let url = s.gateway.url("/v1/binary");
    let first = post(&s.client, &url, "k-bin", "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.is_replay());
    assert_eq!(&first.body[..], BINARY_BODY);
    let second = post(&s.client, &url, "k-bin", "{}").await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(second.is_replay());
    assert_eq!(&second.body[..], BINARY_BODY);
    assert_eq!(second.header("location"), Some("/v1/things/42"));
    assert_eq!(second.header("etag"), Some("\"v1-abc\""));
    assert_eq!(
        second.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(s.upstream.count("k-bin"), 1);
}

async fn same_key_different_request_is_422_and_never_forwarded(b: Backend) {
    let s = Setup::start(b).await;
    let url = s.gateway.url("/v1/payments");
    assert_eq!(
        post(&s.client, &url, "k1", r#"{"amount":10}"#).await.status,
        StatusCode::CREATED
    );
    let other = post(&s.client, &url, "k1", r#"{"amount":99}"#).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.problem_type(), "urn:idemgate:problem:key-reused");
    let other_path = post(
        &s.client,
        &s.gateway.url("/v1/refunds"),
        "k1",
        r#"{"amount":10}"#,
    )
    .await;
    assert_eq!(other_path.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(s.upstream.count("k1"), 1);
}

async fn missing_and_invalid_keys_are_400(b: Backend) {
    let s = Setup::start(b).await;
    let url = s.gateway.url("/v1/payments");
    let missing = send(&s.client, "POST", &url, &[], "{}").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.problem_type(), "urn:idemgate:problem:missing-key");
    let long = "k".repeat(256);
    // HTTP parsers already refuse most control characters; a tab gets through.
    for bad in [
        "",
        "\"\"",
        long.as_str(),
        "\"unterminated",
        "\"a\\nb\"",
        "\"a\"b",
        "a b",
        "a\tb",
        "\"a\tb\"",
        "caf\u{e9}",
    ] {
        let reply = send(&s.client, "POST", &url, &[("idempotency-key", bad)], "{}").await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "key {bad:?}");
        assert_eq!(
            reply.problem_type(),
            "urn:idemgate:problem:invalid-key",
            "key {bad:?}"
        );
    }
    let twice = send(
        &s.client,
        "POST",
        &url,
        &[("idempotency-key", "a"), ("idempotency-key", "b")],
        "{}",
    )
    .await;
    assert_eq!(twice.status, StatusCode::BAD_REQUEST);
    let ok = "k".repeat(255);
    assert_eq!(
        post(&s.client, &url, &ok, "{}").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        s.upstream.total(),
        1,
        "no invalid request reached the upstream"
    );
}

async fn optional_key_route_passes_keyless_requests_through(b: Backend) {
    let s = Setup::with(b, |config| {
        config.route(|r| {
            r.set("key_required", false);
        })
    })
    .await;
    let url = s.gateway.url("/v1/payments");
    for _ in 0..2 {
        let reply = send(&s.client, "POST", &url, &[], "{}").await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert!(!reply.is_replay());
    }
    assert_eq!(s.upstream.total(), 2);
}

async fn quoted_and_bare_forms_are_one_key(b: Backend) {
    let s = Setup::start(b).await;
    let url = s.gateway.url("/v1/payments");
    let first = post(&s.client, &url, "\"order-7\"", "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let second = post(&s.client, &url, "order-7", "{}").await;
    assert!(second.is_replay(), "{second:?}");
    assert_eq!(second.body, first.body);
    assert_eq!(s.upstream.total(), 1);
}

async fn unprotected_methods_pass_through_untouched(b: Backend) {
    let s = Setup::start(b).await;
    let url = s.gateway.url("/v1/payments?x=1");
    for _ in 0..3 {
        let reply = send(&s.client, "GET", &url, &[("idempotency-key", "g1")], "").await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert!(!reply.is_replay());
    }
    assert_eq!(s.upstream.count("g1"), 3);
    assert_eq!(s.upstream.last_headers()["idempotency-key"], "g1");
    let unrouted = send(
        &s.client,
        "POST",
        &s.gateway.url("/elsewhere"),
        &[("idempotency-key", "x")],
        "",
    )
    .await;
    assert_eq!(unrouted.status, StatusCode::NOT_FOUND);
    assert_eq!(unrouted.problem_type(), "urn:idemgate:problem:no-route");
}

async fn key_and_forwarding_headers_reach_the_upstream(b: Backend) {
    let s = Setup::start(b).await;
    post(&s.client, &s.gateway.url("/v1/payments"), "\"fwd-1\"", "{}").await;
    let h = s.upstream.last_headers();
    assert_eq!(
        h["idempotency-key"], "\"fwd-1\"",
        "the key header passes through intact"
    );
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-forwarded-host"], s.gateway.addr.to_string());
}

async fn storm_of_40_reaches_the_upstream_once(b: Backend) {
    let s = Setup::start(b).await;
    let url = s.gateway.url("/v1/slow/400");
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let (client, url) = (s.client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            post(&client, &url, "storm", "{\"a\":1}").await
        }));
    }
    let mut originals = Vec::new();
    for task in tasks {
        let reply = task.await.unwrap();
        match reply.status {
            StatusCode::CREATED => originals.push(reply),
            StatusCode::CONFLICT => {
                assert!(
                    reply.header("retry-after").is_some(),
                    "409 without Retry-After"
                );
                assert_eq!(reply.problem_type(), "urn:idemgate:problem:in-flight");
            }
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert_eq!(s.upstream.count("storm"), 1);
    assert!(originals.iter().filter(|r| !r.is_replay()).count() == 1);
    let after = post(&s.client, &url, "storm", "{\"a\":1}").await;
    assert!(after.is_replay());
    assert_eq!(after.body, originals[0].body);
}

async fn client_disconnect_mid_forward_is_recorded_and_replayed(b: Backend) {
    let s = Setup::start(b).await;
    let url = s.gateway.url("/v1/slow/800");
    let (client, u) = (s.client.clone(), url.clone());
    let impatient = tokio::spawn(async move { post(&client, &u, "gone", "{}").await });
    let seen = eventually(Duration::from_secs(5), || async {
        (s.upstream.count("gone") == 1).then_some(())
    })
    .await;
    assert!(seen.is_some(), "the upstream got the request");
    impatient.abort(); // the client goes away mid-forward
    let replay = eventually(Duration::from_secs(10), || async {
        let r = post(&s.client, &url, "gone", "{}").await;
        r.is_replay().then_some(r)
    })
    .await
    .expect("the abandoned exchange was recorded");
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(s.upstream.count("gone"), 1);
}

async fn upstream_500_and_429_release_but_400_is_recorded(b: Backend) {
    let s = Setup::start(b).await;
    for code in [500u16, 429] {
        let url = s.gateway.url(&format!("/v1/status/{code}"));
        let key = format!("rel-{code}");
        assert_eq!(
            post(&s.client, &url, &key, "{}").await.status.as_u16(),
            code
        );
        let again = post(&s.client, &url, &key, "{}").await;
        assert_eq!(again.status.as_u16(), code);
        assert!(!again.is_replay());
        assert_eq!(s.upstream.count(&key), 2, "{code} released the key");
    }
    let url = s.gateway.url("/v1/status/400");
    assert_eq!(
        post(&s.client, &url, "rec-400", "{}").await.status,
        StatusCode::BAD_REQUEST
    );
    let again = post(&s.client, &url, "rec-400", "{}").await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST);
    assert!(again.is_replay());
    assert_eq!(s.upstream.count("rec-400"), 1);
}

async fn upstream_reset_and_timeout_hold_the_key(b: Backend) {
    let s = Setup::start(b).await;
    let reset = post(&s.client, &s.gateway.url("/v1/reset"), "r1", "{}").await;
    assert_eq!(reset.status, StatusCode::BAD_GATEWAY);
    assert_eq!(reset.problem_type(), "urn:idemgate:problem:upstream-failed");
    let timeout = post(&s.client, &s.gateway.url("/v1/hang"), "t1", "{}").await;
    assert_eq!(timeout.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        timeout.problem_type(),
        "urn:idemgate:problem:upstream-timeout"
    );
    // Each detail says what a retry gets, and the retries below get it.
    for answer in [&reset, &timeout] {
        let detail = answer.json()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(detail.contains("502 outcome-unknown"), "{detail}");
    }
    for (path, key) in [("/v1/reset", "r1"), ("/v1/hang", "t1")] {
        let retry = post(&s.client, &s.gateway.url(path), key, "{}").await;
        assert_eq!(retry.status, StatusCode::BAD_GATEWAY, "{key}");
        assert_eq!(retry.problem_type(), "urn:idemgate:problem:outcome-unknown");
        assert_eq!(
            s.upstream.count(key),
            1,
            "a held key is never forwarded again"
        );
        if let Some(db) = s.store.pg_url() {
            assert_eq!(record_state(db, key).await.as_deref(), Some("held"));
        }
    }
}

async fn release_policy_lets_the_retry_through_after_reset_and_timeout(b: Backend) {
    let s = Setup::with(b, |config| {
        config.route(|r| {
            r.set("on_unknown_outcome", "release");
        })
    })
    .await;
    let reset = post(&s.client, &s.gateway.url("/v1/reset"), "r2", "{}").await;
    assert_eq!(reset.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        post(&s.client, &s.gateway.url("/v1/reset"), "r2", "{}")
            .await
            .status,
        StatusCode::BAD_GATEWAY
    );
    assert_eq!(s.upstream.count("r2"), 2);
    let timeout = post(&s.client, &s.gateway.url("/v1/hang"), "t2", "{}").await;
    assert_eq!(timeout.status, StatusCode::GATEWAY_TIMEOUT);
    let retry = post(&s.client, &s.gateway.url("/v1/hang"), "t2", "{}").await;
    assert_eq!(
        retry.status,
        StatusCode::GATEWAY_TIMEOUT,
        "released: forwarded again"
    );
    assert_eq!(s.upstream.count("t2"), 2);
}

async fn two_tenants_with_one_key_do_not_collide(b: Backend) {
    let s = Setup::with(b, |config| {
        config.route(|r| {
            r.set("scope_header", "Authorization");
        })
    })
    .await;
    let url = s.gateway.url("/v1/payments");
    let send_as = |who: &'static str, body: &'static str| {
        let (client, url) = (s.client.clone(), url.clone());
        async move {
            send(
                &client,
                "POST",
                &url,
                &[("idempotency-key", "shared"), ("authorization", who)],
                body,
            )
            .await
        }
    };
    let alice = send_as("Bearer alice", r#"{"a":1}"#).await;
    let bob = send_as("Bearer bob", r#"{"b":2}"#).await;
    assert_eq!(alice.status, StatusCode::CREATED);
    assert_eq!(
        bob.status,
        StatusCode::CREATED,
        "bob's key is his own, not a 422"
    );
    assert!(!bob.is_replay());
    assert_eq!(s.upstream.count("shared"), 2);
    let alice_again = send_as("Bearer alice", r#"{"a":1}"#).await;
    assert!(alice_again.is_replay());
    assert_eq!(alice_again.body, alice.body);
    // The scope is stored only as a digest.
    if let Some(db) = s.store.pg_url() {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(db)
            .await
            .unwrap();
        let scopes: Vec<Vec<u8>> = sqlx::query_scalar("SELECT scope FROM idemgate_records")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert!(
            scopes
                .iter()
                .all(|s| s.len() == 32 && !s.windows(5).any(|w| w == b"alice"))
        );
    }
}

async fn oversized_request_body_is_413(b: Backend) {
    let s = Setup::with(b, |config| {
        config.route(|r| {
            r.set("max_request_body", "1KiB");
        })
    })
    .await;
    let url = s.gateway.url("/v1/payments");
    let big = "x".repeat(1025);
    let reply = post(&s.client, &url, "big", &big).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(reply.problem_type(), "urn:idemgate:problem:body-too-large");
    assert_eq!(
        post(&s.client, &url, "fits", &"x".repeat(1024))
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(s.upstream.count("big"), 0);
}

async fn over_cap_response_is_forwarded_once_then_held(b: Backend) {
    let s = Setup::with(b, |config| {
        config.route(|r| {
            r.set("max_recorded_response", "1KiB");
        })
    })
    .await;
    let url = s.gateway.url("/v1/big/5000");
    let first = post(&s.client, &url, "huge", "{}").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        first.body.len(),
        5000,
        "the whole response is forwarded once"
    );
    let retry = post(&s.client, &url, "huge", "{}").await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert_eq!(
        retry.problem_type(),
        "urn:idemgate:problem:response-not-retained"
    );
    assert_eq!(s.upstream.count("huge"), 1);
    let small = post(&s.client, &s.gateway.url("/v1/big/1024"), "small", "{}").await;
    assert_eq!(small.body.len(), 1024);
    assert!(
        post(&s.client, &s.gateway.url("/v1/big/1024"), "small", "{}")
            .await
            .is_replay()
    );
}

async fn hop_by_hop_headers_never_reach_the_upstream(b: Backend) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = Setup::start(b).await;
    for method in ["POST", "GET"] {
        let mut tcp = tokio::net::TcpStream::connect(s.gateway.addr)
            .await
            .unwrap();
        let request = format!(
            "{method} /v1/payments HTTP/1.1\r\nHost: api.test\r\nIdempotency-Key: hop-{method}\r\n\
             Connection: close, X-Private-Hop\r\nX-Private-Hop: secret\r\nKeep-Alive: timeout=5\r\n\
             Proxy-Connection: keep-alive\r\nTE: trailers\r\nX-Kept: yes\r\nContent-Length: 2\r\n\r\n{{}}"
        );
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer).await.unwrap();
        assert!(
            answer.starts_with(b"HTTP/1.1 201"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        let h = s.upstream.last_headers();
        for hop in [
            "x-private-hop",
            "keep-alive",
            "proxy-connection",
            "te",
            "transfer-encoding",
            "upgrade",
        ] {
            assert!(
                !h.contains_key(hop),
                "{method}: {hop} reached the upstream: {h:?}"
            );
        }
        assert!(
            h.get("connection")
                .is_none_or(|v| !v.to_str().unwrap().contains("X-Private-Hop"))
        );
        assert_eq!(h["x-kept"], "yes");
    }
}

async fn lease_renewal_keeps_a_slow_request_from_being_taken_over(b: Backend) {
    // The upstream takes 3.5 s; the lease is 1 s. Without renewal, the
    // duplicate at 2.5 s would take the key over under `release`.
    let s = Setup::with(b, |config| {
        config.route(|r| {
            r.set("lease", "1s")
                .set("upstream_timeout", "10s")
                .set("on_unknown_outcome", "release");
        })
    })
    .await;
    let url = s.gateway.url("/v1/slow/3500");
    let (client, u) = (s.client.clone(), url.clone());
    let first = tokio::spawn(async move { post(&client, &u, "slow", "{}").await });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let duplicate = post(&s.client, &url, "slow", "{}").await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{duplicate:?}");
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.is_replay());
    assert_eq!(s.upstream.count("slow"), 1);
    assert!(post(&s.client, &url, "slow", "{}").await.is_replay());
}

async fn replay_drops_set_cookie_and_date_but_the_original_keeps_them(b: Backend) {
    let s = Setup::start(b).await;
    let url = s.gateway.url("/v1/payments");
    let first = post(&s.client, &url, "ck", "{}").await;
    assert_eq!(first.header("set-cookie"), Some("session=abc; HttpOnly"));
    let replay = post(&s.client, &url, "ck", "{}").await;
    assert!(replay.is_replay());
    assert_eq!(replay.header("set-cookie"), None);
    assert_eq!(replay.header("location"), first.header("location"));
    assert_eq!(replay.header("etag"), first.header("etag"));
}

async fn an_exchange_longer_than_retention_keeps_its_key(b: Backend) {
    // G1 even when retention is shorter than the upstream exchange.
    let s = Setup::with(b, |config| {
        config.route(|r| {
            r.set("lease", "1s")
                .set("retention", "1s")
                .set("upstream_timeout", "10s");
        })
    })
    .await;
    let url = s.gateway.url("/v1/slow/3000");
    let (client, u) = (s.client.clone(), url.clone());
    let first = tokio::spawn(async move { post(&client, &u, "long", "{}").await });
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let duplicate = post(&s.client, &url, "long", "{}").await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{duplicate:?}");
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(s.upstream.count("long"), 1);
}

per_backend!(
    an_exchange_longer_than_retention_keeps_its_key,
    replay_is_byte_exact_with_location_and_etag,
    same_key_different_request_is_422_and_never_forwarded,
    missing_and_invalid_keys_are_400,
    optional_key_route_passes_keyless_requests_through,
    quoted_and_bare_forms_are_one_key,
    unprotected_methods_pass_through_untouched,
    key_and_forwarding_headers_reach_the_upstream,
    storm_of_40_reaches_the_upstream_once,
    client_disconnect_mid_forward_is_recorded_and_replayed,
    upstream_500_and_429_release_but_400_is_recorded,
    upstream_reset_and_timeout_hold_the_key,
    release_policy_lets_the_retry_through_after_reset_and_timeout,
    two_tenants_with_one_key_do_not_collide,
    oversized_request_body_is_413,
    over_cap_response_is_forwarded_once_then_held,
    hop_by_hop_headers_never_reach_the_upstream,
    lease_renewal_keeps_a_slow_request_from_being_taken_over,
    replay_drops_set_cookie_and_date_but_the_original_keeps_them,
);

#[tokio::test]
async fn full_memory_store_answers_503_not_unbounded_growth() {
    let s = Setup::with(Backend::Memory, |config| {
        config.store(|s| {
            s.set("max_records", 2);
        })
    })
    .await;
    let (upstream, c) = (&s.upstream, &s.client);
    let url = s.gateway.url("/v1/payments");
    for key in ["m1", "m2"] {
        assert_eq!(post(c, &url, key, "{}").await.status, StatusCode::CREATED);
    }
    let full = post(c, &url, "m3", "{}").await;
    assert_eq!(full.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        full.problem_type(),
        "urn:idemgate:problem:store-unavailable"
    );
    assert!(full.header("retry-after").is_some());
    assert!(
        full.json()["detail"]
            .as_str()
            .unwrap()
            .contains("max_records")
    );
    assert_eq!(upstream.count("m3"), 0);
    assert!(post(c, &url, "m1", "{}").await.is_replay());
}

#[tokio::test]
async fn readiness_needs_a_migrated_database() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&db.url, &upstream.url());
    let unmigrated = config.clone().store(|s| {
        s.set("migrate", false);
    });
    let gateway = Gateway::start(&unmigrated).await;
    assert_eq!(gateway.readyz().await, StatusCode::SERVICE_UNAVAILABLE);
    let migrated = Gateway::start(&config).await;
    assert_eq!(migrated.readyz().await, StatusCode::OK);
    assert_eq!(
        gateway.readyz().await,
        StatusCode::OK,
        "ready once migrated"
    );
}

#[tokio::test]
async fn client_gone_during_the_claim_still_gets_forwarded_and_recorded() {
    use sqlx::Connection;
    let s = Setup::with(Backend::Postgres, |config| {
        config.store(|s| {
            s.set("timeout", "5s");
        })
    })
    .await;
    let (upstream, c) = (&s.upstream, &s.client);
    let url = s.gateway.url("/v1/payments");
    // Hold the table so the claim waits in the database.
    let mut conn = sqlx::PgConnection::connect(&s.store.url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("LOCK TABLE idemgate_records IN EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let (c2, u2) = (c.clone(), url.clone());
    let impatient = tokio::spawn(async move { post(&c2, &u2, "gone-early", "{}").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    impatient.abort(); // the client leaves while the claim waits
    tokio::time::sleep(Duration::from_millis(200)).await;
    tx.commit().await.unwrap();
    let replay = eventually(Duration::from_secs(10), || async {
        let r = post(c, &url, "gone-early", "{}").await;
        r.is_replay().then_some(r)
    })
    .await
    .expect("the claim went on to forward and record");
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(upstream.count("gone-early"), 1);
}

#[tokio::test]
async fn only_an_outage_fails_open() {
    use sqlx::Connection;
    let store = TestStore::new(Backend::Postgres).await;
    let upstream = Upstream::start().await;
    let fail_open = |config: TestConfig| {
        config.route(|r| {
            r.set("on_store_error", "fail_open");
        })
    };
    let gateway = Gateway::start(&fail_open(store.config(&upstream.url()))).await;
    let c = client();
    let url = gateway.url("/v1/payments");
    assert_eq!(
        post(&c, &url, "bent", "{}").await.status,
        StatusCode::CREATED
    );
    // A record this build cannot read: never a reason to forward again.
    let mut conn = sqlx::PgConnection::connect(&store.url).await.unwrap();
    sqlx::query("UPDATE idemgate_records SET headers = '\\x00ff'::bytea WHERE key = 'bent'")
        .execute(&mut conn)
        .await
        .unwrap();
    let reply = post(&c, &url, "bent", "{}").await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(reply.problem_type(), "urn:idemgate:problem:store-corrupt");
    assert_eq!(upstream.count("bent"), 1);

    // A full memory store under fail_open: refused, not bypassed.
    let memory = TestStore::new(Backend::Memory).await;
    let config = fail_open(memory.config(&upstream.url())).store(|s| {
        s.set("max_records", 1);
    });
    let small = Gateway::start(&config).await;
    assert_eq!(
        post(&c, &small.url("/v1/payments"), "f1", "{}")
            .await
            .status,
        StatusCode::CREATED
    );
    let full = post(&c, &small.url("/v1/payments"), "f2", "{}").await;
    assert_eq!(full.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(upstream.count("f2"), 0);
}

// The Redis store on a Redis Cluster: a same-key storm still reaches the
// upstream once (the claim's record and token counter share a hash slot).
per_backend!(only [redis_cluster]: storm_of_40_reaches_the_upstream_once);
