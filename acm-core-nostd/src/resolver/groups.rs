//! An endpoint's multicast groups: the MCMemberRecord joins (group 0, the base group every
//! node joins at `min_rate`/`min_mtu`; group 1, the port's own rate and MTU in ACM route mode),
//! their retries, and what the joined records say.
//!
//! A join is an [`SaTry`]: `Send` (SET decided, polled as [`super::Output::SendSa`]) →
//! `Joining` (reply due by its timer) → `Joined`, or `Retry` after a refusal or no answer
//! (1 s doubling, at most 30 s; ibacmp never retries). The endpoint serves names and IPs once
//! group 0 is joined; its [`Output::Attach`](super::Output::Attach) follows the join.

use super::mads;
use super::storage::Slab;
use super::storage::{EpSlot, GroupState, SaTry};

/// The SA SETs an endpoint keeps going, each one try at a time ([`SaTry`]): its two joins,
/// and its two Report subscriptions ([`inform`](super::inform)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Set {
    /// A group's MCMemberRecord SET.
    Join,
    /// A trap's InformInfo SET.
    Inform,
}

impl Set {
    /// The try of `set` `i` of endpoint `e`.
    fn of(self, e: &EpSlot, i: usize) -> SaTry {
        match self {
            Set::Join => e.groups[i].t,
            Set::Inform => e.informs[i].t,
        }
    }
}
use super::timers::Timer;
use super::{Millis, Resolver, Storage};
use crate::cache::CacheRef;
use crate::wire::gid::Gid;

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// The SA's record of group `group` (index + 1) of `slot`, if joined.
    pub(crate) fn group_record(&self, slot: usize, group: u8) -> Option<[u8; 56]> {
        let g = usize::from(group).checked_sub(1)?;
        let gs = self.st.slabs_ref().endpoints[slot].groups.get(g).copied()?;
        (gs.t.state == GroupState::Joined).then_some(gs.record)
    }

    /// Whether endpoint `slot` is open and, if it speaks the ACM protocol, has joined group 0.
    pub(crate) fn ep_ready(&self, slot: usize) -> bool {
        let e = &self.st.slabs_ref().endpoints[slot];
        e.open && (!e.acm || e.groups[0].t.state == GroupState::Joined)
    }

    /// Starts (or restarts) the join of group `g` of endpoint `slot`.
    pub(crate) fn start_join(&mut self, now: Millis, slot: usize, g: usize) {
        let tid = self.next_tid();
        let at = now.saturating_add(self.sa_deadline_of(slot));
        self.st.endpoints()[slot].groups[g].t.send(tid, at);
        self.mark_dirty(slot);
        self.timers.arm(Timer::Join, at);
    }

    /// A join failed or got no answer: retry after 1 s, 2 s, … at most 30 s (ibacmp never
    /// retries, so a lost join there leaves the endpoint unusable until the next reregister).
    pub(crate) fn join_failed(&mut self, now: Millis, slot: usize, g: usize) {
        let at = self.st.endpoints()[slot].groups[g].t.failed(now);
        self.timers.arm(Timer::Join, at);
    }

    /// The (endpoint slot, index) of the `set` that a reply for token index `index` (slot
    /// times 2, plus the index) with `tid` answers; `None`, counted as an unknown SA reply, if
    /// none waits for it.
    fn set_awaiting(&mut self, index: u32, tid: u32, set: Set) -> Option<(usize, usize)> {
        let (slot, i) = ((index / 2) as usize, (index % 2) as usize);
        let ok = self
            .st
            .slabs_ref()
            .endpoints
            .get(slot)
            .is_some_and(|e| e.open && set.of(e, i).awaits(tid));
        if !ok {
            self.stats.sa_unknown += 1;
        }
        ok.then_some((slot, i))
    }

    /// An SA completion of `set` `index` (a join's, a subscription's): taken, or the set
    /// failed (retried later).
    pub(crate) fn set_reply(
        &mut self,
        now: Millis,
        set: Set,
        index: u32,
        tid: u32,
        umad_status: u32,
        mad: &[u8; 256],
    ) {
        let Some((slot, i)) = self.set_awaiting(index, tid, set) else {
            return;
        };
        let taken = match set {
            Set::Join => self.join_taken(slot, i, umad_status, mad),
            Set::Inform => self.inform_taken(slot, i, umad_status, mad),
        };
        if !taken {
            self.set_failed(now, set, slot, i);
        }
    }

    /// The timers of endpoint `slot`'s `set`s: a late reply fails one, a retry time sends it
    /// again.
    pub(crate) fn set_timers(&mut self, now: Millis, set: Set, slot: usize) {
        for i in 0..2 {
            match set.of(&self.st.slabs_ref().endpoints[slot], i).due(now) {
                Some(GroupState::Joining) => self.set_failed(now, set, slot, i),
                Some(GroupState::Retry) => match set {
                    Set::Join => self.start_join(now, slot, i),
                    Set::Inform => self.start_subscribe(now, slot, i),
                },
                _ => {}
            }
        }
    }

    /// `set` `i` of `slot` failed or got no answer: retried later.
    fn set_failed(&mut self, now: Millis, set: Set, slot: usize, i: usize) {
        match set {
            Set::Join => self.join_failed(now, slot, i),
            Set::Inform => self.inform_failed(now, slot, i),
        }
    }

    /// OpenSM's reply to the join of group `g` of `slot`: its record taken if it is the group
    /// asked for.
    fn join_taken(&mut self, slot: usize, g: usize, umad_status: u32, mad: &[u8; 256]) -> bool {
        let e = self.st.endpoints()[slot];
        let mgid = mads::group_mgid(e.pkey, e.groups[g].rate, e.groups[g].mtu);
        let Some(rec) = mads::join_reply(umad_status, mad, mgid) else {
            return false;
        };
        let gs = &mut self.st.endpoints()[slot].groups[g];
        gs.t.accepted();
        gs.record = rec;
        self.mark_dirty(slot);
        true
    }

    /// The best group shared with a peer: the highest-index GID of its list that we joined.
    pub(crate) fn best_group(&self, slot: usize, gids: &[Gid]) -> Option<u8> {
        let e = &self.st.slabs_ref().endpoints[slot];
        gids.iter().rev().find_map(|m| {
            (0..2u8).find(|&g| {
                let gs = &e.groups[usize::from(g)];
                gs.t.state == GroupState::Joined && gs.record[..16] == m.0
            })
        })
    }
}
