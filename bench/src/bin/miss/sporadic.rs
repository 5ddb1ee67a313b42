//! `miss --sporadic N`: **sporadic misses**, one PATH miss at a time every 20–100 ms (uniformly
//! random spacing, seeded) per daemon, as a miss comes mid-job when a rank connects to a new
//! peer: long enough apart for acmrs's dataplane worker to park between them.
//!
//! Three real `ibacm` daemons on one fabric, each sent its own stream of misses: stock
//! libibacmp (`Hca2`), acmrs on its default SA transport `ud` (`Hca3`) and acmrs on the core's
//! umad service, `acmrs_sa_transport core` (`Hca4`). Every node runs with `route_timeout 0`
//! and `addr_timeout 0` (a learned route is dead at once, so any destination misses again, for
//! both providers; docs/bench.md "How a destination misses again, fairly").
//!
//! The **bare transports** are streams of their own, scheduled the same way: a PathRecord GET
//! from a bare umad agent and from a bare UD QP (to the SM's QP1 through simverbs' GSI bridge),
//! both in a child process of this program that is `Hca5` under simverbs ([`bare_child`]), and
//! the **core's TCP round trip**, a global PERF_QUERY to each daemon in turn (answered by the
//! core alone). All streams share one timeline and one event is in flight at a time.
//!
//! Per daemon: **end to end** (request written → whole answer read, the bench blocked in
//! `read`), for acmrs its **SA round trip inside the miss** (its own `sa_rtt` histogram, read
//! from its stats socket after each miss, outside the timed span) and **own time** = end to end
//! − that round trip, per sample; **provider-attributable** = end to end − the bare transport
//! of the provider's path, per percentile, the bare transport being the distribution of the
//! sum of a bare SA round trip on that provider's transport (umad for stock and acmrs-core, UD
//! for acmrs-ud) and a core TCP round trip (every pair of samples of the two streams).

use super::{median, path_request, us, Daemon, Meta, ROUTE_QUERY};
use acm_bench::{loadavg, now_utc, FabricBenchOpts, XorShift};
use acm_core_nostd::sa_channel::SmAddr;
use acm_core_nostd::wire::client::Status;
use acm_dataplane::export::{self, HISTS};
use acm_dataplane::stats::Snapshot;
use acm_dataplane::verbs::{self, UdConfig, UdEndpoint, ACM_QKEY};
use acm_fabric::{Fabric, Provider, Topology};
use acm_report::plot::{write_percentile_svg, Series};
use acm_report::{progress, LatencyHistogram, Summary, Table};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The three daemons: (label, acmrs SA transport; `None` = stock).
const CONFIGS: [(&str, Option<&str>); 3] = [
    ("stock", None),
    ("acmrs-ud", Some("ud")),
    ("acmrs-core", Some("core")),
];

/// acmrs's legs of a miss on its stats socket (docs/stats.md), reported over the phase.
const LEGS: [&str; 5] = [
    "miss_queued",
    "miss_to_query",
    "reply_wait",
    "reply_to_answer",
    "sa_rtt",
];

/// What the sporadic run does.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub topology: String,
    /// Misses per daemon (and samples per bare stream).
    pub misses: usize,
    /// Spacing between two events of one stream, uniformly random in [min, max] ms.
    pub spacing_ms: (u64, u64),
    /// `guest_halt_poll_ns` for the run (put back after).
    pub halt_poll_ns: Option<u64>,
    pub opts: Vec<(String, String)>,
    pub log_level: String,
    pub seed: u64,
}

/// One stream of the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    /// A miss to daemon `k` (index into [`CONFIGS`]).
    Miss(usize),
    /// A bare PathRecord GET over umad.
    BareUmad,
    /// The same over a UD QP.
    BareUd,
    /// A global PERF_QUERY (the core's TCP round trip), to each daemon in turn.
    Echo,
}

const STREAMS: [Stream; 6] = [
    Stream::Miss(0),
    Stream::Miss(1),
    Stream::Miss(2),
    Stream::BareUmad,
    Stream::BareUd,
    Stream::Echo,
];

/// Per stream, when its next event is due; the next event is the earliest. Each stream starts
/// at a random phase and, after each event, is due again a uniform `[min, max]` ms after that
/// event began.
struct Timeline {
    due: Vec<Instant>,
    rng: XorShift,
    spacing_ms: (u64, u64),
}

impl Timeline {
    fn new(start: Instant, streams: usize, spacing_ms: (u64, u64), seed: u64) -> Timeline {
        let mut rng = XorShift::new(seed);
        let due = (0..streams)
            .map(|_| start + Duration::from_micros(rng.below(spacing_ms.1 * 1000 + 1)))
            .collect();
        Timeline {
            due,
            rng,
            spacing_ms,
        }
    }

    /// A spacing drawn uniformly from `[min, max]` ms, in µs steps.
    fn gap(&mut self) -> Duration {
        let (lo, hi) = (self.spacing_ms.0 * 1000, self.spacing_ms.1 * 1000);
        Duration::from_micros(lo + self.rng.below(hi - lo + 1))
    }

    /// The stream whose event is due first among those `wanted`, and when.
    fn next(&self, wanted: impl Fn(usize) -> bool) -> Option<(usize, Instant)> {
        (0..self.due.len())
            .filter(|&i| wanted(i))
            .min_by_key(|&i| self.due[i])
            .map(|i| (i, self.due[i]))
    }

    /// Stream `i`'s event began at `at`: its next is one spacing later.
    fn done(&mut self, i: usize, at: Instant) {
        let g = self.gap();
        self.due[i] = at + g;
    }
}

/// The histograms of one daemon.
#[derive(Default)]
struct PerDaemon {
    e2e: LatencyHistogram,
    /// acmrs: its own SA round trip of the miss.
    sa: LatencyHistogram,
    /// acmrs: end to end − `sa`.
    own: LatencyHistogram,
    /// The core's TCP round trip on this daemon (global PERF_QUERY).
    echo: LatencyHistogram,
    /// Idle time before each miss: this daemon's previous answer → this request.
    idle: Vec<Duration>,
    errors: usize,
    /// acmrs: misses whose `sa_rtt` did not move by exactly one round trip.
    without_one_sa: usize,
    route_queries: u64,
    /// acmrs: the legs' histograms over the phase.
    legs: Vec<Snapshot>,
    /// acmrs: the dataplane thread's voluntary context switches over the phase.
    worker_switches: Option<u64>,
    /// Per thread name over the phase: CPU ns, run-queue wait ns, times run.
    sched: BTreeMap<String, [u64; 3]>,
}

fn hists_now(socket: &Path, names: &[&str]) -> Result<Vec<Snapshot>, String> {
    let text = export::fetch(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    let r = export::decode(&text).map_err(|e| format!("{}: {e}", socket.display()))?;
    let [ep] = &r.endpoints[..] else {
        return Err(format!(
            "{}: {} endpoints on the stats socket, not 1",
            socket.display(),
            r.endpoints.len()
        ));
    };
    names
        .iter()
        .map(|n| {
            HISTS
                .iter()
                .position(|h| h.0 == *n)
                .map(|k| ep.hists[k].clone())
                .ok_or_else(|| format!("no histogram {n} on the stats socket"))
        })
        .collect()
}

/// acmrs's `sa_rtt` once it holds more than `n` round trips, or after 50 ms (the loop records
/// a round trip once the reply's answers are out, so an answer can come before its record).
fn sa_rtt_past(socket: &Path, n: u64) -> Result<Snapshot, String> {
    let t = Instant::now();
    loop {
        let now = hists_now(socket, &["sa_rtt"])?.remove(0);
        if now.count() > n || t.elapsed() > Duration::from_millis(50) {
            return Ok(now);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The `acmrs-dataplane` thread's voluntary context switches (each one a park).
fn worker_switches(pid: i32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == "acmrs-dataplane" {
            let st = std::fs::read_to_string(t.path().join("status")).ok()?;
            return st
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok());
        }
    }
    None
}

/// Per thread name of process `pid`: (CPU ns, run-queue wait ns, times run) summed over its
/// threads of that name (`/proc/PID/task/*/schedstat`; the `simverbs-qp…` threads as one).
fn sched_of(pid: i32) -> BTreeMap<String, [u64; 3]> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let mut name = comm.trim().to_string();
        if name.starts_with("simverbs-qp") {
            name = "simverbs-qp*".into();
        }
        let st = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        let v: Vec<u64> = st
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if v.len() == 3 {
            let e: &mut [u64; 3] = out.entry(name).or_default();
            for (a, b) in e.iter_mut().zip(v) {
                *a += b;
            }
        }
    }
    out
}

/// `after − before`, per thread name.
fn sched_delta(
    after: &BTreeMap<String, [u64; 3]>,
    before: &BTreeMap<String, [u64; 3]>,
) -> BTreeMap<String, [u64; 3]> {
    after
        .iter()
        .map(|(k, a)| {
            let b = before.get(k).copied().unwrap_or_default();
            (k.clone(), [0, 1, 2].map(|i| a[i].saturating_sub(b[i])))
        })
        .collect()
}

/// The distribution of `a + b` over every pair of their values (independent sums).
fn sum_distribution(a: &LatencyHistogram, b: &LatencyHistogram) -> LatencyHistogram {
    let mut out = LatencyHistogram::new();
    for x in a.raw().iter_recorded() {
        for y in b.raw().iter_recorded() {
            out.record_ps(
                x.value_iterated_to() + y.value_iterated_to(),
                x.count_at_value() * y.count_at_value(),
            );
        }
    }
    out
}

/// The bare-transport child: this program again, as HCA `host` under simverbs.
struct BareClient {
    proc: acm_fabric::process::Proc,
    /// Our end of the socket pair that is the child's stdin and stdout.
    to: UnixStream,
    from: BufReader<UnixStream>,
}

impl BareClient {
    fn start(fabric: &Fabric, host: &str, dir: &Path) -> Result<BareClient, String> {
        let simverbs = acm_bench::simverbs_lib()?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("bare-child")
            .current_dir(dir)
            .env("LD_PRELOAD", simverbs)
            .env("IBSIM_SOCKNAME", fabric.name())
            .env("SIM_HOST", host)
            .env("SIMVERBS_SHM_DIR", fabric.scratch());
        let (ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
        let theirs_too = theirs.try_clone().map_err(|e| e.to_string())?;
        cmd.stdout(Stdio::from(OwnedFd::from(theirs_too)));
        let proc = acm_fabric::process::Proc::spawn_with_stdin(
            "bare-child",
            cmd,
            Stdio::from(OwnedFd::from(theirs)),
            Duration::from_secs(2),
        )
        .map_err(|e| format!("spawn bare child: {e}"))?;
        let from = BufReader::new(ours.try_clone().map_err(|e| e.to_string())?);
        let mut c = BareClient {
            proc,
            to: ours,
            from,
        };
        let hello = c.line()?;
        if !hello.starts_with("ready") {
            return Err(format!("bare child: {hello}"));
        }
        Ok(c)
    }

    fn line(&mut self) -> Result<String, String> {
        let mut s = String::new();
        let n = self.from.read_line(&mut s).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("bare child: closed its output".into());
        }
        Ok(s.trim().to_string())
    }

    /// One bare PathRecord GET to `dlid` over `via` (`umad` or `ud`): the child's round trip.
    fn query(&mut self, via: &str, dlid: u16) -> Result<Duration, String> {
        writeln!(self.to, "{via} {dlid}").map_err(|e| e.to_string())?;
        let l = self.line()?;
        match l.strip_prefix("ok ").and_then(|v| v.parse::<u64>().ok()) {
            Some(ns) => Ok(Duration::from_nanos(ns)),
            None => Err(format!("bare child, {via} {dlid}: {l}")),
        }
    }

    fn stop(mut self, fabric: &Fabric) {
        let _ = writeln!(self.to, "quit");
        let _ = self.proc.wait_timeout(Duration::from_secs(5));
        drop(self.proc);
        let _ = fabric.reap_dead_clients();
    }
}

pub fn run(common: &FabricBenchOpts, plan: &Plan) -> Result<String, String> {
    common.run.create_out()?;
    let _halt_poll = plan
        .halt_poll_ns
        .map(acm_bench::HaltPoll::set)
        .transpose()?;
    let topo = Topology::parse(&plan.topology).map_err(|e| e.to_string())?;
    let hcas = topo.hcas();
    if hcas.len() < 5 {
        return Err(format!("{} has fewer than 5 HCAs", plan.topology));
    }
    let max_lid = (hcas.len() + topo.switches().len()) as u16;
    let nodes: Vec<String> = hcas[1..4].to_vec();
    let bare_host = hcas[4].clone();
    let sockdir = std::env::temp_dir().join(format!("acm-bench-sporadic-{}", std::process::id()));
    std::fs::create_dir_all(&sockdir).map_err(|e| e.to_string())?;
    struct RmDir(PathBuf);
    impl Drop for RmDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _rm = RmDir(sockdir.clone());
    let sockets: Vec<Option<PathBuf>> = CONFIGS
        .iter()
        .map(|(l, t)| t.map(|_| sockdir.join(format!("{l}.sock"))))
        .collect();
    let started = now_utc();
    let load0 = loadavg();
    let t_run = Instant::now();
    progress(format_args!(
        "sporadic misses: bringing up {} ({} HCAs, {max_lid} LIDs): OpenSM on {}, stock on {}, \
         acmrs (ud) on {}, acmrs (core) on {}, bare client on {bare_host}",
        plan.topology,
        hcas.len(),
        hcas[0],
        nodes[0],
        nodes[1],
        nodes[2]
    ));
    let mut b = Fabric::builder(topo, nodes.iter().map(String::as_str))
        .provider(Provider::Stock)
        .sm_node(&hcas[0])
        .name_prefix("bench-sporadic")
        .option("log_level", &plan.log_level)
        .option("route_timeout", "0")
        .option("addr_timeout", "0")
        .keep_scratch(std::env::var_os("ACM_BENCH_KEEP").is_some());
    for (i, (_, t)) in CONFIGS.iter().enumerate() {
        if let (Some(t), Some(s)) = (t, &sockets[i]) {
            b = b
                .node_provider(&nodes[i], Provider::Acmrs)
                .node_option(&nodes[i], "acmrs_sa_transport", t)
                .node_option(&nodes[i], "acmrs_stat_socket", &s.to_string_lossy());
        }
    }
    for (k, v) in &plan.opts {
        b = b.option(k, v);
    }
    let fabric = b.start().map_err(|e| format!("bring-up: {e}"))?;
    let up = t_run.elapsed();
    let mut daemons = Vec::new();
    let mut pids = Vec::new();
    for (i, (label, _)) in CONFIGS.iter().enumerate() {
        let n = fabric.node(&nodes[i]).map_err(|e| e.to_string())?;
        pids.push(n.pid());
        let mut d = Daemon::new(label, &nodes[i], n.lid, max_lid);
        d.connect(&fabric, 1)?;
        daemons.push(d);
    }
    let mut bare = BareClient::start(&fabric, &bare_host, &fabric.scratch().join("bare"))?;
    progress(format_args!(
        "fabric {} up in {:.1} s; {} misses per daemon, one every {}–{} ms per stream",
        fabric.name(),
        up.as_secs_f64(),
        plan.misses,
        plan.spacing_ms.0,
        plan.spacing_ms.1
    ));
    // Let the joins and (acmrs) Report subscriptions go out before anything is timed.
    std::thread::sleep(Duration::from_millis(500));
    let mut per: Vec<PerDaemon> = (0..CONFIGS.len()).map(|_| PerDaemon::default()).collect();
    let mut rtt_last: Vec<Snapshot> = vec![Snapshot::default(); CONFIGS.len()];
    let mut legs0: Vec<Vec<Snapshot>> = vec![Vec::new(); CONFIGS.len()];
    let mut sw0: Vec<Option<u64>> = vec![None; CONFIGS.len()];
    let mut q0 = vec![0u64; CONFIGS.len()];
    let mut sched0: Vec<BTreeMap<String, [u64; 3]>> = vec![BTreeMap::new(); CONFIGS.len()];
    for k in 0..CONFIGS.len() {
        q0[k] = daemons[k].ctl()?.counters()?[ROUTE_QUERY];
        sched0[k] = pids[k].map(sched_of).unwrap_or_default();
        if let Some(s) = &sockets[k] {
            let h = hists_now(s, &LEGS)?;
            rtt_last[k] = h[4].clone();
            legs0[k] = h;
            sw0[k] = pids[k].and_then(worker_switches);
        }
    }
    let mut bare_h = [LatencyHistogram::new(), LatencyHistogram::new()];
    let mut rng = XorShift::new(plan.seed ^ 0x5350_4f52);
    let mut last_answer: Vec<Option<Instant>> = vec![None; CONFIGS.len()];
    let mut echo_to = 0usize;
    let mut counts = [0usize; STREAMS.len()];
    let t_phase = Instant::now();
    let mut tl = Timeline::new(t_phase, STREAMS.len(), plan.spacing_ms, plan.seed);
    let mut last_progress = Instant::now();
    while let Some((i, due)) = tl.next(|i| counts[i] < plan.misses) {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let at = Instant::now();
        match STREAMS[i] {
            Stream::Miss(k) => {
                let d = &mut daemons[k];
                let dlid = d.dests[rng.below(d.dests.len() as u64) as usize];
                let tid = d.next_tid();
                let msg = path_request(tid, d.lid, dlid);
                let t0 = Instant::now();
                let conn = &mut d.conns[0];
                conn.send(&msg)?;
                let n = conn.recv(false)?;
                let e2e = t0.elapsed();
                let a = conn.answer(n)?;
                let p = &mut per[k];
                if let Some(prev) = last_answer[k] {
                    p.idle.push(t0 - prev);
                }
                last_answer[k] = Some(Instant::now());
                if a.tid != tid {
                    return Err(format!(
                        "{}: answer tid {:#x}, sent {tid:#x}",
                        d.label, a.tid
                    ));
                }
                if a.status != Status::Success {
                    p.errors += 1;
                } else if (a.path.slid, a.path.dlid) != (d.lid, dlid) {
                    return Err(format!(
                        "{}: path {} → {dlid} answered slid {} dlid {}",
                        d.label, d.lid, a.path.slid, a.path.dlid
                    ));
                } else {
                    p.e2e.record(e2e);
                    if let Some(s) = &sockets[k] {
                        let now = sa_rtt_past(s, rtt_last[k].count())?;
                        let delta = now.since(&rtt_last[k]);
                        rtt_last[k] = now;
                        if delta.count() == 1 {
                            let sa = Duration::from_nanos(delta.sum_ns);
                            p.sa.record(sa);
                            p.own.record(e2e.saturating_sub(sa));
                        } else {
                            p.without_one_sa += 1;
                        }
                    }
                }
            }
            Stream::BareUmad | Stream::BareUd => {
                let via = if STREAMS[i] == Stream::BareUmad {
                    "umad"
                } else {
                    "ud"
                };
                let d = &daemons[0].dests;
                let dlid = d[rng.below(d.len() as u64) as usize];
                let rtt = bare.query(via, dlid)?;
                bare_h[usize::from(via == "ud")].record(rtt);
            }
            Stream::Echo => {
                let k = echo_to % CONFIGS.len();
                echo_to += 1;
                let t0 = Instant::now();
                daemons[k].ctl()?.counters()?;
                per[k].echo.record(t0.elapsed());
            }
        }
        counts[i] += 1;
        tl.done(i, at);
        if last_progress.elapsed() > Duration::from_secs(10) {
            last_progress = Instant::now();
            progress(format_args!(
                "sporadic: {:?} of {} per stream",
                counts, plan.misses
            ));
        }
    }
    let phase = t_phase.elapsed();
    for k in 0..CONFIGS.len() {
        per[k].sched = sched_delta(&pids[k].map(sched_of).unwrap_or_default(), &sched0[k]);
        per[k].route_queries = daemons[k].ctl()?.counters()?[ROUTE_QUERY] - q0[k];
        if let Some(s) = &sockets[k] {
            let h = hists_now(s, &LEGS)?;
            per[k].legs = h.iter().zip(&legs0[k]).map(|(a, b)| a.since(b)).collect();
            per[k].worker_switches = match (pids[k].and_then(worker_switches), sw0[k]) {
                (Some(a), Some(b)) => Some(a.saturating_sub(b)),
                _ => None,
            };
        }
    }
    let load1 = loadavg();
    bare.stop(&fabric);
    let fabric_name = fabric.name().to_string();
    drop(daemons);
    drop(fabric);
    let elapsed = t_run.elapsed();
    let mut echo = LatencyHistogram::new();
    for p in &per {
        echo.merge(&p.echo);
    }
    // The bare path of each daemon: SA over its transport + the core's TCP round trip.
    let bare_path: Vec<LatencyHistogram> = CONFIGS
        .iter()
        .map(|(_, t)| sum_distribution(&bare_h[usize::from(*t == Some("ud"))], &echo))
        .collect();
    if let Some(out) = &common.run.out {
        for (k, (label, _)) in CONFIGS.iter().enumerate() {
            for (what, h) in [
                ("e2e", &per[k].e2e),
                ("sa", &per[k].sa),
                ("own", &per[k].own),
                ("bare", &bare_path[k]),
            ] {
                if h.summary().count > 0 {
                    h.write_hgrm(&out.join(format!("sporadic-{label}-{what}.hgrm")))
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        for (what, h) in [
            ("bare-sa-umad", &bare_h[0]),
            ("bare-sa-ud", &bare_h[1]),
            ("core-echo", &echo),
        ] {
            h.write_hgrm(&out.join(format!("sporadic-{what}.hgrm")))
                .map_err(|e| e.to_string())?;
        }
        let labels: Vec<String> = CONFIGS.iter().rev().map(|c| c.0.to_string()).collect();
        let series: Vec<Series<'_>> = labels
            .iter()
            .zip(per.iter().rev())
            .map(|(l, p)| Series {
                label: l,
                histogram: &p.e2e,
            })
            .collect();
        let f = out.join("sporadic-e2e.svg");
        write_percentile_svg(
            &f,
            "sporadic PATH misses through ibacm (one every 20–100 ms), end to end",
            &series,
        )
        .map_err(|e| format!("{}: {e}", f.display()))?;
    }
    let report = render(
        plan,
        &per,
        &bare_h,
        &echo,
        &bare_path,
        &Meta {
            started,
            load0,
            load1,
            elapsed,
            span: phase,
            up,
            fabric: fabric_name,
            max_lid,
        },
    );
    super::finish(&common.run.out, "sporadic.md", report)
}

fn ppm(s: &Summary) -> [String; 3] {
    [us(s.p50_ns), us(s.p99_ns), us(s.max_ns)]
}

fn render(
    plan: &Plan,
    per: &[PerDaemon],
    bare_h: &[LatencyHistogram; 2],
    echo: &LatencyHistogram,
    bare_path: &[LatencyHistogram],
    m: &Meta,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Sporadic PATH misses through the real ibacm daemon (`acm-bench --bin miss --sporadic`)\n\n\
         {}, OpenSM on Hca1, stock on Hca2, acmrs (`acmrs_sa_transport ud`) on Hca3, acmrs \
         (`acmrs_sa_transport core`) on Hca4, the bare clients on Hca5; `route_timeout 0`, \
         `addr_timeout 0`, `log_level {}`{}. {} misses per daemon, each stream's events {}–{} \
         ms apart (uniform, seed {:#x}), one event in flight at a time.\n",
        m.head("timeline", &plan.topology),
        plan.log_level,
        acm_bench::opts_note(&plan.opts),
        plan.misses,
        plan.spacing_ms.0,
        plan.spacing_ms.1,
        plan.seed,
    );
    let mut t = Table::new(&[
        "daemon",
        "misses",
        "errors",
        "route queries / miss",
        "idle before a miss, min / median ms",
        "worker parks (voluntary switches) / miss",
        "end to end p50 / p99 / max µs",
        "SA round trip inside (acmrs's sa_rtt) p50 / p99 / max µs",
        "own time p50 / p99 / max µs",
        "bare path (SA + core TCP) p50 / p99 / max µs",
        "provider-attributable p50 / p99 / max µs",
    ]);
    for (k, (label, t_)) in CONFIGS.iter().enumerate() {
        let p = &per[k];
        let e = p.e2e.summary();
        let b = bare_path[k].summary();
        let n = e.count.max(1) as f64;
        let idle_min = p.idle.iter().min().copied().unwrap_or_default();
        let idle_med = median(&p.idle).unwrap_or_default();
        let acmrs = t_.is_some();
        t.row(vec![
            label.to_string(),
            e.count.to_string(),
            p.errors.to_string(),
            format!("{:.2}", p.route_queries as f64 / n),
            format!(
                "{:.1} / {:.1}",
                idle_min.as_secs_f64() * 1e3,
                idle_med.as_secs_f64() * 1e3
            ),
            p.worker_switches
                .map_or("—".into(), |s| format!("{:.1}", s as f64 / n)),
            ppm(&e).join(" / "),
            if acmrs {
                format!(
                    "{}{}",
                    ppm(&p.sa.summary()).join(" / "),
                    if p.without_one_sa > 0 {
                        format!(" ({} misses without exactly one)", p.without_one_sa)
                    } else {
                        String::new()
                    }
                )
            } else {
                "—".into()
            },
            if acmrs {
                ppm(&p.own.summary()).join(" / ")
            } else {
                "—".into()
            },
            ppm(&b).join(" / "),
            format!(
                "{} / {} / {}",
                us(e.p50_ns - b.p50_ns),
                us(e.p99_ns - b.p99_ns),
                us(e.max_ns - b.max_ns)
            ),
        ]);
    }
    let _ = writeln!(md, "{}", t.render());
    let mut t = Table::new(&["bare stream", "samples", "p50 µs", "p99 µs", "max µs"]);
    let mut row = |what: &str, h: &LatencyHistogram| {
        let s = h.summary();
        let [a, b, c] = ppm(&s);
        t.row(vec![what.to_string(), s.count.to_string(), a, b, c]);
    };
    row("SA PathRecord GET, umad agent (Hca5)", &bare_h[0]);
    row("SA PathRecord GET, UD QP → SM QP1 (Hca5)", &bare_h[1]);
    row("core TCP round trip (global PERF_QUERY), all daemons", echo);
    for (k, (label, _)) in CONFIGS.iter().enumerate() {
        row(&format!("core TCP round trip, {label}"), &per[k].echo);
    }
    let _ = writeln!(md, "{}", t.render());
    let mut t = Table::new(&[
        "acmrs leg (its stats socket, over the phase)",
        "acmrs-ud p50 / p99 / max µs",
        "acmrs-core p50 / p99 / max µs",
    ]);
    for (j, leg) in LEGS.iter().enumerate() {
        let cell = |k: usize| match per[k].legs.get(j) {
            Some(s) if s.count() > 0 => {
                let h = LatencyHistogram::from_ns_counts(s.values());
                format!("{} (n {})", ppm(&h.summary()).join(" / "), s.count())
            }
            _ => "—".into(),
        };
        t.row(vec![leg.to_string(), cell(1), cell(2)]);
    }
    let _ = writeln!(md, "{}", t.render());
    let mut t = Table::new(&[
        "daemon",
        "thread",
        "CPU µs / miss",
        "run-queue wait µs / miss",
        "times run / miss",
    ]);
    for (k, (label, _)) in CONFIGS.iter().enumerate() {
        let n = per[k].e2e.summary().count.max(1) as f64;
        for (name, v) in &per[k].sched {
            if v[2] == 0 {
                continue;
            }
            t.row(vec![
                label.to_string(),
                name.clone(),
                format!("{:.1}", v[0] as f64 / 1e3 / n),
                format!("{:.1}", v[1] as f64 / 1e3 / n),
                format!("{:.2}", v[2] as f64 / n),
            ]);
        }
    }
    let _ = writeln!(
        md,
        "Threads of each daemon over the timeline (`/proc/PID/task/*/schedstat`, per miss; the \
         core's TCP round trips to that daemon and its idle timers included):\n\n{}",
        t.render()
    );
    let pa =
        |k: usize, q: fn(&Summary) -> f64| q(&per[k].e2e.summary()) - q(&bare_path[k].summary());
    for (k, label) in [(1, "acmrs-ud"), (2, "acmrs-core")] {
        let p50 = (pa(k, |s| s.p50_ns), pa(0, |s| s.p50_ns));
        let p99 = (pa(k, |s| s.p99_ns), pa(0, |s| s.p99_ns));
        let _ = writeln!(
            md,
            "provider-attributable, {label} against stock: p50 {} vs {} µs ({}), p99 {} vs {} µs ({})",
            us(p50.0),
            us(p50.1),
            if p50.0 <= p50.1 { "≤ stock" } else { "ABOVE stock" },
            us(p99.0),
            us(p99.1),
            if p99.0 <= p99.1 { "≤ stock" } else { "ABOVE stock" },
        );
    }
    md
}

// ---- the bare child --------------------------------------------------------------------------

/// The SA PathRecord GET a client asks for a path `slid` → `dlid` (SLID, DLID, reversible, one
/// path, the default P_Key), TID `tid`.
fn path_get(slid: u16, dlid: u16, tid: u64) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 3, 2, 1]);
    m[8..16].copy_from_slice(&tid.to_be_bytes());
    m[16..18].copy_from_slice(&0x35u16.to_be_bytes());
    // DLID (bit 4), SLID (5), Reversible (11), NumbPath (12), P_Key (13).
    let mask: u64 = (1 << 4) | (1 << 5) | (1 << 11) | (1 << 12) | (1 << 13);
    m[48..56].copy_from_slice(&mask.to_be_bytes());
    let r = &mut m[56..120];
    r[40..42].copy_from_slice(&dlid.to_be_bytes());
    r[42..44].copy_from_slice(&slid.to_be_bytes());
    r[49] = 0x81;
    r[50..52].copy_from_slice(&0xffffu16.to_be_bytes());
    m
}

/// Whether `m` is the GetResp to `tid` (its low 32 bits: umad and ibsim rewrite the upper
/// ones, as the core knows) with status 0 and DLID `dlid`.
fn path_reply_ok(m: &[u8; 256], tid: u64, dlid: u16) -> Option<Result<(), String>> {
    if m[12..16] != tid.to_be_bytes()[4..] || m[3] != 0x81 {
        return None;
    }
    let st = u16::from_be_bytes([m[4], m[5]]);
    let got = u16::from_be_bytes([m[96], m[97]]);
    Some(if st == 0 && got == dlid {
        Ok(())
    } else {
        Err(format!("status {st:#x}, DLID {got}"))
    })
}

/// `miss bare-child` (started by the sporadic run under simverbs, as HCA `SIM_HOST`): a bare
/// umad SA agent and a bare UD QP; reads `umad <dlid>` / `ud <dlid>` lines, answers `ok <ns>`
/// (request posted → reply received, the thread asleep in between) or `err <why>`; `quit`.
pub fn bare_child() -> Result<(), String> {
    let mut n = 0;
    // SAFETY: n is writable; the list is freed below.
    let list = unsafe { rdma_sys::ibv_get_device_list(&mut n) };
    if list.is_null() || n < 1 {
        return Err("no verbs device".into());
    }
    // SAFETY: the list has n >= 1 entries; the name is copied before the list is freed.
    let name = unsafe { std::ffi::CStr::from_ptr(rdma_sys::ibv_get_device_name(*list)) }.to_owned();
    // SAFETY: as above.
    let ctx = unsafe { rdma_sys::ibv_open_device(*list) };
    // SAFETY: the list came from ibv_get_device_list; the context does not need it.
    unsafe { rdma_sys::ibv_free_device_list(list) };
    if ctx.is_null() {
        return Err("ibv_open_device failed".into());
    }
    // SAFETY: ctx is open for the process.
    let attr = unsafe { verbs::port_attr(ctx, 1) }.ok_or("ibv_query_port failed")?;
    let (lid, sm) = (
        attr.lid,
        SmAddr {
            lid: attr.sm_lid,
            sl: attr.sm_sl,
        },
    );
    let cfg = UdConfig {
        port_num: 1,
        // SAFETY: as above.
        pkey_index: unsafe { verbs::sa_pkey_index(ctx, 1) },
        qkey: ACM_QKEY,
        recv_depth: 64,
        send_depth: 16,
    };
    // SAFETY: as above; the endpoint lives until the process exits.
    let mut ud = unsafe { UdEndpoint::open(ctx, &cfg) }.map_err(|e| format!("UdEndpoint: {e}"))?;
    // The umad port of the same device, port 1 (as the core opens it).
    let port = umad_ffi::Port::open(Some(&name), 1).map_err(|e| format!("umad_open_port: {e}"))?;
    // As the ibacm core registers its SA agent (acm.c): class 3, version 1, RMPP 1.
    let agent = port
        .register(3, 1, 1)
        .map_err(|e| format!("umad_register: {e}"))?;
    let to_sm = sm.dest();
    let umad_addr = umad_ffi::Addr {
        dlid: sm.lid,
        dqp: 1,
        sl: sm.sl,
        qkey: 0x8001_0000,
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready lid {lid} sm {}", sm.lid).map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    let mut tid = 0x5350_0000u64;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        let mut w = line.split_whitespace();
        let (via, dlid) = match (w.next(), w.next().and_then(|d| d.parse::<u16>().ok())) {
            (Some("quit"), _) | (None, _) => break,
            (Some(v), Some(d)) => (v, d),
            _ => {
                writeln!(out, "err bad command {line:?}").map_err(|e| e.to_string())?;
                out.flush().map_err(|e| e.to_string())?;
                continue;
            }
        };
        tid += 1;
        let mad = path_get(lid, dlid, tid);
        let r: Result<Duration, String> = match via {
            "umad" => (|| {
                let t0 = Instant::now();
                port.send(agent, &mad, umad_addr, 2000, 0)
                    .map_err(|e| format!("umad_send: {e}"))?;
                loop {
                    let got = port.recv(5000).map_err(|e| format!("umad_recv: {e}"))?;
                    if got.status != 0 {
                        return Err(format!("umad status {}", got.status));
                    }
                    if let Some(ok) = path_reply_ok(&got.mad, tid, dlid) {
                        let dt = t0.elapsed();
                        return ok.map(|()| dt);
                    }
                }
            })(),
            "ud" => (|| {
                let t0 = Instant::now();
                ud.send(&to_sm, &mad)
                    .map_err(|e| format!("UD send: {e:?}"))?;
                let mut res = None;
                acm_bench::wait_ud(&mut ud, "UD: no reply in 10 s", |m| {
                    if res.is_none() {
                        res = path_reply_ok(m, tid, dlid);
                    }
                    res.is_some()
                })?;
                let dt = t0.elapsed();
                res.unwrap_or(Err("UD: no reply".into())).map(|()| dt)
            })(),
            v => Err(format!("unknown transport {v}")),
        };
        match r {
            Ok(d) => writeln!(out, "ok {}", d.as_nanos()),
            Err(e) => writeln!(out, "err {e}"),
        }
        .map_err(|e| e.to_string())?;
        out.flush().map_err(|e| e.to_string())?;
    }
    drop(ud);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeline_spaces_each_stream_within_the_bounds_and_runs_the_earliest() {
        let t0 = Instant::now();
        let mut tl = Timeline::new(t0, 3, (20, 100), 7);
        let mut last: Vec<Option<Instant>> = vec![None; 3];
        let mut n = [0usize; 3];
        let mut clock = t0;
        while let Some((i, due)) = tl.next(|i| n[i] < 200) {
            assert!(due >= clock - Duration::from_millis(100));
            clock = clock.max(due);
            if let Some(prev) = last[i] {
                let g = clock - prev;
                assert!(g >= Duration::from_millis(20), "{g:?}");
                // Another stream's event (≤ 1 ms here) can delay it a little.
                assert!(g <= Duration::from_millis(101), "{g:?}");
            }
            last[i] = Some(clock);
            n[i] += 1;
            tl.done(i, clock);
            clock += Duration::from_micros(300);
        }
        assert_eq!(n, [200; 3]);
        // Uniform: the mean spacing is near 60 ms.
        let span = last.iter().flatten().max().unwrap().duration_since(t0);
        let mean = span.as_secs_f64() * 1e3 / 200.0;
        assert!((50.0..70.0).contains(&mean), "{mean}");
    }

    #[test]
    fn the_sum_distribution_is_every_pair() {
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        for v in [10u64, 20] {
            a.record(Duration::from_micros(v));
        }
        for v in [100u64, 200, 300] {
            b.record(Duration::from_micros(v));
        }
        let s = sum_distribution(&a, &b).summary();
        assert_eq!(s.count, 6);
        assert!((s.p50_ns - 210_000.0).abs() < 500.0, "{}", s.p50_ns);
        assert!((s.max_ns - 320_000.0).abs() < 500.0, "{}", s.max_ns);
    }

    #[test]
    fn a_path_get_is_an_sa_pathrecord_get_for_the_lids() {
        let m = path_get(3, 200, 9);
        assert_eq!(&m[..4], &[1, 3, 2, 1]);
        assert_eq!(u16::from_be_bytes([m[16], m[17]]), 0x35);
        assert_eq!(u16::from_be_bytes([m[96], m[97]]), 200);
        assert_eq!(u16::from_be_bytes([m[98], m[99]]), 3);
        let mut r = m;
        r[3] = 0x81;
        assert_eq!(path_reply_ok(&r, 9, 200), Some(Ok(())));
        assert_eq!(path_reply_ok(&r, 8, 200), None);
        assert!(matches!(path_reply_ok(&r, 9, 201), Some(Err(_))));
    }
}
