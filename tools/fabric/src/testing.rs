//! Support for tests that start their own processes under `libsimverbs.so` (their libibverbs
//! and libibumad) on a [`Fabric`](crate::Fabric) (the harnesses of simverbs, ud-agent and umad-rmpp): the
//! freshly built `libsimverbs.so` of the running test's target directory, the `LD_PRELOAD`
//! value, a command for a node of the fabric, simverbs' C test agent ([`svagent`]), a
//! line-protocol child process ([`LineChild`]), the hex words of the agents' lines ([`hex`],
//! [`unhex`]), stopping a child by PID, and the processes left on a fabric
//! ([`processes_on_fabric`], [`wait_fabric_gone`]). They panic: each is a precondition or
//! cleanup of a test.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Live processes on the fabrics whose name `fabric` accepts, as (PID, command line): every
/// process acm-fabric starts (ibsim, OpenSM, daemons) and every node process a bench or test
/// starts carries `IBSIM_SOCKNAME=<fabric name>` in its environment.
pub fn processes_on_fabric(fabric: impl Fn(&str) -> bool) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        let on = env
            .split(|b| *b == 0)
            .filter_map(|v| v.strip_prefix(b"IBSIM_SOCKNAME="))
            .any(|name| fabric(&String::from_utf8_lossy(name)));
        if on {
            found.push((pid, crate::process::cmdline(pid)));
        }
    }
    found
}

/// Waits up to `timeout` until no process is left on the fabrics `fabric` accepts
/// ([`processes_on_fabric`]); returns those still there.
pub fn wait_fabric_gone(fabric: impl Fn(&str) -> bool, timeout: Duration) -> Vec<(i32, String)> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = processes_on_fabric(&fabric);
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `target/<profile>/` of the running test executable (`target/<profile>/deps/<test>`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps")
        .to_path_buf()
}

/// The freshly built libsimverbs.so of this target dir. `cargo test` does not build it for
/// other packages nor rebuild a cdylib for integration tests: refuse a missing library, or
/// one older than any file of tools/simverbs/src, instead of testing old code.
pub fn libsimverbs() -> PathBuf {
    let p = profile_dir().join("libsimverbs.so");
    let built = std::fs::metadata(&p)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} missing: run `cargo build -p simverbs` (same CARGO_TARGET_DIR) first",
                p.display()
            )
        });
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../simverbs/src");
    for e in std::fs::read_dir(src)
        .expect("tools/simverbs/src")
        .flatten()
    {
        let m = e.metadata().and_then(|m| m.modified()).expect("mtime");
        assert!(
            m <= built,
            "{} is older than {}: run `cargo build -p simverbs` first",
            p.display(),
            e.path().display()
        );
    }
    p
}

/// `LD_PRELOAD` value for simulated verbs processes: [`libsimverbs`] alone (it is their
/// libibumad too; umad2sim would only take one more ibsim client).
pub fn preload() -> String {
    libsimverbs().display().to_string()
}

/// SIGTERM to a PID we started, up to `grace`, then SIGKILL; always reaps.
pub fn stop_child(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let t = Instant::now();
    while t.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A command running `prog` on node `host` of the simulated fabric `fabric` (its
/// `IBSIM_SOCKNAME`) under [`preload`], with `scratch` (the fabric's scratch directory) as
/// working directory and `SIMVERBS_SHM_DIR`.
pub fn verbs_command(prog: impl AsRef<OsStr>, fabric: &str, scratch: &Path, host: &str) -> Command {
    let mut c = Command::new(prog);
    c.env("IBSIM_SOCKNAME", fabric)
        .env("SIM_HOST", host)
        .env("LD_PRELOAD", preload())
        .env("SIMVERBS_SHM_DIR", scratch)
        .current_dir(scratch);
    c
}

/// simverbs' C test agent, `tools/simverbs/tests/c/svagent.c` (a plain libibverbs program, one
/// reply line per command line), compiled once per test process into [`profile_dir`]. The
/// file is named after the test executable (`svagent-<test>-<hash>`), so that test binaries
/// running in parallel do not replace each other's agent, and is compiled under a name with
/// the PID, then renamed into place.
pub fn svagent() -> PathBuf {
    static AGENT: OnceLock<PathBuf> = OnceLock::new();
    AGENT
        .get_or_init(|| {
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../simverbs/tests/c/svagent.c");
            let exe = std::env::current_exe().expect("current_exe");
            let test = exe
                .file_name()
                .expect("test executable name")
                .to_string_lossy();
            let out = profile_dir().join(format!("svagent-{test}"));
            let tmp = profile_dir().join(format!("svagent-{test}.{}", std::process::id()));
            let st = Command::new("cc")
                .args(["-Wall", "-Werror", "-O1", "-o"])
                .arg(&tmp)
                .arg(&src)
                .arg("-libverbs")
                .status()
                .expect("cc not found: apt-get install gcc libibverbs-dev");
            assert!(st.success(), "compiling {} failed", src.display());
            std::fs::rename(&tmp, &out).expect("rename svagent");
            out
        })
        .clone()
}

/// A child process spoken to by lines: a command line on its stdin, one reply line (or more)
/// on its stdout, which a thread forwards line by line. Stopped by PID ([`stop_child`], after
/// its stdin is closed) when dropped, also when a test panics.
pub struct LineChild {
    /// Names the process in panic messages (e.g. `agent on Hca2`).
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// How long [`LineChild::cmd`] waits for the reply.
    reply_within: Duration,
}

impl LineChild {
    /// Spawns `command` with piped stdin and stdout (stderr as `command` has it); `name` names
    /// it in panic messages, `reply_within` bounds the wait of [`LineChild::cmd`].
    pub fn spawn(mut command: Command, name: &str, reply_within: Duration) -> LineChild {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        LineChild {
            name: name.to_string(),
            child,
            stdin: Some(stdin),
            lines: rx,
            reply_within,
        }
    }

    /// The next output line (panics after `timeout`).
    pub fn line(&self, timeout: Duration) -> String {
        self.lines
            .recv_timeout(timeout)
            .unwrap_or_else(|_| panic!("{} gave no output line within {timeout:?}", self.name))
    }

    /// Writes one command line without waiting for its reply.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin of a child that quit");
        writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .unwrap_or_else(|e| panic!("writing {line:?} to {}: {e}", self.name));
    }

    /// Sends one command line and returns the reply line (panics naming the command if none
    /// comes within the `reply_within` of [`LineChild::spawn`]).
    pub fn cmd(&mut self, line: &str) -> String {
        self.send(line);
        self.lines
            .recv_timeout(self.reply_within)
            .unwrap_or_else(|_| panic!("{} did not answer {line:?}", self.name))
    }

    /// The child's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ends the child with a `quit` line (then its stdin closed) and returns its exit code;
    /// None: it did not exit within `within` (it is then stopped by PID, as on drop).
    pub fn quit(mut self, within: Duration) -> Option<i32> {
        if let Some(mut s) = self.stdin.take() {
            let _ = writeln!(s, "quit");
        }
        let t = Instant::now();
        while t.elapsed() < within {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for LineChild {
    fn drop(&mut self) {
        self.stdin.take();
        stop_child(&mut self.child, Duration::from_secs(2));
    }
}

/// Bytes as the lowercase hex word of an agent's command line (`madsend`, `raw`, ...).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of a hex word of an agent's reply (`mad=`, a GID); panics on a non-hex digit.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}
