//! The SA window: how many PathRecord queries the resolver keeps out at once, how fast it
//! sends when even one at a time is too many, and when the SA counts as gone.
//!
//! What a node can see of the SA is its own queries' round trips, its timeouts and any BUSY.
//! An overloaded SA queues before it drops (OpenSM drops new requests silently once its
//! dispatcher's queue has waited longer than `max_msg_fifo_timeout`; it never says BUSY), so
//! the window follows the round trip and shrinks before the loss:
//!
//! * **Slow start.** A client starts with `sa_window_start` queries (1 by default) and grows
//!   by one per answer (doubling per round trip) while the round trip stays below half the
//!   target, up to `sa_window`; the first cut ends it. A cluster that starts at once then
//!   probes a slow SA instead of queueing a whole window per node in it.
//! * **Queue building, shrink.** The target is an eighth of `sa_deadline` (875 ms by
//!   default: far below the point where the transport re-sends a try, and OpenSM's 10 s
//!   drop threshold), and never less than twice the floor (the shortest round trip seen) plus
//!   2 ms of clock granularity. Once the smoothed round trip exceeds it, the window shrinks
//!   to three quarters, at most once per round trip, but not below one query.
//! * **Below half the target, grow.** A window's worth of answers grows the window by one
//!   query (additive increase). In between it holds. A queue in the SA that keeps it busy
//!   costs no one anything; one that nears the transport's timeouts costs re-sends.
//! * **Loss or BUSY, halve and hold.** A query that timed out, or a BUSY answer, halves the
//!   window (down to one query; below that at most once per round trip), and it does not grow
//!   again for `sa_deadline` (every resolver on the fabric probing upward at once is what
//!   filled the SA's queue).
//! * **Below one, pace.** Losses take the window below one query (it is kept in eighths,
//!   down to one eighth): then one query per port is out at a time, and each goes out
//!   `round trip × 8 / window` after the previous one.
//!
//! **Progress, not age.** A route job is failed for waiting too long only if the SA has
//! stopped answering: its deadline is `queue_deadline` from its start, or `sa_deadline` after
//! the last SA answer of any query, whichever is later. With the SA gone, every request is
//! answered within `queue_deadline` of its arrival; while it replies, however slowly, the
//! backlog waits for it.

use super::{Config, Millis};

/// A whole query, in the window's unit.
const ONE: u32 = 8;

/// The window's state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SaWindow {
    /// Jobs holding a window slot (Send, Sent, Busy, Zombie).
    pub(crate) held: u32,
    /// The window per port now, in eighths of a query (at least 1, at most `sa_window` × 8).
    cap: u32,
    /// Answers since the window last grew.
    acks: u32,
    /// Still in slow start (no cut yet).
    slow: bool,
    /// The window does not grow before this (after a loss or BUSY).
    hold: Millis,
    /// No round-trip cut before this (one per round trip).
    cut: Millis,
    /// Smoothed round trip (send → reply, queueing in the SA included; 0 = none yet).
    rtt: Millis,
    /// The shortest round trip seen (0 = none yet).
    floor: Millis,
    /// While pacing (window below one query): no query goes out before this.
    next_send: Millis,
    /// When the SA last answered anything (`None`: never).
    heard: Option<Millis>,
}

impl SaWindow {
    /// A window of at most `sa_window` queries that starts at `start` (both at least 1).
    pub(crate) fn new(sa_window: u32, start: u32) -> Self {
        let max = sa_window.max(1);
        let start = start.clamp(1, max);
        SaWindow {
            held: 0,
            cap: start * ONE,
            acks: 0,
            slow: start < max,
            hold: 0,
            cut: 0,
            rtt: 0,
            floor: 0,
            next_send: 0,
            heard: None,
        }
    }

    /// At most `sa_window` queries per port from now on (the transport's own window): a
    /// window that has sent nothing yet starts afresh at `start`, one in use is only cut.
    pub(crate) fn limit(&mut self, sa_window: u32, start: u32) {
        if self.held == 0 && self.heard.is_none() {
            *self = SaWindow::new(sa_window, start);
            return;
        }
        let max = sa_window.max(1) * ONE;
        self.cap = self.cap.min(max);
        self.slow &= self.cap < max;
    }

    /// The window per port in whole queries (0 while pacing).
    #[cfg(test)]
    pub(crate) fn queries(&self) -> u32 {
        self.cap / ONE
    }

    /// Room for one more query at `now`: `cap` per port, never more than `inflight` (the
    /// storage's capacity), never less than 1; while pacing, one per port and not before the
    /// pace allows.
    pub(crate) fn has_room(&self, ports: u32, inflight: usize, now: Millis) -> bool {
        let ports = ports.max(1) as usize;
        if self.cap < ONE {
            return (self.held as usize) < ports.min(inflight).max(1) && now >= self.next_send;
        }
        (self.held as usize)
            < ((self.cap / ONE) as usize)
                .saturating_mul(ports)
                .min(inflight)
                .max(1)
    }

    /// A query went out at `now`: while pacing, the next one waits its turn.
    pub(crate) fn sent(&mut self, now: Millis, ports: u32) {
        if self.cap < ONE {
            let gap =
                self.rtt.max(1) * u64::from(ONE) / u64::from(self.cap) / u64::from(ports.max(1));
            self.next_send = now.saturating_add(gap.max(1));
        }
    }

    /// When the pace lets the next query go, if it is holding one back at `now`.
    pub(crate) fn paced_until(&self, now: Millis) -> Option<Millis> {
        (self.cap < ONE && self.next_send > now).then_some(self.next_send)
    }

    /// The SA replied at `now` a query sent `sample` ms before (`busy`: with BUSY).
    pub(crate) fn replied(&mut self, now: Millis, sample: Millis, busy: bool, cfg: &Config) {
        self.heard = Some(now);
        let sample = sample.max(1);
        self.floor = if self.floor == 0 {
            sample
        } else {
            self.floor.min(sample)
        };
        self.rtt = if self.rtt == 0 {
            sample
        } else {
            (self.rtt * 7 + sample) / 8
        };
        if busy {
            return self.halve(now, cfg);
        }
        let target = (cfg.sa_deadline / 8).max(self.floor * 2 + 2);
        if self.rtt > target {
            // A queue is building in the SA: give way before it drops.
            if now >= self.cut {
                // Not below one query: a queue alone is no loss, and a node that sends less
                // than one query per round trip hears from the SA too seldom to keep its
                // waiting requests alive (their deadlines move with its answers).
                self.cap = (self.cap * 3 / 4).max(ONE.min(self.cap));
                self.acks = 0;
                self.slow = false;
                self.cut = now.saturating_add(self.rtt);
            }
            return;
        }
        let max = cfg.sa_window.max(1) * ONE;
        if self.cap >= max || now < self.hold || self.rtt > target / 2 {
            return;
        }
        if self.slow {
            self.cap = (self.cap + ONE).min(max);
            self.slow = self.cap < max;
            return;
        }
        self.acks += 1;
        if self.acks >= (self.cap / ONE).max(1) {
            self.acks = 0;
            // A whole query per window of answers; below one, an eighth per answer.
            self.cap = (self.cap + if self.cap < ONE { 1 } else { ONE }).min(max);
        }
    }

    /// A query got no answer (its tries ran out): halve and hold.
    pub(crate) fn lost(&mut self, now: Millis, cfg: &Config) {
        self.halve(now, cfg);
    }

    fn halve(&mut self, now: Millis, cfg: &Config) {
        // Down to one query at once per event (a window of BUSY answers halves it as often);
        // below one only once per round trip: pacing is for an SA that a single query at a
        // time still overloads.
        if self.cap > ONE {
            self.cap = (self.cap / 2).max(ONE);
        } else if now >= self.cut {
            self.cap = (self.cap / 2).max(1);
        }
        self.acks = 0;
        self.slow = false;
        self.hold = now.saturating_add(cfg.sa_deadline);
        self.cut = now.saturating_add(self.rtt);
    }

    /// The deadline of a job started at `born`: `queue_deadline` after it, or `sa_deadline`
    /// after the SA last answered anything, whichever is later.
    pub(crate) fn deadline(&self, born: Millis, cfg: &Config) -> Millis {
        let age = born.saturating_add(cfg.queue_deadline);
        match self.heard {
            Some(h) => age.max(h.saturating_add(cfg.sa_deadline)),
            None => age,
        }
    }

    /// Whether a query sent at `now` could not come back before `deadline`: fewer than two
    /// round trips (the smoothed estimate; none before a first reply) are left, and the SA
    /// has replied to nothing for a round trip (while it replies, the deadline moves on with
    /// it, so the query is worth its work).
    pub(crate) fn too_late(&self, now: Millis, deadline: Millis) -> bool {
        let silent = self.heard.is_none_or(|h| now.saturating_sub(h) > self.rtt);
        self.rtt > 0 && silent && deadline.saturating_sub(now) < self.rtt.saturating_mul(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(sa_window: u32) -> Config {
        Config {
            sa_window,
            ..Config::default()
        }
    }

    #[test]
    fn busy_or_loss_halves_and_holds_answers_near_the_floor_grow_it_back() {
        let cfg = cfg(16);
        let mut w = SaWindow::new(cfg.sa_window, cfg.sa_window);
        assert_eq!(w.queries(), 16);
        w.replied(100, 10, true, &cfg);
        w.lost(100, &cfg);
        assert_eq!(w.queries(), 4);
        // Held for sa_deadline after the last halving.
        for _ in 0..100 {
            w.replied(100 + cfg.sa_deadline - 1, 10, false, &cfg);
        }
        assert_eq!(w.queries(), 4);
        for _ in 0..4 {
            w.replied(100 + cfg.sa_deadline, 10, false, &cfg);
        }
        assert_eq!(w.queries(), 5);
    }

    #[test]
    fn a_rising_round_trip_shrinks_the_window_before_any_loss() {
        let cfg = cfg(16);
        let mut w = SaWindow::new(cfg.sa_window, cfg.sa_window);
        let mut now = 0;
        for _ in 0..20 {
            now += 10;
            w.replied(now, 5, false, &cfg);
        }
        assert_eq!(w.queries(), 16);
        // The SA's queue grows: 5 ms, then 2 s round trips (past the target, an eighth of
        // sa_deadline). Cut to 3/4 once per round trip.
        let mut seen = vec![];
        for _ in 0..40 {
            now += 100;
            w.replied(now, 2000, false, &cfg);
            seen.push(w.queries());
        }
        assert!(seen.windows(2).all(|p| p[1] <= p[0]), "{seen:?}");
        assert!(w.queries() < 8, "shrunk without a loss: {seen:?}");
        // One cut per round trip, not one per answer.
        assert!(seen.iter().filter(|&&q| q == 12).count() > 1, "{seen:?}");
    }

    #[test]
    fn below_one_query_the_window_paces() {
        let cfg = cfg(4);
        let mut w = SaWindow::new(cfg.sa_window, cfg.sa_window);
        w.replied(0, 10, false, &cfg);
        let mut now = 0;
        for _ in 0..3 {
            w.lost(now, &cfg);
        }
        assert_eq!(w.queries(), 1, "down to one query at once");
        w.lost(now + 1, &cfg);
        assert_eq!(w.queries(), 1, "below one only once per round trip");
        for _ in 0..6 {
            now += 10;
            w.lost(now, &cfg);
        }
        assert_eq!(w.cap, 1, "one eighth, not less");
        assert!(w.has_room(1, 100, now));
        w.held = 1;
        assert!(!w.has_room(1, 100, now), "one out at a time");
        w.held = 0;
        w.sent(now, 1);
        // Round trip 10 ms, window 1/8: one query per 80 ms.
        assert_eq!(w.paced_until(now), Some(now + 80));
        assert!(!w.has_room(1, 100, now + 79) && w.has_room(1, 100, now + 80));
        assert_eq!(w.paced_until(now + 80), None);
    }

    #[test]
    fn slow_start_grows_one_query_per_answer_until_the_window_or_a_cut() {
        let cfg = cfg(16);
        let mut w = SaWindow::new(16, 1);
        assert_eq!(w.queries(), 1);
        for i in 0..5 {
            w.replied(i, 5, false, &cfg);
        }
        assert_eq!(
            w.queries(),
            6,
            "one per answer, not one per window of answers"
        );
        for i in 5..30 {
            w.replied(i, 5, false, &cfg);
        }
        assert_eq!(w.queries(), 16, "up to the window");
        // A cut ends it: growth is one query per window of answers afterwards.
        let mut w = SaWindow::new(16, 4);
        w.replied(0, 5, false, &cfg);
        w.lost(0, &cfg);
        assert_eq!(w.queries(), 2);
        for i in 0..3 {
            w.replied(cfg.sa_deadline + i, 5, false, &cfg);
        }
        assert_eq!(w.queries(), 3, "2 answers grew it by one, not by three");
        // An SA that answers the first query in 5 ms, then queues: slow start stops once the
        // smoothed round trip passes half the target (an eighth of sa_deadline), well before
        // the window.
        let mut w = SaWindow::new(16, 1);
        w.replied(0, 5, false, &cfg);
        for i in 1..40 {
            w.replied(i * 1000, 600, false, &cfg);
        }
        assert!(w.queries() < 12, "{}", w.queries());
    }

    #[test]
    fn room_is_per_port_bounded_by_the_storage() {
        let mut w = SaWindow::new(2, 2);
        w.held = 3;
        assert!(w.has_room(2, 100, 0) && !w.has_room(1, 100, 0) && !w.has_room(2, 3, 0));
        w.held = 0;
        assert!(w.has_room(1, 0, 0), "at least one");
    }

    #[test]
    fn the_deadline_moves_with_the_sas_answers_not_with_age_alone() {
        let cfg = Config {
            queue_deadline: 1000,
            sa_deadline: 300,
            ..Config::default()
        };
        let mut w = SaWindow::new(4, 4);
        assert_eq!(w.deadline(50, &cfg), 1050, "never heard: the age bound");
        w.replied(2000, 5, false, &cfg);
        assert_eq!(w.deadline(50, &cfg), 2300, "the SA answers: wait for it");
        assert_eq!(w.deadline(1900, &cfg), 2900);
    }

    #[test]
    fn too_late_needs_a_round_trip_estimate_and_a_silent_sa() {
        let cfg = cfg(4);
        let mut w = SaWindow::new(4, 4);
        assert!(!w.too_late(0, 1));
        w.replied(0, 10, false, &cfg);
        // The SA replied just now: the deadline will move with its next replies.
        assert!(!w.too_late(5, 20));
        // Silent for more than a round trip: two round trips are needed.
        assert!(w.too_late(11, 30) && !w.too_late(11, 31));
    }
}
