//! The `ibacm_hosts.data` format as rdma-core's sample file documents it: names, IPv4 and IPv6
//! addresses, several addresses per GID.

use acm_core_nostd::cache::AddrKind;
use acm_core_nostd::text::addr::Address;
use acm_core_nostd::text::hosts::HostLines;

const SAMPLE: &str = "\
# InfiniBand hosts file for the address preload
#
# address IB-GID
luna3 fe80::8:f104:39a:169
192.168.1.3 fe80::8:f104:39a:169
fe80::208:f104:39a:169 fe80::8:f104:39a:169
node-b.cluster.example fe80::0002:c903:00a1:b2c4
";

#[test]
fn sample_entries() {
    let entries: Vec<_> = HostLines::new(SAMPLE.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(entries.len(), 4);
    let gid = [
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x08, 0xf1, 0x04, 0x03, 0x9a, 0x01, 0x69,
    ];
    assert!(entries[..3].iter().all(|e| e.gid == gid));
    assert_eq!(entries[0].line, 4);
    match entries[0].address {
        Address::Name(n) => assert_eq!(n.as_str(), "luna3"),
        other => panic!("{other:?}"),
    }
    assert_eq!(entries[1].address, Address::Ipv4([192, 168, 1, 3]));
    assert_eq!(entries[1].address.kind(), AddrKind::Ipv4);
    match entries[2].address {
        Address::Ipv6(a) => assert_eq!(a[..2], [0xfe, 0x80]),
        other => panic!("{other:?}"),
    }
    assert_eq!(entries[3].gid[15], 0xc4);
    assert_eq!(entries[3].address.kind(), AddrKind::Name);
}
