//! ibacm's address-resolution MAD (management class 0x2C, `struct acm_mad` with an
//! `acm_resolve_rec` payload, from rdma-core's `ibacm/include/acm_mad.h`), big-endian.
//!
//! This is not a standard GMP: the header is 16 bytes (no AttributeID), sent on ibacm's own UD
//! QP with Q_Key 0x80010000.
//!
//! ```text
//! header:  0 BaseVersion 1 MgmtClass(0x2C) 2 ClassVersion 3 Method 4 Status 6 Control 8 TID
//! data(240): 0 dest_type 1 dest_length 2 src_type 3 src_length 4 gid_cnt 5 resp_resources
//!            6 init_depth 7 reserved 8 dest[64] 72 src[64] 136 gid[i] (16 each)
//! ```
//!
//! `acm_resolve_rec` declares 10 GIDs but only 6 fit in the 256-byte MAD, so [`AcmResolveRepr`]
//! rejects `gid_cnt > 6` on parse and on emit.

use super::gid::Gid;
use super::mad::{Method, MgmtClass, MAD_LEN};
use super::{array, be16, be64, enum_with_unknown, put_be16, put_be64, view, Error, Result};

/// Length of the ACM MAD header.
pub const HEADER_LEN: usize = 16;
/// `ACM_MGMT_CLASS`.
pub const ACM_MGMT_CLASS: u8 = 0x2c;
/// `control` bit: ACK (`ACM_CTRL_ACK`, host value).
pub const CTRL_ACK: u16 = 0x8000;
/// `control` value: RESOLVE (`ACM_CTRL_RESOLVE`, host value).
pub const CTRL_RESOLVE: u16 = 0x0001;
/// Address bytes in `dest` / `src` (`ACM_MAX_ADDRESS`).
pub use super::client::MAX_ADDRESS as ADDRESS_LEN;
/// GIDs that fit in the 240-byte payload.
pub const MAX_GIDS: usize = 6;

enum_with_unknown! {
    /// `ACM_ADDRESS_*` (types of `dest_type` / `src_type`).
    pub enum AddressType(u8) {
        /// Invalid / unused.
        Invalid = 0,
        /// Host name.
        Name = 1,
        /// IPv4 address.
        Ip = 2,
        /// IPv6 address.
        Ip6 = 3,
        /// GID.
        Gid = 4,
        /// LID.
        Lid = 5,
    }
}

impl AddressType {
    /// Whether the type names an address (NAME, IP, IP6, GID or LID): not `Invalid`, not a
    /// value this crate has no name for.
    pub fn is_address(self) -> bool {
        !matches!(self, AddressType::Invalid | AddressType::Unknown(_))
    }
}

mod field {
    use crate::wire::Field;
    // The header is the first 16 bytes of a MAD common header; `control` sits where a MAD
    // has ClassSpecific.
    pub use crate::wire::mad::field::{
        BASE_VERSION, CLASS_SPECIFIC as CONTROL, CLASS_VERSION, METHOD, MGMT_CLASS, STATUS, TID,
    };
    // Resolve record, relative to the start of the MAD.
    pub const DEST_TYPE: usize = 16;
    pub const DEST_LENGTH: usize = 17;
    pub const SRC_TYPE: usize = 18;
    pub const SRC_LENGTH: usize = 19;
    pub const GID_CNT: usize = 20;
    pub const RESP_RESOURCES: usize = 21;
    pub const INIT_DEPTH: usize = 22;
    pub const RESERVED: usize = 23;
    pub const DEST: Field = 24..88;
    pub const SRC: Field = 88..152;
    pub const GID: usize = 152;
}

view! {
    /// A view of a 256-byte ACM resolve MAD.
    pub struct AcmMad(len = MAD_LEN);
    /// Wraps a buffer and checks that it holds a whole MAD.
    fn new_checked;
    /// Checks the length (256 bytes); after success no accessor panics.
    fn check_len;
}

impl<T: AsRef<[u8]>> AcmMad<T> {
    /// BaseVersion (1).
    pub fn base_version(&self) -> u8 {
        self.b()[field::BASE_VERSION]
    }
    /// MgmtClass (0x2C).
    pub fn mgmt_class(&self) -> u8 {
        self.b()[field::MGMT_CLASS]
    }
    /// ClassVersion (1).
    pub fn class_version(&self) -> u8 {
        self.b()[field::CLASS_VERSION]
    }
    /// Method (GET 0x01 for requests, GET_RESP 0x81 for responses).
    pub fn method(&self) -> Method {
        Method::from(self.b()[field::METHOD])
    }
    /// Status word (class status in the upper byte).
    pub fn status(&self) -> u16 {
        be16(self.b(), field::STATUS.start)
    }
    /// Control word (`CTRL_RESOLVE`, `CTRL_ACK`).
    pub fn control(&self) -> u16 {
        be16(self.b(), field::CONTROL.start)
    }
    /// TransactionID.
    pub fn tid(&self) -> u64 {
        be64(self.b(), field::TID.start)
    }
    /// Destination address type.
    pub fn dest_type(&self) -> AddressType {
        AddressType::from(self.b()[field::DEST_TYPE])
    }
    /// Destination address length.
    pub fn dest_length(&self) -> u8 {
        self.b()[field::DEST_LENGTH]
    }
    /// Source address type.
    pub fn src_type(&self) -> AddressType {
        AddressType::from(self.b()[field::SRC_TYPE])
    }
    /// Source address length.
    pub fn src_length(&self) -> u8 {
        self.b()[field::SRC_LENGTH]
    }
    /// Number of GIDs (valid only up to [`MAX_GIDS`]).
    pub fn gid_cnt(&self) -> u8 {
        self.b()[field::GID_CNT]
    }
    /// resp_resources.
    pub fn resp_resources(&self) -> u8 {
        self.b()[field::RESP_RESOURCES]
    }
    /// init_depth.
    pub fn init_depth(&self) -> u8 {
        self.b()[field::INIT_DEPTH]
    }
    /// The reserved byte of the record.
    pub fn reserved(&self) -> u8 {
        self.b()[field::RESERVED]
    }
    /// Destination address (64 bytes).
    pub fn dest(&self) -> &[u8] {
        &self.b()[field::DEST]
    }
    /// Source address (64 bytes).
    pub fn src(&self) -> &[u8] {
        &self.b()[field::SRC]
    }
    /// GID `i`, if `i < 6` (independent of `gid_cnt`).
    pub fn gid(&self, i: usize) -> Option<Gid> {
        if i >= MAX_GIDS {
            return None;
        }
        Gid::from_bytes(self.b().get(field::GID + 16 * i..)?)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AcmMad<T> {
    /// Sets BaseVersion.
    pub fn set_base_version(&mut self, v: u8) {
        self.bm()[field::BASE_VERSION] = v
    }
    /// Sets MgmtClass.
    pub fn set_mgmt_class(&mut self, v: u8) {
        self.bm()[field::MGMT_CLASS] = v
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
    pub fn set_status(&mut self, v: u16) {
        put_be16(self.bm(), field::STATUS.start, v)
    }
    /// Sets the control word.
    pub fn set_control(&mut self, v: u16) {
        put_be16(self.bm(), field::CONTROL.start, v)
    }
    /// Sets the TID.
    pub fn set_tid(&mut self, v: u64) {
        put_be64(self.bm(), field::TID.start, v)
    }
    /// Sets destination type and length.
    pub fn set_dest_type_length(&mut self, t: AddressType, len: u8) {
        self.bm()[field::DEST_TYPE] = t.into();
        self.bm()[field::DEST_LENGTH] = len;
    }
    /// Sets source type and length.
    pub fn set_src_type_length(&mut self, t: AddressType, len: u8) {
        self.bm()[field::SRC_TYPE] = t.into();
        self.bm()[field::SRC_LENGTH] = len;
    }
    /// Sets gid_cnt (raw; see [`AcmResolveRepr::emit`] for the checked path).
    pub fn set_gid_cnt(&mut self, v: u8) {
        self.bm()[field::GID_CNT] = v
    }
    /// Sets resp_resources, init_depth and reserved.
    pub fn set_resources(&mut self, resp_resources: u8, init_depth: u8, reserved: u8) {
        self.bm()[field::RESP_RESOURCES] = resp_resources;
        self.bm()[field::INIT_DEPTH] = init_depth;
        self.bm()[field::RESERVED] = reserved;
    }
    /// Destination address, mutable.
    pub fn dest_mut(&mut self) -> &mut [u8] {
        &mut self.bm()[field::DEST]
    }
    /// Source address, mutable.
    pub fn src_mut(&mut self) -> &mut [u8] {
        &mut self.bm()[field::SRC]
    }
    /// Sets GID `i` (< 6); `false` if out of range.
    pub fn set_gid(&mut self, i: usize, g: Gid) -> bool {
        if i >= MAX_GIDS {
            return false;
        }
        let at = field::GID + 16 * i;
        match self.bm().get_mut(at..at + 16) {
            Some(s) => {
                s.copy_from_slice(&g.0);
                true
            }
            None => false,
        }
    }
}

/// A parsed ACM resolve MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AcmResolveRepr {
    /// BaseVersion.
    pub base_version: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// Method.
    pub method: Method,
    /// Status word.
    pub status: u16,
    /// Control word.
    pub control: u16,
    /// TransactionID.
    pub tid: u64,
    /// Destination address type.
    pub dest_type: AddressType,
    /// Destination address length.
    pub dest_length: u8,
    /// Source address type.
    pub src_type: AddressType,
    /// Source address length.
    pub src_length: u8,
    /// resp_resources.
    pub resp_resources: u8,
    /// init_depth.
    pub init_depth: u8,
    /// Destination address.
    pub dest: [u8; ADDRESS_LEN],
    /// Source address.
    pub src: [u8; ADDRESS_LEN],
    /// Number of valid GIDs (≤ 6).
    pub gid_cnt: u8,
    /// The GIDs; only `gids[..gid_cnt]` are meaningful.
    pub gids: [Gid; MAX_GIDS],
}

impl AcmResolveRepr {
    /// A resolve request as acmp sends it: base 1, class version 1, GET, control RESOLVE,
    /// both lengths 64, the requester's group MGIDs (at most 6).
    pub fn request(
        tid: u64,
        dest_type: AddressType,
        dest: [u8; ADDRESS_LEN],
        src_type: AddressType,
        src: [u8; ADDRESS_LEN],
        mgids: &[Gid],
    ) -> Result<AcmResolveRepr> {
        if mgids.len() > MAX_GIDS {
            return Err(Error::Malformed);
        }
        let mut gids = [Gid::ZERO; MAX_GIDS];
        gids[..mgids.len()].copy_from_slice(mgids);
        Ok(AcmResolveRepr {
            base_version: 1,
            class_version: 1,
            method: Method::Get,
            status: 0,
            control: CTRL_RESOLVE,
            tid,
            dest_type,
            dest_length: ADDRESS_LEN as u8,
            src_type,
            src_length: ADDRESS_LEN as u8,
            resp_resources: 0,
            init_depth: 0,
            dest,
            src,
            gid_cnt: mgids.len() as u8,
            gids,
        })
    }

    /// The response acmp sends: GET_RESP, same tid, zero addresses, one GID (the chosen MGID).
    pub fn response(tid: u64, mgid: Gid) -> AcmResolveRepr {
        let mut gids = [Gid::ZERO; MAX_GIDS];
        gids[0] = mgid;
        AcmResolveRepr {
            base_version: 1,
            class_version: 1,
            method: Method::GetResp,
            status: 0,
            control: CTRL_RESOLVE,
            tid,
            dest_type: AddressType::Invalid,
            dest_length: 0,
            src_type: AddressType::Invalid,
            src_length: 0,
            resp_resources: 0,
            init_depth: 0,
            dest: [0; ADDRESS_LEN],
            src: [0; ADDRESS_LEN],
            gid_cnt: 1,
            gids,
        }
    }

    /// The valid GIDs.
    pub fn gids(&self) -> &[Gid] {
        &self.gids[..(self.gid_cnt as usize).min(MAX_GIDS)]
    }

    /// Parses a MAD: class must be 0x2C, `gid_cnt ≤ 6`. GIDs past `gid_cnt` read as zero.
    pub fn parse<T: AsRef<[u8]>>(m: &AcmMad<T>) -> Result<AcmResolveRepr> {
        m.check_len()?;
        if m.mgmt_class() != ACM_MGMT_CLASS || m.gid_cnt() as usize > MAX_GIDS {
            return Err(Error::Malformed);
        }
        let mut gids = [Gid::ZERO; MAX_GIDS];
        for (i, g) in gids.iter_mut().enumerate().take(m.gid_cnt() as usize) {
            *g = m.gid(i).ok_or(Error::Truncated)?;
        }
        Ok(AcmResolveRepr {
            base_version: m.base_version(),
            class_version: m.class_version(),
            method: m.method(),
            status: m.status(),
            control: m.control(),
            tid: m.tid(),
            dest_type: m.dest_type(),
            dest_length: m.dest_length(),
            src_type: m.src_type(),
            src_length: m.src_length(),
            resp_resources: m.resp_resources(),
            init_depth: m.init_depth(),
            dest: array(m.b(), field::DEST.start),
            src: array(m.b(), field::SRC.start),
            gid_cnt: m.gid_cnt(),
            gids,
        })
    }

    /// Bytes needed by [`emit`](Self::emit).
    pub const fn buffer_len(&self) -> usize {
        MAD_LEN
    }

    /// Writes the whole MAD (unused GID slots and the tail are zeroed). Fails with `Malformed`
    /// if `gid_cnt > 6` and `Truncated` if the buffer is shorter than 256 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut AcmMad<T>) -> Result<()> {
        m.check_len()?;
        if self.gid_cnt as usize > MAX_GIDS {
            return Err(Error::Malformed);
        }
        m.set_base_version(self.base_version);
        m.set_mgmt_class(ACM_MGMT_CLASS);
        m.set_class_version(self.class_version);
        m.set_method(self.method);
        m.set_status(self.status);
        m.set_control(self.control);
        m.set_tid(self.tid);
        m.set_dest_type_length(self.dest_type, self.dest_length);
        m.set_src_type_length(self.src_type, self.src_length);
        m.set_gid_cnt(self.gid_cnt);
        m.set_resources(self.resp_resources, self.init_depth, 0);
        m.dest_mut().copy_from_slice(&self.dest);
        m.src_mut().copy_from_slice(&self.src);
        for i in 0..MAX_GIDS {
            let g = if i < self.gid_cnt as usize {
                self.gids[i]
            } else {
                Gid::ZERO
            };
            m.set_gid(i, g);
        }
        m.bm()[field::GID + 16 * MAX_GIDS..MAD_LEN].fill(0);
        Ok(())
    }
}

/// True if a 256-byte buffer looks like an ACM MAD (class byte 0x2C).
pub fn is_acm_mad(bytes: &[u8]) -> bool {
    bytes.len() >= MAD_LEN && bytes[field::MGMT_CLASS] == u8::from(MgmtClass::Acm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::mcmember::AcmMgid;

    fn request_bytes() -> [u8; 256] {
        let mut b = [0u8; 256];
        b[..16].copy_from_slice(&[1, 0x2c, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 42]);
        b[16..24].copy_from_slice(&[2, 64, 2, 64, 1, 0, 0, 0]);
        b[24..28].copy_from_slice(&[10, 0, 0, 6]);
        b[88..92].copy_from_slice(&[10, 0, 0, 4]);
        b[152..161].copy_from_slice(&[0xff, 0x15, 0x40, 0x01, 0xff, 0xff, 0, 3, 4]);
        b
    }

    fn addr(a: [u8; 4]) -> [u8; 64] {
        let mut x = [0u8; 64];
        x[..4].copy_from_slice(&a);
        x
    }

    fn mgid() -> Gid {
        AcmMgid {
            pkey: 0xffff,
            tos: 0,
            rate: 3,
            mtu: 4,
        }
        .to_gid()
    }

    #[test]
    fn request_is_byte_exact() {
        let r = AcmResolveRepr::request(
            42,
            AddressType::Ip,
            addr([10, 0, 0, 6]),
            AddressType::Ip,
            addr([10, 0, 0, 4]),
            &[mgid()],
        )
        .unwrap();
        let mut b = [0xeeu8; 256];
        r.emit(&mut AcmMad::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, request_bytes());
        let m = AcmMad::new_checked(&b[..]).unwrap();
        assert_eq!(m.control(), CTRL_RESOLVE);
        assert_eq!(m.method(), Method::Get);
        assert_eq!(m.gid(0), Some(mgid()));
        assert_eq!(m.gid(6), None);
        assert_eq!(AcmResolveRepr::parse(&m), Ok(r));
        assert!(is_acm_mad(&b));
    }

    #[test]
    fn response_roundtrip() {
        let r = AcmResolveRepr::response(42, mgid());
        let mut b = [0u8; 256];
        r.emit(&mut AcmMad::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b[3], 0x81);
        assert_eq!(b[20], 1);
        assert_eq!(AcmResolveRepr::parse(&AcmMad::new_unchecked(&b[..])), Ok(r));
        assert_eq!(r.gids(), &[mgid()]);
    }

    #[test]
    fn gid_cnt_limits() {
        let six = [mgid(); 6];
        let mut r = AcmResolveRepr::request(
            1,
            AddressType::Name,
            [0; 64],
            AddressType::Name,
            [0; 64],
            &six,
        )
        .unwrap();
        let mut b = [0u8; 256];
        r.emit(&mut AcmMad::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b[232..248], mgid().0);
        assert_eq!(b[248..], [0; 8]);
        assert_eq!(
            AcmResolveRepr::parse(&AcmMad::new_unchecked(&b[..]))
                .unwrap()
                .gid_cnt,
            6
        );
        b[20] = 7;
        assert_eq!(
            AcmResolveRepr::parse(&AcmMad::new_unchecked(&b[..])),
            Err(Error::Malformed)
        );
        b[20] = 10;
        assert_eq!(
            AcmResolveRepr::parse(&AcmMad::new_unchecked(&b[..])),
            Err(Error::Malformed)
        );
        r.gid_cnt = 7;
        assert_eq!(
            r.emit(&mut AcmMad::new_unchecked(&mut b[..])),
            Err(Error::Malformed)
        );
        assert!(AcmResolveRepr::request(
            1,
            AddressType::Name,
            [0; 64],
            AddressType::Name,
            [0; 64],
            &[mgid(); 7]
        )
        .is_err());
    }

    #[test]
    fn rejects_short_and_foreign() {
        let b = request_bytes();
        for n in 0..256 {
            assert_eq!(
                AcmResolveRepr::parse(&AcmMad::new_unchecked(&b[..n])),
                Err(Error::Truncated)
            );
        }
        let mut c = b;
        c[1] = 3;
        assert_eq!(
            AcmResolveRepr::parse(&AcmMad::new_unchecked(&c[..])),
            Err(Error::Malformed)
        );
        assert!(!is_acm_mad(&c));
        let mut short = [0u8; 255];
        assert_eq!(
            AcmResolveRepr::response(1, mgid()).emit(&mut AcmMad::new_unchecked(&mut short[..])),
            Err(Error::Truncated)
        );
    }
}
