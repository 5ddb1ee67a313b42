//! Partitions with the real ibacm daemon, real OpenSM (`partitions.conf`) and real `ib_acme`:
//! mixed fabrics of stock libibacmp and acmrs nodes, **no hosts file**, every name and IP
//! resolved over the ACM protocol in its own partition and SA-verified, in every direction
//! the SA allows; what the SA forbids (a non-member, two limited members) is refused by both
//! providers alike. One endpoint per P_Key, as the core creates them; P_Keys removed from and
//! added to a port while the daemons run.
//!
//! Reachability is IBA's partition rule: two ports share a partition when both hold its P_Key
//! and at least one of them is a full member. The path's P_Key must be one the source port
//! holds (checked for every acmrs source; stock libibacmp answers a limited member with the
//! group's full P_Key, which is in docs/shapes.md).
//!
//! Needs root (a private /run per daemon) and `libsimverbs.so` + `libacmrs.so` in the target
//! directory (`cargo build -p simverbs -p acm-plugin`); fails with the reason otherwise.

use acm_fabric::checks::{self, path_pkey, require_root};
use acm_fabric::{Fabric, HostsFile, Membership, Partition, Provider, Topology};
use std::time::{Duration, Instant};

const NODES: [&str; 3] = ["Hca2", "Hca3", "Hca4"];
/// The default partition's key as the core names its endpoint.
const DEFAULT: u16 = 0xffff;

/// A fabric of Hca2..Hca4 with `acmrs` on the named nodes (stock on the others), no hosts
/// file, `parts`, short ACM timeouts (an unanswered query fails in well under a second).
fn fabric(prefix: &str, acmrs: &[&str], parts: &[&str]) -> Fabric {
    let mut b = Fabric::builder(Topology::example("net.2sw2path4hca").unwrap(), NODES)
        .provider(Provider::Stock)
        .hosts_file(HostsFile::Absent)
        .name_prefix(prefix)
        .option("timeout", "300")
        .option("retries", "1")
        .subnet_timeout(8);
    for n in acmrs {
        b = b.node_provider(n, Provider::Acmrs);
    }
    for p in parts {
        b = b.partition(Partition::parse(p).unwrap());
    }
    let f = b.start().unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    for n in NODES {
        let want = if acmrs.contains(&n) {
            ",acmrs,"
        } else {
            ",ibacmp,"
        };
        let e = f.node(n).unwrap().acme(&["-e"]).unwrap();
        assert!(e.stdout.contains(want), "{n} -e: {e}");
    }
    f
}

/// How `node` holds partition `pkey` (the default partition: every node, full).
fn membership(f: &Fabric, node: &str, pkey: u16) -> Option<Membership> {
    if pkey & 0x7fff == 0x7fff {
        return Some(Membership::Full);
    }
    f.node(node)
        .unwrap()
        .addrs
        .in_partition(pkey)
        .map(|a| a.membership)
}

/// IBA 10.9.3: both hold the partition and at least one is a full member.
fn reachable(f: &Fabric, a: &str, b: &str, pkey: u16) -> bool {
    match (membership(f, a, pkey), membership(f, b, pkey)) {
        (Some(x), Some(y)) => x == Membership::Full || y == Membership::Full,
        _ => false,
    }
}

#[derive(Clone, Copy, Debug)]
enum Form {
    Name,
    Ipv4,
    Ipv6,
}

/// `(source, destination, ib_acme -f)` of `on` asking for `to` in partition `pkey`. A node
/// outside the partition asks from its default-partition name (it has no address there).
fn addrs(f: &Fabric, on: &str, to: &str, pkey: u16, form: Form) -> (String, String, &'static str) {
    let pick = |node: &str, own: bool| -> String {
        let a = &f.node(node).unwrap().addrs;
        match (
            a.in_partition(pkey).filter(|_| pkey & 0x7fff != 0x7fff),
            form,
        ) {
            (Some(p), Form::Name) => p.name.clone(),
            (Some(p), Form::Ipv4) => p.ipv4.to_string(),
            (Some(p), Form::Ipv6) => p.ipv6.to_string(),
            (None, _) if !own && pkey & 0x7fff != 0x7fff => {
                panic!("{node} has no address in partition {pkey:#06x}")
            }
            (None, Form::Name) => a.name.clone(),
            (None, Form::Ipv4) => a.ipv4.to_string(),
            (None, Form::Ipv6) => a.ipv6.to_string(),
        }
    };
    let fmt = match form {
        Form::Name => "n",
        _ => "i",
    };
    (pick(on, true), pick(to, false), fmt)
}

/// Resolves `to`'s address in `pkey` from `on`, SA-verified with the right GIDs and LIDs, in
/// the partition, with a P_Key the source holds (exactly its table's key for acmrs).
fn resolves(f: &Fabric, on: &str, to: &str, pkey: u16, form: Form) {
    let (src, dst, fmt) = addrs(f, on, to, pkey, form);
    let out = checks::resolve_verified(f, on, fmt, &src, &dst, to, Duration::from_secs(20));
    let got = path_pkey(&out).unwrap_or_else(|| panic!("no pkey line:\n{out}"));
    assert_eq!(
        got & 0x7fff,
        pkey & 0x7fff,
        "{on} -> {dst}: path in the wrong partition:\n{out}"
    );
    if f.node(on).unwrap().provider() == &Provider::Acmrs {
        let held = membership(f, on, pkey).unwrap().pkey_in_table(pkey);
        assert_eq!(
            got, held,
            "{on} (acmrs) -> {dst}: the path's P_Key is not the one the source port holds:\n{out}"
        );
    }
}

/// One `ib_acme` call for `to`'s address in `pkey` from `on` must fail (nothing answered, or
/// no such source address).
fn refused(f: &Fabric, on: &str, src: &str, dst: &str, fmt: &str) {
    let out = f
        .node(on)
        .unwrap()
        .acme(&["-f", fmt, "-s", src, "-d", dst, "-v"])
        .unwrap();
    assert!(
        !out.success() && !out.stdout.contains("Path information"),
        "{on}: {src} -> {dst} must be refused:\n{out}\n{}",
        f.logs_report()
    );
}

/// Every ordered pair of nodes and each address form in partition `pkey`: resolved where the
/// partition rule allows it (all before any refusal, so the endpoints have joined), refused
/// where it does not.
fn every_direction(f: &Fabric, pkey: u16, forms: &[Form]) {
    let mut denied = Vec::new();
    for on in NODES {
        for to in NODES.iter().filter(|t| **t != on) {
            if reachable(f, on, to, pkey) {
                for form in forms {
                    resolves(f, on, to, pkey, *form);
                }
            } else if membership(f, to, pkey).is_some() {
                denied.push((on, *to));
            }
        }
    }
    for (on, to) in denied {
        let (src, dst, fmt) = addrs(f, on, to, pkey, Form::Name);
        refused(f, on, &src, &dst, fmt);
    }
}

/// The P_Keys of `node`'s endpoints (`ib_acme -e`), in the order listed.
fn endpoint_pkeys(f: &Fabric, node: &str) -> Vec<u16> {
    let out = f.node(node).unwrap().acme(&["-e"]).unwrap();
    out.stdout
        .lines()
        .filter(|l| l.starts_with("127.0.0.1,"))
        .filter_map(|l| {
            let v = l.split(',').nth(3)?;
            u16::from_str_radix(v.trim_start_matches("0x"), 16).ok()
        })
        .collect()
}

fn wait_endpoints(f: &Fabric, node: &str, mut want: Vec<u16>) {
    want.sort_unstable();
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let mut got = endpoint_pkeys(f, node);
        got.sort_unstable();
        if got == want {
            return;
        }
        assert!(
            Instant::now() < end,
            "{node}'s endpoints {got:04x?}, want {want:04x?}\n{}",
            f.logs_report()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The counters of the endpoint owning source name `src` on `node` (`ib_acme -f n -P s -s
/// SRC`), in the core's order: Error, Resolve, No Data, Addr Query, Addr Cache, Route Query,
/// Route Cache.
fn ep_counters(f: &Fabric, node: &str, src: &str) -> Vec<u64> {
    let out = f
        .node(node)
        .unwrap()
        .acme(&["-f", "n", "-P", "s", "-s", src])
        .unwrap();
    let row = out
        .stdout
        .lines()
        .find(|l| l.starts_with("127.0.0.1,"))
        .unwrap_or_else(|| panic!("{node} -P s -s {src}:\n{out}"));
    let v: Vec<u64> = row
        .split(',')
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    assert_eq!(v.len(), 7, "{row}");
    v
}

fn count(log: &str, what: &str) -> usize {
    log.lines().filter(|l| l.contains(what)).count()
}

fn wait_log(f: &Fabric, node: &str, what: &str, at_least: usize) {
    let end = Instant::now() + Duration::from_secs(20);
    while count(&f.node(node).unwrap().log(), what) < at_least {
        assert!(
            Instant::now() < end,
            "{node}'s log: fewer than {at_least} lines with {what:?}\n{}",
            f.logs_report()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn two_partitions_of_full_members_resolve_every_direction_and_refuse_non_members() {
    require_root();
    // Hca2 stock; Hca3, Hca4 acmrs. 0x8001: Hca2 + Hca3 (stock and acmrs); 0x8003: Hca3 +
    // Hca4 (acmrs and acmrs). Hca3 has three endpoints.
    let f = fabric(
        "part-full",
        &["Hca3", "Hca4"],
        &["0x8001:Hca2,Hca3", "0x8003:Hca3,Hca4"],
    );
    assert_eq!(f.pkey_table("Hca3").unwrap().len(), 3, "Hca3's P_Key table");
    wait_endpoints(&f, "Hca3", vec![DEFAULT, 0x8001, 0x8003]);
    wait_endpoints(&f, "Hca2", vec![DEFAULT, 0x8001]);
    wait_endpoints(&f, "Hca4", vec![DEFAULT, 0x8003]);
    // Each acmrs endpoint joins its own partition's group.
    wait_log(&f, "Hca3", "joined multicast group 0", 3);
    wait_log(&f, "Hca4", "joined multicast group 0", 2);
    let all = [Form::Name, Form::Ipv4, Form::Ipv6];
    // Counters are the endpoint's: a resolution on Hca3's 0x8001 endpoint counts there only.
    let tenant = f
        .node("Hca3")
        .unwrap()
        .addrs
        .in_partition(0x8001)
        .unwrap()
        .name
        .clone();
    let (t0, d0) = (
        ep_counters(&f, "Hca3", &tenant),
        ep_counters(&f, "Hca3", "hca3"),
    );
    resolves(&f, "Hca3", "Hca2", 0x8001, Form::Name);
    let (t1, d1) = (
        ep_counters(&f, "Hca3", &tenant),
        ep_counters(&f, "Hca3", "hca3"),
    );
    assert!(
        t1[1] > t0[1] && t1[5] > t0[5],
        "0x8001 endpoint: {t0:?} -> {t1:?}"
    );
    assert_eq!(d1, d0, "the default endpoint counted nothing");
    every_direction(&f, 0x8001, &all);
    every_direction(&f, 0x8003, &all);
    every_direction(&f, DEFAULT, &[Form::Name]);
    // A request from one partition for an address of another is not answered: on Hca3 the
    // 0x8001 endpoint asks for Hca4's 0x8003 name.
    let hca3 = &f.node("Hca3").unwrap().addrs;
    let hca4 = &f.node("Hca4").unwrap().addrs;
    refused(
        &f,
        "Hca3",
        &hca3.in_partition(0x8001).unwrap().name,
        &hca4.in_partition(0x8003).unwrap().name,
        "n",
    );
    // Hca2 asks its default partition for Hca3's 0x8003 name: it reaches Hca3's default
    // endpoint, which counts (and logs) it and does not answer.
    refused(
        &f,
        "Hca2",
        "hca2",
        &hca3.in_partition(0x8003).unwrap().name,
        "n",
    );
    wait_log(
        &f,
        "Hca3",
        "address of another partition's endpoint dropped",
        1,
    );
    // A source address that is not this node's gets an error, never a path.
    refused(
        &f,
        "Hca4",
        &hca3.in_partition(0x8003).unwrap().name,
        "hca2",
        "n",
    );
    // A client reregister makes every endpoint join again; each partition still resolves.
    let before = count(&f.node("Hca3").unwrap().log(), "joined multicast group 0");
    f.node("Hca3").unwrap().event("client_reregister").unwrap();
    wait_log(&f, "Hca3", "joined multicast group 0", before + 3);
    for (to, pkey) in [("Hca2", 0x8001), ("Hca4", 0x8003), ("Hca2", DEFAULT)] {
        resolves(&f, "Hca3", to, pkey, Form::Ipv4);
        resolves(&f, to, "Hca3", pkey, Form::Name);
    }
}

/// Limited members: each reaches the full member, never the other limited member.
fn limited(prefix: &str, acmrs: &[&str]) {
    require_root();
    let f = fabric(prefix, acmrs, &["0x8002:Hca2,Hca3=limited,Hca4=limited"]);
    assert_eq!(
        f.pkey_table("Hca3")
            .unwrap()
            .iter()
            .filter(|k| **k & 0x7fff == 2)
            .copied()
            .collect::<Vec<_>>(),
        vec![0x0002],
        "Hca3 holds the limited key"
    );
    wait_endpoints(&f, "Hca3", vec![DEFAULT, 0x0002]);
    wait_endpoints(&f, "Hca2", vec![DEFAULT, 0x8002]);
    every_direction(&f, 0x8002, &[Form::Name, Form::Ipv4]);
    every_direction(&f, DEFAULT, &[Form::Name]);
}

#[test]
fn limited_members_reach_a_stock_full_member_and_never_each_other() {
    limited("part-lim-a", &["Hca3", "Hca4"]);
}

#[test]
fn limited_members_reach_an_acmrs_full_member_and_never_each_other() {
    limited("part-lim-b", &["Hca2", "Hca4"]);
}

#[test]
fn pkeys_removed_and_added_while_running_are_followed() {
    require_root();
    let mut f = fabric("part-change", &["Hca3", "Hca4"], &["0x8001:Hca2,Hca3"]);
    wait_endpoints(&f, "Hca3", vec![DEFAULT, 0x8001]);
    resolves(&f, "Hca3", "Hca2", 0x8001, Form::Name);
    resolves(&f, "Hca2", "Hca3", 0x8001, Form::Ipv4);
    let old = f
        .node("Hca3")
        .unwrap()
        .addrs
        .in_partition(0x8001)
        .unwrap()
        .clone();
    let hca2 = f
        .node("Hca2")
        .unwrap()
        .addrs
        .in_partition(0x8001)
        .unwrap()
        .clone();

    // Hca3 leaves 0x8001, Hca4 joins it.
    f.set_partitions(vec![Partition::parse("0x8001:Hca2,Hca4").unwrap()])
        .unwrap();
    f.wait_pkeys("Hca3", &[], Duration::from_secs(30)).unwrap();
    f.wait_pkeys("Hca4", &[0x8001], Duration::from_secs(30))
        .unwrap();
    wait_endpoints(&f, "Hca3", vec![DEFAULT]);
    wait_endpoints(&f, "Hca4", vec![DEFAULT, 0x8001]);
    wait_log(&f, "Hca3", "processing async event P_Key change", 1);
    // Nothing learned on the old table is served: Hca3's old source address is gone, and its
    // default endpoint cannot reach Hca2's tenant name.
    refused(&f, "Hca3", &old.name, &hca2.name, "n");
    refused(&f, "Hca3", "hca3", &hca2.name, "n");
    resolves(&f, "Hca4", "Hca2", 0x8001, Form::Name);
    resolves(&f, "Hca2", "Hca4", 0x8001, Form::Ipv6);

    // Hca3 comes back: its endpoint, joins and paths too.
    f.set_partitions(vec![Partition::parse("0x8001:Hca2,Hca3,Hca4").unwrap()])
        .unwrap();
    f.wait_pkeys("Hca3", &[0x8001], Duration::from_secs(30))
        .unwrap();
    wait_endpoints(&f, "Hca3", vec![DEFAULT, 0x8001]);
    resolves(&f, "Hca3", "Hca2", 0x8001, Form::Name);
    resolves(&f, "Hca3", "Hca4", 0x8001, Form::Ipv4);
    resolves(&f, "Hca4", "Hca3", 0x8001, Form::Name);
    every_direction(&f, DEFAULT, &[Form::Name]);
}
