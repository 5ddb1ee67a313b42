#![no_main]
//! The SA channel (`acm_core_nostd::sa_channel`) with GetTable answers over RMPP, driven by
//! arbitrary scripts: requests (Gets and GetTables) started, real segments of their answers
//! (any order, bytes overwritten, from the SM or from someone else, on the right QP or not),
//! plain replies, raw MADs, clock jumps, endpoints dropped. Invariants: no panic; every request
//! completes at most once while the script runs, and exactly once once time has run out
//! (nothing outstanding, no timer left); a completed table is readable and fits its slot;
//! every MAD the channel asks us to send for a table is an RMPP ACK/STOP/ABORT in the request
//! direction for a TID it handed out.
use acm_core_nostd::resolver::{EpId, RecvMeta};
use acm_core_nostd::rmpp::{self, Config};
use acm_core_nostd::sa_channel::{Expired, Received, SaChannel, SaEntry, SmAddr, TableSlot};
use acm_core_nostd::wire::mad::MAD_LEN;
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, HashSet};

const SM: SmAddr = SmAddr { lid: 1, sl: 0 };

fn meta(slid: u16, src_qp: u32) -> RecvMeta {
    RecvMeta {
        slid,
        src_qp,
        sl: 0,
        dlid_path_bits: 0,
        pkey_index: 0,
        ep_pkey_index: 0,
        grh_sgid: None,
    }
}

fn request(table: bool, tag: u8) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    m[..4].copy_from_slice(&[1, 0x03, 2, if table { 0x12 } else { 0x01 }]);
    m[15] = tag;
    m[16..18].copy_from_slice(&0x0035u16.to_be_bytes());
    m
}

fuzz_target!(|data: &[u8]| {
    let mut input = data.iter().copied();
    let mut byte = || input.next();
    let (Some(a), Some(b), Some(c)) = (byte(), byte(), byte()) else {
        return;
    };
    let room = usize::from(a) * 64;
    let config = Config {
        window: u32::from(b % 20),
        resp_timeout: u64::from(c % 50),
        total_timeout: 400,
        ..Config::DEFAULT
    };
    let tables: Vec<TableSlot<Vec<u8>>> = (0..2)
        .map(|_| TableSlot::new(vec![0u8; room], config))
        .collect();
    let mut ch = SaChannel::new(vec![SaEntry::EMPTY; 6], tables, [7, 9]);
    let mut now = 0u64;
    let mut next_token = 1u64;
    // token -> (wire TID, endpoint, is a table); tokens completed.
    let mut out: HashMap<u64, (u64, EpId, bool)> = HashMap::new();
    let mut done: HashSet<u64> = HashSet::new();
    let mut tids: HashSet<u64> = HashSet::new();
    let complete =
        |token: u64, out: &mut HashMap<u64, (u64, EpId, bool)>, done: &mut HashSet<u64>| {
            assert!(
                out.remove(&token).is_some(),
                "token {token} completed twice or never started"
            );
            assert!(done.insert(token));
        };
    loop {
        let Some(op) = byte() else { break };
        match op % 8 {
            0 | 1 => {
                let table = op & 0x10 != 0;
                let ep = EpId(op >> 6);
                let tries = u32::from(op % 3) + 1;
                let token = next_token;
                next_token += 1;
                if let Some(w) = ch.start(now, ep, token, &request(table, op), 30, tries) {
                    let tid = u64::from_be_bytes(w[8..16].try_into().unwrap());
                    tids.insert(tid);
                    out.insert(token, (tid, ep, table));
                }
            }
            2 | 3 => {
                // A segment of an outstanding (or finished) table's answer, maybe mangled.
                let (Some(k), Some(n), Some(recs)) = (byte(), byte(), byte()) else {
                    break;
                };
                let Some(&(tid, ep, _)) = out.values().nth(usize::from(k) % out.len().max(1))
                else {
                    continue;
                };
                let records: Vec<u8> = (0..usize::from(recs) * 64).map(|i| i as u8).collect();
                let mut head = [0u8; 56];
                head[..4].copy_from_slice(&[1, 0x03, 2, 0x92]);
                head[8..16].copy_from_slice(&tid.to_be_bytes());
                head[16..18].copy_from_slice(&0x0035u16.to_be_bytes());
                head[44..46].copy_from_slice(&8u16.to_be_bytes());
                let count = rmpp::segment_count(records.len());
                let Some(mut m) = rmpp::segment(&head, &records, u32::from(n) % count + 1) else {
                    continue;
                };
                if op & 0x20 != 0 {
                    if let (Some(at), Some(v)) = (byte(), byte()) {
                        m[usize::from(at) % 56] = v;
                    }
                }
                let from = if op & 0x40 != 0 {
                    meta(9, 1)
                } else {
                    meta(1, 1)
                };
                let on = ep;
                let r = ch.receive(now, &from, Some(SM), |e| e == on || op & 0x80 != 0, &m);
                settle(r, &ch, &mut out, &mut done, &complete);
            }
            4 => {
                // A plain reply to an outstanding request, or a raw MAD.
                let Some(k) = byte() else { break };
                let mut m = [0u8; MAD_LEN];
                for (i, x) in m.iter_mut().enumerate().take(64) {
                    *x = byte().unwrap_or(i as u8);
                }
                if let Some(&(tid, _, _)) = out.values().nth(usize::from(k) % out.len().max(1)) {
                    if k & 1 == 0 {
                        m[8..16].copy_from_slice(&tid.to_be_bytes());
                        m[1] = 0x03;
                        m[3] |= 0x80;
                    }
                }
                let r = ch.receive(now, &meta(1, 1), Some(SM), |_| true, &m);
                settle(r, &ch, &mut out, &mut done, &complete);
            }
            5 => {
                now += u64::from(byte().unwrap_or(1));
                expire(&mut ch, now, &mut out, &mut done, &complete);
            }
            6 => {
                let ep = EpId(byte().unwrap_or(0) >> 6);
                ch.drop_endpoint(ep, |t, _| complete(t, &mut out, &mut done));
            }
            _ => {
                now += u64::from(byte().unwrap_or(0)) * 16;
            }
        }
        while let Some((_, m)) = ch.poll_transmit() {
            let tid = u64::from_be_bytes(m[8..16].try_into().unwrap());
            assert!(tids.contains(&tid), "a MAD for a TID never handed out");
            assert_eq!(m[3] & 0x80, 0, "request direction");
            if m[24] == 1 {
                assert!((2..=4).contains(&m[25]), "ACK, STOP or ABORT: {}", m[25]);
            } else {
                // A request again: only while it is outstanding.
                assert!(
                    out.values().any(|(t, _, _)| *t == tid),
                    "a request sent again after it completed"
                );
            }
        }
    }
    // Time runs out: everything still outstanding completes exactly once.
    for _ in 0..10_000 {
        let Some(at) = ch.next_deadline() else { break };
        now = now.max(at);
        expire(&mut ch, now, &mut out, &mut done, &complete);
        while ch.poll_transmit().is_some() {}
    }
    assert!(ch.is_empty(), "{} outstanding after time ran out", ch.len());
    assert!(out.is_empty(), "tokens never completed: {:?}", out.keys());
    assert!(ch.next_deadline().is_none());
});

type Complete = dyn Fn(u64, &mut HashMap<u64, (u64, EpId, bool)>, &mut HashSet<u64>);

fn settle(
    r: Received,
    ch: &SaChannel<Vec<SaEntry>, Vec<TableSlot<Vec<u8>>>, Vec<u8>>,
    out: &mut HashMap<u64, (u64, EpId, bool)>,
    done: &mut HashSet<u64>,
    complete: &Complete,
) {
    match r {
        Received::Reply { token, .. } | Received::TableFailed { token, .. } => {
            complete(token, out, done)
        }
        Received::Table { token, slot } => {
            let t = ch.table(slot).expect("a completed table is readable");
            assert!(t.records.len() <= ch.table_slots()[slot].receiver().capacity());
            complete(token, out, done);
        }
        Received::Segment | Received::Report | Received::Forged | Received::Unknown => {}
    }
}

fn expire(
    ch: &mut SaChannel<Vec<SaEntry>, Vec<TableSlot<Vec<u8>>>, Vec<u8>>,
    now: u64,
    out: &mut HashMap<u64, (u64, EpId, bool)>,
    done: &mut HashSet<u64>,
    complete: &Complete,
) {
    ch.expire(now);
    while let Some(e) = ch.poll_expired() {
        match e {
            Expired::Failed { token, .. } | Expired::TableFailed { token, .. } => {
                complete(token, out, done)
            }
        }
    }
}
