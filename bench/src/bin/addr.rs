//! Address resolution through the real ibacm daemon: name **misses** (ACM multicast query →
//! the peer's unicast response → SA PathRecord) one at a time and in bursts, and **hits** (the
//! same names again), stock `libibacmp.so` vs `libacmrs.so`, side by side in one run.
//!
//! Each configuration is its own simulated fabric of the same topology (ibsim + OpenSM + real
//! `ibacm` daemons, no hosts file, every node with extra host names `<node>-1..-N` in its
//! `ibacm_addr.cfg`, `FabricBuilder::extra_names`): a **requester** node (Hca3) and two
//! **peers** (Hca2, Hca4). Configurations: `stock` and `acmrs` (all three nodes one provider),
//! and the mixed `stock-req.acmrs-peers` / `acmrs-req.stock-peers`. All fabrics are up at
//! once; the measurement phases alternate between them (A B A B, who goes first rotating per
//! round) so machine drift hits all alike. Every miss uses a name never asked before.
//!
//! A TCP client talks to the requester's daemon as `ib_acme -f n` does (RESOLVE, source
//! entry = the requester's name, destination entry = a peer name; messages built with
//! `acm_core_nostd::wire::client`). One connection per outstanding request (the core reads one
//! message per `recv()`), opened one at a time and each proven with a cached request before
//! any measurement (the core listens with backlog 0). Every answer is checked: status 0 and
//! the destination GID of the peer owning the name (an error status is counted and reported,
//! a wrong path fails the run). The requester's `ib_acme -P` counters are read around every
//! phase.
//!
//! The bench runs in its own network namespace with a larger Unix datagram queue (see
//! [`acm_bench::private_net`]; `--host-net` does not).
//!
//! `cargo run --release -p acm-bench --bin addr -- [--quick] [--out DIR]`
//! (build `-p acm-plugin -p simverbs` with the same profile first; root).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use acm_bench::client::{Answer, Burst, Conn, Next, ANSWER_TIMEOUT};
use acm_bench::{cpu_idle, loadavg, now_utc, FabricBenchOpts};
#[cfg(test)]
use acm_core_nostd::wire::client::HDR_LEN;
use acm_core_nostd::wire::client::{
    AcmMsg, AcmMsgRepr, EpAddrDataRepr, EpInfoType, Opcode, Status, ACM_VERSION, COUNTER_NAMES,
    EP_FLAG_DEST, EP_FLAG_SOURCE, MAX_ADDRESS, MAX_COUNTER, MAX_ENTRIES,
};
use acm_fabric::{Fabric, HostsFile, Provider, Topology};
use acm_report::cli::{num, List};
use acm_report::{write_atomic, LatencyHistogram, Summary, Table};
use clap::Parser;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Name resolution through the real ibacm daemon: misses (ACM multicast query, the peer's
/// answer, SA PathRecord) one at a time and in bursts, then hits, stock libibacmp against
/// libacmrs in one run (root; docs/bench.md). Configurations (labels): stock, acmrs (both ends
/// one provider), stock-req.acmrs-peers, acmrs-req.stock-peers (mixed; --no-mixed leaves them
/// out).
#[derive(Parser)]
#[command(name = "addr", version)]
struct Cli {
    #[command(flatten)]
    common: FabricBenchOpts,
    /// Leave out the mixed configurations
    #[arg(long)]
    no_mixed: bool,
    /// Keep the mixed configurations (the default; --no-mixed wins)
    #[arg(long)]
    mixed: bool,
    /// Rounds (the phases alternate between the fabrics) [default: 4; with --quick 2]
    #[arg(long, value_name = "R", value_parser = num::<usize>)]
    rounds: Option<usize>,
    /// Single misses per round [default: 150; with --quick 40]
    #[arg(long, value_name = "N", value_parser = num::<usize>)]
    singles: Option<usize>,
    /// Burst sizes, each at least 1 [default: 1,10,100]
    #[arg(long, value_name = "N,N,..")]
    bursts: Option<List<usize>>,
    /// Repetitions of each burst size per round, as many as --bursts [default: 20,4,2; with
    /// --quick 5,2,1]
    #[arg(long, value_name = "N,N,..")]
    burst_reps: Option<List<usize>>,
    /// Hit passes (every name asked again) per round [default: 3; with --quick 2]
    #[arg(long, value_name = "P", value_parser = num::<usize>)]
    hit_passes: Option<usize>,
    /// Only these configurations (labels, comma-separated)
    #[arg(long, value_name = "LABEL,..")]
    only: Option<String>,
}

const REQUESTER: &str = "Hca3";
const PEERS: [&str; 2] = ["Hca2", "Hca4"];

// ---- the requests --------------------------------------------------------------------------

fn io(e: std::io::Error) -> String {
    e.to_string()
}

/// A NAME entry (NUL-padded, as `acm_format_ep_addr` writes it).
fn name_entry(flags: u32, name: &str) -> EpAddrDataRepr {
    let mut info = [0u8; MAX_ADDRESS];
    let b = name.as_bytes();
    info[..b.len().min(MAX_ADDRESS - 1)].copy_from_slice(&b[..b.len().min(MAX_ADDRESS - 1)]);
    EpAddrDataRepr {
        flags,
        info_type: EpInfoType::Name,
        info,
    }
}

/// `ib_acme -f n -s SRC -d DST` as libacm's `acm_resolve` builds it: header + source entry +
/// destination entry (160 bytes).
fn name_request(tid: u64, src: &str, dst: &str) -> Vec<u8> {
    let mut entries = [EpAddrDataRepr::ZERO; MAX_ENTRIES];
    entries[0] = name_entry(EP_FLAG_SOURCE, src);
    entries[1] = name_entry(EP_FLAG_DEST, dst);
    let repr = AcmMsgRepr {
        version: ACM_VERSION,
        opcode: u8::from(Opcode::Resolve),
        status: Status::Success,
        data: [0; 3],
        tid,
        count: 2,
        entries,
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut AcmMsg::new_unchecked(&mut buf[..]))
        .expect("the buffer is buffer_len() long");
    buf
}

// ---- one configuration = one fabric --------------------------------------------------------

/// A configuration: who runs which provider.
#[derive(Clone)]
struct Config {
    /// `stock`, `acmrs`, `stock-req.acmrs-peers`, ...
    label: String,
    requester: Provider,
    peers: Provider,
}

impl Config {
    fn same(p: Provider) -> Config {
        Config {
            label: short(&p).to_string(),
            requester: p.clone(),
            peers: p,
        }
    }
    fn mixed(r: Provider, p: Provider) -> Config {
        Config {
            label: format!("{}-req.{}-peers", short(&r), short(&p)),
            requester: r,
            peers: p,
        }
    }
}

fn short(p: &Provider) -> &'static str {
    match p {
        Provider::Stock => "stock",
        _ => "acmrs",
    }
}

/// Histograms and counts of one configuration over the run.
#[derive(Default)]
struct Results {
    single: LatencyHistogram,
    /// Per burst size: per-request latency, and each burst's completion time.
    burst: BTreeMap<usize, (LatencyHistogram, Vec<Duration>)>,
    hit: LatencyHistogram,
    /// Counter deltas per phase kind (`single`, `burst`, `hit`).
    counters: BTreeMap<&'static str, [u64; MAX_COUNTER]>,
    /// Answers with a non-zero status, per phase (`single`, `burst <B>`, `hit`), and the
    /// statuses seen.
    failed: BTreeMap<String, (u64, Vec<Status>)>,
}

struct Bench {
    cfg: Config,
    fabric: Fabric,
    src: String,
    /// Peer names not used yet, in order (alternating between the peers), and the GID each
    /// must resolve to.
    fresh: std::collections::VecDeque<(String, [u8; 16])>,
    /// Names resolved (missed) so far in the current round, for the hit phase.
    learned: Vec<(String, [u8; 16])>,
    conns: Vec<Conn>,
    tid: u64,
    res: Results,
}

fn start_fabric(
    cfg: &Config,
    names: usize,
    log_level: &str,
    opts: &[(String, String)],
) -> Result<Fabric, String> {
    let nodes: Vec<&str> = PEERS.iter().copied().chain([REQUESTER]).collect();
    let mut b = Fabric::builder(
        Topology::example("net.2sw2path4hca").map_err(|e| e.to_string())?,
        nodes,
    )
    .provider(cfg.peers.clone())
    .node_provider(REQUESTER, cfg.requester.clone())
    .hosts_file(HostsFile::Absent)
    .extra_names(names)
    .name_prefix(&format!("bench-addr-{}", short(&cfg.requester)))
    .option("log_level", log_level)
    .keep_scratch(std::env::var_os("ACM_BENCH_KEEP").is_some());
    for (k, v) in opts {
        b = b.option(k, v);
    }
    b.start()
        .map_err(|e| format!("{}: bring-up: {e}", cfg.label))
}

impl Bench {
    fn new(
        cfg: Config,
        names: usize,
        conns: usize,
        log_level: &str,
        opts: &[(String, String)],
    ) -> Result<Bench, String> {
        let t0 = Instant::now();
        let fabric = start_fabric(&cfg, names, log_level, opts)?;
        let req = fabric.node(REQUESTER).map_err(|e| e.to_string())?;
        let src = req.addrs.name.clone();
        let port = req.server_port;
        let mut peers = Vec::new();
        for p in PEERS {
            let n = fabric.node(p).map_err(|e| e.to_string())?;
            peers.push((n.addrs.clone(), n.gid.octets()));
        }
        let mut fresh = std::collections::VecDeque::new();
        for k in 0..names {
            for (a, gid) in &peers {
                fresh.push_back((a.extra_names[k].clone(), *gid));
            }
        }
        let mut b = Bench {
            cfg,
            fabric,
            src,
            fresh,
            learned: Vec::new(),
            conns: Vec::new(),
            tid: 1,
            res: Results::default(),
        };
        // Warm-up on the first connection: each peer's own name (its first request from the
        // requester also makes the peer look up the route back), repeated until the
        // endpoints' multicast joins went through.
        b.conns.push(Conn::open(port)?);
        for (a, gid) in &peers {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let msg = name_request(b.next_tid(), &b.src, &a.name);
                let (ans, _) = b.conns[0].roundtrip(&msg)?;
                if ans.status == Status::Success && ans.path.dgid.0 == *gid {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "{}: warm-up {} → {}: status {:?}\n{}",
                        b.cfg.label,
                        b.src,
                        a.name,
                        ans.status,
                        b.fabric.logs_report()
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // The other connections, one at a time, each proven with a cached request.
        let proof = peers[0].0.name.clone();
        for _ in 1..conns {
            let mut c = Conn::open(port)?;
            let msg = name_request(b.next_tid(), &b.src, &proof);
            let (ans, _) = c.roundtrip(&msg)?;
            if ans.status != Status::Success {
                return Err(format!("{}: proof request: {:?}", b.cfg.label, ans.status));
            }
            b.conns.push(c);
        }
        eprintln!(
            "[addr] {}: fabric {} up, requester {} ({}), peers {} ({}), {} names per node, {} connections, {:.1} s",
            b.cfg.label,
            b.fabric.name(),
            REQUESTER,
            b.cfg.requester.name(),
            PEERS.join("+"),
            b.cfg.peers.name(),
            names,
            b.conns.len(),
            t0.elapsed().as_secs_f64()
        );
        Ok(b)
    }

    fn next_tid(&mut self) -> u64 {
        self.tid += 1;
        self.tid
    }

    fn take_fresh(&mut self) -> Result<(String, [u8; 16]), String> {
        self.fresh
            .pop_front()
            .ok_or_else(|| format!("{}: out of fresh names (raise --names)", self.cfg.label))
    }

    /// `Ok(true)`: the right path; `Ok(false)`: an error status (counted under `phase`, the
    /// run goes on: a client sees that answer too); `Err`: a success with a wrong path.
    fn check(
        &mut self,
        phase: &str,
        name: &str,
        want: &[u8; 16],
        a: &Answer,
    ) -> Result<bool, String> {
        if a.status != Status::Success {
            let f = self.res.failed.entry(phase.to_string()).or_default();
            f.0 += 1;
            if !f.1.contains(&a.status) {
                f.1.push(a.status);
            }
            eprintln!(
                "[addr] {}: {phase}: {} → {name} answered {:?}",
                self.cfg.label, self.src, a.status
            );
            return Ok(false);
        }
        if a.path.dgid.0 != *want {
            return Err(format!(
                "{}: {} → {name}: status {:?}, dgid {:02x?}\n{}",
                self.cfg.label,
                self.src,
                a.status,
                a.path.dgid.0,
                self.fabric.logs_report()
            ));
        }
        Ok(true)
    }

    /// Runs `f` and adds the change of the requester's counters to `kind`.
    fn counted(
        &mut self,
        kind: &'static str,
        f: impl FnOnce(&mut Bench) -> Result<(), String>,
    ) -> Result<(), String> {
        let before = self.conns[0].counters()?;
        f(self)?;
        let after = self.conns[0].counters()?;
        let acc = self.res.counters.entry(kind).or_default();
        for i in 0..MAX_COUNTER {
            acc[i] += after[i].saturating_sub(before[i]);
        }
        Ok(())
    }

    /// `n` distinct names, one at a time.
    fn singles(&mut self, n: usize) -> Result<Summary, String> {
        let mut h = LatencyHistogram::new();
        self.counted("single", |b| {
            for _ in 0..n {
                let (name, gid) = b.take_fresh()?;
                let msg = name_request(b.next_tid(), &b.src, &name);
                let (a, dt) = b.conns[0].roundtrip(&msg)?;
                h.record(dt);
                if b.check("single", &name, &gid, &a)? {
                    b.learned.push((name, gid));
                }
            }
            Ok(())
        })?;
        self.res.single.merge(&h);
        Ok(h.summary())
    }

    /// `reps` bursts of `size` distinct names, each sent at once on `size` connections.
    fn bursts(&mut self, size: usize, reps: usize) -> Result<(Summary, Duration), String> {
        let mut h = LatencyHistogram::new();
        let mut done = Vec::new();
        self.counted("burst", |b| {
            for _ in 0..reps {
                let (lat, total) = b.burst(size)?;
                h.merge(&lat);
                done.push(total);
            }
            Ok(())
        })?;
        let e = self.res.burst.entry(size).or_default();
        e.0.merge(&h);
        e.1.extend(&done);
        done.sort();
        Ok((h.summary(), done[done.len() / 2]))
    }

    fn burst(&mut self, size: usize) -> Result<(LatencyHistogram, Duration), String> {
        let mut work = Vec::with_capacity(size);
        for _ in 0..size {
            let (name, gid) = self.take_fresh()?;
            let msg = name_request(self.next_tid(), &self.src, &name);
            work.push((name, gid, msg));
        }
        let mut ok = vec![false; size];
        let reqs: Vec<&[u8]> = work.iter().map(|(_, _, m)| &m[..]).collect();
        let mut b = Burst::send(&mut self.conns, &reqs)?;
        loop {
            match b.next(&mut self.conns)? {
                Next::Answer(i, a) => {
                    let (name, gid, _) = &work[i];
                    ok[i] = self.check(&format!("burst {size}"), name, gid, &a)?;
                }
                Next::AllIn => break,
                Next::TimedOut(left) => {
                    return Err(format!(
                        "{}: burst of {size}: {left} answers missing after {:?}\n{}",
                        self.cfg.label,
                        ANSWER_TIMEOUT,
                        self.fabric.logs_report()
                    ))
                }
            }
        }
        for (i, (name, gid, _)) in work.into_iter().enumerate() {
            if ok[i] {
                self.learned.push((name, gid));
            }
        }
        Ok((b.latencies(), b.completion()))
    }

    /// `passes` passes over every name missed this round, one at a time (all cached now).
    fn hits(&mut self, passes: usize) -> Result<Summary, String> {
        let mut h = LatencyHistogram::new();
        let names = std::mem::take(&mut self.learned);
        self.counted("hit", |b| {
            for _ in 0..passes {
                for (name, gid) in &names {
                    let msg = name_request(b.next_tid(), &b.src, name);
                    let (a, dt) = b.conns[0].roundtrip(&msg)?;
                    h.record(dt);
                    b.check("hit", name, gid, &a)?;
                }
            }
            Ok(())
        })?;
        self.res.hit.merge(&h);
        Ok(h.summary())
    }
}

// ---- the run -------------------------------------------------------------------------------

#[derive(Debug)]
struct Plan {
    /// `--opt` lines for every node's `ibacm_opts.cfg`.
    opts: Vec<(String, String)>,
    log_level: String,
    rounds: usize,
    singles: usize,
    bursts: Vec<(usize, usize)>,
    hit_passes: usize,
}

impl Plan {
    /// The plan of a command line: its values, else the defaults (`--quick`'s or the full run's).
    fn of(args: &Cli) -> Result<Plan, String> {
        let quick = args.common.run.quick;
        let or = |v: Option<usize>, quick_default, full_default| {
            v.unwrap_or(if quick { quick_default } else { full_default })
        };
        let sizes = args
            .bursts
            .as_ref()
            .map_or_else(|| vec![1, 10, 100], |l| l.0.clone());
        let reps = args.burst_reps.as_ref().map_or_else(
            || if quick { vec![5, 2, 1] } else { vec![20, 4, 2] },
            |l| l.0.clone(),
        );
        if sizes.len() != reps.len() || sizes.contains(&0) {
            return Err("--bursts and --burst-reps: same length, sizes ≥ 1".into());
        }
        Ok(Plan {
            opts: args.common.opts.clone(),
            log_level: args.common.log_level.clone(),
            rounds: or(args.rounds, 2, 4),
            singles: or(args.singles, 40, 150),
            bursts: sizes.into_iter().zip(reps).collect(),
            hit_passes: or(args.hit_passes, 2, 3),
        })
    }

    fn names_per_fabric(&self) -> usize {
        self.rounds * (self.singles + self.bursts.iter().map(|(b, r)| b * r).sum::<usize>())
    }
}

fn us(ns: f64) -> String {
    format!("{:.1}", ns / 1000.0)
}

fn ratio(a: f64, b: f64) -> String {
    if b.is_nan() || b <= 0.0 {
        return "—".into();
    }
    let r = a / b;
    if r >= 0.1 {
        format!("{r:.2}×")
    } else {
        format!("{r:.1e}×")
    }
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn run(args: &Cli) -> Result<String, String> {
    let mixed = !args.no_mixed;
    let plan = Plan::of(args)?;
    let names = plan.names_per_fabric().div_ceil(PEERS.len()) + 8;
    let conns = plan.bursts.iter().map(|(b, _)| *b).max().unwrap_or(1);
    let mut configs = vec![Config::same(Provider::Stock), Config::same(Provider::Acmrs)];
    if mixed {
        configs.push(Config::mixed(Provider::Stock, Provider::Acmrs));
        configs.push(Config::mixed(Provider::Acmrs, Provider::Stock));
    }
    if let Some(only) = &args.only {
        let want: Vec<&str> = only.split(',').map(str::trim).collect();
        configs.retain(|c| want.contains(&c.label.as_str()));
        if configs.is_empty() {
            return Err(format!(
                "--only {only}: no such configuration (stock, acmrs, stock-req.acmrs-peers, \
                 acmrs-req.stock-peers)"
            ));
        }
    }
    let t_run = Instant::now();
    let started = now_utc();
    let load0 = loadavg();
    let mut benches = Vec::new();
    for c in &configs {
        benches.push(Bench::new(
            c.clone(),
            names,
            conns,
            &plan.log_level,
            &plan.opts,
        )?);
    }
    for r in 0..plan.rounds {
        // Who goes first rotates every round.
        let order: Vec<usize> = (0..benches.len())
            .map(|i| (i + r) % benches.len())
            .collect();
        for &i in &order {
            let s = benches[i].singles(plan.singles)?;
            eprintln!(
                "[addr] round {}/{} {:<22} single misses ×{}: p50 {} µs p99 {} µs",
                r + 1,
                plan.rounds,
                benches[i].cfg.label,
                s.count,
                us(s.p50_ns),
                us(s.p99_ns)
            );
        }
        for &(size, reps) in &plan.bursts {
            for &i in &order {
                let (s, done) = benches[i].bursts(size, reps)?;
                eprintln!(
                    "[addr] round {}/{} {:<22} burst {size} ×{reps}: completion median {:.2} ms, per request p50 {} µs p99 {} µs",
                    r + 1,
                    plan.rounds,
                    benches[i].cfg.label,
                    done.as_secs_f64() * 1e3,
                    us(s.p50_ns),
                    us(s.p99_ns)
                );
            }
        }
        for &i in &order {
            let s = benches[i].hits(plan.hit_passes)?;
            eprintln!(
                "[addr] round {}/{} {:<22} hits ×{}: p50 {} µs p99 {} µs",
                r + 1,
                plan.rounds,
                benches[i].cfg.label,
                s.count,
                us(s.p50_ns),
                us(s.p99_ns)
            );
        }
    }
    let elapsed = t_run.elapsed();
    let load1 = loadavg();
    // Tear the fabrics down (by PID, in Fabric's Drop) before printing.
    let results: Vec<(Config, Results)> = benches.into_iter().map(|b| (b.cfg, b.res)).collect();
    if let Some(out) = &args.common.run.out {
        std::fs::create_dir_all(out).map_err(io)?;
        for (c, r) in &results {
            let w = |what: &str, h: &LatencyHistogram| {
                h.write_hgrm(&out.join(format!("addr-{}-{what}.hgrm", c.label)))
                    .map_err(io)
            };
            w("single-miss", &r.single)?;
            for (size, (h, _)) in &r.burst {
                w(&format!("burst{size}"), h)?;
            }
            w("hit", &r.hit)?;
        }
    }
    let report = render(&plan, &results, mixed, &started, elapsed, load0, load1);
    if let Some(out) = &args.common.run.out {
        write_atomic(&out.join("addr.md"), &report).map_err(io)?;
    }
    Ok(report)
}

fn render(
    plan: &Plan,
    results: &[(Config, Results)],
    mixed: bool,
    started: &str,
    elapsed: Duration,
    load0: String,
    load1: String,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Address resolution through the real ibacm daemon (`acm-bench --bin addr`)\n\n\
         Started {started}, {:.0} s, load average {load0} → {load1}, {} CPUs ({}). Topology \
         net.2sw2path4hca, requester {REQUESTER}, peers {}, no hosts file, `log_level {}`{}, \
         {} rounds (phases alternate between the fabrics), {} single misses, bursts {}, \
         {} hit passes per round.\n",
        elapsed.as_secs_f64(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_idle(),
        PEERS.join(", "),
        plan.log_level,
        acm_bench::opts_note(&plan.opts),
        plan.rounds,
        plan.singles,
        plan.bursts
            .iter()
            .map(|(b, r)| format!("{b}×{r}"))
            .collect::<Vec<_>>()
            .join(", "),
        plan.hit_passes,
    );
    let lat = |t: &mut Table, label: &str, h: &LatencyHistogram| {
        let s = h.summary();
        t.row(vec![
            label.to_string(),
            s.count.to_string(),
            us(s.p50_ns),
            us(h.raw().value_at_quantile(0.90) as f64 / 1000.0),
            us(s.p99_ns),
            us(s.max_ns),
        ]);
    };
    let header = [
        "configuration",
        "count",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "max µs",
    ];
    let mut t = Table::new(&header);
    for (c, r) in results {
        lat(&mut t, &c.label, &r.single);
    }
    let _ = writeln!(
        md,
        "## Single-name misses (one at a time: multicast query → peer's response → route)\n\n{}",
        t.render()
    );
    for (size, _) in &plan.bursts {
        let mut t = Table::new(&[
            "configuration",
            "bursts",
            "completion median ms",
            "completion max ms",
            "per request p50 µs",
            "p90 µs",
            "p99 µs",
            "max µs",
        ]);
        for (c, r) in results {
            let Some((h, done)) = r.burst.get(size) else {
                continue;
            };
            let s = h.summary();
            t.row(vec![
                c.label.clone(),
                done.len().to_string(),
                format!("{:.2}", median(done).as_secs_f64() * 1e3),
                format!(
                    "{:.2}",
                    done.iter().max().copied().unwrap_or_default().as_secs_f64() * 1e3
                ),
                us(s.p50_ns),
                us(h.raw().value_at_quantile(0.90) as f64 / 1000.0),
                us(s.p99_ns),
                us(s.max_ns),
            ]);
        }
        let _ = writeln!(
            md,
            "## Bursts of {size} distinct names (sent at once, one connection each)\n\n{}",
            t.render()
        );
    }
    let mut t = Table::new(&header);
    for (c, r) in results {
        lat(&mut t, &c.label, &r.hit);
    }
    let _ = writeln!(
        md,
        "## Hits (the same names again, one at a time)\n\n{}",
        t.render()
    );
    // Ratios: stock over acmrs (both ends acmrs), and stock over an acmrs requester with the
    // same stock peers (only the requester differs).
    let find = |l: &str| results.iter().find(|(c, _)| c.label == l).map(|(_, r)| r);
    if let Some(s) = find("stock") {
        let others: Vec<(&str, &Results)> = ["acmrs", "acmrs-req.stock-peers"]
            .into_iter()
            .filter_map(|l| find(l).map(|r| (l, r)))
            .collect();
        let mut hdr = vec!["what".to_string()];
        for (l, _) in &others {
            hdr.push(format!("stock/{l} p50"));
            hdr.push(format!("stock/{l} p99"));
        }
        let hdr: Vec<&str> = hdr.iter().map(String::as_str).collect();
        let mut t = Table::new(&hdr);
        let q = |h: &LatencyHistogram| (h.summary().p50_ns, h.summary().p99_ns);
        let mut row = |what: String, f: &dyn Fn(&Results) -> Option<(f64, f64)>| {
            let Some(base) = f(s) else { return };
            let mut cells = vec![what];
            for (_, o) in &others {
                match f(o) {
                    Some(v) => {
                        cells.push(ratio(base.0, v.0));
                        cells.push(if base.1.is_nan() {
                            String::new()
                        } else {
                            ratio(base.1, v.1)
                        });
                    }
                    None => cells.extend([String::new(), String::new()]),
                }
            }
            t.row(cells);
        };
        row("single miss".into(), &|r| Some(q(&r.single)));
        for (size, _) in &plan.bursts {
            row(format!("burst {size}: completion (median)"), &|r| {
                r.burst
                    .get(size)
                    .map(|b| (median(&b.1).as_secs_f64(), f64::NAN))
            });
            row(format!("burst {size}: per request"), &|r| {
                r.burst.get(size).map(|b| q(&b.0))
            });
        }
        row("hit".into(), &|r| Some(q(&r.hit)));
        let _ = writeln!(
            md,
            "## Ratios (> 1: the acmrs side is faster)\n\n{}",
            t.render()
        );
    }
    // What the requester did, from its counters (`ib_acme -P`, global).
    let mut hdr = vec!["configuration", "phase"];
    hdr.extend(COUNTER_NAMES);
    let mut t = Table::new(&hdr);
    for (c, r) in results {
        for (kind, v) in &r.counters {
            let mut row = vec![c.label.clone(), kind.to_string()];
            row.extend(v.iter().map(|x| x.to_string()));
            t.row(row);
        }
    }
    let _ = writeln!(
        md,
        "## The requester's counters over the measured phases (ib_acme -P deltas)\n\n{}",
        t.render()
    );
    let mut t = Table::new(&["configuration", "phase", "error answers", "statuses"]);
    for (c, r) in results {
        for (phase, (n, st)) in &r.failed {
            t.row(vec![
                c.label.clone(),
                phase.clone(),
                n.to_string(),
                format!("{st:?}"),
            ]);
        }
    }
    let _ = writeln!(
        md,
        "## Error answers (counted in the latencies above; none is the expected result)\n\n{}",
        t.render()
    );
    if mixed {
        let _ = writeln!(
            md,
            "(Mixed configurations: `X-req.Y-peers` = requester runs X, both peers run Y.)\n"
        );
    }
    md
}

fn main() {
    let args: Cli = acm_report::cli::parse(2);
    acm_bench::fabric_bench_main("addr", args.common.host_net, || run(&args));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_request_is_what_libacm_sends() {
        let m = name_request(0x1234, "hca3", "hca4-17");
        assert_eq!(m.len(), HDR_LEN + 2 * 72);
        let v = AcmMsg::new_checked(&m[..]).unwrap();
        assert_eq!(v.version(), ACM_VERSION);
        assert_eq!(v.opcode(), Opcode::Resolve);
        assert_eq!(usize::from(v.length()), m.len());
        assert_eq!(v.tid(), 0x1234);
        // The codec's own request check: a destination request with a source entry.
        v.check_resolve().unwrap();
        let r = AcmMsgRepr::parse(&v).unwrap();
        let (src, dst) = (r.entries()[0], r.entries()[1]);
        assert_eq!(
            (src.flags, src.info_type),
            (EP_FLAG_SOURCE, EpInfoType::Name)
        );
        assert_eq!((dst.flags, dst.info_type), (EP_FLAG_DEST, EpInfoType::Name));
        assert_eq!(&src.info[..5], b"hca3\0");
        assert_eq!(&dst.info[..8], b"hca4-17\0");
        assert!(dst.info[8..].iter().all(|&b| b == 0));
    }

    #[test]
    fn long_names_keep_a_terminating_nul() {
        let long = "n".repeat(80);
        let m = name_request(1, "hca3", &long);
        let r = AcmMsgRepr::parse(&AcmMsg::new_checked(&m[..]).unwrap()).unwrap();
        assert_eq!(r.entries()[1].info[MAX_ADDRESS - 1], 0);
        assert_eq!(r.entries()[1].info[MAX_ADDRESS - 2], b'n');
    }

    #[test]
    fn ratios_and_medians() {
        assert_eq!(ratio(2.0, 1.0), "2.00×");
        assert_eq!(ratio(1.0, 0.0), "—");
        assert_eq!(ratio(1.0, f64::NAN), "—");
        assert_eq!(ratio(1.0, 5000.0), "2.0e-4×");
        let d = |ms| Duration::from_millis(ms);
        assert_eq!(median(&[d(3), d(1), d(2)]), d(2));
        assert_eq!(median(&[]), Duration::ZERO);
    }

    #[test]
    fn plan_sizes_the_name_pool() {
        let p = Plan {
            opts: Vec::new(),
            log_level: "0".into(),
            rounds: 2,
            singles: 40,
            bursts: vec![(1, 5), (10, 2), (100, 1)],
            hit_passes: 2,
        };
        assert_eq!(p.names_per_fabric(), 2 * (40 + 5 + 20 + 100));
    }

    fn plan(args: &[&str]) -> Result<Plan, String> {
        let cli: Cli =
            acm_report::cli::try_parse_from(std::iter::once("addr").chain(args.iter().copied()))
                .map_err(|e| acm_report::cli::message(&e))?;
        Plan::of(&cli)
    }

    #[test]
    fn command_line_defaults_and_lists() {
        let p = plan(&["--quick"]).unwrap();
        assert_eq!(p.bursts, [(1, 5), (10, 2), (100, 1)]);
        assert_eq!((p.rounds, p.singles, p.hit_passes), (2, 40, 2));
        assert_eq!(p.log_level, "0");
        let p = plan(&[
            "--bursts",
            "1, 10,100",
            "--burst-reps=3,2,1",
            "--opt",
            "timeout=5",
        ])
        .unwrap();
        assert_eq!(p.bursts, [(1, 3), (10, 2), (100, 1)]);
        assert_eq!((p.rounds, p.singles, p.hit_passes), (4, 150, 3));
        assert_eq!(p.opts, [("timeout".to_string(), "5".to_string())]);
        assert!(plan(&["--bursts", "1,x"]).is_err());
        assert!(plan(&["--bursts", "1,0", "--burst-reps", "1,1"]).is_err());
        assert!(plan(&["--bursts", "1,2"])
            .unwrap_err()
            .contains("same length"));
        let cli: Cli =
            acm_report::cli::try_parse_from(["addr", "--no-mixed", "--host-net"]).unwrap();
        assert!(cli.no_mixed && cli.common.host_net);
    }
}
