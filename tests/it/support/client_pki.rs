//! Throwaway client certificates for the mTLS tests, made in the test with
//! `rcgen` (no files but the CA's PEM, which the gateway reads): a CA
//! ([`ClientCa::new`]) and client certificates it signs, valid or expired,
//! with a subject CN and a URI subject alternative name (a SPIFFE ID).

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, date_time_ymd,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A CA for client certificates.
pub struct ClientCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

/// A client certificate and its key.
pub struct ClientCert {
    pub der: CertificateDer<'static>,
    key: Vec<u8>,
}

impl ClientCert {
    /// What a rustls client configuration presents: the chain and the key.
    pub fn presented(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()));
        (vec![self.der.clone()], key)
    }
}

impl ClientCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A client certificate for `CN=cn` with the URI SAN `uri` (none if
    /// empty), valid now.
    pub fn issue(&self, cn: &str, uri: &str) -> ClientCert {
        self.issue_with(cn, uri, false)
    }

    /// The same, expired (valid in 2000 only).
    pub fn issue_expired(&self, cn: &str, uri: &str) -> ClientCert {
        self.issue_with(cn, uri, true)
    }

    fn issue_with(&self, cn: &str, uri: &str, expired: bool) -> ClientCert {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "idemgate tests");
        params.distinguished_name.push(DnType::CommonName, cn);
        if !uri.is_empty() {
            params.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if expired {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2000, 12, 31);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        ClientCert {
            der: cert.der().clone(),
            key: key.serialize_der(),
        }
    }
}
