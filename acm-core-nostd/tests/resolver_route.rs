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
