//! The GSI bridge (docs/simverbs.md, "GSI bridge"): a UD QP under simverbs talks to OpenSM's
//! SA on QP1 through ibsim — SubnAdm Get(PathRecord), Set(InformInfo), Reports of traps 64/65
//! when a node's link goes down and up, ReportResponse — plus the drops a GSI would do.

mod common;
use common::{control, field, hex, port_guid, unhex, Agent, Fabric};
use std::time::{Duration, Instant};

const GSI_QKEY: u32 = 0x8001_0000;

/// A 256-byte SubnAdm MAD: base 1, class 3, version 2.
fn sa_mad(method: u8, attr: u16, tid: u64, comp_mask: u64, data: &[u8]) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[0] = 1;
    m[1] = 3;
    m[2] = 2;
    m[3] = method;
    m[8..16].copy_from_slice(&tid.to_be_bytes());
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    m[48..56].copy_from_slice(&comp_mask.to_be_bytes());
    m[56..56 + data.len()].copy_from_slice(data);
    m
}

fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}

fn be64(b: &[u8], o: usize) -> u64 {
    let mut t = [0u8; 8];
    t.copy_from_slice(&b[o..o + 8]);
    u64::from_be_bytes(t)
}

/// A received MAD with its work-completion fields.
struct Wc {
    line: String,
    mad: Vec<u8>,
}

impl Wc {
    fn num(&self, key: &str) -> u64 {
        field(&self.line, key)
            .unwrap_or_else(|| panic!("no {key} in {}", self.line))
            .parse()
            .expect("number")
    }
}

fn wait_mad(a: &mut Agent, ms: u32) -> Option<Wc> {
    let r = a.cmd(&format!("waitmad {ms}"));
    if r == "timeout" {
        return None;
    }
    assert!(r.starts_with("wc "), "waitmad: {r}");
    let mad = unhex(field(&r, "mad").unwrap_or(""));
    Some(Wc { line: r, mad })
}

fn mad_send(a: &mut Agent, dlid: u16, dqpn: u32, qkey: u32, bytes: &[u8]) {
    let r = a.cmd(&format!("madsend {dlid} {dqpn} {qkey:#x} {}", hex(bytes)));
    assert_eq!(r, "ok status=0", "send completion on {}", a.host);
}

/// `ok <lid> <sm_lid> <state>` of the agent's port.
fn sm_lid(a: &mut Agent) -> u16 {
    let r = a.cmd("port");
    let w: Vec<&str> = r.split_whitespace().collect();
    assert_eq!(w[0], "ok", "port: {r}");
    w[2].parse().expect("sm lid")
}

fn counters(f: &Fabric, host: &str, qpn: u32) -> String {
    let r = control(&f.name, host, &format!("counters {qpn}"));
    assert!(r.starts_with("ok "), "counters: {r}");
    r
}

fn counter(text: &str, key: &str) -> u64 {
    field(text, key)
        .unwrap_or_else(|| panic!("{key} missing in {text}"))
        .parse()
        .expect("counter")
}

/// PathRecord with SLID and DLID (component mask bits 4 and 5).
fn path_query(tid: u64, slid: u16, dlid: u16) -> [u8; 256] {
    let mut pr = [0u8; 64];
    pr[40..42].copy_from_slice(&dlid.to_be_bytes());
    pr[42..44].copy_from_slice(&slid.to_be_bytes());
    sa_mad(0x01, 0x0035, tid, (1 << 4) | (1 << 5), &pr)
}

/// InformInfo subscribing to generic trap `trap` (all types, any issuer, class-manager
/// producer), QPN `qpn`, RespTimeValue 19.
fn inform_info(trap: u16, qpn: u32, subscribe: bool) -> [u8; 36] {
    let mut ii = [0u8; 36];
    ii[16..18].copy_from_slice(&0xffffu16.to_be_bytes()); // LIDRangeBegin: ignore
    ii[22] = 1; // IsGeneric
    ii[23] = u8::from(subscribe);
    ii[24..26].copy_from_slice(&0xffffu16.to_be_bytes()); // Type: all
    ii[26..28].copy_from_slice(&trap.to_be_bytes());
    ii[28..32].copy_from_slice(&((qpn << 8) | 19).to_be_bytes());
    ii[32..36].copy_from_slice(&4u32.to_be_bytes()); // ProducerType 4: class manager
    ii
}

/// Waits for a Report(Notice) of `trap`; other MADs are returned in `others`.
fn wait_report(a: &mut Agent, trap: u16, within: Duration, others: &mut Vec<Wc>) -> Option<Wc> {
    let t = Instant::now();
    while t.elapsed() < within {
        let left = within.saturating_sub(t.elapsed()).as_millis().max(1) as u32;
        let wc = wait_mad(a, left)?;
        a.cmd("recv 1");
        if wc.mad[3] == 0x06 && be16(&wc.mad, 16) == 0x0002 && be16(&wc.mad, 56 + 4) == trap {
            return Some(wc);
        }
        others.push(wc);
    }
    None
}

#[test]
fn sa_path_record_get_through_the_gsi_bridge() {
    let f = Fabric::start("gsi-pr");
    let pcap = f.dir.join("gsi.pcap");
    let mut a = f.agent_env("Hca3", &[("SIMVERBS_PCAP", pcap.to_str().expect("utf-8"))]);
    let (lid, qpn, _) = a.init(GSI_QKEY, 64);
    assert_eq!(a.cmd("recv 8"), "ok");
    let sm = sm_lid(&mut a);
    assert_ne!(sm, 0);
    let dlid = 6; // Hca4 in net.2sw2path4hca
    let tid = 0xabcd_1234_0000_0042u64; // bits 48–63 set: ibsim overwrites them in flight
    mad_send(&mut a, sm, 1, GSI_QKEY, &path_query(tid, lid, dlid));
    let wc = wait_mad(&mut a, 5000).expect("GetResp(PathRecord) from the SA");
    let m = &wc.mad;
    assert_eq!(wc.num("status"), 0);
    assert_eq!(wc.num("len"), 40 + 256);
    assert_eq!(wc.num("src_qp"), 1, "{}", wc.line);
    assert_eq!(wc.num("slid"), u64::from(sm));
    assert_eq!(wc.num("sl"), 0);
    assert_eq!(wc.num("pkey_index"), 0);
    assert_eq!(wc.num("grh"), 0, "no GRH");
    assert_eq!(wc.num("grh_area"), 1, "GRH area untouched");
    assert_eq!(wc.num("qp"), u64::from(qpn));
    assert_eq!((m[0], m[1], m[2], m[3]), (1, 3, 2, 0x81), "GetResp");
    assert_eq!(be16(m, 4), 0, "MAD status");
    assert_eq!(be64(m, 8), tid, "our TID back, bits 48–63 included");
    assert_eq!(be16(m, 16), 0x0035);
    assert_eq!(be16(m, 56 + 40), dlid, "PathRecord DLID");
    assert_eq!(be16(m, 56 + 42), lid, "PathRecord SLID");
    // DGID = fe80::<Hca4 port GUID>
    assert_eq!(be64(m, 56 + 8), 0xfe80_0000_0000_0000);
    assert_eq!(be64(m, 56 + 16), port_guid("Hca4"));

    // A second query with another TID: both directions keep working on the one client.
    let tid2 = 0x0001_0000_0000_0043u64;
    mad_send(&mut a, sm, 1, GSI_QKEY, &path_query(tid2, lid, 5));
    let wc = wait_mad(&mut a, 5000).expect("second GetResp");
    assert_eq!(be64(&wc.mad, 8), tid2);
    assert_eq!(be16(&wc.mad, 56 + 40), 5);
    let c = counters(&f, "Hca3", qpn);
    assert_eq!(counter(&c, "gsi_sent"), 2, "{c}");
    assert_eq!(counter(&c, "gsi_received"), 2, "{c}");
    assert_eq!(counter(&c, "gsi_clients"), 1, "{c}");
    assert_eq!(a.quit(), Some(0), "clean destroy (bridge disconnected)");

    // SIMVERBS_PCAP holds both directions: our two Gets to QP1, the SA's two GetResps from
    // QP1 (ERF 16 + LRH 8 + BTH 12, then DETH: Q_Key, SrcQP; the MAD after it).
    let b = std::fs::read(&pcap).expect("pcap written");
    let mut frames = Vec::new();
    let mut o = 24;
    while o + 16 <= b.len() {
        let len = u32::from_le_bytes([b[o + 8], b[o + 9], b[o + 10], b[o + 11]]) as usize;
        frames.push(b[o + 16..o + 16 + len].to_vec());
        o += 16 + len;
    }
    let summary: Vec<(u32, u32, u8)> = frames
        .iter()
        .map(|fr| {
            let dest_qp = u32::from_be_bytes([0, fr[16 + 8 + 5], fr[16 + 8 + 6], fr[16 + 8 + 7]]);
            let src_qp = u32::from_be_bytes([0, fr[16 + 20 + 5], fr[16 + 20 + 6], fr[16 + 20 + 7]]);
            (dest_qp, src_qp, fr[16 + 28 + 3])
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, qpn, 0x01),
            (qpn, 1, 0x81),
            (1, qpn, 0x01),
            (qpn, 1, 0x81)
        ],
        "(DestQP, SrcQP, method) of each captured frame"
    );
}

#[test]
fn gsi_drops_wrong_qkey_and_length_and_unreachable_qp1() {
    let f = Fabric::start("gsi-drops");
    let mut a = f.agent("Hca3");
    let (lid, qpn, _) = a.init(GSI_QKEY, 64);
    assert_eq!(a.cmd("recv 8"), "ok");
    let sm = sm_lid(&mut a);
    // Wrong Q_Key on the send (MSB clear, so not the QP's own): the remote GSI drops it.
    mad_send(&mut a, sm, 1, 0x1111_1111, &path_query(0x10, lid, 6));
    // Not a 256-byte MAD: dropped too.
    mad_send(&mut a, sm, 1, GSI_QKEY, &path_query(0x11, lid, 6)[..100]);
    // QP1 of a node without an SM (Hca2, LID 4): ibsim finds nobody, the MAD is lost.
    mad_send(&mut a, 4, 1, GSI_QKEY, &path_query(0x12, lid, 6));
    assert!(wait_mad(&mut a, 1500).is_none(), "nothing may answer");
    let c = counters(&f, "Hca3", qpn);
    assert_eq!(counter(&c, "gsi_qkey_drops"), 1, "{c}");
    assert_eq!(counter(&c, "gsi_bad_length"), 1, "{c}");
    assert_eq!(counter(&c, "gsi_sent"), 1, "{c}");
    assert_eq!(counter(&c, "gsi_undelivered"), 1, "{c}");
    assert_eq!(counter(&c, "gsi_received"), 0, "{c}");
    // MSB set = the QP's own Q_Key (0x80010000): accepted, answered.
    mad_send(&mut a, sm, 1, 0x8000_0000, &path_query(0x13, lid, 6));
    let wc = wait_mad(&mut a, 5000).expect("answer to the MSB-Q_Key send");
    assert_eq!(be64(&wc.mad, 8), 0x13);

    // A QP with a Q_Key of its own: remote Q_Key 0x80010000 has the MSB set, so the send
    // uses the QP's Q_Key (IBA 10.2.5) and the GSI drops it — only a QP whose own Q_Key is
    // the GSI's can talk to QP1.
    let mut b = f.agent("Hca2");
    let (blid, bqpn, _) = b.init(0x1111_1111, 64);
    assert_eq!(b.cmd("recv 8"), "ok");
    mad_send(&mut b, sm, 1, GSI_QKEY, &path_query(0x20, blid, 6));
    assert!(wait_mad(&mut b, 1000).is_none(), "nothing may answer");
    let c = counters(&f, "Hca2", bqpn);
    assert_eq!(counter(&c, "gsi_qkey_drops"), 1, "{c}");
    assert_eq!(
        counter(&c, "gsi_clients"),
        1,
        "the port's one ibsim client, whatever its QPs send"
    );
    assert_eq!(a.quit(), Some(0));
    assert_eq!(b.quit(), Some(0));
}

#[test]
fn inform_info_reports_traps_65_and_64_on_unlink_and_relink() {
    let f = Fabric::start("gsi-inform");
    let mut a = f.agent("Hca3");
    let (lid, qpn, _) = a.init(GSI_QKEY, 64);
    assert_eq!(a.cmd("recv 16"), "ok");
    let sm = sm_lid(&mut a);
    for (i, trap) in [64u16, 65].into_iter().enumerate() {
        let tid = 0x5a5a_0000_0000_0100 + i as u64;
        let set = sa_mad(0x02, 0x0003, tid, 0, &inform_info(trap, qpn, true));
        mad_send(&mut a, sm, 1, GSI_QKEY, &set);
        let wc = wait_mad(&mut a, 5000).expect("GetResp(InformInfo)");
        a.cmd("recv 1");
        let m = &wc.mad;
        if be16(m, 4) != 0 {
            std::thread::sleep(Duration::from_secs(2)); // OpenSM writes its log in bursts
            eprintln!("{}", osm_log_lines(&f, &["ERR", "nform"]));
        }
        assert_eq!(m[3], 0x81, "GetResp: {}", wc.line);
        assert_eq!(be16(m, 4), 0, "status of Set(InformInfo) trap {trap}");
        assert_eq!(be64(m, 8), tid);
        assert_eq!(be16(m, 16), 0x0003);
        assert_eq!(m[56 + 23], 1, "subscribe echoed");
        assert_eq!(be16(m, 56 + 26), trap);
    }
    let _ = lid;

    // Hca4's link goes down: OpenSM's sweep drops its port and reports trap 65.
    let t = Instant::now();
    f.port_down("Hca4");
    let mut others = Vec::new();
    let r65 = wait_report(&mut a, 65, Duration::from_secs(20), &mut others)
        .unwrap_or_else(|| panic!("no Report(trap 65); other MADs: {:?}", lines(&others)));
    let d65 = t.elapsed();
    let m = &r65.mad;
    assert_eq!((m[1], m[2], m[3]), (3, 2, 0x06), "SubnAdm Report");
    assert_eq!(r65.num("src_qp"), 1);
    assert_eq!(r65.num("slid"), u64::from(sm));
    assert_eq!(m[56] & 0x80, 0x80, "generic notice");
    // DataDetails of traps 64-67: 6 reserved bytes, then the GID.
    assert_eq!(be64(m, 56 + 16), 0xfe80_0000_0000_0000);
    assert_eq!(
        be64(m, 56 + 24),
        port_guid("Hca4"),
        "GID of the dropped port"
    );
    // ReportResponse with the same TID retires OpenSM's transaction.
    let mut resp = [0u8; 256];
    resp.copy_from_slice(m);
    resp[3] = 0x86;
    mad_send(&mut a, sm, 1, GSI_QKEY, &resp);

    // Relink: OpenSM brings the port back and reports trap 64 for the new port.
    let t = Instant::now();
    f.port_up("Hca4");
    let r64 = wait_report(&mut a, 64, Duration::from_secs(20), &mut others)
        .unwrap_or_else(|| panic!("no Report(trap 64); other MADs: {:?}", lines(&others)));
    let d64 = t.elapsed();
    assert_eq!(
        be64(&r64.mad, 56 + 24),
        port_guid("Hca4"),
        "GID of the new port"
    );
    assert_ne!(be64(&r64.mad, 8), be64(m, 8), "a new TID per Report");
    // No ReportResponse this time: does OpenSM send the Report again?
    let mut again = Vec::new();
    let repeat = wait_report(&mut a, 64, Duration::from_secs(4), &mut again);
    eprintln!(
        "gsi-inform: trap 65 {d65:?} after Unlink, trap 64 {d64:?} after ReLink (incl. \
         waiting for ACTIVE); unanswered trap 64 repeated within 4 s: {}; other MADs: {:?}",
        repeat.is_some(),
        lines(&others)
    );
    let c = counters(&f, "Hca3", qpn);
    assert_eq!(counter(&c, "qkey_violations"), 0, "{c}");
    assert_eq!(counter(&c, "no_recv_wr"), 0, "{c}");

    // Receive-side Q_Key check: the QP changes its Q_Key; the next Report (trap 65 of another
    // unlink, sent with the GSI Q_Key 0x80010000) arrives at the QP and is dropped.
    let received = counter(&c, "gsi_received");
    assert_eq!(a.cmd("qkey 0x11111111"), "ok");
    f.port_down("Hca4");
    let t = Instant::now();
    let c = loop {
        let c = counters(&f, "Hca3", qpn);
        if counter(&c, "gsi_received") > received {
            break c;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no Report after the 2nd Unlink: {c}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(counter(&c, "qkey_violations") >= 1, "{c}");
    assert!(
        wait_mad(&mut a, 500).is_none(),
        "a Q_Key violation must not complete"
    );
    if std::env::var_os("SVT_OPENSM_DEBUG").is_some() {
        // With OpenSM's debug log on: what it did with the Reports and our ReportResponse.
        std::thread::sleep(Duration::from_secs(1));
        eprintln!(
            "{}",
            osm_log_lines(&f, &["Report", "Forwarding Notice", "1A06"])
        );
    }
    assert_eq!(a.quit(), Some(0));
}

fn lines(v: &[Wc]) -> Vec<String> {
    v.iter()
        .map(|w| {
            format!(
                "method={:#x} attr={:#x} trap={}",
                w.mad[3],
                be16(&w.mad, 16),
                be16(&w.mad, 60)
            )
        })
        .collect()
}

/// Lines of OpenSM's log (first start) containing any of `keys`.
fn osm_log_lines(f: &Fabric, keys: &[&str]) -> String {
    let log = std::fs::read_to_string(f.dir.join("opensm").join("osm-1.log")).unwrap_or_default();
    log.lines()
        .filter(|l| keys.iter().any(|k| l.contains(k)))
        .collect::<Vec<_>>()
        .join("\n")
}
