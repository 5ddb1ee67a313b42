//! The ACM multicast address protocol between acmrs and the stock libibacmp, on the wire: real
//! ibacm daemons on a simulated fabric with **no hosts file**, some nodes loading `libacmrs.so`
//! and some the stock `libibacmp.so`, resolving each other's names, IPv4 and IPv6 addresses
//! with the real `ib_acme -v` (the path is then verified against the SA).
//!
//! Needs root (private /run per daemon) and `libsimverbs.so` + `libacmrs.so` in the target
//! directory (`cargo build -p simverbs -p acm-plugin`). Skipped with a message when not root.

use acm_fabric::{Fabric, HostsFile, Output, Provider, Topology};
use std::collections::BTreeMap;
use std::time::Duration;

const VERIFIED: &str = "SA verification: success";

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A fabric of Hca2 (stock), Hca3 and Hca4 (acmrs), no hosts file, with extra options.
fn mixed(prefix: &str, opts: &[(&str, &str)], env: &[(&str, &str)]) -> Fabric {
    let mut b = Fabric::builder(
        Topology::example("net.2sw2path4hca").unwrap(),
        ["Hca2", "Hca3", "Hca4"],
    )
    .provider(Provider::Acmrs)
    .node_provider("Hca2", Provider::Stock)
    .hosts_file(HostsFile::Absent)
    .name_prefix(prefix)
    .option("timeout", "500");
    for (k, v) in opts {
        b = b.option(k, v);
    }
    for (k, v) in env {
        b = b.daemon_env(k, v);
    }
    let f = b
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    // Each daemon serves its endpoint with the provider it was given.
    for (node, prov) in [("Hca2", ",ibacmp,"), ("Hca3", ",acmrs,"), ("Hca4", ",acmrs,")] {
        let e = f.node(node).unwrap().acme(&["-e"]).unwrap();
        assert!(e.stdout.contains(prov), "{node} -e: {e}");
    }
    f
}

/// `ib_acme -f FMT -s SRC -d DST -v` on `on` (retried while endpoints finish joining), and
/// the checks that the answer is the path from `on` to `dst_node`, verified by the SA.
fn resolve_verified(f: &Fabric, on: &str, fmt: &str, dst_node: &str) -> Output {
    let (src, dst) = {
        let s = &f.node(on).unwrap().addrs;
        let d = &f.node(dst_node).unwrap().addrs;
        match fmt {
            "n" => (s.name.clone(), d.name.clone()),
            "i" => (s.ipv4.to_string(), d.ipv4.to_string()),
            "6" => (s.ipv6.to_string(), d.ipv6.to_string()),
            _ => unreachable!(),
        }
    };
    let fmt = if fmt == "6" { "i" } else { fmt };
    let node = f.node(on).unwrap();
    let out = node
        .acme_until(
            &["-f", fmt, "-s", &src, "-d", &dst, "-v"],
            Duration::from_secs(20),
            |o| o.stdout.contains(VERIFIED),
        )
        .unwrap();
    let d = f.node(dst_node).unwrap();
    let s = f.node(on).unwrap();
    assert!(
        out.success() && out.stdout.contains(VERIFIED),
        "-f {fmt} {src} -> {dst} on {on}:\n{out}\n{}",
        f.logs_report()
    );
    for want in [
        format!("dgid: {}\n", d.gid),
        format!("sgid: {}\n", s.gid),
        format!("dlid: {}\n", d.lid),
        format!("slid: {}\n", s.lid),
    ] {
        assert!(out.stdout.contains(&want), "{want:?} missing:\n{out}");
    }
    out
}

/// `ib_acme -P col` → the 7 global counters by name.
fn counters(f: &Fabric, on: &str) -> BTreeMap<String, u64> {
    let out = f.node(on).unwrap().acme(&["-P", "col"]).unwrap();
    let map: BTreeMap<String, u64> = out
        .stdout
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(" : ")?;
            Some((k.trim().to_string(), v.trim().parse().ok()?))
        })
        .collect();
    assert_eq!(map.len(), 7, "ib_acme -P col:\n{out}");
    map
}

const ADDR_QUERY: &str = "Addr Query Count";

/// Every direction between the providers, for names, IPv4 and IPv6.
fn every_direction(f: &Fabric) {
    for (on, to) in [
        ("Hca3", "Hca4"),
        ("Hca3", "Hca2"),
        ("Hca2", "Hca3"),
        ("Hca4", "Hca3"),
    ] {
        for fmt in ["n", "i", "6"] {
            resolve_verified(f, on, fmt, to);
        }
    }
}

#[test]
fn names_and_ips_resolve_between_acmrs_and_stock_route_prot_sa() {
    if !is_root() {
        eprintln!("SKIPPED: needs root (mount namespaces)");
        return;
    }
    let f = mixed("acm-mixed-sa", &[], &[]);
    let before = counters(&f, "Hca3");
    every_direction(&f);
    let after = counters(&f, "Hca3");
    assert!(
        after[ADDR_QUERY] > before[ADDR_QUERY],
        "address queries counted: {before:?} -> {after:?}"
    );
    // Asked again, the name is answered from the cache: no new multicast query.
    let again_before = counters(&f, "Hca3");
    resolve_verified(&f, "Hca3", "n", "Hca4");
    let again_after = counters(&f, "Hca3");
    assert_eq!(
        again_before[ADDR_QUERY], again_after[ADDR_QUERY],
        "a cached name sends no query"
    );
}

#[test]
fn names_and_ips_resolve_between_acmrs_and_stock_route_prot_acm() {
    if !is_root() {
        eprintln!("SKIPPED: needs root (mount namespaces)");
        return;
    }
    let f = mixed("acm-mixed-acm", &[("route_prot", "acm")], &[]);
    every_direction(&f);
}

#[test]
fn retries_carry_address_resolution_through_loss() {
    if !is_root() {
        eprintln!("SKIPPED: needs root (mount namespaces)");
        return;
    }
    // A third of the datagrams are lost (each daemon's simulated verbs drop them on send).
    let f = mixed(
        "acm-mixed-loss",
        &[("retries", "6"), ("timeout", "200")],
        &[("SIMVERBS_LOSS", "0.3"), ("SIMVERBS_SEED", "7")],
    );
    for (on, to) in [("Hca3", "Hca4"), ("Hca3", "Hca2"), ("Hca2", "Hca3")] {
        resolve_verified(&f, on, "n", to);
    }
}

#[test]
fn rejoin_after_port_bounce_and_client_reregister() {
    if !is_root() {
        eprintln!("SKIPPED: needs root (mount namespaces)");
        return;
    }
    let f = mixed("acm-mixed-rejoin", &[], &[]);
    resolve_verified(&f, "Hca3", "n", "Hca2");
    // The SM tells every port to reregister: acmrs flushes what it learned and rejoins its
    // multicast group; resolution works again over the new membership.
    f.client_reregister_all().unwrap();
    resolve_verified(&f, "Hca3", "n", "Hca4");
    resolve_verified(&f, "Hca2", "n", "Hca3");
    // The port goes down and comes back: the endpoint is closed and reopened (new QP, new
    // join); names resolve in both directions again.
    f.port_down("Hca3").unwrap();
    f.port_up("Hca3").unwrap();
    resolve_verified(&f, "Hca3", "n", "Hca2");
    resolve_verified(&f, "Hca2", "n", "Hca3");
    resolve_verified(&f, "Hca4", "i", "Hca3");
}
