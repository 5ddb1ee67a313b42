//! Kernel consumers through the RDMA netlink local service: NFS/RDMA, iSER, SRP and Lustre
//! reach ibacm with `RDMA_NL_LS_OP_RESOLVE` messages (SGID, DGID, ServiceID, P_Key, TClass,
//! QoS class), which the real core turns into PATH requests to its provider. These machines
//! have no RDMA netlink, so simverbs gives the real daemon a simulated `NETLINK_RDMA` socket
//! and the test plays the kernel (`acm_fabric::kernel`), with its `sa_local_svc_timeout_ms`
//! (2 s): an answer later than that is one the kernel never waits for.
//!
//! One fabric: Hca2 stock, Hca3 and Hca4 acmrs; OpenSM with QoS on (ServiceID ranges mapped
//! to SLs) and a partition 0x8001 of Hca3 and Hca4.
//!
//! Needs root and `libsimverbs.so` + `libacmrs.so` in the target directory.

mod common;

use acm_fabric::checks::require_root;
use acm_fabric::kernel::{LsAnswer, LsQuery, SA_LOCAL_SVC_TIMEOUT};
use acm_fabric::{Fabric, Partition};
use common::{mixed_fabric, node_gid as gid, policy_sl, QOS_POLICY};
use std::time::{Duration, Instant};
/// `IB_PATH_PRIMARY | IB_PATH_GMP | IB_PATH_BIDIRECTIONAL` (a reversible path).
const GMP_FLAGS: u32 = 0x2 | 0x1 | 0x8 | 0x20;

/// The kernel's request from `on` to `to`, retried (up to 20 s) while the daemon's endpoints
/// are still joining and it answers an error; each try must be answered within the kernel's
/// timeout.
fn kernel_resolve(f: &Fabric, on: &str, q: &LsQuery, want_path: bool) -> LsAnswer {
    let mut k = f.node(on).unwrap().kernel().unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let t0 = Instant::now();
        let a = k.resolve(q, Duration::from_secs(10)).unwrap();
        let took = t0.elapsed();
        assert!(
            took < SA_LOCAL_SVC_TIMEOUT,
            "{on}: answered after {took:?}, past the kernel's 2 s ({a:?})\n{}",
            f.logs_report()
        );
        if matches!(a, LsAnswer::Path(..)) == want_path || Instant::now() > end {
            return a;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn query(f: &Fabric, on: &str, to: &str) -> LsQuery {
    LsQuery {
        sgid: gid(f, on),
        dgid: gid(f, to),
        reversible: true,
        ..LsQuery::default()
    }
}

#[test]
fn kernel_local_service_requests_are_answered_with_the_sas_sl_and_partition() {
    require_root();
    let f = mixed_fabric("netlink")
        .qos_policy(QOS_POLICY)
        .partition(Partition::parse("0x8001:Hca3,Hca4").unwrap())
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    for n in ["Hca2", "Hca3", "Hca4"] {
        let log = f.node(n).unwrap().log();
        assert!(
            !log.contains("unable to allocate netlink recv socket"),
            "{n}: the core has its netlink socket:\n{log}"
        );
    }
    // acmrs: the SL the SA assigns to each ServiceID, in the default partition.
    for sid in [0x10005u64, 0x1060cbc, 0x20000] {
        let sl = policy_sl(sid);
        let q = LsQuery {
            service_id: Some(sid),
            pkey: Some(0xffff),
            ..query(&f, "Hca3", "Hca4")
        };
        match kernel_resolve(&f, "Hca3", &q, true) {
            LsAnswer::Path(flags, p) => {
                assert_eq!(flags, GMP_FLAGS, "sid {sid:#x}");
                assert_eq!((p.sl, p.pkey, p.dgid), (sl, 0xffff, q.dgid), "sid {sid:#x}");
                assert_eq!(p.dlid, f.node("Hca4").unwrap().lid);
            }
            other => panic!("acmrs sid {sid:#x}: {other:?}\n{}", f.logs_report()),
        }
    }
    // The P_Key attribute picks the partition: acmrs answers in 0x8001 with its key.
    let q = LsQuery {
        pkey: Some(0x8001),
        tclass: Some(0),
        ..query(&f, "Hca4", "Hca3")
    };
    match kernel_resolve(&f, "Hca4", &q, true) {
        LsAnswer::Path(_, p) => assert_eq!((p.pkey, p.dgid), (0x8001, q.dgid)),
        other => panic!("acmrs pkey 0x8001: {other:?}\n{}", f.logs_report()),
    }
    // Hca2 is not in 0x8001: no path in that partition, an error answer (not a timeout),
    // from acmrs on Hca3 asking for Hca2 in 0x8001.
    let q = LsQuery {
        pkey: Some(0x8001),
        ..query(&f, "Hca3", "Hca2")
    };
    assert_eq!(
        kernel_resolve(&f, "Hca3", &q, false),
        LsAnswer::Error,
        "acmrs: no path to a non-member in 0x8001"
    );
    // A P_Key the source port does not hold (Hca2 has no 0x8003): an error, never a path
    // from another partition.
    for on in ["Hca2", "Hca3"] {
        let q = LsQuery {
            pkey: Some(0x8003),
            ..query(&f, on, "Hca4")
        };
        assert_eq!(
            kernel_resolve(&f, on, &q, false),
            LsAnswer::Error,
            "{on}: P_Key 0x8003 is not the port's"
        );
    }
    // Stock answers the kernel too, but drops the ServiceID (acmp_record_path_addr): the
    // SA's default SL.
    let q = LsQuery {
        service_id: Some(0x10005),
        pkey: Some(0xffff),
        ..query(&f, "Hca2", "Hca4")
    };
    match kernel_resolve(&f, "Hca2", &q, true) {
        LsAnswer::Path(_, p) => assert_eq!((p.sl, p.dgid), (0, q.dgid)),
        other => panic!("stock: {other:?}\n{}", f.logs_report()),
    }
}
