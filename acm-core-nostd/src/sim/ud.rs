//! The SA as one more port of the UD fabric ([`Transport::Ud`](crate::node::Transport), the
//! shipped default): the SM at LID [`SM_LID`], QP 1.
//!
//! A node's SA MADs reach the SM's port from the QP that carried them, its port's SA carrier
//! (`Sim::sm_receive`); the answers leave it for that QP (`Sim::sm_send`) and cross the
//! fabric as any MAD does:
//! lost, duplicated, delayed (so reordered) and garbled as [`Faults`](super::Faults) says,
//! and with [`Faults::sa_forged`](super::Faults::sa_forged) followed by a copy from a wrong
//! sender (another node's LID), which the node's SA channel must refuse. The tries are the
//! node's (its SA channel's); nothing here re-sends a query.
//!
//! A GetTable answer is an RMPP transfer, sent as the kernel MAD layer sends one for OpenSM:
//! the first segment, then as many as each ACK's NewWindowLast grants; an ACK naming an
//! earlier segment than the sender is at (the receiver missed one) sends again from there
//! (go-back-N), and so does a silence of [`RMPP_RESP_MS`], [`RMPP_TRIES`] times, after which
//! the sender gives up. STOP and ABORT end the transfer. Every segment and ACK is one MAD of
//! the SM's port ([`SmPortStats`]), and costs it its time per MAD with the SA model
//! ([`SaService::sm_mad_ns`](super::SaService)).

use std::vec::Vec;

use super::net::Event;
use super::{node_lid, Sim, SM_LID, SM_LID_MOVED};
use crate::resolver::EpId;
use crate::rmpp;
use crate::wire::mad::{
    Header, Method, RmppHeader, RmppRepr, RmppType, HEADER_LEN, MAD_LEN, RMPP_FLAG_ACTIVE,
};
use crate::wire::path_record::{PathRecord, PATH_RECORD_LEN};
use crate::wire::sa::{attr, SaPacket, DATA_OFFSET};

/// How long the SM's RMPP sender waits for an ACK before it sends again from the last
/// acknowledged segment (ms).
pub const RMPP_RESP_MS: u64 = 400;

/// Silences the SM's RMPP sender sits out before it gives a transfer up.
pub const RMPP_TRIES: u32 = 5;

/// What the SM's port took in and sent (`ud`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmPortStats {
    /// MADs received: queries (first sends and the nodes' re-sends), RMPP ACKs, STOPs,
    /// ABORTs, responses.
    pub received: u64,
    /// Of `received`, RMPP ACKs (and STOPs, ABORTs).
    pub acks: u64,
    /// MADs sent: single-MAD answers and RMPP segments (copies by the fabric not counted).
    pub sent: u64,
    /// Of `sent`, RMPP DATA segments (first sends and go-back-N re-sends).
    pub segments: u64,
    /// GetTable transfers begun.
    pub transfers: u64,
    /// Transfers the receiver acknowledged to the end.
    pub transfers_done: u64,
    /// Transfers the sender gave up (silence) or the receiver stopped or aborted.
    pub transfers_ended: u64,
    /// Copies from a wrong sender put on the fabric ([`Faults::sa_forged`](super::Faults)).
    pub forged: u64,
    /// Of `forged`, those from the SM's LID but another QP than 1.
    pub forged_qp: u64,
    /// RMPP DATA segments the fabric lost, and those it delivered twice.
    pub segments_lost: u64,
    /// See `segments_lost`.
    pub segments_repeated: u64,
    /// MADs from the nodes the fabric lost before the SM's port (the instant model), of
    /// them RMPP ACKs, and MADs it delivered to the port twice.
    pub lost_in: u64,
    /// See `lost_in`.
    pub acks_lost: u64,
    /// See `lost_in`.
    pub dup_in: u64,
    /// Times the SM moved ([`Faults::sm_move`](super::Faults)), reads that found no SM
    /// ([`Faults::sm_unknown`](super::Faults)), and MADs to or answers of an SM that had
    /// moved away (lost).
    pub moves: u64,
    /// Of `moves`, those while a node had SA requests out (in its SA channel).
    pub moves_mid_query: u64,
    /// See `moves`.
    pub unknown_reads: u64,
    /// See `moves`.
    pub to_old_sm: u64,
    /// Half-world tables sent cut short ([`Faults::table_cut`](super::Faults)).
    pub tables_cut: u64,
}

/// One GetTable answer the SM's port is sending.
pub(super) struct Transfer {
    /// The endpoint whose QP asked for it (its segments go there).
    qp: EpId,
    head: [u8; DATA_OFFSET],
    records: Vec<u8>,
    total: u32,
    /// The last segment acknowledged.
    acked: u32,
    /// The last segment the receiver granted.
    window_last: u32,
    /// The next segment to send.
    next: u32,
    /// Sends so far: the number of the one timeout that counts.
    armed: u32,
    /// Silences sat out since the last ACK.
    silences: u32,
}

impl Sim {
    /// An SA MAD from the QP of node `from`'s endpoint `qp` reaches the SM's port.
    /// (A dead node, [`Node::alive`](super::Node) false, is dead to its peers only: the SM
    /// still hears it and answers it, as the core's service model does.)
    pub(super) fn sm_receive(&mut self, from: usize, qp: EpId, mad: [u8; MAD_LEN]) {
        self.sm_port.received += 1;
        let head = Header::new_unchecked(&mad[..HEADER_LEN]);
        let rmpp = RmppRepr::parse(&RmppHeader::new_unchecked(&mad[HEADER_LEN..]));
        if let Ok(r) = rmpp {
            if r.flags & RMPP_FLAG_ACTIVE != 0 && r.rmpp_type != RmppType::Data {
                self.sm_port.acks += 1;
                self.sm_port(self.now.saturating_mul(1_000_000), true);
                return self.rmpp_ack(from, head.tid(), r);
            }
        }
        if head.method().is_response() {
            // A ReportResponse: the SM takes it and answers nothing.
            return;
        }
        if let (Some(svc), Method::Get | Method::GetTable, attr::PATH_RECORD) =
            (self.sa_service, head.method(), head.attr_id())
        {
            self.sa_queries += 1;
            // What the sender put on the wire; the node's SA channel sends a query again with
            // its wire TID.
            self.sa_stats.sent += 1;
            if !self.sm_seen.insert((from, head.tid())) {
                self.sa_stats.retransmits += 1;
            }
            if self.rng.chance(svc.loss) {
                self.sa_stats.lost += 1;
                return;
            }
            let ev = Event::SaArrive {
                from,
                qp,
                token: None,
                mad,
            };
            return self.schedule(svc.latency, ev);
        }
        if let Some(reply) = self.instant_answer(from, &mad) {
            let d = 1 + self.rng.below(self.faults.sa_delay_max);
            self.schedule(
                d,
                Event::SmReply {
                    to: from,
                    qp,
                    sm: self.sm_lid,
                    mad: reply,
                },
            );
        }
    }

    /// The SM's port sends the answer `mad` to the QP of node `to`'s endpoint `qp`: a whole
    /// GetTable answer as an RMPP transfer (the records of the partition it asked for),
    /// anything else as one MAD.
    pub(super) fn sm_send(&mut self, to: usize, qp: EpId, mad: [u8; MAD_LEN]) {
        let h = Header::new_unchecked(&mad[..HEADER_LEN]);
        if h.method() != Method::GetTableResp || !h.status().is_success() {
            return self.sm_deliver(to, qp, mad);
        }
        let pkey =
            PathRecord::new_unchecked(&mad[DATA_OFFSET..DATA_OFFSET + PATH_RECORD_LEN]).pkey();
        // AttributeOffset: a PathRecord is 8 words.
        let mut head = [0u8; DATA_OFFSET];
        head.copy_from_slice(&mad[..DATA_OFFSET]);
        SaPacket::new_unchecked(&mut head[..]).set_attr_offset(8);
        let mut records = self.table_records(to, pkey);
        let cut_it = self.faults.table_cut != 0 && self.rng.chance(self.faults.table_cut);
        if cut_it && records.len() > PATH_RECORD_LEN {
            // A PayloadLength that cuts the last record.
            self.sm_port.tables_cut += 1;
            let cut = 1 + self.rng.below(PATH_RECORD_LEN as u64 - 1) as usize;
            records.truncate(records.len() - cut);
        }
        let tid = Header::new_unchecked(&mad[..HEADER_LEN]).tid();
        self.sm_port.transfers += 1;
        self.sa_stats.table_records_delivered += (records.len() / 64) as u64;
        let t = Transfer {
            qp,
            head,
            total: rmpp::segment_count(records.len()),
            records,
            acked: 0,
            window_last: 1,
            next: 1,
            armed: 0,
            silences: 0,
        };
        self.transfers.insert((to, tid), t);
        self.rmpp_send(to, tid);
    }

    /// One MAD from the SM's QP 1 to the QP of node `to`'s endpoint `ep`, with the fabric's
    /// faults; with [`Faults::sa_forged`](super::Faults), a copy from another node's LID
    /// follows it.
    fn sm_deliver(&mut self, to: usize, ep: EpId, mad: [u8; MAD_LEN]) {
        self.sm_port.sent += 1;
        // PathRecord answers and segments leave after the SM's port has sent them
        // ([`SaService::sm_mad_ns`](super::SaService); joins and the like keep the instant model).
        let late = if Header::new_unchecked(&mad[..HEADER_LEN]).attr_id() == attr::PATH_RECORD {
            self.sm_port_send(self.now)
        } else {
            0
        };
        let mut meta = self.sm().recv_meta();
        let loss = self.sa_service.map_or(self.faults.loss, |s| s.loss);
        let segment = is_segment(&mad);
        if self.rng.chance(loss) {
            self.sa_stats.lost += u64::from(self.sa_service.is_some());
            self.sm_port.segments_lost += u64::from(segment);
        } else {
            let copies = if self.rng.chance(self.faults.dup) {
                self.sm_port.segments_repeated += u64::from(segment);
                2
            } else {
                1
            };
            for _ in 0..copies {
                let d = self.sm_delay() + late;
                let mut m = mad;
                self.mangle(&mut m);
                self.schedule(
                    d,
                    Event::Mad {
                        to,
                        ep,
                        meta,
                        mad: m,
                    },
                );
            }
        }
        if self.rng.chance(self.faults.sa_forged) {
            self.sm_port.forged += 1;
            if self.rng.chance(500) {
                // From the SM's LID, but not its QP 1.
                self.sm_port.forged_qp += 1;
                meta.src_qp = 2 + self.rng.below(0xff_fffd) as u32;
            } else {
                meta.slid = node_lid(self.rng.below(self.nodes.len() as u64) as usize);
            }
            let d = self.sm_delay() + late;
            self.schedule(d, Event::Mad { to, ep, meta, mad });
        }
    }

    /// A MAD from the QP of node `from`'s endpoint `qp` on its way to the SM at LID `dlid`:
    /// lost if the SM is no longer there; in the instant model the fabric may lose or repeat
    /// it (a Get, an ACK) as it does any MAD.
    pub(super) fn send_to_sm(&mut self, from: usize, qp: EpId, dlid: u16, mad: [u8; MAD_LEN]) {
        if dlid != self.sm_lid {
            self.sm_port.to_old_sm += 1;
            return;
        }
        // (No draw without the faults: a run without them stays the run it was.)
        if self.sa_service.is_none() {
            if self.faults.loss != 0 && self.rng.chance(self.faults.loss) {
                self.sm_port.lost_in += 1;
                self.sm_port.acks_lost += u64::from(is_ack(&mad));
                return;
            }
            if self.faults.dup != 0 && self.rng.chance(self.faults.dup) {
                self.sm_port.dup_in += 1;
                self.sm_receive(from, qp, mad);
            }
        }
        self.sm_receive(from, qp, mad)
    }

    /// The SM moves to its other LID: what the old one had not answered, it never will.
    pub(super) fn sm_moves(&mut self) {
        self.sm_port.moves += 1;
        let busy = self.nodes.iter().any(|n| !n.node.sa().is_empty());
        self.sm_port.moves_mid_query += u64::from(busy);
        self.sm_lid = if self.sm_lid == SM_LID {
            SM_LID_MOVED
        } else {
            SM_LID
        };
        self.transfers.clear();
    }

    /// One way between the SM's port and a node (ms).
    fn sm_delay(&mut self) -> u64 {
        match self.sa_service {
            Some(s) => s.latency,
            None => self.delay(),
        }
    }

    /// Sends transfer (`to`, `tid`)'s segments from `next` up to what the receiver granted,
    /// and waits for an ACK.
    fn rmpp_send(&mut self, to: usize, tid: u64) {
        let Some(t) = self.transfers.get_mut(&(to, tid)) else {
            return;
        };
        let mut out = Vec::new();
        while t.next <= t.window_last.min(t.total) {
            if let Some(seg) = rmpp::segment(&t.head, &t.records, t.next) {
                out.push(seg);
            }
            t.next += 1;
        }
        t.armed += 1;
        let (attempt, qp) = (t.armed, t.qp);
        self.sm_port.segments += out.len() as u64;
        for seg in out {
            self.sm_deliver(to, qp, seg);
        }
        self.schedule(RMPP_RESP_MS, Event::RmppTimeout { to, tid, attempt });
    }

    /// An ACK, STOP or ABORT from node `from` for transfer `tid`.
    fn rmpp_ack(&mut self, from: usize, tid: u64, r: RmppRepr) {
        let Some(t) = self.transfers.get_mut(&(from, tid)) else {
            // Of a transfer that ended (the receiver asks for our last word again): nothing
            // more to send.
            return;
        };
        if r.rmpp_type != RmppType::Ack {
            self.transfers.remove(&(from, tid));
            self.sm_port.transfers_ended += 1;
            return;
        }
        t.acked = t.acked.max(r.seg_num.min(t.total));
        t.window_last = t.window_last.max(r.paylen_newwin);
        if t.acked >= t.total {
            self.transfers.remove(&(from, tid));
            self.sm_port.transfers_done += 1;
            return;
        }
        // Go-back-N: the receiver stands at `acked`.
        t.next = t.acked + 1;
        t.silences = 0;
        self.rmpp_send(from, tid);
    }

    /// The SM's RMPP sender heard nothing for `attempt`'s wait: from the last acknowledged
    /// segment again, or give up.
    pub(super) fn rmpp_timeout(&mut self, to: usize, tid: u64, attempt: u32) {
        let Some(t) = self.transfers.get_mut(&(to, tid)) else {
            return;
        };
        if t.armed != attempt {
            return;
        }
        t.silences += 1;
        if t.silences >= RMPP_TRIES {
            self.transfers.remove(&(to, tid));
            self.sm_port.transfers_ended += 1;
            return;
        }
        t.next = t.acked + 1;
        self.rmpp_send(to, tid);
    }
}

/// An RMPP-active MAD and its type.
fn rmpp_type(mad: &[u8; MAD_LEN]) -> Option<RmppType> {
    let r = RmppRepr::parse(&RmppHeader::new_unchecked(&mad[HEADER_LEN..])).ok()?;
    (r.flags & RMPP_FLAG_ACTIVE != 0).then_some(r.rmpp_type)
}

/// An RMPP DATA segment.
fn is_segment(mad: &[u8; MAD_LEN]) -> bool {
    rmpp_type(mad) == Some(RmppType::Data)
}

/// An RMPP ACK.
fn is_ack(mad: &[u8; MAD_LEN]) -> bool {
    rmpp_type(mad) == Some(RmppType::Ack)
}
