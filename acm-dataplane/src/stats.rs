//! Live latency histograms: cheap enough for the hit path, exact enough for HDR percentiles.
//!
//! * [`Histogram`]: a log-linear array of relaxed atomic buckets with **one writer** at a time
//!   (the core's main thread for hits; for everything else the loop's rounds, one at a time
//!   under its lock, on the dataplane thread or on a core thread that found the loop free):
//!   recording is a bucket
//!   index (a leading-zero count and two shifts), then a load and a store on the bucket and on
//!   the running sum — no read-modify-write, no lock, no allocation. Any thread may take a
//!   [`Snapshot`] at any time.
//! * [`Clock`]: the x86-64 TSC (`rdtsc`) calibrated once against [`Instant`] when the kernel
//!   itself uses the TSC as its clock source (so it is invariant and synchronised across
//!   CPUs), [`Instant`] otherwise.
//! * [`EpStats`]: the histograms of one endpoint (end-to-end spans, the SA round trip, the
//!   legs of a miss inside the provider).
//! * [`InFlight`]: the fixed-capacity table the dataplane remembers requests (and SA queries)
//!   in between hand-over and answer, allocated once.
//!
//! Buckets: values in nanoseconds, exact below 64 ns, then 32 sub-buckets per power of two
//! (the width of a bucket is at most 1/32 = 3.1 % of its values), up to 2^40 ns (18 min;
//! larger values are clamped into the last bucket): [`BUCKETS`] buckets, 9 KiB per histogram.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// log2 of the sub-buckets per power of two.
pub const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
/// The largest value's most significant bit (values ≥ 2^40 ns are clamped).
pub const MAX_MSB: u32 = 39;
/// Buckets per histogram.
pub const BUCKETS: usize = (MAX_MSB - SUB_BITS) as usize * SUB + 2 * SUB;
/// The largest value a histogram tells apart (ns).
pub const MAX_VALUE: u64 = (1 << (MAX_MSB + 1)) - 1;

/// The bucket of value `v` (ns).
#[inline(always)]
pub fn bucket_of(v: u64) -> usize {
    let v = v.min(MAX_VALUE);
    if v < 2 * SUB as u64 {
        return v as usize;
    }
    let shift = 63 - v.leading_zeros() - SUB_BITS;
    (shift as usize) * SUB + (v >> shift) as usize
}

/// The smallest value of bucket `i`.
pub fn bucket_low(i: usize) -> u64 {
    if i < 2 * SUB {
        return i as u64;
    }
    let shift = (i / SUB - 1) as u32;
    ((i % SUB + SUB) as u64) << shift
}

/// The largest value of bucket `i` (inclusive).
pub fn bucket_high(i: usize) -> u64 {
    if i + 1 >= BUCKETS {
        return MAX_VALUE;
    }
    bucket_low(i + 1) - 1
}

/// A single-writer latency histogram (see the module docs).
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    /// An empty histogram (allocates its buckets, once).
    pub fn new() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    /// Records one value of `ns` nanoseconds. **Single writer**: only one thread may record
    /// into a histogram (a second one would lose counts — never undefined behaviour).
    #[inline(always)]
    pub fn record(&self, ns: u64) {
        self.record_n(ns, 1);
    }

    /// Records `ns` as `n` values (a sample standing for `n` events). Single writer, as
    /// [`Histogram::record`].
    #[inline(always)]
    pub fn record_n(&self, ns: u64, n: u64) {
        let b = &self.buckets[bucket_of(ns)];
        b.store(b.load(Relaxed).wrapping_add(n), Relaxed);
        self.sum.store(
            self.sum.load(Relaxed).wrapping_add(ns.wrapping_mul(n)),
            Relaxed,
        );
    }

    /// A copy of the counts. Each bucket is read once, so a snapshot taken while the writer
    /// records holds, per bucket, a count the bucket really had; the buckets are never older
    /// than in an earlier snapshot of the same reader (counts only grow).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            sum_ns: self.sum.load(Relaxed),
            counts: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
        }
    }
}

/// The counts of a [`Histogram`] at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Per-bucket counts ([`BUCKETS`] of them).
    pub counts: Vec<u64>,
    /// Sum of the recorded values (ns), as read (it may lag or lead the buckets by a few
    /// values recorded during the snapshot).
    pub sum_ns: u64,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            counts: vec![0; BUCKETS],
            sum_ns: 0,
        }
    }
}

impl Snapshot {
    /// Number of values (saturating: a snapshot decoded from a report can hold any counts).
    pub fn count(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, c| a.saturating_add(*c))
    }

    /// What was recorded between `earlier` (a snapshot of the same histogram) and this one.
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            counts: self
                .counts
                .iter()
                .zip(earlier.counts.iter().chain(std::iter::repeat(&0)))
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            sum_ns: self.sum_ns.wrapping_sub(earlier.sum_ns),
        }
    }

    /// `(highest value of the bucket, count)` of every non-empty bucket, ascending. The
    /// highest value is what HdrHistogram reports too ("highest equivalent value"), so a
    /// percentile never understates.
    pub fn values(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| (bucket_high(i), *c))
    }

    /// How many values are ≤ `ns` for sure: the buckets that end at or below it (a bucket
    /// that straddles `ns` is counted at the next bound: at most one bucket, ≤ 3.1 %, late).
    pub fn count_le(&self, ns: u64) -> u64 {
        self.counts
            .iter()
            .enumerate()
            .take_while(|(i, _)| bucket_high(*i) <= ns)
            .fold(0u64, |a, (_, c)| a.saturating_add(*c))
    }

    /// An [`hdrhistogram::Histogram`] of the same values (ns, 3 significant digits), for
    /// quantiles and `.hgrm` files.
    pub fn to_hdr(&self) -> hdrhistogram::Histogram<u64> {
        let mut h = hdrhistogram::Histogram::new_with_bounds(1, MAX_VALUE, 3)
            .expect("static histogram bounds are valid");
        for (v, c) in self.values() {
            // In range by construction (1 ..= MAX_VALUE).
            let _ = h.record_n(v.max(1), c);
        }
        h
    }

    /// Adds `other`'s counts (both from histograms with the same buckets).
    pub fn add(&mut self, other: &Snapshot) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_ns = self.sum_ns.wrapping_add(other.sum_ns);
    }
}

/// The latency histograms of one endpoint: three end-to-end spans, the SA round trip, and the
/// legs of a miss inside the provider (docs/stats.md).
#[derive(Default)]
pub struct EpStats {
    /// Cache hits: `resolve()` entry → answer handed to the core (core main thread).
    pub hit: Histogram,
    /// PATH/LID/GID requests that missed: `resolve()` entry → answer sent by the dataplane.
    pub route_miss: Histogram,
    /// NAME/IP/IP6 requests that missed, same span.
    pub addr_miss: Histogram,
    /// SA MAD handed to the core → its reply taken by the dataplane.
    pub sa_rtt: Histogram,
    /// A missed request handed to the loop → the loop's round taking it (on the core's thread
    /// when the loop was free; else the wait for the dataplane thread's next round).
    pub miss_queued: Histogram,
    /// The round taking a missed request → the first query it sent for it (SA or ACM), when
    /// it sent one at once (a request that joins a query already out sends none).
    pub miss_to_query: Histogram,
    /// An SA reply handed to the loop by the core's SA thread (`core` transport) → the round
    /// taking it.
    pub reply_wait: Histogram,
    /// A reply (SA, or ACM from a peer) taken by a round → the first answer it led to,
    /// delivered to the core.
    pub reply_to_answer: Histogram,
}

/// Which histogram of an endpoint a dataplane measurement goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Latency {
    /// [`EpStats::route_miss`].
    RouteMiss,
    /// [`EpStats::addr_miss`].
    AddrMiss,
    /// [`EpStats::sa_rtt`].
    SaRtt,
    /// [`EpStats::miss_queued`].
    MissQueued,
    /// [`EpStats::miss_to_query`].
    MissToQuery,
    /// [`EpStats::reply_wait`].
    ReplyWait,
    /// [`EpStats::reply_to_answer`].
    ReplyToAnswer,
}

impl EpStats {
    /// The dataplane's histogram for `l`.
    pub fn of(&self, l: Latency) -> &Histogram {
        match l {
            Latency::RouteMiss => &self.route_miss,
            Latency::AddrMiss => &self.addr_miss,
            Latency::SaRtt => &self.sa_rtt,
            Latency::MissQueued => &self.miss_queued,
            Latency::MissToQuery => &self.miss_to_query,
            Latency::ReplyWait => &self.reply_wait,
            Latency::ReplyToAnswer => &self.reply_to_answer,
        }
    }
}

/// What kind of request missed (set by the hit path, which classified it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissClass {
    /// PATH / LID / GID.
    Route,
    /// NAME / IP / IP6.
    Address,
}

impl MissClass {
    /// The histogram it is recorded in.
    pub fn latency(self) -> Latency {
        match self {
            MissClass::Route => Latency::RouteMiss,
            MissClass::Address => Latency::AddrMiss,
        }
    }
}

/// The start of a missed request, handed to the dataplane with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MissStamp {
    /// [`Clock::now`] at `resolve()` entry.
    pub at: u64,
    /// [`Clock::now`] when it was handed to the loop (the start of
    /// [`EpStats::miss_queued`]).
    pub handed: u64,
    /// Route or address.
    pub class: MissClass,
}

/// The latency clock: TSC ticks or [`Instant`] nanoseconds, and the conversion to ns.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// `Some(ns per tick × 2^32)` when reading the TSC; `None`: [`Instant`] since `epoch`.
    tsc_ns_per_tick_q32: Option<u64>,
    epoch: Instant,
}

impl Clock {
    /// The TSC when it is usable (x86-64, and the kernel's clock source is `tsc`: invariant,
    /// synchronised across CPUs), calibrated over ~10 ms against [`Instant`] (sleeps: call it
    /// once, at instance start); [`Instant`] otherwise.
    pub fn calibrated() -> Clock {
        let epoch = Instant::now();
        #[cfg(target_arch = "x86_64")]
        if kernel_uses_tsc() {
            let (i0, c0) = (Instant::now(), rdtsc());
            std::thread::sleep(std::time::Duration::from_millis(10));
            let (c1, i1) = (rdtsc(), Instant::now());
            let ns = i1.duration_since(i0).as_nanos() as f64;
            let ticks = c1.wrapping_sub(c0) as f64;
            if ticks > 0.0 && ns > 0.0 {
                return Clock {
                    tsc_ns_per_tick_q32: Some((ns / ticks * 4294967296.0) as u64),
                    epoch,
                };
            }
        }
        Clock::instant()
    }

    /// The [`Instant`] clock.
    pub fn instant() -> Clock {
        Clock {
            tsc_ns_per_tick_q32: None,
            epoch: Instant::now(),
        }
    }

    /// Whether it reads the TSC.
    pub fn is_tsc(&self) -> bool {
        self.tsc_ns_per_tick_q32.is_some()
    }

    /// Ticks per nanosecond (1 for [`Instant`]).
    pub fn ticks_per_ns(&self) -> f64 {
        match self.tsc_ns_per_tick_q32 {
            Some(q) if q > 0 => 4294967296.0 / q as f64,
            _ => 1.0,
        }
    }

    /// Now, in ticks.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.tsc_ns_per_tick_q32.is_some() {
            return rdtsc();
        }
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Nanoseconds from `start` to `end` (ticks; 0 if `end` is earlier).
    #[inline(always)]
    pub fn ns(&self, start: u64, end: u64) -> u64 {
        let d = end.saturating_sub(start);
        match self.tsc_ns_per_tick_q32 {
            Some(q) => ((u128::from(d) * u128::from(q)) >> 32) as u64,
            None => d,
        }
    }

    /// Nanoseconds since `start`.
    #[inline(always)]
    pub fn since(&self, start: u64) -> u64 {
        self.ns(start, self.now())
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rdtsc() -> u64 {
    // rdtsc alone is not ordered: it may execute before the instructions ahead of it have, so
    // an end read could be taken while a hit's DRAM load is still in flight and the span read
    // short by up to that load (measured: a 1M-path hit timed with plain rdtsc showed p50 at
    // 1.6 DRAM loads, ordered 2.0). The lfence waits for every earlier instruction first, as
    // the vDSO's clock_gettime does.
    // SAFETY: lfence (SSE2) and rdtsc exist on every x86-64 CPU and have no memory effects.
    unsafe {
        core::arch::x86_64::_mm_lfence();
        core::arch::x86_64::_rdtsc()
    }
}

#[cfg(target_arch = "x86_64")]
fn kernel_uses_tsc() -> bool {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .is_ok_and(|s| s.trim() == "tsc")
}

/// A fixed-capacity map `u128 key → (start, value)`, allocated once (open addressing, linear
/// probing, backward-shift deletion). The dataplane keeps the requests it gave the resolver
/// here, keyed by (client, tid), and the SA queries it sent, keyed by token.
pub struct InFlight<V: Copy> {
    slots: Box<[Option<(u128, u64, V)>]>,
    len: usize,
    max: usize,
}

impl<V: Copy> InFlight<V> {
    /// Room for `capacity` entries (twice that many slots).
    pub fn new(capacity: usize) -> Self {
        let n = (capacity.max(1) * 2).next_power_of_two();
        InFlight {
            slots: vec![None; n].into_boxed_slice(),
            len: 0,
            max: capacity.max(1),
        }
    }

    fn home(&self, key: u128) -> usize {
        let h = (key as u64 ^ (key >> 64) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> 32) as usize & (self.slots.len() - 1)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Remembers `key`; false when full. A key may be held more than once (two requests of
    /// one client with the same tid): each [`remove`](Self::remove) takes one, the one
    /// inserted first.
    pub fn insert(&mut self, key: u128, start: u64, v: V) -> bool {
        if self.len >= self.max {
            return false;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        while self.slots[i].is_some() {
            i = (i + 1) & mask;
        }
        self.slots[i] = Some((key, start, v));
        self.len += 1;
        true
    }

    /// Takes one of `key`'s entries out (the first inserted).
    pub fn remove(&mut self, key: u128) -> Option<(u64, V)> {
        if self.len == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        let found = loop {
            match self.slots[i] {
                Some((k, s, v)) if k == key => break (s, v),
                Some(_) => i = (i + 1) & mask,
                None => return None,
            }
        };
        self.remove_at(i);
        Some(found)
    }

    /// Empties slot `i` (occupied) and closes the gap.
    fn remove_at(&mut self, i: usize) {
        let mask = self.slots.len() - 1;
        self.slots[i] = None;
        self.len -= 1;
        // Backward shift: move later entries of the run into the hole when their home allows.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        while let Some((k, _, _)) = self.slots[j] {
            let h = self.home(k);
            // Entry at j may move to hole if its home is not in (hole, j] (cyclically).
            let dist_j = j.wrapping_sub(h) & mask;
            let dist_hole = hole.wrapping_sub(h) & mask;
            if dist_hole < dist_j {
                self.slots[hole] = self.slots[j].take();
                hole = j;
            }
            j = (j + 1) & mask;
        }
    }

    /// Drops every entry started before `before` (entries whose answer never came: an SA
    /// reply the full reply queue dropped); returns how many. No allocation.
    pub fn expire(&mut self, before: u64) -> usize {
        let mut dropped = 0;
        let mut i = 0;
        while i < self.slots.len() {
            match self.slots[i] {
                Some((_, s, _)) if s < before => {
                    self.remove_at(i);
                    dropped += 1;
                    // A later entry may have moved into slot i: look at it again.
                }
                _ => i += 1,
            }
        }
        dropped
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn buckets_are_contiguous_and_exact_below_64() {
        for v in 0..64u64 {
            assert_eq!(bucket_of(v), v as usize);
            assert_eq!((bucket_low(v as usize), bucket_high(v as usize)), (v, v));
        }
        assert_eq!(bucket_of(64), 64);
        assert_eq!((bucket_low(64), bucket_high(64)), (64, 65));
        assert_eq!(bucket_of(127), 95);
        assert_eq!((bucket_low(96), bucket_high(96)), (128, 131));
        for i in 0..BUCKETS - 1 {
            assert_eq!(bucket_high(i) + 1, bucket_low(i + 1), "bucket {i}");
            assert_eq!(bucket_of(bucket_low(i)), i);
            assert_eq!(bucket_of(bucket_high(i)), i);
            let (lo, hi) = (bucket_low(i), bucket_high(i));
            // Width at most 1/32 of the bucket's values.
            assert!((hi - lo) * 32 <= lo.max(1), "bucket {i}: {lo}..={hi}");
        }
        assert_eq!(bucket_of(MAX_VALUE), BUCKETS - 1);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_high(BUCKETS - 1), MAX_VALUE);
        assert_eq!(BUCKETS, 1152);
    }

    #[test]
    fn since_keeps_what_was_recorded_between_two_snapshots() {
        let h = Histogram::new();
        h.record(100);
        h.record(5_000);
        let before = h.snapshot();
        h.record(5_000);
        h.record(70_000);
        let d = h.snapshot().since(&before);
        assert_eq!(d.count(), 2);
        assert_eq!(d.sum_ns, 75_000);
        let v: Vec<(u64, u64)> = d.values().collect();
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[0].1, 1);
        assert!((5_000..5_200).contains(&v[0].0), "{v:?}");
        assert!((70_000..72_300).contains(&v[1].0), "{v:?}");
        assert_eq!(h.snapshot().since(&h.snapshot()).count(), 0);
    }

    #[test]
    fn record_sum_count_le() {
        let h = Histogram::new();
        for v in [0, 5, 63, 64, 1000, 1000, 1_000_000] {
            h.record(v);
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 7);
        assert_eq!(s.sum_ns, 1_002_132);
        assert_eq!(s.count_le(63), 3);
        // 1000 lies in 992..=1007: counted at a bound ≥ 1007.
        assert_eq!(s.count_le(1000), 4);
        assert_eq!(s.count_le(1007), 6);
        assert_eq!(s.count_le(u64::MAX), 7);
    }

    #[test]
    fn a_sample_counts_for_the_events_it_stands_for() {
        let h = Histogram::new();
        h.record_n(500, 16);
        h.record_n(2000, 16);
        let s = h.snapshot();
        assert_eq!((s.count(), s.sum_ns), (32, 40_000));
        assert_eq!(s.count_le(600), 16);
    }

    #[test]
    fn quantiles_match_hdrhistogram_within_a_bucket() {
        let h = Histogram::new();
        let mut reference =
            hdrhistogram::Histogram::<u64>::new_with_bounds(1, MAX_VALUE, 3).expect("bounds");
        let mut x: u64 = 0x1234_5678;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Log-uniform-ish over 50 ns .. 50 ms.
            let v = 50 + (x % 1000) * (1u64 << (x >> 60)) * 3;
            h.record(v);
            reference.record(v).unwrap();
        }
        let ours = h.snapshot().to_hdr();
        assert_eq!(ours.len(), reference.len());
        for q in [0.0, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0] {
            let a = ours.value_at_quantile(q) as f64;
            let b = reference.value_at_quantile(q) as f64;
            // Never below, at most one of our buckets (3.1 %) + hdr's own precision above.
            assert!(a >= b * 0.999 && a <= b * 1.035, "q {q}: ours {a} hdr {b}");
        }
    }

    #[test]
    fn single_writer_snapshots_are_consistent() {
        let h = Arc::new(Histogram::new());
        let n = 2_000_000u64;
        let w = {
            let h = h.clone();
            std::thread::spawn(move || {
                for i in 0..n {
                    h.record(i % 5000);
                }
            })
        };
        let mut last = Snapshot::default();
        let mut snaps = 0;
        while !w.is_finished() || snaps == 0 {
            let s = h.snapshot();
            // Counts only grow, bucket by bucket; never more than was recorded.
            for (a, b) in s.counts.iter().zip(&last.counts) {
                assert!(a >= b);
            }
            assert!(s.count() <= n);
            last = s;
            snaps += 1;
        }
        w.join().unwrap();
        let s = h.snapshot();
        assert_eq!(s.count(), n);
        assert_eq!(s.sum_ns, (0..n).map(|i| i % 5000).sum::<u64>());
        assert!(snaps > 0);
    }

    #[test]
    fn clock_measures_sleeps() {
        for c in [Clock::calibrated(), Clock::instant()] {
            let t = c.now();
            std::thread::sleep(std::time::Duration::from_millis(20));
            let ns = c.since(t);
            assert!((19_000_000..200_000_000).contains(&ns), "{c:?}: {ns}");
            assert_eq!(c.ns(10, 5), 0);
        }
    }

    /// What recording costs the hit path (run in release, on an idle core if possible):
    /// `cargo test --release -p acm-dataplane --lib recording_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn recording_cost() {
        let n = 20_000_000u64;
        let per_op = |f: &mut dyn FnMut(u64)| {
            let t = Instant::now();
            for i in 0..n {
                f(std::hint::black_box(i));
            }
            t.elapsed().as_nanos() as f64 / n as f64
        };
        let h = Histogram::new();
        for (name, c) in [("tsc", Clock::calibrated()), ("instant", Clock::instant())] {
            let now = per_op(&mut |_| {
                std::hint::black_box(c.now());
            });
            let start_and_record = per_op(&mut |_| {
                let t0 = c.now();
                h.record(c.since(std::hint::black_box(t0)));
            });
            println!(
                "{name} (is_tsc {}): clock read {now:.1} ns; start + end read + record {start_and_record:.1} ns",
                c.is_tsc()
            );
        }
        let record = per_op(&mut |i| h.record(i & 0xffff));
        let empty = per_op(&mut |i| {
            std::hint::black_box(i);
        });
        println!(
            "record alone {:.1} ns (loop overhead {empty:.1} ns)",
            record - empty
        );
    }

    #[test]
    fn in_flight_table_against_a_reference_map() {
        use std::collections::{HashMap, VecDeque};
        let mut x: u64 = 0x9e37_79b9;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut p: InFlight<u64> = InFlight::new(48);
        let mut r: HashMap<u128, VecDeque<(u64, u64)>> = HashMap::new();
        let mut len = 0usize;
        for step in 0..200_000u64 {
            // Few distinct keys, so runs collide, wrap and repeat keys.
            let key = u128::from(next() % 80) * 0x1_0000_0001;
            match next() % 8 {
                0..=3 => {
                    let ok = p.insert(key, step, step ^ 7);
                    assert_eq!(ok, len < 48);
                    if ok {
                        r.entry(key).or_default().push_back((step, step ^ 7));
                        len += 1;
                    }
                }
                4..=6 => {
                    let want = r.get_mut(&key).and_then(|q| q.pop_front());
                    assert_eq!(p.remove(key), want, "step {step}");
                    len -= usize::from(want.is_some());
                }
                _ => {
                    let before = step.saturating_sub(next() % 64);
                    let mut n = 0;
                    for q in r.values_mut() {
                        let k = q.len();
                        q.retain(|(s, _)| *s >= before);
                        n += k - q.len();
                    }
                    assert_eq!(p.expire(before), n, "step {step}");
                    len -= n;
                }
            }
            assert_eq!(p.len(), len);
        }
    }

    #[test]
    fn in_flight_table_insert_remove_full_expire() {
        let mut p: InFlight<u8> = InFlight::new(100);
        for k in 0..100u128 {
            assert!(p.insert((k << 64) | (k * 7), k as u64, k as u8));
        }
        assert!(!p.insert(1 << 100, 0, 0), "full");
        assert_eq!(p.len(), 100);
        for k in (0..100u128).step_by(2) {
            assert_eq!(p.remove((k << 64) | (k * 7)).map(|x| x.1), Some(k as u8));
        }
        assert_eq!(p.remove(0), None);
        // The same key twice: both held, the first inserted comes out first.
        assert!(p.insert(0, 1, 1) && p.insert(0, 2, 2));
        assert_eq!(
            (p.remove(0), p.remove(0), p.remove(0)),
            (Some((1, 1)), Some((2, 2)), None)
        );
        for k in (1..100u128).step_by(2) {
            assert_eq!(
                p.remove((k << 64) | (k * 7)),
                Some((k as u64, k as u8)),
                "key {k}"
            );
        }
        assert!(p.is_empty());
        for k in 0..50u128 {
            p.insert(k, k as u64, 0);
        }
        assert_eq!(p.expire(10), 10);
        assert_eq!(p.len(), 40);
        assert_eq!(p.remove(5), None);
        assert_eq!(p.remove(10), Some((10, 0)));
        for k in 11..50u128 {
            assert_eq!(p.remove(k), Some((k as u64, 0)), "key {k} after expire");
        }
        // Expiry in a crowded table (long runs that wrap around) keeps every survivor.
        let mut p: InFlight<u8> = InFlight::new(64);
        for k in 0..64u128 {
            assert!(p.insert(k * 1_000_003, k as u64, 0));
        }
        assert_eq!(p.expire(32), 32);
        for k in 32..64u128 {
            assert_eq!(p.remove(k * 1_000_003), Some((k as u64, 0)));
        }
        assert!(p.is_empty());
        p.clear();
        assert!(p.is_empty());
    }
}

/// The loop's latency bookkeeping ([`crate::plane::Plane::with_stats`]) over a fake core that
/// answers every SA MAD at once: an SA-only endpoint, route misses matched to their answers by
/// (client, tid), SA round trips by token.
#[cfg(test)]
mod plane_tests {
    use super::*;
    use crate::plane::{Control, CoreIo, HostCache, HostWriter, Inbox, Plane, SaReply};
    use crate::worker::{Poller, Worker};
    use acm_core_nostd::cache::{
        ep_number, AddrSlot, CacheConfig, CacheWriter, PathCache, PathSlot,
    };
    use acm_core_nostd::resolver::{
        Answer, Capacities, Config, Counter, EpId, HeapStorage, Kind, MsgBuf, Request, Resolver,
    };
    use acm_core_nostd::sim::{lid_msg, node_ep_config, node_gid, node_lid};
    use acm_core_nostd::wire::path_record::PathRecord;
    use acm_core_nostd::wire::sa::{first_record, first_record_mut};
    use std::sync::{Arc, Mutex};

    struct Core {
        inbox: Arc<Inbox>,
        answers: Arc<Mutex<Vec<Answer>>>,
        sa_sent: Arc<Mutex<usize>>,
        clock: Clock,
        /// What happened, in order: "send", "answer", "count …" here; the sink adds the
        /// latencies.
        order: Arc<Mutex<Vec<String>>>,
    }

    impl CoreIo for Core {
        fn send_sa(&mut self, _ep: EpId, token: u64, mad: &[u8; 256]) -> bool {
            *self.sa_sent.lock().unwrap() += 1;
            self.order.lock().unwrap().push("send".into());
            let mut reply = *mad;
            reply[3] = 0x81;
            if u16::from_be_bytes([mad[16], mad[17]]) == 0x0035 {
                let dlid = PathRecord::new_unchecked(&first_record(mad)[..]).dlid();
                let mut p = PathRecord::new_unchecked(&mut first_record_mut(&mut reply)[..]);
                p.set_dgid(node_gid(usize::from(dlid) - 1));
                p.set_sgid(node_gid(0));
                p.set_dlid(dlid);
                p.set_slid(node_lid(0));
                p.set_reversible_numpath(true, 0);
                p.set_pkey(0xffff);
            } else {
                reply[92..94].copy_from_slice(&0xc001u16.to_be_bytes());
            }
            self.inbox.reply(SaReply {
                token,
                umad_status: 0,
                mad: reply,
                handed: self.clock.now(),
            });
            true
        }
        fn answer(&mut self, a: &Answer, _msg: &mut MsgBuf) {
            self.answers.lock().unwrap().push(*a);
            self.order.lock().unwrap().push("answer".into());
        }
        fn count(&mut self, _ep: EpId, c: Counter) {
            self.order.lock().unwrap().push(format!("count {c:?}"));
        }
        fn log(&mut self, _level: u8, _text: &str) {}
        fn log_enabled(&self, _level: u8) -> bool {
            false
        }
    }

    #[test]
    fn misses_are_timed_to_their_answers_and_sa_queries_to_their_replies() {
        let waker = Worker::new_waker();
        let inbox = Arc::new(Inbox::new(64, 64, waker.clone()));
        let cache: Arc<HostCache> = Arc::new(
            PathCache::new(
                PathSlot::boxed(256),
                AddrSlot::boxed(64),
                CacheConfig::default(),
            )
            .unwrap(),
        );
        let answers = Arc::new(Mutex::new(Vec::new()));
        let sa_sent = Arc::new(Mutex::new(0));
        let clock = Clock::calibrated();
        let order = Arc::new(Mutex::new(Vec::new()));
        let core = Core {
            inbox: inbox.clone(),
            answers: answers.clone(),
            sa_sent: sa_sent.clone(),
            clock,
            order: order.clone(),
        };
        let caps = Capacities {
            requests: 64,
            answer_reserve: 4,
            jobs: 16,
            sa_inflight: 8,
            addrs: 32,
            endpoints: 4,
            preloads: 4,
        };
        let make = Box::new(move |w: HostWriter| {
            Resolver::new(Config::default(), HeapStorage::new(caps), w, 7).ok()
        });
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let sink = {
            let (r, o) = (recorded.clone(), order.clone());
            Box::new(move |ep: EpId, what: Latency, ns: u64| {
                o.lock().unwrap().push(format!("{what:?}"));
                r.lock().unwrap().push((ep, what, ns))
            })
        };
        let writer = CacheWriter::take(cache).unwrap();
        let mut plane = Plane::new(make, writer, inbox.clone(), core, waker.epoch())
            .unwrap()
            .with_stats(clock, 64, sink);
        inbox.control(Control::Open {
            ep: EpId(0),
            cache_ep: ep_number(0, 0),
            cfg: node_ep_config(0),
            ud: None,
            routes: Vec::new(),
            addrs: Arc::new(Vec::new()),
        });
        let stamp = |class| {
            let at = clock.now();
            Some(MissStamp {
                at,
                handed: at,
                class,
            })
        };
        // Two clients, the same tid; a third request not stamped (not timed).
        let m = lid_msg(2, false, 42);
        assert!(inbox.hand_over(
            &Request::new(EpId(0), ep_number(0, 0), 5, Kind::Resolve, &m),
            stamp(MissClass::Route)
        ));
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(inbox.hand_over(
            &Request::new(EpId(0), ep_number(0, 0), 6, Kind::Resolve, &m),
            stamp(MissClass::Route)
        ));
        let m3 = lid_msg(3, false, 43);
        assert!(inbox.hand_over(
            &Request::new(EpId(0), ep_number(0, 0), 7, Kind::Resolve, &m3),
            None
        ));
        for _ in 0..100 {
            plane.poll(Instant::now());
            if answers.lock().unwrap().len() == 3 {
                break;
            }
        }
        let a = answers.lock().unwrap().clone();
        assert_eq!(a.len(), 3, "{a:?}");
        assert!(
            a.iter()
                .all(|a| a.status == acm_core_nostd::wire::client::Status::Success),
            "{a:?}"
        );
        let r = recorded.lock().unwrap().clone();
        let of = |l: Latency| {
            r.iter()
                .filter(|x| x.1 == l)
                .map(|x| x.2)
                .collect::<Vec<_>>()
        };
        let misses = of(Latency::RouteMiss);
        assert_eq!(misses.len(), 2, "{r:?}");
        // Client 5 waited at least the 2 ms before client 6 came; both are under a second.
        assert!(misses.iter().any(|&ns| ns >= 2_000_000), "{misses:?}");
        assert!(misses.iter().all(|&ns| ns < 1_000_000_000), "{misses:?}");
        assert!(of(Latency::AddrMiss).is_empty());
        // Every SA MAD sent (paths; a join only with a UD QP) got its round trip.
        assert_eq!(of(Latency::SaRtt).len(), *sa_sent.lock().unwrap(), "{r:?}");
        assert!(!of(Latency::SaRtt).is_empty());
        assert!(r.iter().all(|x| x.0 == EpId(0)));
        // The legs: each stamped request was taken by a round; client 5's went out as an SA
        // query at once (client 6 joined it: no query of its own); every SA reply waited in
        // the inbox (a round later) and led to answers. Each leg is within its miss.
        let longest = misses.iter().copied().max().unwrap();
        let queued = of(Latency::MissQueued);
        assert_eq!(queued.len(), 2, "{r:?}");
        // Client 5 waited in the inbox for the 2 ms before the first round.
        assert!(queued.iter().any(|&ns| ns >= 2_000_000), "{queued:?}");
        let to_query = of(Latency::MissToQuery);
        assert_eq!(to_query.len(), 1, "{r:?}");
        assert_eq!(
            of(Latency::ReplyWait).len(),
            of(Latency::SaRtt).len(),
            "{r:?}"
        );
        let to_answer = of(Latency::ReplyToAnswer);
        assert!(!to_answer.is_empty(), "{r:?}");
        for l in [queued, to_query, of(Latency::ReplyWait), to_answer] {
            assert!(l.iter().all(|&ns| ns <= longest), "{l:?} vs {longest}");
        }
        // The bookkeeping is not on a miss's way: a request's queue wait is recorded after
        // its query went out (client 5's, the first leg that ends at a query), a reply's round
        // trip and wait after the answers it led to (the last reply answers client 7).
        let o = order.lock().unwrap().clone();
        let first = |what: &str| o.iter().position(|x| x == what).unwrap();
        let last = |what: &str| o.iter().rposition(|x| x == what).unwrap();
        assert!(first("MissToQuery") < first("MissQueued"), "{o:?}");
        // Nor are the counters: client 5's query is counted after it left.
        assert!(first("MissToQuery") < first("count RouteQuery"), "{o:?}");
        assert!(last("answer") < last("SaRtt"), "{o:?}");
        assert!(last("answer") < last("ReplyWait"), "{o:?}");
        assert_eq!(
            plane.misses_tracked(),
            0,
            "every answered miss is forgotten"
        );

        // A stamped request the cache answers in its own round (the path arrived after the
        // caller's front looked): timed too, and nothing of it stays behind.
        assert!(inbox.hand_over(
            &Request::new(
                EpId(0),
                ep_number(0, 0),
                8,
                Kind::Resolve,
                &lid_msg(2, false, 44)
            ),
            stamp(MissClass::Route)
        ));
        plane.poll(Instant::now());
        assert_eq!(answers.lock().unwrap().len(), 4);
        assert_eq!(
            *sa_sent.lock().unwrap(),
            of(Latency::SaRtt).len(),
            "no query"
        );
        // Counted before it is answered.
        let o = order.lock().unwrap().clone();
        let hit = o.iter().rposition(|x| x == "count RouteCache").unwrap();
        assert!(
            hit < o.iter().rposition(|x| x == "answer").unwrap(),
            "{o:?}"
        );
        let r = recorded.lock().unwrap().clone();
        assert_eq!(r.iter().filter(|x| x.1 == Latency::RouteMiss).count(), 3);
        assert_eq!(r.iter().filter(|x| x.1 == Latency::MissQueued).count(), 3);
        assert_eq!(
            plane.misses_tracked(),
            0,
            "answered in its round: not remembered"
        );
    }
}
