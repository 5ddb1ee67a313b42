//! Route resolution through the resolver, driven by hand: a request, the SA query it sends,
//! the reply, the answer; coalescing, the window and backlog, BUSY, deadlines, negative
//! caching, query() pass-through, close and shutdown.

use acm_core_nostd::cache::{
    ep_number, AddrKind, AddrSlot, CacheConfig, CacheEp, CacheError, CacheWriter, Dest, Lookup,
    PathCache, PathKey, PathSlot,
};
use acm_core_nostd::resolver::{
    Capacities, Config, Counter, EpConfig, EpId, HeapStorage, Kind, MsgBuf, Output, Request,
    Resolver, Via,
};
use acm_core_nostd::wire::acm_mad::AddressType;
use acm_core_nostd::wire::client::{ClientRequest, PathQuery, Status};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::path_record::PathRecord;
use std::sync::Arc;

/// Heap storage, as the plugin's `HostCache`.
type Cache = PathCache<Box<[PathSlot]>, Box<[AddrSlot]>>;

const EP: EpId = EpId(3);
const CEP: CacheEp = ep_number(0, EP.0);

fn port_gid() -> Gid {
    let mut g = [0u8; 16];
    g[..2].copy_from_slice(&[0xfe, 0x80]);
    g[15] = 4;
    Gid(g)
}

fn ep_config() -> EpConfig {
    EpConfig {
        port_gid: port_gid(),
        lid: 4,
        pkey: 0xffff,
        mtu: 4,
        rate: 3,
        subnet_timeout_ms: 0,
        qpn: 0x48,
        sa_pkey: true,
    }
}

struct T {
    /// Owns the cache's writer.
    r: Resolver<HeapStorage, Arc<Cache>>,
    /// The readers' handle.
    cache: Arc<Cache>,
    now: u64,
    out: Vec<Output>,
    /// The messages of the answers in `out`, in their order.
    msgs: Vec<Vec<u8>>,
}

fn setup(cfg: Config, caps: Capacities) -> T {
    setup_sized(cfg, caps, 1024, 1024)
}

/// [`setup`] over a cache of `paths` path slots and `addrs` address slots.
fn setup_sized(cfg: Config, caps: Capacities, paths: usize, addrs: usize) -> T {
    setup_seeded(cfg, caps, paths, addrs, 7)
}

/// [`setup_sized`] with the resolver's seed (its TIDs and backoff jitter).
fn setup_seeded(cfg: Config, caps: Capacities, paths: usize, addrs: usize, seed: u64) -> T {
    let cache = PathCache::new(
        PathSlot::boxed(paths),
        AddrSlot::boxed(addrs),
        CacheConfig::default(),
    )
    .unwrap();
    let cache = Arc::new(cache);
    let writer = CacheWriter::take(Arc::clone(&cache)).unwrap();
    let mut r = Resolver::new(cfg, HeapStorage::new(caps), writer, seed).unwrap();
    r.handle_open(0, EP, CEP, ep_config()).unwrap();
    let mut t = T {
        r,
        cache,
        now: 0,
        out: Vec::new(),
        msgs: Vec::new(),
    };
    t.drain();
    t.clear();
    t
}

fn route_config() -> Config {
    Config {
        addr_acm: false,
        // The whole window at once (slow start has tests of its own).
        sa_window_start: 4096,
        // One Get per destination (half-world tables have tests of their own).
        sa_table_min: 0,
        ..Config::default()
    }
}

impl T {
    fn drain(&mut self) {
        let mut msg = MsgBuf::new();
        while let Some(o) = self.r.poll_output(&mut msg) {
            if let Output::Answer(a) = &o {
                self.msgs.push(msg.message(a).to_vec());
            }
            self.out.push(o);
        }
    }
    /// Forgets every output so far.
    fn clear(&mut self) {
        self.out.clear();
        self.msgs.clear();
    }
    fn request(&mut self, client: u64, kind: Kind, msg: &[u8]) {
        self.r
            .handle_request(self.now, &Request::new(EP, CEP, client, kind, msg));
        self.drain();
    }
    /// The PathRecord queries sent (other SA MADs, the Report subscriptions, are dropped).
    fn sa_sends(&mut self) -> Vec<(u64, [u8; 256])> {
        let mut v = Vec::new();
        self.out.retain(|o| match o {
            Output::SendSa { token, mad, .. } => {
                if mad[16..18] == [0x00, 0x35] {
                    v.push((*token, *mad));
                }
                false
            }
            _ => true,
        });
        v
    }
    fn answers(&mut self) -> Vec<(u64, Status, Vec<u8>)> {
        let mut v = Vec::new();
        let mut msgs = core::mem::take(&mut self.msgs).into_iter();
        self.out.retain(|o| match o {
            Output::Answer(a) => {
                v.push((a.client, a.status, msgs.next().expect("its message")));
                false
            }
            _ => true,
        });
        v
    }
    fn counts(&mut self, c: Counter) -> usize {
        self.out
            .iter()
            .filter(|o| matches!(o, Output::Count { counter, .. } if *counter == c))
            .count()
    }
    fn reply(&mut self, token: u64, mad: &[u8; 256], status: u16, path: Option<[u8; 64]>) {
        let mut m = *mad;
        m[3] = 0x81;
        m[4..6].copy_from_slice(&status.to_be_bytes());
        if let Some(p) = path {
            m[56..120].copy_from_slice(&p);
        }
        self.r.handle_sa(self.now, token, 0, &m);
        self.drain();
    }
    /// A Resolve by LID for each of `lids`, client = TID = the LID.
    fn miss_lids(&mut self, lids: std::ops::Range<u16>) {
        for lid in lids {
            let c = u64::from(lid);
            self.request(c, Kind::Resolve, &path_msg(lid, 0, c));
        }
    }
    fn advance(&mut self, ms: u64) {
        self.now += ms;
        self.r.handle_timeout(self.now);
        self.drain();
    }
}

fn path_msg(lid: u16, flags: u32, tid: u64) -> Vec<u8> {
    ClientRequest::path(tid, flags, &PathQuery::lid(lid))
        .bytes()
        .to_vec()
}

fn path_to(lid: u16) -> [u8; 64] {
    let mut r = [0u8; 64];
    let mut p = PathRecord::new_unchecked(&mut r[..]);
    p.set_dlid(lid);
    p.set_slid(4);
    p.set_sgid(port_gid());
    r
}

#[test]
fn miss_query_reply_answer_and_cache() {
    let mut t = setup(route_config(), Capacities::default());
    t.request(11, Kind::Resolve, &path_msg(6, 0, 0xabc));
    let sends = t.sa_sends();
    assert_eq!(sends.len(), 1);
    let (token, mad) = sends[0];
    assert_eq!(&mad[..4], &[1, 3, 2, 1], "PathRecord GET");
    assert_eq!(&mad[8..12], &[0; 4], "TID upper half 0");
    assert_ne!(&mad[12..16], &[0; 4]);
    assert_eq!(t.counts(Counter::RouteQuery), 1);
    assert!(!t.r.is_idle());
    t.reply(token, &mad, 0, Some(path_to(6)));
    let a = t.answers();
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].0, a[0].1), (11, Status::Success));
    assert_eq!(&a[0].2[8..16], &0xabcu64.to_ne_bytes());
    assert_eq!(&a[0].2[24..88], &path_to(6)[..]);
    assert!(t.r.is_idle());
    let key = PathKey::new(CEP, Dest::Lid(6));
    assert!(matches!(t.cache.lookup(&key, 1), Lookup::Hit { .. }));
    // The resolver answers a repeat from the cache (the caller's hit path missed it).
    t.clear();
    t.request(12, Kind::Resolve, &path_msg(6, 0, 1));
    assert_eq!(t.answers().len(), 1);
    assert_eq!(t.counts(Counter::RouteCache), 1);
    assert!(t.sa_sends().is_empty());
}

/// A job's slot taken again by the next destination: a late copy of the old query's reply
/// (its token names the same slot) cannot complete the new job. It is counted as unknown and
/// nothing is answered with it.
#[test]
fn a_late_reply_to_a_reused_jobs_old_query_is_refused() {
    let caps = Capacities {
        jobs: 1,
        ..Capacities::default()
    };
    let mut t = setup(route_config(), caps);
    let index = |token: u64| (token >> 32) & 0x00ff_ffff;
    t.request(11, Kind::Resolve, &path_msg(6, 0, 1));
    let (first, mad) = t.sa_sends()[0];
    t.reply(first, &mad, 0, Some(path_to(6)));
    assert_eq!(t.answers().len(), 1);
    t.request(12, Kind::Resolve, &path_msg(7, 0, 2));
    let (second, mad2) = t.sa_sends()[0];
    assert_eq!(index(second), index(first), "the one job slot again");
    assert_ne!(second, first, "a fresh TID");
    let unknown = t.r.stats().sa_unknown;
    t.reply(first, &mad, 0, Some(path_to(6)));
    assert!(t.answers().is_empty(), "the old reply answers nothing");
    assert_eq!(t.r.stats().sa_unknown, unknown + 1);
    t.reply(second, &mad2, 0, Some(path_to(7)));
    let a = t.answers();
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].0, a[0].1), (12, Status::Success));
    assert_eq!(&a[0].2[24..88], &path_to(7)[..]);
}

#[test]
fn coalescing_window_backlog_and_deadlines() {
    let cfg = Config {
        sa_window: 2,
        sa_window_start: 2,
        ..route_config()
    };
    let mut t = setup(cfg, Capacities::default());
    for c in 0..100 {
        t.request(c, Kind::Resolve, &path_msg(6, 0, c));
    }
    for c in 0..5 {
        t.request(100 + c, Kind::Resolve, &path_msg(7 + c as u16, 0, c));
    }
    let sends = t.sa_sends();
    assert_eq!(
        sends.len(),
        2,
        "window of 2: LID 6 and LID 7, the rest in the backlog"
    );
    t.reply(sends[0].0, &sends[0].1, 0, Some(path_to(6)));
    let a = t.answers();
    assert_eq!(a.len(), 100, "one SA query answered 100 coalesced requests");
    assert!(a.iter().all(|x| x.1 == Status::Success));
    let next = t.sa_sends();
    assert_eq!(next.len(), 1, "a window slot freed: the backlog moves");
    // Nothing more answers: the deadline of the in-flight ones.
    t.advance(route_config().sa_deadline);
    let a = t.answers();
    assert!(a.iter().all(|x| x.1 == Status::Etimedout), "{a:?}");
    assert!(a.len() >= 2);
    // The caller still holds the MADs: the slots stay taken until they come back.
    let more = t.sa_sends();
    assert!(more.is_empty(), "zombies keep the window: {}", more.len());
    t.r.handle_sa(t.now, sends[1].0, 110, &sends[1].1);
    t.drain();
    assert_eq!(t.sa_sends().len(), 1);
    // Backlog waiters have a deadline too.
    t.advance(route_config().queue_deadline);
    let a = t.answers();
    assert!(a.iter().all(|x| x.1 == Status::Etimedout));
    assert!(t.r.stats().timeouts >= 5);
}

#[test]
fn busy_backs_off_with_a_new_tid_then_gives_up() {
    let cfg = Config {
        sa_busy_retries: 2,
        sa_busy_backoff: 100,
        ..route_config()
    };
    let mut t = setup(cfg, Capacities::default());
    t.request(1, Kind::Resolve, &path_msg(6, 0, 1));
    let mut tids = Vec::new();
    for round in 0..3 {
        let s = t.sa_sends();
        assert_eq!(s.len(), 1, "round {round}");
        tids.push(u32::from_be_bytes(s[0].1[12..16].try_into().unwrap()));
        t.reply(s[0].0, &s[0].1, 1, None); // BUSY
        let a: Vec<Status> = t.answers().iter().map(|a| a.1).collect();
        if round < 2 {
            assert!(a.is_empty());
            t.advance((100 << round) - 1);
            assert!(t.sa_sends().is_empty(), "backs off");
            t.advance(1);
        } else {
            assert_eq!(a, [Status::Etimedout], "retries exhausted");
        }
    }
    tids.dedup();
    assert_eq!(tids.len(), 3, "a new TID per re-send");
}

#[test]
fn no_record_is_cached_negatively_and_nodelay_primes() {
    let mut t = setup(route_config(), Capacities::default());
    t.request(1, Kind::Resolve, &path_msg(9, 0, 1));
    let s = t.sa_sends();
    t.reply(s[0].0, &s[0].1, 0x0300, None); // ERR_NO_RECORDS
    assert_eq!(t.answers()[0].1, Status::Enodata);
    assert_eq!(t.counts(Counter::NoData), 1);
    let key = PathKey::new(CEP, Dest::Lid(9));
    assert!(matches!(
        t.cache.lookup(&key, t.now),
        Lookup::Negative { .. }
    ));
    t.clear();
    // NODELAY miss: ENODATA now, the query still goes out (primes the cache).
    t.request(2, Kind::Resolve, &path_msg(10, 1 << 30, 2));
    assert_eq!(t.answers()[0].1, Status::Enodata);
    let s = t.sa_sends();
    assert_eq!(s.len(), 1);
    t.reply(s[0].0, &s[0].1, 0, Some(path_to(10)));
    assert!(t.answers().is_empty(), "Prime is never answered");
    assert!(matches!(
        t.cache.lookup(&PathKey::new(CEP, Dest::Lid(10)), t.now),
        Lookup::Hit { .. }
    ));
}

#[test]
fn a_failed_reversible_query_keeps_the_path_that_plain_requests_use() {
    // One cache entry serves a destination with and without the reversible bit. A plain
    // request caches a path without the bit; a reversible request then misses on it, and the
    // SA has no reversible path: that request gets ENODATA, but the plain path stays.
    let mut t = setup(route_config(), Capacities::default());
    t.request(1, Kind::Resolve, &path_msg(6, 0, 1));
    let s = t.sa_sends();
    t.reply(s[0].0, &s[0].1, 0, Some(path_to(6))); // path_to: no reversible bit
    assert_eq!(t.answers()[0].1, Status::Success);
    let mut rev = path_msg(6, 0, 2);
    PathRecord::new_unchecked(&mut rev[24..88]).set_reversible_numpath(true, 0);
    t.request(2, Kind::Resolve, &rev);
    let s = t.sa_sends();
    assert_eq!(
        s.len(),
        1,
        "a reversible request does not take the plain path"
    );
    t.reply(s[0].0, &s[0].1, 0x0300, None); // ERR_NO_RECORDS
    assert_eq!(t.answers()[0].1, Status::Enodata);
    t.request(3, Kind::Resolve, &path_msg(6, 0, 3));
    let a = t.answers();
    assert_eq!(
        (a.len(), a[0].1),
        (1, Status::Success),
        "the plain request is still a hit"
    );
    assert_eq!(&a[0].2[24..88], &path_to(6)[..]);
    assert!(t.sa_sends().is_empty());
}

#[test]
fn query_is_pass_through_never_coalesced() {
    let mut t = setup(route_config(), Capacities::default());
    let mut q = path_msg(6, 1 << 31, 5);
    q[16..20].copy_from_slice(&(1u32 << 31).to_ne_bytes());
    t.request(1, Kind::Query, &q);
    t.request(2, Kind::Query, &q);
    let s = t.sa_sends();
    assert_eq!(s.len(), 2);
    t.reply(s[0].0, &s[0].1, 0, Some(path_to(6)));
    t.reply(s[1].0, &s[1].1, 0x0300, Some(path_to(6)));
    let a = t.answers();
    assert_eq!(a.len(), 2);
    assert_eq!(
        (a[0].1, a[0].2.len(), a[0].2[1]),
        (Status::Success, 88, 0x81)
    );
    assert_eq!(
        a[1].1,
        Status::from(3),
        "the SA class status byte, passed through"
    );
    assert_eq!(t.counts(Counter::Error), 1);
    assert!(matches!(
        t.cache.lookup(&PathKey::new(CEP, Dest::Lid(6)), t.now),
        Lookup::Miss
    ));
}

#[test]
fn full_tables_answer_enomem_close_and_shutdown_answer_everything() {
    let caps = Capacities {
        requests: 6,
        answer_reserve: 2,
        jobs: 2,
        ..Capacities::default()
    };
    let mut t = setup(route_config(), caps);
    for c in 0..3 {
        t.request(c, Kind::Resolve, &path_msg(20 + c as u16, 0, c));
    }
    let a = t.answers();
    assert_eq!(a.len(), 1, "third key: no job slot");
    assert_eq!(a[0].1, Status::Enomem);
    for c in 3..10 {
        t.request(c, Kind::Resolve, &path_msg(20, 0, c));
    }
    let a = t.answers();
    assert!(a.iter().all(|x| x.1 == Status::Enomem));
    assert_eq!(
        a.len(),
        5,
        "4 waiters max (6 slots - 2 reserve), 2 taken already"
    );
    t.r.handle_close(t.now, EP);
    t.drain();
    let a = t.answers();
    assert_eq!(a.len(), 4);
    assert!(a.iter().all(|x| x.1 == Status::Enodata));
    assert!(t.r.is_idle());
    t.request(99, Kind::Resolve, &path_msg(20, 0, 99));
    assert_eq!(t.answers()[0].1, Status::Enodata);
    t.r.handle_open(t.now, EP, CEP, ep_config()).unwrap();
    t.request(100, Kind::Resolve, &path_msg(20, 0, 100));
    t.r.handle_shutdown(t.now);
    t.drain();
    assert_eq!(t.answers()[0].1, Status::Enodata);
    assert!(t.r.is_idle());
    let _ = Via::Resolve;
}

fn gid(n: u8) -> Gid {
    let mut g = port_gid().0;
    g[15] = n;
    Gid(g)
}

fn name_msg(name: &str, tid: u64) -> Vec<u8> {
    acm_core_nostd::sim::name_msg(name, None, false, tid)
}

fn name(s: &str) -> [u8; 64] {
    acm_core_nostd::sim::name_bytes(s)
}

#[test]
fn preloaded_routes_answer_by_lid_and_gid_and_survive_reregister() {
    let mut t = setup(route_config(), Capacities::default());
    let mut path = path_to(6);
    let mut p = PathRecord::new_unchecked(&mut path[..]);
    p.set_dgid(gid(6));
    p.set_reversible_numpath(true, 0);
    t.r.handle_preload_route(0, EP, CEP, &path);
    // Two path entries, by DLID and by DGID; each answers with and without the reversible bit.
    assert_eq!(t.cache.len(), 2);
    // A learned route too.
    t.request(1, Kind::Resolve, &path_msg(7, 0, 1));
    let s = t.sa_sends();
    t.reply(s[0].0, &s[0].1, 0, Some(path_to(7)));
    t.clear();
    let lid_keys = |cep| {
        let mut rev = PathKey::new(cep, Dest::Lid(6));
        rev.constraints.mask = acm_core_nostd::cache::constraint::REVERSIBLE_NUMPATH;
        rev.constraints.reversible_numpath = 0x80;
        let mut grev = PathKey::new(cep, Dest::Gid(gid(6).0));
        grev.constraints = rev.constraints;
        [
            PathKey::new(cep, Dest::Lid(6)),
            rev,
            PathKey::new(cep, Dest::Gid(gid(6).0)),
            grev,
        ]
    };
    for k in lid_keys(CEP) {
        match t.cache.lookup(&k, 1) {
            Lookup::Hit {
                record,
                expires_at: u64::MAX,
                ..
            } => assert_eq!(record, path, "{k:?}"),
            other => panic!("{k:?}: {other:?}"),
        }
    }
    // Reregister: a new generation; the preload is there under it, the learned route is not.
    let new_cep = ep_number(1, EP.0);
    t.r.handle_reregister(10, EP, new_cep);
    t.drain();
    for k in lid_keys(new_cep) {
        match t.cache.lookup(&k, 11) {
            Lookup::Hit { record, .. } => assert_eq!(record, path, "{k:?}"),
            other => panic!("{k:?}: {other:?}"),
        }
    }
    for k in lid_keys(CEP) {
        assert_eq!(
            t.cache.lookup(&k, 11),
            Lookup::Miss,
            "{k:?}: old generation"
        );
    }
    assert_eq!(
        t.cache.lookup(&PathKey::new(CEP, Dest::Lid(7)), 11),
        Lookup::Miss
    );
    assert_eq!(
        t.cache.lookup(&PathKey::new(new_cep, Dest::Lid(7)), 11),
        Lookup::Miss
    );
    t.r.handle_request(
        11,
        &Request::new(EP, new_cep, 2, Kind::Resolve, &path_msg(6, 0, 2)),
    );
    t.drain();
    assert!(t.sa_sends().is_empty(), "answered from the preload");
    assert_eq!(t.answers()[0].1, Status::Success);
}

#[test]
fn hosts_preload_resolves_routes_aliases_and_renews() {
    let cfg = Config {
        addr_ttl: Some(10_000),
        ..route_config()
    };
    let mut t = setup(cfg, Capacities::default());
    t.r.handle_preload_address(0, EP, AddrKind::Name, &name("hostA"), gid(9))
        .unwrap();
    t.request(1, Kind::Resolve, &name_msg("hostA", 1));
    assert_eq!(t.counts(Counter::AddrCache), 1, "address known, route not");
    let s = t.sa_sends();
    assert_eq!(s.len(), 1);
    let q = PathRecord::new_unchecked(&s[0].1[56..120]);
    assert_eq!((q.dgid(), q.sgid(), q.pkey()), (gid(9), port_gid(), 0xffff));
    let mut p = path_to(9);
    PathRecord::new_unchecked(&mut p[..]).set_dgid(gid(9));
    t.reply(s[0].0, &s[0].1, 0, Some(p));
    assert_eq!(t.answers()[0].1, Status::Success);
    let key = acm_core_nostd::cache::AddrKey::name(CEP, "hostA").unwrap();
    match t.cache.lookup_addr(&key, 1) {
        Lookup::Hit { expires_at, .. } => assert_eq!(expires_at, 10_000, "min(addr, route)"),
        other => panic!("{other:?}"),
    }
    // Expired mapping: renewed on use (AddrQuery, as the plugin did), route from the cache.
    t.now = 10_000;
    assert_eq!(t.cache.lookup_addr(&key, t.now), Lookup::Miss);
    t.clear();
    t.request(2, Kind::Resolve, &name_msg("hostA", 2));
    assert_eq!(t.counts(Counter::AddrQuery), 1);
    assert_eq!(t.counts(Counter::RouteCache), 1);
    assert_eq!(t.answers()[0].1, Status::Success);
    assert!(matches!(
        t.cache.lookup_addr(&key, t.now + 1),
        Lookup::Hit { .. }
    ));
}

#[test]
fn local_addresses_loopback_and_removal() {
    let mut t = setup(route_config(), Capacities::default());
    t.r.handle_add_address(0, EP, CEP, AddrKind::Name, &name("me"))
        .unwrap();
    t.drain();
    let key = acm_core_nostd::cache::AddrKey::name(CEP, "me").unwrap();
    let Lookup::Hit {
        record, expires_at, ..
    } = t.cache.lookup_addr(&key, 1)
    else {
        panic!()
    };
    assert_eq!(expires_at, u64::MAX);
    let p = PathRecord::new_unchecked(&record[..]);
    assert_eq!(
        (p.dlid(), p.slid(), p.dgid(), p.sgid()),
        (4, 4, port_gid(), port_gid())
    );
    assert_eq!(
        (p.reversible(), p.pkey(), p.mtu_byte(), p.rate_byte()),
        (true, 0xffff, 4, 3)
    );
    t.r.handle_remove_address(t.now, EP, AddrKind::Name, &name("me"));
    t.r.handle_timeout(2);
    assert_eq!(t.cache.lookup_addr(&key, 2), Lookup::Miss);
    t.request(1, Kind::Resolve, &name_msg("me", 1));
    assert_eq!(
        t.answers()[0].1,
        Status::Enodata,
        "addr_prot none: unknown names answer ENODATA"
    );
    // Type 4 (GID) is no kind `add_address` takes: its input is typed, so the refusal is the
    // conversion where the byte enters (the plugin's add_address callback).
    assert!(AddrKind::try_from(AddressType::from(4)).is_err());
}

#[test]
fn refresh_ahead_updates_the_entry_in_place() {
    let cfg = Config {
        route_ttl: Some(10_000),
        ..route_config()
    };
    let mut t = setup(cfg, Capacities::default());
    t.request(1, Kind::Resolve, &path_msg(6, 0, 1));
    let s = t.sa_sends();
    t.reply(s[0].0, &s[0].1, 0, Some(path_to(6)));
    let key = PathKey::new(CEP, Dest::Lid(6));
    t.now = 6000;
    let Lookup::Hit { needs_refresh, .. } = t.cache.lookup(&key, t.now) else {
        panic!()
    };
    assert!(needs_refresh, "within refresh_ahead of expiry");
    t.clear();
    t.request(0, Kind::Refresh, &path_msg(6, 0, 2));
    let s = t.sa_sends();
    assert_eq!(s.len(), 1, "re-queried");
    t.reply(s[0].0, &s[0].1, 0, Some(path_to(6)));
    assert!(t.answers().is_empty(), "Refresh is never answered");
    assert!(
        matches!(t.cache.lookup(&key, 12_000), Lookup::Hit { .. }),
        "extended"
    );
}

/// Cost of the resolver's share of a miss (request → SA query out → reply → answer out), and
/// of a resolver-side hit. `cargo test --release -p acm-core-nostd --test resolver_route -- \
/// --ignored --nocapture miss_cost`.
#[test]
#[ignore]
fn miss_cost() {
    let caps = Capacities {
        requests: 4096,
        jobs: 1024,
        ..Capacities::default()
    };
    let mut t = setup_sized(route_config(), caps, 1 << 20, 16);
    let n = 200_000u64;
    let msgs: Vec<Vec<u8>> = (0..n)
        .map(|i| path_msg(1 + (i % 60_000) as u16, 0, i))
        .collect();
    let mut start = std::time::Instant::now();
    let mut answers = 0u64;
    for (i, m) in msgs.iter().enumerate() {
        if i == 60_000 {
            eprintln!("60 000 misses: {:?} per miss", start.elapsed() / 60_000);
            start = std::time::Instant::now();
        }
        t.r.handle_request(i as u64, &Request::new(EP, CEP, i as u64, Kind::Resolve, m));
        while let Some(o) = t.r.poll_output(&mut MsgBuf::new()) {
            match o {
                Output::SendSa { token, mut mad, .. } => {
                    mad[3] = 0x81;
                    let lid = u16::from_be_bytes([mad[96], mad[97]]);
                    mad[56..120].copy_from_slice(&path_to(lid));
                    t.r.handle_sa(i as u64, token, 0, &mad);
                }
                Output::Answer(_) => answers += 1,
                _ => {}
            }
        }
    }
    let el = start.elapsed();
    assert_eq!(answers, n);
    eprintln!(
        "{} resolver-side hits: {:?} per hit",
        n - 60_000,
        el / (n - 60_000) as u32
    );
}

#[test]
fn random_bytes_get_exactly_one_answer_each() {
    let mut t = setup(route_config(), Capacities::default());
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let base = path_msg(6, 0, 0);
    let mut asked = 0u64;
    let mut clients: Vec<u64> = Vec::new();
    for i in 0..20_000u64 {
        let mut m = base.clone();
        m.resize((next() % 600) as usize, 0);
        for _ in 0..(next() % 6) {
            let n = m.len().max(1);
            let at = (next() % n as u64) as usize;
            if let Some(b) = m.get_mut(at) {
                *b = next() as u8;
            }
        }
        let kind = if i % 3 == 0 {
            Kind::Query
        } else {
            Kind::Resolve
        };
        t.request(i, kind, &m);
        asked += 1;
        for (token, mad) in t.sa_sends() {
            t.r.handle_sa(t.now, token, 110, &mad);
            t.drain();
        }
        clients.extend(t.answers().iter().map(|a| a.0));
        t.clear();
    }
    t.advance(1_000_000);
    clients.extend(t.answers().iter().map(|a| a.0));
    assert_eq!(clients.len() as u64, asked);
    clients.sort_unstable();
    clients.dedup();
    assert_eq!(clients.len() as u64, asked, "one answer per client");
    assert!(t.r.is_idle());
}

// ---- SA Reports (InformInfo subscriptions) and the BUSY-shrunk window ----

/// The GID of LID `lid` in these tests.
fn gid_of(lid: u16) -> Gid {
    let mut g = port_gid().0;
    g[14..16].copy_from_slice(&lid.to_be_bytes());
    Gid(g)
}

fn path_with_gid(lid: u16) -> [u8; 64] {
    let mut r = path_to(lid);
    PathRecord::new_unchecked(&mut r[..]).set_dgid(gid_of(lid));
    r
}

/// A REPORT(Notice) MAD for generic trap `trap` about `gid`, with `tid`.
fn report(trap: u16, gid: Gid, tid: u64) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 3, 2, 0x06]);
    m[8..16].copy_from_slice(&tid.to_be_bytes());
    m[16..18].copy_from_slice(&[0x00, 0x02]);
    let n = &mut m[56..136];
    n[0] = 0x80 | 4; // generic, type "SM"? (any type)
    n[1..4].copy_from_slice(&[0, 0, 4]);
    n[4..6].copy_from_slice(&trap.to_be_bytes());
    n[6..8].copy_from_slice(&1u16.to_be_bytes());
    n[16..32].copy_from_slice(&gid.0);
    m
}

impl T {
    /// The InformInfo SETs sent: (token, trap, subscribe).
    fn informs(&mut self) -> Vec<(u64, u16, bool, [u8; 256])> {
        let mut v = Vec::new();
        self.out.retain(|o| match o {
            Output::SendSa { token, mad, .. } if mad[16..18] == [0x00, 0x03] => {
                assert_eq!(mad[3], 0x02, "SET");
                let qpn = u32::from_be_bytes([0, mad[84], mad[85], mad[86]]);
                assert_eq!(qpn, 0x48, "reports go to the endpoint's QP");
                v.push((
                    *token,
                    u16::from_be_bytes([mad[82], mad[83]]),
                    mad[79] == 1,
                    *mad,
                ));
                false
            }
            _ => true,
        });
        v
    }
    /// ReportResponses sent: (TID, notice).
    fn acks(&mut self) -> Vec<(u64, Vec<u8>)> {
        let mut v = Vec::new();
        self.out.retain(|o| match o {
            Output::SendSa { mad, .. } if mad[3] == 0x86 => {
                let tid = u64::from_be_bytes(mad[8..16].try_into().unwrap());
                v.push((tid, mad[56..136].to_vec()));
                false
            }
            _ => true,
        });
        v
    }
    /// Resolves LID `lid` through one SA query answered with a path carrying its GID.
    fn learn(&mut self, lid: u16, client: u64) {
        self.request(client, Kind::Resolve, &path_msg(lid, 0, client));
        let (tok, mad) = self.sa_sends()[0];
        self.reply(tok, &mad, 0, Some(path_with_gid(lid)));
        assert_eq!(self.answers().len(), 1);
    }
}

fn report_setup() -> T {
    // `setup` drains the subscriptions the endpoint sends when it opens; open a second time
    // to see them. The first SETs were out (no reply yet): closing cancels them.
    let mut t = setup(route_config(), Capacities::default());
    t.r.handle_close(0, EP);
    t.drain();
    let gone: Vec<_> = t.informs().iter().map(|s| (s.1, s.2)).collect();
    assert_eq!(gone, vec![(64, false), (65, false)]);
    t.clear();
    t.r.handle_open(0, EP, CEP, ep_config()).unwrap();
    t.drain();
    t
}

#[test]
fn endpoints_subscribe_to_traps_64_and_65_resubscribe_after_reregister_and_cancel_on_close() {
    let mut t = report_setup();
    let subs = t.informs();
    let traps: Vec<_> = subs.iter().map(|s| (s.1, s.2)).collect();
    assert_eq!(traps, vec![(64, true), (65, true)]);
    for (tok, _, _, mad) in &subs {
        let mut m = *mad;
        m[3] = 0x81;
        t.r.handle_sa(1, *tok, 0, &m);
    }
    t.drain();
    assert!(t.informs().is_empty());
    t.r.handle_reregister(5, EP, ep_number(1, EP.0));
    t.drain();
    let again: Vec<_> = t.informs().iter().map(|s| (s.1, s.2)).collect();
    assert_eq!(
        again,
        vec![(64, true), (65, true)],
        "the new SM knows none of them"
    );
    t.r.handle_close(6, EP);
    t.drain();
    let gone: Vec<_> = t.informs().iter().map(|s| (s.1, s.2)).collect();
    assert_eq!(gone, vec![(64, false), (65, false)]);
    // Without Reports configured (the core's SA service) nothing is subscribed.
    let mut c = setup(
        Config {
            sa_reports: false,
            ..route_config()
        },
        Capacities::default(),
    );
    c.r.handle_reregister(1, EP, ep_number(1, EP.0));
    c.drain();
    assert!(c.informs().is_empty());
}

#[test]
fn a_refused_subscription_is_retried_with_backoff() {
    let mut t = report_setup();
    let subs = t.informs();
    let (tok, _, _, mad) = subs[0];
    let mut m = mad;
    m[3] = 0x81;
    m[4..6].copy_from_slice(&0x0100u16.to_be_bytes()); // SA: ERR_NO_RESOURCES
    t.r.handle_sa(0, tok, 0, &m);
    t.drain();
    assert!(t.informs().is_empty());
    assert_eq!(t.r.stats().report_malformed, 1, "a refusal is counted");
    t.advance(999);
    assert!(t.informs().is_empty());
    t.advance(1);
    let retry = t.informs();
    assert_eq!(retry.len(), 1);
    assert_eq!(retry[0].1, 64);
}

#[test]
fn gid_out_of_service_removes_its_paths_and_is_acknowledged() {
    let mut t = report_setup();
    t.clear();
    t.learn(6, 1);
    t.learn(7, 2);
    let k6 = PathKey::new(CEP, Dest::Lid(6));
    let k7 = PathKey::new(CEP, Dest::Lid(7));
    assert!(matches!(t.cache.lookup(&k6, 1), Lookup::Hit { .. }));
    let rep = report(65, gid_of(6), 0x1234_5678_9abc);
    t.r.handle_report(2, EP, &rep);
    t.drain();
    let acks = t.acks();
    assert_eq!(acks.len(), 1, "every Report is acknowledged");
    assert_eq!(acks[0].0, 0x1234_5678_9abc, "with its own TID");
    assert_eq!(&acks[0].1[..], &rep[56..136], "and its notice");
    assert_eq!(t.cache.lookup(&k6, 3), Lookup::Miss, "gone from the cache");
    assert!(
        matches!(t.cache.lookup(&k7, 3), Lookup::Hit { .. }),
        "other paths stay"
    );
    assert_eq!(t.r.stats().reports, 1);
    assert_eq!(t.r.stats().report_invalidated, 1);
    // The next request asks the SA again.
    t.request(3, Kind::Resolve, &path_msg(6, 0, 3));
    assert_eq!(t.sa_sends().len(), 1);
}

#[test]
fn a_report_for_an_unknown_gid_is_acknowledged_and_changes_nothing() {
    let mut t = report_setup();
    t.clear();
    t.learn(6, 1);
    t.clear();
    t.r.handle_report(2, EP, &report(65, gid_of(99), 7));
    t.drain();
    assert_eq!(t.acks().len(), 1);
    assert!(t.out.is_empty(), "no other output");
    assert!(matches!(
        t.cache.lookup(&PathKey::new(CEP, Dest::Lid(6)), 3),
        Lookup::Hit { .. }
    ));
    assert_eq!(t.r.stats().report_invalidated, 0);
}

#[test]
fn malformed_reports_are_dropped_and_counted() {
    let mut t = report_setup();
    t.clear();
    let good = report(65, gid_of(6), 7);
    let mut wrong_attr = good;
    wrong_attr[16..18].copy_from_slice(&[0x00, 0x35]);
    let mut wrong_class = good;
    wrong_class[1] = 0x2c;
    let mut wrong_method = good;
    wrong_method[3] = 0x01;
    for (i, m) in [
        &wrong_attr[..],
        &wrong_class[..],
        &wrong_method[..],
        &good[..40],
    ]
    .into_iter()
    .enumerate()
    {
        t.r.handle_report(1, EP, m);
        t.drain();
        assert!(t.out.is_empty(), "case {i}: nothing sent");
        assert_eq!(t.r.stats().report_malformed, i as u64 + 1);
    }
    // A Report on an endpoint that is not open: counted, not acknowledged from nowhere.
    t.r.handle_report(1, EpId(9), &good);
    t.drain();
    assert!(t.out.is_empty());
    assert_eq!(t.r.stats().report_malformed, 5);
}

#[test]
fn gid_in_service_drops_negative_entries() {
    let mut t = report_setup();
    t.clear();
    t.request(1, Kind::Resolve, &path_msg(8, 0, 1));
    let (tok, mad) = t.sa_sends()[0];
    t.reply(tok, &mad, 0x0300, None); // SA: ERR_NO_RECORDS
    assert_eq!(t.answers()[0].1, Status::Enodata);
    let k8 = PathKey::new(CEP, Dest::Lid(8));
    assert!(matches!(t.cache.lookup(&k8, 1), Lookup::Negative { .. }));
    t.r.handle_report(2, EP, &report(64, gid_of(8), 9));
    t.drain();
    assert_eq!(t.acks().len(), 1);
    assert_eq!(
        t.cache.lookup(&k8, 3),
        Lookup::Miss,
        "asked again next time"
    );
}

/// A window of 8 queries, tries of 1 s, jobs answered within 60 s: the BUSY tests' resolver.
fn busy_setup() -> T {
    setup(
        Config {
            sa_window: 8,
            sa_window_start: 8,
            sa_deadline: 1000,
            queue_deadline: 60_000,
            ..route_config()
        },
        Capacities::default(),
    )
}

#[test]
fn busy_halves_the_sa_window_and_answers_grow_it_back() {
    let mut t = busy_setup();
    t.miss_lids(10..90);
    let first = t.sa_sends();
    assert_eq!(first.len(), 8, "the window");
    // The SA answers in 100 ms (the round trip's floor here). One BUSY: the window is 4 now
    // (the BUSY query keeps its slot while it backs off), and it does not grow again for
    // `sa_deadline` (1 s here): everyone probing upward at once is what filled the SA's queue.
    t.advance(100);
    t.reply(first[0].0, &first[0].1, 0x0001, None);
    assert_eq!(t.r.stats().sa_busy, 1);
    for (tok, mad) in &first[1..8] {
        t.reply(*tok, mad, 0, Some(path_to(1)));
    }
    // 7 answers: 3 new queries went out (4 in the window with the backing-off one), where 7
    // would have without the BUSY.
    let mut out = t.sa_sends();
    assert_eq!(out.len(), 3);
    // The backed-off query goes out again after its backoff, with a new TID (its slot was
    // kept meanwhile).
    t.advance(100);
    let again = t.sa_sends();
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].1[8..16], first[0].1[8..16]);
    out.extend(again);
    // Within the hold, answers do not grow the window: one new query per answer. Past it,
    // with round trips near their floor, a window's worth of answers (4) grows it by one.
    loop {
        t.advance(100);
        for (tok, mad) in &out {
            t.reply(*tok, mad, 0, Some(path_to(1)));
        }
        out = t.sa_sends();
        if t.now >= 1100 {
            assert_eq!(out.len(), 5, "4 + 1 after 4 answers");
            break;
        }
        assert_eq!(out.len(), 4, "one for one at {}", t.now);
    }
}

#[test]
fn queries_the_sa_was_too_busy_for_go_again_only_as_the_shrunk_window_allows() {
    let mut t = busy_setup();
    for lid in 10..20u16 {
        t.request(
            u64::from(lid),
            Kind::Resolve,
            &path_msg(lid, 0, u64::from(lid)),
        );
        t.advance(1); // one start per ms: the backlog's (deadline) order is the start order
    }
    let first = t.sa_sends();
    assert_eq!(first.len(), 8);
    // The SA answers BUSY to the whole window: it halves three times, to 1.
    for (tok, mad) in &first {
        t.reply(*tok, mad, 0x0001, None);
    }
    assert_eq!(t.r.stats().sa_busy, 8);
    assert!(t.answers().is_empty(), "BUSY is retried, not answered");
    // After the backoff only one of the eight goes out again; the others wait in the backlog,
    // in their order, ahead of the two that never went out.
    t.advance(100);
    let again = t.sa_sends();
    assert_eq!(again.len(), 1, "the window is 1 now");
    // Each answer lets the next one go (no growth within the hold), oldest first.
    let mut lids = vec![];
    let mut cur = again;
    for _ in 0..9 {
        let (tok, mad) = cur[0];
        lids.push(u16::from_be_bytes([mad[56 + 40], mad[56 + 41]]));
        t.reply(tok, &mad, 0, Some(path_to(1)));
        cur = t.sa_sends();
        assert_eq!(cur.len(), 1, "one for one");
    }
    lids.push(u16::from_be_bytes([cur[0].1[56 + 40], cur[0].1[56 + 41]]));
    assert_eq!(
        lids,
        (10..20).collect::<Vec<u16>>(),
        "each once, in start order"
    );
    t.reply(cur[0].0, &cur[0].1, 0, Some(path_to(1)));
    assert_eq!(
        t.answers()
            .iter()
            .filter(|a| a.1 == Status::Success)
            .count(),
        10
    );
    assert!(t.r.is_idle());
}

#[test]
fn with_the_sa_gone_every_request_is_answered_within_the_queue_deadline_of_its_arrival() {
    let mut t = setup(
        Config {
            sa_window: 4,
            sa_window_start: 4,
            sa_deadline: 1000,
            queue_deadline: 2500,
            ..route_config()
        },
        Capacities::default(),
    );
    t.miss_lids(10..30);
    // The transport reports each try lost 1 s after it went out (as the ud channel does after
    // its tries), which frees the window for the next queries of the backlog.
    let mut out = t.sa_sends();
    assert_eq!(out.len(), 4);
    let mut answered = 0;
    while t.now < 5000 {
        t.advance(500);
        if t.now % 1000 == 0 {
            for (tok, mad) in out.drain(..) {
                t.r.handle_sa(t.now, tok, 110, &mad);
            }
            t.drain();
            out = t.sa_sends();
        }
        let a = t.answers();
        assert!(a.iter().all(|x| x.1 == Status::Etimedout));
        answered += a.len();
        if t.now >= 2500 {
            assert_eq!(answered, 20, "all answered by the deadline (t = {})", t.now);
        }
    }
    assert!(t.r.is_idle() || out.is_empty());
}

/// A job's deadline is `queue_deadline` from its start or `sa_deadline` after the SA's last
/// answer, whichever is later; a backlogged query that could not come back before it (two
/// round trips) while the SA is silent is answered ETIMEDOUT instead of sent. While the SA
/// keeps answering, the deadline moves with it.
#[test]
fn a_query_that_cannot_return_before_its_deadline_is_not_sent_while_the_sa_answers_it_waits() {
    for (sa_deadline, sent) in [(350, false), (2000, true)] {
        let mut t = setup(
            Config {
                sa_window: 1,
                queue_deadline: 1000,
                sa_deadline,
                ..route_config()
            },
            Capacities::default(),
        );
        for lid in [10u16, 11, 12] {
            t.request(
                u64::from(lid),
                Kind::Resolve,
                &path_msg(lid, 0, u64::from(lid)),
            );
        }
        let first = t.sa_sends();
        assert_eq!(first.len(), 1);
        // Answered after 300 ms: the SA's round trip is 300 ms; LID 11 goes out.
        t.advance(300);
        t.reply(first[0].0, &first[0].1, 0, Some(path_to(10)));
        let second = t.sa_sends();
        assert_eq!(second.len(), 1);
        assert_eq!(t.answers().len(), 1);
        if !sent {
            // LID 11 is never answered: its try's deadline (300 + 350) answers it ETIMEDOUT
            // and frees the window. LID 12's deadline is 1000 by age (300 + 350 by progress
            // is earlier); 350 ms are left, less than two round trips, and the SA has been
            // silent for longer than one: answered now, and the SA is not given work nobody
            // will wait for.
            t.advance(350);
            // The transport gives its MAD back (it keeps the window slot until then).
            t.r.handle_sa(t.now, second[0].0, 110, &second[0].1);
            t.drain();
            assert!(t.sa_sends().is_empty());
            let a = t.answers();
            let got: Vec<(u64, Status)> = a.iter().map(|x| (x.0, x.1)).collect();
            assert_eq!(got, [(11, Status::Etimedout), (12, Status::Etimedout)]);
            continue;
        }
        // Another 300 ms. LID 12's deadline: 1000 by age, or 600 + sa_deadline by progress.
        t.advance(300);
        t.reply(second[0].0, &second[0].1, 0, Some(path_to(11)));
        let third = t.sa_sends();
        let a = t.answers();
        // The SA answers: 2000 ms after its last answer is the deadline, so it goes out, and
        // its answer comes past the 1000 ms the age bound alone would have given it.
        assert_eq!((third.len(), a.len()), (1, 1));
        t.advance(300);
        t.reply(third[0].0, &third[0].1, 0, Some(path_to(12)));
        let a = t.answers();
        assert_eq!((a[0].0, a[0].1, t.now), (12, Status::Success, 900));
    }
}

/// A query none of whose tries was answered (the SA dropped it, as an overloaded OpenSM
/// does, or it was lost) goes again after a backoff, doubled per retry and spread over ½–1½
/// of it so the nodes of a storm do not all come back at once, within the job's retries; each
/// loss halves the window, down to one query, then below one (pacing). The retries spent, the
/// request is answered ETIMEDOUT.
#[test]
fn a_lost_query_goes_again_after_a_jittered_backoff_and_losses_shrink_the_window_to_a_pace() {
    let cfg = Config {
        sa_window: 2,
        sa_window_start: 2,
        sa_busy_retries: 3,
        sa_busy_backoff: 100,
        sa_deadline: 10_000,
        queue_deadline: 60_000,
        ..route_config()
    };
    // The gaps between a loss and the query's next send, over many seeds: each within its
    // doubled base ×½..1½, and not all alike.
    let mut gaps = vec![vec![]; 3];
    for seed in 0..40u64 {
        let mut t = setup_seeded(cfg, Capacities::default(), 64, 64, seed);
        t.request(1, Kind::Resolve, &path_msg(6, 0, 1));
        let mut s = t.sa_sends();
        for (round, g) in gaps.iter_mut().enumerate() {
            assert_eq!(s.len(), 1, "seed {seed} round {round}");
            t.advance(10);
            t.r.handle_sa(t.now, s[0].0, 110, &s[0].1); // every try lost
            t.drain();
            assert!(t.answers().is_empty(), "retried, not answered");
            let lost = t.now;
            loop {
                let next = t.r.poll_timeout().expect("the backoff runs");
                t.advance(next - t.now);
                s = t.sa_sends();
                if !s.is_empty() {
                    break;
                }
            }
            g.push(t.now - lost);
        }
        // The fourth loss: retries spent.
        t.advance(10);
        t.r.handle_sa(t.now, s[0].0, 110, &s[0].1);
        t.drain();
        let a = t.answers();
        assert_eq!((a.len(), a[0].1), (1, Status::Etimedout), "seed {seed}");
        assert_eq!(t.r.stats().sa_lost, 4);
        assert!(t.r.is_idle());
    }
    for (round, g) in gaps.iter().enumerate() {
        let base = 100u64 << round;
        assert!(
            g.iter().all(|&w| w >= base / 2 && w < base + base / 2),
            "round {round}: {g:?}"
        );
        let (lo, hi) = (g.iter().min().unwrap(), g.iter().max().unwrap());
        assert!(hi - lo > base / 4, "jitter spreads them: {g:?}");
    }

    // Losses shrink the window: 2 queries at once, then 1, then below one: one query at a
    // time, each a pace after the last, the backlog moved on by the timer alone. The SA
    // answers every query 20 ms after it went out, except the first 6, which it drops.
    let mut t = setup(cfg, Capacities::default());
    t.miss_lids(10..30);
    let mut out: Vec<(u64, [u8; 256], u64)> =
        t.sa_sends().into_iter().map(|(k, m)| (k, m, 0)).collect();
    assert_eq!(out.len(), 2);
    let (mut drops, mut answered, mut last_drop) = (6, 0, 0);
    let mut sends_after = vec![];
    while answered < 20 {
        let due = out.iter().map(|o| o.2 + 20).min();
        let next = [t.r.poll_timeout(), due].into_iter().flatten().min();
        let next = next.expect("the backlog is never left without a timer");
        assert!(t.now < 100_000, "stalled");
        t.advance(next.saturating_sub(t.now));
        while let Some(i) = out.iter().position(|o| o.2 + 20 <= t.now) {
            let (tok, mad, _) = out.remove(i);
            if drops > 0 {
                drops -= 1;
                last_drop = t.now;
                t.r.handle_sa(t.now, tok, 110, &mad);
                t.drain();
            } else {
                t.reply(tok, &mad, 0, Some(path_to(1)));
            }
        }
        let a = t.answers();
        assert!(a.iter().all(|x| x.1 == Status::Success), "{a:?}");
        answered += a.len();
        for (k, m) in t.sa_sends() {
            if drops == 0 {
                sends_after.push(t.now);
                assert!(out.is_empty(), "one query at a time below a window of one");
            }
            out.push((k, m, t.now));
        }
    }
    assert!(last_drop > 0 && t.r.stats().sa_lost == 6);
    let gaps: Vec<u64> = sends_after.windows(2).map(|w| w[1] - w[0]).collect();
    // The last drop took the window from one query to below one (once per round trip):
    // from then on, window 1/8 at a 20 ms round trip is 160 ms between queries (the hold
    // after the losses keeps it there).
    assert!(gaps.len() >= 10, "{gaps:?}");
    assert!(gaps[1..].iter().all(|&g| g >= 160), "paced: {gaps:?}");
}

/// The single writer is a type: while a resolver lives it owns the cache's writer, so no
/// second one can be had (neither borrowed nor owned), and every write the resolver makes
/// lands: each SA reply is a cache entry (records and "no such path" alike), each preload two,
/// none skipped. Once the resolver gives the writer back and it is dropped, the role is free.
#[test]
fn the_resolver_holds_the_one_writer_and_every_write_lands() {
    let mut t = setup(route_config(), Capacities::default());
    assert_eq!(t.cache.writer().err(), Some(CacheError::WriterTaken));
    assert_eq!(
        CacheWriter::take(Arc::clone(&t.cache)).err(),
        Some(CacheError::WriterTaken)
    );
    // More requests than the SA window: some wait in the backlog, replies let them go.
    let n = 60u16;
    for lid in 1..=n {
        t.request(
            u64::from(lid),
            Kind::Resolve,
            &path_msg(lid, 0, u64::from(lid)),
        );
    }
    let mut replies = 0;
    loop {
        let sends = t.sa_sends();
        if sends.is_empty() {
            break;
        }
        for (token, mad) in sends {
            let lid = u16::from_be_bytes([mad[96], mad[97]]);
            // Every third destination is unknown to the SA: a negative entry.
            let path = (lid % 3 != 0).then(|| path_to(lid));
            t.reply(token, &mad, if path.is_some() { 0 } else { 0x0300 }, path);
            replies += 1;
        }
    }
    assert_eq!(replies, n);
    assert_eq!(t.answers().len(), usize::from(n));
    for lid in 1..=n {
        let found = t.cache.lookup(&PathKey::new(CEP, Dest::Lid(lid)), t.now);
        if lid % 3 == 0 {
            assert!(matches!(found, Lookup::Negative { .. }), "{lid}: {found:?}");
        } else {
            assert!(matches!(found, Lookup::Hit { .. }), "{lid}: {found:?}");
        }
    }
    let mut preload = [0u8; 64];
    let mut p = PathRecord::new_unchecked(&mut preload[..]);
    p.set_dlid(200);
    p.set_dgid(Gid([
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 200,
    ]));
    p.set_slid(4);
    p.set_sgid(port_gid());
    t.r.handle_preload_route(t.now, EP, CEP, &preload);
    assert_eq!(t.cache.len(), usize::from(n) + 2);
    assert_eq!(t.cache.stats().inserts, u64::from(n) + 2);
    let w = t.r.into_writer();
    assert_eq!(t.cache.writer().err(), Some(CacheError::WriterTaken));
    drop(w);
    assert!(t.cache.writer().is_ok());
}

// --- half-world PathRecord tables (resolver::table) ---

/// A reversible path from our port to `lid` (GID `fe80::lid`), as a half-world table holds it.
fn table_record(lid: u16) -> [u8; 64] {
    let mut r = path_to(lid);
    let mut p = PathRecord::new_unchecked(&mut r[..]);
    let mut g = [0u8; 16];
    g[..2].copy_from_slice(&[0xfe, 0x80]);
    g[14..].copy_from_slice(&lid.to_be_bytes());
    p.set_dgid(Gid(g));
    p.set_reversible_numpath(true, 0);
    p.set_pkey(0xffff);
    r
}

/// Tables after a backlog of `min`, an SA window of `window` from the start, 1 s SA deadline,
/// room for any subnet's table (no probe; `resolver::table`'s own tests cover it).
fn table_config(window: u32, min: u32) -> Config {
    Config {
        sa_window: window,
        sa_window_start: window,
        sa_table_min: min,
        sa_table_room: 1 << 16,
        sa_deadline: 1000,
        queue_deadline: 60_000,
        ..Config::default()
    }
}

/// The first segment's headers of the answer to the GetTable `mad`.
fn table_head(mad: &[u8; 256]) -> [u8; 56] {
    let mut h = [0u8; 56];
    h.copy_from_slice(&mad[..56]);
    h[3] = 0x92;
    h[44..46].copy_from_slice(&8u16.to_be_bytes());
    h
}

/// The table answers every job it has the path of when it arrives, whether the request asked
/// for a reversible path or not (a record usable both ways serves both, as its cache entry
/// does), and whether the job waits in the backlog or its Get is out: the window need not
/// free first. (Fails if the table answered only requests that asked for the reversible bit:
/// these, with the window held by the Get, would wait for its reply.)
#[test]
fn a_table_answers_its_jobs_at_once_reversible_or_not_even_with_the_window_held() {
    use acm_core_nostd::resolver::SaTable;
    let mut t = setup(table_config(1, 2), Capacities::default());
    // One Get out (window 1), two behind it: the backlog of two asks for the table.
    t.miss_lids(10..13);
    let sends = t.sa_sends();
    assert_eq!(sends.len(), 2, "{sends:?}");
    let (get_token, get) = sends[0];
    let (table_token, table_mad) = sends[1];
    assert_eq!((get[3], table_mad[3]), (0x01, 0x12));
    assert!(t.answers().is_empty());
    let records: Vec<u8> = (10..13u16).flat_map(table_record).collect();
    let head = table_head(&table_mad);
    let table = SaTable {
        header: &head,
        records: &records,
    };
    t.r.handle_sa_table(t.now, table_token, Ok(table));
    t.drain();
    let mut answered: Vec<u64> = t
        .answers()
        .into_iter()
        .filter(|a| a.1 == Status::Success)
        .map(|a| a.0)
        .collect();
    answered.sort_unstable();
    assert_eq!(
        answered,
        vec![10, 11, 12],
        "the table answers all three at once"
    );
    // The Get's reply comes after: nothing more to answer, nothing counted as unknown.
    t.reply(get_token, &get, 0, Some(table_record(10)));
    assert!(t.answers().is_empty());
    assert_eq!(t.r.stats().sa_unknown, 0);
    assert!(t.r.is_idle());
}

#[test]
fn a_long_backlog_asks_for_the_ports_table_and_is_answered_from_it() {
    use acm_core_nostd::resolver::table::TableError;
    use acm_core_nostd::resolver::SaTable;
    let mut t = setup(table_config(2, 8), Capacities::default());
    // 7 misses: 2 Gets out, 5 in the backlog, no table.
    t.miss_lids(10..17);
    let gets = t.sa_sends();
    assert_eq!(gets.len(), 2);
    assert!(gets.iter().all(|(_, m)| m[3] == 0x01));
    // The 8th backlogged miss (10th in all): one GetTable, SGID and P_Key only, reversible.
    t.miss_lids(17..20);
    let sends = t.sa_sends();
    assert_eq!(sends.len(), 1, "one table");
    assert_eq!(
        t.counts(Counter::RouteQuery),
        3,
        "2 Gets and the table: SA path queries"
    );
    let (token, mad) = sends[0];
    assert_eq!(mad[3], 0x12, "GetTable");
    let q = PathRecord::new_unchecked(&mad[56..120]);
    assert_eq!(q.sgid(), port_gid());
    assert_eq!((q.dlid(), q.dgid(), q.pkey()), (0, Gid::ZERO, 0xffff));
    assert!(q.reversible());
    let mask = u64::from_be_bytes(mad[48..56].try_into().unwrap());
    assert_eq!(mask & (1 << 2 | 1 << 4), 0, "no DGID, no DLID: half-world");
    assert_ne!(mask & 1 << 3, 0, "the SGID bit");
    // It fails: the Gets go on, and more backlog does not ask again before sa_deadline.
    t.r.handle_sa_table(t.now, token, Err(TableError::Failed));
    t.drain();
    assert_eq!(t.r.stats().sa_table_failed, 1);
    t.request(20, Kind::Resolve, &path_msg(20, 0, 20));
    assert!(t.sa_sends().is_empty());
    t.r.handle_sa_table(t.now, token, Err(TableError::Failed));
    assert_eq!(
        t.r.stats().sa_unknown,
        1,
        "a second ending of the same table"
    );
    // The two Gets are answered; two more go.
    for (tk, m) in gets {
        let lid = PathRecord::new_unchecked(&m[56..120]).dlid();
        t.reply(tk, &m, 0, Some(table_record(lid)));
    }
    assert_eq!(t.answers().len(), 2);
    let gets = t.sa_sends();
    assert_eq!(gets.len(), 2);
    t.advance(999);
    for (tk, m) in gets {
        let lid = PathRecord::new_unchecked(&m[56..120]).dlid();
        t.reply(tk, &m, 0, Some(table_record(lid)));
    }
    assert_eq!(t.answers().len(), 2);
    // (The 999 ms round trip shrank the window: fewer Gets go.)
    let out_gets = t.sa_sends();
    let out = out_gets.len();
    assert!(out >= 1);
    // After sa_deadline, backlogged misses ask again (at the 8th); the table answers every
    // backlogged request at once, each with its own path.
    t.advance(1);
    assert!(t.answers().is_empty());
    let mut lid = 21u16;
    let (token, mad) = loop {
        t.request(
            u64::from(lid),
            Kind::Resolve,
            &path_msg(lid, 0, u64::from(lid)),
        );
        lid += 1;
        let sends = t.sa_sends();
        if let Some(&(tk, m)) = sends.first() {
            assert_eq!(sends.len(), 1);
            break (tk, m);
        }
        assert!(lid < 40, "no table");
    };
    // 10..lid requested, 4 answered, `out` Gets out: the rest wait in the backlog.
    let backlog = usize::from(lid - 10) - 4 - out;
    assert_eq!(backlog, 8, "asked at the 8th");
    // While the table is out, the Gets out complete but no new Get goes for the backlog: the
    // table will answer it.
    for (tk, m) in out_gets {
        let lid = PathRecord::new_unchecked(&m[56..120]).dlid();
        t.reply(tk, &m, 0, Some(table_record(lid)));
    }
    assert_eq!(t.answers().len(), out);
    assert!(t.sa_sends().is_empty(), "the backlog is held for the table");
    assert_eq!(mad[3], 0x12);
    let mut records: Vec<u8> = (1..=64u16).flat_map(table_record).collect();
    // A record that is not from our port is not taken.
    let mut foreign = table_record(99);
    PathRecord::new_unchecked(&mut foreign[..]).set_sgid(Gid([7; 16]));
    records.extend_from_slice(&foreign);
    let head = table_head(&mad);
    let table = SaTable {
        header: &head,
        records: &records,
    };
    t.r.handle_sa_table(t.now, token, Ok(table));
    t.drain();
    let s = t.r.stats();
    assert_eq!((s.sa_tables, s.sa_table_records), (1, 64));
    let answers = t.answers();
    assert_eq!(answers.len(), 8, "the backlog, not the Gets out");
    for (client, status, msg) in &answers {
        assert_eq!(*status, Status::Success);
        let p = PathRecord::new_unchecked(&msg[msg.len() - 64..]);
        assert_eq!(u64::from(p.dlid()), *client, "client {client}'s own path");
    }
    // Every destination of the table is a hit now, by LID and by GID.
    for lid in [1u16, 30, 64] {
        let by_lid = t.cache.lookup(&PathKey::new(CEP, Dest::Lid(lid)), t.now);
        assert!(
            matches!(by_lid, Lookup::Hit { .. }),
            "LID {lid}: {by_lid:?}"
        );
        let mut g = [0u8; 16];
        g[..2].copy_from_slice(&[0xfe, 0x80]);
        g[14..].copy_from_slice(&lid.to_be_bytes());
        let by_gid = t.cache.lookup(&PathKey::new(CEP, Dest::Gid(g)), t.now);
        assert!(
            matches!(by_gid, Lookup::Hit { .. }),
            "GID of {lid}: {by_gid:?}"
        );
    }
    assert!(matches!(
        t.cache.lookup(&PathKey::new(CEP, Dest::Lid(99)), t.now),
        Lookup::Miss
    ));
    t.request(100, Kind::Resolve, &path_msg(40, 0, 100));
    assert_eq!(t.answers()[0].1, Status::Success, "a hit");
    assert!(t.sa_sends().is_empty());
    t.r.check_invariants().unwrap();
}

#[test]
fn a_table_too_big_for_the_storage_turns_tables_off_for_the_endpoint() {
    use acm_core_nostd::resolver::table::TableError;
    let cfg = table_config(1, 4);
    let mut t = setup(cfg, Capacities::default());
    t.miss_lids(10..16);
    let tables: Vec<_> = t
        .sa_sends()
        .into_iter()
        .filter(|(_, m)| m[3] == 0x12)
        .collect();
    assert_eq!(tables.len(), 1);
    t.r.handle_sa_table(t.now, tables[0].0, Err(TableError::TooBig));
    t.advance(5000);
    t.miss_lids(20..40);
    assert!(
        t.sa_sends().iter().all(|(_, m)| m[3] == 0x01),
        "no table again"
    );
    // A transport that hands up a single MAD for a table (no RMPP) turns them off too.
    let mut t = setup(cfg, Capacities::default());
    t.miss_lids(10..16);
    let (tk, m) = t
        .sa_sends()
        .into_iter()
        .find(|(_, m)| m[3] == 0x12)
        .unwrap();
    t.reply(tk, &m, 0, Some(table_record(1)));
    assert_eq!(t.r.stats().sa_table_failed, 1);
    t.advance(5000);
    t.miss_lids(20..40);
    assert!(t.sa_sends().iter().all(|(_, m)| m[3] == 0x01));
    t.r.check_invariants().unwrap();
}

#[test]
fn a_warm_start_asks_for_the_table_once_at_a_random_time_within_the_warm_start_window() {
    use acm_core_nostd::resolver::SaTable;
    // Room for any subnet: no probe first (a warm start's probe: `resolver::table`'s tests).
    let cfg = Config {
        warm_start: 5000,
        sa_table_room: 1 << 16,
        ..Config::default()
    };
    // Twenty nodes booting at once ask at twenty different moments within 5 s.
    let mut at = Vec::new();
    for seed in 0..20 {
        let mut t = setup_seeded(cfg, Capacities::default(), 1024, 1024, seed);
        assert!(t.sa_sends().is_empty(), "nothing at once");
        let when = t.r.poll_timeout().expect("the warm-start timer");
        assert!(when < 5000, "{when}");
        at.push(when);
        if seed == 0 {
            t.advance(when - 1);
            assert!(t.sa_sends().is_empty(), "not before its time");
            t.advance(1);
            let sends = t.sa_sends();
            assert_eq!(sends.len(), 1);
            let (token, mad) = sends[0];
            assert_eq!(mad[3], 0x12, "a GetTable, with no request waiting");
            let records: Vec<u8> = (1..=20u16).flat_map(table_record).collect();
            let head = table_head(&mad);
            let table = SaTable {
                header: &head,
                records: &records,
            };
            t.r.handle_sa_table(t.now, token, Ok(table));
            t.drain();
            // Warm: a first request is a hit; no second table.
            t.request(1, Kind::Resolve, &path_msg(17, 0, 1));
            assert_eq!(t.answers()[0].1, Status::Success);
            t.advance(60_000);
            assert!(t.sa_sends().is_empty());
            t.r.check_invariants().unwrap();
        }
    }
    let mut distinct = at.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() >= 18, "{at:?}");
    // Off by default: no table without a backlog.
    let mut t = setup(Config::default(), Capacities::default());
    t.advance(60_000);
    assert!(t.sa_sends().is_empty());
}

/// A request the caller's front classified and found missing, with the cache's writes then:
/// while the cache has had no write since, the front's miss stands and the resolver does not
/// look again (decided once); after a write, or with no count, it looks, and answers what
/// has arrived from the cache.
#[test]
fn the_fronts_miss_stands_until_the_cache_is_written() {
    use acm_core_nostd::resolver::request::classify;
    use acm_core_nostd::resolver::RequestHead;
    let mut t = setup(route_config(), Capacities::default());
    t.request(11, Kind::Resolve, &path_msg(6, 0, 1));
    let (token, mad) = t.sa_sends()[0];
    t.reply(token, &mad, 0, Some(path_to(6)));
    assert_eq!(t.answers().len(), 1);
    t.clear();
    // The entry is cached now. A front that missed it (it looked before the write)...
    let msg = path_msg(6, 0, 2);
    let target = classify(&ep_config().view(CEP), &msg);
    let fronted = |client: u64, front_writes: Option<u32>| Request {
        head: RequestHead {
            ep: EP,
            cache_ep: CEP,
            client,
            kind: Kind::Resolve,
            target: Some(target),
            front_writes,
        },
        msg: &msg,
    };
    let writes = t.cache.writes();
    // ... saying it looked after that write: its miss is believed (the redundant query is
    // what shows the resolver did not look).
    t.r.handle_request(t.now, &fronted(12, Some(writes)));
    t.drain();
    assert_eq!(t.sa_sends().len(), 1, "decided by the front");
    assert_eq!(t.counts(Counter::RouteCache), 0);
    t.clear();
    // ... saying it looked before it, or not saying: the resolver looks, and answers from
    // the cache.
    for (client, seen) in [(13, Some(writes.wrapping_sub(1))), (14, None)] {
        t.r.handle_request(t.now, &fronted(client, seen));
        t.drain();
        assert!(t.sa_sends().is_empty(), "{seen:?}");
        assert_eq!(t.counts(Counter::RouteCache), 1);
        let a = t.answers();
        assert_eq!((a[0].0, a[0].1), (client, Status::Success));
        t.clear();
    }
}
