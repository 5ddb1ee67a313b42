//! Shared helpers for the acmrs benchmarks (`src/bin/*.rs`). What they print and draw
//! (tables, latency histograms and `.hgrm` files, percentile plots, progress lines) and how
//! their command lines read (clap, `--quick`, `--out DIR`) come from `acm-report`, which the
//! tools share; what is here is the benches' own.
//!
//! * [`BatchTimer`]: times operations in batches to amortise the timer's own cost.
//! * [`heap_bytes`]: bytes currently allocated from the C heap (glibc `mallinfo2`), for
//!   bytes-per-entry figures that also see memory allocated by C code.
//! * [`SizeOpts`] and [`PollMode`]: the `--sizes` and `--poll-mode` options of the sized
//!   benches (`cache`, `provider`, `provider-fake-core`).
//! * [`XorShift`]: a deterministic PRNG for key sets and access orders.
//! * [`floor`]: the memory floor (a dependent pointer chase as large as a cache), and
//!   [`advise`] (THP or not before first touch).
//! * [`private_net`]: a private network namespace with a larger Unix datagram queue, for the
//!   benches that drive a simulated fabric with bursts.
//! * [`client`]: the ACM client of the daemon benches (`miss`, `addr`): connections, answers,
//!   counters, bursts.
//! * [`now_utc`]: the wall-clock time for a report's header.
//! * [`FabricBenchOpts`] and [`fabric_bench_main`]: the options and the `main` of those daemon
//!   benches (namespace, report, exit codes).

#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use acm_report::cli::{counts, name_value, List, RunOpts};
use acm_report::LatencyHistogram;

pub mod client;

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

/// `--sizes`: the cache sizes of the sized benches (`cache`, `provider`, `provider-fake-core`).
#[derive(clap::Args, Clone, Debug, Default, PartialEq)]
pub struct SizeOpts {
    /// Cache sizes (entries, cached paths), comma-separated [default: 1000,100000,1000000;
    /// with --quick 1000,100000]
    #[arg(long, value_name = "N,N,..", value_parser = counts)]
    pub sizes: Option<List<usize>>,
}

impl SizeOpts {
    /// The sizes given, else the benches' default: 1 000 and 100 000 entries, plus 1 000 000
    /// without `--quick`.
    pub fn get(&self, quick: bool) -> Vec<usize> {
        match &self.sizes {
            Some(l) => l.0.clone(),
            None if quick => vec![1_000, 100_000],
            None => vec![1_000, 100_000, 1_000_000],
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
/// simverbs carries each UD datagram over a Unix datagram socket per QP, and talks to ibsim
/// over one per port as well; a datagram that finds the receiver's queue full is lost. The kernel
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

/// The 1-, 5- and 15-minute load averages (`/proc/loadavg`; "?" if unreadable), for a
/// report's header.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".into())
}

/// How this host's idle CPUs wait, for a report's header: the cpuidle driver and governor,
/// and with the guest halt-polling driver of a virtual machine its poll bound
/// (`guest_halt_poll_ns`; 0: a vCPU with nothing to run halts at once, and waking it costs an
/// exit to the hypervisor, several µs for every thread of a run). "cpuidle ?" if unreadable.
pub fn cpu_idle() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let base = "/sys/devices/system/cpu/cpuidle";
    let driver = read(&format!("{base}/current_driver")).unwrap_or_else(|| "?".into());
    let governor = read(&format!("{base}/current_governor")).unwrap_or_else(|| "?".into());
    let mut s = format!("cpuidle {driver}/{governor}");
    if let Some(ns) = read(HALT_POLL_NS) {
        s.push_str(&format!(", guest_halt_poll_ns {ns}"));
    }
    s
}

/// Where the cpuidle-haltpoll driver (a KVM guest's) keeps how long an idle virtual CPU polls
/// before it halts.
pub const HALT_POLL_NS: &str = "/sys/module/haltpoll/parameters/guest_halt_poll_ns";

/// The value [`HaltPoll`] replaced, and where: put back by its drop or by
/// [`restore_halt_poll`] (the signal teardown of [`enter_fabric_bench`]).
static HALT_POLL_SAVED: std::sync::Mutex<Option<(PathBuf, String)>> = std::sync::Mutex::new(None);

/// The guest halt-polling bound set for a run (`--halt-poll-ns`), put back when dropped. On a
/// KVM guest whose idle virtual CPUs halt at once (`guest_halt_poll_ns 0`), every wake-up of a
/// halted one pays an exit to the hypervisor; on the simulated fabric a query sent from one
/// CPU while the fabric's processes sleep on the other pays it (docs/bench.md).
pub struct HaltPoll(());

impl HaltPoll {
    /// Sets [`HALT_POLL_NS`] to `ns` (root, a guest with the haltpoll driver).
    pub fn set(ns: u64) -> Result<HaltPoll, String> {
        HaltPoll::set_at(std::path::Path::new(HALT_POLL_NS), ns)
    }

    /// Sets the value in `file` to `ns`, keeping the old one for the drop.
    pub fn set_at(file: &std::path::Path, ns: u64) -> Result<HaltPoll, String> {
        let old = std::fs::read_to_string(file).map_err(|e| {
            format!(
                "{}: {e} (no cpuidle-haltpoll on this host?)",
                file.display()
            )
        })?;
        let mut saved = HALT_POLL_SAVED.lock().unwrap_or_else(|e| e.into_inner());
        if saved.is_some() {
            return Err("the halt-polling bound is already set by this process".into());
        }
        std::fs::write(file, ns.to_string()).map_err(|e| format!("{}: {e}", file.display()))?;
        *saved = Some((file.to_path_buf(), old.trim().to_string()));
        Ok(HaltPoll(()))
    }
}

impl Drop for HaltPoll {
    fn drop(&mut self) {
        restore_halt_poll();
    }
}

/// Puts back the halt-polling bound a [`HaltPoll`] replaced, if one is in force.
pub fn restore_halt_poll() {
    let saved = HALT_POLL_SAVED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some((file, old)) = saved {
        if let Err(e) = std::fs::write(&file, &old) {
            eprintln!("cannot put {} back to {old}: {e}", file.display());
        }
    }
}

/// The CPUs this machine has online, 0..n (`available_parallelism` of the whole machine is
/// what `sysconf(_SC_NPROCESSORS_ONLN)` says).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Lets thread `tid` (any process's) run on `cpus` only.
pub fn set_thread_cpus(tid: i32, cpus: &[usize]) -> Result<(), String> {
    // SAFETY: cpu_set_t is plain data, zeroed and filled with CPU_SET (bounds-checked by the
    // libc macro) before sched_setaffinity reads it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(format!(
            "sched_setaffinity({tid}, {cpus:?}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Every online CPU but `cpu`.
pub fn cpus_but(cpu: usize) -> Vec<usize> {
    (0..online_cpus()).filter(|&c| c != cpu).collect()
}

/// `--poll-mode`: `acmrs_poll_mode` of the acmrs dataplane in the provider benches.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct PollMode {
    /// acmrs_poll_mode of the acmrs dataplane
    #[arg(
        long,
        value_name = "MODE",
        default_value = "adaptive",
        value_parser = ["busy", "adaptive", "event"]
    )]
    pub poll_mode: String,
}

/// The options every bench that drives simulated fabrics (`miss`, `addr`) has, besides its own.
#[derive(clap::Args, Clone, Debug, Default, PartialEq)]
pub struct FabricBenchOpts {
    /// `--quick`, `--out DIR`.
    #[command(flatten)]
    pub run: RunOpts,
    /// An extra ibacm_opts.cfg line on every node (repeatable)
    #[arg(long = "opt", value_name = "NAME=VALUE", value_parser = name_value)]
    pub opts: Vec<(String, String)>,
    /// ibacm's log_level on every node
    #[arg(long, value_name = "0..3", default_value = "0")]
    pub log_level: String,
    /// Run in the host's network namespace (default: a private one with a larger Unix datagram
    /// queue, see docs/bench.md)
    #[arg(long)]
    pub host_net: bool,
}

/// `libsimverbs.so` for the processes a bench starts as fabric hosts (`ACM_FABRIC_SIMVERBS`,
/// else next to the binaries).
pub fn simverbs_lib() -> Result<PathBuf, String> {
    acm_fabric::find_artifact(
        "ACM_FABRIC_SIMVERBS",
        "libsimverbs.so",
        "cargo build --release -p simverbs",
    )
    .map_err(|e| e.to_string())
}

/// The extra option lines of a fabric bench's report header: ", `name value`" each.
pub fn opts_note(opts: &[(String, String)]) -> String {
    opts.iter().map(|(k, v)| format!(", `{k} {v}`")).collect()
}

/// A report header's host part: "load average BEFORE → AFTER, N CPUs (how idle CPUs wait)".
pub fn host_note(load0: &str, load1: &str) -> String {
    format!(
        "load average {load0} → {load1}, {} CPUs ({})",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_idle()
    )
}

/// Polls `ep` until `f` accepts a MAD, sleeping on the completion channel in between (arm,
/// poll again, `poll(2)` on the event fd): a client that does not spin. `Err(timeout_msg)`
/// after 10 s.
pub fn wait_ud(
    ep: &mut acm_dataplane::verbs::UdEndpoint,
    timeout_msg: &str,
    mut f: impl FnMut(&[u8; 256]) -> bool,
) -> Result<(), String> {
    let start = Instant::now();
    let mut got = false;
    loop {
        ep.poll(|_, m| got |= f(m));
        if got {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(10) {
            return Err(timeout_msg.into());
        }
        ep.arm().map_err(|e| e.to_string())?;
        ep.poll(|_, m| got |= f(m));
        if got {
            return Ok(());
        }
        let mut pfd = libc::pollfd {
            fd: ep.event_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 10) };
        ep.ack_event();
    }
}

/// `net.unix.max_dgram_qlen` in a fabric bench's own network namespace ([`private_net`]).
pub const DGRAM_QLEN: u32 = 4096;

/// Sets up a bench that drives simulated fabrics, once its command line is parsed and before
/// any thread starts: without `host_net` it moves into [`private_net`]`(`[`DGRAM_QLEN`]`)`,
/// then [`acm_fabric::teardown_on_signals`] makes SIGINT, SIGTERM and SIGHUP take the fabrics
/// and children it starts down with it. A failure prints `<bin>: <error>` and exits 1.
pub fn enter_fabric_bench(bin: &'static str, host_net: bool) {
    if !host_net {
        if let Err(e) = private_net(DGRAM_QLEN) {
            eprintln!("{bin}: private network namespace: {e} (--host-net runs without one)");
            acm_fabric::process::exit(1);
        }
    }
    // A signal's teardown puts back what the run changed on the host.
    let claim = |_| {
        restore_halt_poll();
        false
    };
    if let Err(e) = acm_fabric::teardown_on_signals(bin, claim) {
        eprintln!("{bin}: {e}");
        acm_fabric::process::exit(1);
    }
}

/// The `main` of a bench that drives simulated fabrics (`miss`, `addr`), once its command line
/// is parsed (bad command lines exit 2, [`acm_report::cli::parse`]): [`enter_fabric_bench`],
/// then `run`, printing its report; an error prints `<bin>: <error>` and exits 1. The fabrics
/// `run` starts are torn down (by PID, in `Fabric`'s Drop) when it returns, error or not.
pub fn fabric_bench_main(
    bin: &'static str,
    host_net: bool,
    run: impl FnOnce() -> Result<String, String>,
) {
    enter_fabric_bench(bin, host_net);
    match run() {
        Ok(report) => println!("{report}"),
        Err(e) => {
            eprintln!("{bin}: {e}");
            acm_fabric::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_halt_polling_bound_is_put_back() {
        let dir = std::env::temp_dir().join(format!("acm-bench-haltpoll-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("guest_halt_poll_ns");
        std::fs::write(&f, "0\n").unwrap();
        let read = || std::fs::read_to_string(&f).unwrap();
        {
            let _g = HaltPoll::set_at(&f, 200_000).unwrap();
            assert_eq!(read(), "200000");
            // One at a time: a second would put back the first's value, not the host's.
            assert!(HaltPoll::set_at(&f, 1).is_err());
            assert_eq!(read(), "200000");
        }
        assert_eq!(read(), "0");
        // The signal path: put back once, then nothing is left to put back.
        let g = HaltPoll::set_at(&f, 5).unwrap();
        restore_halt_poll();
        assert_eq!(read(), "0");
        std::fs::write(&f, "7").unwrap();
        drop(g);
        assert_eq!(read(), "7");
        assert!(HaltPoll::set_at(&dir.join("absent"), 1).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn batch_timer_counts_every_op() {
        let (h, _) = BatchTimer { batch: 64 }.run(1000, |i| i * 2);
        assert_eq!(h.summary().count, 1000);
    }

    #[derive(clap::Parser)]
    struct Sized {
        #[command(flatten)]
        run: RunOpts,
        #[command(flatten)]
        sizes: SizeOpts,
    }

    #[test]
    fn sizes_default_by_quick() {
        let sizes = |v: &[&str]| {
            let a: Sized =
                acm_report::cli::try_parse_from(std::iter::once("b").chain(v.iter().copied()))
                    .map_err(|e| e.to_string())?;
            Ok::<_, String>(a.sizes.get(a.run.quick))
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
