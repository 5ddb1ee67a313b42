//! Path-cache storage for large caches, advised to the kernel as transparent-huge-page memory.
//!
//! A lookup touches one or two random 128-byte slots; at a million entries every one of them is
//! a TLB miss with 4 KiB pages (docs/cache.md measured 1397 → 1027 ns p50 at 1M with THP). So
//! when the slot array spans several huge pages, the 2 MiB-aligned part of the allocation is
//! `madvise(MADV_HUGEPAGE)`d **before** the slots are written (first touch then faults in huge
//! pages where the system allows it). Small caches are allocated normally.

use acm_core_nostd::cache::PathSlot;

/// Huge-page size the advice is aligned to (x86-64 / aarch64 with 4 KiB base pages).
const HUGE: usize = 2 << 20;

/// Arrays at least this large get the advice (smaller ones would not fill a huge page or two).
pub const THRESHOLD_BYTES: usize = 4 * HUGE;

/// The part of `[addr, addr + bytes)` made of whole huge pages, as (start, len), if any.
fn aligned_span(addr: usize, bytes: usize) -> Option<(usize, usize)> {
    let start = addr.checked_next_multiple_of(HUGE)?;
    let end = addr.checked_add(bytes)? / HUGE * HUGE;
    (end > start).then(|| (start, end - start))
}

/// Whether `n` path slots take at least [`THRESHOLD_BYTES`]: storage advised as huge pages,
/// and too large to stay in the CPU's caches, so a lookup's slots are DRAM misses (the hit path
/// then also prefetches the tag-matching slots: see `hit::start_lookup`).
pub fn is_large(n: usize) -> bool {
    n.saturating_mul(core::mem::size_of::<PathSlot>()) >= THRESHOLD_BYTES
}

/// `n` empty path slots; if [`is_large`], advised as huge pages. Returns whether the advice was
/// given and accepted as the second value.
pub fn path_slots_advised(n: usize) -> (Box<[PathSlot]>, bool) {
    let bytes = n.saturating_mul(core::mem::size_of::<PathSlot>());
    if !is_large(n) {
        return (PathSlot::boxed(n), false);
    }
    let mut v: Vec<PathSlot> = Vec::with_capacity(n);
    let mut advised = false;
    if let Some((start, len)) = aligned_span(v.as_mut_ptr() as usize, bytes) {
        // SAFETY: [start, start + len) lies inside the allocation `v` owns (capacity n, nothing
        // written yet, nothing else refers to it). MADV_HUGEPAGE only changes how the kernel
        // backs those pages, never their contents or validity; a failure (no THP support)
        // leaves ordinary pages.
        let r = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
        advised = r == 0;
    }
    v.extend((0..n).map(|_| PathSlot::new()));
    (v.into_boxed_slice(), advised)
}

/// `n` empty path slots (see [`path_slots_advised`]).
pub fn path_slots(n: usize) -> Box<[PathSlot]> {
    path_slots_advised(n).0
}

/// Slots for a cache of `entries` paths (`acmrs_path_capacity`): the cache's own sizing at
/// its design load ([`PathSlot::slots_for`], 87%, side arrays included), so that many entries
/// fit without early eviction.
pub fn path_slot_count(entries: usize) -> usize {
    PathSlot::slots_for(entries.max(1))
}

/// Storage for a cache of `entries` paths ([`path_slot_count`] slots, see [`path_slots`]).
pub fn path_slots_for(entries: usize) -> Box<[PathSlot]> {
    path_slots(path_slot_count(entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_is_whole_huge_pages_inside_the_allocation() {
        assert_eq!(aligned_span(0, HUGE), Some((0, HUGE)));
        assert_eq!(aligned_span(1, HUGE), None);
        assert_eq!(aligned_span(1, 3 * HUGE), Some((HUGE, 2 * HUGE)));
        assert_eq!(aligned_span(usize::MAX - 10, 100), None);
    }

    #[test]
    fn small_caches_are_not_advised_large_ones_are() {
        let (small, advised) = path_slots_advised(16);
        assert_eq!(small.len(), 16);
        assert!(!advised);
        let n = THRESHOLD_BYTES / core::mem::size_of::<PathSlot>() + 1;
        let (big, advised) = path_slots_advised(n);
        assert_eq!(big.len(), n);
        // madvise(MADV_HUGEPAGE) fails with EINVAL only on kernels without THP.
        let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists();
        assert_eq!(advised, thp);
    }
}
