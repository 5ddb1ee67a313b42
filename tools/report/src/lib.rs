//! What the acmrs benches (`bench/`) and tools (`acmrs-stat`, `acmrs-storm`, …) print and draw,
//! and how their command lines read. It sits above nothing of acmrs: the benches and the tools
//! use it, and it uses neither.
//!
//! * [`LatencyHistogram`]: an HDR histogram of per-operation latencies recorded in picoseconds
//!   (so batch-averaged nanosecond-scale operations keep their precision), with
//!   [`LatencyHistogram::summary`] for the usual percentiles ([`Summary`]) and
//!   [`LatencyHistogram::write_hgrm`] for the standard `.hgrm` percentile-distribution text
//!   format (values in microseconds, as HdrHistogram's plotter expects).
//! * [`Table`]: a plain aligned text table (GitHub Markdown) for results.
//! * [`fmt_ns`]: a latency with the unit that suits it (`271 ns`, `1.62 µs`, `2.5 ms`).
//! * [`plot`]: percentile-distribution plots (SVG) of several histograms in one picture, and
//!   the size and colours every plot of the repo uses.
//! * [`progress`]: one line per phase of a long run on stderr, with the elapsed time.
//! * [`cli`]: the command-line conventions (clap) of every bench and tool: help, errors and
//!   exit codes, `--quick`/`--out DIR`, lists and numbers with `_` separators.
//! * [`write_atomic`]: a result file replaced in one step (a `.tmp` file, then a rename).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::path::Path;

pub mod cli;
mod hist;
pub mod plot;
mod progress;
mod table;

pub use hist::{LatencyHistogram, Summary};
pub use progress::{progress, progress_env, PROGRESS_EPOCH_ENV};
pub use table::Table;

/// Writes `bytes` to `path` in one step: to `<path>.tmp` (synced), then renamed over `path`, so
/// a reader never sees half a file.
pub fn write_atomic(path: &Path, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes.as_ref())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// `v` rounded to 3 significant digits (0 stays 0).
fn round3(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let f = 10f64.powi(2 - v.abs().log10().floor() as i32);
    (v * f).round() / f
}

/// A number with 3 significant digits and no trailing zeros, at any magnitude: `250`, `12.5`,
/// `1.62`, `0.25`, `0.0001` (never `0` for a value that is not 0).
pub fn fmt_num(v: f64) -> String {
    let v = round3(v);
    if v == 0.0 || !v.is_finite() {
        return format!("{v:.0}");
    }
    let decimals = (2 - v.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The unit of a latency of `ns` nanoseconds: the largest of ns, µs, ms and s that it reaches
/// (ns below 1 ns), with the nanoseconds in one of it.
pub fn unit_of(ns: f64) -> (&'static str, f64) {
    let a = ns.abs();
    if a >= 1e9 {
        ("s", 1e9)
    } else if a >= 1e6 {
        ("ms", 1e6)
    } else if a >= 1e3 {
        ("µs", 1e3)
    } else {
        ("ns", 1.0)
    }
}

/// A latency with its unit, 3 significant digits: `271 ns`, `1.62 µs`, `134 µs`, `2.5 s`. The
/// unit is chosen after rounding, so 999.96 ns reads `1 µs`, not `1000 ns`.
pub fn fmt_ns(ns: f64) -> String {
    let (unit, scale) = unit_of(round3(ns));
    format!("{} {unit}", fmt_num(ns / scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_latencies_keep_three_significant_digits() {
        let n: Vec<String> = [0.0, 250.0, 12.5, 1.625, 0.25, 0.0001, 0.00012345, 1234.0]
            .iter()
            .map(|&v| fmt_num(v))
            .collect();
        assert_eq!(
            n,
            ["0", "250", "12.5", "1.63", "0.25", "0.0001", "0.000123", "1230"]
        );
        let l: Vec<String> = [10.0, 271.0, 999.96, 1620.0, 134_000.0, 2.5e6, 2.5e9]
            .iter()
            .map(|&v| fmt_ns(v))
            .collect();
        assert_eq!(
            l,
            ["10 ns", "271 ns", "1 µs", "1.62 µs", "134 µs", "2.5 ms", "2.5 s"]
        );
    }

    #[test]
    fn write_atomic_replaces_the_file() {
        let d = std::env::temp_dir().join(format!("acm-report-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("r.md");
        write_atomic(&p, "one").unwrap();
        write_atomic(&p, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
        assert!(!d.join("r.md.tmp").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
