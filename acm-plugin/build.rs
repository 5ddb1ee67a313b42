//! Exports the test executable's symbols dynamically, so the library under test finds the
//! fake core helpers (`acm_write`, `acm_alloc_sa_mad`, …) with `dlsym(RTLD_DEFAULT)` exactly as
//! it finds the real ones in `/usr/sbin/ibacm`.
fn main() {
    println!("cargo:rustc-link-arg-tests=-Wl,--export-dynamic");
    println!("cargo:rerun-if-changed=build.rs");
}
