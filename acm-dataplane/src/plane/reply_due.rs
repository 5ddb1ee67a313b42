//! When an SA reply is due: the queries out, when each went, and a smoothed round trip, so
//! that the loop keeps polling for a reply about to arrive instead of parking and paying a
//! thread wake-up for it (`acmrs_poll_mode adaptive`; [`crate::worker::WorkerConfig`]'s
//! `spin_for_reply`). Fixed capacity: nothing is allocated after it is made.

use std::time::{Duration, Instant};

/// The most queries remembered (more than any SA window): the oldest is forgotten first.
const CAPACITY: usize = 512;

/// The queries out and the round-trip estimate.
pub(crate) struct ReplyDue {
    out: Vec<(u64, Instant)>,
    /// Smoothed round trip in ns (0 = no reply yet).
    rtt_ns: u64,
}

impl ReplyDue {
    pub(crate) fn new() -> Self {
        ReplyDue {
            out: Vec::with_capacity(CAPACITY),
            rtt_ns: 0,
        }
    }

    /// Query `token` went out at `at`.
    pub(crate) fn sent(&mut self, token: u64, at: Instant) {
        if self.out.len() == CAPACITY {
            self.out.remove(0);
        }
        self.out.push((token, at));
    }

    /// Query `token` ended at `at` (`replied`: by the SA, not failed by the
    /// transport); only a reply is a round-trip sample.
    pub(crate) fn done(&mut self, token: u64, at: Instant, replied: bool) {
        let Some(i) = self.out.iter().position(|o| o.0 == token) else {
            return;
        };
        let (_, sent) = self.out.swap_remove(i);
        if !replied {
            return;
        }
        let sample = at.saturating_duration_since(sent).as_nanos() as u64;
        self.rtt_ns = match self.rtt_ns {
            0 => sample.max(1),
            r => (r * 7 + sample) / 8,
        };
    }

    /// When the next reply is expected: two round trips after the oldest query still out.
    /// `None` when nothing is out or no round trip is known yet.
    pub(crate) fn due(&self) -> Option<Instant> {
        if self.rtt_ns == 0 {
            return None;
        }
        let oldest = self.out.iter().map(|o| o.1).min()?;
        Some(oldest + Duration::from_nanos(self.rtt_ns.saturating_mul(2)))
    }

    /// The smoothed round trip (for logs and tests).
    #[cfg(test)]
    pub(crate) fn rtt(&self) -> Duration {
        Duration::from_nanos(self.rtt_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_due_two_round_trips_after_the_oldest_query_out() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let mut d = ReplyDue::new();
        d.sent(1, t0);
        assert_eq!(d.due(), None, "no round trip known yet");
        d.done(1, t0 + us(40), true);
        assert_eq!(d.rtt(), us(40));
        assert_eq!(d.due(), None, "nothing out");
        d.sent(2, t0 + us(100));
        d.sent(3, t0 + us(110));
        assert_eq!(d.due(), Some(t0 + us(180)));
        // A failure is no sample; the query is forgotten.
        d.done(2, t0 + us(5000), false);
        assert_eq!(d.rtt(), us(40));
        assert_eq!(d.due(), Some(t0 + us(190)));
        d.done(3, t0 + us(190), true);
        assert_eq!(d.rtt(), us(45));
        assert_eq!(d.due(), None);
        // Unknown tokens change nothing; the table never grows past its capacity.
        d.done(99, t0, true);
        for i in 0..(CAPACITY as u64 + 10) {
            d.sent(i, t0 + us(i));
        }
        assert_eq!(d.out.len(), CAPACITY);
        assert_eq!(d.out.capacity(), CAPACITY, "no allocation after new()");
    }
}
