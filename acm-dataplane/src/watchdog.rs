//! The stall watchdog: client requests never wait on a loop that does not run.
//!
//! The dataplane loop takes every request from the [`Inbox`]; if it stops running (its thread
//! stuck in a system call or a driver, a livelock, a wake-up lost for good) while requests
//! wait, the clients would wait for ever: the core has no timeout of its own for a provider's
//! answer. A thread of its own ([`Watchdog::spawn`]) looks at the inbox a few times per bound:
//! once requests have waited a whole `bound` while the loop ran not one poll round, it marks
//! the inbox stalled (new requests are refused and answered at once by the caller), answers
//! the waiting ones ETIMEDOUT through the caller's `answer`, and logs it; when the loop runs
//! again, the inbox is open again and that is logged too. A loop that is merely parked
//! (nothing to do) is not stalled: a request wakes it, and it takes it within microseconds,
//! or within its longest park (100 ms) if a wake-up was lost.
//!
//! A worker stuck *between* rounds (in its park) does not hold the loop: requests still run
//! its round on the threads that bring them ([`crate::worker::Waker::serve`]), but SA
//! replies and timers need a round nobody brings. So at each look that finds no round run
//! since the last one, the watchdog runs one itself when the loop is free.
//!
//! [`Stall`] is the decision, a pure function of what the watchdog saw and when (tested in
//! virtual time); the thread only samples and acts.

use crate::plane::{Inbox, Queued};
use acm_core_nostd::wire::client::Status;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// What a look at the inbox found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The loop takes requests, or none waits.
    Running,
    /// Requests have waited `bound` while the loop made no progress (`new`: the first look
    /// that says so).
    Stalled {
        /// The stall was not seen before.
        new: bool,
    },
    /// The loop runs again after a stall.
    Resumed,
}

/// The stall decision (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct Stall {
    bound: Duration,
    /// The loop's progress count and when it was first seen with requests waiting.
    since: Option<(u64, Instant)>,
    stalled: bool,
}

impl Stall {
    /// Stalled once requests wait `bound` with no progress.
    pub fn new(bound: Duration) -> Self {
        Stall {
            bound,
            since: None,
            stalled: false,
        }
    }

    /// One look at `now`: the loop had run `progress` poll rounds in all, and requests wait
    /// if `waiting`.
    pub fn check(&mut self, now: Instant, progress: u64, waiting: bool) -> Verdict {
        let taken = progress;
        let moved = self.since.is_some_and(|(t, _)| t != taken);
        if moved && self.stalled {
            self.stalled = false;
            self.since = waiting.then_some((taken, now));
            return Verdict::Resumed;
        }
        if !waiting && !self.stalled {
            self.since = None;
            return Verdict::Running;
        }
        let since = match self.since {
            Some((t, at)) if t == taken => at,
            _ => {
                self.since = Some((taken, now));
                now
            }
        };
        if now.duration_since(since) >= self.bound {
            let new = !self.stalled;
            self.stalled = true;
            return Verdict::Stalled { new };
        }
        Verdict::Running
    }
}

/// The watchdog thread ([`Watchdog::spawn`]); stopped and joined by [`Watchdog::stop`] or on
/// drop.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Watches `inbox` (thread `acmrs-watchdog`): requests that wait `bound` while the loop
    /// runs no round are given to `answer` with ETIMEDOUT (each exactly once: taken from the
    /// queue, so the loop never sees them), and `log(level, text)` says when the loop stalls
    /// and when it runs again.
    pub fn spawn(
        inbox: Arc<Inbox>,
        bound: Duration,
        mut answer: impl FnMut(&Queued, Status) + Send + 'static,
        mut log: impl FnMut(u8, &str) + Send + 'static,
    ) -> std::io::Result<Watchdog> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let tick = (bound / 4).clamp(Duration::from_millis(5), Duration::from_millis(250));
        let thread = thread::Builder::new()
            .name("acmrs-watchdog".into())
            .spawn(move || {
                let mut stall = Stall::new(bound);
                let mut rounds = inbox.rounds();
                while !stopping.load(Ordering::Acquire) {
                    thread::park_timeout(tick);
                    // No round anywhere since the last look (a healthy worker runs one at
                    // least every 100 ms): run one here if the loop is free, so SA replies
                    // handed to it and its timers are not left to a worker stuck outside it.
                    if inbox.rounds() == rounds {
                        inbox.waker.serve();
                    }
                    rounds = inbox.rounds();
                    let waiting = inbox.has_requests();
                    match stall.check(Instant::now(), rounds, waiting) {
                        Verdict::Running => continue,
                        Verdict::Resumed => {
                            inbox.set_stalled(false);
                            log(0, "the dataplane runs again: requests are taken again");
                            continue;
                        }
                        Verdict::Stalled { new } => {
                            inbox.set_stalled(true);
                            if new {
                                log(
                                    0,
                                    &format!(
                                        "ERROR - the dataplane has not run for {} ms while \
                                         requests waited: answering them and new ones ETIMEDOUT",
                                        bound.as_millis()
                                    ),
                                );
                            }
                        }
                    }
                    while inbox
                        .take_request_with(|r| answer(r, Status::Etimedout))
                        .is_some()
                    {}
                }
            })?;
        Ok(Watchdog {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_waiting_a_bound_without_progress_are_a_stall_and_progress_ends_it() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Stall::new(ms(1000));
        // Nothing waits: running, however long the loop takes nothing.
        assert_eq!(s.check(t0, 5, false), Verdict::Running);
        assert_eq!(s.check(t0 + ms(5000), 5, false), Verdict::Running);
        // Requests wait and the loop keeps taking: running.
        for i in 0..10 {
            assert_eq!(
                s.check(t0 + ms(6000 + 500 * i), 6 + i, true),
                Verdict::Running
            );
        }
        // Requests wait and nothing is taken: a stall once they have waited the bound, not
        // before; said new once.
        assert_eq!(s.check(t0 + ms(20_000), 20, true), Verdict::Running);
        assert_eq!(s.check(t0 + ms(20_999), 20, true), Verdict::Running);
        assert_eq!(
            s.check(t0 + ms(21_000), 20, true),
            Verdict::Stalled { new: true }
        );
        // Still stalled after the watchdog emptied the queue (new requests are refused).
        assert_eq!(
            s.check(t0 + ms(21_100), 20, false),
            Verdict::Stalled { new: false }
        );
        // The loop takes one: resumed.
        assert_eq!(s.check(t0 + ms(21_200), 21, true), Verdict::Resumed);
        assert_eq!(s.check(t0 + ms(21_300), 22, true), Verdict::Running);
        // A new wait needs a whole bound again.
        assert_eq!(s.check(t0 + ms(22_200), 22, true), Verdict::Running);
        assert_eq!(
            s.check(t0 + ms(22_300), 22, true),
            Verdict::Stalled { new: true }
        );
    }
}
