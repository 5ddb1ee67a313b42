//! The `ud` SA transport (`acmrs_sa_transport ud`, [`Plane::with_ud_sa`]): SA MADs leave on
//! the UD QP of the endpoint's SA carrier (`carrier_of`) for the SM's QP1; the protocol
//! logic (TIDs, tries, timeouts, what a class-3 MAD is) is the core's sans-IO
//! `acm_core_nostd::sa_channel`, the loop only moves its bytes. Replies and Reports come back
//! on the carrier's CQ (`sa_receive`, `report`); `sa_timers` re-sends, fails and re-reads the
//! ports' SM LIDs.

use super::{CoreIo, Eps, Plane};
use acm_core_nostd::resolver::table::TableError;
use acm_core_nostd::resolver::{EpId, Millis, RecvMeta};
use acm_core_nostd::rmpp::{self, Failure};
use acm_core_nostd::sa_channel::{
    Expired, Received, SaChannel, SaEntry, SmAddr, TableSlot, TIMED_OUT,
};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::inform::NoticeRepr;
use acm_core_nostd::wire::path_record::PATH_RECORD_LEN;
use acm_core_nostd::wire::sa::DATA_OFFSET as SA_DATA;
/// How often the loop re-reads each port's SM LID (the core forwards no SM_CHANGE event).
pub const SM_CHECK_MS: Millis = 1000;

impl<I: CoreIo> Plane<I> {
    /// The SM address endpoint `ep`'s SA MADs go to over its UD QP, `None` when they go
    /// through the core (transport `core`, no QP, no SM known).
    pub(super) fn ud_sa_route(&self, ep: EpId) -> Option<(usize, SmAddr)> {
        if !self.sa_ud {
            return None;
        }
        let i = carrier_of(&self.eps, ep)?;
        Some((i, self.eps.get(i)?.sm?))
    }

    /// Sends `ep`'s SA MAD on the UD QP of endpoint `via` (its SA carrier) to `sm` (tracked
    /// for re-sends unless it is a response). False when it cannot be tracked (table full); a
    /// failed post is retried like a loss.
    pub(super) fn send_sa_ud(
        &mut self,
        now: Millis,
        ep: EpId,
        via: usize,
        sm: SmAddr,
        token: u64,
        mad: &[u8; 256],
    ) -> bool {
        let cfg = *self.r().config();
        let Some(rec) = self.eps.get_mut(via) else {
            return false;
        };
        let per_try = cfg.acm_timeout.saturating_add(rec.cfg.subnet_timeout_ms);
        let tries = cfg.sa_tries.max(1);
        let Some(wire) = self.sa.start(now, ep, token, mad, per_try, tries) else {
            self.io
                .log(0, "ERROR - SA request table full: query failed");
            return false;
        };
        if let Some(ud) = rec.ud.as_mut() {
            if let Err(e) = ud.send(&sm.dest(), &wire) {
                if self.io.log_enabled(1) {
                    self.io.log(1, &format!("SA send failed (retried): {e}"));
                }
            }
        }
        true
    }

    /// A class 3 MAD received on `ep`'s QP: a reply completes its request, anything else is
    /// offered to the resolver as a Report. Only the SM speaks class 3 to us: a MAD from
    /// another LID or QP is dropped (counted, logged), and so is a reply that arrives on a QP
    /// other than the one that carries the asking endpoint's SA MADs. The token of the
    /// query it answered, if it did: [`Plane::sa_answered`]'s, once the outputs are out.
    pub(super) fn sa_receive(
        &mut self,
        now: Millis,
        ep: EpId,
        meta: &RecvMeta,
        mad: &[u8; 256],
    ) -> Option<u64> {
        let sm = self.eps.get(usize::from(ep.0)).and_then(|r| r.sm);
        let eps = &self.eps;
        let on = usize::from(ep.0);
        let carries = |owner: EpId| carrier_of(eps, owner) == Some(on);
        let (token, mad) = match self.sa.receive(now, meta, sm, carries, mad) {
            Received::Reply { token, mad } => (token, mad),
            Received::Segment => {
                self.sa_transmit();
                return None;
            }
            Received::Table { token, slot } => {
                self.sa_transmit();
                let table = self.sa.table(slot);
                if self.io.log_enabled(1) {
                    let records = table.map_or(0, |t| t.records.len() / PATH_RECORD_LEN);
                    self.io.log(
                        1,
                        &format!("SA half-world PathRecord table: {records} records"),
                    );
                }
                let r = self.resolver.as_mut().expect("a live loop has a resolver");
                r.handle_sa_table(now, token, table.ok_or(TableError::Failed));
                return Some(token);
            }
            Received::TableFailed { token, failure } => {
                self.sa_transmit();
                self.table_failed(now, token, failure);
                return None;
            }
            // Counted by the channel (`SaChannel::forged`), logged by `log_drops`.
            Received::Forged => return None,
            // Token 0 names nothing: the resolver counts (and the loop logs) an unknown reply.
            Received::Unknown => {
                self.r().handle_sa(now, 0, 0, mad);
                return None;
            }
            Received::Report => {
                self.report(now, ep, mad);
                return None;
            }
        };
        self.r().handle_sa(now, token, 0, &mad);
        Some(token)
    }

    /// Sends the RMPP ACKs, STOPs and ABORTs the SA channel has for half-world tables, each on
    /// its endpoint's SA carrier to the SM.
    fn sa_transmit(&mut self) {
        while let Some((ep, mad)) = self.sa.poll_transmit() {
            self.send_to_sm(ep, &mad);
        }
    }

    /// Sends `mad`, a MAD the SA channel already tracks (a re-send, an RMPP ACK/STOP/ABORT),
    /// on `ep`'s SA carrier to the SM. A failed post is not reported: a lost re-send is the
    /// next try's, a lost ACK is re-sent by the receiver's timer or asked for again by the
    /// sender's next segment.
    fn send_to_sm(&mut self, ep: EpId, mad: &[u8; 256]) {
        if let Some((via, sm)) = self.ud_sa_route(ep) {
            if let Some(ud) = self.eps.get_mut(via).and_then(|r| r.ud.as_mut()) {
                let _ = ud.send(&sm.dest(), mad);
            }
        }
    }

    /// A half-world table that brought nothing (logged with the reason): the resolver goes on
    /// with Gets.
    fn table_failed(&mut self, now: Millis, token: u64, failure: Failure) {
        self.reply_due.done(token, std::time::Instant::now(), false);
        let (err, why) = match failure {
            Failure::TooBig {
                records_needed,
                capacity,
                ..
            } => {
                let need = records_needed.map_or("more".to_string(), |n| n.to_string());
                let why = format!(
                    "needs {need} records, room for {} (acmrs_path_capacity): tables off for this endpoint",
                    capacity / PATH_RECORD_LEN
                );
                (TableError::TooBig, why)
            }
            f => (TableError::Failed, format!("{f:?}: the Gets go on")),
        };
        self.io.log(
            0,
            &format!("ERROR - SA half-world PathRecord table failed: {why}"),
        );
        self.r().handle_sa_table(now, token, Err(err));
        self.drain_outputs(now);
    }

    /// A Report from the SM (trap 64/65): the resolver's, logged when it took it.
    fn report(&mut self, now: Millis, ep: EpId, mad: &[u8; 256]) {
        let before = self.r().stats();
        self.r().handle_report(now, ep, mad);
        let after = self.r().stats();
        if after.reports > before.reports && self.io.log_enabled(1) {
            // The resolver took it as a Report, so its Notice parses.
            let notice = NoticeRepr::parse_bytes(&mad[SA_DATA..]).ok();
            let trap = notice.map_or(0, |n| n.trap);
            let gid = notice.and_then(|n| n.subject_gid()).map_or(Gid::ZERO, Gid);
            self.io.log(
                1,
                &format!(
                    "SA Report: trap {trap} for {gid}: {} cache entries invalidated",
                    after.report_invalidated - before.report_invalidated
                ),
            );
        }
    }

    /// Re-sends or fails the `ud` transport's SA requests whose try ran out, and re-reads the
    /// ports' SM addresses when due (a new SM LID drops what was learned from the old fabric
    /// state and subscribes again, as a client reregister does).
    pub(super) fn sa_timers(&mut self, now: Millis) {
        if self.sa.next_deadline().is_some_and(|t| t <= now) {
            // The loop's own buffer (as `rx`): no allocation per expiry round.
            let mut due = std::mem::take(&mut self.sa_due);
            self.sa.expire(now, |e| due.push(e));
            for e in due.drain(..) {
                match e {
                    Expired::Resend { ep, mad } => self.send_to_sm(ep, &mad),
                    Expired::Failed { token, mad } => {
                        self.reply_due.done(token, std::time::Instant::now(), false);
                        self.r().handle_sa(now, token, TIMED_OUT, &mad);
                        self.drain_outputs(now);
                    }
                    Expired::TableFailed { token, failure } => {
                        self.table_failed(now, token, failure);
                    }
                }
            }
            self.sa_due = due;
            // ACKs re-sent after a silence, an ABORT at the total time.
            self.sa_transmit();
        }
        if !self.sa_ud || now < self.next_sm_check {
            return;
        }
        self.next_sm_check = now.saturating_add(SM_CHECK_MS);
        for k in 0..self.eps.count() {
            let Some((i, rec)) = self.eps.nth_mut(k) else {
                break;
            };
            let Some(ud) = rec.ud.as_mut() else {
                continue;
            };
            let Some(sm) = ud.sm_addr() else {
                continue;
            };
            if rec.sm == Some(sm) {
                continue;
            }
            let old = rec.sm.replace(sm);
            let cache_ep = rec.cache_ep;
            if let Some(old) = old {
                self.io.log(
                    0,
                    &format!(
                        "SM LID changed {} -> {}: learned paths dropped, subscriptions renewed",
                        old.lid, sm.lid
                    ),
                );
                self.r().reregister(now, EpId(i as u8), cache_ep);
                self.drain_outputs(now);
            }
        }
    }

    /// Sends SA MADs from each endpoint's UD QP to its port's SM (the `ud` transport) with
    /// room for `capacity` outstanding requests; endpoints without a QP or without a known SM
    /// still use the core's service.
    /// One half-world PathRecord table at a time is taken, of up to `table_records` records
    /// (0: none; the resolver then never gets a table and turns them off on the first try).
    pub fn with_ud_sa(mut self, capacity: usize, table_records: usize) -> Self {
        self.sa_ud = true;
        let tables = match table_records {
            0 => Vec::new(),
            n => vec![TableSlot::new(
                vec![0u8; n * 64].into_boxed_slice(),
                rmpp::Config::DEFAULT,
            )],
        };
        self.sa = SaChannel::new(vec![SaEntry::EMPTY; capacity], tables, sa_tid_key());
        self
    }
}

/// The endpoint whose UD QP carries `ep`'s SA MADs: `ep` itself if its QP is on the port's SA
/// P_Key (`EpConfig::sa_pkey`), else an open endpoint of the same port (same GID 0) whose QP
/// is. The SM's port drops MADs of a partition it is not in, so an endpoint of another
/// partition cannot reach the SA on its own QP; with no carrier on the port, its MADs go
/// through the core's service. Replies come back on that QP and are matched to `ep`'s query
/// by the SA channel.
fn carrier_of(eps: &Eps, ep: EpId) -> Option<usize> {
    let own = eps.get(usize::from(ep.0))?;
    if own.cfg.sa_pkey && own.ud.is_some() {
        return Some(usize::from(ep.0));
    }
    let gid = own.cfg.port_gid;
    eps.iter()
        .find(|(_, r)| r.cfg.sa_pkey && r.ud.is_some() && r.cfg.port_gid == gid)
        .map(|(i, _)| i)
}

/// A random key for the SA channel's wire TIDs: two draws of std's randomly keyed hasher
/// (seeded from the OS's random source once per process).
pub(super) fn sa_tid_key() -> [u64; 2] {
    use std::hash::BuildHasher;
    let s = std::collections::hash_map::RandomState::new();
    [s.hash_one(0x5a_u64), s.hash_one(0xa5_u64)]
}
