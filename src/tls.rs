//! TLS material from PEM files, for both sides of the gateway: a CA bundle
//! (`upstream_ca`, trusted for `https://` upstreams; `[tls] client_ca`,
//! trusted for client certificates) and a certificate chain with its
//! private key (`[tls]`, the proxy listener's). rustls runs on ring
//! everywhere ([`provider`]); every error names the file it is about.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::CertifiedKey;

/// A PEM file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// The file could not be read. (The reason is part of the message,
    /// not a source, so a chain of errors prints it once.)
    #[error("cannot read {}: {reason}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: std::io::Error,
    },
    /// The file is not the PEM it should be.
    #[error("{}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
}

impl TlsFileError {
    pub(crate) fn invalid(path: &Path, message: impl Into<String>) -> Self {
        Self::Invalid {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }
}

/// The one crypto provider: rustls's ring backend (aws-lc is a long C
/// build, and sqlx's and deadpool-redis's TLS use ring too).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|reason| TlsFileError::Read {
        path: path.to_path_buf(),
        reason,
    })
}

fn certificates(path: &Path, text: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certs = CertificateDer::pem_slice_iter(text)
        .collect::<Result<Vec<_>, pem::Error>>()
        .map_err(|e| TlsFileError::invalid(path, format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(TlsFileError::invalid(
            path,
            "holds no certificate (no `-----BEGIN CERTIFICATE-----` section)",
        ));
    }
    Ok(certs)
}

/// The certificates of a CA bundle, each checked to be usable as a trust
/// anchor. At least one.
pub fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certs = certificates(path, &read(path)?)?;
    let mut roots = RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        roots.add(cert.clone()).map_err(|e| {
            TlsFileError::invalid(path, format!("certificate #{} is not usable: {e}", i + 1))
        })?;
    }
    Ok(certs)
}

/// The verifier of client certificates issued by the CAs in `path`:
/// `required`, a client without one fails the handshake; otherwise it may
/// present none (one it presents must verify all the same).
pub fn read_client_verifier(
    path: &Path,
    required: bool,
) -> Result<Arc<dyn ClientCertVerifier>, TlsFileError> {
    let mut roots = RootCertStore::empty();
    for cert in read_ca_file(path)? {
        roots
            .add(cert)
            .map_err(|e| TlsFileError::invalid(path, format!("not usable as a CA: {e}")))?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
    let builder = if required {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    builder
        .build()
        .map_err(|e| TlsFileError::invalid(path, format!("cannot verify client certificates: {e}")))
}

/// A certificate chain (the server's certificate first) and its private key
/// (PKCS#8, PKCS#1 or SEC1), checked to belong together.
pub fn read_certified_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsFileError> {
    let chain = certificates(cert, &read(cert)?)?;
    let private = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsFileError::invalid(
            key,
            "holds no private key (no `-----BEGIN … PRIVATE KEY-----` section)",
        ),
        e => TlsFileError::invalid(key, format!("not a valid PEM private key: {e}")),
    })?;
    let signing = provider()
        .key_provider
        .load_private_key(private)
        .map_err(|e| TlsFileError::invalid(key, format!("unusable private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(_)) => {
            return Err(TlsFileError::invalid(
                key,
                format!(
                    "does not match the certificate in {} (its public key differs)",
                    cert.display()
                ),
            ));
        }
        Err(e) => {
            return Err(TlsFileError::invalid(
                cert,
                format!("the first certificate cannot be read: {e}"),
            ));
        }
    }
    Ok(Arc::new(certified))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_empty_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = read_ca_file(&missing).unwrap_err().to_string();
        assert!(err.contains("missing.pem"), "{err}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no pem here\n").unwrap();
        let err = read_ca_file(&empty).unwrap_err().to_string();
        assert!(
            err.contains("empty.pem") && err.contains("no certificate"),
            "{err}"
        );
        let err = read_certified_key(&empty, &missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("empty.pem"), "{err}");
    }

    #[test]
    fn garbage_between_markers_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.pem");
        std::fs::write(
            &bad,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = read_ca_file(&bad).unwrap_err().to_string();
        assert!(err.contains("bad.pem") && err.contains("#1"), "{err}");
    }
}
