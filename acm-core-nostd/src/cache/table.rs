//! The generic one-writer / many-reader hash table behind both caches.
//!
//! Storage is a caller-provided slice of [`Slot`]s. Every slot is at the same time
//! * an entry: a sequence counter plus `W` words of data (header, incarnation, endpoint
//!   generation, expiry, key, payload), all `AtomicU32`, and
//! * a bucket: `head` holds the first entry of bucket `i` (entries are chained through `next`).
//!
//! Links are stored as `index + 1`, so `0` means "none" and all-zero storage is a valid empty
//! table.
//!
//! ## The seqlock
//!
//! The writer makes the sequence counter odd (`Relaxed` store, then a `Release` fence), stores the
//! words (`Relaxed`), and makes it even again (`Release` store). A reader loads the counter
//! (`Acquire`), retries if it is odd, loads the words (`Relaxed`), issues an `Acquire` fence and
//! loads the counter again: if it did not change, no writer store was observed, so the words are
//! one consistent version. (If any word load had observed a store made after the writer's odd
//! store, the fence pair would make that odd store — or a later one — visible to the second
//! counter load, which would then differ.) Every access is atomic, so a torn read is a detected,
//! discarded value, never undefined behaviour; the module has no `unsafe`.
//!
//! Readers never block: after [`MAX_RETRIES`] failed attempts on one entry, or after walking
//! [`MAX_CHAIN`] entries, a lookup gives up with [`Probe::Busy`].
//!
//! A reader walking a chain while the writer unlinks and reuses an entry can follow a stale link
//! into another chain or the free list. Keys are verified under the seqlock, so the worst outcome
//! is a spurious miss for that one racing lookup, never a wrong record.

use core::ops::Deref;
use core::sync::atomic::{fence, AtomicU32, Ordering};

use super::hash::reduce;

/// Word index of the header: bit 31 = occupied, bits 7..0 = negative status (0 = positive).
pub(crate) const HDR: usize = 0;
/// Word index of the incarnation, bumped whenever the slot starts holding a new key.
pub(crate) const INC: usize = 1;
/// Word index of the endpoint generation the entry was written under.
pub(crate) const GEN: usize = 2;
/// Word indices of the expiry time (low, high).
pub(crate) const EXP_LO: usize = 3;
pub(crate) const EXP_HI: usize = 4;
/// First key word.
pub(crate) const KEY: usize = 5;

/// Header bit: the slot holds an entry.
pub(crate) const OCCUPIED: u32 = 1 << 31;

/// Attempts on one entry before a reader gives up with `Busy`.
pub const MAX_RETRIES: u32 = 16;
/// Longest chain a reader walks (and the writer lets grow) before giving up.
pub const MAX_CHAIN: usize = 32;
/// Slots the CLOCK hand examines per eviction at most.
pub const EVICT_SCAN: usize = 32;

const REFERENCED: u32 = 1;

/// One entry-and-bucket of cache storage; see the module docs of [`cache`](super).
///
/// `Slot::new()` is `const`, so firmware can declare `static S: [PathSlot; N]`.
// `repr(C)` fixes the order: the bucket head, the sequence counter, the header and the key come
// first, so a lookup whose entry sits in its own bucket's slot (home placement) finds head, seq and
// key in one cache line instead of paying a second dependent miss.
#[repr(C)]
pub struct Slot<const W: usize> {
    head: AtomicU32,
    seq: AtomicU32,
    words: [AtomicU32; W],
    next: AtomicU32,
    /// CLOCK reference bit (set by readers, cleared by the writer's hand).
    flags: AtomicU32,
    /// The sequence value of the version for which a refresh hint was last handed out.
    claim: AtomicU32,
    /// Free-list back link (writer only).
    prev: AtomicU32,
}

impl<const W: usize> Slot<W> {
    /// An empty slot.
    pub const fn new() -> Self {
        Slot {
            seq: AtomicU32::new(0),
            words: [const { AtomicU32::new(0) }; W],
            next: AtomicU32::new(0),
            prev: AtomicU32::new(0),
            head: AtomicU32::new(0),
            flags: AtomicU32::new(0),
            claim: AtomicU32::new(u32::MAX),
        }
    }

    fn reset(&self) {
        // Keep `seq` and the incarnation monotonic: a reader that raced the reset must not
        // mistake a later entry in this slot for the one it saw before.
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let mut i = 0;
        while i < W {
            if i != INC {
                self.words[i].store(0, Ordering::Relaxed);
            }
            i += 1;
        }
        self.seq.store(s.wrapping_add(2), Ordering::Release);
        self.next.store(0, Ordering::Relaxed);
        self.prev.store(0, Ordering::Relaxed);
        self.head.store(0, Ordering::Release);
        self.flags.store(0, Ordering::Relaxed);
    }
}

impl<const W: usize> Default for Slot<W> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const W: usize> core::fmt::Debug for Slot<W> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Slot")
            .field("seq", &self.seq.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Outcome of a reader's probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Entry at this index; the words were copied out consistently. Carries the seq value.
    Found(usize, u32),
    NotFound,
    Busy,
}

/// A slot's expiry from its words.
#[inline]
pub(crate) fn expiry(w: &[u32]) -> u64 {
    (w[EXP_LO] as u64) | ((w[EXP_HI] as u64) << 32)
}

#[inline]
pub(crate) fn set_expiry(w: &mut [u32], t: u64) {
    w[EXP_LO] = t as u32;
    w[EXP_HI] = (t >> 32) as u32;
}

/// The hash table. `KW` key words start at [`KEY`]; the payload follows.
pub(crate) struct Table<S, const W: usize, const KW: usize> {
    slots: S,
    seed: u64,
    // Writer-private state. Atomics only so the table is `Sync` without `unsafe`; only the single
    // writer touches them, hence `Relaxed`.
    free_head: AtomicU32,
    hand: AtomicU32,
    len: AtomicU32,
}

impl<S, const W: usize, const KW: usize> Table<S, W, KW>
where
    S: Deref<Target = [Slot<W>]>,
{
    /// A table over `slots` (reset to empty). `None` if `slots` is longer than `u32::MAX - 1`.
    pub(crate) fn new(slots: S, seed: u64) -> Option<Self> {
        if slots.len() >= u32::MAX as usize {
            return None;
        }
        for s in slots.iter() {
            s.reset();
        }
        let t = Table {
            slots,
            seed,
            free_head: AtomicU32::new(0),
            hand: AtomicU32::new(0),
            len: AtomicU32::new(0),
        };
        t.init_free_list();
        Some(t)
    }

    #[inline]
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed) as usize
    }

    // ---------------------------------------------------------------- readers

    /// Finds `key` and copies the entry's words into `out`. `CHECKED = false` skips the
    /// sequence validation: a deliberately broken reader for tests, see
    /// [`PathCache::torn_lookup_for_tests`](super::PathCache::torn_lookup_for_tests).
    #[inline]
    pub(crate) fn read<const CHECKED: bool>(
        &self,
        key: &[u32; KW],
        hash: u64,
        out: &mut [u32; W],
    ) -> Probe {
        let slots = &*self.slots;
        if slots.is_empty() {
            return Probe::NotFound;
        }
        let mut link = slots[reduce(hash, slots.len())]
            .head
            .load(Ordering::Acquire);
        let mut steps = 0;
        while link != 0 {
            if steps == MAX_CHAIN {
                return Probe::Busy;
            }
            steps += 1;
            let idx = (link - 1) as usize;
            let Some(slot) = slots.get(idx) else {
                return Probe::Busy;
            };
            let mut tries = 0;
            loop {
                let s1 = slot.seq.load(Ordering::Acquire);
                if !CHECKED || s1 & 1 == 0 {
                    let mut matches = true;
                    for (i, k) in key.iter().enumerate() {
                        if slot.words[KEY + i].load(Ordering::Relaxed) != *k {
                            matches = false;
                            break;
                        }
                    }
                    if matches {
                        for (o, w) in out.iter_mut().zip(slot.words.iter()) {
                            *o = w.load(Ordering::Relaxed);
                        }
                        matches = out[HDR] & OCCUPIED != 0;
                    }
                    let next = slot.next.load(Ordering::Acquire);
                    fence(Ordering::Acquire);
                    let s2 = slot.seq.load(Ordering::Relaxed);
                    if !CHECKED || s1 == s2 {
                        if matches {
                            return Probe::Found(idx, s1);
                        }
                        link = next;
                        break;
                    }
                }
                tries += 1;
                if tries >= MAX_RETRIES {
                    return Probe::Busy;
                }
                core::hint::spin_loop();
            }
        }
        Probe::NotFound
    }

    /// Copies the words of slot `idx` consistently. `None` if the writer kept it busy.
    #[inline]
    pub(crate) fn read_at(&self, idx: usize, out: &mut [u32; W]) -> Option<Option<u32>> {
        let slot = self.slots.get(idx)?;
        for _ in 0..MAX_RETRIES {
            let s1 = slot.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                for (o, w) in out.iter_mut().zip(slot.words.iter()) {
                    *o = w.load(Ordering::Relaxed);
                }
                fence(Ordering::Acquire);
                if slot.seq.load(Ordering::Relaxed) == s1 {
                    return Some(Some(s1));
                }
            }
            core::hint::spin_loop();
        }
        Some(None)
    }

    /// Marks slot `idx` recently used (CLOCK), writing only if the bit is not yet set.
    #[inline]
    pub(crate) fn touch(&self, idx: usize) {
        if let Some(s) = self.slots.get(idx) {
            if s.flags.load(Ordering::Relaxed) & REFERENCED == 0 {
                s.flags.fetch_or(REFERENCED, Ordering::Relaxed);
            }
        }
    }

    /// Claims the refresh hint for the version `seq` of slot `idx`: true for exactly one caller
    /// per version (so one refresh is triggered, not one per reader).
    #[inline]
    pub(crate) fn claim_refresh(&self, idx: usize, seq: u32) -> bool {
        let Some(s) = self.slots.get(idx) else {
            return false;
        };
        let c = s.claim.load(Ordering::Relaxed);
        c != seq
            && s.claim
                .compare_exchange(c, seq, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    // ---------------------------------------------------------------- the writer

    /// Writer's view of slot words (the writer is the only one storing, so `Relaxed` loads
    /// return its own latest values).
    pub(crate) fn load(&self, idx: usize) -> [u32; W] {
        let mut w = [0u32; W];
        for (o, a) in w.iter_mut().zip(self.slots[idx].words.iter()) {
            *o = a.load(Ordering::Relaxed);
        }
        w
    }

    #[inline]
    fn word(&self, idx: usize, i: usize) -> u32 {
        self.slots[idx].words[i].load(Ordering::Relaxed)
    }

    /// Publishes new words for slot `idx` under the seqlock.
    pub(crate) fn store(&self, idx: usize, words: &[u32; W]) {
        let slot = &self.slots[idx];
        let s = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let mut i = 0;
        while i < W {
            slot.words[i].store(words[i], Ordering::Relaxed);
            i += 1;
        }
        slot.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The keyed hash of `key` in this table: what `find`, `read` and `upsert` take.
    #[inline]
    pub(crate) fn hash(&self, key: &[u32]) -> u64 {
        super::hash::hash_words(self.seed, key)
    }

    fn bucket_of_words(&self, key: &[u32]) -> usize {
        reduce(self.hash(key), self.slots.len())
    }

    /// Writer lookup: the index of `key`'s entry, if present.
    pub(crate) fn find(&self, key: &[u32; KW], hash: u64) -> Option<usize> {
        let slots = &*self.slots;
        if slots.is_empty() {
            return None;
        }
        let mut link = slots[reduce(hash, slots.len())]
            .head
            .load(Ordering::Relaxed);
        while link != 0 {
            let idx = (link - 1) as usize;
            if self.word(idx, HDR) & OCCUPIED != 0
                && key
                    .iter()
                    .enumerate()
                    .all(|(i, k)| self.word(idx, KEY + i) == *k)
            {
                return Some(idx);
            }
            link = slots[idx].next.load(Ordering::Relaxed);
        }
        None
    }

    fn chain_len(&self, bucket: usize) -> usize {
        let mut n = 0;
        let mut link = self.slots[bucket].head.load(Ordering::Relaxed);
        while link != 0 {
            n += 1;
            link = self.slots[(link - 1) as usize].next.load(Ordering::Relaxed);
        }
        n
    }

    /// Writer: removes `key`'s entry if present. True if it was.
    pub(crate) fn remove_key(&self, key: &[u32; KW]) -> bool {
        match self.find(key, self.hash(key)) {
            Some(idx) => {
                self.remove_at(idx);
                true
            }
            None => false,
        }
    }

    /// Unlinks occupied slot `idx` from its chain, marks it empty (bumping nothing else) and puts
    /// it on the free list.
    pub(crate) fn remove_at(&self, idx: usize) {
        let slots = &*self.slots;
        let w = self.load(idx);
        if w[HDR] & OCCUPIED == 0 {
            return;
        }
        let b = self.bucket_of_words(&w[KEY..KEY + KW]);
        let target = idx as u32 + 1;
        let next = slots[idx].next.load(Ordering::Relaxed);
        let mut link = slots[b].head.load(Ordering::Relaxed);
        if link == target {
            slots[b].head.store(next, Ordering::Release);
        } else {
            while link != 0 {
                let l = (link - 1) as usize;
                let n = slots[l].next.load(Ordering::Relaxed);
                if n == target {
                    slots[l].next.store(next, Ordering::Release);
                    break;
                }
                link = n;
            }
        }
        let mut cleared = w;
        cleared[HDR] = 0;
        self.store(idx, &cleared);
        // The free list is threaded through `next`. A reader standing on this slot may follow
        // that link into the free list: it then sees only unoccupied slots and reports a miss.
        slots[idx].flags.store(0, Ordering::Relaxed);
        self.free_push(idx);
        self.len.fetch_sub(1, Ordering::Relaxed);
    }

    /// Threads every slot onto the free list, slot 0 first.
    fn init_free_list(&self) {
        self.free_head.store(0, Ordering::Relaxed);
        for i in (0..self.slots.len()).rev() {
            self.free_push(i);
        }
    }

    /// Pushes unoccupied slot `idx` on the (doubly linked) free list.
    fn free_push(&self, idx: usize) {
        let h = self.free_head.load(Ordering::Relaxed);
        self.slots[idx].next.store(h, Ordering::Release);
        self.slots[idx].prev.store(0, Ordering::Relaxed);
        if h != 0 {
            self.slots[(h - 1) as usize]
                .prev
                .store(idx as u32 + 1, Ordering::Relaxed);
        }
        self.free_head.store(idx as u32 + 1, Ordering::Relaxed);
    }

    /// Takes free slot `idx` off the free list in O(1).
    fn free_unlink(&self, idx: usize) {
        let p = self.slots[idx].prev.load(Ordering::Relaxed);
        let n = self.slots[idx].next.load(Ordering::Relaxed);
        if p == 0 {
            self.free_head.store(n, Ordering::Relaxed);
        } else {
            self.slots[(p - 1) as usize]
                .next
                .store(n, Ordering::Release);
        }
        if n != 0 {
            self.slots[(n - 1) as usize]
                .prev
                .store(p, Ordering::Relaxed);
        }
    }

    /// A free slot for an entry of bucket `home`: slot `home` itself if it is free (then the
    /// bucket head and the entry share a slot and a lookup touches one slot instead of two),
    /// else the head of the free list.
    fn alloc(&self, home: usize) -> Option<usize> {
        if self.word(home, HDR) & OCCUPIED == 0 {
            self.free_unlink(home);
            return Some(home);
        }
        let f = self.free_head.load(Ordering::Relaxed);
        if f == 0 {
            return None;
        }
        let idx = (f - 1) as usize;
        self.free_unlink(idx);
        Some(idx)
    }

    /// Bounded CLOCK: examines at most [`EVICT_SCAN`] slots from the hand. A slot for which
    /// `dead(words)` holds (expired, negative, stale generation) is taken at once; otherwise the
    /// first slot whose reference bit was clear; otherwise the first slot examined (whose bit the
    /// sweep just cleared). Returns the victim and whether it was dead.
    fn pick_victim(&self, dead: &dyn Fn(&[u32; W]) -> bool) -> (usize, bool) {
        let n = self.slots.len();
        let mut hand = self.hand.load(Ordering::Relaxed) as usize % n;
        let start = hand;
        let mut unreferenced = None;
        let mut victim = None;
        for _ in 0..EVICT_SCAN.min(n) {
            let i = hand;
            hand = if hand + 1 == n { 0 } else { hand + 1 };
            let w = self.load(i);
            if w[HDR] & OCCUPIED == 0 || dead(&w) {
                victim = Some((i, true));
                break;
            }
            let f = self.slots[i].flags.load(Ordering::Relaxed);
            if f & REFERENCED != 0 {
                self.slots[i]
                    .flags
                    .fetch_and(!REFERENCED, Ordering::Relaxed);
            } else if unreferenced.is_none() {
                unreferenced = Some(i);
            }
        }
        let v = victim.unwrap_or((unreferenced.unwrap_or(start), false));
        self.hand.store(
            if v.0 + 1 == n { 0 } else { v.0 as u32 + 1 },
            Ordering::Relaxed,
        );
        v
    }

    /// Inserts or overwrites the entry for `key` with `words` (whose key part must equal `key`
    /// and whose `INC` is filled in here). Evicts when full. Returns (index, outcome).
    pub(crate) fn upsert(
        &self,
        key: &[u32; KW],
        hash: u64,
        words: &mut [u32; W],
        dead: &dyn Fn(&[u32; W]) -> bool,
    ) -> Option<(usize, Upsert)> {
        if self.slots.is_empty() {
            return None;
        }
        if let Some(idx) = self.find(key, hash) {
            words[INC] = self.word(idx, INC);
            self.store(idx, words);
            return Some((idx, Upsert::Updated));
        }
        let b = reduce(hash, self.slots.len());
        let mut outcome = Upsert::New;
        if self.chain_len(b) >= MAX_CHAIN {
            // Only an adversarial key set gets here; drop the chain's head to stay bounded.
            let head = (self.slots[b].head.load(Ordering::Relaxed) - 1) as usize;
            self.remove_at(head);
            outcome = Upsert::Evicted { dead: false };
        }
        let idx = match self.alloc(b) {
            Some(i) => i,
            None => {
                let (v, was_dead) = self.pick_victim(dead);
                self.remove_at(v);
                outcome = Upsert::Evicted { dead: was_dead };
                // remove_at pushed it on the free list.
                self.alloc(b)?
            }
        };
        words[INC] = self.word(idx, INC).wrapping_add(1);
        self.store(idx, words);
        let slot = &self.slots[idx];
        slot.flags.store(0, Ordering::Relaxed);
        slot.next.store(
            self.slots[b].head.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.slots[b].head.store(idx as u32 + 1, Ordering::Release);
        self.len.fetch_add(1, Ordering::Relaxed);
        Some((idx, outcome))
    }

    /// Removes every entry (O(capacity)).
    pub(crate) fn clear(&self) {
        for s in self.slots.iter() {
            s.reset();
        }
        self.init_free_list();
        self.hand.store(0, Ordering::Relaxed);
        self.len.store(0, Ordering::Relaxed);
    }

    /// Removes dead entries among the next `budget` slots of a sweep starting at `*cursor`.
    pub(crate) fn sweep(
        &self,
        cursor: &AtomicU32,
        budget: usize,
        dead: &dyn Fn(&[u32; W]) -> bool,
    ) -> usize {
        let n = self.slots.len();
        if n == 0 {
            return 0;
        }
        let mut c = cursor.load(Ordering::Relaxed) as usize % n;
        let mut removed = 0;
        for _ in 0..budget.min(n) {
            let w = self.load(c);
            if w[HDR] & OCCUPIED != 0 && dead(&w) {
                self.remove_at(c);
                removed += 1;
            }
            c = if c + 1 == n { 0 } else { c + 1 };
        }
        cursor.store(c as u32, Ordering::Relaxed);
        removed
    }

    /// Calls `f` on the index and words of every occupied slot (writer only, O(capacity)).
    pub(crate) fn for_each_occupied(&self, mut f: impl FnMut(usize, &[u32; W])) {
        for i in 0..self.slots.len() {
            let w = self.load(i);
            if w[HDR] & OCCUPIED != 0 {
                f(i, &w);
            }
        }
    }
}

/// What an upsert did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Upsert {
    New,
    Updated,
    Evicted { dead: bool },
}
