//! The ibacm class 0x2C resolve MAD against the stock provider (rdma-core's libibacmp):
//!
//! * `acmp_resolve_req.bin`: the multicast request the real ibacm + libibacmp on Hca3 sent
//!   when `ib_acme -f n -s hca3 -d hca4` asked it to resolve the name "hca4";
//! * `acmrs_resolve_resp.bin`: the response our encoder built for it, which acmp accepted
//!   (ib_acme then printed the path to LID 6 and "SA verification: success").
//!
//! Captured with `tests/fixtures/regen_acm.sh` (acm-fabric + simverbs + `tests/c/wire_acm_listen.c`).

use acm_core_nostd::wire::acm_mad::{
    is_acm_mad, AcmMad, AcmResolveRepr, AddressType, ADDRESS_LEN, CTRL_RESOLVE,
};
use acm_core_nostd::wire::mad::Method;
use acm_core_nostd::wire::mcmember::AcmMgid;
use acm_core_nostd::wire::rate::{Mtu, Rate};

fn fixture(name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn name(s: &str) -> [u8; ADDRESS_LEN] {
    let mut a = [0u8; ADDRESS_LEN];
    a[..s.len()].copy_from_slice(s.as_bytes());
    a
}

fn base_group() -> AcmMgid {
    AcmMgid {
        pkey: 0xffff,
        tos: 0,
        rate: Rate::Gbps10.into(),
        mtu: Mtu::Mtu2048.into(),
    }
}

#[test]
fn stock_acmp_request_decodes_and_reencodes_byte_for_byte() {
    let b = fixture("acmp_resolve_req.bin");
    assert_eq!(b.len(), 256);
    assert!(is_acm_mad(&b));
    let r = AcmResolveRepr::parse(&AcmMad::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!((r.base_version, r.class_version), (1, 1));
    assert_eq!(r.method, Method::Get);
    assert_eq!(r.status, 0);
    assert_eq!(r.control, CTRL_RESOLVE);
    assert_ne!(r.tid, 0);
    assert_eq!(r.tid >> 32, 0, "acmp's TID counter is 32-bit");
    assert_eq!((r.dest_type, r.dest_length), (AddressType::Name, 64));
    assert_eq!(r.dest, name("hca4"));
    assert_eq!((r.src_type, r.src_length), (AddressType::Name, 64));
    assert_eq!(r.src, name("hca3"));
    assert_eq!((r.resp_resources, r.init_depth), (0, 0));
    assert_eq!(r.gids(), &[base_group().to_gid()]);

    // Our request constructor produces exactly what acmp sends.
    let ours = AcmResolveRepr::request(
        r.tid,
        AddressType::Name,
        name("hca4"),
        AddressType::Name,
        name("hca3"),
        &[base_group().to_gid()],
    )
    .unwrap();
    assert_eq!(ours, r);
    let mut out = [0u8; 256];
    ours.emit(&mut AcmMad::new_unchecked(&mut out[..])).unwrap();
    assert_eq!(out[..], b[..]);
}

#[test]
fn our_response_is_the_one_acmp_accepted() {
    let req = fixture("acmp_resolve_req.bin");
    let r = AcmResolveRepr::parse(&AcmMad::new_checked(&req[..]).unwrap()).unwrap();
    let mut out = [0u8; 256];
    AcmResolveRepr::response(r.tid, *r.gids().last().unwrap())
        .emit(&mut AcmMad::new_unchecked(&mut out[..]))
        .unwrap();
    assert_eq!(out[..], fixture("acmrs_resolve_resp.bin")[..]);
    let resp = AcmResolveRepr::parse(&AcmMad::new_checked(&out[..]).unwrap()).unwrap();
    assert_eq!(resp.method, Method::GetResp);
    assert_eq!(resp.tid, r.tid);
    assert_eq!(resp.gids(), &[base_group().to_gid()]);
    assert_eq!(resp.dest, [0; 64]);
}
