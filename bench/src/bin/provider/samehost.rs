//! The headline comparison: the stock `libibacmp.so` and `libacmrs.so` loaded in ONE process
//! that is a node of a simulated fabric, on the same port, in the same run.
//!
//! The parent brings up ibsim + OpenSM on a generated fat-tree (`acm_fabric`, no daemons) and
//! re-executes this binary once per cache size as a fabric node (`LD_PRELOAD` simverbs, which
//! is its libibverbs and libibumad, `SIM_HOST`, `IBSIM_SOCKNAME`). The child plays the ibacm core for real
//! (`host_core.c`: verbs device, GID table, SA MAD service over libibumad to the real
//! OpenSM), dlopens both providers, opens device/port/endpoint/address on each, waits until
//! each answers (stock: after its multicast join through our SA service), then measures
//! `resolve()` → `acm_resolve_response` latency on cache hits (route preload
//! `opensm_full_v1`) and misses (answered by OpenSM's SA over the simulated fabric).
//!
//! With `--out DIR` the child writes one `.hgrm` per provider, measurement and size and one
//! percentile plot (`.svg`, acmrs against stock) per measurement and size. Parent and child
//! print one progress line per phase on stderr, on the parent's clock.

use acm_bench::XorShift;
use acm_report::plot::{write_percentile_svg, Series};
use acm_report::{progress, LatencyHistogram, Summary, Table};
use acm_testkit::core::{self as fake, Record};
use acm_testkit::host::provider_table;
use acm_testkit::request::{gid, path_of, PathRequest};
use acmrs::ffi::*;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) const STOCK_LIB: &str = "/usr/lib/x86_64-linux-gnu/ibacm/libibacmp.so";
const HOST_CORE_C: &str = include_str!("host_core.c");
/// First fake DLID of the generated route dump (the fabric's own LIDs stay below it).
const FAKE_BASE_LID: u16 = 0x400;
/// libibacmp's preload LID table covers unicast LIDs below 0xC000 only.
const LID_LIMIT: u32 = 0xC000;
const FAKE_GUID_BASE: u64 = 0x0002_c903_0000_0000;
/// The most cached paths the stock provider's route preload gives in this benchmark.
pub const STOCK_MAX_ENTRIES: usize = 2 * (LID_LIMIT as usize - FAKE_BASE_LID as usize);

/// Settings shared by the parent and the measuring child.
#[derive(Debug, Clone)]
pub struct Config {
    /// Requested cached-path counts (LID + GID entries, 2 per preloaded DLID).
    pub sizes: Vec<usize>,
    /// Timed hit requests per provider and size.
    pub hit_samples: usize,
    /// `fattree:L,S,H` spec of the fabric.
    pub topology: String,
    /// Where `.hgrm` files go.
    pub out: Option<PathBuf>,
    /// `acmrs_poll_mode` of the acmrs dataplane (busy, adaptive, event).
    pub poll_mode: String,
    /// Isolated misses per provider and form in the `poll_mode` run (0: none).
    pub misses: usize,
    /// The same in the runs of the other two poll modes (0: not run).
    pub mode_misses: usize,
    /// Idle time measured after the misses (ms).
    pub idle_ms: u64,
    /// No hit children.
    pub misses_only: bool,
    /// The guest halt-polling bound for this run (`None`: the host's as it is).
    pub halt_poll_ns: Option<u64>,
    /// `acmrs_sa_transport` of the miss runs, one miss child per poll mode and transport.
    pub miss_sa: Vec<String>,
    /// The CPU acmrs's worker has to itself in busy-mode miss runs (`None`: unpinned).
    pub busy_cpu: Option<usize>,
}

// ---- parent ----------------------------------------------------------------------------------

/// Brings up the fabric and runs one measuring child per size; each prints its table.
pub fn run(cfg: &Config) -> Result<(), String> {
    use acm_fabric::{Fabric, Topology};
    let topo = Topology::parse(&cfg.topology).map_err(|e| e.to_string())?;
    let hcas = topo.hcas();
    if hcas.len() < 3 {
        return Err(format!("{} has fewer than 3 HCAs", cfg.topology));
    }
    let switches = topo.switches().len();
    // Put back when this returns (and by the signal teardown).
    let _halt_poll = cfg.halt_poll_ns.map(acm_bench::HaltPoll::set).transpose()?;
    // OpenSM assigns one LID per HCA port and one per switch: 1..=max_lid.
    let max_lid = (hcas.len() + switches) as u16;
    if max_lid >= FAKE_BASE_LID {
        return Err(format!(
            "{} needs more than {} LIDs",
            cfg.topology,
            FAKE_BASE_LID - 1
        ));
    }
    let host = hcas[1].clone();
    // The name misses' peer: one real ibacm daemon (stock libibacmp) owning its node name.
    let peer = hcas[2].clone();
    let simverbs = acm_bench::simverbs_lib()?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let acmrs = acm_bench::sibling("libacmrs.so", "cargo build --release -p acm-plugin")?;
    if !Path::new(STOCK_LIB).exists() {
        return Err(format!("{STOCK_LIB} missing: apt-get install ibacm"));
    }
    let t0 = Instant::now();
    progress(format_args!(
        "bringing up ibsim + OpenSM on {} ({} HCAs, {switches} switches)",
        cfg.topology,
        hcas.len()
    ));
    let fabric = Fabric::builder(topo, [peer.as_str()])
        .provider(acm_fabric::Provider::Stock)
        .hosts_file(acm_fabric::HostsFile::Absent)
        .option("log_level", "0")
        .name_prefix("bench-samehost")
        .start()
        .map_err(|e| e.to_string())?;
    let lid = fabric.port_info(&host).map_err(|e| e.to_string())?.lid;
    let peer_node = fabric.node(&peer).map_err(|e| e.to_string())?;
    let (peer_lid, peer_name) = (peer_node.lid, peer_node.addrs.name.clone());
    println!(
        "## same host, same fabric, same run: stock libibacmp vs libacmrs\n\n\
         fabric {} ({} HCAs, {} switches, up in {:.1} s), bench process = {host} (LID {lid}), \
         SA = OpenSM on {}, name-miss peer = real ibacm (stock) on {peer} (LID {peer_lid}, \
         name {peer_name})\n\nhost: {} CPUs, load average {}, {}\n\nfabric name: {}\n",
        cfg.topology,
        hcas.len(),
        switches,
        t0.elapsed().as_secs_f64(),
        fabric.sm_node(),
        acm_bench::online_cpus(),
        acm_bench::loadavg(),
        acm_bench::cpu_idle(),
        fabric.name()
    );
    let simverbs = simverbs.to_string_lossy().into_owned();
    let run_child = |dir: &Path, shm: &Path, args: Vec<String>, what: &str| -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(&args);
        if let Some(out) = &cfg.out {
            let out = std::path::absolute(out).map_err(|e| e.to_string())?;
            cmd.arg("--out").arg(out);
        }
        cmd.current_dir(dir)
            .env("LD_PRELOAD", &simverbs)
            .env("IBSIM_SOCKNAME", fabric.name())
            .env("SIM_HOST", &host)
            .env("SIMVERBS_SHM_DIR", shm);
        // The child's progress lines continue this process's clock.
        let (k, v) = acm_report::progress_env();
        cmd.env(k, v);
        // Its own process group, recorded: stopped by PID when this returns or panics, and
        // by the signal thread's teardown.
        let mut child = acm_fabric::process::Proc::spawn(what, cmd, Duration::from_secs(2))
            .map_err(|e| format!("spawn child: {e}"))?;
        let Some(status) = child.wait_timeout(Duration::from_secs(600)) else {
            return Err(format!("child for {what} timed out"));
        };
        // The child skipped its exit handlers (main.rs): its ibsim clients are freed here.
        fabric.reap_dead_clients().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("child for {what} failed: {status}"));
        }
        Ok(())
    };
    let modes = ["busy", "adaptive", "event"];
    let mut runs = vec![(cfg.poll_mode.clone(), cfg.misses)];
    runs.extend(
        modes
            .iter()
            .filter(|m| **m != cfg.poll_mode)
            .map(|m| (m.to_string(), cfg.mode_misses)),
    );
    // One child per poll mode and acmrs SA transport: `core` gives both providers the same
    // SA path (the host core's umad service), `ud` is acmrs's default (its own UD QP).
    let runs: Vec<(String, usize, String)> = runs
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .flat_map(|(m, n)| cfg.miss_sa.iter().map(move |t| (m.clone(), n, t.clone())))
        .collect();
    for (mode, n, sa) in runs {
        progress(format_args!(
            "isolated misses, acmrs_poll_mode {mode}, acmrs_sa_transport {sa}: miss child \
             starts ({n} per provider and form)"
        ));
        let mut args: Vec<String> = [
            "samehost-miss-child",
            "--misses",
            &n.to_string(),
            "--max-lid",
            &max_lid.to_string(),
            "--poll-mode",
            &mode,
            "--acmrs",
            acmrs.to_str().unwrap_or_default(),
            "--peer-name",
            &peer_name,
            "--peer-lid",
            &peer_lid.to_string(),
            "--idle-ms",
            &cfg.idle_ms.to_string(),
            "--acmrs-sa-transport",
            &sa,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Busy mode on a CPU of its own: the fabric's processes (ibsim, OpenSM, the peer
        // daemon) leave it for this run; the child keeps its own other threads off it.
        let dedicated = cfg.busy_cpu.filter(|_| mode == "busy");
        if let Some(cpu) = dedicated {
            if cpu >= acm_bench::online_cpus() {
                return Err(format!("--busy-cpu {cpu}: no such CPU"));
            }
            fabric_cpus(fabric.name(), &acm_bench::cpus_but(cpu))?;
            args.extend(["--dedicated-cpu".to_string(), cpu.to_string()]);
        }
        // simverbs finds the peer daemon's QPs (its multicast group) through the fabric's
        // shared directory, where the daemons have theirs.
        let r = run_child(
            &fabric.scratch().join(format!("misses-{mode}-{sa}")),
            fabric.scratch(),
            args,
            &format!("misses ({mode}, SA by {sa})"),
        );
        if dedicated.is_some() {
            let all: Vec<usize> = (0..acm_bench::online_cpus()).collect();
            fabric_cpus(fabric.name(), &all)?;
        }
        r?;
    }
    if cfg.misses_only {
        return Ok(());
    }
    for &size in &cfg.sizes {
        progress(format_args!(
            "size {size}: measuring child starts (both providers, {} hits each)",
            cfg.hit_samples
        ));
        let args: Vec<String> = [
            "samehost-child",
            "--size",
            &size.to_string(),
            "--hit-samples",
            &cfg.hit_samples.to_string(),
            "--max-lid",
            &max_lid.to_string(),
            "--poll-mode",
            &cfg.poll_mode,
            "--acmrs",
            acmrs.to_str().unwrap_or_default(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let dir = fabric.scratch().join(format!("bench-{size}"));
        run_child(&dir, &dir, args, &format!("size {size}"))?;
    }
    Ok(())
}

/// Lets every thread of every process on `fabric` (ibsim, OpenSM, daemons) run on `cpus`
/// only.
fn fabric_cpus(fabric: &str, cpus: &[usize]) -> Result<(), String> {
    for (pid, _) in acm_fabric::testing::processes_on_fabric(|f| f == fabric) {
        for tid in acm_fabric::process::threads_of(pid) {
            // A thread that exited meanwhile is no error.
            if let Err(e) = acm_bench::set_thread_cpus(tid, cpus) {
                if acm_fabric::pid_exists(tid) {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

// ---- child: the host core (Rust side) --------------------------------------------------------

#[repr(C)]
pub(crate) struct Hooks {
    write: extern "C" fn(c_int, *const c_char),
    resolve_response: extern "C" fn(u64, *mut AcmMsg) -> c_int,
    query_response: extern "C" fn(u64, *mut AcmMsg) -> c_int,
    opts: extern "C" fn() -> *const c_char,
    stamp: extern "C" fn(c_int),
}

#[repr(C)]
pub(crate) struct HostInfo {
    pub(crate) verbs: *mut c_void,
    pub(crate) dev_guid: u64,
    pub(crate) lid: u16,
    pub(crate) sm_lid: u16,
    pub(crate) sm_sl: u8,
    gid_cnt: u8,
    pub(crate) gid0: [u8; 16],
    dev_name: [c_char; 64],
    error: [c_char; 256],
}

pub(crate) static LOG: AtomicBool = AtomicBool::new(false);
pub(crate) static SEND_NS: AtomicU64 = AtomicU64::new(0);
pub(crate) static RECV_NS: AtomicU64 = AtomicU64::new(0);
/// The provider's SA reply handler returned (host_core.c stamp 2).
static HANDLED_NS: AtomicU64 = AtomicU64::new(0);
/// Whether [`resolve_timed`] also reads the calling thread's CPU clock around `resolve()`
/// (the miss child's CPU phase only: two syscalls per call).
pub(crate) static CALL_CPU: AtomicBool = AtomicBool::new(false);

/// This thread's CPU time (ns).
pub(crate) fn thread_cpu_now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime with a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

// The hooks host_core.c calls: the provider's answers and log lines are recorded by the
// test kit (`acm_testkit::core`, on its clock), the opts file is the test kit's.

extern "C" fn h_write(_level: c_int, s: *const c_char) {
    if LOG.load(Ordering::Relaxed) && !s.is_null() {
        // SAFETY: NUL-terminated buffer formatted by host_core.c.
        fake::log_line(&unsafe { CStr::from_ptr(s) }.to_string_lossy());
    }
}

extern "C" fn h_resolve_response(id: u64, m: *mut AcmMsg) -> c_int {
    if m.is_null() {
        return -1;
    }
    // SAFETY: the provider passes a full message for the duration of the call.
    let rc = unsafe { fake::record_answer(id, m, false) };
    notify();
    rc
}

extern "C" fn h_query_response(id: u64, m: *mut AcmMsg) -> c_int {
    if m.is_null() {
        return -1;
    }
    // SAFETY: as above.
    unsafe { fake::record_answer(id, m, true) }
}

extern "C" fn h_stamp(what: c_int) {
    let t = fake::now_ns();
    match what {
        0 => SEND_NS.store(t, Ordering::Relaxed),
        1 => RECV_NS.store(t, Ordering::Relaxed),
        2 => HANDLED_NS.store(t, Ordering::Relaxed),
        // A bare SA query's reply arrived (host_core.c's bare_handler).
        _ => notify(),
    }
}

/// With [`BLOCK_WAIT`], waiters sleep on this futex word (bumped by every answer and every
/// bare SA reply) instead of spinning.
pub(crate) static WAKE_SEQ: AtomicU32 = AtomicU32::new(0);
/// The miss child's waits block (a thread that spins for an answer takes one of the 2 cores
/// from ibsim, OpenSM and the providers); the hit child's spin as before.
pub(crate) static BLOCK_WAIT: AtomicBool = AtomicBool::new(false);

fn notify() {
    if BLOCK_WAIT.load(Ordering::Relaxed) {
        WAKE_SEQ.fetch_add(1, Ordering::Release);
        // SAFETY: FUTEX_WAKE on a live word of this process.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                WAKE_SEQ.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            )
        };
    }
}

/// Sleeps until [`WAKE_SEQ`] differs from `seen` (or 10 ms passed).
pub(crate) fn wait_seq(seen: u32) {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 10_000_000,
    };
    // SAFETY: FUTEX_WAIT on a live word with a relative timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            WAKE_SEQ.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            seen,
            &ts as *const libc::timespec,
        )
    };
}

extern "C" fn h_opts() -> *const c_char {
    fake::acm_get_opts_file()
}

fn dlerror() -> String {
    // SAFETY: dlerror returns a static string or null.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "?".into()
    } else {
        // SAFETY: non-null NUL-terminated string from dlerror.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

pub(crate) fn dlopen(path: &Path, flags: c_int) -> Result<*mut c_void, String> {
    let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: dlopen of a NUL-terminated library path.
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    if h.is_null() {
        return Err(format!("dlopen {}: {}", path.display(), dlerror()));
    }
    Ok(h)
}

pub(crate) fn sym(h: *mut c_void, name: &CStr) -> Result<*mut c_void, String> {
    // SAFETY: dlsym on a handle returned by dlopen.
    let s = unsafe { libc::dlsym(h, name.as_ptr()) };
    if s.is_null() {
        return Err(format!("symbol {name:?} missing: {}", dlerror()));
    }
    Ok(s)
}

/// One provider opened on the host's port, as the core opens it.
pub(crate) struct Opened {
    pub(crate) name: &'static str,
    pub(crate) prov: &'static AcmProvider,
    pub(crate) addr_ctx: *mut c_void,
}

pub(crate) fn open_provider(
    name: &'static str,
    prov: &'static AcmProvider,
    dev: &'static AcmDevice,
    port: &'static AcmPort,
    ep: &'static AcmEndpoint,
    addr: &AcmAddress,
) -> Result<Opened, String> {
    let (mut dc, mut pc, mut ec, mut ac) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: the provider ABI, called in the core's order with stable object pointers.
    unsafe {
        if (prov.open_device)(dev, &mut dc) != 0 {
            return Err(format!("{name}: open_device failed"));
        }
        if (prov.open_port)(port, dc, &mut pc) != 0 {
            return Err(format!("{name}: open_port failed"));
        }
        if (prov.open_endpoint)(ep, pc, &mut ec) != 0 {
            return Err(format!("{name}: open_endpoint failed"));
        }
        if (prov.add_address)(addr, ec, &mut ac) != 0 {
            return Err(format!("{name}: add_address failed"));
        }
    }
    Ok(Opened {
        name,
        prov,
        addr_ctx: ac,
    })
}

/// A PATH request as `ib_acme -f l` (by LID: `slid` + `dlid`) or `-f g` (by GID) sends it,
/// reversible, 1 path.
pub(crate) fn path_msg(tid: u64, slid: u16, dlid: u16, dgid: Option<[u8; 16]>) -> AcmMsg {
    let by_lid = dgid.is_none();
    PathRequest {
        slid: if by_lid { slid } else { 0 },
        reversible_numpath: 0x81,
        ..PathRequest::new(tid, if by_lid { dlid } else { 0 }, dgid)
    }
    .msg()
}

pub(crate) struct Answer {
    pub(crate) ns: u64,
    /// The provider's own share of a miss: `resolve()` → `acm_send_sa_mad`, plus SA reply
    /// handed over → `acm_resolve_response` (the fabric round trip in between excluded).
    own_ns: u64,
    /// The two parts of `own_ns`: `resolve()` → `acm_send_sa_mad`, SA reply → answer.
    send_ns: u64,
    reply_ns: u64,
    /// Stamps after the call's start (ns, 0 = did not happen during this call): `resolve()`
    /// returned, `acm_send_sa_mad` entered, the SA reply matched, the provider's reply
    /// handler returned (host_core.c stamps 0, 1, 2).
    pub(crate) ret_at: u64,
    pub(crate) send_at: u64,
    pub(crate) recv_at: u64,
    pub(crate) handled_at: u64,
    /// CPU time of the calling thread inside `resolve()` (with [`CALL_CPU`] only, else 0).
    pub(crate) call_cpu_ns: u64,
    /// Answered before `resolve()` returned.
    pub(crate) inline: bool,
    pub(crate) status: u8,
    pub(crate) path: [u8; 64],
}

/// Calls `resolve()` and waits (spinning, then sleeping) for its answer; call → answer time.
pub(crate) fn resolve_timed(
    o: &Opened,
    m: &mut AcmMsg,
    timeout: Duration,
) -> Result<Answer, String> {
    let before = fake::response_count();
    let tid = m.hdr.tid;
    SEND_NS.store(0, Ordering::Relaxed);
    RECV_NS.store(0, Ordering::Relaxed);
    HANDLED_NS.store(0, Ordering::Relaxed);
    let call_cpu = CALL_CPU.load(Ordering::Relaxed);
    let c0 = if call_cpu { thread_cpu_now() } else { 0 };
    let t0 = fake::now_ns();
    // SAFETY: as ibacm calls it; the message lives across the call.
    let rc = unsafe { (o.prov.resolve)(o.addr_ctx, m, 1) };
    let ret_at = fake::now_ns() - t0;
    let call_cpu_ns = if call_cpu { thread_cpu_now() - c0 } else { 0 };
    let inline = fake::response_count() != before;
    if rc != 0 {
        return Err(format!("{}: resolve returned {rc}", o.name));
    }
    let start = Instant::now();
    let mut spins = 0u32;
    let block = BLOCK_WAIT.load(Ordering::Relaxed);
    loop {
        let seen = WAKE_SEQ.load(Ordering::Acquire);
        if fake::response_count() != before {
            break;
        }
        if start.elapsed() > timeout {
            return Err(format!("{}: no answer within {timeout:?}", o.name));
        }
        spins += 1;
        if block {
            wait_seq(seen);
        } else if spins < 20_000 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    let (last_ns, last_tid, status) = fake::last_answer();
    if last_tid != tid {
        return Err(format!("{}: answer for another tid", o.name));
    }
    let path = fake::last_response().map_or([0; 64], |r| path_of(&r.msg));
    Ok(Answer {
        ns: last_ns.saturating_sub(t0),
        own_ns: {
            let (send, recv) = (
                SEND_NS.load(Ordering::Relaxed),
                RECV_NS.load(Ordering::Relaxed),
            );
            if send != 0 && recv >= send {
                (send - t0) + last_ns.saturating_sub(recv)
            } else {
                0
            }
        },
        send_ns: match SEND_NS.load(Ordering::Relaxed) {
            0 => 0,
            s => s.saturating_sub(t0),
        },
        reply_ns: match RECV_NS.load(Ordering::Relaxed) {
            0 => 0,
            r => last_ns.saturating_sub(r),
        },
        ret_at,
        send_at: SEND_NS.load(Ordering::Relaxed).saturating_sub(t0),
        recv_at: RECV_NS.load(Ordering::Relaxed).saturating_sub(t0),
        handled_at: HANDLED_NS.load(Ordering::Relaxed).saturating_sub(t0),
        call_cpu_ns,
        inline,
        status,
        path,
    })
}

fn fake_guid(dlid: u16) -> u64 {
    FAKE_GUID_BASE + u64::from(dlid)
}

/// An OpenSM `dump_pr` "full" file: the local port's section with one path per fake DLID,
/// then one header per fake DLID (the LID → GUID table).
fn write_dump(path: &Path, local_guid: u64, local_lid: u16, dlids: u32) -> std::io::Result<()> {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(dlids as usize * 80);
    let _ = writeln!(
        s,
        "Channel Adapter 0x{local_guid:016x}, base LID {local_lid}, LMC 0, port 1"
    );
    for i in 0..dlids {
        let _ = writeln!(s, "0x{:04x} : 0 : 4 : 3", u32::from(FAKE_BASE_LID) + i);
    }
    for i in 0..dlids {
        let lid = (u32::from(FAKE_BASE_LID) + i) as u16;
        let _ = writeln!(
            s,
            "Channel Adapter 0x{:016x}, base LID {lid}, LMC 0, port 1",
            fake_guid(lid)
        );
    }
    std::fs::write(path, s)
}

/// What every same-host child's command line carries (the hit child's and the miss
/// child's, [`ChildArgs`] and `misses::MissArgs`).
#[derive(clap::Args, Debug)]
pub struct CommonArgs {
    /// The fabric's largest LID (the misses' destinations are 1..=max-lid, not this host's).
    #[arg(long)]
    pub(crate) max_lid: u16,
    /// `libacmrs.so`.
    #[arg(long)]
    pub(crate) acmrs: PathBuf,
    /// Where `.hgrm` and `.svg` files go.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// `acmrs_poll_mode`.
    #[arg(long)]
    pub(crate) poll_mode: String,
}

/// The measuring child's command line (`provider samehost-child …`, as [`run`] starts it).
#[derive(clap::Args, Debug)]
pub struct ChildArgs {
    /// Cached paths per provider.
    #[arg(long)]
    size: usize,
    /// Timed hits per provider.
    #[arg(long)]
    hit_samples: usize,
    #[command(flatten)]
    common: CommonArgs,
}

/// The host core (host_core.c), compiled, loaded `RTLD_GLOBAL` and started: the verbs
/// device, the GID table and the SA MAD service the providers import.
pub(crate) struct HostCore {
    pub(crate) info: HostInfo,
    pub(crate) lib: *mut c_void,
    stats: *mut c_void,
}

impl HostCore {
    /// Writes host_core.c into `dir`, builds it with `cc` and starts it.
    pub(crate) fn up(dir: &Path, log_level: c_int) -> Result<HostCore, String> {
        let src = dir.join("host_core.c");
        let so = dir.join("libacmbenchhost.so");
        std::fs::write(&src, HOST_CORE_C).map_err(|e| e.to_string())?;
        let st = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&so)
            .arg(&src)
            .args(["-libumad", "-libverbs", "-lpthread"])
            .env_remove("LD_PRELOAD")
            .status()
            .map_err(|e| format!("cc (apt-get install build-essential): {e}"))?;
        if !st.success() {
            return Err(
                "building host_core.c failed (needs libibumad-dev, libibverbs-dev, ibacm headers)"
                    .into(),
            );
        }
        let h = dlopen(&so, libc::RTLD_NOW | libc::RTLD_GLOBAL)?;
        let init = sym(h, c"acmbench_host_init")?;
        let stats = sym(h, c"acmbench_host_stats")?;
        let hooks = Hooks {
            write: h_write,
            resolve_response: h_resolve_response,
            query_response: h_query_response,
            opts: h_opts,
            stamp: h_stamp,
        };
        // SAFETY: zeroed plain-old-data out-parameter.
        let mut info: HostInfo = unsafe { std::mem::zeroed() };
        // SAFETY: acmbench_host_init(const struct hooks *, int, int, int, struct host_info *);
        // the hooks struct is copied, the layouts match host_core.c.
        let rc = unsafe {
            let f: extern "C" fn(*const Hooks, c_int, c_int, c_int, *mut HostInfo) -> c_int =
                std::mem::transmute(init);
            f(&hooks, log_level, 2000, 2, &mut info)
        };
        if rc != 0 {
            // SAFETY: NUL-terminated by snprintf.
            let e = unsafe { CStr::from_ptr(info.error.as_ptr()) };
            return Err(format!("host core: {}", e.to_string_lossy()));
        }
        Ok(HostCore {
            info,
            lib: h,
            stats,
        })
    }

    /// SA MADs sent, replies received, replies without a pending request.
    pub(crate) fn stats(&self) -> [u64; 3] {
        let mut v = [0u64; 3];
        // SAFETY: acmbench_host_stats(uint64_t out[3]).
        unsafe {
            let f: extern "C" fn(*mut u64) = std::mem::transmute(self.stats);
            f(v.as_mut_ptr());
        }
        v
    }
}

pub(crate) fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
}

/// Entry of the measuring child (runs under the preload, cwd = its scratch directory).
pub fn child(a: &ChildArgs) -> Result<(), String> {
    // The last answer (with its path) and the count are enough; hundreds of thousands of
    // answers are not kept.
    fake::record(Record::Last);
    fake::log_to_stderr(std::env::var_os("ACMRS_BENCH_LOG").is_some());
    LOG.store(
        std::env::var_os("ACMRS_BENCH_LOG").is_some(),
        Ordering::Relaxed,
    );
    let dir = std::env::current_dir().map_err(|e| e.to_string())?;
    // 1. The host core.
    let log_level = if LOG.load(Ordering::Relaxed) { 2 } else { 0 };
    let host = HostCore::up(&dir, log_level)?;
    let info = &host.info;
    // SA MADs sent, replies received, replies without a pending request.
    let sa_stats = || host.stats();
    let sa_sent = || sa_stats()[0];
    let lid = info.lid;
    let local_guid = u64::from_be_bytes(info.gid0[8..].try_into().unwrap_or([0; 8]));
    // 2. The route dump and the two opts files.
    let dlids = (a.size / 2).clamp(1, (LID_LIMIT - u32::from(FAKE_BASE_LID)) as usize) as u32;
    let entries = dlids as usize * 2;
    let dump = dir.join("route.dump");
    write_dump(&dump, local_guid, lid, dlids).map_err(|e| e.to_string())?;
    let common = format!(
        "log_level {log_level}\nroute_prot sa\naddr_prot acm\nroute_preload opensm_full_v1\n\
         route_data_file {}\naddr_preload none\nloopback_prot local\ntimeout 2000\nretries 2\n",
        dump.display()
    );
    // acmrs stores each preloaded route as 2 path entries (by DLID and by DGID); this capacity
    // is 2.5× that plus room for the misses, so the path table is ~35% full during the hits
    // (docs/bench.md; the fake-core bench runs at the design load instead).
    let acmrs_capacity = dlids as usize * 5 + 1024;
    // acmrs's SA MADs go through this host's SA service like stock's (`acmrs_sa_transport
    // core`): the misses of both then cost the same SA round trip, and the phase checks
    // below can see (and forbid) every SA MAD. The daemon benches (`addr`, `miss`) measure
    // the default `ud` transport.
    let stock_opts = dir.join("stock_opts.cfg");
    let acmrs_opts = dir.join("acmrs_opts.cfg");
    std::fs::write(&stock_opts, &common).map_err(|e| e.to_string())?;
    std::fs::write(
        &acmrs_opts,
        format!(
            "{common}acmrs_path_capacity {}\nacmrs_request_capacity 4096\n\
             acmrs_pending_capacity 4096\nacmrs_stat_socket none\nacmrs_poll_mode {}\n\
             acmrs_sa_transport core\n",
            acmrs_capacity, a.common.poll_mode,
        ),
    )
    .map_err(|e| e.to_string())?;
    // 3. Both providers, in one process (stock reads its options in its constructor).
    fake::set_opts_file(&stock_opts);
    let stock = provider_table(Path::new(STOCK_LIB))?;
    fake::set_opts_file(&acmrs_opts);
    let acmrs = provider_table(&a.common.acmrs)?;
    let dev = leak(AcmDevice {
        verbs: info.verbs,
        dev_guid: info.dev_guid,
    });
    let port = leak(AcmPort { dev, port_num: 1 });
    let ep = leak(AcmEndpoint { port, pkey: 0xffff });
    let id_string = CString::new("bench").map_err(|e| e.to_string())?.into_raw();
    let mut name = AcmEpInfo { bytes: [0; 64] };
    name.bytes[..5].copy_from_slice(b"bench");
    let addr = AcmAddress {
        endpoint: ep,
        info: name,
        id_string,
        type_: ACM_ADDRESS_NAME,
    };
    progress(format_args!(
        "child {entries}: host core up (LID {lid}); opening stock and acmrs"
    ));
    let t_open = Instant::now();
    let provs = [
        open_provider("stock", stock, dev, port, ep, &addr)?,
        open_provider("acmrs", acmrs, dev, port, ep, &addr)?,
    ];
    // 4. Ready: the first and the last preloaded destination, by LID and by GID, are
    // answered inside resolve() with success (stock: after its multicast join; acmrs: after
    // its worker inserted the whole preload).
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&info.gid0[..8]);
    let last = (u32::from(FAKE_BASE_LID) + dlids - 1) as u16;
    let probes = [
        (FAKE_BASE_LID, None),
        (last, None),
        (last, Some(gid(prefix, fake_guid(last)))),
        (FAKE_BASE_LID, Some(gid(prefix, fake_guid(FAKE_BASE_LID)))),
    ];
    let mut tid = 1u64;
    let mut ready_ms = [0u128; 2];
    for (k, o) in provs.iter().enumerate() {
        let mut next = 0;
        while next < probes.len() {
            tid += 1;
            let (dlid, dgid) = probes[next];
            let mut m = path_msg(tid, lid, dlid, dgid);
            let ans = resolve_timed(o, &mut m, Duration::from_secs(10))?;
            if ans.status == 0 && ans.inline {
                next += 1;
                continue;
            }
            if t_open.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "{}: not ready after 60 s (status {}, inline {}); stock needs its \
                     multicast join through the SA",
                    o.name, ans.status, ans.inline
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        ready_ms[k] = t_open.elapsed().as_millis();
    }
    // 4b. Joined and SA quiet: each provider joins its ACM multicast group once
    // (`addr_prot acm`; one MCMemberRecord SET each). Stock answers nothing before its join;
    // acmrs answers its preload inside resolve() as soon as it is inserted and joins from its
    // dataplane thread, which can be after the probes above (then that MAD fell into the hit
    // phase, which fails on any SA MAD). Wait until both joins went out, every SA MAD got its
    // reply and none was sent for 200 ms.
    let t_quiet = Instant::now();
    let (mut last, mut since) = (sa_stats(), Instant::now());
    let sa_at_ready = last[0];
    let joins = provs.len() as u64;
    while last[0] < joins || last[1] < last[0] || since.elapsed() < Duration::from_millis(200) {
        if t_quiet.elapsed() > Duration::from_secs(30) {
            return Err(format!(
                "SA not quiet 30 s after ready (MADs sent {}, replies {}; {joins} joins expected)",
                last[0], last[1]
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
        let now = sa_stats();
        if now[0] != last[0] {
            since = Instant::now();
        }
        last = now;
    }
    let sa_after_ready = last[0] - sa_at_ready;
    // A tenth as many untimed hits first (same requests and checks): the first thousands of
    // hits of a run are slower for both (caches, TLB, branch history still cold).
    let warm = a.hit_samples / 10;
    progress(format_args!(
        "child {entries}: ready (stock {} ms, acmrs {} ms); {} hits per provider after {warm} \
         untimed",
        ready_ms[0], ready_ms[1], a.hit_samples
    ));
    // 5. Hits: random preloaded destinations, by LID and by GID alternately, the two
    // providers interleaved (alternating who goes first), then one line of the probe's memory
    // read alone with the same timer (the bound: see `LineProbe`).
    let mut hits = [LatencyHistogram::new(), LatencyHistogram::new()];
    let mut line_alone = LatencyHistogram::new();
    let probe = acm_bench::LineProbe::for_storage(acmrs_capacity);
    let mut inline_hits = [0usize; 2];
    let mut rng = XorShift::new(0x5eed ^ a.size as u64);
    let mut line_rng = XorShift::new(0x11e5 ^ a.size as u64);
    let sa_before = sa_sent();
    let t_hits = Instant::now();
    // The first hit call during which an SA MAD left (the failure message names it).
    let mut first_sa = None;
    for s in 0..warm + a.hit_samples {
        let timed = s >= warm;
        let dlid = FAKE_BASE_LID + rng.below(u64::from(dlids)) as u16;
        let by_gid = s % 2 == 1;
        let dgid = by_gid.then(|| gid(prefix, fake_guid(dlid)));
        for k in [s % 2, 1 - s % 2] {
            tid += 1;
            let mut m = path_msg(tid, lid, dlid, dgid);
            let sa0 = sa_sent();
            let ans = resolve_timed(&provs[k], &mut m, Duration::from_secs(5))?;
            if first_sa.is_none() && sa_sent() != sa0 {
                first_sa = Some(format!(
                    "first during {} hit {s} (dlid {dlid}, by gid {by_gid}, inline {}) \
                     {} ms into the hits",
                    provs[k].name,
                    ans.inline,
                    t_hits.elapsed().as_millis()
                ));
            }
            let got_dlid = u16::from_be_bytes([ans.path[40], ans.path[41]]);
            if ans.status != 0 || got_dlid != dlid {
                return Err(format!(
                    "{} hit {s}: status {} dlid {got_dlid} (wanted {dlid}, by gid {by_gid})",
                    provs[k].name, ans.status
                ));
            }
            if timed {
                hits[k].record(Duration::from_nanos(ans.ns));
                inline_hits[k] += usize::from(ans.inline);
            }
        }
        if timed {
            let line = line_rng.next_u64();
            let t0 = fake::now_ns();
            // The line is known only inside the span, and the value is consumed before its end
            // (whose clock read waits for the load).
            std::hint::black_box(probe.read(std::hint::black_box(line)));
            line_alone.record(Duration::from_nanos(fake::now_ns().saturating_sub(t0)));
        }
    }
    // Freed before the THP reading below (which is of the providers' memory).
    drop(probe);
    let sa_during_hits = sa_sent() - sa_before;
    if sa_during_hits != 0 {
        return Err(format!(
            "{sa_during_hits} SA MADs during the hit phase: those were not cache hits ({})",
            first_sa.as_deref().unwrap_or("between two calls")
        ));
    }
    // 6. Misses: every real LID of the fabric (HCAs and switches), once per provider, answered
    // by OpenSM's SA over the simulated fabric; then the same destinations by GID (learned
    // from the LID answers). A sample counts as a miss only if that very call sent an SA MAD.
    let mut miss_lid = [LatencyHistogram::new(), LatencyHistogram::new()];
    let mut miss_gid = [LatencyHistogram::new(), LatencyHistogram::new()];
    let mut miss_own = [LatencyHistogram::new(), LatencyHistogram::new()];
    let mut miss_send = [LatencyHistogram::new(), LatencyHistogram::new()];
    let mut miss_reply = [LatencyHistogram::new(), LatencyHistogram::new()];
    let mut failed = [0usize; 2];
    let mut cached = [0usize; 2];
    let mut dgids = Vec::new();
    progress(format_args!(
        "child {entries}: hits done; misses by LID to {} destinations (OpenSM SA)",
        a.common.max_lid - 1
    ));
    let sa_before = sa_sent();
    for dlid in 1..=a.common.max_lid {
        if dlid == lid {
            continue;
        }
        for k in [dlid as usize % 2, 1 - dlid as usize % 2] {
            tid += 1;
            let mut m = path_msg(tid, lid, dlid, None);
            let sa0 = sa_sent();
            let ans = resolve_timed(&provs[k], &mut m, Duration::from_secs(15))?;
            let got = u16::from_be_bytes([ans.path[40], ans.path[41]]);
            if ans.status != 0 || got != dlid {
                failed[k] += 1;
            } else if sa_sent() == sa0 {
                cached[k] += 1;
            } else {
                miss_lid[k].record(Duration::from_nanos(ans.ns));
                miss_own[k].record(Duration::from_nanos(ans.own_ns));
                miss_send[k].record(Duration::from_nanos(ans.send_ns));
                miss_reply[k].record(Duration::from_nanos(ans.reply_ns));
                if k == 0 {
                    let mut g = [0u8; 16];
                    g.copy_from_slice(&ans.path[8..24]);
                    dgids.push(g);
                }
            }
        }
    }
    progress(format_args!(
        "child {entries}: misses by GID to {} destinations",
        dgids.len()
    ));
    for (i, g) in dgids.iter().enumerate() {
        for k in [i % 2, 1 - i % 2] {
            tid += 1;
            let mut m = path_msg(tid, lid, 0, Some(*g));
            let sa0 = sa_sent();
            let ans = resolve_timed(&provs[k], &mut m, Duration::from_secs(15))?;
            if ans.status != 0 || ans.path[8..24] != g[..] {
                failed[k] += 1;
            } else if sa_sent() == sa0 {
                cached[k] += 1;
            } else {
                miss_gid[k].record(Duration::from_nanos(ans.ns));
                miss_own[k].record(Duration::from_nanos(ans.own_ns));
                miss_send[k].record(Duration::from_nanos(ans.send_ns));
                miss_reply[k].record(Duration::from_nanos(ans.reply_ns));
            }
        }
    }
    let sa_during_misses = sa_sent() - sa_before;
    // 7. Report.
    println!(
        "### {entries} cached paths ({dlids} preloaded DLIDs x LID+GID entries; requested {})\n\n\
         acmrs_poll_mode {}; ready after open: stock {} ms, acmrs {} ms; \
         SA MADs after ready (before hits): {sa_after_ready}; SA MADs during hits: {sa_during_hits}, during misses: {sa_during_misses}; \
         failed misses: stock {}, acmrs {}; miss requests answered without an SA query: \
         stock {}, acmrs {}; hits answered inside resolve(): stock {}, acmrs {}\n",
        a.size,
        a.common.poll_mode,
        ready_ms[0],
        ready_ms[1],
        failed[0],
        failed[1],
        cached[0],
        cached[1],
        inline_hits[0],
        inline_hits[1]
    );
    let mut table = Table::new(&[
        "what",
        "provider",
        "count",
        "p50 ns",
        "p99 ns",
        "p99.9 ns",
        "p99.99 ns",
        "max ns",
    ]);
    // Before the floor's buffer exists: the providers' memory (acmrs's path storage) only.
    let thp = acm_bench::anon_huge_bytes();
    // The memory floor of this run: one dependent load over a buffer as large as acmrs's path
    // storage, in the page mode the plugin gives it.
    progress(format_args!("child {entries}: memory floor"));
    let sf = acm_bench::storage_floor(acmrs_capacity, &mut XorShift::new(0xf100 ^ a.size as u64));
    let (fl, floor) = (&sf.floor, sf.floor.ns);
    for (what, tag, hs) in [
        ("hit", "hit", &hits),
        ("miss by LID (OpenSM SA)", "miss-lid", &miss_lid),
        ("miss by GID (OpenSM SA)", "miss-gid", &miss_gid),
        ("miss, provider's own time", "miss-own", &miss_own),
        ("miss own: resolve() -> SA send", "miss-send", &miss_send),
        ("miss own: SA reply -> answer", "miss-reply", &miss_reply),
    ] {
        let s: Vec<Summary> = hs.iter().map(LatencyHistogram::summary).collect();
        for (k, o) in provs.iter().enumerate() {
            let mut row = vec![what.to_string(), o.name.to_string(), s[k].count.to_string()];
            row.extend(Table::latency_cells(&s[k]));
            table.row(row);
            if let Some(out) = &a.common.out {
                std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
                let f = out.join(format!("samehost-{}-{tag}-{entries}.hgrm", o.name));
                hs[k].write_hgrm(&f).map_err(|e| e.to_string())?;
            }
        }
        if let Some(out) = &a.common.out {
            // acmrs first (blue), stock second (red), as in every plot of the benches.
            let f = out.join(format!("samehost-{tag}-{entries}.svg"));
            let title =
                format!("resolve(), {what}, {entries} cached paths (same process, same fabric)");
            let mut series = vec![
                Series {
                    label: "acmrs",
                    histogram: &hs[1],
                },
                Series {
                    label: "stock libibacmp",
                    histogram: &hs[0],
                },
            ];
            // The hit plot has the memory floor too: one dependent load over a buffer as
            // large as acmrs's path storage (per-load time of blocks of FLOOR_BLOCK loads).
            if tag == "hit" {
                series.push(Series {
                    label: "memory floor (1 dependent load)",
                    histogram: &fl.per_load,
                });
                series.push(Series {
                    label: "one line alone (between the hits)",
                    histogram: &line_alone,
                });
            }
            write_percentile_svg(&f, &title, &series)
                .map_err(|e| format!("{}: {e}", f.display()))?;
        }
        // `label` = num/den at each percentile of the table.
        let ratio_row = |label: &str, num: &Summary, den: &Summary| {
            let r = |x: f64, y: f64| {
                if y > 0.0 {
                    format!("{:.2}x", x / y)
                } else {
                    "n/a".into()
                }
            };
            vec![
                what.to_string(),
                label.to_string(),
                String::new(),
                r(num.p50_ns, den.p50_ns),
                r(num.p99_ns, den.p99_ns),
                r(num.p999_ns, den.p999_ns),
                r(num.p9999_ns, den.p9999_ns),
                r(num.max_ns, den.max_ns),
            ]
        };
        table.row(ratio_row("ratio stock/acmrs", &s[0], &s[1]));
        if tag == "hit" {
            // The bound: one line of acmrs-sized memory read alone between the hits, and
            // stock's time over it (no provider that reads its entry from such memory gets a
            // larger ratio in this run).
            let l = line_alone.summary();
            let mut row = vec![
                what.to_string(),
                "one line alone".into(),
                l.count.to_string(),
            ];
            row.extend(Table::latency_cells(&l));
            table.row(row);
            table.row(ratio_row("ratio stock/line alone", &s[0], &l));
            if let Some(out) = &a.common.out {
                let f = out.join(format!("samehost-line-alone-hit-{entries}.hgrm"));
                line_alone.write_hgrm(&f).map_err(|e| e.to_string())?;
            }
        }
    }
    let s: Vec<Summary> = hits.iter().map(LatencyHistogram::summary).collect();
    for (k, o) in provs.iter().enumerate() {
        let mut row = vec!["hit ×floor".into(), o.name.to_string(), String::new()];
        row.extend(Table::floor_cells(&s[k], floor));
        table.row(row);
    }
    println!(
        "{}; this process's THP-backed memory after the hits: {:.1} MiB\n",
        sf.describe(),
        thp as f64 / (1 << 20) as f64
    );
    println!("{}", table.render());
    Ok(())
}
