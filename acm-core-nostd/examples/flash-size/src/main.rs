//! A minimal resolver user on bare metal, to measure the flash the resolver takes: static
//! tables (`ArrayStorage`, a 16-entry path cache), one endpoint, and every input and output
//! exercised with opaque data so nothing is optimised away.
//!
//! ```text
//! cd acm-core-nostd/examples/flash-size
//! cargo build --release --target thumbv7em-none-eabihf
//! llvm-size -A target/thumbv7em-none-eabihf/release/acm-flash-size
//! ```
//!
//! (`riscv32imac-unknown-none-elf` likewise.) On a host target it is an ordinary program.
#![cfg_attr(target_os = "none", no_std, no_main)]

use acm_core_nostd::cache::{ep_number, AddrKind, AddrSlot, CacheConfig, PathCache, PathSlot};
use acm_core_nostd::resolver::{
    ArrayStorage, Config, EpConfig, EpId, Kind, MsgBuf, Output, RecvMeta, Request, Resolver,
};
use acm_core_nostd::wire::gid::Gid;
use core::hint::black_box;

static PATHS: [PathSlot; 16] = [const { PathSlot::new() }; 16];
static ADDRS: [AddrSlot; 16] = [const { AddrSlot::new() }; 16];

/// 8 requests (1 kept for immediate answers), 4 route jobs, 8 addresses, 1 endpoint, 1
/// preload: all zero bytes, so the linker puts it in `.bss` (no flash).
type Slabs = ArrayStorage<8, 1, 4, 8, 1, 1>;
static mut SLABS: Slabs = Slabs::new();

fn run() -> u32 {
    let Ok(cache) = PathCache::new(&PATHS[..], &ADDRS[..], CacheConfig::default()) else {
        return 0;
    };
    // SAFETY: `run` is called once, from the reset handler, before anything else runs: this
    // is the only reference to SLABS ever made (what `cortex_m::singleton!` does).
    let storage: &'static mut Slabs = unsafe { &mut *core::ptr::addr_of_mut!(SLABS) };
    let Ok(writer) = cache.writer() else {
        return 0;
    };
    let Ok(mut r) = Resolver::new(black_box(Config::default()), storage, writer, black_box(1))
    else {
        return 0;
    };
    let ep = EpId(0);
    let cache_ep = ep_number(0, ep.0);
    let cfg = EpConfig {
        port_gid: Gid(black_box([0xfe; 16])),
        lid: black_box(4),
        pkey: 0xffff,
        mtu: 4,
        rate: 3,
        subnet_timeout_ms: 0,
        qpn: 0x48,
        sa_pkey: true,
    };
    let _ = r.handle_open(0, ep, cache_ep, cfg);
    let _ = r.handle_add_address(0, ep, cache_ep, AddrKind::Name, &black_box([0x61; 64]));
    let mut outputs = 0u32;
    for now in 0..black_box(1000u64) {
        let msg: [u8; 160] = black_box([1u8; 160]);
        let kind = match now % 4 {
            0 => Kind::Resolve,
            1 => Kind::Query,
            2 => Kind::Prime,
            _ => Kind::Refresh,
        };
        r.handle_request(now, &Request::new(ep, cache_ep, now, kind, &msg));
        let mad: [u8; 256] = black_box([0x2c; 256]);
        r.handle_sa(now, black_box(now << 32), 0, &mad);
        let meta = RecvMeta {
            slid: black_box(6),
            src_qp: 1,
            sl: 0,
            dlid_path_bits: 0,
            pkey_index: 0,
            ep_pkey_index: 0,
            grh_sgid: Some(Gid(black_box([0xfe; 16]))),
        };
        r.handle_acm(now, ep, &meta, &mad);
        r.handle_timeout(now);
        let mut msg = MsgBuf::new();
        while let Some(o) = r.poll_output(&mut msg) {
            if let Output::Answer(a) = &o {
                outputs = outputs.wrapping_add(u32::from(a.len));
                black_box(msg.message(a));
            }
            black_box(&o);
        }
        if black_box(now) == 999 {
            r.handle_reregister(now, ep, cache_ep.next_generation());
            r.handle_close(now, ep);
            r.handle_shutdown(now);
        }
    }
    black_box(r.stats());
    outputs
}

#[cfg(target_os = "none")]
#[no_mangle]
pub extern "C" fn _start() -> ! {
    black_box(run());
    #[allow(clippy::empty_loop)]
    loop {}
}

#[cfg(target_os = "none")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    #[allow(clippy::empty_loop)]
    loop {}
}

#[cfg(not(target_os = "none"))]
fn main() {
    println!("{} answer bytes", run());
}
