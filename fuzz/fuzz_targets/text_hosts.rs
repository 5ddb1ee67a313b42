#![no_main]
//! Fuzzes the `ibacm_hosts.data` and `ibacm_addr.cfg` parsers and the address parsers they are
//! built on.
use acm_core_nostd::text::addr::{parse_ipv4, parse_ipv6, Address, MAX_NAME_LEN};
use acm_core_nostd::text::addr_cfg::{AddrCfgLines, MAX_LINE};
use acm_core_nostd::text::hosts::HostLines;
use acm_core_nostd::text::Lines;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let total = Lines::new(data).count() as u32;
    let mut last = 0u32;
    for item in HostLines::new(data) {
        let line = match item {
            Ok(e) => {
                if let Address::Name(n) = e.address {
                    assert!(!n.as_str().is_empty() && n.as_str().len() <= MAX_NAME_LEN);
                    assert_eq!(n.as_padded()[MAX_NAME_LEN], 0);
                }
                e.line
            }
            Err(e) => e.line,
        };
        assert!(line > last && line <= total);
        last = line;
    }
    // The same bytes as an `ibacm_addr.cfg`: line numbers increase, entries are well formed.
    let mut last = 0u32;
    let lines: Vec<&[u8]> = Lines::new(data).map(|l| l.bytes).collect();
    for item in AddrCfgLines::new(data) {
        let line = match item {
            Ok(e) => {
                assert!(e.port >= 1 && !e.device.is_empty());
                assert!(lines[e.line as usize - 1].len() <= MAX_LINE);
                assert_eq!(e.address.to_acm_bytes().len(), 64);
                e.line
            }
            Err(e) => e.line,
        };
        assert!(line > last && line <= total);
        last = line;
    }
    // Whole input as one address token: parsed forms re-format and re-parse to themselves.
    if let Some(a) = parse_ipv4(data) {
        let text = std::net::Ipv4Addr::from(a).to_string();
        assert_eq!(parse_ipv4(text.as_bytes()), Some(a));
    }
    if let Some(a) = parse_ipv6(data) {
        let text = std::net::Ipv6Addr::from(a).to_string();
        assert_eq!(parse_ipv6(text.as_bytes()), Some(a));
    }
    if let Ok(a) = Address::parse(data) {
        assert_eq!(a.to_acm_bytes().len(), 64);
    }
});
