//! G2 — replay: once a response is recorded, a retry gets it byte for byte
//! (status, replayable headers, body) with `Idempotent-Replayed: true` and
//! without the upstream; which upstream answers are recorded (a `400`) and
//! which release the key (`500`, `429`); and a response over
//! `max_recorded_response`, forwarded once and never replayed; and the
//! `Idempotency-Expires` every recorded answer and its replays carry. On
//! every store.

use std::time::{Duration, SystemTime};

use http::StatusCode;

use crate::support::upstream::BINARY_BODY;
use crate::support::{Backend, Set, Setup, per_backend, post};

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

/// The instant an answer's `Idempotency-Expires` names.
fn expires(reply: &crate::support::Reply) -> Option<SystemTime> {
    let value = reply.header("idempotency-expires")?;
    Some(httpdate::parse_http_date(value).unwrap_or_else(|e| panic!("{value:?}: {e}")))
}

const ADMIN_TOKEN: &str = "g2-admin-token-0123456789";

/// Until when the store keeps the `api` route's record of `key`, as `keys
/// show --json` reads it (the admin API, with the test's token).
async fn store_expiry(s: &Setup, key: &str) -> SystemTime {
    let url = format!("http://{}/keys", s.gateway.admin);
    let command = format!(r#"{{"show": {{"route": "api", "key": "{key}", "json": true}}}}"#);
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let headers = [
        ("authorization", bearer.as_str()),
        ("content-type", "application/json"),
    ];
    let shown = crate::support::send(&s.client, "POST", &url, &headers, command).await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.text());
    let at = shown.json()["expires_at"].as_str().map(str::to_owned);
    let at = at.unwrap_or_else(|| panic!("no expires_at: {}", shown.text()));
    humantime::parse_rfc3339(&at).unwrap_or_else(|e| panic!("{at}: {e}"))
}

/// The answer that recorded a response, its replays, and the answer that
/// left a held record each say until when the record is kept: a retention
/// from the moment it was written, never later than the store keeps it
/// (whole seconds, rounded down). An answer that leaves no record says
/// nothing, nor does a route that is told not to.
async fn keyed_answers_say_until_when_their_record_is_kept(b: Backend) {
    let s = Setup::with(b, |config| {
        config
            .top(|t| {
                t.set("admin_token", ADMIN_TOKEN);
            })
            .route(|r| {
                r.set("retention", "1h")
                    .set("max_recorded_response", "1KiB");
            })
    })
    .await;
    let hour = Duration::from_secs(3600);
    let before = SystemTime::now();
    let first = post(&s.client, &s.gateway.url("/v1/payments"), "exp", "{}").await;
    let after = SystemTime::now();
    let until = expires(&first).expect("the recording answer names its expiry");
    assert!(
        until + Duration::from_secs(1) > before + hour,
        "{until:?} {before:?}"
    );
    assert!(until <= after + hour, "{until:?} {after:?}");
    // Never later than the store keeps the record, and within a second of it.
    let kept = store_expiry(&s, "exp").await;
    assert!(until <= kept, "announced {until:?}, kept until {kept:?}");
    assert!(
        kept < until + Duration::from_secs(2),
        "announced {until:?}, kept until {kept:?}"
    );
    let replay = post(&s.client, &s.gateway.url("/v1/payments"), "exp", "{}").await;
    assert!(replay.is_replay());
    assert_eq!(
        replay.header("idempotency-expires"),
        first.header("idempotency-expires"),
        "a replay names the record's own expiry"
    );

    let held = post(&s.client, &s.gateway.url("/v1/big/5000"), "exp-big", "{}").await;
    assert!(expires(&held).is_some(), "a held record is kept too");
    let released = post(&s.client, &s.gateway.url("/v1/status/500"), "exp-500", "{}").await;
    assert_eq!(released.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(expires(&released), None, "a released key has no record");
    let unkeyed =
        crate::support::send(&s.client, "GET", &s.gateway.url("/v1/payments"), &[], "").await;
    assert_eq!(expires(&unkeyed), None, "a pass-through has no record");

    let quiet = Setup::with(b, |config| {
        config.route(|r| {
            r.set("expires_header", false);
        })
    })
    .await;
    let url = quiet.gateway.url("/v1/payments");
    let first = post(&quiet.client, &url, "q", "{}").await;
    let replay = post(&quiet.client, &url, "q", "{}").await;
    assert!(replay.is_replay());
    assert_eq!((expires(&first), expires(&replay)), (None, None));
}

/// A refusal's `expires` member: the instant (RFC 3339) its record is kept
/// until.
fn expires_member(reply: &crate::support::Reply) -> SystemTime {
    let value = reply.json()["expires"].as_str().map(str::to_owned);
    let value = value.unwrap_or_else(|| panic!("no expires: {}", reply.text()));
    humantime::parse_rfc3339(&value).unwrap_or_else(|e| panic!("{value}: {e}"))
}

/// Each refusal about a record — `409` in flight, `422` for another body,
/// a held key's `409` — says until when the record is kept, in the
/// problem's `expires` and the `Idempotency-Expires` header alike: about a
/// retention from when it was written, never later than the store keeps
/// it. A route that announces no expiry keeps the member, not the header.
async fn refusals_say_until_when_their_record_is_kept(b: Backend) {
    let s = Setup::with(b, |config| {
        config
            .top(|t| {
                t.set("admin_token", ADMIN_TOKEN);
            })
            .route(|r| {
                r.set("retention", "1h")
                    .set("max_recorded_response", "1KiB");
            })
    })
    .await;
    let hour = Duration::from_secs(3600);
    let check = async |reply: &crate::support::Reply, key: &str, slug: &str| {
        assert_eq!(
            reply.problem_type(),
            format!("urn:idemgate:problem:{slug}"),
            "{}",
            reply.text()
        );
        let at = expires_member(reply);
        assert_eq!(
            expires(reply),
            Some(at),
            "the header names the same instant"
        );
        assert!(
            at + Duration::from_secs(5) > SystemTime::now() + hour,
            "{slug}: {at:?}"
        );
        let kept = store_expiry(&s, key).await;
        assert!(at <= kept, "{slug}: announced {at:?}, kept until {kept:?}");
    };
    let slow = s.gateway.url("/v1/slow/1500");
    let first = tokio::spawn({
        let (client, slow) = (s.client.clone(), slow.clone());
        async move { post(&client, &slow, "r-slow", "{}").await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let conflict = post(&s.client, &slow, "r-slow", "{}").await;
    assert_eq!(conflict.status, StatusCode::CONFLICT, "{}", conflict.text());
    check(&conflict, "r-slow", "in-flight").await;
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);

    let url = s.gateway.url("/v1/payments");
    assert_eq!(
        post(&s.client, &url, "r-done", "{}").await.status,
        StatusCode::CREATED
    );
    let reused = post(&s.client, &url, "r-done", r#"{"other":1}"#).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    check(&reused, "r-done", "key-reused").await;

    let big = s.gateway.url("/v1/big/5000");
    post(&s.client, &big, "r-big", "{}").await;
    let held = post(&s.client, &big, "r-big", "{}").await;
    assert_eq!(held.status, StatusCode::CONFLICT, "{}", held.text());
    check(&held, "r-big", "response-not-retained").await;

    let quiet = Setup::with(b, |config| {
        config.route(|r| {
            r.set("expires_header", false);
        })
    })
    .await;
    let url = quiet.gateway.url("/v1/payments");
    post(&quiet.client, &url, "q", "{}").await;
    let reused = post(&quiet.client, &url, "q", r#"{"other":1}"#).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    expires_member(&reused);
    assert_eq!(expires(&reused), None);
}

/// `record_body = false`: the record keeps the status and headers only; a
/// replay answers them with an empty body and without the headers that
/// describe one, and an answer over `max_recorded_response` is recorded
/// too (its size no longer matters), never held.
async fn a_route_that_records_no_body_replays_status_and_headers(b: Backend) {
    let s = Setup::with(b, |config| {
        config.route(|r| {
            r.set("record_body", false)
                .set("max_recorded_response", "1KiB");
        })
    })
    .await;
    let url = s.gateway.url("/v1/binary");
    let first = post(&s.client, &url, "nb", "{}").await;
    assert_eq!(&first.body[..], BINARY_BODY);
    let replay = post(&s.client, &url, "nb", "{}").await;
    assert!(replay.is_replay());
    assert_eq!(replay.status, first.status);
    assert!(replay.body.is_empty(), "{:?}", replay.body);
    assert_eq!(replay.header("content-type"), None);
    assert_eq!(replay.header("location"), first.header("location"));
    assert_eq!(replay.header("etag"), first.header("etag"));
    assert_eq!(s.upstream.count("nb"), 1);

    let url = s.gateway.url("/v1/big/5000");
    let big = post(&s.client, &url, "nb-big", "{}").await;
    assert_eq!((big.status, big.body.len()), (StatusCode::OK, 5000));
    let again = post(&s.client, &url, "nb-big", "{}").await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text());
    assert!(again.is_replay() && again.body.is_empty());
    assert_eq!(s.upstream.count("nb-big"), 1);
}

per_backend!(
    keyed_answers_say_until_when_their_record_is_kept,
    refusals_say_until_when_their_record_is_kept,
    a_route_that_records_no_body_replays_status_and_headers,
    replay_is_byte_exact_with_location_and_etag,
    replay_drops_set_cookie_and_date_but_the_original_keeps_them,
    upstream_500_and_429_release_but_400_is_recorded,
    over_cap_response_is_forwarded_once_then_held,
);
