//! Randomised schedules against the real `libacmrs.so` (fake core): resolves, queries,
//! NODELAY, SA completions in random order with random outcomes, endpoint close/reopen and
//! reregister, interleaved with the dataplane.
//!
//! `ACMRS_SCHEDULES=<n>` runs more schedules; `ACMRS_SEED=<s>` replays one schedule.

use acm_core_nostd::rng::Rng;
use acm_testkit::core::*;
use acm_testkit::host::*;
use acm_testkit::request::*;
use acmrs::ffi::*;
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
    let outstanding = || ALLOCS.load(Ordering::SeqCst) - FREES.load(Ordering::SeqCst);
    // SA MADs out before this schedule: a background refresh or prime whose query was lost
    // goes again after its backoff, which can be after the previous schedule settled. Such a
    // MAD is answered during this one: the baseline then drops to what is left.
    let mut base_allocs = outstanding();
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
        // Settled: everything answered, and no SA MAD out (a background refresh or prime
        // whose query was lost goes again after its backoff, so none may be about to be).
        let out = outstanding();
        base_allocs = base_allocs.min(out);
        if response_count() >= expect.len() && sa_pending() == 0 && out == base_allocs {
            quiet += 1;
            if quiet > 3 {
                break;
            }
        } else {
            quiet = 0;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "seed {seed}: stuck, {} of {} answered, {} SA MADs out",
                response_count(),
                expect.len(),
                outstanding().saturating_sub(base_allocs)
            ));
        }
        std::thread::sleep(Duration::from_millis(3));
    }
    // Every request handed over was taken in: no late answer can follow.
    h.barrier();
    let tids: Vec<u64> = expect.keys().copied().collect();
    check_exactly_once(&tids).map_err(|e| format!("seed {seed}: {e}"))?;
    for r in responses() {
        let e = &expect[&r.msg.hdr.tid];
        if r.query != e.query {
            return Err(format!("seed {seed}: wrong response kind"));
        }
        if r.msg.hdr.status == 0 {
            let p = path_of(&r.msg);
            if dlid_of(&r.msg) != e.dlid || (!e.query && p[53] & 0xf != e.sl) {
                return Err(format!(
                    "seed {seed}: tid {:#x} asked dlid {} sl {} got dlid {} sl {}",
                    r.msg.hdr.tid,
                    e.dlid,
                    e.sl,
                    dlid_of(&r.msg),
                    p[53] & 0xf
                ));
            }
        }
    }
    // Every SA MAD comes back: a background refresh or prime whose query was lost may go
    // again after its backoff (no client waits on it); the SA answers whatever is still out.
    let t1 = Instant::now();
    loop {
        while sa_complete_next(SaAction::Answer) {}
        let out = outstanding();
        base_allocs = base_allocs.min(out);
        if out == base_allocs {
            break;
        }
        if t1.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "seed {seed}: {} SA MADs not freed",
                out - base_allocs
            ));
        }
        std::thread::sleep(Duration::from_millis(3));
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
    let opts = format!("{OPTS}acmrs_route_ttl_ms 40\nacmrs_refresh_ahead_pct 75\n");
    let mut h = Host::open(&opts, &[]);
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    for seed in first..first + count {
        if let Err(e) = run_schedule(&mut h, seed) {
            panic!("{e} (replay: ACMRS_SEED={seed} cargo test -p acm-plugin --test stress)");
        }
        if seed % 200 == 0 {
            h.close();
            sa_drain_timeouts();
            h = Host::open(&opts, &[]);
            h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
        }
    }
    h.close();
    sa_drain_timeouts();
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));
}
