//! Checks for tests of a running [`Fabric`], shared by acm-fabric's own tests and the plugin's
//! real-daemon tests. They panic (with the fabric's logs where that helps) instead of returning
//! errors: each is one assertion of a test.

use crate::{Fabric, Output};
use std::collections::BTreeMap;
use std::time::Duration;

/// What `ib_acme -v` prints once the SA confirmed the resolved path.
pub const SA_VERIFIED: &str = "SA verification: success";

/// `ib_acme -f FMT -s SRC -d DST -v` on node `on`, retried for up to `within` until the SA
/// verified the path (the first calls of a fresh fabric race the endpoints' joins), then
/// [`check_path`] towards node `to`. Returns that output.
pub fn resolve_verified(
    f: &Fabric,
    on: &str,
    fmt: &str,
    src: &str,
    dst: &str,
    to: &str,
    within: Duration,
) -> Output {
    let node = f.node(on).unwrap();
    let out = node
        .acme_until(&["-f", fmt, "-s", src, "-d", dst, "-v"], within, |o| {
            o.stdout.contains(SA_VERIFIED)
        })
        .unwrap();
    let what = format!(
        "-f {fmt} {src} -> {dst} on {on} ({})",
        node.provider().name()
    );
    check_path(f, on, to, &what, &out);
    out
}

/// Panics unless `out` is a successful `ib_acme -v` whose path the SA verified and which runs
/// from node `on` to node `to` (both GIDs and LIDs). `what` heads the failure message.
pub fn check_path(f: &Fabric, on: &str, to: &str, what: &str, out: &Output) {
    let d = f.node(to).unwrap();
    let s = f.node(on).unwrap();
    assert!(
        out.success() && out.stdout.contains(SA_VERIFIED),
        "{what}:\n{out}\n{}",
        f.logs_report()
    );
    for want in [
        format!("dgid: {}\n", d.gid),
        format!("sgid: {}\n", s.gid),
        format!("dlid: {}\n", d.lid),
        format!("slid: {}\n", s.lid),
    ] {
        assert!(out.stdout.contains(&want), "{want:?} missing:\n{out}");
    }
}

/// `ib_acme -P col` on node `on` → the 7 global counters by name (panics unless all 7 parse).
pub fn global_counters(f: &Fabric, on: &str) -> BTreeMap<String, u64> {
    let out = f.node(on).unwrap().acme(&["-P", "col"]).unwrap();
    let map: BTreeMap<String, u64> = out
        .stdout
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(" : ")?;
            Some((k.trim().to_string(), v.trim().parse().ok()?))
        })
        .collect();
    assert_eq!(map.len(), 7, "ib_acme -P col:\n{out}");
    map
}

/// Panics with the reason unless the test runs as root: the real-daemon tests need mount
/// namespaces (a private `/run` per daemon). A test that cannot run fails; it never passes by
/// skipping.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert!(
        uid == 0,
        "this test needs root (uid {uid}): each daemon runs in its own mount namespace \
         (unshare -m, /run bind-mounted); run it as root, as scripts/test.sh and CI do"
    );
}

/// The P_Key line of a successful `ib_acme -v` output (`  pkey: 0x8001`), as a number.
pub fn path_pkey(out: &Output) -> Option<u16> {
    out.stdout.lines().find_map(|l| {
        let v = l.trim().strip_prefix("pkey: ")?;
        u16::from_str_radix(v.trim_start_matches("0x"), 16).ok()
    })
}
