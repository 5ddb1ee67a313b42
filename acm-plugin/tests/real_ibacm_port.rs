//! libacmrs.so inside the real, unmodified ibacm daemon while its port really goes down and up
//! (ibsim `Unlink`/`ReLink` through `acm_fabric`; simverbs' port monitor raises PORT_ERR /
//! PORT_ACTIVE, the core runs its close / open sequences) and while OpenSM reassigns LIDs
//! (LID_CHANGE: close + reopen). Nothing learned before a close may be served after it.
//!
//! Needs root (private /run per daemon) and the artifacts `libsimverbs.so` and `libacmrs.so`
//! (`cargo build -p simverbs -p acm-plugin`). Fails with the reason when not root.

use acm_fabric::checks::require_root;
use acm_fabric::{Fabric, Output, Provider, Topology};
use std::time::{Duration, Instant};

const VERIFIED: &str = "SA verification: success";

fn ok(o: &Output) -> bool {
    o.success() && o.stdout.contains(VERIFIED)
}

/// The 7 values of the first data row of `ib_acme -P` output, if there is one.
fn try_counters(o: &Output) -> Option<Vec<u64>> {
    let line = o.stdout.lines().find(|l| l.starts_with("127.0.0.1,"))?;
    line.split(',')
        .skip(1)
        .map(|v| v.trim().parse().ok())
        .collect()
}

/// Per-endpoint counters of endpoint 1: [error, resolve, no data, addr query, addr cache,
/// route query, route cache].
fn ep_counters(f: &Fabric, node: &str) -> Vec<u64> {
    let o = f.node(node).unwrap().acme(&["-P", "1"]).unwrap();
    try_counters(&o).unwrap_or_else(|| panic!("no counter row: {o}\n{}", f.logs_report()))
}

fn wait_log(f: &Fabric, node: &str, what: &str, pred: impl Fn(&str) -> bool) {
    let t0 = Instant::now();
    while !pred(&f.node(node).unwrap().log()) {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{node}: no {what} in its log within 15 s\n{}",
            f.logs_report()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the core lists an acmrs endpoint on `node` again (after a reopen).
fn wait_endpoint(f: &Fabric, node: &str) {
    let t0 = Instant::now();
    loop {
        let e = f.node(node).unwrap().acme(&["-e"]).unwrap();
        if e.stdout.contains(",acmrs,") {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{node}: endpoint not back: {e}\n{}",
            f.logs_report()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn real_ibacm_acmrs_port_down_up_and_lid_change() {
    require_root();
    let mut f = Fabric::builder(
        Topology::example("net.2sw2path4hca").unwrap(),
        ["Hca3", "Hca4"],
    )
    .provider(Provider::Acmrs)
    .name_prefix("acmrs-port")
    .option("addr_preload", "acm_hosts")
    .option("timeout", "500")
    .option("retries", "1")
    .start()
    .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let w = Duration::from_secs(15);
    let (l3, l4) = (
        f.node("Hca3").unwrap().lid.to_string(),
        f.node("Hca4").unwrap().lid.to_string(),
    );
    let plain = ["-f", "l", "-s", &l3, "-d", &l4];
    let verified = ["-f", "l", "-s", &l3, "-d", &l4, "-v"];

    // A path learned and served from the cache.
    let first = f
        .node("Hca3")
        .unwrap()
        .acme_until(&plain, w, |o| o.success())
        .unwrap();
    assert!(first.success(), "{first}\n{}", f.logs_report());
    let c0 = ep_counters(&f, "Hca3");
    let hit = f.node("Hca3").unwrap().acme(&plain).unwrap();
    assert!(hit.success(), "{hit}");
    let c1 = ep_counters(&f, "Hca3");
    assert_eq!(
        c1[6],
        c0[6] + 1,
        "repeat is a route-cache hit: {c0:?} {c1:?}"
    );
    assert_eq!(c1[5], c0[5], "no route query for a hit: {c0:?} {c1:?}");

    // Port down: the core closes the endpoint/port/device; requests get an error answer.
    f.port_down("Hca3").unwrap();
    wait_log(&f, "Hca3", "port down", |l| {
        l.contains("acm_port_down: ibsim0 1 is down")
    });
    for args in [&plain[..], &["-f", "n", "-s", "hca3", "-d", "hca4"][..]] {
        let t0 = Instant::now();
        let down = f.node("Hca3").unwrap().acme(args).unwrap();
        assert!(
            !down.success() && !down.timed_out && t0.elapsed() < Duration::from_secs(10),
            "request on a down port must be answered with an error: {down}"
        );
    }

    // Port up: the core reopens; the endpoint is back.
    let log = f.node("Hca3").unwrap().log();
    let ups = log.matches("acm_port_up: ibsim0 1").count();
    f.port_up("Hca3").unwrap();
    wait_log(&f, "Hca3", "port up", |l| {
        l.matches("acm_port_up: ibsim0 1").count() > ups
    });
    wait_endpoint(&f, "Hca3");
    // The path learned before the close is not served from a cache: the next request is a
    // route query (to the SA), not a route-cache hit.
    let before = ep_counters(&f, "Hca3");
    let after_up = f
        .node("Hca3")
        .unwrap()
        .acme_until(&plain, w, |o| o.success())
        .unwrap();
    assert!(after_up.success(), "{after_up}\n{}", f.logs_report());
    let after = ep_counters(&f, "Hca3");
    assert_eq!(
        after[6], before[6],
        "nothing stale survives a close (no cache hit): {before:?} {after:?}"
    );
    assert!(
        after[5] > before[5],
        "the first request after reopen is a route query: {before:?} {after:?}"
    );
    let v = f
        .node("Hca3")
        .unwrap()
        .acme_until(&verified, w, ok)
        .unwrap();
    assert!(ok(&v), "{v}\n{}", f.logs_report());

    // LID change: the SM moves to Hca3 itself (new OpenSM, empty cache, `-r`), so Hca3's port
    // becomes LID 1. simverbs raises LID_CHANGE, the core closes and reopens; paths use the
    // new LIDs. (OpenSM with `-r` on Hca2 happens to keep Hca3's and Hca4's LIDs.)
    // Hca4 learns the path to Hca3 first (DLID = Hca3's old LID).
    let pre = f
        .node("Hca4")
        .unwrap()
        .acme_until(&["-f", "n", "-s", "hca4", "-d", "hca3", "-v"], w, ok)
        .unwrap();
    assert!(
        ok(&pre) && pre.stdout.contains(&format!("dlid: {l3}\n")),
        "{pre}"
    );
    f.move_sm("Hca3", true).unwrap();
    let changed = f.refresh_lids().unwrap();
    eprintln!("LIDs changed by the new SM: {changed:?}");
    assert!(
        changed.iter().any(|(n, _, _)| n == "Hca3"),
        "Hca3's LID did not change: {changed:?}"
    );
    wait_log(&f, "Hca3", "LID change", |l| {
        l.contains("processing async event LID change")
    });
    let (n3, n4) = (f.node("Hca3").unwrap(), f.node("Hca4").unwrap());
    let (nl3, nl4) = (n3.lid.to_string(), n4.lid.to_string());
    wait_endpoint(&f, "Hca3");
    let moved = n3
        .acme_until(&["-f", "l", "-s", &nl3, "-d", &nl4, "-v"], w, ok)
        .unwrap();
    assert!(ok(&moved), "{moved}\n{}", f.logs_report());
    assert!(moved.stdout.contains(&format!("slid: {nl3}\n")), "{moved}");
    assert!(moved.stdout.contains(&format!("dlid: {nl4}\n")), "{moved}");
    // By name too: the destination's address maps to its GID, whose path has the new DLID.
    let by_name = n3
        .acme_until(&["-f", "n", "-s", "hca3", "-d", "hca4", "-v"], w, ok)
        .unwrap();
    assert!(ok(&by_name), "{by_name}\n{}", f.logs_report());
    assert!(
        by_name.stdout.contains(&format!("dlid: {nl4}\n")),
        "{by_name}"
    );
    assert!(
        by_name.stdout.contains(&format!("slid: {nl3}\n")),
        "{by_name}"
    );
    // Hca4's own LID did not change, so its port saw no LID_CHANGE (and the core drops
    // SM_CHANGE): only the client reregister a real new master SM sends (ibsim drops the
    // bit; acm_fabric raises it) tells it that learned paths are void. After it, the path to
    // Hca3 carries Hca3's new LID, not the cached one.
    assert!(!changed.iter().any(|(n, _, _)| n == "Hca4"), "{changed:?}");
    assert_eq!(f.client_reregister_all().unwrap(), 2);
    wait_log(&f, "Hca4", "client reregister", |l| {
        l.contains("client reregister")
    });
    let remote = f
        .node("Hca4")
        .unwrap()
        .acme_until(&["-f", "n", "-s", "hca4", "-d", "hca3", "-v"], w, |o| {
            ok(o) && o.stdout.contains(&format!("dlid: {nl3}\n"))
        })
        .unwrap();
    assert!(
        ok(&remote) && remote.stdout.contains(&format!("dlid: {nl3}\n")),
        "no stale DLID after the SM's reregister: {remote}\n{}",
        f.logs_report()
    );
}
