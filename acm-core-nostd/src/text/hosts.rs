//! `ibacm_hosts.data`: the address preload file (`addr_preload acm_hosts`, contract 3.9).
//!
//! One `address GID` pair per line, whitespace-separated, `#` comments in column 0. `address` is
//! tried as IPv4, then IPv6, else it is a host name ([`Address::parse`]); `GID` is IPv6 text.
//! Several addresses may map to one GID. Tokens after the GID are ignored, as ibacmp does.
//!
//! Differences from ibacmp, all deliberate: a line with an address but no GID is reported
//! ([`ErrorKind::MissingField`]) instead of silently skipped; names may be up to 63 bytes (ibacmp
//! reads at most 45 characters and misparses longer ones); a line longer than [`MAX_LINE`] bytes
//! is rejected (ibacmp's `fgets(120)` would split it).

use super::addr::{parse_gid, Address};
use super::{ErrorKind, LineError, Lines, Tokens};

/// Longest line ibacmp reads whole (`char s[120]`).
pub const MAX_LINE: usize = 119;

/// One host entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostEntry {
    /// 1-based line number.
    pub line: u32,
    /// The address (IPv4, IPv6 or host name).
    pub address: Address,
    /// The GID, 16 raw bytes in network order.
    pub gid: [u8; 16],
}

/// Iterator over the entries of an `ibacm_hosts.data` image; skips blank lines and comments.
#[derive(Debug, Clone)]
pub struct HostLines<'a> {
    lines: Lines<'a>,
}

impl<'a> HostLines<'a> {
    /// Entries of `input`.
    pub const fn new(input: &'a [u8]) -> Self {
        HostLines {
            lines: Lines::new(input),
        }
    }
}

impl Iterator for HostLines<'_> {
    type Item = Result<HostEntry, LineError>;

    fn next(&mut self) -> Option<Self::Item> {
        for raw in self.lines.by_ref() {
            if raw.bytes.first() == Some(&b'#') {
                continue;
            }
            let mut tokens = Tokens::new(raw.bytes);
            let Some(address) = tokens.next() else {
                continue;
            };
            return Some(
                parse_entry(raw.bytes.len(), address, tokens.next())
                    .map_err(|kind| LineError {
                        line: raw.number,
                        kind,
                    })
                    .map(|(address, gid)| HostEntry {
                        line: raw.number,
                        address,
                        gid,
                    }),
            );
        }
        None
    }
}

fn parse_entry(
    line_len: usize,
    address: &[u8],
    gid: Option<&[u8]>,
) -> Result<(Address, [u8; 16]), ErrorKind> {
    if line_len > MAX_LINE {
        return Err(ErrorKind::LineTooLong);
    }
    let gid = parse_gid(gid.ok_or(ErrorKind::MissingField)?)?;
    Ok((Address::parse(address)?, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_and_bad_lines() {
        let input = b"# header\n\
            luna3 fe80::8:f104:39a:169\n\
            192.168.1.3 fe80::8:f104:39a:169\n\
            \n\
            fe80::208:f104:39a:169\tfe80::8:f104:39a:169 extra\r\n\
            lonely\n\
            host1 not-a-gid\n\
            bad:name fe80::1\n\
            \x20# indented hash is not a comment for ibacmp\n\
            ::ffff:10.0.0.1 ::1";
        let v: Vec<_> = HostLines::new(input).collect();
        assert_eq!(v.len(), 8);
        let e0 = v[0].as_ref().unwrap();
        assert_eq!(e0.line, 2);
        assert_eq!(e0.address.to_acm_bytes()[..6], *b"luna3\0");
        assert_eq!(e0.gid[..2], [0xfe, 0x80]);
        assert_eq!(
            v[1].as_ref().unwrap().address,
            Address::Ipv4([192, 168, 1, 3])
        );
        assert_eq!(v[2].as_ref().unwrap().line, 5);
        assert!(matches!(v[2].as_ref().unwrap().address, Address::Ipv6(_)));
        let errs: Vec<_> = v[3..7].iter().map(|r| *r.as_ref().unwrap_err()).collect();
        assert_eq!(
            errs,
            [
                LineError {
                    line: 6,
                    kind: ErrorKind::MissingField
                },
                LineError {
                    line: 7,
                    kind: ErrorKind::InvalidGid
                },
                LineError {
                    line: 8,
                    kind: ErrorKind::InvalidAddress
                },
                LineError {
                    line: 9,
                    kind: ErrorKind::InvalidGid
                },
            ]
        );
        let last = v[7].as_ref().unwrap();
        assert_eq!(last.line, 10);
        assert_eq!(last.gid[15], 1);
    }

    #[test]
    fn long_line_rejected() {
        let line = format!("h fe80::1 {}\nh2 fe80::2\n", "x".repeat(120));
        let v: Vec<_> = HostLines::new(line.as_bytes()).collect();
        assert_eq!(
            v[0],
            Err(LineError {
                line: 1,
                kind: ErrorKind::LineTooLong
            })
        );
        assert!(v[1].is_ok());
    }
}
