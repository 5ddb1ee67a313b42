//! What the in-process plugin tests share.

/// Options of the answer and cache tests: ibacm's short timeout and no ibacm retries, three
/// quick SA retries on BUSY, routes that never time out.
pub const OPTS: &str = "\
# test options
log_level 2
timeout 100
retries 0
acmrs_sa_retries 3
acmrs_sa_busy_backoff_ms 5
route_timeout -1
";
