//! The RMPP receiver (`acm_core_nostd::rmpp`) against IBA 13.6: byte-exact ACK, STOP and ABORT
//! MADs built by hand from the field layout, every protocol rule one at a time, and a model
//! sender (go-back-N with a window and resends, as Linux's MAD layer sends OpenSM's answers)
//! driving it in virtual time over a network that loses, duplicates and reorders, for many
//! seeded schedules: each ends with the exact bytes or a clean failure, never a hang.

use acm_core_nostd::rng::Rng;
use std::collections::BinaryHeap;

use acm_core_nostd::rmpp::{
    self, Config, Failure, Ignored, Progress, Receiver, State, SEGMENT_DATA_LEN,
    SEGMENT_PAYLOAD_LEN,
};
use acm_core_nostd::wire::mad::{RmppStatus, MAD_LEN};

const TID: u64 = 0x0102_0304_0506_0708;
/// PathRecord: 64-byte records, AttributeOffset 8 words.
const ATTR_OFFSET: u16 = 8;
const GET_TABLE_RESP: u8 = 0x92;

/// The 56 header bytes of a GetTableResp segment, field by field (IBA 13.4.2, 13.6.2, 15.2.1).
fn sa_head(method: u8, tid: u64) -> [u8; 56] {
    let mut h = [0u8; 56];
    h[0] = 1; // BaseVersion
    h[1] = 0x03; // MgmtClass SubnAdm
    h[2] = 2; // ClassVersion
    h[3] = method;
    h[8..16].copy_from_slice(&tid.to_be_bytes());
    h[16..18].copy_from_slice(&0x0035u16.to_be_bytes()); // PathRecord
    h[44..46].copy_from_slice(&ATTR_OFFSET.to_be_bytes());
    h[48..56].copy_from_slice(&0x0000_0000_0000_000cu64.to_be_bytes()); // ComponentMask
    h
}

/// A DATA segment: RMPP header written byte by byte.
fn data_seg(seg: u32, flags: u8, paylen: u32, records: &[u8]) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    m[..56].copy_from_slice(&sa_head(GET_TABLE_RESP, TID));
    m[24] = 1; // RMPPVersion
    m[25] = 1; // DATA
    m[26] = (0x1f << 3) | flags;
    m[28..32].copy_from_slice(&seg.to_be_bytes());
    m[32..36].copy_from_slice(&paylen.to_be_bytes());
    m[56..56 + records.len()].copy_from_slice(records);
    m
}

const ACTIVE: u8 = 1;
const FIRST: u8 = 2;
const LAST: u8 = 4;

/// PayloadLength of the first segment as Linux's MAD layer computes it for `bytes` of records.
fn first_paylen(bytes: usize) -> u32 {
    let segs = bytes.div_ceil(SEGMENT_DATA_LEN).max(1);
    (segs * 20 + bytes) as u32
}

/// All segments of a transfer of `data`, flags and lengths as a kernel sender sets them.
fn segments(data: &[u8], announce: bool) -> Vec<[u8; MAD_LEN]> {
    let n = data.len().div_ceil(SEGMENT_DATA_LEN).max(1);
    (1..=n)
        .map(|s| {
            let chunk = &data[((s - 1) * SEGMENT_DATA_LEN).min(data.len())
                ..(s * SEGMENT_DATA_LEN).min(data.len())];
            let mut flags = ACTIVE;
            let mut paylen = 0;
            if s == 1 {
                flags |= FIRST;
                paylen = if announce {
                    first_paylen(data.len())
                } else {
                    0
                };
            }
            if s == n {
                flags |= LAST;
                paylen = 20 + chunk.len() as u32;
            }
            data_seg(s as u32, flags, paylen, chunk)
        })
        .collect()
}

fn records(n: usize, salt: u8) -> Vec<u8> {
    (0..n * 64)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt) ^ (i >> 8) as u8)
        .collect()
}

fn receiver(cap: usize, window: u32) -> Receiver<Vec<u8>> {
    let mut r = Receiver::new(
        vec![0u8; cap],
        Config {
            window,
            resp_timeout: 50,
            total_timeout: 1000,
            ..Config::DEFAULT
        },
    );
    r.start(0, TID);
    r
}

/// The expected reply MAD: the request-direction header (GetTable 0x12, status 0) and the RMPP
/// header, byte by byte; data zero.
fn expected_reply(rtype: u8, status: u8, seg: u32, word2: u32) -> [u8; MAD_LEN] {
    let mut e = [0u8; MAD_LEN];
    e[..56].copy_from_slice(&[
        0x01, 0x03, 0x02, 0x12, // base, SA, class v2, GetTable (R bit cleared)
        0x00, 0x00, 0x00, 0x00, // status, class specific
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // TID unchanged
        0x00, 0x35, 0x00, 0x00, // PathRecord, reserved
        0x00, 0x00, 0x00, 0x00, // AttributeModifier
        0x01, rtype, 0xf9, status, // RMPPVersion 1, type, RRespTime 0x1F | Active, status
        0, 0, 0, 0, // SegmentNumber
        0, 0, 0, 0, // PayloadLength / NewWindowLast
        0, 0, 0, 0, 0, 0, 0, 0, // SM_Key
        0x00, 0x08, 0x00, 0x00, // AttributeOffset, reserved
        0, 0, 0, 0, 0, 0, 0, 0x0c, // ComponentMask
    ]);
    e[28..32].copy_from_slice(&seg.to_be_bytes());
    e[32..36].copy_from_slice(&word2.to_be_bytes());
    e
}

#[test]
fn ack_mad_is_iba_layout_byte_for_byte() {
    let data = records(10, 1); // 640 bytes: 4 segments (200, 200, 200, 40)
    let segs = segments(&data, true);
    assert_eq!(segs.len(), 4);
    assert_eq!(&segs[0][32..36], &(4 * 20 + 640u32).to_be_bytes());
    let mut r = receiver(1000, 2);
    assert_eq!(
        r.handle_receive(1, &segs[0]),
        Progress::Accepted { segment: 1 }
    );
    // Segment 1 ends the sender's initial window (1): ACK 1, window 1 + 2.
    assert_eq!(r.poll_transmit(), Some(expected_reply(2, 0, 1, 3)));
    assert_eq!(r.poll_transmit(), None, "one ACK, once");
    assert_eq!(
        r.handle_receive(2, &segs[1]),
        Progress::Accepted { segment: 2 }
    );
    assert_eq!(r.poll_transmit(), None, "no ACK inside the window");
    assert_eq!(
        r.handle_receive(3, &segs[2]),
        Progress::Accepted { segment: 3 }
    );
    // The window's last segment: ACK 3, window capped at the transfer's 4 segments.
    assert_eq!(r.poll_transmit(), Some(expected_reply(2, 0, 3, 4)));
    assert_eq!(r.handle_receive(4, &segs[3]), Progress::Done { len: 640 });
    assert_eq!(r.poll_transmit(), Some(expected_reply(2, 0, 4, 4)));
    assert_eq!(r.payload(), Some(&data[..]));
    assert_eq!(r.state(), State::Done { len: 640 });
    assert_eq!(&r.header().unwrap()[..], &segs[0][..56]);
    assert_eq!(r.poll_timeout(), None);
    // The final ACK was lost: the sender re-sends the last segment and hears it again.
    assert_eq!(
        r.handle_receive(9, &segs[3]),
        Progress::Ignored(Ignored::Finished)
    );
    assert_eq!(r.poll_transmit(), Some(expected_reply(2, 0, 4, 4)));
    assert_eq!(r.counters.accepted, 4);
}

#[test]
fn duplicates_and_out_of_order_segments_reack_and_are_not_assembled() {
    let data = records(20, 2); // 1280 bytes: 7 segments
    let segs = segments(&data, true);
    let mut r = receiver(4096, 8);
    r.handle_receive(0, &segs[0]);
    let ack1 = r.poll_transmit().unwrap();
    assert_eq!(ack1, expected_reply(2, 0, 1, 7));
    // Segment 3 before 2: dropped, ACK 1 again.
    let mut bad3 = segs[2];
    bad3[60] ^= 0xff; // if it were stored, the bytes would be wrong
    assert_eq!(
        r.handle_receive(1, &bad3),
        Progress::Ignored(Ignored::OutOfOrder)
    );
    assert_eq!(r.poll_transmit(), Some(ack1));
    // Segment 1 again: a duplicate, ACK 1 again.
    assert_eq!(
        r.handle_receive(2, &segs[0]),
        Progress::Ignored(Ignored::Duplicate)
    );
    assert_eq!(r.poll_transmit(), Some(ack1));
    for (i, s) in segs.iter().enumerate().skip(1) {
        let got = r.handle_receive(3 + i as u64, s);
        if i + 1 < segs.len() {
            assert_eq!(
                got,
                Progress::Accepted {
                    segment: i as u32 + 1
                }
            );
        } else {
            assert_eq!(got, Progress::Done { len: 1280 });
        }
    }
    assert_eq!(r.payload(), Some(&data[..]));
    assert_eq!((r.counters.duplicates, r.counters.out_of_order), (1, 1));
}

#[test]
fn silence_resends_the_last_ack_and_the_total_time_aborts() {
    let data = records(10, 3);
    let segs = segments(&data, true);
    let mut r = receiver(1000, 1);
    r.handle_receive(100, &segs[0]);
    let ack1 = r.poll_transmit().unwrap();
    assert_eq!(r.poll_timeout(), Some(150));
    assert_eq!(r.handle_timeout(149), None);
    assert_eq!(r.poll_transmit(), None);
    assert_eq!(r.handle_timeout(150), None);
    assert_eq!(r.poll_transmit(), Some(ack1));
    assert_eq!(r.poll_timeout(), Some(200));
    // Total time: 1000 ms from the first segment.
    let mut now = 200;
    while now < 1100 {
        assert_eq!(r.handle_timeout(now), None);
        assert_eq!(r.poll_transmit(), Some(ack1));
        now = r.poll_timeout().unwrap();
    }
    assert_eq!(now, 1100);
    assert_eq!(r.handle_timeout(now), Some(Failure::TimedOut));
    assert_eq!(r.poll_transmit(), Some(expected_reply(4, 118, 0, 0)));
    assert_eq!(r.poll_timeout(), None);
    assert_eq!(r.state(), State::Failed(Failure::TimedOut));
    // A late segment hears the ABORT again, and nothing is assembled.
    assert_eq!(
        r.handle_receive(1200, &segs[1]),
        Progress::Ignored(Ignored::Finished)
    );
    assert_eq!(r.poll_transmit(), Some(expected_reply(4, 118, 0, 0)));
    assert_eq!(r.payload(), None);
}

#[test]
fn waiting_for_a_first_segment_that_never_comes_ends_without_a_word() {
    let mut r = receiver(1000, 4);
    assert_eq!(r.poll_timeout(), Some(1000));
    // Segment 2 first (segment 1 lost): nothing to acknowledge yet.
    let segs = segments(&records(10, 4), true);
    assert_eq!(
        r.handle_receive(5, &segs[1]),
        Progress::Ignored(Ignored::BeforeFirst)
    );
    assert_eq!(r.poll_transmit(), None);
    assert_eq!(r.handle_timeout(999), None);
    assert_eq!(r.handle_timeout(1000), Some(Failure::TimedOut));
    assert_eq!(r.poll_transmit(), None);
}

#[test]
fn abort_and_stop_from_the_sender_end_the_transfer() {
    for (rtype, status, want) in [
        (
            4u8,
            126u8,
            Failure::AbortedBySender(RmppStatus::TooManyRetries),
        ),
        (
            3,
            1,
            Failure::StoppedBySender(RmppStatus::ResourcesExhausted),
        ),
    ] {
        let segs = segments(&records(10, 5), true);
        let mut r = receiver(1000, 4);
        r.handle_receive(0, &segs[0]);
        assert!(r.poll_transmit().is_some());
        let mut nak = segs[1];
        nak[25] = rtype;
        nak[26] = (0x1f << 3) | ACTIVE;
        nak[27] = status;
        nak[28..36].fill(0);
        assert_eq!(r.handle_receive(1, &nak), Progress::Failed(want));
        assert_eq!(r.poll_transmit(), None, "an ABORT or STOP is not answered");
        assert_eq!(r.poll_timeout(), None);
        assert_eq!(
            r.handle_receive(2, &segs[1]),
            Progress::Ignored(Ignored::Finished)
        );
        assert_eq!(r.poll_transmit(), None);
        assert_eq!(r.payload(), None);
    }
    // Before any segment, too.
    let mut r = receiver(1000, 4);
    let mut abort = data_seg(0, ACTIVE, 0, &[]);
    abort[25] = 4;
    abort[27] = 118;
    assert_eq!(
        r.handle_receive(0, &abort),
        Progress::Failed(Failure::AbortedBySender(RmppStatus::TotalTimeTooLong))
    );
}

#[test]
fn a_transfer_too_big_for_the_storage_is_stopped_with_resources_exhausted() {
    // 100 PathRecords announced, room for 50.
    let data = records(100, 6);
    let segs = segments(&data, true);
    let mut r = receiver(50 * 64, 16);
    let failure = Failure::TooBig {
        payload_len: first_paylen(6400),
        record_bytes: Some(6400),
        records_needed: Some(100),
        capacity: 3200,
    };
    assert_eq!(r.handle_receive(0, &segs[0]), Progress::Failed(failure));
    assert_eq!(r.poll_transmit(), Some(expected_reply(3, 1, 0, 0)));
    assert!(r.payload().is_none());
    // Nothing was written.
    assert_eq!(r.state(), State::Failed(failure));
    // The biggest announced length there is: no overflow, no panic.
    let mut huge = segs[0];
    huge[32..36].copy_from_slice(&u32::MAX.to_be_bytes());
    let mut r = receiver(3200, 16);
    let Progress::Failed(Failure::TooBig {
        records_needed: Some(n),
        ..
    }) = r.handle_receive(0, &huge)
    else {
        panic!("a 4 GiB answer is too big");
    };
    let segs_n = u32::MAX.div_ceil(SEGMENT_PAYLOAD_LEN);
    assert_eq!(n, (u32::MAX - 20 * segs_n).div_ceil(64));
    // Exactly the storage: taken.
    let mut r = receiver(6400, 16);
    let mut now = 0;
    let mut last = None;
    for s in &segs {
        now += 1;
        last = Some(r.handle_receive(now, s));
    }
    assert_eq!(last, Some(Progress::Done { len: 6400 }));
    assert_eq!(r.payload(), Some(&data[..]));
}

#[test]
fn length_not_announced_is_bounded_by_the_storage() {
    let data = records(10, 7); // 640 bytes
    let segs = segments(&data, false);
    assert_eq!(&segs[0][32..36], &[0; 4]);
    // Fits: the window is capped by the storage (4 segments of room for 640 bytes).
    let mut r = receiver(640, 16);
    r.handle_receive(0, &segs[0]);
    assert_eq!(r.poll_transmit(), Some(expected_reply(2, 0, 1, 4)));
    for (i, s) in segs.iter().enumerate().skip(1) {
        r.handle_receive(i as u64, s);
    }
    assert_eq!(r.state(), State::Done { len: 640 });
    assert_eq!(r.payload(), Some(&data[..]));
    // One byte short: STOP when the segment that would overflow arrives.
    let mut r = receiver(639, 16);
    let mut got = None;
    for (i, s) in segs.iter().enumerate() {
        got = Some(r.handle_receive(i as u64, s));
        if matches!(got, Some(Progress::Failed(_))) {
            break;
        }
    }
    assert_eq!(
        got,
        Some(Progress::Failed(Failure::TooBig {
            payload_len: 0,
            record_bytes: None,
            records_needed: None,
            capacity: 639
        }))
    );
    // A non-LAST segment that fills the storage exactly: more is coming, so too big.
    let mut r = receiver(600, 16);
    let got: Vec<_> = segs.iter().map(|s| r.handle_receive(0, s)).collect();
    assert!(
        matches!(got[2], Progress::Failed(Failure::TooBig { .. })),
        "{got:?}"
    );
    let mut last_reply = None;
    while let Some(m) = r.poll_transmit() {
        last_reply = Some(m);
    }
    assert_eq!(last_reply, Some(expected_reply(3, 1, 0, 0)));
}

#[test]
fn zero_records_and_a_single_segment() {
    // OpenSM answers an empty GetTable with RMPP, AttributeOffset 0: PayloadLength 20.
    let mut r = receiver(0, 16);
    let seg = data_seg(1, ACTIVE | FIRST | LAST, 20, &[]);
    assert_eq!(r.handle_receive(0, &seg), Progress::Done { len: 0 });
    assert_eq!(r.poll_transmit(), Some(expected_reply(2, 0, 1, 1)));
    assert_eq!(r.payload(), Some(&[][..]));
    let data = records(3, 8);
    let mut r = receiver(1000, 16);
    assert_eq!(
        r.handle_receive(0, &segments(&data, true)[0]),
        Progress::Done { len: 192 }
    );
    assert_eq!(r.payload(), Some(&data[..]));
}

/// Each rule of IBA 13.6 a segment can break: the ABORT status sent, and nothing assembled.
#[test]
fn protocol_violations_are_aborted_with_the_iba_status() {
    let data = records(10, 9);
    let segs = segments(&data, true);
    type Mutate = fn(&mut [u8; MAD_LEN]);
    let cases: [(&str, usize, Mutate, u8); 9] = [
        ("RMPPVersion 2", 0, |m| m[24] = 2, 125),
        ("RMPPType 0 with Active", 0, |m| m[25] = 0, 121),
        ("RMPPType 9", 1, |m| m[25] = 9, 121),
        ("DATA with a status", 1, |m| m[27] = 5, 124),
        ("segment 1 without First", 0, |m| m[26] &= !FIRST, 120),
        ("First on segment 2", 1, |m| m[26] |= FIRST, 120),
        ("Last on segment 2 of 4", 1, |m| m[26] |= LAST, 119),
        ("Last with the wrong PayloadLength", 3, |m| m[35] += 1, 119),
        ("segment 4 of 4 without Last", 3, |m| m[26] &= !LAST, 119),
    ];
    for (what, at, mutate, status) in cases {
        let mut r = receiver(1000, 16);
        let mut last = None;
        for (i, s) in segs.iter().enumerate().take(at + 1) {
            let mut s = *s;
            if i == at {
                mutate(&mut s);
            }
            last = Some(r.handle_receive(i as u64, &s));
        }
        assert_eq!(
            last,
            Some(Progress::Failed(Failure::Protocol(RmppStatus::from(
                status
            )))),
            "{what}"
        );
        let mut reply = None;
        while let Some(m) = r.poll_transmit() {
            reply = Some(m);
        }
        assert_eq!(reply, Some(expected_reply(4, status, 0, 0)), "{what}");
        assert_eq!(r.payload(), None, "{what}");
        assert_eq!(r.counters.malformed, 1, "{what}");
    }
    // A first PayloadLength too small for one SA header.
    let mut r = receiver(1000, 16);
    assert_eq!(
        r.handle_receive(0, &data_seg(1, ACTIVE | FIRST, 19, &[])),
        Progress::Failed(Failure::Protocol(RmppStatus::from(119)))
    );
}

#[test]
fn mads_that_are_not_this_transfer_change_nothing() {
    let segs = segments(&records(10, 10), true);
    let mut r = Receiver::new(vec![0u8; 1000], Config::DEFAULT);
    assert_eq!(
        r.handle_receive(0, &segs[0]),
        Progress::Ignored(Ignored::NotListening)
    );
    r.start(0, TID);
    let mut other = segs[0];
    other[15] ^= 1;
    assert_eq!(
        r.handle_receive(0, &other),
        Progress::Ignored(Ignored::OtherTid)
    );
    assert_eq!(
        r.handle_receive(0, &segs[0][..255]),
        Progress::Ignored(Ignored::Truncated)
    );
    let mut not_sa = segs[0];
    not_sa[1] = 0x2c;
    assert_eq!(
        r.handle_receive(0, &not_sa),
        Progress::Ignored(Ignored::NotSa)
    );
    let mut request = segs[0];
    request[3] = 0x12;
    assert_eq!(
        r.handle_receive(0, &request),
        Progress::Ignored(Ignored::NotResponse)
    );
    assert_eq!(r.poll_transmit(), None);
    assert_eq!(r.state(), State::WaitingFirst);
    // An ACK is for senders.
    r.handle_receive(0, &segs[0]);
    let _ = r.poll_transmit();
    let mut ack = segs[1];
    ack[25] = 2;
    assert_eq!(
        r.handle_receive(0, &ack),
        Progress::Ignored(Ignored::UnexpectedAck)
    );
    let mut plain = segs[1];
    plain[26] = 0;
    assert_eq!(
        r.handle_receive(0, &plain),
        Progress::Ignored(Ignored::NotRmpp)
    );
    assert_eq!(r.state(), State::Receiving);
    // The SA's plain error answer (OpenSM's osm_sa_send_error: no RMPP, status set).
    let mut r = receiver(1000, 16);
    let mut err = [0u8; MAD_LEN];
    err[..56].copy_from_slice(&sa_head(GET_TABLE_RESP, TID));
    err[4] = 0x03; // ERR_NO_RECORDS in the class byte... as OpenSM never sends for GetTable,
    err[44..46].fill(0); // but any status: the caller decides
    let Progress::Failed(Failure::NotRmpp(status)) = r.handle_receive(0, &err) else {
        panic!("a plain answer ends the wait");
    };
    assert_eq!(status.class_status(), 3);
    assert_eq!(r.poll_transmit(), None);
}

// ---------------------------------------------------------------------------------------------
// A model sender and a lossy network in virtual time.

/// An IBA 13.6 sender, go-back-N: initial window 1; sends up to NewWindowLast; on a timeout
/// (no ACK that moves it on) goes back to the segment after the last ACKed; gives up with
/// ABORT "too many retries" after `retries` timeouts in a row; stops on STOP or ABORT. It
/// checks every ACK the receiver sends against what it has sent (S2B, W2S).
struct Sender {
    segs: Vec<[u8; MAD_LEN]>,
    last_ack: u32,
    window_last: u32,
    next: u32,
    highest_sent: u32,
    timeout: u64,
    deadline: Option<u64>,
    retries: u32,
    retries_left: u32,
    done: bool,
    gave_up: bool,
    violations: Vec<String>,
}

impl Sender {
    fn total(&self) -> u32 {
        self.segs.len() as u32
    }
    fn send(&mut self, now: u64, out: &mut Vec<[u8; MAD_LEN]>) {
        if self.done || self.gave_up {
            return;
        }
        while self.next <= self.window_last.min(self.total()) {
            out.push(self.segs[self.next as usize - 1]);
            self.highest_sent = self.highest_sent.max(self.next);
            self.next += 1;
            self.deadline.get_or_insert(now + self.timeout);
        }
    }
    fn on_mad(&mut self, now: u64, m: &[u8; MAD_LEN]) {
        if self.done || self.gave_up {
            return;
        }
        if m[3] != 0x12 || m[8..16] != TID.to_be_bytes() || m[24] != 1 || m[26] & 7 != 1 {
            self.violations
                .push(format!("bad header {:02x?}", &m[..36]));
        }
        let seg = u32::from_be_bytes(m[28..32].try_into().unwrap());
        let nwl = u32::from_be_bytes(m[32..36].try_into().unwrap());
        match m[25] {
            2 => {
                if seg > self.highest_sent || seg > self.window_last.max(1) {
                    self.violations
                        .push(format!("S2B: ACK {seg}, sent {}", self.highest_sent));
                }
                if nwl < seg {
                    self.violations.push(format!("W2S: ACK {seg} window {nwl}"));
                }
                if seg < self.last_ack {
                    return;
                }
                if seg > self.last_ack {
                    self.retries_left = self.retries;
                    self.deadline = Some(now + self.timeout);
                }
                self.last_ack = seg;
                self.window_last = self.window_last.max(nwl.min(self.total()));
                if self.last_ack >= self.total() {
                    self.done = true;
                    self.deadline = None;
                }
            }
            3 | 4 => {
                self.gave_up = true;
                self.deadline = None;
            }
            t => self.violations.push(format!("type {t} sent to a sender")),
        }
    }
    fn on_timeout(&mut self, now: u64, out: &mut Vec<[u8; MAD_LEN]>) {
        if self.retries_left == 0 {
            self.gave_up = true;
            self.deadline = None;
            let mut abort = self.segs[0];
            abort[25] = 4;
            abort[26] = (0x1f << 3) | ACTIVE;
            abort[27] = 126;
            abort[28..36].fill(0);
            out.push(abort);
            return;
        }
        self.retries_left -= 1;
        self.next = self.last_ack + 1;
        self.deadline = None;
        self.send(now, out);
        self.deadline = Some(now + self.timeout);
    }
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Flight {
    /// Reversed for the max-heap: earliest first, then the order sent.
    at: std::cmp::Reverse<(u64, u64)>,
    to_receiver: bool,
    mad: [u8; MAD_LEN],
}

struct Net {
    queue: BinaryHeap<Flight>,
    seq: u64,
    loss: u32,
    dup: u32,
    /// Per mille of MADs held back by up to `jitter` ms (and so overtaken).
    reorder: u32,
    jitter: u64,
}

impl Net {
    fn put(&mut self, rng: &mut Rng, now: u64, to_receiver: bool, mad: [u8; MAD_LEN]) {
        let copies = if rng.chance(self.dup) { 2 } else { 1 };
        for _ in 0..copies {
            if rng.chance(self.loss) {
                continue;
            }
            let late = if rng.chance(self.reorder) {
                1 + rng.below(self.jitter)
            } else {
                0
            };
            let at = now + 1 + late;
            self.seq += 1;
            self.queue.push(Flight {
                at: std::cmp::Reverse((at, self.seq)),
                to_receiver,
                mad,
            });
        }
    }
}

#[derive(Debug, PartialEq, Eq, Hash, Clone, Copy)]
enum End {
    Done,
    TimedOut,
    SenderGaveUp,
    TooBig,
}

fn run(seed: u64) -> (End, bool) {
    let mut rng = Rng(seed);
    let n_records = rng.below(260) as usize; // up to 83 segments
    let data = records(n_records, seed as u8);
    let announce = rng.below(4) != 0;
    let roomy = rng.below(8) != 0;
    let cap = if roomy {
        data.len() + rng.below(300) as usize
    } else {
        data.len().saturating_sub(1 + rng.below(400) as usize)
    };
    let window = 1 + rng.below(24) as u32;
    let config = Config {
        window,
        resp_timeout: 10 + rng.below(60),
        total_timeout: 2000 + rng.below(3000),
        ..Config::DEFAULT
    };
    let mut net = Net {
        queue: BinaryHeap::new(),
        seq: 0,
        loss: [0, 20, 100, 250][rng.below(4) as usize],
        dup: [0, 50, 200][rng.below(3) as usize],
        reorder: [0, 50, 300][rng.below(3) as usize],
        jitter: 3 + rng.below(20),
    };
    let retries = 2 + rng.below(8) as u32;
    let mut sender = Sender {
        segs: segments(&data, announce),
        last_ack: 0,
        window_last: 1,
        next: 1,
        highest_sent: 0,
        // Above the longest round trip (2 × (1 + jitter)), as a sender's timeout is.
        timeout: 2 * (2 + net.jitter) + rng.below(80),
        deadline: None,
        retries,
        retries_left: retries,
        done: false,
        gave_up: false,
        violations: Vec::new(),
    };
    let mut r = Receiver::new(vec![0u8; cap], config);
    r.start(0, TID);
    let mut now = 0u64;
    let mut ended: Option<Progress> = None;
    let mut out = Vec::new();
    let bound = config.total_timeout + 200 * 20;
    // `RMPP_TRACE=<seed>` prints that run MAD by MAD.
    let trace = std::env::var("RMPP_TRACE").is_ok_and(|v| v == seed.to_string());
    if trace {
        eprintln!(
            "{} segs, cap {cap}, {config:?}, timeout {} retries {retries} loss {} dup {} jitter {}",
            sender.segs.len(),
            sender.timeout,
            net.loss,
            net.dup,
            net.jitter
        );
    }
    for step in 0.. {
        assert!(step < 200_000, "seed {seed}: no end after {step} steps");
        sender.send(now, &mut out);
        for m in out.drain(..) {
            net.put(&mut rng, now, true, m);
        }
        while let Some(m) = r.poll_transmit() {
            net.put(&mut rng, now, false, m);
        }
        let next = [
            net.queue.peek().map(|f| f.at.0 .0),
            r.poll_timeout(),
            sender.deadline,
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(next) = next else { break };
        assert!(next >= now);
        now = next;
        assert!(now <= bound, "seed {seed}: still going at {now} ms");
        while net.queue.peek().is_some_and(|f| f.at.0 .0 == now) {
            let f = net.queue.pop().unwrap();
            if trace {
                eprintln!(
                    "{now}: to {} type {} seg {} w {}",
                    if f.to_receiver { "receiver" } else { "sender" },
                    f.mad[25],
                    u32::from_be_bytes(f.mad[28..32].try_into().unwrap()),
                    u32::from_be_bytes(f.mad[32..36].try_into().unwrap())
                );
            }
            if f.to_receiver {
                let got = r.handle_receive(now, &f.mad);
                if trace {
                    eprintln!("   -> {got:?}");
                }
                if matches!(got, Progress::Done { .. } | Progress::Failed(_)) {
                    assert!(ended.is_none(), "seed {seed}: ended twice: {got:?}");
                    ended = Some(got);
                }
            } else {
                sender.on_mad(now, &f.mad);
            }
        }
        if r.poll_timeout().is_some_and(|t| t <= now) {
            if let Some(f) = r.handle_timeout(now) {
                assert!(ended.is_none(), "seed {seed}: ended twice");
                ended = Some(Progress::Failed(f));
            }
        }
        if sender.deadline.is_some_and(|t| t <= now) {
            if trace {
                eprintln!("{now}: sender timeout, last_ack {}", sender.last_ack);
            }
            sender.on_timeout(now, &mut out);
        }
    }
    assert!(
        sender.violations.is_empty(),
        "seed {seed}: {:?}",
        sender.violations
    );
    let end = match ended {
        Some(Progress::Done { len }) => {
            assert_eq!(len, data.len(), "seed {seed}");
            assert_eq!(r.payload(), Some(&data[..]), "seed {seed}: wrong bytes");
            End::Done
        }
        Some(Progress::Failed(Failure::TimedOut)) => End::TimedOut,
        Some(Progress::Failed(Failure::AbortedBySender(RmppStatus::TooManyRetries))) => {
            End::SenderGaveUp
        }
        Some(Progress::Failed(Failure::TooBig {
            records_needed,
            capacity,
            ..
        })) => {
            assert!(data.len() > cap, "seed {seed}: {cap} was enough");
            assert_eq!(capacity, cap);
            if announce {
                assert_eq!(records_needed, Some(n_records as u32), "seed {seed}");
            }
            assert!(sender.gave_up || !sender.done, "seed {seed}: STOP and done");
            End::TooBig
        }
        other => panic!("seed {seed}: ended with {other:?}"),
    };
    assert!(r.poll_timeout().is_none(), "seed {seed}: timers left");
    if net.loss == 0 && net.dup == 0 && net.reorder == 0 && data.len() <= cap {
        assert_eq!(
            end,
            End::Done,
            "seed {seed}: a perfect network must succeed"
        );
        assert!(sender.done, "seed {seed}: the sender heard the final ACK");
        // One ACK per window and the final one: n / window rounded up, plus segment 1's.
        let n = sender.total() as u64;
        assert!(
            r.counters.acks <= 2 + n / u64::from(window),
            "seed {seed}: {:?}",
            r.counters
        );
        assert_eq!(r.counters.duplicates + r.counters.out_of_order, 0);
    }
    (end, net.loss <= 20 && net.reorder <= 50)
}

#[test]
fn seeded_schedules_of_loss_duplication_and_reordering_end_exactly_or_cleanly() {
    let mut ends = std::collections::HashMap::<End, u32>::new();
    let (mut mild, mut mild_done) = (0, 0);
    for seed in 0..3000u64 {
        let (end, mild_net) = run(seed);
        *ends.entry(end).or_default() += 1;
        if mild_net && end != End::TooBig {
            mild += 1;
            mild_done += u32::from(end == End::Done);
        }
    }
    // Every way of ending is reached, and with little loss almost everything gets through.
    for e in [End::Done, End::TimedOut, End::SenderGaveUp, End::TooBig] {
        assert!(
            ends.get(&e).copied().unwrap_or(0) > 0,
            "{e:?} never: {ends:?}"
        );
    }
    eprintln!("{ends:?}; {mild_done} of {mild} on a mild network");
    assert!(
        mild_done * 100 >= mild * 98,
        "{mild_done} of {mild} done at ≤ 2 % loss, ≤ 5 % reordered: {ends:?}"
    );
}

/// The fuzz target's invariant in plain `cargo test`: MADs with our TID and mangled RMPP and MAD
/// headers (mutations of real segments, some truncated) never panic, never end a transfer
/// twice, leave no timer after the end, and a Done holds exactly the data areas of the
/// segments it accepted, in order.
#[test]
fn garbage_never_panics_or_assembles_wrong_bytes() {
    let mut rng = Rng(7);
    let data = records(40, 11);
    let segs = segments(&data, rng.below(2) == 0);
    let (mut dones, mut failed) = (0, 0);
    for _ in 0..20_000 {
        let mut r = receiver(rng.below(4000) as usize, 1 + rng.below(8) as u32);
        let mut now = 0;
        let mut ended = 0;
        let mut taken: Vec<u8> = Vec::new();
        let mut next = 0;
        for _ in 0..rng.below(60) {
            // Mostly the segment expected next, so that transfers also complete.
            let pick = if rng.chance(700) {
                next.min(segs.len() - 1)
            } else {
                rng.below(segs.len() as u64) as usize
            };
            let mut m = segs[pick];
            let mutations = if rng.chance(200) { 1 + rng.below(3) } else { 0 };
            for _ in 0..mutations {
                let i = [24, 25, 26, 27, 28, 31, 32, 34, 35, 3, 1, rng.below(56)]
                    [rng.below(12) as usize] as usize;
                m[i] = rng.next_u64() as u8;
            }
            let len = if rng.chance(50) {
                rng.below(300) as usize
            } else {
                MAD_LEN
            };
            let wire = &m[..len.min(MAD_LEN)];
            now += rng.below(20);
            match r.handle_receive(now, wire) {
                Progress::Accepted { segment } => {
                    assert_eq!(taken.len(), (segment as usize - 1) * 200);
                    taken.extend_from_slice(&m[56..256]);
                    next = segment as usize;
                }
                Progress::Done { len } => {
                    ended += 1;
                    let seg = u32::from_be_bytes(m[28..32].try_into().unwrap()) as usize;
                    assert_eq!(taken.len(), (seg - 1) * 200);
                    let tail = len - taken.len();
                    taken.extend_from_slice(&m[56..56 + tail]);
                    assert_eq!(r.payload(), Some(&taken[..]));
                    dones += 1;
                }
                Progress::Failed(_) => {
                    ended += 1;
                    failed += 1;
                }
                Progress::Ignored(_) => {}
            }
            let _ = r.poll_transmit();
            if r.handle_timeout(now).is_some() {
                ended += 1;
            }
        }
        assert!(ended <= 1);
        if ended == 1 {
            assert_eq!(r.poll_timeout(), None);
        }
    }
    eprintln!("{dones} done, {failed} failed of 20000");
    assert!(dones > 500, "only {dones} transfers completed");
    assert!(failed > 1000, "only {failed} transfers failed");
}

#[test]
fn the_segment_builder_cuts_as_a_kernel_sender_does() {
    // `rmpp::segment` (the simulator's and the SA channel tests' sender) against this file's
    // field-by-field builder, for tables of 0 bytes, under one segment, exactly one, one
    // byte over, and many segments.
    for bytes in [0usize, 64, 192, 200, 201, 400, 64 * 100] {
        let data = records(bytes.div_ceil(64), 7);
        let data = &data[..bytes];
        let want = segments(data, true);
        assert_eq!(rmpp::segment_count(bytes) as usize, want.len(), "{bytes} B");
        for (i, w) in want.iter().enumerate() {
            let got = rmpp::segment(&sa_head(GET_TABLE_RESP, TID), data, i as u32 + 1).unwrap();
            assert_eq!(&got[..], &w[..], "{bytes} B, segment {}", i + 1);
        }
        assert!(rmpp::segment(&sa_head(GET_TABLE_RESP, TID), data, 0).is_none());
        assert!(
            rmpp::segment(&sa_head(GET_TABLE_RESP, TID), data, want.len() as u32 + 1).is_none()
        );
        // And the receiver takes them back to the same bytes.
        let mut r = receiver(bytes.max(1), 4);
        r.start(0, TID);
        for w in &want {
            let _ = r.handle_receive(1, w);
            let _ = r.poll_transmit();
        }
        assert_eq!(r.payload(), Some(data));
    }
}
