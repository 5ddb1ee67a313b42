//! `provider-fake-core` plays the ibacm core in-process (`acm_testkit::core`): `libacmrs.so`
//! finds the core's helpers with `dlsym(RTLD_DEFAULT)`, so that binary exports its symbols.
//! No other binary may: the `provider` binary's measuring child loads the stock
//! `libibacmp.so` next to `host_core.c`'s real helpers (a variadic `acm_write`, the SA service
//! over umad) and the simulated verbs, which exported fakes would shadow.
fn main() {
    println!("cargo:rustc-link-arg-bin=provider-fake-core=-Wl,--export-dynamic");
    println!("cargo:rerun-if-changed=build.rs");
}
