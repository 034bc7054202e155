//! The configuration chapter's settings tables, generated from the settings
//! table. The chapter (docs/src/reference/configuration.md) keeps its prose;
//! each section's table sits between `<!-- settings:begin ID -->` and
//! `<!-- settings:end -->` and is exactly what [`render`] makes of the
//! section's rows. mdbook needs no plugin: the generated text is committed,
//! and the test below fails, with a diff, when it is stale. Regenerate with
//! `IDEMGATE_BLESS=1 cargo test --lib config::settings::chapter`.

use super::{DefaultValue, Reload, Section};

/// The chapter, from the repository root.
const CHAPTER: &str = "docs/src/reference/configuration.md";
/// Where a generated table ends.
const END: &str = "<!-- settings:end -->";

/// The marker that opens `section`'s table.
fn begin(section: Section) -> String {
    let id = match section {
        Section::Top => "top",
        Section::Route => "routes",
        other => other.table(),
    };
    format!("<!-- settings:begin {id} -->")
}

/// `section`'s rows as a Markdown table: key, default, what applies a
/// change, and the description on one line.
fn render(section: Section) -> String {
    let mut out = String::from("| key | default | applied by | meaning |\n|---|---|---|---|\n");
    for s in section.rows() {
        let default = match s.default {
            DefaultValue::Toml(text) => format!("`{text}`"),
            DefaultValue::Unset(text) | DefaultValue::Derived(text) => text.to_string(),
            DefaultValue::Required(text) => text.to_string(),
        };
        let applied = match s.reload {
            Reload::Applies => "reload",
            Reload::Restart => "restart",
        };
        let doc = s.doc.split_whitespace().collect::<Vec<_>>().join(" ");
        out.push_str(&format!(
            "| `{}` | {default} | {applied} | {doc} |\n",
            s.key
        ));
    }
    out
}

/// `chapter` with every generated table rendered afresh, and one finding
/// per table that differed or has no markers (each with a line diff).
fn regenerate(chapter: &str) -> (String, Vec<String>) {
    let mut text = chapter.to_string();
    let mut findings = Vec::new();
    for section in Section::ALL {
        let begin = begin(section);
        let Some(start) = text.find(&format!("{begin}\n")) else {
            findings.push(format!(
                "{begin} is missing: add it and {END} around the table"
            ));
            continue;
        };
        let body = start + begin.len() + 1;
        let Some(len) = text[body..].find(END) else {
            findings.push(format!("{begin} has no {END} after it"));
            continue;
        };
        let expected = render(section);
        let current = &text[body..body + len];
        if current != expected {
            findings.push(format!("{begin}\n{}", diff(current, &expected)));
            text.replace_range(body..body + len, &expected);
        }
    }
    (text, findings)
}

/// The lines only `current` has (`-`) and those only `expected` has (`+`).
fn diff(current: &str, expected: &str) -> String {
    let gone = current
        .lines()
        .filter(|l| !expected.lines().any(|e| e == *l));
    let new = expected
        .lines()
        .filter(|l| !current.lines().any(|c| c == *l));
    gone.map(|l| format!("- {l}"))
        .chain(new.map(|l| format!("+ {l}")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The chapter's tables are the settings table's, and nothing else.
#[test]
fn the_chapter_shows_the_settings_table() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(CHAPTER);
    let text = std::fs::read_to_string(&path).expect("the chapter");
    let (fresh, findings) = regenerate(&text);
    if findings.is_empty() {
        return;
    }
    if std::env::var_os("IDEMGATE_BLESS").is_some() {
        std::fs::write(&path, fresh).expect("the chapter is writable");
        return;
    }
    panic!(
        "{CHAPTER} differs from the settings table (src/config/settings/):\n{}\n\
         Regenerate it: IDEMGATE_BLESS=1 cargo test --lib config::settings::chapter",
        findings.join("\n")
    );
}

/// Negative controls: a wrong default, a missing table and a stray row are
/// each found; the regenerated text has nothing left to find.
#[test]
fn stale_tables_are_found() {
    let good: String = Section::ALL
        .into_iter()
        .map(|s| format!("## x\n\nprose\n\n{}\n{}{END}\n\n", begin(s), render(s)))
        .collect();
    assert_eq!(regenerate(&good).1, Vec::<String>::new());
    let right = format!("| `lease` | `{}` |", super::LEASE.toml());
    let wrong = good.replace(&right, "| `lease` | `\"7777s\"` |");
    assert_ne!(wrong, good, "the fabricated change took");
    let (fixed, findings) = regenerate(&wrong);
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert!(
        findings[0].contains("- | `lease` | `\"7777s\"`"),
        "{findings:?}"
    );
    assert!(findings[0].contains(&format!("+ {right}")), "{findings:?}");
    assert_eq!(fixed, good);
    let stray = good.replace(END, &format!("| `bogus` | 1 | restart | no |\n{END}"));
    assert_eq!(regenerate(&stray).1.len(), Section::ALL.len());
    let unmarked = good.replace(&begin(Section::Tls), "");
    let findings = regenerate(&unmarked).1;
    assert!(
        findings.iter().any(|f| f.contains("tls -->")),
        "{findings:?}"
    );
}
