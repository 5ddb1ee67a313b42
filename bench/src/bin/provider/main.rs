//! Provider `resolve()` latency: cache hits and misses, acmrs vs the stock libibacmp.
//!
//! Two parts:
//!
//! * **In-process** (`libacmrs.so` loaded by this program, which plays the ibacm core and an
//!   instant SA): `resolve()` latency on hits and misses with 1k / 100k / 1M cached paths.
//!   That part is the binary `provider-fake-core` (the fake core of `acm_testkit`, exported
//!   from that executable), which `--fake-core` and sizes above the stock maximum run.
//!   The stock `libibacmp.so` cannot be driven this way: its `open_device` opens its own verbs
//!   device (ibv_open_device, PD, CQ thread), `open_endpoint` creates a UD QP and joins the
//!   ACM multicast group through the SA, and `resolve()` answers ENODATA until that join
//!   completes — it needs a fabric.
//! * **Through the real ibacm daemon** (`--daemon`): the same daemon binary on the simulated
//!   fabric (acm_fabric), once with libibacmp and once with libacmrs; a TCP client sends PATH
//!   requests (as `ib_acme -f l`) and measures the round trip of cache hits. The ratio of the
//!   two is the provider difference seen by a client (core overhead included in both).
//!
//! `cargo run --release -p acm-bench --bin provider -- [--quick] [--daemon] [--out DIR]`
//! (build `-p acm-plugin` and, for `--daemon`, `-p simverbs` with the same profile first).
//!
//! `--out DIR` (created up front) gets one `.hgrm` per histogram and a percentile plot
//! (`.svg`, acmrs against stock in one picture; acmrs alone for the fake core) per
//! measurement and size. Each phase prints one progress line on stderr.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use acm_bench::{PollMode, SizeOpts};
use acm_report::cli::{num, RunOpts};
use acm_report::plot::{write_percentile_svg, Series};
use acm_report::{progress, LatencyHistogram, Table};
use acm_testkit::request::PathRequest;
use clap::{Parser, Subcommand};
use std::time::{Duration, Instant};

mod misses;
mod samehost;

/// Provider resolve() latency on cache hits and misses, acmrs against the stock libibacmp.
/// Default: both providers in one process on one simulated fabric (same host, same run; sizes
/// above what the stock provider can hold run acmrs alone, as --fake-core). --fake-core: acmrs
/// alone in-process (fake ibacm core, instant SA, up to 1M paths). --daemon: cache-hit round
/// trips through the real ibacm daemon. See docs/bench.md.
#[derive(Parser)]
#[command(name = "provider", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(flatten)]
    run: RunOpts,
    #[command(flatten)]
    sizes: SizeOpts,
    #[command(flatten)]
    poll: PollMode,
    /// acmrs alone, in-process (the provider-fake-core binary next to this one)
    #[arg(long)]
    fake_core: bool,
    /// Cache-hit round trips over TCP through the real ibacm daemon, stock then acmrs
    #[arg(long)]
    daemon: bool,
    /// Same-host mode: timed hits per provider and size [default: 200000; with --quick 20000]
    #[arg(long, value_name = "N", value_parser = num::<usize>)]
    hit_samples: Option<usize>,
    /// Same-host mode: the simulated fabric [default: fattree:16,4,16; with --quick
    /// fattree:4,2,8]
    #[arg(long, value_name = "fattree:L,S,H")]
    topology: Option<String>,
    /// Same-host mode: isolated misses per provider and form (LID, GID, name) in the
    /// --poll-mode run [default: 3000; with --quick 1000; 0: none]
    #[arg(long, value_name = "N", value_parser = num::<usize>)]
    misses: Option<usize>,
    /// Same-host mode: isolated misses per provider and form in the runs of the other two
    /// poll modes (their CPU figures) [default: 1000; with --quick 200; 0: not run]
    #[arg(long, value_name = "N", value_parser = num::<usize>)]
    mode_misses: Option<usize>,
    /// Same-host mode: idle time measured after the misses, ms [default: 3000; with --quick
    /// 1000]
    #[arg(long, value_name = "MS", value_parser = num::<u64>)]
    idle_ms: Option<u64>,
    /// Same-host mode: skip the hit children (cache sizes); misses only
    #[arg(long)]
    misses_only: bool,
    /// Same-host mode: how acmrs reaches the SA in the miss runs: `core` (the host core's
    /// umad SA service, stock's path), `ud` (acmrs's own UD QP, its default), or `both` (one
    /// miss child per poll mode and transport)
    #[arg(long, value_name = "core|ud|both", default_value = "both",
          value_parser = ["core", "ud", "both"])]
    miss_sa: String,
    /// Same-host mode: the CPU that acmrs's busy-mode worker gets to itself in the busy
    /// miss run (`acmrs_cpu`; every other thread of the bench and of the fabric is kept off
    /// it) [default: the last CPU, on a machine with 2 or more]
    #[arg(long, value_name = "CPU", value_parser = num::<usize>)]
    busy_cpu: Option<usize>,
    /// Same-host mode: run busy mode unpinned, sharing the CPUs as the other modes do
    #[arg(long, conflicts_with = "busy_cpu")]
    busy_unpinned: bool,
    /// Same-host mode: how long an idle virtual CPU polls before it halts, for this run
    /// (the cpuidle-haltpoll driver's guest_halt_poll_ns, a KVM guest's; put back afterwards)
    #[arg(long, value_name = "NS", value_parser = num::<u64>)]
    halt_poll_ns: Option<u64>,
    /// Run in the host's network namespace (default: a private one with a larger Unix datagram
    /// queue, see docs/bench.md)
    #[arg(long)]
    host_net: bool,
    /// --daemon: hits per provider
    #[arg(long, value_name = "N", default_value = "20000", value_parser = num::<usize>)]
    daemon_samples: usize,
    #[command(subcommand)]
    child: Option<Child>,
}

#[derive(Subcommand)]
enum Child {
    /// The same-host mode's measuring child (started by this program under the simulated verbs)
    #[command(hide = true)]
    SamehostChild(samehost::ChildArgs),
    /// The same-host mode's isolated-miss child (started by this program)
    #[command(hide = true)]
    SamehostMissChild(misses::MissArgs),
}

// ---- through the real daemon ---------------------------------------------------------------

fn daemon_rtt(provider: acm_fabric::Provider, samples: usize) -> Result<LatencyHistogram, String> {
    use acm_fabric::{Fabric, Topology};
    use std::io::{Read, Write};
    let fabric = Fabric::builder(
        Topology::example("net.2sw2path4hca").map_err(|e| e.to_string())?,
        ["Hca3", "Hca4"],
    )
    .provider(provider)
    .name_prefix("bench-provider")
    .option("log_level", "0")
    .start()
    .map_err(|e| e.to_string())?;
    let (n3, n4) = (
        fabric.node("Hca3").map_err(|e| e.to_string())?,
        fabric.node("Hca4").map_err(|e| e.to_string())?,
    );
    let (s, d) = (n3.lid.to_string(), n4.lid.to_string());
    let warm = n3
        .acme_until(
            &["-f", "l", "-s", &s, "-d", &d],
            Duration::from_secs(30),
            |o| o.success(),
        )
        .map_err(|e| e.to_string())?;
    if !warm.success() {
        return Err(format!("warm-up failed: {warm}"));
    }
    let mut sock =
        std::net::TcpStream::connect(("127.0.0.1", n3.server_port)).map_err(|e| e.to_string())?;
    sock.set_nodelay(true).ok();
    let mut h = LatencyHistogram::new();
    let mut buf = [0u8; 592];
    for i in 0..samples {
        // As `ib_acme -f l -s <n3> -d <n4>` sends it.
        let m = PathRequest {
            slid: n3.lid,
            ..PathRequest::new(i as u64, n4.lid, None)
        }
        .msg();
        let t0 = Instant::now();
        sock.write_all(&m.as_bytes()[..88])
            .map_err(|e| e.to_string())?;
        let mut got = 0;
        let mut want = 16;
        while got < want {
            let n = sock.read(&mut buf[got..]).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("daemon closed the connection".into());
            }
            got += n;
            if got >= 8 {
                want = u16::from_ne_bytes([buf[6], buf[7]]) as usize;
            }
        }
        h.record(t0.elapsed());
        if buf[2] != 0 {
            return Err(format!("status {} on request {i}", buf[2]));
        }
    }
    Ok(h)
}

fn main() {
    let args: Cli = acm_report::cli::parse(2);
    if let Some(child) = &args.child {
        let r = match child {
            Child::SamehostChild(c) => samehost::child(c),
            Child::SamehostMissChild(c) => misses::child(c),
        };
        let code = match r {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("provider (measuring child): {e}");
                1
            }
        };
        // The providers' threads are never joined (the core never unloads a provider), so
        // the child leaves without running the exit handlers (under umad2sim, which the child
        // no longer loads, one of them could hang). The parent tears the fabric down and
        // frees the ibsim client slots the child leaves behind (`Fabric::reap_dead_clients`).
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: _exit ends the process at once; nothing of it runs afterwards.
        unsafe { libc::_exit(code) };
    }
    // Its own network namespace (the children inherit it); stopped by a signal, it takes its
    // fabrics and measuring children down with it.
    acm_bench::enter_fabric_bench("provider", args.host_net);
    let (daemon, fake_core) = (args.daemon, args.fake_core);
    args.run.create_out_or_exit();
    let sizes = args.sizes.get(args.run.quick);
    if !fake_core && !daemon {
        // Sizes beyond what the stock provider can preload get the acmrs-only fake-core run.
        let (same, alone): (Vec<usize>, Vec<usize>) = sizes
            .iter()
            .partition(|&&n| n <= samehost::STOCK_MAX_ENTRIES * 11 / 10);
        let cfg = samehost::Config {
            sizes: same,
            hit_samples: args
                .hit_samples
                .unwrap_or(if args.run.quick { 20_000 } else { 200_000 }),
            topology: args.topology.clone().unwrap_or_else(|| {
                if args.run.quick {
                    "fattree:4,2,8"
                } else {
                    "fattree:16,4,16"
                }
                .to_string()
            }),
            out: args.run.out.clone(),
            poll_mode: args.poll.poll_mode.clone(),
            misses: args
                .misses
                .unwrap_or(if args.run.quick { 1000 } else { 3000 }),
            mode_misses: args
                .mode_misses
                .unwrap_or(if args.run.quick { 200 } else { 1000 }),
            idle_ms: args
                .idle_ms
                .unwrap_or(if args.run.quick { 1000 } else { 3000 }),
            misses_only: args.misses_only,
            halt_poll_ns: args.halt_poll_ns,
            miss_sa: match args.miss_sa.as_str() {
                "both" => vec!["core".into(), "ud".into()],
                t => vec![t.to_string()],
            },
            busy_cpu: match (args.busy_unpinned, args.busy_cpu) {
                (true, _) => None,
                (false, Some(c)) => Some(c),
                (false, None) => {
                    let n = acm_bench::online_cpus();
                    (n >= 2).then_some(n - 1)
                }
            },
        };
        if let Err(e) = samehost::run(&cfg) {
            eprintln!("provider: {e}");
            acm_fabric::process::exit(1);
        }
        if !alone.is_empty() && !args.misses_only {
            println!(
                "## {alone:?} cached paths: stock n/a\n\n\
                 libibacmp's route preload keeps one LID and one GID entry per unicast DLID \
                 below 0xC000 (at most {} entries here), and a real fabric cannot give 1M \
                 distinct paths to one port (16-bit LIDs), so only acmrs is measured at this \
                 size, in-process with the fake core and an instant SA:\n",
                samehost::STOCK_MAX_ENTRIES
            );
            fake_core_run(&args, &alone);
        }
        return;
    }
    if fake_core {
        fake_core_run(&args, &sizes);
    }
    if daemon {
        let n = args.daemon_samples;
        let mut t = Table::new(&[
            "provider",
            "count",
            "p50 ns",
            "p99 ns",
            "p99.9 ns",
            "p99.99 ns",
            "max ns",
        ]);
        let mut p50 = Vec::new();
        let mut measured = Vec::new();
        for p in [acm_fabric::Provider::Stock, acm_fabric::Provider::Acmrs] {
            let name = p.name().to_string();
            progress(format_args!(
                "daemon mode: {name}: fabric + real ibacm, {n} hits over TCP"
            ));
            match daemon_rtt(p, n) {
                Ok(h) => {
                    let s = h.summary();
                    p50.push((s.p50_ns, s.p99_ns));
                    let mut row = vec![name.clone(), s.count.to_string()];
                    row.extend(Table::latency_cells(&s));
                    t.row(row);
                    if let Some(out) = &args.run.out {
                        h.write_hgrm(&out.join(format!("provider-daemon-{name}-hit.hgrm")))
                            .unwrap();
                    }
                    measured.push((name, h));
                }
                Err(e) => eprintln!("{name}: {e}"),
            }
        }
        if let Some(out) = &args.run.out {
            // acmrs first (blue), stock second (red), as in every plot of the benches.
            let series: Vec<Series<'_>> = measured
                .iter()
                .rev()
                .map(|(name, h)| Series {
                    label: if name == "ibacmp" {
                        "stock libibacmp"
                    } else {
                        name
                    },
                    histogram: h,
                })
                .collect();
            let f = out.join("provider-daemon-hit.svg");
            if let Err(e) = write_percentile_svg(
                &f,
                "real ibacm daemon, cache-hit round trip over TCP",
                &series,
            ) {
                eprintln!("warning: cannot write {}: {e}", f.display());
            }
        }
        println!(
            "\n## real ibacm daemon, cache-hit round trip over TCP (ib_acme -f l equivalent)\n\n{}",
            t.render()
        );
        if let [(a50, a99), (b50, b99)] = p50[..] {
            println!(
                "ratio stock/acmrs: p50 {:.2}x, p99 {:.2}x",
                a50 / b50,
                a99 / b99
            );
        }
    }
}

/// The in-process mode (acmrs alone, fake core, instant SA, up to 1M paths) is its own
/// binary, `provider-fake-core`, next to this one: it must export the fake core's helpers,
/// which this binary's measuring child must not (see build.rs).
fn fake_core_run(args: &Cli, sizes: &[usize]) {
    let bin = acm_bench::sibling(
        "provider-fake-core",
        "cargo build --release -p acm-bench (builds every bench binary)",
    )
    .unwrap_or_else(|e| {
        eprintln!("{e}");
        acm_fabric::process::exit(1)
    });
    let mut cmd = std::process::Command::new(&bin);
    let list: Vec<String> = sizes.iter().map(usize::to_string).collect();
    cmd.args(["--sizes", &list.join(",")]);
    if args.run.quick {
        cmd.arg("--quick");
    }
    cmd.args(["--poll-mode", &args.poll.poll_mode]);
    if let Some(out) = &args.run.out {
        cmd.arg("--out").arg(out);
    }
    // The child's progress lines continue this process's clock.
    let (k, v) = acm_report::progress_env();
    cmd.env(k, v);
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!("provider-fake-core failed: {s}");
            acm_fabric::process::exit(1);
        }
        Err(e) => {
            eprintln!("{}: {e}", bin.display());
            acm_fabric::process::exit(1);
        }
    }
}
