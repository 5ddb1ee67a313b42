//! Allocation-free address text parsers: IPv4, IPv6, GIDs and ACM host names.
//!
//! IPv4 and IPv6 use `core::net`'s parsers, which accept what `inet_pton` accepts: dotted quads
//! without leading zeros; all IPv6 forms (`::`, `::1`, hex groups, compressed zeros, embedded
//! IPv4 as in `::ffff:1.2.3.4`); no zone ids, no brackets, no surrounding whitespace. A GID is
//! written as IPv6 text (`fe80::8:f104:39a:169`).
//!
//! [`Address`] is the ACM endpoint address a text token denotes: tried as IPv4, then IPv6, and
//! otherwise a host name of at most [`MAX_NAME_LEN`] bytes, stored NUL-padded in 64 bytes as in
//! the ACM address (`ACM_MAX_ADDRESS`).

use super::ErrorKind;
use crate::cache::AddrKind;
use core::net::{Ipv4Addr, Ipv6Addr};

/// Size of an ACM address field (`ACM_MAX_ADDRESS`).
pub use crate::wire::client::MAX_ADDRESS as ACM_MAX_ADDRESS;
/// Longest host name: one byte of the 64 stays NUL.
pub const MAX_NAME_LEN: usize = ACM_MAX_ADDRESS - 1;

/// Parses dotted-quad IPv4 text (`192.168.1.3`) into network-order bytes.
pub fn parse_ipv4(text: &[u8]) -> Option<[u8; 4]> {
    let s = core::str::from_utf8(text).ok()?;
    s.parse::<Ipv4Addr>().ok().map(|a| a.octets())
}

/// Parses IPv6 text in any `inet_pton` form into network-order bytes.
pub fn parse_ipv6(text: &[u8]) -> Option<[u8; 16]> {
    let s = core::str::from_utf8(text).ok()?;
    s.parse::<Ipv6Addr>().ok().map(|a| a.octets())
}

/// Parses a GID written as IPv6 text into its 16 raw bytes (subnet prefix, then interface id).
pub fn parse_gid(text: &[u8]) -> Result<[u8; 16], ErrorKind> {
    parse_ipv6(text).ok_or(ErrorKind::InvalidGid)
}

/// A host name, NUL-padded to [`ACM_MAX_ADDRESS`] bytes as the ACM address carries it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostName {
    bytes: [u8; ACM_MAX_ADDRESS],
    len: u8,
}

impl HostName {
    /// A host name from text: 1..=63 printable ASCII bytes, no `:` (that would be broken IPv6).
    pub fn new(text: &[u8]) -> Result<Self, ErrorKind> {
        if text.is_empty() {
            return Err(ErrorKind::InvalidAddress);
        }
        if text.len() > MAX_NAME_LEN {
            return Err(ErrorKind::NameTooLong);
        }
        if !text.iter().all(|&b| b.is_ascii_graphic() && b != b':') {
            return Err(ErrorKind::InvalidAddress);
        }
        let mut bytes = [0u8; ACM_MAX_ADDRESS];
        bytes[..text.len()].copy_from_slice(text);
        Ok(HostName {
            bytes,
            len: text.len() as u8,
        })
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        // Construction admits ASCII only, so this never fails; fall back to "" regardless.
        core::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }

    /// The 64-byte NUL-padded form used in `acm_ep_addr_data.info.name`.
    pub const fn as_padded(&self) -> &[u8; ACM_MAX_ADDRESS] {
        &self.bytes
    }
}

impl core::fmt::Debug for HostName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "HostName({:?})", self.as_str())
    }
}

/// An ACM endpoint address parsed from text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Address {
    /// IPv4, network order.
    Ipv4([u8; 4]),
    /// IPv6, network order.
    Ipv6([u8; 16]),
    /// A host name.
    Name(HostName),
}

impl Address {
    /// Tries `text` as IPv4, then IPv6, then a host name (as ibacmp does).
    pub fn parse(text: &[u8]) -> Result<Self, ErrorKind> {
        if let Some(a) = parse_ipv4(text) {
            return Ok(Address::Ipv4(a));
        }
        if let Some(a) = parse_ipv6(text) {
            return Ok(Address::Ipv6(a));
        }
        HostName::new(text).map(Address::Name)
    }

    /// The address's kind (`ACM_ADDRESS_NAME`, `_IP`, `_IP6`).
    pub const fn kind(&self) -> AddrKind {
        match self {
            Address::Name(_) => AddrKind::Name,
            Address::Ipv4(_) => AddrKind::Ipv4,
            Address::Ipv6(_) => AddrKind::Ipv6,
        }
    }

    /// The 64-byte ACM address field: the address bytes, NUL-padded.
    pub fn to_acm_bytes(&self) -> [u8; ACM_MAX_ADDRESS] {
        let mut out = [0u8; ACM_MAX_ADDRESS];
        match self {
            Address::Ipv4(a) => out[..4].copy_from_slice(a),
            Address::Ipv6(a) => out[..16].copy_from_slice(a),
            Address::Name(n) => out = *n.as_padded(),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_forms() {
        assert_eq!(parse_ipv4(b"192.168.1.3"), Some([192, 168, 1, 3]));
        assert_eq!(parse_ipv4(b"0.0.0.0"), Some([0; 4]));
        for bad in [
            &b"256.1.1.1"[..],
            b"1.2.3",
            b"1.2.3.4.5",
            b"01.2.3.4",
            b" 1.2.3.4",
            b"1.2.3.4 ",
            b"",
            b"a.b.c.d",
            b"1..2.3",
            b"\xff",
        ] {
            assert_eq!(parse_ipv4(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ipv6_forms() {
        assert_eq!(parse_ipv6(b"::"), Some([0; 16]));
        let mut one = [0u8; 16];
        one[15] = 1;
        assert_eq!(parse_ipv6(b"::1"), Some(one));
        assert_eq!(
            parse_ipv6(b"fe80::8:f104:39a:169"),
            Some([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x08, 0xf1, 0x04, 0x03, 0x9a, 0x01, 0x69])
        );
        assert_eq!(
            parse_ipv6(b"::ffff:1.2.3.4"),
            Some([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 1, 2, 3, 4])
        );
        assert_eq!(
            parse_ipv6(b"FE80:0:0:0:0002:C903:00A1:B2C3"),
            parse_ipv6(b"fe80::2:c903:a1:b2c3")
        );
        assert_eq!(parse_ipv6(b"1::"), {
            let mut a = [0u8; 16];
            a[1] = 1;
            Some(a)
        });
        for bad in [
            &b":::"[..],
            b"1::2::3",
            b"12345::",
            b"fe80::g",
            b"1:2:3:4:5:6:7:8:9",
            b"1:2:3:4:5:6:7",
            b"fe80::1%eth0",
            b"[::1]",
            b"::ffff:1.2.3",
            b"",
            b":",
        ] {
            assert_eq!(parse_ipv6(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn address_order_and_names() {
        assert_eq!(
            Address::parse(b"10.0.0.1"),
            Ok(Address::Ipv4([10, 0, 0, 1]))
        );
        assert!(matches!(Address::parse(b"fe80::1"), Ok(Address::Ipv6(_))));
        let a = Address::parse(b"luna3").unwrap();
        assert_eq!(a.kind(), AddrKind::Name);
        let bytes = a.to_acm_bytes();
        assert_eq!(&bytes[..6], b"luna3\0");
        assert!(bytes[5..].iter().all(|&b| b == 0));
        let max = [b'n'; 63];
        assert!(Address::parse(&max).is_ok());
        assert_eq!(Address::parse(&[b'n'; 64]), Err(ErrorKind::NameTooLong));
        assert_eq!(Address::parse(b"fe80::zz"), Err(ErrorKind::InvalidAddress));
        assert_eq!(Address::parse(b""), Err(ErrorKind::InvalidAddress));
        assert_eq!(Address::parse(b"a\x01b"), Err(ErrorKind::InvalidAddress));
        assert_eq!(parse_gid(b"nope"), Err(ErrorKind::InvalidGid));
    }
}
