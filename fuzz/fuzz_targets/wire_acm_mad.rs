#![no_main]
//! ibacm class 0x2C resolve MAD: parse → emit → parse is the identity; gid_cnt > 6 never
//! parses.
use acm_core_nostd::wire::acm_mad::{AcmMad, AcmResolveRepr, MAX_GIDS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let view = AcmMad::new_unchecked(data);
    if let Ok(r) = AcmResolveRepr::parse(&view) {
        assert!(r.gid_cnt as usize <= MAX_GIDS);
        let mut b = [0u8; 256];
        r.emit(&mut AcmMad::new_unchecked(&mut b[..])).unwrap();
        let again = AcmResolveRepr::parse(&AcmMad::new_unchecked(&b[..])).unwrap();
        assert_eq!(again, r);
    }
    if view.check_len().is_ok() {
        for i in 0..8 {
            let _ = view.gid(i);
        }
    }
});
