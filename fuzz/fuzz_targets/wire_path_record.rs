#![no_main]
//! SA PathRecord: parse → emit → parse is the identity; the comp-mask helpers never panic.
use acm_core_nostd::wire::path_record::{acm_path_comp_mask, PathRecord, PathRecordRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = PathRecordRepr::parse(&PathRecord::new_unchecked(data)) {
        let b = p.to_bytes();
        assert_eq!(PathRecordRepr::parse_bytes(&b), Ok(p));
        // Only reserved bits may differ from the input.
        assert_eq!(b[..44], data[..44]);
        assert_eq!(b[45..58], data[45..58]);
        let _ = acm_path_comp_mask(&p);
    }
});
