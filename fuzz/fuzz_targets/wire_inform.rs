#![no_main]
//! SA InformInfo and Notice (`wire::inform`): every parse entry point on arbitrary bytes, alone
//! and as the data of an SA MAD (what a Report, a ReportResp and an InformInfo SET carry).
//!
//! * `InformInfoRepr::parse_bytes` / `NoticeRepr::parse_bytes` fail exactly on short input
//!   (`Truncated`); what parses re-emits to bytes that parse to the same value, and those
//!   bytes are the input's (InformInfo: reserved fields zero, IsGeneric/Subscribe as 0/1);
//!   `emit` writes its record's length and nothing past it;
//! * `NoticeRepr::subject_gid` is DataDetails 6..22 for generic traps 64–67, else `None`;
//! * `InformInfoRepr::generic` (from input fields) round-trips;
//! * a Notice carried in an SA MAD survives the resolver's ReportResp construction (same TID,
//!   same notice bytes, method ReportResp, attribute Notice).
use acm_core_nostd::wire::inform::{
    InformInfoRepr, NoticeRepr, ALL_16, ALL_PRODUCERS, INFORM_INFO_LEN, NOTICE_LEN,
};
use acm_core_nostd::wire::mad::{Method, MAD_LEN};
use acm_core_nostd::wire::sa::{attr, SaPacket, SaRepr, DATA_OFFSET};
use acm_core_nostd::wire::Error;
use libfuzzer_sys::fuzz_target;

/// Sentinel around emitted records, to see `emit` stays inside its length.
const FILL: u8 = 0xa5;

fn inform(b: &[u8]) -> Option<InformInfoRepr> {
    let r = match InformInfoRepr::parse_bytes(b) {
        Ok(r) => r,
        Err(e) => {
            assert_eq!(e, Error::Truncated);
            assert!(b.len() < INFORM_INFO_LEN, "{} bytes refused", b.len());
            return None;
        }
    };
    assert!(b.len() >= INFORM_INFO_LEN);
    assert!(r.qpn <= 0x00ff_ffff && r.resp_time <= 0x1f && r.producer <= ALL_PRODUCERS);
    let mut e = [FILL; INFORM_INFO_LEN + 8];
    r.emit(&mut e);
    assert_eq!(
        e[INFORM_INFO_LEN..],
        [FILL; 8],
        "emit wrote past the record"
    );
    assert_eq!(InformInfoRepr::parse_bytes(&e), Ok(r));
    let mut want = [0u8; INFORM_INFO_LEN];
    want.copy_from_slice(&b[..INFORM_INFO_LEN]);
    want[20..22].fill(0); // reserved
    want[22] = u8::from(want[22] != 0); // IsGeneric
    want[23] = u8::from(want[23] != 0); // Subscribe
    want[31] &= 0x1f; // reserved:3 RespTimeValue:5
    want[32] = 0; // reserved
    assert_eq!(e[..INFORM_INFO_LEN], want);
    Some(r)
}

fn notice(b: &[u8]) -> Option<NoticeRepr> {
    let n = match NoticeRepr::parse_bytes(b) {
        Ok(n) => n,
        Err(e) => {
            assert_eq!(e, Error::Truncated);
            assert!(b.len() < NOTICE_LEN, "{} bytes refused", b.len());
            return None;
        }
    };
    assert!(n.type_ <= 0x7f && n.producer <= 0x00ff_ffff);
    let mut e = [FILL; NOTICE_LEN + 8];
    n.emit(&mut e);
    assert_eq!(e[NOTICE_LEN..], [FILL; 8], "emit wrote past the record");
    assert_eq!(
        e[..NOTICE_LEN],
        b[..NOTICE_LEN],
        "a Notice has no reserved bits"
    );
    assert_eq!(NoticeRepr::parse_bytes(&e), Ok(n));
    let about = n.is_generic && (64..=67).contains(&n.trap);
    match n.subject_gid() {
        Some(g) => {
            assert!(about);
            assert_eq!(g[..], b[16..32]);
        }
        None => assert!(!about),
    }
    Some(n)
}

fuzz_target!(|data: &[u8]| {
    // The records on their own, at the start of the input.
    let i = inform(data);
    notice(data);
    // A subscription built from input fields round-trips (QPN masked to 24 bits).
    if let Some(r) = i {
        let g = InformInfoRepr::generic(r.trap, r.qpn, r.subscribe);
        let mut b = [0u8; INFORM_INFO_LEN];
        g.emit(&mut b);
        let p = InformInfoRepr::parse_bytes(&b).unwrap();
        assert_eq!(p, g);
        assert_eq!(
            (p.lid_begin, p.type_, p.producer),
            (ALL_16, ALL_16, ALL_PRODUCERS)
        );
        assert!(p.is_generic);
    }
    // The records as the data of an SA MAD (the way the resolver reads them).
    let Some(mad) = data.get(..MAD_LEN) else {
        return;
    };
    let Ok(sa) = SaRepr::parse(&SaPacket::new_unchecked(mad)) else {
        return;
    };
    let payload = &mad[DATA_OFFSET..];
    inform(payload);
    if let Some(n) = notice(payload) {
        // The ReportResp the resolver sends back for a Report: same TID and notice.
        let mut resp = [0u8; MAD_LEN];
        let mut p = SaPacket::new_unchecked(&mut resp[..]);
        SaRepr::request(Method::ReportResp, attr::NOTICE, sa.header.tid, 0).emit(&mut p);
        n.emit(p.data_mut());
        let back = SaRepr::parse(&SaPacket::new_unchecked(&resp[..])).unwrap();
        assert_eq!(back.header.method, Method::ReportResp);
        assert!(back.header.method.is_response());
        assert_eq!(back.header.attr_id, attr::NOTICE);
        assert_eq!(back.header.tid, sa.header.tid);
        assert_eq!(
            resp[DATA_OFFSET..DATA_OFFSET + NOTICE_LEN],
            payload[..NOTICE_LEN]
        );
        assert_eq!(NoticeRepr::parse_bytes(&resp[DATA_OFFSET..]), Ok(n));
    }
});
