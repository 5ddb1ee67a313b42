//! The kernel's RDMA netlink local service (`NETLINK_RDMA`, `RDMA_NL_LS`), simulated at the
//! syscall boundary for the one process that uses it: the ibacm daemon.
//!
//! On a host with RDMA netlink, kernel consumers (NFS/RDMA, iSER, SRP, Lustre) ask ibacm for
//! paths through a netlink socket the core opens with `socket(PF_NETLINK, SOCK_RAW,
//! NETLINK_RDMA)` and `bind(sockaddr_nl{groups = RDMA_NL_GROUP_LS})`; the core `recv()`s each
//! `RDMA_NL_LS_OP_RESOLVE` message and `sendto()`s the answer to the group. The machines
//! this project runs on have no RDMA netlink, so with `SIMVERBS_NETLINK_DIR=<dir>` set:
//!
//! * `socket(AF_NETLINK, SOCK_RAW, NETLINK_RDMA)` returns a unix datagram socket bound to
//!   `<dir>/ibacm-nl.sock` (the kernel's "user" end);
//! * `bind` on it succeeds without doing anything (the address is a `sockaddr_nl`);
//! * `sendto` on it goes to `<dir>/kernel-nl.sock`, where a test tool plays the kernel
//!   (`acm_fabric::kernel`): it sends requests to `ibacm-nl.sock` in the kernel's message
//!   format (`rdma/rdma_netlink.h`) and reads the answers;
//! * `recv` needs nothing: a unix datagram socket delivers one message per call, as netlink.
//!
//! Every other `socket`, `bind` and `sendto` call goes to libc unchanged (found with
//! `dlsym(RTLD_NEXT)`). Without the variable nothing changes: the core logs, as on these
//! machines, `acm_init_nl: ERROR - unable to allocate netlink recv socket`.

use std::ffi::{c_int, c_void, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

/// `NETLINK_RDMA` (linux/netlink.h).
pub const NETLINK_RDMA: c_int = 20;
/// The daemon's end, in `SIMVERBS_NETLINK_DIR`.
pub const DAEMON_SOCK: &str = "ibacm-nl.sock";
/// The simulated kernel's end, in `SIMVERBS_NETLINK_DIR`.
pub const KERNEL_SOCK: &str = "kernel-nl.sock";

/// The descriptor handed out for the simulated netlink socket (-1: none).
static NL_FD: AtomicI32 = AtomicI32::new(-1);

type SocketFn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
type BindFn = unsafe extern "C" fn(c_int, *const libc::sockaddr, libc::socklen_t) -> c_int;
type SendtoFn = unsafe extern "C" fn(
    c_int,
    *const c_void,
    usize,
    c_int,
    *const libc::sockaddr,
    libc::socklen_t,
) -> isize;

/// libc's definition of `name` (the next one after ours in the lookup order).
fn next<F: Copy>(name: &str) -> Option<F> {
    let c = CString::new(name).ok()?;
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name has no other precondition.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, c.as_ptr()) };
    if p.is_null() {
        return None;
    }
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: F is the function pointer type of libc's `name` (the callers below name the
    // matching prototype), the same size as the data pointer dlsym returned.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

fn real_socket() -> Option<SocketFn> {
    static F: OnceLock<Option<SocketFn>> = OnceLock::new();
    *F.get_or_init(|| next::<SocketFn>("socket"))
}

fn real_bind() -> Option<BindFn> {
    static F: OnceLock<Option<BindFn>> = OnceLock::new();
    *F.get_or_init(|| next::<BindFn>("bind"))
}

fn real_sendto() -> Option<SendtoFn> {
    static F: OnceLock<Option<SendtoFn>> = OnceLock::new();
    *F.get_or_init(|| next::<SendtoFn>("sendto"))
}

fn dir() -> Option<PathBuf> {
    std::env::var_os("SIMVERBS_NETLINK_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// A `sockaddr_un` for `path` (`None` if it does not fit).
fn unix_addr(path: &std::path::Path) -> Option<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = path.as_os_str().as_bytes();
    if b.len() >= a.sun_path.len() {
        return None;
    }
    for (d, s) in a.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + b.len() + 1;
    Some((a, len as libc::socklen_t))
}

/// The simulated netlink socket: a unix datagram socket bound to `<dir>/ibacm-nl.sock`.
fn open_simulated(real: SocketFn, dir: &std::path::Path, flags: c_int) -> c_int {
    // SAFETY: libc's socket with constant arguments.
    let fd = unsafe { real(libc::AF_UNIX, libc::SOCK_DGRAM | flags, 0) };
    if fd < 0 {
        return fd;
    }
    let path = dir.join(DAEMON_SOCK);
    let _ = std::fs::remove_file(&path);
    let Some((addr, len)) = unix_addr(&path) else {
        // SAFETY: fd is the socket just created.
        unsafe { libc::close(fd) };
        crate::set_errno(libc::ENAMETOOLONG);
        return -1;
    };
    let bound = match real_bind() {
        // SAFETY: addr is a valid sockaddr_un of `len` bytes.
        Some(b) => unsafe { b(fd, (&addr as *const libc::sockaddr_un).cast(), len) },
        None => -1,
    };
    if bound != 0 {
        crate::log(format_args!(
            "netlink: cannot bind {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
        // SAFETY: fd is the socket just created.
        unsafe { libc::close(fd) };
        return -1;
    }
    NL_FD.store(fd, Ordering::Release);
    crate::log(format_args!(
        "netlink: NETLINK_RDMA simulated on {}",
        path.display()
    ));
    fd
}

/// `socket(2)`: a `NETLINK_RDMA` socket is simulated when `SIMVERBS_NETLINK_DIR` is set;
/// everything else is libc's.
#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    crate::guard(-1, || {
        let Some(real) = real_socket() else {
            crate::set_errno(libc::ENOSYS);
            return -1;
        };
        if domain == libc::AF_NETLINK && protocol == NETLINK_RDMA {
            if let Some(d) = dir() {
                let flags = ty & (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
                return open_simulated(real, &d, flags);
            }
        }
        // SAFETY: libc's socket with the caller's arguments.
        unsafe { real(domain, ty, protocol) }
    })
}

/// `bind(2)`: the simulated netlink socket is bound already (its `sockaddr_nl` names the
/// local-service group); everything else is libc's.
#[no_mangle]
pub unsafe extern "C" fn bind(
    fd: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    crate::guard(-1, || {
        if fd >= 0 && fd == NL_FD.load(Ordering::Acquire) {
            return 0;
        }
        match real_bind() {
            // SAFETY: libc's bind with the caller's arguments.
            Some(b) => unsafe { b(fd, addr, len) },
            None => {
                crate::set_errno(libc::ENOSYS);
                -1
            }
        }
    })
}

/// `sendto(2)`: what the daemon sends on the simulated netlink socket goes to the simulated
/// kernel (`<dir>/kernel-nl.sock`); everything else is libc's.
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    addr: *const libc::sockaddr,
    alen: libc::socklen_t,
) -> isize {
    crate::guard(-1, || {
        let Some(real) = real_sendto() else {
            crate::set_errno(libc::ENOSYS);
            return -1;
        };
        if fd >= 0 && fd == NL_FD.load(Ordering::Acquire) {
            if let Some((k, klen)) = dir().and_then(|d| unix_addr(&d.join(KERNEL_SOCK))) {
                // SAFETY: buf/len are the caller's; k is a valid sockaddr_un of klen bytes.
                return unsafe {
                    real(
                        fd,
                        buf,
                        len,
                        flags,
                        (&k as *const libc::sockaddr_un).cast(),
                        klen,
                    )
                };
            }
        }
        // SAFETY: libc's sendto with the caller's arguments.
        unsafe { real(fd, buf, len, flags, addr, alen) }
    })
}
