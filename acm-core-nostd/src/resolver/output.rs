//! Draining outputs: everything the resolver owes the caller is derived from state it holds.
//!
//! Order of [`Resolver::poll_output`]: per-endpoint work (detach before leave before join
//! before attach, then counters), SA queries, ACM MADs, client answers.

use super::mads::{self, TOKEN_JOIN, TOKEN_LEAVE, TOKEN_ROUTE};
use super::storage::{list_id, AddrState, GroupState, JobState, Slab, ADDR_S, JOB};
use super::{AcmDest, Counter, EpId, Output, Resolver, Storage, UnicastAv};
use crate::cache::CacheRef;
use crate::wire::acm_mad::AddressType;
use crate::wire::gid::Gid;
use crate::wire::mad::Method;
use crate::wire::mcmember::{McMemberRepr, ACM_QKEY};

const COUNTERS: [Counter; 7] = [
    Counter::Error,
    Counter::Resolve,
    Counter::NoData,
    Counter::AddrQuery,
    Counter::AddrCache,
    Counter::RouteQuery,
    Counter::RouteCache,
];

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// The next thing for the caller to do, `None` when there is nothing. Call it until `None`
    /// after every input (see the draining rule on [`Resolver`]).
    #[must_use]
    // Never inlined: a caller's loop calls it in several places, and each inlined copy is
    // kilobytes of flash on a microcontroller (docs/firmware.md).
    #[inline(never)]
    pub fn poll_output(&mut self) -> Option<Output> {
        while let Some(slot) = self.eps.first_dirty() {
            if let Some(o) = self.ep_output(slot) {
                return Some(o);
            }
            self.eps.clean(slot);
        }
        if let Some(j) = self
            .routes
            .send
            .pop_front(self.st.jobs(), list_id::SA_SEND, JOB)
        {
            let job = &mut self.st.jobs()[j as usize];
            job.state = JobState::Sent;
            job.held = true;
            let (slot, tid, sa) = (usize::from(job.slot), job.tid, job.sa);
            self.routes
                .sent
                .push_back(self.st.jobs(), j, list_id::SENT, JOB);
            let ep = EpId(self.st.endpoints()[slot].id);
            return Some(Output::SendSa {
                ep,
                token: mads::token(TOKEN_ROUTE, j, tid),
                mad: mads::path_get(tid, &sa),
            });
        }
        while let Some(i) = self.addrs.send.front() {
            if let Some(o) = self.acm_output(i) {
                return Some(o);
            }
        }
        self.answers.pop(self.st.slabs().requests)
    }

    fn ep_output(&mut self, slot: usize) -> Option<Output> {
        // Read in place, not copied: the slot is large, and this runs for every output of an
        // endpoint with work (a miss's counter bumps); each branch copies what it sends.
        let e = &self.st.endpoints()[slot];
        let id = EpId(e.id);
        let joined = e.open && e.groups[0].t.state == GroupState::Joined;
        let want = joined.then_some(&e.groups[0].record);
        if e.attached && (e.force_detach || want != Some(&e.attached_record)) {
            let group = mads::group_of(0, &e.attached_record);
            let s = &mut self.st.endpoints()[slot];
            s.attached = false;
            s.force_detach = false;
            return Some(Output::Detach { ep: id, group });
        }
        if let Some(g) = (0..2).find(|&g| e.groups[g].leave) {
            let record = e.groups[g].leave_record;
            self.st.endpoints()[slot].groups[g].leave = false;
            let tid = self.next_tid();
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
            self.st.endpoints()[slot].groups[g].t.state = GroupState::Joining;
            return Some(Output::SendSa {
                ep: id,
                token: mads::token(TOKEN_JOIN, (slot * 2 + g) as u32, tid),
                mad: mads::mcmember(Method::Set, tid, &rec),
            });
        }
        if let Some(o) = self.inform_output(slot) {
            return Some(o);
        }
        if let Some((token, mad)) = self.table_output(slot) {
            return Some(Output::SendSa { ep: id, token, mad });
        }
        let e = &mut self.st.endpoints()[slot];
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

    /// The next ACM MAD of entry `i` (taking it off the send list when it has no more).
    fn acm_output(&mut self, i: u32) -> Option<Output> {
        let a = self.st.addrs()[i as usize];
        let slot = usize::from(a.slot);
        let e = self.st.endpoints()[slot];
        let id = EpId(e.id);
        if a.send_query {
            self.st.addrs()[i as usize].send_query = false;
            if !a.send_resp {
                self.addrs
                    .send
                    .remove(self.st.addrs(), i, list_id::ACM_SEND, ADDR_S);
            }
            // Multicast only while attached to group 0 (after a reregister the try is lost;
            // the retry timer runs on).
            if a.state == AddrState::Querying && e.open && e.groups[0].t.state == GroupState::Joined
            {
                let (src_type, src) = self.source_of(slot, &a);
                let mut mgids = [Gid::ZERO; 2];
                let mut n = 0;
                for g in &e.groups {
                    if g.t.state == GroupState::Joined {
                        mgids[n] = Gid::from_bytes(&g.record[..16]).unwrap_or(Gid::ZERO);
                        n += 1;
                    }
                }
                return Some(Output::SendAcm {
                    ep: id,
                    to: AcmDest::Group(0),
                    mad: mads::acm_request(a.tid, a.type_, &a.addr, src_type, &src, &mgids[..n]),
                });
            }
            return None;
        }
        self.addrs
            .send
            .remove(self.st.addrs(), i, list_id::ACM_SEND, ADDR_S);
        if !a.send_resp {
            return None;
        }
        self.st.addrs()[i as usize].send_resp = false;
        let g = usize::from(a.resp_group).checked_sub(1)?;
        let gs = e.groups.get(g)?;
        if !e.open || gs.t.state != GroupState::Joined {
            return None;
        }
        let rec = McMemberRepr::parse_bytes(&gs.record).ok()?;
        Some(Output::SendAcm {
            ep: id,
            to: AcmDest::Unicast(UnicastAv {
                dlid: a.lid,
                sl: rec.sl,
                src_path_bits: a.path_bits,
                static_rate: rec.rate,
                dgid: Gid(a.gid),
                flow_label: rec.flow_label,
                hop_limit: rec.hop_limit,
                tclass: rec.tclass,
                remote_qpn: a.qpn,
                remote_qkey: ACM_QKEY,
            }),
            mad: mads::acm_response(a.resp_tid, rec.mgid),
        })
    }

    /// The source of our request for `a`: the client's source entry, else one of the
    /// endpoint's local addresses, else our port GID (type GID).
    fn source_of(&self, slot: usize, a: &super::AddrEntry) -> (AddressType, [u8; 64]) {
        if a.src_type != AddressType::Invalid {
            return (a.src_type, a.src);
        }
        let t = self.st.slabs_ref();
        if let Some(l) = t.endpoints[slot].locals.front() {
            let la = &t.addrs[l as usize];
            return (la.type_, la.addr);
        }
        let mut g = [0u8; 64];
        g[..16].copy_from_slice(&t.endpoints[slot].port_gid);
        (AddressType::Gid, g)
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
