//! SA InformInfo (attribute 0x0003, 36 bytes) and Notice (attribute 0x0002, 80 bytes): the
//! event subscription a subscriber SETs, and what the SA REPORTs to it (IBA 13.4.8.2–3), in
//! network byte order.
//!
//! ```text
//! InformInfo  0 GID (16)  16 LIDRangeBegin (2)  18 LIDRangeEnd (2)  20 reserved (2)
//!            22 IsGeneric  23 Subscribe  24 Type (2)  26 TrapNumber (2)
//!            28 QPN:24 reserved:3 RespTimeValue:5  32 reserved  33 ProducerType (3)
//! Notice      0 IsGeneric:1 Type:7  1 ProducerType (3)  4 TrapNumber (2)  6 IssuerLID (2)
//!             8 NoticeToggle:1 NoticeCount:15  10 DataDetails (54)  64 IssuerGID (16)
//! ```
//!
//! Both are small fixed records, so each has just a `Repr` with `parse_bytes` (total: short
//! input is [`Error::Truncated`]) and `emit` into a buffer of at least its length.

use super::{be16, put_be16, Error, Result};

/// Length of an InformInfo.
pub const INFORM_INFO_LEN: usize = 36;
/// Length of a Notice.
pub const NOTICE_LEN: usize = 80;
/// Trap 64: a GID entered service (a port became active).
pub const TRAP_GID_IN_SERVICE: u16 = 64;
/// Trap 65: a GID left service.
pub const TRAP_GID_OUT_OF_SERVICE: u16 = 65;
/// "All" in InformInfo's LIDRangeBegin, Type and TrapNumber fields.
pub const ALL_16: u16 = 0xffff;
/// "All" in InformInfo's ProducerType.
pub const ALL_PRODUCERS: u32 = 0x00ff_ffff;

/// A parsed InformInfo (generic form: TrapNumber, QPN, RespTimeValue, ProducerType).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InformInfoRepr {
    /// The GID the subscription is about (0 = use the LID range).
    pub gid: [u8; 16],
    /// First LID (0xFFFF = all).
    pub lid_begin: u16,
    /// Last LID.
    pub lid_end: u16,
    /// Generic trap (as opposed to vendor specific).
    pub is_generic: bool,
    /// Subscribe (true) or unsubscribe.
    pub subscribe: bool,
    /// Notice type (0xFFFF = all).
    pub type_: u16,
    /// Trap number (0xFFFF = all).
    pub trap: u16,
    /// The subscriber's QPN (24 bits).
    pub qpn: u32,
    /// Response time value (5 bits).
    pub resp_time: u8,
    /// Producer type (24 bits; 0xFFFFFF = all).
    pub producer: u32,
}

impl InformInfoRepr {
    /// A subscription (or, with `subscribe` false, its cancellation) to generic trap `trap`
    /// from anyone about anyone, reported to `qpn`.
    pub const fn generic(trap: u16, qpn: u32, subscribe: bool) -> InformInfoRepr {
        InformInfoRepr {
            gid: [0; 16],
            lid_begin: ALL_16,
            lid_end: 0,
            is_generic: true,
            subscribe,
            type_: ALL_16,
            trap,
            qpn: qpn & 0x00ff_ffff,
            resp_time: 18,
            producer: ALL_PRODUCERS,
        }
    }

    /// Parses the first 36 bytes of `b`.
    pub fn parse_bytes(b: &[u8]) -> Result<InformInfoRepr> {
        let b = b.get(..INFORM_INFO_LEN).ok_or(Error::Truncated)?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[..16]);
        let qw = u32::from_be_bytes([b[28], b[29], b[30], b[31]]);
        Ok(InformInfoRepr {
            gid,
            lid_begin: be16(b, 16),
            lid_end: be16(b, 18),
            is_generic: b[22] != 0,
            subscribe: b[23] != 0,
            type_: be16(b, 24),
            trap: be16(b, 26),
            qpn: qw >> 8,
            resp_time: (qw & 0x1f) as u8,
            producer: u32::from_be_bytes([0, b[33], b[34], b[35]]),
        })
    }

    /// Writes the record into the first 36 bytes of `b` (reserved fields zero).
    ///
    /// # Panics
    /// If `b` is shorter than [`INFORM_INFO_LEN`].
    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..INFORM_INFO_LEN];
        b.fill(0);
        b[..16].copy_from_slice(&self.gid);
        put_be16(b, 16, self.lid_begin);
        put_be16(b, 18, self.lid_end);
        b[22] = u8::from(self.is_generic);
        b[23] = u8::from(self.subscribe);
        put_be16(b, 24, self.type_);
        put_be16(b, 26, self.trap);
        let qw = ((self.qpn & 0x00ff_ffff) << 8) | u32::from(self.resp_time & 0x1f);
        b[28..32].copy_from_slice(&qw.to_be_bytes());
        b[33..36].copy_from_slice(&self.producer.to_be_bytes()[1..]);
    }
}

/// A parsed Notice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoticeRepr {
    /// Generic notice (else vendor specific).
    pub is_generic: bool,
    /// Notice type (7 bits).
    pub type_: u8,
    /// Producer type or vendor id (24 bits).
    pub producer: u32,
    /// Trap number (generic) or device id.
    pub trap: u16,
    /// LID of the issuer.
    pub issuer_lid: u16,
    /// NoticeToggle and NoticeCount as on the wire.
    pub toggle_count: u16,
    /// Trap-specific data.
    pub details: [u8; 54],
    /// GID of the issuer.
    pub issuer_gid: [u8; 16],
}

impl NoticeRepr {
    /// Parses the first 80 bytes of `b`.
    pub fn parse_bytes(b: &[u8]) -> Result<NoticeRepr> {
        let b = b.get(..NOTICE_LEN).ok_or(Error::Truncated)?;
        let mut details = [0u8; 54];
        details.copy_from_slice(&b[10..64]);
        let mut issuer_gid = [0u8; 16];
        issuer_gid.copy_from_slice(&b[64..80]);
        Ok(NoticeRepr {
            is_generic: b[0] & 0x80 != 0,
            type_: b[0] & 0x7f,
            producer: u32::from_be_bytes([0, b[1], b[2], b[3]]),
            trap: be16(b, 4),
            issuer_lid: be16(b, 6),
            toggle_count: be16(b, 8),
            details,
            issuer_gid,
        })
    }

    /// Writes the notice into the first 80 bytes of `b`.
    ///
    /// # Panics
    /// If `b` is shorter than [`NOTICE_LEN`].
    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..NOTICE_LEN];
        b[0] = (u8::from(self.is_generic) << 7) | (self.type_ & 0x7f);
        b[1..4].copy_from_slice(&self.producer.to_be_bytes()[1..]);
        put_be16(b, 4, self.trap);
        put_be16(b, 6, self.issuer_lid);
        put_be16(b, 8, self.toggle_count);
        b[10..64].copy_from_slice(&self.details);
        b[64..80].copy_from_slice(&self.issuer_gid);
    }

    /// The GID a generic trap 64–67 is about (DataDetails bytes 6..22), else `None`.
    pub fn subject_gid(&self) -> Option<[u8; 16]> {
        if !self.is_generic || !(64..=67).contains(&self.trap) {
            return None;
        }
        let mut g = [0u8; 16];
        g.copy_from_slice(&self.details[6..22]);
        Some(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inform_info_round_trips_and_places_fields() {
        let r = InformInfoRepr::generic(TRAP_GID_OUT_OF_SERVICE, 0x12_3456, true);
        let mut b = [0xaau8; INFORM_INFO_LEN];
        r.emit(&mut b);
        assert_eq!(&b[16..18], &[0xff, 0xff]);
        assert_eq!((b[22], b[23]), (1, 1));
        assert_eq!(&b[26..28], &[0, 65]);
        assert_eq!(&b[28..32], &[0x12, 0x34, 0x56, 18]);
        assert_eq!(&b[32..36], &[0, 0xff, 0xff, 0xff]);
        assert_eq!(InformInfoRepr::parse_bytes(&b), Ok(r));
        assert_eq!(InformInfoRepr::parse_bytes(&b[..35]), Err(Error::Truncated));
    }

    #[test]
    fn notice_round_trips_and_names_its_gid() {
        let mut details = [0u8; 54];
        details[6..22].copy_from_slice(&[7; 16]);
        let n = NoticeRepr {
            is_generic: true,
            type_: 4,
            producer: 4,
            trap: TRAP_GID_IN_SERVICE,
            issuer_lid: 1,
            toggle_count: 0x8001,
            details,
            issuer_gid: [9; 16],
        };
        let mut b = [0u8; NOTICE_LEN];
        n.emit(&mut b);
        assert_eq!(b[0], 0x84);
        assert_eq!(&b[16..32], &[7; 16]);
        let p = NoticeRepr::parse_bytes(&b).unwrap();
        assert_eq!(p, n);
        assert_eq!(p.subject_gid(), Some([7; 16]));
        let other = NoticeRepr { trap: 128, ..n };
        assert_eq!(other.subject_gid(), None);
        assert_eq!(NoticeRepr::parse_bytes(&b[..79]), Err(Error::Truncated));
    }
}
