//! Path-record and address caches over caller-provided storage.
//!
//! # Shape
//!
//! ```text
//!  AddrKey (ep, NAME|IPv4|IPv6, 64 B) ──alias──┐
//!  AddrKey (ep, other name/IP)  ───────alias───┤   (index, incarnation)
//!                                              ▼
//!  PathKey (ep, LID|GID, Constraints) ──► path entry: 64-byte PathRecord, expiry, status
//! ```
//!
//! * [`PathCache`] holds path entries (keyed by [`PathKey`]) and address entries (keyed by
//!   [`AddrKey`]). An address entry is an alias: it points at a path entry, so many addresses
//!   (a host's name, its IPv4 and IPv6 addresses) share one record: updating the record once
//!   updates what every alias sees. If the path entry is removed or its slot reused, the
//!   aliases become misses.
//! * The reversible bit is not part of a path key as the cache stores it
//!   ([`PathKey::cache_words`]): one entry answers a request with and without the bit, and a
//!   request that needs a reversible path misses on a record without it (PathRecord byte 49,
//!   bit 7). A preloaded route is two entries, by DLID and by DGID.
//! * Storage is handed in: `PathCache<P, A>` is generic over `P: Deref<Target = [PathSlot]>` and
//!   `A: Deref<Target = [AddrSlot]>`, so a host passes boxes (see `PathSlot::boxed`/`boxed_for`
//!   with the `std` feature) and firmware passes `&'static` slices of `static` arrays
//!   (`Slot::new` is `const` and all-zero, so they go to `.bss`). Nothing allocates after
//!   construction.
//! * **One writer, many readers.** Lookups take `&self`, never block, never allocate, never do a
//!   locked read-modify-write on a hit, and never see a torn record (a per-slot seqlock over
//!   `AtomicU32` words; no `unsafe`, 32-bit atomics only, so it runs on `thumbv7em` and
//!   `riscv32imac`). Mutation goes through the single [`CacheWriter`], a type: taken once with
//!   [`CacheWriter::take`] over a handle to the cache (`Arc`, `&'static`, a borrow: any
//!   [`CacheRef`]) or [`PathCache::writer`] (a borrow), an `Err` while another exists, then
//!   owned by whoever writes (the resolver, for its whole life). A lookup that keeps colliding
//!   with the writer gives up with [`Lookup::Busy`] after a bounded number of retries.
//! * **Time** is a caller-supplied `u64` tick count (the host uses milliseconds of a monotonic
//!   clock). Entries carry an absolute expiry; negative entries carry a status and their own
//!   lifetime. A hit within [`CacheConfig::refresh_ahead`] ticks of expiry reports
//!   `needs_refresh: true`, to one reader per version of the entry.
//! * **Invalidation** by key ([`CacheWriter::remove`]), by address ([`CacheWriter::remove_addr`])
//!   and by endpoint in O(1) ([`CacheWriter::invalidate_ep`]: bumps the endpoint's generation, so
//!   everything learned through it becomes a miss and is reclaimed first).
//! * **Placement** (see the `map` module source for the full layout): open addressing over
//!   128-byte slots that hold the entry itself. A key hashes to two groups of [`GROUP`] (32)
//!   slots and a preferred slot in each; it lives in one of those 64 slots and never moves.
//!   A lookup reads both preferred slots first (about 3 keys in 4 are in one of them), then the
//!   slots whose tag byte (a side array, 1 byte per slot) matches: at most [`MAX_PROBE`] slots,
//!   whatever the keys.
//! * **Eviction**: when both of a new key's groups are full, bounded CLOCK over those 64 slots:
//!   the first dead one (expired, negative, stale endpoint generation) is taken, else the first
//!   whose reference bit (side array; hits set it with a plain store) was clear, else the first
//!   examined. Capacity never grows. Size storage with [`Slot::slots_for`] (87% load) and a full
//!   window practically never happens before the map is full.
//! * **Counters** are single-writer plain stores: the writer's own, one cell per
//!   [`CacheReader`], and one shared cell for [`PathCache::lookup`]; [`PathCache::stats`] sums
//!   them.
//!
//! # Memory
//!
//! | storage | bytes |
//! |---|---|
//! | [`PathSlot`]: seq + header, incarnation, generation, expiry + 40 B key (first line), 64 B record (second line) | 128 |
//! | [`AddrSlot`]: seq + meta + 68 B key + 8 B target, padded | 128 |
//! | side arrays, per slot: tag byte, refresh-claim byte, CLOCK bit (carved from the tail of the storage) | ~2.1 |
//!
//! 1,000,000 path entries at the design load: [`Slot::slots_for`]`(1_000_000)` is about 1.17
//! million slots, 150 MB (measured RSS: ~150 B per cached path).
//!
//! # Example
//!
//! ```
//! use acm_core_nostd::cache::{
//!     ep_number, AddrKey, AddrSlot, CacheConfig, Dest, Lookup, PathCache, PathKey, PathSlot,
//! };
//! static PATHS: [PathSlot; 64] = [const { PathSlot::new() }; 64];
//! static ADDRS: [AddrSlot; 64] = [const { AddrSlot::new() }; 64];
//! let cache = PathCache::new(&PATHS[..], &ADDRS[..], CacheConfig::default()).unwrap();
//! let ep = ep_number(0, 0); // endpoint slot 0 at flush generation 0
//! let key = PathKey::new(ep, Dest::Lid(7));
//! let mut w = cache.writer().expect("one writer"); // a second one: Err(WriterTaken)
//! w.insert(&key, &[0xab; 64], 1_000, 60_000);
//! w.alias(&AddrKey::name(ep, "node7").unwrap(), &key, 1_000, 60_000).unwrap();
//! assert!(matches!(cache.lookup(&key, 2_000), Lookup::Hit { .. }));
//! match cache.lookup_addr(&AddrKey::name(ep, "node7").unwrap(), 2_000) {
//!     Lookup::Hit { record, .. } => assert_eq!(record, [0xab; 64]),
//!     other => panic!("{other:?}"),
//! }
//! assert_eq!(cache.lookup(&key, 61_000), Lookup::Miss); // expired
//! ```

pub mod hash;
pub(crate) mod key;
mod map;

use core::marker::PhantomData;
use core::ops::Deref;

use crate::sync::{AtomicBool, AtomicU32, Ordering};

pub use key::{
    constraint, ep_number, AddrKey, AddrKind, CacheEp, Constraints, Dest, PackedPathKey, PathDest,
    PathKey, ADDR_KEY_WORDS, DEST_WORDS, EP_BITS, EP_GEN_BITS, EP_MAX, EP_SLOT_BITS, MAX_ADDRESS,
    PATH_KEY_WORDS, REVERSIBLE,
};
pub use map::{Slot, DESIGN_LOAD_PERCENT, EVICT_SCAN, GROUP, MAX_CHAIN, MAX_PROBE, MAX_RETRIES};

#[cfg(loom)]
#[doc(hidden)]
pub use map::loom_model;
use map::{expiry, set_expiry, Map, Probe, Upsert, EXP_HI, GEN, HDR, INC, KEY, OCCUPIED};

/// Size of a path record in bytes.
pub use crate::wire::path_record::PATH_RECORD_LEN as RECORD_LEN;
const RECORD_WORDS: usize = RECORD_LEN / 4;
/// Words per path slot: sequence counter + 5 meta + key + record (32 words = 128 bytes).
pub const PATH_WORDS: usize = KEY + PATH_KEY_WORDS + RECORD_WORDS;
/// Words per address slot: sequence counter + 5 meta + key + target (index, incarnation).
pub const ADDR_WORDS: usize = KEY + ADDR_KEY_WORDS + 2;
const PATH_REC: usize = KEY + PATH_KEY_WORDS;
const ADDR_TGT: usize = KEY + ADDR_KEY_WORDS;

/// Storage for one path entry.
pub type PathSlot = Slot<PATH_WORDS>;
/// Storage for one address entry.
pub type AddrSlot = Slot<ADDR_WORDS>;

/// Endpoint generations are kept in a fixed array indexed by the slot id of a cache endpoint
/// number ([`CacheEp::slot`]); endpoints that share an index are invalidated together
/// (harmless: extra misses).
pub const EP_GENERATIONS: usize = 1 << EP_SLOT_BITS;

#[cfg(feature = "std")]
impl<const W: usize> Slot<W> {
    /// `n` empty slots on the heap (host convenience; needs the `std` feature).
    pub fn boxed(n: usize) -> std::boxed::Box<[Self]> {
        (0..n).map(|_| Self::new()).collect()
    }

    /// Storage for a cache that should hold `entries` entries without evicting: `boxed` of
    /// [`Slot::slots_for`]`(entries)` (host convenience; needs the `std` feature).
    pub fn boxed_for(entries: usize) -> std::boxed::Box<[Self]> {
        Self::boxed(Self::slots_for(entries))
    }
}

/// Run-time settings of a [`PathCache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Hash seed; pick it at random on hosts so remote parties cannot aim at one bucket.
    pub seed: u64,
    /// A hit this many ticks (or fewer) before its expiry carries `needs_refresh: true`.
    pub refresh_ahead: u64,
}

impl Default for CacheConfig {
    /// Seed `0x5eed`, refresh 5000 ticks (5 s at millisecond ticks) ahead.
    fn default() -> Self {
        CacheConfig {
            seed: 0x5eed,
            refresh_ahead: 5_000,
        }
    }
}

/// What a lookup found. `R` is the record a hit carries: the 64 bytes themselves, or `()`
/// from [`PathCache::lookup_into`], which wrote them where the caller asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup<R = [u8; RECORD_LEN]> {
    /// A valid path record.
    Hit {
        /// The 64-byte SA PathRecord as stored (parse it with `wire::path_record`).
        record: R,
        /// When the entry expires (ticks).
        expires_at: u64,
        /// The entry is within `refresh_ahead` of expiry and this caller is the one asked to
        /// start a refresh (one caller per version of the entry).
        needs_refresh: bool,
    },
    /// A negative entry: resolution recently failed with `status`; do not retry before `until`.
    Negative {
        /// The failure status the writer recorded (e.g. an `ACM_STATUS_*` value), never 0.
        status: u8,
        /// When the negative entry expires (ticks).
        until: u64,
    },
    /// Nothing usable cached (absent, expired, or invalidated).
    Miss,
    /// The writer was rewriting the entry on every attempt; treat as a miss for now.
    Busy,
}

impl Lookup<()> {
    /// This result with `record` as a hit's record (anything else is kept as it is).
    #[inline(always)]
    pub fn with_record(self, record: [u8; RECORD_LEN]) -> Lookup {
        match self {
            Lookup::Hit {
                expires_at,
                needs_refresh,
                ..
            } => Lookup::Hit {
                record,
                expires_at,
                needs_refresh,
            },
            Lookup::Negative { status, until } => Lookup::Negative { status, until },
            Lookup::Miss => Lookup::Miss,
            Lookup::Busy => Lookup::Busy,
        }
    }
}

/// Errors from cache construction and writer operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheError {
    /// The storage slice is empty or has more than `u32::MAX - 1` slots.
    Capacity,
    /// [`CacheWriter::alias`] named a path key that is not cached.
    NoSuchPath,
    /// A negative entry needs a non-zero status.
    ZeroStatus,
    /// The cache has a writer already ([`CacheWriter::take`], [`PathCache::writer`]).
    WriterTaken,
}

impl core::fmt::Display for CacheError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            CacheError::Capacity => "cache storage is empty or larger than u32::MAX - 1 slots",
            CacheError::NoSuchPath => "alias target path is not cached",
            CacheError::ZeroStatus => "negative cache entries need a non-zero status",
            CacheError::WriterTaken => "the cache has a writer already",
        })
    }
}

#[cfg(feature = "std")]
impl std::error::Error for CacheError {}

/// What an insert did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inserted {
    /// A new entry took a free slot.
    New,
    /// The key was present; its entry was overwritten in place (aliases see the new record).
    Updated,
    /// The map was full; another entry was evicted to make room.
    Evicted,
}

#[cfg(target_has_atomic = "64")]
type Counter = crate::sync::AtomicU64;
#[cfg(not(target_has_atomic = "64"))]
type Counter = crate::sync::AtomicU32;

/// Counter cells a [`CacheReader`] can own (one per reader thread); [`PathCache::lookup`]
/// counts into one more, shared cell.
pub const READER_CELLS: usize = 8;

/// Counters of one reader (or of the shared lookup path), on their own cache lines.
#[repr(align(128))]
struct ReadCounters {
    hits: Counter,
    negative_hits: Counter,
    misses: Counter,
    busy: Counter,
    refresh_hints: Counter,
}

impl ReadCounters {
    fn new() -> Self {
        ReadCounters {
            hits: Counter::new(0),
            negative_hits: Counter::new(0),
            misses: Counter::new(0),
            busy: Counter::new(0),
            refresh_hints: Counter::new(0),
        }
    }
}

/// Writer-side counters (only the writer changes them).
#[repr(align(128))]
struct WriteCounters {
    inserts: Counter,
    updates: Counter,
    evictions: Counter,
    expired: Counter,
    removed: Counter,
}

struct Counters {
    shared: ReadCounters,
    readers: [ReadCounters; READER_CELLS],
    /// Bit `i` set: reader cell `i` is owned by a live [`CacheReader`].
    taken: AtomicU32,
    write: WriteCounters,
}

impl Counters {
    fn new() -> Self {
        Counters {
            shared: ReadCounters::new(),
            readers: core::array::from_fn(|_| ReadCounters::new()),
            taken: AtomicU32::new(0),
            write: WriteCounters {
                inserts: Counter::new(0),
                updates: Counter::new(0),
                evictions: Counter::new(0),
                expired: Counter::new(0),
                removed: Counter::new(0),
            },
        }
    }
}

/// Adds one with a plain `Relaxed` load + store: no locked read-modify-write. Exact when one
/// thread owns the counter (the writer's counters, a [`CacheReader`]'s cell); the shared cell
/// of [`PathCache::lookup`] can lose increments when several threads count into it at once.
#[inline(always)]
fn bump(c: &Counter) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

#[inline]
fn add(c: &Counter, n: usize) {
    #[allow(clippy::cast_possible_truncation)]
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(n as _),
        Ordering::Relaxed,
    );
}

/// A snapshot of a cache's counters (path and address lookups together). 32-bit targets without
/// 64-bit atomics count modulo 2^32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered with a record.
    pub hits: u64,
    /// Lookups answered from a negative entry.
    pub negative_hits: u64,
    /// Lookups that found nothing usable.
    pub misses: u64,
    /// Lookups that gave up because the writer kept the entry busy.
    pub busy: u64,
    /// Hits that carried `needs_refresh: true`.
    pub refresh_hints: u64,
    /// Inserts of new keys (including ones that evicted).
    pub inserts: u64,
    /// In-place updates of present keys.
    pub updates: u64,
    /// Live entries evicted to make room (dead ones are counted in `expired`).
    pub evictions: u64,
    /// Dead entries (expired, negative past their time, invalidated) reclaimed.
    pub expired: u64,
    /// Entries removed by `remove`/`remove_addr`.
    pub removed: u64,
    /// Path entries currently held.
    pub path_entries: u64,
    /// Address entries currently held.
    pub addr_entries: u64,
}

/// A path key as a [`PathCache`] stores it (without the reversible bit) and its place under
/// that cache's seed ([`PathCache::hashed`]); valid only for the cache that made it.
#[derive(Clone, Copy, Debug)]
pub struct HashedKey {
    kw: [u32; PATH_KEY_WORDS],
    wants_reversible: bool,
    place: map::Place,
}

/// Where a destination's paths live in a [`PathCache`] ([`PathCache::place`]); valid only for
/// the cache that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place(map::Place);

/// The path-record and address cache. See the [module docs](self).
pub struct PathCache<P, A>
where
    P: Deref<Target = [PathSlot]>,
    A: Deref<Target = [AddrSlot]>,
{
    paths: Map<P, PATH_WORDS, PATH_KEY_WORDS>,
    addrs: Map<A, ADDR_WORDS, ADDR_KEY_WORDS>,
    ep_gens: [AtomicU32; EP_GENERATIONS],
    config: CacheConfig,
    writer_taken: AtomicBool,
    counters: Counters,
    path_sweep: AtomicU32,
    addr_sweep: AtomicU32,
}

/// A handle to a [`PathCache`] that a [`CacheWriter`] can own: `&PathCache` (what
/// [`PathCache::writer`] uses), `&'static PathCache` (firmware), `Arc<PathCache>` (a host
/// thread that owns its writer), `Box<PathCache>`: anything that dereferences to one.
pub trait CacheRef {
    /// The cache's path storage.
    type Paths: Deref<Target = [PathSlot]>;
    /// The cache's address storage.
    type Addrs: Deref<Target = [AddrSlot]>;
    /// The cache behind the handle.
    fn cache(&self) -> &PathCache<Self::Paths, Self::Addrs>;
}

impl<C, P, A> CacheRef for C
where
    C: Deref<Target = PathCache<P, A>>,
    P: Deref<Target = [PathSlot]>,
    A: Deref<Target = [AddrSlot]>,
{
    type Paths = P;
    type Addrs = A;
    #[inline(always)]
    fn cache(&self) -> &PathCache<P, A> {
        self
    }
}

/// The cache's single writer, over a handle `C` to the cache ([`CacheRef`]); see
/// [`CacheWriter::take`] and [`PathCache::writer`]. There is at most one at a time per cache:
/// whoever holds it is the writer, by type (the resolver owns one for its whole life). Dropping
/// it frees the writer role.
pub struct CacheWriter<C: CacheRef> {
    cache: C,
}

#[inline]
fn ep_index(ep: CacheEp) -> usize {
    usize::from(ep.slot())
}

#[inline]
fn ep_of(w: &[u32]) -> CacheEp {
    key::ep_of_word(w[KEY])
}

impl<P, A> PathCache<P, A>
where
    P: Deref<Target = [PathSlot]>,
    A: Deref<Target = [AddrSlot]>,
{
    /// A cache over `paths` and `addrs` (both reset to empty; `addrs` may be empty if addresses
    /// are not cached). Fails with [`CacheError::Capacity`] if `paths` provides no entry slot
    /// (fewer than 2 slots) or either is larger than `u32::MAX - 1` slots.
    pub fn new(paths: P, addrs: A, config: CacheConfig) -> Result<Self, CacheError> {
        // A path is placed by its endpoint and destination alone (`PathDest`), so that its
        // slots can be loaded before the rest of its key is known.
        let paths = Map::new(paths, config.seed, DEST_WORDS).ok_or(CacheError::Capacity)?;
        if paths.capacity() == 0 {
            return Err(CacheError::Capacity);
        }
        let addrs = Map::new(addrs, config.seed ^ 0x000a_dd7e_55e5, ADDR_KEY_WORDS)
            .ok_or(CacheError::Capacity)?;
        Ok(PathCache {
            paths,
            addrs,
            ep_gens: core::array::from_fn(|_| AtomicU32::new(0)),
            config,
            writer_taken: AtomicBool::new(false),
            counters: Counters::new(),
            path_sweep: AtomicU32::new(0),
            addr_sweep: AtomicU32::new(0),
        })
    }

    /// The writer role, borrowing the cache; [`CacheError::WriterTaken`] while another
    /// [`CacheWriter`] exists (a resolver holds one for its whole life). To own the writer
    /// with the cache behind an `Arc` or a `&'static`, use [`CacheWriter::take`].
    pub fn writer(&self) -> Result<CacheWriter<&Self>, CacheError> {
        CacheWriter::take(self)
    }

    /// Number of path entry slots: the storage handed in minus its side arrays (~1.6%). Inserts
    /// start evicting somewhat before `len() == capacity()` (a key can only use the 32 slots of
    /// its two groups); size storage with [`Slot::slots_for`] for a target entry count.
    pub fn capacity(&self) -> usize {
        self.paths.capacity()
    }

    /// Number of address entry slots (storage minus side arrays).
    pub fn addr_capacity(&self) -> usize {
        self.addrs.capacity()
    }

    /// Path entries currently held (including dead ones not yet reclaimed).
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// True if no path entry is held.
    pub fn is_empty(&self) -> bool {
        self.paths.len() == 0
    }

    /// The configuration the cache was built with.
    pub fn config(&self) -> CacheConfig {
        self.config
    }

    /// A snapshot of the counters: the reader cells (shared and per-[`CacheReader`]) summed.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        #[allow(clippy::unnecessary_cast)]
        let g = |x: &Counter| x.load(Ordering::Relaxed) as u64;
        let r = |f: fn(&ReadCounters) -> &Counter| {
            c.readers
                .iter()
                .fold(g(f(&c.shared)), |a, x| a.wrapping_add(g(f(x))))
        };
        CacheStats {
            hits: r(|x| &x.hits),
            negative_hits: r(|x| &x.negative_hits),
            misses: r(|x| &x.misses),
            busy: r(|x| &x.busy),
            refresh_hints: r(|x| &x.refresh_hints),
            inserts: g(&c.write.inserts),
            updates: g(&c.write.updates),
            evictions: g(&c.write.evictions),
            expired: g(&c.write.expired),
            removed: g(&c.write.removed),
            path_entries: self.paths.len() as u64,
            addr_entries: self.addrs.len() as u64,
        }
    }

    /// The entries the writer has written so far, paths and addresses, new or replaced (low
    /// 32 bits, wrapping): a lookup that missed stays a miss while this reads the same, as
    /// only a write makes a hit. Read after a lookup, it may already count a write the lookup
    /// did not see (then the reader's miss is believed one write late: one redundant query);
    /// read by the writer, it is exact.
    #[inline]
    pub fn writes(&self) -> u32 {
        let c = &self.counters.write;
        // A counter's low bits (a 64-bit one where the target has its atomics).
        #[allow(clippy::cast_possible_truncation, clippy::unnecessary_cast)]
        let low = |x: &Counter| x.load(Ordering::Relaxed) as u32;
        low(&c.inserts).wrapping_add(low(&c.updates))
    }

    #[inline]
    fn gen(&self, ep: CacheEp) -> u32 {
        self.ep_gens[ep_index(ep)].load(Ordering::Acquire)
    }

    /// Looks up a path by key at time `now`. Never blocks, never allocates, no locked
    /// read-modify-write on a hit; safe from any number of threads. Counts into the shared
    /// reader cell (plain stores: exact for one reader thread; with several, use one
    /// [`CacheReader`] per thread for exact counts and no shared counter line).
    #[inline]
    pub fn lookup(&self, key: &PathKey, now: u64) -> Lookup {
        self.lookup_hashed(&self.hashed(&key.packed()), now)
    }

    /// `key` in the form this cache's path map stores it, with its place (the hash of its
    /// destination under this cache's seed): what [`lookup_hashed`](Self::lookup_hashed)
    /// takes.
    #[inline]
    pub fn hashed(&self, key: &PackedPathKey) -> HashedKey {
        self.hashed_at(key, self.place(&key.dest()))
    }

    /// [`hashed`](Self::hashed) for a key whose destination was [`place`](Self::place)d
    /// already (for its prefetch): `place` must be `self.place(&key.dest())`.
    #[inline]
    pub fn hashed_at(&self, key: &PackedPathKey, place: Place) -> HashedKey {
        debug_assert_eq!(place, self.place(&key.dest()));
        let (kw, wants_reversible) = key.cache_words();
        HashedKey {
            kw,
            wants_reversible,
            place: place.0,
        }
    }

    /// Where the paths to `dest` live: the groups, preferred slots and tag the hash of the
    /// endpoint and destination words under this cache's seed gives (a path is placed by them
    /// alone), derived once for
    /// [`prefetch_hint`](Self::prefetch_hint) and [`hashed_at`](Self::hashed_at).
    #[inline]
    pub fn place(&self, dest: &PathDest) -> Place {
        let mut kw = [0u32; PATH_KEY_WORDS];
        for (k, d) in kw.iter_mut().zip(dest.0) {
            *k = d;
        }
        Place(self.paths.place(self.paths.hash(&kw)))
    }

    /// [`lookup`](Self::lookup) of a key [`hashed`](Self::hashed) by this cache.
    #[inline]
    pub fn lookup_hashed(&self, key: &HashedKey, now: u64) -> Lookup {
        let mut record = [0; RECORD_LEN];
        self.lookup_into(key, now, &mut record).with_record(record)
    }

    /// [`lookup_hashed`](Self::lookup_hashed) that writes a hit's record into `record` (an
    /// answer's path, say) straight from the slot, rather than returning it: no intermediate
    /// copy on the hit path. On anything but a hit, `record` may hold any bytes.
    #[inline]
    pub fn lookup_into(
        &self,
        key: &HashedKey,
        now: u64,
        record: &mut [u8; RECORD_LEN],
    ) -> Lookup<()> {
        let r = self.lookup_impl::<true>(key, now, record);
        count(&self.counters.shared, &r);
        r
    }

    /// The memory a lookup of a key [`place`](Self::place)d at `place` may read, for prefetch
    /// instructions of the caller's: both lines of its first preferred slot (read first, and
    /// alone when the key is there), both lines of its second preferred slot, and the tag
    /// lines of its two groups (read only if not). A path is placed by its endpoint and
    /// destination alone, so this is known from a request's destination before its key is
    /// derived: prefetching these at the top of a request lets the DRAM miss overlap the
    /// request's other work. Only addresses (never dereferenced here); null for an empty
    /// cache.
    #[inline]
    pub fn prefetch_hint(&self, place: Place) -> [*const u8; 6] {
        self.paths.home_addrs(&place.0)
    }

    /// The slots a lookup of a key [`place`](Self::place)d at `place` reads when neither
    /// preferred slot holds it: both lines of the first other slot of each of its two groups
    /// whose tag matches (the first preferred slot's lines where a group has none), for the
    /// caller's prefetch. Unlike [`prefetch_hint`](Self::prefetch_hint) this **loads** (the
    /// groups' tag lines): call it right after prefetching that hint. The tags arrive with
    /// the preferred slots, and prefetching these then overlaps the load of a key that lives
    /// outside its preferred slots (about 1 in 4 at the design load) with theirs, rather than
    /// starting it once they proved not to hold it. Null for an empty cache.
    #[inline]
    pub fn prefetch_tagged(&self, place: Place) -> [*const u8; 4] {
        self.paths.tagged_addrs(&place.0)
    }

    /// A reader handle with its own counter cell (for one thread; it is `Send`, not `Sync`), or
    /// `None` if all [`READER_CELLS`] are owned. Dropping it frees the cell; its counts stay in
    /// [`stats`](Self::stats).
    pub fn reader(&self) -> Option<CacheReader<'_, P, A>> {
        let mut cur = self.counters.taken.load(Ordering::Relaxed);
        loop {
            let free = (!cur).trailing_zeros() as usize;
            if free >= READER_CELLS {
                return None;
            }
            match self.counters.taken.compare_exchange(
                cur,
                cur | (1 << free),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(CacheReader {
                        cache: self,
                        cell: free,
                        _not_sync: PhantomData,
                    })
                }
                Err(now) => cur = now,
            }
        }
    }

    /// **Deliberately broken** lookup that skips the seqlock validation, so it can return torn
    /// records. Exists only so the concurrency test can show that it detects torn reads; never
    /// use it otherwise.
    #[doc(hidden)]
    pub fn torn_lookup_for_tests(&self, key: &PathKey, now: u64) -> Lookup {
        let mut record = [0; RECORD_LEN];
        self.lookup_impl::<false>(&self.hashed(&key.packed()), now, &mut record)
            .with_record(record)
    }

    /// Test hook: (group 1, group 2, tag byte) of `key` in the path map.
    #[doc(hidden)]
    pub fn window_for_tests(&self, key: &PathKey) -> (usize, usize, u8) {
        self.paths.window_of(self.paths.hash(&key.cache_words().0))
    }

    /// Test hook: the address of the path slot that holds `key`, if any.
    #[doc(hidden)]
    pub fn slot_addr_for_tests(&self, key: &PathKey) -> Option<*const u8> {
        let kw = key.cache_words().0;
        self.paths
            .find(&kw, &self.paths.place(self.paths.hash(&kw)))
            .map(|i| self.paths.slot_lines_for_tests(i)[0])
    }

    /// Test hook: how many slots a lookup of `key` examines right now (at most [`MAX_PROBE`]).
    #[doc(hidden)]
    pub fn probe_len_for_tests(&self, key: &PathKey) -> usize {
        let kw = key.cache_words().0;
        let mut w = [0u32; PATH_WORDS];
        let mut n = 0;
        let _ = self.paths.read_counted::<true>(
            &kw,
            self.paths.place(self.paths.hash(&kw)),
            &mut w,
            &mut n,
        );
        n
    }

    #[inline(always)]
    fn lookup_impl<const CHECKED: bool>(
        &self,
        key: &HashedKey,
        now: u64,
        record: &mut [u8; RECORD_LEN],
    ) -> Lookup<()> {
        let mut w = [0u32; PATH_WORDS];
        match self.paths.read::<CHECKED>(&key.kw, key.place, &mut w) {
            // A path without the reversible bit does not answer a request that needs one
            // (PathRecord byte 49 = byte 1 of record word 12).
            Probe::Found(..)
                if key.wants_reversible
                    && w[HDR] & 0xff == 0
                    && (w[PATH_REC + 12] >> 8) as u8 & REVERSIBLE == 0 =>
            {
                Lookup::Miss
            }
            Probe::Found(idx, seq) => self.classify(idx, seq, &w, u64::MAX, now, record),
            Probe::NotFound => Lookup::Miss,
            Probe::Busy => Lookup::Busy,
        }
    }

    /// Follows an address alias to its path entry: slot `target`, if it still holds
    /// incarnation `inc`; the result expires by `cap` (the alias's own expiry) at the latest.
    #[inline(always)]
    fn follow(
        &self,
        target: usize,
        inc: u32,
        cap: u64,
        now: u64,
        record: &mut [u8; RECORD_LEN],
    ) -> Lookup<()> {
        let mut w = [0u32; PATH_WORDS];
        match self.paths.read_at(target, &mut w) {
            Some(Some(seq)) if w[HDR] & OCCUPIED != 0 && w[INC] == inc => {
                self.classify(target, seq, &w, cap, now, record)
            }
            Some(None) => Lookup::Busy,
            _ => Lookup::Miss,
        }
    }

    /// Turns a consistent snapshot of path slot `idx` into a lookup result, a hit's record
    /// written into `record`. `cap` bounds the expiry (an alias's own lifetime).
    #[inline(always)]
    fn classify(
        &self,
        idx: usize,
        seq: u32,
        w: &[u32; PATH_WORDS],
        cap: u64,
        now: u64,
        record: &mut [u8; RECORD_LEN],
    ) -> Lookup<()> {
        if w[GEN] != self.gen(ep_of(w)) {
            return Lookup::Miss;
        }
        let exp = expiry(w).min(cap);
        if now >= exp {
            return Lookup::Miss;
        }
        let status = (w[HDR] & 0xff) as u8;
        if status != 0 {
            return Lookup::Negative { status, until: exp };
        }
        self.paths.touch(idx);
        let needs_refresh = now.saturating_add(self.config.refresh_ahead) >= exp
            && self.paths.claim_refresh(idx, seq);
        for i in 0..RECORD_WORDS {
            record[4 * i..4 * i + 4].copy_from_slice(&w[PATH_REC + i].to_le_bytes());
        }
        Lookup::Hit {
            record: (),
            expires_at: exp,
            needs_refresh,
        }
    }

    /// Looks up an address at time `now`, following its alias to the shared path entry. The
    /// result expires at the earlier of the alias's and the path's expiry.
    pub fn lookup_addr(&self, key: &AddrKey, now: u64) -> Lookup {
        let r = self.lookup_addr_inner(key, now);
        count(&self.counters.shared, &r);
        r
    }

    fn lookup_addr_inner(&self, key: &AddrKey, now: u64) -> Lookup {
        let mut record = [0; RECORD_LEN];
        self.lookup_addr_into(key, now, &mut record)
            .with_record(record)
    }

    fn lookup_addr_into(
        &self,
        key: &AddrKey,
        now: u64,
        record: &mut [u8; RECORD_LEN],
    ) -> Lookup<()> {
        let kw = key.to_words();
        let h = self.addrs.hash(&kw);
        let mut aw = [0u32; ADDR_WORDS];
        match self.addrs.read::<true>(&kw, self.addrs.place(h), &mut aw) {
            Probe::Found(aidx, _) => {
                if aw[GEN] != self.gen(key.ep) {
                    return Lookup::Miss;
                }
                let exp = expiry(&aw);
                if now >= exp {
                    return Lookup::Miss;
                }
                let status = (aw[HDR] & 0xff) as u8;
                if status != 0 {
                    return Lookup::Negative { status, until: exp };
                }
                self.addrs.touch(aidx);
                self.follow(aw[ADDR_TGT] as usize, aw[ADDR_TGT + 1], exp, now, record)
            }
            Probe::NotFound => Lookup::Miss,
            Probe::Busy => Lookup::Busy,
        }
    }

    /// True if the entry words are dead at `now`: expired, negative (they go first when full), or
    /// written under an older endpoint generation.
    fn dead(&self, w: &[u32], now: u64) -> bool {
        w[GEN] != self.gen(ep_of(w)) || expiry(w) <= now || w[HDR] & 0xff != 0
    }
}

#[inline(always)]
fn count<R>(c: &ReadCounters, r: &Lookup<R>) {
    match r {
        Lookup::Hit { needs_refresh, .. } => {
            bump(&c.hits);
            if *needs_refresh {
                bump(&c.refresh_hints);
            }
        }
        Lookup::Negative { .. } => bump(&c.negative_hits),
        Lookup::Miss => bump(&c.misses),
        Lookup::Busy => bump(&c.busy),
    }
}

/// A reader with its own counter cell; see [`PathCache::reader`]. Lookups through it are the
/// same as [`PathCache::lookup`] but count without touching a line other readers write.
pub struct CacheReader<'c, P, A>
where
    P: Deref<Target = [PathSlot]>,
    A: Deref<Target = [AddrSlot]>,
{
    cache: &'c PathCache<P, A>,
    cell: usize,
    /// `Send` but not `Sync`: the cell has exactly one thread counting into it.
    _not_sync: PhantomData<core::cell::Cell<()>>,
}

impl<P, A> CacheReader<'_, P, A>
where
    P: Deref<Target = [PathSlot]>,
    A: Deref<Target = [AddrSlot]>,
{
    /// [`PathCache::lookup`], counted in this reader's cell.
    #[inline]
    pub fn lookup(&self, key: &PathKey, now: u64) -> Lookup {
        let mut record = [0; RECORD_LEN];
        let r = self
            .cache
            .lookup_impl::<true>(&self.cache.hashed(&key.packed()), now, &mut record);
        count(&self.cache.counters.readers[self.cell], &r);
        r.with_record(record)
    }

    /// [`PathCache::lookup_addr`], counted in this reader's cell.
    pub fn lookup_addr(&self, key: &AddrKey, now: u64) -> Lookup {
        let r = self.cache.lookup_addr_inner(key, now);
        count(&self.cache.counters.readers[self.cell], &r);
        r
    }

    /// The cache this reader reads.
    pub fn cache(&self) -> &PathCache<P, A> {
        self.cache
    }
}

impl<P, A> Drop for CacheReader<'_, P, A>
where
    P: Deref<Target = [PathSlot]>,
    A: Deref<Target = [AddrSlot]>,
{
    fn drop(&mut self) {
        let t = &self.cache.counters.taken;
        let mut cur = t.load(Ordering::Relaxed);
        while let Err(now) = t.compare_exchange(
            cur,
            cur & !(1 << self.cell),
            Ordering::Release,
            Ordering::Relaxed,
        ) {
            cur = now;
        }
    }
}

impl<P, A> core::fmt::Debug for CacheReader<'_, P, A>
where
    P: Deref<Target = [PathSlot]>,
    A: Deref<Target = [AddrSlot]>,
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CacheReader")
            .field("cell", &self.cell)
            .finish_non_exhaustive()
    }
}

impl<P, A> core::fmt::Debug for PathCache<P, A>
where
    P: Deref<Target = [PathSlot]>,
    A: Deref<Target = [AddrSlot]>,
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PathCache")
            .field("capacity", &self.capacity())
            .field("addr_capacity", &self.addr_capacity())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<C: CacheRef> Drop for CacheWriter<C> {
    fn drop(&mut self) {
        self.cache
            .cache()
            .writer_taken
            .store(false, Ordering::Release);
    }
}

impl<C: CacheRef> core::fmt::Debug for CacheWriter<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CacheWriter").finish_non_exhaustive()
    }
}

type PathCacheOf<C> = PathCache<<C as CacheRef>::Paths, <C as CacheRef>::Addrs>;

impl<C: CacheRef> CacheWriter<C> {
    /// Takes the writer role of the cache behind `cache`, and keeps the handle for as long as
    /// the writer lives; [`CacheError::WriterTaken`] while another writer exists. Take it once,
    /// when the writing thread is set up, and keep it (or give it to the resolver).
    pub fn take(cache: C) -> Result<Self, CacheError> {
        cache
            .cache()
            .writer_taken
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .map_err(|_| CacheError::WriterTaken)?;
        Ok(CacheWriter { cache })
    }

    /// The cache this writer writes (for lookups: every reader's lookups work on it as well).
    #[inline(always)]
    pub fn cache(&self) -> &PathCacheOf<C> {
        self.cache.cache()
    }

    fn path_words(
        &self,
        kw: &[u32; PATH_KEY_WORDS],
        ep: CacheEp,
        status: u8,
        now: u64,
        ttl: u64,
    ) -> [u32; PATH_WORDS] {
        let mut w = [0u32; PATH_WORDS];
        w[HDR] = OCCUPIED | status as u32;
        w[GEN] = self.cache().gen(ep);
        set_expiry(&mut w, now.saturating_add(ttl));
        w[KEY..KEY + PATH_KEY_WORDS].copy_from_slice(kw);
        w
    }

    fn upsert_path(&mut self, key: &PathKey, mut w: [u32; PATH_WORDS], now: u64) -> Inserted {
        let c = self.cache();
        let kw = key.cache_words().0;
        let h = c.paths.hash(&kw);
        let dead = |x: &[u32; PATH_WORDS]| c.dead(x, now);
        // `paths` is never empty (checked in `new`), so upsert always finds a slot.
        match c.paths.upsert(&kw, h, &mut w, &dead).map(|(_, u)| u) {
            Some(Upsert::Updated) => {
                bump(&c.counters.write.updates);
                Inserted::Updated
            }
            Some(Upsert::Evicted { dead }) => {
                bump(&c.counters.write.inserts);
                bump(if dead {
                    &c.counters.write.expired
                } else {
                    &c.counters.write.evictions
                });
                Inserted::Evicted
            }
            Some(Upsert::New) | None => {
                bump(&c.counters.write.inserts);
                Inserted::New
            }
        }
    }

    /// Caches `record` for `key` until `now + ttl`, replacing any entry (positive or negative)
    /// for the key in place — every alias of the key sees the new record. Evicts when full.
    pub fn insert(
        &mut self,
        key: &PathKey,
        record: &[u8; RECORD_LEN],
        now: u64,
        ttl: u64,
    ) -> Inserted {
        let mut w = self.path_words(&key.cache_words().0, key.ep, 0, now, ttl);
        let mut i = 0;
        while i < RECORD_WORDS {
            let b = 4 * i;
            w[PATH_REC + i] =
                u32::from_le_bytes([record[b], record[b + 1], record[b + 2], record[b + 3]]);
            i += 1;
        }
        self.upsert_path(key, w, now)
    }

    /// Records that resolving `key` failed with `status` (non-zero); lookups answer
    /// [`Lookup::Negative`] until `now + ttl`.
    pub fn insert_negative(
        &mut self,
        key: &PathKey,
        status: u8,
        now: u64,
        ttl: u64,
    ) -> Result<Inserted, CacheError> {
        if status == 0 {
            return Err(CacheError::ZeroStatus);
        }
        let w = self.path_words(&key.cache_words().0, key.ep, status, now, ttl);
        Ok(self.upsert_path(key, w, now))
    }

    /// Points address `addr` at the cached path entry of `path` until `now + ttl` (the answer
    /// also never outlives the path entry). Fails with [`CacheError::NoSuchPath`] if `path` is
    /// not cached, [`CacheError::Capacity`] if there is no address storage.
    pub fn alias(
        &mut self,
        addr: &AddrKey,
        path: &PathKey,
        now: u64,
        ttl: u64,
    ) -> Result<Inserted, CacheError> {
        let c = self.cache();
        let pkw = path.cache_words().0;
        let idx = c
            .paths
            .find(&pkw, &c.paths.place(c.paths.hash(&pkw)))
            .ok_or(CacheError::NoSuchPath)?;
        let inc = c.paths.load(idx)[INC];
        self.upsert_addr(addr, 0, idx as u32, inc, now, ttl)
    }

    /// Records that resolving address `addr` failed with `status` (non-zero) until `now + ttl`.
    pub fn insert_addr_negative(
        &mut self,
        addr: &AddrKey,
        status: u8,
        now: u64,
        ttl: u64,
    ) -> Result<Inserted, CacheError> {
        if status == 0 {
            return Err(CacheError::ZeroStatus);
        }
        self.upsert_addr(addr, status, u32::MAX, 0, now, ttl)
    }

    fn upsert_addr(
        &mut self,
        addr: &AddrKey,
        status: u8,
        target: u32,
        inc: u32,
        now: u64,
        ttl: u64,
    ) -> Result<Inserted, CacheError> {
        let c = self.cache();
        let kw = addr.to_words();
        let mut w = [0u32; ADDR_WORDS];
        w[HDR] = OCCUPIED | status as u32;
        w[GEN] = c.gen(addr.ep);
        set_expiry(&mut w, now.saturating_add(ttl));
        w[KEY..KEY + ADDR_KEY_WORDS].copy_from_slice(&kw);
        w[ADDR_TGT] = target;
        w[ADDR_TGT + 1] = inc;
        let h = c.addrs.hash(&kw);
        let dead = |x: &[u32; ADDR_WORDS]| c.dead(x, now);
        match c.addrs.upsert(&kw, h, &mut w, &dead).map(|(_, u)| u) {
            None => Err(CacheError::Capacity),
            Some(Upsert::Updated) => {
                bump(&c.counters.write.updates);
                Ok(Inserted::Updated)
            }
            Some(Upsert::Evicted { dead }) => {
                bump(&c.counters.write.inserts);
                bump(if dead {
                    &c.counters.write.expired
                } else {
                    &c.counters.write.evictions
                });
                Ok(Inserted::Evicted)
            }
            Some(Upsert::New) => {
                bump(&c.counters.write.inserts);
                Ok(Inserted::New)
            }
        }
    }

    /// Removes the path entry for `key` (with or without the reversible bit: the same entry);
    /// its address aliases become misses. True if it was present.
    pub fn remove(&mut self, key: &PathKey) -> bool {
        let removed = self.cache().paths.remove_key(&key.cache_words().0);
        if removed {
            bump(&self.cache().counters.write.removed);
        }
        removed
    }

    /// Removes the address entry for `addr` (the path entry stays). True if it was present.
    pub fn remove_addr(&mut self, addr: &AddrKey) -> bool {
        let removed = self.cache().addrs.remove_key(&addr.to_words());
        if removed {
            bump(&self.cache().counters.write.removed);
        }
        removed
    }

    /// Invalidates everything learned through endpoint `ep` in O(1): its generation is bumped,
    /// so its path and address entries become misses at once and are the first to be reclaimed.
    /// Call on port/LID/P_Key changes and when the endpoint closes. Endpoints of one slot id
    /// ([`CacheEp::slot`]), whatever their generation, are invalidated together.
    pub fn invalidate_ep(&mut self, ep: CacheEp) {
        let g = &self.cache().ep_gens[ep_index(ep)];
        g.store(g.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
    }

    /// Reclaims dead entries (expired, negative past their time, invalidated) among the next
    /// `budget` slots of each map, continuing where the previous call stopped. Returns how many
    /// were removed. Call it from the writer's timer with a small budget to keep latency flat.
    pub fn purge_expired(&mut self, now: u64, budget: usize) -> usize {
        let c = self.cache();
        // Here negative entries are dead only once past their time.
        let pdead = |w: &[u32; PATH_WORDS]| w[GEN] != c.gen(ep_of(w)) || expiry(w) <= now;
        let adead = |w: &[u32; ADDR_WORDS]| w[GEN] != c.gen(ep_of(w)) || expiry(w) <= now;
        let n = c.paths.sweep(&c.path_sweep, budget, &pdead)
            + c.addrs.sweep(&c.addr_sweep, budget, &adead);
        add(&c.counters.write.expired, n);
        n
    }

    /// Removes every path and address entry whose endpoint is `ep` (O(capacity); prefer
    /// [`invalidate_ep`](Self::invalidate_ep) on hot paths). Returns how many were removed.
    pub fn flush_ep(&mut self, ep: CacheEp) -> usize {
        let c = self.cache();
        let mut n = 0;
        c.paths.for_each_occupied(|i, w| {
            if ep_of(w) == ep {
                c.paths.remove_at(i);
                n += 1;
            }
        });
        c.addrs.for_each_occupied(|i, w| {
            if ep_of(w) == ep {
                c.addrs.remove_at(i);
                n += 1;
            }
        });
        add(&c.counters.write.removed, n);
        n
    }

    /// Fabric-change invalidation (an SA Report that `gids` left or entered service): removes
    /// every path entry whose record's DGID is one of `gids` (their address entries become
    /// misses with them) and, with `negatives`, every negative entry (a destination that was
    /// unknown may be known now). O(capacity); batch the GIDs of a burst of Reports into one
    /// call. Returns how many entries were removed.
    pub fn remove_routes_to(&mut self, gids: &[[u8; 16]], negatives: bool) -> usize {
        let c = self.cache();
        let mut n = 0;
        c.paths.for_each_occupied(|i, w| {
            let negative = w[HDR] & 0xff != 0;
            // DGID: bytes 8..24 of the record, i.e. its words 2..6 (stored as read from the
            // wire, so compare bytes).
            let mut dgid = [0u8; 16];
            for (k, word) in w[PATH_REC + 2..PATH_REC + 6].iter().enumerate() {
                dgid[k * 4..k * 4 + 4].copy_from_slice(&word.to_le_bytes());
            }
            if (negatives && negative) || (!negative && gids.contains(&dgid)) {
                c.paths.remove_at(i);
                n += 1;
            }
        });
        add(&c.counters.write.removed, n);
        n
    }

    /// Removes everything (O(capacity)).
    pub fn clear(&mut self) {
        self.cache().paths.clear();
        self.cache().addrs.clear();
    }
}

// Keep `EXP_HI` referenced for readers of the layout table above.
const _: () = assert!(EXP_HI == KEY - 1);
