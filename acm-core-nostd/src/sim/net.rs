//! The UD fabric of the [`Sim`]: unicast ACM MADs go to the endpoint with the destination LID
//! and QPN, multicast ones to every endpoint attached to the same group (of the other nodes);
//! a closed endpoint's QP is gone, so nothing reaches it; each delivery may be lost,
//! duplicated, delayed and so reordered, or garbled ([`Faults`]). Also the event queue every
//! delivery (ACM or SA) goes through.

use std::format;
use std::vec::Vec;

use super::{node_lid, Sim};
use crate::resolver::{AcmDest, EpId, Millis, RecvMeta};

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
    /// A MAD from the SM's port (`ud`) is followed by a copy from a wrong sender (another
    /// node's LID).
    pub sa_forged: u32,
    /// An SA query's first post on a node's QP (`ud`) finds no send buffer free: it does not
    /// leave, and goes back to the node as [`Unsent::Busy`](crate::node::Unsent::Busy).
    pub post_busy: u32,
    /// At a node's read of its port's SM (`ud`, every second), the SM moves: from then on it
    /// is at the other of [`SM_LID`](super::SM_LID) and [`SM_LID_MOVED`](super::SM_LID_MOVED);
    /// what the old one had not answered yet is never answered, and MADs to it are lost.
    pub sm_move: u32,
    /// A node's read of its port's SM finds none (`None`: the node keeps the one it knew).
    pub sm_unknown: u32,
    /// A half-world table's records are cut short by 1–63 bytes (a PayloadLength that cuts
    /// a record), which the node must refuse and answer with Gets (`ud`).
    pub table_cut: u32,
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
        sa_forged: 0,
        post_busy: 0,
        sm_move: 0,
        sm_unknown: 0,
        table_cut: 0,
    };
}

/// Something that happens at a virtual time.
#[derive(Clone, Debug)]
pub(super) enum Event {
    /// A MAD reaches the QP of node `to`'s endpoint `ep` (ACM from a peer, SA from the SM).
    Mad {
        to: usize,
        ep: EpId,
        meta: RecvMeta,
        mad: [u8; 256],
    },
    Sa {
        to: usize,
        token: u64,
        umad_status: u32,
        mad: [u8; 256],
    },
    /// A PathRecord GET reaches the SA server ([`SaService`](super::SaService)): through the core's MAD layer
    /// (`token`), or on the SM's port from the node's QP (`None`, the `ud` transport).
    SaArrive {
        from: usize,
        /// The endpoint whose QP sent it (`ud`; the port's SA carrier).
        qp: EpId,
        token: Option<u64>,
        mad: [u8; 256],
    },
    /// The SA server's reply leaves the SM's port for the QP of node `to`'s endpoint `qp`
    /// (`ud`), if the SM that took the query (`sm`, its LID) is still the SM.
    SmReply {
        to: usize,
        qp: EpId,
        sm: u16,
        mad: [u8; 256],
    },
    /// The SM's RMPP sender waited `attempt`'s time for an ACK of transfer (`to`, `tid`).
    RmppTimeout { to: usize, tid: u64, attempt: u32 },
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

/// An [`Event`] in the queue.
#[derive(Clone, Debug)]
pub(super) struct Scheduled {
    pub(super) at: Millis,
    pub(super) seq: u64,
    pub(super) event: Event,
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

impl Sim {
    pub(super) fn schedule(&mut self, delay: Millis, event: Event) {
        self.seq += 1;
        self.events.push(Scheduled {
            at: self.now + delay,
            seq: self.seq,
            event,
        });
    }

    pub(super) fn delay(&mut self) -> Millis {
        let f = self.faults;
        f.delay_min + self.rng.below(f.delay_max.saturating_sub(f.delay_min) + 1)
    }

    /// An ACM MAD from the QP of node `from`'s endpoint `qp`.
    pub(super) fn acm(&mut self, from: usize, qp: EpId, to: AcmDest, mad: [u8; 256]) {
        let src = &self.nodes[from];
        if !src.alive {
            return;
        }
        let Some(src_ep) = src.ep(qp) else {
            self.violations.push(format!(
                "node {from} sends on endpoint {qp:?}, which it has not"
            ));
            return;
        };
        let meta = RecvMeta {
            slid: src_ep.cfg.lid,
            src_qp: src_ep.cfg.qpn,
            sl: 0,
            dlid_path_bits: 0,
            pkey_index: 0,
            ep_pkey_index: 0,
            grh_sgid: Some(src_ep.cfg.port_gid),
        };
        let targets: Vec<(usize, EpId)> = match to {
            AcmDest::Group(_) => {
                self.acm_requests[from] += 1;
                let g = src_ep.attached;
                if g.is_none() {
                    self.violations
                        .push(format!("node {from} {qp:?} multicasts while not attached"));
                }
                let nodes = &self.nodes;
                (0..nodes.len())
                    .filter(|&j| j != from)
                    .flat_map(|j| nodes[j].eps.iter().map(move |e| (j, e)))
                    .filter(|(_, e)| e.open && e.attached == g && g.is_some())
                    .map(|(j, e)| (j, e.id))
                    .collect()
            }
            AcmDest::Unicast(av) => {
                self.acm_responses[from] += 1;
                let mut t = Vec::new();
                for j in (0..self.nodes.len()).filter(|&j| node_lid(j) == av.dlid) {
                    let n = &self.nodes[j];
                    let at = n
                        .eps
                        .iter()
                        .find(|e| av.dgid == e.cfg.port_gid && av.remote_qpn == e.cfg.qpn);
                    match at {
                        Some(e) if e.open => t.push((j, e.id)),
                        Some(_) => {}
                        None => self.violations.push(format!(
                            "node {from}: unicast AV {av:?} matches no endpoint of node {j}"
                        )),
                    }
                }
                t
            }
        };
        for (j, ep) in targets {
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
                    Event::Mad {
                        to: j,
                        ep,
                        meta,
                        mad: m,
                    },
                );
            }
        }
    }

    /// With probability `Faults::garbage`, overwrites 1–4 random bytes of `mad`.
    pub(super) fn mangle(&mut self, mad: &mut [u8; 256]) {
        if !self.rng.chance(self.faults.garbage) {
            return;
        }
        for _ in 0..1 + self.rng.below(4) {
            let at = self.rng.below(256) as usize;
            mad[at] = self.rng.next_u64() as u8;
        }
    }

    pub(super) fn deliver(&mut self, e: Event) {
        let now = self.now;
        match e {
            Event::Mad { to, ep, meta, mad } => {
                let n = &mut self.nodes[to];
                // A dead node is dead to its peers (ACM), not to the SM (class 3); a closed
                // endpoint's QP is gone.
                let qp = n.ep(ep).is_some_and(|e| e.open);
                if qp && (n.alive || mad[1] == 0x03) {
                    self.delivered += 1;
                    n.node.handle_receive(now, ep, &meta, &mad);
                }
                self.touch(to);
            }
            Event::SmReply { to, qp, sm, mad } if sm == self.sm_lid => self.sm_send(to, qp, mad),
            Event::SmReply { .. } => self.sm_port.to_old_sm += 1,
            Event::RmppTimeout { to, tid, attempt } => self.rmpp_timeout(to, tid, attempt),
            Event::Sa {
                to,
                token,
                umad_status,
                mad,
            } => self.deliver_sa(to, token, umad_status, &mad),
            Event::SaArrive {
                from,
                qp,
                token,
                mad,
            } => self.sa_arrive(from, qp, token, mad),
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
}
