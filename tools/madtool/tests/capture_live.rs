//! Live proof against real OpenSM: bring up ibsim (`net.2sw2path4hca`) and OpenSM under
//! umad2sim with the `acm-fabric` orchestrator (no ibacm daemons), then run `madtool capture`
//! as Hca2. Our encoder builds the PathRecord GETs and the ibacm MCMemberRecord SET; OpenSM
//! must accept them and its replies must decode as expected.
//!
//! Needs root and the Debian packages ibsim-utils, opensm, libumad2sim0, infiniband-diags.
//! The fabric stops everything it started by PID and removes its scratch directory on drop.

use std::path::Path;
use std::time::{Duration, Instant};

use acm_core_nostd::wire::mcmember::{AcmMgid, McMemberRepr};
use acm_core_nostd::wire::path_record::PathRecordRepr;
use acm_core_nostd::wire::sa::{SaPacket, SaRepr, SaStatus};
use acm_fabric::{Fabric, Topology};

fn read(dir: &Path, name: &str) -> (SaRepr, Vec<u8>) {
    let b = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let r = SaRepr::parse(&SaPacket::new_checked(&b[..]).unwrap()).unwrap();
    (r, b)
}

#[test]
fn capture_against_real_opensm() {
    let topology = Topology::example("net.2sw2path4hca").expect("shipped topology");
    // OpenSM runs as Hca1; Hca2 only needs its LID (no ibacm daemon).
    let fabric = Fabric::builder(topology, ["Hca2"])
        .sm_node("Hca1")
        .name_prefix("wirelive")
        .start_daemons(false)
        .start()
        .unwrap_or_else(|e| panic!("simulated fabric: {e}"));

    // OpenSM answers SA queries once its first sweep is done; retry until paths exist.
    let out = fabric.scratch().join("out");
    let out_arg = out.to_str().expect("UTF-8 scratch path");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let o = fabric
            .run_tool(
                "Hca2",
                env!("CARGO_BIN_EXE_madtool"),
                &["capture", "--out", out_arg],
            )
            .expect("run madtool capture");
        let ok = o.success()
            && read(&out, "opensm_pr_get_lid_resp.bin").0.sa_status() == SaStatus::Success;
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "capture never succeeded: {}",
            o.stderr
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    let (r, b) = read(&out, "opensm_pr_get_lid_resp.bin");
    assert!(r.header.status.is_success());
    let p = PathRecordRepr::parse_bytes(&b[56..]).unwrap();
    assert_eq!((p.slid, p.dlid), (4, 6));
    let (r, b) = read(&out, "opensm_pr_get_gid_resp.bin");
    assert_eq!(r.sa_status(), SaStatus::Success);
    let p = PathRecordRepr::parse_bytes(&b[56..]).unwrap();
    assert_eq!((p.slid, p.dlid), (4, 5));
    assert_eq!(
        read(&out, "opensm_pr_get_norec_resp.bin").0.sa_status(),
        SaStatus::NoRecords
    );
    let (r, b) = read(&out, "opensm_mcm_set_resp.bin");
    assert_eq!(r.sa_status(), SaStatus::Success);
    let m = McMemberRepr::parse_bytes(&b[56..]).unwrap();
    assert!(m.mlid >= 0xc000);
    assert_eq!(AcmMgid::parse(&m.mgid).unwrap().pkey, 0xffff);
}
