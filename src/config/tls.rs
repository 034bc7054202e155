//! The validated TLS settings: the proxy listener's certificate files
//! and the CAs it trusts for client certificates (`[tls]`), and a route's
//! extra trust anchors for an `https://` upstream (`upstream_ca`).

use std::path::PathBuf;

use rustls::pki_types::CertificateDer;
use serde::Deserialize;

/// `[tls]`: the proxy listener speaks TLS with this certificate chain and
/// key (PEM files, read again on SIGHUP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// The certificate chain, the server's own certificate first.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// Client certificates (`client_ca`, `client_auth`); `None`: none asked.
    pub client: Option<ClientCerts>,
}

/// `client_ca` and `client_auth`: the listener asks for client
/// certificates and verifies them against these CAs (read again with the
/// certificate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCerts {
    /// The PEM file of CA certificates trusted for client certificates.
    pub ca: PathBuf,
    /// Whether a client must present one.
    pub auth: ClientAuth,
}

/// `client_auth`: whether a client without a certificate is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// A client without a verified certificate fails the handshake.
    Required,
    /// A client may present none (it then has no identity); one it
    /// presents must still verify, or the handshake fails.
    Optional,
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
