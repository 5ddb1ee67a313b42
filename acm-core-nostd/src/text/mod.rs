//! Line-by-line parsers for the text files ibacm and its providers read.
//!
//! Every parser here works over a byte slice the caller owns (read from a file, or a flash
//! region in firmware), never allocates and never panics. A bad line is reported as a
//! [`LineError`] carrying its 1-based line number and an [`ErrorKind`], and then skipped, so one
//! typo never hides the rest of a file.
//!
//! Public API:
//!
//! * [`opts`]: `ibacm_opts.cfg`. [`opts::OptionLines`] yields raw `name value` pairs;
//!   [`opts::ProviderOptions`] is the typed set of every ibacmp option, the core options a
//!   provider cares about (`timeout`, `retries`, `sa_depth`, `log_level`) and our own `acmrs_*`
//!   options, each with its default. [`opts::ProviderOptions::load`] parses a whole file and
//!   reports counts in [`opts::LoadStats`].
//! * [`hosts`]: `ibacm_hosts.data` (`addr_preload acm_hosts`): [`hosts::HostLines`] yields
//!   [`hosts::HostEntry`] (`address` as IPv4, IPv6 or a name, plus a GID).
//! * [`addr_cfg`]: the core's `ibacm_addr.cfg` (`address device port pkey|default`).
//! * [`dump_pr`]: OpenSM's `dump_pr` full path-record dump (`route_preload opensm_full_v1`):
//!   [`dump_pr::DumpPrLines`] yields events; [`dump_pr::LocalPaths`] runs ibacmp's two passes
//!   over caller-provided LID→GUID storage.
//! * [`addr`]: allocation-free IPv4/IPv6/GID text parsers, for everyone who parses addresses.
//! * [`Lines`]: the shared line splitter (LF or CRLF, 1-based numbers).

pub mod addr;
pub mod addr_cfg;
pub mod dump_pr;
pub mod hosts;
pub mod opts;

use core::fmt;

/// Why a line was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The line is longer than the consumer's line buffer (see the parser's docs).
    LineTooLong,
    /// The line is not valid UTF-8 where text was required.
    NotUtf8,
    /// A known option name had no value token.
    MissingValue,
    /// A required field is missing.
    MissingField,
    /// A number did not parse (garbage, empty, or wrong base).
    InvalidNumber,
    /// A number parsed but is outside the accepted range.
    OutOfRange,
    /// A keyword value is not one of the accepted words.
    InvalidKeyword,
    /// A path value does not fit the fixed-capacity string.
    PathTooLong,
    /// A host name is longer than the ACM address allows.
    NameTooLong,
    /// An address is neither IPv4, IPv6 nor a valid name.
    InvalidAddress,
    /// A GID is not valid IPv6 text.
    InvalidGid,
    /// A GUID is not valid hex.
    InvalidGuid,
    /// A LID is missing, malformed or outside the unicast range.
    InvalidLid,
    /// A node header repeats a base LID seen earlier (the first one wins).
    DuplicateLid,
    /// A path line names a DLID that no node header declared.
    UnknownDlid,
    /// A path line is not inside the section of a valid node header.
    PathOutsideSection,
    /// A caller-provided table is too small for the input.
    TableFull,
    /// A line does not have the expected shape.
    Malformed,
}

impl ErrorKind {
    /// A short English description, suitable for logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::LineTooLong => "line too long",
            ErrorKind::NotUtf8 => "not valid UTF-8",
            ErrorKind::MissingValue => "option has no value",
            ErrorKind::MissingField => "missing field",
            ErrorKind::InvalidNumber => "invalid number",
            ErrorKind::OutOfRange => "number out of range",
            ErrorKind::InvalidKeyword => "unrecognized keyword value",
            ErrorKind::PathTooLong => "path too long",
            ErrorKind::NameTooLong => "host name too long",
            ErrorKind::InvalidAddress => "invalid address",
            ErrorKind::InvalidGid => "invalid GID",
            ErrorKind::InvalidGuid => "invalid GUID",
            ErrorKind::InvalidLid => "invalid LID",
            ErrorKind::DuplicateLid => "duplicate base LID",
            ErrorKind::UnknownDlid => "DLID not declared by any node header",
            ErrorKind::PathOutsideSection => "path line outside a valid node header's section",
            ErrorKind::TableFull => "caller-provided table is full",
            ErrorKind::Malformed => "malformed line",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rejected line: its 1-based number and the reason. The parser skips the line and goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LineError {
    /// 1-based line number in the input.
    pub line: u32,
    /// Why the line was rejected.
    pub kind: ErrorKind,
}

impl LineError {
    /// A short English reason (same as `self.kind.as_str()`).
    pub const fn reason(&self) -> &'static str {
        self.kind.as_str()
    }
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.kind)
    }
}

#[cfg(any(test, feature = "std"))]
impl std::error::Error for LineError {}

/// One line of input, without its terminator (`\n` or `\r\n`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawLine<'a> {
    /// 1-based line number (saturates at `u32::MAX`).
    pub number: u32,
    /// The line's bytes.
    pub bytes: &'a [u8],
}

/// Splits input into lines on `\n`, stripping one trailing `\r`. A final line without a
/// terminator is still yielded; an empty input yields nothing.
#[derive(Debug, Clone)]
pub struct Lines<'a> {
    rest: &'a [u8],
    number: u32,
    done: bool,
}

impl<'a> Lines<'a> {
    /// Lines of `input`.
    pub const fn new(input: &'a [u8]) -> Self {
        Lines {
            rest: input,
            number: 0,
            done: input.is_empty(),
        }
    }
}

impl<'a> Iterator for Lines<'a> {
    type Item = RawLine<'a>;

    fn next(&mut self) -> Option<RawLine<'a>> {
        if self.done {
            return None;
        }
        let (mut line, rest) = match self.rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&self.rest[..i], &self.rest[i + 1..]),
            None => {
                self.done = true;
                (self.rest, &self.rest[self.rest.len()..])
            }
        };
        if rest.is_empty() {
            self.done = true;
        }
        self.rest = rest;
        if let [head @ .., b'\r'] = line {
            line = head;
        }
        self.number = self.number.saturating_add(1);
        Some(RawLine {
            number: self.number,
            bytes: line,
        })
    }
}

/// C `isspace` in the "C" locale: the separators `sscanf("%s")` stops at.
pub(crate) const fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// Whitespace-separated tokens of one line, like repeated `sscanf("%s")`.
#[derive(Debug, Clone)]
pub(crate) struct Tokens<'a> {
    rest: &'a [u8],
}

impl<'a> Tokens<'a> {
    pub(crate) const fn new(line: &'a [u8]) -> Self {
        Tokens { rest: line }
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| !is_space(b))?;
        let tail = &self.rest[start..];
        let len = tail.iter().position(|&b| is_space(b)).unwrap_or(tail.len());
        self.rest = &tail[len..];
        Some(&tail[..len])
    }
}

/// Parses a decimal integer with an optional sign, strictly (no garbage, no empty digits).
pub(crate) fn parse_i64(token: &[u8]) -> Option<i64> {
    let (neg, digits) = match token {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, token),
    };
    let magnitude = parse_u64_radix(digits, 10)?;
    if neg {
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// Parses an unsigned integer like `strtoul(…, 0)` but strictly: `0x`/`0X` prefix for hex,
/// otherwise decimal (a leading 0 does not mean octal: OpenSM and ibacm files never use octal).
pub(crate) fn parse_u64_auto(token: &[u8]) -> Option<u64> {
    match token {
        [b'0', b'x' | b'X', hex @ ..] => parse_u64_radix(hex, 16),
        _ => parse_u64_radix(token, 10),
    }
}

/// Parses digits in `radix` (10 or 16) without sign or prefix; `None` on empty, garbage or
/// overflow.
pub(crate) fn parse_u64_radix(digits: &[u8], radix: u32) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    for &b in digits {
        let d = (b as char).to_digit(radix)?;
        value = value
            .checked_mul(u64::from(radix))?
            .checked_add(u64::from(d))?;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_lf_crlf_and_unterminated() {
        let v: Vec<_> = Lines::new(b"a\r\nb\n\nc").collect();
        assert_eq!(v.len(), 4);
        assert_eq!((v[0].number, v[0].bytes), (1, &b"a"[..]));
        assert_eq!((v[1].number, v[1].bytes), (2, &b"b"[..]));
        assert_eq!((v[2].number, v[2].bytes), (3, &b""[..]));
        assert_eq!((v[3].number, v[3].bytes), (4, &b"c"[..]));
        assert_eq!(Lines::new(b"").count(), 0);
        assert_eq!(Lines::new(b"x\n").count(), 1);
        assert_eq!(Lines::new(b"\n").count(), 1);
    }

    #[test]
    fn tokens_like_sscanf() {
        let v: Vec<_> = Tokens::new(b"  name\t value extra \x0b").collect();
        assert_eq!(v, [&b"name"[..], b"value", b"extra"]);
        assert_eq!(Tokens::new(b" \t ").next(), None);
    }

    #[test]
    fn integers_are_strict() {
        assert_eq!(parse_i64(b"-1"), Some(-1));
        assert_eq!(parse_i64(b"+42"), Some(42));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"12x"), None);
        assert_eq!(parse_i64(b"-"), None);
        assert_eq!(parse_i64(b""), None);
        assert_eq!(parse_u64_auto(b"0x1F"), Some(31));
        assert_eq!(parse_u64_auto(b"010"), Some(10));
        assert_eq!(parse_u64_auto(b"0x"), None);
        assert_eq!(parse_u64_auto(b"18446744073709551616"), None);
    }
}
