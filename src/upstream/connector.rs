//! Connecting to `https://` upstreams: rustls (on ring) over hyper-util's
//! TCP connector, with the system's root certificates plus a route's
//! `upstream_ca`, SNI and hostname verification from the upstream URL, and
//! ALPN offering `h2` then `http/1.1` (the upstream picks; without ALPN it
//! is HTTP/1.1).
//!
//! The connect timeout covers the TCP connect *and* the TLS handshake
//! ([`Bounded`]): a connection whose handshake stalls or fails is a connect
//! error, which the client reports as "not sent" before the request leaves
//! (the key is released), never as a timed-out exchange.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

use crate::tls::provider;

/// The HTTPS connector with the whole connect bounded.
pub(super) type TlsConnector = Bounded<HttpsConnector<HttpConnector>>;

/// A connector for `https://` upstreams that trusts the system's roots and
/// `extra`.
pub(super) fn https(connect_timeout: Duration, extra: &[CertificateDer<'static>]) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    roots.extend(system_roots().roots.iter().cloned());
    for cert in extra {
        // Checked when the config was loaded (`tls::read_ca_file`).
        let _ = roots.add(cert.clone());
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let https = HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_all_versions()
        .wrap_connector(tcp);
    Bounded {
        inner: https,
        limit: connect_timeout,
    }
}

/// The system's root certificates (rustls-native-certs: the OpenSSL
/// locations on Linux, `SSL_CERT_FILE`/`SSL_CERT_DIR` if set), loaded once
/// per process; problems are logged, not fatal (a route may trust its own
/// `upstream_ca` only).
fn system_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for error in &found.errors {
            tracing::warn!(%error, "reading the system's root certificates");
        }
        let mut roots = RootCertStore::empty();
        let (added, ignored) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            tracing::warn!(
                "no system root certificates found: https upstreams verify only against their upstream_ca"
            );
        }
        tracing::debug!(added, ignored, "system root certificates loaded");
        roots
    })
}

/// A connector whose whole connect (TCP and TLS handshake) must finish
/// within `limit`; past it, the connect fails.
#[derive(Clone)]
pub(super) struct Bounded<C> {
    inner: C,
    limit: Duration,
}

/// The connect took longer than the connect timeout.
#[derive(Debug, thiserror::Error)]
#[error("connecting (TCP and TLS handshake) took longer than {0:?}")]
struct ConnectTimedOut(Duration);

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Connecting<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<C> tower_service::Service<Uri> for Bounded<C>
where
    C: tower_service::Service<Uri>,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Connecting<C::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Connecting<C::Response> {
        let connecting = self.inner.call(uri);
        let limit = self.limit;
        Box::pin(async move {
            match tokio::time::timeout(limit, connecting).await {
                Ok(connected) => connected.map_err(Into::into),
                Err(_elapsed) => Err(Box::new(ConnectTimedOut(limit)) as BoxError),
            }
        })
    }
}
