//! Race-free TCP ports for the daemons' `server_port`.
//!
//! A port is *leased*: [`PortPool::reserve`] takes an exclusive, non-blocking `flock` on
//! `<dir>/<port>.lock` (one file per port, in a directory shared by every process on the
//! machine, default [`DEFAULT_DIR`]) and then checks with a `bind` (without `SO_REUSEADDR`,
//! like ibacm's own bind) that nothing else holds the port. The [`PortLease`] keeps the lock
//! for as long as it lives (a [`Node`](crate::Node) keeps it for its whole life, across daemon
//! restarts); the kernel drops it when the file is closed, also when the process dies, so a
//! crashed test never leaves a port reserved. Two leases on one port cannot exist at the same
//! time, whether they are asked for by threads of one process (each lease opens its own file
//! description, and `flock` locks are per description) or by different processes.
//!
//! The ports come from a fixed range ([`DEFAULT_RANGE`], below Linux's default ephemeral range
//! 32768–60999, so the kernel never hands one of them to a client `connect()` or to a `bind`
//! of port 0 between the check and the daemon's own bind; and below 32768 because ibacm keeps
//! `server_port` in a signed `short`). What is left (a program outside acm-fabric binding a
//! port of the range explicitly in that window) is handled by the fabric: a daemon whose log
//! says `unable to bind listen socket` is restarted on a new lease.
//!
//! `$ACM_FABRIC_PORT_DIR` and `$ACM_FABRIC_PORTS` (`FIRST-LAST`) change the directory and the
//! range of [`PortPool::shared`].

use crate::{Error, Result};
use std::fs::File;
use std::ops::RangeInclusive;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// The lock directory of [`PortPool::shared`] (not `$TMPDIR`: every process must agree).
pub const DEFAULT_DIR: &str = "/tmp/acm-fabric-ports";
/// The port range of [`PortPool::shared`].
pub const DEFAULT_RANGE: RangeInclusive<u16> = 24000..=27999;

/// A directory of per-port lock files and the range of ports they stand for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortPool {
    dir: PathBuf,
    first: u16,
    last: u16,
}

/// One reserved port: no other lease on it exists while this one lives.
#[derive(Debug)]
pub struct PortLease {
    port: u16,
    /// Holds the `flock`; closing it (drop) releases the port.
    _lock: File,
}

impl PortLease {
    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// Where each process starts scanning the range (spreads processes over the range, so they
/// rarely even try the same lock file); only an optimisation, the lock decides.
static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);

impl PortPool {
    /// The pool every acm-fabric user on this machine shares: [`DEFAULT_DIR`] and
    /// [`DEFAULT_RANGE`], or `$ACM_FABRIC_PORT_DIR` / `$ACM_FABRIC_PORTS=FIRST-LAST`.
    pub fn shared() -> Result<PortPool> {
        let dir = std::env::var_os("ACM_FABRIC_PORT_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
        let range = match std::env::var("ACM_FABRIC_PORTS") {
            Ok(s) => parse_range(&s)
                .ok_or_else(|| Error::new(format!("$ACM_FABRIC_PORTS={s:?} is not FIRST-LAST")))?,
            Err(_) => DEFAULT_RANGE,
        };
        PortPool::new(dir, range)
    }

    /// A pool of the ports in `range` whose locks live in `dir` (created if missing).
    pub fn new(dir: impl Into<PathBuf>, range: RangeInclusive<u16>) -> Result<PortPool> {
        let dir = dir.into();
        let (first, last) = (*range.start(), *range.end());
        if first == 0 || first > last {
            return Err(Error::new(format!("bad port range {first}-{last}")));
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::new(format!("cannot create {}: {e}", dir.display())))?;
        Ok(PortPool { dir, first, last })
    }

    /// The lock directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The port range.
    pub fn range(&self) -> RangeInclusive<u16> {
        self.first..=self.last
    }

    /// Leases a port of the range that no other lease holds and that a bind shows free.
    pub fn reserve(&self) -> Result<PortLease> {
        self.reserve_avoiding(&[])
    }

    /// As [`PortPool::reserve`], never returning one of `avoid` (e.g. a port a daemon just
    /// failed to bind, while its old lease is still held).
    pub fn reserve_avoiding(&self, avoid: &[u16]) -> Result<PortLease> {
        let count = u32::from(self.last - self.first) + 1;
        let start = next_start(count);
        let mut busy = 0u32;
        for i in 0..count {
            let port = self.first + ((start + i) % count) as u16;
            if avoid.contains(&port) {
                continue;
            }
            let path = self.dir.join(format!("{port}.lock"));
            let f = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|e| Error::new(format!("cannot open {}: {e}", path.display())))?;
            // SAFETY: flock on a valid open file descriptor owned by `f`; no memory involved.
            let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if r != 0 {
                busy += 1;
                continue; // another lease (this process or another) holds it
            }
            if !bind_free(port) {
                busy += 1;
                continue; // someone outside the pool uses it; the lock is dropped with `f`
            }
            CURSOR.store((start + i + 1) % count, Ordering::Relaxed);
            return Ok(PortLease { port, _lock: f });
        }
        Err(Error::new(format!(
            "no free TCP port in {}-{} ({busy} leased or in use; locks in {})",
            self.first,
            self.last,
            self.dir.display()
        )))
    }
}

/// First scan position of this process: derived from the PID once, then advancing.
fn next_start(count: u32) -> u32 {
    let c = CURSOR.load(Ordering::Relaxed);
    if c != u32::MAX {
        return c % count;
    }
    let seed = std::process::id().wrapping_mul(2_654_435_761) % count;
    let _ = CURSOR.compare_exchange(u32::MAX, seed, Ordering::Relaxed, Ordering::Relaxed);
    CURSOR.load(Ordering::Relaxed) % count
}

fn parse_range(s: &str) -> Option<RangeInclusive<u16>> {
    let (a, b) = s.trim().split_once('-')?;
    let (a, b): (u16, u16) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (a != 0 && a <= b).then_some(a..=b)
}

/// Whether a TCP socket can bind `0.0.0.0:port` right now without `SO_REUSEADDR` (std's
/// `TcpListener::bind` sets it, which would call a port with a TIME_WAIT connection free, yet
/// ibacm's bind without it fails there). The wildcard address also conflicts with a socket on
/// `127.0.0.1:port`, the address ibacm's `server_mode loop` binds.
pub fn bind_free(port: u16) -> bool {
    // SAFETY: plain socket syscall; the returned descriptor is checked and closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: sockaddr_in is plain data; zeroed is a valid value, then filled in.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    addr.sin_family = libc::AF_INET as libc::sa_family_t;
    addr.sin_port = port.to_be();
    addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::UNSPECIFIED).to_be();
    // SAFETY: `addr` is a valid sockaddr_in that outlives the call and the length matches it;
    // `fd` is the socket created above, closed exactly once right after.
    unsafe {
        let r = libc::bind(
            fd,
            (&addr as *const libc::sockaddr_in).cast::<libc::sockaddr>(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        libc::close(fd);
        r == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(tag: &str, range: RangeInclusive<u16>) -> PortPool {
        let dir = std::env::temp_dir().join(format!("acmfab-ports-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        PortPool::new(dir, range).unwrap()
    }

    #[test]
    fn ranges_parse() {
        assert_eq!(parse_range("24000-27999"), Some(24000..=27999));
        assert_eq!(parse_range(" 5 - 5 "), Some(5..=5));
        assert_eq!(parse_range("9-8"), None);
        assert_eq!(parse_range("0-8"), None);
        assert_eq!(parse_range("x"), None);
        let (nine, eight) = (9u16, 8u16);
        assert!(PortPool::new("/tmp", nine..=eight).is_err());
    }

    #[test]
    fn leases_exclude_each_other_until_dropped() {
        // Below the shared range (whose daemons, started by earlier test binaries, may still be
        // binding and closing their ports) and apart from tests/ports.rs's 23000-23199.
        let p = pool("excl", 23900..=23903);
        let a = p.reserve().unwrap();
        let b = p.reserve().unwrap();
        assert_ne!(a.port(), b.port());
        let c = p.reserve_avoiding(&[a.port(), b.port()]).unwrap();
        let mut held: Vec<PortLease> = vec![a, b, c];
        // The range has 4 ports: at most one more (fewer if something outside uses one).
        while let Ok(l) = p.reserve() {
            held.push(l);
        }
        let mut ports: Vec<u16> = held.iter().map(PortLease::port).collect();
        ports.sort();
        ports.dedup();
        assert_eq!(ports.len(), held.len(), "duplicate lease: {ports:?}");
        let e = p.reserve().unwrap_err().to_string();
        assert!(e.contains("no free TCP port in 23900-23903"), "{e}");
        let freed = held.pop().unwrap().port();
        // A process another test of this binary spawns at the same moment holds a copy of every
        // descriptor open in it, so of a lease's lock too, from its fork until its exec closes
        // them (they are close-on-exec): a lease dropped in that window is free again only
        // after it. Wait for that, bounded.
        let again = (0..200).find_map(|_| {
            p.reserve().ok().or_else(|| {
                std::thread::sleep(std::time::Duration::from_millis(5));
                None
            })
        });
        assert_eq!(again.map(|l| l.port()), Some(freed));
        let _ = std::fs::remove_dir_all(p.dir());
    }

    #[test]
    fn a_bound_port_is_skipped() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(!bind_free(port));
        let p = pool("bound", port..=port);
        assert!(p.reserve().is_err());
        drop(l);
        assert!(bind_free(port));
        assert_eq!(p.reserve().unwrap().port(), port);
        let _ = std::fs::remove_dir_all(p.dir());
    }
}
