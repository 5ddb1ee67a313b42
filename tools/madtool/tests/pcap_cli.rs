//! `madtool pcap` as a command: several files merged by time, one file in file order, the
//! non-MAD payload case, and every error path (non-zero exit, message on stderr, no stdout).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(tag: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("madtool-pcap-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

fn madtool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_madtool"))
        .args(args)
        .output()
        .expect("run madtool")
}

/// A UD frame without GRH from `slid` carrying `payload` (length a multiple of 4).
fn frame(slid: u16, payload: &[u8]) -> Vec<u8> {
    assert_eq!(payload.len() % 4, 0);
    let words = ((8 + 12 + 8 + payload.len() + 4) / 4) as u16;
    let mut f = vec![0x00, 0x02, 0x00, 0x06];
    f.extend_from_slice(&words.to_be_bytes());
    f.extend_from_slice(&slid.to_be_bytes());
    f.extend_from_slice(&[0x64, 0, 0xff, 0xff, 0, 0, 0x60, 0x10, 0, 0, 0, 1]);
    f.extend_from_slice(&[0x80, 0x01, 0, 0, 0, 0, 0x50, 0x10]);
    f.extend_from_slice(payload);
    f.extend_from_slice(&[0; 6]);
    f
}

/// A LINKTYPE_USER0 pcap of (seconds, frame) records.
fn write_pcap(path: &Path, recs: &[(u32, Vec<u8>)]) {
    let mut p = Vec::new();
    for v in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 65535, 147] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    for (sec, f) in recs {
        for v in [*sec, 0, f.len() as u32, f.len() as u32] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        p.extend_from_slice(f);
    }
    std::fs::write(path, p).unwrap();
}

fn stdout_ok(args: &[&str]) -> String {
    let o = madtool(args);
    assert!(
        o.status.success(),
        "madtool {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn slids(brief: &str) -> Vec<String> {
    brief
        .lines()
        .map(|l| {
            l.split_whitespace()
                .find_map(|t| t.strip_prefix("slid="))
                .unwrap()
                .to_string()
        })
        .collect()
}

#[test]
fn several_files_merge_by_time_one_file_keeps_its_order() {
    let s = scratch("merge");
    let (a, b) = (s.0.join("a.pcap"), s.0.join("b.pcap"));
    write_pcap(&a, &[(10, frame(1, b"aaaa")), (30, frame(2, b"bbbb"))]);
    write_pcap(&b, &[(20, frame(3, b"cccc")), (5, frame(4, b"dddd"))]);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let merged = stdout_ok(&["pcap", "--brief", a, b]);
    assert_eq!(slids(&merged), ["4", "1", "3", "2"], "{merged}");
    let one = stdout_ok(&["pcap", "--brief", b]);
    assert_eq!(slids(&one), ["3", "4"], "file order: {one}");
    // A payload that is no MAD is shown as hex.
    let full = stdout_ok(&["pcap", a]);
    assert!(full.contains("Packet 2: time 30.000000"), "{full}");
    assert!(full.contains("Payload: 4 bytes\n    61616161\n"), "{full}");
    assert!(
        full.contains("DETH: Q_Key 0x80010000 SrcQP 0x005010"),
        "{full}"
    );
}

#[test]
fn errors_exit_non_zero_with_a_message() {
    let s = scratch("errors");
    let junk = s.0.join("junk.pcap");
    std::fs::write(&junk, [0u8; 40]).unwrap();
    let missing = s.0.join("missing.pcap");
    let cases: [(Vec<&str>, &str); 4] = [
        (vec!["pcap"], "at least one file"),
        (vec!["pcap", "--nope", "x"], "unexpected option"),
        (vec!["pcap", missing.to_str().unwrap()], "reading"),
        (vec!["pcap", junk.to_str().unwrap()], "not a pcap file"),
    ];
    for (args, want) in cases {
        let o = madtool(&args);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(o.stdout.is_empty(), "{args:?}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(want), "{args:?}: {e}");
    }
}
