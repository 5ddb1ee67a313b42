//! Hosts as they are built, with the real ibacm daemon: two HCAs of one port each, a dual-port
//! HCA on one subnet, a dual-port HCA with a port on each of two subnets (two OpenSMs, two
//! prefixes). Real OpenSM, real `ib_acme`, stock and acmrs mixed, no hosts file, every path
//! SA-verified (`ib_acme -v`). simverbs presents each host's ports to the daemon
//! (`SIMVERBS_HOST`, docs/simverbs.md); docs/shapes.md has the table.
//!
//! Needs root and `libsimverbs.so` + `libacmrs.so` in the target directory.

use acm_fabric::checks::{require_root, SA_VERIFIED};
use acm_fabric::{Fabric, HostPort, HostSpec, HostsFile, Output, Provider, SubnetSpec, Topology};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A scratch directory of the test's own (the daemons' captures), removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("acmrs-hosts-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The address of port `p` in `ib_acme -f fmt` form.
fn addr(p: &HostPort, fmt: &str) -> String {
    match fmt {
        "n" => p.name.clone(),
        "i4" => p.ipv4.to_string(),
        "i6" => p.ipv6.to_string(),
        "g" => p.gid.to_string(),
        "l" => p.lid.to_string(),
        _ => panic!("no format {fmt}"),
    }
}

/// `ib_acme -f FMT -s <src port> -d <dst port> -v` on `on`, retried until the SA verified it
/// (the first calls race the endpoints' joins); the path must be from `src` (its SGID and
/// SLID: the request was answered from that port) to `dst`.
fn resolve(f: &Fabric, on: &str, fmt: &str, src: &HostPort, dst: &HostPort) -> Output {
    let node = f.node(on).unwrap();
    let flag = if fmt.starts_with('i') { "i" } else { fmt };
    let (s, d) = (addr(src, fmt), addr(dst, fmt));
    let out = node
        .acme_until(
            &["-f", flag, "-s", &s, "-d", &d, "-v"],
            Duration::from_secs(20),
            |o| o.stdout.contains(SA_VERIFIED),
        )
        .unwrap();
    let what = format!("-f {fmt} {s} -> {d} on {on} ({})", node.provider().name());
    assert!(
        out.success() && out.stdout.contains(SA_VERIFIED),
        "{what}:\n{out}\n{}",
        f.logs_report()
    );
    for want in [
        format!("dgid: {}\n", dst.gid),
        format!("sgid: {}\n", src.gid),
        format!("dlid: {}\n", dst.lid),
        format!("slid: {}\n", src.lid),
    ] {
        assert!(
            out.stdout.contains(&want),
            "{what}: {want:?} missing:\n{out}"
        );
    }
    out
}

/// Every PathRecord query (SubnAdm Get/GetTable of attribute 0x35) in a daemon's capture:
/// (the LRH SLID it left from, the record's SGID, the record's SLID).
fn path_queries(pcap: &Path) -> Vec<(u16, [u8; 16], u16)> {
    let Ok(b) = std::fs::read(pcap) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut o = 24;
    while o + 16 <= b.len() {
        let len = u32::from_le_bytes([b[o + 8], b[o + 9], b[o + 10], b[o + 11]]) as usize;
        let fr = &b[o + 16..(o + 16 + len).min(b.len())];
        o += 16 + len;
        // ERF header (16), LRH (8; LNH 3 = a GRH follows), BTH (12), DETH (8), the MAD.
        if fr.len() < 16 + 8 {
            continue;
        }
        let grh = if fr[16 + 1] & 3 == 3 { 40 } else { 0 };
        let m = 16 + 8 + grh + 12 + 8;
        if fr.len() < m + 56 + 44 {
            continue;
        }
        let mad = &fr[m..];
        let attr = u16::from_be_bytes([mad[16], mad[17]]);
        if mad[1] != 3 || attr != 0x35 || !matches!(mad[3], 0x01 | 0x12) || mad[25] == 2 {
            continue; // not a PathRecord query (or an RMPP ACK of one)
        }
        let slid = u16::from_be_bytes([fr[16 + 6], fr[16 + 7]]);
        let mut sgid = [0u8; 16];
        sgid.copy_from_slice(&mad[56 + 24..56 + 40]);
        out.push((slid, sgid, u16::from_be_bytes([mad[56 + 42], mad[56 + 43]])));
    }
    out
}

/// Each daemon's SA traffic left from the port whose path it asked for: every PathRecord
/// query of node `n` (its capture, `SIMVERBS_PCAP` with `%p`) with an SGID left from the LID
/// of the port owning that GID (with only an SLID, from that LID), and every port of the
/// node carried at least one (so the check cannot pass by finding nothing).
fn check_sa_carriers(f: &Fabric, n: &str, captures: &Path) {
    let node = f.node(n).unwrap();
    let pid = node.pid().expect("daemon running");
    let pcap = captures.join(format!("sa-{pid}.pcap"));
    let q = path_queries(&pcap);
    let mut per_port = vec![0usize; node.ports.len()];
    for (lrh_slid, sgid, rec_slid) in &q {
        let owner = if *sgid != [0u8; 16] {
            node.ports
                .iter()
                .position(|p| p.gid.octets() == *sgid)
                .unwrap_or_else(|| {
                    panic!("{n}: a PathRecord query for SGID {sgid:?}, no port of ours")
                })
        } else if *rec_slid != 0 {
            node.ports
                .iter()
                .position(|p| p.lid == *rec_slid && p.lid == *lrh_slid)
                .unwrap_or_else(|| {
                    panic!("{n}: a query for SLID {rec_slid} left from LID {lrh_slid}")
                })
        } else {
            continue;
        };
        assert_eq!(
            node.ports[owner].lid, *lrh_slid,
            "{n}: a query for {}'s path left from LID {lrh_slid}, not from its own port",
            node.ports[owner].name
        );
        per_port[owner] += 1;
    }
    for (p, c) in node.ports.iter().zip(&per_port) {
        assert!(
            *c > 0,
            "{n}: no PathRecord query left {} {} ({} in the capture)",
            p.ca,
            p.port,
            q.len()
        );
    }
}

/// Two HCAs of one port each (Hca2: ibsim0 = Hca2, ibsim1 = Hca6) and a dual-port HCA on one
/// subnet (Hca3: ibsim0 ports 1 and 2 = Hca3, Hca7), both loading `hosts`, and a one-port peer
/// Hca4 loading `peer`: every port lists its endpoint; names, IPv4, IPv6 of every port
/// resolve from every port of every other host, each answered from the source's port; GIDs
/// and LIDs pick the port too; each daemon's SA queries leave from the port they are for.
fn hosts_of_several_ports(tag: &str, hosts: Provider, peer: Provider) {
    require_root();
    let cap = Scratch::new(tag);
    let f = Fabric::builder(
        Topology::parse("fattree:2,1,4").unwrap(),
        ["Hca2", "Hca3", "Hca4"],
    )
    .sm_node("Hca1")
    .provider(hosts.clone())
    .node_provider("Hca4", peer.clone())
    .host("Hca2", HostSpec::parse("Hca2,Hca6").unwrap())
    .host("Hca3", HostSpec::parse("Hca3+Hca7").unwrap())
    .hosts_file(HostsFile::Absent)
    .daemon_env(
        "SIMVERBS_PCAP",
        &cap.0.join("sa-%p.pcap").display().to_string(),
    )
    .option("timeout", "500")
    .name_prefix(tag)
    .start()
    .unwrap_or_else(|e| panic!("bring-up failed: {e}"));

    // ib_acme -e: a row per port, each with its CA's GUID, its port number and its provider.
    for (n, rows) in [
        ("Hca2", [("0x", "ibsim0", 1), ("0x", "ibsim1", 1)]),
        ("Hca3", [("0x", "ibsim0", 1), ("0x", "ibsim0", 2)]),
    ] {
        let node = f.node(n).unwrap();
        let e = node.acme(&["-e"]).unwrap();
        for (_, ca, port) in rows {
            let p = node.port_of(ca, port).unwrap();
            let first = node.port_of(ca, 1).unwrap();
            let guid = format!("{:#018x}", HostPort::ca_guid_of(first.gid));
            // svc,guid,port,pkey,ep_index,prov,addr_0,... (the core numbers endpoints per
            // device).
            let listed = e.stdout.lines().any(|l| {
                let c: Vec<&str> = l.split(',').collect();
                c.len() >= 7
                    && c[1] == guid
                    && c[2] == port.to_string()
                    && c[3] == "0xffff"
                    && c[5] == hosts.name()
                    && c[6] == p.name
            });
            assert!(
                listed,
                "{n} -e lacks {guid} port {port} ({}, {}):\n{e}",
                hosts.name(),
                p.name
            );
        }
        // The two CAs of Hca2 are two devices; the dual-port HCA is one.
        let cas: std::collections::BTreeSet<&str> =
            node.ports.iter().map(|p| p.ca.as_str()).collect();
        assert_eq!(
            cas.len(),
            if n == "Hca2" { 2 } else { 1 },
            "{n}: {:?}",
            node.ports
        );
    }

    // Every port of every host, from every port of every other host, by name and both IPs.
    let names = ["Hca2", "Hca3", "Hca4"];
    for on in names {
        for to in names.iter().filter(|t| **t != on) {
            let (a, b) = (f.node(on).unwrap(), f.node(to).unwrap());
            for s in &a.ports {
                for d in &b.ports {
                    for fmt in ["n", "i4", "i6"] {
                        resolve(&f, on, fmt, s, d);
                    }
                }
            }
        }
    }
    // GIDs and LIDs name the source port directly (the core picks the endpoint by SGID and
    // by SLID).
    for on in ["Hca2", "Hca3"] {
        let a = f.node(on).unwrap();
        let d = &f.node("Hca4").unwrap().ports[0];
        for s in &a.ports {
            resolve(&f, on, "g", s, d);
            resolve(&f, on, "l", s, d);
        }
    }
    for n in names {
        check_sa_carriers(&f, n, &cap.0);
    }
    // One worker serves every port: acmrs runs one dataplane thread per daemon.
    for n in names
        .iter()
        .filter(|n| f.node(n).unwrap().provider().name() == "acmrs")
    {
        let pid = f.node(n).unwrap().pid().unwrap();
        let threads = acm_fabric::process::threads_of(pid)
            .into_iter()
            .filter(|t| {
                std::fs::read_to_string(format!("/proc/{pid}/task/{t}/comm"))
                    .is_ok_and(|c| c.starts_with("acmrs-dataplan"))
            })
            .count();
        assert_eq!(threads, 1, "{n}: acmrs dataplane threads");
    }
}

#[test]
fn acmrs_hosts_of_two_hcas_and_a_dual_port_hca_with_a_stock_peer() {
    hosts_of_several_ports("hosts-acmrs", Provider::Acmrs, Provider::Stock);
}

#[test]
fn stock_hosts_of_two_hcas_and_a_dual_port_hca_with_an_acmrs_peer() {
    hosts_of_several_ports("hosts-stock", Provider::Stock, Provider::Acmrs);
}

#[allow(dead_code)]
fn unused(_: Instant, _: SubnetSpec) {}
