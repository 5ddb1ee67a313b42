//! `SIMVERBS_PCAP` on real verbs traffic (tests/c/svagent.c on three simulated HCAs), decoded
//! by tshark's own InfiniBand dissector: one shared file written by two processes, one
//! per-process file (`%p`), every framing case (GRH / no GRH, immediate, PadCnt), capture
//! before the loss knob, failed sends not captured.
//!
//! Needs root, the Debian packages of docs/fabric.md, tshark, and `cargo build -p simverbs`.

mod common;
use common::{field, Agent, Fabric};
use std::path::Path;

const QKEY: u32 = 0x1111_1111;
const MGID: &str = "ff154001ffff00000000000000000002";
const MLID: u16 = 0xc011;

/// `init` → (lid, qpn).
fn init(a: &mut Agent) -> (u16, u32) {
    let (lid, qpn, _) = a.init(QKEY, 64);
    (lid, qpn)
}

const FIELDS: &[&str] = &[
    "infiniband.lrh.sl",
    "infiniband.lrh.lnh",
    "infiniband.lrh.dlid",
    "infiniband.lrh.slid",
    "infiniband.lrh.pktlen",
    "infiniband.grh.sgid",
    "infiniband.grh.dgid",
    "infiniband.grh.paylen",
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.padcnt",
    "infiniband.bth.p_key",
    "infiniband.bth.destqp",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.immdt",
    "data.data",
    "frame.len",
];

/// One row per frame: field name → value as tshark prints it.
fn tshark(pcap: &Path) -> Vec<std::collections::BTreeMap<&'static str, String>> {
    let mut c = std::process::Command::new("tshark");
    c.arg("-r")
        .arg(pcap)
        .args(["-T", "fields", "-E", "occurrence=f"]);
    for f in FIELDS {
        c.args(["-e", f]);
    }
    let o = c
        .output()
        .expect("tshark not found: apt-get install tshark");
    assert!(
        o.status.success(),
        "tshark -r {}: {}",
        pcap.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            FIELDS
                .iter()
                .copied()
                .zip(l.split('\t').map(String::from))
                .collect()
        })
        .collect()
}

fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse().unwrap_or_else(|_| panic!("{s:?}")),
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn pcap_of_unicast_multicast_imm_padding_loss_shared_and_per_process() {
    let f = Fabric::start("capture");
    let shared = f.dir.join("shared.pcap");
    let per = f.dir.join("per-%p.pcap");
    let (shared_s, per_s) = (shared.to_str().unwrap(), per.to_str().unwrap());
    // Hca2 and Hca3 append to one file; Hca4 writes its own and loses every datagram.
    let mut a = f.agent_env("Hca2", &[("SIMVERBS_PCAP", shared_s)]);
    let mut b = f.agent_env("Hca3", &[("SIMVERBS_PCAP", shared_s)]);
    let mut c = f.agent_env("Hca4", &[("SIMVERBS_PCAP", per_s), ("SIMVERBS_LOSS", "1")]);
    let ((alid, aqp), (blid, bqp), (clid, cqp)) = (init(&mut a), init(&mut b), init(&mut c));
    for x in [&mut a, &mut b, &mut c] {
        assert_eq!(x.cmd("recv 8"), "ok");
    }
    for x in [&mut a, &mut c] {
        assert_eq!(x.cmd(&format!("attach {MGID} {MLID}")), "ok");
    }

    // 1. Hca2 → Hca3 unicast with immediate, 5 bytes (PadCnt 3).
    assert_eq!(
        a.cmd(&format!("send {blid} {bqp} {QKEY:#x} hello 3735928559")),
        "ok status=0"
    );
    assert_eq!(field(&b.cmd("wait 3000"), "data"), Some("hello"));
    // 2. Hca3 → group (GRH), 12 bytes (PadCnt 0); Hca2 and Hca4 receive: one record.
    assert_eq!(
        b.cmd(&format!("msend {MLID} {MGID} {QKEY:#x} group-hello!")),
        "ok status=0"
    );
    assert_eq!(field(&a.cmd("wait 3000"), "data"), Some("group-hello!"));
    assert_eq!(field(&c.cmd("wait 3000"), "data"), Some("group-hello!"));
    // 3. Hca4 → Hca2, lost by Hca4's loss knob: captured all the same (at the sending port).
    assert_eq!(
        c.cmd(&format!("send {alid} {aqp} {QKEY:#x} into-the-void")),
        "ok status=0"
    );
    assert_eq!(a.cmd("wait 300"), "timeout");
    // 4. A failed send (SGE past the MR: LOC_PROT_ERR, the QP goes to error) is not captured.
    let bad = a.cmd(&format!("sendbad {blid} {bqp} {QKEY:#x}"));
    assert_eq!(bad, "ok status=4");
    let cpid = c.pid();
    for x in [a, b, c] {
        let host = x.host.clone();
        assert_eq!(x.quit(), Some(0), "svagent exit on {host}");
    }

    // The shared file: one global header, then two whole records in send order.
    let bytes = std::fs::read(&shared).unwrap();
    assert_eq!(&bytes[..4], &0xa1b2_c3d4u32.to_le_bytes());
    assert_eq!(&bytes[20..24], &197u32.to_le_bytes(), "LINKTYPE_ERF");
    let rows = tshark(&shared);
    assert_eq!(rows.len(), 2, "{rows:#?}");
    let (u, m) = (&rows[0], &rows[1]);
    assert_eq!(num(&u["infiniband.lrh.lnh"]), 2, "no GRH: {u:?}");
    assert_eq!(num(&u["infiniband.lrh.sl"]), 2, "the AH's SL");
    assert_eq!(num(&u["infiniband.lrh.slid"]), u64::from(alid));
    assert_eq!(num(&u["infiniband.lrh.dlid"]), u64::from(blid));
    assert_eq!(
        num(&u["infiniband.bth.opcode"]),
        0x65,
        "SEND only with immediate"
    );
    assert_eq!(num(&u["infiniband.bth.padcnt"]), 3);
    assert_eq!(num(&u["infiniband.bth.destqp"]), u64::from(bqp));
    assert_eq!(num(&u["infiniband.bth.p_key"]), 0xffff);
    assert_eq!(num(&u["infiniband.deth.q_key"]), u64::from(QKEY));
    assert_eq!(num(&u["infiniband.deth.srcqp"]), u64::from(aqp));
    assert_eq!(u["infiniband.immdt"], "deadbeef", "ImmDt in network order");
    assert_eq!(
        u["data.data"],
        format!("{}000000", hex("hello")),
        "payload + pad"
    );
    // PktLen covers LRH..ICRC; the frame (ERF wire length) adds the 2-byte VCRC.
    let pktlen = num(&u["infiniband.lrh.pktlen"]);
    assert_eq!(pktlen * 4, 8 + 12 + 8 + 4 + 8 + 4);
    assert_eq!(num(&u["frame.len"]), pktlen * 4 + 2);

    assert_eq!(num(&m["infiniband.lrh.lnh"]), 3, "GRH: {m:?}");
    assert_eq!(num(&m["infiniband.lrh.slid"]), u64::from(blid));
    assert_eq!(num(&m["infiniband.lrh.dlid"]), u64::from(MLID));
    assert_eq!(
        m["infiniband.grh.dgid"]
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
        u128::from_str_radix(MGID, 16).unwrap().to_be_bytes()
    );
    assert!(m["infiniband.grh.sgid"].starts_with("fe80::"), "{m:?}");
    assert_eq!(num(&m["infiniband.grh.paylen"]), 12 + 8 + 12 + 4);
    assert_eq!(num(&m["infiniband.bth.opcode"]), 0x64);
    assert_eq!(num(&m["infiniband.bth.padcnt"]), 0);
    assert_eq!(num(&m["infiniband.bth.destqp"]), 0xff_ffff);
    assert_eq!(num(&m["infiniband.deth.srcqp"]), u64::from(bqp));
    assert_eq!(m["infiniband.immdt"], "");
    assert_eq!(m["data.data"], hex("group-hello!"));

    // The per-process file of Hca4: its lost datagram.
    let own = f.dir.join(format!("per-{cpid}.pcap"));
    let rows = tshark(&own);
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let l = &rows[0];
    assert_eq!(num(&l["infiniband.lrh.slid"]), u64::from(clid));
    assert_eq!(num(&l["infiniband.lrh.dlid"]), u64::from(alid));
    assert_eq!(num(&l["infiniband.deth.srcqp"]), u64::from(cqp));
    assert_eq!(l["data.data"], format!("{}000000", hex("into-the-void")));
    // No temporary header files left behind.
    let tmp: Vec<_> = std::fs::read_dir(&f.dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(tmp.is_empty(), "{tmp:?}");
}
