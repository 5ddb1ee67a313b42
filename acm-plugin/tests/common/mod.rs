//! What the in-process plugin tests share (each test file uses some of it).
#![allow(dead_code)]

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

/// An OpenSM `dump_pr` file (`route_preload opensm_full_v1`) for the test port (GUID
/// 0x0002c90300a1b2c3, LID 7): routes to the `n` LIDs from `first_lid` on, whose ports have
/// the GUIDs from `first_guid` on.
pub fn route_dump(n: u16, first_lid: u16, first_guid: u64) -> String {
    let mut dump = String::from("Channel Adapter 0x0002c90300a1b2c3, base LID 7, \"Me\", port 1\n");
    for i in 0..n {
        dump += &format!("0x{:04x} : 1 : 4 : 6\n", first_lid + i);
    }
    for i in 0..n {
        dump += &format!(
            "\nChannel Adapter 0x{:016x}, base LID {}, \"N{i}\", port 1\n",
            first_guid + u64::from(i),
            first_lid + i
        );
    }
    dump
}
