//! `acmrs-stat`: the live per-endpoint counters and latency percentiles of a running ibacm
//! daemon with the acmrs provider, read from its stats socket (`acmrs_stat_socket`, default
//! `/run/acmrs.sock`; see docs/stats.md), and optionally `.hgrm` files of its histograms.
//!
//! Exit codes: 0 = shown, 1 = bad command line or a file could not be written, 2 = no acmrs
//! provider serving at the socket (or something else answering there).

use acm_dataplane::export::{self, decode, Report, COUNTERS, HISTS};
use acm_dataplane::stats::Snapshot;
use acm_report::{fmt_ns, LatencyHistogram, Table};
use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The default of `acmrs_stat_socket`.
const DEFAULT_SOCKET: &str = "/run/acmrs.sock";

/// The live per-endpoint counters and latency percentiles of a running ibacm daemon with the
/// acmrs provider, from its stats socket (docs/stats.md). Exit codes: 0 shown, 1 bad command
/// line or a file not written, 2 no acmrs provider serving at the socket.
#[derive(Parser)]
#[command(name = "acmrs-stat", version)]
struct Args {
    /// The provider's stats socket (option acmrs_stat_socket)
    #[arg(short, long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Also write DIR/acmrs-portP-pkeyKKKK-WHAT.hgrm per endpoint, WHAT = hit, route_miss,
    /// addr_miss, sa_rtt (HdrHistogram percentile distribution, values in microseconds)
    #[arg(long, value_name = "DIR")]
    hgrm: Option<PathBuf>,
    /// Print the report as the provider sent it
    #[arg(long)]
    raw: bool,
}

/// Connects and reads one report (the provider writes it and closes).
fn fetch(socket: &Path) -> Result<String, String> {
    export::fetch(socket).map_err(|e| {
        format!(
            "no acmrs provider is serving at {}: is ibacm running with `provider acmrs`? ({e})",
            socket.display()
        )
    })
}

/// The report crate's histogram (ps) of a snapshot (ns): one value per bucket, its highest.
fn latency_histogram(s: &Snapshot) -> LatencyHistogram {
    LatencyHistogram::from_ns_counts(s.values())
}

fn render(socket: &Path, r: &Report) -> String {
    let mut out = format!(
        "acmrs at {} (latency clock: {}): {} endpoint(s)\n",
        socket.display(),
        r.clock,
        r.endpoints.len()
    );
    let d = r.dataplane;
    if !d.up || d.restarts > 0 || d.gave_up > 0 {
        out.push_str(&format!(
            "dataplane: {} ({} resolver restart(s) after a panic, gave up {} time(s))\n",
            if d.up {
                "up"
            } else {
                "DOWN: every miss is answered ENODATA"
            },
            d.restarts,
            d.gave_up
        ));
    }
    for e in &r.endpoints {
        out.push_str(&format!(
            "\nendpoint port {} pkey 0x{:04x} gid {}\n  counters:",
            e.port, e.pkey, e.gid
        ));
        for (name, v) in COUNTERS.iter().zip(e.counters) {
            out.push_str(&format!(" {name} {v}"));
        }
        out.push('\n');
        let mut t = Table::new(&[
            "latency", "count", "mean", "p50", "p99", "p99.9", "p99.99", "max",
        ]);
        for (k, (short, _, _)) in HISTS.iter().enumerate() {
            let s = latency_histogram(&e.hists[k]).summary();
            let mut row = vec![short.to_string(), s.count.to_string()];
            if s.count == 0 {
                row.extend(std::iter::repeat_n("-".to_string(), 6));
            } else {
                for v in [
                    s.mean_ns, s.p50_ns, s.p99_ns, s.p999_ns, s.p9999_ns, s.max_ns,
                ] {
                    row.push(fmt_ns(v));
                }
            }
            t.row(row);
        }
        out.push_str(&t.render());
    }
    out
}

fn write_hgrms(dir: &Path, r: &Report) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    for e in &r.endpoints {
        for (k, (short, _, _)) in HISTS.iter().enumerate() {
            let p = dir.join(format!(
                "acmrs-port{}-pkey{:04x}-{short}.hgrm",
                e.port, e.pkey
            ));
            latency_histogram(&e.hists[k])
                .write_hgrm(&p)
                .map_err(|err| format!("{}: {err}", p.display()))?;
            written.push(p);
        }
    }
    Ok(written)
}

fn main() -> ExitCode {
    let args: Args = acm_report::cli::parse(1);
    let text = match fetch(&args.socket) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("acmrs-stat: {e}");
            return ExitCode::from(2);
        }
    };
    if args.raw {
        print!("{text}");
        return ExitCode::SUCCESS;
    }
    let report = match decode(&text) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "acmrs-stat: {} does not answer like an acmrs provider: {e}",
                args.socket.display()
            );
            return ExitCode::from(2);
        }
    };
    print!("{}", render(&args.socket, &report));
    if let Some(dir) = &args.hgrm {
        match write_hgrms(dir, &report) {
            Ok(files) => {
                for f in files {
                    println!("wrote {}", f.display());
                }
            }
            Err(e) => {
                eprintln!("acmrs-stat: {e}");
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use acm_dataplane::export::EndpointReport;
    use acm_dataplane::stats::Histogram;

    fn report() -> Report {
        let h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 100);
        }
        let mut e = EndpointReport {
            port: 1,
            pkey: 0xffff,
            gid: "fe80::2:c903:0:3".into(),
            counters: [0, 1000, 0, 0, 0, 0, 1000],
            ..Default::default()
        };
        e.hists[0] = h.snapshot();
        Report {
            clock: "instant".into(),
            dataplane: Default::default(),
            endpoints: vec![e],
        }
    }

    #[test]
    fn tables_show_percentiles() {
        let t = render(Path::new("/run/acmrs.sock"), &report());
        assert!(
            t.contains("endpoint port 1 pkey 0xffff gid fe80::2:c903:0:3"),
            "{t}"
        );
        assert!(t.contains("resolve 1000"), "{t}");
        let cells = |row: &str| -> Vec<String> {
            let l = t
                .lines()
                .find(|l| l.starts_with(&format!("| {row} ")))
                .unwrap();
            l.split('|').map(|c| c.trim().to_string()).collect()
        };
        let hit = cells("hit");
        assert_eq!(hit[2], "1000", "{hit:?}");
        // p50 of 100 ns .. 100 µs uniform is ~50 µs (bucket upper bound: within 3.1 %).
        let p50: f64 = hit[4].trim_end_matches(" µs").parse().unwrap();
        assert!((50.0..=51.6).contains(&p50), "{hit:?}");
        let miss = cells("route_miss");
        assert_eq!((miss[2].as_str(), miss[4].as_str()), ("0", "-"), "{miss:?}");
    }

    #[test]
    fn hgrm_files_per_endpoint_and_histogram() {
        let d = std::env::temp_dir().join(format!("acmrs-stat-test-{}", std::process::id()));
        let files = write_hgrms(&d, &report()).unwrap();
        assert_eq!(files.len(), HISTS.len());
        let hit = std::fs::read_to_string(d.join("acmrs-port1-pkeyffff-hit.hgrm")).unwrap();
        assert!(hit.contains("Total count    =         1000"), "{hit}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn not_serving_says_so() {
        let e = fetch(Path::new("/nonexistent/acmrs.sock")).unwrap_err();
        assert!(
            e.starts_with("no acmrs provider is serving at /nonexistent/acmrs.sock: is ibacm running with `provider acmrs`?"),
            "{e}"
        );
    }
}
