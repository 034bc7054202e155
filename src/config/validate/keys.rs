//! Where a route finds the idempotency key and its scope: `key_header` and
//! `scope_header` (`key_required` is a plain boolean, taken in `route`).

use http::HeaderName;

use super::key;
use crate::config::defaults::DEFAULT_KEY_HEADER;
use crate::config::raw::RawRoute;
use crate::config::values::header_name;
use crate::config::{ConfigError, invalid};

/// `key_header` and the optional `scope_header` (empty: none), which must differ.
pub(super) fn headers(
    at: &str,
    r: &RawRoute,
) -> Result<(HeaderName, Option<HeaderName>), ConfigError> {
    let key_header = match r.key_header.as_deref() {
        Some(text) => header_name(&key(at, "key_header"), text)?,
        None => DEFAULT_KEY_HEADER,
    };
    let scope_header = r
        .scope_header
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(|s| header_name(&key(at, "scope_header"), s))
        .transpose()?;
    if scope_header.as_ref() == Some(&key_header) {
        return Err(invalid(
            key(at, "scope_header"),
            "must differ from key_header",
        ));
    }
    Ok((key_header, scope_header))
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{MINIMAL, parse, route_error};

    #[test]
    fn scope_header_must_differ_from_key_header() {
        let line = "scope_header = \"idempotency-key\"";
        let err = route_error(line);
        assert!(err.contains("routes[0].scope_header"), "{line}: {err}");
    }

    #[test]
    fn headers_are_case_insensitive_and_empty_scope_is_none() {
        let text = format!("{MINIMAL}\nkey_header = \"X-Key\"\nscope_header = \"\"\n");
        let r = &parse(&text).unwrap().routes[0];
        assert_eq!(r.key_header, "x-key");
        assert_eq!(r.scope_header, None);
        let text = format!("{MINIMAL}\nscope_header = \"Authorization\"\n");
        let r = &parse(&text).unwrap().routes[0];
        assert_eq!(r.scope_header, Some(http::header::AUTHORIZATION));
        let err = route_error("key_header = \"bad key\"");
        assert!(err.contains("routes[0].key_header"), "{err}");
    }
}
