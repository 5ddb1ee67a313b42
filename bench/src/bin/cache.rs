//! Cache lookup benchmark: the acmrs `PathCache` against what ibacmp uses and the obvious
//! alternatives, at 1k, 100k and 1M entries.
//!
//! * `acmrs PathCache`: lock-free seqlock reads, keyed by `PathKey` (endpoint, GID, constraints).
//! * `glibc tsearch`: what ibacmp actually does (acmp.c: `tfind` over nodes whose key is the
//!   64-byte destination address, compared with `memcmp`).
//! * `BTreeMap<[u8; 64], _>`: an ordered tree with the same 64-byte keys.
//! * `HashMap<PathKey, _>`: std's SipHash table with our key type.
//!
//! Lookups use random keys (a pre-generated random index sequence, not sequential), timed in
//! batches of 64 (see `acm_bench::BatchTimer`). Then the same lookups again while a writer
//! thread rewrites random entries as fast as it can: the acmrs cache needs no lock, ibacmp's
//! model is one mutex per endpoint (`Mutex<tsearch>`, here `Mutex<BTreeMap>`), and
//! `RwLock<HashMap>` is the usual std answer.
//!
//! **Memory floor.** In the same run, for each size, a dependent pointer chase over a buffer as
//! large as the cache's storage (one 64-byte node per cache line, a single random cycle), once in
//! memory advised `MADV_NOHUGEPAGE` and once `MADV_HUGEPAGE`: the cost of one dependent load that
//! misses where the cache's loads miss (L2 / L3 / DRAM, with the same TLB behaviour). Each acmrs
//! row is also printed as multiples of the floor of its page mode ("floor-loads").
//!
//! **RSS per path**: resident set (`/proc/self/statm`) growth from before the storage is
//! allocated to after the fill, divided by the entries (page-table pages included).
//!
//! Usage: `cargo run --release -p acm-bench --bin cache -- [--quick] [--out DIR]
//!         [--sizes 1000,100000,1000000] [--lookups N]`
//!
//! With `--out DIR`: one `.hgrm` per structure, scenario and size, and two percentile plots per
//! size (`cache_idle_<n>.svg`: acmrs against glibc tsearch, ibacmp's structure, and the std
//! maps; `cache_writer_<n>.svg`: the same under a concurrent writer).

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::os::raw::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Instant;

use acm_bench::{advise, floor, heap_bytes, rss_bytes, BatchTimer, SizeOpts, XorShift};
use acm_core_nostd::cache::{
    ep_number, AddrSlot, CacheConfig, Dest, Lookup, PathCache, PathKey, PathSlot,
};
use acm_report::cli::{count, RunOpts};
use acm_report::plot::{write_percentile_svg, Series};
use acm_report::{progress, LatencyHistogram, Summary, Table};
use clap::Parser;

/// Cache lookups: the acmrs PathCache against glibc tsearch (ibacmp's structure) and the std
/// maps, idle and under a concurrent writer, with the memory floor of each size
/// (docs/cache.md). --quick: the CI's smoke run (< 20 s).
#[derive(Parser)]
#[command(name = "cache", version)]
struct Cli {
    #[command(flatten)]
    run: RunOpts,
    #[command(flatten)]
    sizes: SizeOpts,
    /// Timed lookups per measurement [default: 2000000; with --quick 200000]
    #[arg(long, value_name = "N", value_parser = count)]
    lookups: Option<usize>,
}

const BATCH: usize = 64;

/// ibacmp's tree node payload: a 64-byte address key followed by the cached record.
#[repr(C)]
struct Dest64 {
    address: [u8; 64],
    record: [u8; 64],
}

// glibc's <search.h>; not in the `libc` crate.
extern "C" {
    fn tsearch(key: *const c_void, rootp: *mut *mut c_void, compar: Compar) -> *mut c_void;
    fn tfind(key: *const c_void, rootp: *const *mut c_void, compar: Compar) -> *mut c_void;
    fn tdestroy(root: *mut c_void, free_node: extern "C" fn(*mut c_void));
}
type Compar = extern "C" fn(*const c_void, *const c_void) -> c_int;

extern "C" fn compare_dest(a: *const c_void, b: *const c_void) -> c_int {
    // SAFETY: tsearch/tfind only pass pointers we gave them: `Dest64`s that live as long as the
    // tree (nodes are leaked boxes freed in `free_dest`, probes are borrowed for the call).
    unsafe { libc::memcmp(a, b, 64) }
}

extern "C" fn free_dest(p: *mut c_void) {
    // SAFETY: every node key was created by `Box::into_raw(Box<Dest64>)` in `Tsearch::insert`
    // and is freed exactly once, by tdestroy.
    drop(unsafe { Box::from_raw(p as *mut Dest64) });
}

/// A glibc `tsearch` tree keyed like ibacmp's dest trees.
struct Tsearch {
    root: *mut c_void,
}

impl Tsearch {
    fn new() -> Self {
        Tsearch {
            root: std::ptr::null_mut(),
        }
    }

    fn insert(&mut self, address: [u8; 64], record: [u8; 64]) {
        let node = Box::into_raw(Box::new(Dest64 { address, record }));
        // SAFETY: `root` is a valid tree root (null or built by tsearch); `node` is a valid,
        // owned Dest64 whose ownership passes to the tree (freed by `free_dest`). Keys are unique
        // in this benchmark, so tsearch always inserts `node`.
        let r = unsafe { tsearch(node as *const c_void, &mut self.root, compare_dest) };
        assert!(!r.is_null(), "tsearch: out of memory");
    }

    fn find(&self, address: &[u8; 64]) -> Option<u8> {
        // SAFETY: the probe points at 64 readable bytes, which is all `compare_dest` reads from
        // it; `root` is a valid tree. A non-null result points at the node's key pointer, which
        // is a live `Dest64` owned by the tree.
        unsafe {
            let p = tfind(address.as_ptr() as *const c_void, &self.root, compare_dest);
            if p.is_null() {
                None
            } else {
                let d = *(p as *const *const Dest64);
                Some(std::hint::black_box((*d).record)[0])
            }
        }
    }
}

impl Drop for Tsearch {
    fn drop(&mut self) {
        if !self.root.is_null() {
            // SAFETY: `root` was built by tsearch and every key by `Box::into_raw`.
            unsafe { tdestroy(self.root, free_dest) };
        }
    }
}

// SAFETY: the tree is only touched through `&mut self` (insert) or `&self` (tfind, which does not
// modify the tree), and moved as a whole; glibc's tfind is read-only.
unsafe impl Send for Tsearch {}

/// Slots for a cache holding `n` entries (what the cache's own sizing helper recommends).
fn path_slots_for(n: usize) -> usize {
    PathSlot::slots_for(n)
}

/// `n` empty path slots in memory advised `MADV_HUGEPAGE` (or `MADV_NOHUGEPAGE`) *before* it is
/// first touched, so the kernel backs it with 2 MiB pages where it can (THP "madvise" mode,
/// Debian's default) — or, explicitly, with 4 KiB pages.
fn boxed_slots_advised(n: usize, huge: bool) -> Box<[PathSlot]> {
    let mut v: Vec<PathSlot> = Vec::with_capacity(n);
    advise(
        v.as_mut_ptr() as *mut u8,
        n * std::mem::size_of::<PathSlot>(),
        huge,
    );
    v.extend((0..n).map(|_| PathSlot::new()));
    v.into_boxed_slice()
}

/// The keys of entry `i`, computed on the fly (a bijective mix of `i` and a per-size salt gives
/// distinct random-looking GUIDs). Computing them costs a few ns and no memory access, so a
/// lookup's time is the structure's, not a dependent cache miss on a 48 MB array of probe keys
/// (a client's request is in cache when the provider looks it up).
#[derive(Clone, Copy)]
struct Keys {
    salt: u64,
}

impl Keys {
    #[inline(always)]
    fn gid(&self, i: usize) -> [u8; 16] {
        // splitmix64's finaliser: a bijection on u64.
        let mut z = (i as u64) ^ self.salt;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let mut gid = [0u8; 16];
        gid[..8].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
        gid[8..].copy_from_slice(&z.to_be_bytes());
        gid
    }

    #[inline(always)]
    fn path(&self, i: usize) -> PathKey {
        PathKey::new(ep_number(0, 0), Dest::Gid(self.gid(i)))
    }

    #[inline(always)]
    fn addr(&self, i: usize) -> [u8; 64] {
        let mut a = [0u8; 64];
        a[..16].copy_from_slice(&self.gid(i));
        a
    }
}

fn make_keys(rng: &mut XorShift) -> Keys {
    Keys {
        salt: rng.next_u64(),
    }
}

/// Every structure hands out a *copy* of the 64-byte record, as a lookup that answers a client
/// must (the acmrs cache copies by design: readers never hold references into the table).
fn copy_out(r: &[u8; 64]) -> u8 {
    std::hint::black_box(*r)[0]
}

fn record(i: usize, version: u64) -> [u8; 64] {
    let mut r = [0u8; 64];
    r[0] = 1; // "found" marker checked by the lookups
    r[8..16].copy_from_slice(&(i as u64).to_le_bytes());
    r[16..24].copy_from_slice(&version.to_le_bytes());
    r
}

struct Measured {
    name: &'static str,
    scenario: &'static str,
    n: usize,
    summary: Summary,
    per_sec: f64,
    bytes_per_entry: Option<f64>,
    writer_per_sec: Option<f64>,
    /// ns per dependent load over a buffer as large as this structure, same page mode.
    floor_ns: Option<f64>,
    rss_per_entry: Option<f64>,
}

fn save(out: Option<&Path>, tag: &str, h: &LatencyHistogram) {
    if let Some(dir) = out {
        let path = dir.join(format!("{tag}.hgrm"));
        if let Err(e) = h.write_hgrm(&path) {
            eprintln!("warning: cannot write {}: {e}", path.display());
        }
    }
}

/// Runs `lookups` timed lookups of random indices and checks every one was found.
fn timed(order: &[u32], mut lookup: impl FnMut(usize) -> u8) -> (LatencyHistogram, f64) {
    let mut found = 0u64;
    let (h, wall) = BatchTimer { batch: BATCH }.run(order.len(), |i| {
        let r = lookup(order[i] as usize);
        found += r as u64;
        r
    });
    assert!(
        found as usize >= order.len() * 99 / 100,
        "only {found} of {} lookups found their key",
        order.len()
    );
    (h, order.len() as f64 / wall.as_secs_f64())
}

/// The writer thread's loop: `write(i, version)` on random indices until `stop`; returns the
/// number of writes.
fn write_loop(n: usize, stop: &AtomicBool, mut write: impl FnMut(usize, u64)) -> u64 {
    let mut rng = XorShift::new(0xfeed);
    let mut v = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..16 {
            v += 1;
            write(rng.below(n as u64) as usize, v);
        }
    }
    v
}

/// Runs `reader` on this thread while `writer` runs on another; returns the reader's result and
/// the writer's writes per second (over the reader's run time).
fn with_writer<R>(
    reader: impl FnOnce() -> R,
    writer: impl FnOnce(&AtomicBool) -> u64 + Send,
) -> (R, f64) {
    let stop = AtomicBool::new(false);
    let started = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    let (r, wall) = std::thread::scope(|s| {
        let (stop, started, writes) = (&stop, &started, &writes);
        s.spawn(move || {
            started.store(true, Ordering::Release);
            writes.store(writer(stop), Ordering::Relaxed);
        });
        while !started.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        let t = Instant::now();
        let r = reader();
        let wall = t.elapsed();
        stop.store(true, Ordering::Relaxed);
        (r, wall)
    });
    (
        r,
        writes.load(Ordering::Relaxed) as f64 / wall.as_secs_f64(),
    )
}

fn run_size(n: usize, lookups: usize, out: Option<&Path>, results: &mut Vec<Measured>) {
    let mut rng = XorShift::new(0x5eed_0000 + n as u64);
    let keys = make_keys(&mut rng);
    let order: Vec<u32> = (0..lookups).map(|_| rng.below(n as u64) as u32).collect();
    let slots = path_slots_for(n);
    let storage = slots * std::mem::size_of::<PathSlot>();
    let floors = [
        floor(storage, false, &mut rng).ns,
        floor(storage, true, &mut rng).ns,
    ];
    eprintln!(
        "  floor over {} MiB: {:.1} ns per dependent load with 4 KiB pages, {:.1} ns with THP",
        storage >> 20,
        floors[0],
        floors[1]
    );
    let mut plotted: Vec<(&'static str, &'static str, LatencyHistogram)> = Vec::new();
    let mut push = |name,
                    scenario,
                    h: &LatencyHistogram,
                    per_sec,
                    bytes: Option<f64>,
                    wps: Option<f64>,
                    floor: Option<f64>,
                    rss: Option<f64>| {
        let tag = format!("cache_{}_{}_{n}", name_tag(name), scenario);
        progress(format_args!(
            "cache {n} entries: {name}, {scenario}: p50 {:.0} ns",
            h.summary().p50_ns
        ));
        save(out, &tag, h);
        if out.is_some() {
            plotted.push((name, scenario, h.clone()));
        }
        results.push(Measured {
            name,
            scenario,
            n,
            summary: h.summary(),
            per_sec,
            bytes_per_entry: bytes,
            writer_per_sec: wps,
            floor_ns: floor,
            rss_per_entry: rss,
        });
    };
    let per_entry = |before: usize| Some(heap_bytes().saturating_sub(before) as f64 / n as f64);

    // acmrs PathCache: storage for n entries as the cache's sizing helper recommends; slots from
    // an allocation advised MADV_NOHUGEPAGE, and from one advised to use transparent huge pages
    // (what a host should do for large caches: one TLB entry per 2 MiB instead of per 4 KiB).
    for (name, huge) in [("acmrs PathCache", false), ("acmrs PathCache +THP", true)] {
        let before = heap_bytes();
        let rss_before = rss_bytes();
        let paths: Box<[PathSlot]> = boxed_slots_advised(slots, huge);
        let addrs: Box<[AddrSlot]> = AddrSlot::boxed(0);
        let config = CacheConfig {
            seed: 0x1234_5678,
            refresh_ahead: 0,
        };
        let cache = PathCache::new(paths, addrs, config).expect("non-empty storage");
        {
            let mut w = cache.writer().expect("first writer");
            for i in 0..n {
                w.insert(&keys.path(i), &record(i, 0), 0, u64::MAX);
            }
        }
        let bytes = per_entry(before);
        let rss = Some(rss_bytes().saturating_sub(rss_before) as f64 / n as f64);
        assert_eq!(cache.len(), n);
        let floor = Some(floors[huge as usize]);
        let look = |i: usize| match cache.lookup(&keys.path(i), 1) {
            Lookup::Hit { record, .. } => std::hint::black_box(record)[0],
            _ => 0,
        };
        let (h, ps) = timed(&order, look);
        push(name, "idle", &h, ps, bytes, None, floor, rss);
        let ((h, ps), wps) = with_writer(
            || timed(&order, look),
            |stop| {
                // The fill writer was dropped, so the role is free for this thread.
                let mut w = cache.writer().expect("writer role is free");
                write_loop(n, stop, |i, v| {
                    w.insert(&keys.path(i), &record(i, v), 0, u64::MAX);
                })
            },
        );
        push(name, "writer", &h, ps, None, Some(wps), floor, None);
        let s = cache.stats();
        assert_eq!(
            s.misses, 0,
            "every key was inserted and never expires: {s:?}"
        );
        if s.busy > 0 {
            // A lookup gives up after MAX_RETRIES attempts if the writer keeps the slot's
            // sequence odd, i.e. it was preempted mid-update; the caller treats it as a miss.
            eprintln!(
                "note: {name}, {n} entries: {} of {} lookups under the writer returned Busy",
                s.busy,
                s.hits + s.busy
            );
        }
    }

    // glibc tsearch (ibacmp).
    {
        let before = heap_bytes();
        let mut t = Tsearch::new();
        for i in 0..n {
            t.insert(keys.addr(i), record(i, 0));
        }
        let bytes = per_entry(before);
        let (h, ps) = timed(&order, |i| t.find(&keys.addr(i)).unwrap_or(0));
        push(
            "glibc tsearch (ibacmp)",
            "idle",
            &h,
            ps,
            bytes,
            None,
            None,
            None,
        );
    }

    // BTreeMap with 64-byte keys; under a writer: Mutex (ibacmp's one lock per endpoint).
    {
        let before = heap_bytes();
        let mut m: BTreeMap<[u8; 64], [u8; 64]> = BTreeMap::new();
        for i in 0..n {
            m.insert(keys.addr(i), record(i, 0));
        }
        let bytes = per_entry(before);
        let (h, ps) = timed(&order, |i| m.get(&keys.addr(i)).map_or(0, copy_out));
        push("BTreeMap<[u8;64]>", "idle", &h, ps, bytes, None, None, None);
        let m = Mutex::new(m);
        let ((h, ps), wps) = with_writer(
            || {
                timed(&order, |i| {
                    m.lock().unwrap().get(&keys.addr(i)).map_or(0, copy_out)
                })
            },
            |stop| {
                write_loop(n, stop, |i, v| {
                    m.lock().unwrap().insert(keys.addr(i), record(i, v));
                })
            },
        );
        push(
            "Mutex<BTreeMap>",
            "writer",
            &h,
            ps,
            None,
            Some(wps),
            None,
            None,
        );
    }

    // HashMap with our key; under a writer: RwLock.
    {
        let before = heap_bytes();
        let mut m: HashMap<PathKey, [u8; 64]> = HashMap::with_capacity(n);
        for i in 0..n {
            m.insert(keys.path(i), record(i, 0));
        }
        let bytes = per_entry(before);
        let (h, ps) = timed(&order, |i| m.get(&keys.path(i)).map_or(0, copy_out));
        push("HashMap<PathKey>", "idle", &h, ps, bytes, None, None, None);
        let m = RwLock::new(m);
        let ((h, ps), wps) = with_writer(
            || {
                timed(&order, |i| {
                    m.read().unwrap().get(&keys.path(i)).map_or(0, copy_out)
                })
            },
            |stop| {
                write_loop(n, stop, |i, v| {
                    m.write().unwrap().insert(keys.path(i), record(i, v));
                })
            },
        );
        push(
            "RwLock<HashMap>",
            "writer",
            &h,
            ps,
            None,
            Some(wps),
            None,
            None,
        );
    }

    if let Some(dir) = out {
        for (scenario, what) in [
            ("idle", "idle"),
            ("writer", "while a writer thread rewrites random entries"),
        ] {
            // acmrs first (blue), then what ibacmp does (red: tsearch, one mutex per
            // endpoint), then the rest.
            let rank = |name: &str| match name {
                "acmrs PathCache" => 0,
                "glibc tsearch (ibacmp)" | "Mutex<BTreeMap>" => 1,
                _ => 2,
            };
            let mut mine: Vec<_> = plotted.iter().filter(|(_, s, _)| *s == scenario).collect();
            mine.sort_by_key(|(name, _, _)| rank(name));
            let series: Vec<Series<'_>> = mine
                .iter()
                .map(|(name, _, h)| Series {
                    label: if *name == "Mutex<BTreeMap>" {
                        "Mutex<BTreeMap> (ibacmp's model)"
                    } else {
                        name
                    },
                    histogram: h,
                })
                .collect();
            let path = dir.join(format!("cache_{scenario}_{n}.svg"));
            let title =
                format!("cache lookup, {n} entries, {what} (random keys, per-op of {BATCH})");
            match write_percentile_svg(&path, &title, &series) {
                Ok(()) => progress(format_args!("wrote {}", path.display())),
                Err(e) => eprintln!("warning: cannot write {}: {e}", path.display()),
            }
        }
    }
}

fn name_tag(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect::<String>()
        .split('_')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("_")
}

fn main() {
    let args: Cli = acm_report::cli::parse(2);
    let sizes = args.sizes.get(args.run.quick);
    let lookups = args
        .lookups
        .unwrap_or(if args.run.quick { 200_000 } else { 2_000_000 });
    args.run.create_out_or_exit();
    if cfg!(debug_assertions) {
        eprintln!("note: debug build; run with --release for meaningful numbers");
    }
    let t0 = Instant::now();
    let mut results = Vec::new();
    for &n in &sizes {
        progress(format_args!(
            "measuring {n} entries, {lookups} random lookups per structure ..."
        ));
        run_size(n, lookups, args.run.out.as_deref(), &mut results);
    }
    let mut t = Table::new(&[
        "structure",
        "scenario",
        "entries",
        "p50 ns",
        "p99 ns",
        "p99.9 ns",
        "p99.99 ns",
        "max ns",
        "Mlookups/s",
        "B/entry",
        "writer Mupd/s",
    ]);
    for m in &results {
        let mut row = vec![m.name.to_string(), m.scenario.to_string(), m.n.to_string()];
        row.extend(Table::latency_cells(&m.summary));
        row.push(format!("{:.2}", m.per_sec / 1e6));
        row.push(
            m.bytes_per_entry
                .map_or(String::new(), |b| format!("{b:.0}")),
        );
        row.push(
            m.writer_per_sec
                .map_or(String::new(), |w| format!("{:.2}", w / 1e6)),
        );
        t.row(row);
    }
    println!("{}", t.render());
    let mut f = Table::new(&[
        "structure",
        "scenario",
        "entries",
        "floor ns",
        "p50 ns",
        "p50 ×floor",
        "p99 ×floor",
        "p99.9 ×floor",
        "p99.99 ×floor",
        "RSS B/path",
    ]);
    for m in results.iter().filter(|m| m.floor_ns.is_some()) {
        let fl = m.floor_ns.unwrap_or(1.0);
        let s = &m.summary;
        let mut row = vec![
            m.name.to_string(),
            m.scenario.to_string(),
            m.n.to_string(),
            format!("{fl:.1}"),
            format!("{:.1}", s.p50_ns),
        ];
        row.extend(
            [s.p50_ns, s.p99_ns, s.p999_ns, s.p9999_ns]
                .iter()
                .map(|v| format!("{:.2}", v / fl)),
        );
        row.push(m.rss_per_entry.map_or(String::new(), |b| format!("{b:.0}")));
        f.row(row);
    }
    println!("in floor-loads (multiples of one dependent load over a buffer as large as the cache, same page mode):\n");
    println!("{}", f.render());
    println!(
        "random-key lookups, batches of {BATCH} timed together (per-op = batch time / {BATCH}); \
         {} cores; total {:.1} s",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        t0.elapsed().as_secs_f64()
    );
}
