//! A deterministic in-memory InfiniBand model to drive resolvers in virtual time (feature
//! `sim`, host only).
//!
//! [`Sim`] holds N nodes, each a [`node::Node`](crate::node::Node) (the resolver and its SA
//! transport, as the provider ships them) with its own [`PathCache`] and one endpoint ([`EP`],
//! the port's SA carrier), or two ([`SimConfig::second_ep`]: [`EP2`] in another partition,
//! whose SA MADs ride on [`EP`]'s QP), and models what sits around them:
//!
//! * a UD fabric: unicast ACM MADs go to the node with the destination LID, multicast ones to
//!   every node attached to the same group; each delivery may be lost, duplicated, delayed and
//!   so reordered ([`Faults`]);
//! * an SA: PathRecord GET answered from the nodes' LIDs and GIDs ("no record" for unknown
//!   ones), MCMemberRecord SET answered with an MLID per MGID, GetTable answered with every
//!   node's path. With [`Transport::Ud`](crate::node::Transport::Ud) (the default, as shipped) the SM is one more port
//!   on the UD fabric (LID [`SM_LID`], QP 1): a node's SA MADs reach it on its own QP, its
//!   replies come back as received MADs (lost, duplicated, reordered, garbled, or copied from
//!   a wrong sender, [`Faults`]), and a GetTable answer is a windowed RMPP transfer of
//!   segments and ACKs, each of which the fabric may lose or repeat (`sim/ud.rs`); the node's
//!   SA channel does the tries. With [`Transport::Core`](crate::node::Transport::Core) the SA MADs go through a model of
//!   the core's umad service instead: replies may be BUSY or never come (then the caller
//!   reports a umad timeout after [`Faults::sa_timeout`], as ibacm's core does);
//! * the caller's inline hit path (as the provider has it: a cache hit is answered without the
//!   resolver, a NODELAY miss is answered ENODATA and handed over as [`Kind::Prime`], a hit
//!   near expiry as [`Kind::Refresh`]).
//!
//! Optionally ([`SimConfig::sa_service`]) the SA is one server instead, OpenSM as measured and
//! as its code behaves: a service time per Get and per GetTable record, one dispatcher FIFO
//! that silently drops new Gets once the message dispatched last waited longer than
//! `max_msg_fifo_timeout` (BUSY only as an option), one-way fabric latency and loss, and in
//! front of it the kernel MAD layer's per-send timeout and retransmissions (same TID) and the
//! core's `sa_depth` credits ([`SaService`]); PathRecord GETs (and GetTables) then go through
//! that model (the storm simulator, `tools/storm`). [`SimConfig::scale`] makes every step cost O(nodes touched)
//! instead of O(nodes), for 10 000-node runs.
//!
//! Every client request gets a unique client id and TID; every answer is checked: exactly one
//! per Resolve/Query request, with its TID ([`Sim::violations`]). Everything is a function of
//! the seed ([`Rng`], splitmix64), so a failing schedule replays exactly.
//!
//! The model is split by concern: this file holds the [`Sim`] and its nodes, the run loop and
//! the nodes' outputs; [`net`] the UD fabric (unicast, multicast, loss, duplication,
//! delay, garbage) and the event queue; [`sa`] the SA (the instant model and the
//! [`SaService`] server with the MAD layer in front of it); [`ud`] the SA as a port of the UD
//! fabric and its RMPP sender; [`requests`] the client requests
//! (built with the codec's [`ClientRequest`](crate::wire::client::ClientRequest)) and the
//! caller's hit path.
//!
//! [`Kind::Prime`]: crate::resolver::Kind::Prime
//! [`Kind::Refresh`]: crate::resolver::Kind::Refresh

use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::string::String;
use std::sync::Arc;
use std::vec::Vec;
use std::{format, vec};

use crate::cache::{
    ep_number, AddrKind, AddrSlot, CacheConfig, CacheEp, CacheWriter, PathCache, PathSlot,
};
use crate::node::{Output, SaConfig};
use crate::resolver::{
    AcmDest, Capacities, Config, Counter, EpConfig, EpId, HeapStorage, Millis, MsgBuf, Resolver,
    Stats, Via, MSG_LEN,
};
use crate::sa_channel::SmAddr;
use crate::wire::client::{AcmMsg, Status};
use crate::wire::gid::Gid;
use crate::wire::path_record::PathRecord;

pub mod net;
pub mod requests;
pub mod sa;
pub mod ud;

pub use net::Faults;
use net::Scheduled;
pub use requests::{gid_msg, lid_msg, name_bytes, name_msg, query_msg};
use sa::UmadSend;
pub use sa::{SaService, SaServiceStats};

pub use crate::rng::Rng;

/// How a [`Sim`] is built.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// Number of nodes (LID `i + 1`, name `node<i>`; the second endpoint's is
    /// [`second_name`]).
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
    /// The SA as one server, OpenSM's FIFO and drop rule (`None`: the instant model of
    /// [`Faults`]).
    pub sa_service: Option<SaService>,
    /// A second endpoint on every node's port ([`EP2`]), in the partition of this P_Key,
    /// which is not the SA's: its SA MADs ride on the first endpoint's QP, the port's SA
    /// carrier, and its replies come back there (`None`: one endpoint per node).
    pub second_ep: Option<u16>,
    /// Steps touch only the nodes that had an input (a timer heap, a dirty list, answered
    /// requests forgotten); for large node counts. Results are the same as without.
    pub scale: bool,
    /// Check every touched resolver's bookkeeping after each step (off: [`Sim::check_all`]).
    pub checks: bool,
    /// Address-cache slots per node (`None`: `cache_slots`).
    pub addr_cache_slots: Option<usize>,
    /// Count the SA's accepted queries per (node, destination) ([`SaServiceStats::per_dest`]).
    pub count_per_dest: bool,
    /// Most records of a half-world table a node takes (the plugin's table slot: half its path
    /// capacity); a larger table is refused as too big (the resolver turns tables off).
    pub table_room: usize,
    /// How the nodes' SA MADs travel, their tries and per-try wait (the shipped default:
    /// [`Transport::Ud`](crate::node::Transport::Ud), 3 tries of 2 s).
    pub sa: SaConfig,
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
                jobs: 64,
                sa_inflight: 64,
                addrs: 64,
                endpoints: 2,
                preloads: 8,
            },
            cache_slots: 256,
            port_rate_mtu: (3, 4),
            mixed_ports: false,
            sa_service: None,
            second_ep: None,
            scale: false,
            checks: true,
            addr_cache_slots: None,
            count_per_dest: false,
            table_room: usize::MAX,
            sa: SaConfig::default(),
        }
    }
}

/// One answer a client got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimAnswer {
    /// The node that answered.
    pub node: usize,
    /// The endpoint it answered for.
    pub ep: EpId,
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

/// A node's machine: the resolver (owner of its cache's writer) and its SA transport, heap
/// storage as the host's.
pub type SimMachine = crate::node::HeapNode<HeapStorage, Arc<SimCache>>;

/// Where every port's SM is ([`Transport::Ud`](crate::node::Transport::Ud)): LID [`SM_LID`], SL 0.
pub const SM: SmAddr = SmAddr { lid: SM_LID, sl: 0 };

/// The SM's LID: above every node's (`i + 1`).
pub const SM_LID: u16 = 0xbfff;

/// The SM's LID after it moved ([`Faults::sm_move`]); it moves back to [`SM_LID`] the next
/// time.
pub const SM_LID_MOVED: u16 = 0xbffe;

/// One endpoint of a simulated node: one partition of its port, with its own UD QP.
pub struct SimEp {
    /// Its id.
    pub id: EpId,
    /// Its configuration.
    pub cfg: EpConfig,
    /// It is open (its QP exists: MADs reach it).
    pub open: bool,
    /// The MGID its QP is attached to.
    pub attached: Option<Gid>,
    /// Its local name.
    pub name: String,
}

/// One simulated node.
pub struct Node {
    /// Its machine, as the provider runs it.
    pub node: SimMachine,
    /// Its path cache, as the hit path reads it.
    pub cache: Arc<SimCache>,
    /// Its port's endpoints: [`EP`], and [`EP2`] with [`SimConfig::second_ep`].
    pub eps: Vec<SimEp>,
    /// The node answers on the fabric (false = a dead peer).
    pub alive: bool,
    /// Flush generation (the bits above the slot id of its cache endpoint numbers).
    pub generation: u32,
    /// Counters from [`Output::Count`].
    pub counters: [u64; 7],
}

/// The first endpoint of every node: on the SA's P_Key, so its port's SA carrier.
pub const EP: EpId = EpId(1);

/// The second endpoint of a node ([`SimConfig::second_ep`]).
pub const EP2: EpId = EpId(2);

impl Node {
    /// The cache endpoint number of endpoint `ep`.
    pub fn cache_ep(&self, ep: EpId) -> CacheEp {
        ep_number(self.generation, ep.0)
    }
    /// Endpoint `ep` (`None`: the node has no such endpoint).
    pub fn ep(&self, ep: EpId) -> Option<&SimEp> {
        self.eps.iter().find(|e| e.id == ep)
    }
    /// The first endpoint, [`EP`].
    pub fn first(&self) -> &SimEp {
        &self.eps[0]
    }
    /// Endpoint `ep`, to change.
    pub fn ep_mut(&mut self, ep: EpId) -> Option<&mut SimEp> {
        self.eps.iter_mut().find(|e| e.id == ep)
    }
    /// The node's resolver stats (the SA channel's unknown replies included).
    pub fn stats(&self) -> Stats {
        self.node.stats()
    }
    /// The node's resolver.
    pub fn resolver(&self) -> &Resolver<HeapStorage, Arc<SimCache>> {
        self.node.resolver()
    }
}

/// The simulation (see the [module docs](self)).
pub struct Sim {
    /// Virtual time (ms).
    pub now: Millis,
    /// The nodes.
    pub nodes: Vec<Node>,
    /// Where a node's polled answer is built (`Node::poll_output`), read before the next poll.
    msg: MsgBuf,
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
    /// SA MADs the nodes handed to the core's service ([`Output::CoreSa`]).
    pub core_sa_mads: u64,
    /// ACM multicast requests sent, per node.
    pub acm_requests: Vec<u64>,
    /// Unicast ACM responses sent, per node.
    pub acm_responses: Vec<u64>,
    /// Peer requests delivered per (node) — including duplicates.
    pub delivered: u64,
    events: BinaryHeap<Scheduled>,
    seq: u64,
    next_client: u64,
    /// Every request asked and not forgotten, by client id.
    requests: BTreeMap<u64, requests::Asked>,
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
    sa_fifo: VecDeque<sa::FifoEntry>,
    sa_free_ns: u64,
    /// How long the message the SA dispatched last had waited (ns; the drop rule's input).
    sa_last_wait_ns: u64,
    /// MADs the SM's port has handled per virtual ms ([`SaService::sm_mad_ns`]).
    sm_port_per_ms: Vec<u32>,
    /// Every ms of `sm_port_per_ms` before this one is full.
    sm_port_full: usize,
    core_credits: Vec<u32>,
    core_wait: Vec<VecDeque<(u64, [u8; 256])>>,
    /// The SM's RMPP transfers in progress (`ud`), by (node, TID).
    transfers: HashMap<(usize, u64), ud::Transfer>,
    /// The (node, wire TID) of every PathRecord query the SA server's port received (`ud`):
    /// a TID seen again is the node's SA channel trying again.
    sm_seen: std::collections::HashSet<(usize, u64)>,
    /// What the SM's port saw (`ud`).
    pub sm_port: ud::SmPortStats,
    /// Where the SM is now ([`SM_LID`], or [`SM_LID_MOVED`] after an odd number of moves).
    pub sm_lid: u16,
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

/// The local name of node `i`'s second endpoint ([`EP2`]).
pub fn second_name(i: usize) -> String {
    format!("node{i}-b")
}

/// An endpoint of node `i`'s port for a test: its GID and LID, the default P_Key, MTU 2048
/// (4), 40 Gb/s (7), a 1 ms subnet timeout, QPN 100 + `i`, the QP not on the SA's P_Key.
pub fn node_ep_config(i: usize) -> EpConfig {
    EpConfig {
        port_gid: node_gid(i),
        lid: node_lid(i),
        pkey: 0xffff,
        mtu: 4,
        rate: 7,
        subnet_timeout_ms: 1,
        qpn: 100 + i as u32,
        sa_pkey: false,
    }
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
            // The SA channel as the plugin sizes it: the resolver's in-flight queries plus 8
            // per endpoint (joins, leaves, subscriptions), one table slot of half-world room.
            let requests = cfg.caps.sa_inflight + 8 * cfg.caps.endpoints;
            let room = cfg.table_room.min(cfg.nodes + 1);
            let key = [rng.next_u64(), rng.next_u64()];
            let node = SimMachine::on_heap(resolver, cfg.sa, requests, 1, room, key);
            let first = EpConfig {
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
            };
            let mut eps = vec![SimEp {
                id: EP,
                cfg: first,
                open: false,
                attached: None,
                name: format!("node{i}"),
            }];
            if let Some(pkey) = cfg.second_ep {
                eps.push(SimEp {
                    id: EP2,
                    cfg: EpConfig {
                        pkey,
                        qpn: 0x10_0000 + i as u32,
                        sa_pkey: false,
                        ..first
                    },
                    open: false,
                    attached: None,
                    name: second_name(i),
                });
            }
            nodes.push(Node {
                node,
                cache,
                eps,
                alive: true,
                generation: 0,
                counters: [0; 7],
            });
        }
        let n = nodes.len();
        let mut sim = Sim {
            now: 0,
            nodes,
            msg: MsgBuf::new(),
            faults: cfg.faults,
            rng,
            answers: Vec::new(),
            violations: Vec::new(),
            sa_queries: 0,
            core_sa_mads: 0,
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
            sa_last_wait_ns: 0,
            sm_port_per_ms: Vec::new(),
            sm_port_full: 0,
            core_credits: vec![cfg.sa_service.and_then(|s| s.core_sa_depth).unwrap_or(0); n],
            core_wait: vec![VecDeque::new(); n],
            transfers: HashMap::new(),
            sm_seen: std::collections::HashSet::new(),
            sm_port: ud::SmPortStats::default(),
            sm_lid: SM_LID,
        };
        for i in 0..n {
            sim.open(i);
        }
        sim.pump();
        sim
    }

    /// Where the SM is now.
    pub fn sm(&self) -> SmAddr {
        SmAddr {
            lid: self.sm_lid,
            sl: 0,
        }
    }

    /// The ids of node `i`'s endpoints.
    fn ep_ids(&self, i: usize) -> Vec<EpId> {
        self.nodes[i].eps.iter().map(|e| e.id).collect()
    }

    /// Opens node `i`'s endpoints and adds their names.
    pub fn open(&mut self, i: usize) {
        for ep in self.ep_ids(i) {
            self.open_ep(i, ep);
        }
    }

    /// Opens node `i`'s endpoint `ep` (if it has one) and adds its name.
    pub fn open_ep(&mut self, i: usize, ep: EpId) {
        let (now, sm) = (self.now, self.sm());
        let node = &mut self.nodes[i];
        let cep = node.cache_ep(ep);
        let Some(e) = node.eps.iter_mut().find(|e| e.id == ep) else {
            return;
        };
        if e.open {
            return;
        }
        e.open = node.node.handle_open(now, ep, cep, e.cfg, Some(sm)).is_ok();
        if e.open {
            // Adds the name before anything is drained, then drains.
            self.add_name(i, ep);
        } else {
            self.touch(i);
            self.pump();
        }
    }

    /// Closes node `i`'s endpoints (their waiters are answered ENODATA).
    pub fn close(&mut self, i: usize) {
        for ep in self.ep_ids(i) {
            self.close_ep(i, ep);
        }
    }

    /// Closes node `i`'s endpoint `ep`: its waiters are answered ENODATA, and its QP is gone
    /// (nothing reaches it, the SA replies it carried for the port's other endpoints
    /// included).
    pub fn close_ep(&mut self, i: usize, ep: EpId) {
        let now = self.now;
        let node = &mut self.nodes[i];
        if let Some(e) = node.eps.iter_mut().find(|e| e.id == ep && e.open) {
            e.open = false;
            e.attached = None;
            node.node.handle_close(now, ep);
        }
        self.touch(i);
        self.pump();
    }

    /// Preloads on node `i`'s first endpoint what an `ibacm_hosts.data` listing every node's
    /// name would give.
    pub fn preload_hosts(&mut self, i: usize) {
        let now = self.now;
        let names: Vec<(String, Gid)> = (0..self.nodes.len())
            .map(|j| (self.nodes[j].first().name.clone(), node_gid(j)))
            .collect();
        let node = &mut self.nodes[i];
        for (n, g) in names {
            let _ = node
                .node
                .handle_preload_address(now, EP, AddrKind::Name, &name_bytes(&n), g);
        }
        self.touch(i);
        self.pump();
    }

    /// Preloads on node `i`'s first endpoint the route to every other node (what a `dump_pr`
    /// file gives).
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
            let cep = node.cache_ep(EP);
            node.node.handle_preload_route(now, EP, cep, &path);
        }
        self.touch(i);
        self.pump();
    }

    /// Removes the own name of node `i`'s endpoint `ep` (the core's `remove_address`);
    /// `add_name` puts it back.
    pub fn remove_name(&mut self, i: usize, ep: EpId) {
        let now = self.now;
        let node = &mut self.nodes[i];
        if let Some(e) = node.ep(ep) {
            let name = name_bytes(&e.name);
            node.node
                .handle_remove_address(now, ep, AddrKind::Name, &name);
        }
        self.touch(i);
        self.pump();
    }

    /// Adds the own name of node `i`'s endpoint `ep` again.
    pub fn add_name(&mut self, i: usize, ep: EpId) {
        let now = self.now;
        let node = &mut self.nodes[i];
        if let Some(e) = node.ep(ep) {
            let (name, cep) = (name_bytes(&e.name), node.cache_ep(ep));
            let _ = node
                .node
                .handle_add_address(now, ep, cep, AddrKind::Name, &name);
        }
        self.touch(i);
        self.pump();
    }

    /// CLIENT_REREGISTER on node `i`'s port: a new flush generation, then the resolver's
    /// reregister of each of its endpoints.
    pub fn reregister(&mut self, i: usize) {
        let now = self.now;
        let node = &mut self.nodes[i];
        node.generation = node.generation.wrapping_add(1);
        for ep in node.eps.iter().map(|e| e.id) {
            let cep = ep_number(node.generation, ep.0);
            node.node.handle_reregister(now, ep, cep);
        }
        self.touch(i);
        self.pump();
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
            if let Err(e) = n.node.resolver().check_invariants() {
                self.violations
                    .push(format!("node {i} at {}: {e}", self.now));
            }
            if n.node.resolver().stats().lost > 0 {
                self.violations.push(format!("node {i}: answers lost"));
            }
        }
    }

    fn pump_dirty(&mut self) {
        while !self.dirty.is_empty() {
            let d = core::mem::take(&mut self.dirty);
            for i in d {
                self.is_dirty[i] = false;
                let now = self.now;
                while let Some(o) = self.nodes[i].node.poll_output(now, &mut self.msg) {
                    self.output(i, o);
                }
                let n = &mut self.nodes[i];
                if self.checks {
                    if let Err(e) = n.node.resolver().check_invariants() {
                        self.violations
                            .push(format!("node {i} at {}: {e}", self.now));
                    }
                }
                if n.node.resolver().stats().lost > 0 {
                    self.violations.push(format!("node {i}: answers lost"));
                }
                // The `ud` transport's sends in flight (the core's are counted where its MAD
                // layer holds them).
                let held = n.node.sa().len() as u32;
                self.sa_stats.peak_node_inflight = self.sa_stats.peak_node_inflight.max(held);
                if let Some(t) = n.node.poll_timeout() {
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
                if n.node.poll_timeout().is_some_and(|t| t <= now) {
                    n.node.handle_timeout(now);
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
            if n.node.poll_timeout().is_some_and(|t| t <= now) {
                n.node.handle_timeout(now);
            }
            self.touch(i);
            self.pump();
        }
    }

    /// Drains every node's outputs (and what they cause at once) until all are quiet, then
    /// checks every resolver's bookkeeping (violations are recorded).
    pub fn pump(&mut self) {
        if self.scale {
            self.pump_dirty();
            return;
        }
        self.drain_all();
        self.check_all();
    }

    fn drain_all(&mut self) {
        loop {
            let mut any = false;
            let now = self.now;
            for i in 0..self.nodes.len() {
                while let Some(o) = self.nodes[i].node.poll_output(now, &mut self.msg) {
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
                let msg = AcmMsg::new_unchecked(self.msg.message(&a));
                let tid = msg.tid();
                let path = (a.status == Status::Success && a.via == Via::Resolve)
                    .then(|| msg.entry(0).and_then(|e| e.info().try_into().ok()))
                    .flatten();
                if a.len as usize > MSG_LEN || usize::from(a.len) < 16 {
                    self.violations.push(format!("answer length {}", a.len));
                }
                self.record_answer((i, a.ep), a.client, tid, a.via, a.status, path, false);
            }
            Output::Count { counter, .. } => self.nodes[i].counters[counter as usize] += 1,
            Output::Attach { ep, group } => {
                if let Some(e) = self.nodes[i].ep_mut(ep) {
                    e.attached = Some(group.mgid);
                }
            }
            Output::Detach { ep, .. } => {
                if let Some(e) = self.nodes[i].ep_mut(ep) {
                    e.attached = None;
                }
            }
            Output::CoreSa { token, mad, .. } => {
                self.core_sa_mads += 1;
                self.sa(i, token, mad)
            }
            Output::Transmit {
                query: Some(token), ..
            } if self.faults.post_busy != 0 && self.rng.chance(self.faults.post_busy) => {
                let now = self.now;
                self.nodes[i]
                    .node
                    .handle_unsent(now, token, crate::node::Unsent::Busy);
            }
            Output::Transmit { qp, to, mad, .. } => match to {
                AcmDest::Unicast(av)
                    if (av.dlid == SM_LID || av.dlid == SM_LID_MOVED) && av.remote_qpn == 1 =>
                {
                    self.send_to_sm(i, qp, av.dlid, mad)
                }
                _ => self.acm(i, qp, to, mad),
            },
            Output::ReadSm { ep } => {
                // (No draw without the fault: a run without it stays the run it was.)
                if self.faults.sm_move != 0 && self.rng.chance(self.faults.sm_move) {
                    self.sm_moves();
                }
                let sm = if self.faults.sm_unknown != 0 && self.rng.chance(self.faults.sm_unknown) {
                    self.sm_port.unknown_reads += 1;
                    None
                } else {
                    Some(self.sm())
                };
                let now = self.now;
                let n = &mut self.nodes[i];
                let cep = n.cache_ep(ep);
                n.node.handle_sm(now, ep, cep, sm);
            }
            Output::QueryDone { .. } | Output::Event(_) => {}
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
            .filter_map(|n| n.node.poll_timeout())
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

    /// Node `i`'s counter `c`.
    pub fn counter(&self, i: usize, c: Counter) -> u64 {
        self.nodes[i].counters[c as usize]
    }
}
