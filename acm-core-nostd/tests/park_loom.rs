//! Model check (loom) of the park handshake (`acm_core_nostd::park`): a producer publishes an
//! item and wakes the consumer if it is parked; the consumer announces its park and looks for
//! items once more. In every interleaving and every value a load may return, the consumer
//! either sees the item or is woken. And the ordering it replaced (an acquire load of the flag
//! after the publication, a store of the flag before the last look, no fence) loses the
//! wake-up in some execution, which loom finds.
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" cargo test -p acm-core-nostd --test park_loom --release
//! ```
#![cfg(loom)]

use acm_core_nostd::park::ParkFlag;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

#[test]
fn the_consumer_sees_the_item_or_is_woken() {
    loom::model(|| {
        let flag = Arc::new(ParkFlag::new());
        let item = Arc::new(AtomicBool::new(false));
        let woken = Arc::new(AtomicBool::new(false));
        let producer = {
            let (flag, item, woken) = (flag.clone(), item.clone(), woken.clone());
            thread::spawn(move || {
                item.store(true, Ordering::Release);
                if flag.must_wake() {
                    woken.store(true, Ordering::Release);
                }
            })
        };
        flag.announce();
        let saw = item.load(Ordering::Acquire);
        producer.join().unwrap();
        assert!(saw || woken.load(Ordering::Acquire), "lost wake-up");
    });
}

#[test]
fn without_the_fences_a_wake_up_is_lost() {
    let lost = std::panic::catch_unwind(|| {
        loom::model(|| {
            let parked = Arc::new(AtomicBool::new(false));
            let item = Arc::new(AtomicBool::new(false));
            let woken = Arc::new(AtomicBool::new(false));
            let producer = {
                let (parked, item, woken) = (parked.clone(), item.clone(), woken.clone());
                thread::spawn(move || {
                    item.store(true, Ordering::Release);
                    if parked.load(Ordering::Acquire) {
                        woken.store(true, Ordering::Release);
                    }
                })
            };
            parked.store(true, Ordering::SeqCst);
            let saw = item.load(Ordering::Acquire);
            producer.join().unwrap();
            assert!(saw || woken.load(Ordering::Acquire), "lost wake-up");
        });
    });
    assert!(
        lost.is_err(),
        "loom found no lost wake-up in the unfenced handshake"
    );
}
