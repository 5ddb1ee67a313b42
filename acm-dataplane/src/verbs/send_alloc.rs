//! A failed post allocates nothing: [`UdEndpoint::send`] over a fake QP whose provider
//! refuses every work request, under the crate's counting allocator (`count_allocs`).

use super::*;
use crate::count_allocs::allocations;

/// The provider's `post_send`: refuses everything with ENOMEM (a full send queue).
unsafe extern "C" fn refuse_post_send(
    _qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> i32 {
    // SAFETY: `bad` is the endpoint's valid out-pointer.
    unsafe { *bad = wr };
    libc::ENOMEM
}

#[test]
fn failed_post_send_does_not_allocate() {
    // SAFETY: ibv_context and ibv_qp are plain C structs; all-zero is a valid (inert) value.
    let mut ctx: Box<ibv_context> = Box::new(unsafe { std::mem::zeroed() });
    ctx.ops.post_send = Some(refuse_post_send);
    // SAFETY: as above.
    let mut qp: Box<ibv_qp> = Box::new(unsafe { std::mem::zeroed() });
    qp.context = &mut *ctx;
    let cfg = UdConfig {
        port_num: 1,
        pkey_index: 0,
        qkey: ACM_QKEY,
        recv_depth: 0,
        send_depth: 1,
    };
    let mut region = vec![0u8; MAD_LEN];
    let group = McGroup {
        index: 0,
        mgid: Gid([0xff; 16]),
        mlid: 0xc000,
        sl: 0,
        flow_label: 0,
        hop_limit: 0,
        tclass: 0,
        rate: 0,
        mtu: 0,
        pkey: 0xffff,
        qkey: 0,
    };
    // Only what `send` to group 0 touches is real: the QP (its provider refuses the post,
    // so the null AH is never read) and one free send buffer.
    let mut ep = UdEndpoint {
        cfg,
        pd: ptr::null_mut(),
        channel: ptr::null_mut(),
        cq: ptr::null_mut(),
        send_cq: ptr::null_mut(),
        qp: &mut *qp,
        mr: ptr::null_mut(),
        region: region.as_mut_ptr(),
        region_len: region.len(),
        lkey: 0,
        qpn: 1,
        send_free: vec![0],
        send_owner: vec![Owner::Free],
        groups: vec![Some(GroupSlot {
            group,
            ah: ptr::null_mut(),
            inflight: 0,
            attached: true,
        })],
        ahs: Vec::new(),
        clock_hand: 0,
        recv_is_posted: Vec::new(),
        unacked: 0,
        broken: false,
        starve_backoff: 0,
        stats: UdStats::default(),
        wcs: Vec::new(),
        rx_mad: Vec::new(),
        rx_meta: Vec::new(),
        rwr: Vec::new(),
        rsge: Vec::new(),
    };
    let mad = [0u8; MAD_LEN];
    let to = AcmDest::Group(0);
    let (r, n) = allocations(|| {
        let mut last = Ok(());
        for _ in 0..100 {
            last = ep.send(&to, &mad);
        }
        last
    });
    let (send_errors, send_free) = (ep.stats().send_errors, ep.send_free.clone());
    // Nothing of the fakes is a verbs object: the teardown at drop must see none (before any
    // assert: a failed one would drop the endpoint while unwinding).
    ep.qp = ptr::null_mut();
    ep.region = ptr::null_mut();
    ep.groups.clear();
    drop(ep);
    assert_eq!(
        r,
        Err(SendError::Verbs(VerbsError {
            call: "ibv_post_send",
            errno: libc::ENOMEM,
        }))
    );
    assert_eq!(n, 0, "100 failed posts allocated {n} times");
    assert_eq!(send_errors, 100);
    assert_eq!(send_free, [0], "a refused post keeps its buffer");
    // The counter itself counts: one boxed io::Error (what a failed post returned before).
    let (_, boxed) = allocations(|| VerbsError::from_rc("ibv_post_send", libc::ENOMEM).io());
    assert!(boxed > 0);
}
