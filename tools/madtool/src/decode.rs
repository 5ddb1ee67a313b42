//! Prints every field of a MAD (or an ibacm client message) as indented `Name: value` lines.

use std::fmt::Write;

use acm_core_nostd::wire::acm_mad::{AcmMad, AcmResolveRepr, AddressType, CTRL_ACK};
use acm_core_nostd::wire::client::{
    AcmMsg, AcmMsgRepr, EpInfoType, Opcode, PerfResponseRepr, COUNTER_NAMES,
};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::mad::{Header, HeaderRepr, MgmtClass, RmppRepr, HEADER_LEN};
use acm_core_nostd::wire::mcmember::{AcmMgid, McMemberMask, McMemberRepr};
use acm_core_nostd::wire::path_record::{PathRecordMask, PathRecordRepr};
use acm_core_nostd::wire::rate::{Mtu, Rate};
use acm_core_nostd::wire::sa::{self, attr, SaPacket, SaRepr, SaStatus};
use acm_core_nostd::wire::{Error, Selector};

/// Decodes one MAD; the class byte chooses SA, ACM or "other".
pub fn decode_mad(bytes: &[u8]) -> Result<String, String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!(
            "input is {} bytes; a MAD needs at least {HEADER_LEN} (256 for SA and ACM MADs)",
            bytes.len()
        ));
    }
    let mut out = String::new();
    match MgmtClass::from(bytes[1]) {
        MgmtClass::SubnAdm => decode_sa(bytes, &mut out)?,
        MgmtClass::Acm => decode_acm(bytes, &mut out)?,
        _ => {
            let h = HeaderRepr::parse(&Header::new_unchecked(bytes)).map_err(why("MAD header"))?;
            common(&h, &mut out);
            let _ = writeln!(
                out,
                "Payload ({} bytes)\n  {}",
                bytes.len() - HEADER_LEN,
                hex(&bytes[HEADER_LEN..])
            );
        }
    }
    Ok(out)
}

fn why(what: &'static str) -> impl Fn(Error) -> String {
    move |e| match e {
        Error::Truncated => format!("{what}: input too short ({e})"),
        Error::Malformed => format!("{what}: {e}"),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn common(h: &HeaderRepr, out: &mut String) {
    let s = h.status;
    let _ = writeln!(out, "MAD common header");
    let _ = writeln!(out, "  BaseVersion: {}", h.base_version);
    let _ = writeln!(
        out,
        "  MgmtClass: 0x{:02x} ({:?})",
        u8::from(h.mgmt_class),
        h.mgmt_class
    );
    let _ = writeln!(out, "  ClassVersion: {}", h.class_version);
    let _ = writeln!(
        out,
        "  Method: 0x{:02x} ({:?}{})",
        u8::from(h.method),
        h.method,
        if h.method.is_response() {
            ", response"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "  Status: 0x{:04x} (busy={} redirect={} invalid_field={:?} class_status=0x{:02x})",
        s.0,
        u8::from(s.busy()),
        u8::from(s.redirect()),
        s.invalid_field(),
        s.class_status()
    );
    let _ = writeln!(out, "  ClassSpecific: 0x{:04x}", h.class_specific);
    let _ = writeln!(
        out,
        "  TransactionID: 0x{:016x} (low32 0x{:08x})",
        h.tid, h.tid as u32
    );
    let _ = writeln!(
        out,
        "  AttributeID: 0x{:04x}{}",
        h.attr_id,
        attr_name(h.mgmt_class, h.attr_id)
    );
    let _ = writeln!(out, "  AttributeModifier: 0x{:08x}", h.attr_mod);
}

fn attr_name(class: MgmtClass, id: u16) -> &'static str {
    if class != MgmtClass::SubnAdm {
        return "";
    }
    match id {
        attr::CLASS_PORT_INFO => " (ClassPortInfo)",
        attr::NODE_RECORD => " (NodeRecord)",
        attr::PORT_INFO_RECORD => " (PortInfoRecord)",
        attr::SERVICE_RECORD => " (ServiceRecord)",
        attr::PATH_RECORD => " (PathRecord)",
        attr::MCMEMBER_RECORD => " (MCMemberRecord)",
        attr::MULTI_PATH_RECORD => " (MultiPathRecord)",
        _ => "",
    }
}

fn rmpp(r: &RmppRepr, out: &mut String) {
    let _ = writeln!(out, "RMPP header");
    let _ = writeln!(out, "  RMPPVersion: {}", r.version);
    let _ = writeln!(out, "  RMPPType: {:?}", r.rmpp_type);
    let _ = writeln!(out, "  RRespTime: {}", r.resp_time);
    let _ = writeln!(out, "  RMPPFlags: 0x{:x}", r.flags);
    let _ = writeln!(out, "  RMPPStatus: {}", r.status);
    let _ = writeln!(out, "  SegmentNumber: {}", r.seg_num);
    let _ = writeln!(out, "  PayloadLength/NewWindowLast: {}", r.paylen_newwin);
}

/// The `  ComponentMask: 0x... (Name|Name|unknown 0x...)` line of an SA header.
fn comp_mask<M: Copy>(bits: u64, names: &[(&'static str, M)], to_bits: fn(M) -> u64) -> String {
    let mut v: Vec<&str> = names
        .iter()
        .map(|&(n, m)| (n, to_bits(m)))
        .filter(|&(_, m)| m != 0 && bits & m == m)
        .map(|(n, _)| n)
        .collect();
    let known: u64 = names.iter().fold(0, |a, &(_, m)| a | to_bits(m));
    let extra = bits & !known;
    let extra_s;
    if extra != 0 {
        extra_s = format!("unknown 0x{extra:x}");
        v.push(&extra_s);
    }
    let names = if v.is_empty() {
        "none".into()
    } else {
        v.join("|")
    };
    format!("  ComponentMask: 0x{bits:016x} ({names})")
}

fn decode_sa(bytes: &[u8], out: &mut String) -> Result<(), String> {
    let p = SaPacket::new_checked(bytes).map_err(|_| {
        format!(
            "SA MAD: input is {} bytes; an SA MAD is {} bytes",
            bytes.len(),
            sa::MAD_LEN
        )
    })?;
    let r = SaRepr::parse(&p).map_err(why("SA MAD"))?;
    common(&r.header, out);
    rmpp(&r.rmpp, out);
    let _ = writeln!(out, "SA header");
    let _ = writeln!(out, "  SA status: {:?}", r.sa_status());
    let _ = writeln!(out, "  SM_Key: 0x{:016x}", r.sm_key);
    let _ = writeln!(out, "  AttributeOffset: {} (x8 bytes)", r.attr_offset);
    match r.header.attr_id {
        attr::PATH_RECORD => {
            let line = comp_mask(r.comp_mask, &PathRecordMask::NAMES, PathRecordMask::bits);
            let _ = writeln!(out, "{line}");
            let pr = PathRecordRepr::parse_bytes(p.data()).map_err(why("PathRecord"))?;
            path_record(&pr, "PathRecord", "  ", out);
        }
        attr::MCMEMBER_RECORD => {
            let line = comp_mask(r.comp_mask, &McMemberMask::NAMES, McMemberMask::bits);
            let _ = writeln!(out, "{line}");
            let m = McMemberRepr::parse_bytes(p.data()).map_err(why("MCMemberRecord"))?;
            mcmember(&m, out);
        }
        _ => {
            let _ = writeln!(out, "  ComponentMask: 0x{:016x}", r.comp_mask);
            let _ = writeln!(out, "Data ({} bytes)\n  {}", sa::DATA_LEN, hex(p.data()));
        }
    }
    if r.sa_status() != SaStatus::Success || !r.header.status.is_success() {
        let _ = writeln!(
            out,
            "Note: status is not success; the record may be meaningless"
        );
    }
    Ok(())
}

fn sel(s: Selector) -> &'static str {
    match s {
        Selector::GreaterThan => "GreaterThan",
        Selector::LessThan => "LessThan",
        Selector::Exactly => "Exactly",
        Selector::Best => "Best",
    }
}

fn rate(v: u8) -> String {
    match Rate::from(v).to_mbps() {
        Some(m) if m % 1000 == 0 => format!("{v} ({} Gb/s)", m / 1000),
        Some(m) => format!("{v} ({}.{} Gb/s)", m / 1000, (m % 1000) / 100),
        None => format!("{v}"),
    }
}

fn mtu(v: u8) -> String {
    match Mtu::from(v).to_bytes() {
        Some(b) => format!("{v} ({b} bytes)"),
        None => format!("{v}"),
    }
}

fn gid(g: &Gid) -> String {
    g.to_string()
}

fn path_record(p: &PathRecordRepr, title: &str, ind: &str, out: &mut String) {
    let _ = writeln!(out, "{}{title}", &ind[2..]);
    let _ = writeln!(out, "{ind}ServiceID: 0x{:016x}", p.service_id);
    let _ = writeln!(out, "{ind}DGID: {}", gid(&p.dgid));
    let _ = writeln!(out, "{ind}SGID: {}", gid(&p.sgid));
    let _ = writeln!(out, "{ind}DLID: {}", p.dlid);
    let _ = writeln!(out, "{ind}SLID: {}", p.slid);
    let _ = writeln!(out, "{ind}RawTraffic: {}", u8::from(p.raw_traffic));
    let _ = writeln!(out, "{ind}FlowLabel: 0x{:05x}", p.flow_label);
    let _ = writeln!(out, "{ind}HopLimit: {}", p.hop_limit);
    let _ = writeln!(out, "{ind}TClass: {}", p.tclass);
    let _ = writeln!(out, "{ind}Reversible: {}", u8::from(p.reversible));
    let _ = writeln!(out, "{ind}NumbPath: {}", p.num_path);
    let _ = writeln!(out, "{ind}P_Key: 0x{:04x}", p.pkey);
    let _ = writeln!(out, "{ind}QoSClass: {}", p.qos_class);
    let _ = writeln!(out, "{ind}SL: {}", p.sl);
    let _ = writeln!(out, "{ind}MTUSelector: {}", sel(p.mtu_selector));
    let _ = writeln!(out, "{ind}MTU: {}", mtu(p.mtu));
    let _ = writeln!(out, "{ind}RateSelector: {}", sel(p.rate_selector));
    let _ = writeln!(out, "{ind}Rate: {}", rate(p.rate));
    let _ = writeln!(
        out,
        "{ind}PacketLifeTimeSelector: {}",
        sel(p.packet_life_selector)
    );
    let _ = writeln!(out, "{ind}PacketLifeTime: {}", p.packet_life);
    let _ = writeln!(out, "{ind}Preference: {}", p.preference);
}

fn mcmember(m: &McMemberRepr, out: &mut String) {
    let _ = writeln!(out, "MCMemberRecord");
    let _ = writeln!(out, "  MGID: {}", gid(&m.mgid));
    if let Ok(a) = AcmMgid::parse(&m.mgid) {
        let _ = writeln!(
            out,
            "  MGID (ibacm): P_Key 0x{:04x} TOS {} Rate {} MTU {}",
            a.pkey,
            a.tos,
            rate(a.rate),
            mtu(a.mtu)
        );
    }
    let _ = writeln!(out, "  PortGID: {}", gid(&m.port_gid));
    let _ = writeln!(out, "  Q_Key: 0x{:08x}", m.qkey);
    let _ = writeln!(out, "  MLID: 0x{:04x}", m.mlid);
    let _ = writeln!(out, "  MTUSelector: {}", sel(m.mtu_selector));
    let _ = writeln!(out, "  MTU: {}", mtu(m.mtu));
    let _ = writeln!(out, "  TClass: {}", m.tclass);
    let _ = writeln!(out, "  P_Key: 0x{:04x}", m.pkey);
    let _ = writeln!(out, "  RateSelector: {}", sel(m.rate_selector));
    let _ = writeln!(out, "  Rate: {}", rate(m.rate));
    let _ = writeln!(
        out,
        "  PacketLifeTimeSelector: {}",
        sel(m.packet_life_selector)
    );
    let _ = writeln!(out, "  PacketLifeTime: {}", m.packet_life);
    let _ = writeln!(out, "  SL: {}", m.sl);
    let _ = writeln!(out, "  FlowLabel: 0x{:05x}", m.flow_label);
    let _ = writeln!(out, "  HopLimit: {}", m.hop_limit);
    let _ = writeln!(out, "  Scope: {}", m.scope);
    let _ = writeln!(out, "  JoinState: 0x{:x}", m.join_state);
    let _ = writeln!(out, "  ProxyJoin: {}", u8::from(m.proxy_join));
}

/// An ACM address of type `t` as text (quoted name, dotted IPv4, GID/IPv6, LID, else hex).
pub(crate) fn address(t: AddressType, a: &[u8; 64]) -> String {
    match t {
        AddressType::Ip => format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]),
        AddressType::Ip6 | AddressType::Gid => gid(&Gid::from_bytes(a).unwrap_or_default()),
        AddressType::Name => {
            let end = a.iter().position(|&b| b == 0).unwrap_or(a.len());
            format!("{:?}", String::from_utf8_lossy(&a[..end]))
        }
        AddressType::Lid => format!("{}", u16::from_be_bytes([a[0], a[1]])),
        _ => {
            let end = a.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            format!("hex {}", hex(&a[..end]))
        }
    }
}

fn decode_acm(bytes: &[u8], out: &mut String) -> Result<(), String> {
    let m = AcmMad::new_checked(bytes).map_err(|_| {
        format!(
            "ACM MAD: input is {} bytes; an ACM MAD is 256 bytes",
            bytes.len()
        )
    })?;
    let r = AcmResolveRepr::parse(&m).map_err(|e| match e {
        Error::Malformed => format!(
            "ACM MAD: gid_cnt {} is more than the 6 GIDs that fit in a MAD",
            m.gid_cnt()
        ),
        e => format!("ACM MAD: {e}"),
    })?;
    let _ = writeln!(out, "ACM MAD header");
    let _ = writeln!(out, "  BaseVersion: {}", r.base_version);
    let _ = writeln!(out, "  MgmtClass: 0x2c (Acm)");
    let _ = writeln!(out, "  ClassVersion: {}", r.class_version);
    let _ = writeln!(
        out,
        "  Method: 0x{:02x} ({:?})",
        u8::from(r.method),
        r.method
    );
    let _ = writeln!(
        out,
        "  Status: 0x{:04x} (class_status=0x{:02x})",
        r.status,
        r.status >> 8
    );
    let _ = writeln!(
        out,
        "  Control: 0x{:04x} ({}{})",
        r.control,
        if r.control & 0x7fff == 1 {
            "RESOLVE"
        } else {
            "unknown"
        },
        if r.control & CTRL_ACK != 0 {
            "|ACK"
        } else {
            ""
        }
    );
    let _ = writeln!(out, "  TransactionID: 0x{:016x}", r.tid);
    let _ = writeln!(out, "ACM resolve record");
    let _ = writeln!(out, "  DestType: {:?}", r.dest_type);
    let _ = writeln!(out, "  DestLength: {}", r.dest_length);
    let _ = writeln!(out, "  Dest: {}", address(r.dest_type, &r.dest));
    let _ = writeln!(out, "  SrcType: {:?}", r.src_type);
    let _ = writeln!(out, "  SrcLength: {}", r.src_length);
    let _ = writeln!(out, "  Src: {}", address(r.src_type, &r.src));
    let _ = writeln!(out, "  RespResources: {}", r.resp_resources);
    let _ = writeln!(out, "  InitDepth: {}", r.init_depth);
    let _ = writeln!(out, "  GIDCount: {}", r.gid_cnt);
    for (i, g) in r.gids().iter().enumerate() {
        let _ = writeln!(out, "  GID[{i}]: {}", gid(g));
    }
    Ok(())
}

/// Decodes an ibacm client message (`struct acm_msg`), RESOLVE in native byte order or
/// PERF_QUERY with a big-endian length.
pub fn decode_client(bytes: &[u8]) -> Result<String, String> {
    let m = AcmMsg::new_checked(bytes).map_err(|_| {
        format!(
            "acm_msg: input is {} bytes; the header alone is 16",
            bytes.len()
        )
    })?;
    let mut out = String::new();
    let _ = writeln!(out, "acm_hdr");
    let _ = writeln!(out, "  Version: {}", m.version());
    let _ = writeln!(
        out,
        "  Opcode: 0x{:02x} ({:?}{})",
        m.opcode_raw(),
        m.opcode(),
        if m.is_ack() { "|ACK" } else { "" }
    );
    let _ = writeln!(out, "  Status: {:?}", m.status());
    let _ = writeln!(
        out,
        "  Data: src_out={} src_index={} dst_index={}",
        m.src_out(),
        m.src_index(),
        m.dst_index()
    );
    if m.opcode() == Opcode::PerfQuery {
        let _ = writeln!(out, "  Length: {} (big-endian)", m.length_be());
        let _ = writeln!(out, "  TID: 0x{:016x}", m.tid());
        if m.is_ack() {
            let p = PerfResponseRepr::parse(&m).map_err(why("PERF_QUERY response"))?;
            let _ = writeln!(out, "Counters");
            for (i, c) in p.counters.iter().enumerate().take(p.count as usize) {
                let _ = writeln!(out, "  {}: {c}", COUNTER_NAMES[i]);
            }
        }
        return Ok(out);
    }
    let _ = writeln!(out, "  Length: {} (native byte order)", m.length());
    let _ = writeln!(out, "  TID: 0x{:016x}", m.tid());
    let r = AcmMsgRepr::parse(&m).map_err(|e| match e {
        Error::Malformed => format!(
            "acm_msg: length {} is not 16 + 72*n with n <= 8",
            m.length()
        ),
        Error::Truncated => format!(
            "acm_msg: length {} but only {} bytes given",
            m.length(),
            bytes.len()
        ),
    })?;
    for (i, e) in r.entries().iter().enumerate() {
        let _ = writeln!(out, "resolve_data[{i}]");
        let _ = writeln!(out, "  Flags: 0x{:08x}", e.flags);
        let _ = writeln!(out, "  Type: {:?}", e.info_type);
        match e.info_type {
            EpInfoType::Path => {
                let p = PathRecordRepr::parse_bytes(&e.info).map_err(why("path"))?;
                path_record(&p, "  Path", "    ", &mut out);
            }
            EpInfoType::AddressIp => {
                let _ = writeln!(out, "  Address: {}", address(AddressType::Ip, &e.info));
            }
            EpInfoType::AddressIp6 => {
                let _ = writeln!(out, "  Address: {}", address(AddressType::Ip6, &e.info));
            }
            EpInfoType::Name => {
                let _ = writeln!(out, "  Name: {}", address(AddressType::Name, &e.info));
            }
            _ => {
                let _ = writeln!(out, "  Info: {}", hex(&e.info));
            }
        }
    }
    Ok(out)
}

/// Parses `--hex` input: hex digits, optionally separated by whitespace, `:` or `-`.
pub fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.trim();
    let s = s.strip_prefix("0x").unwrap_or(s);
    let digits: Vec<char> = s
        .chars()
        .filter(|c| !c.is_whitespace() && *c != ':' && *c != '-')
        .collect();
    if let Some(bad) = digits.iter().find(|c| !c.is_ascii_hexdigit()) {
        return Err(format!("--hex: '{bad}' is not a hex digit"));
    }
    if digits.len() % 2 != 0 {
        return Err(format!(
            "--hex: odd number of hex digits ({})",
            digits.len()
        ));
    }
    Ok(digits
        .chunks(2)
        .map(|p| (p[0].to_digit(16).unwrap_or(0) * 16 + p[1].to_digit(16).unwrap_or(0)) as u8)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_parsing() {
        assert_eq!(parse_hex("0x01:02 0a-FF\n"), Ok(vec![1, 2, 10, 255]));
        assert!(parse_hex("0g").unwrap_err().contains("'g'"));
        assert!(parse_hex("abc").unwrap_err().contains("odd"));
    }

    #[test]
    fn short_input_is_an_error() {
        assert!(decode_mad(&[1, 3]).unwrap_err().contains("at least 24"));
        let mut b = vec![0u8; 100];
        b[1] = 3;
        assert!(decode_mad(&b).unwrap_err().contains("256"));
        b[1] = 0x2c;
        assert!(decode_mad(&b).unwrap_err().contains("256"));
        b[1] = 0x04;
        assert!(decode_mad(&b).unwrap().contains("PerfMgmt"));
        assert!(decode_client(&[1; 3]).is_err());
    }
    #[test]
    fn component_mask_names_known_and_unknown_bits() {
        let pr = PathRecordMask::DLID.union(PathRecordMask::SLID).bits();
        assert_eq!(
            comp_mask(pr, &PathRecordMask::NAMES, PathRecordMask::bits),
            format!("  ComponentMask: 0x{pr:016x} (DLID|SLID)")
        );
        let mc = McMemberMask::MGID.bits() | (1 << 60);
        assert_eq!(
            comp_mask(mc, &McMemberMask::NAMES, McMemberMask::bits),
            "  ComponentMask: 0x1000000000000001 (MGID|unknown 0x1000000000000000)"
        );
        assert_eq!(
            comp_mask(0, &McMemberMask::NAMES, McMemberMask::bits),
            "  ComponentMask: 0x0000000000000000 (none)"
        );
    }
}
