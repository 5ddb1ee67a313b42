//! The generic one-writer / many-reader hash map behind the caches.
//!
//! ## Layout
//!
//! Storage is a caller-provided slice of slots: [`Slot<W>`] (`W` `AtomicU32` words, 128-byte
//! aligned). A path slot is 32 words = 128 bytes = one adjacent-line pair: sequence counter,
//! header, incarnation, endpoint generation, expiry and the 10-word key in the first line, the
//! 64-byte record in the second. The slice is split once, at construction:
//!
//! * the first `E` slots hold **entries in place** (open addressing: no links, no buckets, no
//!   pointer to follow);
//! * the last few slots are reinterpreted as one flat array of words, the **side arrays**: one
//!   tag byte per entry slot (0 = empty, else 8 bits of the key's hash), one refresh-claim byte
//!   per entry slot, one CLOCK reference bit per entry slot — about 1.7% of a path map. A hit
//!   writes there only to set a clear reference bit (plain store).
//!
//! Entry slots form **groups** of [`GROUP`] (32) consecutive slots (4 KiB for path slots). A key
//! hashes to two groups `g1`, `g2`, a preferred slot in each and a tag. It lives in one of the 64
//! slots of its two groups and never moves while it lives (slot indices are stable, which the
//! aliases rely on). The writer puts a new key into its first preferred slot if free, else its
//! second, else into any free slot of the group with more room; if both
//! groups are full it evicts one of the 64 (bounded CLOCK, dead entries first) and reuses that
//! slot. At the design load ([`DESIGN_LOAD_PERCENT`]) about 3 keys in 4 sit in a preferred slot
//! and a full window before the map is full practically never happens. So:
//!
//! * a lookup reads the first preferred slot (a computed address), then the second, and only
//!   if neither holds the key, the 2 × 32 tag bytes of its groups and the slots whose tag
//!   matches: at most [`MAX_PROBE`] (64) slots, however adversarial the keys. The caller can
//!   prefetch both lines of both preferred slots and the two tag lines at once
//!   ([`PathCache::prefetch_hint`](super::PathCache::prefetch_hint)), then, the tags read,
//!   the first tag-matching slot of each group
//!   ([`PathCache::prefetch_tagged`](super::PathCache::prefetch_tagged)): all are on their
//!   way when needed, a hit in the first slot waits for that slot alone, and one outside the
//!   preferred slots for about the same single DRAM round trip, not two;
//! * an insert never fails and never displaces anything outside the key's window.
//!
//! ## The seqlock
//!
//! Word 0 of a slot is its sequence counter. The writer makes it odd (`Relaxed` store, then a
//! `Release` fence), stores the other words (`Relaxed`), and makes it even again (`Release`
//! store). A reader loads the counter (`Acquire`), compares header and key (`Relaxed`; a slot
//! that does not hold the key is left at once), retries if the counter was odd, loads the
//! remaining words (`Relaxed`), issues an `Acquire` fence and loads the counter again: if it did
//! not change, no writer store was observed, so the words are one consistent version. (If any
//! word load had observed a store made after the writer's odd store, the fence pair would make
//! that odd store — or a later one — visible to the second counter load, which would then
//! differ.) Every access is atomic, so a torn read is a detected, discarded value, never
//! undefined behaviour; the module has no `unsafe`. `tests/cache_loom.rs` model-checks this
//! protocol (in-place update, two updates, slot reuse for another key).
//!
//! Tags are hints: the key is always verified under the seqlock. The writer stores a tag
//! (`Release`) only after the slot's words, and clears it after clearing the slot, so a reader
//! that races an insert or removal sees a miss, never a wrong record.
//!
//! Readers never block: after [`MAX_RETRIES`] failed attempts on one slot a lookup gives up with
//! [`Probe::Busy`].

use core::ops::Deref;

use super::hash::reduce;
use crate::sync::{fence, AtomicU32, Ordering};

/// Word index of the sequence counter.
pub(crate) const SEQ: usize = 0;
/// Word index of the header: bit 31 = occupied, bits 7..0 = negative status (0 = positive).
pub(crate) const HDR: usize = 1;
/// Word index of the incarnation, bumped whenever the slot starts holding a new key.
pub(crate) const INC: usize = 2;
/// Word index of the endpoint generation the entry was written under.
pub(crate) const GEN: usize = 3;
/// Word indices of the expiry time (low, high).
pub(crate) const EXP_LO: usize = 4;
pub(crate) const EXP_HI: usize = 5;
/// First key word.
pub(crate) const KEY: usize = 6;

/// Header bit: the slot holds an entry.
pub(crate) const OCCUPIED: u32 = 1 << 31;

/// Attempts on one slot before a reader gives up with `Busy` (2 in the loom model, to keep it
/// small).
pub const MAX_RETRIES: u32 = if cfg!(loom) { 2 } else { 16 };
/// Entry slots per group (a key lives in one of the slots of its two groups). 4 in the loom
/// model (one tag word per group).
pub const GROUP: usize = if cfg!(loom) { 4 } else { 32 };
/// Most slots a lookup examines (two groups).
pub const MAX_PROBE: usize = 2 * GROUP;
/// Most slots a lookup examines. Kept for source compatibility; equal to [`MAX_PROBE`] (there
/// are no chains any more).
pub const MAX_CHAIN: usize = MAX_PROBE;
/// Slots an eviction examines at most (the key's two groups).
pub const EVICT_SCAN: usize = MAX_PROBE;

/// The load (entries / entry slots) the storage helpers size for: at 87% the placement below
/// overflows a window (and so evicts before the map is full) about never (simulated: no
/// overflow in 2^20-slot maps up to 90%).
pub const DESIGN_LOAD_PERCENT: usize = 87;

/// One slot of cache storage: `W` atomic words, word 0 the sequence counter. See the
/// `map` module docs (the layout, in the source) and [`cache`](super) for the API.
///
/// All-zero is the empty state, so `Slot::new()` is `const` and a `static [PathSlot; N]` goes to
/// `.bss` (no flash).
#[repr(C, align(128))]
pub struct Slot<const W: usize> {
    pub(crate) w: [AtomicU32; W],
}

impl<const W: usize> Slot<W> {
    /// An empty slot (all zero).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Slot {
            w: [const { AtomicU32::new(0) }; W],
        }
    }

    /// An empty slot (all zero).
    #[cfg(loom)]
    pub fn new() -> Self {
        Slot {
            w: core::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// How many slots to hand to a cache that should hold `entries` entries at the design load
    /// ([`DESIGN_LOAD_PERCENT`]) without evicting, side arrays included.
    pub const fn slots_for(entries: usize) -> usize {
        let e = entries.div_ceil(DESIGN_LOAD_PERCENT).saturating_mul(100);
        let e = if e < entries { entries } else { e };
        e + side_slots(e, W)
    }

    /// Empties the slot. Keeps `seq` and the incarnation monotonic: a reader that raced the
    /// reset must not mistake a later entry in this slot for the one it saw before.
    fn reset(&self) {
        let s = self.w[SEQ].load(Ordering::Relaxed);
        self.w[SEQ].store(s.wrapping_add(1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (i, w) in self.w.iter().enumerate().skip(1) {
            if i != INC {
                w.store(0, Ordering::Relaxed);
            }
        }
        self.w[SEQ].store((s.wrapping_add(1) | 1).wrapping_add(1), Ordering::Release);
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
            .field("seq", &self.w[SEQ].load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Side-array words needed for `e` entry slots: tags (1 byte), claims (1 byte), CLOCK (1 bit).
const fn side_words(e: usize) -> usize {
    2 * e.div_ceil(4) + e.div_ceil(32)
}

/// Slots of `w` words needed to hold the side arrays of `e` entry slots.
const fn side_slots(e: usize, w: usize) -> usize {
    side_words(e).div_ceil(w)
}

/// The number of entry slots a slice of `n` slots of `w` words provides.
pub(crate) fn entry_slots(n: usize, w: usize) -> usize {
    let mut e = n.saturating_mul(w) / (w + 1);
    while e > 0 && e + side_slots(e, w) > n {
        e -= 1;
    }
    while e + 1 + side_slots(e + 1, w) <= n {
        e += 1;
    }
    e
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

/// Where a key may live: two groups, a preferred slot in each, a tag ([`Map::place`] of its
/// hash). A path lookup derives it once and passes it to the prefetch hints and the read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    g1: usize,
    g2: usize,
    pref: usize,
    pref2: usize,
    tag: u8,
}

/// Bit `i` of the result is set exactly where byte `i` of `x` (numeric order, byte 0 the least
/// significant) is zero: the bytes' high bits of the classic SWAR zero test, gathered by one
/// multiply (each byte's bit lands on its own bit of the top byte; the other products fall
/// below it or off the top, on distinct bits, so nothing carries into it). No branch.
#[inline(always)]
fn zero_byte_mask(x: u64) -> u32 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let high = !((((x & LOW7).wrapping_add(LOW7)) | x) | LOW7);
    ((high >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u32
}

/// The hash map. `KW` key words start at [`KEY`]; the payload follows.
pub(crate) struct Map<S, const W: usize, const KW: usize> {
    slots: S,
    seed: u64,
    /// Leading key words that choose a key's place ([`new`](Self::new)).
    placed: usize,
    /// Entry slots (the rest of `slots` holds the side arrays).
    cap: usize,
    groups: usize,
    /// Side-array word offsets.
    claim_base: usize,
    clock_base: usize,
    // Writer-private state. Atomics only so the map is `Sync` without `unsafe`; only the single
    // writer touches them (plain `Relaxed` load + store, no read-modify-write).
    hand: AtomicU32,
    len: AtomicU32,
}

impl<S, const W: usize, const KW: usize> Map<S, W, KW>
where
    S: Deref<Target = [Slot<W>]>,
{
    /// A map over `slots` (reset to empty) whose keys are placed by their first `placed`
    /// words: keys that agree there share their two groups, preferred slots and tag (the key
    /// compare still tells them apart). `None` if `slots` is longer than `u32::MAX - 1`.
    pub(crate) fn new(slots: S, seed: u64, placed: usize) -> Option<Self> {
        if slots.len() >= u32::MAX as usize {
            return None;
        }
        let cap = entry_slots(slots.len(), W);
        let t = Map {
            cap,
            groups: cap.div_ceil(GROUP),
            claim_base: cap.div_ceil(4),
            clock_base: 2 * cap.div_ceil(4),
            slots,
            seed,
            placed,
            hand: AtomicU32::new(0),
            len: AtomicU32::new(0),
        };
        t.clear();
        Some(t)
    }

    /// Entry slots.
    #[inline]
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    /// Occupied entry slots.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed) as usize
    }

    /// Side-array word `k`.
    #[inline(always)]
    fn side(&self, k: usize) -> &AtomicU32 {
        let i = self.cap + k / W;
        &self.slots[i].w[k % W]
    }

    #[inline(always)]
    fn tag_word(&self, i: usize) -> &AtomicU32 {
        self.side(i / 4)
    }

    #[inline(always)]
    fn group_len(&self, g: usize) -> usize {
        let start = g * GROUP;
        (self.cap - start).min(GROUP)
    }

    /// The second group of a key whose hash gave its first group twice: the next one (the
    /// first after the last), or `g` itself in a one-group map. A window of a single group
    /// would be half as wide, and a key whose groups both fell on a short last group (a
    /// capacity not a multiple of GROUP) would have only its few slots and evict at any load.
    /// Out of line: the rare path stays out of the lookup's code.
    #[cold]
    #[inline(never)]
    fn other_group(&self, g: usize) -> usize {
        if g + 1 < self.groups {
            g + 1
        } else {
            0
        }
    }

    #[inline(always)]
    pub(crate) fn place(&self, h: u64) -> Place {
        let g1 = reduce(h, self.groups);
        // Another group than g1 whenever there are two (`other_group`: one key in `groups`).
        let g2 = reduce(h.rotate_left(32), self.groups);
        let g2 = if g2 != g1 { g2 } else { self.other_group(g1) };
        let m = super::hash::mix(h);
        let at = |g: usize, bits: u64| {
            let len = self.group_len(g);
            let p = (bits as usize) & (GROUP - 1);
            g * GROUP + if p < len { p } else { p % len }
        };
        let t = (m >> 56) as u8;
        Place {
            g1,
            g2,
            pref: at(g1, m),
            pref2: at(g2, m >> 8),
            tag: if t == 0 { 1 } else { t },
        }
    }

    /// The tag words of group `g` (8 words, 32 tag bytes). Bytes past the last entry slot are
    /// other side-array bytes; callers skip indices `>= cap`. (The side storage always extends
    /// past the last group's tag words: the claim bytes follow the tags.)
    #[inline(always)]
    fn group_tags(&self, g: usize, first: u32) -> [u32; GROUP / 4] {
        let k = g * (GROUP / 4);
        let (si, off) = (self.cap + k / W, k % W);
        let mut t = [first; GROUP / 4];
        if off + GROUP / 4 <= W {
            // One slot holds all eight words (always for path slots: 32 words).
            let w = &self.slots[si].w;
            for (j, o) in t.iter_mut().enumerate().skip(1) {
                *o = w[off + j].load(Ordering::Acquire);
            }
        } else {
            for (j, o) in t.iter_mut().enumerate().skip(1) {
                *o = self.side(k + j).load(Ordering::Acquire);
            }
        }
        t
    }

    /// The first tag word of group `g` (its tag line is what `home_addrs` names for a
    /// prefetch: the tag array is not cache-resident at a million slots).
    #[inline(always)]
    fn first_tag(&self, g: usize) -> &AtomicU32 {
        self.side(g * (GROUP / 4))
    }

    /// [`first_tag`](Self::first_tag), loaded.
    #[inline(always)]
    fn first_tag_word(&self, g: usize) -> u32 {
        self.first_tag(g).load(Ordering::Acquire)
    }

    /// The slots of group `g` whose tag is `tag`, as a bit mask (bit `i` = slot
    /// `g * GROUP + i`; only slots below `cap`), from its tag words (`first` = the first one,
    /// loaded already). Branch-free: callers run it while other loads are in flight, where a
    /// mispredicted branch would throw away the work done in their shadow.
    #[inline(always)]
    fn group_matches(&self, g: usize, first: u32, tag: u8) -> u32 {
        let pat = u64::from_ne_bytes([tag; 8]);
        let tags = self.group_tags(g, first);
        let mut m = 0u32;
        for (i, pair) in tags.chunks(2).enumerate() {
            // A missing high word (the loom model's one-word groups) is 0: never a tag (≥ 1).
            let w = u64::from(pair[0]) | pair.get(1).map_or(0, |&h| u64::from(h) << 32);
            m |= zero_byte_mask(w ^ pat) << (8 * i);
        }
        let len = self.group_len(g);
        m & if len >= 32 { u32::MAX } else { (1 << len) - 1 }
    }

    // ---------------------------------------------------------------- readers

    /// Copies slot `idx` consistently into `out` (`out[SEQ]` = the sequence value) and reports
    /// whether it holds `key`. `CHECKED = false` skips the sequence validation (test only).
    #[inline(always)]
    fn try_slot<const CHECKED: bool>(
        &self,
        idx: usize,
        key: &[u32; KW],
        out: &mut [u32; W],
    ) -> Probe {
        let s1 = self.slots[idx].w[SEQ].load(Ordering::Acquire);
        self.try_slot_from::<CHECKED>(idx, s1, key, out)
    }

    /// [`try_slot`](Self::try_slot) whose first sequence load (`Acquire`) was already done.
    ///
    /// The header and key are compared first; a slot that does not hold `key` is left at once,
    /// without validating the copy: a torn read can only make a slot that is *changing key*
    /// (being removed or reused) look like a miss, which is what a reader racing that change may
    /// see anyway. (A slot updated in place keeps its key words, so its key compares equal in
    /// every mix of versions.) Only a match is copied out and validated.
    #[inline(always)]
    fn try_slot_from<const CHECKED: bool>(
        &self,
        idx: usize,
        first_seq: u32,
        key: &[u32; KW],
        out: &mut [u32; W],
    ) -> Probe {
        let slot = &self.slots[idx];
        let mut tries = 0;
        let mut s1 = first_seq;
        loop {
            let hdr = slot.w[HDR].load(Ordering::Relaxed);
            let mut diff = 0;
            for (j, k) in key.iter().enumerate() {
                diff |= slot.w[KEY + j].load(Ordering::Relaxed) ^ k;
            }
            if hdr & OCCUPIED == 0 || diff != 0 {
                return Probe::NotFound;
            }
            if !CHECKED || s1 & 1 == 0 {
                out[HDR] = hdr;
                // Index loops over constant ranges: fully unrolled.
                #[allow(clippy::needless_range_loop)]
                for i in HDR + 1..KEY {
                    out[i] = slot.w[i].load(Ordering::Relaxed);
                }
                // Of the key words, a reader needs only the first (the endpoint).
                out[KEY] = key[0];
                #[allow(clippy::needless_range_loop)]
                for i in KEY + KW..W {
                    out[i] = slot.w[i].load(Ordering::Relaxed);
                }
                fence(Ordering::Acquire);
                let s2 = slot.w[SEQ].load(Ordering::Relaxed);
                if !CHECKED || s1 == s2 {
                    out[SEQ] = s1;
                    return Probe::Found(idx, s1);
                }
            }
            tries += 1;
            if tries >= MAX_RETRIES {
                return Probe::Busy;
            }
            crate::sync::spin_loop();
            s1 = slot.w[SEQ].load(Ordering::Acquire);
        }
    }

    /// Finds `key`, placed at `pl` (the [`place`](Self::place) of its hash), and copies the
    /// entry's words into `out`. `CHECKED = false` skips the sequence validation: a
    /// deliberately broken reader for tests, see
    /// [`PathCache::torn_lookup_for_tests`](super::PathCache::torn_lookup_for_tests).
    #[inline(always)]
    pub(crate) fn read<const CHECKED: bool>(
        &self,
        key: &[u32; KW],
        pl: Place,
        out: &mut [u32; W],
    ) -> Probe {
        self.read_counted::<CHECKED>(key, pl, out, &mut 0)
    }

    /// [`read`](Self::read), adding the number of slots examined to `*examined` (the count is
    /// a dead local in `read`, compiled away).
    #[inline(always)]
    pub(crate) fn read_counted<const CHECKED: bool>(
        &self,
        key: &[u32; KW],
        pl: Place,
        out: &mut [u32; W],
        examined: &mut usize,
    ) -> Probe {
        if self.cap == 0 {
            return Probe::NotFound;
        }
        // The first preferred slot (where ~4 keys in 7 live) is read alone: a hit there waits
        // for one slot, not for the slowest of several loads. The second preferred slot, the
        // tag lines and the tag-matching slots are what `home_addrs` and `tagged_addrs` name
        // for a prefetch, so a key that lives elsewhere finds its slot on its way.
        let mut busy = false;
        *examined += 1;
        match self.try_slot::<CHECKED>(pl.pref, key, out) {
            Probe::NotFound => {}
            Probe::Busy => busy = true,
            found => return found,
        }
        let first = [self.first_tag_word(pl.g1), self.first_tag_word(pl.g2)];
        if pl.pref2 != pl.pref {
            *examined += 1;
            let seq2 = self.slots[pl.pref2].w[SEQ].load(Ordering::Acquire);
            match self.try_slot_from::<CHECKED>(pl.pref2, seq2, key, out) {
                Probe::NotFound => {}
                Probe::Busy => busy = true,
                found => return found,
            }
        }
        // Not in a preferred slot (about 1 key in 4): the tags of both groups (1 byte per slot)
        // name the candidates.
        for (g, first) in [(pl.g1, first[0]), (pl.g2, first[1])] {
            let mut m = self.group_matches(g, first, pl.tag);
            while m != 0 {
                let idx = g * GROUP + m.trailing_zeros() as usize;
                m &= m - 1;
                if idx == pl.pref || idx == pl.pref2 {
                    continue;
                }
                *examined += 1;
                match self.try_slot::<CHECKED>(idx, key, out) {
                    Probe::NotFound => {}
                    Probe::Busy => busy = true,
                    found => return found,
                }
            }
            if pl.g2 == pl.g1 {
                break;
            }
        }
        if busy {
            Probe::Busy
        } else {
            Probe::NotFound
        }
    }

    /// Copies the words of slot `idx` consistently. `None` if the writer kept it busy.
    #[inline]
    pub(crate) fn read_at(&self, idx: usize, out: &mut [u32; W]) -> Option<Option<u32>> {
        if idx >= self.cap {
            return None;
        }
        let slot = &self.slots[idx];
        for _ in 0..MAX_RETRIES {
            let s1 = slot.w[SEQ].load(Ordering::Acquire);
            if s1 & 1 == 0 {
                #[allow(clippy::needless_range_loop)]
                for i in 1..W {
                    out[i] = slot.w[i].load(Ordering::Relaxed);
                }
                fence(Ordering::Acquire);
                if slot.w[SEQ].load(Ordering::Relaxed) == s1 {
                    out[SEQ] = s1;
                    return Some(Some(s1));
                }
            }
            crate::sync::spin_loop();
        }
        Some(None)
    }

    /// Marks slot `idx` recently used (CLOCK). Writes only if the bit is clear, and with a plain
    /// store: a lost race with another reader or the writer's sweep only loses a hint.
    #[inline]
    pub(crate) fn touch(&self, idx: usize) {
        if idx < self.cap {
            let w = self.side(self.clock_base + idx / 32);
            let bit = 1u32 << (idx % 32);
            let v = w.load(Ordering::Relaxed);
            if v & bit == 0 {
                w.store(v | bit, Ordering::Relaxed);
            }
        }
    }

    /// Claims the refresh hint for the version `seq` of slot `idx`: true for exactly one caller
    /// per version (so one refresh is triggered, not one per reader). The claim is one byte per
    /// slot (a function of the version, 1..=255), so about one version in 255 gets no hint
    /// (its entry then expires and is resolved again: harmless).
    #[inline]
    pub(crate) fn claim_refresh(&self, idx: usize, seq: u32) -> bool {
        if idx >= self.cap {
            return false;
        }
        let w = self.side(self.claim_base + idx / 4);
        let shift = (idx % 4) * 8;
        let v = ((seq >> 1) % 255 + 1) << shift;
        for _ in 0..4 {
            let c = w.load(Ordering::Relaxed);
            if c & (0xff << shift) == v {
                return false;
            }
            let n = (c & !(0xff << shift)) | v;
            if w.compare_exchange(c, n, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return true;
            }
        }
        false
    }

    // ---------------------------------------------------------------- the writer

    /// Writer's view of slot words (the writer is the only one storing, so `Relaxed` loads
    /// return its own latest values).
    pub(crate) fn load(&self, idx: usize) -> [u32; W] {
        let mut w = [0u32; W];
        for (o, a) in w.iter_mut().zip(self.slots[idx].w.iter()) {
            *o = a.load(Ordering::Relaxed);
        }
        w
    }

    #[inline]
    fn word(&self, idx: usize, i: usize) -> u32 {
        self.slots[idx].w[i].load(Ordering::Relaxed)
    }

    /// Publishes new words (all but `words[SEQ]`) for slot `idx` under the seqlock.
    pub(crate) fn store(&self, idx: usize, words: &[u32; W]) {
        let slot = &self.slots[idx];
        let s = slot.w[SEQ].load(Ordering::Relaxed);
        slot.w[SEQ].store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (a, v) in slot.w.iter().zip(words.iter()).skip(1) {
            a.store(*v, Ordering::Relaxed);
        }
        slot.w[SEQ].store(s.wrapping_add(2), Ordering::Release);
    }

    /// The cache lines a read of a key placed at `pl` may load: both lines of each preferred
    /// slot, then its groups' tag lines (see
    /// [`PathCache::prefetch_hint`](super::PathCache::prefetch_hint)).
    #[inline]
    pub(crate) fn home_addrs(&self, pl: &Place) -> [*const u8; 6] {
        if self.cap == 0 {
            return [core::ptr::null(); 6];
        }
        let tags = |g: usize| self.first_tag(g) as *const AtomicU32 as *const u8;
        let [a, b] = self.slot_lines(pl.pref);
        let [c, d] = self.slot_lines(pl.pref2);
        [a, b, c, d, tags(pl.g1), tags(pl.g2)]
    }

    /// [`slot_lines`](Self::slot_lines), for the tests' hooks.
    pub(crate) fn slot_lines_for_tests(&self, idx: usize) -> [*const u8; 2] {
        self.slot_lines(idx)
    }

    /// The first and the last cache line of slot `idx` (one line apart for path slots: header
    /// and key, then the record). The adjacent-line prefetcher does not bring the second line
    /// in time on its own: prefetching it too took ~50 ns off a 1M-path hit (p50 and p99).
    #[inline(always)]
    fn slot_lines(&self, idx: usize) -> [*const u8; 2] {
        let p = self.slots[idx].w.as_ptr() as *const u8;
        let last = (core::mem::size_of::<Slot<W>>() - 1) & !63;
        [p, p.wrapping_add(last)]
    }

    /// The lines of the first slot of each of the groups of a key placed at `pl` whose tag
    /// matches: where a key
    /// that did not get a preferred slot lives (about 1 in 4 at the design load; a tag
    /// collision ahead of it, 1/255 per slot, names another), else mostly its own preferred
    /// slot again. Where a group has none, the first preferred slot's lines stand in (a
    /// prefetch of a line already on its way costs nothing). It **loads** the two groups' tag
    /// words, so call it after prefetching [`home_addrs`](Self::home_addrs): the tags arrive
    /// with the preferred slots, and a prefetch of these then starts the overflow slot's load
    /// a few ns later instead of after the preferred slots proved not to hold the key. No
    /// branch on the tags ([`group_matches`](Self::group_matches)).
    #[inline]
    pub(crate) fn tagged_addrs(&self, pl: &Place) -> [*const u8; 4] {
        if self.cap == 0 {
            return [core::ptr::null(); 4];
        }
        let pick = |g: usize| {
            let m = self.group_matches(g, self.first_tag_word(g), pl.tag);
            if m != 0 {
                g * GROUP + m.trailing_zeros() as usize
            } else {
                pl.pref
            }
        };
        let [a, b] = self.slot_lines(pick(pl.g1));
        let [c, d] = self.slot_lines(pick(pl.g2));
        [a, b, c, d]
    }

    /// The keyed hash of `key` in this map: what `find`, `read` and `upsert` take. Only
    /// the first `placed` words count (see [`new`](Self::new)).
    #[inline]
    pub(crate) fn hash(&self, key: &[u32; KW]) -> u64 {
        // Word by word (no copy of a run-time length: it would stall the hash's loads).
        let mut p = *key;
        for (i, w) in p.iter_mut().enumerate() {
            if i >= self.placed {
                *w = 0;
            }
        }
        super::hash::hash_key(self.seed, &p)
    }

    fn tag_of(&self, idx: usize) -> u8 {
        (self.tag_word(idx).load(Ordering::Relaxed) >> ((idx % 4) * 8)) as u8
    }

    fn set_tag(&self, idx: usize, tag: u8) {
        let w = self.tag_word(idx);
        let shift = (idx % 4) * 8;
        let v = w.load(Ordering::Relaxed);
        w.store(
            (v & !(0xff << shift)) | ((tag as u32) << shift),
            Ordering::Release,
        );
    }

    fn clock_bit(&self, idx: usize) -> bool {
        self.side(self.clock_base + idx / 32)
            .load(Ordering::Relaxed)
            & (1 << (idx % 32))
            != 0
    }

    fn clear_clock(&self, idx: usize) {
        let w = self.side(self.clock_base + idx / 32);
        let v = w.load(Ordering::Relaxed);
        let bit = 1u32 << (idx % 32);
        if v & bit != 0 {
            w.store(v & !bit, Ordering::Relaxed);
        }
    }

    /// The slots of `key`'s window: group 1, then group 2 (if different).
    fn window(&self, pl: &Place) -> impl Iterator<Item = usize> + '_ {
        let a = pl.g1 * GROUP..pl.g1 * GROUP + self.group_len(pl.g1);
        let b = if pl.g2 != pl.g1 {
            pl.g2 * GROUP..pl.g2 * GROUP + self.group_len(pl.g2)
        } else {
            0..0
        };
        a.chain(b)
    }

    /// Writer lookup: the index of the entry of `key`, placed at `pl`, if present.
    pub(crate) fn find(&self, key: &[u32; KW], pl: &Place) -> Option<usize> {
        if self.cap == 0 {
            return None;
        }
        // The window in order (group 1, then group 2), a tag word at a time: only the slots
        // whose tag matches are read.
        let groups = [Some(pl.g1), (pl.g2 != pl.g1).then_some(pl.g2)];
        for g in groups.into_iter().flatten() {
            let mut m = self.group_matches(g, self.first_tag_word(g), pl.tag);
            while m != 0 {
                let i = g * GROUP + m.trailing_zeros() as usize;
                if self.word(i, HDR) & OCCUPIED != 0
                    && key
                        .iter()
                        .enumerate()
                        .all(|(j, k)| self.word(i, KEY + j) == *k)
                {
                    return Some(i);
                }
                m &= m - 1;
            }
        }
        None
    }

    /// Free (tag 0) slots of group `g`.
    fn group_free(&self, g: usize) -> usize {
        self.group_matches(g, self.first_tag_word(g), 0)
            .count_ones() as usize
    }

    /// A free slot of the key's group with more room (the first group on a tie), searched from
    /// that group's preferred slot on; `None` when both groups are full. Only an insert whose
    /// two preferred slots are taken asks, so the groups' room is counted only then.
    fn free_in_roomier_group(&self, pl: &Place) -> Option<usize> {
        let free1 = self.group_free(pl.g1);
        let free2 = if pl.g2 != pl.g1 {
            self.group_free(pl.g2)
        } else {
            0
        };
        if free1.max(free2) == 0 {
            return None;
        }
        let g = if free1 >= free2 { pl.g1 } else { pl.g2 };
        let base = g * GROUP;
        let len = self.group_len(g);
        let off = if g == pl.g1 { pl.pref } else { pl.pref2 } - base;
        Some(
            (0..len)
                .map(|k| base + (off + k) % len)
                .find(|&i| self.tag_of(i) == 0)
                .unwrap_or(pl.pref),
        )
    }

    /// Writer: removes `key`'s entry if present. True if it was.
    pub(crate) fn remove_key(&self, key: &[u32; KW]) -> bool {
        match self.find(key, &self.place(self.hash(key))) {
            Some(idx) => {
                self.remove_at(idx);
                true
            }
            None => false,
        }
    }

    /// Empties occupied slot `idx` (its incarnation stays, so aliases to it stay stale).
    pub(crate) fn remove_at(&self, idx: usize) {
        let w = self.load(idx);
        if w[HDR] & OCCUPIED == 0 {
            return;
        }
        let mut cleared = w;
        cleared[HDR] = 0;
        self.store(idx, &cleared);
        self.set_tag(idx, 0);
        self.clear_clock(idx);
        self.len
            .store(self.len.load(Ordering::Relaxed) - 1, Ordering::Relaxed);
    }

    /// Bounded CLOCK over the key's window (both groups full): a slot for which `dead(words)`
    /// holds (expired, negative, stale generation) is taken at once; otherwise the first slot
    /// whose reference bit was clear (the bits of referenced slots passed on the way are
    /// cleared: second chance); otherwise the first slot examined. The scan starts at a rotating
    /// offset. Returns the victim and whether it was dead.
    fn pick_victim(&self, pl: &Place, dead: &dyn Fn(&[u32; W]) -> bool) -> (usize, bool) {
        let mut cand = [0usize; MAX_PROBE];
        let mut n = 0;
        for i in self.window(pl) {
            cand[n] = i;
            n += 1;
        }
        let h = self.hand.load(Ordering::Relaxed);
        self.hand.store(h.wrapping_add(1), Ordering::Relaxed);
        let start = h as usize % n;
        let mut unreferenced = None;
        for k in 0..n {
            let i = cand[(start + k) % n];
            let w = self.load(i);
            if w[HDR] & OCCUPIED == 0 || dead(&w) {
                return (i, true);
            }
            if unreferenced.is_none() {
                if self.clock_bit(i) {
                    self.clear_clock(i);
                } else {
                    unreferenced = Some(i);
                }
            }
        }
        (unreferenced.unwrap_or(cand[start]), false)
    }

    /// Inserts or overwrites the entry for `key` with `words` (whose key part must equal `key`
    /// and whose `INC` is filled in here). Evicts within the key's window when both its groups
    /// are full. Returns (index, outcome).
    pub(crate) fn upsert(
        &self,
        key: &[u32; KW],
        hash: u64,
        words: &mut [u32; W],
        dead: &dyn Fn(&[u32; W]) -> bool,
    ) -> Option<(usize, Upsert)> {
        if self.cap == 0 {
            return None;
        }
        let pl = self.place(hash);
        if let Some(idx) = self.find(key, &pl) {
            words[INC] = self.word(idx, INC);
            self.store(idx, words);
            return Some((idx, Upsert::Updated));
        }
        // The first preferred slot if free (lookups read it first), else the second, else any
        // free slot of the group with more room, else evict within the window. (Simulated at
        // 87% load, 2^20 slots: 57% of keys in the first preferred slot, 18% in the second,
        // no window full before the map is.)
        let mut outcome = Upsert::New;
        let idx = if self.tag_of(pl.pref) == 0 {
            pl.pref
        } else if self.tag_of(pl.pref2) == 0 {
            pl.pref2
        } else if let Some(i) = self.free_in_roomier_group(&pl) {
            i
        } else {
            let (v, was_dead) = self.pick_victim(&pl, dead);
            self.remove_at(v);
            outcome = Upsert::Evicted { dead: was_dead };
            v
        };
        words[INC] = self.word(idx, INC).wrapping_add(1);
        self.store(idx, words);
        self.clear_clock(idx);
        self.set_tag(idx, pl.tag);
        self.len
            .store(self.len.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        Some((idx, outcome))
    }

    /// Removes every entry (O(capacity)).
    pub(crate) fn clear(&self) {
        for s in self.slots[..self.cap].iter() {
            s.reset();
        }
        for s in self.slots[self.cap..].iter() {
            for w in s.w.iter() {
                w.store(0, Ordering::Relaxed);
            }
        }
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
        let n = self.cap;
        if n == 0 {
            return 0;
        }
        let mut c = cursor.load(Ordering::Relaxed) as usize % n;
        let mut removed = 0;
        for _ in 0..budget.min(n) {
            if self.tag_of(c) != 0 {
                let w = self.load(c);
                if w[HDR] & OCCUPIED != 0 && dead(&w) {
                    self.remove_at(c);
                    removed += 1;
                }
            }
            c = if c + 1 == n { 0 } else { c + 1 };
        }
        cursor.store(c as u32, Ordering::Relaxed);
        removed
    }

    /// Calls `f` on the index and words of every occupied slot (writer only, O(capacity)).
    pub(crate) fn for_each_occupied(&self, mut f: impl FnMut(usize, &[u32; W])) {
        for i in 0..self.cap {
            if self.tag_of(i) != 0 {
                let w = self.load(i);
                if w[HDR] & OCCUPIED != 0 {
                    f(i, &w);
                }
            }
        }
    }

    /// Test hook: the window (`g1`, `g2`) and tag of a hash.
    pub(crate) fn window_of(&self, hash: u64) -> (usize, usize, u8) {
        let pl = self.place(hash);
        (pl.g1, pl.g2, pl.tag)
    }
}

/// What an upsert did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Upsert {
    New,
    Updated,
    Evicted { dead: bool },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_slots_leave_room_for_side_arrays() {
        for n in [0usize, 1, 2, 3, 8, 16, 17, 64, 100, 1000, 1 << 20] {
            for w in [25usize, 32] {
                let e = entry_slots(n, w);
                assert!(e + side_slots(e, w) <= n, "n {n} w {w}");
                if n >= 2 {
                    assert!(e >= 1);
                }
                assert!(e + 1 + side_slots(e + 1, w) > n);
            }
        }
        // ~1.7% of a path map is side arrays.
        let n = 1 << 20;
        let e = entry_slots(n, 32);
        assert!(n - e < n / 50, "{}", n - e);
        // slots_for sizes for the design load.
        let s = Slot::<32>::slots_for(1_000_000);
        assert!(entry_slots(s, 32) * DESIGN_LOAD_PERCENT / 100 >= 1_000_000);
    }

    #[test]
    fn zero_byte_mask_is_exact() {
        assert_eq!(zero_byte_mask(0), 0xff);
        assert_eq!(zero_byte_mask(0x0101_0101_0101_0101), 0);
        assert_eq!(zero_byte_mask(0x0100_ff00_8000_0001), 0b0101_0110);
        // Against the byte-by-byte definition, over every single and double zero byte and
        // random words.
        let naive =
            |x: u64| (0..8).fold(0u32, |m, i| m | (u32::from((x >> (8 * i)) as u8 == 0) << i));
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..8 {
            for j in 0..8 {
                let v = 0x1111_1111_1111_1111u64 & !(0xff << (8 * i)) & !(0xff << (8 * j));
                assert_eq!(zero_byte_mask(v), naive(v), "{v:#x}");
            }
        }
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Bias towards zero bytes: clear the bytes whose low bit is set in a second word.
            let v = x & !((x.rotate_left(29) & 0x0101_0101_0101_0101) * 0xff);
            assert_eq!(zero_byte_mask(v), naive(v), "{v:#x}");
        }
    }
}

/// A minimal map over the real slot code (same `Slot`, seqlock store, `try_slot`, tags and
/// placement), with a 1-word key and a 2-word payload, so `tests/cache_loom.rs` can explore every
/// interleaving of one writer and one reader. Exists only under `cfg(loom)`.
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_model {
    use super::{set_expiry, Map, Probe, Slot, HDR, KEY, OCCUPIED};
    use core::ops::Deref;

    /// Words of a model slot: seq + 5 meta + 1 key word + 2 payload words.
    pub const W: usize = KEY + 1 + 2;

    /// The model map.
    pub struct Tiny<S: Deref<Target = [Slot<W>]>> {
        t: Map<S, W, 1>,
    }

    impl<S: Deref<Target = [Slot<W>]>> Tiny<S> {
        /// A map over `slots` (all but the side-array slots hold entries).
        pub fn new(slots: S) -> Self {
            Tiny {
                t: Map::new(slots, 7, 1).expect("small"),
            }
        }

        /// Entry slots.
        pub fn capacity(&self) -> usize {
            self.t.capacity()
        }

        /// Writer: inserts or updates `key` with `payload`.
        pub fn write(&self, key: u32, payload: [u32; 2]) {
            let mut w = [0u32; W];
            w[HDR] = OCCUPIED;
            set_expiry(&mut w, u64::MAX);
            w[KEY] = key;
            w[KEY + 1..].copy_from_slice(&payload);
            let k = [key];
            let _ = self.t.upsert(&k, self.t.hash(&k), &mut w, &|_| false);
        }

        /// Writer: removes `key`.
        pub fn remove(&self, key: u32) -> bool {
            self.t.remove_key(&[key])
        }

        /// Reader: `Some(payload)` on a validated hit, `None` on a miss or busy.
        pub fn read(&self, key: u32) -> Option<[u32; 2]> {
            let k = [key];
            let mut out = [0u32; W];
            match self
                .t
                .read::<true>(&k, self.t.place(self.t.hash(&k)), &mut out)
            {
                Probe::Found(..) => {
                    assert_eq!(out[KEY], key);
                    let mut p = [0u32; 2];
                    p.copy_from_slice(&out[KEY + 1..]);
                    Some(p)
                }
                Probe::NotFound | Probe::Busy => None,
            }
        }
    }
}
