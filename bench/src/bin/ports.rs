//! **One host, many ports**: the real ibacm daemon with acmrs on a host of one port against the
//! same on a host of N ports (default 8: 4 HCAs of 2 ports), in one run, on one simulated
//! fat-tree: hits and isolated misses on the host's **last** port, the idle CPU of the daemon
//! in adaptive mode, and its RSS per port.
//!
//! For each shape the host is brought up alone (ibsim serves 10 clients per instance: OpenSM,
//! one per daemon port and a probe), the daemon is restarted before each repetition (empty
//! caches), and then, from the last port (PATH requests by SLID and DLID, one TCP connection
//! per request as the core wants, one request at a time):
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
    /// Daemon restarts (each one round of misses) per shape [default: 4; --quick 2]
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
    hits: LatencyHistogram,
    misses: LatencyHistogram,
    idle_cpu_pct: f64,
    acmrs_idle_cpu_pct: f64,
    rss_kib: u64,
    dataplane_threads: usize,
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

fn run_shape(a: &Cli, n: usize, reps: usize, idle: u64) -> Result<Shape, String> {
    let topo = Topology::parse(TOPOLOGY).map_err(|e| e.to_string())?;
    let mut b = Fabric::builder(topo, ["Hca2"])
        .sm_node("Hca1")
        .provider(Provider::Acmrs)
        .host("Hca2", spec(n))
        .hosts_file(HostsFile::Absent)
        .name_prefix(&format!("bench-ports{n}"))
        .option("log_level", &a.common.log_level);
    for (k, v) in &a.common.opts {
        b = b.option(k, v);
    }
    let mut f = b.start().map_err(|e| e.to_string())?;
    let own: Vec<u16> = f
        .node("Hca2")
        .map_err(|e| e.to_string())?
        .ports
        .iter()
        .map(|p| p.lid)
        .collect();
    let last = *own.last().ok_or("no port")?;
    // Every other LID: the HCAs' (ibaddr as each) and the switches' (LIDs OpenSM gave the
    // rest of 1..=nodes).
    let nodes = f.topology().hcas().len() + f.topology().switches().len();
    let dests: Vec<u16> = (1..=nodes as u16).filter(|l| !own.contains(l)).collect();
    let (mut hits, mut misses) = (LatencyHistogram::new(), LatencyHistogram::new());
    let mut tid = 1u64;
    for rep in 0..reps {
        progress(format!("{n} port(s): repetition {}/{reps}", rep + 1));
        if rep > 0 {
            f.node_mut("Hca2").map_err(|e| e.to_string())?.stop_daemon();
            // A daemon stopped by SIGTERM never tells ibsim its port clients left.
            f.reap_dead_clients().map_err(|e| e.to_string())?;
            f.node_mut("Hca2")
                .map_err(|e| e.to_string())?
                .restart_daemon()
                .map_err(|e| e.to_string())?;
        }
        let node = f.node("Hca2").map_err(|e| e.to_string())?;
        // Warm: the daemon answers (a path to its own first port's LID, not a destination).
        let t = Instant::now();
        while ask(node, last, own[0], 0).is_err() {
            if t.elapsed() > Duration::from_secs(30) {
                return Err("the daemon answers no path within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        for d in &dests {
            std::thread::sleep(Duration::from_millis(a.gap));
            tid += 1;
            misses.record(ask(node, last, *d, tid)?);
        }
        for _ in 0..a.hits {
            for d in &dests {
                tid += 1;
                hits.record(ask(node, last, *d, tid)?);
            }
        }
    }
    let node = f.node("Hca2").map_err(|e| e.to_string())?;
    let pid = node.pid().ok_or("no daemon")?;
    std::thread::sleep(Duration::from_secs(1));
    let (a0, o0) = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(idle));
    let (a1, o1) = cpu_ticks(pid);
    let pct = |t: u64| 100.0 * t as f64 / clock_ticks() / idle as f64;
    let dataplane_threads = acm_fabric::process::threads_of(pid)
        .into_iter()
        .filter(|t| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{t}/comm"))
                .is_ok_and(|c| c.starts_with("acmrs-dataplan"))
        })
        .count();
    Ok(Shape {
        ports: n,
        hits,
        misses,
        idle_cpu_pct: pct(a1 - a0),
        acmrs_idle_cpu_pct: pct(o1 - o0),
        rss_kib: rss_kib(pid),
        dataplane_threads,
    })
}

fn us(ns: f64) -> String {
    format!("{:.1}", ns / 1000.0)
}

fn run(a: &Cli) -> Result<String, String> {
    a.common.run.create_out()?;
    let quick = a.common.run.quick;
    let reps = a.reps.unwrap_or(if quick { 2 } else { 4 });
    let idle = a.idle.unwrap_or(if quick { 4 } else { 10 });
    let started = acm_bench::now_utc();
    let mut shapes = Vec::new();
    // One port first, then N, then one port again: a drift of the host between the two shows
    // as a difference between the two one-port runs.
    for n in [1, a.ports, 1] {
        shapes.push(run_shape(a, n, reps, idle)?);
    }
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
            format!(
                "{} port(s){}",
                s.ports,
                if i == 2 { " (again)" } else { "" }
            ),
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
    let one = &shapes[0];
    let many = &shapes[1];
    let ratio = |x: f64, y: f64| format!("{:+.1} %", 100.0 * (x / y - 1.0));
    let (h1, hn) = (one.hits.summary(), many.hits.summary());
    let (m1, mn) = (one.misses.summary(), many.misses.summary());
    let per_port = (many.rss_kib as f64 - one.rss_kib as f64) / (many.ports - 1) as f64;
    let report = format!(
        "# One host, {n} ports against one (acm-bench ports{q})\n\n\
         {started}, {TOPOLOGY}, acmrs in the real ibacm, adaptive mode, {reps} repetitions, \
         {hits} hits per destination, {gap} ms before each miss; {cpus} CPUs, load {load}\n\n\
         {table}\n\
         {n} ports against 1 (the first one-port run): hit p50 {hp50}, p99 {hp99}; \
         miss p50 {mp50}, p99 {mp99}; RSS per port {pp:.0} KiB.\n",
        n = a.ports,
        q = if quick { " --quick" } else { "" },
        hits = a.hits,
        gap = a.gap,
        cpus = acm_bench::online_cpus(),
        load = acm_bench::loadavg(),
        table = t.render(),
        hp50 = ratio(hn.p50_ns, h1.p50_ns),
        hp99 = ratio(hn.p99_ns, h1.p99_ns),
        mp50 = ratio(mn.p50_ns, m1.p50_ns),
        mp99 = ratio(mn.p99_ns, m1.p99_ns),
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
