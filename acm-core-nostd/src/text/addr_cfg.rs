//! The core's `ibacm_addr.cfg`: `address device port pkey|default` (contract 4.1).
//!
//! `#` comments in column 0. `address` is an IPv4/IPv6 literal or a host name (the core accepts
//! literals only with `support_ips_in_addr_cfg 1`; that policy is the caller's: inspect
//! [`Address`]). `device` is a verbs device name (≤ 31 bytes), `port` is 1-based, `pkey` is hex
//! (with or without `0x`) or `default` (the pkey at table index 0). Tokens after the fourth are
//! ignored. Unlike the core, a line with fewer than 4 fields is reported, not silently skipped.

use super::addr::Address;
use super::{parse_u64_auto, parse_u64_radix, ErrorKind, LineError, Lines, Tokens};
use heapless::String;

/// Longest line the core reads whole (`char s[120]`).
pub const MAX_LINE: usize = 119;

/// The `pkey` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PkeySpec {
    /// `default`: the pkey at index 0 of the port's table.
    Default,
    /// An explicit pkey.
    Value(u16),
}

/// One `ibacm_addr.cfg` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrCfgEntry {
    /// 1-based line number.
    pub line: u32,
    /// The endpoint address.
    pub address: Address,
    /// Verbs device name (compare case-insensitively, as the core does).
    pub device: String<31>,
    /// 1-based port number.
    pub port: u8,
    /// The partition.
    pub pkey: PkeySpec,
}

/// Iterator over the entries of an `ibacm_addr.cfg` image.
#[derive(Debug, Clone)]
pub struct AddrCfgLines<'a> {
    lines: Lines<'a>,
}

impl<'a> AddrCfgLines<'a> {
    /// Entries of `input`.
    pub const fn new(input: &'a [u8]) -> Self {
        AddrCfgLines {
            lines: Lines::new(input),
        }
    }
}

impl Iterator for AddrCfgLines<'_> {
    type Item = Result<AddrCfgEntry, LineError>;

    fn next(&mut self) -> Option<Self::Item> {
        for raw in self.lines.by_ref() {
            if raw.bytes.first() == Some(&b'#') {
                continue;
            }
            let mut tokens = Tokens::new(raw.bytes);
            if tokens.clone().next().is_none() {
                continue;
            }
            let line = raw.number;
            return Some(
                parse_entry(line, raw.bytes.len(), &mut tokens)
                    .map_err(|kind| LineError { line, kind }),
            );
        }
        None
    }
}

fn parse_entry(line: u32, len: usize, tokens: &mut Tokens<'_>) -> Result<AddrCfgEntry, ErrorKind> {
    if len > MAX_LINE {
        return Err(ErrorKind::LineTooLong);
    }
    let mut field = || tokens.next().ok_or(ErrorKind::MissingField);
    let (address, device, port, pkey) = (field()?, field()?, field()?, field()?);
    let address = Address::parse(address)?;
    let device = core::str::from_utf8(device).map_err(|_| ErrorKind::NotUtf8)?;
    let device = String::try_from(device).map_err(|_| ErrorKind::Malformed)?;
    let port = parse_u64_auto(port).ok_or(ErrorKind::InvalidNumber)?;
    let port = u8::try_from(port)
        .ok()
        .filter(|&p| p >= 1)
        .ok_or(ErrorKind::OutOfRange)?;
    let pkey = if pkey.eq_ignore_ascii_case(b"default") {
        PkeySpec::Default
    } else {
        let hex = match pkey {
            [b'0', b'x' | b'X', rest @ ..] => rest,
            _ => pkey,
        };
        let v = parse_u64_radix(hex, 16).ok_or(ErrorKind::InvalidNumber)?;
        PkeySpec::Value(u16::try_from(v).map_err(|_| ErrorKind::OutOfRange)?)
    };
    Ok(AddrCfgEntry {
        line,
        address,
        device,
        port,
        pkey,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_errors() {
        let input = b"# generated\n\
            host3 ibsim0 1 default\n\
            host3-1 ibsim0 1 0xffff\n\
            10.0.0.3 mlx5_0 2 7fff extra\n\
            short ibsim0 1\n\
            host ibsim0 0 default\n\
            host ibsim0 1 fffff\n\
            host ibsim0 x default\n";
        let v: Vec<_> = AddrCfgLines::new(input).collect();
        let e = v[0].as_ref().unwrap();
        assert_eq!(
            (e.line, e.device.as_str(), e.port, e.pkey),
            (2, "ibsim0", 1, PkeySpec::Default)
        );
        assert_eq!(v[1].as_ref().unwrap().pkey, PkeySpec::Value(0xffff));
        let e = v[2].as_ref().unwrap();
        assert_eq!(e.address, Address::Ipv4([10, 0, 0, 3]));
        assert_eq!((e.port, e.pkey), (2, PkeySpec::Value(0x7fff)));
        let errs: Vec<_> = v[3..].iter().map(|r| *r.as_ref().unwrap_err()).collect();
        assert_eq!(
            errs,
            [
                LineError {
                    line: 5,
                    kind: ErrorKind::MissingField
                },
                LineError {
                    line: 6,
                    kind: ErrorKind::OutOfRange
                },
                LineError {
                    line: 7,
                    kind: ErrorKind::OutOfRange
                },
                LineError {
                    line: 8,
                    kind: ErrorKind::InvalidNumber
                },
            ]
        );
    }
}
