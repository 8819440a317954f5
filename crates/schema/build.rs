// New migration folders must rebuild the crate that embeds them.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
