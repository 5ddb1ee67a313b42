//! What is cached and served from the cache: hits per request constraints, NODELAY priming,
//! route lifetime and refresh-ahead, the route preload, the hosts preload (names and IPs,
//! their lifetime, loopback, removal), and the counters `ib_acme -P` shows.
//!
//! Lifetimes are tested in virtual time: [`advance_clock`] moves the dataplane's clock (the
//! coarse clock cache hits read, and its timers) ahead and returns once the worker observed it.
//! Lifetimes are an hour or more and the clock is moved by whole minutes, so the real time a
//! loaded machine adds between two steps (virtual time is real time plus the advances) never
//! moves a step across a boundary.

mod common;

use acm_core_nostd::wire::client::Status;
use acm_testkit::core::*;
use acm_testkit::host::*;
use acm_testkit::request::*;
use acmrs::ffi::*;
use common::OPTS;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[test]
fn constraints_are_part_of_the_cache_key() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let plain = h.tid();
    h.resolve(ep, &path_request(plain, 6, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    // Same DLID, but SL 3 and a service ID: must not be answered with the plain path.
    let mut m = path_request(h.tid(), 6, None, 0);
    let t_sl = m.hdr.tid;
    m.resolve_data[0].info.bytes[52..54].copy_from_slice(&3u16.to_be_bytes());
    m.resolve_data[0].info.bytes[0..8].copy_from_slice(&0x1234u64.to_be_bytes());
    h.resolve(ep, &m, 1);
    assert!(find(t_sl).is_empty(), "must not be a cache hit");
    sa_one(SaAction::Answer, 2);
    let p = path_of(&find(t_sl)[0].msg);
    assert_eq!(p[53] & 0xf, 3, "SL constraint honoured");
    assert_eq!(&p[0..8], &0x1234u64.to_be_bytes());
    // Each is now a hit for its own constraints (answered inside resolve()).
    let mut m2 = m;
    m2.hdr.tid = h.tid();
    h.resolve(ep, &m2, 1);
    assert_eq!(sl_of(&find(m2.hdr.tid)[0].msg), 3);
    let t4 = h.tid();
    h.resolve(ep, &path_request(t4, 6, None, 0), 1);
    assert_eq!(sl_of(&find(t4)[0].msg), 0);
    // Asking for our own SLID / P_Key explicitly is the same key as not asking.
    let mut m3 = path_request(h.tid(), 6, None, 0);
    m3.resolve_data[0].info.bytes[42..44].copy_from_slice(&7u16.to_be_bytes());
    m3.resolve_data[0].info.bytes[50..52].copy_from_slice(&0xffffu16.to_be_bytes());
    h.resolve(ep, &m3, 1);
    assert_eq!(find(m3.hdr.tid).len(), 1, "normalised to the plain key");
    h.close();
}

#[test]
fn nodelay_answers_enodata_and_primes_the_cache() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let sends = SENDS.load(Ordering::SeqCst);
    let t = h.tid();
    h.resolve(ep, &path_request(t, 30, None, ACM_FLAGS_NODELAY), 1);
    assert_eq!(find(t)[0].status(), Status::Enodata, "answered inline");
    assert!(wait_until(|| sa_pending() == 1), "lookup started anyway");
    sa_complete_next(SaAction::Answer);
    // The cache fills from that one SA answer (the test answers no other MAD): a NODELAY
    // request soon succeeds inline.
    let mut tids = vec![t];
    let t0 = Instant::now();
    let hit = loop {
        let t2 = h.tid();
        tids.push(t2);
        h.resolve(ep, &path_request(t2, 30, None, ACM_FLAGS_NODELAY), 1);
        let r = find(t2);
        assert_eq!(r.len(), 1, "NODELAY is always answered inline");
        if r[0].status() == Status::Success {
            break r[0].clone();
        }
        assert!(t0.elapsed() < W, "cache never primed");
        std::thread::sleep(Duration::from_millis(2));
    };
    assert_eq!(dlid_of(&hit.msg), 30);
    // The priming query is not answered again (every request was taken in by now).
    h.barrier();
    check_exactly_once(&tids).unwrap();
    assert_eq!(SENDS.load(Ordering::SeqCst) - sends, 1, "one priming query");
    h.close();
}

/// One minute of virtual time.
const MIN: Duration = Duration::from_secs(60);

/// `acmrs_route_ttl_ms`: a route is served while fresh and queried again once expired.
#[test]
fn routes_expire_after_their_lifetime() {
    let _s = serial();
    // Routes live an hour (no refresh: acmrs_refresh_ahead_pct 0).
    let mut h = Host::open(
        &format!("{OPTS}acmrs_route_ttl_ms 3600000\nacmrs_refresh_ahead_pct 0\n"),
        &[],
    );
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t = h.tid();
    h.resolve(ep, &path_request(t, 50, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    let t2 = h.tid();
    h.resolve(ep, &path_request(t2, 50, None, 0), 1);
    assert_eq!(find(t2).len(), 1, "hit while fresh");
    // 59 minutes on: still fresh.
    advance_clock(59 * MIN);
    let t2b = h.tid();
    h.resolve(ep, &path_request(t2b, 50, None, 0), 1);
    assert_eq!(find(t2b).len(), 1, "hit a minute before expiry");
    // 61 minutes on: expired.
    advance_clock(2 * MIN);
    let t3 = h.tid();
    h.resolve(ep, &path_request(t3, 50, None, 0), 1);
    assert!(find(t3).is_empty(), "expired route is not served");
    sa_one(SaAction::Answer, 4);
    assert_eq!(h.perf(ep)[cntr::ROUTE_QUERY], 2);
    h.close();
}

#[test]
fn refresh_ahead_requeries_once_and_updates_in_place() {
    let _s = serial();
    // Routes live 60 min; the last 25% (15 min) of that is the refresh window.
    let opts = format!("{OPTS}acmrs_route_ttl_ms 3600000\nacmrs_refresh_ahead_pct 25\n");
    let mut h = Host::open(&opts, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t = h.tid();
    h.resolve(ep, &path_request(t, 50, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    let old = path_of(&find(t)[0].msg);
    let t1 = h.tid();
    h.resolve(ep, &path_request(t1, 50, None, 0), 1);
    assert_eq!(find(t1).len(), 1, "fresh hit inline");
    // 44 minutes on: a minute before the window, still no refresh.
    advance_clock(44 * MIN);
    let t2 = h.tid();
    h.resolve(ep, &path_request(t2, 50, None, 0), 1);
    assert_eq!(find(t2).len(), 1, "fresh hit inline");
    h.barrier();
    assert_eq!(sa_pending(), 0, "no refresh outside the window");
    // 50 minutes on: inside the window (45..60 min after caching).
    advance_clock(6 * MIN);
    for _ in 0..6 {
        let tn = h.tid();
        h.resolve(ep, &path_request(tn, 50, None, 0), 1);
        let r = find(tn);
        assert_eq!(
            r.len(),
            1,
            "answered inline from the cache during the refresh"
        );
        assert_eq!(r[0].status(), Status::Success);
        assert_eq!(path_of(&r[0].msg), old);
    }
    h.barrier();
    assert_eq!(
        sa_pending(),
        1,
        "exactly one SA query for six near-expiry hits"
    );
    assert_eq!(h.perf(ep)[cntr::ROUTE_QUERY], 2);
    sa_complete_next(SaAction::AnswerLife(0x95));
    // The entry is updated in place: new record, new lifetime (past the old expiry).
    assert!(wait_until(|| {
        let tn = 0x7777_0000_0000 + uniq();
        h.resolve(ep, &path_request(tn, 50, None, 0), 1);
        find(tn)
            .first()
            .is_some_and(|r| path_of(&r.msg)[56] == 0x95)
    }));
    // 65 minutes on: past the original expiry (60), before the new entry's window (50 + 45).
    advance_clock(15 * MIN);
    let t9 = h.tid();
    h.resolve(ep, &path_request(t9, 50, None, 0), 1);
    let r = find(t9);
    assert_eq!(r.len(), 1, "still a hit after the original expiry");
    assert_eq!(path_of(&r[0].msg)[56], 0x95);
    h.barrier();
    assert_eq!(sa_pending(), 0);
    assert_eq!(h.perf(ep)[cntr::ROUTE_QUERY], 2, "no miss query");
    h.close();
}

#[test]
fn route_preload_opensm_full_v1() {
    let _s = serial();
    let dump = "\
Channel Adapter 0x0002c90300a1b2c3, base LID 7, \"Me\", port 1
# LID  : SL : MTU : RATE
0x0007 : 0  : 4   : 3
0x000b : 2  : 4   : 6
0x000c : 1  : 3   : 3
0x000d : UNREACHABLE
0x000c : x  : 3   : 3

Channel Adapter 0x000000000000100b, base LID 11, \"Other\", port 1
0x0007 : 2  : 4   : 6

Switch 0x000000000000100c, base LID 12, \"Sw\", port 0
0x0007 : 1  : 3   : 3
";
    let opts = format!("{OPTS}route_preload opensm_full_v1\nroute_data_file $DIR/route.data\n");
    let mut h = Host::open(&opts, &[("route.data", dump)]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    assert!(log_contains("route.data line 7"), "bad path line reported");
    assert!(wait_until(|| log_contains("preloaded routes inserted")));
    let t = h.tid();
    h.resolve(ep, &path_request(t, 11, None, 0), 1);
    let r = find(t);
    assert_eq!(r.len(), 1, "preloaded: answered inline");
    let p = path_of(&r[0].msg);
    assert_eq!(dlid_of(&r[0].msg), 11);
    assert_eq!(p[53] & 0xf, 2, "SL from the dump");
    assert_eq!(p[55], 6, "rate from the dump");
    assert_eq!(&p[8..24], &gid_of(0x100b));
    let tg = h.tid();
    h.resolve(ep, &path_request(tg, 0, Some(gid_of(0x100c)), 0), 1);
    assert_eq!(dlid_of(&find(tg)[0].msg), 12);
    assert_eq!(sa_pending(), 0);
    // Other constraints are not answered from the preload.
    let mut m = path_request(h.tid(), 11, None, 0);
    m.resolve_data[0].info.bytes[48] = 5; // TClass
    h.resolve(ep, &m, 1);
    assert!(find(m.hdr.tid).is_empty());
    sa_one(SaAction::Answer, 3);
    // Reregister keeps preloaded routes (inserted again under the new flush generation);
    // unreachable ones are not preloaded.
    h.reregister();
    assert!(wait_until(|| log_contains("learned routes flushed")));
    let t2 = h.tid();
    h.resolve(ep, &path_request(t2, 11, None, 0), 1);
    assert_eq!(find(t2).len(), 1);
    let t3 = h.tid();
    h.resolve(ep, &path_request(t3, 13, None, 0), 1);
    assert!(find(t3).is_empty(), "UNREACHABLE is not preloaded");
    sa_one(SaAction::Answer, 5);
    h.close();
}

/// Two entries per route: N preloaded routes cost 2N path entries (by DLID and by DGID), and
/// each route answers from the cache inside `resolve()` — by LID and by GID, with and without
/// the reversible bit — with the same record and no SA query, before and after a reregister.
#[test]
fn a_preloaded_route_is_two_path_entries() {
    let _s = serial();
    const N: u16 = 40;
    let dump = common::route_dump(N, 0x20, 0x2000);
    let opts = format!("{OPTS}route_preload opensm_full_v1\nroute_data_file $DIR/route.data\n");
    let mut h = Host::open(&opts, &[("route.data", &dump)]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let want = format!("{N} preloaded routes inserted: {} path entries", 2 * N);
    assert!(wait_until(|| log_contains(&want)), "want {want:?}");
    assert!(!log_contains("route preload:"), "nothing evicted");
    let me = std::thread::current().id();
    let check = |h: &mut Host| {
        for i in 0..N {
            let (dlid, dgid) = (0x20 + i, gid_of(0x2000 + u64::from(i)));
            let mut records = Vec::new();
            for (l, g) in [(dlid, None), (0, Some(dgid))] {
                for rev in [false, true] {
                    let t = h.tid();
                    let mut m = path_request(t, l, g, 0);
                    if rev {
                        m.resolve_data[0].info.bytes[49] = 0x81; // reversible, NumbPath 1
                    }
                    h.resolve(ep, &m, 1);
                    let r = find(t);
                    assert_eq!(
                        r.len(),
                        1,
                        "route {i} by {l}/{g:?} rev {rev}: answered inline"
                    );
                    assert_eq!(r[0].thread, me, "from the cache, inside resolve()");
                    assert_eq!(r[0].status(), Status::Success);
                    assert_eq!((dlid_of(&r[0].msg), dgid_of(&r[0].msg)), (dlid, dgid));
                    records.push(path_of(&r[0].msg));
                }
            }
            assert!(
                records.windows(2).all(|w| w[0] == w[1]),
                "route {i}: one record"
            );
        }
        assert_eq!(
            sa_pending(),
            0,
            "no key of a preloaded route went to the SA"
        );
    };
    check(&mut h);
    h.reregister();
    assert!(wait_until(|| log_contains("learned routes flushed")));
    check(&mut h);
    h.close();
}

#[test]
fn names_from_hosts_file_loopback_and_source_echo() {
    let _s = serial();
    let hosts = "# hosts\nnode9 fe80::1009\n10.0.0.9 fe80::1009\nfe80::9 fe80::1009\nbad-line\n";
    let opts = format!("{OPTS}addr_preload acm_hosts\naddr_data_file $DIR/hosts.data\n");
    let mut h = Host::open(&opts, &[("hosts.data", hosts)]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    h.add_addr(ep, ACM_ADDRESS_IP, &[10, 0, 0, 7]);
    assert!(log_contains("line 5"), "bad hosts line reported");
    let me = std::thread::current().id();
    // Remote name → hosts → SA by DGID.
    let t = h.tid();
    h.resolve(
        ep,
        &dest_request(
            t,
            (ACM_ADDRESS_NAME, b"node7"),
            (ACM_ADDRESS_NAME, b"node9"),
            0,
        ),
        4,
    );
    sa_one(SaAction::Answer, 1);
    let r = &find(t)[0];
    assert_eq!(r.status(), Status::Success);
    assert_eq!(dlid_of(&r.msg), 9);
    assert_eq!(r.msg.hdr.length, 16 + 2 * 72, "source echoed");
    assert_eq!(r.msg.resolve_data[1].flags, ACM_EP_FLAG_SOURCE);
    assert_eq!(r.msg.resolve_data[1].type_, ACM_ADDRESS_NAME);
    assert_eq!(&r.msg.resolve_data[1].info.bytes[..5], b"node7");
    // The same GID by IPv4 and IPv6: one cached route. The first use of each address is
    // answered by the dataplane from the route cache (the address is known from the hosts
    // file, its alias not made yet), with no SA query; after that it is a hit inline.
    let sends = SENDS.load(Ordering::SeqCst);
    let mut v6 = [0u8; 16];
    v6[0] = 0xfe;
    v6[1] = 0x80;
    v6[15] = 9;
    for dst in [
        (ACM_ADDRESS_IP, &[10, 0, 0, 9][..]),
        (ACM_ADDRESS_IP6, &v6[..]),
    ] {
        let req = |t| dest_request(t, (ACM_ADDRESS_NAME, b"node7"), dst, 0);
        let t1 = h.tid();
        h.resolve(ep, &req(t1), 4);
        assert!(wait_until(|| find(t1).len() == 1));
        let r = &find(t1)[0];
        assert_eq!((r.status(), dlid_of(&r.msg)), (Status::Success, 9));
        // By a round of the loop: on its thread, or on ours inside resolve() when the loop
        // was free; never by the SA completion handler.
        assert!(r.from_dataplane() || r.inside == Inside::ClientCall);
        assert_eq!(r.msg.hdr.length, 16 + 2 * 72, "source echoed");
        assert_eq!(&r.msg.resolve_data[1].info.bytes[..5], b"node7");
        let t2 = h.tid();
        h.resolve(ep, &req(t2), 4);
        let r = find(t2);
        assert_eq!(r.len(), 1, "aliased: a hit inside resolve()");
        assert_eq!((r[0].status(), dlid_of(&r[0].msg)), (Status::Success, 9));
        assert_eq!(r[0].thread, me);
    }
    assert_eq!(SENDS.load(Ordering::SeqCst), sends, "no SA query for them");
    // Loopback to our own name and IP: inline, LID from ibv_query_port.
    for dst in [
        (ACM_ADDRESS_NAME, &b"node7"[..]),
        (ACM_ADDRESS_IP, &[10, 0, 0, 7][..]),
    ] {
        let tl = h.tid();
        h.resolve(
            ep,
            &dest_request(tl, (ACM_ADDRESS_NAME, b"node7"), dst, 0),
            4,
        );
        let r = &find(tl)[0];
        assert_eq!(r.status(), Status::Success);
        assert_eq!(dlid_of(&r.msg), 7);
        assert_eq!(dgid_of(&r.msg), gid_of(OWN_GUID));
    }
    // Unknown name → ENODATA (addr_prot none: the hosts file is all there is), from the
    // dataplane, which holds the address entries.
    let tu = h.tid();
    h.resolve(
        ep,
        &dest_request(
            tu,
            (ACM_ADDRESS_NAME, b"node7"),
            (ACM_ADDRESS_NAME, b"ghost"),
            0,
        ),
        4,
    );
    assert!(wait_until(|| find(tu).len() == 1));
    assert_eq!(find(tu)[0].status(), Status::Enodata);
    let perf = h.perf(ep);
    // ibacmp's meaning: ADDR_CACHE only when the address is known and its route is not.
    // node9 by name, IPv4 and IPv6 is one GID, so one route: only the first use missed.
    // (ibacmp keeps a route per destination *address*, so it would count 3 here and send 3
    // SA queries; acmrs shares the route, documented in docs/plugin.md.)
    assert_eq!(perf[cntr::ADDR_CACHE], 1);
    assert_eq!(perf[cntr::NODATA], 1);
    // From the moment remove_address returns, the IP is no longer local.
    h.remove_addr(ep, 1);
    let tr = h.tid();
    h.resolve(
        ep,
        &dest_request(
            tr,
            (ACM_ADDRESS_NAME, b"node7"),
            (ACM_ADDRESS_IP, &[10, 0, 0, 7]),
            0,
        ),
        4,
    );
    assert!(wait_until(|| find(tr).len() == 1));
    assert_eq!(
        find(tr)[0].status(),
        Status::Enodata,
        "a removed address is not served"
    );
    h.close();
}

#[test]
fn expired_host_mappings_are_renewed_and_counted_like_ibacmp() {
    let _s = serial();
    let hosts = "node9 fe80::1009\n";
    // addr_timeout 0: a mapping expires at once, so every use renews it from the hosts file.
    let opts =
        format!("{OPTS}addr_preload acm_hosts\naddr_data_file $DIR/hosts.data\naddr_timeout 0\n");
    let mut h = Host::open(&opts, &[("hosts.data", hosts)]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let req = |t| {
        dest_request(
            t,
            (ACM_ADDRESS_NAME, b"node7"),
            (ACM_ADDRESS_NAME, b"node9"),
            0,
        )
    };
    let t = h.tid();
    h.resolve(ep, &req(t), 4);
    sa_one(SaAction::Answer, 1);
    assert_eq!(dlid_of(&find(t)[0].msg), 9);
    // ibacmp: an expired mapping is an address query (ACM_CNTR_ADDR_QUERY), not an address
    // cache hit: ADDR_CACHE counts only requests that found the address known.
    let perf = h.perf(ep);
    assert_eq!(
        (perf[cntr::ADDR_QUERY], perf[cntr::ADDR_CACHE]),
        (1, 0),
        "first use: the mapping had expired"
    );
    // The route is cached now, but the address mapping has expired: not answered inline; the
    // dataplane renews the name and answers from the route cache.
    let t2 = h.tid();
    h.resolve(ep, &req(t2), 4);
    assert!(wait_responses(2, W));
    let r = &find(t2)[0];
    assert_eq!(r.status(), Status::Success);
    assert_eq!(dlid_of(&r.msg), 9);
    // Not a hit (the counters below say so: an address query, no address cache hit),
    // answered by a round of the loop: on its thread, or on ours inside resolve() when the
    // loop was free.
    assert!(r.from_dataplane() || r.inside == Inside::ClientCall);
    assert_eq!(sa_pending(), 0, "the route itself was cached");
    let perf = h.perf(ep);
    assert_eq!(perf[cntr::ADDR_QUERY], 2, "two renewals");
    assert_eq!(perf[cntr::ADDR_CACHE], 0, "no address cache hit");
    assert_eq!(perf[cntr::ROUTE_CACHE], 1);
    h.close();
    // With the default (1440 minutes) the same name is known: an address cache hit.
    let opts = format!("{OPTS}addr_preload acm_hosts\naddr_data_file $DIR/hosts.data\n");
    let mut h = Host::open(&opts, &[("hosts.data", hosts)]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t = h.tid();
    h.resolve(ep, &req(t), 4);
    sa_one(SaAction::Answer, 1);
    let perf = h.perf(ep);
    assert_eq!((perf[cntr::ADDR_QUERY], perf[cntr::ADDR_CACHE]), (0, 1));
    h.close();
}

/// `ib_acme -P` "Addr Cache Count" means what it means with ibacmp: counted when a name's
/// address is known but its route is not (ADDR_RESOLVED); a name whose route is cached is a
/// route cache hit only.
#[test]
fn repeated_name_hits_count_like_ibacmp() {
    let _s = serial();
    let hosts = "node9 fe80::1009\n";
    let mut h = Host::open(
        "log_level 0\naddr_preload acm_hosts\naddr_data_file $DIR/hosts.data\n",
        &[("hosts.data", hosts)],
    );
    h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let req = |t| {
        dest_request(
            t,
            (ACM_ADDRESS_NAME, b"node7"),
            (ACM_ADDRESS_NAME, b"node9"),
            0,
        )
    };
    let p0 = h.perf(0);
    h.resolve(0, &req(1), 4);
    sa_one(SaAction::Answer, 1);
    // The dataplane counts before it answers: the counters are final for this request.
    let before = h.perf(0);
    for t in 2..5 {
        h.resolve(0, &req(t), 4);
        assert_eq!(find(t).len(), 1, "a hit inside resolve()");
    }
    let after = h.perf(0);
    h.close();
    assert_eq!(
        before[cntr::ADDR_CACHE] - p0[cntr::ADDR_CACHE],
        1,
        "first use: address known, route not"
    );
    assert_eq!(before[cntr::ROUTE_QUERY] - p0[cntr::ROUTE_QUERY], 1);
    assert_eq!(
        after[cntr::ROUTE_CACHE] - before[cntr::ROUTE_CACHE],
        3,
        "route cache hits"
    );
    assert_eq!(
        after[cntr::ADDR_CACHE],
        before[cntr::ADDR_CACHE],
        "no ADDR_CACHE for READY hits"
    );
}

/// A reopened endpoint starts at a new flush generation (so nothing of its predecessor is
/// served): the hosts preload, loopback and route preload still work under it, from the
/// first request on.
#[test]
fn preloads_and_loopback_work_after_an_endpoint_reopen() {
    let _s = serial();
    let hosts = "node9 fe80::1009\n";
    let dump =
        "Channel Adapter 0x0002c90300a1b2c3, base LID 7, \"Me\", port 1\n0x000b : 2 : 4 : 6\n\n\
                Channel Adapter 0x000000000000100b, base LID 11, \"Other\", port 1\n";
    let opts = format!(
        "{OPTS}addr_preload acm_hosts\naddr_data_file $DIR/hosts.data\n\
         route_preload opensm_full_v1\nroute_data_file $DIR/route.data\n"
    );
    let mut h = Host::open(&opts, &[("hosts.data", hosts), ("route.data", dump)]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    h.close_ep(ep);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    h.barrier();
    // Route preload: inline.
    let t = h.tid();
    h.resolve(ep, &path_request(t, 11, None, 0), 1);
    assert_eq!(find(t).len(), 1, "preloaded route answered inline");
    assert_eq!(dlid_of(&find(t)[0].msg), 11);
    // Loopback: inline.
    let tl = h.tid();
    h.resolve(
        ep,
        &dest_request(
            tl,
            (ACM_ADDRESS_NAME, b"node7"),
            (ACM_ADDRESS_NAME, b"node7"),
            0,
        ),
        1,
    );
    assert_eq!(find(tl).len(), 1, "loopback answered inline");
    assert_eq!(
        (find(tl)[0].status(), dlid_of(&find(tl)[0].msg)),
        (Status::Success, 7)
    );
    // Hosts name (its GID's route is not preloaded): one SA query, then a hit.
    let req = |t| {
        dest_request(
            t,
            (ACM_ADDRESS_NAME, b"node7"),
            (ACM_ADDRESS_NAME, b"node9"),
            0,
        )
    };
    let tn = h.tid();
    h.resolve(ep, &req(tn), 1);
    sa_one(SaAction::Answer, 3);
    assert_eq!(
        (find(tn)[0].status(), dlid_of(&find(tn)[0].msg)),
        (Status::Success, 9)
    );
    let tn2 = h.tid();
    h.resolve(ep, &req(tn2), 1);
    assert_eq!(find(tn2).len(), 1, "a hit inside resolve()");
    h.close();
}

/// An SA "no record" answer is remembered for `acmrs_negative_ttl_ms` (answered inline, no SA
/// query), then asked again.
#[test]
fn no_record_answers_are_remembered_for_their_lifetime() {
    let _s = serial();
    // Remembered for an hour.
    let mut h = Host::open(&format!("{OPTS}acmrs_negative_ttl_ms 3600000\n"), &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t = h.tid();
    h.resolve(ep, &path_request(t, 0xc000, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    assert_eq!(find(t)[0].status(), Status::Enodata);
    let t2 = h.tid();
    h.resolve(ep, &path_request(t2, 0xc000, None, 0), 1);
    assert_eq!(find(t2).len(), 1, "remembered: answered inline");
    assert_eq!(find(t2)[0].status(), Status::Enodata);
    advance_clock(59 * MIN);
    let t2b = h.tid();
    h.resolve(ep, &path_request(t2b, 0xc000, None, 0), 1);
    assert_eq!(
        find(t2b).len(),
        1,
        "a minute before its end: still remembered"
    );
    advance_clock(2 * MIN);
    let t3 = h.tid();
    h.resolve(ep, &path_request(t3, 0xc000, None, 0), 1);
    assert!(
        find(t3).is_empty(),
        "forgotten after its lifetime: asked again"
    );
    sa_one(SaAction::Answer, 4);
    assert_eq!(find(t3)[0].status(), Status::Enodata);
    assert_eq!(h.perf(ep)[cntr::ROUTE_QUERY], 2);
    h.close();
}

/// NODELAY for a name the hosts file knows but whose route is not cached: ENODATA inline,
/// and the lookup primes the route and the name's alias, so a later NODELAY request succeeds
/// inline.
#[test]
fn nodelay_by_name_primes_the_route_and_the_alias() {
    let _s = serial();
    let opts = format!("{OPTS}addr_preload acm_hosts\naddr_data_file $DIR/hosts.data\n");
    let mut h = Host::open(&opts, &[("hosts.data", "node9 fe80::1009\n")]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let req = |t| {
        dest_request(
            t,
            (ACM_ADDRESS_NAME, b"node7"),
            (ACM_ADDRESS_NAME, b"node9"),
            ACM_FLAGS_NODELAY,
        )
    };
    let t = h.tid();
    h.resolve(ep, &req(t), 1);
    assert_eq!(find(t).len(), 1, "NODELAY is answered inline");
    assert_eq!(find(t)[0].status(), Status::Enodata);
    assert!(
        wait_until(|| sa_pending() == 1),
        "the route lookup started anyway"
    );
    assert!(sa_complete_next(SaAction::Answer));
    let mut tids = vec![t];
    assert!(
        wait_until(|| {
            let t2 = h.tid();
            tids.push(t2);
            h.resolve(ep, &req(t2), 1);
            let r = find(t2);
            assert_eq!(r.len(), 1, "NODELAY is answered inline");
            r[0].status() == Status::Success && dlid_of(&r[0].msg) == 9
        }),
        "never primed"
    );
    h.barrier();
    check_exactly_once(&tids).unwrap();
    h.close();
}
