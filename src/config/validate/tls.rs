//! The TLS settings: a route's `upstream_ca` (read and checked now, so an
//! unreadable or invalid file stops `check` and start-up, naming the file
//! and the route).

use std::path::PathBuf;

use super::key;
use crate::config::raw::RawRoute;
use crate::config::{ConfigError, UpstreamCa, invalid};
use crate::tls::read_ca_file;

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
            key(at, "upstream_ca"),
            format!("route {name:?}: {e} (a PEM file of CA certificates)"),
        )
    })?;
    Ok(Some(UpstreamCa { path, certs }))
}

#[cfg(test)]
mod tests {
    use crate::config::tests::route_error;

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
}
