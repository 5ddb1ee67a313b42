//! Route resolution through the resolver, driven by hand: a request, the SA query it sends,
//! the reply, the answer; coalescing, the window and backlog, BUSY, deadlines, negative
//! caching, query() pass-through, close and shutdown.

use acm_core_nostd::cache::{AddrSlot, CacheConfig, Dest, Lookup, PathCache, PathKey, PathSlot};
use acm_core_nostd::resolver::request::{ENODATA, ENOMEM, ETIMEDOUT};
use acm_core_nostd::resolver::{
    Capacities, Config, Counter, EpConfig, EpId, HeapStorage, Kind, Output, Resolver, Via,
};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::path_record::PathRecord;

type Cache = PathCache<Box<[PathSlot]>, Box<[AddrSlot]>>;

const EP: EpId = EpId(3);
const CEP: u16 = 0x0003;

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
    }
}

struct T {
    r: Resolver<HeapStorage>,
    cache: Cache,
    now: u64,
    out: Vec<Output>,
}

fn setup(cfg: Config, caps: Capacities) -> T {
    let cache = PathCache::new(
        PathSlot::boxed(1024),
        AddrSlot::boxed(1024),
        CacheConfig::default(),
    )
    .unwrap();
    let mut r = Resolver::new(cfg, HeapStorage::new(caps), 7).unwrap();
    r.open_endpoint(0, EP, ep_config()).unwrap();
    let mut t = T {
        r,
        cache,
        now: 0,
        out: Vec::new(),
    };
    t.drain();
    t.out.clear();
    t
}

fn route_config() -> Config {
    Config {
        addr_acm: false,
        ..Config::default()
    }
}

impl T {
    fn drain(&mut self) {
        while let Some(o) = self.r.poll_output() {
            self.out.push(o);
        }
    }
    fn request(&mut self, client: u64, kind: Kind, msg: &[u8]) {
        self.r
            .request(self.now, &self.cache, EP, CEP, client, kind, msg);
        self.drain();
    }
    fn sa_sends(&mut self) -> Vec<(u64, [u8; 256])> {
        let mut v = Vec::new();
        self.out.retain(|o| match o {
            Output::SendSa { token, mad, .. } => {
                v.push((*token, *mad));
                false
            }
            _ => true,
        });
        v
    }
    fn answers(&mut self) -> Vec<(u64, u8, Vec<u8>)> {
        let mut v = Vec::new();
        self.out.retain(|o| match o {
            Output::Answer(a) => {
                v.push((a.client, a.status, a.msg[..a.len as usize].to_vec()));
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
        self.r.handle_sa(self.now, &self.cache, token, 0, &m);
        self.drain();
    }
    fn advance(&mut self, ms: u64) {
        self.now += ms;
        self.r.handle_timeout(self.now, &self.cache);
        self.drain();
    }
}

fn path_msg(lid: u16, flags: u32, tid: u64) -> Vec<u8> {
    let mut b = vec![0u8; 88];
    b[0] = 1;
    b[1] = 1;
    b[6..8].copy_from_slice(&88u16.to_ne_bytes());
    b[8..16].copy_from_slice(&tid.to_ne_bytes());
    b[16..20].copy_from_slice(&flags.to_ne_bytes());
    b[20..22].copy_from_slice(&0x10u16.to_ne_bytes());
    PathRecord::new_unchecked(&mut b[24..88]).set_dlid(lid);
    b
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
    assert_eq!((a[0].0, a[0].1), (11, 0));
    assert_eq!(&a[0].2[8..16], &0xabcu64.to_ne_bytes());
    assert_eq!(&a[0].2[24..88], &path_to(6)[..]);
    assert!(t.r.is_idle());
    let key = PathKey::new(CEP, Dest::Lid(6));
    assert!(matches!(t.cache.lookup(&key, 1), Lookup::Hit { .. }));
    // The resolver answers a repeat from the cache (the caller's hit path missed it).
    t.out.clear();
    t.request(12, Kind::Resolve, &path_msg(6, 0, 1));
    assert_eq!(t.answers().len(), 1);
    assert_eq!(t.counts(Counter::RouteCache), 1);
    assert!(t.sa_sends().is_empty());
}

#[test]
fn coalescing_window_backlog_and_deadlines() {
    let cfg = Config {
        sa_window: 2,
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
    assert!(a.iter().all(|x| x.1 == 0));
    let next = t.sa_sends();
    assert_eq!(next.len(), 1, "a window slot freed: the backlog moves");
    // Nothing more answers: the deadline of the in-flight ones.
    t.advance(route_config().sa_deadline);
    let a = t.answers();
    assert!(a.iter().all(|x| x.1 == ETIMEDOUT), "{a:?}");
    assert!(a.len() >= 2);
    // The caller still holds the MADs: the slots stay taken until they come back.
    let more = t.sa_sends();
    assert!(more.is_empty(), "zombies keep the window: {}", more.len());
    t.r.handle_sa(t.now, &t.cache, sends[1].0, 110, &sends[1].1);
    t.drain();
    assert_eq!(t.sa_sends().len(), 1);
    // Backlog waiters have a deadline too.
    t.advance(route_config().queue_deadline);
    let a = t.answers();
    assert!(a.iter().all(|x| x.1 == ETIMEDOUT));
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
        let a: Vec<u8> = t.answers().iter().map(|a| a.1).collect();
        if round < 2 {
            assert!(a.is_empty());
            t.advance((100 << round) - 1);
            assert!(t.sa_sends().is_empty(), "backs off");
            t.advance(1);
        } else {
            assert_eq!(a, [ETIMEDOUT], "retries exhausted");
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
    assert_eq!(t.answers()[0].1, ENODATA);
    assert_eq!(t.counts(Counter::NoData), 1);
    let key = PathKey::new(CEP, Dest::Lid(9));
    assert!(matches!(
        t.cache.lookup(&key, t.now),
        Lookup::Negative { .. }
    ));
    t.out.clear();
    // NODELAY miss: ENODATA now, the query still goes out (primes the cache).
    t.request(2, Kind::Resolve, &path_msg(10, 1 << 30, 2));
    assert_eq!(t.answers()[0].1, ENODATA);
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
    assert_eq!((a[0].1, a[0].2.len(), a[0].2[1]), (0, 88, 0x81));
    assert_eq!(a[1].1, 3);
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
        pending: 2,
        ..Capacities::default()
    };
    let mut t = setup(route_config(), caps);
    for c in 0..3 {
        t.request(c, Kind::Resolve, &path_msg(20 + c as u16, 0, c));
    }
    let a = t.answers();
    assert_eq!(a.len(), 1, "third key: no job slot");
    assert_eq!(a[0].1, ENOMEM);
    for c in 3..10 {
        t.request(c, Kind::Resolve, &path_msg(20, 0, c));
    }
    let a = t.answers();
    assert!(a.iter().all(|x| x.1 == ENOMEM));
    assert_eq!(
        a.len(),
        5,
        "4 waiters max (6 slots - 2 reserve), 2 taken already"
    );
    t.r.close_endpoint(t.now, &t.cache, EP);
    t.drain();
    let a = t.answers();
    assert_eq!(a.len(), 4);
    assert!(a.iter().all(|x| x.1 == ENODATA));
    assert!(t.r.is_idle());
    t.request(99, Kind::Resolve, &path_msg(20, 0, 99));
    assert_eq!(t.answers()[0].1, ENODATA);
    t.r.open_endpoint(t.now, EP, ep_config()).unwrap();
    t.request(100, Kind::Resolve, &path_msg(20, 0, 100));
    t.r.shutdown(t.now, &t.cache);
    t.drain();
    assert_eq!(t.answers()[0].1, ENODATA);
    assert!(t.r.is_idle());
    let _ = Via::Resolve;
}

fn gid(n: u8) -> Gid {
    let mut g = port_gid().0;
    g[15] = n;
    Gid(g)
}

fn name_msg(name: &str, tid: u64) -> Vec<u8> {
    acm_core_nostd::resolver::sim::name_msg(name, None, false, tid)
}

fn name(s: &str) -> [u8; 64] {
    acm_core_nostd::resolver::sim::name_bytes(s)
}

#[test]
fn preloaded_routes_answer_by_lid_and_gid_and_survive_reregister() {
    let mut t = setup(route_config(), Capacities::default());
    let mut path = path_to(6);
    PathRecord::new_unchecked(&mut path[..]).set_dgid(gid(6));
    t.r.preload_route(0, &t.cache, EP, CEP, &path);
    // A learned route too.
    t.request(1, Kind::Resolve, &path_msg(7, 0, 1));
    let s = t.sa_sends();
    t.reply(s[0].0, &s[0].1, 0, Some(path_to(7)));
    t.out.clear();
    let lid_keys = |cep| {
        let mut rev = PathKey::new(cep, Dest::Lid(6));
        rev.constraints.mask = acm_core_nostd::cache::constraint::REVERSIBLE_NUMPATH;
        rev.constraints.reversible_numpath = 0x80;
        [
            PathKey::new(cep, Dest::Lid(6)),
            rev,
            PathKey::new(cep, Dest::Gid(gid(6).0)),
        ]
    };
    for k in lid_keys(CEP) {
        assert!(
            matches!(
                t.cache.lookup(&k, 1),
                Lookup::Hit {
                    expires_at: u64::MAX,
                    ..
                }
            ),
            "{k:?}"
        );
    }
    // Reregister: a new generation; the preload is there under it, the learned route is not.
    let new_cep = 0x0100 | CEP;
    t.r.reregister(10, &t.cache, EP, new_cep);
    t.drain();
    for k in lid_keys(new_cep) {
        assert!(matches!(t.cache.lookup(&k, 11), Lookup::Hit { .. }));
    }
    assert_eq!(
        t.cache.lookup(&PathKey::new(CEP, Dest::Lid(7)), 11),
        Lookup::Miss
    );
    assert_eq!(
        t.cache.lookup(&PathKey::new(new_cep, Dest::Lid(7)), 11),
        Lookup::Miss
    );
    t.r.request(
        11,
        &t.cache,
        EP,
        new_cep,
        2,
        Kind::Resolve,
        &path_msg(6, 0, 2),
    );
    t.drain();
    assert!(t.sa_sends().is_empty(), "answered from the preload");
    assert_eq!(t.answers()[0].1, 0);
}

#[test]
fn hosts_preload_resolves_routes_aliases_and_renews() {
    let cfg = Config {
        addr_ttl: Some(10_000),
        ..route_config()
    };
    let mut t = setup(cfg, Capacities::default());
    t.r.preload_address(0, EP, 1, &name("hostA"), gid(9))
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
    assert_eq!(t.answers()[0].1, 0);
    let key = acm_core_nostd::cache::AddrKey::name(CEP, "hostA").unwrap();
    match t.cache.lookup_addr(&key, 1) {
        Lookup::Hit { expires_at, .. } => assert_eq!(expires_at, 10_000, "min(addr, route)"),
        other => panic!("{other:?}"),
    }
    // Expired mapping: renewed on use (AddrQuery, as the plugin did), route from the cache.
    t.now = 10_000;
    assert_eq!(t.cache.lookup_addr(&key, t.now), Lookup::Miss);
    t.out.clear();
    t.request(2, Kind::Resolve, &name_msg("hostA", 2));
    assert_eq!(t.counts(Counter::AddrQuery), 1);
    assert_eq!(t.counts(Counter::RouteCache), 1);
    assert_eq!(t.answers()[0].1, 0);
    assert!(matches!(
        t.cache.lookup_addr(&key, t.now + 1),
        Lookup::Hit { .. }
    ));
}

#[test]
fn local_addresses_loopback_and_removal() {
    let mut t = setup(route_config(), Capacities::default());
    t.r.add_address(0, &t.cache, EP, CEP, 1, &name("me"))
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
    t.r.remove_address(EP, 1, &name("me"));
    t.r.handle_timeout(2, &t.cache);
    assert_eq!(t.cache.lookup_addr(&key, 2), Lookup::Miss);
    t.request(1, Kind::Resolve, &name_msg("me", 1));
    assert_eq!(
        t.answers()[0].1,
        ENODATA,
        "addr_prot none: unknown names answer ENODATA"
    );
    assert_eq!(
        t.r.add_address(0, &t.cache, EP, CEP, 4, &name("x")),
        Err(acm_core_nostd::resolver::Error::AddressType)
    );
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
    t.out.clear();
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
        pending: 1024,
        ..Capacities::default()
    };
    let mut t = setup(route_config(), caps);
    t.cache = PathCache::new(
        PathSlot::boxed(1 << 20),
        AddrSlot::boxed(16),
        CacheConfig::default(),
    )
    .unwrap();
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
        t.r.request(i as u64, &t.cache, EP, CEP, i as u64, Kind::Resolve, m);
        while let Some(o) = t.r.poll_output() {
            match o {
                Output::SendSa { token, mut mad, .. } => {
                    mad[3] = 0x81;
                    let lid = u16::from_be_bytes([mad[96], mad[97]]);
                    mad[56..120].copy_from_slice(&path_to(lid));
                    t.r.handle_sa(i as u64, &t.cache, token, 0, &mad);
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
            t.r.handle_sa(t.now, &t.cache, token, 110, &mad);
            t.drain();
        }
        clients.extend(t.answers().iter().map(|a| a.0));
        t.out.clear();
    }
    t.advance(1_000_000);
    clients.extend(t.answers().iter().map(|a| a.0));
    assert_eq!(clients.len() as u64, asked);
    clients.sort_unstable();
    clients.dedup();
    assert_eq!(clients.len() as u64, asked, "one answer per client");
    assert!(t.r.is_idle());
}
