//! The shipped `gateway.toml` against the settings table. It is the
//! annotated example that "lists every key with its default" (the design's
//! configuration contract), so the test holds it to three rules:
//!
//! 1. every key it sets, or shows commented out (`# key = value`), is a
//!    setting of the table;
//! 2. in the tables that list defaults (the top level, `[store]`,
//!    `[store.front]`, `[tls]`, `[telemetry]` and `[defaults]`, not the
//!    example `[[routes]]`), a key whose row has a TOML default shows
//!    exactly that value, after `${VAR:-default}` expansion with an empty
//!    environment (so `url = "${DATABASE_URL:-sqlite://idemgate.db}"` shows
//!    the default);
//! 3. every setting with a TOML default is listed there, set or commented
//!    out (a commented line belongs to the last table header above it,
//!    commented out or not).
//!
//! Settings without a TOML default (unset, derived, required) may show any
//! example value.

use super::{DefaultValue, Kind, Section, Setting, all};

/// The file, from the repository root.
const SAMPLE: &str = "gateway.toml";

/// One `key = value` line of the file, set or commented out.
#[derive(Debug)]
struct Entry {
    /// 1-based.
    line: usize,
    /// The table it belongs to (`store.front`, `defaults.fingerprint`).
    table: String,
    /// Its key in that table, dotted through inline tables.
    key: String,
    value: toml::Value,
}

/// The setting `key` of `table` is, if any.
fn row_of(table: &str, key: &str) -> Option<&'static Setting> {
    let (section, key) = match table.split_once('.') {
        Some(("defaults" | "routes", sub)) => (Section::Route, format!("{sub}.{key}")),
        None if table == "defaults" || table == "routes" => (Section::Route, key.to_string()),
        _ => {
            let section = Section::ALL
                .into_iter()
                .find(|s| *s != Section::Route && s.table() == table)?;
            (section, key.to_string())
        }
    };
    section.rows().iter().find(|s| s.key == key)
}

/// Whether `table` lists defaults (rule 2) rather than an example route.
fn lists_defaults(table: &str) -> bool {
    table != "routes" && !table.starts_with("routes.")
}

/// Every `key = value` line, set or commented out, with its table.
fn entries(text: &str) -> Vec<Entry> {
    let (mut set_table, mut comment_table) = (String::new(), String::new());
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let (commented, body) = match line.strip_prefix('#') {
            Some(rest) => (true, rest.trim_start()),
            None => (false, line),
        };
        // Indented lines continue a comment; prose does not parse as TOML.
        let Ok(parsed) = toml::from_str::<toml::Table>(body) else {
            continue;
        };
        if line.starts_with(char::is_whitespace) || body.is_empty() {
            continue;
        }
        if body.starts_with('[') {
            let name = body.trim_start_matches('[');
            let name = name[..name.find(']').unwrap_or(name.len())]
                .trim()
                .to_string();
            if !commented {
                set_table.clone_from(&name);
            }
            comment_table = name;
            continue;
        }
        let table = if commented {
            &comment_table
        } else {
            &set_table
        };
        for (key, mut value) in parsed {
            if !commented {
                let _ = crate::config::env::expand_value(&mut value, &key, &|_| None);
            }
            flatten(table, key, value, i + 1, &mut out);
        }
    }
    out
}

/// `key = value`, or one entry per key of an inline table that is not
/// itself a setting.
fn flatten(table: &str, key: String, value: toml::Value, line: usize, out: &mut Vec<Entry>) {
    let is_table_setting = row_of(table, &key).is_some_and(|s| s.kind == Kind::Table);
    match value {
        toml::Value::Table(inner) if !is_table_setting => {
            for (sub, value) in inner {
                flatten(table, format!("{key}.{sub}"), value, line, out);
            }
        }
        value => out.push(Entry {
            line,
            table: table.to_string(),
            key,
            value,
        }),
    }
}

/// The TOML value of a default's text.
fn value_of(text: &str) -> toml::Value {
    let table: toml::Table = toml::from_str(&format!("v = {text}")).expect("TOML");
    table["v"].clone()
}

/// What breaks the three rules, one sentence each.
fn check(text: &str) -> Vec<String> {
    let entries = entries(text);
    let mut findings = Vec::new();
    for e in &entries {
        let Some(row) = row_of(&e.table, &e.key) else {
            findings.push(format!(
                "{SAMPLE}:{}: `{}` in [{}] is not a setting of the table",
                e.line, e.key, e.table
            ));
            continue;
        };
        if let DefaultValue::Toml(default) = row.default
            && lists_defaults(&e.table)
            && e.value != value_of(default)
        {
            findings.push(format!(
                "{SAMPLE}:{}: `{}` shows {}, but its default is {default}",
                e.line,
                row.path(),
                e.value
            ));
        }
    }
    for row in all().filter(|s| matches!(s.default, DefaultValue::Toml(_))) {
        let listed = entries
            .iter()
            .any(|e| lists_defaults(&e.table) && row_of(&e.table, &e.key) == Some(row));
        if !listed {
            findings.push(format!(
                "`{}` (default {}) is not listed in {SAMPLE}; add it at its default",
                row.path(),
                row.toml()
            ));
        }
    }
    findings
}

/// The shipped file keeps the three rules.
#[test]
fn gateway_toml_lists_the_settings_at_their_defaults() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(SAMPLE);
    let text = std::fs::read_to_string(path).expect("gateway.toml");
    let findings = check(&text);
    assert!(
        findings.is_empty(),
        "{SAMPLE} disagrees with the settings table (src/config/settings/):\n{}",
        findings.join("\n")
    );
}

/// Negative controls on fabricated files: a key that is no setting, a
/// wrong default (set or commented out), and a missing setting are each
/// found; an example route's own values are not.
#[test]
fn disagreements_are_found() {
    let full: String = all()
        .filter_map(|s| {
            let text = s.toml_default()?;
            let header = match s.section {
                Section::Top => String::new(),
                Section::Route => "[defaults]\n".into(),
                other => format!("[{}]\n", other.table()),
            };
            Some(format!("{header}{} = {text}\n", s.key))
        })
        .collect();
    assert_eq!(check(&full), Vec::<String>::new(), "{full}");
    let found = |text: &str, what: &str| {
        let findings = check(text);
        assert!(
            findings.iter().any(|f| f.contains(what)),
            "{what}: {findings:?}"
        );
    };
    found(
        &format!("bogus = 1\n{full}"),
        "`bogus` in [] is not a setting",
    );
    let line = |s: &Setting| format!("{} = {}", s.key, s.toml());
    found(
        &full.replace(&line(&super::LEASE), "lease = \"7777s\""),
        "`routes[].lease` shows \"7777s\"",
    );
    found(
        &full.replace(&line(&super::STORE_REPLICAS), "# replicas = 7777"),
        "`store.replicas` shows 7777",
    );
    found(
        &full.replace(&line(&super::TELEMETRY_QUEUE), ""),
        "`telemetry.queue` (default",
    );
    let example = format!("{full}[[routes]]\nname = \"a\"\nlease = \"5s\"\n");
    assert_eq!(check(&example), Vec::<String>::new());
}
