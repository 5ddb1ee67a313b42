#![no_main]
//! `madtool pcap` (`acm_madtool::pcap`) on arbitrary bytes as pcap files: the first input byte
//! picks the mode (bit 0: `--brief`; bit 1: two files merged by time, the rest split at the
//! position bytes 1–2 give), the rest is the file contents.
//!
//! * never a panic, in `parse_pcap`, `ib_frame`, `parse_ib`, `describe`, `brief` or `render`
//!   (the command's own path after reading the files);
//! * no allocation beyond the input: record headers and captured bytes add up to exactly the
//!   file (a length field of 4 GB is an error, not a 4 GB buffer), a payload is at most its
//!   frame;
//! * `--brief` prints one line per record, and both modes print every record `parse_pcap`
//!   returned, numbered 1..n.
use acm_madtool::pcap::{brief, describe, ib_frame, parse_ib, parse_pcap, render};
use libfuzzer_sys::fuzz_target;

fn file(b: &[u8]) -> usize {
    let Ok(recs) = parse_pcap(b) else {
        return 0;
    };
    // Every byte after the global header is a record header or captured bytes, once.
    let total: usize = recs.iter().map(|r| 16 + r.data.len()).sum();
    assert_eq!(24 + total, b.len(), "record bytes vs file size");
    for (i, r) in recs.iter().enumerate() {
        if let Ok(f) = ib_frame(r) {
            assert!(f.len() <= r.data.len());
            if let Ok(p) = parse_ib(f) {
                assert!(p.payload.len() <= f.len());
            }
        }
        let line = brief(i + 1, r);
        assert!(!line.contains('\n'), "{line:?}");
        let mut out = String::new();
        describe(i + 1, r, &mut out);
        assert!(out.starts_with(&format!("Packet {}: ", i + 1)) && out.ends_with('\n'));
    }
    recs.len()
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let brief_mode = mode & 1 != 0;
    let files: Vec<&[u8]> = if mode & 2 != 0 && rest.len() >= 2 {
        let at = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
        let rest = &rest[2..];
        let (a, b) = rest.split_at(at.min(rest.len()));
        vec![a, b]
    } else {
        vec![rest]
    };
    let n: usize = files.iter().map(|f| file(f)).sum();
    let named: Vec<(&str, &[u8])> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (["a.pcap", "b.pcap"][i], *f))
        .collect();
    match render(&named, brief_mode) {
        Ok(out) => {
            if brief_mode {
                assert_eq!(out.lines().count(), n, "{out}");
            } else {
                assert_eq!(out.matches("\nPacket ").count() + usize::from(n > 0), n);
            }
        }
        Err(e) => assert!(
            e.starts_with("a.pcap: ") || e.starts_with("b.pcap: "),
            "{e}"
        ),
    }
});
