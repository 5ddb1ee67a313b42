//! `libsimverbs.so`: simulated libibverbs and libibumad for hardware-free test fabrics.
//!
//! Preloaded, this library defines the `ibv_*` and `umad_*` entry points that an unmodified
//! program (the real `ibacm`, the stock `libibacmp.so`, `ibv_devinfo`, ...) calls, and gives
//! it a simulated host: one or more HCAs, each with one or more ports, each port one ibsim
//! node on an ibsim instance (a subnet) of its own choosing (`SIMVERBS_HOST`, or the one port
//! of `SIM_HOST`). Verbs and umad see the same CAs, ports, GUIDs, LIDs and P_Keys.
//!
//! * [`host`]: the host's ports, one ibsim client each ([`ibsim`]: the client protocol), and
//!   what arrives on them.
//! * [`umad`]: libibumad's API over those ports (agents, timeouts, the CA and port queries).
//! * [`device`]: device list, open/close, the query verbs, async events and the port monitor.
//! * [`control`]: the per-process control socket (`@simverbs/<fabric>/<node>/ctl`).
//! * [`mem`], [`cq`], [`qp`]: protection domains, memory regions, completion queues and
//!   channels, UD queue pairs, address handles and multicast.
//! * [`transport`]: the datagram transport between processes (abstract unix sockets keyed by
//!   fabric, LID and QPN; multicast membership files) and the loss/delay knobs.
//! * [`gsi`]: the GSI bridge, UD sends to remote QPN 1 and their answers through the QP's
//!   port.
//! * [`capture`]: `SIMVERBS_PCAP`, every sent datagram as an InfiniBand frame in a pcap file.
//! * [`netlink`]: `SIMVERBS_NETLINK_DIR`, the kernel's RDMA netlink local-service socket, its
//!   other end driven by a test tool.
//!
//! Every exported function runs its body inside `guard`, so no panic crosses the C ABI.
//! See `docs/simverbs.md` for the design, the control protocol and the gotchas.
//!
//! # Safety
//!
//! The exported `ibv_*` functions are `unsafe extern "C"`: they share libibverbs' contract.
//! Every object pointer must be NULL or an object this library returned and that was not yet
//! destroyed (objects carry a magic number, so a foreign pointer to readable memory is
//! refused with EINVAL, but a dangling one cannot be detected); every out-pointer must be
//! writable; scatter/gather lists and work-request chains must be as long as declared.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
// The shared contract above is the safety documentation of every exported function.
#![allow(clippy::missing_safety_doc)]

pub mod capture;
pub mod control;
pub mod cq;
pub mod device;
pub mod gsi;
pub mod host;
pub mod ibsim;
#[cfg(test)]
mod layout;
pub mod mem;
pub mod netlink;
pub mod qp;
pub mod transport;
pub mod umad;

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`, turning a panic into `on_panic` (and errno `EIO`) so that no unwinding crosses
/// the C ABI. Used by every `extern "C"` entry point.
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            log(format_args!(
                "internal error (panic) caught at the C ABI boundary"
            ));
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// Resolves a pointer simverbs handed to C (the first field of one of its `#[repr(C)]`
/// objects) back to the object; `None` if it is NULL or the object's `magic` is not `want`.
///
/// # Safety
/// `p` must be NULL or point at the first field of a live `T`.
pub(crate) unsafe fn resolve<'a, P, T>(
    p: *mut P,
    magic: fn(&T) -> u64,
    want: u64,
) -> Option<&'a T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: per the contract, p is the first field of a live T.
    let obj = unsafe { &*(p as *const T) };
    (magic(obj) == want).then_some(obj)
}

/// [`resolve`], setting errno to EINVAL when it gives `None`.
///
/// # Safety
/// As [`resolve`].
pub(crate) unsafe fn resolve_or_einval<'a, P, T>(
    p: *mut P,
    magic: fn(&T) -> u64,
    want: u64,
) -> Option<&'a T> {
    // SAFETY: the caller upholds resolve's contract.
    let obj = unsafe { resolve(p, magic, want) };
    if obj.is_none() {
        set_errno(libc::EINVAL);
    }
    obj
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(code: i32) {
    // SAFETY: __errno_location always returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() = code };
}

/// Diagnostics go to stderr, prefixed, and only when `SIMVERBS_DEBUG` is set (errors that a
/// caller cannot see otherwise use [`log`] unconditionally).
pub(crate) fn debug(args: std::fmt::Arguments<'_>) {
    if std::env::var_os("SIMVERBS_DEBUG").is_some() {
        log(args);
    }
}

/// Writes one diagnostic line to stderr.
pub(crate) fn log(args: std::fmt::Arguments<'_>) {
    eprintln!("simverbs[{}]: {}", std::process::id(), args);
}

/// Copies `s` into a fixed C char array, truncating and always NUL-terminating.
pub(crate) fn copy_cstr(dst: &mut [libc::c_char], s: &str) {
    if dst.is_empty() {
        return;
    }
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as libc::c_char;
    }
    dst[n] = 0;
}
