//! Isolated misses (issue 20, "measure first"): both providers in one process on the same
//! simulated fabric as the hit child ([`super::samehost`]), thousands of misses one at a time by
//! LID, by GID and by name over the ACM protocol, the bare transports of each path timed in
//! the same run, the provider's own time split into legs, and the CPU each provider's threads
//! use per 1 000 misses and per idle second.
//!
//! **Repeatable misses.** The fabric has `max_lid` destinations. Both providers run with
//! `addr_timeout 0` and `route_timeout 0` (the same two lines in both opts files, no route
//! preload): a record learned from the network is never reused, so every request for the same
//! destination is a miss again, for both.
//! * stock (acmp.c): a learned record gets `addr_timeout = now_min + 0`; `acmp_acquire_dest`
//!   finds it with `addr_timeout - now_min <= 0`, removes it ("Record expired") and starts from
//!   a new destination: SA query (and, for a name, the ACM query first).
//! * acmrs: a learned path or address gets `expires = now + 0`; a lookup compares `now >=
//!   expires` (any coarse-clock staleness still reads expired) and misses.
//!
//! Every sample is checked: status 0, the right destination, and an SA MAD sent during that
//! very call; the report counts the requests answered without one (must be 0).
//!
//! **acmrs's SA transport.** One child per poll mode and `--acmrs-sa-transport`:
//! * `core`: acmrs's SA MADs go through this host core's umad service, as stock's do, so both
//!   providers' misses pay the same SA round trip and the host core stamps both;
//! * `ud`: acmrs's default, its own UD QP over simverbs' GSI bridge. The host core sees none
//!   of its SA MADs (checked per miss: one through the host core fails the child); acmrs's
//!   own `sa_rtt` histogram, read from its stats socket after each of its misses, proves the
//!   SA MAD and gives that miss's round trip (query posted → reply taken by its loop). Its
//!   provider-attributable time is its end to end minus the bare UD transport.
//!
//! **Names.** The parent starts one real ibacm daemon (stock libibacmp) on another HCA; the
//! requests are RESOLVE with a NAME source (`bench-stock` / `bench-acmrs`, one per provider so
//! the peer never sees a source name change QPN) and the peer's node name as destination: the
//! requesting provider multicasts the ACM query, the peer answers, the provider then asks the
//! SA for the path to the peer's GID.
//!
//! **Bare transports**, interleaved with the misses (same destinations):
//! * SA by umad: one PathRecord GET, built as the providers build theirs, through this host
//!   core's SA service (`acm_send_sa_mad` → simverbs' umad → ibsim → OpenSM → the receive thread →
//!   handler): the path both providers' SA MADs take here (acmrs with `acmrs_sa_transport
//!   core`);
//! * SA by UD: the same MAD posted on a `simverbs` UD QP (`acm_dataplane::verbs::UdEndpoint`,
//!   acmrs's own endpoint code) to the SM's QP1 through simverbs' GSI bridge, the completion
//!   channel slept on: the path of acmrs's default `acmrs_sa_transport ud`;
//! * ACM by UD: an ACM-shaped MAD from one UD endpoint to a second one and back (two
//!   datagrams, each receiver asleep on its channel, in this process): the transport of an
//!   ACM query and its response, which both providers send on their own UD QP over simverbs.

use super::samehost::{
    leak, open_provider, path_msg, resolve_timed, wait_seq, Answer, HostCore, Opened, BLOCK_WAIT,
    LOG, RECV_NS, SEND_NS, STOCK_LIB, WAKE_SEQ,
};
use acm_bench::wait_ud;
use acm_core_nostd::resolver::{AcmDest, UnicastAv};
use acm_core_nostd::sa_channel::SmAddr;
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::mcmember::ACM_QKEY;
use acm_dataplane::export::{self, HISTS};
use acm_dataplane::stats::Snapshot;
use acm_dataplane::verbs::{self, UdConfig, UdEndpoint};
use acm_report::plot::{write_percentile_svg, Series};
use acm_report::{progress, LatencyHistogram, Summary, Table};
use acm_testkit::core::{self as fake, Record};
use acm_testkit::host::provider_table;
use acm_testkit::request::dest_request;
use acmrs::ffi::*;
use std::collections::BTreeSet;
use std::ffi::{c_int, c_void, CString};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The miss child's command line (`provider samehost-miss-child …`).
#[derive(clap::Args, Debug)]
pub struct MissArgs {
    /// Timed misses per provider and form (LID, GID, name).
    #[arg(long)]
    misses: usize,
    #[command(flatten)]
    common: super::samehost::CommonArgs,
    /// The node name the peer daemon owns (empty: no name misses).
    #[arg(long, default_value = "")]
    peer_name: String,
    /// The peer's LID (readiness probe).
    #[arg(long)]
    peer_lid: u16,
    /// Idle time measured after the misses (ms).
    #[arg(long)]
    idle_ms: u64,
    /// acmrs's worker alone on this CPU (`acmrs_cpu`); every other thread of this process
    /// off it (the parent keeps the fabric's processes off it too).
    #[arg(long)]
    dedicated_cpu: Option<usize>,
    /// acmrs's `acmrs_sa_transport`: `core` (the host core's umad SA service, the path stock
    /// takes) or `ud` (its own UD QP over simverbs' GSI bridge, its default).
    #[arg(long, default_value = "core", value_parser = ["core", "ud"])]
    acmrs_sa_transport: String,
}

impl MissArgs {
    /// acmrs asks the SA on its own UD QP: its SA MADs never pass the host core's stamps.
    fn acmrs_ud(&self) -> bool {
        self.acmrs_sa_transport == "ud"
    }

    /// The tag of this run's files: the poll mode, `-ud` added for acmrs on its own QP.
    fn run_tag(&self) -> String {
        match self.acmrs_ud() {
            true => format!("{}-ud", self.common.poll_mode),
            false => self.common.poll_mode.clone(),
        }
    }
}

// ---- a watchdog: the child names where it is stuck instead of hanging silently ----------

/// Bumped by every request and bare query; the watchdog fails the child when it stands still.
static PROGRESS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// The phase the watchdog names: 0 setup, 1 rounds, 2 CPU stock, 3 CPU acmrs, 4 idle/report.
static PHASE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

fn step() {
    PROGRESS.fetch_add(1, Ordering::Relaxed);
}

fn start_watchdog(idle_ms: u64) {
    std::thread::Builder::new()
        .name("bench-watchdog".into())
        .spawn(move || {
            let limit = Duration::from_millis(idle_ms) + Duration::from_secs(60);
            let (mut last, mut since) = (u64::MAX, Instant::now());
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let now = PROGRESS.load(Ordering::Relaxed);
                if now != last {
                    (last, since) = (now, Instant::now());
                } else if since.elapsed() > limit {
                    let phase = ["setup", "rounds", "CPU stock", "CPU acmrs", "idle/report"]
                        [PHASE.load(Ordering::Relaxed).min(4) as usize];
                    eprintln!(
                        "provider (miss child): no progress for {limit:?} in phase {phase} after \
                         {now} steps; giving up"
                    );
                    std::process::exit(3);
                }
            }
        })
        .ok();
}

// ---- threads and their CPU time --------------------------------------------------------------

fn tids() -> BTreeSet<i32> {
    acm_fabric::process::threads_of(std::process::id() as i32)
        .into_iter()
        .collect()
}

/// acmrs's worker (`acmrs-dataplane`, pinned by `acmrs_cpu`) alone on `cpu`: every other
/// thread of this process goes off it (threads started later inherit that).
fn dedicate(cpu: usize, threads: &BTreeSet<i32>) -> Result<(), String> {
    let others = acm_bench::cpus_but(cpu);
    if others.is_empty() {
        return Err(format!(
            "CPU {cpu} is the only one: nothing left for the rest"
        ));
    }
    let mut worker = None;
    for &tid in threads {
        if comm(tid) == "acmrs-dataplane" {
            worker = Some(tid);
        } else {
            acm_bench::set_thread_cpus(tid, &others)?;
        }
    }
    let Some(worker) = worker else {
        return Err("no acmrs-dataplane thread to give a CPU to".into());
    };
    // The worker pinned itself (acmrs_cpu): to that CPU alone.
    let status = std::fs::read_to_string(format!("/proc/self/task/{worker}/status"))
        .map_err(|e| e.to_string())?;
    let allowed = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(str::trim);
    if allowed != Some(cpu.to_string().as_str()) {
        return Err(format!(
            "acmrs-dataplane runs on CPUs {allowed:?}, not CPU {cpu} alone (acmrs_cpu {cpu})"
        ));
    }
    Ok(())
}

fn comm(tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// CPU time of thread `tid` of this process (ns): its per-thread CPU clock
/// (`MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)`), 0 once it is gone.
fn thread_cpu_ns(tid: i32) -> u64 {
    let id: libc::clockid_t = ((!(tid as libc::clockid_t)) << 3) | 6;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime with a valid out-pointer; an invalid clock returns an error.
    if unsafe { libc::clock_gettime(id, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn cpu_of(set: &BTreeSet<i32>) -> u64 {
    set.iter().map(|&t| thread_cpu_ns(t)).sum()
}

fn describe_threads(set: &BTreeSet<i32>) -> String {
    let mut names: Vec<String> = set.iter().map(|&t| comm(t)).collect();
    names.sort();
    format!("{} ({})", set.len(), names.join(", "))
}

// ---- the bare transports ----------------------------------------------------------------------

type PathMadFn = extern "C" fn(u16, u16, *const u8, u64, *mut u8);
type BareSendFn = extern "C" fn(u16, u16, *const u8, u64) -> c_int;
type BareDoneFn = extern "C" fn(*mut c_int, *mut u16) -> c_int;

struct Bare {
    path_mad: PathMadFn,
    sa_send: BareSendFn,
    sa_done: BareDoneFn,
    /// The UD endpoint that asks the SA, and the two that ping ACM-shaped MADs.
    ud_sa: UdEndpoint,
    acm_a: UdEndpoint,
    acm_b: UdEndpoint,
    sm: AcmDest,
    to_a: AcmDest,
    to_b: AcmDest,
    lid: u16,
    tid: u64,
}

fn unicast(dlid: u16, dgid: [u8; 16], qpn: u32) -> AcmDest {
    AcmDest::Unicast(UnicastAv {
        dlid,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        dgid: Gid(dgid),
        flow_label: 0,
        hop_limit: 1,
        tclass: 0,
        remote_qpn: qpn,
        remote_qkey: ACM_QKEY,
    })
}

impl Bare {
    fn open(host: &HostCore) -> Result<Bare, String> {
        let f = |n: &std::ffi::CStr| super::samehost::sym(host.lib, n);
        let (pm, ss, sd) = (
            f(c"acmbench_path_mad")?,
            f(c"acmbench_bare_sa_send")?,
            f(c"acmbench_bare_sa_done")?,
        );
        let ctx = host.info.verbs as *mut verbs::IbvContext;
        // SAFETY: the host core's open verbs context, alive for the process.
        let pkey_index = unsafe { verbs::pkey_index(ctx, 1, 0xffff) }.unwrap_or(0);
        let cfg = UdConfig {
            port_num: 1,
            pkey_index,
            qkey: ACM_QKEY,
            recv_depth: 64,
            send_depth: 16,
        };
        let open = || {
            // SAFETY: as above; the endpoints are dropped before the process exits.
            unsafe { UdEndpoint::open(ctx, &cfg) }.map_err(|e| format!("UdEndpoint::open: {e}"))
        };
        let (ud_sa, acm_a, acm_b) = (open()?, open()?, open()?);
        let (lid, gid) = (host.info.lid, host.info.gid0);
        let to_a = unicast(lid, gid, acm_a.qpn());
        let to_b = unicast(lid, gid, acm_b.qpn());
        Ok(Bare {
            // SAFETY: the signatures of host_core.c's functions.
            path_mad: unsafe { std::mem::transmute::<*mut c_void, PathMadFn>(pm) },
            // SAFETY: as above.
            sa_send: unsafe { std::mem::transmute::<*mut c_void, BareSendFn>(ss) },
            // SAFETY: as above.
            sa_done: unsafe { std::mem::transmute::<*mut c_void, BareDoneFn>(sd) },
            ud_sa,
            acm_a,
            acm_b,
            sm: SmAddr {
                lid: host.info.sm_lid,
                sl: host.info.sm_sl,
            }
            .dest(),
            to_a,
            to_b,
            lid,
            tid: 0x7ead_0000,
        })
    }

    /// One PathRecord GET through the host core's umad SA service: `acm_send_sa_mad` entered
    /// → reply matched on the SA thread (the stamps of a provider's "SA round trip").
    fn sa_umad(&mut self, dlid: u16, dgid: Option<&[u8; 16]>) -> Result<u64, String> {
        step();
        self.tid += 1;
        let g = dgid.map_or(std::ptr::null(), |g| g.as_ptr());
        SEND_NS.store(0, Ordering::Relaxed);
        RECV_NS.store(0, Ordering::Relaxed);
        if (self.sa_send)(self.lid, dlid, g, self.tid) != 0 {
            return Err("bare SA send (umad) failed".into());
        }
        let (mut st, mut got) = (0, 0u16);
        let start = Instant::now();
        loop {
            let seen = WAKE_SEQ.load(Ordering::Acquire);
            if (self.sa_done)(&mut st, &mut got) != 0 {
                break;
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Err("bare SA (umad): no reply in 10 s".into());
            }
            wait_seq(seen);
        }
        let t = RECV_NS
            .load(Ordering::Relaxed)
            .saturating_sub(SEND_NS.load(Ordering::Relaxed));
        if st != 0 || (dgid.is_none() && got != dlid) {
            return Err(format!("bare SA (umad) to {dlid}: status {st}, DLID {got}"));
        }
        Ok(t)
    }

    /// The same MAD on a UD QP over simverbs to the SM's QP1 (GSI bridge), the completion
    /// channel slept on.
    fn sa_ud(&mut self, dlid: u16, dgid: Option<&[u8; 16]>) -> Result<u64, String> {
        step();
        self.tid += 1;
        let mut mad = [0u8; 256];
        let g = dgid.map_or(std::ptr::null(), |g| g.as_ptr());
        (self.path_mad)(self.lid, dlid, g, self.tid, mad.as_mut_ptr());
        let tid = self.tid.to_be_bytes();
        let t0 = fake::now_ns();
        self.ud_sa
            .send(&self.sm, &mad)
            .map_err(|e| format!("bare SA send (UD): {e:?}"))?;
        let mut reply = None;
        wait_ud(&mut self.ud_sa, "bare SA (UD): no reply in 10 s", |m| {
            if m[8..16] == tid && m[3] == 0x81 {
                reply = Some((
                    u16::from_be_bytes([m[4], m[5]]),
                    u16::from_be_bytes([m[96], m[97]]),
                ));
            }
            reply.is_some()
        })?;
        let t = fake::now_ns() - t0;
        let (st, got) = reply.unwrap_or_default();
        if st != 0 || (dgid.is_none() && got != dlid) {
            return Err(format!(
                "bare SA (UD) to {dlid}: status {st:#x}, DLID {got}"
            ));
        }
        Ok(t)
    }

    /// An ACM-shaped MAD A → B, then B → A, each receiver asleep on its channel: one query
    /// and one response.
    fn acm_ud(&mut self) -> Result<u64, String> {
        step();
        self.tid += 1;
        let mut mad = [0u8; 256];
        mad[..4].copy_from_slice(&[1, 0x2c, 1, 1]);
        mad[8..16].copy_from_slice(&self.tid.to_be_bytes());
        let tid = self.tid.to_be_bytes();
        let t0 = fake::now_ns();
        self.acm_a
            .send(&self.to_b, &mad)
            .map_err(|e| format!("bare ACM send: {e:?}"))?;
        wait_ud(
            &mut self.acm_b,
            "bare ACM: query not delivered in 10 s",
            |m| m[8..16] == tid,
        )?;
        mad[3] = 0x81;
        self.acm_b
            .send(&self.to_a, &mad)
            .map_err(|e| format!("bare ACM response send: {e:?}"))?;
        wait_ud(
            &mut self.acm_a,
            "bare ACM: response not delivered in 10 s",
            |m| m[8..16] == tid && m[3] == 0x81,
        )?;
        Ok(fake::now_ns() - t0)
    }
}

// ---- per provider and form ------------------------------------------------------------------

const FORMS: [&str; 3] = ["lid", "gid", "name"];

/// acmrs's own legs of a miss, from its live histograms (docs/stats.md): (histogram on the
/// stats socket, report row, file tag).
const PLUGIN_LEGS: [(&str, &str, &str); 4] = [
    (
        "miss_queued",
        "inside acmrs: handed to the loop → the round takes it",
        "in-queued",
    ),
    (
        "miss_to_query",
        "inside acmrs: the round takes it → query sent",
        "in-to-query",
    ),
    (
        "reply_wait",
        "inside acmrs: SA reply handed over → the round takes it",
        "in-reply-wait",
    ),
    (
        "reply_to_answer",
        "inside acmrs: reply taken → answer delivered",
        "in-reply-answer",
    ),
];

/// acmrs's histograms `names` now, read from its stats socket (one endpoint).
fn plugin_hists<const N: usize>(socket: &Path, names: [&str; N]) -> Result<[Snapshot; N], String> {
    let text = export::fetch(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    let r = export::decode(&text).map_err(|e| format!("{}: {e}", socket.display()))?;
    let [ep] = &r.endpoints[..] else {
        return Err(format!(
            "{} endpoints on the stats socket, not 1",
            r.endpoints.len()
        ));
    };
    let mut out: [Snapshot; N] = std::array::from_fn(|_| Snapshot::default());
    for (o, name) in out.iter_mut().zip(names) {
        let k = HISTS
            .iter()
            .position(|h| h.0 == name)
            .ok_or_else(|| format!("no histogram {name} on the stats socket"))?;
        *o = ep.hists[k].clone();
    }
    Ok(out)
}

/// acmrs's [`PLUGIN_LEGS`] histograms now.
fn plugin_legs(socket: &Path) -> Result<[Snapshot; 4], String> {
    plugin_hists(socket, PLUGIN_LEGS.map(|l| l.0))
}

/// acmrs's SA round trips so far (`sa_rtt`: query sent → reply taken by its loop): on the
/// `ud` transport, the only record of a miss's SA MAD (the host core never sees it).
fn sa_rtt(socket: &Path) -> Result<Snapshot, String> {
    plugin_hists(socket, ["sa_rtt"]).map(|[s]| s)
}

/// [`sa_rtt`] once it holds at least `n` round trips, or after 50 ms: the loop records a
/// round trip once the reply's answers are out, so an answer can come before its record.
fn sa_rtt_reaching(socket: &Path, n: u64) -> Result<Snapshot, String> {
    let t = Instant::now();
    loop {
        let now = sa_rtt(socket)?;
        if now.count() >= n || t.elapsed() > Duration::from_millis(50) {
            return Ok(now);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// The histograms of one provider and form.
#[derive(Default)]
struct Form {
    e2e: LatencyHistogram,
    /// SA send → SA reply matched (the fabric round trip as this miss saw it).
    transport: LatencyHistogram,
    /// End to end minus `transport`.
    own: LatencyHistogram,
    /// resolve() entry → resolve() returned.
    call: LatencyHistogram,
    /// resolve() entry → SA send (`acm_send_sa_mad` entered).
    to_send: LatencyHistogram,
    /// resolve() returned → SA send (0 when the MAD left before resolve() returned).
    ret_to_send: LatencyHistogram,
    /// SA reply matched → answer delivered (`acm_resolve_response`).
    reply_answer: LatencyHistogram,
    /// SA reply matched → the provider's reply handler returned.
    reply_handler: LatencyHistogram,
    /// Handler returned → answer delivered (0 when answered inside the handler).
    handler_answer: LatencyHistogram,
    /// acmrs only: its own legs ([`PLUGIN_LEGS`]) over this form's misses.
    plugin: [LatencyHistogram; 4],
    failed: usize,
    without_sa: usize,
}

impl Form {
    /// Records one miss. `sa_ns`: its SA round trip as the provider measured it (acmrs on its
    /// own UD QP); `None`: the host core's stamps, which also give the legs around them.
    fn record(&mut self, a: &Answer, sa_ns: Option<u64>) {
        self.e2e.record(ns(a.ns));
        self.call.record(ns(a.ret_at));
        if let Some(t) = sa_ns {
            self.transport.record(ns(t));
            self.own.record(ns(a.ns.saturating_sub(t)));
            return;
        }
        let transport = a.recv_at.saturating_sub(a.send_at);
        self.transport.record(ns(transport));
        self.own.record(ns(a.ns.saturating_sub(transport)));
        self.to_send.record(ns(a.send_at));
        self.ret_to_send
            .record(ns(a.send_at.saturating_sub(a.ret_at)));
        self.reply_answer.record(ns(a.ns.saturating_sub(a.recv_at)));
        let handled = a.handled_at.max(a.recv_at);
        self.reply_handler.record(ns(handled - a.recv_at));
        self.handler_answer.record(ns(a.ns.saturating_sub(handled)));
    }

    /// Adds acmrs's own legs recorded between the snapshots `before` and `after`.
    fn add_plugin(&mut self, before: &[Snapshot; 4], after: &[Snapshot; 4]) {
        for (h, (b, a)) in self.plugin.iter_mut().zip(before.iter().zip(after)) {
            h.merge(&LatencyHistogram::from_ns_counts(a.since(b).values()));
        }
    }
}

/// Which histogram of a [`Form`] a report row shows.
type Leg = fn(&Form) -> &LatencyHistogram;

fn cnt(h: &LatencyHistogram) -> usize {
    h.raw().len() as usize
}

fn ns(v: u64) -> Duration {
    Duration::from_nanos(v)
}

fn opts_common() -> String {
    "log_level 0\nroute_prot sa\naddr_prot acm\nroute_preload none\naddr_preload none\n\
     loopback_prot local\ntimeout 2000\nretries 2\naddr_timeout 0\nroute_timeout 0\n"
        .to_string()
}

fn address(ep: &'static AcmEndpoint, name: &str) -> Result<AcmAddress, String> {
    let mut info = AcmEpInfo { bytes: [0; 64] };
    info.bytes[..name.len()].copy_from_slice(name.as_bytes());
    Ok(AcmAddress {
        endpoint: ep,
        info,
        id_string: CString::new(name).map_err(|e| e.to_string())?.into_raw(),
        type_: ACM_ADDRESS_NAME,
    })
}

/// Entry of the miss child (under the preload, cwd = its scratch directory).
pub fn child(a: &MissArgs) -> Result<(), String> {
    fake::record(Record::Last);
    BLOCK_WAIT.store(true, Ordering::Relaxed);
    start_watchdog(a.idle_ms);
    let dir = std::env::current_dir().map_err(|e| e.to_string())?;
    let log_level = if LOG.load(Ordering::Relaxed) { 2 } else { 0 };
    let host = HostCore::up(&dir, log_level)?;
    let info = &host.info;
    let lid = info.lid;
    let stock_opts = dir.join("stock_opts.cfg");
    let acmrs_opts = dir.join("acmrs_opts.cfg");
    // Its live histograms give acmrs's own legs (read between the blocks of misses).
    let stat_socket = dir.join("acmrs.sock");
    std::fs::write(&stock_opts, opts_common()).map_err(|e| e.to_string())?;
    std::fs::write(
        &acmrs_opts,
        format!(
            "{}acmrs_path_capacity 8192\nacmrs_request_capacity 4096\n\
             acmrs_pending_capacity 4096\nacmrs_stat_socket {}\nacmrs_poll_mode {}\n\
             acmrs_sa_transport {}\n{}",
            opts_common(),
            stat_socket.display(),
            a.common.poll_mode,
            a.acmrs_sa_transport,
            a.dedicated_cpu
                .map(|c| format!("acmrs_cpu {c}\n"))
                .unwrap_or_default()
        ),
    )
    .map_err(|e| e.to_string())?;
    let dev = leak(AcmDevice {
        verbs: info.verbs,
        dev_guid: info.dev_guid,
    });
    let port = leak(AcmPort { dev, port_num: 1 });
    let ep = leak(AcmEndpoint { port, pkey: 0xffff });
    let names = ["bench-stock", "bench-acmrs"];
    // Threads: those born while a provider was loaded and opened are that provider's.
    let t_before = tids();
    fake::set_opts_file(&stock_opts);
    let stock = provider_table(Path::new(STOCK_LIB))?;
    let o_stock = open_provider("stock", stock, dev, port, ep, &address(ep, names[0])?)?;
    let t_stock = tids();
    fake::set_opts_file(&acmrs_opts);
    let acmrs = provider_table(&a.common.acmrs)?;
    let o_acmrs = open_provider("acmrs", acmrs, dev, port, ep, &address(ep, names[1])?)?;
    let provs = [o_stock, o_acmrs];
    // Ready: a LID miss to the peer answered with success (stock: after its multicast join).
    let t_open = Instant::now();
    let mut tid = 1u64;
    let mut ready_ms = [0u128; 2];
    for (k, o) in provs.iter().enumerate() {
        loop {
            tid += 1;
            let mut m = path_msg(tid, lid, a.peer_lid, None);
            let ans = resolve_timed(o, &mut m, Duration::from_secs(15))?;
            if ans.status == 0 {
                break;
            }
            if t_open.elapsed() > Duration::from_secs(60) {
                return Err(format!("{}: not ready after 60 s", o.name));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        ready_ms[k] = t_open.elapsed().as_millis();
    }
    // Both joins out, every SA MAD answered, the SA quiet for 200 ms.
    let (mut last, mut since) = (host.stats(), Instant::now());
    while last[1] < last[0] || since.elapsed() < Duration::from_millis(200) {
        if t_open.elapsed() > Duration::from_secs(90) {
            return Err("SA not quiet 30 s after ready".into());
        }
        std::thread::sleep(Duration::from_millis(5));
        let now = host.stats();
        if now[0] != last[0] {
            since = Instant::now();
        }
        last = now;
    }
    let t_acmrs = tids();
    if let Some(cpu) = a.dedicated_cpu {
        dedicate(cpu, &t_acmrs)?;
    }
    let threads = [
        t_stock
            .difference(&t_before)
            .copied()
            .collect::<BTreeSet<_>>(),
        t_acmrs
            .difference(&t_stock)
            .copied()
            .collect::<BTreeSet<_>>(),
    ];
    let mut bare = Bare::open(&host)?;
    PHASE.store(1, Ordering::Relaxed);
    let dests: Vec<u16> = (1..=a.common.max_lid).filter(|&d| d != lid).collect();
    let names_on = !a.peer_name.is_empty();
    progress(format_args!(
        "miss child ({}): ready (stock {} ms, acmrs {} ms); {} isolated misses per provider by \
         LID, GID{} in rounds over {} destinations",
        a.common.poll_mode,
        ready_ms[0],
        ready_ms[1],
        a.misses,
        if names_on { ", name" } else { "" },
        dests.len()
    ));
    let mut forms: [[Form; 3]; 2] = Default::default();
    let mut bare_h: [LatencyHistogram; 5] = Default::default();
    let mut dgids: Vec<[u8; 16]> = Vec::new();
    let t_misses = Instant::now();
    let sa0 = host.stats()[0];
    let mut round = 0usize;
    let done = |f: &[[Form; 3]; 2], i: usize| f.iter().all(|p| cnt(&p[i].e2e) >= a.misses);
    let mut tries = 0usize;
    // acmrs on `ud`: its SA MADs are seen in its own `sa_rtt` histogram, read after each of
    // its misses (outside the timed call); the host core must see none of them.
    let ud = a.acmrs_ud();
    let mut rtt_last = if ud {
        sa_rtt(&stat_socket)?
    } else {
        Snapshot::default()
    };
    // Off in the CPU phase: a read of the stats socket per miss would be CPU of acmrs's
    // export thread; that phase checks its block's SA round trips once instead.
    let per_sample = std::cell::Cell::new(true);
    let mut one = |k: usize, m: &mut AcmMsg, f: &mut Form| -> Result<Option<Answer>, String> {
        step();
        let sa = host.stats()[0];
        let ans = resolve_timed(&provs[k], m, Duration::from_secs(15))?;
        if ans.status != 0 {
            f.failed += 1;
            return Ok(None);
        }
        let own_qp = ud && k == 1;
        if own_qp && host.stats()[0] != sa {
            return Err(
                "acmrs on acmrs_sa_transport ud sent an SA MAD through the host \
                        core's SA service"
                    .into(),
            );
        }
        // Whether this miss sent an SA MAD, and its round trip where acmrs measured it.
        let (sent, own_rtt) = if !own_qp {
            (host.stats()[0] != sa, None)
        } else if !per_sample.get() {
            // The CPU phase checks its block's round trips once, after it.
            (true, None)
        } else {
            // None within 50 ms: no SA MAD in this miss.
            let now = sa_rtt_reaching(&stat_socket, rtt_last.count() + 1)?;
            let d = now.since(&rtt_last);
            rtt_last = now;
            (d.count() > 0, Some(d.sum_ns))
        };
        if !sent {
            f.without_sa += 1;
            return Ok(None);
        }
        f.record(&ans, own_rtt);
        Ok(Some(ans))
    };
    while !(done(&forms, 0)
        && (dgids.is_empty() || done(&forms, 1))
        && (!names_on || done(&forms, 2)))
    {
        tries += 1;
        if tries > 4 * (a.misses / dests.len().max(1) + 2) {
            return Err("too many rounds: misses keep failing or hitting (see the counts)".into());
        }
        if !done(&forms, 0) {
            let legs0 = plugin_legs(&stat_socket)?;
            for (i, &d) in dests.iter().enumerate() {
                for k in [(i + round) % 2, 1 - (i + round) % 2] {
                    tid += 1;
                    let mut m = path_msg(tid, lid, d, None);
                    let ans = one(k, &mut m, &mut forms[k][0])?;
                    let got = ans
                        .as_ref()
                        .map(|x| u16::from_be_bytes([x.path[40], x.path[41]]));
                    if got.is_some_and(|g| g != d) {
                        return Err(format!("{} LID miss to {d}: DLID {got:?}", provs[k].name));
                    }
                    if let (0, 0, Some(x)) = (round, k, &ans) {
                        let mut g = [0u8; 16];
                        g.copy_from_slice(&x.path[8..24]);
                        dgids.push(g);
                    }
                }
                bare_h[0].record(ns(bare.sa_umad(d, None)?));
                bare_h[1].record(ns(bare.sa_ud(d, None)?));
            }
            forms[1][0].add_plugin(&legs0, &plugin_legs(&stat_socket)?);
        }
        if !done(&forms, 1) {
            let legs0 = plugin_legs(&stat_socket)?;
            for (i, g) in dgids.iter().enumerate() {
                for k in [(i + round) % 2, 1 - (i + round) % 2] {
                    tid += 1;
                    let mut m = path_msg(tid, lid, 0, Some(*g));
                    if let Some(x) = one(k, &mut m, &mut forms[k][1])? {
                        if x.path[8..24] != g[..] {
                            return Err(format!("{} GID miss: wrong DGID", provs[k].name));
                        }
                    }
                }
                bare_h[2].record(ns(bare.sa_umad(0, Some(g))?));
                bare_h[3].record(ns(bare.sa_ud(0, Some(g))?));
            }
            forms[1][1].add_plugin(&legs0, &plugin_legs(&stat_socket)?);
        }
        if names_on && !done(&forms, 2) {
            let legs0 = plugin_legs(&stat_socket)?;
            for i in 0..dests.len() {
                for k in [(i + round) % 2, 1 - (i + round) % 2] {
                    tid += 1;
                    let mut m = dest_request(
                        tid,
                        (ACM_ADDRESS_NAME, names[k].as_bytes()),
                        (ACM_ADDRESS_NAME, a.peer_name.as_bytes()),
                        0,
                    );
                    if let Some(x) = one(k, &mut m, &mut forms[k][2])? {
                        let dlid = u16::from_be_bytes([x.path[40], x.path[41]]);
                        if dlid != a.peer_lid {
                            return Err(format!(
                                "{} name miss: DLID {dlid}, the peer is {}",
                                provs[k].name, a.peer_lid
                            ));
                        }
                    }
                }
                bare_h[4].record(ns(bare.acm_ud()?));
            }
            forms[1][2].add_plugin(&legs0, &plugin_legs(&stat_socket)?);
        }
        round += 1;
    }
    let miss_wall = t_misses.elapsed();
    let sa_during = host.stats()[0] - sa0;
    // CPU: per provider, a block of LID misses to that provider alone (the other one idle),
    // its threads' CPU clocks read around the block, the caller thread's CPU inside each
    // resolve() and the host SA thread's time in its reply handler added; then both idle.
    let cpu_n = a.misses.min(1000);
    progress(format_args!(
        "miss child ({}): {round} rounds in {:.1} s; CPU: {cpu_n} LID misses per provider \
         alone, then {} ms idle",
        a.common.poll_mode,
        miss_wall.as_secs_f64(),
        a.idle_ms
    ));
    super::samehost::CALL_CPU.store(true, Ordering::Relaxed);
    per_sample.set(false);
    let mut cpu = [Cpu::default(), Cpu::default()];
    for (k, c) in cpu.iter_mut().enumerate() {
        PHASE.store(2 + k as u8, Ordering::Relaxed);
        let mut f = Form::default();
        let own_qp = ud && k == 1;
        let rtt0 = if own_qp {
            sa_rtt(&stat_socket)?.count()
        } else {
            0
        };
        let (t0, w0) = (cpu_of(&threads[k]), Instant::now());
        for i in 0..cpu_n {
            tid += 1;
            let mut m = path_msg(tid, lid, dests[i % dests.len()], None);
            if let Some(x) = one(k, &mut m, &mut f)? {
                c.call_ns += x.call_cpu_ns;
                c.handler_ns += x.handled_at.max(x.recv_at) - x.recv_at;
                c.n += 1;
            }
        }
        c.threads_ns = cpu_of(&threads[k]) - t0;
        c.wall = w0.elapsed();
        if own_qp {
            let sent = sa_rtt_reaching(&stat_socket, rtt0 + c.n)?.count() - rtt0;
            if sent < c.n {
                return Err(format!(
                    "CPU phase: {} acmrs misses answered, {sent} SA round trips on its QP",
                    c.n
                ));
            }
        }
    }
    super::samehost::CALL_CPU.store(false, Ordering::Relaxed);
    PHASE.store(4, Ordering::Relaxed);
    step();
    std::thread::sleep(Duration::from_millis(200));
    let idle0 = [cpu_of(&threads[0]), cpu_of(&threads[1])];
    std::thread::sleep(Duration::from_millis(a.idle_ms));
    for (k, c) in cpu.iter_mut().enumerate() {
        c.idle_ns = cpu_of(&threads[k]) - idle0[k];
    }
    report(a, &provs, &forms, &bare_h, &threads, &cpu, sa_during, round)
}

/// CPU of one provider: a block of misses to it alone, then idle.
#[derive(Default)]
struct Cpu {
    n: u64,
    /// Its own threads over the block.
    threads_ns: u64,
    /// The caller's thread inside resolve() (CPU clock).
    call_ns: u64,
    /// The host core's SA receive thread inside the provider's reply handler (wall time).
    handler_ns: u64,
    wall: Duration,
    /// Its own threads over the idle time.
    idle_ns: u64,
}

#[allow(clippy::too_many_arguments)]
fn report(
    a: &MissArgs,
    provs: &[Opened; 2],
    forms: &[[Form; 3]; 2],
    bare_h: &[LatencyHistogram; 5],
    threads: &[BTreeSet<i32>; 2],
    cpu: &[Cpu; 2],
    sa_during: u64,
    rounds: usize,
) -> Result<(), String> {
    let mode = &a.common.poll_mode;
    let run = a.run_tag();
    let sa_t = &a.acmrs_sa_transport;
    println!(
        "### isolated misses, acmrs_poll_mode {mode}, acmrs_sa_transport {sa_t} ({rounds} \
         rounds; both providers with addr_timeout 0, route_timeout 0)\n"
    );
    if a.acmrs_ud() {
        println!(
            "acmrs asks the SA on its own UD QP (simverbs' GSI bridge), stock through the host \
             core's umad service: acmrs's \"SA round trip inside the miss\" is its own `sa_rtt` \
             (query posted → reply taken by its loop, read from its stats socket after each \
             miss), stock's the host core's stamps; the legs around the host core's SA stamps \
             exist for stock only; each provider's attributable time is its end to end minus \
             the bare transport of its own path\n"
        );
    }
    if let Some(cpu) = a.dedicated_cpu {
        println!(
            "acmrs's worker alone on CPU {cpu} (acmrs_cpu {cpu}); every other thread of this \
             process (stock's included) and of the fabric (ibsim, OpenSM, the peer daemon) on \
             CPUs {:?}: stock runs with one CPU fewer than in the other runs\n",
            acm_bench::cpus_but(cpu)
        );
    }
    println!(
        "threads: stock {}; acmrs {}; SA MADs during the misses: {sa_during}\n",
        describe_threads(&threads[0]),
        describe_threads(&threads[1])
    );
    let mut counts = Table::new(&["provider", "form", "timed", "failed", "without SA MAD"]);
    for (k, o) in provs.iter().enumerate() {
        for (i, f) in FORMS.iter().enumerate() {
            let x = &forms[k][i];
            counts.row(vec![
                o.name.to_string(),
                f.to_string(),
                cnt(&x.e2e).to_string(),
                x.failed.to_string(),
                x.without_sa.to_string(),
            ]);
        }
    }
    println!("{}", counts.render());
    let us = |v: f64| format!("{:.1}", v / 1000.0);
    let mut t = Table::new(&[
        "what",
        "provider",
        "count",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
    ]);
    let row = |t: &mut Table, what: &str, who: &str, s: &Summary| {
        t.row(vec![
            what.to_string(),
            who.to_string(),
            s.count.to_string(),
            us(s.p50_ns),
            us(s.p99_ns),
            us(s.p999_ns),
            us(s.max_ns),
        ]);
    };
    let bare_names = [
        ("bare SA PathRecord by LID, umad (host core)", "sa-umad-lid"),
        (
            "bare SA PathRecord by LID, UD QP (simverbs GSI)",
            "sa-ud-lid",
        ),
        ("bare SA PathRecord by GID, umad (host core)", "sa-umad-gid"),
        (
            "bare SA PathRecord by GID, UD QP (simverbs GSI)",
            "sa-ud-gid",
        ),
        ("bare ACM query + response, UD QP (simverbs)", "acm-ud"),
    ];
    let bare_s: Vec<Summary> = bare_h.iter().map(LatencyHistogram::summary).collect();
    for (i, (what, tag)) in bare_names.iter().enumerate() {
        row(&mut t, what, "harness", &bare_s[i]);
        write_h(a, &format!("misses-bare-{tag}-{run}.hgrm"), &bare_h[i])?;
    }
    for (i, form) in FORMS.iter().enumerate() {
        if forms.iter().all(|p| cnt(&p[i].e2e) == 0) {
            continue;
        }
        let legs: [(&str, &str, Leg); 9] = [
            ("end to end", "e2e", |f| &f.e2e),
            (
                "SA round trip inside the miss (send → reply)",
                "transport",
                |f| &f.transport,
            ),
            ("own time = end to end − SA round trip", "own", |f| &f.own),
            ("leg: resolve() call (entry → return)", "call", |f| {
                &f.call
            }),
            ("leg: resolve() entry → SA send", "to-send", |f| {
                &f.to_send
            }),
            ("leg: resolve() returned → SA send", "ret-to-send", |f| {
                &f.ret_to_send
            }),
            ("leg: SA reply → answer delivered", "reply-answer", |f| {
                &f.reply_answer
            }),
            (
                "leg: SA reply → reply handler returned",
                "reply-handler",
                |f| &f.reply_handler,
            ),
            (
                "leg: handler returned → answer delivered",
                "handler-answer",
                |f| &f.handler_answer,
            ),
        ];
        for (what, tag, get) in legs {
            for (k, o) in provs.iter().enumerate() {
                let h = get(&forms[k][i]);
                if cnt(h) == 0 {
                    continue;
                }
                row(&mut t, &format!("{form}: {what}"), o.name, &h.summary());
                write_h(a, &format!("misses-{}-{form}-{tag}-{run}.hgrm", o.name), h)?;
            }
            if let Some(out) = &a.common.out {
                if tag == "e2e" || tag == "own" {
                    let f = out.join(format!("misses-{form}-{tag}-{run}.svg"));
                    let title = format!(
                        "isolated miss by {form}, {what} (same process, same fabric, {mode}, \
                         acmrs SA by {sa_t})"
                    );
                    let series = [
                        Series {
                            label: "acmrs",
                            histogram: get(&forms[1][i]),
                        },
                        Series {
                            label: "stock libibacmp",
                            histogram: get(&forms[0][i]),
                        },
                    ];
                    write_percentile_svg(&f, &title, &series)
                        .map_err(|e| format!("{}: {e}", f.display()))?;
                }
            }
        }
        for (j, (_, what, tag)) in PLUGIN_LEGS.iter().enumerate() {
            let h = &forms[1][i].plugin[j];
            if cnt(h) == 0 {
                continue;
            }
            row(
                &mut t,
                &format!("{form}: {what}"),
                provs[1].name,
                &h.summary(),
            );
            write_h(a, &format!("misses-acmrs-{form}-{tag}-{run}.hgrm"), h)?;
        }
    }
    println!("{}", t.render());
    // The harness's two SA transports, side by side (same run, same destinations).
    for (what, u, d) in [("LID", 0, 1), ("GID", 2, 3)] {
        let (u, d) = (&bare_s[u], &bare_s[d]);
        if u.count > 0 && d.count > 0 {
            println!(
                "bare SA by {what}: UD QP − umad = {} µs at p50, {} µs at p99 (UD/umad p50 \
                 {:.2}×)",
                us(d.p50_ns - u.p50_ns),
                us(d.p99_ns - u.p99_ns),
                d.p50_ns / u.p50_ns.max(1.0)
            );
        }
    }
    println!();
    // Provider-attributable = end to end − the bare transport of the provider's own path, per
    // percentile: stock's SA MADs always take the host core's umad service, acmrs's take its
    // own UD QP with `acmrs_sa_transport ud`.
    let mut pa = Table::new(&[
        "form",
        "stock: bare umad p50 / p99 µs",
        "stock p50 / p99 µs",
        "acmrs: bare transport p50 / p99 µs",
        "acmrs p50 / p99 µs",
    ]);
    let acmrs_via = if a.acmrs_ud() { "UD QP" } else { "umad" };
    for (i, form) in FORMS.iter().enumerate() {
        // bare_s: 0/1 SA by LID umad/UD, 2/3 SA by GID umad/UD, 4 ACM over UD.
        let bare = |ud: bool| -> Summary {
            let sa = &bare_s[usize::from(i > 0) * 2 + usize::from(ud)];
            match i {
                2 => Summary {
                    p50_ns: sa.p50_ns + bare_s[4].p50_ns,
                    p99_ns: sa.p99_ns + bare_s[4].p99_ns,
                    count: sa.count.min(bare_s[4].count),
                    ..*sa
                },
                _ => *sa,
            }
        };
        let b = [bare(false), bare(a.acmrs_ud())];
        if b.iter().any(|s| s.count == 0) || forms.iter().any(|p| cnt(&p[i].e2e) == 0) {
            continue;
        }
        let cell = |k: usize| {
            let s = forms[k][i].e2e.summary();
            format!(
                "{} / {}",
                us(s.p50_ns - b[k].p50_ns),
                us(s.p99_ns - b[k].p99_ns)
            )
        };
        // The bare path of provider `k` over `via`, with its p50 / p99.
        let bare_cell = |k: usize, via: &str| {
            let path = match i {
                2 => format!("ACM UD round trip + SA by GID, {via}"),
                _ => format!("SA by {}, {via}", form.to_uppercase()),
            };
            format!("{path} ({} / {})", us(b[k].p50_ns), us(b[k].p99_ns))
        };
        pa.row(vec![
            form.to_string(),
            bare_cell(0, "umad"),
            cell(0),
            bare_cell(1, acmrs_via),
            cell(1),
        ]);
    }
    println!(
        "provider-attributable miss time = end to end − bare transport of the provider's own \
         path (same run, per percentile):\n\n{}",
        pa.render()
    );
    let mut c = Table::new(&[
        "provider",
        "poll mode",
        "misses alone",
        "wall ms",
        "own threads ms / 1000 misses",
        "caller in resolve() ms / 1000",
        "SA thread in handler ms / 1000",
        "total ms / 1000",
        "idle: own threads ms / s (% of a core)",
    ]);
    for (k, o) in provs.iter().enumerate() {
        let x = &cpu[k];
        let per = |v: u64| v as f64 / 1e6 * 1000.0 / x.n.max(1) as f64;
        let idle = x.idle_ns as f64 / 1e6 / (a.idle_ms as f64 / 1000.0);
        c.row(vec![
            o.name.to_string(),
            if k == 0 { "-".into() } else { mode.clone() },
            x.n.to_string(),
            format!("{:.0}", x.wall.as_secs_f64() * 1000.0),
            format!("{:.1}", per(x.threads_ns)),
            format!("{:.1}", per(x.call_ns)),
            format!("{:.1}", per(x.handler_ns)),
            format!("{:.1}", per(x.threads_ns + x.call_ns + x.handler_ns)),
            format!("{idle:.3} ({:.3} %)", idle / 10.0),
        ]);
    }
    println!(
        "CPU per provider (its own threads' CPU clocks; the caller's CPU inside resolve(); the \
         host SA thread's time in its reply handler):\n\n{}",
        c.render()
    );
    Ok(())
}

fn write_h(a: &MissArgs, file: &str, h: &LatencyHistogram) -> Result<(), String> {
    if let Some(out) = &a.common.out {
        std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
        h.write_hgrm(&out.join(file)).map_err(|e| e.to_string())?;
    }
    Ok(())
}
