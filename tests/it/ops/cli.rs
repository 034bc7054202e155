//! The command line, run as the real binary: `check`, `serve` against an
//! unreachable store, `migrate`.

use std::time::Duration;

use sqlx::Connection;

use crate::support::process::{GatewayProcess, binary, free_port, run_command};
use crate::support::{Backend, Gateway, Set, TestConfig, TestDb, TestStore};

/// An upstream nobody listens on: these commands never forward.
const NO_UPSTREAM: &str = "http://127.0.0.1:9";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_rejects_unknown_key() {
    let store = "postgres://postgres@127.0.0.1:5432/postgres"; // never connected to
    let typo = TestConfig::new(store, NO_UPSTREAM).route(|r| {
        r.set("retension", "1h");
    });
    let (status, _, stderr) = run_command("check", &typo, Duration::from_secs(30)).await;
    assert!(!status.success(), "check accepted `retension`: {stderr}");
    assert!(stderr.contains("retension"), "stderr: {stderr}");

    let valid = TestConfig::new(store, NO_UPSTREAM).route(|r| {
        r.set("retention", "1h");
    });
    let (status, stdout, stderr) = run_command("check", &valid, Duration::from_secs(30)).await;
    assert!(
        status.success(),
        "check rejected a valid config: {stdout}{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_store_fails_at_startup_with_clear_message() {
    let config = TestConfig::new("postgres://postgres:s3cret@127.0.0.1:1/x", NO_UPSTREAM);
    let mut gateway = GatewayProcess::spawn("unreachable", &config);
    let status = gateway.wait(Duration::from_secs(30)).await;
    let (stdout, stderr) = (gateway.stdout(), gateway.stderr());
    let status = status.unwrap_or_else(|| {
        panic!("serve kept running without its store\n--- stderr ---\n{stderr}")
    });
    assert!(!status.success(), "serve exited 0 without its store");
    assert!(stderr.contains("cannot reach store"), "stderr: {stderr}");
    assert!(
        !stderr.contains("s3cret") && !stdout.contains("s3cret"),
        "the password leaked: {stdout}{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_applies_migrations() {
    let db = TestDb::new().await;
    assert!(
        !table_exists(&db.url).await,
        "a fresh database has no table"
    );

    let config = TestConfig::new(&db.url, NO_UPSTREAM);
    let (status, stdout, stderr) = run_command("migrate", &config, Duration::from_secs(45)).await;
    assert!(status.success(), "migrate failed: {stdout}{stderr}");
    assert!(
        table_exists(&db.url).await,
        "no idemgate_records after migrate"
    );

    // Running it again is harmless.
    let (status, stdout, stderr) = run_command("migrate", &config, Duration::from_secs(45)).await;
    assert!(
        status.success(),
        "a second migrate failed: {stdout}{stderr}"
    );
}

async fn table_exists(db_url: &str) -> bool {
    let mut conn = sqlx::PgConnection::connect(db_url).await.unwrap();
    let found: Option<String> = sqlx::query_scalar("SELECT to_regclass('idemgate_records')::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    found.is_some()
}

fn health(admin: &str) -> std::process::Output {
    std::process::Command::new(binary())
        .args(["health", "--admin", admin])
        .output()
        .expect("the binary runs")
}

#[tokio::test]
async fn health_exits_zero_when_healthy_and_non_zero_when_the_admin_port_is_closed() {
    let store = TestStore::new(Backend::Memory).await;
    let gateway = Gateway::start(&store.config(NO_UPSTREAM)).await;
    let admin = gateway.admin.to_string();
    let ok = tokio::task::spawn_blocking(move || health(&admin))
        .await
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("healthy"));

    let closed = format!("127.0.0.1:{}", free_port());
    let down = tokio::task::spawn_blocking(move || health(&closed))
        .await
        .unwrap();
    assert!(!down.status.success());
    assert!(String::from_utf8_lossy(&down.stderr).contains("cannot reach the admin listener"));
}

/// A missing config file: exit status 2 (a configuration the gateway
/// refuses), the OS's reason said once, and what to do.
#[tokio::test]
async fn a_missing_config_file_says_why_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(binary())
            .arg("--config")
            .arg(&missing)
            .arg("check")
            .output()
            .expect("the binary runs")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.matches("os error 2").count(), 1, "{stderr}");
    assert!(stderr.contains("--config"), "{stderr}");
}
