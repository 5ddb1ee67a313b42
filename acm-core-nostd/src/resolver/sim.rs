//! A deterministic in-memory InfiniBand model to drive resolvers in virtual time (feature
//! `sim`, host only).
//!
//! [`Sim`] holds N nodes, each a [`Resolver`] with its own [`PathCache`] and one endpoint,
//! and models what sits around them:
//!
//! * a UD fabric: unicast ACM MADs go to the node with the destination LID, multicast ones to
//!   every node attached to the same group; each delivery may be lost, duplicated, delayed and
//!   so reordered ([`Faults`]);
//! * an SA: PathRecord GET answered from the nodes' LIDs and GIDs ("no record" for unknown
//!   ones), MCMemberRecord SET answered with an MLID per MGID; replies may be BUSY or never
//!   come (then the caller reports a umad timeout after [`Faults::sa_timeout`], as ibacm's
//!   core does);
//! * the caller's inline hit path (as the provider has it: a cache hit is answered without the
//!   resolver, a NODELAY miss is answered ENODATA and handed over as [`Kind::Prime`], a hit
//!   near expiry as [`Kind::Refresh`]).
//!
//! Optionally ([`SimConfig::sa_service`]) the SA is one server instead: a service rate, a
//! bounded FIFO that answers BUSY when full, one-way fabric latency and loss, and in front of
//! it the kernel MAD layer's per-send timeout and retransmissions (same TID) and the core's
//! `sa_depth` credits ([`SaService`]); PathRecord GETs then go through that model (the storm
//! simulator, `tools/storm`). [`SimConfig::scale`] makes every step cost O(nodes touched)
//! instead of O(nodes), for 10 000-node runs.
//!
//! Every client request gets a unique client id and TID; every answer is checked: exactly one
//! per Resolve/Query request, with its TID ([`Sim::violations`]). Everything is a function of
//! the seed ([`Rng`], splitmix64), so a failing schedule replays exactly.

use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::string::String;
use std::vec::Vec;
use std::{format, vec};

use super::front::{self, Front};
use super::request::{self, EpView};
use super::{
    AcmDest, Capacities, Config, Counter, EpConfig, EpId, HeapStorage, Kind, Millis, Output,
    RecvMeta, Request, Resolver, Stats, Via, MSG_LEN,
};
use crate::cache::{AddrKind, AddrSlot, CacheConfig, CacheWriter, Lookup, PathCache, PathSlot};
use crate::wire::client::Status;
use crate::wire::gid::Gid;
use crate::wire::path_record::PathRecord;
use std::sync::Arc;

/// splitmix64: a tiny deterministic PRNG.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        super::splitmix64(&mut self.0)
    }
    /// Uniform in `0..n` (0 if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u32) -> bool {
        self.below(1000) < u64::from(per_mille)
    }
}

/// What goes wrong on the fabric and at the SA (probabilities in per mille).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Faults {
    /// An ACM delivery is lost.
    pub loss: u32,
    /// An ACM delivery is duplicated.
    pub dup: u32,
    /// Delivery delay range (ms); a range wider than 0 reorders.
    pub delay_min: Millis,
    /// See `delay_min`.
    pub delay_max: Millis,
    /// An SA query is answered BUSY.
    pub sa_busy: u32,
    /// An SA query gets no reply (the caller reports a umad timeout after `sa_timeout`).
    pub sa_silent: u32,
    /// When the caller gives up on a silent SA query.
    pub sa_timeout: Millis,
    /// SA reply delay range (ms).
    pub sa_delay_max: Millis,
    /// An SA reply or ACM delivery has 1–4 random bytes overwritten (TID, status, fields).
    pub garbage: u32,
}

impl Faults {
    /// A perfect fabric with 1 ms deliveries.
    pub const NONE: Faults = Faults {
        loss: 0,
        dup: 0,
        delay_min: 1,
        delay_max: 1,
        sa_busy: 0,
        sa_silent: 0,
        sa_timeout: 6000,
        sa_delay_max: 1,
        garbage: 0,
    };
}

/// The SA as one server, and the MAD layer in front of it (see the [module docs](self)).
///
/// A PathRecord GET a node sends is held by the core until it has one of the port's
/// `core_sa_depth` credits (`acm_send_sa_mad`: a credit, else the FIFO `sa_wait`, released
/// when a MAD is received on the port), then sent by the kernel MAD layer: it reaches the SA
/// after `latency` unless lost (`loss`); without a reply within `umad_timeout` it is sent again
/// with the same TID, `umad_retries` times, then completed with a umad timeout. The SA serves
/// one query per `1 / rate` in arrival order; a query that finds `queue_cap` queries waiting
/// or in service is answered BUSY at once (no service time). It serves every query it
/// accepted, including those whose sender has given up (their replies are dropped by the MAD
/// layer, counted in [`SaServiceStats::late`]). Joins and other SA MADs keep the instant model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaService {
    /// PathRecords served per second.
    pub rate: u64,
    /// Queries the SA holds (waiting plus in service); one more is answered BUSY.
    pub queue_cap: usize,
    /// One-way fabric latency (ms), each way.
    pub latency: Millis,
    /// A MAD (query or reply) is lost, per mille.
    pub loss: u32,
    /// The MAD layer's per-send timeout (ms; the core's `timeout`).
    pub umad_timeout: Millis,
    /// The MAD layer's retransmissions (the core's `retries`).
    pub umad_retries: u32,
    /// The core's SA credits per port (`sa_depth`); `None` = unlimited (the resolver's own
    /// window is the only bound).
    pub core_sa_depth: Option<u32>,
}

impl SaService {
    /// 30 000 PathRecords/s, 10 000 queued, 1 ms each way, no loss, the core's MAD timeout and
    /// retries (2000 ms, 2), no core credit limit.
    pub const DEFAULT: SaService = SaService {
        rate: 30_000,
        queue_cap: 10_000,
        latency: 1,
        loss: 0,
        umad_timeout: 2000,
        umad_retries: 2,
        core_sa_depth: None,
    };
}

/// What the [`SaService`] model saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SaServiceStats {
    /// MADs the MAD layer put on the wire (first sends and retransmissions).
    pub sent: u64,
    /// Of `sent`, retransmissions after a umad timeout.
    pub retransmits: u64,
    /// MADs lost on the wire (either way).
    pub lost: u64,
    /// Queries the SA accepted and served.
    pub served: u64,
    /// Queries the SA answered BUSY.
    pub busy: u64,
    /// Most queries the SA held at once.
    pub peak_queue: usize,
    /// Sends completed with a umad timeout (retries exhausted).
    pub umad_timeouts: u64,
    /// Replies that reached a sender whose send had already completed (dropped).
    pub late: u64,
    /// Most sends the core held waiting for a credit, at once, on one node.
    pub peak_core_wait: usize,
    /// Queries served per virtual millisecond (index = the ms the service ended in).
    pub served_per_ms: Vec<u32>,
    /// Queries the SA accepted per (node, destination node) (`SimConfig::count_per_dest`;
    /// `u32::MAX` = a destination that is no node).
    pub per_dest: HashMap<(u32, u32), u32>,
    /// Most sends in the MAD layer (sent, not completed) of one node at once.
    pub peak_node_inflight: u32,
}

/// A send the MAD layer holds.
#[derive(Clone, Debug)]
struct UmadSend {
    mad: [u8; 256],
    attempt: u32,
}

/// How a [`Sim`] is built.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// Number of nodes (each with one endpoint, LID `i + 1`, name `node<i>`).
    pub nodes: usize,
    /// The seed of everything.
    pub seed: u64,
    /// Faults.
    pub faults: Faults,
    /// Resolver settings (the same on every node).
    pub resolver: Config,
    /// Resolver tables per node.
    pub caps: Capacities,
    /// Path cache slots per node.
    pub cache_slots: usize,
    /// Every port's active rate and MTU (`enum ibv_rate`, `enum ibv_mtu`).
    pub port_rate_mtu: (u8, u8),
    /// Odd nodes run at 40 Gb/s / MTU 4096 instead (a mixed fabric).
    pub mixed_ports: bool,
    /// The SA as one server with a rate and a queue (`None`: the instant model of [`Faults`]).
    pub sa_service: Option<SaService>,
    /// Steps touch only the nodes that had an input (a timer heap, a dirty list, answered
    /// requests forgotten); for large node counts. Results are the same as without.
    pub scale: bool,
    /// Check every touched resolver's bookkeeping after each step (off: [`Sim::check_all`]).
    pub checks: bool,
    /// Address-cache slots per node (`None`: `cache_slots`).
    pub addr_cache_slots: Option<usize>,
    /// Count the SA's accepted queries per (node, destination) ([`SaServiceStats::per_dest`]).
    pub count_per_dest: bool,
}

impl SimConfig {
    /// `nodes` nodes, small tables, no faults.
    pub fn new(nodes: usize, seed: u64) -> SimConfig {
        SimConfig {
            nodes,
            seed,
            faults: Faults::NONE,
            resolver: Config::default(),
            caps: Capacities {
                requests: 512,
                answer_reserve: 8,
                pending: 64,
                sa_inflight: 64,
                addrs: 64,
                endpoints: 2,
                preloads: 8,
            },
            cache_slots: 256,
            port_rate_mtu: (3, 4),
            mixed_ports: false,
            sa_service: None,
            scale: false,
            checks: true,
            addr_cache_slots: None,
            count_per_dest: false,
        }
    }
}

/// One answer a client got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimAnswer {
    /// The node that answered.
    pub node: usize,
    /// The client id of the request.
    pub client: u64,
    /// The ACM status.
    pub status: Status,
    /// The path (successful resolve answers).
    pub path: Option<[u8; 64]>,
    /// Answered by the caller's hit path (not the resolver).
    pub inline: bool,
    /// When (virtual ms).
    pub at: Millis,
}

/// A node's path cache (heap storage, as the host's).
pub type SimCache = PathCache<std::boxed::Box<[PathSlot]>, std::boxed::Box<[AddrSlot]>>;

/// One simulated node.
pub struct Node {
    /// Its resolver, the owner of its cache's writer.
    pub resolver: Resolver<HeapStorage, Arc<SimCache>>,
    /// Its path cache, as the hit path reads it.
    pub cache: Arc<SimCache>,
    /// Its endpoint configuration.
    pub ep_cfg: EpConfig,
    /// The endpoint is open.
    pub open: bool,
    /// The node answers on the fabric (false = a dead peer).
    pub alive: bool,
    /// The MGID its QP is attached to.
    pub attached: Option<Gid>,
    /// Flush generation (the bits above the slot id of its cache endpoint number).
    pub generation: u32,
    /// Counters from [`Output::Count`].
    pub counters: [u64; 7],
    /// Its name.
    pub name: String,
}

/// The endpoint id every node uses.
pub const EP: EpId = EpId(1);

impl Node {
    /// The node's cache endpoint number.
    pub fn cache_ep(&self) -> u32 {
        crate::cache::ep_number(self.generation, EP.0)
    }
    /// The node's resolver stats.
    pub fn stats(&self) -> Stats {
        self.resolver.stats()
    }
}

#[derive(Clone, Debug)]
enum Event {
    Acm {
        to: usize,
        meta: RecvMeta,
        mad: [u8; 256],
    },
    Sa {
        to: usize,
        token: u64,
        umad_status: u32,
        mad: [u8; 256],
    },
    /// A PathRecord GET reaches the SA server ([`SaService`]).
    SaArrive {
        from: usize,
        token: u64,
        mad: [u8; 256],
    },
    /// The SA server's reply reaches the sender's MAD layer.
    SaReply {
        to: usize,
        token: u64,
        mad: [u8; 256],
    },
    /// The MAD layer's timeout of one try of a send.
    UmadTimeout {
        from: usize,
        token: u64,
        attempt: u32,
    },
}

#[derive(Clone, Debug)]
struct Scheduled {
    at: Millis,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, o: &Self) -> core::cmp::Ordering {
        // Min-heap on (at, seq).
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// The simulation (see the [module docs](self)).
pub struct Sim {
    /// Virtual time (ms).
    pub now: Millis,
    /// The nodes.
    pub nodes: Vec<Node>,
    /// Faults in force (may be changed between steps).
    pub faults: Faults,
    /// The PRNG.
    pub rng: Rng,
    /// Every answer, in order.
    pub answers: Vec<SimAnswer>,
    /// Exactly-once violations found so far.
    pub violations: Vec<String>,
    /// SA PathRecord queries the SA model received.
    pub sa_queries: u64,
    /// ACM multicast requests sent, per node.
    pub acm_requests: Vec<u64>,
    /// Unicast ACM responses sent, per node.
    pub acm_responses: Vec<u64>,
    /// Peer requests delivered per (node) — including duplicates.
    pub delivered: u64,
    events: BinaryHeap<Scheduled>,
    seq: u64,
    next_client: u64,
    /// client → (node, tid, via, answers so far, expects an answer)
    requests: BTreeMap<u64, (usize, u64, Via, u32, bool)>,
    mlids: BTreeMap<[u8; 16], u16>,
    /// The SA server model, if any.
    pub sa_service: Option<SaService>,
    /// What it saw.
    pub sa_stats: SaServiceStats,
    scale: bool,
    checks: bool,
    count_per_dest: bool,
    dirty: Vec<usize>,
    is_dirty: Vec<bool>,
    timers: BinaryHeap<core::cmp::Reverse<(Millis, usize)>>,
    armed: Vec<Option<Millis>>,
    umad: HashMap<(usize, u64), UmadSend>,
    node_inflight: Vec<u32>,
    sa_fifo: VecDeque<u64>,
    sa_free_ns: u64,
    core_credits: Vec<u32>,
    core_wait: Vec<VecDeque<(u64, [u8; 256])>>,
}

/// The GID of node `i`.
pub fn node_gid(i: usize) -> Gid {
    Gid::from_parts(
        0xfe80_0000_0000_0000,
        0x0002_c903_0000_0000 | (i as u64 + 1),
    )
}

/// The LID of node `i`.
pub fn node_lid(i: usize) -> u16 {
    i as u16 + 1
}

/// A NUL-padded 64-byte name.
pub fn name_bytes(s: &str) -> [u8; 64] {
    let mut a = [0u8; 64];
    let n = s.len().min(64);
    a[..n].copy_from_slice(&s.as_bytes()[..n]);
    a
}

/// A RESOLVE request for a name (dest entry, plus a source entry if `src` is given).
pub fn name_msg(name: &str, src: Option<&str>, nodelay: bool, tid: u64) -> Vec<u8> {
    let mut entries: Vec<(u32, u16, [u8; 64])> =
        vec![(2 | if nodelay { 1 << 30 } else { 0 }, 1, name_bytes(name))];
    if let Some(s) = src {
        entries.push((1, 1, name_bytes(s)));
    }
    let data = [0, 1, 0];
    let mut m = msg(&entries, if src.is_some() { data } else { [0; 3] }, tid);
    if src.is_some() {
        m[3] = 1; // src_out: echo the source, as the core sets it
    }
    m
}

/// A RESOLVE PATH request by DLID.
pub fn lid_msg(lid: u16, nodelay: bool, tid: u64) -> Vec<u8> {
    let mut r = [0u8; 64];
    PathRecord::new_unchecked(&mut r[..]).set_dlid(lid);
    msg(&[(if nodelay { 1 << 30 } else { 0 }, 0x10, r)], [0; 3], tid)
}

/// A RESOLVE PATH request by DGID.
pub fn gid_msg(gid: Gid, nodelay: bool, tid: u64) -> Vec<u8> {
    let mut r = [0u8; 64];
    PathRecord::new_unchecked(&mut r[..]).set_dgid(gid);
    msg(&[(if nodelay { 1 << 30 } else { 0 }, 0x10, r)], [0; 3], tid)
}

/// A `query()` (QUERY_SA) PATH request by DLID.
pub fn query_msg(lid: u16, tid: u64) -> Vec<u8> {
    let mut r = [0u8; 64];
    PathRecord::new_unchecked(&mut r[..]).set_dlid(lid);
    msg(&[(1 << 31, 0x10, r)], [0; 3], tid)
}

fn msg(entries: &[(u32, u16, [u8; 64])], data: [u8; 3], tid: u64) -> Vec<u8> {
    let len = 16 + 72 * entries.len();
    let mut b = vec![0u8; len];
    b[0] = 1;
    b[1] = 1;
    b[3..6].copy_from_slice(&data);
    b[6..8].copy_from_slice(&(len as u16).to_ne_bytes());
    b[8..16].copy_from_slice(&tid.to_ne_bytes());
    for (i, (flags, t, info)) in entries.iter().enumerate() {
        let at = 16 + 72 * i;
        b[at..at + 4].copy_from_slice(&flags.to_ne_bytes());
        b[at + 4..at + 6].copy_from_slice(&t.to_ne_bytes());
        b[at + 8..at + 72].copy_from_slice(info);
    }
    b
}

impl Sim {
    /// Builds the nodes, opens their endpoints and adds each node's name as a local address.
    pub fn new(cfg: SimConfig) -> Sim {
        let mut rng = Rng(cfg.seed);
        let mut nodes = Vec::new();
        for i in 0..cfg.nodes {
            let cache = PathCache::new(
                PathSlot::boxed(cfg.cache_slots),
                AddrSlot::boxed(cfg.addr_cache_slots.unwrap_or(cfg.cache_slots)),
                CacheConfig {
                    seed: rng.next_u64(),
                    refresh_ahead: 5_000,
                },
            )
            .unwrap_or_else(|_| unreachable!("non-empty cache"));
            let cache = Arc::new(cache);
            let writer = CacheWriter::take(Arc::clone(&cache))
                .unwrap_or_else(|_| unreachable!("a new cache has no writer"));
            let resolver = Resolver::new(
                cfg.resolver,
                HeapStorage::new(cfg.caps),
                writer,
                rng.next_u64(),
            )
            .unwrap_or_else(|_| unreachable!("valid storage"));
            nodes.push(Node {
                resolver,
                cache,
                ep_cfg: EpConfig {
                    port_gid: node_gid(i),
                    lid: node_lid(i),
                    pkey: 0xffff,
                    mtu: if cfg.mixed_ports && i % 2 == 1 {
                        5
                    } else {
                        cfg.port_rate_mtu.1
                    },
                    rate: if cfg.mixed_ports && i % 2 == 1 {
                        7
                    } else {
                        cfg.port_rate_mtu.0
                    },
                    subnet_timeout_ms: 0,
                    qpn: 0x100 + i as u32,
                    sa_pkey: true,
                },
                open: false,
                alive: true,
                attached: None,
                generation: 0,
                counters: [0; 7],
                name: format!("node{i}"),
            });
        }
        let n = nodes.len();
        let mut sim = Sim {
            now: 0,
            nodes,
            faults: cfg.faults,
            rng,
            answers: Vec::new(),
            violations: Vec::new(),
            sa_queries: 0,
            acm_requests: vec![0; n],
            acm_responses: vec![0; n],
            delivered: 0,
            events: BinaryHeap::new(),
            seq: 0,
            next_client: 1,
            requests: BTreeMap::new(),
            mlids: BTreeMap::new(),
            sa_service: cfg.sa_service,
            sa_stats: SaServiceStats::default(),
            scale: cfg.scale,
            checks: cfg.checks,
            count_per_dest: cfg.count_per_dest,
            dirty: Vec::new(),
            is_dirty: vec![false; n],
            timers: BinaryHeap::new(),
            armed: vec![None; n],
            umad: HashMap::new(),
            node_inflight: vec![0; n],
            sa_fifo: VecDeque::new(),
            sa_free_ns: 0,
            core_credits: vec![cfg.sa_service.and_then(|s| s.core_sa_depth).unwrap_or(0); n],
            core_wait: vec![VecDeque::new(); n],
        };
        for i in 0..n {
            sim.open(i);
        }
        sim.pump();
        sim
    }

    /// Opens node `i`'s endpoint and adds its name.
    pub fn open(&mut self, i: usize) {
        let now = self.now;
        let node = &mut self.nodes[i];
        if node.open {
            return;
        }
        if node.resolver.open_endpoint(now, EP, node.ep_cfg).is_ok() {
            node.open = true;
            let cep = node.cache_ep();
            let name = name_bytes(&node.name);
            let _ = node
                .resolver
                .add_address(now, EP, cep, AddrKind::Name, &name);
        }
        self.touch(i);
        self.pump();
    }

    /// Closes node `i`'s endpoint (its waiters are answered ENODATA).
    pub fn close(&mut self, i: usize) {
        let now = self.now;
        let node = &mut self.nodes[i];
        if node.open {
            node.resolver.close_endpoint(now, EP);
            node.open = false;
        }
        self.touch(i);
        self.pump();
    }

    /// Preloads on node `i` what an `ibacm_hosts.data` listing every node's name would give.
    pub fn preload_hosts(&mut self, i: usize) {
        let now = self.now;
        let names: Vec<(String, Gid)> = (0..self.nodes.len())
            .map(|j| (self.nodes[j].name.clone(), node_gid(j)))
            .collect();
        let node = &mut self.nodes[i];
        for (n, g) in names {
            let _ = node
                .resolver
                .preload_address(now, EP, AddrKind::Name, &name_bytes(&n), g);
        }
        self.touch(i);
        self.pump();
    }

    /// Preloads on node `i` the route to every other node (what a `dump_pr` file gives).
    pub fn preload_routes(&mut self, i: usize) {
        let now = self.now;
        for j in 0..self.nodes.len() {
            if j == i {
                continue;
            }
            let Some(path) = self.path_for(i, &{
                let mut q = [0u8; 64];
                PathRecord::new_unchecked(&mut q[..]).set_dlid(node_lid(j));
                q
            }) else {
                continue;
            };
            let node = &mut self.nodes[i];
            let cep = node.cache_ep();
            node.resolver.preload_route(now, EP, cep, &path);
        }
        self.touch(i);
        self.pump();
    }

    /// Removes node `i`'s own name (the core's `remove_address`); `add_name` puts it back.
    pub fn remove_name(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let name = name_bytes(&node.name);
        node.resolver.remove_address(EP, AddrKind::Name, &name);
        self.touch(i);
        self.pump();
    }

    /// Adds node `i`'s own name again.
    pub fn add_name(&mut self, i: usize) {
        let now = self.now;
        let node = &mut self.nodes[i];
        let (name, cep) = (name_bytes(&node.name), node.cache_ep());
        let _ = node
            .resolver
            .add_address(now, EP, cep, AddrKind::Name, &name);
        self.touch(i);
        self.pump();
    }

    /// CLIENT_REREGISTER on node `i`: a new flush generation, then the resolver's reregister.
    pub fn reregister(&mut self, i: usize) {
        let now = self.now;
        let node = &mut self.nodes[i];
        node.generation = node.generation.wrapping_add(1);
        let cep = node.cache_ep();
        node.resolver.reregister(now, EP, cep);
        self.touch(i);
        self.pump();
    }

    /// A client request on node `i` (`kind` Resolve or Query), through the caller's hit path
    /// as the provider has it. Returns the client id.
    pub fn request(&mut self, i: usize, kind: Kind, make: impl FnOnce(u64) -> Vec<u8>) -> u64 {
        let client = self.next_client;
        self.next_client += 1;
        let tid = 0x5000_0000_0000 | client;
        let m = make(tid);
        let via = if kind == Kind::Query {
            Via::Query
        } else {
            Via::Resolve
        };
        self.requests.insert(client, (i, tid, via, 0, true));
        let now = self.now;
        let node = &mut self.nodes[i];
        let cep = node.cache_ep();
        if kind == Kind::Query || !node.open {
            node.resolver.request(now, EP, cep, client, kind, &m);
            self.touch(i);
            self.pump();
            return client;
        }
        let view = EpView {
            cache_ep: cep,
            port_gid: node.ep_cfg.port_gid,
            lid: node.ep_cfg.lid,
            pkey: node.ep_cfg.pkey,
        };
        // The provider's hit path: classify, look up, and the one front decision.
        let target = request::classify(&view, &m);
        let lookup = front::look(&*node.cache, &target, now, false);
        let (pass, answer) = match front::decide(&target, true, &lookup) {
            Front::Hit { refresh } => {
                let record = match lookup {
                    Lookup::Hit { record, .. } => Some(record),
                    _ => None,
                };
                (
                    refresh.then_some((0, Kind::Refresh)),
                    Some((Status::Success, record)),
                )
            }
            Front::Answer(status) => (None, Some((status, None))),
            Front::Prime => (Some((0, Kind::Prime)), Some((Status::Enodata, None))),
            Front::HandOver => (Some((client, Kind::Resolve)), None),
        };
        if let Some((status, path)) = answer {
            self.record_answer(i, client, tid, Via::Resolve, status, path, true);
        }
        if let Some((client, kind)) = pass {
            let node = &mut self.nodes[i];
            let r = Request {
                ep: EP,
                cache_ep: cep,
                client,
                kind,
                msg: &m,
            };
            node.resolver.request_classified(now, &r, &target);
        }
        self.touch(i);
        self.pump();
        client
    }

    #[allow(clippy::too_many_arguments)]
    fn record_answer(
        &mut self,
        node: usize,
        client: u64,
        tid: u64,
        via: Via,
        status: Status,
        path: Option<[u8; 64]>,
        inline: bool,
    ) {
        match self.requests.get_mut(&client) {
            Some(r) => {
                r.3 += 1;
                if r.3 > 1 {
                    self.violations
                        .push(format!("client {client}: answered {} times", r.3));
                }
                if r.0 != node || r.1 != tid || r.2 != via {
                    self.violations.push(format!(
                        "client {client}: answer on node {node} tid {tid:#x} {via:?}, asked on {} tid {:#x} {:?}",
                        r.0, r.1, r.2
                    ));
                }
                if self.scale {
                    // Forgotten once answered: a second answer is then "unknown client".
                    self.requests.remove(&client);
                }
            }
            None => self
                .violations
                .push(format!("answer for unknown client {client}")),
        }
        self.answers.push(SimAnswer {
            node,
            client,
            status,
            path,
            inline,
            at: self.now,
        });
    }

    /// Takes the answers recorded so far (a long run drains them as it goes).
    pub fn take_answers(&mut self) -> Vec<SimAnswer> {
        core::mem::take(&mut self.answers)
    }

    /// Node `i` had an input: in scale mode, drain it and re-arm its timer at the next pump.
    fn touch(&mut self, i: usize) {
        if self.scale && !self.is_dirty[i] {
            self.is_dirty[i] = true;
            self.dirty.push(i);
        }
    }

    /// Checks every resolver's bookkeeping now (violations are recorded).
    pub fn check_all(&mut self) {
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if let Err(e) = n.resolver.check_invariants() {
                self.violations
                    .push(format!("node {i} at {}: {e}", self.now));
            }
            if n.resolver.stats().lost > 0 {
                self.violations.push(format!("node {i}: answers lost"));
            }
        }
    }

    /// Sends the MAD layer holds for node `i` (sent, neither answered nor timed out).
    pub fn umad_inflight(&self, i: usize) -> u32 {
        self.node_inflight[i]
    }

    /// Sends the MAD layer holds, all nodes.
    pub fn umad_pending(&self) -> usize {
        self.umad.len()
    }

    fn pump_dirty(&mut self) {
        while !self.dirty.is_empty() {
            let d = core::mem::take(&mut self.dirty);
            for i in d {
                self.is_dirty[i] = false;
                while let Some(o) = self.nodes[i].resolver.poll_output() {
                    self.output(i, o);
                }
                let n = &mut self.nodes[i];
                if self.checks {
                    if let Err(e) = n.resolver.check_invariants() {
                        self.violations
                            .push(format!("node {i} at {}: {e}", self.now));
                    }
                }
                if n.resolver.stats().lost > 0 {
                    self.violations.push(format!("node {i}: answers lost"));
                }
                if let Some(t) = n.resolver.poll_timeout() {
                    if self.armed[i].is_none_or(|a| a != t) {
                        self.armed[i] = Some(t);
                        self.timers.push(core::cmp::Reverse((t, i)));
                    }
                }
            }
        }
    }

    /// When the next event or timer is due (with `scale`: from the timer heap, whose entries
    /// may be stale, i.e. early; [`run_due_timers`](Self::run_due_timers) skips those).
    fn next_step(&self) -> Option<Millis> {
        if !self.scale {
            return self.next_time();
        }
        let ev = self.events.peek().map(|e| e.at);
        let tm = self.timers.peek().map(|r| r.0 .0);
        match (ev, tm) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs every resolver timer due at `now` (with `scale`: only the nodes the heap names).
    fn run_due_timers(&mut self, now: Millis) {
        if !self.scale {
            for n in &mut self.nodes {
                if n.resolver.poll_timeout().is_some_and(|t| t <= now) {
                    n.resolver.handle_timeout(now);
                }
            }
            return;
        }
        while let Some(&core::cmp::Reverse((t, i))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            if self.armed[i] == Some(t) {
                self.armed[i] = None;
            }
            let n = &mut self.nodes[i];
            if n.resolver.poll_timeout().is_some_and(|t| t <= now) {
                n.resolver.handle_timeout(now);
            }
            self.touch(i);
            self.pump();
        }
    }

    /// Requests not answered yet.
    pub fn unanswered(&self) -> Vec<u64> {
        self.requests
            .iter()
            .filter(|(_, r)| r.4 && r.3 == 0)
            .map(|(c, _)| *c)
            .collect()
    }

    /// The answer of `client`, if any.
    pub fn answer_of(&self, client: u64) -> Option<SimAnswer> {
        self.answers.iter().find(|a| a.client == client).copied()
    }

    fn schedule(&mut self, delay: Millis, event: Event) {
        self.seq += 1;
        self.events.push(Scheduled {
            at: self.now + delay,
            seq: self.seq,
            event,
        });
    }

    fn delay(&mut self) -> Millis {
        let f = self.faults;
        f.delay_min + self.rng.below(f.delay_max.saturating_sub(f.delay_min) + 1)
    }

    /// Drains every node's outputs (and what they cause at once) until all are quiet, then
    /// checks every resolver's bookkeeping (violations are recorded).
    pub fn pump(&mut self) {
        if self.scale {
            self.pump_dirty();
            return;
        }
        self.drain_all();
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if let Err(e) = n.resolver.check_invariants() {
                self.violations
                    .push(format!("node {i} at {}: {e}", self.now));
            }
            if n.resolver.stats().lost > 0 {
                self.violations.push(format!("node {i}: answers lost"));
            }
        }
    }

    fn drain_all(&mut self) {
        loop {
            let mut any = false;
            for i in 0..self.nodes.len() {
                while let Some(o) = self.nodes[i].resolver.poll_output() {
                    any = true;
                    self.output(i, o);
                }
            }
            if !any {
                break;
            }
        }
    }

    fn output(&mut self, i: usize, o: Output) {
        match o {
            Output::Answer(a) => {
                let tid = u64::from_ne_bytes(a.msg[8..16].try_into().unwrap_or([0; 8]));
                let path = (a.status == Status::Success && a.via == Via::Resolve && a.len >= 88)
                    .then(|| {
                        let mut p = [0u8; 64];
                        p.copy_from_slice(&a.msg[24..88]);
                        p
                    });
                if a.len as usize > MSG_LEN || usize::from(a.len) < 16 {
                    self.violations.push(format!("answer length {}", a.len));
                }
                self.record_answer(i, a.client, tid, a.via, a.status, path, false);
            }
            Output::Count { counter, .. } => self.nodes[i].counters[counter as usize] += 1,
            Output::Attach { group, .. } => self.nodes[i].attached = Some(group.mgid),
            Output::Detach { .. } => self.nodes[i].attached = None,
            Output::SendSa { token, mad, .. } => self.sa(i, token, mad),
            Output::SendAcm { to, mad, .. } => self.acm(i, to, mad),
        }
    }

    fn sa(&mut self, from: usize, token: u64, mad: [u8; 256]) {
        let f = self.faults;
        let mut reply = mad;
        reply[3] = 0x81;
        let attr = u16::from_be_bytes([mad[16], mad[17]]);
        if let (Some(svc), 0x01, 0x0035) = (self.sa_service, mad[3], attr) {
            self.sa_queries += 1;
            self.umad_submit(svc, from, token, mad);
            return;
        }
        match (mad[3], attr) {
            (0x01, 0x0035) => {
                self.sa_queries += 1;
                if self.rng.chance(f.sa_silent) {
                    self.schedule(
                        f.sa_timeout,
                        Event::Sa {
                            to: from,
                            token,
                            umad_status: 110,
                            mad,
                        },
                    );
                    return;
                }
                if self.rng.chance(f.sa_busy) {
                    reply[4..6].copy_from_slice(&1u16.to_be_bytes());
                } else {
                    match self.path_for(from, &mad[56..120]) {
                        Some(p) => reply[56..120].copy_from_slice(&p),
                        None => reply[4..6].copy_from_slice(&0x0300u16.to_be_bytes()),
                    }
                }
            }
            (0x02, 0x0038) => {
                let mut mgid = [0u8; 16];
                mgid.copy_from_slice(&mad[56..72]);
                let n = self.mlids.len() as u16;
                let mlid = *self.mlids.entry(mgid).or_insert(0xc000 + n);
                reply[92..94].copy_from_slice(&mlid.to_be_bytes());
            }
            (0x15, _) => {
                reply[3] = 0x95;
            }
            _ => reply[4..6].copy_from_slice(&0x0200u16.to_be_bytes()),
        }
        let d = 1 + self.rng.below(f.sa_delay_max);
        self.schedule(
            d,
            Event::Sa {
                to: from,
                token,
                umad_status: 0,
                mad: reply,
            },
        );
    }

    /// The core takes a send ([`SaService::core_sa_depth`] credits), the MAD layer sends it.
    fn umad_submit(&mut self, svc: SaService, from: usize, token: u64, mad: [u8; 256]) {
        if svc.core_sa_depth.is_some() {
            if self.core_credits[from] == 0 || !self.core_wait[from].is_empty() {
                self.core_wait[from].push_back((token, mad));
                let w = self.core_wait[from].len();
                self.sa_stats.peak_core_wait = self.sa_stats.peak_core_wait.max(w);
                return;
            }
            self.core_credits[from] -= 1;
        }
        self.umad
            .insert((from, token), UmadSend { mad, attempt: 0 });
        self.node_inflight[from] += 1;
        let f = self.node_inflight[from];
        self.sa_stats.peak_node_inflight = self.sa_stats.peak_node_inflight.max(f);
        self.transmit(svc, from, token, 0, mad);
    }

    /// One try of a send: on the wire (maybe lost), and its timeout.
    fn transmit(&mut self, svc: SaService, from: usize, token: u64, attempt: u32, mad: [u8; 256]) {
        self.sa_stats.sent += 1;
        if self.rng.chance(svc.loss) {
            self.sa_stats.lost += 1;
        } else {
            self.schedule(svc.latency, Event::SaArrive { from, token, mad });
        }
        self.schedule(
            svc.umad_timeout,
            Event::UmadTimeout {
                from,
                token,
                attempt,
            },
        );
    }

    /// A send completed (reply or umad timeout): the core's credit comes back (the next
    /// waiting send goes out), the resolver gets the completion.
    fn umad_complete(&mut self, to: usize, token: u64, umad_status: u32, mad: &[u8; 256]) {
        self.node_inflight[to] -= 1;
        if let Some(svc) = self.sa_service {
            if svc.core_sa_depth.is_some() {
                self.core_credits[to] += 1;
                while self.core_credits[to] > 0 {
                    let Some((t, m)) = self.core_wait[to].pop_front() else {
                        break;
                    };
                    self.core_credits[to] -= 1;
                    self.umad.insert((to, t), UmadSend { mad: m, attempt: 0 });
                    self.node_inflight[to] += 1;
                    self.transmit(svc, to, t, 0, m);
                }
            }
        }
        let now = self.now;
        let n = &mut self.nodes[to];
        n.resolver.handle_sa(now, token, umad_status, mad);
        self.touch(to);
    }

    /// A query reaches the SA server: BUSY if its queue is full, else served in turn.
    fn sa_arrive(&mut self, from: usize, token: u64, mad: [u8; 256]) {
        let Some(svc) = self.sa_service else {
            return;
        };
        let arrival = self.now.saturating_mul(1_000_000);
        while self.sa_fifo.front().is_some_and(|&f| f <= arrival) {
            self.sa_fifo.pop_front();
        }
        let mut reply = mad;
        reply[3] = 0x81;
        let delay = if self.sa_fifo.len() >= svc.queue_cap {
            self.sa_stats.busy += 1;
            reply[4..6].copy_from_slice(&1u16.to_be_bytes());
            svc.latency
        } else {
            let service = 1_000_000_000 / svc.rate.max(1);
            let finish = arrival.max(self.sa_free_ns) + service;
            self.sa_free_ns = finish;
            self.sa_fifo.push_back(finish);
            self.sa_stats.peak_queue = self.sa_stats.peak_queue.max(self.sa_fifo.len());
            self.sa_stats.served += 1;
            let ms = (finish / 1_000_000) as usize;
            if self.sa_stats.served_per_ms.len() <= ms {
                self.sa_stats.served_per_ms.resize(ms + 1, 0);
            }
            self.sa_stats.served_per_ms[ms] += 1;
            if self.count_per_dest {
                let q = PathRecord::new_unchecked(&mad[56..120]);
                let to = self
                    .node_of(q.dlid(), q.dgid())
                    .map_or(u32::MAX, |j| j as u32);
                *self.sa_stats.per_dest.entry((from as u32, to)).or_insert(0) += 1;
            }
            match self.path_for(from, &mad[56..120]) {
                Some(p) => reply[56..120].copy_from_slice(&p),
                None => reply[4..6].copy_from_slice(&0x0300u16.to_be_bytes()),
            }
            (finish - arrival).div_ceil(1_000_000) + svc.latency
        };
        if self.rng.chance(svc.loss) {
            self.sa_stats.lost += 1;
            return;
        }
        self.schedule(
            delay,
            Event::SaReply {
                to: from,
                token,
                mad: reply,
            },
        );
    }

    /// The node with LID `dlid` (if not 0), else with GID `dgid`: O(1), as the nodes' LIDs
    /// and GIDs are a function of their index.
    fn node_of(&self, dlid: u16, dgid: Gid) -> Option<usize> {
        let j = if dlid != 0 {
            usize::from(dlid) - 1
        } else {
            let low = u32::from_be_bytes([dgid.0[12], dgid.0[13], dgid.0[14], dgid.0[15]]);
            (low as usize).checked_sub(1)?
        };
        (j < self.nodes.len() && (dlid != 0 || node_gid(j) == dgid)).then_some(j)
    }

    /// The SA's answer to a PathRecord GET from node `from`.
    fn path_for(&self, from: usize, q: &[u8]) -> Option<[u8; 64]> {
        let q = PathRecord::new_unchecked(q);
        let (dlid, dgid) = (q.dlid(), q.dgid());
        let to = self.node_of(dlid, dgid)?;
        if dlid != 0 && !dgid.is_zero() && node_gid(to) != dgid {
            return None;
        }
        let mut r = [0u8; 64];
        let mut p = PathRecord::new_unchecked(&mut r[..]);
        p.set_dgid(node_gid(to));
        p.set_sgid(node_gid(from));
        p.set_dlid(node_lid(to));
        p.set_slid(node_lid(from));
        p.set_reversible_numpath(true, 0);
        p.set_pkey(0xffff);
        p.set_tclass(q.tclass());
        r[54] = 0x84;
        r[55] = 0x83;
        r[56] = 0x92;
        Some(r)
    }

    fn acm(&mut self, from: usize, to: AcmDest, mad: [u8; 256]) {
        let src = &self.nodes[from];
        if !src.alive {
            return;
        }
        let meta = RecvMeta {
            slid: src.ep_cfg.lid,
            src_qp: src.ep_cfg.qpn,
            sl: 0,
            dlid_path_bits: 0,
            pkey_index: 0,
            ep_pkey_index: 0,
            grh_sgid: Some(src.ep_cfg.port_gid),
        };
        let targets: Vec<usize> = match to {
            AcmDest::Group(_) => {
                self.acm_requests[from] += 1;
                let g = src.attached;
                if g.is_none() {
                    self.violations
                        .push(format!("node {from} multicasts while not attached"));
                }
                (0..self.nodes.len())
                    .filter(|&j| j != from && self.nodes[j].attached == g && g.is_some())
                    .collect()
            }
            AcmDest::Unicast(av) => {
                self.acm_responses[from] += 1;
                let t: Vec<usize> = (0..self.nodes.len())
                    .filter(|&j| node_lid(j) == av.dlid)
                    .collect();
                for &j in &t {
                    let n = &self.nodes[j];
                    if av.dgid != n.ep_cfg.port_gid || av.remote_qpn != n.ep_cfg.qpn {
                        self.violations.push(format!(
                            "node {from}: unicast AV {av:?} does not match node {j}"
                        ));
                    }
                }
                t
            }
        };
        for j in targets {
            if !self.nodes[j].alive || self.rng.chance(self.faults.loss) {
                continue;
            }
            let copies = if self.rng.chance(self.faults.dup) {
                2
            } else {
                1
            };
            for _ in 0..copies {
                let d = self.delay();
                let mut m = mad;
                self.mangle(&mut m);
                self.schedule(
                    d,
                    Event::Acm {
                        to: j,
                        meta,
                        mad: m,
                    },
                );
            }
        }
    }

    /// With probability `Faults::garbage`, overwrites 1–4 random bytes of `mad`.
    fn mangle(&mut self, mad: &mut [u8; 256]) {
        if !self.rng.chance(self.faults.garbage) {
            return;
        }
        for _ in 0..1 + self.rng.below(4) {
            let at = self.rng.below(256) as usize;
            mad[at] = self.rng.next_u64() as u8;
        }
    }

    /// When something happens next (an event or a resolver timer).
    pub fn next_time(&self) -> Option<Millis> {
        let ev = self.events.peek().map(|e| e.at);
        if self.scale {
            let tm = self.timers.peek().map(|r| r.0 .0);
            return match (ev, tm) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        let timers = self
            .nodes
            .iter()
            .filter_map(|n| n.resolver.poll_timeout())
            .min();
        match (ev, timers) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs events and timers until `until` (virtual ms); time ends at `until`.
    pub fn run_until(&mut self, until: Millis) {
        loop {
            self.pump();
            let Some(t) = self.next_step() else {
                break;
            };
            if t > until {
                break;
            }
            self.now = self.now.max(t);
            while self.events.peek().is_some_and(|e| e.at <= self.now) {
                let Some(e) = self.events.pop() else {
                    break;
                };
                self.deliver(e.event);
                self.pump();
            }
            self.run_due_timers(self.now);
        }
        self.now = self.now.max(until);
    }

    /// Runs for `ms` more.
    pub fn run_for(&mut self, ms: Millis) {
        let until = self.now + ms;
        self.run_until(until);
    }

    fn deliver(&mut self, e: Event) {
        let now = self.now;
        match e {
            Event::Acm { to, meta, mad } => {
                let n = &mut self.nodes[to];
                if n.alive {
                    self.delivered += 1;
                    n.resolver.handle_acm(now, EP, &meta, &mad);
                }
                self.touch(to);
            }
            Event::Sa {
                to,
                token,
                umad_status,
                mad,
            } => {
                let n = &mut self.nodes[to];
                n.resolver.handle_sa(now, token, umad_status, &mad);
                self.touch(to);
            }
            Event::SaArrive { from, token, mad } => self.sa_arrive(from, token, mad),
            Event::SaReply { to, token, mad } => match self.umad.remove(&(to, token)) {
                Some(_) => self.umad_complete(to, token, 0, &mad),
                None => self.sa_stats.late += 1,
            },
            Event::UmadTimeout {
                from,
                token,
                attempt,
            } => {
                let Some(svc) = self.sa_service else {
                    return;
                };
                let Some(s) = self.umad.get_mut(&(from, token)) else {
                    return;
                };
                if s.attempt != attempt {
                    return;
                }
                if attempt < svc.umad_retries {
                    s.attempt += 1;
                    let mad = s.mad;
                    self.sa_stats.retransmits += 1;
                    self.transmit(svc, from, token, attempt + 1, mad);
                } else if let Some(s) = self.umad.remove(&(from, token)) {
                    self.sa_stats.umad_timeouts += 1;
                    self.umad_complete(from, token, 110, &s.mad);
                }
            }
        }
    }

    /// Node `i`'s counter `c`.
    pub fn counter(&self, i: usize, c: Counter) -> u64 {
        self.nodes[i].counters[c as usize]
    }
}
