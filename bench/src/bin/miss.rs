//! PATH-resolution **miss bursts** through the real ibacm daemon, stock `libibacmp.so` vs
//! `libacmrs.so`, side by side in one run.
//!
//! One simulated fat-tree (default `fattree:16,4,16`: 256 HCAs, 20 switches, 276 LIDs) with
//! OpenSM on `Hca1` and two `ibacm` daemons on the same leaf: `Hca2` loads the stock provider,
//! `Hca3` acmrs (a mixed fabric, `FabricBuilder::node_provider`). Every other HCA (and every
//! switch port 0) is only a LID the SA knows: ibsim serves at most 10 clients per fabric, so
//! only these two nodes run daemons.
//!
//! A burst of `B` distinct destination LIDs (a random subset of every LID but the daemon's
//! own; `all` = all of them, 275 on the default fabric) is sent at once to one daemon as
//! `ib_acme -f l -s <own> -d <dlid>` sends it (an 88-byte PATH request, slid + dlid, no
//! QUERY_SA flag: `acm_svr_resolve_path` → the provider's `resolve()`), **one TCP connection
//! per request** (the core reads one message per `recv()`; connections are opened one at a
//! time and each proven with a cached request, the core listens with backlog 0). Each answer
//! is timestamped as it arrives (per-request latency from that request's own send; the burst's
//! completion time from the first send to the last answer) and checked: status 0 and a PATH
//! entry with the requested DLID and the daemon's own SLID. The **same burst again** right
//! after is served from the cache (hits).
//!
//! Every miss is a real miss: **both daemons are restarted** (`Node::restart_daemon`, empty
//! caches, counters reset) before each repetition of each burst size, then warmed up with a
//! path to their own LID (not a destination of any burst) until it answers, then left alone for
//! `--settle` ms (their multicast joins go through the same SA service). The two providers'
//! bursts of one repetition run one after the other (who goes first alternates), never at the
//! same time. The core's global counters (PERF_QUERY, as `ib_acme -P`) are read before and
//! after each burst: `Route Query Count` per destination is the SA queries per destination.
//!
//! The bench runs in its own network namespace with a larger Unix datagram queue (see
//! [`acm_bench::private_net`]; `--host-net` does not).
//!
//! `--sporadic N` measures single misses far apart instead of bursts: N per daemon, one every
//! 20–100 ms, to stock, acmrs on `ud` and acmrs on `core` in one run, with the bare transports
//! timed the same way ([`sporadic`]).
//!
//! `cargo run --release -p acm-bench --bin miss -- [--quick] [--out DIR] [--sporadic N]`
//! (build `-p acm-plugin -p simverbs` with the same profile first; root).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use acm_bench::client::{Burst, Conn, Next, ANSWER_TIMEOUT};
use acm_bench::{loadavg, now_utc, FabricBenchOpts, XorShift};
#[cfg(test)]
use acm_core_nostd::wire::client::AcmMsg;
use acm_core_nostd::wire::client::{Status, MAX_COUNTER};
use acm_fabric::{Fabric, Provider, Topology};
use acm_report::cli::num;
use acm_report::plot::{write_percentile_svg, Series};
use acm_report::{progress, write_atomic, LatencyHistogram, Table};
use acm_testkit::request::PathRequest;
use clap::Parser;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

#[path = "miss/sporadic.rs"]
mod sporadic;

/// PATH-resolution misses through the real ibacm daemon, stock libibacmp against libacmrs,
/// side by side on one simulated fat-tree: bursts, or sporadic misses with --sporadic (root;
/// docs/bench.md).
#[derive(Parser)]
#[command(name = "miss", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(flatten)]
    common: FabricBenchOpts,
    /// The simulated fabric [default: fattree:16,4,16; with --quick fattree:4,2,8]
    #[arg(long, value_name = "fattree:L,S,H")]
    topology: Option<String>,
    /// Burst sizes; all = every LID but the daemon's own (275 on the default fabric)
    /// [default: 1,10,100,all; with --quick 1,10,all]
    #[arg(long, value_name = "N,..,all", value_parser = bursts)]
    bursts: Option<Bursts>,
    /// Repetitions of each burst size [default: 10; with --quick 2]
    #[arg(long, value_name = "R", value_parser = num::<usize>)]
    reps: Option<usize>,
    /// Milliseconds the restarted daemons are left alone before a burst
    #[arg(long, value_name = "MS", default_value = "300", value_parser = num::<u64>)]
    settle: u64,
    /// Seed of the destination picks (and of the sporadic timeline)
    #[arg(long, value_name = "N", default_value = "0x6d697373", value_parser = seed)]
    seed: u64,
    /// Sporadic misses instead of the bursts: N misses one at a time to each of three
    /// daemons (stock, acmrs on `acmrs_sa_transport ud`, acmrs on `core`), each daemon's
    /// --spacing-ms apart, with the bare SA transports and the core's TCP round trip timed the
    /// same way (docs/bench.md, "Sporadic misses"; ~N × 60 ms)
    #[arg(long, value_name = "N", value_parser = acm_report::cli::count)]
    sporadic: Option<usize>,
    /// The sporadic spacing between two events of one stream: uniform in [MIN, MAX] ms
    #[arg(
        long,
        value_name = "MIN,MAX",
        default_value = "20,100",
        value_parser = spacing,
        requires = "sporadic"
    )]
    spacing_ms: (u64, u64),
    /// --sporadic: how long an idle virtual CPU polls before it halts, for this run (the
    /// cpuidle-haltpoll driver's guest_halt_poll_ns, a KVM guest's; put back afterwards)
    #[arg(long, value_name = "NS", value_parser = num::<u64>, requires = "sporadic")]
    halt_poll_ns: Option<u64>,
    #[command(subcommand)]
    child: Option<Child>,
}

#[derive(clap::Subcommand)]
enum Child {
    /// The sporadic run's bare SA client (started by this program under the simulated verbs)
    #[command(hide = true)]
    BareChild,
}

/// `--spacing-ms`: `MIN,MAX` milliseconds, MIN ≤ MAX.
fn spacing(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?}: want MIN,MAX"))?;
    let (a, b) = (num::<u64>(a.trim())?, num::<u64>(b.trim())?);
    if a > b {
        return Err(format!("{s:?}: MIN above MAX"));
    }
    Ok((a, b))
}

/// Burst sizes; 0 = every LID but the daemon's own (`all`).
#[derive(Clone, Debug, PartialEq)]
struct Bursts(Vec<usize>);

/// `--bursts`: sizes above 0 or `all`, comma-separated.
fn bursts(s: &str) -> Result<Bursts, String> {
    s.split(',')
        .map(|x| match x.trim() {
            "all" => Ok(0),
            x => acm_report::cli::count(x),
        })
        .collect::<Result<_, _>>()
        .map(Bursts)
}

/// `--seed`: decimal or `0x` hex.
fn seed(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).map_err(|e| format!("{s:?}: {e}")),
        None => num(s),
    }
}

/// `Route Query Count` in the PERF_QUERY counters (`ACM_CNTR_ROUTE_QUERY`).
const ROUTE_QUERY: usize = 5;
/// `Route Cache Count` (`ACM_CNTR_ROUTE_CACHE`).
const ROUTE_CACHE: usize = 6;
/// Length of a PATH request (`ib_acme -f l`): header + one entry.
const PATH_REQ_LEN: usize = 88;

fn io(e: std::io::Error) -> String {
    e.to_string()
}

// ---- the requests --------------------------------------------------------------------------

/// `ib_acme -f l -s <slid> -d <dlid>`: one PATH entry with slid and dlid, NumbPath 1.
fn path_request(tid: u64, slid: u16, dlid: u16) -> Vec<u8> {
    let m = PathRequest {
        slid,
        ..PathRequest::new(tid, dlid, None)
    }
    .msg();
    m.as_bytes()[..PATH_REQ_LEN].to_vec()
}

// ---- one daemon ----------------------------------------------------------------------------

/// What one burst gave.
struct BurstResult {
    /// Per-request latency (send → its answer).
    lat: LatencyHistogram,
    /// First send → last answer.
    completion: Duration,
    /// First send → last send (how long the client took to put the burst out).
    send_span: Duration,
    /// Counter deltas over the burst.
    counters: [u64; MAX_COUNTER],
    /// Answers with an error status.
    errors: Vec<(u16, Status)>,
}

/// Histograms and counts of one provider and one kind (miss or hit) for one burst size.
#[derive(Default)]
struct Agg {
    lat: LatencyHistogram,
    completion: Vec<Duration>,
    send_span: Vec<Duration>,
    rep_p50_ns: Vec<f64>,
    rep_p99_ns: Vec<f64>,
    counters: [u64; MAX_COUNTER],
    requests: u64,
    errors: u64,
    statuses: Vec<Status>,
}

impl Agg {
    fn add(&mut self, r: &BurstResult, size: usize) {
        self.lat.merge(&r.lat);
        self.completion.push(r.completion);
        self.send_span.push(r.send_span);
        let s = r.lat.summary();
        self.rep_p50_ns.push(s.p50_ns);
        self.rep_p99_ns.push(s.p99_ns);
        for (a, b) in self.counters.iter_mut().zip(r.counters) {
            *a += b;
        }
        self.requests += size as u64;
        self.errors += r.errors.len() as u64;
        for (_, st) in &r.errors {
            if !self.statuses.contains(st) {
                self.statuses.push(*st);
            }
        }
    }
}

/// Per burst size: (misses, hits).
type PerSize = BTreeMap<usize, (Agg, Agg)>;

struct Daemon {
    /// `stock` or `acmrs`.
    label: &'static str,
    node: String,
    lid: u16,
    /// Destinations: every LID of the fabric but `lid`.
    dests: Vec<u16>,
    /// The control connection (probes, counters); the burst connections.
    ctl: Option<Conn>,
    conns: Vec<Conn>,
    tid: u64,
    res: PerSize,
}

impl Daemon {
    /// The daemon of `node` (LID `lid`), not connected yet; its destinations are every LID
    /// of the fabric (1..=`max_lid`) but its own.
    fn new(label: &'static str, node: &str, lid: u16, max_lid: u16) -> Daemon {
        Daemon {
            label,
            node: node.to_string(),
            lid,
            dests: (1..=max_lid).filter(|&l| l != lid).collect(),
            ctl: None,
            conns: Vec::new(),
            tid: 0,
            res: BTreeMap::new(),
        }
    }

    fn next_tid(&mut self) -> u64 {
        self.tid += 1;
        self.tid
    }

    fn ctl(&mut self) -> Result<&mut Conn, String> {
        self.ctl
            .as_mut()
            .ok_or_else(|| format!("{}: not connected", self.label))
    }

    /// After a (re)start: a path to the daemon's own LID until it answers with success,
    /// then `conns` burst connections, each proven with that (now cached) request.
    fn connect(&mut self, fabric: &Fabric, conns: usize) -> Result<(), String> {
        self.ctl = None;
        self.conns.clear();
        let node = fabric.node(&self.node).map_err(|e| e.to_string())?;
        let port = node.server_port;
        let mut ctl = Conn::open(port)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let msg = path_request(self.next_tid(), self.lid, self.lid);
            let (a, _) = ctl.roundtrip(&msg)?;
            if a.status == Status::Success && a.path.dlid == self.lid {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{}: warm-up path to its own LID {}: status {:?}\n{}",
                    self.label,
                    self.lid,
                    a.status,
                    fabric.logs_report()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.ctl = Some(ctl);
        for _ in 0..conns {
            let mut c = Conn::open(port)?;
            let msg = path_request(self.next_tid(), self.lid, self.lid);
            let (a, _) = c.roundtrip(&msg)?;
            if a.status != Status::Success {
                return Err(format!("{}: proof request: {:?}", self.label, a.status));
            }
            self.conns.push(c);
        }
        Ok(())
    }

    /// One burst to `dlids`, all sent at once, one connection each; counters around it.
    fn burst(&mut self, dlids: &[u16], what: &str) -> Result<BurstResult, String> {
        let size = dlids.len();
        if size > self.conns.len() {
            return Err(format!(
                "{}: {size} > {} connections",
                self.label,
                self.conns.len()
            ));
        }
        let before = self.ctl()?.counters()?;
        let msgs: Vec<(u64, Vec<u8>)> = dlids
            .iter()
            .map(|&d| {
                let tid = self.next_tid();
                (tid, path_request(tid, self.lid, d))
            })
            .collect();
        let reqs: Vec<&[u8]> = msgs.iter().map(|(_, m)| &m[..]).collect();
        let mut errors = Vec::new();
        let mut b = Burst::send(&mut self.conns, &reqs)?;
        loop {
            let (i, a) = match b.next(&mut self.conns)? {
                Next::Answer(i, a) => (i, a),
                Next::AllIn => break,
                Next::TimedOut(left) => {
                    return Err(format!(
                    "{}: {what} burst of {size}: {left} answers missing after {ANSWER_TIMEOUT:?}",
                    self.label
                ))
                }
            };
            let (tid, dlid) = (msgs[i].0, dlids[i]);
            if a.tid != tid {
                return Err(format!(
                    "{}: {what}: answer tid {:#x}, request {tid:#x}",
                    self.label, a.tid
                ));
            }
            let lids = (a.path.slid, a.path.dlid);
            if a.status != Status::Success {
                errors.push((dlid, a.status));
            } else if lids != (self.lid, dlid) {
                return Err(format!(
                    "{}: {what}: path {} → {dlid} answered slid {} dlid {}",
                    self.label, self.lid, lids.0, lids.1
                ));
            }
        }
        let after = self.ctl()?.counters()?;
        let mut counters = [0u64; MAX_COUNTER];
        for (i, c) in counters.iter_mut().enumerate() {
            *c = after[i].saturating_sub(before[i]);
        }
        Ok(BurstResult {
            lat: b.latencies(),
            completion: b.completion(),
            send_span: b.send_span(),
            counters,
            errors,
        })
    }
}

// ---- the run -------------------------------------------------------------------------------

#[derive(Debug)]
struct Plan {
    topology: String,
    /// Burst sizes; 0 = every LID but the daemon's own.
    bursts: Vec<usize>,
    reps: usize,
    opts: Vec<(String, String)>,
    log_level: String,
    settle: Duration,
    seed: u64,
}

impl Plan {
    /// The plan of a command line: its values, else the defaults (`--quick`'s or the full run's).
    fn of(args: &Cli) -> Plan {
        let quick = args.common.run.quick;
        Plan {
            topology: args.topology.clone().unwrap_or_else(|| {
                if quick {
                    "fattree:4,2,8"
                } else {
                    "fattree:16,4,16"
                }
                .to_string()
            }),
            bursts: match &args.bursts {
                Some(b) => b.0.clone(),
                None if quick => vec![1, 10, 0],
                None => vec![1, 10, 100, 0],
            },
            reps: args.reps.unwrap_or(if quick { 2 } else { 10 }).max(1),
            opts: args.common.opts.clone(),
            log_level: args.common.log_level.clone(),
            settle: Duration::from_millis(args.settle),
            seed: args.seed,
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn us(ns: f64) -> String {
    format!("{:.1}", ns / 1000.0)
}

fn median<T: Copy + PartialOrd>(v: &[T]) -> Option<T> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v.get(v.len() / 2).copied()
}

fn min<T: Copy + PartialOrd>(v: &[T]) -> Option<T> {
    v.iter().copied().reduce(|a, b| if b < a { b } else { a })
}

/// A random subset of `size` LIDs of `dests` (a partial Fisher-Yates shuffle).
fn pick(dests: &[u16], size: usize, rng: &mut XorShift) -> Vec<u16> {
    let mut v = dests.to_vec();
    let n = size.min(v.len());
    for i in 0..n {
        let j = i + rng.below((v.len() - i) as u64) as usize;
        v.swap(i, j);
    }
    v.truncate(n);
    v
}

fn run(args: &Cli) -> Result<String, String> {
    let plan = Plan::of(args);
    args.common.run.create_out()?;
    let topo = Topology::parse(&plan.topology).map_err(|e| e.to_string())?;
    let hcas = topo.hcas();
    if hcas.len() < 3 {
        return Err(format!("{} has fewer than 3 HCAs", plan.topology));
    }
    // OpenSM assigns one LID per HCA port and one per switch: 1..=max_lid.
    let max_lid = (hcas.len() + topo.switches().len()) as u16;
    let (stock_node, acmrs_node) = (hcas[1].clone(), hcas[2].clone());
    let started = now_utc();
    let load0 = loadavg();
    let t_run = Instant::now();
    progress(format_args!(
        "bringing up {} ({} HCAs, {} LIDs): OpenSM on {}, stock on {stock_node}, acmrs on {acmrs_node}",
        plan.topology,
        hcas.len(),
        max_lid,
        hcas[0]
    ));
    let mut b = Fabric::builder(topo, [stock_node.as_str(), acmrs_node.as_str()])
        .provider(Provider::Stock)
        .node_provider(&acmrs_node, Provider::Acmrs)
        .sm_node(&hcas[0])
        .name_prefix("bench-miss")
        .option("log_level", &plan.log_level)
        .keep_scratch(std::env::var_os("ACM_BENCH_KEEP").is_some());
    for (k, v) in &plan.opts {
        b = b.option(k, v);
    }
    let mut fabric = b.start().map_err(|e| format!("bring-up: {e}"))?;
    let up = t_run.elapsed();
    let mut daemons = Vec::new();
    for (label, node) in [("stock", &stock_node), ("acmrs", &acmrs_node)] {
        let lid = fabric.node(node).map_err(|e| e.to_string())?.lid;
        daemons.push(Daemon::new(label, node, lid, max_lid));
    }
    let all = daemons.iter().map(|d| d.dests.len()).min().unwrap_or(0);
    let sizes: Vec<usize> = plan
        .bursts
        .iter()
        .map(|&s| if s == 0 { all } else { s.min(all) })
        .collect();
    let conns = sizes.iter().copied().max().unwrap_or(1);
    progress(format_args!(
        "fabric {} up in {:.1} s; bursts {:?} × {} reps, restart before each",
        fabric.name(),
        up.as_secs_f64(),
        sizes,
        plan.reps
    ));
    let mut rng = XorShift::new(plan.seed);
    let mut restarts = Vec::new();
    let mut round = 0usize;
    for &size in &sizes {
        for rep in 0..plan.reps {
            // Flush: restart both daemons (empty caches), then warm up and connect each.
            let t = Instant::now();
            for d in &mut daemons {
                d.ctl = None;
                d.conns.clear();
                let n = fabric.node_mut(&d.node).map_err(|e| e.to_string())?;
                n.stop_daemon();
                fabric.reap_dead_clients().map_err(|e| e.to_string())?;
                let n = fabric.node_mut(&d.node).map_err(|e| e.to_string())?;
                n.restart_daemon()
                    .map_err(|e| format!("{}: restart: {e}", d.label))?;
            }
            for d in &mut daemons {
                d.connect(&fabric, conns)?;
            }
            restarts.push(t.elapsed());
            std::thread::sleep(plan.settle);
            let order: Vec<usize> = if round % 2 == 0 {
                vec![0, 1]
            } else {
                vec![1, 0]
            };
            round += 1;
            let dlids = pick(&daemons[0].dests, size, &mut rng);
            for &k in &order {
                let d = &mut daemons[k];
                // The same LIDs for both, but a daemon's own LID is not a destination: the
                // other daemon's LID stands in for it.
                let mine: Vec<u16> = if dlids.contains(&d.lid) {
                    let spare = *d
                        .dests
                        .iter()
                        .find(|l| !dlids.contains(l))
                        .ok_or("no spare destination")?;
                    dlids
                        .iter()
                        .map(|&l| if l == d.lid { spare } else { l })
                        .collect()
                } else {
                    dlids.clone()
                };
                let miss = d.burst(&mine, "miss")?;
                let hit = d.burst(&mine, "hit")?;
                let (sm, sh) = (miss.lat.summary(), hit.lat.summary());
                progress(format_args!(
                    "burst {size} rep {}/{} {}: miss completion {} ms (p50 {} µs, max {} µs, route queries {}), hit completion {} ms (p50 {} µs, route queries {}){}",
                    rep + 1,
                    plan.reps,
                    d.label,
                    ms(miss.completion),
                    us(sm.p50_ns),
                    us(sm.max_ns),
                    miss.counters[ROUTE_QUERY],
                    ms(hit.completion),
                    us(sh.p50_ns),
                    hit.counters[ROUTE_QUERY],
                    if miss.errors.is_empty() && hit.errors.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; error answers: miss {:?}, hit {:?}",
                            miss.errors, hit.errors
                        )
                    }
                ));
                let e = d.res.entry(size).or_default();
                e.0.add(&miss, size);
                e.1.add(&hit, size);
            }
        }
    }
    let elapsed = t_run.elapsed();
    let load1 = loadavg();
    let fabric_name = fabric.name().to_string();
    drop(fabric);
    let results: Vec<(&'static str, PerSize)> =
        daemons.into_iter().map(|d| (d.label, d.res)).collect();
    if let Some(out) = &args.common.run.out {
        for (label, res) in &results {
            for (size, (m, h)) in res {
                for (what, a) in [("miss", m), ("hit", h)] {
                    a.lat
                        .write_hgrm(&out.join(format!("miss-{label}-{what}-{size}.hgrm")))
                        .map_err(io)?;
                }
            }
        }
        for &size in &sizes {
            let mut series = Vec::new();
            // acmrs first (blue), stock second (red), as in every plot of the benches.
            for what in ["miss", "hit"] {
                for (label, res) in results.iter().rev() {
                    if let Some((m, h)) = res.get(&size) {
                        series.push((
                            format!("{label} {what}"),
                            if what == "miss" { &m.lat } else { &h.lat },
                        ));
                    }
                }
            }
            let series: Vec<Series<'_>> = series
                .iter()
                .map(|(l, h)| Series {
                    label: l,
                    histogram: h,
                })
                .collect();
            let f = out.join(format!("miss-burst{size}.svg"));
            write_percentile_svg(
                &f,
                &format!("burst of {size} distinct PATH requests through ibacm, per request"),
                &series,
            )
            .map_err(|e| format!("{}: {e}", f.display()))?;
        }
    }
    let report = render(
        &plan,
        &results,
        &sizes,
        &Meta {
            started,
            elapsed,
            up,
            span: median(&restarts).unwrap_or_default(),
            load0,
            load1,
            fabric: fabric_name,
            max_lid,
        },
    );
    finish(&args.common.run.out, "miss.md", report)
}

/// What a run's report header says besides the plan.
struct Meta {
    started: String,
    elapsed: Duration,
    up: Duration,
    /// Bursts: the median restart + warm-up + connect; sporadic: the timeline's length.
    span: Duration,
    load0: String,
    load1: String,
    fabric: String,
    max_lid: u16,
}

impl Meta {
    /// "Started …, N s (fabric up in …, `span_what` …), load …, CPUs …. Topology … (… LIDs;
    /// fabric …)": the part of a report's first paragraph every mode has.
    fn head(&self, span_what: &str, topology: &str) -> String {
        format!(
            "Started {}, {:.0} s (fabric up in {:.1} s, {span_what} {:.2} s), {}. Topology \
             {topology} ({} LIDs; fabric {})",
            self.started,
            self.elapsed.as_secs_f64(),
            self.up.as_secs_f64(),
            self.span.as_secs_f64(),
            acm_bench::host_note(&self.load0, &self.load1),
            self.max_lid,
            self.fabric,
        )
    }
}

/// The report, also written to `DIR/file` with `--out DIR`.
fn finish(out: &Option<std::path::PathBuf>, file: &str, report: String) -> Result<String, String> {
    if let Some(out) = out {
        let p = out.join(file);
        write_atomic(&p, &report).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(report)
}

fn render(plan: &Plan, results: &[(&'static str, PerSize)], sizes: &[usize], m: &Meta) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# PATH miss bursts through the real ibacm daemon (`acm-bench --bin miss`)\n\n\
         {}, OpenSM on Hca1, stock on Hca2, acmrs on Hca3, `log_level {}`{}; bursts {:?} × {} \
         reps, both daemons restarted before each rep (every miss a real miss), the same burst \
         again right after (hits).\n",
        m.head("restart + warm-up + connect median", &plan.topology),
        plan.log_level,
        if plan.opts.is_empty() {
            ", every other option at its default".to_string()
        } else {
            acm_bench::opts_note(&plan.opts)
        },
        sizes,
        plan.reps,
    );
    let mut t = Table::new(&[
        "burst",
        "provider",
        "kind",
        "requests",
        "completion min ms",
        "completion median ms",
        "send span median ms",
        "p50 µs",
        "p99 µs",
        "max µs",
        "rep p99 median µs",
        "route queries / dest",
        "route cache / dest",
        "errors",
    ]);
    for &size in sizes {
        for (label, res) in results {
            let Some(pair) = res.get(&size) else {
                continue;
            };
            for (kind, a) in [("miss", &pair.0), ("hit", &pair.1)] {
                let s = a.lat.summary();
                let per = |c: usize| {
                    if a.requests == 0 {
                        String::new()
                    } else {
                        format!("{:.2}", a.counters[c] as f64 / a.requests as f64)
                    }
                };
                t.row(vec![
                    size.to_string(),
                    label.to_string(),
                    kind.to_string(),
                    a.requests.to_string(),
                    ms(min(&a.completion).unwrap_or_default()),
                    ms(median(&a.completion).unwrap_or_default()),
                    ms(median(&a.send_span).unwrap_or_default()),
                    us(s.p50_ns),
                    us(s.p99_ns),
                    us(s.max_ns),
                    us(median(&a.rep_p99_ns).unwrap_or(0.0)),
                    per(ROUTE_QUERY),
                    per(ROUTE_CACHE),
                    if a.errors == 0 {
                        "0".to_string()
                    } else {
                        format!("{} {:?}", a.errors, a.statuses)
                    },
                ]);
            }
        }
    }
    let _ = writeln!(
        md,
        "## Per burst size and provider (per-request latency over all reps; completion = first \
         send → last answer)\n\n{}",
        t.render()
    );
    let ratio = |a: f64, b: f64| {
        if b > 0.0 && a.is_finite() {
            format!("{:.2}×", a / b)
        } else {
            "—".to_string()
        }
    };
    let mut t = Table::new(&[
        "burst",
        "stock miss/hit (completion median)",
        "acmrs miss/hit (completion median)",
        "stock/acmrs miss completion",
        "stock/acmrs miss p50",
        "stock/acmrs miss p99",
    ]);
    let get = |l: &str, size: usize| {
        results
            .iter()
            .find(|(x, _)| *x == l)
            .and_then(|(_, r)| r.get(&size))
    };
    for &size in sizes {
        let (Some(s), Some(a)) = (get("stock", size), get("acmrs", size)) else {
            continue;
        };
        let med = |x: &Agg| median(&x.completion).unwrap_or_default().as_secs_f64();
        t.row(vec![
            size.to_string(),
            ratio(med(&s.0), med(&s.1)),
            ratio(med(&a.0), med(&a.1)),
            ratio(med(&s.0), med(&a.0)),
            ratio(s.0.lat.summary().p50_ns, a.0.lat.summary().p50_ns),
            ratio(s.0.lat.summary().p99_ns, a.0.lat.summary().p99_ns),
        ]);
    }
    let _ = writeln!(
        md,
        "## Ratios (miss/hit: how far a miss burst is from the same burst served from the \
         cache; stock/acmrs > 1: acmrs faster)\n\n{}",
        t.render()
    );
    md
}

fn main() {
    let args: Cli = acm_report::cli::parse(2);
    if let Some(Child::BareChild) = args.child {
        if let Err(e) = sporadic::bare_child() {
            println!("err {e}");
            eprintln!("miss bare-child: {e}");
            std::process::exit(1);
        }
        return;
    }
    match args.sporadic {
        Some(n) => {
            let plan = sporadic_plan(&args, n);
            acm_bench::fabric_bench_main("miss", args.common.host_net, || {
                sporadic::run(&args.common, &plan)
            })
        }
        None => acm_bench::fabric_bench_main("miss", args.common.host_net, || run(&args)),
    }
}

/// The sporadic run of a command line with `--sporadic n`.
fn sporadic_plan(args: &Cli, n: usize) -> sporadic::Plan {
    sporadic::Plan {
        topology: Plan::of(args).topology,
        misses: n,
        spacing_ms: args.spacing_ms,
        halt_poll_ns: args.halt_poll_ns,
        opts: args.common.opts.clone(),
        log_level: args.common.log_level.clone(),
        seed: args.seed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_request_is_what_ib_acme_sends() {
        let m = path_request(7, 2, 200);
        assert_eq!(m.len(), PATH_REQ_LEN);
        let v = AcmMsg::new_checked(&m[..]).unwrap();
        assert_eq!(usize::from(v.length()), PATH_REQ_LEN);
        assert_eq!(v.tid(), 7);
        let p = v.entry(0).unwrap().path();
        assert_eq!((p.slid, p.dlid), (2, 200));
    }

    #[test]
    fn pick_is_a_subset_without_repeats() {
        let dests: Vec<u16> = (1..=50).collect();
        let mut rng = XorShift::new(1);
        let v = pick(&dests, 20, &mut rng);
        let mut s = v.clone();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), 20);
        assert!(v.iter().all(|l| dests.contains(l)));
        assert_eq!(pick(&dests, 99, &mut rng).len(), 50);
    }

    #[test]
    fn plan_parses_all_and_opts() {
        let plan = |v: &[&str]| {
            acm_report::cli::try_parse_from::<Cli, _, _>(
                std::iter::once("miss").chain(v.iter().copied()),
            )
            .map(|c| Plan::of(&c))
            .map_err(|e| acm_report::cli::message(&e))
        };
        let p = plan(&["--bursts", "1,all", "--opt", "sa_depth=32"]).unwrap();
        assert_eq!(p.bursts, [1, 0]);
        assert_eq!(p.opts, [("sa_depth".to_string(), "32".to_string())]);
        assert_eq!(p.reps, 10);
        assert_eq!(p.topology, "fattree:16,4,16");
        assert_eq!(
            (p.settle, p.seed),
            (Duration::from_millis(300), 0x6d69_7373)
        );
        let p = plan(&["--quick", "--seed", "7", "--reps", "0"]).unwrap();
        assert_eq!((p.bursts, p.reps, p.seed), (vec![1, 10, 0], 1, 7));
        assert_eq!(p.topology, "fattree:4,2,8");
        assert!(plan(&["--bursts", "1,0"])
            .unwrap_err()
            .contains("must be above 0"));
        assert!(plan(&["--bursts", "x"]).is_err());
        let cli = |v: &[&str]| {
            acm_report::cli::try_parse_from::<Cli, _, _>(
                std::iter::once("miss").chain(v.iter().copied()),
            )
            .map_err(|e| acm_report::cli::message(&e))
        };
        let c = cli(&["--quick"]).unwrap();
        assert_eq!((c.sporadic, c.spacing_ms), (None, (20, 100)));
        let c = cli(&["--sporadic", "300", "--spacing-ms", "5,50"]).unwrap();
        let p = sporadic_plan(&c, c.sporadic.unwrap());
        assert_eq!((p.misses, p.spacing_ms), (300, (5, 50)));
        assert_eq!(p.topology, "fattree:16,4,16");
        assert!(cli(&["--sporadic", "0"]).is_err());
        assert!(cli(&["--sporadic", "9", "--spacing-ms", "100,20"]).is_err());
        assert!(cli(&["--sporadic", "9", "--spacing-ms", "20"]).is_err());
        // The sporadic knobs mean nothing to the bursts.
        assert!(cli(&["--spacing-ms", "5,50"]).is_err());
        assert!(cli(&["--halt-poll-ns", "1000"]).is_err());
        let c = cli(&["--sporadic", "9", "--halt-poll-ns", "200_000"]).unwrap();
        assert_eq!(sporadic_plan(&c, 9).halt_poll_ns, Some(200_000));
        assert!(matches!(
            cli(&["bare-child"]).unwrap().child,
            Some(Child::BareChild)
        ));
    }
}
