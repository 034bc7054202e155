//! G3 — mismatch: the same key with a different request (another body, another
//! path) is `422 key-reused` and never reaches the upstream; and where the
//! line runs: the same key under another scope (`scope_header`) is another
//! key, not a mismatch. On every store.

use http::StatusCode;

use crate::support::{Backend, Set, Setup, per_backend, post, send};

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

per_backend!(
    same_key_different_request_is_422_and_never_forwarded,
    two_tenants_with_one_key_do_not_collide,
);
