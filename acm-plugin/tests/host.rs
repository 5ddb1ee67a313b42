//! Drives the real `libacmrs.so` through its vtable from a fake ibacm core (`common`).
//!
//! Run with `ACMRS_TEST_LOG=1` to see the provider's log lines.

mod common;

use acmrs::ffi::*;
use common::*;
use std::sync::atomic::Ordering;
use std::time::Duration;

const OPTS: &str = "\
# test options
log_level 2
timeout 100
retries 0
acmrs_sa_retries 3
acmrs_sa_busy_backoff_ms 5
route_timeout -1
acmrs_sa_direct 1
acmrs_sa_inline 1
";

/// Appended by tests that check a hit *inline* right after a miss was answered: with the
/// default `acmrs_sa_direct 1` the SA thread answers the starter before the worker has written
/// the cache (a request in that window coalesces on the query in flight instead), so
/// "answered => cached" holds only when every answer goes through the worker.
const WORKER_ANSWERS: &str = "acmrs_sa_direct 0\n";

const W: Duration = Duration::from_secs(5);

fn status(r: &Response) -> u8 {
    r.msg.hdr.status
}

#[test]
fn provider_table_and_exports() {
    let lib = lib();
    assert_eq!(lib.prov.size, 120);
    assert_eq!(lib.prov.version, 1);
    // SAFETY: static NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(lib.prov.name) };
    assert_eq!(name.to_str().unwrap(), "acmrs");
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib.path)
        .output()
        .expect("nm (binutils) must be installed");
    let text = String::from_utf8_lossy(&out.stdout);
    let funcs: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" T ") || l.contains(" D ") || l.contains(" B "))
        .collect();
    assert_eq!(funcs.len(), 1, "exports: {funcs:?}");
    assert!(funcs[0].ends_with(" provider_query"));
    let undef = std::process::Command::new("nm")
        .args(["-D", "--undefined-only"])
        .arg(&lib.path)
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&undef.stdout).contains("acm_"),
        "core helpers must not be linked"
    );
}

#[test]
fn provider_query_refuses_host_without_core_helpers() {
    let dir = std::env::temp_dir().join(format!("acmrs-nohelpers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("h.c");
    std::fs::write(
        &src,
        "#include <dlfcn.h>\n#include <stdio.h>\n#include <stdint.h>\n\
         int main(int c, char **v) { void *h = dlopen(v[1], RTLD_LAZY); if (!h) return 2;\n\
         int (*q)(void **, uint32_t *) = dlsym(h, \"provider_query\"); if (!q) return 3;\n\
         void *p = 0; uint32_t ver = 0; int rc = q(&p, &ver); printf(\"rc=%d\\n\", rc);\n\
         return rc == 0 ? 4 : 0; }\n",
    )
    .unwrap();
    let exe = dir.join("h");
    let cc = std::process::Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .status()
        .expect("cc");
    assert!(cc.success());
    let out = std::process::Command::new(&exe)
        .arg(so_path())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.contains("acm_write"), "stderr: {stderr}");
    assert!(
        stderr.contains("must be loaded by ibacm"),
        "stderr: {stderr}"
    );
}

#[test]
fn path_by_dlid_and_dgid_miss_then_hit() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    // Miss by DLID: goes to the SA, answered from the worker.
    let t1 = h.tid();
    assert_eq!(h.resolve(ep, &path_request(t1, 5, None, 0), 3), 0);
    assert!(wait_until(|| sa_pending() == 1));
    assert_eq!(response_count(), 0, "a miss is not answered inline");
    assert!(sa_complete_next(SaAction::Answer));
    assert!(wait_responses(1, W));
    let r = &find(t1)[0];
    assert_eq!(r.id, 3);
    assert_eq!(status(r), 0);
    assert_eq!(r.msg.hdr.length, 88);
    assert_eq!(r.msg.resolve_data[0].flags, 0x2b);
    assert_eq!(r.msg.resolve_data[0].type_, ACM_EP_INFO_PATH);
    assert_eq!(dlid_of(r), 5);
    // acmrs_sa_direct 1 (default): the successful reply answered the client on the SA thread
    // (here the test thread plays the core's SA thread), inside the completion handler.
    assert_eq!(r.thread, std::thread::current().id());
    // Hit: answered inline, no SA traffic. Right after a direct answer the worker may not have
    // written the cache yet: such a request coalesces on the query in flight (no second SA
    // query) and is answered by the worker; once cached, it is answered inline.
    let sends = SENDS.load(Ordering::SeqCst);
    let mut inline = None;
    let mut id = 100;
    while inline.is_none() {
        id += 1;
        let t2 = h.tid();
        h.resolve(ep, &path_request(t2, 5, None, 0), id);
        if find(t2).len() == 1 {
            inline = Some(t2);
        } else {
            assert!(wait_until(|| find(t2).len() == 1), "answered by the worker");
            assert!(id < 1000, "the route was never cached");
        }
        let r2 = find(t2);
        assert_eq!(r2.len(), 1);
        assert_eq!(status(&r2[0]), 0);
        assert_eq!(dlid_of(&r2[0]), 5);
    }
    let r2 = find(inline.unwrap_or_default());
    assert_eq!(r2[0].thread, std::thread::current().id());
    assert_eq!(SENDS.load(Ordering::SeqCst), sends);
    let extra = id - 101; // requests answered by the worker before the route was cached
                          // By DGID.
    let t3 = h.tid();
    h.resolve(ep, &path_request(t3, 0, Some(gid_of(0x1000 + 9)), 0), 5);
    sa_one(SaAction::Answer, 3);
    assert_eq!(dlid_of(&find(t3)[0]), 9);
    // Counters: per EP and the core's global ones.
    let perf = h.perf(ep);
    assert_eq!(perf[cntr::RESOLVE], 3 + extra);
    assert_eq!(
        perf[cntr::ROUTE_QUERY],
        2,
        "no SA query for the requests in the window"
    );
    // Coalesced ones are no cache hits; one the worker found cached is.
    assert!((1..=1 + extra).contains(&perf[cntr::ROUTE_CACHE]));
    assert_eq!(perf[cntr::ERROR], 0);
    assert_eq!(GLOBAL_COUNTERS[cntr::ROUTE_QUERY].load(Ordering::SeqCst), 2);
    assert_eq!(
        GLOBAL_COUNTERS[cntr::ROUTE_CACHE].load(Ordering::SeqCst),
        perf[cntr::ROUTE_CACHE]
    );
    assert_eq!(
        BAD_TID.load(Ordering::SeqCst),
        0,
        "TID upper half must be zero"
    );
    h.close();
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));
}

/// Waits for the one SA query in flight, completes it with `action`, and waits until
/// `responses` answers were recorded in total.
fn sa_one(action: SaAction, responses: usize) {
    assert!(wait_until(|| sa_pending() == 1), "one SA query in flight");
    assert!(sa_complete_next(action));
    assert!(wait_responses(responses, W), "{responses} answers");
}

fn wait_until(f: impl Fn() -> bool) -> bool {
    let t0 = std::time::Instant::now();
    while !f() {
        if t0.elapsed() > W {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    true
}

#[test]
fn constraints_are_part_of_the_cache_key() {
    let _s = serial();
    let mut h = Host::open(&format!("{OPTS}{WORKER_ANSWERS}"), &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let plain = h.tid();
    h.resolve(ep, &path_request(plain, 6, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    // Same DLID, but SL 3 and a service ID: must not be answered with the plain path.
    let mut m = path_request(h.tid(), 6, None, 0);
    let t_sl = m.hdr.tid;
    m.resolve_data[0].info.bytes[52..54].copy_from_slice(&3u16.to_be_bytes());
    m.resolve_data[0].info.bytes[0..8].copy_from_slice(&0x1234u64.to_be_bytes());
    h.resolve(ep, &m, 1);
    assert!(find(t_sl).is_empty(), "must not be a cache hit");
    sa_one(SaAction::Answer, 2);
    let p = path_of(&find(t_sl)[0]);
    assert_eq!(p[53] & 0xf, 3, "SL constraint honoured");
    assert_eq!(&p[0..8], &0x1234u64.to_be_bytes());
    // Each is now a hit for its own constraints.
    let mut m2 = m;
    m2.hdr.tid = h.tid();
    h.resolve(ep, &m2, 1);
    assert_eq!(path_of(&find(m2.hdr.tid)[0])[53] & 0xf, 3);
    let t4 = h.tid();
    h.resolve(ep, &path_request(t4, 6, None, 0), 1);
    assert_eq!(path_of(&find(t4)[0])[53] & 0xf, 0);
    // Asking for our own SLID / P_Key explicitly is the same key as not asking.
    let mut m3 = path_request(h.tid(), 6, None, 0);
    m3.resolve_data[0].info.bytes[42..44].copy_from_slice(&7u16.to_be_bytes());
    m3.resolve_data[0].info.bytes[50..52].copy_from_slice(&0xffffu16.to_be_bytes());
    h.resolve(ep, &m3, 1);
    assert_eq!(find(m3.hdr.tid).len(), 1, "normalised to the plain key");
    h.close();
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
    assert_eq!(status(&find(t_nr)[0]), ACM_STATUS_ENODATA);
    // Remembered (acmrs_negative_ttl_ms, default 5 s): answered inline, the SA is not asked.
    let t_nr2 = h.tid();
    h.resolve(ep, &path_request(t_nr2, 0xbfff + 1, None, 0), 1);
    assert_eq!(status(&find(t_nr2)[0]), ACM_STATUS_ENODATA);
    assert_eq!(sa_pending(), 0);
    // Timeout → ETIMEDOUT.
    let t_to = h.tid();
    h.resolve(ep, &path_request(t_to, 11, None, 0), 1);
    sa_one(SaAction::Timeout, 3);
    assert_eq!(status(&find(t_to)[0]), ACM_STATUS_ETIMEDOUT);
    // Invalid field → EINVAL.
    let t_iv = h.tid();
    h.resolve(ep, &path_request(t_iv, 12, None, 0), 1);
    sa_one(SaAction::InvalidField, 4);
    assert_eq!(status(&find(t_iv)[0]), ACM_STATUS_EINVAL);
    // BUSY twice, then success: retried with a new TID, one answer.
    let t_b = h.tid();
    h.resolve(ep, &path_request(t_b, 13, None, 0), 1);
    for _ in 0..2 {
        assert!(wait_until(|| sa_pending() == 1));
        sa_complete_next(SaAction::Busy);
    }
    sa_one(SaAction::Answer, 5);
    assert_eq!(status(&find(t_b)[0]), 0);
    assert_eq!(dlid_of(&find(t_b)[0]), 13);
    // BUSY forever → ETIMEDOUT after acmrs_sa_retries.
    let t_bb = h.tid();
    h.resolve(ep, &path_request(t_bb, 14, None, 0), 1);
    for _ in 0..4 {
        assert!(wait_until(|| sa_pending() == 1));
        sa_complete_next(SaAction::Busy);
    }
    assert!(wait_responses(6, W));
    assert_eq!(status(&find(t_bb)[0]), ACM_STATUS_ETIMEDOUT);
    // Never answered → ETIMEDOUT after the core's retry budget (100 ms × 1 + 1 s margin).
    let t_never = h.tid();
    h.resolve(ep, &path_request(t_never, 15, None, 0), 1);
    assert!(wait_until(|| sa_pending() == 1));
    assert!(wait_responses(7, Duration::from_secs(4)));
    assert_eq!(status(&find(t_never)[0]), ACM_STATUS_ETIMEDOUT);
    // Its late reply is ignored (and freed).
    sa_complete_next(SaAction::Answer);
    // Send failure → answered at once.
    SEND_FAIL.store(true, Ordering::SeqCst);
    let t_sf = h.tid();
    h.resolve(ep, &path_request(t_sf, 16, None, 0), 1);
    assert!(wait_responses(8, W));
    SEND_FAIL.store(false, Ordering::SeqCst);
    assert_ne!(status(&find(t_sf)[0]), 0);
    std::thread::sleep(Duration::from_millis(50));
    check_exactly_once(&[t_nr, t_nr2, t_to, t_iv, t_b, t_bb, t_never, t_sf]).unwrap();
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
    let mut tids = Vec::new();
    for i in 0..20 {
        let t = 0x7f00_0000_0000 + i;
        tids.push(t);
        h.resolve(ep, &path_request(t, 20 + (i % 2) as u16, None, 0), 0);
    }
    assert!(wait_until(|| sa_pending() == 2));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(sa_pending(), 2, "coalesced on one SA query per destination");
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
        assert_eq!(dlid_of(&r), 20 + (i % 2) as u16);
    }
    h.close();
}

#[test]
fn nodelay_answers_enodata_and_primes_the_cache() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t = h.tid();
    h.resolve(ep, &path_request(t, 30, None, ACM_FLAGS_NODELAY), 1);
    assert_eq!(status(&find(t)[0]), ACM_STATUS_ENODATA, "answered inline");
    assert!(wait_until(|| sa_pending() == 1), "lookup started anyway");
    sa_complete_next(SaAction::Answer);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        response_count(),
        1,
        "the priming query is not answered again"
    );
    // The cache fills from that one SA answer (the test answers no other MAD): a NODELAY
    // request soon succeeds inline.
    let t0 = std::time::Instant::now();
    let hit = loop {
        let t2 = h.tid();
        h.resolve(ep, &path_request(t2, 30, None, ACM_FLAGS_NODELAY), 1);
        let r = find(t2);
        assert_eq!(r.len(), 1, "NODELAY is always answered inline");
        if status(&r[0]) == 0 {
            break r[0].clone();
        }
        assert!(t0.elapsed() < W, "cache never primed");
        std::thread::sleep(Duration::from_millis(2));
    };
    assert_eq!(dlid_of(&hit), 30);
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
    // Review G6: src_out on a PATH request must name an address entry.
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
    check_exactly_once(&tids).unwrap();
    for r in responses() {
        assert_eq!(status(&r), ACM_STATUS_EINVAL, "tid {:#x}", r.msg.hdr.tid);
        assert_eq!(r.msg.hdr.length, 16);
    }
    assert_eq!(h.perf(ep)[cntr::ERROR], bad.len() as u64);
    assert!(log_contains("malformed"));
    // A malformed SA query too.
    let mut q = path_request(h.tid(), 5, None, ACM_FLAGS_QUERY_SA);
    q.hdr.length = 160;
    h.query(ep, &q, 2);
    let r = find(q.hdr.tid);
    assert_eq!(r.len(), 1);
    assert!(r[0].query);
    assert_eq!(status(&r[0]), ACM_STATUS_EINVAL);
    assert_eq!(sa_pending(), 0);
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
    assert_eq!(r.id, 9);
    assert_eq!(r.msg.hdr.opcode, ACM_OP_RESOLVE | ACM_OP_ACK);
    assert_eq!(status(r), 0);
    assert_eq!(r.msg.hdr.length, 88);
    assert_eq!(dlid_of(r), 8);
    assert_eq!(
        r.msg.resolve_data[0].flags & ACM_FLAGS_QUERY_SA,
        ACM_FLAGS_QUERY_SA
    );
    // Not cached: a second query goes to the SA again, and times out cleanly.
    let t2 = h.tid();
    h.query(ep, &path_request(t2, 8, None, ACM_FLAGS_QUERY_SA), 9);
    sa_one(SaAction::Timeout, 2);
    let r2 = &find(t2)[0];
    assert_eq!(status(r2), ACM_STATUS_ETIMEDOUT);
    assert_eq!(dlid_of(r2), 8, "no SA answer: the request's record stays");
    assert_eq!(h.perf(ep)[cntr::ROUTE_QUERY], 2);
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
    assert_eq!(status(r3), ACM_STATUS_ENODATA);
    assert_eq!(r3.msg.hdr.opcode, ACM_OP_RESOLVE | ACM_OP_ACK);
    assert_eq!(
        path_of(r3),
        [0u8; 64],
        "the SA's record, as ibacmp returns it"
    );
    // A malformed query: EINVAL inline, counted.
    let t4 = h.tid();
    let mut bad = path_request(t4, 8, None, ACM_FLAGS_QUERY_SA);
    bad.hdr.length = 16;
    h.query(ep, &bad, 9);
    assert_eq!(status(&find(t4)[0]), ACM_STATUS_EINVAL);
    let perf = h.perf(ep);
    assert_eq!((perf[cntr::ERROR], perf[cntr::NODATA]), (3, 0));
    h.close();
}

#[test]
fn names_from_hosts_file_loopback_and_source_echo() {
    let _s = serial();
    let hosts = "# hosts\nnode9 fe80::1009\n10.0.0.9 fe80::1009\nfe80::9 fe80::1009\nbad-line\n";
    let opts =
        format!("{OPTS}{WORKER_ANSWERS}addr_preload acm_hosts\naddr_data_file $DIR/hosts.data\n");
    let mut h = Host::open(&opts, &[("hosts.data", hosts)]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    h.add_addr(ep, ACM_ADDRESS_IP, &[10, 0, 0, 7]);
    assert!(log_contains("line 5"), "bad hosts line reported");
    // Remote name → hosts → SA by DGID.
    let t = h.tid();
    h.resolve(
        ep,
        &dest_request(
            t,
            (ACM_ADDRESS_NAME, b"node7"),
            (ACM_ADDRESS_NAME, b"node9"),
            0,
        ),
        4,
    );
    sa_one(SaAction::Answer, 1);
    let r = &find(t)[0];
    assert_eq!(status(r), 0);
    assert_eq!(dlid_of(r), 9);
    assert_eq!(r.msg.hdr.length, 16 + 2 * 72, "source echoed");
    assert_eq!(r.msg.resolve_data[1].flags, ACM_EP_FLAG_SOURCE);
    assert_eq!(r.msg.resolve_data[1].type_, ACM_ADDRESS_NAME);
    assert_eq!(&r.msg.resolve_data[1].info.bytes[..5], b"node7");
    // Same GID by IPv4 and IPv6: one cached route, hits inline.
    let t4 = h.tid();
    h.resolve(
        ep,
        &dest_request(
            t4,
            (ACM_ADDRESS_IP, &[10, 0, 0, 7]),
            (ACM_ADDRESS_IP, &[10, 0, 0, 9]),
            0,
        ),
        4,
    );
    assert_eq!(dlid_of(&find(t4)[0]), 9);
    let mut v6 = [0u8; 16];
    v6[0] = 0xfe;
    v6[1] = 0x80;
    v6[15] = 9;
    let t6 = h.tid();
    h.resolve(
        ep,
        &dest_request(t6, (ACM_ADDRESS_NAME, b"node7"), (ACM_ADDRESS_IP6, &v6), 0),
        4,
    );
    assert_eq!(dlid_of(&find(t6)[0]), 9);
    // Loopback to our own name and IP: inline, LID from ibv_query_port.
    for dst in [
        (ACM_ADDRESS_NAME, &b"node7"[..]),
        (ACM_ADDRESS_IP, &[10, 0, 0, 7][..]),
    ] {
        let tl = h.tid();
        h.resolve(
            ep,
            &dest_request(tl, (ACM_ADDRESS_NAME, b"node7"), dst, 0),
            4,
        );
        let r = &find(tl)[0];
        assert_eq!(status(r), 0);
        assert_eq!(dlid_of(r), 7);
        assert_eq!(&path_of(r)[8..24], &gid_of(OWN_GUID));
    }
    // Unknown name → ENODATA (the multicast protocol is not implemented).
    let tu = h.tid();
    h.resolve(
        ep,
        &dest_request(
            tu,
            (ACM_ADDRESS_NAME, b"node7"),
            (ACM_ADDRESS_NAME, b"ghost"),
            0,
        ),
        4,
    );
    assert_eq!(status(&find(tu)[0]), ACM_STATUS_ENODATA);
    let perf = h.perf(ep);
    // ibacmp's meaning (review G5): ADDR_CACHE only when the address is known and its route
    // is not. node9 by name, IPv4 and IPv6 is one GID, so one route: only the first use
    // missed. (ibacmp keeps a route per destination *address*, so it would count 3 here and
    // send 3 SA queries; acmrs shares the route, documented in docs/plugin.md.)
    assert_eq!(perf[cntr::ADDR_CACHE], 1);
    assert_eq!(perf[cntr::NODATA], 1);
    // After remove_address the IP is no longer local.
    h.remove_addr(ep, 1);
    let tr = h.tid();
    h.resolve(
        ep,
        &dest_request(
            tr,
            (ACM_ADDRESS_NAME, b"node7"),
            (ACM_ADDRESS_IP, &[10, 0, 0, 7]),
            0,
        ),
        4,
    );
    assert_eq!(status(&find(tr)[0]), ACM_STATUS_ENODATA);
    h.close();
}

#[test]
fn lifecycle_close_while_waiting_port_change_and_reregister() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    // Duplicate add_address after a netlink resync: tolerated; leftovers freed at close.
    h.add_addr(ep, ACM_ADDRESS_IP, &[10, 0, 0, 7]);
    h.add_addr(ep, ACM_ADDRESS_IP, &[10, 0, 0, 7]);
    h.eps[ep].addrs.pop(); // the core "forgets" this context without remove_address
    let t_ok = h.tid();
    h.resolve(ep, &path_request(t_ok, 40, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    // A request waiting on the SA when the endpoint closes: answered ENODATA, once.
    let t_wait = h.tid();
    h.resolve(ep, &path_request(t_wait, 41, None, 0), 1);
    assert!(wait_until(|| sa_pending() == 1));
    h.close_ep(ep);
    assert!(wait_responses(2, W));
    assert_eq!(status(&find(t_wait)[0]), ACM_STATUS_ENODATA);
    // The late SA answer is freed and ignored.
    sa_complete_next(SaAction::Answer);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(find(t_wait).len(), 1);
    assert_eq!(DEAD_ENDPOINT_USE.load(Ordering::SeqCst), 0);
    // LID change: the core closes everything and reopens; the old path is gone.
    let host_dir = h.dir.clone();
    h.close();
    let _ = host_dir;
    PORT_LID.store(8, Ordering::SeqCst);
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t_new = h.tid();
    h.resolve(ep, &path_request(t_new, 40, None, 0), 1);
    assert!(find(t_new).is_empty(), "no stale hit after a port change");
    sa_one(SaAction::Answer, 1);
    let p = path_of(&find(t_new)[0]);
    assert_eq!(
        u16::from_be_bytes([p[42], p[43]]),
        8,
        "learned through the new LID"
    );
    // Reopen of an endpoint within the same port open: fresh key space too.
    h.close_ep(ep);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t_re = h.tid();
    h.resolve(ep, &path_request(t_re, 40, None, 0), 1);
    assert!(find(t_re).is_empty());
    sa_one(SaAction::Answer, 2);
    // CLIENT_REREGISTER flushes learned routes.
    h.reregister();
    std::thread::sleep(Duration::from_millis(20));
    let t_rr = h.tid();
    h.resolve(ep, &path_request(t_rr, 40, None, 0), 1);
    assert!(find(t_rr).is_empty(), "flushed by reregister");
    sa_one(SaAction::Answer, 3);
    // A request in flight at shutdown is answered by the shutdown.
    let t_sd = h.tid();
    h.resolve(ep, &path_request(t_sd, 42, None, 0), 1);
    assert!(wait_until(|| sa_pending() == 1));
    h.close();
    assert_eq!(find(t_sd).len(), 1);
    assert_eq!(status(&find(t_sd)[0]), ACM_STATUS_ENODATA);
    sa_drain_timeouts();
    PORT_LID.store(7, Ordering::SeqCst);
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));
}

#[test]
fn route_preload_opensm_full_v1() {
    let _s = serial();
    let dump = "\
Channel Adapter 0x0002c90300a1b2c3, base LID 7, \"Me\", port 1
# LID  : SL : MTU : RATE
0x0007 : 0  : 4   : 3
0x000b : 2  : 4   : 6
0x000c : 1  : 3   : 3
0x000d : UNREACHABLE
0x000c : x  : 3   : 3

Channel Adapter 0x000000000000100b, base LID 11, \"Other\", port 1
0x0007 : 2  : 4   : 6

Switch 0x000000000000100c, base LID 12, \"Sw\", port 0
0x0007 : 1  : 3   : 3
";
    let opts = format!("{OPTS}route_preload opensm_full_v1\nroute_data_file $DIR/route.data\n");
    let mut h = Host::open(&opts, &[("route.data", dump)]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    assert!(log_contains("route.data line 7"), "bad path line reported");
    assert!(wait_until(|| log_contains(
        "preloaded cache entries inserted"
    )));
    let t = h.tid();
    h.resolve(ep, &path_request(t, 11, None, 0), 1);
    let r = find(t);
    assert_eq!(r.len(), 1, "preloaded: answered inline");
    let p = path_of(&r[0]);
    assert_eq!(dlid_of(&r[0]), 11);
    assert_eq!(p[53] & 0xf, 2, "SL from the dump");
    assert_eq!(p[55], 6, "rate from the dump");
    assert_eq!(&p[8..24], &gid_of(0x100b));
    let tg = h.tid();
    h.resolve(ep, &path_request(tg, 0, Some(gid_of(0x100c)), 0), 1);
    assert_eq!(dlid_of(&find(tg)[0]), 12);
    assert_eq!(sa_pending(), 0);
    // Other constraints are not answered from the preload.
    let mut m = path_request(h.tid(), 11, None, 0);
    m.resolve_data[0].info.bytes[48] = 5; // TClass
    h.resolve(ep, &m, 1);
    assert!(find(m.hdr.tid).is_empty());
    sa_one(SaAction::Answer, 3);
    // Reregister keeps preloaded routes; unreachable ones are not preloaded.
    h.reregister();
    assert!(wait_until(|| log_contains("cached routes flushed")));
    let t2 = h.tid();
    h.resolve(ep, &path_request(t2, 11, None, 0), 1);
    assert_eq!(find(t2).len(), 1);
    let t3 = h.tid();
    h.resolve(ep, &path_request(t3, 13, None, 0), 1);
    assert!(find(t3).is_empty(), "UNREACHABLE is not preloaded");
    sa_one(SaAction::Answer, 5);
    h.close();
}

#[test]
fn options_are_validated_and_route_lifetime_honoured() {
    let _s = serial();
    let opts = format!(
        "{OPTS}acmrs_cpu banana\nroute_prot acm\nsome_other_provider_option 5\n\
         acmrs_route_ttl_ms 300\n{WORKER_ANSWERS}"
    );
    let mut h = Host::open(&opts, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    // The invalid value is reported with its line; unknown names are ignored silently.
    assert!(
        log_contains("ibacm_opts.cfg line 10: invalid number"),
        "invalid acmrs_cpu reported"
    );
    assert!(!log_contains("some_other_provider_option"));
    // route_prot acm needs the endpoint's UD QP, which this fake core cannot give: the
    // endpoint says so and serves PATH requests through the SA.
    assert!(log_contains("no ACM protocol"), "SA-only endpoint reported");
    let t = h.tid();
    h.resolve(ep, &path_request(t, 50, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    let t2 = h.tid();
    h.resolve(ep, &path_request(t2, 50, None, 0), 1);
    assert_eq!(find(t2).len(), 1, "hit while fresh");
    // acmrs_route_ttl_ms 300: after it the route is queried again.
    std::thread::sleep(Duration::from_millis(600));
    let t3 = h.tid();
    h.resolve(ep, &path_request(t3, 50, None, 0), 1);
    assert!(find(t3).is_empty(), "expired route is not served");
    sa_one(SaAction::Answer, 3);
    h.close();
}

#[test]
fn backlog_beyond_sa_depth_and_close_with_a_full_backlog() {
    let _s = serial();
    // sa_depth 1: 8 SA queries in flight from the worker, plus the first 4 misses, which
    // resolve() sent itself (acmrs_sa_inline, 4 inline slots, the worker was idle).
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let mut tids = Vec::new();
    for i in 0..40u16 {
        let t = h.tid();
        tids.push(t);
        h.resolve(ep, &path_request(t, 100 + i, None, 0), 1);
        if i < 4 {
            assert_eq!(sa_pending(), usize::from(i) + 1, "sent inside resolve()");
        }
    }
    assert!(wait_until(|| sa_pending() == 12));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(sa_pending(), 12, "no more than 8 × sa_depth + 4 in flight");
    // Answering drains the backlog in order.
    let t0 = std::time::Instant::now();
    while response_count() < 40 {
        while sa_complete_next(SaAction::Answer) {}
        assert!(t0.elapsed() < W);
        std::thread::sleep(Duration::from_micros(200));
    }
    check_exactly_once(&tids).unwrap();
    assert!(responses().iter().all(|r| r.msg.hdr.status == 0));
    // 2000 waiting requests (8 in flight, the rest in the backlog) when the endpoint closes:
    // every one answered ENODATA once, nothing started on the closed endpoint.
    reset_counters();
    let mut tids = Vec::new();
    for i in 0..2000u16 {
        let t = h.tid();
        tids.push(t);
        h.resolve(ep, &path_request(t, 1000 + i, None, 0), 1);
    }
    assert!(wait_until(|| sa_pending() == 12));
    h.close_ep(ep);
    assert!(wait_responses(2000, W));
    check_exactly_once(&tids).unwrap();
    assert!(responses()
        .iter()
        .all(|r| r.msg.hdr.status == ACM_STATUS_ENODATA));
    assert_eq!(DEAD_ENDPOINT_USE.load(Ordering::SeqCst), 0);
    sa_drain_timeouts();
    h.close();
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));
}

#[test]
fn refresh_ahead_requeries_once_and_updates_in_place() {
    let _s = serial();
    // Routes live 2 s; the last 50% (1 s) of that is the refresh window.
    let opts =
        format!("{OPTS}{WORKER_ANSWERS}acmrs_route_ttl_ms 2000\nacmrs_refresh_ahead_pct 50\n");
    let mut h = Host::open(&opts, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t = h.tid();
    h.resolve(ep, &path_request(t, 50, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    let old = path_of(&find(t)[0]);
    let t1 = h.tid();
    h.resolve(ep, &path_request(t1, 50, None, 0), 1);
    assert_eq!(find(t1).len(), 1, "fresh hit inline");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(sa_pending(), 0, "no refresh outside the window");
    // Inside the window (the coarse clock may lag up to 100 ms), before expiry.
    std::thread::sleep(Duration::from_millis(1250));
    let mut tids = Vec::new();
    for _ in 0..6 {
        let tn = h.tid();
        tids.push(tn);
        h.resolve(ep, &path_request(tn, 50, None, 0), 1);
        let r = find(tn);
        assert_eq!(
            r.len(),
            1,
            "answered inline from the cache during the refresh"
        );
        assert_eq!(status(&r[0]), 0);
        assert_eq!(path_of(&r[0]), old);
    }
    assert!(wait_until(|| sa_pending() == 1), "one refresh query");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        sa_pending(),
        1,
        "exactly one SA query for six near-expiry hits"
    );
    assert_eq!(h.perf(ep)[cntr::ROUTE_QUERY], 2);
    sa_complete_next(SaAction::AnswerLife(0x95));
    // The entry is updated in place: new record, new lifetime (past the old expiry).
    assert!(wait_until(|| {
        let tn = 0x7777_0000_0000 + uniq();
        let m = path_request(tn, 50, None, 0);
        h.resolve(ep, &m, 1);
        find(tn).first().is_some_and(|r| path_of(r)[56] == 0x95)
    }));
    std::thread::sleep(Duration::from_millis(900)); // > 2 s after the first answer
    let t9 = h.tid();
    h.resolve(ep, &path_request(t9, 50, None, 0), 1);
    let r = find(t9);
    assert_eq!(r.len(), 1, "still a hit after the original expiry");
    assert_eq!(path_of(&r[0])[56], 0x95);
    assert_eq!(sa_pending(), 0);
    assert_eq!(h.perf(ep)[cntr::ROUTE_QUERY], 2, "no miss query");
    h.close();
}

#[test]
fn expired_host_mappings_are_re_resolved_by_the_worker() {
    let _s = serial();
    let hosts = "node9 fe80::1009\n";
    // addr_timeout 0: a mapping expires at once, so every use is a miss to re-resolve.
    let opts =
        format!("{OPTS}addr_preload acm_hosts\naddr_data_file $DIR/hosts.data\naddr_timeout 0\n");
    let mut h = Host::open(&opts, &[("hosts.data", hosts)]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let req = |t| {
        dest_request(
            t,
            (ACM_ADDRESS_NAME, b"node7"),
            (ACM_ADDRESS_NAME, b"node9"),
            0,
        )
    };
    let t = h.tid();
    h.resolve(ep, &req(t), 4);
    sa_one(SaAction::Answer, 1);
    assert_eq!(dlid_of(&find(t)[0]), 9);
    // The route is cached now, but the address mapping is expired: not answered inline; the
    // worker re-resolves the name (from the preload table) and answers from the route cache.
    let t2 = h.tid();
    h.resolve(ep, &req(t2), 4);
    assert!(wait_responses(2, W));
    let r = &find(t2)[0];
    assert_eq!(status(r), 0);
    assert_eq!(dlid_of(r), 9);
    assert_eq!(sa_pending(), 0, "the route itself was cached");
    let perf = h.perf(ep);
    assert_eq!(perf[cntr::ADDR_QUERY], 2, "two address re-resolutions");
    assert_eq!(perf[cntr::ADDR_CACHE], 0, "no address cache hit");
    assert_eq!(perf[cntr::ROUTE_CACHE], 1);
    h.close();
    // With the default (1440 minutes) the same name is an address-cache hit.
    let opts = format!("{OPTS}addr_preload acm_hosts\naddr_data_file $DIR/hosts.data\n");
    let mut h = Host::open(&opts, &[("hosts.data", hosts)]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t = h.tid();
    h.resolve(ep, &req(t), 4);
    sa_one(SaAction::Answer, 1);
    let perf = h.perf(ep);
    assert_eq!((perf[cntr::ADDR_QUERY], perf[cntr::ADDR_CACHE]), (0, 1));
    h.close();
}

#[test]
fn sa_thread_answers_the_starter_directly_and_the_worker_the_rest() {
    let _s = serial();
    let me = std::thread::current().id();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    // Three misses for one destination coalesce on one SA query.
    let tids: Vec<u64> = (0..3).map(|_| h.tid()).collect();
    for (i, &t) in tids.iter().enumerate() {
        h.resolve(ep, &path_request(t, 40, None, 0), 10 + i as u64);
        if i == 0 {
            // acmrs_sa_inline 1 (default) and an idle worker: sent inside resolve().
            assert_eq!(sa_pending(), 1, "first miss sent inline");
        }
    }
    assert!(wait_until(|| sa_pending() == 1));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(sa_pending(), 1, "coalesced");
    // The test thread plays the core's SA thread: the starter is answered inside the
    // completion handler, before it returns.
    assert!(sa_complete_next(SaAction::Answer));
    let first = find(tids[0]);
    assert_eq!(first.len(), 1, "starter answered inside the SA handler");
    assert_eq!(first[0].thread, me);
    assert_eq!((status(&first[0]), dlid_of(&first[0])), (0, 40));
    // The coalesced waiters are answered by the worker, after the starter, in order.
    assert!(wait_responses(3, W));
    check_exactly_once(&tids).unwrap();
    let order: Vec<u64> = responses().iter().map(|r| r.msg.hdr.tid).collect();
    assert_eq!(order, tids, "FIFO");
    for r in &responses()[1..] {
        assert_ne!(r.thread, me);
        assert_eq!((status(r), dlid_of(r)), (0, 40));
    }
    // Failures are never answered on the SA thread (the worker owns negative caching,
    // retries and counters): no record, BUSY then success, timeout.
    for (action, expect) in [
        (SaAction::Timeout, ACM_STATUS_ETIMEDOUT),
        (SaAction::InvalidField, ACM_STATUS_EINVAL),
    ] {
        reset_counters();
        let t = h.tid();
        h.resolve(ep, &path_request(t, 41, None, 0), 1);
        sa_one(action, 1);
        let r = find(t);
        assert_eq!(r.len(), 1);
        assert_eq!(status(&r[0]), expect);
        assert_ne!(r[0].thread, me, "failure answered by the worker");
    }
    // A reply that overtakes resolve()'s hand-over to the worker (the worker is not even woken
    // for an inline send): a success is answered at once, a failure by the worker once it
    // takes the query over.
    for (dlid, action, expect, on_sa_thread) in [
        (46, SaAction::Answer, 0, true),
        (47, SaAction::Timeout, ACM_STATUS_ETIMEDOUT, false),
    ] {
        reset_counters();
        // Give the worker time to finish its round and report itself idle.
        std::thread::sleep(Duration::from_millis(20));
        let t = h.tid();
        h.resolve(ep, &path_request(t, dlid, None, 0), 1);
        assert!(sa_complete_next(action), "sent inline");
        assert!(wait_responses(1, W));
        std::thread::sleep(Duration::from_millis(20));
        let r = find(t);
        assert_eq!(r.len(), 1, "exactly once");
        assert_eq!(status(&r[0]), expect);
        assert_eq!(r[0].thread == me, on_sa_thread);
    }
    // BUSY, then the retry succeeds: the retry's reply answers the starter directly.
    reset_counters();
    let t = h.tid();
    h.resolve(ep, &path_request(t, 42, None, 0), 1);
    assert!(wait_until(|| sa_pending() == 1));
    assert!(sa_complete_next(SaAction::Busy));
    assert!(wait_until(|| sa_pending() == 1), "retried after BUSY");
    assert!(sa_complete_next(SaAction::Answer));
    let r = find(t);
    assert_eq!(r.len(), 1);
    assert_eq!((status(&r[0]), dlid_of(&r[0])), (0, 42));
    assert_eq!(r[0].thread, me);
    // query() (ACM_FLAGS_QUERY_SA) starters are answered directly too, with the SA record.
    reset_counters();
    let t = h.tid();
    h.query(ep, &path_request(t, 43, None, ACM_FLAGS_QUERY_SA), 2);
    sa_one(SaAction::Answer, 1);
    let r = find(t);
    assert!(r[0].query);
    assert_eq!(r[0].thread, me);
    assert_eq!(status(&r[0]), 0);
    // A closed endpoint's starter gets ENODATA from the worker, never a late success.
    reset_counters();
    let t = h.tid();
    h.resolve(ep, &path_request(t, 44, None, 0), 1);
    assert!(wait_until(|| sa_pending() == 1));
    h.close_ep(ep);
    assert!(wait_responses(1, W));
    // The SA's success arrives after the close: ignored.
    assert!(sa_complete_next(SaAction::Answer));
    std::thread::sleep(Duration::from_millis(20));
    let r = find(t);
    assert_eq!(r.len(), 1, "exactly once");
    assert_eq!(status(&r[0]), ACM_STATUS_ENODATA);
    h.close();
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));

    // acmrs_sa_direct 0: every answer comes from the worker.
    let mut h = Host::open(&format!("{OPTS}{WORKER_ANSWERS}"), &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    reset_counters();
    let t = h.tid();
    h.resolve(ep, &path_request(t, 45, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    let r = find(t);
    assert_eq!((status(&r[0]), dlid_of(&r[0])), (0, 45));
    assert_ne!(r[0].thread, me);
    h.close();
}
