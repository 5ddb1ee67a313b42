//! The acmrs Debian package, end to end on this machine: `scripts/package.sh` builds it; dpkg
//! refuses to configure it without ibacm (shown in a private dpkg database that lacks ibacm);
//! `dpkg -i` installs it into the real system; real ibacm daemons on the simulated fabric load
//! it from their **default provider directory** (no `provider_lib_path`,
//! [`Provider::Installed`]) and `ib_acme` resolves through it with SA verification; `dpkg
//! --purge` leaves nothing of it, and the stock `libibacmp.so` next to it is byte-for-byte the
//! same before, during and after.
//!
//! This test changes the real system for a few seconds: runs of it are serialised by a lock
//! file, and a guard purges the package on every exit path (also when an assertion fails).
//! Other daemons on the machine (other tests, other worktrees) load providers through
//! `provider_lib_path` from their own directories, so the extra `libacmrs.so` in the system
//! directory never reaches them, and libibacmp.so is never touched.
//!
//! Needs root, `libsimverbs.so` built in the same target directory (as every fabric test), and
//! whatever `scripts/package.sh` installs for itself (pandoc, dpkg-dev, cargo-deb).

use acm_fabric::{Fabric, Output, Provider, Topology, DEFAULT_PROVIDER_DIR, STOCK_PROVIDER};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const PACKAGE: &str = "acmrs";
const LIB: &str = "/usr/lib/x86_64-linux-gnu/ibacm/libacmrs.so";
/// Every regular file the package must install.
const FILES: [&str; 6] = [
    LIB,
    "/usr/bin/madtool",
    "/usr/bin/acmrs-stat",
    "/usr/share/man/man7/acmrs.7.gz",
    "/usr/share/doc/acmrs/ibacm_opts.cfg.example",
    "/usr/share/doc/acmrs/copyright",
];
const VERIFIED: &str = "SA verification: success";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

fn run(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    Output {
        code: out.status.code(),
        timed_out: false,
        hung: None,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// dpkg (the real database), retried for up to 2 minutes while another dpkg/apt holds its lock.
fn dpkg(args: &[&str]) -> Output {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = run("dpkg", args);
        let locked = !out.success()
            && (out.stderr.contains("lock") && out.stderr.contains("held")
                || out.stderr.contains("frontend lock"));
        if !locked || Instant::now() > deadline {
            return out;
        }
        eprintln!(
            "dpkg is locked by another process, retrying: {}",
            out.stderr.trim()
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

fn installed() -> bool {
    run("dpkg-query", &["-W", "-f=${Status}", PACKAGE])
        .stdout
        .contains("install ok installed")
}

/// Whether dpkg knows the package at all (any state but purged).
fn known_to_dpkg() -> bool {
    let out = run("dpkg-query", &["-W", "-f=${Status}", PACKAGE]);
    out.success() && !out.stdout.contains("not-installed")
}

fn sha256(path: &str) -> String {
    let out = run("sha256sum", &[path]);
    assert!(out.success(), "sha256sum {path}: {out}");
    out.stdout
        .split_whitespace()
        .next()
        .expect("a checksum")
        .to_string()
}

/// Holds an exclusive `flock` on a machine-wide lock file: one package test at a time.
struct MachineLock {
    _file: std::fs::File,
}

impl MachineLock {
    fn take() -> MachineLock {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open("/run/lock/acmrs-package-test.lock")
            .or_else(|_| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open("/tmp/acmrs-package-test.lock")
            })
            .expect("lock file");
        // SAFETY: flock on a file descriptor we own; blocks until the lock is free and is
        // released when the file is closed (also if this process dies).
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
        MachineLock { _file: f }
    }
}

/// Purges the package when dropped, whatever happened before.
struct PurgeGuard;

impl PurgeGuard {
    fn purge(&self) -> Output {
        dpkg(&["--purge", PACKAGE])
    }
}

impl Drop for PurgeGuard {
    fn drop(&mut self) {
        if known_to_dpkg() {
            let out = self.purge();
            if !out.success() {
                eprintln!("package test: dpkg --purge {PACKAGE} failed in cleanup: {out}");
            }
        }
    }
}

/// `bash scripts/package.sh` → the path of the `.deb` (its only stdout line).
fn build_package() -> PathBuf {
    let t0 = Instant::now();
    let out = Command::new("bash")
        .arg("scripts/package.sh")
        .current_dir(workspace_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("bash scripts/package.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "package.sh failed: {stdout}");
    let deb = PathBuf::from(stdout.trim());
    assert!(
        deb.is_file() && deb.extension().is_some_and(|e| e == "deb"),
        "package.sh printed {stdout:?}"
    );
    eprintln!(
        "package test: built {} in {:.1} s",
        deb.display(),
        t0.elapsed().as_secs_f64()
    );
    deb
}

/// dpkg in a private database that has every installed package except ibacm: it must leave
/// acmrs unconfigured because of the missing ibacm, and only because of it.
fn refused_without_ibacm(deb: &Path) {
    let root = std::env::temp_dir().join(format!("acmrs-dpkg-root-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let admin = root.join("var/lib/dpkg");
    for d in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(admin.join(d)).unwrap();
    }
    let status = std::fs::read_to_string("/var/lib/dpkg/status").unwrap();
    let without: Vec<&str> = status
        .split("\n\n")
        .filter(|stanza| !stanza.lines().any(|l| l == "Package: ibacm"))
        .collect();
    assert!(
        without.len() < status.split("\n\n").count(),
        "ibacm is not installed here"
    );
    std::fs::write(admin.join("status"), without.join("\n\n")).unwrap();
    std::fs::write(admin.join("available"), "").unwrap();
    let root_s = root.to_str().unwrap().to_string();
    let admin_s = admin.to_str().unwrap().to_string();
    let out = run(
        "dpkg",
        &[
            &format!("--root={root_s}"),
            &format!("--admindir={admin_s}"),
            "--log=/dev/null",
            "-i",
            deb.to_str().unwrap(),
        ],
    );
    let _ = std::fs::remove_dir_all(&root);
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(!out.success(), "dpkg accepted acmrs without ibacm:\n{out}");
    assert!(
        all.contains("acmrs depends on ibacm (>= 44.0); however:")
            && all.contains("Package ibacm is not installed."),
        "{out}"
    );
    assert!(all.contains("leaving unconfigured"), "{out}");
    // Nothing but ibacm was missing.
    assert_eq!(all.matches("however:").count(), 1, "{out}");
}

#[test]
fn deb_installs_into_the_default_provider_dir_resolves_and_purges_cleanly() {
    let _lock = MachineLock::take();
    let stock_sum = sha256(STOCK_PROVIDER);
    let guard = PurgeGuard;
    if known_to_dpkg() {
        eprintln!("package test: {PACKAGE} left over from an earlier run: purging it first");
        let out = guard.purge();
        assert!(out.success(), "{out}");
    }
    assert!(!Path::new(LIB).exists(), "{LIB} exists without the package");

    let deb = build_package();
    refused_without_ibacm(&deb);
    let fields = run(
        "dpkg-deb",
        &["--field", deb.to_str().unwrap(), "Package", "Depends"],
    );
    assert!(fields.stdout.contains("Package: acmrs"), "{fields}");
    assert!(fields.stdout.contains("ibacm (>= 44.0)"), "{fields}");

    // Install into the real system.
    let out = dpkg(&["-i", deb.to_str().unwrap()]);
    assert!(out.success(), "dpkg -i: {out}");
    eprintln!("package test: dpkg -i:\n{}", out.stdout.trim_end());
    assert!(installed(), "dpkg -i succeeded but acmrs is not installed");
    let listed = dpkg(&["-L", PACKAGE]);
    assert!(listed.success(), "{listed}");
    for f in FILES {
        assert!(
            listed.stdout.lines().any(|l| l == f),
            "dpkg -L lacks {f}:\n{listed}"
        );
        assert!(Path::new(f).is_file(), "{f} not installed");
    }
    assert_eq!(
        sha256(STOCK_PROVIDER),
        stock_sum,
        "installing acmrs changed libibacmp.so"
    );
    let providers: Vec<String> = std::fs::read_dir(DEFAULT_PROVIDER_DIR)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        providers.iter().any(|p| p == "libibacmp.so")
            && providers.iter().any(|p| p == "libacmrs.so"),
        "{providers:?}"
    );
    // The installed man page is found by man and renders without warnings.
    let man = run("man", &["-w", "acmrs"]);
    assert_eq!(man.stdout.trim(), "/usr/share/man/man7/acmrs.7.gz", "{man}");
    let rendered = Command::new("man")
        .args(["--warnings", "7", "acmrs"])
        .env("MANWIDTH", "80")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&rendered.stdout);
    let warnings = String::from_utf8_lossy(&rendered.stderr);
    assert!(
        rendered.status.success() && warnings.trim().is_empty(),
        "{warnings}"
    );
    assert!(text.contains("acmrs_poll_mode"), "{text}");
    // madtool runs from /usr/bin (decodes an all-zero MAD header).
    let madtool = run("/usr/bin/madtool", &["decode", "--hex", &"00".repeat(256)]);
    assert!(
        madtool.success() && madtool.stdout.contains("MgmtClass"),
        "{madtool}"
    );
    // acmrs-stat runs from /usr/bin and says clearly when no acmrs provider serves.
    let stat = run(
        "/usr/bin/acmrs-stat",
        &["--socket", "/nonexistent/acmrs.sock"],
    );
    assert!(
        !stat.success()
            && (stat.stderr.contains("no acmrs provider")
                || stat.stdout.contains("no acmrs provider")),
        "{stat}"
    );

    // The real daemon, from its default provider directory, on the simulated fabric.
    {
        let f = Fabric::builder(
            Topology::example("net.2sw2path4hca").unwrap(),
            ["Hca3", "Hca4"],
        )
        .provider(Provider::Installed {
            name: "acmrs".into(),
        })
        .name_prefix("package")
        .start()
        .unwrap_or_else(|e| panic!("bring-up with the installed acmrs failed: {e}"));
        for n in f.nodes() {
            let opts = std::fs::read_to_string(n.dir.join("ibacm_opts.cfg")).unwrap();
            assert!(
                !opts
                    .lines()
                    .any(|l| l.trim_start().starts_with("provider_lib_path")),
                "{}: a provider_lib_path line in\n{opts}",
                n.name
            );
            assert!(
                opts.lines().any(|l| l == "provider acmrs default"),
                "{opts}"
            );
            assert!(
                !n.dir.join("prov").join("libacmrs.so").exists(),
                "library copied for an installed provider"
            );
            let log = n.log();
            assert!(
                log.contains(&format!("provider lib path {DEFAULT_PROVIDER_DIR}")),
                "{}",
                f.logs_report()
            );
            assert!(
                log.contains(&format!("Provider acmrs ({LIB}) loaded")),
                "{}",
                f.logs_report()
            );
            let e = n.acme(&["-e"]).unwrap();
            assert!(e.stdout.contains(",acmrs,"), "-e on {}:\n{e}", n.name);
        }
        let (s, d) = (f.node("Hca3").unwrap(), f.node("Hca4").unwrap());
        let (slid, dlid) = (s.lid.to_string(), d.lid.to_string());
        let out = s
            .acme_until(
                &["-f", "l", "-s", &slid, "-d", &dlid, "-v"],
                Duration::from_secs(15),
                |o| o.stdout.contains(VERIFIED),
            )
            .unwrap();
        assert!(
            out.success() && out.stdout.contains(VERIFIED),
            "-f l {slid} -> {dlid}:\n{out}\n{}",
            f.logs_report()
        );
        assert!(out.stdout.contains(&format!("dlid: {dlid}\n")), "{out}");
        assert!(out.stdout.contains(&format!("slid: {slid}\n")), "{out}");
        eprintln!("package test: ib_acme -f l -s {slid} -d {dlid} -v on Hca3:\n{out}");
        // Again: a cache hit of the installed provider.
        let again = s.acme(&["-f", "l", "-s", &slid, "-d", &dlid]).unwrap();
        assert!(again.stdout.contains(&format!("dlid: {dlid}\n")), "{again}");
        let perf = s.acme(&["-P", "col"]).unwrap();
        let route_hits = perf
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("Route Cache Count : "))
            .and_then(|v| v.trim().parse::<u64>().ok());
        assert!(route_hits.is_some_and(|n| n >= 1), "{perf}");
        assert_eq!(sha256(STOCK_PROVIDER), stock_sum);
    } // fabric torn down (daemons stopped) before the purge

    let out = guard.purge();
    assert!(out.success(), "dpkg --purge: {out}");
    assert!(!known_to_dpkg(), "acmrs still known to dpkg after --purge");
    let listed = dpkg(&["-L", PACKAGE]);
    assert!(!listed.success(), "dpkg -L after purge: {listed}");
    for f in FILES {
        assert!(!Path::new(f).exists(), "{f} left after purge");
    }
    assert!(!Path::new("/usr/share/doc/acmrs").exists(), "doc dir left");
    assert!(Path::new(DEFAULT_PROVIDER_DIR).is_dir());
    assert_eq!(
        sha256(STOCK_PROVIDER),
        stock_sum,
        "libibacmp.so changed across install and purge"
    );
}
