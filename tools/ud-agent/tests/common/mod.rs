//! Harness for the verbs tests: a private ibsim fabric with OpenSM as master (through
//! `acm-fabric`, no ibacm daemons), and `ud-agent` / `svagent` processes started under
//! `LD_PRELOAD=libumad2sim.so:libsimverbs.so`. Every process is killed by PID in `Drop` (also
//! when a test panics); the fabric's scratch directory is removed by `acm-fabric`.

#![allow(dead_code)]

use acm_fabric::testing::{svagent, LineChild};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

#[allow(unused_imports)] // not every test file uses each
pub use acm_fabric::testing::{libsimverbs, preload, profile_dir, stop_child};

/// A private fabric: ibsim (net.2sw2path4hca: Hca1..Hca4) + OpenSM on Hca1.
pub struct Fabric {
    /// `IBSIM_SOCKNAME`, also the simverbs fabric name.
    pub name: String,
    /// Scratch directory: working directory and `SIMVERBS_SHM_DIR` of the processes.
    pub dir: PathBuf,
    /// ibsim + OpenSM, stopped by PID when dropped.
    inner: Option<acm_fabric::Fabric>,
    /// OpenSM's partitions.conf (it re-reads it on sweeps), removed on drop.
    partitions: Option<PathBuf>,
}

impl Drop for Fabric {
    fn drop(&mut self) {
        self.inner.take();
        if let Some(p) = &self.partitions {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Fabric {
    pub fn start(tag: &str) -> Fabric {
        Fabric::start_with_partitions(tag, None)
    }

    /// Like [`Fabric::start`], with an OpenSM partitions.conf (`-P`, a temp file removed when
    /// the fabric is dropped).
    pub fn start_with_partitions(tag: &str, partitions: Option<&str>) -> Fabric {
        // Fail before bringing anything up if the library is missing or stale.
        let _ = libsimverbs();
        let topology = acm_fabric::Topology::example("net.2sw2path4hca").expect("shipped topology");
        let conf = partitions.map(|text| {
            let p = std::env::temp_dir()
                .join(format!("dpv-{tag}-{}-partitions.conf", std::process::id()));
            std::fs::write(&p, text).expect("partitions.conf");
            p
        });
        // Hca2 is only waited for (LID assigned); no daemon runs anywhere.
        let mut builder = acm_fabric::Fabric::builder(topology, ["Hca2"])
            .sm_node("Hca1")
            .name_prefix(&format!("dpv-{tag}"))
            .start_daemons(false);
        if let Some(p) = &conf {
            builder = builder.opensm_args(["-P".to_string(), p.display().to_string()]);
        }
        // Built before start so that a failed bring-up still removes the file (Drop).
        let mut f = Fabric {
            name: String::new(),
            dir: PathBuf::new(),
            inner: None,
            partitions: conf,
        };
        let inner = builder
            .start()
            .unwrap_or_else(|e| panic!("fabric bring-up failed: {e}"));
        f.name = inner.name().to_string();
        f.dir = inner.scratch().to_path_buf();
        f.inner = Some(inner);
        f
    }

    fn command(&self, prog: &Path, host: &str) -> Command {
        let mut c = acm_fabric::testing::verbs_command(prog, &self.name, &self.dir, host);
        c.stderr(Stdio::inherit());
        c
    }

    /// Starts `ud-agent` on `host`.
    pub fn agent(&self, host: &str) -> Agent {
        Agent::spawn(
            self.command(Path::new(env!("CARGO_BIN_EXE_ud-agent")), host),
            host,
        )
    }

    /// Starts `ud-agent` on `host` wrapped in `valgrind --leak-check=full` (log in `log`).
    pub fn agent_valgrind(&self, host: &str, log: &Path) -> Agent {
        let mut c = self.command(Path::new("valgrind"), host);
        c.arg("--leak-check=full")
            .arg(format!("--log-file={}", log.display()))
            .arg(env!("CARGO_BIN_EXE_ud-agent"));
        Agent::spawn(c, host)
    }

    /// A command to the simverbs control socket of the agent running as `host` (e.g.
    /// `set fail_post_recv 100`); its `ok ...` reply.
    pub fn ctl(&self, host: &str, command: &str) -> String {
        acm_fabric::fabric::simverbs_ctl(&self.name, host, command)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts simverbs' own C test agent (a plain libibverbs program, compiled once per test
    /// process) on `host`: an independent peer that can send what our endpoint never would
    /// (e.g. oversized datagrams).
    pub fn svagent(&self, host: &str) -> Agent {
        Agent::spawn(self.command(&svagent(), host), host)
    }

    /// Files in the simverbs multicast membership directory of `mgid` (`<lid>.<qpn>` each).
    pub fn mcast_members(&self, mgid: &str) -> Vec<String> {
        let d = self
            .dir
            .join(format!("simverbs-{}", self.name))
            .join("mcast")
            .join(mgid);
        let mut v: Vec<String> = std::fs::read_dir(d)
            .map(|r| {
                r.flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Whether the QP's datagram socket `@simverbs/<fabric>/lid/<lid>/qp/<qpn>` is bound.
    pub fn qp_socket_bound(&self, lid: u16, qpn: u32) -> bool {
        let want = format!("@simverbs/{}/lid/{lid}/qp/{qpn}", self.name);
        std::fs::read_to_string("/proc/net/unix")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split_whitespace().last() == Some(want.as_str()))
    }
}

/// A running agent process (ud-agent or svagent), one reply line per command; stopped by PID
/// when dropped.
pub struct Agent {
    pub host: String,
    child: LineChild,
}

/// What `open` answered.
#[derive(Clone, Debug)]
pub struct Opened {
    pub lid: u16,
    pub qpn: u32,
    pub gid: String,
    pub pkey_index: u16,
}

impl Agent {
    fn spawn(c: Command, host: &str) -> Agent {
        Agent {
            host: host.to_string(),
            child: LineChild::spawn(c, &format!("agent on {host}"), Duration::from_secs(30)),
        }
    }

    /// The next output line (panics after `timeout`).
    pub fn line(&self, timeout: Duration) -> String {
        self.child.line(timeout)
    }

    /// Writes one command line without waiting for its reply.
    pub fn start(&mut self, line: &str) {
        self.child.send(line);
    }

    /// Sends one command line and returns the reply line (panics after 30 s).
    pub fn cmd(&mut self, line: &str) -> String {
        self.child.cmd(line)
    }

    /// `open <recv_depth> <send_depth>` on the default partition.
    pub fn open(&mut self, recv_depth: u32, send_depth: u32) -> Opened {
        let r = self.cmd(&format!("open {recv_depth} {send_depth}"));
        assert!(r.starts_with("ok "), "open on {}: {r}", self.host);
        Opened {
            lid: field(&r, "lid").parse().expect("lid"),
            qpn: field(&r, "qpn").parse().expect("qpn"),
            gid: field(&r, "gid").to_string(),
            pkey_index: field(&r, "pkey_index").parse().expect("pkey_index"),
        }
    }

    /// `recv n ms`: the MAD lines, as key=value maps.
    pub fn recv(&mut self, n: usize, ms: u64) -> Vec<HashMap<String, String>> {
        self.start(&format!("recv {n} {ms}"));
        self.recv_reply()
    }

    /// The reply of a `recv` sent with [`Agent::start`].
    pub fn recv_reply(&mut self) -> Vec<HashMap<String, String>> {
        let r = self.line(Duration::from_secs(30));
        assert!(r.starts_with("ok n="), "recv on {}: {r}", self.host);
        let k: usize = field(&r, "n").parse().expect("n");
        (0..k)
            .map(|_| {
                let l = self.line(Duration::from_secs(10));
                assert!(l.starts_with("mad "), "{l}");
                fields(&l)
            })
            .collect()
    }

    /// `stats` as a map.
    pub fn stats(&mut self) -> HashMap<String, u64> {
        let r = self.cmd("stats");
        assert!(r.starts_with("ok "), "stats on {}: {r}", self.host);
        fields(&r)
            .into_iter()
            .map(|(k, v)| (k, v.parse().expect("counter")))
            .collect()
    }

    /// The agent's PID.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Ends the agent with `quit` and returns its exit code (None: it did not exit in time).
    pub fn quit(self, within: Duration) -> Option<i32> {
        self.child.quit(within)
    }
}

/// The value of `key=` in a reply (panics if absent).
pub fn field<'a>(reply: &'a str, key: &str) -> &'a str {
    reply
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in '{reply}'"))
}

/// Every `key=value` of a line.
pub fn fields(line: &str) -> HashMap<String, String> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
