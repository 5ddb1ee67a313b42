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
use super::storage::{bucket_of, list_id, JobState, List, Storage, StoredKey, ADDR_R, JOB, REQ};
use super::timers::Timer;
use super::{AddrEntry, Config, EpSlot, JobSlot, Millis, Output, RequestSlot, Shared};
use crate::cache::{CacheEp, Dest, PathKey};
use crate::wire::client::Status;
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

    pub(crate) fn key(&self, cache_ep: CacheEp) -> Option<PathKey> {
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

/// What a route job resolves: its coalescing key — the endpoint's slot, the cache endpoint
/// number, the SA query record — and the cache key its answer is filed under (`None`:
/// uncacheable).
#[derive(Clone, Copy)]
pub(crate) struct Route<'a> {
    pub(crate) slot: usize,
    pub(crate) cache_ep: CacheEp,
    pub(crate) key: Option<PathKey>,
    pub(crate) sa: &'a [u8; 64],
}

/// How a route job ends ([`Resolver::finish_job`](super::Resolver::finish_job)).
#[derive(Clone, Copy)]
pub(crate) enum Completion<'r> {
    /// The SA's record, inserted into the cache to expire at `expires`.
    FromSa {
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

/// The route jobs, their coalescing index, lists and counts, and the SA window.
pub(crate) struct Routes<S: Storage> {
    /// The job slots.
    pub(crate) jobs: S::Jobs,
    /// The coalescing index's buckets.
    buckets: S::JobBuckets,
    /// The most SA queries in flight at once (the storage's).
    inflight: usize,
    /// The hash seed of the coalescing index.
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

impl<S: Storage> Routes<S> {
    /// Every slot of `jobs` free, an empty index over `buckets`, at most `inflight` queries in
    /// flight.
    pub(crate) fn new(
        mut jobs: S::Jobs,
        mut buckets: S::JobBuckets,
        inflight: usize,
        seed: u64,
        cfg: &Config,
    ) -> Self {
        jobs.fill(JobSlot::EMPTY);
        buckets.fill(0);
        let mut free = List::EMPTY;
        for i in 0..jobs.len() as u32 {
            free.push_back(&mut jobs, i, list_id::FREE, JOB);
        }
        Routes {
            jobs,
            buckets,
            inflight,
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

    /// A job's bucket: by its endpoint's slot and SA record. Its cache number is left out: it
    /// differs between two jobs of one slot and record only across a flush generation (a
    /// reregister), and `find` compares it.
    fn bucket(&self, slot: usize, sa: &[u8; 64]) -> usize {
        bucket_of(
            self.seed,
            (slot as u32).rotate_right(8),
            sa,
            self.buckets.len(),
        )
    }

    /// Job `j`'s bucket.
    fn job_bucket(&self, j: u32) -> usize {
        let job = &self.jobs[j as usize];
        self.bucket(usize::from(job.slot), &job.sa)
    }

    /// The coalescable job for `route` (endpoint, cache_ep, SA record), if one is pending.
    pub(crate) fn find(&self, route: &Route<'_>) -> Option<u32> {
        let Route {
            slot, cache_ep, sa, ..
        } = *route;
        let b = self.bucket(slot, sa);
        chain::find(&self.jobs, &self.buckets, b, |job| {
            !job.query
                && job.state != JobState::Free
                && job.state != JobState::Zombie
                && usize::from(job.slot) == slot
                && job.cache_ep == cache_ep
                && job.sa == *sa
        })
    }

    /// Puts job `j` (not a `query()`) in the coalescing index.
    fn hash(&mut self, j: u32) {
        let b = self.job_bucket(j);
        chain::insert(&mut self.jobs, &mut self.buckets, b, j);
    }

    /// Takes job `j` out of the coalescing index.
    fn unhash(&mut self, j: u32) {
        if self.jobs[j as usize].query {
            return;
        }
        let b = self.job_bucket(j);
        chain::remove(&mut self.jobs, &mut self.buckets, b, j);
    }

    /// Takes job `j` off whichever list its link is on.
    pub(crate) fn unlist(&mut self, j: u32) {
        let jobs = &mut *self.jobs;
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

    fn free_job(&mut self, j: u32) {
        let jobs = &mut *self.jobs;
        jobs[j as usize] = JobSlot::EMPTY;
        self.free.push_back(jobs, j, list_id::FREE, JOB);
        self.active -= 1;
    }

    /// The earliest deadline of timer kind `t` among the jobs (`Backlog`: the backlog is in
    /// deadline order, its head; `SaReply`: the send and sent lists, which a BUSY retry
    /// keeping its start's deadline leaves not quite in order; `SaBusy`: the BUSY list).
    pub(crate) fn earliest(&self, t: Timer, cfg: &Config) -> Option<Millis> {
        let jobs = &*self.jobs;
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
impl<S: Storage> Routes<S> {
    /// Every job is on the list its state says, the counts and the window match; returns how
    /// many requests wait on jobs.
    pub(crate) fn check(&self) -> Result<u32, std::string::String> {
        use std::format;
        let (mut active, mut window, mut waiters) = (0u32, 0u32, 0u32);
        for j in self.jobs.iter() {
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

/// [`Routes::retry`]'s jitter: a lost query's backoff is spread, a BUSY one's is not (the SA
/// named the moment: it was busy then).
const RETRY_LOST: bool = true;
const RETRY_BUSY: bool = false;

impl<S: Storage> Routes<S> {
    /// Room in the SA window for one more job at `now`, over `ports` ports.
    pub(crate) fn window_free(&self, now: Millis, ports: u32) -> bool {
        self.sa.has_room(ports, self.inflight, now)
    }

    /// When a job started at `born` is answered ETIMEDOUT if nothing else answers it
    /// ([`SaWindow::deadline`]: by age, or by the SA's silence, whichever is later).
    pub(crate) fn deadline(&self, born: Millis, cfg: &Config) -> Millis {
        self.sa.deadline(born, cfg)
    }

    /// Whether `job`'s answer could not come back before its deadline.
    pub(crate) fn too_late(&self, now: Millis, job: &JobSlot, cfg: &Config) -> bool {
        self.sa.too_late(now, self.deadline(job.born, cfg))
    }

    /// A new job for `route` started at `now` (a `query()`'s when `query`: never cached, not
    /// in the coalescing table); neither sent nor backlogged yet
    /// ([`send_job`](Self::send_job), [`push_backlog`](Self::push_backlog)). `None` if every
    /// job slot is taken.
    pub(crate) fn start(&mut self, now: Millis, route: &Route<'_>, query: bool) -> Option<u32> {
        let jobs = &mut *self.jobs;
        let j = self.free.pop_front(jobs, list_id::FREE, JOB)?;
        let job = &mut jobs[j as usize];
        *job = JobSlot::EMPTY;
        job.slot = route.slot as u8;
        job.cache_ep = route.cache_ep;
        job.query = query;
        job.born = now;
        job.key = StoredKey::from_key(if query { None } else { route.key });
        job.sa = *route.sa;
        if !query {
            self.hash(j);
        }
        self.active += 1;
        Some(j)
    }

    /// Appends job `j` to the backlog (the caller counts it in its endpoint's backlog).
    pub(crate) fn push_backlog(&mut self, now: Millis, j: u32, sh: &mut Shared) {
        let at = self.deadline(now, &sh.cfg);
        let jobs = &mut *self.jobs;
        jobs[j as usize].state = JobState::Backlog;
        self.backlog.push_back(jobs, j, list_id::BACKLOG, JOB);
        sh.timers.arm(Timer::Backlog, at);
    }

    /// Takes job `j` out of the backlog into a window slot (the caller sends it).
    pub(crate) fn unbacklog(&mut self, j: u32) {
        self.backlog
            .remove(&mut self.jobs, j, list_id::BACKLOG, JOB);
        self.sa.held += 1;
    }

    /// A BUSY job whose backoff ended: it gives its window slot back and waits in the backlog,
    /// in deadline (= start) order, for the window, which BUSY has shrunk meanwhile, to let it
    /// go again (`pump`, right after the timers). Re-sent at once instead, every query that was
    /// out when the SA said BUSY would go again whatever the window: a storm's resolvers would
    /// keep their whole first window in the SA's face. Returns the job's endpoint slot (whose
    /// backlog it entered).
    pub(crate) fn requeue(&mut self, now: Millis, j: u32, sh: &mut Shared) -> usize {
        self.unlist(j);
        self.sa.held -= 1;
        let born = self.jobs[j as usize].born;
        let at = self.deadline(born, &sh.cfg);
        let jobs = &mut *self.jobs;
        jobs[j as usize].state = JobState::Backlog;
        let mut before = self.backlog.front();
        while let Some(b) = before {
            if jobs[b as usize].born > born {
                break;
            }
            before = List::next_of(jobs, b, JOB);
        }
        self.backlog
            .insert_before(jobs, j, before, list_id::BACKLOG, JOB);
        sh.timers.arm(Timer::Backlog, at.max(now));
        usize::from(jobs[j as usize].slot)
    }

    /// Puts job `j` (already holding a window slot) on the SA send list with a fresh TID,
    /// each try allowed `try_ms` (its endpoint's SA deadline) within the job's deadline, over
    /// `ports` ports.
    pub(crate) fn send_job(
        &mut self,
        now: Millis,
        j: u32,
        try_ms: Millis,
        ports: u32,
        sh: &mut Shared,
    ) {
        self.unlist(j);
        let tid = sh.next_tid();
        let born = self.jobs[j as usize].born;
        // Each try has its deadline, and the whole job (backlog, tries, backoffs) has its own:
        // with the SA gone, nothing waits longer than `queue_deadline` from its start.
        let at = now.saturating_add(try_ms).min(self.deadline(born, &sh.cfg));
        let jobs = &mut *self.jobs;
        let job = &mut jobs[j as usize];
        job.state = JobState::Send;
        job.tid = tid;
        job.timer = at;
        job.sent = now;
        self.send.push_back(jobs, j, list_id::SA_SEND, JOB);
        self.sa.sent(now, ports);
        sh.timers.arm(Timer::SaReply, at);
    }

    /// Adds request slot `waiter` to job `j`'s waiters (over the request slots `reqs`).
    pub(crate) fn add_waiter(&mut self, reqs: &mut [RequestSlot], j: u32, waiter: u32) {
        self.jobs[j as usize]
            .waiters
            .push_back(reqs, waiter, list_id::WAITERS, REQ);
    }

    /// Adds address entry `a` (on no job yet) to job `j`'s addresses, aliased to its path when
    /// it is found.
    pub(crate) fn add_addr(&mut self, addrs: &mut [AddrEntry], j: u32, a: u32) {
        if addrs[a as usize].job == 0 {
            self.jobs[j as usize]
                .addrs
                .push_back(addrs, a, list_id::ROUTE_ADDRS, ADDR_R);
            addrs[a as usize].job = j + 1;
        }
    }

    /// The next SA query to send: the send list's head, now held by the caller (`Sent`).
    pub(crate) fn poll(&mut self, eps: &[EpSlot]) -> Option<Output> {
        let jobs = &mut *self.jobs;
        let j = self.send.pop_front(jobs, list_id::SA_SEND, JOB)?;
        let job = &mut jobs[j as usize];
        job.state = JobState::Sent;
        job.held = true;
        let (slot, tid, sa) = (usize::from(job.slot), job.tid, job.sa);
        self.sent.push_back(jobs, j, list_id::SENT, JOB);
        Some(Output::SendSa {
            ep: eps[slot].id,
            token: mads::token(mads::TOKEN_ROUTE, j, tid),
            mad: mads::path_get(tid, &sa),
        })
    }

    /// Job `j` is done (its waiters answered, its addresses told): out of the coalescing
    /// index and its list, freed, or kept as a zombie while the caller holds its MAD.
    pub(crate) fn end(&mut self, j: u32) {
        let (state, held) = (self.jobs[j as usize].state, self.jobs[j as usize].held);
        self.unhash(j);
        self.unlist(j);
        let holds_window = matches!(state, JobState::Send | JobState::Sent | JobState::Busy);
        if held {
            let jb = &mut self.jobs[j as usize];
            jb.state = JobState::Zombie;
            jb.waiters = List::EMPTY;
            jb.addrs = List::EMPTY;
        } else {
            if holds_window {
                self.sa.held -= 1;
            }
            self.free_job(j);
        }
    }

    /// Frees a zombie whose MAD the caller will never hand back (endpoint closed, shutdown).
    pub(crate) fn free_zombie(&mut self, j: u32) {
        if self.jobs[j as usize].state == JobState::Zombie {
            self.sa.held -= 1;
            self.free_job(j);
        }
    }

    /// An SA completion of route job `j`: the reply's effect on the window, a lost or BUSY
    /// query backed off; what the SA said when the caller is to finish the job — a record, a
    /// failure, or `Busy`: BUSY with the job's retries spent (ETIMEDOUT) — or `None`: nothing
    /// more to do (a reply matching nothing, counted; a zombie freed; a query backed off).
    pub(crate) fn reply(
        &mut self,
        now: Millis,
        (j, tid): (u32, u32),
        umad_status: u32,
        mad: &[u8; 256],
        sh: &mut Shared,
    ) -> Option<SaOutcome> {
        let Some(job) = self.jobs.get(j as usize) else {
            sh.stats.sa_unknown += 1;
            return None;
        };
        if !job.held || job.tid != tid {
            sh.stats.sa_unknown += 1;
            return None;
        }
        let (state, sent) = (job.state, job.sent);
        // The caller handed its MAD back: nothing of this job is outstanding any more.
        self.jobs[j as usize].held = false;
        if state == JobState::Zombie {
            self.free_zombie(j);
            return None;
        }
        if state != JobState::Sent {
            sh.stats.sa_unknown += 1;
            return None;
        }
        if umad_status == 0 && mads::tid_low(mad) != tid {
            // Not the reply to this TID; the deadline answers the waiters.
            sh.stats.sa_unknown += 1;
            return None;
        }
        let outcome = mads::classify_path_reply(umad_status, mad);
        let sample = now.saturating_sub(sent);
        if umad_status == 0 {
            let busy = outcome == SaOutcome::Busy;
            self.sa.replied(now, sample, busy, &sh.cfg);
        } else if umad_status == TIMED_OUT {
            // No answer to any try: the SA dropped it, or is gone. (Any other status is a
            // send that failed here, answered at once as before.)
            sh.stats.sa_lost += 1;
            self.sa.lost(now, &sh.cfg);
            if self.retry(now, j, RETRY_LOST, sh) {
                return None;
            }
        }
        if outcome == SaOutcome::Busy {
            // The SA is overloaded (the window halved above: the jobs already out stay out;
            // new ones wait for it).
            sh.stats.sa_busy += 1;
            if self.retry(now, j, RETRY_BUSY, sh) {
                return None;
            }
        }
        Some(outcome)
    }

    /// Puts job `j` (its reply just came) in the BUSY list to go again after a backoff:
    /// `sa_busy_backoff` doubled per retry, with `jitter` (a lost query's backoff is spread
    /// over ½–1½ of it, so the nodes of a storm do not all come back at once), within the
    /// job's deadline. False if its retries (`sa_busy_retries`) are spent or the deadline has
    /// passed: the caller answers it.
    fn retry(&mut self, now: Millis, j: u32, jitter: bool, sh: &mut Shared) -> bool {
        let job = &self.jobs[j as usize];
        let (born, busy_tries) = (job.born, job.busy_tries);
        let deadline = self.deadline(born, &sh.cfg);
        if busy_tries >= sh.cfg.sa_busy_retries || now >= deadline {
            return false;
        }
        let mut wait = sh.cfg.sa_busy_backoff << busy_tries.min(16);
        if jitter && wait > 1 {
            wait = wait / 2 + self.random() % wait;
        }
        let at = now.saturating_add(wait).min(deadline);
        self.unlist(j);
        let jobs = &mut *self.jobs;
        let jb = &mut jobs[j as usize];
        jb.state = JobState::Busy;
        jb.busy_tries += 1;
        jb.timer = at;
        self.busy.push_back(jobs, j, list_id::BUSY, JOB);
        sh.timers.arm(Timer::SaBusy, at);
        true
    }

    /// A window below one query holds the backlog back until the pace lets the next go.
    pub(crate) fn set_pace(&mut self, now: Millis, sh: &mut Shared) {
        self.pace = match self.backlog.is_empty() {
            true => None,
            false => self.sa.paced_until(now),
        };
        if let Some(at) = self.pace {
            sh.timers.arm(Timer::Pace, at);
        }
    }

    /// The backlog's head if its deadline has passed at `now` (the backlog is in start
    /// order, and so are its deadlines: derived from the start, the SA's answers move them
    /// all alike).
    pub(crate) fn backlog_due(&self, now: Millis, cfg: &Config) -> Option<u32> {
        let j = self.backlog.front()?;
        (self.deadline(self.jobs[j as usize].born, cfg) <= now).then_some(j)
    }

    /// Whether sent job `j`'s reply deadline has passed at `now` for good: a try's timer that
    /// fired is moved on to the try's own budget (`try_ms` from its send) within the job's
    /// deadline as it is now (the SA's answers since the send may have moved that on).
    pub(crate) fn reply_late(&mut self, j: u32, now: Millis, try_ms: Millis, cfg: &Config) -> bool {
        let job = self.jobs[j as usize];
        if job.timer > now {
            return false;
        }
        let limit = job
            .sent
            .saturating_add(try_ms)
            .min(self.deadline(job.born, cfg));
        if limit > now {
            self.jobs[j as usize].timer = limit;
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{constraint, Constraints};

    #[test]
    fn stored_keys_round_trip() {
        let ep = crate::cache::ep_number(1, 5);
        assert_eq!(StoredKey::from_key(None).key(ep), None);
        let mut c = Constraints::ANY;
        c.mask = constraint::SL | constraint::SERVICE_ID;
        c.sl = 3;
        c.service_id = 0x1234;
        for dest in [Dest::Lid(9), Dest::Gid([0xfe; 16])] {
            let k = PathKey {
                ep,
                dest,
                constraints: c,
            };
            assert_eq!(StoredKey::from_key(Some(k)).key(ep), Some(k));
        }
    }
}
