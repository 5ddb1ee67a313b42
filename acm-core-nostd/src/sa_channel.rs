//! The SA channel of a UD QP, sans-IO: what the kernel MAD layer does for a umad agent, done
//! for the resolver's `SendSa` outputs when they leave on a QP of our own (the `ud` transport
//! of `acmrs_sa_transport`). The caller only moves bytes: it sends what [`SaChannel::start`]
//! and [`SaChannel::expire`] return and hands every class 3 MAD it receives to
//! [`SaChannel::receive`], which says what the MAD is.
//!
//! * **One completion per request.** The channel owns each request until it is answered: it
//!   re-sends the same MAD (same wire TID) after each try's time, `tries` tries in all, then
//!   reports the query failed ([`Expired::Failed`], complete it with [`TIMED_OUT`]). A
//!   response we send (a ReportResponse) needs no answer and is not tracked.
//! * **Unpredictable TIDs.** Any host of the fabric can send a MAD to our QP, and a forged
//!   reply is taken only if it names an outstanding request's TID. Each request therefore gets
//!   a wire TID of its own, 64 bits of SipHash-1-3 under the caller's random key over a
//!   counter, unique among those outstanding; the resolver's token and TID stay in the table,
//!   and the reply handed back carries the resolver's TID again.
//! * **Only the SM speaks class 3 to us.** [`SaChannel::receive`] takes a MAD only from the
//!   SM's LID and QP 1, and a reply only on the QP that carries the asking endpoint's SA
//!   traffic; anything else is [`Received::Forged`]. A reply whose TID matches nothing
//!   outstanding (a duplicate, a reply after the last try, a guess) is [`Received::Unknown`].
//!
//! Storage is the caller's (`E`, a slice of [`SaEntry`]): the channel never allocates. When it
//! is full a request is refused at once ([`SaChannel::start`] returns `None`; the caller fails
//! the query), which cannot happen while it is larger than the resolver's SA window plus its
//! joins and subscriptions.

use core::ops::DerefMut;

use crate::resolver::{AcmDest, EpId, Millis, RecvMeta, UnicastAv};
use crate::wire::gid::Gid;
use crate::wire::mad::{Header, HEADER_LEN, MAD_LEN};
use crate::wire::mcmember::ACM_QKEY;
use siphasher::sip::SipHasher13;

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

/// One outstanding request (storage for [`SaChannel`]).
#[derive(Clone, Copy)]
pub struct SaEntry {
    token: u64,
    /// The TID on the wire (see the module docs).
    tid: u64,
    /// The TID the resolver wrote into the MAD, put back into the reply it is handed.
    own_tid: u64,
    ep: EpId,
    deadline: Millis,
    per_try: Millis,
    tries_left: u32,
    mad: [u8; MAD_LEN],
}

impl SaEntry {
    /// An unused entry.
    pub const EMPTY: SaEntry = SaEntry {
        token: 0,
        tid: 0,
        own_tid: 0,
        ep: EpId(0),
        deadline: 0,
        per_try: 0,
        tries_left: 0,
        mad: [0; MAD_LEN],
    };
}

/// What [`SaChannel::expire`] asks of the caller for one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Expired {
    /// Send this MAD again on `ep`'s QP.
    Resend {
        /// Endpoint.
        ep: EpId,
        /// The MAD as first sent.
        mad: [u8; MAD_LEN],
    },
    /// Out of tries: complete `token` with [`TIMED_OUT`] and this MAD.
    Failed {
        /// The resolver's token.
        token: u64,
        /// The MAD as sent.
        mad: [u8; MAD_LEN],
    },
}

/// What a received class 3 MAD is ([`SaChannel::receive`]).
// The reply travels by value, as the MAD does everywhere here (no allocator to box it in).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// The reply to the outstanding request `token` (no longer outstanding), with the TID the
    /// resolver gave its request put back.
    Reply {
        /// The resolver's token.
        token: u64,
        /// The reply.
        mad: [u8; MAD_LEN],
    },
    /// A request from the SM (a Report): for the resolver's `handle_report`.
    Report,
    /// Not from the SM's LID and QP 1, or a reply on a QP that does not carry the asking
    /// endpoint's SA traffic: drop it (counted in [`SaChannel::forged`]).
    Forged,
    /// A reply from the SM that answers nothing outstanding (counted in
    /// [`SaChannel::unknown`]).
    Unknown,
}

/// Outstanding SA requests of every endpoint (see the module docs).
pub struct SaChannel<E: DerefMut<Target = [SaEntry]>> {
    entries: E,
    len: usize,
    /// Earliest deadline among the outstanding requests (a lower bound).
    next: Option<Millis>,
    /// Replies whose TID matched nothing outstanding.
    pub unknown: u64,
    /// MADs not from the SM, or replies on the wrong QP.
    pub forged: u64,
    /// Re-sends after a try timed out.
    pub resends: u64,
    /// Requests that ran out of tries.
    pub timeouts: u64,
    tids: SipHasher13,
    /// Requests numbered so far (the hashed counter).
    counter: u64,
}

impl<E: DerefMut<Target = [SaEntry]>> SaChannel<E> {
    /// A channel holding at most `entries.len()` outstanding requests, whose wire TIDs are
    /// keyed by `key` (random, and secret from the fabric: e.g. from the OS's random source).
    pub fn new(entries: E, key: [u64; 2]) -> Self {
        SaChannel {
            entries,
            len: 0,
            next: None,
            unknown: 0,
            forged: 0,
            resends: 0,
            timeouts: 0,
            tids: SipHasher13::new_with_keys(key[0], key[1]),
            counter: 0,
        }
    }

    /// Most requests it holds.
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// Requests outstanding.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every outstanding request (their tokens mean nothing any more) and starts the
    /// counters again; the TID key stays.
    pub fn clear(&mut self) {
        self.len = 0;
        self.next = None;
    }

    fn live(&self) -> &[SaEntry] {
        &self.entries[..self.len]
    }

    fn position(&self, tid: u64) -> Option<usize> {
        self.live().iter().position(|e| e.tid == tid)
    }

    fn swap_remove(&mut self, i: usize) -> SaEntry {
        let e = self.entries[i];
        self.len -= 1;
        self.entries[i] = self.entries[self.len];
        e
    }

    /// A wire TID no outstanding request has, and not 0.
    fn fresh_tid(&mut self) -> u64 {
        loop {
            let t = self.tids.hash(&self.counter.to_le_bytes());
            self.counter = self.counter.wrapping_add(1);
            if t != 0 && self.position(t).is_none() {
                return t;
            }
        }
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
        mad: &[u8; MAD_LEN],
        per_try: Millis,
        tries: u32,
    ) -> Option<[u8; MAD_LEN]> {
        let mut wire = *mad;
        let head = Header::new_unchecked(&mad[..HEADER_LEN]);
        if head.method().is_response() {
            return Some(wire);
        }
        if self.len >= self.entries.len() {
            return None;
        }
        let tid = self.fresh_tid();
        Header::new_unchecked(&mut wire[..HEADER_LEN]).set_tid(tid);
        let deadline = now.saturating_add(per_try);
        self.entries[self.len] = SaEntry {
            token,
            tid,
            own_tid: head.tid(),
            ep,
            deadline,
            per_try,
            tries_left: tries.max(1) - 1,
            mad: wire,
        };
        self.len += 1;
        self.next = Some(self.next.map_or(deadline, |n| n.min(deadline)));
        Some(wire)
    }

    /// What the class 3 MAD `mad`, received with `meta` from a port whose SM is at `sm`, is.
    /// `carries(owner)` says whether the QP it arrived on carries endpoint `owner`'s SA
    /// traffic. A reply that answers an outstanding request completes it here.
    pub fn receive(
        &mut self,
        meta: &RecvMeta,
        sm: Option<SmAddr>,
        carries: impl FnOnce(EpId) -> bool,
        mad: &[u8; MAD_LEN],
    ) -> Received {
        if sm.is_none_or(|sm| sm.lid != meta.slid) || meta.src_qp != 1 {
            self.forged += 1;
            return Received::Forged;
        }
        let head = Header::new_unchecked(&mad[..HEADER_LEN]);
        if !head.method().is_response() {
            return Received::Report;
        }
        let Some(i) = self.position(head.tid()) else {
            self.unknown += 1;
            return Received::Unknown;
        };
        if !carries(self.entries[i].ep) {
            self.forged += 1;
            return Received::Forged;
        }
        let e = self.swap_remove(i);
        let mut m = *mad;
        Header::new_unchecked(&mut m[..HEADER_LEN]).set_tid(e.own_tid);
        Received::Reply {
            token: e.token,
            mad: m,
        }
    }

    /// Forgets endpoint `ep`'s requests (its QP is gone): their tokens, to complete as failed.
    pub fn drop_endpoint(&mut self, ep: EpId, mut f: impl FnMut(u64, [u8; MAD_LEN])) {
        let mut i = 0;
        while i < self.len {
            if self.entries[i].ep == ep {
                let e = self.swap_remove(i);
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
        while i < self.len {
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
                    let e = self.swap_remove(i);
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
    use std::vec;
    use std::vec::Vec;

    const SM: SmAddr = SmAddr { lid: 1, sl: 0 };

    fn channel(n: usize) -> SaChannel<Vec<SaEntry>> {
        SaChannel::new(vec![SaEntry::EMPTY; n], [0x1234, 0x5678])
    }

    fn get(tid_byte: u8) -> [u8; MAD_LEN] {
        let mut m = [0u8; MAD_LEN];
        m[..4].copy_from_slice(&[1, 3, 2, 1]);
        m[15] = tid_byte;
        m
    }

    fn from(slid: u16, src_qp: u32) -> RecvMeta {
        RecvMeta {
            slid,
            src_qp,
            sl: 0,
            dlid_path_bits: 0,
            pkey_index: 0,
            ep_pkey_index: 0,
            grh_sgid: None,
        }
    }

    fn reply_to(wire: &[u8; MAD_LEN]) -> [u8; MAD_LEN] {
        let mut r = *wire;
        r[3] = 0x81;
        r
    }

    #[test]
    fn a_request_gets_a_tid_of_its_own_and_its_reply_completes_it() {
        let mut c = channel(4);
        let wire = c
            .start(0, EpId(1), 0x0400_0007_dead_beef, &get(1), 100, 3)
            .unwrap();
        assert_ne!(&wire[8..16], &0x0400_0007_dead_beefu64.to_be_bytes());
        assert_eq!(&wire[16..], &get(1)[16..]);
        let reply = reply_to(&wire);
        // A reply naming the resolver's token or TID (what the wire TID used to be) answers
        // nothing.
        let mut guess = reply;
        guess[8..16].copy_from_slice(&0x0400_0007_dead_beefu64.to_be_bytes());
        assert_eq!(
            c.receive(&from(1, 1), Some(SM), |_| true, &guess),
            Received::Unknown
        );
        guess[8..16].copy_from_slice(&get(1)[8..16]);
        assert_eq!(
            c.receive(&from(1, 1), Some(SM), |_| true, &guess),
            Received::Unknown
        );
        let Received::Reply { token, mad } =
            c.receive(&from(1, 1), Some(SM), |e| e == EpId(1), &reply)
        else {
            panic!("the SM's reply on the asking QP completes the request");
        };
        assert_eq!(token, 0x0400_0007_dead_beef);
        assert_eq!(mad[15], 1, "the resolver's TID is back");
        assert_eq!(&mad[16..], &reply[16..]);
        assert!(c.is_empty());
        assert_eq!(
            c.receive(&from(1, 1), Some(SM), |_| true, &reply),
            Received::Unknown,
            "a duplicate answers nothing"
        );
        assert_eq!(c.unknown, 3);
    }

    #[test]
    fn only_the_sm_on_the_asking_qp_is_heard() {
        let mut c = channel(4);
        let wire = c.start(0, EpId(2), 7, &get(1), 100, 3).unwrap();
        let reply = reply_to(&wire);
        // Another host, even with the right TID; the SM's LID but not QP 1; no SM known.
        for (meta, sm) in [
            (from(9, 1), Some(SM)),
            (from(1, 0x48), Some(SM)),
            (from(1, 1), None),
        ] {
            assert_eq!(c.receive(&meta, sm, |_| true, &reply), Received::Forged);
        }
        // The SM, but on a QP that does not carry endpoint 2's SA traffic.
        assert_eq!(
            c.receive(&from(1, 1), Some(SM), |e| e != EpId(2), &reply),
            Received::Forged
        );
        assert_eq!(c.forged, 4);
        assert_eq!(c.len(), 1, "the request is still outstanding");
        // A Report (a request, no R bit) from the SM is the resolver's; from anyone else not.
        let mut report = get(0);
        report[3] = 0x06;
        assert_eq!(
            c.receive(&from(1, 1), Some(SM), |_| false, &report),
            Received::Report
        );
        assert_eq!(
            c.receive(&from(3, 1), Some(SM), |_| true, &report),
            Received::Forged
        );
        assert!(matches!(
            c.receive(&from(1, 1), Some(SM), |e| e == EpId(2), &reply),
            Received::Reply { token: 7, .. }
        ));
    }

    #[test]
    fn tids_cannot_be_predicted_from_earlier_ones() {
        // Sequential tokens, as the resolver hands them out: the wire TIDs of 64 requests are
        // distinct, and knowing them tells nothing of the next one (no constant step, no
        // small differences: a counter from a random start fails both).
        let mut c = channel(128);
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
        // Another key (another process start) numbers differently.
        let mut d = SaChannel::new(vec![SaEntry::EMPTY; 4], [0x1235, 0x5678]);
        let w = d.start(0, EpId(0), 0x100, &get(1), 100, 3).unwrap();
        assert_ne!(u64::from_be_bytes(w[8..16].try_into().unwrap()), tids[0]);
    }

    #[test]
    fn unanswered_requests_are_resent_then_failed_exactly_once() {
        let mut c = channel(4);
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
        let mut c = channel(1);
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
        assert!(c.start(0, EpId(0), 8, &get(3), 100, 3).is_some());
        c.clear();
        assert!(c.is_empty() && c.next_deadline().is_none());
    }
}
