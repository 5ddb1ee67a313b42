//! Parses a path-record dump produced by real OpenSM 3.3.23 on the simulated fabric
//! `net.2sw2path4hca` (see docs/text.md for how the fixture was made).

use acm_core_nostd::text::dump_pr::{
    DumpPrLines, Event, LidEntry, LidTable, LocalPaths, LocalPort, NodeKind, LID_MCAST_START,
};

const DUMP: &[u8] = include_bytes!("fixtures/dump_pr_2sw2path4hca.txt");

/// (name, kind, port GUID, base LID) as OpenSM assigned them.
const NODES: [(&str, NodeKind, u64, u16); 6] = [
    ("Hca1", NodeKind::ChannelAdapter, 0x100001, 1),
    ("Switch1", NodeKind::Switch, 0x200000, 2),
    ("Switch2", NodeKind::Switch, 0x200001, 3),
    ("Hca2", NodeKind::ChannelAdapter, 0x100004, 4),
    ("Hca3", NodeKind::ChannelAdapter, 0x100007, 5),
    ("Hca4", NodeKind::ChannelAdapter, 0x10000a, 6),
];

fn guid_of(lid: u16) -> u64 {
    NODES.iter().find(|n| n.3 == lid).map(|n| n.2).unwrap()
}

#[test]
fn every_line_of_the_real_dump_parses() {
    let mut headers = Vec::new();
    let mut paths = 0;
    for ev in DumpPrLines::new(DUMP) {
        match ev.unwrap_or_else(|e| panic!("{e}")) {
            Event::Header(h) => headers.push(h),
            Event::Path(p) => {
                assert!((1..=6).contains(&p.dlid));
                assert_eq!(p.sl, 0);
                assert!(p.mtu == 3 || p.mtu == 4, "MTU enum 1024 or 2048");
                assert_eq!(p.rate, 3, "10 Gb/s");
                paths += 1;
            }
            Event::Unreachable { .. } => panic!("the fabric is fully connected"),
        }
    }
    assert_eq!(headers.len(), 6);
    assert_eq!(paths, 36);
    for (name, kind, guid, lid) in NODES {
        let h = headers
            .iter()
            .find(|h| h.guid == guid)
            .unwrap_or_else(|| panic!("no header for {name}"));
        assert_eq!((h.kind, h.lid, h.lmc), (kind, lid, None), "{name}");
        let port = if kind == NodeKind::Switch { 0 } else { 1 };
        assert_eq!(h.port, Some(port), "{name}");
    }
}

#[test]
fn local_paths_of_each_hca_match_with_both_tables() {
    let mut direct = vec![0u64; usize::from(LID_MCAST_START)];
    let mut sparse = [LidEntry::default(); 6];
    for (name, kind, guid, lid) in NODES {
        if kind != NodeKind::ChannelAdapter {
            continue;
        }
        let port = LocalPort { guid, lid };
        for table in [LidTable::Direct(&mut direct), LidTable::Sorted(&mut sparse)] {
            let mut errors = Vec::new();
            let paths: Vec<_> = LocalPaths::new(DUMP, port, table, |e| errors.push(e))
                .unwrap_or_else(|_| panic!("{name}: local section not found"))
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(errors.is_empty(), "{name}: {errors:?}");
            let dlids: Vec<u16> = paths.iter().map(|p| p.dlid).collect();
            assert_eq!(dlids, [1, 2, 3, 4, 5, 6], "{name}");
            for p in &paths {
                assert_eq!(p.guid, guid_of(p.dlid), "{name} -> {}", p.dlid);
                // OpenSM limits paths through the switches' management port to 1024 (enum 3).
                let to_switch = p.dlid == 2 || p.dlid == 3;
                assert_eq!(p.mtu, if to_switch { 3 } else { 4 }, "{name} -> {}", p.dlid);
            }
        }
    }
}

#[test]
fn wrong_lid_or_guid_is_not_the_local_port() {
    let mut t = vec![0u64; usize::from(LID_MCAST_START)];
    for port in [
        LocalPort {
            guid: 0x100001,
            lid: 4,
        },
        LocalPort {
            guid: 0x100002,
            lid: 1,
        },
    ] {
        assert!(LocalPaths::new(DUMP, port, LidTable::Direct(&mut t), |_| {}).is_err());
    }
}
