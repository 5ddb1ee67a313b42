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
//! * **The probe: does the subnet fit?** The highest LID seen is only a lower bound, and the
//!   real size comes with the first RMPP segment, after OpenSM has computed the whole table.
//!   So before its first table a port whose table room is below the unicast LIDs' end
//!   (0xBFFF) sends one PathRecord Get for DLID `room + 1` (a plain request's Get for that
//!   LID, `Counter::RouteQuery`; no window slot, the backlog not held) and asks for the table
//!   only when OpenSM answers ERR_NO_RECORDS (`osm_pr_get_end_points`: "No dest port with
//!   LID"). OpenSM gives each port the lowest free LID range from 1 up
//!   (`lid_mgr_find_free_lid_range`) and a half-world table with NumbPath 1 has one record
//!   per port (`pr_rcv_get_port_pair_paths`), so without holes LID `room + 1` exists exactly
//!   when the table has more than `room` records. A port there (the answer a path) makes it
//!   the highest LID seen: no table on this endpoint; the path is filed and answers its
//!   request like any Get's. The errors: LIDs kept from a guid2lid file or a former SM, ports
//!   gone, and LMC > 0 (2^LMC LIDs per port) leave LIDs unused below the highest, so a port
//!   at `room + 1` may come with fewer than `room` records (errs towards Gets, the safe side);
//!   a hole exactly at `room + 1` in a larger subnet lets the table be asked, refused as too
//!   big from its first segment (tables off, as without the probe). A probe that fails (lost,
//!   BUSY, another error) waits `sa_deadline`, Gets meanwhile.
//! * **What it does with the answer.** Every record (reversible, from the port's GID) goes
//!   into the cache under the keys a plain request by LID and by GID for its destination has,
//!   with the route lifetime; then every backlogged job of the endpoint that the cache now
//!   answers is answered. Jobs already sent complete with their own Gets; jobs the table does
//!   not answer (a request with constraints) keep waiting for the window.
//! * **Failure.** A table that fails (lost, timed out, refused) is not asked again for
//!   `sa_deadline`; meanwhile the Gets go on as without tables. A table too big for the
//!   caller's storage, or an answer that is not a table (a transport that does not reassemble),
//!   turns tables off for the endpoint.
//! * **Warm start** (`acmrs_warm_start_ms` = J ms, off by default): an endpoint that opens
//!   asks for its table at a uniformly random time within J ms (`Timer::WarmStart`), whatever
//!   its backlog, so a whole cluster booting at once spreads its tables over J; where the
//!   probe is needed, the probe goes then, and the table only if it finds the subnet fits.
//! * While a port's table is out, its backlog is held: no Get goes for a job the table will
//!   answer.
//! * The table takes no SA window slot: it is one query, at most one per endpoint at a time,
//!   and only while the backlog says the window is full anyway.

use super::mads::{self, TOKEN_PROBE, TOKEN_TABLE};
use super::request::{self, EpView};
use super::storage::{List, TableFetch, JOB};
use super::timers::Timer;
use super::{Config, EpSlot, JobSlot, Millis, SaTable, Shared};
use crate::wire::gid::Gid;
use crate::wire::mad::{Header, Method, HEADER_LEN, MAD_LEN};
use crate::wire::path_record::{PathRecord, PATH_RECORD_LEN};
use crate::wire::sa::{attr, SaPacket, DATA_OFFSET};

/// OpenSM's CPU time per PathRecord Get at saturation, in ns (`tools/storm/opensm-measured.toml`,
/// `[model] get_service_us`).
pub const OPENSM_GET_NS: u32 = 6_000;
/// OpenSM's CPU time per further record of a half-world GetTable, in ns (the same file,
/// `table_record_ns`).
pub const OPENSM_RECORD_NS: u32 = 174;

/// The highest unicast LID: a table room at least this large holds any subnet's table (one
/// record per port, each port one LID or more), so no probe is needed.
const MAX_UNICAST_LID: u32 = 0xBFFF;

/// SA class status ERR_NO_RECORDS, in bits 8-15 of a MAD's status (what OpenSM answers a Get
/// for a LID no port has).
const ERR_NO_RECORDS: u16 = 3;

/// What an endpoint's backlog asks for ([`TableFetch::backlog_entered`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Nothing more than the Gets.
    Nothing,
    /// The half-world table.
    Table,
    /// The probe first: does the subnet fit the table room? (See the module docs.)
    Probe,
}

/// What the probe's answer says ([`TableFetch::probe_reply`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Probed {
    /// A port has the LID past the room: no table on this endpoint; this path is to be
    /// filed as any Get's.
    Port([u8; PATH_RECORD_LEN]),
    /// No port there: the subnet fits; the table if the backlog still wants it.
    Fits,
    /// Lost, BUSY or another error: Gets for now.
    Nothing,
}

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
    /// Counts a job of this endpoint (open: `open`) entering the backlog; what the backlog now
    /// asks for ([`consider`](Self::consider)).
    pub(crate) fn backlog_entered(&mut self, open: bool, now: Millis, cfg: &Config) -> Ask {
        self.backlogged += 1;
        self.consider(open, now, cfg)
    }

    /// Whether this endpoint's backlog makes its table worth asking for, and whether the
    /// probe must say first that the subnet fits (see the module docs).
    pub(crate) fn consider(&self, open: bool, now: Millis, cfg: &Config) -> Ask {
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
            return Ask::Nothing;
        }
        // Only when the Gets waiting would cost the SA more than the table: its size is the
        // last table's, or at least the highest LID seen.
        let get = u64::from(cfg.sa_get_cost_ns.max(1));
        let records = u64::from(t.records.max(u32::from(t.max_lid)));
        let room = cfg.sa_table_room;
        if records > u64::from(room) {
            return Ask::Nothing;
        }
        let table = get + records * u64::from(cfg.sa_record_cost_ns);
        if u64::from(t.backlogged) * get < table {
            return Ask::Nothing;
        }
        self.table_or_probe(cfg)
    }

    /// The table, or the probe first (once, before the first table, when the room is below
    /// any subnet's size: see the module docs); nothing while the probe is out.
    fn table_or_probe(&self, cfg: &Config) -> Ask {
        if self.records == 0 && !self.fits && cfg.sa_table_room < MAX_UNICAST_LID {
            return if self.probe_send || self.probe_sent {
                Ask::Nothing
            } else {
                Ask::Probe
            };
        }
        Ask::Table
    }

    /// Decides the probe with `tid` (polled out by [`probe_output`](Self::probe_output)).
    pub(crate) fn ask_probe(&mut self, tid: u32) {
        self.probe_send = true;
        self.probe_tid = tid;
    }

    /// The probe Get of endpoint slot `slot` (open: `open`, its view `view`), if decided: a
    /// plain request's Get for the LID past the table room. Rare (once per endpoint): kept
    /// out of the endpoint's output path.
    #[cold]
    #[inline(never)]
    pub(crate) fn probe_output(
        &mut self,
        slot: usize,
        open: bool,
        view: &EpView,
        cfg: &Config,
    ) -> Option<(u64, [u8; MAD_LEN])> {
        self.probe_send = false;
        let mut dest = [0u8; PATH_RECORD_LEN];
        PathRecord::new_unchecked(&mut dest[..]).set_dlid(probe_lid(cfg));
        let [_, by_lid] = request::plain_queries(view, &dest);
        let (_, query) = by_lid.filter(|_| open)?;
        self.probe_sent = true;
        let tid = self.probe_tid;
        Some((
            mads::token(TOKEN_PROBE, slot as u32, tid),
            mads::path_get(tid, &query),
        ))
    }

    /// The answer `mad` (`umad_status`) to this endpoint's probe `tid` (open: `open`), at
    /// `now`: see [`Probed`]. A failure waits `sa_deadline` before the next table or probe.
    /// Rare (once per endpoint): kept out of the SA reply path.
    #[cold]
    #[inline(never)]
    pub(crate) fn probe_reply(
        &mut self,
        open: bool,
        tid: u32,
        umad_status: u32,
        mad: &[u8; MAD_LEN],
        now: Millis,
        cfg: &Config,
    ) -> Option<Probed> {
        if !(open && self.probe_sent && self.probe_tid == tid) {
            return None;
        }
        self.probe_sent = false;
        let warm = core::mem::take(&mut self.warm_after_probe);
        let head = Header::new_unchecked(&mad[..HEADER_LEN]);
        let (status, answer) = (head.status().0, head.method() == Method::GetResp);
        let record = answer && head.attr_id() == attr::PATH_RECORD;
        Some(match (umad_status, status) {
            (0, 0) if record => {
                self.max_lid = self.max_lid.max(probe_lid(cfg));
                let mut rec = [0u8; PATH_RECORD_LEN];
                rec.copy_from_slice(&mad[DATA_OFFSET..DATA_OFFSET + PATH_RECORD_LEN]);
                Probed::Port(rec)
            }
            (0, s) if answer && s == ERR_NO_RECORDS << 8 => {
                self.fits = true;
                self.warm_after_probe = warm;
                Probed::Fits
            }
            _ => {
                self.not_before = now.saturating_add(cfg.sa_deadline);
                Probed::Nothing
            }
        })
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

    /// What the warm-start table of this endpoint (open: `open`) asks for at `now`: the
    /// table, or the probe first (then the table waits for its answer); nothing if not due
    /// (disarmed either way once due).
    pub(crate) fn warm_start_due(&mut self, open: bool, now: Millis, cfg: &Config) -> Ask {
        if !open || !self.warm_start || self.warm_start_at > now {
            return Ask::Nothing;
        }
        self.warm_start = false;
        if self.off || self.out() {
            return Ask::Nothing;
        }
        let ask = self.table_or_probe(cfg);
        self.warm_after_probe = ask != Ask::Table;
        ask
    }

    /// After the probe found the subnet fits: the table a warm start was waiting for, or
    /// what the backlog asks for ([`consider`](Self::consider)).
    pub(crate) fn after_fits(&mut self, open: bool, now: Millis, cfg: &Config) -> Ask {
        if core::mem::take(&mut self.warm_after_probe) && open && !(self.off || self.out()) {
            return Ask::Table;
        }
        self.consider(open, now, cfg)
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

/// The probe's LID: the first past the table room.
fn probe_lid(cfg: &Config) -> u16 {
    cfg.sa_table_room.saturating_add(1).min(MAX_UNICAST_LID) as u16
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
    let record_len = SaPacket::new_unchecked(&t.header[..]).record_len();
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

#[cfg(test)]
mod tests {
    //! The probe, by hand in virtual time: a port whose estimate of its table (the highest LID
    //! it has seen) fits its room asks OpenSM whether LID `room + 1` exists before it asks for
    //! the table.

    use super::*;
    use crate::cache::{ep_number, AddrSlot, CacheConfig, CacheWriter, Dest, Lookup, PathCache};
    use crate::cache::{CacheEp, PathKey, PathSlot};
    use crate::resolver::{Capacities, Config, HeapStorage, Kind, Output, Request};
    use crate::resolver::{EpId, MsgBuf, Resolver};
    use crate::sim::{node_ep_config, node_gid};
    use crate::wire::client::{ClientRequest, PathQuery};
    use std::sync::Arc;
    use std::vec::Vec;

    type Cache = PathCache<std::boxed::Box<[PathSlot]>, std::boxed::Box<[AddrSlot]>>;

    const EP: EpId = EpId(1);
    const CEP: CacheEp = ep_number(0, EP.0);
    const ROOM: u32 = 100;

    struct T {
        r: Resolver<HeapStorage, Arc<Cache>>,
        cache: Arc<Cache>,
        now: Millis,
    }

    /// The simulator's node 3 (LID 4), a window of one query, tables after a backlog of 4, room for 100 records.
    fn setup() -> T {
        setup_with(0)
    }

    /// [`setup`] with a warm start of `warm_start` ms (0: none).
    fn setup_with(warm_start: Millis) -> T {
        setup_at(warm_start, CEP)
    }

    /// [`setup_with`], the endpoint opened at cache number `cache_ep`.
    fn setup_at(warm_start: Millis, cache_ep: CacheEp) -> T {
        let cfg = Config {
            warm_start,
            addr_acm: false,
            sa_window: 1,
            sa_window_start: 1,
            sa_table_min: 4,
            sa_table_room: ROOM,
            sa_deadline: 1000,
            queue_deadline: 60_000,
            ..Config::default()
        };
        let cache = PathCache::new(
            PathSlot::boxed(1024),
            AddrSlot::boxed(64),
            CacheConfig::default(),
        );
        let cache = Arc::new(cache.unwrap());
        let w = CacheWriter::take(Arc::clone(&cache)).unwrap();
        let mut r = Resolver::new(cfg, HeapStorage::new(Capacities::default()), w, 7).unwrap();
        r.handle_open(0, EP, cache_ep, node_ep_config(3)).unwrap();
        let mut t = T { r, cache, now: 0 };
        t.sa_sends();
        t
    }

    impl T {
        /// The PathRecord Gets and GetTables sent since the last call (the rest dropped).
        fn sa_sends(&mut self) -> Vec<(u64, [u8; MAD_LEN])> {
            let (mut v, mut msg) = (Vec::new(), MsgBuf::new());
            while let Some(o) = self.r.poll_output(&mut msg) {
                if let Output::SendSa { token, mad, .. } = o {
                    if mad[16..18] == [0x00, 0x35] {
                        v.push((token, mad));
                    }
                }
            }
            v
        }

        /// A Resolve by LID for each of `lids` (client = the LID); the SA sends they lead to.
        fn miss(&mut self, lids: core::ops::Range<u16>) -> Vec<(u64, [u8; MAD_LEN])> {
            let mut v = Vec::new();
            for lid in lids {
                let msg = ClientRequest::path(u64::from(lid), 0, &PathQuery::lid(lid));
                let req = Request::new(EP, CEP, u64::from(lid), Kind::Resolve, msg.bytes());
                self.r.handle_request(self.now, &req);
                v.extend(self.sa_sends());
            }
            v
        }

        /// The SA's answer to the Get `mad`: the path to its DLID, or ERR_NO_RECORDS.
        fn answer(&mut self, token: u64, mad: &[u8; MAD_LEN], exists: bool) {
            let mut m = *mad;
            m[3] = 0x81;
            let dlid = PathRecord::new_unchecked(&mad[56..120]).dlid();
            if exists {
                let mut p = PathRecord::new_unchecked(&mut m[56..120]);
                p.set_sgid(node_gid(3));
                p.set_dgid(node_gid(usize::from(dlid) - 1));
                p.set_slid(4);
                p.set_reversible_numpath(true, 0);
                p.set_pkey(0xffff);
            } else {
                m[4..6].copy_from_slice(&(ERR_NO_RECORDS << 8).to_be_bytes());
            }
            self.r.handle_sa(self.now, token, 0, &m);
        }
    }

    fn dlid(mad: &[u8; MAD_LEN]) -> u16 {
        PathRecord::new_unchecked(&mad[56..120]).dlid()
    }

    /// The low-LID port of a big subnet (the storm's 467 refused tables at N = 10 000): its
    /// DLIDs (10..19) say the table is small, the probe finds a port at LID 101, so no
    /// GetTable ever goes, the Gets go on, and the probe's path answers LID 101 from the
    /// cache. (Fails without the probe: the 4th backlogged miss sends a GetTable, which the
    /// SA computes whole before its first segment shows it too big.)
    #[test]
    fn a_port_at_the_lid_past_the_room_keeps_the_port_on_gets() {
        let mut t = setup();
        let sends = t.miss(10..20);
        assert_eq!(sends.len(), 2, "{sends:?}");
        let (get, probe) = (sends[0], sends[1]);
        assert_eq!((get.1[3], dlid(&get.1)), (0x01, 10), "the window's Get");
        assert_eq!(
            (probe.1[3], dlid(&probe.1)),
            (0x01, 101),
            "the probe: a Get"
        );
        assert_eq!(mads::untoken(probe.0).0, TOKEN_PROBE);
        // More backlog while the probe is out: no second probe, no table.
        assert!(t.miss(20..30).is_empty());
        t.answer(probe.0, &probe.1, true);
        // The backlog still wants a table: none goes, ever; the Gets go on one by one.
        let (mut next, mut gets) = (get, 0);
        loop {
            t.answer(next.0, &next.1, true);
            let mut sends = t.sa_sends();
            sends.extend(t.miss(40..41));
            assert!(sends.iter().all(|(_, m)| m[3] == 0x01), "no GetTable");
            let Some(&n) = sends.first() else { break };
            assert_ne!(dlid(&n.1), 101, "the probe's path is cached");
            next = n;
            gets += 1;
        }
        assert_eq!(gets, 20, "11..=29 and 40, one Get each");
        let key = PathKey::new(CEP, Dest::Lid(101));
        assert!(matches!(t.cache.lookup(&key, t.now), Lookup::Hit { .. }));
        assert_eq!(t.r.stats().sa_table_failed, 0);
        assert!(t.miss(101..102).is_empty(), "a hit");
        t.r.check_invariants().unwrap();
    }

    /// No port at LID 101: the subnet fits, the table goes at once, and later backlogs ask
    /// by the table's own size, without a probe.
    #[test]
    fn no_port_at_the_lid_past_the_room_lets_the_table_go() {
        let mut t = setup();
        let sends = t.miss(10..20);
        let probe = sends[1];
        assert_eq!(dlid(&probe.1), 101);
        t.answer(probe.0, &probe.1, false);
        let sends = t.sa_sends();
        assert_eq!(sends.len(), 1);
        assert_eq!(sends[0].1[3], 0x12, "the GetTable");
        assert_eq!(mads::untoken(sends[0].0).0, TOKEN_TABLE);
        assert_eq!(t.r.stats().sa_unknown, 0);
        t.r.check_invariants().unwrap();
    }

    /// A warm start goes through the probe too: at its time the probe goes, not the table;
    /// the table follows, backlog or not, only when no port has the LID past the room; a port
    /// there keeps the endpoint on Gets. (Fails without: the warm start's GetTable goes at
    /// once, whatever the subnet's size.)
    #[test]
    fn a_warm_start_probes_first_and_asks_the_table_only_if_the_subnet_fits() {
        for fits in [true, false] {
            let mut t = setup_with(50);
            assert!(t.sa_sends().is_empty(), "nothing before the warm start");
            t.now = 50;
            t.r.handle_timeout(t.now);
            let sends = t.sa_sends();
            assert_eq!(sends.len(), 1, "{sends:?}");
            let probe = sends[0];
            assert_eq!(
                (probe.1[3], dlid(&probe.1)),
                (0x01, 101),
                "the probe, a Get"
            );
            assert_eq!(mads::untoken(probe.0).0, TOKEN_PROBE);
            t.answer(probe.0, &probe.1, !fits);
            let sends = t.sa_sends();
            if fits {
                assert_eq!(sends.len(), 1, "{sends:?}");
                assert_eq!(sends[0].1[3], 0x12, "the warm start's GetTable, no backlog");
            } else {
                assert!(sends.is_empty(), "a port at LID 101: no table");
                assert_eq!(t.miss(10..11).len(), 1, "a miss is a Get");
            }
            t.r.check_invariants().unwrap();
        }
    }

    /// What a warm start caches before any request is filed under the cache number the
    /// endpoint was opened at, the one the caller's hit path looks under: here a slot reused
    /// (the caller opens it a generation past its last one), the probe's path to the port at
    /// LID 101. (Fails when the resolver makes the number itself, at generation 0.)
    #[test]
    fn a_warm_start_caches_under_the_number_the_endpoint_was_opened_at() {
        let reused = ep_number(5, EP.0);
        let mut t = setup_at(50, reused);
        t.now = 50;
        t.r.handle_timeout(t.now);
        let sends = t.sa_sends();
        assert_eq!(sends.len(), 1, "{sends:?}");
        let probe = sends[0];
        assert_eq!(mads::untoken(probe.0).0, TOKEN_PROBE);
        t.answer(probe.0, &probe.1, true);
        let key = |ep| PathKey::new(ep, Dest::Lid(101));
        assert!(matches!(
            t.cache.lookup(&key(reused), t.now),
            Lookup::Hit { .. }
        ));
        assert_eq!(t.cache.lookup(&key(CEP), t.now), Lookup::Miss);
        t.r.check_invariants().unwrap();
    }

    /// A probe that fails (its tries ran out) asks nothing for `sa_deadline`, then probes again.
    #[test]
    fn a_lost_probe_waits_sa_deadline_then_probes_again() {
        let mut t = setup();
        let sends = t.miss(10..20);
        let (get, probe) = (sends[0], sends[1]);
        t.r.handle_sa(t.now, probe.0, 110, &probe.1);
        t.answer(get.0, &get.1, true);
        let sends = t.sa_sends();
        assert_eq!(sends.len(), 1, "the next Get, no table, no probe");
        assert_eq!(dlid(&sends[0].1), 11);
        t.now = 1000;
        let sends = t.miss(30..31);
        assert_eq!(sends.len(), 1);
        assert_eq!(dlid(&sends[0].1), 101, "probed again after sa_deadline");
    }
}
