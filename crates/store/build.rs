//! Rebuilds the store when a migration is added or changed.

// The migrations are embedded at compile time; a new file there must rebuild
// the crate, which include_str! alone does not notice. Both directories:
// each store's known schema version is its newest embedded migration.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations/sqlite");
    println!("cargo:rerun-if-changed=../../migrations/postgres");
}
