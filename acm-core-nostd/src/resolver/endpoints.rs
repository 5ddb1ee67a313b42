//! Endpoints: which storage slot serves which [`EpId`], which slots have outputs to poll, and
//! how many ports the open endpoints span (the SA window is per port).
//!
//! An endpoint's own state (its configuration, groups, subscriptions, ACM lists, counters)
//! is its [`EpSlot`]; its joins are in [`groups`](super::groups), its subscriptions in
//! [`inform`](super::inform), its outputs in [`output`](super::output).

use super::{request, Counter, EpId, EpSlot, Millis, Resolver, Storage, MAX_EPS};
use crate::cache::CacheRef;
use crate::wire::gid::Gid;

/// The endpoint map and the dirty set.
pub(crate) struct Endpoints {
    /// `EpId` → endpoint slot + 1.
    map: [u8; MAX_EPS],
    /// Endpoint slots with per-endpoint outputs still to poll.
    dirty: [u64; MAX_EPS / 64],
    /// Distinct ports among the open endpoints (at least 1).
    pub(crate) ports: u32,
}

impl Endpoints {
    pub(crate) const fn new() -> Self {
        Endpoints {
            map: [0; MAX_EPS],
            dirty: [0; MAX_EPS / 64],
            ports: 1,
        }
    }

    /// The open slot serving `ep`.
    pub(crate) fn slot(&self, eps: &[EpSlot], ep: EpId) -> Option<usize> {
        let s = usize::from(self.map[usize::from(ep.0)]).checked_sub(1)?;
        eps.get(s).filter(|e| e.open).map(|_| s)
    }

    /// `ep` is served by `slot` (`None`: by none).
    pub(crate) fn map(&mut self, ep: EpId, slot: Option<usize>) {
        self.map[usize::from(ep.0)] = slot.map_or(0, |s| s as u8 + 1);
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
    pub(crate) fn count(&mut self, eps: &mut [EpSlot], ep: EpId, counter: Counter) {
        let Some(s) = usize::from(self.map[usize::from(ep.0)]).checked_sub(1) else {
            return;
        };
        let c = &mut eps[s].counts[counter as usize];
        *c = c.saturating_add(1);
        self.mark_dirty(s);
    }

    /// Counts the distinct port GIDs among the open endpoints (at least 1).
    pub(crate) fn recount_ports(&mut self, eps: &[EpSlot]) {
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

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// The open slot serving `ep`.
    pub(crate) fn ep_slot(&self, ep: EpId) -> Option<usize> {
        self.eps.slot(self.st.slabs_ref().endpoints, ep)
    }

    /// What the request parser needs of endpoint `slot`, at cache number `cache_ep`.
    pub(crate) fn view(&self, slot: usize, cache_ep: u32) -> request::EpView {
        let e = &self.st.slabs_ref().endpoints[slot];
        request::EpView {
            cache_ep,
            port_gid: Gid(e.port_gid),
            lid: e.lid,
            pkey: e.pkey,
        }
    }

    /// How long an SA MAD of endpoint `slot` may take: the configured deadline plus, when
    /// the transport's tries each wait the port's subnet timeout, that many subnet timeouts.
    pub(crate) fn sa_deadline_of(&self, slot: usize) -> Millis {
        let st = self
            .st
            .slabs_ref()
            .endpoints
            .get(slot)
            .map_or(0, |e| e.subnet_timeout);
        self.cfg
            .sa_deadline
            .saturating_add(st.saturating_mul(u64::from(self.cfg.sa_tries)))
    }

    /// Bumps `counter` of endpoint `ep` (emitted as [`super::Output::Count`]).
    pub(crate) fn count(&mut self, ep: EpId, counter: Counter) {
        self.eps.count(self.st.slabs().endpoints, ep, counter);
    }

    pub(crate) fn mark_dirty(&mut self, slot: usize) {
        self.eps.mark_dirty(slot);
    }
}
