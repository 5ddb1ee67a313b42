//! Cross-checks the wire formats against the real, installed rdma-core headers:
//! `<infiniband/{sa.h,umad_types.h,umad_sa.h,umad_sa_mcm.h,acm.h}>`.
//!
//! * `tests/c/wire_layout.c` prints `sizeof`/`offsetof`; we find each field's offset by
//!   writing it through our setters into a zero buffer.
//! * `tests/c/wire_emit.c` fills the C structs with the headers' own helpers
//!   (`umad_sa_set_rate_mtu_or_life`, `umad_sa_mcm_set_sl_flow_hop`, ...) and prints bytes; we
//!   build the same messages and compare byte for byte.
//! * `tests/c/wire_read.c` reads our emitted bytes through the C structs and getters
//!   (`umad_sa_mcm_get_sl_flow_hop`, `umad_sa_mcm_get_proxy_join`, ...) and prints the fields.
//!
//! Needs a C compiler (`cc`) and libibumad-dev, libibverbs-dev, librdmacm-dev.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use acm_core_nostd::wire::client::{self, AcmMsg, AcmMsgRepr, EpAddrDataRepr, EpInfoType};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::mad::{MadStatus, Method, RmppRepr, RmppType};
use acm_core_nostd::wire::mcmember::{self, AcmMgid, McMemberMask, McMemberRecord, McMemberRepr};
use acm_core_nostd::wire::path_record::{PathRecord, PathRecordMask, PathRecordRepr};
use acm_core_nostd::wire::rate::{Mtu, Rate};
use acm_core_nostd::wire::sa::{self, SaPacket, SaRepr, SaStatus};
use acm_core_nostd::wire::Selector;

/// A scratch directory removed on drop (also when a test panics).
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("acm-wire-c-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create scratch dir");
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn compile(scratch: &Scratch, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let out = scratch.0.join(name);
    let status = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `cc` ({e}); install gcc and libibumad-dev libibverbs-dev librdmacm-dev"
            )
        });
    assert!(status.success(), "compiling {} failed", src.display());
    out
}

fn run(exe: &Path, stdin: &str) -> String {
    let mut child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run C helper");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{} failed: {:?}", exe.display(), out);
    String::from_utf8(out.stdout).unwrap()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn kv(s: &str) -> HashMap<String, String> {
    s.lines()
        .filter_map(|l| l.split_once(' ').or_else(|| l.split_once('=')))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Offset of the first byte a setter changes in a zeroed buffer.
fn offset_of(len: usize, set: impl FnOnce(&mut [u8])) -> usize {
    let mut b = vec![0u8; len];
    set(&mut b);
    b.iter()
        .position(|&x| x != 0)
        .expect("setter wrote nothing")
}

#[test]
fn layouts_match_installed_headers() {
    let s = Scratch::new("layout");
    let exe = compile(&s, "wire_layout");
    let c = kv(&run(&exe, ""));
    let num = |k: &str| -> usize {
        c.get(k)
            .unwrap_or_else(|| panic!("C did not print {k}"))
            .parse()
            .unwrap()
    };
    assert_eq!(
        num("sizeof_ibv_path_record"),
        acm_core_nostd::wire::path_record::PATH_RECORD_LEN
    );
    assert_eq!(
        num("sizeof_umad_hdr"),
        acm_core_nostd::wire::mad::HEADER_LEN
    );
    assert_eq!(
        num("sizeof_umad_rmpp_hdr"),
        acm_core_nostd::wire::mad::RMPP_LEN
    );
    assert_eq!(num("sizeof_umad_sa_packet"), sa::MAD_LEN);
    assert_eq!(num("umad_sa_packet.data"), sa::DATA_OFFSET);
    assert_eq!(num("UMAD_LEN_SA_DATA"), sa::DATA_LEN);
    assert_eq!(
        num("sizeof_umad_sa_mcmember_record"),
        mcmember::MCMEMBER_RECORD_LEN
    );
    assert_eq!(num("sizeof_acm_hdr"), client::HDR_LEN);
    assert_eq!(num("sizeof_acm_ep_addr_data"), client::EP_LEN);
    assert_eq!(num("sizeof_acm_msg"), client::MSG_LEN);
    assert_eq!(
        num("ACM_MSG_DATA_LENGTH"),
        client::MAX_ENTRIES * client::EP_LEN
    );

    let pr =
        |f: fn(&mut PathRecord<&mut [u8]>)| offset_of(64, |b| f(&mut PathRecord::new_unchecked(b)));
    let checks: &[(&str, usize)] = &[
        (
            "ibv_path_record.service_id",
            pr(|r| r.set_service_id(1 << 63)),
        ),
        ("ibv_path_record.dgid", pr(|r| r.set_dgid(Gid([1; 16])))),
        ("ibv_path_record.sgid", pr(|r| r.set_sgid(Gid([1; 16])))),
        ("ibv_path_record.dlid", pr(|r| r.set_dlid(0x100))),
        ("ibv_path_record.slid", pr(|r| r.set_slid(0x100))),
        (
            "ibv_path_record.flowlabel_hoplimit",
            pr(|r| r.set_flow(true, 0, 0)),
        ),
        ("ibv_path_record.tclass", pr(|r| r.set_tclass(1))),
        (
            "ibv_path_record.reversible_numpath",
            pr(|r| r.set_reversible_numpath(true, 0)),
        ),
        ("ibv_path_record.pkey", pr(|r| r.set_pkey(0x100))),
        (
            "ibv_path_record.qosclass_sl",
            pr(|r| r.set_qosclass_sl(0x800, 0)),
        ),
        (
            "ibv_path_record.mtu",
            pr(|r| r.set_mtu(Selector::Exactly, 1)),
        ),
        (
            "ibv_path_record.rate",
            pr(|r| r.set_rate(Selector::Exactly, 1)),
        ),
        (
            "ibv_path_record.packetlifetime",
            pr(|r| r.set_packet_life(Selector::Exactly, 1)),
        ),
        ("ibv_path_record.preference", pr(|r| r.set_preference(1))),
    ];
    for (k, ours) in checks {
        assert_eq!(num(k), *ours, "{k}");
    }
    let mc = |f: fn(&mut McMemberRecord<&mut [u8]>)| {
        offset_of(56, |b| f(&mut McMemberRecord::new_unchecked(b)))
    };
    let checks: &[(&str, usize)] = &[
        (
            "umad_sa_mcmember_record.portgid",
            mc(|r| r.set_port_gid(Gid([1; 16]))),
        ),
        ("umad_sa_mcmember_record.qkey", mc(|r| r.set_qkey(1 << 31))),
        ("umad_sa_mcmember_record.mlid", mc(|r| r.set_mlid(0xc000))),
        (
            "umad_sa_mcmember_record.mtu",
            mc(|r| r.set_mtu(Selector::Exactly, 0)),
        ),
        ("umad_sa_mcmember_record.tclass", mc(|r| r.set_tclass(1))),
        ("umad_sa_mcmember_record.pkey", mc(|r| r.set_pkey(0x8000))),
        (
            "umad_sa_mcmember_record.rate",
            mc(|r| r.set_rate(Selector::Exactly, 0)),
        ),
        (
            "umad_sa_mcmember_record.pkt_life",
            mc(|r| r.set_packet_life(Selector::Exactly, 0)),
        ),
        (
            "umad_sa_mcmember_record.sl_flow_hop",
            mc(|r| r.set_sl_flow_hop(1, 0, 0)),
        ),
        (
            "umad_sa_mcmember_record.scope_state",
            mc(|r| r.set_scope_state(5, 0)),
        ),
        (
            "umad_sa_mcmember_record.proxy_join",
            mc(|r| r.set_proxy_join(true)),
        ),
    ];
    for (k, ours) in checks {
        assert_eq!(num(k), *ours, "{k}");
    }
    let sa_off =
        |f: fn(&mut SaPacket<&mut [u8]>)| offset_of(256, |b| f(&mut SaPacket::new_unchecked(b)));
    assert_eq!(
        num("umad_sa_packet.sm_key"),
        sa_off(|p| p.set_sm_key(1 << 63))
    );
    assert_eq!(
        num("umad_sa_packet.attr_offset"),
        sa_off(|p| p.set_attr_offset(0x100))
    );
    assert_eq!(
        num("umad_sa_packet.comp_mask"),
        sa_off(|p| p.set_comp_mask(1 << 63))
    );
    assert_eq!(
        num("umad_hdr.tid"),
        sa_off(|p| p.header_mut().set_tid(1 << 63))
    );
    assert_eq!(
        num("umad_hdr.attr_id"),
        sa_off(|p| p.header_mut().set_attr_id(0x100))
    );
    assert_eq!(
        num("umad_hdr.attr_mod"),
        sa_off(|p| p.header_mut().set_attr_mod(1 << 31))
    );
    assert_eq!(
        num("umad_hdr.class_specific"),
        sa_off(|p| p.header_mut().set_class_specific(0x100))
    );
    assert_eq!(
        num("umad_rmpp_hdr.seg_num") + num("umad_sa_packet.rmpp_hdr"),
        sa_off(|p| p.rmpp_mut().set_seg_num(1 << 31))
    );
    let msg_off =
        |f: fn(&mut AcmMsg<&mut [u8]>)| offset_of(592, |b| f(&mut AcmMsg::new_unchecked(b)));
    assert_eq!(num("acm_hdr.length"), msg_off(|m| m.set_length_be(0x100)));
    assert_eq!(num("acm_hdr.tid"), msg_off(|m| m.set_tid(u64::MAX)));
    assert_eq!(num("acm_hdr.data"), msg_off(|m| m.set_src_out(1)));
    assert_eq!(
        num("acm_msg.resolve_data"),
        msg_off(|m| m.entry_mut(0).unwrap().set_flags(u32::MAX))
    );
    assert_eq!(
        num("acm_msg.resolve_data") + num("acm_ep_addr_data.type"),
        msg_off(|m| m.entry_mut(0).unwrap().set_info_type(EpInfoType::Path))
    );
}

fn c_path() -> PathRecordRepr {
    PathRecordRepr {
        service_id: 0x1122_3344_5566_7788,
        dgid: Gid::from_parts(0xfe80 << 48, 0x10_000a),
        sgid: Gid::from_parts(0xfe80 << 48, 0x10_0004),
        dlid: 6,
        slid: 4,
        raw_traffic: true,
        flow_label: 0x12345,
        hop_limit: 0x40,
        tclass: 0x0c,
        reversible: true,
        num_path: 1,
        pkey: 0xffff,
        qos_class: 0xabc,
        sl: 5,
        mtu_selector: Selector::Exactly,
        mtu: Mtu::Mtu2048.into(),
        rate_selector: Selector::Exactly,
        rate: Rate::Gbps10.into(),
        packet_life_selector: Selector::Exactly,
        packet_life: 18,
        preference: 1,
    }
}

#[test]
fn our_bytes_equal_c_helpers_bytes() {
    let s = Scratch::new("emit");
    let exe = compile(&s, "wire_emit");
    let c: HashMap<String, Vec<u8>> = kv(&run(&exe, ""))
        .into_iter()
        .map(|(k, v)| (k, unhex(&v)))
        .collect();

    assert_eq!(hex(&c_path().to_bytes()), hex(&c["path_record"]));

    let mut mad = [0u8; 256];
    let mask = PathRecordMask::DGID
        | PathRecordMask::SGID
        | PathRecordMask::DLID
        | PathRecordMask::SLID
        | PathRecordMask::SL;
    SaRepr::path_record_get(0x1234_5678, mask.bits())
        .emit(&mut SaPacket::new_unchecked(&mut mad[..]));
    c_path().emit(&mut PathRecord::new_unchecked(
        SaPacket::new_unchecked(&mut mad[..]).data_mut(),
    ));
    assert_eq!(hex(&mad), hex(&c["sa_path_get"]));

    let mut resp = SaRepr::path_record_get(0x1234_5678, mask.bits());
    resp.header.method = Method::GetResp;
    resp.header.status = MadStatus::from_parts(SaStatus::NoRecords.into(), 0x1c);
    resp.rmpp = RmppRepr {
        version: 1,
        rmpp_type: RmppType::Data,
        resp_time: 5,
        flags: 1,
        status: 0,
        seg_num: 1,
        paylen_newwin: 84,
    };
    resp.sm_key = 0x0102_0304_0506_0708;
    resp.attr_offset = 8;
    resp.emit(&mut SaPacket::new_unchecked(&mut mad[..]));
    assert_eq!(hex(&mad), hex(&c["sa_path_resp"]));

    let mut m = McMemberRepr::acm_join(
        AcmMgid {
            pkey: 0x7fff,
            tos: 0,
            rate: 3,
            mtu: 4,
        }
        .to_gid(),
        Gid::from_parts(0xfe80 << 48, 0x10_0004),
        0xffff,
        Rate::Gbps10.into(),
        Mtu::Mtu2048.into(),
    );
    m.mlid = 0xc001;
    m.packet_life_selector = Selector::LessThan;
    m.packet_life = 0x13;
    m.sl = 0xb;
    m.flow_label = 0xabcde;
    m.hop_limit = 0x7f;
    m.proxy_join = true;
    assert_eq!(hex(&m.to_bytes()), hex(&c["mcmember_record"]));
    let mut mad = [0u8; 256];
    SaRepr::mcmember_set(0x2a, McMemberMask::ACM_JOIN.bits())
        .emit(&mut SaPacket::new_unchecked(&mut mad[..]));
    m.emit(&mut McMemberRecord::new_unchecked(
        SaPacket::new_unchecked(&mut mad[..]).data_mut(),
    ));
    assert_eq!(hex(&mad), hex(&c["sa_mcm_set"]));

    // Resolve response through the provider's builder: request with a core-selected source.
    let mut req = [0u8; client::MSG_LEN];
    {
        let mut r = AcmMsg::new_unchecked(&mut req[..]);
        r.set_version(1);
        r.set_opcode_raw(1);
        r.set_length(88);
        r.set_tid(0x1122_3344_5566_7788);
        r.set_src_out(1);
        r.set_src_index(1);
        r.set_dst_index(0);
        let dst = EpAddrDataRepr {
            flags: client::EP_FLAG_DEST,
            info_type: EpInfoType::AddressIp,
            info: [0; 64],
        };
        dst.emit(&mut r.entry_mut(0).unwrap());
        let mut src = EpAddrDataRepr {
            flags: client::EP_FLAG_SOURCE,
            info_type: EpInfoType::AddressIp,
            info: [0; 64],
        };
        src.info[..4].copy_from_slice(&[10, 0, 0, 4]);
        src.emit(&mut r.entry_mut(1).unwrap());
    }
    let mut out = [0u8; client::MSG_LEN];
    let n = client::build_resolve_response(
        &AcmMsg::new_unchecked(&req[..]),
        &c_path().to_bytes(),
        &mut out,
    )
    .unwrap();
    assert_eq!(hex(&out[..n]), hex(&c["acm_resolve_resp"]));
    assert_eq!(hex(&req[88..160]), hex(&c["acm_ep_addr_data"]));

    let perf = client::PerfResponseRepr {
        status: client::Status::Success,
        ep_index: 1,
        tid: 9,
        count: 7,
        counters: [1000, 1001, 1002, 1003, 1004, 1005, 1006],
    };
    let mut out = [0u8; client::MSG_LEN];
    let n = perf.emit(&mut AcmMsg::new_unchecked(&mut out[..])).unwrap();
    assert_eq!(hex(&out[..n]), hex(&c["acm_perf_resp"]));
    // ...and the other way round.
    assert_eq!(
        client::PerfResponseRepr::parse(&AcmMsg::new_unchecked(&c["acm_perf_resp"][..])),
        Ok(perf)
    );
    let parsed = AcmMsgRepr::parse(&AcmMsg::new_unchecked(&c["acm_resolve_resp"][..])).unwrap();
    assert_eq!(parsed.count, 2);
    assert_eq!(parsed.entries[0].flags, client::RESPONSE_PATH_FLAGS);
    assert_eq!(
        PathRecordRepr::parse_bytes(&parsed.entries[0].info),
        Ok(c_path())
    );
}

/// Different values from `c_path`, so that the two directions do not share a blind spot.
fn rust_path() -> PathRecordRepr {
    PathRecordRepr {
        service_id: 0x0100_0000_0000_00fe,
        dgid: Gid::from_parts(0xfe80_0000_0000_0001, 0x0002_c903_00ab_cdef),
        sgid: Gid::from_parts(0xfe80 << 48, 0x10_0007),
        dlid: 0xbeef,
        slid: 0x0102,
        raw_traffic: false,
        flow_label: 0xf_edcb,
        hop_limit: 0xff,
        tclass: 0xa5,
        reversible: false,
        num_path: 0x7f,
        pkey: 0x8001,
        qos_class: 0x123,
        sl: 0xf,
        mtu_selector: Selector::LessThan,
        mtu: Mtu::Mtu4096.into(),
        rate_selector: Selector::Best,
        rate: Rate::Gbps400.into(),
        packet_life_selector: Selector::GreaterThan,
        packet_life: 0x3f,
        preference: 0xee,
    }
}

fn expect_path(p: &PathRecordRepr) -> String {
    format!(
        "service_id={:x}\ndgid={}\nsgid={}\ndlid={}\nslid={}\nraw_traffic={}\nflow_label={:x}\n\
         hop_limit={}\ntclass={}\nreversible={}\nnum_path={}\npkey={:x}\nqos_class={:x}\nsl={}\n\
         mtu_sel={}\nmtu={}\nrate_sel={}\nrate={}\nlife_sel={}\nlife={}\npreference={}\n",
        p.service_id,
        hex(&p.dgid.0),
        hex(&p.sgid.0),
        p.dlid,
        p.slid,
        u8::from(p.raw_traffic),
        p.flow_label,
        p.hop_limit,
        p.tclass,
        u8::from(p.reversible),
        p.num_path,
        p.pkey,
        p.qos_class,
        p.sl,
        p.mtu_selector.bits(),
        p.mtu,
        p.rate_selector.bits(),
        p.rate,
        p.packet_life_selector.bits(),
        p.packet_life,
        p.preference
    )
}

#[test]
fn c_getters_read_our_bytes() {
    let s = Scratch::new("read");
    let exe = compile(&s, "wire_read");
    let mut input = String::new();
    let mut expect = String::new();

    input += &format!("path_record {}\n", hex(&rust_path().to_bytes()));
    expect += "== path_record\n";
    expect += &expect_path(&rust_path());

    let mut mad = [0u8; 256];
    let mut hdr = SaRepr::path_record_get(0xdead_beef, 0x7f_ff7f);
    hdr.header.attr_mod = 0x0a0b_0c0d;
    hdr.header.status = MadStatus(0x0601);
    hdr.emit(&mut SaPacket::new_unchecked(&mut mad[..]));
    rust_path().emit(&mut PathRecord::new_unchecked(
        SaPacket::new_unchecked(&mut mad[..]).data_mut(),
    ));
    input += &format!("sa_path {}\n", hex(&mad));
    expect += "== sa_path\nbase_version=1\nmgmt_class=3\nclass_version=2\nmethod=1\nstatus=601\n\
               tid=deadbeef\nattr_id=35\nattr_mod=a0b0c0d\ncomp_mask=7fff7f\n";
    expect += &expect_path(&rust_path());

    let m = McMemberRepr {
        mgid: AcmMgid {
            pkey: 0x0001,
            tos: 0x20,
            rate: Rate::Gbps200.into(),
            mtu: Mtu::Mtu4096.into(),
        }
        .to_gid(),
        port_gid: Gid::from_parts(0xfe80 << 48, 0x10_000a),
        qkey: 0x1234_5678,
        mlid: 0xc0de,
        mtu_selector: Selector::Best,
        mtu: 5,
        tclass: 0x33,
        pkey: 0x8001,
        rate_selector: Selector::GreaterThan,
        rate: 17,
        packet_life_selector: Selector::Exactly,
        packet_life: 0x2a,
        sl: 9,
        flow_label: 0x5_4321,
        hop_limit: 3,
        scope: mcmember::SCOPE_GLOBAL,
        join_state: mcmember::JOIN_SEND_ONLY_NON_MEMBER | mcmember::JOIN_NON_MEMBER,
        proxy_join: false,
    };
    let mut mad = [0u8; 256];
    let mut hdr = SaRepr::mcmember_set(
        7,
        (McMemberMask::ACM_JOIN | McMemberMask::MLID | McMemberMask::PROXY_JOIN).bits(),
    );
    hdr.header.method = Method::GetResp;
    hdr.emit(&mut SaPacket::new_unchecked(&mut mad[..]));
    m.emit(&mut McMemberRecord::new_unchecked(
        SaPacket::new_unchecked(&mut mad[..]).data_mut(),
    ));
    input += &format!("sa_mcm {}\n", hex(&mad));
    expect += "== sa_mcm\nbase_version=1\nmgmt_class=3\nclass_version=2\nmethod=81\nstatus=0\n\
               tid=7\nattr_id=38\nattr_mod=0\ncomp_mask=3b3ff\n";
    expect += &format!(
        "mgid={}\nport_gid={}\nqkey=12345678\nmlid=c0de\nmtu_sel=3\nmtu=5\ntclass=51\npkey=8001\n\
         rate_sel=0\nrate=17\nlife_sel=2\nlife=42\nsl=9\nflow_label=54321\nhop_limit=3\nscope=14\n\
         join_state=6\nproxy_join=0\n",
        hex(&m.mgid.0),
        hex(&m.port_gid.0)
    );

    // A request as the core hands it to the provider, then our response to it.
    let mut entries = [EpAddrDataRepr::ZERO; client::MAX_ENTRIES];
    entries[0] = EpAddrDataRepr::path(client::FLAGS_NODELAY, &rust_path());
    let req = AcmMsgRepr {
        version: 1,
        opcode: 1,
        status: client::Status::Success,
        data: [0, 0, 0],
        tid: 0xfeed_f00d_0000_0001,
        count: 1,
        entries,
    };
    let mut buf = [0u8; client::MSG_LEN];
    let n = req.emit(&mut AcmMsg::new_unchecked(&mut buf[..])).unwrap();
    input += &format!("acm_msg {}\n", hex(&buf[..n]));
    expect += &format!(
        "== acm_msg\nversion=1\nopcode=1\nstatus=0\nsrc_out=0\nsrc_index=0\ndst_index=0\nlength=88\n\
         tid=feedf00d00000001\nbytes=88\nentry0.flags=40000000\nentry0.type=10\n{}",
        expect_path(&rust_path())
    );
    let mut out = [0u8; 16];
    let n = client::build_error_response(
        &AcmMsg::new_unchecked(&buf[..]),
        client::Status::Etimedout,
        &mut out,
    )
    .unwrap();
    input += &format!("acm_msg {}\n", hex(&out[..n]));
    expect += "== acm_msg\nversion=1\nopcode=1\nstatus=6\nsrc_out=0\nsrc_index=0\ndst_index=0\n\
               length=16\ntid=feedf00d00000001\nbytes=16\n";

    let got = run(&exe, &input);
    let (got_lines, exp_lines): (Vec<_>, Vec<_>) =
        (got.lines().collect(), expect.lines().collect());
    for (i, (g, e)) in got_lines.iter().zip(&exp_lines).enumerate() {
        assert_eq!(g, e, "line {i} differs");
    }
    assert_eq!(got_lines.len(), exp_lines.len(), "C printed:\n{got}");
}
