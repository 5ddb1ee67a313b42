//! Hosts of several CAs and ports and a second subnet, through the CLI a person types
//! (`--host`, `--subnet`, the `@PORT` placeholders and steps) and the builder's refusals.
//! The behaviour of acmrs and stock on these hosts is in acm-plugin/tests/real_ibacm_hosts.rs.

use acm_fabric::checks::require_root;
use acm_fabric::{Fabric, HostSpec, SubnetSpec, Topology};
use std::process::Command;

const VERIFIED: &str = "SA verification: success";

fn cli(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_acm-fabric"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The main job's hosts step (scripts/main-hosts.script): two HCAs, a dual-port HCA across
/// two subnets and a dual-port HCA on one, stock and acmrs mixed, no hosts file: one bring-up,
/// every step passes, the placeholders of each port are expanded, every process is gone
/// afterwards.
#[test]
fn cli_script_on_hosts_of_several_ports_and_two_subnets() {
    require_root();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/main-hosts.script"
    );
    let (code, so, se) = cli(&[
        "script",
        "--topology",
        "fattree:2,1,4",
        "--sm-node",
        "Hca1",
        "--nodes",
        "Hca2,Hca3,Hca4",
        "--provider",
        "Hca2=stock,Hca3=acmrs,Hca4=acmrs",
        "--host",
        "Hca2=Hca2,Hca6",
        "--host",
        "Hca3=Hca3+s2:Hca3",
        "--host",
        "Hca4=Hca4+Hca7",
        "--subnet",
        "s2=net.2sw2path4hca@Hca1",
        "--hosts-file",
        "none",
        "--name-prefix",
        "hosts-cli",
        "--retry",
        "10",
        script,
    ]);
    assert_eq!(code, Some(0), "{so}\n{se}");
    assert!(so.contains("14 step(s), 0 failed"), "{so}");
    // The summary lists each port of a host: its place, CA and port, node, subnet.
    assert!(so.contains("@2 ibsim0:2 Hca3   s2"), "{so}");
    assert!(so.contains("@2 ibsim1:1 Hca6   main"), "{so}");
    // {Hca3.gid@2} is on s2's prefix; {Hca4.name@2} is hca4-p2.
    assert!(so.contains("-d fec0::2:0:0:10:7 -v"), "{so}");
    assert!(so.contains("-s hca4-p2 -d hca2 -v"), "{so}");
    assert!(so.contains("Hca4@2: Active lid"), "{so}");
    assert!(so.matches(VERIFIED).count() >= 7, "{so}");
    let left = acm_fabric::testing::processes_on_fabric(|n| n.starts_with("hosts-cli"));
    assert!(left.is_empty(), "left running: {left:?}");
}

/// What a person can get wrong, refused with the reason, before anything runs.
#[test]
fn bad_hosts_and_subnets_are_refused_with_the_reason() {
    require_root();
    let t = || Topology::parse("fattree:2,1,4").unwrap();
    let s2 = || SubnetSpec::parse("s2=net.2sw2path4hca@Hca1").unwrap();
    let cases: Vec<(acm_fabric::FabricBuilder, &str)> = vec![
        (
            Fabric::builder(t(), ["Hca2"]).host("Hca2", HostSpec::parse("Hca3+Hca2").unwrap()),
            "first port must be Hca2",
        ),
        (
            Fabric::builder(t(), ["Hca2"]).host("Hca2", HostSpec::parse("Hca2+s9:Hca3").unwrap()),
            "no subnet \"s9\"",
        ),
        (
            Fabric::builder(t(), ["Hca2"])
                .sm_node("Hca1")
                .host("Hca2", HostSpec::parse("Hca2+Hca1").unwrap()),
            "SM node",
        ),
        (
            Fabric::builder(t(), ["Hca2"]).host("Hca2", HostSpec::parse("Hca2+Hca99").unwrap()),
            "is not an HCA",
        ),
        (
            Fabric::builder(t(), ["Hca2", "Hca3"])
                .host("Hca2", HostSpec::parse("Hca2+Hca5").unwrap())
                .host("Hca3", HostSpec::parse("Hca3+Hca5").unwrap()),
            "already a port of a host",
        ),
        (
            Fabric::builder(t(), ["Hca2", "Hca3"])
                .host("Hca2", HostSpec::parse("Hca2+Hca3").unwrap()),
            "runs a daemon of its own",
        ),
        (
            Fabric::builder(Topology::parse("fattree:2,1,8").unwrap(), ["Hca2", "Hca3"])
                .sm_node("Hca1")
                .host("Hca2", HostSpec::parse("Hca2+Hca4+Hca5+Hca6+Hca7").unwrap())
                .host(
                    "Hca3",
                    HostSpec::parse("Hca3,Hca8+Hca9,Hca10+Hca11").unwrap(),
                ),
            "10 daemon ports on the main subnet",
        ),
        (
            Fabric::builder(t(), ["Hca2"])
                .subnet(s2())
                .host("Hca2", HostSpec::parse("Hca2+s2:Hca1").unwrap()),
            "s2's SM node",
        ),
        (
            Fabric::builder(t(), ["Hca2"]).host("Hca4", HostSpec::parse("Hca4").unwrap()),
            "runs no daemon",
        ),
    ];
    for (b, why) in cases {
        let e = b.start().expect_err("refused").to_string();
        assert!(e.contains(why), "want {why:?}, got: {e}");
    }
    let (code, _, se) = cli(&["up", "--host", "Hca3", "--nodes", "Hca3"]);
    assert_eq!(code, Some(2), "{se}");
    assert!(se.contains("NODE=SPEC"), "{se}");
    let (code, _, se) = cli(&["up", "--subnet", "s2=nosuch.net"]);
    assert_eq!(code, Some(2), "{se}");
}
