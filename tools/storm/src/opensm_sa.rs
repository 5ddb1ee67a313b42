//! `opensm-sa`: measures the real OpenSM's SA on the simulated fabric (ibsim + OpenSM started
//! by `acm-fabric`), for the storm model (`docs/storm.md`, "The SA, measured").
//!
//! The parent process brings up the fabric (default `fattree:16,4,16`: 256 HCAs, 20 switches,
//! 276 LIDs; no ibacm daemons), in its own network namespace with a deep Unix datagram queue
//! (ibsim's sockets are abstract Unix sockets; the host's `max_dgram_qlen` is 10). It then runs
//! itself again as **one simulated HCA** (`LD_PRELOAD=libumad2sim.so SIM_HOST=<HCA>`), a minimal
//! umad client (`umad-ffi`) that measures:
//!
//! * the round trip of cheap SA queries (ClassPortInfo Get; a PathRecord Get for a LID nobody
//!   has) against a real PathRecord Get, one at a time: the simulated transport's share;
//! * PathRecord Gets per second with C queries outstanding (closed loop, random DLIDs), and the
//!   CPU time OpenSM and ibsim spent per Get (`/proc/PID/stat`);
//! * half-world PathRecord GetTables (ComponentMask SGID only) from every port of the subnet,
//!   one at a time, each one whole: OpenSM computes all of a port's paths per query, its RMPP
//!   sender (`libumad_rmpp.so`, preloaded by acm-fabric; docs/umad-rmpp.md) segments the
//!   answer, and the client acknowledges and reassembles it with `acm_core_nostd::rmpp`'s
//!   `Receiver`: the time is from the GetTable to the last segment, the records are the
//!   records received;
//! * overload: OpenSM restarted with a small `max_msg_fifo_timeout`, the client keeps many
//!   Gets outstanding; OpenSM's log lines "Dropping MAD since the dispatcher is already
//!   overloaded" and the Gets never answered show the drop rule at work.
//!
//! The figures go to a TOML file (`--toml`, default `opensm-measured.toml`, or
//! `DIR/opensm-measured.toml` with `--out DIR`) and to stdout. Root only (network namespace,
//! ibsim). `cargo build --release -p acmrs-storm && target/release/opensm-sa`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use acm_core_nostd::rmpp::{Config, Progress, Receiver};
use acm_core_nostd::wire::mad::Method;
use acm_core_nostd::wire::path_record::PathRecordMask;
use acm_core_nostd::wire::sa::{attr, SaPacket, SaRepr};
use acm_fabric::fabric::UMAD2SIM;
use acm_fabric::{Fabric, Topology};
use acm_report::cli::{counts, num, List, RunOpts};
use acm_report::{progress, write_atomic};
use clap::Parser;
use umad_ffi::{Addr, Port, MAD_LEN};

/// Measures the real OpenSM's SA on the simulated fabric: Gets/s per concurrency, half-world
/// GetTables, the transport's share, the drop rule (root; docs/storm.md).
#[derive(Parser)]
#[command(name = "opensm-sa", version)]
struct Cli {
    #[command(flatten)]
    run: RunOpts,
    /// The simulated fabric [default: fattree:16,4,16; with --quick fattree:4,2,8]
    #[arg(long, value_name = "fattree:L,S,H")]
    topology: Option<String>,
    /// Outstanding PathRecord Gets, one point each [default: 1,4,16,64,256]
    #[arg(long, value_name = "C[,C…]", value_parser = counts)]
    concurrency: Option<List<usize>>,
    /// Seconds per concurrency point [default: 3; with --quick 1]
    #[arg(long, value_name = "S", value_parser = num::<u64>)]
    secs: Option<u64>,
    /// Round trips per one-at-a-time probe [default: 2000; with --quick 200]
    #[arg(long, value_name = "N", value_parser = num::<usize>)]
    probes: Option<usize>,
    /// max_msg_fifo_timeout (ms) OpenSM is restarted with for the overload phase (0: skip it)
    #[arg(long, value_name = "MS", default_value = "1", value_parser = num::<u32>)]
    drop_fifo_ms: u32,
    /// Outstanding Gets in the overload phase (per client process)
    #[arg(long, value_name = "C", default_value = "256", value_parser = num::<usize>)]
    overload: usize,
    /// Client processes in the overload phase (each one more ibsim client; 4 × 1024 made
    /// ibsim 0.10 spin at 100 % CPU and stop forwarding)
    #[arg(long, value_name = "P", default_value = "1", value_parser = num::<usize>)]
    overload_procs: usize,
    /// Sweeps of half-world GetTables over every port [default: 3; with --quick 1]
    #[arg(long, value_name = "N", value_parser = num::<usize>)]
    table_sweeps: Option<usize>,
    /// The figures (TOML) [default: opensm-measured.toml, DIR/opensm-measured.toml with --out]
    #[arg(long, value_name = "PATH")]
    toml: Option<PathBuf>,
}

/// Set in the environment of the measuring child.
const CHILD_ENV: &str = "ACMRS_OPENSM_SA_CHILD";
/// `net.unix.max_dgram_qlen` in the bench's network namespace.
const DGRAM_QLEN: u32 = 8192;
/// A Get not answered within this is counted lost (umad2sim never times out a send).
const LOST_AFTER: Duration = Duration::from_secs(2);
/// A LID no port has (unicast range, above every LID the SM assigns here).
const NO_SUCH_LID: u16 = 0x1000;
/// Record bytes a half-world table may take (16 384 PathRecords).
const TABLE_STORAGE: usize = 1 << 20;
/// A GetTable with no segment within this, or not complete within the receiver's total time
/// plus this, is counted lost.
const TABLE_LOST_AFTER: Duration = Duration::from_secs(5);

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        let args: Vec<String> = std::env::args().skip(1).collect();
        match child(&args) {
            Ok(()) => return,
            Err(e) => {
                eprintln!("opensm-sa child: {e}");
                std::process::exit(1);
            }
        }
    }
    let a: Cli = acm_report::cli::parse(2);
    if let Err(e) = parent(&a) {
        eprintln!("opensm-sa: {e}");
        std::process::exit(1);
    }
}

// ---- the parent: fabric, OpenSM, the child runs, the report ---------------------------------

/// A private network namespace (ibsim's abstract sockets live there) with loopback up and a
/// deep datagram queue. Called while the process is single-threaded.
fn private_net(qlen: u32) -> Result<(), String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: unshare has no memory preconditions; the process has one thread here.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(os("unshare(CLONE_NEWNET) (root needed)"));
    }
    // Loopback stays down: nothing here uses IP. The datagram queue is per namespace.
    std::fs::write("/proc/sys/net/unix/max_dgram_qlen", qlen.to_string())
        .map_err(|e| format!("net.unix.max_dgram_qlen: {e}"))
}

/// Removes the bench's own scratch directory (the OpenSM options file, the children's
/// umad2sim `sys-PID` trees) however the run ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `utime + stime` of a process, in clock ticks (100 per second).
fn cpu_ticks(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The PIDs of OpenSM and ibsim among the fabric's processes.
fn sm_and_ibsim(fabric: &Fabric) -> (i32, i32) {
    let pids = fabric.pids();
    let find = |name: &str| pids.iter().copied().find(|&p| comm(p) == name).unwrap_or(0);
    (find("opensm"), find("ibsim"))
}

/// Runs the measuring child as HCA `host`; its stdout.
fn run_child(fabric: &Fabric, host: &str, args: &[String], dir: &Path) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new(exe)
        .args(args)
        .env(CHILD_ENV, "1")
        .env("LD_PRELOAD", UMAD2SIM)
        .env("SIM_HOST", host)
        .env("IBSIM_SOCKNAME", fabric.name())
        .current_dir(dir)
        .output()
        .map_err(|e| format!("child: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "child {args:?} failed ({}):\n{}\n{}",
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(stdout)
}

/// Spawns several children at once (the overload phase); their stdouts.
fn run_children(
    fabric: &Fabric,
    hosts: &[String],
    args: &[String],
    dir: &Path,
) -> Result<Vec<String>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut kids = Vec::new();
    for h in hosts {
        let d = dir.join(h);
        std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        let c = Command::new(&exe)
            .args(args)
            .env(CHILD_ENV, "1")
            .env("LD_PRELOAD", UMAD2SIM)
            .env("SIM_HOST", h)
            .env("IBSIM_SOCKNAME", fabric.name())
            .current_dir(&d)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("child: {e}"))?;
        kids.push(c);
    }
    let mut outs = Vec::new();
    for k in kids {
        let o = k.wait_with_output().map_err(|e| e.to_string())?;
        if !o.status.success() {
            return Err(format!(
                "overload child failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        outs.push(String::from_utf8_lossy(&o.stdout).into_owned());
    }
    Ok(outs)
}

/// `key=value` fields of the child's lines that start with `tag`.
fn records<'a>(out: &'a str, tag: &str) -> Vec<HashMap<&'a str, &'a str>> {
    out.lines()
        .filter(|l| l.split_whitespace().next() == Some(tag))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .filter_map(|kv| kv.split_once('='))
                .collect()
        })
        .collect()
}

fn field<T: std::str::FromStr + Default>(r: &HashMap<&str, &str>, k: &str) -> T {
    r.get(k).and_then(|v| v.parse().ok()).unwrap_or_default()
}

/// OpenSM's "Dropping MAD" lines: count, most messages queued, least and largest queue time
/// (ms) logged with a drop.
type DropLines = (u64, u64, u64, u64);

/// The "Dropping MAD" lines of an OpenSM log ([`DropLines`]).
fn drop_lines(log: &str) -> DropLines {
    let (mut n, mut msgs, mut qt, mut qmin) = (0u64, 0u64, 0u64, u64::MAX);
    for l in log.lines().filter(|l| l.contains("Dropping MAD")) {
        n += 1;
        if let Some(x) = l.split("overloaded with ").nth(1) {
            msgs = msgs.max(
                x.split_whitespace()
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            );
        }
        if let Some(x) = l.split("queue time of:").nth(1) {
            let v = x
                .split('[')
                .next()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            qt = qt.max(v);
            qmin = qmin.min(v);
        }
    }
    (n, msgs, if n == 0 { 0 } else { qmin }, qt)
}

fn osm_logs(fabric: &Fabric) -> String {
    let mut s = String::new();
    let dir = fabric.scratch().join("opensm");
    if let Ok(rd) = std::fs::read_dir(&dir) {
        let mut v: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        v.sort();
        for p in v {
            s.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
        }
    }
    s
}

/// The 1-minute load average (other work on the machine skews every wall-clock figure).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_default()
}

fn opensm_version() -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", "opensm"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn date_utc() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn parent(a: &Cli) -> Result<(), String> {
    let quick = a.run.quick;
    let topo_spec = a.topology.clone().unwrap_or_else(|| {
        if quick {
            "fattree:4,2,8".into()
        } else {
            "fattree:16,4,16".into()
        }
    });
    let concs = a
        .concurrency
        .as_ref()
        .map(|l| l.0.clone())
        .unwrap_or_else(|| vec![1, 4, 16, 64, 256]);
    let secs = a.secs.unwrap_or(if quick { 1 } else { 3 });
    let probes = a.probes.unwrap_or(if quick { 200 } else { 2000 });
    a.run.create_out()?;
    let toml_path = a
        .toml
        .clone()
        .or_else(|| a.run.out_file("opensm-measured.toml"))
        .unwrap_or_else(|| PathBuf::from("opensm-measured.toml"));
    private_net(DGRAM_QLEN)?;
    let load0 = loadavg();
    let topo = Topology::parse(&topo_spec).map_err(|e| e.to_string())?;
    let hcas = topo.hcas();
    if hcas.len() < 3 {
        return Err(format!("{topo_spec}: fewer than 3 HCAs"));
    }
    let max_lid = (hcas.len() + topo.switches().len()) as u16;
    let client = hcas[1].clone();
    let work = std::env::temp_dir().join(format!("opensm-sa-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let _cleanup = RemoveOnDrop(work.clone());
    let conf = work.join("opensm.conf");
    // The default rule (50 × 200 ms) written out, so the overload phase can change it.
    write_atomic(&conf, "max_msg_fifo_timeout 10000\n").map_err(|e| e.to_string())?;
    progress(format_args!(
        "bringing up {topo_spec} ({} HCAs, {max_lid} LIDs): OpenSM on {}, the client is {client}",
        hcas.len(),
        hcas[0]
    ));
    let t0 = Instant::now();
    let mut fabric = Fabric::builder(topo, [client.as_str()])
        .start_daemons(false)
        .sm_node(&hcas[0])
        .name_prefix("opensm-sa")
        .opensm_args(["-F".to_string(), conf.display().to_string()])
        .start()
        .map_err(|e| format!("bring-up: {e}"))?;
    progress(format_args!(
        "fabric {} up in {:.1} s",
        fabric.name(),
        t0.elapsed().as_secs_f64()
    ));
    let (osm, ibsim) = sm_and_ibsim(&fabric);
    let concs_s = concs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let args: Vec<String> = [
        "main".to_string(),
        format!("max_lid={max_lid}"),
        format!("conc={concs_s}"),
        format!("secs={secs}"),
        format!("probes={probes}"),
        format!(
            "sweeps={}",
            a.table_sweeps.unwrap_or(if quick { 1 } else { 3 })
        ),
        format!("osm={osm}"),
        format!("ibsim={ibsim}"),
    ]
    .into();
    progress(format_args!(
        "measuring (OpenSM pid {osm}, ibsim pid {ibsim})"
    ));
    let out = run_child(&fabric, &client, &args, &work)?;
    print!("{out}");
    let log_main = osm_logs(&fabric);
    let drops_main = drop_lines(&log_main);

    // The overload phase: OpenSM again, with a small max_msg_fifo_timeout.
    let mut overload = None;
    if a.drop_fifo_ms > 0 {
        fabric.stop_sm();
        write_atomic(&conf, format!("max_msg_fifo_timeout {}\n", a.drop_fifo_ms))
            .map_err(|e| e.to_string())?;
        fabric
            .start_sm()
            .map_err(|e| format!("OpenSM restart: {e}"))?;
        let (osm, _) = sm_and_ibsim(&fabric);
        let procs = a.overload_procs.clamp(1, 6).min(hcas.len() - 2);
        let hosts: Vec<String> = hcas[1..=procs].to_vec();
        let args: Vec<String> = [
            "load".to_string(),
            format!("max_lid={max_lid}"),
            format!("conc={}", a.overload),
            format!("secs={}", secs.max(2)),
        ]
        .into();
        progress(format_args!(
            "overload: OpenSM pid {osm} with max_msg_fifo_timeout {} ms, {procs} clients × {} outstanding",
            a.drop_fifo_ms, a.overload
        ));
        let outs = run_children(&fabric, &hosts, &args, &work)?;
        for o in &outs {
            print!("{o}");
        }
        let log = osm_logs(&fabric);
        let after: String = log.get(log_main.len()..).unwrap_or("").to_string();
        overload = Some((outs, drop_lines(&after)));
    }
    // The record count of a half-world answer, from OpenSM's own debug line (log_flags 0x0f:
    // osm_sa_respond says how many records it returns; the child checks it against the records
    // it received).
    let logged_records = {
        let before = osm_logs(&fabric).len();
        fabric.stop_sm();
        write_atomic(&conf, "log_flags 0x0f\n").map_err(|e| e.to_string())?;
        fabric
            .start_sm()
            .map_err(|e| format!("OpenSM restart: {e}"))?;
        let args: Vec<String> = ["table".to_string(), format!("max_lid={max_lid}")].into();
        let out = run_child(&fabric, &client, &args, &work)?;
        print!("{out}");
        let log = osm_logs(&fabric);
        let mut counts: Vec<u64> = log
            .get(before..)
            .unwrap_or("")
            .lines()
            .filter_map(|l| l.split("Returning ").nth(1))
            .filter_map(|x| x.split_whitespace().next()?.parse().ok())
            .collect();
        counts.sort_unstable();
        counts.last().copied().unwrap_or(0)
    };
    drop(fabric);
    let load = format!("{load0} → {}", loadavg());
    let meta = Meta {
        load: &load,
        logged_records,
        drops_main,
        topo: &topo_spec,
        max_lid,
        fifo_ms: a.drop_fifo_ms,
    };
    let report = report(&out, &meta, overload.as_ref());
    println!("{report}");
    write_atomic(&toml_path, &report).map_err(|e| format!("{}: {e}", toml_path.display()))?;
    println!("figures: {}", toml_path.display());
    Ok(())
}

/// What the report says besides the child's lines.
struct Meta<'a> {
    load: &'a str,
    logged_records: u64,
    drops_main: DropLines,
    topo: &'a str,
    max_lid: u16,
    fifo_ms: u32,
}

/// The TOML report.
fn report(out: &str, m: &Meta, overload: Option<&(Vec<String>, DropLines)>) -> String {
    let Meta {
        load,
        logged_records,
        drops_main,
        topo,
        max_lid,
        fifo_ms,
    } = *m;
    let mut s = String::new();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let _ = writeln!(
        s,
        "# The real OpenSM's SA on the simulated fabric, measured by `opensm-sa`\n\
         # (tools/storm/src/opensm_sa.rs; docs/storm.md, \"The SA, measured\").\n\n\
         [run]\ndate = \"{}\"\ntopology = \"{topo}\"\nlids = {max_lid}\nopensm = \"{}\"\ncores = {cores}\n\
         loadavg = \"{load}\"\n",
        date_utc(),
        opensm_version()
    );
    let probes = records(out, "probe");
    let _ = writeln!(
        s,
        "# One query at a time: round trip client → ibsim → OpenSM → ibsim → client (µs)."
    );
    let _ = writeln!(s, "[round_trip_us]");
    for p in &probes {
        let _ = writeln!(
            s,
            "{} = {{ p50 = {}, p99 = {}, mean = {} }}",
            p.get("what").unwrap_or(&"?"),
            field::<u64>(p, "p50_us"),
            field::<u64>(p, "p99_us"),
            field::<u64>(p, "mean_us")
        );
    }
    let _ = writeln!(
        s,
        "\n# Closed loop, C outstanding, random DLIDs (SLID+DLID Gets), and ClassPortInfo Gets\n\
         # as the transport's ceiling. osm_cpu_us, ibsim_cpu_us: CPU time of OpenSM, of ibsim (all\n\
         # threads) per answered query, from /proc/PID/stat (10 ms ticks)."
    );
    for (tag, title) in [("gets", "gets"), ("cpi", "class_port_info")] {
        let rows = records(out, tag);
        let col = |k: &str| {
            rows.iter()
                .map(|r| r.get(k).copied().unwrap_or("0").to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(s, "[{title}]");
        for k in [
            "conc",
            "per_s",
            "p50_us",
            "p99_us",
            "lost",
            "errors",
            "osm_cpu_us",
            "ibsim_cpu_us",
        ] {
            let _ = writeln!(s, "{k} = [{}]", col(k));
        }
        let _ = writeln!(s);
    }
    let gt = records(out, "gettable");
    if let Some(g) = gt.first() {
        let _ = writeln!(
            s,
            "# Half-world PathRecord GetTables (ComponentMask SGID only), one per port, one at a\n\
             # time, each one whole: OpenSM's answer segmented by the RMPP sender preloaded into\n\
             # it (libumad_rmpp.so), acknowledged and reassembled by acm_core_nostd::rmpp's\n\
             # Receiver (window 16). The time runs from the GetTable to the last segment; the\n\
             # records are those received (every port, this one included); records_per_s is\n\
             # all records received over the sum of the table times; the rmpp_* / paylen fields\n\
             # are the first segment's. osm_cpu_us_per_table is OpenSM's CPU time per whole\n\
             # table (its RMPP sender's segmenting included); the same sweep again with each\n\
             # table STOPped at its first segment gives its computation alone\n\
             # (osm_cpu_us_per_table_stopped, `stopped` tables), what the model takes; a third\n\
             # sweep takes each table whole with an ACK per segment (window 1: tables_w1,\n\
             # acks_per_table_w1, osm_cpu_us_per_table_w1).\n[gettable]"
        );
        for k in [
            "tables",
            "records_per_table",
            "records_min",
            "records_total",
            "segments_per_table",
            "acks_per_table",
            "p50_us",
            "p99_us",
            "mean_us",
            "total_s",
            "records_per_s",
            "first_mad_records",
            "rmpp_flags",
            "rmpp_type",
            "paylen",
            "status",
            "lost",
            "failed",
            "osm_cpu_us_per_table",
            "stopped",
            "osm_cpu_us_per_table_stopped",
            "tables_w1",
            "acks_per_table_w1",
            "osm_cpu_us_per_table_w1",
        ] {
            let _ = writeln!(s, "{k} = {}", g.get(k).unwrap_or(&"0"));
        }
        let _ = writeln!(
            s,
            "# OpenSM's debug line \"Returning N records\" for a half-world GetTable (a run with\n\
             # log_flags 0x0f); 0 = not seen\nopensm_logged_records = {logged_records}"
        );
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "# osm_sa_mad_ctrl.c: a Get is dropped (no answer, no BUSY) when the dispatcher holds\n\
         # more than one message and the last message it dispatched waited longer than\n\
         # max_msg_fifo_timeout (default 50 × 200 ms = 10 000 ms).\n[drops]\n\
         default_max_msg_fifo_timeout_ms = 10000\n\
         dropped_at_default = {}",
        drops_main.0
    );
    // What the storm's SaService takes: OpenSM's own CPU time per Get where the loop is
    // saturated (the least over C ≥ 64: per-message wake-ups are amortised there), and per
    // extra record of a half-world table (its CPU time per table minus a Get's, both sent one
    // at a time, over the records beyond the first).
    let gets = records(out, "gets");
    let get_us = gets
        .iter()
        .filter(|r| field::<usize>(r, "conc") >= 64)
        .map(|r| field::<u64>(r, "osm_cpu_us"))
        .filter(|&v| v > 0)
        .min()
        .unwrap_or(0);
    let get1_us = gets
        .iter()
        .find(|r| field::<usize>(r, "conc") == 1)
        .map_or(0, |r| field::<u64>(r, "osm_cpu_us"));
    // The computation alone: the tables STOPped at their first segment.
    let table_us = gt
        .first()
        .map_or(0, |g| field::<u64>(g, "osm_cpu_us_per_table_stopped"));
    let record_ns = (table_us.saturating_sub(get1_us) * 1000) / u64::from(max_lid.max(2) - 1);
    let model = format!(
        "\n# The storm model's figures (SaService::DEFAULT): OpenSM's CPU time per Get at\n\
         # saturation, per extra record of a half-world GetTable, the drop threshold of the code.\n\
         [model]\nget_service_us = {get_us}\ntable_record_ns = {record_ns}\n\
         max_msg_fifo_timeout_ms = 10000\nbusy = false\n"
    );
    if let Some((outs, (n, msgs, qmin, qt))) = overload {
        let (mut sent, mut answered, mut lost) = (0u64, 0u64, 0u64);
        for o in outs {
            for r in records(o, "load") {
                sent += field::<u64>(&r, "sent");
                answered += field::<u64>(&r, "answered");
                lost += field::<u64>(&r, "lost");
            }
        }
        let _ = writeln!(
            s,
            "overload_max_msg_fifo_timeout_ms = {fifo_ms}\n\
             overload_clients = {}\n\
             overload_sent = {sent}\n\
             overload_answered = {answered}\n\
             overload_lost = {lost}\n\
             overload_opensm_drop_lines = {n}\n\
             overload_max_queued_at_drop = {msgs}\n\
             overload_min_queue_time_ms_at_drop = {qmin}\n\
             overload_max_queue_time_ms_at_drop = {qt}",
            outs.len()
        );
    }
    s.push_str(&model);
    if let Some(g) = gt.first() {
        s.push_str(&sm_port(g, get_us));
    }
    s
}

/// OpenSM's time per RMPP segment sent and per ACK received on the simulated fabric (its
/// preloaded RMPP sender and umad2sim's socket I/O, the kernel MAD layer's work on a real SM
/// host), from the three table sweeps: a whole table costs `(S − 1)` segments and `A − 1`
/// ACKs more than one STOPped at its first segment (which sent one segment and took one
/// STOP); windows 16 and 1 give two values of `A` for the same `S`. `get_us`: OpenSM's time
/// per Get in the same run, the scale the model's `sm_mad_ns` is taken at.
fn sm_port(g: &HashMap<&str, &str>, get_us: u64) -> String {
    let f = |k: &str| field::<f64>(g, k);
    let (segs, a16, a1) = (
        f("segments_per_table"),
        f("acks_per_table"),
        f("acks_per_table_w1"),
    );
    let stopped = f("osm_cpu_us_per_table_stopped");
    let (d16, d1) = (
        f("osm_cpu_us_per_table") - stopped,
        f("osm_cpu_us_per_table_w1") - stopped,
    );
    let ack_us = if a1 > a16 {
        (d1 - d16) / (a1 - a16)
    } else {
        0.0
    };
    let seg_us = if segs > 1.0 {
        (d16 - (a16 - 1.0).max(0.0) * ack_us) / (segs - 1.0)
    } else {
        0.0
    };
    let ns = |us: f64| (us * 1000.0).max(0.0).round() as u64;
    let per_get = if get_us > 0 {
        (seg_us * 1000.0 / get_us as f64).max(0.0).round() as u64
    } else {
        0
    };
    format!(
        "\n# The SM's port on the simulated fabric (OpenSM's process: its RMPP sender and\n\
         # umad2sim's socket I/O): OpenSM's CPU time per RMPP segment sent and per ACK received,\n\
         # from the whole, STOPped and window-1 table sweeps; a segment against a Get of the same\n\
         # run (get_service_us), per mille.\n\
         [sm_port]\nsegment_sent_ns = {}\nack_received_ns = {}\nget_service_us = {get_us}\n\
         segment_per_get_permille = {per_get}\n",
        ns(seg_us),
        ns(ack_us)
    )
}

// ---- the child: one simulated HCA, a minimal SA client ---------------------------------------

struct Client {
    port: Port,
    agent: i32,
    sm: Addr,
    lid: u16,
    gid: [u8; 16],
    tid: u32,
}

/// One whole half-world table.
struct Table {
    /// From the GetTable to the last segment.
    us: u64,
    records: u64,
    segments: u32,
    /// ACKs the receiver sent.
    acks: u32,
    /// The first segment's MAD + RMPP + SA header.
    head: [u8; 56],
}

/// Why a table did not arrive.
#[derive(Debug)]
enum TableError {
    /// No segment in time, or no ending.
    Lost,
    /// The receiver ended it (an ABORT or STOP, either side).
    #[allow(dead_code)] // read through Debug
    Failed(acm_core_nostd::rmpp::Failure),
}

/// What a closed-loop run gave.
#[derive(Default)]
struct Loop {
    sent: u64,
    answered: u64,
    errors: u64,
    lost: u64,
    rtt_us: Vec<u64>,
    elapsed: Duration,
}

impl Loop {
    /// The `q` quantile of the round trips (sorted by `closed_loop`).
    fn pct(&self, q: f64) -> u64 {
        if self.rtt_us.is_empty() {
            return 0;
        }
        let i = ((q * self.rtt_us.len() as f64).ceil() as usize).clamp(1, self.rtt_us.len());
        self.rtt_us[i - 1]
    }
    fn mean(&self) -> u64 {
        if self.rtt_us.is_empty() {
            0
        } else {
            self.rtt_us.iter().sum::<u64>() / self.rtt_us.len() as u64
        }
    }
}

impl Client {
    fn open() -> Result<Client, String> {
        if !umad_ffi::init() {
            return Err("umad_init failed".into());
        }
        // SAFETY: UmadPort is plain data; all-zero is a valid initial value.
        let mut p: umad_ffi::sys::UmadPort = unsafe { std::mem::zeroed() };
        // SAFETY: NULL CA / port 0 = the first CA's first active port; `p` is a valid
        // out-pointer of the C layout.
        let rc = unsafe { umad_ffi::sys::umad_get_port(std::ptr::null(), 0, &mut p) };
        if rc < 0 {
            return Err(format!("umad_get_port: {rc}"));
        }
        let lid = p.base_lid as u16;
        let sm = Addr {
            dlid: p.sm_lid as u16,
            dqp: 1,
            sl: p.sm_sl as u8,
            qkey: 0x8001_0000,
        };
        let mut gid = [0u8; 16];
        gid[..8].copy_from_slice(&u64::from_be(p.gid_prefix).to_be_bytes());
        gid[8..].copy_from_slice(&u64::from_be(p.port_guid).to_be_bytes());
        // SAFETY: `p` was filled by umad_get_port and is released once.
        unsafe { umad_ffi::sys::umad_release_port(&mut p) };
        let port = Port::open(None, 0).map_err(|rc| format!("umad_open_port: {rc}"))?;
        let agent = port
            .register(3, 2, 1)
            .map_err(|rc| format!("umad_register: {rc}"))?;
        Ok(Client {
            port,
            agent,
            sm,
            lid,
            gid,
            tid: 0x100,
        })
    }

    fn next_tid(&mut self) -> u32 {
        self.tid = self.tid.wrapping_add(1).max(0x100);
        self.tid
    }

    fn send(&self, mad: &[u8; MAD_LEN]) -> Result<(), String> {
        self.port
            .send(self.agent, mad, self.sm, 2000, 0)
            .map_err(|rc| format!("umad_send: {rc}"))
    }

    /// The next MAD within `ms`: (low 32 TID bits, MAD), or None.
    fn recv(&self, ms: i32) -> Option<(u32, [u8; MAD_LEN])> {
        let r = self.port.recv(ms).ok()?;
        if r.status != 0 {
            return None;
        }
        let m = r.mad;
        Some((u32::from_be_bytes([m[12], m[13], m[14], m[15]]), m))
    }

    /// One half-world GetTable from `sgid`, whole: the RMPP receiver is started on the first
    /// segment (its TID as it arrives: ibsim and umad2sim rewrite bits 32-63 of ours), its
    /// ACKs go to the SA like any request.
    ///
    /// `storage` bytes of records are taken: 0 makes the receiver STOP at the first segment
    /// (OpenSM has computed the whole answer by then, and its RMPP sender sends nothing more).
    /// Each ACK grants `window` segments (16: OpenSM's own receiver's; 1: an ACK per segment).
    fn fetch_table(
        &mut self,
        sgid: &[u8; 16],
        storage: usize,
        window: u32,
    ) -> Result<Table, TableError> {
        let tid = self.next_tid();
        let t0 = Instant::now();
        let ms = || t0.elapsed().as_millis() as u64;
        let cfg = Config {
            window,
            ..Config::DEFAULT
        };
        let mut rx = Receiver::new(vec![0u8; storage], cfg);
        let mut started = false;
        let mut acks = 0u32;
        self.send(&half_world(tid, sgid))
            .map_err(|_| TableError::Lost)?;
        let limit = Duration::from_millis(Config::DEFAULT.total_timeout) + TABLE_LOST_AFTER;
        loop {
            if (!started && t0.elapsed() > TABLE_LOST_AFTER) || t0.elapsed() > limit {
                return Err(TableError::Lost);
            }
            let wait =
                rx.poll_timeout()
                    .map_or(100, |t| t.saturating_sub(ms()).clamp(1, 100)) as i32;
            let mut end = None;
            match self.recv(wait) {
                Some((got, m)) if got == tid => {
                    if !started {
                        rx.start(
                            ms(),
                            u64::from_be_bytes(m[8..16].try_into().unwrap_or([0; 8])),
                        );
                        started = true;
                    }
                    match rx.handle_receive(ms(), &m) {
                        Progress::Done { len } => end = Some(Ok(len)),
                        Progress::Failed(f) => end = Some(Err(f)),
                        _ => {}
                    }
                }
                Some(_) => {} // a late answer to an earlier query
                None => {
                    if started && rx.poll_timeout().is_some_and(|t| t <= ms()) {
                        if let Some(f) = rx.handle_timeout(ms()) {
                            end = Some(Err(f));
                        }
                    }
                }
            }
            while let Some(out) = rx.poll_transmit() {
                acks += 1;
                let _ = self.send(&out);
            }
            match end {
                None => {}
                Some(Err(f)) => return Err(TableError::Failed(f)),
                Some(Ok(len)) => {
                    let us = t0.elapsed().as_micros() as u64;
                    let mut head = [0u8; 56];
                    head.copy_from_slice(rx.header().map_or(&[0u8; 56][..], |h| &h[..]));
                    let attr = usize::from(u16::from_be_bytes([head[44], head[45]])) * 8;
                    let paylen = u32::from_be_bytes([head[32], head[33], head[34], head[35]]);
                    return Ok(Table {
                        us,
                        records: len.checked_div(attr).unwrap_or(0) as u64,
                        segments: paylen.div_ceil(220).max(1),
                        acks,
                        head,
                    });
                }
            }
        }
    }

    /// Runs `make` queries with `conc` outstanding for `dur` (then waits for stragglers).
    fn closed_loop(
        &mut self,
        conc: usize,
        dur: Duration,
        count: Option<usize>,
        make: &mut dyn FnMut(u32) -> [u8; MAD_LEN],
    ) -> Result<Loop, String> {
        let mut out = Loop::default();
        let mut pending: HashMap<u32, Instant> = HashMap::new();
        let start = Instant::now();
        let mut last_answer = start;
        loop {
            let sending = start.elapsed() < dur && count.is_none_or(|c| (out.sent as usize) < c);
            if !sending && pending.is_empty() {
                break;
            }
            while sending && pending.len() < conc && count.is_none_or(|c| (out.sent as usize) < c) {
                let tid = self.next_tid();
                self.send(&make(tid))?;
                pending.insert(tid, Instant::now());
                out.sent += 1;
            }
            if let Some((tid, m)) = self.recv(20) {
                if let Some(t) = pending.remove(&tid) {
                    let now = Instant::now();
                    out.rtt_us.push(now.duration_since(t).as_micros() as u64);
                    out.answered += 1;
                    last_answer = now;
                    if u16::from_be_bytes([m[4], m[5]]) != 0 {
                        out.errors += 1;
                    }
                }
            }
            let now = Instant::now();
            let before = pending.len();
            pending.retain(|_, t| now.duration_since(*t) < LOST_AFTER);
            out.lost += (before - pending.len()) as u64;
        }
        out.elapsed = last_answer.duration_since(start);
        out.rtt_us.sort_unstable();
        Ok(out)
    }
}

fn path_get(tid: u32, slid: u16, dlid: u16) -> [u8; MAD_LEN] {
    let mut b = [0u8; MAD_LEN];
    let mask = PathRecordMask::SLID.0
        | PathRecordMask::DLID.0
        | PathRecordMask::REVERSIBLE.0
        | PathRecordMask::NUM_PATH.0;
    SaRepr::path_record_get(u64::from(tid), mask).emit(&mut SaPacket::new_unchecked(&mut b[..]));
    b[56 + 40..56 + 42].copy_from_slice(&dlid.to_be_bytes());
    b[56 + 42..56 + 44].copy_from_slice(&slid.to_be_bytes());
    b[56 + 49] = 0x81;
    b
}

fn cpi_get(tid: u32) -> [u8; MAD_LEN] {
    let mut b = [0u8; MAD_LEN];
    SaRepr::request(Method::Get, attr::CLASS_PORT_INFO, u64::from(tid), 0)
        .emit(&mut SaPacket::new_unchecked(&mut b[..]));
    b
}

fn half_world(tid: u32, sgid: &[u8; 16]) -> [u8; MAD_LEN] {
    let mut b = [0u8; MAD_LEN];
    SaRepr::request(
        Method::GetTable,
        attr::PATH_RECORD,
        u64::from(tid),
        PathRecordMask::SGID.0,
    )
    .emit(&mut SaPacket::new_unchecked(&mut b[..]));
    b[56 + 24..56 + 40].copy_from_slice(sgid);
    b
}

fn kv<'a>(args: &'a [String], k: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
}

fn kv_num<T: std::str::FromStr>(args: &[String], k: &str, d: T) -> T {
    kv(args, k).and_then(|v| v.parse().ok()).unwrap_or(d)
}

/// Every LID's GID (from Gets SLID = own, DLID = each), retried until the SM has routed all.
fn learn_gids(c: &mut Client, max_lid: u16) -> Result<HashMap<u16, [u8; 16]>, String> {
    let mut gids = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while gids.len() < usize::from(max_lid) {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {max_lid} LIDs answered a PathRecord Get",
                gids.len()
            ));
        }
        let want: Vec<u16> = (1..=max_lid).filter(|l| !gids.contains_key(l)).collect();
        let mut tids = HashMap::new();
        for &l in &want {
            let tid = c.next_tid();
            c.send(&path_get(tid, c.lid, l))?;
            tids.insert(tid, l);
        }
        let t = Instant::now();
        while !tids.is_empty() && t.elapsed() < Duration::from_secs(2) {
            if let Some((tid, m)) = c.recv(50) {
                if let Some(l) = tids.remove(&tid) {
                    if u16::from_be_bytes([m[4], m[5]]) == 0 {
                        let mut g = [0u8; 16];
                        g.copy_from_slice(&m[56 + 8..56 + 24]);
                        gids.insert(l, g);
                    }
                }
            }
        }
        if gids.len() < usize::from(max_lid) {
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    Ok(gids)
}

fn child(args: &[String]) -> Result<(), String> {
    let mode = args.first().map(String::as_str).unwrap_or("");
    let max_lid: u16 = kv_num(args, "max_lid", 0);
    let secs: u64 = kv_num(args, "secs", 2);
    // A child blocked in a send to a stuck ibsim must not hang the bench: SIGALRM ends it.
    // SAFETY: alarm has no memory preconditions.
    unsafe {
        libc::alarm(if mode == "load" {
            secs as u32 + 30
        } else {
            900
        })
    };
    let mut c = Client::open()?;
    let mut rng = acm_core_nostd::rng::Rng(u64::from(c.lid));
    let gids = learn_gids(&mut c, max_lid)?;
    let lids: Vec<u16> = (1..=max_lid).filter(|&l| l != c.lid).collect();
    let me = c.lid;
    if mode == "table" {
        for l in [me, lids[0], lids[lids.len() - 1]] {
            // Whole tables (acknowledged), so the sender in OpenSM finishes each one.
            let _ = c.fetch_table(&gids[&l], TABLE_STORAGE, Config::DEFAULT.window);
        }
        println!("table sent=3");
        return Ok(());
    }
    if mode == "load" {
        let conc: usize = kv_num(args, "conc", 1024);
        let mut mk = |tid: u32| path_get(tid, me, lids[rng.below(lids.len() as u64) as usize]);
        let r = c.closed_loop(conc, Duration::from_secs(secs), None, &mut mk)?;
        println!(
            "load lid={me} conc={conc} sent={} answered={} lost={} errors={} secs={:.3}",
            r.sent,
            r.answered,
            r.lost,
            r.errors,
            r.elapsed.as_secs_f64()
        );
        return Ok(());
    }
    let osm: i32 = kv_num(args, "osm", 0);
    let ibsim: i32 = kv_num(args, "ibsim", 0);
    let probes: usize = kv_num(args, "probes", 1000);
    let concs: Vec<usize> = kv(args, "conc")
        .unwrap_or("1")
        .split(',')
        .filter_map(|x| x.parse().ok())
        .collect();
    println!("client lid={me} lids={max_lid} gids={}", gids.len());
    // 1. One at a time: the transport's floor against a real PathRecord.
    let real_dst = lids[lids.len() / 2];
    type Make<'a> = Box<dyn FnMut(u32) -> [u8; MAD_LEN] + 'a>;
    let probes_list: Vec<(&str, Make)> = vec![
        ("class_port_info", Box::new(cpi_get)),
        (
            "path_get_no_such_lid",
            Box::new(move |t| path_get(t, me, NO_SUCH_LID)),
        ),
        ("path_get", Box::new(move |t| path_get(t, me, real_dst))),
    ];
    for (what, mut mk) in probes_list {
        let r = c.closed_loop(1, Duration::from_secs(600), Some(probes), &mut *mk)?;
        println!(
            "probe what={what} n={} p50_us={} p99_us={} mean_us={} errors={} lost={}",
            r.answered,
            r.pct(0.5),
            r.pct(0.99),
            r.mean(),
            r.errors,
            r.lost
        );
    }
    // 2. Closed loops at each concurrency: PathRecord Gets, then ClassPortInfo.
    for (tag, cpi) in [("gets", false), ("cpi", true)] {
        for &conc in &concs {
            let (o0, i0) = (cpu_ticks(osm), cpu_ticks(ibsim));
            let mut mk = |tid: u32| {
                if cpi {
                    cpi_get(tid)
                } else {
                    path_get(tid, me, lids[rng.below(lids.len() as u64) as usize])
                }
            };
            let r = c.closed_loop(conc, Duration::from_secs(secs), None, &mut mk)?;
            let (o1, i1) = (cpu_ticks(osm), cpu_ticks(ibsim));
            let per = |a: Option<u64>, b: Option<u64>| match (a, b) {
                (Some(a), Some(b)) if r.answered > 0 => (b - a) * 10_000 / r.answered,
                _ => 0,
            };
            println!(
                "{tag} conc={conc} per_s={:.0} p50_us={} p99_us={} answered={} lost={} errors={} osm_cpu_us={} ibsim_cpu_us={}",
                r.answered as f64 / r.elapsed.as_secs_f64().max(1e-9),
                r.pct(0.5),
                r.pct(0.99),
                r.answered,
                r.lost,
                r.errors,
                per(o0, o1),
                per(i0, i1)
            );
        }
    }
    // 3. Half-world GetTables: one per port (every LID's GID), one at a time, each one whole
    //    (the receiver acknowledges every window; the time runs to the last segment).
    let mut sources: Vec<u16> = gids.keys().copied().collect();
    sources.sort_unstable();
    let sweeps: usize = kv_num(args, "sweeps", 1);
    let o0 = cpu_ticks(osm);
    let mut done: Vec<Table> = Vec::new();
    let mut lost = 0u64;
    let mut failed = 0u64;
    for &l in sources.iter().cycle().take(sources.len() * sweeps) {
        match c.fetch_table(&gids[&l], TABLE_STORAGE, Config::DEFAULT.window) {
            Ok(t) => done.push(t),
            Err(TableError::Lost) => lost += 1,
            Err(TableError::Failed(_)) => failed += 1,
        }
    }
    let o1 = cpu_ticks(osm);
    // The same sweep again, each table STOPped at its first segment: OpenSM's computation of
    // the answer without its RMPP transfer (the segmenting the preloaded sender does in
    // OpenSM's process here, the kernel on a real SM host).
    let s0 = cpu_ticks(osm);
    let mut stopped = 0u64;
    for &l in sources.iter().cycle().take(sources.len() * sweeps) {
        if let Err(TableError::Failed(acm_core_nostd::rmpp::Failure::TooBig { .. })) =
            c.fetch_table(&gids[&l], 0, Config::DEFAULT.window)
        {
            stopped += 1;
        }
    }
    let s1 = cpu_ticks(osm);
    // And again whole, with an ACK per segment (window 1): the same segments, more ACKs, so
    // the two whole sweeps tell OpenSM's time per segment sent from its time per ACK received.
    let w0 = cpu_ticks(osm);
    let mut w1 = Vec::new();
    for &l in sources.iter().cycle().take(sources.len() * sweeps) {
        if let Ok(t) = c.fetch_table(&gids[&l], TABLE_STORAGE, 1) {
            w1.push(t);
        }
    }
    let w1_end = cpu_ticks(osm);
    // One more, from this port, to look at its first segment.
    let mine = c
        .fetch_table(&c.gid.clone(), TABLE_STORAGE, Config::DEFAULT.window)
        .map_err(|e| format!("{e:?}"))?;
    let m = mine.head;
    let attr_off = usize::from(u16::from_be_bytes([m[44], m[45]])) * 8;
    let in_mad = 200usize.checked_div(attr_off).unwrap_or(0);
    let mut us: Vec<u64> = done.iter().map(|t| t.us).collect();
    us.sort_unstable();
    let pct = |q: f64| {
        if us.is_empty() {
            return 0;
        }
        let i = ((q * us.len() as f64).ceil() as usize).clamp(1, us.len());
        us[i - 1]
    };
    let total_s = us.iter().sum::<u64>() as f64 / 1e6;
    let records: u64 = done.iter().map(|t| t.records).sum();
    let n = done.len() as u64;
    let recs_max = done.iter().map(|t| t.records).max().unwrap_or(0);
    let recs_min = done.iter().map(|t| t.records).min().unwrap_or(0);
    let segs = done
        .iter()
        .map(|t| u64::from(t.segments))
        .max()
        .unwrap_or(0);
    // ACKs per table, in hundredths (a window of 16 ACKs 89 segments 7 or 8 times).
    let acks = done.iter().map(|t| u64::from(t.acks)).sum::<u64>() * 100 / n.max(1);
    let n1 = w1.len() as u64;
    let acks_w1 = w1.iter().map(|t| u64::from(t.acks)).sum::<u64>() * 100 / n1.max(1);
    let per_table = |a: Option<u64>, b: Option<u64>, k: u64| match (a, b) {
        (Some(a), Some(b)) if k > 0 => (b - a) * 10_000 / k,
        _ => 0,
    };
    println!(
        "gettable tables={n} records_per_table={recs_max} records_min={recs_min} records_total={records} segments_per_table={segs} acks_per_table={}.{:02} p50_us={} p99_us={} mean_us={} total_s={total_s:.3} records_per_s={:.0} first_mad_records={in_mad} rmpp_type={} rmpp_flags={} paylen={} status={} method={:#x} lost={lost} failed={failed} osm_cpu_us_per_table={} stopped={stopped} osm_cpu_us_per_table_stopped={} tables_w1={n1} acks_per_table_w1={}.{:02} osm_cpu_us_per_table_w1={}",
        acks / 100,
        acks % 100,
        pct(0.5),
        pct(0.99),
        us.iter().sum::<u64>() / n.max(1),
        records as f64 / total_s.max(1e-9),
        m[25],
        m[26] & 0x7,
        u32::from_be_bytes([m[32], m[33], m[34], m[35]]),
        u16::from_be_bytes([m[4], m[5]]),
        m[3],
        per_table(o0, o1, n),
        per_table(s0, s1, stopped),
        acks_w1 / 100,
        acks_w1 % 100,
        per_table(w0, w1_end, n1),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_lines_are_counted_with_their_queue_and_wait() {
        let log = "Dec 02 09:41:38 761580 [E35E36C0] 0x02 -> sa_mad_ctrl_process: Dropping MAD \
                   since the dispatcher is already overloaded with 120 messages and queue time \
                   of:3[msec]\n\
                   Dec 02 09:41:38 761590 [E35E36C0] 0x02 -> something else\n\
                   Dec 02 09:41:39 000001 [E35E36C0] 0x02 -> sa_mad_ctrl_process: Dropping MAD \
                   since the dispatcher is already overloaded with 7 messages and queue time \
                   of:12[msec]\n";
        assert_eq!(drop_lines(log), (2, 120, 3, 12));
        assert_eq!(drop_lines("nothing\n"), (0, 0, 0, 0));
    }

    #[test]
    fn child_lines_parse_by_tag() {
        let out = "client lid=6\ngets conc=1 per_s=17772 osm_cpu_us=24\ngets conc=4 per_s=9\n";
        let r = records(out, "gets");
        assert_eq!(r.len(), 2);
        assert_eq!(field::<u64>(&r[0], "osm_cpu_us"), 24);
        assert_eq!(field::<u64>(&r[1], "missing"), 0);
        let m = Meta {
            load: "1 → 1",
            logged_records: 276,
            drops_main: (0, 0, 0, 0),
            topo: "fattree:16,4,16",
            max_lid: 276,
            fifo_ms: 1,
        };
        let t = report(
            "gets conc=64 osm_cpu_us=8\ngets conc=256 osm_cpu_us=6\ngets conc=1 osm_cpu_us=24\n\
             gettable tables=3 segments_per_table=89 acks_per_table=7.00 osm_cpu_us_per_table=130 \
             stopped=3 osm_cpu_us_per_table_stopped=72 tables_w1=3 acks_per_table_w1=89.00 \
             osm_cpu_us_per_table_w1=212\n",
            &m,
            None,
        );
        // The least CPU per Get over C >= 64, and (72 - 24) µs over 275 further records: the
        // tables stopped at their first segment (OpenSM's computation), not the whole ones.
        assert!(t.contains("get_service_us = 6\n"), "{t}");
        assert!(t.contains("table_record_ns = 174\n"), "{t}");
        assert!(t.contains("busy = false"));
        // Whole (window 16): 58 µs = 88 segments + 6 ACKs; window 1: 140 µs = 88 segments + 88
        // ACKs: 1 µs per ACK, (58 - 6) / 88 µs per segment.
        assert!(t.contains("ack_received_ns = 1000\n"), "{t}");
        assert!(t.contains("segment_sent_ns = 591\n"), "{t}");
        assert!(t.contains("segment_per_get_permille = 98\n"), "{t}");
    }
}
