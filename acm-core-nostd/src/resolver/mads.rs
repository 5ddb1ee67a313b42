//! The MADs the resolver sends and the replies it reads, built and parsed with `crate::wire`.
//!
//! * SA PathRecord GET (ibacm's `acm_path_comp_mask`), and how its reply is classified
//!   (BUSY → retry, "no record" → ENODATA, common status bits honoured, then the SA class
//!   status passed through the way ibacmp does);
//! * MCMemberRecord SET (join) and DELETE (leave) as `acmp_init_join` builds them;
//! * the class 0x2C resolve request and response ([`crate::wire::acm_mad::AcmResolveRepr`]).
//!
//! Context tokens: `kind << 56 | index << 32 | tid`, so a reply finds its slot in O(1) and a
//! stale one (old TID) never matches.

use crate::wire::acm_mad::{AcmMad, AcmResolveRepr, AddressType, ADDRESS_LEN};
use crate::wire::client::Status;
use crate::wire::gid::Gid;
use crate::wire::inform::{InformInfoRepr, NoticeRepr, INFORM_INFO_LEN, NOTICE_LEN};
use crate::wire::mad::{Header, MadStatus, Method, HEADER_LEN, MAD_LEN};
use crate::wire::mcmember::{AcmMgid, McMemberMask, McMemberRepr, MCMEMBER_RECORD_LEN};
use crate::wire::path_record::{acm_path_comp_mask, PathRecord, PathRecordRepr};
use crate::wire::sa::{attr, SaPacket, SaRepr, DATA_OFFSET};

use super::McGroup;

/// Token kind of an SA PathRecord query.
pub(crate) const TOKEN_ROUTE: u64 = 1;
/// Token kind of an MCMemberRecord SET.
pub(crate) const TOKEN_JOIN: u64 = 2;
/// Token kind of an MCMemberRecord DELETE (fire and forget).
pub(crate) const TOKEN_LEAVE: u64 = 3;
/// Token kind of an InformInfo SET that subscribes (index = endpoint slot × 2 + trap).
pub(crate) const TOKEN_INFORM: u64 = 4;
/// Token kind of fire-and-forget SA MADs: an unsubscribe, a ReportResponse.
pub(crate) const TOKEN_NOTICE: u64 = 5;
/// Token kind of a half-world PathRecord GetTable (index = endpoint slot).
pub(crate) const TOKEN_TABLE: u64 = 6;
/// Token kind of a table's probe, a PathRecord Get for the LID past the table room (index =
/// endpoint slot; [`super::table`]).
pub(crate) const TOKEN_PROBE: u64 = 7;

pub(crate) fn token(kind: u64, index: u32, tid: u32) -> u64 {
    (kind << 56) | (u64::from(index & 0x00ff_ffff) << 32) | u64::from(tid)
}

pub(crate) fn untoken(t: u64) -> (u64, u32, u32) {
    (t >> 56, ((t >> 32) & 0x00ff_ffff) as u32, t as u32)
}

/// The component mask ibacm sends with a PathRecord: a bit for every non-zero field.
pub(crate) fn comp_mask(r: &[u8; 64]) -> u64 {
    PathRecordRepr::parse_bytes(r).map_or(0, |p| acm_path_comp_mask(&p).0)
}

/// A PathRecord GET with `tid` (upper 32 bits zero).
pub(crate) fn path_get(tid: u32, record: &[u8; 64]) -> [u8; MAD_LEN] {
    let mut mad = [0u8; MAD_LEN];
    let mut p = SaPacket::new_unchecked(&mut mad[..]);
    SaRepr::path_record_get(u64::from(tid), comp_mask(record)).emit(&mut p);
    p.data_mut()[..64].copy_from_slice(record);
    mad
}

/// A half-world PathRecord GetTable with `tid`: every path from `sgid` in partition `pkey`,
/// reversible (ComponentMask SGID, Reversible, NumbPath, P_Key: the fields a plain request's
/// GET also sets, without a destination).
pub(crate) fn path_table(tid: u32, sgid: Gid, pkey: u16) -> [u8; MAD_LEN] {
    let mut r = [0u8; 64];
    let mut p = PathRecord::new_unchecked(&mut r[..]);
    p.set_sgid(sgid);
    p.set_reversible_numpath(true, 1);
    p.set_pkey(pkey);
    let mut mad = path_get(tid, &r);
    Header::new_unchecked(&mut mad[..HEADER_LEN]).set_method(Method::GetTable);
    mad
}

/// How an SA PathRecord reply ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SaOutcome {
    /// A PathRecord.
    Record([u8; 64]),
    /// BUSY: retry later.
    Busy,
    /// Any other failure, as an ACM status.
    Failed(Status),
}

/// Classifies a PathRecord GET reply (`umad_status` nonzero = timeout / send failure).
pub(crate) fn classify_path_reply(umad_status: u32, mad: &[u8; MAD_LEN]) -> SaOutcome {
    if umad_status != 0 {
        return SaOutcome::Failed(Status::Etimedout);
    }
    let p = SaPacket::new_unchecked(&mad[..]);
    let Ok(repr) = SaRepr::parse(&p) else {
        return SaOutcome::Failed(Status::Einval);
    };
    let status = repr.header.status;
    if status.busy() {
        return SaOutcome::Busy;
    }
    if status.redirect() || status.0 & MadStatus::INVALID_FIELD_MASK != 0 {
        return SaOutcome::Failed(Status::Einval);
    }
    if status.class_status() != 0 {
        // The SA's class status byte as the ACM status, as ibacmp passes it through
        // (ERR_NO_RECORDS 3 is ACM_STATUS_ENODATA 3).
        return SaOutcome::Failed(Status::from(status.class_status()));
    }
    if repr.header.method != Method::GetResp || repr.header.attr_id != attr::PATH_RECORD {
        return SaOutcome::Failed(Status::Einval);
    }
    let mut r = [0u8; 64];
    r.copy_from_slice(&p.data()[..64]);
    SaOutcome::Record(r)
}

/// The low 32 bits of a MAD's TID (the kernel and ibsim rewrite the upper half).
pub(crate) fn tid_low(mad: &[u8; MAD_LEN]) -> u32 {
    Header::new_unchecked(&mad[..]).tid_low32()
}

/// A MAD copied into a full 256-byte buffer (short input is zero-padded).
pub(crate) fn full_mad(mad: &[u8]) -> [u8; MAD_LEN] {
    let mut b = [0u8; MAD_LEN];
    let n = mad.len().min(MAD_LEN);
    b[..n].copy_from_slice(&mad[..n]);
    b
}

/// The MGID of an acm group.
pub(crate) fn group_mgid(pkey: u16, rate: u8, mtu: u8) -> Gid {
    AcmMgid {
        pkey,
        tos: 0,
        rate,
        mtu,
    }
    .to_gid()
}

/// The MCMemberRecord a join (and its leave) carries, as `acmp_init_join` fills it.
pub(crate) fn join_record(
    port_gid: Gid,
    pkey: u16,
    rate: u8,
    mtu: u8,
) -> [u8; MCMEMBER_RECORD_LEN] {
    McMemberRepr::acm_join(group_mgid(pkey, rate, mtu), port_gid, pkey, rate, mtu).to_bytes()
}

/// An MCMemberRecord SET (join) or DELETE (leave) of `record`.
pub(crate) fn mcmember(
    method: Method,
    tid: u32,
    record: &[u8; MCMEMBER_RECORD_LEN],
) -> [u8; MAD_LEN] {
    let mut mad = [0u8; MAD_LEN];
    let mut p = SaPacket::new_unchecked(&mut mad[..]);
    SaRepr::request(
        method,
        attr::MCMEMBER_RECORD,
        u64::from(tid),
        McMemberMask::ACM_JOIN.0,
    )
    .emit(&mut p);
    p.data_mut()[..MCMEMBER_RECORD_LEN].copy_from_slice(record);
    mad
}

/// The SA's MCMemberRecord from a successful join reply for `mgid`, else `None`.
pub(crate) fn join_reply(
    umad_status: u32,
    mad: &[u8; MAD_LEN],
    mgid: Gid,
) -> Option<[u8; MCMEMBER_RECORD_LEN]> {
    if umad_status != 0 {
        return None;
    }
    let repr = SaRepr::parse(&SaPacket::new_unchecked(&mad[..])).ok()?;
    if !repr.header.status.is_success()
        || repr.header.method != Method::GetResp
        || repr.header.attr_id != attr::MCMEMBER_RECORD
    {
        return None;
    }
    let mut rec = [0u8; MCMEMBER_RECORD_LEN];
    rec.copy_from_slice(&mad[DATA_OFFSET..DATA_OFFSET + MCMEMBER_RECORD_LEN]);
    let parsed = McMemberRepr::parse_bytes(&rec).ok()?;
    (parsed.mgid == mgid && parsed.mlid != 0).then_some(rec)
}

/// The [`McGroup`] of a joined group's record.
pub(crate) fn group_of(index: u8, record: &[u8; MCMEMBER_RECORD_LEN]) -> McGroup {
    let r = McMemberRepr::parse_bytes(record).unwrap_or(McMemberRepr::ZERO);
    McGroup {
        index,
        mgid: r.mgid,
        mlid: r.mlid,
        sl: r.sl,
        flow_label: r.flow_label,
        hop_limit: r.hop_limit,
        tclass: r.tclass,
        rate: r.rate,
        mtu: r.mtu,
        pkey: r.pkey,
        qkey: r.qkey,
    }
}

/// The multicast resolve request, as libibacmp's `acmp_send_resolve` builds it.
pub(crate) fn acm_request(
    tid: u64,
    dest_type: AddressType,
    dest: &[u8; ADDRESS_LEN],
    src_type: AddressType,
    src: &[u8; ADDRESS_LEN],
    mgids: &[Gid],
) -> [u8; MAD_LEN] {
    let mut mad = [0u8; MAD_LEN];
    if let Ok(r) = AcmResolveRepr::request(tid, dest_type, *dest, src_type, *src, mgids) {
        let _ = r.emit(&mut AcmMad::new_unchecked(&mut mad[..]));
    }
    mad
}

/// The unicast resolve response, as libibacmp's `acmp_send_addr_resp` builds it.
pub(crate) fn acm_response(tid: u64, mgid: Gid) -> [u8; MAD_LEN] {
    let mut mad = [0u8; MAD_LEN];
    let _ = AcmResolveRepr::response(tid, mgid).emit(&mut AcmMad::new_unchecked(&mut mad[..]));
    mad
}

/// An InformInfo SET (subscribe or unsubscribe) with `tid`.
pub(crate) fn inform_set(tid: u32, rec: &InformInfoRepr) -> [u8; MAD_LEN] {
    let mut mad = [0u8; MAD_LEN];
    let mut p = SaPacket::new_unchecked(&mut mad[..]);
    // No component mask: InformInfo is not a record with selectable components.
    SaRepr::request(Method::Set, attr::INFORM_INFO, u64::from(tid), 0).emit(&mut p);
    rec.emit(&mut p.data_mut()[..INFORM_INFO_LEN]);
    mad
}

/// Whether a reply to an InformInfo SET accepted the subscription.
pub(crate) fn inform_accepted(umad_status: u32, mad: &[u8; MAD_LEN]) -> bool {
    if umad_status != 0 {
        return false;
    }
    let Ok(repr) = SaRepr::parse(&SaPacket::new_unchecked(&mad[..])) else {
        return false;
    };
    repr.header.status.is_success()
        && repr.header.method == Method::GetResp
        && repr.header.attr_id == attr::INFORM_INFO
        && InformInfoRepr::parse_bytes(&mad[DATA_OFFSET..]).is_ok_and(|r| r.subscribe)
}

/// A REPORT(Notice) from the SA: its TID, the notice as parsed and as received. `None` for
/// anything else (the caller counts it).
pub(crate) fn parse_report(mad: &[u8; MAD_LEN]) -> Option<(u64, NoticeRepr, [u8; NOTICE_LEN])> {
    let repr = SaRepr::parse(&SaPacket::new_unchecked(&mad[..])).ok()?;
    if repr.header.method != Method::Report || repr.header.attr_id != attr::NOTICE {
        return None;
    }
    let mut raw = [0u8; NOTICE_LEN];
    raw.copy_from_slice(&mad[DATA_OFFSET..DATA_OFFSET + NOTICE_LEN]);
    let n = NoticeRepr::parse_bytes(&raw).ok()?;
    Some((repr.header.tid, n, raw))
}

/// The REPORTRESP acknowledging a Report with `tid` and `notice`.
pub(crate) fn report_response(tid: u64, notice: &[u8; NOTICE_LEN]) -> [u8; MAD_LEN] {
    let mut mad = [0u8; MAD_LEN];
    let mut p = SaPacket::new_unchecked(&mut mad[..]);
    SaRepr::request(Method::ReportResp, attr::NOTICE, tid, 0).emit(&mut p);
    p.data_mut()[..NOTICE_LEN].copy_from_slice(notice);
    mad
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::path_record::{PathRecord, PathRecordMask as M};

    #[test]
    fn tokens_round_trip() {
        let t = token(TOKEN_JOIN, 513, 0xdead_beef);
        assert_eq!(untoken(t), (TOKEN_JOIN, 513, 0xdead_beef));
    }

    #[test]
    fn path_get_and_reply_classes() {
        let mut rec = [0u8; 64];
        PathRecord::new_unchecked(&mut rec[..]).set_dlid(6);
        let mut mad = path_get(0x1234_5678, &rec);
        assert_eq!(tid_low(&mad), 0x1234_5678);
        assert_eq!(&mad[8..12], &[0, 0, 0, 0], "upper TID half is zero");
        assert_eq!(
            u64::from_be_bytes(mad[48..56].try_into().unwrap()),
            M::DLID.0
        );
        assert_eq!(
            classify_path_reply(110, &mad),
            SaOutcome::Failed(Status::Etimedout)
        );
        mad[3] = 0x81;
        assert_eq!(classify_path_reply(0, &mad), SaOutcome::Record(rec));
        mad[3] = 1;
        mad[5] = 1;
        assert_eq!(classify_path_reply(0, &mad), SaOutcome::Busy);
        mad[5] = 0x1c;
        assert_eq!(
            classify_path_reply(0, &mad),
            SaOutcome::Failed(Status::Einval)
        );
        mad[4] = 3;
        mad[5] = 0;
        assert_eq!(
            classify_path_reply(0, &mad),
            SaOutcome::Failed(Status::Enodata)
        );
        mad[4] = 0;
        assert_eq!(
            classify_path_reply(0, &mad),
            SaOutcome::Failed(Status::Einval)
        );
    }

    #[test]
    fn join_is_acmp_init_join() {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[13] = 0x10;
        g[15] = 4;
        let rec = join_record(Gid(g), 0xffff, 3, 4);
        let mad = mcmember(Method::Set, 7, &rec);
        assert_eq!(&mad[..4], &[1, 3, 2, 2]);
        assert_eq!(&mad[16..18], &[0, 0x38]);
        assert_eq!(
            u64::from_be_bytes(mad[48..56].try_into().unwrap()),
            0x1_b3f7
        );
        assert_eq!(&mad[56..65], &[0xff, 0x15, 0x40, 0x01, 0xff, 0xff, 0, 3, 4]);
        assert_eq!(&mad[88..92], &[0x80, 0x01, 0, 0], "qkey");
        assert_eq!((mad[94], mad[98]), (0x84, 0x83), "mtu/rate EXACTLY");
        assert_eq!(mad[104], 0x51, "site-local, full member");
        // A reply is that record with the method GetResp and an MLID.
        let mut reply = mad;
        reply[3] = 0x81;
        reply[92..94].copy_from_slice(&[0xc0, 0x01]);
        let got = join_reply(0, &reply, group_mgid(0xffff, 3, 4)).unwrap();
        assert_eq!(group_of(0, &got).mlid, 0xc001);
        assert!(join_reply(0, &reply, group_mgid(0xffff, 3, 5)).is_none());
        assert!(join_reply(1, &reply, group_mgid(0xffff, 3, 4)).is_none());
        reply[4] = 0x02;
        assert!(join_reply(0, &reply, group_mgid(0xffff, 3, 4)).is_none());
    }
}
