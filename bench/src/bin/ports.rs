//! **One host, many ports**: the real ibacm daemon with acmrs on a host of one port against the
//! same on a host of N ports (default 8: 4 HCAs of 2 ports), in one run, on one simulated
//! fat-tree: hits and isolated misses on the host's **last** port, the idle CPU of the daemon
//! in adaptive mode, and its RSS per port.
//!
//! Three hosts are up at once, each on a fabric of its own (ibsim serves 10 clients per
//! instance: OpenSM, one per daemon port and a probe): one port, N ports, and a second one-port
//! host as the control, whose difference from the first is the run's noise floor. Each
//! repetition restarts every daemon (empty caches) and lets them settle 1 s; then,
//! destination by destination, each host is asked in turn (the order turning each
//! repetition), from its last port (PATH requests by SLID and DLID, one TCP connection per
//! request as the core wants, one request at a time), so a drift of the shared machine lands
//! on every shape alike:
//! * **isolated misses**: every other LID of the fabric once, one after the other, each after
//!   a pause of `--gap` ms (the worker parks between them in adaptive mode);
//! * **hits**: the same destinations again, `--hits` times each.
//!
//! Each answer must be a path from the last port (its SLID) to the destination. Latency is the
//! client's round trip (send → whole answer read). Idle CPU: the daemon's CPU time over
//! `--idle` seconds with no requests, whole process and acmrs's own threads (`acmrs-*`; the
//! rest is the core and the simulator's port monitor, which polls every port every 200 ms);
//! RSS from `/proc/<pid>/status` after the run.
//!
//! `cargo run --release -p acm-bench --bin ports -- [--quick] [--out DIR]`
//! (build `-p acm-plugin -p simverbs` with the same profile first; root).

use acm_bench::FabricBenchOpts;
use acm_core_nostd::wire::client::Status;
use acm_core_nostd::wire::path_record::PathRecordRepr;
use acm_fabric::client::path_request;
use acm_fabric::{Fabric, HostSpec, HostsFile, Node, Provider, Topology};
use acm_report::cli::num;
use acm_report::{progress, write_atomic, LatencyHistogram, Table};
use clap::Parser;
use std::time::{Duration, Instant};

/// Hits and isolated misses on the last port of a host of N ports against a host of one, the
/// real daemon with acmrs, in one run (root; docs/bench.md).
#[derive(Parser)]
#[command(name = "ports", version)]
struct Cli {
    #[command(flatten)]
    common: FabricBenchOpts,
    /// Ports of the many-port host: 2, 4, 6 or 8 (HCAs of 2 ports each)
    #[arg(long, default_value = "8", value_parser = ports_arg)]
    ports: usize,
    /// Daemon restarts (each one round of misses) per shape [default: 20; --quick 4]
    #[arg(long, value_parser = num::<usize>)]
    reps: Option<usize>,
    /// Hits per destination per repetition
    #[arg(long, default_value = "10", value_parser = num::<usize>)]
    hits: usize,
    /// Pause before each miss, ms
    #[arg(long, default_value = "20", value_parser = num::<u64>)]
    gap: u64,
    /// Idle window for the CPU figure, s [default: 10; --quick 4]
    #[arg(long, value_parser = num::<u64>)]
    idle: Option<u64>,
}

fn ports_arg(v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .ok()
        .filter(|n| [2, 4, 6, 8].contains(n))
        .ok_or_else(|| format!("wants 2, 4, 6 or 8, got {v:?}"))
}

/// The fabric: 2 leaves of 16 HCAs, 2 spines: 32 HCAs, 4 switches.
const TOPOLOGY: &str = "fattree:2,2,16";

/// One shape's results.
struct Shape {
    ports: usize,
    label: &'static str,
    hits: LatencyHistogram,
    misses: LatencyHistogram,
    idle_cpu_pct: f64,
    acmrs_idle_cpu_pct: f64,
    rss_kib: u64,
    dataplane_threads: usize,
}

/// One shape's fabric, up: its own ibsim and OpenSM, the daemon's host `Hca2` of `n` ports.
struct Host {
    f: Fabric,
    /// The host's port LIDs; requests leave from the last.
    own: Vec<u16>,
    /// Every other LID of the fabric.
    dests: Vec<u16>,
    shape: Shape,
}

/// A host spec of `n` ports: HCAs of two ports (Hca2+Hca3, Hca4+Hca5, ...), or one port.
fn spec(n: usize) -> HostSpec {
    if n == 1 {
        return HostSpec::single("Hca2");
    }
    let cas: Vec<String> = (0..n / 2)
        .map(|i| format!("Hca{}+Hca{}", 2 + 2 * i, 3 + 2 * i))
        .collect();
    HostSpec::parse(&cas.join(",")).expect("a valid spec")
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// utime + stime of a /proc stat line, in ticks.
fn stat_ticks(path: &str) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    // The command is in parentheses and may hold spaces: fields after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// CPU ticks of the whole process and of its `acmrs-*` threads.
fn cpu_ticks(pid: i32) -> (u64, u64) {
    let all = stat_ticks(&format!("/proc/{pid}/stat")).unwrap_or(0);
    let mut ours = 0;
    for t in acm_fabric::process::threads_of(pid) {
        let comm =
            std::fs::read_to_string(format!("/proc/{pid}/task/{t}/comm")).unwrap_or_default();
        if comm.starts_with("acmrs") {
            ours += stat_ticks(&format!("/proc/{pid}/task/{t}/stat")).unwrap_or(0);
        }
    }
    (all, ours)
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// One PATH request by LIDs from `slid`, on a new connection; its round trip, checked.
fn ask(node: &Node, slid: u16, dlid: u16, tid: u64) -> Result<Duration, String> {
    let mut p = PathRecordRepr::ZERO;
    p.slid = slid;
    p.dlid = dlid;
    let mut c = node.client().map_err(|e| e.to_string())?;
    let (a, dt) = c.roundtrip(&path_request(&p, 0, tid))?;
    if a.status != Status::Success || a.path.slid != slid || a.path.dlid != dlid {
        return Err(format!(
            "LID {slid} -> {dlid}: status {:?}, path {} -> {}",
            a.status, a.path.slid, a.path.dlid
        ));
    }
    Ok(dt)
}

impl Host {
    fn up(a: &Cli, n: usize, label: &'static str, tag: usize) -> Result<Host, String> {
        let topo = Topology::parse(TOPOLOGY).map_err(|e| e.to_string())?;
        let mut b = Fabric::builder(topo, ["Hca2"])
            .sm_node("Hca1")
            .provider(Provider::Acmrs)
            .host("Hca2", spec(n))
            .hosts_file(HostsFile::Absent)
            .name_prefix(&format!("bench-ports{n}-{tag}"))
            .option("log_level", &a.common.log_level);
        for (k, v) in &a.common.opts {
            b = b.option(k, v);
        }
        let f = b.start().map_err(|e| e.to_string())?;
        let own: Vec<u16> = f
            .node("Hca2")
            .map_err(|e| e.to_string())?
            .ports
            .iter()
            .map(|p| p.lid)
            .collect();
        // Every other LID: the HCAs' (ibaddr as each) and the switches' (LIDs OpenSM gave
        // the rest of 1..=nodes).
        let nodes = f.topology().hcas().len() + f.topology().switches().len();
        let dests: Vec<u16> = (1..=nodes as u16).filter(|l| !own.contains(l)).collect();
        Ok(Host {
            f,
            own,
            dests,
            shape: Shape {
                ports: n,
                label,
                hits: LatencyHistogram::new(),
                misses: LatencyHistogram::new(),
                idle_cpu_pct: 0.0,
                acmrs_idle_cpu_pct: 0.0,
                rss_kib: 0,
                dataplane_threads: 0,
            },
        })
    }

    fn node(&self) -> Result<&Node, String> {
        self.f.node("Hca2").map_err(|e| e.to_string())
    }

    fn last(&self) -> u16 {
        *self.own.last().expect("a host has a port")
    }

    /// A new daemon (empty caches), once it answers.
    fn restart(&mut self) -> Result<(), String> {
        self.f
            .node_mut("Hca2")
            .map_err(|e| e.to_string())?
            .stop_daemon();
        // A daemon stopped by SIGTERM never tells ibsim its port clients left.
        self.f.reap_dead_clients().map_err(|e| e.to_string())?;
        self.f
            .node_mut("Hca2")
            .map_err(|e| e.to_string())?
            .restart_daemon()
            .map_err(|e| e.to_string())?;
        self.warm()
    }

    /// Waits until the daemon answers (a path to its own first port's LID, not a
    /// destination).
    fn warm(&self) -> Result<(), String> {
        let t = Instant::now();
        while ask(self.node()?, self.last(), self.own[0], 0).is_err() {
            if t.elapsed() > Duration::from_secs(30) {
                return Err("the daemon answers no path within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// One request from the last port to destination `i` (if the host has that many).
    fn ask_nth(&self, i: usize, tid: u64) -> Result<Option<Duration>, String> {
        match self.dests.get(i) {
            Some(d) => ask(self.node()?, self.last(), *d, tid).map(Some),
            None => Ok(None),
        }
    }

    /// CPU ticks of the daemon (process, acmrs threads).
    fn ticks(&self) -> Result<(u64, u64), String> {
        Ok(cpu_ticks(self.node()?.pid().ok_or("no daemon")?))
    }

    /// RSS and dataplane threads, and the idle CPU from `before`/`after` ticks over `idle` s.
    fn finish(&mut self, before: (u64, u64), after: (u64, u64), idle: u64) -> Result<(), String> {
        let pid = self.node()?.pid().ok_or("no daemon")?;
        let pct = |t: u64| 100.0 * t as f64 / clock_ticks() / idle as f64;
        self.shape.idle_cpu_pct = pct(after.0 - before.0);
        self.shape.acmrs_idle_cpu_pct = pct(after.1 - before.1);
        self.shape.rss_kib = rss_kib(pid);
        self.shape.dataplane_threads = acm_fabric::process::threads_of(pid)
            .into_iter()
            .filter(|t| {
                std::fs::read_to_string(format!("/proc/{pid}/task/{t}/comm"))
                    .is_ok_and(|c| c.starts_with("acmrs-dataplan"))
            })
            .count();
        Ok(())
    }
}

/// The shapes up at once, each on its own fabric, measured interleaved: each repetition
/// restarts every daemon, then destination by destination asks each host in turn (misses,
/// then hits), so a drift of the shared host lands on every shape alike. The control is a
/// second one-port host: its difference from the first is the run's noise floor.
/// How long a restarted host settles before its first measured miss.
const SETTLE_MS: u64 = 1000;

fn measure(a: &Cli, reps: usize, idle: u64) -> Result<Vec<Shape>, String> {
    let mut hosts = vec![
        Host::up(a, 1, "1 port", 0)?,
        Host::up(a, a.ports, "", 1)?,
        Host::up(a, 1, "1 port (control)", 2)?,
    ];
    let most = hosts.iter().map(|h| h.dests.len()).max().unwrap_or(0);
    let mut tid = 1u64;
    for rep in 0..reps {
        progress(format!("repetition {}/{reps}", rep + 1));
        for h in &mut hosts {
            if rep == 0 {
                h.warm()?;
            } else {
                h.restart()?;
            }
        }
        // Let every port finish its start (joins, its half-world table): the misses below
        // are isolated ones on a settled host, not the start's.
        std::thread::sleep(Duration::from_millis(SETTLE_MS));
        // The order of the hosts turns each repetition: none is always first after a gap.
        let order: Vec<usize> = (0..hosts.len()).map(|k| (k + rep) % hosts.len()).collect();
        for i in 0..most {
            for &k in &order {
                std::thread::sleep(Duration::from_millis(a.gap));
                tid += 1;
                if let Some(dt) = hosts[k].ask_nth(i, tid)? {
                    hosts[k].shape.misses.record(dt);
                }
            }
        }
        for _ in 0..a.hits {
            for i in 0..most {
                for &k in &order {
                    tid += 1;
                    if let Some(dt) = hosts[k].ask_nth(i, tid)? {
                        hosts[k].shape.hits.record(dt);
                    }
                }
            }
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    let before = hosts
        .iter()
        .map(Host::ticks)
        .collect::<Result<Vec<_>, _>>()?;
    std::thread::sleep(Duration::from_secs(idle));
    let mut shapes = Vec::new();
    for (mut h, b) in hosts.into_iter().zip(before) {
        let after = h.ticks()?;
        h.finish(b, after, idle)?;
        shapes.push(h.shape);
    }
    Ok(shapes)
}

fn us(ns: f64) -> String {
    format!("{:.1}", ns / 1000.0)
}

fn run(a: &Cli) -> Result<String, String> {
    a.common.run.create_out()?;
    let quick = a.common.run.quick;
    let reps = a.reps.unwrap_or(if quick { 4 } else { 20 });
    let idle = a.idle.unwrap_or(if quick { 4 } else { 10 });
    let started = acm_bench::now_utc();
    let shapes = measure(a, reps, idle)?;
    let mut t = Table::new(&[
        "host",
        "hit p50 µs",
        "hit p99 µs",
        "miss p50 µs",
        "miss p99 µs",
        "hits",
        "misses",
        "idle CPU % (process)",
        "idle CPU % (acmrs threads)",
        "RSS MiB",
        "dataplane threads",
    ]);
    for (i, s) in shapes.iter().enumerate() {
        let (h, m) = (s.hits.summary(), s.misses.summary());
        t.row(vec![
            if s.label.is_empty() {
                format!("{} ports", s.ports)
            } else {
                s.label.to_string()
            },
            us(h.p50_ns),
            us(h.p99_ns),
            us(m.p50_ns),
            us(m.p99_ns),
            h.count.to_string(),
            m.count.to_string(),
            format!("{:.2}", s.idle_cpu_pct),
            format!("{:.2}", s.acmrs_idle_cpu_pct),
            format!("{:.1}", s.rss_kib as f64 / 1024.0),
            s.dataplane_threads.to_string(),
        ]);
        if let Some(dir) = &a.common.run.out {
            let tag = format!("ports{}-{i}", s.ports);
            s.hits
                .write_hgrm(&dir.join(format!("{tag}-hits.hgrm")))
                .map_err(|e| e.to_string())?;
            s.misses
                .write_hgrm(&dir.join(format!("{tag}-misses.hgrm")))
                .map_err(|e| e.to_string())?;
        }
    }
    let (one, many, control) = (&shapes[0], &shapes[1], &shapes[2]);
    let against = |x: &Shape| {
        let ratio = |x: f64, y: f64| format!("{:+.1} %", 100.0 * (x / y - 1.0));
        let (h1, hx) = (one.hits.summary(), x.hits.summary());
        let (m1, mx) = (one.misses.summary(), x.misses.summary());
        format!(
            "hit p50 {}, p99 {}; miss p50 {}, p99 {}",
            ratio(hx.p50_ns, h1.p50_ns),
            ratio(hx.p99_ns, h1.p99_ns),
            ratio(mx.p50_ns, m1.p50_ns),
            ratio(mx.p99_ns, m1.p99_ns)
        )
    };
    let per_port = (many.rss_kib as f64 - one.rss_kib as f64) / (many.ports - 1) as f64;
    let report = format!(
        "# One host, {n} ports against one (acm-bench ports{q})\n\n\
         {started}, {TOPOLOGY}, acmrs in the real ibacm, adaptive mode, three fabrics up at \
         once and measured interleaved, {reps} repetitions, {hits} hits per destination, \
         {gap} ms before each miss; {cpus} CPUs, load {load}\n\n\
         {table}\n\
         {n} ports against 1: {vs_many}.\n\
         The control (1 port against 1, the noise floor): {vs_control}.\n\
         RSS per port {pp:.0} KiB.\n",
        n = a.ports,
        q = if quick { " --quick" } else { "" },
        hits = a.hits,
        gap = a.gap,
        cpus = acm_bench::online_cpus(),
        load = acm_bench::loadavg(),
        table = t.render(),
        vs_many = against(many),
        vs_control = against(control),
        pp = per_port,
    );
    if let Some(dir) = &a.common.run.out {
        write_atomic(&dir.join("ports.md"), report.as_bytes()).map_err(|e| e.to_string())?;
    }
    Ok(report)
}

fn main() {
    let a: Cli = acm_report::cli::parse(2);
    acm_bench::fabric_bench_main("ports", a.common.host_net, || run(&a));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_specs_of_n_ports_are_hcas_of_two() {
        assert_eq!(spec(1).ports().len(), 1);
        let s = spec(8);
        let p = s.ports();
        assert_eq!(p.len(), 8);
        assert_eq!(s.devices.len(), 4);
        assert_eq!(
            (p[7].0.as_str(), p[7].1, p[7].2.node.as_str()),
            ("ibsim3", 2, "Hca9")
        );
        assert!(ports_arg("3").is_err() && ports_arg("10").is_err());
        assert_eq!(ports_arg("8"), Ok(8));
    }

    #[test]
    fn proc_stat_ticks_skip_a_command_with_spaces() {
        let dir = std::env::temp_dir().join(format!("ports-stat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("stat");
        std::fs::write(&f, "42 (a b) S 1 2 3 4 5 6 7 8 9 10 120 30 0 0\n").unwrap();
        assert_eq!(stat_ticks(f.to_str().unwrap()), Some(150));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
