//! The bounded table of pending requests: coalesces concurrent misses for the same key.
//!
//! The first request for a key [`begin`](PendingTable::begin)s a resolution
//! ([`Begin::Started`]); later requests for the same key queue behind it
//! ([`Begin::Coalesced`]). When the resolution finishes, [`complete`](PendingTable::complete)
//! hands every waiting token to a callback exactly once, in arrival order, and frees the key.
//! [`cancel_ep`](PendingTable::cancel_ep) does the same for every key of an endpoint (port
//! change, close), [`cancel`](PendingTable::cancel) withdraws a single request (its own timeout).
//!
//! Capacity for distinct keys and for waiters (total queued tokens) is fixed by the two storage
//! slices handed to [`PendingTable::new`]; when either is exhausted, `begin` answers
//! [`Begin::Full`] and takes nothing (the caller answers that request with ENOMEM at once).
//!
//! A token is a [`Token`] (`u32`), typically the index of the request in the caller's own request
//! table. The table is writer-only (`&mut self`), so it needs no atomics.
//!
//! Keys live in `PendingSlot<K>`s that double as hash buckets (chains of `u32` indices, like the
//! caches); waiters are a FIFO linked list per key through [`WaiterSlot`]s (8 bytes each).
//! `size_of::<PendingSlot<PathKey>>()` is 72 bytes on 64-bit hosts.

use core::ops::DerefMut;

use super::hash::reduce;
use super::key::CacheKey;

/// A request's token: the caller's handle for one waiting request.
pub type Token = u32;

/// Storage for one pending key (and one hash bucket).
#[derive(Clone, Copy, Debug)]
pub struct PendingSlot<K> {
    key: Option<K>,
    /// Bucket head (link = index + 1, 0 = none).
    head: u32,
    /// Chain link when occupied, free-list link when free.
    next: u32,
    /// First and last waiter (links).
    first: u32,
    last: u32,
    count: u32,
}

impl<K> PendingSlot<K> {
    /// An empty slot (`const`, for `static` storage).
    pub const fn new() -> Self {
        PendingSlot {
            key: None,
            head: 0,
            next: 0,
            first: 0,
            last: 0,
            count: 0,
        }
    }
}

impl<K> Default for PendingSlot<K> {
    fn default() -> Self {
        Self::new()
    }
}

/// Storage for one waiting token.
#[derive(Clone, Copy, Debug, Default)]
pub struct WaiterSlot {
    token: Token,
    next: u32,
}

impl WaiterSlot {
    /// An empty slot (`const`, for `static` storage).
    pub const fn new() -> Self {
        WaiterSlot { token: 0, next: 0 }
    }
}

/// Outcome of [`PendingTable::begin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Begin {
    /// First request for this key: the caller starts the resolution.
    Started,
    /// A resolution for this key is already under way; the token waits for it.
    Coalesced,
    /// No room for the key or the token; nothing was recorded.
    Full,
}

/// Errors from [`PendingTable::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingCapacityError;

impl core::fmt::Display for PendingCapacityError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("pending table storage is empty or larger than u32::MAX - 1 slots")
    }
}

#[cfg(feature = "std")]
impl std::error::Error for PendingCapacityError {}

/// The pending-request table over caller storage; see the [module docs](self).
#[derive(Debug)]
pub struct PendingTable<K, KS, WS>
where
    KS: DerefMut<Target = [PendingSlot<K>]>,
    WS: DerefMut<Target = [WaiterSlot]>,
{
    keys: KS,
    waiters: WS,
    seed: u64,
    key_free: u32,
    key_hw: u32,
    waiter_free: u32,
    waiter_hw: u32,
    keys_used: usize,
    waiters_used: usize,
}

impl<K, KS, WS> PendingTable<K, KS, WS>
where
    K: CacheKey,
    KS: DerefMut<Target = [PendingSlot<K>]>,
    WS: DerefMut<Target = [WaiterSlot]>,
{
    /// A table over `keys` (capacity for distinct keys) and `waiters` (capacity for queued
    /// tokens), both reset to empty.
    pub fn new(mut keys: KS, mut waiters: WS, seed: u64) -> Result<Self, PendingCapacityError> {
        let too_big = |n: usize| n == 0 || n >= u32::MAX as usize;
        if too_big(keys.len()) || too_big(waiters.len()) {
            return Err(PendingCapacityError);
        }
        keys.iter_mut().for_each(|k| *k = PendingSlot::new());
        waiters.iter_mut().for_each(|w| *w = WaiterSlot::new());
        Ok(PendingTable {
            keys,
            waiters,
            seed,
            key_free: 0,
            key_hw: 0,
            waiter_free: 0,
            waiter_hw: 0,
            keys_used: 0,
            waiters_used: 0,
        })
    }

    /// Distinct keys currently pending.
    pub fn len(&self) -> usize {
        self.keys_used
    }

    /// True if nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.keys_used == 0
    }

    /// Tokens currently waiting (over all keys).
    pub fn waiting(&self) -> usize {
        self.waiters_used
    }

    /// Capacity for distinct keys.
    pub fn key_capacity(&self) -> usize {
        self.keys.len()
    }

    /// Capacity for waiting tokens.
    pub fn waiter_capacity(&self) -> usize {
        self.waiters.len()
    }

    fn bucket(&self, key: &K) -> usize {
        reduce(key.hash_with(self.seed), self.keys.len())
    }

    fn find(&self, key: &K) -> Option<usize> {
        let mut link = self.keys[self.bucket(key)].head;
        while link != 0 {
            let i = (link - 1) as usize;
            if self.keys[i].key.as_ref() == Some(key) {
                return Some(i);
            }
            link = self.keys[i].next;
        }
        None
    }

    /// True if a resolution for `key` is under way.
    pub fn is_pending(&self, key: &K) -> bool {
        self.find(key).is_some()
    }

    /// Tokens waiting for `key`.
    pub fn waiters_of(&self, key: &K) -> usize {
        self.find(key).map_or(0, |i| self.keys[i].count as usize)
    }

    fn alloc_waiter(&mut self) -> Option<usize> {
        if self.waiter_free != 0 {
            let i = (self.waiter_free - 1) as usize;
            self.waiter_free = self.waiters[i].next;
            return Some(i);
        }
        let hw = self.waiter_hw as usize;
        (hw < self.waiters.len()).then(|| {
            self.waiter_hw += 1;
            hw
        })
    }

    fn free_waiter(&mut self, i: usize) {
        self.waiters[i].next = self.waiter_free;
        self.waiter_free = i as u32 + 1;
        self.waiters_used -= 1;
    }

    fn key_slot_available(&self) -> bool {
        self.key_free != 0 || (self.key_hw as usize) < self.keys.len()
    }

    fn waiter_available(&self) -> bool {
        self.waiter_free != 0 || (self.waiter_hw as usize) < self.waiters.len()
    }

    /// Records that request `token` waits for `key`. Call when a lookup missed.
    /// [`Begin::Started`]: start resolving `key`; [`Begin::Coalesced`]: it is already being
    /// resolved; [`Begin::Full`]: nothing was recorded, answer the request with ENOMEM.
    pub fn begin(&mut self, key: K, token: Token) -> Begin {
        if !self.waiter_available() {
            return Begin::Full;
        }
        let (ki, outcome) = match self.find(&key) {
            Some(i) => (i, Begin::Coalesced),
            None => {
                if !self.key_slot_available() {
                    return Begin::Full;
                }
                let i = if self.key_free != 0 {
                    let i = (self.key_free - 1) as usize;
                    self.key_free = self.keys[i].next;
                    i
                } else {
                    self.key_hw += 1;
                    (self.key_hw - 1) as usize
                };
                let b = self.bucket(&key);
                let head = self.keys[b].head;
                let s = &mut self.keys[i];
                s.key = Some(key);
                s.next = head;
                s.first = 0;
                s.last = 0;
                s.count = 0;
                self.keys[b].head = i as u32 + 1;
                self.keys_used += 1;
                (i, Begin::Started)
            }
        };
        let Some(wi) = self.alloc_waiter() else {
            // Unreachable: availability was checked above.
            return Begin::Full;
        };
        self.waiters_used += 1;
        self.waiters[wi] = WaiterSlot { token, next: 0 };
        let link = wi as u32 + 1;
        let s = &mut self.keys[ki];
        let last = s.last;
        s.last = link;
        s.count += 1;
        if last == 0 {
            s.first = link;
        } else {
            self.waiters[(last - 1) as usize].next = link;
        }
        outcome
    }

    /// Unlinks key slot `ki` from its bucket and frees it; returns its first waiter link.
    fn take_key(&mut self, ki: usize) -> u32 {
        let Some(key) = self.keys[ki].key else {
            return 0;
        };
        let b = self.bucket(&key);
        let target = ki as u32 + 1;
        let next = self.keys[ki].next;
        if self.keys[b].head == target {
            self.keys[b].head = next;
        } else {
            let mut link = self.keys[b].head;
            while link != 0 {
                let l = (link - 1) as usize;
                if self.keys[l].next == target {
                    self.keys[l].next = next;
                    break;
                }
                link = self.keys[l].next;
            }
        }
        let first = self.keys[ki].first;
        let s = &mut self.keys[ki];
        s.key = None;
        s.first = 0;
        s.last = 0;
        s.count = 0;
        s.next = self.key_free;
        self.key_free = target;
        self.keys_used -= 1;
        first
    }

    fn drain_list(&mut self, mut link: u32, mut f: impl FnMut(Token)) -> usize {
        let mut n = 0;
        while link != 0 {
            let i = (link - 1) as usize;
            let w = self.waiters[i];
            self.free_waiter(i);
            f(w.token);
            n += 1;
            link = w.next;
        }
        n
    }

    /// The resolution of `key` finished (success or failure): calls `f` once for every waiting
    /// token in arrival order, frees the key, and returns how many tokens there were (0 if `key`
    /// was not pending).
    pub fn complete(&mut self, key: &K, f: impl FnMut(Token)) -> usize {
        match self.find(key) {
            Some(ki) => {
                let first = self.take_key(ki);
                self.drain_list(first, f)
            }
            None => 0,
        }
    }

    /// Completes every key of endpoint `ep`, calling `f(key, token)` once per waiting token.
    /// Returns the number of tokens. O(key capacity).
    pub fn cancel_ep(&mut self, ep: u16, mut f: impl FnMut(&K, Token)) -> usize {
        let mut n = 0;
        for ki in 0..self.key_hw as usize {
            if let Some(key) = self.keys[ki].key {
                if key.ep() == ep {
                    let first = self.take_key(ki);
                    n += self.drain_list(first, |t| f(&key, t));
                }
            }
        }
        n
    }

    /// Withdraws one waiting `token` from `key` (e.g. that request timed out on its own). If it
    /// was the last waiter the key is freed too. Returns true if the token was waiting.
    pub fn cancel(&mut self, key: &K, token: Token) -> bool {
        let Some(ki) = self.find(key) else {
            return false;
        };
        let mut prev = 0u32;
        let mut link = self.keys[ki].first;
        while link != 0 {
            let i = (link - 1) as usize;
            let next = self.waiters[i].next;
            if self.waiters[i].token == token {
                if prev == 0 {
                    self.keys[ki].first = next;
                } else {
                    self.waiters[(prev - 1) as usize].next = next;
                }
                if self.keys[ki].last == link {
                    self.keys[ki].last = prev;
                }
                self.keys[ki].count -= 1;
                self.free_waiter(i);
                if self.keys[ki].count == 0 {
                    self.take_key(ki);
                }
                return true;
            }
            prev = link;
            link = next;
        }
        false
    }
}
