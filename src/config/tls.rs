//! The validated TLS settings: a route's extra trust anchors for an
//! `https://` upstream (`upstream_ca`).

use std::path::PathBuf;

use rustls::pki_types::CertificateDer;

/// `upstream_ca`: certificates trusted for this route's `https://`
/// upstream besides the system's roots, read when the config is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamCa {
    /// The PEM file they came from.
    pub path: PathBuf,
    /// The certificates, each usable as a trust anchor.
    pub certs: Vec<CertificateDer<'static>>,
}
