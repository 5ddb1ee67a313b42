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
use super::storage::{List, TableFetch, JOB};
use super::timers::Timer;
use super::{Config, EpSlot, JobSlot, Millis, SaTable, Shared};
use crate::wire::gid::Gid;
use crate::wire::mad::{Header, HEADER_LEN};
use crate::wire::path_record::PATH_RECORD_LEN;
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

/// Why a GetTable brought no table
/// ([`Resolver::handle_sa_table`](super::Resolver::handle_sa_table)).
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

impl TableFetch {
    /// Counts a job of this endpoint (open: `open`) entering the backlog; true if the backlog
    /// now makes the endpoint's table worth asking for.
    pub(crate) fn backlog_entered(&mut self, open: bool, now: Millis, cfg: &Config) -> bool {
        self.backlogged += 1;
        let t = *self;
        let min = cfg.sa_table_min;
        if !cfg.sa_tables
            || min == 0
            || !open
            || t.off
            || t.out()
            || now < t.not_before
            || t.backlogged < min
        {
            return false;
        }
        // Only when the Gets waiting would cost the SA more than the table: its size is the
        // last table's, or at least the highest LID seen.
        let get = u64::from(cfg.sa_get_cost_ns.max(1));
        let records = u64::from(t.records.max(u32::from(t.max_lid)));
        if records > u64::from(cfg.sa_table_room) {
            return false;
        }
        let table = get + records * u64::from(cfg.sa_record_cost_ns);
        if u64::from(t.backlogged) * get < table {
            return false;
        }
        true
    }

    /// Counts a job of this endpoint leaving the backlog.
    pub(crate) fn backlog_left(&mut self) {
        self.backlogged = self.backlogged.saturating_sub(1);
    }

    /// A route job asks for a path to `dlid`: the highest LID seen so far.
    pub(crate) fn saw_lid(&mut self, dlid: u16) {
        self.max_lid = self.max_lid.max(dlid);
    }

    /// Decides the table with `tid` (polled out by [`output`](Self::output)).
    pub(crate) fn ask(&mut self, tid: u32) {
        self.send = true;
        self.tid = tid;
    }

    /// Arms the warm-start table (`warm_start`) at `at`.
    pub(crate) fn warm_start_at(&mut self, at: Millis, sh: &mut Shared) {
        self.warm_start = true;
        self.warm_start_at = at;
        sh.timers.arm(Timer::WarmStart, at);
    }

    /// Whether the warm-start table of this endpoint (open: `open`) is due at `now` and is to
    /// be asked for (disarmed either way once due).
    pub(crate) fn warm_start_due(&mut self, open: bool, now: Millis) -> bool {
        if !open || !self.warm_start || self.warm_start_at > now {
            return false;
        }
        self.warm_start = false;
        !(self.off || self.out())
    }

    /// The GetTable output of endpoint slot `slot` (open: `open`; its port GID and P_Key),
    /// if one was decided.
    pub(crate) fn output(
        &mut self,
        slot: usize,
        open: bool,
        port_gid: Gid,
        pkey: u16,
    ) -> Option<(u64, [u8; 256])> {
        if !self.send {
            return None;
        }
        self.send = false;
        if !open {
            return None;
        }
        self.sent = true;
        let mad = mads::path_table(self.tid, port_gid, pkey);
        Some((mads::token(TOKEN_TABLE, slot as u32, self.tid), mad))
    }

    /// A table that brought nothing: Gets for now, a table again after `sa_deadline` (never
    /// again on this endpoint when it cannot fit or cannot be carried: `off`).
    pub(crate) fn failed(&mut self, now: Millis, off: bool, sh: &mut Shared) {
        sh.stats.sa_table_failed += 1;
        self.sent = false;
        self.off |= off;
        self.not_before = now.saturating_add(sh.cfg.sa_deadline);
    }

    /// A table of `records` of ours was filed; a port asks at most once per `sa_deadline`
    /// (a table asked for again at once would mean the cache cannot hold it).
    pub(crate) fn filed(&mut self, now: Millis, records: u32, cfg: &Config) {
        self.sent = false;
        self.records = records;
        self.not_before = now.saturating_add(cfg.sa_deadline);
    }
}

/// The endpoint slot whose outstanding table `token` names, if any.
pub(crate) fn table_of(eps: &[EpSlot], token: u64) -> Option<usize> {
    let (kind, slot, tid) = mads::untoken(token);
    let e = eps.get(slot as usize)?;
    (kind == TOKEN_TABLE && e.open && e.table.sent && e.table.tid == tid).then_some(slot as usize)
}

/// The records of a PathRecord table (`None`: not one, or not whole records — a sender's
/// PayloadLength that cuts one —, so nothing of it is taken).
pub(crate) fn records<'t>(t: &SaTable<'t>) -> Option<&'t [u8]> {
    let head = Header::new_unchecked(&t.header[..HEADER_LEN]);
    let record_len = usize::from(u16::from_be_bytes([t.header[44], t.header[45]])) * 8;
    let whole = head.status().0 == 0
        && head.attr_id() == attr::PATH_RECORD
        && record_len == PATH_RECORD_LEN
        && t.records.len() % PATH_RECORD_LEN == 0;
    whole.then_some(t.records)
}

/// The first job of `backlog` not held back by its endpoint's table in flight (the table
/// will answer it: a Get for it would be the SA's work twice). O(1) when no endpoint holds
/// or every backlogged job is held; else a walk past the held ones.
pub(crate) fn next_unheld(backlog: &List, jobs: &[JobSlot], eps: &[EpSlot]) -> Option<u32> {
    let front = backlog.front()?;
    let holding = |e: &EpSlot| e.table.out();
    let held: u32 = eps
        .iter()
        .filter(|e| holding(e))
        .map(|e| e.table.backlogged)
        .sum();
    if held == 0 {
        return Some(front);
    }
    if held >= backlog.len {
        return None;
    }
    backlog
        .iter(jobs, JOB)
        .find(|&j| !holding(&eps[usize::from(jobs[j as usize].slot)]))
}
