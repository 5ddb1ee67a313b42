//! The timer table: one entry per kind of timer, the earliest armed time of that kind.
//!
//! Each part keeps its own deadlines in its slots (a job's `timer`, an address entry's
//! `timer`, a join's [`SaTry`]); the table holds, per [`Timer`] kind, a
//! time no later than the earliest of them. Arming only ever lowers an entry; when a kind
//! fires ([`Resolver::handle_timeout`](super::Resolver::handle_timeout)), its part handles
//! what is due and the entry is set again to that part's earliest deadline
//! ([`Parts::earliest`]), so only the kinds that are due are walked.
//! [`Resolver::poll_timeout`](super::Resolver::poll_timeout) is the minimum of the table.

use super::addr::Addrs;
use super::endpoints::earliest;
use super::route::Routes;
use super::storage::{List, SaTry, Storage};
use super::{Config, EpSlot, Millis};

/// The kinds of timer, in the order they fire when due at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Timer {
    /// A removed local address's cache alias waits for an input that passes the cache (due
    /// at once).
    Removal = 0,
    /// A route job's deadline in the SA backlog (`queue_deadline` from its start).
    Backlog,
    /// An SA PathRecord query's reply deadline.
    SaReply,
    /// The end of a BUSY (or lost query's) backoff.
    SaBusy,
    /// The SA window is below one query: when the pace lets the backlog's head go.
    Pace,
    /// A multicast join's reply deadline or retry time.
    Join,
    /// An SA event subscription's reply deadline or retry time.
    Inform,
    /// An address query's deadline in its endpoint's ACM queue.
    AcmQueue,
    /// An ACM multicast query's retry time.
    AcmRetry,
    /// A port's warm-start table (`acmrs_warm_start_ms`): when it is asked for.
    WarmStart,
}

impl Timer {
    /// Every kind, in firing order.
    pub(crate) const ALL: [Timer; 10] = [
        Timer::Removal,
        Timer::Backlog,
        Timer::SaReply,
        Timer::SaBusy,
        Timer::Pace,
        Timer::Join,
        Timer::Inform,
        Timer::AcmQueue,
        Timer::AcmRetry,
        Timer::WarmStart,
    ];
}

/// Not armed.
const OFF: Millis = Millis::MAX;

/// The earliest armed time per [`Timer`] kind (a lower bound; see the [module docs](self)).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TimerTable {
    at: [Millis; Timer::ALL.len()],
}

impl TimerTable {
    pub(crate) const fn new() -> Self {
        TimerTable {
            at: [OFF; Timer::ALL.len()],
        }
    }

    /// Something of kind `t` is due at `at`.
    pub(crate) fn arm(&mut self, t: Timer, at: Millis) {
        let e = &mut self.at[t as usize];
        *e = (*e).min(at);
    }

    /// Kind `t`'s earliest deadline is exactly `at` (`None`: nothing of that kind is armed).
    pub(crate) fn set(&mut self, t: Timer, at: Option<Millis>) {
        self.at[t as usize] = at.unwrap_or(OFF);
    }

    /// Whether kind `t` has something due at `now`.
    pub(crate) fn due(&self, t: Timer, now: Millis) -> bool {
        self.at[t as usize] <= now
    }

    /// The earliest time of any kind.
    pub(crate) fn next(&self) -> Option<Millis> {
        let m = self.at.iter().copied().min().unwrap_or(OFF);
        (m != OFF).then_some(m)
    }

    /// Disarms everything.
    pub(crate) fn clear(&mut self) {
        self.at = [OFF; Timer::ALL.len()];
    }

    /// Every kind's entry is at or before its part's earliest deadline (a deadline that was
    /// set without arming its kind would never fire).
    #[cfg(feature = "std")]
    pub(crate) fn check<S: Storage>(&self, parts: Parts<'_, S>) -> Result<(), std::string::String> {
        for t in Timer::ALL {
            if let Some(at) = parts.earliest(t) {
                if self.at[t as usize] > at {
                    return Err(std::format!(
                        "timer {t:?} at {} after its part's deadline {at}",
                        self.at[t as usize]
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The parts whose deadlines the table holds, read only: the route jobs, the address entries,
/// the endpoint slots (their joins, subscriptions, ACM lists and tables), the settings.
pub(crate) struct Parts<'a, S: Storage> {
    pub(crate) routes: &'a Routes<S>,
    pub(crate) addrs: &'a Addrs<S>,
    pub(crate) eps: &'a [EpSlot],
    pub(crate) cfg: &'a Config,
}

impl<S: Storage> Parts<'_, S> {
    /// The earliest deadline of kind `t` that its part holds.
    pub(crate) fn earliest(&self, t: Timer) -> Option<Millis> {
        let entries = &*self.addrs.entries;
        let head = |l: List| l.front().map(|i| entries[i as usize].timer);
        let eps = self.eps;
        match t {
            Timer::Removal => (!self.addrs.removals.is_empty()).then_some(0),
            Timer::Backlog | Timer::SaReply | Timer::SaBusy | Timer::Pace => {
                self.routes.earliest(t, self.cfg)
            }
            // A SET's timer runs from when it is decided (`Send`), before it is polled.
            Timer::Join => earliest(eps, |e| sooner(e.groups.iter().map(|g| g.t))),
            Timer::Inform => earliest(eps, |e| sooner(e.informs.subs.iter().map(|n| n.t))),
            // Both ACM lists are in deadline order: their heads.
            Timer::AcmQueue => earliest(eps, |e| head(e.queue)),
            Timer::AcmRetry => earliest(eps, |e| head(e.inflight)),
            Timer::WarmStart => {
                earliest(eps, |e| e.table.warm_start.then_some(e.table.warm_start_at))
            }
        }
    }
}

/// The earliest running timer of some SETs (joins, subscriptions).
fn sooner(sets: impl Iterator<Item = SaTry>) -> Option<Millis> {
    sets.filter_map(|s| s.armed()).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_index_the_table_in_firing_order() {
        for (i, t) in Timer::ALL.iter().enumerate() {
            assert_eq!(*t as usize, i);
        }
    }

    #[test]
    fn the_table_keeps_the_earliest_per_kind_and_its_minimum_is_next() {
        let mut t = TimerTable::new();
        assert_eq!(t.next(), None);
        t.arm(Timer::SaReply, 50);
        t.arm(Timer::SaReply, 70);
        t.arm(Timer::Join, 60);
        assert_eq!(t.next(), Some(50));
        assert!(t.due(Timer::SaReply, 50) && !t.due(Timer::Join, 59));
        t.set(Timer::SaReply, None);
        assert_eq!(t.next(), Some(60));
        t.set(Timer::Join, Some(90));
        assert_eq!(t.next(), Some(90));
        t.arm(Timer::Removal, 0);
        assert!(t.due(Timer::Removal, 0));
        t.clear();
        assert_eq!(t.next(), None);
    }
}
