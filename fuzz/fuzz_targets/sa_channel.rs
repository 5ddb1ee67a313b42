#![no_main]
//! The SA channel (`acm_core_nostd::sa_channel`) and its RMPP receivers through the node
//! (`acm_core_nostd::node::Node`, docs/node.md), driven by arbitrary scripts: client requests
//! become SA Gets (and, with a backlog, half-world GetTables answered over RMPP); the script
//! plays the SM and everyone else, delivering real answers and segments to
//! `Node::handle_receive` in any order, with bytes overwritten, from the SM, from the SM that
//! was, from another LID or from the SM's LID but not QP 1, on the endpoint that carries the
//! query (the carrier rule) or not, with TIDs handed out or not, whole tables and truncated
//! ones (a record cut, a segment left out), plus clock jumps (`handle_timeout`), endpoints
//! closed and reopened, an SM that moves, and the core's SA service completing what went
//! through it.
//!
//! Three endpoints: A (port 1, default partition: it carries its port's SA MADs), B (port 1,
//! another partition: carried by A) and C (port 2, default partition); a fourth id is never
//! opened. The first 6 bytes size the SA channel (entries, table slots, their room, the RMPP
//! window and timers) and the resolver (tries, per-try wait, SA window, `sa_table_min`,
//! Reports) and say which endpoints know their SM at first; then each step is an op byte and
//! its operands (missing ones read as 0), by the op's low 4 bits: 0-2 a client request, 3 a
//! burst of them (a backlog), 4 the SA's answer to a query sent (a path, no records, BUSY, an
//! invalid field; a GetTable's is a plain MAD), 5-6 one segment of a table's answer, 7 a
//! whole table in order (a segment left out, or all twice), 8 a raw class 3 MAD (a TID sent
//! or its own), 9-11 the clock (a little, a lot, to the node's next deadline), 12 an endpoint
//! closed or opened again, 13 the SM moves, 14 the core's service completes a MAD it holds,
//! 15 a Report. Each delivery takes a flags byte: the endpoint it arrives on, a byte
//! overwritten, twice, and the sender (see `World::how`).
//!
//! Invariants: no panic; every client request is answered exactly once while the script runs
//! and by the time time has run out at its end (the node idle, `Node::is_idle`, nothing held
//! by the core's service, no timer left in the channel); `Resolver::check_invariants` after
//! every step; a class 3 MAD not from the SM the receiving endpoint knows (its LID, QP 1) is
//! counted forged, a reply naming a TID never handed out is counted unknown, and a reply for a
//! query on a QP other than the one that carried it is refused (the carrier rule); every MAD
//! the channel refuses (forged or unknown) outputs nothing, moves no counter of the resolver,
//! leaves the channel as it was and changes no cache entry; every SA MAD the node posts goes to
//! its QP's SM (QP 1): a query with a wire TID of its own (never one handed out before), the
//! same bytes again only while that query is not done, an RMPP ACK/STOP/ABORT in the request
//! direction only for a GetTable's TID, or a ReportResp (no query); no GetTable
//! through the core's service; a query is done (`QueryDone`) at most once, and only one that
//! was sent; a table taken fits the channel's table slot.
use acm_core_nostd::cache::{
    ep_number, AddrSlot, CacheConfig, CacheEp, CacheStats, CacheWriter, Dest, Lookup, PathCache,
    PathKey, PathSlot,
};
use acm_core_nostd::node::{Event, Node, Output, SaConfig, Transport, Unsent};
use acm_core_nostd::resolver::{
    AcmDest, Capacities, Config, EpConfig, EpId, HeapStorage, Kind, MsgBuf, RecvMeta, Request,
    Resolver,
};
use acm_core_nostd::rmpp;
use acm_core_nostd::sa_channel::{SaEntry, SmAddr, TableSlot, TIMED_OUT};
use acm_core_nostd::wire::client::{ClientRequest, PathQuery};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::mad::{
    RmppHeader, RmppRepr, RmppType, HEADER_LEN, MAD_LEN, RMPP_FLAG_ACTIVE,
};
use acm_core_nostd::wire::path_record::{PathRecord, PATH_RECORD_LEN};
use acm_core_nostd::wire::sa::DATA_OFFSET;
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

type Cache = PathCache<Box<[PathSlot]>, Box<[AddrSlot]>>;
type FuzzNode = Node<HeapStorage, Arc<Cache>, Vec<SaEntry>, Vec<TableSlot<Vec<u8>>>, Vec<u8>>;

/// A, B, C (see the module docs), then an id never opened.
const EPS: [EpId; 4] = [EpId(0), EpId(1), EpId(2), EpId(3)];
/// Where the SM is, and where it may move to.
const SMS: [SmAddr; 2] = [SmAddr { lid: 0x30, sl: 0 }, SmAddr { lid: 0x31, sl: 1 }];
/// Destinations: LIDs `FIRST_DEST..FIRST_DEST + DESTS`, port `l`'s GID `gid(l)`.
const FIRST_DEST: u16 = 3;
const DESTS: u16 = 8;
/// Enough steps to the end of every timer (the resolver's deadlines are below 2 s here).
const END_STEPS: usize = 20_000;

fn gid(port: u16) -> Gid {
    Gid::from_parts(
        0xfe80_0000_0000_0000,
        0x0002_c903_0000_0000 | u64::from(port),
    )
}

/// Endpoint `i` (0 A, 1 B, 2 C) as the core gives it.
fn ep_config(i: usize) -> EpConfig {
    let (port, pkey, sa_pkey) = match i {
        0 => (1, 0xffff, true),
        1 => (1, 0x8002, false),
        _ => (2, 0xffff, true),
    };
    EpConfig {
        port_gid: gid(port),
        lid: port,
        pkey,
        mtu: 4,
        rate: 7,
        subnet_timeout_ms: 1,
        qpn: 0x41 + i as u32,
        sa_pkey,
    }
}

/// The operands of a script, 0 once it has run out.
struct Script<'a>(std::slice::Iter<'a, u8>);

impl Script<'_> {
    fn u8(&mut self) -> u8 {
        self.0.next().copied().unwrap_or(0)
    }
}

/// A query the node sent (its first send).
struct Sent {
    /// The endpoint whose QP carried it.
    qp: EpId,
    /// As it went on the wire (the channel's TID).
    mad: [u8; MAD_LEN],
}

impl Sent {
    fn tid(&self) -> u64 {
        tid_of(&self.mad)
    }
    fn is_table(&self) -> bool {
        self.mad[3] == 0x12
    }
}

fn tid_of(mad: &[u8; MAD_LEN]) -> u64 {
    u64::from_be_bytes(mad[8..16].try_into().unwrap())
}

/// A PathRecord of the fabric: from the port whose GID is `sgid` to LID `dlid`.
fn path(sgid: Gid, dlid: u16, pkey: u16) -> [u8; PATH_RECORD_LEN] {
    let mut r = [0u8; PATH_RECORD_LEN];
    let mut p = PathRecord::new_unchecked(&mut r[..]);
    p.set_dgid(gid(dlid));
    p.set_sgid(sgid);
    p.set_dlid(dlid);
    p.set_slid(sgid.0[15].into());
    p.set_reversible_numpath(true, 0);
    p.set_pkey(pkey);
    r[54] = 0x84;
    r[55] = 0x83;
    r[56] = 0x92;
    r
}

/// How a MAD of the script arrives: (sender, endpoint it arrives on, overwritten byte, twice).
struct Delivery {
    meta: RecvMeta,
    on: EpId,
    poke: Option<(usize, u8)>,
    twice: bool,
}

struct World {
    n: FuzzNode,
    cache: Arc<Cache>,
    now: u64,
    /// Bytes of records a table slot takes.
    room: usize,
    /// Where the SM is now (what a `ReadSm` is answered).
    sm: SmAddr,
    /// What the node was told of each endpoint's SM (open or `handle_sm`).
    known: [Option<SmAddr>; 3],
    open: [bool; 3],
    /// Each endpoint's flush generation (a new SM reregisters it).
    generation: [u32; 3],
    next_client: u64,
    /// Client → answers so far.
    clients: HashMap<u64, u32>,
    sent: Vec<Sent>,
    /// Wire TID → index in `sent`.
    tids: HashMap<u64, usize>,
    /// Token → wire TID of the queries sent and not done.
    live: HashMap<u64, u64>,
    /// Wire TIDs of the queries done.
    done: HashSet<u64>,
    /// What the core's SA service holds: (token, MAD).
    core: Vec<(u64, [u8; MAD_LEN])>,
}

impl World {
    fn new(s: &mut Script) -> World {
        let (h0, h1, h2, h3, h4, h5) = (s.u8(), s.u8(), s.u8(), s.u8(), s.u8(), s.u8());
        let cfg = Config {
            addr_acm: false,
            route_acm: false,
            sa_reports: h3 & 1 != 0,
            sa_window: 1 + u32::from(h3 >> 6) * 3,
            sa_window_start: 1,
            sa_deadline: 400,
            queue_deadline: 1200,
            negative_ttl: 300,
            sa_tables: true,
            sa_table_min: u32::from((h3 >> 1) & 7),
            ..Config::default()
        };
        let caps = Capacities {
            requests: 16,
            answer_reserve: 4,
            jobs: 16,
            sa_inflight: 8,
            addrs: 4,
            endpoints: 4,
            preloads: 1,
        };
        let cache = PathCache::new(
            PathSlot::boxed(128),
            AddrSlot::boxed(8),
            CacheConfig::default(),
        )
        .unwrap();
        let cache = Arc::new(cache);
        let writer = CacheWriter::take(Arc::clone(&cache)).unwrap();
        let r = Resolver::new(cfg, HeapStorage::new(caps), writer, 7).unwrap();
        let room = usize::from(h1 % 32) * PATH_RECORD_LEN;
        let rmpp_cfg = rmpp::Config {
            window: 1 + u32::from(h1 >> 5),
            resp_timeout: 1 + u64::from(h4 % 64),
            total_timeout: 200 + u64::from(h4 >> 6) * 200,
            ..rmpp::Config::DEFAULT
        };
        let tables = (0..1 + usize::from(h0 >> 7))
            .map(|_| TableSlot::new(vec![0u8; room], rmpp_cfg))
            .collect();
        let entries = vec![SaEntry::EMPTY; 1 + usize::from(h0 & 0x3f)];
        let sa = SaConfig {
            transport: Transport::Ud,
            tries: 1 + u32::from(h2 >> 6) % 3,
            try_wait: 5 + u64::from(h2 % 64),
            ..SaConfig::default()
        };
        let n = Node::new(r, sa, entries, tables, [0x5eed, 0xfeed]);
        let mut w = World {
            n,
            cache,
            now: 0,
            room,
            sm: SMS[0],
            known: [None; 3],
            open: [false; 3],
            generation: [0; 3],
            next_client: 1,
            clients: HashMap::new(),
            sent: Vec::new(),
            tids: HashMap::new(),
            live: HashMap::new(),
            done: HashSet::new(),
            core: Vec::new(),
        };
        // Bit i of h5: endpoint i opens not knowing its port's SM yet (its SA MADs go
        // through the core's service until the first SM check).
        for i in 0..3 {
            w.open(i, h5 & (1 << i) == 0);
        }
        w
    }

    fn open(&mut self, i: usize, sm_known: bool) {
        let sm = sm_known.then_some(self.sm);
        if self
            .n
            .handle_open(self.now, EPS[i], ep_number(0, EPS[i].0), ep_config(i), sm)
            .is_ok()
        {
            self.open[i] = true;
            self.known[i] = sm;
            self.generation[i] = 0;
        }
        self.drain();
    }

    fn cache_ep(&self, i: usize) -> CacheEp {
        ep_number(self.generation[i], EPS[i].0)
    }

    /// What the cache holds: its write counters, and what it answers now for everything the
    /// node may cache.
    fn snapshot(&self) -> (CacheStats, Vec<Lookup>) {
        let c = self.cache.stats();
        let writes = CacheStats {
            inserts: c.inserts,
            updates: c.updates,
            evictions: c.evictions,
            expired: c.expired,
            removed: c.removed,
            path_entries: c.path_entries,
            addr_entries: c.addr_entries,
            ..CacheStats::default()
        };
        let mut v = Vec::new();
        for i in 0..3 {
            let cep = self.cache_ep(i);
            for l in FIRST_DEST..FIRST_DEST + DESTS {
                for d in [Dest::Lid(l), Dest::Gid(gid(l).0)] {
                    v.push(self.cache.lookup(&PathKey::new(cep, d), self.now));
                }
            }
        }
        (writes, v)
    }

    /// Carries out the node's outputs until it has none; returns how many there were.
    fn drain(&mut self) -> usize {
        let (mut count, mut msg) = (0, MsgBuf::new());
        while let Some(o) = self.n.poll_output(self.now, &mut msg) {
            count += 1;
            match o {
                Output::Transmit { qp, to, mad, query } => self.posted(qp, to, &mad, query),
                Output::CoreSa { mad, token, .. } => {
                    assert_ne!(mad[3], 0x12, "a GetTable through the core's service");
                    self.core.push((token, mad));
                }
                Output::Answer(a) => {
                    let n = self
                        .clients
                        .get_mut(&a.client)
                        .expect("an answer for a request never made");
                    *n += 1;
                    assert_eq!(*n, 1, "client {} answered twice", a.client);
                }
                Output::ReadSm { ep } => self.read_sm(ep),
                Output::QueryDone { token, .. } => {
                    let tid = self.live.remove(&token);
                    let tid = tid.expect("a query done twice, or never sent");
                    self.done.insert(tid);
                }
                Output::Event(Event::TableReceived { records }) => {
                    assert!(
                        records * PATH_RECORD_LEN <= self.room,
                        "a table past its slot"
                    )
                }
                Output::Event(_)
                | Output::Count { .. }
                | Output::Attach { .. }
                | Output::Detach { .. } => {}
            }
        }
        if let Err(e) = self.n.resolver().check_invariants() {
            panic!("at {}: {e}", self.now);
        }
        count
    }

    /// What the caller does for a `ReadSm`: the port says where the SM is now.
    fn read_sm(&mut self, ep: EpId) {
        let i = ep.index();
        assert!(
            i < 3 && self.open[i],
            "an SM read for endpoint {i}, not open"
        );
        if self.known[i] != Some(self.sm) {
            if self.known[i].is_some() {
                // A new SM: the node reregisters the endpoint, with this generation.
                self.generation[i] += 1;
            }
            self.known[i] = Some(self.sm);
        }
        let cep = self.cache_ep(i);
        self.n.handle_sm(self.now, ep, cep, Some(self.sm));
    }

    /// An SA MAD the node posts on `qp`'s QP.
    fn posted(&mut self, qp: EpId, to: AcmDest, mad: &[u8; MAD_LEN], query: Option<u64>) {
        let i = qp.index();
        let sm = self.known.get(i).copied().flatten();
        let sm = sm.expect("a MAD posted on a QP whose port's SM is not known");
        assert_eq!(to, sm.dest(), "an SA MAD not for the SM's QP 1");
        assert_eq!(mad[1], 3, "only SA MADs here (no ACM)");
        let tid = tid_of(mad);
        assert!(
            mad[3] & 0x80 == 0 || query.is_none(),
            "a response (an RMPP ACK, a ReportResp) is no query: {query:?}"
        );
        if let Some(token) = query {
            assert_eq!(mad[3] & 0x80, 0, "a query is a request");
            let again = self.live.insert(token, tid);
            assert!(
                again.is_none(),
                "token {token:#x} sent while its query is out"
            );
            assert!(
                self.tids.insert(tid, self.sent.len()).is_none(),
                "wire TID {tid:#x} handed out twice"
            );
            self.sent.push(Sent { qp, mad: *mad });
            return;
        }
        let rmpp = RmppRepr::parse(&RmppHeader::new_unchecked(&mad[HEADER_LEN..]));
        if let Some(r) = rmpp.ok().filter(|r| r.flags & RMPP_FLAG_ACTIVE != 0) {
            assert_eq!(mad[3] & 0x80, 0, "RMPP in the request direction");
            assert!(
                matches!(
                    r.rmpp_type,
                    RmppType::Ack | RmppType::Stop | RmppType::Abort
                ),
                "{r:?}"
            );
            let s = self
                .tids
                .get(&tid)
                .expect("RMPP for a TID never handed out");
            assert!(self.sent[*s].is_table(), "RMPP for a Get");
            return;
        }
        if mad[3] & 0x80 != 0 {
            assert_eq!(mad[3], 0x86, "the only response we send is a ReportResp");
            return;
        }
        let s = self
            .tids
            .get(&tid)
            .expect("a query again that was never sent");
        let s = &self.sent[*s];
        assert_eq!(&s.mad, mad, "a query again, not the same bytes");
        assert!(!self.done.contains(&tid), "a query again after it was done");
    }

    /// A client request on endpoint `ep` for LID `lid` (or its GID).
    fn request(&mut self, ep: EpId, lid: u16, by_gid: bool, kind: Kind) {
        let client = self.next_client;
        self.next_client += 1;
        self.clients.insert(client, 0);
        let q = if by_gid {
            PathQuery::gid(gid(lid))
        } else {
            PathQuery::lid(lid)
        };
        let msg = ClientRequest::path(client, 0, &q);
        let i = ep.index();
        let cache_ep = if i < 3 {
            self.cache_ep(i)
        } else {
            ep_number(0, ep.0)
        };
        let req = Request::new(ep, cache_ep, client, kind, msg.bytes());
        self.n.handle_request(self.now, &req);
        self.drain();
    }

    /// How the next MAD arrives, by flags `g` (and operands for an overwritten byte):
    /// bits 0-1 the endpoint (`qp`, the one its query left on, twice as likely), bit 2 a byte
    /// overwritten, bit 3 twice, bits 4-5 the sender (the SM now, the other SM, another LID,
    /// the SM's LID but not QP 1).
    fn how(&self, s: &mut Script, g: u8, qp: EpId) -> Delivery {
        let on = match g & 3 {
            0 | 1 => qp,
            k => EpId((qp.0 + k - 1) % 3),
        };
        let poke = (g & 4 != 0).then(|| (usize::from(s.u8()) % 128, s.u8()));
        let mut meta = self.sm.recv_meta();
        match (g >> 4) & 3 {
            0 => {}
            1 => meta = SMS[usize::from(self.sm == SMS[0])].recv_meta(),
            2 => meta.slid = FIRST_DEST,
            _ => meta.src_qp = 0x48,
        }
        Delivery {
            meta,
            on,
            poke,
            twice: g & 8 != 0,
        }
    }

    fn deliver(&mut self, d: &Delivery, mad: &[u8; MAD_LEN]) {
        let mut m = *mad;
        if let Some((at, v)) = d.poke {
            m[at] = v;
        }
        for _ in 0..1 + usize::from(d.twice) {
            self.receive(d.on, &d.meta, &m);
        }
    }

    /// `mad` arrives on `on`'s QP from `meta`: the refusals checked.
    fn receive(&mut self, on: EpId, meta: &RecvMeta, mad: &[u8; MAD_LEN]) {
        let i = usize::from(on.0);
        let sm = self.known.get(i).copied().flatten();
        let from_sm = meta.src_qp == 1 && sm.is_some_and(|sm| sm.lid == meta.slid);
        let class3 = mad[1] == 3;
        let reply = mad[3] & 0x80 != 0;
        let sent = self.tids.get(&tid_of(mad)).map(|&s| &self.sent[s]);
        let ours = sent.is_some();
        // A query's carrier is the QP it left on: A carries B, never the other way, and C is
        // on another port.
        let elsewhere = sent.is_some_and(|s| s.qp != on);
        let stats = self.n.resolver().stats();
        let held = self.n.sa().len();
        let (forged, unknown) = (self.n.sa().forged, self.n.sa().unknown);
        let before = self.snapshot();
        self.n.handle_receive(self.now, on, meta, mad);
        let outputs = self.drain();
        let counted = (self.n.sa().forged - forged, self.n.sa().unknown - unknown);
        if class3 && !from_sm {
            assert_eq!(
                counted,
                (1, 0),
                "not from the SM ({meta:?} on {on:?}): forged"
            );
        } else if class3 && reply && !ours {
            assert_eq!(
                counted,
                (0, 1),
                "a reply for a TID never handed out: unknown"
            );
        } else if class3 && reply && elsewhere {
            assert_ne!(
                counted,
                (0, 0),
                "a reply taken on a QP that did not carry its query"
            );
        }
        if counted == (0, 0) {
            return;
        }
        assert_eq!(counted.0 + counted.1, 1, "a MAD counted twice");
        assert_eq!(outputs, 0, "a refused MAD made the node output");
        assert_eq!(
            self.n.resolver().stats(),
            stats,
            "a refused MAD moved a counter"
        );
        assert_eq!(self.n.sa().len(), held, "a refused MAD changed the channel");
        assert_eq!(self.snapshot(), before, "a refused MAD changed the cache");
    }

    /// The SA's answer to the query `s` with MAD status `status`: a GetResp (a GetTable's
    /// plain answer: a GetTableResp without RMPP); a PathRecord Get's with the path to the
    /// LID (or GID) it asks for.
    fn answer(s: &Sent, status: u16) -> [u8; MAD_LEN] {
        let mut m = s.mad;
        m[3] = match m[3] {
            0x12 => 0x92,
            0x15 => 0x95,
            _ => 0x81,
        };
        m[4..6].copy_from_slice(&status.to_be_bytes());
        if m[16..18] == [0x00, 0x35] && status == 0 {
            let q = PathRecord::new_unchecked(&s.mad[DATA_OFFSET..DATA_OFFSET + 64]);
            let dlid = match q.dlid() {
                0 => u16::from_be_bytes([q.dgid().0[14], q.dgid().0[15]]),
                l => l,
            };
            let rec = path(q.sgid(), dlid, q.pkey());
            m[DATA_OFFSET..DATA_OFFSET + 64].copy_from_slice(&rec);
        }
        m
    }

    /// The records of the half-world table `s` asks for: `n` paths from its SGID, the last
    /// `cut` bytes cut off.
    fn table(s: &Sent, n: usize, cut: usize) -> Vec<u8> {
        let q = PathRecord::new_unchecked(&s.mad[DATA_OFFSET..DATA_OFFSET + 64]);
        let mut v: Vec<u8> = (0..n)
            .flat_map(|j| path(q.sgid(), FIRST_DEST + (j as u16) % DESTS, q.pkey()))
            .collect();
        v.truncate(v.len().saturating_sub(cut));
        v
    }

    /// Segment `k` of the answer to the GetTable `s` whose records are `records`.
    fn segment(s: &Sent, records: &[u8], k: u32) -> Option<[u8; MAD_LEN]> {
        let mut head = [0u8; DATA_OFFSET];
        head.copy_from_slice(&s.mad[..DATA_OFFSET]);
        head[3] = 0x92;
        // AttributeOffset: a PathRecord is 8 words.
        head[44..46].copy_from_slice(&8u16.to_be_bytes());
        rmpp::segment(&head, records, k)
    }

    /// The `k`-th query sent (of the GetTables only: `tables`), if any.
    fn pick(&self, k: u8, tables: bool) -> Option<usize> {
        let of: Vec<usize> = (0..self.sent.len())
            .filter(|&i| !tables || self.sent[i].is_table())
            .collect();
        (!of.is_empty()).then(|| of[usize::from(k) % of.len()])
    }

    fn clock(&mut self, to: u64) {
        self.now = self.now.max(to);
        self.n.handle_timeout(self.now);
        self.drain();
    }

    /// One step of the script; false at its end.
    fn step(&mut self, s: &mut Script) -> bool {
        let Some(&op) = s.0.next() else {
            return false;
        };
        match op & 15 {
            // A client request: endpoint by bits 4-5; LID, by GID (bit 4), a query() (bit 5).
            0..=2 => {
                let a = s.u8();
                let kind = if a & 0x20 != 0 {
                    Kind::Query
                } else {
                    Kind::Resolve
                };
                let lid = FIRST_DEST + u16::from(a) % DESTS;
                self.request(EPS[usize::from(op >> 4) & 3], lid, a & 0x10 != 0, kind);
            }
            // A burst of requests (a backlog, so tables): 2 + (bits 6-7) × 2 LIDs from `a`.
            3 => {
                let a = s.u8();
                for j in 0..2 + u16::from(op >> 6) * 2 {
                    let lid = FIRST_DEST + (u16::from(a) + j) % DESTS;
                    self.request(EPS[usize::from(op >> 4) & 3], lid, false, Kind::Resolve);
                }
            }
            // The SA answers a query: status by bits 4-5 (success, no records, BUSY, an
            // invalid field), as `how` says.
            4 => {
                let (k, g) = (s.u8(), s.u8());
                let Some(i) = self.pick(k, false) else {
                    return true;
                };
                let status = [0, 0x0300, 0x0001, 0x001c][usize::from(op >> 4) & 3];
                let m = Self::answer(&self.sent[i], status);
                let d = self.how(s, g, self.sent[i].qp);
                self.deliver(&d, &m);
            }
            // One segment of a table's answer: number `n`, `r & 31` records less `r >> 5`
            // bytes.
            5 | 6 => {
                let (k, n, r, g) = (s.u8(), s.u8(), s.u8(), s.u8());
                let Some(i) = self.pick(k, true) else {
                    return true;
                };
                let records = Self::table(&self.sent[i], usize::from(r & 31), usize::from(r >> 5));
                let count = rmpp::segment_count(records.len());
                let Some(m) = Self::segment(&self.sent[i], &records, u32::from(n) % count + 1)
                else {
                    return true;
                };
                let d = self.how(s, g, self.sent[i].qp);
                self.deliver(&d, &m);
            }
            // A table's whole answer in order, as `how` says (one byte overwritten in one
            // segment), bit 4 leaving one segment out, bit 5 re-sending the lot.
            7 => {
                let (k, r, g, skip) = (s.u8(), s.u8(), s.u8(), s.u8());
                let Some(i) = self.pick(k, true) else {
                    return true;
                };
                let records = Self::table(&self.sent[i], usize::from(r & 31), usize::from(r >> 5));
                let count = rmpp::segment_count(records.len());
                let mut d = self.how(s, g, self.sent[i].qp);
                let poke = d.poke.take();
                let poked = u32::from(skip) % count + 1;
                for _ in 0..1 + u8::from(op & 0x20 != 0) {
                    for seg in 1..=count {
                        if op & 0x10 != 0 && seg == poked {
                            continue;
                        }
                        let Some(mut m) = Self::segment(&self.sent[i], &records, seg) else {
                            continue;
                        };
                        if let (Some((at, v)), true) = (poke, seg == poked) {
                            m[at] = v;
                        }
                        self.deliver(&d, &m);
                    }
                }
            }
            // A raw class 3 MAD: 64 bytes of the script, the TID of a query sent (bit 4) or
            // its own.
            8 => {
                let (k, g) = (s.u8(), s.u8());
                let mut m = [0u8; MAD_LEN];
                for b in m.iter_mut().take(64) {
                    *b = s.u8();
                }
                m[1] = 3;
                let mut qp = EPS[usize::from(k) % 3];
                if let (Some(i), true) = (self.pick(k, false), op & 0x10 != 0) {
                    m[8..16].copy_from_slice(&self.sent[i].tid().to_be_bytes());
                    qp = self.sent[i].qp;
                }
                let d = self.how(s, g, qp);
                self.deliver(&d, &m);
            }
            9 => {
                let t = self.now + 1 + u64::from(s.u8());
                self.clock(t);
            }
            10 => {
                let t = self.now + u64::from(s.u8()) * 32;
                self.clock(t);
            }
            11 => {
                let t = self.n.poll_timeout().unwrap_or(self.now);
                self.clock(t);
            }
            // Close an endpoint, or open it again (knowing its SM, or not: bit 7).
            12 => {
                let a = s.u8();
                let i = usize::from(a) % 3;
                if self.open[i] {
                    self.n.handle_close(self.now, EPS[i]);
                    self.open[i] = false;
                    self.drain();
                } else {
                    self.open(i, a & 0x80 == 0);
                }
            }
            // The SM moves (the node hears of it at its next SM check).
            13 => self.sm = SMS[usize::from(self.sm == SMS[0])],
            // The core's service completes a MAD it holds: the SA's answer, refused, or timed
            // out; or (bit 7 of the second byte) a query posted on a QP did not leave.
            14 => {
                let (k, f) = (s.u8(), s.u8());
                // Or a query posted on a QP did not leave (a busy QP, a failed post).
                if f & 0x80 != 0 {
                    let mut live: Vec<u64> = self.live.keys().copied().collect();
                    live.sort_unstable();
                    if let Some(&token) = live.get(usize::from(k) % live.len().max(1)) {
                        let why = if f & 1 == 0 {
                            Unsent::Busy
                        } else {
                            Unsent::Failed
                        };
                        self.n.handle_unsent(self.now, token, why);
                        self.drain();
                    }
                    return true;
                }
                if self.core.is_empty() {
                    return true;
                }
                let (token, mad) = self.core.remove(usize::from(k) % self.core.len());
                match f % 3 {
                    0 => {
                        let s = Sent { qp: EPS[0], mad };
                        self.n
                            .handle_core_sa(self.now, token, 0, &Self::answer(&s, 0));
                    }
                    1 => self.n.handle_unsent(self.now, token, Unsent::Refused),
                    _ => self.n.handle_core_sa(self.now, token, TIMED_OUT, &mad),
                }
                self.drain();
            }
            // A Report from the SM (trap 64/65 about a destination's GID) on an endpoint.
            _ => {
                let a = s.u8();
                let mut m = [0u8; MAD_LEN];
                m[..4].copy_from_slice(&[1, 3, 2, 0x06]);
                m[8..16].copy_from_slice(&u64::from(a).to_be_bytes());
                m[16..18].copy_from_slice(&0x0002u16.to_be_bytes());
                let n = &mut m[DATA_OFFSET..DATA_OFFSET + 80];
                n[0] = 0x80;
                n[4..6].copy_from_slice(&(64 + u16::from(a & 1)).to_be_bytes());
                n[16..32].copy_from_slice(&gid(FIRST_DEST + u16::from(a >> 1) % DESTS).0);
                let g = s.u8();
                let d = self.how(s, g, EPS[usize::from(op >> 4) % 3]);
                self.deliver(&d, &m);
            }
        }
        true
    }

    /// Time runs out: the core's service completes what it holds (its own timeout), the
    /// node's timers run to the end, nobody answers.
    fn finish(&mut self) {
        for _ in 0..END_STEPS {
            // (The channel's deadline is a lower bound: once idle it may still name a time,
            // at which its timers find nothing.)
            let armed = self.n.sa().poll_timeout().is_some();
            if self.n.is_idle() && self.core.is_empty() && !armed {
                break;
            }
            for (token, mad) in std::mem::take(&mut self.core) {
                self.n.handle_core_sa(self.now, token, TIMED_OUT, &mad);
                self.drain();
            }
            let t = self.n.poll_timeout().unwrap_or(self.now);
            self.clock(t);
        }
        assert!(
            self.n.is_idle(),
            "not idle after time ran out: {} SA requests held",
            self.n.sa().len()
        );
        assert_eq!(
            self.n.sa().poll_timeout(),
            None,
            "a timer left in the SA channel"
        );
        let unanswered: Vec<_> = self.clients.iter().filter(|(_, n)| **n != 1).collect();
        assert!(unanswered.is_empty(), "never answered: {unanswered:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut s = Script(data.iter());
    let mut w = World::new(&mut s);
    while w.step(&mut s) {}
    w.finish();
});
