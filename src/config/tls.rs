//! The validated TLS settings: the proxy listener's certificate files
//! (`[tls]`) and a route's extra trust anchors for an `https://` upstream
//! (`upstream_ca`).

use std::path::PathBuf;

use rustls::pki_types::CertificateDer;

/// `[tls]`: the proxy listener speaks TLS with this certificate chain and
/// key (PEM files, read again on SIGHUP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// The certificate chain, the server's own certificate first.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// `upstream_ca`: certificates trusted for this route's `https://`
/// upstream besides the system's roots, read when the config is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamCa {
    /// The PEM file they came from.
    pub path: PathBuf,
    /// The certificates, each usable as a trust anchor.
    pub certs: Vec<CertificateDer<'static>>,
}
