//! 0 heap allocations per cache hit (issue 9), as a test: `malloc` and friends are interposed
//! in this executable (exported with `--export-dynamic`, so `libacmrs.so`, `dlopen`ed by the
//! fake core, binds its `malloc` to ours), each counting into a per-thread counter before
//! forwarding to glibc's `__libc_*` allocator. The dataplane thread runs concurrently and
//! may allocate; only the calling (core) thread's count around the hit loop is checked.

mod common;

use acm_testkit::core::*;
use acm_testkit::host::*;
use acm_testkit::request::*;
use acmrs::ffi::*;
use std::cell::Cell;
use std::ffi::c_void;

thread_local! {
    /// Allocation calls made by this thread (const-initialised, no destructor: reading it in
    /// `malloc` never allocates).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn bump() {
    // `try_with`: a thread being torn down still allocates without a counter.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

extern "C" {
    fn __libc_malloc(n: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, n: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, n: usize) -> *mut c_void;
}

/// Counting `malloc`.
///
/// # Safety
/// As `malloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn malloc(n: usize) -> *mut c_void {
    bump();
    // SAFETY: glibc's own malloc, same contract.
    unsafe { __libc_malloc(n) }
}

/// Counting `calloc`.
///
/// # Safety
/// As `calloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    bump();
    // SAFETY: glibc's own calloc, same contract.
    unsafe { __libc_calloc(n, size) }
}

/// Counting `realloc`.
///
/// # Safety
/// As `realloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, n: usize) -> *mut c_void {
    bump();
    // SAFETY: glibc's own realloc on a pointer from glibc's allocator (every one of ours is).
    unsafe { __libc_realloc(p, n) }
}

/// Counting `posix_memalign` (what Rust's `System` allocator uses for large alignments).
///
/// # Safety
/// As `posix_memalign(3)`.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, n: usize) -> i32 {
    bump();
    if !align.is_power_of_two() || align % core::mem::size_of::<usize>() != 0 {
        return libc::EINVAL;
    }
    // SAFETY: glibc's memalign with a valid power-of-two alignment.
    let p = unsafe { __libc_memalign(align, n) };
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: `out` is the caller's valid out-pointer.
    unsafe { *out = p };
    0
}

/// Counting `aligned_alloc`.
///
/// # Safety
/// As `aligned_alloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, n: usize) -> *mut c_void {
    bump();
    // SAFETY: glibc's memalign, same contract.
    unsafe { __libc_memalign(align, n) }
}

/// Counting `memalign`.
///
/// # Safety
/// As `memalign(3)`.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, n: usize) -> *mut c_void {
    bump();
    // SAFETY: glibc's memalign, same contract.
    unsafe { __libc_memalign(align, n) }
}

const OPTS: &str = "\
log_level 1
timeout 100
retries 0
route_timeout -1
route_preload opensm_full_v1
route_data_file $DIR/route.data
";

/// Preloaded destinations: DLIDs `BASE..BASE + ROUTES`, each with a GUID (so also by GID).
const ROUTES: u16 = 4000;
const BASE: u16 = 0x100;
const HITS: usize = 100_000;

#[test]
fn a_cache_hit_allocates_nothing() {
    let _s = serial();
    // The counter works: an allocation on this thread is seen.
    let a = allocs();
    std::hint::black_box(Box::new(1u64));
    assert!(allocs() > a, "the interposed malloc is not in use");

    let d = common::route_dump(ROUTES, BASE, 0x1_0000 + u64::from(BASE));
    let mut h = Host::open(OPTS, &[("route.data", &d)]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    assert!(wait_until(|| log_contains("preloaded routes inserted")));
    // Requests built up front: by DLID and by GID, alternately, pseudo-random destinations.
    let mut x = 0x9e37_79b9u32;
    let reqs: Vec<AcmMsg> = (0..4096u64)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let l = BASE + (x % u32::from(ROUTES)) as u16;
            if i % 2 == 0 {
                path_request(0x7000_0000 + i, l, None, 0)
            } else {
                path_request(0x7000_0000 + i, 0, Some(gid_of(0x1_0000 + u64::from(l))), 0)
            }
        })
        .collect();
    // Count answers only (recording every answer would allocate in the fake core).
    record(Record::Count);
    // Warm up (first-use paths: thread-locals, lazily initialised statics).
    for r in reqs.iter().take(256) {
        h.resolve(ep, r, 1);
    }
    let answered = response_count();
    let before = allocs();
    let mut first_alloc = None;
    for i in 0..HITS {
        let r = &reqs[i % reqs.len()];
        let a = allocs();
        h.resolve(ep, r, 1);
        if first_alloc.is_none() && allocs() != a {
            first_alloc = Some(i);
        }
    }
    let after = allocs();
    let (_, tid, status) = last_answer();
    let answered = response_count() - answered;
    record(Record::All);
    h.close();
    assert_eq!(
        answered, HITS,
        "every request answered inside resolve() (hits)"
    );
    assert_eq!(status, 0);
    assert_eq!(tid, reqs[(HITS - 1) % reqs.len()].hdr.tid);
    assert_eq!(
        after - before,
        0,
        "{} allocations in {HITS} hits; the first during hit {:?}",
        after - before,
        first_alloc
    );
}
