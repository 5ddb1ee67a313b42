//! The provider's use of the SA: the PathRecord GET it sends and how it classifies the reply.
//!
//! Encoding and decoding are `acm-core-nostd::wire::{mad, sa, path_record}`; this module only
//! adds the provider's policy (which status means retry, which ACM status to answer). The
//! 64-byte record is `struct ibv_path_record` (libibverbs `sa.h`), network byte order.

use acm_core_nostd::wire::mad::{Header, MadStatus, Method};
use acm_core_nostd::wire::path_record::{acm_path_comp_mask, PathRecordRepr};
use acm_core_nostd::wire::sa::{attr, SaPacket, SaRepr};

/// The component mask that requires every field the record sets (non-zero): ibacm's own
/// `acm_path_comp_mask` rule, from `wire::path_record`.
pub fn comp_mask(r: &[u8; 64]) -> u64 {
    PathRecordRepr::parse_bytes(r).map_or(0, |p| acm_path_comp_mask(&p).0)
}

/// Writes a PathRecord GET with `tid` (upper 32 bits zero) into a 256-byte SA MAD buffer.
pub fn build_path_get(mad: &mut [u8; 256], tid: u32, record: &[u8; 64], mask: u64) {
    mad.fill(0);
    let mut p = SaPacket::new_unchecked(&mut mad[..]);
    SaRepr::path_record_get(u64::from(tid), mask).emit(&mut p);
    p.data_mut()[..64].copy_from_slice(record);
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
    let p = SaPacket::new_unchecked(&mad[..]);
    let Ok(repr) = SaRepr::parse(&p) else {
        return SaOutcome::Failed(ACM_STATUS_EINVAL);
    };
    let status = repr.header.status;
    if status.busy() {
        return SaOutcome::Busy;
    }
    if status.redirect() || status.0 & MadStatus::INVALID_FIELD_MASK != 0 {
        return SaOutcome::Failed(ACM_STATUS_EINVAL);
    }
    if status.class_status() != 0 {
        return SaOutcome::Failed(status.class_status());
    }
    if repr.header.method != Method::GetResp || repr.header.attr_id != attr::PATH_RECORD {
        return SaOutcome::Failed(ACM_STATUS_EINVAL);
    }
    let mut r = [0u8; 64];
    r.copy_from_slice(&p.data()[..64]);
    SaOutcome::Record(r)
}

/// The TID in a MAD, low 32 bits (the kernel and ibsim rewrite the upper half).
pub fn tid_low(mad: &[u8; 256]) -> u32 {
    Header::new_unchecked(&mad[..]).tid_low32()
}

#[cfg(test)]
mod tests {
    use super::*;
    use acm_core_nostd::wire::path_record::{PathRecord, PathRecordMask as M};

    #[test]
    fn comp_mask_requires_what_is_set() {
        let mut r = [0u8; 64];
        assert_eq!(comp_mask(&r), 0);
        {
            let mut p = PathRecord::new_unchecked(&mut r[..]);
            p.set_dlid(6);
            p.set_reversible_numpath(true, 1);
            p.set_qosclass_sl(1, 3);
        }
        r[48] = 4; // TClass
        r[0] = 1;
        let m = comp_mask(&r);
        assert_eq!(
            m,
            M::DLID.0 | M::REVERSIBLE.0 | M::QOS_CLASS.0 | M::SL.0 | M::TCLASS.0 | M::SERVICE_ID.0
        );
    }

    #[test]
    fn reply_classes() {
        let rec = [7u8; 64];
        let mut mad = [0u8; 256];
        build_path_get(&mut mad, 0x1234_5678, &rec, M::DLID.0);
        assert_eq!(tid_low(&mad), 0x1234_5678);
        assert_eq!(&mad[8..12], &[0, 0, 0, 0], "upper TID half is zero");
        assert_eq!(classify_reply(110, &mad), SaOutcome::Failed(6));
        mad[3] = 0x81;
        assert_eq!(classify_reply(0, &mad), SaOutcome::Record(rec));
        mad[2] = 0;
        mad[3] = 1;
        mad[5] = 1;
        assert_eq!(classify_reply(0, &mad), SaOutcome::Busy);
        mad[5] = 0x1c;
        assert_eq!(classify_reply(0, &mad), SaOutcome::Failed(2));
        mad[4] = 3;
        mad[5] = 0;
        assert_eq!(classify_reply(0, &mad), SaOutcome::Failed(3));
        mad[4] = 0;
        assert_eq!(
            classify_reply(0, &mad),
            SaOutcome::Failed(2),
            "GET is not a reply"
        );
    }
}
