//! Percentile-distribution plots of [`LatencyHistogram`]s, as SVG.
//!
//! The picture HdrHistogram's plotter draws from `.hgrm` files: latency against percentile,
//! the percentile axis scaled by `log10(1 / (1 - p))` so that every "nine" gets the same width
//! (ticks at 0 %, 90 %, 99 %, 99.9 %, 99.99 %, …), several series (acmrs against stock) in one
//! picture. The latency axis is linear, in the unit of its largest value (ns, µs, ms, s: named
//! in the axis title), or logarithmic when the series span more than two decades (a cache hit
//! next to its scheduler-noise tail); a logarithmic axis runs through several units, so each of
//! its ticks carries its own (`10 ns`, `100 ns`, `1 µs`, … `1 ms`).
//!
//! Only plotters' SVG backend is used, without a font feature: plotters estimates text extents
//! itself and the SVG carries plain `<text>` elements, so nothing reads a font file or links
//! fontconfig; the viewer renders the text.

use std::path::Path;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;

use crate::{fmt_ns, fmt_num, unit_of, LatencyHistogram};

/// One curve of a plot.
#[derive(Clone, Copy, Debug)]
pub struct Series<'a> {
    /// Legend text (the percentiles and the count are appended).
    pub label: &'a str,
    /// The latencies.
    pub histogram: &'a LatencyHistogram,
}

/// Width and height of the SVG, in pixels.
pub const SIZE: (u32, u32) = (900, 540);

/// Series colours, in order (blue, red, green, orange, purple, brown; then repeated): every
/// plot of the repo uses them, so a provider keeps its colour from picture to picture.
pub const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// Quantile iteration steps per halving of the remaining distance to 100 % (as the `.hgrm`).
const TICKS_PER_HALF: u32 = 5;

/// The percentile-axis label of `log10(1 / (1 - p)) = nines`: 0 → `0%`, 1 → `90%`,
/// 2 → `99%`, 3 → `99.9%`, …
pub fn percentile_label(nines: f64) -> String {
    let k = nines.round().max(0.0) as i32;
    if k == 0 {
        return "0%".into();
    }
    let p = 100.0 - 100.0 / 10f64.powi(k);
    format!("{p:.*}%", (k - 2).max(0) as usize)
}

/// Nines of the percentile axis for `count` samples: enough to show the largest
/// percentile the data resolves (`1 / (1 - p) = count`), at least 99 %, at most 99.99999 %.
fn axis_nines(count: u64) -> u32 {
    let mut k = 2;
    while k < 7 && 10u64.pow(k) < count {
        k += 1;
    }
    k
}

/// `(nines, latency in ns)` points of `h`, the last (100 %) at the axis end `x_max`.
fn points(h: &LatencyHistogram, x_max: f64) -> Vec<(f64, f64)> {
    let raw = h.raw();
    if raw.is_empty() {
        return Vec::new();
    }
    raw.iter_quantiles(TICKS_PER_HALF)
        .map(|v| {
            let q = v.quantile_iterated_to();
            let x = if q >= 1.0 {
                x_max
            } else {
                (1.0 / (1.0 - q)).log10().clamp(0.0, x_max)
            };
            (
                x,
                raw.highest_equivalent(v.value_iterated_to()) as f64 / 1000.0,
            )
        })
        .collect()
}

/// A linear `f64` axis whose ticks are exactly the given points (plotters' `WithKeyPoints`
/// over `f64` offers no label formatter hook).
#[derive(Clone, Debug)]
struct TickAxis {
    range: std::ops::Range<f64>,
    ticks: Vec<f64>,
}

impl Ranged for TickAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        let f = if span > 0.0 {
            (v - self.range.start) / span
        } else {
            0.0
        };
        limit.0 + (f * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

/// How the latency axis maps nanoseconds to plotted values.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scale {
    /// Linear, in `unit` (`ns_per_unit` nanoseconds each), named in the axis title.
    Linear {
        unit: &'static str,
        ns_per_unit: f64,
    },
    /// `log10` of nanoseconds; each tick names its own unit.
    Log,
}

/// The latency axis: its scale, range and ticks (in plotted coordinates: the value in the
/// linear axis's unit, or `log10` of nanoseconds).
#[derive(Debug)]
struct YAxis {
    scale: Scale,
    range: std::ops::Range<f64>,
    ticks: Vec<f64>,
}

impl YAxis {
    /// An axis for values in `min_ns..=max_ns` whose top `headroom` share (0..1) stays free
    /// of data (room for the legend, which sits in the upper left).
    fn new(min_ns: f64, max_ns: f64, headroom: f64) -> YAxis {
        let keep = 1.0 - headroom.clamp(0.0, 0.6);
        let (lo, hi) = (min_ns.max(1e-3), max_ns.max(1e-3));
        if hi / lo > 100.0 {
            let (a, b) = (lo.log10().floor(), hi.log10().ceil());
            let top = a + (b - a) / keep;
            let mut ticks = Vec::new();
            let steps: &[f64] = if b - a <= 3.0 {
                &[1.0, 2.0, 5.0]
            } else {
                &[1.0]
            };
            let mut e = a;
            while e <= top.floor() {
                for m in steps {
                    let t = (m * 10f64.powf(e)).log10();
                    if t <= top + 1e-9 {
                        ticks.push(t);
                    }
                }
                e += 1.0;
            }
            YAxis {
                scale: Scale::Log,
                range: a..top,
                ticks,
            }
        } else {
            let (unit, ns_per_unit) = unit_of(hi);
            let top = hi / ns_per_unit * 1.05 / keep;
            let raw_step = top / 7.0;
            let mag = 10f64.powf(raw_step.log10().floor());
            let step = [1.0, 2.0, 2.5, 5.0, 10.0]
                .iter()
                .map(|m| m * mag)
                .find(|s| *s >= raw_step)
                .unwrap_or(10.0 * mag);
            let ticks = (0..)
                .map(|i| f64::from(i) * step)
                .take_while(|t| *t <= top + 1e-9)
                .collect();
            YAxis {
                scale: Scale::Linear { unit, ns_per_unit },
                range: 0.0..top,
                ticks,
            }
        }
    }

    fn to_plot(&self, ns: f64) -> f64 {
        match self.scale {
            Scale::Linear { ns_per_unit, .. } => ns / ns_per_unit,
            Scale::Log => ns.max(1e-9).log10(),
        }
    }

    /// A tick's label: a number in the axis's unit, or on a log axis a latency with its unit.
    fn label(&self, y: f64) -> String {
        match self.scale {
            Scale::Linear { .. } => fmt_num(y),
            Scale::Log => fmt_ns(10f64.powf(y)),
        }
    }

    /// The axis title.
    fn desc(&self) -> String {
        match self.scale {
            Scale::Linear { unit, .. } => format!("latency ({unit})"),
            Scale::Log => "latency (log scale)".to_string(),
        }
    }

    fn coord(&self) -> TickAxis {
        TickAxis {
            range: self.range.clone(),
            ticks: self.ticks.clone(),
        }
    }
}

/// Renders the percentile distributions of `series` into one SVG document titled `title`.
///
/// Empty histograms are listed in the legend as "no samples" and draw no curve. Errors are
/// plotters' drawing errors, as text.
pub fn percentile_svg(title: &str, series: &[Series<'_>]) -> Result<String, String> {
    let filled: Vec<&Series<'_>> = series
        .iter()
        .filter(|s| !s.histogram.raw().is_empty())
        .collect();
    let count = filled
        .iter()
        .map(|s| s.histogram.raw().len())
        .max()
        .unwrap_or(0);
    let nines = axis_nines(count);
    let x_max = f64::from(nines);
    let min_ns = filled
        .iter()
        .map(|s| s.histogram.raw().min() as f64 / 1000.0)
        .fold(f64::INFINITY, f64::min);
    let max_ns = filled
        .iter()
        .map(|s| s.histogram.raw().max() as f64 / 1000.0)
        .fold(0.0, f64::max);
    // The legend: a line per series plus its frame, 22 px each, over a plot ~390 px high.
    let headroom = (series.len() as f64 * 22.0 + 24.0) / 390.0;
    let y = if filled.is_empty() {
        YAxis::new(1.0, 1000.0, headroom)
    } else {
        YAxis::new(min_ns, max_ns, headroom)
    };
    let x_coord = TickAxis {
        range: 0.0..x_max,
        ticks: (0..=nines).map(f64::from).collect(),
    };

    let err = |e: &dyn std::fmt::Display| format!("plot {title:?}: {e}");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(16)
            .margin_right(44)
            .x_label_area_size(52)
            .y_label_area_size(72)
            .build_cartesian_2d(x_coord, y.coord())
            .map_err(|e| err(&e))?;
        let y_desc = y.desc();
        chart
            .configure_mesh()
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .x_desc("percentile")
            .y_desc(y_desc)
            .x_label_formatter(&|x| percentile_label(*x))
            .y_label_formatter(&|v| y.label(*v))
            .light_line_style(WHITE)
            .draw()
            .map_err(|e| err(&e))?;
        for (i, s) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let sum = s.histogram.summary();
            if sum.count == 0 {
                chart
                    .draw_series(std::iter::empty::<PathElement<(f64, f64)>>())
                    .map_err(|e| err(&e))?
                    .label(format!("{}: no samples", s.label))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
                    });
                continue;
            }
            let pts: Vec<(f64, f64)> = points(s.histogram, x_max)
                .into_iter()
                .map(|(x, ns)| (x, y.to_plot(ns)))
                .collect();
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(format!(
                    "{}: p50 {}, p99 {}, max {} (n = {})",
                    s.label,
                    fmt_ns(sum.p50_ns),
                    fmt_ns(sum.p99_ns),
                    fmt_ns(sum.max_ns),
                    sum.count
                ))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 16))
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

/// [`percentile_svg`] written to `path` ([`write_atomic`](crate::write_atomic)).
pub fn write_percentile_svg(
    path: &Path,
    title: &str,
    series: &[Series<'_>],
) -> std::io::Result<()> {
    let svg = percentile_svg(title, series).map_err(std::io::Error::other)?;
    crate::write_atomic(path, svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synthetic(lo_ns: u64, hi_ns: u64, n: u64, tail_ns: u64) -> LatencyHistogram {
        let mut h = LatencyHistogram::new();
        for i in 0..n {
            h.record_ps((lo_ns + (hi_ns - lo_ns) * i / n) * 1000, 1);
        }
        h.record_ps(tail_ns * 1000, 1);
        h
    }

    fn texts(doc: &roxmltree::Document<'_>) -> Vec<String> {
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| n.text().unwrap_or_default().trim().to_string())
            .collect()
    }

    #[test]
    fn percentile_labels() {
        let l: Vec<String> = (0..6).map(|k| percentile_label(f64::from(k))).collect();
        assert_eq!(l, ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"]);
        assert_eq!(axis_nines(0), 2);
        assert_eq!(axis_nines(275), 3);
        assert_eq!(axis_nines(10_000), 4);
        assert_eq!(axis_nines(200_000), 6);
    }

    #[test]
    fn two_series_render_as_svg_with_legends_and_percentile_ticks() {
        let acmrs = synthetic(200, 400, 20_000, 30_000);
        let stock = synthetic(300, 1_200, 20_000, 90_000);
        let svg = percentile_svg(
            "hit latency <1000 cached paths> & more",
            &[
                Series {
                    label: "acmrs",
                    histogram: &acmrs,
                },
                Series {
                    label: "stock libibacmp",
                    histogram: &stock,
                },
            ],
        )
        .unwrap();
        let doc = roxmltree::Document::parse(&svg).expect("the SVG is well-formed XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let t = texts(&doc);
        let has = |needle: &str| t.iter().any(|s| s.contains(needle));
        for legend in ["acmrs: p50", "stock libibacmp: p50", "(n = 20001)"] {
            assert!(has(legend), "no legend {legend:?} in {t:?}");
        }
        // 20 001 samples: the axis runs to 99.999 %, one tick per nine.
        for tick in ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"] {
            assert!(t.iter().any(|s| s == tick), "no tick {tick:?} in {t:?}");
        }
        assert!(has("percentile"));
        assert!(has("hit latency <1000 cached paths> & more"), "{t:?}");
        // The tails (30/90 µs against 0.2–1.2 µs) span more than two decades: log scale, each
        // tick with its unit.
        assert!(has("latency (log scale)"), "{t:?}");
        for tick in ["100 ns", "1 µs", "10 µs", "100 µs"] {
            assert!(t.iter().any(|s| s == tick), "no tick {tick:?} in {t:?}");
        }
        // One polyline per series, in the series' colours.
        let lines: Vec<_> = doc
            .descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .filter_map(|n| n.attribute("stroke"))
            .collect();
        assert!(lines.contains(&"#1F77B4"), "{lines:?}");
        assert!(lines.contains(&"#D62728"), "{lines:?}");
    }

    #[test]
    fn empty_and_narrow_histograms_still_render() {
        let empty = LatencyHistogram::new();
        let narrow = synthetic(100_000, 120_000, 275, 130_000);
        let svg = percentile_svg(
            "miss",
            &[
                Series {
                    label: "stock",
                    histogram: &empty,
                },
                Series {
                    label: "acmrs",
                    histogram: &narrow,
                },
            ],
        )
        .unwrap();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let t = texts(&doc);
        assert!(t.iter().any(|s| s == "stock: no samples"), "{t:?}");
        assert!(t.iter().any(|s| s.starts_with("acmrs: p50 1")), "{t:?}");
        assert!(t.iter().any(|s| s == "99.9%"), "{t:?}");
        assert!(t.iter().any(|s| s == "latency (µs)"), "{t:?}");
    }

    /// The texts of `doc` that are a latency tick label: a number and a unit, nothing else.
    fn latency_ticks(doc: &roxmltree::Document<'_>) -> Vec<String> {
        texts(doc)
            .into_iter()
            .filter(|s| {
                s.split_once(' ').is_some_and(|(v, unit)| {
                    v.parse::<f64>().is_ok() && ["ns", "µs", "ms", "s"].contains(&unit)
                })
            })
            .collect()
    }

    #[test]
    fn log_axis_ticks_name_their_unit_and_differ() {
        // The provider-hit picture: a memory floor of ~10 ns next to a hit of ~250 ns and a
        // scheduler tail of ~2 ms. In ms every tick below 1 µs printed as `0`.
        let y = YAxis::new(12.0, 2.3e6, 0.2);
        let labels: Vec<String> = y.ticks.iter().map(|&t| y.label(t)).collect();
        assert_eq!(
            labels[..6],
            ["10 ns", "100 ns", "1 µs", "10 µs", "100 µs", "1 ms"],
            "{labels:?}"
        );
        let mut distinct = labels.clone();
        distinct.dedup();
        assert_eq!(distinct, labels);
        assert_eq!(y.desc(), "latency (log scale)");
        // Up to three decades: 1-2-5 ticks, still one unit each.
        let y = YAxis::new(150.0, 40_000.0, 0.2);
        let labels: Vec<String> = y.ticks.iter().map(|&t| y.label(t)).collect();
        assert_eq!(
            labels[..7],
            ["100 ns", "200 ns", "500 ns", "1 µs", "2 µs", "5 µs", "10 µs"],
            "{labels:?}"
        );
        // A linear axis: the unit of the largest value, in the title; plain numbers.
        let y = YAxis::new(100_000.0, 130_000.0, 0.1);
        assert_eq!(y.desc(), "latency (µs)");
        let labels: Vec<String> = y.ticks.iter().map(|&t| y.label(t)).collect();
        assert_eq!(labels[..3], ["0", "25", "50"], "{labels:?}");
        let y = YAxis::new(1_000.0, 9_000.0, 0.1);
        assert_eq!(y.desc(), "latency (µs)");
        let labels: Vec<String> = y.ticks.iter().map(|&t| y.label(t)).collect();
        assert_eq!(labels[..3], ["0", "2", "4"], "{labels:?}");
    }

    #[test]
    fn hit_plot_labels_every_latency_tick_distinctly() {
        let floor = synthetic(9, 14, 20_000, 60);
        let hit = synthetic(200, 700, 20_000, 2_100_000);
        let svg = percentile_svg(
            "resolve(), hit",
            &[
                Series {
                    label: "acmrs",
                    histogram: &hit,
                },
                Series {
                    label: "memory floor",
                    histogram: &floor,
                },
            ],
        )
        .unwrap();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let ticks = latency_ticks(&doc);
        for want in ["10 ns", "100 ns", "1 µs", "1 ms"] {
            assert!(
                ticks.iter().any(|s| s == want),
                "no tick {want:?} in {ticks:?}"
            );
        }
        let mut distinct = ticks.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), ticks.len(), "{ticks:?}");
        assert!(texts(&doc).iter().any(|s| s == "latency (log scale)"));
    }
}
