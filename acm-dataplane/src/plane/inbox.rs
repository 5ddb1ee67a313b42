//! The queues into the loop, shared with the core's threads, and what travels in them: client
//! requests ([`Request`], main thread), SA completions of the core's transport ([`SaReply`],
//! SA thread) and the rare control messages ([`Control`], main thread), the last two kinds of
//! the main thread in one ticket order.

use super::Ud;
use crate::stats::MissStamp;
use crate::worker::Waker;
use acm_core_nostd::cache::AddrKind;
use acm_core_nostd::resolver::request::{respond, Target};
use acm_core_nostd::resolver::{Answer, EpConfig, EpId, Kind, Via, MSG_LEN};
use acm_core_nostd::wire::client::Status;
use acm_core_nostd::wire::gid::Gid;
use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
/// A client request handed from the core's main thread.
pub struct Request {
    /// Endpoint it arrived on.
    pub ep: EpId,
    /// The endpoint's cache number at the time of the call
    /// ([`ep_number`](acm_core_nostd::cache::ep_number): flush generation, slot).
    pub cache_ep: u32,
    /// The core's client index.
    pub client: u64,
    /// Call kind.
    pub kind: Kind,
    /// Its place in the main thread's order of requests and control messages: the loop
    /// applies every control message with a smaller ticket first, and none with a larger one.
    pub ticket: u64,
    /// Valid length of `msg`.
    pub len: u16,
    /// A copy of the client message (the core's buffer dies when the call returns).
    pub msg: [u8; MSG_LEN],
    /// When a missed `resolve()` started, for its latency (`None`: not timed).
    pub stamp: Option<MissStamp>,
    /// How the caller's front classified it (`request::classify`, with the endpoint's view at
    /// `cache_ep`), so the loop does not parse it again; `None` for a query, or a caller
    /// without a front.
    pub target: Option<Target>,
}

impl Request {
    /// This request's answer with `status` and no path, for one the resolver never took
    /// (shutdown, no resolver, a stalled loop); `None` for a Prime or Refresh, which was
    /// answered when it was made.
    pub fn answer(&self, status: Status) -> Option<Answer> {
        let via = match self.kind {
            Kind::Resolve => Via::Resolve,
            Kind::Query => Via::Query,
            Kind::Prime | Kind::Refresh => return None,
        };
        let mut msg = [0u8; MSG_LEN];
        let len = respond(
            &self.msg[..usize::from(self.len)],
            via,
            status,
            None,
            &mut msg,
        );
        Some(Answer {
            ep: self.ep,
            client: self.client,
            via,
            status,
            len,
            msg,
        })
    }
}

/// What a caller hands the loop with [`Inbox::hand_over`]: a client request and what its
/// front already knows of it.
pub struct HandOver<'m> {
    /// Endpoint it arrived on.
    pub ep: EpId,
    /// The endpoint's cache number at the time of the call.
    pub cache_ep: u32,
    /// The core's client index.
    pub client: u64,
    /// Call kind.
    pub kind: Kind,
    /// The client message.
    pub msg: &'m [u8],
    /// When a missed `resolve()` started, for its latency (`None`: not timed).
    pub stamp: Option<MissStamp>,
    /// The front's classification, if it made one.
    pub target: Option<Target>,
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
        cache_ep: u32,
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
        cache_ep: u32,
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

/// The queues into the loop (shared with the core's threads).
pub struct Inbox {
    /// Client requests (main thread → loop), behind the one in `direct`.
    requests: ArrayQueue<Request>,
    /// A request handed over while `requests` was empty: taken before anything queued (its
    /// ticket is older than what is queued after it). The same buffer every time, so its
    /// cache lines stay with the thread that hands over and then runs the round (a missed
    /// `resolve()`), where a queue slot, a different one each time and thousands apart, is
    /// cold. `direct_full` says whether it holds one without taking the lock.
    direct: CachePadded<Mutex<Option<Request>>>,
    direct_full: AtomicBool,
    /// SA replies (SA thread → loop).
    pub replies: ArrayQueue<SaReply>,
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
            requests: ArrayQueue::new(requests.max(1)),
            direct: CachePadded::new(Mutex::new(None)),
            direct_full: AtomicBool::new(false),
            replies: ArrayQueue::new(replies.max(1)),
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
    /// [`Inbox::request`] refuses it and the caller answers it at once.
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

    /// Hands a request to the loop; false if the queue is full (counted), or the loop is
    /// stopped ([`Inbox::is_stopped`]) or stalled ([`Inbox::is_stalled`]).
    pub fn request(&self, ep: EpId, cache_ep: u32, client: u64, kind: Kind, msg: &[u8]) -> bool {
        self.hand_over(HandOver {
            ep,
            cache_ep,
            client,
            kind,
            msg,
            stamp: None,
            target: None,
        })
    }

    /// [`Inbox::request`] with what the caller's front knows: the start of a missed
    /// `resolve()`, whose answer's latency the loop then records, and the request's
    /// classification, which the loop then does not redo.
    pub fn hand_over(&self, h: HandOver<'_>) -> bool {
        let HandOver {
            ep,
            cache_ep,
            client,
            kind,
            msg,
            stamp,
            target,
        } = h;
        if self.is_stopped() || self.is_stalled() {
            return false;
        }
        let n = msg.len().min(MSG_LEN);
        let ticket = self.tickets.fetch_add(1, Ordering::AcqRel);
        let request = || {
            let mut copy = [0u8; MSG_LEN];
            copy[..n].copy_from_slice(&msg[..n]);
            Request {
                ep,
                cache_ep,
                client,
                kind,
                ticket,
                len: n as u16,
                msg: copy,
                stamp,
                target,
            }
        };
        // The direct slot if nothing is queued and it is free, else the queue.
        if !self.direct_full.load(Ordering::Acquire) && self.requests.is_empty() {
            let mut slot = lock(&self.direct);
            if slot.is_none() {
                *slot = Some(request());
                self.direct_full.store(true, Ordering::Release);
                drop(slot);
                self.waker.serve();
                return true;
            }
        }
        match self.requests.push(request()) {
            Ok(()) => {
                self.waker.serve();
                true
            }
            Err(_) => {
                self.overflows.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// The oldest request handed over and not taken yet: the direct slot's, else the queue's
    /// first (the loop, and the watchdog answering what a stuck loop left).
    pub(crate) fn take_request(&self) -> Option<Request> {
        if self.direct_full.load(Ordering::Acquire) {
            let mut slot = lock(&self.direct);
            if let Some(r) = slot.take() {
                self.direct_full.store(false, Ordering::Release);
                return Some(r);
            }
        }
        self.requests.pop()
    }

    /// Whether requests wait to be taken.
    pub(crate) fn has_requests(&self) -> bool {
        self.direct_full.load(Ordering::Acquire) || !self.requests.is_empty()
    }

    /// Hands an SA completion to the loop (SA thread); false if the queue was full.
    pub fn reply(&self, r: SaReply) -> bool {
        let ok = self.replies.push(r).is_ok();
        if !ok {
            self.reply_drops.fetch_add(1, Ordering::Relaxed);
        }
        // Handed over, never run here: the round would answer clients, and an answer blocks on
        // a client that does not read its socket; the core's SA thread, which every port's
        // SA traffic needs, must not wait on one. (The loop expects the reply: it polls for it.)
        self.waker.wake();
        ok
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

    fn hand(i: &Inbox, client: u64) -> bool {
        i.request(EpId(0), 0, client, Kind::Resolve, &[0u8; 24])
    }

    fn taken(i: &Inbox) -> Vec<(u64, u64)> {
        std::iter::from_fn(|| i.take_request())
            .map(|r| (r.client, r.ticket))
            .collect()
    }

    /// The direct slot is taken before the queue, and only an empty queue sends a request to
    /// it: requests leave in the order they came, their tickets ascending.
    #[test]
    fn requests_leave_in_the_order_they_came_through_the_direct_slot_and_the_queue() {
        let i = inbox();
        assert!(!i.has_requests());
        assert!(hand(&i, 1), "direct");
        assert!(hand(&i, 2), "queued behind it");
        assert!(i.has_requests());
        assert_eq!(taken(&i), [(1, 0), (2, 1)]);
        assert!(!i.has_requests());
        // The queue not empty: a request goes behind it, even with the direct slot free.
        assert!(hand(&i, 3));
        assert!(hand(&i, 4));
        assert_eq!(i.take_request().map(|r| r.client), Some(3));
        assert!(hand(&i, 5));
        assert_eq!(taken(&i), [(4, 3), (5, 4)]);
        // A full queue with the direct slot taken refuses (the caller answers ENOMEM).
        assert!((10..19).all(|c| hand(&i, c)), "1 direct + 8 queued");
        assert!(!hand(&i, 19));
        assert_eq!(i.overflows.load(Ordering::Relaxed), 1);
        assert_eq!(taken(&i).len(), 9);
    }
}
