//! Provider objects shared between the ibacm main thread, the core's SA thread and the worker.
//!
//! * [`Shared`]: one per provider instance (created at the first `open_device`, torn down after
//!   the last `close_device`): options, the route table, the bounded queues into the worker.
//! * [`PortInfo`], [`Ep`]: copies of what the core told us, plus per-endpoint counters.
//!
//! Ownership rule: only the worker writes the route table; the main thread reads it lock-free.

use crate::core_api::CoreApi;
use crate::ffi::{cntr, AcmEndpoint, AcmMsg, AcmPort};
use acm_core_nostd::cache::{
    constraint, AddrSlot, Constraints, Dest, Lookup, PathCache, PathKey, PathSlot,
};
use acm_core_nostd::text::opts::ProviderOptions;
use acm_core_nostd::wire::path_record::PathRecord;
use acm_dataplane::worker::Waker;
use crossbeam_queue::ArrayQueue;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The path cache (`acm-core-nostd::cache`) over heap storage sized from the options.
pub type Cache = PathCache<Box<[PathSlot]>, Box<[AddrSlot]>>;

/// How many SA queries `resolve()` may have in flight that it sent itself.
pub const INLINE_SLOTS: usize = 4;

/// Cache lifetime meaning "never expires".
pub const NEVER: u64 = u64::MAX;

/// What identifies a route request: the endpoint (and its cache generation) and the
/// normalised client record (see `provider::normalise`). Misses with equal keys coalesce on
/// one SA query.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RouteKey {
    /// Endpoint id (unique per open, never reused).
    pub ep_id: u64,
    /// The endpoint number in the cache: flush generation (high byte) and endpoint slot (low
    /// byte). A CLIENT_REREGISTER bumps the generation on the main thread, so from that moment
    /// no request sees routes learned before it, without waiting for the worker.
    pub cache_ep: u16,
    /// The normalised request record.
    pub record: [u8; 64],
}

impl RouteKey {
    /// A key for endpoint `ep` (at the current flush generation) and a normalised record.
    pub fn new(ep: &Ep, record: &[u8; 64]) -> Self {
        RouteKey {
            ep_id: ep.id,
            cache_ep: ep.cache_ep(),
            record: *record,
        }
    }

    /// The cache key: destination (DLID, else DGID) plus every constraint the client set.
    /// `None` when the request sets something the cache key cannot hold (both DLID and DGID, a
    /// foreign SLID/SGID, flow label, hop limit, preference): such requests always go to the SA.
    pub fn cache_key(&self) -> Option<PathKey> {
        let p = PathRecord::new_unchecked(&self.record[..]);
        let dest = match (p.dlid(), p.dgid()) {
            (0, g) if g.is_zero() => return None,
            (0, g) => Dest::Gid(g.0),
            (l, g) if g.is_zero() => Dest::Lid(l),
            _ => return None,
        };
        if p.slid() != 0
            || !p.sgid().is_zero()
            || p.flowlabel_hoplimit() != 0
            || p.preference() != 0
        {
            return None;
        }
        let mut c = Constraints::ANY;
        c.service_id = p.service_id();
        c.pkey = p.pkey();
        c.qos_class = p.qos_class();
        c.sl = p.sl();
        c.tclass = p.tclass();
        c.mtu = p.mtu_byte();
        c.rate = p.rate_byte();
        c.packet_life = p.packet_life_byte();
        c.reversible_numpath = p.reversible_numpath();
        for (set, bit) in [
            (c.service_id != 0, constraint::SERVICE_ID),
            (c.pkey != 0, constraint::PKEY),
            (c.qos_class != 0, constraint::QOS_CLASS),
            (c.tclass != 0, constraint::TCLASS),
            (c.sl != 0, constraint::SL),
            (c.mtu != 0, constraint::MTU),
            (c.rate != 0, constraint::RATE),
            (c.packet_life != 0, constraint::PACKET_LIFE),
            (c.reversible_numpath != 0, constraint::REVERSIBLE_NUMPATH),
        ] {
            if set {
                c.mask |= bit;
            }
        }
        Some(PathKey {
            ep: self.cache_ep,
            dest,
            constraints: c,
        })
    }
}

/// What kind of client call a queued request came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `resolve()`: answer with `acm_resolve_response`.
    Resolve,
    /// `query()` (ACM_FLAGS_QUERY_SA): answer with `acm_query_response`, never cached.
    Query,
    /// A NODELAY miss already answered ENODATA: resolve only to prime the cache.
    Prime,
    /// A hit near expiry (already answered from the cache): re-query the SA and update the
    /// entry in place. Never answered.
    Refresh,
}

/// What the cache holds for a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cached {
    /// A path; `true` = this caller should start a refresh (the entry is near expiry and no
    /// other reader was asked for this version).
    Path([u8; 64], bool),
    /// A recent negative answer with this status.
    Negative(u8),
}

/// A request handed from `resolve()`/`query()` to the worker (a full copy: the core's buffer
/// dies when the call returns).
pub struct Request {
    /// Endpoint it arrived on.
    pub ep: Arc<Ep>,
    /// Core client index (0 = kernel).
    pub id: u64,
    /// Copy of the client message.
    pub msg: AcmMsg,
    /// Call kind.
    pub kind: Kind,
    /// Cache key (unused for [`Kind::Query`]).
    pub key: RouteKey,
    /// The PathRecord to send to the SA.
    pub sa_record: [u8; 64],
    /// Index into [`Shared::hosts`] of an expired address mapping this request used: the
    /// worker re-resolves (renews) it before the route lookup.
    pub host: Option<u32>,
    /// Set when `resolve()` already sent the SA query itself (`acmrs_sa_inline`): the worker
    /// only tracks it, on one of the reserved in-flight slots from [`Shared::INLINE_SLOT`].
    pub sent: Option<Sent>,
}

/// An SA query `resolve()` sent on the core's thread.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    /// Its in-flight slot (`INLINE_SLOT..INLINE_SLOT + INLINE_SLOTS`).
    pub fi: u32,
    /// Its context token (low 16 bits = `fi`).
    pub token: u64,
    /// Low 32 bits of its TID.
    pub tid: u32,
    /// When it was sent.
    pub at: std::time::Instant,
}

/// An SA completion copied out of the core's MAD on the SA thread.
pub struct SaReply {
    /// The context token given to `acm_alloc_sa_mad`.
    pub token: u64,
    /// `ib_user_mad.status` (nonzero = timeout / send failure).
    pub umad_status: u32,
    /// The 256-byte MAD.
    pub mad: [u8; 256],
}

/// The client a query in flight was started for, armed so the core's SA thread can answer it
/// straight from a successful SA reply (one thread hand-off less than answering from the
/// worker). The worker writes it before sending the MAD and reads it at completion; the SA
/// thread only claims it. Exactly-once: `claimed` is set under the lock by whoever answers
/// the starter first (the SA thread, which then answers), and the worker answers the starter
/// only if it finds the slot unclaimed (it disarms it under the same lock). Never touched by the
/// core's main thread.
#[derive(Default)]
pub struct DirectSlot {
    /// The send token of the query this slot is armed for (0 = disarmed).
    pub token: u64,
    /// Low 32 bits of that query's TID.
    pub tid: u32,
    /// The starter's answer data while armed.
    pub req: Option<DirectReq>,
    /// The SA thread answered the starter of this in-flight query.
    pub claimed: bool,
}

/// What the SA thread needs to answer a starter request.
pub struct DirectReq {
    /// Endpoint it arrived on (counters, `closed`).
    pub ep: Arc<Ep>,
    /// Core client index.
    pub id: u64,
    /// Copy of the client message.
    pub msg: AcmMsg,
    /// [`Kind::Resolve`] or [`Kind::Query`].
    pub kind: Kind,
}

/// A preloaded route: (normalised request record it answers, the path).
pub type PreloadedRoute = ([u8; 64], [u8; 64]);

/// Rare control messages from the main thread.
pub enum Control {
    /// The endpoint was closed: answer its requests, drop its routes.
    EpClosed(Arc<Ep>),
    /// CLIENT_REREGISTER on a port: drop learned routes of its endpoints (preloads stay).
    Reregister(u64),
    /// Preloaded routes for an endpoint, as (normalised request record, path) pairs (inserted
    /// by the worker, the only cache writer; again after every reregister).
    Preload(Arc<Ep>, Vec<PreloadedRoute>),
    /// Answer everything and stop.
    Shutdown,
}

/// One address-preload entry: ((ACM address type, zero-padded address), GID).
pub type HostEntry = ((u16, [u8; 64]), [u8; 16]);

/// One provider instance.
pub struct Shared {
    /// Core helpers.
    pub api: &'static CoreApi,
    /// Options from `acm_get_opts_file()`.
    pub opts: ProviderOptions,
    /// PathRecord cache (the worker is its only writer; the main thread reads it lock-free).
    pub cache: Cache,
    /// main → worker requests.
    pub requests: ArrayQueue<Request>,
    /// SA thread → worker replies.
    pub replies: ArrayQueue<SaReply>,
    /// Rare control messages.
    pub control: Mutex<Vec<Control>>,
    /// One per in-flight SA query slot (indexed by the low 16 bits of its token): the starter
    /// the SA thread may answer directly (see [`DirectSlot`]). Empty = direct answers off.
    pub direct: Box<[Mutex<DirectSlot>]>,
    /// Wakes the worker; also the coarse clock.
    pub waker: Waker,
    /// Address preload (`acm_hosts`): sorted (type, address) → GID. Immutable after open.
    pub hosts: Vec<HostEntry>,
    /// Per hosts entry: when its address mapping expires (coarse ms, `addr_timeout`;
    /// [`NEVER`] for `-1`). Written by the worker only (`renew_host`).
    pub host_expiry: Vec<AtomicU64>,
    /// Cache flush generation, bumped by `handle_event(CLIENT_REREGISTER)`.
    pub flush_gen: AtomicU32,
    /// Which of the 256 cache endpoint slots are taken (an endpoint's slot is released by the
    /// worker after its routes were invalidated).
    pub ep_slots: Mutex<[bool; 256]>,
    /// Requests queued for the worker by `enqueue` (not the inline hand-overs; the core's
    /// main thread is the only pusher).
    pub pushed: AtomicU64,
    /// How many of those the worker had taken at the end of its last round that left none of
    /// them pending (its own in-flight slots and backlog empty). Equal to `pushed` = no key
    /// is pending at the worker except those `resolve()` sent inline (which it knows), so an
    /// inline send cannot duplicate a query the worker would coalesce.
    pub idle_seen: AtomicU64,
    /// Per reserved inline slot: in use (set by `resolve()`, cleared by the worker when that
    /// query completes).
    pub inline_busy: [AtomicBool; INLINE_SLOTS],
    /// Per reserved inline slot, the key sent on it (main thread only: never contended).
    pub inline_keys: Mutex<[Option<RouteKey>; INLINE_SLOTS]>,
    /// Requests refused because a queue was full.
    pub overflows: AtomicU64,
    /// SA replies dropped because the reply queue was full.
    pub reply_drops: AtomicU64,
    /// Malformed client requests answered EINVAL.
    pub malformed: AtomicU64,
    /// Rate limits of the per-request error lines, one per [`LogReason`].
    pub log_limits: [LogLimit; LogReason::COUNT],
}

/// Why a per-request error line is logged (each reason is rate-limited on its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogReason {
    /// A malformed resolve/query request (EINVAL).
    Malformed = 0,
    /// The request queue was full (ENOMEM).
    QueueFull = 1,
    /// The pending table was full (ENOMEM, worker).
    PendingFull = 2,
    /// An SA reply never came (ETIMEDOUT, worker).
    Overdue = 3,
    /// The SA reply queue was full (SA thread).
    ReplyDrop = 4,
}

impl LogReason {
    /// Number of reasons.
    pub const COUNT: usize = 5;
}

/// At most [`LogLimit::LINES`] lines per reason per second; the lines beyond that are counted
/// and reported as one "suppressed" line by the first line of a later second. Lock-free (any
/// thread), no syscall: the clock is the worker's coarse one.
#[derive(Debug, Default)]
pub struct LogLimit {
    /// The second the current window started at (coarse clock).
    window: AtomicU64,
    /// Lines logged in the current window.
    lines: AtomicU32,
    /// Lines suppressed since the last summary.
    suppressed: AtomicU64,
}

impl LogLimit {
    /// Lines per reason per second.
    pub const LINES: u32 = 5;

    /// Whether a line may be logged at second `now_s`, and how many suppressed lines to report
    /// first (non-zero only once per window, to the caller that opens a new window).
    pub fn admit(&self, now_s: u64) -> (bool, u64) {
        let mut report = 0;
        let w = self.window.load(Ordering::Acquire);
        if w != now_s
            && self
                .window
                .compare_exchange(w, now_s, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.lines.store(0, Ordering::Release);
            report = self.suppressed.swap(0, Ordering::AcqRel);
        }
        if self.lines.fetch_add(1, Ordering::AcqRel) < Self::LINES {
            (true, report)
        } else {
            self.suppressed.fetch_add(1, Ordering::AcqRel);
            (false, report)
        }
    }
}

impl Shared {
    /// Logs a per-request error line, rate-limited per `reason` (see [`LogLimit`]).
    pub fn log_limited(&self, reason: LogReason, level: i32, text: &str) {
        let now_s = self.waker.coarse_ms() / 1000;
        let (admit, suppressed) = self.log_limits[reason as usize].admit(now_s);
        if suppressed > 0 {
            self.api.log(
                level,
                &format!("ERROR - {reason:?}: {suppressed} similar messages suppressed"),
            );
        }
        if admit {
            self.api.log(level, text);
        }
    }

    /// The first in-flight slot index reserved for queries `resolve()` sent itself (the
    /// worker's own slots are `0..8 × sa_depth`, at most [`crate::engine::MAX_INFLIGHT`]).
    pub const INLINE_SLOT: usize = crate::engine::MAX_INFLIGHT;

    /// Queues a control message and wakes the worker.
    pub fn control(&self, c: Control) {
        match self.control.lock() {
            Ok(mut v) => v.push(c),
            Err(poisoned) => poisoned.into_inner().push(c),
        }
        self.waker.wake();
    }

    /// Logs if the level is enabled (avoids formatting otherwise).
    pub fn log_enabled(&self, level: u8) -> bool {
        level <= self.opts.effective_log_level()
    }

    /// What the cache says about `key` (lock-free, allocation-free; `now` in coarse ms):
    /// `Some(Ok(path))`, `Some(Err(status))` for a recent negative answer, `None` on a miss.
    pub fn lookup(&self, key: &RouteKey, now: u64) -> Option<Cached> {
        let ck = key.cache_key()?;
        match self.cache.lookup(&ck, now) {
            Lookup::Hit {
                record,
                needs_refresh,
                ..
            } => Some(Cached::Path(record, needs_refresh)),
            Lookup::Negative { status, .. } => Some(Cached::Negative(status)),
            Lookup::Miss | Lookup::Busy => None,
        }
    }

    /// Remembers that the SA has no record for `key` for `ttl` ms (worker only).
    pub fn insert_negative(&self, key: &RouteKey, status: u8, now: u64, ttl: u64) {
        let Some(ck) = key.cache_key() else {
            return;
        };
        if let Some(mut w) = self.cache.writer() {
            let _ = w.insert_negative(&ck, status, now, ttl);
        }
    }

    /// Caches `record` for `key` until `now + ttl` (worker only). Uncacheable keys are skipped.
    pub fn insert(&self, key: &RouteKey, record: &[u8; 64], now: u64, ttl: u64) {
        let Some(ck) = key.cache_key() else {
            return;
        };
        match self.cache.writer() {
            Some(mut w) => {
                w.insert(&ck, record, now, ttl);
            }
            None => self
                .api
                .log(0, "ERROR - path cache writer busy; route not cached"),
        }
    }

    /// Makes everything learned through endpoint `ep` a miss, in O(1), then frees its cache
    /// slot (worker only).
    pub fn invalidate_ep(&self, ep: &Ep) {
        if let Some(mut w) = self.cache.writer() {
            // The cache's generation array is indexed by the low byte: the slot.
            w.invalidate_ep(u16::from(ep.slot));
        }
        let mut slots = match self.ep_slots.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        slots[usize::from(ep.slot)] = false;
    }

    /// Takes a free cache endpoint slot (main thread, at open_endpoint).
    pub fn take_ep_slot(&self) -> Option<u8> {
        let mut slots = match self.ep_slots.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let i = slots.iter().position(|t| !t)?;
        slots[i] = true;
        u8::try_from(i).ok()
    }

    /// Drops every cached route (worker only); returns how many there were.
    pub fn clear(&self) -> usize {
        let n = self.cache.len();
        if let Some(mut w) = self.cache.writer() {
            w.clear();
        }
        n
    }

    /// Looks an address up in the hosts preload: `(index, GID, still valid at now)`.
    pub fn host_gid(&self, type_: u16, addr: &[u8; 64], now: u64) -> Option<(u32, [u8; 16], bool)> {
        let i = self
            .hosts
            .binary_search_by(|(k, _)| k.cmp(&(type_, *addr)))
            .ok()?;
        let fresh = self
            .host_expiry
            .get(i)
            .is_some_and(|e| now < e.load(Ordering::Acquire));
        Some((i as u32, self.hosts[i].1, fresh))
    }

    /// The address lifetime in ms (`addr_timeout`), `None` = never expires.
    pub fn addr_ttl_ms(&self) -> Option<u64> {
        self.opts.addr_timeout.as_millis()
    }

    /// Re-resolves hosts entry `i` if it is expired at `now`: gives it a new lifetime from
    /// `now` (worker only). Returns true if it was expired (one re-resolution, however many
    /// requests were queued behind the expired mapping).
    pub fn renew_host(&self, i: u32, now: u64) -> bool {
        let Some(e) = self.host_expiry.get(i as usize) else {
            return false;
        };
        if now < e.load(Ordering::Acquire) {
            return false;
        }
        let until = self.addr_ttl_ms().map_or(NEVER, |t| now.saturating_add(t));
        e.store(until, Ordering::Release);
        true
    }
}

/// What we learned about a port at `open_port`.
pub struct PortInfo {
    /// Unique id of this open (a reopen gets a new one).
    pub id: u64,
    /// The core's port (stable for the life of the process).
    pub port: *const AcmPort,
    /// Port number.
    pub port_num: u8,
    /// GID index 0.
    pub gid0: [u8; 16],
    /// Base LID (0 if unknown).
    pub lid: u16,
    /// Active MTU enum (ibv_mtu).
    pub mtu: u8,
    /// Rate enum (ibv_rate), 0 if unknown.
    pub rate: u8,
}

// SAFETY: `port` points to the core's acm_port, which lives for the whole process and is only
// read through core helpers that accept concurrent use.
unsafe impl Send for PortInfo {}
// SAFETY: as above; every other field is plain data.
unsafe impl Sync for PortInfo {}

/// A local address of an endpoint (for loopback).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LocalAddr {
    /// ACM address type.
    pub type_: u16,
    /// Zero-padded address.
    pub addr: [u8; 64],
}

/// One endpoint (port, partition).
pub struct Ep {
    /// Unique id (never reused).
    pub id: u64,
    /// Cache endpoint slot (unique among live endpoints), see [`RouteKey::cache_ep`].
    pub slot: u8,
    /// The instance.
    pub shared: Arc<Shared>,
    /// The port.
    pub port: Arc<PortInfo>,
    /// P_Key as the core gave it.
    pub pkey: u16,
    /// The core's `acm_endpoint*`; null once closed. Held while the worker uses it, so
    /// `close_endpoint` cannot return while an `acm_alloc_sa_mad` on it is in progress.
    pub endpoint: Mutex<usize>,
    /// Set by `close_endpoint`.
    pub closed: AtomicBool,
    /// `ACM_CNTR_*` counters of this endpoint.
    pub counters: [AtomicU64; cntr::MAX],
    /// Local addresses (main thread only; the lock is never contended).
    pub local: Mutex<Vec<LocalAddr>>,
    /// Address contexts handed to the core, freed at close if the core leaked them.
    pub addr_ctxs: Mutex<Vec<usize>>,
}

impl Ep {
    /// Creates an endpoint record.
    pub fn new(
        id: u64,
        slot: u8,
        shared: Arc<Shared>,
        port: Arc<PortInfo>,
        endpoint: *const AcmEndpoint,
        pkey: u16,
    ) -> Self {
        Ep {
            id,
            slot,
            shared,
            port,
            pkey,
            endpoint: Mutex::new(endpoint as usize),
            closed: AtomicBool::new(false),
            counters: Default::default(),
            local: Mutex::new(Vec::new()),
            addr_ctxs: Mutex::new(Vec::new()),
        }
    }

    /// This endpoint's number in the cache at the current flush generation.
    pub fn cache_ep(&self) -> u16 {
        let gen = self.shared.flush_gen.load(Ordering::Acquire) as u16 & 0xff;
        (gen << 8) | u16::from(self.slot)
    }

    /// Bumps a per-endpoint counter.
    pub fn count(&self, which: usize) {
        self.counters[which].fetch_add(1, Ordering::Relaxed);
    }

    /// Bumps a per-endpoint counter and the core's global one.
    pub fn count_global(&self, which: usize) {
        self.count(which);
        self.shared.api.count(which);
    }

    /// Counts the status of a resolve answer (ERROR / NODATA), as ibacmp does per endpoint.
    pub fn count_status(&self, status: u8) {
        match status {
            0 => {}
            crate::ffi::ACM_STATUS_ENODATA => self.count(cntr::NODATA),
            _ => self.count(cntr::ERROR),
        }
    }
}
