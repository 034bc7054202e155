//! The TLS settings: a route's `upstream_ca` (read and checked now, so an
//! unreadable or invalid file stops `check` and start-up, naming the file
//! and the route) and the `[tls]` table (both files required; the chain and
//! key are loaded once to prove they belong together, and loaded again by
//! the listener; `client_ca` is read once the same way, and `client_auth`
//! needs it). A route whose scope reads the client certificate needs
//! `client_ca` ([`cert_parts_fit`]).

use crate::config::settings::{self as S, Setting};
use std::path::{Path, PathBuf};

use crate::config::raw::{RawRoute, RawTls};
use crate::config::{
    ClientAuth, ClientCerts, ConfigError, ListenerTls, Route, UpstreamCa, invalid,
};
use crate::tls::{TlsFileError, read_ca_file, read_certified_key, read_client_verifier};

/// `upstream_ca` of the route `name` at `at`.
pub(super) fn upstream_ca(
    at: &str,
    name: &str,
    r: &RawRoute,
) -> Result<Option<UpstreamCa>, ConfigError> {
    let Some(text) = r.upstream_ca.as_deref() else {
        return Ok(None);
    };
    let path = PathBuf::from(text);
    let certs = read_ca_file(&path).map_err(|e| {
        invalid(
            S::UPSTREAM_CA.at(at),
            format!("route {name:?}: {e} (a PEM file of CA certificates)"),
        )
    })?;
    Ok(Some(UpstreamCa { path, certs }))
}

/// `[tls]`.
pub(super) fn listener(raw: Option<RawTls>) -> Result<Option<ListenerTls>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let required = |setting: &Setting, value: Option<String>| {
        value
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .ok_or_else(|| {
                invalid(
                    setting.path(),
                    "is required in [tls] (a PEM file path); remove [tls] to serve cleartext",
                )
            })
    };
    let tls = ListenerTls {
        cert: required(&S::TLS_CERT, raw.cert)?,
        key: required(&S::TLS_KEY, raw.key)?,
        client: client_certs(raw.client_ca, raw.client_auth)?,
    };
    read_certified_key(&tls.cert, &tls.key).map_err(|e| {
        let setting = if file_of(&e) == tls.cert {
            S::TLS_CERT
        } else {
            S::TLS_KEY
        };
        invalid(setting.path(), e.to_string())
    })?;
    Ok(Some(tls))
}

/// `client_ca` and `client_auth`: the CA file read and checked now.
fn client_certs(
    ca: Option<String>,
    auth: Option<ClientAuth>,
) -> Result<Option<ClientCerts>, ConfigError> {
    let Some(ca) = ca.filter(|c| !c.is_empty()).map(PathBuf::from) else {
        return match auth {
            None => Ok(None),
            Some(_) => Err(invalid(
                S::TLS_CLIENT_AUTH.path(),
                format!(
                    "needs {}: set it to the PEM file of the CAs that issue client certificates, \
                     or remove client_auth",
                    S::TLS_CLIENT_CA.path()
                ),
            )),
        };
    };
    let auth = auth.unwrap_or(ClientAuth::Required);
    read_client_verifier(&ca, auth == ClientAuth::Required).map_err(|e| {
        invalid(
            S::TLS_CLIENT_CA.path(),
            format!("{e} (a PEM file of CA certificates)"),
        )
    })?;
    Ok(Some(ClientCerts { ca, auth }))
}

/// A route whose `scope_from` reads the client certificate (`cert:`)
/// needs a listener that asks for one (`[tls] client_ca`).
pub(in crate::config) fn cert_parts_fit(
    tls: Option<&ListenerTls>,
    routes: &[Route],
) -> Result<(), ConfigError> {
    if tls.is_some_and(|t| t.client.is_some()) {
        return Ok(());
    }
    let needing = routes
        .iter()
        .enumerate()
        .find_map(|(i, r)| Some((i, r, r.scope_from.iter().find(|p| p.reads_cert())?)));
    match needing {
        None => Ok(()),
        Some((i, route, part)) => Err(invalid(
            S::SCOPE_FROM.at(&format!("routes[{i}]")),
            format!(
                "route {:?} reads {part}, but the listener asks for no client certificate: \
                 set [tls] client_ca (a restart applies it), or remove the part",
                route.name
            ),
        )),
    }
}

fn file_of(e: &TlsFileError) -> &Path {
    match e {
        TlsFileError::Read { path, .. } | TlsFileError::Invalid { path, .. } => path,
    }
}

#[cfg(test)]
mod tests {
    use crate::config::ClientAuth;
    use crate::config::tests::{MINIMAL, error, parse, route_error};

    #[test]
    fn an_unreadable_upstream_ca_names_the_file_and_the_route() {
        let err = route_error("upstream_ca = \"/nonexistent/ca.pem\"");
        assert!(
            err.contains("routes[0].upstream_ca")
                && err.contains("\"payments\"")
                && err.contains("/nonexistent/ca.pem"),
            "{err}"
        );
    }

    #[test]
    fn tls_needs_both_files_and_names_the_one_that_fails() {
        let err = error(&format!("[tls]\ncert = \"/x/cert.pem\"\n{MINIMAL}"));
        assert!(err.contains("tls.key") && err.contains("required"), "{err}");
        let err = error(&format!(
            "[tls]\ncert = \"/x/cert.pem\"\nkey = \"/x/key.pem\"\n{MINIMAL}"
        ));
        assert!(
            err.contains("tls.cert") && err.contains("/x/cert.pem"),
            "{err}"
        );
    }

    /// A `[tls]` table with a real certificate and key (and a CA for
    /// client certificates), written in `dir`; `extra` lines added.
    fn tls_table(dir: &std::path::Path, extra: &str) -> String {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&KeyPair::generate().unwrap()).unwrap();
        for (name, text) in [
            ("cert.pem", cert.pem()),
            ("key.pem", key.serialize_pem()),
            ("ca.pem", ca.pem()),
        ] {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let d = dir.display();
        format!("[tls]\ncert = \"{d}/cert.pem\"\nkey = \"{d}/key.pem\"\n{extra}\n")
    }

    #[test]
    fn client_auth_needs_client_ca_and_a_bad_ca_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let err = error(&format!(
            "{}{MINIMAL}",
            tls_table(dir.path(), "client_auth = \"optional\"")
        ));
        assert!(
            err.contains("tls.client_auth") && err.contains("tls.client_ca"),
            "{err}"
        );
        let err = error(&format!(
            "{}{MINIMAL}",
            tls_table(dir.path(), &format!("client_ca = \"{d}/nope.pem\""))
        ));
        assert!(
            err.contains("tls.client_ca") && err.contains("nope.pem"),
            "{err}"
        );
        // The control: the CA file, either way.
        for auth in ["", "client_auth = \"optional\""] {
            let text = format!(
                "{}{MINIMAL}",
                tls_table(dir.path(), &format!("client_ca = \"{d}/ca.pem\"\n{auth}"))
            );
            let client = parse(&text).unwrap().tls.unwrap().client.unwrap();
            let optional = auth.is_empty().then_some(ClientAuth::Required);
            assert_eq!(client.auth, optional.unwrap_or(ClientAuth::Optional));
        }
    }

    #[test]
    fn a_cert_part_needs_client_ca_and_is_a_scope_part_only() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let line = "scope_from = [\"cert:san-uri\"]";
        let err = error(&format!("{}{MINIMAL}\n{line}\n", tls_table(dir.path(), "")));
        assert!(
            err.contains("routes[0].scope_from")
                && err.contains("\"payments\"")
                && err.contains("client_ca"),
            "{err}"
        );
        let err = route_error(line);
        assert!(err.contains("routes[0].scope_from"), "{err}");
        let with_ca = tls_table(dir.path(), &format!("client_ca = \"{d}/ca.pem\""));
        assert!(parse(&format!("{with_ca}{MINIMAL}\n{line}\n")).is_ok());
        let err = error(&format!(
            "{with_ca}{MINIMAL}\nkey_from = [\"cert:subject\"]\n"
        ));
        assert!(
            err.contains("routes[0].key_from") && err.contains("scope part only"),
            "{err}"
        );
    }
}
