//! Model check (loom) of the cache slot's seqlock: a writer updating a slot while a reader reads
//! it never yields a torn record as a hit, and a slot reused for another key never yields the
//! other key's record.
//!
//! Runs only under `cfg(loom)`, where the crate's atomics are loom's (`src/sync.rs`):
//!
//! ```sh
//! LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" cargo test -p acm-core-nostd --test cache_loom --release
//! ```
//!
//! The model table (`cache::loom_model::Tiny`) is the real table code — `Slot`, the seqlock
//! `store`, the reader's `try_slot` (key compare, copy, fence, sequence check), tags and
//! placement — instantiated with a 1-word key and a 2-word payload instead of the path slot's
//! 10 + 16 words (and groups of 4, at most 2 attempts per slot), so that every interleaving (and every value a `Relaxed` load may return) can be
//! explored. The protocol does not depend on the number of words.
#![cfg(loom)]

use acm_core_nostd::cache::loom_model::{Tiny, W};
use acm_core_nostd::cache::Slot;
use loom::sync::Arc;
use loom::thread;

/// A payload whose two words are all derived from `v`: a mix of versions is detectable.
fn payload(v: u32) -> [u32; 2] {
    [v, v.wrapping_mul(0x9E37_79B9) ^ 0x5555]
}

fn check(v_allowed: &[u32], p: [u32; 2]) {
    assert!(
        v_allowed.iter().any(|&v| payload(v) == p),
        "torn or foreign record {p:?}"
    );
}

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b
}

fn table(slots: usize) -> Arc<Tiny<Box<[Slot<W>]>>> {
    let s: Box<[Slot<W>]> = (0..slots).map(|_| Slot::new()).collect();
    Arc::new(Tiny::new(s))
}

/// Runs `write` on one thread and `read` on another (both spawned: loom explores a spawned pair
/// far more completely than the main thread against one spawned thread).
fn race(
    t: &Arc<Tiny<Box<[Slot<W>]>>>,
    write: impl Fn(&Tiny<Box<[Slot<W>]>>) + Send + Sync + 'static,
    read: impl Fn(&Tiny<Box<[Slot<W>]>>) + Send + Sync + 'static,
) {
    let (w, r) = (Arc::clone(t), Arc::clone(t));
    let reader = thread::spawn(move || read(&r));
    let writer = thread::spawn(move || write(&w));
    reader.join().unwrap();
    writer.join().unwrap();
}

/// In-place update racing a reader: the reader sees version 1 or version 2, whole.
#[test]
fn update_in_place_is_never_torn() {
    builder().check(|| {
        let t = table(2);
        assert_eq!(t.capacity(), 1);
        t.write(5, payload(1));
        race(
            &t,
            |w| w.write(5, payload(2)),
            |r| {
                if let Some(p) = r.read(5) {
                    check(&[1, 2], p);
                }
            },
        );
        assert_eq!(t.read(5), Some(payload(2)));
    });
}

/// Two updates in a row racing a reader (the sequence counter moves twice).
#[test]
fn back_to_back_updates_are_never_torn() {
    builder().check(|| {
        let t = table(2);
        t.write(5, payload(1));
        race(
            &t,
            |w| {
                w.write(5, payload(2));
                w.write(5, payload(3));
            },
            |r| {
                if let Some(p) = r.read(5) {
                    check(&[1, 2, 3], p);
                }
            },
        );
    });
}

/// The slot is emptied and reused for another key while a reader looks the old key up: the
/// reader gets the old record whole or a miss, never the new key's record.
#[test]
fn reused_slot_never_answers_for_the_old_key() {
    builder().check(|| {
        let t = table(2);
        t.write(5, payload(1));
        race(
            &t,
            |w| {
                assert!(w.remove(5));
                w.write(6, payload(2));
            },
            |r| {
                if let Some(p) = r.read(5) {
                    check(&[1], p);
                }
            },
        );
        assert_eq!(t.read(5), None);
        assert_eq!(t.read(6), Some(payload(2)));
    });
}
