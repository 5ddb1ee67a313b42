//! The same-host benchmark end to end on a small simulated fabric: stock libibacmp and
//! libacmrs loaded in one process, real OpenSM answering the misses; and the same benchmark
//! stopped by SIGTERM while its measuring child runs. Needs root (ibsim, umad2sim), `cargo
//! build -p acm-plugin -p simverbs` in the same profile, and the Debian packages ibacm,
//! ibsim-utils, opensm, libumad2sim0, libibumad-dev, libibverbs-dev, a C compiler. The two
//! tests take turns (one fabric at a time on a 2-core machine).

use acm_fabric::testing::{processes_on_fabric, wait_fabric_gone};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn need_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test starts ibsim/OpenSM and needs root"
    );
}

/// Held by each test for its whole run.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A fresh scratch directory for one test, removed also when an assertion fails.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("acm-bench-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every table row of `out`, split into its trimmed cells (the first and last are empty).
fn table_rows(out: &str) -> Vec<Vec<&str>> {
    out.lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| l.split('|').map(str::trim).collect())
        .collect()
}

/// The table rows of `out` whose first cell is `what`.
fn cell_rows<'a>(out: &'a str, what: &str) -> Vec<Vec<&'a str>> {
    table_rows(out)
        .into_iter()
        .filter(|c| c.get(1) == Some(&what))
        .collect()
}

#[test]
fn stock_and_acmrs_in_one_process_on_one_fabric() {
    need_root();
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new("samehost");
    let scratch = dir.0.clone();
    let out_dir = scratch.join("hgrm");
    let mut bench = Command::new(env!("CARGO_BIN_EXE_provider"));
    bench
        .args(["--quick", "--sizes", "1000", "--hit-samples", "500"])
        .args(["--topology", "fattree:2,2,4", "--out"])
        .arg(&out_dir)
        .current_dir(&scratch);
    // Its output goes to files (no pipe to fill); past the limit it gets SIGTERM, on which it
    // tears its fabric down, and the failure shows what every process of it was doing.
    let o = acm_fabric::process::run_with_timeout(
        "provider bench",
        bench,
        Duration::from_secs(150),
        &scratch,
    )
    .expect("run the provider benchmark");
    let stdout = o.stdout.clone();
    let fabric = stdout
        .lines()
        .find_map(|l| l.strip_prefix("fabric name: "))
        .map(|f| f.trim().to_string());
    // No process of the benchmark's fabric survives (ibsim, OpenSM, the measuring child),
    // whether it finished or was stopped.
    if let Some(f) = &fabric {
        let left = wait_fabric_gone(|n| n == f, Duration::from_secs(10));
        assert!(left.is_empty(), "{f} left {left:?}\n{o}");
    }
    assert!(!o.timed_out, "benchmark hung\n{o}");
    assert!(o.success(), "benchmark failed:\n{o}");
    // Busy mode on a CPU of its own (the default on 2 CPUs or more): the child checked that
    // the worker is pinned to it alone and moved everything else off it.
    if acm_bench::online_cpus() >= 2 {
        let last = acm_bench::online_cpus() - 1;
        assert!(
            stdout.contains(&format!(
                "acmrs's worker alone on CPU {last} (acmrs_cpu {last})"
            )),
            "{stdout}"
        );
    }
    // Every hit answered from the caches (no SA traffic), every miss answered by OpenSM.
    assert!(stdout.contains("SA MADs during hits: 0"), "{stdout}");
    assert!(
        stdout.contains("failed misses: stock 0, acmrs 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("answered without an SA query: stock 0, acmrs 0"),
        "{stdout}"
    );
    // 2x2x4 fat-tree: 8 HCAs + 4 switches = 12 LIDs; all but the bench's own are misses by
    // LID, then the same 11 by GID: one SA PathRecord per miss and provider.
    assert!(stdout.contains("during misses: 44;"), "{stdout}");
    assert!(stdout.contains("### 1000 cached paths"), "{stdout}");
    // Both answer a hit synchronously, inside resolve() (so call -> answer is call latency).
    assert!(
        stdout.contains("hits answered inside resolve(): stock 500, acmrs 500"),
        "{stdout}"
    );
    for (what, count) in [
        ("hit", "500"),
        ("miss by LID (OpenSM SA)", "11"),
        ("miss by GID (OpenSM SA)", "11"),
        ("miss, provider's own time", "22"),
    ] {
        let rows = cell_rows(&stdout, what);
        // The hit also has the bound: one line of acmrs-sized memory read alone between the
        // hits, and stock's time over it.
        let bound = what == "hit";
        assert_eq!(rows.len(), if bound { 5 } else { 3 }, "{what}: {stdout}");
        if bound {
            assert_eq!(rows[3][2], "one line alone");
            assert_eq!(rows[3][3], count);
            assert!(rows[3][4].parse::<f64>().unwrap() > 0.0, "{:?}", rows[3]);
            assert_eq!(rows[4][2], "ratio stock/line alone");
            assert!(rows[4][4].ends_with('x'), "{:?}", rows[4]);
        }
        for (row, prov) in rows.iter().zip(["stock", "acmrs"]) {
            assert_eq!(row[2], prov);
            assert_eq!(row[3], count, "{what} {prov}");
            let p50: f64 = row[4].parse().unwrap();
            assert!(p50 > 0.0, "{what} {prov} p50 {p50}");
        }
        assert_eq!(rows[2][2], "ratio stock/acmrs");
        assert!(rows[2][4].ends_with('x'), "{:?}", rows[2]);
    }
    // The provider's own share of a miss excludes the SA round trip: below the whole miss.
    let own = cell_rows(&stdout, "miss, provider's own time");
    let lid = cell_rows(&stdout, "miss by LID (OpenSM SA)");
    for k in 0..2 {
        let (o, l): (f64, f64) = (own[k][4].parse().unwrap(), lid[k][4].parse().unwrap());
        assert!(o < l, "{}: own {o} vs whole miss {l}\n{stdout}", own[k][2]);
    }
    for f in [
        "samehost-stock-hit-1000.hgrm",
        "samehost-acmrs-hit-1000.hgrm",
        "samehost-line-alone-hit-1000.hgrm",
        "samehost-stock-miss-lid-1000.hgrm",
        "samehost-acmrs-miss-lid-1000.hgrm",
        "samehost-stock-miss-gid-1000.hgrm",
        "samehost-acmrs-miss-gid-1000.hgrm",
    ] {
        let text = std::fs::read_to_string(out_dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(text.contains("Percentile"), "{f}");
    }
    isolated_misses_in_every_mode_and_transport(&stdout, &out_dir);
    assert!(fabric.is_some(), "no fabric name line\n{o}");
}

/// The isolated-miss report: one section per poll mode and acmrs SA transport, every miss of
/// both providers answered with an SA MAD of its own, and acmrs on `ud` measured against the
/// bare UD transport with its own per-miss SA round trip.
fn isolated_misses_in_every_mode_and_transport(stdout: &str, out_dir: &std::path::Path) {
    let sections: Vec<&str> = stdout.split("### isolated misses, ").skip(1).collect();
    let mut seen = Vec::new();
    for s in &sections {
        let head = s.lines().next().unwrap_or_default();
        let field = |k: &str| {
            head.split(k)
                .nth(1)
                .and_then(|r| r.split([',', ' ']).next())
                .unwrap_or_default()
                .to_string()
        };
        let (mode, sa) = (field("acmrs_poll_mode "), field("acmrs_sa_transport "));
        seen.push(format!("{mode}/{sa}"));
        // Counts: provider | form | timed | failed | without SA MAD.
        let counts: Vec<Vec<&str>> = table_rows(s)
            .into_iter()
            .filter(|c| c.len() == 7 && ["stock", "acmrs"].contains(&c[1]))
            .collect();
        assert_eq!(counts.len(), 6, "{mode}/{sa}: {s}");
        for c in &counts {
            let timed: usize = c[3].parse().unwrap();
            assert!(timed >= 200, "{mode}/{sa} {c:?}");
            assert_eq!((c[4], c[5]), ("0", "0"), "{mode}/{sa} {c:?}\n{s}");
        }
        // Each provider against the bare transport of its own path.
        let pa: Vec<Vec<&str>> = table_rows(s)
            .into_iter()
            .filter(|c| c.get(1).is_some_and(|f| ["lid", "gid"].contains(f)))
            .collect();
        assert_eq!(pa.len(), 2, "{mode}/{sa}: {s}");
        let via = if sa == "ud" { "UD QP" } else { "umad" };
        for r in &pa {
            assert!(r[2].contains(", umad ("), "{mode}/{sa} {r:?}");
            assert!(r[4].contains(&format!(", {via} (")), "{mode}/{sa} {r:?}");
        }
        // acmrs's SA round trip inside each miss: on `ud` its own, per miss; below its end to
        // end, and there is one per timed miss.
        let row = |what: &str| {
            cell_rows(s, &format!("lid: {what}"))
                .into_iter()
                .find(|r| r[2] == "acmrs")
                .unwrap_or_else(|| panic!("{mode}/{sa}: no acmrs row {what}\n{s}"))
        };
        let (e2e, rtt) = (
            row("end to end"),
            row("SA round trip inside the miss (send → reply)"),
        );
        assert_eq!(e2e[3], rtt[3], "{mode}/{sa}");
        let (e, r): (f64, f64) = (e2e[4].parse().unwrap(), rtt[4].parse().unwrap());
        assert!(
            0.0 < r && r < e,
            "{mode}/{sa}: SA round trip {r} vs end to end {e}"
        );
        // The host core's SA stamps exist for stock only on `ud`.
        let legs = cell_rows(s, "lid: leg: resolve() entry → SA send");
        assert_eq!(legs.len(), if sa == "ud" { 1 } else { 2 }, "{mode}/{sa}");
        let tag = if sa == "ud" {
            format!("{mode}-ud")
        } else {
            mode.clone()
        };
        let f = out_dir.join(format!("misses-acmrs-lid-e2e-{tag}.hgrm"));
        assert!(f.exists(), "{}", f.display());
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "adaptive/core",
            "adaptive/ud",
            "busy/core",
            "busy/ud",
            "event/core",
            "event/ud"
        ],
        "{stdout}"
    );
}

/// Kills the benchmark by PID if the test fails before it stopped.
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Command lines of the processes on `fabric`.
fn processes_of(fabric: &str) -> Vec<String> {
    processes_on_fabric(|f| f == fabric)
        .into_iter()
        .map(|(_, cmd)| cmd)
        .collect()
}

/// Polls `f` every 50 ms for up to `limit`.
fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_takes_the_fabric_and_the_measuring_child_down() {
    need_root();
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new("samehost-stop");
    let scratch = dir.0.clone();
    let out = scratch.join("stdout");
    let child = Command::new(env!("CARGO_BIN_EXE_provider"))
        .args(["--quick", "--sizes", "1000", "--hit-samples", "500"])
        .args(["--topology", "fattree:2,2,4"])
        .current_dir(&scratch)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the provider benchmark");
    let mut g = Guard(child);
    let fabric = wait_for(Duration::from_secs(60), || {
        let text = std::fs::read_to_string(&out).ok()?;
        let f = text.lines().find_map(|l| l.strip_prefix("fabric name: "))?;
        Some(f.trim().to_string())
    })
    .expect("the benchmark names its fabric");
    // The measuring child is up, with ibsim and OpenSM.
    let during = wait_for(Duration::from_secs(60), || {
        let p = processes_of(&fabric);
        p.iter()
            .any(|c| c.contains("samehost-miss-child"))
            .then_some(p)
    })
    .unwrap_or_else(|| {
        panic!(
            "no measuring child on {fabric}: {:?}",
            processes_of(&fabric)
        )
    });
    assert!(during.iter().any(|c| c.starts_with("ibsim")), "{during:?}");
    assert!(during.iter().any(|c| c.contains("opensm")), "{during:?}");
    // SAFETY: kill on the PID of our unreaped child.
    assert_eq!(unsafe { libc::kill(g.0.id() as i32, libc::SIGTERM) }, 0);
    let status = wait_for(Duration::from_secs(20), || g.0.try_wait().ok().flatten())
        .expect("the benchmark exits on SIGTERM");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
    let left = wait_fabric_gone(|f| f == fabric, Duration::from_secs(10));
    assert!(left.is_empty(), "{fabric} left {left:?}");
}
