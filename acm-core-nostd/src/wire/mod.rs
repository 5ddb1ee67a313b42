//! Wire formats: zero-copy views and small parsed forms of everything acmrs puts on a wire.
//!
//! Every format follows the same two-layer shape (modelled on smoltcp's `src/wire`):
//!
//! * a **view** `Foo<T: AsRef<[u8]>>` over raw bytes: `new_unchecked`, `new_checked`,
//!   `check_len` (after which no accessor panics), `into_inner`, one getter per field and, for
//!   `T: AsMut<[u8]>`, one setter per field. Byte ranges live in a private `mod field`.
//! * a **`Repr`**, the parsed form: `parse(&view) -> Result<Repr>`, `emit(&mut view)`,
//!   `buffer_len()`. Parsers are total: truncated or garbage input gives an [`Error`], never a
//!   panic.
//!
//! Enums keep unknown wire values (`Unknown(raw)`), so parse → emit is lossless for them.
//!
//! | module | what | size |
//! |---|---|---|
//! | [`mad`] | IB MAD common header, status word, RMPP header, method/class constants | 24 + 12 B |
//! | [`sa`] | SA MAD: common + RMPP + SA header (SM_Key, AttributeOffset, ComponentMask) + 200 B data | 256 B |
//! | [`path_record`] | SA PathRecord (`struct ibv_path_record`), its component mask and a query builder | 64 B |
//! | [`mcmember`] | SA MCMemberRecord (`struct umad_sa_mcmember_record`), its mask, the ACM MGID | 56 B |
//! | [`acm_mad`] | ibacm's class 0x2C resolve MAD (`struct acm_mad` + `acm_resolve_rec`) | 256 B |
//! | [`client`] | ibacm client protocol (`struct acm_msg`, `acm_hdr`, `acm_ep_addr_data`), response builders, PERF_QUERY | ≤ 592 B |
//! | [`rate`] | `ibv_rate` / `ibv_mtu` tables, link width × speed → rate (HDR, NDR, XDR aware) | |
//! | [`inform`] | SA InformInfo (event subscription) and Notice (what a Report carries) | 36 / 80 B |
//! | [`gid`] | 16-byte GID with subnet prefix / interface id | 16 B |
//!
//! Byte order: all IB formats are big-endian (network order). The ibacm client protocol is the
//! exception: RESOLVE messages are in the *host* byte order of the machine running ibacm (see
//! [`client`], whose accessors say which order they use).
//!
//! Typical use, building a PathRecord GET into a 256-byte buffer:
//!
//! ```
//! use acm_core_nostd::wire::{path_record::{PathRecordQuery, PathRecord}, sa};
//! let mut buf = [0u8; sa::MAD_LEN];
//! let query = PathRecordQuery::new().dlid(4).slid(1).sl(0).reversible(true).num_path(1);
//! sa::SaRepr::path_record_get(7, query.mask().bits())
//!     .emit(&mut sa::SaPacket::new_unchecked(&mut buf[..]));
//! let mut pkt = sa::SaPacket::new_checked(&mut buf[..]).unwrap();
//! query.record().emit(&mut PathRecord::new_unchecked(pkt.data_mut()));
//! assert_eq!(buf[2], 2); // SA class version
//! ```

use core::fmt;

pub mod acm_mad;
pub mod client;
pub mod gid;
pub mod inform;
pub mod mad;
pub mod mcmember;
pub mod path_record;
pub mod rate;
pub mod sa;

/// The one error type of the wire module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// The buffer is shorter than the format (or a length field inside it) requires.
    Truncated,
    /// The bytes are there but a field has a value the format does not allow.
    Malformed,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => f.write_str("buffer too short for the wire format"),
            Error::Malformed => f.write_str("field value not allowed by the wire format"),
        }
    }
}

#[cfg(any(test, feature = "std"))]
impl std::error::Error for Error {}

/// Result type of the wire module.
pub type Result<T> = core::result::Result<T, Error>;

/// A byte range of a field inside a format.
pub(crate) type Field = core::ops::Range<usize>;

/// Reads a big-endian `u16` at `at`. Callers have checked the length.
#[inline]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Reads a big-endian `u32` at `at`. Callers have checked the length.
#[inline]
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads a big-endian `u64` at `at`. Callers have checked the length.
#[inline]
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Writes a big-endian `u16` at `at`.
#[inline]
pub(crate) fn put_be16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Writes a big-endian `u32` at `at`.
#[inline]
pub(crate) fn put_be32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// Writes a big-endian `u64` at `at`.
#[inline]
pub(crate) fn put_be64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// Copies a fixed-size array out of `b` at `at`. Callers have checked the length.
#[inline]
pub(crate) fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// Declares a zero-copy view `$name<T: AsRef<[u8]>>` over a buffer that must hold at least
/// `len` bytes, with the parts every view shares: `new_unchecked`, `new_checked`, `check_len`,
/// `into_inner`, and the private byte accessors `b()` (read) and `bm()` (write, for
/// `T: AsMut<[u8]>`). The field accessors stay in the module's own `impl` blocks. The doc
/// comments before `fn new_checked;` and `fn check_len;` become those methods' docs.
macro_rules! view {
    (
        $( #[$struct_attr:meta] )*
        pub struct $name:ident(len = $len:expr);
        $( #[$checked_attr:meta] )*
        fn new_checked;
        $( #[$check_len_attr:meta] )*
        fn check_len;
    ) => {
        $( #[$struct_attr] )*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps a buffer without checking its length.
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }
            $( #[$checked_attr] )*
            pub fn new_checked(buffer: T) -> $crate::wire::Result<Self> {
                let view = Self::new_unchecked(buffer);
                view.check_len()?;
                Ok(view)
            }
            $( #[$check_len_attr] )*
            pub fn check_len(&self) -> $crate::wire::Result<()> {
                if self.buffer.as_ref().len() < $len {
                    Err($crate::wire::Error::Truncated)
                } else {
                    Ok(())
                }
            }
            /// Returns the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
            #[inline]
            fn b(&self) -> &[u8] {
                self.buffer.as_ref()
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            #[inline]
            fn bm(&mut self) -> &mut [u8] {
                self.buffer.as_mut()
            }
        }
    };
}
pub(crate) use view;

/// Declares a `u8`/`u16` wire enum that keeps unknown values (`Unknown(raw)`).
macro_rules! enum_with_unknown {
    (
        $( #[$enum_attr:meta] )*
        pub enum $name:ident($ty:ty) {
            $(
              $( #[$variant_attr:meta] )*
              $variant:ident = $value:expr
            ),+ $(,)?
        }
    ) => {
        $( #[$enum_attr] )*
        #[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone, Copy, Hash)]
        pub enum $name {
            $(
              $( #[$variant_attr] )*
              $variant
            ),*,
            /// A value this crate has no name for, kept as it was on the wire.
            Unknown($ty)
        }

        impl ::core::convert::From<$ty> for $name {
            fn from(value: $ty) -> Self {
                match value {
                    $( $value => $name::$variant ),*,
                    other => $name::Unknown(other)
                }
            }
        }

        impl ::core::convert::From<$name> for $ty {
            fn from(value: $name) -> Self {
                match value {
                    $( $name::$variant => $value ),*,
                    $name::Unknown(other) => other
                }
            }
        }
    }
}
pub(crate) use enum_with_unknown;

/// The 2-bit selector shared by the MTU, Rate and PacketLifeTime fields of SA records.
#[derive(Debug, PartialEq, Eq, Clone, Copy, Hash)]
pub enum Selector {
    /// 0: greater than the value.
    GreaterThan,
    /// 1: less than the value.
    LessThan,
    /// 2: exactly the value.
    Exactly,
    /// 3: largest available (MTU, rate) / smallest available (packet lifetime).
    Best,
}

impl Selector {
    /// Decodes the upper two bits of a selector+value byte.
    pub const fn from_byte(byte: u8) -> Selector {
        match byte >> 6 {
            0 => Selector::GreaterThan,
            1 => Selector::LessThan,
            2 => Selector::Exactly,
            _ => Selector::Best,
        }
    }

    /// The 2-bit wire value.
    pub const fn bits(self) -> u8 {
        match self {
            Selector::GreaterThan => 0,
            Selector::LessThan => 1,
            Selector::Exactly => 2,
            Selector::Best => 3,
        }
    }

    /// Packs this selector with a 6-bit value (like `umad_sa_set_rate_mtu_or_life`).
    pub const fn pack(self, value: u8) -> u8 {
        (self.bits() << 6) | (value & 0x3f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_packing() {
        assert_eq!(Selector::Exactly.pack(4), 0x84);
        assert_eq!(Selector::from_byte(0x84), Selector::Exactly);
        assert_eq!(Selector::from_byte(0xff), Selector::Best);
        assert_eq!(Selector::Best.pack(0xff), 0xff);
        assert_eq!(Selector::GreaterThan.pack(0x40), 0x00);
        for b in 0..4u8 {
            assert_eq!(Selector::from_byte(b << 6).bits(), b);
        }
    }

    #[test]
    fn big_endian_helpers() {
        let mut b = [0u8; 8];
        put_be16(&mut b, 0, 0x1234);
        put_be32(&mut b, 2, 0x5678_9abc);
        assert_eq!(b[..6], [0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc]);
        assert_eq!(be16(&b, 0), 0x1234);
        assert_eq!(be32(&b, 2), 0x5678_9abc);
        put_be64(&mut b, 0, 0x0102_0304_0506_0708);
        assert_eq!(be64(&b, 0), 0x0102_0304_0506_0708);
        assert_eq!(array::<3>(&b, 5), [6, 7, 8]);
    }
}
