//! The live latency stats on the real ibacm daemon (docs/stats.md): a fabric with acmrs nodes
//! (Hca3, Hca4) and a stock one (Hca2), no hosts file, `acmrs_prom_file` set. After hits and
//! misses with the real `ib_acme`, the Prometheus textfile is checked with `promtool check
//! metrics` and parsed with the `prometheus_client` text parser, and its counts must match what
//! was done; `acmrs-stat` in the node's `/run` namespace shows the endpoint's tables and
//! writes `.hgrm` files; on the stock node it says that no acmrs provider is serving.
//!
//! Needs root (private /run per daemon), `promtool` (Debian `prometheus`) and
//! `python3-prometheus-client` (scripts/install-deps.sh), and `libsimverbs.so`, `libacmrs.so`
//! and `acmrs-stat` in the target directory (`cargo build -p simverbs -p acm-plugin -p
//! acmrs-stat`). Fails with the reason when not root.

mod common;

use acm_fabric::checks::require_root;
use acm_fabric::{find_artifact, Fabric, Output};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `program args` with `text` on its stdin; its status, stdout and stderr (`missing`: the
/// panic message when it cannot be started).
fn run_with_stdin(program: &str, args: &[&str], missing: &str, text: &str) -> std::process::Output {
    let mut child = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect(missing);
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Metric samples: (name, sorted labels without port/pkey/gid) → value, for one endpoint.
type Samples = BTreeMap<(String, String), f64>;

/// Parses a textfile with the `prometheus_client` text-format parser (Debian's python3).
fn parse_prometheus(text: &str, gid: &str) -> Samples {
    const SCRIPT: &str = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        labels = dict(s.labels)
        gid = labels.pop("gid", "")
        for k in ("port", "pkey"):
            labels.pop(k, None)
        rest = ",".join("%s=%s" % kv for kv in sorted(labels.items()))
        print("%s\t%s\t%s\t%s\t%r" % (fam.type, gid, s.name, rest, s.value))
"#;
    let out = run_with_stdin("/usr/bin/python3", &["-c", SCRIPT], "python3", text);
    assert!(
        out.status.success(),
        "prometheus_client could not parse the textfile: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut m = Samples::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 5, "{line}");
        assert_ne!(f[0], "unknown", "a sample of an undeclared family: {line}");
        if f[1] == gid {
            m.insert((f[2].to_string(), f[3].to_string()), f[4].parse().unwrap());
        }
    }
    m
}

/// `promtool check metrics` (format and naming lint) must accept the textfile.
fn promtool_check(text: &str) {
    let out = run_with_stdin(
        "promtool",
        &["check", "metrics"],
        "promtool (Debian package prometheus: scripts/install-deps.sh)",
        text,
    );
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_prom(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn counter(m: &Samples, name: &str) -> f64 {
    m.get(&(
        "acmrs_requests_total".to_string(),
        format!("counter={name}"),
    ))
    .copied()
    .unwrap_or_else(|| panic!("no counter {name}: {m:?}"))
}

fn hist_count(m: &Samples, hist: &str) -> f64 {
    m.get(&(format!("{hist}_count"), String::new()))
        .copied()
        .unwrap_or_else(|| panic!("no {hist}_count: {m:?}"))
}

const HISTS: [&str; 8] = [
    "acmrs_resolve_hit_seconds",
    "acmrs_route_miss_seconds",
    "acmrs_addr_miss_seconds",
    "acmrs_sa_rtt_seconds",
    "acmrs_miss_queued_seconds",
    "acmrs_miss_to_query_seconds",
    "acmrs_sa_reply_wait_seconds",
    "acmrs_reply_to_answer_seconds",
];

/// Every histogram is well formed: cumulative buckets, `+Inf` = `_count`.
fn check_histograms(m: &Samples) {
    for h in HISTS {
        let mut buckets: Vec<(f64, f64)> = m
            .iter()
            .filter(|((n, _), _)| *n == format!("{h}_bucket"))
            .map(|((_, l), v)| {
                let le = l.strip_prefix("le=").unwrap();
                (le.parse::<f64>().unwrap(), *v)
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert_eq!(buckets.len(), 26, "{h}: {buckets:?}");
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "{h}: {buckets:?}"
        );
        assert_eq!(buckets.last().unwrap().1, hist_count(m, h), "{h}");
    }
}

/// Waits until the textfile shows at least `resolves` resolve() calls, then returns it.
fn prom_after(path: &Path, gid: &str, resolves: f64) -> (String, Samples) {
    let t0 = Instant::now();
    loop {
        let text = read_prom(path);
        let m = parse_prometheus(&text, gid);
        if m.contains_key(&("acmrs_requests_total".into(), "counter=resolve".into()))
            && counter(&m, "resolve") >= resolves
        {
            return (text, m);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the textfile never showed {resolves} resolves:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn acme_ok(f: &Fabric, on: &str, args: &[&str]) -> Output {
    let o = f.node(on).unwrap().acme(args).unwrap();
    assert!(
        o.success() && o.stdout.contains("dlid:"),
        "ib_acme {args:?} on {on}:\n{o}\n{}",
        f.logs_report()
    );
    o
}

fn stat_binary() -> PathBuf {
    find_artifact("ACMRS_STAT", "acmrs-stat", "cargo build -p acmrs-stat")
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn latency_stats_in_the_textfile_and_acmrs_stat() {
    require_root();
    let stat = stat_binary();
    let f = common::mixed_fabric("acm-stats")
        .option("timeout", "500")
        .option("acmrs_prom_file", "/run/acmrs.prom")
        .option("acmrs_prom_interval_s", "1")
        // Every hit timed (the default times one in 16, weighted 16): the counts below are exact.
        .option("acmrs_hit_sample", "1")
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let (n3, n4) = (f.node("Hca3").unwrap(), f.node("Hca4").unwrap());
    let prom = n3.run_dir.join("acmrs.prom");
    let gid = n3.gid.to_string();

    // Warm-up until both acmrs endpoints have joined: names of the stock node.
    for on in ["Hca3", "Hca4"] {
        let (s, d) = (
            &f.node(on).unwrap().addrs.name,
            &f.node("Hca2").unwrap().addrs.name,
        );
        let o = f
            .node(on)
            .unwrap()
            .acme_until(
                &["-f", "n", "-s", s, "-d", d],
                Duration::from_secs(20),
                |o| o.success() && o.stdout.contains("dlid:"),
            )
            .unwrap();
        assert!(o.success(), "warm-up on {on}:\n{o}\n{}", f.logs_report());
    }
    std::thread::sleep(Duration::from_millis(2500));
    let (_, before) = prom_after(&prom, &gid, 1.0);

    // 5 PATH requests by LID (1 miss, 4 hits) and 5 by name (1 miss, 4 hits) on Hca3.
    let (l3, l4) = (n3.lid.to_string(), n4.lid.to_string());
    for _ in 0..5 {
        let o = acme_ok(&f, "Hca3", &["-f", "l", "-s", &l3, "-d", &l4]);
        assert!(o.stdout.contains(&format!("dlid: {l4}\n")), "{o}");
    }
    for _ in 0..5 {
        let o = acme_ok(
            &f,
            "Hca3",
            &["-f", "n", "-s", &n3.addrs.name, "-d", &n4.addrs.name],
        );
        assert!(o.stdout.contains(&format!("dgid: {}\n", n4.gid)), "{o}");
    }
    let want = counter(&before, "resolve") + 10.0;
    let (text, after) = prom_after(&prom, &gid, want);
    eprintln!(
        "{}",
        text.lines()
            .filter(|l| l.contains(&gid) && !l.contains("_bucket"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    promtool_check(&text);
    check_histograms(&after);
    let d = |name: &str| counter(&after, name) - counter(&before, name);
    let dh = |h: &str| hist_count(&after, h) - hist_count(&before, h);
    let summary = format!("before {before:?}\nafter {after:?}\n{text}");
    assert_eq!(d("resolve"), 10.0, "{summary}");
    assert_eq!((d("error"), d("no_data")), (0.0, 0.0), "{summary}");
    assert_eq!(dh("acmrs_resolve_hit_seconds"), 8.0, "{summary}");
    assert_eq!(d("route_cache"), 8.0, "{summary}");
    assert_eq!(dh("acmrs_route_miss_seconds"), 1.0, "{summary}");
    assert_eq!(dh("acmrs_addr_miss_seconds"), 1.0, "{summary}");
    assert!(d("route_query") >= 1.0, "{summary}");
    assert!(dh("acmrs_sa_rtt_seconds") >= d("route_query"), "{summary}");
    // A miss waits for the SA or the ACM protocol: slower than a hit; sums are seconds.
    let sum = |h: &str| after[&(format!("{h}_sum"), String::new())];
    assert!(sum("acmrs_resolve_hit_seconds") > 0.0, "{summary}");
    assert!(
        sum("acmrs_route_miss_seconds") / hist_count(&after, "acmrs_route_miss_seconds")
            > sum("acmrs_resolve_hit_seconds") / hist_count(&after, "acmrs_resolve_hit_seconds"),
        "{summary}"
    );
    assert!(sum("acmrs_sa_rtt_seconds") < 60.0, "{summary}");
    // The legs of the two misses inside the provider: each was taken by a round of the loop.
    // The LID miss sent its SA query at once (the name miss may find its route learned by
    // then: no query of its own), and the SA reply led to its answer. SA replies come on
    // acmrs's own QP here (`ud` transport): none waited in the inbox for the core's SA
    // thread.
    assert_eq!(dh("acmrs_miss_queued_seconds"), 2.0, "{summary}");
    let to_query = dh("acmrs_miss_to_query_seconds");
    assert!((1.0..=2.0).contains(&to_query), "{summary}");
    assert!(dh("acmrs_reply_to_answer_seconds") >= 1.0, "{summary}");
    assert_eq!(dh("acmrs_sa_reply_wait_seconds"), 0.0, "{summary}");
    let mean = |h: &str| sum(h) / hist_count(&after, h);
    for leg in [
        "acmrs_miss_queued_seconds",
        "acmrs_miss_to_query_seconds",
        "acmrs_reply_to_answer_seconds",
    ] {
        assert!(
            mean(leg) < mean("acmrs_route_miss_seconds"),
            "{leg} is a part of a miss: {summary}"
        );
    }

    // acmrs-stat in Hca3's namespace (/run/acmrs.sock): the endpoint's tables and .hgrm files.
    let stat_s = stat.to_str().unwrap();
    let o = n3
        .run(stat_s, &["--hgrm", "/run/hgrm"], Duration::from_secs(20))
        .unwrap();
    assert!(o.success(), "acmrs-stat on Hca3:\n{o}");
    eprintln!("acmrs-stat on Hca3:\n{}", o.stdout);
    assert!(
        o.stdout
            .contains(&format!("endpoint port 1 pkey 0xffff gid {gid}\n")),
        "{o}"
    );
    let row = |name: &str| -> Vec<String> {
        let l = o
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {name} ")))
            .unwrap_or_else(|| panic!("no {name} row:\n{o}"));
        l.split('|').map(|c| c.trim().to_string()).collect()
    };
    let hits: f64 = row("hit")[2].parse().unwrap();
    assert!(
        hits >= hist_count(&after, "acmrs_resolve_hit_seconds"),
        "{o}"
    );
    for r in [
        "route_miss",
        "addr_miss",
        "sa_rtt",
        "miss_queued",
        "miss_to_query",
        "reply_to_answer",
    ] {
        assert!(row(r)[2].parse::<u64>().unwrap() >= 1, "{o}");
        assert!(row(r)[4].ends_with('s'), "p50 of {r}: {o}");
    }
    let resolves: f64 = o
        .stdout
        .split_once(" resolve ")
        .and_then(|(_, r)| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no resolve counter:\n{o}"));
    assert!(resolves >= counter(&after, "resolve"), "{o}");
    let hgrm = n3.run_dir.join("hgrm/acmrs-port1-pkeyffff-hit.hgrm");
    let h =
        std::fs::read_to_string(&hgrm).unwrap_or_else(|e| panic!("{}: {e}\n{o}", hgrm.display()));
    assert!(h.contains("Percentile") && h.contains("#[Max"), "{h}");

    // On the stock node nobody serves the socket: a clear message, a non-zero exit.
    let o = f
        .node("Hca2")
        .unwrap()
        .run(stat_s, &[], Duration::from_secs(20))
        .unwrap();
    assert!(!o.success(), "{o}");
    assert!(
        o.stderr.contains(
            "no acmrs provider is serving at /run/acmrs.sock: is ibacm running with `provider acmrs`?"
        ),
        "{o}"
    );
}
