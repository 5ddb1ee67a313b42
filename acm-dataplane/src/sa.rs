//! The dataplane's own SA channel: the `ud` transport of `acmrs_sa_transport`.
//!
//! SA MADs go from the port's SA-keyed UD QP to the SM's QP1 (SM LID and SL from the port, the
//! GSI Q_Key 0x80010000, which the ACM QP has anyway), and the SA answers the sending QP:
//! replies and Reports come back on the QP the ACM protocol already polls. No umad agent, no
//! syscall per query, and no `sa_depth` credit: how many queries are out is the resolver's SA
//! window (`acmrs_sa_window`, halved on BUSY).
//!
//! What the kernel MAD layer (or the core's SA service) does for a umad agent, this table does
//! for the QP: it owns each request until it is answered, re-sends the same MAD (same TID)
//! after `timeout` + the port's subnet timeout, `retries + 1` tries in all, then reports the
//! query failed (ETIMEDOUT) to the resolver — exactly one completion per request, as the
//! resolver's `SendSa` contract wants. Responses we send (a ReportResponse) need no answer and
//! are not tracked.
//!
//! **TIDs are unpredictable.** Any host of the fabric can send a MAD to our QP; a forged reply
//! is taken only if it names an outstanding request's TID. Each request therefore gets a wire
//! TID of its own, 64 keyed-hash bits (SipHash with the process's random keys over a counter),
//! unique among those outstanding; the resolver's token stays in the table. A reply whose TID
//! matches nothing outstanding (a duplicate, a reply after the last try gave up, a guess) is
//! dropped and counted. The loop also takes a reply only from the SM (its LID, QP 1) and only
//! on the QP that carries the asking endpoint's SA traffic (`Plane`).
//!
//! The table is preallocated ([`SaChannel::new`]) and never grows; when it is full the send
//! fails at once (the resolver answers the query as failed), which cannot happen while it is
//! larger than the resolver's window plus its joins and subscriptions.

use acm_core_nostd::resolver::{AcmDest, EpId, Millis, UnicastAv};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::mad::METHOD_RESP;
use acm_core_nostd::wire::mcmember::ACM_QKEY;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// The umad status a query that ran out of tries completes with (ETIMEDOUT).
pub const TIMED_OUT: u32 = 110;

/// Where a port's SA is: the SM's LID and SL (`ibv_port_attr.sm_lid` / `sm_sl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmAddr {
    /// SM LID (0 = no SM known).
    pub lid: u16,
    /// SL to reach it.
    pub sl: u8,
}

impl SmAddr {
    /// The address vector of the SM's QP1.
    pub fn dest(&self) -> AcmDest {
        AcmDest::Unicast(UnicastAv {
            dlid: self.lid,
            sl: self.sl,
            src_path_bits: 0,
            static_rate: 0,
            dgid: Gid::ZERO,
            flow_label: 0,
            hop_limit: 0,
            tclass: 0,
            remote_qpn: 1,
            remote_qkey: ACM_QKEY,
        })
    }
}

#[derive(Clone, Copy)]
struct Entry {
    token: u64,
    /// The TID on the wire (see the module docs).
    tid: u64,
    /// The TID the resolver wrote into the MAD, put back into the reply it is handed.
    own_tid: [u8; 8],
    ep: EpId,
    deadline: Millis,
    per_try: Millis,
    tries_left: u32,
    mad: [u8; 256],
}

/// What [`SaChannel::expire`] asks of the caller for one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Expired {
    /// Send this MAD again on `ep`'s QP.
    Resend {
        /// Endpoint.
        ep: EpId,
        /// The MAD as first sent.
        mad: [u8; 256],
    },
    /// Out of tries: complete `token` with [`TIMED_OUT`] and this MAD.
    Failed {
        /// The resolver's token.
        token: u64,
        /// The MAD as sent.
        mad: [u8; 256],
    },
}

/// Outstanding SA requests of every endpoint (see the module docs).
pub struct SaChannel {
    entries: Vec<Entry>,
    capacity: usize,
    /// Earliest deadline among `entries` (a lower bound).
    next: Option<Millis>,
    /// Replies whose TID matched nothing outstanding.
    pub unknown: u64,
    /// Re-sends after a try timed out.
    pub resends: u64,
    /// Requests that ran out of tries.
    pub timeouts: u64,
    /// Keys of the TID hash (the process's random SipHash keys).
    keys: RandomState,
    /// Requests numbered so far (the hashed counter).
    counter: u64,
}

impl SaChannel {
    /// A channel for at most `capacity` outstanding requests (allocated now).
    pub fn new(capacity: usize) -> SaChannel {
        SaChannel {
            entries: Vec::with_capacity(capacity),
            capacity,
            next: None,
            unknown: 0,
            resends: 0,
            timeouts: 0,
            keys: RandomState::new(),
            counter: 0,
        }
    }

    /// A wire TID no outstanding request has, and not 0.
    fn fresh_tid(&mut self) -> u64 {
        loop {
            let mut h = self.keys.build_hasher();
            h.write_u64(self.counter);
            self.counter = self.counter.wrapping_add(1);
            let t = h.finish();
            if t != 0 && !self.entries.iter().any(|e| e.tid == t) {
                return t;
            }
        }
    }

    /// Most requests it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Requests outstanding.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Prepares `mad` for the wire and takes ownership of it: a request gets a fresh
    /// unpredictable TID and is tracked, with the resolver's `token`, for `tries` tries of
    /// `per_try` ms each; a response (R bit) is sent as it is and not tracked. Returns the
    /// bytes to send, or `None` when the table is full.
    pub fn start(
        &mut self,
        now: Millis,
        ep: EpId,
        token: u64,
        mad: &[u8; 256],
        per_try: Millis,
        tries: u32,
    ) -> Option<[u8; 256]> {
        let mut wire = *mad;
        if mad[3] & METHOD_RESP != 0 {
            return Some(wire);
        }
        if self.entries.len() >= self.capacity {
            return None;
        }
        let tid = self.fresh_tid();
        let mut own_tid = [0u8; 8];
        own_tid.copy_from_slice(&mad[8..16]);
        wire[8..16].copy_from_slice(&tid.to_be_bytes());
        let deadline = now.saturating_add(per_try);
        self.entries.push(Entry {
            token,
            tid,
            own_tid,
            ep,
            deadline,
            per_try,
            tries_left: tries.max(1) - 1,
            mad: wire,
        });
        self.next = Some(self.next.map_or(deadline, |n| n.min(deadline)));
        Some(wire)
    }

    /// The endpoint whose outstanding request a reply with this MAD's TID would answer.
    pub fn owner(&self, mad: &[u8; 256]) -> Option<EpId> {
        let tid = u64::from_be_bytes(mad[8..16].try_into().ok()?);
        self.entries.iter().find(|e| e.tid == tid).map(|e| e.ep)
    }

    /// A reply MAD (R bit set) arrived: the token of the request it answers, which is no
    /// longer outstanding, and the reply with the TID the resolver gave its request (what it
    /// checks); `None` (counted) if it answers nothing outstanding.
    pub fn reply(&mut self, mad: &[u8; 256]) -> Option<(u64, [u8; 256])> {
        let tid = u64::from_be_bytes(mad[8..16].try_into().ok()?);
        match self.entries.iter().position(|e| e.tid == tid) {
            Some(i) => {
                let e = self.entries.swap_remove(i);
                let mut m = *mad;
                m[8..16].copy_from_slice(&e.own_tid);
                Some((e.token, m))
            }
            None => {
                self.unknown += 1;
                None
            }
        }
    }

    /// Forgets endpoint `ep`'s requests (its QP is gone): their tokens, to complete as failed.
    pub fn drop_endpoint(&mut self, ep: EpId, mut f: impl FnMut(u64, [u8; 256])) {
        let mut i = 0;
        while i < self.entries.len() {
            if self.entries[i].ep == ep {
                let e = self.entries.swap_remove(i);
                f(e.token, e.mad);
            } else {
                i += 1;
            }
        }
    }

    /// When [`expire`](Self::expire) has work (a lower bound).
    pub fn next_deadline(&self) -> Option<Millis> {
        self.next
    }

    /// Runs the tries due at `now`: each due request is either re-sent (its next try starts
    /// now) or failed (removed).
    pub fn expire(&mut self, now: Millis, mut f: impl FnMut(Expired)) {
        if self.next.is_none_or(|n| n > now) {
            return;
        }
        let mut next: Option<Millis> = None;
        let mut i = 0;
        while i < self.entries.len() {
            let e = &mut self.entries[i];
            if e.deadline <= now {
                if e.tries_left > 0 {
                    e.tries_left -= 1;
                    e.deadline = now.saturating_add(e.per_try);
                    self.resends += 1;
                    f(Expired::Resend {
                        ep: e.ep,
                        mad: e.mad,
                    });
                } else {
                    let e = self.entries.swap_remove(i);
                    self.timeouts += 1;
                    f(Expired::Failed {
                        token: e.token,
                        mad: e.mad,
                    });
                    continue;
                }
            }
            let d = self.entries[i].deadline;
            next = Some(next.map_or(d, |n| n.min(d)));
            i += 1;
        }
        self.next = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(tid_byte: u8) -> [u8; 256] {
        let mut m = [0u8; 256];
        m[..4].copy_from_slice(&[1, 3, 2, 1]);
        m[15] = tid_byte;
        m
    }

    #[test]
    fn a_request_gets_a_tid_of_its_own_and_its_reply_completes_it() {
        let mut c = SaChannel::new(4);
        let wire = c
            .start(0, EpId(1), 0x0400_0007_dead_beef, &get(1), 100, 3)
            .unwrap();
        assert_ne!(&wire[8..16], &0x0400_0007_dead_beefu64.to_be_bytes());
        assert_eq!(&wire[16..], &get(1)[16..]);
        let mut reply = wire;
        reply[3] = 0x81;
        assert_eq!(c.owner(&reply), Some(EpId(1)));
        // A reply naming the resolver's token (what the TID used to be) answers nothing.
        let mut guess = reply;
        guess[8..16].copy_from_slice(&0x0400_0007_dead_beefu64.to_be_bytes());
        assert_eq!(c.reply(&guess), None);
        let (token, back) = c.reply(&reply).unwrap();
        assert_eq!(token, 0x0400_0007_dead_beef);
        assert_eq!(back[15], 1, "the resolver's TID is back");
        assert_eq!(&back[16..], &reply[16..]);
        assert!(c.is_empty());
        assert_eq!(c.reply(&reply), None, "a duplicate answers nothing");
        assert_eq!(c.unknown, 2);
    }

    #[test]
    fn tids_cannot_be_predicted_from_earlier_ones() {
        // Sequential tokens, as the resolver hands them out: the wire TIDs of 64 requests are
        // distinct, and knowing them tells nothing of the next one (no constant step, no
        // small differences: a counter from a random start fails both).
        let mut c = SaChannel::new(128);
        let tids: Vec<u64> = (0..64u64)
            .map(|t| {
                let w = c.start(0, EpId(0), 0x100 + t, &get(1), 100, 3).unwrap();
                u64::from_be_bytes(w[8..16].try_into().unwrap())
            })
            .collect();
        let mut uniq = tids.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(uniq.len(), tids.len());
        let steps: Vec<u64> = tids.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        assert!(steps.windows(2).any(|s| s[0] != s[1]), "a constant step");
        let small = steps.iter().filter(|d| **d < 1 << 32).count();
        assert!(small < 4, "{small} of 63 steps below 2^32");
        // Another channel (another process start) numbers differently.
        let mut d = SaChannel::new(4);
        let w = d.start(0, EpId(0), 0x100, &get(1), 100, 3).unwrap();
        assert_ne!(u64::from_be_bytes(w[8..16].try_into().unwrap()), tids[0]);
    }

    #[test]
    fn unanswered_requests_are_resent_then_failed_exactly_once() {
        let mut c = SaChannel::new(4);
        let wire = c.start(0, EpId(1), 9, &get(1), 100, 3).unwrap();
        let mut seen = Vec::new();
        c.expire(99, |e| seen.push(e));
        assert!(seen.is_empty());
        assert_eq!(c.next_deadline(), Some(100));
        for at in [100, 200] {
            c.expire(at, |e| seen.push(e));
            assert_eq!(
                seen.pop(),
                Some(Expired::Resend {
                    ep: EpId(1),
                    mad: wire
                })
            );
        }
        c.expire(299, |e| seen.push(e));
        assert!(seen.is_empty());
        c.expire(300, |e| seen.push(e));
        assert_eq!(
            seen,
            vec![Expired::Failed {
                token: 9,
                mad: wire
            }]
        );
        assert!(c.is_empty() && c.next_deadline().is_none());
        assert_eq!((c.resends, c.timeouts), (2, 1));
    }

    #[test]
    fn responses_are_not_tracked_and_a_full_table_refuses() {
        let mut c = SaChannel::new(1);
        let mut resp = get(1);
        resp[3] = 0x86;
        resp[8..16].copy_from_slice(&77u64.to_be_bytes());
        let wire = c.start(0, EpId(0), 5, &resp, 100, 3).unwrap();
        assert_eq!(
            &wire[8..16],
            &77u64.to_be_bytes(),
            "a response keeps its TID"
        );
        assert!(c.is_empty());
        assert!(c.start(0, EpId(0), 6, &get(2), 100, 3).is_some());
        assert!(c.start(0, EpId(0), 7, &get(3), 100, 3).is_none());
        let mut dropped = Vec::new();
        c.drop_endpoint(EpId(0), |t, _| dropped.push(t));
        assert_eq!(dropped, vec![6]);
    }
}
