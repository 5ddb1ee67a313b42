//! The receiving side of one RMPP transfer (IBA 13.6), sans-IO: how a multi-segment SA answer
//! (a GetTable response) is taken in, acknowledged and put back together, into storage the
//! caller owns. The caller only moves bytes: it hands every MAD of the transfer to
//! [`Receiver::handle_receive`], sends whatever [`Receiver::poll_transmit`] returns, and calls
//! [`Receiver::handle_timeout`] when [`Receiver::poll_timeout`] says so.
//!
//! * **Reassembly.** Each DATA segment carries the MAD header, the RMPP header, the 20-byte SA
//!   header and up to 200 bytes of records. The first segment's PayloadLength is the length of
//!   the whole transfer counted as the RMPP layer counts it: 220 bytes (SA header + data) per
//!   segment, less the pad of the last, so `records = PayloadLength − 20 × segments`. The
//!   records go to the caller's storage back to back, with the SA headers left out; the first
//!   segment's 56-byte header (its AttributeOffset, its status) is kept ([`Receiver::header`]).
//!   A first PayloadLength of 0 means "not given": the LAST segment then says where it ends.
//! * **ACKs, go-back-N.** Segments are taken only in order. After the first segment, when the
//!   segment that ends the granted window arrives, and on the LAST segment, the receiver sends
//!   an ACK whose SegmentNumber is the last segment received in order and whose NewWindowLast
//!   grants [`Config::window`] more segments (never past the last segment of the transfer, or,
//!   when its length was not given, past what the storage holds). The ACK of the LAST segment
//!   completes the transfer. A duplicate of an earlier segment, and a segment beyond the next
//!   expected one (which is dropped), are answered with an ACK of where the receiver stands
//!   (the same window), so a sender whose ACK was lost, or who lost a segment, learns where to
//!   go back to.
//! * **Timers.** Virtual time is passed in. If no segment arrives within
//!   [`Config::resp_timeout`], the last ACK is sent again; [`Config::total_timeout`] after the
//!   first segment the transfer is aborted (ABORT, status 118 "total time too long"). While no
//!   segment has arrived yet, `total_timeout` from [`Receiver::start`] ends the wait (nothing is
//!   sent then: no transfer has begun, and re-sending the request is the SA channel's job).
//! * **Ending early.** An ABORT or STOP from the sender ends the transfer with its status. A
//!   segment that breaks the protocol is answered with an ABORT naming the rule (bad version
//!   125, bad RMPPType 121, First flag and SegmentNumber inconsistent 120, Last flag and
//!   PayloadLength inconsistent 119, a non-zero status in DATA 124).
//! * **Too big.** When the announced length does not fit the storage, the receiver sends
//!   **STOP** with status 1 ("resources exhausted") and reports [`Failure::TooBig`] with the
//!   records it would have needed. STOP, not ABORT: IBA gives the receiver STOP for "I cannot
//!   take this", and status 1 is the only status defined for it; the ABORT statuses (118-127)
//!   all name protocol errors, none of which happened. Nothing is written to the storage.
//!
//! One [`Receiver`] follows one transfer, named by its TID. Several transfers at once are a
//! slice of receivers, each with its own storage: the SA channel already finds the outstanding
//! request of a reply by its TID and can hand the MAD to that request's receiver, so a table
//! of transfers here would only repeat that lookup, and storage sized per transfer lets a
//! caller give a big half-world answer more room than a small one.

use core::ops::DerefMut;

use crate::resolver::Millis;
use crate::wire::mad::{
    Header, MadStatus, Method, MgmtClass, RmppHeader, RmppRepr, RmppStatus, RmppType, BASE_VERSION,
    HEADER_LEN, MAD_LEN, METHOD_RESP, RMPP_FLAG_ACTIVE, RMPP_FLAG_FIRST, RMPP_FLAG_LAST, RMPP_LEN,
    RMPP_NO_RESP_TIME, RMPP_VERSION,
};
use crate::wire::sa::{SaPacket, DATA_LEN, DATA_OFFSET};

/// Length of the SA header that follows the RMPP header in every segment (SM_Key,
/// AttributeOffset, reserved, ComponentMask).
pub const SA_HEADER_LEN: usize = DATA_OFFSET - HEADER_LEN - RMPP_LEN;
/// Records per segment: the SA data area.
pub const SEGMENT_DATA_LEN: usize = DATA_LEN;
/// What PayloadLength counts per full segment: the SA header and the data (220,
/// `UMAD_LEN_RMPP_DATA`).
pub const SEGMENT_PAYLOAD_LEN: u32 = (SA_HEADER_LEN + SEGMENT_DATA_LEN) as u32;

/// Segments a sender cuts `record_bytes` bytes of records into (at least 1: an empty table is
/// one segment).
pub fn segment_count(record_bytes: usize) -> u32 {
    record_bytes.div_ceil(SEGMENT_DATA_LEN).max(1) as u32
}

/// DATA segment `n` (1-based, up to [`segment_count`]) of an SA answer whose records are
/// `records`, as a sender (the kernel MAD layer, for OpenSM) cuts it: `head`'s MAD and SA
/// headers (TID, method, AttributeOffset, ComponentMask), an RMPP header with Active, First on
/// segment 1 with the whole PayloadLength (220 per segment less the last's pad), Last on the
/// last with its own, and that segment's 200 bytes of records (the last zero-padded). `None`
/// for a segment number out of range. For simulated SAs and tests; our requests are single
/// MADs.
pub fn segment(head: &[u8; DATA_OFFSET], records: &[u8], n: u32) -> Option<[u8; MAD_LEN]> {
    let total = segment_count(records.len());
    if n == 0 || n > total {
        return None;
    }
    let from = (n as usize - 1) * SEGMENT_DATA_LEN;
    let chunk = &records[from.min(records.len())..(from + SEGMENT_DATA_LEN).min(records.len())];
    let mut flags = RMPP_FLAG_ACTIVE;
    let mut paylen = 0;
    if n == 1 {
        flags |= RMPP_FLAG_FIRST;
        paylen = total * SA_HEADER_LEN as u32 + records.len() as u32;
    }
    if n == total {
        flags |= RMPP_FLAG_LAST;
        paylen = (SA_HEADER_LEN + chunk.len()) as u32;
    }
    let mut m = [0u8; MAD_LEN];
    m[..DATA_OFFSET].copy_from_slice(head);
    RmppRepr {
        version: RMPP_VERSION,
        rmpp_type: RmppType::Data,
        resp_time: RMPP_NO_RESP_TIME,
        flags,
        status: 0,
        seg_num: n,
        paylen_newwin: paylen,
    }
    .emit(&mut RmppHeader::new_unchecked(
        &mut m[HEADER_LEN..HEADER_LEN + RMPP_LEN],
    ));
    m[DATA_OFFSET..DATA_OFFSET + chunk.len()].copy_from_slice(chunk);
    Some(m)
}

/// How a [`Receiver`] paces the sender and when it gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Segments granted by each ACK beyond the last one received (at least 1). The caller's QP
    /// must have this many receives posted, or a window's tail is lost and re-sent.
    pub window: u32,
    /// Silence (no DATA segment) after which the last ACK is sent again, in ms.
    /// (At least 1: a zero would have the ACK re-sent at every call of the same instant.)
    pub resp_timeout: Millis,
    /// Time from the first segment to the end of the transfer, in ms; also how long
    /// [`Receiver::start`] waits for the first segment.
    pub total_timeout: Millis,
    /// RRespTime written into the ACK, STOP and ABORT MADs (5 bits; 0x1F: none given).
    pub resp_time_code: u8,
}

impl Config {
    /// Window 16 (OpenSM's own RMPP receiver, `OSMV_RMPP_RECV_WIN`), 200 ms of silence before an
    /// ACK is re-sent (OpenSM's transaction timeout), 10 s for the whole transfer, no RRespTime.
    pub const DEFAULT: Config = Config {
        window: 16,
        resp_timeout: 200,
        total_timeout: 10_000,
        resp_time_code: RMPP_NO_RESP_TIME,
    };
}

impl Default for Config {
    fn default() -> Self {
        Config::DEFAULT
    }
}

/// Why a transfer ended without its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The sender sent ABORT with this RMPPStatus.
    AbortedBySender(RmppStatus),
    /// The sender sent STOP with this RMPPStatus.
    StoppedBySender(RmppStatus),
    /// A segment broke the protocol; an ABORT with this status was sent.
    Protocol(RmppStatus),
    /// The total time ran out: an ABORT (status 118) was sent if a segment had arrived.
    TimedOut,
    /// The transfer does not fit the storage; a STOP (status 1) was sent.
    TooBig {
        /// The first segment's PayloadLength (0: not given, the storage ran out on the way).
        payload_len: u32,
        /// Bytes of records announced (`None` when PayloadLength was not given).
        record_bytes: Option<u32>,
        /// Records that would have been needed (`None` when the length or the record size,
        /// AttributeOffset, is not known).
        records_needed: Option<u32>,
        /// The storage, in bytes.
        capacity: usize,
    },
    /// The answer came as one MAD without RMPP (OpenSM answers a GetTable it cannot serve
    /// with a plain error MAD): its status. Nothing was sent.
    NotRmpp(MadStatus),
}

/// Why a MAD changed nothing ([`Progress::Ignored`]). Only the re-sends below queue a MAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// Shorter than a MAD.
    Truncated,
    /// The receiver is not following a transfer ([`Receiver::start`] not called).
    NotListening,
    /// Another transfer's TID.
    OtherTid,
    /// Not an SA MAD of base version 1.
    NotSa,
    /// Not a response (no R bit): a sender's MADs are responses.
    NotResponse,
    /// A DATA segment after 1 before segment 1 arrived (there is nothing to acknowledge yet).
    BeforeFirst,
    /// A segment received before: an ACK of where the receiver stands is queued.
    Duplicate,
    /// A segment beyond the next expected one, dropped: an ACK of where the receiver stands is
    /// queued.
    OutOfOrder,
    /// An ACK: we send none, so there is nothing for it to acknowledge.
    UnexpectedAck,
    /// A MAD without the RMPP Active flag in the middle of a transfer.
    NotRmpp,
    /// The transfer has ended; a DATA segment gets the last ACK, STOP or ABORT again.
    Finished,
}

/// What [`Receiver::handle_receive`] made of a MAD. Whatever it is, a MAD may be waiting in
/// [`Receiver::poll_transmit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// A segment taken in order; the transfer goes on.
    Accepted {
        /// Its SegmentNumber.
        segment: u32,
    },
    /// The LAST segment: the records are [`Receiver::payload`], `len` bytes.
    Done {
        /// Bytes of records.
        len: usize,
    },
    /// The transfer ended without its data.
    Failed(Failure),
    /// Nothing changed.
    Ignored(Ignored),
}

/// Where a [`Receiver`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Following nothing.
    Idle,
    /// Started, segment 1 not yet here.
    WaitingFirst,
    /// Segments coming in.
    Receiving,
    /// All segments in: `len` bytes of records.
    Done {
        /// Bytes of records.
        len: usize,
    },
    /// Ended without its data.
    Failed(Failure),
}

/// Counters of one receiver (they add up over transfers; [`Receiver::start`] keeps them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// DATA segments taken in order.
    pub accepted: u64,
    /// Duplicates of segments already taken.
    pub duplicates: u64,
    /// Segments beyond the next expected one (dropped).
    pub out_of_order: u64,
    /// Segments that broke the protocol (each ended its transfer with an ABORT).
    pub malformed: u64,
    /// Other MADs that changed nothing (wrong TID, truncated, not SA, ...).
    pub ignored: u64,
    /// ACKs queued, first sends and re-sends.
    pub acks: u64,
    /// ACKs re-sent because the sender fell silent.
    pub ack_timeouts: u64,
}

/// The receiver of one RMPP transfer over caller storage `S` (see the module docs).
pub struct Receiver<S: DerefMut<Target = [u8]>> {
    storage: S,
    config: Config,
    state: State,
    tid: u64,
    /// The first segment's MAD, RMPP and SA headers: what our ACK/STOP/ABORT are built from.
    head: [u8; DATA_OFFSET],
    /// Whether segment 1 has arrived (and `head` is its header).
    begun: bool,
    /// The first segment's PayloadLength (0: not given).
    payload_len: u32,
    /// Segments of the transfer (0: not known).
    total_segments: u32,
    /// Bytes of records announced (valid when `total_segments` > 0).
    record_bytes: usize,
    /// Last segment received in order (0: none).
    last: u32,
    /// NewWindowLast granted so far (1 before the first ACK: the sender's initial window).
    window_last: u32,
    resp_deadline: Millis,
    total_deadline: Millis,
    /// The last ACK, STOP or ABORT built (valid when `has_reply`), and whether it still has to
    /// go out (`reply_to_send`).
    reply: [u8; MAD_LEN],
    has_reply: bool,
    reply_to_send: bool,
    /// What happened so far.
    pub counters: Counters,
}

impl<S: DerefMut<Target = [u8]>> Receiver<S> {
    /// An idle receiver that reassembles into `storage` (its length is the biggest transfer,
    /// in bytes of records, it takes).
    pub fn new(storage: S, config: Config) -> Self {
        Receiver {
            storage,
            config,
            state: State::Idle,
            tid: 0,
            head: [0; DATA_OFFSET],
            begun: false,
            payload_len: 0,
            total_segments: 0,
            record_bytes: 0,
            last: 0,
            window_last: 1,
            resp_deadline: 0,
            total_deadline: 0,
            reply: [0; MAD_LEN],
            has_reply: false,
            reply_to_send: false,
            counters: Counters::default(),
        }
    }

    /// Follows the transfer that answers the request with wire TID `tid`, sent at `now`: call
    /// it when the request (a GetTable) leaves. Forgets any earlier transfer.
    pub fn start(&mut self, now: Millis, tid: u64) {
        self.state = State::WaitingFirst;
        self.tid = tid;
        self.head = [0; DATA_OFFSET];
        self.begun = false;
        self.payload_len = 0;
        self.total_segments = 0;
        self.record_bytes = 0;
        self.last = 0;
        self.window_last = 1;
        self.resp_deadline = Millis::MAX;
        self.total_deadline = now.saturating_add(self.config.total_timeout);
        self.has_reply = false;
        self.reply_to_send = false;
    }

    /// Stops following the transfer (nothing is sent; the storage keeps its bytes).
    pub fn reset(&mut self) {
        self.state = State::Idle;
        self.has_reply = false;
        self.reply_to_send = false;
    }

    /// Where the receiver is.
    pub fn state(&self) -> State {
        self.state
    }

    /// The TID followed (meaningful after [`start`](Self::start)).
    pub fn tid(&self) -> u64 {
        self.tid
    }

    /// Bytes of records the storage holds at most.
    pub fn capacity(&self) -> usize {
        self.storage.len()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The reassembled records once [`State::Done`].
    pub fn payload(&self) -> Option<&[u8]> {
        match self.state {
            State::Done { len } => self.storage.get(..len),
            _ => None,
        }
    }

    /// The first segment's MAD, RMPP and SA headers (AttributeOffset at 44, in 8-byte words),
    /// once it has arrived.
    pub fn header(&self) -> Option<&[u8; DATA_OFFSET]> {
        (self.begun && self.state != State::Idle).then_some(&self.head)
    }

    /// The MAD to send to the sender (an ACK, STOP or ABORT), if one is waiting. Call it after
    /// every [`handle_receive`](Self::handle_receive) and [`handle_timeout`](Self::handle_timeout); only the
    /// newest is kept (an ACK says everything an older one said).
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<[u8; MAD_LEN]> {
        if self.reply_to_send && self.has_reply {
            self.reply_to_send = false;
            Some(self.reply)
        } else {
            None
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) has work, if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        match self.state {
            State::WaitingFirst => Some(self.total_deadline),
            State::Receiving => Some(self.resp_deadline.min(self.total_deadline)),
            _ => None,
        }
    }

    /// Runs the timers due at `now`: sends the ACK again after a silence, or ends the
    /// transfer when its total time is up (the failure is returned).
    pub fn handle_timeout(&mut self, now: Millis) -> Option<Failure> {
        match self.state {
            State::WaitingFirst if now >= self.total_deadline => {
                self.state = State::Failed(Failure::TimedOut);
                Some(Failure::TimedOut)
            }
            State::Receiving if now >= self.total_deadline => {
                self.nak(RmppType::Abort, RmppStatus::TotalTimeTooLong);
                self.state = State::Failed(Failure::TimedOut);
                Some(Failure::TimedOut)
            }
            State::Receiving if now >= self.resp_deadline => {
                self.counters.ack_timeouts += 1;
                self.ack();
                self.resp_deadline = now.saturating_add(self.config.resp_timeout.max(1));
                None
            }
            _ => None,
        }
    }

    /// Takes a MAD received at `now` that may belong to the transfer (any length; a MAD is 256
    /// bytes). Then call [`poll_transmit`](Self::poll_transmit).
    pub fn handle_receive(&mut self, now: Millis, mad: &[u8]) -> Progress {
        let Some(mad) = mad
            .get(..MAD_LEN)
            .and_then(|m| <&[u8; MAD_LEN]>::try_from(m).ok())
        else {
            return self.ignore(Ignored::Truncated);
        };
        if self.state == State::Idle {
            return self.ignore(Ignored::NotListening);
        }
        let head = Header::new_unchecked(&mad[..HEADER_LEN]);
        if head.tid() != self.tid {
            return self.ignore(Ignored::OtherTid);
        }
        if head.base_version() != BASE_VERSION || head.mgmt_class() != MgmtClass::SubnAdm {
            return self.ignore(Ignored::NotSa);
        }
        if !head.method().is_response() {
            return self.ignore(Ignored::NotResponse);
        }
        let rmpp = RmppHeader::new_unchecked(&mad[HEADER_LEN..HEADER_LEN + RMPP_LEN]);
        let active = rmpp.flags() & RMPP_FLAG_ACTIVE != 0;
        match self.state {
            State::Done { .. } | State::Failed(_) => {
                // The sender missed our last word (its ACK, STOP or ABORT was lost): say it again.
                if active && rmpp.rmpp_type() == RmppType::Data && self.has_reply {
                    self.counters.acks += u64::from(self.reply_is_ack());
                    self.reply_to_send = true;
                }
                return self.ignore(Ignored::Finished);
            }
            State::WaitingFirst => {
                // Our ABORT for a bad first segment is built from that segment's header.
                self.head.copy_from_slice(&mad[..DATA_OFFSET]);
            }
            State::Idle | State::Receiving => {}
        }
        if !active {
            if self.state == State::WaitingFirst {
                let f = Failure::NotRmpp(head.status());
                self.state = State::Failed(f);
                return Progress::Failed(f);
            }
            return self.ignore(Ignored::NotRmpp);
        }
        if rmpp.version() != RMPP_VERSION {
            return self.abort(RmppStatus::UnsupportedVersion);
        }
        match rmpp.rmpp_type() {
            RmppType::Data => self.data(now, mad),
            RmppType::Ack => self.ignore(Ignored::UnexpectedAck),
            RmppType::Stop => self.end(Failure::StoppedBySender(rmpp.status().into())),
            RmppType::Abort => self.end(Failure::AbortedBySender(rmpp.status().into())),
            RmppType::None | RmppType::Unknown(_) => self.abort(RmppStatus::BadRmppType),
        }
    }

    fn data(&mut self, now: Millis, mad: &[u8; MAD_LEN]) -> Progress {
        let rmpp = RmppHeader::new_unchecked(&mad[HEADER_LEN..HEADER_LEN + RMPP_LEN]);
        let seg = rmpp.seg_num();
        let first = rmpp.flags() & RMPP_FLAG_FIRST != 0;
        let last_flag = rmpp.flags() & RMPP_FLAG_LAST != 0;
        let paylen = rmpp.paylen_newwin();
        if rmpp.status() != 0 {
            return self.abort(RmppStatus::IllegalStatus);
        }
        if first != (seg == 1) {
            return self.abort(RmppStatus::InconsistentFirstAndSegmentNumber);
        }
        if self.state == State::WaitingFirst {
            if seg != 1 {
                return self.ignore(Ignored::BeforeFirst);
            }
            if let Some(r) = self.begin(now, paylen) {
                return r;
            }
        }
        // Go-back-N: only the next segment in order is taken.
        if seg <= self.last {
            self.counters.duplicates += 1;
            self.ack();
            return Progress::Ignored(Ignored::Duplicate);
        }
        if Some(seg) != self.last.checked_add(1) {
            self.counters.out_of_order += 1;
            self.ack();
            return Progress::Ignored(Ignored::OutOfOrder);
        }
        let known = self.total_segments > 0;
        // Where this segment's records go: (seg - 1) × 200, checked (seg is ≤ 2^32).
        let Some(offset) = usize::try_from(seg - 1)
            .ok()
            .and_then(|s| s.checked_mul(SEGMENT_DATA_LEN))
        else {
            return self.too_big();
        };
        let len = if last_flag {
            let Some(len) = paylen
                .checked_sub(SA_HEADER_LEN as u32)
                .filter(|l| *l as usize <= SEGMENT_DATA_LEN)
            else {
                return self.abort(RmppStatus::InconsistentLastAndPayloadLength);
            };
            let len = len as usize;
            if known
                && (seg != self.total_segments
                    || offset.checked_add(len) != Some(self.record_bytes))
            {
                return self.abort(RmppStatus::InconsistentLastAndPayloadLength);
            }
            len
        } else {
            if known && seg >= self.total_segments {
                return self.abort(RmppStatus::InconsistentLastAndPayloadLength);
            }
            SEGMENT_DATA_LEN
        };
        let end = match offset.checked_add(len) {
            Some(end) if end <= self.storage.len() => end,
            _ => return self.too_big(),
        };
        if !known && !last_flag && end >= self.storage.len() {
            // More is coming and the storage is full.
            return self.too_big();
        }
        let (Some(dst), Some(src)) = (
            self.storage.get_mut(offset..end),
            mad.get(DATA_OFFSET..DATA_OFFSET + len),
        ) else {
            return self.too_big();
        };
        dst.copy_from_slice(src);
        self.counters.accepted += 1;
        self.last = seg;
        self.resp_deadline = now.saturating_add(self.config.resp_timeout.max(1));
        if last_flag {
            self.ack();
            self.state = State::Done { len: end };
            return Progress::Done { len: end };
        }
        if seg >= self.window_last {
            self.window_last = seg
                .saturating_add(self.config.window.max(1))
                .min(self.window_cap());
            self.ack();
        }
        Progress::Accepted { segment: seg }
    }

    /// Takes the first segment's PayloadLength: `Some` when the transfer ends here.
    fn begin(&mut self, now: Millis, paylen: u32) -> Option<Progress> {
        self.begun = true;
        self.payload_len = paylen;
        self.state = State::Receiving;
        self.total_deadline = now.saturating_add(self.config.total_timeout);
        if paylen == 0 {
            return None;
        }
        let segments = paylen.div_ceil(SEGMENT_PAYLOAD_LEN);
        let Some(bytes) = segments
            .checked_mul(SA_HEADER_LEN as u32)
            .and_then(|h| paylen.checked_sub(h))
        else {
            return Some(self.abort(RmppStatus::InconsistentLastAndPayloadLength));
        };
        self.total_segments = segments;
        match usize::try_from(bytes) {
            Ok(b) if b <= self.storage.len() => {
                self.record_bytes = b;
                None
            }
            _ => Some(self.stop_too_big(Some(bytes))),
        }
    }

    /// The last NewWindowLast that may be granted: the last segment, or when the length was not
    /// given, the segments the storage holds.
    fn window_cap(&self) -> u32 {
        if self.total_segments > 0 {
            self.total_segments
        } else {
            let segs = self.storage.len().div_ceil(SEGMENT_DATA_LEN).max(1);
            u32::try_from(segs).unwrap_or(u32::MAX)
        }
    }

    fn ignore(&mut self, why: Ignored) -> Progress {
        self.counters.ignored += 1;
        Progress::Ignored(why)
    }

    fn end(&mut self, f: Failure) -> Progress {
        self.state = State::Failed(f);
        self.has_reply = false;
        self.reply_to_send = false;
        Progress::Failed(f)
    }

    fn abort(&mut self, status: RmppStatus) -> Progress {
        self.counters.malformed += 1;
        self.nak(RmppType::Abort, status);
        let f = Failure::Protocol(status);
        self.state = State::Failed(f);
        Progress::Failed(f)
    }

    fn too_big(&mut self) -> Progress {
        let record_bytes =
            (self.total_segments > 0).then(|| u32::try_from(self.record_bytes).unwrap_or(u32::MAX));
        self.stop_too_big(record_bytes)
    }

    fn stop_too_big(&mut self, record_bytes: Option<u32>) -> Progress {
        self.nak(RmppType::Stop, RmppStatus::ResourcesExhausted);
        let words = SaPacket::new_unchecked(&self.head[..]).attr_offset();
        let record_len = u32::from(words) * 8;
        let records_needed = record_bytes
            .zip((record_len > 0).then_some(record_len))
            .map(|(b, r)| b.div_ceil(r));
        let f = Failure::TooBig {
            payload_len: self.payload_len,
            record_bytes,
            records_needed,
            capacity: self.storage.len(),
        };
        self.state = State::Failed(f);
        Progress::Failed(f)
    }

    fn reply_is_ack(&self) -> bool {
        RmppHeader::new_unchecked(&self.reply[HEADER_LEN..HEADER_LEN + RMPP_LEN]).rmpp_type()
            == RmppType::Ack
    }

    /// Queues an ACK of the segments received in order, granting up to `window_last`.
    fn ack(&mut self) {
        let repr = RmppRepr::ack(self.resp_time(), self.last, self.window_last);
        self.counters.acks += 1;
        self.reply(repr);
    }

    /// Queues a STOP or ABORT.
    fn nak(&mut self, t: RmppType, status: RmppStatus) {
        let repr = RmppRepr::nak(self.resp_time(), t, status);
        self.reply(repr);
    }

    fn resp_time(&self) -> u8 {
        self.config.resp_time_code & 0x1f
    }

    /// Builds a MAD to the sender: the first segment's MAD and SA headers (as the sender's own
    /// headers, so the SA matches it by TID, class and attribute), the response bit cleared,
    /// status 0, the given RMPP header, data zero.
    fn reply(&mut self, rmpp: RmppRepr) {
        let mut m = [0u8; MAD_LEN];
        m[..DATA_OFFSET].copy_from_slice(&self.head);
        {
            let mut h = Header::new_unchecked(&mut m[..HEADER_LEN]);
            let method = u8::from(h.method()) & !METHOD_RESP;
            h.set_method(Method::from(method));
            h.set_status(MadStatus::SUCCESS);
        }
        rmpp.emit(&mut RmppHeader::new_unchecked(
            &mut m[HEADER_LEN..HEADER_LEN + RMPP_LEN],
        ));
        self.reply = m;
        self.has_reply = true;
        self.reply_to_send = true;
    }
}
