//! The SA of the [`Sim`]: PathRecord GET answered from the nodes' LIDs and GIDs ("no record"
//! for unknown ones), MCMemberRecord SET answered with an MLID per MGID; either the instant
//! model of [`Faults`](super::Faults) (BUSY, silence, delay) or one server, [`SaService`], with
//! the kernel MAD layer and the core's credits in front of it.

use std::collections::HashMap;
use std::vec::Vec;

use super::net::Event;
use super::{node_gid, node_lid, Sim};
use crate::resolver::Millis;
use crate::wire::gid::Gid;
use crate::wire::path_record::PathRecord;

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
    pub fn umad_pending(&self) -> usize {
        self.umad.len()
    }

    pub(super) fn sa(&mut self, from: usize, token: u64, mad: [u8; 256]) {
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
        let now = self.now;
        let n = &mut self.nodes[to];
        n.resolver.handle_sa(now, token, umad_status, mad);
        self.touch(to);
    }

    /// A query reaches the SA server: BUSY if its queue is full, else served in turn.
    pub(super) fn sa_arrive(&mut self, from: usize, token: u64, mad: [u8; 256]) {
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
        p.set_pkey(0xffff);
        p.set_tclass(q.tclass());
        r[54] = 0x84;
        r[55] = 0x83;
        r[56] = 0x92;
        Some(r)
    }
}
