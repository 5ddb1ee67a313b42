#![no_main]
//! SA MCMemberRecord and the ibacm MGID: parse → emit → parse is the identity.
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::mcmember::{AcmMgid, McMemberRecord, McMemberRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = McMemberRepr::parse(&McMemberRecord::new_unchecked(data)) {
        let b = m.to_bytes();
        assert_eq!(McMemberRepr::parse_bytes(&b), Ok(m));
        assert_eq!(b[..49], data[..49]);
        if let Ok(a) = AcmMgid::parse(&m.mgid) {
            assert_eq!(a.to_gid(), m.mgid);
        }
    }
    if let Some(g) = Gid::from_bytes(data) {
        if let Ok(a) = AcmMgid::parse(&g) {
            assert_eq!(AcmMgid::parse(&a.to_gid()), Ok(a));
        }
    }
});
