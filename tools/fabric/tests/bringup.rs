//! ibsim + OpenSM bring-up and teardown, without ibacm daemons (no simverbs needed).

use acm_fabric::{pid_exists, Fabric, Topology};

#[test]
fn sm_assigns_lids_and_teardown_leaves_nothing() {
    let fabric = Fabric::builder(
        Topology::example("net.2sw2path4hca").unwrap(),
        ["Hca3", "Hca4"],
    )
    .name_prefix("bringup")
    .start_daemons(false)
    .start()
    .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    assert_eq!(fabric.sm_node(), "Hca1");
    // The LIDs OpenSM gives this topology (docs/fabric.md): Hca3=5, Hca4=6.
    let hca3 = fabric.node("Hca3").unwrap();
    let hca4 = fabric.node("Hca4").unwrap();
    assert_eq!((hca3.lid, hca4.lid), (5, 6));
    assert_eq!(hca3.gid.to_string(), "fe80::10:7");
    assert_eq!(hca4.gid.to_string(), "fe80::10:a");
    // The SA answers a PathRecord query between them.
    let pr = fabric
        .run_tool("Hca3", "saquery", &["-p", "--src-to-dst", "5:6"])
        .unwrap();
    assert!(pr.success(), "{pr}");
    assert!(pr.stdout.contains("dlid....................6\n"), "{pr}");
    assert!(
        pr.stdout.contains("dgid....................fe80::10:a\n"),
        "{pr}"
    );

    let pids = fabric.pids();
    assert_eq!(pids.len(), 2, "ibsim and OpenSM: {pids:?}");
    assert!(pids.iter().all(|p| pid_exists(*p)));
    let scratch = fabric.scratch().to_path_buf();
    assert!(scratch.is_dir());
    drop(fabric);
    for p in pids {
        assert!(!pid_exists(p), "process {p} survived the teardown");
    }
    assert!(!scratch.exists(), "{} was not removed", scratch.display());
}

#[test]
fn fat_tree_comes_up_and_sm_restarts() {
    let mut fabric = Fabric::builder(Topology::fat_tree(2, 2, 2).unwrap(), ["Hca2", "Hca4"])
        .name_prefix("fattree")
        .start_daemons(false)
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let (a, b) = (
        fabric.node("Hca2").unwrap().lid,
        fabric.node("Hca4").unwrap().lid,
    );
    assert!(a != 0 && b != 0 && a != b);
    // A path across the spines exists.
    let pr = fabric
        .run_tool(
            "Hca2",
            "saquery",
            &["-p", "--src-to-dst", &format!("{a}:{b}")],
        )
        .unwrap();
    assert!(pr.success() && pr.stdout.contains("PathRecord"), "{pr}");

    let old_sm = fabric.pids()[1];
    fabric.stop_sm();
    assert!(!fabric.sm_running());
    assert!(!pid_exists(old_sm));
    fabric.start_sm().unwrap();
    assert!(fabric.sm_running());
    let out = fabric.run_tool("Hca1", "sminfo", &[]).unwrap();
    assert!(out.stdout.contains("SMINFO_MASTER"), "{out}");
}

#[test]
fn bad_configurations_are_clear_errors() {
    let t = Topology::example("net.2sw2path4hca").unwrap();
    let e = Fabric::builder(t.clone(), ["Hca9"])
        .start()
        .unwrap_err()
        .to_string();
    assert!(e.contains("Hca9") && e.contains("not an HCA"), "{e}");
    let e = Fabric::builder(t.clone(), ["Hca1", "Hca2", "Hca3", "Hca4"])
        .start()
        .unwrap_err()
        .to_string();
    assert!(e.contains("OpenSM"), "{e}");
    let e = Fabric::builder(t.clone(), ["Hca2", "Hca2"])
        .start()
        .unwrap_err()
        .to_string();
    assert!(e.contains("twice"), "{e}");
    let e = Fabric::builder(t, ["Hca2"])
        .subnet_timeout(32)
        .start()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("subnet timeout 32") && e.contains("0..=31"),
        "{e}"
    );
}

/// A node process killed without telling ibsim keeps its client slot until
/// `reap_dead_clients` frees it (ibsim has 10); the live ones (OpenSM's) are left alone.
#[test]
fn dead_ibsim_clients_are_reaped_and_live_ones_kept() {
    let fabric = Fabric::builder(
        Topology::example("net.2sw2path4hca").unwrap(),
        ["Hca3", "Hca4"],
    )
    .name_prefix("reap")
    .start_daemons(false)
    .start()
    .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let attached = |f: &Fabric| {
        f.ibsim_command("Attached")
            .unwrap()
            .lines()
            .filter(|l| l.trim().starts_with("Client "))
            .count()
    };
    let live = attached(&fabric);
    assert!(live >= 1, "OpenSM is a client");
    // `ibping -S` on Hca3 serves until `timeout` SIGKILLs it (and, KILL going to its whole
    // group, itself): it never tells ibsim it left.
    let out = fabric
        .run_tool("Hca3", "timeout", &["-s", "KILL", "3", "ibping", "-S"])
        .unwrap();
    assert!(out.code.is_none() && !out.timed_out, "{out}");
    assert_eq!(
        attached(&fabric),
        live + 1,
        "the killed ibping's slot is still taken"
    );
    assert_eq!(fabric.reap_dead_clients().unwrap(), 1);
    assert_eq!(attached(&fabric), live);
    assert_eq!(
        fabric.reap_dead_clients().unwrap(),
        0,
        "live clients are kept"
    );
}
