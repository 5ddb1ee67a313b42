#![no_main]
//! Fuzzes the OpenSM `dump_pr` parser and the two-pass local-path helper with both table kinds.
use acm_core_nostd::text::dump_pr::{
    is_header_line, DumpPrLines, Event, LidEntry, LidTable, LocalPaths, LocalPort, LID_MCAST_START,
};
use acm_core_nostd::text::{ErrorKind, Lines};
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;

thread_local! {
    // The full-size direct table (384 KiB) is reused: allocating it per input costs page faults
    // that dominated the run time.
    static DIRECT: RefCell<Vec<u64>> = RefCell::new(vec![0u64; usize::from(LID_MCAST_START)]);
}

fuzz_target!(|data: &[u8]| {
    let lines: Vec<&[u8]> = Lines::new(data).map(|l| l.bytes).collect();
    // A path event must follow a header that parsed, with no bad header in between.
    let mut in_section = false;
    let mut first_header = None;
    for ev in DumpPrLines::new(data) {
        match ev {
            Ok(Event::Header(h)) => {
                in_section = true;
                assert!(h.lid != 0 && h.guid != 0);
                first_header.get_or_insert(h);
            }
            Ok(Event::Path(p)) => {
                assert!(in_section && p.sl <= 15 && (1..=5).contains(&p.mtu) && p.dlid != 0)
            }
            Ok(Event::Unreachable { .. }) => assert!(in_section),
            Err(e) => {
                let bytes = lines[e.line as usize - 1];
                if is_header_line(bytes) {
                    in_section = false;
                } else {
                    assert_eq!(e.kind == ErrorKind::PathOutsideSection, !in_section);
                }
            }
        }
    }
    let Some(h) = first_header else { return };
    let port = LocalPort {
        guid: h.guid,
        lid: h.lid,
    };
    DIRECT.with_borrow_mut(|direct| check_local_paths(data, port, direct));
});

fn check_local_paths(data: &[u8], port: LocalPort, direct: &mut [u64]) {
    let mut sparse = [LidEntry::default(); 16];
    let mut small = [0u64; 8];
    let a: Vec<_> = match LocalPaths::new(data, port, LidTable::Direct(direct), |_| {}) {
        Ok(p) => p.collect(),
        Err(_) => return,
    };
    for r in a.iter().flatten() {
        assert!(r.guid != 0 && r.dlid < LID_MCAST_START);
    }
    // Same section with the other tables: same number of lines, and paths agree where both
    // tables hold the destination.
    for table in [LidTable::Sorted(&mut sparse), LidTable::Direct(&mut small)] {
        let b: Vec<_> = LocalPaths::new(data, port, table, |_| {})
            .expect("the local section exists")
            .collect();
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            if let (Ok(x), Ok(y)) = (x, y) {
                assert_eq!(x, y);
            }
        }
    }
}
