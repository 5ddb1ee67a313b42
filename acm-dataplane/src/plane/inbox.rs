//! The queues into the loop, shared with the core's threads, and what travels in them: client
//! requests (a [`Request`] copied into a [`Queued`], main thread), SA completions of the core's transport ([`SaReply`],
//! SA thread) and the rare control messages ([`Control`], main thread), the last two kinds of
//! the main thread in one ticket order.

use super::Ud;
use crate::stats::MissStamp;
use crate::worker::Waker;
use acm_core_nostd::cache::{ep_number, AddrKind, CacheEp};
use acm_core_nostd::resolver::request::respond;
use acm_core_nostd::resolver::{
    Answer, EpConfig, EpId, Kind, MsgBuf, Request, RequestHead, Via, MSG_LEN,
};
use acm_core_nostd::wire::client::{Status, HDR_LEN};
use acm_core_nostd::wire::gid::Gid;
use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
/// A client request handed from the core's main thread, as it waits in the inbox: the
/// [`Request`]'s head (the same [`RequestHead`] the plugin's front made) and its message
/// copied (the core's buffer dies when the call returns), its place in the main thread's
/// order and its latency stamp.
pub struct Queued {
    /// The request's head: endpoint, cache number at the time of the call, the core's client
    /// index, kind, and the front's classification ([`RequestHead::target`]).
    pub head: RequestHead,
    /// Its place in the main thread's order of requests and control messages: the loop
    /// applies every control message with a smaller ticket first, and none with a larger one.
    pub ticket: u64,
    /// Valid length of `msg`.
    pub len: u16,
    /// A copy of the client message: its first `len` bytes, and zeros up to the header's end
    /// when it is shorter than a header. The bytes after that are left from an earlier
    /// request: a request is written by its length (`Queued::fill`), not the whole buffer
    /// (a PATH request by LID is 88 bytes of 592), and never copied again on its way.
    pub msg: [u8; MSG_LEN],
    /// When a missed `resolve()` started, for its latency (`None`: not timed).
    pub stamp: Option<MissStamp>,
}

impl Queued {
    /// Fills this buffer with request `r` (its message by its length), stamp `stamp`, ticket
    /// `ticket`.
    fn fill(&mut self, r: &Request<'_>, stamp: Option<MissStamp>, ticket: u64) {
        let n = r.msg.len().min(MSG_LEN);
        self.head = r.head;
        self.ticket = ticket;
        self.len = n as u16;
        self.msg[..n].copy_from_slice(&r.msg[..n]);
        if n < HDR_LEN {
            self.msg[n..HDR_LEN].fill(0);
        }
        self.stamp = stamp;
    }

    /// The request this buffer holds: its head, its message read where it lies.
    pub fn request(&self) -> Request<'_> {
        Request {
            head: self.head,
            msg: &self.msg[..usize::from(self.len)],
        }
    }

    /// This request's answer with `status` and no path, its message built into `out`, for one
    /// the resolver never took (shutdown, no resolver, a stalled loop); `None` for a Prime or
    /// Refresh, which was answered when it was made.
    pub fn answer(&self, status: Status, out: &mut MsgBuf) -> Option<Answer> {
        let via = match self.head.kind {
            Kind::Resolve => Via::Resolve,
            Kind::Query => Via::Query,
            Kind::Prime | Kind::Refresh => return None,
        };
        let len = respond(
            &self.msg[..usize::from(self.len)],
            via,
            status,
            None,
            &mut out.0,
        );
        Some(Answer {
            ep: self.head.ep,
            client: self.head.client,
            via,
            status,
            len,
        })
    }
}

/// An SA completion copied out of the core's MAD on the SA thread.
pub struct SaReply {
    /// The token of the query.
    pub token: u64,
    /// `ib_user_mad.status` (nonzero = timeout / send failure).
    pub umad_status: u32,
    /// The MAD.
    pub mad: [u8; 256],
    /// The loop's latency clock ([`crate::stats::Clock::now`]) when the SA thread handed it
    /// over, for [`crate::stats::EpStats::reply_wait`]; 0: not stamped.
    pub handed: u64,
}

impl Carried for Queued {
    fn blank() -> Self {
        Queued {
            head: RequestHead {
                ep: EpId(0),
                cache_ep: ep_number(0, 0),
                client: 0,
                kind: Kind::Resolve,
                target: None,
                front_writes: None,
            },
            ticket: 0,
            len: 0,
            msg: [0; MSG_LEN],
            stamp: None,
        }
    }
}

impl Carried for SaReply {
    fn blank() -> Self {
        SaReply {
            token: 0,
            umad_status: 0,
            mad: [0; 256],
            handed: 0,
        }
    }
}

/// One address-preload entry (`addr_preload acm_hosts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostAddr {
    /// Its kind (`ACM_ADDRESS_NAME` / `IP` / `IP6`).
    pub kind: AddrKind,
    /// The address, zero-padded to 64 bytes.
    pub addr: [u8; 64],
    /// The port GID it maps to.
    pub gid: Gid,
}

/// Rare messages from the core's main thread, applied in order before later requests.
pub enum Control {
    /// An endpoint opened.
    Open {
        /// Its id.
        ep: EpId,
        /// Its cache number now.
        cache_ep: CacheEp,
        /// What the resolver needs.
        cfg: EpConfig,
        /// Its UD QP (`None`: no verbs, SA-only endpoint).
        ud: Option<Box<dyn Ud>>,
        /// `route_preload`: paths that never expire.
        routes: Vec<[u8; 64]>,
        /// `addr_preload`: the hosts file, shared by every endpoint.
        addrs: Arc<Vec<HostAddr>>,
    },
    /// An endpoint closed: answer its requests, drop its state.
    Close(EpId),
    /// A local address was added.
    AddAddress {
        /// Endpoint.
        ep: EpId,
        /// Its cache number.
        cache_ep: CacheEp,
        /// Its kind.
        kind: AddrKind,
        /// Zero-padded address.
        addr: [u8; 64],
    },
    /// A local address was removed.
    RemoveAddress {
        /// Endpoint.
        ep: EpId,
        /// Its kind.
        kind: AddrKind,
        /// Zero-padded address.
        addr: [u8; 64],
    },
    /// CLIENT_REREGISTER on the endpoint's port.
    Reregister(EpId),
    /// Answer everything and stop.
    Shutdown,
}

/// What travels through a [`Staged`] queue.
pub(crate) trait Carried {
    /// An empty one: each buffer at the start.
    fn blank() -> Self;
}

/// A bounded queue with one staging buffer of it, whose items never move: each is written
/// in place into a buffer allocated at start, and the buffer travels (a pointer swap with
/// the taker's own buffer), not the item. So a request's message is copied once on its way
/// into the loop (into the buffer), and the resolver reads it where it lies.
///
/// An item pushed while the queue is empty and the staging buffer free is written into the
/// staging buffer, and taken before anything queued: nothing queued is older, since an item
/// goes to the queue only while the staging buffer or the queue is taken. An isolated item (a
/// missed `resolve()`, the SA reply of an isolated miss) thus goes through the same two
/// buffers (the staging one and the taker's, swapped) every time, whose lines stay in the
/// caches of the threads that use them, where a queue buffer, a different one each time, is
/// cold. Queued items are written into a spare buffer (`spare`: as many as the queue holds,
/// allocated at start), which then goes through the queue.
struct Staged<T> {
    stage: CachePadded<Stage<T>>,
    queue: ArrayQueue<Box<T>>,
    spare: ArrayQueue<Box<T>>,
}

/// The staging buffer of a [`Staged`] queue. `full` says whether it holds an item not
/// taken yet: it changes only under the lock, and is read without it to pass an empty
/// buffer by.
struct Stage<T> {
    full: AtomicBool,
    item: Mutex<Box<T>>,
}

impl<T: Carried> Staged<T> {
    /// Room for one staged and `capacity` (at least 1) queued: every buffer allocated here.
    fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let spare = ArrayQueue::new(capacity);
        for _ in 0..capacity {
            let _ = spare.push(Box::new(T::blank()));
        }
        Staged {
            stage: CachePadded::new(Stage {
                full: AtomicBool::new(false),
                item: Mutex::new(Box::new(T::blank())),
            }),
            queue: ArrayQueue::new(capacity),
            spare,
        }
    }

    /// Pushes the item `fill` writes in place (into the staging buffer, or a spare one that
    /// then goes through the queue); false if the queue is full (`fill` does not run).
    #[inline(always)]
    fn push_with(&self, fill: impl FnOnce(&mut T)) -> bool {
        let stage = &self.stage;
        if !stage.full.load(Ordering::Acquire) && self.queue.is_empty() {
            let mut item = lock(&stage.item);
            if !stage.full.load(Ordering::Relaxed) {
                fill(&mut item);
                stage.full.store(true, Ordering::Release);
                return true;
            }
        }
        let Some(mut item) = self.spare.pop() else {
            return false;
        };
        fill(&mut item);
        match self.queue.push(item) {
            Ok(()) => true,
            // Never: there are no more buffers than the queue holds.
            Err(item) => {
                let _ = self.spare.push(item);
                false
            }
        }
    }

    /// Takes the oldest item (the staging buffer's, else the queue's first) by swapping its
    /// buffer with `to`, whose buffer takes its place; false if there is none.
    #[inline(always)]
    fn pop_into(&self, to: &mut Box<T>) -> bool {
        let stage = &self.stage;
        if stage.full.load(Ordering::Acquire) {
            let mut item = lock(&stage.item);
            if stage.full.load(Ordering::Relaxed) {
                std::mem::swap(&mut *item, to);
                stage.full.store(false, Ordering::Release);
                return true;
            }
        }
        match self.queue.pop() {
            Some(mut item) => {
                std::mem::swap(&mut item, to);
                let _ = self.spare.push(item);
                true
            }
            None => false,
        }
    }

    /// Gives the oldest item, if any, to `f` (its buffer then goes back into use).
    fn pop_with<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        let stage = &self.stage;
        if stage.full.load(Ordering::Acquire) {
            let item = lock(&stage.item);
            if stage.full.load(Ordering::Relaxed) {
                stage.full.store(false, Ordering::Release);
                return Some(f(&item));
            }
        }
        let item = self.queue.pop()?;
        let r = f(&item);
        let _ = self.spare.push(item);
        Some(r)
    }

    fn is_empty(&self) -> bool {
        !self.stage.full.load(Ordering::Acquire) && self.queue.is_empty()
    }
}

/// The queues into the loop (shared with the core's threads).
pub struct Inbox {
    /// Client requests (main thread → loop). The staging buffer is the one a missed
    /// `resolve()` fills and then, running the round itself, takes: its lines stay with that
    /// thread.
    requests: Staged<Queued>,
    /// SA replies (SA thread → loop). The staging buffer is the one every isolated miss's
    /// reply goes through: the SA thread writes lines the loop last read, not a cold slot.
    replies: Staged<SaReply>,
    pub(super) control: Mutex<VecDeque<(u64, u64, Control)>>,
    control_pushed: AtomicU64,
    /// One counter for requests and control messages, in the order the main thread (their
    /// only producer) queued them. On a line of its own, as is `rounds`: every hand-over
    /// writes this one and every round that one, from two threads.
    tickets: CachePadded<AtomicU64>,
    /// Set when the loop can no longer resolve anything (it still answers, with errors).
    pub(super) stopped: AtomicBool,
    /// Poll rounds the loop has run: its progress, as the watchdog sees it.
    pub(super) rounds: CachePadded<AtomicU64>,
    /// Set by the watchdog while the loop makes no progress and requests wait: new requests
    /// are refused (the caller answers them ETIMEDOUT at once) until it moves again.
    stalled: AtomicBool,
    /// Times the loop gave up (its recovery from a panic panicked too).
    pub(super) gave_up: AtomicU64,
    /// Times the loop replaced a resolver after a caught panic.
    pub(super) restarts: AtomicU64,
    /// Control messages the loop has applied (their outputs carried out).
    pub(super) control_applied: AtomicU64,
    /// Requests refused because the queue was full.
    pub overflows: AtomicU64,
    /// SA replies dropped because the reply queue was full.
    pub reply_drops: AtomicU64,
    /// Wakes the loop.
    pub waker: Waker,
}

impl Inbox {
    /// Queues of these capacities.
    pub fn new(requests: usize, replies: usize, waker: Waker) -> Self {
        Inbox {
            requests: Staged::new(requests),
            replies: Staged::new(replies),
            control: Mutex::new(VecDeque::new()),
            control_pushed: AtomicU64::new(0),
            tickets: CachePadded::new(AtomicU64::new(0)),
            stopped: AtomicBool::new(false),
            rounds: CachePadded::new(AtomicU64::new(0)),
            stalled: AtomicBool::new(false),
            gave_up: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            control_applied: AtomicU64::new(0),
            overflows: AtomicU64::new(0),
            reply_drops: AtomicU64::new(0),
            waker,
        }
    }

    /// Queues a control message and wakes the loop (main thread). Returns its sequence
    /// number: it has been applied once [`Inbox::controls_applied`] reaches it.
    pub fn control(&self, c: Control) -> u64 {
        let ticket = self.tickets.fetch_add(1, Ordering::AcqRel);
        let seq = self.control_pushed.fetch_add(1, Ordering::AcqRel) + 1;
        lock(&self.control).push_back((ticket, seq, c));
        self.waker.wake();
        seq
    }

    /// Whether the loop has given up resolving (after a failure it could not recover from)
    /// or its thread is gone: a request handed over now would not be answered, so
    /// [`Inbox::hand_over`] refuses it and the caller answers it at once.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire) || self.waker.exited()
    }

    /// Poll rounds the loop has run so far (its progress).
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }

    /// Whether the watchdog found the loop stalled ([`crate::watchdog`]): a request handed
    /// over now would wait for it, so [`Inbox::hand_over`] refuses it and the caller answers
    /// it at once (ETIMEDOUT).
    pub fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::Acquire)
    }

    /// The watchdog's verdict (see [`Inbox::is_stalled`]).
    pub fn set_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::Release);
    }

    /// The loop's health: (resolvers replaced after a caught panic, times it gave up, whether
    /// its thread has exited).
    pub fn health(&self) -> (u64, u64, bool) {
        (
            self.restarts.load(Ordering::Relaxed),
            self.gave_up.load(Ordering::Relaxed),
            self.waker.exited(),
        )
    }

    /// How many control messages the main thread has queued so far (counted before each is
    /// queued: a request queued after a control message is never seen before its count).
    pub(super) fn controls_pushed(&self) -> u64 {
        self.control_pushed.load(Ordering::Acquire)
    }

    /// How many control messages the loop has applied so far.
    pub fn controls_applied(&self) -> u64 {
        self.control_applied.load(Ordering::Acquire)
    }

    /// Hands request `r` to the loop (its head as it is, its message copied), with the
    /// request's classification if the caller's front made one ([`RequestHead::target`],
    /// which the loop then does not redo) and `stamp`, the start of a missed `resolve()`, whose answer's latency the loop
    /// then records; false if the queue is full (counted), or the loop is stopped
    /// ([`Inbox::is_stopped`]) or stalled ([`Inbox::is_stalled`]).
    pub fn hand_over(&self, r: &Request<'_>, stamp: Option<MissStamp>) -> bool {
        if self.is_stopped() || self.is_stalled() {
            return false;
        }
        let ticket = self.tickets.fetch_add(1, Ordering::AcqRel);
        if self.requests.push_with(|q| q.fill(r, stamp, ticket)) {
            self.waker.serve();
            true
        } else {
            self.overflows.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    /// Gives the oldest request handed over and not taken yet to `f` (the watchdog answering
    /// what a stuck loop left).
    pub(crate) fn take_request_with<R>(&self, f: impl FnOnce(&Queued) -> R) -> Option<R> {
        self.requests.pop_with(f)
    }

    /// Takes the oldest request handed over into the loop's buffer `to` (the buffers are
    /// swapped: the request is not copied); false if none waits.
    pub(super) fn take_request_into(&self, to: &mut Box<Queued>) -> bool {
        self.requests.pop_into(to)
    }

    /// Whether requests wait to be taken.
    pub(crate) fn has_requests(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Hands the SA completion `make` builds to the loop (SA thread); false if the queue was
    /// full (counted).
    pub fn reply_with(&self, make: impl FnOnce() -> SaReply) -> bool {
        let ok = self.replies.push_with(|slot| *slot = make());
        if !ok {
            self.reply_drops.fetch_add(1, Ordering::Relaxed);
        }
        // Handed over, never run here: the round would answer clients, and an answer blocks on
        // a client that does not read its socket; the core's SA thread, which every port's
        // SA traffic needs, must not wait on one. (The loop expects the reply: it polls for it.)
        self.waker.wake();
        ok
    }

    /// [`Inbox::reply_with`] of a built completion.
    pub fn reply(&self, r: SaReply) -> bool {
        self.reply_with(|| r)
    }

    /// Takes the oldest SA completion not taken yet into the loop's buffer `to` (the buffers
    /// are swapped); false if none waits.
    pub(super) fn take_reply_into(&self, to: &mut Box<SaReply>) -> bool {
        self.replies.pop_into(to)
    }

    /// Whether requests, replies or control messages wait to be taken.
    pub(super) fn waiting(&self) -> bool {
        self.has_requests()
            || !self.replies.is_empty()
            || self.control_pushed.load(Ordering::Acquire)
                > self.control_applied.load(Ordering::Acquire)
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::Worker;

    fn inbox() -> Inbox {
        Inbox::new(8, 8, Worker::new_waker())
    }

    /// A request as a caller without a front hands it over.
    fn request(
        i: &Inbox,
        ep: EpId,
        cache_ep: CacheEp,
        client: u64,
        kind: Kind,
        msg: &[u8],
    ) -> bool {
        i.hand_over(&Request::new(ep, cache_ep, client, kind, msg), None)
    }

    fn hand(i: &Inbox, client: u64) -> bool {
        request(
            i,
            EpId(0),
            ep_number(0, 0),
            client,
            Kind::Resolve,
            &[0u8; 24],
        )
    }

    fn taken(i: &Inbox) -> Vec<(u64, u64)> {
        std::iter::from_fn(|| i.take_request_with(|r| (r.head.client, r.ticket))).collect()
    }

    /// The staging buffer is taken before the queue, and only an empty queue sends a request
    /// to it: requests leave in the order they came, their tickets ascending.
    #[test]
    fn requests_leave_in_the_order_they_came_through_the_staging_buffer_and_the_queue() {
        let i = inbox();
        assert!(!i.has_requests());
        assert!(hand(&i, 1), "staged");
        assert!(hand(&i, 2), "queued behind it");
        assert!(i.has_requests());
        assert_eq!(taken(&i), [(1, 0), (2, 1)]);
        assert!(!i.has_requests());
        // The queue not empty: a request goes behind it, even with the staging buffer free.
        assert!(hand(&i, 3));
        assert!(hand(&i, 4));
        assert_eq!(i.take_request_with(|r| r.head.client), Some(3));
        assert!(hand(&i, 5));
        assert_eq!(taken(&i), [(4, 3), (5, 4)]);
        // A full queue with the staging buffer taken refuses (the caller answers ENOMEM).
        assert!((10..19).all(|c| hand(&i, c)), "1 staged + 8 queued");
        assert!(!hand(&i, 19));
        assert_eq!(i.overflows.load(Ordering::Relaxed), 1);
        assert_eq!(taken(&i).len(), 9);
    }

    impl Carried for u32 {
        fn blank() -> Self {
            0
        }
    }

    /// A request travels by its length: the loop's buffer, reused, holds the new message's
    /// bytes (and zeros to the header's end for one shorter than a header), never a header
    /// left by the request before it, and its answer is built from those bytes only.
    #[test]
    fn a_request_is_carried_by_its_length_and_never_with_an_earlier_ones_header() {
        use acm_core_nostd::wire::client::{ClientRequest, EpInfoType, PathQuery, FLAGS_NODELAY};
        let i = inbox();
        let mut hand = Box::new(Queued::blank());
        let long = ClientRequest::resolve(0x1111_2222_3333_4444)
            .dest(0, EpInfoType::Name, b"hca4")
            .source(EpInfoType::Name, b"hca3");
        assert!(request(
            &i,
            EpId(1),
            ep_number(3, 1),
            40,
            Kind::Resolve,
            long.bytes()
        ));
        assert!(i.take_request_into(&mut hand));
        assert_eq!((hand.head.client, usize::from(hand.len)), (40, long.len()));
        assert_eq!(&hand.msg[..long.len()], long.bytes());
        // A PATH request (88 bytes) into the same buffer: its bytes, its header.
        let path = ClientRequest::path(0x5555_6666_7777_8888, FLAGS_NODELAY, &PathQuery::lid(6));
        assert!(request(
            &i,
            EpId(2),
            ep_number(3, 2),
            41,
            Kind::Resolve,
            path.bytes()
        ));
        assert!(i.take_request_into(&mut hand));
        assert_eq!(
            (hand.head.ep, hand.head.cache_ep, hand.head.client),
            (EpId(2), ep_number(3, 2), 41)
        );
        assert_eq!(&hand.msg[..usize::from(hand.len)], path.bytes());
        // Ten bytes: the rest of the header is zero, not the PATH request's TID.
        assert!(request(
            &i,
            EpId(2),
            ep_number(3, 2),
            42,
            Kind::Resolve,
            &path.bytes()[..10]
        ));
        assert!(i.take_request_into(&mut hand));
        assert_eq!(hand.len, 10);
        assert_eq!(&hand.msg[..10], &path.bytes()[..10]);
        assert_eq!(&hand.msg[10..HDR_LEN], &[0u8; HDR_LEN - 10]);
        let mut out = MsgBuf::new();
        let a = hand
            .answer(Status::Einval, &mut out)
            .expect("a resolve is answered");
        assert_eq!(a.client, 42);
        assert_eq!(
            &out.message(&a)[8..10],
            &path.bytes()[8..10],
            "its own two bytes of the TID"
        );
        assert_eq!(
            &out.message(&a)[10..HDR_LEN],
            &[0u8; 6],
            "none of an earlier request's"
        );
        // Through a queue slot (the staging buffer taken) the same holds.
        assert!(request(
            &i,
            EpId(0),
            ep_number(0, 0),
            43,
            Kind::Resolve,
            long.bytes()
        ));
        assert!(request(
            &i,
            EpId(0),
            ep_number(0, 0),
            44,
            Kind::Resolve,
            path.bytes()
        ));
        assert!(i.take_request_into(&mut hand) && hand.head.client == 43);
        assert!(i.take_request_into(&mut hand) && hand.head.client == 44);
        assert_eq!(&hand.msg[..usize::from(hand.len)], path.bytes());
        assert!(!i.take_request_into(&mut hand), "none left");
    }

    /// A request's message is copied once on its way into the loop: into a buffer, in place;
    /// taking it swaps that buffer with the taker's, so the bytes the loop reads are the ones
    /// the caller wrote, where it wrote them (staged or queued), and no buffer is lost or
    /// made: the staging buffer and the taker's alternate, and a queued request's buffer
    /// comes back to the spares.
    #[test]
    fn a_request_is_written_once_and_taken_by_swapping_buffers() {
        let i = inbox();
        let mut mine = Box::new(Queued::blank());
        let first: *const Queued = &*mine;
        let at_stage = || {
            let g = lock(&i.requests.stage.item);
            &**g as *const Queued
        };
        let staged = at_stage();
        assert!(hand(&i, 1));
        assert!(i.take_request_into(&mut mine));
        assert_eq!(mine.head.client, 1);
        assert!(std::ptr::eq(&*mine, staged), "the staging buffer itself");
        assert!(std::ptr::eq(at_stage(), first), "mine took its place");
        // Queued behind a staged one: it is written into a spare buffer, which the taker
        // gets, and the taker's buffer becomes a spare.
        let spares: Vec<Box<Queued>> = std::iter::from_fn(|| i.requests.spare.pop()).collect();
        let spare_at: Vec<*const Queued> = spares.iter().map(|b| &**b as *const Queued).collect();
        for b in spares {
            assert!(i.requests.spare.push(b).is_ok());
        }
        assert!(hand(&i, 2) && hand(&i, 3));
        assert_eq!(i.requests.spare.len(), 7, "one spare in the queue");
        let before: *const Queued = &*mine;
        assert!(
            i.take_request_into(&mut mine) && mine.head.client == 2,
            "the staged one first"
        );
        let before_queued: *const Queued = &*mine;
        assert!(i.take_request_into(&mut mine) && mine.head.client == 3);
        assert!(
            spare_at.contains(&(&*mine as *const Queued)),
            "the spare it was written into"
        );
        assert_eq!(
            i.requests.spare.len(),
            8,
            "the taker's buffer is a spare now"
        );
        assert!(!std::ptr::eq(before, before_queued));
    }

    /// An item alone goes into the staging buffer, not into a queue slot; behind it the
    /// queue keeps the order.
    #[test]
    fn an_item_alone_goes_through_the_staging_buffer() {
        let f = Staged::<u32>::new(2);
        let put = |v: u32| move |slot: &mut u32| *slot = v;
        let pop = || f.pop_with(|v| *v);
        assert!(f.is_empty() && pop().is_none());
        assert!(f.push_with(put(1)));
        assert!(f.queue.is_empty() && !f.is_empty(), "staged");
        assert_eq!(pop(), Some(1));
        assert!(f.is_empty());
        assert!(f.push_with(put(2)) && f.push_with(put(3)) && f.push_with(put(4)));
        assert!(!f.push_with(put(5)), "1 staged + 2 queued");
        assert_eq!(f.queue.len(), 2);
        assert_eq!([pop(), pop()], [Some(2), Some(3)]);
        // The staging buffer free, the queue not: 6 goes behind 4.
        assert!(f.push_with(put(6)));
        assert_eq!(f.queue.len(), 2);
        assert_eq!([pop(), pop(), pop()], [Some(4), Some(6), None]);
    }

    fn reply(token: u64) -> SaReply {
        SaReply {
            token,
            umad_status: 0,
            mad: [token as u8; 256],
            handed: 0,
        }
    }

    /// SA replies leave in the order they came, 1 staged + the queue's capacity; one more
    /// is dropped and counted.
    #[test]
    fn sa_replies_keep_their_order_and_a_full_queue_drops_and_counts() {
        let i = inbox();
        assert!((0..9).all(|t| i.reply(reply(t))));
        assert!(!i.reply_with(|| reply(9)));
        assert_eq!(i.reply_drops.load(Ordering::Relaxed), 1);
        let mut r = Box::new(SaReply::blank());
        let got: Vec<(u64, u8)> =
            std::iter::from_fn(|| i.take_reply_into(&mut r).then(|| (r.token, r.mad[255])))
                .collect();
        assert_eq!(got, (0..9).map(|t| (t, t as u8)).collect::<Vec<_>>());
        assert!(!i.waiting());
    }
}
