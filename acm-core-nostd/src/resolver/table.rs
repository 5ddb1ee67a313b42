//! Half-world PathRecord tables: when a port's backlog of route queries is long, one SA
//! GetTable with only its SGID (and P_Key) asks for every path from the port at once
//! (OpenSM's `osm_pr_process_half`, answered over RMPP), instead of one Get per destination.
//!
//! * **When.** Only where the caller's transport reassembles RMPP answers
//!   ([`Config::sa_tables`](super::Config::sa_tables)), at most one table per endpoint at a time, and when the
//!   endpoint's backlog (route jobs waiting for the SA window) reaches
//!   [`Config::sa_table_min`](super::Config::sa_table_min), and the backlog makes its Gets
//!   cost the SA more than the table would: `backlog × get ≥ get + records × record`, with
//!   OpenSM's measured costs ([`OPENSM_GET_NS`], [`OPENSM_RECORD_NS`]); `records` is the last
//!   table's size, or while none has come the highest LID the endpoint has seen (its own, the
//!   DLIDs asked for: OpenSM hands out LIDs from 1 up, so that is a lower bound on the
//!   subnet); a table seen to be larger than the caller takes (`sa_table_room`, half the path
//!   cache) is not asked for. The backlog is a lower bound on what the port will ask, so the rule errs
//!   towards Gets: in a 1 000-node all-to-all start each port asks once and the SA serves
//!   N tables instead of N² Gets; at 10 000 nodes with 64 requests in flight per node, a
//!   table (1.7 ms of OpenSM) is worth fewer than 290 waiting Gets, and the ports keep to Gets
//!   (all asking at once, the tables would hold OpenSM's FIFO past its 10 s drop limit).
//! * **What it does with the answer.** Every record (reversible, from the port's GID) goes
//!   into the cache under the keys a plain request by LID and by GID for its destination has,
//!   with the route lifetime; then every backlogged job of the endpoint that the cache now
//!   answers is answered. Jobs already sent complete with their own Gets; jobs the table does
//!   not answer (a request with constraints) keep waiting for the window.
//! * **Failure.** A table that fails (lost, timed out, refused) is not asked again for
//!   `sa_deadline`; meanwhile the Gets go on as without tables. A table too big for the
//!   caller's storage, or an answer that is not a table (a transport that does not reassemble),
//!   turns tables off for the endpoint.
//! * **Warm start** (`acmrs_route_prefetch` = J ms, off by default): an endpoint that opens
//!   asks for its table at a uniformly random time within J ms (`Timer::WarmStart`), whatever
//!   its backlog, so a whole cluster booting at once spreads its tables over J.
//! * While a port's table is out, its backlog is held: no Get goes for a job the table will
//!   answer.
//! * The table takes no SA window slot: it is one query, at most one per endpoint at a time,
//!   and only while the backlog says the window is full anyway.

use super::mads::{self, TOKEN_TABLE};
use super::route::Completion;
use super::storage::{Slab, JOB};
use super::timers::Timer;
use super::{request, Counter, EpId, Millis, Resolver, SaTable, Storage, NEVER};
use crate::cache::CacheRef;
use crate::wire::gid::Gid;
use crate::wire::mad::{Header, HEADER_LEN};
use crate::wire::path_record::{PathRecord, PATH_RECORD_LEN};
use crate::wire::sa::attr;

/// OpenSM's CPU time per PathRecord Get at saturation, in ns (`tools/storm/opensm-measured.toml`,
/// `[model] get_service_us`).
pub const OPENSM_GET_NS: u32 = 6_000;
/// OpenSM's CPU time per further record of a half-world GetTable, in ns (the same file,
/// `table_record_ns`).
pub const OPENSM_RECORD_NS: u32 = 174;

/// The most records of a half-world table a provider with `path_capacity` cache entries takes:
/// half of them (each record is filed by LID and by GID), at most 65 536 (4 MiB of records).
pub const fn room_for(path_capacity: u32) -> u32 {
    let half = path_capacity / 2;
    if half < 1 << 16 {
        half
    } else {
        1 << 16
    }
}

/// Why a GetTable brought no table ([`Resolver::handle_sa_table`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableError {
    /// The answer did not fit the caller's storage (it sent STOP): no more tables on this
    /// endpoint.
    TooBig,
    /// The endpoint's SA transport cannot carry a table (the core's service): no more tables
    /// on this endpoint.
    NotCarried,
    /// Lost, timed out, aborted or refused: Gets for now, a table again later.
    Failed,
}

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// Counts a job of endpoint `slot` entering the backlog, and asks for the endpoint's table
    /// if the backlog now makes one worth it.
    pub(crate) fn backlog_entered(&mut self, now: Millis, slot: usize) {
        let e = &mut self.st.endpoints()[slot];
        e.table.backlogged += 1;
        let t = e.table;
        let min = self.cfg.sa_table_min;
        if !self.cfg.sa_tables
            || min == 0
            || !e.open
            || t.off
            || t.out()
            || now < t.not_before
            || t.backlogged < min
        {
            return;
        }
        // Only when the Gets waiting would cost the SA more than the table: its size is the
        // last table's, or at least the highest LID seen.
        let get = u64::from(self.cfg.sa_get_cost_ns.max(1));
        let records = u64::from(t.records.max(u32::from(t.max_lid)));
        if records > u64::from(self.cfg.sa_table_room) {
            return;
        }
        let table = get + records * u64::from(self.cfg.sa_record_cost_ns);
        if u64::from(t.backlogged) * get < table {
            return;
        }
        self.ask_table(slot);
    }

    /// The first backlogged job not held back by its endpoint's table in flight (the table
    /// will answer it: a Get for it would be the SA's work twice). O(1) when no endpoint holds
    /// or every backlogged job is held; else a walk past the held ones.
    pub(crate) fn next_unheld(&self) -> Option<u32> {
        let t = self.st.slabs_ref();
        let front = self.routes.backlog.front()?;
        let holding = |e: &super::EpSlot| e.table.out();
        let held: u32 = t
            .endpoints
            .iter()
            .filter(|e| holding(e))
            .map(|e| e.table.backlogged)
            .sum();
        if held == 0 {
            return Some(front);
        }
        if held >= self.routes.backlog.len {
            return None;
        }
        self.routes
            .backlog
            .iter(t.jobs, JOB)
            .find(|&j| !holding(&t.endpoints[usize::from(t.jobs[j as usize].slot)]))
    }

    /// Arms endpoint `slot`'s warm-start table, if asked for (`warm_start`), at a random
    /// time within it.
    pub(crate) fn schedule_warm_start(&mut self, now: Millis, slot: usize) {
        let jitter = self.cfg.warm_start;
        if jitter == 0 || !self.cfg.sa_tables {
            return;
        }
        let at = now.saturating_add(self.routes.random() % jitter);
        let t = &mut self.st.endpoints()[slot].table;
        t.warm_start = true;
        t.warm_start_at = at;
        self.timers.arm(Timer::WarmStart, at);
    }

    /// The warm-start tables due at `now` are asked for.
    pub(crate) fn warm_start_timers(&mut self, now: Millis) {
        for slot in 0..self.st.slabs_ref().endpoints.len() {
            let e = self.st.slabs_ref().endpoints[slot];
            if !e.open || !e.table.warm_start || e.table.warm_start_at > now {
                continue;
            }
            self.st.endpoints()[slot].table.warm_start = false;
            if !(e.table.off || e.table.out()) {
                self.ask_table(slot);
            }
        }
    }

    /// Decides endpoint `slot`'s table (polled out by `ep_output`); it counts as one route
    /// query (ibacm's per-endpoint counter of SA path queries).
    fn ask_table(&mut self, slot: usize) {
        let tid = self.next_tid();
        let e = &mut self.st.endpoints()[slot];
        e.table.send = true;
        e.table.tid = tid;
        let id = EpId(e.id);
        self.eps.mark_dirty(slot);
        self.count(id, Counter::RouteQuery);
    }

    /// Counts a job of endpoint `slot` leaving the backlog.
    pub(crate) fn backlog_left(&mut self, slot: usize) {
        let t = &mut self.st.endpoints()[slot].table;
        t.backlogged = t.backlogged.saturating_sub(1);
    }

    /// The GetTable output of endpoint `slot`, if one was decided (`ep_output`).
    pub(crate) fn table_output(&mut self, slot: usize) -> Option<(u64, [u8; 256])> {
        let e = &mut self.st.endpoints()[slot];
        if !e.table.send {
            return None;
        }
        e.table.send = false;
        if !e.open {
            return None;
        }
        e.table.sent = true;
        let tid = e.table.tid;
        let mad = mads::path_table(tid, Gid(e.port_gid), e.pkey);
        Some((mads::token(TOKEN_TABLE, slot as u32, tid), mad))
    }

    /// The outstanding table of `token`'s endpoint, if `token` names it.
    fn table_of(&self, token: u64) -> Option<usize> {
        let (kind, slot, tid) = mads::untoken(token);
        let e = self.st.slabs_ref().endpoints.get(slot as usize)?;
        (kind == TOKEN_TABLE && e.open && e.table.sent && e.table.tid == tid)
            .then_some(slot as usize)
    }

    /// A table that brought nothing: Gets for now, a table again after `sa_deadline` (never
    /// again on this endpoint when it cannot fit or cannot be carried).
    fn table_failed(&mut self, now: Millis, slot: usize, off: bool) {
        self.stats.sa_table_failed += 1;
        let wait = self.cfg.sa_deadline;
        let t = &mut self.st.endpoints()[slot].table;
        t.sent = false;
        t.off |= off;
        t.not_before = now.saturating_add(wait);
    }

    /// `handle_sa` for a table's token: only a failure can come this way (the MAD as sent with
    /// a non-zero status); a reply MAD means the transport handed up a single MAD, not a
    /// reassembled table, so tables are turned off.
    pub(crate) fn table_reply(&mut self, now: Millis, token: u64, umad_status: u32) {
        match self.table_of(token) {
            Some(slot) => self.table_failed(now, slot, umad_status == 0),
            None => self.stats.sa_unknown += 1,
        }
    }

    /// The answer to an [`Output::SendSa`](super::Output::SendSa) GetTable (a token the
    /// resolver gave a half-world table), reassembled by the caller's SA channel: the whole
    /// `table`, or why there is none. A token that names nothing outstanding is counted in
    /// `sa_unknown` and dropped.
    pub fn handle_sa_table(
        &mut self,
        now: Millis,
        token: u64,
        table: Result<SaTable<'_>, TableError>,
    ) {
        let Some(slot) = self.table_of(token) else {
            self.stats.sa_unknown += 1;
            return;
        };
        let t = match table {
            Ok(t) => t,
            Err(e) => {
                let off = matches!(e, TableError::TooBig | TableError::NotCarried);
                self.table_failed(now, slot, off);
                return self.pump(now);
            }
        };
        let head = Header::new_unchecked(&t.header[..HEADER_LEN]);
        let record_len = usize::from(u16::from_be_bytes([t.header[44], t.header[45]])) * 8;
        // Not a PathRecord table, or not whole records (a sender's PayloadLength that cuts
        // one): nothing of it is taken.
        if head.status().0 != 0
            || head.attr_id() != attr::PATH_RECORD
            || record_len != PATH_RECORD_LEN
            || t.records.len() % PATH_RECORD_LEN != 0
        {
            self.table_failed(now, slot, false);
            return self.pump(now);
        }
        let e = self.st.endpoints()[slot];
        let view = self.view(slot, e.cache_ep);
        let ttl = self.cfg.route_ttl.unwrap_or(NEVER);
        let expires = now.saturating_add(ttl);
        let mut n = 0u32;
        for rec in t.records.chunks_exact(PATH_RECORD_LEN) {
            let Ok(rec) = <&[u8; PATH_RECORD_LEN]>::try_from(rec) else {
                continue;
            };
            let p = PathRecord::new_unchecked(&rec[..]);
            // Ours, and usable both ways (what a plain request asks for).
            if p.sgid() != view.port_gid || !p.reversible() {
                continue;
            }
            n += 1;
            for (key, sa) in request::plain_queries(&view, rec).into_iter().flatten() {
                self.w.insert(&key, rec, now, ttl);
                // The jobs of plain requests for this destination, waiting or already sent,
                // are answered now (a sent one's Get reply then finds a zombie): those that
                // asked for a reversible path and those that did not, which the record (usable
                // both ways) serves too, as its cache entry does.
                let mut one_way = sa;
                PathRecord::new_unchecked(&mut one_way[..]).set_reversible_numpath(false, 0);
                for q in [sa, one_way] {
                    if let Some(j) = self.find_job(slot, e.cache_ep, &q) {
                        let how = Completion::Answered {
                            record: rec,
                            expires,
                        };
                        self.finish_job(now, j, how);
                    }
                }
            }
        }
        self.stats.sa_tables += 1;
        self.stats.sa_table_records += u64::from(n);
        // A port asks at most once per `sa_deadline`: a table asked for again at once would
        // mean the cache cannot hold it.
        let wait = self.cfg.sa_deadline;
        let tf = &mut self.st.endpoints()[slot].table;
        tf.sent = false;
        tf.records = n;
        tf.not_before = now.saturating_add(wait);
        self.pump(now);
    }
}
