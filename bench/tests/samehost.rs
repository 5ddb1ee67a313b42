//! The same-host benchmark end to end on a small simulated fabric: stock libibacmp and
//! libacmrs loaded in one process, real OpenSM answering the misses. Needs root (ibsim,
//! umad2sim), `cargo build -p acm-plugin -p simverbs` in the same profile, and the Debian
//! packages ibacm, ibsim-utils, opensm, libumad2sim0, libibumad-dev, libibverbs-dev, a C
//! compiler.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the benchmark by PID if the test fails or times out.
struct Guard(Option<std::process::Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Removes the test's scratch directory, also when an assertion fails.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// PIDs of processes whose environment has `IBSIM_SOCKNAME=<fabric>`.
fn processes_of(fabric: &str) -> Vec<String> {
    let needle = format!("IBSIM_SOCKNAME={fabric}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read(e.path().join("environ"))
                .map(|b| b.split(|&c| c == 0).any(|v| v == needle.as_bytes()))
                .unwrap_or(false)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn cell_rows<'a>(out: &'a str, what: &str) -> Vec<Vec<&'a str>> {
    out.lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|c| c.get(1) == Some(&what))
        .collect()
}

#[test]
fn stock_and_acmrs_in_one_process_on_one_fabric() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test starts ibsim/OpenSM and needs root"
    );
    let scratch = std::env::temp_dir().join(format!("acm-bench-samehost-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let _scratch = Scratch(scratch.clone());
    let out_dir = scratch.join("hgrm");
    let child = Command::new(env!("CARGO_BIN_EXE_provider"))
        .args(["--quick", "--sizes", "1000", "--hit-samples", "500"])
        .args(["--topology", "fattree:2,2,4", "--out"])
        .arg(&out_dir)
        .current_dir(&scratch)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the provider benchmark");
    let mut g = Guard(Some(child));
    let t0 = Instant::now();
    while g.0.as_mut().unwrap().try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(120), "benchmark hung");
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = g.0.take().unwrap().wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "benchmark failed:\n{stdout}\n{stderr}");
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
        assert!(o < l, "{}: own {o} vs whole miss {l}", own[k][2]);
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
    // No process of the benchmark's fabric survives (ibsim, OpenSM, the measuring child).
    let fabric = stdout
        .lines()
        .find_map(|l| l.strip_prefix("fabric name: "))
        .expect("fabric name line")
        .trim()
        .to_string();
    assert!(processes_of(&fabric).is_empty(), "{fabric} left processes");
}
