//! acmrs: an ibacm provider library (`libacmrs.so`, provider name `acmrs`).
//!
//! The real, unmodified ibacm daemon `dlopen`s this library and calls `provider_query`, the only
//! exported symbol. See `docs/plugin.md` for the design, and `ibacm-contract.md` for the ABI.
//!
//! * [`ffi`]: `#[repr(C)]` mirrors of the ABI structs (layout-checked against the headers).
//! * [`core_api`]: the core's helpers, looked up in the host executable at run time.
//! * [`provider`]: the callbacks; cache hits are answered inline, misses go to the worker.
//! * [`engine`]: the worker's state machine (SA PathRecord queries, exactly-once answers).

pub mod core_api;
pub mod engine;
pub mod ffi;
pub mod huge;
pub mod path;
pub mod provider;
pub mod respond;
pub mod state;

use core::ffi::c_int;

/// ibacm's entry point: returns the provider table and the ABI version (1).
///
/// Fails (nonzero, message on stderr) when the host does not export the core helpers, so a
/// wrong host refuses the library instead of crashing later.
///
/// # Safety
/// `info` and `version` must be valid for writes (the core passes pointers to locals).
#[no_mangle]
pub unsafe extern "C" fn provider_query(
    info: *mut *const ffi::AcmProvider,
    version: *mut u32,
) -> c_int {
    std::panic::catch_unwind(|| {
        if let Err(missing) = core_api::CoreApi::resolve() {
            eprintln!(
                "acmrs: the host does not export the ibacm core helpers ({}); \
                 libacmrs.so must be loaded by ibacm",
                missing.join(", ")
            );
            return -1;
        }
        if !info.is_null() {
            // SAFETY: valid out-pointer per the contract above.
            unsafe { *info = &provider::PROVIDER };
        }
        if !version.is_null() {
            // SAFETY: as above.
            unsafe { *version = ffi::ACM_PROV_VERSION };
        }
        0
    })
    .unwrap_or(-1)
}
