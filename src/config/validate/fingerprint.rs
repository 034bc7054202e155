//! What a route's request fingerprint covers: the `fingerprint` table
//! (method, path, query, listed headers, body mode and JSON-pointer exclusions).

use crate::config::defaults::{
    DEFAULT_FINGERPRINT_BODY, DEFAULT_FINGERPRINT_METHOD, DEFAULT_FINGERPRINT_PATH,
    DEFAULT_FINGERPRINT_QUERY,
};
use crate::config::raw::RawRoute;
use crate::config::settings as S;
use crate::config::values::header_name;
use crate::config::{ConfigError, invalid};
use crate::request::fingerprint::{BodyMode, FingerprintSpec};

/// `fingerprint`: exclusions only with `body = "json"`, and each a JSON pointer.
pub(super) fn fingerprint(at: &str, r: &RawRoute) -> Result<FingerprintSpec, ConfigError> {
    let fp = r.fingerprint.clone().unwrap_or_default();
    let body = fp.body.unwrap_or(DEFAULT_FINGERPRINT_BODY);
    let exclude = fp.exclude.unwrap_or_default();
    if !exclude.is_empty() && body != BodyMode::Json {
        return Err(invalid(
            S::FINGERPRINT_EXCLUDE.at(at),
            "JSON-pointer exclusions need fingerprint.body = \"json\"",
        ));
    }
    if let Some(bad) = exclude.iter().find(|p| !p.starts_with('/')) {
        return Err(invalid(
            S::FINGERPRINT_EXCLUDE.at(at),
            format!("{bad:?} is not a JSON pointer (it must start with /)"),
        ));
    }
    Ok(FingerprintSpec {
        method: fp.method.unwrap_or(DEFAULT_FINGERPRINT_METHOD),
        path: fp.path.unwrap_or(DEFAULT_FINGERPRINT_PATH),
        query: fp.query.unwrap_or(DEFAULT_FINGERPRINT_QUERY),
        headers: fp
            .headers
            .unwrap_or_default()
            .iter()
            .map(|h| header_name(&S::FINGERPRINT_HEADERS.at(at), h))
            .collect::<Result<_, _>>()?,
        body,
        exclude,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{MINIMAL, error, parse, route_error};

    #[test]
    fn fingerprint_settings_validate() {
        let text = format!(
            "{MINIMAL}\nfingerprint = {{ body = \"json\", exclude = [\"/ts\"], headers = [\"content-type\"] }}\n"
        );
        let f = &parse(&text).unwrap().routes[0].fingerprint;
        assert_eq!(f.body, BodyMode::Json);
        assert_eq!(f.exclude, vec!["/ts".to_string()]);
        let err = route_error("fingerprint = { exclude = [\"/ts\"] }");
        assert!(err.contains("fingerprint.exclude"), "{err}");
    }

    #[test]
    fn fingerprint_defaults_and_bad_pointers() {
        let f = &parse(MINIMAL).unwrap().routes[0].fingerprint;
        assert_eq!(f.method, DEFAULT_FINGERPRINT_METHOD);
        assert_eq!(f.path, DEFAULT_FINGERPRINT_PATH);
        assert_eq!(f.query, DEFAULT_FINGERPRINT_QUERY);
        assert_eq!(f.body, DEFAULT_FINGERPRINT_BODY);
        assert!(f.headers.is_empty() && f.exclude.is_empty());
        let text = format!("{MINIMAL}\nfingerprint = {{ body = \"json\", exclude = [\"ts\"] }}\n");
        let err = error(&text);
        assert!(
            err.contains("routes[0].fingerprint.exclude") && err.contains("\"ts\""),
            "{err}"
        );
    }
}
