//! The proof that the simulated fabric is faithful: Debian's unmodified `libibacmp.so`, loaded
//! by real `/usr/sbin/ibacm` daemons on three simulated HCAs, resolves through its multicast
//! protocol (class 0x2C over UD multicast, carried by simverbs) and the SA, answered by the
//! real `ib_acme`.
//!
//! Needs root, ibsim-utils, opensm, infiniband-diags, ibacm, libumad2sim0, and
//! `libsimverbs.so` built into the same target directory (`cargo build -p simverbs`).

use acm_fabric::checks::{self, global_counters};
use acm_fabric::{pid_exists, Fabric, Output, Provider, Topology};
use std::time::Duration;

const NODES: [&str; 3] = ["Hca2", "Hca3", "Hca4"];

fn stock_fabric(prefix: &str) -> Fabric {
    Fabric::builder(Topology::example("net.2sw2path4hca").unwrap(), NODES)
        .provider(Provider::Stock)
        .name_prefix(prefix)
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"))
}

/// [`checks::resolve_verified`] within 15 s.
fn resolve_verified(
    f: &Fabric,
    on: &str,
    fmt: &str,
    src: &str,
    dst: &str,
    dst_node: &str,
) -> Output {
    checks::resolve_verified(f, on, fmt, src, dst, dst_node, Duration::from_secs(15))
}

fn count(log: &str, needle: &str) -> usize {
    log.matches(needle).count()
}

#[test]
fn stock_ibacmp_resolves_names_ips_lids_gids_with_sa_verification() {
    let f = stock_fabric("stock-resolve");

    // -e: one endpoint per daemon, served by ibacmp, with the node's three addresses.
    for n in f.nodes() {
        let out = n.acme(&["-e"]).unwrap();
        let row = format!(
            ",1,0xffff,1,ibacmp,{},{},{}",
            n.addrs.name, n.addrs.ipv4, n.addrs.ipv6
        );
        assert!(
            out.success() && out.stdout.contains(&row),
            "{}: -e\n{out}",
            n.name
        );
    }

    // Any program runs inside a node's private /run: it sees that node's daemon port file.
    let mut ports = std::collections::BTreeSet::new();
    for n in f.nodes() {
        let out = n
            .run("cat", &["/run/ibacm.port"], Duration::from_secs(5))
            .unwrap();
        let host_view = std::fs::read_to_string(n.run_dir.join("ibacm.port")).unwrap();
        assert!(out.success() && !out.stdout.trim().is_empty(), "{out}");
        assert_eq!(out.stdout.trim(), host_view.trim(), "{}", n.name);
        ports.insert(host_view.trim().to_string());
    }
    assert_eq!(
        ports.len(),
        f.nodes().len(),
        "one port per daemon: {ports:?}"
    );

    let before = global_counters(&f, "Hca3");
    assert_eq!(before["Resolve Count"], 0, "{before:?}");

    // Names, across the two switches too (Hca3 on Switch1, Hca2/Hca4 on Switch2).
    resolve_verified(&f, "Hca3", "n", "hca3", "hca4", "Hca4");
    resolve_verified(&f, "Hca4", "n", "hca4", "hca2", "Hca2");
    // The destination daemons answered an ACM multicast request (class 0x2C), not a preload.
    let hca4_log = f.node("Hca4").unwrap().log();
    assert!(
        hca4_log.contains("acmp_process_acm_recv: src  hca3")
            && hca4_log.contains("acmp_send_addr_resp: hca3"),
        "Hca4 never answered Hca3's multicast address request:\n{}",
        f.logs_report()
    );
    let hca3_log = f.node("Hca3").unwrap().log();
    assert!(
        hca3_log.contains("acmp_process_addr_resp: resp status 0x0"),
        "{hca3_log}"
    );
    assert!(
        hca3_log.contains("acmp_dest_sa_resp: hca4 status=0x0"),
        "{hca3_log}"
    );

    // IPv4 and IPv6 addresses from the address files.
    let (h2, h3, h4) = (
        f.node("Hca2").unwrap().addrs.clone(),
        f.node("Hca3").unwrap().addrs.clone(),
        f.node("Hca4").unwrap().addrs.clone(),
    );
    resolve_verified(
        &f,
        "Hca3",
        "i",
        &h3.ipv4.to_string(),
        &h2.ipv4.to_string(),
        "Hca2",
    );
    resolve_verified(
        &f,
        "Hca2",
        "i",
        &h2.ipv6.to_string(),
        &h4.ipv6.to_string(),
        "Hca4",
    );

    // LIDs and GIDs (PATH requests: SA only).
    let (l3, l4) = (f.node("Hca3").unwrap().lid, f.node("Hca4").unwrap().lid);
    resolve_verified(&f, "Hca3", "l", &l3.to_string(), &l4.to_string(), "Hca4");
    let (g2, g4) = (f.node("Hca2").unwrap().gid, f.node("Hca4").unwrap().gid);
    resolve_verified(&f, "Hca2", "g", &g2.to_string(), &g4.to_string(), "Hca4");

    // Counters moved: Hca3 resolved a name, an IPv4 and a LID (each with a -v SA query).
    let after = global_counters(&f, "Hca3");
    assert!(after["Resolve Count"] >= 3, "{after:?}");
    assert!(after["Addr Query Count"] >= 2, "{after:?}");
    assert!(after["Route Query Count"] >= 3, "{after:?}");
    assert_eq!(after["Error Count"], 0, "{after:?}");

    // A second resolution of the same name is a route-cache hit.
    resolve_verified(&f, "Hca3", "n", "hca3", "hca4", "Hca4");
    let again = global_counters(&f, "Hca3");
    assert!(
        again["Route Cache Count"] > after["Route Cache Count"],
        "{after:?} -> {again:?}"
    );
}

#[test]
fn stock_ibacmp_cache_only_then_rejoin_after_sm_restart_and_client_reregister() {
    let mut f = stock_fabric("stock-events");

    // -c (NODELAY) on a cold cache: ENODATA at once, while ibacmp starts the lookup...
    let hca2 = f.node("Hca2").unwrap();
    // Wait for the endpoint to be READY (joined) first: a plain resolution of another node.
    resolve_verified(&f, "Hca2", "n", "hca2", "hca3", "Hca3");
    let cold = hca2
        .acme(&["-c", "-f", "n", "-s", "hca2", "-d", "hca4"])
        .unwrap();
    assert!(
        !cold.success() && cold.stdout.contains("No data available"),
        "first -c should fail with ENODATA:\n{cold}"
    );
    // ...so that a later -c is answered from the cache.
    let warm = hca2
        .acme_until(
            &["-c", "-f", "n", "-s", "hca2", "-d", "hca4"],
            Duration::from_secs(10),
            |o| o.success(),
        )
        .unwrap();
    assert!(
        warm.success()
            && warm
                .stdout
                .contains(&format!("dlid: {}\n", f.node("Hca4").unwrap().lid)),
        "{warm}"
    );
    let c = global_counters(&f, "Hca2");
    assert!(c["No Data"] >= 1, "{c:?}");

    // A new OpenSM knows no multicast groups; ibacmp does not rejoin on its own...
    let mgid = "ff15:4001:ffff:";
    let groups = f.run_tool("Hca1", "saquery", &["-g"]).unwrap();
    assert!(
        groups.stdout.contains(mgid),
        "ACM group missing before restart:\n{groups}"
    );
    let sm_pid = f.pids()[1];
    f.stop_sm();
    assert!(!pid_exists(sm_pid));
    f.start_sm().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let groups = f.run_tool("Hca1", "saquery", &["-g"]).unwrap();
    assert!(
        !groups.stdout.contains(mgid),
        "the restarted OpenSM already has the ACM group (test premise broken):\n{groups}"
    );

    // ...until the client-reregister event (simverbs control channel) makes it re-join.
    let joins_before: Vec<usize> = NODES
        .iter()
        .map(|n| {
            count(
                &f.node(n).unwrap().log(),
                "acmp_process_join_resp: join successful",
            )
        })
        .collect();
    for n in NODES {
        let reply = f.node(n).unwrap().event("client_reregister").unwrap();
        assert!(reply.starts_with("ok"), "{reply}");
    }
    for (i, n) in NODES.iter().enumerate() {
        let node = f.node(n).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let log = node.log();
            let rejoined = log.contains("acmp_handle_event: event client reregistration")
                && count(&log, "acmp_process_join_resp: join successful") > joins_before[i];
            if rejoined {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{n} did not re-join after client_reregister:\n{}",
                f.logs_report()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let groups = f.run_tool("Hca1", "saquery", &["-g"]).unwrap();
    assert!(
        groups.stdout.contains(mgid),
        "ACM group not re-created:\n{groups}"
    );

    // The re-joined group carries the multicast protocol again (a destination not cached yet).
    resolve_verified(&f, "Hca4", "n", "hca4", "hca3", "Hca3");

    // A daemon stopped and started again comes back with empty caches and resolves again.
    let old_pid = f.node("Hca3").unwrap().pid().unwrap();
    f.node_mut("Hca3").unwrap().stop_daemon();
    assert!(!pid_exists(old_pid));
    assert_eq!(f.node("Hca3").unwrap().pid(), None);
    f.node_mut("Hca3").unwrap().restart_daemon().unwrap();
    assert_ne!(f.node("Hca3").unwrap().pid(), Some(old_pid));
    assert_eq!(global_counters(&f, "Hca3")["Resolve Count"], 0);
    resolve_verified(&f, "Hca3", "n", "hca3", "hca2", "Hca2");

    // Teardown leaves no process behind.
    let pids = f.pids();
    assert_eq!(pids.len(), 2 + NODES.len(), "{pids:?}");
    drop(f);
    for p in pids {
        assert!(!pid_exists(p), "process {p} survived the teardown");
    }
}

#[test]
fn stock_ibacmp_on_a_generated_fat_tree() {
    // Leaf1: Hca1 (OpenSM), Hca2; Leaf2: Hca3, Hca4; two spines.
    let f = Fabric::builder(
        Topology::fat_tree(2, 2, 2).unwrap(),
        ["Hca2", "Hca3", "Hca4"],
    )
    .provider(Provider::Stock)
    .name_prefix("stock-fattree")
    .start()
    .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    assert_eq!(f.sm_node(), "Hca1");
    resolve_verified(&f, "Hca2", "n", "hca2", "hca4", "Hca4");
    resolve_verified(&f, "Hca3", "n", "hca3", "hca4", "Hca4");
    let (l2, l3) = (f.node("Hca2").unwrap().lid, f.node("Hca3").unwrap().lid);
    resolve_verified(&f, "Hca2", "l", &l2.to_string(), &l3.to_string(), "Hca3");
}

/// libibacmp's options for the timeout tests: 300 ms per try, 1 retry (2 tries in all).
const TRY_MS: u64 = 300;
const TRIES: u64 = 2;

/// Resolves a name that is in no address file: libibacmp multicasts an ACM address request
/// nobody answers, retries once, and fails the request. Returns the `ib_acme` result and how
/// long it took. Afterwards the daemon must still resolve: a cached destination and one it
/// has never seen (a fresh multicast request).
fn unanswered_name_fails(f: &Fabric) -> (Output, Duration) {
    // The endpoint is READY (joined) once a resolution works.
    resolve_verified(f, "Hca3", "n", "hca3", "hca4", "Hca4");
    let node = f.node("Hca3").unwrap();
    let started = std::time::Instant::now();
    let out = node
        .acme(&["-f", "n", "-s", "hca3", "-d", "nobody-answers"])
        .unwrap();
    let took = started.elapsed();
    eprintln!("{}: unanswered name failed after {took:?}", f.name());
    assert!(
        !out.success() && out.stdout.contains("Connection timed out"),
        "an unanswered name must fail with ETIMEDOUT ({took:?}):\n{out}\n{}",
        f.logs_report()
    );
    // libibacmp's own account: one retry, then the request failed (its retry/timeout path).
    let log = node.log();
    assert!(
        count(&log, "notice - retrying request") == (TRIES - 1) as usize
            && log.contains("notice - failing request"),
        "{log}"
    );
    assert!(global_counters(f, "Hca3")["Error Count"] >= 1);
    // Still healthy: a cached destination and a new one (multicast again) both resolve.
    resolve_verified(f, "Hca3", "n", "hca3", "hca4", "Hca4");
    resolve_verified(f, "Hca3", "n", "hca3", "hca2", "Hca2");
    (out, took)
}

fn timeout_fabric(prefix: &str, subnet_timeout: Option<u8>) -> Fabric {
    let mut b = Fabric::builder(Topology::example("net.2sw2path4hca").unwrap(), NODES)
        .provider(Provider::Stock)
        .name_prefix(prefix)
        .option("timeout", &TRY_MS.to_string())
        .option("retries", &(TRIES - 1).to_string());
    if let Some(code) = subnet_timeout {
        b = b.subnet_timeout(code);
    }
    b.start().unwrap_or_else(|e| panic!("bring-up failed: {e}"))
}

#[test]
fn stock_ibacmp_unanswered_name_times_out_with_the_default_subnet_timeout() {
    // No override: simverbs reports OpenSM's default 18 in place of ibsim's 31, so each try
    // waits 1 << (18 - 8) = 1024 ms + `timeout` (with 31 it would be 2.3 hours).
    let f = timeout_fabric("stock-timeout18", None);
    let (_, took) = unanswered_name_fails(&f);
    let floor = Duration::from_millis(TRIES * (1024 + TRY_MS));
    assert!(
        took >= floor && took < Duration::from_secs(20),
        "took {took:?}, expected {floor:?}..20 s"
    );
}

#[test]
fn stock_ibacmp_unanswered_name_times_out_fast_with_subnet_timeout_8() {
    // SubnetTimeOut 8 → 1 ms per try on top of `timeout`: well under the default's floor.
    let f = timeout_fabric("stock-timeout8", Some(8));
    let (_, took) = unanswered_name_fails(&f);
    let floor = Duration::from_millis(TRIES * (1 + TRY_MS));
    let default_floor = Duration::from_millis(TRIES * (1024 + TRY_MS));
    assert!(
        took >= floor && took < default_floor,
        "took {took:?}, expected {floor:?}..{default_floor:?}"
    );
}
