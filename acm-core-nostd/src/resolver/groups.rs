//! An endpoint's multicast groups: the MCMemberRecord joins (group 0, the base group every
//! node joins at `min_rate`/`min_mtu`; group 1, the port's own rate and MTU in ACM route mode),
//! their retries, and what the joined records say.
//!
//! A join is an [`SaTry`]: `Send` (SET decided, polled as [`super::Output::SendSa`]) →
//! `Joining` (reply due by its timer) → `Joined`, or `Retry` after a refusal or no answer
//! (1 s doubling, at most 30 s; ibacmp never retries). The endpoint serves names and IPs once
//! group 0 is joined; its [`Output::Attach`](super::Output::Attach) follows the join.

use super::mads;
use super::storage::Table;
use super::storage::{EpSlot, GroupState, SaTry};
use super::timers::Timer;
use super::{Millis, Resolver, Storage};
use crate::cache::CacheRef;
use crate::wire::gid::Gid;

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// The SA's record of group `group` (index + 1) of `slot`, if joined.
    pub(crate) fn group_record(&self, slot: usize, group: u8) -> Option<[u8; 56]> {
        let g = usize::from(group).checked_sub(1)?;
        let gs = self.st.tables_ref().endpoints[slot]
            .groups
            .get(g)
            .copied()?;
        (gs.t.state == GroupState::Joined).then_some(gs.record)
    }

    /// Whether endpoint `slot` is open and, if it speaks the ACM protocol, has joined group 0.
    pub(crate) fn ep_ready(&self, slot: usize) -> bool {
        let e = &self.st.tables_ref().endpoints[slot];
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
            .tables_ref()
            .endpoints
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

    /// The best group shared with a peer: the highest-index GID of its list that we joined.
    pub(crate) fn best_group(&self, slot: usize, gids: &[Gid]) -> Option<u8> {
        let e = &self.st.tables_ref().endpoints[slot];
        gids.iter().rev().find_map(|m| {
            (0..2u8).find(|&g| {
                let gs = &e.groups[usize::from(g)];
                gs.t.state == GroupState::Joined && gs.record[..16] == m.0
            })
        })
    }

    /// Join timers of endpoint `slot`: a late reply fails the join, a retry time re-sends.
    pub(crate) fn join_timers(&mut self, now: Millis, slot: usize) {
        for g in 0..2 {
            match self.st.tables_ref().endpoints[slot].groups[g].t.due(now) {
                Some(GroupState::Joining) => self.join_failed(now, slot, g),
                Some(GroupState::Retry) => self.start_join(now, slot, g),
                _ => {}
            }
        }
    }
}
