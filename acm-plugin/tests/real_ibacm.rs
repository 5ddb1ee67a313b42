//! libacmrs.so inside the real, unmodified ibacm daemon on a simulated fabric (ibsim + OpenSM +
//! simverbs), driven with the real `ib_acme` through `acm_fabric`.
//!
//! Needs root (private /run per daemon) and the artifacts `libsimverbs.so` and `libacmrs.so`
//! (`cargo build -p simverbs -p acm-plugin`). Fails with the reason when not root.

use acm_fabric::checks::require_root;
use acm_fabric::{Fabric, Output, Provider, Topology};
use std::time::{Duration, Instant};

fn ok(o: &Output) -> bool {
    o.success() && o.stdout.contains("SA verification: success")
}

/// The 7 values of the first data row of `ib_acme -P` output.
fn counters(o: &Output) -> Vec<u64> {
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("127.0.0.1,"))
        .unwrap_or_else(|| panic!("no counter row in {o}"));
    line.split(',')
        .skip(1)
        .map(|v| v.trim().parse().unwrap())
        .collect()
}

#[test]
fn real_ibacm_resolves_through_acmrs() {
    require_root();
    let mut fabric = Fabric::builder(
        Topology::example("net.2sw2path4hca").unwrap(),
        ["Hca3", "Hca4"],
    )
    .provider(Provider::Acmrs)
    .name_prefix("acmrs-real")
    .option("addr_preload", "acm_hosts")
    .option("timeout", "500")
    .option("retries", "1")
    .start()
    .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let (n3, n4) = {
        let a = fabric.node("Hca3").unwrap();
        let b = fabric.node("Hca4").unwrap();
        (
            (a.lid, a.gid.to_string(), a.addrs.clone()),
            (b.lid, b.gid.to_string(), b.addrs.clone()),
        )
    };
    let w = Duration::from_secs(15);
    let hca3 = fabric.node("Hca3").unwrap();

    // The core lists our endpoint under our provider name.
    let e = hca3.acme(&["-e"]).unwrap();
    assert!(
        e.stdout.contains(",acmrs,"),
        "{e}\n{}",
        fabric.logs_report()
    );

    // NODELAY before anything is cached: "no data" at once, but the lookup is started, so
    // the same request succeeds shortly after.
    let c_args = ["-f", "n", "-s", &n3.2.name, "-d", &n4.2.name, "-c"];
    let first = hca3.acme(&c_args).unwrap();
    assert!(!first.success(), "first NODELAY request must miss: {first}");
    let primed = hca3.acme_until(&c_args, w, |o| o.success()).unwrap();
    assert!(primed.success(), "{primed}\n{}", fabric.logs_report());

    // Paths by LID and by GID, verified against the SA by ib_acme (-v uses query()).
    let (l3, l4) = (n3.0.to_string(), n4.0.to_string());
    let by_lid = hca3
        .acme_until(&["-f", "l", "-s", &l3, "-d", &l4, "-v"], w, ok)
        .unwrap();
    assert!(ok(&by_lid), "{by_lid}\n{}", fabric.logs_report());
    let by_gid = hca3
        .acme_until(&["-f", "g", "-s", &n3.1, "-d", &n4.1, "-v"], w, ok)
        .unwrap();
    assert!(ok(&by_gid), "{by_gid}\n{}", fabric.logs_report());

    // Names and IPs from the hosts preload, from both sides.
    let name = hca3
        .acme_until(
            &["-f", "n", "-s", &n3.2.name, "-d", &n4.2.name, "-v"],
            w,
            ok,
        )
        .unwrap();
    assert!(ok(&name), "{name}");
    let (ip3, ip4) = (n3.2.ipv4.to_string(), n4.2.ipv4.to_string());
    let ip = hca3
        .acme_until(&["-f", "i", "-s", &ip3, "-d", &ip4, "-v"], w, ok)
        .unwrap();
    assert!(ok(&ip), "{ip}\n{}", fabric.logs_report());
    let (ip63, ip64) = (n3.2.ipv6.to_string(), n4.2.ipv6.to_string());
    let ip6 = hca3
        .acme_until(&["-f", "i", "-s", &ip63, "-d", &ip64, "-v"], w, ok)
        .unwrap();
    assert!(ok(&ip6), "{ip6}\n{}", fabric.logs_report());
    let hca4 = fabric.node("Hca4").unwrap();
    let back = hca4
        .acme_until(
            &["-f", "n", "-s", &n4.2.name, "-d", &n3.2.name, "-v"],
            w,
            ok,
        )
        .unwrap();
    assert!(ok(&back), "{back}\n{}", fabric.logs_report());

    // Loopback: our own name resolves to a path to ourselves.
    let lo = hca3
        .acme(&["-f", "n", "-s", &n3.2.name, "-d", &n3.2.name])
        .unwrap();
    assert!(lo.success(), "{lo}");
    assert!(lo.stdout.contains(&format!("dlid: {}", n3.0)), "{lo}");

    // Counters: the core's global ones (we call acm_increment_counter) and our per-EP ones.
    let global = counters(&hca3.acme(&["-P"]).unwrap());
    assert!(global[5] >= 4, "Route Query Count {global:?}");
    assert!(global[6] >= 2, "Route Cache Count {global:?}");
    let ep = counters(&hca3.acme(&["-P", "1"]).unwrap());
    assert!(ep[1] >= 6, "per-EP Resolve Count {ep:?}");
    assert!(ep[5] >= 4 && ep[6] >= 2, "per-EP route counters {ep:?}");
    let again = hca3.acme(&["-f", "l", "-s", &l3, "-d", &l4]).unwrap();
    assert!(again.success());
    let ep2 = counters(&hca3.acme(&["-P", "1"]).unwrap());
    assert_eq!(ep2[6], ep[6] + 1, "a repeated request is a cache hit");

    // Client reregister (SM change): learned routes are flushed at once; resolution still
    // works (through the SA again).
    let before = counters(&hca3.acme(&["-P", "1"]).unwrap());
    hca3.event("client_reregister").unwrap();
    let t0 = Instant::now();
    while !hca3.log().contains("client reregister") {
        assert!(t0.elapsed() < w, "event not delivered\n{}", hca3.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let rr = hca3
        .acme_until(&["-f", "l", "-s", &l3, "-d", &l4, "-v"], w, ok)
        .unwrap();
    assert!(ok(&rr), "{rr}");
    let after = counters(&hca3.acme(&["-P", "1"]).unwrap());
    assert_eq!(
        after[6], before[6],
        "no cache hit right after the flush: {before:?} {after:?}"
    );
    assert!(
        after[5] >= before[5] + 2,
        "route and -v query went to the SA: {after:?}"
    );

    // Port down/up and a LID change with the real daemon are in tests/real_ibacm_port.rs
    // (ibsim's Unlink/ReLink); the close/reopen sequence in-process is in tests/host.rs.

    // OpenSM stopped: a new destination gets an error answer in bounded time (nothing
    // stuck), cached ones are still served; when OpenSM returns, resolution recovers.
    fabric.stop_sm();
    let hca3 = fabric.node("Hca3").unwrap();
    let t0 = Instant::now();
    let down = hca3.acme(&["-f", "l", "-s", &l3, "-d", "1"]).unwrap();
    assert!(!down.success(), "no SA, no path: {down}");
    assert!(
        !down.timed_out && t0.elapsed() < Duration::from_secs(20),
        "{down}"
    );
    let cached = hca3.acme(&["-f", "l", "-s", &l3, "-d", &l4]).unwrap();
    assert!(
        cached.success(),
        "cached path served without the SA: {cached}"
    );
    fabric.start_sm().unwrap();
    let hca3 = fabric.node("Hca3").unwrap();
    let back = hca3
        .acme_until(
            &["-f", "l", "-s", &l3, "-d", "1", "-v"],
            Duration::from_secs(40),
            ok,
        )
        .unwrap();
    assert!(ok(&back), "{back}\n{}", fabric.logs_report());
}

#[test]
fn real_ibacm_refreshes_hot_routes_ahead_of_expiry() {
    require_root();
    // Routes live 4 s; a hit in the last 3 s (from the first second on) starts a background SA
    // re-query. Counted, not timed: a request that comes less than half a window (1.5 s) after
    // the previous one began must be a hit (the refresh started by any hit in the window has
    // long come back by then); only a longer stall of the machine may explain a miss.
    let ttl = Duration::from_secs(4);
    let window = Duration::from_secs(3);
    let fabric = Fabric::builder(
        Topology::example("net.2sw2path4hca").unwrap(),
        ["Hca3", "Hca4"],
    )
    .provider(Provider::Acmrs)
    .name_prefix("acmrs-refresh")
    .option("acmrs_route_ttl_ms", "4000")
    .option("acmrs_refresh_ahead_pct", "75")
    .start()
    .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let hca3 = fabric.node("Hca3").unwrap();
    let (l3, l4) = (
        hca3.lid.to_string(),
        fabric.node("Hca4").unwrap().lid.to_string(),
    );
    let args = ["-f", "l", "-s", &l3, "-d", &l4];
    let first = hca3
        .acme_until(&args, Duration::from_secs(15), |o| o.success())
        .unwrap();
    assert!(first.success(), "{first}\n{}", fabric.logs_report());
    let before = counters(&hca3.acme(&["-P", "1"]).unwrap());
    // A hot path for more than two lifetimes (and at least 40 requests): every request is
    // answered, and from the cache (nothing expires while it is used), while the SA is
    // re-queried in the background.
    let t0 = Instant::now();
    let (mut n, mut stalls) = (0u64, 0u64);
    let mut longest = Duration::ZERO;
    let mut prev_start: Option<Instant> = None;
    while t0.elapsed() < 2 * ttl + Duration::from_secs(1) || n < 40 {
        let start = Instant::now();
        let o = hca3.acme(&args).unwrap();
        assert!(o.success(), "{o}\n{}", fabric.logs_report());
        if let Some(p) = prev_start {
            let gap = p.elapsed();
            longest = longest.max(gap);
            if gap > window / 2 {
                stalls += 1;
            }
        }
        prev_start = Some(start);
        n += 1;
        // Pacing only (a request every ~100 ms plus ib_acme's own time); nothing is timed.
        std::thread::sleep(Duration::from_millis(100));
    }
    let elapsed = t0.elapsed();
    let after = counters(&hca3.acme(&["-P", "1"]).unwrap());
    let (hits, queries) = (after[6] - before[6], after[5] - before[5]);
    eprintln!(
        "{n} requests in {elapsed:?} (longest gap {longest:?}, {stalls} over {:?}); per-EP \
         counters before {before:?} after {after:?}",
        window / 2
    );
    assert!(hits <= n, "{hits} hits for {n} requests");
    let misses = n - hits;
    assert!(
        misses <= stalls,
        "every request answered from the cache but after a stall: {misses} misses, {stalls} \
         stalls (longest gap {longest:?}): {before:?} {after:?}"
    );
    assert!(
        queries >= misses,
        "each miss is an SA query: {before:?} {after:?}"
    );
    let refreshes = queries - misses;
    // At least one refresh per lifetime the path outlived; at most one per second of the run
    // (an entry is refreshed only once it is 1 s old, and one refresh at a time), plus one.
    assert!(
        refreshes >= 2,
        "background refreshes went to the SA: {refreshes}; {before:?} {after:?}"
    );
    assert!(
        refreshes <= hits.min(elapsed.as_secs() + 1),
        "one refresh per window at most: {refreshes} for {hits} hits in {elapsed:?}"
    );
}

/// The library users install (the release build: `ACM_FABRIC_ACMRS`, which scripts/test.sh
/// points at it, else `target/release/libacmrs.so`) exports `provider_query` alone: the debug
/// build's test hook (`acmrs_test_advance_clock`, its virtual clock) is not in it.
#[test]
fn the_release_library_exports_provider_query_only() {
    let path = std::env::var_os("ACM_FABRIC_ACMRS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().unwrap();
            // target/<profile>/deps/<test> -> target/release/libacmrs.so
            let target = exe.ancestors().nth(3).expect("target dir");
            target.join("release/libacmrs.so")
        });
    assert!(
        path.is_file(),
        "{} missing: run `cargo build --release -p acm-plugin`",
        path.display()
    );
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&path)
        .output()
        .expect("nm (binutils) must be installed");
    assert!(out.status.success(), "nm {}: {out:?}", path.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let exports: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" T ") || l.contains(" D ") || l.contains(" B "))
        .filter_map(|l| l.rsplit(' ').next())
        .collect();
    assert_eq!(
        exports,
        ["provider_query"],
        "{} (a debug build? the real daemons must load the release one)",
        path.display()
    );
}
