//! Runs the `madtool` binary on the committed OpenSM fixtures and seed corpora and checks its
//! output and its errors.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> PathBuf {
    root().join("acm-core-nostd/tests/fixtures").join(name)
}

fn madtool(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_madtool"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run madtool");
    let mut input = child.stdin.take().unwrap();
    if let Some(b) = stdin {
        input.write_all(b).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = madtool(args, None);
    assert!(
        o.status.success(),
        "madtool {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn err(args: &[&str], stdin: Option<&[u8]>) -> String {
    let o = madtool(args, stdin);
    assert!(!o.status.success(), "madtool {args:?} should fail");
    assert!(o.stdout.is_empty());
    String::from_utf8(o.stderr).unwrap()
}

/// `madtool decode <flags> <seed>` on a file of the committed fuzz seed corpus.
fn decode_corpus(flags: &[&str], seed: &str) -> String {
    let path = root().join("fuzz/corpus").join(seed);
    let path = path.to_str().expect("UTF-8 path");
    let args: Vec<&str> = ["decode"]
        .into_iter()
        .chain(flags.iter().copied())
        .chain([path])
        .collect();
    ok(&args)
}

fn has(out: &str, line: &str) {
    assert!(
        out.lines().any(|l| l.trim() == line),
        "missing line '{line}' in:\n{out}"
    );
}

#[test]
fn decodes_opensm_path_record_reply() {
    let f = fixture("opensm_pr_get_lid_resp.bin");
    let out = ok(&["decode", f.to_str().unwrap()]);
    for line in [
        "MgmtClass: 0x03 (SubnAdm)",
        "ClassVersion: 2",
        "Method: 0x81 (GetResp, response)",
        "AttributeID: 0x0035 (PathRecord)",
        "SA status: Success",
        "ComponentMask: 0x000000000000a830 (DLID|SLID|Reversible|P_Key|SL)",
        "DGID: fe80:0000:0000:0000:0000:0000:0010:000a",
        "SGID: fe80:0000:0000:0000:0000:0000:0010:0004",
        "DLID: 6",
        "SLID: 4",
        "Reversible: 1",
        "P_Key: 0xffff",
        "SL: 0",
        "MTUSelector: Exactly",
        "RateSelector: Exactly",
        "PacketLifeTimeSelector: Exactly",
    ] {
        has(&out, line);
    }
    // Every PathRecord field is printed.
    for field in [
        "ServiceID",
        "RawTraffic",
        "FlowLabel",
        "HopLimit",
        "TClass",
        "NumbPath",
        "QoSClass",
        "MTU",
        "Rate",
        "PacketLifeTime",
        "Preference",
        "RMPPType",
        "SM_Key",
        "AttributeOffset",
        "TransactionID",
        "AttributeModifier",
        "ClassSpecific",
        "Status",
    ] {
        assert!(
            out.contains(&format!("  {field}: ")),
            "no {field} in\n{out}"
        );
    }
}

#[test]
fn decodes_opensm_mcmember_reply_from_stdin_and_hex() {
    let bytes = std::fs::read(fixture("opensm_mcm_set_resp.bin")).unwrap();
    let o = madtool(&["decode", "-"], Some(&bytes));
    assert!(o.status.success());
    let out = String::from_utf8(o.stdout).unwrap();
    has(&out, "AttributeID: 0x0038 (MCMemberRecord)");
    has(&out, "MGID: ff15:4001:ffff:0003:0400:0000:0000:0000");
    has(
        &out,
        "MGID (ibacm): P_Key 0xffff TOS 0 Rate 3 (10 Gb/s) MTU 4 (2048 bytes)",
    );
    has(&out, "Q_Key: 0x80010000");
    has(&out, "Scope: 5");
    has(&out, "JoinState: 0x1");
    let mlid = out
        .lines()
        .find(|l| l.trim().starts_with("MLID: 0x"))
        .unwrap();
    let v = u16::from_str_radix(mlid.trim().trim_start_matches("MLID: 0x"), 16).unwrap();
    assert!(v >= 0xc000, "{mlid}");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(ok(&["decode", "--hex", &hex]), out);
}

#[test]
fn decodes_status_and_acm_mad_and_client_msgs() {
    let out = ok(&[
        "decode",
        fixture("opensm_pr_get_norec_resp.bin").to_str().unwrap(),
    ]);
    has(&out, "SA status: NoRecords");
    has(
        &out,
        "Note: status is not success; the record may be meaningless",
    );

    let out = decode_corpus(&[], "wire_acm_mad/resolve_req.bin");
    has(&out, "MgmtClass: 0x2c (Acm)");
    has(&out, "Control: 0x0001 (RESOLVE)");
    has(&out, "Dest: 10.0.0.6");
    has(&out, "Src: 10.0.0.4");
    has(&out, "GIDCount: 1");
    has(&out, "GID[0]: ff15:4001:ffff:0003:0400:0000:0000:0000");

    let out = decode_corpus(&["--client"], "wire_client_msg/resolve_resp.bin");
    has(&out, "Length: 160 (native byte order)");
    has(&out, "Flags: 0x0000002b");
    has(&out, "Type: Path");
    has(&out, "DLID: 6");
    has(&out, "Address: 10.0.0.4");
    let out = decode_corpus(&["--client"], "wire_client_msg/perf_resp.bin");
    has(&out, "Length: 72 (big-endian)");
    has(&out, "Route Cache Count: 1006");
}

#[test]
fn bad_input_fails_with_a_clear_message() {
    assert!(err(&["decode", "/nonexistent/mad.bin"], None).contains("reading /nonexistent/mad.bin"));
    assert!(err(&["decode", "-"], Some(&[1, 3, 2])).contains("at least 24"));
    assert!(err(&["decode", "-"], Some(&[1u8, 3, 2, 1].repeat(10))).contains("256"));
    assert!(err(&["decode", "--hex", "01zz"], None).contains("not a hex digit"));
    assert!(err(&["decode", "--hex", "010"], None).contains("odd number"));
    let mut acm = std::fs::read(root().join("fuzz/corpus/wire_acm_mad/resolve_req.bin")).unwrap();
    acm[20] = 9; // gid_cnt
    assert!(err(&["decode", "-"], Some(&acm)).contains("more than the 6 GIDs"));
    let hdr = |len: &str| format!("01010000 0000{len} 0000000000000000");
    assert!(err(&["decode", "--client", "--hex", &hdr("5800")], None)
        .contains("length 88 but only 16 bytes"));
    assert!(err(&["decode", "--client", "--hex", &hdr("5900")], None)
        .contains("length 89 is not 16 + 72*n"));
    assert!(err(&["decode", "--client", "--hex", "01010000"], None).contains("header alone is 16"));
    assert!(err(&["frobnicate"], None).contains("unknown command"));
    assert!(err(&[], None).contains("usage"));
    assert!(err(&["capture"], None).contains("--out"));
}

#[test]
fn acm_respond_builds_the_response_acmp_accepted() {
    let dir = std::env::temp_dir().join(format!("acm-wire-madtool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("resp.bin");
    let req = fixture("acmp_resolve_req.bin");
    let o = madtool(
        &["acm-respond", req.to_str().unwrap(), out.to_str().unwrap()],
        None,
    );
    let got = std::fs::read(&out);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        got.unwrap(),
        std::fs::read(fixture("acmrs_resolve_resp.bin")).unwrap()
    );
    let sa = fixture("opensm_pr_get_lid_resp.bin");
    assert!(err(
        &["acm-respond", sa.to_str().unwrap(), "/nonexistent/x"],
        None
    )
    .contains("not an ACM resolve MAD"));
    let resp = fixture("acmrs_resolve_resp.bin");
    assert!(err(
        &["acm-respond", resp.to_str().unwrap(), "/nonexistent/x"],
        None
    )
    .contains("not a resolve request"));
    assert!(err(&["acm-respond"], None).contains("needs <request.bin>"));
}
