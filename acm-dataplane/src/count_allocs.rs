//! A global allocator for tests that counts each thread's allocations while armed: what the
//! "no allocation on this path" tests of this crate and of the plugin measure with
//! ([`allocations`]). A test binary installs it with
//! `#[global_allocator] static A: CountingAlloc = CountingAlloc;`; nothing else uses it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// [`System`], counting the allocations of each thread while it is armed ([`allocations`]).
pub struct CountingAlloc;

thread_local! {
    /// `Some(n)`: armed, `n` allocations so far.
    static ALLOCS: Cell<Option<u64>> = const { Cell::new(None) };
}

fn note_alloc() {
    let _ = ALLOCS.try_with(|c| {
        if let Some(n) = c.get() {
            c.set(Some(n + 1));
        }
    });
}

// SAFETY: every call is forwarded to `System` unchanged; the counter is a const-initialized
// thread-local `Cell` without a destructor, so touching it never allocates or re-enters.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_alloc();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// What `f` returns, and the allocations it made on this thread (counted only where
/// [`CountingAlloc`] is the global allocator; 0 elsewhere).
pub fn allocations<R>(f: impl FnOnce() -> R) -> (R, u64) {
    ALLOCS.with(|c| c.set(Some(0)));
    let r = f();
    let n = ALLOCS.with(|c| c.replace(None)).unwrap_or(0);
    (r, n)
}
