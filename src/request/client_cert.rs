//! The client certificate's identity (`[tls] client_ca`): what the `cert:`
//! scope parts read ([`super::key_source`]). The server reads the leaf
//! certificate of a connection whose handshake the verifier accepted
//! (`src/server/tls.rs`) and puts one [`ClientIdentity`] into every request
//! of that connection as an extension; a connection without a verified
//! certificate carries none.
//!
//! The forms (docs/src/stores/tls.md, "Client certificates"):
//! - `cert:subject`: the subject DN as an RFC 4514 string (OpenSSL's
//!   `-nameopt RFC2253` agrees on ASCII values of the usual attributes
//!   only): the RDNs last to first, `,` between them, `+` inside one,
//!   the short names `CN`, `L`, `ST`, `O`, `OU`, `C`, `STREET`, `DC`, `UID`
//!   (any other type as its dotted OID and its value as `#` and the hex of
//!   its DER), values escaped as RFC 4514 §2.4 says. It depends only on the
//!   subject, so a certificate re-issued to the same subject keeps it.
//! - `cert:san-uri`, `cert:san-dns`: every URI (a SPIFFE ID) or DNS name
//!   among the subject alternative names, sorted, each once.

use x509_parser::der_parser::asn1_rs::ToDer;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::x509::{AttributeTypeAndValue, X509Name};

/// What a verified client certificate says about its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The subject DN, RFC 4514 (empty: the subject is empty).
    pub subject: String,
    /// The URI subject alternative names, sorted, each once.
    pub san_uri: Vec<String>,
    /// The DNS subject alternative names, sorted, each once.
    pub san_dns: Vec<String>,
}

/// A leaf certificate that cannot be read (the verifier accepted it, so
/// this is rare: an extension x509-parser refuses).
#[derive(Debug, thiserror::Error)]
#[error("the client certificate cannot be read: {0}")]
pub struct UnreadableCertificate(String);

impl ClientIdentity {
    /// The identity in the DER certificate `der`.
    pub fn of(der: &[u8]) -> Result<Self, UnreadableCertificate> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| UnreadableCertificate(e.to_string()))?;
        let subject = rfc4514(cert.subject()).map_err(UnreadableCertificate)?;
        let (mut san_uri, mut san_dns) = (Vec::new(), Vec::new());
        let san = cert
            .subject_alternative_name()
            .map_err(|e| UnreadableCertificate(e.to_string()))?;
        for name in san.iter().flat_map(|s| &s.value.general_names) {
            match name {
                GeneralName::URI(uri) => san_uri.push((*uri).to_string()),
                GeneralName::DNSName(dns) => san_dns.push((*dns).to_string()),
                _ => {}
            }
        }
        for names in [&mut san_uri, &mut san_dns] {
            names.sort();
            names.dedup();
        }
        Ok(Self {
            subject,
            san_uri,
            san_dns,
        })
    }
}

/// `name` as RFC 4514 says: last RDN first.
fn rfc4514(name: &X509Name<'_>) -> Result<String, String> {
    let mut rdns = Vec::new();
    for rdn in name.iter() {
        let attributes: Result<Vec<String>, String> = rdn.iter().map(attribute).collect();
        rdns.push(attributes?.join("+"));
    }
    rdns.reverse();
    Ok(rdns.join(","))
}

/// One `type=value`.
fn attribute(attribute: &AttributeTypeAndValue<'_>) -> Result<String, String> {
    let oid = attribute.attr_type().to_id_string();
    let short = match oid.as_str() {
        "2.5.4.3" => Some("CN"),
        "2.5.4.7" => Some("L"),
        "2.5.4.8" => Some("ST"),
        "2.5.4.10" => Some("O"),
        "2.5.4.11" => Some("OU"),
        "2.5.4.6" => Some("C"),
        "2.5.4.9" => Some("STREET"),
        "0.9.2342.19200300.100.1.25" => Some("DC"),
        "0.9.2342.19200300.100.1.1" => Some("UID"),
        _ => None,
    };
    match (short, attribute.as_str()) {
        (Some(short), Ok(text)) => Ok(format!("{short}={}", escape(text))),
        _ => {
            let der = attribute
                .attr_value()
                .to_der_vec()
                .map_err(|e| format!("a subject attribute cannot be encoded: {e}"))?;
            Ok(format!("{oid}=#{}", hex::encode(der)))
        }
    }
}

/// RFC 4514 §2.4: `"+,;<>\` always, a leading space or `#`, a trailing
/// space, and NUL.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        match c {
            '"' | '+' | ',' | ';' | '<' | '>' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '#' if i == 0 => out.push_str("\\#"),
            ' ' if i == 0 || i == last => out.push_str("\\ "),
            '\0' => out.push_str("\\00"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_as_rfc_4514_says() {
        assert_eq!(escape("plain"), "plain");
        assert_eq!(escape("a,b+c"), "a\\,b\\+c");
        assert_eq!(escape("#x"), "\\#x");
        assert_eq!(escape(" x "), "\\ x\\ ");
        assert_eq!(escape("a\"<>;\\"), "a\\\"\\<\\>\\;\\\\");
        assert_eq!(escape("x#y"), "x#y");
    }

    #[test]
    fn a_certificate_gives_its_subject_and_names() {
        use rcgen::{CertificateParams, DnType, KeyPair, SanType};
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Acme, Inc.");
        params
            .distinguished_name
            .push(DnType::CommonName, "payments");
        params.subject_alt_names = vec![
            SanType::URI("spiffe://acme/b".try_into().unwrap()),
            SanType::DnsName("b.example".try_into().unwrap()),
            SanType::URI("spiffe://acme/a".try_into().unwrap()),
            SanType::URI("spiffe://acme/b".try_into().unwrap()),
        ];
        let cert = params.self_signed(&KeyPair::generate().unwrap()).unwrap();
        let identity = ClientIdentity::of(cert.der()).unwrap();
        assert_eq!(identity.subject, "CN=payments,O=Acme\\, Inc.");
        assert_eq!(identity.san_uri, ["spiffe://acme/a", "spiffe://acme/b"]);
        assert_eq!(identity.san_dns, ["b.example"]);
    }

    #[test]
    fn garbage_is_not_a_certificate() {
        assert!(ClientIdentity::of(b"not DER").is_err());
    }
}
