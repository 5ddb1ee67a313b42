//! Route resolution: SA PathRecord jobs, coalescing, the backlog, BUSY backoff, deadlines,
//! negative caching, refresh-ahead. How many jobs may be out at once is the
//! [`sa_window`](super::sa_window)'s business.
//!
//! A route job is one coalescing key — (endpoint, cache endpoint number, SA query record) —
//! with a FIFO of waiting requests and a list of address entries whose route it is. At most
//! `min(sa_window, sa_inflight)` jobs hold the SA window (sent, BUSY-waiting, or answered while
//! the caller still holds their MAD); the rest wait FIFO in the backlog, each with its own
//! deadline (`queue_deadline` from arrival).

use super::mads::{self, SaOutcome};
use super::sa_window::SaWindow;
use super::storage::chain;
use super::storage::Slab;
use super::storage::{
    bucket_of, list_id, AddrState, JobState, Joiner, List, SlabsRef, StoredKey, ADDR_R, JOB, REQ,
};
use super::timers::Timer;
use super::{addr, Config, Counter, EpId, JobSlot, Millis, Request, Resolver, Storage, NEVER};
use crate::cache::{CacheRef, Dest, Lookup, PathKey};
use crate::wire::client::{AcmMsg, EpInfoType, Status};
use crate::wire::mad::TIMED_OUT;

impl StoredKey {
    pub(crate) fn from_key(k: Option<PathKey>) -> StoredKey {
        match k {
            None => StoredKey::NONE,
            Some(PathKey {
                dest: Dest::Lid(lid),
                constraints,
                ..
            }) => StoredKey {
                kind: 1,
                lid,
                gid: [0; 16],
                constraints,
            },
            Some(PathKey {
                dest: Dest::Gid(gid),
                constraints,
                ..
            }) => StoredKey {
                kind: 2,
                lid: 0,
                gid,
                constraints,
            },
        }
    }

    pub(crate) fn key(&self, cache_ep: u32) -> Option<PathKey> {
        let dest = match self.kind {
            1 => Dest::Lid(self.lid),
            2 => Dest::Gid(self.gid),
            _ => return None,
        };
        Some(PathKey {
            ep: cache_ep,
            dest,
            constraints: self.constraints,
        })
    }
}

/// How a route job ends ([`Resolver::finish_job`]).
#[derive(Clone, Copy)]
pub(crate) enum Completion<'r> {
    /// The SA's record, inserted into the cache to expire at `expires`.
    Answered {
        /// The PathRecord.
        record: &'r [u8; 64],
        /// Its expiry as inserted.
        expires: Millis,
    },
    /// The cache had the record meanwhile (each answered Resolve counts ROUTE_CACHE).
    FromCache {
        /// The PathRecord.
        record: &'r [u8; 64],
        /// Its expiry in the cache.
        expires: Millis,
    },
    /// Failed with `status`; a `query()` gets `query_record` (the SA's record) back.
    Failed {
        /// The answer's status.
        status: Status,
        /// What a failed `query()` gets back, if anything.
        query_record: Option<&'r [u8; 64]>,
    },
}

impl Completion<'_> {
    /// A failure with `status` and nothing for a `query()`.
    pub(crate) fn failed(status: Status) -> Self {
        Completion::Failed {
            status,
            query_record: None,
        }
    }
}

/// The route jobs' lists and counts, and the SA window.
pub(crate) struct Routes {
    /// The hash seed of the coalescing table.
    seed: u64,
    /// Free job slots.
    pub(crate) free: List,
    /// Jobs waiting for a window slot, in start (= deadline) order.
    pub(crate) backlog: List,
    /// Jobs decided to send, until polled.
    pub(crate) send: List,
    /// Jobs whose MAD the caller holds, in send order.
    pub(crate) sent: List,
    /// Jobs waiting out a BUSY backoff.
    pub(crate) busy: List,
    /// Jobs not free.
    pub(crate) active: u32,
    /// The SA window.
    pub(crate) sa: SaWindow,
    /// When the pace lets the backlog's head go (a window below one query).
    pub(crate) pace: Option<Millis>,
    /// The backoff jitter's generator state.
    rng: u64,
}

impl Routes {
    /// Every slot of `jobs` free.
    pub(crate) fn new(jobs: &mut [JobSlot], seed: u64, cfg: &Config) -> Self {
        let mut free = List::EMPTY;
        for i in 0..jobs.len() as u32 {
            free.push_back(jobs, i, list_id::FREE, JOB);
        }
        Routes {
            seed,
            free,
            backlog: List::EMPTY,
            send: List::EMPTY,
            sent: List::EMPTY,
            busy: List::EMPTY,
            active: 0,
            sa: SaWindow::new(cfg.sa_window, cfg.sa_window_start),
            pace: None,
            rng: seed ^ 0x5eed_ba0c,
        }
    }

    /// A pseudo-random number (the backoff jitter).
    pub(crate) fn random(&mut self) -> u64 {
        super::splitmix64(&mut self.rng)
    }

    fn bucket(&self, buckets: usize, slot: usize, cache_ep: u32, sa: &[u8; 64]) -> usize {
        // The slot in the top byte, over the generation bits a cache number rarely reaches.
        bucket_of(
            self.seed,
            (slot as u32).rotate_right(8) ^ cache_ep,
            sa,
            buckets,
        )
    }

    /// The coalescable job for (endpoint, cache_ep, SA record), if one is pending.
    pub(crate) fn find(
        &self,
        t: SlabsRef<'_>,
        slot: usize,
        cache_ep: u32,
        sa: &[u8; 64],
    ) -> Option<u32> {
        let b = self.bucket(t.job_buckets.len(), slot, cache_ep, sa);
        chain::find(t.jobs, t.job_buckets, b, |job| {
            !job.query
                && job.state != JobState::Free
                && job.state != JobState::Zombie
                && usize::from(job.slot) == slot
                && job.cache_ep == cache_ep
                && job.sa == *sa
        })
    }

    /// Puts job `j` (not a `query()`) in the coalescing table.
    fn hash(&self, jobs: &mut [JobSlot], buckets: &mut [u32], j: u32) {
        let job = &jobs[j as usize];
        let b = self.bucket(buckets.len(), usize::from(job.slot), job.cache_ep, &job.sa);
        chain::insert(jobs, buckets, b, j);
    }

    /// Takes job `j` out of the coalescing table.
    fn unhash(&self, jobs: &mut [JobSlot], buckets: &mut [u32], j: u32) {
        let job = jobs[j as usize];
        if job.query {
            return;
        }
        let b = self.bucket(buckets.len(), usize::from(job.slot), job.cache_ep, &job.sa);
        chain::remove(jobs, buckets, b, j);
    }

    /// Takes job `j` off whichever list its link is on.
    pub(crate) fn unlist(&mut self, jobs: &mut [JobSlot], j: u32) {
        let on = jobs[j as usize].qlink.on;
        let list = match on {
            list_id::BACKLOG => &mut self.backlog,
            list_id::SA_SEND => &mut self.send,
            list_id::SENT => &mut self.sent,
            list_id::BUSY => &mut self.busy,
            _ => return,
        };
        list.remove(jobs, j, on, JOB);
    }

    fn free_job(&mut self, jobs: &mut [JobSlot], j: u32) {
        jobs[j as usize] = JobSlot::EMPTY;
        self.free.push_back(jobs, j, list_id::FREE, JOB);
        self.active -= 1;
    }

    /// The earliest deadline of timer kind `t` among the jobs (`Backlog`: the backlog is in
    /// deadline order, its head; `SaReply`: the send and sent lists, which a BUSY retry
    /// keeping its start's deadline leaves not quite in order; `SaBusy`: the BUSY list).
    pub(crate) fn earliest(&self, jobs: &[JobSlot], t: Timer, cfg: &Config) -> Option<Millis> {
        let timer = |j: u32| jobs[j as usize].timer;
        let lists: &[List] = match t {
            // A backlogged job's deadline is derived from its start ([`SaWindow::deadline`]);
            // the backlog is in start order, so the head's is the earliest.
            Timer::Backlog => {
                let head = |j: u32| self.sa.deadline(jobs[j as usize].born, cfg);
                return self.backlog.front().map(head);
            }
            Timer::SaReply => &[self.send, self.sent],
            Timer::SaBusy => &[self.busy],
            Timer::Pace => return self.pace,
            _ => return None,
        };
        let mut next = None;
        for l in lists {
            for j in l.iter(jobs, JOB) {
                next = Some(next.map_or(timer(j), |n: Millis| n.min(timer(j))));
            }
        }
        next
    }
}

#[cfg(feature = "std")]
impl Routes {
    /// Every job is on the list its state says, the counts and the window match; returns how
    /// many requests wait on jobs.
    pub(crate) fn check(&self, jobs: &[JobSlot]) -> Result<u32, std::string::String> {
        use std::format;
        let (mut active, mut window, mut waiters) = (0u32, 0u32, 0u32);
        for j in jobs {
            let want = match j.state {
                JobState::Free => list_id::FREE,
                JobState::Backlog => list_id::BACKLOG,
                JobState::Send => list_id::SA_SEND,
                JobState::Sent => list_id::SENT,
                JobState::Busy => list_id::BUSY,
                JobState::Zombie => 0,
            };
            if j.qlink.on != want {
                return Err(format!("job in {:?} on list {}", j.state, j.qlink.on));
            }
            if j.state != JobState::Free {
                active += 1;
            }
            if matches!(
                j.state,
                JobState::Send | JobState::Sent | JobState::Busy | JobState::Zombie
            ) {
                window += 1;
            }
            // Held only while Sent or Zombie; a Zombie always is (a Sent job whose reply was
            // dropped for a wrong TID waits for its deadline with the MAD back).
            let held_ok = if j.held {
                matches!(j.state, JobState::Sent | JobState::Zombie)
            } else {
                j.state != JobState::Zombie
            };
            if !held_ok {
                return Err(format!("job in {:?} held {}", j.state, j.held));
            }
            waiters += j.waiters.len;
        }
        if active != self.active || window != self.sa.held {
            return Err(format!(
                "jobs: active {active}/{} window {window}/{}",
                self.active, self.sa.held
            ));
        }
        Ok(waiters)
    }
}

/// [`Resolver::retry_job`]'s jitter: a lost query's backoff is spread, a BUSY one's is not
/// (the SA named the moment: it was busy then).
const RETRY_LOST: bool = true;
const RETRY_BUSY: bool = false;

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// The coalescable job for (endpoint, cache_ep, SA record), if one is pending.
    pub(crate) fn find_job(&self, slot: usize, cache_ep: u32, sa: &[u8; 64]) -> Option<u32> {
        self.routes.find(self.st.slabs_ref(), slot, cache_ep, sa)
    }

    /// Room in the SA window for one more job at `now`.
    fn window_free(&self, now: Millis) -> bool {
        self.routes
            .sa
            .has_room(self.eps.ports, self.st.sa_inflight(), now)
    }

    /// When a job started at `born` is answered ETIMEDOUT if nothing else answers it
    /// ([`SaWindow::deadline`]: by age, or by the SA's silence, whichever is later).
    fn deadline(&self, born: Millis) -> Millis {
        self.routes.sa.deadline(born, &self.cfg)
    }

    /// Whether `job`'s answer could not come back before its deadline.
    fn too_late(&self, now: Millis, job: &JobSlot) -> bool {
        self.routes.sa.too_late(now, self.deadline(job.born))
    }

    /// A BUSY job whose backoff ended: it gives its window slot back and waits in the backlog,
    /// in deadline (= start) order, for the window, which BUSY has shrunk meanwhile, to let it
    /// go again (`pump`, right after the timers). Re-sent at once instead, every query that was
    /// out when the SA said BUSY would go again whatever the window: a storm's resolvers would
    /// keep their whole first window in the SA's face.
    fn requeue_job(&mut self, now: Millis, j: u32) {
        self.routes.unlist(self.st.jobs(), j);
        self.routes.sa.held -= 1;
        let born = self.st.jobs()[j as usize].born;
        let at = self.deadline(born);
        self.st.jobs()[j as usize].state = JobState::Backlog;
        let mut before = self.routes.backlog.front();
        while let Some(b) = before {
            if self.st.jobs()[b as usize].born > born {
                break;
            }
            before = List::next_of(self.st.jobs(), b, JOB);
        }
        self.routes
            .backlog
            .insert_before(self.st.jobs(), j, before, list_id::BACKLOG, JOB);
        self.timers.arm(Timer::Backlog, at.max(now));
        let slot = usize::from(self.st.jobs()[j as usize].slot);
        self.backlog_entered(now, slot);
    }

    /// Starts a job: sent at once if the SA window has room, else queued in the backlog.
    pub(crate) fn start_job(
        &mut self,
        now: Millis,
        slot: usize,
        cache_ep: u32,
        key: Option<PathKey>,
        sa: &[u8; 64],
        query: bool,
    ) -> Option<u32> {
        let j = self
            .routes
            .free
            .pop_front(self.st.jobs(), list_id::FREE, JOB)?;
        {
            let job = &mut self.st.jobs()[j as usize];
            *job = JobSlot::EMPTY;
            job.slot = slot as u8;
            job.cache_ep = cache_ep;
            job.query = query;
            job.born = now;
            job.key = StoredKey::from_key(if query { None } else { key });
            job.sa = *sa;
        }
        if !query {
            let t = self.st.slabs();
            self.routes.hash(t.jobs, t.job_buckets, j);
            let dlid = crate::wire::path_record::PathRecord::new_unchecked(&sa[..]).dlid();
            let e = &mut t.endpoints[slot];
            e.table.max_lid = e.table.max_lid.max(dlid);
        }
        self.routes.active += 1;
        if self.routes.backlog.is_empty() && self.window_free(now) {
            self.routes.sa.held += 1;
            self.send_job(now, j);
        } else {
            let at = self.deadline(now);
            self.st.jobs()[j as usize].state = JobState::Backlog;
            self.routes
                .backlog
                .push_back(self.st.jobs(), j, list_id::BACKLOG, JOB);
            self.timers.arm(Timer::Backlog, at);
            self.backlog_entered(now, slot);
        }
        Some(j)
    }

    /// Puts job `j` (already holding a window slot) on the SA send list with a fresh TID.
    fn send_job(&mut self, now: Millis, j: u32) {
        self.routes.unlist(self.st.jobs(), j);
        let tid = self.next_tid();
        let (slot, born) = {
            let job = &self.st.jobs()[j as usize];
            (usize::from(job.slot), job.born)
        };
        // Each try has its deadline, and the whole job (backlog, tries, backoffs) has its own:
        // with the SA gone, nothing waits longer than `queue_deadline` from its start.
        let at = now
            .saturating_add(self.sa_deadline_of(slot))
            .min(self.deadline(born));
        let ep = {
            let job = &mut self.st.jobs()[j as usize];
            job.state = JobState::Send;
            job.tid = tid;
            job.timer = at;
            job.sent = now;
            job.slot
        };
        self.routes
            .send
            .push_back(self.st.jobs(), j, list_id::SA_SEND, JOB);
        self.routes.sa.sent(now, self.eps.ports);
        let id = EpId(self.st.endpoints()[usize::from(ep)].id);
        self.count(id, Counter::RouteQuery);
        self.timers.arm(Timer::SaReply, at);
    }

    /// Adds `who` (a waiter, an address entry) to the job for (slot, cache_ep, sa), starting
    /// one if none is pending. A full job table answers the waiter ENOMEM.
    pub(crate) fn join_route(
        &mut self,
        now: Millis,
        slot: usize,
        cache_ep: u32,
        key: Option<PathKey>,
        sa: &[u8; 64],
        who: Joiner,
    ) {
        let Joiner { waiter, addr } = who;
        let j = match self.find_job(slot, cache_ep, sa) {
            Some(j) => j,
            None => match self.start_job(now, slot, cache_ep, key, sa, false) {
                Some(j) => j,
                None => {
                    self.stats.full += 1;
                    if let Some(w) = waiter {
                        self.answer(w, Status::Enomem, None);
                    }
                    return;
                }
            },
        };
        let t = self.st.slabs();
        let job = &mut t.jobs[j as usize];
        if let Some(w) = waiter {
            job.waiters.push_back(t.requests, w, list_id::WAITERS, REQ);
        }
        if let Some(a) = addr {
            if t.addrs[a as usize].job == 0 {
                job.addrs
                    .push_back(t.addrs, a, list_id::ROUTE_ADDRS, ADDR_R);
                t.addrs[a as usize].job = j + 1;
            }
        }
    }

    /// `query()`: a pass-through SA PathRecord GET of the client's record, never coalesced,
    /// never cached.
    pub(crate) fn query_request(&mut self, now: Millis, slot: usize, r: &Request<'_>) {
        let valid = AcmMsg::new_checked(r.msg).ok().and_then(|m| {
            let e = m.entry(0)?;
            (m.length() == 88 && e.info_type() == EpInfoType::Path).then(|| {
                let mut rec = [0u8; 64];
                rec.copy_from_slice(e.info());
                rec
            })
        });
        let Some(sa) = valid else {
            self.stats.malformed += 1;
            self.answer_now(r, Status::Einval, None);
            return;
        };
        let Some(w) = self.waiter(r) else {
            return;
        };
        match self.start_job(now, slot, r.cache_ep, None, &sa, true) {
            Some(j) => {
                let t = self.st.slabs();
                t.jobs[j as usize]
                    .waiters
                    .push_back(t.requests, w, list_id::WAITERS, REQ);
            }
            None => {
                self.stats.full += 1;
                self.answer(w, Status::Enomem, None);
            }
        }
    }

    /// A PATH / LID / GID request past the front ([`front::decide`](super::front::decide)):
    /// joined to the route job of its key (a new one queries the SA with `sa`), as a waiter
    /// if `wait` (a Resolve that the job answers), else only to start or renew the route.
    pub(crate) fn route_query(
        &mut self,
        now: Millis,
        slot: usize,
        r: &Request<'_>,
        key: Option<PathKey>,
        sa: &[u8; 64],
        wait: bool,
    ) {
        let waiter = match wait {
            true => match self.waiter(r) {
                Some(w) => Some(w),
                None => return,
            },
            false => None,
        };
        let who = Joiner { waiter, addr: None };
        self.join_route(now, slot, r.cache_ep, key, sa, who);
    }

    /// Completes job `j` as `how` says: answers its waiters, aliases its addresses on success,
    /// frees the job (or keeps it as a zombie while the caller holds its MAD).
    pub(crate) fn finish_job(&mut self, now: Millis, j: u32, how: Completion<'_>) {
        let (status, record, query_record, from_cache) = match how {
            Completion::Answered { record, expires } => {
                (Status::Success, Some((record, expires)), None, false)
            }
            Completion::FromCache { record, expires } => {
                (Status::Success, Some((record, expires)), None, true)
            }
            Completion::Failed {
                status,
                query_record,
            } => (status, None, query_record, false),
        };
        let job = self.st.jobs()[j as usize];
        if matches!(job.state, JobState::Free | JobState::Zombie) {
            return;
        }
        let key = job.key.key(job.cache_ep);
        // Addresses first: the alias must exist before anyone is told the answer.
        let mut addrs = job.addrs;
        // The path's expiry as inserted (not looked up: a lookup here would take the one
        // refresh claim of the entry away from the provider's hit path).
        let path_expires = match (status, record, key, job.query) {
            (Status::Success, Some((_, exp)), Some(_), false) => Some(exp),
            _ => None,
        };
        let record = record.map(|(r, _)| r);
        while let Some(a) = addrs.pop_front(self.st.addrs(), list_id::ROUTE_ADDRS, ADDR_R) {
            self.st.addrs()[a as usize].job = 0;
            if let (Some(exp), Some(k)) = (path_expires, key) {
                let e = self.st.addrs()[a as usize];
                if e.state == AddrState::Resolved {
                    addr::alias(&mut self.w, &e, &k, now, exp);
                }
            }
        }
        let mut waiters = job.waiters;
        while let Some(w) = waiters.pop_front(self.st.requests(), list_id::WAITERS, REQ) {
            let path = if status == Status::Success {
                record
            } else if job.query {
                query_record
            } else {
                None
            };
            if from_cache && !self.st.requests()[w as usize].query {
                let ep = self.st.requests()[w as usize].ep;
                self.count(ep, Counter::RouteCache);
            }
            self.answer(w, status, path);
        }
        if job.state == JobState::Backlog {
            self.backlog_left(usize::from(job.slot));
        }
        let t = self.st.slabs();
        self.routes.unhash(t.jobs, t.job_buckets, j);
        self.routes.unlist(t.jobs, j);
        let holds_window = matches!(job.state, JobState::Send | JobState::Sent | JobState::Busy);
        if job.held {
            let jb = &mut self.st.jobs()[j as usize];
            jb.state = JobState::Zombie;
            jb.waiters = List::EMPTY;
            jb.addrs = List::EMPTY;
        } else {
            if holds_window {
                self.routes.sa.held -= 1;
            }
            self.routes.free_job(self.st.jobs(), j);
        }
    }

    /// Frees a zombie whose MAD the caller will never hand back (endpoint closed, shutdown).
    pub(crate) fn free_zombie(&mut self, j: u32) {
        if self.st.jobs()[j as usize].state == JobState::Zombie {
            self.routes.sa.held -= 1;
            self.routes.free_job(self.st.jobs(), j);
        }
    }

    /// An SA completion of route job `j`.
    pub(crate) fn route_reply(
        &mut self,
        now: Millis,
        j: u32,
        tid: u32,
        umad_status: u32,
        mad: &[u8; 256],
    ) {
        let Some(job) = self.st.jobs().get(j as usize).copied() else {
            self.stats.sa_unknown += 1;
            return;
        };
        if !job.held || job.tid != tid {
            self.stats.sa_unknown += 1;
            return;
        }
        // The caller handed its MAD back: nothing of this job is outstanding any more.
        self.st.jobs()[j as usize].held = false;
        if job.state == JobState::Zombie {
            self.free_zombie(j);
            return;
        }
        if job.state != JobState::Sent {
            self.stats.sa_unknown += 1;
            return;
        }
        if umad_status == 0 && mads::tid_low(mad) != tid {
            // Not the reply to this TID; the deadline answers the waiters.
            self.stats.sa_unknown += 1;
            return;
        }
        let key = job.key.key(job.cache_ep);
        let outcome = mads::classify_path_reply(umad_status, mad);
        let sample = now.saturating_sub(job.sent);
        if umad_status == 0 {
            let busy = outcome == SaOutcome::Busy;
            self.routes.sa.replied(now, sample, busy, &self.cfg);
        } else if umad_status == TIMED_OUT {
            // No answer to any try: the SA dropped it, or is gone. (Any other status is a
            // send that failed here, answered at once as before.)
            self.stats.sa_lost += 1;
            self.routes.sa.lost(now, &self.cfg);
            if self.retry_job(now, j, &job, RETRY_LOST) {
                return;
            }
        }
        match outcome {
            SaOutcome::Record(rec) => {
                let ttl = self.cfg.route_ttl.unwrap_or(NEVER);
                if let (Some(k), false) = (key, job.query) {
                    self.w.insert(&k, &rec, now, ttl);
                }
                let exp = now.saturating_add(ttl);
                self.finish_job(
                    now,
                    j,
                    Completion::Answered {
                        record: &rec,
                        expires: exp,
                    },
                );
            }
            SaOutcome::Failed(s) => {
                // "No such path" is an answer from the SA, not a failure to reach it: remember
                // it for a while, never over a path cached since the query started — nor over
                // a path without the reversible bit that this (reversible) query could not
                // use: the entry is shared, and requests without the bit are served by it.
                if let (Status::Enodata, 0, Some(k), false) = (s, umad_status, key, job.query) {
                    let ttl = self.cfg.negative_ttl;
                    let cached = self.cache().lookup(&k.without_reversible(), now);
                    if ttl > 0 && !matches!(cached, Lookup::Hit { .. }) {
                        // The cache stores the status as its byte (never 0: `s` is ENODATA,
                        // so no Err).
                        let _ = self.w.insert_negative(&k, u8::from(s), now, ttl);
                    }
                }
                let sa_record = *crate::wire::sa::first_record(mad);
                let qr = (umad_status == 0).then_some(&sa_record);
                self.finish_job(
                    now,
                    j,
                    Completion::Failed {
                        status: s,
                        query_record: qr,
                    },
                );
            }
            SaOutcome::Busy => {
                // The SA is overloaded (the window halved above: the jobs already out stay
                // out; new ones wait for it).
                self.stats.sa_busy += 1;
                if !self.retry_job(now, j, &job, RETRY_BUSY) {
                    self.stats.timeouts += 1;
                    self.finish_job(now, j, Completion::failed(Status::Etimedout));
                }
            }
        }
    }

    /// Puts job `j` (`job`, as it was when its reply came) in the BUSY list to go again after
    /// a backoff: `sa_busy_backoff` doubled per retry, with `jitter` (a lost query's backoff
    /// is spread over ½–1½ of it, so the nodes of a storm do not all come back at once),
    /// within the job's deadline. False if its retries (`sa_busy_retries`) are spent or the
    /// deadline has passed: the caller answers it.
    fn retry_job(&mut self, now: Millis, j: u32, job: &JobSlot, jitter: bool) -> bool {
        let deadline = self.deadline(job.born);
        if job.busy_tries >= self.cfg.sa_busy_retries || now >= deadline {
            return false;
        }
        let mut wait = self.cfg.sa_busy_backoff << job.busy_tries.min(16);
        if jitter && wait > 1 {
            wait = wait / 2 + self.routes.random() % wait;
        }
        let at = now.saturating_add(wait).min(deadline);
        let jobs = self.st.jobs();
        self.routes.unlist(jobs, j);
        let jb = &mut jobs[j as usize];
        jb.state = JobState::Busy;
        jb.busy_tries += 1;
        jb.timer = at;
        self.routes.busy.push_back(jobs, j, list_id::BUSY, JOB);
        self.timers.arm(Timer::SaBusy, at);
        true
    }

    /// Moves backlog jobs into free window slots (answering those the cache can answer now,
    /// and those that could not be answered before their deadline).
    pub(crate) fn pump_backlog(&mut self, now: Millis) {
        while self.window_free(now) {
            let Some(j) = self.next_unheld() else {
                break;
            };
            let job = self.st.jobs()[j as usize];
            if let Some(k) = job.key.key(job.cache_ep) {
                // Filled meanwhile (another job, a preload): answer from the cache.
                match self.cache().lookup(&k, now) {
                    Lookup::Hit {
                        record,
                        expires_at,
                        needs_refresh,
                    } => {
                        let (slot, cep, sa) = (usize::from(job.slot), job.cache_ep, job.sa);
                        let how = Completion::FromCache {
                            record: &record,
                            expires: expires_at,
                        };
                        self.finish_job(now, j, how);
                        if needs_refresh {
                            self.join_route(now, slot, cep, Some(k), &sa, Joiner::NONE);
                        }
                        continue;
                    }
                    Lookup::Negative { status, .. } => {
                        self.finish_job(now, j, Completion::failed(Status::from(status)));
                        continue;
                    }
                    _ => {}
                }
            }
            if self.too_late(now, &job) {
                // Its answer could not come back before its deadline: do not spend the SA's
                // work on it (a storm's backlog would otherwise feed the SA queries whose
                // clients have already been told ETIMEDOUT).
                self.stats.timeouts += 1;
                self.finish_job(now, j, Completion::failed(Status::Etimedout));
                continue;
            }
            self.routes
                .backlog
                .remove(self.st.jobs(), j, list_id::BACKLOG, JOB);
            self.backlog_left(usize::from(job.slot));
            self.routes.sa.held += 1;
            self.send_job(now, j);
        }
        // A window below one query holds the backlog back until the pace lets the next go.
        self.routes.pace = match self.routes.backlog.is_empty() {
            true => None,
            false => self.routes.sa.paced_until(now),
        };
        if let Some(at) = self.routes.pace {
            self.timers.arm(Timer::Pace, at);
        }
    }

    /// Runs the due route timers of kind `t` (`Backlog`, `SaReply` or `SaBusy`).
    pub(crate) fn route_timers(&mut self, now: Millis, t: Timer) {
        match t {
            // The backlog is in start order, and so are its deadlines (derived from the start;
            // the SA's answers move them all alike): only its due head is looked at.
            Timer::Backlog => {
                while let Some(j) = self.routes.backlog.front() {
                    let born = self.st.slabs_ref().jobs[j as usize].born;
                    if self.deadline(born) > now {
                        break;
                    }
                    self.stats.timeouts += 1;
                    self.finish_job(now, j, Completion::failed(Status::Etimedout));
                }
            }
            // The SA lists are short (the window): walked whole.
            Timer::SaReply => {
                for id in [list_id::SA_SEND, list_id::SENT] {
                    let mut cur = match id {
                        list_id::SA_SEND => self.routes.send.front(),
                        _ => self.routes.sent.front(),
                    };
                    while let Some(j) = cur {
                        cur = List::next_of(self.st.jobs(), j, JOB);
                        let job = self.st.slabs_ref().jobs[j as usize];
                        if job.timer > now {
                            continue;
                        }
                        // The try's own budget, within the job's deadline as it is now: the
                        // SA's answers since the send may have moved that on.
                        let limit = job
                            .sent
                            .saturating_add(self.sa_deadline_of(usize::from(job.slot)))
                            .min(self.deadline(job.born));
                        if limit > now {
                            self.st.jobs()[j as usize].timer = limit;
                            continue;
                        }
                        self.stats.timeouts += 1;
                        self.finish_job(now, j, Completion::failed(Status::Etimedout));
                    }
                }
            }
            Timer::SaBusy => {
                let mut cur = self.routes.busy.front();
                while let Some(j) = cur {
                    cur = List::next_of(self.st.jobs(), j, JOB);
                    let job = self.st.jobs()[j as usize];
                    if job.timer > now {
                        continue;
                    }
                    if self.deadline(job.born) <= now {
                        self.stats.timeouts += 1;
                        self.finish_job(now, j, Completion::failed(Status::Etimedout));
                    } else {
                        self.requeue_job(now, j);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{constraint, Constraints};

    #[test]
    fn stored_keys_round_trip() {
        assert_eq!(StoredKey::from_key(None).key(7), None);
        let mut c = Constraints::ANY;
        c.mask = constraint::SL | constraint::SERVICE_ID;
        c.sl = 3;
        c.service_id = 0x1234;
        for dest in [Dest::Lid(9), Dest::Gid([0xfe; 16])] {
            let k = PathKey {
                ep: 0x0105,
                dest,
                constraints: c,
            };
            assert_eq!(StoredKey::from_key(Some(k)).key(0x0105), Some(k));
        }
    }
}
