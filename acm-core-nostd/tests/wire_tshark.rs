//! Wireshark (tshark 4.0) as an independent decoder of our SA MADs.
//!
//! Each MAD is wrapped in an InfiniBand UD frame (LRH + BTH + DETH + MAD + ICRC + VCRC) inside
//! an ERF record of type 21 (pcap LINKTYPE_ERF 197), then `tshark -T fields` prints the MAD,
//! SA, PathRecord and MCMemberRecord fields, which must equal what we emitted or parsed.
//! Needs the `tshark` package.

use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::process::Command;

use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::mad::{MadStatus, Method};
use acm_core_nostd::wire::mcmember::{AcmMgid, McMemberMask, McMemberRecord, McMemberRepr};
use acm_core_nostd::wire::path_record::{PathRecord, PathRecordQuery, PathRecordRepr};
use acm_core_nostd::wire::sa::{SaPacket, SaRepr};
use acm_core_nostd::wire::Selector;

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One UD GMP frame: LRH(8) BTH(12) DETH(8) MAD(256) ICRC(4) VCRC(2) = 290 bytes.
fn ib_frame(mad: &[u8; 256], dlid: u16, slid: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(290);
    let words = ((8 + 12 + 8 + 256 + 4) / 4) as u16;
    f.extend_from_slice(&[0x00, 0x02]); // VL 0, LVer 0; SL 0, LNH 2 (IBA local)
    f.extend_from_slice(&dlid.to_be_bytes());
    f.extend_from_slice(&words.to_be_bytes());
    f.extend_from_slice(&slid.to_be_bytes());
    f.extend_from_slice(&[0x64, 0x00, 0xff, 0xff]); // UD SEND only, P_Key 0xffff
    f.extend_from_slice(&[0, 0, 0, 1]); // DestQP 1
    f.extend_from_slice(&[0, 0, 0, 7]); // PSN 7
    f.extend_from_slice(&0x8001_0000u32.to_be_bytes()); // Q_Key
    f.extend_from_slice(&[0, 0, 0, 1]); // SrcQP 1
    f.extend_from_slice(mad);
    f.extend_from_slice(&[0; 6]); // ICRC, VCRC (not checked by Wireshark)
    f
}

fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    p.extend_from_slice(&2u16.to_le_bytes());
    p.extend_from_slice(&4u16.to_le_bytes());
    p.extend_from_slice(&[0; 8]);
    p.extend_from_slice(&65535u32.to_le_bytes());
    p.extend_from_slice(&197u32.to_le_bytes()); // LINKTYPE_ERF
    for (i, f) in frames.iter().enumerate() {
        let rec_len = 16 + f.len();
        p.extend_from_slice(&(1_700_000_000u32 + i as u32).to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&(rec_len as u32).to_le_bytes());
        p.extend_from_slice(&(rec_len as u32).to_le_bytes());
        // ERF header: timestamp (LE), type 21 = INFINIBAND, flags, rlen, lctr, wlen.
        p.extend_from_slice(&(((1_700_000_000u64 + i as u64) << 32).to_le_bytes()));
        p.extend_from_slice(&[21, 0x04]);
        p.extend_from_slice(&(rec_len as u16).to_be_bytes());
        p.extend_from_slice(&0u16.to_be_bytes());
        p.extend_from_slice(&(f.len() as u16).to_be_bytes());
        p.extend_from_slice(f);
    }
    p
}

const MAD_FIELDS: &[&str] = &[
    "infiniband.mad.baseversion",
    "infiniband.mad.mgmtclass",
    "infiniband.mad.classversion",
    "infiniband.mad.method",
    "infiniband.mad.status",
    "infiniband.mad.transactionid",
    "infiniband.mad.attributeid",
    "infiniband.mad.attributemodifier",
    "infiniband.sa.attributeoffset",
    "infiniband.sa.componentmask",
    "infiniband.sa.smkey",
];

const PR_FIELDS: &[&str] = &[
    "infiniband.pathrecord.dgid",
    "infiniband.pathrecord.sgid",
    "infiniband.pathrecord.dlid",
    "infiniband.pathrecord.slid",
    "infiniband.pathrecord.rawtraffic",
    "infiniband.pathrecord.flowlabel",
    "infiniband.pathrecord.hoplimit",
    "infiniband.pathrecord.tclass",
    "infiniband.pathrecord.reversible",
    "infiniband.pathrecord.numbpath",
    "infiniband.pathrecord.p_key",
    "infiniband.pathrecord.sl",
    "infiniband.pathrecord.mtuselector",
    "infiniband.pathrecord.mtu",
    "infiniband.pathrecord.rateselector",
    "infiniband.pathrecord.rate",
    "infiniband.pathrecord.packetlifetimeselector",
    "infiniband.pathrecord.packetlifetime",
    "infiniband.pathrecord.preference",
];

const MCM_FIELDS: &[&str] = &[
    "infiniband.mcmemberrecord.mgid",
    "infiniband.mcmemberrecord.portgid",
    "infiniband.mcmemberrecord.q_key",
    "infiniband.mcmemberrecord.mlid",
    "infiniband.mcmemberrecord.mtuselector",
    "infiniband.mcmemberrecord.mtu",
    "infiniband.mcmemberrecord.tclass",
    "infiniband.mcmemberrecord.p_key",
    "infiniband.mcmemberrecord.rateselector",
    "infiniband.mcmemberrecord.rate",
    "infiniband.mcmemberrecord.packetlifetimeselector",
    "infiniband.mcmemberrecord.packetlifetime",
    "infiniband.mcmemberrecord.sl",
    "infiniband.mcmemberrecord.flowlabel",
    "infiniband.mcmemberrecord.hoplimit",
    "infiniband.mcmemberrecord.scope",
    "infiniband.mcmemberrecord.joinstate",
    "infiniband.mcmemberrecord.proxyjoin",
];

/// Runs tshark over the frames and returns, per frame, field → value.
fn tshark(frames: &[Vec<u8>]) -> Vec<HashMap<String, String>> {
    let dir = std::env::temp_dir().join(format!("acm-wire-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _guard = Scratch(dir.clone());
    let file = dir.join("mads.pcap");
    std::fs::write(&file, pcap(frames)).unwrap();
    let fields: Vec<&str> = MAD_FIELDS
        .iter()
        .chain(PR_FIELDS)
        .chain(MCM_FIELDS)
        .copied()
        .collect();
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(&file)
        .args(["-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]);
    for f in &fields {
        cmd.args(["-e", f]);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run tshark ({e}); install the `tshark` package"));
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<_> = text
        .lines()
        .map(|l| {
            fields
                .iter()
                .zip(l.split('\t'))
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>()
        })
        .collect();
    assert_eq!(rows.len(), frames.len(), "tshark output:\n{text}");
    rows
}

/// tshark prints integers in decimal or 0x-hex depending on the field; normalise.
fn num(row: &HashMap<String, String>, k: &str) -> u64 {
    let v = row
        .get(k)
        .unwrap_or_else(|| panic!("tshark did not decode {k}: {row:?}"));
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => v.parse().unwrap_or_else(|_| panic!("{k} = {v}")),
    }
}

fn ip6(row: &HashMap<String, String>, k: &str) -> Gid {
    let v = row
        .get(k)
        .unwrap_or_else(|| panic!("tshark did not decode {k}"));
    Gid(v.parse::<Ipv6Addr>().unwrap().octets())
}

fn check_header(row: &HashMap<String, String>, sa: &SaRepr) {
    let h = &sa.header;
    assert_eq!(
        num(row, "infiniband.mad.baseversion"),
        h.base_version as u64
    );
    assert_eq!(
        num(row, "infiniband.mad.mgmtclass"),
        u8::from(h.mgmt_class) as u64
    );
    assert_eq!(
        num(row, "infiniband.mad.classversion"),
        h.class_version as u64
    );
    assert_eq!(num(row, "infiniband.mad.method"), u8::from(h.method) as u64);
    assert_eq!(num(row, "infiniband.mad.status"), h.status.0 as u64);
    assert_eq!(num(row, "infiniband.mad.transactionid"), h.tid);
    assert_eq!(num(row, "infiniband.mad.attributeid"), h.attr_id as u64);
    assert_eq!(
        num(row, "infiniband.mad.attributemodifier"),
        h.attr_mod as u64
    );
    assert_eq!(
        num(row, "infiniband.sa.attributeoffset"),
        sa.attr_offset as u64
    );
    assert_eq!(num(row, "infiniband.sa.componentmask"), sa.comp_mask);
    assert_eq!(num(row, "infiniband.sa.smkey"), sa.sm_key);
}

/// Compares each `infiniband.<record>.<field>` of a tshark row with our value.
fn check_fields(row: &HashMap<String, String>, record: &str, pairs: &[(&str, u64)]) {
    for (k, v) in pairs {
        assert_eq!(
            num(row, &format!("infiniband.{record}.{k}")),
            *v,
            "{record} {k}"
        );
    }
}

fn check_path(row: &HashMap<String, String>, p: &PathRecordRepr) {
    assert_eq!(ip6(row, "infiniband.pathrecord.dgid"), p.dgid);
    assert_eq!(ip6(row, "infiniband.pathrecord.sgid"), p.sgid);
    let pairs: &[(&str, u64)] = &[
        ("dlid", p.dlid as u64),
        ("slid", p.slid as u64),
        ("rawtraffic", p.raw_traffic as u64),
        ("flowlabel", p.flow_label as u64),
        ("hoplimit", p.hop_limit as u64),
        ("tclass", p.tclass as u64),
        ("reversible", p.reversible as u64),
        ("numbpath", p.num_path as u64),
        ("p_key", p.pkey as u64),
        ("sl", p.sl as u64),
        ("mtuselector", p.mtu_selector.bits() as u64),
        ("mtu", p.mtu as u64),
        ("rateselector", p.rate_selector.bits() as u64),
        ("rate", p.rate as u64),
        (
            "packetlifetimeselector",
            p.packet_life_selector.bits() as u64,
        ),
        ("packetlifetime", p.packet_life as u64),
        ("preference", p.preference as u64),
    ];
    check_fields(row, "pathrecord", pairs);
}

fn check_mcm(row: &HashMap<String, String>, m: &McMemberRepr) {
    assert_eq!(ip6(row, "infiniband.mcmemberrecord.mgid"), m.mgid);
    assert_eq!(ip6(row, "infiniband.mcmemberrecord.portgid"), m.port_gid);
    let pairs: &[(&str, u64)] = &[
        ("q_key", m.qkey as u64),
        ("mlid", m.mlid as u64),
        ("mtuselector", m.mtu_selector.bits() as u64),
        ("mtu", m.mtu as u64),
        ("tclass", m.tclass as u64),
        ("p_key", m.pkey as u64),
        ("rateselector", m.rate_selector.bits() as u64),
        ("rate", m.rate as u64),
        (
            "packetlifetimeselector",
            m.packet_life_selector.bits() as u64,
        ),
        ("packetlifetime", m.packet_life as u64),
        ("sl", m.sl as u64),
        ("flowlabel", m.flow_label as u64),
        ("hoplimit", m.hop_limit as u64),
        ("scope", m.scope as u64),
        ("joinstate", m.join_state as u64),
        ("proxyjoin", m.proxy_join as u64),
    ];
    check_fields(row, "mcmemberrecord", pairs);
}

fn distinct_path() -> PathRecordRepr {
    PathRecordRepr {
        service_id: 0,
        dgid: Gid::from_parts(0xfe80_0000_0000_0001, 0x0002_c903_00ab_cdef),
        sgid: Gid::from_parts(0xfe80 << 48, 0x10_0007),
        dlid: 0xbeef,
        slid: 0x0102,
        raw_traffic: true,
        flow_label: 0xf_edcb,
        hop_limit: 0xfe,
        tclass: 0xa5,
        reversible: true,
        num_path: 0x7e,
        pkey: 0x8001,
        qos_class: 0,
        sl: 0xd,
        mtu_selector: Selector::LessThan,
        mtu: 5,
        rate_selector: Selector::Best,
        rate: 21,
        packet_life_selector: Selector::Exactly,
        packet_life: 0x3e,
        preference: 0xee,
    }
}

fn sa_mad(hdr: &SaRepr, data: impl FnOnce(&mut [u8])) -> [u8; 256] {
    let mut mad = [0u8; 256];
    hdr.emit(&mut SaPacket::new_unchecked(&mut mad[..]));
    data(SaPacket::new_unchecked(&mut mad[..]).data_mut());
    mad
}

fn fixture(name: &str) -> [u8; 256] {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&p)
        .unwrap()
        .try_into()
        .expect("256-byte fixture")
}

#[test]
fn tshark_decodes_our_sa_mads_identically() {
    // 1. PathRecord GET built with the query builder.
    let q = PathRecordQuery::new()
        .slid(4)
        .dlid(6)
        .sl(0)
        .reversible(true)
        .pkey(0xffff);
    let get = SaRepr::path_record_get(0x1234_5678, q.mask().bits());
    let get_mad = sa_mad(&get, |d| q.record().emit(&mut PathRecord::new_unchecked(d)));
    // 2. PathRecord GetResp with every field distinct and non-zero, SA status and SM_Key.
    let mut resp = SaRepr::path_record_get(0xabcd_ef01_2345_6789, 0);
    resp.header.method = Method::GetResp;
    resp.header.status = MadStatus::from_parts(0, 0);
    resp.header.attr_mod = 0x0102_0304;
    resp.sm_key = 0x0a0b_0c0d_0e0f_1011;
    resp.attr_offset = 8;
    let resp_mad = sa_mad(&resp, |d| {
        distinct_path().emit(&mut PathRecord::new_unchecked(d))
    });
    // 3. MCMemberRecord SET (ibacm join) with non-zero SL/flow/hop/lifetime/proxy.
    let mut join = McMemberRepr::acm_join(
        AcmMgid {
            pkey: 0x1234,
            tos: 0x10,
            rate: 17,
            mtu: 5,
        }
        .to_gid(),
        Gid::from_parts(0xfe80 << 48, 0x10_0004),
        0x9234,
        17,
        5,
    );
    join.sl = 0xb;
    join.flow_label = 0xabcde;
    join.hop_limit = 0x7f;
    join.packet_life_selector = Selector::LessThan;
    join.packet_life = 0x13;
    join.tclass = 0x44;
    join.mlid = 0xc00f;
    join.proxy_join = true;
    let set = SaRepr::mcmember_set(0x42, McMemberMask::ACM_JOIN.bits());
    let set_mad = sa_mad(&set, |d| join.emit(&mut McMemberRecord::new_unchecked(d)));
    // 4./5. OpenSM's replies (parsed by us; tshark must agree with our parse).
    let pr_fix = fixture("opensm_pr_get_lid_resp.bin");
    let mcm_fix = fixture("opensm_mcm_set_resp.bin");

    let frames: Vec<_> = [&get_mad, &resp_mad, &set_mad, &pr_fix, &mcm_fix]
        .iter()
        .map(|m| ib_frame(m, 1, 4))
        .collect();
    let rows = tshark(&frames);

    check_header(&rows[0], &get);
    check_path(&rows[0], q.record());
    check_header(&rows[1], &resp);
    check_path(&rows[1], &distinct_path());
    check_header(&rows[2], &set);
    check_mcm(&rows[2], &join);
    let parse = |m: &[u8; 256]| SaRepr::parse(&SaPacket::new_checked(&m[..]).unwrap()).unwrap();
    check_header(&rows[3], &parse(&pr_fix));
    check_path(
        &rows[3],
        &PathRecordRepr::parse_bytes(&pr_fix[56..]).unwrap(),
    );
    check_header(&rows[4], &parse(&mcm_fix));
    check_mcm(
        &rows[4],
        &McMemberRepr::parse_bytes(&mcm_fix[56..]).unwrap(),
    );
}
