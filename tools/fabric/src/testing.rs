//! Support for tests that start their own processes under `libumad2sim.so:libsimverbs.so`
//! on a [`Fabric`](crate::Fabric) (simverbs' and the dataplane's harnesses): the freshly built
//! `libsimverbs.so` of the running test's target directory, the `LD_PRELOAD` value, and
//! stopping a child by PID. They panic: each is a precondition or cleanup of a test.

use crate::fabric::UMAD2SIM;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

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

/// `LD_PRELOAD` value for simulated verbs processes: umad2sim, then [`libsimverbs`].
pub fn preload() -> String {
    assert!(
        Path::new(UMAD2SIM).exists(),
        "{UMAD2SIM} missing: apt-get install libumad2sim0"
    );
    format!("{}:{}", UMAD2SIM, libsimverbs().display())
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
