//! `madtool pcap`: reads pcap files of InfiniBand frames (what `SIMVERBS_PCAP` writes, or any
//! pcap of these link types), and prints the IB headers and the MAD of every packet.
//!
//! Link types: LINKTYPE_ERF (197) with ERF records of type 21 (INFINIBAND), extension headers
//! skipped; LINKTYPE_USER0 (147) and LINKTYPE_INFINIBAND (247) holding the bare frame (LRH
//! first). pcap (not pcapng), either byte order, micro- or nanosecond timestamps. One file is
//! printed in file order (packet numbers = tshark's frame numbers; in a shared capture file
//! two writers' timestamps may be slightly out of order); several files (e.g. one per process,
//! `SIMVERBS_PCAP=...%p`) are merged by timestamp (stable: equal times keep file order, then
//! record order).
//!
//! Frames: LRH, GRH when LNH = 3, BTH; for UD SEND only (0x64) / with immediate (0x65) the
//! DETH, ImmDt and the payload (BTH PadCnt removed, ICRC + VCRC removed), decoded as a MAD
//! when it looks like one (base version 1, at least 24 bytes): class 0x2C with the ACM
//! resolve decoder, SA with the SA decoder, other classes by common header.

use std::fmt::Write;

use acm_core_nostd::wire::acm_mad::{AcmMad, AcmResolveRepr, AddressType, CTRL_ACK};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::mad::{MgmtClass, HEADER_LEN};

/// pcap link type: ERF.
pub const LINKTYPE_ERF: u32 = 197;
/// pcap link type: USER0 (tshark needs a `uat:user_dlts` entry mapping it to `infiniband`).
pub const LINKTYPE_USER0: u32 = 147;
/// pcap link type: InfiniBand (rejected by tshark 4.0, accepted here).
pub const LINKTYPE_INFINIBAND: u32 = 247;
/// ERF record type: InfiniBand.
pub const ERF_TYPE_INFINIBAND: u8 = 21;

/// One pcap record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Seconds since the epoch.
    pub sec: u32,
    /// Nanoseconds within the second.
    pub nsec: u32,
    /// The file's link type.
    pub linktype: u32,
    /// Captured bytes (link-layer framing included).
    pub data: Vec<u8>,
    /// Original length on the wire.
    pub orig_len: u32,
}

/// Parses a whole pcap file.
pub fn parse_pcap(b: &[u8]) -> Result<Vec<Record>, String> {
    if b.len() < 24 {
        return Err(format!(
            "{} bytes: too short for a pcap global header (24)",
            b.len()
        ));
    }
    let magic = [b[0], b[1], b[2], b[3]];
    let (le, nano) = match magic {
        [0xd4, 0xc3, 0xb2, 0xa1] => (true, false),
        [0xa1, 0xb2, 0xc3, 0xd4] => (false, false),
        [0x4d, 0x3c, 0xb2, 0xa1] => (true, true),
        [0xa1, 0xb2, 0x3c, 0x4d] => (false, true),
        [0x0a, 0x0d, 0x0d, 0x0a] => {
            return Err("pcapng is not supported: convert with `editcap -F pcap IN OUT`".into())
        }
        m => return Err(format!("not a pcap file (magic {})", hex(&m))),
    };
    let u32_at = |o: usize| {
        let w = [b[o], b[o + 1], b[o + 2], b[o + 3]];
        if le {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        }
    };
    let linktype = u32_at(20) & 0x0fff_ffff;
    let mut out = Vec::new();
    let mut at = 24;
    while at < b.len() {
        if b.len() - at < 16 {
            return Err(format!(
                "record {} at offset {at}: truncated record header",
                out.len() + 1
            ));
        }
        let (sec, frac, incl, orig) = (u32_at(at), u32_at(at + 4), u32_at(at + 8), u32_at(at + 12));
        let body = at + 16;
        let end = body
            .checked_add(incl as usize)
            .filter(|e| *e <= b.len())
            .ok_or_else(|| {
                format!(
                    "record {} at offset {at}: {incl} bytes announced, {} left",
                    out.len() + 1,
                    b.len() - body
                )
            })?;
        out.push(Record {
            sec,
            nsec: if nano {
                frac
            } else {
                frac.saturating_mul(1000)
            },
            linktype,
            data: b[body..end].to_vec(),
            orig_len: orig,
        });
        at = end;
    }
    Ok(out)
}

/// The InfiniBand frame inside a record (LRH first), or why there is none.
pub fn ib_frame(r: &Record) -> Result<&[u8], String> {
    match r.linktype {
        LINKTYPE_USER0 | LINKTYPE_INFINIBAND => Ok(&r.data),
        LINKTYPE_ERF => {
            let d = &r.data;
            if d.len() < 16 {
                return Err(format!("ERF record of {} bytes (header is 16)", d.len()));
            }
            let ty = d[8];
            let mut at = 16;
            let mut ext = ty & 0x80 != 0;
            while ext {
                let h = d.get(at..at + 8).ok_or("ERF extension header truncated")?;
                ext = h[0] & 0x80 != 0;
                at += 8;
            }
            if ty & 0x7f != ERF_TYPE_INFINIBAND {
                return Err(format!(
                    "ERF record type {} is not InfiniBand (21)",
                    ty & 0x7f
                ));
            }
            let rlen = usize::from(u16::from_be_bytes([d[10], d[11]]));
            let wlen = usize::from(u16::from_be_bytes([d[14], d[15]]));
            // The frame is the wire length, bounded by what the record holds.
            let end = (at + wlen).min(rlen.max(at)).min(d.len());
            Ok(&d[at..end])
        }
        t => Err(format!(
            "link type {t} is not InfiniBand (ERF 197, USER0 147 or INFINIBAND 247)"
        )),
    }
}

/// The InfiniBand headers of one frame.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IbPacket {
    pub vl: u8,
    pub sl: u8,
    pub lnh: u8,
    pub dlid: u16,
    pub slid: u16,
    /// PktLen in 4-byte words (LRH through ICRC).
    pub pkt_len: u16,
    pub grh: Option<Grh>,
    pub opcode: u8,
    pub solicited: bool,
    pub pad: u8,
    pub pkey: u16,
    pub dest_qp: u32,
    pub psn: u32,
    /// DETH (UD only).
    pub qkey: Option<u32>,
    pub src_qp: Option<u32>,
    /// ImmDt, as on the wire.
    pub imm: Option<u32>,
    /// The payload (pad, ICRC and VCRC removed); empty for opcodes we do not unpack.
    pub payload: Vec<u8>,
    /// Problems noticed while parsing (length mismatch, ...).
    pub notes: Vec<String>,
}

/// The GRH fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grh {
    pub ip_version: u8,
    pub tclass: u8,
    pub flow_label: u32,
    pub pay_len: u16,
    pub next_header: u8,
    pub hop_limit: u8,
    pub sgid: Gid,
    pub dgid: Gid,
}

/// Opcode names of the transports we meet.
pub fn opcode_name(op: u8) -> &'static str {
    match op {
        0x64 => "UD SEND only",
        0x65 => "UD SEND only with immediate",
        0x04 => "RC SEND only",
        0x05 => "RC SEND only with immediate",
        0x24 => "UC SEND only",
        0x44 => "RD SEND only",
        _ => "other",
    }
}

/// Parses LRH [+ GRH] + BTH [+ DETH + ImmDt + payload].
pub fn parse_ib(f: &[u8]) -> Result<IbPacket, String> {
    if f.len() < 8 + 12 {
        return Err(format!(
            "frame of {} bytes: too short for LRH + BTH",
            f.len()
        ));
    }
    let mut p = IbPacket {
        vl: f[0] >> 4,
        sl: f[1] >> 4,
        lnh: f[1] & 3,
        dlid: u16::from_be_bytes([f[2], f[3]]),
        pkt_len: u16::from_be_bytes([f[4], f[5]]) & 0x07ff,
        slid: u16::from_be_bytes([f[6], f[7]]),
        ..IbPacket::default()
    };
    let mut at = 8;
    match p.lnh {
        3 => {
            let g = f
                .get(8..48)
                .ok_or("LNH 3 (GRH) but the frame is too short for a GRH")?;
            let w0 = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
            p.grh = Some(Grh {
                ip_version: (w0 >> 28) as u8,
                tclass: (w0 >> 20) as u8,
                flow_label: w0 & 0x000f_ffff,
                pay_len: u16::from_be_bytes([g[4], g[5]]),
                next_header: g[6],
                hop_limit: g[7],
                sgid: Gid::from_bytes(&g[8..24]).unwrap_or_default(),
                dgid: Gid::from_bytes(&g[24..40]).unwrap_or_default(),
            });
            at = 48;
        }
        2 => {}
        n => return Err(format!("LNH {n}: not an IBA transport packet (raw)")),
    }
    let bth = f.get(at..at + 12).ok_or("frame too short for the BTH")?;
    p.opcode = bth[0];
    p.solicited = bth[1] & 0x80 != 0;
    p.pad = (bth[1] >> 4) & 3;
    p.pkey = u16::from_be_bytes([bth[2], bth[3]]);
    p.dest_qp = u32::from_be_bytes([0, bth[5], bth[6], bth[7]]);
    p.psn = u32::from_be_bytes([0, bth[9], bth[10], bth[11]]);
    at += 12;
    // Where the ICRC starts: from PktLen if it fits, else (with a note) frame - ICRC - VCRC.
    let by_len = usize::from(p.pkt_len) * 4;
    let icrc_at = if by_len >= at + 4 && by_len + 2 <= f.len() {
        if by_len + 2 != f.len() {
            p.notes.push(format!(
                "PktLen {} words = {} bytes + VCRC, frame has {}",
                p.pkt_len,
                by_len,
                f.len()
            ));
        }
        by_len - 4
    } else {
        p.notes.push(format!(
            "PktLen {} words does not fit the {}-byte frame; using the frame length",
            p.pkt_len,
            f.len()
        ));
        f.len().saturating_sub(6).max(at)
    };
    if let Some(g) = &p.grh {
        if usize::from(g.pay_len) + 48 != icrc_at + 4 {
            p.notes.push(format!(
                "GRH PayLen {} but BTH..ICRC is {} bytes",
                g.pay_len,
                icrc_at + 4 - 48
            ));
        }
    }
    if p.opcode == 0x64 || p.opcode == 0x65 {
        let deth = f.get(at..at + 8).ok_or("frame too short for the DETH")?;
        p.qkey = Some(u32::from_be_bytes([deth[0], deth[1], deth[2], deth[3]]));
        p.src_qp = Some(u32::from_be_bytes([0, deth[5], deth[6], deth[7]]));
        at += 8;
        if p.opcode == 0x65 {
            let i = f.get(at..at + 4).ok_or("frame too short for the ImmDt")?;
            p.imm = Some(u32::from_be_bytes([i[0], i[1], i[2], i[3]]));
            at += 4;
        }
        let end = icrc_at.saturating_sub(usize::from(p.pad));
        if end < at {
            return Err(format!(
                "payload ends (offset {end}) before the headers do ({at})"
            ));
        }
        p.payload = f[at..end].to_vec();
    }
    Ok(p)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn lid(l: u16) -> String {
    if (0xc000..0xffff).contains(&l) {
        format!("0x{l:04x} (multicast)")
    } else if l == 0xffff {
        "0xffff (permissive)".into()
    } else {
        format!("{l}")
    }
}

/// True if `payload` looks like a MAD (base version 1, a whole common header).
fn looks_like_mad(payload: &[u8]) -> bool {
    payload.len() >= HEADER_LEN && payload[0] == 1
}

/// The full, multi-line description of one packet.
pub fn describe(n: usize, r: &Record, out: &mut String) {
    let _ = writeln!(
        out,
        "Packet {n}: time {}.{:06}, {} bytes",
        r.sec,
        r.nsec / 1000,
        r.data.len()
    );
    let p = match ib_frame(r).and_then(parse_ib) {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(out, "  not decoded: {e}");
            return;
        }
    };
    let _ = writeln!(
        out,
        "  LRH: SLID {} DLID {} SL {} VL {} LNH {} ({}) PktLen {} words",
        lid(p.slid),
        lid(p.dlid),
        p.sl,
        p.vl,
        p.lnh,
        if p.grh.is_some() { "GRH" } else { "no GRH" },
        p.pkt_len
    );
    if let Some(g) = &p.grh {
        let _ = writeln!(out, "  GRH: SGID {} DGID {}", g.sgid, g.dgid);
        let _ = writeln!(
            out,
            "       IPVer {} TClass {} FlowLabel 0x{:05x} PayLen {} NxtHdr 0x{:02x} HopLimit {}",
            g.ip_version, g.tclass, g.flow_label, g.pay_len, g.next_header, g.hop_limit
        );
    }
    let _ = writeln!(
        out,
        "  BTH: Opcode 0x{:02x} ({}) P_Key 0x{:04x} DestQP 0x{:06x}{} PSN {} SE {} PadCnt {}",
        p.opcode,
        opcode_name(p.opcode),
        p.pkey,
        p.dest_qp,
        if p.dest_qp == 0xff_ffff {
            " (multicast)"
        } else {
            ""
        },
        p.psn,
        u8::from(p.solicited),
        p.pad
    );
    if let (Some(q), Some(s)) = (p.qkey, p.src_qp) {
        let _ = writeln!(out, "  DETH: Q_Key 0x{q:08x} SrcQP 0x{s:06x}");
    }
    if let Some(i) = p.imm {
        let _ = writeln!(out, "  ImmDt: 0x{i:08x}");
    }
    for note in &p.notes {
        let _ = writeln!(out, "  Note: {note}");
    }
    if p.qkey.is_none() {
        return;
    }
    let _ = writeln!(out, "  Payload: {} bytes", p.payload.len());
    if looks_like_mad(&p.payload) {
        let mad = if p.payload.len() > 256 {
            &p.payload[..256]
        } else {
            &p.payload[..]
        };
        match crate::decode::decode_mad(mad) {
            Ok(text) => {
                for l in text.lines() {
                    let _ = writeln!(out, "  {l}");
                }
            }
            Err(e) => {
                let _ = writeln!(out, "  not a decodable MAD: {e}");
                let _ = writeln!(out, "    {}", hex(&p.payload));
            }
        }
    } else {
        let _ = writeln!(out, "    {}", hex(&p.payload));
    }
}

fn addr_brief(t: AddressType, a: &[u8; 64]) -> String {
    if t == AddressType::Invalid && a.iter().all(|&b| b == 0) {
        return "none".into();
    }
    format!("{:?}:{}", t, crate::decode::address(t, a).replace(' ', ":"))
}

/// One line per packet: `key=value` tokens (values without spaces), for people and tests.
pub fn brief(n: usize, r: &Record) -> String {
    let mut s = format!("{n} {}.{:06}", r.sec, r.nsec / 1000);
    let p = match ib_frame(r).and_then(parse_ib) {
        Ok(p) => p,
        Err(e) => return format!("{s} error={:?}", e),
    };
    let _ = write!(s, " slid={} dlid=0x{:04x}", p.slid, p.dlid);
    match &p.grh {
        Some(g) => {
            let _ = write!(s, " grh=1 sgid={} dgid={}", g.sgid, g.dgid);
        }
        None => s.push_str(" grh=0"),
    }
    let _ = write!(
        s,
        " op=0x{:02x} pkey=0x{:04x} dqp=0x{:06x}",
        p.opcode, p.pkey, p.dest_qp
    );
    if let (Some(q), Some(sq)) = (p.qkey, p.src_qp) {
        let _ = write!(s, " qkey=0x{q:08x} sqp=0x{sq:06x} len={}", p.payload.len());
    }
    if !looks_like_mad(&p.payload) {
        return s;
    }
    let class = p.payload[1];
    let _ = write!(s, " class=0x{class:02x} method=0x{:02x}", p.payload[3]);
    if MgmtClass::from(class) == MgmtClass::Acm {
        match AcmMad::new_checked(&p.payload[..])
            .map_err(|_| ())
            .and_then(|m| AcmResolveRepr::parse(&m).map_err(|_| ()))
        {
            Ok(a) => {
                let _ = write!(
                    s,
                    " status=0x{:04x} control=0x{:04x}{} tid=0x{:016x} dest={} src={} gid_cnt={}",
                    a.status,
                    a.control,
                    if a.control & 0x7fff == 1 {
                        if a.control & CTRL_ACK != 0 {
                            "(RESOLVE|ACK)"
                        } else {
                            "(RESOLVE)"
                        }
                    } else {
                        ""
                    },
                    a.tid,
                    addr_brief(a.dest_type, &a.dest),
                    addr_brief(a.src_type, &a.src),
                    a.gid_cnt
                );
                for g in a.gids() {
                    let _ = write!(s, " gid={g}");
                }
            }
            Err(()) => s.push_str(" acm=malformed"),
        }
    } else if p.payload.len() >= 16 {
        let tid = u64::from_be_bytes(p.payload[8..16].try_into().unwrap_or([0; 8]));
        let _ = write!(s, " tid=0x{tid:016x}");
        if p.payload.len() >= 18 {
            let _ = write!(
                s,
                " attr=0x{:04x}",
                u16::from_be_bytes([p.payload[16], p.payload[17]])
            );
        }
    }
    s
}

/// Reads every file, merges their records by time (if more than one), and prints them
/// (`madtool pcap`): [`render`] of the files' contents, each read just before it is parsed.
pub fn run(files: &[String], brief_mode: bool) -> Result<String, String> {
    let mut all = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        let b = std::fs::read(f).map_err(|e| format!("reading {f}: {e}"))?;
        add_file(&mut all, fi, f, &b)?;
    }
    Ok(print(all, files.len() > 1, brief_mode))
}

/// What [`run`] prints for files already in memory: `files` are (name for messages,
/// contents) pairs. The output grows linearly with the input (every record is one copy of
/// its captured bytes, bounded by the file, and a few lines of text).
pub fn render(files: &[(&str, &[u8])], brief_mode: bool) -> Result<String, String> {
    let mut all = Vec::new();
    for (fi, (name, b)) in files.iter().enumerate() {
        add_file(&mut all, fi, name, b)?;
    }
    Ok(print(all, files.len() > 1, brief_mode))
}

/// A record with its merge key: (seconds, nanoseconds, file index, record index).
type Keyed = (u32, u32, usize, usize, Record);

/// Parses file number `fi` (called `name` in errors) and appends its records to `all`.
fn add_file(all: &mut Vec<Keyed>, fi: usize, name: &str, b: &[u8]) -> Result<(), String> {
    let recs = parse_pcap(b).map_err(|e| format!("{name}: {e}"))?;
    for (ri, r) in recs.into_iter().enumerate() {
        all.push((r.sec, r.nsec, fi, ri, r));
    }
    Ok(())
}

/// Prints the records, sorted by time first if they come from several files (`merge`).
fn print(mut all: Vec<Keyed>, merge: bool, brief_mode: bool) -> String {
    if merge {
        all.sort_by_key(|(s, ns, fi, ri, _)| (*s, *ns, *fi, *ri));
    }
    let mut out = String::new();
    for (i, (.., r)) in all.iter().enumerate() {
        if brief_mode {
            let _ = writeln!(out, "{}", brief(i + 1, r));
        } else {
            if i > 0 {
                out.push('\n');
            }
            describe(i + 1, r, &mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ACM request frame as simverbs writes it: GRH, multicast, 256-byte MAD.
    fn acm_frame(grh: bool) -> Vec<u8> {
        let mut mad = [0u8; 256];
        mad[..16].copy_from_slice(&[1, 0x2c, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]);
        mad[16..24].copy_from_slice(&[1, 64, 1, 64, 1, 0, 0, 0]);
        mad[24..28].copy_from_slice(b"hca4");
        mad[88..92].copy_from_slice(b"hca3");
        mad[152..161].copy_from_slice(&[0xff, 0x15, 0x40, 0x01, 0xff, 0xff, 0, 3, 4]);
        let mut f = vec![0x00, if grh { 0x03 } else { 0x02 }, 0xc0, 0x01];
        let words = (8 + if grh { 40 } else { 0 } + 12 + 8 + 256 + 4) / 4;
        f.extend_from_slice(&(words as u16).to_be_bytes());
        f.extend_from_slice(&[0, 5]);
        if grh {
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&(12u16 + 8 + 256 + 4).to_be_bytes());
            f.extend_from_slice(&[0x1b, 0]);
            f.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 7]);
            f.extend_from_slice(&mad[152..168]);
        }
        f.extend_from_slice(&[0x64, 0, 0xff, 0xff, 0, 0xff, 0xff, 0xff, 0, 0, 0, 9]);
        f.extend_from_slice(&[0x80, 0x01, 0, 0, 0, 0xc3, 0x60, 0x10]);
        f.extend_from_slice(&mad);
        f.extend_from_slice(&[0; 6]);
        f
    }

    fn pcap(linktype: u32, frames: &[Vec<u8>], le: bool, nano: bool) -> Vec<u8> {
        let w32 = |v: u32| if le { v.to_le_bytes() } else { v.to_be_bytes() };
        let w16 = |v: u16| if le { v.to_le_bytes() } else { v.to_be_bytes() };
        let mut p = Vec::new();
        p.extend_from_slice(&w32(if nano { 0xa1b2_3c4d } else { 0xa1b2_c3d4 }));
        p.extend_from_slice(&w16(2));
        p.extend_from_slice(&w16(4));
        p.extend_from_slice(&[0; 8]);
        p.extend_from_slice(&w32(65535));
        p.extend_from_slice(&w32(linktype));
        for (i, f) in frames.iter().enumerate() {
            let body = if linktype == LINKTYPE_ERF {
                let mut e = vec![0u8; 8];
                e.extend_from_slice(&[21, 4]);
                e.extend_from_slice(&((16 + f.len()) as u16).to_be_bytes());
                e.extend_from_slice(&[0, 0]);
                e.extend_from_slice(&(f.len() as u16).to_be_bytes());
                e.extend_from_slice(f);
                e
            } else {
                f.clone()
            };
            p.extend_from_slice(&w32(100 + i as u32));
            p.extend_from_slice(&w32(if nano { 5000 } else { 5 }));
            p.extend_from_slice(&w32(body.len() as u32));
            p.extend_from_slice(&w32(body.len() as u32));
            p.extend_from_slice(&body);
        }
        p
    }

    #[test]
    fn every_framing_gives_the_same_packet() {
        let frames = [acm_frame(true), acm_frame(false)];
        let mut seen = Vec::new();
        for lt in [LINKTYPE_ERF, LINKTYPE_USER0, LINKTYPE_INFINIBAND] {
            for (le, nano) in [(true, false), (false, false), (true, true), (false, true)] {
                let recs = parse_pcap(&pcap(lt, &frames, le, nano)).unwrap();
                assert_eq!(recs.len(), 2);
                assert_eq!((recs[0].sec, recs[0].nsec), (100, 5000));
                let b: Vec<String> = recs.iter().enumerate().map(|(i, r)| brief(i, r)).collect();
                seen.push(b);
            }
        }
        assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:#?}");
        let b = &seen[0];
        assert!(b[0].contains(" slid=5 dlid=0xc001 grh=1 sgid=fe80:0000:0000:0000:0000:0000:0010:0007 dgid=ff15:4001:ffff:0003:0400:0000:0000:0000 "), "{}", b[0]);
        assert!(b[0].contains(" op=0x64 pkey=0xffff dqp=0xffffff qkey=0x80010000 sqp=0xc36010 len=256 class=0x2c method=0x01 status=0x0000 control=0x0001(RESOLVE) tid=0x0000000000000002 dest=Name:\"hca4\" src=Name:\"hca3\" gid_cnt=1 gid=ff15:"), "{}", b[0]);
        assert!(b[1].contains(" grh=0 op=0x64"), "{}", b[1]);
    }

    #[test]
    fn full_description_decodes_headers_and_acm_fields() {
        let recs = parse_pcap(&pcap(LINKTYPE_ERF, &[acm_frame(true)], true, false)).unwrap();
        let mut out = String::new();
        describe(1, &recs[0], &mut out);
        for want in [
            "LRH: SLID 5 DLID 0xc001 (multicast) SL 0 VL 0 LNH 3 (GRH) PktLen 82 words",
            "GRH: SGID fe80:0000:0000:0000:0000:0000:0010:0007 DGID ff15:4001:ffff:0003:0400:0000:0000:0000",
            "BTH: Opcode 0x64 (UD SEND only) P_Key 0xffff DestQP 0xffffff (multicast) PSN 9 SE 0 PadCnt 0",
            "DETH: Q_Key 0x80010000 SrcQP 0xc36010",
            "Payload: 256 bytes",
            "Method: 0x01 (Get)",
            "Control: 0x0001 (RESOLVE)",
            "Dest: \"hca4\"",
            "Src: \"hca3\"",
            "GIDCount: 1",
            "GID[0]: ff15:4001:ffff:0003:0400:0000:0000:0000",
        ] {
            assert!(out.contains(want), "missing {want:?} in\n{out}");
        }
        assert!(!out.contains("Note:"), "{out}");
    }

    #[test]
    fn padding_immediate_and_bad_lengths() {
        // UD SEND with immediate, 5-byte payload, PadCnt 3, no GRH.
        let mut f = vec![0, 0x02, 0, 6];
        f.extend_from_slice(&(((8 + 12 + 8 + 4 + 8 + 4) / 4) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 5, 0x65, 0xb0, 0xff, 0xff, 0, 0, 0x60, 0x10, 0, 0, 0, 1]);
        f.extend_from_slice(&[0x11, 0x11, 0x11, 0x11, 0, 0, 0x50, 0x10, 1, 2, 3, 4]);
        f.extend_from_slice(b"hello\0\0\0");
        f.extend_from_slice(&[0; 6]);
        let p = parse_ib(&f).unwrap();
        assert_eq!(p.imm, Some(0x0102_0304));
        assert_eq!(p.payload, b"hello");
        assert!(p.solicited && p.pad == 3 && p.notes.is_empty(), "{p:?}");
        // PktLen too large: falls back to the frame length, with a note.
        let mut g = f.clone();
        g[4..6].copy_from_slice(&200u16.to_be_bytes());
        let p = parse_ib(&g).unwrap();
        assert_eq!(p.payload, b"hello");
        assert_eq!(p.notes.len(), 1);
        // Raw packets, truncated frames and non-IB ERF records are errors, not panics.
        let mut raw = f.clone();
        raw[1] = 0;
        assert!(parse_ib(&raw).unwrap_err().contains("LNH 0"));
        for n in 0..f.len() {
            let _ = parse_ib(&f[..n]);
        }
        let mut r = parse_pcap(&pcap(LINKTYPE_ERF, &[f.clone()], true, false)).unwrap();
        r[0].data[8] = 2;
        assert!(ib_frame(&r[0]).unwrap_err().contains("type 2"));
        r[0].linktype = 1;
        assert!(ib_frame(&r[0]).unwrap_err().contains("link type 1"));
    }

    #[test]
    fn malformed_files_are_errors() {
        assert!(parse_pcap(&[0; 10]).unwrap_err().contains("too short"));
        assert!(parse_pcap(&[0; 24]).unwrap_err().contains("not a pcap"));
        let mut ng = vec![0x0a, 0x0d, 0x0d, 0x0a];
        ng.resize(32, 0);
        assert!(parse_pcap(&ng).unwrap_err().contains("pcapng"));
        let p = pcap(LINKTYPE_ERF, &[acm_frame(true)], true, false);
        assert!(parse_pcap(&p[..30]).unwrap_err().contains("truncated"));
        assert!(parse_pcap(&p[..p.len() - 1])
            .unwrap_err()
            .contains("announced"));
        assert_eq!(parse_pcap(&p[..24]).unwrap(), vec![]);
    }

    #[test]
    fn a_huge_record_length_is_an_error_not_an_allocation() {
        // incl_len 0xffffffff (and every other length past the end of the file) is refused
        // before anything is copied: a record's bytes are always a slice of the file.
        for le in [true, false] {
            let mut p = pcap(LINKTYPE_USER0, &[vec![0; 40]], le, false);
            let w = if le {
                u32::MAX.to_le_bytes()
            } else {
                u32::MAX.to_be_bytes()
            };
            p[24 + 8..24 + 12].copy_from_slice(&w);
            let e = parse_pcap(&p).unwrap_err();
            assert!(e.contains("4294967295 bytes announced, 40 left"), "{e}");
            let name = "big.pcap";
            assert!(render(&[(name, &p[..])], true)
                .unwrap_err()
                .starts_with("big.pcap: record 1"));
        }
    }

    #[test]
    fn render_is_run_without_the_files() {
        let a = pcap(LINKTYPE_USER0, &[acm_frame(false)], true, false);
        let b = pcap(LINKTYPE_INFINIBAND, &[acm_frame(true)], false, true);
        let dir = std::env::temp_dir().join(format!("madtool-render-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (fa, fb) = (dir.join("a.pcap"), dir.join("b.pcap"));
        std::fs::write(&fa, &a).unwrap();
        std::fs::write(&fb, &b).unwrap();
        let names = [fa.display().to_string(), fb.display().to_string()];
        for brief_mode in [false, true] {
            assert_eq!(
                run(&names, brief_mode).unwrap(),
                render(&[(&names[0], &a[..]), (&names[1], &b[..])], brief_mode).unwrap()
            );
            assert_eq!(
                run(&names[..1], brief_mode).unwrap(),
                render(&[(&names[0], &a[..])], brief_mode).unwrap()
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
