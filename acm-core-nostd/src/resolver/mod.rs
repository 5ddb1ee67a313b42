//! The resolver: every decision acmrs makes, as a sans-IO state machine.
//!
//! Modelled on quinn-proto's `Connection`: the resolver never performs IO, never reads a clock
//! and never allocates. Its caller (the dataplane loop on a host, a firmware main loop, a
//! simulation) feeds it **inputs** as method calls with the time passed in, and drains its
//! **outputs** by polling:
//!
//! ```text
//!  inputs                                    outputs (poll_output)
//!  handle_open / handle_close           ──┐   ┌──▶ Output::SendSa    (PathRecord GET, MCMember SET/DELETE)
//!  handle_add_address / _remove_address   │   ├──▶ Output::SendAcm   (class 0x2C over the endpoint's UD QP)
//!  handle_preload_address / _route        │   ├──▶ Output::Answer    (a client's response, exactly once)
//!  handle_reregister                      ├─▶ ├──▶ Output::Attach / Output::Detach (multicast group)
//!  handle_request (classified or not)     │   └──▶ Output::Count     (an ACM_CNTR_* event)
//!               (client, 592 B msg)       │
//!  handle_sa     (SA reply or error)      │
//!  handle_sa_table (GetTable answer)      │
//!  handle_report (SA Report: trap 64/65)  │
//!  handle_acm    (received 0x2C MAD)      │
//!  handle_timeout(now)                    │      poll_timeout() → when to call handle_timeout
//!  handle_shutdown                      ──┘
//! ```
//!
//! Those are every input there is; the owner also has `clear_cache`, `into_writer` (the cache's
//! writer back, ending the resolver), `stats`, `is_idle` and, with `sim`, `check_invariants`.
//!
//! Storage (request slots, route jobs, in-flight queries, address entries, endpoints) comes
//! from the caller as slices in a [`Storage`], like [`crate::cache::PathCache`]. The path cache
//! is shared with lock-free readers (the provider's inline hit path), who read it through their
//! own handle; its one writer, a [`CacheWriter`] over a handle `C` to the cache (an `Arc` on a
//! host, a `&'static` or a borrow in firmware), is taken once by the resolver's owner and given
//! to [`Resolver::new`]: the resolver owns it for its whole life, so no input takes a cache
//! argument, no write can be skipped for want of the writer, and no one else can write
//! meanwhile ([`PathCache::writer`] is an `Err` while a resolver lives). Its own lookups read
//! through it ([`Resolver::cache`]).
//!
//! Like quinn-proto's `Connection`, the resolver composes parts that own their state and
//! their rules: the request slots (`answers::Answers`), the route jobs and the SA window
//! (`route::Routes`), the address entries and the ACM protocol (`addr::Addrs`), the endpoint
//! slots (`endpoints::Endpoints`), and each endpoint's groups, subscriptions and half-world
//! table (`groups::Groups`, `inform::Informs`, [`table`]'s `TableFetch`, in its slot). Each of
//! the first four owns its slabs, split off the caller's [`Storage`] once by
//! [`Resolver::new`]. A part's methods take what else they need as arguments: another part's
//! slab where a list crosses parts, the services the parts share (`Shared`: settings, TIDs,
//! the timer table, stats), the cache writer. The
//! resolver's own code is its inputs and outputs (this file), an endpoint's life
//! (`lifecycle.rs`) and the steps that cross parts (`steps.rs`).
//!
//! Time is one monotonic clock in milliseconds ([`Millis`]), the same ticks the cache uses.
//!
//! Exactly-once: every [`Resolver::handle_request`] of kind [`Kind::Resolve`] or [`Kind::Query`] leads
//! to exactly one [`Output::Answer`] carrying its `client` and the request's `tid`, on every
//! path (hit, miss, SA error, timeout, endpoint close, reregister, shutdown, full slabs).

mod acm;
mod addr;
mod answers;
mod endpoints;
pub mod front;
mod groups;
use groups::Set;
mod config;
mod inform;
mod lifecycle;
mod mads;
mod output;
pub mod request;
mod route;
mod sa_window;
mod steps;
mod storage;
pub mod table;
mod timers;
mod types;

pub use config::Config;
pub use types::*;

#[cfg(feature = "std")]
pub use storage::HeapStorage;
pub use storage::{
    AddrEntry, ArrayStorage, Capacities, EpSlot, Fixed, JobSlot, PreloadSlot, RequestSlot, Slabs,
    Storage,
};

use crate::cache::{AddrKind, CacheEp, CacheRef, CacheWriter, PathCache};
use crate::wire::acm_mad::AddressType;
use crate::wire::client::Status;
use crate::wire::gid::Gid;
use storage::{AddrState, JobState};
use timers::{Parts, Timer, TimerTable};

/// Route lifetime meaning "never expires".
const NEVER: Millis = u64::MAX;

/// One step of the crate's PRNG ([`crate::rng::Rng`]) over `x`.
pub(crate) fn splitmix64(x: &mut u64) -> u64 {
    let mut r = crate::rng::Rng(*x);
    let v = r.next_u64();
    *x = r.0;
    v
}

/// The services every part of the resolver uses, lent to the part's methods by `&mut`: the
/// settings, the TID counter, the timer table and the stats.
pub(crate) struct Shared {
    /// The settings in force: those given to [`Resolver::new`], limited by what the
    /// transport carries ([`Resolver::set_transport`]).
    pub(crate) cfg: Config,
    /// Subnet timeouts an SA query's deadline adds, one per try of the owner's transport
    /// ([`Carries::subnet_waits`], [`Resolver::set_transport`]; 0: the budget is fixed).
    pub(crate) subnet_waits: u32,
    /// What the given settings asked for of the transport, before [`Carries`] limited it:
    /// `sa_tables`, `sa_reports`, `sa_window`.
    asked: (bool, bool, u32),
    tid: u32,
    /// Every timer, one entry per kind ([`timers`]).
    pub(crate) timers: TimerTable,
    pub(crate) stats: Stats,
}

impl Shared {
    /// The next TID of the resolver's counter (never 0; SA queries and ACM requests alike).
    pub(crate) fn next_tid(&mut self) -> u32 {
        loop {
            self.tid = self.tid.wrapping_add(1);
            if self.tid != 0 {
                return self.tid;
            }
        }
    }
}

/// The resolver (see the [module docs](self)).
///
/// **Draining rule.** After every input call, call [`poll_output`](Self::poll_output) until it
/// returns `None`. Every output is derived from state the resolver holds anyway (request slots
/// on an answer FIFO, route jobs on a send FIFO, address entries with send flags, per-endpoint
/// flags and counters), so nothing is ever dropped while outputs wait; the one exception is an
/// immediate answer (hit, error, ENOMEM) arriving when every request slot is taken, which is
/// impossible under this rule as long as `answer_reserve ≥ 1` ([`Stats::lost`] counts it).
pub struct Resolver<S: Storage, C: CacheRef> {
    /// The path cache's one writer, owned for the resolver's whole life: every cache write
    /// the resolver makes goes through it, and its own lookups read through it.
    w: CacheWriter<C>,
    /// The settings, the TID counter, the timer table, the stats.
    sh: Shared,
    /// Client requests: their slots, the free list, the answer FIFO ([`answers`]).
    answers: answers::Answers<S>,
    /// Route jobs, their coalescing index and the SA window ([`route`], [`sa_window`]).
    routes: route::Routes<S>,
    /// The address entries, their index and their ACM send and removal lists ([`addr`],
    /// [`acm`]).
    addrs: addr::Addrs<S>,
    /// The endpoint slots and preloaded routes, which slot serves which endpoint, and which
    /// have outputs to poll ([`endpoints`]); each endpoint's groups, subscriptions and table
    /// are in its slot ([`groups`], [`inform`], [`table`]).
    eps: endpoints::Endpoints<S>,
    done: bool,
}

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// A resolver over `storage` (every slot is reset) that writes the path cache through
    /// `writer`, the cache's one writer ([`CacheWriter::take`], taken once by the resolver's
    /// owner), for as long as it lives. `seed` picks the hash seed and the first TID (use a
    /// random one on hosts). Fails with [`Error::Storage`] if a slab is empty or there are
    /// fewer request slots than `answer_reserve + 1`.
    pub fn new(
        config: Config,
        storage: S,
        writer: CacheWriter<C>,
        seed: u64,
    ) -> Result<Self, Error> {
        let t = storage.into_slabs();
        let bad = t.requests.len() <= t.answer_reserve
            || t.requests.len() >= u32::MAX as usize
            || t.jobs.is_empty()
            || t.jobs.len() > 0x00ff_ffff
            || t.job_buckets.is_empty()
            || t.addrs.is_empty()
            || t.addrs.len() >= u32::MAX as usize
            || t.addr_buckets.is_empty()
            || t.endpoints.is_empty()
            || t.sa_inflight == 0;
        if bad {
            return Err(Error::Storage);
        }
        let mut s = seed;
        let seed = splitmix64(&mut s);
        let tid = splitmix64(&mut s) as u32;
        let r = Resolver {
            w: writer,
            sh: Shared {
                asked: (config.sa_tables, config.sa_reports, config.sa_window),
                cfg: config,
                subnet_waits: Carries::ALL.subnet_waits,
                tid,
                timers: TimerTable::new(),
                stats: Stats::default(),
            },
            answers: answers::Answers::new(t.requests, t.answer_reserve),
            routes: route::Routes::new(t.jobs, t.job_buckets, t.sa_inflight, seed, &config),
            addrs: addr::Addrs::new(t.addrs, t.addr_buckets, seed),
            eps: endpoints::Endpoints::new(t.endpoints, t.preloads),
            done: false,
        };
        Ok(r)
    }

    /// The settings in use.
    pub fn config(&self) -> &Config {
        &self.sh.cfg
    }

    /// The owner's SA transport does what `carries` says (the node tells it when it is made,
    /// from its [`SaConfig`](crate::node::SaConfig)): the settings in force
    /// ([`config`](Self::config)) become those given to [`new`](Self::new) limited by it (no
    /// tables or Reports it cannot carry, its own SA window), and a query's deadline
    /// ([`Config::sa_deadline`]) grows by [`Carries::subnet_waits`] subnet timeouts. Set
    /// again, it replaces the last; a resolver never told has [`Carries::ALL`].
    pub fn set_transport(&mut self, carries: Carries) {
        let (tables, reports, window) = self.sh.asked;
        let cfg = &mut self.sh.cfg;
        cfg.sa_tables = tables && carries.tables;
        cfg.sa_reports = reports && carries.reports;
        cfg.sa_window = carries.window.unwrap_or(window).max(1);
        self.sh.subnet_waits = carries.subnet_waits;
        self.routes.sa.limit(cfg.sa_window, cfg.sa_window_start);
    }

    /// The path cache the resolver writes (read it here; readers on other threads read it
    /// through their own handle).
    #[inline]
    pub fn cache(&self) -> &PathCache<C::Paths, C::Addrs> {
        self.w.cache()
    }

    /// Empties the path cache, every endpoint's entries (the dataplane does it at shutdown and
    /// when a fresh resolver takes over after a panic).
    pub fn clear_cache(&mut self) {
        self.w.clear();
    }

    /// Gives the cache's writer back, ending the resolver (e.g. to hand it to a fresh one).
    pub fn into_writer(self) -> CacheWriter<C> {
        self.w
    }

    /// A client request (`resolve()` → [`Kind::Resolve`], `query()` → [`Kind::Query`], or a
    /// [`Kind::Prime`] / [`Kind::Refresh`] the caller already answered), the one way requests
    /// come in. Its head ([`RequestHead`]): `cache_ep` is the caller's cache endpoint number for
    /// `ep` (the key of every cache entry of this request); `target` the request's
    /// classification when the caller's
    /// front made it already ([`request::classify`] with the endpoint's view at `cache_ep`),
    /// so it is not parsed again; `None` to classify it here. Resolve and Query requests get
    /// exactly one [`Output::Answer`]; Prime and Refresh none.
    pub fn handle_request(&mut self, now: Millis, r: &Request<'_>) {
        if r.head.target.is_some() || r.head.kind == Kind::Query {
            return self.take_request(now, r, r.head.target.as_ref());
        }
        let mine = self
            .eps
            .slot(r.head.ep)
            .map(|slot| request::classify(&self.eps.slots[slot].view(r.head.cache_ep), r.msg));
        self.take_request(now, r, mine.as_ref());
    }

    /// An SA completion for a [`Output::SendSa`] with `token`: the reply MAD (`umad_status`
    /// 0), or the MAD as sent with a non-zero `umad_status` (timeout, send failure). Replies
    /// whose token or TID matches nothing in flight are counted and dropped.
    pub fn handle_sa(&mut self, now: Millis, token: u64, umad_status: u32, mad: &[u8]) {
        let mad = mads::full_mad(mad);
        let (kind, index, tid) = mads::untoken(token);
        match kind {
            mads::TOKEN_ROUTE => self.route_reply(now, index, tid, umad_status, &mad),
            mads::TOKEN_JOIN => self.set_reply(now, Set::Join, index, tid, umad_status, &mad),
            mads::TOKEN_INFORM => self.set_reply(now, Set::Inform, index, tid, umad_status, &mad),
            // Only a failure can come this way (the MAD as sent with a non-zero status); a
            // reply MAD means the transport handed up a single MAD, not a reassembled table,
            // so tables are turned off.
            mads::TOKEN_TABLE => match table::table_of(&self.eps.slots, token) {
                Some(slot) => {
                    let e = &mut self.eps.slots[slot];
                    e.table.failed(now, umad_status == 0, &mut self.sh)
                }
                None => self.sh.stats.sa_unknown += 1,
            },
            mads::TOKEN_PROBE => self.probe_reply(now, token, umad_status, &mad),
            mads::TOKEN_LEAVE | mads::TOKEN_NOTICE => {}
            _ => self.sh.stats.sa_unknown += 1,
        }
        self.pump(now);
    }

    /// A class 0x2C MAD received on `ep`'s UD QP (`mad` = the 256 bytes after the GRH, `meta`
    /// from the completion). Requests for one of our addresses are answered (unicast); every
    /// valid request records its sender; responses complete our queries. Anything malformed,
    /// unexpected or from another partition is counted in [`Stats`] and dropped.
    pub fn handle_acm(&mut self, now: Millis, ep: EpId, meta: &RecvMeta, mad: &[u8]) {
        self.acm_receive(now, ep, meta, mad);
        self.pump(now);
    }

    /// Runs the timers due at `now` (SA deadlines, BUSY backoffs, ACM retries, queue
    /// deadlines, join retries). Call when [`poll_timeout`](Self::poll_timeout) has passed;
    /// calling it early or often is harmless.
    // Never inlined: a caller's loop calls it in several places, and each inlined copy is
    // kilobytes of flash on a microcontroller (docs/firmware.md).
    #[inline(never)]
    pub fn handle_timeout(&mut self, now: Millis) {
        let due = Timer::ALL.map(|t| self.sh.timers.due(t, now));
        if !due.contains(&true) {
            return;
        }
        let fired = |t: Timer| due[t as usize];
        for t in [Timer::Backlog, Timer::SaReply, Timer::SaBusy] {
            if fired(t) {
                self.route_timers(now, t);
            }
        }
        // The endpoints' timers, one endpoint after the other.
        let (join, inform) = (fired(Timer::Join), fired(Timer::Inform));
        let (queue, retry) = (fired(Timer::AcmQueue), fired(Timer::AcmRetry));
        if join || inform || queue || retry {
            for slot in 0..self.eps.slots.len() {
                if !self.eps.slots[slot].open {
                    continue;
                }
                if join {
                    self.set_timers(now, Set::Join, slot);
                }
                if inform {
                    self.set_timers(now, Set::Inform, slot);
                }
                if queue {
                    self.acm_queue_timers(now, slot);
                }
                if retry {
                    self.acm_retry_timers(now, slot);
                }
            }
        }
        if fired(Timer::WarmStart) {
            self.warm_start_timers(now);
        }
        // `pump` drops the removals' aliases (the `Removal` timer's work).
        self.pump(now);
        for t in Timer::ALL {
            if fired(t) {
                self.rearm(t);
            }
        }
    }

    /// Sets timer kind `t` to the earliest deadline its part holds now.
    // One copy, not one per kind fired (flash).
    #[inline(never)]
    fn rearm(&mut self, t: Timer) {
        let parts = Parts {
            routes: &self.routes,
            addrs: &self.addrs,
            eps: &self.eps.slots,
            cfg: &self.sh.cfg,
        };
        let at = parts.earliest(t);
        self.sh.timers.set(t, at);
    }

    /// When to call [`handle_timeout`](Self::handle_timeout) next (`None` = no timer armed).
    /// It may be earlier than necessary, never later.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.sh.timers.next()
    }

    /// The next thing for the caller to do, `None` when there is nothing. Call it until `None`
    /// after every input (see the draining rule on [`Resolver`]). Order: per-endpoint work,
    /// SA queries, ACM MADs, client answers. An [`Output::Answer`]'s message is built into
    /// `msg` (its first `len` bytes); other outputs leave `msg` alone.
    #[must_use]
    // Never inlined: a caller's loop calls it in several places, and each inlined copy is
    // kilobytes of flash on a microcontroller (docs/firmware.md).
    #[inline(never)]
    pub fn poll_output(&mut self, msg: &mut MsgBuf) -> Option<Output> {
        while let Some(slot) = self.eps.first_dirty() {
            // Polled in place, not copied: the slot is large, and this runs for every output
            // of an endpoint with work (a miss's counter bumps).
            if let Some(o) = self.eps.slots[slot].poll(slot, &mut self.sh) {
                return Some(o);
            }
            self.eps.clean(slot);
        }
        if let Some(o) = self.routes.poll(&self.eps.slots) {
            return Some(o);
        }
        if let Some(o) = self.addrs.poll(&self.eps.slots) {
            return Some(o);
        }
        self.answers.pop(msg)
    }

    /// An SA MAD that is not a reply to one of our queries, received on `ep`'s UD QP: a
    /// Report is acknowledged and applied; anything else is counted and dropped.
    pub fn handle_report(&mut self, now: Millis, ep: EpId, mad: &[u8]) {
        let whole = mad.len() >= crate::wire::sa::DATA_OFFSET + crate::wire::inform::NOTICE_LEN;
        let mad = mads::full_mad(mad);
        let report = whole.then(|| mads::parse_report(&mad)).flatten();
        let slot = self.eps.slot(ep);
        let (Some(slot), Some((tid, notice, raw))) = (slot, report) else {
            self.sh.stats.report_malformed += 1;
            return;
        };
        self.sh.stats.reports += 1;
        self.eps.slots[slot].informs.acknowledge(tid, raw);
        self.eps.mark_dirty(slot);
        if let Some(gid) = notice.subject_gid() {
            match notice.trap {
                crate::wire::inform::TRAP_GID_OUT_OF_SERVICE => {
                    self.invalidate_gid(&gid, false, true)
                }
                crate::wire::inform::TRAP_GID_IN_SERVICE => self.invalidate_gid(&gid, true, false),
                _ => {}
            }
        }
        self.pump(now);
    }

    /// The answer to an [`Output::SendSa`] GetTable (a token the resolver gave a half-world
    /// table, [`table`]), reassembled by the caller's SA channel: the whole `table`, or why
    /// there is none. A token that names nothing outstanding is counted in `sa_unknown` and
    /// dropped.
    pub fn handle_sa_table(
        &mut self,
        now: Millis,
        token: u64,
        table: Result<SaTable<'_>, table::TableError>,
    ) {
        let Some(slot) = table::table_of(&self.eps.slots, token) else {
            self.sh.stats.sa_unknown += 1;
            return;
        };
        let records = match table {
            Ok(t) => table::records(&t),
            Err(e) => {
                let off = matches!(e, table::TableError::TooBig | table::TableError::NotCarried);
                self.eps.slots[slot].table.failed(now, off, &mut self.sh);
                return self.pump(now);
            }
        };
        let Some(records) = records else {
            self.eps.slots[slot].table.failed(now, false, &mut self.sh);
            return self.pump(now);
        };
        let n = self.file_table(now, slot, records);
        self.sh.stats.sa_tables += 1;
        self.sh.stats.sa_table_records += u64::from(n);
        let cfg = &self.sh.cfg;
        self.eps.slots[slot].table.filed(now, n, cfg);
        self.pump(now);
    }

    /// Answers everything still waiting ENODATA and refuses all later requests (ENODATA).
    pub fn handle_shutdown(&mut self, now: Millis) {
        self.done = true;
        for slot in 0..self.eps.slots.len() {
            if self.eps.slots[slot].open {
                self.drop_endpoint_work(now, slot, Status::Enodata, true);
            }
        }
        for i in 0..self.addrs.entries.len() as u32 {
            if self.addrs.entries[i as usize].state != AddrState::Free {
                self.fail_addr_waiters(i, Status::Enodata);
            }
        }
        self.sh.timers.clear();
    }

    /// Drop and refusal counters.
    pub fn stats(&self) -> Stats {
        self.sh.stats
    }

    /// True if nothing is outstanding: no request waiting or unpolled, no SA query or ACM query
    /// in flight or queued.
    pub fn is_idle(&self) -> bool {
        self.routes.active == 0
            && self.addrs.active == 0
            && self.answers.waiting == 0
            && self.answers.fifo.is_empty()
    }

    /// Checks the resolver's internal bookkeeping against its slabs (counts, list
    /// memberships, the SA window), each part its own, and that every waiting request is on
    /// exactly one waiter list; for tests and simulations. O(slab size).
    #[doc(hidden)]
    #[cfg(feature = "std")]
    pub fn check_invariants(&self) -> Result<(), std::string::String> {
        use std::format;
        self.answers.check()?;
        if !self.done {
            self.sh.timers.check(Parts {
                routes: &self.routes,
                addrs: &self.addrs,
                eps: &self.eps.slots,
                cfg: &self.sh.cfg,
            })?;
        }
        let waiters = self.routes.check()? + self.addrs.check()?;
        if waiters != self.answers.waiting {
            return Err(format!(
                "waiters on lists {waiters}, waiting {}",
                self.answers.waiting
            ));
        }
        let (jobs, eps) = (&*self.routes.jobs, &*self.eps.slots);
        let mut backlogged = std::vec![0u32; eps.len()];
        for j in self.routes.backlog.iter(jobs, storage::JOB) {
            backlogged[usize::from(jobs[j as usize].slot)] += 1;
        }
        for (i, e) in eps.iter().enumerate() {
            if e.open && e.acm_inflight != e.inflight.len {
                return Err(format!(
                    "acm_inflight {} list {}",
                    e.acm_inflight, e.inflight.len
                ));
            }
            if e.table.backlogged != backlogged[i] {
                return Err(format!(
                    "endpoint slot {i}: {} jobs counted in the backlog, {} there",
                    e.table.backlogged, backlogged[i]
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_or_inconsistent_storage_is_refused() {
        let caps = Capacities {
            requests: 4,
            answer_reserve: 4,
            ..Capacities::default()
        };
        let st = HeapStorage::new(caps).into_slabs();
        assert!(st.requests.len() > 4, "HeapStorage keeps one waiter slot");
        use crate::cache::{AddrSlot, CacheConfig, PathSlot};
        let cache = PathCache::new(
            PathSlot::boxed(8),
            AddrSlot::boxed(8),
            CacheConfig::default(),
        )
        .unwrap();
        let mut tiny: ArrayStorage<2, 2, 1, 1, 1, 1> = ArrayStorage::new();
        let w = cache.writer().unwrap();
        assert_eq!(
            Resolver::new(Config::default(), &mut tiny, w, 0).err(),
            Some(Error::Storage)
        );
        let mut none: ArrayStorage<4, 1, 0, 1, 1, 1> = ArrayStorage::new();
        let w = cache.writer().unwrap();
        assert_eq!(
            Resolver::new(Config::default(), &mut none, w, 0).err(),
            Some(Error::Storage)
        );
    }
}
