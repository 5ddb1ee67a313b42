//! Fabric-change invalidation: SA event subscriptions (InformInfo SET for traps 64 and 65 on
//! every endpoint with a UD QP, when [`Config::sa_reports`](super::Config::sa_reports)) and
//! the Reports they bring.
//!
//! * A subscription is sent when the endpoint opens and again after every reregister (an SM
//!   change or failover: the new SM knows nothing of the old one's subscriptions). A refused or
//!   unanswered SET is retried with the join backoff (1 s doubling, at most 30 s).
//! * A Report is acknowledged (REPORTRESP with its TID and notice, whatever it says), then:
//!   trap 65 (GID out of service) removes every cached path to that GID and forgets the
//!   address mappings learned for it; trap 64 (GID in service) removes paths to it and every
//!   negative entry (a destination the SA did not know may be known now). A Report for a GID
//!   nobody cached changes nothing. Anything else on class 3 that is not a reply is counted
//!   in [`Stats::report_malformed`](super::Stats::report_malformed) and dropped.
//! * Closing the endpoint unsubscribes (SET with Subscribe 0, fire and forget).

use super::mads::{self, TOKEN_INFORM, TOKEN_NOTICE};
use super::storage::Slab;
use super::storage::{AddrState, GroupState, Origin};
use super::timers::Timer;
use super::{EpId, Millis, Output, Resolver, Storage};
use crate::cache::CacheRef;
use crate::wire::inform::{InformInfoRepr, TRAP_GID_IN_SERVICE, TRAP_GID_OUT_OF_SERVICE};

/// The traps every endpoint subscribes to, in `EpSlot::informs` order.
pub(crate) const TRAPS: [u16; 2] = [TRAP_GID_IN_SERVICE, TRAP_GID_OUT_OF_SERVICE];

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// (Re)starts subscription `i` of endpoint `slot`.
    pub(crate) fn start_subscribe(&mut self, now: Millis, slot: usize, i: usize) {
        let tid = self.next_tid();
        let at = now.saturating_add(self.sa_deadline_of(slot));
        self.st.endpoints()[slot].informs[i].t.send(tid, at);
        self.mark_dirty(slot);
        self.timers.arm(Timer::Inform, at);
    }

    /// Starts both subscriptions of `slot` if the configuration and the endpoint allow.
    pub(crate) fn subscribe_all(&mut self, now: Millis, slot: usize) {
        let e = self.st.endpoints()[slot];
        // One subscription per port: from the endpoint whose QP the SA reaches (OpenSM keeps
        // one record per subscriber address anyway, and an unsubscribe would end it for all).
        if !self.cfg.sa_reports || !e.open || e.qpn == 0 || !e.sa_pkey {
            return;
        }
        for i in 0..TRAPS.len() {
            self.st.endpoints()[slot].informs[i].t.tries = 0;
            self.start_subscribe(now, slot, i);
        }
    }

    /// Marks the subscriptions of a closing endpoint for an unsubscribe.
    pub(crate) fn unsubscribe_all(&mut self, slot: usize) {
        for s in self.st.endpoints()[slot].informs.iter_mut() {
            if matches!(s.t.state, GroupState::Joining | GroupState::Joined) {
                s.leave = true;
            }
            s.t.state = GroupState::Off;
        }
    }

    /// The SA's reply to subscription `i` of `slot`: taken if it accepted it (a reply that
    /// refused it is counted).
    pub(crate) fn inform_taken(
        &mut self,
        slot: usize,
        i: usize,
        umad_status: u32,
        mad: &[u8; 256],
    ) -> bool {
        if mads::inform_accepted(umad_status, mad) {
            self.st.endpoints()[slot].informs[i].t.accepted();
            return true;
        }
        if umad_status == 0 {
            self.stats.report_malformed += 1;
        }
        false
    }

    /// Subscription `i` of `slot` failed or timed out: retry later.
    pub(crate) fn inform_failed(&mut self, now: Millis, slot: usize, i: usize) {
        let at = self.st.endpoints()[slot].informs[i].t.failed(now);
        self.timers.arm(Timer::Inform, at);
    }

    /// The subscription outputs of `slot`, in order: unsubscribes, subscribes, the ack.
    pub(crate) fn inform_output(&mut self, slot: usize) -> Option<Output> {
        // Read in place, not copied: the slot is large, and this runs for every output of an
        // endpoint with work (a miss's counter bumps).
        let e = &self.st.endpoints()[slot];
        let (id, qpn) = (EpId(e.id), e.qpn);
        let leave = (0..TRAPS.len()).find(|&i| e.informs[i].leave);
        let join = (0..TRAPS.len())
            .find(|&i| e.open && e.informs[i].t.state == GroupState::Send)
            .map(|i| (i, e.informs[i].t.tid));
        let ack = e.ack.then_some((e.ack_tid, e.ack_notice));
        if let Some(i) = leave {
            self.st.endpoints()[slot].informs[i].leave = false;
            let tid = self.next_tid();
            let rec = InformInfoRepr::generic(TRAPS[i], qpn, false);
            return Some(Output::SendSa {
                ep: id,
                token: mads::token(TOKEN_NOTICE, slot as u32, tid),
                mad: mads::inform_set(tid, &rec),
            });
        }
        if let Some((i, tid)) = join {
            self.st.endpoints()[slot].informs[i].t.state = GroupState::Joining;
            let rec = InformInfoRepr::generic(TRAPS[i], qpn, true);
            return Some(Output::SendSa {
                ep: id,
                token: mads::token(TOKEN_INFORM, (slot * 2 + i) as u32, tid),
                mad: mads::inform_set(tid, &rec),
            });
        }
        if let Some((tid, notice)) = ack {
            self.st.endpoints()[slot].ack = false;
            return Some(Output::SendSa {
                ep: id,
                token: mads::token(TOKEN_NOTICE, slot as u32, tid as u32),
                mad: mads::report_response(tid, &notice),
            });
        }
        None
    }

    /// An SA MAD that is not a reply to one of our queries, received on `ep`'s UD QP: a
    /// Report is acknowledged and applied; anything else is counted and dropped.
    pub fn handle_report(&mut self, now: Millis, ep: EpId, mad: &[u8]) {
        let whole = mad.len() >= crate::wire::sa::DATA_OFFSET + crate::wire::inform::NOTICE_LEN;
        let mad = mads::full_mad(mad);
        let report = whole.then(|| mads::parse_report(&mad)).flatten();
        let (Some(slot), Some((tid, notice, raw))) = (self.ep_slot(ep), report) else {
            self.stats.report_malformed += 1;
            return;
        };
        self.stats.reports += 1;
        {
            let e = &mut self.st.endpoints()[slot];
            e.ack = true;
            e.ack_tid = tid;
            e.ack_notice = raw;
        }
        self.mark_dirty(slot);
        if let Some(gid) = notice.subject_gid() {
            match notice.trap {
                TRAP_GID_OUT_OF_SERVICE => self.invalidate_gid(&gid, false, true),
                TRAP_GID_IN_SERVICE => self.invalidate_gid(&gid, true, false),
                _ => {}
            }
        }
        self.pump(now);
    }

    /// Removes cached paths to `gid` (and, with `negatives`, every negative entry); with
    /// `forget`, the address mappings learned for `gid` too (they are asked again).
    fn invalidate_gid(&mut self, gid: &[u8; 16], negatives: bool, forget: bool) {
        let n = self
            .w
            .remove_routes_to(core::slice::from_ref(gid), negatives);
        self.stats.report_invalidated += n as u64;
        if !forget {
            return;
        }
        for i in 0..self.st.addrs().len() as u32 {
            let a = self.st.addrs()[i as usize];
            if a.state == AddrState::Resolved
                && a.origin == Origin::Learned
                && a.gid == *gid
                && a.job == 0
                && !a.send_resp
            {
                if let Some(k) = super::addr::addr_key(&a) {
                    self.w.remove_addr(&k);
                }
                self.free_addr(i);
                self.stats.report_invalidated += 1;
            }
        }
    }
}
