//! The ACM wire format (class 0x2C resolve MADs) proven on captured traffic.
//!
//! A fabric with real `ibacm` daemons on Hca3 (requester) and Hca4 (responder), **no hosts
//! file** (so a name can only be resolved over the ACM address protocol), every daemon with
//! `SIMVERBS_PCAP` pointing at one shared capture file. `ib_acme -f n -s hca3 -d hca4 -v` on
//! Hca3 must succeed; then the capture is decoded three ways that must agree:
//!
//! * `madtool pcap --brief` (our decoder: `acm_core_nostd::wire::acm_mad`),
//! * `tshark`'s own InfiniBand dissector (LRH/GRH/BTH/DETH of every packet),
//! * `tshark` with `tools/madtool/acm.lua` (the class 0x2C fields of every packet),
//!
//! and must contain the multicast request (DLID a multicast LID, dest QP 0xFFFFFF, Q_Key
//! 0x80010000, GRH to the MGID, GET, control RESOLVE, dest = the peer's name, src = ours) and
//! the unicast response to it (same TID, GET_RESP 0x81, one GID = the request's MGID, back to
//! the requester's LID and QP).
//!
//! The test is one function of the two nodes' providers: stock/stock, and this project's
//! provider with the stock one in both directions.
//!
//! Needs root, the Debian packages of docs/fabric.md, tshark, and `libsimverbs.so` built into
//! the same target directory (`cargo build -p simverbs`; `-p acm-plugin` for the acmrs cases).

use acm_fabric::{pid_exists, Fabric, HostsFile, Provider, Topology};
use std::collections::BTreeMap;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const VERIFIED: &str = "SA verification: success";
const ACM_QKEY: u64 = acm_core_nostd::wire::mcmember::ACM_QKEY as u64;

/// A scratch directory removed on drop (also when the test panics).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn lua_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("acm.lua")
}

/// `cargo test` does not rebuild the simverbs cdylib: refuse one older than its capture code.
fn check_simverbs_fresh() {
    let lib = acm_fabric::find_artifact(
        "ACM_FABRIC_SIMVERBS",
        "libsimverbs.so",
        "cargo build -p simverbs",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let built = std::fs::metadata(&lib).and_then(|m| m.modified()).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../simverbs/src");
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        let m = e.metadata().and_then(|m| m.modified()).unwrap();
        assert!(
            m <= built,
            "{} is older than {}: run `cargo build -p simverbs` first",
            lib.display(),
            e.path().display()
        );
    }
}

/// A number as madtool or tshark prints it: `0x...` hex or decimal.
fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .unwrap_or_else(|_| panic!("{s:?} is not a number"))
}

fn gid(s: &str) -> Ipv6Addr {
    s.parse()
        .unwrap_or_else(|_| panic!("{s:?} is not a GID / IPv6 address"))
}

/// One line of `madtool pcap --brief`: its `key=value` tokens (`gid` may repeat: kept in
/// order under `gid`, `gid.1`, ...).
#[derive(Debug, Clone)]
struct Pkt(BTreeMap<String, String>);

impl Pkt {
    fn parse(line: &str) -> Pkt {
        let mut m = BTreeMap::new();
        let mut gids = 0;
        for tok in line.split_whitespace().skip(2) {
            let (k, v) = tok
                .split_once('=')
                .unwrap_or_else(|| panic!("token {tok:?} of {line:?}"));
            let k = if k == "gid" {
                gids += 1;
                if gids == 1 {
                    "gid".to_string()
                } else {
                    format!("gid.{}", gids - 1)
                }
            } else {
                k.to_string()
            };
            m.insert(k, v.to_string());
        }
        Pkt(m)
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }
    fn n(&self, k: &str) -> u64 {
        num(self.get(k).unwrap_or_else(|| panic!("no {k} in {self:?}")))
    }
    fn gids(&self) -> Vec<Ipv6Addr> {
        let cnt = self.get("gid_cnt").map(num).unwrap_or(0);
        (0..cnt)
            .map(|i| {
                let k = if i == 0 {
                    "gid".to_string()
                } else {
                    format!("gid.{i}")
                };
                gid(self.get(&k).unwrap_or_else(|| panic!("no {k} in {self:?}")))
            })
            .collect()
    }
    fn is_acm(&self) -> bool {
        self.get("class") == Some("0x2c")
    }
}

fn run(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?}: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// `tshark -T fields` rows (tab-separated, one per frame) of `fields`.
fn tshark_fields(pcap: &Path, lua: bool, fields: &[&str]) -> Vec<Vec<String>> {
    let mut c = Command::new("tshark");
    if lua {
        c.arg("-X")
            .arg(format!("lua_script:{}", lua_script().display()));
    }
    c.arg("-r")
        .arg(pcap)
        .args(["-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,"]);
    for f in fields {
        c.args(["-e", f]);
    }
    run(&mut c)
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

/// The test: `requester` on Hca3 resolves Hca4's name, `responder` on Hca4 answers.
fn acm_wire_on_capture(label: &str, requester: Provider, responder: Provider) {
    check_simverbs_fresh();
    let scratch = Scratch(
        std::env::temp_dir().join(format!("madtool-capture-{label}-{}", std::process::id())),
    );
    let _ = std::fs::remove_dir_all(&scratch.0);
    std::fs::create_dir_all(&scratch.0).unwrap();
    let pcap = scratch.0.join("fabric.pcap");

    let f = Fabric::builder(
        Topology::example("net.2sw2path4hca").unwrap(),
        ["Hca3", "Hca4"],
    )
    .node_provider("Hca3", requester.clone())
    .node_provider("Hca4", responder.clone())
    .hosts_file(HostsFile::Absent)
    .daemon_env("SIMVERBS_PCAP", pcap.to_str().unwrap())
    .name_prefix(&format!("cap-{label}"))
    .start()
    .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let (h3, h4) = (f.node("Hca3").unwrap(), f.node("Hca4").unwrap());
    // Each daemon serves its endpoint with the provider asked for.
    for (n, p) in [(h3, &requester), (h4, &responder)] {
        let e = n.acme(&["-e"]).unwrap();
        assert!(
            e.success()
                && e.stdout
                    .contains(&format!(",{},{},", p.name(), n.addrs.name)),
            "{}: ib_acme -e should list provider {}:\n{e}",
            n.name,
            p.name()
        );
    }
    let (lid3, lid4, gid3, gid4) = (h3.lid, h4.lid, h3.gid, h4.gid);
    let (name3, name4) = (h3.addrs.name.clone(), h4.addrs.name.clone());
    let out = h3
        .acme_until(
            &["-f", "n", "-s", &name3, "-d", &name4, "-v"],
            Duration::from_secs(15),
            |o| o.stdout.contains(VERIFIED),
        )
        .unwrap();
    assert!(
        out.success() && out.stdout.contains(VERIFIED),
        "[{} -> {}] ib_acme -f n -s {name3} -d {name4} -v:\n{out}\n{}",
        requester.name(),
        responder.name(),
        f.logs_report()
    );
    assert!(out.stdout.contains(&format!("dlid: {lid4}\n")), "{out}");
    // Stop the daemons before reading the capture (no record is half-written then).
    let logs = f.logs_report();
    let pids = f.pids();
    drop(f);
    for p in pids {
        assert!(!pid_exists(p), "pid {p} survived the teardown");
    }
    let ctx = |what: &str| format!("{what}\n{logs}");

    // 1. Our decoder.
    let brief = run(Command::new(env!("CARGO_BIN_EXE_madtool"))
        .args(["pcap", "--brief"])
        .arg(&pcap));
    let pkts: Vec<Pkt> = brief.lines().map(Pkt::parse).collect();
    assert!(!pkts.is_empty(), "{}", ctx("empty capture"));
    let requests: Vec<&Pkt> = pkts
        .iter()
        .filter(|p| {
            p.is_acm()
                && p.n("method") == 0x01
                && p.get("control") == Some("0x0001(RESOLVE)")
                && p.get("dest") == Some(&format!("Name:{name4:?}"))
        })
        .collect();
    assert!(
        !requests.is_empty(),
        "{}",
        ctx(&format!("no request:\n{brief}"))
    );
    let mut matched = None;
    for rq in &requests {
        // A multicast request from Hca3's port, with a GRH to the group.
        assert!(rq.n("dlid") >= 0xc000 && rq.n("dlid") < 0xffff, "{rq:?}");
        assert_eq!(rq.n("dqp"), 0xff_ffff, "{rq:?}");
        assert_eq!(rq.n("qkey"), ACM_QKEY, "{rq:?}");
        assert_eq!(rq.get("grh"), Some("1"), "{rq:?}");
        assert_eq!(rq.n("slid"), u64::from(lid3), "{rq:?}");
        assert_eq!(gid(rq.get("sgid").unwrap()), gid3, "{rq:?}");
        assert_eq!(rq.get("src"), Some(&*format!("Name:{name3:?}")), "{rq:?}");
        assert_eq!(rq.n("len"), 256, "{rq:?}");
        let mgid = gid(rq.get("dgid").unwrap());
        assert_eq!(mgid.segments()[0], 0xff15, "an ibacm MGID: {rq:?}");
        let gids = rq.gids();
        assert!(
            (1..=6).contains(&gids.len()) && gids.last() == Some(&mgid),
            "the request carries its MGIDs, the group it is sent to last: {rq:?}"
        );
        let tid = rq.n("tid");
        let responses: Vec<&Pkt> = pkts
            .iter()
            .filter(|p| p.is_acm() && p.n("method") == 0x81 && p.n("tid") == tid)
            .collect();
        for rs in responses {
            // Unicast, from Hca4 back to the requesting QP on Hca3.
            assert_eq!(rs.n("dlid"), u64::from(lid3), "{rs:?}");
            assert_eq!(rs.n("slid"), u64::from(lid4), "{rs:?}");
            assert_eq!(rs.n("dqp"), rq.n("sqp"), "{rs:?}");
            assert_eq!(rs.n("qkey"), ACM_QKEY, "{rs:?}");
            assert_eq!(rs.get("control"), Some("0x0001(RESOLVE)"), "{rs:?}");
            assert_eq!(rs.n("status"), 0, "{rs:?}");
            assert_eq!(rs.gids(), vec![mgid], "one GID, the MGID: {rs:?}");
            if rs.get("grh") == Some("1") {
                assert_eq!(gid(rs.get("sgid").unwrap()), gid4, "{rs:?}");
                assert_eq!(gid(rs.get("dgid").unwrap()), gid3, "{rs:?}");
            }
            matched = Some(((*rq).clone(), rs.clone()));
        }
    }
    let (rq, rs) = matched.unwrap_or_else(|| {
        panic!(
            "{}",
            ctx(&format!("no response to any of {requests:?}:\n{brief}"))
        )
    });

    // The full output decodes the same packets field by field.
    let full = run(Command::new(env!("CARGO_BIN_EXE_madtool"))
        .arg("pcap")
        .arg(&pcap));
    for line in [
        "Method: 0x01 (Get)",
        "Method: 0x81 (GetResp)",
        "Control: 0x0001 (RESOLVE)",
        &format!("TransactionID: 0x{:016x}", rq.n("tid")),
        &format!("Dest: {name4:?}"),
        &format!("Src: {name3:?}"),
        "GIDCount: 1",
        &format!("DETH: Q_Key 0x80010000 SrcQP 0x{:06x}", rq.n("sqp")),
        &format!(
            "BTH: Opcode 0x64 (UD SEND only) P_Key 0x{:04x} DestQP 0xffffff (multicast)",
            rq.n("pkey")
        ),
    ] {
        assert!(
            full.lines()
                .any(|l| l.trim() == line || l.trim().starts_with(line)),
            "madtool pcap lacks {line:?}:\n{full}"
        );
    }
    assert!(!full.contains("Note:"), "{full}");

    // 2. tshark's InfiniBand dissector agrees with madtool on every packet's headers.
    let ib = tshark_fields(
        &pcap,
        false,
        &[
            "infiniband.lrh.slid",
            "infiniband.lrh.dlid",
            "infiniband.lrh.lnh",
            "infiniband.grh.sgid",
            "infiniband.grh.dgid",
            "infiniband.bth.opcode",
            "infiniband.bth.p_key",
            "infiniband.bth.destqp",
            "infiniband.deth.q_key",
            "infiniband.deth.srcqp",
        ],
    );
    assert_eq!(ib.len(), pkts.len(), "tshark frames vs madtool packets");
    for (row, p) in ib.iter().zip(&pkts) {
        let why = format!("tshark {row:?} vs madtool {p:?}");
        assert_eq!(num(&row[0]), p.n("slid"), "{why}");
        assert_eq!(num(&row[1]), p.n("dlid"), "{why}");
        assert_eq!(num(&row[2]) == 3, p.get("grh") == Some("1"), "{why}");
        if p.get("grh") == Some("1") {
            assert_eq!(gid(&row[3]), gid(p.get("sgid").unwrap()), "{why}");
            assert_eq!(gid(&row[4]), gid(p.get("dgid").unwrap()), "{why}");
        }
        assert_eq!(num(&row[5]), p.n("op"), "{why}");
        assert_eq!(num(&row[6]), p.n("pkey"), "{why}");
        assert_eq!(num(&row[7]), p.n("dqp"), "{why}");
        assert_eq!(num(&row[8]), p.n("qkey"), "{why}");
        assert_eq!(num(&row[9]), p.n("sqp"), "{why}");
    }

    // 3. tshark + acm.lua agrees with madtool on every packet's class 0x2C fields.
    let acm = tshark_fields(
        &pcap,
        true,
        &[
            "acm.mgmt_class",
            "acm.method",
            "acm.control",
            "acm.tid",
            "acm.dest_name",
            "acm.src_name",
            "acm.gid_cnt",
            "acm.gid",
        ],
    );
    assert_eq!(acm.len(), pkts.len());
    let mut acm_rows = 0;
    for (row, p) in acm.iter().zip(&pkts) {
        let why = format!("tshark+acm.lua {row:?} vs madtool {p:?}");
        if !p.is_acm() {
            assert!(row.iter().all(String::is_empty), "{why}");
            continue;
        }
        acm_rows += 1;
        assert_eq!(num(&row[0]), 0x2c, "{why}");
        assert_eq!(num(&row[1]), p.n("method"), "{why}");
        assert_eq!(
            Some(format!("0x{:04x}", num(&row[2])).as_str()),
            p.get("control").map(|c| &c[..6]),
            "{why}"
        );
        assert_eq!(num(&row[3]), p.n("tid"), "{why}");
        for (col, key) in [(4, "dest"), (5, "src")] {
            let want = p
                .get(key)
                .and_then(|v| v.strip_prefix("Name:"))
                .map(|v| v.trim_matches('"').to_string())
                .unwrap_or_default();
            assert_eq!(row[col], want, "{why}");
        }
        assert_eq!(num(&row[6]), p.n("gid_cnt"), "{why}");
        let lua_gids: Vec<Ipv6Addr> = row[7]
            .split(',')
            .filter(|s| !s.is_empty())
            .map(gid)
            .collect();
        assert_eq!(lua_gids, p.gids(), "{why}");
    }
    assert!(acm_rows >= 2, "request and response: {acm:?}");
    // And the Lua dissector names them in the Info column.
    let info = run(Command::new("tshark")
        .arg("-X")
        .arg(format!("lua_script:{}", lua_script().display()))
        .arg("-r")
        .arg(&pcap)
        .args(["-Y", &format!("acm.tid == 0x{:x}", rs.n("tid"))]));
    assert!(
        info.contains("ACM GET RESOLVE") && info.contains("ACM GET_RESP RESOLVE"),
        "{info}"
    );
}

#[test]
fn capture_stock_requester_stock_responder() {
    acm_wire_on_capture("stock-stock", Provider::Stock, Provider::Stock);
}

#[test]
fn capture_stock_requester_acmrs_responder() {
    acm_wire_on_capture("stock-acmrs", Provider::Stock, Provider::Acmrs);
}

#[test]
fn capture_acmrs_requester_stock_responder() {
    acm_wire_on_capture("acmrs-stock", Provider::Acmrs, Provider::Stock);
}
