//! The node's events ([`Event`]) as lines of the core's log. A failed half-world table logs
//! its reason only when it is the first since the drop lines (`plane/drops.rs`), which count
//! the failures (`sa_table_failed`) at most once a second.

use super::{CoreIo, Plane};
use acm_core_nostd::node::Event;
use acm_core_nostd::rmpp::Failure;
use acm_core_nostd::wire::path_record::PATH_RECORD_LEN;

impl<I: CoreIo> Plane<I> {
    /// Logs `e` (errors at level 0, the rest at level 1).
    pub(super) fn log_event(&mut self, e: Event) {
        match e {
            Event::SaFull { ep } => self.io.log(
                0,
                &format!(
                    "ERROR - no room for another SA request: query of endpoint {} failed",
                    ep.0
                ),
            ),
            Event::TableReceived { records } => {
                if self.io.log_enabled(1) {
                    self.io.log(
                        1,
                        &format!("SA half-world PathRecord table: {records} records"),
                    );
                }
            }
            Event::TableFailed { failure } => {
                // Counted (`sa_table_failed`): the drop lines report how many at most once a
                // second. Its reason only for the first failure since those lines, so a
                // subnet refusing every table cannot flood the core's log.
                let failed = self.n().stats().sa_table_failed;
                if !first_since_drop_lines(failed, self.last_stats.sa_table_failed) {
                    return;
                }
                let line = match failure {
                    Failure::TooBig {
                        records_needed,
                        capacity,
                        ..
                    } => format!(
                        "ERROR - SA half-world PathRecord table failed: needs {} records, \
                         room for {} (acmrs_path_capacity): tables off for this endpoint",
                        Needed(records_needed),
                        capacity / PATH_RECORD_LEN
                    ),
                    f => format!(
                        "ERROR - SA half-world PathRecord table failed: {f:?}: the Gets go on"
                    ),
                };
                self.io.log(0, &line);
            }
            Event::SmChanged { old, new, .. } => self.io.log(
                0,
                &format!(
                    "SM LID changed {} -> {}: learned paths dropped, subscriptions renewed",
                    old.lid, new.lid
                ),
            ),
            Event::Report {
                trap,
                gid,
                invalidated,
                ..
            } => {
                if self.io.log_enabled(1) {
                    self.io.log(
                        1,
                        &format!(
                            "SA Report: trap {trap} for {gid}: {invalidated} cache entries \
                             invalidated"
                        ),
                    );
                }
            }
        }
    }
}

/// The records a too-big table needed, as the log line says it: the number, or "more" when
/// the sender gave no PayloadLength.
struct Needed(Option<u32>);

impl core::fmt::Display for Needed {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {
            Some(n) => write!(f, "{n}"),
            None => f.write_str("more"),
        }
    }
}

/// Whether a failure of a counter now at `count` is the first since the drop lines last
/// logged it at `logged` (`log_drops` takes its snapshot then): only that one logs its reason.
/// A counter that went back (a resolver rebuilt after a panic starts from 0) counts afresh.
fn first_since_drop_lines(count: u64, logged: u64) -> bool {
    count.saturating_sub(logged) <= 1
}

#[cfg(test)]
mod tests {
    use super::first_since_drop_lines;

    #[test]
    fn only_the_first_failure_since_the_drop_lines_logs_its_reason() {
        // Drop lines last logged 3 failures; the 4th is news, the 5th and later wait for the
        // next drop lines (which count them).
        assert!(first_since_drop_lines(4, 3));
        assert!(!first_since_drop_lines(5, 3));
        assert!(!first_since_drop_lines(40, 3));
        // The event before the counter moved (no table slot matched it).
        assert!(first_since_drop_lines(3, 3));
        // A rebuilt resolver's counter starts again below the last snapshot.
        assert!(first_since_drop_lines(1, 3));
    }
}
