//! Test harness: a private ibsim fabric with OpenSM as master (through `acm-fabric`), and
//! processes started under `LD_PRELOAD=libumad2sim.so:libsimverbs.so`. Everything started is
//! torn down by PID in `Drop` (also when a test panics), scratch directories are removed.

#![allow(dead_code)]

use acm_fabric::testing::LineChild;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[allow(unused_imports)]
pub use acm_fabric::fabric::UMAD2SIM;
#[allow(unused_imports)] // not every test file uses each
pub use acm_fabric::testing::{hex, libsimverbs, preload, profile_dir, stop_child, svagent, unhex};

/// Port GUID of `HcaN` in net.2sw2path4hca (0x100001, 0x100004, 0x100007, 0x10000a).
pub fn port_guid(host: &str) -> u64 {
    let n: u64 = host
        .strip_prefix("Hca")
        .and_then(|n| n.parse().ok())
        .expect("HcaN");
    0x100001 + 3 * (n - 1)
}

/// A private fabric: ibsim (net.2sw2path4hca) + OpenSM on Hca1, brought up and torn down
/// (by PID, scratch removed) by the `acm-fabric` orchestrator, without ibacm daemons.
pub struct Fabric {
    /// `IBSIM_SOCKNAME`, also the simverbs fabric name.
    pub name: String,
    /// Scratch directory: working directory and `SIMVERBS_SHM_DIR` of the processes.
    pub dir: PathBuf,
    inner: acm_fabric::Fabric,
    /// OpenSM's partitions.conf (`-P`), removed on drop.
    partitions: Option<PathBuf>,
}

impl Fabric {
    /// Starts ibsim and OpenSM and waits until OpenSM is master (LIDs assigned).
    pub fn start(tag: &str) -> Fabric {
        Fabric::start_with_partitions(tag, None)
    }

    /// Like [`Fabric::start`], with an OpenSM partitions.conf (`-P`).
    pub fn start_with_partitions(tag: &str, partitions: Option<&str>) -> Fabric {
        Fabric::start_with(tag, partitions, None)
    }

    /// Like [`Fabric::start`], with an OpenSM partitions.conf (`-P`) and a subnet prefix.
    pub fn start_with(tag: &str, partitions: Option<&str>, prefix: Option<u64>) -> Fabric {
        let topology = acm_fabric::Topology::example("net.2sw2path4hca").expect("shipped topology");
        let conf = partitions.map(|text| {
            let p = std::env::temp_dir().join(format!(
                "simverbs-{tag}-{}-partitions.conf",
                std::process::id()
            ));
            std::fs::write(&p, text).expect("partitions.conf");
            p
        });
        // Hca2 is only waited for (LID assigned); no daemon runs anywhere.
        let mut builder = acm_fabric::Fabric::builder(topology, ["Hca2"])
            .sm_node("Hca1")
            .name_prefix(&format!("svt-{tag}"))
            .start_daemons(false);
        if let Some(p) = &conf {
            builder = builder.opensm_args(["-P".to_string(), p.display().to_string()]);
        }
        if let Some(p) = prefix {
            builder = builder.subnet_prefix(p);
        }
        if let Ok(v) = std::env::var("SVT_OPENSM_DEBUG") {
            builder = builder.opensm_args(["-D".to_string(), v]);
        }
        let inner = builder
            .start()
            .unwrap_or_else(|e| panic!("fabric bring-up failed: {e}"));
        let f = Fabric {
            name: inner.name().to_string(),
            dir: inner.scratch().to_path_buf(),
            inner,
            partitions: conf,
        };
        f.wait_master_seen("Hca1", "Hca2");
        f
    }

    /// Waits until `probe` sees OpenSM on `host` as master.
    fn wait_master_seen(&self, host: &str, probe: &str) {
        let want = format!("sm guid {:#x}", port_guid(host));
        let t = Instant::now();
        loop {
            let out = self
                .command("sminfo", probe, false)
                .output()
                .expect("sminfo not found: apt-get install infiniband-diags");
            let text = String::from_utf8_lossy(&out.stdout);
            if text.contains("SMINFO_MASTER") && text.contains(&want) {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "OpenSM on {host} did not become master within 30 s"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Stops the running OpenSM and starts one on `host` (the SM moves: every port's
    /// PortInfo.MasterSMLID changes).
    pub fn move_sm(&mut self, host: &str, probe: &str) {
        self.inner
            .move_sm(host, false)
            .unwrap_or_else(|e| panic!("moving the SM to {host}: {e}"));
        self.wait_master_seen(host, probe);
    }

    /// Like [`Fabric::move_sm`], but the new OpenSM starts with an empty cache and `-r`
    /// (reassign LIDs): in net.2sw2path4hca moving to Hca2 gives Hca2 LID 1 and Hca1 LID 3.
    pub fn move_sm_reassigning_lids(&mut self, host: &str, probe: &str) {
        self.inner
            .move_sm(host, true)
            .unwrap_or_else(|e| panic!("moving the SM to {host}: {e}"));
        self.wait_master_seen(host, probe);
    }

    /// Takes `host`'s port 1 link down (ibsim `Unlink`); returns once PortInfo reads Down.
    pub fn port_down(&self, host: &str) {
        self.inner
            .port_down(host)
            .unwrap_or_else(|e| panic!("port down on {host}: {e}"));
    }

    /// Brings `host`'s port 1 link back (ibsim `ReLink`); returns once the SM made it ACTIVE.
    pub fn port_up(&self, host: &str) {
        self.inner
            .port_up(host)
            .unwrap_or_else(|e| panic!("port up on {host}: {e}"));
    }

    /// Stops OpenSM (SIGSTOP) until [`Fabric::resume_sm`]: its SA answers nothing.
    pub fn pause_sm(&self) {
        self.inner.pause_sm().expect("SIGSTOP OpenSM");
    }

    /// Lets OpenSM go on (SIGCONT).
    pub fn resume_sm(&self) {
        self.inner.resume_sm().expect("SIGCONT OpenSM");
    }

    /// A command on a simulated host of several ports (`SIMVERBS_HOST`; simverbs only, which
    /// is the process's libibumad too), in this fabric's scratch directory.
    /// It is killed after 30 s (`timeout`), so a hang fails the test instead of stalling it.
    pub fn host_command(&self, prog: impl AsRef<std::ffi::OsStr>, host: &str) -> Command {
        let mut c = Command::new("timeout");
        c.arg("30")
            .arg(prog)
            .env("SIMVERBS_HOST", host)
            .env_remove("SIM_HOST")
            .env_remove("IBSIM_SOCKNAME")
            .env("LD_PRELOAD", libsimverbs())
            .env("SIMVERBS_SHM_DIR", &self.dir)
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        c
    }

    /// A command on node `host` of this fabric (umad2sim, plus simverbs when `verbs`).
    pub fn command(&self, prog: impl AsRef<std::ffi::OsStr>, host: &str, verbs: bool) -> Command {
        let mut c = Command::new(prog);
        c.env("IBSIM_SOCKNAME", &self.name)
            .env("SIM_HOST", host)
            .env(
                "LD_PRELOAD",
                if verbs {
                    preload()
                } else {
                    UMAD2SIM.to_string()
                },
            )
            .env("SIMVERBS_SHM_DIR", &self.dir)
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        c
    }

    /// Starts a verbs agent (tests/c/svagent.c) on `host`.
    pub fn agent(&self, host: &str) -> Agent {
        self.agent_env(host, &[])
    }

    /// [`Fabric::agent`] with extra environment variables.
    pub fn agent_env(&self, host: &str, env: &[(&str, &str)]) -> Agent {
        let mut c = self.command(svagent(), host, true);
        c.envs(env.iter().copied()).stderr(Stdio::inherit());
        Agent {
            host: host.to_string(),
            child: LineChild::spawn(c, &format!("agent on {host}"), Duration::from_secs(15)),
        }
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        if let Some(p) = &self.partitions {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A running svagent process, stopped by PID when dropped.
pub struct Agent {
    pub host: String,
    child: LineChild,
}

impl Agent {
    /// Sends one command line and returns the reply line (panics after 15 s).
    pub fn cmd(&mut self, line: &str) -> String {
        self.child.cmd(line)
    }

    /// The agent's PID.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// `init`, returning (lid, qpn, gid-hex).
    pub fn init(&mut self, qkey: u32, rcq: u32) -> (u16, u32, String) {
        self.init_pkey(qkey, rcq, "")
    }

    /// `init` with the QP on the P_Key index of `pkey` (e.g. "0x8001"; "" = index 0).
    pub fn init_pkey(&mut self, qkey: u32, rcq: u32, pkey: &str) -> (u16, u32, String) {
        let r = self.cmd(&format!("init {qkey:#x} {rcq} {pkey}"));
        let w: Vec<&str> = r.split_whitespace().collect();
        assert!(w.len() == 4 && w[0] == "ok", "init on {}: {r}", self.host);
        (
            w[1].parse().expect("lid"),
            w[2].parse().expect("qpn"),
            w[3].to_string(),
        )
    }

    /// Ends the agent cleanly (it destroys every verbs object) and returns its exit code.
    pub fn quit(self) -> Option<i32> {
        self.child.quit(Duration::from_secs(5))
    }
}

/// Parses `key=value` fields of an agent reply.
pub fn field<'a>(reply: &'a str, key: &str) -> Option<&'a str> {
    reply
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// Sends one control command to `@simverbs/<fabric>/<node>/ctl` and returns the reply.
pub fn control(fabric: &str, node: &str, cmd: &str) -> String {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let me = SocketAddr::from_abstract_name(
        format!("simverbs-test/{}/{}", std::process::id(), seq).as_bytes(),
    )
    .expect("addr");
    let sock = UnixDatagram::bind_addr(&me).expect("bind test control socket");
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let to = SocketAddr::from_abstract_name(format!("simverbs/{fabric}/{node}/ctl").as_bytes())
        .expect("addr");
    sock.send_to_addr(cmd.as_bytes(), &to)
        .expect("send control command");
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("control reply");
    String::from_utf8_lossy(&buf[..n]).to_string()
}
