//! Throwaway certificates for the TLS tests, made with the `openssl`
//! command in a temporary directory at test time (never committed): a CA
//! ([`Pki::new`]) and server certificates it signs ([`Pki::issue`]), plus
//! the rustls configurations the tests' clients and servers use.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A throwaway CA and the files it issued; removed on drop.
pub struct Pki {
    dir: tempfile::TempDir,
}

/// A server certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Issued {
    /// The certificate, DER.
    pub fn der(&self) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(&self.cert).expect("a PEM certificate")
    }

    /// A rustls server configuration serving it, offering `alpn`.
    pub fn server_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
        let chain = vec![self.der()];
        let key = PrivateKeyDer::from_pem_file(&self.key).expect("a PEM key");
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("the certificate and key match");
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

/// A hyper client over TLS with `config` (its ALPN set by the connector):
/// HTTP/2 only if `h2`, else HTTP/1.1.
pub fn https_client(
    config: rustls::ClientConfig,
    h2: bool,
) -> Client<HttpsConnector<HttpConnector>, Full<Bytes>> {
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only();
    if h2 {
        Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build(builder.enable_http2().build())
    } else {
        Client::builder(TokioExecutor::new()).build(builder.enable_http1().build())
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl is installed");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC_KEY: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

impl Pki {
    /// A new CA (`ca.pem`, `ca.key`).
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("idemgate-pki-")
            .tempdir()
            .unwrap();
        let mut args = vec!["req", "-x509"];
        args.extend(EC_KEY);
        args.extend([
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=idemgate-test-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ]);
        openssl(dir.path(), &args);
        Self { dir }
    }

    /// The CA certificate's PEM file.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A directory for the test's other files (removed with the CA).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A server certificate `name` for `san` (`IP:127.0.0.1`,
    /// `DNS:wrong.example`), signed by this CA.
    pub fn issue(&self, name: &str, san: &str) -> Issued {
        let (cert, key) = (format!("{name}.pem"), format!("{name}.key"));
        let san = format!("subjectAltName={san}");
        let subject = format!("/CN={name}");
        let mut args = vec!["req", "-x509"];
        args.extend(EC_KEY);
        args.extend([
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &cert,
            "-days",
            "2",
            "-subj",
            &subject,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-addext",
            &san,
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-addext",
            "extendedKeyUsage=serverAuth",
        ]);
        openssl(self.dir.path(), &args);
        Issued {
            cert: self.dir.path().join(cert),
            key: self.dir.path().join(key),
        }
    }

    /// A rustls client configuration trusting this CA only, offering `alpn`.
    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        self.client_config_as(alpn, None)
    }

    /// [`Pki::client_config`] presenting the client certificate `chain`
    /// with its `key`, if given.
    pub fn client_config_as(
        &self,
        alpn: &[&[u8]],
        client: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    ) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(self.ca()).unwrap())
            .unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let mut config = match client {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .expect("the client certificate and key match"),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}
