//! One writer, many readers: readers never see a torn or foreign record.
//!
//! The writer rewrites a handful of entries as fast as it can. Every record it writes is
//! self-checking: word 0 is the LID of the key it is stored under, word 1 a version counter `v`,
//! and words 2..16 are `expected(v, i)`, all different functions of `v`. A reader that gets a
//! record checks all 16 words. A torn read — some words from version `v`, some from `v'` — fails
//! the check unless `expected(v, i) == expected(v', i)` for every mixed word, which the mixing
//! function makes impossible for `v != v'`; a record of another key fails the word-0 check.
//!
//! Why this catches a broken seqlock: with few keys and a writer that never pauses, the writer
//! is inside a 31-word store sequence of the very slot a reader is copying a large fraction of the
//! time. A reader that did not validate the sequence counter would return such mixed copies.
//! `tearing_is_detected_when_validation_is_skipped` proves the check has teeth: it runs the same
//! workload through `torn_lookup_for_tests` (the lookup without the sequence validation) and
//! requires a torn record to be caught. The real lookup must yield zero in the same workload.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use acm_core_nostd::cache::{
    AddrKey, AddrSlot, CacheConfig, Dest, Lookup, PathCache, PathKey, PathSlot,
};

const KEYS: u16 = 4;

fn expected(v: u32, i: usize) -> u32 {
    (v ^ (i as u32).wrapping_mul(0x9E37_79B9))
        .wrapping_mul(0x85EB_CA6B)
        .rotate_left(i as u32)
}

fn record(lid: u16, v: u32) -> [u8; 64] {
    let mut r = [0u8; 64];
    r[0..4].copy_from_slice(&(lid as u32).to_le_bytes());
    r[4..8].copy_from_slice(&v.to_le_bytes());
    for i in 2..16 {
        r[4 * i..4 * i + 4].copy_from_slice(&expected(v, i).to_le_bytes());
    }
    r
}

/// Ok if `r` is a whole record written for `lid`.
fn check(lid: u16, r: &[u8; 64]) -> Result<(), String> {
    let word = |i: usize| u32::from_le_bytes(r[4 * i..4 * i + 4].try_into().unwrap());
    if word(0) != lid as u32 {
        return Err(format!("record of LID {} returned for LID {lid}", word(0)));
    }
    let v = word(1);
    for i in 2..16 {
        if word(i) != expected(v, i) {
            return Err(format!(
                "torn record for LID {lid}: word {i} is not from version {v}"
            ));
        }
    }
    Ok(())
}

fn key(l: u16) -> PathKey {
    PathKey::new(0, Dest::Lid(l + 1))
}

fn alias(l: u16) -> AddrKey {
    AddrKey::ipv4(0, [10, 0, 0, l as u8 + 1])
}

struct Outcome {
    hits: u64,
    torn: u64,
    first_error: Option<String>,
    busy: u64,
}

/// Runs one writer and `readers` reader threads for at most `limit`; stops early once a torn
/// record was seen if `stop_on_torn`. `broken` selects the unvalidated lookup.
fn run(readers: usize, limit: Duration, broken: bool, stop_on_torn: bool) -> Outcome {
    let p: Box<[PathSlot]> = (0..64).map(|_| PathSlot::new()).collect();
    let a: Box<[AddrSlot]> = (0..16).map(|_| AddrSlot::new()).collect();
    let cache = PathCache::new(p, a, CacheConfig::default()).unwrap();
    let stop = AtomicBool::new(false);
    let hits = AtomicU64::new(0);
    let torn = AtomicU64::new(0);
    let busy = AtomicU64::new(0);
    let first_error = std::sync::Mutex::new(None::<String>);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut w = cache.writer().unwrap();
            for l in 0..KEYS {
                w.insert(&key(l), &record(l + 1, 0), 0, u64::MAX);
                w.alias(&alias(l), &key(l), 0, u64::MAX).unwrap();
            }
            let start = Instant::now();
            let mut v = 1u32;
            while !stop.load(Ordering::Relaxed) && start.elapsed() < limit {
                for _ in 0..256 {
                    let l = (v % KEYS as u32) as u16;
                    if v % 1024 == 0 {
                        // Exercise unlink/reuse: readers must cope with the slot changing key.
                        w.remove(&key(l));
                        w.insert(&key(l), &record(l + 1, v), 0, u64::MAX);
                        w.alias(&alias(l), &key(l), 0, u64::MAX).unwrap();
                    } else {
                        w.insert(&key(l), &record(l + 1, v), 0, u64::MAX);
                    }
                    v = v.wrapping_add(1);
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        for t in 0..readers {
            let (cache, stop, hits, torn, busy, first_error) =
                (&cache, &stop, &hits, &torn, &busy, &first_error);
            s.spawn(move || {
                let mut n = t as u32;
                let (mut h, mut b) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    n = n.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    let l = ((n >> 16) % KEYS as u32) as u16;
                    let via_alias = !broken && (n >> 8) & 3 == 0;
                    let r = if broken {
                        cache.torn_lookup_for_tests(&key(l), 1)
                    } else if via_alias {
                        cache.lookup_addr(&alias(l), 1)
                    } else {
                        cache.lookup(&key(l), 1)
                    };
                    match r {
                        Lookup::Hit { record, .. } => {
                            h += 1;
                            if let Err(e) = check(l + 1, &record) {
                                torn.fetch_add(1, Ordering::Relaxed);
                                first_error.lock().unwrap().get_or_insert(e);
                                if stop_on_torn {
                                    stop.store(true, Ordering::Relaxed);
                                }
                            }
                        }
                        Lookup::Busy => b += 1,
                        Lookup::Miss => {}
                        Lookup::Negative { .. } => panic!("no negative entries were written"),
                    }
                }
                hits.fetch_add(h, Ordering::Relaxed);
                busy.fetch_add(b, Ordering::Relaxed);
            });
        }
    });
    Outcome {
        hits: hits.into_inner(),
        torn: torn.into_inner(),
        first_error: first_error.into_inner().unwrap(),
        busy: busy.into_inner(),
    }
}

#[test]
fn readers_never_see_torn_or_foreign_records() {
    let o = run(2, Duration::from_millis(1500), false, false);
    assert_eq!(o.torn, 0, "{:?}", o.first_error);
    assert!(
        o.hits > 10_000,
        "readers made too little progress: {} hits",
        o.hits
    );
    eprintln!("checked readers: {} hits, {} busy, 0 torn", o.hits, o.busy);
}

#[test]
fn tearing_is_detected_when_validation_is_skipped() {
    let o = run(2, Duration::from_secs(20), true, true);
    assert!(
        o.torn > 0,
        "the torn-read detector found nothing in {} unvalidated hits",
        o.hits
    );
    eprintln!(
        "unvalidated readers: caught {:?} after {} hits",
        o.first_error, o.hits
    );
}
