//! An endpoint's multicast groups: the MCMemberRecord joins (group 0, the base group every
//! node joins at `min_rate`/`min_mtu`; group 1, the port's own rate and MTU in ACM route mode),
//! their retries, and what the joined records say.
//!
//! A join is an [`SaTry`]: `Send` (SET decided, polled as [`super::Output::SendSa`]) →
//! `Joining` (reply due by its timer) → `Joined`, or `Retry` after a refusal or no answer
//! (1 s doubling, at most 30 s; ibacmp never retries). The endpoint serves names and IPs once
//! group 0 is joined; its [`Output::Attach`](super::Output::Attach) follows the join.

use super::mads;
use super::storage::{EpSlot, GroupSlot, GroupState, SaTry};
use super::timers::Timer;
use super::{Millis, Shared};
use crate::wire::gid::Gid;
use crate::wire::mcmember::McMemberRecord;

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
    pub(crate) fn of(self, e: &EpSlot, i: usize) -> SaTry {
        match self {
            Set::Join => e.groups[i].t,
            Set::Inform => e.informs.subs[i].t,
        }
    }
}

/// An endpoint's two multicast groups (in its [`EpSlot`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Groups(pub(crate) [GroupSlot; 2]);

impl core::ops::Index<usize> for Groups {
    type Output = GroupSlot;
    fn index(&self, g: usize) -> &GroupSlot {
        &self.0[g]
    }
}

impl core::ops::IndexMut<usize> for Groups {
    fn index_mut(&mut self, g: usize) -> &mut GroupSlot {
        &mut self.0[g]
    }
}

impl Groups {
    /// Neither group wanted.
    pub(crate) const EMPTY: Groups = Groups([GroupSlot::EMPTY; 2]);

    pub(crate) fn iter(&self) -> core::slice::Iter<'_, GroupSlot> {
        self.0.iter()
    }

    pub(crate) fn iter_mut(&mut self) -> core::slice::IterMut<'_, GroupSlot> {
        self.0.iter_mut()
    }

    /// Whether group 0 is joined.
    pub(crate) fn joined(&self) -> bool {
        self.0[0].t.state == GroupState::Joined
    }

    /// The SA's record of group `group` (index + 1), if joined.
    pub(crate) fn record(&self, group: u8) -> Option<[u8; 56]> {
        let g = usize::from(group).checked_sub(1)?;
        let gs = self.0.get(g)?;
        (gs.t.state == GroupState::Joined).then_some(gs.record)
    }

    /// Starts (or restarts) the join of group `g`, its reply due by `at` (the endpoint has an
    /// output to poll).
    pub(crate) fn start(&mut self, g: usize, at: Millis, sh: &mut Shared) {
        let tid = sh.next_tid();
        self.0[g].t.send(tid, at);
        sh.timers.arm(Timer::Join, at);
    }

    /// The join of group `g` failed or got no answer: retry after 1 s, 2 s, … at most 30 s
    /// (ibacmp never retries, so a lost join there leaves the endpoint unusable until the next
    /// reregister).
    pub(crate) fn failed(&mut self, now: Millis, g: usize, sh: &mut Shared) {
        let at = self.0[g].t.failed(now);
        sh.timers.arm(Timer::Join, at);
    }

    /// OpenSM's reply to the join of group `g` of an endpoint of P_Key `pkey`: its record
    /// taken if it is the group asked for.
    pub(crate) fn accept_reply(
        &mut self,
        g: usize,
        pkey: u16,
        umad_status: u32,
        mad: &[u8; 256],
    ) -> bool {
        let gs = &mut self.0[g];
        let mgid = mads::group_mgid(pkey, gs.rate, gs.mtu);
        let Some(rec) = mads::join_reply(umad_status, mad, mgid) else {
            return false;
        };
        gs.t.accepted();
        gs.record = rec;
        true
    }

    /// The best group shared with a peer: the highest-index GID of its list that we joined.
    pub(crate) fn best(&self, gids: &[Gid]) -> Option<u8> {
        gids.iter().rev().find_map(|m| {
            (0..2u8).find(|&g| {
                let gs = &self.0[usize::from(g)];
                gs.t.state == GroupState::Joined
                    && McMemberRecord::new_unchecked(&gs.record[..]).mgid() == *m
            })
        })
    }

    /// Closing: every group joined or joining is left (a DELETE of the record `gid` and `pkey`
    /// make), and none is wanted any more.
    pub(crate) fn leave_all(&mut self, gid: Gid, pkey: u16) {
        for g in self.0.iter_mut() {
            if matches!(g.t.state, GroupState::Joining | GroupState::Joined) {
                g.leave = true;
                g.leave_record = mads::join_record(gid, pkey, g.rate, g.mtu);
            }
            g.t.state = GroupState::Off;
        }
    }
}
