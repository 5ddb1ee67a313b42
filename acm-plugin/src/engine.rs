//! The worker's engine: the single owner of all mutable provider state.
//!
//! It drains the request queue (misses from `resolve()`/`query()`), the SA reply queue (copies
//! made on the core's SA thread) and the control list, and drives every request to exactly one
//! answer:
//!
//! * misses for the same (endpoint, constraints) key coalesce on one SA PathRecord GET;
//! * at most `acmrs_pending_capacity` requests wait at once (more → ENOMEM), at most
//!   `8 × sa_depth` (8..=[`MAX_INFLIGHT`]) SA queries are in flight, more wait in a FIFO
//!   backlog (the core itself sends `sa_depth` at a time and queues the rest in an unbounded
//!   list, so keeping only a few in its queue keeps memory bounded on our side);
//! * SA BUSY is retried with exponential backoff (`acmrs_sa_busy_backoff_ms`, `acmrs_sa_retries`
//!   tries); a umad timeout is ETIMEDOUT; a reply that never comes is ETIMEDOUT after the
//!   core's whole retry budget plus a margin;
//! * a closed endpoint answers its waiters ENODATA and loses its routes; shutdown answers all.

use crate::core_api::SaHandler;
use crate::ffi::{
    cntr, AcmEndpoint, AcmSaMad, ACM_STATUS_ENODATA, ACM_STATUS_ENOMEM, ACM_STATUS_ETIMEDOUT,
};
use crate::path::{self, SaOutcome};
use crate::respond::{self, Via};
use crate::state::{
    Cached, Control, DirectReq, DirectSlot, Ep, Kind, LogReason, PreloadedRoute, Request, RouteKey,
    SaReply, Shared, INLINE_SLOTS, NEVER,
};
use acm_core_nostd::cache::hash::hash_words;
use acm_core_nostd::cache::pending::{PendingSlot, Token, WaiterSlot};
use acm_core_nostd::cache::{Begin, CacheKey, PendingTable};
use acm_dataplane::worker::{PollOutcome, Poller};
use core::ffi::c_void;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most SA queries one provider instance keeps in flight (the core queues beyond `sa_depth`).
pub const MAX_INFLIGHT: usize = 256;
const BATCH: usize = 256;
/// Early replies kept for the inline slots (the oldest, stale ones, are dropped first).
const EARLY: usize = 4 * INLINE_SLOTS;

static NEXT_TID: AtomicU32 = AtomicU32::new(1);
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// A fresh (context token, TID) pair for a query on in-flight slot `fi`: the token's low 16
/// bits are the slot, the TID's upper 32 bits are zero (ibacm matches replies on the low 32).
pub fn next_ids(fi: u32) -> (u64, u32) {
    let token = (NEXT_TOKEN.fetch_add(1, Ordering::Relaxed) << 16) | u64::from(fi);
    let mut tid = NEXT_TID.fetch_add(1, Ordering::Relaxed);
    if tid == 0 {
        tid = NEXT_TID.fetch_add(1, Ordering::Relaxed);
    }
    (token, tid)
}

/// Whether `fi` is one of the in-flight slots reserved for `resolve()`'s inline sends.
fn is_inline(fi: u32) -> bool {
    (Shared::INLINE_SLOT..Shared::INLINE_SLOT + INLINE_SLOTS).contains(&(fi as usize))
}

/// The key requests coalesce on in the pending table: the route key, plus a nonce that is 0
/// for every cacheable kind and unique per `query()` request (those never coalesce).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PendKey {
    route: RouteKey,
    nonce: u32,
}

impl CacheKey for PendKey {
    /// The endpoint's cache slot (the low byte of `cache_ep`): unique among live endpoints and
    /// the same across reregister generations, so `cancel_ep` catches every key of an endpoint.
    fn ep(&self) -> u16 {
        self.route.cache_ep & 0xff
    }

    fn hash_with(&self, seed: u64) -> u64 {
        let mut w = [0u32; 20];
        for (d, c) in w.iter_mut().zip(self.route.record.chunks_exact(4)) {
            *d = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        w[16] = self.route.ep_id as u32;
        w[17] = (self.route.ep_id >> 32) as u32;
        w[18] = u32::from(self.route.cache_ep);
        w[19] = self.nonce;
        hash_words(seed, &w)
    }
}

type Pending = PendingTable<PendKey, Box<[PendingSlot<PendKey>]>, Box<[WaiterSlot]>>;

/// A key whose resolution was started (it is in the pending table) but not sent yet.
struct Started {
    key: PendKey,
    /// The request that started the key (its first waiter).
    starter: Token,
    ep: Arc<Ep>,
    record: [u8; 64],
}

struct Inflight {
    key: PendKey,
    starter: Token,
    ep: Arc<Ep>,
    record: [u8; 64],
    mask: u64,
    token: u64,
    tid: u32,
    busy_tries: u32,
    retry_at: Option<Instant>,
    deadline: Instant,
}

/// Answers one request (the worker's side of exactly-once: every request handed to the worker
/// reaches this exactly once, or is answered by `resolve()` already for NODELAY / refresh).
fn answer(sh: &Shared, req: &Request, status: u8, record: Option<&[u8; 64]>) {
    answer_parts(sh, req.kind, &req.ep, req.id, &req.msg, status, record);
}

fn answer_parts(
    sh: &Shared,
    kind: Kind,
    ep: &Ep,
    id: u64,
    msg: &crate::ffi::AcmMsg,
    status: u8,
    record: Option<&[u8; 64]>,
) {
    let api = sh.api;
    match kind {
        Kind::Resolve => {
            ep.count_status(status);
            respond::send(api, Via::Resolve, id, msg, status, record);
        }
        Kind::Query => {
            // ibacmp counts every failed SA answer to a query as an error.
            if status != 0 {
                ep.count(cntr::ERROR);
            }
            respond::send(api, Via::Query, id, msg, status, record);
        }
        Kind::Prime | Kind::Refresh => {}
    }
}

fn lock_direct(m: &std::sync::Mutex<DirectSlot>) -> std::sync::MutexGuard<'_, DirectSlot> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs on the core's SA thread: if `r` is a successful answer to a query whose starter is
/// armed for a direct answer, claims that starter and returns what answering it needs (the
/// caller answers with [`answer_direct`]). Only successes are claimed; everything else (and
/// every coalesced waiter) is answered by the worker.
pub fn claim_direct(sh: &Shared, r: &SaReply) -> Option<(DirectReq, [u8; 64])> {
    if r.token == 0 {
        return None;
    }
    let slot = sh.direct.get((r.token & 0xffff) as usize)?;
    let SaOutcome::Record(rec) = path::classify_reply(r.umad_status, &r.mad) else {
        return None;
    };
    let mut g = lock_direct(slot);
    if g.claimed || g.token != r.token || g.tid != path::tid_low(&r.mad) {
        return None;
    }
    // A closed endpoint's waiters get ENODATA from the worker.
    if g.req
        .as_ref()
        .is_none_or(|d| d.ep.closed.load(Ordering::Acquire))
    {
        return None;
    }
    let d = g.req.take()?;
    g.claimed = true;
    Some((d, rec))
}

/// Answers a starter claimed by [`claim_direct`] with the SA's record (SA thread).
pub fn answer_direct(sh: &Shared, d: &DirectReq, record: &[u8; 64]) {
    answer_parts(sh, d.kind, &d.ep, d.id, &d.msg, 0, Some(record));
}

/// The request slab the pending table's tokens index, with its free list.
struct Requests {
    slots: Vec<Option<Request>>,
    free: Vec<Token>,
}

impl Requests {
    /// Answers and frees the request behind `token` (a no-op for an unknown token).
    fn finish(&mut self, sh: &Shared, token: Token, status: u8, record: Option<&[u8; 64]>) {
        self.finish_unless(sh, token, status, record, None);
    }

    /// As [`Requests::finish`], but only frees `answered` (the SA thread answered it).
    fn finish_unless(
        &mut self,
        sh: &Shared,
        token: Token,
        status: u8,
        record: Option<&[u8; 64]>,
        answered: Option<Token>,
    ) {
        if let Some(req) = self.slots.get_mut(token as usize).and_then(Option::take) {
            self.free.push(token);
            if answered != Some(token) {
                answer(sh, &req, status, record);
            }
        }
    }
}

/// A pending table of `cap` keys and waiters with a fresh hash seed.
fn new_pending(cap: usize) -> Pending {
    let seed = {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(cap);
        h.finish()
    };
    match Pending::new(
        vec![PendingSlot::default(); cap].into_boxed_slice(),
        vec![WaiterSlot::default(); cap].into_boxed_slice(),
        seed,
    ) {
        Ok(p) => p,
        // Capacities are 1..=16M by the options parser; fall back to the smallest table.
        Err(_) => Pending::new(
            vec![PendingSlot::default(); 1].into_boxed_slice(),
            vec![WaiterSlot::default(); 1].into_boxed_slice(),
            seed,
        )
        .unwrap_or_else(|_| unreachable!("a one-entry pending table is valid")),
    }
}

/// The engine (see the module docs).
pub struct Engine {
    sh: Arc<Shared>,
    handler: SaHandler,
    /// Coalescing: one entry per key being resolved, its waiters in arrival order.
    pending: Pending,
    reqs: Requests,
    /// In-flight queries: the worker's own slots `0..n`, then unused ones, and at
    /// [`Shared::INLINE_SLOT`] the ones `resolve()` sent itself (never on the free list).
    inflight: Vec<Option<Inflight>>,
    inflight_free: Vec<u32>,
    /// Per in-flight slot: the token of a MAD the core still holds although its waiters were
    /// already answered (deadline, endpoint closed), 0 = none. Such a slot stays reserved
    /// until the core hands the MAD back (it always does: reply, umad timeout or send
    /// failure), so the MADs held by the core never exceed the number of slots.
    zombie: Vec<u64>,
    /// How many of the worker's own slots there are.
    own_slots: usize,
    /// Requests taken from the queue that `enqueue` counted in [`Shared::pushed`].
    taken: u64,
    /// A completion this round answered someone from the worker (see `poll`).
    answered_any: bool,
    /// Replies for the inline slot that arrived before `resolve()`'s hand-over (a few, newest).
    early: VecDeque<SaReply>,
    /// Started keys waiting for an in-flight slot, FIFO.
    backlog: VecDeque<Started>,
    next_nonce: u32,
    preloads: HashMap<u64, (Arc<Ep>, Vec<PreloadedRoute>)>,
    next_timer: Option<Instant>,
    /// An in-flight slot was freed: start backlog entries (done from `poll`, never from inside
    /// `complete`, so failures that complete at once cannot recurse).
    kick_backlog: bool,
    done: bool,
    /// Test hook (debug builds only, `ACMRS_TEST_PANIC_DLID`): a worker-side request for this
    /// DLID makes the engine panic, to prove the worker survives it (review G4).
    #[cfg(debug_assertions)]
    panic_dlid: Option<u16>,
}

impl Engine {
    /// An engine with all its tables allocated now (capacities from the options).
    pub fn new(sh: Arc<Shared>, handler: SaHandler) -> Self {
        let cap = (sh.opts.acmrs_pending_capacity as usize).max(1);
        let inflight = (sh.opts.sa_depth as usize)
            .saturating_mul(8)
            .clamp(8, MAX_INFLIGHT);
        let pending = new_pending(cap);
        Engine {
            handler,
            pending,
            reqs: Requests {
                slots: (0..cap).map(|_| None).collect(),
                free: (0..cap as u32).rev().collect(),
            },
            inflight: (0..Shared::INLINE_SLOT + INLINE_SLOTS)
                .map(|_| None)
                .collect(),
            inflight_free: (0..inflight as u32).rev().collect(),
            zombie: vec![0; Shared::INLINE_SLOT + INLINE_SLOTS],
            own_slots: inflight,
            taken: 0,
            answered_any: false,
            early: VecDeque::with_capacity(EARLY),
            backlog: VecDeque::with_capacity(cap),
            next_nonce: 0,
            preloads: HashMap::new(),
            next_timer: None,
            kick_backlog: false,
            done: false,
            #[cfg(debug_assertions)]
            panic_dlid: std::env::var("ACMRS_TEST_PANIC_DLID")
                .ok()
                .and_then(|v| v.parse().ok()),
            sh,
        }
    }

    fn log(&self, level: u8, text: impl FnOnce() -> String) {
        if self.sh.log_enabled(level) {
            self.sh.api.log(i32::from(level), &text());
        }
    }

    fn now_coarse(&self) -> u64 {
        self.sh.waker.coarse_ms()
    }

    /// Answers every waiter of `key` (FIFO) and frees the key.
    fn finish_key(&mut self, key: &PendKey, status: u8, record: Option<&[u8; 64]>) {
        let (sh, reqs) = (&*self.sh, &mut self.reqs);
        self.pending
            .complete(key, |t| reqs.finish(sh, t, status, record));
    }

    /// What the cache holds for `key`; a hit that asks for a refresh starts one.
    fn cached(
        &mut self,
        key: &RouteKey,
        ep: &Arc<Ep>,
        sa_record: &[u8; 64],
        now: Instant,
    ) -> Option<Result<[u8; 64], u8>> {
        match self.sh.lookup(key, self.now_coarse())? {
            Cached::Path(rec, refresh) => {
                if refresh {
                    self.begin_refresh(key, ep, sa_record, now);
                }
                Some(Ok(rec))
            }
            Cached::Negative(status) => Some(Err(status)),
        }
    }

    /// Starts re-querying a cached route near its expiry (nobody waits for the answer; the
    /// completion updates the entry in place). Coalesces with a resolution already under way.
    fn begin_refresh(&mut self, key: &RouteKey, ep: &Arc<Ep>, sa_record: &[u8; 64], now: Instant) {
        let pk = PendKey {
            route: *key,
            nonce: 0,
        };
        if self.pending.is_pending(&pk) {
            return;
        }
        let Some(slot) = self.reqs.free.pop() else {
            return;
        };
        self.reqs.slots[slot as usize] = Some(Request {
            ep: ep.clone(),
            id: 0,
            msg: crate::ffi::AcmMsg::zeroed(),
            kind: Kind::Refresh,
            key: *key,
            sa_record: *sa_record,
            host: None,
            sent: None,
        });
        self.enter(pk, slot, now);
    }

    /// Frees inline slot `fi` for `resolve()` (after its direct answer was disarmed).
    fn release_inline(&self, fi: u32) {
        if let Some(b) = (fi as usize)
            .checked_sub(Shared::INLINE_SLOT)
            .and_then(|i| self.sh.inline_busy.get(i))
        {
            b.store(false, Ordering::Release);
        }
    }

    /// Takes over tracking of a query `resolve()` sent itself on an inline slot.
    fn adopt(&mut self, req: Request, sent: crate::state::Sent, now: Instant) {
        let fi = sent.fi;
        if !is_inline(fi) {
            return;
        }
        let free_slot = self.inflight[fi as usize].is_none();
        let usable = free_slot && !self.done && !req.ep.closed.load(Ordering::Acquire);
        // The worker was idle when it was sent, so the key cannot be pending; if it were, a
        // unique nonce keeps this query apart (the starter must never become another
        // query's waiter: the SA thread may answer it).
        let mut key = PendKey {
            route: req.key,
            nonce: 0,
        };
        if self.pending.is_pending(&key) {
            self.next_nonce = self.next_nonce.wrapping_add(1).max(1);
            key.nonce = self.next_nonce;
        }
        let slot = if usable { self.reqs.free.pop() } else { None };
        let Some(slot) = slot else {
            // Not tracked: answer here unless the SA thread already did.
            if self.disarm(fi, sent.token) != Some(true) {
                let s = if usable {
                    ACM_STATUS_ENOMEM
                } else {
                    ACM_STATUS_ENODATA
                };
                answer(&self.sh, &req, s, None);
            }
            if free_slot {
                // The core still holds the MAD resolve() sent, unless its reply came early.
                let early = self.early.iter().position(|r| r.token == sent.token);
                if let Some(i) = early {
                    self.early.remove(i);
                    self.release_inline(fi);
                } else if self.done {
                    self.release_inline(fi);
                } else {
                    self.zombie[fi as usize] = sent.token;
                }
            }
            return;
        };
        let (ep, record) = (req.ep.clone(), req.sa_record);
        self.reqs.slots[slot as usize] = Some(req);
        match self.pending.begin(key, slot) {
            Begin::Started => {}
            Begin::Coalesced | Begin::Full => {
                // Not possible for a new key in a table with a free request slot; stay
                // exactly-once anyway.
                if let Some(req) = self.reqs.slots[slot as usize].take() {
                    self.reqs.free.push(slot);
                    if self.disarm(fi, sent.token) != Some(true) {
                        self.overflow(&req);
                    }
                }
                self.release_inline(fi);
                return;
            }
        }
        let deadline = sent.at + self.sa_budget();
        self.inflight[fi as usize] = Some(Inflight {
            key,
            starter: slot,
            ep,
            mask: path::comp_mask(&record),
            record,
            token: sent.token,
            tid: sent.tid,
            busy_tries: 0,
            retry_at: None,
            deadline,
        });
        self.arm_timer(deadline);
        // Its reply may have overtaken the hand-over (the others' stay: several inline
        // queries may be waiting for their hand-over).
        if let Some(r) = self
            .early
            .iter()
            .position(|r| r.token == sent.token)
            .and_then(|i| self.early.remove(i))
        {
            self.handle_reply(r, now);
        }
    }

    /// Disarms the direct answer of slot `fi` if it is armed for `token`: `Some(claimed)`
    /// (whether the SA thread answered the starter), `None` if it was not armed for it.
    fn disarm(&self, fi: u32, token: u64) -> Option<bool> {
        let slot = self.sh.direct.get(fi as usize)?;
        let mut g = lock_direct(slot);
        if g.token != token {
            return None;
        }
        Some(std::mem::take(&mut *g).claimed)
    }

    fn handle_request(&mut self, req: Request, now: Instant) {
        #[cfg(debug_assertions)]
        if self.panic_dlid.is_some()
            && self.panic_dlid == Some(u16::from_be_bytes([req.sa_record[40], req.sa_record[41]]))
        {
            // Held in a request slot first, as a real bug would find it.
            if let Some(slot) = self.reqs.free.pop() {
                self.reqs.slots[slot as usize] = Some(req);
            }
            panic!("injected test panic (ACMRS_TEST_PANIC_DLID)");
        }
        if let Some(sent) = req.sent {
            self.adopt(req, sent, now);
            return;
        }
        let kind = req.kind;
        if req.ep.closed.load(Ordering::Acquire) || self.done {
            answer(&self.sh, &req, ACM_STATUS_ENODATA, None);
            return;
        }
        if let Some(i) = req.host {
            // The address mapping had expired: re-resolve it from the preload table (the
            // worker's copy of the hosts file; the ACM multicast protocol is not implemented).
            if self.sh.renew_host(i, self.now_coarse()) {
                req.ep.count_global(cntr::ADDR_QUERY);
            }
        }
        if kind != Kind::Query && kind != Kind::Refresh {
            // Filled by a query that completed after resolve() looked.
            if let Some(c) = self.cached(&req.key, &req.ep, &req.sa_record, now) {
                match c {
                    Ok(rec) => {
                        req.ep.count_global(cntr::ROUTE_CACHE);
                        answer(&self.sh, &req, 0, Some(&rec));
                    }
                    Err(status) => answer(&self.sh, &req, status, None),
                }
                return;
            }
        }
        let nonce = if kind == Kind::Query {
            self.next_nonce = self.next_nonce.wrapping_add(1).max(1);
            self.next_nonce
        } else {
            0
        };
        let key = PendKey {
            route: req.key,
            nonce,
        };
        let Some(slot) = self.reqs.free.pop() else {
            self.overflow(&req);
            return;
        };
        self.reqs.slots[slot as usize] = Some(req);
        self.enter(key, slot, now);
    }

    /// Answers ENOMEM for a request the pending table has no room for.
    fn overflow(&self, req: &Request) {
        self.sh.overflows.fetch_add(1, Ordering::Relaxed);
        self.sh.log_limited(
            LogReason::PendingFull,
            0,
            "ERROR - pending table full, answering ENOMEM",
        );
        answer(&self.sh, req, ACM_STATUS_ENOMEM, None);
    }

    /// Registers the request in slab slot `slot` as waiting for `key`; starts the key if new.
    fn enter(&mut self, key: PendKey, slot: Token, now: Instant) {
        match self.pending.begin(key, slot) {
            Begin::Coalesced => {}
            Begin::Full => {
                if let Some(req) = self.reqs.slots[slot as usize].take() {
                    self.reqs.free.push(slot);
                    self.overflow(&req);
                }
            }
            Begin::Started => {
                let Some(req) = self.reqs.slots[slot as usize].as_ref() else {
                    return;
                };
                let s = Started {
                    key,
                    starter: slot,
                    ep: req.ep.clone(),
                    record: req.sa_record,
                };
                self.start_or_backlog(s, now);
            }
        }
    }

    fn start_or_backlog(&mut self, s: Started, now: Instant) {
        if self.done {
            self.finish_key(&s.key, ACM_STATUS_ENODATA, None);
            return;
        }
        let Some(fi) = self.inflight_free.pop() else {
            self.backlog.push_back(s);
            return;
        };
        self.inflight[fi as usize] = Some(Inflight {
            key: s.key,
            starter: s.starter,
            ep: s.ep,
            mask: path::comp_mask(&s.record),
            record: s.record,
            token: 0,
            tid: 0,
            busy_tries: 0,
            retry_at: None,
            deadline: now,
        });
        self.send(fi, now);
    }
    /// How long a client waits for an SA answer: `acmrs_sa_timeout_ms`, or by default (0) the
    /// longest the core may legitimately take (timeout × tries) plus a margin. At the deadline
    /// the waiters are answered ETIMEDOUT; the slot stays reserved until the core hands the MAD
    /// back (see `zombie`), so a short deadline never grows the core's queue.
    fn sa_budget(&self) -> Duration {
        let o = &self.sh.opts;
        if o.acmrs_sa_timeout_ms > 0 {
            return Duration::from_millis(u64::from(o.acmrs_sa_timeout_ms));
        }
        Duration::from_millis(u64::from(o.timeout) * (u64::from(o.retries) + 1) + 1000)
    }

    fn send(&mut self, fi: u32, now: Instant) {
        let handler = self.handler;
        let budget = self.sa_budget();
        let api = self.sh.api;
        let Some(f) = self.inflight[fi as usize].as_mut() else {
            return;
        };
        let (token, tid) = next_ids(fi);
        f.token = token;
        f.tid = tid;
        f.retry_at = None;
        f.deadline = now + budget;
        let ep = f.ep.clone();
        // Arm the starter for a direct answer by the SA thread before the MAD can complete.
        if let Some(slot) = self.sh.direct.get(fi as usize) {
            let starter = self
                .reqs
                .slots
                .get(f.starter as usize)
                .and_then(Option::as_ref);
            let mut g = lock_direct(slot);
            if !g.claimed {
                g.token = token;
                g.tid = tid;
                g.req = starter
                    .filter(|r| matches!(r.kind, Kind::Resolve | Kind::Query))
                    .map(|r| DirectReq {
                        ep: r.ep.clone(),
                        id: r.id,
                        msg: r.msg,
                        kind: r.kind,
                    });
            }
        }
        let status = {
            let guard = match ep.endpoint.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            let endpoint = *guard as *const AcmEndpoint;
            if endpoint.is_null() {
                Some(ACM_STATUS_ENODATA)
            } else {
                // SAFETY: `endpoint` is the core's live acm_endpoint (close_endpoint nulls it
                // under this lock before the core frees it); the context is an integer token.
                let mad =
                    unsafe { (api.alloc_sa_mad)(endpoint, token as usize as *mut c_void, handler) };
                if mad.is_null() {
                    Some(ACM_STATUS_ENOMEM)
                } else {
                    // SAFETY: `mad` is a valid acm_sa_mad the core just allocated for us; we own
                    // it until acm_send_sa_mad succeeds.
                    unsafe {
                        path::build_path_get(&mut (*mad).sa_mad.bytes, tid, &f.record, f.mask);
                        if (api.send_sa_mad)(mad) != 0 {
                            (api.free_sa_mad)(mad);
                            Some(ACM_STATUS_ETIMEDOUT)
                        } else {
                            None
                        }
                    }
                }
            }
        };
        match status {
            None => {
                ep.count_global(cntr::ROUTE_QUERY);
                self.arm_timer(now + budget);
            }
            Some(s) => {
                // Nothing is held by the core: the slot is free again at once.
                if let Some(f) = self.inflight[fi as usize].as_mut() {
                    f.token = 0;
                }
                self.log(1, || format!("SA query not sent (status {s})"));
                self.complete(fi, s, None, now);
            }
        }
    }

    fn arm_timer(&mut self, at: Instant) {
        self.next_timer = Some(match self.next_timer {
            Some(t) if t < at => t,
            _ => at,
        });
    }

    /// Completes an in-flight query: answers all its waiters, frees the slots, starts backlog.
    fn complete(&mut self, fi: u32, status: u8, record: Option<&[u8; 64]>, _now: Instant) {
        let Some(f) = self.inflight[fi as usize].take() else {
            return;
        };
        // A MAD still held by the core (sent, no reply yet) keeps the slot until it is back.
        let zombie = f.token != 0 && !self.done;
        if zombie {
            self.zombie[fi as usize] = f.token;
        } else if (fi as usize) < self.own_slots {
            self.inflight_free.push(fi);
        }
        // Disarm the direct answer; if the SA thread claimed the starter, it answered it.
        let answered = self.sh.direct.get(fi as usize).and_then(|slot| {
            let mut g = lock_direct(slot);
            let claimed = std::mem::take(&mut *g).claimed;
            claimed.then_some(f.starter)
        });
        if let (0, Some(r), 0) = (status, record, f.key.nonce) {
            if !f.ep.closed.load(Ordering::Acquire) {
                let ttl = self.sh.opts.route_ttl_ms().unwrap_or(NEVER);
                self.sh.insert(&f.key.route, r, self.now_coarse(), ttl);
            }
        }
        let (sh, reqs) = (&*self.sh, &mut self.reqs);
        let mut by_worker = false;
        self.pending.complete(&f.key, |t| {
            by_worker |= answered != Some(t);
            reqs.finish_unless(sh, t, status, record, answered)
        });
        self.answered_any |= by_worker;
        // After the disarm: resolve() may arm an inline slot again from now on.
        if !zombie {
            self.release_inline(fi);
            self.kick_backlog = true;
        }
    }

    /// The core handed back the MAD of a zombie slot: the slot is free again.
    fn bury(&mut self, fi: u32) {
        self.zombie[fi as usize] = 0;
        if (fi as usize) < self.own_slots {
            self.inflight_free.push(fi);
        }
        self.release_inline(fi);
        self.kick_backlog = true;
    }

    fn drain_backlog(&mut self, now: Instant) {
        while !self.inflight_free.is_empty() {
            let Some(s) = self.backlog.pop_front() else {
                break;
            };
            if s.key.nonce == 0 {
                // Filled meanwhile (preload, reregister re-insert): answer from the cache.
                match self.sh.lookup(&s.key.route, self.now_coarse()) {
                    Some(Cached::Path(rec, _)) => {
                        let (sh, reqs) = (&*self.sh, &mut self.reqs);
                        self.pending.complete(&s.key, |t| {
                            if let Some(r) = reqs.slots.get(t as usize).and_then(Option::as_ref) {
                                if r.kind != Kind::Refresh {
                                    r.ep.count_global(cntr::ROUTE_CACHE);
                                }
                            }
                            reqs.finish(sh, t, 0, Some(&rec));
                        });
                        continue;
                    }
                    Some(Cached::Negative(status)) => {
                        self.finish_key(&s.key, status, None);
                        continue;
                    }
                    None => {}
                }
            }
            self.start_or_backlog(s, now);
        }
    }

    fn handle_reply(&mut self, r: SaReply, now: Instant) {
        let fi = (r.token & 0xffff) as u32;
        if r.token != 0 && self.zombie.get(fi as usize) == Some(&r.token) {
            self.log(2, || {
                "SA reply after the deadline: in-flight slot freed".into()
            });
            self.bury(fi);
            return;
        }
        let matches = self
            .inflight
            .get(fi as usize)
            .and_then(|f| f.as_ref())
            .is_some_and(|f| f.token == r.token && f.tid == path::tid_low(&r.mad));
        if matches {
            // The core handed the MAD back: nothing of this query is outstanding any more.
            if let Some(f) = self.inflight[fi as usize].as_mut() {
                f.token = 0;
            }
        }
        if !matches {
            if is_inline(fi) && self.inflight.get(fi as usize).is_some_and(Option::is_none) {
                // Possibly the reply to a query resolve() just sent, ahead of its hand-over.
                if self.early.len() == EARLY {
                    self.early.pop_front();
                }
                self.early.push_back(r);
                return;
            }
            self.log(2, || "late or unknown SA reply ignored".into());
            return;
        }
        match path::classify_reply(r.umad_status, &r.mad) {
            SaOutcome::Record(rec) => self.complete(fi, 0, Some(&rec), now),
            SaOutcome::Failed(s) => {
                self.log(1, || format!("SA PathRecord query failed, status {s}"));
                // "No such path" is an answer from the SA, not a failure to reach it: remember
                // it for acmrs_negative_ttl_ms so repeated lookups do not load the SA.
                let ttl = u64::from(self.sh.opts.acmrs_negative_ttl_ms);
                if s == ACM_STATUS_ENODATA && r.umad_status == 0 && ttl > 0 {
                    if let Some(k) = self.inflight[fi as usize].as_ref().map(|f| f.key) {
                        // Never over a path cached since the query started (a preload or
                        // reregister re-insert): that would hide a valid route.
                        let now_c = self.now_coarse();
                        let has_path =
                            matches!(self.sh.lookup(&k.route, now_c), Some(Cached::Path(..)));
                        if k.nonce == 0 && !has_path {
                            self.sh.insert_negative(&k.route, s, now_c, ttl);
                        }
                    }
                }
                // The SA's record goes back to query() clients as ibacmp does (resolve answers
                // carry no record on failure).
                let mut sa_record = [0u8; 64];
                sa_record.copy_from_slice(&r.mad[56..120]);
                let record = (r.umad_status == 0).then_some(&sa_record);
                self.complete(fi, s, record, now)
            }
            SaOutcome::Busy => {
                let o = &self.sh.opts;
                let (retries, backoff) = (o.acmrs_sa_retries, o.acmrs_sa_busy_backoff_ms);
                let budget = self.sa_budget();
                let Some(f) = self.inflight[fi as usize].as_mut() else {
                    return;
                };
                if f.busy_tries >= retries {
                    self.complete(fi, ACM_STATUS_ETIMEDOUT, None, now);
                    return;
                }
                let wait = u64::from(backoff) << f.busy_tries.min(10);
                f.busy_tries += 1;
                // No reply will come for the old TID: forget it so a duplicate is ignored.
                f.token = 0;
                let at = now + Duration::from_millis(wait);
                f.retry_at = Some(at);
                f.deadline = at + budget;
                self.arm_timer(at);
            }
        }
    }

    fn run_timers(&mut self, now: Instant) {
        match self.next_timer {
            Some(t) if t <= now => {}
            _ => return,
        }
        self.next_timer = None;
        let mut next: Option<Instant> = None;
        for fi in 0..self.inflight.len() as u32 {
            let (retry, deadline) = match &self.inflight[fi as usize] {
                Some(f) => (f.retry_at, f.deadline),
                None => continue,
            };
            if let Some(at) = retry {
                if at <= now {
                    self.send(fi, now);
                } else {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
                continue;
            }
            if deadline <= now {
                self.sh.log_limited(
                    LogReason::Overdue,
                    0,
                    "ERROR - SA reply overdue, answering ETIMEDOUT",
                );
                self.complete(fi, ACM_STATUS_ETIMEDOUT, None, now);
            } else {
                next = Some(next.map_or(deadline, |n| n.min(deadline)));
            }
        }
        if let Some(n) = next {
            self.arm_timer(n);
        }
    }

    fn close_ep(&mut self, ep: &Arc<Ep>, now: Instant) {
        // Backlog first (rotated in place, no allocation), so nothing of this endpoint starts.
        for _ in 0..self.backlog.len() {
            let Some(s) = self.backlog.pop_front() else {
                break;
            };
            if s.ep.id == ep.id {
                self.finish_key(&s.key, ACM_STATUS_ENODATA, None);
            } else {
                self.backlog.push_back(s);
            }
        }
        for fi in 0..self.inflight.len() as u32 {
            let same = self.inflight[fi as usize]
                .as_ref()
                .is_some_and(|f| f.ep.id == ep.id);
            if same {
                self.complete(fi, ACM_STATUS_ENODATA, None, now);
                // A closed endpoint's MADs may never come back (the core stops reading a
                // port without a provider), and no new MAD goes to it until it reopens: free
                // the slot now, or a port that stays down would hold it forever.
                if self.zombie[fi as usize] != 0 {
                    self.bury(fi);
                }
            }
        }
        // Every started key is in flight or in the backlog, so this finds nothing; it is the
        // table's own guarantee that no waiter of this endpoint is left behind.
        let (sh, reqs) = (&*self.sh, &mut self.reqs);
        let left = self.pending.cancel_ep(u16::from(ep.slot), |_, t| {
            reqs.finish(sh, t, ACM_STATUS_ENODATA, None)
        });
        if left != 0 {
            self.log(0, || {
                format!("ERROR - {left} orphaned waiters answered at close")
            });
        }
        self.sh.invalidate_ep(ep);
        self.preloads.remove(&ep.id);
    }

    fn handle_control(&mut self, c: Control, now: Instant) {
        match c {
            Control::EpClosed(ep) => self.close_ep(&ep, now),
            Control::Reregister(port_id) => {
                let _ = port_id;
                let n = self.sh.clear();
                let coarse = self.now_coarse();
                for (ep, list) in self.preloads.values() {
                    for (k, r) in list {
                        self.sh.insert(&RouteKey::new(ep, k), r, coarse, NEVER);
                    }
                }
                self.log(1, || {
                    format!("client reregister: {n} cached routes flushed")
                });
            }
            Control::Preload(ep, list) => {
                let coarse = self.now_coarse();
                if !ep.closed.load(Ordering::Acquire) {
                    for (k, r) in &list {
                        self.sh.insert(&RouteKey::new(&ep, k), r, coarse, NEVER);
                    }
                    let n = list.len();
                    self.log(1, || format!("{n} preloaded cache entries inserted"));
                    self.preloads.insert(ep.id, (ep, list));
                }
            }
            Control::Shutdown => {
                self.done = true;
                for fi in 0..self.inflight.len() as u32 {
                    self.complete(fi, ACM_STATUS_ENODATA, None, now);
                }
                while let Some(s) = self.backlog.pop_front() {
                    self.finish_key(&s.key, ACM_STATUS_ENODATA, None);
                }
                while let Some(req) = self.sh.requests.pop() {
                    match req.sent {
                        // Disarms its direct answer (answered ENODATA unless the SA thread
                        // already answered it) and frees the inline slot.
                        Some(sent) => self.adopt(req, sent, now),
                        None => answer(&self.sh, &req, ACM_STATUS_ENODATA, None),
                    }
                }
                self.sh.clear();
                self.preloads.clear();
            }
        }
    }
}

impl Engine {
    /// After a caught panic (review G4): logs it and brings the engine back to a consistent,
    /// empty state. Every request the worker holds is answered EINVAL exactly once (unless the
    /// SA thread already answered it directly), MADs still held by the core keep their slots
    /// reserved (zombies) until they come back, the cache is kept.
    fn recover_after_panic(&mut self, message: &str) {
        let held = self.reqs.slots.iter().filter(|r| r.is_some()).count();
        self.sh.api.log(
            0,
            &format!(
                "ERROR - acmrs worker panicked ({message}); answering {held} waiting \
                 requests EINVAL and continuing"
            ),
        );
        let mut by_sa: Vec<Token> = Vec::new();
        for fi in 0..self.inflight.len() {
            let Some(f) = self.inflight[fi].take() else {
                continue;
            };
            if let Some(slot) = self.sh.direct.get(fi) {
                if std::mem::take(&mut *lock_direct(slot)).claimed {
                    by_sa.push(f.starter);
                }
            }
            if f.token != 0 && !self.done {
                self.zombie[fi] = f.token;
            }
        }
        for t in 0..self.reqs.slots.len() {
            if let Some(req) = self.reqs.slots[t].take() {
                if !by_sa.contains(&(t as Token)) {
                    answer(&self.sh, &req, crate::ffi::ACM_STATUS_EINVAL, None);
                }
            }
        }
        let cap = self.reqs.slots.len();
        self.reqs.free = (0..cap as u32).rev().collect();
        self.pending = new_pending(cap);
        self.backlog.clear();
        self.early.clear();
        self.inflight_free = (0..self.own_slots as u32)
            .rev()
            .filter(|&fi| self.zombie[fi as usize] == 0)
            .collect();
        for fi in Shared::INLINE_SLOT..self.inflight.len() {
            if self.zombie[fi] == 0 {
                self.release_inline(fi as u32);
            }
        }
        self.kick_backlog = false;
        self.answered_any = true;
    }
}

impl Poller for Engine {
    fn poll(&mut self, now: Instant) -> PollOutcome {
        let mut did = false;

        let controls: Vec<Control> = match self.sh.control.lock() {
            Ok(mut v) if !v.is_empty() => std::mem::take(&mut *v),
            Ok(_) => Vec::new(),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        };
        for c in controls {
            did = true;
            self.handle_control(c, now);
        }
        if self.done {
            return PollOutcome::default();
        }
        // Replies and inline hand-overs count as work (keep the worker spinning) only if the
        // worker answered someone: a success whose only client the SA thread answered
        // directly just needs its cache write, and spinning after it would only take the CPU
        // from whoever serves the next miss (on a small box: the SM).
        for _ in 0..BATCH {
            let Some(r) = self.sh.replies.pop() else {
                break;
            };
            self.handle_reply(r, now);
        }
        for _ in 0..BATCH {
            let Some(req) = self.sh.requests.pop() else {
                break;
            };
            if req.sent.is_none() {
                self.taken += 1;
                did = true;
            }
            self.handle_request(req, now);
        }
        self.run_timers(now);
        if self.kick_backlog {
            self.kick_backlog = false;
            self.drain_backlog(now);
        }
        // Every pending key is in flight or in the backlog: none of the worker's own, and
        // every queued request taken, means the only pending keys are inline ones.
        if self.backlog.is_empty() && self.inflight_free.len() == self.own_slots {
            self.sh.idle_seen.store(self.taken, Ordering::Release);
        }
        did |= std::mem::take(&mut self.answered_any);
        PollOutcome {
            did_work: did,
            next_deadline: self.next_timer,
        }
    }

    fn finished(&self) -> bool {
        self.done
    }

    fn recover(&mut self, message: &str) {
        self.recover_after_panic(message);
    }
}

/// Copies an SA completion for the worker. Runs on the core's SA thread: copy, free, hand over.
///
/// # Safety
/// `mad` must be a non-null MAD the core completed for us (it is freed here).
pub unsafe fn take_sa_completion(mad: *mut AcmSaMad, api: &crate::core_api::CoreApi) -> SaReply {
    // SAFETY: the core passes the acm_sa_mad it allocated for us; it stays valid until we free it
    // below, and nobody else touches it meanwhile.
    let reply = unsafe {
        SaReply {
            token: (*mad).context as usize as u64,
            umad_status: (*mad).umad.status,
            mad: (*mad).sa_mad.bytes,
        }
    };
    // SAFETY: the handler owns the MAD after completion and must free it exactly once (here).
    unsafe { (api.free_sa_mad)(mad) };
    reply
}
