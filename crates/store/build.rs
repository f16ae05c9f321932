// The migrations are embedded at compile time; a new file there must rebuild
// the crate, which include_str! alone does not notice.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations/sqlite");
}
