#![no_main]
//! The RMPP receiver (`acm_core_nostd::rmpp`) driven by arbitrary scripts: real segments of a
//! transfer (in any order, with header bytes overwritten), raw MADs carrying its TID, and
//! clock jumps. Invariants: no panic; a transfer ends at most once and leaves no timer; every
//! MAD it sends is a well-formed RMPP ACK/STOP/ABORT to the sender (request direction, same
//! TID, version 1, Active, an ACK never acknowledging past its own window); a completed
//! transfer holds exactly the data areas of the segments it accepted, in order.
use acm_core_nostd::rmpp::{Config, Progress, Receiver};
use acm_core_nostd::wire::mad::MAD_LEN;
use libfuzzer_sys::fuzz_target;

const TID: u64 = 0x0000_0001_dead_beef;

/// Segment `seg` of a transfer of `n` segments carrying `bytes` of records.
fn segment(seg: u32, n: u32, bytes: u32, announce: bool) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    m[..4].copy_from_slice(&[1, 0x03, 2, 0x92]);
    m[8..16].copy_from_slice(&TID.to_be_bytes());
    m[16..18].copy_from_slice(&0x0035u16.to_be_bytes());
    m[24] = 1;
    m[25] = 1;
    let mut flags = 1;
    let mut paylen = 0;
    if seg == 1 {
        flags |= 2;
        paylen = if announce { n * 20 + bytes } else { 0 };
    }
    if seg == n {
        flags |= 4;
        paylen = 20 + (bytes - (n - 1) * 200);
    }
    m[26] = (0x1f << 3) | flags;
    m[28..32].copy_from_slice(&seg.to_be_bytes());
    m[32..36].copy_from_slice(&paylen.to_be_bytes());
    m[44..46].copy_from_slice(&8u16.to_be_bytes());
    for (i, b) in m[56..].iter_mut().enumerate() {
        *b = (seg as u8).wrapping_mul(37) ^ i as u8;
    }
    m
}

fuzz_target!(|data: &[u8]| {
    let mut input = data.iter().copied();
    let mut byte = || input.next();
    let (Some(a), Some(b), Some(c), Some(d)) = (byte(), byte(), byte(), byte()) else {
        return;
    };
    let cap = usize::from(a) * 40;
    let config = Config {
        window: u32::from(b % 32),
        resp_timeout: u64::from(c % 64),
        total_timeout: u64::from(d) * 8,
        ..Config::DEFAULT
    };
    let Some(e) = byte() else { return };
    let bytes = u32::from(e) * 23;
    let n = bytes.div_ceil(200).max(1);
    let announce = e & 1 == 0;
    let mut r = Receiver::new(vec![0u8; cap], config);
    r.start(0, TID);
    let mut now = 0u64;
    let mut ended = false;
    let mut taken: Vec<u8> = Vec::new();
    while let Some(op) = byte() {
        let mut mad = [0u8; MAD_LEN];
        let mut len = MAD_LEN;
        match op % 4 {
            0 => {
                now += u64::from(byte().unwrap_or(0));
                if r.handle_timeout(now).is_some() {
                    assert!(!ended, "ended twice");
                    ended = true;
                }
            }
            1 => {
                // A raw MAD with our TID (or a truncated one).
                for x in mad.iter_mut() {
                    *x = byte().unwrap_or(0);
                }
                mad[8..16].copy_from_slice(&TID.to_be_bytes());
                if op & 0x40 != 0 {
                    len = usize::from(byte().unwrap_or(0));
                }
            }
            _ => {
                // A real segment, some header bytes overwritten.
                let seg = u32::from(byte().unwrap_or(0)) % (n + 1) + 1;
                mad = segment(seg.min(n), n, bytes, announce);
                if op % 4 == 3 {
                    let at = usize::from(byte().unwrap_or(0)) % 56;
                    mad[at] = byte().unwrap_or(0);
                }
            }
        }
        if op % 4 != 0 {
            let wire = &mad[..len.min(MAD_LEN)];
            match r.handle_receive(now, wire) {
                Progress::Accepted { segment } => {
                    assert!(!ended);
                    assert_eq!(taken.len(), (segment as usize - 1) * 200);
                    taken.extend_from_slice(&mad[56..]);
                }
                Progress::Done { len } => {
                    assert!(!ended, "ended twice");
                    ended = true;
                    let seg = u32::from_be_bytes(mad[28..32].try_into().unwrap()) as usize;
                    assert_eq!(taken.len(), (seg - 1) * 200);
                    taken.extend_from_slice(&mad[56..56 + (len - taken.len())]);
                    assert_eq!(r.payload(), Some(&taken[..]));
                }
                Progress::Failed(_) => {
                    assert!(!ended, "ended twice");
                    ended = true;
                }
                Progress::Ignored(_) => {}
            }
        }
        if ended {
            assert_eq!(r.poll_timeout(), None);
        }
        while let Some(out) = r.poll_transmit() {
            assert_eq!(out[1], 0x03);
            assert_eq!(out[3] & 0x80, 0, "a reply to the sender is a request");
            assert_eq!(&out[8..16], &TID.to_be_bytes());
            assert_eq!((out[24], out[26] & 7), (1, 1));
            assert!(matches!(out[25], 2..=4));
            assert!(out[56..].iter().all(|x| *x == 0));
            if out[25] == 2 {
                let seg = u32::from_be_bytes(out[28..32].try_into().unwrap());
                let nwl = u32::from_be_bytes(out[32..36].try_into().unwrap());
                assert!(seg <= nwl, "ACK {seg} past its window {nwl}");
                assert_eq!(out[27], 0);
            } else {
                assert_eq!(&out[28..36], &[0; 8]);
            }
        }
    }
});
