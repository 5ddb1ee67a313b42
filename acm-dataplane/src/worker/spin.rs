//! The spin policy: how long the worker polls on after work before it parks (learned from
//! the gaps between its rounds with work), what it does after an idle round, one spin turn.

use super::{PollOutcome, WorkerConfig};
use std::thread;
use std::time::{Duration, Instant};

/// One turn of a spin: the CPU to another runnable thread (`yield_spin`), or a CPU pause.
pub(super) fn pause(yield_spin: bool) {
    if yield_spin {
        thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// What the worker does next after a round with nothing done.
pub(super) enum Next {
    /// Poll again (after a spin turn).
    Spin,
    /// Block for at most this long.
    Park(Duration),
}

/// How long the worker polls on after work ([`WorkerConfig::spin`] and
/// [`WorkerConfig::spin_learned`]): learned from the idle gaps before its rounds with work.
#[derive(Clone, Copy, Debug)]
pub(super) struct SpinBudget {
    min: Duration,
    max: Duration,
    /// Smoothed idle gap before work, in ns (0: none seen yet).
    gap_ns: u64,
}

impl SpinBudget {
    pub(super) fn new(config: &WorkerConfig) -> Self {
        SpinBudget {
            min: config.spin,
            max: config.spin_learned,
            gap_ns: 0,
        }
    }

    /// A round did work after `gap` without any. A gap is counted as at most four times the
    /// bound: one long pause moves the mean toward "far apart" without erasing what came
    /// before it; two in a row do.
    pub(super) fn work_after(&mut self, gap: Duration) {
        if self.max.is_zero() {
            return;
        }
        let cap = self.max.as_nanos().saturating_mul(4);
        let sample = gap.as_nanos().min(cap).max(1) as u64;
        self.gap_ns = match self.gap_ns {
            0 => sample,
            g => (g * 7 + sample) / 8,
        };
    }

    /// How long to poll on after work now.
    pub(super) fn after_work(&self) -> Duration {
        let gap = Duration::from_nanos(self.gap_ns);
        if self.gap_ns == 0 || gap > self.max {
            return self.min;
        }
        (gap * 2).clamp(self.min, self.max.max(self.min))
    }
}

/// The decision after a round that did no work, at `now`, polling on for `spin` after the
/// last work.
pub(super) fn next(
    config: &WorkerConfig,
    out: &PollOutcome,
    now: Instant,
    last_work: Instant,
    spin: Duration,
) -> Next {
    if now.duration_since(last_work) < spin {
        return Next::Spin;
    }
    // A reply is about to arrive: poll for it rather than pay a wake-up.
    if out.reply_due_within(now, config.spin_for_reply) {
        return Next::Spin;
    }
    let mut park_for = config.max_park;
    if let Some(d) = out.next_deadline {
        park_for = park_for.min(d.saturating_duration_since(now));
    }
    Next::Park(park_for)
}
