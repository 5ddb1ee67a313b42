//! The provider instance and its endpoints, as the core's threads see them.
//!
//! * [`Instance`]: one per provider (created at the first `open_device`, torn down after the
//!   last `close_device`): the options, the path cache (read lock-free here, written only by
//!   the dataplane), the [`Inbox`] into the dataplane loop, the hosts preload, the endpoint
//!   registry and the log rate limits.
//! * [`PortInfo`], [`Ep`]: what the core told us about a port and an endpoint, plus the
//!   endpoint's counters.

use crate::core_api::CoreApi;
use crate::ffi::AcmPort;
use acm_core_nostd::cache::{ep_number, CacheEp};
use acm_core_nostd::resolver::request::EpView;
use acm_core_nostd::resolver::{Counter, EpId, MAX_EPS};
use acm_core_nostd::text::opts::ProviderOptions;
use acm_core_nostd::wire::client::{Status, MAX_COUNTER};
use acm_core_nostd::wire::gid::Gid;
use acm_dataplane::export::{EndpointReport, Report, Source};
use acm_dataplane::plane::{HostAddr, HostCache, Inbox, LatencySink};
use acm_dataplane::stats::{Clock, EpStats};
use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One provider instance.
pub struct Instance {
    /// Core helpers.
    pub api: &'static CoreApi,
    /// Options from `acm_get_opts_file()`.
    pub opts: ProviderOptions,
    /// The path cache: lock-free reads here; the loop's rounds (one at a time under its lock)
    /// its only writer.
    pub cache: Arc<HostCache>,
    /// The path storage is [`huge::is_large`](crate::huge::is_large): a hit's slots are DRAM
    /// misses, and the hit path also prefetches the tag-matching slots (docs/cache.md).
    pub large_cache: bool,
    /// The queues into the dataplane loop.
    pub inbox: Arc<Inbox>,
    /// The address preload (`addr_preload acm_hosts`), handed to every endpoint.
    pub hosts: Arc<Vec<HostAddr>>,
    /// Open endpoints by [`EpId`] (the dataplane's IO looks the core's endpoint up here).
    pub eps: EpRegistry,
    /// Per-request error lines, rate-limited per reason.
    pub log_limits: [LogLimit; LogReason::COUNT],
    /// Wall-clock epoch of the coarse clock (ms since it, shared with the dataplane).
    pub epoch: std::time::Instant,
    /// The latency clock (calibrated TSC), shared with the dataplane.
    pub clock: Clock,
}

impl Instance {
    /// Logs if the level is enabled.
    pub fn log_enabled(&self, level: u8) -> bool {
        level <= self.opts.effective_log_level()
    }

    /// Logs a per-request error line, rate-limited per `reason` (see [`LogLimit`]).
    pub fn log_limited(&self, reason: LogReason, text: &str) {
        let now_s = self.inbox.waker.coarse_ms() / 1000;
        let (admit, suppressed) = self.log_limits[reason as usize].admit(now_s);
        if suppressed > 0 {
            self.api.log(
                0,
                &format!("ERROR - {reason:?}: {suppressed} similar messages suppressed"),
            );
        }
        if admit {
            self.api.log(0, text);
        }
    }

    /// The cache clock now (coarse ms, no syscall).
    pub fn now_ms(&self) -> u64 {
        self.inbox.waker.coarse_ms()
    }
}

/// Open endpoints by [`EpId`]; slot allocation at `open_endpoint`, release at close.
pub struct EpRegistry {
    slots: Mutex<Vec<Option<Arc<Ep>>>>,
    /// Per slot, the flush generation the next endpoint opened in it starts with: one past
    /// the last one of the endpoint closed there, so a reopened endpoint never shares a
    /// cache number with its predecessor (whose entries the dataplane invalidates only when
    /// it gets to the close).
    next_gen: Mutex<Vec<u32>>,
    /// Bumped at every change, so readers can keep a copy and refresh it only when needed.
    version: AtomicU64,
}

impl Default for EpRegistry {
    fn default() -> Self {
        EpRegistry {
            slots: Mutex::new((0..MAX_EPS).map(|_| None).collect()),
            next_gen: Mutex::new(vec![0; MAX_EPS]),
            version: AtomicU64::new(0),
        }
    }
}

impl EpRegistry {
    /// Registers an endpoint built by `make` (given its id and the flush generation it starts
    /// at) in a free slot; `None` when all are taken.
    pub fn insert(&self, make: impl FnOnce(EpId, u32) -> Arc<Ep>) -> Option<Arc<Ep>> {
        let mut s = lock(&self.slots);
        let i = s.iter().position(Option::is_none)?;
        let gen = lock(&self.next_gen)[i];
        let ep = make(EpId::from_index(i)?, gen);
        s[i] = Some(ep.clone());
        self.version.fetch_add(1, Ordering::AcqRel);
        Some(ep)
    }

    /// Frees the slot of `id`.
    pub fn remove(&self, id: EpId) {
        let mut s = lock(&self.slots);
        if let Some(ep) = s[id.index()].take() {
            lock(&self.next_gen)[id.index()] = ep.gen.load(Ordering::Acquire).wrapping_add(1);
        }
        drop(s);
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// The registry's version (changes at every insert/remove).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// A copy of the table.
    pub fn snapshot(&self) -> Vec<Option<Arc<Ep>>> {
        lock(&self.slots).clone()
    }

    /// Every open endpoint of port open `port_id`.
    pub fn of_port(&self, port_id: u64) -> Vec<Arc<Ep>> {
        lock(&self.slots)
            .iter()
            .flatten()
            .filter(|e| e.port.id == port_id)
            .cloned()
            .collect()
    }
}

/// Locks, ignoring poisoning (every critical section here leaves consistent state).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why a per-request error line is logged (each reason is rate-limited on its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogReason {
    /// A malformed resolve/query request (EINVAL).
    Malformed = 0,
    /// The request queue was full (ENOMEM).
    QueueFull = 1,
    /// The SA reply queue was full (SA thread).
    ReplyDrop = 2,
    /// The dataplane has stopped (it gave up, or its thread is gone): requests answered at
    /// once with ENODATA.
    Stopped = 3,
    /// The watchdog found the dataplane stuck: requests answered at once with ETIMEDOUT.
    Stalled = 4,
}

impl LogReason {
    /// Number of reasons.
    pub const COUNT: usize = 5;
}

/// At most [`LogLimit::LINES`] lines per reason per second; the lines beyond that are counted
/// and reported as one "suppressed" line by the first line of a later second. Lock-free (any
/// thread), no syscall: the clock is the dataplane's coarse one.
#[derive(Debug, Default)]
pub struct LogLimit {
    window: AtomicU64,
    lines: AtomicU32,
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

/// What we learned about a port at `open_port`.
pub struct PortInfo {
    /// Unique id of this open (a reopen gets a new one).
    pub id: u64,
    /// The core's port (stable for the life of the process).
    pub port: *const AcmPort,
    /// Port number.
    pub port_num: u8,
    /// GID index 0.
    pub gid0: Gid,
    /// Base LID (0 if unknown).
    pub lid: u16,
    /// Active MTU (`enum ibv_mtu`).
    pub mtu: u8,
    /// Active rate (`enum ibv_rate`), 0 if unknown.
    pub rate: u8,
    /// Subnet timeout in ms as ibacmp derives it from PortInfo.SubnetTimeOut.
    pub subnet_timeout_ms: u64,
}

// SAFETY: `port` points to the core's acm_port, which lives for the whole process and is only
// read through core helpers that accept concurrent use.
unsafe impl Send for PortInfo {}
// SAFETY: as above; every other field is plain data.
unsafe impl Sync for PortInfo {}

/// One endpoint (port, partition).
pub struct Ep {
    /// The dataplane's id for it (its cache slot).
    pub id: EpId,
    /// Unique per open (never reused), for logs.
    pub serial: u64,
    /// The port.
    pub port: Arc<PortInfo>,
    /// P_Key as the core gave it.
    pub pkey: u16,
    /// The cache flush generation: bumped by `handle_event(CLIENT_REREGISTER)` on the main
    /// thread, so from that moment no hit sees a route learned before it. 32 bits, of which
    /// the cache endpoint number keeps 22 ([`ep_number`]): it comes back to an earlier number
    /// only after 4,194,304 bumps, not after 256 as an 8-bit one did.
    pub gen: AtomicU32,
    /// The core's `acm_endpoint*`; 0 once closed. Held while the dataplane sends an SA MAD on
    /// it, so `close_endpoint` cannot return while that is in progress.
    pub endpoint: Mutex<usize>,
    /// Set by `close_endpoint`.
    pub closed: AtomicBool,
    /// `ACM_CNTR_*` counters of this endpoint, one array per writer ([`Writer`]): each is
    /// bumped with a plain load and store by one thread at a time (no locked
    /// read-modify-write on the hit path), and read as the sum ([`counter`](Self::counter)).
    /// Each array has its own cache line, so the dataplane's counting never takes the line
    /// the hit path writes.
    pub counters: [CachePadded<[AtomicU64; MAX_COUNTER]>; Writer::COUNT],
    /// Latency histograms: `hit` written by the core's main thread only, the others by the
    /// loop's rounds, one at a time under its lock ([`latency_sink`]).
    pub stats: EpStats,
    /// Address contexts handed to the core, freed at close if the core leaked them.
    pub addr_ctxs: Mutex<Vec<usize>>,
    /// The control sequence number of the endpoint's last `remove_address`: until the
    /// dataplane has applied it, the removed address's cache alias may still be there, so
    /// address requests are not answered from the cache inline.
    pub removal_seq: AtomicU64,
    /// `resolve()` calls so far, for sampling the hit histogram (`acmrs_hit_sample`); written
    /// by the core's main thread only (plain load and store, no read-modify-write), on a
    /// line of its own.
    pub hit_tick: CachePadded<AtomicU32>,
}

impl Ep {
    /// An open endpoint in slot `id`, starting at flush generation `gen` (what
    /// [`EpRegistry::insert`] hands its `make`), for the core's `acm_endpoint*` `endpoint`.
    pub fn new(
        id: EpId,
        serial: u64,
        port: Arc<PortInfo>,
        pkey: u16,
        gen: u32,
        endpoint: usize,
    ) -> Ep {
        Ep {
            id,
            serial,
            port,
            pkey,
            gen: AtomicU32::new(gen),
            endpoint: Mutex::new(endpoint),
            closed: AtomicBool::new(false),
            counters: Default::default(),
            stats: Default::default(),
            addr_ctxs: Mutex::new(Vec::new()),
            removal_seq: AtomicU64::new(0),
            hit_tick: CachePadded::new(AtomicU32::new(0)),
        }
    }

    /// This endpoint's number in the cache at the current flush generation
    /// ([`ep_number`]: the generation's low 22 bits above the slot id).
    #[inline]
    pub fn cache_ep(&self) -> CacheEp {
        ep_number(self.gen.load(Ordering::Acquire), self.id.0)
    }

    /// A new flush generation (CLIENT_REREGISTER): from now on no hit on this endpoint sees an
    /// entry cached under an earlier one, whether or not the dataplane has flushed them yet.
    pub fn bump_gen(&self) {
        self.gen.fetch_add(1, Ordering::AcqRel);
    }

    /// What request classification needs to know of the endpoint.
    pub fn view(&self) -> EpView {
        EpView {
            cache_ep: self.cache_ep(),
            port_gid: self.port.gid0,
            lid: self.port.lid,
            pkey: self.pkey,
        }
    }

    /// Bumps a per-endpoint counter in `w`'s array (the calling thread must be `w`).
    #[inline]
    pub fn count(&self, w: Writer, c: Counter) {
        let a = &self.counters[w as usize][c as usize];
        // Single writer per array: a plain load and store is exact and never locks the bus.
        a.store(a.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Counter `c` (index `ACM_CNTR_*`): the sum over the writers' arrays.
    pub fn counter(&self, c: usize) -> u64 {
        self.counters
            .iter()
            .map(|a| a[c].load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }

    /// Bumps a per-endpoint counter and, for the four ibacm keeps globally (address and route
    /// queries and cache hits), the core's one; the core counts RESOLVE, ERROR and NODATA
    /// itself.
    #[inline]
    pub fn count_global(&self, w: Writer, api: &CoreApi, c: Counter) {
        self.count(w, c);
        if matches!(
            c,
            Counter::AddrQuery | Counter::AddrCache | Counter::RouteQuery | Counter::RouteCache
        ) {
            api.count(c as usize);
        }
    }

    /// Counts the status of an answer (ERROR / NODATA), as ibacmp does per endpoint.
    #[inline]
    pub fn count_status(&self, w: Writer, status: Status) {
        match status {
            Status::Success => {}
            Status::Enodata => self.count(w, Counter::NoData),
            _ => self.count(w, Counter::Error),
        }
    }
}

/// Who writes an [`Ep::counters`] array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// The core's main thread (`resolve()`/`query()`: hits and inline answers).
    Core = 0,
    /// The loop's rounds, one at a time under its lock, on the dataplane thread or on a core
    /// thread that found the loop free (misses, the SA, the ACM protocol).
    Plane = 1,
}

impl Writer {
    /// Number of writers.
    pub const COUNT: usize = 2;
}

/// The dataplane's latency sink: records into the endpoint's histograms (the loop's rounds,
/// one at a time under its lock: their single writer). Looks endpoints up in a copy of the registry, refreshed
/// when its version changes (no lock per record).
pub fn latency_sink(inst: Arc<Instance>) -> LatencySink {
    let mut eps = inst.eps.snapshot();
    let mut version = inst.eps.version();
    Box::new(move |id, what, ns| {
        let v = inst.eps.version();
        if v != version {
            eps = inst.eps.snapshot();
            version = v;
        }
        if let Some(Some(ep)) = eps.get(id.index()) {
            ep.stats.of(what).record(ns);
        }
    })
}

/// What the exporter thread reads: every open endpoint's labels, counters and histograms.
pub struct StatsSource(pub Arc<Instance>);

impl Source for StatsSource {
    fn report(&self) -> Report {
        let inst = &self.0;
        let clock = if inst.clock.is_tsc() {
            format!("tsc {:.4} ticks/ns", inst.clock.ticks_per_ns())
        } else {
            "instant".to_string()
        };
        let endpoints = inst
            .eps
            .snapshot()
            .into_iter()
            .flatten()
            .map(|ep| EndpointReport {
                port: ep.port.port_num,
                pkey: ep.pkey,
                gid: std::net::Ipv6Addr::from(ep.port.gid0.0).to_string(),
                counters: core::array::from_fn(|i| ep.counter(i)),
                hists: [
                    ep.stats.hit.snapshot(),
                    ep.stats.route_miss.snapshot(),
                    ep.stats.addr_miss.snapshot(),
                    ep.stats.sa_rtt.snapshot(),
                    ep.stats.miss_queued.snapshot(),
                    ep.stats.miss_to_query.snapshot(),
                    ep.stats.reply_wait.snapshot(),
                    ep.stats.reply_to_answer.snapshot(),
                ],
            })
            .collect();
        let (restarts, gave_up, _) = inst.inbox.health();
        let dataplane = acm_dataplane::export::DataplaneHealth {
            restarts,
            gave_up,
            up: !inst.inbox.is_stopped(),
        };
        Report {
            clock,
            dataplane,
            endpoints,
        }
    }

    fn log(&self, level: u8, text: &str) {
        if self.0.log_enabled(level) {
            self.0.api.log(i32::from(level), text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn port() -> Arc<PortInfo> {
        Arc::new(PortInfo {
            id: 1,
            port: std::ptr::null(),
            port_num: 1,
            gid0: Gid([0; 16]),
            lid: 1,
            mtu: 5,
            rate: 7,
            subnet_timeout_ms: 1000,
        })
    }

    fn open(reg: &EpRegistry, port: &Arc<PortInfo>) -> Arc<Ep> {
        reg.insert(|id, gen| Arc::new(Ep::new(id, 0, port.clone(), 0xffff, gen, 1)))
            .expect("a free slot")
    }

    /// Rounds of bumps: past 256 (where the old 8-bit generation came back to its start) and
    /// past 65,536.
    const BUMPS: u32 = 70_000;

    /// CLIENT_REREGISTER bumps the endpoint's generation (`Ep::bump_gen`) so that the hit
    /// path stops finding routes cached before it at once, before the dataplane flushes them.
    /// So the endpoint's cache number must never come back to an earlier one while the
    /// dataplane may not have caught up: not after 256 bumps, nor after any number of them
    /// up to here, and its low byte stays the slot id.
    #[test]
    fn cache_numbers_do_not_repeat_over_many_reregisters() {
        let (reg, port) = (EpRegistry::default(), port());
        let _first = open(&reg, &port);
        let ep = open(&reg, &port);
        let start = ep.cache_ep();
        assert_eq!(start.slot(), ep.id.0);
        let mut seen = HashSet::from([start]);
        for n in 1..=BUMPS {
            ep.bump_gen();
            let c = ep.cache_ep();
            assert_ne!(c, start, "the start number again after {n} bumps");
            assert!(seen.insert(c), "{c:?} again after {n} bumps");
            assert_eq!(c.slot(), ep.id.0);
            assert_eq!(ep.view().cache_ep, c);
        }
    }

    /// An endpoint opened in a freed slot starts one generation past the last one of the
    /// endpoint closed there (whose entries the dataplane flushes only when it gets to the
    /// close): its cache number must be fresh however often the slot was reused, 256 times
    /// and more, also when a reregister bumped a predecessor in between.
    #[test]
    fn a_reused_slot_gets_a_fresh_cache_number_every_time() {
        let (reg, port) = (EpRegistry::default(), port());
        let mut seen = HashSet::new();
        let mut slot = None;
        for n in 0..BUMPS {
            let ep = open(&reg, &port);
            assert_eq!(
                *slot.get_or_insert(ep.id),
                ep.id,
                "the same slot, reuse {n}"
            );
            let c = ep.cache_ep();
            assert!(seen.insert(c), "{c:?} again after {n} reuses of the slot");
            if n % 1000 == 7 {
                ep.bump_gen();
                let c = ep.cache_ep();
                assert!(seen.insert(c), "{c:?} again after {n} reuses and a bump");
            }
            reg.remove(ep.id);
        }
    }
}
