//! OpenSM `dump_pr` full path-record dump (`route_preload opensm_full_v1`, contract 3.9).
//!
//! The OpenSM `dump_pr` event plugin (with `DUMP_FULL_PATH_RECORDS=1`) writes
//! `opensm-path-records.dump`: for every port a node header, then one line per destination LID:
//!
//! ```text
//! Channel Adapter 0x0000000000100001, base LID 1, "Hca1", port 1
//! # LID  : SL : MTU : RATE
//! 0x0001 : 0  : 4   : 3
//! 0x0004 : UNREACHABLE
//!
//! Switch 0x0000000000100010, base LID 2, "Switch1", port 0
//! ```
//!
//! * A **node header** is a line whose first token starts with `Switch`, `Channel` (one more
//!   token, `Adapter`, is skipped) or `Router`; then the port GUID in hex up to `,`, then
//!   `base LID <n>` (decimal or `0x` hex) up to `,`. An optional `LMC <n>` (the peer-paths
//!   variant writes one) and the trailing `port <n>` are reported when present.
//! * A **path line** is `<dlid> : <sl> : <mtu> : <rate>`, spaces around the colons optional, DLID
//!   decimal or `0x` hex; MTU and rate are the raw IB enum values. `<dlid> : UNREACHABLE` says
//!   there is no path.
//! * `#` in column 0 starts a comment; blank lines are skipped. Unlike ibacmp (`fgets(128)`)
//!   there is no line-length limit: node descriptions can make header lines long.
//!
//! [`DumpPrLines`] yields the file as [`Event`]s. [`LocalPaths`] does what ibacmp does with the
//! file, without allocation: pass 1 fills a caller-provided LID→GUID table from every header,
//! pass 2 finds the local port's section (GUID and base LID both match) and yields its paths
//! with the destination GUID attached.

use super::{parse_u64_auto, parse_u64_radix, ErrorKind, LineError, Lines, Tokens};

/// First multicast LID; unicast LIDs are below it.
pub const LID_MCAST_START: u16 = 0xC000;

/// The node type a header names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// `Channel Adapter`.
    ChannelAdapter,
    /// `Switch`.
    Switch,
    /// `Router`.
    Router,
}

/// A node header: the port whose paths follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// 1-based line number.
    pub line: u32,
    /// Node type.
    pub kind: NodeKind,
    /// Port GUID.
    pub guid: u64,
    /// Base LID (1..=0xFFFF; values at or above [`LID_MCAST_START`] are reported as written,
    /// and ignored by [`LocalPaths`] like ibacmp ignores them).
    pub lid: u16,
    /// `LMC <n>` if the header carries it.
    pub lmc: Option<u8>,
    /// `port <n>` if the header carries it.
    pub port: Option<u8>,
}

/// A path line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// 1-based line number.
    pub line: u32,
    /// Destination LID.
    pub dlid: u16,
    /// Service level (0..=15).
    pub sl: u8,
    /// IB MTU enum (1 = 256 … 5 = 4096).
    pub mtu: u8,
    /// IB rate enum (6-bit).
    pub rate: u8,
}

/// One parsed line of a dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A node header; the following path lines belong to it.
    Header(Header),
    /// A path from the last header's port.
    Path(Path),
    /// `<dlid> : UNREACHABLE`.
    Unreachable {
        /// 1-based line number.
        line: u32,
        /// Destination LID.
        dlid: u16,
    },
}

/// Iterator over the events of a dump. A path line is reported only inside the section of a
/// header that parsed; after a bad header its path lines are errors
/// ([`ErrorKind::PathOutsideSection`]), so every [`Event::Path`] belongs to the last
/// [`Event::Header`].
#[derive(Debug, Clone)]
pub struct DumpPrLines<'a> {
    lines: Lines<'a>,
    in_section: bool,
}

impl<'a> DumpPrLines<'a> {
    /// Events of `input`.
    pub const fn new(input: &'a [u8]) -> Self {
        DumpPrLines {
            lines: Lines::new(input),
            in_section: false,
        }
    }
}

impl Iterator for DumpPrLines<'_> {
    type Item = Result<Event, LineError>;

    fn next(&mut self) -> Option<Self::Item> {
        for raw in self.lines.by_ref() {
            let line = raw.number;
            let err = |kind| LineError { line, kind };
            match classify(raw.bytes) {
                Class::Skip => continue,
                Class::Header(kind, rest) => {
                    let header = parse_header(line, kind, rest);
                    self.in_section = header.is_ok();
                    return Some(header.map(Event::Header).map_err(err));
                }
                Class::Path if !self.in_section => {
                    return Some(Err(err(ErrorKind::PathOutsideSection)));
                }
                Class::Path => return Some(parse_path(line, raw.bytes).map_err(err)),
            }
        }
        None
    }
}

enum Class<'a> {
    Skip,
    /// A header: its kind and the bytes after the type words.
    Header(NodeKind, &'a [u8]),
    Path,
}

/// Splits off the first whitespace-delimited token: `(token, rest after it)`.
fn split_token(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let token = Tokens::new(bytes).next()?;
    // `token` is a subslice of `bytes`; find where it ends.
    let start = token.as_ptr() as usize - bytes.as_ptr() as usize;
    Some((token, &bytes[start + token.len()..]))
}

fn classify(bytes: &[u8]) -> Class<'_> {
    if bytes.first() == Some(&b'#') {
        return Class::Skip;
    }
    let Some((first, rest)) = split_token(bytes) else {
        return Class::Skip;
    };
    if first.starts_with(b"Switch") {
        Class::Header(NodeKind::Switch, rest)
    } else if first.starts_with(b"Router") {
        Class::Header(NodeKind::Router, rest)
    } else if first.starts_with(b"Channel") {
        // ibacmp skips one more token ("Adapter"), whatever it is.
        let rest = split_token(rest).map_or(&rest[rest.len()..], |(_, r)| r);
        Class::Header(NodeKind::ChannelAdapter, rest)
    } else {
        Class::Path
    }
}

/// Returns true if `line` is a node header line (whether or not it parses).
pub fn is_header_line(line: &[u8]) -> bool {
    matches!(classify(line), Class::Header(..))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The text after `key` up to the next `,` (or end), trimmed.
fn field_after<'a>(bytes: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let at = find(bytes, key)? + key.len();
    let tail = &bytes[at..];
    let end = tail.iter().position(|&b| b == b',').unwrap_or(tail.len());
    Some(tail[..end].trim_ascii())
}

fn parse_header(line: u32, kind: NodeKind, rest: &[u8]) -> Result<Header, ErrorKind> {
    let comma = rest
        .iter()
        .position(|&b| b == b',')
        .ok_or(ErrorKind::Malformed)?;
    let guid_text = rest[..comma].trim_ascii();
    let guid_hex = match guid_text {
        [b'0', b'x' | b'X', hex @ ..] => hex,
        _ => guid_text,
    };
    let guid = parse_u64_radix(guid_hex, 16)
        .filter(|&g| g != 0)
        .ok_or(ErrorKind::InvalidGuid)?;
    let after = &rest[comma + 1..];
    let lid = field_after(after, b"base LID")
        .and_then(parse_u64_auto)
        .and_then(|l| u16::try_from(l).ok())
        .filter(|&l| l != 0)
        .ok_or(ErrorKind::InvalidLid)?;
    let small = |key: &[u8]| {
        field_after(after, key)
            .and_then(|t| parse_u64_radix(t, 10))
            .and_then(|v| u8::try_from(v).ok())
    };
    // The description is quoted and may contain anything; "port" is the last field.
    let port = after
        .windows(6)
        .rposition(|w| w == b", port")
        .and_then(|at| parse_u64_radix(after[at + 6..].trim_ascii(), 10))
        .and_then(|v| u8::try_from(v).ok());
    Ok(Header {
        line,
        kind,
        guid,
        lid,
        lmc: small(b"LMC").filter(|&l| l <= 7),
        port,
    })
}

fn parse_path(line: u32, bytes: &[u8]) -> Result<Event, ErrorKind> {
    let mut fields = bytes.split(|&b| b == b':').map(<[u8]>::trim_ascii);
    let dlid = fields
        .next()
        .and_then(parse_u64_auto)
        .and_then(|l| u16::try_from(l).ok())
        .filter(|&l| l != 0)
        .ok_or(ErrorKind::InvalidLid)?;
    let mut next_field = || fields.next().ok_or(ErrorKind::MissingField);
    let sl = next_field()?;
    if sl == b"UNREACHABLE" {
        return match next_field() {
            Err(_) => Ok(Event::Unreachable { line, dlid }),
            Ok(_) => Err(ErrorKind::Malformed),
        };
    }
    let (mtu, rate) = (next_field()?, next_field()?);
    if next_field().is_ok() {
        return Err(ErrorKind::Malformed);
    }
    let num = |t: &[u8], max: u8| {
        let v = parse_u64_radix(t, 10).ok_or(ErrorKind::InvalidNumber)?;
        u8::try_from(v)
            .ok()
            .filter(|&v| v <= max)
            .ok_or(ErrorKind::OutOfRange)
    };
    let (sl, mtu, rate) = (num(sl, 15)?, num(mtu, 5)?, num(rate, 63)?);
    if mtu == 0 {
        return Err(ErrorKind::OutOfRange);
    }
    Ok(Event::Path(Path {
        line,
        dlid,
        sl,
        mtu,
        rate,
    }))
}

/// One entry of a sparse LID→GUID table ([`LidTable::Sorted`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LidEntry {
    /// Base LID.
    pub lid: u16,
    /// Line of the header that declared it (first one wins on duplicates).
    pub line: u32,
    /// Port GUID.
    pub guid: u64,
}

/// Caller-provided storage for pass 1's LID→GUID table.
#[derive(Debug)]
pub enum LidTable<'s> {
    /// Indexed by LID, 0 = empty; 0xC000 entries (384 KiB) cover every unicast LID. A shorter
    /// slice covers LIDs below its length; headers with larger LIDs are reported as
    /// [`ErrorKind::TableFull`].
    Direct(&'s mut [u64]),
    /// Up to `len` headers, sorted and binary-searched after pass 1: for small fabrics or small
    /// memories (16 bytes per header).
    Sorted(&'s mut [LidEntry]),
}

/// The local port whose section [`LocalPaths`] looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPort {
    /// Port GUID (GID\[0\] interface id).
    pub guid: u64,
    /// Port base LID.
    pub lid: u16,
}

/// A path from the local port, with the destination's port GUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPath {
    /// 1-based line number.
    pub line: u32,
    /// Destination LID.
    pub dlid: u16,
    /// Destination port GUID (from the LID table).
    pub guid: u64,
    /// Service level.
    pub sl: u8,
    /// IB MTU enum.
    pub mtu: u8,
    /// IB rate enum.
    pub rate: u8,
}

/// The dump has no header for the local port (ibacmp: "failed to preload EP").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortNotFound;

impl core::fmt::Display for PortNotFound {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("no node header for the local port GUID and LID")
    }
}

/// ibacmp's two-pass route preload over a dump, yielding the local port's paths.
///
/// Unreachable destinations are skipped. Bad path lines in the local section and DLIDs missing
/// from the table ([`ErrorKind::UnknownDlid`]) are yielded as errors.
#[derive(Debug)]
pub struct LocalPaths<'a, 's> {
    lines: Lines<'a>,
    table: Table<'s>,
}

#[derive(Debug)]
enum Table<'s> {
    Direct(&'s [u64]),
    Sorted(&'s [LidEntry]),
}

impl Table<'_> {
    fn get(&self, lid: u16) -> Option<u64> {
        match self {
            Table::Direct(t) => t.get(usize::from(lid)).copied().filter(|&g| g != 0),
            Table::Sorted(t) => t
                .binary_search_by_key(&lid, |e| e.lid)
                .ok()
                .map(|i| t[i].guid),
        }
    }
}

impl<'a, 's> LocalPaths<'a, 's> {
    /// Runs pass 1 (every header into `table`; bad headers, duplicate LIDs and overflow go to
    /// `on_error`) and finds the local port's section.
    pub fn new(
        input: &'a [u8],
        port: LocalPort,
        table: LidTable<'s>,
        mut on_error: impl FnMut(LineError),
    ) -> Result<Self, PortNotFound> {
        let headers = Lines::new(input).filter_map(|raw| match classify(raw.bytes) {
            Class::Header(kind, rest) => Some(parse_header(raw.number, kind, rest).map_err(
                |kind| LineError {
                    line: raw.number,
                    kind,
                },
            )),
            _ => None,
        });
        let table = match table {
            LidTable::Direct(slots) => {
                slots.fill(0);
                for h in headers {
                    let h = match h {
                        Ok(h) if h.lid < LID_MCAST_START => h,
                        Ok(_) => continue,
                        Err(e) => {
                            on_error(e);
                            continue;
                        }
                    };
                    let kind = match slots.get_mut(usize::from(h.lid)) {
                        None => ErrorKind::TableFull,
                        Some(slot) if *slot != 0 => ErrorKind::DuplicateLid,
                        Some(slot) => {
                            *slot = h.guid;
                            continue;
                        }
                    };
                    on_error(LineError { line: h.line, kind });
                }
                Table::Direct(slots)
            }
            LidTable::Sorted(entries) => {
                let mut len = 0;
                for h in headers {
                    match h {
                        Ok(h) if h.lid < LID_MCAST_START => match entries.get_mut(len) {
                            Some(e) => {
                                *e = LidEntry {
                                    lid: h.lid,
                                    line: h.line,
                                    guid: h.guid,
                                };
                                len += 1;
                            }
                            None => on_error(LineError {
                                line: h.line,
                                kind: ErrorKind::TableFull,
                            }),
                        },
                        Ok(_) => {}
                        Err(e) => on_error(e),
                    }
                }
                let used = &mut entries[..len];
                used.sort_unstable_by_key(|e| (e.lid, e.line));
                // Keep the first header per LID; report the later ones.
                let mut kept = 0;
                for i in 0..used.len() {
                    if kept > 0 && used[kept - 1].lid == used[i].lid {
                        on_error(LineError {
                            line: used[i].line,
                            kind: ErrorKind::DuplicateLid,
                        });
                    } else {
                        used[kept] = used[i];
                        kept += 1;
                    }
                }
                Table::Sorted(&entries[..kept])
            }
        };
        // Pass 2: find the local section.
        let mut lines = Lines::new(input);
        for raw in lines.by_ref() {
            if let Class::Header(kind, rest) = classify(raw.bytes) {
                if let Ok(h) = parse_header(raw.number, kind, rest) {
                    if h.guid == port.guid && h.lid == port.lid {
                        return Ok(LocalPaths { lines, table });
                    }
                }
            }
        }
        Err(PortNotFound)
    }
}

impl Iterator for LocalPaths<'_, '_> {
    type Item = Result<LocalPath, LineError>;

    fn next(&mut self) -> Option<Self::Item> {
        while let Some(raw) = self.lines.next() {
            let line = raw.number;
            match classify(raw.bytes) {
                Class::Skip => continue,
                Class::Header(..) => {
                    // End of the local section: stop for good.
                    self.lines = Lines::new(&[]);
                    return None;
                }
                Class::Path => {}
            }
            let err = |kind| Some(Err(LineError { line, kind }));
            match parse_path(line, raw.bytes) {
                Ok(Event::Path(p)) => match self.table.get(p.dlid) {
                    Some(guid) => {
                        return Some(Ok(LocalPath {
                            line,
                            dlid: p.dlid,
                            guid,
                            sl: p.sl,
                            mtu: p.mtu,
                            rate: p.rate,
                        }))
                    }
                    None => return err(ErrorKind::UnknownDlid),
                },
                Ok(_) => continue,
                Err(kind) => return err(kind),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
Channel Adapter 0x0002c90300a1b2c3, base LID 7, \"node a, mlx5_0\", port 1
# LID  : SL : MTU : RATE
0x0001 : 0  : 4   : 7
9:1:5:16
0x0007 : 0  : 4   : 7
0x000A : UNREACHABLE

Switch 0x0002c902004d5e6f, base LID 1, LMC 0, \"sw\", port 0
0x0007 : 0  : 4   : 7
Router 0x0000000000000abc, base LID 0x9, \"rt\", port 2
";

    #[test]
    fn events() {
        let v: Vec<_> = DumpPrLines::new(SAMPLE.as_bytes()).collect();
        assert_eq!(
            v[0],
            Ok(Event::Header(Header {
                line: 1,
                kind: NodeKind::ChannelAdapter,
                guid: 0x0002c90300a1b2c3,
                lid: 7,
                lmc: None,
                port: Some(1),
            }))
        );
        assert_eq!(
            v[1],
            Ok(Event::Path(Path {
                line: 3,
                dlid: 1,
                sl: 0,
                mtu: 4,
                rate: 7
            }))
        );
        assert_eq!(
            v[2],
            Ok(Event::Path(Path {
                line: 4,
                dlid: 9,
                sl: 1,
                mtu: 5,
                rate: 16
            }))
        );
        assert_eq!(v[4], Ok(Event::Unreachable { line: 6, dlid: 10 }));
        match v[5] {
            Ok(Event::Header(h)) => {
                assert_eq!(
                    (h.kind, h.lid, h.lmc, h.port),
                    (NodeKind::Switch, 1, Some(0), Some(0))
                )
            }
            ref other => panic!("{other:?}"),
        }
        match v[7] {
            Ok(Event::Header(h)) => {
                assert_eq!((h.kind, h.guid, h.lid), (NodeKind::Router, 0xabc, 9))
            }
            ref other => panic!("{other:?}"),
        }
        assert_eq!(v.len(), 8);
    }

    #[test]
    fn bad_lines() {
        let input = "\
0x0001 : 0 : 4 : 7
Switch zz, base LID 1, port 0
0x0001 : 0 : 4 : 7
Switch 0x10, base LID 3
0x0001 : 16 : 4 : 7
0x0001 : 0 : 6 : 7
0x0001 : 0 : 4
0x0001 : 0 : 4 : 7 : 1
0 : 0 : 4 : 7
0x10000 : 0 : 4 : 7
0x0001 : x : 4 : 7
0x0002 : UNREACHABLE : 1
Switch 0x11, LID 4
Channel Adapter 0x12 base LID 4
";
        let errs: Vec<_> = DumpPrLines::new(input.as_bytes())
            .filter_map(Result::err)
            .map(|e| (e.line, e.kind))
            .collect();
        assert_eq!(
            errs,
            [
                (1, ErrorKind::PathOutsideSection),
                (2, ErrorKind::InvalidGuid),
                (3, ErrorKind::PathOutsideSection),
                (5, ErrorKind::OutOfRange),
                (6, ErrorKind::OutOfRange),
                (7, ErrorKind::MissingField),
                (8, ErrorKind::Malformed),
                (9, ErrorKind::InvalidLid),
                (10, ErrorKind::InvalidLid),
                (11, ErrorKind::InvalidNumber),
                (12, ErrorKind::Malformed),
                (13, ErrorKind::InvalidLid),
                (14, ErrorKind::Malformed),
            ]
        );
    }

    fn local(
        input: &str,
        port: LocalPort,
        sorted: bool,
    ) -> (Vec<Result<LocalPath, LineError>>, Vec<LineError>) {
        let mut errors = Vec::new();
        let mut direct = vec![0u64; usize::from(LID_MCAST_START)];
        let mut sparse = [LidEntry::default(); 8];
        let table = if sorted {
            LidTable::Sorted(&mut sparse)
        } else {
            LidTable::Direct(&mut direct)
        };
        let paths = LocalPaths::new(input.as_bytes(), port, table, |e| errors.push(e))
            .map(|p| p.collect())
            .unwrap_or_default();
        (paths, errors)
    }

    #[test]
    fn local_paths_both_tables() {
        let port = LocalPort {
            guid: 0x0002c90300a1b2c3,
            lid: 7,
        };
        for sorted in [false, true] {
            let (paths, errors) = local(SAMPLE, port, sorted);
            assert!(errors.is_empty(), "{errors:?}");
            assert_eq!(paths.len(), 3);
            assert_eq!(
                paths[0],
                Ok(LocalPath {
                    line: 3,
                    dlid: 1,
                    guid: 0x0002c902004d5e6f,
                    sl: 0,
                    mtu: 4,
                    rate: 7
                })
            );
            assert_eq!(paths[1].as_ref().unwrap().guid, 0xabc);
            assert_eq!(paths[2].as_ref().unwrap().guid, port.guid);
        }
    }

    #[test]
    fn local_paths_errors_duplicates_and_missing_port() {
        let input = "\
Switch 0x20, base LID 2, port 0
Channel Adapter 0x21, base LID 2, port 1
Channel Adapter 0x22, base LID 3, port 1
0x0002 : 0 : 4 : 3
0x0005 : 0 : 4 : 3
bogus
Switch 0x23, base LID 0xC001, port 0
Switch 0x24, base LID oops, port 0
";
        let port = LocalPort { guid: 0x22, lid: 3 };
        for sorted in [false, true] {
            let (paths, mut errors) = local(input, port, sorted);
            errors.sort_by_key(|e| e.line);
            assert_eq!(
                errors,
                [
                    LineError {
                        line: 2,
                        kind: ErrorKind::DuplicateLid
                    },
                    LineError {
                        line: 8,
                        kind: ErrorKind::InvalidLid
                    },
                ]
            );
            assert_eq!(paths[0].as_ref().unwrap().guid, 0x20, "first header wins");
            assert_eq!(
                paths[1],
                Err(LineError {
                    line: 5,
                    kind: ErrorKind::UnknownDlid
                })
            );
            assert_eq!(
                paths[2],
                Err(LineError {
                    line: 6,
                    kind: ErrorKind::InvalidLid
                })
            );
            assert_eq!(paths.len(), 3);
        }
        let mut t = [0u64; 4];
        let r = LocalPaths::new(
            input.as_bytes(),
            LocalPort { guid: 0x22, lid: 4 },
            LidTable::Direct(&mut t),
            |_| {},
        );
        assert_eq!(r.err(), Some(PortNotFound));
    }

    #[test]
    fn small_tables_report_full() {
        let input = "Switch 0x20, base LID 2\nSwitch 0x21, base LID 9\nSwitch 0x22, base LID 3\n";
        let mut errors = Vec::new();
        let mut t = [0u64; 4];
        let port = LocalPort { guid: 0x22, lid: 3 };
        assert!(
            LocalPaths::new(input.as_bytes(), port, LidTable::Direct(&mut t), |e| errors
                .push(e))
            .is_ok()
        );
        assert_eq!(
            errors,
            [LineError {
                line: 2,
                kind: ErrorKind::TableFull
            }]
        );
        errors.clear();
        let mut s = [LidEntry::default(); 2];
        assert!(
            LocalPaths::new(input.as_bytes(), port, LidTable::Sorted(&mut s), |e| errors
                .push(e))
            .is_ok()
        );
        assert_eq!(
            errors,
            [LineError {
                line: 3,
                kind: ErrorKind::TableFull
            }]
        );
    }
}
