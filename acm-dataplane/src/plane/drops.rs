//! Drop logging: what the resolver (its `Stats`) and the endpoints' QPs (`UdHealth`) dropped
//! or repaired (the half-world tables that failed among them), and the class-3 MADs not from
//! the SM, logged with the reason, how many and the running total, at most once a second (a
//! remote node sending garbage cannot flood the core's log; every drop is counted anyway).

use super::{CoreIo, Plane};
use acm_core_nostd::resolver::{EpId, Millis};

impl<I: CoreIo> Plane<I> {
    /// Logs what the resolver and the QPs dropped since the last lines (reason, how many,
    /// running total), at most once a second.
    pub(super) fn log_drops(&mut self, now: Millis) {
        if self.last_drop_log != 0 && now < self.last_drop_log.saturating_add(1000) {
            return;
        }
        for k in 0..self.eps.count() {
            let Some((ep, rec)) = self.eps.nth_mut(k) else {
                break;
            };
            let Some(h) = rec.ud.as_ref().map(|u| u.health()) else {
                continue;
            };
            let l = std::mem::replace(&mut rec.logged, h);
            if h == l {
                continue;
            }
            for (name, now_v, before) in [
                ("datagram shorter than a MAD dropped", h.short, l.short),
                ("receive completion in error", h.recv_errors, l.recv_errors),
                ("ACM send failed", h.send_errors, l.send_errors),
                ("UD QP recycled after an error", h.qp_resets, l.qp_resets),
                (
                    "receive queue starved (re-posts refused): QP reset to refill it",
                    h.rq_starved,
                    l.rq_starved,
                ),
            ] {
                self.log_grown(Some(ep), name, now_v, before);
            }
            self.last_drop_log = now.max(1);
        }
        let s = self.n().stats();
        if s == self.last_stats {
            return;
        }
        self.last_drop_log = now.max(1);
        let l = self.last_stats;
        for (name, now, before) in [
            (
                "malformed ACM MAD dropped",
                s.acm_malformed,
                l.acm_malformed,
            ),
            (
                "ACM response with no pending TID dropped",
                s.acm_unknown_tid,
                l.acm_unknown_tid,
            ),
            (
                "unsolicited ACM response dropped",
                s.acm_unsolicited,
                l.acm_unsolicited,
            ),
            (
                "ACM MAD from a foreign P_Key or without GRH dropped",
                s.acm_wrong_key,
                l.acm_wrong_key,
            ),
            ("unknown SA reply ignored", s.sa_unknown, l.sa_unknown),
            (
                "SA MAD not from the SM (its LID, QP 1) or not on the asking QP dropped",
                s.sa_forged,
                l.sa_forged,
            ),
            ("request refused, no slot free (ENOMEM)", s.full, l.full),
            (
                "malformed client request rejected (EINVAL)",
                s.malformed,
                l.malformed,
            ),
            ("query timed out (ETIMEDOUT)", s.timeouts, l.timeouts),
            (
                "SA query unanswered after every try (retried after a backoff)",
                s.sa_lost,
                l.sa_lost,
            ),
            (
                "ACM request with no group in common dropped",
                s.acm_no_group,
                l.acm_no_group,
            ),
            (
                "ACM request for an address of another partition's endpoint dropped",
                s.acm_other_partition,
                l.acm_other_partition,
            ),
            ("answer with no free slot lost", s.lost, l.lost),
            (
                "SA half-world PathRecord table failed (Gets instead)",
                s.sa_table_failed,
                l.sa_table_failed,
            ),
            (
                "SA MAD neither a reply nor a valid Report dropped, or subscription refused",
                s.report_malformed,
                l.report_malformed,
            ),
        ] {
            self.log_grown(None, name, now, before);
        }
        self.last_stats = s;
    }

    /// Logs that the counter of `what` (of endpoint `ep`, if any) grew from `before` to `now`:
    /// by how much, and the running total. Nothing if it did not grow.
    fn log_grown(&mut self, ep: Option<EpId>, what: &str, now: u64, before: u64) {
        if now <= before {
            return;
        }
        let n = now - before;
        let line = match ep {
            Some(ep) => format!("ERROR - endpoint {}: {what}: {n} (total {now})", ep.0),
            None => format!("ERROR - {what}: {n} (total {now})"),
        };
        self.io.log(0, &line);
    }
}
