//! The SA of the [`Sim`]: PathRecord GET answered from the nodes' LIDs and GIDs ("no record"
//! for unknown ones), MCMemberRecord SET answered with an MLID per MGID; either the instant
//! model of [`Faults`](super::Faults) (BUSY, silence, delay) or one server, [`SaService`], with
//! the kernel MAD layer and the core's credits in front of it, and the SM's port, which every
//! MAD of the SA's queries passes ([`SaService::sm_mad_ns`]).

use std::collections::HashMap;
use std::vec::Vec;

use super::net::Event;
use super::{node_gid, node_lid, Sim, EP};
use crate::resolver::{EpId, Millis};
use crate::wire::gid::Gid;
use crate::wire::path_record::PathRecord;

/// The SA as one server, and the MAD layer in front of it (see the [module docs](self)).
///
/// A PathRecord GET a node sends is held by the core until it has one of the port's
/// `core_sa_depth` credits (`acm_send_sa_mad`: a credit, else the FIFO `sa_wait`, released
/// when a MAD is received on the port), then sent by the kernel MAD layer: it reaches the SA
/// after `latency` unless lost (`loss`); without a reply within `umad_timeout` it is sent again
/// with the same TID, `umad_retries` times, then completed with a umad timeout.
///
/// The SA is OpenSM as measured and as its code behaves (`docs/storm.md`, "The SA, measured";
/// the figures in `tools/storm/opensm-measured.toml`): one dispatcher FIFO served in arrival
/// order, `get_ns` per Get and `get_ns + (records - 1) × table_record_ns` per half-world
/// GetTable. A Get that arrives while the FIFO holds more than one waiting message and the
/// message dispatched last had waited longer than `fifo_timeout` ms is **dropped without an
/// answer** (`osm_sa_mad_ctrl.c`, `max_msg_fifo_timeout`; OpenSM never answers BUSY), so the
/// sender sees a umad timeout and retransmits. [`busy_queue`](Self::busy_queue) turns on BUSY
/// for SAs that send it: a query that finds that many queries held (waiting or in service) is
/// answered BUSY at once, costing no service time. The SA serves every query it accepted,
/// including those whose sender has given up (their replies are dropped by the MAD layer,
/// counted in [`SaServiceStats::late`]). Joins and other SA MADs keep the instant model.
///
/// **The SM's port** (the kernel MAD layer and the HCA's QP1 on the SM's host) handles every
/// MAD of the SA's queries, `sm_mad_ns` each, one at a time, beside OpenSM's dispatcher: a
/// query received (Get or GetTable, either transport), its answer sent, each RMPP segment sent
/// and each ACK received (`ud`). It handles at most `1 ms / sm_mad_ns` MADs per virtual ms; a
/// MAD that finds its ms full takes the next ms with room (so a query reaches the SA, an
/// answer or segment leaves, that much later; an ACK is counted, its wait not modelled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaService {
    /// Service time of one PathRecord Get (ns): OpenSM's CPU time per Get at saturation.
    pub get_ns: u64,
    /// Service time per record of a GetTable answer beyond the first (ns).
    pub table_record_ns: u64,
    /// How fast one GetTable answer's RMPP transfer brings records to its receiver (records
    /// per second; segments, ACK windows and their round trips): the answer arrives
    /// `records / rate` after the SA served it. Not SA service time: the MAD layer sends the
    /// segments while the SA serves the next query.
    pub table_records_per_s: u64,
    /// OpenSM's `max_msg_fifo_timeout` (ms): a Get is dropped once the last dispatched
    /// message waited longer than this while more than one message waits; 0 = never drop
    /// (as OpenSM with 0).
    pub fifo_timeout: Millis,
    /// `Some(q)`: an SA that answers BUSY to a query finding `q` queries held (waiting plus
    /// in service); `None` (OpenSM): never BUSY.
    pub busy_queue: Option<usize>,
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
    /// The SM's port's time per MAD, received or sent (ns; 0: free): Gets and GetTables
    /// received, their answers and RMPP segments sent, ACKs received.
    pub sm_mad_ns: u64,
}

impl SaService {
    /// OpenSM as measured by `opensm-sa` (`tools/storm/opensm-measured.toml`, `[model]`):
    /// 6 µs per Get (166 666 Gets/s), 174 ns per further record of a GetTable, its transfer at
    /// 140 000 records/s (the published whole-path-table rate over RMPP on 1 096 nodes), drops past
    /// `max_msg_fifo_timeout` 10 000 ms (its default, 50 × 200 ms), no BUSY; 1 ms each way,
    /// no loss, the core's MAD timeout and retries (2000 ms, 2), no core credit limit; the
    /// SM's port at 1.92 µs per MAD (`sm_mad_ns`, see `docs/storm.md`, "The SM's port").
    pub const DEFAULT: SaService = SaService {
        get_ns: 6_000,
        table_record_ns: 174,
        table_records_per_s: 140_000,
        fifo_timeout: 10_000,
        busy_queue: None,
        latency: 1,
        loss: 0,
        umad_timeout: 2000,
        umad_retries: 2,
        core_sa_depth: None,
        sm_mad_ns: 1_920,
    };

    /// Gets served per second (`1 s / get_ns`).
    pub fn rate(&self) -> u64 {
        1_000_000_000 / self.get_ns.max(1)
    }

    /// `get_ns` for a rate of `per_s` Gets per second.
    pub fn get_ns_for_rate(per_s: u64) -> u64 {
        1_000_000_000 / per_s.max(1)
    }

    /// Service time of a GetTable answered with `records` records (ns).
    pub fn table_ns(&self, records: u64) -> u64 {
        self.get_ns + records.saturating_sub(1) * self.table_record_ns
    }
}

/// What the [`SaService`] model saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SaServiceStats {
    /// PathRecord queries the senders put on the wire (first sends and retransmissions): the
    /// core's MAD layer, or (`ud`) the nodes' SA channels.
    pub sent: u64,
    /// Of `sent`, retransmissions after a try timed out (the same TID again).
    pub retransmits: u64,
    /// MADs lost on the wire (either way).
    pub lost: u64,
    /// Queries the SA accepted and served.
    pub served: u64,
    /// Queries the SA answered BUSY ([`SaService::busy_queue`]).
    pub busy: u64,
    /// Gets the SA dropped unanswered (the `max_msg_fifo_timeout` rule).
    pub dropped: u64,
    /// Most queries the SA held at once (waiting plus in service).
    pub peak_queue: usize,
    /// Longest time an accepted query waited in the FIFO before its service began (µs).
    pub peak_wait_us: u64,
    /// GetTables served.
    pub tables: u64,
    /// Records the GetTables returned.
    pub table_records: u64,
    /// Records of whole tables handed to the resolvers (built on delivery).
    pub table_records_delivered: u64,
    /// Sends the core's MAD layer completed with a umad timeout (retries exhausted; the `ud`
    /// transport's are its SA channels' `timeouts`).
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
    /// Most SA sends of one node in flight at once (sent, not completed): in the core's MAD
    /// layer, or (`ud`) in the node's SA channel, its joins and subscriptions included.
    pub peak_node_inflight: u32,
    /// MADs the SM's port took in for the SA: queries (Gets and GetTables) and RMPP ACKs.
    pub sm_port_in: u64,
    /// MADs the SM's port sent for the SA: single-MAD answers and RMPP segments.
    pub sm_port_out: u64,
    /// Longest a MAD waited for the SM's port (ms: the port's ms were full).
    pub sm_port_peak_wait_ms: u64,
}

/// A query in the SA's FIFO: when its service starts and ends, and how long it waited (ns).
#[derive(Clone, Copy, Debug)]
pub(super) struct FifoEntry {
    start: u64,
    finish: u64,
    wait: u64,
}

/// A send the MAD layer holds.
#[derive(Clone, Debug)]
pub(super) struct UmadSend {
    pub(super) mad: [u8; 256],
    pub(super) attempt: u32,
}

impl Sim {
    /// Sends the MAD layer holds for node `i` (sent, neither answered nor timed out).
    pub fn umad_inflight(&self, i: usize) -> u32 {
        self.node_inflight[i]
    }

    /// Sends the MAD layer holds, all nodes.
    pub fn umad_held(&self) -> usize {
        self.umad.len()
    }

    /// One MAD through the SM's port, due there at `at_ns` (received: `inbound`): when the
    /// port is done with it (ns), `at_ns` itself while the port is free (see [`SaService`]).
    pub(super) fn sm_port(&mut self, at_ns: u64, inbound: bool) -> u64 {
        let Some(svc) = self.sa_service else {
            return at_ns;
        };
        if inbound {
            self.sa_stats.sm_port_in += 1;
        } else {
            self.sa_stats.sm_port_out += 1;
        }
        let c = svc.sm_mad_ns;
        if c == 0 {
            return at_ns;
        }
        let per_ms = (1_000_000 / c).max(1);
        let first = (at_ns / 1_000_000) as usize;
        // Every ms before `sm_port_full` is full: start there.
        let mut ms = first.max(self.sm_port_full);
        loop {
            if self.sm_port_per_ms.len() <= ms {
                self.sm_port_per_ms.resize(ms + 1, 0);
            }
            if u64::from(self.sm_port_per_ms[ms]) < per_ms {
                break;
            }
            ms += 1;
        }
        self.sm_port_per_ms[ms] += 1;
        if ms == self.sm_port_full && u64::from(self.sm_port_per_ms[ms]) >= per_ms {
            while u64::from(
                self.sm_port_per_ms
                    .get(self.sm_port_full)
                    .copied()
                    .unwrap_or(0),
            ) >= per_ms
            {
                self.sm_port_full += 1;
            }
        }
        let wait = (ms - first) as u64;
        self.sa_stats.sm_port_peak_wait_ms = self.sa_stats.sm_port_peak_wait_ms.max(wait);
        if ms == first {
            at_ns
        } else {
            ms as u64 * 1_000_000
        }
    }

    /// A MAD leaving the SM's port at virtual ms `at`: the ms it is late by, waiting for the
    /// port.
    pub(super) fn sm_port_send(&mut self, at: Millis) -> Millis {
        let ns = at.saturating_mul(1_000_000);
        (self.sm_port(ns, false) - ns) / 1_000_000
    }

    /// An SA MAD of node `from` through the core's service ([`Transport::Core`](crate::node::Transport)):
    /// a PathRecord GET to the [`SaService`] through the MAD layer, or the instant model's
    /// answer (a umad timeout after [`Faults::sa_timeout`](super::Faults) for a silent one).
    pub(super) fn sa(&mut self, from: usize, token: u64, mad: [u8; 256]) {
        let attr = u16::from_be_bytes([mad[16], mad[17]]);
        if let (Some(svc), 0x01 | 0x12, 0x0035) = (self.sa_service, mad[3], attr) {
            self.sa_queries += 1;
            self.umad_submit(svc, from, token, mad);
            return;
        }
        let (to, umad_status, mad, delay) = match self.instant_answer(from, &mad) {
            Some(reply) => (from, 0, reply, 1 + self.rng.below(self.faults.sa_delay_max)),
            None => (from, 110, mad, self.faults.sa_timeout),
        };
        self.schedule(
            delay,
            Event::Sa {
                to,
                token,
                umad_status,
                mad,
            },
        );
    }

    /// The instant model's answer to node `from`'s SA MAD `mad`, `None` when the SA stays
    /// silent ([`Faults::sa_silent`](super::Faults)): PathRecord GET (maybe BUSY), GetTable
    /// (its records are built on delivery), MCMemberRecord SET (an MLID per MGID), InformInfo
    /// SET (taken), a DELETE, anything else refused.
    pub(super) fn instant_answer(&mut self, from: usize, mad: &[u8; 256]) -> Option<[u8; 256]> {
        let f = self.faults;
        let mut reply = *mad;
        reply[3] = 0x81;
        let attr = u16::from_be_bytes([mad[16], mad[17]]);
        match (mad[3], attr) {
            (0x01, 0x0035) => {
                self.sa_queries += 1;
                if self.rng.chance(f.sa_silent) {
                    return None;
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
            (0x12, 0x0035) => {
                self.sa_queries += 1;
                if self.rng.chance(f.sa_silent) {
                    return None;
                }
                reply[3] = 0x92;
            }
            (0x02, 0x0038) => {
                let mut mgid = [0u8; 16];
                mgid.copy_from_slice(&mad[56..72]);
                let n = self.mlids.len() as u16;
                let mlid = *self.mlids.entry(mgid).or_insert(0xc000 + n);
                reply[92..94].copy_from_slice(&mlid.to_be_bytes());
            }
            (0x02, 0x0003) => {
                // InformInfo SET: the subscription is taken (the reply echoes it).
            }
            (0x15, _) => {
                reply[3] = 0x95;
            }
            _ => reply[4..6].copy_from_slice(&0x0200u16.to_be_bytes()),
        }
        Some(reply)
    }

    /// The core takes a send ([`SaService::core_sa_depth`] credits), the MAD layer sends it.
    pub(super) fn umad_submit(&mut self, svc: SaService, from: usize, token: u64, mad: [u8; 256]) {
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
    pub(super) fn transmit(
        &mut self,
        svc: SaService,
        from: usize,
        token: u64,
        attempt: u32,
        mad: [u8; 256],
    ) {
        self.sa_stats.sent += 1;
        if self.rng.chance(svc.loss) {
            self.sa_stats.lost += 1;
        } else {
            let token = Some(token);
            // (The core's MAD layer sends on the port's QP1: no endpoint's QP carries it.)
            let ev = Event::SaArrive {
                from,
                qp: EP,
                token,
                mad,
            };
            self.schedule(svc.latency, ev);
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
    pub(super) fn umad_complete(
        &mut self,
        to: usize,
        token: u64,
        umad_status: u32,
        mad: &[u8; 256],
    ) {
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
        self.deliver_sa(to, token, umad_status, mad);
    }

    /// A completion of the core's SA service reaches node `to` (no GetTable comes this way:
    /// the node does not send one through the core's service).
    pub(super) fn deliver_sa(&mut self, to: usize, token: u64, umad_status: u32, mad: &[u8; 256]) {
        let now = self.now;
        self.nodes[to]
            .node
            .handle_core_sa(now, token, umad_status, mad);
        self.touch(to);
    }

    /// Every node's path from node `to` in partition `pkey`, back to back (a half-world
    /// GetTable's records).
    pub(super) fn table_records(&self, to: usize, pkey: u16) -> Vec<u8> {
        let mut records = Vec::with_capacity(self.nodes.len() * 64);
        for j in 0..self.nodes.len() {
            let mut q = [0u8; 64];
            let mut p = PathRecord::new_unchecked(&mut q[..]);
            p.set_dlid(node_lid(j));
            p.set_pkey(pkey);
            if let Some(p) = self.path_for(to, &q) {
                records.extend_from_slice(&p);
            }
        }
        records
    }

    /// A query reaches the SA server: BUSY (if configured) when its queue is full, dropped by
    /// the `max_msg_fifo_timeout` rule, else served in turn.
    pub(super) fn sa_arrive(&mut self, from: usize, qp: EpId, token: Option<u64>, mad: [u8; 256]) {
        let Some(svc) = self.sa_service else {
            return;
        };
        // The query passes the SM's port first.
        let arrival = self.sm_port(self.now.saturating_mul(1_000_000), true);
        // Done queries leave; the one in service (if any) is the message dispatched last.
        while let Some(e) = self.sa_fifo.front().copied() {
            if e.finish > arrival {
                break;
            }
            self.sa_last_wait_ns = e.wait;
            self.sa_fifo.pop_front();
        }
        let in_service = match self.sa_fifo.front() {
            Some(e) if e.start <= arrival => {
                self.sa_last_wait_ns = e.wait;
                1
            }
            _ => 0,
        };
        let held = self.sa_fifo.len();
        let waiting = held - in_service;
        let mut reply = mad;
        reply[3] = mad[3] | 0x80;
        if svc.busy_queue.is_some_and(|q| held >= q) {
            self.sa_stats.busy += 1;
            reply[4..6].copy_from_slice(&1u16.to_be_bytes());
            return self.sa_reply(svc, (from, qp), token, reply, svc.latency);
        }
        // osm_sa_mad_ctrl.c: more than one message queued and the last one dispatched waited
        // longer than max_msg_fifo_timeout (whole ms) -> the request is dropped, no answer.
        if svc.fifo_timeout > 0
            && waiting > 1
            && self.sa_last_wait_ns / 1_000_000 > svc.fifo_timeout
        {
            self.sa_stats.dropped += 1;
            return;
        }
        let table = mad[3] == 0x12;
        let service = if table {
            let records = self.nodes.len() as u64;
            self.sa_stats.tables += 1;
            self.sa_stats.table_records += records;
            svc.table_ns(records)
        } else {
            svc.get_ns
        };
        let start = arrival.max(self.sa_free_ns);
        let finish = start + service.max(1);
        self.sa_free_ns = finish;
        self.sa_fifo.push_back(FifoEntry {
            start,
            finish,
            wait: start - arrival,
        });
        self.sa_stats.peak_queue = self.sa_stats.peak_queue.max(self.sa_fifo.len());
        self.sa_stats.peak_wait_us = self.sa_stats.peak_wait_us.max((start - arrival) / 1000);
        self.sa_stats.served += 1;
        let ms = (finish / 1_000_000) as usize;
        if self.sa_stats.served_per_ms.len() <= ms {
            self.sa_stats.served_per_ms.resize(ms + 1, 0);
        }
        self.sa_stats.served_per_ms[ms] += 1;
        if table {
            // The first record of the half-world answer (the sim carries no RMPP, as
            // umad2sim delivers only an answer's first MAD).
            let mut q = [0u8; 64];
            let mut p = PathRecord::new_unchecked(&mut q[..]);
            p.set_dlid(node_lid(0));
            p.set_pkey(PathRecord::new_unchecked(&mad[56..120]).pkey());
            if let Some(p) = self.path_for(from, &q) {
                reply[56..120].copy_from_slice(&p);
                reply[44..46].copy_from_slice(&8u16.to_be_bytes());
            }
        } else {
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
        }
        // From now: the query may have reached the SA later, after the SM's port.
        let mut delay = (finish - self.now * 1_000_000).div_ceil(1_000_000) + svc.latency;
        // Over the core's MAD layer the transfer is a rate; on the SM's port (`ud`) its
        // segments and ACKs are modelled one by one (`sim/ud.rs`).
        if table && token.is_some() {
            let records = self.nodes.len() as u64;
            delay += (records * 1000).div_ceil(svc.table_records_per_s.max(1));
        }
        self.sa_reply(svc, (from, qp), token, reply, delay)
    }

    /// The SA's reply on the wire (maybe lost), `delay` ms after the query arrived: to the
    /// sender's MAD layer (`token`), or leaving the SM's port for the QP that sent it (`ud`).
    fn sa_reply(
        &mut self,
        svc: SaService,
        (to, qp): (usize, EpId),
        token: Option<u64>,
        mad: [u8; 256],
        delay: Millis,
    ) {
        let Some(token) = token else {
            // The SM's port sends it after the service; the fabric's faults apply there.
            return self.schedule(
                delay.saturating_sub(svc.latency),
                Event::SmReply {
                    to,
                    qp,
                    sm: self.sm_lid,
                    mad,
                },
            );
        };
        // The answer leaves through the SM's port when the SA is done with it.
        let late = self.sm_port_send((self.now + delay).saturating_sub(svc.latency));
        if self.rng.chance(svc.loss) {
            self.sa_stats.lost += 1;
            return;
        }
        self.schedule(delay + late, Event::SaReply { to, token, mad });
    }

    /// The node with LID `dlid` (if not 0), else with GID `dgid`: O(1), as the nodes' LIDs
    /// and GIDs are a function of their index.
    pub(super) fn node_of(&self, dlid: u16, dgid: Gid) -> Option<usize> {
        let j = if dlid != 0 {
            usize::from(dlid) - 1
        } else {
            let low = u32::from_be_bytes([dgid.0[12], dgid.0[13], dgid.0[14], dgid.0[15]]);
            (low as usize).checked_sub(1)?
        };
        (j < self.nodes.len() && (dlid != 0 || node_gid(j) == dgid)).then_some(j)
    }

    /// The SA's answer to a PathRecord GET from node `from`.
    pub(super) fn path_for(&self, from: usize, q: &[u8]) -> Option<[u8; 64]> {
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
        // The partition the query asked for (the default one when it named none).
        p.set_pkey(match q.pkey() {
            0 => 0xffff,
            k => k,
        });
        p.set_tclass(q.tclass());
        r[54] = 0x84;
        r[55] = 0x83;
        r[56] = 0x92;
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimConfig;

    /// A PathRecord Get from node 0 to node 1's LID.
    fn get() -> [u8; 256] {
        let mut m = [0u8; 256];
        m[..4].copy_from_slice(&[1, 3, 2, 0x01]);
        m[16..18].copy_from_slice(&0x0035u16.to_be_bytes());
        PathRecord::new_unchecked(&mut m[56..120]).set_dlid(node_lid(1));
        m
    }

    /// The SA alone: the SM's port free unless `svc` is used by [`sim_with_port`].
    fn sim(svc: SaService) -> Sim {
        sim_with_port(SaService {
            sm_mad_ns: 0,
            ..svc
        })
    }

    fn sim_with_port(svc: SaService) -> Sim {
        let mut c = SimConfig::new(4, 7);
        c.sa_service = Some(svc);
        Sim::new(c)
    }

    /// When the SA's replies reach their senders (ms), in order.
    fn reply_times(s: &Sim) -> Vec<Millis> {
        let mut replies: Vec<Millis> = s
            .events
            .iter()
            .filter(|e| matches!(e.event, Event::SaReply { .. }))
            .map(|e| e.at)
            .collect();
        replies.sort_unstable();
        replies
    }

    /// Queries arriving at `at` ms; what the SA did with them: (served, dropped, busy) so far.
    fn arrive(s: &mut Sim, at: Millis, n: usize) -> (u64, u64, u64) {
        s.now = at;
        for k in 0..n {
            s.sa_arrive(0, EP, Some(1_000 * at + k as u64), get());
        }
        (s.sa_stats.served, s.sa_stats.dropped, s.sa_stats.busy)
    }

    /// 1 ms per Get, max_msg_fifo_timeout 5 ms: 20 Gets at t = 0 are served at 0, 1, .., 19 ms
    /// (query k waited k ms). A Get is dropped exactly when more than one message waits and
    /// the message dispatched last waited more than 5 whole ms.
    #[test]
    fn drops_follow_osm_sa_mad_ctrl() {
        let mut s = sim(SaService {
            get_ns: 1_000_000,
            fifo_timeout: 5,
            ..SaService::DEFAULT
        });
        assert_eq!(
            arrive(&mut s, 0, 20),
            (20, 0, 0),
            "nothing dispatched yet waited"
        );
        // t = 5: query 5 is in service, it waited 5 ms: not more than 5, accepted (A, which
        // starts at 20 ms, after the 20).
        assert_eq!(arrive(&mut s, 5, 1), (21, 0, 0));
        // t = 6: query 6 waited 6 ms, 14 wait: dropped, silently.
        assert_eq!(arrive(&mut s, 6, 1), (21, 1, 0));
        // t = 19: query 19 (waited 19 ms) in service, but only A waits: "more than one" fails,
        // accepted (B, 21 ms).
        assert_eq!(arrive(&mut s, 19, 1), (22, 1, 0));
        // t = 20: A in service (waited 15 ms), B waits alone: accepted (C); the next finds B
        // and C waiting: dropped.
        assert_eq!(arrive(&mut s, 20, 1), (23, 1, 0));
        assert_eq!(arrive(&mut s, 20, 1), (23, 2, 0));
        // t = 22: A and B done, C (waited 2 ms) in service: accepted again.
        assert_eq!(arrive(&mut s, 22, 3), (26, 2, 0));
        assert_eq!(s.sa_stats.peak_wait_us, 19_000, "query 19");
    }

    #[test]
    fn no_busy_by_default_and_no_drop_with_a_zero_timeout() {
        assert_eq!(SaService::DEFAULT.busy_queue, None);
        assert_eq!(SaService::DEFAULT.fifo_timeout, 10_000);
        let mut s = sim(SaService {
            get_ns: 1_000_000,
            fifo_timeout: 0,
            ..SaService::DEFAULT
        });
        assert_eq!(arrive(&mut s, 0, 5_000), (5_000, 0, 0));
        assert_eq!(
            arrive(&mut s, 4_000, 100),
            (5_100, 0, 0),
            "0: never dropped"
        );
        let mut s = sim(SaService {
            get_ns: 1_000_000,
            ..SaService::DEFAULT
        });
        assert_eq!(arrive(&mut s, 0, 12_000), (12_000, 0, 0));
        // 10 001 ms later query 10 001 (waited 10 001 ms) is in service: dropped, not BUSY.
        assert_eq!(arrive(&mut s, 10_001, 10), (12_000, 10, 0));
    }

    #[test]
    fn busy_is_an_option() {
        let mut s = sim(SaService {
            get_ns: 1_000_000,
            busy_queue: Some(3),
            ..SaService::DEFAULT
        });
        assert_eq!(arrive(&mut s, 0, 5), (3, 0, 2));
        assert_eq!(arrive(&mut s, 1, 1), (4, 0, 2), "one done, room for one");
    }

    #[test]
    fn a_get_table_costs_a_get_plus_its_further_records() {
        let svc = SaService {
            get_ns: 10_000,
            table_record_ns: 300,
            ..SaService::DEFAULT
        };
        assert_eq!(svc.table_ns(1), 10_000);
        assert_eq!(svc.table_ns(4), 10_900);
        let mut s = sim(svc);
        let mut m = get();
        m[3] = 0x12;
        s.sa_arrive(0, EP, Some(1), m);
        assert_eq!((s.sa_stats.tables, s.sa_stats.table_records), (1, 4));
        assert_eq!(s.sa_free_ns, 10_900);
        assert_eq!(SaService::get_ns_for_rate(30_000), 33_333);
        assert_eq!(
            SaService::DEFAULT.rate(),
            1_000_000_000 / SaService::DEFAULT.get_ns
        );
    }

    /// The SM's port at 0.5 ms per MAD handles two MADs per ms, in the order they are given to
    /// it: of four Gets arriving at once, the first two pass at once and their answers take
    /// the port's next ms (when the SA is done with them); the last two find both ms full and
    /// reach the SA 2 ms late.
    #[test]
    fn the_sm_port_costs_every_query_and_answer_its_time_per_mad() {
        let svc = SaService {
            get_ns: 1_000,
            sm_mad_ns: 500_000,
            ..SaService::DEFAULT
        };
        let mut s = sim_with_port(svc);
        let t0 = s.now;
        for k in 0..4 {
            s.sa_arrive(0, EP, Some(k), get());
        }
        assert_eq!((s.sa_stats.sm_port_in, s.sa_stats.sm_port_out), (4, 4));
        assert_eq!(s.sa_stats.served, 4);
        assert_eq!(s.sa_free_ns, (t0 + 2) * 1_000_000 + 2_000);
        assert_eq!(s.sa_stats.sm_port_peak_wait_ms, 2);
        // Done at t0 + 1 and t0 + 3 (the SA's ms), sent then, 1 ms on the wire.
        assert_eq!(reply_times(&s), [t0 + 2, t0 + 2, t0 + 4, t0 + 4]);
        assert_eq!(SaService::DEFAULT.sm_mad_ns, 1_920);
    }

    #[test]
    fn a_table_arrives_after_its_transfer_not_only_its_service() {
        // 4 nodes: a 4-record table, served in 10.9 µs (1 ms), 1 ms on the wire, and its
        // transfer at 1 000 records/s: 4 ms more. The SA is free again after the service.
        let svc = SaService {
            get_ns: 10_000,
            table_record_ns: 300,
            table_records_per_s: 1000,
            ..SaService::DEFAULT
        };
        let mut s = sim(svc);
        let t0 = s.now;
        let mut m = get();
        m[3] = 0x12;
        s.sa_arrive(0, EP, Some(1), m);
        assert_eq!(s.sa_free_ns, t0 * 1_000_000 + 10_900);
        assert_eq!(reply_times(&s), [t0 + 1 + 1 + 4]);
    }
}
