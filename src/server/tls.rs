//! The TLS proxy listener (`[tls]`): rustls on ring, HTTP/2 or HTTP/1.1 by
//! ALPN, and a certificate that is read again on SIGHUP. A reload swaps
//! the certificate new handshakes get; connections already open keep
//! theirs and are not touched. A reload that fails (an unreadable file, a
//! key that does not match) keeps the certificate in use and logs an
//! error.
//!
//! The handshake runs inside the connection's first deadline (accept to
//! the first request head, `header_read_timeout`): a client that opens TCP
//! and never finishes its ClientHello is cut off then (`server.rs`).

use std::sync::{Arc, PoisonError, RwLock};

use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;

use crate::config::ListenerTls;
use crate::tls::{TlsFileError, provider, read_certified_key};

/// ALPN protocol ids, in the order the server prefers them.
const ALPN_H2: &[u8] = b"h2";
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The certificate new handshakes get, and the files it is read from.
#[derive(Debug)]
pub(crate) struct Certificate {
    files: ListenerTls,
    current: RwLock<Arc<CertifiedKey>>,
}

impl Certificate {
    /// Read the files now.
    pub(crate) fn load(files: &ListenerTls) -> Result<Arc<Self>, TlsFileError> {
        let current = read_certified_key(&files.cert, &files.key)?;
        Ok(Arc::new(Self {
            files: files.clone(),
            current: RwLock::new(current),
        }))
    }

    /// The certificate's PEM file.
    pub(crate) fn cert_path(&self) -> &std::path::Path {
        &self.files.cert
    }

    /// Read the files again; on success new handshakes get the new
    /// certificate, on failure nothing changes.
    pub(crate) fn reload(&self) -> Result<(), TlsFileError> {
        let fresh = read_certified_key(&self.files.cert, &self.files.key)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// The TLS acceptor that serves this certificate.
    pub(crate) fn acceptor(self: &Arc<Self>) -> TlsAcceptor {
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
        TlsAcceptor::from(Arc::new(config))
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

/// Whether the handshake chose HTTP/2.
pub(super) fn chose_h2(alpn: Option<&[u8]>) -> bool {
    alpn == Some(ALPN_H2)
}
