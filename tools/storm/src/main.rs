//! `acmrs-storm`: a job start-up storm against one SA, in virtual time, for acmrs's defaults
//! and an ibacmp-like configuration of the same resolver (see `docs/storm.md`).

use std::path::PathBuf;

use acm_core_nostd::resolver::sim::SaService;
use acmrs_storm::{peak_rss, run, secs, table, Dest, Params, Peers, Profile, Report};
use plotters::prelude::*;

const USAGE: &str = "acmrs-storm [--quick] [--nodes N[,N…]] [--peers K] [--random] [--gid]
    [--concurrency C] [--client-retry-ms MS] [--sa-rate R] [--sa-queue Q] [--latency-ms MS]
    [--loss PER_MILLE] [--umad-timeout-ms MS] [--umad-retries N] [--core-sa-depth D]
    [--profile acmrs|ibacmp|both] [--seed S] [--horizon-s S] [--out DIR] [--svg PATH] [--md PATH]

Defaults: N = 1000,10000, K = 1000 ring neighbours by LID, C = 64 outstanding requests per
node, client retry 1000 ms, SA 30000 PathRecords/s with a 10000-query queue, 1 ms one-way,
no loss, umad timeout 2000 ms × 2 retries (the core's), core sa_depth unlimited, both
profiles, seed 1, horizon 3600 s, plot to storm.svg (DIR/storm.svg and DIR/storm.md with --out). --quick: N = 200, K = 50.";

fn num<T: std::str::FromStr>(a: &acm_bench::Args, f: &str, d: T) -> Result<T, String> {
    match a.value(f) {
        Some(v) => v
            .replace('_', "")
            .parse()
            .map_err(|_| format!("{f}: bad value {v}\n{USAGE}")),
        None => Ok(d),
    }
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("{e}");
        std::process::exit(2);
    }
}

fn real_main() -> Result<(), String> {
    let flags = [
        "--nodes",
        "--peers",
        "--concurrency",
        "--client-retry-ms",
        "--sa-rate",
        "--sa-queue",
        "--latency-ms",
        "--loss",
        "--umad-timeout-ms",
        "--umad-retries",
        "--core-sa-depth",
        "--profile",
        "--seed",
        "--horizon-s",
        "--svg",
        "--md",
        "--random",
        "--gid",
    ];
    // --random and --gid take no value: rewrite them to "--x=1" before parsing.
    let argv: Vec<String> = std::env::args()
        .skip(1)
        .map(|a| match a.as_str() {
            "--random" | "--gid" => format!("{a}=1"),
            _ => a,
        })
        .collect();
    let a = acm_bench::Args::parse_from(argv, USAGE, &flags)?;
    let nodes = match a.value("--nodes") {
        Some(s) => acm_bench::parse_counts(s)?,
        None if a.quick => vec![200],
        None => vec![1000, 10_000],
    };
    let peers = num(&a, "--peers", if a.quick { 50 } else { 1000 })?;
    let mut sa = SaService::DEFAULT;
    sa.rate = num(&a, "--sa-rate", sa.rate)?;
    sa.queue_cap = num(&a, "--sa-queue", sa.queue_cap)?;
    sa.latency = num(&a, "--latency-ms", sa.latency)?;
    sa.loss = num(&a, "--loss", sa.loss)?;
    sa.umad_timeout = num(&a, "--umad-timeout-ms", sa.umad_timeout)?;
    sa.umad_retries = num(&a, "--umad-retries", sa.umad_retries)?;
    sa.core_sa_depth = match a.value("--core-sa-depth") {
        Some(_) => Some(num(&a, "--core-sa-depth", 1u32)?.max(1)),
        None => None,
    };
    let profiles = match a.value("--profile").unwrap_or("both") {
        "acmrs" => vec![Profile::Acmrs],
        "ibacmp" => vec![Profile::IbacmpLike],
        "both" => vec![Profile::Acmrs, Profile::IbacmpLike],
        p => return Err(format!("--profile: {p}?\n{USAGE}")),
    };
    // --out DIR (as every bench): the completion curve and the table go there.
    a.create_out()?;
    let in_out = |name: &str| a.out.as_ref().map(|d| d.join(name));
    let svg = match a.value("--svg") {
        Some(p) => PathBuf::from(p),
        None => in_out("storm.svg").unwrap_or_else(|| PathBuf::from("storm.svg")),
    };
    let md = a
        .value("--md")
        .map(PathBuf::from)
        .or_else(|| in_out("storm.md"));
    let mut reports = Vec::new();
    for &n in &nodes {
        for &prof in &profiles {
            let mut p = Params::new(n, peers.min(n.saturating_sub(1)), prof);
            p.pick = if a.value("--random").is_some() {
                Peers::Random
            } else {
                Peers::Ring
            };
            p.dest = if a.value("--gid").is_some() {
                Dest::Gid
            } else {
                Dest::Lid
            };
            p.concurrency = num(&a, "--concurrency", p.concurrency)?;
            p.client_retry = num(&a, "--client-retry-ms", p.client_retry)?;
            p.seed = num(&a, "--seed", p.seed)?;
            p.horizon = num(&a, "--horizon-s", p.horizon / 1000)?.saturating_mul(1000);
            p.sa = sa;
            acm_bench::progress(format!("storm: N={n} k={} {}", p.peers, prof.name()));
            let r = run(p);
            for v in r.violations.iter().take(5) {
                eprintln!("violation: {v}");
            }
            if !r.violations.is_empty() || r.unanswered > 0 || r.wrong > 0 {
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
        "SA {} PathRecords/s, queue {}, {} ms one-way, loss {}‰, umad {} ms × {} retries, core sa_depth {}; \
         {} outstanding per node, client retry {} ms, {} peers by {}",
        sa.rate,
        sa.queue_cap,
        sa.latency,
        sa.loss,
        sa.umad_timeout,
        sa.umad_retries,
        sa.core_sa_depth
            .map_or("unlimited".to_string(), |d| d.to_string()),
        reports.first().map_or(0, |r| r.params.concurrency),
        reports.first().map_or(0, |r| r.params.client_retry),
        if a.value("--random").is_some() {
            "random"
        } else {
            "ring"
        },
        if a.value("--gid").is_some() {
            "GID"
        } else {
            "LID"
        },
    );
    println!();
    for r in &reports {
        println!(
            "{:<18} N={:<6} all done {:>9} s  p50 {:>9} s  p99 {:>9} s  SA queries {:>9}  BUSY {:>8}  \
             umad timeouts {:>7}  failed {:>7}  peak queue {:>6}",
            r.params.profile.name(),
            r.params.nodes,
            secs(r.all_done),
            secs(r.node_quantile(0.5)),
            secs(r.node_quantile(0.99)),
            r.sa_queries,
            r.sa.busy,
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
    if let Some(rss) = peak_rss() {
        println!("peak RSS {:.1} MiB", rss as f64 / (1 << 20) as f64);
    }
    if let Some(md) = md {
        std::fs::write(&md, &t).map_err(|e| format!("{}: {e}", md.display()))?;
        println!("table: {}", md.display());
    }
    plot(&svg, &reports).map_err(|e| format!("{}: {e}", svg.display()))?;
    println!("plot: {}", svg.display());
    Ok(())
}

/// Fraction of (node, peer) pairs resolved against virtual time, one curve per run.
fn plot(path: &std::path::Path, reports: &[Report]) -> Result<(), Box<dyn std::error::Error>> {
    let colors = acm_bench::plot::COLORS;
    let tmax = reports
        .iter()
        .filter_map(|r| r.pair_done.last().copied())
        .max()
        .unwrap_or(1)
        .max(1) as f64
        / 1000.0;
    let root = SVGBackend::new(path, acm_bench::plot::SIZE).into_drawing_area();
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
        let color = colors[c % colors.len()];
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
