//! The handshake between a consumer that blocks when it has nothing to do and the producers
//! that hand it work and wake it (the dataplane worker's park flag). Neither side may miss the
//! other: a producer that publishes an item and then finds the flag clear must be sure the
//! consumer will still see the item, and a consumer that announced its park and then finds no
//! item must be sure every producer publishing after its look will see the flag and wake it.
//!
//! That is a store-then-load on each side (producer: item, then flag; consumer: flag, then
//! item), which only a sequentially consistent fence between the two orders: with an acquire
//! load and a release or even `SeqCst` store alone, both loads may read the old values (the
//! stores still in their cores' store buffers, as x86 allows) and the wake-up is lost until the
//! consumer's timeout. `tests/park_loom.rs` model-checks both the protocol and that loss.

use crate::sync::{fence, AtomicBool, Ordering};

/// Whether the consumer is (about to be) blocked.
pub struct ParkFlag(AtomicBool);

impl Default for ParkFlag {
    fn default() -> Self {
        ParkFlag::new()
    }
}

impl ParkFlag {
    /// A consumer that is not parked.
    pub fn new() -> ParkFlag {
        ParkFlag(AtomicBool::new(false))
    }

    /// The consumer, before its last look for work: it is about to block. After this it must
    /// look at every source once more before blocking.
    pub fn announce(&self) {
        self.0.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// The consumer, once it runs again (or decided not to block after all).
    pub fn clear(&self) {
        self.0.store(false, Ordering::Relaxed);
    }

    /// A producer, after publishing its work: whether the consumer may be blocked and must be
    /// woken.
    pub fn must_wake(&self) -> bool {
        fence(Ordering::SeqCst);
        self.0.load(Ordering::Relaxed)
    }
}
