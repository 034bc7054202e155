//! The TLS proxy listener (`[tls]`): rustls on ring, HTTP/2 or HTTP/1.1 by
//! ALPN, a certificate that is read again on SIGHUP, and, with
//! `client_ca`, client certificates verified against CAs read again with
//! it. A reload swaps the certificate (and the client CAs) new handshakes
//! get; connections already open keep theirs and are not touched. A reload
//! that fails (an unreadable file, a key that does not match, a CA file
//! that is not one) keeps what is in use and logs an error; the
//! certificate and the client CAs are read and kept apart, so a broken CA
//! file does not hold back a renewed certificate.
//!
//! The handshake runs inside the connection's first deadline (accept to
//! the first request head, `header_read_timeout`): a client that opens TCP
//! and never finishes its ClientHello is cut off then (`server.rs`). A
//! client certificate the verifier accepted becomes the connection's
//! [`ClientIdentity`] ([`identity`]).

use std::sync::{Arc, PoisonError, RwLock};

use arc_swap::ArcSwap;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, NoServerSessionStorage, ResolvesServerCert, ServerConnection};
use rustls::sign::CertifiedKey;
use rustls::{ServerConfig, server::WebPkiClientVerifier};
use tokio_rustls::TlsAcceptor;

use crate::config::{ClientAuth, ListenerTls};
use crate::request::client_cert::ClientIdentity;
use crate::tls::{TlsFileError, provider, read_certified_key, read_client_verifier};

/// ALPN protocol ids, in the order the server prefers them.
const ALPN_H2: &[u8] = b"h2";
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The listener's TLS: the certificate new handshakes get, the client
/// verifier, and the files they are read from.
#[derive(Debug)]
pub(crate) struct Certificate {
    files: ListenerTls,
    keys: Arc<Keys>,
    /// What new handshakes are served with (rebuilt when the client CAs
    /// are read again).
    config: ArcSwap<ServerConfig>,
}

/// The certificate in use (the resolver every handshake asks).
#[derive(Debug)]
struct Keys {
    current: RwLock<Arc<CertifiedKey>>,
}

impl Certificate {
    /// Read the files now.
    pub(crate) fn load(files: &ListenerTls) -> Result<Arc<Self>, TlsFileError> {
        let keys = Arc::new(Keys {
            current: RwLock::new(read_certified_key(&files.cert, &files.key)?),
        });
        let verifier = client_verifier(files)?;
        Ok(Arc::new(Self {
            files: files.clone(),
            config: ArcSwap::from(server_config(&keys, verifier, files.client.is_some())),
            keys,
        }))
    }

    /// The certificate's PEM file.
    pub(crate) fn cert_path(&self) -> &std::path::Path {
        &self.files.cert
    }

    /// The client CAs' PEM file, if client certificates are asked.
    pub(crate) fn client_ca_path(&self) -> Option<&std::path::Path> {
        self.files.client.as_ref().map(|c| c.ca.as_path())
    }

    /// Read the certificate's files again; on success new handshakes get
    /// the new certificate, on failure nothing changes.
    pub(crate) fn reload(&self) -> Result<(), TlsFileError> {
        let fresh = read_certified_key(&self.files.cert, &self.files.key)?;
        *self
            .keys
            .current
            .write()
            .unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// Read the client CAs again (`None`: none are configured); on success
    /// new handshakes verify against them, on failure nothing changes.
    pub(crate) fn reload_client_ca(&self) -> Option<Result<(), TlsFileError>> {
        self.files.client.as_ref()?;
        Some(client_verifier(&self.files).map(|verifier| {
            self.config.store(server_config(&self.keys, verifier, true));
        }))
    }

    /// The TLS acceptor for a new connection: the client CAs in force now.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.load_full())
    }
}

/// The verifier `files` ask for: client certificates against `client_ca`,
/// or none.
fn client_verifier(files: &ListenerTls) -> Result<Arc<dyn ClientCertVerifier>, TlsFileError> {
    match &files.client {
        None => Ok(WebPkiClientVerifier::no_client_auth()),
        Some(client) => read_client_verifier(&client.ca, client.auth == ClientAuth::Required),
    }
}

/// The listener's config; `client_certs`: the verifier asks for them.
fn server_config(
    keys: &Arc<Keys>,
    verifier: Arc<dyn ClientCertVerifier>,
    client_certs: bool,
) -> Arc<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(keys.clone());
    config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
    if client_certs {
        // A resumed session brings its client certificate back without
        // verifying it again (rustls keeps the chain in the session), so a
        // certificate that has expired, or whose CA is no longer trusted
        // in this config, would keep its identity: every connection with
        // client certificates makes a full handshake.
        config.session_storage = Arc::new(NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
    }
    Arc::new(config)
}

impl ResolvesServerCert for Keys {
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

/// The identity of the client certificate the handshake verified (rustls
/// hands out peer certificates only once its verifier accepted them);
/// `None` without one. A certificate that cannot be read gives none, and
/// is logged.
pub(super) fn identity(connection: &ServerConnection) -> Option<Arc<ClientIdentity>> {
    let leaf = connection.peer_certificates()?.first()?;
    match ClientIdentity::of(leaf) {
        Ok(identity) => Some(Arc::new(identity)),
        Err(error) => {
            tracing::warn!(%error, "a verified client certificate has no usable identity");
            None
        }
    }
}
