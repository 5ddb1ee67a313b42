//! acmrs: an ibacm provider library (`libacmrs.so`, provider name `acmrs`).
//!
//! The real, unmodified ibacm daemon `dlopen`s this library and calls `provider_query`, the only
//! exported symbol of the release build (debug builds also export `acmrs_test_advance_clock`,
//! the in-process tests' virtual clock, and `acmrs_test_stall`, a stuck dataplane). See `docs/plugin.md` for the design and `acm_prov.h`
//! (rdma-core) for the ABI.
//!
//! A thin shell: every decision is the sans-IO resolver's (`acm-core-nostd::resolver`), every
//! piece of IO but the core's own helpers is the dataplane's (`acm-dataplane`).
//!
//! * [`ffi`]: `#[repr(C)]` mirrors of the ABI structs (layout-checked against the headers).
//! * [`core_api`]: the core's helpers, looked up in the host executable at run time.
//! * [`callbacks`]: the provider table and its twelve `extern "C"` callbacks, each body run
//!   inside a panic guard.
//! * `hit`: the bodies of `resolve()`/`query()`: cache hits are answered inline, everything
//!   else goes to the dataplane loop.
//! * [`lifecycle`]: the other callbacks' bodies: the instance, its ports, endpoints and
//!   addresses (sizing, port attributes, the endpoints' UD QPs).
//! * [`instance`]: the instance and endpoint objects the core's threads share.
//! * [`io`]: the dataplane's IO towards the core (SA MADs, answers, counters, logs).
//! * [`preload`]: the option, hosts and route files.
//! * [`huge`]: huge-page advice for large caches.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod callbacks;
pub mod core_api;
pub mod ffi;
mod hit;
pub mod huge;
pub mod instance;
pub mod io;
pub mod lifecycle;
pub mod preload;

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
            unsafe { *info = &callbacks::PROVIDER };
        }
        if !version.is_null() {
            // SAFETY: as above.
            unsafe { *version = ffi::ACM_PROV_VERSION };
        }
        0
    })
    .unwrap_or(-1)
}

/// Test hook of debug builds: the dataplane worker stops running for `ms` (a thread stuck in
/// the kernel), inside a round with the loop's lock held if `in_round` is not 0, else between
/// rounds; for the stall watchdog's tests. Returns once it has (0), or -1 if it did not
/// within 10 s.
#[cfg(debug_assertions)]
#[no_mangle]
pub extern "C" fn acmrs_test_stall(ms: u64, in_round: c_int) -> c_int {
    use acm_dataplane::worker::{stall_all, Stuck};
    use std::time::Duration;
    let at = match in_round {
        0 => Stuck::BetweenRounds,
        _ => Stuck::InRound,
    };
    std::panic::catch_unwind(|| {
        let stalled = stall_all(Duration::from_millis(ms), at, Duration::from_secs(10));
        if stalled {
            0
        } else {
            -1
        }
    })
    .unwrap_or(-1)
}

/// Test hook, **debug builds only** (the release library, the one users install, exports
/// `provider_query` alone; `tests/lifecycle.rs` checks both): virtual time. Moves the clock of
/// every dataplane worker in the process `ms` milliseconds ahead of real time
/// ([`acm_dataplane::worker::advance_all_clocks`]) and returns once each running worker has
/// observed it: its coarse clock (what cache hits compare expiries and refresh windows
/// against), the `now` of its poll rounds and so its timers (SA retries and deadlines, route
/// refresh and expiry). 0, or -1 if a worker did not observe it within 10 s.
#[cfg(debug_assertions)]
#[no_mangle]
pub extern "C" fn acmrs_test_advance_clock(ms: u64) -> c_int {
    use std::time::Duration;
    std::panic::catch_unwind(|| {
        if acm_dataplane::worker::advance_all_clocks(
            Duration::from_millis(ms),
            Duration::from_secs(10),
        ) {
            0
        } else {
            -1
        }
    })
    .unwrap_or(-1)
}
