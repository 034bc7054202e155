//! Client certificates on the TLS proxy listener (`[tls] client_ca`), each
//! case on HTTP/1.1 and on HTTP/2 (ALPN): `required` refuses a client with
//! no certificate, an untrusted one or an expired one in the handshake;
//! `optional` serves a client with none, whose requests to a route scoped
//! by the certificate get `400`; the certificate's URI SAN scopes keys, so
//! two callers with one key each execute once and replay their own answer;
//! and a reload reads the CA file again. The CAs and client certificates
//! are made here with rcgen ([`crate::support::client_pki`]); the server's
//! certificate comes from [`crate::support::pki`].

use std::path::Path;

use bytes::Bytes;
use http::{Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use rustls::HandshakeKind;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::support::client_pki::{ClientCa, ClientCert};
use crate::support::pki::{Pki, https_client};
use crate::support::{Gateway, Set, TestConfig, Upstream};

const TOKEN: &str = "mtls-reload-token-0123456789";

/// A gateway on TLS whose listener trusts the client CA in `client_ca`
/// (`client_auth` as given, if any), with two routes: `api` (`/v1/*`, no
/// scope) and `scoped` (`/v2/*`, `scope_from = ["cert:san-uri"]`).
async fn mtls_gateway(
    pki: &Pki,
    upstream: &Upstream,
    client_ca: &Path,
    client_auth: Option<&str>,
) -> Gateway {
    let server = pki.issue("gateway", "IP:127.0.0.1");
    let config = TestConfig::new("memory://", &upstream.url())
        .top(|t| {
            let mut tls = toml::Table::new();
            tls.set("cert", server.cert.to_str().unwrap())
                .set("key", server.key.to_str().unwrap())
                .set("client_ca", client_ca.to_str().unwrap());
            if let Some(auth) = client_auth {
                tls.set("client_auth", auth);
            }
            t.set("tls", tls).set("admin_token", TOKEN);
        })
        .routes(|routes| {
            let mut scoped = toml::Table::new();
            scoped
                .set("name", "scoped")
                .set("match", "/v2/*")
                .set("upstream", upstream.url())
                .set("scope_from", vec!["cert:san-uri"]);
            routes.push(scoped.into());
        });
    Gateway::start(&config).await
}

/// What one request got: its version, status, content type and body.
#[derive(Debug)]
struct Answer {
    version: Version,
    status: StatusCode,
    content_type: String,
    replayed: bool,
    body: String,
}

/// `POST path` with `Idempotency-Key: key` on a fresh connection to
/// `gateway` (HTTP/2 by ALPN if `h2`), presenting `cert` if given; `Err`:
/// the connection failed (the text of the error and its sources).
async fn post(
    pki: &Pki,
    gateway: &Gateway,
    cert: Option<&ClientCert>,
    h2: bool,
    path: &str,
    key: &str,
) -> Result<Answer, String> {
    let config = (*pki.client_config_as(&[], cert.map(ClientCert::presented))).clone();
    let client = https_client(config, h2);
    let port = gateway.addr.port();
    let request = Request::post(format!("https://127.0.0.1:{port}{path}"))
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let response = client.request(request).await.map_err(|e| chain(&e))?;
    let (version, status) = (response.version(), response.status());
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let (content_type, replayed) = (header("content-type"), header("idempotent-replayed"));
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| chain(&e))?;
    Ok(Answer {
        version,
        status,
        content_type,
        replayed: replayed == "true",
        body: String::from_utf8(body.to_bytes().to_vec()).unwrap(),
    })
}

/// An error and its sources, one text.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(&format!(": {e}"));
        source = e.source();
    }
    text
}

fn version(h2: bool) -> Version {
    if h2 {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    }
}

/// A connection with `cert` fails its handshake: the client is told by
/// the alert whose name contains `alert` (e.g. `CertificateRequired`),
/// and a request through an HTTP client gets no answer.
async fn refused(pki: &Pki, gateway: &Gateway, cert: Option<&ClientCert>, h2: bool, alert: &str) {
    let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
    let config = pki.client_config_as(&[alpn], cert.map(ClientCert::presented));
    let tcp = TcpStream::connect(gateway.addr).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    // With TLS 1.3 the client's side of the handshake ends before the
    // server has checked its certificate: the alert comes with the next read.
    let error = match TlsConnector::from(config).connect(name, tcp).await {
        Err(e) => e,
        Ok(mut tls) => {
            let mut buf = Vec::new();
            tls.read_to_end(&mut buf)
                .await
                .expect_err("the server must refuse the certificate")
        }
    };
    assert!(error.to_string().contains(alert), "h2={h2}: {error}");
    let answer = post(pki, gateway, cert, h2, "/v1/things", "refused").await;
    assert!(answer.is_err(), "h2={h2}: {answer:?}");
}

/// `dir/name.pem` holding `ca`'s certificate.
fn ca_file(dir: &Path, name: &str, ca: &ClientCa) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.pem"));
    std::fs::write(&path, ca.pem()).unwrap();
    path
}

#[tokio::test]
async fn required_client_certificates_refuse_missing_untrusted_and_expired_ones() {
    let (pki, upstream) = (Pki::new(), Upstream::start().await);
    let (ca, stranger) = (ClientCa::new("client-ca"), ClientCa::new("stranger-ca"));
    let gateway = mtls_gateway(&pki, &upstream, &ca_file(pki.dir(), "clients", &ca), None).await;
    let good = ca.issue("payments", "spiffe://test/payments");
    let untrusted = stranger.issue("payments", "spiffe://test/payments");
    let expired = ca.issue_expired("payments", "spiffe://test/payments");
    for h2 in [false, true] {
        // The control: a client with a valid certificate is served, and a
        // route scoped by it records.
        let key = format!("ok-{h2}");
        let answer = post(&pki, &gateway, Some(&good), h2, "/v2/pay", &key)
            .await
            .unwrap();
        assert_eq!(
            (answer.version, answer.status),
            (version(h2), StatusCode::CREATED)
        );
        let again = post(&pki, &gateway, Some(&good), h2, "/v2/pay", &key)
            .await
            .unwrap();
        assert!(again.replayed && again.body == answer.body, "{again:?}");

        refused(&pki, &gateway, None, h2, "CertificateRequired").await;
        refused(&pki, &gateway, Some(&untrusted), h2, "UnknownCA").await;
        refused(&pki, &gateway, Some(&expired), h2, "CertificateExpired").await;
    }
    // Only the served requests reached the upstream, once per key.
    assert_eq!(upstream.total(), 2);
    gateway.shutdown().await;
}

#[tokio::test]
async fn optional_client_certificates_serve_anonymous_callers_without_a_cert_scope() {
    let (pki, upstream) = (Pki::new(), Upstream::start().await);
    let (ca, stranger) = (ClientCa::new("client-ca"), ClientCa::new("stranger-ca"));
    let ca_path = ca_file(pki.dir(), "clients", &ca);
    let gateway = mtls_gateway(&pki, &upstream, &ca_path, Some("optional")).await;
    let good = ca.issue("payments", "spiffe://test/payments");
    for h2 in [false, true] {
        // No certificate: served on a route that does not need one.
        let plain = post(&pki, &gateway, None, h2, "/v1/things", &format!("p-{h2}"))
            .await
            .unwrap();
        assert_eq!(
            (plain.version, plain.status),
            (version(h2), StatusCode::CREATED)
        );
        // A route scoped by the certificate: 400, naming the part.
        let scoped = post(&pki, &gateway, None, h2, "/v2/pay", &format!("s-{h2}"))
            .await
            .unwrap();
        assert_eq!(scoped.status, StatusCode::BAD_REQUEST, "{scoped:?}");
        assert_eq!(scoped.content_type, "application/problem+json");
        let problem: serde_json::Value = serde_json::from_str(&scoped.body).unwrap();
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            problem["type"].as_str().unwrap().ends_with("invalid-key")
                && detail.contains("cert:san-uri")
                && detail.contains("no client certificate"),
            "{problem}"
        );
        // A certificate that does not verify is refused even so.
        let untrusted = stranger.issue("payments", "spiffe://test/payments");
        refused(&pki, &gateway, Some(&untrusted), h2, "UnknownCA").await;
        // The control: with a valid certificate the scoped route serves.
        let with_cert = post(
            &pki,
            &gateway,
            Some(&good),
            h2,
            "/v2/pay",
            &format!("s-{h2}"),
        )
        .await
        .unwrap();
        assert_eq!(with_cert.status, StatusCode::CREATED, "{with_cert:?}");
    }
    // The 400s never reached the upstream.
    assert_eq!(upstream.total(), 4);
    gateway.shutdown().await;
}

#[tokio::test]
async fn the_certificate_scopes_keys_so_callers_never_share_an_answer() {
    let (pki, upstream) = (Pki::new(), Upstream::start().await);
    let ca = ClientCa::new("client-ca");
    let gateway = mtls_gateway(&pki, &upstream, &ca_file(pki.dir(), "clients", &ca), None).await;
    let alice = ca.issue("alice", "spiffe://test/alice");
    let bob = ca.issue("bob", "spiffe://test/bob");
    // Another certificate with alice's SPIFFE ID (re-issued, another CN).
    let alice_again = ca.issue("alice-renewed", "spiffe://test/alice");
    for h2 in [false, true] {
        let key = format!("same-key-{h2}");
        let first = post(&pki, &gateway, Some(&alice), h2, "/v2/pay", &key)
            .await
            .unwrap();
        let second = post(&pki, &gateway, Some(&bob), h2, "/v2/pay", &key)
            .await
            .unwrap();
        assert_eq!(
            (first.status, second.status),
            (StatusCode::CREATED, StatusCode::CREATED)
        );
        assert!(!first.replayed && !second.replayed);
        // Each executed once upstream: the upstream saw the key twice.
        assert_eq!(upstream.count(&key), 2, "h2={h2}");
        assert_ne!(first.body, second.body);
        // Each replays its own answer, never the other's.
        for (cert, own) in [(&alice, &first), (&bob, &second), (&alice_again, &first)] {
            let replay = post(&pki, &gateway, Some(cert), h2, "/v2/pay", &key)
                .await
                .unwrap();
            assert!(replay.replayed, "{replay:?}");
            assert_eq!(replay.body, own.body);
        }
        assert_eq!(upstream.count(&key), 2, "h2={h2}");
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_reload_reads_the_client_ca_again_and_a_broken_one_keeps_the_old() {
    let (pki, upstream) = (Pki::new(), Upstream::start().await);
    let (old_ca, new_ca) = (ClientCa::new("old-ca"), ClientCa::new("new-ca"));
    let live = ca_file(pki.dir(), "live", &old_ca);
    let gateway = mtls_gateway(&pki, &upstream, &live, None).await;
    let (old, new) = (
        old_ca.issue("old", "spiffe://test/old"),
        new_ca.issue("new", "spiffe://test/new"),
    );
    let served = async |cert: &ClientCert, h2: bool, key: &str| {
        post(&pki, &gateway, Some(cert), h2, "/v1/things", key)
            .await
            .map(|a| a.status)
    };
    for h2 in [false, true] {
        assert_eq!(served(&old, h2, "a").await, Ok(StatusCode::CREATED));
        refused(&pki, &gateway, Some(&new), h2, "UnknownCA").await;
    }

    std::fs::write(&live, new_ca.pem()).unwrap();
    let (status, _) = gateway.reload(Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    for h2 in [false, true] {
        assert_eq!(served(&new, h2, "b").await, Ok(StatusCode::CREATED));
        refused(&pki, &gateway, Some(&old), h2, "UnknownCA").await;
    }

    // A broken CA file: the reload keeps the CAs in use.
    std::fs::write(
        &live,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    // (The file's validation refuses the routes' reload too, naming it.)
    let (status, answer) = gateway.reload(Some(TOKEN)).await;
    assert_ne!(status, StatusCode::OK);
    assert!(answer.to_string().contains("live.pem"), "{answer}");
    for h2 in [false, true] {
        assert_eq!(served(&new, h2, "c").await, Ok(StatusCode::CREATED));
        refused(&pki, &gateway, Some(&old), h2, "UnknownCA").await;
    }
    gateway.shutdown().await;
}

/// Two connections in turn from one client config (which keeps the
/// server's session tickets): how the second handshake went.
async fn second_handshake(
    pki: &Pki,
    gateway: &Gateway,
    cert: Option<&ClientCert>,
) -> HandshakeKind {
    let config = pki.client_config_as(&[b"http/1.1"], cert.map(ClientCert::presented));
    let mut kinds = Vec::new();
    for _ in 0..2 {
        let tcp = TcpStream::connect(gateway.addr).await.unwrap();
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await
            .unwrap();
        kinds.push(tls.get_ref().1.handshake_kind().unwrap());
        // A whole exchange, so any ticket the server sends is read.
        let request = b"GET /v1/things HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n";
        tls.write_all(request).await.unwrap();
        let mut answer = Vec::new();
        let _ = tls.read_to_end(&mut answer).await;
        assert!(answer.starts_with(b"HTTP/1.1 "), "{answer:?}");
    }
    assert_eq!(kinds[0], HandshakeKind::Full);
    kinds[1]
}

/// A resumed TLS session would bring its client certificate back without
/// verifying it again (so an expired one, or one of a CA no longer
/// trusted, would keep its identity): with client certificates every
/// connection makes a full handshake. The control: the same listener
/// without them resumes, so the test sees a resumption when there is one.
#[tokio::test]
async fn client_certificates_are_verified_on_every_connection() {
    let (pki, upstream) = (Pki::new(), Upstream::start().await);
    let ca = ClientCa::new("client-ca");
    let gateway = mtls_gateway(&pki, &upstream, &ca_file(pki.dir(), "clients", &ca), None).await;
    let good = ca.issue("payments", "spiffe://test/payments");
    let kind = second_handshake(&pki, &gateway, Some(&good)).await;
    assert_eq!(
        kind,
        HandshakeKind::Full,
        "a client-certificate session resumed"
    );
    gateway.shutdown().await;

    let server = pki.issue("gateway", "IP:127.0.0.1");
    let plain = TestConfig::new("memory://", &upstream.url()).top(|t| {
        let mut tls = toml::Table::new();
        tls.set("cert", server.cert.to_str().unwrap())
            .set("key", server.key.to_str().unwrap());
        t.set("tls", tls);
    });
    let gateway = Gateway::start(&plain).await;
    let kind = second_handshake(&pki, &gateway, None).await;
    assert_eq!(
        kind,
        HandshakeKind::Resumed,
        "the control: without client certificates a session resumes"
    );
    gateway.shutdown().await;
}

/// A verified certificate without the name a route scopes by (here no URI
/// SAN for `cert:san-uri`) is refused by that route with `400` naming the
/// part, never given the anonymous scope; a route that does not read it
/// serves the caller.
#[tokio::test]
async fn a_certificate_without_the_scoping_name_gets_400() {
    let (pki, upstream) = (Pki::new(), Upstream::start().await);
    let ca = ClientCa::new("client-ca");
    let gateway = mtls_gateway(&pki, &upstream, &ca_file(pki.dir(), "clients", &ca), None).await;
    let nameless = ca.issue("payments", "");
    for h2 in [false, true] {
        let key = format!("n-{h2}");
        let plain = post(&pki, &gateway, Some(&nameless), h2, "/v1/things", &key);
        assert_eq!(plain.await.unwrap().status, StatusCode::CREATED);
        let scoped = post(&pki, &gateway, Some(&nameless), h2, "/v2/pay", &key);
        let scoped = scoped.await.unwrap();
        assert_eq!(scoped.status, StatusCode::BAD_REQUEST, "{scoped:?}");
        let problem: serde_json::Value = serde_json::from_str(&scoped.body).unwrap();
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            problem["type"].as_str().unwrap().ends_with("invalid-key")
                && detail.contains("cert:san-uri"),
            "{problem}"
        );
    }
    assert_eq!(
        upstream.total(),
        2,
        "only the unscoped route's requests went up"
    );
    gateway.shutdown().await;
}
