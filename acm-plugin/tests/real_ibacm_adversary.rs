//! A rogue host on the fabric, against the real ibacm daemon loading acmrs: one more process
//! on the simulated fabric (`ud-agent`, a UD QP of its own on Hca4, no daemon) that learns
//! acmrs's QP from the ACM protocol, as any host can, and then sends it forged SA traffic.
//! acmrs takes class-3 MADs only from the SM (its LID, QP 1): a forged trap 65 Report for a
//! live GID flushes nothing, and the forgery is counted and logged.
//!
//! Needs root and, in the target directory, `libsimverbs.so`, `libacmrs.so` and `ud-agent`
//! (`cargo build -p simverbs -p acm-plugin -p acm-ud-agent`); fails with the reason
//! otherwise.

mod common;

use acm_fabric::checks::{self, global_counters, require_root};
use acm_fabric::testing::{hex, profile_dir, verbs_command};
use acm_fabric::{Fabric, HostsFile};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};

/// The stock libibacmp's name request (hca3 asking for hca4), recorded on the wire.
const STOCK_REQUEST: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../acm-core-nostd/tests/fixtures/acmp_resolve_req.bin"
));

/// `ud-agent` on an HCA of the fabric: one line in, one reply line out (plus one line per MAD
/// for `recv`).
struct Rogue {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Rogue {
    fn start(f: &Fabric, host: &str) -> Rogue {
        let bin = profile_dir().join("ud-agent");
        assert!(
            bin.is_file(),
            "{} missing: cargo build -p acm-ud-agent (same target dir)",
            bin.display()
        );
        let mut child = verbs_command(&bin, f.name(), f.scratch(), host)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Rogue {
            child,
            stdin,
            stdout,
        }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.stdout.read_line(&mut l).unwrap();
        l.trim().to_string()
    }

    fn cmd(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        self.line()
    }

    /// `recv n ms`: the MAD lines, each as `key=value` words.
    fn recv(&mut self, n: usize, ms: u64) -> Vec<std::collections::HashMap<String, String>> {
        let head = self.cmd(&format!("recv {n} {ms}"));
        let k: usize = head
            .strip_prefix("ok n=")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("recv: {head}"));
        (0..k)
            .map(|_| {
                self.line()
                    .split_whitespace()
                    .filter_map(|w| w.split_once('='))
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect()
            })
            .collect()
    }
}

impl Rogue {
    /// Opens the rogue's UD QP and attaches it to the ACM base group of the default partition
    /// (locally: no SA involved), so it sees every ACM query there.
    fn open_on_acm_group(&mut self, f: &Fabric, host: &str) {
        let opened = self.cmd("open 64 16");
        assert!(opened.starts_with("ok "), "{opened}");
        let mlid = mlid_of(f, host, "ff15:4001:ffff:3:400::");
        let attached = self.cmd(&format!("attach 0 ff154001ffff00030400000000000000 {mlid}"));
        assert_eq!(attached, "ok");
    }

    /// Sends `mad` `count` times to QP `qpn` of `node`, from the rogue's own LID and QP.
    fn send_to(&mut self, node: &acm_fabric::Node, qpn: &str, mad: &[u8; 256], count: u32) {
        let sent = self.cmd(&format!(
            "raw {} {qpn} {} {} {count}",
            node.lid,
            "0".repeat(32),
            hex(mad)
        ));
        assert_eq!(sent, format!("ok sent={count}"));
    }

    /// The UD QP of `node`'s daemon: the rogue asks the ACM group for the node's name (as
    /// any host may) and reads the answer's source QP.
    fn qpn_of(&mut self, f: &Fabric, node: &acm_fabric::Node) -> String {
        let mut ask = [0u8; 256];
        ask.copy_from_slice(STOCK_REQUEST);
        ask[24..88].fill(0);
        ask[24..24 + node.addrs.name.len()].copy_from_slice(node.addrs.name.as_bytes());
        ask[88..152].fill(0);
        ask[88..93].copy_from_slice(b"rogue");
        // A fresh TID each time (a node answers a TID it saw once only once).
        ask[8..16].copy_from_slice(&u64::from(node.lid).to_be_bytes());
        let sent = self.cmd(&format!("mraw 0 {}", hex(&ask)));
        assert!(sent.starts_with("ok"), "{sent}");
        let lid = node.lid.to_string();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Some(m) = self.recv(1, 1000).into_iter().find(|m| m["slid"] == lid) {
                return m["src_qp"].clone();
            }
        }
        panic!(
            "{} never answered the rogue\n{}",
            node.name,
            f.logs_report()
        )
    }
}

impl Rogue {
    /// The next ACM name query (a Get) `from`'s daemon multicasts for `name`, as the rogue
    /// sees it go by on the group (within 10 s).
    fn await_query(
        &mut self,
        from: &acm_fabric::Node,
        name: &str,
    ) -> std::collections::HashMap<String, String> {
        let t0 = Instant::now();
        loop {
            if let Some(m) = self.recv(1, 1000).into_iter().find(|m| {
                let b = bytes_of(m);
                m["slid"] == from.lid.to_string()
                    && b[1] == 0x2c
                    && b[3] == 0x01
                    && b[24..24 + name.len()] == *name.as_bytes()
            }) {
                return m;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no query seen");
        }
    }
}

/// Hca2 running stock and Hca3 acmrs (OpenSM on Hca1, no hosts file, `extra` more names per
/// node), and the rogue on Hca4, labelled `prefix`.
fn fabric_and_rogue(prefix: &str, extra: usize) -> (Fabric, Rogue) {
    let f = common::stock_and_acmrs(prefix)
        .hosts_file(HostsFile::Absent)
        .extra_names(extra)
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let rogue = Rogue::start(&f, "Hca4");
    (f, rogue)
}

impl Drop for Rogue {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (up to 20 s) until `node`'s daemon log satisfies `done`.
fn wait_log(f: &Fabric, node: &acm_fabric::Node, what: &str, done: impl Fn(&str) -> bool) {
    let t0 = Instant::now();
    while !done(&node.log()) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{}: {what}\n{}",
            node.name,
            f.logs_report()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The MLID of the multicast group `mgid` (`saquery -g` as HCA `host`).
fn mlid_of(f: &Fabric, host: &str, mgid: &str) -> u16 {
    let out = f.run_tool(host, "saquery", &["-g"]).unwrap();
    let mut seen = false;
    for l in out.stdout.lines() {
        let l = l.trim();
        if let Some(v) = l.strip_prefix("MGID") {
            seen = v.trim_start_matches('.').trim() == mgid;
        } else if let Some(v) = l.strip_prefix("Mlid").filter(|_| seen) {
            let v = v.trim_start_matches('.').trim();
            return u16::from_str_radix(v.trim_start_matches("0x"), 16).unwrap();
        }
    }
    panic!("no group {mgid} in saquery -g:\n{out}")
}

/// A trap `trap` Report (an SA Notice) about `gid`, as the SM sends it.
fn report(trap: u16, gid: &[u8; 16]) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 3, 2, 0x06]); // SA class, version 2, Report
    m[8..16].copy_from_slice(&0x1234_5678u64.to_be_bytes());
    m[16..18].copy_from_slice(&[0x00, 0x02]); // Notice
    let n = &mut m[56..136];
    n[0] = 0x80 | 4; // generic, type 4
    n[1..4].copy_from_slice(&[0, 0, 4]); // producer: the SM
    n[4..6].copy_from_slice(&trap.to_be_bytes());
    n[6..8].copy_from_slice(&1u16.to_be_bytes()); // issuer LID 1 (the SM's, claimed)
    n[16..32].copy_from_slice(gid);
    m
}

#[test]
fn a_rogue_hosts_forged_sa_report_flushes_nothing() {
    require_root();
    // Hca2 stock, Hca3 acmrs; OpenSM on Hca1; the rogue on Hca4.
    let (f, mut rogue) = fabric_and_rogue("adversary", 0);
    let (hca2, hca3) = (f.node("Hca2").unwrap(), f.node("Hca3").unwrap());
    // acmrs learns a path to Hca2 and serves it from its cache.
    let lid = |n: &acm_fabric::Node| n.lid.to_string();
    let args = ["-f", "l", "-s", &lid(hca3), "-d", &lid(hca2)];
    checks::resolve_verified(
        &f,
        "Hca3",
        "l",
        &lid(hca3),
        &lid(hca2),
        "Hca2",
        Duration::from_secs(20),
    );

    // The rogue joins the ACM base group (locally: no SA involved) and asks it for hca3's
    // name: acmrs answers from its UD QP, which is also the QP its SA traffic uses.
    rogue.open_on_acm_group(&f, "Hca4");
    let qpn = rogue.qpn_of(&f, hca3);

    // The forged Report: "Hca2's GID is out of service" (trap 65), sent to that QP from the
    // rogue's own LID and QP. A flush would make the next request a route query.
    let before = global_counters(&f, "Hca3");
    rogue.send_to(hca3, &qpn, &report(65, &hca2.gid.octets()), 5);
    // Either acmrs drops it (and says so) or takes it as a Report (and logs that).
    let taken = "SA Report: trap 65";
    let dropped = "SA MAD not from the SM";
    wait_log(&f, hca3, "neither taken nor dropped", |l| {
        l.contains(dropped) || l.contains(taken)
    });
    let log = hca3.log();
    assert!(!log.contains(taken), "the forged Report was taken:\n{log}");
    assert!(log.contains(dropped), "{log}");
    let out = hca3.acme(&args).unwrap();
    assert!(out.success(), "{out}");
    let after = global_counters(&f, "Hca3");
    assert_eq!(
        after["Route Query Count"], before["Route Query Count"],
        "the cached path survived the forgery (no new SA query)"
    );
    assert_eq!(
        after["Route Cache Count"],
        before["Route Cache Count"] + 1,
        "answered from the cache"
    );

    // The stock provider, sent the same: it takes no Reports at all (its SA traffic goes
    // through the core's umad agent), logs the MAD as unexpected and keeps its path.
    checks::resolve_verified(
        &f,
        "Hca2",
        "l",
        &lid(hca2),
        &lid(hca3),
        "Hca3",
        Duration::from_secs(20),
    );
    let stock_qpn = rogue.qpn_of(&f, hca2);
    let before = global_counters(&f, "Hca2");
    rogue.send_to(hca2, &stock_qpn, &report(65, &hca3.gid.octets()), 1);
    wait_log(&f, hca2, "stock did not log the MAD", |l| {
        l.contains("unexpected SA MAD")
    });
    let out = hca2
        .acme(&["-f", "l", "-s", &lid(hca2), "-d", &lid(hca3)])
        .unwrap();
    assert!(out.success(), "{out}");
    let after = global_counters(&f, "Hca2");
    assert_eq!(after["Route Query Count"], before["Route Query Count"]);
}

/// The bytes of a `recv` line's MAD.
fn bytes_of(m: &std::collections::HashMap<String, String>) -> [u8; 256] {
    let h = &m["bytes"];
    let mut b = [0u8; 256];
    for (i, x) in b.iter_mut().enumerate() {
        *x = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap();
    }
    b
}

#[test]
fn a_late_forged_acm_answer_and_its_replays_change_nothing() {
    require_root();
    let (f, mut rogue) = fabric_and_rogue("adversary-acm", 1);
    let (hca2, hca3) = (f.node("Hca2").unwrap(), f.node("Hca3").unwrap());
    rogue.open_on_acm_group(&f, "Hca4");
    // acmrs asks the group for Hca2's extra name; the stock node answers; the rogue sees the
    // query go by.
    let name = hca2.addrs.extra_names[0].clone();
    checks::resolve_verified(
        &f,
        "Hca3",
        "n",
        &hca3.addrs.name,
        &name,
        "Hca2",
        Duration::from_secs(20),
    );
    let query = rogue.await_query(hca3, &name);
    let acmrs_qpn = query["src_qp"].clone();
    // The rogue's answer, after the owner's: "that name is me" (its GID in the GRH), then
    // the same again three times (a replay).
    let mut forged = bytes_of(&query);
    forged[3] = 0x81; // GetResp
    forged[4..6].fill(0); // status
    let before = hca3.log().len();
    rogue.send_to(hca3, &acmrs_qpn, &forged, 4);
    wait_log(&f, hca3, "the late answers were not counted", |l| {
        l.get(before..)
            .is_some_and(|new| new.contains("ACM response with no pending TID dropped"))
    });
    // The name still resolves to Hca2, SA-verified.
    checks::resolve_verified(
        &f,
        "Hca3",
        "n",
        &hca3.addrs.name,
        &name,
        "Hca2",
        Duration::from_secs(5),
    );
}

/// The SA PathRecord Gets `node`'s daemon sent (to QP 1 of the SM, from its LID) among the
/// datagrams simverbs captured into `pcap` from record `skip` on: (wire TID, source QP, the
/// DLID the query asks for), in order.
fn path_gets(pcap: &std::path::Path, node: &acm_fabric::Node, skip: usize) -> Vec<(u64, u32, u16)> {
    use acm_madtool::pcap::{ib_frame, parse_ib, parse_pcap};
    let Ok(bytes) = std::fs::read(pcap) else {
        return Vec::new();
    };
    let records = parse_pcap(&bytes).unwrap_or_default();
    records
        .iter()
        .skip(skip)
        .filter_map(|r| parse_ib(ib_frame(r).ok()?).ok())
        .filter(|p| p.slid == node.lid && p.dest_qp == 1 && p.payload.len() >= 120)
        .filter(|p| p.payload[1] == 3 && p.payload[3] == 0x01 && p.payload[16..18] == [0, 0x35])
        .map(|p| {
            let tid = u64::from_be_bytes(p.payload[8..16].try_into().unwrap());
            let dlid = u16::from_be_bytes([p.payload[56 + 40], p.payload[56 + 41]]);
            (tid, p.src_qp.unwrap_or(0), dlid)
        })
        .collect()
}

/// A PathRecord GetResp with `tid` carrying `pr`, as an SA would send it.
fn path_reply(tid: u64, pr: &acm_core_nostd::wire::path_record::PathRecordRepr) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 3, 2, 0x81]); // SA class, version 2, GetResp
    m[8..16].copy_from_slice(&tid.to_be_bytes());
    m[16..18].copy_from_slice(&[0x00, 0x35]); // PathRecord
    m[44..46].copy_from_slice(&8u16.to_be_bytes()); // AttributeOffset: 64 bytes
    m[56..120].copy_from_slice(&pr.to_bytes());
    m
}

/// The strongest forgery of a path: a rogue that knows the exact wire TID of acmrs's
/// outstanding PathRecord query (here from simverbs' capture of the victim's own sends: an
/// oracle no real fabric hands out, standing in for a switch mirror port) answers it first,
/// with a wrong DLID, SL and MTU. acmrs takes SA replies only from the SM's LID and QP 1, so
/// it drops the forgery (counted, logged) and serves the SA's path once the SA answers.
#[test]
fn a_forged_path_record_with_the_right_tid_is_dropped_and_the_sas_path_served() {
    use acm_core_nostd::wire::gid::Gid;
    use acm_core_nostd::wire::path_record::PathRecordRepr;
    require_root();
    let pcap = std::env::temp_dir().join(format!("acmrs-adversary-pr-{}.pcap", std::process::id()));
    let _ = std::fs::remove_file(&pcap);
    struct Rm(std::path::PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _rm = Rm(pcap.clone());
    let f = common::stock_and_acmrs("adversary-pr")
        .hosts_file(HostsFile::Absent)
        .daemon_env("SIMVERBS_PCAP", &pcap.to_string_lossy())
        // One try of 10 s: the query stays outstanding while the SA is frozen.
        .node_option("Hca3", "acmrs_sa_timeout_ms", "10000")
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let (hca2, hca3) = (f.node("Hca2").unwrap(), f.node("Hca3").unwrap());
    let mut rogue = Rogue::start(&f, "Hca4");
    let opened = rogue.cmd("open 64 16");
    assert!(opened.starts_with("ok "), "{opened}");

    // The SA freezes; a client of acmrs asks for a path it has not cached.
    let skip = acm_madtool::pcap::parse_pcap(&std::fs::read(&pcap).unwrap_or_default())
        .map_or(0, |r| r.len());
    f.pause_sm().unwrap();
    let args = [
        "-f",
        "l",
        "-s",
        &hca3.lid.to_string(),
        "-d",
        &hca2.lid.to_string(),
        "-v",
    ];
    std::thread::scope(|s| {
        let asking = s.spawn(|| hca3.acme(&args).unwrap());
        let t0 = Instant::now();
        let (tid, qpn) = loop {
            if let Some(&(tid, qpn, _)) = path_gets(&pcap, hca3, skip)
                .iter()
                .rev()
                .find(|g| g.2 == hca2.lid)
            {
                break (tid, qpn);
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "acmrs sent no PathRecord query for LID {}\n{}",
                hca2.lid,
                f.logs_report()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // The forgery: the right TID, to the QP that asked, a path to nowhere.
        let forged = PathRecordRepr {
            dgid: Gid(hca2.gid.octets()),
            sgid: Gid(hca3.gid.octets()),
            dlid: 0x77,
            slid: hca3.lid,
            reversible: true,
            num_path: 1,
            pkey: 0xffff,
            sl: 9,
            mtu: 1,
            rate: 2,
            packet_life: 1,
            ..PathRecordRepr::ZERO
        };
        let before = hca3.log().len();
        rogue.send_to(hca3, &qpn.to_string(), &path_reply(tid, &forged), 3);
        wait_log(&f, hca3, "the forged PathRecord was not dropped", |l| {
            l.get(before..)
                .is_some_and(|new| new.contains("SA MAD not from the SM"))
        });
        f.resume_sm().unwrap();
        let out = asking.join().unwrap();
        checks::check_path(
            &f,
            "Hca3",
            "Hca2",
            "the path acmrs served after the forgery",
            &out,
        );
        assert!(!out.stdout.contains("dlid: 119\n"), "{out}");
    });
    // And from the cache: still the SA's path.
    let out = hca3.acme(&args).unwrap();
    checks::check_path(
        &f,
        "Hca3",
        "Hca2",
        "the cached path after the forgery",
        &out,
    );
}

/// `count` copies of an ACM query from the rogue for `node`'s name, each from a distinct
/// IPv4 requester (the counter at bytes 88..92) with a distinct TID: copy i asks as 0.0.0.i.
fn query_flood_mad(node: &acm_fabric::Node) -> [u8; 256] {
    let mut q = [0u8; 256];
    q.copy_from_slice(STOCK_REQUEST);
    q[24..88].fill(0);
    q[24..24 + node.addrs.name.len()].copy_from_slice(node.addrs.name.as_bytes());
    q[18..20].copy_from_slice(&[2, 4]); // source: an IPv4 address (the counter)
    q[88..152].fill(0);
    q
}

/// The running totals of `what` in a daemon log's rate-limited drop lines
/// (`ERROR - <what>: <n> (total <t>)`): (lines, the last total).
fn drop_lines(log: &str, what: &str) -> (usize, u64) {
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(what)).collect();
    let last = lines
        .last()
        .and_then(|l| l.rsplit_once("(total ")?.1.strip_suffix(')')?.parse().ok())
        .unwrap_or(0);
    (lines.len(), last)
}

/// A rogue floods acmrs's QP at full speed: first with valid ACM queries for acmrs's name,
/// each from a requester it has never heard of, then with malformed ACM MADs. acmrs keeps
/// serving its clients during and after each flood (cold name and LID requests, SA-verified),
/// counts the malformed MADs and logs them at most about once a second with running totals.
/// The stock provider is flooded the same way and what it does is printed (docs/hardening.md).
#[test]
fn a_flood_of_queries_and_malformed_mads_leaves_clients_served_and_the_log_bounded() {
    require_root();
    const FLOOD: u32 = 20_000;
    let (f, mut rogue) = fabric_and_rogue("adversary-flood", 2);
    let (hca2, hca3) = (f.node("Hca2").unwrap(), f.node("Hca3").unwrap());
    rogue.open_on_acm_group(&f, "Hca4");
    let lid = |n: &acm_fabric::Node| n.lid.to_string();
    for (victim, other, vname, oname) in
        [(hca3, hca2, "Hca3", "Hca2"), (hca2, hca3, "Hca2", "Hca3")]
    {
        let qpn = rogue.qpn_of(&f, victim);
        let log0 = victim.log().len();
        let t0 = Instant::now();
        // Valid queries, each from a new requester, while a client asks for a cold name.
        let flood = |rogue: &mut Rogue, mad: &[u8; 256]| {
            writeln!(
                rogue.stdin,
                "raw {} {qpn} {} {} {FLOOD} 12,88",
                victim.lid,
                "0".repeat(32),
                hex(mad)
            )
            .unwrap();
            rogue.stdin.flush().unwrap();
        };
        flood(&mut rogue, &query_flood_mad(victim));
        let during = checks::resolve_verified(
            &f,
            vname,
            "n",
            &victim.addrs.name,
            &other.addrs.extra_names[0],
            oname,
            Duration::from_secs(30),
        );
        let sent = rogue.line();
        assert_eq!(sent, format!("ok sent={FLOOD}"));
        let queries_s = t0.elapsed();
        // Malformed: the same queries with class version 9.
        let mut bad = query_flood_mad(victim);
        bad[2] = 9;
        let t1 = Instant::now();
        flood(&mut rogue, &bad);
        let out = victim
            .acme(&["-f", "l", "-s", &lid(victim), "-d", &lid(other), "-v"])
            .unwrap();
        checks::check_path(
            &f,
            vname,
            oname,
            "a LID request during the malformed flood",
            &out,
        );
        let sent = rogue.line();
        assert_eq!(sent, format!("ok sent={FLOOD}"));
        let malformed_s = t1.elapsed();
        // After both: a second cold name still resolves.
        checks::resolve_verified(
            &f,
            vname,
            "n",
            &victim.addrs.name,
            &other.addrs.extra_names[1],
            oname,
            Duration::from_secs(30),
        );
        let log = victim.log();
        let new = &log[log0..];
        eprintln!(
            "{vname} ({}): {FLOOD} queries in {queries_s:?}, {FLOOD} malformed in \
             {malformed_s:?}; log grew {} lines, {} bytes; a name resolved during the flood:\n{}",
            victim.provider().name(),
            new.lines().count(),
            new.len(),
            during
                .stdout
                .lines()
                .take(3)
                .collect::<Vec<_>>()
                .join(" | ")
        );
        for l in new.lines().filter(|l| l.contains("(total ")) {
            eprintln!("  {l}");
        }
        if vname == "Hca3" {
            wait_log(&f, victim, "the malformed MADs were not counted", |l| {
                drop_lines(&l[log0..], "malformed ACM MAD dropped").1 > 0
            });
            let log = victim.log();
            let (lines, total) = drop_lines(&log[log0..], "malformed ACM MAD dropped");
            let secs = (t1.elapsed().as_secs() + 2) as usize;
            assert!(
                lines <= secs,
                "{lines} drop lines in about {secs} s: the log is not rate-limited\n{log}"
            );
            assert!(
                (1..=u64::from(FLOOD)).contains(&total),
                "malformed total {total} of {FLOOD} sent"
            );
            assert!(
                log[log0..].lines().count() < 200,
                "the flood grew acmrs's log by {} lines:\n{}",
                log[log0..].lines().count(),
                log[log0..].lines().take(40).collect::<Vec<_>>().join("\n")
            );
        }
    }
}

/// What the ACM protocol cannot protect, shown: a rogue that answers a name query before
/// the owner does (the owner's daemon is frozen) wins, for acmrs as for stock, because the
/// first answer to an outstanding query is taken. What acmrs still guarantees: the host it
/// resolves to is the one that sent the answer (its GRH and LID, not anything the answer
/// claims), and the path it serves is the SA's path to that host, SA-verified. The owner's
/// late answer changes nothing (counted as an unknown TID).
#[test]
fn an_early_forged_acm_answer_wins_but_the_path_is_the_sas_path_to_the_answerer() {
    require_root();
    let (f, mut rogue) = fabric_and_rogue("adversary-early", 1);
    let (hca2, hca3) = (f.node("Hca2").unwrap(), f.node("Hca3").unwrap());
    let opened = rogue.cmd("open 64 16");
    let field = |k: &str| {
        opened
            .split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("{k} in {opened}"))
            .to_string()
    };
    let (rogue_lid, rogue_gid) = (field("lid="), field("gid="));
    let mlid = mlid_of(&f, "Hca4", "ff15:4001:ffff:3:400::");
    let attached = rogue.cmd(&format!("attach 0 ff154001ffff00030400000000000000 {mlid}"));
    assert_eq!(attached, "ok");
    // ib_acme prints GIDs as IPv6 text.
    let gid_text = {
        let mut g = [0u8; 16];
        for (i, b) in g.iter_mut().enumerate() {
            *b = u8::from_str_radix(&rogue_gid[2 * i..2 * i + 2], 16).unwrap();
        }
        std::net::Ipv6Addr::from(g).to_string()
    };
    for (asker, owner, aname) in [(hca3, hca2, "Hca3"), (hca2, hca3, "Hca2")] {
        let name = owner.addrs.extra_names.first().cloned().unwrap_or_default();
        let name = if name.is_empty() {
            owner.addrs.name.clone()
        } else {
            name
        };
        let owner_pid = owner.pid().expect("owner daemon running");
        // SAFETY: kill has no memory preconditions; the PID is the fabric's own daemon.
        assert_eq!(unsafe { libc::kill(owner_pid, libc::SIGSTOP) }, 0);
        struct Cont(i32);
        impl Drop for Cont {
            fn drop(&mut self) {
                // SAFETY: as above.
                unsafe { libc::kill(self.0, libc::SIGCONT) };
            }
        }
        let cont = Cont(owner_pid);
        let out = std::thread::scope(|s| {
            let args = ["-f", "n", "-s", &asker.addrs.name, "-d", &name, "-v"];
            let asking = s.spawn(move || asker.acme(&args).unwrap());
            let query = rogue.await_query(asker, &name);
            let mut answer = bytes_of(&query);
            answer[3] = 0x81;
            answer[4..6].fill(0);
            rogue.send_to(asker, &query["src_qp"], &answer, 1);
            asking.join().unwrap()
        });
        drop(cont);
        eprintln!(
            "{aname} ({}) asked for {name} (owner frozen), the rogue answered first:\n{out}",
            asker.provider().name()
        );
        assert!(out.success(), "{out}\n{}", f.logs_report());
        if aname == "Hca3" {
            // acmrs: the rogue's host, by the answer's own source, with the SA's path to it.
            assert!(out.stdout.contains(checks::SA_VERIFIED), "{out}");
            assert!(out.stdout.contains(&format!("dgid: {gid_text}\n")), "{out}");
            assert!(
                out.stdout.contains(&format!("dlid: {rogue_lid}\n")),
                "{out}"
            );
        }
    }
}
