//! Which requests a route takes and where it sends them: `name`, `match`,
//! `upstream` and `methods`.

use http::{Method, Uri};

use crate::config::raw::RawRoute;
use crate::config::settings::{MATCH, METHODS, NAME, UPSTREAM};
use crate::config::{ConfigError, PathMatch, invalid};

/// `name`: required, not blank.
pub(super) fn name(at: &str, r: &RawRoute) -> Result<String, ConfigError> {
    r.name
        .clone()
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| invalid(NAME.at(at), "every route needs a non-empty name"))
}

/// `match`: required, `"/exact"` or `"/prefix/*"`.
pub(super) fn path(at: &str, r: &RawRoute) -> Result<PathMatch, ConfigError> {
    let text = r.path.as_deref().ok_or_else(|| {
        invalid(
            MATCH.at(at),
            "every route needs `match` (\"/exact\" or \"/prefix/*\")",
        )
    })?;
    PathMatch::parse(text).ok_or_else(|| {
        invalid(
            MATCH.at(at),
            format!(
                "{text:?} must be an exact path (\"/v1/pay\") or a prefix ending in /* (\"/v1/*\")"
            ),
        )
    })
}

/// `upstream`: required, `http://` or `https://` with a host and no query.
pub(super) fn upstream(at: &str, r: &RawRoute) -> Result<Uri, ConfigError> {
    let text = r
        .upstream
        .as_deref()
        .ok_or_else(|| invalid(UPSTREAM.at(at), "every route needs an upstream URL"))?;
    text.parse()
        .ok()
        .filter(|u: &Uri| {
            matches!(u.scheme_str(), Some("http" | "https"))
                && u.authority().is_some()
                && u.query().is_none()
        })
        .ok_or_else(|| {
            invalid(
                UPSTREAM.at(at),
                format!("{text:?} must be an http:// or https:// URL with a host and no query"),
            )
        })
}

/// `methods`: HTTP methods (any case), at least one.
pub(super) fn methods(at: &str, r: &RawRoute) -> Result<Vec<Method>, ConfigError> {
    let texts = r.methods.clone().unwrap_or_else(|| METHODS.strings());
    let methods: Vec<Method> = texts
        .iter()
        .map(|m| {
            Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .map_err(|_| invalid(METHODS.at(at), format!("{m:?} is not an HTTP method")))
        })
        .collect::<Result<_, _>>()?;
    if methods.is_empty() {
        return Err(invalid(
            METHODS.at(at),
            format!(
                "protects nothing; list at least one method (default {})",
                METHODS.toml()
            ),
        ));
    }
    Ok(methods)
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{MINIMAL, error, parse, route_error};

    #[test]
    fn route_names_are_required() {
        let err = error("[[routes]]\nmatch = \"/a\"\nupstream = \"http://h:1\"\n");
        assert!(err.contains("routes[0].name"), "{err}");
    }

    #[test]
    fn match_is_required() {
        let err = error("[[routes]]\nname = \"a\"\nupstream = \"http://h:1\"\n");
        assert!(err.contains("routes[0].match"), "{err}");
    }

    #[test]
    fn upstream_must_be_http_or_https() {
        assert!(parse(&MINIMAL.replace("http://127.0.0.1:9000", "https://h")).is_ok());
        assert!(parse(&MINIMAL.replace("http://127.0.0.1:9000", "ftp://h")).is_err());
        assert!(parse(&MINIMAL.replace("http://127.0.0.1:9000", "not a url")).is_err());
        assert!(parse(&MINIMAL.replace("http://127.0.0.1:9000", "http://h:1/base")).is_ok());
    }

    #[test]
    fn methods_must_protect_something() {
        let err = route_error("methods = []");
        assert!(err.contains("routes[0].methods"), "{err}");
        assert!(err.contains("at least one method (default [\""), "{err}");
        let c = parse(&format!("{MINIMAL}\nmethods = [\"put\"]\n")).unwrap();
        assert_eq!(c.routes[0].methods, vec![http::Method::PUT]);
    }
}
