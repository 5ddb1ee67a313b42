//! QoS by ServiceID with the real ibacm daemon and real OpenSM (QoS on, a `qos-ulps` policy
//! mapping ServiceID ranges to SLs): PATH requests carrying a ServiceID, as the kernel's local
//! service and librdmacm send them through the core, are answered with the SL the SA assigns
//! to that ServiceID, by acmrs and by the stock provider alike.
//!
//! Needs root and `libsimverbs.so` + `libacmrs.so` in the target directory.

mod common;

use acm_core_nostd::wire::client::{Status, FLAGS_QUERY_SA};
use acm_core_nostd::wire::path_record::PathRecordRepr;
use acm_fabric::checks::require_root;
use acm_fabric::client::path_request;
use acm_fabric::Fabric;
use common::{mixed_fabric, node_gid as gid, policy_sl, QOS_POLICY};
use std::time::{Duration, Instant};

/// A PATH request on `on` for `to` with `sid` (entry flags `flags`), retried while the
/// daemon answers an error (its endpoints still joining): the last status and path.
fn ask(f: &Fabric, on: &str, to: &str, sid: u64, flags: u32, tid: u64) -> (Status, PathRecordRepr) {
    let mut p = PathRecordRepr::ZERO;
    p.sgid = gid(f, on);
    p.dgid = gid(f, to);
    p.service_id = sid;
    let mut c = f.node(on).unwrap().client().unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (a, _) = c.roundtrip(&path_request(&p, flags, tid)).unwrap();
        if a.status == Status::Success || Instant::now() > end {
            return (a.status, a.path);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn route_cache_hits(f: &Fabric, on: &str) -> u64 {
    acm_fabric::checks::global_counters(f, on)["Route Cache Count"]
}

#[test]
fn each_service_id_gets_the_sl_the_sa_assigns() {
    require_root();
    let f = mixed_fabric("qos-sid")
        .qos_policy(QOS_POLICY)
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    // acmrs: a cold destination per ServiceID gets the SA's SL for it, answered well within
    // the kernel's local-service timeout (sa_local_svc_timeout_ms, 2 s: past it the kernel
    // asks the SA itself and the load doubles).
    for (i, (sid, to)) in [(0x10005u64, "Hca4"), (0x1060cbc, "Hca2"), (0, "Hca2")]
        .iter()
        .enumerate()
    {
        let t0 = Instant::now();
        let (st, p) = ask(&f, "Hca3", to, *sid, 0, 10 + i as u64);
        let took = t0.elapsed();
        assert_eq!(
            st,
            Status::Success,
            "Hca3 -> {to} sid {sid:#x}\n{}",
            f.logs_report()
        );
        assert_eq!(p.sl, policy_sl(*sid), "acmrs Hca3 -> {to} sid {sid:#x}: SL");
        assert_eq!(p.dgid, gid(&f, to));
        assert!(
            took < Duration::from_secs(2),
            "Hca3 -> {to}: a miss took {took:?}"
        );
    }
    // The same destination with other ServiceIDs: acmrs keys its cache by the ServiceID, so
    // each gets its own SL, and asking again is a cache hit with the same SL.
    for sid in [0x1060cbcu64, 0, 0x1ffff] {
        let (_, p) = ask(&f, "Hca3", "Hca4", sid, 0, 20);
        assert_eq!(
            p.sl,
            policy_sl(sid),
            "acmrs Hca3 -> Hca4 sid {sid:#x} after 0x10005"
        );
        let hits = route_cache_hits(&f, "Hca3");
        let (_, again) = ask(&f, "Hca3", "Hca4", sid, 0, 21);
        assert_eq!(again.sl, policy_sl(sid));
        assert_eq!(
            route_cache_hits(&f, "Hca3"),
            hits + 1,
            "sid {sid:#x}: a cache hit"
        );
    }
    // A query() (ACM_FLAGS_QUERY_SA) passes the record to the SA as it is: both providers
    // return the SA's SL.
    for on in ["Hca2", "Hca3"] {
        let (st, p) = ask(&f, on, "Hca4", 0x10005, FLAGS_QUERY_SA, 40);
        assert_eq!(
            (st, p.sl),
            (Status::Success, 3),
            "{on}: query() sid 0x10005"
        );
    }
    // Stock's resolve() drops the ServiceID (acmp_record_path_addr copies only the GIDs,
    // LIDs and its own P_Key into the SA query), so it answers the SA's default SL even on a
    // cold destination: the difference docs/shapes.md lists.
    let (st, p) = ask(&f, "Hca2", "Hca3", 0x10005, 0, 30);
    assert_eq!(
        (st, p.sl),
        (Status::Success, 0),
        "stock resolve() sid 0x10005"
    );
}
