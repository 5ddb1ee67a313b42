//! The InfiniBand MAD common header (24 bytes, `struct umad_hdr`) and the RMPP header
//! (12 bytes, `struct umad_rmpp_hdr`), big-endian.
//!
//! ```text
//!  0 BaseVersion  1 MgmtClass  2 ClassVersion  3 R:1 Method:7
//!  4 Status (16)  6 ClassSpecific (16)  8 TransactionID (64)
//! 16 AttributeID (16)  18 reserved (16)  20 AttributeModifier (32)
//! RMPP: 0 RMPPVersion 1 RMPPType 2 RRespTime:5 RMPPFlags:3 3 RMPPStatus 4 SegmentNumber
//!       8 PayloadLength/NewWindowLast
//! ```

use super::{be16, be32, be64, enum_with_unknown, put_be16, put_be32, put_be64, view, Result};

/// Length of the common MAD header.
pub const HEADER_LEN: usize = 24;
/// Length of the RMPP header.
pub const RMPP_LEN: usize = 12;
/// Length of a whole MAD (`UMAD` payload).
pub const MAD_LEN: usize = 256;
/// `UMAD_BASE_VERSION`.
pub const BASE_VERSION: u8 = 1;
/// The response bit of `Method`.
pub const METHOD_RESP: u8 = 0x80;
/// The umad status (`struct ib_user_mad.status`) a query that ran out of tries completes
/// with (ETIMEDOUT).
pub const TIMED_OUT: u32 = 110;

enum_with_unknown! {
    /// Management class.
    pub enum MgmtClass(u8) {
        /// Subnet management, LID routed.
        SubnLidRouted = 0x01,
        /// Subnet management, directed route.
        SubnDirectedRoute = 0x81,
        /// Subnet administration (SA).
        SubnAdm = 0x03,
        /// Performance management.
        PerfMgmt = 0x04,
        /// Baseboard management.
        Bm = 0x05,
        /// Device management.
        DeviceMgmt = 0x06,
        /// Communication management.
        Cm = 0x07,
        /// SNMP tunnelling.
        Snmp = 0x08,
        /// Congestion management.
        CongMgmt = 0x21,
        /// ibacm's address resolution class (application range).
        Acm = 0x2c,
    }
}

enum_with_unknown! {
    /// Method (the whole byte, response bit included).
    pub enum Method(u8) {
        /// Get.
        Get = 0x01,
        /// Set.
        Set = 0x02,
        /// Send.
        Send = 0x03,
        /// Trap.
        Trap = 0x05,
        /// Report.
        Report = 0x06,
        /// TrapRepress.
        TrapRepress = 0x07,
        /// SA GetTable.
        GetTable = 0x12,
        /// SA GetTraceTable.
        GetTraceTable = 0x13,
        /// SA GetMulti.
        GetMulti = 0x14,
        /// SA Delete.
        Delete = 0x15,
        /// GetResp.
        GetResp = 0x81,
        /// ReportResp.
        ReportResp = 0x86,
        /// SA GetTableResp.
        GetTableResp = 0x92,
        /// SA GetMultiResp.
        GetMultiResp = 0x94,
        /// SA DeleteResp.
        DeleteResp = 0x95,
    }
}

impl Method {
    /// True if the response bit (0x80) is set.
    pub fn is_response(self) -> bool {
        u8::from(self) & METHOD_RESP != 0
    }
}

enum_with_unknown! {
    /// The "invalid field" code, bits 2-4 of the status word.
    pub enum InvalidField(u8) {
        /// 0: no invalid field.
        None = 0,
        /// 1: bad base or class version.
        BadVersion = 1,
        /// 2: method not supported.
        MethodUnsupported = 2,
        /// 3: method/attribute combination not supported.
        MethodAttrUnsupported = 3,
        /// 7: invalid attribute or attribute modifier value.
        InvalidAttrValue = 7,
    }
}

/// The 16-bit MAD status word: common bits (0-4) and the class-specific byte (bits 8-15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MadStatus(pub u16);

impl MadStatus {
    /// Success.
    pub const SUCCESS: MadStatus = MadStatus(0);
    /// Busy bit.
    pub const BUSY: u16 = 0x0001;
    /// Redirect bit.
    pub const REDIRECT: u16 = 0x0002;
    /// Mask of the invalid-field code.
    pub const INVALID_FIELD_MASK: u16 = 0x001c;
    /// Mask of the class-specific byte.
    pub const CLASS_MASK: u16 = 0xff00;

    /// Busy: the request was dropped, try again.
    pub const fn busy(self) -> bool {
        self.0 & Self::BUSY != 0
    }
    /// Redirect required.
    pub const fn redirect(self) -> bool {
        self.0 & Self::REDIRECT != 0
    }
    /// The invalid-field code (bits 2-4).
    pub fn invalid_field(self) -> InvalidField {
        InvalidField::from(((self.0 & Self::INVALID_FIELD_MASK) >> 2) as u8)
    }
    /// The class-specific status byte (for SA: [`crate::wire::sa::SaStatus`]).
    pub const fn class_status(self) -> u8 {
        (self.0 >> 8) as u8
    }
    /// True if neither common nor class bits report anything.
    pub const fn is_success(self) -> bool {
        self.0 == 0
    }
    /// Builds a status word from a class-specific byte and common bits.
    pub const fn from_parts(class_status: u8, common: u16) -> MadStatus {
        MadStatus(((class_status as u16) << 8) | (common & 0xff))
    }
}

/// Byte ranges of the MAD common header (also the first 16 bytes of [`acm_mad`](super::acm_mad)).
pub(super) mod field {
    use crate::wire::Field;
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Field = 4..6;
    pub const CLASS_SPECIFIC: Field = 6..8;
    pub const TID: Field = 8..16;
    pub const ATTR_ID: Field = 16..18;
    pub const RESERVED: Field = 18..20;
    pub const ATTR_MOD: Field = 20..24;
}

view! {
    /// A view of a MAD common header (the first 24 bytes of any MAD).
    pub struct Header(len = HEADER_LEN);
    /// Wraps a buffer and checks it holds a header.
    fn new_checked;
    /// Checks the length; after success no accessor panics.
    fn check_len;
}

impl<T: AsRef<[u8]>> Header<T> {
    /// BaseVersion (1).
    pub fn base_version(&self) -> u8 {
        self.b()[field::BASE_VERSION]
    }
    /// MgmtClass.
    pub fn mgmt_class(&self) -> MgmtClass {
        MgmtClass::from(self.b()[field::MGMT_CLASS])
    }
    /// ClassVersion.
    pub fn class_version(&self) -> u8 {
        self.b()[field::CLASS_VERSION]
    }
    /// Method (with the response bit).
    pub fn method(&self) -> Method {
        Method::from(self.b()[field::METHOD])
    }
    /// Status word.
    pub fn status(&self) -> MadStatus {
        MadStatus(be16(self.b(), field::STATUS.start))
    }
    /// ClassSpecific word.
    pub fn class_specific(&self) -> u16 {
        be16(self.b(), field::CLASS_SPECIFIC.start)
    }
    /// TransactionID (64 bits).
    pub fn tid(&self) -> u64 {
        be64(self.b(), field::TID.start)
    }
    /// Low 32 bits of the TID: the part a requester owns (the kernel/simulator rewrite the top).
    pub fn tid_low32(&self) -> u32 {
        self.tid() as u32
    }
    /// AttributeID.
    pub fn attr_id(&self) -> u16 {
        be16(self.b(), field::ATTR_ID.start)
    }
    /// The reserved word after AttributeID.
    pub fn reserved(&self) -> u16 {
        be16(self.b(), field::RESERVED.start)
    }
    /// AttributeModifier.
    pub fn attr_mod(&self) -> u32 {
        be32(self.b(), field::ATTR_MOD.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets BaseVersion.
    pub fn set_base_version(&mut self, v: u8) {
        self.bm()[field::BASE_VERSION] = v
    }
    /// Sets MgmtClass.
    pub fn set_mgmt_class(&mut self, v: MgmtClass) {
        self.bm()[field::MGMT_CLASS] = v.into()
    }
    /// Sets ClassVersion.
    pub fn set_class_version(&mut self, v: u8) {
        self.bm()[field::CLASS_VERSION] = v
    }
    /// Sets Method.
    pub fn set_method(&mut self, v: Method) {
        self.bm()[field::METHOD] = v.into()
    }
    /// Sets the status word.
    pub fn set_status(&mut self, v: MadStatus) {
        put_be16(self.bm(), field::STATUS.start, v.0)
    }
    /// Sets ClassSpecific.
    pub fn set_class_specific(&mut self, v: u16) {
        put_be16(self.bm(), field::CLASS_SPECIFIC.start, v)
    }
    /// Sets the TID.
    pub fn set_tid(&mut self, v: u64) {
        put_be64(self.bm(), field::TID.start, v)
    }
    /// Sets the TID to a 32-bit value with the upper half zero (what ibacm's matcher needs).
    pub fn set_tid_low32(&mut self, v: u32) {
        self.set_tid(u64::from(v))
    }
    /// Sets AttributeID.
    pub fn set_attr_id(&mut self, v: u16) {
        put_be16(self.bm(), field::ATTR_ID.start, v)
    }
    /// Sets the reserved word.
    pub fn set_reserved(&mut self, v: u16) {
        put_be16(self.bm(), field::RESERVED.start, v)
    }
    /// Sets AttributeModifier.
    pub fn set_attr_mod(&mut self, v: u32) {
        put_be32(self.bm(), field::ATTR_MOD.start, v)
    }
}

/// A parsed MAD common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeaderRepr {
    /// BaseVersion.
    pub base_version: u8,
    /// MgmtClass.
    pub mgmt_class: MgmtClass,
    /// ClassVersion.
    pub class_version: u8,
    /// Method.
    pub method: Method,
    /// Status.
    pub status: MadStatus,
    /// ClassSpecific.
    pub class_specific: u16,
    /// TransactionID.
    pub tid: u64,
    /// AttributeID.
    pub attr_id: u16,
    /// AttributeModifier.
    pub attr_mod: u32,
}

impl HeaderRepr {
    /// Parses a header (the reserved word is ignored).
    pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Result<HeaderRepr> {
        h.check_len()?;
        Ok(HeaderRepr {
            base_version: h.base_version(),
            mgmt_class: h.mgmt_class(),
            class_version: h.class_version(),
            method: h.method(),
            status: h.status(),
            class_specific: h.class_specific(),
            tid: h.tid(),
            attr_id: h.attr_id(),
            attr_mod: h.attr_mod(),
        })
    }
    /// Bytes needed by [`emit`](Self::emit).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header (reserved = 0). The buffer must be ≥ 24 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Header<T>) {
        h.set_base_version(self.base_version);
        h.set_mgmt_class(self.mgmt_class);
        h.set_class_version(self.class_version);
        h.set_method(self.method);
        h.set_status(self.status);
        h.set_class_specific(self.class_specific);
        h.set_tid(self.tid);
        h.set_attr_id(self.attr_id);
        h.set_reserved(0);
        h.set_attr_mod(self.attr_mod);
    }
}

/// `UMAD_RMPP_VERSION`.
pub const RMPP_VERSION: u8 = 1;
/// RMPPFlags: Active.
pub const RMPP_FLAG_ACTIVE: u8 = 1;

enum_with_unknown! {
    /// RMPPType.
    pub enum RmppType(u8) {
        /// Not an RMPP packet.
        None = 0,
        /// DATA.
        Data = 1,
        /// ACK.
        Ack = 2,
        /// STOP.
        Stop = 3,
        /// ABORT.
        Abort = 4,
    }
}

mod rfield {
    use crate::wire::Field;
    pub const VERSION: usize = 0;
    pub const TYPE: usize = 1;
    pub const RTIME_FLAGS: usize = 2;
    pub const STATUS: usize = 3;
    pub const SEG_NUM: Field = 4..8;
    pub const PAYLEN: Field = 8..12;
}

view! {
    /// A view of an RMPP header (12 bytes; in a MAD it sits at offset 24).
    pub struct RmppHeader(len = RMPP_LEN);
    /// Wraps a buffer and checks it holds an RMPP header.
    fn new_checked;
    /// Checks the length; after success no accessor panics.
    fn check_len;
}

impl<T: AsRef<[u8]>> RmppHeader<T> {
    /// RMPPVersion.
    pub fn version(&self) -> u8 {
        self.b()[rfield::VERSION]
    }
    /// RMPPType.
    pub fn rmpp_type(&self) -> RmppType {
        RmppType::from(self.b()[rfield::TYPE])
    }
    /// RRespTime (upper 5 bits of byte 2).
    pub fn resp_time(&self) -> u8 {
        self.b()[rfield::RTIME_FLAGS] >> 3
    }
    /// RMPPFlags (lower 3 bits of byte 2: Active, First, Last).
    pub fn flags(&self) -> u8 {
        self.b()[rfield::RTIME_FLAGS] & 0x7
    }
    /// RMPPStatus.
    pub fn status(&self) -> u8 {
        self.b()[rfield::STATUS]
    }
    /// SegmentNumber.
    pub fn seg_num(&self) -> u32 {
        be32(self.b(), rfield::SEG_NUM.start)
    }
    /// PayloadLength / NewWindowLast.
    pub fn paylen_newwin(&self) -> u32 {
        be32(self.b(), rfield::PAYLEN.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RmppHeader<T> {
    /// Sets RMPPVersion.
    pub fn set_version(&mut self, v: u8) {
        self.bm()[rfield::VERSION] = v
    }
    /// Sets RMPPType.
    pub fn set_rmpp_type(&mut self, v: RmppType) {
        self.bm()[rfield::TYPE] = v.into()
    }
    /// Sets RRespTime (5 bits) and RMPPFlags (3 bits).
    pub fn set_resp_time_flags(&mut self, resp_time: u8, flags: u8) {
        self.bm()[rfield::RTIME_FLAGS] = (resp_time << 3) | (flags & 0x7)
    }
    /// Sets RMPPStatus.
    pub fn set_status(&mut self, v: u8) {
        self.bm()[rfield::STATUS] = v
    }
    /// Sets SegmentNumber.
    pub fn set_seg_num(&mut self, v: u32) {
        put_be32(self.bm(), rfield::SEG_NUM.start, v)
    }
    /// Sets PayloadLength / NewWindowLast.
    pub fn set_paylen_newwin(&mut self, v: u32) {
        put_be32(self.bm(), rfield::PAYLEN.start, v)
    }
}

/// A parsed RMPP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RmppRepr {
    /// RMPPVersion.
    pub version: u8,
    /// RMPPType.
    pub rmpp_type: RmppType,
    /// RRespTime (5 bits).
    pub resp_time: u8,
    /// RMPPFlags (3 bits).
    pub flags: u8,
    /// RMPPStatus.
    pub status: u8,
    /// SegmentNumber.
    pub seg_num: u32,
    /// PayloadLength / NewWindowLast.
    pub paylen_newwin: u32,
}

impl RmppRepr {
    /// An all-zero RMPP header (what single-MAD SA requests carry).
    pub const NONE: RmppRepr = RmppRepr {
        version: 0,
        rmpp_type: RmppType::None,
        resp_time: 0,
        flags: 0,
        status: 0,
        seg_num: 0,
        paylen_newwin: 0,
    };
    /// Parses an RMPP header.
    pub fn parse<T: AsRef<[u8]>>(h: &RmppHeader<T>) -> Result<RmppRepr> {
        h.check_len()?;
        Ok(RmppRepr {
            version: h.version(),
            rmpp_type: h.rmpp_type(),
            resp_time: h.resp_time(),
            flags: h.flags(),
            status: h.status(),
            seg_num: h.seg_num(),
            paylen_newwin: h.paylen_newwin(),
        })
    }
    /// Bytes needed by [`emit`](Self::emit).
    pub const fn buffer_len(&self) -> usize {
        RMPP_LEN
    }
    /// Writes the header. The buffer must be ≥ 12 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut RmppHeader<T>) {
        h.set_version(self.version);
        h.set_rmpp_type(self.rmpp_type);
        h.set_resp_time_flags(self.resp_time, self.flags);
        h.set_status(self.status);
        h.set_seg_num(self.seg_num);
        h.set_paylen_newwin(self.paylen_newwin);
    }
}

/// RMPPFlags: First (the first DATA segment of a transfer, SegmentNumber 1).
pub const RMPP_FLAG_FIRST: u8 = 2;
/// RMPPFlags: Last (the last DATA segment of a transfer).
pub const RMPP_FLAG_LAST: u8 = 4;
/// RRespTime meaning "no response time given" (`IB_RMPP_NO_RESP_TIME`).
pub const RMPP_NO_RESP_TIME: u8 = 0x1f;

enum_with_unknown! {
    /// RMPPStatus (IBA 13.6.2.1; `IB_RMPP_STATUS_*`): 0 in DATA and ACK, the reason in STOP
    /// (1) and ABORT (118-127).
    pub enum RmppStatus(u8) {
        /// Normal.
        Success = 0,
        /// STOP: resources exhausted (the receiver cannot take the transfer).
        ResourcesExhausted = 1,
        /// ABORT: total time too long (T2L).
        TotalTimeTooLong = 118,
        /// ABORT: inconsistent Last and PayloadLength (BAD_LEN).
        InconsistentLastAndPayloadLength = 119,
        /// ABORT: inconsistent First and SegmentNumber (BAD_SEG).
        InconsistentFirstAndSegmentNumber = 120,
        /// ABORT: bad RMPPType (BADT).
        BadRmppType = 121,
        /// ABORT: NewWindowLast too small (W2S).
        NewWindowLastTooSmall = 122,
        /// ABORT: SegmentNumber too big (S2B).
        SegmentNumberTooBig = 123,
        /// ABORT: illegal status (a DATA or ACK with a non-zero RMPPStatus).
        IllegalStatus = 124,
        /// ABORT: unsupported RMPPVersion (UNV).
        UnsupportedVersion = 125,
        /// ABORT: too many retries (TMR).
        TooManyRetries = 126,
        /// ABORT: unspecified.
        Unspecified = 127,
    }
}

impl RmppRepr {
    /// An ACK (RMPPFlags Active only): segments up to `seg_num` received in order, the sender
    /// may send up to `new_window_last`.
    pub const fn ack(resp_time: u8, seg_num: u32, new_window_last: u32) -> RmppRepr {
        RmppRepr {
            version: RMPP_VERSION,
            rmpp_type: RmppType::Ack,
            resp_time,
            flags: RMPP_FLAG_ACTIVE,
            status: 0,
            seg_num,
            paylen_newwin: new_window_last,
        }
    }
    /// A STOP or ABORT (`rmpp_type`) with `status`; SegmentNumber and the length word are 0.
    pub fn nak(resp_time: u8, rmpp_type: RmppType, status: RmppStatus) -> RmppRepr {
        RmppRepr {
            version: RMPP_VERSION,
            rmpp_type,
            resp_time,
            flags: RMPP_FLAG_ACTIVE,
            status: status.into(),
            seg_num: 0,
            paylen_newwin: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    static HDR: [u8; 36] = [
        0x01, 0x03, 0x02, 0x81, // base, SA, v2, GetResp
        0x03, 0x1c, 0xab, 0xcd, // status: class 3 + invalid attr value; class specific
        0x00, 0x02, 0x00, 0x05, 0x12, 0x34, 0x56, 0x78, // tid
        0x00, 0x35, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, // PathRecord, attr_mod 7
        0x01, 0x01, 0x2c, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x40, // RMPP
    ];

    #[test]
    fn deconstruct_and_roundtrip() {
        let h = Header::new_checked(&HDR[..]).unwrap();
        assert_eq!(h.base_version(), 1);
        assert_eq!(h.mgmt_class(), MgmtClass::SubnAdm);
        assert_eq!(h.class_version(), 2);
        assert_eq!(h.method(), Method::GetResp);
        assert!(h.method().is_response());
        assert!(!Method::Set.is_response());
        let s = h.status();
        assert_eq!(s.class_status(), 3);
        assert_eq!(s.invalid_field(), InvalidField::InvalidAttrValue);
        assert!(!s.busy() && !s.redirect() && !s.is_success());
        assert_eq!(h.class_specific(), 0xabcd);
        assert_eq!(h.tid(), 0x0002_0005_1234_5678);
        assert_eq!(h.tid_low32(), 0x1234_5678);
        assert_eq!(h.attr_id(), 0x0035);
        assert_eq!(h.attr_mod(), 7);
        let r = HeaderRepr::parse(&h).unwrap();
        let mut out = [0xffu8; 24];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out[..], HDR[..24]);

        let rm = RmppHeader::new_checked(&HDR[24..]).unwrap();
        assert_eq!(rm.version(), 1);
        assert_eq!(rm.rmpp_type(), RmppType::Data);
        assert_eq!(rm.resp_time(), 5);
        assert_eq!(rm.flags(), 4);
        assert_eq!(rm.seg_num(), 1);
        assert_eq!(rm.paylen_newwin(), 0x40);
        let rr = RmppRepr::parse(&rm).unwrap();
        let mut out = [0u8; 12];
        rr.emit(&mut RmppHeader::new_unchecked(&mut out[..]));
        assert_eq!(out[..], HDR[24..]);
    }

    #[test]
    fn status_bits() {
        assert!(MadStatus(1).busy());
        assert!(MadStatus(2).redirect());
        assert_eq!(MadStatus(1 << 2).invalid_field(), InvalidField::BadVersion);
        assert_eq!(
            MadStatus(2 << 2).invalid_field(),
            InvalidField::MethodUnsupported
        );
        assert_eq!(
            MadStatus(3 << 2).invalid_field(),
            InvalidField::MethodAttrUnsupported
        );
        assert_eq!(MadStatus(5 << 2).invalid_field(), InvalidField::Unknown(5));
        assert_eq!(MadStatus::from_parts(4, 0x1c).0, 0x041c);
        assert!(MadStatus::SUCCESS.is_success());
    }

    #[test]
    fn unknown_values_survive() {
        assert_eq!(MgmtClass::from(0x77), MgmtClass::Unknown(0x77));
        assert_eq!(u8::from(MgmtClass::Unknown(0x77)), 0x77);
        assert_eq!(u8::from(Method::from(0x42)), 0x42);
        assert_eq!(MgmtClass::from(0x2c), MgmtClass::Acm);
    }

    #[test]
    fn truncated() {
        for n in 0..24 {
            assert_eq!(Header::new_checked(&HDR[..n]).err(), Some(Error::Truncated));
        }
        for n in 0..12 {
            assert_eq!(
                RmppHeader::new_checked(&HDR[24..24 + n]).err(),
                Some(Error::Truncated)
            );
        }
    }

    #[test]
    fn rmpp_ack_and_nak_bytes() {
        let mut out = [0u8; 12];
        RmppRepr::ack(RMPP_NO_RESP_TIME, 3, 0x0102_0304)
            .emit(&mut RmppHeader::new_unchecked(&mut out[..]));
        assert_eq!(out, [1, 2, 0xf9, 0, 0, 0, 0, 3, 1, 2, 3, 4]);
        RmppRepr::nak(0, RmppType::Stop, RmppStatus::ResourcesExhausted)
            .emit(&mut RmppHeader::new_unchecked(&mut out[..]));
        assert_eq!(out, [1, 3, 0x01, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(u8::from(RmppStatus::TotalTimeTooLong), 118);
        assert_eq!(u8::from(RmppStatus::Unspecified), 127);
        assert_eq!(RmppStatus::from(2), RmppStatus::Unknown(2));
    }
}
