//! The resolver's slabs (fixed arrays of slots: requests, jobs, addresses, endpoints, preloads),
//! in caller-provided storage.
//!
//! Every slab is a slice of fixed-size slots whose empty state is all zero bytes (links are
//! `index + 1`, 0 = none; every enum's first variant is 0, `Status::Success` and
//! `AddressType::Invalid` among them), so [`ArrayStorage`] can sit in
//! `.bss` on firmware. Slots are threaded on intrusive doubly linked lists ([`List`]): waiter
//! FIFOs, the answer FIFO, the SA backlog, send queues, free lists. No list ever needs memory of
//! its own, which is why no output the resolver owes can be lost to a full queue.
//!
//! [`Storage::into_slabs`] splits the storage once, when the resolver is made: from then on
//! each slab belongs to one part (the request slots to the answers, the jobs to the route
//! jobs, the address entries to their part, the endpoint slots and preloads to the
//! endpoints). Where a list threaded through one part's slab is held in another part's slot
//! (a job's waiters over the request slots, an endpoint's ACM queue and a job's addresses over
//! the address entries), the part that edits it is lent the other part's slab (or slot) for
//! the call.

use super::{Millis, MSG_LEN};
use crate::cache::hash::hash_words;
use crate::cache::{ep_number, CacheEp, Constraints};
use crate::wire::acm_mad::AddressType;
use crate::wire::client::Status;
use core::ops::{Deref, DerefMut};

/// The bucket of a hashed index (address entries, route jobs) of `buckets` buckets: a hash of
/// one head word (the endpoint slot and a small field) and a 64-byte key block read as 16
/// little-endian words, mapped onto the buckets by a multiply, not a division (a 64-bit
/// division is a library call on a 32-bit microcontroller).
pub(crate) fn bucket_of(seed: u64, head: u32, block: &[u8; 64], buckets: usize) -> usize {
    let mut w = [0u32; 17];
    w[0] = head;
    for (d, c) in w[1..].iter_mut().zip(block.chunks_exact(4)) {
        *d = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    let h = hash_words(seed, &w);
    ((u64::from((h ^ (h >> 32)) as u32) * buckets as u64) >> 32) as usize
}

/// An entry of a chained hash index over the caller's storage: its chain link is `hnext`
/// (the next entry's index + 1, 0 = the chain's end), the buckets hold each chain's first
/// entry the same way. The address entries' index and the route jobs' coalescing index are two.
pub(crate) trait Chained {
    fn hnext(&self) -> u32;
    fn set_hnext(&mut self, next: u32);
}

/// The chained hash indexes' walks (see [`Chained`]).
pub(crate) mod chain {
    use super::Chained;

    /// The first entry of bucket `b`'s chain that `hit` takes.
    pub(crate) fn find<T: Chained>(
        entries: &[T],
        buckets: &[u32],
        b: usize,
        mut hit: impl FnMut(&T) -> bool,
    ) -> Option<u32> {
        let mut cur = buckets[b];
        while let Some(i) = cur.checked_sub(1) {
            let e = &entries[i as usize];
            if hit(e) {
                return Some(i);
            }
            cur = e.hnext();
        }
        None
    }

    /// Puts entry `i` at the head of bucket `b`'s chain.
    pub(crate) fn insert<T: Chained>(entries: &mut [T], buckets: &mut [u32], b: usize, i: u32) {
        entries[i as usize].set_hnext(buckets[b]);
        buckets[b] = i + 1;
    }

    /// Takes entry `i` out of bucket `b`'s chain (nothing if it is not on it).
    pub(crate) fn remove<T: Chained>(entries: &mut [T], buckets: &mut [u32], b: usize, i: u32) {
        let mut cur = buckets[b];
        let mut prev: Option<u32> = None;
        while let Some(c) = cur.checked_sub(1) {
            let next = entries[c as usize].hnext();
            if c == i {
                match prev {
                    Some(p) => entries[p as usize].set_hnext(next),
                    None => buckets[b] = next,
                }
                entries[i as usize].set_hnext(0);
                return;
            }
            prev = Some(c);
            cur = next;
        }
    }
}

impl Chained for JobSlot {
    fn hnext(&self) -> u32 {
        self.hnext
    }
    fn set_hnext(&mut self, next: u32) {
        self.hnext = next;
    }
}

impl Chained for AddrEntry {
    fn hnext(&self) -> u32 {
        self.hnext
    }
    fn set_hnext(&mut self, next: u32) {
        self.hnext = next;
    }
}

/// A link of an intrusive list: neighbours as `index + 1` (0 = none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Link {
    pub(crate) prev: u32,
    pub(crate) next: u32,
    /// Which list the slot is on (`ListId`, 0 = none): a cheap guard against double inserts.
    pub(crate) on: u8,
}

impl Link {
    pub(crate) const NONE: Link = Link {
        prev: 0,
        next: 0,
        on: 0,
    };
}

/// Which [`Link`] of a slot type a list threads through (a slot may sit on one list per link).
pub(crate) struct LinkOf<T> {
    get: fn(&T) -> &Link,
    get_mut: fn(&mut T) -> &mut Link,
}

impl<T> Clone for LinkOf<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for LinkOf<T> {}

/// A request slot's link (waiter FIFOs, the answer FIFO, the free list).
pub(crate) const REQ: LinkOf<RequestSlot> = LinkOf {
    get: |r| &r.link,
    get_mut: |r| &mut r.link,
};
/// A route job's link (the backlog, the SA lists, the free list).
pub(crate) const JOB: LinkOf<JobSlot> = LinkOf {
    get: |j| &j.qlink,
    get_mut: |j| &mut j.qlink,
};
/// An address entry's queue link (its endpoint's ACM queue, in-flight or local list, the
/// removal list, the free list).
pub(crate) const ADDR_Q: LinkOf<AddrEntry> = LinkOf {
    get: |a| &a.qlink,
    get_mut: |a| &mut a.qlink,
};
/// An address entry's send link (the ACM send list).
pub(crate) const ADDR_S: LinkOf<AddrEntry> = LinkOf {
    get: |a| &a.slink,
    get_mut: |a| &mut a.slink,
};
/// An address entry's route link (the addresses of a route job).
pub(crate) const ADDR_R: LinkOf<AddrEntry> = LinkOf {
    get: |a| &a.rlink,
    get_mut: |a| &mut a.rlink,
};

/// An intrusive FIFO over one slab (head/tail as `index + 1`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct List {
    pub(crate) head: u32,
    pub(crate) tail: u32,
    pub(crate) len: u32,
}

impl List {
    pub(crate) const EMPTY: List = List {
        head: 0,
        tail: 0,
        len: 0,
    };

    pub(crate) fn is_empty(&self) -> bool {
        self.head == 0
    }

    pub(crate) fn front(&self) -> Option<u32> {
        self.head.checked_sub(1)
    }

    /// Appends slot `i`, tagging it with `id` (a slot already on a list is left alone).
    pub(crate) fn push_back<T>(&mut self, s: &mut [T], i: u32, id: u8, f: LinkOf<T>) {
        let l = (f.get_mut)(&mut s[i as usize]);
        if l.on != 0 {
            return;
        }
        *l = Link {
            prev: self.tail,
            next: 0,
            on: id,
        };
        match self.tail.checked_sub(1) {
            Some(t) => (f.get_mut)(&mut s[t as usize]).next = i + 1,
            None => self.head = i + 1,
        }
        self.tail = i + 1;
        self.len += 1;
    }

    /// Links slot `i` in just before slot `at` of this list, or at the back for `None`
    /// (a slot already on a list is left alone).
    pub(crate) fn insert_before<T>(
        &mut self,
        s: &mut [T],
        i: u32,
        at: Option<u32>,
        id: u8,
        f: LinkOf<T>,
    ) {
        let Some(a) = at else {
            return self.push_back(s, i, id, f);
        };
        if (f.get)(&s[i as usize]).on != 0 {
            return;
        }
        let prev = (f.get)(&s[a as usize]).prev;
        *(f.get_mut)(&mut s[i as usize]) = Link {
            prev,
            next: a + 1,
            on: id,
        };
        (f.get_mut)(&mut s[a as usize]).prev = i + 1;
        match prev.checked_sub(1) {
            Some(p) => (f.get_mut)(&mut s[p as usize]).next = i + 1,
            None => self.head = i + 1,
        }
        self.len += 1;
    }

    /// Unlinks slot `i` if it is on this list (`id`); true if it was.
    pub(crate) fn remove<T>(&mut self, s: &mut [T], i: u32, id: u8, f: LinkOf<T>) -> bool {
        let l = *(f.get)(&s[i as usize]);
        if l.on != id || id == 0 {
            return false;
        }
        match l.prev.checked_sub(1) {
            Some(p) => (f.get_mut)(&mut s[p as usize]).next = l.next,
            None => self.head = l.next,
        }
        match l.next.checked_sub(1) {
            Some(n) => (f.get_mut)(&mut s[n as usize]).prev = l.prev,
            None => self.tail = l.prev,
        }
        *(f.get_mut)(&mut s[i as usize]) = Link::NONE;
        self.len -= 1;
        true
    }

    pub(crate) fn pop_front<T>(&mut self, s: &mut [T], id: u8, f: LinkOf<T>) -> Option<u32> {
        let i = self.front()?;
        self.remove(s, i, id, f);
        Some(i)
    }

    /// Moves every slot of `other` to the back of this list, in order, leaving `other` empty.
    pub(crate) fn append<T>(&mut self, other: &mut List, s: &mut [T], id: u8, f: LinkOf<T>) {
        while let Some(i) = other.pop_front(s, id, f) {
            self.push_back(s, i, id, f);
        }
    }

    /// The slot after `i` on its list.
    pub(crate) fn next_of<T>(s: &[T], i: u32, f: LinkOf<T>) -> Option<u32> {
        (f.get)(&s[i as usize]).next.checked_sub(1)
    }

    /// The slots of this list, front to back.
    pub(crate) fn iter<'s, T>(&self, s: &'s [T], f: LinkOf<T>) -> impl Iterator<Item = u32> + 's {
        let mut cur = self.front();
        core::iter::from_fn(move || {
            let i = cur?;
            cur = List::next_of(s, i, f);
            Some(i)
        })
    }
}

/// List ids (the `Link::on` tag). One per list kind; a slot is on at most one list per link.
///
/// Timer order: every list a timed slot sits on is FIFO in deadline order (deadlines are
/// `now + constant` when a slot is appended: the backlog, the SA send and sent lists, an
/// endpoint's ACM queue and in-flight list), so a timer fire looks at list heads only; BUSY
/// jobs (backoffs differ) are the one list scanned whole.
pub(crate) mod list_id {
    pub(crate) const FREE: u8 = 1;
    pub(crate) const WAITERS: u8 = 2;
    pub(crate) const ANSWERS: u8 = 3;
    pub(crate) const BACKLOG: u8 = 4;
    pub(crate) const SA_SEND: u8 = 5;
    pub(crate) const ACM_QUEUE: u8 = 6;
    pub(crate) const ACM_INFLIGHT: u8 = 7;
    pub(crate) const ACM_SEND: u8 = 8;
    pub(crate) const ROUTE_ADDRS: u8 = 9;
    pub(crate) const LOCALS: u8 = 10;
    pub(crate) const REMOVALS: u8 = 11;
    pub(crate) const SENT: u8 = 12;
    pub(crate) const BUSY: u8 = 13;
}

/// What a request slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ReqState {
    Free = 0,
    /// Waiting on a route job or an address entry.
    Waiting,
    /// Answered; on the answer FIFO until polled.
    Answer,
}

/// One client request (a copy of its message) until its answer is polled.
#[derive(Clone, Copy, Debug)]
pub struct RequestSlot {
    pub(crate) state: ReqState,
    pub(crate) query: bool,
    /// The endpoint it came on.
    pub(crate) ep: super::EpId,
    pub(crate) status: Status,
    pub(crate) has_path: bool,
    pub(crate) len: u16,
    pub(crate) client: u64,
    pub(crate) link: Link,
    pub(crate) path: [u8; 64],
    pub(crate) msg: [u8; MSG_LEN],
}

impl RequestSlot {
    /// An empty slot (all zero bytes).
    pub const EMPTY: RequestSlot = RequestSlot {
        state: ReqState::Free,
        query: false,
        ep: super::EpId(0),
        status: Status::Success,
        has_path: false,
        len: 0,
        client: 0,
        link: Link::NONE,
        path: [0; 64],
        msg: [0; MSG_LEN],
    };
}

/// Where a route job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum JobState {
    Free = 0,
    /// Waiting for an SA window slot (FIFO, with a deadline).
    Backlog,
    /// Decided to send; on the SA send list until polled.
    Send,
    /// Polled: the caller holds the MAD; waiting for `handle_sa`.
    Sent,
    /// The SA said BUSY: re-send with a new TID at `timer`.
    Busy,
    /// Answered (deadline, close) while the caller still holds its MAD: keeps its window slot
    /// until `handle_sa` gives the MAD back.
    Zombie,
}

/// A path key stored as plain fields (an all-zero slot is "no key").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoredKey {
    /// 0 = none, 1 = LID, 2 = GID.
    pub(crate) kind: u8,
    pub(crate) lid: u16,
    pub(crate) gid: [u8; 16],
    pub(crate) constraints: Constraints,
}

impl StoredKey {
    pub(crate) const NONE: StoredKey = StoredKey {
        kind: 0,
        lid: 0,
        gid: [0; 16],
        constraints: Constraints::ANY,
    };
}

/// Who joins a route job (`Resolver::join_route`): a client request to answer, an address
/// entry to alias on success, both, or neither (the route is only started or renewed).
#[derive(Clone, Copy)]
pub(crate) struct Joiner {
    /// The request slot the job answers.
    pub(crate) waiter: Option<u32>,
    /// The address entry the job's path is aliased to.
    pub(crate) addr: Option<u32>,
}

impl Joiner {
    /// Nobody: the route is only started or renewed.
    pub(crate) const NONE: Joiner = Joiner {
        waiter: None,
        addr: None,
    };

    /// Request slot `w` waits for the answer.
    pub(crate) fn waiter(w: u32) -> Joiner {
        Joiner {
            waiter: Some(w),
            addr: None,
        }
    }

    /// Address entry `i` is aliased to the path.
    pub(crate) fn addr(i: u32) -> Joiner {
        Joiner {
            waiter: None,
            addr: Some(i),
        }
    }
}

/// One SA PathRecord resolution: a coalescing key with its waiters.
#[derive(Clone, Copy, Debug)]
pub struct JobSlot {
    pub(crate) state: JobState,
    /// A `query()` pass-through: never coalesced, never cached.
    pub(crate) query: bool,
    /// The caller holds a MAD of this job (sent, not handed back yet).
    pub(crate) held: bool,
    /// The endpoint's slot (not its `EpId`).
    pub(crate) slot: u8,
    pub(crate) cache_ep: CacheEp,
    pub(crate) busy_tries: u32,
    pub(crate) tid: u32,
    pub(crate) hnext: u32,
    /// The reply deadline while Send or Sent, the end of the backoff while Busy (a backlogged
    /// job's deadline is derived from `born`: `SaWindow::deadline`).
    pub(crate) timer: Millis,
    /// When the job started: its deadline runs from here (`SaWindow::deadline`).
    pub(crate) born: Millis,
    /// When its query last went out (for the SA round-trip estimate).
    pub(crate) sent: Millis,
    pub(crate) key: StoredKey,
    pub(crate) waiters: List,
    /// Address entries whose route this is (aliased on success).
    pub(crate) addrs: List,
    pub(crate) qlink: Link,
    pub(crate) sa: [u8; 64],
}

impl JobSlot {
    /// An empty slot (all zero bytes).
    pub const EMPTY: JobSlot = JobSlot {
        state: JobState::Free,
        query: false,
        held: false,
        slot: 0,
        cache_ep: ep_number(0, 0),
        busy_tries: 0,
        tid: 0,
        hnext: 0,
        timer: 0,
        born: 0,
        sent: 0,
        key: StoredKey::NONE,
        waiters: List::EMPTY,
        addrs: List::EMPTY,
        qlink: Link::NONE,
        sa: [0; 64],
    };
}

/// Where an address entry is (ibacmp's dest states; see `docs/resolver.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum AddrState {
    Free = 0,
    /// QUERY_ADDR, waiting for an ACM window slot or for the endpoint's join (FIFO, deadline).
    Queued,
    /// QUERY_ADDR, multicast request out; retried on `timer`.
    Querying,
    /// ADDR_RESOLVED (QUERY_ROUTE while `job != 0`, READY once the route is cached).
    Resolved,
    /// One of the endpoint's own addresses.
    Local,
    /// A removed local address whose loopback alias is still to be dropped from the cache.
    Removing,
}

/// Where an address mapping came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Origin {
    /// Learned from the ACM protocol (a response, or a peer's request).
    Learned = 0,
    /// The hosts file (`addr_preload`).
    Preload,
}

/// One destination address (endpoint, type, 64 bytes): ibacmp's `acmp_dest` address half.
#[derive(Clone, Copy, Debug)]
pub struct AddrEntry {
    pub(crate) state: AddrState,
    pub(crate) origin: Origin,
    /// The endpoint's slot (not its `EpId`).
    pub(crate) slot: u8,
    /// The address's type: `ACM_ADDRESS_*` 1..=5 (a peer may name itself by GID or LID).
    pub(crate) type_: AddressType,
    /// Our outstanding ACM request wants (re)sending.
    pub(crate) send_query: bool,
    /// A response to this peer's request wants sending.
    pub(crate) send_resp: bool,
    /// Index + 1 of our group shared with the peer (0 = unknown).
    pub(crate) group: u8,
    pub(crate) resp_group: u8,
    /// The type of `src`, the client's source address for our request (`Invalid`, as on the
    /// wire: none; not an `Option`, whose `None` would not be zero bytes).
    pub(crate) src_type: AddressType,
    pub(crate) path_bits: u8,
    pub(crate) cache_ep: CacheEp,
    pub(crate) lid: u16,
    pub(crate) qpn: u32,
    pub(crate) tries: u32,
    /// Route job (index + 1) this address waits on, 0 = none.
    pub(crate) job: u32,
    pub(crate) hnext: u32,
    pub(crate) tid: u64,
    pub(crate) resp_tid: u64,
    /// Address mapping expiry (`u64::MAX` = never).
    pub(crate) expires: Millis,
    pub(crate) timer: Millis,
    pub(crate) waiters: List,
    /// Endpoint queue / in-flight / local list, the removal list, or the free list.
    pub(crate) qlink: Link,
    pub(crate) slink: Link,
    pub(crate) rlink: Link,
    pub(crate) gid: [u8; 16],
    pub(crate) addr: [u8; 64],
    pub(crate) src: [u8; 64],
}

impl AddrEntry {
    /// An empty slot (all zero bytes).
    pub const EMPTY: AddrEntry = AddrEntry {
        state: AddrState::Free,
        origin: Origin::Learned,
        slot: 0,
        type_: AddressType::Invalid,
        send_query: false,
        send_resp: false,
        group: 0,
        resp_group: 0,
        src_type: AddressType::Invalid,
        path_bits: 0,
        cache_ep: ep_number(0, 0),
        lid: 0,
        qpn: 0,
        tries: 0,
        job: 0,
        hnext: 0,
        tid: 0,
        resp_tid: 0,
        expires: 0,
        timer: 0,
        waiters: List::EMPTY,
        qlink: Link::NONE,
        slink: Link::NONE,
        rlink: Link::NONE,
        gid: [0; 16],
        addr: [0; 64],
        src: [0; 64],
    };
}

/// Where a multicast group join is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum GroupState {
    /// Not wanted.
    Off = 0,
    /// SET decided; on the endpoint's output flags until polled.
    Send,
    /// SET out, waiting for the SA (deadline `timer`).
    Joining,
    /// Failed: re-send at `timer`.
    Retry,
    /// Joined: `record` is the SA's MCMemberRecord.
    Joined,
}

/// An SA SET that is retried until the SA accepts it (a join, a subscription): its state,
/// TID, tries and timer (the reply deadline while `Joining`, the retry time while `Retry`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SaTry {
    pub(crate) state: GroupState,
    pub(crate) tries: u32,
    pub(crate) tid: u32,
    pub(crate) timer: Millis,
}

impl SaTry {
    pub(crate) const OFF: SaTry = SaTry {
        state: GroupState::Off,
        tries: 0,
        tid: 0,
        timer: 0,
    };

    /// Decided: the SET with `tid` goes out at the next poll, its reply is due by `at`.
    pub(crate) fn send(&mut self, tid: u32, at: Millis) {
        self.state = GroupState::Send;
        self.tid = tid;
        self.timer = at;
    }

    /// Whether a reply with `tid` is the one this SET waits for.
    pub(crate) fn awaits(&self, tid: u32) -> bool {
        self.state == GroupState::Joining && self.tid == tid
    }

    /// The SA accepted it.
    pub(crate) fn accepted(&mut self) {
        self.state = GroupState::Joined;
        self.tries = 0;
    }

    /// Refused or unanswered: retried after 1 s, doubling per failure up to 30 s. Returns
    /// when.
    pub(crate) fn failed(&mut self, now: Millis) -> Millis {
        let wait = (1000u64 << self.tries.min(5)).min(30_000);
        self.tries = self.tries.saturating_add(1);
        self.state = GroupState::Retry;
        self.timer = now.saturating_add(wait);
        self.timer
    }

    /// The timer, if any: the reply deadline of a SET decided (`Send`, set when decided, so
    /// it runs from before the SET is polled) or out (`Joining`), or the retry time.
    pub(crate) fn armed(&self) -> Option<Millis> {
        matches!(
            self.state,
            GroupState::Send | GroupState::Joining | GroupState::Retry
        )
        .then_some(self.timer)
    }

    /// What is due at `now`: `Joining` (the reply is late) or `Retry` (send again); a `Send`
    /// not polled yet waits for its poll.
    pub(crate) fn due(&self, now: Millis) -> Option<GroupState> {
        self.armed().filter(|t| *t <= now).map(|_| self.state)
    }
}

/// One multicast group of an endpoint.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupSlot {
    pub(crate) t: SaTry,
    pub(crate) leave: bool,
    /// The join's MGID parameters: rate, MTU (tos is 0).
    pub(crate) rate: u8,
    pub(crate) mtu: u8,
    pub(crate) record: [u8; 56],
    /// The record a leave (DELETE) still to be sent carries.
    pub(crate) leave_record: [u8; 56],
}

impl GroupSlot {
    pub(crate) const EMPTY: GroupSlot = GroupSlot {
        t: SaTry::OFF,
        leave: false,
        rate: 0,
        mtu: 0,
        record: [0; 56],
        leave_record: [0; 56],
    };
}

/// One SA event subscription (InformInfo) of an endpoint; its states are those of a join
/// (`Send` → `Joining` (SET out) → `Joined` (subscribed) or `Retry`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct InformSlot {
    pub(crate) t: SaTry,
    /// An unsubscribe (SET with Subscribe 0) wants sending.
    pub(crate) leave: bool,
}

impl InformSlot {
    pub(crate) const EMPTY: InformSlot = InformSlot {
        t: SaTry::OFF,
        leave: false,
    };
}

/// One endpoint (port, partition) the resolver serves.
#[derive(Clone, Copy, Debug)]
pub struct EpSlot {
    pub(crate) open: bool,
    /// The endpoint speaks the ACM protocol (a UD QP, and `addr_prot acm` or `route_prot acm`).
    pub(crate) acm: bool,
    /// The endpoint this slot serves (while open; the last one it served once closed).
    pub(crate) id: super::EpId,
    pub(crate) attached: bool,
    pub(crate) force_detach: bool,
    pub(crate) mtu: u8,
    pub(crate) rate: u8,
    pub(crate) lid: u16,
    pub(crate) pkey: u16,
    pub(crate) cache_ep: CacheEp,
    pub(crate) qpn: u32,
    /// [`super::EpConfig::sa_pkey`].
    pub(crate) sa_pkey: bool,
    pub(crate) acm_inflight: u32,
    pub(crate) subnet_timeout: Millis,
    pub(crate) counts: [u32; 7],
    /// Its multicast groups ([`super::groups`]).
    pub(crate) groups: super::groups::Groups,
    /// Its subscriptions to traps 64 and 65 and its Report acknowledgement
    /// ([`super::inform`]).
    pub(crate) informs: super::inform::Informs,
    pub(crate) attached_record: [u8; 56],
    pub(crate) queue: List,
    pub(crate) inflight: List,
    pub(crate) locals: List,
    pub(crate) port_gid: [u8; 16],
    /// The endpoint's half-world PathRecord table ([`super::table`]).
    pub(crate) table: TableFetch,
}

/// Where an endpoint's half-world GetTable stands ([`super::table`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableFetch {
    /// Decided, not yet polled out.
    pub(crate) send: bool,
    /// Out: its answer (or failure) is due.
    pub(crate) sent: bool,
    pub(crate) tid: u32,
    /// No new table before this (after a failure).
    pub(crate) not_before: super::Millis,
    /// Records of the last table (0: none yet).
    pub(crate) records: u32,
    /// Slabs are off for this endpoint: the last one did not fit the caller's storage, or
    /// the transport cannot carry one.
    pub(crate) off: bool,
    /// Route jobs of this endpoint in the backlog.
    pub(crate) backlogged: u32,
    /// A warm-start table is to be asked for at `warm_start_at`.
    pub(crate) warm_start: bool,
    pub(crate) warm_start_at: super::Millis,
    /// The highest LID seen on this endpoint (its own, the DLIDs asked for, the probe's LID
    /// when a port has it): a lower bound on the records of its table while none has come
    /// (OpenSM hands out LIDs from 1 up).
    pub(crate) max_lid: u16,
    /// The probe (a PathRecord Get for the first LID past the table room, before the first
    /// table) is decided, not yet polled out.
    pub(crate) probe_send: bool,
    /// The probe is out: its answer is due.
    pub(crate) probe_sent: bool,
    pub(crate) probe_tid: u32,
    /// The probe found no port at its LID: the subnet fits the table room.
    pub(crate) fits: bool,
    /// The warm-start table waits for the probe: asked for if the probe finds the subnet fits.
    pub(crate) warm_after_probe: bool,
}

impl TableFetch {
    /// A table is decided or out: its endpoint's backlog is held for it, and no other is
    /// asked for.
    pub(crate) fn out(&self) -> bool {
        self.send || self.sent
    }

    /// Nothing asked, nothing known.
    pub const EMPTY: TableFetch = TableFetch {
        send: false,
        sent: false,
        tid: 0,
        not_before: 0,
        records: 0,
        off: false,
        backlogged: 0,
        warm_start: false,
        warm_start_at: 0,
        max_lid: 0,
        probe_send: false,
        probe_sent: false,
        probe_tid: 0,
        fits: false,
        warm_after_probe: false,
    };
}

impl EpSlot {
    /// An empty slot (all zero bytes).
    pub const EMPTY: EpSlot = EpSlot {
        open: false,
        acm: false,
        id: super::EpId(0),
        attached: false,
        force_detach: false,
        mtu: 0,
        rate: 0,
        lid: 0,
        pkey: 0,
        cache_ep: ep_number(0, 0),
        qpn: 0,
        sa_pkey: false,
        acm_inflight: 0,
        subnet_timeout: 0,
        counts: [0; 7],
        groups: super::groups::Groups::EMPTY,
        informs: super::inform::Informs::EMPTY,
        attached_record: [0; 56],
        queue: List::EMPTY,
        inflight: List::EMPTY,
        locals: List::EMPTY,
        port_gid: [0; 16],
        table: TableFetch::EMPTY,
    };
}

/// One preloaded route (`route_preload`): re-inserted after every reregister.
#[derive(Clone, Copy, Debug)]
pub struct PreloadSlot {
    pub(crate) used: bool,
    /// The endpoint's slot (not its `EpId`).
    pub(crate) slot: u8,
    pub(crate) path: [u8; 64],
}

impl PreloadSlot {
    /// An empty slot (all zero bytes).
    pub const EMPTY: PreloadSlot = PreloadSlot {
        used: false,
        slot: 0,
        path: [0; 64],
    };
}

/// How big each slab is (`HeapStorage::new`, with the `std` feature).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacities {
    /// Client requests held at once (waiting, or answered and not polled yet).
    pub requests: usize,
    /// Of `requests`, how many are kept for immediate answers (hits, errors, ENOMEM): a new
    /// waiter is refused ENOMEM once only these are left, so the refusal itself has a slot.
    pub answer_reserve: usize,
    /// Route jobs: distinct route resolutions (coalescing keys) at once, in flight plus
    /// backlog (`acmrs_pending_capacity`).
    pub jobs: usize,
    /// Most SA PathRecord queries in flight (the effective window is
    /// `min(Config::sa_window, sa_inflight, jobs)`).
    pub sa_inflight: usize,
    /// The resolver's address entries (hosts preload, local addresses, learned mappings).
    pub addrs: usize,
    /// Endpoints open at once (at most [`MAX_EPS`](super::MAX_EPS)).
    pub endpoints: usize,
    /// Preloaded routes (`route_preload`) kept for re-insertion after a reregister.
    pub preloads: usize,
}

impl Default for Capacities {
    fn default() -> Self {
        Capacities {
            requests: 16_384,
            answer_reserve: 64,
            jobs: 4096,
            sa_inflight: 256,
            addrs: 65_536,
            endpoints: 16,
            preloads: 4096,
        }
    }
}

/// Every slab of a [`Storage`], each to be owned by the part of the resolver that uses it
/// ([`Storage::into_slabs`]): the request slots by the answers, the route jobs and their
/// buckets by the route jobs' part, the address entries and their buckets by the address
/// entries' part, the endpoint slots and preloaded routes by the endpoints' part.
pub struct Slabs<S: Storage> {
    /// Request slots.
    pub requests: S::Requests,
    /// Route jobs.
    pub jobs: S::Jobs,
    /// Hash buckets of the route jobs (any non-zero length; `Capacities::jobs` is a good size).
    pub job_buckets: S::JobBuckets,
    /// Address entries.
    pub addrs: S::Addrs,
    /// Hash buckets of the address entries (any non-zero length).
    pub addr_buckets: S::AddrBuckets,
    /// Endpoints (at most 256 are used).
    pub endpoints: S::Endpoints,
    /// Preloaded routes.
    pub preloads: S::Preloads,
    /// The most SA queries in flight at once.
    pub sa_inflight: usize,
    /// Request slots kept for immediate answers.
    pub answer_reserve: usize,
}

/// Where the resolver's slabs live: caller-provided slices, split once, when the resolver is
/// made, among the parts that own them for its whole life.
///
/// Each slab has a type of its own: a boxed slice on the heap ([`HeapStorage`]), an array
/// borrowed whole over static tables ([`ArrayStorage`], through [`Fixed`]), whose length
/// the compiler then knows (bounds checks and bucket arithmetic against a constant: fewer
/// instructions and less flash on a microcontroller).
pub trait Storage: Sized {
    /// The request slots.
    type Requests: DerefMut<Target = [RequestSlot]>;
    /// The route jobs.
    type Jobs: DerefMut<Target = [JobSlot]>;
    /// The route jobs' hash buckets.
    type JobBuckets: DerefMut<Target = [u32]>;
    /// The address entries.
    type Addrs: DerefMut<Target = [AddrEntry]>;
    /// The address entries' hash buckets.
    type AddrBuckets: DerefMut<Target = [u32]>;
    /// The endpoint slots.
    type Endpoints: DerefMut<Target = [EpSlot]>;
    /// The preloaded routes.
    type Preloads: DerefMut<Target = [PreloadSlot]>;
    /// Every slab, and the two limits.
    fn into_slabs(self) -> Slabs<Self>;
}

/// An array borrowed whole, seen as a slice of constant length `N`.
pub struct Fixed<'a, T, const N: usize>(&'a mut [T; N]);

impl<T, const N: usize> Deref for Fixed<'_, T, N> {
    type Target = [T];
    #[inline(always)]
    fn deref(&self) -> &[T] {
        self.0
    }
}

impl<T, const N: usize> DerefMut for Fixed<'_, T, N> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        self.0
    }
}

/// Heap storage sized at run time (hosts; needs the `std` feature).
#[cfg(feature = "std")]
pub struct HeapStorage {
    requests: std::boxed::Box<[RequestSlot]>,
    jobs: std::boxed::Box<[JobSlot]>,
    job_buckets: std::boxed::Box<[u32]>,
    addrs: std::boxed::Box<[AddrEntry]>,
    addr_buckets: std::boxed::Box<[u32]>,
    endpoints: std::boxed::Box<[EpSlot]>,
    preloads: std::boxed::Box<[PreloadSlot]>,
    sa_inflight: usize,
    answer_reserve: usize,
}

#[cfg(feature = "std")]
impl HeapStorage {
    /// Slabs of the given sizes (each at least 1; `endpoints` at most 256).
    pub fn new(caps: Capacities) -> Self {
        fn boxed<T: Copy>(v: T, n: usize) -> std::boxed::Box<[T]> {
            std::vec![v; n.max(1)].into_boxed_slice()
        }
        HeapStorage {
            requests: boxed(
                RequestSlot::EMPTY,
                caps.requests.max(caps.answer_reserve + 1),
            ),
            jobs: boxed(JobSlot::EMPTY, caps.jobs),
            job_buckets: boxed(0, caps.jobs),
            addrs: boxed(AddrEntry::EMPTY, caps.addrs),
            addr_buckets: boxed(0, caps.addrs),
            endpoints: boxed(EpSlot::EMPTY, caps.endpoints.min(super::MAX_EPS)),
            preloads: boxed(PreloadSlot::EMPTY, caps.preloads),
            sa_inflight: caps.sa_inflight.max(1),
            answer_reserve: caps.answer_reserve,
        }
    }
}

#[cfg(feature = "std")]
impl Storage for HeapStorage {
    type Requests = std::boxed::Box<[RequestSlot]>;
    type Jobs = std::boxed::Box<[JobSlot]>;
    type JobBuckets = std::boxed::Box<[u32]>;
    type Addrs = std::boxed::Box<[AddrEntry]>;
    type AddrBuckets = std::boxed::Box<[u32]>;
    type Endpoints = std::boxed::Box<[EpSlot]>;
    type Preloads = std::boxed::Box<[PreloadSlot]>;
    fn into_slabs(self) -> Slabs<Self> {
        Slabs {
            requests: self.requests,
            jobs: self.jobs,
            job_buckets: self.job_buckets,
            addrs: self.addrs,
            addr_buckets: self.addr_buckets,
            endpoints: self.endpoints,
            preloads: self.preloads,
            sa_inflight: self.sa_inflight,
            answer_reserve: self.answer_reserve,
        }
    }
}

/// Static storage for firmware: `REQ` request slots (of which `RESERVE` for immediate answers),
/// `JOBS` route jobs (all may be in flight), `ADDRS` address entries, `EPS` endpoints, `PRE`
/// preloaded routes. All zero bytes when empty, so a `static` of it lands in `.bss`. A `&mut`
/// of it is the [`Storage`]: each part of the resolver borrows its slabs for as long as the
/// resolver lives.
pub struct ArrayStorage<
    const REQ: usize,
    const RESERVE: usize,
    const JOBS: usize,
    const ADDRS: usize,
    const EPS: usize,
    const PRE: usize,
> {
    requests: [RequestSlot; REQ],
    jobs: [JobSlot; JOBS],
    job_buckets: [u32; JOBS],
    addrs: [AddrEntry; ADDRS],
    addr_buckets: [u32; ADDRS],
    endpoints: [EpSlot; EPS],
    preloads: [PreloadSlot; PRE],
}

impl<
        const REQ: usize,
        const RESERVE: usize,
        const JOBS: usize,
        const ADDRS: usize,
        const EPS: usize,
        const PRE: usize,
    > ArrayStorage<REQ, RESERVE, JOBS, ADDRS, EPS, PRE>
{
    /// Empty tables (usable in a `static` initialiser).
    pub const fn new() -> Self {
        ArrayStorage {
            requests: [RequestSlot::EMPTY; REQ],
            jobs: [JobSlot::EMPTY; JOBS],
            job_buckets: [0; JOBS],
            addrs: [AddrEntry::EMPTY; ADDRS],
            addr_buckets: [0; ADDRS],
            endpoints: [EpSlot::EMPTY; EPS],
            preloads: [PreloadSlot::EMPTY; PRE],
        }
    }
}

impl<
        const REQ: usize,
        const RESERVE: usize,
        const JOBS: usize,
        const ADDRS: usize,
        const EPS: usize,
        const PRE: usize,
    > Default for ArrayStorage<REQ, RESERVE, JOBS, ADDRS, EPS, PRE>
{
    fn default() -> Self {
        Self::new()
    }
}

impl<
        'a,
        const REQ: usize,
        const RESERVE: usize,
        const JOBS: usize,
        const ADDRS: usize,
        const EPS: usize,
        const PRE: usize,
    > Storage for &'a mut ArrayStorage<REQ, RESERVE, JOBS, ADDRS, EPS, PRE>
{
    type Requests = Fixed<'a, RequestSlot, REQ>;
    type Jobs = Fixed<'a, JobSlot, JOBS>;
    type JobBuckets = Fixed<'a, u32, JOBS>;
    type Addrs = Fixed<'a, AddrEntry, ADDRS>;
    type AddrBuckets = Fixed<'a, u32, ADDRS>;
    type Endpoints = Fixed<'a, EpSlot, EPS>;
    type Preloads = Fixed<'a, PreloadSlot, PRE>;
    fn into_slabs(self) -> Slabs<Self> {
        Slabs {
            requests: Fixed(&mut self.requests),
            jobs: Fixed(&mut self.jobs),
            job_buckets: Fixed(&mut self.job_buckets),
            addrs: Fixed(&mut self.addrs),
            addr_buckets: Fixed(&mut self.addr_buckets),
            endpoints: Fixed(&mut self.endpoints),
            preloads: Fixed(&mut self.preloads),
            sa_inflight: JOBS,
            answer_reserve: RESERVE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy)]
    struct N {
        l: Link,
    }
    const L: LinkOf<N> = LinkOf {
        get: |n| &n.l,
        get_mut: |n| &mut n.l,
    };

    #[test]
    fn list_push_pop_remove() {
        let mut s = [N { l: Link::NONE }; 5];
        let mut a = List::EMPTY;
        for i in 0..5 {
            a.push_back(&mut s, i, 1, L);
        }
        a.push_back(&mut s, 2, 1, L); // already on: ignored
        assert_eq!(a.len, 5);
        assert!(a.remove(&mut s, 2, 1, L));
        assert!(!a.remove(&mut s, 2, 1, L));
        assert!(a.remove(&mut s, 0, 1, L));
        assert!(a.remove(&mut s, 4, 1, L));
        a.push_back(&mut s, 4, 1, L);
        let mut got = [0u32; 3];
        for g in &mut got {
            *g = a.pop_front(&mut s, 1, L).unwrap();
        }
        assert_eq!(got, [1, 3, 4]);
        assert!(a.is_empty() && a.pop_front(&mut s, 1, L).is_none());
    }
}
