//! The resolver's cross-part steps: what one part's event means for the others. A request
//! becomes a waiter on a route job or an address entry; a route job that ends answers its
//! waiters and aliases its addresses; a resolved address is routed; the pumps let backlogged
//! jobs and queued address queries go; the timers of each part are run and what they end is
//! answered; a Report forgets addresses. Each part's own rules are its own methods
//! ([`Routes`](super::route::Routes), [`Addrs`](super::addr::Addrs),
//! [`Answers`](super::answers::Answers), [`Groups`](super::groups::Groups),
//! [`Informs`](super::inform::Informs), [`TableFetch`](super::storage::TableFetch),
//! [`Endpoints`](super::endpoints::Endpoints));
//! these steps only lend each the other parts' slabs and the services it needs, and carry
//! results between them.

use super::addr;
use super::groups::Set;
use super::mads;
use super::route::{Completion, Route};
use super::storage::{
    list_id, AddrState, GroupState, JobState, Joiner, List, Origin, ADDR_Q, JOB, REQ,
};
use super::timers::Timer;
use super::{
    acm, endpoints, front, request, table, Counter, EpId, Kind, Millis, RecvMeta, Request,
    Resolver, Storage, NEVER,
};
use crate::cache::{AddrKey, CacheRef, Lookup};
use crate::wire::acm_mad::{AcmResolveRepr, AddressType};
use crate::wire::client::{AcmMsg, EpInfoType, Status};
use crate::wire::gid::Gid;
use crate::wire::mad::Method;
use crate::wire::path_record::{PathRecord, PATH_RECORD_LEN};

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// A request on its way in: its endpoint (an unknown or closed one, or a resolver shut
    /// down, answers ENODATA), then the route or address step it needs, then the pumps.
    pub(crate) fn take_request(
        &mut self,
        now: Millis,
        r: &Request<'_>,
        target: Option<&request::Target>,
    ) {
        let slot = match self.eps.slot(r.head.ep) {
            Some(s) if !self.done => s,
            _ => {
                self.answer_now(r, Status::Enodata, None);
                return;
            }
        };
        self.eps.slots[slot].cache_ep = r.head.cache_ep;
        match target {
            Some(t) if r.head.kind != Kind::Query => self.resolve_request(now, slot, r, t),
            _ => self.query_request(now, slot, r),
        }
        self.pump(now);
    }

    /// A RESOLVE (or Prime, Refresh) request meets the cache again here if its entry may have
    /// arrived since the caller's front looked (the cache was written since, or the front did
    /// not say when it looked: [`RequestHead::front_writes`](super::RequestHead::front_writes)).
    /// [`front::decide`] says what follows, as it does on the caller's hit path.
    fn resolve_request(
        &mut self,
        now: Millis,
        slot: usize,
        r: &Request<'_>,
        target: &request::Target,
    ) {
        use front::Front;
        use request::Target;
        // A refresh renews the route whatever the cache holds now; the front's miss stands
        // while nothing was written since (the writer's own count: exact).
        let cache = self.w.cache();
        let lookup = match r.head.kind {
            Kind::Refresh => Lookup::Miss,
            _ if r.head.front_writes == Some(cache.writes()) => Lookup::Miss,
            _ => front::look(cache, target, now, false),
        };
        let (refresh, wait) = match (r.head.kind, front::decide(target, true, &lookup)) {
            (_, Front::Answer(status)) => {
                if matches!(target, Target::Fail(Status::Einval)) {
                    self.sh.stats.malformed += 1;
                }
                self.answer_now(r, status, None);
                return;
            }
            (_, Front::Hit { refresh }) => {
                if let (Kind::Resolve, Lookup::Hit { record, .. }) = (r.head.kind, &lookup) {
                    self.count(r.head.ep, Counter::RouteCache);
                    self.answer_now(r, Status::Success, Some(record));
                }
                if !refresh {
                    return;
                }
                (true, false)
            }
            (Kind::Refresh, _) => (true, false),
            (_, Front::Prime) => {
                self.answer_now(r, Status::Enodata, None);
                (false, false)
            }
            (kind, Front::HandOver) => (false, kind == Kind::Resolve),
        };
        match target {
            Target::Route { key, record, .. } => {
                let sa = record.query_record(&self.eps.slots[slot].view(r.head.cache_ep));
                let route = Route {
                    slot,
                    cache_ep: r.head.cache_ep,
                    key: key.map(|k| k.key()),
                    sa: &sa,
                };
                self.route_query(now, r, &route, wait);
            }
            Target::Address { key, .. } if refresh => self.addr_refresh(now, slot, r, key),
            Target::Address { key, .. } => self.addr_query(now, slot, r, key, wait),
            Target::Fail(_) => {}
        }
    }

    // ---- Answers: a request slot and its endpoint's counters.

    /// A waiting request slot for `r`, or `None` after answering it ENOMEM (every slot in use).
    pub(crate) fn waiter(&mut self, r: &Request<'_>) -> Option<u32> {
        let w = self.answers.alloc(r, true);
        if w.is_none() {
            self.sh.stats.full += 1;
            self.answer_now(r, Status::Enomem, None);
        }
        w
    }

    /// Answers `r` at once (Resolve and Query only).
    pub(crate) fn answer_now(&mut self, r: &Request<'_>, status: Status, path: Option<&[u8; 64]>) {
        if !matches!(r.head.kind, Kind::Resolve | Kind::Query) {
            return;
        }
        match self.answers.alloc(r, false) {
            Some(i) => self.answer(i, status, path),
            None => self.sh.stats.lost += 1,
        }
    }

    /// Answers waiting request `i` (exactly once: a slot not waiting is left alone).
    pub(crate) fn answer(&mut self, i: u32, status: Status, path: Option<&[u8; 64]>) {
        if let Some((ep, Some(counter))) = self.answers.answer(i, status, path) {
            self.eps.count(ep, counter);
        }
    }

    /// Answers every request on `list` (a waiter FIFO) and leaves it empty.
    pub(crate) fn answer_list(&mut self, list: &mut List, status: Status, path: Option<&[u8; 64]>) {
        while let Some(w) = list.pop_front(&mut self.answers.reqs, list_id::WAITERS, REQ) {
            self.answer(w, status, path);
        }
    }

    /// Bumps `counter` of endpoint `ep` (emitted as [`super::Output::Count`]).
    pub(crate) fn count(&mut self, ep: EpId, counter: Counter) {
        self.eps.count(ep, counter);
    }

    // ---- Route jobs.

    /// After every input: drops removed addresses' cache aliases, lets backlog jobs into the
    /// SA window and queued address queries into the ACM windows.
    pub(crate) fn pump(&mut self, now: Millis) {
        self.drop_removed();
        self.pump_backlog(now);
        self.pump_acm_all(now);
    }

    /// Room in the SA window for one more job at `now`.
    fn window_free(&self, now: Millis) -> bool {
        self.routes.window_free(now, self.eps.ports)
    }

    /// Starts a job: sent at once if the SA window has room, else queued in the backlog.
    pub(crate) fn start_job(&mut self, now: Millis, route: &Route<'_>, query: bool) -> Option<u32> {
        let slot = route.slot;
        let j = self.routes.start(now, route, query)?;
        if !query {
            let dlid = PathRecord::new_unchecked(&route.sa[..]).dlid();
            self.eps.slots[slot].table.saw_lid(dlid);
        }
        if self.routes.backlog.is_empty() && self.window_free(now) {
            self.routes.sa.held += 1;
            self.send_job(now, j);
        } else {
            self.routes.push_backlog(now, j, &mut self.sh);
            self.backlog_entered(now, slot);
        }
        Some(j)
    }

    /// Puts job `j` (already holding a window slot) on the SA send list; a ROUTE_QUERY.
    fn send_job(&mut self, now: Millis, j: u32) {
        let slot = usize::from(self.routes.jobs[j as usize].slot);
        let try_ms = endpoints::sa_deadline(&self.eps.slots, slot, &self.sh);
        let ports = self.eps.ports;
        self.routes.send_job(now, j, try_ms, ports, &mut self.sh);
        let id = self.eps.slots[slot].id;
        self.count(id, Counter::RouteQuery);
    }

    /// Counts a job of endpoint `slot` entering the backlog, and asks for the endpoint's table
    /// (or its probe first) if the backlog now makes one worth it (the decision:
    /// [`TableFetch::backlog_entered`](super::storage::TableFetch::backlog_entered)).
    fn backlog_entered(&mut self, now: Millis, slot: usize) {
        let e = &mut self.eps.slots[slot];
        let ask = e.table.backlog_entered(e.open, now, &self.sh.cfg);
        self.ask(slot, ask);
    }

    /// Decides what `ask` says for endpoint `slot`: its table or its probe (polled out by its
    /// endpoint's outputs); either counts as one route query (ibacm's per-endpoint counter of
    /// SA path queries).
    fn ask(&mut self, slot: usize, ask: table::Ask) {
        if ask == table::Ask::Nothing {
            return;
        }
        let tid = self.sh.next_tid();
        let e = &mut self.eps.slots[slot];
        match ask {
            table::Ask::Probe => e.table.ask_probe(tid),
            _ => e.table.ask(tid),
        }
        let id = e.id;
        self.eps.mark_dirty(slot);
        self.count(id, Counter::RouteQuery);
    }

    /// The answer to endpoint `slot`'s probe (`handle_sa` of a probe's token): a port at the
    /// LID past the room (its path filed as any Get's, no table on this endpoint), none (the
    /// table, if the backlog still wants it), or a failure (Gets until `sa_deadline`). A token
    /// that names no outstanding probe is counted in `sa_unknown`.
    #[cold]
    #[inline(never)]
    pub(crate) fn probe_reply(
        &mut self,
        now: Millis,
        token: u64,
        umad_status: u32,
        mad: &[u8; 256],
    ) {
        let (_, slot, tid) = mads::untoken(token);
        let slot = slot as usize;
        let cfg = &self.sh.cfg;
        let probed = self
            .eps
            .slots
            .get_mut(slot)
            .and_then(|e| e.table.probe_reply(e.open, tid, umad_status, mad, now, cfg));
        match probed {
            None => self.sh.stats.sa_unknown += 1,
            Some(table::Probed::Port(rec)) => {
                let e = self.eps.slots[slot];
                let view = e.view(e.cache_ep);
                self.file_record(now, slot, &view, &rec);
            }
            Some(table::Probed::Fits) => {
                let e = &mut self.eps.slots[slot];
                let ask = e.table.after_fits(e.open, now, &self.sh.cfg);
                self.ask(slot, ask);
            }
            Some(table::Probed::Nothing) => {}
        }
    }

    /// Adds `who` (a waiter, an address entry) to the job for `route`, starting one if none is
    /// pending. A full job table answers the waiter ENOMEM.
    pub(crate) fn join_route(&mut self, now: Millis, route: &Route<'_>, who: Joiner) {
        let Joiner { waiter, addr } = who;
        let j = match self.routes.find(route) {
            Some(j) => j,
            None => match self.start_job(now, route, false) {
                Some(j) => j,
                None => {
                    self.sh.stats.full += 1;
                    if let Some(w) = waiter {
                        self.answer(w, Status::Enomem, None);
                    }
                    return;
                }
            },
        };
        if let Some(w) = waiter {
            self.routes.add_waiter(&mut self.answers.reqs, j, w);
        }
        if let Some(a) = addr {
            self.routes.add_addr(&mut self.addrs.entries, j, a);
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
            self.sh.stats.malformed += 1;
            self.answer_now(r, Status::Einval, None);
            return;
        };
        let Some(w) = self.waiter(r) else {
            return;
        };
        let route = Route {
            slot,
            cache_ep: r.head.cache_ep,
            key: None,
            sa: &sa,
        };
        match self.start_job(now, &route, true) {
            Some(j) => self.routes.add_waiter(&mut self.answers.reqs, j, w),
            None => {
                self.sh.stats.full += 1;
                self.answer(w, Status::Enomem, None);
            }
        }
    }

    /// A PATH / LID / GID request past the front ([`front::decide`]): joined to the job of
    /// its `route` (a new one queries the SA with its record), as a waiter if `wait` (a
    /// Resolve that the job answers), else only to start or renew the route.
    pub(crate) fn route_query(
        &mut self,
        now: Millis,
        r: &Request<'_>,
        route: &Route<'_>,
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
        self.join_route(now, route, who);
    }

    /// Completes job `j` as `how` says: aliases its addresses on success, answers its
    /// waiters, frees the job (or keeps it as a zombie while the caller holds its MAD).
    pub(crate) fn finish_job(&mut self, now: Millis, j: u32, how: Completion<'_>) {
        let (status, record, query_record, from_cache) = match how {
            Completion::FromSa { record, expires } => {
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
        let job = self.routes.jobs[j as usize];
        if matches!(job.state, JobState::Free | JobState::Zombie) {
            return;
        }
        let key = job.key.key(job.cache_ep);
        // Addresses first: the alias must exist before anyone is told the answer. The path's
        // expiry as inserted (not looked up: a lookup here would take the one refresh claim
        // of the entry away from the provider's hit path).
        if !job.addrs.is_empty() {
            let path = match (status, record, &key, job.query) {
                (Status::Success, Some((_, exp)), Some(k), false) => Some((k, exp)),
                _ => None,
            };
            addr::routed(&mut self.addrs.entries, job.addrs, path, &mut self.w, now);
        }
        let record = record.map(|(r, _)| r);
        let mut waiters = job.waiters;
        while let Some(w) = waiters.pop_front(&mut self.answers.reqs, list_id::WAITERS, REQ) {
            let path = if status == Status::Success {
                record
            } else if job.query {
                query_record
            } else {
                None
            };
            if from_cache && !self.answers.reqs[w as usize].query {
                let ep = self.answers.reqs[w as usize].ep;
                self.count(ep, Counter::RouteCache);
            }
            self.answer(w, status, path);
        }
        if job.state == JobState::Backlog {
            self.eps.slots[usize::from(job.slot)].table.backlog_left();
        }
        self.routes.end(j);
    }

    /// An SA completion of route job `j`: the record cached (or the SA's "no such path"
    /// remembered) and the job finished, or a BUSY job backed off.
    pub(crate) fn route_reply(
        &mut self,
        now: Millis,
        j: u32,
        tid: u32,
        umad_status: u32,
        mad: &[u8; 256],
    ) {
        let Some(outcome) = self
            .routes
            .reply(now, (j, tid), umad_status, mad, &mut self.sh)
        else {
            return;
        };
        let job = &self.routes.jobs[j as usize];
        let (key, query) = (job.key.key(job.cache_ep), job.query);
        match outcome {
            mads::SaOutcome::Record(rec) => {
                let ttl = self.sh.cfg.route_ttl.unwrap_or(NEVER);
                if let (Some(k), false) = (key, query) {
                    self.w.insert(&k, &rec, now, ttl);
                }
                let exp = now.saturating_add(ttl);
                let how = Completion::FromSa {
                    record: &rec,
                    expires: exp,
                };
                self.finish_job(now, j, how);
            }
            mads::SaOutcome::Failed(s) => {
                // "No such path" is an answer from the SA, not a failure to reach it: remember
                // it for a while, never over a path cached since the query started — nor over
                // a path without the reversible bit that this (reversible) query could not
                // use: the entry is shared, and requests without the bit are served by it.
                if let (Status::Enodata, 0, Some(k), false) = (s, umad_status, key, query) {
                    let ttl = self.sh.cfg.negative_ttl;
                    let cached = self.cache().lookup(&k.without_reversible(), now);
                    if ttl > 0 && !matches!(cached, Lookup::Hit { .. }) {
                        // The cache stores the status as its byte (never 0: `s` is ENODATA,
                        // so no Err).
                        let _ = self.w.insert_negative(&k, u8::from(s), now, ttl);
                    }
                }
                let sa_record = *crate::wire::sa::first_record(mad);
                let qr = (umad_status == 0).then_some(&sa_record);
                let how = Completion::Failed {
                    status: s,
                    query_record: qr,
                };
                self.finish_job(now, j, how);
            }
            // BUSY, and the job's retries are spent.
            mads::SaOutcome::Busy => {
                self.sh.stats.timeouts += 1;
                self.finish_job(now, j, Completion::failed(Status::Etimedout));
            }
        }
    }

    /// Moves backlog jobs into free window slots (answering those the cache can answer now,
    /// and those that could not be answered before their deadline).
    fn pump_backlog(&mut self, now: Millis) {
        while self.window_free(now) {
            let (jobs, eps) = (&*self.routes.jobs, &*self.eps.slots);
            let Some(j) = table::next_unheld(&self.routes.backlog, jobs, eps) else {
                break;
            };
            let job = jobs[j as usize];
            if let Some(k) = job.key.key(job.cache_ep) {
                // Filled meanwhile (another job, a preload): answer from the cache.
                match self.cache().lookup(&k, now) {
                    Lookup::Hit {
                        record,
                        expires_at: expires,
                        needs_refresh,
                    } => {
                        let (slot, cache_ep, sa) = (usize::from(job.slot), job.cache_ep, job.sa);
                        let how = Completion::FromCache {
                            record: &record,
                            expires,
                        };
                        self.finish_job(now, j, how);
                        if needs_refresh {
                            let key = Some(k);
                            let route = Route {
                                slot,
                                cache_ep,
                                key,
                                sa: &sa,
                            };
                            self.join_route(now, &route, Joiner::NONE);
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
            if self.routes.too_late(now, &job, &self.sh.cfg) {
                // Its answer could not come back before its deadline: do not spend the SA's
                // work on it (a storm's backlog would otherwise feed the SA queries whose
                // clients have already been told ETIMEDOUT).
                self.sh.stats.timeouts += 1;
                self.finish_job(now, j, Completion::failed(Status::Etimedout));
                continue;
            }
            self.routes.unbacklog(j);
            self.eps.slots[usize::from(job.slot)].table.backlog_left();
            self.send_job(now, j);
        }
        self.routes.set_pace(now, &mut self.sh);
    }

    /// Runs the due route timers of kind `t` (`Backlog`, `SaReply` or `SaBusy`): what they
    /// end is answered ETIMEDOUT; a BUSY job whose backoff ended goes back to the backlog.
    pub(crate) fn route_timers(&mut self, now: Millis, t: Timer) {
        match t {
            Timer::Backlog => {
                while let Some(j) = self.routes.backlog_due(now, &self.sh.cfg) {
                    self.sh.stats.timeouts += 1;
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
                        cur = List::next_of(&self.routes.jobs, j, JOB);
                        let slot = usize::from(self.routes.jobs[j as usize].slot);
                        let try_ms = endpoints::sa_deadline(&self.eps.slots, slot, &self.sh);
                        if self.routes.reply_late(j, now, try_ms, &self.sh.cfg) {
                            self.sh.stats.timeouts += 1;
                            self.finish_job(now, j, Completion::failed(Status::Etimedout));
                        }
                    }
                }
            }
            Timer::SaBusy => {
                let mut cur = self.routes.busy.front();
                while let Some(j) = cur {
                    cur = List::next_of(&self.routes.jobs, j, JOB);
                    let job = self.routes.jobs[j as usize];
                    if job.timer > now {
                        continue;
                    }
                    if self.routes.deadline(job.born, &self.sh.cfg) <= now {
                        self.sh.stats.timeouts += 1;
                        self.finish_job(now, j, Completion::failed(Status::Etimedout));
                    } else {
                        let slot = self.routes.requeue(now, j, &mut self.sh);
                        self.backlog_entered(now, slot);
                    }
                }
            }
            _ => {}
        }
    }

    // ---- Address entries.

    /// A new entry (state Resolved, origin Learned, no mapping yet), evicting an idle learned
    /// entry if the table is full. `None` if nothing can be evicted.
    pub(crate) fn alloc_addr(
        &mut self,
        slot: usize,
        type_: AddressType,
        addr: &[u8; 64],
    ) -> Option<u32> {
        self.addrs.alloc(&mut self.eps.slots, slot, type_, addr)
    }

    /// Frees entry `i` (its waiters, if any, are answered ENODATA first).
    pub(crate) fn free_addr(&mut self, i: u32) {
        self.fail_addr_waiters(i, Status::Enodata);
        self.addrs
            .free_entry(&mut self.eps.slots, &mut self.routes.jobs, i);
    }

    /// Drops the cache aliases of removed local addresses and frees their entries.
    fn drop_removed(&mut self) {
        while let Some(i) =
            self.addrs
                .removals
                .pop_front(&mut self.addrs.entries, list_id::REMOVALS, ADDR_Q)
        {
            let a = self.addrs.entries[i as usize];
            if let Some(k) = addr::addr_key(&a) {
                self.w.remove_addr(&k);
            }
            self.free_addr(i);
        }
    }

    /// Answers the waiters of entry `i` with `status`.
    pub(crate) fn fail_addr_waiters(&mut self, i: u32, status: Status) {
        let mut l = core::mem::replace(&mut self.addrs.entries[i as usize].waiters, List::EMPTY);
        self.answer_list(&mut l, status, None);
    }

    /// An address query failed: its waiters get `status`, the entry goes (ibacmp: INIT).
    pub(crate) fn fail_addr(&mut self, i: u32, status: Status) {
        self.fail_addr_waiters(i, status);
        self.free_addr(i);
    }

    /// Routes the resolved address `i` and answers `waiters` (from the cache, from the group in
    /// ACM route mode, or after an SA query). `count_addr_cache`: a request found the address
    /// known but not its route (ibacmp's ADDR_RESOLVED hit).
    fn route_addr(
        &mut self,
        now: Millis,
        slot: usize,
        i: u32,
        mut waiters: List,
        count_addr_cache: Option<EpId>,
        force: bool,
    ) {
        let (e, a) = (&self.eps.slots[slot], self.addrs.entries[i as usize]);
        let (key, sa) = addr::route_key(e, &a);
        let route = Route {
            slot,
            cache_ep: a.cache_ep,
            key,
            sa: &sa,
        };
        if let (Some(k), false) = (key, force) {
            match self.cache().lookup(&k, now) {
                Lookup::Hit {
                    record,
                    expires_at,
                    needs_refresh,
                } => {
                    addr::alias(&mut self.w, &a, &k, now, expires_at);
                    if needs_refresh {
                        self.join_route(now, &route, Joiner::addr(i));
                    }
                    let mut l = waiters;
                    while let Some(w) = l.pop_front(&mut self.answers.reqs, list_id::WAITERS, REQ) {
                        let ep = self.answers.reqs[w as usize].ep;
                        self.count(ep, Counter::RouteCache);
                        self.answer(w, Status::Success, Some(&record));
                    }
                    return;
                }
                Lookup::Negative { status, .. } => {
                    self.answer_list(&mut waiters, Status::from(status), None);
                    return;
                }
                _ => {}
            }
        }
        if let (Some(k), true) = (key, self.sh.cfg.route_acm && a.lid != 0) {
            if let Some(path) = acm::acm_path(&self.eps.slots[slot], &a) {
                let ttl = self.sh.cfg.route_ttl;
                self.w.insert(&k, &path, now, ttl.unwrap_or(NEVER));
                let exp = ttl.map_or(NEVER, |t| now.saturating_add(t));
                addr::alias(&mut self.w, &a, &k, now, exp);
                self.answer_list(&mut waiters, Status::Success, Some(&path));
                return;
            }
        }
        if let (Some(ep), 0) = (count_addr_cache, a.job) {
            self.count(ep, Counter::AddrCache);
        }
        let first = waiters.pop_front(&mut self.answers.reqs, list_id::WAITERS, REQ);
        let who = Joiner {
            waiter: first,
            addr: Some(i),
        };
        self.join_route(now, &route, who);
        while let Some(w) = waiters.pop_front(&mut self.answers.reqs, list_id::WAITERS, REQ) {
            self.join_route(now, &route, Joiner::waiter(w));
        }
    }

    /// Renews the route of a resolved address that a near-expiry hit or a
    /// [`Kind::Refresh`] asked for (a route query, re-aliased under the request's cache
    /// endpoint number); an address not resolved here is left alone.
    fn addr_refresh(&mut self, now: Millis, slot: usize, r: &Request<'_>, key: &AddrKey) {
        let found = self.addrs.find(slot, key.kind.into(), &key.addr);
        if let Some(i) = found {
            if self.addrs.entries[i as usize].state == AddrState::Resolved {
                self.addrs.entries[i as usize].cache_ep = r.head.cache_ep;
                self.route_addr(now, slot, i, List::EMPTY, None, true);
            }
        }
    }

    /// A NAME / IP / IP6 request past the front ([`front::decide`]): resolved from the
    /// address entries (our own address: loopback; a resolved one: its route; one being
    /// queried: wait for it) or queried over the ACM protocol, as a waiter if `wait` (a
    /// Resolve the query answers), else only to prime the cache.
    fn addr_query(&mut self, now: Millis, slot: usize, r: &Request<'_>, key: &AddrKey, wait: bool) {
        let found = self.addrs.find(slot, key.kind.into(), &key.addr);
        let mut waiters = List::EMPTY;
        if wait {
            let Some(w) = self.waiter(r) else {
                return;
            };
            waiters.push_back(&mut self.answers.reqs, w, list_id::WAITERS, REQ);
        }
        let state = found.map(|i| self.addrs.entries[i as usize].state);
        let cfg = self.sh.cfg;
        match (found, state) {
            (Some(i), Some(AddrState::Local)) => {
                let e = self.eps.slots[slot];
                if cfg.loopback_local && e.lid != 0 {
                    let path =
                        request::loopback_path(Gid(e.port_gid), e.lid, e.pkey, e.mtu, e.rate);
                    self.insert_loopback(now, slot, i, r.head.cache_ep);
                    if !waiters.is_empty() {
                        self.count(r.head.ep, Counter::RouteCache);
                    }
                    self.answer_list(&mut waiters, Status::Success, Some(&path));
                } else {
                    // loopback_prot none: our own address is routed like any other, to GID0.
                    self.addrs.entries[i as usize].cache_ep = r.head.cache_ep;
                    self.route_addr(now, slot, i, waiters, Some(r.head.ep), false);
                }
            }
            (Some(i), Some(AddrState::Resolved)) => {
                let a = &mut self.addrs.entries[i as usize];
                a.cache_ep = r.head.cache_ep;
                let mut renewed = false;
                if a.expires <= now {
                    if a.origin == Origin::Preload || a.job != 0 {
                        // The hosts file is re-read, so to speak: a new lifetime. That is an
                        // address query (ibacmp: an expired dest is INIT), not an ADDR_CACHE hit.
                        a.expires = addr::expiry(&cfg, now);
                        renewed = true;
                        self.count(r.head.ep, Counter::AddrQuery);
                    } else if cfg.addr_acm && self.eps.slots[slot].acm {
                        let e = &mut self.eps.slots[slot];
                        self.addrs.requeue(e, now, i, &mut self.sh);
                        let reqs = &mut self.answers.reqs;
                        self.addrs.add_waiters(reqs, i, &mut waiters);
                        return;
                    }
                }
                let count = (r.head.kind == Kind::Resolve && !renewed).then_some(r.head.ep);
                self.route_addr(now, slot, i, waiters, count, false);
            }
            (Some(i), Some(AddrState::Queued | AddrState::Querying)) => {
                let reqs = &mut self.answers.reqs;
                self.addrs.add_waiters(reqs, i, &mut waiters);
            }
            (Some(_), _) => self.answer_list(&mut waiters, Status::Enodata, None),
            (None, _) => {
                if !(cfg.addr_acm && self.eps.slots[slot].acm) {
                    self.answer_list(&mut waiters, Status::Enodata, None);
                    return;
                }
                let Some(i) = self.alloc_addr(slot, key.kind.into(), &key.addr) else {
                    self.sh.stats.full += 1;
                    self.answer_list(&mut waiters, Status::Enomem, None);
                    return;
                };
                {
                    let a = &mut self.addrs.entries[i as usize];
                    a.cache_ep = r.head.cache_ep;
                    if let Some((t, src)) = addr::source_entry(r.msg) {
                        a.src_type = t.into();
                        a.src = src;
                    }
                }
                let e = &mut self.eps.slots[slot];
                self.addrs.requeue(e, now, i, &mut self.sh);
                let reqs = &mut self.answers.reqs;
                self.addrs.add_waiters(reqs, i, &mut waiters);
            }
        }
    }

    /// Sends queued address queries of every ready endpoint while their ACM windows have
    /// room.
    fn pump_acm_all(&mut self, now: Millis) {
        if self.addrs.active == 0 {
            return;
        }
        for slot in 0..self.eps.slots.len() {
            let e = &mut self.eps.slots[slot];
            if !e.ready() {
                continue;
            }
            let id = e.id;
            let sent = self.addrs.pump(e, now, &mut self.sh);
            for _ in 0..sent {
                self.count(id, Counter::AddrQuery);
            }
        }
    }

    /// ACM queue deadlines of endpoint `slot`: ETIMEDOUT, or ENODATA while it has not joined
    /// (ibacmp's "endpoint not ready").
    pub(crate) fn acm_queue_timers(&mut self, now: Millis, slot: usize) {
        let ready = self.eps.slots[slot].ready();
        let status = if ready {
            Status::Etimedout
        } else {
            Status::Enodata
        };
        while let Some(i) = self.addrs.queue_due(&self.eps.slots[slot], now) {
            self.sh.stats.timeouts += u64::from(ready);
            self.fail_addr(i, status);
        }
    }

    /// ACM retries of endpoint `slot`; a query out of retries is answered ETIMEDOUT.
    pub(crate) fn acm_retry_timers(&mut self, now: Millis, slot: usize) {
        loop {
            let e = &mut self.eps.slots[slot];
            let Some(i) = self.addrs.retry_due(e, now, &mut self.sh) else {
                break;
            };
            self.sh.stats.timeouts += 1;
            self.fail_addr(i, Status::Etimedout);
        }
    }

    /// A received class 0x2C MAD on `ep`.
    pub(crate) fn acm_receive(&mut self, now: Millis, ep: EpId, meta: &RecvMeta, mad: &[u8]) {
        let Some(slot) = self.eps.slot(ep) else {
            self.sh.stats.acm_unsolicited += 1;
            return;
        };
        let e = &self.eps.slots[slot];
        let Some((sgid, r)) = acm::received(e, meta, mad, &mut self.sh.stats) else {
            return;
        };
        match r.method {
            Method::Get => self.peer_request(now, slot, meta, sgid, &r),
            // A peer's response to one of our queries: the query resolved.
            Method::GetResp => {
                let Some(i) = self.addrs.in_flight(&self.eps.slots[slot], r.tid) else {
                    self.sh.stats.acm_unknown_tid += 1;
                    return;
                };
                if r.status != 0 || r.gid_cnt == 0 {
                    self.sh.stats.acm_malformed += 1;
                    return;
                }
                let Some(g) = self.eps.slots[slot].groups.best(&r.gids()[..1]) else {
                    self.sh.stats.acm_unsolicited += 1;
                    return;
                };
                self.resolved(now, slot, i, sgid, meta, g);
            }
            _ => self.sh.stats.acm_malformed += 1,
        }
    }

    /// A peer's request: its sender recorded (and routed if we were querying it), answered
    /// if it asks for one of our addresses.
    fn peer_request(
        &mut self,
        now: Millis,
        slot: usize,
        meta: &RecvMeta,
        sgid: Gid,
        r: &AcmResolveRepr,
    ) {
        if !r.src_type.is_address() || !r.dest_type.is_address() {
            self.sh.stats.acm_malformed += 1;
            return;
        }
        let Some(g) = self.eps.slots[slot].groups.best(r.gids()) else {
            self.sh.stats.acm_no_group += 1;
            return;
        };
        let (target, rec) = self.addrs.requester(&mut self.eps.slots, slot, r);
        if let Some(i) = rec {
            self.resolved(now, slot, i, sgid, meta, g);
        }
        if !target {
            if self.addrs.local_elsewhere(&self.eps.slots, slot, r) {
                self.sh.stats.acm_other_partition += 1;
            }
            return;
        }
        // Respond at once (ibacmp in SA route mode first runs its own SA query towards the
        // requester and answers only if that succeeds; the requester never sees that path,
        // so waiting only delays it, and a failed query there turns into a requester timeout).
        match rec {
            Some(i) => self.addrs.respond(i, r.tid, g),
            None => self.sh.stats.full += 1,
        }
    }

    /// Entry `i` is what a peer's packet says
    /// ([`Addrs::resolved`](super::addr::Addrs::resolved)); if we were querying it, it is
    /// routed now (also with no waiter left, to prime the cache).
    fn resolved(&mut self, now: Millis, slot: usize, i: u32, sgid: Gid, meta: &RecvMeta, g: u8) {
        let expires = addr::expiry(&self.sh.cfg, now);
        let eps = &mut self.eps.slots;
        let waiters = self
            .addrs
            .resolved(eps, i, sgid, meta, g, expires, &mut self.w);
        if let Some(waiters) = waiters {
            self.route_addr(now, slot, i, waiters, None, false);
        }
    }

    /// Removes cached paths to `gid` (and, with `negatives`, every negative entry); with
    /// `forget`, the address mappings learned for `gid` too (they are asked again).
    pub(crate) fn invalidate_gid(&mut self, gid: &[u8; 16], negatives: bool, forget: bool) {
        let n = self
            .w
            .remove_routes_to(core::slice::from_ref(gid), negatives);
        self.sh.stats.report_invalidated += n as u64;
        if !forget {
            return;
        }
        for i in 0..self.addrs.entries.len() as u32 {
            let a = self.addrs.entries[i as usize];
            if a.state == AddrState::Resolved
                && a.origin == Origin::Learned
                && a.gid == *gid
                && a.job == 0
                && !a.send_resp
            {
                if let Some(k) = addr::addr_key(&a) {
                    self.w.remove_addr(&k);
                }
                self.free_addr(i);
                self.sh.stats.report_invalidated += 1;
            }
        }
    }

    // ---- An endpoint's SA SETs (joins, subscriptions) and its table.

    /// The (endpoint slot, index) of the `set` that a reply for token index `index` (slot
    /// times 2, plus the index) with `tid` answers; `None`, counted as an unknown SA reply, if
    /// none waits for it.
    fn set_awaiting(&mut self, index: u32, tid: u32, set: Set) -> Option<(usize, usize)> {
        let (slot, i) = ((index / 2) as usize, (index % 2) as usize);
        let ok = self
            .eps
            .slots
            .get(slot)
            .is_some_and(|e| e.open && set.of(e, i).awaits(tid));
        if !ok {
            self.sh.stats.sa_unknown += 1;
        }
        ok.then_some((slot, i))
    }

    /// An SA completion of `set` `index` (a join's, a subscription's): taken, or the set
    /// failed (retried later).
    pub(crate) fn set_reply(
        &mut self,
        now: Millis,
        set: Set,
        index: u32,
        tid: u32,
        umad_status: u32,
        mad: &[u8; 256],
    ) {
        let Some((slot, i)) = self.set_awaiting(index, tid, set) else {
            return;
        };
        let e = &mut self.eps.slots[slot];
        let taken = match set {
            Set::Join => {
                let taken = e.groups.accept_reply(i, e.pkey, umad_status, mad);
                if taken {
                    self.eps.mark_dirty(slot);
                }
                taken
            }
            Set::Inform => e.informs.accept_reply(i, umad_status, mad, &mut self.sh),
        };
        if !taken {
            self.set_failed(now, set, slot, i);
        }
    }

    /// The timers of endpoint `slot`'s `set`s: a late reply fails one, a retry time sends it
    /// again.
    pub(crate) fn set_timers(&mut self, now: Millis, set: Set, slot: usize) {
        for i in 0..2 {
            match set.of(&self.eps.slots[slot], i).due(now) {
                Some(GroupState::Joining) => self.set_failed(now, set, slot, i),
                Some(GroupState::Retry) => match set {
                    Set::Join => self.start_join(now, slot, i),
                    Set::Inform => self.start_subscribe(now, slot, i),
                },
                _ => {}
            }
        }
    }

    /// (Re)starts subscription `i` of endpoint `slot`.
    fn start_subscribe(&mut self, now: Millis, slot: usize, i: usize) {
        let at = now.saturating_add(endpoints::sa_deadline(&self.eps.slots, slot, &self.sh));
        self.eps.slots[slot].informs.start(i, at, &mut self.sh);
        self.eps.mark_dirty(slot);
    }

    /// `set` `i` of `slot` failed or got no answer: retried later.
    fn set_failed(&mut self, now: Millis, set: Set, slot: usize, i: usize) {
        let e = &mut self.eps.slots[slot];
        match set {
            Set::Join => e.groups.failed(now, i, &mut self.sh),
            Set::Inform => e.informs.failed(now, i, &mut self.sh),
        }
    }

    /// The warm-start tables due at `now` are asked for.
    pub(crate) fn warm_start_timers(&mut self, now: Millis) {
        for slot in 0..self.eps.slots.len() {
            let e = &mut self.eps.slots[slot];
            let ask = e.table.warm_start_due(e.open, now, &self.sh.cfg);
            self.ask(slot, ask);
        }
    }

    /// Files the `records` of endpoint `slot`'s table: every record (reversible, from the
    /// port's GID) goes into the cache under the keys of a plain request for its destination,
    /// and the jobs of those requests are answered ([`file_record`](Self::file_record)).
    /// Returns how many were ours.
    pub(crate) fn file_table(&mut self, now: Millis, slot: usize, records: &[u8]) -> u32 {
        let e = self.eps.slots[slot];
        let view = e.view(e.cache_ep);
        let mut n = 0u32;
        for rec in records.chunks_exact(PATH_RECORD_LEN) {
            if let Ok(rec) = <&[u8; PATH_RECORD_LEN]>::try_from(rec) {
                n += u32::from(self.file_record(now, slot, &view, rec));
            }
        }
        n
    }

    /// Files `rec`, a path from endpoint `slot`'s port (its view `view`), under the keys a
    /// plain request by LID and by GID for its destination has, with the route lifetime, and
    /// answers those requests' jobs; `false` (nothing filed) unless it is ours and reversible.
    fn file_record(
        &mut self,
        now: Millis,
        slot: usize,
        view: &request::EpView,
        rec: &[u8; PATH_RECORD_LEN],
    ) -> bool {
        let p = PathRecord::new_unchecked(&rec[..]);
        // Ours, and usable both ways (what a plain request asks for).
        if p.sgid() != view.port_gid || !p.reversible() {
            return false;
        }
        let ttl = self.sh.cfg.route_ttl.unwrap_or(NEVER);
        let expires = now.saturating_add(ttl);
        for (key, sa) in request::plain_queries(view, rec).into_iter().flatten() {
            self.w.insert(&key, rec, now, ttl);
            // The jobs of plain requests for this destination, waiting or already sent, are
            // answered now (a sent one's Get reply then finds a zombie): those that asked for
            // a reversible path and those that did not, which the record (usable both ways)
            // serves too, as its cache entry does.
            let mut one_way = sa;
            PathRecord::new_unchecked(&mut one_way[..]).set_reversible_numpath(false, 0);
            for q in [sa, one_way] {
                let route = Route {
                    slot,
                    cache_ep: view.cache_ep,
                    key: None,
                    sa: &q,
                };
                if let Some(j) = self.routes.find(&route) {
                    let how = Completion::FromSa {
                        record: rec,
                        expires,
                    };
                    self.finish_job(now, j, how);
                }
            }
        }
        true
    }
}
