//! Randomised schedules, scale and leak checks against the real `libacmrs.so` (fake core).
//!
//! `ACMRS_SCHEDULES=<n>` runs more schedules; `ACMRS_SEED=<s>` replays one schedule.

mod common;

use acmrs::ffi::*;
use common::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const OPTS: &str = "\
log_level 0
timeout 100
retries 0
acmrs_sa_retries 2
acmrs_sa_busy_backoff_ms 1
acmrs_pending_capacity 64
acmrs_request_capacity 64
";

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a request asked for, to check the answer.
struct Expect {
    dlid: u16,
    sl: u8,
    query: bool,
}

/// One schedule: random resolves/queries, SA completions in random order with random
/// outcomes, endpoint close/reopen and reregister, interleaved with the worker. Afterwards
/// every request must have exactly one answer with its tid, successful answers must carry the
/// path that was asked for, and every SA MAD must be freed.
fn run_schedule(h: &mut Host, seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    reset_counters();
    let base_allocs = ALLOCS.load(Ordering::SeqCst) - FREES.load(Ordering::SeqCst);
    let mut expect: HashMap<u64, Expect> = HashMap::new();
    let ops = 10 + rng.below(40);
    for _ in 0..ops {
        match rng.below(100) {
            0..=44 => {
                let tid = h.tid();
                let dlid = 1 + rng.below(6) as u16;
                let nodelay = rng.below(5) == 0;
                let mut m =
                    path_request(tid, dlid, None, if nodelay { ACM_FLAGS_NODELAY } else { 0 });
                let sl = if rng.below(4) == 0 {
                    1 + rng.below(3) as u8
                } else {
                    0
                };
                m.resolve_data[0].info.bytes[53] = sl;
                let id = if rng.below(3) == 0 {
                    0
                } else {
                    1 + rng.below(5)
                };
                h.resolve(0, &m, id);
                expect.insert(
                    tid,
                    Expect {
                        dlid,
                        sl,
                        query: false,
                    },
                );
            }
            45..=49 => {
                let tid = h.tid();
                let dlid = 1 + rng.below(6) as u16;
                h.query(0, &path_request(tid, dlid, None, ACM_FLAGS_QUERY_SA), 1);
                expect.insert(
                    tid,
                    Expect {
                        dlid,
                        sl: 0,
                        query: true,
                    },
                );
            }
            50..=84 => {
                let n = sa_pending();
                if n > 0 {
                    let action = match rng.below(10) {
                        0..=5 => SaAction::Answer,
                        6 => SaAction::Busy,
                        7 => SaAction::Timeout,
                        8 => SaAction::InvalidField,
                        _ => SaAction::Hold,
                    };
                    sa_complete_at(rng.below(n as u64) as usize, action);
                }
            }
            85..=89 => {
                h.close_ep(0);
                h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
            }
            90..=92 => h.reregister(),
            _ => std::thread::sleep(Duration::from_micros(rng.below(300))),
        }
    }
    // Let everything finish: the SA answers or times out whatever is left.
    let t0 = Instant::now();
    let mut quiet = 0;
    loop {
        let action = if rng.below(2) == 0 {
            SaAction::Answer
        } else {
            SaAction::Timeout
        };
        while sa_complete_next(action) {}
        if response_count() >= expect.len() && sa_pending() == 0 {
            quiet += 1;
            if quiet > 3 {
                break;
            }
        } else {
            quiet = 0;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "seed {seed}: stuck, {} of {} answered",
                response_count(),
                expect.len()
            ));
        }
        std::thread::sleep(Duration::from_millis(3));
    }
    let tids: Vec<u64> = expect.keys().copied().collect();
    check_exactly_once(&tids).map_err(|e| format!("seed {seed}: {e}"))?;
    // The fake SA completes every MAD (at the latest in the loop above), so the worker's
    // safety-net timer must never fire: if it did, a reply was lost on the way (e.g. one
    // that overtook resolve()'s inline hand-over and was not kept for it).
    if log_contains("overdue") {
        return Err(format!(
            "seed {seed}: an SA reply was lost (answered by the overdue timer)"
        ));
    }
    for r in responses() {
        let e = &expect[&r.msg.hdr.tid];
        if r.query != e.query {
            return Err(format!("seed {seed}: wrong response kind"));
        }
        if r.msg.hdr.status == 0 {
            let p = path_of(&r);
            if dlid_of(&r) != e.dlid || (!e.query && p[53] & 0xf != e.sl) {
                return Err(format!(
                    "seed {seed}: tid {:#x} asked dlid {} sl {} got dlid {} sl {}",
                    r.msg.hdr.tid,
                    e.dlid,
                    e.sl,
                    dlid_of(&r),
                    p[53] & 0xf
                ));
            }
        }
    }
    let outstanding = ALLOCS.load(Ordering::SeqCst) - FREES.load(Ordering::SeqCst);
    if outstanding != base_allocs {
        return Err(format!(
            "seed {seed}: {} SA MADs not freed",
            outstanding - base_allocs
        ));
    }
    if DEAD_ENDPOINT_USE.load(Ordering::SeqCst) != 0 {
        return Err(format!(
            "seed {seed}: SA MAD allocated on a closed endpoint"
        ));
    }
    Ok(())
}

#[test]
fn exactly_once_under_random_schedules() {
    let _s = serial();
    let (first, count) = match std::env::var("ACMRS_SEED") {
        Ok(s) => (s.parse().expect("ACMRS_SEED"), 1),
        Err(_) => (
            1u64,
            std::env::var("ACMRS_SCHEDULES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1000),
        ),
    };
    // Short route lifetimes with a wide refresh-ahead window, so schedules also see expiry
    // and background refreshes racing with misses, closes and reregisters.
    // Blocks of 200 seeds rotate through the three miss-path modes: the defaults (seeds
    // 1..=199, 600..=799, ...: the worker sends every query and answers every client, the SA
    // thread only copies and hands over), the opt-in `acmrs_sa_direct 1` + `acmrs_sa_inline 1`
    // (resolve() sends, the SA thread answers) and `acmrs_sa_direct 1` alone.
    let opts = |seed: u64| {
        let mode = match (seed / 200) % 3 {
            0 => "",
            1 => "acmrs_sa_direct 1\nacmrs_sa_inline 1\n",
            _ => "acmrs_sa_direct 1\nacmrs_sa_inline 0\n",
        };
        format!("{OPTS}acmrs_route_ttl_ms 40\nacmrs_refresh_ahead_pct 75\n{mode}")
    };
    let mut h = Host::open(&opts(first), &[]);
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    for seed in first..first + count {
        if let Err(e) = run_schedule(&mut h, seed) {
            panic!("{e} (replay: ACMRS_SEED={seed} cargo test -p acm-plugin --test stress)");
        }
        if seed % 200 == 0 {
            h.close();
            sa_drain_timeouts();
            h = Host::open(&opts(seed), &[]);
            h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
        }
    }
    h.close();
    sa_drain_timeouts();
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));
}

#[test]
fn hundred_thousand_destinations() {
    let _s = serial();
    let opts =
        "log_level 0\nsa_depth 32\nacmrs_path_capacity 200000\nacmrs_request_capacity 131072\n\
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
        wait_responses(n as usize, Duration::from_secs(60)),
        "only {} answered",
        response_count()
    );
    let miss_time = t0.elapsed();
    drop(sa);
    let tids: Vec<u64> = (1..=n).collect();
    check_exactly_once(&tids).unwrap();
    for r in responses() {
        assert_eq!(r.msg.hdr.status, 0);
        assert_eq!(&path_of(&r)[8..24], &gid_of(0x1000 + r.msg.hdr.tid));
    }
    // The SA thread answers a miss before the worker has cached it (acmrs_sa_direct 1): wait
    // until the worker has caught up, i.e. a full pass is answered inline.
    for attempt in 0.. {
        reset_counters();
        for i in 1..=n {
            h.resolve(0, &path_request(n + i, 0, Some(gid_of(0x1000 + i)), 0), 1);
        }
        if response_count() == n as usize {
            break;
        }
        assert!(attempt < 50, "the worker never cached all routes");
        assert!(wait_responses(n as usize, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
    }
    // Second pass: every one is a cache hit, answered inline.
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

#[test]
fn full_queue_and_pending_table_answer_enomem() {
    let _s = serial();
    let opts = "log_level 0\nacmrs_request_capacity 4\nacmrs_pending_capacity 8\n";
    let mut h = Host::open(opts, &[]);
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    // Nobody answers the SA: requests pile up until the tables are full.
    let mut tids = Vec::new();
    for i in 0..40u64 {
        let t = 1000 + i;
        tids.push(t);
        h.resolve(0, &path_request(t, 1 + (i % 30) as u16, None, 0), 1);
        if i % 4 == 3 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    let enomem = responses()
        .iter()
        .filter(|r| r.msg.hdr.status == ACM_STATUS_ENOMEM)
        .count();
    assert!(enomem >= 40 - 8, "{enomem} ENOMEM answers");
    while sa_complete_next(SaAction::Answer) {}
    assert!(wait_responses(40, Duration::from_secs(5)));
    check_exactly_once(&tids).unwrap();
    h.close();
}

fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 has no preconditions.
    unsafe { libc::mallinfo2().uordblks }
}

#[test]
fn open_close_cycles_do_not_leak() {
    let _s = serial();
    let cycle = || {
        let mut h = Host::open("log_level 0\n", &[]);
        h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
        h.add_addr(0, ACM_ADDRESS_IP, &[10, 0, 0, 7]);
        h.add_addr(0, ACM_ADDRESS_IP, &[10, 0, 0, 7]);
        h.eps[0].addrs.pop(); // leaked by the core's resync: freed by close_endpoint
        for i in 0..50u64 {
            h.resolve(0, &path_request(i + 1, 1 + (i % 10) as u16, None, 0), 1);
        }
        assert!(wait_until_sa(8), "8 × sa_depth queries in flight");
        let t0 = Instant::now();
        while response_count() < 50 {
            while sa_complete_next(SaAction::Answer) {}
            assert!(t0.elapsed() < Duration::from_secs(5), "backlog not drained");
            std::thread::sleep(Duration::from_micros(200));
        }
        for i in 0..5u64 {
            h.resolve(0, &path_request(100 + i, 20 + i as u16, None, 0), 1);
        }
        h.close(); // answers the 5 waiting requests
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

fn wait_until_sa(n: usize) -> bool {
    let t0 = Instant::now();
    while sa_pending() < n {
        if t0.elapsed() > Duration::from_secs(5) {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    true
}
