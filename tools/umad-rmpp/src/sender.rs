//! The RMPP sender of one transfer, sans-IO: how a GetTable response longer than one MAD is
//! cut into DATA segments and paced by the receiver's ACKs, as the kernel MAD layer does for a
//! umad send with the RMPP Active flag (IBA 13.6). No clock (times are passed in, in
//! milliseconds), no fd: the caller sends the MADs each call returns.
//!
//! * **Segments.** Each one is the response's MAD header, an RMPP header (version 1, DATA,
//!   RRespTime 0x1F, flags Active plus First on segment 1 and Last on the last one, status 0,
//!   SegmentNumber from 1), the response's 20-byte SA header, and the next 200 bytes of the
//!   records (the last one zero-padded to 256 bytes). PayloadLength: in the first segment the
//!   whole transfer counted as 220 bytes (SA header + data) per segment less the last one's pad
//!   (`20 × segments + record bytes`); in the last segment its own 20 + data bytes; 0 between.
//! * **Window.** The first window is segment 1 alone. An ACK (SegmentNumber `s`,
//!   NewWindowLast `w`) moves the acknowledged point to `s` and the window to `w`; the segments
//!   up to `w` not sent yet go out. An ACK of the last segment completes the transfer. An ACK
//!   older than the acknowledged point is ignored; one for a segment not sent yet is answered
//!   with ABORT 123 (S2B), one whose window ends before its segment with ABORT 122 (W2S).
//! * **Timers.** No progress (no ACK moving the acknowledged point) within
//!   [`Timers::resp_timeout`] → go back: everything after the acknowledged point up to the
//!   window is sent again. After [`Timers::retries`] such timeouts in a row → ABORT 126 (TMR).
//!   [`Timers::total_timeout`] after the start → ABORT 118 (T2L).
//! * **STOP / ABORT** from the receiver end the transfer; nothing is sent back.

use acm_core_nostd::rmpp;
use acm_core_nostd::wire::mad::{
    Header, RmppHeader, RmppRepr, RmppStatus, RmppType, HEADER_LEN, MAD_LEN, RMPP_FLAG_ACTIVE,
    RMPP_LEN, RMPP_NO_RESP_TIME,
};

/// MAD header + RMPP header + SA header: where the records start in every segment.
pub const DATA_OFFSET: usize = 56;
/// Record bytes per segment.
pub const SEGMENT_DATA: usize = MAD_LEN - DATA_OFFSET;
/// The SA header's length (SM_Key, AttributeOffset, reserved, ComponentMask).
pub const SA_HEADER: usize = DATA_OFFSET - HEADER_LEN - RMPP_LEN;
/// The SubnAdm management class.
pub const CLASS_SA: u8 = 0x03;

/// How long the sender waits for progress, how often it tries, when it gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timers {
    /// No ACK moving the acknowledged point within this: send again from it (ms).
    pub resp_timeout: u64,
    /// Timeouts in a row without progress before ABORT 126.
    pub retries: u32,
    /// From the start of the transfer to ABORT 118 (ms).
    pub total_timeout: u64,
}

impl Timers {
    /// 200 ms (OpenSM's `OSM_DEFAULT_TRANS_TIMEOUT_MILLISEC`, the receiver's `resp_timeout`),
    /// 5 tries, 10 s (the receiver's `total_timeout`).
    pub const DEFAULT: Timers = Timers {
        resp_timeout: 200,
        retries: 5,
        total_timeout: 10_000,
    };
}

/// Whether `mad` (a whole umad payload, any length) is a SubnAdm response OpenSM marked for the
/// RMPP layer: class 3, the response bit, RMPPFlags Active.
pub fn is_rmpp_response(mad: &[u8]) -> bool {
    mad.len() >= DATA_OFFSET
        && mad[1] == CLASS_SA
        && mad[3] & 0x80 != 0
        && mad[HEADER_LEN + 2] & RMPP_FLAG_ACTIVE != 0
}

/// What an incoming MAD is to the sender: an RMPP ACK, STOP or ABORT of class 3 sent by a
/// receiver (a request: the response bit is clear), with (type, SegmentNumber, NewWindowLast,
/// status).
pub fn receiver_control(mad: &[u8]) -> Option<(RmppType, u32, u32, u8)> {
    if mad.len() < DATA_OFFSET || mad[1] != CLASS_SA || mad[3] & 0x80 != 0 {
        return None;
    }
    let r = RmppHeader::new_unchecked(&mad[HEADER_LEN..HEADER_LEN + RMPP_LEN]);
    if r.flags() & RMPP_FLAG_ACTIVE == 0 {
        return None;
    }
    match r.rmpp_type() {
        t @ (RmppType::Ack | RmppType::Stop | RmppType::Abort) => {
            Some((t, r.seg_num(), r.paylen_newwin(), r.status()))
        }
        _ => None,
    }
}

/// The TID of a MAD (at least 16 bytes).
pub fn tid(mad: &[u8]) -> u64 {
    Header::new_unchecked(&mad[..HEADER_LEN]).tid()
}

/// The number of segments for `data_len` record bytes (at least one): the core's
/// [`rmpp::segment_count`].
pub fn segment_count(data_len: usize) -> u32 {
    rmpp::segment_count(data_len)
}

/// Segment `seg` (1-based, up to [`segment_count`]) of the response whose 56 header bytes are
/// `head` and whose records are `data`: the core's [`rmpp::segment`], which cuts an answer as
/// the kernel MAD layer does.
pub fn segment(head: &[u8; DATA_OFFSET], data: &[u8], seg: u32) -> [u8; MAD_LEN] {
    rmpp::segment(head, data, seg).unwrap_or([0; MAD_LEN])
}

/// Every segment of a response MAD (`mad`: 56 header bytes then the records), in order.
pub fn segments(mad: &[u8]) -> Vec<[u8; MAD_LEN]> {
    let (head, data) = split(mad);
    (1..=segment_count(data.len()))
        .map(|s| segment(&head, data, s))
        .collect()
}

fn split(mad: &[u8]) -> ([u8; DATA_OFFSET], &[u8]) {
    let mut head = [0u8; DATA_OFFSET];
    head.copy_from_slice(&mad[..DATA_OFFSET]);
    (head, &mad[DATA_OFFSET..])
}

/// The sender's ABORT for a transfer whose header is `head`: the response's headers, RMPP
/// ABORT with `status`, flags Active, SegmentNumber and length 0, data zero.
pub fn abort_mad(head: &[u8; DATA_OFFSET], status: RmppStatus) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    m[..DATA_OFFSET].copy_from_slice(head);
    RmppRepr::nak(RMPP_NO_RESP_TIME, RmppType::Abort, status).emit(&mut RmppHeader::new_unchecked(
        &mut m[HEADER_LEN..HEADER_LEN + RMPP_LEN],
    ));
    m
}

/// How a transfer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The last segment was acknowledged.
    Completed,
    /// The receiver sent STOP with this status.
    Stopped(u8),
    /// The receiver sent ABORT with this status.
    AbortedByReceiver(u8),
    /// We sent ABORT with this status (126 retries, 118 total time, 122/123 a bad ACK).
    Aborted(u8),
    /// Our segments came back undeliverable (the receiver is gone).
    Undeliverable,
}

/// What one call asks the caller to do: send these MADs (in order), and whether the transfer
/// is over.
#[derive(Debug, Default)]
pub struct Step {
    /// MADs to send, in order.
    pub send: Vec<[u8; MAD_LEN]>,
    /// How many of `send` are segments sent again (go-back).
    pub resent: u32,
    /// Set when the transfer is over.
    pub end: Option<End>,
    /// The ACK moved nothing (an old or repeated ACK).
    pub stale_ack: bool,
}

/// One RMPP transfer being sent.
#[derive(Debug)]
pub struct Transfer {
    head: [u8; DATA_OFFSET],
    data: Vec<u8>,
    total: u32,
    /// Highest segment acknowledged.
    acked: u32,
    /// Highest segment sent.
    sent: u32,
    /// NewWindowLast: the highest segment the receiver allows.
    window: u32,
    started: u64,
    deadline: u64,
    timeouts: u32,
    timers: Timers,
    ended: Option<End>,
}

impl Transfer {
    /// A transfer of the response `mad` (56 header bytes then the records) starting at `now`,
    /// and its first step: segment 1.
    pub fn start(now: u64, mad: &[u8], timers: Timers) -> (Transfer, Step) {
        let (head, data) = split(mad);
        let mut t = Transfer {
            head,
            data: data.to_vec(),
            total: segment_count(data.len()),
            acked: 0,
            sent: 0,
            window: 1,
            started: now,
            deadline: now + timers.resp_timeout,
            timeouts: 0,
            timers,
            ended: None,
        };
        let mut step = Step::default();
        t.send_window(&mut step);
        (t, step)
    }

    /// Segments in the transfer.
    pub fn total(&self) -> u32 {
        self.total
    }

    /// The transfer's TID.
    pub fn tid(&self) -> u64 {
        tid(&self.head)
    }

    /// When [`Transfer::on_timeout`] is due, unless it is over.
    pub fn deadline(&self) -> Option<u64> {
        match self.ended {
            None => Some(self.deadline.min(self.started + self.timers.total_timeout)),
            Some(_) => None,
        }
    }

    /// How the transfer ended, if it did.
    pub fn ended(&self) -> Option<End> {
        self.ended
    }

    fn send_window(&mut self, step: &mut Step) {
        let last = self.window.min(self.total);
        while self.sent < last {
            self.sent += 1;
            step.send.push(segment(&self.head, &self.data, self.sent));
        }
    }

    fn finish(&mut self, step: &mut Step, end: End) {
        if let End::Aborted(status) = end {
            step.send
                .push(abort_mad(&self.head, RmppStatus::from(status)));
        }
        self.ended = Some(end);
        step.end = Some(end);
    }

    /// The receiver's ACK, STOP or ABORT (see [`receiver_control`]) at `now`.
    pub fn on_control(
        &mut self,
        now: u64,
        kind: RmppType,
        seg: u32,
        new_window: u32,
        status: u8,
    ) -> Step {
        let mut step = Step::default();
        if self.ended.is_some() {
            step.stale_ack = true;
            return step;
        }
        match kind {
            RmppType::Stop => self.finish(&mut step, End::Stopped(status)),
            RmppType::Abort => self.finish(&mut step, End::AbortedByReceiver(status)),
            _ => self.on_ack(now, seg, new_window, &mut step),
        }
        step
    }

    fn on_ack(&mut self, now: u64, seg: u32, new_window: u32, step: &mut Step) {
        if seg > self.sent {
            return self.finish(step, End::Aborted(RmppStatus::SegmentNumberTooBig.into()));
        }
        if new_window < seg {
            return self.finish(step, End::Aborted(RmppStatus::NewWindowLastTooSmall.into()));
        }
        if seg < self.acked || (seg == self.acked && new_window <= self.window) {
            step.stale_ack = true;
            return;
        }
        if seg > self.acked {
            self.acked = seg;
            self.timeouts = 0;
        }
        self.window = self.window.max(new_window);
        if self.acked == self.total {
            return self.finish(step, End::Completed);
        }
        self.send_window(step);
        self.deadline = now + self.timers.resp_timeout;
    }

    /// The timer at `now` (call when [`Transfer::deadline`] has passed; earlier calls do
    /// nothing): go back to the acknowledged point, or give up.
    pub fn on_timeout(&mut self, now: u64) -> Step {
        let mut step = Step::default();
        let Some(due) = self.deadline() else {
            return step;
        };
        if now < due {
            return step;
        }
        if now >= self.started + self.timers.total_timeout {
            self.finish(&mut step, End::Aborted(RmppStatus::TotalTimeTooLong.into()));
            return step;
        }
        self.timeouts += 1;
        if self.timeouts > self.timers.retries {
            self.finish(&mut step, End::Aborted(RmppStatus::TooManyRetries.into()));
            return step;
        }
        let before = step.send.len();
        self.sent = self.acked;
        self.send_window(&mut step);
        step.resent = (step.send.len() - before) as u32;
        self.deadline = now + self.timers.resp_timeout;
        step
    }

    /// Our segment came back from ibsim undeliverable: the receiver is gone.
    pub fn on_undeliverable(&mut self) -> Step {
        let mut step = Step::default();
        if self.ended.is_none() {
            self.finish(&mut step, End::Undeliverable);
        }
        step
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use acm_core_nostd::rmpp::{Config, Failure, Receiver};
    use acm_core_nostd::wire::mad::{RMPP_FLAG_FIRST, RMPP_FLAG_LAST};

    const TID: u64 = 0x0003_0001_1234_5678;

    /// A GetTableResp(PathRecord) as OpenSM hands it to umad_send: MAD header, RMPP header
    /// with only the Active flag, SA header (AttributeOffset 8), then `n` 64-byte records.
    fn response(n: usize) -> Vec<u8> {
        let mut m = vec![0u8; DATA_OFFSET + 64 * n];
        m[0] = 1;
        m[1] = 3;
        m[2] = 2;
        m[3] = 0x92;
        m[8..16].copy_from_slice(&TID.to_be_bytes());
        m[16..18].copy_from_slice(&0x0035u16.to_be_bytes());
        m[26] = RMPP_FLAG_ACTIVE;
        m[44..46].copy_from_slice(&8u16.to_be_bytes());
        m[48..56].copy_from_slice(&0x80u64.to_be_bytes());
        for (i, b) in m[DATA_OFFSET..].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(7) ^ (i >> 8) as u8;
        }
        m
    }

    fn rmpp(m: &[u8]) -> RmppRepr {
        RmppRepr::parse(&RmppHeader::new_unchecked(&m[24..36])).expect("12 bytes")
    }

    #[test]
    fn segments_follow_the_iba_layout() {
        for (n, segs) in [
            (0usize, 1u32),
            (1, 1),
            (3, 1),
            (4, 2),
            (25, 8),
            (38, 13),
            (276, 89),
        ] {
            let mad = response(n);
            let s = segments(&mad);
            assert_eq!(s.len() as u32, segs, "{n} records");
            assert_eq!(segment_count(64 * n), segs);
            let data = 64 * n;
            for (i, m) in s.iter().enumerate() {
                let k = i as u32 + 1;
                let r = rmpp(m);
                assert_eq!((r.version, r.rmpp_type, r.status), (1, RmppType::Data, 0));
                assert_eq!(r.resp_time, 0x1f);
                assert_eq!(r.seg_num, k);
                let mut flags = RMPP_FLAG_ACTIVE;
                if k == 1 {
                    flags |= RMPP_FLAG_FIRST;
                }
                if k == segs {
                    flags |= RMPP_FLAG_LAST;
                }
                assert_eq!(r.flags, flags, "segment {k} of {segs}");
                let want_len = if k == segs {
                    20 + (data - 200 * (segs as usize - 1)) as u32
                } else if k == 1 {
                    20 * segs + data as u32
                } else {
                    0
                };
                assert_eq!(r.paylen_newwin, want_len, "segment {k} of {segs}");
                // MAD and SA headers copied, records in order, the last one zero-padded.
                assert_eq!(&m[..24], &mad[..24]);
                assert_eq!(&m[36..56], &mad[36..56]);
                let from = 56 + 200 * i;
                let to = (from + 200).min(mad.len());
                assert_eq!(&m[56..56 + (to - from)], &mad[from..to]);
                assert!(m[56 + (to - from)..].iter().all(|b| *b == 0));
            }
            if segs > 1 {
                // The receiver's rule: segments = ceil(PayloadLength / 220).
                assert_eq!(rmpp(&s[0]).paylen_newwin.div_ceil(220), segs);
            }
        }
    }

    /// Runs a transfer of `n` records into a receiver of `cap` bytes, window `window`, with
    /// `lose(k)` dropping the k-th segment delivery; returns (ending, receiver, sends).
    fn run(
        n: usize,
        cap: usize,
        window: u32,
        mut lose: impl FnMut(u32) -> bool,
    ) -> (End, Receiver<Vec<u8>>, u32) {
        let cfg = Config {
            window,
            ..Config::DEFAULT
        };
        let mut rx = Receiver::new(vec![0u8; cap], cfg);
        let mut now = 0u64;
        rx.start(now, TID);
        let (mut tx, first) = Transfer::start(now, &response(n), Timers::DEFAULT);
        let mut wire: Vec<[u8; MAD_LEN]> = first.send;
        let mut deliveries = 0u32;
        let mut sends = wire.len() as u32;
        for _ in 0..10_000 {
            if let Some(end) = tx.ended() {
                // Drain what the receiver still says; it must not start anything.
                return (end, rx, sends);
            }
            for m in std::mem::take(&mut wire) {
                deliveries += 1;
                if lose(deliveries) {
                    continue;
                }
                let _ = rx.handle_receive(now, &m);
                while let Some(out) = rx.poll_transmit() {
                    let (k, s, w, st) = receiver_control(&out).expect("an ACK/STOP/ABORT");
                    let step = tx.on_control(now, k, s, w, st);
                    sends += step.send.len() as u32;
                    wire.extend(step.send);
                }
            }
            if wire.is_empty() {
                now = tx.deadline().unwrap_or(now + 1).max(now + 1);
                if let Some(t) = rx.poll_timeout() {
                    if t <= now {
                        rx.handle_timeout(now);
                        while let Some(out) = rx.poll_transmit() {
                            let (k, s, w, st) = receiver_control(&out).expect("control");
                            let step = tx.on_control(now, k, s, w, st);
                            wire.extend(step.send);
                        }
                    }
                }
                let step = tx.on_timeout(now);
                sends += step.send.len() as u32;
                wire.extend(step.send);
            }
        }
        panic!("transfer of {n} records did not end");
    }

    #[test]
    fn the_receiver_reassembles_every_size_exactly() {
        for n in [0usize, 1, 3, 4, 7, 38, 100, 276] {
            for window in [1, 2, 16] {
                let (end, rx, sends) = run(n, 64 * 300, window, |_| false);
                assert_eq!(end, End::Completed, "{n} records, window {window}");
                assert_eq!(rx.payload().expect("done"), &response(n)[56..]);
                assert_eq!(sends, segment_count(64 * n), "no resends on a clean wire");
            }
        }
    }

    #[test]
    fn lost_segments_are_sent_again_from_the_last_ack() {
        // Pseudo-random loss (a periodic pattern whose period divides the go-back window
        // would lose the same segment every round, for any sender).
        let mut extra = 0;
        for seed in 1..=40u64 {
            let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let rate = 5 + seed % 25; // 5..29 % of the segments
            let (end, rx, sends) = run(100, 64 * 100, 16, |_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % 100 < rate
            });
            assert_eq!(end, End::Completed, "seed {seed}, {rate} % lost");
            assert_eq!(rx.payload().expect("done"), &response(100)[56..]);
            extra += sends - segment_count(6400);
        }
        assert!(extra > 100, "go-back resent segments ({extra})");
    }

    #[test]
    fn stop_ends_the_transfer_and_nothing_more_is_sent() {
        let (end, rx, _) = run(100, 64 * 10, 16, |_| false);
        assert_eq!(end, End::Stopped(1));
        assert!(matches!(
            rx.state(),
            acm_core_nostd::rmpp::State::Failed(Failure::TooBig { .. })
        ));
    }

    #[test]
    fn silence_resends_then_aborts_with_too_many_retries() {
        let (mut tx, s) = Transfer::start(0, &response(38), Timers::DEFAULT);
        assert_eq!(s.send.len(), 1);
        let mut now = 0;
        for k in 1..=Timers::DEFAULT.retries {
            now = tx.deadline().expect("running");
            assert_eq!(now, 200 * u64::from(k));
            let s = tx.on_timeout(now);
            assert_eq!((s.send.len(), s.resent), (1, 1), "segment 1 again");
            assert_eq!(rmpp(&s.send[0]).seg_num, 1);
        }
        let s = tx.on_timeout(tx.deadline().expect("running"));
        assert!(now > 0);
        assert_eq!(s.end, Some(End::Aborted(126)));
        let a = rmpp(&s.send[0]);
        assert_eq!((a.rmpp_type, a.status, a.flags), (RmppType::Abort, 126, 1));
        assert_eq!(s.send[0][3], 0x92, "an ABORT from the sender is a response");
        assert_eq!(tx.deadline(), None);
    }

    #[test]
    fn bad_acks_are_aborted_and_old_ones_ignored() {
        let (mut tx, _) = Transfer::start(0, &response(38), Timers::DEFAULT);
        let s = tx.on_control(1, RmppType::Ack, 1, 4, 0);
        assert_eq!(s.send.len(), 3, "window 4: segments 2..=4");
        let s = tx.on_control(2, RmppType::Ack, 0, 4, 0);
        assert!(s.stale_ack && s.send.is_empty());
        let s = tx.on_control(3, RmppType::Ack, 1, 4, 0);
        assert!(
            s.stale_ack && s.send.is_empty(),
            "a repeated ACK sends nothing"
        );
        let s = tx.on_control(4, RmppType::Ack, 5, 8, 0);
        assert_eq!(s.end, Some(End::Aborted(123)), "segment 5 was never sent");
        let (mut tx, _) = Transfer::start(0, &response(38), Timers::DEFAULT);
        let s = tx.on_control(1, RmppType::Ack, 1, 0, 0);
        assert_eq!(s.end, Some(End::Aborted(122)));
        let (mut tx, _) = Transfer::start(0, &response(38), Timers::DEFAULT);
        let s = tx.on_control(1, RmppType::Abort, 0, 0, 118);
        assert_eq!(
            (s.end, s.send.len()),
            (Some(End::AbortedByReceiver(118)), 0)
        );
    }

    #[test]
    fn the_total_time_aborts_even_while_acks_trickle_in() {
        let (mut tx, _) = Transfer::start(0, &response(276), Timers::DEFAULT);
        let mut now = 0;
        let mut seg = 1;
        while tx.ended().is_none() {
            now += 150;
            let s = tx.on_control(now, RmppType::Ack, seg, seg + 1, 0);
            assert_eq!(s.end, None, "{seg} of 89");
            seg += 1;
            let s = tx.on_timeout(now);
            if now < 10_000 {
                assert!(s.send.is_empty() && s.end.is_none(), "not due at {now}");
            } else {
                assert_eq!(s.end, Some(End::Aborted(118)));
            }
        }
        assert_eq!(tx.ended(), Some(End::Aborted(118)));
    }

    #[test]
    fn only_receiver_control_mads_are_taken() {
        let seg = segments(&response(10))[0];
        assert!(receiver_control(&seg).is_none(), "DATA");
        assert!(is_rmpp_response(&response(10)));
        let mut ack = seg;
        ack[3] = 0x12;
        ack[25] = 2;
        ack[32..36].copy_from_slice(&3u32.to_be_bytes());
        assert_eq!(receiver_control(&ack), Some((RmppType::Ack, 1, 3, 0)));
        ack[26] = 0;
        assert!(receiver_control(&ack).is_none(), "not Active");
        ack[26] = 1;
        ack[1] = 0x81;
        assert!(receiver_control(&ack).is_none(), "not SA");
        let mut req = response(0);
        req[3] = 0x12;
        req[26] = 0;
        assert!(!is_rmpp_response(&req));
    }
}
