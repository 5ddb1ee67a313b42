//! Reading the files the provider is configured with: `ibacm_opts.cfg` (path from the core),
//! the address preload (`addr_preload acm_hosts`) and the route preload
//! (`route_preload opensm_full_v1`). Parsing is `acm-core-nostd::text`; this module only reads
//! the files and logs what is wrong with them (a bad line keeps the default / is skipped).

use crate::core_api::CoreApi;
use crate::instance::PortInfo;
use acm_core_nostd::text::dump_pr::{LidTable, LocalPaths, LocalPort};
use acm_core_nostd::text::hosts::HostLines;
use acm_core_nostd::text::opts::{AddrPreload, ProviderOptions};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::path_record::PathRecord;
use acm_core_nostd::wire::Selector;
use acm_dataplane::plane::HostAddr;

/// The options from the core's opts file (defaults when there is none).
pub fn load_options(api: &CoreApi) -> ProviderOptions {
    let Some(path) = api.opts_file() else {
        return ProviderOptions::default();
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            api.log(
                1,
                &format!("opts file {}: {e}; defaults used", path.display()),
            );
            return ProviderOptions::default();
        }
    };
    let (opts, _stats) = ProviderOptions::load(&bytes, |e| {
        api.log(
            0,
            &format!(
                "ERROR - {} line {}: {}; default kept",
                path.display(),
                e.line,
                e.reason()
            ),
        )
    });
    opts
}

/// The address preload: sorted, deduplicated (type, address) → GID entries, at most
/// `acmrs_addr_capacity` of them.
pub fn load_hosts(api: &CoreApi, opts: &ProviderOptions) -> Vec<HostAddr> {
    if opts.addr_preload != AddrPreload::AcmHosts {
        return Vec::new();
    }
    let file = opts.addr_data_file.as_str();
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => {
            api.log(0, &format!("ERROR - addr_data_file {file}: {e}"));
            return Vec::new();
        }
    };
    let mut out: Vec<HostAddr> = Vec::new();
    let cap = opts.acmrs_addr_capacity as usize;
    let mut dropped = 0usize;
    for entry in HostLines::new(&bytes) {
        match entry {
            // acmrs_addr_capacity bounds the address entries (memory stays bounded whatever the
            // file holds); the rest is counted and reported below.
            Ok(_) if out.len() >= cap => dropped += 1,
            Ok(h) => out.push(HostAddr {
                kind: h.address.kind(),
                addr: h.address.to_acm_bytes(),
                gid: Gid(h.gid),
            }),
            Err(e) => api.log(
                0,
                &format!("ERROR - {file} line {}: {}; skipped", e.line, e.reason()),
            ),
        }
    }
    if dropped > 0 {
        api.log(
            0,
            &format!(
                "ERROR - {file}: {dropped} addresses beyond acmrs_addr_capacity {cap} ignored"
            ),
        );
    }
    out.sort_by_key(|e| (e.kind, e.addr));
    out.dedup_by(|a, b| (a.kind, a.addr) == (b.kind, b.addr));
    api.log(
        1,
        &format!("{} host addresses preloaded from {file}", out.len()),
    );
    out
}

/// `route_preload opensm_full_v1`: the local port's section of `route_data_file` (OpenSM's
/// `dump_pr` full format) as paths from this port (SGID = GID0, SLID = the port LID, the
/// endpoint's P_Key, reversible, the dump's raw MTU/rate codes and SL).
pub fn load_routes(
    api: &CoreApi,
    opts: &ProviderOptions,
    port: &PortInfo,
    pkey: u16,
) -> Vec<[u8; 64]> {
    let file = opts.route_data_file.as_str();
    if port.lid == 0 {
        api.log(
            0,
            "ERROR - route preload needs the port LID (ibv_query_port unavailable)",
        );
        return Vec::new();
    }
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => {
            api.log(0, &format!("ERROR - route_data_file {file}: {e}"));
            return Vec::new();
        }
    };
    let mut guid = [0u8; 8];
    guid.copy_from_slice(&port.gid0.0[8..]);
    let local = LocalPort {
        guid: u64::from_be_bytes(guid),
        lid: port.lid,
    };
    let mut table = vec![0u64; 0xc000];
    let report = |e: acm_core_nostd::text::LineError| {
        api.log(
            0,
            &format!("ERROR - {file} line {}: {}", e.line, e.reason()),
        );
    };
    let paths = match LocalPaths::new(&bytes, local, LidTable::Direct(&mut table), report) {
        Ok(p) => p,
        Err(e) => {
            api.log(0, &format!("ERROR - failed to preload EP from {file}: {e}"));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for p in paths {
        let p = match p {
            Ok(p) => p,
            Err(e) => {
                report(e);
                continue;
            }
        };
        let mut dgid = port.gid0;
        dgid.0[8..].copy_from_slice(&p.guid.to_be_bytes());
        let mut r = [0u8; 64];
        let mut pr = PathRecord::new_unchecked(&mut r[..]);
        pr.set_dgid(dgid);
        pr.set_sgid(port.gid0);
        pr.set_dlid(p.dlid);
        pr.set_slid(port.lid);
        pr.set_reversible_numpath(true, 0);
        pr.set_pkey(pkey);
        pr.set_qosclass_sl(0, p.sl);
        // The dump's raw MTU and rate codes, selector bits 0, as ibacmp stores them.
        pr.set_mtu(Selector::from_byte(0), p.mtu);
        pr.set_rate(Selector::from_byte(0), p.rate);
        out.push(r);
    }
    api.log(1, &format!("{} routes preloaded from {file}", out.len()));
    out
}
