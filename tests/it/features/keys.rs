//! `idemgate keys show|list|release|delete` (the real binary) against a
//! real gateway's records, on PostgreSQL and on Redis.

use std::process::Output;
use std::time::Duration;

use http::StatusCode;

use crate::support::process::{binary, free_port};
use crate::support::{
    Backend, Reply, Set, Setup, TestConfig, eventually, per_backend, sample, send,
};

fn keys(config_path: &std::path::Path, args: &[&str]) -> Output {
    std::process::Command::new(binary())
        .arg("--config")
        .arg(config_path)
        .arg("keys")
        .args(args)
        .output()
        .expect("the binary runs")
}

pub(super) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `idemgate keys …` on a running gateway's configuration file.
pub(super) struct Cli {
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Cli {
    /// The CLI reads the gateway's file; for memory:// it goes through
    /// the gateway's admin listener.
    pub(super) fn of(s: &Setup) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        let cli_config = s.config.clone().top(|t| {
            t.set("admin_listen", s.gateway.admin.to_string());
        });
        std::fs::write(&path, cli_config.to_string()).unwrap();
        Self { path, _dir: dir }
    }

    /// `idemgate keys ARGS…`, off the runtime's threads.
    pub(super) fn run(&self, args: &[&str]) -> impl Future<Output = Output> + use<> {
        let path = self.path.clone();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        async move {
            tokio::task::spawn_blocking(move || {
                keys(&path, &args.iter().map(String::as_str).collect::<Vec<_>>())
            })
            .await
            .unwrap()
        }
    }
}

/// The admin token of these tests' gateways (at least 16 characters).
const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// The admin token set, and the `api` route scoped by `Authorization`.
pub(super) fn scoped_by_authorization(config: TestConfig) -> TestConfig {
    config
        .top(|t| {
            t.set("admin_token", ADMIN_TOKEN);
        })
        .route(|r| {
            r.set("scope_header", "Authorization");
        })
}

async fn keys_commands_fix_a_held_key(backend: Backend) {
    let s = Setup::with(backend, scoped_by_authorization).await;
    let (upstream, gateway, c) = (&s.upstream, &s.gateway, &s.client);
    let cli = Cli::of(&s);
    let run = |args: &[&str]| cli.run(args);
    // `keys COMMAND… --route api --scope "Bearer alice" KEY`
    let alice = |command: &[&str], key: &str| {
        let mut args = command.to_vec();
        args.extend(["--route", "api", "--scope", "Bearer alice", key]);
        run(&args)
    };
    let as_alice = [
        ("authorization", "Bearer alice"),
        ("idempotency-key", "stuck"),
    ];
    // A timed-out exchange leaves the key held.
    let first = send(c, "POST", &gateway.url("/v1/hang"), &as_alice, "{}").await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    let done = [
        ("authorization", "Bearer alice"),
        ("idempotency-key", "done"),
    ];
    assert_eq!(
        send(c, "POST", &gateway.url("/v1/payments"), &done, "{}")
            .await
            .status,
        StatusCode::CREATED
    );

    let show = alice(&["show"], "stuck").await;
    assert!(show.status.success(), "{}", stderr(&show));
    // Commands other than serve log only warnings unless RUST_LOG asks.
    assert!(!stderr(&show).contains("INFO"), "{}", stderr(&show));
    let text = stdout(&show);
    assert!(text.contains("held (upstream_timeout)"), "{text}");
    assert!(text.contains("scope    sha256:"), "{text}");
    assert!(
        !text.contains("alice"),
        "the scope value is never shown: {text}"
    );

    let json = alice(&["show", "--json"], "\"done\"").await;
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON output");
    assert_eq!(v["state"], "completed");
    assert_eq!(v["status"], 201);
    assert!(v["body_bytes"].as_u64().unwrap() > 0);

    let wrong_scope = run(&["show", "--route", "api", "--scope", "Bearer bob", "stuck"]).await;
    assert_eq!(
        wrong_scope.status.code(),
        Some(3),
        "not found has its own status"
    );
    assert!(
        stderr(&wrong_scope).contains("no record"),
        "{}",
        stderr(&wrong_scope)
    );

    let list = run(&["list", "--route", "api", "--state", "held"]).await;
    assert!(list.status.success(), "{}", stderr(&list));
    assert!(
        stdout(&list).contains("stuck") && !stdout(&list).contains("done"),
        "{}",
        stdout(&list)
    );
    let list = run(&["list", "--route", "api", "--state", "held", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1);

    let refused = alice(&["release"], "done").await;
    assert!(
        !refused.status.success(),
        "release leaves a completed key alone"
    );
    assert!(stderr(&refused).contains("keys delete"));

    // Held: never forwarded again, until released.
    let retry = send(c, "POST", &gateway.url("/v1/hang"), &as_alice, "{}").await;
    assert_eq!(retry.status, StatusCode::BAD_GATEWAY);
    let release = alice(&["release"], "stuck").await;
    assert!(release.status.success(), "{}", stderr(&release));
    let after = send(c, "POST", &gateway.url("/v1/hang"), &as_alice, "{}").await;
    assert_eq!(
        after.status,
        StatusCode::GATEWAY_TIMEOUT,
        "forwarded again after release"
    );
    assert_eq!(upstream.count("stuck"), 2);

    // Delete forgets a recorded response: the next request is forwarded.
    let delete = alice(&["delete"], "done").await;
    assert!(delete.status.success(), "{}", stderr(&delete));
    let again = send(c, "POST", &gateway.url("/v1/payments"), &done, "{}").await;
    assert!(!again.is_replay());
    assert_eq!(upstream.count("done"), 2);

    // A live lease is kept unless forced: its attempt may be at the upstream.
    let flying = [
        ("authorization", "Bearer alice"),
        ("idempotency-key", "flying"),
    ];
    let (c2, slow) = (c.clone(), gateway.url("/v1/slow/1500"));
    let pending = tokio::spawn(async move { send(&c2, "POST", &slow, &flying, "{}").await });
    eventually(std::time::Duration::from_secs(5), || async {
        (upstream.count("flying") == 1).then_some(())
    })
    .await
    .unwrap();
    let kept = alice(&["release"], "flying").await;
    assert!(!kept.status.success());
    assert!(
        stderr(&kept).contains("in flight") && stderr(&kept).contains("--force"),
        "{}",
        stderr(&kept)
    );
    let forced = alice(&["release", "--force"], "flying").await;
    assert!(forced.status.success(), "{}", stderr(&forced));
    assert_eq!(
        pending.await.unwrap().status,
        StatusCode::BAD_GATEWAY,
        "its answer can no longer be recorded"
    );

    let unknown = run(&["show", "--route", "nope", "x"]).await;
    assert!(stderr(&unknown).contains("no route named"));
    assert_eq!(unknown.status.code(), Some(1), "{}", stderr(&unknown));

    // One key used by two tenants lists as two records, told apart by scope.
    let as_bob = [("authorization", "Bearer bob"), ("idempotency-key", "done")];
    let bobs = send(c, "POST", &gateway.url("/v1/payments"), &as_bob, "{}").await;
    assert_eq!(bobs.status, StatusCode::CREATED);
    let list = run(&["list", "--route", "api", "--state", "completed"]).await;
    let text = stdout(&list);
    let rows: Vec<&str> = text.lines().filter(|l| l.ends_with(" done")).collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(
        text.lines().next().unwrap_or_default().contains("SCOPE"),
        "{text}"
    );
    let scope_of = |row: &str| {
        row.split_whitespace()
            .nth(3)
            .unwrap_or_default()
            .to_string()
    };
    assert!(scope_of(rows[0]).starts_with("sha256:"), "{text}");
    assert_ne!(scope_of(rows[0]), scope_of(rows[1]), "{text}");
}

// On memory:// the CLI goes through the gateway's admin listener, with the
// config's admin_token.
per_backend!(keys_commands_fix_a_held_key);

/// [`scoped_by_authorization`], and a second route like `api`: `orders`,
/// on `/v2/*`.
pub(super) fn two_scoped_routes(config: TestConfig) -> TestConfig {
    scoped_by_authorization(config).routes(|routes| {
        let mut orders = routes[0].as_table().expect("a route").clone();
        orders.set("name", "orders").set("match", "/v2/*");
        routes.push(toml::Value::Table(orders));
    })
}

/// `keys erase` (the real binary) removes one tenant's records on both
/// routes that read its scope from `Authorization`, by its value and by the
/// digest `keys show` prints: its keys are forwarded again, another
/// tenant's replay until their own erasure.
async fn keys_erase_forgets_one_tenant_on_every_route(backend: Backend) {
    let s = Setup::with(backend, two_scoped_routes).await;
    let (upstream, gateway, c) = (&s.upstream, &s.gateway, &s.client);
    let cli = Cli::of(&s);
    let run = |args: &[&str]| cli.run(args);
    let post = |who: &'static str, path: &'static str, key: &'static str| async move {
        let headers = [("authorization", who), ("idempotency-key", key)];
        send(c, "POST", &gateway.url(path), &headers, "{}").await
    };
    // Alice's records replayed once (the gateway's replay cache holds
    // them); Bob's never.
    for (who, path, key) in [
        ("Bearer alice", "/v1/payments", "a-pay"),
        ("Bearer alice", "/v2/orders", "a-order"),
    ] {
        assert_eq!(post(who, path, key).await.status, StatusCode::CREATED);
        assert!(post(who, path, key).await.is_replay(), "{who} {key}");
    }
    let bob = post("Bearer bob", "/v1/payments", "b-pay").await;
    assert_eq!(bob.status, StatusCode::CREATED);

    // Through the gateway's admin API (authenticated), which also drops
    // the erased records from that gateway's replay cache.
    let erase = admin_keys(&s, r#"{"erase": {"scope": "Bearer alice"}}"#).await;
    assert_eq!(erase.status, StatusCode::OK);
    let text = String::from_utf8_lossy(&erase.body).into_owned();
    assert!(text.contains("route \"api\": removed 1 record\n"), "{text}");
    assert!(
        text.contains("route \"orders\": removed 1 record\n"),
        "{text}"
    );
    assert!(text.contains("erased: 2 records removed"), "{text}");
    assert!(
        !text.contains("alice"),
        "the scope value is never shown: {text}"
    );
    let again = post("Bearer alice", "/v1/payments", "a-pay").await;
    assert!(!again.is_replay(), "forwarded again after the erasure");
    assert!(
        !post("Bearer alice", "/v2/orders", "a-order")
            .await
            .is_replay()
    );
    assert_eq!((upstream.count("a-pay"), upstream.count("a-order")), (2, 2));

    // Bob's record is untouched; erased by the digest `keys show` prints,
    // with the CLI (on PostgreSQL, SQLite and Redis it reaches the store
    // itself; Bob's record was never replayed, so no replay cache has it).
    let show = run(&["show", "--route", "api", "--scope", "Bearer bob", "b-pay"]).await;
    assert!(show.status.success(), "{}", stderr(&show));
    let shown = stdout(&show);
    let digest = shown
        .lines()
        .find_map(|l| l.strip_prefix("scope    "))
        .unwrap_or_else(|| panic!("no scope line: {shown}"))
        .to_string();
    let by_digest = run(&["erase", "--scope-digest", &digest]).await;
    assert!(by_digest.status.success(), "{}", stderr(&by_digest));
    let text = stdout(&by_digest);
    assert!(text.contains("route \"api\": removed 1 record\n"), "{text}");
    assert!(
        text.contains("route \"orders\": removed 0 records\n"),
        "{text}"
    );
    assert!(
        !post("Bearer bob", "/v1/payments", "b-pay")
            .await
            .is_replay()
    );
    assert_eq!(upstream.count("b-pay"), 2);
    // Alice's records since her erasure stay.
    assert!(
        post("Bearer alice", "/v1/payments", "a-pay")
            .await
            .is_replay()
    );

    // Neither form, or both: refused before anything is removed.
    let both = run(&["erase", "--scope", "x", "--scope-digest", &digest]).await;
    assert!(!both.status.success());

    let bad = run(&["erase", "--scope-digest", "sha256:abc"]).await;
    assert_eq!(bad.status.code(), Some(1), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("not a scope digest"),
        "{}",
        stderr(&bad)
    );
    assert!(
        !stderr(&bad).contains("abc"),
        "what was given is not echoed: {}",
        stderr(&bad)
    );
    let neither = run(&["erase"]).await;
    assert!(!neither.status.success());
}

mod erasure {
    use super::keys_erase_forgets_one_tenant_on_every_route;
    crate::support::per_backend!(
        only [postgres, redis, redis_cluster, sqlite, memory, front]:
        keys_erase_forgets_one_tenant_on_every_route,
    );
}

/// `POST /keys` with `body` on `s`'s admin listener, with the admin token.
pub(super) async fn admin_keys(s: &Setup, body: impl Into<bytes::Bytes>) -> Reply {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    send(
        &s.client,
        "POST",
        &format!("http://{}/keys", s.gateway.admin),
        &[("authorization", bearer.as_str())],
        body,
    )
    .await
}

/// `POST /keys` on the admin listener deletes keys: refused without a
/// configured token (403) and without the right one (401); health and
/// metrics stay open.
#[tokio::test]
async fn the_admin_keys_endpoint_requires_the_token() {
    let delete = r#"{"delete": {"route": "api", "key": "done"}}"#;
    let with_token = Setup::with(Backend::Memory, |config| {
        config.top(|t| {
            t.set("admin_token", ADMIN_TOKEN);
        })
    })
    .await;
    let (gateway, c) = (&with_token.gateway, &with_token.client);
    let done = [("idempotency-key", "done")];
    let first = send(c, "POST", &gateway.url("/v1/payments"), &done, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let keys_url = format!("http://{}/keys", gateway.admin);
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    for (headers, expected) in [
        (vec![], StatusCode::UNAUTHORIZED),
        (
            vec![("authorization", "Bearer wrong-token-0123456789")],
            StatusCode::UNAUTHORIZED,
        ),
        (
            vec![("authorization", ADMIN_TOKEN)],
            StatusCode::UNAUTHORIZED,
        ),
    ] {
        let refused = send(c, "POST", &keys_url, &headers, delete).await;
        assert_eq!(refused.status, expected, "{headers:?}");
        assert!(refused.headers.contains_key("www-authenticate"));
        let problem: serde_json::Value = serde_json::from_slice(&refused.body).unwrap();
        assert_eq!(problem["type"], "urn:idemgate:problem:admin-unauthorized");
    }
    // Nothing was deleted: the retry is still a replay.
    let retry = send(c, "POST", &gateway.url("/v1/payments"), &done, "{}").await;
    assert!(retry.is_replay());
    let allowed = send(
        c,
        "POST",
        &keys_url,
        &[("authorization", bearer.as_str())],
        delete,
    )
    .await;
    assert_eq!(
        allowed.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&allowed.body)
    );
    let forwarded = send(c, "POST", &gateway.url("/v1/payments"), &done, "{}").await;
    assert!(!forwarded.is_replay());

    // No token configured: key administration over HTTP is off.
    let without = Setup::start(Backend::Memory).await;
    let url = format!("http://{}/keys", without.gateway.admin);
    let off = send(
        &without.client,
        "POST",
        &url,
        &[("authorization", bearer.as_str())],
        delete,
    )
    .await;
    assert_eq!(off.status, StatusCode::FORBIDDEN);
    assert_eq!(off.header("content-type"), Some("application/problem+json"));
    assert!(
        String::from_utf8_lossy(&off.body).contains("admin_token"),
        "{}",
        String::from_utf8_lossy(&off.body)
    );
    for open in ["/healthz", "/readyz", "/metrics"] {
        let url = format!("http://{}{open}", without.gateway.admin);
        assert_eq!(
            send(&without.client, "GET", &url, &[], "").await.status,
            StatusCode::OK,
            "{open}"
        );
    }
}

#[tokio::test]
async fn keys_on_memory_without_a_running_gateway_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let closed = free_port();
    let config = TestConfig::new("memory://", "http://127.0.0.1:9").top(|t| {
        t.set("admin_listen", format!("127.0.0.1:{closed}"));
    });
    std::fs::write(&path, config.to_string()).unwrap();
    let out = tokio::task::spawn_blocking(move || keys(&path, &["show", "--route", "api", "k"]))
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("memory:// store lives inside the gateway"),
        "{}",
        stderr(&out)
    );
}

// show, list, release and delete on a Redis Cluster.
per_backend!(only [redis_cluster]: keys_commands_fix_a_held_key);

/// A forced erasure wakes a duplicate waiting on an in-flight record it
/// removes (as a forced `keys release` does): the duplicate claims again
/// at once, not at its next poll (the lease's end, seconds later).
#[tokio::test]
async fn a_forced_erasure_wakes_the_waiters() {
    let s = Setup::with(Backend::Redis, |config| {
        scoped_by_authorization(config).route(|r| {
            r.set("concurrent", "wait").set("wait_timeout", "5s");
        })
    })
    .await;
    let (gateway, c) = (&s.gateway, &s.client);
    let url = gateway.url("/v1/payments");
    let request = |delay: &'static str| {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move {
            let headers = [
                ("authorization", "Bearer alice"),
                ("idempotency-key", "flying"),
                (crate::support::upstream::DELAY_HEADER, delay),
            ];
            send(&c, "POST", &url, &headers, "{}").await
        })
    };
    let first = request("1900");
    s.upstream.arrived("flying").await;
    let duplicate = request("0");
    let waiting = eventually(Duration::from_secs(10), || async {
        (sample(&gateway.metrics().await, "idemgate_waiting") >= 1.0).then_some(())
    })
    .await;
    assert!(waiting.is_some(), "the duplicate never waited");

    let erase = admin_keys(&s, r#"{"erase": {"scope": "Bearer alice", "force": true}}"#).await;
    assert_eq!(erase.status, StatusCode::OK);
    let erased = std::time::Instant::now();
    let answer = duplicate.await.unwrap();
    assert!(
        erased.elapsed() < Duration::from_millis(1000),
        "the waiter answered {:?} after the erasure: {}",
        erased.elapsed(),
        answer.text()
    );
    let metrics = gateway.metrics().await;
    assert!(
        sample(&metrics, "idemgate_wait_wakeups_total{cause=\"store\"}") >= 1.0,
        "{metrics}"
    );
    first.await.unwrap();
}
