//! The node's events ([`Event`]) as lines of the core's log.

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
                    "ERROR - SA request table full: query of endpoint {} failed",
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
                let why = match failure {
                    Failure::TooBig {
                        records_needed,
                        capacity,
                        ..
                    } => {
                        let need = records_needed.map_or("more".to_string(), |n| n.to_string());
                        format!(
                            "needs {need} records, room for {} (acmrs_path_capacity): tables \
                             off for this endpoint",
                            capacity / PATH_RECORD_LEN
                        )
                    }
                    f => format!("{f:?}: the Gets go on"),
                };
                self.io.log(
                    0,
                    &format!("ERROR - SA half-world PathRecord table failed: {why}"),
                );
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
