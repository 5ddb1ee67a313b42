//! PathRecord field offsets, component mask, and the SA PathRecord GET MAD.
//!
//! TEMPORARY: `acm-core-nostd::wire::{mad, sa, path_record}` (owned by the wire engineer) is
//! the project's MAD codec. These few accessors exist so the provider works before that lands;
//! they are replaced by the wire module's views (one piece of code per idea).
//!
//! The 64-byte record is `struct ibv_path_record` (libibverbs `sa.h`), network byte order.

/// `service_id` (be64).
pub const SERVICE_ID: usize = 0;
/// `dgid` (16 bytes).
pub const DGID: usize = 8;
/// `sgid` (16 bytes).
pub const SGID: usize = 24;
/// `dlid` (be16).
pub const DLID: usize = 40;
/// `slid` (be16).
pub const SLID: usize = 42;
/// `flowlabel_hoplimit` (be32: flow label 27:8, hop limit 7:0).
pub const FLOW_HOP: usize = 44;
/// `tclass`.
pub const TCLASS: usize = 48;
/// `reversible_numpath` (reversible bit 7, numpath 6:0).
pub const REVERSIBLE_NUMPATH: usize = 49;
/// `pkey` (be16).
pub const PKEY: usize = 50;
/// `qosclass_sl` (be16: QoS class 15:4, SL 3:0).
pub const QOS_SL: usize = 52;
/// `mtu` (selector 7:6, MTU 5:0).
pub const MTU: usize = 54;
/// `rate` (selector 7:6, rate 5:0).
pub const RATE: usize = 55;
/// `packetlifetime` (selector 7:6, lifetime 5:0).
pub const LIFETIME: usize = 56;
/// `preference`.
pub const PREFERENCE: usize = 57;

/// PathRecord component-mask bits (IBA 15.2.5.16; same values as ibacm's acm_mad.h).
pub mod comp {
    /// ServiceID (two mask bits).
    pub const SERVICE_ID: u64 = 0b11;
    /// DGID.
    pub const DGID: u64 = 1 << 2;
    /// SGID.
    pub const SGID: u64 = 1 << 3;
    /// DLID.
    pub const DLID: u64 = 1 << 4;
    /// SLID.
    pub const SLID: u64 = 1 << 5;
    /// FlowLabel.
    pub const FLOW_LABEL: u64 = 1 << 8;
    /// HopLimit.
    pub const HOP_LIMIT: u64 = 1 << 9;
    /// TClass.
    pub const TCLASS: u64 = 1 << 10;
    /// Reversible.
    pub const REVERSIBLE: u64 = 1 << 11;
    /// P_Key.
    pub const PKEY: u64 = 1 << 13;
    /// QoSClass.
    pub const QOS_CLASS: u64 = 1 << 14;
    /// SL.
    pub const SL: u64 = 1 << 15;
    /// MTUSelector.
    pub const MTU_SELECTOR: u64 = 1 << 16;
    /// MTU.
    pub const MTU: u64 = 1 << 17;
    /// RateSelector.
    pub const RATE_SELECTOR: u64 = 1 << 18;
    /// Rate.
    pub const RATE: u64 = 1 << 19;
    /// PacketLifeTimeSelector.
    pub const LIFETIME_SELECTOR: u64 = 1 << 20;
    /// PacketLifeTime.
    pub const LIFETIME: u64 = 1 << 21;
}

/// Reads a big-endian u16 field.
pub fn be16(r: &[u8; 64], off: usize) -> u16 {
    u16::from_be_bytes([r[off], r[off + 1]])
}

/// Writes a big-endian u16 field.
pub fn set_be16(r: &mut [u8; 64], off: usize, v: u16) {
    r[off..off + 2].copy_from_slice(&v.to_be_bytes());
}

/// Whether a 16-byte GID field is all zero.
pub fn gid_is_zero(r: &[u8; 64], off: usize) -> bool {
    r[off..off + 16].iter().all(|b| *b == 0)
}

/// The component mask that requires every field the record sets (non-zero), as the core's
/// `acm_path_comp_mask` does. NumbPath, RawTraffic and Preference are never required.
pub fn comp_mask(r: &[u8; 64]) -> u64 {
    let mut m = 0;
    if r[SERVICE_ID..SERVICE_ID + 8].iter().any(|b| *b != 0) {
        m |= comp::SERVICE_ID;
    }
    if !gid_is_zero(r, DGID) {
        m |= comp::DGID;
    }
    if !gid_is_zero(r, SGID) {
        m |= comp::SGID;
    }
    if be16(r, DLID) != 0 {
        m |= comp::DLID;
    }
    if be16(r, SLID) != 0 {
        m |= comp::SLID;
    }
    let fh = u32::from_be_bytes([
        r[FLOW_HOP],
        r[FLOW_HOP + 1],
        r[FLOW_HOP + 2],
        r[FLOW_HOP + 3],
    ]);
    if (fh >> 8) & 0xfffff != 0 {
        m |= comp::FLOW_LABEL;
    }
    if fh & 0xff != 0 {
        m |= comp::HOP_LIMIT;
    }
    if r[TCLASS] != 0 {
        m |= comp::TCLASS;
    }
    if r[REVERSIBLE_NUMPATH] & 0x80 != 0 {
        m |= comp::REVERSIBLE;
    }
    if be16(r, PKEY) != 0 {
        m |= comp::PKEY;
    }
    let qs = be16(r, QOS_SL);
    if qs >> 4 != 0 {
        m |= comp::QOS_CLASS;
    }
    if qs & 0xf != 0 {
        m |= comp::SL;
    }
    if r[MTU] != 0 {
        m |= comp::MTU_SELECTOR | comp::MTU;
    }
    if r[RATE] != 0 {
        m |= comp::RATE_SELECTOR | comp::RATE;
    }
    if r[LIFETIME] != 0 {
        m |= comp::LIFETIME_SELECTOR | comp::LIFETIME;
    }
    m
}

/// SA MAD layout (`struct umad_sa_packet`).
pub mod sa {
    /// MAD status (be16).
    pub const STATUS: usize = 4;
    /// Transaction id (be64).
    pub const TID: usize = 8;
    /// Attribute id (be16).
    pub const ATTR_ID: usize = 16;
    /// Component mask (be64).
    pub const COMP_MASK: usize = 48;
    /// Attribute data (200 bytes).
    pub const DATA: usize = 56;
    /// PathRecord attribute id.
    pub const ATTR_PATH_RECORD: u16 = 0x35;
    /// SubnAdmGet.
    pub const METHOD_GET: u8 = 0x01;
    /// SubnAdmGetResp.
    pub const METHOD_GET_RESP: u8 = 0x81;
}

/// Writes a PathRecord GET with `tid` (upper 32 bits zero) into a 256-byte SA MAD buffer.
pub fn build_path_get(mad: &mut [u8; 256], tid: u32, record: &[u8; 64], mask: u64) {
    mad.fill(0);
    mad[0] = 1; // base version
    mad[1] = 3; // SA class
    mad[2] = 2; // class version
    mad[3] = sa::METHOD_GET;
    mad[sa::TID..sa::TID + 8].copy_from_slice(&u64::from(tid).to_be_bytes());
    mad[sa::ATTR_ID..sa::ATTR_ID + 2].copy_from_slice(&sa::ATTR_PATH_RECORD.to_be_bytes());
    mad[sa::COMP_MASK..sa::COMP_MASK + 8].copy_from_slice(&mask.to_be_bytes());
    mad[sa::DATA..sa::DATA + 64].copy_from_slice(record);
}

/// How an SA reply ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaOutcome {
    /// A PathRecord.
    Record([u8; 64]),
    /// The SA said BUSY: retry later.
    Busy,
    /// Any other failure, as an ACM status code.
    Failed(u8),
}

/// Classifies a PathRecord GET reply (`umad_status` is `ib_user_mad.status`).
///
/// A umad status means timeout. The common MAD status bits are honoured (BUSY → retry,
/// redirect or invalid field → EINVAL), then the SA class status byte is passed through the
/// way ibacmp does (ERR_NO_RECORDS 3 = ENODATA). A reply that is not a GetResp PathRecord is
/// EINVAL.
pub fn classify_reply(umad_status: u32, mad: &[u8; 256]) -> SaOutcome {
    use crate::ffi::{ACM_STATUS_EINVAL, ACM_STATUS_ETIMEDOUT};
    if umad_status != 0 {
        return SaOutcome::Failed(ACM_STATUS_ETIMEDOUT);
    }
    let status = u16::from_be_bytes([mad[sa::STATUS], mad[sa::STATUS + 1]]);
    if status & 0x1 != 0 {
        return SaOutcome::Busy;
    }
    if status & 0x1e != 0 {
        return SaOutcome::Failed(ACM_STATUS_EINVAL);
    }
    let class = (status >> 8) as u8;
    if class != 0 {
        return SaOutcome::Failed(class);
    }
    let attr = u16::from_be_bytes([mad[sa::ATTR_ID], mad[sa::ATTR_ID + 1]]);
    if mad[1] != 3 || mad[3] != sa::METHOD_GET_RESP || attr != sa::ATTR_PATH_RECORD {
        return SaOutcome::Failed(ACM_STATUS_EINVAL);
    }
    let mut r = [0u8; 64];
    r.copy_from_slice(&mad[sa::DATA..sa::DATA + 64]);
    SaOutcome::Record(r)
}

/// The TID in a MAD, low 32 bits (the kernel and ibsim rewrite the upper half).
pub fn tid_low(mad: &[u8; 256]) -> u32 {
    u32::from_be_bytes([mad[12], mad[13], mad[14], mad[15]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comp_mask_requires_what_is_set() {
        let mut r = [0u8; 64];
        assert_eq!(comp_mask(&r), 0);
        set_be16(&mut r, DLID, 6);
        r[REVERSIBLE_NUMPATH] = 0x81;
        set_be16(&mut r, QOS_SL, 0x0013);
        r[TCLASS] = 4;
        r[0] = 1;
        let m = comp_mask(&r);
        assert_eq!(
            m,
            comp::DLID | comp::REVERSIBLE | comp::QOS_CLASS | comp::SL | comp::TCLASS | 0b11
        );
    }

    #[test]
    fn reply_classes() {
        let rec = [7u8; 64];
        let mut mad = [0u8; 256];
        build_path_get(&mut mad, 0x1234_5678, &rec, comp::DLID);
        assert_eq!(tid_low(&mad), 0x1234_5678);
        assert_eq!(&mad[8..12], &[0, 0, 0, 0], "upper TID half is zero");
        assert_eq!(classify_reply(110, &mad), SaOutcome::Failed(6));
        mad[3] = sa::METHOD_GET_RESP;
        assert_eq!(classify_reply(0, &mad), SaOutcome::Record(rec));
        mad[2] = 0;
        mad[3] = 1;
        mad[sa::STATUS + 1] = 1;
        assert_eq!(classify_reply(0, &mad), SaOutcome::Busy);
        mad[sa::STATUS + 1] = 0x1c;
        assert_eq!(classify_reply(0, &mad), SaOutcome::Failed(2));
        mad[sa::STATUS] = 3;
        mad[sa::STATUS + 1] = 0;
        assert_eq!(classify_reply(0, &mad), SaOutcome::Failed(3));
        mad[sa::STATUS] = 0;
        assert_eq!(
            classify_reply(0, &mad),
            SaOutcome::Failed(2),
            "GET is not a reply"
        );
    }
}
