#![no_main]
//! `madtool decode`'s decoders (`acm_madtool::decode`) on arbitrary bytes, as the command runs
//! them: the bytes as a MAD (`madtool decode FILE`), as an ibacm client message
//! (`--client`), and, when they are text, as `--hex` input decoded both ways.
//!
//! Never a panic; a decoded MAD or message is non-empty text of whole lines, an error a
//! non-empty one-line message; `parse_hex` accepts what it produced itself (hex with any of
//! its separators) and gives back the same bytes.
use acm_madtool::decode::{decode_client, decode_mad, parse_hex};
use libfuzzer_sys::fuzz_target;
use std::fmt::Write;

fn check(r: Result<String, String>) {
    match r {
        Ok(text) => {
            assert!(!text.is_empty());
            assert!(text.ends_with('\n'), "{text:?}");
        }
        Err(e) => {
            assert!(!e.is_empty());
            // The binary prints `madtool: {e}`; it may span lines only through USAGE, which
            // the decoders never add.
            assert!(!e.trim_end().contains('\n'), "{e:?}");
        }
    }
}

fn hex(b: &[u8], sep: &str) -> String {
    let mut s = String::with_capacity(b.len() * (2 + sep.len()));
    for (i, x) in b.iter().enumerate() {
        if i > 0 {
            s.push_str(sep);
        }
        let _ = write!(s, "{x:02x}");
    }
    s
}

fuzz_target!(|data: &[u8]| {
    check(decode_mad(data));
    check(decode_client(data));
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(bytes) = parse_hex(s) {
            check(decode_mad(&bytes));
            check(decode_client(&bytes));
        }
    }
    // What `--hex` gets from people: the same bytes with separators (one kind per input;
    // the first 512 bytes are plenty, a MAD is 256).
    let sep = ["", " ", ":", "-", "\n"][data.len() % 5];
    let b = &data[..data.len().min(512)];
    let h = format!("0x{}", hex(b, sep));
    assert_eq!(parse_hex(&h).as_deref(), Ok(b), "{h:?}");
});
