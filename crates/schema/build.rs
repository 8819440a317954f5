// New migration folders must rebuild the crate that embeds them. The path
// is the crate's own `migrations` link, which a packaged crate holds too.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
