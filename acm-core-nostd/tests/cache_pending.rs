//! Property test of the pending-request table: across random interleavings of begin / complete /
//! cancel / cancel_ep, every request that was accepted is handed back exactly once, in arrival
//! order per key, and the table agrees with a simple model about `Full`.
//!
//! Hand-rolled deterministic schedules (xorshift, fixed seeds) instead of a proptest dependency:
//! a failure prints the seed and step, and re-running reproduces it.

use std::collections::{HashMap, HashSet, VecDeque};

use acm_core_nostd::cache::pending::{Begin, PendingSlot, PendingTable, WaiterSlot};
use acm_core_nostd::cache::{Dest, PathKey};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn key(ep: u16, lid: u16) -> PathKey {
    PathKey::new(ep, Dest::Lid(lid))
}

fn schedule(seed: u64, key_cap: usize, waiter_cap: usize, steps: usize) {
    let keys: Box<[PendingSlot<PathKey>]> = vec![PendingSlot::new(); key_cap].into();
    let waiters: Box<[WaiterSlot]> = vec![WaiterSlot::new(); waiter_cap].into();
    let mut t = PendingTable::new(keys, waiters, seed).unwrap();
    let mut model: HashMap<PathKey, VecDeque<u32>> = HashMap::new();
    let mut outstanding: HashSet<u32> = HashSet::new();
    let mut drained: HashSet<u32> = HashSet::new();
    let mut rng = Rng(seed | 1);
    let mut next_token = 0u32;
    let take = |tok: u32, outstanding: &mut HashSet<u32>, drained: &mut HashSet<u32>| {
        assert!(
            outstanding.remove(&tok),
            "seed {seed}: token {tok} drained but not outstanding"
        );
        assert!(
            drained.insert(tok),
            "seed {seed}: token {tok} drained twice"
        );
    };
    for step in 0..steps {
        let ctx = format!("seed {seed} step {step}");
        // A small key space so coalescing and capacity limits are hit often.
        let k = key(rng.below(3) as u16, rng.below(6) as u16);
        match rng.below(10) {
            0..=5 => {
                let tok = next_token;
                next_token += 1;
                let waiting: usize = model.values().map(VecDeque::len).sum();
                let want = if waiting == waiter_cap {
                    Begin::Full
                } else if model.contains_key(&k) {
                    Begin::Coalesced
                } else if model.len() == key_cap {
                    Begin::Full
                } else {
                    Begin::Started
                };
                assert_eq!(t.begin(k, tok), want, "{ctx}");
                if want != Begin::Full {
                    model.entry(k).or_default().push_back(tok);
                    outstanding.insert(tok);
                }
            }
            6 | 7 => {
                let mut got = Vec::new();
                let n = t.complete(&k, |tok| got.push(tok));
                let want: Vec<u32> = model.remove(&k).map(Vec::from).unwrap_or_default();
                assert_eq!(got, want, "{ctx}: complete order");
                assert_eq!(n, want.len(), "{ctx}");
                for tok in got {
                    take(tok, &mut outstanding, &mut drained);
                }
            }
            8 => {
                // Withdraw one waiter (its own timeout); sometimes an unknown token.
                let q = model.get(&k).cloned().unwrap_or_default();
                let tok = if !q.is_empty() && rng.below(4) != 0 {
                    q[rng.below(q.len() as u64) as usize]
                } else {
                    u32::MAX
                };
                let was = q.contains(&tok);
                assert_eq!(t.cancel(&k, tok), was, "{ctx}: cancel");
                if was {
                    let q = model.get_mut(&k).unwrap();
                    q.retain(|&x| x != tok);
                    if q.is_empty() {
                        model.remove(&k);
                    }
                    take(tok, &mut outstanding, &mut drained);
                }
            }
            _ => {
                let ep = k.ep;
                let mut got: Vec<(PathKey, u32)> = Vec::new();
                let n = t.cancel_ep(ep, |k, tok| got.push((*k, tok)));
                let mut want: Vec<(PathKey, u32)> = Vec::new();
                model.retain(|mk, q| {
                    if mk.ep == ep {
                        want.extend(q.iter().map(|&tok| (*mk, tok)));
                        false
                    } else {
                        true
                    }
                });
                assert_eq!(n, got.len(), "{ctx}");
                // Per key in order; keys in any order.
                for mk in want.iter().map(|(k, _)| *k).collect::<HashSet<_>>() {
                    let g: Vec<u32> = got
                        .iter()
                        .filter(|(k, _)| *k == mk)
                        .map(|(_, t)| *t)
                        .collect();
                    let w: Vec<u32> = want
                        .iter()
                        .filter(|(k, _)| *k == mk)
                        .map(|(_, t)| *t)
                        .collect();
                    assert_eq!(g, w, "{ctx}: cancel_ep");
                }
                assert_eq!(got.len(), want.len(), "{ctx}: cancel_ep count");
                for (_, tok) in got {
                    take(tok, &mut outstanding, &mut drained);
                }
            }
        }
        assert_eq!(t.len(), model.len(), "{ctx}: keys");
        assert_eq!(
            t.waiting(),
            model.values().map(VecDeque::len).sum::<usize>(),
            "{ctx}: waiters"
        );
        assert_eq!(t.is_pending(&k), model.contains_key(&k), "{ctx}");
        assert_eq!(
            t.waiters_of(&k),
            model.get(&k).map_or(0, VecDeque::len),
            "{ctx}"
        );
    }
    // Shut down: every endpoint cancelled, every accepted request drained exactly once.
    for ep in 0..3 {
        t.cancel_ep(ep, |_, tok| take(tok, &mut outstanding, &mut drained));
    }
    assert!(
        outstanding.is_empty(),
        "seed {seed}: never drained: {outstanding:?}"
    );
    assert!(t.is_empty() && t.waiting() == 0);
}

#[test]
fn every_request_is_drained_exactly_once() {
    for seed in 1..=300u64 {
        let key_cap = 1 + (seed % 7) as usize;
        let waiter_cap = 1 + (seed % 13) as usize;
        schedule(
            seed.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            key_cap,
            waiter_cap,
            400,
        );
    }
}

#[test]
fn roomy_table_long_schedule() {
    schedule(0xdead_beef, 64, 256, 20_000);
}

#[test]
fn zero_capacity_is_rejected() {
    let k: Box<[PendingSlot<PathKey>]> = Box::new([]);
    let w: Box<[WaiterSlot]> = vec![WaiterSlot::new(); 4].into();
    assert!(PendingTable::new(k, w, 0).is_err());
}

#[test]
fn static_storage_works_without_alloc() {
    let mut keys = [PendingSlot::<PathKey>::new(); 4];
    let mut waiters = [WaiterSlot::new(); 4];
    let mut t = PendingTable::new(&mut keys[..], &mut waiters[..], 1).unwrap();
    assert_eq!(t.begin(key(0, 1), 7), Begin::Started);
    assert_eq!(t.begin(key(0, 1), 8), Begin::Coalesced);
    let mut got = vec![];
    assert_eq!(t.complete(&key(0, 1), |x| got.push(x)), 2);
    assert_eq!(got, [7, 8]);
    assert_eq!(std::mem::size_of::<PendingSlot<PathKey>>(), 72);
    assert_eq!(std::mem::size_of::<WaiterSlot>(), 8);
}
