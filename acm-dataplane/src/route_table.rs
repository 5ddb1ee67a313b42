//! Fixed-capacity PathRecord cache: one writer, lock-free readers.
//!
//! TEMPORARY: `acm-core-nostd::cache` (owned by the cache engineer) is the long-term home of
//! the project's caches; this table exists so the provider's hit path works today. It is
//! replaced by the core cache once that lands; the interface here (key words in, 64-byte record
//! out, expiry in coarse milliseconds) is deliberately small to make the swap mechanical.
//!
//! Layout: `2^k` buckets of [`WAYS`] slots. A key lives in one of its two candidate buckets
//! (two-choice hashing), so a lookup touches at most `2 × WAYS` slots and never probes further. Each slot carries a sequence
//! number (seqlock): the writer makes it odd, writes the words, makes it even; a reader
//! retries when it sees an odd or changed sequence. Every word is an atomic, so concurrent
//! access is never undefined behaviour even if the single-writer rule were broken (it would
//! only produce torn entries, which the sequence check rejects).

use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Slots per bucket.
pub const WAYS: usize = 4;
/// Words of a key: one word of endpoint identity plus a 64-byte normalised request record.
pub const KEY_WORDS: usize = 9;
/// Words of a value: a 64-byte PathRecord.
pub const VAL_WORDS: usize = 8;

/// Expiry value meaning "never expires".
pub const NEVER: u64 = u64::MAX;

/// A cache key: endpoint id in word 0, then the normalised request record.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RouteKey {
    /// The key words.
    pub words: [u64; KEY_WORDS],
}

impl RouteKey {
    /// Builds a key from an endpoint id (nonzero) and a 64-byte record.
    pub fn new(ep_id: u64, record: &[u8; 64]) -> Self {
        let mut words = [0u64; KEY_WORDS];
        words[0] = ep_id;
        for (i, chunk) in record.chunks_exact(8).enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            words[i + 1] = u64::from_ne_bytes(w);
        }
        RouteKey { words }
    }

    /// The endpoint id this key belongs to.
    pub fn ep_id(&self) -> u64 {
        self.words[0]
    }

    fn hash(&self) -> u64 {
        // FxHash-style multiply-rotate over the words, then a final avalanche.
        let mut h: u64 = 0;
        for w in self.words {
            h = (h.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }
}

struct Slot {
    seq: AtomicU32,
    /// 0 = empty, [`NEVER`] = never expires, else the coarse time (ms) after which it is stale.
    expires: AtomicU64,
    key: [AtomicU64; KEY_WORDS],
    val: [AtomicU64; VAL_WORDS],
}

impl Slot {
    fn new() -> Self {
        Slot {
            seq: AtomicU32::new(0),
            expires: AtomicU64::new(0),
            key: Default::default(),
            val: Default::default(),
        }
    }
}

/// The table. Readers: [`RouteTable::get`] from any thread. Writer: exactly one thread calls
/// [`RouteTable::insert`], [`RouteTable::retain`] and [`RouteTable::clear`].
pub struct RouteTable {
    slots: Box<[Slot]>,
    bucket_mask: usize,
    len: AtomicUsize,
    victim: AtomicUsize,
}

impl RouteTable {
    /// A table able to hold about `entries` routes (rounded up so buckets stay half full).
    pub fn with_capacity(entries: usize) -> Self {
        let buckets = (entries.max(1) * 2).div_ceil(WAYS).next_power_of_two();
        let slots: Vec<Slot> = (0..buckets * WAYS).map(|_| Slot::new()).collect();
        RouteTable {
            slots: slots.into_boxed_slice(),
            bucket_mask: buckets - 1,
            len: AtomicUsize::new(0),
            victim: AtomicUsize::new(0),
        }
    }

    /// Number of slots (the hard bound on entries).
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Number of live entries (approximate while the writer runs).
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether the table holds no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key's two candidate buckets (two-choice hashing keeps overflow negligible at the
    /// load factor `with_capacity` allows), as one iterator over their slots.
    fn buckets(&self, key: &RouteKey) -> (&[Slot], &[Slot]) {
        let h = key.hash();
        let b1 = (h as usize) & self.bucket_mask;
        let mut b2 = ((h >> 32) as usize) & self.bucket_mask;
        if b2 == b1 {
            b2 = (b1 + 1) & self.bucket_mask;
        }
        (
            &self.slots[b1 * WAYS..(b1 + 1) * WAYS],
            &self.slots[b2 * WAYS..(b2 + 1) * WAYS],
        )
    }

    fn candidates(&self, key: &RouteKey) -> impl Iterator<Item = &Slot> {
        let (a, b) = self.buckets(key);
        a.iter().chain(b.iter())
    }

    /// Looks a key up. Lock-free, allocation-free, no syscall. `now` is the coarse clock (ms).
    pub fn get(&self, key: &RouteKey, now: u64) -> Option<[u8; 64]> {
        for slot in self.candidates(key) {
            // A slot changing under us more than a few times means the writer is busy on it:
            // report a miss rather than spin on the core's thread.
            for _ in 0..4 {
                let s1 = slot.seq.load(Ordering::Acquire);
                if s1 & 1 == 1 {
                    std::hint::spin_loop();
                    continue;
                }
                let expires = slot.expires.load(Ordering::Relaxed);
                let mut same = expires != 0 && expires > now;
                if same {
                    for (i, w) in key.words.iter().enumerate() {
                        if slot.key[i].load(Ordering::Relaxed) != *w {
                            same = false;
                            break;
                        }
                    }
                }
                let mut val = [0u8; 64];
                if same {
                    for (i, chunk) in val.chunks_exact_mut(8).enumerate() {
                        chunk.copy_from_slice(&slot.val[i].load(Ordering::Relaxed).to_ne_bytes());
                    }
                }
                fence(Ordering::Acquire);
                if slot.seq.load(Ordering::Relaxed) != s1 {
                    continue;
                }
                if same {
                    return Some(val);
                }
                break;
            }
        }
        None
    }

    fn write_slot(slot: &Slot, key: Option<&RouteKey>, val: &[u8; 64], expires: u64) {
        let s = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        slot.expires.store(expires, Ordering::Relaxed);
        if let Some(key) = key {
            for (i, w) in key.words.iter().enumerate() {
                slot.key[i].store(*w, Ordering::Relaxed);
            }
        }
        for (i, chunk) in val.chunks_exact(8).enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            slot.val[i].store(u64::from_ne_bytes(w), Ordering::Relaxed);
        }
        slot.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    fn slot_key_is(slot: &Slot, key: &RouteKey) -> bool {
        key.words
            .iter()
            .enumerate()
            .all(|(i, w)| slot.key[i].load(Ordering::Relaxed) == *w)
    }

    /// Inserts or replaces a route (writer only). When the bucket is full of live entries, an
    /// expired one or else a rotating victim is evicted; returns whether something was evicted.
    pub fn insert(&self, key: &RouteKey, record: &[u8; 64], expires: u64, now: u64) -> bool {
        let expires = expires.max(1);
        // Same key: update in place.
        for slot in self.candidates(key) {
            if slot.expires.load(Ordering::Relaxed) != 0 && Self::slot_key_is(slot, key) {
                Self::write_slot(slot, None, record, expires);
                return false;
            }
        }
        // A free (empty or expired) slot in the emptier of the two buckets.
        let free = |slot: &Slot| {
            let e = slot.expires.load(Ordering::Relaxed);
            e == 0 || e <= now
        };
        let (first, second) = self.buckets(key);
        let n1 = first.iter().filter(|s| free(s)).count();
        let n2 = second.iter().filter(|s| free(s)).count();
        let bucket = if n2 > n1 { second } else { first };
        if let Some(slot) = bucket.iter().find(|s| free(s)) {
            if slot.expires.load(Ordering::Relaxed) == 0 {
                self.len.fetch_add(1, Ordering::Relaxed);
            }
            Self::write_slot(slot, Some(key), record, expires);
            return false;
        }
        let v = self.victim.fetch_add(1, Ordering::Relaxed) % (2 * WAYS);
        if let Some(slot) = self.candidates(key).nth(v) {
            Self::write_slot(slot, Some(key), record, expires);
        }
        true
    }

    /// Removes every entry for which `keep(key)` is false (writer only). Returns how many.
    pub fn retain(&self, mut keep: impl FnMut(&RouteKey) -> bool) -> usize {
        let mut removed = 0;
        for slot in self.slots.iter() {
            if slot.expires.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut key = RouteKey {
                words: [0; KEY_WORDS],
            };
            for (i, w) in key.words.iter_mut().enumerate() {
                *w = slot.key[i].load(Ordering::Relaxed);
            }
            if !keep(&key) {
                Self::write_slot(slot, None, &[0; 64], 0);
                removed += 1;
            }
        }
        self.len.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Removes everything (writer only).
    pub fn clear(&self) -> usize {
        self.retain(|_| false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rec(n: u32) -> [u8; 64] {
        let mut r = [0u8; 64];
        r[40..44].copy_from_slice(&n.to_be_bytes());
        r
    }

    #[test]
    fn insert_get_expire_retain() {
        let t = RouteTable::with_capacity(16);
        let k1 = RouteKey::new(1, &rec(1));
        let k2 = RouteKey::new(2, &rec(1));
        assert_eq!(t.get(&k1, 0), None);
        t.insert(&k1, &rec(11), NEVER, 0);
        t.insert(&k2, &rec(22), 100, 0);
        assert_eq!(t.get(&k1, 5), Some(rec(11)));
        assert_eq!(t.get(&k2, 99), Some(rec(22)));
        assert_eq!(t.get(&k2, 100), None, "expired at its deadline");
        assert_eq!(t.len(), 2);
        assert_eq!(t.retain(|k| k.ep_id() != 1), 1);
        assert_eq!(t.get(&k1, 5), None);
        assert_eq!(t.len(), 1);
        t.insert(&k2, &rec(23), NEVER, 0);
        assert_eq!(t.get(&k2, 1000), Some(rec(23)), "update in place");
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn bounded_and_evicts() {
        let t = RouteTable::with_capacity(8);
        let slots = t.slot_count();
        let mut evicted = 0;
        for i in 0..(slots as u32 * 4) {
            if t.insert(&RouteKey::new(1, &rec(i)), &rec(i), NEVER, 0) {
                evicted += 1;
            }
        }
        assert!(t.len() <= slots);
        assert!(evicted > 0);
        // Whatever is found is the value stored for that key.
        for i in 0..(slots as u32 * 4) {
            if let Some(v) = t.get(&RouteKey::new(1, &rec(i)), 0) {
                assert_eq!(v, rec(i));
            }
        }
    }

    #[test]
    fn concurrent_readers_never_see_torn_values() {
        let t = Arc::new(RouteTable::with_capacity(64));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let key = RouteKey::new(7, &rec(7));
        let reader = {
            let t = t.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut seen = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if let Some(v) = t.get(&key, 0) {
                        // Writer always stores a value whose 8 words are equal.
                        let w0 = &v[0..8];
                        assert!(v.chunks_exact(8).all(|c| c == w0), "torn read");
                        seen += 1;
                    }
                }
                seen
            })
        };
        for i in 0..200_000u64 {
            let mut v = [0u8; 64];
            for c in v.chunks_exact_mut(8) {
                c.copy_from_slice(&i.to_ne_bytes());
            }
            t.insert(&key, &v, NEVER, 0);
        }
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }
}
