//! The resolver's own work per miss, on one hot thread: how long `Resolver` takes to turn a
//! missed PATH-by-LID request into its SA query, and the SA's reply into the client's answer,
//! with nothing else in the way (no threads, no queues, no core, no fabric).
//!
//! This is the compute floor under the provider's own time per miss (docs/bench.md, "The legs
//! inside acmrs"): the legs the live provider records add hand-overs between threads and the
//! cache lines a miss finds on another CPU.
//!
//! The resolver is built as the plugin builds it (default `Config`, the default capacities:
//! 4096 jobs, 4160 request slots) over a path cache of `--sizes` slots (default 4096, cache
//! resident, and 1 048 576, not). Each step is one miss to a LID not in the cache:
//!
//! * **request → SA query**: `Resolver::handle_request` + `poll_output` until the `SendSa`;
//! * **SA reply → answer**: `Resolver::handle_sa` with a GetResp carrying the path (as the SA
//!   sends it) + `poll_output` until the `Answer`; the path goes into the cache.
//!
//! The cache is emptied (`clear_cache`, not timed) every 1 500 misses, so every request misses
//! and the table never fills. Times are TSC reads (`acm_dataplane::stats::Clock`, the
//! provider's own clock).
//!
//! **`--node`**: the same steps through the `Node` the provider runs (`acm_core_nostd::node`,
//! the `ud` SA transport, the endpoint its own SA carrier with a known SM): the request's
//! `SendSa` becomes a `Transmit` with the SA channel's TID, and the reply comes in as a MAD
//! received from the SM's QP 1 (`Node::handle_receive`, matched by the channel). The
//! difference to the resolver's figures is what the node adds on a miss's way. Each step is
//! a function of its own (`Machine::request`, `Machine::reply`), so that callgrind counts its
//! instructions alone: `valgrind --tool=callgrind --toggle-collect='*as resolver::Machine>::*'
//! target/release/resolver --node --sizes 4096 --misses 2000`.
//!
//! **`--plane`**: the same steps through the dataplane's loop (`acm_dataplane::plane::Plane`,
//! the `ud` SA transport, latency stats on) over a fake QP whose SM answers and a fake core:
//! the request is handed over to the inbox (not timed), then one round takes it and posts its
//! query on the QP; the reply is put on the QP's receive queue, then one round takes it and
//! hands the answer to the core. The cache is flushed by a client reregister (untimed).
//!
//! **`--front classified|decided`**: each request comes as the provider's front hands it
//! over (made untimed, before the step): classified (`RequestHead::target`: the resolver
//! does not parse it again, but looks at the cache again), or classified and decided (also
//! the cache's writes after the front's lookup, `RequestHead::front_writes`: the front's miss
//! stands, the resolver does not look). The default, `none`, is a request the resolver
//! classifies and looks up itself.
//!
//! **`--evict-kib N`**: before each step, this thread writes a buffer of N KiB one cache line
//! at a time (not timed), so the step finds the resolver's lines out of its core's L1 and L2,
//! as a miss in the live provider finds them after ibsim, OpenSM and the other threads ran on
//! that CPU. The step's time is then its instructions plus its cold lines; the difference to
//! the hot run is what the lines cost.
//!
//! Usage: `cargo run --release -p acm-bench --bin resolver -- [--quick] [--out DIR]
//!         [--sizes 4096,1048576] [--misses N] [--evict-kib N] [--node | --plane]
//!         [--front none|classified|decided]`
//!
//! With `--out DIR`: `resolver_<step>_<slots>.hgrm` per step and cache size
//! (`node_…`, `plane_…` with `--node`, `--plane`; `…_evicted.hgrm` with `--evict-kib`).

use std::sync::Arc;
use std::time::Instant;

use std::os::fd::RawFd;
use std::sync::Mutex;

use acm_core_nostd::cache::{
    ep_number, AddrSlot, CacheConfig, CacheEp, CacheWriter, PathCache, PathSlot,
};
use acm_core_nostd::node::{self, SaConfig, Transport};
use acm_core_nostd::resolver::request::classify;
use acm_core_nostd::resolver::{
    AcmDest, Answer, Capacities, Config, Counter, EpConfig, EpId, HeapStorage, Kind, McGroup,
    Millis, MsgBuf, Output, RecvMeta, Request, Resolver,
};
use acm_core_nostd::sa_channel::SmAddr;
use acm_core_nostd::wire::client::{ClientRequest, PathQuery, Status};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::mad::MAD_LEN;
use acm_core_nostd::wire::path_record::PathRecord;
use acm_dataplane::plane::{
    Control, CoreIo, HostCache, HostNode, HostWriter, Inbox, Plane, SendError, Ud,
};
use acm_dataplane::stats::Clock;
use acm_dataplane::stats::{Latency, MissClass, MissStamp};
use acm_dataplane::worker::{Poller, Worker};
use acm_report::cli::{count, counts, List, RunOpts};
use acm_report::{LatencyHistogram, Table};
use clap::Parser;

/// The resolver's own work per miss on one hot thread: request -> SA query and SA reply ->
/// answer (docs/bench.md). --quick: the CI's smoke run (< 5 s).
#[derive(Parser)]
#[command(name = "resolver", version)]
struct Cli {
    #[command(flatten)]
    run: RunOpts,
    /// Path cache sizes in slots [default: 4096,1048576]
    #[arg(long, value_name = "N,N,...", value_parser = counts)]
    sizes: Option<List<usize>>,
    /// Timed misses per size [default: 300000; with --quick 30000; with --evict-kib 20000,
    /// with both 2000]
    #[arg(long, value_name = "N", value_parser = count)]
    misses: Option<usize>,
    /// Before each step, write a buffer of this many KiB (not timed): the step finds the
    /// resolver's lines out of this core's caches
    #[arg(long, value_name = "KiB", value_parser = count)]
    evict_kib: Option<usize>,
    /// The same steps through the node (the resolver and its `ud` SA transport), as the
    /// provider runs them
    #[arg(long, conflicts_with = "plane")]
    node: bool,
    /// The same steps through the dataplane's loop (the node, the inbox, the latency
    /// bookkeeping) over a fake QP and core
    #[arg(long)]
    plane: bool,
    /// How much of the request the provider's front did before handing it over
    #[arg(long, value_enum, default_value_t = Handed::None)]
    front: Handed,
}

/// What the front hands over with a request (`--front`).
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Handed {
    /// The bare request: the resolver classifies it and looks at the cache.
    None,
    /// Classified: the resolver looks at the cache again.
    Classified,
    /// Classified, with the cache's writes after the front's lookup missed: the resolver
    /// does not look again.
    Decided,
}

/// Writes every cache line of `buf` once: what the step then reads comes from further out.
fn evict(buf: &mut [u8], round: u8) {
    for line in buf.chunks_mut(64) {
        line[0] = round;
    }
    std::hint::black_box(&*buf);
}

/// Misses between two cache clears: the distinct LIDs asked for in between.
const DISTINCT: u16 = 1_500;

/// The endpoint's port: LID 1, GID fe80::1.
fn port() -> EpConfig {
    EpConfig {
        port_gid: gid(1),
        lid: 1,
        pkey: 0xffff,
        mtu: 4,
        rate: 7,
        subnet_timeout_ms: 18,
        qpn: 0x100,
        sa_pkey: true,
    }
}

/// The port GID of the node with `lid`.
fn gid(lid: u16) -> Gid {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[14..].copy_from_slice(&lid.to_be_bytes());
    Gid(g)
}

/// The SA's GetResp to PathRecord GET `query` for `dlid`.
fn sa_reply(query: &[u8; MAD_LEN], dlid: u16) -> [u8; MAD_LEN] {
    let mut m = *query;
    m[3] = 0x81;
    let mut p = PathRecord::new_unchecked(&mut m[56..120]);
    p.set_dgid(gid(dlid));
    p.set_sgid(gid(1));
    p.set_dlid(dlid);
    p.set_slid(1);
    p.set_reversible_numpath(true, 1);
    p.set_pkey(0xffff);
    // MTU 4096, rate 100 Gb/s, packet lifetime: each with the "exactly" selector.
    m[56 + 54] = 0x85;
    m[56 + 55] = 0x90;
    m[56 + 56] = 0x92;
    m
}

struct Steps {
    request: LatencyHistogram,
    reply: LatencyHistogram,
}

/// The host path cache.
type Cache = HostCache;

/// The endpoint of the misses.
const EP: EpId = EpId(1);

/// The SM (its LID and SL) of the `--node` runs.
const SM: SmAddr = SmAddr { lid: 9, sl: 0 };

/// The received MAD's completion: from the SM's QP 1.
const FROM_SM: RecvMeta = RecvMeta {
    slid: SM.lid,
    src_qp: 1,
    sl: SM.sl,
    dlid_path_bits: 0,
    pkey_index: 0,
    ep_pkey_index: 0,
    grh_sgid: None,
};

/// What the two steps drive: the resolver alone, the node around it (`--node`), or the
/// dataplane's loop around that (`--plane`).
trait Machine {
    /// The cache number the next request carries.
    fn cache_ep(&self) -> CacheEp {
        ep_number(0, EP.0)
    }
    /// The path cache's writes, as the front reads them after its lookup.
    fn writes(&self) -> u32;
    /// Before step 1, not timed: what the request's way needs before the machine has it.
    fn prepare(&mut self, _req: &Request<'_>) {}
    /// Step 1: `req` given at `now` and the outputs drained (an answer's message built into
    /// `msg`); the SA query (its token and MAD as it would leave) it led to.
    fn request(
        &mut self,
        now: Millis,
        req: &Request<'_>,
        msg: &mut MsgBuf,
    ) -> Option<(u64, [u8; MAD_LEN])>;
    /// Step 2: the SA's `reply` to query `token` given and the outputs drained (an answer's
    /// message built into `msg`, as the loop builds it into its buffer); the answers with
    /// success to `client`.
    fn reply(
        &mut self,
        now: Millis,
        token: u64,
        reply: &[u8; MAD_LEN],
        client: u64,
        msg: &mut MsgBuf,
    ) -> usize;
    /// Empties the path cache (not timed).
    fn clear_cache(&mut self);
}

impl Machine for Resolver<HeapStorage, Arc<Cache>> {
    #[inline(never)]
    fn request(
        &mut self,
        now: Millis,
        req: &Request<'_>,
        msg: &mut MsgBuf,
    ) -> Option<(u64, [u8; MAD_LEN])> {
        self.handle_request(now, req);
        let mut query = None;
        while let Some(o) = self.poll_output(msg) {
            if let Output::SendSa { token, mad, .. } = o {
                query = Some((token, mad));
            }
        }
        query
    }

    #[inline(never)]
    fn reply(
        &mut self,
        now: Millis,
        token: u64,
        reply: &[u8; MAD_LEN],
        client: u64,
        msg: &mut MsgBuf,
    ) -> usize {
        self.handle_sa(now, token, 0, reply);
        let mut answered = 0;
        while let Some(o) = self.poll_output(msg) {
            if let Output::Answer(a) = o {
                answered += usize::from(a.client == client && a.status == Status::Success);
            }
        }
        answered
    }

    fn clear_cache(&mut self) {
        Resolver::clear_cache(self);
    }

    fn writes(&self) -> u32 {
        self.cache().writes()
    }
}

impl Machine for HostNode {
    #[inline(never)]
    fn request(
        &mut self,
        now: Millis,
        req: &Request<'_>,
        msg: &mut MsgBuf,
    ) -> Option<(u64, [u8; MAD_LEN])> {
        self.handle_request(now, req);
        let mut query = None;
        while let Some(o) = self.poll_output(now, msg) {
            if let node::Output::Transmit {
                mad,
                query: Some(token),
                ..
            } = o
            {
                query = Some((token, mad));
            }
        }
        query
    }

    #[inline(never)]
    fn reply(
        &mut self,
        now: Millis,
        _token: u64,
        reply: &[u8; MAD_LEN],
        client: u64,
        msg: &mut MsgBuf,
    ) -> usize {
        self.handle_receive(now, EP, &FROM_SM, reply);
        let mut answered = 0;
        while let Some(o) = self.poll_output(now, msg) {
            if let node::Output::Answer(a) = o {
                answered += usize::from(a.client == client && a.status == Status::Success);
            }
        }
        answered
    }

    fn clear_cache(&mut self) {
        HostNode::clear_cache(self);
    }

    fn writes(&self) -> u32 {
        self.resolver().cache().writes()
    }
}

/// The one writer of a path cache of `slots` slots.
fn writer(slots: usize) -> Result<HostWriter, String> {
    Ok(writer_and_cache(slots)?.0)
}

/// [`writer`], and the cache it writes (the front's handle).
fn writer_and_cache(slots: usize) -> Result<(HostWriter, Arc<Cache>), String> {
    let cache = PathCache::new(
        PathSlot::boxed(slots),
        AddrSlot::boxed(4096),
        CacheConfig::default(),
    )
    .map_err(|e| format!("cache: {e:?}"))?;
    let cache = Arc::new(cache);
    let w = CacheWriter::take(Arc::clone(&cache)).map_err(|_| "a second writer".to_string())?;
    Ok((w, cache))
}

/// The resolver as the plugin builds it around `writer`, its endpoint not open yet.
fn resolver_of(writer: HostWriter) -> Result<Resolver<HeapStorage, Arc<Cache>>, String> {
    let caps = Capacities {
        requests: 4096 + 64,
        jobs: 4096,
        ..Capacities::default()
    };
    Resolver::new(Config::default(), HeapStorage::new(caps), writer, 7)
        .map_err(|e| format!("resolver: {e:?}"))
}

/// The resolver over a path cache of `slots` slots, its endpoint not open yet.
fn new_resolver(slots: usize) -> Result<Resolver<HeapStorage, Arc<Cache>>, String> {
    resolver_of(writer(slots)?)
}

/// The resolver alone, its endpoint open.
fn resolver(slots: usize) -> Result<Resolver<HeapStorage, Arc<Cache>>, String> {
    let mut r = new_resolver(slots)?;
    r.handle_open(0, EP, ep_number(0, EP.0), port())
        .map_err(|e| format!("open: {e:?}"))?;
    while r.poll_output(&mut MsgBuf::new()).is_some() {}
    Ok(r)
}

/// The resolver in a node on the `ud` transport, as the plugin's loop has it (room for every
/// job's query and one half-world table), its endpoint open and carrying its own SA MADs to
/// `SM`.
fn node(slots: usize) -> Result<HostNode, String> {
    let r = new_resolver(slots)?;
    let sa = SaConfig::default().on(Transport::Ud);
    let mut n = HostNode::on_heap(r, sa, 4096 + 8, 1, slots.min(8192), [0x5a, 0xa5]);
    n.handle_open(0, EP, ep_number(0, EP.0), port(), Some(SM))
        .map_err(|e| format!("open: {e:?}"))?;
    while n.poll_output(0, &mut MsgBuf::new()).is_some() {}
    Ok(n)
}

/// What the fake QP of `--plane` saw: every MAD posted, and the MADs it delivers next.
#[derive(Default)]
struct Wire {
    sent: Vec<[u8; MAD_LEN]>,
    delivered: Vec<[u8; MAD_LEN]>,
}

/// The endpoint's UD QP of `--plane`: posts go to `Wire::sent`, and its CQ hands out
/// `Wire::delivered` as from the SM's QP 1.
struct FakeQp(Arc<Mutex<Wire>>);

impl Ud for FakeQp {
    fn send(&mut self, _to: &AcmDest, mad: &[u8; MAD_LEN]) -> Result<(), SendError> {
        lock(&self.0).sent.push(*mad);
        Ok(())
    }

    fn poll(&mut self, f: &mut dyn FnMut(&RecvMeta, &[u8; MAD_LEN])) -> usize {
        let delivered = std::mem::take(&mut lock(&self.0).delivered);
        for m in &delivered {
            f(&FROM_SM, m);
        }
        delivered.len()
    }

    fn sm_addr(&mut self) -> Option<SmAddr> {
        Some(SM)
    }

    // The loop's group of the endpoint (its join is never answered here) and its blocking
    // wait (the rounds are driven by hand): nothing to do.
    fn attach(&mut self, _group: &McGroup) -> Result<(), String> {
        Ok(())
    }

    fn detach(&mut self, _group: &McGroup) {}

    fn ack_events(&mut self) {}

    fn arm(&mut self) -> Option<RawFd> {
        None
    }
}

/// The ibacm core of `--plane`: keeps the answers (client, status); no SA service (`ud`).
struct FakeCore(Arc<Mutex<Vec<(u64, Status)>>>);

impl CoreIo for FakeCore {
    fn send_sa(&mut self, _ep: EpId, _token: u64, _mad: &[u8; MAD_LEN]) -> bool {
        false
    }

    fn answer(&mut self, a: &Answer, _msg: &mut MsgBuf) {
        lock(&self.0).push((a.client, a.status));
    }

    fn count(&mut self, _ep: EpId, _counter: Counter) {}

    fn log(&mut self, _level: u8, _text: &str) {}

    fn log_enabled(&self, _level: u8) -> bool {
        false
    }
}

/// The lock of a fake (a panic in a step fails the run anyway).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The dataplane's loop of `--plane` and what its fakes saw.
struct Loop {
    plane: Plane<FakeCore>,
    inbox: Arc<Inbox>,
    wire: Arc<Mutex<Wire>>,
    answers: Arc<Mutex<Vec<(u64, Status)>>>,
    clock: Clock,
    /// The time every round runs at (the loop's timers never come due).
    at: Instant,
    cache_ep: CacheEp,
    /// The path cache, as the front reads it.
    cache: Arc<Cache>,
}

impl Machine for Loop {
    fn cache_ep(&self) -> CacheEp {
        self.cache_ep
    }

    fn writes(&self) -> u32 {
        self.cache.writes()
    }

    fn prepare(&mut self, req: &Request<'_>) {
        let now = self.clock.now();
        let stamp = MissStamp {
            at: now,
            handed: now,
            class: MissClass::Route,
        };
        lock(&self.wire).sent.clear();
        let _ = self.inbox.hand_over(req, Some(stamp));
    }

    #[inline(never)]
    fn request(
        &mut self,
        _now: Millis,
        _req: &Request<'_>,
        _msg: &mut MsgBuf,
    ) -> Option<(u64, [u8; MAD_LEN])> {
        let _ = self.plane.poll(self.at);
        let sent = lock(&self.wire).sent.pop()?;
        // A PathRecord query (its token is the loop's: the reply finds it by its TID).
        (sent[16..18] == [0x00, 0x35]).then_some((0, sent))
    }

    #[inline(never)]
    fn reply(
        &mut self,
        _now: Millis,
        _token: u64,
        reply: &[u8; MAD_LEN],
        client: u64,
        _msg: &mut MsgBuf,
    ) -> usize {
        lock(&self.wire).delivered.push(*reply);
        let _ = self.plane.poll(self.at);
        let answers = std::mem::take(&mut *lock(&self.answers));
        answers
            .iter()
            .filter(|&&(c, st)| c == client && st == Status::Success)
            .count()
    }

    fn clear_cache(&mut self) {
        // A client reregister flushes the endpoint's learned routes; its requests carry the
        // next cache number from then on.
        self.inbox.control(Control::Reregister(EP));
        self.cache_ep = self.cache_ep.next_generation();
        let _ = self.plane.poll(self.at);
        lock(&self.wire).sent.clear();
    }
}

/// The dataplane's loop as the plugin sets it up for the `ud` transport (latency stats on),
/// over a path cache of `slots` slots, its endpoint open on a fake QP whose SM is `SM`.
fn plane(slots: usize, clock: Clock) -> Result<Loop, String> {
    let waker = Worker::new_waker();
    let inbox = Arc::new(Inbox::new(64, 64, waker.clone()));
    let answers = Arc::default();
    let wire: Arc<Mutex<Wire>> = Arc::default();
    let make = Box::new(|w: HostWriter| resolver_of(w).ok());
    let epoch = waker.epoch();
    let (writer, cache) = writer_and_cache(slots)?;
    let plane = Plane::new(
        make,
        writer,
        inbox.clone(),
        FakeCore(Arc::clone(&answers)),
        epoch,
    )
    .ok_or("the loop's resolver")?
    .with_sa(
        SaConfig::default().on(Transport::Ud),
        4096 + 8,
        slots.min(8192),
    )
    .with_stats(clock, 4096, Box::new(|_: EpId, _: Latency, _: u64| {}));
    let cache_ep = ep_number(0, EP.0);
    inbox.control(Control::Open {
        ep: EP,
        cache_ep,
        cfg: port(),
        ud: Some(Box::new(FakeQp(Arc::clone(&wire)))),
        routes: Vec::new(),
        addrs: Arc::new(Vec::new()),
    });
    let mut l = Loop {
        plane,
        inbox,
        wire,
        answers,
        clock,
        at: epoch + std::time::Duration::from_millis(10),
        cache_ep,
        cache,
    };
    for _ in 0..4 {
        let _ = l.plane.poll(l.at);
    }
    Ok(l)
}

/// `misses` misses through `m`, each step timed.
fn run(
    m: &mut impl Machine,
    misses: usize,
    clock: &Clock,
    evict_kib: usize,
    front: Handed,
) -> Result<Steps, String> {
    let mut junk = vec![0u8; evict_kib * 1024];
    // The caller's one message buffer, as the loop has it.
    let mut out = Box::new(MsgBuf::new());
    let mut steps = Steps {
        request: LatencyHistogram::new(),
        reply: LatencyHistogram::new(),
    };
    for i in 0..misses {
        let k = (i % usize::from(DISTINCT)) as u16;
        if k == 0 {
            m.clear_cache();
        }
        let dlid = 2 + k;
        let tid = i as u64 + 1;
        let msg = ClientRequest::path(tid, 0, &PathQuery::lid(dlid));
        let mut req = Request::new(EP, m.cache_ep(), tid, Kind::Resolve, msg.bytes());
        if front != Handed::None {
            // What the provider's front made of it before handing it over (not timed).
            let view = port().view(req.head.cache_ep);
            req.head.target = Some(classify(&view, msg.bytes()));
            req.head.front_writes = (front == Handed::Decided).then(|| m.writes());
        }
        m.prepare(&req);
        evict(&mut junk, i as u8);
        let t0 = clock.now();
        let query = m.request(1, &req, &mut out);
        let t1 = clock.now();
        let (token, mad) = query.ok_or_else(|| format!("miss {i} (LID {dlid}): no SA query"))?;
        let reply = sa_reply(&mad, dlid);
        evict(&mut junk, i as u8);
        let t2 = clock.now();
        let answered = m.reply(1, token, &reply, tid, &mut out);
        let t3 = clock.now();
        if answered != 1 {
            return Err(format!("miss {i} (LID {dlid}): {answered} answers"));
        }
        steps.request.record_ps(clock.ns(t0, t1) * 1000, 1);
        steps.reply.record_ps(clock.ns(t2, t3) * 1000, 1);
    }
    Ok(steps)
}

fn main() {
    let args: Cli = acm_report::cli::parse(2);
    let sizes = args
        .sizes
        .map(|l| l.0)
        .unwrap_or_else(|| vec![4096, 1 << 20]);
    let evict_kib = args.evict_kib.unwrap_or(0);
    let misses = args
        .misses
        .unwrap_or(match (args.run.quick, evict_kib > 0) {
            (false, false) => 300_000,
            (true, false) => 30_000,
            (false, true) => 20_000,
            (true, true) => 2_000,
        });
    args.run.create_out_or_exit();
    if cfg!(debug_assertions) {
        eprintln!("note: debug build; run with --release for meaningful numbers");
    }
    let clock = Clock::calibrated();
    let t0 = Instant::now();
    let mut t = Table::new(&[
        "step",
        "cache slots",
        "misses",
        "p50 ns",
        "p99 ns",
        "p99.9 ns",
        "p99.99 ns",
        "max ns",
    ]);
    let what = match (args.node, args.plane) {
        (true, _) => "node",
        (_, true) => "plane",
        _ => "resolver",
    };
    for &slots in &sizes {
        acm_report::progress(format_args!(
            "{misses} misses over a cache of {slots} slots ..."
        ));
        let steps = match (args.node, args.plane) {
            (false, false) => {
                resolver(slots).and_then(|mut r| run(&mut r, misses, &clock, evict_kib, args.front))
            }
            (true, _) => {
                node(slots).and_then(|mut n| run(&mut n, misses, &clock, evict_kib, args.front))
            }
            (_, true) => plane(slots, clock)
                .and_then(|mut l| run(&mut l, misses, &clock, evict_kib, args.front)),
        };
        let steps = match steps {
            Ok(s) => s,
            Err(e) => {
                eprintln!("resolver: {e}");
                std::process::exit(1);
            }
        };
        for (name, tag, h) in [
            ("request -> SA query", "request", &steps.request),
            ("SA reply -> answer", "reply", &steps.reply),
        ] {
            let mut cells = vec![name.to_string(), slots.to_string(), misses.to_string()];
            cells.extend(Table::latency_cells(&h.summary()));
            t.row(cells);
            let cold = if evict_kib > 0 { "_evicted" } else { "" };
            if let Some(file) = args
                .run
                .out_file(&format!("{what}_{tag}_{slots}{cold}.hgrm"))
            {
                if let Err(e) = h.write_hgrm(&file) {
                    eprintln!("resolver: {e}");
                    std::process::exit(1);
                }
            }
        }
    }
    let how = match evict_kib {
        0 => "one hot thread".to_string(),
        k => format!("one thread, {k} KiB written before each step"),
    };
    let whose = match (args.node, args.plane) {
        (true, _) => "The node's (the resolver and its `ud` SA transport)",
        (_, true) => "The dataplane loop's (`ud`, over a fake QP and core)",
        _ => "The resolver's",
    };
    println!(
        "## {whose} own work per miss, {how} ({:.1} s)\n",
        t0.elapsed().as_secs_f64()
    );
    println!("{}", t.render());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every timed miss went out as one SA query and came back as one answer (`run` fails
    /// otherwise), across cache clears, on both a resident and a larger cache, with and
    /// without a buffer written before each step.
    #[test]
    fn every_miss_is_one_query_and_one_answer() {
        let clock = Clock::calibrated();
        let misses = 2 * usize::from(DISTINCT) + 7;
        let runs = [(4096, 0), (1 << 16, 0), (4096, 16)];
        let fronts = [Handed::None, Handed::Classified, Handed::Decided];
        for ((slots, evict_kib), front) in runs.into_iter().zip(fronts) {
            let mut r = resolver(slots).unwrap();
            let s = run(&mut r, misses, &clock, evict_kib, front).unwrap();
            assert_eq!(s.request.summary().count, 3007);
            assert_eq!(s.reply.summary().count, 3007);
        }
    }

    /// Through the node too: each miss one `Transmit` of a query, its reply (with the
    /// channel's TID) matched and answered once.
    #[test]
    fn through_the_node_every_miss_is_one_query_and_one_answer() {
        let clock = Clock::calibrated();
        let mut n = node(4096).unwrap();
        // The open's own queries (the group's join, the subscriptions) stay unanswered.
        let open = n.sa().len();
        let s = run(
            &mut n,
            2 * usize::from(DISTINCT) + 7,
            &clock,
            16,
            Handed::Decided,
        )
        .unwrap();
        assert_eq!(s.request.summary().count, 3007);
        assert_eq!(s.reply.summary().count, 3007);
        assert_eq!(
            n.sa().len(),
            open,
            "every miss's query completed by its reply"
        );
        assert_eq!(n.sa().unknown + n.sa().forged, 0);
    }

    /// Through the dataplane's loop: each miss one round to its query on the QP, one to its
    /// answer, across the reregisters that flush the cache.
    #[test]
    fn through_the_loop_every_miss_is_one_query_and_one_answer() {
        let clock = Clock::calibrated();
        let mut l = plane(4096, clock).unwrap();
        let s = run(
            &mut l,
            2 * usize::from(DISTINCT) + 7,
            &clock,
            16,
            Handed::Decided,
        )
        .unwrap();
        assert_eq!(s.request.summary().count, 3007);
        assert_eq!(s.reply.summary().count, 3007);
    }

    #[test]
    fn evict_writes_every_line_of_the_buffer() {
        let mut buf = vec![0u8; 64 * 5 + 10];
        evict(&mut buf, 9);
        let written: Vec<usize> = (0..buf.len()).filter(|&i| buf[i] == 9).collect();
        assert_eq!(written, [0, 64, 128, 192, 256, 320]);
    }
}
