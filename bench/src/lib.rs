//! Shared helpers for the acmrs benchmarks (`src/bin/*.rs`).
//!
//! * [`LatencyHistogram`]: an HDR histogram of per-operation latencies recorded in picoseconds
//!   (so batch-averaged nanosecond-scale operations keep their precision), with
//!   [`LatencyHistogram::summary`] for the usual percentiles and
//!   [`LatencyHistogram::write_hgrm`] for the standard `.hgrm` percentile-distribution text
//!   format (values in microseconds, as HdrHistogram's plotter expects).
//! * [`BatchTimer`]: times operations in batches to amortise the timer's own cost.
//! * [`Table`]: a plain aligned text table for results.
//! * [`heap_bytes`]: bytes currently allocated from the C heap (glibc `mallinfo2`), for
//!   bytes-per-entry figures that also see memory allocated by C code.
//! * [`Args`]: the tiny command-line parser the bench binaries share (`--quick`, `--out DIR`).
//! * [`XorShift`]: a deterministic PRNG for key sets and access orders.
//! * [`floor`]: the memory floor (a dependent pointer chase as large as a cache), and
//!   [`advise`] (THP or not before first touch).
//! * [`plot`]: percentile-distribution plots (SVG) of several histograms in one picture.
//! * [`progress`]: one line per benchmark phase on stderr, with the elapsed time.
//! * [`private_net`]: a private network namespace with a larger Unix datagram queue, for the
//!   benches that drive a simulated fabric with bursts.
//! * [`client`]: the ACM client of the daemon benches (`miss`, `addr`): connections, answers,
//!   counters, bursts.
//! * [`now_utc`]: the wall-clock time for a report's header.
//! * [`fabric_bench_main`]: the `main` of those daemon benches (command line, namespace, report).

#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

pub mod client;
pub mod plot;

/// The environment variable that carries [`progress`]'s start time (Unix time in µs) to child
/// processes, so a measuring child's lines continue the parent's clock.
pub const PROGRESS_EPOCH_ENV: &str = "ACM_BENCH_PROGRESS_EPOCH_US";

fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// When [`progress`] started counting, as `(Instant, Unix µs)`: the first call in the process,
/// or the parent's start from [`PROGRESS_EPOCH_ENV`].
fn progress_start() -> (Instant, u64) {
    static START: std::sync::OnceLock<(Instant, u64)> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        let (now, now_us) = (Instant::now(), unix_us());
        let parent = std::env::var(PROGRESS_EPOCH_ENV)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&us| us <= now_us);
        match parent {
            Some(us) => (
                now.checked_sub(Duration::from_micros(now_us - us))
                    .unwrap_or(now),
                us,
            ),
            None => (now, now_us),
        }
    })
}

/// Prints one progress line on stderr, `[  12.3 s] text`, timed from the first call in the
/// process (or from the parent's, see [`progress_env`]). Benchmarks call it at the start of
/// each phase, so a long run shows where it is.
pub fn progress(text: impl std::fmt::Display) {
    let t = progress_start().0.elapsed();
    eprintln!("[{:7.1} s] {text}", t.as_secs_f64());
}

/// `(name, value)` of the environment variable to give a child process so that its
/// [`progress`] lines use this process's clock.
pub fn progress_env() -> (&'static str, String) {
    (PROGRESS_EPOCH_ENV, progress_start().1.to_string())
}

/// Percentiles of one latency distribution, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    /// Number of recorded operations.
    pub count: u64,
    /// Mean.
    pub mean_ns: f64,
    /// Median.
    pub p50_ns: f64,
    /// 99th percentile.
    pub p99_ns: f64,
    /// 99.9th percentile.
    pub p999_ns: f64,
    /// 99.99th percentile.
    pub p9999_ns: f64,
    /// Largest recorded value.
    pub max_ns: f64,
}

/// An HDR histogram of latencies, recorded in picoseconds, 3 significant digits, 1 ps .. 1 h.
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    h: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

const PS_PER_NS: f64 = 1000.0;

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        let h = Histogram::new_with_bounds(1, 3_600_000_000_000_000, 3)
            .expect("static histogram bounds are valid");
        LatencyHistogram { h }
    }

    /// Records one operation that took `d`.
    pub fn record(&mut self, d: Duration) {
        self.record_ps(
            d.as_nanos().saturating_mul(1000).min(u64::MAX as u128) as u64,
            1,
        );
    }

    /// Records `count` operations of `ps` picoseconds each (values beyond 1 h are clamped).
    pub fn record_ps(&mut self, ps: u64, count: u64) {
        let v = ps.clamp(1, self.h.high());
        // In range by construction, so this cannot fail.
        let _ = self.h.record_n(v, count);
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        let _ = self.h.add(&other.h);
    }

    /// The underlying histogram (values in picoseconds).
    pub fn raw(&self) -> &Histogram<u64> {
        &self.h
    }

    /// The usual percentiles.
    pub fn summary(&self) -> Summary {
        let q = |p: f64| self.h.value_at_quantile(p) as f64 / PS_PER_NS;
        Summary {
            count: self.h.len(),
            mean_ns: self.h.mean() / PS_PER_NS,
            p50_ns: q(0.5),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            p9999_ns: q(0.9999),
            max_ns: self.h.max() as f64 / PS_PER_NS,
        }
    }

    /// The `.hgrm` text (HdrHistogram's `outputPercentileDistribution` format), values in
    /// microseconds.
    pub fn hgrm(&self) -> String {
        let scale = 1_000_000.0; // ps per µs
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:>12} {:>14} {:>10} {:>14}\n",
            "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
        );
        let mut total = 0u64;
        for v in self.h.iter_quantiles(5) {
            total += v.count_since_last_iteration();
            let q = v.quantile_iterated_to();
            let inv = if q < 1.0 {
                format!("{:14.2}", 1.0 / (1.0 - q))
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "{:12.6} {:2.12} {:10} {}",
                v.value_iterated_to() as f64 / scale,
                q,
                total,
                inv
            );
        }
        let _ = writeln!(
            s,
            "#[Mean    = {:12.6}, StdDeviation   = {:12.6}]",
            self.h.mean() / scale,
            self.h.stdev() / scale
        );
        let _ = writeln!(
            s,
            "#[Max     = {:12.6}, Total count    = {:12}]",
            self.h.max() as f64 / scale,
            self.h.len()
        );
        let buckets = self.h.buckets();
        let _ = writeln!(
            s,
            "#[Buckets = {:12}, SubBuckets     = {:12}]",
            buckets,
            self.h.distinct_values()
        );
        s
    }

    /// Writes [`hgrm`](Self::hgrm) to `path` (atomically: via a `.tmp` file and rename).
    pub fn write_hgrm(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("hgrm.tmp");
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(self.hgrm().as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    }
}

/// Times operations in batches of `batch`, recording the per-operation average of each batch.
///
/// Reading the clock costs ~20 ns (vDSO `clock_gettime`), as much as a cache hit; timing each
/// lookup would mostly measure the clock. Timing 64 at a time and recording `elapsed / 64` for
/// each of them amortises that to well under 1 ns per operation. The price: a single slow
/// operation inside a batch is spread over the batch, so high percentiles are percentiles of
/// *batch averages*; the max column still shows a batch that contained a stall.
#[derive(Clone, Copy, Debug)]
pub struct BatchTimer {
    /// Operations per timed batch.
    pub batch: usize,
}

impl BatchTimer {
    /// Runs `op(i)` for `i` in `0..n` in timed batches and returns the histogram and the total
    /// wall time. The result of `op` is passed through `black_box` so it is not optimised away.
    pub fn run<T>(&self, n: usize, mut op: impl FnMut(usize) -> T) -> (LatencyHistogram, Duration) {
        let mut h = LatencyHistogram::new();
        let batch = self.batch.max(1);
        let start = Instant::now();
        let mut i = 0;
        while i < n {
            let end = (i + batch).min(n);
            let t0 = Instant::now();
            for j in i..end {
                std::hint::black_box(op(j));
            }
            let ps = t0.elapsed().as_nanos().saturating_mul(1000) / (end - i) as u128;
            h.record_ps(ps.min(u64::MAX as u128) as u64, (end - i) as u64);
            i = end;
        }
        (h, start.elapsed())
    }
}

/// A result table printed with aligned columns.
#[derive(Clone, Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (missing cells print empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The standard latency cells: p50, p99, p99.9, p99.99, max (ns, 1 decimal).
    pub fn latency_cells(s: &Summary) -> Vec<String> {
        [s.p50_ns, s.p99_ns, s.p999_ns, s.p9999_ns, s.max_ns]
            .iter()
            .map(|v| format!("{v:.1}"))
            .collect()
    }

    /// [`latency_cells`](Self::latency_cells) as multiples of `floor_ns` (2 decimals): the
    /// `hit ×floor` rows.
    pub fn floor_cells(s: &Summary, floor_ns: f64) -> Vec<String> {
        [s.p50_ns, s.p99_ns, s.p999_ns, s.p9999_ns, s.max_ns]
            .iter()
            .map(|v| format!("{:.2}", v / floor_ns))
            .collect()
    }

    /// Renders the table as GitHub-flavoured Markdown (readable as plain text too).
    pub fn render(&self) -> String {
        let cols = self
            .header
            .len()
            .max(self.rows.iter().map(Vec::len).max().unwrap_or(0));
        let cell = |r: &Vec<String>, i: usize| r.get(i).cloned().unwrap_or_default();
        let mut w = vec![3usize; cols];
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (i, wi) in w.iter_mut().enumerate() {
                *wi = (*wi).max(cell(r, i).chars().count());
            }
        }
        let line = |r: &Vec<String>| {
            let mut s = String::from("|");
            for (i, wi) in w.iter().enumerate() {
                let c = cell(r, i);
                if i == 0 {
                    let _ = write!(s, " {c:<wi$} |");
                } else {
                    let _ = write!(s, " {c:>wi$} |");
                }
            }
            s
        };
        let mut out = line(&self.header);
        out.push('\n');
        out.push('|');
        for (i, wi) in w.iter().enumerate() {
            out.push_str(&"-".repeat(wi + 1));
            out.push_str(if i == 0 { "-|" } else { ":|" });
        }
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
            out.push('\n');
        }
        out
    }
}

/// Bytes currently allocated from the C heap, including `mmap`ed large blocks (glibc
/// `mallinfo2`: `uordblks + hblkhd`). Rust's global allocator is the system `malloc`, so this
/// sees Rust and C allocations alike.
pub fn heap_bytes() -> usize {
    // SAFETY: mallinfo2 takes no arguments, only reads allocator statistics, and returns a plain
    // struct by value; glibc ≥ 2.33 provides it (Debian 12 ships 2.36).
    let m = unsafe { libc::mallinfo2() };
    m.uordblks + m.hblkhd
}

/// A deterministic xorshift64* generator.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed` (0 is replaced by a fixed non-zero seed).
    pub fn new(seed: u64) -> Self {
        XorShift(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() >> 32) * n) >> 32
    }
}

/// Command-line options shared by the bench binaries.
#[derive(Clone, Debug, Default)]
pub struct Args {
    /// `--quick`: a short CI smoke run.
    pub quick: bool,
    /// `--out DIR`: where `.hgrm` files go (created if missing).
    pub out: Option<PathBuf>,
    /// Anything else, as `(flag, value)` for `--flag value` / `--flag=value`, or `(flag, "")`.
    pub rest: Vec<(String, String)>,
}

impl Args {
    /// Parses `std::env::args()`; flags in `with_value` take the next argument as their value.
    /// Returns an error text for `--help` or a malformed command line.
    pub fn parse(usage: &str, with_value: &[&str]) -> Result<Args, String> {
        Self::parse_from(std::env::args().skip(1), usage, with_value)
    }

    /// [`parse`](Self::parse) over explicit arguments.
    pub fn parse_from(
        args: impl IntoIterator<Item = String>,
        usage: &str,
        with_value: &[&str],
    ) -> Result<Args, String> {
        let mut a = Args::default();
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) => (f.to_string(), Some(v.to_string())),
                None => (arg.clone(), None),
            };
            let mut value = |f: &str| match inline.clone() {
                Some(v) => Ok(v),
                None => it
                    .next()
                    .ok_or_else(|| format!("{f} needs a value\n{usage}")),
            };
            match flag.as_str() {
                "--help" | "-h" => return Err(usage.to_string()),
                "--quick" => a.quick = true,
                "--out" => a.out = Some(PathBuf::from(value("--out")?)),
                f if with_value.contains(&f) => {
                    let v = value(f)?;
                    a.rest.push((f.to_string(), v));
                }
                f => return Err(format!("unknown argument {f}\n{usage}")),
            }
        }
        Ok(a)
    }

    /// Whether `flag` was given (a value flag, or a switch [`fabric_bench_main`] took out).
    pub fn has(&self, flag: &str) -> bool {
        self.rest.iter().any(|(f, _)| f == flag)
    }

    /// The value of `--flag`, if given.
    pub fn value(&self, flag: &str) -> Option<&str> {
        self.rest
            .iter()
            .rev()
            .find(|(f, _)| f == flag)
            .map(|(_, v)| v.as_str())
    }

    /// Every `--opt name=value`, in order, as `(name, value)` (each trimmed); `usage` ends the
    /// error for one without `=`.
    pub fn opts(&self, usage: &str) -> Result<Vec<(String, String)>, String> {
        let mut opts = Vec::new();
        for (f, v) in &self.rest {
            if f == "--opt" {
                let (k, v) = v
                    .split_once('=')
                    .ok_or_else(|| format!("--opt {v}: name=value\n{usage}"))?;
                opts.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        Ok(opts)
    }

    /// `--sizes a,b,c` (see [`parse_counts`]), else the benches' default sizes: 1 000 and
    /// 100 000 entries, plus 1 000 000 without `--quick`.
    pub fn sizes(&self) -> Result<Vec<usize>, String> {
        match self.value("--sizes") {
            Some(s) => parse_counts(s),
            None if self.quick => Ok(vec![1_000, 100_000]),
            None => Ok(vec![1_000, 100_000, 1_000_000]),
        }
    }

    /// A parsed command line, or its message printed and exit 2 (`--help`, a bad line).
    pub fn or_exit(parsed: Result<Args, String>) -> Args {
        parsed.unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        })
    }

    /// The `--out` directory created (exit 1 if it cannot be) and [`sizes`](Self::sizes)
    /// (exit 2 with `usage` if they do not parse): the start of every sized bench.
    pub fn out_and_sizes_or_exit(&self, usage: &str) -> Vec<usize> {
        if let Err(e) = self.create_out() {
            eprintln!("{e}");
            std::process::exit(1);
        }
        self.sizes().unwrap_or_else(|e| {
            eprintln!("--sizes: {e}\n{usage}");
            std::process::exit(2)
        })
    }

    /// Creates the `--out` directory, if one was given.
    pub fn create_out(&self) -> Result<(), String> {
        match &self.out {
            Some(dir) => std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display())),
            None => Ok(()),
        }
    }
}

/// `file` next to this executable (a library or binary the same `cargo build` made), or an
/// error saying which `build` command makes it.
pub fn sibling(file: &str, build: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let p = exe.with_file_name(file);
    if p.exists() {
        Ok(p)
    } else {
        Err(format!("{} missing: {build}", p.display()))
    }
}

/// A comma-separated list of counts (`_` allowed as a digit separator), each above 0.
pub fn parse_counts(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|x| match x.trim().replace('_', "").parse::<usize>() {
            Ok(0) => Err(format!("{x:?} must be above 0")),
            Ok(n) => Ok(n),
            Err(e) => Err(format!("bad number {x:?}: {e}")),
        })
        .collect()
}

/// Advises `[ptr, ptr + bytes)` (rounded inwards to 2 MiB) `MADV_HUGEPAGE` or
/// `MADV_NOHUGEPAGE` before it is first touched.
pub fn advise(ptr: *mut u8, bytes: usize, huge: bool) {
    let page = 2 << 20;
    let (start, end) = if huge {
        (
            (ptr as usize).next_multiple_of(page),
            (ptr as usize + bytes) / page * page,
        )
    } else {
        // NOHUGEPAGE: cover every 4 KiB page of the buffer.
        (
            (ptr as usize) / 4096 * 4096,
            (ptr as usize + bytes).next_multiple_of(4096),
        )
    };
    if end > start {
        let advice = if huge {
            libc::MADV_HUGEPAGE
        } else {
            libc::MADV_NOHUGEPAGE
        };
        // SAFETY: [start, end) lies inside (or, for NOHUGEPAGE, on the pages of) an allocation
        // the caller owns; madvise only changes how the kernel backs those pages, never their
        // contents or validity. Failure just means the default page size.
        let r = unsafe { libc::madvise(start as *mut libc::c_void, end - start, advice) };
        if r != 0 {
            eprintln!("note: madvise failed: {}", std::io::Error::last_os_error());
        }
    }
}

/// This process's resident set size in bytes (`/proc/self/statm`, field 2; 0 if unreadable).
pub fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// This process's anonymous memory backed by transparent huge pages (`AnonHugePages` of
/// `/proc/self/smaps_rollup`), bytes; 0 if unknown.
pub fn anon_huge_bytes() -> usize {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("AnonHugePages:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<usize>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The memory floor of a buffer (see [`floor`]).
pub struct Floor {
    /// ns per dependent load: the median of [`per_load`](Self::per_load).
    pub ns: f64,
    /// Per-load time of each timed block of [`FLOOR_BLOCK`] dependent loads (the block's time
    /// divided by its loads): the floor's distribution, for the hit plots.
    pub per_load: LatencyHistogram,
    /// [`FLOOR_SINGLES`] dependent loads of the same chase, each timed alone (ordered TSC reads
    /// around it, the span including the timer's own cost, [`timer_ns`](Self::timer_ns)): the
    /// spread of one DRAM access, which a hit that makes one inherits (a block's average
    /// hides it).
    pub single: LatencyHistogram,
    /// The median span of two back-to-back reads of the same clock (nothing timed).
    pub timer_ns: f64,
}

/// Single loads [`floor`] times one by one (after the blocks).
pub const FLOOR_SINGLES: usize = 100_000;

/// `u64`s per 64-byte line in [`line_buffer`]s.
const NODE: usize = 8;

/// A zeroed buffer of `lines` 64-byte lines ([`NODE`] `u64`s each), advised huge or not
/// before its first touch; every page is written (no shared zero page).
fn line_buffer(lines: usize, huge: bool) -> Vec<u64> {
    let mut buf: Vec<u64> = Vec::with_capacity(lines * NODE);
    advise(buf.as_mut_ptr() as *mut u8, lines * 64, huge);
    buf.resize(lines * NODE, 0);
    buf
}

/// Dependent loads per timed block of [`floor`] (the timer's ~25 ns is then < 0.2 ns a load).
pub const FLOOR_BLOCK: usize = 128;

/// The memory floor: ns per dependent load of a random single-cycle pointer chase over a
/// buffer of `bytes` (one node per 64-byte line), advised huge or not before first touch: the
/// figure hit latencies are quoted against (`cache` and `provider` benches). 4000 blocks of
/// [`FLOOR_BLOCK`] loads, each timed with `Instant`, after a warm-up pass.
pub fn floor(bytes: usize, huge: bool, rng: &mut XorShift) -> Floor {
    let nodes = (bytes / 64).max(2);
    let mut buf = line_buffer(nodes, huge);
    // Sattolo: one cycle through every node.
    let mut perm: Vec<u32> = (0..nodes as u32).collect();
    for i in (1..nodes).rev() {
        let j = rng.below(i as u64) as usize;
        perm.swap(i, j);
    }
    for i in 0..nodes {
        buf[i * NODE] = perm[i] as u64;
    }
    drop(perm);
    let mut i = 0usize;
    // Warm the TLB / caches the way a long run would.
    for _ in 0..nodes.min(200_000) {
        i = buf[i * NODE] as usize;
    }
    let mut per_load = LatencyHistogram::new();
    for _ in 0..4000 {
        let t = Instant::now();
        for _ in 0..FLOOR_BLOCK {
            i = buf[i * NODE] as usize;
        }
        let ps = t.elapsed().as_nanos() as u64 * 1000 / FLOOR_BLOCK as u64;
        per_load.record_ps(ps.max(1), 1);
    }
    let clock = acm_dataplane::stats::Clock::calibrated();
    let mut single = LatencyHistogram::new();
    let mut timer = LatencyHistogram::new();
    for _ in 0..FLOOR_SINGLES {
        let t0 = clock.now();
        i = buf[i * NODE] as usize;
        // The end read is ordered (acm_dataplane::stats): it waits for the load.
        let t1 = clock.now();
        single.record(Duration::from_nanos(clock.ns(t0, t1)));
        let (a, b) = (clock.now(), clock.now());
        timer.record(Duration::from_nanos(clock.ns(a, b)));
    }
    std::hint::black_box(i);
    Floor {
        ns: per_load.summary().p50_ns,
        per_load,
        single,
        timer_ns: timer.summary().p50_ns,
    }
}

/// The memory floor of acmrs's path storage for `acmrs_path_capacity` = `capacity`: a buffer
/// as large as the slots the plugin allocates, in the page mode it gives them (THP from
/// `acmrs::huge::THRESHOLD_BYTES`). What the provider benches quote hits against.
pub struct StorageFloor {
    /// The floor.
    pub floor: Floor,
    /// Bytes of path storage (slots × slot size).
    pub bytes: usize,
    /// Path slots.
    pub slots: usize,
    /// Whether the storage (and the floor's buffer) is advised as huge pages.
    pub huge: bool,
}

/// Slots, bytes and page mode (huge or not) of acmrs's path storage for
/// `acmrs_path_capacity` = `capacity`, as the plugin allocates it.
fn storage_shape(capacity: usize) -> (usize, usize, bool) {
    let slots = acmrs::huge::path_slot_count(capacity);
    let bytes = slots * core::mem::size_of::<acm_core_nostd::cache::PathSlot>();
    (slots, bytes, acmrs::huge::is_large(slots))
}

/// [`floor`] over acmrs's path storage for `capacity` paths (see [`StorageFloor`]).
pub fn storage_floor(capacity: usize, rng: &mut XorShift) -> StorageFloor {
    let (slots, bytes, huge) = storage_shape(capacity);
    StorageFloor {
        floor: floor(bytes, huge, rng),
        bytes,
        slots,
        huge,
    }
}

/// A buffer as large as acmrs's path storage, in the page mode the plugin gives it, whose
/// random lines are read one at a time: the least memory traffic a cache hit whose entry lives
/// in such a table makes (one line; an acmrs hit reads its slot's two and, in a large table,
/// two tag lines). The same-host bench times one read between the providers' hits, with their
/// timer, so it sees the same caches, TLB and VM phase as they do: no provider that reads its
/// entry from this memory can answer faster, and stock's time over it is the largest
/// stock/provider ratio the run allows.
pub struct LineProbe {
    buf: Vec<u64>,
    lines: usize,
}

impl LineProbe {
    /// A probe over as much memory as acmrs's path storage for `capacity` paths.
    pub fn for_storage(capacity: usize) -> LineProbe {
        let (_, bytes, huge) = storage_shape(capacity);
        let lines = (bytes / 64).max(1);
        LineProbe {
            buf: line_buffer(lines, huge),
            lines,
        }
    }

    /// Reads the first word of line `i` (modulo the lines). Pass `i` through
    /// [`std::hint::black_box`] after the start of a timed span, so the load cannot be
    /// hoisted before it, and consume the result before its end.
    #[inline(always)]
    pub fn read(&self, i: u64) -> u64 {
        self.buf[(i % self.lines as u64) as usize * NODE]
    }
}

impl StorageFloor {
    /// `memory floor: … ns per dependent load over … MiB (THP; acmrs's path storage, …)`.
    pub fn describe(&self) -> String {
        let s = self.floor.single.summary();
        format!(
            "memory floor: {:.1} ns per dependent load over {:.1} MiB ({}; acmrs's path storage, {} slots of {} B); \
             one load timed alone: p50 {:.0}, p99 {:.0}, p99.9 {:.0} ns (span with ~{:.0} ns of timer)",
            self.floor.ns,
            self.bytes as f64 / (1 << 20) as f64,
            if self.huge { "THP" } else { "4 KiB pages" },
            self.slots,
            core::mem::size_of::<acm_core_nostd::cache::PathSlot>(),
            s.p50_ns,
            s.p99_ns,
            s.p999_ns,
            self.floor.timer_ns,
        )
    }
}

/// Moves this process (and so every fabric process it starts afterwards) into a private
/// network namespace with `lo` up and `net.unix.max_dgram_qlen = qlen`.
///
/// simverbs carries each UD datagram over a Unix datagram socket per QP, and umad2sim talks to
/// ibsim over one as well; a datagram that finds the receiver's queue full is lost. The kernel
/// default queue is 10 datagrams, far below what an HCA buffers: a burst of more than ~10
/// datagrams at one socket loses some, which no real fabric does. The sysctl is per network
/// namespace, so this raises it for the bench's own namespace only. Must run before any thread
/// is started (a namespace change applies to the calling thread). Root only.
pub fn private_net(qlen: u32) -> Result<(), String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: plain syscalls on memory owned here (a zeroed `ifreq`, a socket closed before
    // returning); called while the process is single-threaded.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNET) != 0 {
            return Err(os("unshare(CLONE_NEWNET)"));
        }
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        if fd < 0 {
            return Err(os("socket"));
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(b"lo") {
            *d = *s as libc::c_char;
        }
        let r = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr);
        if r == 0 {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        }
        let r = if r == 0 {
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr)
        } else {
            r
        };
        let e = os("bringing lo up");
        libc::close(fd);
        if r != 0 {
            return Err(e);
        }
    }
    std::fs::write("/proc/sys/net/unix/max_dgram_qlen", qlen.to_string())
        .map_err(|e| format!("net.unix.max_dgram_qlen: {e}"))
}

/// The current time, `YYYY-MM-DD HH:MM:SS UTC` (from `date -u`; empty if that fails), for a
/// report's header.
pub fn now_utc() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M:%S UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The `main` of a bench that drives simulated fabrics (`miss`, `addr`).
///
/// Takes `--host-net` and every flag in `switches` (flags without a value) out of the command
/// line, each seen one kept in [`Args::rest`] as `(flag, "")` (see [`Args::has`]), and parses
/// the rest ([`Args::parse_from`], `with_value`); `--help` or a bad command line prints the
/// message and exits 2. Without `--host-net` it then moves into [`private_net`]`(qlen)` (exit
/// 1 if that fails), runs `run` and prints its report; an error prints `<bin>: <error>` and
/// exits 1. The fabrics `run` starts are torn down (by PID, in `Fabric`'s Drop) when it
/// returns, error or not.
pub fn fabric_bench_main(
    bin: &str,
    usage: &str,
    with_value: &[&str],
    switches: &[&str],
    qlen: u32,
    run: impl FnOnce(&Args) -> Result<String, String>,
) {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let is_switch = |a: &String| a == "--host-net" || switches.contains(&a.as_str());
    let seen: Vec<String> = raw.iter().filter(|a| is_switch(a)).cloned().collect();
    let rest = raw.into_iter().filter(|a| !is_switch(a));
    let mut args = Args::or_exit(Args::parse_from(rest, usage, with_value));
    args.rest
        .extend(seen.into_iter().map(|f| (f, String::new())));
    if !args.has("--host-net") {
        if let Err(e) = private_net(qlen) {
            eprintln!("{bin}: private network namespace: {e} (--host-net runs without one)");
            std::process::exit(1);
        }
    }
    match run(&args) {
        Ok(report) => println!("{report}"),
        Err(e) => {
            eprintln!("{bin}: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_hgrm() {
        let mut h = LatencyHistogram::new();
        for ns in 1..=1000u64 {
            h.record_ps(ns * 1000, 1);
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        assert!((s.p50_ns - 500.0).abs() < 1.0, "{s:?}");
        assert!((s.p99_ns - 990.0).abs() < 1.0, "{s:?}");
        assert!((s.max_ns - 1000.0).abs() < 1.0, "{s:?}");
        let text = h.hgrm();
        assert!(text.contains("Percentile"));
        assert!(text.contains("Total count    =         1000"));
        let last = text
            .lines()
            .rfind(|l| !l.starts_with('#') && !l.trim().is_empty())
            .unwrap();
        assert!(last.contains("1.000000000000"), "{last}");
    }

    #[test]
    fn batch_timer_counts_every_op() {
        let (h, _) = BatchTimer { batch: 64 }.run(1000, |i| i * 2);
        assert_eq!(h.summary().count, 1000);
    }

    #[test]
    fn table_renders_aligned() {
        let mut t = Table::new(&["a", "bb"]);
        t.row(vec!["x".into(), "1".into()]);
        let r = t.render();
        assert_eq!(r.lines().count(), 3);
        assert!(r
            .lines()
            .all(|l| l.len() == r.lines().next().unwrap().len()));
    }

    #[test]
    fn args_parse() {
        let a = Args::parse_from(
            ["--quick", "--out", "/tmp/x", "--sizes=1,2"].map(String::from),
            "u",
            &["--sizes"],
        )
        .unwrap();
        assert!(a.quick);
        assert_eq!(a.out.as_deref(), Some(Path::new("/tmp/x")));
        assert_eq!(a.value("--sizes"), Some("1,2"));
        assert!(a.has("--sizes") && !a.has("--host-net"));
        let o = Args::parse_from(
            ["--opt", "a=1", "--opt= b = x=y "].map(String::from),
            "u",
            &["--opt"],
        )
        .unwrap();
        assert_eq!(
            o.opts("u").unwrap(),
            [("a".into(), "1".into()), ("b".into(), "x=y".into())]
        );
        assert!(Args::parse_from(["--opt=a".to_string()], "u", &["--opt"])
            .unwrap()
            .opts("u")
            .is_err());
        assert!(Args::parse_from(["--bogus".to_string()], "u", &[]).is_err());
        assert!(Args::parse_from(["--out".to_string()], "u", &[]).is_err());
        let sizes = |v: &[&str]| {
            Args::parse_from(v.iter().map(|s| s.to_string()), "u", &["--sizes"])
                .unwrap()
                .sizes()
        };
        assert_eq!(sizes(&[]), Ok(vec![1_000, 100_000, 1_000_000]));
        assert_eq!(sizes(&["--quick"]), Ok(vec![1_000, 100_000]));
        assert_eq!(sizes(&["--sizes", "1_000, 96256"]), Ok(vec![1_000, 96_256]));
        assert!(sizes(&["--sizes", "10,0"]).is_err());
        assert!(sizes(&["--sizes", "ten"]).is_err());
    }

    #[test]
    fn heap_bytes_sees_allocations() {
        // 64 MiB is above glibc's largest dynamic mmap threshold (32 MiB on 64-bit), so the
        // block is always mmapped and counted in `hblkhd`, whichever arena this test thread
        // uses (`uordblks` covers only the main arena; a 4 MiB block could land in a thread
        // arena once the threshold has grown, which made this test flaky).
        // Other test threads allocate and free concurrently: one clean attempt out of 5.
        let ok = (0..5).any(|_| {
            let before = heap_bytes();
            let v = vec![1u8; 64 << 20];
            let after = heap_bytes();
            drop(v);
            after >= before + (64 << 20) - 4096
        });
        assert!(ok, "a 64 MiB allocation never showed up in heap_bytes()");
    }
}
