//! [`LatencyHistogram`]: latencies in picoseconds, their percentiles and their `.hgrm` text.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;

/// Percentiles of one latency distribution, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    /// Number of recorded operations.
    pub count: u64,
    /// Mean.
    pub mean_ns: f64,
    /// Median.
    pub p50_ns: f64,
    /// 99th percentile.
    pub p99_ns: f64,
    /// 99.9th percentile.
    pub p999_ns: f64,
    /// 99.99th percentile.
    pub p9999_ns: f64,
    /// Largest recorded value.
    pub max_ns: f64,
}

/// An HDR histogram of latencies, recorded in picoseconds, 3 significant digits, 1 ps .. 1 h.
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    h: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

const PS_PER_NS: f64 = 1000.0;

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        let h = Histogram::new_with_bounds(1, 3_600_000_000_000_000, 3)
            .expect("static histogram bounds are valid");
        LatencyHistogram { h }
    }

    /// Records one operation that took `d`.
    pub fn record(&mut self, d: Duration) {
        self.record_ps(
            d.as_nanos().saturating_mul(1000).min(u64::MAX as u128) as u64,
            1,
        );
    }

    /// Records `count` operations of `ps` picoseconds each (values beyond 1 h are clamped).
    pub fn record_ps(&mut self, ps: u64, count: u64) {
        let v = ps.clamp(1, self.h.high());
        // In range by construction, so this cannot fail.
        let _ = self.h.record_n(v, count);
    }

    /// A histogram of `count` operations of `ns` nanoseconds each, per `(ns, count)` pair (the
    /// buckets of a provider's live histogram, `Snapshot::values`).
    pub fn from_ns_counts(values: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut h = LatencyHistogram::new();
        for (ns, count) in values {
            h.record_ps(ns.saturating_mul(1000), count);
        }
        h
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        let _ = self.h.add(&other.h);
    }

    /// The underlying histogram (values in picoseconds).
    pub fn raw(&self) -> &Histogram<u64> {
        &self.h
    }

    /// The usual percentiles.
    pub fn summary(&self) -> Summary {
        let q = |p: f64| self.h.value_at_quantile(p) as f64 / PS_PER_NS;
        Summary {
            count: self.h.len(),
            mean_ns: self.h.mean() / PS_PER_NS,
            p50_ns: q(0.5),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            p9999_ns: q(0.9999),
            max_ns: self.h.max() as f64 / PS_PER_NS,
        }
    }

    /// The `.hgrm` text (HdrHistogram's `outputPercentileDistribution` format), values in
    /// microseconds.
    pub fn hgrm(&self) -> String {
        let scale = 1_000_000.0; // ps per µs
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:>12} {:>14} {:>10} {:>14}\n",
            "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
        );
        let mut total = 0u64;
        for v in self.h.iter_quantiles(5) {
            total += v.count_since_last_iteration();
            let q = v.quantile_iterated_to();
            let inv = if q < 1.0 {
                format!("{:14.2}", 1.0 / (1.0 - q))
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "{:12.6} {:2.12} {:10} {}",
                v.value_iterated_to() as f64 / scale,
                q,
                total,
                inv
            );
        }
        let _ = writeln!(
            s,
            "#[Mean    = {:12.6}, StdDeviation   = {:12.6}]",
            self.h.mean() / scale,
            self.h.stdev() / scale
        );
        let _ = writeln!(
            s,
            "#[Max     = {:12.6}, Total count    = {:12}]",
            self.h.max() as f64 / scale,
            self.h.len()
        );
        let buckets = self.h.buckets();
        let _ = writeln!(
            s,
            "#[Buckets = {:12}, SubBuckets     = {:12}]",
            buckets,
            self.h.distinct_values()
        );
        s
    }

    /// Writes [`hgrm`](Self::hgrm) to `path` ([`write_atomic`](crate::write_atomic)).
    pub fn write_hgrm(&self, path: &Path) -> std::io::Result<()> {
        crate::write_atomic(path, self.hgrm())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_hgrm() {
        let mut h = LatencyHistogram::new();
        for ns in 1..=1000u64 {
            h.record_ps(ns * 1000, 1);
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        assert!((s.p50_ns - 500.0).abs() < 1.0, "{s:?}");
        assert!((s.p99_ns - 990.0).abs() < 1.0, "{s:?}");
        assert!((s.max_ns - 1000.0).abs() < 1.0, "{s:?}");
        let text = h.hgrm();
        assert!(text.contains("Percentile"));
        assert!(text.contains("Total count    =         1000"));
        let last = text
            .lines()
            .rfind(|l| !l.starts_with('#') && !l.trim().is_empty())
            .unwrap();
        assert!(last.contains("1.000000000000"), "{last}");
    }
}
