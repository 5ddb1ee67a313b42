//! No stray processes, ever: after a panic with a live fabric, after SIGTERM to `acm-fabric up`
//! while it serves, and after SIGTERM in the middle of its bring-up. Also the CLI's `run`.

use acm_fabric::{live_process_groups, pid_exists, testing, Fabric, Topology};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// PIDs of the processes on fabrics whose name starts with `prefix`.
fn processes_on_fabric(prefix: &str) -> Vec<i32> {
    testing::processes_on_fabric(|f| f.starts_with(prefix))
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

fn wait_gone(prefix: &str, timeout: Duration) -> Vec<i32> {
    testing::wait_fabric_gone(|f| f.starts_with(prefix), timeout)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

#[test]
fn panic_with_a_live_fabric_stops_everything() {
    let mut pids = Vec::new();
    let mut scratch = None;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let f = Fabric::builder(
            Topology::example("net.2sw2path4hca").unwrap(),
            ["Hca2", "Hca3"],
        )
        .name_prefix("teardown-panic")
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
        pids = f.pids();
        scratch = Some(f.scratch().to_path_buf());
        assert_eq!(pids.len(), 4, "ibsim, OpenSM, 2 daemons: {pids:?}");
        panic!("deliberate panic with a live fabric");
    }));
    let err = result.expect_err("the closure panics");
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(msg.contains("deliberate"), "unexpected panic: {msg}");
    assert_eq!(pids.len(), 4);
    for p in &pids {
        assert!(!pid_exists(*p), "process {p} survived the panic");
        assert!(!live_process_groups().contains(p));
    }
    assert!(!scratch.unwrap().exists());
    let prefix = format!("teardown-panic-{}-", std::process::id());
    assert!(processes_on_fabric(&prefix).is_empty());
}

#[test]
fn cli_run_resolves_and_cleans_up() {
    let prefix = "teardown-clirun";
    let out = Command::new(env!("CARGO_BIN_EXE_acm-fabric"))
        .args([
            "run",
            "--name-prefix",
            prefix,
            "--nodes",
            "Hca3,Hca4",
            "--on",
            "Hca3",
        ])
        .args(["--until", "SA verification: success", "--"])
        .args(["-f", "n", "-s", "hca3", "-d", "hca4", "-v"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("SA verification: success"),
        "{}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(processes_on_fabric(prefix).is_empty());
    // A failing command gives a failing exit status (and the logs on stderr).
    let out = Command::new(env!("CARGO_BIN_EXE_acm-fabric"))
        .args(["run", "--name-prefix", prefix, "--on", "Hca9", "--", "-e"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Hca9"));
    assert!(processes_on_fabric(prefix).is_empty());
}

fn sigterm(pid: u32) {
    // SAFETY: plain kill(2) of our own child.
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
}

#[test]
fn cli_up_sigterm_while_serving_and_during_bring_up() {
    // 1. While serving: a graceful teardown.
    let mut child = Command::new(env!("CARGO_BIN_EXE_acm-fabric"))
        .args(["up", "--name-prefix", "teardown-up", "--nodes", "Hca2,Hca4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let prefix = format!("teardown-up-{}-", child.id());
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    let mut scratch = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("fabric ") {
            if let Some(i) = rest.find(", scratch ") {
                scratch = Some(std::path::PathBuf::from(&rest[i + 10..]));
            }
        }
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("fabric is up") {
            break;
        }
    }
    assert!(seen.contains("fabric is up"), "{seen}");
    let running = processes_on_fabric(&prefix);
    assert!(
        running.len() >= 4,
        "ibsim, OpenSM, 2 daemons: {running:?}\n{seen}"
    );
    // None of them inherited the CLI's blocked signals (its signal thread blocks SIGINT,
    // SIGTERM, SIGHUP): a SIGTERM stops ibsim and OpenSM, a SIGHUP makes OpenSM re-read.
    for pid in &running {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let blocked = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap_or(u64::MAX));
        assert!(
            matches!(blocked, Some(0) | None),
            "pid {pid} starts with signals blocked:\n{status}"
        );
    }
    sigterm(child.id());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(
        wait_gone(&prefix, Duration::from_secs(5)),
        Vec::<i32>::new()
    );
    let scratch = scratch.expect("summary names the scratch directory");
    assert!(!scratch.exists(), "{}", scratch.display());

    // 2. During bring-up (OpenSM and daemons starting): the emergency teardown.
    let mut child = Command::new(env!("CARGO_BIN_EXE_acm-fabric"))
        .args([
            "up",
            "--name-prefix",
            "teardown-early",
            "--nodes",
            "Hca2,Hca4",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let prefix = format!("teardown-early-{}-", child.id());
    // Wait until something of the fabric runs, then interrupt.
    let deadline = Instant::now() + Duration::from_secs(20);
    while processes_on_fabric(&prefix).len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !processes_on_fabric(&prefix).is_empty(),
        "bring-up never started"
    );
    sigterm(child.id());
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "interrupted bring-up should fail: {status}"
    );
    assert_eq!(
        wait_gone(&prefix, Duration::from_secs(5)),
        Vec::<i32>::new()
    );
    let dir = std::env::temp_dir().join(format!("teardown-early-{}-0", child.id()));
    assert!(!dir.exists(), "{}", dir.display());
}
