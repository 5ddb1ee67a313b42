//! Live proof against real OpenSM: start ibsim (`net.2sw2path4hca`) and OpenSM under umad2sim,
//! then run `madtool capture` as Hca2. Our encoder builds the PathRecord GETs and the ibacm
//! MCMemberRecord SET; OpenSM must accept them and its replies must decode as expected.
//!
//! Needs root and the Debian packages ibsim-utils, opensm, libumad2sim0, infiniband-diags.
//! Everything started here is stopped by PID (Drop guards), the scratch directory removed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use acm_core_nostd::wire::mcmember::{AcmMgid, McMemberRepr};
use acm_core_nostd::wire::path_record::PathRecordRepr;
use acm_core_nostd::wire::sa::{SaPacket, SaRepr, SaStatus};

const NET: &str = "/usr/share/doc/ibsim-utils/net-examples/net.2sw2path4hca";
const UMAD2SIM: &str = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so";

struct Scratch(PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Stops a child by PID: SIGTERM, a short grace period, then SIGKILL.
struct Daemon(Child, &'static str);
impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
        eprintln!("{} needed SIGKILL", self.1);
    }
}

fn require(path: &str, pkg: &str) {
    assert!(
        Path::new(path).exists(),
        "{path} missing: apt-get install {pkg} (this test needs the simulated fabric)"
    );
}

fn read(dir: &Path, name: &str) -> (SaRepr, Vec<u8>) {
    let b = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let r = SaRepr::parse(&SaPacket::new_checked(&b[..]).unwrap()).unwrap();
    (r, b)
}

#[test]
fn capture_against_real_opensm() {
    require(NET, "ibsim-utils");
    require(UMAD2SIM, "libumad2sim0");
    require("/usr/sbin/opensm", "opensm");
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("acm-wire-live-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let scratch = Scratch(dir.clone());
    let sock = format!("wirelive{pid}");

    let ibsim = Command::new("ibsim")
        .args(["-s", "-n", NET])
        .env("IBSIM_SOCKNAME", &sock)
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ibsim (apt-get install ibsim-utils)");
    let _ibsim = Daemon(ibsim, "ibsim");
    std::thread::sleep(Duration::from_millis(500));
    let osm = Command::new("opensm")
        .args(["-e", "-s", "5", "-f"])
        .arg(dir.join("osm.log"))
        .env("IBSIM_SOCKNAME", &sock)
        .env("SIM_HOST", "Hca1")
        .env("OSM_TMP_DIR", &dir)
        .env("OSM_CACHE_DIR", &dir)
        .env("LD_PRELOAD", UMAD2SIM)
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start opensm");
    let _osm = Daemon(osm, "opensm");

    let as_hca2 = |cmd: &str| {
        let mut c = Command::new(cmd);
        c.env("IBSIM_SOCKNAME", &sock)
            .env("SIM_HOST", "Hca2")
            .env("LD_PRELOAD", UMAD2SIM)
            .current_dir(&dir)
            .stdin(Stdio::null());
        c
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let o = as_hca2("sminfo")
            .output()
            .expect("run sminfo (infiniband-diags)");
        if String::from_utf8_lossy(&o.stdout).contains("SMINFO_MASTER") {
            break;
        }
        assert!(Instant::now() < deadline, "OpenSM did not become master");
        std::thread::sleep(Duration::from_millis(300));
    }

    // OpenSM answers SA queries once its first sweep is done; retry until paths exist.
    let out = dir.join("out");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let o = as_hca2(env!("CARGO_BIN_EXE_madtool"))
            .args(["capture", "--out"])
            .arg(&out)
            .output()
            .unwrap();
        let ok = o.status.success()
            && read(&out, "opensm_pr_get_lid_resp.bin").0.sa_status() == SaStatus::Success;
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "capture never succeeded: {}",
            String::from_utf8_lossy(&o.stderr)
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
    drop(scratch);
}
