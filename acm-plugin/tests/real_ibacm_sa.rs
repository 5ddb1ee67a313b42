//! The `ud` SA transport inside the real, unmodified ibacm daemon, against real OpenSM on the
//! simulated fabric (ibsim; simverbs bridges the UD QP's MADs to the SM's QP1):
//!
//! * SA queries are pipelined up to `acmrs_sa_window` whatever the core's `sa_depth` (1), and
//!   with the SA gone (OpenSM frozen with SIGSTOP) under a burst of distinct misses, every
//!   request is answered within the configured bound while the SA is still gone; when OpenSM
//!   continues, new misses resolve again.
//! * Fabric changes reach the cache: an HCA unlinked in ibsim (OpenSM reports trap 65 to our
//!   subscription) stops being answered from acmrs's cache; relinked (trap 64) it resolves
//!   again, although a negative entry for it would otherwise live for 10 minutes. The stock
//!   provider on another node, which subscribes to nothing, keeps answering its stale path.
//!
//! * A burst of distinct misses asks the real OpenSM once for the port's half-world
//!   PathRecord table (a GetTable answered over RMPP: OpenSM's segments, our ACKs, through
//!   the fabric's RMPP sender and the GSI bridge) instead of one Get each, answers the burst
//!   from it, and leaves every other destination of the subnet cached.
//!
//! Needs root (private /run per daemon) and the artifacts `libsimverbs.so` and `libacmrs.so`
//! (`cargo build -p simverbs -p acm-plugin`). Fails with the reason when not root.

mod common;

use acm_fabric::checks::{require_root, SA_VERIFIED};
use acm_fabric::{Fabric, Output, Provider, Topology};
use std::time::{Duration, Instant};

/// The 7 per-endpoint counters of endpoint 1 (`ib_acme -P 1`): [error, resolve, no data,
/// addr query, addr cache, route query, route cache].
fn ep_counters(f: &Fabric, node: &str) -> Vec<u64> {
    let o = f.node(node).unwrap().acme(&["-P", "1"]).unwrap();
    o.stdout
        .lines()
        .find(|l| l.starts_with("127.0.0.1,"))
        .and_then(|l| {
            l.split(',')
                .skip(1)
                .map(|v| v.trim().parse().ok())
                .collect()
        })
        .unwrap_or_else(|| panic!("no counter row: {o}\n{}", f.logs_report()))
}

const ROUTE_QUERY: usize = 5;
const ROUTE_CACHE: usize = 6;

/// `ib_acme -f l` from `on` to `dlid`: what the provider answers (with `-v` ib_acme also asks
/// the SA itself whether the path is real, and fails if it is not, whatever the provider said).
fn path(f: &Fabric, on: &str, dlid: u16, verify: bool) -> Output {
    let s = f.node(on).unwrap().lid.to_string();
    let d = dlid.to_string();
    let mut args = vec!["-f", "l", "-s", &s, "-d", &d];
    if verify {
        args.push("-v");
    }
    f.node(on).unwrap().acme(&args).unwrap()
}

/// `ib_acme -f l` on `on` to `dlid` succeeds and is answered from `on`'s cache (its route
/// cache counter grows by one).
fn assert_cache_hit(f: &Fabric, on: &str, dlid: u16) {
    let c0 = ep_counters(f, on);
    assert!(path(f, on, dlid, false).success());
    let c1 = ep_counters(f, on);
    assert_eq!(
        c1[ROUTE_CACHE],
        c0[ROUTE_CACHE] + 1,
        "a cache hit: {c0:?} {c1:?}"
    );
}

/// `ib_acme -f l` on `on` to `dlid`, retried for up to `within` until the SA verified a path
/// with that DLID.
fn verified_until(f: &Fabric, on: &str, dlid: u16, within: Duration) -> Output {
    let t0 = Instant::now();
    loop {
        let o = path(f, on, dlid, true);
        if o.stdout.contains(SA_VERIFIED) && o.stdout.contains(&format!("dlid: {dlid}\n")) {
            return o;
        }
        assert!(
            t0.elapsed() < within,
            "{on} -> LID {dlid} not verified within {within:?}: {o}\n{}",
            f.logs_report()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_sa_window_is_independent_of_sa_depth_and_a_gone_sa_is_answered_within_the_bound() {
    require_root();
    // 56 HCAs and 6 switches, so 50 distinct destinations the SA knows. Hca1 runs OpenSM.
    let f = Fabric::builder(Topology::parse("fattree:4,2,14").unwrap(), ["Hca2"])
        .provider(Provider::Acmrs)
        // The whole window at once (no answers to grow it while the SA is frozen).
        .option("acmrs_sa_window_start", "16")
        // One Get per destination: the window is what this test counts (tables have a test
        // of their own below).
        .option("acmrs_sa_table_min", "0")
        .name_prefix("acmrs-sawin")
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let me = f.node("Hca2").unwrap().lid;
    let known = f.port_info("Hca1").unwrap().lid;
    verified_until(&f, "Hca2", known, Duration::from_secs(20));
    // At the defaults (timeout 2000, retries 2) sa_deadline = 2 s × 3 + 1 s = 7 s, so the
    // bound of a request is queue_deadline = 7 s × 3 = 21 s from its arrival.
    let bound = Duration::from_secs(21);
    let dests: Vec<u16> = (1..=62u16)
        .filter(|l| *l != me && *l != known)
        .take(50)
        .collect();
    assert_eq!(dests.len(), 50);
    let before = ep_counters(&f, "Hca2");
    f.pause_sm().unwrap();
    let paused = Instant::now();
    let results: Vec<(Output, Duration)> = std::thread::scope(|s| {
        let hs: Vec<_> = dests
            .iter()
            .map(|&d| {
                let f = &f;
                s.spawn(move || {
                    let t0 = Instant::now();
                    let o = path(f, "Hca2", d, false);
                    (o, t0.elapsed())
                })
            })
            .collect();
        // The window lets 16 out, whatever sa_depth (1) says: wait until 16 went (the 50
        // clients start within a second or two), then check that no more follow while the SA
        // stays silent (the first ones time out only after 3 tries of ~3 s).
        let t0 = Instant::now();
        let mut during = ep_counters(&f, "Hca2");
        while during[ROUTE_QUERY] - before[ROUTE_QUERY] < 16
            && t0.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(100));
            during = ep_counters(&f, "Hca2");
        }
        std::thread::sleep(Duration::from_millis(500));
        let later = ep_counters(&f, "Hca2");
        assert_eq!(
            (
                during[ROUTE_QUERY] - before[ROUTE_QUERY],
                later[ROUTE_QUERY] - before[ROUTE_QUERY]
            ),
            (16, 16),
            "SA queries out with the SA frozen: {before:?} -> {during:?} -> {later:?}\n{}",
            f.logs_report()
        );
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let answered_by = paused.elapsed();
    for (o, took) in &results {
        assert!(
            !o.success() && !o.timed_out,
            "with the SA gone a request is answered with an error: {o}"
        );
        assert!(
            // Slack for 50 ib_acme processes starting at once on a busy 2-core box (the exact
            // bound is proven in virtual time: resolver_route.rs).
            *took < bound + Duration::from_secs(6),
            "answered after {took:?} (bound {bound:?}): {o}"
        );
    }
    // Everyone had an answer while OpenSM was still frozen; keep it frozen for a minute in
    // all, then let it continue.
    let gone = Duration::from_secs(60);
    if answered_by < gone {
        std::thread::sleep(gone - answered_by);
    }
    f.resume_sm().unwrap();
    // The provider recovers: fresh misses resolve (the SA may need a moment to catch up with
    // what queued up on its QP while it was frozen).
    for &d in dests.iter().take(5) {
        let s = me.to_string();
        let ds = d.to_string();
        let o = f
            .node("Hca2")
            .unwrap()
            .acme_until(
                &["-f", "l", "-s", &s, "-d", &ds, "-v"],
                Duration::from_secs(20),
                |o| o.stdout.contains(SA_VERIFIED),
            )
            .unwrap();
        assert!(
            o.stdout.contains(SA_VERIFIED),
            "after the SA came back: {o}"
        );
    }
}

#[test]
fn an_unlinked_node_is_dropped_from_the_cache_and_reachable_again_when_relinked() {
    require_root();
    // Hca2 stock, Hca3 acmrs; Hca4 runs no daemon, it is the destination that comes and goes.
    let f = common::stock_and_acmrs("acmrs-trap")
        // A path never expires and "no path" is remembered for 10 minutes: only the SA's
        // Reports can change what the cache says within this test.
        .option("route_timeout", "-1")
        .option("acmrs_negative_ttl_ms", "600000")
        .option("log_level", "1")
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let w = Duration::from_secs(20);
    let l4 = f.port_info("Hca4").unwrap().lid;
    for on in ["Hca2", "Hca3"] {
        verified_until(&f, on, l4, w);
    }
    assert_cache_hit(&f, "Hca3", l4);

    // Hca4 leaves the fabric. OpenSM sweeps (the switch's trap 128) and reports trap 65.
    f.port_down("Hca4").unwrap();
    let t0 = Instant::now();
    let gone = loop {
        let o = path(&f, "Hca3", l4, false);
        if !o.success() {
            break o;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "acmrs still answers the path to an unlinked node after 15 s: {o}\n{}",
            f.logs_report()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let dropped_after = t0.elapsed();
    let log = f.node("Hca3").unwrap().log();
    assert!(
        log.contains("SA Report: trap 65 for") && !log.contains("trap 65 for ::: 0"),
        "the Report was applied: {gone}\n{log}"
    );
    // Not from the cache: the request went to the SA, which has no path to it.
    let c2 = ep_counters(&f, "Hca3");
    let o = path(&f, "Hca3", l4, false);
    let c3 = ep_counters(&f, "Hca3");
    assert!(!o.success());
    assert_eq!(c3[ROUTE_CACHE], c2[ROUTE_CACHE], "no hit: {c2:?} {c3:?}");
    // The stock provider keeps serving its cached path: it never hears of the change.
    let stock = path(&f, "Hca2", l4, false);
    assert!(
        stock.success(),
        "stock libibacmp keeps its stale path (this is what acmrs fixes): {stock}"
    );
    eprintln!("acmrs dropped the path {dropped_after:?} after the unlink; stock still serves it");

    // Hca4 comes back: trap 64 drops the negative entry, the next request asks the SA.
    f.port_up("Hca4").unwrap();
    let t1 = Instant::now();
    loop {
        let o = path(&f, "Hca3", l4, true);
        if o.stdout.contains(SA_VERIFIED) {
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(20),
            "a relinked node is not reachable again after 20 s: {o}\n{}",
            f.logs_report()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        f.node("Hca3")
            .unwrap()
            .log()
            .contains("SA Report: trap 64 for"),
        "{}",
        f.logs_report()
    );
}

#[test]
fn a_new_sm_drops_what_the_old_one_taught_and_reports_to_us_again() {
    require_root();
    // OpenSM starts on Hca1; acmrs runs on Hca3; Hca4 is a destination.
    let mut f = Fabric::builder(Topology::example("net.2sw2path4hca").unwrap(), ["Hca3"])
        .provider(Provider::Acmrs)
        .name_prefix("acmrs-smmove")
        .option("route_timeout", "-1")
        .option("log_level", "1")
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let w = Duration::from_secs(20);
    let l4 = f.port_info("Hca4").unwrap().lid;
    verified_until(&f, "Hca3", l4, w);
    assert_cache_hit(&f, "Hca3", l4);

    // The SM moves to Hca2 (same LIDs): a new SM with none of the old one's subscriptions.
    let sm_before = f.port_info("Hca3").unwrap().sm_lid;
    f.move_sm("Hca2", false).unwrap();
    let sm_after = f.port_info("Hca3").unwrap().sm_lid;
    assert_ne!(sm_before, sm_after, "the SM moved");
    // What the old SM taught is not served as fresh: the next request asks the (new) SA.
    let t0 = Instant::now();
    loop {
        let before = ep_counters(&f, "Hca3");
        let o = path(&f, "Hca3", l4, false);
        let after = ep_counters(&f, "Hca3");
        if o.success() && after[ROUTE_QUERY] > before[ROUTE_QUERY] {
            break;
        }
        assert!(
            t0.elapsed() < w,
            "still answered from the old SM's data {w:?} after the move: {o} {before:?} \
             {after:?}\n{}",
            f.logs_report()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // And the new SM reports to us: unlinking Hca4 reaches acmrs's cache.
    f.port_down("Hca4").unwrap();
    let t1 = Instant::now();
    while path(&f, "Hca3", l4, false).success() {
        assert!(
            t1.elapsed() < Duration::from_secs(15),
            "no Report from the new SM: the path is still served\n{}",
            f.logs_report()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(f
        .node("Hca3")
        .unwrap()
        .log()
        .contains("SA Report: trap 65 for"));
}

#[test]
fn a_burst_of_misses_is_answered_from_the_ports_half_world_table_over_rmpp() {
    require_root();
    // 56 HCAs and 6 switches; Hca1 runs OpenSM.
    let f = Fabric::builder(Topology::parse("fattree:4,2,14").unwrap(), ["Hca2"])
        .provider(Provider::Acmrs)
        .option("acmrs_sa_table_min", "8")
        .option("route_timeout", "-1")
        .option("log_level", "1")
        .name_prefix("acmrs-table")
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let me = f.node("Hca2").unwrap().lid;
    let known = f.port_info("Hca1").unwrap().lid;
    verified_until(&f, "Hca2", known, Duration::from_secs(20));
    let lids: Vec<u16> = (1..=62u16).filter(|l| *l != me && *l != known).collect();
    let (burst, rest) = lids.split_at(30);
    let before = ep_counters(&f, "Hca2");
    // 30 clients at once, as at a job's start: OpenSM is held (SIGSTOP) while they arrive, so
    // they meet the window's one first query, the backlog reaches 8 and the port asks for its
    // table; then OpenSM goes on, and every client gets its own path.
    f.pause_sm().unwrap();
    let results: Vec<(u16, Output)> = std::thread::scope(|s| {
        let hs: Vec<_> = burst
            .iter()
            .map(|&d| {
                let f = &f;
                s.spawn(move || (d, path(f, "Hca2", d, false)))
            })
            .collect();
        // Well within the first try's time (timeout 2 s + the subnet timeout).
        std::thread::sleep(Duration::from_millis(1500));
        f.resume_sm().unwrap();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (d, o) in &results {
        assert!(
            o.success() && o.stdout.contains(&format!("dlid: {d}\n")),
            "LID {d}: {o}\n{}",
            f.logs_report()
        );
    }
    let log = f.node("Hca2").unwrap().log();
    let line = log
        .lines()
        .find(|l| l.contains("SA half-world PathRecord table: "))
        .unwrap_or_else(|| panic!("no table taken:\n{}", f.logs_report()));
    let records: usize = line
        .rsplit("table: ")
        .next()
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(records >= 56, "one record per port at least: {line}");
    assert!(!log.contains("table failed"), "{log}");
    let rmpp = f.rmpp_stats().unwrap();
    assert!(
        rmpp.get("completed").copied().unwrap_or(0) >= 1,
        "OpenSM's RMPP sender completed the transfer: {rmpp:?}"
    );
    // Fewer SA Gets than destinations: the table answered the rest.
    let after = ep_counters(&f, "Hca2");
    let gets = after[ROUTE_QUERY] - before[ROUTE_QUERY];
    assert!(
        gets < 30,
        "{gets} Gets for 30 destinations: {before:?} -> {after:?}"
    );
    println!("{line}; {gets} Gets for 30 destinations; OpenSM's RMPP sender: {rmpp:?}");
    // Destinations nobody asked for are cache hits now, and the SA agrees with the paths.
    for &d in rest.iter().take(5) {
        assert_cache_hit(&f, "Hca2", d);
        let o = path(&f, "Hca2", d, true);
        assert!(o.stdout.contains(SA_VERIFIED), "LID {d}: {o}");
    }
}
