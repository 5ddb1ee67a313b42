#![no_main]
//! ibacm client messages: RESOLVE parse → emit → parse is the identity; validation and the
//! response builders never panic and always produce a message that validates; PERF_QUERY
//! round-trips.
use acm_core_nostd::wire::client::{
    build_error_response, build_query_response, build_resolve_response, AcmMsg, AcmMsgRepr,
    PerfResponseRepr, Status, MSG_LEN, RESPONSE_PATH_FLAGS,
};
use acm_core_nostd::wire::path_record::PathRecordRepr;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let m = AcmMsg::new_unchecked(data);
    if let Ok(r) = AcmMsgRepr::parse(&m) {
        let mut b = [0u8; MSG_LEN];
        let n = r.emit(&mut AcmMsg::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(n, r.buffer_len());
        let again = AcmMsgRepr::parse(&AcmMsg::new_unchecked(&b[..n])).unwrap();
        assert_eq!(again, r);
    }
    let path = PathRecordRepr {
        dlid: 6,
        slid: 4,
        ..PathRecordRepr::ZERO
    };
    let mut out = [0u8; MSG_LEN];
    if let Ok(layout) = m.check_resolve() {
        assert!(layout.count >= 1 && layout.dest < layout.count.max(1));
        let n = build_resolve_response(&m, &path.to_bytes(), &mut out).unwrap();
        let resp = AcmMsg::new_unchecked(&out[..n]);
        assert_eq!(resp.length() as usize, n);
        assert_eq!(resp.tid(), m.tid());
        assert_eq!(resp.entry(0).unwrap().flags(), RESPONSE_PATH_FLAGS);
        assert_eq!(resp.entry(0).unwrap().path(), path);
        let _ = build_query_response(&m, Status::Success, Some(&path), &mut out);
    } else {
        assert!(build_resolve_response(&m, &path.to_bytes(), &mut out).is_err());
    }
    if let Ok(n) = build_error_response(&m, Status::Einval, &mut out) {
        assert_eq!(n, 16);
        assert_eq!(AcmMsg::new_unchecked(&out[..16]).tid(), m.tid());
    }
    if let Ok(p) = PerfResponseRepr::parse(&m) {
        let mut b = [0u8; MSG_LEN];
        let n = p.emit(&mut AcmMsg::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(
            PerfResponseRepr::parse(&AcmMsg::new_unchecked(&b[..n])),
            Ok(p)
        );
    }
});
