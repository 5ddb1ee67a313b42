//! A port really going down and up on the simulated fabric (ibsim `Unlink` / `ReLink` through
//! its console), seen by the real ibacm core through simverbs' port monitor, with Debian's
//! unmodified `libibacmp.so` as the provider; plus the `acm-fabric script` multi-command CLI.
//!
//! Needs root, ibsim-utils, opensm, infiniband-diags, ibacm, libumad2sim0, and
//! `libsimverbs.so` built into the same target directory (`cargo build -p simverbs`).

use acm_fabric::{Fabric, Provider, Topology};
use std::time::{Duration, Instant};

const VERIFIED: &str = "SA verification: success";

/// Waits until `pred(log)` holds for `node`'s daemon log.
fn wait_log(f: &Fabric, node: &str, what: &str, pred: impl Fn(&str) -> bool) {
    let t0 = Instant::now();
    loop {
        let log = f.node(node).unwrap().log();
        if pred(&log) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{node}: no {what} in its log within 15 s\n{}",
            f.logs_report()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn stock_ibacmp_port_down_closes_and_port_up_resolves_again() {
    let f = Fabric::builder(
        Topology::example("net.2sw2path4hca").unwrap(),
        ["Hca3", "Hca4"],
    )
    .provider(Provider::Stock)
    .name_prefix("port-stock")
    .option("timeout", "300")
    .option("retries", "1")
    .subnet_timeout(8)
    .start()
    .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let (l3, l4) = (
        f.node("Hca3").unwrap().lid.to_string(),
        f.node("Hca4").unwrap().lid.to_string(),
    );
    let args = ["-f", "l", "-s", &l3, "-d", &l4, "-v"];
    let w = Duration::from_secs(15);
    let first = f
        .node("Hca3")
        .unwrap()
        .acme_until(&args, w, |o| o.stdout.contains(VERIFIED))
        .unwrap();
    assert!(
        first.stdout.contains(VERIFIED),
        "{first}\n{}",
        f.logs_report()
    );
    let pi = f.port_info("Hca3").unwrap();
    assert_eq!(pi.state, "Active", "{pi:?}");

    // Down: ibsim unlinks the cable; the port really reads Down, and the core (which
    // re-queries the port before believing PORT_ERR) runs its close sequence.
    f.port_down("Hca3").unwrap();
    let pi = f.port_info("Hca3").unwrap();
    assert_eq!(
        (pi.state.as_str(), pi.phys_state.as_str()),
        ("Down", "Polling")
    );
    wait_log(&f, "Hca3", "port down", |l| {
        l.contains("processing async event port error")
            && l.contains("acm_port_down: ibsim0 1 is down")
    });
    let log = f.node("Hca3").unwrap().log();
    assert!(
        !log.contains("acm_port_down: port active"),
        "the core must not see the port ACTIVE:\n{log}"
    );
    // Resolution from the down port is refused (the endpoint is gone), promptly.
    let t0 = Instant::now();
    let down = f.node("Hca3").unwrap().acme(&args).unwrap();
    assert!(
        !down.success() && !down.timed_out && t0.elapsed() < Duration::from_secs(10),
        "resolution on a down port: {down}"
    );
    // The SA no longer knows Hca3 (OpenSM dropped the port): from Hca4 there is no path.
    let from4 = f
        .node("Hca4")
        .unwrap()
        .acme(&["-f", "l", "-s", &l4, "-d", &l3])
        .unwrap();
    assert!(!from4.success(), "path to a down port: {from4}");

    // Up: ReLink, OpenSM brings it ACTIVE, simverbs raises PORT_ACTIVE, the core reopens the
    // port, and resolution with SA verification works again.
    let ups_before = log.matches("acm_port_up: ibsim0 1").count();
    let pi = f.port_up("Hca3").unwrap();
    assert_eq!(
        pi.lid.to_string(),
        l3,
        "OpenSM keeps the LID of a known GUID"
    );
    wait_log(&f, "Hca3", "port up", |l| {
        l.contains("processing async event port active")
            && l.matches("acm_port_up: ibsim0 1").count() > ups_before
    });
    let again = f
        .node("Hca3")
        .unwrap()
        .acme_until(&args, w, |o| o.stdout.contains(VERIFIED))
        .unwrap();
    assert!(
        again.stdout.contains(VERIFIED),
        "{again}\n{}",
        f.logs_report()
    );
    let back = f
        .node("Hca4")
        .unwrap()
        .acme_until(&["-f", "l", "-s", &l4, "-d", &l3, "-v"], w, |o| {
            o.stdout.contains(VERIFIED)
        })
        .unwrap();
    assert!(
        back.stdout.contains(VERIFIED),
        "{back}\n{}",
        f.logs_report()
    );

    // Misuse is a clear error, not a hang: unlinking a port twice, relinking a linked one.
    f.port_down("Hca4").unwrap();
    let e = f.port_down("Hca4").unwrap_err().to_string();
    assert!(e.contains("not linked"), "{e}");
    f.port_up("Hca4").unwrap();
    let e = f.port_up("Hca4").unwrap_err().to_string();
    assert!(e.contains("refused to relink"), "{e}");
    let e = f.port_down("Switch1").unwrap_err().to_string();
    assert!(e.contains("not an HCA"), "{e}");
    assert!(f.ibsim_command("Unlink \"Hca4\"[1]\nReLink").is_err());
}

#[test]
fn cli_script_runs_several_steps_on_one_bring_up() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let exe = env!("CARGO_BIN_EXE_acm-fabric");
    // A bad script is refused before anything starts (exit 2, no fabric summary).
    let bad = Command::new(exe)
        .args(["script", "--nodes", "Hca3,Hca4", "--cmd", "Hca2 -e"])
        .output()
        .unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&bad.stdout),
        String::from_utf8_lossy(&bad.stderr),
    );
    assert_eq!(bad.status.code(), Some(2), "{so}\n{se}");
    assert!(se.contains("line 1") && se.contains("Hca2"), "{se}");
    assert!(!so.contains("fabric "), "nothing may start: {so}");

    // One bring-up, six steps: `--cmd` first, then stdin; step 4 fails (port down), the
    // others succeed, so the exit status is 1 and the summary says which.
    let script = "\
# resolve, take Hca3's link down, fail, bring it up, resolve again
Hca4 -f n -s hca4 -d hca3 -v
port-down Hca3
Hca3 -f l -s {Hca3.lid} -d {Hca4.lid}
port-up Hca3
Hca3: -f l -s {Hca3.lid} -d {Hca4.lid} -v
";
    let mut child = Command::new(exe)
        .args([
            "script",
            "--nodes",
            "Hca3,Hca4",
            "--name-prefix",
            "port-script",
        ])
        .args(["--opt", "timeout=300", "--opt", "retries=1", "--retry", "3"])
        .args(["--cmd", "Hca3: -f l -s {Hca3.lid} -d {Hca4.lid} -v", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{so}\n{se}");
    assert!(so.contains("6 step(s), 1 failed"), "{so}");
    assert!(so.contains("^^^ step 4 FAILED"), "{so}");
    assert_eq!(so.matches("^^^ step").count(), 1, "{so}");
    assert_eq!(so.matches(VERIFIED).count(), 3, "{so}");
    // Placeholders were expanded (Hca3 = LID 5, Hca4 = LID 6 on this topology).
    assert!(so.contains("$ [Hca3] ib_acme -f l -s 5 -d 6 -v"), "{so}");
    assert!(
        so.contains("$ port-down Hca3") && so.contains("$ port-up Hca3"),
        "{so}"
    );
    assert!(so.contains("Hca3 port 1: Active lid 5"), "{so}");
    // A failed step prints every node's daemon log (and OpenSM's) on stderr.
    for node in ["Hca3", "Hca4"] {
        assert!(
            se.contains(&format!("---- {node} ibacm.log (tail) ----")),
            "{se}"
        );
    }
    assert!(se.contains("---- OpenSM log 1 (tail) ----"), "{se}");
}
