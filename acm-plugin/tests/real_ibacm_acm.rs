//! The ACM multicast address protocol between acmrs and the stock libibacmp, on the wire: real
//! ibacm daemons on a simulated fabric with **no hosts file**, some nodes loading `libacmrs.so`
//! and some the stock `libibacmp.so`, resolving each other's names, IPv4 and IPv6 addresses
//! with the real `ib_acme -v` (the path is then verified against the SA).
//!
//! Every node also serves extra names (`<name>-1`, …) that no request ever carries as its
//! source, so asking for one can only be answered by a multicast query to the group and a
//! response from its owner: no bystander has learned it. Each such resolution is checked on
//! the requester's `Addr Query Count`.
//!
//! Needs root (private /run per daemon) and `libsimverbs.so` + `libacmrs.so` in the target
//! directory (`cargo build -p simverbs -p acm-plugin`). Fails with the reason when not root.

mod common;

use acm_fabric::checks::{self, check_path, global_counters, require_root};
use acm_fabric::{Fabric, FabricBuilder, Output};
use std::time::Duration;

const ADDR_QUERY: &str = "Addr Query Count";

/// A fabric of Hca2 (stock), Hca3 and Hca4 (acmrs), no hosts file, `names` extra names per
/// node, with whatever else `custom` sets.
fn mixed(
    prefix: &str,
    names: usize,
    custom: impl FnOnce(FabricBuilder) -> FabricBuilder,
) -> Fabric {
    let b = common::mixed_fabric(prefix)
        .extra_names(names)
        .option("timeout", "500");
    let f = custom(b)
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    // Each daemon serves its endpoint with the provider it was given.
    for (node, prov) in [
        ("Hca2", ",ibacmp,"),
        ("Hca3", ",acmrs,"),
        ("Hca4", ",acmrs,"),
    ] {
        let e = f.node(node).unwrap().acme(&["-e"]).unwrap();
        assert!(e.stdout.contains(prov), "{node} -e: {e}");
    }
    f
}

/// What to ask for.
#[derive(Clone, Copy)]
enum Dest {
    Name,
    Ipv4,
    Ipv6,
    /// The destination's k-th extra name (1-based).
    Extra(usize),
}

fn args(f: &Fabric, on: &str, dest: Dest, to: &str) -> (String, String, &'static str) {
    let s = &f.node(on).unwrap().addrs;
    let d = &f.node(to).unwrap().addrs;
    match dest {
        Dest::Name => (s.name.clone(), d.name.clone(), "n"),
        Dest::Extra(k) => (s.name.clone(), d.extra_names[k - 1].clone(), "n"),
        Dest::Ipv4 => (s.ipv4.to_string(), d.ipv4.to_string(), "i"),
        Dest::Ipv6 => (s.ipv6.to_string(), d.ipv6.to_string(), "i"),
    }
}

/// `ib_acme -v` on `on` for `dest` of node `to`, retried while the endpoints finish joining
/// (the first calls of a fresh fabric), then the path checks.
fn resolve_verified(f: &Fabric, on: &str, dest: Dest, to: &str) -> Output {
    let (src, dst, fmt) = args(f, on, dest, to);
    checks::resolve_verified(f, on, fmt, &src, &dst, to, Duration::from_secs(20))
}

/// The same, in one `ib_acme` call: whatever the provider does to get there (retries
/// included) happens inside that one request.
fn resolve_once(f: &Fabric, on: &str, dest: Dest, to: &str) {
    let (src, dst, fmt) = args(f, on, dest, to);
    let out = f
        .node(on)
        .unwrap()
        .acme(&["-f", fmt, "-s", &src, "-d", &dst, "-v"])
        .unwrap();
    check_path(
        f,
        on,
        to,
        &format!("-f {fmt} {src} -> {dst} on {on} (one call)"),
        &out,
    );
}

fn addr_queries(f: &Fabric, on: &str) -> u64 {
    global_counters(f, on)[ADDR_QUERY]
}

/// Resolves `dest` of `to` from `on` and checks that it took exactly one multicast address
/// query of `on` (the destination was known to nobody on `on`'s side).
fn resolve_by_query(f: &Fabric, on: &str, dest: Dest, to: &str) {
    let before = addr_queries(f, on);
    resolve_verified(f, on, dest, to);
    let after = addr_queries(f, on);
    assert_eq!(after, before + 1, "{on} -> {to}: one address query");
}

/// Every direction between the providers (stock asking acmrs, acmrs asking stock, acmrs
/// asking acmrs), each through a multicast query answered by the other provider, then the
/// primary name and addresses (some learned from the other's queries by then: still checked
/// for the right, SA-verified path).
fn every_direction(f: &Fabric) {
    // Join, and prove the stock node asks acmrs: its first query for an acmrs node's name.
    resolve_verified(f, "Hca2", Dest::Extra(1), "Hca3");
    resolve_by_query(f, "Hca2", Dest::Extra(2), "Hca3");
    resolve_by_query(f, "Hca2", Dest::Extra(1), "Hca4");
    resolve_by_query(f, "Hca3", Dest::Extra(1), "Hca2");
    resolve_by_query(f, "Hca3", Dest::Extra(1), "Hca4");
    resolve_by_query(f, "Hca4", Dest::Extra(2), "Hca3");
    resolve_by_query(f, "Hca4", Dest::Extra(2), "Hca2");
    for (on, to) in [
        ("Hca2", "Hca3"),
        ("Hca3", "Hca2"),
        ("Hca3", "Hca4"),
        ("Hca4", "Hca3"),
    ] {
        for dest in [Dest::Name, Dest::Ipv4, Dest::Ipv6] {
            resolve_verified(f, on, dest, to);
        }
    }
    // Asked again, an address is answered from the cache: no new multicast query.
    let before = addr_queries(f, "Hca3");
    resolve_verified(f, "Hca3", Dest::Extra(1), "Hca2");
    resolve_verified(f, "Hca3", Dest::Name, "Hca4");
    assert_eq!(
        addr_queries(f, "Hca3"),
        before,
        "cached names send no query"
    );
}

#[test]
fn names_and_ips_resolve_between_acmrs_and_stock_route_prot_sa() {
    require_root();
    let f = mixed("acm-mixed-sa", 2, |b| b);
    every_direction(&f);
}

#[test]
fn names_and_ips_resolve_between_acmrs_and_stock_route_prot_acm() {
    require_root();
    let f = mixed("acm-mixed-acm", 2, |b| b.option("route_prot", "acm"));
    every_direction(&f);
}

#[test]
fn retries_carry_address_resolution_through_loss() {
    require_root();
    // A fifth of the datagrams are lost (each daemon's simulated verbs drop them on send), so
    // a resolution's first query and its response both arrive only 64 % of the time. Each
    // name below must still resolve in ONE ib_acme call, so the provider has to retry by
    // itself (without retries, 20 first tries would all succeed with a chance of 0.64^20,
    // about 1e-4). With retries 10 the chance that one of the 20 fails is about 3e-4.
    let names = 10;
    let f = mixed("acm-mixed-loss", names, |b| {
        b.option("retries", "10")
            .option("timeout", "100")
            // A try is `timeout` + the subnet timeout: 1 ms here (SubnetTimeOut 8).
            .subnet_timeout(8)
            .daemon_env("SIMVERBS_LOSS", "0.2")
            .daemon_env("SIMVERBS_SEED", "7")
    });
    // Joins happen before the first request is sent (the first calls may race them).
    resolve_verified(&f, "Hca3", Dest::Name, "Hca4");
    resolve_verified(&f, "Hca2", Dest::Name, "Hca3");
    for k in 1..=names {
        resolve_once(&f, "Hca3", Dest::Extra(k), "Hca2"); // acmrs asks stock
        resolve_once(&f, "Hca2", Dest::Extra(k), "Hca4"); // stock asks acmrs
    }
}

#[test]
fn rejoin_after_port_bounce_and_client_reregister() {
    require_root();
    let f = mixed("acm-mixed-rejoin", 3, |b| b);
    resolve_verified(&f, "Hca3", Dest::Name, "Hca2");
    // The SM tells every port to reregister: acmrs flushes what it learned and rejoins its
    // multicast group. A name nobody has asked for needs a multicast query, so it resolves
    // only if the rejoined group carries it both ways.
    f.client_reregister_all().unwrap();
    // What acmrs learned before the reregister is gone: asking again is a new query (first,
    // before Hca2's own queries teach it Hca2's name again).
    resolve_by_query(&f, "Hca3", Dest::Name, "Hca2");
    resolve_by_query(&f, "Hca3", Dest::Extra(1), "Hca4");
    resolve_by_query(&f, "Hca2", Dest::Extra(1), "Hca3");
    // The port goes down and comes back: the endpoint is closed and reopened (new QP, new
    // join); names resolve in both directions again, by new queries.
    f.port_down("Hca3").unwrap();
    f.port_up("Hca3").unwrap();
    resolve_verified(&f, "Hca3", Dest::Extra(2), "Hca2");
    resolve_by_query(&f, "Hca3", Dest::Extra(3), "Hca2");
    resolve_by_query(&f, "Hca2", Dest::Extra(2), "Hca3");
    resolve_by_query(&f, "Hca4", Dest::Extra(3), "Hca3");
}
