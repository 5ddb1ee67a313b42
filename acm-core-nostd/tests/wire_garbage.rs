//! Every wire parser on deterministic pseudo-random garbage (the fuzz targets' invariants, run
//! in plain `cargo test`): no panics; whatever parses re-emits to bytes that parse the same.

use acm_core_nostd::wire::acm_mad::{AcmMad, AcmResolveRepr};
use acm_core_nostd::wire::client::{
    build_error_response, build_resolve_response, AcmMsg, AcmMsgRepr, PerfResponseRepr, Status,
    EP_LEN, HDR_LEN, MSG_LEN,
};
use acm_core_nostd::wire::mad::{Header, HeaderRepr, RmppHeader, RmppRepr};
use acm_core_nostd::wire::mcmember::{AcmMgid, McMemberRepr};
use acm_core_nostd::wire::path_record::{acm_path_comp_mask, PathRecordRepr};
use acm_core_nostd::wire::sa::{SaPacket, SaRepr};

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn fill(&mut self, b: &mut [u8]) {
        for x in b {
            *x = self.next() as u8;
        }
    }
}

/// Random bytes, biased towards the shapes the parsers accept (so that the roundtrip
/// branches run): valid SA / ACM class bytes, plausible client lengths and indices.
fn sample(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.next() % 6 {
        0 => (rng.next() % 700) as usize,
        1 | 2 => 256,
        3 => 64,
        _ => HDR_LEN + EP_LEN * (rng.next() % 9) as usize,
    };
    let mut b = vec![0u8; len];
    rng.fill(&mut b);
    let shape = rng.next() % 4;
    if len >= 24 && shape == 0 {
        b[1] = 0x03;
    }
    if len >= 256 && shape == 1 {
        b[1] = 0x2c;
        b[20] %= 8;
    }
    if len >= HDR_LEN && shape >= 2 {
        b[0] = 1;
        b[1] = if shape == 2 { 1 } else { 0x82 };
        let n = if rng.next() % 4 == 0 {
            len
        } else {
            HDR_LEN + EP_LEN * (rng.next() % 9) as usize
        };
        b[6..8].copy_from_slice(&(n as u16).to_ne_bytes());
        b[3] %= 2;
        b[4] %= 10;
        b[5] %= 10;
        if shape == 3 {
            b[3] %= 8;
            let perf_len = (HDR_LEN + 8 * b[3] as usize) as u16;
            b[6..8].copy_from_slice(&perf_len.to_be_bytes());
        }
    }
    b
}

#[test]
fn parsers_survive_garbage_and_roundtrip() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut parsed = [0usize; 8];
    for _ in 0..30_000 {
        let data = sample(&mut rng);
        let d = &data[..];
        if let Ok(h) = HeaderRepr::parse(&Header::new_unchecked(d)) {
            let mut b = [0u8; 24];
            h.emit(&mut Header::new_unchecked(&mut b[..]));
            assert_eq!(HeaderRepr::parse(&Header::new_unchecked(&b[..])), Ok(h));
            parsed[0] += 1;
        }
        if let Some(r) = d
            .get(24..)
            .and_then(|x| RmppRepr::parse(&RmppHeader::new_unchecked(x)).ok())
        {
            let mut b = [0u8; 12];
            r.emit(&mut RmppHeader::new_unchecked(&mut b[..]));
            assert_eq!(RmppRepr::parse(&RmppHeader::new_unchecked(&b[..])), Ok(r));
        }
        if let Ok(s) = SaRepr::parse(&SaPacket::new_unchecked(d)) {
            let mut b = [0u8; 256];
            s.emit(&mut SaPacket::new_unchecked(&mut b[..]));
            assert_eq!(SaRepr::parse(&SaPacket::new_unchecked(&b[..])), Ok(s));
            parsed[1] += 1;
        }
        if let Ok(p) = PathRecordRepr::parse_bytes(d) {
            assert_eq!(PathRecordRepr::parse_bytes(&p.to_bytes()), Ok(p));
            let _ = acm_path_comp_mask(&p);
            parsed[2] += 1;
        }
        if let Ok(m) = McMemberRepr::parse_bytes(d) {
            assert_eq!(McMemberRepr::parse_bytes(&m.to_bytes()), Ok(m));
            if let Ok(a) = AcmMgid::parse(&m.mgid) {
                assert_eq!(a.to_gid(), m.mgid);
            }
            parsed[3] += 1;
        }
        if let Ok(r) = AcmResolveRepr::parse(&AcmMad::new_unchecked(d)) {
            let mut b = [0u8; 256];
            r.emit(&mut AcmMad::new_unchecked(&mut b[..])).unwrap();
            assert_eq!(AcmResolveRepr::parse(&AcmMad::new_unchecked(&b[..])), Ok(r));
            parsed[4] += 1;
        }
        let m = AcmMsg::new_unchecked(d);
        if let Ok(r) = AcmMsgRepr::parse(&m) {
            let mut b = [0u8; MSG_LEN];
            let n = r.emit(&mut AcmMsg::new_unchecked(&mut b[..])).unwrap();
            assert_eq!(AcmMsgRepr::parse(&AcmMsg::new_unchecked(&b[..n])), Ok(r));
            parsed[5] += 1;
        }
        let mut out = [0u8; MSG_LEN];
        let path = PathRecordRepr {
            dlid: 6,
            ..PathRecordRepr::ZERO
        }
        .to_bytes();
        match m.check_resolve() {
            Ok(_) => {
                let n = build_resolve_response(&m, &path, &mut out).unwrap();
                let resp = AcmMsg::new_unchecked(&out[..n]);
                assert_eq!(resp.tid(), m.tid());
                assert_eq!(resp.entry_count(), Ok((n - HDR_LEN) / EP_LEN));
                parsed[6] += 1;
            }
            Err(_) => assert!(build_resolve_response(&m, &path, &mut out).is_err()),
        }
        let _ = build_error_response(&m, Status::Enodata, &mut out);
        if let Ok(p) = PerfResponseRepr::parse(&m) {
            let mut b = [0u8; MSG_LEN];
            let n = p.emit(&mut AcmMsg::new_unchecked(&mut b[..])).unwrap();
            assert_eq!(
                PerfResponseRepr::parse(&AcmMsg::new_unchecked(&b[..n])),
                Ok(p)
            );
            parsed[7] += 1;
        }
    }
    // The generator must actually reach every roundtrip branch, or this test proves nothing.
    for (i, n) in parsed.iter().enumerate() {
        assert!(*n > 100, "branch {i} parsed only {n} samples: {parsed:?}");
    }
}
