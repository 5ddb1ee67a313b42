//! The dataplane loop: the one owner of the node (the resolver and its SA transport), the
//! endpoints' UD queue pairs and every cache write.
//!
//! Each round ([`Poller::poll`]) drains, in bursts, the control messages and client requests
//! of the ibacm main thread and the SA replies of the core's SA thread (the queues of an
//! [`Inbox`]), the completion queues of the endpoints' UD QPs, and the node's timers; it feeds
//! them to the sans-IO [`Node`](acm_core_nostd::node::Node) (`acm_core_nostd::node`: the resolver, the `ud` SA channel,
//! the SA carriers, the SM addresses, the tries) and carries out the node's outputs through
//! two small traits:
//!
//! * [`CoreIo`]: what the ibacm core does for us (SA MADs, client answers, counters, logs);
//!   the plugin implements it over the core's helpers, tests over an in-memory fake;
//! * [`Ud`]: one endpoint's UD QP (verbs in production: [`crate::verbs::UdEndpoint`]; an
//!   in-memory network in tests).
//!
//! So the same loop runs over the core's SA service and verbs, and over in-memory fakes.
//!
//! The files of the loop:
//!
//! * `plane/mod.rs` (here): the two traits, [`Plane`] and its round ([`Poller::poll`]): the
//!   order of the inputs, control messages applied, the resolver's outputs carried out
//!   (`drain_outputs`);
//! * `plane/latency.rs`: the latency bookkeeping, hooks at fixed points of the round;
//! * `plane/eps.rs`: the endpoints, a slot per id and the list of open ones a round walks;
//! * `plane/inbox.rs`: the queues into the loop ([`Inbox`]) and what travels in them
//!   ([`Queued`], [`SaReply`], [`Control`], [`HostAddr`]);
//! * `plane/events.rs`: the node's events (`acm_core_nostd::node::Event`) as log lines;
//! * `plane/recovery.rs`: after a panic: the resolver answered out and replaced
//!   ([`Poller::recover`]), or the loop run on without one ([`Poller::give_up`]);
//! * `plane/drops.rs`: what the resolver and the QPs dropped, logged at most once a second;
//! * `plane/reply_due.rs`: when an SA reply is due (the worker keeps polling for it).

use crate::stats::{Clock, Latency};
use crate::worker::{PollOutcome, Poller};
use acm_core_nostd::cache::{AddrKind, AddrSlot, CacheEp, CacheWriter, PathCache, PathSlot};
use acm_core_nostd::node::{HeapNode, Output, SaConfig, Transport, Unsent};
use acm_core_nostd::resolver::{
    AcmDest, Answer, Counter, EpConfig, EpId, HeapStorage, Kind, McGroup, Millis, MsgBuf, RecvMeta,
    Resolver, Stats,
};
use acm_core_nostd::sa_channel::SmAddr;
use acm_core_nostd::wire::client::{AcmMsg, Status};
use std::fmt;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

mod drops;
mod eps;
mod events;
mod inbox;
mod latency;
mod recovery;
mod reply_due;

pub use inbox::{Control, HostAddr, Inbox, Queued, SaReply};

use eps::Eps;
use inbox::{lock, Carried};
use latency::Latencies;

/// The path cache on the host: heap (or huge-page) storage sized from the options.
pub type HostCache = PathCache<Box<[PathSlot]>, Box<[AddrSlot]>>;

/// The host cache's one writer, owning its handle: taken once when the loop is set up
/// (`CacheWriter::take`), then owned by the loop's resolver.
pub type HostWriter = CacheWriter<Arc<HostCache>>;

/// The loop's resolver: heap storage, the cache written through its [`HostWriter`].
pub type HostResolver = Resolver<HeapStorage, Arc<HostCache>>;

/// The loop's node: its resolver, and the `ud` transport's SA channel on the heap.
pub type HostNode = HeapNode<HeapStorage, Arc<HostCache>>;

/// Makes the loop's resolver around the cache's writer (again after a caught panic, with the
/// writer the old one gave back); `None` is an error (the writer is then dropped, and the loop
/// runs on without a resolver).
pub type MakeResolver = Box<dyn Fn(HostWriter) -> Option<HostResolver> + Send>;

/// How many queue entries one round takes from each source at most (bursts).
pub const BURST: usize = 64;

/// Received MADs taken from one endpoint's CQ per round at most (its poll budget is
/// `recv_depth + send_depth` completions; the buffer grows past this only if that is larger).
const RX_BURST: usize = 1024;

/// Counter bumps `drain_outputs` holds back at most (then they go at once).
const COUNTS_HELD: usize = 64;

/// One endpoint's UD queue pair, as the loop uses it.
pub trait Ud: Send {
    /// Posts one MAD; `Err` with the reason when it cannot (no buffer, no group, verbs error).
    fn send(&mut self, to: &AcmDest, mad: &[u8; 256]) -> Result<(), SendError>;
    /// Hands every received MAD to `f`; returns the number of completions seen.
    fn poll(&mut self, f: &mut dyn FnMut(&RecvMeta, &[u8; 256])) -> usize;
    /// Attaches to a group (and makes its address handle).
    fn attach(&mut self, group: &McGroup) -> Result<(), String>;
    /// Detaches from a group.
    fn detach(&mut self, group: &McGroup);
    /// Arms completion events; the descriptor to wait on, if the QP has one.
    fn arm(&mut self) -> Option<RawFd>;
    /// Consumes waiting completion events (non-blocking).
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

/// Why a [`Ud::send`] did not post a MAD (no allocation: a flood of failed sends must not
/// allocate: every variant is `Copy`). Never a blocking condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// Every send buffer is in flight (counted by the QP); poll and retry.
    NoBuffer,
    /// No attached group has this index.
    UnknownGroup(u8),
    /// Every cached unicast address handle is used by a send in flight.
    AhBusy,
    /// The QP is being reset after an error completion; poll and retry.
    Recovering,
    /// A verbs call failed (`ibv_create_ah`, `ibv_post_send`): its name and errno.
    Verbs(crate::verbs::VerbsError),
}

impl SendError {
    /// What the node makes of it ([`Node::handle_unsent`](acm_core_nostd::node::Node::handle_unsent)): a full QP is busy (its query
    /// goes again soon), anything else a failed post.
    pub fn unsent(&self) -> Unsent {
        match self {
            SendError::NoBuffer | SendError::AhBusy | SendError::Recovering => Unsent::Busy,
            SendError::UnknownGroup(_) | SendError::Verbs(_) => Unsent::Failed,
        }
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::NoBuffer => f.write_str("no free send buffer"),
            SendError::UnknownGroup(i) => write!(f, "multicast group {i} is not attached"),
            SendError::AhBusy => f.write_str("every cached address handle is in use"),
            SendError::Recovering => f.write_str("QP is being reset after an error"),
            SendError::Verbs(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendError::Verbs(e) => Some(e),
            _ => None,
        }
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
    /// Answers a client: `msg` holds the answer's message (its first `answer.len` bytes), built
    /// there by the node, handed on as it is (the core writes its ACK bit into it).
    fn answer(&mut self, answer: &Answer, msg: &mut MsgBuf);
    /// Counts an event of endpoint `ep`.
    fn count(&mut self, ep: EpId, counter: Counter);
    /// Logs a line at `level` (0 = errors).
    fn log(&mut self, level: u8, text: &str);
    /// Whether `level` is logged (to skip formatting).
    fn log_enabled(&self, level: u8) -> bool;
}

/// Where the loop's latencies go (endpoint, histogram, ns); see [`Plane::with_stats`].
pub type LatencySink = Box<dyn FnMut(EpId, Latency, u64) + Send>;

/// What the loop remembers of an open endpoint (to re-create the resolver after a panic).
struct EpRecord {
    cache_ep: CacheEp,
    cfg: EpConfig,
    ud: Option<Box<dyn Ud>>,
    locals: Vec<(AddrKind, [u8; 64])>,
    routes: Vec<[u8; 64]>,
    addrs: Arc<Vec<HostAddr>>,
    /// What its QP had dropped or repaired when the drop log last looked (plane/drops.rs).
    logged: UdHealth,
}

/// The loop (see the module docs).
pub struct Plane<I: CoreIo> {
    /// The node, whose resolver owns the cache's one writer (every cache write of the loop
    /// goes through it). `None` only after a failed recovery, when [`Plane::dead`] is set.
    node: Option<HostNode>,
    make_resolver: MakeResolver,
    inbox: Arc<Inbox>,
    io: I,
    eps: Eps,
    epoch: Instant,
    /// The time of the last round (the worker's clock, virtual offset included): what a
    /// recovery, which runs between rounds, goes by.
    last_now: Millis,
    controls_applied: u64,
    last_stats: Stats,
    /// When drops were last logged (ms): at most one set of lines per second, so a remote
    /// node sending garbage cannot flood the core's log; every drop is counted anyway.
    last_drop_log: Millis,
    /// The request the loop works on: the inbox's buffer it was written into, swapped for
    /// this one ([`Inbox::take_request_into`]), never copied; `current_is` says what it is.
    current: Box<Queued>,
    current_is: Current,
    /// The SA completion the loop works on, swapped in from the inbox
    /// ([`Inbox::take_reply_into`]).
    reply: Box<SaReply>,
    /// Received MADs of one endpoint's burst (allocated once): each is given to the resolver
    /// and its outputs carried out before the next (the resolver's rule).
    rx: Vec<(RecvMeta, [u8; 256])>,
    /// Counter bumps the resolver asked for, held while the outputs of one input are carried
    /// out: they go after its sends, before any answer (a client that has its answer sees the
    /// counts of its request), and at the end of the drain at the latest.
    counts: Vec<(EpId, Counter)>,
    /// No resolver any more (it could not be rebuilt after a panic): answer everything with
    /// ENODATA until the shutdown.
    dead: bool,
    done: bool,
    /// The latency bookkeeping (plane/latency.rs): its hooks are the round's only contact.
    lat: Latencies,
    /// When the received MAD the node works on was taken (clock ticks; with stats): where an
    /// SA reply's round trip ends ([`Output::QueryDone`]).
    rx_taken: Option<u64>,
    /// The SA queries out and their round trip: when a reply is due.
    reply_due: reply_due::ReplyDue,
    /// Poll rounds run (published to the inbox for the watchdog).
    rounds: u64,
    /// Where an answer's message is built (by the node's poll, or `Queued::answer`) and
    /// handed to the core from: the answer's one buffer on its way out.
    msg: Box<MsgBuf>,
}

impl<I: CoreIo> Plane<I> {
    /// A loop over the cache `writer` writes (its one writer, taken by the caller) and
    /// `inbox`, with a resolver from `make_resolver`, which owns the writer from then on
    /// (called again to start afresh after a caught panic, with the writer the old resolver
    /// gave back). `None` from it is an error.
    pub fn new(
        make_resolver: MakeResolver,
        writer: HostWriter,
        inbox: Arc<Inbox>,
        io: I,
        epoch: Instant,
    ) -> Option<Self> {
        let resolver = make_resolver(writer)?;
        let sa = SaConfig::default().on(Transport::Core);
        let node = HostNode::on_heap(resolver, sa, 0, 0, 0, sa_tid_key());
        Some(Plane {
            node: Some(node),
            make_resolver,
            inbox,
            io,
            eps: Eps::new(),
            epoch,
            last_now: 0,
            controls_applied: 0,
            last_stats: Stats::default(),
            last_drop_log: 0,
            current: Box::new(Queued::blank()),
            reply: Box::new(SaReply::blank()),
            current_is: Current::Free,
            rx: Vec::with_capacity(RX_BURST),
            counts: Vec::with_capacity(COUNTS_HELD),
            dead: false,
            done: false,
            lat: Latencies::off(),
            rx_taken: None,
            reply_due: reply_due::ReplyDue::new(),
            rounds: 0,
            msg: Box::new(MsgBuf::new()),
        })
    }

    /// Records latencies into `sink`: of every stamped request from its stamp (`clock`) to
    /// its answer, and of every SA query from its send to its reply. The bookkeeping tables
    /// hold `capacity` entries each (the resolver's request capacity), allocated here.
    pub fn with_stats(mut self, clock: Clock, capacity: usize, sink: LatencySink) -> Self {
        self.lat = Latencies::on(clock, capacity, sink);
        self
    }

    /// How many answered-to-be requests the latency bookkeeping remembers (tests).
    #[cfg(test)]
    pub(crate) fn misses_tracked(&self) -> usize {
        self.lat.misses_tracked()
    }

    /// The node: there is one whenever the loop is not [`dead`](Plane::dead) (only a failed
    /// recovery leaves it without one, and then nothing calls this).
    fn n(&mut self) -> &mut HostNode {
        self.node.as_mut().expect("a live loop has a node")
    }

    /// Sends SA MADs as `sa` says: with [`Transport::Ud`] from each endpoint's UD QP to its
    /// port's SM, with room for `capacity` outstanding requests (endpoints without a QP or
    /// without a known SM still use the core's service), and one half-world PathRecord table
    /// at a time of up to `table_records` records (0: none; the resolver then never gets a
    /// table and turns them off on the first try). Before any endpoint opens.
    pub fn with_sa(mut self, sa: SaConfig, capacity: usize, table_records: usize) -> Self {
        if let Some(node) = self.node.take() {
            let (resolver, _) = node.into_parts();
            let (capacity, tables) = match sa.transport {
                Transport::Ud => (capacity, usize::from(table_records != 0)),
                Transport::Core => (0, 0),
            };
            let key = sa_tid_key();
            let node = HostNode::on_heap(resolver, sa, capacity, tables, table_records, key);
            self.node = Some(node);
        }
        self
    }

    fn ms(&self, t: Instant) -> Millis {
        t.saturating_duration_since(self.epoch).as_millis() as Millis
    }

    /// The ticket of the next control message, if any. Without one queued (the count the main
    /// thread bumps before queueing is the count applied) the queue's lock is not taken: a
    /// round looks twice per round, and the lock's line would travel between the threads
    /// that run rounds.
    fn next_control(&self) -> Option<u64> {
        if self.inbox.controls_pushed() <= self.controls_applied {
            return None;
        }
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
                Control::Close(ep) => {
                    self.eps.remove(ep);
                }
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
    /// back while a control message queued before it waits): `Some(true)` when a request is
    /// in hand ([`Plane::current`]), `Some(false)` when a control message was applied, `None`
    /// when both queues are empty.
    fn next_input(&mut self, now: Millis) -> Option<bool> {
        debug_assert_ne!(
            self.current_is,
            Current::Taken,
            "a request in hand was left"
        );
        let request =
            self.current_is == Current::Held || self.inbox.take_request_into(&mut self.current);
        match (request, self.next_control()) {
            (true, Some(t)) if t < self.current.ticket => {
                self.current_is = Current::Held;
                self.apply_control(now);
                Some(false)
            }
            (true, _) => {
                self.current_is = Current::Taken;
                Some(true)
            }
            (false, Some(_)) => {
                self.apply_control(now);
                Some(false)
            }
            (false, None) => None,
        }
    }

    /// Answers the request in hand with `status` (the resolver never saw it: shutdown, no
    /// resolver) and frees the buffer.
    fn answer_current(&mut self, status: Status) {
        self.current_is = Current::Free;
        if let Some(a) = self.current.answer(status, &mut self.msg) {
            self.io.answer(&a, &mut self.msg);
        }
    }

    /// Answers ENODATA the request held for a control message and every one still queued
    /// (the loop's end).
    fn answer_queued(&mut self) {
        if self.current_is == Current::Held {
            self.answer_current(Status::Enodata);
        }
        while self.inbox.take_request_into(&mut self.current) {
            self.current_is = Current::Taken;
            self.answer_current(Status::Enodata);
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
                    // An endpoint without a UD QP has QPN 0, whatever the caller said.
                    cfg: EpConfig {
                        qpn: if ud.is_some() { cfg.qpn } else { 0 },
                        ..cfg
                    },
                    ud,
                    locals: Vec::new(),
                    routes,
                    addrs,
                    logged: UdHealth::default(),
                };
                self.open_in_resolver(ep, &mut rec, now);
                self.eps.put(ep, rec);
            }
            Control::Close(ep) => {
                self.n().handle_close(now, ep);
                self.drain_outputs(now);
                // Dropping the UD QP detaches and frees its verbs objects.
                self.eps.remove(ep);
            }
            Control::AddAddress {
                ep,
                cache_ep,
                kind,
                addr,
            } => {
                if let Some(rec) = self.eps.get_mut(ep) {
                    rec.cache_ep = cache_ep;
                    rec.locals.push((kind, addr));
                }
                if let Err(e) = self.n().handle_add_address(now, ep, cache_ep, kind, &addr) {
                    self.io
                        .log(0, &format!("ERROR - add_address refused: {e:?}"));
                }
            }
            Control::RemoveAddress { ep, kind, addr } => {
                if let Some(rec) = self.eps.get_mut(ep) {
                    rec.locals.retain(|l| *l != (kind, addr));
                }
                self.n().handle_remove_address(now, ep, kind, &addr);
                // The resolver drops the address's cache alias at its next timer run: now,
                // before any later request looks it up.
                self.n().handle_timeout(now);
            }
            Control::Reregister(ep) => {
                let Some(rec) = self.eps.get_mut(ep) else {
                    return;
                };
                // The main thread bumped the endpoint's flush generation when the event came:
                // from here on its requests carry the new cache number.
                rec.cache_ep = rec.cache_ep.next_generation();
                let cache_ep = rec.cache_ep;
                // Preloaded routes survive it: the resolver re-inserts them under the new
                // cache number, and rejoins the endpoint's groups.
                self.n().handle_reregister(now, ep, cache_ep);
                if self.io.log_enabled(1) {
                    self.io.log(1, "client reregister: learned routes flushed");
                }
            }
            Control::Shutdown => {
                self.n().handle_shutdown(now);
                self.drain_outputs(now);
                // Requests still queued get their one answer too.
                self.answer_queued();
                self.eps.take_all();
                self.n().clear();
                self.done = true;
            }
        }
    }

    fn open_in_resolver(&mut self, ep: EpId, rec: &mut EpRecord, now: Millis) {
        let sm = rec.ud.as_mut().and_then(|u| u.sm_addr());
        if let Err(e) = self.n().handle_open(now, ep, rec.cache_ep, rec.cfg, sm) {
            self.io
                .log(0, &format!("ERROR - endpoint {} not opened: {e:?}", ep.0));
            return;
        }
        let (before, evictions) = (
            self.n().resolver().cache().len(),
            self.n().resolver().cache().stats().evictions,
        );
        for p in &rec.routes {
            self.n().handle_preload_route(now, ep, rec.cache_ep, p);
        }
        // What the preloads took (a route: two path entries, by DLID and by DGID).
        let paths = self.n().resolver().cache().len().saturating_sub(before);
        // A live entry evicted to make room (the cache is full): a preloaded route, or an
        // entry preloaded before, that is now asked of the SA, or lost where the SA does not
        // know it.
        let evicted = self.n().resolver().cache().stats().evictions - evictions;
        if evicted != 0 {
            let capacity = self.n().resolver().cache().capacity();
            self.io.log(
                0,
                &format!(
                    "ERROR - route preload: {evicted} live path entries evicted to make room: \
                     {} routes (2 path entries each) into a route cache of {} slots; raise \
                     acmrs_path_capacity",
                    rec.routes.len(),
                    capacity
                ),
            );
        }
        for h in rec.addrs.iter() {
            let _ = self
                .n()
                .handle_preload_address(now, ep, h.kind, &h.addr, h.gid);
        }
        for (t, a) in &rec.locals {
            let _ = self.n().handle_add_address(now, ep, rec.cache_ep, *t, a);
        }
        if !rec.routes.is_empty() && self.io.log_enabled(1) {
            let n = rec.routes.len();
            self.io.log(
                1,
                &format!("{n} preloaded routes inserted: {paths} path entries"),
            );
        }
    }

    /// Query `token` completed (a reply or a whole table with `replied`; else a failure the
    /// core's SA service reported), the completion taken by the loop at `taken` (clock ticks;
    /// `None` without latency stats) after the core's SA thread handed it over at `handed`
    /// (0: not handed over, the `ud` transport). A reply's round trip goes to the reply-due
    /// estimate; with stats, the SA round trip and the hand-over's wait go to their
    /// histograms. Called once the completion's outputs are carried out, so that this is not
    /// on the way to its answers. Both transports.
    fn sa_done(&mut self, token: u64, replied: bool, taken: Option<u64>, handed: u64) {
        self.reply_due.done(token, Instant::now(), replied);
        self.lat.sa_done(token, replied, taken, handed);
    }

    /// SA query `token` left the `ud` transport (its carrier closed) to go on through the
    /// core's service: its sends there are not waited for, nor timed.
    fn query_moved(&mut self, token: u64) {
        self.reply_due.done(token, Instant::now(), false);
        self.lat.query_moved(token);
    }

    /// SA query `token` of endpoint `ep` went out at `at` (clock ticks, with stats): when its
    /// reply is due, and where its round trip starts.
    fn query_out(&mut self, token: u64, ep: EpId, at: Option<u64>) {
        self.reply_due.sent(token, Instant::now());
        self.lat.query_out(token, ep, at);
    }

    /// Bumps the counters held by `drain_outputs`.
    fn flush_counts(&mut self) {
        for (ep, counter) in self.counts.drain(..) {
            self.io.count(ep, counter);
        }
    }

    /// Carries out every output the node has (a send the core's service refuses is reported
    /// back to the node, which may produce more outputs: loop until none are left). Counter
    /// bumps go after the sends (`counts`): the resolver gives them first, and they are not on
    /// a miss's way to its query. Whether any output moved bytes or answered (an SM address
    /// read, a log line or a query's bookkeeping alone is not work for the worker's spin).
    fn drain_outputs(&mut self, now: Millis) -> bool {
        let mut acted = false;
        loop {
            // Looked at where the node returned it, not moved out of its `Option`: an output
            // is the size of its largest variant (a MAD's). An answer's message is built into
            // the loop's one message buffer, handed to the core from there.
            let node = self.node.as_mut().expect("a live loop has a node");
            let o = node.poll_output(now, &mut self.msg);
            let Some(o) = &o else {
                break;
            };
            acted |= !matches!(
                o,
                Output::ReadSm { .. } | Output::QueryDone { .. } | Output::Event(_)
            );
            match *o {
                Output::Transmit {
                    qp,
                    ref to,
                    ref mad,
                    query,
                } => {
                    let at = query.and(self.lat.now());
                    // A failed post is counted by the QP (`UdHealth::send_errors`) and logged
                    // by `log_drops` at most once a second (a flood that uses up the send
                    // buffers must not turn into a line per MAD); a query's goes back to the
                    // node with its reason, once; any other is a loss the tries cover.
                    let sent = self
                        .eps
                        .get_mut(qp)
                        .and_then(|e| e.ud.as_mut())
                        .map(|ud| ud.send(to, mad));
                    if let (Some(Err(e)), Some(token)) = (sent, query) {
                        self.n().handle_unsent(now, token, e.unsent());
                    }
                    match query {
                        Some(token) => self.query_out(token, qp, at),
                        None => self.lat.sent(),
                    }
                }
                Output::CoreSa {
                    ep,
                    token,
                    ref mad,
                    moved,
                } => {
                    if moved {
                        // Its sends on a QP that closed: what was kept of them goes.
                        self.query_moved(token);
                    }
                    let at = self.lat.now();
                    if self.io.send_sa(ep, token, mad) {
                        self.query_out(token, ep, at);
                    } else {
                        self.n().handle_unsent(now, token, Unsent::Refused);
                    }
                }
                Output::ReadSm { ep } => {
                    let Some(rec) = self.eps.get_mut(ep) else {
                        continue;
                    };
                    let sm = rec.ud.as_mut().and_then(|u| u.sm_addr());
                    let cache_ep = rec.cache_ep;
                    self.n().handle_sm(now, ep, cache_ep, sm);
                }
                Output::QueryDone { token, replied } => {
                    let taken = self.rx_taken;
                    self.sa_done(token, replied, taken, 0);
                }
                Output::Event(e) => self.log_event(e),
                Output::Answer(ref a) => {
                    self.flush_counts();
                    if self.current_is == Current::Taken
                        && self.current.head.client == a.client
                        && AcmMsg::new_unchecked(&self.current.msg[..]).tid()
                            == AcmMsg::new_unchecked(self.msg.message(a)).tid()
                    {
                        self.current_is = Current::Free;
                    }
                    // A stamped request's latency runs up to the hand-off to the core; the
                    // bookkeeping waits until the client has its answer.
                    let end = self.lat.now();
                    self.io.answer(a, &mut self.msg);
                    self.lat.answered(a, &self.msg, end);
                }
                Output::Attach { ep, ref group } => {
                    let r = match self.eps.get_mut(ep).and_then(|e| e.ud.as_mut()) {
                        Some(ud) => ud.attach(group),
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
                Output::Detach { ep, ref group } => {
                    if let Some(ud) = self.eps.get_mut(ep).and_then(|e| e.ud.as_mut()) {
                        ud.detach(group);
                    }
                }
                Output::Count { ep, counter } => {
                    if self.counts.len() == COUNTS_HELD {
                        self.flush_counts();
                    }
                    self.counts.push((ep, counter));
                }
            }
        }
        self.flush_counts();
        self.lat.drained();
        acted
    }
}

impl<I: CoreIo> Poller for Plane<I> {
    fn poll(&mut self, t: Instant) -> PollOutcome {
        let now = self.ms(t);
        self.last_now = now;
        // The watchdog's view of our progress: a plain store on a line only we write.
        self.rounds += 1;
        self.inbox.rounds.store(self.rounds, Ordering::Relaxed);
        if self.dead {
            return self.poll_dead(now);
        }
        let mut did = false;
        for _ in 0..BURST {
            if !self.inbox.take_reply_into(&mut self.reply) {
                break;
            }
            did = true;
            let taken = self.lat.reply_taken();
            let (node, r) = (
                self.node.as_mut().expect("a live loop has a node"),
                &self.reply,
            );
            node.handle_core_sa(now, r.token, r.umad_status, &r.mad);
            let (token, replied, handed) = (r.token, r.umad_status == 0, r.handed);
            self.drain_outputs(now);
            // The answers it led to are out: its bookkeeping follows, off their way.
            self.sa_done(token, replied, taken, handed);
        }
        // Requests and control messages in the order the main thread queued them: a request
        // never sees an endpoint, address or generation the main thread changed after it, nor
        // misses one changed before it.
        for _ in 0..BURST {
            let Some(request) = self.next_input(now) else {
                break;
            };
            did = true;
            if self.done {
                if request {
                    self.answer_current(Status::Enodata);
                }
                return PollOutcome::default();
            }
            if !request {
                continue;
            }
            // In hand until the resolver has it: a panic inside `request` must not lose it.
            // The resolver reads the message where it lies (two fields of the plane, borrowed
            // apart), not from a copy of its whole buffer.
            self.lat.request_taken(&self.current);
            let node = self.node.as_mut().expect("a live loop has a node");
            // Classified by the caller's front (`target`): not parsed again.
            node.handle_request(now, &self.current.request());
            self.current_is = Current::Free;
            self.drain_outputs(now);
            self.lat.request_given();
        }
        if self.done {
            return PollOutcome::default();
        }
        for k in 0..self.eps.count() {
            let Some((ep, rec)) = self.eps.nth_mut(k) else {
                break;
            };
            let Some(ud) = rec.ud.as_mut() else {
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
                // An SA reply's bookkeeping ([`Output::QueryDone`]) follows the answers it
                // led to, and its round trip ends here.
                self.rx_taken = self.lat.reply_taken();
                self.n().handle_receive(now, ep, m, b);
                self.drain_outputs(now);
                self.rx_taken = None;
            }
            self.rx = rx;
        }
        if self.n().poll_timeout().is_some_and(|at| at <= now) {
            self.n().handle_timeout(now);
            did |= self.drain_outputs(now);
        }
        self.log_drops(now);
        let next = self.n().poll_timeout();
        PollOutcome {
            did_work: did,
            next_deadline: next.map(|at| self.epoch + std::time::Duration::from_millis(at)),
            reply_due: self.reply_due.due(),
        }
    }

    fn finished(&self) -> bool {
        self.done
    }

    /// After a panic of `recover` itself: the loop runs on without a resolver (the inherent
    /// `Plane::give_up`, in plane/recovery.rs).
    fn give_up(&mut self) {
        Plane::give_up(self)
    }

    /// After a caught panic: what the resolver held is answered and a fresh one takes over
    /// (the inherent `Plane::recover`, in plane/recovery.rs).
    fn recover(&mut self, message: &str) {
        Plane::recover(self, message)
    }

    fn prepare_block(&mut self, fds: &mut Vec<RawFd>) {
        for e in self.eps.iter_mut() {
            if let Some(fd) = e.ud.as_mut().and_then(|u| u.arm()) {
                fds.push(fd);
            }
        }
    }

    fn unblocked(&mut self) {
        for e in self.eps.iter_mut() {
            if let Some(ud) = e.ud.as_mut() {
                ud.ack_events();
            }
        }
    }

    /// Requests, replies or control messages a round left in the inbox (beyond its burst),
    /// or a request held for a control message.
    fn waiting(&self) -> bool {
        self.current_is == Current::Held || self.inbox.waiting()
    }
}

/// What the loop's request buffer ([`Plane::current`]) holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Current {
    /// Nothing (what it holds was answered or is known to the resolver).
    Free,
    /// A request that waits for a control message queued before it.
    Held,
    /// A request not yet known to the resolver or answered: if the resolver panics with it,
    /// `recover` answers it.
    Taken,
}

/// A random key for the SA channel's wire TIDs: two draws of std's randomly keyed hasher
/// (seeded from the OS's random source once per process).
fn sa_tid_key() -> [u64; 2] {
    use std::hash::BuildHasher;
    let st = std::collections::hash_map::RandomState::new();
    [st.hash_one(0x5a_u64), st.hash_one(0xa5_u64)]
}
