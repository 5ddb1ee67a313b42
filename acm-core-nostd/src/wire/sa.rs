//! The SA MAD (`struct umad_sa_packet`, 256 bytes): MAD common header, RMPP header, the SA
//! header and 200 bytes of attribute data.
//!
//! ```text
//!  0 common header (24)   24 RMPP header (12)
//! 36 SM_Key (8)  44 AttributeOffset (16, in 8-byte words)  46 reserved (16)
//! 48 ComponentMask (64)   56 data (200)
//! ```

use super::mad::{
    Header, HeaderRepr, MadStatus, Method, MgmtClass, RmppHeader, RmppRepr, BASE_VERSION,
    HEADER_LEN, RMPP_LEN,
};
use super::{be16, be64, enum_with_unknown, put_be16, put_be64, view, Error, Result};

/// Length of an SA MAD: one MAD.
pub use super::mad::MAD_LEN;
/// Offset of the attribute data.
pub const DATA_OFFSET: usize = 56;
/// Length of the attribute data (`UMAD_LEN_SA_DATA`).
pub const DATA_LEN: usize = 200;
/// `UMAD_SA_CLASS_VERSION`.
pub const CLASS_VERSION: u8 = 2;

/// The first record of an SA MAD's data (a PathRecord GET's or GetResp's 64-byte record).
pub fn first_record(mad: &[u8; crate::wire::mad::MAD_LEN]) -> &[u8; 64] {
    let r = &mad[DATA_OFFSET..DATA_OFFSET + 64];
    r.try_into().unwrap_or(&[0; 64])
}

/// [`first_record`], mutable.
pub fn first_record_mut(mad: &mut [u8; crate::wire::mad::MAD_LEN]) -> &mut [u8; 64] {
    let (_, rest) = mad.split_at_mut(DATA_OFFSET);
    let (r, _) = rest.split_at_mut(64);
    r.try_into()
        .unwrap_or_else(|_| unreachable!("a MAD holds a record at 56"))
}

/// SA attribute ids.
pub mod attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// NodeRecord.
    pub const NODE_RECORD: u16 = 0x0011;
    /// InformInfo (event subscription).
    pub const INFORM_INFO: u16 = 0x0003;
    /// Notice (what a Report carries).
    pub const NOTICE: u16 = 0x0002;
    /// PortInfoRecord.
    pub const PORT_INFO_RECORD: u16 = 0x0012;
    /// ServiceRecord.
    pub const SERVICE_RECORD: u16 = 0x0031;
    /// PathRecord.
    pub const PATH_RECORD: u16 = 0x0035;
    /// MCMemberRecord.
    pub const MCMEMBER_RECORD: u16 = 0x0038;
    /// MultiPathRecord.
    pub const MULTI_PATH_RECORD: u16 = 0x003a;
}

enum_with_unknown! {
    /// The SA class-specific status byte (upper byte of the MAD status word).
    pub enum SaStatus(u8) {
        /// Success.
        Success = 0,
        /// ERR_NO_RESOURCES.
        NoResources = 1,
        /// ERR_REQ_INVALID.
        ReqInvalid = 2,
        /// ERR_NO_RECORDS.
        NoRecords = 3,
        /// ERR_TOO_MANY_RECORDS.
        TooManyRecords = 4,
        /// ERR_REQ_INVALID_GID.
        ReqInvalidGid = 5,
        /// ERR_REQ_INSUFFICIENT_COMPONENTS.
        ReqInsufficientComponents = 6,
        /// ERR_REQ_DENIED.
        ReqDenied = 7,
        /// Priority suggested (QoS).
        PrioritySuggested = 8,
    }
}

mod field {
    use crate::wire::Field;
    pub const SM_KEY: Field = 36..44;
    pub const ATTR_OFFSET: Field = 44..46;
    pub const RESERVED: Field = 46..48;
    pub const COMP_MASK: Field = 48..56;
    pub const DATA: Field = 56..256;
}

view! {
    /// A view of a whole 256-byte SA MAD. The header accessors (`header` to `comp_mask`) read
    /// only the first [`DATA_OFFSET`] bytes, so they also serve an unchecked view of the
    /// headers alone (a reassembled table's first segment, as [`crate::rmpp`] keeps it).
    pub struct SaPacket(len = MAD_LEN);
    /// Wraps a buffer and checks it holds a whole SA MAD.
    fn new_checked;
    /// Checks the length (≥ 256); after success no accessor panics.
    fn check_len;
}

impl<T: AsRef<[u8]>> SaPacket<T> {
    /// The common header.
    pub fn header(&self) -> Header<&[u8]> {
        Header::new_unchecked(&self.b()[..HEADER_LEN])
    }
    /// The RMPP header.
    pub fn rmpp(&self) -> RmppHeader<&[u8]> {
        RmppHeader::new_unchecked(&self.b()[HEADER_LEN..HEADER_LEN + RMPP_LEN])
    }
    /// SM_Key.
    pub fn sm_key(&self) -> u64 {
        be64(self.b(), field::SM_KEY.start)
    }
    /// AttributeOffset (record size in 8-byte words, in GetTable responses).
    pub fn attr_offset(&self) -> u16 {
        be16(self.b(), field::ATTR_OFFSET.start)
    }
    /// The bytes of one record of a GetTable response: 8 × AttributeOffset.
    pub fn record_len(&self) -> usize {
        usize::from(self.attr_offset()) * 8
    }
    /// The reserved word after AttributeOffset.
    pub fn reserved(&self) -> u16 {
        be16(self.b(), field::RESERVED.start)
    }
    /// ComponentMask (host value).
    pub fn comp_mask(&self) -> u64 {
        be64(self.b(), field::COMP_MASK.start)
    }
    /// The 200 bytes of attribute data.
    pub fn data(&self) -> &[u8] {
        &self.b()[field::DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SaPacket<T> {
    /// The common header, mutable.
    pub fn header_mut(&mut self) -> Header<&mut [u8]> {
        Header::new_unchecked(&mut self.bm()[..HEADER_LEN])
    }
    /// The RMPP header, mutable.
    pub fn rmpp_mut(&mut self) -> RmppHeader<&mut [u8]> {
        RmppHeader::new_unchecked(&mut self.bm()[HEADER_LEN..HEADER_LEN + RMPP_LEN])
    }
    /// Sets SM_Key.
    pub fn set_sm_key(&mut self, v: u64) {
        put_be64(self.bm(), field::SM_KEY.start, v)
    }
    /// Sets AttributeOffset.
    pub fn set_attr_offset(&mut self, v: u16) {
        put_be16(self.bm(), field::ATTR_OFFSET.start, v)
    }
    /// Sets the reserved word.
    pub fn set_reserved(&mut self, v: u16) {
        put_be16(self.bm(), field::RESERVED.start, v)
    }
    /// Sets ComponentMask.
    pub fn set_comp_mask(&mut self, v: u64) {
        put_be64(self.bm(), field::COMP_MASK.start, v)
    }
    /// The attribute data, mutable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.bm()[field::DATA]
    }
}

/// The parsed headers of an SA MAD (the 200 data bytes are left to the record modules).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SaRepr {
    /// Common header.
    pub header: HeaderRepr,
    /// RMPP header.
    pub rmpp: RmppRepr,
    /// SM_Key.
    pub sm_key: u64,
    /// AttributeOffset.
    pub attr_offset: u16,
    /// ComponentMask.
    pub comp_mask: u64,
}

impl SaRepr {
    /// A request header: base version 1, class SA, class version 2, status 0, no RMPP.
    pub const fn request(method: Method, attr_id: u16, tid: u64, comp_mask: u64) -> SaRepr {
        SaRepr {
            header: HeaderRepr {
                base_version: BASE_VERSION,
                mgmt_class: MgmtClass::SubnAdm,
                class_version: CLASS_VERSION,
                method,
                status: MadStatus::SUCCESS,
                class_specific: 0,
                tid,
                attr_id,
                attr_mod: 0,
            },
            rmpp: RmppRepr::NONE,
            sm_key: 0,
            attr_offset: 0,
            comp_mask,
        }
    }
    /// A PathRecord GET (what ibacm's SA route mode sends). Keep `tid` below 2^32.
    pub const fn path_record_get(tid: u64, comp_mask: u64) -> SaRepr {
        Self::request(Method::Get, attr::PATH_RECORD, tid, comp_mask)
    }
    /// An MCMemberRecord SET (a join).
    pub const fn mcmember_set(tid: u64, comp_mask: u64) -> SaRepr {
        Self::request(Method::Set, attr::MCMEMBER_RECORD, tid, comp_mask)
    }
    /// The SA class status of the header.
    pub fn sa_status(&self) -> SaStatus {
        SaStatus::from(self.header.status.class_status())
    }
    /// Parses the headers of an SA MAD. Requires 256 bytes and MgmtClass SA.
    pub fn parse<T: AsRef<[u8]>>(p: &SaPacket<T>) -> Result<SaRepr> {
        p.check_len()?;
        let header = HeaderRepr::parse(&p.header())?;
        if header.mgmt_class != MgmtClass::SubnAdm {
            return Err(Error::Malformed);
        }
        Ok(SaRepr {
            header,
            rmpp: RmppRepr::parse(&p.rmpp())?,
            sm_key: p.sm_key(),
            attr_offset: p.attr_offset(),
            comp_mask: p.comp_mask(),
        })
    }
    /// Bytes needed by [`emit`](Self::emit) (the whole MAD).
    pub const fn buffer_len(&self) -> usize {
        MAD_LEN
    }
    /// Writes the headers (reserved words 0); the data area is left as it is.
    /// The buffer must be ≥ 256 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut SaPacket<T>) {
        self.header.emit(&mut p.header_mut());
        self.rmpp.emit(&mut p.rmpp_mut());
        p.set_sm_key(self.sm_key);
        p.set_attr_offset(self.attr_offset);
        p.set_reserved(0);
        p.set_comp_mask(self.comp_mask);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_offset_from_the_headers_alone() {
        let mut head = [0u8; DATA_OFFSET];
        head[44..46].copy_from_slice(&8u16.to_be_bytes());
        let v = SaPacket::new_unchecked(&head[..]);
        assert_eq!((v.attr_offset(), v.record_len()), (8, 64));
    }

    fn get_bytes() -> [u8; 256] {
        let mut b = [0u8; 256];
        b[..24].copy_from_slice(&[
            1, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0x35, 0, 0, 0, 0, 0, 0,
        ]);
        b[48..56].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0x18, 0x30]);
        b[56] = 0xaa;
        b
    }

    #[test]
    fn path_record_get_is_byte_exact() {
        let mut b = [0u8; 256];
        b[56] = 0xaa;
        SaRepr::path_record_get(9, 0x1830).emit(&mut SaPacket::new_unchecked(&mut b[..]));
        assert_eq!(b, get_bytes());
        let p = SaPacket::new_checked(&b[..]).unwrap();
        let r = SaRepr::parse(&p).unwrap();
        assert_eq!(r, SaRepr::path_record_get(9, 0x1830));
        assert_eq!(p.data()[0], 0xaa);
        assert_eq!(p.data().len(), 200);
        assert_eq!(r.sa_status(), SaStatus::Success);
    }

    #[test]
    fn sa_header_fields() {
        let mut b = get_bytes();
        b[4] = 0x03; // NO_RECORDS
        b[36..44].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        b[44..46].copy_from_slice(&[0, 8]);
        let p = SaPacket::new_checked(&b[..]).unwrap();
        assert_eq!(p.sm_key(), 0x0102_0304_0506_0708);
        assert_eq!(p.attr_offset(), 8);
        let r = SaRepr::parse(&p).unwrap();
        assert_eq!(r.sa_status(), SaStatus::NoRecords);
        let mut out = [0u8; 256];
        r.emit(&mut SaPacket::new_unchecked(&mut out[..]));
        assert_eq!(out[..56], b[..56]);
    }

    #[test]
    fn rejects_short_and_foreign() {
        let b = get_bytes();
        for n in [0, 1, 24, 55, 56, 255] {
            assert_eq!(SaPacket::new_checked(&b[..n]).err(), Some(Error::Truncated));
        }
        let mut c = b;
        c[1] = 0x2c;
        assert_eq!(
            SaRepr::parse(&SaPacket::new_unchecked(&c[..])),
            Err(Error::Malformed)
        );
    }
}
