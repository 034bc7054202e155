//! The settings table: every scalar setting of the configuration file,
//! declared once, with its TOML path, its kind, its default (as the TOML
//! text the book shows), whether a reload applies it, and its description.
//!
//! Everything else follows from these rows: the parser's defaults
//! (`defaults.rs` reads its typed constants out of the rows' TOML text at
//! compile time, and validation takes lists and names from them), the
//! dotted keys validation errors name, which changed keys a reload reports
//! as waiting for a restart (`reload.rs`), the settings tables of
//! docs/src/reference/configuration.md (rendered and compared by the test in
//! `chapter.rs`) and the check of the shipped `gateway.toml` (`sample.rs`).
//!
//! The rows live in one file per part of the file: `process` (the top
//! level, `[tls]`, `[telemetry]`), `store` (`[store]`, `[store.front]`) and
//! `route` (each `[[routes]]` table and `[defaults]`).

/// The rows of one section, declared with their docs: `NAME "key" Kind
/// default, Reload;` each, the doc comment becoming the row's `doc` and the
/// constant's documentation. Also defines `$all`, the rows in order.
macro_rules! rows {
    ($all:ident = $section:ident {
        $( $(#[doc = $doc:literal])+ $name:ident $key:literal $kind:ident $default:expr, $reload:ident; )+
    }) => {
        $(
            $(#[doc = $doc])+
            pub const $name: Setting = Setting {
                section: Section::$section,
                key: $key,
                kind: Kind::$kind,
                default: $default,
                reload: Reload::$reload,
                doc: concat!($($doc, "\n"),+),
            };
        )+
        #[doc = concat!("Every `", stringify!($section), "` row, in the book's order.")]
        pub const $all: &[Setting] = &[$($name),+];
    };
}
use rows;

#[cfg(test)]
mod chapter;
mod literal;
mod process;
mod route;
#[cfg(test)]
mod sample;
mod store;

use std::net::SocketAddr;
use std::time::Duration;

pub use process::*;
pub use route::*;
pub use store::*;

/// The table a setting is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// The top level of the file: the process, its listeners and limits.
    Top,
    /// `[store]`.
    Store,
    /// `[store.front]`.
    Front,
    /// `[tls]`.
    Tls,
    /// `[telemetry]`.
    Telemetry,
    /// Each `[[routes]]` table, and `[defaults]` (which may set any route
    /// setting but `name` and `match` for all routes).
    Route,
}

impl Section {
    /// Every section, in the chapter's order.
    pub const ALL: [Section; 6] = [
        Section::Top,
        Section::Store,
        Section::Front,
        Section::Tls,
        Section::Telemetry,
        Section::Route,
    ];

    /// The dotted path of the section's table (`store.front`); `""` for
    /// the top level, `routes[]` for the routes.
    pub const fn table(self) -> &'static str {
        match self {
            Section::Top => "",
            Section::Store => "store",
            Section::Front => "store.front",
            Section::Tls => "tls",
            Section::Telemetry => "telemetry",
            Section::Route => "routes[]",
        }
    }

    /// The section's rows.
    pub const fn rows(self) -> &'static [Setting] {
        match self {
            Section::Top => process::TOP,
            Section::Store => store::STORE,
            Section::Front => store::FRONT,
            Section::Tls => process::TLS,
            Section::Telemetry => process::TELEMETRY,
            Section::Route => route::ROUTE,
        }
    }
}

/// What a setting's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A human duration string (`"30s"`).
    Duration,
    /// A human size string (`"1MiB"`).
    Size,
    /// A non-negative integer.
    Integer,
    /// A float between 0 and 1.
    Ratio,
    /// `true` or `false`.
    Bool,
    /// A string: a URL, a path, a name.
    Text,
    /// An `"ip:port"` string.
    Address,
    /// One of a few strings (an enum).
    Choice,
    /// An array of strings.
    List,
    /// A table of string values.
    Table,
}

/// What a setting is when the file leaves it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultValue {
    /// This TOML value: what the parser takes, and what the book and
    /// `gateway.toml` show.
    Toml(&'static str),
    /// Nothing: the feature it configures is off (the text says how the
    /// book puts it: "unset", "off", "none").
    Unset(&'static str),
    /// Computed from other settings or the host (described in Markdown).
    Derived(&'static str),
    /// No default: the table that holds it needs it (Markdown).
    Required(&'static str),
}

/// Whether a reload applies a changed value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// A reload applies it (the routes, swapped whole).
    Applies,
    /// Fixed at start: a reload reports the change and ignores it.
    Restart,
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// Where it is written.
    pub section: Section,
    /// Its key within the section's table (`lease`, `inquiry.every`).
    pub key: &'static str,
    /// What its value is.
    pub kind: Kind,
    /// What it is when left out.
    pub default: DefaultValue,
    /// Whether a reload applies it.
    pub reload: Reload,
    /// What it does: the book's description (Markdown, links relative to
    /// docs/src/reference/).
    pub doc: &'static str,
}

impl Setting {
    /// The full dotted path: `listen`, `store.pool_size`,
    /// `routes[].lease`.
    pub fn path(&self) -> String {
        self.at(self.section.table())
    }

    /// The dotted key of this setting in the table at `table` (a route's
    /// own, `routes[2]`, or `defaults`).
    pub fn at(&self, table: &str) -> String {
        if table.is_empty() {
            self.key.to_string()
        } else {
            format!("{table}.{}", self.key)
        }
    }

    /// The TOML text of the default; a row without one stops the build
    /// where a typed default is asked of it.
    pub const fn toml(&self) -> &'static str {
        match self.default {
            DefaultValue::Toml(text) => text,
            _ => panic!("this setting has no TOML default"),
        }
    }

    /// The TOML text of the default, if it has one.
    pub fn toml_default(&self) -> Option<&'static str> {
        match self.default {
            DefaultValue::Toml(text) => Some(text),
            _ => None,
        }
    }

    /// The default of a [`Kind::Duration`] row.
    pub const fn duration(&self) -> Duration {
        assert!(matches!(self.kind, Kind::Duration));
        literal::duration(literal::unquote(self.toml()))
    }

    /// The default of a [`Kind::Size`] row, in bytes.
    pub const fn size(&self) -> u64 {
        assert!(matches!(self.kind, Kind::Size));
        literal::size(literal::unquote(self.toml()))
    }

    /// The default of a [`Kind::Integer`] row.
    pub const fn integer(&self) -> u64 {
        assert!(matches!(self.kind, Kind::Integer));
        literal::integer(self.toml().as_bytes())
    }

    /// The default of a [`Kind::Bool`] row.
    pub const fn flag(&self) -> bool {
        assert!(matches!(self.kind, Kind::Bool));
        literal::flag(self.toml())
    }

    /// The default of a [`Kind::Text`] row.
    pub const fn text(&self) -> &'static str {
        assert!(matches!(self.kind, Kind::Text));
        literal::unquote(self.toml())
    }

    /// The default of a [`Kind::Address`] row (IPv4).
    pub const fn address(&self) -> SocketAddr {
        assert!(matches!(self.kind, Kind::Address));
        literal::address(literal::unquote(self.toml()))
    }

    /// The default of a [`Kind::Choice`] row: the value `names` pairs with
    /// its text (the enum's serde names; the all-defaults test checks they
    /// agree with what the parser makes of the text).
    pub const fn pick<T: Copy>(&self, names: &[(&str, T)]) -> T {
        assert!(matches!(self.kind, Kind::Choice));
        let text = literal::unquote(self.toml());
        let mut i = 0;
        while i < names.len() {
            if literal::same(names[i].0, text) {
                return names[i].1;
            }
            i += 1;
        }
        panic!("the default names no value of the enum")
    }

    /// The default of a [`Kind::List`] row, read as TOML.
    pub fn strings(&self) -> Vec<String> {
        assert!(matches!(self.kind, Kind::List));
        let document = format!("v = {}", self.toml());
        let table: toml::Table = toml::from_str(&document).expect("a list default is TOML");
        table["v"]
            .as_array()
            .expect("a list default is an array")
            .iter()
            .map(|v| v.as_str().expect("of strings").to_string())
            .collect()
    }
}

/// Every row, section after section.
pub fn all() -> impl Iterator<Item = &'static Setting> {
    Section::ALL.into_iter().flat_map(|s| s.rows().iter())
}

/// Whether a change of `key` waits for a restart. `key` is a row's path,
/// or a section's table (`tls`, `store.front`: the class its rows share).
/// A key the table does not know waits for a restart.
pub fn restart_only(key: &str) -> bool {
    class(key) != Some(Reload::Applies)
}

/// The reload class of `key`: a row's own, or the one every row under the
/// table `key` shares; `None` when the table does not know it (or its rows
/// disagree).
pub fn class(key: &str) -> Option<Reload> {
    let mut classes = all()
        .filter(|s| {
            let path = s.path();
            path == key || path.starts_with(&format!("{key}."))
        })
        .map(|s| s.reload);
    let first = classes.next()?;
    classes.all(|c| c == first).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paths are unique, docs are one paragraph the chapter's table can
    /// hold, and every TOML default is TOML.
    #[test]
    fn rows_are_well_formed() {
        let mut seen = std::collections::HashSet::new();
        for s in all() {
            assert!(seen.insert(s.path()), "{} twice", s.path());
            assert!(!s.doc.contains('|'), "{}: `|` breaks a table", s.path());
            assert!(!s.doc.trim().is_empty(), "{}: no doc", s.path());
            if let DefaultValue::Toml(text) = s.default {
                let doc = format!("v = {text}");
                assert!(toml::from_str::<toml::Table>(&doc).is_ok(), "{}", s.path());
            }
        }
    }

    /// A section's class is its rows' when they agree.
    #[test]
    fn classes_of_rows_and_sections() {
        assert_eq!(class("listen"), Some(Reload::Restart));
        assert_eq!(class("tls"), Some(Reload::Restart));
        assert_eq!(class("store.front"), Some(Reload::Restart));
        assert_eq!(class("routes[].lease"), Some(Reload::Applies));
        assert_eq!(class("no_such_key"), None);
        assert!(restart_only("no_such_key"));
        assert!(!restart_only("routes[]"));
    }

    /// The reload's own rule, stated apart from the table so a wrong class
    /// fails here: a reload swaps the routes (with `[defaults]` folded into
    /// them) and applies nothing else (src/reload/, the operations chapter
    /// on reload).
    #[test]
    fn only_route_settings_apply_on_reload() {
        for s in all() {
            let expected = match s.section {
                Section::Route => Reload::Applies,
                _ => Reload::Restart,
            };
            assert_eq!(s.reload, expected, "{}: wrong reload class", s.path());
        }
    }
}
