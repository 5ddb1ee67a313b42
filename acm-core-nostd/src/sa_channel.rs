//! The SA channel of a UD QP, sans-IO: what the kernel MAD layer does for a umad agent, done
//! for the resolver's `SendSa` outputs when they leave on a QP of our own (the `ud` transport
//! of `acmrs_sa_transport`; composed with the resolver by [`crate::node::Node`]). The caller
//! only moves bytes: it sends what [`SaChannel::start`] and [`SaChannel::poll_transmit`]
//! return and hands every class 3 MAD it receives to [`SaChannel::handle_receive`], which says what
//! the MAD is.
//!
//! * **One completion per request.** The channel owns each request until it is answered: it
//!   sends the same MAD (same wire TID) again after each try's time, `tries` tries in all, then
//!   reports the query failed ([`Expired::Failed`], complete it with [`TIMED_OUT`]). A
//!   response we send (a ReportResponse) needs no answer and is not tracked. When the QP that
//!   carried a request closes, the request goes again at once on whatever carries it now
//!   ([`SaChannel::handle_carrier_gone`]), or leaves the channel to go on another way
//!   ([`SaChannel::withdraw`]: the core's service, which completes it instead).
//! * **Unpredictable TIDs.** Any host of the fabric can send a MAD to our QP, and a forged
//!   reply is taken only if it names an outstanding request's TID. Each request therefore gets
//!   a wire TID of its own, 64 bits of SipHash-1-3 under the caller's random key over a
//!   counter, unique among those outstanding; the resolver's token and TID stay in the table,
//!   and the reply handed back carries the resolver's TID again.
//! * **Only the SM speaks class 3 to us.** [`SaChannel::handle_receive`] takes a MAD only from the
//!   SM's LID and QP 1, and a reply only on the QP that carries the asking endpoint's SA
//!   traffic; anything else is [`Received::Forged`]. A reply whose TID matches nothing
//!   outstanding (a duplicate, a reply after the last try, a guess) is [`Received::Unknown`].
//!
//! * **GetTable answers over RMPP.** A GetTable request takes a free [`TableSlot`] (an
//!   [`rmpp::Receiver`] with the caller's storage) started with the request's wire TID. Its
//!   answer's segments go to that receiver ([`Received::Segment`]; send what
//!   [`SaChannel::poll_transmit`] returns: the ACKs, STOP or ABORT), and the request completes
//!   once, with the whole table ([`Received::Table`], read with [`SaChannel::table`]) or with
//!   the transfer's failure ([`Received::TableFailed`], [`Expired::TableFailed`]). The
//!   request's own tries re-send the GetTable only until its first segment arrives; from then
//!   on the receiver's timers own the transfer. A finished transfer stays in its slot until
//!   the slot is taken again, so a sender that missed our last ACK and sends its last segment
//!   again is answered.
//!
//! Storage is the caller's (`E`, a slice of [`SaEntry`]; `T`, a slice of [`TableSlot`]): the
//! channel never allocates. When it is full a request is refused at once ([`SaChannel::start`]
//! returns `None`; the caller fails the query), which cannot happen while it is larger than
//! the resolver's SA window plus its joins and subscriptions. A GetTable is refused the same
//! way when no table slot is free.

use core::ops::DerefMut;

use crate::resolver::{AcmDest, EpId, Millis, RecvMeta, SaTable, UnicastAv};
use crate::rmpp::{self, Failure, Receiver};
use crate::wire::gid::Gid;
pub use crate::wire::mad::TIMED_OUT;
use crate::wire::mad::{Header, Method, HEADER_LEN, MAD_LEN};
use crate::wire::mcmember::ACM_QKEY;
use siphasher::sip::SipHasher13;

/// Where a port's SA is: the SM's LID and SL (`ibv_port_attr.sm_lid` / `sm_sl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmAddr {
    /// SM LID (0 = no SM known).
    pub lid: u16,
    /// SL to reach it.
    pub sl: u8,
}

impl SmAddr {
    /// What the receive completion of a MAD from the SM's QP 1 says (no GRH: the SM is on the
    /// subnet; P_Key index 0).
    pub const fn recv_meta(&self) -> RecvMeta {
        RecvMeta {
            slid: self.lid,
            src_qp: 1,
            sl: self.sl,
            dlid_path_bits: 0,
            pkey_index: 0,
            ep_pkey_index: 0,
            grh_sgid: None,
        }
    }

    /// The address vector of the SM's QP1.
    pub fn dest(&self) -> AcmDest {
        AcmDest::Unicast(UnicastAv {
            dlid: self.lid,
            sl: self.sl,
            src_path_bits: 0,
            static_rate: 0,
            dgid: Gid::ZERO,
            flow_label: 0,
            hop_limit: 0,
            tclass: 0,
            remote_qpn: 1,
            remote_qkey: ACM_QKEY,
        })
    }
}

/// One outstanding request (storage for [`SaChannel`]).
#[derive(Clone, Copy)]
pub struct SaEntry {
    token: u64,
    /// The TID on the wire (see the module docs).
    tid: u64,
    /// The TID the resolver wrote into the MAD, put back into the reply it is handed.
    own_tid: u64,
    ep: EpId,
    deadline: Millis,
    per_try: Millis,
    tries_left: u32,
    /// Its try ran out and it waits in [`SaChannel::poll_transmit`] to go again.
    resend: bool,
    /// It ended without an answer and waits in [`SaChannel::poll_expired`].
    end: End,
    /// The table slot of a GetTable (index + 1; 0: not a GetTable).
    table: u8,
    mad: [u8; MAD_LEN],
}

impl SaEntry {
    /// An unused entry.
    pub const EMPTY: SaEntry = SaEntry {
        token: 0,
        tid: 0,
        own_tid: 0,
        ep: EpId(0),
        deadline: 0,
        per_try: 0,
        tries_left: 0,
        resend: false,
        end: End::Running,
        table: 0,
        mad: [0; MAD_LEN],
    };
}

/// How an outstanding request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// Its tries (or its transfer) go on.
    Running,
    /// Out of tries.
    OutOfTries,
    /// Its GetTable transfer failed.
    Table(Failure),
}

/// How soon a request whose MAD was not posted goes again, in ms ([`SaChannel::handle_unsent`]):
/// the next rounds of the caller's loop, once its QP's send completions have freed buffers.
pub const UNSENT_RETRY_MS: Millis = 1;

/// Most table slots a channel uses (the entry's slot number is a byte).
pub const MAX_TABLES: usize = 255;

/// The receiver of one GetTable answer (storage for [`SaChannel`]): an [`rmpp::Receiver`]
/// over `B`, whose length is the most bytes of records one answer may take.
pub struct TableSlot<B: DerefMut<Target = [u8]>> {
    rx: Receiver<B>,
    ep: EpId,
    /// Whether an outstanding request owns it.
    busy: bool,
}

impl<B: DerefMut<Target = [u8]>> TableSlot<B> {
    /// A free slot reassembling into `storage` as `config` says.
    pub fn new(storage: B, config: rmpp::Config) -> Self {
        TableSlot {
            rx: Receiver::new(storage, config),
            ep: EpId(0),
            busy: false,
        }
    }

    /// Its receiver (state, counters).
    pub fn receiver(&self) -> &Receiver<B> {
        &self.rx
    }
}

/// A request [`SaChannel::handle_timeout`] ended, out of tries or time ([`SaChannel::poll_expired`]).
/// (A request whose try ran out with tries left goes again through
/// [`SaChannel::poll_transmit`].)
// The MAD travels by value, as everywhere here (no allocator to box it in).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq, Eq)]
pub enum Expired {
    /// Out of tries: complete `token` with [`TIMED_OUT`] and this MAD.
    Failed {
        /// The resolver's token.
        token: u64,
        /// The MAD as sent.
        mad: [u8; MAD_LEN],
    },
    /// A GetTable's transfer ran out of time (the receiver sent its ABORT: poll
    /// [`SaChannel::poll_transmit`]): complete `token` as failed.
    TableFailed {
        /// The resolver's token.
        token: u64,
        /// Why.
        failure: Failure,
    },
}

/// A MAD for the caller to send ([`SaChannel::poll_transmit`]), as SA traffic of endpoint
/// `ep` (on the QP that carries that endpoint's SA MADs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaSend {
    /// The endpoint whose SA traffic it is.
    pub ep: EpId,
    /// The token of the request this is a try of (`None`: an RMPP ACK, STOP or ABORT).
    pub request: Option<u64>,
    /// The MAD.
    pub mad: [u8; MAD_LEN],
}

/// What a received class 3 MAD is ([`SaChannel::handle_receive`]).
// The reply travels by value, as the MAD does everywhere here (no allocator to box it in).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// The reply to the outstanding request `token` (no longer outstanding), with the TID the
    /// resolver gave its request put back.
    Reply {
        /// The resolver's token.
        token: u64,
        /// The reply.
        mad: [u8; MAD_LEN],
    },
    /// A segment of a GetTable answer still coming in (or one of a transfer already ended,
    /// which may need our last ACK again): send what [`SaChannel::poll_transmit`] returns.
    Segment,
    /// The GetTable `token` is answered: its whole table is in table slot `slot`
    /// ([`SaChannel::table`]) until the slot is taken again.
    Table {
        /// The resolver's token.
        token: u64,
        /// The table slot.
        slot: usize,
    },
    /// The GetTable `token`'s answer failed (a STOP or ABORT may be waiting in
    /// [`SaChannel::poll_transmit`]): complete it as failed.
    TableFailed {
        /// The resolver's token.
        token: u64,
        /// Why.
        failure: Failure,
    },
    /// A request from the SM (a Report): for the resolver's `handle_report`.
    Report,
    /// Not from the SM's LID and QP 1, or a reply on a QP that does not carry the asking
    /// endpoint's SA traffic: drop it (counted in [`SaChannel::forged`]).
    Forged,
    /// A reply from the SM that answers nothing outstanding (counted in
    /// [`SaChannel::unknown`]).
    Unknown,
}

/// Outstanding SA requests of every endpoint (see the module docs).
pub struct SaChannel<E, T, B>
where
    E: DerefMut<Target = [SaEntry]>,
    T: DerefMut<Target = [TableSlot<B>]>,
    B: DerefMut<Target = [u8]>,
{
    entries: E,
    tables: T,
    len: usize,
    /// Earliest deadline among the outstanding requests (a lower bound).
    next: Option<Millis>,
    /// Replies whose TID matched nothing outstanding.
    pub unknown: u64,
    /// MADs not from the SM, or replies on the wrong QP.
    pub forged: u64,
    /// Re-sends after a try timed out.
    pub resends: u64,
    /// Requests that ran out of tries.
    pub timeouts: u64,
    /// Requests whose MAD was not posted and went again soon ([`SaChannel::handle_unsent`]).
    pub unsent: u64,
    /// Requests whose carrier's QP closed under them and that went again at once
    /// ([`SaChannel::handle_carrier_gone`]).
    pub moved: u64,
    tids: SipHasher13,
    /// Requests numbered so far (the hashed counter).
    counter: u64,
    /// Entries waiting in `poll_transmit` to go again.
    resend_due: usize,
    /// Entries waiting in `poll_expired`.
    ended: usize,
}

impl<E, T, B> SaChannel<E, T, B>
where
    E: DerefMut<Target = [SaEntry]>,
    T: DerefMut<Target = [TableSlot<B>]>,
    B: DerefMut<Target = [u8]>,
{
    /// A channel holding at most `entries.len()` outstanding requests, of which at most
    /// `tables.len()` (up to [`MAX_TABLES`]) GetTables, whose wire TIDs are keyed by `key`
    /// (random, and secret from the fabric: e.g. from the OS's random source).
    pub fn new(entries: E, tables: T, key: [u64; 2]) -> Self {
        SaChannel {
            entries,
            tables,
            len: 0,
            next: None,
            unknown: 0,
            forged: 0,
            resends: 0,
            timeouts: 0,
            unsent: 0,
            moved: 0,
            tids: SipHasher13::new_with_keys(key[0], key[1]),
            counter: 0,
            resend_due: 0,
            ended: 0,
        }
    }

    /// Most requests it holds.
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// Requests outstanding.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// GetTables it can follow at once.
    pub fn table_capacity(&self) -> usize {
        self.tables.len().min(MAX_TABLES)
    }

    /// The table slots (their receivers' states and counters).
    pub fn table_slots(&self) -> &[TableSlot<B>] {
        &self.tables
    }

    /// The answer in table slot `slot` once [`Received::Table`] named it (until the slot is
    /// taken again).
    pub fn table(&self, slot: usize) -> Option<SaTable<'_>> {
        let rx = &self.tables.get(slot)?.rx;
        Some(SaTable {
            header: rx.header()?,
            records: rx.payload()?,
        })
    }

    /// Forgets every outstanding request (their tokens mean nothing any more) and starts the
    /// counters again; the TID key stays.
    pub fn clear(&mut self) {
        self.len = 0;
        self.next = None;
        self.resend_due = 0;
        self.ended = 0;
        for t in self.tables.iter_mut() {
            t.rx.reset();
            t.busy = false;
        }
    }

    /// The next MAD to send, as SA traffic of the endpoint it names (it goes to the SM like
    /// that endpoint's requests): an ACK, STOP or ABORT of a GetTable transfer, or a request
    /// whose try ran out ([`handle_timeout`](Self::handle_timeout)) or whose carrier closed
    /// ([`handle_carrier_gone`](Self::handle_carrier_gone)), the same bytes again.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<SaSend> {
        let acks = self.tables.iter_mut().find_map(|t| {
            t.rx.poll_transmit().map(|mad| SaSend {
                ep: t.ep,
                request: None,
                mad,
            })
        });
        if acks.is_some() || self.resend_due == 0 {
            return acks;
        }
        let n = self.len;
        let e = self.entries[..n].iter_mut().find(|e| e.resend)?;
        e.resend = false;
        self.resend_due -= 1;
        Some(SaSend {
            ep: e.ep,
            request: Some(e.token),
            mad: e.mad,
        })
    }

    /// The QP that carried endpoint `ep`'s SA MADs closed at `now`, and with it every try of
    /// `ep`'s requests in flight: each request goes again at once (through
    /// [`poll_transmit`](Self::poll_transmit), on whatever carries `ep` now), without
    /// spending a try, for a whole try's wait; a GetTable starts its answer again (the old
    /// transfer goes to the closed QP). Requests that already ended are left to
    /// [`poll_expired`](Self::poll_expired).
    pub fn handle_carrier_gone(&mut self, now: Millis, ep: EpId) {
        let n = self.len;
        for e in self.entries[..n].iter_mut() {
            if e.ep != ep || e.end != End::Running {
                continue;
            }
            if let Some(t) = usize::from(e.table).checked_sub(1) {
                let slot = &mut self.tables[t];
                slot.rx.reset();
                slot.rx.start(now, e.tid);
            }
            e.deadline = now.saturating_add(e.per_try);
            self.moved += 1;
            if !e.resend {
                e.resend = true;
                self.resend_due += 1;
            }
        }
        self.next = self.earliest_try();
    }

    /// Takes request `token` out of the channel (it goes on another way: through the core's
    /// SA service), with its MAD as the resolver wrote it (its own TID put back); `None` if
    /// it is not outstanding here.
    pub fn withdraw(&mut self, token: u64) -> Option<[u8; MAD_LEN]> {
        let i = self.live().iter().position(|e| e.token == token)?;
        let e = self.forget(i);
        if self.len == 0 {
            self.next = None;
        }
        let mut mad = e.mad;
        Header::new_unchecked(&mut mad[..HEADER_LEN]).set_tid(e.own_tid);
        Some(mad)
    }

    /// The next request [`handle_timeout`](Self::handle_timeout) ended (removed here): complete its token as
    /// failed.
    #[must_use]
    pub fn poll_expired(&mut self) -> Option<Expired> {
        if self.ended == 0 {
            return None;
        }
        let i = self.live().iter().position(|e| e.end != End::Running)?;
        let e = self.swap_remove(i);
        Some(match e.end {
            End::Table(failure) => Expired::TableFailed {
                token: e.token,
                failure,
            },
            _ => Expired::Failed {
                token: e.token,
                mad: e.mad,
            },
        })
    }

    /// The earliest try deadline among the outstanding requests (a GetTable whose answer has
    /// begun has none: `Millis::MAX`, its receiver's timers own it).
    fn earliest_try(&self) -> Option<Millis> {
        self.live()
            .iter()
            .map(|e| e.deadline)
            .filter(|d| *d != Millis::MAX)
            .min()
    }

    fn live(&self) -> &[SaEntry] {
        &self.entries[..self.len]
    }

    fn position(&self, tid: u64) -> Option<usize> {
        self.live().iter().position(|e| e.tid == tid)
    }

    /// Removes entry `i`, freeing its table slot (whose receiver keeps its last state).
    fn swap_remove(&mut self, i: usize) -> SaEntry {
        let e = self.entries[i];
        self.resend_due -= usize::from(e.resend);
        self.ended -= usize::from(e.end != End::Running);
        self.len -= 1;
        self.entries[i] = self.entries[self.len];
        if let Some(t) = usize::from(e.table).checked_sub(1) {
            self.tables[t].busy = false;
        }
        e
    }

    /// Removes entry `i` for good: its table slot freed and its receiver reset (nothing of
    /// its transfer is answered any more), as [`swap_remove`](Self::swap_remove) does not.
    fn forget(&mut self, i: usize) -> SaEntry {
        let e = self.swap_remove(i);
        if let Some(t) = usize::from(e.table).checked_sub(1) {
            self.tables[t].rx.reset();
        }
        e
    }

    /// A wire TID no outstanding request has, and not 0.
    fn fresh_tid(&mut self) -> u64 {
        loop {
            let t = self.tids.hash(&self.counter.to_le_bytes());
            self.counter = self.counter.wrapping_add(1);
            if t != 0 && self.position(t).is_none() {
                return t;
            }
        }
    }

    /// Prepares `mad` for the wire and takes ownership of it: a request gets a fresh
    /// unpredictable TID and is tracked, with the resolver's `token`, for `tries` tries of
    /// `per_try` ms each (a GetTable also takes a table slot for its answer); a response (R
    /// bit) is sent as it is and not tracked. Returns the bytes to send, or `None` when the
    /// table is full (or, for a GetTable, no table slot is free).
    pub fn start(
        &mut self,
        now: Millis,
        ep: EpId,
        token: u64,
        mad: &[u8; MAD_LEN],
        per_try: Millis,
        tries: u32,
    ) -> Option<[u8; MAD_LEN]> {
        let mut wire = *mad;
        let head = Header::new_unchecked(&mad[..HEADER_LEN]);
        if head.method().is_response() {
            return Some(wire);
        }
        if self.len >= self.entries.len() {
            return None;
        }
        let table = match head.method() {
            Method::GetTable => {
                let cap = self.table_capacity();
                Some(self.tables[..cap].iter().position(|t| !t.busy)?)
            }
            _ => None,
        };
        let tid = self.fresh_tid();
        Header::new_unchecked(&mut wire[..HEADER_LEN]).set_tid(tid);
        if let Some(t) = table {
            let slot = &mut self.tables[t];
            slot.rx.start(now, tid);
            slot.ep = ep;
            slot.busy = true;
        }
        let deadline = now.saturating_add(per_try);
        self.entries[self.len] = SaEntry {
            token,
            tid,
            own_tid: head.tid(),
            ep,
            deadline,
            per_try,
            tries_left: tries.max(1) - 1,
            resend: false,
            end: End::Running,
            table: table.map_or(0, |t| t as u8 + 1),
            mad: wire,
        };
        self.len += 1;
        self.next = Some(self.next.map_or(deadline, |n| n.min(deadline)));
        Some(wire)
    }

    /// Request `token`'s MAD was not posted at `now` for want of a send buffer (or an address
    /// handle, or while its QP was being reset): the try it was is spent, and ends
    /// [`UNSENT_RETRY_MS`] from now instead of after its whole wait, so that it goes again as
    /// soon as buffers are likely free, or fails then when it has no try left. False if
    /// `token` is not outstanding here (nothing changes); a GetTable whose answer has begun
    /// is left to its transfer.
    pub fn handle_unsent(&mut self, now: Millis, token: u64) -> bool {
        let n = self.len;
        let Some(e) = self.entries[..n]
            .iter_mut()
            .find(|e| e.token == token && e.end == End::Running)
        else {
            return false;
        };
        self.unsent += 1;
        if e.deadline != Millis::MAX {
            let at = now.saturating_add(UNSENT_RETRY_MS);
            e.deadline = e.deadline.min(at);
            self.next = Some(self.next.map_or(at, |d| d.min(at)));
        }
        true
    }

    /// What the class 3 MAD `mad`, received at `now` with `meta` from a port whose SM is at
    /// `sm`, is. `carries(owner)` says whether the QP it arrived on carries endpoint `owner`'s
    /// SA traffic. A reply that answers an outstanding request completes it here; a segment
    /// of a GetTable answer goes to its receiver.
    pub fn handle_receive(
        &mut self,
        now: Millis,
        meta: &RecvMeta,
        sm: Option<SmAddr>,
        carries: impl FnOnce(EpId) -> bool,
        mad: &[u8; MAD_LEN],
    ) -> Received {
        if sm.is_none_or(|sm| sm.lid != meta.slid) || meta.src_qp != 1 {
            self.forged += 1;
            return Received::Forged;
        }
        let head = Header::new_unchecked(&mad[..HEADER_LEN]);
        if !head.method().is_response() {
            return Received::Report;
        }
        let running = self
            .position(head.tid())
            .filter(|&i| self.entries[i].end == End::Running);
        let Some(i) = running else {
            // A segment of a transfer that has ended (on the QP that carried it): its receiver
            // says its last word again if the sender missed it.
            let tid = head.tid();
            let ended = self.tables.iter_mut().find(|t| {
                !t.busy
                    && t.rx.tid() == tid
                    && matches!(
                        t.rx.state(),
                        rmpp::State::Done { .. } | rmpp::State::Failed(_)
                    )
            });
            if let Some(t) = ended {
                if carries(t.ep) {
                    let _ = t.rx.handle_receive(now, mad);
                    return Received::Segment;
                }
            }
            self.unknown += 1;
            return Received::Unknown;
        };
        if !carries(self.entries[i].ep) {
            self.forged += 1;
            return Received::Forged;
        }
        if let Some(t) = usize::from(self.entries[i].table).checked_sub(1) {
            return match self.tables[t].rx.handle_receive(now, mad) {
                rmpp::Progress::Accepted { .. } | rmpp::Progress::Ignored(_) => {
                    // From the first segment on, the receiver's timers own the transfer.
                    if self.entries[i].deadline != Millis::MAX {
                        self.entries[i].deadline = Millis::MAX;
                        self.next = self.earliest_try();
                    }
                    Received::Segment
                }
                rmpp::Progress::Done { .. } => Received::Table {
                    token: self.swap_remove(i).token,
                    slot: t,
                },
                rmpp::Progress::Failed(failure) => Received::TableFailed {
                    token: self.swap_remove(i).token,
                    failure,
                },
            };
        }
        let e = self.swap_remove(i);
        let mut m = *mad;
        Header::new_unchecked(&mut m[..HEADER_LEN]).set_tid(e.own_tid);
        Received::Reply {
            token: e.token,
            mad: m,
        }
    }

    /// Forgets endpoint `ep`'s requests (its QP is gone): their tokens, to complete as failed.
    pub fn drop_endpoint(&mut self, ep: EpId, mut f: impl FnMut(u64, [u8; MAD_LEN])) {
        let mut i = 0;
        while i < self.len {
            if self.entries[i].ep == ep {
                let e = self.forget(i);
                f(e.token, e.mad);
            } else {
                i += 1;
            }
        }
        if self.len == 0 {
            self.next = None;
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) has work (a lower bound).
    pub fn poll_timeout(&self) -> Option<Millis> {
        let tables = self
            .tables
            .iter()
            .filter(|t| t.busy)
            .filter_map(|t| t.rx.poll_timeout())
            .min();
        match (self.next, tables) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the tries due at `now`: each due request either goes again (its next try starts
    /// now; the MAD waits in [`poll_transmit`](Self::poll_transmit)) or ends (it waits in
    /// [`poll_expired`](Self::poll_expired)); each GetTable transfer's timers run (an ACK
    /// re-sent after a silence waits in `poll_transmit`; a transfer out of time ends its
    /// request).
    pub fn handle_timeout(&mut self, now: Millis) {
        for t in 0..self.tables.len() {
            let slot = &mut self.tables[t];
            let due = slot.busy && slot.rx.poll_timeout().is_some_and(|d| d <= now);
            if !due {
                continue;
            }
            if let Some(failure) = slot.rx.handle_timeout(now) {
                let n = self.len;
                let owner = self.entries[..n]
                    .iter_mut()
                    .find(|e| usize::from(e.table) == t + 1 && e.end == End::Running);
                if let Some(e) = owner {
                    e.end = End::Table(failure);
                    e.deadline = Millis::MAX;
                    self.ended += 1;
                }
            }
        }
        if self.next.is_none_or(|n| n > now) {
            return;
        }
        let n = self.len;
        for e in &mut self.entries[..n] {
            if e.deadline > now {
                continue;
            }
            if e.tries_left > 0 {
                e.tries_left -= 1;
                e.deadline = now.saturating_add(e.per_try);
                self.resends += 1;
                if !e.resend {
                    e.resend = true;
                    self.resend_due += 1;
                }
            } else {
                e.end = End::OutOfTries;
                e.deadline = Millis::MAX;
                self.timeouts += 1;
                self.ended += 1;
            }
        }
        self.next = self.earliest_try();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;
    use std::vec::Vec;

    const SM: SmAddr = SmAddr { lid: 1, sl: 0 };

    type Channel = SaChannel<Vec<SaEntry>, Vec<TableSlot<Vec<u8>>>, Vec<u8>>;

    fn channel(n: usize) -> Channel {
        SaChannel::new(vec![SaEntry::EMPTY; n], Vec::new(), [0x1234, 0x5678])
    }

    fn get(tid_byte: u8) -> [u8; MAD_LEN] {
        let mut m = [0u8; MAD_LEN];
        m[..4].copy_from_slice(&[1, 3, 2, 1]);
        m[15] = tid_byte;
        m
    }

    fn from(slid: u16, src_qp: u32) -> RecvMeta {
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

    fn reply_to(wire: &[u8; MAD_LEN]) -> [u8; MAD_LEN] {
        let mut r = *wire;
        r[3] = 0x81;
        r
    }

    #[test]
    fn a_request_gets_a_tid_of_its_own_and_its_reply_completes_it() {
        let mut c = channel(4);
        let wire = c
            .start(0, EpId(1), 0x0400_0007_dead_beef, &get(1), 100, 3)
            .unwrap();
        assert_ne!(&wire[8..16], &0x0400_0007_dead_beefu64.to_be_bytes());
        assert_eq!(&wire[16..], &get(1)[16..]);
        let reply = reply_to(&wire);
        // A reply naming the resolver's token or TID (what the wire TID used to be) answers
        // nothing.
        let mut guess = reply;
        guess[8..16].copy_from_slice(&0x0400_0007_dead_beefu64.to_be_bytes());
        assert_eq!(
            c.handle_receive(0, &from(1, 1), Some(SM), |_| true, &guess),
            Received::Unknown
        );
        guess[8..16].copy_from_slice(&get(1)[8..16]);
        assert_eq!(
            c.handle_receive(0, &from(1, 1), Some(SM), |_| true, &guess),
            Received::Unknown
        );
        let Received::Reply { token, mad } =
            c.handle_receive(0, &from(1, 1), Some(SM), |e| e == EpId(1), &reply)
        else {
            panic!("the SM's reply on the asking QP completes the request");
        };
        assert_eq!(token, 0x0400_0007_dead_beef);
        assert_eq!(mad[15], 1, "the resolver's TID is back");
        assert_eq!(&mad[16..], &reply[16..]);
        assert!(c.is_empty());
        assert_eq!(
            c.handle_receive(0, &from(1, 1), Some(SM), |_| true, &reply),
            Received::Unknown,
            "a duplicate answers nothing"
        );
        assert_eq!(c.unknown, 3);
    }

    #[test]
    fn only_the_sm_on_the_asking_qp_is_heard() {
        let mut c = channel(4);
        let wire = c.start(0, EpId(2), 7, &get(1), 100, 3).unwrap();
        let reply = reply_to(&wire);
        // Another host, even with the right TID; the SM's LID but not QP 1; no SM known.
        for (meta, sm) in [
            (from(9, 1), Some(SM)),
            (from(1, 0x48), Some(SM)),
            (from(1, 1), None),
        ] {
            assert_eq!(
                c.handle_receive(0, &meta, sm, |_| true, &reply),
                Received::Forged
            );
        }
        // The SM, but on a QP that does not carry endpoint 2's SA traffic.
        assert_eq!(
            c.handle_receive(0, &from(1, 1), Some(SM), |e| e != EpId(2), &reply),
            Received::Forged
        );
        assert_eq!(c.forged, 4);
        assert_eq!(c.len(), 1, "the request is still outstanding");
        // A Report (a request, no R bit) from the SM is the resolver's; from anyone else not.
        let mut report = get(0);
        report[3] = 0x06;
        assert_eq!(
            c.handle_receive(0, &from(1, 1), Some(SM), |_| false, &report),
            Received::Report
        );
        assert_eq!(
            c.handle_receive(0, &from(3, 1), Some(SM), |_| true, &report),
            Received::Forged
        );
        assert!(matches!(
            c.handle_receive(0, &from(1, 1), Some(SM), |e| e == EpId(2), &reply),
            Received::Reply { token: 7, .. }
        ));
    }

    #[test]
    fn tids_cannot_be_predicted_from_earlier_ones() {
        // Sequential tokens, as the resolver hands them out: the wire TIDs of 64 requests are
        // distinct, and knowing them tells nothing of the next one (no constant step, no
        // small differences: a counter from a random start fails both).
        let mut c = channel(128);
        let tids: Vec<u64> = (0..64u64)
            .map(|t| {
                let w = c.start(0, EpId(0), 0x100 + t, &get(1), 100, 3).unwrap();
                u64::from_be_bytes(w[8..16].try_into().unwrap())
            })
            .collect();
        let mut uniq = tids.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(uniq.len(), tids.len());
        let steps: Vec<u64> = tids.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        assert!(steps.windows(2).any(|s| s[0] != s[1]), "a constant step");
        let small = steps.iter().filter(|d| **d < 1 << 32).count();
        assert!(small < 4, "{small} of 63 steps below 2^32");
        // Another key (another process start) numbers differently.
        let mut d: Channel = SaChannel::new(vec![SaEntry::EMPTY; 4], Vec::new(), [0x1235, 0x5678]);
        let w = d.start(0, EpId(0), 0x100, &get(1), 100, 3).unwrap();
        assert_ne!(u64::from_be_bytes(w[8..16].try_into().unwrap()), tids[0]);
    }

    #[test]
    fn unanswered_requests_are_resent_then_failed_exactly_once() {
        let mut c = channel(4);
        let wire = c.start(0, EpId(1), 9, &get(1), 100, 3).unwrap();
        let mut seen = Vec::new();
        expire_into(&mut c, 99, &mut seen);
        assert!(seen.is_empty() && c.poll_transmit().is_none());
        assert_eq!(c.poll_timeout(), Some(100));
        for at in [100, 200] {
            expire_into(&mut c, at, &mut seen);
            assert!(seen.is_empty());
            // The same bytes go again, once per try.
            let again = SaSend {
                ep: EpId(1),
                request: Some(9),
                mad: wire,
            };
            assert_eq!(c.poll_transmit(), Some(again));
            assert_eq!(c.poll_transmit(), None);
        }
        expire_into(&mut c, 299, &mut seen);
        assert!(seen.is_empty() && c.poll_transmit().is_none());
        expire_into(&mut c, 300, &mut seen);
        assert_eq!(
            seen,
            vec![Expired::Failed {
                token: 9,
                mad: wire
            }]
        );
        assert!(c.is_empty() && c.poll_timeout().is_none());
        assert_eq!((c.resends, c.timeouts), (2, 1));
    }

    #[test]
    fn responses_are_not_tracked_and_a_full_table_refuses() {
        let mut c = channel(1);
        let mut resp = get(1);
        resp[3] = 0x86;
        resp[8..16].copy_from_slice(&77u64.to_be_bytes());
        let wire = c.start(0, EpId(0), 5, &resp, 100, 3).unwrap();
        assert_eq!(
            &wire[8..16],
            &77u64.to_be_bytes(),
            "a response keeps its TID"
        );
        assert!(c.is_empty());
        assert!(c.start(0, EpId(0), 6, &get(2), 100, 3).is_some());
        assert!(c.start(0, EpId(0), 7, &get(3), 100, 3).is_none());
        let mut dropped = Vec::new();
        c.drop_endpoint(EpId(0), |t, _| dropped.push(t));
        assert_eq!(dropped, vec![6]);
        assert!(c.start(0, EpId(0), 8, &get(3), 100, 3).is_some());
        c.clear();
        assert!(c.is_empty() && c.poll_timeout().is_none());
    }

    // --- GetTable answers over RMPP ---

    const RESP_MS: Millis = 200;
    const TOTAL_MS: Millis = 10_000;

    fn table_channel(slots: usize, room: usize) -> Channel {
        let cfg = rmpp::Config {
            window: 4,
            resp_timeout: RESP_MS,
            total_timeout: TOTAL_MS,
            ..rmpp::Config::DEFAULT
        };
        let tables = (0..slots)
            .map(|_| TableSlot::new(vec![0u8; room], cfg))
            .collect();
        SaChannel::new(vec![SaEntry::EMPTY; 4], tables, [0x1234, 0x5678])
    }

    /// A PathRecord GetTable (method 0x12).
    fn get_table(tid_byte: u8) -> [u8; MAD_LEN] {
        let mut m = get(tid_byte);
        m[3] = 0x12;
        m[16..18].copy_from_slice(&0x0035u16.to_be_bytes());
        m
    }

    /// The answer's segments as the SM's MAD layer sends them, for the request `wire`.
    fn answer(wire: &[u8; MAD_LEN], records: &[u8]) -> Vec<[u8; MAD_LEN]> {
        let mut head = [0u8; crate::wire::sa::DATA_OFFSET];
        head.copy_from_slice(&wire[..crate::wire::sa::DATA_OFFSET]);
        head[3] = 0x92;
        head[44..46].copy_from_slice(&8u16.to_be_bytes());
        (1..=rmpp::segment_count(records.len()))
            .map(|n| rmpp::segment(&head, records, n).unwrap())
            .collect()
    }

    fn recs(n: usize) -> Vec<u8> {
        (0..n * 64).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// (RMPPType, SegmentNumber, NewWindowLast or status) of a MAD we send back.
    fn rmpp_of(m: &[u8; MAD_LEN]) -> (u8, u32, u32) {
        let word = |o: usize| u32::from_be_bytes(m[o..o + 4].try_into().unwrap());
        (
            m[25],
            word(28),
            if m[25] == 2 {
                word(32)
            } else {
                u32::from(m[27])
            },
        )
    }

    /// Runs the tries due at `now`; what ended goes into `seen`.
    fn expire_into(c: &mut Channel, now: Millis, seen: &mut Vec<Expired>) {
        c.handle_timeout(now);
        seen.extend(core::iter::from_fn(|| c.poll_expired()));
    }

    /// Everything waiting to go, as it goes.
    fn sent_mads(c: &mut Channel) -> Vec<(EpId, [u8; MAD_LEN])> {
        core::iter::from_fn(|| c.poll_transmit())
            .map(|s| (s.ep, s.mad))
            .collect()
    }

    fn sent(c: &mut Channel) -> Vec<(EpId, (u8, u32, u32))> {
        core::iter::from_fn(|| c.poll_transmit())
            .map(|s| (s.ep, rmpp_of(&s.mad)))
            .collect()
    }

    #[test]
    fn a_table_is_reassembled_acknowledged_and_completes_its_request_once() {
        let mut c = table_channel(1, 64 * 40);
        let wire = c.start(0, EpId(3), 21, &get_table(1), 100, 3).unwrap();
        assert_eq!(wire[3], 0x12);
        let data = recs(40); // 2 560 bytes: 13 segments
        let segs = answer(&wire, &data);
        assert_eq!(segs.len(), 13);
        let sm = from(1, 1);
        let mut acks = Vec::new();
        for (i, seg) in segs.iter().enumerate() {
            // Well past the request's try time: once segments come, no re-send of the GetTable.
            let now = 50 + 100 * i as Millis;
            let mut resent = Vec::new();
            expire_into(&mut c, now, &mut resent);
            assert!(resent.is_empty(), "segment {}: {resent:?}", i + 1);
            let r = c.handle_receive(now, &sm, Some(SM), |e| e == EpId(3), seg);
            acks.extend(sent(&mut c));
            if i + 1 < segs.len() {
                assert_eq!(r, Received::Segment, "segment {}", i + 1);
            } else {
                assert_eq!(r, Received::Table { token: 21, slot: 0 });
            }
        }
        // ACK after segment 1 (window 1 → 5), at each window's end, and on the last.
        let want: Vec<(EpId, (u8, u32, u32))> = [(1, 5), (5, 9), (9, 13), (13, 13)]
            .iter()
            .map(|&(s, w)| (EpId(3), (2, s, w)))
            .collect();
        assert_eq!(acks, want);
        let t = c.table(0).unwrap();
        assert_eq!(t.records, &data[..]);
        assert_eq!(t.header[3], 0x92);
        assert!(c.is_empty() && c.poll_timeout().is_none());
        // The SM missed our last ACK and sends its last segment again: ACKed again, nothing
        // completes twice, and the table stays readable.
        let again = c.handle_receive(1400, &sm, Some(SM), |e| e == EpId(3), &segs[12]);
        assert_eq!(again, Received::Segment);
        assert_eq!(sent(&mut c), vec![(EpId(3), (2, 13, 13))]);
        assert_eq!(c.unknown, 0);
        assert_eq!(c.table(0).unwrap().records, &data[..]);
        // ... but not on a QP that does not carry endpoint 3's SA traffic.
        let forged = c.handle_receive(1400, &sm, Some(SM), |e| e != EpId(3), &segs[12]);
        assert_eq!(forged, Received::Unknown);
        assert!(sent(&mut c).is_empty());
    }

    #[test]
    fn a_get_table_needs_a_free_slot_and_is_resent_only_until_its_first_segment() {
        let mut c = table_channel(1, 64 * 8);
        let w1 = c.start(0, EpId(0), 1, &get_table(1), 100, 3).unwrap();
        assert!(
            c.start(0, EpId(0), 2, &get_table(2), 100, 3).is_none(),
            "one slot, one table"
        );
        assert!(
            c.start(0, EpId(0), 3, &get(3), 100, 3).is_some(),
            "Gets still go"
        );
        let mut seen = Vec::new();
        expire_into(&mut c, 100, &mut seen);
        assert!(seen.is_empty());
        let again = sent_mads(&mut c);
        assert!(again.contains(&(EpId(0), w1)), "the GetTable goes again");
        // A segment from another host with the right TID is forged, and changes nothing.
        let segs = answer(&w1, &recs(8));
        assert_eq!(
            c.handle_receive(150, &from(9, 1), Some(SM), |_| true, &segs[0]),
            Received::Forged
        );
        assert!(sent(&mut c).is_empty());
        assert_eq!(
            c.handle_receive(150, &from(1, 1), Some(SM), |_| true, &segs[0]),
            Received::Segment
        );
        assert_eq!(sent(&mut c), vec![(EpId(0), (2, 1, 3))]);
        seen.clear();
        expire_into(&mut c, 300, &mut seen);
        let again = sent_mads(&mut c);
        assert!(
            !again.iter().any(|(_, m)| *m == w1),
            "the GetTable went again after its first segment"
        );
        for s in &segs[1..] {
            let _ = c.handle_receive(310, &from(1, 1), Some(SM), |_| true, s);
        }
        // The slot is free again once the table is done.
        assert!(c.start(400, EpId(0), 4, &get_table(4), 100, 3).is_some());
    }

    #[test]
    fn silence_re_acks_then_the_total_time_fails_the_table_once() {
        let mut c = table_channel(1, 64 * 40);
        let wire = c.start(0, EpId(1), 5, &get_table(1), 100, 3).unwrap();
        let segs = answer(&wire, &recs(40));
        let _ = c.handle_receive(10, &from(1, 1), Some(SM), |_| true, &segs[0]);
        assert_eq!(sent(&mut c).len(), 1);
        assert_eq!(c.poll_timeout(), Some(10 + RESP_MS));
        let mut seen = Vec::new();
        expire_into(&mut c, 10 + RESP_MS, &mut seen);
        assert!(seen.is_empty());
        assert_eq!(sent(&mut c), vec![(EpId(1), (2, 1, 5))], "the ACK again");
        let mut now = 10 + RESP_MS;
        while seen.is_empty() {
            now = c.poll_timeout().expect("a timer while the table is out");
            expire_into(&mut c, now, &mut seen);
            let _ = sent(&mut c);
        }
        assert_eq!(now, 10 + TOTAL_MS);
        assert_eq!(
            seen,
            vec![Expired::TableFailed {
                token: 5,
                failure: Failure::TimedOut
            }]
        );
        assert!(c.is_empty() && c.poll_timeout().is_none());
    }

    #[test]
    fn a_table_too_big_for_the_slot_is_stopped_and_fails_its_request() {
        let mut c = table_channel(1, 64 * 10);
        let wire = c.start(0, EpId(2), 8, &get_table(1), 100, 3).unwrap();
        let segs = answer(&wire, &recs(11));
        let r = c.handle_receive(5, &from(1, 1), Some(SM), |_| true, &segs[0]);
        assert!(
            matches!(
                r,
                Received::TableFailed {
                    token: 8,
                    failure: Failure::TooBig {
                        records_needed: Some(11),
                        ..
                    }
                }
            ),
            "{r:?}"
        );
        assert_eq!(sent(&mut c), vec![(EpId(2), (3, 0, 1))], "STOP, status 1");
        assert!(c.is_empty());
        // Dropping an endpoint frees its table slot.
        let _ = c.start(10, EpId(2), 9, &get_table(2), 100, 3).unwrap();
        let mut dropped = Vec::new();
        c.drop_endpoint(EpId(2), |t, _| dropped.push(t));
        assert_eq!(dropped, vec![9]);
        assert!(c.poll_timeout().is_none());
        assert!(c.start(20, EpId(2), 10, &get_table(3), 100, 3).is_some());
    }
}
