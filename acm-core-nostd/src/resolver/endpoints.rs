//! Endpoints: which storage slot serves which [`EpId`], which slots have outputs to poll, and
//! how many ports the open endpoints span (the SA window is per port).
//!
//! An endpoint's own state (its configuration, groups, subscriptions, ACM lists, counters)
//! is its [`EpSlot`]; its joins are in [`groups`](super::groups), its subscriptions in
//! [`inform`](super::inform), its outputs in [`output`](super::output).

use super::storage::{List, Storage};
use super::{
    request, Config, Counter, EpConfig, EpId, EpSlot, Error, Millis, PreloadSlot, Shared, MAX_EPS,
};
use crate::cache::CacheEp;
use crate::wire::gid::Gid;

/// The endpoint slots, the preloaded routes, the endpoint map and the dirty set.
pub(crate) struct Endpoints<S: Storage> {
    /// The endpoint slots.
    pub(crate) slots: S::Endpoints,
    /// The preloaded routes (`route_preload`), kept for re-insertion after a reregister.
    pub(crate) preloads: S::Preloads,
    /// `EpId` → endpoint slot + 1.
    map: [u8; MAX_EPS],
    /// Endpoint slots with per-endpoint outputs still to poll.
    dirty: [u64; MAX_EPS / 64],
    /// Distinct ports among the open endpoints (at least 1).
    pub(crate) ports: u32,
}

impl<S: Storage> Endpoints<S> {
    /// Every slot of `slots` closed, no route preloaded.
    pub(crate) fn new(mut slots: S::Endpoints, mut preloads: S::Preloads) -> Self {
        slots.fill(EpSlot::EMPTY);
        preloads.fill(PreloadSlot::EMPTY);
        Endpoints {
            slots,
            preloads,
            map: [0; MAX_EPS],
            dirty: [0; MAX_EPS / 64],
            ports: 1,
        }
    }

    /// The open slot serving `ep`.
    pub(crate) fn slot(&self, ep: EpId) -> Option<usize> {
        let s = usize::from(self.map[ep.index()]).checked_sub(1)?;
        self.slots.get(s).filter(|e| e.open).map(|_| s)
    }

    /// `ep` is served by `slot` (`None`: by none).
    pub(crate) fn map(&mut self, ep: EpId, slot: Option<usize>) {
        self.map[ep.index()] = slot.map_or(0, |s| s as u8 + 1);
    }

    pub(crate) fn is_dirty(&self, slot: usize) -> bool {
        self.dirty[slot / 64] & (1 << (slot % 64)) != 0
    }

    pub(crate) fn mark_dirty(&mut self, slot: usize) {
        self.dirty[slot / 64] |= 1 << (slot % 64);
    }

    /// The lowest dirty slot.
    pub(crate) fn first_dirty(&self) -> Option<usize> {
        let (w, bits) = self.dirty.iter().enumerate().find(|(_, b)| **b != 0)?;
        Some(w * 64 + bits.trailing_zeros() as usize)
    }

    pub(crate) fn clean(&mut self, slot: usize) {
        self.dirty[slot / 64] &= !(1 << (slot % 64));
    }

    /// Bumps `counter` of endpoint `ep` (emitted as [`super::Output::Count`]); an endpoint
    /// that is gone counts nothing.
    pub(crate) fn count(&mut self, ep: EpId, counter: Counter) {
        let Some(s) = usize::from(self.map[ep.index()]).checked_sub(1) else {
            return;
        };
        let c = &mut self.slots[s].counts[counter as usize];
        *c = c.saturating_add(1);
        self.mark_dirty(s);
    }

    /// Opens `ep` (not open), at cache number `cache_ep`, with `cfg` under the resolver's
    /// settings `rc` in a free slot:
    /// this endpoint's old slot if it still has outputs to flush (its leaves go out before
    /// the new joins), else any slot with nothing left to flush. Returns the slot and which
    /// of its two groups it is to join; [`Error::Capacity`] if no slot is free.
    pub(crate) fn open(
        &mut self,
        ep: EpId,
        cache_ep: CacheEp,
        cfg: EpConfig,
        rc: &Config,
    ) -> Result<(usize, [bool; 2]), Error> {
        let eps = &*self.slots;
        let n = eps.len().min(MAX_EPS);
        let old = (0..n).find(|&i| !eps[i].open && eps[i].id == ep && self.is_dirty(i));
        let slot = old.or_else(|| (0..n).find(|&i| !eps[i].open && !self.is_dirty(i)));
        let Some(slot) = slot else {
            return Err(Error::Capacity);
        };
        let min = (rc.min_rate, rc.min_mtu);
        // QPN 0 is QP0 (SMI), never a UD QP: "this endpoint has none", so no ACM protocol.
        let want_groups = (rc.addr_acm || rc.route_acm) && cfg.qpn != 0;
        let second = want_groups && rc.route_acm && cfg.rate != 0 && (cfg.rate, cfg.mtu) != min;
        let e = &mut self.slots[slot];
        let old = *e;
        *e = EpSlot {
            open: true,
            acm: want_groups,
            id: ep,
            // Outputs of a previous life of this slot (leaves, unsubscribes, a detach, counts)
            // still go out.
            attached: old.attached,
            force_detach: old.force_detach || old.attached,
            attached_record: old.attached_record,
            counts: old.counts,
            // What the port says.
            port_gid: cfg.port_gid.0,
            lid: cfg.lid,
            pkey: cfg.pkey,
            mtu: cfg.mtu,
            rate: cfg.rate,
            subnet_timeout: cfg.subnet_timeout_ms,
            qpn: cfg.qpn,
            sa_pkey: cfg.sa_pkey,
            cache_ep,
            ..EpSlot::EMPTY
        };
        for (g, old) in e.groups.iter_mut().zip(old.groups.iter()) {
            g.leave = old.leave;
            g.leave_record = old.leave_record;
        }
        for (n, old) in e.informs.subs.iter_mut().zip(old.informs.subs) {
            n.leave = old.leave;
        }
        e.table.max_lid = cfg.lid;
        // Group 0 at the minimum rate and MTU; group 1, in ACM route mode, at the port's.
        if want_groups {
            (e.groups[0].rate, e.groups[0].mtu) = min;
        }
        if second {
            (e.groups[1].rate, e.groups[1].mtu) = (cfg.rate, cfg.mtu);
        }
        self.map(ep, Some(slot));
        Ok((slot, [want_groups, second]))
    }

    /// Closes `ep`, served by `slot`: its groups are left, its ACM lists forgotten (their
    /// entries are freed by the caller), and its outputs still to poll (leaves, unsubscribes,
    /// a detach, counts) go out.
    pub(crate) fn close(&mut self, ep: EpId, slot: usize) {
        let e = &mut self.slots[slot];
        e.groups.leave_all(Gid(e.port_gid), e.pkey);
        e.open = false;
        e.informs.ack = false;
        e.queue = List::EMPTY;
        e.inflight = List::EMPTY;
        e.locals = List::EMPTY;
        e.acm_inflight = 0;
        self.map(ep, None);
        self.recount_ports();
        self.mark_dirty(slot);
    }

    /// Counts the distinct port GIDs among the open endpoints (at least 1).
    pub(crate) fn recount_ports(&mut self) {
        let eps = &*self.slots;
        let mut n = 0u32;
        for (i, e) in eps.iter().enumerate() {
            if e.open && !eps[..i].iter().any(|o| o.open && o.port_gid == e.port_gid) {
                n += 1;
            }
        }
        self.ports = n.max(1);
    }
}

/// The earliest of the deadlines `of` each open endpoint (its joins, its subscriptions, the
/// heads of its ACM lists: see [`timers`](super::timers)).
pub(crate) fn earliest(eps: &[EpSlot], of: impl Fn(&EpSlot) -> Option<Millis>) -> Option<Millis> {
    let mut next: Option<Millis> = None;
    for at in eps.iter().filter(|e| e.open).filter_map(of) {
        next = Some(next.map_or(at, |n| n.min(at)));
    }
    next
}

impl EpSlot {
    /// What the request parser needs of this endpoint, at cache number `cache_ep`.
    pub(crate) fn view(&self, cache_ep: CacheEp) -> request::EpView {
        request::EpView {
            cache_ep,
            port_gid: Gid(self.port_gid),
            lid: self.lid,
            pkey: self.pkey,
        }
    }

    /// Whether the endpoint is open and, if it speaks the ACM protocol, has joined group 0.
    pub(crate) fn ready(&self) -> bool {
        self.open && (!self.acm || self.groups.joined())
    }
}

/// How long an SA MAD of endpoint `slot` may take: the configured deadline plus, when the
/// transport's tries each wait the port's subnet timeout, that many subnet timeouts.
pub(crate) fn sa_deadline(eps: &[EpSlot], slot: usize, sh: &Shared) -> Millis {
    let st = eps.get(slot).map_or(0, |e| e.subnet_timeout);
    sh.cfg
        .sa_deadline
        .saturating_add(st.saturating_mul(u64::from(sh.subnet_waits)))
}
