//! The lookup's contract (docs/src/guide/status-inquiry.md, "The contract
//! your lookup must keep"), case by case, against the real gateway and the
//! test upstream, which keeps that contract: a quoted key and a composite
//! key are asked by the value idemgate keeps; two tenants with one key are
//! each settled by their own answer; the keys `.` and `..` stay one path
//! segment; the question carries the fence (`Idempotency-Attempt`) that a
//! `404` stands behind; `202` settles nothing; an original `4xx` is
//! conveyed; the lookup's own metadata is never replayed.

use std::time::Duration;

use http::StatusCode;

use super::inquiry::inquiring;
use crate::support::upstream::{KEY_PARTS_HEADER, Lookup, TENANT_HEADER};
use crate::support::{
    Backend, Gateway, HttpClient, Reply, Set, TestStore, Upstream, client, eventually, per_backend,
    send,
};

/// POST `headers` (and `{}`) until the answer is no longer `409
/// outcome-pending` (at most 20 s).
async fn settled(c: &HttpClient, url: &str, headers: &[(&str, &str)]) -> Reply {
    eventually(Duration::from_secs(20), || async {
        let reply = send(c, "POST", url, headers, "{}").await;
        (reply.status != StatusCode::CONFLICT).then_some(reply)
    })
    .await
    .expect("the key settles within 20 s")
}

/// A replay of what the lookup said about the key's one execution, with
/// none of the lookup's own metadata.
fn assert_lookup_replay(reply: &Reply, status: StatusCode) {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert!(reply.is_replay(), "{}", reply.text());
    assert_eq!(reply.json()["times"], 1, "{}", reply.text());
    for header in ["etag", "cache-control", "content-location", "set-cookie"] {
        assert!(
            reply.header(header).is_none(),
            "the lookup's {header} was replayed as the POST's: {:?}",
            reply.headers
        );
    }
    assert!(reply.header("idempotency-original-status").is_none());
}

/// `Idempotency-Key: "q-1"` is the key `q-1`; the upstream keeps the
/// value, and the lookup is asked for it: one execution, a replay. The
/// route's `replay_headers` replaces the deny list (no `set-cookie`), and
/// the lookup's own cookie is still not replayed.
async fn a_quoted_key_is_asked_by_its_value(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let config = inquiring(&store, &upstream, "20s").route(|r| {
        r.set("replay_headers", vec!["date".to_string()]);
    });
    let gateway = Gateway::start(&config).await;
    let (c, url) = (client(), gateway.url("/v1/reset"));
    let headers = [("idempotency-key", "\"q-1\"")];
    let broken = send(&c, "POST", &url, &headers, "{}").await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY, "{}", broken.text());
    assert_lookup_replay(&settled(&c, &url, &headers).await, StatusCode::OK);
    assert_eq!(upstream.executions_per_key()["q-1"].len(), 1);
    assert_eq!(upstream.lookups("q-1"), 1);
    gateway.shutdown().await;
}

/// Two key parts: the key is their RFC 8941 list (`"saga-7", "3"`), which
/// the upstream computes from the same headers.
async fn a_composite_key_is_asked_by_its_list(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let config = inquiring(&store, &upstream, "20s").route(|r| {
        r.set(
            "key_from",
            vec!["header:X-Saga".to_string(), "header:X-Step".to_string()],
        );
    });
    let gateway = Gateway::start(&config).await;
    let (c, url) = (client(), gateway.url("/v1/reset"));
    let headers = [
        ("x-saga", "saga-7"),
        ("x-step", "3"),
        (KEY_PARTS_HEADER, "x-saga,x-step"),
    ];
    let broken = send(&c, "POST", &url, &headers, "{}").await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY, "{}", broken.text());
    assert_lookup_replay(&settled(&c, &url, &headers).await, StatusCode::OK);
    let key = "\"saga-7\", \"3\"";
    assert_eq!(upstream.executions_per_key()[key].len(), 1);
    assert_eq!(upstream.lookups(key), 1);
    gateway.shutdown().await;
}

/// One key, two tenants on a scoped route: tenant a's request acted, b's
/// never did. Each is settled by its own answer: a replay for a, a
/// forward for b, one execution each.
async fn two_tenants_with_one_key_get_their_own_answers(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let url = format!("{}/v1/idempotency/{{key}}?scope={{scope}}", upstream.url());
    let config = inquiring(&store, &upstream, "20s").route(|r| {
        r.set("scope_header", "X-Tenant");
        r["inquiry"].as_table_mut().unwrap().set("url", url);
    });
    let gateway = Gateway::start(&config).await;
    let c = client();
    let tenant = |t| [("idempotency-key", "shared"), (TENANT_HEADER, t)];
    let (acted, dropped) = (gateway.url("/v1/reset"), gateway.url("/v1/drop-once"));
    for (url, t) in [(&acted, "a"), (&dropped, "b")] {
        let broken = send(&c, "POST", url, &tenant(t), "{}").await;
        assert_eq!(
            broken.status,
            StatusCode::BAD_GATEWAY,
            "{t}: {}",
            broken.text()
        );
    }
    assert_lookup_replay(&settled(&c, &acted, &tenant("a")).await, StatusCode::OK);
    let forwarded = settled(&c, &dropped, &tenant("b")).await;
    assert_eq!(
        forwarded.status,
        StatusCode::CREATED,
        "{}",
        forwarded.text()
    );
    assert!(!forwarded.is_replay());
    let executions = &upstream.executions_per_key()["shared"];
    assert_eq!(executions.len(), 2, "{executions:?}");
    assert_ne!(executions[0].scope, executions[1].scope);
    gateway.shutdown().await;
}

/// The keys `.` and `..` would be dot-segments in the lookup's path, which
/// a normalising upstream resolves (even percent-encoded) to the lookup's
/// own or parent resource: refused (`400`) before anything is claimed or
/// forwarded, while `...` is an ordinary key.
async fn dot_segment_keys_are_refused_where_they_would_be_a_segment(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&inquiring(&store, &upstream, "20s")).await;
    let (c, url) = (client(), gateway.url("/v1/reset"));
    for key in [".", "..", "\"..\"", "a/../../admin"] {
        let refused = send(&c, "POST", &url, &[("idempotency-key", key)], "{}").await;
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{key}: {}",
            refused.text()
        );
        assert_eq!(refused.problem_type(), "urn:idemgate:problem:invalid-key");
        assert!(
            refused.text().contains("path segment"),
            "{}",
            refused.text()
        );
    }
    assert_eq!(
        upstream.total(),
        0,
        "a dot-segment key reached the upstream"
    );
    let headers = [("idempotency-key", "...")];
    let broken = send(&c, "POST", &url, &headers, "{}").await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY, "{}", broken.text());
    assert_lookup_replay(&settled(&c, &url, &headers).await, StatusCode::OK);
    assert_eq!(upstream.lookups("..."), 1);
    gateway.shutdown().await;
}

/// The question carries a token at least the forward's; the upstream's
/// `404` fences every attempt up to it, so the original request arriving
/// late is refused, and the retry (a newer token) is executed once.
async fn a_not_found_stands_behind_the_questions_fence(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&inquiring(&store, &upstream, "20s")).await;
    let (c, url) = (client(), gateway.url("/v1/drop-once"));
    let headers = [("idempotency-key", "late")];
    let broken = send(&c, "POST", &url, &headers, "{}").await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY, "{}", broken.text());
    let token =
        |h: http::HeaderMap| -> u64 { h["idempotency-attempt"].to_str().unwrap().parse().unwrap() };
    let forwarded = token(upstream.last_headers());
    let retry = settled(&c, &url, &headers).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.text());
    let fence = token(upstream.last_lookup_headers());
    assert!(fence >= forwarded, "question {fence} < forward {forwarded}");
    // The original attempt, arriving only now: refused, not executed.
    let attempt = forwarded.to_string();
    let late = [
        ("idempotency-key", "late"),
        ("idempotency-attempt", &attempt),
    ];
    let refused = send(
        &c,
        "POST",
        &format!("{}/v1/pay", upstream.url()),
        &late,
        "{}",
    )
    .await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert_eq!(upstream.refused(), 1);
    assert_eq!(upstream.executions_per_key()["late"].len(), 1);
    gateway.shutdown().await;
}

/// `202 Accepted` (still processing) settles nothing: asked again, then
/// the final answer is replayed.
async fn still_processing_is_asked_again(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    upstream.lookup(Lookup::AcceptedFirst(1));
    let gateway = Gateway::start(&inquiring(&store, &upstream, "20s")).await;
    let (c, url) = (client(), gateway.url("/v1/reset"));
    let headers = [("idempotency-key", "busy")];
    send(&c, "POST", &url, &headers, "{}").await;
    assert_lookup_replay(&settled(&c, &url, &headers).await, StatusCode::OK);
    assert_eq!(upstream.lookups("busy"), 2);
    gateway.shutdown().await;
}

/// An original `422` (recorded on this route) conveyed by the lookup's
/// `Idempotency-Original-Status`: the replay is that `422`.
async fn an_original_client_error_is_conveyed(b: Backend) {
    let store = TestStore::new(b).await;
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&inquiring(&store, &upstream, "20s")).await;
    let (c, url) = (client(), gateway.url("/v1/reset/original/422"));
    let headers = [("idempotency-key", "refused")];
    send(&c, "POST", &url, &headers, "{}").await;
    let replay = settled(&c, &url, &headers).await;
    assert_lookup_replay(&replay, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.executions_per_key()["refused"].len(), 1);
    gateway.shutdown().await;
}

per_backend!(
    only [postgres, redis, sqlite, memory, front]:
    a_quoted_key_is_asked_by_its_value,
    a_composite_key_is_asked_by_its_list,
    two_tenants_with_one_key_get_their_own_answers,
    dot_segment_keys_are_refused_where_they_would_be_a_segment,
    a_not_found_stands_behind_the_questions_fence,
    still_processing_is_asked_again,
    an_original_client_error_is_conveyed,
);
