//! The TLS settings: a route's `upstream_ca` (read and checked now, so an
//! unreadable or invalid file stops `check` and start-up, naming the file
//! and the route) and the `[tls]` table (both files required; the chain and
//! key are loaded once to prove they belong together, and loaded again by
//! the listener).

use crate::config::settings::{self as S, Setting};
use std::path::{Path, PathBuf};

use crate::config::raw::{RawRoute, RawTls};
use crate::config::{ConfigError, ListenerTls, UpstreamCa, invalid};
use crate::tls::{TlsFileError, read_ca_file, read_certified_key};

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

fn file_of(e: &TlsFileError) -> &Path {
    match e {
        TlsFileError::Read { path, .. } | TlsFileError::Invalid { path, .. } => path,
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{MINIMAL, error, route_error};

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
}
