//! Sealed records through the gateway (`[store] encryption_keys`,
//! docs/src/operations/protecting-stored-responses.md): the key material
//! reaches no log line (at debug level), no metric and no `check` output;
//! a malformed key stops the start naming its entry; a record under a key
//! no longer configured, or a row copied from another record, is answered
//! with its problem and never forwarded; a record sealed with either
//! codec replays after `[store] compression` is switched, either way; and
//! the bytes a payment object takes in the store, plain and sealed.

use std::time::Duration;

use http::StatusCode;
use toml::Value;

use crate::support::process::{GatewayProcess, refuses_to_start};
use crate::support::{
    Backend, Gateway, Set, Setup, TestConfig, TestStore, Upstream, client, per_backend, post,
    sample, send,
};

/// Two keys for the tests: 32 bytes each, base64.
pub(crate) const K1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
pub(crate) const K2: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";

/// The realistic record the tests seal: a PaymentIntent of about 2 KiB.
pub(crate) use idemgate::store::seal::fixture::payment_intent;

fn keys(entries: &[&str]) -> Value {
    Value::from(entries.iter().map(|e| e.to_string()).collect::<Vec<_>>())
}

fn with_keys(config: TestConfig, entries: &[&str]) -> TestConfig {
    let entries = keys(entries);
    config.store(|s| {
        s.set("encryption_keys", entries);
    })
}

/// The key material in every form it could leak in: as configured, and
/// its bytes in hex.
fn leaks(text: &str) -> bool {
    // K1's bytes are 0, 1, 2, … 31.
    text.contains(K1) || text.contains(&K1[..20]) || text.contains("000102030405060708090a0b")
}

/// The real binary with its key from the environment, logging at debug
/// level: the replay is byte-identical and the key is in no log line, no
/// metric and not in `check`'s output.
#[tokio::test]
async fn keys_reach_no_log_metric_or_check_output() {
    let store = TestStore::new(Backend::Sqlite).await;
    let upstream = Upstream::start().await;
    let config = with_keys(
        store.config(&upstream.url()),
        &["k1:${IDEMGATE_TEST_RECORD_KEY}"],
    );
    let env = [("IDEMGATE_TEST_RECORD_KEY", K1), ("RUST_LOG", "debug")];
    let gateway = GatewayProcess::start_with_env("sealed-logs", &config, &env).await;
    let c = client();
    let url = gateway.url("/v1/payments");
    let first = post(&c, &url, "sealed-1", "{\"amount\":1}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = post(&c, &url, "sealed-1", "{\"amount\":1}").await;
    assert!(again.is_replay(), "{again:?}");
    assert_eq!(again.status, first.status);
    assert_eq!(again.body, first.body);
    // (`set-cookie` and `date` are not replayed: `replay_headers`.)
    for name in ["location", "etag", "content-type"] {
        assert_eq!(again.header(name), first.header(name), "{name}");
    }
    assert_eq!(upstream.count("sealed-1"), 1);

    let metrics = send(&c, "GET", &gateway.admin_url("/metrics"), &[], "").await;
    let metrics = metrics.text();
    assert_eq!(
        sample(&metrics, "idemgate_sealed_replays_total{key_id=\"k1\"}"),
        1.0
    );
    assert!(!leaks(&metrics), "the key is in /metrics");
    let log = gateway.stderr();
    assert!(log.contains("DEBUG"), "not at debug level:\n{log}");
    assert!(!leaks(&log), "the key is in the log:\n{log}");

    let mut check = GatewayProcess::spawn_with_env("sealed-check", "check", &config, &env);
    let status = check
        .wait(Duration::from_secs(30))
        .await
        .expect("check ends");
    let (out, err) = (check.stdout(), check.stderr());
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("OK"), "{out}");
    assert!(!leaks(&out) && !leaks(&err), "the key is in check's output");
}

/// A malformed key stops `serve` and `check`, naming the entry and its id,
/// never its material; so does a duplicate id.
#[tokio::test]
async fn a_malformed_key_is_refused_by_name() {
    let store = TestStore::new(Backend::Memory).await;
    let short = &K2[..24];
    for (entries, named) in [
        (
            [format!("k1:{K1}"), format!("k2:{short}")],
            "store.encryption_keys[1]",
        ),
        (
            [format!("k1:{K1}"), format!("k1:{K2}")],
            "key id \"k1\" is listed twice",
        ),
    ] {
        let entries: Vec<&str> = entries.iter().map(String::as_str).collect();
        let config = with_keys(store.config("http://127.0.0.1:9"), &entries);
        let stderr = refuses_to_start("sealed-malformed", &config).await;
        assert!(stderr.contains(named), "{stderr}");
        for material in [K1, K2, short] {
            assert!(!stderr.contains(material), "{stderr}");
        }
        let mut check = GatewayProcess::spawn_command("sealed-check-bad", "check", &config);
        let status = check
            .wait(Duration::from_secs(30))
            .await
            .expect("check ends");
        let shown = format!("{}{}", check.stdout(), check.stderr());
        assert!(!status.success() && shown.contains(named), "{shown}");
        assert!(!shown.contains(K1) && !shown.contains(short), "{shown}");
    }
}

/// A reload refuses a malformed key as a start does, never showing it,
/// and reports a changed key list as waiting for a restart (the running
/// keys stay in force).
#[tokio::test]
async fn a_reload_refuses_a_malformed_key_and_waits_for_a_restart() {
    const TOKEN: &str = "sealed-reload-token-0123";
    let k1 = format!("k1:{K1}");
    let setup = Setup::with(Backend::Sqlite, |c| {
        with_keys(c, &[&k1]).top(|t| {
            t.set("admin_token", TOKEN);
        })
    })
    .await;
    let short = &K2[..24];
    let broken = with_keys(setup.config.clone(), &[&k1, &format!("k2:{short}")]);
    setup.gateway.rewrite(&broken.to_string());
    let (status, answer) = setup.gateway.reload(Some(TOKEN)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let error = answer["error"].as_str().unwrap();
    assert!(error.contains("store.encryption_keys[1]"), "{error}");
    assert!(
        !error.contains(short) && !answer.to_string().contains(K1),
        "{answer}"
    );

    let rotated = with_keys(setup.config.clone(), &[&format!("k2:{K2}"), &k1]);
    setup.gateway.rewrite(&rotated.to_string());
    let (status, answer) = setup.gateway.reload(Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["restart_required"],
        serde_json::json!(["store.encryption_keys"])
    );
    assert!(!answer.to_string().contains(K2), "{answer}");
}

/// A second gateway on the same store, with `entries`.
async fn another(setup: &Setup, entries: &[&str]) -> Gateway {
    Gateway::start(&with_keys(setup.config.clone(), entries)).await
}

/// Rotation and a missing key, through gateways sharing one store: what
/// `[k1]` recorded replays under `[k2, k1]`; under `[k2]` alone, or with
/// no key at all, it is a `500 record-key-unknown` naming k1, counted,
/// and never forwarded.
async fn rotation_and_a_missing_key(b: Backend) {
    let k1 = format!("k1:{K1}");
    let k2 = format!("k2:{K2}");
    let setup = Setup::with(b, |c| with_keys(c, &[&k1])).await;
    let url = |g: &Gateway| g.url("/v1/payments");
    let first = post(&setup.client, &url(&setup.gateway), "rot-1", "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);

    let dropped = another(&setup, &[&k2]).await;
    let refused = post(&setup.client, &url(&dropped), "rot-1", "{}").await;
    assert_eq!(refused.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        refused.problem_type(),
        "urn:idemgate:problem:record-key-unknown"
    );
    assert!(refused.text().contains("\\\"k1\\\""), "{}", refused.text());
    let series = "idemgate_sealed_unopened_total{reason=\"unknown_key\",key_id=\"k1\"}";
    assert_eq!(sample(&dropped.metrics().await, series), 1.0);

    let keyless = setup.config.clone().store(|s| {
        s.remove("encryption_keys");
    });
    let keyless = Gateway::start(&keyless).await;
    let refused = post(&setup.client, &url(&keyless), "rot-1", "{}").await;
    assert_eq!(
        refused.problem_type(),
        "urn:idemgate:problem:record-key-unknown"
    );

    let rotated = another(&setup, &[&k2, &k1]).await;
    let replay = post(&setup.client, &url(&rotated), "rot-1", "{}").await;
    assert!(replay.is_replay(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(setup.upstream.count("rot-1"), 1);
    for gateway in [dropped, keyless, rotated] {
        gateway.shutdown().await;
    }
}

/// The admin token of the `keys show` tests' gateways.
const ADMIN_TOKEN: &str = "sealed-admin-token-0123456789";

/// `entries` as the keys, and the admin token set.
fn keyed(config: TestConfig, entries: &[&str]) -> TestConfig {
    with_keys(config, entries).top(|t| {
        t.set("admin_token", ADMIN_TOKEN);
    })
}

/// `POST /keys` show of `key` on route `api`, through `gateway`'s admin
/// listener: as JSON, or as the text `keys show` prints.
async fn show(gateway: &Gateway, key: &str, json: bool) -> crate::support::Reply {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let body = serde_json::json!({"show": {"route": "api", "key": key, "json": json}});
    let url = format!("http://{}/keys", gateway.admin);
    let reply = send(
        &client(),
        "POST",
        &url,
        &[("authorization", bearer.as_str())],
        body.to_string(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply
}

/// `keys show` on a sealed record names its key id and tells the recorded
/// status and body size (opened with the gateway's keys), not the
/// envelope's (200, and its own size); a plain record shows no key id
/// (through a gateway with keys, where the store is shared).
async fn keys_show_tells_a_sealed_record(b: Backend) {
    let setup = Setup::with(b, |c| keyed(c, &[&format!("k1:{K1}")])).await;
    let url = setup.gateway.url("/v1/payments");
    let first = post(&setup.client, &url, "shown-1", "{\"amount\":1}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let shown = show(&setup.gateway, "shown-1", true).await.json();
    assert_eq!(shown["state"], "completed", "{shown}");
    assert_eq!(shown["sealed_with"], "k1", "{shown}");
    assert_eq!(shown["opened"], true, "{shown}");
    assert_eq!(shown["status"], 201, "{shown}");
    assert_eq!(shown["body_bytes"], first.body.len() as u64, "{shown}");
    assert!(shown.get("open_error").is_none(), "{shown}");
    let text = show(&setup.gateway, "shown-1", false).await.text();
    assert!(text.contains("sealed   with key id \"k1\"\n"), "{text}");
    assert!(
        text.contains(&format!("response 201, {} bytes", first.body.len())),
        "{text}"
    );

    // The control: a record written without keys.
    let keyless = Gateway::start(&setup.config.clone().store(|s| {
        s.remove("encryption_keys");
    }))
    .await;
    let plain = post(&setup.client, &keyless.url("/v1/payments"), "plain-1", "{}").await;
    assert_eq!(plain.status, StatusCode::CREATED);
    // Memory's records live in each gateway: the keyless one shows its own.
    let shower = if b == Backend::Memory {
        &keyless
    } else {
        &setup.gateway
    };
    let shown = show(shower, "plain-1", true).await.json();
    assert_eq!(shown["status"], 201, "{shown}");
    assert_eq!(shown["body_bytes"], plain.body.len() as u64, "{shown}");
    for absent in ["sealed_with", "opened", "open_error"] {
        assert!(shown.get(absent).is_none(), "{absent}: {shown}");
    }
    assert!(
        !show(shower, "plain-1", false)
            .await
            .text()
            .contains("sealed")
    );
    keyless.shutdown().await;
}

/// `keys show` on a record sealed under a key since removed names that key
/// id and says it does not open, rather than failing (or showing the
/// envelope's status); a record under a key still configured opens.
async fn keys_show_names_a_removed_key(b: Backend) {
    let setup = Setup::with(b, |c| keyed(c, &[&format!("k0:{K1}")])).await;
    let url = setup.gateway.url("/v1/payments");
    let old = post(&setup.client, &url, "under-k0", "{}").await;
    assert_eq!(old.status, StatusCode::CREATED);
    let rotated = Gateway::start(&keyed(setup.config.clone(), &[&format!("k1:{K2}")])).await;
    let new = post(
        &setup.client,
        &rotated.url("/v1/payments"),
        "under-k1",
        "{}",
    )
    .await;
    assert_eq!(new.status, StatusCode::CREATED);

    let shown = show(&rotated, "under-k0", true).await.json();
    assert_eq!(shown["state"], "completed", "{shown}");
    assert_eq!(shown["sealed_with"], "k0", "{shown}");
    assert_eq!(shown["opened"], false, "{shown}");
    assert_eq!(shown["open_error"], "unknown_key", "{shown}");
    assert!(shown["status"].is_null(), "not the envelope's: {shown}");
    assert!(shown["body_bytes"].is_null(), "not the envelope's: {shown}");
    let text = show(&rotated, "under-k0", false).await.text();
    assert!(
        text.contains("sealed   with key id \"k0\", which does not open"),
        "{text}"
    );
    assert!(!text.contains("response"), "{text}");

    let control = show(&rotated, "under-k1", true).await.json();
    assert_eq!(control["sealed_with"], "k1", "{control}");
    assert_eq!(control["opened"], true, "{control}");
    assert_eq!(control["status"], 201, "{control}");
    rotated.shutdown().await;
}

mod keys_show {
    use super::keys_show_tells_a_sealed_record;
    crate::support::per_backend!(
        only [postgres, redis, redis_cluster, sqlite, memory, front]:
        keys_show_tells_a_sealed_record,
    );
}

/// A memory store's records do not outlive the gateway whose keys change.
mod keys_show_removed_key {
    use super::keys_show_names_a_removed_key;
    crate::support::per_backend!(
        only [postgres, redis, redis_cluster, sqlite, front]:
        keys_show_names_a_removed_key,
    );
}

/// One record's row copied onto another's, in the database itself: that
/// key is answered `500 record-unauthentic`, never with the other
/// record's response, and never forwarded.
async fn a_copied_row_is_refused(b: Backend) {
    let setup = Setup::with(b, |c| with_keys(c, &[&format!("k1:{K1}")])).await;
    let url = setup.gateway.url("/v1/payments");
    for key in ["copy-a", "copy-b"] {
        let reply = post(&setup.client, &url, key, &format!("{{\"k\":\"{key}\"}}")).await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    let copy = "UPDATE idemgate_records SET status = o.status, headers = o.headers, body = o.body \
                FROM (SELECT status, headers, body FROM idemgate_records WHERE key = 'copy-b') o \
                WHERE key = 'copy-a'";
    let changed = match b {
        Backend::Postgres => {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&setup.store.url).await.unwrap();
            sqlx::query(copy)
                .execute(&mut conn)
                .await
                .unwrap()
                .rows_affected()
        }
        Backend::Sqlite => {
            use sqlx::Connection;
            let mut conn = sqlx::SqliteConnection::connect(&setup.store.url)
                .await
                .unwrap();
            sqlx::query(copy)
                .execute(&mut conn)
                .await
                .unwrap()
                .rows_affected()
        }
        other => panic!("no rows to copy on {other:?}"),
    };
    assert_eq!(changed, 1);
    let fresh = Gateway::start(&setup.config).await;
    let refused = post(
        &setup.client,
        &fresh.url("/v1/payments"),
        "copy-a",
        "{\"k\":\"copy-a\"}",
    )
    .await;
    assert_eq!(refused.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        refused.problem_type(),
        "urn:idemgate:problem:record-unauthentic"
    );
    let series = "idemgate_sealed_unopened_total{reason=\"unauthentic\",key_id=\"k1\"}";
    assert_eq!(sample(&fresh.metrics().await, series), 1.0);
    assert_eq!(setup.upstream.count("copy-a"), 1);
    fresh.shutdown().await;
}

/// `[store] compression` switched, through gateways sharing one store:
/// what a gateway sealing with zstd recorded replays byte-identical from
/// one sealing with LZ4, and the other way round, and so does what one
/// with `compress = false` recorded; nothing is forwarded twice. The
/// control that each gateway compressed with its own codec: the sealed
/// values of one response differ in size as the codecs do.
async fn a_codec_switch_replays_either_way(b: Backend) {
    let k1 = format!("k1:{K1}");
    let codec = |name: &'static str| {
        let k1 = k1.clone();
        move |c: TestConfig| {
            with_keys(c, &[&k1]).store(|s| {
                s.set("replay_cache_ttl", "0s");
                if name == "none" {
                    s.set("compress", false);
                } else {
                    s.set("compression", name);
                }
            })
        }
    };
    let setup = Setup::with(b, codec("zstd")).await;
    let lz4 = Gateway::start(&codec("lz4")(setup.store.config(&setup.upstream.url()))).await;
    let none = Gateway::start(&codec("none")(setup.store.config(&setup.upstream.url()))).await;
    let gateways = [("zstd", &setup.gateway), ("lz4", &lz4), ("none", &none)];
    // 4,000 bytes the upstream answers: well past the 128 that compress.
    let path = "/v1/big/4000";
    let mut first = Vec::new();
    for (name, gateway) in gateways {
        let key = format!("by-{name}");
        let reply = post(&setup.client, &gateway.url(path), &key, "{}").await;
        assert_eq!(reply.status, StatusCode::OK, "{name}");
        assert_eq!(reply.body.len(), 4000);
        first.push((key, reply));
    }
    for (key, recorded) in &first {
        for (reader, gateway) in gateways {
            let again = post(&setup.client, &gateway.url(path), key, "{}").await;
            assert!(again.is_replay(), "{key} through {reader}: {again:?}");
            assert_eq!(again.status, recorded.status, "{key} through {reader}");
            assert_eq!(again.body, recorded.body, "{key} through {reader}");
        }
        assert_eq!(setup.upstream.count(key), 1, "{key}");
    }
    // What each gateway left in the store: LZ4's longer than zstd's, both
    // far shorter than the uncompressed one.
    let store = setup.store.open().await;
    let mut sealed = std::collections::HashMap::new();
    for info in store
        .list("api", idemgate::store::RecordState::Completed, 10)
        .await
        .unwrap()
    {
        let stored = store
            .recorded(&info.record_key().unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            idemgate::store::seal::sealed_with(&stored).as_deref(),
            Some("k1")
        );
        sealed.insert(info.key, stored.body.len());
    }
    let size = |name: &str| sealed[&format!("by-{name}")];
    assert!(
        size("zstd") < size("lz4") && size("lz4") * 10 < size("none"),
        "{sealed:?}"
    );
    for gateway in [lz4, none] {
        gateway.shutdown().await;
    }
}

per_backend!(only [postgres, redis, sqlite, front]: rotation_and_a_missing_key);

/// A memory store's records do not outlive the gateway that holds them.
mod codec_switch {
    use super::a_codec_switch_replays_either_way;
    crate::support::per_backend!(
        only [postgres, redis, sqlite, front]:
        a_codec_switch_replays_either_way,
    );
}
/// The stores with rows to copy in SQL (the store-level suite copies a
/// sealed value on every store: tests/it/stores/sealed.rs).
mod copied_row {
    use super::{Backend, a_copied_row_is_refused};

    #[tokio::test]
    async fn postgres() {
        a_copied_row_is_refused(Backend::Postgres).await;
    }

    #[tokio::test]
    async fn sqlite() {
        a_copied_row_is_refused(Backend::Sqlite).await;
    }
}
