//! The repository's own shape checks, run by `cargo test` like any other
//! test target (std only: it reads the tree, it does not link the crate).
//!
//! - Dead paths: every repository path cited in a Markdown file or in a
//!   comment of a source, script or config file must exist.
//! - Markdown links: relative links (and their `#anchor`s) must resolve.
//! - Section numbers: chapters are cited by name or link, never by an
//!   internal section number; `§` is kept for external specs (RFC, IETF draft).
//! - Sizes: no file of a crate's sources (below) over 600 lines of non-test
//!   code, no function there over 100 lines.
//! - Import cycles: no two files of a crate that depend on each other through
//!   a `use` (grouped trees `crate::{a::X, b::{Y, Z}}` included) or an inline
//!   path: `crate::`, `super::`, `self::`, or the bare name of a child module
//!   the file declares (`mod redis;`, then `redis::connect()`); any other
//!   bare name is an extern crate or an item, no dependency. A path that goes
//!   through a facade's `pub use` (or a module's private `use`, reached by a
//!   descendant) counts as a dependency on the file that defines the item.
//!   An edge from a file to one of its ancestor modules' files (its parent
//!   `mod.rs` or parent module file, the grandparent, … up to the root) is
//!   not counted: a module is part of its ancestors and may use what they
//!   define, as when a submodule adds `impl` blocks to its parent's type.
//!   Every other edge counts: parent → child, sibling ↔ sibling, cousins,
//!   anything across the tree.
//! - Top-level modules: in each crate, the children of the root (`lib.rs`,
//!   or `main.rs` in a crate without one) form a DAG, with no cycle of any
//!   length between them (`store → config → request → store`), each finding
//!   naming the cycle with a file:line per edge. Every path form above counts,
//!   and a `pub use` of another module's item is an edge of the module that
//!   re-exports it. A path to an item the root defines is no edge; one to an
//!   import of the root (its `pub use` facade) is an edge to the module it
//!   imports from. A path into another crate (`idemgate_store::…`) is none.
//! - The core is pure: `crates/core/Cargo.toml` depends on no async
//!   runtime, database, HTTP or network crate, and on no crate of ours
//!   ([`IMPURE`]); the model checker explores exactly the rules the stores
//!   run, and no I/O may creep into them.
//!
//! The crates: the root package's `src/`, and each `crates/*/src/` there is
//! (named by its `Cargo.toml`, else its directory). The two import checks
//! read a file's code outside the test modules at its end.
//!
//! Each check is a pure function over text or a directory, with negative
//! controls on fabricated inputs in `mod controls` at the end of this file.
//! Run one with its report: `cargo test --test tree -- --nocapture`.
//! Without cargo, compile it with `rustc --edition 2024 --test tests/tree.rs`
//! and run it from the repository root (or set `IDEMGATE_REPO_ROOT`).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

/// Longest non-test part of a file under src/, in lines.
const MAX_FILE_LINES: usize = 600;
/// Longest function under src/, from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 100;

/// Directories never walked: build output and generated data. Paths cited
/// under them are not checked either (they exist only after a build or run).
/// The fuzz corpus is tracked, but it is data, thousands of opaque files.
const SKIPPED: &[&str] = &[
    ".git",
    "target",
    "docs/book",
    "fuzz/corpus",
    "fuzz/target",
    "fuzz/artifacts",
    "fuzz/coverage",
    "fuzz/logs",
];

/// Markdown under here is not checked for dead paths, links or section
/// numbers: bench/results/ holds dated records of past runs, which cite the
/// files and chapters as they were that day; rewriting them when a file
/// moves would falsify the record.
const DATED_RECORDS: &str = "bench/results/";

/// Root files a document may cite by bare name; a citation of one that does
/// not exist is dead (every existing root file counts too).
const ROOT_FILES: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "README.md",
    "CONTRIBUTING.md",
    "CHANGELOG.md",
    "SECURITY.md",
    "LICENSE",
    "LICENSE-MIT",
    "LICENSE-APACHE",
    "Dockerfile",
    "docker-compose.yml",
    "gateway.toml",
    "build.rs",
    "clippy.toml",
    "rustfmt.toml",
    "deny.toml",
    "rust-toolchain.toml",
];

// ---------------------------------------------------------------------------
// The tree
// ---------------------------------------------------------------------------

/// The repository root: cargo's manifest dir, else `IDEMGATE_REPO_ROOT`, else
/// the current directory.
fn repo_root() -> PathBuf {
    let root = match option_env!("CARGO_MANIFEST_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            std::env::var_os("IDEMGATE_REPO_ROOT").map_or_else(|| PathBuf::from("."), PathBuf::from)
        }
    };
    assert!(
        root.join("Cargo.toml").is_file() && root.join("src").is_dir(),
        "{} is not the repository root: run from the root or set IDEMGATE_REPO_ROOT",
        root.display()
    );
    root
}

/// Every file under `root`, as `/`-separated relative paths, sorted,
/// skipping [`SKIPPED`] directories and not following symlinks.
fn walk(root: &Path) -> Vec<String> {
    fn visit(root: &Path, rel: &str, out: &mut Vec<String>) {
        let dir = root.join(rel);
        let entries =
            fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let kind = entry
                .file_type()
                .unwrap_or_else(|e| panic!("cannot stat {path}: {e}"));
            if kind.is_dir() {
                if !SKIPPED.contains(&path.as_str()) {
                    visit(root, &path, out);
                }
            } else if kind.is_file() {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    visit(root, "", &mut out);
    out.sort();
    out
}

fn read(root: &Path, file: &str) -> String {
    let path = root.join(file);
    let bytes = fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    String::from_utf8_lossy(&bytes).into_owned()
}

/// One crate of the repository: the directory of its sources (`src`,
/// `crates/store/src`) and its name as paths spell it (`idemgate_store`).
#[derive(Debug, Clone)]
struct Crate {
    src: String,
    name: String,
}

/// The `[package]` name of a manifest, with `-` as `_`.
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if let Some((_, value)) = line
            .split_once('=')
            .filter(|(key, _)| in_package && key.trim() == "name")
        {
            return Some(value.trim().trim_matches('"').replace('-', "_"));
        }
    }
    None
}

/// The root package's name, with `-` as `_`.
fn crate_name(root: &Path) -> String {
    package_name(&read(root, "Cargo.toml")).expect("Cargo.toml has no [package] name")
}

/// The source directory of the crate `file` is part of: `src` (the root
/// package) or `crates/<dir>/src`; None outside every crate's sources.
fn crate_src(file: &str) -> Option<&str> {
    if file.starts_with("src/") {
        return Some("src");
    }
    let (dir, tail) = file.strip_prefix("crates/")?.split_once('/')?;
    tail.starts_with("src/")
        .then(|| &file[.."crates/".len() + dir.len() + "/src".len()])
}

/// Every crate of the repository: the root package (`src/`), then each
/// `crates/*/src/` holding Rust files, named by its manifest's `[package]`
/// name, else by its directory.
fn crates(root: &Path, files: &[String]) -> Vec<Crate> {
    let dirs: BTreeSet<&str> = files
        .iter()
        .filter(|f| f.ends_with(".rs"))
        .filter_map(|f| crate_src(f))
        .filter(|&src| src != "src")
        .collect();
    let mut out = vec![Crate {
        src: "src".to_owned(),
        name: crate_name(root),
    }];
    for src in dirs {
        let dir = src.strip_suffix("/src").unwrap_or(src);
        let manifest = fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap_or_default();
        let name = package_name(&manifest)
            .unwrap_or_else(|| dir.trim_start_matches("crates/").replace('-', "_"));
        out.push(Crate {
            src: src.to_owned(),
            name,
        });
    }
    out
}

/// `(file, text)` of each `.rs` file of `krate`.
fn crate_sources(root: &Path, files: &[String], krate: &Crate) -> Vec<(String, String)> {
    files
        .iter()
        .filter(|f| f.ends_with(".rs") && crate_src(f) == Some(krate.src.as_str()))
        .map(|f| (f.clone(), read(root, f)))
        .collect()
}

/// One finding: where, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Violation {
    file: String,
    line: usize,
    message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}:{}: {}", self.file, self.line, self.message)
        }
    }
}

fn violation(file: &str, line: usize, message: String) -> Violation {
    Violation {
        file: file.to_owned(),
        line,
        message,
    }
}

/// Prints the findings and fails the test when there are any.
fn report(check: &str, found: &[Violation]) {
    for v in found {
        println!("{check}: {v}");
    }
    let list: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert!(
        found.is_empty(),
        "{check}: {} finding(s):\n{}",
        found.len(),
        list.join("\n")
    );
}

// ---------------------------------------------------------------------------
// Which text is checked
// ---------------------------------------------------------------------------

/// How to find the comments of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Comments {
    Rust,
    Hash,
    Lua,
}

/// Markdown checked for paths, links and section numbers.
fn is_checked_markdown(file: &str) -> bool {
    file.ends_with(".md") && !file.starts_with(DATED_RECORDS)
}

/// Files whose comments are checked for paths and section numbers.
fn comment_kind(file: &str) -> Option<Comments> {
    let in_bench = file
        .strip_prefix("bench/")
        .or_else(|| file.strip_prefix("fuzz/"))
        .filter(|rest| !rest.contains('/'));
    if let Some(name) = in_bench {
        return if name.ends_with(".sh") || name.ends_with(".py") {
            Some(Comments::Hash)
        } else if name.ends_with(".lua") {
            Some(Comments::Lua)
        } else {
            None
        };
    }
    let rust_tree = ["src/", "tests/", "examples/", "fuzz/fuzz_targets/"];
    if file.ends_with(".rs")
        && (file == "build.rs" || rust_tree.iter().any(|d| file.starts_with(d)))
    {
        return Some(Comments::Rust);
    }
    let configs = [
        "Cargo.toml",
        "gateway.toml",
        "Dockerfile",
        ".ci/run",
        "docker-compose.yml",
        "clippy.toml",
        "fuzz/Cargo.toml",
    ];
    if configs.contains(&file) || file.starts_with("docker/") || file.starts_with(".ci/") {
        return Some(Comments::Hash);
    }
    None
}

/// The `(line, text)` pairs of a file that cite things: every line of
/// Markdown (code blocks included: a path there is still a citation), the
/// comments of anything else.
fn cited_lines(root: &Path, file: &str) -> Option<Vec<(usize, String)>> {
    if is_checked_markdown(file) {
        let text = read(root, file);
        return Some(
            text.lines()
                .enumerate()
                .map(|(i, l)| (i + 1, l.to_owned()))
                .collect(),
        );
    }
    let kind = comment_kind(file)?;
    let text = read(root, file);
    Some(match kind {
        Comments::Rust => lex_rust(&text).comments,
        Comments::Hash => line_comments(&text, "#"),
        Comments::Lua => line_comments(&text, "--"),
    })
}

/// Line comments opened by `marker` at the start of a line or after
/// whitespace, outside quotes.
fn line_comments(text: &str, marker: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let (mut single, mut double) = (false, false);
        let mut prev = ' ';
        for (at, c) in line.char_indices() {
            match c {
                '\'' if !double => single = !single,
                '"' if !single => double = !double,
                _ if !single
                    && !double
                    && prev.is_whitespace()
                    && line[at..].starts_with(marker) =>
                {
                    out.push((i + 1, line[at..].to_owned()));
                    break;
                }
                _ => {}
            }
            prev = c;
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Rust lexing: code with literals and comments blanked, and the comments
// ---------------------------------------------------------------------------

/// A Rust file split in two: `code` is the source with every comment and
/// string or char literal replaced by spaces (line breaks kept, so line
/// numbers hold), and `comments` is each comment line with its number.
struct Lexed {
    code: String,
    comments: Vec<(usize, String)>,
}

fn lex_rust(src: &str) -> Lexed {
    let s: Vec<char> = src.chars().collect();
    let mut lx = Lexer {
        s: &s,
        i: 0,
        line: 1,
        code: String::with_capacity(src.len()),
        comments: Vec::new(),
    };
    while lx.i < s.len() {
        lx.step();
    }
    Lexed {
        code: lx.code,
        comments: lx.comments,
    }
}

struct Lexer<'a> {
    s: &'a [char],
    i: usize,
    line: usize,
    code: String,
    comments: Vec<(usize, String)>,
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

impl Lexer<'_> {
    fn at(&self, k: usize) -> Option<char> {
        self.s.get(self.i + k).copied()
    }

    /// Consumes one char as blank (a space, or the line break itself).
    fn blank(&mut self) {
        if self.s[self.i] == '\n' {
            self.code.push('\n');
            self.line += 1;
        } else {
            self.code.push(' ');
        }
        self.i += 1;
    }

    fn step(&mut self) {
        let c = self.s[self.i];
        let prev_ident = self.i > 0 && is_ident(self.s[self.i - 1]);
        match (c, self.at(1)) {
            ('/', Some('/')) => {
                let start = self.i;
                while self.i < self.s.len() && self.s[self.i] != '\n' {
                    self.blank();
                }
                self.comments
                    .push((self.line, self.s[start..self.i].iter().collect()));
            }
            ('/', Some('*')) => self.block_comment(),
            ('r', _) if !prev_ident && self.raw_string(1) => {}
            ('b' | 'c', Some('r')) if !prev_ident && self.raw_string(2) => {}
            ('"', _) => self.string(),
            ('\'', _) => self.quote(),
            _ => {
                self.code.push(c);
                if c == '\n' {
                    self.line += 1;
                }
                self.i += 1;
            }
        }
    }

    fn block_comment(&mut self) {
        let mut depth = 0usize;
        let mut text = String::new();
        let mut first = self.line;
        while self.i < self.s.len() {
            let pair = (self.s[self.i], self.at(1));
            if pair == ('/', Some('*')) || pair == ('*', Some('/')) {
                text.push(pair.0);
                text.push('*');
                self.blank();
                self.blank();
                depth = if pair.0 == '/' { depth + 1 } else { depth - 1 };
                if depth == 0 {
                    break;
                }
            } else if pair.0 == '\n' {
                self.comments.push((first, std::mem::take(&mut text)));
                self.blank();
                first = self.line;
            } else {
                text.push(pair.0);
                self.blank();
            }
        }
        if !text.is_empty() {
            self.comments.push((first, text));
        }
    }

    /// A raw string `r#"…"#` whose `r` is `skip - 1` chars ahead; returns
    /// false (consuming nothing) when this is not one, e.g. `r#ident`.
    fn raw_string(&mut self, skip: usize) -> bool {
        let mut k = skip;
        while self.at(k) == Some('#') {
            k += 1;
        }
        if self.at(k) != Some('"') {
            return false;
        }
        let hashes = k - skip;
        for _ in 0..=k {
            self.blank();
        }
        while self.i < self.s.len() {
            let closes = self.s[self.i] == '"' && (1..=hashes).all(|h| self.at(h) == Some('#'));
            if closes {
                for _ in 0..=hashes {
                    self.blank();
                }
                return true;
            }
            self.blank();
        }
        true
    }

    fn string(&mut self) {
        self.blank();
        while self.i < self.s.len() {
            match self.s[self.i] {
                '\\' => {
                    self.blank();
                    if self.i < self.s.len() {
                        self.blank();
                    }
                }
                '"' => {
                    self.blank();
                    return;
                }
                _ => self.blank(),
            }
        }
    }

    /// `'`: a char literal (`'{'`, `'\n'`, `'\u{7b}'`) or a lifetime/label
    /// (`'a`, `'static`), which stays code.
    fn quote(&mut self) {
        let escaped = self.at(1) == Some('\\');
        let one_char = self.at(1).is_some_and(|c| c != '\'') && self.at(2) == Some('\'');
        if escaped {
            self.blank();
            self.blank();
            self.blank();
            while self.i < self.s.len() && self.s[self.i] != '\'' && self.s[self.i] != '\n' {
                self.blank();
            }
            if self.i < self.s.len() && self.s[self.i] == '\'' {
                self.blank();
            }
        } else if one_char {
            self.blank();
            self.blank();
            self.blank();
        } else {
            self.code.push('\'');
            self.i += 1;
        }
    }
}

// ---------------------------------------------------------------------------
// Check 1: dead paths
// ---------------------------------------------------------------------------

/// What counts as a repository path in prose: a path under one of `dirs`
/// (the root's directories) or one of `files` (root file names).
struct PathShape {
    dirs: Vec<String>,
    files: BTreeSet<String>,
}

impl PathShape {
    fn of(root: &Path) -> PathShape {
        let mut dirs = Vec::new();
        let mut files: BTreeSet<String> = ROOT_FILES.iter().map(|f| (*f).to_owned()).collect();
        let entries =
            fs::read_dir(root).unwrap_or_else(|e| panic!("cannot list {}: {e}", root.display()));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("cannot list {}: {e}", root.display()));
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() {
                if name != ".git" && name != "target" {
                    dirs.push(name);
                }
            } else {
                files.insert(name);
            }
        }
        dirs.sort();
        PathShape { dirs, files }
    }

    fn is_repo_path(&self, token: &str) -> bool {
        self.files.contains(token)
            || self.dirs.iter().any(|d| {
                token
                    .strip_prefix(d.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
            })
    }
}

/// A char before a token that makes it part of something else: a URL
/// (`…/src/x`), a longer path (`../src`, `~/src`), a word (`my-docs/`), a
/// variable (`$HOME/docs`), a Rust path (`crate::docs`), an assignment
/// (`RESULTS=…`, `--out=…`: a value, often an output to be created).
fn glued(c: char) -> bool {
    is_ident(c) || "-./:\\$~@%+=".contains(c)
}

/// Chars that end a path token.
fn ends_token(c: char) -> bool {
    c.is_whitespace() || "`'\"()[],;|=&!?".contains(c)
}

/// The repository paths cited in one line, cleaned (trailing punctuation,
/// `:line` and `#anchor` suffixes dropped). Tokens with placeholders (`…`,
/// `...`, `<name>`, `$VAR`, `{a,b}`) and build output paths are skipped.
fn path_tokens(line: &str, shape: &PathShape) -> Vec<String> {
    let mut out = Vec::new();
    let mut prev = ' ';
    let mut skip_to = 0;
    for (at, c) in line.char_indices() {
        let boundary = !glued(prev);
        prev = c;
        if at < skip_to || !boundary || ends_token(c) {
            continue;
        }
        let end = line[at..].find(ends_token).map_or(line.len(), |n| at + n);
        skip_to = end;
        if let Some(token) = clean_token(&line[at..end]).filter(|t| shape.is_repo_path(t)) {
            out.push(token);
        }
    }
    out
}

fn clean_token(raw: &str) -> Option<String> {
    // `**bold**` Markdown around a path; a trailing `*` after a `/` is a glob.
    let mut t = raw.trim_start_matches(['*', '_']);
    loop {
        let before = t.len();
        t = t.trim_end_matches(|c: char| ".,;:)>]}'\"!?`".contains(c));
        let unstarred = t.trim_end_matches('*');
        if !unstarred.ends_with('/') {
            t = unstarred;
        }
        if t.len() == before {
            break;
        }
    }
    let t = t.split('#').next().unwrap_or_default();
    let t = t.split(':').next().unwrap_or_default();
    let placeholder = ["…", "...", "<", ">", "$", "{", "}", "\\"]
        .iter()
        .any(|p| t.contains(p));
    let generated = SKIPPED
        .iter()
        .any(|d| t.starts_with(&format!("{d}/")) && *d != "fuzz/corpus");
    (!t.is_empty() && !placeholder && !generated).then(|| t.to_owned())
}

/// Whether a cited path exists under `root`: `*` matches within a name, `**`
/// any depth, and a trailing `/` asks for a directory.
fn path_exists(root: &Path, path: &str) -> bool {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    glob_exists(root, &segs, path.ends_with('/'))
}

fn glob_exists(base: &Path, segs: &[&str], dir: bool) -> bool {
    let Some((first, rest)) = segs.split_first() else {
        return if dir { base.is_dir() } else { base.exists() };
    };
    if !first.contains('*') {
        return glob_exists(&base.join(first), rest, dir);
    }
    let Ok(entries) = fs::read_dir(base) else {
        return false;
    };
    let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    children.sort();
    if *first == "**" {
        return glob_exists(base, rest, dir)
            || children
                .iter()
                .any(|c| c.is_dir() && glob_exists(c, segs, dir));
    }
    children.iter().any(|c| {
        let name = c
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        wildcard(first, &name) && glob_exists(c, rest, dir)
    })
}

/// `*` matches any run of chars; everything else matches itself.
fn wildcard(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            let Some(rest) = name.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|&k| rest.is_char_boundary(k))
                .any(|k| wildcard(tail, &rest[k..]))
        }
    }
}

/// Dead repository paths cited in `lines` of `file`.
fn dead_paths_in(
    root: &Path,
    file: &str,
    lines: &[(usize, String)],
    shape: &PathShape,
) -> Vec<Violation> {
    let mut out = Vec::new();
    for (n, line) in lines {
        let mut tokens = path_tokens(line, shape);
        tokens.sort();
        tokens.dedup();
        for token in tokens {
            if !path_exists(root, &token) {
                let what = if token.contains('*') {
                    "matches nothing"
                } else {
                    "does not exist"
                };
                out.push(violation(
                    file,
                    *n,
                    format!("cites `{token}`, which {what}: point it at the file's current path, or drop the citation"),
                ));
            }
        }
    }
    out
}

fn check_dead_paths(root: &Path, files: &[String]) -> Vec<Violation> {
    let shape = PathShape::of(root);
    let mut out = Vec::new();
    for file in files {
        if let Some(lines) = cited_lines(root, file) {
            out.extend(dead_paths_in(root, file, &lines, &shape));
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Check 2: Markdown links
// ---------------------------------------------------------------------------

/// Markdown lines outside fenced code blocks: number, text, and text with
/// inline code spans blanked.
fn prose_lines(text: &str) -> Vec<(usize, &str, String)> {
    let mut out = Vec::new();
    let mut fence: Option<(char, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let run = |c: char| t.chars().take_while(|&x| x == c).count();
        let (ticks, tildes) = (run('`'), run('~'));
        let opener = if ticks >= 3 {
            Some(('`', ticks))
        } else if tildes >= 3 {
            Some(('~', tildes))
        } else {
            None
        };
        match (fence, opener) {
            (None, Some(f)) => fence = Some(f),
            (Some((c, n)), Some((c2, n2)))
                if c == c2 && n2 >= n && t.trim_end().chars().all(|x| x == c) =>
            {
                fence = None
            }
            (Some(_), _) => {}
            (None, None) => out.push((i + 1, line, blank_code_spans(line))),
        }
    }
    out
}

fn blank_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out: Vec<char> = chars.clone();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let n = chars[i..].iter().take_while(|&&c| c == '`').count();
        let mut j = i + n;
        let mut close = None;
        while j < chars.len() {
            let m = chars[j..].iter().take_while(|&&c| c == '`').count();
            if m == n {
                close = Some(j);
                break;
            }
            j += m.max(1);
        }
        match close {
            Some(j) => {
                out[i..j + n].iter_mut().for_each(|c| *c = ' ');
                i = j + n;
            }
            None => i += n,
        }
    }
    out.into_iter().collect()
}

/// Link targets in Markdown prose: `[t](target)`, `![a](target)`,
/// `[ref]: target`, and mdBook's `{{#include target}}`.
fn md_links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, raw, line) in prose_lines(text) {
        let t = raw.trim_start();
        let definition = raw.len() - t.len() <= 3 && t.starts_with('[') && !t.starts_with("[^");
        if let Some((_, rest)) = t.split_once("]:").filter(|_| definition) {
            out.push((n, rest.trim().to_owned()));
        }
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let mut depth = 0usize;
            let end = after
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' if depth == 0 => return true,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    false
                })
                .map_or(after.len(), |(k, _)| k);
            out.push((n, after[..end].trim().to_owned()));
            rest = &after[end..];
        }
        for directive in ["{{#include ", "{{#rustdoc_include ", "{{#playground "] {
            let mut rest = line.as_str();
            while let Some(at) = rest.find(directive) {
                let after = &rest[at + directive.len()..];
                let end = after.find("}}").unwrap_or(after.len());
                let target = after[..end].trim().split(':').next().unwrap_or_default();
                out.push((n, target.to_owned()));
                rest = &after[end..];
            }
        }
    }
    out
}

/// GitHub's and mdBook's heading id: lowercase, letters, digits, `-` and
/// `_` kept, spaces to `-`, other punctuation dropped (Markdown links and
/// HTML tags reduced to their text first).
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading.trim();
    // `[text](url)` → `text`; `<tag>` → nothing.
    while let Some(c) = rest.chars().next() {
        if c == ']' && rest.starts_with("](") {
            rest = rest.find(')').map_or("", |k| &rest[k + 1..]);
            continue;
        }
        if c == '<' && rest.contains('>') {
            rest = rest.find('>').map_or("", |k| &rest[k + 1..]);
            continue;
        }
        text.push(c);
        rest = &rest[c.len_utf8()..];
    }
    text.trim()
        .chars()
        .filter_map(|c| match c {
            _ if c.is_alphanumeric() => Some(c.to_lowercase().next().unwrap_or(c)),
            '-' | '_' => Some(c),
            _ if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

/// The anchors a Markdown file offers: heading ids (duplicates numbered
/// `-1`, `-2`, …; `{#id}` taking precedence) and HTML `id`/`name` attributes.
fn md_anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (_, line, _) in prose_lines(text) {
        for attr in ["id=\"", "name=\""] {
            for piece in line.split(attr).skip(1) {
                if let Some(end) = piece.find('"') {
                    out.insert(piece[..end].to_owned());
                }
            }
        }
        let t = line.trim_start();
        let level = t.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&level) || line.len() - t.len() > 3 {
            continue;
        }
        let title = &t[level..];
        if !title.is_empty() && !title.starts_with([' ', '\t']) {
            continue;
        }
        let title = title.trim().trim_end_matches('#').trim_end();
        if let Some((_, id)) = title.strip_suffix('}').and_then(|t| t.rsplit_once("{#")) {
            out.insert(id.split_whitespace().next().unwrap_or_default().to_owned());
            continue;
        }
        let base = slug(title);
        let count = seen.entry(base.clone()).or_insert(0);
        out.insert(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    out
}

/// `a/b/../c` → `a/c`, lexically (a `..` above the root is kept).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = s
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Dead links of one Markdown file (`file` relative to `root`).
fn dead_links_in(root: &Path, file: &str, text: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    let dir = Path::new(file).parent().unwrap_or(Path::new(""));
    for (n, raw) in md_links(text) {
        let target = match raw.strip_prefix('<') {
            Some(inner) => inner.split('>').next().unwrap_or_default(),
            None => raw.split_whitespace().next().unwrap_or_default(),
        };
        let external =
            target.contains("://") || target.starts_with("mailto:") || target.starts_with("tel:");
        if target.is_empty() || external || target.contains("{{") {
            continue;
        }
        let (path, anchor) = target
            .split_once('#')
            .map_or((target, None), |(p, a)| (p, Some(a)));
        let path = percent_decode(path);
        let rel = if path.is_empty() {
            PathBuf::from(file)
        } else if let Some(abs) = path.strip_prefix('/') {
            PathBuf::from(abs)
        } else {
            normalize(&dir.join(&path))
        };
        let full = root.join(&rel);
        if !full.exists() {
            let shown = rel.display();
            out.push(violation(
                file,
                n,
                format!(
                    "link `{target}`: `{shown}` does not exist; point the link at the current file"
                ),
            ));
            continue;
        }
        let Some(anchor) = anchor.filter(|a| !a.is_empty()) else {
            continue;
        };
        if full.extension().is_some_and(|e| e == "md") && full.is_file() {
            let anchors = md_anchors(&String::from_utf8_lossy(
                &fs::read(&full).unwrap_or_else(|e| panic!("cannot read {}: {e}", full.display())),
            ));
            let anchor = percent_decode(anchor);
            if !anchors.contains(&anchor) && !anchors.contains(&anchor.to_lowercase()) {
                out.push(violation(
                    file,
                    n,
                    format!(
                        "link `{target}`: no heading in `{}` has the id `{anchor}`; link to an existing heading (ids are lowercase, punctuation dropped, spaces as `-`)",
                        rel.display()
                    ),
                ));
            }
        }
    }
    out
}

fn check_links(root: &Path, files: &[String]) -> Vec<Violation> {
    let mut out = Vec::new();
    for file in files.iter().filter(|f| is_checked_markdown(f)) {
        out.extend(dead_links_in(root, file, &read(root, file)));
    }
    out
}

// ---------------------------------------------------------------------------
// Check 3: section numbers
// ---------------------------------------------------------------------------

/// Internal section-number citations on one line: `DESIGN.md` followed by a
/// section sign or the word "section" and a number, and any section sign
/// with a number not preceded by an external spec (`RFC`, `IETF`, `draft`)
/// on its line, or, when it starts the line, at the end of `prev` (prose
/// wrapped as "RFC 9113" / next line: the section).
fn section_cites(prev: Option<&str>, line: &str) -> Vec<String> {
    let number = |rest: &str| -> String {
        let n: String = rest
            .trim_start_matches([' ', '\u{a0}'])
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        n.trim_end_matches('.').to_owned()
    };
    let mut out = Vec::new();
    let lower = line.to_lowercase();
    for (at, _) in lower.match_indices("design.md") {
        let rest =
            lower[at + "design.md".len()..].trim_start_matches([' ', '`', '\'', '"', ',', ')']);
        for word in ["section ", "sec. ", "chapter "] {
            let n = rest.strip_prefix(word).map(number).unwrap_or_default();
            if !n.is_empty() {
                out.push(format!("`DESIGN.md {word}{n}` cites a section number"));
            }
        }
    }
    for (at, _) in line.match_indices('§') {
        let n = number(&line[at + '§'.len_utf8()..]);
        if n.is_empty() {
            continue;
        }
        let mut context = line[..at].to_owned();
        if !context.chars().any(char::is_alphanumeric) {
            context = format!("{} {context}", prev.unwrap_or_default());
        }
        let design = context
            .trim_end_matches([' ', '`', '\'', '"', ',', '(', '/', '!'])
            .ends_with("DESIGN.md");
        let context = context.to_lowercase();
        if design {
            out.push(format!("`DESIGN.md §{n}` cites a section number"));
        } else if !["rfc", "ietf", "draft"]
            .iter()
            .any(|spec| context.contains(spec))
        {
            out.push(format!("`§{n}` cites an internal section number"));
        }
    }
    out
}

fn section_cites_in(file: &str, lines: &[(usize, String)]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut prev: Option<&(usize, String)> = None;
    for entry @ (n, line) in lines {
        let above = prev
            .filter(|(p, _)| p + 1 == *n)
            .map(|(_, text)| text.as_str());
        for what in section_cites(above, line) {
            out.push(violation(
                file,
                *n,
                format!(
                    "{what}: cite the chapter (its title or a link), not a section number; `§` is only for external specs (`RFC 9110 §15`)"
                ),
            ));
        }
        prev = Some(entry);
    }
    out
}

fn check_sections(root: &Path, files: &[String]) -> Vec<Violation> {
    let mut out = Vec::new();
    for file in files {
        if let Some(lines) = cited_lines(root, file) {
            out.extend(section_cites_in(file, &lines));
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Check 4: sizes
// ---------------------------------------------------------------------------

/// Index of the `}` matching the `{` at `open` in blanked code.
fn matching_brace(code: &[char], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (k, &c) in code.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// Blanked code as chars with the (1-based) line of each char.
struct Chars {
    c: Vec<char>,
    line: Vec<usize>,
}

impl Chars {
    fn of(code: &str) -> Chars {
        let c: Vec<char> = code.chars().collect();
        let mut line = Vec::with_capacity(c.len());
        let mut n = 1;
        for &ch in &c {
            line.push(n);
            if ch == '\n' {
                n += 1;
            }
        }
        Chars { c, line }
    }

    fn word_at(&self, k: usize, word: &str) -> bool {
        let n = word.chars().count();
        self.c
            .get(k..k + n)
            .is_some_and(|here| here.iter().copied().eq(word.chars()))
            && (k == 0 || !is_ident(self.c[k - 1]))
            && self.c.get(k + n).is_none_or(|&c| !is_ident(c))
    }

    fn skip_ws(&self, mut k: usize) -> usize {
        while self.c.get(k).is_some_and(|c| c.is_whitespace()) {
            k += 1;
        }
        k
    }

    fn ident_at(&self, k: usize) -> String {
        self.c[k.min(self.c.len())..]
            .iter()
            .take_while(|&&c| is_ident(c))
            .collect()
    }
}

/// Number of lines before the trailing test modules (`#[cfg(test)]` then
/// `mod name { … }` or `mod name;`, at the end of the file), from blanked code.
fn non_test_lines(code: &str) -> usize {
    let cs = Chars::of(code);
    let lines: Vec<&str> = code.lines().collect();
    let line_start: Vec<usize> = {
        let mut v = vec![0];
        v.extend(
            cs.c.iter()
                .enumerate()
                .filter(|&(_, &c)| c == '\n')
                .map(|(k, _)| k + 1),
        );
        v
    };
    // (first line, last line) of each top-level test module, 0-based.
    let mut modules = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !l.starts_with("#[cfg(test)]") || l.trim_end() != "#[cfg(test)]" {
            continue;
        }
        let Some(j) = (i + 1..lines.len())
            .find(|&j| !lines[j].trim().is_empty() && !lines[j].trim().starts_with("#["))
        else {
            continue;
        };
        let decl = lines[j].trim();
        let decl = decl
            .strip_prefix("pub ")
            .or_else(|| decl.strip_prefix("pub(crate) "))
            .unwrap_or(decl);
        if !decl.starts_with("mod ") {
            continue;
        }
        let from = line_start[j];
        let to = from + lines[j].chars().count();
        let end = match (from..to).find(|&k| cs.c[k] == '{') {
            Some(open) => {
                matching_brace(&cs.c, open).map_or(lines.len() - 1, |close| cs.line[close] - 1)
            }
            None => j,
        };
        modules.push((i, end));
    }
    let last_code = |upto: usize| (0..upto).rev().find(|&k| !lines[k].trim().is_empty());
    let mut cut = lines.len();
    let mut last = last_code(lines.len());
    while let Some(&(start, _)) = modules.iter().find(|&&(_, end)| Some(end) == last) {
        cut = start;
        last = last_code(start);
    }
    cut
}

/// A function with a body: its name, `fn` line (1-based) and span in lines.
#[derive(Debug, PartialEq, Eq)]
struct FnSpan {
    name: String,
    line: usize,
    lines: usize,
}

/// Every `fn` item with a body in blanked code (free, associated, nested,
/// `async`, `const`, any visibility), before line `limit` (1-based, exclusive).
fn fn_spans(code: &str, limit: usize) -> Vec<FnSpan> {
    let cs = Chars::of(code);
    let mut out = Vec::new();
    for k in 0..cs.c.len() {
        if cs.line[k] >= limit || !cs.word_at(k, "fn") {
            continue;
        }
        let mut at = cs.skip_ws(k + 2);
        if cs.c.get(at..at + 2) == Some(&['r', '#'][..]) {
            at += 2;
        }
        let name = cs.ident_at(at);
        if name.is_empty() {
            continue; // `fn(u8) -> u8`, a pointer type
        }
        let mut depth = 0i32;
        let mut body = None;
        for j in at..cs.c.len() {
            match cs.c[j] {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                ';' if depth == 0 => break,
                '{' if depth == 0 => {
                    body = Some(j);
                    break;
                }
                _ => {}
            }
        }
        if let Some(close) = body.and_then(|open| matching_brace(&cs.c, open)) {
            out.push(FnSpan {
                name,
                line: cs.line[k],
                lines: cs.line[close] - cs.line[k] + 1,
            });
        }
    }
    out
}

fn sizes_of(file: &str, src: &str) -> Vec<Violation> {
    let code = lex_rust(src).code;
    let cut = non_test_lines(&code);
    let mut out = Vec::new();
    if cut > MAX_FILE_LINES {
        out.push(violation(
            file,
            0,
            format!("{cut} lines of non-test code (limit {MAX_FILE_LINES}): split the module into submodules"),
        ));
    }
    for f in fn_spans(&code, cut + 1) {
        if f.lines > MAX_FN_LINES {
            out.push(violation(
                file,
                f.line,
                format!(
                    "fn `{}` spans {} lines (limit {MAX_FN_LINES}): split it into named steps",
                    f.name, f.lines
                ),
            ));
        }
    }
    out
}

fn check_sizes(root: &Path, files: &[String]) -> Vec<Violation> {
    let mut out = Vec::new();
    for file in files
        .iter()
        .filter(|f| f.ends_with(".rs") && crate_src(f).is_some())
    {
        out.extend(sizes_of(file, &read(root, file)));
    }
    out
}

// ---------------------------------------------------------------------------
// Check 5: import cycles
// ---------------------------------------------------------------------------

/// One `use` path (expanded from a tree) or inline path, with its line.
#[derive(Debug, Clone)]
struct UsePath {
    segs: Vec<String>,
    /// The name it brings in (`as` alias, last segment, or `*`).
    name: String,
    line: usize,
    reexport: bool,
    /// A path written in code, not in a `use`: it imports no name.
    inline: bool,
}

/// Splits a `use` tree into its paths: `a::{b, c::{self, D as E}, f::*}`.
fn expand_use_tree(tree: &str) -> Vec<(Vec<String>, String)> {
    let mut toks = Vec::new();
    let mut word = String::new();
    let mut chars = tree.chars().peekable();
    while let Some(c) = chars.next() {
        if is_ident(c) || c == '$' || c == '#' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            toks.push(std::mem::take(&mut word));
        }
        if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            toks.push("::".to_owned());
        } else if "{},*".contains(c) {
            toks.push(c.to_string());
        }
    }
    if !word.is_empty() {
        toks.push(word);
    }
    let mut out = Vec::new();
    let mut pos = 0;
    parse_tree(&toks, &mut pos, Vec::new(), &mut out);
    out
}

fn parse_tree(
    toks: &[String],
    pos: &mut usize,
    mut path: Vec<String>,
    out: &mut Vec<(Vec<String>, String)>,
) {
    if toks.get(*pos).is_some_and(|t| t == "::") {
        *pos += 1; // leading `::`
    }
    while let Some(t) = toks.get(*pos) {
        *pos += 1;
        match t.as_str() {
            "{" => {
                while toks.get(*pos).is_some_and(|t| t != "}") {
                    parse_tree(toks, pos, path.clone(), out);
                    if toks.get(*pos).is_some_and(|t| t == ",") {
                        *pos += 1;
                    }
                }
                *pos += 1;
                return;
            }
            "*" => {
                path.push("*".to_owned());
                out.push((path, "*".to_owned()));
                return;
            }
            "," | "}" => {
                *pos -= 1;
                break;
            }
            _ => {
                path.push(t.trim_start_matches("r#").to_owned());
                match toks.get(*pos).map(String::as_str) {
                    Some("::") => *pos += 1,
                    Some("as") => {
                        let alias = toks.get(*pos + 1).cloned().unwrap_or_default();
                        *pos += 2;
                        out.push((path, alias));
                        return;
                    }
                    _ => break,
                }
            }
        }
    }
    if path.len() > 1 && path.last().is_some_and(|s| s == "self") {
        path.pop();
    }
    if let Some(name) = path.last().cloned() {
        out.push((path, name));
    }
}

/// The `use` declarations and inline paths (`crate::`, `super::`,
/// `self::`, `$crate::`, or any other first name: the crate's own name, a
/// child module, an extern crate, a type; [`ModuleGraph::absolute`] sorts
/// them out) of blanked code, before line `limit` (exclusive).
fn use_paths(code: &str, limit: usize) -> Vec<UsePath> {
    let cs = Chars::of(code);
    let mut out = Vec::new();
    let mut in_use = vec![false; cs.c.len()];
    for k in 0..cs.c.len() {
        if cs.line[k] >= limit || !cs.word_at(k, "use") {
            continue;
        }
        let start = cs.skip_ws(k + 3);
        if cs.c.get(start) == Some(&'<') {
            continue; // `impl Trait + use<'a>`
        }
        let end = (start..cs.c.len())
            .find(|&j| cs.c[j] == ';')
            .unwrap_or(cs.c.len());
        in_use[k..end].iter_mut().for_each(|b| *b = true);
        let reexport = is_reexport(&cs, k);
        let tree: String = cs.c[start..end].iter().collect();
        for (segs, name) in expand_use_tree(&tree) {
            out.push(UsePath {
                segs,
                name,
                line: cs.line[k],
                reexport,
                inline: false,
            });
        }
    }
    for (k, &inside_use) in in_use.iter().enumerate() {
        if cs.line[k] >= limit
            || inside_use
            || (k > 0 && (is_ident(cs.c[k - 1]) || "$.':".contains(cs.c[k - 1])))
        {
            continue;
        }
        let root = if cs.word_at(k, "$crate") {
            "$crate".to_owned()
        } else {
            cs.ident_at(k)
        };
        if root.is_empty()
            || root.starts_with(|c: char| c.is_ascii_digit())
            || cs.c.get(k + root.len()..k + root.len() + 2) != Some(&[':', ':'][..])
            || preceded_by_in(&cs, k)
        {
            continue;
        }
        let mut segs = vec![root.clone()];
        let mut j = k + root.len();
        while cs.c.get(j..j + 2) == Some(&[':', ':'][..]) {
            let seg = cs.ident_at(j + 2);
            if seg.is_empty() {
                break;
            }
            j += 2 + seg.len();
            segs.push(seg);
        }
        let name = segs.last().cloned().unwrap_or_default();
        out.push(UsePath {
            segs,
            name,
            line: cs.line[k],
            reexport: false,
            inline: true,
        });
    }
    out
}

/// Whether the `use` at `k` is `pub use`, `pub(crate) use`, `pub(in …) use`.
fn is_reexport(cs: &Chars, k: usize) -> bool {
    let mut j = k;
    while j > 0 && cs.c[j - 1].is_whitespace() {
        j -= 1;
    }
    if j > 0 && cs.c[j - 1] == ')' {
        let mut depth = 0;
        while j > 0 {
            j -= 1;
            match cs.c[j] {
                ')' => depth += 1,
                '(' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    j >= 3 && cs.word_at(j - 3, "pub")
}

/// `pub(in crate::store)`: a visibility, not a dependency.
fn preceded_by_in(cs: &Chars, k: usize) -> bool {
    let mut j = k;
    while j > 0 && cs.c[j - 1].is_whitespace() {
        j -= 1;
    }
    j >= 2 && cs.word_at(j - 2, "in")
}

/// The module files of one crate and what each file imports.
struct ModuleGraph {
    /// module path (`["store", "memory"]`) → file; the lib root is `[]`.
    modules: BTreeMap<Vec<String>, String>,
    /// file → (module path, is part of the library crate).
    file_mod: BTreeMap<String, (Vec<String>, bool)>,
    uses: BTreeMap<String, Vec<UsePath>>,
    /// file → the names of the items it defines outside its tests.
    items: BTreeMap<String, BTreeSet<String>>,
    crate_name: String,
}

/// The names of the items (`fn`, `struct`, `mod`, …) blanked code defines.
fn item_names(code: &str) -> BTreeSet<String> {
    let kinds = [
        "fn",
        "struct",
        "enum",
        "trait",
        "type",
        "const",
        "static",
        "union",
        "mod",
        "macro_rules!",
    ];
    let cs = Chars::of(code);
    let mut out = BTreeSet::new();
    for k in 0..cs.c.len() {
        for kind in kinds {
            if cs.word_at(k, kind.trim_end_matches('!')) {
                out.insert(cs.ident_at(cs.skip_ws(k + kind.len())));
            }
        }
    }
    out.remove("");
    out
}

/// Edges `from → to` with one example (line, source line) each.
type Edges = BTreeMap<(String, String), (usize, String)>;

impl ModuleGraph {
    /// `sources`: `(path under the repository root, text)` of the crate's
    /// `.rs` files (others are skipped). The crate's root is its `lib.rs`;
    /// its `main.rs` and `bin/` are binaries using it, or, without a
    /// `lib.rs`, `main.rs` is the root.
    fn build(sources: &[(String, String)], krate: &Crate) -> ModuleGraph {
        let mut g = ModuleGraph {
            modules: BTreeMap::new(),
            file_mod: BTreeMap::new(),
            uses: BTreeMap::new(),
            items: BTreeMap::new(),
            crate_name: krate.name.replace('-', "_"),
        };
        let lib = format!("{}/lib.rs", krate.src);
        let has_lib = sources.iter().any(|(file, _)| *file == lib);
        for (file, text) in sources {
            let Some(rel) = file
                .strip_prefix(&krate.src)
                .and_then(|f| f.strip_prefix('/'))
                .and_then(|f| f.strip_suffix(".rs"))
            else {
                continue;
            };
            let is_bin = (rel == "main" && has_lib) || rel.starts_with("bin/");
            let mut segs: Vec<String> = rel.split('/').map(str::to_owned).collect();
            if segs.last().is_some_and(|s| s == "mod") || rel == "lib" || rel == "main" {
                segs.pop();
            }
            if is_bin {
                segs = Vec::new();
            } else {
                g.modules.insert(segs.clone(), file.clone());
            }
            g.file_mod.insert(file.clone(), (segs, !is_bin));
            let code = lex_rust(text).code;
            let cut = non_test_lines(&code);
            let kept: String = code.lines().take(cut).collect::<Vec<_>>().join("\n");
            g.uses.insert(file.clone(), use_paths(&kept, cut + 1));
            g.items.insert(file.clone(), item_names(&kept));
        }
        g
    }

    /// The absolute module path a path of `file` names, or None when it is
    /// outside the library (std, another crate, a bin's own items).
    fn absolute(&self, file: &str, segs: &[String]) -> Option<Vec<String>> {
        let (here, is_lib) = self.file_mod.get(file)?;
        let first = segs.first()?.as_str();
        let mut child = here.clone();
        child.push(first.to_owned());
        let (mut base, mut rest) = match first {
            "crate" | "$crate" if *is_lib => (Vec::new(), &segs[1..]),
            _ if first == self.crate_name => (Vec::new(), &segs[1..]),
            "self" | "super" if *is_lib => (here.clone(), segs),
            // A child module, named bare: declared here (`mod redis;`) and
            // with a file; any other bare name is an extern crate or an item.
            _ if *is_lib
                && self.modules.contains_key(&child)
                && self.items.get(file).is_some_and(|i| i.contains(first)) =>
            {
                (here.clone(), segs)
            }
            _ => return None,
        };
        while let Some(s) = rest.first() {
            match s.as_str() {
                "self" => {}
                "super" => {
                    base.pop()?;
                }
                _ => break,
            }
            rest = &rest[1..];
        }
        base.extend(rest.iter().filter(|s| *s != "*").cloned());
        Some(base)
    }

    /// The file an absolute path lands in: the longest prefix that is a
    /// module file, followed through that file's imports of the next name.
    /// Private imports are followed too: only the importing module and its
    /// descendants can name them (`super::X` where the parent has `use
    /// sibling::X`), and such a path depends on the sibling, not the parent.
    /// As in Rust, an explicit import or an item of the file itself comes
    /// before a glob import.
    fn land(&self, path: &[String], depth: usize) -> Option<String> {
        let k = (0..=path.len())
            .rev()
            .find(|&k| self.modules.contains_key(&path[..k]))?;
        let file = self.modules.get(&path[..k])?.clone();
        let Some(name) = path.get(k) else {
            return Some(file);
        };
        if depth > 8 {
            return Some(file);
        }
        let imports: Vec<(Vec<String>, &UsePath)> = self
            .uses
            .get(&file)
            .into_iter()
            .flatten()
            .filter(|u| !u.inline)
            .filter_map(|u| Some((self.absolute(&file, &u.segs)?, u)))
            .collect();
        if let Some((target, _)) = imports.iter().find(|(_, u)| u.name == *name) {
            let mut next = target.clone();
            next.extend(path[k + 1..].iter().cloned());
            return self.land(&next, depth + 1);
        }
        if self.items.get(&file).is_some_and(|i| i.contains(name)) {
            return Some(file);
        }
        let glob = imports.iter().find(|(target, u)| {
            u.name == "*"
                && self
                    .modules
                    .get(target)
                    .is_some_and(|f| self.defines(f, name))
        });
        if let Some((target, _)) = glob {
            let mut next = target.clone();
            next.extend(path[k..].iter().cloned());
            return self.land(&next, depth + 1);
        }
        Some(file)
    }

    /// Whether `file` defines (or re-exports) an item called `name`.
    fn defines(&self, file: &str, name: &str) -> bool {
        let item = self
            .items
            .get(file)
            .is_some_and(|items| items.contains(name));
        item || self
            .uses
            .get(file)
            .into_iter()
            .flatten()
            .any(|u| u.reexport && u.name == name)
    }

    /// Whether `ancestor` is the file of a module that encloses `file`'s
    /// module: its parent, grandparent, … up to `src/lib.rs` (a bin's files
    /// are part of no library module).
    fn is_ancestor(&self, ancestor: &str, file: &str) -> bool {
        let (Some((outer, true)), Some((inner, true))) =
            (self.file_mod.get(ancestor), self.file_mod.get(file))
        else {
            return false;
        };
        outer.len() < inner.len() && inner.starts_with(outer)
    }

    /// Every dependency edge between two different files, except an edge
    /// from a file to one of its ancestors' files (after following
    /// re-exports to the defining file): a module is part of its ancestors
    /// and may use what they define.
    fn edges(&self, sources: &BTreeMap<String, String>) -> Edges {
        let mut edges = Edges::new();
        for (file, uses) in &self.uses {
            for u in uses.iter().filter(|u| !u.reexport) {
                let Some(to) = self
                    .absolute(file, &u.segs)
                    .and_then(|abs| self.land(&abs, 0))
                else {
                    continue;
                };
                if to != *file && !self.is_ancestor(&to, file) {
                    edges.entry((file.clone(), to)).or_insert_with(|| {
                        let text = sources.get(file).and_then(|s| s.lines().nth(u.line - 1));
                        (u.line, text.unwrap_or_default().trim().to_owned())
                    });
                }
            }
        }
        edges
    }
}

/// The strongly connected components with more than one node (Tarjan).
fn cycles<V>(edges: &BTreeMap<(String, String), V>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        next: BTreeMap<&'a str, Vec<&'a str>>,
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.next.get(v).cloned().unwrap_or_default() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.found.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        next: BTreeMap::new(),
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for (from, to) in edges.keys() {
        t.next.entry(from.as_str()).or_default().push(to.as_str());
        t.next.entry(to.as_str()).or_default();
    }
    let nodes: Vec<&str> = t.next.keys().copied().collect();
    for v in nodes {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found.sort();
    t.found
}

/// One violation per cycle, listing its files and one `use` line per edge.
fn cycle_violations(sources: &[(String, String)], krate: &Crate) -> Vec<Violation> {
    let graph = ModuleGraph::build(sources, krate);
    let texts: BTreeMap<String, String> = sources.iter().cloned().collect();
    let edges = graph.edges(&texts);
    let mut out = Vec::new();
    for scc in cycles(&edges) {
        let members: BTreeSet<&String> = scc.iter().collect();
        let mut message = format!(
            "import cycle among {} files: {}; a file may use its ancestor modules, but not a \
             sibling, cousin or descendant that uses it back: move the shared item into a \
             common ancestor module or into one of the two files, or split it out into a new \
             module both import",
            scc.len(),
            scc.join(", ")
        );
        for ((from, to), (line, text)) in &edges {
            if members.contains(from) && members.contains(to) {
                message.push_str(&format!("\n    {from} → {to}   ({from}:{line}: {text})"));
            }
        }
        out.push(violation(&scc[0], 0, message));
    }
    out
}

fn check_cycles(root: &Path, files: &[String]) -> Vec<Violation> {
    crates(root, files)
        .iter()
        .flat_map(|krate| cycle_violations(&crate_sources(root, files, krate), krate))
        .collect()
}

// ---------------------------------------------------------------------------
// Check 6: the top-level modules form a DAG
// ---------------------------------------------------------------------------

/// Where a dependency between two top-level modules is written: the file,
/// the line, and the source line.
type Site = (String, usize, String);
/// Edges `from → to` between top-level modules, with every site of each.
type ModuleEdges = BTreeMap<(String, String), Vec<Site>>;

impl ModuleGraph {
    /// The top-level module `file` is part of (`redis` for
    /// `crates/store/src/redis/scripts.rs`); None for the crate root and the binaries.
    fn top(&self, file: &str) -> Option<&String> {
        match self.file_mod.get(file)? {
            (segs, true) => segs.first(),
            (_, false) => None,
        }
    }

    /// Every dependency between two different top-level modules: each path
    /// of a file outside its tests (a `use`, a `pub use` re-export, an
    /// inline path) from which [`ModuleGraph::absolute`] and
    /// [`ModuleGraph::land`] find the file defining what it names. A path
    /// to an item of the crate root is no edge; one to an import of the
    /// root (its `pub use` facade) lands on the module it imports from.
    fn module_edges(&self, sources: &BTreeMap<String, String>) -> ModuleEdges {
        let mut edges = ModuleEdges::new();
        for (file, uses) in &self.uses {
            let Some(from) = self.top(file) else {
                continue;
            };
            for u in uses {
                let landed = self
                    .absolute(file, &u.segs)
                    .and_then(|abs| self.land(&abs, 0));
                let Some(to) = landed.as_deref().and_then(|f| self.top(f)) else {
                    continue;
                };
                if to != from {
                    let text = sources.get(file).and_then(|s| s.lines().nth(u.line - 1));
                    let text = text.unwrap_or_default().trim().to_owned();
                    let key = (from.clone(), to.clone());
                    edges
                        .entry(key)
                        .or_default()
                        .push((file.clone(), u.line, text));
                }
            }
        }
        for sites in edges.values_mut() {
            sites.sort();
            sites.dedup();
        }
        edges
    }
}

/// A shortest cycle from `start` back to it through `members` (a strongly
/// connected component of `edges`): `[start, …, start]`.
fn shortest_cycle<'a, V>(
    edges: &'a BTreeMap<(String, String), V>,
    members: &BTreeSet<&String>,
    start: &'a str,
) -> Vec<String> {
    let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for (_, to) in edges.keys().filter(|(f, t)| f == v && members.contains(t)) {
            if to == start {
                let mut path = vec![start.to_owned()];
                let mut at = v;
                while at != start {
                    path.push(at.to_owned());
                    at = parent[at];
                }
                path.push(start.to_owned());
                path.reverse();
                return path;
            }
            if !parent.contains_key(to.as_str()) {
                parent.insert(to, v);
                queue.push_back(to);
            }
        }
    }
    vec![start.to_owned()]
}

/// One violation per cycle among a crate's top-level modules (a strongly
/// connected component): a shortest cycle through it, with the first site
/// of each edge, then the component's other edges.
fn module_cycle_violations(sources: &[(String, String)], krate: &Crate) -> Vec<Violation> {
    let graph = ModuleGraph::build(sources, krate);
    let texts: BTreeMap<String, String> = sources.iter().cloned().collect();
    let edges = graph.module_edges(&texts);
    let site = |from: &String, to: &String| {
        let sites = &edges[&(from.clone(), to.clone())];
        let (file, line, text) = &sites[0];
        let more = match sites.len() {
            1 => String::new(),
            n => format!("; {} more site(s)", n - 1),
        };
        format!("{from} → {to}   ({file}:{line}: {text}{more})")
    };
    let mut out = Vec::new();
    for scc in cycles(&edges) {
        let members: BTreeSet<&String> = scc.iter().collect();
        let cycle = shortest_cycle(&edges, &members, &scc[0]);
        let mut message = format!(
            "cycle between the top-level modules of {}/: {}; they must form a DAG (each may \
             become a crate of the workspace): break an edge, moving what it names into the \
             module that uses it or into a module below both",
            krate.src,
            cycle.join(" → ")
        );
        let on_cycle: BTreeSet<(&String, &String)> =
            cycle.windows(2).map(|p| (&p[0], &p[1])).collect();
        for pair in cycle.windows(2) {
            message.push_str(&format!("\n    {}", site(&pair[0], &pair[1])));
        }
        for (from, to) in edges.keys() {
            if members.contains(from) && members.contains(to) && !on_cycle.contains(&(from, to)) {
                message.push_str(&format!("\n    also {}", site(from, to)));
            }
        }
        let (file, line, _) = &edges[&(cycle[0].clone(), cycle[1].clone())][0];
        out.push(violation(file, *line, message));
    }
    out
}

fn check_module_cycles(root: &Path, files: &[String]) -> Vec<Violation> {
    crates(root, files)
        .iter()
        .flat_map(|krate| module_cycle_violations(&crate_sources(root, files, krate), krate))
        .collect()
}

/// The book's chapters missing from its `SUMMARY.md`: every Markdown
/// file under `docs/src/` (but the summary itself) must be listed there,
/// or `mdbook build` silently leaves it out of the book.
fn unlisted_chapters(root: &Path, files: &[String]) -> Vec<Violation> {
    let summary_file = "docs/src/SUMMARY.md";
    if !files.iter().any(|f| f == summary_file) {
        return Vec::new();
    }
    let listed: BTreeSet<String> = md_links(&read(root, summary_file))
        .into_iter()
        .map(|(_, target)| {
            let target = target.split('#').next().unwrap_or_default();
            format!("docs/src/{}", target.trim_start_matches("./"))
        })
        .collect();
    files
        .iter()
        .filter(|f| f.starts_with("docs/src/") && f.ends_with(".md") && *f != summary_file)
        .filter(|f| !listed.contains(*f))
        .map(|f| {
            violation(
                f,
                1,
                format!("is not listed in {summary_file}: add it there, or remove the file"),
            )
        })
        .collect()
}

/// The Dockerfile's instructions, continuation lines joined: (line of the
/// instruction, its keyword upper-cased, the rest).
fn docker_instructions(text: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if pending.is_none() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        if pending.is_some() && line.starts_with('#') {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((n + 1, String::new()));
        let (body, more) = match line.strip_suffix('\\') {
            Some(body) => (body, true),
            None => (line, false),
        };
        joined.push(' ');
        joined.push_str(body);
        if more {
            pending = Some((start, joined));
            continue;
        }
        let joined = joined.trim().to_owned();
        let (keyword, rest) = joined
            .split_once(char::is_whitespace)
            .unwrap_or((&joined, ""));
        out.push((start, keyword.to_ascii_uppercase(), rest.trim().to_owned()));
    }
    out
}

/// The strings of a JSON-array (exec form) instruction: `["a", "b"]`.
fn exec_form(rest: &str) -> Option<Vec<String>> {
    let inner = rest.trim().strip_prefix('[')?.strip_suffix(']')?;
    Some(
        inner
            .split(',')
            .map(|part| part.trim().trim_matches('"').to_owned())
            .filter(|part| !part.is_empty())
            .collect(),
    )
}

/// The subcommands `src/cli/mod.rs` declares: the variants of `enum
/// Command`, kebab-cased as clap names them.
fn cli_subcommands(cli: &str) -> BTreeSet<String> {
    let Some(start) = cli.find("pub enum Command {") else {
        return BTreeSet::new();
    };
    let body = &cli[start..];
    let body = &body[..body.find("\n}").unwrap_or(body.len())];
    body.lines()
        .skip(1)
        .filter(|line| line.starts_with("    ") && !line.starts_with("     "))
        .map(str::trim)
        .filter(|line| line.chars().next().is_some_and(|c| c.is_ascii_uppercase()))
        .map(|line| {
            let name: String = line.chars().take_while(|c| c.is_alphanumeric()).collect();
            let mut kebab = String::new();
            for (i, c) in name.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    kebab.push('-');
                }
                kebab.push(c.to_ascii_lowercase());
            }
            kebab
        })
        .collect()
}

/// What the image build and run depend on in the tree: every `COPY`
/// source from the build context exists; every binary copied from the
/// build stage's `target/<profile>/` is this package's binary, one of its
/// `src/bin/` binaries or one of its examples; the `HEALTHCHECK`, `ENTRYPOINT` and compose `entrypoint`
/// commands run a binary the image installs, and the health check a
/// subcommand the CLI has.
fn docker_findings(root: &Path, files: &[String]) -> Vec<Violation> {
    let dockerfile = "Dockerfile";
    if !files.iter().any(|f| f == dockerfile) {
        return Vec::new();
    }
    let text = read(root, dockerfile);
    let package = crate_name(root);
    let cli = if root.join("src/cli/mod.rs").exists() {
        read(root, "src/cli/mod.rs")
    } else {
        String::new()
    };
    let subcommands = cli_subcommands(&cli);
    let mut installed = BTreeSet::new();
    let mut found = Vec::new();
    let mut runs = Vec::new();
    for (line, keyword, rest) in docker_instructions(&text) {
        match keyword.as_str() {
            "COPY" | "ADD" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                let from_stage = words.iter().any(|w| w.starts_with("--from="));
                let paths: Vec<&str> = words
                    .iter()
                    .copied()
                    .filter(|w| !w.starts_with("--"))
                    .collect();
                let Some((dest, sources)) = paths.split_last() else {
                    continue;
                };
                for source in sources {
                    if from_stage {
                        // `…/target/<profile>/<binary>` (release, dist, …).
                        let built = source
                            .split("/target/")
                            .nth(1)
                            .and_then(|rest| rest.split_once('/'));
                        let Some((_, built)) = built else {
                            continue;
                        };
                        let known = match built.strip_prefix("examples/") {
                            Some(example) => root.join(format!("examples/{example}.rs")).exists(),
                            None => {
                                built == package
                                    || root.join(format!("src/bin/{built}.rs")).exists()
                            }
                        };
                        if !known {
                            found.push(violation(dockerfile, line, format!("copies `{built}` from the build, which is none of the package's binaries nor an example: build it, or fix the COPY")));
                        }
                        let name = built.rsplit('/').next().unwrap_or(built);
                        let target = match dest.strip_suffix('/') {
                            Some(dir) => format!("{dir}/{name}"),
                            None => (*dest).to_owned(),
                        };
                        installed.insert(target);
                    } else if !root.join(source.trim_end_matches('/')).exists() {
                        found.push(violation(dockerfile, line, format!("COPY source `{source}` does not exist in the tree: the image would not build")));
                    }
                }
            }
            "HEALTHCHECK" => {
                let cmd = rest.split_once("CMD").map_or("", |(_, cmd)| cmd);
                match exec_form(cmd) {
                    Some(args) => runs.push((dockerfile.to_owned(), line, args, true)),
                    None => found.push(violation(dockerfile, line, "HEALTHCHECK without an exec-form CMD [\"binary\", …]: the image has no shell to run a string".to_owned())),
                }
            }
            "ENTRYPOINT" => {
                if let Some(args) = exec_form(&rest) {
                    runs.push((dockerfile.to_owned(), line, args, false));
                }
            }
            _ => {}
        }
    }
    let compose = "docker-compose.yml";
    if files.iter().any(|f| f == compose) {
        for (n, text) in read(root, compose).lines().enumerate() {
            if let Some(rest) = text.trim().strip_prefix("entrypoint:")
                && let Some(args) = exec_form(rest)
            {
                runs.push((compose.to_owned(), n + 1, args, false));
            }
        }
    }
    for (file, line, args, health) in runs {
        let Some(binary) = args.first() else {
            continue;
        };
        if !installed.contains(binary) {
            found.push(violation(&file, line, format!("runs `{binary}`, which the Dockerfile does not install: copy it from the build stage, or fix the command")));
        }
        if health {
            let sub = args.get(1).map(String::as_str).unwrap_or_default();
            if !subcommands.contains(sub) {
                found.push(violation(&file, line, format!("the health check runs `{binary} {sub}`, and the CLI has no `{sub}` subcommand (src/cli/mod.rs)")));
            }
        }
    }
    found
}

// ---------------------------------------------------------------------------
// The checks, on this repository
// ---------------------------------------------------------------------------

#[test]
fn cited_repository_paths_exist() {
    let root = repo_root();
    report("dead path", &check_dead_paths(&root, &walk(&root)));
}

#[test]
fn markdown_links_resolve() {
    let root = repo_root();
    report("dead link", &check_links(&root, &walk(&root)));
}

#[test]
fn every_chapter_is_in_the_summary() {
    let root = repo_root();
    report("unlisted chapter", &unlisted_chapters(&root, &walk(&root)));
}

#[test]
fn the_image_builds_from_what_the_tree_has() {
    let root = repo_root();
    report("docker", &docker_findings(&root, &walk(&root)));
}

#[test]
fn no_internal_section_numbers() {
    let root = repo_root();
    report("section cite", &check_sections(&root, &walk(&root)));
}

#[test]
fn source_files_and_functions_are_small() {
    let root = repo_root();
    report("size", &check_sizes(&root, &walk(&root)));
}

#[test]
fn no_import_cycles() {
    let root = repo_root();
    report("import cycle", &check_cycles(&root, &walk(&root)));
}

#[test]
fn top_level_modules_form_a_dag() {
    let root = repo_root();
    report("module cycle", &check_module_cycles(&root, &walk(&root)));
}

/// What the core crate may not depend on: the prefixes of async runtimes,
/// database and HTTP or network crates, and of our own crates.
const IMPURE: &[&str] = &[
    "tokio", "async-", "futures", "mio", "smol", "sqlx", "rusqlite", "postgres", "redis",
    "deadpool", "hyper", "http", "reqwest", "tower", "tonic", "axum", "rustls", "idemgate",
];

/// The dependencies of `manifest` (a Cargo.toml's text) that are impure for
/// the core: every key of a `[dependencies]` table (or a target's) naming a
/// crate in [`IMPURE`].
fn impure_dependencies(file: &str, manifest: &str) -> Vec<Violation> {
    let mut in_dependencies = false;
    let mut found = Vec::new();
    for (n, line) in manifest.lines().enumerate() {
        let line = line.trim();
        if line.starts_with('[') {
            let table = line.trim_matches(|c| c == '[' || c == ']');
            in_dependencies = table == "dependencies" || table.ends_with(".dependencies");
            continue;
        }
        let Some((key, _)) = line.split_once('=').filter(|_| in_dependencies) else {
            continue;
        };
        let name = key.trim().trim_matches('"');
        if !name.starts_with('#') && IMPURE.iter().any(|p| name.starts_with(p)) {
            found.push(violation(file, n + 1, format!("the core depends on `{name}`: it must stay pure (no async runtime, database, HTTP or crate of ours); move the code that needs it to the store or the gateway")));
        }
    }
    found
}

#[test]
fn the_core_is_pure() {
    let root = repo_root();
    let file = "crates/core/Cargo.toml";
    assert!(root.join(file).exists(), "{file} is missing");
    report(
        "impure core",
        &impure_dependencies(file, &read(&root, file)),
    );
}

// ---------------------------------------------------------------------------
// Negative controls: each check must flag what it exists to flag
// ---------------------------------------------------------------------------

#[cfg(test)]
mod controls {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A throwaway tree under the temp dir, removed on drop.
    struct TempTree(PathBuf);

    impl TempTree {
        fn new(files: &[(&str, &str)]) -> TempTree {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let name = format!(
                "idemgate-tree-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            );
            let root = std::env::temp_dir().join(name);
            for (path, text) in files {
                let full = root.join(path);
                let dir = full.parent().expect("a file path has a parent");
                fs::create_dir_all(dir)
                    .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
                fs::write(&full, text)
                    .unwrap_or_else(|e| panic!("cannot write {}: {e}", full.display()));
            }
            TempTree(root)
        }
    }

    impl Drop for TempTree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A Dockerfile that copies a missing file, installs an unknown build
    /// product, or health-checks with a binary it does not install or a
    /// subcommand the CLI lacks is flagged; a sound one is not.
    #[test]
    fn a_dockerfile_the_tree_cannot_build_is_flagged() {
        let cli = "pub enum Command {\n    /// Serve.\n    Serve,\n    /// Probe.\n    Health {\n        admin: u8,\n    },\n}\n";
        let sound = "FROM rust AS build\nCOPY Cargo.toml \\\n  build.rs ./\nCOPY . .\nFROM debian\nCOPY --from=build /src/target/release/demo /usr/local/bin/demo\nCOPY --from=build /src/target/release/examples/up /usr/local/bin/up\nHEALTHCHECK --interval=10s \\\n    CMD [\"/usr/local/bin/demo\", \"health\"]\nENTRYPOINT [\"/usr/local/bin/demo\"]\n";
        let base = [
            ("Cargo.toml", "[package]\nname = \"demo\"\n"),
            ("build.rs", "fn main() {}\n"),
            ("src/cli/mod.rs", cli),
            ("examples/up.rs", "fn main() {}\n"),
            (
                "docker-compose.yml",
                "services:\n  up:\n    entrypoint: [\"/usr/local/bin/up\", \"--listen\"]\n",
            ),
        ];
        let run = |dockerfile: &str| {
            let mut files = base.to_vec();
            files.push(("Dockerfile", dockerfile));
            let tree = TempTree::new(&files);
            docker_findings(&tree.0, &walk(&tree.0))
        };
        assert!(run(sound).is_empty(), "{:?}", run(sound));
        let broken = [
            sound.replace("build.rs ./", "build.rs missing.txt ./"),
            sound.replace("examples/up", "examples/gone"),
            sound.replace("release/demo /", "release/other /"),
            sound.replace("\"health\"", "\"healthz\""),
            sound.replace("CMD [\"/usr/local/bin/demo\"", "CMD [\"/usr/bin/curl\""),
            sound.replace(
                "ENTRYPOINT [\"/usr/local/bin/demo\"]",
                "ENTRYPOINT [\"/bin/nope\"]",
            ),
            sound.replace(
                "COPY --from=build /src/target/release/examples/up /usr/local/bin/up\n",
                "",
            ),
        ];
        for dockerfile in &broken {
            assert!(!run(dockerfile).is_empty(), "not flagged:\n{dockerfile}");
        }
    }

    /// A chapter file the summary does not list is flagged; a listed one
    /// (with or without an anchor) is not.
    #[test]
    fn a_chapter_missing_from_the_summary_is_flagged() {
        let tree = TempTree::new(&[
            (
                "docs/src/SUMMARY.md",
                "# Summary\n\n- [A](guide/a.md)\n- [B](guide/b.md#top)\n",
            ),
            ("docs/src/guide/a.md", "# A\n"),
            ("docs/src/guide/b.md", "# B\n"),
            ("docs/src/guide/c.md", "# C\n"),
        ]);
        let found = unlisted_chapters(&tree.0, &walk(&tree.0));
        let files: Vec<&str> = found.iter().map(|v| v.file.as_str()).collect();
        assert_eq!(files, ["docs/src/guide/c.md"], "{found:?}");
    }

    fn fake_repo(extra: &[(&str, &str)]) -> TempTree {
        let mut files = vec![
            ("Cargo.toml", "[package]\nname = \"demo\"\n"),
            ("src/lib.rs", "//! Demo.\n"),
            ("src/store/mod.rs", "//! Store.\n"),
            (
                "docs/guide.md",
                "# Guide\n\n## The store\n\n## Setup\n\n## Setup\n",
            ),
        ];
        files.extend_from_slice(extra);
        TempTree::new(&files)
    }

    fn lines(text: &str) -> Vec<(usize, String)> {
        text.lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.to_owned()))
            .collect()
    }

    #[test]
    fn dead_path_in_markdown_is_flagged() {
        let t = fake_repo(&[(
            "README.md",
            "See src/store/mod.rs and `src/store/gone.rs`, and docs/guide.md.\n```\ncat docs/missing.md\n```\n",
        )]);
        let found = check_dead_paths(&t.0, &walk(&t.0));
        let shown: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(found.len(), 2, "{shown:#?}");
        assert!(
            shown[0].starts_with("README.md:1: cites `src/store/gone.rs`"),
            "{shown:#?}"
        );
        assert!(
            shown[1].starts_with("README.md:3: cites `docs/missing.md`"),
            "{shown:#?}"
        );
    }

    #[test]
    fn dead_path_in_source_comment_is_flagged() {
        let src = "//! Uses src/store/mod.rs.\nfn f() {\n    // see src/old.rs: gone\n    let s = \"src/not_a_comment.rs\";\n}\n/* and docs/nope.md */\n";
        let t = fake_repo(&[
            ("src/app.rs", src),
            (
                "Dockerfile",
                "FROM x\n# copies src/missing/\nRUN echo '# src/quoted.rs'\n",
            ),
        ]);
        let found = check_dead_paths(&t.0, &walk(&t.0));
        let shown: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(shown.len(), 3, "{shown:#?}");
        assert!(
            shown[0].starts_with("Dockerfile:2: cites `src/missing/`"),
            "{shown:#?}"
        );
        assert!(
            shown[1].starts_with("src/app.rs:3: cites `src/old.rs`"),
            "{shown:#?}"
        );
        assert!(
            shown[2].starts_with("src/app.rs:6: cites `docs/nope.md`"),
            "{shown:#?}"
        );
    }

    #[test]
    fn path_tokens_skip_urls_placeholders_and_output() {
        let t = fake_repo(&[]);
        let shape = PathShape::of(&t.0);
        let line = "https://x.io/src/a.rs ../src/b.rs src/<name>.rs src/… src/{a,b}.rs $X/src/c target/debug \
                    (src/store/mod.rs:12), **src/lib.rs**, docs/*.md docs/guide.md#setup Cargo.toml. CONTRIBUTING.md";
        assert_eq!(
            path_tokens(line, &shape),
            [
                "src/store/mod.rs",
                "src/lib.rs",
                "docs/*.md",
                "docs/guide.md",
                "Cargo.toml",
                "CONTRIBUTING.md"
            ]
        );
        assert!(path_exists(&t.0, "docs/*.md"));
        assert!(path_exists(&t.0, "src/**/mod.rs"));
        assert!(!path_exists(&t.0, "docs/*.txt"));
        assert!(
            !path_exists(&t.0, "src/lib.rs/"),
            "a trailing / asks for a directory"
        );
        assert!(!path_exists(&t.0, "CONTRIBUTING.md"));
    }

    #[test]
    fn dead_anchor_and_missing_file_are_flagged() {
        let md = "# Top\n[ok](guide.md#the-store) [dup](guide.md#setup-1) [self](#top)\n\
                  [bad anchor](guide.md#the-stores) [gone](gone.md) [up](../src/lib.rs) [web](https://x.io/a.md)\n\
                  ```\n[in code](nowhere.md)\n```\n`[span](nowhere.md)` [ref]: missing/ref.md\n\n[ref2]: ../README.md#nope\n";
        let t = fake_repo(&[("docs/index.md", md), ("README.md", "# Read me\n")]);
        let found = check_links(&t.0, &walk(&t.0));
        let shown: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(shown.len(), 3, "{shown:#?}");
        assert!(
            shown[0].starts_with("docs/index.md:3: link `guide.md#the-stores`: no heading"),
            "{shown:#?}"
        );
        assert!(
            shown[1].starts_with("docs/index.md:3: link `gone.md`: `docs/gone.md` does not exist"),
            "{shown:#?}"
        );
        assert!(
            shown[2].starts_with("docs/index.md:9: link `../README.md#nope`: no heading"),
            "{shown:#?}"
        );
    }

    #[test]
    fn slugs_follow_github() {
        assert_eq!(slug("2. Request pipeline"), "2-request-pipeline");
        assert_eq!(slug("The `front` store — why?"), "the-front-store--why");
        assert_eq!(slug("[Links](x.md) and max_body"), "links-and-max_body");
        let anchors = md_anchors(
            "# A\n## A\n## A\n### Custom {#mine}\n<a id=\"raw\"></a>\n```\n# not a heading\n```\n",
        );
        let want: BTreeSet<String> = ["a", "a-1", "a-2", "mine", "raw"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(anchors, want);
    }

    #[test]
    fn internal_section_cites_are_flagged() {
        assert_eq!(
            section_cites(None, "the record states (§3)"),
            ["`§3` cites an internal section number"]
        );
        assert_eq!(
            section_cites(None, "see docs/DESIGN.md §2 step 5"),
            ["`DESIGN.md §2` cites a section number"]
        );
        assert_eq!(
            section_cites(None, "`docs/DESIGN.md`, section 4"),
            ["`DESIGN.md section 4` cites a section number"]
        );
        assert_eq!(
            section_cites(Some("//! waiting, docs/DESIGN.md"), "//! §11), woken"),
            ["`DESIGN.md §11` cites a section number"]
        );
        assert!(section_cites(None, "RFC 9113 §8.2.2 and §5").is_empty());
        assert!(section_cites(None, "the IETF draft §2.5").is_empty());
        assert!(section_cites(None, "RFC 8941 §4.2.5: DQUOTE").is_empty());
        assert!(section_cites(Some("malformed (RFC 9113"), "§8.2.2): reset").is_empty());
        assert!(section_cites(None, "§ alone, docs/DESIGN.md").is_empty());
        assert_eq!(
            section_cites(Some("RFC 9113 is wrapped"), "in §2 here").len(),
            1
        );
        let found = section_cites_in("src/a.rs", &lines("ok\n// (§11)\n"));
        assert_eq!(found.len(), 1);
        assert!(
            found[0].to_string().starts_with(
                "src/a.rs:2: `§11` cites an internal section number: cite the chapter"
            )
        );
    }

    #[test]
    fn file_over_600_non_test_lines_is_flagged() {
        let long = "// filler\n".repeat(601);
        let found = sizes_of("src/big.rs", &long);
        assert_eq!(found.len(), 1);
        assert!(
            found[0]
                .to_string()
                .starts_with("src/big.rs: 601 lines of non-test code (limit 600)")
        );
        assert!(sizes_of("src/ok.rs", &"// filler\n".repeat(600)).is_empty());
    }

    #[test]
    fn trailing_test_module_is_not_counted() {
        let tests = format!(
            "#[cfg(test)]\nmod tests {{\n{}}}\n",
            "    // test\n".repeat(197)
        );
        let src = format!("{}{tests}", "// code\n".repeat(500));
        assert_eq!(src.lines().count(), 700);
        assert_eq!(non_test_lines(&lex_rust(&src).code), 500);
        assert!(sizes_of("src/mixed.rs", &src).is_empty());
        // A test module in the middle of the file counts: it is not trailing.
        let middle = format!("{tests}{}", "type A = u8;\n".repeat(500));
        assert_eq!(non_test_lines(&lex_rust(&middle).code), 700);
        // Two trailing modules, an external one last.
        let two = format!("fn a() {{}}\n{tests}\n#[cfg(test)]\nmod more;\n");
        assert_eq!(non_test_lines(&lex_rust(&two).code), 1);
    }

    fn fn_of(lines: usize, body_line: &str) -> String {
        format!(
            "    pub(crate) async fn long() {{\n{}    }}\n",
            format!("        {body_line}\n").repeat(lines - 2)
        )
    }

    #[test]
    fn fn_over_100_lines_is_flagged_and_100_passes() {
        let src = format!("impl X {{\n{}}}\n", fn_of(101, "let x = 1;"));
        let found = sizes_of("src/f.rs", &src);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            found[0].to_string(),
            "src/f.rs:2: fn `long` spans 101 lines (limit 100): split it into named steps"
        );
        assert!(
            sizes_of(
                "src/f.rs",
                &format!("impl X {{\n{}}}\n", fn_of(100, "let x = 1;"))
            )
            .is_empty()
        );
    }

    #[test]
    fn braces_in_literals_and_comments_are_ignored() {
        let src = r##"fn tricky<'a>(x: &'a str) -> usize {
    let a = "}";
    let b = '{';
    let c = r#"} "{" }"#;
    let d = b'}';
    let e = '\u{7b}';
    // }
    /* { /* } */ } */
    let f: fn(u8) -> u8 = |v| v;
    x.len()
}
trait T {
    fn declared(&self) -> u8;
    const fn inner() -> [u8; 2] {
        fn nested() {}
        [0; 2]
    }
}
"##;
        let spans = fn_spans(&lex_rust(src).code, usize::MAX);
        let got: Vec<(&str, usize, usize)> = spans
            .iter()
            .map(|f| (f.name.as_str(), f.line, f.lines))
            .collect();
        assert_eq!(
            got,
            [("tricky", 1, 11), ("inner", 14, 4), ("nested", 15, 1)]
        );
        let comments: Vec<usize> = lex_rust(src).comments.iter().map(|(n, _)| *n).collect();
        assert_eq!(comments, [7, 8]);
    }

    /// The fabricated crates' crate: `src/`, named `demo`.
    fn demo() -> Crate {
        Crate {
            src: "src".to_owned(),
            name: "demo".to_owned(),
        }
    }

    fn sources_of(files: &[(&str, &str)]) -> Vec<(String, String)> {
        files
            .iter()
            .map(|(f, t)| ((*f).to_owned(), (*t).to_owned()))
            .collect()
    }

    fn graph_of(files: &[(&str, &str)]) -> Vec<Violation> {
        cycle_violations(&sources_of(files), &demo())
    }

    #[test]
    fn two_file_cycle_is_found() {
        let found = graph_of(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
            (
                "src/b.rs",
                "pub struct B;\nfn f() -> crate::a::A { crate::a::A }\n",
            ),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        let message = found[0].to_string();
        assert!(
            message.starts_with("src/a.rs: import cycle among 2 files: src/a.rs, src/b.rs"),
            "{message}"
        );
        assert!(
            message.contains("src/a.rs → src/b.rs   (src/a.rs:1: use crate::b::B;)"),
            "{message}"
        );
        assert!(
            message.contains("src/b.rs → src/a.rs   (src/b.rs:2: fn f()"),
            "{message}"
        );
    }

    #[test]
    fn one_way_edges_and_reexports_are_no_cycle() {
        let one_way = graph_of(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "use crate::b::B;\n"),
            (
                "src/b.rs",
                "pub struct B;\n#[cfg(test)]\nmod tests {\n    use crate::a::*;\n}\n",
            ),
        ]);
        assert!(one_way.is_empty(), "{one_way:?}");
        // The facade re-exports its child's item; the child uses a sibling of
        // the facade, which reaches the item through the facade: no cycle.
        let facade = graph_of(&[
            (
                "src/lib.rs",
                "pub mod store;\npub mod app;\npub use store::Store;\n",
            ),
            (
                "src/store/mod.rs",
                "mod memory;\npub use memory::Memory;\npub(crate) use self::memory::{helper as h};\n",
            ),
            (
                "src/store/memory.rs",
                "use crate::app::App;\npub struct Memory;\npub fn helper() {}\n",
            ),
            ("src/app.rs", "use crate::store::Memory;\npub struct App;\n"),
        ]);
        assert_eq!(
            facade.len(),
            1,
            "memory → app → memory (through the facade) is a cycle: {facade:?}"
        );
        assert!(
            facade[0]
                .to_string()
                .contains("src/app.rs, src/store/memory.rs"),
            "{facade:?}"
        );
        let no_cycle = graph_of(&[
            (
                "src/lib.rs",
                "pub mod store;\npub mod app;\npub use store::Memory as Store;\n",
            ),
            (
                "src/store/mod.rs",
                "mod memory;\npub use memory::Memory;\nuse crate::app::App;\n",
            ),
            ("src/store/memory.rs", "pub struct Memory;\n"),
            (
                "src/app.rs",
                "use crate::Store;\nuse super::store::Memory;\n",
            ),
        ]);
        assert!(no_cycle.is_empty(), "{no_cycle:?}");
    }

    #[test]
    fn uses_of_ancestors_are_no_cycle() {
        // The parent uses its child's item; the child adds an `impl` to the
        // parent's type and uses the grandparent through a `crate::` path
        // and through the root's re-export of the parent's item.
        let found = graph_of(&[
            (
                "src/lib.rs",
                "pub mod store;\npub use store::X;\npub struct Root;\n",
            ),
            (
                "src/store/mod.rs",
                "mod memory;\nuse memory::Y;\npub struct X;\nfn f(_: Y) {}\n",
            ),
            (
                "src/store/memory.rs",
                "use super::X;\nuse crate::Root;\npub struct Y;\nimpl X { fn g(_: crate::X, _: Root) {} }\n",
            ),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn sibling_cousin_and_cross_tree_cycles_are_found() {
        // a/b.rs ↔ c.rs: a child and its parent's sibling.
        let cousins = graph_of(&[
            ("src/lib.rs", "mod a;\nmod c;\n"),
            ("src/a/mod.rs", "mod b;\n"),
            ("src/a/b.rs", "use crate::c::C;\npub struct B;\n"),
            ("src/c.rs", "use crate::a::b::B;\npub struct C;\n"),
        ]);
        assert_eq!(cousins.len(), 1, "{cousins:?}");
        let message = cousins[0].to_string();
        assert!(
            message.starts_with("src/a/b.rs: import cycle among 2 files: src/a/b.rs, src/c.rs"),
            "{message}"
        );
        assert!(message.contains("move the shared item into a common ancestor module"));
        // store/mod.rs ↔ waiters.rs: a module's file and a top-level file.
        let across = graph_of(&[
            ("src/lib.rs", "mod store;\nmod waiters;\n"),
            (
                "src/store/mod.rs",
                "use crate::waiters::Waiters;\npub struct RecordKey;\n",
            ),
            (
                "src/waiters.rs",
                "use crate::store::RecordKey;\npub struct Waiters;\n",
            ),
        ]);
        assert_eq!(across.len(), 1, "{across:?}");
        assert!(
            across[0]
                .to_string()
                .contains("src/store/mod.rs, src/waiters.rs"),
            "{across:?}"
        );
        // Re-exports are followed before the ancestor rule applies: b.rs's
        // `crate::C` and `super::C` name c.rs (through the root's `pub use`
        // and a/mod.rs's private `use`), not an ancestor; c.rs reaches b.rs
        // through a/mod.rs's `pub use`.
        let through = graph_of(&[
            ("src/lib.rs", "mod a;\nmod c;\npub use c::C;\n"),
            ("src/a/mod.rs", "mod b;\npub use b::B;\nuse crate::c::C;\n"),
            ("src/a/b.rs", "use super::C;\npub struct B;\n"),
            ("src/c.rs", "pub struct C;\nfn f(_: crate::a::B) {}\n"),
        ]);
        assert_eq!(through.len(), 1, "{through:?}");
        assert!(
            through[0].to_string().contains("src/a/b.rs → src/c.rs"),
            "{through:?}"
        );
        let through_root = graph_of(&[
            ("src/lib.rs", "mod a;\nmod c;\npub use c::C;\n"),
            ("src/a/mod.rs", "mod b;\npub use b::B;\n"),
            ("src/a/b.rs", "fn f(_: crate::C) {}\npub struct B;\n"),
            ("src/c.rs", "pub struct C;\nfn f(_: crate::a::B) {}\n"),
        ]);
        assert_eq!(through_root.len(), 1, "{through_root:?}");
    }

    fn modules_of(files: &[(&str, &str)]) -> Vec<Violation> {
        module_cycle_violations(&sources_of(files), &demo())
    }

    /// The one finding of the module check on `files`, which must name
    /// `cycle` (`a → b → a`); its whole text.
    fn one_module_cycle(files: &[(&str, &str)], cycle: &str) -> String {
        let found = modules_of(files);
        assert_eq!(found.len(), 1, "{found:#?}");
        let message = found[0].to_string();
        assert!(
            message.contains(&format!("of src/: {cycle}; they must form a DAG")),
            "{message}"
        );
        message
    }

    /// `file:line` of each site of the module edge `from → to`.
    fn sites(files: &[(&str, &str)], from: &str, to: &str) -> Vec<String> {
        let sources = sources_of(files);
        let texts: BTreeMap<String, String> = sources.iter().cloned().collect();
        let edges = ModuleGraph::build(&sources, &demo()).module_edges(&texts);
        let key = (from.to_owned(), to.to_owned());
        edges
            .get(&key)
            .into_iter()
            .flatten()
            .map(|(file, line, _)| format!("{file}:{line}"))
            .collect()
    }

    /// A cycle of three top-level modules through `crate::` paths, each
    /// edge in another file, none a cycle between two files: the file
    /// check passes it, the module check names it with one site per edge.
    #[test]
    fn crate_path_module_cycle_is_flagged() {
        let files = [
            (
                "src/lib.rs",
                "pub mod config;\npub mod request;\npub mod store;\n",
            ),
            ("src/store/mod.rs", "mod keys;\npub struct Key;\n"),
            ("src/store/keys.rs", "use crate::config::Limits;\n"),
            ("src/config/mod.rs", "mod load;\npub use load::Limits;\n"),
            (
                "src/config/load.rs",
                "pub struct Limits;\nfn f(_: crate::request::Req) {}\n",
            ),
            (
                "src/request.rs",
                "pub struct Req;\nuse crate::store::Key;\n",
            ),
        ];
        assert!(graph_of(&files).is_empty(), "{:?}", graph_of(&files));
        let message = one_module_cycle(&files, "config → request → store → config");
        assert!(
            message.starts_with("src/config/load.rs:2: cycle between"),
            "{message}"
        );
        for edge in [
            "config → request   (src/config/load.rs:2: fn f(_: crate::request::Req) {})",
            "request → store   (src/request.rs:2: use crate::store::Key;)",
            "store → config   (src/store/keys.rs:1: use crate::config::Limits;)",
        ] {
            assert!(
                message.contains(&format!("\n    {edge}")),
                "{edge} in {message}"
            );
        }
    }

    /// `super::` paths from a file two modules down, in a `use` and inline.
    #[test]
    fn super_path_module_cycle_is_flagged() {
        let files = [
            ("src/lib.rs", "mod config;\nmod store;\n"),
            ("src/store/mod.rs", "mod memory;\npub struct Key;\n"),
            ("src/store/memory/mod.rs", "mod shard;\n"),
            (
                "src/store/memory/shard.rs",
                "use super::super::super::config::Limits;\nfn f() -> super::super::super::config::Tag { todo!() }\n",
            ),
            (
                "src/config.rs",
                "pub struct Limits;\npub struct Tag;\nfn f(_: crate::store::Key) {}\n",
            ),
        ];
        one_module_cycle(&files, "config → store → config");
        let want = ["src/store/memory/shard.rs:1", "src/store/memory/shard.rs:2"];
        assert_eq!(sites(&files, "store", "config"), want);
    }

    /// A child module named bare (`mod redis;` then `redis::…`), in a `use`
    /// and inline, reaching another module through the child's re-export.
    #[test]
    fn bare_child_module_paths_are_followed() {
        let files = [
            ("src/lib.rs", "mod config;\nmod store;\n"),
            (
                "src/store/mod.rs",
                "mod redis;\nuse redis::Conn;\nfn f() { redis::connect(); }\npub struct Key;\n",
            ),
            (
                "src/store/redis.rs",
                "pub use crate::config::{Conn, connect};\n",
            ),
            (
                "src/config.rs",
                "pub struct Conn;\npub fn connect() {}\nfn f(_: crate::store::Key) {}\n",
            ),
        ];
        one_module_cycle(&files, "config → store → config");
        let want = [
            "src/store/mod.rs:2",
            "src/store/mod.rs:3",
            "src/store/redis.rs:1",
        ];
        assert_eq!(sites(&files, "store", "config"), want);
        // The inline path alone (the file check's control is
        // `bare_child_module_paths_are_file_edges`).
        let inline = [
            files[0],
            (
                "src/store/mod.rs",
                "mod redis;\nfn f() { redis::connect(); }\npub struct Key;\n",
            ),
            files[2],
            files[3],
        ];
        one_module_cycle(&inline, "config → store → config");
        let want = ["src/store/mod.rs:2", "src/store/redis.rs:1"];
        assert_eq!(sites(&inline, "store", "config"), want);
    }

    /// A bare name that is no child module of the file (an extern crate,
    /// here named like a top-level module) is no edge.
    #[test]
    fn bare_extern_crate_name_is_no_module_edge() {
        let files = [
            ("src/lib.rs", "mod redis;\nmod store;\n"),
            ("src/redis.rs", "use crate::store::Key;\n"),
            (
                "src/store/mod.rs",
                "mod cache;\nuse redis::Client;\npub struct Key;\nfn f() { redis::connect(); }\n",
            ),
            (
                "src/store/cache.rs",
                "use ::redis::Pool;\nfn f() { redis::pool(); }\n",
            ),
        ];
        assert!(modules_of(&files).is_empty(), "{:?}", modules_of(&files));
        assert!(sites(&files, "store", "redis").is_empty());
    }

    /// `self::` paths: the root's `pub use self::…` facade, named through
    /// `crate::`, and a module's own `self::child` (no edge of its own).
    #[test]
    fn self_path_module_cycle_is_flagged() {
        let files = [
            (
                "src/lib.rs",
                "mod config;\nmod store;\npub use self::config::Limits;\n",
            ),
            (
                "src/store/mod.rs",
                "mod shard;\nuse self::shard::Shard;\npub struct Key;\n",
            ),
            (
                "src/store/shard.rs",
                "pub struct Shard;\nfn f(_: crate::Limits) {}\n",
            ),
            (
                "src/config.rs",
                "pub struct Limits;\nfn f(_: crate::store::Key) {}\n",
            ),
        ];
        one_module_cycle(&files, "config → store → config");
        assert_eq!(sites(&files, "store", "config"), ["src/store/shard.rs:2"]);
    }

    /// A grouped `use crate::{…}`, the cycle closed by a nested group.
    #[test]
    fn grouped_use_module_cycle_is_flagged() {
        let files = [
            ("src/lib.rs", "mod config;\nmod request;\nmod store;\n"),
            (
                "src/store.rs",
                "use crate::{\n    config::Limits,\n    request::{Req, body::{self, Body}},\n};\npub struct Key;\n",
            ),
            ("src/config.rs", "pub struct Limits;\n"),
            (
                "src/request/mod.rs",
                "pub mod body;\npub struct Req;\nuse crate::store::Key;\n",
            ),
            ("src/request/body.rs", "pub struct Body;\n"),
        ];
        one_module_cycle(&files, "request → store → request");
        assert_eq!(sites(&files, "store", "config"), ["src/store.rs:1"]);
    }

    /// A `pub use` re-export of another module's item is an edge of the
    /// re-exporting module; a path to the root's `pub use` facade is an
    /// edge to the module it re-exports (a root item of its own is none).
    #[test]
    fn pub_use_reexports_are_module_edges() {
        let facade = [
            ("src/lib.rs", "mod config;\nmod request;\n"),
            (
                "src/config/mod.rs",
                "pub use crate::request::Header;\npub struct Limits;\n",
            ),
            (
                "src/request.rs",
                "pub struct Header;\nfn f(_: crate::config::Limits) {}\n",
            ),
        ];
        let message = one_module_cycle(&facade, "config → request → config");
        assert!(
            message.contains(
                "config → request   (src/config/mod.rs:1: pub use crate::request::Header;)"
            ),
            "{message}"
        );
        let root = [
            (
                "src/lib.rs",
                "mod request;\nmod store;\npub use request::Req;\npub struct Root;\n",
            ),
            (
                "src/store.rs",
                "pub struct Key;\nfn f(_: crate::Req, _: crate::Root) {}\n",
            ),
            (
                "src/request.rs",
                "pub struct Req;\nuse crate::store::Key;\n",
            ),
        ];
        one_module_cycle(&root, "request → store → request");
    }

    /// Every path form at once, all pointing one way (request → config →
    /// store, request → store), with root items, root re-exports, an extern
    /// crate named bare, and a test module using a higher module: no cycle.
    #[test]
    fn acyclic_modules_pass() {
        let files = [
            (
                "src/lib.rs",
                "pub mod config;\npub mod request;\npub mod store;\npub use store::Key;\npub use self::config::Limits;\npub struct Root;\n",
            ),
            (
                "src/store/mod.rs",
                "mod redis;\nuse redis::Conn;\npub struct Key;\nfn f(_: crate::Root) { redis::connect(); self::redis::connect(); }\n#[cfg(test)]\nmod tests {\n    use crate::request::Req;\n}\n",
            ),
            (
                "src/store/redis.rs",
                "pub struct Conn;\npub fn connect() {}\nuse super::Key;\nuse ::redis::Client;\n",
            ),
            (
                "src/config/mod.rs",
                "mod load;\npub use load::Limits;\nuse crate::{Key, store::{self}};\n",
            ),
            (
                "src/config/load.rs",
                "pub struct Limits;\nfn f(_: super::super::store::Key) {}\n",
            ),
            (
                "src/request.rs",
                "use crate::{config::Limits, Key};\npub struct Req;\nfn f(_: crate::Limits, _: crate::Root) {}\n",
            ),
        ];
        assert!(modules_of(&files).is_empty(), "{:?}", modules_of(&files));
        assert!(graph_of(&files).is_empty(), "{:?}", graph_of(&files));
        let sources = sources_of(&files);
        let texts: BTreeMap<String, String> = sources.iter().cloned().collect();
        let edges = ModuleGraph::build(&sources, &demo()).module_edges(&texts);
        let pairs: Vec<String> = edges.keys().map(|(a, b)| format!("{a} → {b}")).collect();
        assert_eq!(
            pairs,
            ["config → store", "request → config", "request → store"]
        );
    }

    /// The workspace: `src/` and each `crates/*/src/` is a crate of its own
    /// (a `lib.rs` or `main.rs` root, named by its manifest or directory);
    /// the module, file and size checks cover each, and a path into another
    /// crate of the workspace is no edge.
    #[test]
    fn every_crate_of_the_workspace_is_checked() {
        let big = "// filler\n".repeat(601);
        let tree = TempTree::new(&[
            (
                "Cargo.toml",
                "[workspace]\nmembers = [\"crates/*\"]\n\n[package]\nname = \"demo\"\n",
            ),
            ("src/lib.rs", "pub mod a;\npub mod b;\n"),
            ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
            ("src/b.rs", "pub struct B;\n"),
            (
                "crates/core/Cargo.toml",
                "[package]\nname = \"demo-core\"\n",
            ),
            (
                "crates/core/src/lib.rs",
                "pub mod config;\npub mod store;\n",
            ),
            (
                "crates/core/src/config.rs",
                "pub struct Limits;\nuse crate::store::Key;\n",
            ),
            (
                "crates/core/src/store.rs",
                "pub struct Key;\nfn f(_: crate::config::Limits) {}\n",
            ),
            (
                "crates/cli/src/main.rs",
                "mod args;\nmod run;\nfn main() {}\n",
            ),
            (
                "crates/cli/src/args.rs",
                "use crate::run::Run;\npub struct Args;\n",
            ),
            ("crates/cli/src/run/mod.rs", "mod step;\npub struct Run;\n"),
            (
                "crates/cli/src/run/step.rs",
                "fn f(_: crate::args::Args) {}\n",
            ),
            (
                "crates/store/Cargo.toml",
                "[package]\nname = \"demo-store\"\n",
            ),
            (
                "crates/store/src/lib.rs",
                "pub mod big;\npub mod config;\npub mod store;\n",
            ),
            ("crates/store/src/big.rs", &big),
            (
                "crates/store/src/config.rs",
                "use demo_core::store::Key;\nuse idemgate_store::store::Key as K;\nuse crate::store::Backend;\n",
            ),
            (
                "crates/store/src/store.rs",
                "pub struct Backend;\nfn f(_: demo_core::config::Limits, _: demo::a::A) {}\n",
            ),
        ]);
        let files = walk(&tree.0);
        let names: Vec<(String, String)> = crates(&tree.0, &files)
            .into_iter()
            .map(|c| (c.src, c.name))
            .collect();
        let want = [
            ("src", "demo"),
            ("crates/cli/src", "cli"),
            ("crates/core/src", "demo_core"),
            ("crates/store/src", "demo_store"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(s, n)| ((*s).to_owned(), (*n).to_owned()))
            .collect();
        assert_eq!(names, want);
        let modules: Vec<String> = check_module_cycles(&tree.0, &files)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(modules.len(), 2, "{modules:#?}");
        assert!(modules[0].starts_with("crates/cli/src/args.rs:1: cycle between the top-level modules of crates/cli/src/: args → run → args;"), "{modules:#?}");
        assert!(
            modules[1].contains("of crates/core/src/: config → store → config;"),
            "{modules:#?}"
        );
        let file_cycles = check_cycles(&tree.0, &files);
        assert_eq!(file_cycles.len(), 1, "{file_cycles:#?}");
        assert!(
            file_cycles[0]
                .to_string()
                .starts_with("crates/core/src/config.rs: import cycle among 2 files")
        );
        let sizes = check_sizes(&tree.0, &files);
        assert_eq!(sizes.len(), 1, "{sizes:#?}");
        assert!(
            sizes[0]
                .to_string()
                .starts_with("crates/store/src/big.rs: 601 lines")
        );
        // Without crates/, the root package alone.
        let single = fake_repo(&[]);
        let files = walk(&single.0);
        assert_eq!(crates(&single.0, &files).len(), 1);
        assert!(check_module_cycles(&single.0, &files).is_empty());
    }

    /// A child module named bare (`mod redis;`, then `redis::connect()`
    /// inline) is read as a path into it, here on to what it re-exports; a
    /// bare name that is no child module of the file (an extern crate) is not.
    #[test]
    fn bare_child_module_paths_are_file_edges() {
        let child = graph_of(&[
            ("src/lib.rs", "mod config;\nmod store;\n"),
            (
                "src/store/mod.rs",
                "mod redis;\nfn f() { redis::connect(); }\npub struct Key;\n",
            ),
            ("src/store/redis.rs", "pub use crate::config::connect;\n"),
            (
                "src/config.rs",
                "pub fn connect() {}\nfn f(_: crate::store::Key) {}\n",
            ),
        ]);
        assert_eq!(child.len(), 1, "{child:?}");
        let edge =
            "src/store/mod.rs → src/config.rs   (src/store/mod.rs:2: fn f() { redis::connect(); })";
        assert!(child[0].to_string().contains(edge), "{child:?}");
        let extern_crate = graph_of(&[
            ("src/lib.rs", "mod redis;\nmod store;\n"),
            ("src/redis.rs", "use crate::store::Key;\n"),
            (
                "src/store/mod.rs",
                "use redis::Client;\npub struct Key;\nfn f() { redis::connect(); }\n",
            ),
        ]);
        assert!(extern_crate.is_empty(), "{extern_crate:?}");
    }

    #[test]
    fn use_trees_expand() {
        let got = expand_use_tree("crate::{a::B, c::{self, D as E}, f::*}");
        let want = [
            (vec!["crate", "a", "B"], "B"),
            (vec!["crate", "c"], "c"),
            (vec!["crate", "c", "D"], "E"),
            (vec!["crate", "f", "*"], "*"),
        ];
        let want: Vec<(Vec<String>, String)> = want
            .iter()
            .map(|(p, n)| (p.iter().map(|s| (*s).to_owned()).collect(), (*n).to_owned()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn an_impure_core_dependency_is_flagged() {
        let manifest = "[package]\nname = \"idemgate-core\"\n\n[dependencies]\nserde = \"1\"\ntokio = { version = \"1\" }\n\n[target.'cfg(unix)'.dependencies]\nhttp = \"1\"\n\n[dev-dependencies]\ntokio = \"1\"\n";
        let found = impure_dependencies("crates/core/Cargo.toml", manifest);
        let lines: Vec<usize> = found.iter().map(|v| v.line).collect();
        // tokio in [dependencies] and http in a target's; the test-only
        // tokio is no dependency of the core's code.
        assert_eq!(lines, vec![6, 9], "{found:?}");
        let pure = "[dependencies]\nserde = { version = \"1\", features = [\"derive\"] }\nsha2 = \"0.10\"\n";
        assert!(impure_dependencies("crates/core/Cargo.toml", pure).is_empty());
    }
}
