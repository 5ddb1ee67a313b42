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
acmrs_sa_window_start 4096
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

/// The mixed fabric the real-daemon tests start from: `net.2sw2path4hca`, Hca2 running the
/// stock libibacmp, Hca3 and Hca4 acmrs, no hosts file (names and IPs over the ACM protocol),
/// scratch and fabric names labelled `prefix`.
pub fn mixed_fabric(prefix: &str) -> acm_fabric::FabricBuilder {
    use acm_fabric::{Fabric, HostsFile, Provider, Topology};
    Fabric::builder(
        Topology::example("net.2sw2path4hca").unwrap(),
        ["Hca2", "Hca3", "Hca4"],
    )
    .provider(Provider::Acmrs)
    .node_provider("Hca2", Provider::Stock)
    .hosts_file(HostsFile::Absent)
    .name_prefix(prefix)
}

/// Hca2 running the stock libibacmp and Hca3 acmrs on `net.2sw2path4hca`, OpenSM on Hca1, Hca4
/// free (a destination that comes and goes, or a rogue host), labelled `prefix`.
pub fn stock_and_acmrs(prefix: &str) -> acm_fabric::FabricBuilder {
    use acm_fabric::{Fabric, Provider, Topology};
    Fabric::builder(
        Topology::example("net.2sw2path4hca").unwrap(),
        ["Hca2", "Hca3"],
    )
    .provider(Provider::Acmrs)
    .node_provider("Hca2", Provider::Stock)
    .name_prefix(prefix)
}

/// Daemon node `n`'s port GID.
pub fn node_gid(f: &acm_fabric::Fabric, n: &str) -> acm_core_nostd::wire::gid::Gid {
    acm_core_nostd::wire::gid::Gid(f.node(n).unwrap().gid.octets())
}

/// An OpenSM QoS policy (`qos_policy`) giving ServiceIDs 0x10000-0x1FFFF SL 3, 0x1060CBC SL 5
/// and everything else SL 0 ([`policy_sl`]).
pub const QOS_POLICY: &str = "\
qos-ulps
    default : 0
    any, service-id 0x0000000000010000-0x000000000001FFFF : 3
    any, service-id 0x0000000001060CBC : 5
end-qos-ulps
";

/// The SL [`QOS_POLICY`] gives `sid`.
pub fn policy_sl(sid: u64) -> u8 {
    match sid {
        0x10000..=0x1ffff => 3,
        0x1060cbc => 5,
        _ => 0,
    }
}
