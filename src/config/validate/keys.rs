//! Where a route finds the idempotency key and its scope: `key_from` and
//! `scope_from` (lists of parts), or their shorthands `key_header` and
//! `scope_header` (`key_required` is a plain boolean, taken in `route`).

use crate::config::raw::RawRoute;
use crate::config::settings::{KEY_FROM, KEY_HEADER, SCOPE_FROM, SCOPE_HEADER};
use crate::config::values::header_name;
use crate::config::{ConfigError, invalid};
use crate::request::key_source::{KeyPart, MAX_PARTS};

/// A table (a route before merging, or `[defaults]`) sets each of the key
/// and the scope in one form at most.
pub(super) fn one_form(at: &str, r: &RawRoute) -> Result<(), ConfigError> {
    if r.key_header.is_some() && r.key_from.is_some() {
        return Err(invalid(
            KEY_FROM.at(at),
            "set either key_from or key_header (its shorthand), not both",
        ));
    }
    if r.scope_header.is_some() && r.scope_from.is_some() {
        return Err(invalid(
            SCOPE_FROM.at(at),
            "set either scope_from or scope_header (its shorthand), not both",
        ));
    }
    Ok(())
}

/// The key parts (default: the `Idempotency-Key` header) and the scope
/// parts (default: none), which share no part.
pub(super) fn sources(at: &str, r: &RawRoute) -> Result<(Vec<KeyPart>, Vec<KeyPart>), ConfigError> {
    let key_from = match (&r.key_from, &r.key_header) {
        (Some(texts), _) => parts(&KEY_FROM.at(at), texts)?,
        (None, Some(name)) => parts(&KEY_HEADER.at(at), &[format!("header:{name}")])?,
        (None, None) => vec![KeyPart::Header(header_name(
            &KEY_HEADER.at(at),
            KEY_HEADER.text(),
        )?)],
    };
    if key_from.is_empty() {
        return Err(invalid(KEY_FROM.at(at), "names no part; give at least one"));
    }
    if let Some(cert) = key_from.iter().find(|p| p.reads_cert()) {
        return Err(invalid(
            KEY_FROM.at(at),
            format!(
                "{cert} is a scope part only (the certificate names the caller, not the \
                 request): put it in scope_from"
            ),
        ));
    }
    let scope_from = match (&r.scope_from, r.scope_header.as_deref()) {
        (Some(texts), _) => parts(&SCOPE_FROM.at(at), texts)?,
        (None, Some("") | None) => Vec::new(),
        (None, Some(name)) => parts(&SCOPE_HEADER.at(at), &[format!("header:{name}")])?,
    };
    if let Some(shared) = scope_from.iter().find(|p| key_from.contains(p)) {
        let at = if r.scope_from.is_some() {
            SCOPE_FROM.at(at)
        } else {
            SCOPE_HEADER.at(at)
        };
        return Err(invalid(
            at,
            format!("{shared} is also a key part; the scope must come from elsewhere"),
        ));
    }
    Ok((key_from, scope_from))
}

fn parts(at: &str, texts: &[String]) -> Result<Vec<KeyPart>, ConfigError> {
    if texts.len() > MAX_PARTS {
        return Err(invalid(at, format!("at most {MAX_PARTS} parts")));
    }
    let mut parts: Vec<KeyPart> = Vec::with_capacity(texts.len());
    for text in texts {
        let part = KeyPart::parse(text).map_err(|message| invalid(at, message))?;
        if parts.contains(&part) {
            return Err(invalid(at, format!("{part} is named twice")));
        }
        parts.push(part);
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{MINIMAL, error, parse, route_error};
    use crate::request::key_source::KeyPart;

    #[test]
    fn scope_must_differ_from_the_key() {
        let line = "scope_header = \"idempotency-key\"";
        let err = route_error(line);
        assert!(err.contains("routes[0].scope_header"), "{line}: {err}");
        let line = "key_from = [\"json:/id\"]\nscope_from = [\"json:/id\"]";
        let err = route_error(line);
        assert!(err.contains("routes[0].scope_from"), "{line}: {err}");
    }

    #[test]
    fn headers_are_case_insensitive_and_empty_scope_is_none() {
        let text = format!("{MINIMAL}\nkey_header = \"X-Key\"\nscope_header = \"\"\n");
        let r = &parse(&text).unwrap().routes[0];
        assert_eq!(r.key_from, [KeyPart::Header("x-key".parse().unwrap())]);
        assert!(r.scope_from.is_empty());
        let text = format!("{MINIMAL}\nscope_header = \"Authorization\"\n");
        let r = &parse(&text).unwrap().routes[0];
        assert_eq!(r.scope_from, [KeyPart::Header(http::header::AUTHORIZATION)]);
        let err = route_error("key_header = \"bad key\"");
        assert!(err.contains("routes[0].key_header"), "{err}");
    }

    #[test]
    fn key_from_takes_parts_in_order() {
        let text = format!(
            "{MINIMAL}\nkey_from = [\"header:X-Saga-Id\", \"json:/step\"]\nscope_from = [\"query:tenant\"]\n"
        );
        let r = &parse(&text).unwrap().routes[0];
        assert_eq!(
            r.key_from,
            [
                KeyPart::Header("x-saga-id".parse().unwrap()),
                KeyPart::Json("/step".into())
            ]
        );
        assert_eq!(r.scope_from, [KeyPart::Query("tenant".into())]);
        for (line, needle) in [
            ("key_from = []", "no part"),
            ("key_from = [\"json:step\"]", "not a JSON pointer"),
            ("key_from = [\"cookie:a\"]", "not a part kind"),
            ("key_from = [\"query:a\", \"query:a\"]", "twice"),
            (
                "key_from = [\"query:a\",\"query:b\",\"query:c\",\"query:d\",\"query:e\",\"query:f\",\"query:g\",\"query:h\",\"query:i\"]",
                "at most 8",
            ),
        ] {
            let err = route_error(line);
            assert!(
                err.contains("routes[0].key_from") && err.contains(needle),
                "{line}: {err}"
            );
        }
    }

    #[test]
    fn both_forms_at_one_level_is_an_error_naming_the_key() {
        let err = route_error("key_header = \"X-Key\"\nkey_from = [\"header:X-Key\"]");
        assert!(
            err.contains("routes[0].key_from") && err.contains("not both"),
            "{err}"
        );
        let err = route_error("scope_header = \"A\"\nscope_from = [\"header:A\"]");
        assert!(err.contains("routes[0].scope_from"), "{err}");
        let err = error(&format!(
            "[defaults]\nkey_header = \"X-Key\"\nkey_from = [\"query:k\"]\n{MINIMAL}"
        ));
        assert!(err.contains("defaults.key_from"), "{err}");
    }

    #[test]
    fn a_route_naming_its_key_takes_none_of_the_defaults_key() {
        let text = format!(
            "[defaults]\nkey_header = \"X-Default\"\nscope_header = \"Authorization\"\n{MINIMAL}\nkey_from = [\"json:/id\"]\n"
        );
        let r = &parse(&text).unwrap().routes[0];
        assert_eq!(r.key_from, [KeyPart::Json("/id".into())]);
        assert_eq!(r.scope_from, [KeyPart::Header(http::header::AUTHORIZATION)]);
        let text = format!("[defaults]\nkey_from = [\"query:k\"]\n{MINIMAL}\n");
        let r = &parse(&text).unwrap().routes[0];
        assert_eq!(r.key_from, [KeyPart::Query("k".into())]);
    }
}
