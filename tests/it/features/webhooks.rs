//! Keys from anywhere in the request: the worked routes of
//! docs/src/guide/webhooks.md for webhook senders and brokers, each with a realistic
//! payload and a redelivery that differs the way the provider's does (new
//! signature and timestamp headers, Pub/Sub's `deliveryAttempt`). Every
//! redelivery must be answered from the record with the upstream acting
//! once; on every store.

use http::StatusCode;
use toml::{Table, Value};

use crate::support::process::binary;
use crate::support::upstream::{DELAY_HEADER, KEY_LABEL_HEADER};
use crate::support::{Backend, Set, Setup, per_backend, send};

/// A route's `key_from`, `scope_from` and fingerprint settings, on `api`.
fn route(
    key_from: &[&str],
    scope_from: &[&str],
    fingerprint: Option<(&str, &[&str])>,
) -> impl FnOnce(crate::support::TestConfig) -> crate::support::TestConfig {
    let key_from: Vec<String> = key_from.iter().map(|s| s.to_string()).collect();
    let scope_from: Vec<String> = scope_from.iter().map(|s| s.to_string()).collect();
    let fingerprint = fingerprint.map(|(body, exclude)| {
        let mut table = Table::new();
        table.set("body", body).set(
            "exclude",
            Value::Array(exclude.iter().map(|s| Value::from(*s)).collect()),
        );
        table
    });
    move |config| {
        config.route(|r| {
            r.set("key_from", key_from);
            if !scope_from.is_empty() {
                r.set("scope_from", scope_from);
            }
            if let Some(fingerprint) = fingerprint {
                r.set("fingerprint", fingerprint);
            }
        })
    }
}

/// Deliver, redeliver (other headers, maybe another body), and check the
/// redelivery is the first answer replayed, the upstream acting once.
async fn delivered_once(
    s: &Setup,
    path: &str,
    first: (&[(&str, &str)], &str),
    again: (&[(&str, &str)], &str),
) {
    let url = s.gateway.url(path);
    let one = send(&s.client, "POST", &url, first.0, first.1.to_string()).await;
    assert_eq!(one.status, StatusCode::CREATED, "{}", one.text());
    assert!(!one.is_replay());
    let two = send(&s.client, "POST", &url, again.0, again.1.to_string()).await;
    assert_eq!(two.status, StatusCode::CREATED, "{}", two.text());
    assert!(
        two.is_replay(),
        "the redelivery is answered from the record"
    );
    assert_eq!(two.body, one.body);
    assert_eq!(s.upstream.total(), 1, "the upstream acted once");
}

const GITHUB_PUSH: &str = r#"{"ref":"refs/heads/main","before":"6113728f27ae82c7b1a177c8d03f9e96e0adf246","after":"0000000000000000000000000000000000000000","repository":{"id":186853002,"full_name":"octocat/Hello-World"},"pusher":{"name":"octocat"},"sender":{"login":"octocat","id":1}}"#;

async fn github_redelivery_with_a_new_signature_is_replayed(b: Backend) {
    let s = Setup::with(b, route(&["header:X-GitHub-Delivery"], &[], None)).await;
    let delivery = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    let first = [
        ("x-github-delivery", delivery),
        ("x-github-event", "push"),
        ("x-github-hook-id", "292430182"),
        (
            "x-hub-signature-256",
            "sha256=d57c68ca6f92289e6987922ff26938930f6e66a2d161ef06abdf1859230aa23c",
        ),
        ("content-type", "application/json"),
    ];
    let mut again = first;
    again[3].1 = "sha256=0a5b8d6b0b1b0c6e0f3b0c1e1a8c1f0e3b8d0a1c1e0f3b8d0a1c1e0f3b8d0a1c";
    delivered_once(
        &s,
        "/v1/github",
        (&first, GITHUB_PUSH),
        (&again, GITHUB_PUSH),
    )
    .await;
}

async fn standard_webhooks_redelivery_is_replayed(b: Backend) {
    let s = Setup::with(b, route(&["header:webhook-id"], &[], None)).await;
    let body =
        r#"{"type":"invoice.paid","timestamp":"2026-11-23T10:00:00Z","data":{"id":"inv_1"}}"#;
    let first = [
        ("webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"),
        ("webhook-timestamp", "1763892000"),
        (
            "webhook-signature",
            "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
        ),
    ];
    let again = [
        ("webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"),
        ("webhook-timestamp", "1763892305"),
        (
            "webhook-signature",
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ),
    ];
    delivered_once(&s, "/v1/svix", (&first, body), (&again, body)).await;
}

async fn shopify_redelivery_is_replayed(b: Backend) {
    let s = Setup::with(b, route(&["header:X-Shopify-Webhook-Id"], &[], None)).await;
    let body = r#"{"id":820982911946154508,"email":"jon@example.com","total_price":"403.00"}"#;
    let first = [
        (
            "x-shopify-webhook-id",
            "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
        ),
        ("x-shopify-topic", "orders/create"),
        (
            "x-shopify-hmac-sha256",
            "XWmrwMey6OsLMeiZKwP4FppHH3cmAiiJJAweH5Jo4bM=",
        ),
        ("x-shopify-triggered-at", "2026-11-23T10:00:00.000Z"),
    ];
    let mut again = first;
    again[2].1 = "Nm6QUyA4MH0IsPU8O3yvxSXJ/SFBtjBuWn5kk6VEF4Q=";
    again[3].1 = "2026-11-23T10:05:00.000Z";
    delivered_once(&s, "/v1/shopify", (&first, body), (&again, body)).await;
}

const STRIPE_EVENT: &str = r#"{
  "id": "evt_1NG8Du2eZvKYlo2CUI79vXWy",
  "object": "event",
  "api_version": "2023-10-16",
  "created": 1686089970,
  "data": {"object": {"id": "pi_3NG8Dt2eZvKYlo2C0zuS7ljB", "object": "payment_intent", "amount": 2000, "currency": "usd", "status": "succeeded"}},
  "livemode": false,
  "pending_webhooks": 1,
  "request": {"id": null, "idempotency_key": null},
  "type": "payment_intent.succeeded"
}"#;

async fn stripe_event_keyed_by_its_body_id_is_replayed(b: Backend) {
    let s = Setup::with(b, route(&["json:/id"], &[], Some(("json", &[])))).await;
    let first = [(
        "stripe-signature",
        "t=1686089970,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd",
    )];
    let again = [(
        "stripe-signature",
        "t=1686090270,v1=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39",
    )];
    // A redelivery's body may be serialised differently: the JSON
    // fingerprint does not care.
    let reformatted: String = STRIPE_EVENT.split_whitespace().collect::<Vec<_>>().join("");
    delivered_once(
        &s,
        "/v1/stripe",
        (&first, STRIPE_EVENT),
        (&again, &reformatted),
    )
    .await;
}

fn pubsub_push(subscription: &str, attempt: u32) -> String {
    format!(
        r#"{{"message":{{"attributes":{{"key":"value"}},"data":"SGVsbG8gQ2xvdWQgUHViL1N1YiEgSGVyZSBpcyBteSBtZXNzYWdlIQ==","messageId":"2070443601311540","message_id":"2070443601311540","publishTime":"2021-02-26T19:13:55.749Z","publish_time":"2021-02-26T19:13:55.749Z"}},"subscription":"{subscription}","deliveryAttempt":{attempt}}}"#
    )
}

async fn pubsub_push_redelivery_is_replayed_per_subscription(b: Backend) {
    let s = Setup::with(
        b,
        route(
            &["json:/message/messageId"],
            &["json:/subscription"],
            Some(("json", &["/deliveryAttempt"])),
        ),
    )
    .await;
    let orders = "projects/myproject/subscriptions/orders";
    let first = pubsub_push(orders, 1);
    let again = pubsub_push(orders, 2);
    delivered_once(&s, "/v1/pubsub", (&[], &first), (&[], &again)).await;
    // The same message id on another subscription is another key.
    let other = pubsub_push("projects/myproject/subscriptions/audit", 1);
    let reply = send(&s.client, "POST", &s.gateway.url("/v1/pubsub"), &[], other).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert!(!reply.is_replay());
    assert_eq!(s.upstream.total(), 2);
}

const SNS_NOTIFICATION: &str = r#"{
  "Type" : "Notification",
  "MessageId" : "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324",
  "TopicArn" : "arn:aws:sns:us-west-2:123456789012:MyTopic",
  "Subject" : "My First Message",
  "Message" : "Hello world!",
  "Timestamp" : "2012-05-02T00:54:06.655Z",
  "SignatureVersion" : "1",
  "Signature" : "EXAMPLEw6JRN...",
  "SigningCertURL" : "https://sns.us-west-2.amazonaws.com/SimpleNotificationService-f3ecfb7224c7233fe7bb5f59f96de52f.pem",
  "UnsubscribeURL" : "https://sns.us-west-2.amazonaws.com/?Action=Unsubscribe&SubscriptionArn=arn:aws:sns:us-west-2:123456789012:MyTopic:c9135db0-26c4-47ec-8998-413945fb5a96"
}"#;

async fn sns_notification_redelivery_is_replayed(b: Backend) {
    let s = Setup::with(b, route(&["json:/MessageId"], &[], Some(("json", &[])))).await;
    let headers = [
        ("x-amz-sns-message-type", "Notification"),
        (
            "x-amz-sns-message-id",
            "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324",
        ),
        ("content-type", "text/plain; charset=UTF-8"),
    ];
    delivered_once(
        &s,
        "/v1/sns",
        (&headers, SNS_NOTIFICATION),
        (&headers, SNS_NOTIFICATION),
    )
    .await;
}

async fn saga_steps_are_keyed_by_saga_and_step(b: Backend) {
    let s = Setup::with(b, route(&["header:X-Saga-Id", "json:/step"], &[], None)).await;
    let url = s.gateway.url("/v1/saga");
    let saga = [("x-saga-id", "saga-7f3a")];
    let step = |n: u32| format!(r#"{{"step":{n},"action":"reserve-stock","order":"ord_1"}}"#);
    let one = send(&s.client, "POST", &url, &saga, step(1)).await;
    let two = send(&s.client, "POST", &url, &saga, step(2)).await;
    assert_eq!(
        (one.status, two.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!two.is_replay(), "another step is another key");
    let retry = send(&s.client, "POST", &url, &saga, step(1)).await;
    assert!(retry.is_replay());
    assert_eq!(retry.body, one.body);
    // The same step of another saga is another key too.
    let other = send(&s.client, "POST", &url, &[("x-saga-id", "saga-9")], step(1)).await;
    assert!(!other.is_replay());
    assert_eq!(s.upstream.total(), 3);
}

/// Senders retry non-2xx answers with backoff: an in-flight duplicate gets
/// `409` with `Retry-After`, and its later redelivery the recorded 2xx.
async fn an_in_flight_redelivery_gets_409_with_retry_after(b: Backend) {
    let s = Setup::with(b, route(&["json:/id"], &[], Some(("json", &[])))).await;
    let url = s.gateway.url("/v1/stripe");
    // The ledger knows this route's requests by a label (their key is in
    // the body).
    let slow = [(DELAY_HEADER, "1500"), (KEY_LABEL_HEADER, "evt")];
    let first = {
        let (client, url) = (s.client.clone(), url.clone());
        tokio::spawn(async move { send(&client, "POST", &url, &slow, STRIPE_EVENT).await })
    };
    s.upstream.arrived("evt").await;
    let duplicate = send(&s.client, "POST", &url, &[], STRIPE_EVENT).await;
    assert_eq!(
        duplicate.status,
        StatusCode::CONFLICT,
        "a duplicate while the first is at the upstream gets 409"
    );
    assert!(duplicate.header("retry-after").is_some());
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let later = send(&s.client, "POST", &url, &[], STRIPE_EVENT).await;
    assert_eq!(later.status, StatusCode::CREATED);
    assert!(later.is_replay());
    assert_eq!(s.upstream.total(), 1);
}

async fn body_key_parts_that_are_absent_or_unusable_are_400_naming_the_part(b: Backend) {
    let s = Setup::with(b, route(&["json:/message/messageId"], &[], None)).await;
    let url = s.gateway.url("/v1/pubsub");
    let missing = send(&s.client, "POST", &url, &[], r#"{"message":{}}"#).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.problem_type(), "urn:idemgate:problem:missing-key");
    assert!(
        missing.text().contains("json:/message/messageId"),
        "{}",
        missing.text()
    );
    for (body, why) in [
        ("not json", "not JSON"),
        (r#"{"message":{"messageId":{"a":1}}}"#, "an object"),
        (r#"{"message":{"messageId":null}}"#, "null"),
        (r#"{"message":{"messageId":1.5}}"#, "fraction"),
        (r#"{"message":{"messageId":""}}"#, "empty"),
    ] {
        let reply = send(&s.client, "POST", &url, &[], body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(
            reply.problem_type(),
            "urn:idemgate:problem:invalid-key",
            "{body}"
        );
        let text = reply.text();
        assert!(
            text.contains("json:/message/messageId") && text.contains(why),
            "{body}: {text}"
        );
    }
    assert_eq!(s.upstream.total(), 0, "nothing invalid was forwarded");
    // An integer id is a key.
    let int = send(
        &s.client,
        "POST",
        &url,
        &[],
        r#"{"message":{"messageId":42}}"#,
    )
    .await;
    assert_eq!(int.status, StatusCode::CREATED);
}

async fn an_optional_body_key_that_is_absent_passes_the_body_through(b: Backend) {
    let s = Setup::with(b, |config| {
        route(&["json:/id"], &[], None)(config).route(|r| {
            r.set("key_required", false);
        })
    })
    .await;
    let url = s.gateway.url("/v1/events");
    let body = r#"{"no":"id here"}"#;
    for _ in 0..2 {
        let reply = send(&s.client, "POST", &url, &[], body).await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert!(!reply.is_replay());
    }
    assert_eq!(s.upstream.total(), 2, "no key: forwarded every time");
    let executions = s.upstream.executions();
    assert_eq!(
        executions[0].body,
        crate::support::upstream::digest(body.as_bytes()),
        "the buffered body reached the upstream intact"
    );
}

/// `keys show|delete --part … --part …` name a composite key.
async fn keys_commands_address_composite_keys(b: Backend) {
    let s = Setup::with(b, |config| {
        route(&["header:X-Saga-Id", "json:/step"], &[], None)(config).top(|t| {
            t.set("admin_token", "test-admin-token-0123456789");
        })
    })
    .await;
    let url = s.gateway.url("/v1/saga");
    let saga = [("x-saga-id", "saga-7f3a")];
    let body = r#"{"step":3}"#;
    assert_eq!(
        send(&s.client, "POST", &url, &saga, body).await.status,
        StatusCode::CREATED
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let cli = s.config.clone().top(|t| {
        t.set("admin_listen", s.gateway.admin.to_string());
    });
    std::fs::write(&path, cli.to_string()).unwrap();
    let keys = |args: &'static [&'static str]| {
        let path = path.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(binary())
                .arg("--config")
                .arg(&path)
                .arg("keys")
                .args(args)
                .output()
                .expect("the binary runs")
        })
    };
    let show = keys(&[
        "show",
        "--route",
        "api",
        "--part",
        "saga-7f3a",
        "--part",
        "3",
        "--json",
    ])
    .await
    .unwrap();
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(v["state"], "completed");
    assert_eq!(v["key"], r#""saga-7f3a", "3""#);
    let one = keys(&["show", "--route", "api", "saga-7f3a"])
        .await
        .unwrap();
    assert!(!one.status.success());
    let err = String::from_utf8_lossy(&one.stderr);
    assert!(
        err.contains("--part") && err.contains("json:/step"),
        "{err}"
    );
    let delete = keys(&[
        "delete",
        "--route",
        "api",
        "--part",
        "saga-7f3a",
        "--part",
        "3",
    ])
    .await
    .unwrap();
    assert!(
        delete.status.success(),
        "{}",
        String::from_utf8_lossy(&delete.stderr)
    );
    let again = send(&s.client, "POST", &url, &saga, body).await;
    assert!(!again.is_replay(), "deleted: forwarded again");
    assert_eq!(s.upstream.total(), 2);
}

per_backend!(
    github_redelivery_with_a_new_signature_is_replayed,
    standard_webhooks_redelivery_is_replayed,
    shopify_redelivery_is_replayed,
    stripe_event_keyed_by_its_body_id_is_replayed,
    pubsub_push_redelivery_is_replayed_per_subscription,
    sns_notification_redelivery_is_replayed,
    saga_steps_are_keyed_by_saga_and_step,
    an_in_flight_redelivery_gets_409_with_retry_after,
    body_key_parts_that_are_absent_or_unusable_are_400_naming_the_part,
    an_optional_body_key_that_is_absent_passes_the_body_through,
    keys_commands_address_composite_keys,
);
