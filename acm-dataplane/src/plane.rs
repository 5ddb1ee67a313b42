//! The dataplane loop: the one owner of the resolver, the endpoints' UD queue pairs and every
//! cache write.
//!
//! Each round ([`Poller::poll`]) drains, in bursts, the control messages and client requests
//! of the ibacm main thread and the SA replies of the core's SA thread (bounded lock-free
//! queues in an [`Inbox`]), the completion queues of the endpoints' UD QPs, and the
//! resolver's timers; it feeds them to the sans-IO [`Resolver`] and carries out the resolver's
//! outputs through two small traits:
//!
//! * [`CoreIo`]: what the ibacm core does for us (SA MADs, client answers, counters, logs);
//!   the plugin implements it over the core's helpers, tests over an in-memory fake;
//! * [`Ud`]: one endpoint's UD QP (verbs in production: [`crate::verbs::UdEndpoint`]; an
//!   in-memory network in tests).
//!
//! So the same loop runs over the core's SA service and verbs, and over in-memory fakes.

use crate::stats::{Clock, Latency, MissClass, MissStamp, Pending};
use crate::worker::{PollOutcome, Poller, Waker};
use acm_core_nostd::cache::{ep_generation, ep_number, AddrSlot, PathCache, PathSlot};
use acm_core_nostd::resolver::{
    AcmDest, Answer, Counter, EpConfig, EpId, HeapStorage, Kind, McGroup, Millis, Output, RecvMeta,
    Resolver, Stats, MAX_EPS, MSG_LEN,
};
use acm_core_nostd::sa_channel::{Expired, Received, SaChannel, SaEntry, SmAddr, TIMED_OUT};
use acm_core_nostd::wire::client::AcmMsg;
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::inform::NoticeRepr;
use acm_core_nostd::wire::mad::{self, Header, MgmtClass};
use acm_core_nostd::wire::sa::DATA_OFFSET as SA_DATA;
use crossbeam_queue::ArrayQueue;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The path cache on the host: heap (or huge-page) storage sized from the options.
pub type HostCache = PathCache<Box<[PathSlot]>, Box<[AddrSlot]>>;

/// How many queue entries one round takes from each source at most (bursts).
pub const BURST: usize = 64;

/// Received MADs taken from one endpoint's CQ per round at most (its poll budget is
/// `recv_depth + send_depth` completions; the buffer grows past this only if that is larger).
const RX_BURST: usize = 1024;

/// One endpoint's UD queue pair, as the loop uses it.
pub trait Ud: Send {
    /// Posts one MAD; `Err` with a reason when it cannot (no buffer, no group, verbs error).
    fn send(&mut self, to: &AcmDest, mad: &[u8; 256]) -> Result<(), String>;
    /// Hands every received MAD to `f`; returns the number of completions seen.
    fn poll(&mut self, f: &mut dyn FnMut(&RecvMeta, &[u8; 256])) -> usize;
    /// Attaches to a group (and makes its address handle).
    fn attach(&mut self, group: &McGroup) -> Result<(), String>;
    /// Detaches from a group.
    fn detach(&mut self, group: &McGroup);
    /// Arms completion events; the descriptor to wait on, if the QP has one.
    fn arm(&mut self) -> Option<RawFd>;
    /// Consumes pending completion events (non-blocking).
    fn ack_events(&mut self);
    /// What the QP dropped or repaired so far (logged by the loop as it changes).
    fn health(&self) -> UdHealth {
        UdHealth::default()
    }
    /// Where the port's SA is now (`None`: unknown; the endpoint's SA MADs then go through
    /// the core's service).
    fn sm_addr(&mut self) -> Option<SmAddr> {
        None
    }
}

/// Running totals of what a UD QP dropped or repaired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdHealth {
    /// Datagrams shorter than a MAD (dropped).
    pub short: u64,
    /// Receive completions in error.
    pub recv_errors: u64,
    /// Sends that failed (no buffer, no address handle, verbs error).
    pub send_errors: u64,
    /// Times the QP was recycled after entering the error state.
    pub qp_resets: u64,
    /// Times its receive queue starved (re-posts refused) and the QP was reset to refill it.
    pub rq_starved: u64,
}

/// What the ibacm core does for the loop.
pub trait CoreIo: Send + 'static {
    /// Sends an SA MAD for endpoint `ep`; false if it could not be sent (the query then fails
    /// at once).
    fn send_sa(&mut self, ep: EpId, token: u64, mad: &[u8; 256]) -> bool;
    /// Answers a client.
    fn answer(&mut self, answer: &Answer);
    /// Counts an event of endpoint `ep`.
    fn count(&mut self, ep: EpId, counter: Counter);
    /// Logs a line at `level` (0 = errors).
    fn log(&mut self, level: u8, text: &str);
    /// Whether `level` is logged (to skip formatting).
    fn log_enabled(&self, level: u8) -> bool;
}

/// Where the loop's latencies go (endpoint, histogram, ns); see [`Plane::with_stats`].
pub type LatencySink = Box<dyn FnMut(EpId, Latency, u64) + Send>;

/// A client request handed from the core's main thread.
pub struct Request {
    /// Endpoint it arrived on.
    pub ep: EpId,
    /// The endpoint's cache number at the time of the call
    /// ([`ep_number`]: flush generation, slot).
    pub cache_ep: u32,
    /// The core's client index.
    pub client: u64,
    /// Call kind.
    pub kind: Kind,
    /// Its place in the main thread's order of requests and control messages: the loop
    /// applies every control message with a smaller ticket first, and none with a larger one.
    pub ticket: u64,
    /// Valid length of `msg`.
    pub len: u16,
    /// A copy of the client message (the core's buffer dies when the call returns).
    pub msg: [u8; MSG_LEN],
    /// When a missed `resolve()` started, for its latency (`None`: not timed).
    pub stamp: Option<MissStamp>,
}

/// An SA completion copied out of the core's MAD on the SA thread.
pub struct SaReply {
    /// The token of the query.
    pub token: u64,
    /// `ib_user_mad.status` (nonzero = timeout / send failure).
    pub umad_status: u32,
    /// The MAD.
    pub mad: [u8; 256],
}

/// One address-preload entry (`addr_preload acm_hosts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostAddr {
    /// ACM address type (`ACM_ADDRESS_NAME` / `IP` / `IP6`).
    pub type_: u8,
    /// The address, zero-padded to 64 bytes.
    pub addr: [u8; 64],
    /// The port GID it maps to.
    pub gid: Gid,
}

/// Rare messages from the core's main thread, applied in order before later requests.
pub enum Control {
    /// An endpoint opened.
    Open {
        /// Its id.
        ep: EpId,
        /// Its cache number now.
        cache_ep: u32,
        /// What the resolver needs.
        cfg: EpConfig,
        /// Its UD QP (`None`: no verbs, SA-only endpoint).
        ud: Option<Box<dyn Ud>>,
        /// `route_preload`: paths that never expire.
        routes: Vec<[u8; 64]>,
        /// `addr_preload`: the hosts file, shared by every endpoint.
        addrs: Arc<Vec<HostAddr>>,
    },
    /// An endpoint closed: answer its requests, drop its state.
    Close(EpId),
    /// A local address was added.
    AddAddress {
        /// Endpoint.
        ep: EpId,
        /// Its cache number.
        cache_ep: u32,
        /// ACM address type.
        type_: u8,
        /// Zero-padded address.
        addr: [u8; 64],
    },
    /// A local address was removed.
    RemoveAddress {
        /// Endpoint.
        ep: EpId,
        /// ACM address type.
        type_: u8,
        /// Zero-padded address.
        addr: [u8; 64],
    },
    /// CLIENT_REREGISTER on the endpoint's port.
    Reregister(EpId),
    /// Answer everything and stop.
    Shutdown,
}

/// The queues into the loop (shared with the core's threads).
pub struct Inbox {
    /// Client requests (main thread → loop).
    pub requests: ArrayQueue<Request>,
    /// SA replies (SA thread → loop).
    pub replies: ArrayQueue<SaReply>,
    control: Mutex<VecDeque<(u64, u64, Control)>>,
    control_pushed: AtomicU64,
    /// One counter for requests and control messages, in the order the main thread (their
    /// only producer) queued them.
    tickets: AtomicU64,
    /// Set when the loop can no longer resolve anything (it still answers, with errors).
    stopped: AtomicBool,
    /// Times the loop gave up (its recovery from a panic panicked too).
    gave_up: AtomicU64,
    /// Times the loop replaced a resolver after a caught panic.
    restarts: AtomicU64,
    /// Control messages the loop has applied (their outputs carried out).
    control_applied: AtomicU64,
    /// Requests refused because the queue was full.
    pub overflows: AtomicU64,
    /// SA replies dropped because the reply queue was full.
    pub reply_drops: AtomicU64,
    /// Wakes the loop.
    pub waker: Waker,
}

impl Inbox {
    /// Queues of these capacities.
    pub fn new(requests: usize, replies: usize, waker: Waker) -> Self {
        Inbox {
            requests: ArrayQueue::new(requests.max(1)),
            replies: ArrayQueue::new(replies.max(1)),
            control: Mutex::new(VecDeque::new()),
            control_pushed: AtomicU64::new(0),
            tickets: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            gave_up: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            control_applied: AtomicU64::new(0),
            overflows: AtomicU64::new(0),
            reply_drops: AtomicU64::new(0),
            waker,
        }
    }

    /// Queues a control message and wakes the loop (main thread). Returns its sequence
    /// number: it has been applied once [`Inbox::controls_applied`] reaches it.
    pub fn control(&self, c: Control) -> u64 {
        let ticket = self.tickets.fetch_add(1, Ordering::AcqRel);
        let seq = self.control_pushed.fetch_add(1, Ordering::AcqRel) + 1;
        lock(&self.control).push_back((ticket, seq, c));
        self.waker.wake();
        seq
    }

    /// Whether the loop has given up resolving (after a failure it could not recover from)
    /// or its thread is gone: a request handed over now would not be answered, so
    /// [`Inbox::request`] refuses it and the caller answers it at once.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire) || self.waker.exited()
    }

    /// The loop's health: (resolvers replaced after a caught panic, times it gave up, whether
    /// its thread has exited).
    pub fn health(&self) -> (u64, u64, bool) {
        (
            self.restarts.load(Ordering::Relaxed),
            self.gave_up.load(Ordering::Relaxed),
            self.waker.exited(),
        )
    }

    /// How many control messages the loop has applied so far.
    pub fn controls_applied(&self) -> u64 {
        self.control_applied.load(Ordering::Acquire)
    }

    /// Hands a request to the loop; false if the queue is full (counted) or the loop is
    /// stopped ([`Inbox::is_stopped`]).
    pub fn request(&self, ep: EpId, cache_ep: u32, client: u64, kind: Kind, msg: &[u8]) -> bool {
        self.request_stamped(ep, cache_ep, client, kind, msg, None)
    }

    /// [`Inbox::request`] with the start of a missed `resolve()`, whose answer's latency the
    /// loop then records.
    pub fn request_stamped(
        &self,
        ep: EpId,
        cache_ep: u32,
        client: u64,
        kind: Kind,
        msg: &[u8],
        stamp: Option<MissStamp>,
    ) -> bool {
        if self.is_stopped() {
            return false;
        }
        let mut copy = [0u8; MSG_LEN];
        let n = msg.len().min(MSG_LEN);
        copy[..n].copy_from_slice(&msg[..n]);
        let r = Request {
            ep,
            cache_ep,
            client,
            kind,
            ticket: self.tickets.fetch_add(1, Ordering::AcqRel),
            len: n as u16,
            msg: copy,
            stamp,
        };
        match self.requests.push(r) {
            Ok(()) => {
                self.waker.wake();
                true
            }
            Err(_) => {
                self.overflows.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Hands an SA completion to the loop (SA thread); false if the queue was full.
    pub fn reply(&self, r: SaReply) -> bool {
        let ok = self.replies.push(r).is_ok();
        if !ok {
            self.reply_drops.fetch_add(1, Ordering::Relaxed);
        }
        self.waker.wake();
        ok
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the loop remembers of an open endpoint (to re-create the resolver after a panic).
struct EpRecord {
    cache_ep: u32,
    cfg: EpConfig,
    ud: Option<Box<dyn Ud>>,
    locals: Vec<(u8, [u8; 64])>,
    routes: Vec<[u8; 64]>,
    addrs: Arc<Vec<HostAddr>>,
    /// Where the port's SA is, as last read from the port (`ud` SA transport).
    sm: Option<SmAddr>,
}

/// The loop (see the module docs).
pub struct Plane<I: CoreIo> {
    resolver: Resolver<HeapStorage>,
    make_resolver: Box<dyn Fn() -> Option<Resolver<HeapStorage>> + Send>,
    cache: Arc<HostCache>,
    inbox: Arc<Inbox>,
    io: I,
    eps: Vec<Option<EpRecord>>,
    epoch: Instant,
    /// The time of the last round (the worker's clock, virtual offset included): what a
    /// recovery, which runs between rounds, goes by.
    last_now: Millis,
    controls_applied: u64,
    last_stats: Stats,
    /// Running totals of the QPs' drops, per endpoint, as last logged.
    last_health: Vec<UdHealth>,
    /// When drops were last logged (ms): at most one set of lines per second, so a remote
    /// node sending garbage cannot flood the core's log; every drop is counted anyway.
    last_drop_log: Millis,
    /// Class 3 MADs dropped because they did not come from the SM (its LID, QP 1) or a reply
    /// arrived on a QP that did not send the query (a forgery, or a confused peer).
    sa_forged: u64,
    /// [`Plane::sa_forged`] as last logged.
    sa_forged_logged: u64,
    /// A request taken from the queue and not yet known to the resolver or answered: if the
    /// resolver panics with it, `recover` answers it.
    in_hand: Option<Request>,
    /// A request taken from the queue that must wait for a control message queued before it.
    held: Option<Request>,
    /// Received MADs of one endpoint's burst (allocated once): each is given to the resolver
    /// and its outputs carried out before the next (the resolver's rule).
    rx: Vec<(RecvMeta, [u8; 256])>,
    /// No resolver any more (it could not be rebuilt after a panic): answer everything with
    /// ENODATA until the shutdown.
    dead: bool,
    done: bool,
    stats: Option<LoopStats>,
    /// SA MADs go out on the endpoints' UD QPs (`acmrs_sa_transport ud`).
    sa_ud: bool,
    /// The `ud` transport's outstanding SA requests.
    sa: SaChannel<Vec<SaEntry>>,
    /// [`SaChannel::expire`]'s work of one round (kept between rounds).
    sa_due: Vec<Expired>,
    /// When the endpoints' SM addresses are read again.
    next_sm_check: Millis,
}

/// How often the loop re-reads each port's SM LID (the core forwards no SM_CHANGE event).
pub const SM_CHECK_MS: Millis = 1000;

/// The loop's latency bookkeeping ([`Plane::with_stats`]).
struct LoopStats {
    clock: Clock,
    sink: LatencySink,
    /// Requests given to the resolver, by (client, tid): start, endpoint, route|address.
    misses: Pending<(EpId, MissClass)>,
    /// SA queries sent, by token: send time, endpoint.
    sa: Pending<EpId>,
}

impl LoopStats {
    /// Remembers `key` (dropping entries older than 10 min when full: answers that never came).
    fn remember<V: Copy>(clock: &Clock, p: &mut Pending<V>, key: u128, at: u64, v: V) {
        if !p.insert(key, at, v) {
            let stale = (600e9 * clock.ticks_per_ns()) as u64;
            p.expire(clock.now().saturating_sub(stale));
            let _ = p.insert(key, at, v);
        }
    }
}

/// The (client, tid) key of a client message.
fn client_key(client: u64, msg: &[u8]) -> u128 {
    let tid = msg
        .get(8..16)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_ne_bytes);
    (u128::from(client) << 64) | u128::from(tid)
}

impl<I: CoreIo> Plane<I> {
    /// A loop over `cache` and `inbox`, with a resolver from `make_resolver` (called again to
    /// start afresh after a caught panic). `None` from it is an error.
    pub fn new(
        make_resolver: Box<dyn Fn() -> Option<Resolver<HeapStorage>> + Send>,
        cache: Arc<HostCache>,
        inbox: Arc<Inbox>,
        io: I,
        epoch: Instant,
    ) -> Option<Self> {
        let resolver = make_resolver()?;
        Some(Plane {
            resolver,
            make_resolver,
            cache,
            inbox,
            io,
            eps: (0..MAX_EPS).map(|_| None).collect(),
            epoch,
            last_now: 0,
            controls_applied: 0,
            last_stats: Stats::default(),
            last_health: vec![UdHealth::default(); MAX_EPS],
            last_drop_log: 0,
            sa_forged: 0,
            sa_forged_logged: 0,
            in_hand: None,
            held: None,
            rx: Vec::with_capacity(RX_BURST),
            dead: false,
            done: false,
            stats: None,
            sa_ud: false,
            sa: SaChannel::new(Vec::new(), sa_tid_key()),
            sa_due: Vec::with_capacity(16),
            next_sm_check: 0,
        })
    }

    /// Records latencies into `sink`: of every stamped request from its stamp (`clock`) to
    /// its answer, and of every SA query from its send to its reply. The bookkeeping tables
    /// hold `capacity` entries each (the resolver's request capacity), allocated here.
    pub fn with_stats(mut self, clock: Clock, capacity: usize, sink: LatencySink) -> Self {
        self.stats = Some(LoopStats {
            clock,
            sink,
            misses: Pending::new(capacity),
            sa: Pending::new(capacity),
        });
        self
    }

    /// Sends SA MADs from each endpoint's UD QP to its port's SM (the `ud` transport) with
    /// room for `capacity` outstanding requests; endpoints without a QP or without a known SM
    /// still use the core's service.
    pub fn with_ud_sa(mut self, capacity: usize) -> Self {
        self.sa_ud = true;
        self.sa = SaChannel::new(vec![SaEntry::EMPTY; capacity], sa_tid_key());
        self
    }

    fn ms(&self, t: Instant) -> Millis {
        t.saturating_duration_since(self.epoch).as_millis() as Millis
    }

    /// The ticket of the next control message, if any.
    fn next_control(&self) -> Option<u64> {
        lock(&self.inbox.control).front().map(|(t, _, _)| *t)
    }

    /// Applies the next control message (false if there is none).
    fn apply_control(&mut self, now: Millis) -> bool {
        let c = lock(&self.inbox.control).pop_front();
        let Some((_, seq, c)) = c else {
            return false;
        };
        self.controls_applied = seq;
        if self.dead {
            // Nothing to resolve with: only the shutdown and the endpoints' QPs matter.
            match c {
                Control::Shutdown => self.done = true,
                Control::Close(ep) => self.eps[usize::from(ep.0)] = None,
                _ => {}
            }
        } else {
            self.apply(c, now);
            self.drain_outputs(now);
        }
        self.inbox.control_applied.store(seq, Ordering::Release);
        true
    }

    /// The next request or control message in the main thread's order (a request is held
    /// back while a control message queued before it waits): `Some(Some(request))`,
    /// `Some(None)` when a control message was applied, `None` when both queues are empty.
    fn next_input(&mut self, now: Millis) -> Option<Option<Request>> {
        let r = self.held.take().or_else(|| self.inbox.requests.pop());
        match (r, self.next_control()) {
            (Some(r), Some(t)) if t < r.ticket => {
                self.held = Some(r);
                self.apply_control(now);
                Some(None)
            }
            (Some(r), _) => Some(Some(r)),
            (None, Some(_)) => {
                self.apply_control(now);
                Some(None)
            }
            (None, None) => None,
        }
    }

    fn apply(&mut self, c: Control, now: Millis) {
        match c {
            Control::Open {
                ep,
                cache_ep,
                cfg,
                ud,
                routes,
                addrs,
            } => {
                let mut rec = EpRecord {
                    cache_ep,
                    cfg,
                    ud,
                    locals: Vec::new(),
                    routes,
                    addrs,
                    sm: None,
                };
                if self.sa_ud {
                    rec.sm = rec.ud.as_mut().and_then(|u| u.sm_addr());
                }
                self.open_in_resolver(ep, &rec, now);
                self.eps[usize::from(ep.0)] = Some(rec);
            }
            Control::Close(ep) => {
                self.resolver.close_endpoint(now, &self.cache, ep);
                self.drain_outputs(now);
                // The resolver forgot the endpoint's queries: their replies match nothing.
                self.sa.drop_endpoint(ep, |_, _| {});
                // Dropping the UD QP detaches and frees its verbs objects.
                self.eps[usize::from(ep.0)] = None;
            }
            Control::AddAddress {
                ep,
                cache_ep,
                type_,
                addr,
            } => {
                if let Some(rec) = self.eps[usize::from(ep.0)].as_mut() {
                    rec.cache_ep = cache_ep;
                    rec.locals.push((type_, addr));
                }
                if let Err(e) =
                    self.resolver
                        .add_address(now, &self.cache, ep, cache_ep, type_, &addr)
                {
                    self.io
                        .log(0, &format!("ERROR - add_address refused: {e:?}"));
                }
            }
            Control::RemoveAddress { ep, type_, addr } => {
                if let Some(rec) = self.eps[usize::from(ep.0)].as_mut() {
                    rec.locals.retain(|l| *l != (type_, addr));
                }
                self.resolver.remove_address(ep, type_, &addr);
                // The resolver drops the address's cache alias at its next timer run: now,
                // before any later request looks it up.
                self.resolver.handle_timeout(now, &self.cache);
            }
            Control::Reregister(ep) => {
                let Some(rec) = self.eps[usize::from(ep.0)].as_mut() else {
                    return;
                };
                // The main thread bumped the endpoint's flush generation when the event came:
                // from here on its requests carry the new cache number.
                rec.cache_ep = ep_number(ep_generation(rec.cache_ep).wrapping_add(1), ep.0);
                let cache_ep = rec.cache_ep;
                // Preloaded routes survive it: the resolver re-inserts them under the new
                // cache number, and rejoins the endpoint's groups.
                self.resolver.reregister(now, &self.cache, ep, cache_ep);
                if self.io.log_enabled(1) {
                    self.io.log(1, "client reregister: learned routes flushed");
                }
            }
            Control::Shutdown => {
                self.resolver.shutdown(now, &self.cache);
                self.drain_outputs(now);
                // Requests still queued get their one answer too.
                while let Some(r) = self.held.take().or_else(|| self.inbox.requests.pop()) {
                    self.answer_now(&r, u8::from(acm_core_nostd::wire::client::Status::Enodata));
                }
                for e in self.eps.iter_mut() {
                    *e = None;
                }
                if let Some(mut w) = self.cache.writer() {
                    w.clear();
                }
                self.sa.clear();
                self.done = true;
            }
        }
    }

    fn open_in_resolver(&mut self, ep: EpId, rec: &EpRecord, now: Millis) {
        if let Err(e) = self.resolver.open_endpoint(now, ep, rec.cfg) {
            self.io
                .log(0, &format!("ERROR - endpoint {} not opened: {e:?}", ep.0));
            return;
        }
        let (before, evictions) = (self.cache.len(), self.cache.stats().evictions);
        for p in &rec.routes {
            self.resolver
                .preload_route(now, &self.cache, ep, rec.cache_ep, p);
        }
        // What the preloads took (a route: two path entries, by DLID and by DGID).
        let paths = self.cache.len().saturating_sub(before);
        // A live entry evicted to make room (the cache is full): a preloaded route, or an
        // entry preloaded before, that is now asked of the SA, or lost where the SA does not
        // know it.
        let evicted = self.cache.stats().evictions - evictions;
        if evicted != 0 {
            self.io.log(
                0,
                &format!(
                    "ERROR - route preload: {evicted} live path entries evicted to make room: \
                     {} routes (2 path entries each) into a route cache of {} slots; raise \
                     acmrs_path_capacity",
                    rec.routes.len(),
                    self.cache.capacity()
                ),
            );
        }
        for h in rec.addrs.iter() {
            let _ = self
                .resolver
                .preload_address(now, ep, h.type_, &h.addr, h.gid);
        }
        for (t, a) in &rec.locals {
            let _ = self
                .resolver
                .add_address(now, &self.cache, ep, rec.cache_ep, *t, a);
        }
        if !rec.routes.is_empty() && self.io.log_enabled(1) {
            let n = rec.routes.len();
            self.io.log(
                1,
                &format!("{n} preloaded routes inserted: {paths} path entries"),
            );
        }
    }

    /// The SM address endpoint `ep`'s SA MADs go to over its UD QP, `None` when they go
    /// through the core (transport `core`, no QP, no SM known).
    fn ud_sa_route(&self, ep: EpId) -> Option<(usize, SmAddr)> {
        if !self.sa_ud {
            return None;
        }
        let i = carrier_of(&self.eps, ep)?;
        Some((i, self.eps[i].as_ref()?.sm?))
    }

    /// Sends `ep`'s SA MAD on the UD QP of endpoint `via` (its SA carrier) to `sm` (tracked
    /// for re-sends unless it is a response). False when it cannot be tracked (table full); a
    /// failed post is retried like a loss.
    fn send_sa_ud(
        &mut self,
        now: Millis,
        ep: EpId,
        via: usize,
        sm: SmAddr,
        token: u64,
        mad: &[u8; 256],
    ) -> bool {
        let Some(rec) = self.eps[via].as_mut() else {
            return false;
        };
        let per_try = self
            .resolver
            .config()
            .acm_timeout
            .saturating_add(rec.cfg.subnet_timeout_ms);
        let tries = self.resolver.config().sa_tries.max(1);
        let Some(wire) = self.sa.start(now, ep, token, mad, per_try, tries) else {
            self.io
                .log(0, "ERROR - SA request table full: query failed");
            return false;
        };
        if let Some(ud) = rec.ud.as_mut() {
            if let Err(e) = ud.send(&sm.dest(), &wire) {
                if self.io.log_enabled(1) {
                    self.io.log(1, &format!("SA send failed (retried): {e}"));
                }
            }
        }
        true
    }

    /// A class 3 MAD received on `ep`'s QP: a reply completes its request, anything else is
    /// offered to the resolver as a Report. Only the SM speaks class 3 to us: a MAD from
    /// another LID or QP is dropped (counted, logged), and so is a reply that arrives on a QP
    /// other than the one that carries the asking endpoint's SA MADs.
    fn sa_receive(&mut self, now: Millis, ep: EpId, meta: &RecvMeta, mad: &[u8; 256]) {
        let sm = self
            .eps
            .get(usize::from(ep.0))
            .and_then(|r| r.as_ref())
            .and_then(|r| r.sm);
        let eps = &self.eps;
        let on = usize::from(ep.0);
        let carries = |owner: EpId| carrier_of(eps, owner) == Some(on);
        let (token, mad) = match self.sa.receive(meta, sm, carries, mad) {
            Received::Reply { token, mad } => (token, mad),
            Received::Forged => {
                self.sa_forged += 1;
                return;
            }
            // Token 0 names nothing: the resolver counts (and the loop logs) an unknown reply.
            Received::Unknown => {
                self.resolver.handle_sa(now, &self.cache, 0, 0, mad);
                return;
            }
            Received::Report => {
                self.report(now, ep, mad);
                return;
            }
        };
        if let Some(s) = self.stats.as_mut() {
            if let Some((at, ep)) = s.sa.remove(u128::from(token)) {
                (s.sink)(ep, Latency::SaRtt, s.clock.since(at));
            }
        }
        self.resolver.handle_sa(now, &self.cache, token, 0, &mad);
    }

    /// A Report from the SM (trap 64/65): the resolver's, logged when it took it.
    fn report(&mut self, now: Millis, ep: EpId, mad: &[u8; 256]) {
        let before = self.resolver.stats();
        self.resolver.handle_report(now, &self.cache, ep, mad);
        let after = self.resolver.stats();
        if after.reports > before.reports && self.io.log_enabled(1) {
            // The resolver took it as a Report, so its Notice parses.
            let notice = NoticeRepr::parse_bytes(&mad[SA_DATA..]).ok();
            let trap = notice.map_or(0, |n| n.trap);
            let gid = notice.and_then(|n| n.subject_gid()).map_or(Gid::ZERO, Gid);
            self.io.log(
                1,
                &format!(
                    "SA Report: trap {trap} for {gid}: {} cache entries invalidated",
                    after.report_invalidated - before.report_invalidated
                ),
            );
        }
    }

    /// Re-sends or fails the `ud` transport's SA requests whose try ran out, and re-reads the
    /// ports' SM addresses when due (a new SM LID drops what was learned from the old fabric
    /// state and subscribes again, as a client reregister does).
    fn sa_timers(&mut self, now: Millis) {
        if self.sa.next_deadline().is_some_and(|t| t <= now) {
            // The loop's own buffer (as `rx`): no allocation per expiry round.
            let mut due = std::mem::take(&mut self.sa_due);
            self.sa.expire(now, |e| due.push(e));
            for e in due.drain(..) {
                match e {
                    Expired::Resend { ep, mad } => {
                        if let Some((via, sm)) = self.ud_sa_route(ep) {
                            if let Some(ud) = self.eps[via].as_mut().and_then(|r| r.ud.as_mut()) {
                                let _ = ud.send(&sm.dest(), &mad);
                            }
                        }
                    }
                    Expired::Failed { token, mad } => {
                        self.resolver
                            .handle_sa(now, &self.cache, token, TIMED_OUT, &mad);
                        self.drain_outputs(now);
                    }
                }
            }
            self.sa_due = due;
        }
        if !self.sa_ud || now < self.next_sm_check {
            return;
        }
        self.next_sm_check = now.saturating_add(SM_CHECK_MS);
        for i in 0..self.eps.len() {
            let Some(rec) = self.eps[i].as_mut() else {
                continue;
            };
            let Some(ud) = rec.ud.as_mut() else {
                continue;
            };
            let Some(sm) = ud.sm_addr() else {
                continue;
            };
            if rec.sm == Some(sm) {
                continue;
            }
            let old = rec.sm.replace(sm);
            let cache_ep = rec.cache_ep;
            if let Some(old) = old {
                self.io.log(
                    0,
                    &format!(
                        "SM LID changed {} -> {}: learned paths dropped, subscriptions renewed",
                        old.lid, sm.lid
                    ),
                );
                self.resolver
                    .reregister(now, &self.cache, EpId(i as u8), cache_ep);
                self.drain_outputs(now);
            }
        }
    }

    /// Shuts the resolver down, answering every request it holds (ENODATA, as at shutdown),
    /// its outputs carried out; a panic on the way is caught. Whether it all went through.
    fn answer_held(&mut self, now: Millis) -> bool {
        let cache = self.cache.clone();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.resolver.shutdown(now, &cache);
            self.drain_outputs(now);
        }))
        .is_ok()
    }

    /// The loop goes on without a resolver: what reaches it is answered ENODATA
    /// (`poll_dead`), and the inbox refuses new requests so the core's thread answers them.
    fn stop_resolving(&mut self) {
        self.dead = true;
        self.inbox.stopped.store(true, Ordering::Release);
    }

    /// Answers a request the resolver never saw (shutdown, no resolver) with `status`.
    fn answer_now(&mut self, r: &Request, status: u8) {
        let via = match r.kind {
            Kind::Resolve => acm_core_nostd::resolver::Via::Resolve,
            Kind::Query => acm_core_nostd::resolver::Via::Query,
            Kind::Prime | Kind::Refresh => return,
        };
        let mut msg = [0u8; MSG_LEN];
        let len = acm_core_nostd::resolver::request::respond(
            &r.msg[..usize::from(r.len)],
            via,
            status,
            None,
            &mut msg,
        );
        self.io.answer(&Answer {
            ep: r.ep,
            client: r.client,
            via,
            status,
            len,
            msg,
        });
    }

    /// Carries out every output the resolver has (a send that fails is reported back to the
    /// resolver, which may produce more outputs: loop until none are left).
    fn drain_outputs(&mut self, now: Millis) {
        while let Some(o) = self.resolver.poll_output() {
            match o {
                Output::SendSa { ep, token, mad } => {
                    let at = self.stats.as_ref().map(|s| s.clock.now());
                    let sent = match self.ud_sa_route(ep) {
                        Some((via, sm)) => self.send_sa_ud(now, ep, via, sm, token, &mad),
                        None => self.io.send_sa(ep, token, &mad),
                    };
                    if !sent {
                        self.resolver.handle_sa(now, &self.cache, token, 1, &[]);
                    } else if let (Some(s), Some(at)) = (self.stats.as_mut(), at) {
                        LoopStats::remember(&s.clock, &mut s.sa, u128::from(token), at, ep);
                    }
                }
                Output::SendAcm { ep, to, mad } => {
                    // A failed send is counted by the QP (`UdHealth::send_errors`) and logged
                    // by `log_drops` at most once a second: a flood of queries that uses up
                    // the send buffers must not turn into a line per answer.
                    if let Some(ud) = self.eps[usize::from(ep.0)]
                        .as_mut()
                        .and_then(|e| e.ud.as_mut())
                    {
                        let _ = ud.send(&to, &mad);
                    }
                }
                Output::Answer(a) => {
                    if self.in_hand.as_ref().is_some_and(|r| {
                        r.client == a.client
                            && AcmMsg::new_unchecked(&r.msg[..]).tid()
                                == AcmMsg::new_unchecked(&a.msg[..]).tid()
                    }) {
                        self.in_hand = None;
                    }
                    // A stamped request's latency runs up to the hand-off to the core; the
                    // bookkeeping waits until the client has its answer.
                    let end = self.stats.as_ref().map(|s| s.clock.now());
                    self.io.answer(&a);
                    if let (Some(s), Some(end)) = (self.stats.as_mut(), end) {
                        if let Some((at, (ep, class))) =
                            s.misses.remove(client_key(a.client, &a.msg))
                        {
                            (s.sink)(ep, class.latency(), s.clock.ns(at, end));
                        }
                    }
                }
                Output::Attach { ep, group } => {
                    let r = match self.eps[usize::from(ep.0)]
                        .as_mut()
                        .and_then(|e| e.ud.as_mut())
                    {
                        Some(ud) => ud.attach(&group),
                        None => Err("endpoint has no UD QP".into()),
                    };
                    match r {
                        Ok(()) => {
                            if self.io.log_enabled(1) {
                                self.io.log(
                                    1,
                                    &format!(
                                        "joined multicast group {} mlid 0x{:x}",
                                        group.index, group.mlid
                                    ),
                                );
                            }
                        }
                        Err(e) => self
                            .io
                            .log(0, &format!("ERROR - multicast attach failed: {e}")),
                    }
                }
                Output::Detach { ep, group } => {
                    if let Some(ud) = self.eps[usize::from(ep.0)]
                        .as_mut()
                        .and_then(|e| e.ud.as_mut())
                    {
                        ud.detach(&group);
                    }
                }
                Output::Count { ep, counter } => self.io.count(ep, counter),
            }
        }
    }

    /// Logs what the resolver and the QPs dropped since the last lines (reason, how many,
    /// running total), at most once a second.
    fn log_drops(&mut self, now: Millis) {
        if self.last_drop_log != 0 && now < self.last_drop_log.saturating_add(1000) {
            return;
        }
        for i in 0..self.eps.len() {
            let Some(h) = self.eps[i]
                .as_ref()
                .and_then(|e| e.ud.as_ref())
                .map(|u| u.health())
            else {
                continue;
            };
            let l = self.last_health[i];
            if h == l {
                continue;
            }
            for (name, now_v, before) in [
                ("datagram shorter than a MAD dropped", h.short, l.short),
                ("receive completion in error", h.recv_errors, l.recv_errors),
                ("ACM send failed", h.send_errors, l.send_errors),
                ("UD QP recycled after an error", h.qp_resets, l.qp_resets),
                (
                    "receive queue starved (re-posts refused): QP reset to refill it",
                    h.rq_starved,
                    l.rq_starved,
                ),
            ] {
                if now_v > before {
                    self.io.log(
                        0,
                        &format!(
                            "ERROR - endpoint {i}: {name}: {} (total {now_v})",
                            now_v - before
                        ),
                    );
                }
            }
            self.last_health[i] = h;
            self.last_drop_log = now.max(1);
        }
        if self.sa_forged != self.sa_forged_logged {
            self.io.log(
                0,
                &format!(
                    "ERROR - SA MAD not from the SM (its LID, QP 1) or not on the asking QP \
                     dropped: {} (total {})",
                    self.sa_forged - self.sa_forged_logged,
                    self.sa_forged
                ),
            );
            self.sa_forged_logged = self.sa_forged;
            self.last_drop_log = now.max(1);
        }
        let s = self.resolver.stats();
        if s == self.last_stats {
            return;
        }
        self.last_drop_log = now.max(1);
        let l = self.last_stats;
        for (name, now, before) in [
            (
                "malformed ACM MAD dropped",
                s.acm_malformed,
                l.acm_malformed,
            ),
            (
                "ACM response with no pending TID dropped",
                s.acm_unknown_tid,
                l.acm_unknown_tid,
            ),
            (
                "unsolicited ACM response dropped",
                s.acm_unsolicited,
                l.acm_unsolicited,
            ),
            (
                "ACM MAD from a foreign P_Key or without GRH dropped",
                s.acm_wrong_key,
                l.acm_wrong_key,
            ),
            ("unknown SA reply ignored", s.sa_unknown, l.sa_unknown),
            ("request refused, table full (ENOMEM)", s.full, l.full),
            (
                "malformed client request rejected (EINVAL)",
                s.malformed,
                l.malformed,
            ),
            ("query timed out (ETIMEDOUT)", s.timeouts, l.timeouts),
            (
                "ACM request with no group in common dropped",
                s.acm_no_group,
                l.acm_no_group,
            ),
            (
                "ACM request for an address of another partition's endpoint dropped",
                s.acm_other_partition,
                l.acm_other_partition,
            ),
            ("answer with no free slot lost", s.lost, l.lost),
            (
                "SA MAD neither a reply nor a valid Report dropped, or subscription refused",
                s.report_malformed,
                l.report_malformed,
            ),
        ] {
            if now > before {
                self.io.log(
                    0,
                    &format!("ERROR - {name}: {} (total {now})", now - before),
                );
            }
        }
        self.last_stats = s;
    }
}

impl<I: CoreIo> Plane<I> {
    /// A round without a resolver: control messages (the shutdown, closes) and every request
    /// answered ENODATA, SA replies and received MADs dropped.
    fn poll_dead(&mut self, now: Millis) -> PollOutcome {
        let mut did = false;
        for _ in 0..BURST {
            let Some(input) = self.next_input(now) else {
                break;
            };
            did = true;
            if let Some(r) = input {
                self.answer_now(&r, u8::from(acm_core_nostd::wire::client::Status::Enodata));
            }
            if self.done {
                while let Some(r) = self.held.take().or_else(|| self.inbox.requests.pop()) {
                    self.answer_now(&r, u8::from(acm_core_nostd::wire::client::Status::Enodata));
                }
                return PollOutcome::default();
            }
        }
        while self.inbox.replies.pop().is_some() {
            did = true;
        }
        for e in self.eps.iter_mut().flatten() {
            if let Some(ud) = e.ud.as_mut() {
                did |= ud.poll(&mut |_, _| {}) > 0;
            }
        }
        PollOutcome {
            did_work: did,
            next_deadline: None,
        }
    }
}

impl<I: CoreIo> Poller for Plane<I> {
    fn poll(&mut self, t: Instant) -> PollOutcome {
        let now = self.ms(t);
        self.last_now = now;
        if self.dead {
            return self.poll_dead(now);
        }
        let mut did = false;
        for _ in 0..BURST {
            let Some(r) = self.inbox.replies.pop() else {
                break;
            };
            did = true;
            if let Some(s) = self.stats.as_mut() {
                if let Some((at, ep)) = s.sa.remove(u128::from(r.token)) {
                    (s.sink)(ep, Latency::SaRtt, s.clock.since(at));
                }
            }
            self.resolver
                .handle_sa(now, &self.cache, r.token, r.umad_status, &r.mad);
            self.drain_outputs(now);
        }
        // Requests and control messages in the order the main thread queued them: a request
        // never sees an endpoint, address or generation the main thread changed after it, nor
        // misses one changed before it.
        for _ in 0..BURST {
            let Some(input) = self.next_input(now) else {
                break;
            };
            did = true;
            if self.done {
                if let Some(r) = input {
                    self.answer_now(&r, u8::from(acm_core_nostd::wire::client::Status::Enodata));
                }
                return PollOutcome::default();
            }
            let Some(r) = input else {
                continue;
            };
            if let (Some(s), Some(st), Kind::Resolve) = (self.stats.as_mut(), r.stamp, r.kind) {
                let key = client_key(r.client, &r.msg);
                LoopStats::remember(&s.clock, &mut s.misses, key, st.at, (r.ep, st.class));
            }
            // In hand until the resolver has it: a panic inside `request` must not lose it.
            let r = self.in_hand.insert(r);
            let (ep, cache_ep, client, kind, len) = (r.ep, r.cache_ep, r.client, r.kind, r.len);
            let msg = r.msg;
            self.resolver.request(
                now,
                &self.cache,
                ep,
                cache_ep,
                client,
                kind,
                &msg[..usize::from(len)],
            );
            self.in_hand = None;
            self.drain_outputs(now);
        }
        if self.done {
            return PollOutcome::default();
        }
        for i in 0..self.eps.len() {
            let Some(ud) = self.eps[i].as_mut().and_then(|e| e.ud.as_mut()) else {
                continue;
            };
            // The burst is copied out of the QP (its receive buffers are re-posted at once),
            // then each MAD is given to the resolver and its outputs carried out before the
            // next: a response the resolver owes a peer must go out before that peer's next
            // request can replace it.
            let mut rx = std::mem::take(&mut self.rx);
            rx.clear();
            ud.poll(&mut |m, b| rx.push((*m, *b)));
            for (m, b) in &rx {
                did = true;
                let class = Header::new_unchecked(&b[..mad::HEADER_LEN]).mgmt_class();
                if class == MgmtClass::SubnAdm {
                    self.sa_receive(now, EpId(i as u8), m, b);
                } else {
                    self.resolver
                        .handle_acm(now, &self.cache, EpId(i as u8), m, &b[..]);
                }
                self.drain_outputs(now);
            }
            self.rx = rx;
        }
        if self.resolver.poll_timeout().is_some_and(|at| at <= now) {
            did = true;
            self.resolver.handle_timeout(now, &self.cache);
            self.drain_outputs(now);
        }
        self.sa_timers(now);
        self.log_drops(now);
        let sm_check = self.sa_ud.then_some(self.next_sm_check);
        let next = [
            self.resolver.poll_timeout(),
            self.sa.next_deadline(),
            sm_check,
        ]
        .into_iter()
        .flatten()
        .min();
        PollOutcome {
            did_work: did,
            next_deadline: next.map(|at| self.epoch + std::time::Duration::from_millis(at)),
        }
    }

    fn finished(&self) -> bool {
        self.done
    }

    /// After a panic of [`Plane::recover`] itself: nothing of the loop's state is trusted.
    /// From now on it runs without a resolver (every request that still reaches it is
    /// answered ENODATA, and the inbox refuses new ones so the core's thread answers them at
    /// once); what the old resolver held is answered if that still works. Each step is
    /// guarded: a panic in one does not stop the next.
    fn give_up(&mut self) {
        use std::panic::{catch_unwind, AssertUnwindSafe};
        self.stop_resolving();
        self.inbox.gave_up.fetch_add(1, Ordering::Relaxed);
        let now = self.last_now;
        self.answer_held(now);
        if let Some(r) = self.in_hand.take() {
            let _ = catch_unwind(AssertUnwindSafe(|| {
                self.answer_now(&r, u8::from(acm_core_nostd::wire::client::Status::Enodata))
            }));
        }
        let _ = catch_unwind(AssertUnwindSafe(|| {
            self.io.log(
                0,
                "ERROR - acmrs dataplane recovery failed: every request is answered ENODATA \
                 from now on (restart ibacm)",
            )
        }));
    }

    /// After a caught panic: the resolver's state cannot be trusted, so it is answered out
    /// (every request it holds gets ENODATA once, as at shutdown, if that still works; the
    /// request that was in hand when it panicked too, unless that one was answered) and
    /// replaced by a fresh one with the same endpoints, addresses and preloads. If no fresh
    /// one can be had, the loop goes on without one, answering everything ENODATA.
    fn recover(&mut self, message: &str) {
        self.io.log(
            0,
            &format!("ERROR - acmrs dataplane panicked ({message}); restarting the resolver"),
        );
        let now = self.last_now;
        if !self.answer_held(now) {
            self.io.log(
                0,
                "ERROR - the resolver could not answer its requests after the panic",
            );
        }
        if let Some(r) = self.in_hand.take() {
            // Not answered by the shutdown above (drain_outputs clears it when its answer goes).
            self.answer_now(&r, u8::from(acm_core_nostd::wire::client::Status::Enodata));
        }
        if let Some(s) = self.stats.as_mut() {
            // What the old resolver held and did not answer will never be answered.
            s.misses.clear();
            s.sa.clear();
        }
        // The old resolver's tokens mean nothing to the new one.
        self.sa.clear();
        let fresh =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.make_resolver)()))
                .ok()
                .flatten();
        let Some(fresh) = fresh else {
            self.io.log(
                0,
                "ERROR - no new resolver: every request is answered ENODATA from now on",
            );
            self.stop_resolving();
            return;
        };
        self.resolver = fresh;
        self.inbox.restarts.fetch_add(1, Ordering::Relaxed);
        if let Some(mut w) = self.cache.writer() {
            w.clear();
        }
        let eps = std::mem::replace(&mut self.eps, (0..MAX_EPS).map(|_| None).collect());
        for (i, rec) in eps.into_iter().enumerate() {
            if let Some(rec) = rec {
                self.open_in_resolver(EpId(i as u8), &rec, now);
                self.eps[i] = Some(rec);
            }
        }
        self.drain_outputs(now);
    }

    fn prepare_block(&mut self, fds: &mut Vec<RawFd>) {
        for e in self.eps.iter_mut().flatten() {
            if let Some(fd) = e.ud.as_mut().and_then(|u| u.arm()) {
                fds.push(fd);
            }
        }
    }

    fn unblocked(&mut self) {
        for e in self.eps.iter_mut().flatten() {
            if let Some(ud) = e.ud.as_mut() {
                ud.ack_events();
            }
        }
    }
}

/// The verbs context type the plugin hands to [`crate::verbs::UdEndpoint::open`].
pub use rdma_sys::ibv_context as IbvContext;

impl Ud for crate::verbs::UdEndpoint {
    fn send(&mut self, to: &AcmDest, mad: &[u8; 256]) -> Result<(), String> {
        crate::verbs::UdEndpoint::send(self, to, mad).map_err(|e| e.to_string())
    }

    fn poll(&mut self, f: &mut dyn FnMut(&RecvMeta, &[u8; 256])) -> usize {
        crate::verbs::UdEndpoint::poll(self, |m, b| f(m, b))
    }

    fn attach(&mut self, group: &McGroup) -> Result<(), String> {
        crate::verbs::UdEndpoint::attach(self, group).map_err(|e| e.to_string())
    }

    fn detach(&mut self, group: &McGroup) {
        crate::verbs::UdEndpoint::detach(self, group)
    }

    fn arm(&mut self) -> Option<RawFd> {
        crate::verbs::UdEndpoint::arm(self).ok()?;
        Some(self.event_fd())
    }

    fn ack_events(&mut self) {
        while self.ack_event() {}
    }

    fn sm_addr(&mut self) -> Option<SmAddr> {
        crate::verbs::UdEndpoint::sm_addr(self).map(|(lid, sl)| SmAddr { lid, sl })
    }

    fn health(&self) -> UdHealth {
        let s = self.stats();
        UdHealth {
            short: s.recv_short,
            recv_errors: s.recv_errors,
            send_errors: s.send_errors + s.no_buffer,
            qp_resets: s.qp_resets,
            rq_starved: s.rq_starved,
        }
    }
}

/// The endpoint whose UD QP carries `ep`'s SA MADs: `ep` itself if its QP is on the port's SA
/// P_Key (`EpConfig::sa_pkey`), else an open endpoint of the same port (same GID 0) whose QP
/// is. The SM's port drops MADs of a partition it is not in, so an endpoint of another
/// partition cannot reach the SA on its own QP; with no carrier on the port, its MADs go
/// through the core's service. Replies come back on that QP and are matched to `ep`'s query
/// by the SA channel.
fn carrier_of(eps: &[Option<EpRecord>], ep: EpId) -> Option<usize> {
    let own = eps.get(usize::from(ep.0))?.as_ref()?;
    if own.cfg.sa_pkey && own.ud.is_some() {
        return Some(usize::from(ep.0));
    }
    let gid = own.cfg.port_gid;
    eps.iter().position(|r| {
        r.as_ref()
            .is_some_and(|r| r.cfg.sa_pkey && r.ud.is_some() && r.cfg.port_gid == gid)
    })
}

/// A random key for the SA channel's wire TIDs: two draws of std's randomly keyed hasher
/// (seeded from the OS's random source once per process).
fn sa_tid_key() -> [u64; 2] {
    use std::hash::BuildHasher;
    let s = std::collections::hash_map::RandomState::new();
    [s.hash_one(0x5a_u64), s.hash_one(0xa5_u64)]
}
