//! Protection domains and memory regions.
//!
//! Registration records (address range, IOVA, access flags, PD) in a process-wide table keyed
//! by lkey. The data path resolves every scatter/gather element through [`resolve_sge`], so a
//! work request that references memory outside a region of its QP's PD, or writes to a region
//! without `IBV_ACCESS_LOCAL_WRITE`, fails with a protection error as on hardware.

use crate::device::{context_state, ContextState};
use crate::{guard, set_errno};
use rdma_sys::*;
use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

const PD_MAGIC: u64 = 0x5349_4d56_5044_3031; // "SIMVPD01"
const MR_MAGIC: u64 = 0x5349_4d56_4d52_3031; // "SIMVMR01"

/// Our `ibv_pd`.
#[repr(C)]
pub struct SimPd {
    pub pd: ibv_pd,
    magic: u64,
    pub ctx: Arc<ContextState>,
    /// MRs, QPs and AHs still using this PD.
    pub users: AtomicUsize,
}

impl SimPd {
    /// Resolves a C pointer we handed out; `None` (errno EINVAL) otherwise.
    ///
    /// # Safety
    /// `p` must be NULL or a pointer returned by [`ibv_alloc_pd`] and not yet deallocated.
    pub unsafe fn from_ptr<'a>(p: *mut ibv_pd) -> Option<&'a SimPd> {
        // SAFETY: this function's contract is resolve's contract for this type.
        unsafe { crate::resolve_or_einval(p, |s: &SimPd| s.magic, PD_MAGIC) }
    }
}

/// Our `ibv_mr`.
#[repr(C)]
pub struct SimMr {
    pub mr: ibv_mr,
    magic: u64,
}

/// A registered region.
#[derive(Clone, Copy, Debug)]
struct Region {
    addr: usize,
    iova: u64,
    len: usize,
    access: u32,
    pd: usize,
}

fn regions() -> &'static Mutex<HashMap<u32, Region>> {
    static R: OnceLock<Mutex<HashMap<u32, Region>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

fn next_key() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0x100);
    NEXT.fetch_add(0x100, Ordering::Relaxed) | (std::process::id() & 0xff)
}

/// Why a scatter/gather element was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SgeError {
    /// Unknown lkey, other PD, range outside the region, or missing write access.
    Protection,
}

/// Resolves `sge` (IOVA space) to a host address inside a region of PD `pd`, checking the
/// range and, when `write`, `IBV_ACCESS_LOCAL_WRITE`.
pub fn resolve_sge(pd: usize, sge: &ibv_sge, write: bool) -> Result<*mut u8, SgeError> {
    let r = {
        let map = regions().lock().map_err(|_| SgeError::Protection)?;
        *map.get(&sge.lkey).ok_or(SgeError::Protection)?
    };
    if r.pd != pd {
        return Err(SgeError::Protection);
    }
    if write && r.access & ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 == 0 {
        return Err(SgeError::Protection);
    }
    let start = sge.addr.checked_sub(r.iova).ok_or(SgeError::Protection)?;
    let end = start
        .checked_add(u64::from(sge.length))
        .ok_or(SgeError::Protection)?;
    if end > r.len as u64 {
        return Err(SgeError::Protection);
    }
    Ok((r.addr + start as usize) as *mut u8)
}

/// True if every page of [addr, addr+len) is mapped in this process.
fn is_mapped(addr: usize, len: usize) -> bool {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let start = addr & !(page - 1);
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let pages = (end - start).div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore only inspects the mapping of the page-aligned range and writes one
    // byte per page into `vec`, which has exactly `pages` bytes.
    unsafe { libc::mincore(start as *mut c_void, end - start, vec.as_mut_ptr()) == 0 }
}

/// Access flags we understand (IBV_ACCESS_LOCAL_WRITE .. IBV_ACCESS_RELAXED_ORDERING).
const KNOWN_ACCESS: u32 =
    0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x100000;

fn register(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: verbs contract: pd came from ibv_alloc_pd.
    let Some(p) = (unsafe { SimPd::from_ptr(pd) }) else {
        return std::ptr::null_mut();
    };
    let remote_w =
        ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0 | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
    if access & !KNOWN_ACCESS != 0
        || (access & remote_w != 0 && access & ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 == 0)
        || length == 0
        || addr.is_null()
    {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    if !is_mapped(addr as usize, length) {
        set_errno(libc::EFAULT);
        return std::ptr::null_mut();
    }
    let key = next_key();
    let region = Region {
        addr: addr as usize,
        iova,
        len: length,
        access,
        pd: pd as usize,
    };
    match regions().lock() {
        Ok(mut m) => {
            m.insert(key, region);
        }
        Err(_) => {
            set_errno(libc::EIO);
            return std::ptr::null_mut();
        }
    }
    p.users.fetch_add(1, Ordering::AcqRel);
    let mr = Box::new(SimMr {
        mr: ibv_mr {
            context: p.pd.context,
            pd,
            addr,
            length,
            handle: key,
            lkey: key,
            rkey: key,
        },
        magic: MR_MAGIC,
    });
    Box::into_raw(mr) as *mut ibv_mr
}

/// `ibv_alloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard(std::ptr::null_mut(), || {
        // SAFETY: verbs contract: context came from ibv_open_device.
        let Some(sc) = (unsafe { context_state(context) }) else {
            return std::ptr::null_mut();
        };
        static HANDLE: AtomicU32 = AtomicU32::new(1);
        let pd = Box::new(SimPd {
            pd: ibv_pd {
                context,
                handle: HANDLE.fetch_add(1, Ordering::Relaxed),
            },
            magic: PD_MAGIC,
            ctx: sc.state.clone(),
            users: AtomicUsize::new(0),
        });
        Box::into_raw(pd) as *mut ibv_pd
    })
}

/// `ibv_dealloc_pd`: EBUSY while MRs, QPs or AHs still use it.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: pd came from ibv_alloc_pd.
        let Some(p) = (unsafe { SimPd::from_ptr(pd) }) else {
            return libc::EINVAL;
        };
        if p.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        // SAFETY: checked live SimPd allocated by Box; the caller gives it up.
        let mut b = unsafe { Box::from_raw(pd as *mut SimPd) };
        b.magic = 0;
        drop(b);
        0
    })
}

/// `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        register(pd, addr, length, addr as u64, access as u32)
    })
}

/// `ibv_reg_mr_iova`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        register(pd, addr, length, iova, access as u32)
    })
}

/// `ibv_reg_mr_iova2` (what the inline `ibv_reg_mr` calls for non-constant access flags).
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: libc::c_uint,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        register(pd, addr, length, iova, access)
    })
}

/// `ibv_dereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: mr is NULL or came from ibv_reg_mr; SimMr starts with the
        // ibv_mr.
        let Some(m) = (unsafe { crate::resolve(mr, |m: &SimMr| m.magic, MR_MAGIC) }) else {
            return libc::EINVAL;
        };
        if let Ok(mut map) = regions().lock() {
            map.remove(&m.mr.lkey);
        }
        // SAFETY: the PD outlives its MRs (dealloc_pd refuses while users != 0).
        if let Some(p) = unsafe { SimPd::from_ptr(m.mr.pd) } {
            p.users.fetch_sub(1, Ordering::AcqRel);
        }
        // SAFETY: checked live SimMr allocated by Box; the caller gives it up.
        let mut b = unsafe { Box::from_raw(mr as *mut SimMr) };
        b.magic = 0;
        drop(b);
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sge_checks_range_pd_and_access() {
        let key = next_key();
        regions().lock().unwrap().insert(
            key,
            Region {
                addr: 0x10000,
                iova: 0x10000,
                len: 100,
                access: 0,
                pd: 7,
            },
        );
        let sge = |addr: u64, length: u32, lkey: u32| ibv_sge { addr, length, lkey };
        assert_eq!(
            resolve_sge(7, &sge(0x10000, 100, key), false),
            Ok(0x10000 as *mut u8)
        );
        assert_eq!(
            resolve_sge(7, &sge(0x10010, 84, key), false),
            Ok(0x10010 as *mut u8)
        );
        assert_eq!(
            resolve_sge(7, &sge(0x10010, 85, key), false),
            Err(SgeError::Protection)
        );
        assert_eq!(
            resolve_sge(7, &sge(0xffff, 1, key), false),
            Err(SgeError::Protection)
        );
        assert_eq!(
            resolve_sge(8, &sge(0x10000, 1, key), false),
            Err(SgeError::Protection)
        );
        assert_eq!(
            resolve_sge(7, &sge(0x10000, 1, key), true),
            Err(SgeError::Protection)
        );
        assert_eq!(
            resolve_sge(7, &sge(0x10000, 1, key ^ 0x100), false),
            Err(SgeError::Protection)
        );
        regions().lock().unwrap().remove(&key);
    }
}
