//! Port queries: a P_Key's table index, the P_Key index of the port's SA traffic, and the port's
//! attributes (`ibv_query_port`), the one reader of `struct ibv_port_attr`.
#![allow(unsafe_code)]

use super::IbvPortAttr;
use rdma_sys::{ibv_context, ibv_get_pkey_index, ibv_query_pkey};

/// Finds the P_Key table index of `pkey` (host order, membership bit included) on `port_num`:
/// `ibv_get_pkey_index`, else a scan with `ibv_query_pkey` (exact match first, then the same
/// partition with the other membership bit).
///
/// # Safety
/// `ctx` is an open verbs context (from `ibv_open_device`, e.g. `acm_device.verbs`).
pub unsafe fn pkey_index(ctx: *mut ibv_context, port_num: u8, pkey: u16) -> Option<u16> {
    if ctx.is_null() {
        return None;
    }
    // SAFETY: ctx is an open context (caller's contract); the P_Key is passed big-endian as
    // verbs.h's `__be16` wants.
    let i = unsafe { ibv_get_pkey_index(ctx, port_num, pkey.to_be()) };
    if let Ok(i) = u16::try_from(i) {
        return Some(i);
    }
    let mut partial = None;
    for i in 0..=u16::MAX {
        let mut raw: u16 = 0;
        // SAFETY: ctx is open; `raw` is a writable __be16.
        if unsafe { ibv_query_pkey(ctx, port_num, i32::from(i), &mut raw) } != 0 {
            break;
        }
        let p = u16::from_be(raw);
        if p == pkey {
            return Some(i);
        }
        if p & 0x7fff == pkey & 0x7fff && p & 0x7fff != 0 && partial.is_none() {
            partial = Some(i);
        }
    }
    partial
}

/// The P_Key index the port's SA traffic uses, chosen as the ibacm core chooses its own
/// (`sa_pkey_index`): the default partition's full-member key 0xFFFF, else its limited key
/// 0x7FFF, else index 0. The SM's port is a member of the default partition only, so an SA
/// MAD sent with any other P_Key is dropped at the SM's port (IBA 10.9.3).
///
/// # Safety
/// `ctx` is an open verbs context (from `ibv_open_device`, e.g. `acm_device.verbs`).
pub unsafe fn sa_pkey_index(ctx: *mut ibv_context, port_num: u8) -> u16 {
    // `pkey_index` of the full-member key finds 0xFFFF, else the same partition's other
    // membership, 0x7FFF: exactly the core's order.
    // SAFETY: the caller's contract is pkey_index's.
    unsafe { pkey_index(ctx, port_num, 0xffff) }.unwrap_or(0)
}

/// What port `port_num` says of itself now (`ibv_query_port`, the exported entry point: the
/// fields of `struct _compat_ibv_port_attr` filled, the rest zero); `None` if the query fails.
/// Every reader of port attributes goes through it: the plugin at `open_port` (LID, active
/// MTU, width and speed, SubnetTimeOut) and [`UdEndpoint::sm_addr`](super::UdEndpoint::sm_addr) (SM LID and SL).
///
/// # Safety
/// `ctx` is null or an open verbs context (from `ibv_open_device`, e.g. `acm_device.verbs`).
pub unsafe fn port_attr(ctx: *mut ibv_context, port_num: u8) -> Option<IbvPortAttr> {
    if ctx.is_null() {
        return None;
    }
    // SAFETY: ibv_port_attr is plain old data (integers).
    let mut attr: IbvPortAttr = unsafe { std::mem::zeroed() };
    // SAFETY: ctx is open (the caller's contract); the exported ibv_query_port fills at most a
    // `struct _compat_ibv_port_attr`, which is the prefix of the `ibv_port_attr` we pass.
    let rc = unsafe {
        rdma_sys::ibv_query_port(
            ctx,
            port_num,
            &mut attr as *mut IbvPortAttr as *mut rdma_sys::_compat_ibv_port_attr,
        )
    };
    (rc == 0).then_some(attr)
}
