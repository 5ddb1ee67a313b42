//! The atomics the crate uses, from `core` normally and from `loom` under `cfg(loom)`, so the
//! cache's seqlock protocol can be model-checked (`tests/cache_loom.rs`).
//!
//! Only the cache module uses it. Under `cfg(loom)` atomics have no `const fn new`, so the few
//! `const` constructors in the cache switch to plain functions there.

#[cfg(all(not(loom), target_has_atomic = "64"))]
pub(crate) use core::sync::atomic::AtomicU64;
#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

/// A reader's back-off while the writer holds a slot (loom: a yield, so the model lets the
/// writer run instead of exploring a spinning reader).
#[inline(always)]
pub(crate) fn spin_loop() {
    #[cfg(not(loom))]
    core::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}
