//! `madtool`: decode InfiniBand MADs (SA PathRecord / MCMemberRecord, ibacm class 0x2C) and
//! ibacm client messages; capture real SA replies through libibumad.
//!
//! ```text
//! madtool decode <file|->            decode a binary MAD (256 bytes for SA / ACM)
//! madtool decode --hex <hex>         the same, from hex digits
//! madtool decode --client <file|->   decode an ibacm client message (acm_msg)
//! madtool capture --out <dir> [--dlid N] [--dguid G] [--missing-dlid N]
//!                                    send PathRecord GETs and an ACM MCMemberRecord SET to the
//!                                    SA, save requests and replies as <dir>/opensm_*.bin
//! madtool acm-respond <req.bin> <resp.bin>
//!                                    answer an ibacm class 0x2C resolve request as acmp does
//!                                    (GET_RESP, same TID, one GID: the requester's last MGID)
//! madtool pcap [--brief] FILE...     print the IB headers (LRH/GRH/BTH/DETH) and the decoded
//!                                    MAD of every packet of pcap files (ERF 197 type 21,
//!                                    USER0 147, INFINIBAND 247; e.g. from SIMVERBS_PCAP),
//!                                    merged by time; --brief: one key=value line per packet
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
mod umad;

use std::io::Read;
use std::process::ExitCode;

use acm_core_nostd::wire::acm_mad::{AcmMad, AcmResolveRepr, CTRL_RESOLVE};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::mad::Method;
use acm_core_nostd::wire::mcmember::{AcmMgid, McMemberMask, McMemberRecord, McMemberRepr};
use acm_core_nostd::wire::path_record::{
    acm_path_comp_mask, PathRecord, PathRecordQuery, PathRecordRepr,
};
use acm_core_nostd::wire::rate::{Mtu, Rate};
use acm_core_nostd::wire::sa::{SaPacket, SaRepr};
use acm_madtool::{decode, pcap};

const USAGE: &str = "usage:
  madtool decode <file|->
  madtool decode --hex <hex digits>
  madtool decode --client <file|->
  madtool decode --client --hex <hex digits>
  madtool capture --out <dir> [--dlid N] [--dguid GUID] [--missing-dlid N]
  madtool acm-respond <request.bin> <response.bin>
  madtool pcap [--brief] <file.pcap>...";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("decode") => cmd_decode(&args[1..]),
        Some("capture") => cmd_capture(&args[1..]),
        Some("acm-respond") => cmd_acm_respond(&args[1..]),
        Some("pcap") => cmd_pcap(&args[1..]),
        Some("-h") | Some("--help") | Some("help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command '{other}'\n{USAGE}")),
        None => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("madtool: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cmd_decode(args: &[String]) -> Result<(), String> {
    let mut client = false;
    let mut hex: Option<&str> = None;
    let mut file: Option<&str> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--client" => client = true,
            "--hex" => hex = Some(it.next().ok_or("--hex needs an argument")?),
            f if file.is_none() && hex.is_none() => file = Some(f),
            other => return Err(format!("unexpected argument '{other}'\n{USAGE}")),
        }
    }
    let bytes = match (hex, file) {
        (Some(h), None) => decode::parse_hex(h)?,
        (None, Some("-")) => {
            let mut v = Vec::new();
            std::io::stdin()
                .read_to_end(&mut v)
                .map_err(|e| format!("reading stdin: {e}"))?;
            v
        }
        (None, Some(f)) => std::fs::read(f).map_err(|e| format!("reading {f}: {e}"))?,
        _ => {
            return Err(format!(
                "decode needs exactly one of <file|-> or --hex\n{USAGE}"
            ))
        }
    };
    let text = if client {
        decode::decode_client(&bytes)?
    } else {
        decode::decode_mad(&bytes)?
    };
    print!("{text}");
    Ok(())
}

fn cmd_pcap(args: &[String]) -> Result<(), String> {
    let mut brief = false;
    let mut files = Vec::new();
    for a in args {
        match a.as_str() {
            "--brief" => brief = true,
            f if f.starts_with("--") => return Err(format!("unexpected option '{f}'\n{USAGE}")),
            f => files.push(f.to_string()),
        }
    }
    if files.is_empty() {
        return Err(format!("pcap needs at least one file\n{USAGE}"));
    }
    print!("{}", pcap::run(&files, brief)?);
    Ok(())
}

fn parse_num(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("'{s}' is not a number"))
}

fn cmd_capture(args: &[String]) -> Result<(), String> {
    let mut out: Option<String> = None;
    // Defaults fit ibsim's net.2sw2path4hca with OpenSM: Hca4 = LID 6, Hca3 GUID 0x100007.
    let mut dlid = 6u64;
    let mut dguid = 0x10_0007u64;
    let mut missing = 0x99u64;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs an argument"));
        match a.as_str() {
            "--out" => out = Some(val()?.clone()),
            "--dlid" => dlid = parse_num(val()?)?,
            "--dguid" => dguid = parse_num(val()?)?,
            "--missing-dlid" => missing = parse_num(val()?)?,
            other => return Err(format!("unexpected argument '{other}'\n{USAGE}")),
        }
    }
    let out = out.ok_or(format!("capture needs --out <dir>\n{USAGE}"))?;
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {out}: {e}"))?;
    let agent = umad::SaAgent::open()?;
    let me = agent.info().clone();
    eprintln!(
        "port {}:{} LID {} SM LID {} GUID 0x{:x}",
        me.ca_name, me.port, me.lid, me.sm_lid, me.port_guid
    );
    let sgid = Gid::from_parts(me.gid_prefix, me.port_guid);

    let mut requests: Vec<(&str, [u8; 256])> = Vec::new();
    // 1. By LID; requires SL 0 and P_Key 0xffff explicitly (values the core's mask would drop).
    let q = PathRecordQuery::new()
        .slid(me.lid)
        .dlid(dlid as u16)
        .reversible(true)
        .pkey(0xffff)
        .sl(0);
    requests.push(("pr_get_lid", path_get(1, q.record(), q.mask().bits())));
    // 2. By GID, with ibacm's own comp-mask rule (as acmp sends after ACM address resolution).
    let by_gid = PathRecordRepr {
        sgid,
        dgid: Gid::from_parts(me.gid_prefix, dguid),
        pkey: 0xffff,
        ..PathRecordRepr::ZERO
    };
    requests.push((
        "pr_get_gid",
        path_get(2, &by_gid, acm_path_comp_mask(&by_gid).bits()),
    ));
    // 3. A LID nobody has: the SA answers ERR_NO_RECORDS.
    let q = PathRecordQuery::new().slid(me.lid).dlid(missing as u16);
    requests.push(("pr_get_norec", path_get(3, q.record(), q.mask().bits())));
    // 4. ibacm's base-group join: MGID ff15:4001:ffff:0003:0400::, 10 Gb/s, 2048 MTU.
    let rate: u8 = Rate::Gbps10.into();
    let mtu: u8 = Mtu::Mtu2048.into();
    let mgid = AcmMgid {
        pkey: 0xffff,
        tos: 0,
        rate,
        mtu,
    }
    .to_gid();
    let join = McMemberRepr::acm_join(mgid, sgid, 0xffff, rate, mtu);
    let mut mad = [0u8; 256];
    SaRepr::mcmember_set(4, McMemberMask::ACM_JOIN.bits())
        .emit(&mut SaPacket::new_unchecked(&mut mad[..]));
    join.emit(&mut McMemberRecord::new_unchecked(
        SaPacket::new_unchecked(&mut mad[..]).data_mut(),
    ));
    requests.push(("mcm_set", mad));

    for (name, req) in &requests {
        let resp = agent.query(req, 1000)?;
        for (suffix, bytes) in [("req", req), ("resp", &resp)] {
            let path = format!("{out}/opensm_{name}_{suffix}.bin");
            std::fs::write(&path, bytes).map_err(|e| format!("writing {path}: {e}"))?;
        }
        eprintln!(
            "{name}: method 0x{:02x} status 0x{:04x}",
            resp[3],
            u16::from_be_bytes([resp[4], resp[5]])
        );
    }
    Ok(())
}

fn path_get(tid: u64, record: &PathRecordRepr, mask: u64) -> [u8; 256] {
    let mut mad = [0u8; 256];
    SaRepr::path_record_get(tid, mask).emit(&mut SaPacket::new_unchecked(&mut mad[..]));
    record.emit(&mut PathRecord::new_unchecked(
        SaPacket::new_unchecked(&mut mad[..]).data_mut(),
    ));
    mad
}

/// Builds acmp's answer to a resolve request: GET_RESP, same TID, `gid_cnt = 1` with the
/// requester's last (most preferred) MGID, addresses zero.
fn cmd_acm_respond(args: &[String]) -> Result<(), String> {
    let [req, out] = args else {
        return Err(format!(
            "acm-respond needs <request.bin> <response.bin>\n{USAGE}"
        ));
    };
    let bytes = std::fs::read(req).map_err(|e| format!("reading {req}: {e}"))?;
    let r = AcmResolveRepr::parse(
        &AcmMad::new_checked(&bytes[..])
            .map_err(|_| format!("{req}: {} bytes; an ACM MAD is 256", bytes.len()))?,
    )
    .map_err(|e| format!("{req}: not an ACM resolve MAD ({e})"))?;
    if r.method != Method::Get || r.control & 0x7fff != CTRL_RESOLVE {
        return Err(format!(
            "{req}: not a resolve request (method {:?}, control 0x{:04x})",
            r.method, r.control
        ));
    }
    let mgid = *r
        .gids()
        .last()
        .ok_or(format!("{req}: request carries no MGID"))?;
    let mut mad = [0u8; 256];
    AcmResolveRepr::response(r.tid, mgid)
        .emit(&mut AcmMad::new_unchecked(&mut mad[..]))
        .map_err(|e| format!("encoding the response: {e}"))?;
    std::fs::write(out, mad).map_err(|e| format!("writing {out}: {e}"))
}
