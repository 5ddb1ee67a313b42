//! The SA window: how many PathRecord queries the resolver keeps out at once, and how that
//! follows what the SA says.
//!
//! The window is `cap` per port (at most the storage's in-flight capacity, at least 1). A BUSY
//! answer halves `cap` and holds it for `sa_deadline` (every resolver on the fabric probing
//! upward at once is what filled the SA's queue); after that, a window's worth of answers
//! grows it by one, up to the configured `sa_window`. Replies also feed a smoothed round-trip
//! estimate, which lets a backlogged job that could not be answered before its deadline be
//! dropped instead of sent.

use super::{Config, Millis};

/// The window's state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SaWindow {
    /// Jobs holding a window slot (Send, Sent, Busy, Zombie).
    pub(crate) held: u32,
    /// The window per port now: `sa_window`, halved per BUSY, +1 per window of answers.
    pub(crate) cap: u32,
    /// Answers since `cap` last grew.
    acks: u32,
    /// `cap` does not grow before this.
    hold: Millis,
    /// Smoothed round trip (send → reply, queueing in the SA included; 0 = none yet).
    rtt: Millis,
}

impl SaWindow {
    pub(crate) const fn new(sa_window: u32) -> Self {
        SaWindow {
            held: 0,
            cap: if sa_window == 0 { 1 } else { sa_window },
            acks: 0,
            hold: 0,
            rtt: 0,
        }
    }

    /// Room for one more query: `cap` per port, never more than `inflight` (the storage's
    /// capacity), never less than 1.
    pub(crate) fn has_room(&self, ports: u32, inflight: usize) -> bool {
        (self.held as usize)
            < (self.cap as usize)
                .saturating_mul(ports.max(1) as usize)
                .min(inflight)
                .max(1)
    }

    /// A reply came `sample` ms after its query went out (BUSY included).
    pub(crate) fn rtt_sample(&mut self, sample: Millis) {
        self.rtt = if self.rtt == 0 {
            sample.max(1)
        } else {
            (self.rtt * 7 + sample) / 8
        };
    }

    /// An answer (record or failure, not BUSY): after a window's worth the window grows by
    /// one (additive increase), unless held after a BUSY.
    pub(crate) fn answered(&mut self, now: Millis, cfg: &Config) {
        if self.cap >= cfg.sa_window || now < self.hold {
            return;
        }
        self.acks += 1;
        if self.acks >= self.cap {
            self.acks = 0;
            self.cap += 1;
        }
    }

    /// The SA said BUSY: halve the window (the queries already out stay out; new ones wait)
    /// and hold it for `sa_deadline`.
    pub(crate) fn busy(&mut self, now: Millis, cfg: &Config) {
        self.cap = (self.cap / 2).max(1);
        self.acks = 0;
        self.hold = now.saturating_add(cfg.sa_deadline);
    }

    /// Whether fewer than two round trips (the smoothed estimate; none before a first reply)
    /// are left before `deadline`.
    pub(crate) fn too_late(&self, now: Millis, deadline: Millis) -> bool {
        self.rtt > 0 && deadline.saturating_sub(now) < self.rtt.saturating_mul(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_halves_and_holds_answers_grow_it_back_by_one_per_window() {
        let cfg = Config::default();
        let mut w = SaWindow::new(cfg.sa_window);
        assert_eq!(w.cap, 16);
        w.busy(100, &cfg);
        w.busy(100, &cfg);
        assert_eq!(w.cap, 4);
        // Held for sa_deadline after the last BUSY.
        for _ in 0..100 {
            w.answered(100 + cfg.sa_deadline - 1, &cfg);
        }
        assert_eq!(w.cap, 4);
        for _ in 0..4 {
            w.answered(100 + cfg.sa_deadline, &cfg);
        }
        assert_eq!(w.cap, 5);
        w.busy(0, &cfg);
        w.busy(0, &cfg);
        w.busy(0, &cfg);
        assert_eq!(w.cap, 1, "never below one");
    }

    #[test]
    fn room_is_per_port_bounded_by_the_storage() {
        let mut w = SaWindow::new(2);
        w.held = 3;
        assert!(w.has_room(2, 100) && !w.has_room(1, 100) && !w.has_room(2, 3));
        w.held = 0;
        assert!(w.has_room(1, 0), "at least one");
    }

    #[test]
    fn too_late_needs_a_round_trip_estimate() {
        let mut w = SaWindow::new(4);
        assert!(!w.too_late(0, 1));
        w.rtt_sample(10);
        assert!(w.too_late(0, 19) && !w.too_late(0, 20));
        w.rtt_sample(90);
        assert_eq!(w.rtt, 20);
    }
}
