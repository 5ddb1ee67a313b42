#![no_main]
//! MAD common header, RMPP header and SA header: parse arbitrary bytes; whatever parses must
//! re-emit to bytes that parse to the same value.
use acm_core_nostd::wire::mad::{Header, HeaderRepr, RmppHeader, RmppRepr};
use acm_core_nostd::wire::sa::{SaPacket, SaRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = HeaderRepr::parse(&Header::new_unchecked(data)) {
        let mut b = [0u8; 24];
        h.emit(&mut Header::new_unchecked(&mut b[..]));
        assert_eq!(HeaderRepr::parse(&Header::new_unchecked(&b[..])), Ok(h));
        let _ = (
            h.status.busy(),
            h.status.invalid_field(),
            h.method.is_response(),
        );
    }
    if let Some(rest) = data.get(24..) {
        if let Ok(r) = RmppRepr::parse(&RmppHeader::new_unchecked(rest)) {
            let mut b = [0u8; 12];
            r.emit(&mut RmppHeader::new_unchecked(&mut b[..]));
            assert_eq!(RmppRepr::parse(&RmppHeader::new_unchecked(&b[..])), Ok(r));
        }
    }
    if let Ok(s) = SaRepr::parse(&SaPacket::new_unchecked(data)) {
        let mut b = [0u8; 256];
        s.emit(&mut SaPacket::new_unchecked(&mut b[..]));
        assert_eq!(SaRepr::parse(&SaPacket::new_unchecked(&b[..])), Ok(s));
    }
});
