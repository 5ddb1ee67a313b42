//! The provider table the core gets from `provider_query`, and its twelve callbacks as the
//! core calls them: each `extern "C"` function runs its body inside a panic guard, so no
//! panic ever unwinds into the core.
//!
//! * `resolve()` / `query()` (the core's main thread, once per client request):
//!   `client_call` — null checks, a view of the request's bytes, `catch_unwind`, and an EINVAL
//!   answer if the body panicked before it answered — around the hit path's bodies
//!   (`hit.rs`: `resolve_impl`, `query_impl`).
//! * The ten others (devices, ports, endpoints, addresses, events, counters): [`guard`] (a
//!   panic is logged and becomes the callback's error return) around their bodies of the same
//!   name in [`crate::lifecycle`].

use crate::core_api::{self, guard};
use crate::ffi::*;
use crate::hit::{answer_inline, query_impl, resolve_impl};
use crate::lifecycle::{self, AddrCtx};
use acm_core_nostd::resolver::{Via, MSG_LEN};
use acm_core_nostd::wire::client::{self, Status};
use core::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// How many bytes of a request `client_call` reads: `hdr.length`, plus the entry at
/// `src_index` when `src_out` is set (the core writes the source it selected into the slot
/// after the last entry without growing `length`), at least the 16-byte header and at most the
/// 592-byte `acm_msg`. A bad length is the classifier's EINVAL, as with the whole buffer.
fn request_span(hdr: &[u8; HDR_LEN]) -> usize {
    let hdr = client::AcmMsg::new_unchecked(hdr);
    let length = usize::from(hdr.length());
    let source = if hdr.src_out() != 0 {
        HDR_LEN + EP_LEN * (usize::from(hdr.src_index()) + 1)
    } else {
        0
    };
    length.max(source).clamp(HDR_LEN, MSG_BYTES)
}

const HDR_LEN: usize = client::HDR_LEN;
const EP_LEN: usize = client::EP_LEN;

/// The body of `resolve()` / `query()`: null checks, a view of the request's bytes, `catch_unwind`,
/// and an EINVAL answer (through `via`) if the implementation panicked before answering.
///
/// # Safety
/// `addr_context` must be null or our `AddrCtx`, `msg` null or a full `acm_msg` buffer.
unsafe fn client_call(
    what: &str,
    addr_context: *mut c_void,
    msg: *mut AcmMsg,
    id: u64,
    imp: fn(&AddrCtx, &[u8], u64, &mut bool) -> c_int,
    via: Via,
) -> c_int {
    if addr_context.is_null() || msg.is_null() {
        core_api::log(0, &format!("ERROR - {what}: null argument"));
        return -1;
    }
    // SAFETY: the core passes a full acm_msg buffer (592 bytes) valid for this call: its
    // 16-byte header is readable (byte arrays, no alignment needed).
    let hdr = unsafe { (msg as *const [u8; HDR_LEN]).read() };
    let n = request_span(&hdr);
    // SAFETY: `n <= MSG_BYTES` bytes of the core's 592-byte buffer, valid for this call and
    // written by no one while it runs (the core's thread is in this call, and we answer into
    // our own buffers, never into `msg`). Nothing keeps this view past the call: a request
    // handed to the dataplane is copied into its queue (`Inbox::hand_over`).
    let request: &[u8] = unsafe { core::slice::from_raw_parts(msg as *const u8, n) };
    // SAFETY: our AddrCtx, alive until remove_address / close_endpoint.
    let ctx = unsafe { &*(addr_context as *const AddrCtx) };
    let mut answered = false;
    let answered_ref = &mut answered;
    match catch_unwind(AssertUnwindSafe(|| imp(ctx, request, id, answered_ref))) {
        Ok(r) => r,
        Err(_) => {
            core_api::log(0, &format!("ERROR - internal error (panic) in {what}"));
            if !answered {
                let _ = catch_unwind(AssertUnwindSafe(|| {
                    answer_inline(ctx, via, request, id, Status::Einval, None, &mut true)
                }));
            }
            0
        }
    }
}

unsafe extern "C" fn resolve(addr_context: *mut c_void, msg: *mut AcmMsg, id: u64) -> c_int {
    // SAFETY: the core's arguments, as client_call requires.
    unsafe { client_call("resolve", addr_context, msg, id, resolve_impl, Via::Resolve) }
}

unsafe extern "C" fn query(addr_context: *mut c_void, msg: *mut AcmMsg, id: u64) -> c_int {
    // SAFETY: the core's arguments, as client_call requires.
    unsafe { client_call("query", addr_context, msg, id, query_impl, Via::Query) }
}

/// A callback whose body is the function of the same name in [`crate::lifecycle`], run inside
/// [`guard`]: a panic is logged and the callback returns `$on_panic`.
macro_rules! guarded {
    ($name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?, $on_panic:expr) => {
        unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
            guard(stringify!($name), $on_panic, || {
                // SAFETY: the core's arguments, passed on as they came: what the body's
                // contract asks is what the core's ABI (acm_prov.h) promises.
                unsafe { lifecycle::$name($($arg),*) }
            })
        }
    };
}

guarded!(open_device(device: *const AcmDevice, dev_context: *mut *mut c_void) -> c_int, -1);
guarded!(close_device(dev_context: *mut c_void), ());
guarded!(
    open_port(port: *const AcmPort, dev_context: *mut c_void, port_context: *mut *mut c_void)
        -> c_int,
    -1
);
guarded!(close_port(port_context: *mut c_void), ());
guarded!(
    open_endpoint(
        endpoint: *const AcmEndpoint,
        port_context: *mut c_void,
        ep_context: *mut *mut c_void
    ) -> c_int,
    -1
);
guarded!(close_endpoint(ep_context: *mut c_void), ());
guarded!(
    add_address(addr: *const AcmAddress, ep_context: *mut c_void, addr_context: *mut *mut c_void)
        -> c_int,
    -1
);
guarded!(remove_address(addr_context: *mut c_void), ());
guarded!(handle_event(port_context: *mut c_void, event: c_int) -> c_int, -1);
guarded!(query_perf(ep_context: *mut c_void, values: *mut u64, cnt: *mut u8), ());

/// The provider table returned by `provider_query`.
pub static PROVIDER: AcmProvider = AcmProvider {
    size: core::mem::size_of::<AcmProvider>(),
    version: ACM_PROV_VERSION,
    name: c"acmrs".as_ptr(),
    open_device,
    close_device,
    open_port,
    close_port,
    open_endpoint,
    close_endpoint,
    add_address,
    remove_address,
    resolve,
    query,
    handle_event,
    query_perf,
};

const _: () = assert!(MSG_LEN == MSG_BYTES);
