//! Regression tests for the gaps of the issue-4 acceptance review (docs/review-issue-4.md),
//! adopted from the review's probes. Each one failed before its fix.
mod common;
use acmrs::ffi::{cntr, ACM_ADDRESS_NAME};
use common::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// G2: the MADs held by the core never exceed the in-flight bound (8 × sa_depth), even when
/// the SA never answers and our deadline answers the clients first: the slot stays reserved
/// until the core hands the MAD back. Every client is still answered exactly once.
#[test]
fn outstanding_mads_stay_bounded_when_the_sa_never_answers() {
    let _s = serial();
    // sa_depth 1 → 8 in flight; budget = 100 ms × 1 + 1 s.
    let mut h = Host::open("log_level 0\ntimeout 100\nretries 0\n", &[]);
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    for i in 0..40u64 {
        h.resolve(0, &path_request(1 + i, 1 + i as u16, None, 0), 1);
    }
    let mut max = 0;
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(100));
        max = max.max(sa_pending());
    }
    // The deadline (1.1 s) answered the first 8 clients although their MADs are still held.
    let early = response_count();
    // Now the core gives the MADs back (umad timeouts), one batch at a time.
    let t0 = Instant::now();
    while response_count() < 40 && t0.elapsed() < Duration::from_secs(20) {
        max = max.max(sa_pending());
        sa_drain_timeouts();
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("max MADs held by the core at once: {max}; answered at the deadline: {early}");
    let tids: Vec<u64> = (1..=40).collect();
    let once = check_exactly_once(&tids);
    h.close();
    sa_drain_timeouts();
    assert!(max <= 8, "engine handed {max} MADs to the core (bound 8)");
    assert_eq!(
        early, 8,
        "the deadline answers the clients of the held MADs"
    );
    once.unwrap();
}

/// G1: with the default options a client whose answer blocks (stuck socket) does not stall
/// the core's SA thread: the completion handler only copies, frees and hands over.
#[test]
fn a_stuck_client_does_not_stall_the_sa_thread_by_default() {
    let _s = serial();
    let mut h = Host::open("log_level 0\n", &[]);
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    BLOCK_ID.store(5, Ordering::SeqCst);
    h.resolve(0, &path_request(500, 5, None, 0), 5);
    let t0 = Instant::now();
    while sa_pending() < 1 && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Play the core's SA thread: deliver the reply.
    let sa = std::thread::spawn(|| sa_complete_next(SaAction::Answer));
    std::thread::sleep(Duration::from_millis(300));
    let sa_thread_free = sa.is_finished();
    BLOCK_ID.store(u64::MAX, Ordering::SeqCst);
    let _ = sa.join();
    let answered = wait_responses(1, Duration::from_secs(2));
    h.close();
    sa_drain_timeouts();
    assert!(
        sa_thread_free,
        "the SA completion handler blocked on a client's answer"
    );
    assert!(answered);
}

/// G1, opt-in: `acmrs_sa_direct 1` answers the starter on the SA thread (documented
/// trade-off: a stuck client does stall it). This proves the option still does what it says.
#[test]
fn sa_direct_opt_in_answers_on_the_sa_thread() {
    let _s = serial();
    let mut h = Host::open("log_level 0\nacmrs_sa_direct 1\n", &[]);
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    h.resolve(0, &path_request(501, 5, None, 0), 5);
    let t0 = Instant::now();
    while sa_pending() < 1 && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let sa = std::thread::spawn(|| {
        sa_complete_next(SaAction::Answer);
        std::thread::current().id()
    });
    let sa_id = sa.join().unwrap();
    assert!(wait_responses(1, Duration::from_secs(2)));
    let r = &find(501)[0];
    h.close();
    sa_drain_timeouts();
    assert_eq!(r.msg.hdr.status, 0);
    assert_eq!(r.thread, sa_id, "answered on the SA thread");
}

/// G4: a panic in the worker's engine is caught: logged at level 0, everything the worker held
/// answered (EINVAL) exactly once, and the worker keeps serving. Uses the debug-build test hook
/// `ACMRS_TEST_PANIC_DLID` (read when the instance starts).
#[test]
fn a_worker_panic_answers_everything_and_the_worker_keeps_running() {
    if !cfg!(debug_assertions) {
        eprintln!("skipped: the panic hook exists only in debug builds");
        return;
    }
    let _s = serial();
    // Tests of this binary run one at a time (serial()): nothing reads it concurrently.
    std::env::set_var("ACMRS_TEST_PANIC_DLID", "99");
    let mut h = Host::open("log_level 0\n", &[]);
    std::env::remove_var("ACMRS_TEST_PANIC_DLID");
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    // Three misses whose MADs the core holds, then the request that panics the engine.
    for (tid, dlid) in [(1u64, 5u16), (2, 6), (3, 6)] {
        h.resolve(0, &path_request(tid, dlid, None, 0), 1);
    }
    let t0 = Instant::now();
    while sa_pending() < 2 && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    h.resolve(0, &path_request(4, 99, None, 0), 1);
    assert!(
        wait_responses(4, Duration::from_secs(3)),
        "only {} of 4 answered after the panic",
        response_count()
    );
    for t in 1..=4 {
        assert_eq!(
            find(t)[0].msg.hdr.status,
            acmrs::ffi::ACM_STATUS_EINVAL,
            "tid {t}"
        );
    }
    assert!(log_contains("worker panicked"), "the panic is logged");
    // The core hands the held MADs back (late replies for answered requests: ignored).
    while sa_complete_next(SaAction::Answer) {}
    // The worker still serves misses.
    h.resolve(0, &path_request(5, 8, None, 0), 1);
    let t0 = Instant::now();
    while find(5).is_empty() && t0.elapsed() < Duration::from_secs(3) {
        sa_complete_next(SaAction::Answer);
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(50));
    let once = check_exactly_once(&[1, 2, 3, 4, 5]);
    let status5 = find(5).first().map(|r| r.msg.hdr.status);
    h.close();
    sa_drain_timeouts();
    once.unwrap();
    assert_eq!(status5, Some(0), "a miss after the panic is resolved");
}

/// G6: a PATH request whose `src_out` names a real address entry gets it echoed after the
/// path (the invalid cases are in host.rs `malformed_requests_get_einval`).
#[test]
fn path_request_src_out_echoes_an_address_entry() {
    let _s = serial();
    let mut h = Host::open("log_level 0\n", &[]);
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let mut m = path_request(77, 5, None, 0);
    m.hdr.length = 160;
    m.resolve_data[1].type_ = ACM_ADDRESS_NAME;
    m.resolve_data[1].info.bytes[..5].copy_from_slice(b"node7");
    m.hdr.data = [1, 1, 0];
    h.resolve(0, &m, 1);
    let t0 = Instant::now();
    while find(77).is_empty() && t0.elapsed() < Duration::from_secs(3) {
        sa_complete_next(SaAction::Answer);
        std::thread::sleep(Duration::from_millis(2));
    }
    let r = find(77).pop().expect("answered");
    h.close();
    sa_drain_timeouts();
    assert_eq!(r.msg.hdr.status, 0);
    assert_eq!(r.msg.hdr.length, 160);
    assert_eq!(r.msg.resolve_data[0].type_, acmrs::ffi::ACM_EP_INFO_PATH);
    assert_eq!(r.msg.resolve_data[1].type_, ACM_ADDRESS_NAME);
    assert_eq!(&r.msg.resolve_data[1].info.bytes[..5], b"node7");
}

/// G3: a flood of malformed requests is answered and counted one by one, but logged at most
/// a few lines per second, with a "suppressed" summary afterwards.
#[test]
fn error_logging_is_rate_limited_but_every_error_counted() {
    let _s = serial();
    let mut h = Host::open("log_level 0\n", &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let n = 10_000u64;
    let t0 = Instant::now();
    for tid in 1..=n {
        let mut m = path_request(tid, 5, None, 0);
        m.hdr.length = 87;
        h.resolve(ep, &m, 1);
    }
    let secs = t0.elapsed().as_secs() + 2;
    let lines = log_count("malformed resolve request");
    assert_eq!(response_count(), n as usize);
    assert_eq!(h.perf(ep)[cntr::ERROR], n, "every error counted");
    assert!(lines >= 1, "the first one is logged");
    assert!(
        lines as u64 <= 5 * secs,
        "{lines} log lines for {n} malformed requests in {secs} s"
    );
    // A later second: the next error reports how many were suppressed.
    std::thread::sleep(Duration::from_millis(1300));
    let mut m = path_request(n + 1, 5, None, 0);
    m.hdr.length = 87;
    h.resolve(ep, &m, 1);
    let summary = log_contains("similar messages suppressed");
    h.close();
    assert!(summary, "a suppressed-lines summary is logged");
}

/// G5: `ib_acme -P` "Addr Cache Count" means what it means with ibacmp: counted when a name's
/// address is known but its route is not (ADDR_RESOLVED); a name whose route is cached is a
/// route cache hit only.
#[test]
fn repeated_name_hits_count_like_ibacmp() {
    let _s = serial();
    let hosts = "node9 fe80::1009\n";
    let mut h = Host::open(
        "log_level 0\naddr_preload acm_hosts\naddr_data_file $DIR/hosts.data\n",
        &[("hosts.data", hosts)],
    );
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let req = |t| {
        dest_request(
            t,
            (ACM_ADDRESS_NAME, b"node7"),
            (ACM_ADDRESS_NAME, b"node9"),
            0,
        )
    };
    let p0 = h.perf(0);
    h.resolve(0, &req(1), 4);
    let t0 = Instant::now();
    while find(1).is_empty() && t0.elapsed() < Duration::from_secs(3) {
        sa_complete_next(SaAction::Answer);
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    let before = h.perf(0);
    for t in 2..5 {
        h.resolve(0, &req(t), 4);
    }
    let after = h.perf(0);
    h.close();
    sa_drain_timeouts();
    assert_eq!(
        before[cntr::ADDR_CACHE] - p0[cntr::ADDR_CACHE],
        1,
        "first use: address known, route not"
    );
    assert_eq!(before[cntr::ROUTE_QUERY] - p0[cntr::ROUTE_QUERY], 1);
    assert_eq!(
        after[cntr::ROUTE_CACHE] - before[cntr::ROUTE_CACHE],
        3,
        "route cache hits"
    );
    assert_eq!(
        after[cntr::ADDR_CACHE],
        before[cntr::ADDR_CACHE],
        "no ADDR_CACHE for READY hits"
    );
}

/// G7: `acmrs_sa_timeout_ms` is the client's deadline (the core's own budget here is
/// 2 s × 3 + 1 s); the MAD stays with the core and its slot reserved until it comes back.
#[test]
fn acmrs_sa_timeout_ms_bounds_the_clients_wait() {
    let _s = serial();
    let mut h = Host::open(
        "log_level 0\ntimeout 2000\nretries 2\nacmrs_sa_timeout_ms 300\n",
        &[],
    );
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t0 = Instant::now();
    h.resolve(0, &path_request(1, 5, None, 0), 1);
    let answered = wait_responses(1, Duration::from_secs(3));
    let waited = t0.elapsed();
    let held = sa_pending();
    let status = find(1).first().map(|r| r.msg.hdr.status);
    h.close();
    sa_drain_timeouts();
    assert!(answered, "not answered within 3 s");
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(1500),
        "answered after {waited:?}"
    );
    assert_eq!(status, Some(acmrs::ffi::ACM_STATUS_ETIMEDOUT));
    assert_eq!(held, 1, "the MAD is still the core's");
}

/// G7: `acmrs_addr_capacity` bounds the addresses loaded from the hosts preload.
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
    let req = |t, name: &'static [u8]| {
        dest_request(t, (ACM_ADDRESS_NAME, b"node7"), (ACM_ADDRESS_NAME, name), 0)
    };
    h.resolve(0, &req(1, b"node1"), 4);
    h.resolve(0, &req(3, b"node3"), 4);
    let t0 = Instant::now();
    while find(1).is_empty() && t0.elapsed() < Duration::from_secs(3) {
        sa_complete_next(SaAction::Answer);
        std::thread::sleep(Duration::from_millis(2));
    }
    let s1 = find(1).first().map(|r| r.msg.hdr.status);
    let s3 = find(3).first().map(|r| r.msg.hdr.status);
    let logged = log_contains("1 addresses beyond acmrs_addr_capacity 2 ignored");
    h.close();
    sa_drain_timeouts();
    assert_eq!(s1, Some(0), "within the capacity");
    assert_eq!(
        s3,
        Some(acmrs::ffi::ACM_STATUS_ENODATA),
        "beyond the capacity"
    );
    assert!(logged);
}

/// G2 corner: the MADs of a closed endpoint may never come back (the core stops reading a
/// port that went down), so closing frees their slots: another endpoint still gets its
/// queries sent and answered, and the late replies are ignored.
#[test]
fn closing_an_endpoint_frees_the_slots_of_its_held_mads() {
    let _s = serial();
    let mut h = Host::open("log_level 0\n", &[]);
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    for i in 0..8u64 {
        h.resolve(0, &path_request(1 + i, 10 + i as u16, None, 0), 1);
    }
    let t0 = Instant::now();
    while sa_pending() < 8 && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    h.close_ep(0);
    assert!(
        wait_responses(8, Duration::from_secs(2)),
        "waiters answered at close"
    );
    h.open_ep(0x8001, (ACM_ADDRESS_NAME, b"node8"));
    h.resolve(0, &path_request(100, 5, None, 0), 1);
    let t0 = Instant::now();
    while sa_pending() < 9 && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let sent = sa_pending();
    // The core answers everything, the closed endpoint's MADs first.
    let t0 = Instant::now();
    while find(100).is_empty() && t0.elapsed() < Duration::from_secs(3) {
        sa_complete_next(SaAction::Answer);
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(50));
    let tids: Vec<u64> = (1..=8).chain([100]).collect();
    let once = check_exactly_once(&tids);
    let status = find(100).first().map(|r| r.msg.hdr.status);
    h.close();
    sa_drain_timeouts();
    assert_eq!(sent, 9, "the new endpoint's query was sent");
    once.unwrap();
    assert_eq!(status, Some(0));
}
