//! The TLS proxy listener: HTTP/1.1 and HTTP/2 by ALPN with
//! `X-Forwarded-Proto: https`, the handshake inside the first-head
//! deadline, idle HTTP/1.1 connections kept to `idle_timeout` (parked)
//! over TLS, certificate reload on SIGHUP (the binary as a child process),
//! and start-up errors that name the file.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::support::pki::{Issued, Pki, https_client};
use crate::support::process::{GatewayProcess, refuses_to_start};
use crate::support::servers::kill;
use crate::support::{Backend, Gateway, Set, TestConfig, TestStore, Upstream, eventually};

/// `config` with the proxy listener on TLS with `cert`.
fn with_tls(config: TestConfig, cert: &Issued) -> TestConfig {
    let (c, k) = (cert.cert.to_str().unwrap(), cert.key.to_str().unwrap());
    config.top(|t| {
        let mut tls = toml::Table::new();
        tls.set("cert", c).set("key", k);
        t.set("tls", tls);
    })
}

/// A throwaway CA, the upstream, and an in-process gateway whose listener
/// speaks TLS with a certificate that CA signed for 127.0.0.1, with
/// `header_read_timeout = "2s"` and `top` edited as given.
async fn tls_gateway(top: impl FnOnce(&mut toml::Table)) -> (Pki, Upstream, TestStore, Gateway) {
    let pki = Pki::new();
    let cert = pki.issue("gateway", "IP:127.0.0.1");
    let upstream = Upstream::start().await;
    let store = TestStore::new(Backend::Memory).await;
    let config = with_tls(store.config(&upstream.url()), &cert).top(|t| {
        t.set("header_read_timeout", "2s");
        top(t);
    });
    let gateway = Gateway::start(&config).await;
    (pki, upstream, store, gateway)
}

/// One request through a fresh hyper client that trusts `pki` and offers
/// ALPN `h2` (`h2`) or no ALPN at all: the version the answer came in and
/// its status.
async fn get(pki: &Pki, port: u16, h2: bool) -> (Version, StatusCode) {
    let client = https_client((*pki.client_config(&[])).clone(), h2);
    let request = Request::get(format!("https://127.0.0.1:{port}/v1/things"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.expect("an answer over TLS");
    (response.version(), response.status())
}

#[tokio::test]
async fn tls_clients_get_http1_or_http2_by_alpn() {
    let (pki, upstream, _store, gateway) = tls_gateway(|_| {}).await;
    let port = gateway.addr.port();

    // ALPN http/1.1 is chosen when offered, and without ALPN it is HTTP/1.1.
    let (tls, _) = connect(&pki, port).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(
        request_on(&mut http1(tls).await).await.unwrap(),
        StatusCode::CREATED
    );
    assert_eq!(upstream.last_headers()["x-forwarded-proto"], "https");
    assert_eq!(
        get(&pki, port, false).await,
        (Version::HTTP_11, StatusCode::CREATED)
    );
    assert_eq!(
        get(&pki, port, true).await,
        (Version::HTTP_2, StatusCode::CREATED)
    );
    assert_eq!(upstream.last_headers()["x-forwarded-proto"], "https");
    // The control: cleartext on the same listener is not served.
    let plain = crate::support::http::try_send(
        &crate::support::client(),
        "GET",
        &gateway.url("/v1/things"),
        &[],
        "",
    )
    .await;
    assert!(plain.is_err(), "{plain:?}");
    assert_eq!(upstream.total(), 3);
    gateway.shutdown().await;
}

/// How long until the gateway closes a TCP connection that sent `bytes`
/// and then nothing (at most 60 s).
async fn cut_off_after(port: u16, bytes: &[u8]) -> Duration {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let started = Instant::now();
    stream.write_all(bytes).await.unwrap();
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                // A TLS alert, if any: keep reading until the close.
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "still open after 60 s");
    started.elapsed()
}

#[tokio::test]
async fn the_handshake_runs_inside_the_first_head_deadline() {
    let (pki, _upstream, _store, gateway) = tls_gateway(|_| {}).await;
    let port = gateway.addr.port();
    let deadline = Duration::from_secs(2);

    // Nothing at all.
    let silent = cut_off_after(port, b"").await;
    assert!(silent >= deadline, "closed after {silent:?}");
    // Half a ClientHello: a handshake record announcing 512 bytes, and 6 of them.
    let half = cut_off_after(
        port,
        &[
            0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
        ],
    )
    .await;
    assert!(half >= deadline, "closed after {half:?}");
    // The control: a client that completes its handshake is served.
    assert_eq!(get(&pki, port, false).await.1, StatusCode::CREATED);
    gateway.shutdown().await;
}

/// A TLS connection to `port` trusting `pki`, offering HTTP/1.1, and the
/// certificate the server presented.
async fn connect(
    pki: &Pki,
    port: u16,
) -> std::io::Result<(
    tokio_rustls::client::TlsStream<TcpStream>,
    CertificateDer<'static>,
)> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let connector = TlsConnector::from(pki.client_config(&[b"http/1.1"]));
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let tls = connector.connect(name, tcp).await?;
    let presented = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    Ok((tls, presented))
}

/// One HTTP/1.1 connection over `tls`, to send requests on.
async fn http1(
    tls: tokio_rustls::client::TlsStream<TcpStream>,
) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

async fn request_on(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
) -> Result<StatusCode, hyper::Error> {
    sender.ready().await?;
    let request = Request::get("/v1/things")
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await?;
    let status = response.status();
    response.into_body().collect().await?;
    Ok(status)
}

/// A request on a new TLS connection to `gateway`, then, after 3 s idle
/// (past the 2 s `header_read_timeout`), another on the same connection.
async fn again_after_idling(pki: &Pki, gateway: &Gateway) -> Result<StatusCode, hyper::Error> {
    let (tls, _) = connect(pki, gateway.addr.port()).await.unwrap();
    let mut sender = http1(tls).await;
    assert_eq!(request_on(&mut sender).await.unwrap(), StatusCode::CREATED);
    tokio::time::sleep(Duration::from_secs(3)).await;
    request_on(&mut sender).await
}

#[tokio::test]
async fn an_idle_tls_connection_lives_until_idle_timeout() {
    // Idle past header_read_timeout (hyper's head timer would have closed
    // it): parked, not closed, so the same connection answers again.
    let (pki, _upstream, _store, gateway) = tls_gateway(|_| {}).await;
    let again = again_after_idling(&pki, &gateway).await;
    assert_eq!(again.unwrap(), StatusCode::CREATED);
    gateway.shutdown().await;

    // The control: with idle_timeout shorter than that wait, it is closed.
    let (pki, _upstream, _store, gateway) = tls_gateway(|t| {
        t.set("idle_timeout", "1s");
    })
    .await;
    assert!(again_after_idling(&pki, &gateway).await.is_err());
    gateway.shutdown().await;
}

/// Replace the live certificate files with `from`'s.
fn install(live: &Issued, from: &Issued) {
    std::fs::copy(&from.key, &live.key).unwrap();
    std::fs::copy(&from.cert, &live.cert).unwrap();
}

#[tokio::test]
async fn sighup_reloads_the_certificate_and_a_broken_one_keeps_the_old() {
    let pki = Pki::new();
    let (first, second) = (
        pki.issue("first", "IP:127.0.0.1"),
        pki.issue("second", "IP:127.0.0.1"),
    );
    let live = Issued {
        cert: pki.dir().join("live.pem"),
        key: pki.dir().join("live.key"),
    };
    install(&live, &first);
    let upstream = Upstream::start().await;
    let config = with_tls(TestConfig::new("memory://", &upstream.url()), &live);
    let gateway = GatewayProcess::start("tls-reload", &config).await;
    let (port, pid) = (gateway.port, gateway.pid().to_string());

    let (tls, presented) = connect(&pki, port).await.unwrap();
    assert_eq!(presented, first.der());
    let mut open = http1(tls).await;
    assert_eq!(request_on(&mut open).await.unwrap(), StatusCode::CREATED);

    install(&live, &second);
    kill("-HUP", &pid);
    let second_der = second.der();
    let (pki_ref, second_ref) = (&pki, &second_der);
    let reloaded = eventually(Duration::from_secs(30), || async move {
        let (_, presented) = connect(pki_ref, port).await.ok()?;
        (presented == *second_ref).then_some(())
    })
    .await;
    assert!(
        reloaded.is_some(),
        "new connections never saw the new certificate\n{}",
        gateway.stderr()
    );
    // The connection opened before the reload was not dropped.
    assert_eq!(request_on(&mut open).await.unwrap(), StatusCode::CREATED);

    // A broken certificate file: the reload fails and is logged, and the
    // certificate in use stays.
    std::fs::write(
        &live.cert,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    kill("-HUP", &pid);
    // The failure's own line names the file (the earlier success's line
    // names it too, so the line is what counts).
    let process = &gateway;
    let failed = eventually(Duration::from_secs(30), || async move {
        let stderr = process.stderr();
        let line = stderr.lines().find(|l| l.contains("reload failed"))?;
        Some(line.to_string())
    })
    .await;
    let failed = failed.unwrap_or_else(|| panic!("no reload error logged\n{}", gateway.stderr()));
    assert!(failed.contains("live.pem"), "{failed}");
    let (_, presented) = connect(&pki, port).await.unwrap();
    assert_eq!(presented, second.der());
    assert_eq!(request_on(&mut open).await.unwrap(), StatusCode::CREATED);
}

#[tokio::test]
async fn missing_or_mismatched_files_stop_the_start_naming_the_file() {
    let pki = Pki::new();
    let (ours, theirs) = (
        pki.issue("ours", "IP:127.0.0.1"),
        pki.issue("theirs", "IP:127.0.0.1"),
    );
    let base = TestConfig::new("memory://", "http://127.0.0.1:9");

    let missing = Issued {
        cert: pki.dir().join("missing.pem"),
        key: ours.key.clone(),
    };
    let stderr = refuses_to_start("tls-missing", &with_tls(base.clone(), &missing)).await;
    assert!(
        stderr.contains("missing.pem") && stderr.contains("tls.cert"),
        "{stderr}"
    );

    let mismatched = Issued {
        cert: ours.cert.clone(),
        key: theirs.key.clone(),
    };
    let stderr = refuses_to_start("tls-mismatch", &with_tls(base.clone(), &mismatched)).await;
    assert!(
        stderr.contains("theirs.key") && stderr.contains("does not match"),
        "{stderr}"
    );

    // The control: the matching pair starts.
    let started = GatewayProcess::try_start_with_env("tls-ok", &with_tls(base, &ours), &[]).await;
    assert!(started.is_ok(), "{:?}", started.err());
}
