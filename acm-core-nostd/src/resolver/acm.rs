//! Address resolution over the ACM multicast protocol (class 0x2C): our queries (an
//! endpoint's queue and window of multicast requests, their retries), and what peers send
//! (requests we answer and learn from, responses that resolve our queries).
//!
//! An entry of the [address entries](super::addr) waits `Queued` on its endpoint's ACM queue
//! (FIFO, `queue_deadline`) until the endpoint has joined group 0 and its window
//! (`acm_window`) has room, then goes out `Querying` (same TID on each retry, every
//! `timeout` plus the port's subnet timeout, `retries` times), and becomes `Resolved` with the
//! answering peer's GID, LID and QPN from the response's GRH and completion.

use super::addr::{addr_key, Addrs};
use super::mads;
use super::storage::{list_id, AddrState, GroupState, List, Storage, ADDR_Q, ADDR_S};
use super::timers::Timer;
use super::{AcmDest, AddrEntry, EpSlot, Millis, Output, RecvMeta, Shared, Stats, UnicastAv};
use crate::cache::{CacheRef, CacheWriter};
use crate::wire::acm_mad::{AcmMad, AcmResolveRepr, AddressType, ACM_MGMT_CLASS, CTRL_RESOLVE};
use crate::wire::gid::Gid;
use crate::wire::mcmember::{McMemberRecord, McMemberRepr, ACM_QKEY};
use crate::wire::path_record::PathRecord;

/// The path ACM route mode builds from the group (libibacmp's `acmp_record_acm_route`): the
/// group's path from endpoint `e` with DGID = the peer's GID, DLID = its LID, SLID = ours,
/// reversible, and SL, MTU, rate, packet lifetime, traffic class, flow label, hop limit and
/// P_Key from the MCMemberRecord.
pub(crate) fn acm_path(e: &EpSlot, a: &AddrEntry) -> Option<[u8; 64]> {
    let rec = e.groups.record(a.group)?;
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
    // MTU, rate and packet lifetime as the group has them, selectors included.
    p.set_mtu(g.mtu_selector, g.mtu);
    p.set_rate(g.rate_selector, g.rate);
    p.set_packet_life(g.packet_life_selector, g.packet_life);
    Some(r)
}

/// How long one try of an ACM query of endpoint `e` waits.
fn acm_try(e: &EpSlot, sh: &Shared) -> Millis {
    sh.cfg.acm_timeout.saturating_add(e.subnet_timeout).max(1)
}

/// The class 0x2C MAD `mad` received on endpoint `e` with `meta`, if it is a well-formed
/// resolve request or response from another port in the endpoint's partition: its sender's
/// GID (from the GRH) and what it says. Anything else is counted in `stats` (our own
/// multicast, looped back by the HCA, is dropped uncounted).
pub(crate) fn received(
    e: &EpSlot,
    meta: &RecvMeta,
    mad: &[u8],
    stats: &mut Stats,
) -> Option<(Gid, AcmResolveRepr)> {
    let Ok(m) = AcmMad::new_checked(mad) else {
        stats.acm_malformed += 1;
        return None;
    };
    if mad.len() != crate::wire::mad::MAD_LEN
        || m.base_version() != 1
        || m.mgmt_class() != ACM_MGMT_CLASS
        || m.class_version() != 1
        || m.control() != CTRL_RESOLVE
    {
        stats.acm_malformed += 1;
        return None;
    }
    let sgid = match meta.grh_sgid {
        Some(g) if meta.pkey_index == meta.ep_pkey_index && !g.is_zero() => g,
        _ => {
            stats.acm_wrong_key += 1;
            return None;
        }
    };
    let Ok(r) = AcmResolveRepr::parse(&m) else {
        stats.acm_malformed += 1;
        return None;
    };
    // Our own multicast, looped back by the HCA: nothing to learn or answer.
    if sgid.0 == e.port_gid && meta.src_qp == e.qpn {
        return None;
    }
    Some((sgid, r))
}

impl<S: Storage> Addrs<S> {
    /// Puts entry `i` (Resolved, no job) on its endpoint `e`'s ACM queue (QUERY_ADDR).
    pub(crate) fn requeue(&mut self, e: &mut EpSlot, now: Millis, i: u32, sh: &mut Shared) {
        let at = now.saturating_add(sh.cfg.queue_deadline);
        let addrs = &mut *self.entries;
        let a = &mut addrs[i as usize];
        a.state = AddrState::Queued;
        a.timer = at;
        a.tries = 0;
        e.queue.push_back(addrs, i, list_id::ACM_QUEUE, ADDR_Q);
        self.active += 1;
        sh.timers.arm(Timer::AcmQueue, at);
    }

    /// Sends queued address queries of endpoint `e` (ready) while its ACM window has room;
    /// returns how many went (each one ADDR_QUERY).
    pub(crate) fn pump(&mut self, e: &mut EpSlot, now: Millis, sh: &mut Shared) -> u32 {
        let try_ms = acm_try(e, sh);
        let addrs = &mut *self.entries;
        let mut sent = 0;
        while e.acm_inflight < sh.cfg.acm_window {
            let Some(i) = e.queue.pop_front(addrs, list_id::ACM_QUEUE, ADDR_Q) else {
                break;
            };
            let tid = u64::from(sh.next_tid());
            let at = now.saturating_add(try_ms);
            let a = &mut addrs[i as usize];
            a.state = AddrState::Querying;
            a.tid = tid;
            a.tries = 0;
            a.timer = at;
            a.send_query = true;
            e.inflight
                .push_back(addrs, i, list_id::ACM_INFLIGHT, ADDR_Q);
            e.acm_inflight += 1;
            self.send.push_back(addrs, i, list_id::ACM_SEND, ADDR_S);
            sent += 1;
            sh.timers.arm(Timer::AcmRetry, at);
        }
        sent
    }

    /// The head of endpoint `e`'s ACM queue if its deadline has passed at `now` (the queue
    /// is in deadline order).
    pub(crate) fn queue_due(&self, e: &EpSlot, now: Millis) -> Option<u32> {
        let i = e.queue.front()?;
        (self.entries[i as usize].timer <= now).then_some(i)
    }

    /// Retries the due queries of endpoint `e` (the in-flight list is in deadline order: due
    /// heads only) until one is out of retries: that one, for the caller to fail.
    pub(crate) fn retry_due(
        &mut self,
        e: &mut EpSlot,
        now: Millis,
        sh: &mut Shared,
    ) -> Option<u32> {
        let try_ms = acm_try(e, sh);
        let addrs = &mut *self.entries;
        while let Some(i) = e.inflight.front() {
            let a = addrs[i as usize];
            if a.timer > now {
                break;
            }
            if a.tries >= sh.cfg.acm_retries {
                return Some(i);
            }
            // Same TID, as ibacmp re-posts the same message; to the back of the list.
            let at = now.saturating_add(try_ms);
            let l = &mut e.inflight;
            l.remove(addrs, i, list_id::ACM_INFLIGHT, ADDR_Q);
            l.push_back(addrs, i, list_id::ACM_INFLIGHT, ADDR_Q);
            let a = &mut addrs[i as usize];
            a.tries += 1;
            a.timer = at;
            a.send_query = true;
            self.send.push_back(addrs, i, list_id::ACM_SEND, ADDR_S);
            sh.timers.arm(Timer::AcmRetry, at);
        }
        None
    }

    /// Whether the destination of peer request `r` is a local address of an open endpoint
    /// other than `slot` (another partition): the request arrived on `slot` across
    /// partitions.
    pub(crate) fn local_elsewhere(&self, eps: &[EpSlot], slot: usize, r: &AcmResolveRepr) -> bool {
        let n = eps.len().min(super::MAX_EPS);
        (0..n).any(|o| {
            o != slot
                && eps[o].open
                && self
                    .find(o, r.dest_type, &r.dest)
                    .is_some_and(|i| self.entries[i as usize].state == AddrState::Local)
        })
    }

    /// Records what a peer's packet says about it: entry `i` becomes ADDR_RESOLVED with the
    /// peer's GID `sgid` (GRH), LID, QPN (`meta`) and the shared group, the mapping expiring
    /// at `expires`. Returns its waiters when it was being queried (to be routed now, also
    /// with no waiter left, to prime the cache).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn resolved<C: CacheRef>(
        &mut self,
        eps: &mut [EpSlot],
        i: u32,
        sgid: Gid,
        meta: &RecvMeta,
        group: u8,
        expires: Millis,
        w: &mut CacheWriter<C>,
    ) -> Option<List> {
        let a = self.entries[i as usize];
        let was_querying = matches!(a.state, AddrState::Queued | AddrState::Querying);
        if was_querying {
            self.unlink_q(eps, i);
            self.active -= 1;
        } else if a.gid != sgid.0 {
            // The peer's GID changed: the old alias points at the old route.
            if let Some(k) = addr_key(&a) {
                w.remove_addr(&k);
            }
        }
        let addrs = &mut *self.entries;
        let a = &mut addrs[i as usize];
        // A hosts-file entry keeps its origin (it survives reregisters); what the peer says
        // about itself is newer than the file, so the mapping is updated.
        a.state = AddrState::Resolved;
        a.gid = sgid.0;
        a.lid = meta.slid;
        a.qpn = meta.src_qp;
        a.path_bits = meta.dlid_path_bits;
        a.group = group + 1;
        a.expires = expires;
        a.send_query = false;
        let waiters = core::mem::replace(&mut a.waiters, List::EMPTY);
        if !addrs[i as usize].send_resp {
            self.send.remove(addrs, i, list_id::ACM_SEND, ADDR_S);
        }
        was_querying.then_some(waiters)
    }

    /// A peer's request on endpoint `slot`: whether it asks for one of the endpoint's own
    /// addresses, and the entry that records the requester (found or new; `None` if it is
    /// one of ours or the table has no room).
    pub(crate) fn requester(
        &mut self,
        eps: &mut [EpSlot],
        slot: usize,
        r: &AcmResolveRepr,
    ) -> (bool, Option<u32>) {
        let (st, dt) = (r.src_type, r.dest_type);
        let target = self
            .find(slot, dt, &r.dest)
            .is_some_and(|i| self.entries[i as usize].state == AddrState::Local);
        // Every receiver records the requester, as ibacmp does.
        let rec = match self.find(slot, st, &r.src) {
            Some(i) => match self.entries[i as usize].state {
                AddrState::Local | AddrState::Removing | AddrState::Free => None,
                _ => Some(i),
            },
            None => {
                let i = self.alloc(eps, slot, st, &r.src);
                if let Some(i) = i {
                    self.entries[i as usize].cache_ep = eps[slot].cache_ep;
                }
                i
            }
        };
        (target, rec)
    }

    /// Entry `i`'s peer asked for one of our addresses (request `tid`, shared group `group`):
    /// a response wants sending.
    pub(crate) fn respond(&mut self, i: u32, tid: u64, group: u8) {
        let addrs = &mut *self.entries;
        let a = &mut addrs[i as usize];
        a.send_resp = true;
        a.resp_tid = tid;
        a.resp_group = group + 1;
        self.send.push_back(addrs, i, list_id::ACM_SEND, ADDR_S);
    }

    /// The query of endpoint `slot` in flight with `tid`, if any.
    pub(crate) fn in_flight(&self, e: &EpSlot, tid: u64) -> Option<u32> {
        e.inflight
            .iter(&self.entries, ADDR_Q)
            .find(|&i| self.entries[i as usize].tid == tid)
    }

    /// The next ACM MAD to send (over endpoints `eps`), taking entries off the send list as
    /// they have no more.
    pub(crate) fn poll(&mut self, eps: &[EpSlot]) -> Option<Output> {
        while let Some(i) = self.send.front() {
            if let Some(o) = self.output(eps, i) {
                return Some(o);
            }
        }
        None
    }

    /// The next ACM MAD of entry `i` (taking it off the send list when it has no more).
    fn output(&mut self, eps: &[EpSlot], i: u32) -> Option<Output> {
        let addrs = &mut *self.entries;
        let a = addrs[i as usize];
        let slot = usize::from(a.slot);
        let e = &eps[slot];
        let id = e.id;
        if a.send_query {
            addrs[i as usize].send_query = false;
            if !a.send_resp {
                self.send.remove(addrs, i, list_id::ACM_SEND, ADDR_S);
            }
            // Multicast only while attached to group 0 (after a reregister the try is lost;
            // the retry timer runs on).
            if a.state == AddrState::Querying && e.open && e.groups.joined() {
                let (src_type, src) = source_of(e, addrs, &a);
                let mut mgids = [Gid::ZERO; 2];
                let mut n = 0;
                for g in e.groups.iter() {
                    if g.t.state == GroupState::Joined {
                        mgids[n] = McMemberRecord::new_unchecked(&g.record[..]).mgid();
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
        self.send.remove(addrs, i, list_id::ACM_SEND, ADDR_S);
        if !a.send_resp {
            return None;
        }
        addrs[i as usize].send_resp = false;
        let g = usize::from(a.resp_group).checked_sub(1)?;
        let gs = e.groups.0.get(g)?;
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
}

/// The source of our request for `a` from endpoint `e`: the client's source entry, else one
/// of the endpoint's local addresses, else our port GID (type GID).
fn source_of(e: &EpSlot, addrs: &[AddrEntry], a: &AddrEntry) -> (AddressType, [u8; 64]) {
    if a.src_type != AddressType::Invalid {
        return (a.src_type, a.src);
    }
    if let Some(l) = e.locals.front() {
        let la = &addrs[l as usize];
        return (la.type_, la.addr);
    }
    let mut g = [0u8; 64];
    g[..16].copy_from_slice(&e.port_gid);
    (AddressType::Gid, g)
}
