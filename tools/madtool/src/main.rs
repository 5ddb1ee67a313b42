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
use std::path::PathBuf;
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
use clap::{ArgGroup, Parser, Subcommand};

/// Decode InfiniBand MADs (SA PathRecord / MCMemberRecord, ibacm class 0x2C) and ibacm client
/// messages; capture real SA replies through libibumad; decode pcap captures.
#[derive(Parser)]
#[command(name = "madtool", version, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Decode a binary MAD (256 bytes for SA / ACM) or, with --client, an ibacm client message
    #[command(group(ArgGroup::new("input").required(true).args(["file", "hex"])))]
    Decode {
        /// The bytes: a file, or - for stdin
        #[arg(value_name = "file|-")]
        file: Option<String>,
        /// The bytes as hex digits instead of a file
        #[arg(long, value_name = "hex digits")]
        hex: Option<String>,
        /// An ibacm client message (acm_msg: RESOLVE in native order, PERF_QUERY big-endian)
        #[arg(long)]
        client: bool,
    },
    /// Send PathRecord GETs and an ACM MCMemberRecord SET to the SA; save requests and replies
    /// as DIR/opensm_*.bin
    Capture {
        /// Where the .bin files go (created if missing)
        #[arg(long, value_name = "dir")]
        out: String,
        /// Destination LID of the PathRecord GET by LID (defaults fit ibsim's
        /// net.2sw2path4hca with OpenSM: Hca4)
        #[arg(long, value_name = "N", default_value = "6", value_parser = parse_num)]
        dlid: u64,
        /// Destination port GUID of the PathRecord GET by GID (Hca3)
        #[arg(long, value_name = "GUID", default_value = "0x100007", value_parser = parse_num)]
        dguid: u64,
        /// A LID nobody has: the SA answers ERR_NO_RECORDS
        #[arg(long, value_name = "N", default_value = "0x99", value_parser = parse_num)]
        missing_dlid: u64,
    },
    /// Answer an ibacm class 0x2C resolve request as acmp does (GET_RESP, same TID, one GID:
    /// the requester's last MGID)
    AcmRespond {
        /// The request MAD
        #[arg(value_name = "request.bin")]
        request: PathBuf,
        /// Where the response MAD goes
        #[arg(value_name = "response.bin")]
        response: PathBuf,
    },
    /// Print the IB headers (LRH/GRH/BTH/DETH) and the decoded MAD of every packet of pcap
    /// files (ERF 197 type 21, USER0 147, INFINIBAND 247; e.g. from SIMVERBS_PCAP), merged by
    /// time
    Pcap {
        /// One key=value line per packet
        #[arg(long)]
        brief: bool,
        /// The capture files
        #[arg(value_name = "file.pcap")]
        files: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli: Cli = acm_report::cli::parse(1);
    let result = match cli.cmd {
        Cmd::Decode { file, hex, client } => cmd_decode(file.as_deref(), hex.as_deref(), client),
        Cmd::Capture {
            out,
            dlid,
            dguid,
            missing_dlid,
        } => cmd_capture(&out, dlid, dguid, missing_dlid),
        Cmd::AcmRespond { request, response } => cmd_acm_respond(&request, &response),
        Cmd::Pcap { brief, files } => cmd_pcap(&files, brief),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("madtool: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cmd_decode(file: Option<&str>, hex: Option<&str>, client: bool) -> Result<(), String> {
    let bytes = match (hex, file) {
        (Some(h), _) => decode::parse_hex(h)?,
        (None, Some("-")) => {
            let mut v = Vec::new();
            std::io::stdin()
                .read_to_end(&mut v)
                .map_err(|e| format!("reading stdin: {e}"))?;
            v
        }
        (None, Some(f)) => std::fs::read(f).map_err(|e| format!("reading {f}: {e}"))?,
        (None, None) => unreachable!("clap requires <file|-> or --hex"),
    };
    let text = if client {
        decode::decode_client(&bytes)?
    } else {
        decode::decode_mad(&bytes)?
    };
    print!("{text}");
    Ok(())
}

fn cmd_pcap(files: &[String], brief: bool) -> Result<(), String> {
    // Checked here, not by clap, to keep madtool's own message for it.
    if files.is_empty() {
        return Err("pcap needs at least one file (madtool pcap --help)".into());
    }
    print!("{}", pcap::run(files, brief)?);
    Ok(())
}

/// A number, decimal or `0x` hex.
fn parse_num(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("'{s}' is not a number"))
}

fn cmd_capture(out: &str, dlid: u64, dguid: u64, missing: u64) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("creating {out}: {e}"))?;
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
fn cmd_acm_respond(request: &std::path::Path, out: &std::path::Path) -> Result<(), String> {
    let req = request.display();
    let bytes = std::fs::read(request).map_err(|e| format!("reading {req}: {e}"))?;
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
    std::fs::write(out, mad).map_err(|e| format!("writing {}: {e}", out.display()))
}
