//! Address resolution over the ACM multicast protocol (class 0x2C), the address table, and the
//! endpoint's multicast joins.
//!
//! An address entry is (endpoint, type, 64 bytes). Its states map onto ibacmp's `acmp_dest`:
//!
//! ```text
//!  absent ──request──▶ Queued ──window/joined──▶ Querying ──response / peer's request──▶ Resolved
//!   (INIT)            (QUERY_ADDR, FIFO,          (QUERY_ADDR, retried every               (ADDR_RESOLVED;
//!                      queue_deadline)             timeout + subnet timeout)                QUERY_ROUTE while a
//!                         │                            │ retries exhausted                  route job runs, READY
//!                         └──deadline──▶ answered, freed ◀┘ (ETIMEDOUT)                    once cached + aliased)
//! ```
//!
//! Local addresses (`add_address`) are `Local`; hosts-file entries are `Resolved` with origin
//! `Preload` (renewed on use when expired); entries learned from peers' requests are
//! `Resolved`/`Learned` and may be evicted when the table is full and they are idle.

use super::mads;
use super::request;
use super::storage::{bucket_hash, list_id, AddrState, EpSlot, GroupState, List, Origin, SaTry};
use super::{
    addr_qlink, addr_slink, AddrEntry, Counter, EpId, Kind, Millis, RecvMeta, Request, Resolver,
    Storage, NEVER,
};
use crate::cache::{AddrKey, AddrKind, CacheRef, CacheWriter, Lookup, PathKey};
use crate::wire::acm_mad::{AcmMad, AcmResolveRepr, AddressType, ACM_MGMT_CLASS, CTRL_RESOLVE};
use crate::wire::client::{AcmMsg, Status, EP_FLAG_SOURCE};
use crate::wire::gid::Gid;
use crate::wire::mad::Method;
use crate::wire::path_record::PathRecord;

/// The cache address key of an entry (NAME/IP/IP6 only).
pub(crate) fn addr_key(a: &AddrEntry) -> Option<AddrKey> {
    let kind = AddrKind::try_from(a.type_).ok()?;
    Some(AddrKey {
        ep: a.cache_ep,
        kind,
        addr: a.addr,
    })
}

/// Aliases entry `a`'s address to the cached path `key` (expiring at `path_expires`), with
/// TTL = min(address lifetime, route lifetime).
pub(crate) fn alias<C: CacheRef>(
    w: &mut CacheWriter<C>,
    a: &AddrEntry,
    key: &PathKey,
    now: Millis,
    path_expires: Millis,
) {
    let Some(k) = addr_key(a) else {
        return;
    };
    let until = a.expires.min(path_expires);
    if until <= now {
        return;
    }
    // NoSuchPath: the path was evicted meanwhile, so there is nothing to alias it to.
    let _ = w.alias(&k, key, now, until - now);
}

/// How many probes an insert into a full address table makes for an idle learned entry.
const EVICT_PROBES: u32 = 64;

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    fn addr_bucket(&mut self, slot: usize, type_: AddressType, addr: &[u8; 64]) -> usize {
        let h = bucket_hash(
            self.seed ^ 0xadd7,
            (slot as u32) << 8 | u32::from(u8::from(type_)),
            addr,
        );
        (h % self.st.addr_buckets().len() as u64) as usize
    }

    /// The entry for (endpoint slot, type, address).
    pub(crate) fn find_addr(
        &mut self,
        slot: usize,
        type_: AddressType,
        addr: &[u8; 64],
    ) -> Option<u32> {
        let b = self.addr_bucket(slot, type_, addr);
        let mut cur = self.st.addr_buckets()[b];
        while let Some(i) = cur.checked_sub(1) {
            let a = &self.st.addrs()[i as usize];
            if a.state != AddrState::Free
                && usize::from(a.ep) == slot
                && a.type_ == type_
                && a.addr == *addr
            {
                return Some(i);
            }
            cur = a.hnext;
        }
        None
    }

    /// A new entry (state Resolved, origin Learned, no mapping yet), evicting an idle learned
    /// entry if the table is full. `None` if nothing can be evicted.
    pub(crate) fn alloc_addr(
        &mut self,
        slot: usize,
        type_: AddressType,
        addr: &[u8; 64],
    ) -> Option<u32> {
        if self.free_addrs.is_empty() {
            let n = self.st.addrs().len() as u32;
            for _ in 0..EVICT_PROBES.min(n) {
                let i = self.evict_hand % n;
                self.evict_hand = self.evict_hand.wrapping_add(1);
                let a = &self.st.addrs()[i as usize];
                let idle = a.state == AddrState::Resolved
                    && a.origin == Origin::Learned
                    && a.job == 0
                    && !a.send_resp
                    && a.waiters.is_empty();
                if idle {
                    self.free_addr(i);
                    break;
                }
            }
        }
        let i = self
            .free_addrs
            .pop_front(self.st.addrs(), list_id::FREE, addr_qlink)?;
        let b = self.addr_bucket(slot, type_, addr);
        let head = self.st.addr_buckets()[b];
        let a = &mut self.st.addrs()[i as usize];
        *a = AddrEntry::EMPTY;
        a.state = AddrState::Resolved;
        a.ep = slot as u8;
        a.type_ = type_;
        a.addr = *addr;
        a.hnext = head;
        self.st.addr_buckets()[b] = i + 1;
        Some(i)
    }

    /// Takes entry `i` off the list its `qlink` is on.
    pub(crate) fn unlink_q(&mut self, i: u32) {
        let a = self.st.addrs()[i as usize];
        let slot = usize::from(a.ep);
        match a.qlink.on {
            list_id::ACM_QUEUE => {
                let mut l = self.st.endpoints()[slot].queue;
                l.remove(self.st.addrs(), i, list_id::ACM_QUEUE, addr_qlink);
                self.st.endpoints()[slot].queue = l;
            }
            list_id::ACM_INFLIGHT => {
                let mut l = self.st.endpoints()[slot].inflight;
                l.remove(self.st.addrs(), i, list_id::ACM_INFLIGHT, addr_qlink);
                let e = &mut self.st.endpoints()[slot];
                e.inflight = l;
                e.acm_inflight = e.acm_inflight.saturating_sub(1);
            }
            list_id::LOCALS => {
                let mut l = self.st.endpoints()[slot].locals;
                l.remove(self.st.addrs(), i, list_id::LOCALS, addr_qlink);
                self.st.endpoints()[slot].locals = l;
            }
            list_id::REMOVALS => {
                self.removals
                    .remove(self.st.addrs(), i, list_id::REMOVALS, addr_qlink);
            }
            _ => {}
        }
    }

    /// Frees entry `i` (its waiters, if any, are answered ENODATA first).
    pub(crate) fn free_addr(&mut self, i: u32) {
        let a = self.st.addrs()[i as usize];
        if a.state == AddrState::Free {
            return;
        }
        self.fail_addr_waiters(i, Status::Enodata);
        if matches!(a.state, AddrState::Queued | AddrState::Querying) {
            self.acm_active -= 1;
        }
        self.unlink_q(i);
        self.acm_send
            .remove(self.st.addrs(), i, list_id::ACM_SEND, addr_slink);
        if let Some(j) = a.job.checked_sub(1) {
            let mut l = self.st.jobs()[j as usize].addrs;
            l.remove(self.st.addrs(), i, list_id::ROUTE_ADDRS, super::addr_rlink);
            self.st.jobs()[j as usize].addrs = l;
        }
        // Unhash.
        let b = self.addr_bucket(usize::from(a.ep), a.type_, &a.addr);
        let mut cur = self.st.addr_buckets()[b];
        let mut prev: Option<u32> = None;
        while let Some(c) = cur.checked_sub(1) {
            let next = self.st.addrs()[c as usize].hnext;
            if c == i {
                match prev {
                    Some(p) => self.st.addrs()[p as usize].hnext = next,
                    None => self.st.addr_buckets()[b] = next,
                }
                break;
            }
            prev = Some(c);
            cur = next;
        }
        self.st.addrs()[i as usize] = AddrEntry::EMPTY;
        self.free_addrs
            .push_back(self.st.addrs(), i, list_id::FREE, addr_qlink);
    }

    /// Answers the waiters of entry `i` with `status`.
    pub(crate) fn fail_addr_waiters(&mut self, i: u32, status: Status) {
        let mut l = self.st.addrs()[i as usize].waiters;
        self.answer_list(&mut l, status, None);
        self.st.addrs()[i as usize].waiters = List::EMPTY;
    }

    /// An address query failed: its waiters get `status`, the entry goes (ibacmp: INIT).
    pub(crate) fn fail_addr(&mut self, i: u32, status: Status) {
        self.fail_addr_waiters(i, status);
        self.free_addr(i);
    }

    fn group_record(&mut self, slot: usize, group: u8) -> Option<[u8; 56]> {
        let g = usize::from(group).checked_sub(1)?;
        let gs = self.st.endpoints()[slot].groups.get(g).copied()?;
        (gs.t.state == GroupState::Joined).then_some(gs.record)
    }

    pub(crate) fn ep_ready(&mut self, slot: usize) -> bool {
        let e = &self.st.endpoints()[slot];
        e.open && (!e.acm || e.groups[0].t.state == GroupState::Joined)
    }

    /// The path ACM route mode builds from the group (libibacmp's `acmp_record_acm_route`): the
    /// group's path with DGID = the peer's GID, DLID = its LID, SLID = ours, reversible, and
    /// SL, MTU, rate, packet lifetime, traffic class, flow label, hop limit and P_Key from the
    /// MCMemberRecord.
    fn acm_path(&mut self, slot: usize, a: &AddrEntry) -> Option<[u8; 64]> {
        let rec = self.group_record(slot, a.group)?;
        let e = self.st.endpoints()[slot];
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

    /// The key and SA record of entry `i`'s route: ibacmp's `{sgid, dgid, pkey, tclass}`.
    fn addr_route_key(&mut self, slot: usize, i: u32) -> (Option<PathKey>, [u8; 64]) {
        let a = self.st.addrs()[i as usize];
        let tclass = self.group_record(slot, a.group).map_or(0, |r| r[39]);
        let view = self.view(slot, a.cache_ep);
        let (k, sa) = request::normalise(&view, &request::gid_record(Gid(a.gid), tclass));
        (request::cache_key(a.cache_ep, &k), sa)
    }

    /// Routes the resolved address `i` and answers `waiters` (from the cache, from the group in
    /// ACM route mode, or after an SA query). `count_addr_cache`: a request found the address
    /// known but not its route (ibacmp's ADDR_RESOLVED hit).
    pub(crate) fn route_addr(
        &mut self,
        now: Millis,
        slot: usize,
        i: u32,
        mut waiters: List,
        count_addr_cache: Option<EpId>,
        force: bool,
    ) {
        let (key, sa) = self.addr_route_key(slot, i);
        let a = self.st.addrs()[i as usize];
        if let (Some(k), false) = (key, force) {
            match self.cache().lookup(&k, now) {
                Lookup::Hit {
                    record,
                    expires_at,
                    needs_refresh,
                } => {
                    alias(&mut self.w, &a, &k, now, expires_at);
                    if needs_refresh {
                        self.join_route(now, slot, a.cache_ep, key, &sa, None, Some(i));
                    }
                    let mut l = waiters;
                    while let Some(w) =
                        l.pop_front(self.st.requests(), list_id::WAITERS, super::req_link)
                    {
                        let ep = EpId(self.st.requests()[w as usize].ep);
                        self.count(ep, Counter::RouteCache);
                        self.answer(w, Status::Success, Some(&record));
                    }
                    return;
                }
                Lookup::Negative { status, .. } => {
                    self.answer_list(&mut waiters, Status::from(status), None);
                    return;
                }
                _ => {}
            }
        }
        if let (Some(k), true) = (key, self.cfg.route_acm && a.lid != 0) {
            if let Some(path) = self.acm_path(slot, &a) {
                self.w
                    .insert(&k, &path, now, self.cfg.route_ttl.unwrap_or(NEVER));
                let exp = self.cfg.route_ttl.map_or(NEVER, |t| now.saturating_add(t));
                alias(&mut self.w, &a, &k, now, exp);
                self.answer_list(&mut waiters, Status::Success, Some(&path));
                return;
            }
        }
        if let (Some(ep), 0) = (count_addr_cache, a.job) {
            self.count(ep, Counter::AddrCache);
        }
        let cache_ep = a.cache_ep;
        let first = waiters.pop_front(self.st.requests(), list_id::WAITERS, super::req_link);
        self.join_route(now, slot, cache_ep, key, &sa, first, Some(i));
        while let Some(w) = waiters.pop_front(self.st.requests(), list_id::WAITERS, super::req_link)
        {
            self.join_route(now, slot, cache_ep, key, &sa, Some(w), None);
        }
    }

    /// Renews the route of a resolved address that a near-expiry hit or a
    /// [`Kind::Refresh`] asked for (a route query, re-aliased under the request's cache
    /// endpoint number); an address not resolved here is left alone.
    pub(crate) fn addr_refresh(
        &mut self,
        now: Millis,
        slot: usize,
        r: &Request<'_>,
        key: &AddrKey,
    ) {
        if let Some(i) = self.find_addr(slot, key.kind.into(), &key.addr) {
            if self.st.addrs()[i as usize].state == AddrState::Resolved {
                self.st.addrs()[i as usize].cache_ep = r.cache_ep;
                self.route_addr(now, slot, i, List::EMPTY, None, true);
            }
        }
    }

    /// A NAME / IP / IP6 request past the front ([`front::decide`](super::front::decide)):
    /// resolved from the address table (our own address: loopback; a resolved one: its
    /// route; one being queried: wait for it) or queried over the ACM protocol, as a waiter
    /// if `wait` (a Resolve the query answers), else only to prime the cache.
    pub(crate) fn addr_query(
        &mut self,
        now: Millis,
        slot: usize,
        r: &Request<'_>,
        key: &AddrKey,
        wait: bool,
    ) {
        let found = self.find_addr(slot, key.kind.into(), &key.addr);
        let mut waiters = List::EMPTY;
        if wait {
            let Some(w) = self.waiter(r) else {
                return;
            };
            waiters.push_back(self.st.requests(), w, list_id::WAITERS, super::req_link);
        }
        let state = found.map(|i| self.st.addrs()[i as usize].state);
        match (found, state) {
            (Some(i), Some(AddrState::Local)) => {
                let e = self.st.endpoints()[slot];
                if self.cfg.loopback_local && e.lid != 0 {
                    let path =
                        request::loopback_path(Gid(e.port_gid), e.lid, e.pkey, e.mtu, e.rate);
                    self.insert_loopback(now, slot, i, r.cache_ep);
                    if !waiters.is_empty() {
                        self.count(r.ep, Counter::RouteCache);
                    }
                    self.answer_list(&mut waiters, Status::Success, Some(&path));
                } else {
                    // loopback_prot none: our own address is routed like any other, to GID0.
                    self.st.addrs()[i as usize].cache_ep = r.cache_ep;
                    self.route_addr(now, slot, i, waiters, Some(r.ep), false);
                }
            }
            (Some(i), Some(AddrState::Resolved)) => {
                let a = &mut self.st.addrs()[i as usize];
                a.cache_ep = r.cache_ep;
                let mut renewed = false;
                if a.expires <= now {
                    if a.origin == Origin::Preload || a.job != 0 {
                        // The hosts file is re-read, so to speak: a new lifetime. That is an
                        // address query (ibacmp: an expired dest is INIT), not an ADDR_CACHE hit.
                        a.expires = self.cfg.addr_ttl.map_or(NEVER, |t| now.saturating_add(t));
                        renewed = true;
                        self.count(r.ep, Counter::AddrQuery);
                    } else if self.cfg.addr_acm && self.st.endpoints()[slot].acm {
                        self.requeue(now, slot, i);
                        let mut l = waiters;
                        self.add_waiters(i, &mut l);
                        return;
                    }
                }
                let count = (r.kind == Kind::Resolve && !renewed).then_some(r.ep);
                self.route_addr(now, slot, i, waiters, count, false);
            }
            (Some(i), Some(AddrState::Queued | AddrState::Querying)) => {
                self.add_waiters(i, &mut waiters);
            }
            (Some(_), _) => self.answer_list(&mut waiters, Status::Enodata, None),
            (None, _) => {
                if !(self.cfg.addr_acm && self.st.endpoints()[slot].acm) {
                    self.answer_list(&mut waiters, Status::Enodata, None);
                    return;
                }
                let Some(i) = self.alloc_addr(slot, key.kind.into(), &key.addr) else {
                    self.stats.full += 1;
                    self.answer_list(&mut waiters, Status::Enomem, None);
                    return;
                };
                {
                    let a = &mut self.st.addrs()[i as usize];
                    a.cache_ep = r.cache_ep;
                    if let Some((t, src)) = source_entry(r.msg) {
                        a.src_type = t.into();
                        a.src = src;
                    }
                }
                self.requeue(now, slot, i);
                self.add_waiters(i, &mut waiters);
            }
        }
    }

    fn add_waiters(&mut self, i: u32, waiters: &mut List) {
        let mut l = self.st.addrs()[i as usize].waiters;
        while let Some(w) = waiters.pop_front(self.st.requests(), list_id::WAITERS, super::req_link)
        {
            l.push_back(self.st.requests(), w, list_id::WAITERS, super::req_link);
        }
        self.st.addrs()[i as usize].waiters = l;
    }

    /// Puts entry `i` (Resolved, no job) on its endpoint's ACM queue (QUERY_ADDR).
    fn requeue(&mut self, now: Millis, slot: usize, i: u32) {
        let at = now.saturating_add(self.cfg.queue_deadline);
        {
            let a = &mut self.st.addrs()[i as usize];
            a.state = AddrState::Queued;
            a.timer = at;
            a.tries = 0;
        }
        self.acm_active += 1;
        let mut q = self.st.endpoints()[slot].queue;
        q.push_back(self.st.addrs(), i, list_id::ACM_QUEUE, addr_qlink);
        self.st.endpoints()[slot].queue = q;
        self.arm(at);
    }

    /// Sends queued address queries of endpoint `slot` while its ACM window has room.
    pub(crate) fn pump_acm(&mut self, now: Millis, slot: usize) {
        if !self.ep_ready(slot) {
            return;
        }
        let try_ms = self.acm_try(slot);
        while self.st.endpoints()[slot].acm_inflight < self.cfg.acm_window {
            let mut q = self.st.endpoints()[slot].queue;
            let Some(i) = q.pop_front(self.st.addrs(), list_id::ACM_QUEUE, addr_qlink) else {
                break;
            };
            self.st.endpoints()[slot].queue = q;
            let tid = u64::from(self.next_tid());
            let at = now.saturating_add(try_ms);
            {
                let a = &mut self.st.addrs()[i as usize];
                a.state = AddrState::Querying;
                a.tid = tid;
                a.tries = 0;
                a.timer = at;
                a.send_query = true;
            }
            let mut l = self.st.endpoints()[slot].inflight;
            l.push_back(self.st.addrs(), i, list_id::ACM_INFLIGHT, addr_qlink);
            let e = &mut self.st.endpoints()[slot];
            e.inflight = l;
            e.acm_inflight += 1;
            let id = EpId(e.id);
            self.acm_send
                .push_back(self.st.addrs(), i, list_id::ACM_SEND, addr_slink);
            self.count(id, Counter::AddrQuery);
            self.arm(at);
        }
    }

    fn acm_try(&mut self, slot: usize) -> Millis {
        self.cfg
            .acm_timeout
            .saturating_add(self.st.endpoints()[slot].subnet_timeout)
            .max(1)
    }

    /// ACM queue deadlines and retries of endpoint `slot`.
    pub(crate) fn acm_timers(&mut self, now: Millis, slot: usize) {
        let ready = self.ep_ready(slot);
        // Both lists are in deadline order: only due heads are looked at.
        while let Some(i) = self.st.endpoints()[slot].queue.front() {
            if self.st.addrs()[i as usize].timer > now {
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
        let try_ms = self.acm_try(slot);
        while let Some(i) = self.st.endpoints()[slot].inflight.front() {
            let a = self.st.addrs()[i as usize];
            if a.timer > now {
                break;
            }
            if a.tries < self.cfg.acm_retries {
                // Same TID, as ibacmp re-posts the same message; to the back of the list.
                let at = now.saturating_add(try_ms);
                let mut l = self.st.endpoints()[slot].inflight;
                l.remove(self.st.addrs(), i, list_id::ACM_INFLIGHT, addr_qlink);
                l.push_back(self.st.addrs(), i, list_id::ACM_INFLIGHT, addr_qlink);
                self.st.endpoints()[slot].inflight = l;
                let a = &mut self.st.addrs()[i as usize];
                a.tries += 1;
                a.timer = at;
                a.send_query = true;
                self.acm_send
                    .push_back(self.st.addrs(), i, list_id::ACM_SEND, addr_slink);
                self.arm(at);
            } else {
                self.stats.timeouts += 1;
                self.fail_addr(i, Status::Etimedout);
            }
        }
    }

    /// Starts (or restarts) the join of group `g` of endpoint `slot`.
    pub(crate) fn start_join(&mut self, now: Millis, slot: usize, g: usize) {
        let tid = self.next_tid();
        let at = now.saturating_add(self.sa_deadline_of(slot));
        self.st.endpoints()[slot].groups[g].t.send(tid, at);
        self.mark_dirty(slot);
        self.arm(at);
    }

    /// A join failed or got no answer: retry after 1 s, 2 s, … at most 30 s (ibacmp never
    /// retries, so a lost join there leaves the endpoint unusable until the next reregister).
    pub(crate) fn join_failed(&mut self, now: Millis, slot: usize, g: usize) {
        let at = self.st.endpoints()[slot].groups[g].t.failed(now);
        self.arm(at);
    }

    /// The (endpoint slot, index) of the SET (a join, a subscription: `of` picks its
    /// [`SaTry`]) that a reply for token index `index` (slot × 2 + index) with `tid` answers;
    /// `None`, counted as an unknown SA reply, if none waits for it.
    pub(crate) fn set_awaiting(
        &mut self,
        index: u32,
        tid: u32,
        of: fn(&EpSlot, usize) -> SaTry,
    ) -> Option<(usize, usize)> {
        let (slot, i) = ((index / 2) as usize, (index % 2) as usize);
        let ok = self
            .st
            .endpoints()
            .get(slot)
            .is_some_and(|e| e.open && of(e, i).awaits(tid));
        if !ok {
            self.stats.sa_unknown += 1;
        }
        ok.then_some((slot, i))
    }

    /// An SA completion of a join.
    pub(crate) fn join_reply(
        &mut self,
        now: Millis,
        index: u32,
        tid: u32,
        umad_status: u32,
        mad: &[u8; 256],
    ) {
        let Some((slot, g)) = self.set_awaiting(index, tid, |e, g| e.groups[g].t) else {
            return;
        };
        let e = self.st.endpoints()[slot];
        let mgid = mads::group_mgid(e.pkey, e.groups[g].rate, e.groups[g].mtu);
        match mads::join_reply(umad_status, mad, mgid) {
            Some(rec) => {
                let gs = &mut self.st.endpoints()[slot].groups[g];
                gs.t.accepted();
                gs.record = rec;
                self.mark_dirty(slot);
            }
            None => self.join_failed(now, slot, g),
        }
    }

    /// Whether `addr` is a local address of an open endpoint other than `slot` (another
    /// partition): a request for it that arrives on `slot` crossed partitions.
    fn local_elsewhere(&mut self, slot: usize, type_: AddressType, addr: &[u8; 64]) -> bool {
        let n = self.st.endpoints().len().min(super::MAX_EPS);
        (0..n).any(|o| {
            o != slot
                && self.st.endpoints()[o].open
                && self
                    .find_addr(o, type_, addr)
                    .is_some_and(|i| self.st.addrs()[i as usize].state == AddrState::Local)
        })
    }

    /// The best group shared with a peer: the highest-index GID of its list that we joined.
    fn best_group(&mut self, slot: usize, gids: &[Gid]) -> Option<u8> {
        let e = self.st.endpoints()[slot];
        gids.iter().rev().find_map(|m| {
            (0..2u8).find(|&g| {
                let gs = &e.groups[usize::from(g)];
                gs.t.state == GroupState::Joined && gs.record[..16] == m.0
            })
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
            self.acm_active -= 1;
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
        if !self.st.addrs()[i as usize].send_resp {
            self.acm_send
                .remove(self.st.addrs(), i, list_id::ACM_SEND, addr_slink);
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
        if mad.len() != crate::wire::acm_mad::ACM_MAD_LEN
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
        let e = self.st.endpoints()[slot];
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
                let a = &mut self.st.addrs()[i as usize];
                a.send_resp = true;
                a.resp_tid = r.tid;
                a.resp_group = g + 1;
                self.acm_send
                    .push_back(self.st.addrs(), i, list_id::ACM_SEND, addr_slink);
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
        let mut cur = self.st.endpoints()[slot].inflight.front();
        let mut found = None;
        while let Some(i) = cur {
            if self.st.addrs()[i as usize].tid == r.tid {
                found = Some(i);
                break;
            }
            cur = List::next_of(self.st.addrs(), i, addr_qlink);
        }
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
}

/// The request's source entry (a name or IP address and its 64 bytes), if it names one: the
/// entry at `src_index` (where the core put the source the client gave, or the one it
/// selected with `src_out` set), else any entry flagged `ACM_EP_FLAG_SOURCE`.
fn source_entry(msg: &[u8]) -> Option<(AddrKind, [u8; 64])> {
    let m = AcmMsg::new_checked(msg).ok()?;
    let layout = m.check_resolve().ok()?;
    let pick = |i: usize| -> Option<(AddrKind, [u8; 64])> {
        let e = m.entry(i)?;
        if e.flags() & EP_FLAG_SOURCE == 0 && layout.source != Some(i) {
            return None;
        }
        let t = AddrKind::try_from(e.info_type()).ok()?;
        let mut a = [0u8; 64];
        a.copy_from_slice(e.info());
        (a != [0; 64]).then_some((t, a))
    };
    let first = usize::from(m.src_index());
    pick(first).or_else(|| {
        (0..=layout.count.min(7))
            .filter(|&i| i != first)
            .find_map(pick)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_keys_only_for_names_and_ips() {
        let mut a = AddrEntry::EMPTY;
        a.cache_ep = 0x0203;
        a.addr[..3].copy_from_slice(b"abc");
        for (t, kind) in [
            (1, AddrKind::Name),
            (2, AddrKind::Ipv4),
            (3, AddrKind::Ipv6),
        ] {
            a.type_ = AddressType::from(t);
            let k = addr_key(&a).unwrap();
            assert_eq!((k.ep, k.kind, &k.addr[..3]), (0x0203, kind, &b"abc"[..]));
        }
        for t in [0, 4, 5, 6] {
            a.type_ = AddressType::from(t);
            assert!(addr_key(&a).is_none());
        }
    }

    #[test]
    #[cfg(feature = "sim")]
    fn source_entry_is_the_requests_echoed_source() {
        let m = crate::sim::name_msg("dst", Some("src"), false, 1);
        let (t, a) = source_entry(&m).unwrap();
        assert_eq!((t, &a[..3]), (AddrKind::Name, &b"src"[..]));
        assert!(source_entry(&crate::sim::name_msg("dst", None, false, 1)).is_none());
        assert!(source_entry(&m[..20]).is_none());
        // A source the client gave: flagged SOURCE, src_out 0 (the core selected nothing).
        let mut m = m;
        m[3] = 0;
        let (t, a) = source_entry(&m).unwrap();
        assert_eq!((t, &a[..3]), (AddrKind::Name, &b"src"[..]));
        m[4] = 0; // src_index wrong: found by its flag
        assert_eq!(source_entry(&m).map(|s| s.0), Some(AddrKind::Name));
        m[88..92].copy_from_slice(&0u32.to_ne_bytes()); // no SOURCE flag any more
        assert!(source_entry(&m).is_none());
    }
}
