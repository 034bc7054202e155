//! `https://` upstreams: forwarded once and replayed over TLS, HTTP/2 when
//! the upstream offers it by ALPN, and a certificate the gateway refuses
//! (unknown CA, a name it does not cover) answered as "not sent" with the
//! key released.

use http::{StatusCode, Version};

use crate::support::pki::Pki;
use crate::support::{
    Backend, Gateway, HttpClient, Set, TestConfig, TestStore, Upstream, client, post, record_state,
};

/// A gateway on `store` in front of `upstream`'s https:// URL, trusting
/// `ca` if given.
fn config(store: &TestStore, upstream: &Upstream, ca: Option<&std::path::Path>) -> TestConfig {
    store.config(&upstream.https_url()).route(|r| {
        if let Some(ca) = ca {
            r.set("upstream_ca", ca.to_str().unwrap());
        }
    })
}

/// A throwaway CA and a TLS upstream on 127.0.0.1 with a certificate it
/// signed for `san`, offering `alpn`.
async fn tls_upstream(san: &str, alpn: &[&[u8]]) -> (Pki, Upstream) {
    let pki = Pki::new();
    let cert = pki.issue("upstream", san);
    let upstream = Upstream::start_tls(cert.server_config(alpn)).await;
    (pki, upstream)
}

async fn pay(http: &HttpClient, gateway: &Gateway, key: &str) -> crate::support::Reply {
    post(http, &gateway.url("/v1/pay"), key, "{\"amount\":1}").await
}

#[tokio::test]
async fn an_https_upstream_is_forwarded_once_and_replayed() {
    let (pki, upstream) = tls_upstream("IP:127.0.0.1", &[b"http/1.1"]).await;
    let store = TestStore::new(Backend::Memory).await;
    let gateway = Gateway::start(&config(&store, &upstream, Some(&pki.ca()))).await;
    let http = client();

    let first = pay(&http, &gateway, "tls-once").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    assert!(!first.is_replay());
    let again = pay(&http, &gateway, "tls-once").await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.is_replay(), "{again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(upstream.count("tls-once"), 1);
    // An upstream that offers only HTTP/1.1 gets HTTP/1.1.
    assert_eq!(upstream.last_version(), Some(Version::HTTP_11));
    gateway.shutdown().await;
}

#[tokio::test]
async fn http2_is_negotiated_with_an_upstream_that_offers_it() {
    let (pki, upstream) = tls_upstream("IP:127.0.0.1", &[b"h2", b"http/1.1"]).await;
    let store = TestStore::new(Backend::Memory).await;
    let gateway = Gateway::start(&config(&store, &upstream, Some(&pki.ca()))).await;
    let http = client();

    let first = pay(&http, &gateway, "tls-h2").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    assert_eq!(upstream.last_version(), Some(Version::HTTP_2));
    assert!(pay(&http, &gateway, "tls-h2").await.is_replay());
    // A pass-through request (unprotected method) takes the same path.
    let get = crate::support::send(&http, "GET", &gateway.url("/v1/things"), &[], "").await;
    assert_eq!(get.status, StatusCode::CREATED, "{}", get.text());
    assert_eq!(upstream.count("tls-h2"), 1);
    assert_eq!(upstream.total(), 2);
    gateway.shutdown().await;
}

/// The answer a refused upstream connection gets: `502
/// upstream-unreachable`, and no record left for the key; its detail.
async fn refused(store: &TestStore, gateway: &Gateway, key: &str) -> String {
    let reply = pay(&client(), gateway, key).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.text());
    assert_eq!(
        reply.problem_type(),
        "urn:idemgate:problem:upstream-unreachable"
    );
    let url = store.pg_url().expect("a PostgreSQL store");
    assert_eq!(record_state(url, key).await, None, "the key is released");
    reply.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn an_unknown_ca_is_not_sent_and_the_key_is_released() {
    let (pki, upstream) = tls_upstream("IP:127.0.0.1", &[b"http/1.1"]).await;
    let store = TestStore::new(Backend::Postgres).await;
    // No upstream_ca: the system's roots do not know the throwaway CA.
    let untrusting = Gateway::start(&config(&store, &upstream, None)).await;
    let detail = refused(&store, &untrusting, "tls-unknown-ca").await;
    assert!(detail.contains("UnknownIssuer"), "{detail}");
    assert_eq!(upstream.total(), 0, "nothing reached the upstream");
    untrusting.shutdown().await;

    // Fixed: the same key is forwarded now.
    let trusting = Gateway::start(&config(&store, &upstream, Some(&pki.ca()))).await;
    let reply = pay(&client(), &trusting, "tls-unknown-ca").await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    assert!(!reply.is_replay());
    assert_eq!(upstream.count("tls-unknown-ca"), 1);
    let url = store.pg_url().unwrap();
    assert_eq!(
        record_state(url, "tls-unknown-ca").await.as_deref(),
        Some("completed")
    );
    trusting.shutdown().await;
}

#[tokio::test]
async fn a_certificate_for_another_name_is_not_sent() {
    // Signed by the trusted CA, but for another name than 127.0.0.1.
    let (pki, upstream) = tls_upstream("DNS:elsewhere.example", &[b"http/1.1"]).await;
    let store = TestStore::new(Backend::Postgres).await;
    let gateway = Gateway::start(&config(&store, &upstream, Some(&pki.ca()))).await;
    let detail = refused(&store, &gateway, "tls-wrong-name").await;
    assert!(detail.contains("not valid for name"), "{detail}");
    assert_eq!(upstream.total(), 0, "nothing reached the upstream");
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_handshake_that_never_finishes_is_not_sent() {
    // An upstream that accepts TCP and never answers the ClientHello: the
    // connect timeout (half the 2 s upstream_timeout) covers the handshake,
    // so this is "not sent", not a timed-out exchange that holds the key.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let store = TestStore::new(Backend::Postgres).await;
    let config = store.config(&format!("https://{addr}"));
    let gateway = Gateway::start(&config).await;
    let detail = refused(&store, &gateway, "tls-stalled").await;
    assert!(detail.contains("TLS handshake"), "{detail}");
    gateway.shutdown().await;
    silent.abort();
}
