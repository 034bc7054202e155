//! Rebuild when a migration changes: `sqlx::migrate!` embeds the files
//! (they live at the repository's top, `migrations/`).
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
