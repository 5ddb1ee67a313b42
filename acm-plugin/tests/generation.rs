//! The endpoint's cache flush generation through the loaded provider: after more
//! CLIENT_REREGISTERs than an 8-bit generation had values (it came back to its start after
//! 256), the hit path (core's thread, `Ep::cache_ep`) and the dataplane (which re-inserts the
//! preloaded routes under the number it derives itself) still agree on the endpoint's cache
//! number, and a route learned before the reregisters is not answered from the cache.
//! (The wrap itself is proven in `acmrs::instance`'s unit tests and `cache_basic.rs`.)

mod common;

use acm_testkit::core::*;
use acm_testkit::host::*;
use acm_testkit::request::*;
use acmrs::ffi::*;
use common::OPTS;

#[test]
fn hit_path_and_dataplane_agree_on_the_cache_number_after_300_reregisters() {
    let _s = serial();
    let dump = common::route_dump(2, 0x20, 0x2000);
    let opts = format!("{OPTS}route_preload opensm_full_v1\nroute_data_file $DIR/route.data\n");
    let mut h = Host::open(&opts, &[("route.data", &dump)]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    assert!(wait_until(|| log_contains("preloaded routes inserted")));
    // A learned route: an SA query, then a hit inside resolve().
    let t = h.tid();
    h.resolve(ep, &path_request(t, 6, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    let t = h.tid();
    h.resolve(ep, &path_request(t, 6, None, 0), 1);
    assert_eq!(find(t).len(), 1, "learned: answered inline");
    for _ in 0..300 {
        h.reregister();
    }
    h.barrier();
    // The preloaded route, inserted again by the dataplane under its number for generation
    // 300, is found by the hit path under the plugin's number for it.
    for (lid, gid) in [(0x20, None), (0, Some(gid_of(0x2001)))] {
        let t = h.tid();
        h.resolve(ep, &path_request(t, lid, gid, 0), 1);
        assert_eq!(
            find(t).len(),
            1,
            "preloaded {lid:#x}/{gid:?}: answered inline"
        );
    }
    // The learned one is gone: asked of the SA again, then cached under the new number.
    let t = h.tid();
    h.resolve(ep, &path_request(t, 6, None, 0), 1);
    assert!(
        find(t).is_empty(),
        "learned before the reregisters: not a hit"
    );
    sa_one(SaAction::Answer, 5);
    assert_eq!(find(t).len(), 1);
    let t = h.tid();
    h.resolve(ep, &path_request(t, 6, None, 0), 1);
    assert_eq!(find(t).len(), 1, "learned again: answered inline");
    h.close();
}
