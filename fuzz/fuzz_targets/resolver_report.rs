#![no_main]
//! SA Reports into a live node: received MADs through `Node::handle_receive`, so through the
//! SA channel's sender check (`sa_channel.rs`) to the resolver's `handle_report`
//! (`resolver/inform.rs`) and out again as the node's `Output::Transmit`.
//!
//! A 4-node [`Sim`] (the `sim` feature's in-memory fabric and SA, its nodes `Node`s on the `ud`
//! transport) where node 0 has learned names (ACM: learned address mappings and their routes),
//! routes by LID and by GID (SA), a negative entry (a LID nobody has), and subscribes to traps
//! 64/65. The input is a sequence of steps, each an op byte and its operands:
//!
//! * op & 3 != 2: a class 3 MAD received on node 0's endpoint. The next up to 256 bytes are
//!   the MAD (zero-padded at the end of the input; byte 1, the class, is 3). Bit 2 makes its
//!   header a REPORT(Notice) (base 1, class 3, version 2, method 0x06, attribute 0x0002), bit
//!   3 its notice a generic trap 64 (bit 4 clear) or 65 about node (bits 5–6)'s GID. It comes
//!   from the SM's address (`SmAddr::recv_meta`: the SM's LID, QP 1), unless bit 7 is set:
//!   then from a node's LID (op & 3 == 0), from the SM's LID but another QP (1), or on an
//!   endpoint never opened, whose port's SM the node does not know (3). The R bit is the
//!   input's, but is cleared while node 0's SA channel follows a query or a table (so that a
//!   reply names nothing outstanding). Checked:
//!   - not from the SM: refused as forged (`SaChannel::forged` + 1), nothing output, no
//!     counter of the resolver moved, the cache unchanged;
//!   - from the SM with the R bit: an unknown reply (`SaChannel::unknown` + 1, so
//!     `Node::stats().sa_unknown` + 1), nothing else, as above;
//!   - from the SM without it: exactly one of `Stats::reports` / `Stats::report_malformed`
//!     goes up by one: `reports` iff the endpoint is open and the MAD parses as an SA MAD and
//!     is a REPORT of a Notice;
//!   - a Report is acknowledged, once, and nothing else is output but its `Event::Report`
//!     (trap, GID, entries invalidated): a ReportResp (class 3, method 0x86, attribute
//!     Notice) with the Report's TID and notice bytes, as an `Output::Transmit` on the
//!     endpoint's own QP to the SM's QP 1, no query of its own; a refused MAD outputs nothing;
//!   - the cache, looked up for every key node 0 may hold (LIDs and GIDs of all nodes, the
//!     unknown LID, the names), is unchanged, except: after a generic trap 65 about GID `g`
//!     nothing answers a path to `g` (each such hit became a miss), and after trap 64 the same
//!     and every negative path entry is gone;
//!   - `Resolver::check_invariants` holds.
//! * op & 3 == 2: housekeeping by (op >> 2) & 7, with an operand byte: time passes (0–2: up
//!   to ~5 s of simulated time, so subscription retries and negative entries expire), a
//!   request by name (3), LID (4) or GID (5) from node 0, a CLIENT_REREGISTER (6), close or
//!   reopen node 0's endpoint (7). After each, the simulation's own checks (every resolver's
//!   invariants, one answer per request) must have found nothing.
use acm_core_nostd::cache::{AddrKey, Dest, Lookup, PathKey};
use acm_core_nostd::node::{Event, Output};
use acm_core_nostd::resolver::{Capacities, Config, EpId, Kind, MsgBuf};
use acm_core_nostd::rmpp;
use acm_core_nostd::sim::{gid_msg, lid_msg, name_msg, node_gid, node_lid, Sim, SimConfig, EP, SM};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::inform::{NoticeRepr, NOTICE_LEN};
use acm_core_nostd::wire::mad::{Method, MAD_LEN};
use acm_core_nostd::wire::sa::{attr, SaPacket, SaRepr, DATA_OFFSET};
use libfuzzer_sys::fuzz_target;

const NODES: usize = 4;
/// A LID no node has: the SA answers "no record", cached as a negative entry.
const NO_LID: u16 = 0x99;

struct Input<'a>(&'a [u8]);
impl<'a> Input<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
}

fn setup() -> Sim {
    let mut cfg = SimConfig::new(NODES, 7);
    cfg.resolver = Config {
        sa_reports: true,
        ..Config::default()
    };
    // Small tables: `check_invariants` (run on every node after every step) is O(tables),
    // and a few slots are all node 0 needs; a full table is a case worth fuzzing too.
    cfg.caps = Capacities {
        requests: 32,
        answer_reserve: 4,
        jobs: 16,
        sa_inflight: 16,
        addrs: 16,
        endpoints: 2,
        preloads: 2,
    };
    cfg.cache_slots = 64;
    let mut s = Sim::new(cfg);
    // The endpoints join their groups first (names resolve only then).
    s.run_for(100);
    s.request(0, Kind::Resolve, |t| name_msg("node1", None, false, t));
    s.request(0, Kind::Resolve, |t| name_msg("node2", None, false, t));
    s.request(0, Kind::Resolve, |t| lid_msg(node_lid(3), false, t));
    s.request(0, Kind::Resolve, |t| gid_msg(node_gid(2), false, t));
    s.request(0, Kind::Resolve, |t| lid_msg(NO_LID, false, t));
    s.run_for(100);
    assert!(s.violations.is_empty(), "{:?}", s.violations);
    // The checks below are only worth something if node 0 holds all of this.
    let now = s.now;
    let n = &s.nodes[0];
    let cep = n.cache_ep(EP);
    let hit = |l: Lookup| matches!(l, Lookup::Hit { .. });
    assert!(hit(n
        .cache
        .lookup_addr(&AddrKey::name(cep, "node1").unwrap(), now)));
    assert!(hit(n
        .cache
        .lookup_addr(&AddrKey::name(cep, "node2").unwrap(), now)));
    assert!(hit(n
        .cache
        .lookup(&PathKey::new(cep, Dest::Lid(node_lid(3))), now)));
    assert!(hit(n
        .cache
        .lookup(&PathKey::new(cep, Dest::Gid(node_gid(2).0)), now)));
    assert!(matches!(
        n.cache.lookup(&PathKey::new(cep, Dest::Lid(NO_LID)), now),
        Lookup::Negative { .. }
    ));
    s
}

/// What node 0's cache answers for every key it may hold: (is a path key, answer).
fn snapshot(s: &Sim) -> Vec<(bool, Lookup)> {
    let n = &s.nodes[0];
    let cep = n.cache_ep(EP);
    let mut v = Vec::new();
    for i in 0..NODES {
        for d in [Dest::Lid(node_lid(i)), Dest::Gid(node_gid(i).0)] {
            v.push((true, n.cache.lookup(&PathKey::new(cep, d), s.now)));
        }
        let name = format!("node{i}");
        let k = AddrKey::name(cep, &name).unwrap();
        v.push((false, n.cache.lookup_addr(&k, s.now)));
    }
    v.push((
        true,
        n.cache.lookup(&PathKey::new(cep, Dest::Lid(NO_LID)), s.now),
    ));
    v
}

/// The DGID of a cached PathRecord (bytes 8..24).
fn dgid(record: &[u8; 64]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g.copy_from_slice(&record[8..24]);
    g
}

/// What the resolver must make of the class 3 request `mad` from the SM on an endpoint that
/// is open (`ep_open`): a Report (TID, notice, notice bytes), or `None` (counted malformed).
fn expected(mad: &[u8; MAD_LEN], ep_open: bool) -> Option<(u64, NoticeRepr, [u8; NOTICE_LEN])> {
    if !ep_open {
        return None;
    }
    let sa = SaRepr::parse(&SaPacket::new_unchecked(&mad[..])).ok()?;
    if sa.header.method != Method::Report || sa.header.attr_id != attr::NOTICE {
        return None;
    }
    let mut raw = [0u8; NOTICE_LEN];
    raw.copy_from_slice(&mad[DATA_OFFSET..DATA_OFFSET + NOTICE_LEN]);
    Some((sa.header.tid, NoticeRepr::parse_bytes(&raw).ok()?, raw))
}

/// How the SA channel must take a MAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Not from the SM of the endpoint's port (its LID, QP 1): `SaChannel::forged`.
    Forged,
    /// A reply (R bit) naming nothing outstanding: `SaChannel::unknown`.
    Unknown,
    /// A request from the SM: the resolver's `handle_report`.
    Report,
}

fn report(s: &mut Sim, op: u8, bytes: &[u8]) {
    let mut buf = [0u8; MAD_LEN];
    buf[..bytes.len()].copy_from_slice(bytes);
    // The node hands only class 3 to the SA channel (anything else is ACM).
    buf[1] = 3;
    if op & 0x04 != 0 {
        buf[..4].copy_from_slice(&[1, 3, 2, 0x06]);
        buf[16..18].copy_from_slice(&attr::NOTICE.to_be_bytes());
    }
    if op & 0x08 != 0 {
        let trap: u16 = if op & 0x10 != 0 { 65 } else { 64 };
        let n = &mut buf[DATA_OFFSET..DATA_OFFSET + NOTICE_LEN];
        n[0] |= 0x80;
        n[4..6].copy_from_slice(&trap.to_be_bytes());
        n[16..32].copy_from_slice(&node_gid(usize::from(op >> 5) & 3).0);
    }
    // A reply (R bit) only while node 0's channel follows nothing, so that it names nothing
    // (a reply to a live query is the sa_channel target's); else it goes as a request.
    let sa = s.nodes[0].node.sa();
    let following = !sa.is_empty()
        || sa
            .table_slots()
            .iter()
            .any(|t| t.receiver().state() != rmpp::State::Idle);
    if following {
        buf[3] &= 0x7f;
    }
    // Bit 7: not the SM on node 0's endpoint: from a node's LID (op & 3 == 0), from the SM's
    // LID but not QP 1 (1), or on an endpoint never opened, whose port's SM is not known (3).
    let mut meta = SM.recv_meta();
    let mut ep = EP;
    let fate = if op & 0x80 != 0 {
        match op & 3 {
            0 => meta.slid = node_lid(usize::from(op >> 5) & 3),
            1 => meta.src_qp = 0x48 + u32::from(op >> 5),
            _ => ep = EpId(2),
        }
        Fate::Forged
    } else if buf[3] & 0x80 != 0 {
        Fate::Unknown
    } else {
        Fate::Report
    };
    let want = expected(&buf, s.nodes[0].first().open);
    let before = snapshot(s);
    let now = s.now;
    let n = &mut s.nodes[0].node;
    let (stats, forged, unknown) = (n.stats(), n.sa().forged, n.sa().unknown);
    n.handle_receive(now, ep, &meta, &buf);
    let mut acks = Vec::new();
    let mut events = Vec::new();
    let mut msg = MsgBuf::new();
    while let Some(o) = n.poll_output(now, &mut msg) {
        match o {
            Output::Transmit {
                qp, to, mad, query, ..
            } if mad[3] == 0x86 => acks.push((qp, to, mad, query)),
            Output::Event(e) => events.push(e),
            other => panic!("a Report made the node output {other:?}"),
        }
    }
    let after_stats = n.stats();
    let counted = (n.sa().forged - forged, n.sa().unknown - unknown);
    if let Err(e) = n.resolver().check_invariants() {
        panic!("after a Report: {e}");
    }
    let after = snapshot(s);
    if fate != Fate::Report {
        let want = if fate == Fate::Forged { (1, 0) } else { (0, 1) };
        assert_eq!(counted, want, "{fate:?}: (forged, unknown) counted");
        let mut expect = stats;
        expect.sa_unknown += want.1;
        expect.sa_forged += want.0;
        assert_eq!(
            after_stats, expect,
            "{fate:?}: the resolver's counters moved"
        );
        assert!(acks.is_empty() && events.is_empty(), "{fate:?}: output");
        assert_eq!(before, after, "{fate:?}: the cache changed");
        return;
    }
    assert_eq!(
        counted,
        (0, 0),
        "the SM's request counted as forged or unknown"
    );
    let Some((tid, notice, raw)) = want else {
        assert_eq!(after_stats.report_malformed, stats.report_malformed + 1);
        assert_eq!(after_stats.reports, stats.reports);
        assert!(acks.is_empty(), "a refused MAD was acknowledged");
        assert!(events.is_empty(), "a refused MAD was logged as a Report");
        assert_eq!(after_stats.report_invalidated, stats.report_invalidated);
        assert_eq!(before, after, "a refused MAD changed the cache");
        return;
    };
    assert_eq!(after_stats.reports, stats.reports + 1);
    assert_eq!(after_stats.report_malformed, stats.report_malformed);
    assert_eq!(acks.len(), 1, "a Report is acknowledged once");
    let (ack_qp, ack_to, ack, query) = acks[0];
    assert_eq!(ack_qp, EP, "the ReportResp leaves on the endpoint's own QP");
    assert_eq!(ack_to, SM.dest(), "the ReportResp goes to the SM's QP 1");
    assert!(query.is_none(), "a response is no query: {query:?}");
    let sa = SaRepr::parse(&SaPacket::new_unchecked(&ack[..])).expect("ReportResp parses");
    assert_eq!(sa.header.method, Method::ReportResp);
    assert_eq!(sa.header.attr_id, attr::NOTICE);
    assert_eq!(sa.header.tid, tid, "the Report's own TID");
    assert_eq!(
        ack[DATA_OFFSET..DATA_OFFSET + NOTICE_LEN],
        raw,
        "the Report's notice"
    );
    let invalidated = after_stats.report_invalidated - stats.report_invalidated;
    let logged = Event::Report {
        ep: EP,
        trap: notice.trap,
        gid: notice.subject_gid().map_or(Gid::ZERO, Gid),
        invalidated,
    };
    assert_eq!(events, [logged], "one Report event");
    let gone = match (notice.subject_gid(), notice.trap) {
        (Some(g), 65) => Some((g, false)),
        (Some(g), 64) => Some((g, true)),
        _ => None,
    };
    let Some((g, negatives)) = gone else {
        assert_eq!(after_stats.report_invalidated, stats.report_invalidated);
        assert_eq!(
            before, after,
            "a Report about nothing we subscribe to changed the cache"
        );
        return;
    };
    for ((path, b), (_, a)) in before.iter().zip(&after) {
        match (b, a) {
            (Lookup::Hit { record, .. }, _) if dgid(record) == g => {
                assert_eq!(
                    *a,
                    Lookup::Miss,
                    "a route to the GID of trap {} stayed",
                    notice.trap
                )
            }
            (Lookup::Negative { .. }, _) if negatives && *path => {
                assert_eq!(*a, Lookup::Miss, "trap 64 left a negative path entry")
            }
            // An address entry over a negative path entry may lose it with the path.
            (Lookup::Negative { .. }, Lookup::Miss) if negatives => {}
            _ => assert_eq!(a, b, "an entry not about {g:02x?} changed"),
        }
    }
    if let Some((_, Lookup::Hit { record, .. })) = after.iter().find(|(_, a)| match a {
        Lookup::Hit { record, .. } => dgid(record) == g,
        _ => false,
    }) {
        panic!("still a route to {g:02x?}: {record:02x?}");
    }
}

fn housekeeping(s: &mut Sim, op: u8, arg: u8) {
    let i = usize::from(arg) % NODES;
    match (op >> 2) & 7 {
        0..=2 => s.run_for(1 + u64::from(arg) * 20),
        3 => {
            let name = format!("node{i}");
            s.request(0, Kind::Resolve, |t| {
                name_msg(&name, None, arg & 0x80 != 0, t)
            });
        }
        4 => {
            let lid = if arg & 0x40 != 0 { NO_LID } else { node_lid(i) };
            s.request(0, Kind::Resolve, |t| lid_msg(lid, arg & 0x80 != 0, t));
        }
        5 => {
            s.request(0, Kind::Resolve, |t| {
                gid_msg(node_gid(i), arg & 0x80 != 0, t)
            });
        }
        6 => s.reregister(0),
        _ => {
            if s.nodes[0].first().open {
                s.close(0);
            } else {
                s.open(0);
            }
        }
    }
    // Let what the step started finish (ACM and SA round trips are 1 ms in the model).
    s.run_for(10);
    assert!(s.violations.is_empty(), "{:?}", s.violations);
}

fuzz_target!(|data: &[u8]| {
    let mut s = setup();
    let mut input = Input(data);
    while let Some(op) = input.byte() {
        if op & 3 == 2 {
            let arg = input.byte().unwrap_or(0);
            housekeeping(&mut s, op, arg);
        } else {
            let mad = input.take(MAD_LEN);
            report(&mut s, op, mad);
        }
    }
    s.check_all();
    assert!(s.violations.is_empty(), "{:?}", s.violations);
});
