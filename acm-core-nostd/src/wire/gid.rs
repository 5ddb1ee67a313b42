//! The 16-byte InfiniBand GID (`union ibv_gid`), in network byte order.
//!
//! Text forms (IPv6 notation) live in `crate::text`; this module only splits the bytes.

use core::fmt;

/// Length of a GID in bytes.
pub const GID_LEN: usize = 16;

/// A Global Identifier: 64-bit subnet prefix followed by a 64-bit interface id, big-endian.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Gid(pub [u8; GID_LEN]);

impl Gid {
    /// The all-zero GID (what `ib_any_gid` tests for).
    pub const ZERO: Gid = Gid([0; GID_LEN]);

    /// Builds a GID from its subnet prefix and interface id (both host values).
    pub const fn from_parts(subnet_prefix: u64, interface_id: u64) -> Gid {
        let p = subnet_prefix.to_be_bytes();
        let i = interface_id.to_be_bytes();
        Gid([
            p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], i[0], i[1], i[2], i[3], i[4], i[5],
            i[6], i[7],
        ])
    }

    /// Reads a GID from the first 16 bytes of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Option<Gid> {
        let b: &[u8; GID_LEN] = bytes.get(..GID_LEN)?.try_into().ok()?;
        Some(Gid(*b))
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; GID_LEN] {
        &self.0
    }

    /// The upper 64 bits (subnet prefix, e.g. 0xfe80000000000000).
    pub const fn subnet_prefix(&self) -> u64 {
        let b = &self.0;
        u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }

    /// The lower 64 bits (interface id; the port GUID for GID index 0).
    pub const fn interface_id(&self) -> u64 {
        let b = &self.0;
        u64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]])
    }

    /// True for the all-zero GID.
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }

    /// True for a multicast GID (first byte 0xFF).
    pub const fn is_multicast(&self) -> bool {
        self.0[0] == 0xff
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Full, uncompressed IPv6-style form: `fe80:0000:0000:0000:0002:c903:0000:1234`.
impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for i in 0..8 {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", self.0[2 * i], self.0[2 * i + 1])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_roundtrip() {
        let g = Gid::from_parts(0xfe80_0000_0000_0000, 0x0000_0000_0010_0004);
        assert_eq!(
            g.0,
            [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0x04]
        );
        assert_eq!(g.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert_eq!(g.interface_id(), 0x10_0004);
        assert!(!g.is_zero());
        assert!(!g.is_multicast());
        assert!(Gid::ZERO.is_zero());
        assert_eq!(g.to_string(), "fe80:0000:0000:0000:0000:0000:0010:0004");
    }

    #[test]
    fn from_bytes_is_total() {
        assert_eq!(Gid::from_bytes(&[1; 15]), None);
        assert_eq!(Gid::from_bytes(&[0xff; 17]).unwrap().0, [0xff; 16]);
        assert!(Gid::from_bytes(&[0xff; 16]).unwrap().is_multicast());
    }
}
