//! The node (`acm_core_nostd::node`) driven by hand: the resolver's SA MADs on the carrier's
//! QP to the SM with the channel's TIDs, replies only from the SM on the asking QP, the tries
//! and their wait, the carrier of another partition's endpoint, the core's transport (no
//! tables through it, a refused send), and the SM check.

use acm_core_nostd::cache::{ep_number, AddrSlot, CacheConfig, CacheWriter, PathCache, PathSlot};
use acm_core_nostd::node::{Event, Node, Output, SaConfig, Transport, Unsent, SM_CHECK_MS};
use acm_core_nostd::resolver::{
    AcmDest, Capacities, Config, EpConfig, EpId, HeapStorage, Kind, MsgBuf, RecvMeta, Request,
    Resolver,
};
use acm_core_nostd::sa_channel::{SaEntry, SmAddr, TableSlot, UNSENT_RETRY_MS};
use acm_core_nostd::wire::client::{ClientRequest, PathQuery, Status};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::path_record::PathRecord;
use std::sync::Arc;

type Cache = PathCache<Box<[PathSlot]>, Box<[AddrSlot]>>;
type TestNode = Node<HeapStorage, Arc<Cache>, Vec<SaEntry>, Vec<TableSlot<Vec<u8>>>, Vec<u8>>;

const SM: SmAddr = SmAddr { lid: 1, sl: 0 };
/// Endpoint A: port 4's default partition (its SA carrier).
const A: EpId = EpId(3);
/// Endpoint B: port 4, another partition (no SA on its own QP).
const B: EpId = EpId(4);
/// Endpoint C: port 5, the default partition.
const C: EpId = EpId(5);
const SUBNET_TIMEOUT: u64 = 100;

fn gid(port: u8) -> Gid {
    let mut g = [0u8; 16];
    g[..2].copy_from_slice(&[0xfe, 0x80]);
    g[15] = port;
    Gid(g)
}

fn ep(port: u8, pkey: u16, sa_pkey: bool) -> EpConfig {
    EpConfig {
        port_gid: gid(port),
        lid: u16::from(port),
        pkey,
        mtu: 4,
        rate: 3,
        subnet_timeout_ms: SUBNET_TIMEOUT,
        qpn: 0x40 + u32::from(port),
        sa_pkey,
    }
}

/// Routes by the SA only (no ACM groups, no Reports, no tables unless asked), one Get per
/// destination, the whole window at once.
fn config() -> Config {
    Config {
        addr_acm: false,
        sa_reports: false,
        sa_window_start: 4096,
        sa_table_min: 0,
        ..Config::default()
    }
}

struct T {
    n: TestNode,
    now: u64,
    out: Vec<Output>,
}

fn setup(cfg: Config, transport: Transport) -> T {
    let cache = PathCache::new(
        PathSlot::boxed(1024),
        AddrSlot::boxed(1024),
        CacheConfig::default(),
    )
    .unwrap();
    let writer = CacheWriter::take(Arc::new(cache)).unwrap();
    let r = Resolver::new(cfg, HeapStorage::new(Capacities::default()), writer, 7).unwrap();
    let tables = vec![TableSlot::new(vec![0u8; 64 * 64], Default::default())];
    T {
        n: Node::new(
            r,
            SaConfig::default().on(transport),
            vec![SaEntry::EMPTY; 64],
            tables,
            [3, 4],
        ),
        now: 0,
        out: Vec::new(),
    }
}

impl T {
    fn drain(&mut self) {
        let mut msg = MsgBuf::new();
        while let Some(o) = self.n.poll_output(self.now, &mut msg) {
            // What the caller does for a read of the SM address: the port says `SM`.
            if let Output::ReadSm { ep } = o {
                self.n.handle_sm(self.now, ep, ep_number(0, ep.0), Some(SM));
            }
            self.out.push(o);
        }
    }
    fn open(&mut self, id: EpId, cfg: EpConfig, sm: Option<SmAddr>) {
        let cep = ep_number(0, id.0);
        self.n.handle_open(self.now, id, cep, cfg, sm).unwrap();
        self.drain();
    }
    fn miss(&mut self, id: EpId, client: u64, lid: u16) {
        let msg = ClientRequest::path(client, 0, &PathQuery::lid(lid))
            .bytes()
            .to_vec();
        let req = Request::new(id, ep_number(0, id.0), client, Kind::Resolve, &msg);
        self.n.handle_request(self.now, &req);
        self.drain();
    }
    fn advance_to(&mut self, at: u64) {
        self.now = at;
        self.n.handle_timeout(at);
        self.drain();
    }
    /// The PathRecord Gets posted on a QP: (QP, destination, MAD, first-send token).
    fn gets(&mut self) -> Vec<(EpId, AcmDest, [u8; 256], Option<u64>)> {
        let mut v = Vec::new();
        self.out.retain(|o| match o {
            Output::Transmit { qp, to, mad, query } if mad[16..18] == [0x00, 0x35] => {
                v.push((*qp, *to, *mad, *query));
                false
            }
            _ => true,
        });
        v
    }
    fn answers(&mut self) -> Vec<(u64, Status)> {
        let mut v = Vec::new();
        self.out.retain(|o| match o {
            Output::Answer(a) => {
                v.push((a.client, a.status));
                false
            }
            _ => true,
        });
        v
    }
    fn done(&mut self) -> Vec<(u64, bool)> {
        let mut v = Vec::new();
        self.out.retain(|o| match o {
            Output::QueryDone { token, replied } => {
                v.push((*token, *replied));
                false
            }
            _ => true,
        });
        v
    }
    /// The SA's answer to the Get `wire` (a path to `lid`), arriving on `on`'s QP from
    /// `slid`'s QP `qp`.
    fn sa_reply(&mut self, on: EpId, slid: u16, qp: u32, wire: &[u8; 256], lid: u16) {
        let mut m = *wire;
        m[3] = 0x81;
        let mut rec = [0u8; 64];
        let mut p = PathRecord::new_unchecked(&mut rec[..]);
        p.set_dlid(lid);
        p.set_slid(4);
        p.set_sgid(gid(4));
        m[56..120].copy_from_slice(&rec);
        let meta = RecvMeta {
            slid,
            src_qp: qp,
            sl: 0,
            dlid_path_bits: 0,
            pkey_index: 0,
            ep_pkey_index: 0,
            grh_sgid: None,
        };
        self.n.handle_receive(self.now, on, &meta, &m);
        self.drain();
    }
}

fn to_sm(to: &AcmDest) -> bool {
    matches!(to, AcmDest::Unicast(av) if av.dlid == SM.lid && av.remote_qpn == 1)
}

#[test]
fn a_miss_leaves_on_its_own_qp_for_the_sm_and_the_reply_answers_it_once() {
    let mut t = setup(config(), Transport::Ud);
    t.open(A, ep(4, 0xffff, true), Some(SM));
    t.miss(A, 11, 6);
    let gets = t.gets();
    assert_eq!(gets.len(), 1, "{:?}", t.out);
    let (qp, to, wire, query) = gets[0];
    assert_eq!(qp, A);
    assert!(to_sm(&to), "{to:?}");
    let token = query.expect("a first send names its query");
    assert!(t.done().is_empty());
    // Not the SM's LID: forged, counted, nothing answered.
    t.sa_reply(A, 9, 1, &wire, 6);
    assert!(t.answers().is_empty() && t.done().is_empty());
    assert_eq!(t.n.sa().forged, 1);
    t.sa_reply(A, SM.lid, 1, &wire, 6);
    assert_eq!(t.answers(), vec![(11, Status::Success)]);
    assert_eq!(t.done(), vec![(token, true)]);
    // Again: answers nothing, counted as an unknown reply.
    t.sa_reply(A, SM.lid, 1, &wire, 6);
    assert!(t.answers().is_empty() && t.done().is_empty());
    assert_eq!(t.n.stats().sa_unknown, 1);
}

#[test]
fn an_unanswered_get_goes_again_after_each_try_then_fails_once() {
    let cfg = config();
    let sa = SaConfig::default();
    let per_try = sa.per_try(SUBNET_TIMEOUT as u32);
    let tries = u64::from(sa.tries);
    assert!(tries >= 2, "the ud transport tries more than once");
    let mut t = setup(cfg, Transport::Ud);
    t.open(A, ep(4, 0xffff, true), Some(SM));
    t.miss(A, 11, 6);
    let (_, _, wire, query) = t.gets()[0];
    let token = query.unwrap();
    for k in 1..tries {
        t.advance_to(k * per_try - 1);
        assert!(t.gets().is_empty(), "try {k} went early");
        t.advance_to(k * per_try);
        let again = t.gets();
        assert_eq!(again.len(), 1, "try {}", k + 1);
        assert_eq!(again[0].2, wire, "the same bytes, the same TID");
        assert_eq!(again[0].3, None, "a re-send starts no query");
        assert!(t.done().is_empty());
    }
    t.advance_to(tries * per_try);
    assert_eq!(t.done(), vec![(token, false)]);
    assert_eq!((t.n.sa().resends, t.n.sa().timeouts), (tries - 1, 1));
}

/// A query whose post found the QP busy goes again in `UNSENT_RETRY_MS`, that try spent; one
/// whose post failed outright waits its try out, as after a loss; when busy posts use up
/// the tries, the query fails once (the resolver's job then decides what its client gets). A
/// token not outstanding changes nothing.
#[test]
fn a_query_not_posted_goes_again_soon_if_busy_after_its_wait_if_failed_and_fails_once() {
    let cfg = config();
    let sa = SaConfig::default();
    let per_try = sa.per_try(SUBNET_TIMEOUT as u32);
    let tries = u64::from(sa.tries);
    assert!(per_try > 10 * UNSENT_RETRY_MS && tries >= 2);
    let mut t = setup(cfg, Transport::Ud);
    t.open(A, ep(4, 0xffff, true), Some(SM));
    t.miss(A, 11, 6);
    let (_, _, wire, query) = t.gets()[0];
    let token = query.unwrap();
    t.n.handle_unsent(t.now, token, Unsent::Busy);
    t.drain();
    t.advance_to(UNSENT_RETRY_MS - 1);
    assert!(t.gets().is_empty(), "not before the retry");
    t.advance_to(UNSENT_RETRY_MS);
    let again = t.gets();
    assert_eq!(again.len(), 1, "busy: again at once");
    assert_eq!(again[0].2, wire, "the same bytes, the same TID");
    assert_eq!(
        (t.n.sa().resends, t.n.sa().unsent),
        (1, 1),
        "the try was spent"
    );
    // Failed outright: nothing sooner than the try's wait.
    t.n.handle_unsent(t.now, token, Unsent::Failed);
    t.advance_to(UNSENT_RETRY_MS + per_try - 1);
    assert!(t.gets().is_empty(), "failed: the try stands");
    t.advance_to(UNSENT_RETRY_MS + per_try);
    assert_eq!(t.gets().len(), 1);
    // Three sends so far; busy until the tries are gone: it fails once.
    let mut at = t.now;
    for _ in 3..tries {
        t.n.handle_unsent(at, token, Unsent::Busy);
        at += UNSENT_RETRY_MS;
        t.advance_to(at);
        assert_eq!(t.gets().len(), 1);
    }
    t.n.handle_unsent(at, token, Unsent::Busy);
    t.advance_to(at + UNSENT_RETRY_MS);
    assert!(t.gets().is_empty());
    assert_eq!(t.done(), vec![(token, false)]);
    assert_eq!(t.n.sa().timeouts, 1);
    // Gone: another unsent of it is ignored.
    let unsent = t.n.sa().unsent;
    t.n.handle_unsent(t.now, token, Unsent::Busy);
    t.drain();
    assert_eq!(t.n.sa().unsent, unsent);
    assert!(t.done().is_empty());
}

/// A Report from the SM is acknowledged on the endpoint's QP to the SM's QP 1; the
/// ReportResp is a response, no query: nothing completes it (no `query` token, no
/// `QueryDone`).
#[test]
fn a_reports_ack_is_a_response_not_a_query() {
    let cfg = Config {
        sa_reports: true,
        ..config()
    };
    let mut t = setup(cfg, Transport::Ud);
    t.open(A, ep(4, 0xffff, true), Some(SM));
    t.out.clear();
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 3, 2, 0x06]);
    m[8..16].copy_from_slice(&0x1234_5678_9abc_def0u64.to_be_bytes());
    m[16..18].copy_from_slice(&acm_core_nostd::wire::sa::attr::NOTICE.to_be_bytes());
    t.n.handle_receive(t.now, A, &SM.recv_meta(), &m);
    t.drain();
    let acks: Vec<_> = t
        .out
        .iter()
        .filter_map(|o| match o {
            Output::Transmit { qp, to, mad, query } if mad[3] == 0x86 => {
                Some((*qp, *to, *query, mad[8..16].to_vec()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(acks.len(), 1, "{:?}", t.out);
    let (qp, to, query, tid) = &acks[0];
    assert_eq!((*qp, to_sm(to)), (A, true));
    assert_eq!(*query, None, "a response is no query");
    assert_eq!(
        tid[..],
        0x1234_5678_9abc_def0u64.to_be_bytes(),
        "the Report's TID"
    );
    assert!(t.done().is_empty());
}

#[test]
fn another_partitions_endpoint_sends_through_its_ports_carrier_and_hears_on_it() {
    let mut t = setup(config(), Transport::Ud);
    t.open(A, ep(4, 0xffff, true), Some(SM));
    t.open(B, ep(4, 0x8002, false), Some(SM));
    t.miss(B, 21, 6);
    let (qp, to, wire, _) = t.gets()[0];
    assert_eq!(qp, A, "port 4's default-partition QP carries B's SA MADs");
    assert!(to_sm(&to));
    // The reply on B's own QP did not come back the way the query went.
    t.sa_reply(B, SM.lid, 1, &wire, 6);
    assert!(t.answers().is_empty());
    assert_eq!(t.n.sa().forged, 1);
    t.sa_reply(A, SM.lid, 1, &wire, 6);
    assert_eq!(t.answers(), vec![(21, Status::Success)]);
}

#[test]
fn an_endpoint_with_no_carrier_or_no_sm_uses_the_cores_service() {
    let mut t = setup(config(), Transport::Ud);
    // Port 5 has only another partition's endpoint: no carrier.
    t.open(B, ep(5, 0x8002, false), Some(SM));
    t.miss(B, 31, 6);
    assert!(t.gets().is_empty());
    assert!(
        t.out.iter().any(
            |o| matches!(o, Output::CoreSa { ep, mad, .. } if *ep == B && mad[16..18] == [0, 0x35])
        ),
        "{:?}",
        t.out
    );
    // Port 4's carrier knows no SM yet.
    let mut t = setup(config(), Transport::Ud);
    t.open(A, ep(4, 0xffff, true), None);
    t.out.clear();
    t.miss(A, 32, 6);
    assert!(t
        .out
        .iter()
        .any(|o| matches!(o, Output::CoreSa { ep, .. } if *ep == A)));
}

#[test]
fn the_core_transport_refuses_tables_and_a_refused_send_fails_the_query() {
    let cfg = Config {
        sa_table_min: 2,
        ..config()
    };
    let mut t = setup(cfg, Transport::Core);
    t.open(A, ep(4, 0xffff, true), Some(SM));
    for (i, lid) in (6..12).enumerate() {
        t.miss(A, 40 + i as u64, lid);
    }
    let core: Vec<(u64, [u8; 256])> = t
        .out
        .iter()
        .filter_map(|o| match o {
            Output::CoreSa { token, mad, .. } => Some((*token, *mad)),
            _ => None,
        })
        .collect();
    assert!(!core.is_empty());
    assert!(
        core.iter()
            .all(|(_, m)| m[3] == 0x01 && m[16..18] == [0, 0x35]),
        "only Gets through the core's service"
    );
    assert!(t.out.iter().all(|o| !matches!(o, Output::Transmit { .. })));
    assert_eq!(t.n.resolver().stats().sa_table_failed, 0);
    // The core refuses the first: its client is answered at once (not after the deadline),
    // and it is not counted as lost by the SA.
    t.out.clear();
    let lost = t.n.stats().sa_lost;
    t.n.handle_unsent(t.now, core[0].0, Unsent::Refused);
    t.drain();
    assert_eq!(t.answers(), vec![(40, Status::Etimedout)]);
    assert_eq!(t.n.stats().sa_lost, lost);
}

#[test]
fn the_sm_is_read_every_check_and_a_new_one_rejoins_only_its_port() {
    let cfg = Config {
        addr_acm: true,
        ..config()
    };
    let mut t = setup(cfg, Transport::Ud);
    t.open(A, ep(4, 0xffff, true), Some(SM));
    t.open(C, ep(5, 0xffff, true), Some(SM));
    t.advance_to(0);
    let reads = |out: &[Output]| {
        out.iter()
            .filter_map(|o| match o {
                Output::ReadSm { ep } => Some(*ep),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(reads(&t.out), vec![A, C]);
    t.out.clear();
    t.advance_to(SM_CHECK_MS - 1);
    assert!(
        reads(&t.out).is_empty(),
        "read again before the check is due"
    );
    // Port 5's SM moved to LID 7.
    t.now = SM_CHECK_MS;
    t.n.handle_timeout(t.now);
    let moved = SmAddr { lid: 7, sl: 0 };
    let (mut read, mut msg) = (Vec::new(), MsgBuf::new());
    while let Some(o) = t.n.poll_output(t.now, &mut msg) {
        if let Output::ReadSm { ep } = o {
            read.push(ep);
            let sm = if ep == C { moved } else { SM };
            t.n.handle_sm(t.now, ep, ep_number(0, ep.0), Some(sm));
        }
        t.out.push(o);
    }
    assert_eq!(read, vec![A, C]);
    let events: Vec<Event> = t
        .out
        .iter()
        .filter_map(|o| match o {
            Output::Event(e) => Some(*e),
            _ => None,
        })
        .collect();
    assert_eq!(
        events,
        vec![Event::SmChanged {
            ep: C,
            old: SM,
            new: moved
        }]
    );
    // C joins its group again at the new SM; A sends nothing.
    let joins: Vec<(EpId, AcmDest)> = t
        .out
        .iter()
        .filter_map(|o| match o {
            Output::Transmit { qp, to, mad, .. } if mad[16..18] == [0x00, 0x38] => Some((*qp, *to)),
            _ => None,
        })
        .collect();
    assert!(!joins.is_empty(), "{:?}", t.out);
    for (qp, to) in joins {
        assert_eq!(qp, C);
        assert!(matches!(to, AcmDest::Unicast(av) if av.dlid == 7 && av.remote_qpn == 1));
    }
}

#[test]
fn the_transport_limits_what_the_resolver_asks_for_and_is_the_nodes() {
    let cfg = Config {
        sa_reports: true,
        sa_window: 12,
        sa_table_min: 2,
        ..config()
    };
    let core = SaConfig {
        core_depth: 3,
        ..SaConfig::default()
    }
    .on(Transport::Core);
    let mut t = setup(cfg, Transport::Ud);
    let asked = |c: &Config| (c.sa_tables, c.sa_reports, c.sa_window);
    assert_eq!(
        asked(t.n.resolver().config()),
        (true, true, 12),
        "ud carries it all"
    );
    // The same resolver moved into a node on the core's service: its window is the core's
    // `sa_depth`, and it neither asks for tables nor subscribes to Reports.
    let (r, sa) = t.n.into_parts();
    t.n = Node::from_parts(r, sa, core);
    assert_eq!(asked(t.n.resolver().config()), (false, false, 3));
    t.open(A, ep(4, 0xffff, true), Some(SM));
    for (i, lid) in (6..16).enumerate() {
        t.miss(A, 60 + i as u64, lid);
    }
    let sent: Vec<[u8; 256]> = t
        .out
        .iter()
        .filter_map(|o| match o {
            Output::CoreSa { mad, .. } => Some(*mad),
            _ => None,
        })
        .collect();
    assert_eq!(
        sent.len(),
        3,
        "the core's 3 at once, the rest wait in the resolver"
    );
    assert!(
        sent.iter().all(|m| m[3] == 0x01 && m[16..18] == [0, 0x35]),
        "Gets only"
    );
    // And back on `ud`, before anything went out there, what it asked for again.
    let (r, sa) = t.n.into_parts();
    t.n = Node::from_parts(r, sa, SaConfig::default());
    assert_eq!(asked(t.n.resolver().config()), (true, true, 12));
}

#[test]
fn the_queries_a_closing_carrier_carried_go_on_at_once_through_the_cores_service() {
    // One Get at a time: the backlog asks for B's half-world table (room for any subnet:
    // no probe first).
    let cfg = Config {
        sa_table_min: 2,
        sa_table_room: 0xc000,
        sa_window: 1,
        sa_window_start: 1,
        ..config()
    };
    let mut t = setup(cfg, Transport::Ud);
    t.open(A, ep(4, 0xffff, true), Some(SM));
    t.open(B, ep(4, 0x8002, false), Some(SM));
    for (i, lid) in (6..12).enumerate() {
        t.miss(B, 20 + i as u64, lid);
    }
    // The window's Get, and B's half-world table, both on A's QP.
    let sent = t.gets();
    assert!(sent.iter().all(|g| g.0 == A), "on A's QP");
    let (gets, tables): (Vec<_>, Vec<_>) = sent.into_iter().partition(|g| g.2[3] == 0x01);
    assert_eq!((gets.len(), tables.len()), (1, 1), "{gets:?} {tables:?}");
    let (_, _, wire, token) = gets[0];
    let (token, table) = (token.unwrap(), tables[0].3.unwrap());
    t.out.clear();
    let out = t.n.sa().len();
    t.n.handle_close(t.now, A);
    t.drain();
    assert_eq!(t.n.sa().moved, out as u64, "every request B had out moved");
    assert_eq!(t.n.sa().len(), 0, "none waits on a QP that is gone");
    assert!(
        t.out.iter().all(|o| !matches!(o, Output::Transmit { .. })),
        "nothing more on A's QP: {:?}",
        t.out
    );
    // B's Gets go on at once through the core's service, under their tokens, as the resolver
    // wrote them (its own TIDs, not the channel's wire TIDs).
    let core: Vec<(EpId, u64, [u8; 256])> = t
        .out
        .iter()
        .filter_map(|o| match o {
            Output::CoreSa {
                ep,
                token,
                mad,
                moved: true,
            } => Some((*ep, *token, *mad)),
            _ => None,
        })
        .collect();
    assert_eq!(core.len(), gets.len(), "{:?}", t.out);
    assert!(core.iter().all(|c| c.0 == B && c.2[3] == 0x01));
    let (_, _, mad) = *core.iter().find(|c| c.1 == token).expect("the first Get");
    assert_eq!(mad[16..], wire[16..], "the same query");
    assert_ne!(mad[8..16], wire[8..16], "with the resolver's TID");
    // The table, which the core's service cannot carry, is refused and done at once.
    assert!(t.done().contains(&(table, false)));
    // The core's reply answers the client once.
    let mut reply = mad;
    reply[3] = 0x81;
    let mut p = PathRecord::new_unchecked(&mut reply[56..120]);
    p.set_dlid(6);
    p.set_slid(4);
    p.set_sgid(gid(4));
    t.out.clear();
    t.n.handle_core_sa(t.now, token, 0, &reply);
    t.drain();
    assert_eq!(t.answers(), vec![(20, Status::Success)]);
    assert_eq!(t.n.stats().sa_unknown, 0);
}
