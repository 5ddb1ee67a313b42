//! Child processes that are always torn down: each one leads its own process group, is
//! recorded in a process-wide registry, and is killed (TERM, grace period, KILL) by PID when its
//! guard drops, or all at once by [`emergency_teardown`] from a signal handler thread.

use crate::{Error, Result};
use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Process groups (leader PIDs) that are alive and not yet reaped, and scratch directories
/// that exist. Only what this process started is ever recorded here.
struct Registry {
    groups: BTreeSet<i32>,
    scratch: BTreeSet<PathBuf>,
    /// Set by [`emergency_teardown`]: no process may be started afterwards.
    closed: bool,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    groups: BTreeSet::new(),
    scratch: BTreeSet::new(),
    closed: false,
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    // A panic while holding the lock leaves plain sets behind: still usable.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn register_scratch(dir: PathBuf) {
    registry().scratch.insert(dir);
}

pub(crate) fn unregister_scratch(dir: &PathBuf) {
    registry().scratch.remove(dir);
}

/// Kills every process group this process started and still owns (SIGKILL), and removes every
/// scratch directory not marked to be kept. For a signal-handling thread of a CLI: call it,
/// then exit. Afterwards no new process can be started through this crate. Returns the number
/// of process groups signalled.
pub fn emergency_teardown() -> usize {
    let (groups, scratch) = {
        let mut r = registry();
        r.closed = true;
        (
            std::mem::take(&mut r.groups),
            std::mem::take(&mut r.scratch),
        )
    };
    for pgid in &groups {
        signal_group(*pgid, libc::SIGKILL);
    }
    for dir in scratch {
        let _ = std::fs::remove_dir_all(dir);
    }
    groups.len()
}

/// For a command-line program that starts fabrics: blocks SIGINT, SIGTERM and SIGHUP in every
/// thread and waits for them on a thread of its own. Call it first in `main`, before any other
/// thread exists (threads inherit the mask; children get a clean one, see [`Proc`]). A signal
/// that `claim` takes (returns true for) is left to the program; any other kills every process
/// group this process started and removes its scratch directories ([`emergency_teardown`]),
/// then the process exits with 128 + the signal, `program` naming it on stderr.
pub fn teardown_on_signals(
    program: &'static str,
    claim: impl Fn(i32) -> bool + Send + 'static,
) -> Result<()> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use; the caller runs
    // this before any other thread exists, so every later thread inherits the mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(Error::new("cannot block signals"));
        }
        set
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` is a valid initialised sigset_t and `sig` a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 || claim(sig) {
                continue;
            }
            SIGNALLED.store(true, std::sync::atomic::Ordering::SeqCst);
            let n = emergency_teardown();
            eprintln!("{program}: signal {sig}: killed {n} process group(s), exiting");
            std::process::exit(128 + sig);
        })
        .map_err(|e| Error::new(format!("cannot start the signal thread: {e}")))?;
    Ok(())
}

/// Set by the [`teardown_on_signals`] thread before it tears down and exits.
static SIGNALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Ends the process with `code`, for a program that uses [`teardown_on_signals`]: unless a
/// signal's teardown is under way, which kills this program's children and so often makes
/// its main thread fail at that very moment; the signal thread then ends the process with
/// 128 + the signal, and this waits for it.
pub fn exit(code: i32) -> ! {
    if SIGNALLED.load(std::sync::atomic::Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
    std::process::exit(code)
}

/// The leader PIDs of every live process group started through this crate (all fabrics).
pub fn live_process_groups() -> Vec<i32> {
    registry().groups.iter().copied().collect()
}

fn signal_group(pgid: i32, sig: i32) {
    if pgid <= 1 {
        return;
    }
    // SAFETY: killpg has no memory-safety preconditions; pgid is a group we created (the
    // leader is our unreaped child, so the id cannot have been recycled).
    unsafe {
        libc::killpg(pgid, sig);
    }
}

/// A running child that leads its own process group. Dropping it stops the whole group.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    exited: Option<ExitStatus>,
    /// How long to wait after SIGTERM before SIGKILL.
    grace: Duration,
}

impl Proc {
    /// Spawns `cmd` as the leader of a new process group and records it in the registry.
    pub fn spawn(name: &str, cmd: Command, grace: Duration) -> Result<Proc> {
        Proc::spawn_with_stdin(name, cmd, Stdio::null(), grace)
    }

    /// As [`Proc::spawn`], with `stdin` as the child's standard input (e.g. ibsim's console).
    pub fn spawn_with_stdin(
        name: &str,
        mut cmd: Command,
        stdin: Stdio,
        grace: Duration,
    ) -> Result<Proc> {
        cmd.process_group(0).stdin(stdin);
        // A child inherits the signal mask: the CLI blocks SIGINT/SIGTERM/SIGHUP for its
        // signal thread, and ibsim and OpenSM would then never see our SIGTERM (every teardown
        // ending in SIGKILL) nor OpenSM a SIGHUP. Every child starts with none blocked.
        // SAFETY: the closure runs in the forked child before exec and only calls
        // sigemptyset and sigprocmask, which are async-signal-safe; it touches no memory of
        // the parent but its own stack.
        unsafe {
            cmd.pre_exec(|| {
                let mut none: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut none);
                if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // Hold the registry lock across spawn + insert, so an emergency teardown on another
        // thread either sees this child or runs before it exists.
        let mut r = registry();
        if r.closed {
            return Err(Error::new(format!(
                "not starting {name}: the process is shutting down"
            )));
        }
        let child = cmd
            .spawn()
            .map_err(|e| Error::new(format!("cannot start {name} ({cmd:?}): {e}")))?;
        r.groups.insert(child.id() as i32);
        drop(r);
        Ok(Proc {
            name: name.to_string(),
            child,
            exited: None,
            grace,
        })
    }

    /// The child's PID (also its process group id).
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// What this process is (for messages).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Returns the exit status if the child has exited (reaping it).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.exited = Some(st);
                // The leader is reaped; stragglers of its group are killed now, since the
                // group id may be recycled once the group is empty.
                signal_group(self.pid(), libc::SIGKILL);
                registry().groups.remove(&self.pid());
            }
        }
        self.exited
    }

    /// Waits up to `timeout` for the child to exit by itself.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM to the group, wait for the grace period, then SIGKILL; always reaps the leader.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        if self.try_wait().is_none() {
            signal_group(self.pid(), libc::SIGTERM);
            if self.wait_timeout(self.grace).is_none() {
                signal_group(self.pid(), libc::SIGKILL);
                if let Ok(st) = self.child.wait() {
                    self.exited = Some(st);
                }
            }
        }
        signal_group(self.pid(), libc::SIGKILL);
        registry().groups.remove(&self.pid());
        self.exited
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Output of a finished command.
#[derive(Debug, Clone)]
pub struct Output {
    /// Exit code, or `None` if it was killed by a signal (e.g. on timeout).
    pub code: Option<i32>,
    /// Whether the command was killed because it ran past its timeout.
    pub timed_out: bool,
    /// On a timeout: what the command and its descendants were doing when it hit
    /// ([`describe_tree`]), taken before they were stopped.
    pub hung: Option<String>,
    /// Captured standard output.
    pub stdout: String,
    /// Captured standard error.
    pub stderr: String,
}

impl Output {
    /// True if the command exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "exit: {}{}",
            self.code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "signal".into()),
            if self.timed_out { " (timed out)" } else { "" }
        )?;
        writeln!(f, "--- stdout ---\n{}", self.stdout)?;
        write!(f, "--- stderr ---\n{}", self.stderr)?;
        if let Some(h) = &self.hung {
            write!(f, "\n--- when the timeout hit ---\n{h}")?;
        }
        Ok(())
    }
}

/// Runs `cmd` to completion in its own process group, capturing stdout and stderr (through
/// files in `scratch`, so a chatty child cannot block on a full pipe), killing the group after
/// `timeout`.
pub fn run_with_timeout(
    name: &str,
    mut cmd: Command,
    timeout: Duration,
    scratch: &std::path::Path,
) -> Result<Output> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out_path = scratch.join(format!(".run-{n}.out"));
    let err_path = scratch.join(format!(".run-{n}.err"));
    let out = std::fs::File::create(&out_path)
        .map_err(|e| Error::new(format!("cannot create {}: {e}", out_path.display())))?;
    let err = std::fs::File::create(&err_path)
        .map_err(|e| Error::new(format!("cannot create {}: {e}", err_path.display())))?;
    cmd.stdout(out).stderr(err);
    let mut p = Proc::spawn(name, cmd, Duration::from_millis(500))?;
    let status = p.wait_timeout(timeout);
    let timed_out = status.is_none();
    let hung = timed_out.then(|| describe_tree(p.pid()));
    let status = if timed_out { p.stop() } else { status };
    drop(p);
    let stdout = std::fs::read(&out_path).unwrap_or_default();
    let stderr = std::fs::read(&err_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&err_path);
    Ok(Output {
        code: status.and_then(|s| s.code()),
        timed_out,
        hung,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

/// What process `root` and its descendants are doing, for a test that gives up on them: per
/// process its command line, per thread its name, state and kernel wait channel, then every
/// thread's stack from `gdb` (each process given up to 30 s; without gdb, a line saying so).
/// Descendants in other process groups (daemons started with [`Proc`]) are included.
pub fn describe_tree(root: i32) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for pid in descendants(root) {
        let _ = writeln!(out, "process {pid}: {}", cmdline(pid).trim_end());
        for tid in threads_of(pid) {
            let t = PathBuf::from(format!("/proc/{pid}/task/{tid}"));
            let read = |f: &str| {
                std::fs::read_to_string(t.join(f))
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            };
            let state = stat_fields(&read("stat"))
                .and_then(|f| f.first().map(|s| s.to_string()))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  thread {tid} {:16} state {state} wchan {}",
                read("comm"),
                read("wchan")
            );
        }
        out.push_str(&gdb_stacks(pid));
    }
    out
}

/// Thread ids of process `pid`, ascending (`/proc/<pid>/task`; empty if it is gone).
pub fn threads_of(pid: i32) -> Vec<i32> {
    let mut tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    tids
}

/// The command line of process `pid`, its arguments separated by spaces (empty if it is
/// gone).
pub fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// The fields of a `/proc/.../stat` line after the command name (state first).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().collect())
}

/// `root` and every live process below it, parents before children.
fn descendants(root: i32) -> Vec<i32> {
    let mut parent_of = Vec::new();
    if let Ok(d) = std::fs::read_dir("/proc") {
        for e in d.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            if let Some(ppid) = stat_fields(&stat).and_then(|f| f.get(1)?.parse::<i32>().ok()) {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree
}

/// Every thread's stack of `pid` from a batch `gdb`, given up to 30 s (coreutils' `timeout`).
fn gdb_stacks(pid: i32) -> String {
    let out = Command::new("timeout")
        .args(["30", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", "thread apply all bt"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.code() == Some(127) => {
            "  (no stacks: gdb missing; apt-get install gdb)\n".into()
        }
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with('#') || l.starts_with("Thread "))
            .map(|l| format!("  {l}\n"))
            .collect(),
        Err(e) => format!("  (no stacks: {e})\n"),
    }
}

/// True if a process with this PID exists (any state but reaped).
pub fn pid_exists(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command past its limit is stopped with its whole group, and the output says what each
    /// of its processes and threads was doing then, with their stacks when gdb is installed.
    #[test]
    fn a_timeout_describes_the_tree_then_stops_it() {
        let scratch = std::env::temp_dir().join(format!("acm-fabric-hung-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).unwrap();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo started; sleep 30 & exec sleep 31"]);
        let o = run_with_timeout("sleeper", cmd, Duration::from_millis(300), &scratch).unwrap();
        let _ = std::fs::remove_dir_all(&scratch);
        assert!(o.timed_out && !o.success(), "{o}");
        assert_eq!(o.stdout, "started\n");
        let hung = o.hung.as_deref().expect("a description of the hung tree");
        // The leader (exec'd into `sleep 31`) and its child `sleep 30`, each with its thread.
        assert!(hung.contains("sleep 31"), "{hung}");
        assert!(hung.contains("sleep 30"), "{hung}");
        assert!(hung.contains("  thread "), "{hung}");
        assert!(hung.contains(" state S "), "{hung}");
        if Command::new("gdb").arg("--version").output().is_ok() {
            assert!(
                hung.contains("#0 "),
                "gdb is installed, yet no stack: {hung}"
            );
        }
        assert!(format!("{o}").contains("--- when the timeout hit ---"));
        // Nothing of the group survives.
        let leader: i32 = hung
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("process ")?.split(':').next()?.parse().ok())
            .unwrap();
        assert!(!pid_exists(leader), "{hung}");
    }

    /// `/proc/<pid>/stat` fields after a command name that has spaces and parentheses.
    #[test]
    fn stat_fields_skip_any_command_name() {
        let f = stat_fields("42 (a (b) c) S 7 42 42 0").unwrap();
        assert_eq!(&f[..3], ["S", "7", "42"]);
        assert!(stat_fields("garbage").is_none());
    }
}
