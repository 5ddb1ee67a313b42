//! Route resolution: SA PathRecord jobs, coalescing, the SA window and backlog, BUSY backoff,
//! deadlines, negative caching, refresh-ahead, and the timers of the whole resolver.
//!
//! A route job is one coalescing key — (endpoint, cache endpoint number, SA query record) —
//! with a FIFO of waiting requests and a list of address entries whose route it is. At most
//! `min(sa_window, sa_inflight)` jobs hold the SA window (sent, BUSY-waiting, or answered while
//! the caller still holds their MAD); the rest wait FIFO in the backlog, each with its own
//! deadline (`queue_deadline` from arrival).

use super::mads::{self, SaOutcome};
use super::storage::{bucket_hash, list_id, AddrState, GroupState, JobState, List, StoredKey};
use super::{
    addr, addr_rlink, job_link, Counter, EpId, JobSlot, Millis, Request, Resolver, Storage, NEVER,
};
use crate::cache::{CacheRef, Dest, Lookup, PathKey};
use crate::wire::client::{AcmMsg, EpInfoType, Status};

impl StoredKey {
    pub(crate) fn from_key(k: Option<PathKey>) -> StoredKey {
        match k {
            None => StoredKey::NONE,
            Some(k) => {
                let (kind, lid, gid) = match k.dest {
                    Dest::Lid(l) => (1, l, [0; 16]),
                    Dest::Gid(g) => (2, 0, g),
                };
                StoredKey {
                    kind,
                    lid,
                    gid,
                    constraints: k.constraints,
                }
            }
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

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    fn job_hash(&self, slot: usize, cache_ep: u32, sa: &[u8; 64]) -> u64 {
        // The slot in the top byte, over the generation bits a cache number rarely reaches.
        bucket_hash(self.seed, (slot as u32).rotate_right(8) ^ cache_ep, sa)
    }

    fn job_bucket(&mut self, slot: usize, cache_ep: u32, sa: &[u8; 64]) -> usize {
        let h = self.job_hash(slot, cache_ep, sa);
        (h % self.st.job_buckets().len() as u64) as usize
    }

    /// The coalescable job for (endpoint, cache_ep, SA record), if one is pending.
    pub(crate) fn find_job(&mut self, slot: usize, cache_ep: u32, sa: &[u8; 64]) -> Option<u32> {
        let b = self.job_bucket(slot, cache_ep, sa);
        let mut cur = self.st.job_buckets()[b];
        while let Some(j) = cur.checked_sub(1) {
            let job = &self.st.jobs()[j as usize];
            if !job.query
                && job.state != JobState::Free
                && job.state != JobState::Zombie
                && usize::from(job.ep) == slot
                && job.cache_ep == cache_ep
                && job.sa == *sa
            {
                return Some(j);
            }
            cur = job.hnext;
        }
        None
    }

    fn unhash_job(&mut self, j: u32) {
        let job = self.st.jobs()[j as usize];
        if job.query {
            return;
        }
        let b = self.job_bucket(usize::from(job.ep), job.cache_ep, &job.sa);
        let mut cur = self.st.job_buckets()[b];
        let mut prev: Option<u32> = None;
        while let Some(c) = cur.checked_sub(1) {
            let next = self.st.jobs()[c as usize].hnext;
            if c == j {
                match prev {
                    Some(p) => self.st.jobs()[p as usize].hnext = next,
                    None => self.st.job_buckets()[b] = next,
                }
                self.st.jobs()[j as usize].hnext = 0;
                return;
            }
            prev = Some(c);
            cur = next;
        }
    }

    /// Room in the SA window: `sa_cap` (the configured window, shrunk by BUSY) per port,
    /// never more than the storage's in-flight capacity, never less than 1.
    fn window_free(&self) -> bool {
        (self.window as usize)
            < (self.sa_cap as usize)
                .saturating_mul(self.ports.max(1) as usize)
                .min(self.st.sa_inflight())
                .max(1)
    }

    /// A BUSY job whose backoff ended: it gives its window slot back and waits in the backlog,
    /// in deadline (= start) order, for the window, which BUSY has shrunk meanwhile, to let it
    /// go again (`pump`, right after the timers). Re-sent at once instead, every query that was
    /// out when the SA said BUSY would go again whatever the window: a storm's resolvers would
    /// keep their whole first window in the SA's face.
    fn requeue_job(&mut self, now: Millis, j: u32) {
        self.unlist_job(j);
        self.window -= 1;
        let born = self.st.jobs()[j as usize].born;
        let at = born.saturating_add(self.cfg.queue_deadline);
        {
            let jb = &mut self.st.jobs()[j as usize];
            jb.state = JobState::Backlog;
            jb.timer = at;
        }
        let mut before = self.backlog.front();
        while let Some(b) = before {
            if self.st.jobs()[b as usize].born > born {
                break;
            }
            before = List::next_of(self.st.jobs(), b, job_link);
        }
        self.backlog
            .insert_before(self.st.jobs(), j, before, list_id::BACKLOG, job_link);
        self.arm(at.max(now));
    }

    /// Whether fewer than two SA round trips (the smoothed estimate; none before a first reply)
    /// are left before `job`'s deadline.
    fn too_late(&self, now: Millis, job: &JobSlot) -> bool {
        let left = job
            .born
            .saturating_add(self.cfg.queue_deadline)
            .saturating_sub(now);
        self.sa_rtt > 0 && left < self.sa_rtt.saturating_mul(2)
    }

    /// An SA answer (record or failure) arrived: after a window's worth of answers the window
    /// grows by one (additive increase; BUSY halves it).
    fn sa_answered(&mut self, now: Millis) {
        // After a BUSY the window does not grow for a while: every resolver on the fabric
        // probing upward at once is what filled the SA's queue.
        if self.sa_cap >= self.cfg.sa_window || now < self.sa_hold {
            return;
        }
        self.sa_acks += 1;
        if self.sa_acks >= self.sa_cap {
            self.sa_acks = 0;
            self.sa_cap += 1;
        }
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
            .free_jobs
            .pop_front(self.st.jobs(), list_id::FREE, job_link)?;
        {
            let job = &mut self.st.jobs()[j as usize];
            *job = JobSlot::EMPTY;
            job.ep = slot as u8;
            job.cache_ep = cache_ep;
            job.query = query;
            job.born = now;
            job.key = StoredKey::from_key(if query { None } else { key });
            job.sa = *sa;
        }
        if !query {
            let b = self.job_bucket(slot, cache_ep, sa);
            let head = self.st.job_buckets()[b];
            self.st.jobs()[j as usize].hnext = head;
            self.st.job_buckets()[b] = j + 1;
        }
        self.jobs_active += 1;
        if self.window_free() {
            self.window += 1;
            self.send_job(now, j);
        } else {
            let at = now.saturating_add(self.cfg.queue_deadline);
            let job = &mut self.st.jobs()[j as usize];
            job.state = JobState::Backlog;
            job.timer = at;
            self.backlog
                .push_back(self.st.jobs(), j, list_id::BACKLOG, job_link);
            self.arm(at);
        }
        Some(j)
    }

    /// Puts job `j` (already holding a window slot) on the SA send list with a fresh TID.
    fn send_job(&mut self, now: Millis, j: u32) {
        self.unlist_job(j);
        let tid = self.next_tid();
        let (slot, born) = {
            let job = &self.st.jobs()[j as usize];
            (usize::from(job.ep), job.born)
        };
        // Each try has its deadline, and the whole job (backlog, tries, BUSY backoffs) has
        // `queue_deadline` from its start: nothing waits longer, even with the SA gone.
        let at = now
            .saturating_add(self.sa_deadline_of(slot))
            .min(born.saturating_add(self.cfg.queue_deadline));
        let ep = {
            let job = &mut self.st.jobs()[j as usize];
            job.state = JobState::Send;
            job.tid = tid;
            job.timer = at;
            job.sent = now;
            job.ep
        };
        self.sa_send
            .push_back(self.st.jobs(), j, list_id::SA_SEND, job_link);
        let id = EpId(self.st.endpoints()[usize::from(ep)].id);
        self.count(id, Counter::RouteQuery);
        self.arm(at);
    }

    /// Adds `waiter` (and address entry `addr`) to the job for (slot, cache_ep, sa), starting
    /// one if none is pending. A full job table answers the waiter ENOMEM.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn join_route(
        &mut self,
        now: Millis,
        slot: usize,
        cache_ep: u32,
        key: Option<PathKey>,
        sa: &[u8; 64],
        waiter: Option<u32>,
        addr: Option<u32>,
    ) {
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
        if let Some(w) = waiter {
            let mut l = self.st.jobs()[j as usize].waiters;
            l.push_back(self.st.requests(), w, list_id::WAITERS, super::req_link);
            self.st.jobs()[j as usize].waiters = l;
        }
        if let Some(a) = addr {
            if self.st.addrs()[a as usize].job == 0 {
                let mut l = self.st.jobs()[j as usize].addrs;
                l.push_back(self.st.addrs(), a, list_id::ROUTE_ADDRS, addr_rlink);
                self.st.jobs()[j as usize].addrs = l;
                self.st.addrs()[a as usize].job = j + 1;
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
                let mut l = self.st.jobs()[j as usize].waiters;
                l.push_back(self.st.requests(), w, list_id::WAITERS, super::req_link);
                self.st.jobs()[j as usize].waiters = l;
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
        self.join_route(now, slot, r.cache_ep, key, sa, waiter, None);
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
        while let Some(a) = addrs.pop_front(self.st.addrs(), list_id::ROUTE_ADDRS, addr_rlink) {
            self.st.addrs()[a as usize].job = 0;
            if let (Some(exp), Some(k)) = (path_expires, key) {
                let e = self.st.addrs()[a as usize];
                if e.state == AddrState::Resolved {
                    addr::alias(&mut self.w, &e, &k, now, exp);
                }
            }
        }
        let mut waiters = job.waiters;
        while let Some(w) = waiters.pop_front(self.st.requests(), list_id::WAITERS, super::req_link)
        {
            let path = if status == Status::Success {
                record
            } else if job.query {
                query_record
            } else {
                None
            };
            if from_cache && !self.st.requests()[w as usize].query {
                let ep = EpId(self.st.requests()[w as usize].ep);
                self.count(ep, Counter::RouteCache);
            }
            self.answer(w, status, path);
        }
        self.unhash_job(j);
        self.unlist_job(j);
        let holds_window = matches!(job.state, JobState::Send | JobState::Sent | JobState::Busy);
        if job.held {
            let jb = &mut self.st.jobs()[j as usize];
            jb.state = JobState::Zombie;
            jb.waiters = List::EMPTY;
            jb.addrs = List::EMPTY;
        } else {
            if holds_window {
                self.window -= 1;
            }
            self.free_job(j);
        }
    }

    /// Takes job `j` off whichever list its link is on.
    fn unlist_job(&mut self, j: u32) {
        let on = self.st.jobs()[j as usize].qlink.on;
        let list = match on {
            list_id::BACKLOG => &mut self.backlog,
            list_id::SA_SEND => &mut self.sa_send,
            list_id::SENT => &mut self.sent,
            list_id::BUSY => &mut self.busy,
            _ => return,
        };
        list.remove(self.st.jobs(), j, on, job_link);
    }

    fn free_job(&mut self, j: u32) {
        self.st.jobs()[j as usize] = JobSlot::EMPTY;
        self.free_jobs
            .push_back(self.st.jobs(), j, list_id::FREE, job_link);
        self.jobs_active -= 1;
    }

    /// Frees a zombie whose MAD the caller will never hand back (endpoint closed, shutdown).
    pub(crate) fn free_zombie(&mut self, j: u32) {
        if self.st.jobs()[j as usize].state == JobState::Zombie {
            self.window -= 1;
            self.free_job(j);
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
        if umad_status == 0 {
            let sample = now.saturating_sub(job.sent);
            self.sa_rtt = if self.sa_rtt == 0 {
                sample.max(1)
            } else {
                (self.sa_rtt * 7 + sample) / 8
            };
            if outcome != SaOutcome::Busy {
                self.sa_answered(now);
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
                let mut sa_record = [0u8; 64];
                sa_record.copy_from_slice(&mad[56..120]);
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
                // The SA is overloaded: halve what we keep in flight (the jobs already out
                // stay out; new ones wait for the window).
                self.stats.sa_busy += 1;
                self.sa_cap = (self.sa_cap / 2).max(1);
                self.sa_acks = 0;
                self.sa_hold = now.saturating_add(self.cfg.sa_deadline);
                if job.busy_tries >= self.cfg.sa_busy_retries {
                    self.stats.timeouts += 1;
                    self.finish_job(now, j, Completion::failed(Status::Etimedout));
                    return;
                }
                let wait = self.cfg.sa_busy_backoff << job.busy_tries.min(16);
                let at = now
                    .saturating_add(wait)
                    .min(job.born.saturating_add(self.cfg.queue_deadline));
                self.unlist_job(j);
                let jb = &mut self.st.jobs()[j as usize];
                jb.state = JobState::Busy;
                jb.busy_tries += 1;
                jb.timer = at;
                self.busy
                    .push_back(self.st.jobs(), j, list_id::BUSY, job_link);
                self.arm(at);
            }
        }
    }

    /// Moves backlog jobs into free window slots (answering those the cache can answer now)
    /// and address queries into free ACM windows; drops removed local addresses' aliases.
    pub(crate) fn pump(&mut self, now: Millis) {
        while let Some(i) =
            self.removals
                .pop_front(self.st.addrs(), list_id::REMOVALS, super::addr_qlink)
        {
            let a = self.st.addrs()[i as usize];
            if let Some(k) = addr::addr_key(&a) {
                self.w.remove_addr(&k);
            }
            self.free_addr(i);
        }
        while self.window_free() {
            let Some(j) = self.backlog.front() else {
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
                        let (slot, cep, sa) = (usize::from(job.ep), job.cache_ep, job.sa);
                        let how = Completion::FromCache {
                            record: &record,
                            expires: expires_at,
                        };
                        self.finish_job(now, j, how);
                        if needs_refresh {
                            self.join_route(now, slot, cep, Some(k), &sa, None, None);
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
            self.backlog
                .remove(self.st.jobs(), j, list_id::BACKLOG, job_link);
            self.window += 1;
            self.send_job(now, j);
        }
        if self.acm_active > 0 {
            for slot in 0..self.st.endpoints().len() {
                self.pump_acm(now, slot);
            }
        }
    }

    /// Runs every due timer.
    pub(crate) fn run_timers(&mut self, now: Millis) {
        // The backlog is in arrival (= deadline) order: only its due head is looked at. The
        // SA lists are short (the window) and not quite in deadline order (a BUSY retry keeps
        // its start's deadline), so they are walked whole.
        while let Some(j) = self.backlog.front() {
            if self.st.jobs()[j as usize].timer > now {
                break;
            }
            self.stats.timeouts += 1;
            self.finish_job(now, j, Completion::failed(Status::Etimedout));
            self.unlist_job(j);
        }
        for id in [list_id::SA_SEND, list_id::SENT] {
            let mut cur = if id == list_id::SA_SEND {
                self.sa_send.front()
            } else {
                self.sent.front()
            };
            while let Some(j) = cur {
                cur = List::next_of(self.st.jobs(), j, job_link);
                if self.st.jobs()[j as usize].timer <= now {
                    self.stats.timeouts += 1;
                    self.finish_job(now, j, Completion::failed(Status::Etimedout));
                    // A zombie (the caller holds its MAD) is on no list any more.
                    self.unlist_job(j);
                }
            }
        }
        let mut cur = self.busy.front();
        while let Some(j) = cur {
            cur = List::next_of(self.st.jobs(), j, job_link);
            let job = self.st.jobs()[j as usize];
            if job.timer > now {
                continue;
            }
            if job.born.saturating_add(self.cfg.queue_deadline) <= now {
                self.stats.timeouts += 1;
                self.finish_job(now, j, Completion::failed(Status::Etimedout));
            } else {
                self.requeue_job(now, j);
            }
        }
        for slot in 0..self.st.endpoints().len() {
            let e = self.st.endpoints()[slot];
            if !e.open {
                continue;
            }
            for g in 0..2 {
                match e.groups[g].t.due(now) {
                    Some(GroupState::Joining) => self.join_failed(now, slot, g),
                    Some(GroupState::Retry) => self.start_join(now, slot, g),
                    _ => {}
                }
            }
            self.inform_timers(now, slot);
            self.acm_timers(now, slot);
        }
    }

    /// The earliest armed timer (a full scan; run after timers fired).
    pub(crate) fn scan_timers(&mut self) -> Option<Millis> {
        let mut next: Option<Millis> = None;
        let mut at = |t: Millis| next = Some(next.map_or(t, |n: Millis| n.min(t)));
        if let Some(head) = self.backlog.front() {
            at(self.st.jobs()[head as usize].timer);
        }
        for first in [self.sa_send.front(), self.sent.front(), self.busy.front()] {
            let mut cur = first;
            while let Some(j) = cur {
                at(self.st.jobs()[j as usize].timer);
                cur = List::next_of(self.st.jobs(), j, job_link);
            }
        }
        for e in self.st.endpoints().iter() {
            if !e.open {
                continue;
            }
            // A SET not polled yet (Send) has no timer running.
            for t in e
                .groups
                .iter()
                .map(|g| g.t)
                .chain(e.informs.iter().map(|n| n.t))
            {
                if let Some(t) = t.armed() {
                    at(t);
                }
            }
        }
        for slot in 0..self.st.endpoints().len() {
            let e = self.st.endpoints()[slot];
            for head in [e.queue.front(), e.inflight.front()].into_iter().flatten() {
                at(self.st.addrs()[head as usize].timer);
            }
        }
        next
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
