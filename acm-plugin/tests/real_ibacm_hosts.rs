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

/// Every frame of a daemon's capture (`SIMVERBS_PCAP`): (its LRH SLID, its MAD).
fn mads(pcap: &Path) -> Vec<(u16, Vec<u8>)> {
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
        if fr.len() >= m + 256 {
            out.push((
                u16::from_be_bytes([fr[16 + 6], fr[16 + 7]]),
                fr[m..m + 256].to_vec(),
            ));
        }
    }
    out
}

/// The SA attribute of a SubnAdm MAD with method `method`, else None.
fn sa_attr(mad: &[u8], method: u8) -> Option<u16> {
    (mad[1] == 3 && mad[3] == method).then(|| u16::from_be_bytes([mad[16], mad[17]]))
}

/// Every PathRecord query (SubnAdm Get/GetTable of attribute 0x35) in a daemon's capture:
/// (the LRH SLID it left from, the record's SGID, the record's SLID).
fn path_queries(pcap: &Path) -> Vec<(u16, [u8; 16], u16)> {
    mads(pcap)
        .into_iter()
        .filter(|(_, mad)| {
            // Not an RMPP ACK of one (RMPP type 2).
            mad[25] != 2 && [0x01, 0x12].iter().any(|m| sa_attr(mad, *m) == Some(0x35))
        })
        .map(|(slid, mad)| {
            let mut sgid = [0u8; 16];
            sgid.copy_from_slice(&mad[56 + 24..56 + 40]);
            (slid, sgid, u16::from_be_bytes([mad[56 + 42], mad[56 + 43]]))
        })
        .collect()
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
    let mut f = Fabric::builder(
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
    // Kernel consumers (RDMA netlink local service): the core routes each by its SGID to the
    // port of that GID; the answer is that port's path.
    let peer = f.node("Hca4").unwrap().ports[0].clone();
    for on in ["Hca2", "Hca3"] {
        for s in &f.node(on).unwrap().ports {
            let q = acm_fabric::kernel::LsQuery {
                sgid: acm_core_nostd::wire::gid::Gid(s.gid.octets()),
                dgid: acm_core_nostd::wire::gid::Gid(peer.gid.octets()),
                reversible: true,
                ..Default::default()
            };
            let mut k = f.node(on).unwrap().kernel().unwrap();
            let t = Instant::now();
            let a = loop {
                let a = k.resolve(&q, Duration::from_secs(5)).unwrap();
                if matches!(a, acm_fabric::kernel::LsAnswer::Path(..))
                    || t.elapsed() > Duration::from_secs(20)
                {
                    break a;
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            let acm_fabric::kernel::LsAnswer::Path(_, p) = a else {
                panic!("{on}: the kernel's request from {} got {a:?}", s.name);
            };
            assert_eq!(
                (p.slid, p.sgid.0, p.dlid),
                (s.lid, s.gid.octets(), peer.lid),
                "{on} {}",
                s.name
            );
        }
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
    bad_address_lines(&mut f, "Hca3");
}

/// Address-file lines for a device or port the host does not have: the core assigns them to
/// no endpoint (it matches lines to its endpoints by device and port, and says nothing of the
/// rest), the daemon comes up and serves its real ports, and no such name resolves.
fn bad_address_lines(f: &mut Fabric, n: &str) {
    let node = f.node_mut(n).unwrap();
    node.stop_daemon();
    let cfg = node.dir.join("ibacm_addr.cfg");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("ghost-p3 ibsim0 3 default\nghost-ca ibsim7 1 default\n");
    std::fs::write(&cfg, text).unwrap();
    node.restart_daemon()
        .unwrap_or_else(|e| panic!("{n} with bad address lines: {e}"));
    let e = node.acme(&["-e"]).unwrap();
    assert!(!e.stdout.contains("ghost"), "{n} -e:\n{e}");
    assert_eq!(
        e.stdout
            .lines()
            .filter(|l| l.starts_with("127.0.0.1,"))
            .count(),
        node.ports.len(),
        "{n}: one endpoint per real port:\n{e}"
    );
    let peer = f.node("Hca4").unwrap();
    let r = peer
        .acme(&["-f", "n", "-s", &peer.addrs.name, "-d", "ghost-p3"])
        .unwrap();
    assert!(
        !r.stdout.contains("Path information"),
        "ghost-p3 resolved:\n{r}"
    );
    let (s, d) = (peer.ports[0].clone(), f.node(n).unwrap().ports[1].clone());
    resolve(f, "Hca4", "n", &s, &d);
}

#[test]
fn acmrs_hosts_of_two_hcas_and_a_dual_port_hca_with_a_stock_peer() {
    hosts_of_several_ports("hosts-acmrs", Provider::Acmrs, Provider::Stock);
}

#[test]
fn stock_hosts_of_two_hcas_and_a_dual_port_hca_with_an_acmrs_peer() {
    hosts_of_several_ports("hosts-stock", Provider::Stock, Provider::Acmrs);
}

/// Set(MCMemberRecord) joins in a daemon's capture, by the record's PortGID.
fn joins_by_port(pcap: &Path) -> Vec<[u8; 16]> {
    mads(pcap)
        .into_iter()
        .filter(|(_, mad)| sa_attr(mad, 0x02) == Some(0x38))
        .map(|(_, mad)| {
            let mut g = [0u8; 16];
            g.copy_from_slice(&mad[56 + 16..56 + 32]);
            g
        })
        .collect()
}

/// The GID of a port of `prefix` with port GUID `guid`.
fn gid(prefix: u64, guid: u64) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::from((u128::from(prefix) << 64) | u128::from(guid))
}

const S2: u64 = acm_fabric::host::SECOND_PREFIX;

/// A dual-port HCA with a port on each of two subnets (two OpenSMs, two prefixes): Hca2 =
/// Hca2 + s2:Hca3 with `provider <default> default` and `provider <s2> 0x<s2 prefix>`, Hca3 =
/// Hca3 + s2:Hca4 loading `other`, Hca4 a one-port host of the main subnet loading `other`.
/// Each port gets the provider its prefix selects; a destination on s2 goes out the port on
/// s2; a reregister on s2, and s2's SM moving, rejoin the acmrs ports on s2 only (and their
/// misses reach the new SM); with s2's SM stopped, only s2's misses
/// fail, in bounded time, while hits and the main subnet's misses are answered.
fn a_port_on_each_of_two_subnets(tag: &str, default: Provider, on_s2: Provider, other: Provider) {
    require_root();
    let cap = Scratch::new(tag);
    let topo = Topology::parse("fattree:2,1,4").unwrap();
    let s2 = SubnetSpec::parse("s2=net.2sw2path4hca@Hca1").unwrap();
    let mut f = Fabric::builder(topo, ["Hca2", "Hca3", "Hca4"])
        .sm_node("Hca1")
        .provider(other.clone())
        .node_provider("Hca2", default.clone())
        .node_extra_provider("Hca2", on_s2.clone())
        .node_option("Hca2", "provider", &format!("{} {S2:#x}", on_s2.name()))
        .subnet(s2)
        .host("Hca2", HostSpec::parse("Hca2+s2:Hca3").unwrap())
        .host("Hca3", HostSpec::parse("Hca3+s2:Hca4").unwrap())
        .hosts_file(HostsFile::Absent)
        .daemon_env(
            "SIMVERBS_PCAP",
            &cap.0.join("sa-%p.pcap").display().to_string(),
        )
        .option("timeout", "500")
        .option("retries", "2")
        .name_prefix(tag)
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));

    // The ports on s2 have s2's prefix; each port of Hca2 has the provider its prefix picks.
    let h2 = f.node("Hca2").unwrap();
    assert_eq!(
        u128::from(h2.ports[1].gid) >> 64,
        u128::from(S2),
        "{:?}",
        h2.ports
    );
    assert_eq!(
        u128::from(h2.ports[0].gid) >> 64,
        0xfe80_0000_0000_0000,
        "{:?}",
        h2.ports
    );
    let e = h2.acme(&["-e"]).unwrap();
    let guid = format!("{:#018x}", HostPort::ca_guid_of(h2.ports[0].gid));
    for (port, prov) in [(1, default.name()), (2, on_s2.name())] {
        let row = format!("{guid},{port},0xffff,");
        assert!(
            e.stdout
                .lines()
                .any(|l| l.contains(&row) && l.contains(&format!(",{prov},"))),
            "Hca2 -e: port {port} should be {prov}:\n{e}"
        );
    }
    let want = format!("Found provider {} for port ibsim0/2", on_s2.name());
    assert!(h2.log().contains(&want), "Hca2's log lacks {want:?}");

    // Within each subnet, every direction, by name, IP and GID.
    for (on, to, i) in [
        ("Hca2", "Hca3", 1),
        ("Hca3", "Hca2", 1),
        ("Hca2", "Hca3", 0),
        ("Hca3", "Hca4", 0),
        ("Hca4", "Hca2", 0),
    ] {
        let (a, b) = (f.node(on).unwrap(), f.node(to).unwrap());
        for fmt in ["n", "i4", "i6", "g"] {
            resolve(&f, on, fmt, &a.ports[i], &b.ports[i.min(b.ports.len() - 1)]);
        }
    }
    // A destination GID on s2, no source: the core takes the endpoint of s2's prefix, so the
    // path starts at Hca2's port on s2.
    let d = &f.node("Hca3").unwrap().ports[1];
    let out = h2
        .acme_until(
            &["-f", "g", "-d", &d.gid.to_string(), "-v"],
            Duration::from_secs(20),
            |o| o.stdout.contains(SA_VERIFIED),
        )
        .unwrap();
    assert!(
        out.stdout.contains(&format!("sgid: {}\n", h2.ports[1].gid))
            && out.stdout.contains(SA_VERIFIED),
        "{out}"
    );
    for n in ["Hca2", "Hca3", "Hca4"] {
        check_sa_carriers(&f, n, &cap.0);
    }

    // Trap subscriptions: every acmrs port subscribes at its own subnet's SM, with its own
    // GID, once per trap; stock ports do not subscribe.
    for (sub, probe) in [("", "Hca5"), ("s2", "Hca2")] {
        let out = f
            .fabric_of(sub)
            .unwrap()
            .run_tool(probe, "saquery", &["-I"])
            .unwrap();
        for n in ["Hca2", "Hca3", "Hca4"] {
            let node = f.node(n).unwrap();
            for p in node.ports.iter().filter(|p| p.subnet == sub) {
                let acmrs = match (n, p.index) {
                    ("Hca2", 1) => default.name() == "acmrs",
                    ("Hca2", _) => on_s2.name() == "acmrs",
                    _ => other.name() == "acmrs",
                };
                let traps: Vec<&str> = out
                    .stdout
                    .split("InformInfoRecord dump:")
                    .filter(|r| r.contains(&format!("SubscriberGID...........{}\n", p.gid)))
                    .filter_map(|r| r.lines().find(|l| l.contains("trap_num")))
                    .collect();
                let mut distinct = traps.clone();
                distinct.sort();
                distinct.dedup();
                if acmrs {
                    assert!(
                        !traps.is_empty(),
                        "{n} {}: no subscription at its SM:\n{out}",
                        p.name
                    );
                    assert_eq!(
                        distinct.len(),
                        traps.len(),
                        "{n} {}: a trap twice: {traps:?}",
                        p.name
                    );
                } else {
                    assert!(
                        traps.is_empty(),
                        "{n} {} (stock) subscribed: {traps:?}",
                        p.name
                    );
                }
            }
        }
    }

    // A client reregister on s2 rejoins the ports on s2 and nothing else.
    let pcaps: Vec<(&str, PathBuf)> = ["Hca2", "Hca3", "Hca4"]
        .into_iter()
        .map(|n| {
            let pid = f.node(n).unwrap().pid().unwrap();
            (n, cap.0.join(format!("sa-{pid}.pcap")))
        })
        .collect();
    let pcap = |n: &str| pcaps.iter().find(|(m, _)| *m == n).unwrap().1.clone();
    let count = |n: &str, g: std::net::Ipv6Addr| {
        joins_by_port(&pcap(n))
            .iter()
            .filter(|j| **j == g.octets())
            .count()
    };
    let before: Vec<(usize, usize)> = ["Hca2", "Hca3"]
        .iter()
        .map(|n| {
            let p = &f.node(n).unwrap().ports;
            (count(n, p[0].gid), count(n, p[1].gid))
        })
        .collect();
    assert_eq!(f.client_reregister_subnet("s2").unwrap(), 2);
    let t = Instant::now();
    for (i, n) in ["Hca2", "Hca3"].iter().enumerate() {
        let p = f.node(n).unwrap().ports.clone();
        loop {
            let log = f.node(n).unwrap().log();
            if log.contains("ibsim0 2 has reregistered") && count(n, p[1].gid) > before[i].1 {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "{n}: no rejoin of its s2 port after the reregister:\n{}",
                f.logs_report()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !f.node(n)
                .unwrap()
                .log()
                .contains("ibsim0 1 has reregistered"),
            "{n}"
        );
        assert_eq!(
            count(n, p[0].gid),
            before[i].0,
            "{n}: its main-subnet port joined again"
        );
    }

    // s2's SM moves to s2's free HCA (same LIDs, a new SM LID): the acmrs ports on s2 see
    // it within their SM check, drop what the old SM taught and join at the new one; no
    // port of the main subnet joins again or logs an SM change. (Stock ports do not follow
    // an SM move: the core drops SM_CHANGE and reads the SA's LID at port-up only.)
    let acmrs_on_s2 = |n: &str| match n {
        "Hca2" => on_s2.name() == "acmrs",
        _ => other.name() == "acmrs",
    };
    let acmrs_nodes: Vec<&str> = ["Hca2", "Hca3", "Hca4"]
        .into_iter()
        .filter(|n| *n == "Hca2" && default.name() == "acmrs" || acmrs_on_s2(n))
        .collect();
    let before: Vec<(usize, usize, usize)> = ["Hca2", "Hca3", "Hca4"]
        .iter()
        .map(|n| {
            let p = &f.node(n).unwrap().ports;
            (
                count(n, p[0].gid),
                p.get(1).map_or(0, |p| count(n, p.gid)),
                sm_changes(&f, n),
            )
        })
        .collect();
    let main_before: Vec<u16> = ["Hca2", "Hca3"]
        .iter()
        .map(|n| f.port_info(n).unwrap().sm_lid)
        .collect();
    f.subnet_mut("s2")
        .unwrap()
        .move_sm("Hca2", false)
        .unwrap_or_else(|e| panic!("moving s2's SM: {e}"));
    let (_, new_sm) = acm_fabric::fabric::parse_ibaddr(
        &f.subnet("s2")
            .unwrap()
            .run_tool("Hca2", "ibaddr", &[])
            .unwrap()
            .stdout,
    )
    .expect("s2's Hca2 LID and GID");
    let t = Instant::now();
    for (i, n) in ["Hca2", "Hca3"].iter().enumerate() {
        if !acmrs_on_s2(n) {
            continue;
        }
        let g = f.node(n).unwrap().ports[1].gid;
        while count(n, g) <= before[i].1 || sm_changes(&f, n) <= before[i].2 {
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "{n}: its s2 port did not join the new SM of s2:\n{}",
                f.logs_report()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // Two more SM checks: anything the main subnet's ports would do, they have done.
    std::thread::sleep(Duration::from_millis(
        2 * acm_core_nostd::node::SM_CHECK_MS + 500,
    ));
    for (i, n) in ["Hca2", "Hca3", "Hca4"].iter().enumerate() {
        let p = f.node(n).unwrap().ports.clone();
        assert_eq!(
            count(n, p[0].gid),
            before[i].0,
            "{n}: its main-subnet port joined again after s2's SM moved"
        );
        // An acmrs process whose ports are all on the main subnet sees no SM change.
        let s2_acmrs = p.len() > 1 && acmrs_on_s2(n);
        if acmrs_nodes.contains(n) && !s2_acmrs {
            assert_eq!(
                sm_changes(&f, n),
                before[i].2,
                "{n}: an SM change logged for a port whose SM did not move:\n{}",
                f.node(n).unwrap().log()
            );
        }
    }
    for (i, n) in ["Hca2", "Hca3"].iter().enumerate() {
        assert_eq!(
            f.port_info(n).unwrap().sm_lid,
            main_before[i],
            "{n}: the main subnet's SM"
        );
    }
    // A miss on s2 from an acmrs port goes to the new SM and is answered.
    for n in ["Hca2", "Hca3"].into_iter().filter(|n| acmrs_on_s2(n)) {
        let src = f.node(n).unwrap().ports[1].clone();
        let out = f
            .node(n)
            .unwrap()
            .acme_until(
                &[
                    "-f",
                    "g",
                    "-s",
                    &src.gid.to_string(),
                    "-d",
                    &new_sm.to_string(),
                    "-v",
                ],
                Duration::from_secs(20),
                |o| o.stdout.contains(SA_VERIFIED),
            )
            .unwrap();
        assert!(
            out.stdout.contains(&format!("sgid: {}\n", src.gid))
                && out.stdout.contains(SA_VERIFIED),
            "{n}: a miss on s2 after its SM moved:\n{out}"
        );
    }

    // The SM moves back to Hca1, the SA stock ports still address (they read its LID at
    // port-up only), and the acmrs ports follow it once more.
    let changed: Vec<usize> = ["Hca2", "Hca3"].iter().map(|n| sm_changes(&f, n)).collect();
    f.subnet_mut("s2")
        .unwrap()
        .move_sm("Hca1", false)
        .unwrap_or_else(|e| panic!("moving s2's SM back: {e}"));
    let t = Instant::now();
    for (i, n) in ["Hca2", "Hca3"].iter().enumerate() {
        while acmrs_on_s2(n) && sm_changes(&f, n) <= changed[i] {
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "{n}: did not follow s2's SM back:\n{}",
                f.logs_report()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    // s2's SM stops: a hit on s2 and a miss on the main subnet are answered, a miss on s2
    // fails within the providers' timeout (500 ms, 2 retries), not never.
    let (s_on_s2, d_on_s2) = (h2_port(&f, 1), f.node("Hca3").unwrap().ports[1].clone());
    resolve(&f, "Hca2", "g", &s_on_s2, &d_on_s2); // cached before the SM goes
    f.subnet_mut("s2").unwrap().stop_sm();
    // (No `-v`: ib_acme's verification asks the SA, which is gone.)
    let hit = f
        .node("Hca2")
        .unwrap()
        .acme(&[
            "-f",
            "g",
            "-s",
            &s_on_s2.gid.to_string(),
            "-d",
            &d_on_s2.gid.to_string(),
        ])
        .unwrap();
    assert!(
        hit.success()
            && hit.stdout.contains(&format!("sgid: {}\n", s_on_s2.gid))
            && hit.stdout.contains(&format!("dgid: {}\n", d_on_s2.gid)),
        "a hit on s2 while its SM is down:\n{hit}"
    );
    let s2_sm = gid(S2, 0x100001); // Hca1 of net.2sw2path4hca
    let t = Instant::now();
    let miss = f
        .node("Hca2")
        .unwrap()
        .acme(&[
            "-f",
            "g",
            "-s",
            &s_on_s2.gid.to_string(),
            "-d",
            &s2_sm.to_string(),
            "-v",
        ])
        .unwrap();
    let took = t.elapsed();
    assert!(
        !miss.stdout.contains("Path information"),
        "a miss on s2 without its SM was answered with a path:\n{miss}"
    );
    assert!(
        took < Duration::from_secs(20),
        "the s2 miss failed only after {took:?}"
    );
    let (lid8, gid8) =
        acm_fabric::fabric::parse_ibaddr(&f.run_tool("Hca8", "ibaddr", &[]).unwrap().stdout)
            .expect("Hca8's LID and GID");
    let h2_main = h2_port(&f, 0);
    let out = f
        .node("Hca2")
        .unwrap()
        .acme(&[
            "-f",
            "g",
            "-s",
            &h2_main.gid.to_string(),
            "-d",
            &gid8.to_string(),
            "-v",
        ])
        .unwrap();
    assert!(
        out.stdout.contains(SA_VERIFIED) && out.stdout.contains(&format!("dlid: {lid8}\n")),
        "a main-subnet miss while s2's SM is down:\n{out}"
    );
    eprintln!("{tag}: the s2 miss without an SM failed after {took:?}");
}

/// How many times node `n`'s acmrs logged a new SM LID.
fn sm_changes(f: &Fabric, n: &str) -> usize {
    f.node(n).unwrap().log().matches("SM LID changed").count()
}

fn h2_port(f: &Fabric, i: usize) -> HostPort {
    f.node("Hca2").unwrap().ports[i].clone()
}

#[test]
fn a_dual_port_hca_on_two_subnets_stock_by_default_acmrs_for_the_second() {
    a_port_on_each_of_two_subnets(
        "subnets-a",
        Provider::Stock,
        Provider::Acmrs,
        Provider::Acmrs,
    );
}

#[test]
fn a_dual_port_hca_on_two_subnets_acmrs_by_default_stock_for_the_second() {
    a_port_on_each_of_two_subnets(
        "subnets-s",
        Provider::Acmrs,
        Provider::Stock,
        Provider::Stock,
    );
}

/// A PATH request by GIDs from port `src` to GID `dgid` on a fresh connection.
fn gid_request(src: &HostPort, dgid: std::net::Ipv6Addr, tid: u64) -> Vec<u8> {
    use acm_core_nostd::wire::{gid::Gid, path_record::PathRecordRepr};
    let mut p = PathRecordRepr::ZERO;
    p.sgid = Gid(src.gid.octets());
    p.dgid = Gid(dgid.octets());
    acm_fabric::client::path_request(&p, 0, tid)
}

/// Whether anything more than the one answer arrived on `c` (within 50 ms): a request
/// answered twice.
fn extra_bytes(c: &acm_fabric::client::Conn) -> bool {
    use std::os::fd::AsRawFd;
    std::thread::sleep(Duration::from_millis(50));
    let mut b = [0u8; 8];
    // SAFETY: a peek into our own 8-byte buffer on our own socket, never blocking.
    let n = unsafe {
        libc::recv(
            c.as_raw_fd(),
            b.as_mut_ptr().cast(),
            b.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n > 0
}

/// The GIDs of every HCA of the main topology but `skip` (ibaddr as each).
fn gids_of(f: &Fabric, skip: &[&str]) -> Vec<(String, u16, std::net::Ipv6Addr)> {
    f.topology()
        .hcas()
        .into_iter()
        .filter(|h| !skip.contains(&h.as_str()))
        .map(|h| {
            let out = f.run_tool(&h, "ibaddr", &[]).unwrap();
            let (lid, gid) = acm_fabric::fabric::parse_ibaddr(&out.stdout)
                .unwrap_or_else(|| panic!("ibaddr {h}: {out}"));
            (h, lid, gid)
        })
        .collect()
}

/// One port of a dual-port HCA fails (ibsim unlinks it) while requests run on the other:
/// its endpoints close, every request on the other port is answered exactly once, with a path
/// from that port, hits and misses alike; the port comes back, rejoins (its joins in the
/// capture) and resolves again. Then a burst of misses on a port whose SA hangs (OpenSM
/// stopped), the port going down under it: every request answered exactly once, none left
/// waiting for a port that is gone.
fn one_port_fails_while_the_other_answers(tag: &str, hosts: Provider, peer: Provider) {
    require_root();
    let cap = Scratch::new(tag);
    let f = Fabric::builder(Topology::parse("fattree:2,1,4").unwrap(), ["Hca2", "Hca3"])
        .sm_node("Hca1")
        .provider(hosts)
        .node_provider("Hca2", peer)
        .host("Hca3", HostSpec::parse("Hca3+Hca7").unwrap())
        .hosts_file(HostsFile::Absent)
        .daemon_env(
            "SIMVERBS_PCAP",
            &cap.0.join("sa-%p.pcap").display().to_string(),
        )
        .option("timeout", "500")
        .option("retries", "2")
        .name_prefix(tag)
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let n3 = f.node("Hca3").unwrap();
    let (p1, p2) = (n3.ports[0].clone(), n3.ports[1].clone());
    let dests = gids_of(&f, &["Hca1", "Hca3", "Hca7"]);
    // The peer answers by name from both ports before anything fails.
    let h2 = f.node("Hca2").unwrap().ports[0].clone();
    resolve(&f, "Hca3", "n", &p1, &h2);
    resolve(&f, "Hca3", "n", &p2, &h2);

    // Requests from port 1 (each destination once a miss, then hits) while port 2 goes down
    // and comes back.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (answered, joins_before) = std::thread::scope(|s| {
        let worker = s.spawn(|| {
            let mut n = 0u64;
            let mut round = 0;
            while !stop.load(std::sync::atomic::Ordering::Acquire) || round < 2 {
                for (h, lid, g) in &dests {
                    let mut c = n3.client().unwrap();
                    let (a, _) = c.roundtrip(&gid_request(&p1, *g, 0x7000 + n)).unwrap();
                    assert_eq!(
                        a.status,
                        acm_core_nostd::wire::client::Status::Success,
                        "port 1 -> {h} (round {round}) while port 2 failed"
                    );
                    assert_eq!((a.path.slid, a.path.dlid), (p1.lid, *lid), "port 1 -> {h}");
                    assert_eq!(a.path.sgid.0, p1.gid.octets(), "port 1 -> {h}: SGID");
                    assert!(!extra_bytes(&c), "port 1 -> {h}: answered twice");
                    n += 1;
                }
                round += 1;
            }
            n
        });
        f.port_down_at("Hca3", 2).unwrap();
        let e = n3.acme(&["-e"]).unwrap();
        assert!(
            !e.stdout.contains(&p2.name),
            "port 2's endpoint still listed:\n{e}"
        );
        // A request from the failed port's address is refused by the core, not answered.
        let r = n3
            .acme(&["-f", "n", "-s", &p2.name, "-d", &h2.name])
            .unwrap();
        assert!(
            !r.stdout.contains("Path information"),
            "answered from a closed port:\n{r}"
        );
        let joins_before = joins_by_port(&cap.0.join(format!("sa-{}.pcap", n3.pid().unwrap())))
            .iter()
            .filter(|j| **j == p2.gid.octets())
            .count();
        f.port_up_at("Hca3", 2).unwrap();
        stop.store(true, std::sync::atomic::Ordering::Release);
        (worker.join().expect("the port-1 requests"), joins_before)
    });
    assert!(answered >= 2 * dests.len() as u64, "{answered} requests");
    // Back: acmrs rejoins the port's groups (stock libibacmp does not: it joined once, at its
    // first open, and a reopened port stays out of its groups on a real fabric; here
    // simverbs' multicast still reaches it, docs/shapes.md) and resolves again.
    let t = Instant::now();
    let pcap = cap.0.join(format!("sa-{}.pcap", n3.pid().unwrap()));
    let rejoined = || {
        joins_by_port(&pcap)
            .iter()
            .filter(|j| **j == p2.gid.octets())
            .count()
            > joins_before
    };
    if n3.provider().name() == "acmrs" {
        while !rejoined() {
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "port 2 did not rejoin after it came back"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    } else {
        std::thread::sleep(Duration::from_secs(3));
        assert!(
            !rejoined(),
            "stock rejoined a reopened port: docs/shapes.md says it does not"
        );
    }
    resolve(&f, "Hca3", "n", &p2, &h2);

    // A burst of misses on port 2 whose SA hangs; port 2 goes down under it.
    f.pause_sm().unwrap();
    let mut conns: Vec<_> = dests
        .iter()
        .map(|(_, _, g)| {
            let mut c = n3.client().unwrap();
            // A destination never asked from port 2: a miss, its SA query left unanswered.
            c.send(&gid_request(&p2, *g, 0x9000)).unwrap();
            c
        })
        .collect();
    // Every request is in the daemon, its SA query unanswered, when the port goes.
    std::thread::sleep(Duration::from_millis(100));
    // acmrs answers each at once (an error: the port is gone); stock leaves them waiting:
    // the core drops the SA's timeouts of a port without a provider (`acmc_recv_mad`: "no
    // provider assigned to port"), so ibacmp never answers (docs/shapes.md). Each is given
    // 10 s.
    let stock = n3.provider().name() != "acmrs";
    let down = std::thread::scope(|s| {
        let h = s.spawn(|| f.port_down_at("Hca3", 2));
        let t = Instant::now();
        let mut got = Vec::new();
        for (c, (h, _, _)) in conns.iter_mut().zip(&dests) {
            let left = Duration::from_secs(10).saturating_sub(t.elapsed());
            if !readable(c, left) {
                got.push((h.clone(), None));
                continue;
            }
            let n = c
                .recv(false)
                .unwrap_or_else(|e| panic!("the miss to {h}: {e}"));
            let a = c.answer(n).unwrap();
            assert!(!extra_bytes(c), "a miss to {h} answered twice");
            got.push((h.clone(), Some(a.status)));
        }
        let took = t.elapsed();
        h.join().expect("port down").unwrap();
        (got, took)
    });
    f.resume_sm().unwrap();
    let lost = down.0.iter().filter(|(_, s)| s.is_none()).count();
    if stock {
        assert!(
            lost > 0,
            "stock answered every miss of a port that went down: {:?}",
            down.0
        );
    } else {
        assert_eq!(
            lost, 0,
            "misses left waiting for a port that is gone: {:?}",
            down.0
        );
    }
    eprintln!(
        "{tag}: {answered} requests on port 1 while port 2 bounced; the {} misses on port 2 as it went down: {:?} (within {:?})",
        down.0.len(),
        down.0.iter().map(|(_, s)| *s).collect::<Vec<_>>(),
        down.1
    );
}

/// Whether `c` has something to read within `within`.
fn readable(c: &acm_fabric::client::Conn, within: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: c.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd of our own socket.
    unsafe { libc::poll(&mut p, 1, within.as_millis() as i32) > 0 }
}

#[test]
fn acmrs_one_port_fails_while_the_other_answers() {
    one_port_fails_while_the_other_answers("portfail-a", Provider::Acmrs, Provider::Stock);
}

#[test]
fn stock_one_port_fails_while_the_other_answers() {
    one_port_fails_while_the_other_answers("portfail-s", Provider::Stock, Provider::Acmrs);
}

/// P_Key tables that differ per port: partition 0x8001 of Hca2 and Hca7, which is port 2 of
/// the dual-port host Hca3 (port 1, Hca3 itself, is not a member). The core opens an endpoint
/// for 0x8001 on port 2 only; port 2's name in the partition resolves from the member Hca2
/// (a path with the partition's P_Key, from and to the right ports), never from the
/// non-member Hca4, and Hca3 reaches Hca2's partition name from port 2.
fn partitions_per_port(tag: &str, host: Provider, peer: Provider) {
    require_root();
    let f = Fabric::builder(
        Topology::parse("fattree:2,1,4").unwrap(),
        ["Hca2", "Hca3", "Hca4"],
    )
    .sm_node("Hca1")
    .provider(peer)
    .node_provider("Hca3", host)
    .host("Hca3", HostSpec::parse("Hca3+Hca7").unwrap())
    .partition(acm_fabric::Partition::parse("0x8001:Hca2,Hca7").unwrap())
    .hosts_file(HostsFile::Absent)
    .option("timeout", "300")
    .option("retries", "1")
    .subnet_timeout(8)
    .name_prefix(tag)
    .start()
    .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    f.wait_pkeys("Hca7", &[0x8001], Duration::from_secs(20))
        .unwrap();
    let n3 = f.node("Hca3").unwrap();
    let p2 = &n3.ports[1];
    let a2 = p2.partitions.first().expect("port 2 is in 0x8001").clone();
    assert!(
        n3.ports[0].partitions.is_empty(),
        "port 1 is in no partition"
    );
    // The endpoint for 0x8001 is on port 2, none on port 1.
    let t = Instant::now();
    let e = loop {
        let e = n3.acme(&["-e"]).unwrap();
        if e.stdout.contains(&a2.name) || t.elapsed() > Duration::from_secs(20) {
            break e;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let rows: Vec<&str> = e
        .stdout
        .lines()
        .filter(|l| l.contains(",0x8001,"))
        .collect();
    assert_eq!(rows.len(), 1, "one 0x8001 endpoint:\n{e}");
    let c: Vec<&str> = rows[0].split(',').collect();
    assert_eq!((c[2], c[6]), ("2", a2.name.as_str()), "on port 2:\n{e}");
    // From the member Hca2: port 2's partition name, with the partition's P_Key.
    let h2 = f.node("Hca2").unwrap();
    let b2 = h2.addrs.in_partition(0x8001).unwrap().clone();
    let out = h2
        .acme_until(
            &["-f", "n", "-s", &b2.name, "-d", &a2.name, "-v"],
            Duration::from_secs(20),
            |o| o.stdout.contains(SA_VERIFIED),
        )
        .unwrap();
    for want in [
        format!("dgid: {}\n", p2.gid),
        format!("dlid: {}\n", p2.lid),
        "pkey: 0x8001\n".to_string(),
    ] {
        assert!(
            out.stdout.contains(&want),
            "{want:?} missing:\n{out}\n{}",
            f.logs_report()
        );
    }
    assert!(out.stdout.contains(SA_VERIFIED), "{out}");
    // From port 2 to the member: the source is port 2's partition address.
    let out = n3
        .acme_until(
            &["-f", "n", "-s", &a2.name, "-d", &b2.name, "-v"],
            Duration::from_secs(20),
            |o| o.stdout.contains(SA_VERIFIED),
        )
        .unwrap();
    assert!(
        out.stdout.contains(SA_VERIFIED)
            && out.stdout.contains(&format!("sgid: {}\n", p2.gid))
            && out.stdout.contains("pkey: 0x8001\n"),
        "{out}"
    );
    // The non-member cannot reach it.
    let h4 = f.node("Hca4").unwrap();
    let r = h4
        .acme(&["-f", "n", "-s", &h4.addrs.name, "-d", &a2.name])
        .unwrap();
    assert!(
        !r.stdout.contains("Path information"),
        "a non-member reached {}:\n{r}",
        a2.name
    );
}

#[test]
fn acmrs_partitions_per_port_with_a_stock_peer() {
    partitions_per_port("pkeys-a", Provider::Acmrs, Provider::Stock);
}

#[test]
fn stock_partitions_per_port_with_an_acmrs_peer() {
    partitions_per_port("pkeys-s", Provider::Stock, Provider::Acmrs);
}
