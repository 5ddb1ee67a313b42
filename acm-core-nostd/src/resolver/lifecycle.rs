//! An endpoint's life in the resolver: opened, its addresses added and removed, routes and
//! addresses preloaded, reregistered, closed.

// The resolver's own names (its storage, lists, helpers) as `mod.rs` has them.
use super::*;

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// Opens endpoint `ep` (call from the core's `open_endpoint`). With `addr_prot acm` or
    /// `route_prot acm` it starts the multicast join(s) ([`Output::SendSa`] with an
    /// MCMemberRecord SET); the endpoint serves names and IPs once group 0 is joined.
    /// [`Error::Endpoint`] if `ep` is open already, [`Error::Capacity`] if no endpoint slot is
    /// free.
    pub fn open_endpoint(&mut self, now: Millis, ep: EpId, cfg: EpConfig) -> Result<(), Error> {
        if self.ep_slot(ep).is_some() {
            return Err(Error::Endpoint);
        }
        if self.done {
            return Err(Error::Endpoint);
        }
        // Reuse this endpoint's old slot if it still has outputs to flush (its leaves go out
        // before the new joins), else any slot with nothing left to flush.
        let n = self.st.endpoints().len().min(MAX_EPS);
        let old = (0..n).find(|&i| {
            let e = &self.st.endpoints()[i];
            !e.open && e.id == ep.0 && self.eps.is_dirty(i)
        });
        let slot =
            old.or_else(|| (0..n).find(|&i| !self.st.endpoints()[i].open && !self.eps.is_dirty(i)));
        let Some(slot) = slot else {
            return Err(Error::Capacity);
        };
        let min = (self.cfg.min_rate, self.cfg.min_mtu);
        // QPN 0 is QP0 (SMI), never a UD QP: "this endpoint has none", so no ACM protocol.
        let want_groups = (self.cfg.addr_acm || self.cfg.route_acm) && cfg.qpn != 0;
        let second =
            want_groups && self.cfg.route_acm && cfg.rate != 0 && (cfg.rate, cfg.mtu) != min;
        {
            let e = &mut self.st.endpoints()[slot];
            let (groups, informs, attached, force, counts, record) = (
                e.groups,
                e.informs,
                e.attached,
                e.force_detach,
                e.counts,
                e.attached_record,
            );
            *e = EpSlot::EMPTY;
            // Outputs of a previous life of this slot (leaves, a detach, counts) still go out.
            e.attached = attached;
            e.force_detach = force || attached;
            e.attached_record = record;
            e.counts = counts;
            for (g, old) in e.groups.iter_mut().zip(groups) {
                g.leave = old.leave;
                g.leave_record = old.leave_record;
            }
            for (n, old) in e.informs.iter_mut().zip(informs) {
                n.leave = old.leave;
            }
            e.open = true;
            e.acm = want_groups;
            e.id = ep.0;
            e.port_gid = cfg.port_gid.0;
            e.lid = cfg.lid;
            e.pkey = cfg.pkey;
            e.mtu = cfg.mtu;
            e.rate = cfg.rate;
            e.subnet_timeout = cfg.subnet_timeout_ms;
            e.qpn = cfg.qpn;
            e.sa_pkey = cfg.sa_pkey;
            e.table.max_lid = cfg.lid;
            e.cache_ep = ep_number(0, ep.0);
            if want_groups {
                e.groups[0].rate = min.0;
                e.groups[0].mtu = min.1;
            }
            if second {
                e.groups[1].rate = cfg.rate;
                e.groups[1].mtu = cfg.mtu;
            }
        }
        self.eps.map(ep, Some(slot));
        if want_groups {
            self.start_join(now, slot, 0);
        }
        if second {
            self.start_join(now, slot, 1);
        }
        self.subscribe_all(now, slot);
        self.schedule_warm_start(now, slot);
        self.eps.recount_ports(self.st.slabs_ref().endpoints);
        self.mark_dirty(slot);
        Ok(())
    }

    /// Closes endpoint `ep` (the core's `close_endpoint`): answers its waiters ENODATA, leaves
    /// its groups ([`Output::Detach`], MCMemberRecord DELETE fire-and-forget), forgets its
    /// addresses and preloads, and invalidates its cache entries (`invalidate_ep`). Queries of
    /// the endpoint still held by the caller are forgotten (their replies are ignored).
    pub fn close_endpoint(&mut self, now: Millis, ep: EpId) {
        let Some(slot) = self.ep_slot(ep) else {
            return;
        };
        self.drop_endpoint_work(now, slot, Status::Enodata, true);
        self.unsubscribe_all(slot);
        for i in 0..self.st.addrs().len() as u32 {
            let a = self.st.addrs()[i as usize];
            if a.state != AddrState::Free && usize::from(a.slot) == slot {
                self.free_addr(i);
            }
        }
        for p in self.st.preloads().iter_mut() {
            if p.used && usize::from(p.slot) == slot {
                *p = PreloadSlot::EMPTY;
            }
        }
        {
            let e = &mut self.st.endpoints()[slot];
            let (gid, pkey) = (Gid(e.port_gid), e.pkey);
            for g in e.groups.iter_mut() {
                if matches!(g.t.state, GroupState::Joining | GroupState::Joined) {
                    g.leave = true;
                    g.leave_record = mads::join_record(gid, pkey, g.rate, g.mtu);
                }
                g.t.state = GroupState::Off;
            }
            e.open = false;
            e.ack = false;
            e.queue = List::EMPTY;
            e.inflight = List::EMPTY;
            e.locals = List::EMPTY;
            e.acm_inflight = 0;
        }
        self.w.invalidate_ep(u32::from(ep.0));
        self.eps.map(ep, None);
        self.eps.recount_ports(self.st.slabs_ref().endpoints);
        self.mark_dirty(slot);
        self.pump(now);
    }

    /// Adds a local address of `ep` (the core's `add_address`). Peers asking for it get a
    /// response. With `loopback_prot local` (and a known LID) it also answers requests for
    /// itself with the loopback path, cached and aliased under `cache_ep` so the caller's hit
    /// path finds it (never expires).
    pub fn add_address(
        &mut self,
        now: Millis,
        ep: EpId,
        cache_ep: u32,
        kind: AddrKind,
        addr: &[u8; 64],
    ) -> Result<(), Error> {
        let type_ = AddressType::from(kind);
        let slot = self.ep_slot(ep).ok_or(Error::Endpoint)?;
        let i = match self.find_addr(slot, type_, addr) {
            Some(i) => {
                let a = self.st.addrs()[i as usize];
                if a.state == AddrState::Local {
                    return Ok(());
                }
                // Someone may be waiting for what is now our own address.
                self.fail_addr_waiters(i, Status::Enodata);
                self.free_addr(i);
                self.alloc_addr(slot, type_, addr).ok_or(Error::Capacity)?
            }
            None => self.alloc_addr(slot, type_, addr).ok_or(Error::Capacity)?,
        };
        {
            let e = self.st.endpoints()[slot];
            let a = &mut self.st.addrs()[i as usize];
            a.state = AddrState::Local;
            a.gid = e.port_gid;
            a.lid = e.lid;
            a.qpn = e.qpn;
            a.expires = NEVER;
            a.cache_ep = cache_ep;
        }
        let t = self.st.slabs();
        t.endpoints[slot]
            .locals
            .push_back(t.addrs, i, list_id::LOCALS, ADDR_Q);
        self.insert_loopback(now, slot, i, cache_ep);
        self.pump(now);
        Ok(())
    }

    /// Removes a local address (the core's `remove_address`). Its loopback alias is dropped
    /// from the cache at the next input that passes the cache ([`poll_timeout`](Self::poll_timeout)
    /// asks for an immediate [`handle_timeout`](Self::handle_timeout)).
    pub fn remove_address(&mut self, ep: EpId, kind: AddrKind, addr: &[u8; 64]) {
        let Some(slot) = self.ep_slot(ep) else {
            return;
        };
        let Some(i) = self.find_addr(slot, kind.into(), addr) else {
            return;
        };
        if self.st.addrs()[i as usize].state != AddrState::Local {
            return;
        }
        self.unlink_q(i);
        self.st.addrs()[i as usize].state = AddrState::Removing;
        self.addrs
            .removals
            .push_back(self.st.addrs(), i, list_id::REMOVALS, ADDR_Q);
        // No cache here: ask for a `handle_timeout` call, which drops the alias.
        self.timers.arm(Timer::Removal, 0);
    }

    /// A hosts-file mapping (`addr_preload acm_hosts`): `addr` of `kind` is `gid`.
    /// The entry is ADDR_RESOLVED: the first request for it queries the route. It expires after
    /// `addr_ttl` and is renewed on use (counted `AddrQuery`).
    pub fn preload_address(
        &mut self,
        now: Millis,
        ep: EpId,
        kind: AddrKind,
        addr: &[u8; 64],
        gid: Gid,
    ) -> Result<(), Error> {
        let type_ = AddressType::from(kind);
        let slot = self.ep_slot(ep).ok_or(Error::Endpoint)?;
        let i = match self.find_addr(slot, type_, addr) {
            Some(i) => {
                if self.st.addrs()[i as usize].state != AddrState::Resolved {
                    return Ok(());
                }
                i
            }
            None => self.alloc_addr(slot, type_, addr).ok_or(Error::Capacity)?,
        };
        let expires = self.addr_expiry(now);
        let cache_ep = self.st.endpoints()[slot].cache_ep;
        let a = &mut self.st.addrs()[i as usize];
        a.state = AddrState::Resolved;
        a.origin = storage::Origin::Preload;
        a.gid = gid.0;
        a.lid = 0;
        a.group = 0;
        a.expires = expires;
        a.cache_ep = cache_ep;
        Ok(())
    }

    /// A preloaded route (`route_preload`): `path` is cached as two path entries, by its DLID
    /// and by its DGID (no constraint; each answers requests with and without the reversible
    /// bit), never expires, and is inserted again after every [`reregister`](Self::reregister).
    pub fn preload_route(&mut self, now: Millis, ep: EpId, cache_ep: u32, path: &[u8; 64]) {
        let Some(slot) = self.ep_slot(ep) else {
            return;
        };
        if let Some(p) = self.st.preloads().iter_mut().find(|p| !p.used) {
            *p = PreloadSlot {
                used: true,
                slot: slot as u8,
                path: *path,
            };
        }
        self.insert_preload(now, slot, cache_ep, path);
    }

    /// CLIENT_REREGISTER (or an SM change) on `ep`'s port; `cache_ep` is the endpoint's cache
    /// number at the new flush generation. Learned routes and addresses of the endpoint are
    /// dropped (`invalidate_ep`); preloaded routes and loopback entries are inserted again under
    /// `cache_ep`; the groups are detached and joined again.
    pub fn reregister(&mut self, now: Millis, ep: EpId, cache_ep: u32) {
        let Some(slot) = self.ep_slot(ep) else {
            return;
        };
        self.w.invalidate_ep(u32::from(ep.0));
        self.st.endpoints()[slot].cache_ep = cache_ep;
        for i in 0..self.st.preloads().len() {
            let p = self.st.preloads()[i];
            if p.used && usize::from(p.slot) == slot {
                self.insert_preload(now, slot, cache_ep, &p.path);
            }
        }
        for i in 0..self.st.addrs().len() as u32 {
            let a = self.st.addrs()[i as usize];
            if usize::from(a.slot) != slot {
                continue;
            }
            match a.state {
                AddrState::Local => self.insert_loopback(now, slot, i, cache_ep),
                AddrState::Resolved
                    if a.origin == storage::Origin::Learned && a.job == 0 && !a.send_resp =>
                {
                    self.free_addr(i)
                }
                _ => {}
            }
        }
        let e = &mut self.st.endpoints()[slot];
        e.force_detach = e.attached;
        let wanted: [bool; 2] = [
            e.groups[0].t.state != GroupState::Off,
            e.groups[1].t.state != GroupState::Off,
        ];
        for (g, want) in wanted.into_iter().enumerate() {
            if want {
                self.st.endpoints()[slot].groups[g].t.tries = 0;
                self.start_join(now, slot, g);
            }
        }
        // A new SM (or the same one after a reregister) holds no subscription of ours.
        self.subscribe_all(now, slot);
        self.mark_dirty(slot);
        self.pump(now);
    }

    /// Inserts `path` under the loopback key of local address `i` and aliases the address.
    pub(crate) fn insert_loopback(&mut self, now: Millis, slot: usize, i: u32, cache_ep: u32) {
        let e = self.st.endpoints()[slot];
        if !self.cfg.loopback_local || e.lid == 0 {
            return;
        }
        let path = request::loopback_path(Gid(e.port_gid), e.lid, e.pkey, e.mtu, e.rate);
        let view = self.view(slot, cache_ep);
        let (k, _) = request::normalise(&view, &request::gid_record(Gid(e.port_gid), 0));
        let Some(key) = request::cache_key(cache_ep, &k) else {
            return;
        };
        self.st.addrs()[i as usize].cache_ep = cache_ep;
        self.w.insert(&key, &path, now, NEVER);
        let a = self.st.addrs()[i as usize];
        addr::alias(&mut self.w, &a, &key, now, NEVER);
    }

    pub(crate) fn insert_preload(
        &mut self,
        now: Millis,
        slot: usize,
        cache_ep: u32,
        path: &[u8; 64],
    ) {
        use crate::wire::path_record::PathRecord;
        let view = self.view(slot, cache_ep);
        let p = PathRecord::new_unchecked(&path[..]);
        let (dlid, dgid) = (p.dlid(), p.dgid());
        // Two keys for one route, by DLID and by DGID, each a path entry of its own: a hit is
        // one slot read whichever way the route is asked for. The reversible bit is not part
        // of a cache key, so each entry answers requests with and without it.
        for (valid, lid, gid) in [(dlid != 0, dlid, None), (!dgid.is_zero(), 0, Some(dgid))] {
            if !valid {
                continue;
            }
            let mut r = [0u8; 64];
            let mut k = PathRecord::new_unchecked(&mut r[..]);
            match gid {
                Some(g) => k.set_dgid(g),
                None => k.set_dlid(lid),
            }
            k.set_reversible_numpath(true, 0);
            let (k, _) = request::normalise(&view, &r);
            if let Some(key) = request::cache_key(cache_ep, &k) {
                self.w.insert(&key, path, now, NEVER);
            }
        }
    }

    /// After every input: drops removed addresses' cache aliases, lets backlog jobs into the
    /// SA window and queued address queries into the ACM windows.
    /// Answers (with `status`) every route job and address query of endpoint `slot`, and
    /// forgets the queries the caller still holds when `forget_held`.
    pub(crate) fn drop_endpoint_work(
        &mut self,
        now: Millis,
        slot: usize,
        status: Status,
        forget_held: bool,
    ) {
        for j in 0..self.st.jobs().len() as u32 {
            let job = &self.st.jobs()[j as usize];
            if job.state == JobState::Free || usize::from(job.slot) != slot {
                continue;
            }
            self.finish_job(now, j, route::Completion::failed(status));
            if forget_held {
                self.free_zombie(j);
            }
        }
        for i in 0..self.st.addrs().len() as u32 {
            let a = self.st.addrs()[i as usize];
            if usize::from(a.slot) == slot
                && matches!(a.state, AddrState::Queued | AddrState::Querying)
            {
                self.fail_addr(i, status);
            }
        }
    }
}
