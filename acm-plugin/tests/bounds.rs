//! Bounded resources: the SA window over the core's service (`acmrs_sa_transport core`:
//! `sa_depth` MADs held by the core, the rest in a FIFO backlog with deadlines), the request queue and pending table (ENOMEM beyond them), the address entries,
//! held MADs of closed endpoints, 100k destinations, and no leak over open/close cycles.

mod common;

use acm_core_nostd::wire::client::Status;
use acm_testkit::core::*;
use acm_testkit::host::*;
use acm_testkit::request::*;
use acmrs::ffi::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const OPTS: &str = "\
log_level 0
acmrs_sa_transport core
timeout 100
retries 0
route_timeout -1
";

#[test]
fn backlog_beyond_sa_depth_and_close_with_a_full_backlog() {
    let _s = serial();
    // sa_depth 1: one SA query in the core at a time, the rest wait in our backlog.
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let mut tids = Vec::new();
    for i in 0..40u16 {
        let t = h.tid();
        tids.push(t);
        h.resolve(ep, &path_request(t, 100 + i, None, 0), 1);
    }
    h.barrier();
    assert_eq!(sa_pending(), 1, "no more than sa_depth in flight");
    assert_eq!(response_count(), 0);
    // Answering drains the backlog in order.
    let t0 = Instant::now();
    while response_count() < 40 {
        while sa_complete_next(SaAction::Answer) {}
        assert!(t0.elapsed() < W);
        std::thread::sleep(Duration::from_micros(200));
    }
    check_exactly_once(&tids).unwrap();
    assert!(responses().iter().all(|r| r.msg.hdr.status == 0));
    let order: Vec<u64> = responses().iter().map(|r| r.msg.hdr.tid).collect();
    assert_eq!(order, tids, "FIFO");
    // 2000 waiting requests (1 in flight, the rest in the backlog) when the endpoint closes:
    // every one answered ENODATA once, nothing started on the closed endpoint.
    reset_counters();
    let mut tids = Vec::new();
    for i in 0..2000u16 {
        let t = h.tid();
        tids.push(t);
        h.resolve(ep, &path_request(t, 1000 + i, None, 0), 1);
    }
    assert!(wait_until(|| sa_pending() == 1));
    h.close_ep(ep);
    assert!(wait_responses(2000, W));
    check_exactly_once(&tids).unwrap();
    assert!(responses().iter().all(|r| r.status() == Status::Enodata));
    assert_eq!(DEAD_ENDPOINT_USE.load(Ordering::SeqCst), 0);
    sa_drain_timeouts();
    h.close();
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));
}

/// The MADs held by the core never exceed the in-flight bound (`sa_depth`), even when the
/// SA never answers and the deadlines answer the clients first: a window slot stays reserved
/// until the core hands its MAD back. Every client is still answered exactly once.
#[test]
fn outstanding_mads_stay_bounded_when_the_sa_never_answers() {
    let _s = serial();
    // sa_depth 1 → 1 in flight; deadline = 100 ms × 1 + 1 s, in the SA window and in the
    // backlog alike.
    let mut h = Host::open(
        "log_level 0\nacmrs_sa_transport core\ntimeout 100\nretries 0\n",
        &[],
    );
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let sends = SENDS.load(Ordering::SeqCst);
    let tids: Vec<u64> = (1..=40).collect();
    for &t in &tids {
        h.resolve(0, &path_request(t, t as u16, None, 0), 1);
    }
    // The SA holds every MAD: all 40 are answered by deadlines (ETIMEDOUT), 1 of them with
    // its MAD still held by the core.
    let mut max = 0;
    assert!(wait_until(|| {
        max = max.max(sa_pending());
        response_count() == 40
    }));
    assert!(responses().iter().all(|r| r.status() == Status::Etimedout));
    check_exactly_once(&tids).unwrap();
    // No slot was freed for the backlog while the core held the MADs: nothing else was sent.
    assert_eq!(sa_pending(), 1);
    assert_eq!(SENDS.load(Ordering::SeqCst) - sends, 1);
    assert!(
        max <= 1,
        "the dataplane handed {max} MADs to the core (bound 1)"
    );
    // The core gives the MADs back (umad timeouts): nothing is left to send or answer.
    sa_drain_timeouts();
    h.barrier();
    assert_eq!(sa_pending(), 0);
    assert_eq!(SENDS.load(Ordering::SeqCst) - sends, 1);
    check_exactly_once(&tids).unwrap();
    h.close();
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));
}

/// The MADs of a closed endpoint may never come back (the core stops reading a port that went
/// down), so closing frees their slots: another endpoint still gets its queries sent and
/// answered, and the late replies are ignored.
#[test]
fn closing_an_endpoint_frees_the_slots_of_its_held_mads() {
    let _s = serial();
    let mut h = Host::open("log_level 0\nacmrs_sa_window_start 4096\n", &[]);
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    for i in 0..8u64 {
        h.resolve(0, &path_request(1 + i, 10 + i as u16, None, 0), 1);
    }
    assert!(wait_until(|| sa_pending() == 8));
    h.close_ep(0);
    assert!(wait_responses(8, W), "waiters answered at close");
    h.open_ep(0x8001, (ACM_ADDRESS_NAME, b"node8"));
    h.resolve(0, &path_request(100, 5, None, 0), 1);
    assert!(
        wait_until(|| sa_pending() == 9),
        "the new endpoint's query was sent"
    );
    // The core answers everything, the closed endpoint's MADs first.
    while sa_complete_next(SaAction::Answer) {}
    assert!(wait_until(|| find(100).len() == 1));
    h.barrier();
    let tids: Vec<u64> = (1..=8).chain([100]).collect();
    check_exactly_once(&tids).unwrap();
    assert_eq!(find(100)[0].status(), Status::Success);
    h.close();
}

/// `acmrs_addr_capacity` bounds the addresses loaded from the hosts preload.
#[test]
fn acmrs_addr_capacity_bounds_the_hosts_preload() {
    let _s = serial();
    let hosts = "node1 fe80::1001\nnode2 fe80::1002\nnode3 fe80::1003\n";
    let mut h = Host::open(
        "log_level 0\naddr_preload acm_hosts\naddr_data_file $DIR/hosts.data\n\
         acmrs_addr_capacity 2\n",
        &[("hosts.data", hosts)],
    );
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    assert!(log_contains(
        "1 addresses beyond acmrs_addr_capacity 2 ignored"
    ));
    let req = |t, name: &'static [u8]| {
        dest_request(t, (ACM_ADDRESS_NAME, b"node7"), (ACM_ADDRESS_NAME, name), 0)
    };
    h.resolve(0, &req(1, b"node1"), 4);
    h.resolve(0, &req(3, b"node3"), 4);
    sa_one(SaAction::Answer, 2);
    assert_eq!(find(1)[0].status(), Status::Success, "within the capacity");
    assert_eq!(find(3)[0].status(), Status::Enodata, "beyond the capacity");
    h.close();
}

/// A route preload larger than `acmrs_path_capacity` evicts live entries to make room: an
/// error that names the sizes and the option, not a silent loss.
#[test]
fn a_route_preload_beyond_acmrs_path_capacity_is_an_error() {
    let _s = serial();
    const N: u16 = 100;
    let dump = common::route_dump(N, 0x20, 0x2000);
    // 20 paths: a table of 100 entry slots (sized for the design load), for 200 path entries.
    let opts = format!(
        "{OPTS}route_preload opensm_full_v1\nroute_data_file $DIR/route.data\n\
         acmrs_path_capacity 20\n"
    );
    let mut h = Host::open(&opts, &[("route.data", &dump)]);
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    assert!(
        wait_until(|| log_contains("ERROR - route preload: ")),
        "no error for an overflowing preload"
    );
    assert!(log_contains(
        "routes (2 path entries each) into a route cache of 100 slots; raise acmrs_path_capacity"
    ));
    // 200 path entries into 100 slots: at least 100 of them were pushed out.
    let evicted: u64 = logged("route preload: ")
        .iter()
        .find_map(|l| {
            l.split("route preload: ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap();
    assert!((100..200).contains(&evicted), "{evicted}");
    h.close();
}

#[test]
fn full_queue_and_pending_table_answer_enomem() {
    let _s = serial();
    let opts = "log_level 0\nacmrs_request_capacity 4\nacmrs_pending_capacity 8\n\
                acmrs_sa_window_start 4096\n";
    let mut h = Host::open(opts, &[]);
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    // Nobody answers the SA: requests pile up until the tables are full. 40 distinct
    // destinations, 8 pending at most: at least 32 are refused, inline (queue full) or by
    // the dataplane (every request slot in use).
    let tids: Vec<u64> = (1000..1040).collect();
    for &t in &tids {
        h.resolve(0, &path_request(t, (t - 999) as u16, None, 0), 1);
    }
    let enomem = || {
        responses()
            .iter()
            .filter(|r| r.status() == Status::Enomem)
            .count()
    };
    assert!(
        wait_until(|| enomem() >= 40 - 8),
        "{} ENOMEM answers",
        enomem()
    );
    assert!(log_contains("ENOMEM"), "the refusals are logged");
    while sa_complete_next(SaAction::Answer) {}
    assert!(wait_responses(40, W));
    check_exactly_once(&tids).unwrap();
    h.close();
}

#[test]
fn hundred_thousand_destinations() {
    let _s = serial();
    let opts =
        "log_level 0\nsa_depth 32\nacmrs_sa_window_start 4096\nacmrs_path_capacity 200000\nacmrs_request_capacity 131072\n\
                acmrs_pending_capacity 131072\n";
    let mut h = Host::open(opts, &[]);
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let n = 100_000u64;
    let sa = AutoSa::start();
    let t0 = Instant::now();
    for i in 1..=n {
        h.resolve(0, &path_request(i, 0, Some(gid_of(0x1000 + i)), 0), 1);
    }
    assert!(
        wait_responses(n as usize, Duration::from_secs(120)),
        "only {} answered",
        response_count()
    );
    let miss_time = t0.elapsed();
    drop(sa);
    let tids: Vec<u64> = (1..=n).collect();
    check_exactly_once(&tids).unwrap();
    for r in responses() {
        assert_eq!(r.msg.hdr.status, 0);
        assert_eq!(dgid_of(&r.msg), gid_of(0x1000 + r.msg.hdr.tid));
    }
    // Second pass: the dataplane cached every route before answering, so every one is a hit,
    // answered inline, with no SA traffic.
    reset_counters();
    let hits_before = h.perf(0)[cntr::ROUTE_CACHE];
    let sends = SENDS.load(Ordering::SeqCst);
    let t1 = Instant::now();
    for i in 1..=n {
        h.resolve(0, &path_request(n + i, 0, Some(gid_of(0x1000 + i)), 0), 1);
    }
    let hit_time = t1.elapsed();
    assert_eq!(response_count(), n as usize, "all hits answered inline");
    assert_eq!(SENDS.load(Ordering::SeqCst), sends);
    let perf = h.perf(0);
    assert_eq!(perf[cntr::ROUTE_CACHE] - hits_before, n);
    eprintln!("100k: misses {miss_time:?}, hits {hit_time:?}");
    h.close();
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));
}

fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 has no preconditions.
    unsafe { libc::mallinfo2().uordblks }
}

#[test]
fn open_close_cycles_do_not_leak() {
    let _s = serial();
    let cycle = || {
        let mut h = Host::open("log_level 0\nacmrs_sa_window_start 4096\n", &[]);
        h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
        h.add_addr(0, ACM_ADDRESS_IP, &[10, 0, 0, 7]);
        h.add_addr(0, ACM_ADDRESS_IP, &[10, 0, 0, 7]);
        h.eps[0].addrs.pop(); // leaked by the core's resync: freed by close_endpoint
        for i in 0..50u64 {
            h.resolve(0, &path_request(i + 1, 1 + (i % 10) as u16, None, 0), 1);
        }
        assert!(
            wait_until(|| sa_pending() >= 8),
            "a window of queries in flight (acmrs_sa_window over the core: no UD QP here)"
        );
        let t0 = Instant::now();
        while response_count() < 50 {
            while sa_complete_next(SaAction::Answer) {}
            assert!(t0.elapsed() < W, "backlog not drained");
            std::thread::sleep(Duration::from_micros(200));
        }
        for i in 0..5u64 {
            h.resolve(0, &path_request(100 + i, 20 + i as u16, None, 0), 1);
        }
        h.close(); // answers the 5 waiting requests
        assert_eq!(response_count(), 55);
        sa_drain_timeouts();
    };
    cycle();
    cycle();
    let before = heap_in_use();
    for _ in 0..20 {
        cycle();
    }
    let after = heap_in_use();
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));
    // One instance holds several MB (route table, queues); a leaked instance, endpoint or
    // request would show up as growth far above allocator noise.
    assert!(
        after < before + 256 * 1024,
        "heap grew from {before} to {after} over 20 open/close cycles"
    );
}
