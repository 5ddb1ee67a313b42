//! Behaviour of the path/address cache: hits, expiry, negative entries, refresh hints, address
//! aliases, the reversible bit folded out of keys, invalidation, eviction policy, counters and
//! the 1,000,000-entry capacity.

use acm_core_nostd::cache::{
    constraint, ep_number, AddrKey, AddrSlot, CacheConfig, CacheEp, CacheError, Constraints, Dest,
    Inserted, Lookup, PathCache, PathKey, PathSlot, DESIGN_LOAD_PERCENT, EP_GEN_BITS, EP_MAX,
    EP_SLOT_BITS, REVERSIBLE,
};

type Cache = PathCache<Box<[PathSlot]>, Box<[AddrSlot]>>;

fn cache(paths: usize, addrs: usize) -> Cache {
    let p: Box<[PathSlot]> = (0..paths).map(|_| PathSlot::new()).collect();
    let a: Box<[AddrSlot]> = (0..addrs).map(|_| AddrSlot::new()).collect();
    PathCache::new(
        p,
        a,
        CacheConfig {
            seed: 42,
            refresh_ahead: 1_000,
        },
    )
    .unwrap()
}

fn rec(tag: u8) -> [u8; 64] {
    let mut r = [0u8; 64];
    for (i, b) in r.iter_mut().enumerate() {
        *b = tag.wrapping_add(i as u8);
    }
    r
}

fn lid(ep: CacheEp, l: u16) -> PathKey {
    PathKey::new(ep, Dest::Lid(l))
}

fn record_of(l: Lookup) -> [u8; 64] {
    match l {
        Lookup::Hit { record, .. } => record,
        other => panic!("expected a hit, got {other:?}"),
    }
}

#[test]
fn storage_must_not_be_empty() {
    let p: Box<[PathSlot]> = Box::new([]);
    let a: Box<[AddrSlot]> = Box::new([]);
    assert_eq!(
        PathCache::new(p, a, CacheConfig::default()).err(),
        Some(CacheError::Capacity)
    );
}

#[test]
fn insert_lookup_update_remove() {
    let c = cache(16, 16);
    let k = lid(ep_number(0, 1), 5);
    assert_eq!(c.lookup(&k, 0), Lookup::Miss);
    let mut w = c.writer().unwrap();
    assert_eq!(
        c.writer().err(),
        Some(CacheError::WriterTaken),
        "only one writer at a time"
    );
    assert_eq!(w.insert(&k, &rec(1), 0, 10_000), Inserted::New);
    assert_eq!(record_of(c.lookup(&k, 1)), rec(1));
    assert_eq!(w.insert(&k, &rec(2), 0, 10_000), Inserted::Updated);
    assert_eq!(record_of(c.lookup(&k, 1)), rec(2));
    assert_eq!(c.len(), 1);
    assert!(w.remove(&k));
    assert!(!w.remove(&k));
    assert_eq!(c.lookup(&k, 1), Lookup::Miss);
    assert_eq!(c.len(), 0);
    drop(w);
    assert!(c.writer().is_ok(), "writer role is released on drop");
}

#[test]
fn lid_gid_and_constraints_are_separate_entries() {
    let c = cache(64, 0);
    let mut w = c.writer().unwrap();
    let gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5];
    let base = lid(ep_number(0, 1), 5);
    let by_gid = PathKey::new(ep_number(0, 1), Dest::Gid(gid));
    let sid = Constraints {
        mask: constraint::SERVICE_ID,
        service_id: 0x1234,
        ..Constraints::ANY
    };
    let with_sid = PathKey {
        constraints: sid,
        ..base
    };
    let other_sid = PathKey {
        constraints: Constraints {
            service_id: 0x1235,
            ..sid
        },
        ..base
    };
    let with_sl = PathKey {
        constraints: Constraints {
            mask: constraint::SL,
            sl: 3,
            ..Constraints::ANY
        },
        ..base
    };
    let other_ep = lid(ep_number(0, 2), 5);
    let keys = [base, by_gid, with_sid, other_sid, with_sl, other_ep];
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            w.insert(k, &rec(i as u8 * 10), 0, 10_000),
            Inserted::New,
            "key {i}"
        );
    }
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(record_of(c.lookup(k, 5)), rec(i as u8 * 10), "key {i}");
    }
    // Unspecified fields do not split entries.
    let noise = PathKey {
        constraints: Constraints {
            pkey: 0xffff,
            ..sid
        },
        ..base
    };
    assert_eq!(record_of(c.lookup(&noise, 5)), rec(20));
}

#[test]
fn expiry_is_sub_minute_and_exact() {
    let c = cache(8, 0);
    let mut w = c.writer().unwrap();
    let k = lid(ep_number(0, 0), 9);
    w.insert(&k, &rec(3), 1_000, 250);
    assert!(matches!(
        c.lookup(&k, 1_249),
        Lookup::Hit {
            expires_at: 1_250,
            ..
        }
    ));
    assert_eq!(c.lookup(&k, 1_250), Lookup::Miss);
    // ttl saturates: "never" stays never.
    w.insert(&k, &rec(3), 1_000, u64::MAX);
    assert!(matches!(
        c.lookup(&k, u64::MAX - 1),
        Lookup::Hit {
            expires_at: u64::MAX,
            ..
        }
    ));
}

#[test]
fn negative_entries_have_their_own_lifetime() {
    let c = cache(8, 8);
    let mut w = c.writer().unwrap();
    let k = lid(ep_number(0, 0), 9);
    assert_eq!(w.insert_negative(&k, 0, 0, 10), Err(CacheError::ZeroStatus));
    w.insert_negative(&k, 6, 100, 500).unwrap();
    assert_eq!(
        c.lookup(&k, 200),
        Lookup::Negative {
            status: 6,
            until: 600
        }
    );
    assert_eq!(c.lookup(&k, 600), Lookup::Miss);
    // A positive answer replaces the negative one in place.
    assert_eq!(w.insert(&k, &rec(4), 700, 1_000), Inserted::Updated);
    assert_eq!(record_of(c.lookup(&k, 800)), rec(4));
    // Negative addresses.
    let a = AddrKey::ipv4(ep_number(0, 0), [10, 0, 0, 9]);
    w.insert_addr_negative(&a, 9, 0, 50).unwrap();
    assert_eq!(
        c.lookup_addr(&a, 10),
        Lookup::Negative {
            status: 9,
            until: 50
        }
    );
    assert_eq!(c.lookup_addr(&a, 50), Lookup::Miss);
    let s = c.stats();
    assert_eq!(s.negative_hits, 2);
}

#[test]
fn refresh_hint_goes_to_one_reader_per_version() {
    let c = cache(8, 0);
    let mut w = c.writer().unwrap();
    let k = lid(ep_number(0, 0), 1);
    w.insert(&k, &rec(1), 0, 10_000); // refresh_ahead = 1000
    assert!(matches!(
        c.lookup(&k, 8_999),
        Lookup::Hit {
            needs_refresh: false,
            ..
        }
    ));
    assert!(matches!(
        c.lookup(&k, 9_000),
        Lookup::Hit {
            needs_refresh: true,
            ..
        }
    ));
    assert!(matches!(
        c.lookup(&k, 9_001),
        Lookup::Hit {
            needs_refresh: false,
            ..
        }
    ));
    // The refresh lands: a new version, and near its end a new hint.
    w.insert(&k, &rec(2), 9_500, 10_000);
    assert!(matches!(
        c.lookup(&k, 9_600),
        Lookup::Hit {
            needs_refresh: false,
            ..
        }
    ));
    assert!(matches!(
        c.lookup(&k, 18_600),
        Lookup::Hit {
            needs_refresh: true,
            ..
        }
    ));
    assert_eq!(c.stats().refresh_hints, 2);
}

#[test]
fn aliases_share_one_record() {
    let c = cache(8, 8);
    let mut w = c.writer().unwrap();
    let gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 0x03, 0, 0, 0, 7];
    let path = PathKey::new(ep_number(0, 3), Dest::Gid(gid));
    let name = AddrKey::name(ep_number(0, 3), "node7").unwrap();
    let ip = AddrKey::ipv4(ep_number(0, 3), [192, 168, 0, 7]);
    let ip6 = AddrKey::ipv6(
        ep_number(0, 3),
        [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7],
    );
    assert_eq!(w.alias(&name, &path, 0, 1_000), Err(CacheError::NoSuchPath));
    w.insert(&path, &rec(1), 0, 100_000);
    for a in [&name, &ip, &ip6] {
        assert_eq!(w.alias(a, &path, 0, 50_000), Ok(Inserted::New));
    }
    for a in [&name, &ip, &ip6] {
        assert_eq!(record_of(c.lookup_addr(a, 10)), rec(1));
    }
    // One update, seen through every alias.
    w.insert(&path, &rec(2), 10, 100_000);
    for a in [&name, &ip, &ip6] {
        match c.lookup_addr(a, 20) {
            Lookup::Hit {
                record, expires_at, ..
            } => {
                assert_eq!(record, rec(2));
                assert_eq!(
                    expires_at, 50_000,
                    "the alias's own lifetime bounds the answer"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    // Removing one alias leaves the others.
    assert!(w.remove_addr(&ip));
    assert_eq!(c.lookup_addr(&ip, 20), Lookup::Miss);
    assert_eq!(record_of(c.lookup_addr(&name, 20)), rec(2));
    // Removing the path (or reusing its slot) turns all aliases into misses.
    assert!(w.remove(&path));
    assert_eq!(c.lookup_addr(&name, 20), Lookup::Miss);
    w.insert(&lid(ep_number(0, 3), 99), &rec(9), 20, 100_000); // reuses the freed slot
    assert_eq!(c.lookup_addr(&name, 30), Lookup::Miss);
    assert_eq!(c.lookup_addr(&ip6, 30), Lookup::Miss);
}

#[test]
fn invalidate_ep_is_o1_and_scoped() {
    let c = cache(64, 16);
    let mut w = c.writer().unwrap();
    for l in 0..10 {
        w.insert(&lid(ep_number(0, 1), l), &rec(1), 0, 100_000);
        w.insert(&lid(ep_number(0, 2), l), &rec(2), 0, 100_000);
    }
    w.alias(
        &AddrKey::name(ep_number(0, 1), "a").unwrap(),
        &lid(ep_number(0, 1), 3),
        0,
        100_000,
    )
    .unwrap();
    w.invalidate_ep(ep_number(0, 1));
    for l in 0..10 {
        assert_eq!(c.lookup(&lid(ep_number(0, 1), l), 1), Lookup::Miss);
        assert_eq!(record_of(c.lookup(&lid(ep_number(0, 2), l), 1)), rec(2));
    }
    assert_eq!(
        c.lookup_addr(&AddrKey::name(ep_number(0, 1), "a").unwrap(), 1),
        Lookup::Miss
    );
    // New entries on the endpoint work again, and re-inserting an invalidated key revives it.
    w.insert(&lid(ep_number(0, 1), 3), &rec(7), 1, 100_000);
    assert_eq!(record_of(c.lookup(&lid(ep_number(0, 1), 3), 2)), rec(7));
    // The stale entries are reclaimed by the sweeper.
    let before = c.len();
    let purged = w.purge_expired(2, 64);
    assert_eq!(purged, 9 + 1, "9 stale paths + 1 stale alias");
    assert_eq!(c.len(), before - 9);
    // flush_ep removes everything of an endpoint.
    assert_eq!(w.flush_ep(ep_number(0, 2)), 10);
    assert_eq!(c.lookup(&lid(ep_number(0, 2), 0), 3), Lookup::Miss);
}

/// Generation bumps the tests below apply: 256 (where an 8-bit generation came back to its
/// start) and its neighbours, and `2^k - 1`, `2^k` for every `k` below the generation's width,
/// up to the last bump before the number repeats.
fn bumps() -> Vec<u32> {
    let mut b = vec![1, 255, 256, 257, 511, 512, 65_535, 65_536];
    for k in 1..EP_GEN_BITS {
        b.extend([(1 << k) - 1, 1 << k, (1 << k) + 1]);
    }
    b.push((1 << EP_GEN_BITS) - 1);
    b
}

/// The provider's hit path keys an endpoint's entries by `ep_number(gen, id)` and bumps `gen`
/// on CLIENT_REREGISTER (and on slot reuse), so that no hit sees a route learned before it even
/// while the writer has not applied the flush yet. So an entry inserted under generation `g`
/// must not be found under the number of any later generation the writer has not caught up
/// with: neither after 256 bumps (an 8-bit generation wrapped there and the stale route hit
/// again) nor after `2^k - 1` / `2^k` bumps for any `k` within the generation's 22 bits.
#[test]
fn an_entry_is_never_found_under_a_later_generation_of_its_endpoint() {
    const { assert!(EP_GEN_BITS >= 22) };
    let c = cache(64, 16);
    let mut w = c.writer().unwrap();
    let mut gid = [0u8; 16];
    gid[0] = 0xfe;
    gid[15] = 7;
    for (g, id) in [
        (0u32, 0u8),
        (1, 1),
        (0xff, 3),
        (0x100, 4),
        (0x1234_5678, 9),
        (u32::MAX, 255),
    ] {
        let ep = ep_number(g, id);
        assert_eq!((ep.slot(), ep.generation()), (id, g & (EP_MAX >> 8)));
        let (by_lid, by_gid) = (lid(ep, 5), PathKey::new(ep, Dest::Gid(gid)));
        let name = AddrKey::name(ep, "peer").unwrap();
        w.insert(&by_lid, &rec(id), 0, 100_000);
        w.insert(&by_gid, &rec(id ^ 1), 0, 100_000);
        w.alias(&name, &by_lid, 0, 100_000).unwrap();
        for b in bumps() {
            let later = ep_number(g.wrapping_add(b), id);
            let what = format!("generation {g:#x} + {b} on slot {id}: {later:?}");
            assert_eq!(c.lookup(&lid(later, 5), 1), Lookup::Miss, "{what}");
            assert_eq!(
                c.lookup(&PathKey::new(later, Dest::Gid(gid)), 1),
                Lookup::Miss,
                "{what}"
            );
            let later_name = AddrKey::name(later, "peer").unwrap();
            assert_eq!(c.lookup_addr(&later_name, 1), Lookup::Miss, "{what}");
            assert_ne!(later, ep, "{what}");
            // The slot id stays the same: the writer's invalidation of the slot still reaches
            // every generation of it.
            assert_eq!(later.slot(), id, "{what}");
        }
        // Only a full turn of the generation's bits comes back to the number.
        assert_eq!(ep_number(g.wrapping_add(1 << EP_GEN_BITS), id), ep);
        // Under its own number the entry is there until the writer invalidates the slot, by
        // the number of any generation of it.
        assert_eq!(record_of(c.lookup(&by_lid, 1)), rec(id));
        assert_eq!(record_of(c.lookup(&by_gid, 1)), rec(id ^ 1));
        assert_eq!(record_of(c.lookup_addr(&name, 1)), rec(id));
        w.invalidate_ep(ep_number(g.wrapping_add(256), id));
        assert_eq!(c.lookup(&by_lid, 1), Lookup::Miss);
        assert_eq!(c.lookup(&by_gid, 1), Lookup::Miss);
        assert_eq!(c.lookup_addr(&name, 1), Lookup::Miss);
    }
}

/// Cache endpoint numbers use all their 30 bits: keys of numbers that differ in any bit are
/// different entries, and `flush_ep` removes exactly one number's entries.
#[test]
fn wide_endpoint_numbers_are_separate_keys() {
    let c = cache(PathSlot::slots_for(64), AddrSlot::slots_for(64));
    let mut w = c.writer().unwrap();
    // The number with bits `n`: slot id in the low byte, generation above it.
    let number = |n: u32| ep_number(n >> EP_SLOT_BITS, n as u8);
    let eps: Vec<CacheEp> = (0..30)
        .map(|bit| number(1u32 << bit))
        .chain([number(0), number(EP_MAX)])
        .collect();
    for (i, &ep) in eps.iter().enumerate() {
        w.insert(&lid(ep, 9), &rec(i as u8), 0, 100_000);
        w.alias(&AddrKey::ipv4(ep, [10, 0, 0, 9]), &lid(ep, 9), 0, 100_000)
            .unwrap();
    }
    for (i, &ep) in eps.iter().enumerate() {
        assert_eq!(record_of(c.lookup(&lid(ep, 9), 1)), rec(i as u8), "{ep:?}");
        let a = AddrKey::ipv4(ep, [10, 0, 0, 9]);
        assert_eq!(record_of(c.lookup_addr(&a, 1)), rec(i as u8), "{ep:?}");
    }
    assert_eq!(w.flush_ep(number(1 << 29)), 2);
    assert_eq!(c.lookup(&lid(number(1 << 29), 9), 1), Lookup::Miss);
    assert_eq!(record_of(c.lookup(&lid(ep_number(0, 0), 9), 1)), rec(30));
}

#[test]
fn full_cache_evicts_dead_entries_first_and_never_grows() {
    let c = cache(64, 0);
    let cap = c.capacity();
    assert!(cap >= 60, "side arrays take few slots: {cap}");
    let mut w = c.writer().unwrap();
    // Fill every slot with entries that expire at 1000. (A key can only use the slots of its
    // two groups, so a few inserts evict before the last slots are taken.)
    let mut l = 0u16;
    while c.len() < cap {
        let r = w.insert(&lid(ep_number(0, 0), l), &rec(l as u8), 0, 1_000);
        assert!(matches!(r, Inserted::New | Inserted::Evicted));
        l += 1;
        assert!(l < 10_000, "table never filled");
    }
    let before = c.stats();
    // After they expired, new long-lived inserts must take dead slots only: every window still
    // holds dead entries, so no live entry is lost.
    let fresh: Vec<PathKey> = (0..(cap / 2) as u16)
        .map(|l| lid(ep_number(0, 1), l))
        .collect();
    for k in &fresh {
        assert_eq!(w.insert(k, &rec(7), 2_000, 1_000_000), Inserted::Evicted);
    }
    assert_eq!(c.len(), cap);
    let s = c.stats();
    assert_eq!(s.expired - before.expired, fresh.len() as u64);
    assert_eq!(s.evictions, before.evictions, "a live entry was evicted");
    for k in &fresh {
        assert_eq!(
            record_of(c.lookup(k, 2_001)),
            rec(7),
            "live entry {k:?} evicted"
        );
    }
    // Everything is live eventually: further inserts evict live entries, and the table stays
    // bounded.
    for l in 0..200u16 {
        assert_eq!(
            w.insert(&lid(ep_number(0, 2), l), &rec(1), 2_003, 1_000_000),
            Inserted::Evicted
        );
        assert_eq!(c.len(), cap, "bounded");
    }
    let s2 = c.stats();
    assert_eq!(
        (s2.evictions - s.evictions) + (s2.expired - s.expired),
        200,
        "each insert into a full table evicts exactly one entry"
    );
    assert!(s2.evictions > s.evictions);
}

#[test]
fn clock_keeps_hot_entries() {
    let cap = 256;
    let c = cache(cap, 0);
    let mut w = c.writer().unwrap();
    for l in 0..cap as u16 {
        w.insert(&lid(ep_number(0, 0), l), &rec(1), 0, u64::MAX);
    }
    // 16 hot keys are read between every insert; the rest is churn.
    let hot: Vec<PathKey> = (0..16).map(|l| lid(ep_number(0, 0), l * 7)).collect();
    let mut hot_misses = 0;
    for n in 0..2_000u16 {
        for k in &hot {
            if !matches!(c.lookup(k, 1), Lookup::Hit { .. }) {
                hot_misses += 1;
                w.insert(k, &rec(1), 1, u64::MAX);
            }
        }
        w.insert(&lid(ep_number(0, 1), n), &rec(2), 1, u64::MAX);
    }
    // Plain FIFO would lose every hot key once per 256 inserts (~7 rounds × 16 = ~120 misses).
    assert!(hot_misses < 20, "hot keys evicted {hot_misses} times");
}

#[test]
fn counters_add_up() {
    let c = cache(8, 8);
    let mut w = c.writer().unwrap();
    w.insert(&lid(ep_number(0, 0), 1), &rec(1), 0, 100);
    w.insert(&lid(ep_number(0, 0), 1), &rec(1), 0, 100);
    c.lookup(&lid(ep_number(0, 0), 1), 1);
    c.lookup(&lid(ep_number(0, 0), 2), 1);
    c.lookup(&lid(ep_number(0, 0), 1), 100);
    w.remove(&lid(ep_number(0, 0), 1));
    let s = c.stats();
    assert_eq!(
        (s.inserts, s.updates, s.hits, s.misses, s.removed),
        (1, 1, 1, 2, 1)
    );
    assert_eq!((s.path_entries, s.addr_entries, s.busy), (0, 0, 0));
}

#[test]
fn clear_empties_everything() {
    let c = cache(8, 8);
    let mut w = c.writer().unwrap();
    w.insert(&lid(ep_number(0, 0), 1), &rec(1), 0, 100);
    w.alias(
        &AddrKey::name(ep_number(0, 0), "x").unwrap(),
        &lid(ep_number(0, 0), 1),
        0,
        100,
    )
    .unwrap();
    w.clear();
    assert_eq!(c.lookup(&lid(ep_number(0, 0), 1), 1), Lookup::Miss);
    assert_eq!(
        c.lookup_addr(&AddrKey::name(ep_number(0, 0), "x").unwrap(), 1),
        Lookup::Miss
    );
    assert_eq!(c.len(), 0);
    assert_eq!(
        w.insert(&lid(ep_number(0, 0), 1), &rec(1), 0, 100),
        Inserted::New
    );
}

/// One million path records fit and work (`PathSlot::slots_for(1_000_000)` slots, 150 MB).
///
/// Every one of the 1,000,000 inserts must find a free slot in its window (none evicts at the
/// design load); then lookups (every one in release, every 97th in debug); then the table is
/// filled until it evicts, and each evicting insert must drop exactly one entry.
/// `cargo run --release -p acm-bench --bin cache -- --sizes 1000000` also fills and looks up
/// 1M entries.
#[test]
fn one_million_entries() {
    const N: u32 = 1_000_000;
    let c = cache(PathSlot::slots_for(N as usize), 0);
    assert!(c.capacity() * DESIGN_LOAD_PERCENT / 100 >= N as usize);
    let mut w = c.writer().unwrap();
    let key = |i: u32| {
        let mut gid = [0u8; 16];
        gid[..8].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
        gid[12..].copy_from_slice(&i.to_be_bytes());
        PathKey::new(ep_number(0, (i % 4) as u8), Dest::Gid(gid))
    };
    let mut r = [0u8; 64];
    for i in 0..N {
        r[..4].copy_from_slice(&i.to_le_bytes());
        assert_eq!(w.insert(&key(i), &r, 0, u64::MAX), Inserted::New, "key {i}");
    }
    assert_eq!(c.len(), N as usize);
    let stride = if cfg!(debug_assertions) { 97 } else { 1 };
    for i in (0..N).step_by(stride).chain([N - 1]) {
        let got = record_of(c.lookup(&key(i), 1));
        assert_eq!(&got[..4], &i.to_le_bytes());
    }
    assert_eq!(c.lookup(&key(N), 1), Lookup::Miss);
    // Keep inserting until windows overflow: each evicting insert replaces exactly one entry.
    let mut i = N;
    let mut evicted = 0u64;
    while evicted < 10 {
        match w.insert(&key(i), &r, 1, u64::MAX) {
            Inserted::New => {}
            Inserted::Evicted => evicted += 1,
            Inserted::Updated => panic!("fresh key {i} updated"),
        }
        i += 1;
        assert_eq!(c.len() as u64, (i - N) as u64 + N as u64 - evicted);
    }
    assert!(c.len() <= c.capacity());
    assert_eq!(c.stats().evictions, evicted);
}

#[test]
fn cache_is_shareable_and_writer_is_sendable() {
    fn sync_send<T: Sync + Send>() {}
    fn send<T: Send>() {}
    sync_send::<Cache>();
    sync_send::<PathCache<&'static [PathSlot], &'static [AddrSlot]>>();
    send::<acm_core_nostd::cache::CacheWriter<&'static Cache>>();
    send::<acm_core_nostd::cache::CacheWriter<std::sync::Arc<Cache>>>();
    // The writer can live on another thread than the one that made the cache.
    let c = std::sync::Arc::new(cache(8, 0));
    let c2 = std::sync::Arc::clone(&c);
    std::thread::spawn(move || {
        let mut w = c2.writer().unwrap();
        w.insert(&lid(ep_number(0, 0), 1), &rec(5), 0, 100);
    })
    .join()
    .unwrap();
    assert_eq!(record_of(c.lookup(&lid(ep_number(0, 0), 1), 1)), rec(5));
}

#[test]
fn documented_bytes_per_entry() {
    // docs/cache.md and the module docs quote these sizes: a path slot is exactly two cache
    // lines (seq + meta + key, then the record), 128-byte aligned (one adjacent-line pair).
    assert_eq!(std::mem::size_of::<PathSlot>(), 128);
    assert_eq!(std::mem::align_of::<PathSlot>(), 128);
    assert_eq!(std::mem::size_of::<AddrSlot>(), 128);
    // Side arrays (tag byte, claim byte, CLOCK bit per slot) take ~1.6% of the slots.
    let c = cache(100_000, 0);
    assert!(
        c.capacity() > 98_300 && c.capacity() < 100_000,
        "{}",
        c.capacity()
    );
}

/// `rec(tag)` with the PathRecord's reversible bit (byte 49, bit 7) set or clear.
fn rec_rev(tag: u8, reversible: bool) -> [u8; 64] {
    let mut r = rec(tag);
    if reversible {
        r[49] |= REVERSIBLE;
    } else {
        r[49] &= !REVERSIBLE;
    }
    r
}

/// `k` asking for a reversible path.
fn reversible(k: PathKey) -> PathKey {
    PathKey {
        constraints: Constraints {
            mask: k.constraints.mask | constraint::REVERSIBLE_NUMPATH,
            reversible_numpath: k.constraints.reversible_numpath | REVERSIBLE,
            ..k.constraints
        },
        ..k
    }
}

/// An empty cache, and `plain` with and without the reversible bit.
fn cache_and_variants(plain: PathKey) -> (Cache, PathKey, PathKey) {
    (cache(64, 0), plain, reversible(plain))
}

const GID7: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 0x03, 0, 0, 0, 7];

/// The reversible bit is not part of a cache key: one entry, inserted under the key with the
/// bit, answers the request with the bit and the one without (by LID and by GID alike).
#[test]
fn reversible_and_plain_requests_share_one_entry() {
    let c = cache(64, 0);
    let mut w = c.writer().unwrap();
    for (i, plain) in [
        lid(ep_number(0, 3), 7),
        PathKey::new(ep_number(0, 3), Dest::Gid(GID7)),
    ]
    .into_iter()
    .enumerate()
    {
        let rev = reversible(plain);
        let r = rec_rev(i as u8, true);
        assert_eq!(w.insert(&rev, &r, 0, u64::MAX), Inserted::New);
        assert_eq!(c.len(), i + 1, "one entry per destination");
        assert_eq!(record_of(c.lookup(&rev, 1)), r, "{rev:?}");
        assert_eq!(record_of(c.lookup(&plain, 1)), r, "{plain:?}");
    }
    // Only the bit is folded out: NumbPath stays part of the key.
    let numpath = |v: u8| PathKey {
        constraints: Constraints {
            mask: constraint::REVERSIBLE_NUMPATH,
            reversible_numpath: v,
            ..Constraints::ANY
        },
        ..lid(ep_number(0, 3), 8)
    };
    assert_eq!(
        w.insert(&numpath(0x81), &rec_rev(5, true), 1, u64::MAX),
        Inserted::New
    );
    assert_eq!(record_of(c.lookup(&numpath(0x01), 2)), rec_rev(5, true));
    assert_eq!(c.lookup(&lid(ep_number(0, 3), 8), 2), Lookup::Miss);
    assert_eq!(c.len(), 3);
}

/// A record without the reversible bit answers a request without it and is a miss for one
/// that needs it; the reversible record inserted afterwards, under either key, updates that
/// same entry, and then both requests hit.
#[test]
fn a_non_reversible_record_misses_a_reversible_request() {
    for update_with_bit in [false, true] {
        let (c, plain, rev) = cache_and_variants(lid(ep_number(0, 3), 7));
        let mut w = c.writer().unwrap();
        assert_eq!(
            w.insert(&plain, &rec_rev(1, false), 0, u64::MAX),
            Inserted::New
        );
        assert_eq!(record_of(c.lookup(&plain, 1)), rec_rev(1, false));
        assert_eq!(c.lookup(&rev, 1), Lookup::Miss);
        let k = if update_with_bit { rev } else { plain };
        assert_eq!(
            w.insert(&k, &rec_rev(2, true), 2, u64::MAX),
            Inserted::Updated,
            "{k:?}"
        );
        assert_eq!(c.len(), 1);
        assert_eq!(record_of(c.lookup(&plain, 3)), rec_rev(2, true));
        assert_eq!(record_of(c.lookup(&rev, 3)), rec_rev(2, true));
    }
}

/// A negative entry (whichever key variant it was recorded under) answers both variants.
#[test]
fn a_negative_entry_answers_with_and_without_the_bit() {
    for with_bit in [false, true] {
        let (c, plain, rev) = cache_and_variants(PathKey::new(ep_number(0, 3), Dest::Gid(GID7)));
        let mut w = c.writer().unwrap();
        let k = if with_bit { rev } else { plain };
        assert_eq!(w.insert_negative(&k, 0x2a, 0, 100), Ok(Inserted::New));
        assert_eq!(c.len(), 1);
        for q in [plain, rev] {
            assert_eq!(
                c.lookup(&q, 1),
                Lookup::Negative {
                    status: 0x2a,
                    until: 100
                },
                "{q:?} after a negative entry under {k:?}"
            );
        }
    }
}

/// `remove` with either key variant removes the one entry.
#[test]
fn remove_with_either_variant_removes_the_entry() {
    for with_bit in [false, true] {
        let (c, plain, rev) = cache_and_variants(lid(ep_number(0, 3), 7));
        let mut w = c.writer().unwrap();
        w.insert(&rev, &rec_rev(1, true), 0, u64::MAX);
        assert!(w.remove(if with_bit { &rev } else { &plain }));
        assert_eq!(c.len(), 0);
        for q in [plain, rev] {
            assert_eq!(c.lookup(&q, 1), Lookup::Miss);
            assert!(!w.remove(&q), "nothing left to remove");
        }
    }
}

/// `writes` counts every write that can turn a miss into a hit (or a negative entry): path
/// and address, new and replaced; a removal, an invalidation or a lookup counts nothing.
#[test]
fn writes_count_what_can_make_a_hit() {
    let c = cache(16, 16);
    let ep = ep_number(0, 1);
    let (k, name) = (lid(ep, 5), AddrKey::name(ep, "node5").unwrap());
    let mut w = c.writer().unwrap();
    let mut seen = c.writes();
    let mut wrote = |what: &str, by: u32| {
        let now = c.writes();
        assert_eq!(now.wrapping_sub(seen), by, "{what}");
        seen = now;
    };
    w.insert(&k, &rec(1), 0, 10_000);
    wrote("a new path", 1);
    w.insert(&k, &rec(2), 0, 10_000);
    wrote("a path replaced", 1);
    w.alias(&name, &k, 0, 10_000).unwrap();
    wrote("an address", 1);
    w.insert_negative(&lid(ep, 6), 3, 0, 10_000).unwrap();
    wrote("a negative path", 1);
    w.insert_addr_negative(&AddrKey::name(ep, "node6").unwrap(), 3, 0, 10_000)
        .unwrap();
    wrote("a negative address", 1);
    let _ = c.lookup(&k, 1);
    w.remove(&k);
    w.remove_addr(&name);
    w.invalidate_ep(ep);
    wrote("lookups, removals and an invalidation", 0);
}
