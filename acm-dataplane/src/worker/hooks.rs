//! The test hooks of the worker: virtual time for every worker of the process
//! ([`advance_all_clocks`]), and a stuck worker for the stall watchdog's tests ([`stall_all`],
//! debug builds only). The provider never calls them; the debug `libacmrs.so` exports them to
//! its tests.

use super::Shared;
use std::sync::atomic::Ordering;
#[cfg(debug_assertions)]
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, Weak};
#[cfg(debug_assertions)]
use std::thread;
use std::time::{Duration, Instant};

/// Every waker of the process, weakly, for [`advance_all_clocks`] (pruned as wakers go).
pub(super) static WAKERS: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// Virtual time for a whole process: [`Waker::advance_clock`](super::Waker::advance_clock) on every live worker (all are
/// moved first, then each is waited for). `true` once every running worker observed the move;
/// `false` if one did not within `within`. What the debug `libacmrs.so` exports to its tests
/// (`acmrs_test_advance_clock`); the provider never calls it.
pub fn advance_all_clocks(d: Duration, within: Duration) -> bool {
    let live = live_workers();
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let targets: Vec<u64> = live
        .iter()
        .map(|s| s.skew_ms.fetch_add(ms, Ordering::SeqCst).saturating_add(ms))
        .collect();
    let t0 = Instant::now();
    live.iter()
        .zip(targets)
        .all(|(s, target)| s.wait_observed(target, within.saturating_sub(t0.elapsed())))
}

/// Every live worker of the process (the test hooks' targets).
fn live_workers() -> Vec<Arc<Shared>> {
    WAKERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect()
}

/// Milliseconds every worker of the process sleeps at the start of its next round
/// ([`stall_all`]; debug builds only: no check in a release build's loop).
#[cfg(debug_assertions)]
static STALL_MS: AtomicU64 = AtomicU64::new(0);

/// Whether that sleep holds the poller's lock ([`Stuck::InRound`]).
#[cfg(debug_assertions)]
static STALL_IN_ROUND: AtomicBool = AtomicBool::new(true);

/// Where a worker is stuck ([`stall_all`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stuck {
    /// Inside a round, the poller's lock held (a driver call that never returns): no round
    /// runs anywhere.
    InRound,
    /// Between rounds, the lock free (a thread stuck in its park): rounds still run on the
    /// producers' threads and the watchdog's.
    BetweenRounds,
}

/// Makes a worker of the process stop running for `d`, stuck `at` (as a thread stuck in the
/// kernel would be), and returns once one has (`true`; `false` if none did within
/// `within`): the stall watchdog's tests, through the debug `libacmrs.so`'s
/// `acmrs_test_stall`. The provider never calls it (debug builds only).
#[cfg(debug_assertions)]
pub fn stall_all(d: Duration, at: Stuck, within: Duration) -> bool {
    STALL_IN_ROUND.store(at == Stuck::InRound, Ordering::SeqCst);
    STALL_MS.store(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1),
        Ordering::SeqCst,
    );
    let live = live_workers();
    let t0 = Instant::now();
    while STALL_MS.load(Ordering::SeqCst) != 0 {
        if t0.elapsed() >= within {
            STALL_MS.store(0, Ordering::SeqCst);
            return false;
        }
        live.iter().for_each(|s| s.kick());
        thread::sleep(Duration::from_micros(100));
    }
    true
}

/// The stall test hook: sleeps as [`stall_all`] asked, if `in_round` is where it asked to.
#[cfg(debug_assertions)]
pub(super) fn stall_here(in_round: bool) {
    if STALL_MS.load(Ordering::Relaxed) != 0 && STALL_IN_ROUND.load(Ordering::SeqCst) == in_round {
        let ms = STALL_MS.swap(0, Ordering::SeqCst);
        thread::sleep(Duration::from_millis(ms));
    }
}
