//! Draining outputs: everything the resolver owes the caller is derived from state it holds.
//!
//! Order of [`Resolver::poll_output`](super::Resolver::poll_output): per-endpoint work
//! ([`EpSlot::poll`]: detach before leave before join before attach, then counters), SA
//! queries ([`Routes::poll`](super::route::Routes::poll)), ACM MADs
//! ([`Addrs::poll`](super::addr::Addrs::poll)), client answers
//! ([`Answers::pop`](super::answers::Answers::pop)).

use super::mads::{self, TOKEN_JOIN, TOKEN_LEAVE};
use super::storage::GroupState;
use super::{Counter, EpSlot, Output, Shared};
use crate::wire::gid::Gid;
use crate::wire::mad::Method;

const COUNTERS: [Counter; 7] = [
    Counter::Error,
    Counter::Resolve,
    Counter::NoData,
    Counter::AddrQuery,
    Counter::AddrCache,
    Counter::RouteQuery,
    Counter::RouteCache,
];

impl EpSlot {
    /// The next output of this endpoint (slot `slot`), `None` when it has none left.
    pub(crate) fn poll(&mut self, slot: usize, sh: &mut Shared) -> Option<Output> {
        let e = self;
        let id = e.id;
        let joined = e.open && e.groups.joined();
        let want = joined.then_some(&e.groups[0].record);
        if e.attached && (e.force_detach || want != Some(&e.attached_record)) {
            let group = mads::group_of(0, &e.attached_record);
            e.attached = false;
            e.force_detach = false;
            return Some(Output::Detach { ep: id, group });
        }
        if let Some(g) = (0..2).find(|&g| e.groups[g].leave) {
            let record = e.groups[g].leave_record;
            e.groups[g].leave = false;
            let tid = sh.next_tid();
            return Some(Output::SendSa {
                ep: id,
                token: mads::token(TOKEN_LEAVE, (slot * 2 + g) as u32, tid),
                mad: mads::mcmember(Method::Delete, tid, &record),
            });
        }
        if let Some(g) = (0..2).find(|&g| e.open && e.groups[g].t.state == GroupState::Send) {
            let gs = &e.groups[g];
            let tid = gs.t.tid;
            let rec = mads::join_record(Gid(e.port_gid), e.pkey, gs.rate, gs.mtu);
            e.groups[g].t.state = GroupState::Joining;
            return Some(Output::SendSa {
                ep: id,
                token: mads::token(TOKEN_JOIN, (slot * 2 + g) as u32, tid),
                mad: mads::mcmember(Method::Set, tid, &rec),
            });
        }
        if let Some(o) = e.informs.output((slot, id), e.open, e.qpn, sh) {
            return Some(o);
        }
        if e.table.probe_send {
            let view = e.view(e.cache_ep);
            if let Some((token, mad)) = e.table.probe_output(slot, e.open, &view, &sh.cfg) {
                return Some(Output::SendSa { ep: id, token, mad });
            }
        }
        if let Some((token, mad)) = e.table.output(slot, e.open, Gid(e.port_gid), e.pkey) {
            return Some(Output::SendSa { ep: id, token, mad });
        }
        if !e.attached && joined {
            e.attached = true;
            e.attached_record = e.groups[0].record;
            return Some(Output::Attach {
                ep: id,
                group: mads::group_of(0, &e.attached_record),
            });
        }
        let c = e.counts.iter().position(|&n| n > 0)?;
        e.counts[c] -= 1;
        Some(Output::Count {
            ep: id,
            counter: COUNTERS[c],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_in_acm_cntr_order() {
        for (i, c) in COUNTERS.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
    }
}
