//! The loop's endpoints: a slot per [`EpId`](acm_core_nostd::resolver::EpId), and the list of
//! the open ones, which is what a round walks (its completion queues, its drop counters).
//! A round runs on every spin of the worker and inside a missed `resolve()`: walking all
//! `MAX_EPS` slots there (most of them empty) cost more than the rest of an idle round.

use super::EpRecord;
use acm_core_nostd::resolver::MAX_EPS;

/// The endpoints of the loop (see the module docs).
pub(super) struct Eps {
    slots: Vec<Option<EpRecord>>,
    /// The indices of the occupied slots, ascending (room for all of them from the start: an
    /// open never allocates).
    open: Vec<u8>,
}

impl Eps {
    pub(super) fn new() -> Self {
        Eps {
            slots: (0..MAX_EPS).map(|_| None).collect(),
            open: Vec::with_capacity(MAX_EPS),
        }
    }

    /// Endpoint `i`, if open.
    #[cfg(test)]
    fn get(&self, i: usize) -> Option<&EpRecord> {
        self.slots.get(i)?.as_ref()
    }

    /// The open endpoints with their indices, ascending.
    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = (usize, &EpRecord)> {
        self.open
            .iter()
            .filter_map(|&i| Some((usize::from(i), self.slots[usize::from(i)].as_ref()?)))
    }

    /// Endpoint `i`, if open.
    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut EpRecord> {
        self.slots.get_mut(i)?.as_mut()
    }

    /// Opens endpoint `i` with `rec` (replacing what it held).
    pub(super) fn put(&mut self, i: usize, rec: EpRecord) {
        let Some(slot) = self.slots.get_mut(i) else {
            return;
        };
        if slot.replace(rec).is_none() {
            let at = self.open.partition_point(|&o| usize::from(o) < i);
            self.open.insert(at, i as u8);
        }
    }

    /// Closes endpoint `i`: what it held (dropping it frees its UD QP).
    pub(super) fn remove(&mut self, i: usize) -> Option<EpRecord> {
        let rec = self.slots.get_mut(i)?.take()?;
        self.open.retain(|&o| usize::from(o) != i);
        Some(rec)
    }

    /// Closes every endpoint; what they held, by index.
    pub(super) fn take_all(&mut self) -> Vec<(usize, EpRecord)> {
        let slots = &mut self.slots;
        let all = self
            .open
            .iter()
            .filter_map(|&i| Some((usize::from(i), slots[usize::from(i)].take()?)))
            .collect();
        self.open.clear();
        all
    }

    /// How many endpoints are open.
    pub(super) fn count(&self) -> usize {
        self.open.len()
    }

    /// The `k`-th open endpoint (ascending) and its index, for a walk whose steps need the
    /// whole loop mutably between two endpoints.
    pub(super) fn nth_mut(&mut self, k: usize) -> Option<(usize, &mut EpRecord)> {
        let i = usize::from(*self.open.get(k)?);
        Some((i, self.slots[i].as_mut()?))
    }

    /// The open endpoints, ascending.
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut EpRecord> {
        // `open` is ascending and without repeats: each step splits the next one off the
        // slots after the previous.
        let mut rest: &mut [Option<EpRecord>] = &mut self.slots;
        let mut base = 0;
        self.open.iter().filter_map(move |&i| {
            let i = usize::from(i);
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
    use acm_core_nostd::sim::node_ep_config;
    use std::sync::Arc;

    fn rec(cache_ep: u32) -> EpRecord {
        EpRecord {
            cache_ep,
            cfg: node_ep_config(0),
            ud: None,
            locals: Vec::new(),
            routes: Vec::new(),
            addrs: Arc::new(Vec::new()),
            logged: Default::default(),
        }
    }

    fn walked(eps: &mut Eps) -> Vec<u32> {
        eps.iter_mut().map(|r| r.cache_ep).collect()
    }

    #[test]
    fn a_walk_sees_the_open_endpoints_in_order_and_only_them() {
        let mut eps = Eps::new();
        for i in [200, 3, 255, 0, 17] {
            eps.put(i, rec(i as u32));
        }
        // Replacing an open endpoint keeps one entry for it.
        eps.put(17, rec(1017));
        assert_eq!(eps.count(), 5);
        assert_eq!(walked(&mut eps), vec![0, 3, 1017, 200, 255]);
        let by_index: Vec<usize> = eps.iter().map(|(i, _)| i).collect();
        assert_eq!(by_index, vec![0, 3, 17, 200, 255]);
        assert_eq!(
            (0..eps.count())
                .map(|k| eps.nth_mut(k).map(|(i, _)| i))
                .collect::<Vec<_>>(),
            by_index.into_iter().map(Some).collect::<Vec<_>>()
        );

        assert_eq!(eps.remove(3).map(|r| r.cache_ep), Some(3));
        assert!(eps.remove(3).is_none());
        assert!(eps.remove(4).is_none());
        assert!(eps.remove(MAX_EPS).is_none());
        assert!(eps.get(3).is_none());
        assert_eq!(walked(&mut eps), vec![0, 1017, 200, 255]);
        assert_eq!(eps.get_mut(200).map(|r| r.cache_ep), Some(200));

        let all: Vec<(usize, u32)> = eps
            .take_all()
            .into_iter()
            .map(|(i, r)| (i, r.cache_ep))
            .collect();
        assert_eq!(all, vec![(0, 0), (17, 1017), (200, 200), (255, 255)]);
        assert_eq!(eps.count(), 0);
        assert!(walked(&mut eps).is_empty());
        assert!(eps.get(0).is_none());
        eps.put(9, rec(9));
        assert_eq!(walked(&mut eps), vec![9]);
    }
}
