#![no_main]
//! The `acmrs-stat` socket report decoder (`acm_dataplane::export::decode`) on arbitrary text
//! (input bytes as UTF-8, invalid sequences replaced): never a panic; what decodes encodes
//! (`export::encode`) to text that decodes to the same report, and that text is a fixed point
//! of encode∘decode; the Prometheus rendering of a decoded report (any counts, any sums) does
//! not panic either.
use acm_dataplane::export::{decode, encode, render_prometheus, MAGIC};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(r) = decode(&text) else {
        return;
    };
    assert!(text.starts_with(MAGIC));
    let enc = encode(&r);
    let back = decode(&enc).unwrap_or_else(|e| panic!("encode's own text refused: {e}\n{enc}"));
    assert_eq!(back, r, "\n{enc}");
    assert_eq!(encode(&back), enc);
    let prom = render_prometheus(&r);
    assert!(prom.ends_with('\n'));
});
