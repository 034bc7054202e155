//! `rediss://` store URLs: the Redis store over TLS to a private
//! `redis-server` with a self-signed certificate (`#insecure`), and plain
//! `redis://` against its TLS port refused at start.

use std::process::{Command, Stdio};
use std::time::Duration;

use http::StatusCode;

use crate::support::serial;
use crate::support::{Gateway, TestConfig, Upstream, client, eventually, post};

#[tokio::test]
async fn rediss_urls_speak_tls() {
    // It starts a server of its own before any fixture: take a turn first.
    let _turn = serial::shared();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()
        .expect("openssl is installed");
    assert!(made.success());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--tls-auth-clients",
            "no",
        ])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let started = eventually(Duration::from_secs(10), || async {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(|_| ())
    })
    .await;
    assert!(started.is_some(), "TLS redis did not start");

    let upstream = Upstream::start().await;
    // The certificate is self-signed: `#insecure` skips verification (test only).
    let url = format!("rediss://127.0.0.1:{port}/#insecure");
    let gateway = Gateway::start(&TestConfig::new(&url, &upstream.url())).await;
    let c = client();
    let first = post(&c, &gateway.url("/v1/payments"), "tls", "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(
        post(&c, &gateway.url("/v1/payments"), "tls", "{}")
            .await
            .is_replay()
    );
    assert_eq!(upstream.count("tls"), 1);

    // Plain redis:// against the TLS port fails at startup, clearly.
    let plain = TestConfig::new(&format!("redis://127.0.0.1:{port}/"), &upstream.url());
    let plain = idemgate::Config::parse(&plain.to_string()).unwrap();
    let refused = idemgate::store::open(&plain.store)
        .await
        .err()
        .expect("no TLS, no store");
    assert!(
        refused.to_string().contains("cannot reach store"),
        "{refused}"
    );
    let _ = server.kill();
    let _ = server.wait();
}
