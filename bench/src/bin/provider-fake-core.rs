//! acmrs alone, in-process: this program is the ibacm core (`acm_testkit::core`, exported from
//! this executable: see build.rs) with an instant SA, and measures `resolve()` on hits and
//! misses with up to 1M cached paths, sizes no fabric and no stock provider can hold (see
//! docs/bench.md). `provider --fake-core` and `provider`'s sizes above the stock maximum run
//! this binary.
//!
//! `provider-fake-core [--quick] [--sizes 1000,100000,1000000] [--poll-mode busy|adaptive|event]
//! [--out DIR]` (`libacmrs.so` next to this executable).
//!
//! `--out DIR` (created up front) gets one `.hgrm` and one percentile plot (`.svg`, acmrs
//! alone: the stock provider cannot run on a fake core) per measurement and size. Each size
//! prints one progress line on stderr (on the parent's clock when `provider` runs this).
//!
//! Memory: each size runs with `acmrs_path_capacity` = its number of paths (a full cache at the
//! design load); the report's second table has the process's RSS after open and after the
//! fill, and the bytes of RSS per cached path from the first size to each larger one.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use acm_bench::{rss_bytes, PollMode, SizeOpts, XorShift};
use acm_report::cli::RunOpts;
use acm_report::plot::{write_percentile_svg, Series};
use acm_report::{progress, LatencyHistogram, Table};
use acm_testkit::core::{self as fake, AutoSa, Record};
use acm_testkit::host::{self, Host, Lib};
use acm_testkit::request::PathRequest;
use acmrs::ffi::{AcmMsg, ACM_ADDRESS_NAME};
use clap::Parser;
use std::time::{Duration, Instant};

/// acmrs alone, in-process: this program plays the ibacm core with an instant SA and measures
/// resolve() on hits and misses with up to 1M cached paths (libacmrs.so next to this
/// executable; docs/bench.md).
#[derive(Parser)]
#[command(name = "provider-fake-core", version)]
struct Cli {
    #[command(flatten)]
    run: RunOpts,
    #[command(flatten)]
    sizes: SizeOpts,
    #[command(flatten)]
    poll: PollMode,
}

/// A PATH request by DGID (GUID `guid` on the fake fabric), as `ib_acme -f g` sends it.
fn path_msg(tid: u64, guid: u64) -> AcmMsg {
    PathRequest::new(tid, 0, Some(fake::gid_of(guid))).msg()
}

fn wait_answered(n: usize) {
    let t0 = Instant::now();
    while fake::response_count() < n {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "answers stalled at {}",
            fake::response_count()
        );
        std::hint::spin_loop();
    }
}

struct Results {
    size: usize,
    /// Resident memory right after open (the cache storage allocated and zeroed, so already
    /// resident) and after the fill, bytes.
    rss_open: usize,
    rss_filled: usize,
    /// Hit samples that were not answered inside `resolve()` (not cache hits after all).
    not_inline: usize,
    hit: LatencyHistogram,
    miss_call: LatencyHistogram,
    miss_answer: LatencyHistogram,
}

fn run_size(lib: &Lib, size: usize, samples: usize, poll_mode: &str) -> Results {
    let opts = format!(
        "log_level 0\nsa_depth 32\nacmrs_path_capacity {}\nacmrs_request_capacity 65536\n\
         acmrs_pending_capacity 65536\nacmrs_poll_mode {poll_mode}\n",
        size.max(1024),
    );
    let mut h = Host::open_with(lib, &opts, &[]);
    let rss_open = rss_bytes();
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"bench"));
    let ctx = h.addr_ctx(0);
    let resolve = |m: &mut AcmMsg| {
        // SAFETY: the provider ABI as ibacm calls it: our address context, a full message.
        unsafe { (lib.prov.resolve)(ctx, m, 1) }
    };
    // Fill the cache with `size` distinct destinations (misses answered by the instant SA).
    let mut sent = 0usize;
    for i in 0..size {
        while sent - fake::response_count() > 30_000 {
            std::hint::spin_loop();
        }
        let mut m = path_msg(i as u64, 0x1_0000 + i as u64);
        resolve(&mut m);
        sent += 1;
    }
    wait_answered(sent);
    let rss_filled = rss_bytes();
    // Hits: random cached destinations, each timed from the resolve() call to its answer
    // reaching the core (`acm_resolve_response`, answered inline), as the same-host bench
    // times them: what the provider returns after handing over the answer is not the client's.
    let mut rng = XorShift::new(42);
    let mut hit = LatencyHistogram::new();
    let mut not_inline = 0;
    for s in 0..samples {
        let i = rng.below(size as u64);
        let mut m = path_msg(s as u64, 0x1_0000 + i);
        let before = fake::response_count();
        let t0 = fake::now_ns();
        resolve(&mut m);
        if fake::response_count() == before {
            not_inline += 1;
        } else {
            hit.record(Duration::from_nanos(
                fake::last_answer().0.saturating_sub(t0),
            ));
        }
    }
    sent += samples;
    wait_answered(sent);
    // Misses, one at a time: the time resolve() holds the core's thread, and the time until
    // the answer (dataplane → SA → dataplane → acm_resolve_response).
    let mut miss_call = LatencyHistogram::new();
    let mut miss_answer = LatencyHistogram::new();
    let misses = (samples / 10).max(1000);
    for s in 0..misses {
        let mut m = path_msg(s as u64, 0x4000_0000 + s as u64);
        let t0 = fake::now_ns();
        let c0 = Instant::now();
        resolve(&mut m);
        miss_call.record(c0.elapsed());
        sent += 1;
        wait_answered(sent);
        miss_answer.record(Duration::from_nanos(
            fake::last_answer().0.saturating_sub(t0),
        ));
    }
    h.close();
    Results {
        size,
        rss_open,
        rss_filled,
        not_inline,
        hit,
        miss_call,
        miss_answer,
    }
}

fn main() {
    let args: Cli = acm_report::cli::parse(2);
    args.run.create_out_or_exit();
    let sizes = args.sizes.get(args.run.quick);
    let samples = if args.run.quick { 100_000 } else { 1_000_000 };
    let poll_mode = args.poll.poll_mode.as_str();
    let so = acm_bench::sibling("libacmrs.so", "cargo build --release -p acm-plugin")
        .unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1)
        });
    let lib = match host::load(&so) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("provider-fake-core: {e}");
            std::process::exit(1);
        }
    };
    fake::record(Record::Count);
    let _sa = AutoSa::start();
    let mut table = Table::new(&[
        "what",
        "cached paths",
        "count",
        "p50 ns",
        "p99 ns",
        "p99.9 ns",
        "p99.99 ns",
        "max ns",
    ]);
    let mut memory = Table::new(&[
        "cached paths",
        "RSS after open MiB",
        "RSS filled MiB",
        "B / cached path above the first size",
        "hit samples not answered inline",
    ]);
    let mut floors = Vec::new();
    let mut first: Option<(usize, usize)> = None;
    for &size in &sizes {
        progress(format_args!(
            "fake core: {size} cached paths, {samples} samples ({poll_mode})"
        ));
        let r = run_size(lib, size, samples, poll_mode);
        // The memory floor of this size (the plugin closed, its storage freed): one dependent
        // load over a buffer as large as the path storage of this capacity.
        let sf = acm_bench::storage_floor(size.max(1024), &mut XorShift::new(0xf100 ^ size as u64));
        floors.push(format!("{size} cached paths: {}", sf.describe()));
        let mut floor_row = vec!["hit ×floor".to_string(), r.size.to_string(), String::new()];
        floor_row.extend(Table::floor_cells(&r.hit.summary(), sf.floor.ns));
        let (n0, rss0) = *first.get_or_insert((r.size, r.rss_filled));
        memory.row(vec![
            r.size.to_string(),
            format!("{:.1}", r.rss_open as f64 / (1 << 20) as f64),
            format!("{:.1}", r.rss_filled as f64 / (1 << 20) as f64),
            if r.size > n0 {
                let grown = r.rss_filled.saturating_sub(rss0) as f64;
                format!("{:.0}", grown / (r.size - n0) as f64)
            } else {
                "-".to_string()
            },
            r.not_inline.to_string(),
        ]);
        for (what, h) in [
            ("hit resolve()", &r.hit),
            ("miss resolve() call", &r.miss_call),
            ("miss until answer", &r.miss_answer),
        ] {
            let s = h.summary();
            let mut row = vec![what.to_string(), r.size.to_string(), s.count.to_string()];
            row.extend(Table::latency_cells(&s));
            table.row(row);
            let is_hit = std::ptr::eq(h, &r.hit);
            if is_hit {
                table.row(floor_row.clone());
            }
            if let Some(out) = &args.run.out {
                let f = out.join(format!(
                    "provider-acmrs-{}-{}.hgrm",
                    what.replace([' ', '(', ')'], ""),
                    r.size
                ));
                h.write_hgrm(&f).expect("write .hgrm");
                let svg = f.with_extension("svg");
                let title = format!(
                    "acmrs alone (fake core, instant SA): {what}, {} cached paths",
                    r.size
                );
                let mut series = vec![Series {
                    label: "acmrs",
                    histogram: h,
                }];
                if is_hit {
                    series.push(Series {
                        label: "memory floor (1 dependent load)",
                        histogram: &sf.floor.per_load,
                    });
                }
                if let Err(e) = write_percentile_svg(&svg, &title, &series) {
                    eprintln!("warning: cannot write {}: {e}", svg.display());
                }
            }
        }
    }
    println!(
        "## acmrs in-process (fake core, instant SA)\n\n{}\n\
         hit: resolve() called → its answer handed to the core (acm_resolve_response), as the \
         same-host bench times it; miss: the call's duration, and the call → the answer. \
         `hit ×floor`: the hit's percentiles over the memory floor measured after it.\n\n{}\n\n\
         acmrs_path_capacity = cached paths (at least 1024): the cache full at its design load. \
         The cache storage is resident from open on (the rest of an open, the request and \
         pending rings, is the same at every size), so the memory a cached path costs is the \
         RSS growth from the first size to a larger one, divided by the paths added.\n\n{}",
        table.render(),
        floors.join("\n"),
        memory.render()
    );
}
