//! A dump of a large fabric: every unicast LID used, one big local section. Checks that both
//! LID-table kinds give identical answers and that nothing is quadratic.

use acm_core_nostd::text::dump_pr::{LidEntry, LidTable, LocalPaths, LocalPort, LID_MCAST_START};
use std::fmt::Write;
use std::time::Instant;

const NODES: u16 = LID_MCAST_START - 1; // LIDs 1..=0xBFFF
const LOCAL_LID: u16 = 0x1234;

fn guid(lid: u16) -> u64 {
    0x0002_c903_0000_0000 | u64::from(lid)
}

/// Headers in GUID order with LIDs scattered (as OpenSM writes them), the local port in the
/// middle with a path to every LID.
fn dump() -> String {
    let mut s = String::with_capacity(4 << 20);
    for i in 0..NODES {
        let lid = ((u32::from(i) * 7919) % u32::from(NODES)) as u16 + 1;
        writeln!(
            s,
            "Channel Adapter 0x{:016x}, base LID {lid}, \"n{lid}\", port 1",
            guid(lid)
        )
        .unwrap();
        writeln!(s, "# LID  : SL : MTU : RATE").unwrap();
        if lid == LOCAL_LID {
            for dlid in 1..=NODES {
                writeln!(s, "0x{dlid:04X} : {}  : 4   : 16  ", dlid % 16).unwrap();
            }
        }
        s.push('\n');
    }
    s
}

#[test]
fn all_unicast_lids_both_tables() {
    let text = dump();
    let port = LocalPort {
        guid: guid(LOCAL_LID),
        lid: LOCAL_LID,
    };
    let mut direct = vec![0u64; usize::from(LID_MCAST_START)];
    let mut sparse = vec![LidEntry::default(); usize::from(NODES)];
    let mut results = Vec::new();
    for table in [LidTable::Direct(&mut direct), LidTable::Sorted(&mut sparse)] {
        let start = Instant::now();
        let mut errors = 0;
        let paths: Vec<_> = LocalPaths::new(text.as_bytes(), port, table, |_| errors += 1)
            .expect("local section")
            .collect::<Result<_, _>>()
            .expect("no bad path lines");
        assert_eq!(errors, 0);
        assert_eq!(paths.len(), usize::from(NODES));
        for p in &paths {
            assert_eq!(p.guid, guid(p.dlid));
            assert_eq!(p.sl, (p.dlid % 16) as u8);
        }
        // Generous bound for a debug build on a busy 2-core machine; quadratic work would
        // take minutes.
        assert!(start.elapsed().as_secs() < 20, "{:?}", start.elapsed());
        results.push(paths);
    }
    assert_eq!(results[0], results[1]);
}
