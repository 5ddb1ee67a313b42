//! `acmrs-storm`: a job start-up storm against one SA, in virtual time, for acmrs's defaults
//! and an ibacmp-like configuration of the same resolver (see `docs/storm.md`).

use std::path::PathBuf;

use acm_core_nostd::sim::SaService;
use acm_report::cli::{counts, num, List, RunOpts};
use acm_report::plot::{COLORS, SIZE};
use acm_report::{progress, write_atomic};
use acmrs_storm::{peak_rss, run, secs, table, Dest, Params, Peers, Profile, Report};
use clap::{Parser, ValueEnum};
use plotters::prelude::*;

/// A job start-up storm against one SA, in virtual time, over the real resolver: N nodes each
/// resolve k peers, acmrs's defaults against an ibacmp-like configuration (docs/storm.md).
///
/// Defaults: N = 1000,10000, k = 1000 ring neighbours by LID, 64 outstanding requests per node,
/// client retry 1000 ms; the SA is OpenSM as measured (tools/storm/opensm-measured.toml):
/// 6 µs per Get (166666/s), drops past max_msg_fifo_timeout 10000 ms, no BUSY; the SM's port
/// 1.92 µs per MAD (Gets, answers, RMPP segments, ACKs); 1 ms one-way,
/// no loss, umad timeout 2000 ms × 2 retries (the core's), core sa_depth unlimited, both
/// profiles, seed 1, horizon 3600 s, plot to storm.svg (DIR/storm.svg and DIR/storm.md with
/// --out). --quick: N = 200, k = 50. Numbers may use _ separators (30_000).
#[derive(Parser)]
#[command(name = "acmrs-storm", version)]
struct Cli {
    #[command(flatten)]
    run: RunOpts,
    /// Node counts, one run each [default: 1000,10000; with --quick 200]
    #[arg(long, value_name = "N[,N…]", value_parser = counts)]
    nodes: Option<List<usize>>,
    /// Peers each node resolves [default: 1000; with --quick 50]
    #[arg(long, value_name = "K", value_parser = num::<usize>)]
    peers: Option<usize>,
    /// Peers picked at random (seeded) instead of the ring neighbours
    #[arg(long)]
    random: bool,
    /// Resolve peers by GID instead of LID
    #[arg(long)]
    gid: bool,
    /// Outstanding requests per node
    #[arg(long, value_name = "C", value_parser = num::<usize>)]
    concurrency: Option<usize>,
    /// How fast a half-world table's RMPP transfer reaches its node, records per second
    /// [default: 140000, published for a whole path table on 1 096 nodes]
    #[arg(long, value_name = "R", value_parser = num::<u64>)]
    sa_table_records_per_s: Option<u64>,
    /// Path cache entries per node; a half-world table takes up to half of them [default:
    /// 2N + k while all caches stay within 8 Mi entries, else k]
    #[arg(long, value_name = "E", value_parser = num::<usize>)]
    cache_entries: Option<usize>,
    /// A failed request is issued again after MS
    #[arg(long, value_name = "MS", value_parser = num::<u64>)]
    client_retry_ms: Option<u64>,
    /// The SA's service rate, PathRecord Gets per second (sets --sa-get-ns to 1 s / R)
    #[arg(long, value_name = "R", value_parser = num::<u64>)]
    sa_rate: Option<u64>,
    /// The SA's service time per Get, ns [default: 6000, measured]
    #[arg(long, value_name = "NS", value_parser = num::<u64>, conflicts_with = "sa_rate")]
    sa_get_ns: Option<u64>,
    /// OpenSM's max_msg_fifo_timeout: new Gets are dropped once the message dispatched last
    /// waited longer (0: never) [default: 10000]
    #[arg(long, value_name = "MS", value_parser = num::<u64>)]
    sa_fifo_timeout_ms: Option<u64>,
    /// The SM's port's time per MAD, received or sent (Gets, answers, RMPP segments, ACKs;
    /// 0: free) [default: 1920, docs/storm.md "The SM's port"]
    #[arg(long, value_name = "NS", value_parser = num::<u64>)]
    sm_mad_ns: Option<u64>,
    /// An SA that answers BUSY (OpenSM never does): BUSY once Q queries are held
    #[arg(long, visible_alias = "sa-queue", value_name = "Q", value_parser = num::<usize>)]
    sa_busy: Option<usize>,
    /// One-way latency to the SA
    #[arg(long, value_name = "MS", value_parser = num::<u64>)]
    latency_ms: Option<u64>,
    /// MADs lost, per mille
    #[arg(long, value_name = "PER_MILLE", value_parser = num::<u32>)]
    loss: Option<u32>,
    /// The kernel MAD layer's timeout per try
    #[arg(long, value_name = "MS", value_parser = num::<u64>)]
    umad_timeout_ms: Option<u64>,
    /// The kernel MAD layer's retries
    #[arg(long, value_name = "N", value_parser = num::<u32>)]
    umad_retries: Option<u32>,
    /// The ibacm core's SA credits per port (its sa_depth; at least 1) [default: unlimited]
    #[arg(long, value_name = "D", value_parser = num::<u32>)]
    core_sa_depth: Option<u32>,
    /// Which resolver configurations run
    #[arg(long, value_enum, default_value = "both")]
    profile: ProfileArg,
    /// Seed of the random peers and the SA's losses
    #[arg(long, value_name = "S", value_parser = num::<u64>)]
    seed: Option<u64>,
    /// Virtual time after which a run stops
    #[arg(long, value_name = "S", value_parser = num::<u64>)]
    horizon_s: Option<u64>,
    /// The completion plot [default: storm.svg, DIR/storm.svg with --out]
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,
    /// The result table (Markdown) [default: none, DIR/storm.md with --out]
    #[arg(long, value_name = "PATH")]
    md: Option<PathBuf>,
}

/// `--profile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ProfileArg {
    /// acmrs as shipped
    Acmrs,
    /// the same resolver set up as ibacmp behaves
    Ibacmp,
    /// both, one after the other
    Both,
}

impl ProfileArg {
    fn profiles(self) -> Vec<Profile> {
        match self {
            ProfileArg::Acmrs => vec![Profile::Acmrs],
            ProfileArg::Ibacmp => vec![Profile::IbacmpLike],
            ProfileArg::Both => vec![Profile::Acmrs, Profile::IbacmpLike],
        }
    }
}

fn main() {
    let a: Cli = acm_report::cli::parse(2);
    if let Err(e) = real_main(&a) {
        eprintln!("{e}");
        std::process::exit(2);
    }
}

fn real_main(a: &Cli) -> Result<(), String> {
    let quick = a.run.quick;
    let nodes = match &a.nodes {
        Some(l) => l.0.clone(),
        None if quick => vec![200],
        None => vec![1000, 10_000],
    };
    let peers = a.peers.unwrap_or(if quick { 50 } else { 1000 });
    let d = SaService::DEFAULT;
    let sa = SaService {
        get_ns: a
            .sa_get_ns
            .or(a.sa_rate.map(SaService::get_ns_for_rate))
            .unwrap_or(d.get_ns)
            .max(1),
        table_record_ns: d.table_record_ns,
        table_records_per_s: a
            .sa_table_records_per_s
            .unwrap_or(d.table_records_per_s)
            .max(1),
        fifo_timeout: a.sa_fifo_timeout_ms.unwrap_or(d.fifo_timeout),
        busy_queue: a.sa_busy.map(|q| q.max(1)).or(d.busy_queue),
        latency: a.latency_ms.unwrap_or(d.latency),
        loss: a.loss.unwrap_or(d.loss),
        umad_timeout: a.umad_timeout_ms.unwrap_or(d.umad_timeout),
        umad_retries: a.umad_retries.unwrap_or(d.umad_retries),
        core_sa_depth: a.core_sa_depth.map(|d| d.max(1)),
        sm_mad_ns: a.sm_mad_ns.unwrap_or(d.sm_mad_ns),
    };
    let profiles = a.profile.profiles();
    // --out DIR (as every bench): the completion curve and the table go there.
    a.run.create_out()?;
    let svg = a
        .svg
        .clone()
        .or_else(|| a.run.out_file("storm.svg"))
        .unwrap_or_else(|| PathBuf::from("storm.svg"));
    let md = a.md.clone().or_else(|| a.run.out_file("storm.md"));
    let mut reports = Vec::new();
    for &n in &nodes {
        for &prof in &profiles {
            let mut p = Params::new(n, peers.min(n.saturating_sub(1)), prof);
            p.pick = if a.random { Peers::Random } else { Peers::Ring };
            p.dest = if a.gid { Dest::Gid } else { Dest::Lid };
            p.concurrency = a.concurrency.unwrap_or(p.concurrency);
            p.cache = a.cache_entries;
            p.client_retry = a.client_retry_ms.unwrap_or(p.client_retry);
            p.seed = a.seed.unwrap_or(p.seed);
            p.horizon = a.horizon_s.unwrap_or(p.horizon / 1000).saturating_mul(1000);
            p.sa = sa;
            progress(format!("storm: N={n} k={} {}", p.peers, prof.name()));
            let r = run(p);
            for v in r.violations.iter().take(5) {
                eprintln!("violation: {v}");
            }
            // Requests still outstanding are a fault only if the run finished: at the horizon
            // they are what a storm that did not complete left (reported below).
            let stuck = if r.all_done.is_some() {
                r.unanswered
            } else {
                0
            };
            if !r.violations.is_empty() || stuck > 0 || r.wrong > 0 {
                return Err(format!(
                    "{}: {} violations, {} unanswered, {} wrong paths",
                    prof.name(),
                    r.violations.len(),
                    r.unanswered,
                    r.wrong
                ));
            }
            reports.push(r);
        }
    }
    let t = table(&reports);
    println!(
        "SA {} ns per Get ({} Gets/s), SM port {} ns per MAD, drops past {} ms in the FIFO, BUSY {}, \
         {} ms one-way, loss {}‰, umad {} ms × {} retries, core sa_depth {}; {} outstanding per node, \
         client retry {} ms, {} peers by {}",
        sa.get_ns,
        sa.rate(),
        sa.sm_mad_ns,
        sa.fifo_timeout,
        sa.busy_queue
            .map_or("never".to_string(), |q| format!("at {q} held")),
        sa.latency,
        sa.loss,
        sa.umad_timeout,
        sa.umad_retries,
        sa.core_sa_depth
            .map_or("unlimited".to_string(), |d| d.to_string()),
        reports.first().map_or(0, |r| r.params.concurrency),
        reports.first().map_or(0, |r| r.params.client_retry),
        if a.random { "random" } else { "ring" },
        if a.gid { "GID" } else { "LID" },
    );
    println!();
    for r in &reports {
        println!(
            "{:<18} N={:<6} all done {:>9} s  p50 {:>9} s  p99 {:>9} s  SA queries {:>9}  tables {:>6}  BUSY {:>8}  \
             dropped {:>8}  umad timeouts {:>7}  failed {:>7}  peak queue {:>6}",
            r.params.profile.name(),
            r.params.nodes,
            secs(r.all_done),
            secs(r.node_quantile(0.5)),
            secs(r.node_quantile(0.99)),
            r.sa_queries,
            r.tables.0,
            r.sa.busy,
            r.sa.dropped,
            r.sa.umad_timeouts,
            r.failed,
            r.sa.peak_queue
        );
    }
    println!();
    print!("{t}");
    for &n in &nodes {
        let pair: Vec<&Report> = reports.iter().filter(|r| r.params.nodes == n).collect();
        if let [x, y] = pair[..] {
            if let (Some(ax), Some(ay)) = (x.all_done, y.all_done) {
                println!(
                    "N={n}: ibacmp-like / acmrs completion = {:.2}×, SA queries acmrs / ibacmp-like = {:.3}",
                    ay as f64 / ax.max(1) as f64,
                    x.sa_queries as f64 / y.sa_queries.max(1) as f64
                );
            }
        }
    }
    for r in reports.iter().filter(|r| r.all_done.is_none()) {
        println!(
            "{} N={}: not done within the {} s horizon: {} of {} nodes done, {} pairs resolved, \
             {} requests outstanding, {} failed so far",
            r.params.profile.name(),
            r.params.nodes,
            r.params.horizon / 1000,
            r.node_done.len(),
            r.params.nodes,
            r.pair_done.len(),
            r.unanswered,
            r.failed
        );
    }
    if let Some(rss) = peak_rss() {
        println!("peak RSS {:.1} MiB", rss as f64 / (1 << 20) as f64);
    }
    if let Some(md) = md {
        write_atomic(&md, &t).map_err(|e| format!("{}: {e}", md.display()))?;
        println!("table: {}", md.display());
    }
    plot(&svg, &reports).map_err(|e| format!("{}: {e}", svg.display()))?;
    println!("plot: {}", svg.display());
    Ok(())
}

/// Fraction of (node, peer) pairs resolved against virtual time, one curve per run.
fn plot(path: &std::path::Path, reports: &[Report]) -> Result<(), Box<dyn std::error::Error>> {
    let tmax = reports
        .iter()
        .filter_map(|r| r.pair_done.last().copied())
        .max()
        .unwrap_or(1)
        .max(1) as f64
        / 1000.0;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "start-up storm: (node, peer) paths resolved vs virtual time",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..tmax * 1.02, 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("virtual time (s)")
        .y_desc("fraction of pairs resolved")
        .draw()?;
    for (c, r) in reports.iter().enumerate() {
        let total = (r.params.nodes * r.params.peers) as f64;
        let v = &r.pair_done;
        let step = (v.len() / 2000).max(1);
        let mut pts: Vec<(f64, f64)> = vec![(0.0, 0.0)];
        pts.extend(
            v.iter()
                .enumerate()
                .filter(|(i, _)| i % step == 0 || *i + 1 == v.len())
                .map(|(i, &t)| (t as f64 / 1000.0, (i + 1) as f64 / total)),
        );
        let color = COLORS[c % COLORS.len()];
        let label = format!(
            "{} N={} k={} (all done {} s)",
            r.params.profile.name(),
            r.params.nodes,
            r.params.peers,
            secs(r.all_done)
        );
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}
