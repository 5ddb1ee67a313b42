//! Address resolution over the ACM multicast protocol (class 0x2C): our queries (an
//! endpoint's queue and window of multicast requests, their retries), and what peers send
//! (requests we answer and learn from, responses that resolve our queries).
//!
//! An entry of the [address table](super::addr) waits `Queued` on its endpoint's ACM queue
//! (FIFO, `queue_deadline`) until the endpoint has joined group 0 and its window
//! (`acm_window`) has room, then goes out `Querying` (same TID on each retry, every
//! `timeout` plus the port's subnet timeout, `retries` times), and becomes `Resolved` with the
//! answering peer's GID, LID and QPN from the response's GRH and completion.

use super::addr::addr_key;
use super::storage::Slab;
use super::storage::{list_id, AddrState, List, ADDR_Q, ADDR_S};
use super::timers::Timer;
use super::{AddrEntry, Counter, EpId, Millis, RecvMeta, Resolver, Storage};
use crate::cache::CacheRef;
use crate::wire::acm_mad::{AcmMad, AcmResolveRepr, AddressType, ACM_MGMT_CLASS, CTRL_RESOLVE};
use crate::wire::client::Status;
use crate::wire::gid::Gid;
use crate::wire::mad::Method;
use crate::wire::path_record::PathRecord;

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// The path ACM route mode builds from the group (libibacmp's `acmp_record_acm_route`): the
    /// group's path with DGID = the peer's GID, DLID = its LID, SLID = ours, reversible, and
    /// SL, MTU, rate, packet lifetime, traffic class, flow label, hop limit and P_Key from the
    /// MCMemberRecord.
    pub(crate) fn acm_path(&self, slot: usize, a: &AddrEntry) -> Option<[u8; 64]> {
        let rec = self.group_record(slot, a.group)?;
        let e = &self.st.slabs_ref().endpoints[slot];
        let g = crate::wire::mcmember::McMemberRepr::parse_bytes(&rec).ok()?;
        let mut r = [0u8; 64];
        let mut p = PathRecord::new_unchecked(&mut r[..]);
        p.set_dgid(Gid(a.gid));
        p.set_sgid(Gid(e.port_gid));
        p.set_dlid(a.lid);
        p.set_slid(e.lid);
        p.set_flow(false, g.flow_label, g.hop_limit);
        p.set_tclass(g.tclass);
        p.set_reversible_numpath(true, 1);
        p.set_pkey(g.pkey);
        p.set_qosclass_sl(0, g.sl);
        // MTU, rate and packet lifetime bytes verbatim, selector bits included.
        r[54] = rec[38];
        r[55] = rec[42];
        r[56] = rec[43];
        Some(r)
    }

    /// Puts entry `i` (Resolved, no job) on its endpoint's ACM queue (QUERY_ADDR).
    pub(crate) fn requeue(&mut self, now: Millis, slot: usize, i: u32) {
        let at = now.saturating_add(self.cfg.queue_deadline);
        let t = self.st.slabs();
        let a = &mut t.addrs[i as usize];
        a.state = AddrState::Queued;
        a.timer = at;
        a.tries = 0;
        t.endpoints[slot]
            .queue
            .push_back(t.addrs, i, list_id::ACM_QUEUE, ADDR_Q);
        self.addrs.active += 1;
        self.timers.arm(Timer::AcmQueue, at);
    }

    /// Sends queued address queries of endpoint `slot` while its ACM window has room.
    pub(crate) fn pump_acm(&mut self, now: Millis, slot: usize) {
        if !self.ep_ready(slot) {
            return;
        }
        let try_ms = self.acm_try(slot);
        while self.st.slabs_ref().endpoints[slot].acm_inflight < self.cfg.acm_window {
            let t = self.st.slabs();
            let Some(i) = t.endpoints[slot]
                .queue
                .pop_front(t.addrs, list_id::ACM_QUEUE, ADDR_Q)
            else {
                break;
            };
            let tid = u64::from(self.next_tid());
            let t = self.st.slabs();
            let e = &mut t.endpoints[slot];
            let at = now.saturating_add(try_ms);
            let a = &mut t.addrs[i as usize];
            a.state = AddrState::Querying;
            a.tid = tid;
            a.tries = 0;
            a.timer = at;
            a.send_query = true;
            e.inflight
                .push_back(t.addrs, i, list_id::ACM_INFLIGHT, ADDR_Q);
            e.acm_inflight += 1;
            let id = EpId(e.id);
            self.addrs
                .send
                .push_back(t.addrs, i, list_id::ACM_SEND, ADDR_S);
            self.count(id, Counter::AddrQuery);
            self.timers.arm(Timer::AcmRetry, at);
        }
    }

    /// How long one try of an ACM query of endpoint `slot` waits.
    fn acm_try(&self, slot: usize) -> Millis {
        self.cfg
            .acm_timeout
            .saturating_add(self.st.slabs_ref().endpoints[slot].subnet_timeout)
            .max(1)
    }

    /// ACM queue deadlines of endpoint `slot` (the queue is in deadline order: only due heads
    /// are looked at).
    pub(crate) fn acm_queue_timers(&mut self, now: Millis, slot: usize) {
        let ready = self.ep_ready(slot);
        while let Some(i) = self.st.slabs_ref().endpoints[slot].queue.front() {
            if self.st.slabs_ref().addrs[i as usize].timer > now {
                break;
            }
            // Waiting for the group join: ibacmp's "endpoint not ready" ENODATA.
            let status = if ready {
                Status::Etimedout
            } else {
                Status::Enodata
            };
            self.stats.timeouts += u64::from(ready);
            self.fail_addr(i, status);
        }
    }

    /// ACM retries of endpoint `slot` (the in-flight list is in deadline order).
    pub(crate) fn acm_retry_timers(&mut self, now: Millis, slot: usize) {
        let try_ms = self.acm_try(slot);
        while let Some(i) = self.st.slabs_ref().endpoints[slot].inflight.front() {
            let a = self.st.slabs_ref().addrs[i as usize];
            if a.timer > now {
                break;
            }
            if a.tries < self.cfg.acm_retries {
                // Same TID, as ibacmp re-posts the same message; to the back of the list.
                let at = now.saturating_add(try_ms);
                let t = self.st.slabs();
                let l = &mut t.endpoints[slot].inflight;
                l.remove(t.addrs, i, list_id::ACM_INFLIGHT, ADDR_Q);
                l.push_back(t.addrs, i, list_id::ACM_INFLIGHT, ADDR_Q);
                let a = &mut t.addrs[i as usize];
                a.tries += 1;
                a.timer = at;
                a.send_query = true;
                self.addrs
                    .send
                    .push_back(t.addrs, i, list_id::ACM_SEND, ADDR_S);
                self.timers.arm(Timer::AcmRetry, at);
            } else {
                self.stats.timeouts += 1;
                self.fail_addr(i, Status::Etimedout);
            }
        }
    }

    /// Whether `addr` is a local address of an open endpoint other than `slot` (another
    /// partition): a request for it that arrives on `slot` crossed partitions.
    fn local_elsewhere(&self, slot: usize, type_: AddressType, addr: &[u8; 64]) -> bool {
        let t = self.st.slabs_ref();
        let n = t.endpoints.len().min(super::MAX_EPS);
        (0..n).any(|o| {
            o != slot
                && t.endpoints[o].open
                && self
                    .find_addr(o, type_, addr)
                    .is_some_and(|i| t.addrs[i as usize].state == AddrState::Local)
        })
    }

    /// Records what a peer's packet says about it: entry `i` becomes ADDR_RESOLVED with the
    /// peer's GID (GRH), LID, QPN and the shared group; waiters move on to the route.
    fn resolved(
        &mut self,
        now: Millis,
        slot: usize,
        i: u32,
        sgid: Gid,
        meta: &RecvMeta,
        group: u8,
    ) {
        let a = self.st.addrs()[i as usize];
        let was_querying = matches!(a.state, AddrState::Queued | AddrState::Querying);
        if was_querying {
            self.unlink_q(i);
            self.addrs.active -= 1;
        } else if a.gid != sgid.0 {
            // The peer's GID changed: the old alias points at the old route.
            if let Some(k) = addr_key(&a) {
                self.w.remove_addr(&k);
            }
        }
        let expires = self.addr_expiry(now);
        let waiters = {
            let a = &mut self.st.addrs()[i as usize];
            // A hosts-file entry keeps its origin (it survives reregisters); what the peer
            // says about itself is newer than the file, so the mapping is updated.
            a.state = AddrState::Resolved;
            a.gid = sgid.0;
            a.lid = meta.slid;
            a.qpn = meta.src_qp;
            a.path_bits = meta.dlid_path_bits;
            a.group = group + 1;
            a.expires = expires;
            a.send_query = false;
            core::mem::replace(&mut a.waiters, List::EMPTY)
        };
        let addrs = self.st.addrs();
        if !addrs[i as usize].send_resp {
            self.addrs.send.remove(addrs, i, list_id::ACM_SEND, ADDR_S);
        }
        if was_querying {
            // Someone asked: route it now (also with no waiter left, to prime the cache).
            self.route_addr(now, slot, i, waiters, None, false);
        }
    }

    /// A received class 0x2C MAD.
    pub(crate) fn acm_receive(&mut self, now: Millis, ep: EpId, meta: &RecvMeta, mad: &[u8]) {
        let Some(slot) = self.ep_slot(ep) else {
            self.stats.acm_unsolicited += 1;
            return;
        };
        let Ok(m) = AcmMad::new_checked(mad) else {
            self.stats.acm_malformed += 1;
            return;
        };
        if mad.len() != crate::wire::mad::MAD_LEN
            || m.base_version() != 1
            || m.mgmt_class() != ACM_MGMT_CLASS
            || m.class_version() != 1
            || m.control() != CTRL_RESOLVE
        {
            self.stats.acm_malformed += 1;
            return;
        }
        let sgid = match meta.grh_sgid {
            Some(g) if meta.pkey_index == meta.ep_pkey_index && !g.is_zero() => g,
            _ => {
                self.stats.acm_wrong_key += 1;
                return;
            }
        };
        let Ok(r) = AcmResolveRepr::parse(&m) else {
            self.stats.acm_malformed += 1;
            return;
        };
        // Our own multicast, looped back by the HCA: nothing to learn or answer.
        let e = &self.st.slabs_ref().endpoints[slot];
        if sgid.0 == e.port_gid && meta.src_qp == e.qpn {
            return;
        }
        match r.method {
            Method::Get => self.peer_request(now, slot, meta, sgid, &r),
            Method::GetResp => self.peer_response(now, slot, meta, sgid, &r),
            _ => self.stats.acm_malformed += 1,
        }
    }

    fn peer_request(
        &mut self,
        now: Millis,
        slot: usize,
        meta: &RecvMeta,
        sgid: Gid,
        r: &AcmResolveRepr,
    ) {
        let (st, dt) = (r.src_type, r.dest_type);
        if !st.is_address() || !dt.is_address() {
            self.stats.acm_malformed += 1;
            return;
        }
        let Some(g) = self.best_group(slot, r.gids()) else {
            self.stats.acm_no_group += 1;
            return;
        };
        let target = self
            .find_addr(slot, dt, &r.dest)
            .is_some_and(|i| self.st.addrs()[i as usize].state == AddrState::Local);
        // Every receiver records the requester, as ibacmp does.
        let rec = match self.find_addr(slot, st, &r.src) {
            Some(i) => match self.st.addrs()[i as usize].state {
                AddrState::Local | AddrState::Removing | AddrState::Free => None,
                _ => Some(i),
            },
            None => {
                let i = self.alloc_addr(slot, st, &r.src);
                if let Some(i) = i {
                    let cache_ep = self.st.endpoints()[slot].cache_ep;
                    self.st.addrs()[i as usize].cache_ep = cache_ep;
                }
                i
            }
        };
        if let Some(i) = rec {
            self.resolved(now, slot, i, sgid, meta, g);
        }
        if !target {
            if self.local_elsewhere(slot, dt, &r.dest) {
                self.stats.acm_other_partition += 1;
            }
            return;
        }
        // Respond at once (ibacmp in SA route mode first runs its own SA query towards the
        // requester and answers only if that succeeds; the requester never sees that path,
        // so waiting only delays it, and a failed query there turns into a requester timeout).
        match rec {
            Some(i) => {
                let addrs = self.st.addrs();
                let a = &mut addrs[i as usize];
                a.send_resp = true;
                a.resp_tid = r.tid;
                a.resp_group = g + 1;
                self.addrs
                    .send
                    .push_back(addrs, i, list_id::ACM_SEND, ADDR_S);
            }
            None => self.stats.full += 1,
        }
    }

    fn peer_response(
        &mut self,
        now: Millis,
        slot: usize,
        meta: &RecvMeta,
        sgid: Gid,
        r: &AcmResolveRepr,
    ) {
        let t = self.st.slabs_ref();
        let found = t.endpoints[slot]
            .inflight
            .iter(t.addrs, ADDR_Q)
            .find(|&i| t.addrs[i as usize].tid == r.tid);
        let Some(i) = found else {
            self.stats.acm_unknown_tid += 1;
            return;
        };
        if r.status != 0 || r.gid_cnt == 0 {
            self.stats.acm_malformed += 1;
            return;
        }
        let Some(g) = self.best_group(slot, &r.gids()[..1]) else {
            self.stats.acm_unsolicited += 1;
            return;
        };
        self.resolved(now, slot, i, sgid, meta, g);
    }
    /// Sends queued address queries of every endpoint while their ACM windows have room.
    pub(crate) fn pump_acm_all(&mut self, now: Millis) {
        if self.addrs.active > 0 {
            for slot in 0..self.st.slabs_ref().endpoints.len() {
                self.pump_acm(now, slot);
            }
        }
    }
}
