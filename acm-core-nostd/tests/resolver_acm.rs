//! The ACM side of the resolver against real bytes: the join it sends is the one ibacm sends
//! (and real OpenSM's reply attaches it), the stock libibacmp request is answered with exactly
//! the response acmp accepted, our request has acmp's layout, and malformed MADs are counted
//! and dropped. Also: join retries, leaves at close, names waiting for the join.

use acm_core_nostd::cache::{
    ep_number, AddrKey, AddrKind, AddrSlot, CacheConfig, CacheEp, CacheWriter, Lookup, PathCache,
    PathSlot,
};
use acm_core_nostd::resolver::{
    AcmDest, ArrayStorage, Capacities, Config, EpConfig, EpId, HeapStorage, Kind, MsgBuf, Output,
    RecvMeta, Request, Resolver, Storage,
};
use acm_core_nostd::wire::acm_mad::{AcmMad, AcmResolveRepr, AddressType, CTRL_RESOLVE};
use acm_core_nostd::wire::client::Status;
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::mad::Method;
use acm_core_nostd::wire::mcmember::ACM_QKEY;
use std::sync::Arc;

type Cache = PathCache<Box<[PathSlot]>, Box<[AddrSlot]>>;

const EP: EpId = EpId(0);
const CEP: CacheEp = ep_number(0, EP.0);

fn fixture(name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn name(s: &str) -> [u8; 64] {
    let mut a = [0u8; 64];
    a[..s.len()].copy_from_slice(s.as_bytes());
    a
}

/// The port of the OpenSM fixtures (fe80::10:4).
fn ep_config() -> EpConfig {
    EpConfig {
        port_gid: Gid::from_parts(0xfe80_0000_0000_0000, 0x0010_0004),
        lid: 4,
        pkey: 0xffff,
        mtu: 4,
        rate: 3,
        subnet_timeout_ms: 0,
        qpn: 0x55,
        sa_pkey: true,
    }
}

struct T<S: Storage> {
    r: Resolver<S, Arc<Cache>>,
    cache: Arc<Cache>,
    now: u64,
    /// The message of the last answer drained.
    msg: MsgBuf,
}

/// A cache and its writer (for the resolver to own).
fn new_cache() -> (Arc<Cache>, CacheWriter<Arc<Cache>>) {
    let cache = Arc::new(
        PathCache::new(
            PathSlot::boxed(256),
            AddrSlot::boxed(256),
            CacheConfig::default(),
        )
        .unwrap(),
    );
    let writer = CacheWriter::take(Arc::clone(&cache)).unwrap();
    (cache, writer)
}

fn heap(cfg: Config) -> T<HeapStorage> {
    let caps = Capacities {
        requests: 256,
        jobs: 16,
        addrs: 32,
        endpoints: 4,
        ..Capacities::default()
    };
    let (cache, writer) = new_cache();
    T {
        r: Resolver::new(cfg, HeapStorage::new(caps), writer, 1).unwrap(),
        cache,
        now: 0,
        msg: MsgBuf::new(),
    }
}

impl<S: Storage> T<S> {
    /// A RESOLVE request of client `client` on the endpoint at `now`, classified by the
    /// resolver.
    fn resolve(&mut self, now: u64, client: u64, msg: &[u8]) {
        let r = Request::new(EP, CEP, client, Kind::Resolve, msg);
        self.r.handle_request(now, &r);
    }
    fn drain(&mut self) -> Vec<Output> {
        std::iter::from_fn(|| self.r.poll_output(&mut self.msg)).collect()
    }
    /// Opens the endpoint and joins with the real OpenSM reply; returns the join MAD we sent.
    fn open_and_join(&mut self) -> [u8; 256] {
        self.r.handle_open(self.now, EP, CEP, ep_config()).unwrap();
        let out = self.drain();
        let (token, mad) = out
            .iter()
            .find_map(|o| match o {
                Output::SendSa { token, mad, .. } => Some((*token, *mad)),
                _ => None,
            })
            .expect("a join");
        let mut reply = fixture("opensm_mcm_set_resp.bin");
        reply[8..16].copy_from_slice(&mad[8..16]);
        self.r.handle_sa(self.now, token, 0, &reply);
        let out = self.drain();
        assert!(
            out.iter()
                .any(|o| matches!(o, Output::Attach { group, .. } if group.mlid == 0xc001)),
            "{out:?}"
        );
        mad
    }
    /// Whether the stock request for hca4 from hca3 (acmp_resolve_req.bin), received on
    /// endpoint 0 at `now`, is answered.
    fn answers_stock_request(&mut self, now: u64) -> bool {
        let req = fixture("acmp_resolve_req.bin");
        self.r.handle_acm(now, EP, &meta_from(3, HCA3_GID), &req);
        self.drain()
            .iter()
            .any(|o| matches!(o, Output::SendAcm { .. }))
    }
    /// [`T::open_and_join`], then our local name `hca4` (the destination of
    /// acmp_resolve_req.bin), outputs drained.
    fn open_join_and_add_hca4(&mut self) {
        self.open_and_join();
        self.r
            .handle_add_address(0, EP, CEP, AddrKind::Name, &name("hca4"))
            .unwrap();
        self.drain();
    }
}

/// The port GID of hca3, the requester of acmp_resolve_req.bin.
const HCA3_GID: Gid = Gid::from_parts(0xfe80_0000_0000_0000, 0x0010_0003);

fn meta_from(slid: u16, sgid: Gid) -> RecvMeta {
    RecvMeta {
        slid,
        src_qp: 0x77,
        sl: 0,
        dlid_path_bits: 0,
        pkey_index: 0,
        ep_pkey_index: 0,
        grh_sgid: Some(sgid),
    }
}

#[test]
fn join_is_the_one_ibacm_sends_and_the_opensm_reply_attaches() {
    let mut t = heap(Config::default());
    let mad = t.open_and_join();
    let want = fixture("opensm_mcm_set_req.bin");
    assert_eq!(&mad[..8], &want[..8]);
    assert_eq!(&mad[8..12], &[0; 4], "TID upper half 0");
    assert_eq!(
        &mad[16..],
        &want[16..],
        "header after the TID and the whole record"
    );
}

#[test]
fn stock_acmp_request_gets_the_response_acmp_accepted() {
    let mut t = heap(Config::default());
    t.open_join_and_add_hca4();
    let req = fixture("acmp_resolve_req.bin");
    let requester = HCA3_GID;
    t.r.handle_acm(1, EP, &meta_from(3, requester), &req);
    let out = t.drain();
    let (to, mad) = out
        .iter()
        .find_map(|o| match o {
            Output::SendAcm { to, mad, .. } => Some((*to, *mad)),
            _ => None,
        })
        .expect("a response");
    assert_eq!(mad[..], fixture("acmrs_resolve_resp.bin")[..]);
    let AcmDest::Unicast(av) = to else {
        panic!("unicast expected: {to:?}")
    };
    assert_eq!(
        (av.dlid, av.dgid, av.remote_qpn, av.remote_qkey),
        (3, requester, 0x77, ACM_QKEY)
    );
    assert_eq!((av.sl, av.static_rate, av.src_path_bits), (0, 3, 0));
    // The requester was recorded (hca3 → its GID): resolving it needs no multicast.
    t.resolve(2, 9, &name_request("hca3"));
    let out = t.drain();
    assert!(
        out.iter().any(|o| matches!(o, Output::SendSa { .. })),
        "an SA route query"
    );
    assert!(!out.iter().any(|o| matches!(o, Output::SendAcm { .. })));
    // Not for us: no response, but still recorded.
    let mut other = req.clone();
    other[24..28].copy_from_slice(b"hca9");
    other[88..92].copy_from_slice(b"hca7");
    t.r.handle_acm(3, EP, &meta_from(7, requester), &other);
    assert!(!t
        .drain()
        .iter()
        .any(|o| matches!(o, Output::SendAcm { .. })));
}

fn name_request(dest: &str) -> Vec<u8> {
    acm_core_nostd::sim::name_msg(dest, None, false, 0x77)
}

#[test]
fn our_request_has_acmp_layout_and_an_acmp_response_completes_it() {
    for route_acm in [false, true] {
        let mut t = heap(Config {
            route_acm,
            ..Config::default()
        });
        t.open_and_join();
        let m = acm_core_nostd::sim::name_msg("hca4", Some("hca3"), false, 0x99);
        t.resolve(0, 5, &m);
        let out = t.drain();
        let (to, mad) = out
            .iter()
            .find_map(|o| match o {
                Output::SendAcm { to, mad, .. } => Some((*to, *mad)),
                _ => None,
            })
            .expect("a multicast request");
        assert_eq!(to, AcmDest::Group(0));
        let want = fixture("acmp_resolve_req.bin");
        assert_eq!(&mad[..8], &want[..8]);
        assert_eq!(&mad[8..12], &[0; 4], "32-bit TID like acmp's");
        assert_eq!(&mad[16..], &want[16..], "same record as stock acmp's");
        let r = AcmResolveRepr::parse(&AcmMad::new_checked(&mad[..]).unwrap()).unwrap();
        assert_eq!(
            (r.method, r.control, r.dest_type),
            (Method::Get, CTRL_RESOLVE, AddressType::Name)
        );
        // The response acmp accepted, with our TID.
        let mut resp = fixture("acmrs_resolve_resp.bin");
        resp[8..16].copy_from_slice(&mad[8..16]);
        let peer = Gid::from_parts(0xfe80_0000_0000_0000, 0x0010_0006);
        t.r.handle_acm(1, EP, &meta_from(6, peer), &resp);
        let out = t.drain();
        let answer = out.iter().find_map(|o| match o {
            Output::Answer(a) => Some(*a),
            _ => None,
        });
        if route_acm {
            let a = answer.expect("acm mode answers from the group");
            assert_eq!(a.status, Status::Success);
            let msg = t.msg.message(&a);
            assert_eq!(
                u16::from_be_bytes([msg[24 + 40], msg[24 + 41]]),
                6,
                "DLID = wc.slid"
            );
            assert_eq!(&msg[24 + 8..24 + 24], &peer.0, "DGID = GRH SGID");
            assert_eq!(a.len, 160, "source echoed");
        } else {
            assert!(answer.is_none());
            let (token, q) = out
                .iter()
                .find_map(|o| match o {
                    Output::SendSa { token, mad, .. } => Some((*token, *mad)),
                    _ => None,
                })
                .expect("SA query toward the peer");
            assert_eq!(&q[56 + 8..56 + 24], &peer.0, "dgid");
            assert_eq!(&q[56 + 24..56 + 40], &ep_config().port_gid.0, "sgid");
            assert_eq!(
                u64::from_be_bytes(q[48..56].try_into().unwrap()),
                0x200c,
                "SGID|DGID|PKEY"
            );
            let mut reply = q;
            reply[3] = 0x81;
            reply[56 + 40..56 + 42].copy_from_slice(&6u16.to_be_bytes());
            t.r.handle_sa(2, token, 0, &reply);
            let a = t
                .drain()
                .into_iter()
                .find_map(|o| match o {
                    Output::Answer(a) => Some(a),
                    _ => None,
                })
                .unwrap();
            assert_eq!(a.status, Status::Success);
        }
        // Aliased for the caller's hit path.
        let key = AddrKey::name(CEP, "hca4").unwrap();
        assert!(matches!(t.cache.lookup_addr(&key, 3), Lookup::Hit { .. }));
        // A duplicate of the response: its TID is no longer pending.
        t.r.handle_acm(4, EP, &meta_from(6, peer), &resp);
        assert_eq!(t.r.stats().acm_unknown_tid, 1);
    }
}

#[test]
fn bad_mads_are_counted_and_dropped() {
    let mut t = heap(Config::default());
    t.open_join_and_add_hca4();
    let good = fixture("acmp_resolve_req.bin");
    let peer = HCA3_GID;
    let m = meta_from(3, peer);
    let feed = |t: &mut T<HeapStorage>, mad: &[u8], meta: &RecvMeta| {
        t.r.handle_acm(1, EP, meta, mad);
        let out = t.drain();
        assert!(
            !out.iter().any(|o| matches!(o, Output::SendAcm { .. })),
            "dropped"
        );
    };
    for (at, v) in [
        (0usize, 2u8),
        (1, 0x2d),
        (2, 2),
        (3, 0x02),
        (7, 0x02),
        (20, 7),
    ] {
        let mut b = good.clone();
        b[at] = v;
        feed(&mut t, &b, &m);
    }
    feed(&mut t, &good[..255], &m);
    let mut long = good.clone();
    long.push(0);
    feed(&mut t, &long, &m);
    let mut b = good.clone();
    b[18] = 9; // src_type out of range
    feed(&mut t, &b, &m);
    assert_eq!(t.r.stats().acm_malformed, 9);
    feed(&mut t, &good, &RecvMeta { pkey_index: 1, ..m });
    feed(
        &mut t,
        &good,
        &RecvMeta {
            grh_sgid: None,
            ..m
        },
    );
    assert_eq!(t.r.stats().acm_wrong_key, 2);
    let mut b = good.clone();
    b[152..154].copy_from_slice(&[0xff, 0x12]); // a group we did not join
    feed(&mut t, &b, &m);
    assert_eq!(t.r.stats().acm_no_group, 1);
    let mut b = fixture("acmrs_resolve_resp.bin");
    b[15] = 0x42;
    feed(&mut t, &b, &m);
    assert_eq!(t.r.stats().acm_unknown_tid, 1);
    // SA replies nobody asked for.
    t.r.handle_sa(1, 0x0100_0005_0000_0001, 0, &[0u8; 256]);
    t.r.handle_sa(1, 0xff00_0000_0000_0000, 0, &[]);
    assert_eq!(t.r.stats().sa_unknown, 2);
    // Random bytes never panic.
    let mut x = 0x1234_5678_9abc_def0u64;
    for _ in 0..20_000 {
        let mut b = good.clone();
        for _ in 0..8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b[(x % 256) as usize] = (x >> 8) as u8;
        }
        t.r.handle_acm(1, EP, &m, &b);
        t.r.handle_sa(1, x, (x >> 60) as u32, &b);
        t.drain();
    }
}

#[test]
fn join_failures_are_retried_with_backoff_and_names_wait_for_the_join() {
    let cfg = Config {
        queue_deadline: 20_000,
        // Only the join's SA traffic here (subscriptions have their own test).
        sa_reports: false,
        ..Config::default()
    };
    let mut t = heap(cfg);
    t.r.handle_open(0, EP, CEP, ep_config()).unwrap();
    let token = |out: &[Output]| {
        out.iter().find_map(|o| match o {
            Output::SendSa { token, mad, .. } => Some((*token, *mad)),
            _ => None,
        })
    };
    let (tok, mad) = token(&t.drain()).unwrap();
    // A name asked before the join: waits.
    t.resolve(0, 1, &name_request("hca9"));
    assert!(t.drain().is_empty());
    t.r.handle_sa(10, tok, 110, &mad); // umad timeout
    assert!(token(&t.drain()).is_none());
    let mut at = 10;
    for wait in [1000u64, 2000, 4000] {
        assert_eq!(t.r.poll_timeout(), Some(at + wait));
        t.r.handle_timeout(at + wait);
        at += wait;
        let (tok, mad) = token(&t.drain()).expect("join again");
        let mut reply = mad;
        reply[3] = 0x81;
        reply[4] = 0x02; // SA error
        t.r.handle_sa(at, tok, 0, &reply);
        t.drain();
    }
    t.r.handle_timeout(at + 8000);
    let (tok, mad) = token(&t.drain()).unwrap();
    let mut reply = fixture("opensm_mcm_set_resp.bin");
    reply[8..16].copy_from_slice(&mad[8..16]);
    t.r.handle_sa(at + 8000, tok, 0, &reply);
    let out = t.drain();
    assert!(out.iter().any(|o| matches!(o, Output::Attach { .. })));
    assert!(
        out.iter().any(|o| matches!(
            o,
            Output::SendAcm {
                to: AcmDest::Group(0),
                ..
            }
        )),
        "the waiting name goes out once joined"
    );
    // Nobody answers: ETIMEDOUT after the tries (timeout 2000 + subnet timeout 0, 3 tries).
    let mut a = None;
    let mut sends = 1;
    while a.is_none() {
        let next = t.r.poll_timeout().expect("a timer");
        t.r.handle_timeout(next);
        for o in t.drain() {
            match o {
                Output::Answer(x) => a = Some((x.status, next - (at + 8000))),
                Output::SendAcm { .. } => sends += 1,
                _ => {}
            }
        }
    }
    assert_eq!(a, Some((Status::Etimedout, 6000)));
    assert_eq!(sends, 3);
    // A name asked while never joined: ENODATA at the queue deadline.
    let mut t = heap(Config {
        queue_deadline: 5000,
        ..Config::default()
    });
    t.r.handle_open(0, EP, CEP, ep_config()).unwrap();
    t.drain();
    t.resolve(0, 1, &name_request("hca9"));
    t.r.handle_timeout(5000);
    let a = t.drain().into_iter().find_map(|o| match o {
        Output::Answer(a) => Some(a.status),
        _ => None,
    });
    assert_eq!(a, Some(Status::Enodata));
}

/// Joins the SA never answers: every SET, the retries included, runs out its deadline and is
/// sent again after the backoff, for as long as it takes. (A retry decided inside
/// `handle_timeout` once fell out of the timer scan, so a second lost SET was never retried
/// and the endpoint stayed unjoined until the next reregister.)
#[test]
fn lost_joins_are_retried_for_as_long_as_it_takes() {
    let cfg = Config {
        sa_reports: false,
        ..Config::default()
    };
    let deadline = cfg.sa_deadline;
    let mut t = heap(cfg);
    t.r.handle_open(0, EP, CEP, ep_config()).unwrap();
    let sets = |out: &[Output]| {
        out.iter()
            .filter(|o| matches!(o, Output::SendSa { mad, .. } if mad[3] == 2))
            .count()
    };
    assert_eq!(sets(&t.drain()), 1);
    let mut sent_at = vec![0u64];
    while sent_at.len() < 6 {
        let next =
            t.r.poll_timeout()
                .expect("a lost join keeps a timer running");
        t.r.handle_timeout(next);
        for _ in 0..sets(&t.drain()) {
            sent_at.push(next);
        }
        assert!(next < 200_000, "joins sent at {sent_at:?}");
    }
    // Each SET waits its deadline, then 1 s, 2 s, 4 s, 8 s, 16 s of backoff.
    let gaps: Vec<u64> = sent_at.windows(2).map(|w| w[1] - w[0]).collect();
    let want: Vec<u64> = [1000, 2000, 4000, 8000, 16000]
        .iter()
        .map(|b| deadline + b)
        .collect();
    assert_eq!(gaps, want);
}

#[test]
fn close_detaches_and_leaves() {
    let mut t = heap(Config::default());
    t.open_and_join();
    t.r.handle_close(5, EP);
    let out = t.drain();
    assert!(matches!(out[0], Output::Detach { group, .. } if group.mlid == 0xc001));
    let Output::SendSa { mad, .. } = out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(mad[3], 0x15, "MCMemberRecord DELETE");
    assert_eq!(
        &mad[56..72],
        &fixture("opensm_mcm_set_req.bin")[56..72],
        "same MGID"
    );
    // Reopen: the same endpoint joins again.
    t.r.handle_open(6, EP, CEP, ep_config()).unwrap();
    assert!(t
        .drain()
        .iter()
        .any(|o| matches!(o, Output::SendSa { mad, .. } if mad[3] == 2)));
}

/// Static storage: a resolver over `ArrayStorage` works like the heap one. Its parts borrow
/// the tables for the resolver's life; a second resolver over the same tables, left full by
/// the first (an endpoint open, a local address, a learned peer, requests answered), starts
/// from empty slabs.
#[test]
fn array_storage_resolver() {
    let mut storage: Box<ArrayStorage<32, 2, 4, 8, 2, 2>> = Box::new(ArrayStorage::new());
    for seed in [3, 4] {
        let (cache, writer) = new_cache();
        let mut t = T {
            r: Resolver::new(Config::default(), &mut *storage, writer, seed).unwrap(),
            cache,
            now: 0,
            msg: MsgBuf::new(),
        };
        t.r.check_invariants().unwrap();
        t.open_join_and_add_hca4();
        assert!(t.answers_stock_request(1));
        // Requests for three LIDs wait for the SA.
        for c in 0..3 {
            let m = acm_core_nostd::sim::lid_msg(0x100 + c as u16, false, c);
            t.resolve(2, c, &m);
        }
        t.drain();
        t.r.check_invariants().unwrap();
        assert!(!t.r.is_idle(), "seed {seed}: requests wait");
    }
}

/// An endpoint without a UD QP (QPN 0) joins nothing and speaks no ACM protocol: names not in
/// the hosts preload answer ENODATA at once, PATH requests go to the SA.
#[test]
fn an_endpoint_without_a_ud_qp_joins_nothing() {
    let mut t = heap(Config {
        route_acm: true,
        ..Config::default()
    });
    let cfg = EpConfig {
        qpn: 0,
        rate: 7,
        ..ep_config()
    };
    t.r.handle_open(0, EP, CEP, cfg).unwrap();
    assert!(t.drain().is_empty(), "no MCMemberRecord SET");
    t.resolve(0, 1, &name_request("hca9"));
    let out = t.drain();
    let status = out.iter().find_map(|o| match o {
        Output::Answer(a) => Some(a.status),
        _ => None,
    });
    assert_eq!(status, Some(Status::Enodata));
    assert!(!out.iter().any(|o| matches!(o, Output::SendAcm { .. })));
    let path = acm_core_nostd::sim::lid_msg(6, false, 2);
    t.resolve(0, 2, &path);
    assert!(t
        .drain()
        .iter()
        .any(|o| matches!(o, Output::SendSa { mad, .. } if mad[17] == 0x35)));
}

#[test]
fn a_request_for_an_address_of_another_partitions_endpoint_is_counted_not_answered() {
    let mut t = heap(Config::default());
    t.open_join_and_add_hca4();
    // A second endpoint of the port, in partition 0x8001, serving hca4-8001.
    let tenant = EpId(1);
    let cfg = EpConfig {
        pkey: 0x8001,
        qpn: 0x56,
        sa_pkey: false,
        ..ep_config()
    };
    t.r.handle_open(1, tenant, ep_number(0, tenant.0), cfg)
        .unwrap();
    t.r.handle_add_address(
        1,
        tenant,
        ep_number(0, tenant.0),
        AddrKind::Name,
        &name("hca4-8001"),
    )
    .unwrap();
    t.drain();
    // hca3 asks the default partition's group for hca4-8001: it arrives on endpoint 0,
    // which must not answer for an address of the 0x8001 endpoint.
    let mut req = fixture("acmp_resolve_req.bin");
    req[24..33].copy_from_slice(b"hca4-8001");
    t.r.handle_acm(2, EP, &meta_from(3, HCA3_GID), &req);
    assert!(!t
        .drain()
        .iter()
        .any(|o| matches!(o, Output::SendAcm { .. })));
    assert_eq!(t.r.stats().acm_other_partition, 1);
    // A name nobody here serves is ordinary multicast traffic: not counted.
    let mut other = fixture("acmp_resolve_req.bin");
    other[24..28].copy_from_slice(b"hca9");
    t.r.handle_acm(3, EP, &meta_from(3, HCA3_GID), &other);
    assert_eq!(t.r.stats().acm_other_partition, 1);
    // Its own name is still answered on endpoint 0.
    assert!(t.answers_stock_request(4));
}
