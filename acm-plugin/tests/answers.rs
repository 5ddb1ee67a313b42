//! Every request gets exactly one answer with its tid, the right status and layout, from the
//! right thread (hits inline on the core's thread, everything else from the dataplane); bad
//! input is rejected, counted and logged (rate-limited).
//!
//! Run with `ACMRS_TEST_LOG=1` to see the provider's log lines.

mod common;

use acm_core_nostd::wire::client::Status;
use acm_testkit::core::*;
use acm_testkit::host::*;
use acm_testkit::request::*;
use acmrs::ffi::*;
use common::OPTS;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// With the loop free (the default `adaptive` mode, nothing else to do), a miss costs no
/// thread hand-off on its way out: a round of the loop runs inside `resolve()` and the SA query
/// leaves before the call returns, as stock's does; the reply is handed to the loop, which
/// answers.
#[test]
fn a_miss_sends_its_sa_query_from_inside_resolve() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let (sends, inside) = (
        SENDS.load(Ordering::SeqCst),
        SENDS_IN_CLIENT_CALL.load(Ordering::SeqCst),
    );
    const MISSES: usize = 20;
    for i in 0..MISSES {
        // The loop's thread polls on for 50 µs after the last answer before it parks: let it.
        std::thread::sleep(Duration::from_millis(1));
        let t = h.tid();
        h.resolve(ep, &path_request(t, 20 + i as u16, None, 0), 3);
        sa_one(SaAction::Answer, i + 1);
        let r = &find(t)[0];
        assert_eq!(
            (r.status(), dlid_of(&r.msg)),
            (Status::Success, 20 + i as u16)
        );
        assert_ne!(r.inside, Inside::SaHandler, "the handler only hands over");
    }
    assert_eq!(SENDS.load(Ordering::SeqCst) - sends, MISSES);
    // The loop's own thread holds it only while it runs a round (a timer at most every
    // 100 ms here, a few µs each): a miss that finds it busy is handed over instead.
    let from_resolve = SENDS_IN_CLIENT_CALL.load(Ordering::SeqCst) - inside;
    assert!(
        from_resolve >= MISSES - 5,
        "{from_resolve} of {MISSES} SA queries sent from inside resolve()"
    );
    h.close();
}

#[test]
fn path_by_dlid_and_dgid_miss_then_hit() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    // Miss by DLID: goes to the SA; the SA holds the MAD, so nothing can answer it yet.
    let t1 = h.tid();
    assert_eq!(h.resolve(ep, &path_request(t1, 5, None, 0), 3), 0);
    assert!(wait_until(|| sa_pending() == 1));
    assert_eq!(
        response_count(),
        0,
        "a miss is not answered before the SA's reply"
    );
    assert!(sa_complete_next(SaAction::Answer));
    assert!(wait_responses(1, W));
    let r = &find(t1)[0];
    assert_eq!(r.id, 3);
    assert_eq!(r.status(), Status::Success);
    assert_eq!(r.msg.hdr.length, 88);
    assert_eq!(r.msg.resolve_data[0].flags, 0x2b);
    assert_eq!(r.msg.resolve_data[0].type_, ACM_EP_INFO_PATH);
    assert_eq!(dlid_of(&r.msg), 5);
    // The test thread played the core's SA thread: the completion handler only hands the
    // reply over; the dataplane answers.
    assert!(r.from_dataplane(), "answered by {:?}", r.thread_name);
    // The dataplane writes the cache before it answers: the next request is a hit, answered
    // inline (on this thread, inside resolve()), with no SA traffic.
    let sends = SENDS.load(Ordering::SeqCst);
    let t2 = h.tid();
    h.resolve(ep, &path_request(t2, 5, None, 0), 4);
    let r2 = find(t2);
    assert_eq!(r2.len(), 1, "a hit is answered inside resolve()");
    assert_eq!((r2[0].status(), dlid_of(&r2[0].msg)), (Status::Success, 5));
    assert_eq!(r2[0].thread, std::thread::current().id());
    assert_eq!(SENDS.load(Ordering::SeqCst), sends);
    // By DGID.
    let t3 = h.tid();
    h.resolve(ep, &path_request(t3, 0, Some(gid_of(0x1000 + 9)), 0), 5);
    sa_one(SaAction::Answer, 3);
    assert_eq!(dlid_of(&find(t3)[0].msg), 9);
    // Counters: per endpoint and the core's global ones.
    let perf = h.perf(ep);
    assert_eq!(perf[cntr::RESOLVE], 3);
    assert_eq!(perf[cntr::ROUTE_QUERY], 2);
    assert_eq!(perf[cntr::ROUTE_CACHE], 1);
    assert_eq!(perf[cntr::ERROR], 0);
    assert_eq!(GLOBAL_COUNTERS[cntr::ROUTE_QUERY].load(Ordering::SeqCst), 2);
    assert_eq!(GLOBAL_COUNTERS[cntr::ROUTE_CACHE].load(Ordering::SeqCst), 1);
    assert_eq!(
        BAD_TID.load(Ordering::SeqCst),
        0,
        "TID upper half must be zero"
    );
    h.close();
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));
}

#[test]
fn sa_failures_are_answered_once_with_the_right_status() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let before = ALLOCS.load(Ordering::SeqCst) - FREES.load(Ordering::SeqCst);
    // No record (DLID outside the fake fabric) → SA class status 3 = ENODATA.
    let t_nr = h.tid();
    h.resolve(ep, &path_request(t_nr, 0xbfff + 1, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    assert_eq!(find(t_nr)[0].status(), Status::Enodata);
    assert!(find(t_nr)[0].from_dataplane());
    // Remembered (acmrs_negative_ttl_ms, default 5 s): answered inline, the SA is not asked.
    let t_nr2 = h.tid();
    h.resolve(ep, &path_request(t_nr2, 0xbfff + 1, None, 0), 1);
    assert_eq!(find(t_nr2)[0].status(), Status::Enodata);
    assert_eq!(sa_pending(), 0);
    // Timeout → retried after a backoff (acmrs_sa_retries 3), then ETIMEDOUT.
    let t_to = h.tid();
    h.resolve(ep, &path_request(t_to, 11, None, 0), 1);
    for _ in 0..3 {
        assert!(wait_until(|| sa_pending() == 1));
        sa_complete_next(SaAction::Timeout);
        assert!(find(t_to).is_empty(), "a lost query goes again");
    }
    sa_one(SaAction::Timeout, 3);
    assert_eq!(find(t_to)[0].status(), Status::Etimedout);
    // Invalid field → EINVAL.
    let t_iv = h.tid();
    h.resolve(ep, &path_request(t_iv, 12, None, 0), 1);
    sa_one(SaAction::InvalidField, 4);
    assert_eq!(find(t_iv)[0].status(), Status::Einval);
    // BUSY twice, then success: retried with a new TID, one answer.
    let t_b = h.tid();
    h.resolve(ep, &path_request(t_b, 13, None, 0), 1);
    for _ in 0..2 {
        assert!(wait_until(|| sa_pending() == 1));
        sa_complete_next(SaAction::Busy);
    }
    sa_one(SaAction::Answer, 5);
    assert_eq!(find(t_b)[0].status(), Status::Success);
    assert_eq!(dlid_of(&find(t_b)[0].msg), 13);
    // BUSY forever → ETIMEDOUT after acmrs_sa_retries (3).
    let t_bb = h.tid();
    h.resolve(ep, &path_request(t_bb, 14, None, 0), 1);
    for _ in 0..4 {
        assert!(wait_until(|| sa_pending() == 1));
        sa_complete_next(SaAction::Busy);
    }
    assert!(wait_responses(6, W));
    assert_eq!(find(t_bb)[0].status(), Status::Etimedout);
    // Never answered → ETIMEDOUT at the deadline (the core's budget: 100 ms × 1 + 1 s).
    let t_never = h.tid();
    h.resolve(ep, &path_request(t_never, 15, None, 0), 1);
    assert!(wait_until(|| sa_pending() == 1));
    assert!(wait_responses(7, W));
    assert_eq!(find(t_never)[0].status(), Status::Etimedout);
    // Its late reply is ignored (and freed by the handler).
    assert!(sa_complete_next(SaAction::Answer));
    // Send failure → answered at once.
    SEND_FAIL.store(true, Ordering::SeqCst);
    let t_sf = h.tid();
    h.resolve(ep, &path_request(t_sf, 16, None, 0), 1);
    assert!(wait_responses(8, W));
    SEND_FAIL.store(false, Ordering::SeqCst);
    assert_ne!(find(t_sf)[0].status(), Status::Success);
    // Nothing else comes: every request the dataplane holds was taken in.
    h.barrier();
    check_exactly_once(&[t_nr, t_nr2, t_to, t_iv, t_b, t_bb, t_never, t_sf]).unwrap();
    // Every failure but the remembered one came from a round of the loop, never from the SA
    // completion handler (it only hands replies over): those after an SA reply from the
    // loop's thread, the send failure from the loop's thread or from a round on ours inside
    // resolve().
    for r in responses() {
        assert_ne!(r.inside, Inside::SaHandler, "tid {:#x}", r.msg.hdr.tid);
        if ![t_nr2, t_sf].contains(&r.msg.hdr.tid) {
            assert!(
                r.from_dataplane(),
                "tid {:#x} from {:?}",
                r.msg.hdr.tid,
                r.thread_name
            );
        }
    }
    let perf = h.perf(ep);
    assert_eq!(perf[cntr::NODATA], 2);
    assert_eq!(perf[cntr::ERROR], 5);
    h.close();
    assert_eq!(
        ALLOCS.load(Ordering::SeqCst) - FREES.load(Ordering::SeqCst),
        before
    );
}

#[test]
fn coalesces_and_answers_kernel_style_requests() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    // 20 kernel requests (id 0) for 2 destinations, distinct tids, all in flight together.
    let sends = SENDS.load(Ordering::SeqCst);
    let mut tids = Vec::new();
    for i in 0..20 {
        let t = 0x7f00_0000_0000 + i;
        tids.push(t);
        h.resolve(ep, &path_request(t, 20 + (i % 2) as u16, None, 0), 0);
    }
    // All 20 taken in (the SA holds the two queries, so none can be answered yet).
    h.barrier();
    assert_eq!(sa_pending(), 2, "coalesced on one SA query per destination");
    assert_eq!(SENDS.load(Ordering::SeqCst) - sends, 2);
    sa_complete_next(SaAction::Answer);
    sa_complete_next(SaAction::Answer);
    assert!(wait_responses(20, W));
    check_exactly_once(&tids).unwrap();
    // The waiters of one destination are answered in arrival order.
    for d in 0..2 {
        let order: Vec<u64> = responses()
            .iter()
            .map(|r| r.msg.hdr.tid)
            .filter(|t| t % 2 == d)
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "FIFO: {order:x?}");
    }
    for r in responses() {
        assert_eq!(r.id, 0);
        let i = r.msg.hdr.tid - 0x7f00_0000_0000;
        assert_eq!(dlid_of(&r.msg), 20 + (i % 2) as u16);
    }
    h.close();
}

#[test]
fn malformed_requests_get_einval() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let mut bad = Vec::new();
    let mut m = path_request(h.tid(), 5, None, 0);
    m.hdr.length = 87;
    bad.push(m);
    let mut m = path_request(h.tid(), 5, None, 0);
    m.hdr.length = 16;
    bad.push(m);
    let mut m = path_request(h.tid(), 5, None, 0);
    m.hdr.length = 600;
    bad.push(m);
    let mut m = path_request(h.tid(), 5, None, 0);
    m.hdr.data = [1, 5, 0]; // src_out with src_index beyond the entries
    bad.push(m);
    let mut m = path_request(h.tid(), 0, None, 0); // no DLID, no DGID
    m.hdr.length = 88;
    bad.push(m);
    let mut m = path_request(h.tid(), 5, None, 0);
    m.hdr.opcode = 7;
    bad.push(m);
    let mut m = dest_request(h.tid(), (ACM_ADDRESS_NAME, b"node7"), (0x99, b"x"), 0);
    bad.push(m);
    m = dest_request(
        h.tid(),
        (ACM_ADDRESS_NAME, b"node7"),
        (ACM_ADDRESS_NAME, b"x"),
        0,
    );
    m.hdr.data = [0, 0, 4]; // dst_index out of range
    bad.push(m);
    // src_out on a PATH request must name an address entry.
    let mut m = path_request(h.tid(), 5, None, 0);
    m.hdr.data = [1, 0, 0]; // the PATH entry itself
    bad.push(m);
    let mut m = path_request(h.tid(), 5, None, 0);
    m.hdr.length = 160;
    m.resolve_data[1].type_ = 0x99; // an unknown type at src_index
    m.hdr.data = [1, 1, 0];
    bad.push(m);
    let mut m = path_request(h.tid(), 5, None, 0);
    m.hdr.length = 100; // in range, not a whole number of entries
    bad.push(m);
    let mut tids = Vec::new();
    for m in &bad {
        tids.push(m.hdr.tid);
        h.resolve(ep, m, 2);
    }
    // All rejected inline, inside resolve().
    check_exactly_once(&tids).unwrap();
    for r in responses() {
        assert_eq!(r.status(), Status::Einval, "tid {:#x}", r.msg.hdr.tid);
        assert_eq!(r.msg.hdr.length, 16);
        assert_eq!(r.thread, std::thread::current().id());
    }
    assert_eq!(h.perf(ep)[cntr::ERROR], bad.len() as u64);
    assert!(log_contains("malformed resolve request rejected (EINVAL)"));
    // A malformed SA query: query() hands every query to the loop, which rejects it.
    let mut q = path_request(h.tid(), 5, None, ACM_FLAGS_QUERY_SA);
    q.hdr.length = 160;
    h.query(ep, &q, 2);
    assert!(wait_until(|| find(q.hdr.tid).len() == 1));
    let r = &find(q.hdr.tid)[0];
    assert!(r.query);
    assert!(r.from_dataplane() || r.inside == Inside::ClientCall);
    assert_eq!(r.status(), Status::Einval);
    assert_eq!(sa_pending(), 0, "nothing sent for it");
    assert_eq!(h.perf(ep)[cntr::ERROR], bad.len() as u64 + 1);
    assert!(wait_until(|| log_contains(
        "malformed client request rejected (EINVAL)"
    )));
    h.barrier();
    assert_eq!(find(q.hdr.tid).len(), 1, "exactly once");
    h.close();
}

#[test]
fn query_sa_passthrough() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t = h.tid();
    let q = path_request(t, 8, None, ACM_FLAGS_QUERY_SA);
    h.query(ep, &q, 9);
    sa_one(SaAction::Answer, 1);
    let r = &find(t)[0];
    assert!(r.query);
    assert!(r.from_dataplane());
    assert_eq!(r.id, 9);
    assert_eq!(r.msg.hdr.opcode, ACM_OP_RESOLVE | ACM_OP_ACK);
    assert_eq!(r.status(), Status::Success);
    assert_eq!(r.msg.hdr.length, 88);
    assert_eq!(dlid_of(&r.msg), 8);
    assert_eq!(
        r.msg.resolve_data[0].flags & ACM_FLAGS_QUERY_SA,
        ACM_FLAGS_QUERY_SA
    );
    // Not cached: a second query goes to the SA again, and times out cleanly (after the
    // retries of a lost query, acmrs_sa_retries 3).
    let t2 = h.tid();
    h.query(ep, &path_request(t2, 8, None, ACM_FLAGS_QUERY_SA), 9);
    for _ in 0..3 {
        assert!(wait_until(|| sa_pending() == 1));
        sa_complete_next(SaAction::Timeout);
    }
    sa_one(SaAction::Timeout, 2);
    let r2 = &find(t2)[0];
    assert_eq!(r2.status(), Status::Etimedout);
    assert_eq!(
        dlid_of(&r2.msg),
        8,
        "no SA answer: the request's record stays"
    );
    assert_eq!(
        h.perf(ep)[cntr::ROUTE_QUERY],
        5,
        "1 + 4 tries of the second"
    );
    assert_eq!(
        h.perf(ep)[cntr::ERROR],
        1,
        "a failed query counts as an error"
    );
    // An SA answer with a failure status: passed through with the SA's (empty) record.
    let t3 = h.tid();
    h.query(ep, &path_request(t3, 0xc001, None, ACM_FLAGS_QUERY_SA), 9);
    sa_one(SaAction::Answer, 3);
    let r3 = &find(t3)[0];
    assert_eq!(r3.status(), Status::Enodata);
    assert_eq!(r3.msg.hdr.opcode, ACM_OP_RESOLVE | ACM_OP_ACK);
    assert_eq!(
        path_of(&r3.msg),
        [0u8; 64],
        "the SA's record, as ibacmp returns it"
    );
    // A malformed query: EINVAL from the dataplane, counted.
    let t4 = h.tid();
    let mut bad = path_request(t4, 8, None, ACM_FLAGS_QUERY_SA);
    bad.hdr.length = 16;
    h.query(ep, &bad, 9);
    assert!(wait_responses(4, W));
    assert_eq!(find(t4)[0].status(), Status::Einval);
    let perf = h.perf(ep);
    assert_eq!((perf[cntr::ERROR], perf[cntr::NODATA]), (3, 0));
    h.close();
}

/// Every `query()` answer is the request with `ACM_OP_ACK` set (ibacmp's `acmp_query` sets it
/// on its error paths too), also when the query is rejected.
#[test]
fn a_rejected_query_is_answered_with_ack() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    for len in [160u16, 16] {
        let mut q = path_request(h.tid(), 5, None, ACM_FLAGS_QUERY_SA);
        q.hdr.length = len;
        h.query(ep, &q, 2);
        assert!(wait_until(|| find(q.hdr.tid).len() == 1));
        let r = &find(q.hdr.tid)[0];
        assert_eq!((r.query, r.status()), (true, Status::Einval));
        assert_eq!(
            r.msg.hdr.opcode,
            ACM_OP_RESOLVE | ACM_OP_ACK,
            "length {len}: the query answer lacks ACM_OP_ACK"
        );
    }
    h.close();
}

/// A PATH request whose `src_out` names a real address entry gets it echoed after the path
/// (the invalid cases are in `malformed_requests_get_einval`).
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
    sa_one(SaAction::Answer, 1);
    let r = find(77).pop().expect("answered");
    h.close();
    assert_eq!(r.msg.hdr.status, 0);
    assert_eq!(r.msg.hdr.length, 160);
    assert_eq!(r.msg.resolve_data[0].type_, ACM_EP_INFO_PATH);
    assert_eq!(r.msg.resolve_data[1].type_, ACM_ADDRESS_NAME);
    assert_eq!(&r.msg.resolve_data[1].info.bytes[..5], b"node7");
}

/// A flood of malformed requests is answered and counted one by one, but logged at most a few
/// lines per second, with a "suppressed" summary afterwards.
#[test]
fn error_logging_is_rate_limited_but_every_error_counted() {
    let _s = serial();
    let mut h = Host::open("log_level 0\n", &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let n = 10_000u64;
    let t0 = Instant::now();
    let bad = |tid| {
        let mut m = path_request(tid, 5, None, 0);
        m.hdr.length = 87;
        m
    };
    for tid in 1..=n {
        h.resolve(ep, &bad(tid), 1);
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
    // In a later second (virtual time: the limiter reads the dataplane's coarse clock) the next
    // error reports how many were suppressed.
    advance_clock(Duration::from_secs(1));
    h.resolve(ep, &bad(n + 1), 1);
    assert!(
        log_contains("similar messages suppressed"),
        "a suppressed-lines summary is logged"
    );
    h.close();
}

/// `acmrs_sa_timeout_ms` is the client's deadline (the core's own budget here is
/// 10 min × 3 + 1 s); the MAD stays with the core and its slot reserved until it comes back.
/// In virtual time, in minutes, so the real time a loaded machine adds cannot cross a step.
#[test]
fn acmrs_sa_timeout_ms_bounds_the_clients_wait() {
    let _s = serial();
    let min = Duration::from_secs(60);
    let mut h = Host::open(
        "log_level 0\ntimeout 600000\nretries 2\nacmrs_sa_timeout_ms 300000\n",
        &[],
    );
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    h.resolve(0, &path_request(1, 5, None, 0), 1);
    assert!(wait_until(|| sa_pending() == 1), "the query went out");
    // Not before the 5 min deadline.
    advance_clock(4 * min);
    h.barrier();
    assert!(find(1).is_empty(), "answered before the deadline");
    // Well before the 30 min the core's budget would give.
    advance_clock(12 * min);
    let answered = wait_responses(1, W);
    let held = sa_pending();
    let status = find(1).first().map(|r| r.status());
    h.close();
    assert!(answered, "not answered once the deadline had passed");
    assert_eq!(status, Some(Status::Etimedout));
    assert_eq!(held, 1, "the MAD is still the core's");
}

/// A client whose answer blocks (a stuck socket) does not stall the core's SA thread: the
/// completion handler only copies, frees and hands over.
#[test]
fn a_stuck_client_does_not_stall_the_sa_thread() {
    let _s = serial();
    let mut h = Host::open("log_level 0\n", &[]);
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    BLOCK_ID.store(5, Ordering::SeqCst);
    h.resolve(0, &path_request(500, 5, None, 0), 5);
    assert!(wait_until(|| sa_pending() == 1));
    // Play the core's SA thread: deliver the reply while the answer to client 5 blocks.
    let sa = std::thread::spawn(|| sa_complete_next(SaAction::Answer));
    let sa_thread_free = wait_until(|| sa.is_finished());
    // The dataplane is the one stuck in the answer.
    let stuck_in_answer = wait_until(|| response_count() == 1);
    BLOCK_ID.store(u64::MAX, Ordering::SeqCst);
    let _ = sa.join();
    let r = find(500);
    h.close();
    assert!(
        sa_thread_free,
        "the SA completion handler blocked on a client's answer"
    );
    assert!(stuck_in_answer);
    assert!(r[0].from_dataplane());
}

/// A dataplane thread stuck between rounds (in its park, not holding the loop) leaves no
/// client waiting either: a miss runs the loop's round inside `resolve()` and its SA query
/// leaves at once; the SA reply, handed to the stuck thread, is taken by a round the watchdog
/// runs (it finds no round run since its last look), and the client has its path long before
/// the thread runs again.
#[test]
fn a_dataplane_stuck_between_rounds_still_answers_through_the_watchdogs_round() {
    let _s = serial();
    let mut h = Host::open(&format!("{OPTS}acmrs_stall_ms 200\n"), &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    const STUCK: Duration = Duration::from_secs(3);
    stall_dataplane(STUCK, false);
    let t0 = Instant::now();
    let inside = SENDS_IN_CLIENT_CALL.load(Ordering::SeqCst);
    let t1 = h.tid();
    h.resolve(ep, &path_request(t1, 5, None, 0), 1);
    assert_eq!(
        SENDS_IN_CLIENT_CALL.load(Ordering::SeqCst),
        inside + 1,
        "the query left inside resolve()"
    );
    assert!(sa_complete_next(SaAction::Answer));
    assert!(wait_until(|| !find(t1).is_empty()), "never answered");
    let waited = t0.elapsed();
    let r = &find(t1)[0];
    assert_eq!((r.status(), dlid_of(&r.msg)), (Status::Success, 5));
    assert_eq!(r.thread_name.as_deref(), Some("acmrs-watchdog"));
    assert!(
        waited < STUCK - Duration::from_millis(500),
        "answered {waited:?} after the call: by the stuck thread, not the watchdog's round"
    );
    h.close();
}

/// A dataplane thread that runs no round (stuck in the kernel or a driver) leaves no client
/// waiting: once a request has waited `acmrs_stall_ms` the watchdog thread answers it
/// ETIMEDOUT (counted an error, logged), new requests are answered ETIMEDOUT at once inside
/// `resolve()`, and when the thread runs again it takes requests again. Each request is
/// answered exactly once.
#[test]
fn requests_to_a_stuck_dataplane_are_answered_etimedout_by_the_watchdog() {
    let _s = serial();
    let mut h = Host::open(&format!("{OPTS}acmrs_stall_ms 300\n"), &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let errors = h.perf(ep)[cntr::ERROR];
    // Stuck for 2 s from now.
    stall_dataplane(Duration::from_secs(2), true);
    let t0 = Instant::now();
    let t1 = h.tid();
    h.resolve(ep, &path_request(t1, 5, None, 0), 1);
    assert!(
        wait_until(|| !find(t1).is_empty()),
        "the stuck request is answered"
    );
    let waited = t0.elapsed();
    let r = &find(t1)[0];
    assert_eq!(r.status(), Status::Etimedout);
    assert_eq!(r.thread_name.as_deref(), Some("acmrs-watchdog"));
    assert!(
        waited < Duration::from_secs(2),
        "answered by the watchdog, not after the stall ({waited:?})"
    );
    assert!(log_contains("has not run for 300 ms"));
    // While it is stuck, a new miss is answered inside resolve().
    let t2 = h.tid();
    h.resolve(ep, &path_request(t2, 6, None, 0), 2);
    let r2 = find(t2);
    assert_eq!(r2.len(), 1, "answered at once");
    assert_eq!(r2[0].status(), Status::Etimedout);
    assert_eq!(r2[0].thread, std::thread::current().id());
    // The thread runs again: the next miss goes to the SA and is answered by the dataplane.
    assert!(
        wait_for(Duration::from_secs(20), || log_contains("runs again")),
        "the watchdog sees the dataplane run again"
    );
    let t3 = h.tid();
    h.resolve(ep, &path_request(t3, 7, None, 0), 3);
    sa_one(SaAction::Answer, 3);
    assert_eq!(find(t3)[0].status(), Status::Success);
    assert_eq!((find(t1).len(), find(t2).len()), (1, 1), "each once");
    assert_eq!(h.perf(ep)[cntr::ERROR], errors + 2);
    h.close();
}
