//! The Rust version `Cargo.toml` states (`rust-version`, and the README's
//! "Rust 1.NN or newer") is the true minimum: at least the `rust-version`
//! of every package `Cargo.lock` pins. Only the machine's one toolchain can
//! be installed here, so the minimum is checked from the packages'
//! manifests (`cargo metadata`), not by building with an older compiler.

// A test (support included) may unwrap: a failing unwrap is a failing test.
#![allow(clippy::unwrap_used)]

use std::process::Command;

/// A `rust-version` as comparable numbers (`1.94` is `[1, 94, 0]`).
fn version(text: &str) -> [u64; 3] {
    let mut parts = text.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    [0; 3].map(|_| parts.next().unwrap_or(0))
}

/// The packages whose `rust-version` is above `ours`, with theirs.
fn above<'a>(ours: &str, packages: &'a [(String, String)]) -> Vec<&'a (String, String)> {
    packages
        .iter()
        .filter(|(_, theirs)| version(theirs) > version(ours))
        .collect()
}

/// `(name@version, rust-version)` of every locked package that states one,
/// and the root package's own `rust-version`.
fn locked() -> (String, Vec<(String, String)>) {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--locked", "--format-version", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let root = meta["resolve"]["root"].as_str().unwrap().to_string();
    let mut ours = String::new();
    let mut packages = Vec::new();
    for package in meta["packages"].as_array().unwrap() {
        let Some(rust) = package["rust_version"].as_str() else {
            continue;
        };
        if package["id"] == root.as_str() {
            ours = rust.to_string();
        } else {
            let name = format!("{}@{}", package["name"], package["version"]);
            packages.push((name.replace('"', ""), rust.to_string()));
        }
    }
    (ours, packages)
}

#[test]
fn the_stated_rust_version_covers_every_locked_package() {
    let (ours, packages) = locked();
    assert!(!ours.is_empty(), "Cargo.toml states no rust-version");
    let too_new = above(&ours, &packages);
    assert!(
        too_new.is_empty(),
        "Cargo.toml says rust-version {ours}, but these locked packages need more: {too_new:?}"
    );
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    assert!(
        readme.contains(&format!("Rust {ours} or newer")),
        "README.md does not say \"Rust {ours} or newer\""
    );
}

/// Negative control: a stated version below a package's is flagged.
#[test]
fn a_version_below_a_packages_is_flagged() {
    let packages = vec![
        ("a@1".to_string(), "1.70".to_string()),
        ("sqlx@0.9.0".to_string(), "1.94.0".to_string()),
    ];
    assert_eq!(above("1.88", &packages), vec![&packages[1]]);
    assert!(above("1.94", &packages).is_empty());
    assert!(above("1.94.1", &packages).is_empty());
}
