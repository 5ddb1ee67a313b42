//! Decodes SA replies captured from a real OpenSM 3.3.23 on ibsim's `net.2sw2path4hca`
//! fabric (queried from Hca2 = LID 4; OpenSM on Hca1 = LID 1, Hca3 = LID 5, Hca4 = LID 6).
//! The requests were built by this crate (`madtool capture`); see `tests/fixtures/regen.sh`.

use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::mad::{Method, MgmtClass, RmppType};
use acm_core_nostd::wire::mcmember::{self, AcmMgid, McMemberMask, McMemberRepr};
use acm_core_nostd::wire::path_record::{PathRecordMask, PathRecordRepr};
use acm_core_nostd::wire::rate::{Mtu, Rate};
use acm_core_nostd::wire::sa::{attr, SaPacket, SaRepr, SaStatus};
use acm_core_nostd::wire::{Error, Selector};

fn fixture(name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

const PREFIX: u64 = 0xfe80_0000_0000_0000;

fn reply(name: &str) -> (Vec<u8>, SaRepr) {
    let b = fixture(name);
    assert_eq!(b.len(), 256);
    let r = SaRepr::parse(&SaPacket::new_checked(&b[..]).unwrap()).unwrap();
    (b, r)
}

/// The request/reply pair agrees on TID (low 32 bits) and attribute, and the reply is a
/// single-MAD GetResp from the SA.
fn check_pair(name: &str, attr_id: u16) -> (Vec<u8>, SaRepr) {
    let (_, req) = reply(&format!("opensm_{name}_req.bin"));
    let (b, resp) = reply(&format!("opensm_{name}_resp.bin"));
    assert_eq!(resp.header.base_version, 1);
    assert_eq!(resp.header.mgmt_class, MgmtClass::SubnAdm);
    assert_eq!(resp.header.class_version, 2);
    assert_eq!(resp.header.method, Method::GetResp);
    assert!(resp.header.method.is_response());
    assert_eq!(resp.header.tid as u32, req.header.tid as u32);
    assert_eq!(resp.header.attr_id, attr_id);
    assert_eq!(req.header.attr_id, attr_id);
    assert_eq!(resp.rmpp.rmpp_type, RmppType::None);
    (b, resp)
}

#[test]
fn path_record_by_lid() {
    let (b, r) = check_pair("pr_get_lid", attr::PATH_RECORD);
    assert!(r.header.status.is_success());
    assert_eq!(r.sa_status(), SaStatus::Success);
    assert_eq!(r.attr_offset, 8, "PathRecord is 64 bytes = 8 words");
    let mask = PathRecordMask(r.comp_mask);
    assert!(
        mask.contains(PathRecordMask::SL),
        "SL 0 was required explicitly"
    );
    let p = PathRecordRepr::parse_bytes(SaPacket::new_checked(&b[..]).unwrap().data()).unwrap();
    assert_eq!((p.slid, p.dlid), (4, 6));
    assert_eq!(p.sgid, Gid::from_parts(PREFIX, 0x10_0004));
    assert_eq!(p.dgid, Gid::from_parts(PREFIX, 0x10_000a));
    assert_eq!(p.pkey, 0xffff);
    assert_eq!(p.sl, 0);
    assert!(p.reversible);
    assert_eq!(p.mtu_selector, Selector::Exactly);
    assert_eq!(p.rate_selector, Selector::Exactly);
    assert!(Mtu::from(p.mtu).to_bytes().is_some(), "mtu {}", p.mtu);
    assert!(Rate::from(p.rate).to_mbps().is_some(), "rate {}", p.rate);
    assert_eq!(p.packet_life_selector, Selector::Exactly);
    // Re-emitting the parsed record gives OpenSM's bytes back (reserved bytes are zero).
    assert_eq!(p.to_bytes()[..], b[56..120]);
}

#[test]
fn path_record_by_gid() {
    let (b, r) = check_pair("pr_get_gid", attr::PATH_RECORD);
    assert_eq!(r.sa_status(), SaStatus::Success);
    assert_eq!(
        PathRecordMask(r.comp_mask),
        PathRecordMask::DGID | PathRecordMask::SGID | PathRecordMask::PKEY
    );
    let p = PathRecordRepr::parse_bytes(&b[56..]).unwrap();
    assert_eq!((p.slid, p.dlid), (4, 5), "Hca2 -> Hca3");
    assert_eq!(p.dgid, Gid::from_parts(PREFIX, 0x10_0007));
}

#[test]
fn path_record_no_records() {
    let (_, r) = check_pair("pr_get_norec", attr::PATH_RECORD);
    assert_eq!(r.sa_status(), SaStatus::NoRecords);
    assert_eq!(r.header.status.class_status(), 3);
    assert!(!r.header.status.busy());
}

#[test]
fn mcmember_acm_join() {
    let (b, r) = check_pair("mcm_set", attr::MCMEMBER_RECORD);
    assert_eq!(r.sa_status(), SaStatus::Success);
    assert_eq!(McMemberMask(r.comp_mask), McMemberMask::ACM_JOIN);
    assert_eq!(r.attr_offset, 7, "MCMemberRecord is 56 bytes = 7 words");
    let m = McMemberRepr::parse_bytes(&b[56..]).unwrap();
    assert!(m.mlid >= 0xc000, "MLID {:#x}", m.mlid);
    assert_eq!(
        AcmMgid::parse(&m.mgid),
        Ok(AcmMgid {
            pkey: 0xffff,
            tos: 0,
            rate: Rate::Gbps10.into(),
            mtu: Mtu::Mtu2048.into()
        })
    );
    assert_eq!(m.port_gid, Gid::from_parts(PREFIX, 0x10_0004));
    assert_eq!(m.qkey, mcmember::ACM_QKEY);
    assert_eq!(m.pkey, 0xffff);
    assert_eq!(
        (m.scope, m.join_state),
        (mcmember::SCOPE_SITE_LOCAL, mcmember::JOIN_FULL_MEMBER)
    );
    assert_eq!((m.mtu_selector, m.mtu), (Selector::Exactly, 4));
    assert_eq!((m.rate_selector, m.rate), (Selector::Exactly, 3));
    assert_eq!(m.to_bytes()[..], b[56..112]);
}

#[test]
fn truncated_fixtures_are_rejected() {
    let b = fixture("opensm_pr_get_lid_resp.bin");
    for n in 0..256 {
        assert_eq!(SaPacket::new_checked(&b[..n]).err(), Some(Error::Truncated));
    }
}
