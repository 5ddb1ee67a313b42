//! The RMPP sender in the real OpenSM on a simulated fabric (docs/umad-rmpp.md): half-world
//! PathRecord GetTables (ComponentMask SGID only) sent by a simverbs UD QP through the GSI
//! bridge (the product's path to the SA), acknowledged and reassembled by
//! `acm_core_nostd::rmpp::Receiver`, checked against single PathRecord Gets; with segments
//! lost on the way; stopped by a receiver too small for the table; and an ACK for no transfer
//! kept from OpenSM.
//!
//! Needs root, ibsim, OpenSM, umad2sim, a C compiler and libibverbs-dev (the client is
//! simverbs' own test agent, `tools/simverbs/tests/c/svagent.c`), and `libsimverbs.so` /
//! `libumad_rmpp.so` built in this target directory (`cargo build -p simverbs -p umad-rmpp`).

use acm_core_nostd::rmpp::{Config, Failure, Progress, Receiver};
use acm_core_nostd::wire::mad::Method;
use acm_core_nostd::wire::path_record::PathRecordMask;
use acm_core_nostd::wire::sa::{attr, SaPacket, SaRepr};
use acm_fabric::testing::{hex, svagent, unhex, verbs_command, LineChild};
use acm_fabric::{Fabric, Topology};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

const GSI_QKEY: u32 = 0x8001_0000;
/// 4 leaves × 8 HCAs + 2 spines: 32 HCAs and 6 switches, 38 ports with a LID, so a
/// half-world table is 38 PathRecords = 2432 bytes = 13 segments.
fn topology() -> Topology {
    Topology::fat_tree(4, 2, 8).expect("fat-tree")
}
const PORTS: usize = 38;

/// svagent (simverbs' C test agent) on one simulated HCA: a UD QP under libsimverbs, one
/// reply line per command; stopped by PID when dropped.
struct Agent(LineChild);

impl Agent {
    fn start(f: &Fabric, host: &str) -> Agent {
        let mut c = verbs_command(svagent(), f.name(), f.scratch(), host);
        c.stderr(Stdio::inherit());
        Agent(LineChild::spawn(c, "svagent", Duration::from_secs(15)))
    }

    fn cmd(&mut self, line: &str) -> String {
        self.0.cmd(line)
    }

    fn send(&mut self, dlid: u16, mad: &[u8]) {
        let r = self.cmd(&format!("madsend {dlid} 1 {GSI_QKEY:#x} {}", hex(mad)));
        assert_eq!(r, "ok status=0", "send completion");
    }

    /// The next MAD within `ms` (a receive is posted again for each one taken).
    fn recv(&mut self, ms: u32) -> Option<Vec<u8>> {
        let r = self.cmd(&format!("waitmad {ms}"));
        if r == "timeout" {
            return None;
        }
        assert!(r.starts_with("wc status=0 "), "waitmad: {r}");
        assert_eq!(self.cmd("recv 1"), "ok");
        let h = r.split_whitespace().find_map(|w| w.strip_prefix("mad="));
        Some(unhex(h.expect("mad=")))
    }
}

fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}

fn half_world(tid: u64, sgid: &[u8; 16]) -> [u8; 256] {
    let mut b = [0u8; 256];
    SaRepr::request(
        Method::GetTable,
        attr::PATH_RECORD,
        tid,
        PathRecordMask::SGID.0,
    )
    .emit(&mut SaPacket::new_unchecked(&mut b[..]));
    b[56 + 24..56 + 40].copy_from_slice(sgid);
    b
}

fn path_get(tid: u64, sgid: &[u8; 16], dlid: u16) -> [u8; 256] {
    let mut b = [0u8; 256];
    SaRepr::request(
        Method::Get,
        attr::PATH_RECORD,
        tid,
        PathRecordMask::SGID.0 | PathRecordMask::DLID.0,
    )
    .emit(&mut SaPacket::new_unchecked(&mut b[..]));
    b[56 + 24..56 + 40].copy_from_slice(sgid);
    b[56 + 40..56 + 42].copy_from_slice(&dlid.to_be_bytes());
    b
}

/// What one GetTable run saw.
struct Run {
    result: Result<Vec<u8>, Failure>,
    segments_taken: u32,
    dropped: u32,
    acks_sent: u32,
    elapsed: Duration,
}

/// Sends a half-world GetTable and runs a receiver with `cap` bytes of storage over what
/// arrives; `drop_first(k)` says whether to lose the k-th first delivery of a segment.
fn get_table(
    a: &mut Agent,
    sm: u16,
    tid: u64,
    sgid: &[u8; 16],
    cap: usize,
    mut drop_first: impl FnMut(u32) -> bool,
) -> Run {
    let t0 = Instant::now();
    let now = || t0.elapsed().as_millis() as u64;
    let mut rx = Receiver::new(vec![0u8; cap], Config::DEFAULT);
    rx.start(now(), tid);
    a.send(sm, &half_world(tid, sgid));
    let mut seen = BTreeSet::new();
    let (mut firsts, mut dropped, mut taken, mut acks) = (0u32, 0u32, 0u32, 0u32);
    loop {
        assert!(t0.elapsed() < Duration::from_secs(30), "no ending in 30 s");
        let got = a.recv(50);
        let mut ended = None;
        if let Some(m) = got {
            let seg = u32::from_be_bytes([m[28], m[29], m[30], m[31]]);
            let data = m[25] == 1;
            if data && seen.insert(seg) {
                firsts += 1;
                if drop_first(firsts) {
                    dropped += 1;
                    continue;
                }
            }
            match rx.handle_receive(now(), &m) {
                Progress::Accepted { .. } => taken += 1,
                Progress::Done { .. } => {
                    taken += 1;
                    ended = Some(Ok(rx.payload().expect("done").to_vec()));
                }
                Progress::Failed(f) => ended = Some(Err(f)),
                Progress::Ignored(_) => {}
            }
        } else if rx.poll_timeout().is_some_and(|t| t <= now()) {
            if let Some(f) = rx.handle_timeout(now()) {
                ended = Some(Err(f));
            }
        }
        while let Some(out) = rx.poll_transmit() {
            acks += 1;
            a.send(sm, &out);
        }
        if let Some(result) = ended {
            return Run {
                result,
                segments_taken: taken,
                dropped,
                acks_sent: acks,
                elapsed: t0.elapsed(),
            };
        }
    }
}

fn wait_stats(f: &Fabric, key: &str, want: u64) -> BTreeMap<String, u64> {
    let t = Instant::now();
    loop {
        let s = f.rmpp_stats().expect("stats");
        if s.get(key).copied().unwrap_or(0) >= want || t.elapsed() > Duration::from_secs(5) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn half_world_path_tables_through_the_gsi_bridge_whole_lossy_and_stopped() {
    let f = Fabric::builder(topology(), ["Hca2"])
        .sm_node("Hca1")
        .name_prefix("rmpp-gsi")
        .start_daemons(false)
        .start()
        .unwrap_or_else(|e| panic!("fabric bring-up failed: {e}"));
    let mut a = Agent::start(&f, "Hca2");
    let r = a.cmd(&format!("init {GSI_QKEY:#x} 256"));
    let w: Vec<&str> = r.split_whitespace().collect();
    assert!(w.len() == 4 && w[0] == "ok", "init: {r}");
    let lid: u16 = w[1].parse().expect("lid");
    let gid = unhex(w[3]);
    let sgid: [u8; 16] = gid.as_slice().try_into().expect("16-byte GID");
    assert_eq!(a.cmd("recv 200"), "ok");
    let p = a.cmd("port");
    let sm: u16 = p
        .split_whitespace()
        .nth(2)
        .expect("sm lid")
        .parse()
        .expect("sm");
    assert_ne!(sm, 0, "{p}");

    // 1. The whole table, no loss.
    let tid = 0x7a11_0000_0000_0001u64; // bits 48-63 set: ibsim rewrites them in flight
    let run = get_table(&mut a, sm, tid, &sgid, 64 * 1024, |_| false);
    let table = run
        .result
        .unwrap_or_else(|e| panic!("GetTable failed: {e:?}"));
    assert_eq!(table.len() % 64, 0);
    let records: Vec<&[u8]> = table.chunks(64).collect();
    let segments = table.len().div_ceil(200) as u32;
    eprintln!(
        "half-world table: {} records, {segments} segments, {} ACKs, {:?}",
        records.len(),
        run.acks_sent,
        run.elapsed
    );
    assert_eq!(records.len(), PORTS, "one PathRecord per port with a LID");
    assert!(segments >= 10, "{segments} segments");
    assert_eq!(run.segments_taken, segments);
    for r in &records {
        assert_eq!(&r[24..40], &sgid, "SGID");
        assert_eq!(be16(r, 42), lid, "SLID");
    }
    let dlids: BTreeSet<u16> = records.iter().map(|r| be16(r, 40)).collect();
    assert_eq!(dlids.len(), PORTS, "distinct DLIDs");

    // Single Gets for every LID up to past the last one: exactly the table's DLIDs answer,
    // each with the same PathRecord.
    let max = *dlids.last().expect("dlids") + 8;
    let mut answered = BTreeSet::new();
    for (k, dlid) in (1..=max).enumerate() {
        let t = 0x6e70_0000_0001_0000 + k as u64;
        a.send(sm, &path_get(t, &sgid, dlid));
        let m = loop {
            let m = a.recv(5000).expect("GetResp");
            if u64::from_be_bytes(m[8..16].try_into().expect("tid")) == t {
                break m;
            }
        };
        assert_eq!(m[3], 0x81, "GetResp");
        if be16(&m, 4) != 0 {
            continue; // no record: no port at this LID
        }
        answered.insert(dlid);
        let rec = records
            .iter()
            .find(|r| be16(r, 40) == dlid)
            .unwrap_or_else(|| panic!("the Get for DLID {dlid} answered, the table has none"));
        assert_eq!(&m[56..120], *rec, "DLID {dlid}: Get and table agree");
    }
    assert_eq!(
        answered, dlids,
        "LIDs answering single Gets = the table's DLIDs"
    );
    let s = wait_stats(&f, "completed", 1);
    assert_eq!(s.get("transfers"), Some(&1), "{s:?}");
    assert_eq!(s.get("completed"), Some(&1), "{s:?}");
    assert_eq!(s.get("last_segments"), Some(&u64::from(segments)), "{s:?}");
    assert_eq!(s.get("segments_resent"), Some(&0), "{s:?}");
    assert_eq!(s.get("stray_controls"), Some(&0), "{s:?}");
    eprintln!("sender: {s:?}");

    // 2. Every 4th first delivery of a segment lost: go-back-N through the real shim.
    let run = get_table(&mut a, sm, tid + 1, &sgid, 64 * 1024, |k| k % 4 == 0);
    let lossy = run
        .result
        .unwrap_or_else(|e| panic!("lossy GetTable failed: {e:?}"));
    assert!(run.dropped >= 3, "{} dropped", run.dropped);
    assert_eq!(lossy, table, "the same bytes through losses");
    let s = wait_stats(&f, "completed", 2);
    assert_eq!(s.get("completed"), Some(&2), "{s:?}");
    assert!(
        s.get("segments_resent").copied().unwrap_or(0) >= u64::from(run.dropped),
        "{s:?}"
    );
    eprintln!(
        "lossy: {} dropped, {:?}, sender {s:?}",
        run.dropped, run.elapsed
    );

    // 3. Room for 10 records: the receiver STOPs, the sender stops sending.
    let run = get_table(&mut a, sm, tid + 2, &sgid, 64 * 10, |_| false);
    match run.result {
        Err(Failure::TooBig { records_needed, .. }) => {
            assert_eq!(records_needed, Some(PORTS as u32))
        }
        other => panic!("want TooBig, got {other:?}"),
    }
    let s = wait_stats(&f, "stopped", 1);
    assert_eq!(s.get("stopped"), Some(&1), "{s:?}");
    assert_eq!(s.get("stops_received"), Some(&1), "{s:?}");
    let sent_before = s["segments_sent"];
    // Longer than every retry of the sender (5 × 200 ms): nothing more arrives.
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_millis(1600) {
        if let Some(m) = a.recv(200) {
            panic!("a MAD after STOP: {}", hex(&m[..36]));
        }
    }
    let s = f.rmpp_stats().expect("stats");
    assert_eq!(s["segments_sent"], sent_before, "{s:?}");
    assert_eq!(s.get("active"), Some(&0), "{s:?}");
    assert_eq!(s.get("panics"), Some(&0), "{s:?}");

    // 4. An ACK for no transfer is taken by the sender: OpenSM (which would read it as a new
    //    GetTable and send the whole table) never sees it.
    let mut stray = half_world(tid + 3, &sgid);
    stray[24..36].copy_from_slice(&[1, 2, (0x1f << 3) | 1, 0, 0, 0, 0, 1, 0, 0, 0, 2]);
    a.send(sm, &stray);
    if let Some(m) = a.recv(1000) {
        panic!("an answer to a stray ACK: {}", hex(&m[..36]));
    }
    let s = wait_stats(&f, "stray_controls", 1);
    assert_eq!(s.get("stray_controls"), Some(&1), "{s:?}");
    assert_eq!(s.get("transfers"), Some(&3), "no new transfer: {s:?}");
    drop(a);
}
