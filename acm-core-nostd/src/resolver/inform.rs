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
use super::storage::{GroupState, InformSlot};
use super::timers::Timer;
use super::{EpId, Millis, Output, Shared};
use crate::wire::inform::{InformInfoRepr, TRAP_GID_IN_SERVICE, TRAP_GID_OUT_OF_SERVICE};

/// The traps every endpoint subscribes to, in `Informs::subs` order.
pub(crate) const TRAPS: [u16; 2] = [TRAP_GID_IN_SERVICE, TRAP_GID_OUT_OF_SERVICE];

/// An endpoint's subscriptions and the acknowledgement of its last Report (in its
/// [`EpSlot`](super::EpSlot)).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Informs {
    /// Subscriptions to traps 64 and 65 (with `Config::sa_reports`), in [`TRAPS`] order.
    pub(crate) subs: [InformSlot; 2],
    /// A ReportResponse wants sending: the Report's TID and notice.
    pub(crate) ack: bool,
    pub(crate) ack_tid: u64,
    pub(crate) ack_notice: [u8; 80],
}

impl Informs {
    /// Nothing subscribed, nothing to acknowledge.
    pub(crate) const EMPTY: Informs = Informs {
        subs: [InformSlot::EMPTY; 2],
        ack: false,
        ack_tid: 0,
        ack_notice: [0; 80],
    };

    /// (Re)starts subscription `i`, its reply due by `at` (the endpoint has an output to
    /// poll).
    pub(crate) fn start(&mut self, i: usize, at: Millis, sh: &mut Shared) {
        let tid = sh.next_tid();
        self.subs[i].t.send(tid, at);
        sh.timers.arm(Timer::Inform, at);
    }

    /// Starts both subscriptions, replies due by `at`, if the configuration and the endpoint
    /// (open: `open`, its UD QP `qpn`, on the SA's P_Key: `sa_pkey`) allow; true if it did.
    pub(crate) fn subscribe_all(
        &mut self,
        (open, qpn, sa_pkey): (bool, u32, bool),
        at: Millis,
        sh: &mut Shared,
    ) -> bool {
        // One subscription per port: from the endpoint whose QP the SA reaches (OpenSM keeps
        // one record per subscriber address anyway, and an unsubscribe would end it for all).
        if !sh.cfg.sa_reports || !open || qpn == 0 || !sa_pkey {
            return false;
        }
        for i in 0..TRAPS.len() {
            self.subs[i].t.tries = 0;
            self.start(i, at, sh);
        }
        true
    }

    /// Closing: every subscription held or asked for is unsubscribed.
    pub(crate) fn unsubscribe_all(&mut self) {
        for s in self.subs.iter_mut() {
            if matches!(s.t.state, GroupState::Joining | GroupState::Joined) {
                s.leave = true;
            }
            s.t.state = GroupState::Off;
        }
    }

    /// The SA's reply to subscription `i`: taken if it accepted it (a reply that refused it
    /// is counted).
    pub(crate) fn accept_reply(
        &mut self,
        i: usize,
        umad_status: u32,
        mad: &[u8; 256],
        sh: &mut Shared,
    ) -> bool {
        if mads::inform_accepted(umad_status, mad) {
            self.subs[i].t.accepted();
            return true;
        }
        if umad_status == 0 {
            sh.stats.report_malformed += 1;
        }
        false
    }

    /// Subscription `i` failed or timed out: retry later.
    pub(crate) fn failed(&mut self, now: Millis, i: usize, sh: &mut Shared) {
        let at = self.subs[i].t.failed(now);
        sh.timers.arm(Timer::Inform, at);
    }

    /// A Report to acknowledge: its TID and notice.
    pub(crate) fn acknowledge(&mut self, tid: u64, notice: [u8; 80]) {
        self.ack = true;
        self.ack_tid = tid;
        self.ack_notice = notice;
    }

    /// The subscription outputs of endpoint `id` in slot `slot` (open: `open`; the SA reports
    /// to its QP `qpn`), in order: unsubscribes, subscribes (only while open), the ack.
    pub(crate) fn output(
        &mut self,
        (slot, id): (usize, EpId),
        open: bool,
        qpn: u32,
        sh: &mut Shared,
    ) -> Option<Output> {
        if let Some(i) = (0..TRAPS.len()).find(|&i| self.subs[i].leave) {
            self.subs[i].leave = false;
            let tid = sh.next_tid();
            let rec = InformInfoRepr::generic(TRAPS[i], qpn, false);
            return Some(Output::SendSa {
                ep: id,
                token: mads::token(TOKEN_NOTICE, slot as u32, tid),
                mad: mads::inform_set(tid, &rec),
            });
        }
        let join = (0..TRAPS.len()).find(|&i| open && self.subs[i].t.state == GroupState::Send);
        if let Some(i) = join {
            let tid = self.subs[i].t.tid;
            self.subs[i].t.state = GroupState::Joining;
            let rec = InformInfoRepr::generic(TRAPS[i], qpn, true);
            return Some(Output::SendSa {
                ep: id,
                token: mads::token(TOKEN_INFORM, (slot * 2 + i) as u32, tid),
                mad: mads::inform_set(tid, &rec),
            });
        }
        if self.ack {
            self.ack = false;
            let (tid, notice) = (self.ack_tid, self.ack_notice);
            return Some(Output::SendSa {
                ep: id,
                token: mads::token(TOKEN_NOTICE, slot as u32, tid as u32),
                mad: mads::report_response(tid, &notice),
            });
        }
        None
    }
}
