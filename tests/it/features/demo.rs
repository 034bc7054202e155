//! The shipped demo upstream (src/bin/demo_upstream.rs) behind the real
//! gateway, as the status inquiry chapter's "Try it" runs it: a transfer
//! with a quoted key (`Idempotency-Key: "t-1"`, the IETF draft's form)
//! whose upstream is killed mid-request and restarted from its ledger is
//! settled by the lookup, with one payment.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use http::StatusCode;

use crate::support::{Backend, Gateway, Set, TestStore, client, eventually, per_backend, send};

/// The demo upstream's binary, which `cargo test` builds with the package.
fn demo_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_demo_upstream"))
}

/// The demo upstream on `listen`, keeping its ledger in `ledger`; its
/// address, from the line it prints first.
fn start_demo(listen: &str, ledger: &Path) -> (Child, String) {
    let mut child = Command::new(demo_binary())
        .args(["--listen", listen, "--ledger"])
        .arg(ledger)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", demo_binary().display()));
    let mut line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdout.read_line(&mut line).unwrap();
    // Drain the per-request lines so the demo never blocks on a full pipe.
    std::thread::spawn(move || for _ in stdout.lines() {});
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (child, url)
}

async fn a_quoted_key_in_the_demo_pays_once(b: Backend) {
    let store = TestStore::new(b).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let (mut demo, url) = start_demo("127.0.0.1:0", &ledger);
    let config = store.config(&url).route(|r| {
        let mut inquiry = toml::Table::new();
        inquiry
            .set("url", format!("{url}/v1/idempotency/{{key}}"))
            .set("after", "1s")
            .set("every", "1s")
            .set("give_up_after", "30s");
        r.set("upstream_timeout", "10s")
            .set("on_unknown_outcome", "inquire")
            .set("inquiry", inquiry);
    });
    let gateway = Gateway::start(&config).await;
    let c = client();
    let path = gateway.url("/v1/transfers?delay_ms=5000");
    let headers = [
        ("idempotency-key", "\"t-1\""),
        ("content-type", "application/json"),
    ];
    let first = tokio::spawn({
        let (c, path) = (c.clone(), path.clone());
        async move { send(&c, "POST", &path, &headers, "{\"amount\": 700}").await }
    });
    // The payment is in the ledger (written before it is answered): kill
    // the demo while it waits to answer.
    let written = eventually(Duration::from_secs(20), || async {
        let text = std::fs::read_to_string(&ledger).unwrap_or_default();
        (!text.is_empty()).then_some(())
    })
    .await;
    assert!(written.is_some(), "the demo never wrote its ledger");
    demo.kill().unwrap();
    demo.wait().unwrap();
    let broken = first.await.unwrap();
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY, "{}", broken.text());
    let listen = url.trim_start_matches("http://").to_string();
    let (mut demo, _) = start_demo(&listen, &ledger);
    let replay = eventually(Duration::from_secs(20), || async {
        let reply = send(&c, "POST", &path, &headers, "{\"amount\": 700}").await;
        (reply.status != StatusCode::CONFLICT).then_some(reply)
    })
    .await
    .expect("the transfer settles within 20 s");
    assert_eq!(replay.status, StatusCode::CREATED, "{}", replay.text());
    assert!(replay.is_replay(), "{}", replay.text());
    assert_eq!(replay.json()["id"], "pay_1", "{}", replay.text());
    let text = std::fs::read_to_string(&ledger).unwrap();
    let payments = text.lines().filter(|l| l.contains("\"payment\"")).count();
    assert_eq!(payments, 1, "the demo created {payments} payments");
    demo.kill().unwrap();
    demo.wait().unwrap();
    gateway.shutdown().await;
}

per_backend!(only [sqlite]: a_quoted_key_in_the_demo_pays_once);
