//! An endpoint's life in the resolver: opened, its addresses added and removed, routes and
//! addresses preloaded, reregistered, closed. These inputs compose the parts: the endpoint's
//! slot ([`Endpoints`](super::endpoints::Endpoints)), its groups, subscriptions and table,
//! the address entries and the route jobs.

// The resolver's own names (its storage, lists, helpers) as `mod.rs` has them.
use super::*;
use addr::Addrs;

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// Opens endpoint `ep` (call from the core's `handle_open`), whose cache number is
    /// `cache_ep` now (what it caches before a request or a reregister brings another one:
    /// its preloaded addresses, its warm start's table). With `addr_prot acm` or
    /// `route_prot acm` it starts the multicast join(s) ([`Output::SendSa`] with an
    /// MCMemberRecord SET); the endpoint serves names and IPs once group 0 is joined.
    /// [`Error::Endpoint`] if `ep` is open already, [`Error::Capacity`] if no endpoint slot is
    /// free.
    pub fn handle_open(
        &mut self,
        now: Millis,
        ep: EpId,
        cache_ep: CacheEp,
        cfg: EpConfig,
    ) -> Result<(), Error> {
        if self.eps.slot(ep).is_some() || self.done {
            return Err(Error::Endpoint);
        }
        let (slot, joins) = self.eps.open(ep, cache_ep, cfg, &self.sh.cfg)?;
        for (g, join) in joins.into_iter().enumerate() {
            if join {
                self.start_join(now, slot, g);
            }
        }
        self.subscribe_all(now, slot);
        let jitter = self.sh.cfg.warm_start;
        if jitter != 0 && self.sh.cfg.sa_tables {
            // A random time within the warm start, so a cluster booting at once spreads its
            // tables over it.
            let at = now.saturating_add(self.routes.random() % jitter);
            self.eps.slots[slot].table.warm_start_at(at, &mut self.sh);
        }
        self.eps.recount_ports();
        self.eps.mark_dirty(slot);
        Ok(())
    }

    /// Closes endpoint `ep` (the core's `handle_close`): answers its waiters ENODATA, leaves
    /// its groups ([`Output::Detach`], MCMemberRecord DELETE fire-and-forget), forgets its
    /// addresses and preloads, and invalidates its cache entries (`invalidate_ep`). Queries of
    /// the endpoint still held by the caller are forgotten (their replies are ignored).
    pub fn handle_close(&mut self, now: Millis, ep: EpId) {
        let Some(slot) = self.eps.slot(ep) else {
            return;
        };
        self.drop_endpoint_work(now, slot, Status::Enodata, true);
        self.eps.slots[slot].informs.unsubscribe_all();
        for i in 0..self.addrs.entries.len() as u32 {
            let a = self.addrs.entries[i as usize];
            if a.state != AddrState::Free && usize::from(a.slot) == slot {
                self.free_addr(i);
            }
        }
        for p in self.eps.preloads.iter_mut() {
            if p.used && usize::from(p.slot) == slot {
                *p = PreloadSlot::EMPTY;
            }
        }
        let cache_ep = self.eps.slots[slot].cache_ep;
        self.eps.close(ep, slot);
        self.w.invalidate_ep(cache_ep);
        self.pump(now);
    }

    /// Adds a local address of `ep` (the core's `add_address`). Peers asking for it get a
    /// response. With `loopback_prot local` (and a known LID) it also answers requests for
    /// itself with the loopback path, cached and aliased under `cache_ep` so the caller's hit
    /// path finds it (never expires).
    pub fn handle_add_address(
        &mut self,
        now: Millis,
        ep: EpId,
        cache_ep: CacheEp,
        kind: AddrKind,
        addr: &[u8; 64],
    ) -> Result<(), Error> {
        let type_ = AddressType::from(kind);
        let slot = (self.eps.slot(ep)).ok_or(Error::Endpoint)?;
        let i = match self.addrs.find(slot, type_, addr) {
            Some(i) => {
                let a = self.addrs.entries[i as usize];
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
        self.addrs
            .make_local(&mut self.eps.slots[slot], i, cache_ep);
        self.insert_loopback(now, slot, i, cache_ep);
        self.pump(now);
        Ok(())
    }

    /// Removes a local address (the core's `remove_address`). Its loopback alias is dropped
    /// from the cache at the next input that passes the cache ([`poll_timeout`](Self::poll_timeout)
    /// asks for an immediate [`handle_timeout`](Self::handle_timeout)).
    pub fn handle_remove_address(
        &mut self,
        _now: Millis,
        ep: EpId,
        kind: AddrKind,
        addr: &[u8; 64],
    ) {
        let Some(slot) = self.eps.slot(ep) else {
            return;
        };
        let Some(i) = self.addrs.find(slot, kind.into(), addr) else {
            return;
        };
        if self.addrs.entries[i as usize].state != AddrState::Local {
            return;
        }
        // No cache here: the `Removal` timer asks for a `handle_timeout` call, which drops
        // the alias.
        self.addrs
            .remove_local(&mut self.eps.slots, i, &mut self.sh);
    }

    /// A hosts-file mapping (`addr_preload acm_hosts`): `addr` of `kind` is `gid`.
    /// The entry is ADDR_RESOLVED: the first request for it queries the route. It expires after
    /// `addr_ttl` and is renewed on use (counted `AddrQuery`).
    pub fn handle_preload_address(
        &mut self,
        now: Millis,
        ep: EpId,
        kind: AddrKind,
        addr: &[u8; 64],
        gid: Gid,
    ) -> Result<(), Error> {
        let type_ = AddressType::from(kind);
        let slot = (self.eps.slot(ep)).ok_or(Error::Endpoint)?;
        let i = match self.addrs.find(slot, type_, addr) {
            Some(i) => {
                if self.addrs.entries[i as usize].state != AddrState::Resolved {
                    return Ok(());
                }
                i
            }
            None => self.alloc_addr(slot, type_, addr).ok_or(Error::Capacity)?,
        };
        let expires = addr::expiry(&self.sh.cfg, now);
        let cache_ep = self.eps.slots[slot].cache_ep;
        Addrs::<S>::preload(&mut self.addrs.entries[i as usize], gid, expires, cache_ep);
        Ok(())
    }

    /// A preloaded route (`route_preload`): `path` is cached as two path entries, by its DLID
    /// and by its DGID (no constraint; each answers requests with and without the reversible
    /// bit), never expires, and is inserted again after every [`reregister`](Self::handle_reregister).
    pub fn handle_preload_route(
        &mut self,
        now: Millis,
        ep: EpId,
        cache_ep: CacheEp,
        path: &[u8; 64],
    ) {
        let Some(slot) = self.eps.slot(ep) else {
            return;
        };
        if let Some(p) = self.eps.preloads.iter_mut().find(|p| !p.used) {
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
    pub fn handle_reregister(&mut self, now: Millis, ep: EpId, cache_ep: CacheEp) {
        let Some(slot) = self.eps.slot(ep) else {
            return;
        };
        self.w.invalidate_ep(cache_ep);
        self.eps.slots[slot].cache_ep = cache_ep;
        for i in 0..self.eps.preloads.len() {
            let p = self.eps.preloads[i];
            if p.used && usize::from(p.slot) == slot {
                self.insert_preload(now, slot, cache_ep, &p.path);
            }
        }
        for i in 0..self.addrs.entries.len() as u32 {
            let a = self.addrs.entries[i as usize];
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
        let e = &mut self.eps.slots[slot];
        e.force_detach = e.attached;
        let wanted: [bool; 2] = [
            e.groups[0].t.state != storage::GroupState::Off,
            e.groups[1].t.state != storage::GroupState::Off,
        ];
        for (g, want) in wanted.into_iter().enumerate() {
            if want {
                self.eps.slots[slot].groups[g].t.tries = 0;
                self.start_join(now, slot, g);
            }
        }
        // A new SM (or the same one after a reregister) holds no subscription of ours.
        self.subscribe_all(now, slot);
        self.eps.mark_dirty(slot);
        self.pump(now);
    }

    /// Starts (or restarts) the join of group `g` of endpoint `slot`.
    pub(crate) fn start_join(&mut self, now: Millis, slot: usize, g: usize) {
        let at = now.saturating_add(endpoints::sa_deadline(&self.eps.slots, slot, &self.sh));
        self.eps.slots[slot].groups.start(g, at, &mut self.sh);
        self.eps.mark_dirty(slot);
    }

    /// Starts both subscriptions of `slot` if the configuration and the endpoint allow.
    pub(crate) fn subscribe_all(&mut self, now: Millis, slot: usize) {
        let at = now.saturating_add(endpoints::sa_deadline(&self.eps.slots, slot, &self.sh));
        let e = &mut self.eps.slots[slot];
        let reachable = (e.open, e.qpn, e.sa_pkey);
        if e.informs.subscribe_all(reachable, at, &mut self.sh) {
            self.eps.mark_dirty(slot);
        }
    }

    /// Inserts `path` under the loopback key of local address `i` and aliases the address.
    pub(crate) fn insert_loopback(&mut self, now: Millis, slot: usize, i: u32, cache_ep: CacheEp) {
        let e = self.eps.slots[slot];
        if !self.sh.cfg.loopback_local || e.lid == 0 {
            return;
        }
        let path = request::loopback_path(Gid(e.port_gid), e.lid, e.pkey, e.mtu, e.rate);
        let view = e.view(cache_ep);
        let (k, _) = request::normalise(&view, &request::gid_record(Gid(e.port_gid), 0));
        let Some(key) = request::cache_key(cache_ep, &k) else {
            return;
        };
        self.addrs.entries[i as usize].cache_ep = cache_ep;
        self.w.insert(&key, &path, now, NEVER);
        let a = self.addrs.entries[i as usize];
        addr::alias(&mut self.w, &a, &key, now, NEVER);
    }

    /// Inserts preloaded route `path` of endpoint `slot` under `cache_ep`, by DLID and by
    /// DGID.
    pub(crate) fn insert_preload(
        &mut self,
        now: Millis,
        slot: usize,
        cache_ep: CacheEp,
        path: &[u8; 64],
    ) {
        use crate::wire::path_record::PathRecord;
        let view = self.eps.slots[slot].view(cache_ep);
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

    /// Answers (with `status`) every route job and address query of endpoint `slot`, and
    /// forgets the queries the caller still holds when `forget_held`.
    pub(crate) fn drop_endpoint_work(
        &mut self,
        now: Millis,
        slot: usize,
        status: Status,
        forget_held: bool,
    ) {
        for j in 0..self.routes.jobs.len() as u32 {
            let job = &self.routes.jobs[j as usize];
            if job.state == JobState::Free || usize::from(job.slot) != slot {
                continue;
            }
            self.finish_job(now, j, route::Completion::failed(status));
            if forget_held {
                self.routes.free_zombie(j);
            }
        }
        for i in 0..self.addrs.entries.len() as u32 {
            let a = self.addrs.entries[i as usize];
            if usize::from(a.slot) == slot
                && matches!(a.state, AddrState::Queued | AddrState::Querying)
            {
                self.fail_addr(i, status);
            }
        }
    }
}
