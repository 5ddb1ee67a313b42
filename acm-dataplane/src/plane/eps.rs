//! The loop's endpoints: a slot per [`EpId`](acm_core_nostd::resolver::EpId), and the list of
//! the open ones, which is what a round walks (its completion queues, its drop counters).
//! A round runs on every spin of the worker and inside a missed `resolve()`: walking all
//! `MAX_EPS` slots there (most of them empty) cost more than the rest of an idle round.

use super::EpRecord;
use acm_core_nostd::resolver::{EpId, MAX_EPS};

/// The endpoints of the loop (see the module docs), by [`EpId`]: the loop names an endpoint
/// by its id everywhere, and only here is the id an index ([`EpId::index`]).
pub(super) struct Eps {
    slots: Vec<Option<EpRecord>>,
    /// The ids of the occupied slots, ascending (room for all of them from the start: an open
    /// never allocates).
    open: Vec<EpId>,
}

impl Eps {
    pub(super) fn new() -> Self {
        Eps {
            slots: (0..MAX_EPS).map(|_| None).collect(),
            open: Vec::with_capacity(MAX_EPS),
        }
    }

    /// Endpoint `ep`, if open.
    #[cfg(test)]
    fn get(&self, ep: EpId) -> Option<&EpRecord> {
        self.slots.get(ep.index())?.as_ref()
    }

    /// The open endpoints with their ids, ascending.
    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = (EpId, &EpRecord)> {
        self.open
            .iter()
            .filter_map(|&ep| Some((ep, self.slots[ep.index()].as_ref()?)))
    }

    /// Endpoint `ep`, if open.
    pub(super) fn get_mut(&mut self, ep: EpId) -> Option<&mut EpRecord> {
        self.slots.get_mut(ep.index())?.as_mut()
    }

    /// Opens endpoint `ep` with `rec` (replacing what it held).
    pub(super) fn put(&mut self, ep: EpId, rec: EpRecord) {
        let Some(slot) = self.slots.get_mut(ep.index()) else {
            return;
        };
        if slot.replace(rec).is_none() {
            let at = self.open.partition_point(|&o| o < ep);
            self.open.insert(at, ep);
        }
    }

    /// Closes endpoint `ep`: what it held (dropping it frees its UD QP).
    pub(super) fn remove(&mut self, ep: EpId) -> Option<EpRecord> {
        let rec = self.slots.get_mut(ep.index())?.take()?;
        self.open.retain(|&o| o != ep);
        Some(rec)
    }

    /// Closes every endpoint; what they held, by id.
    pub(super) fn take_all(&mut self) -> Vec<(EpId, EpRecord)> {
        let slots = &mut self.slots;
        let all = self
            .open
            .iter()
            .filter_map(|&ep| Some((ep, slots[ep.index()].take()?)))
            .collect();
        self.open.clear();
        all
    }

    /// How many endpoints are open.
    pub(super) fn count(&self) -> usize {
        self.open.len()
    }

    /// The `k`-th open endpoint (ascending) and its id, for a walk whose steps need the whole
    /// loop mutably between two endpoints.
    pub(super) fn nth_mut(&mut self, k: usize) -> Option<(EpId, &mut EpRecord)> {
        let ep = *self.open.get(k)?;
        Some((ep, self.slots[ep.index()].as_mut()?))
    }

    /// The open endpoints, ascending.
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut EpRecord> {
        // `open` is ascending and without repeats: each step splits the next one off the
        // slots after the previous.
        let mut rest: &mut [Option<EpRecord>] = &mut self.slots;
        let mut base = 0;
        self.open.iter().filter_map(move |&ep| {
            let i = ep.index();
            let tail = std::mem::take(&mut rest).get_mut(i.checked_sub(base)?..)?;
            let (slot, after) = tail.split_first_mut()?;
            rest = after;
            base = i + 1;
            slot.as_mut()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use acm_core_nostd::cache::{ep_number, CacheEp};
    use acm_core_nostd::sim::node_ep_config;
    use std::sync::Arc;

    /// Endpoint `ep`'s record, under cache number `gen`, `ep`.
    fn rec(ep: u8, gen: u32) -> EpRecord {
        EpRecord {
            cache_ep: ep_number(gen, ep),
            cfg: node_ep_config(0),
            ud: None,
            locals: Vec::new(),
            routes: Vec::new(),
            addrs: Arc::new(Vec::new()),
            logged: Default::default(),
        }
    }

    fn walked(eps: &mut Eps) -> Vec<CacheEp> {
        eps.iter_mut().map(|r| r.cache_ep).collect()
    }

    #[test]
    fn a_walk_sees_the_open_endpoints_in_order_and_only_them() {
        let mut eps = Eps::new();
        for i in [200, 3, 255, 0, 17] {
            eps.put(EpId(i), rec(i, 0));
        }
        // Replacing an open endpoint keeps one entry for it.
        eps.put(EpId(17), rec(17, 1));
        let n = |ep: u8, gen: u32| ep_number(gen, ep);
        assert_eq!(eps.count(), 5);
        assert_eq!(
            walked(&mut eps),
            vec![n(0, 0), n(3, 0), n(17, 1), n(200, 0), n(255, 0)]
        );
        let by_id: Vec<EpId> = eps.iter().map(|(ep, _)| ep).collect();
        assert_eq!(by_id, [0, 3, 17, 200, 255].map(EpId));
        assert_eq!(
            (0..eps.count())
                .map(|k| eps.nth_mut(k).map(|(ep, _)| ep))
                .collect::<Vec<_>>(),
            by_id.into_iter().map(Some).collect::<Vec<_>>()
        );

        assert_eq!(eps.remove(EpId(3)).map(|r| r.cache_ep), Some(n(3, 0)));
        assert!(eps.remove(EpId(3)).is_none());
        assert!(eps.remove(EpId(4)).is_none());
        assert!(eps.get(EpId(3)).is_none());
        assert_eq!(
            walked(&mut eps),
            vec![n(0, 0), n(17, 1), n(200, 0), n(255, 0)]
        );
        assert_eq!(eps.get_mut(EpId(200)).map(|r| r.cache_ep), Some(n(200, 0)));

        let all: Vec<(EpId, CacheEp)> = eps
            .take_all()
            .into_iter()
            .map(|(ep, r)| (ep, r.cache_ep))
            .collect();
        assert_eq!(
            all,
            vec![
                (EpId(0), n(0, 0)),
                (EpId(17), n(17, 1)),
                (EpId(200), n(200, 0)),
                (EpId(255), n(255, 0))
            ]
        );
        assert_eq!(eps.count(), 0);
        assert!(walked(&mut eps).is_empty());
        assert!(eps.get(EpId(0)).is_none());
        eps.put(EpId(9), rec(9, 0));
        assert_eq!(walked(&mut eps), vec![n(9, 0)]);
    }
}
