#![no_main]
//! Cache operations against a model: the input is a sequence of ops (insert, negative insert,
//! lookup, alias, address lookup, remove, remove address, invalidate endpoint, purge, flush,
//! advance time) applied to a small `PathCache` (8 path slots, 4 address slots) and to a plain
//! `std` model of what must be true:
//!
//! * a lookup never returns a record, status or expiry other than the model's for that key,
//!   never `Busy` (single thread), and only misses a live key after it was evicted — at most one
//!   live entry disappears per evicting insert;
//! * an alias answers with the current record of its path while the path entry lived
//!   continuously since the alias was made, and otherwise misses or answers that record;
//! * lengths never exceed capacity.
use std::collections::HashMap;

use acm_core_nostd::cache::{
    ep_number, AddrKey, AddrSlot, CacheConfig, CacheEp, CacheError, Dest, Inserted, Lookup,
    PathCache, PathKey, PathSlot, EP_MAX,
};
use libfuzzer_sys::fuzz_target;

const PATHS: usize = 8;
const ADDRS: usize = 4;

/// Cache endpoint numbers: slots 0, 1, 2 at generation 0, and wide generations that share
/// slot 1 or 2 (256 is where an 8-bit generation came back to the number of generation 0).
const EPS: [CacheEp; 6] = [
    ep_number(0, 0),
    ep_number(0, 1),
    ep_number(0, 2),
    ep_number(1, 1),
    ep_number(256, 1),
    ep_number(EP_MAX >> 8, 2),
];

fn ep(b: u8) -> CacheEp {
    EPS[usize::from(b) % EPS.len()]
}

struct Input<'a>(&'a [u8]);
impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
}

#[derive(Clone, Copy, Debug)]
struct PathModel {
    /// 0 = positive.
    status: u8,
    tag: u8,
    expires: u64,
    /// Changes whenever the entry is created anew (not on in-place updates).
    id: u64,
}

#[derive(Clone, Copy, Debug)]
struct AddrModel {
    status: u8,
    target: Option<PathKey>,
    target_id: u64,
    expires: u64,
    /// False once the target path may have been reclaimed and re-created since aliasing.
    certain: bool,
}

fn rec(tag: u8) -> [u8; 64] {
    let mut r = [0u8; 64];
    for (i, b) in r.iter_mut().enumerate() {
        *b = tag ^ (i as u8).wrapping_mul(37);
    }
    r
}

fn path_key(b: u8) -> PathKey {
    let ep = ep(b >> 4);
    let l = (b & 0x0f) as u16;
    if l < 12 {
        PathKey::new(ep, Dest::Lid(l + 1))
    } else {
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[15] = l as u8;
        PathKey::new(ep, Dest::Gid(gid))
    }
}

fn addr_key(b: u8) -> AddrKey {
    let ep = ep(b >> 4);
    match b & 7 {
        0..=3 => AddrKey::ipv4(ep, [10, 0, 0, b & 7]),
        4 | 5 => AddrKey::name(ep, if b & 1 == 0 { "node-a" } else { "node-b" }).unwrap(),
        _ => AddrKey::ipv6(ep, [b & 7; 16]),
    }
}

struct Harness {
    paths: HashMap<PathKey, PathModel>,
    addrs: HashMap<AddrKey, AddrModel>,
    next_id: u64,
}

impl Harness {
    fn live_path(&self, k: &PathKey, now: u64) -> Option<PathModel> {
        self.paths.get(k).copied().filter(|m| m.expires > now)
    }

    /// The exact answer the cache must give for a path key the model knows is present.
    fn expected_path(m: &PathModel) -> Lookup {
        if m.status != 0 {
            Lookup::Negative {
                status: m.status,
                until: m.expires,
            }
        } else {
            Lookup::Hit {
                record: rec(m.tag),
                expires_at: m.expires,
                needs_refresh: false,
            }
        }
    }

    fn same(a: &Lookup, b: &Lookup) -> bool {
        match (a, b) {
            (
                Lookup::Hit {
                    record: r1,
                    expires_at: e1,
                    ..
                },
                Lookup::Hit {
                    record: r2,
                    expires_at: e2,
                    ..
                },
            ) => r1 == r2 && e1 == e2,
            _ => a == b,
        }
    }

    /// Drops model entries that are dead at `now` (they can only come back by re-insertion).
    fn forget_dead(&mut self, now: u64) {
        let dead: Vec<PathKey> = self
            .paths
            .iter()
            .filter(|(_, m)| m.expires <= now)
            .map(|(k, _)| *k)
            .collect();
        for k in dead {
            self.path_gone(&k);
        }
        self.addrs.retain(|_, a| a.expires > now);
    }

    /// The path entry for `k` may have been reclaimed: aliases to it become uncertain.
    fn path_gone(&mut self, k: &PathKey) {
        self.paths.remove(k);
        for a in self.addrs.values_mut() {
            if a.target == Some(*k) {
                a.certain = false;
            }
        }
    }

    /// After an evicting insert: which live entries vanished? At most `allowed` may.
    fn sync_paths<P, A>(&mut self, c: &PathCache<P, A>, now: u64, allowed: usize, skip: &PathKey)
    where
        P: std::ops::Deref<Target = [PathSlot]>,
        A: std::ops::Deref<Target = [AddrSlot]>,
    {
        let mut gone = Vec::new();
        for (k, m) in &self.paths {
            if k == skip {
                continue;
            }
            let got = c.lookup(k, now);
            if got == Lookup::Miss {
                gone.push(*k);
            } else {
                assert!(
                    Self::same(&got, &Self::expected_path(m)),
                    "{k:?}: {got:?} vs {m:?}"
                );
            }
        }
        assert!(
            gone.len() <= allowed,
            "{} live paths vanished: {gone:?}",
            gone.len()
        );
        for k in gone {
            self.path_gone(&k);
        }
    }

    fn expected_addr(&self, a: &AddrModel, now: u64) -> Option<Lookup> {
        if a.status != 0 {
            return Some(Lookup::Negative {
                status: a.status,
                until: a.expires,
            });
        }
        let t = a.target?;
        match self.live_path(&t, now) {
            Some(m) if m.id == a.target_id || !a.certain => {
                let exp = m.expires.min(a.expires);
                Some(if m.status != 0 {
                    Lookup::Negative {
                        status: m.status,
                        until: exp,
                    }
                } else {
                    Lookup::Hit {
                        record: rec(m.tag),
                        expires_at: exp,
                        needs_refresh: false,
                    }
                })
            }
            _ => Some(Lookup::Miss),
        }
    }

    fn check_addr<P, A>(&self, c: &PathCache<P, A>, k: &AddrKey, now: u64)
    where
        P: std::ops::Deref<Target = [PathSlot]>,
        A: std::ops::Deref<Target = [AddrSlot]>,
    {
        let got = c.lookup_addr(k, now);
        assert_ne!(got, Lookup::Busy);
        match self.addrs.get(k) {
            // Unknown to the model (never made, evicted, or dead): must not invent anything
            // positive that the model cannot explain.
            None => assert!(
                matches!(got, Lookup::Miss),
                "{k:?}: cache answered {got:?} for an address the model does not have"
            ),
            Some(a) => {
                // A miss is always allowed (the address slab may have evicted the entry, or
                // the path may be gone); any other answer must be exactly the model's.
                let want = self.expected_addr(a, now).unwrap_or(Lookup::Miss);
                assert!(
                    got == Lookup::Miss || Self::same(&got, &want),
                    "{k:?}: {got:?}, expected Miss or {want:?}"
                );
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let p: Box<[PathSlot]> = (0..PATHS).map(|_| PathSlot::new()).collect();
    let a: Box<[AddrSlot]> = (0..ADDRS).map(|_| AddrSlot::new()).collect();
    let cache = PathCache::new(
        p,
        a,
        CacheConfig {
            seed: 3,
            refresh_ahead: 10,
        },
    )
    .unwrap();
    let mut w = cache.writer().unwrap();

    let mut h = Harness {
        paths: HashMap::new(),
        addrs: HashMap::new(),
        next_id: 1,
    };
    let mut now = 0u64;
    let mut input = Input(data);
    while let Some(op) = input.byte() {
        let arg = input.byte().unwrap_or(0);
        let arg2 = input.byte().unwrap_or(0);
        h.forget_dead(now);
        match op % 13 {
            // insert / negative insert
            0..=2 => {
                let k = path_key(arg);
                let ttl = 1 + (arg2 as u64 % 64);
                let status = if op % 13 == 2 { 1 + arg2 % 9 } else { 0 };
                let r = if status == 0 {
                    w.insert(&k, &rec(arg2), now, ttl)
                } else {
                    w.insert_negative(&k, status, now, ttl).unwrap()
                };
                let before = h.paths.get(&k).copied();
                match r {
                    Inserted::Updated => {}
                    Inserted::New | Inserted::Evicted => {
                        assert!(before.is_none(), "{k:?} was live but insert said {r:?}");
                    }
                }
                let id = match (r, before) {
                    (Inserted::Updated, Some(m)) => m.id,
                    _ => {
                        h.next_id += 1;
                        h.next_id
                    }
                };
                if before.is_none() {
                    // A dead entry updated in place keeps aliases valid; a new one does not.
                    h.path_gone(&k);
                }
                if r == Inserted::Evicted {
                    h.sync_paths(&cache, now, 1, &k);
                }
                h.paths.insert(
                    k,
                    PathModel {
                        status,
                        tag: arg2,
                        expires: now + ttl,
                        id,
                    },
                );
                assert!(cache.len() <= PATHS);
            }
            // lookup
            3 | 4 => {
                let k = path_key(arg);
                let got = cache.lookup(&k, now);
                assert_ne!(got, Lookup::Busy);
                match h.paths.get(&k) {
                    Some(m) => {
                        let want = Harness::expected_path(m);
                        assert!(Harness::same(&got, &want), "{k:?}: {got:?} vs {want:?}");
                        if let Lookup::Hit {
                            needs_refresh: true,
                            expires_at,
                            ..
                        } = got
                        {
                            assert!(now + 10 >= expires_at, "early refresh hint");
                        }
                    }
                    None => assert_eq!(got, Lookup::Miss, "{k:?} unknown to the model"),
                }
            }
            // alias
            5 => {
                let ak = addr_key(arg);
                let pk = path_key(arg2);
                let ttl = 1 + (arg2 as u64 % 50);
                match w.alias(&ak, &pk, now, ttl) {
                    Ok(_) => {
                        // (If this evicted another address entry, the model keeps that one and
                        // check_addr accepts a miss for it.)
                        let m = h.paths.get(&pk).copied();
                        h.addrs.insert(
                            ak,
                            AddrModel {
                                status: 0,
                                target: Some(pk),
                                target_id: m.map_or(0, |m| m.id),
                                expires: now + ttl,
                                certain: m.is_some(),
                            },
                        );
                    }
                    Err(e) => {
                        assert_eq!(e, CacheError::NoSuchPath);
                        assert!(!h.paths.contains_key(&pk), "live path {pk:?} not found");
                        // The previous entry for `ak` (if any) is untouched by a failed alias().
                    }
                }
            }
            6 => {
                let ak = addr_key(arg);
                let status = 1 + arg2 % 9;
                w.insert_addr_negative(&ak, status, now, 1 + arg2 as u64 % 30)
                    .unwrap();
                h.addrs.insert(
                    ak,
                    AddrModel {
                        status,
                        target: None,
                        target_id: 0,
                        expires: now + 1 + arg2 as u64 % 30,
                        certain: true,
                    },
                );
            }
            7 => h.check_addr(&cache, &addr_key(arg), now),
            8 => {
                let k = path_key(arg);
                let removed = w.remove(&k);
                if h.paths.contains_key(&k) {
                    assert!(removed, "live {k:?} not removed");
                }
                h.path_gone(&k);
                assert_eq!(cache.lookup(&k, now), Lookup::Miss);
            }
            9 => {
                let ak = addr_key(arg);
                w.remove_addr(&ak);
                h.addrs.remove(&ak);
                assert_eq!(cache.lookup_addr(&ak, now), Lookup::Miss);
            }
            10 => {
                let ep = ep(arg);
                // Invalidation is per slot id (every generation of it); a flush is exact.
                let hit = |k_ep: CacheEp| {
                    if arg2 & 1 == 0 {
                        k_ep.slot() == ep.slot()
                    } else {
                        k_ep == ep
                    }
                };
                if arg2 & 1 == 0 {
                    w.invalidate_ep(ep);
                } else {
                    w.flush_ep(ep);
                }
                let gone: Vec<PathKey> = h.paths.keys().filter(|k| hit(k.ep)).copied().collect();
                for k in gone {
                    h.path_gone(&k);
                    assert_eq!(cache.lookup(&k, now), Lookup::Miss);
                }
                h.addrs.retain(|k, _| !hit(k.ep));
            }
            11 => {
                w.purge_expired(now, 1 + arg as usize % 16);
                // Purging removes only dead entries: every live one still answers.
                h.sync_paths(&cache, now, 0, &path_key(0xff));
            }
            _ => now += (arg % 32) as u64,
        }
        assert!(cache.len() <= PATHS);
        assert!(cache.stats().addr_entries as usize <= ADDRS);
    }
});
