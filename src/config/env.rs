//! Environment expansion: every string value of the file, at any depth,
//! expands `${VAR}` and `${VAR:-default}` before the file is deserialized;
//! `$$` is a literal `$`. An error names the key whose value failed.

use super::{ConfigError, invalid};

/// Expand every string inside `value`; `path` is the dotted key of `value`.
pub(super) fn expand_value(
    value: &mut toml::Value,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    match value {
        toml::Value::String(s) => *s = expand_env(s, env).map_err(|m| invalid(path, m))?,
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                expand_value(item, &format!("{path}[{i}]"), env)?;
            }
        }
        toml::Value::Table(table) => {
            for (k, v) in table.iter_mut() {
                let sub = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                expand_value(v, &sub, env)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Expand `${VAR}` and `${VAR:-default}`; `$$` is a literal `$`.
pub(super) fn expand_env(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                // Named by its key, never shown: the value may be a secret
                // (`admin_token`, `encryption_keys`) written in the file.
                .ok_or_else(|| "unterminated `${` (a `}` is missing)".to_string())?;
            out.push_str(&lookup(&body[..end], env)?);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The value of one reference, `VAR` or `VAR:-default` (the text between
/// `${` and `}`); an empty variable counts as unset.
fn lookup(expr: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let (name, default) = match expr.split_once(":-") {
        Some((n, d)) => (n, Some(d)),
        None => (expr, None),
    };
    let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!("`${{{expr}}}` is not a variable reference"));
    }
    match (env(name).filter(|v| !v.is_empty()), default) {
        (Some(v), _) => Ok(v),
        (None, Some(d)) => Ok(d.to_string()),
        (None, None) => Err(format!(
            "environment variable {name} is not set (use ${{{name}:-default}} for a fallback)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::config::tests::no_env;

    #[test]
    fn env_vars_expand_with_defaults() {
        let env = |n: &str| (n == "UP").then(|| "http://10.0.0.1:81".to_string());
        let text = r#"
            [store]
            url = "${DB_URL:-postgres://x@h/db}"
            [[routes]]
            name = "r"
            match = "/a"
            upstream = "${UP}"
        "#;
        let c = Config::parse_with_env(text, &env).unwrap();
        assert_eq!(c.store.url, "postgres://x@h/db");
        assert_eq!(c.routes[0].upstream, "http://10.0.0.1:81/");
        let missing = Config::parse_with_env(&text.replace("${UP}", "${NOPE}"), &env).unwrap_err();
        assert!(missing.to_string().contains("NOPE"), "{missing}");
        assert_eq!(expand_env("a$$b$c", &no_env).unwrap(), "a$b$c");
    }

    #[test]
    fn empty_variable_counts_as_unset() {
        let env = |_: &str| Some(String::new());
        assert_eq!(expand_env("${E:-d}", &env).unwrap(), "d");
        assert!(
            expand_env("${E}", &env)
                .unwrap_err()
                .contains("E is not set")
        );
    }

    #[test]
    fn malformed_references_are_errors() {
        assert!(
            expand_env("${A", &no_env)
                .unwrap_err()
                .contains("unterminated")
        );
        let err = expand_env("${A-B}", &no_env).unwrap_err();
        assert!(err.contains("not a variable reference"), "{err}");
        assert!(expand_env("${}", &no_env).is_err());
    }

    #[test]
    fn a_broken_reference_never_shows_the_value() {
        let err = expand_env("k1:c2VjcmV0LWtleS1tYXRlcmlhbA==${X", &no_env).unwrap_err();
        assert!(err.contains("unterminated"), "{err}");
        assert!(!err.contains("c2VjcmV0"), "{err}");
    }

    #[test]
    fn errors_name_the_key() {
        let mut value: toml::Value = toml::from_str("[t]\nlist = [\"ok\", \"${X}\"]").unwrap();
        let err = expand_value(&mut value, "", &no_env)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`t.list[1]`"), "{err}");
    }
}
