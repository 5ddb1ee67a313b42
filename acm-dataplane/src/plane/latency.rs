//! The loop's latency bookkeeping, beside the round rather than inside it: the round calls
//! one hook at each fixed point of a miss's way (as DPDK keeps its xstats beside the burst
//! loop), and every hook is a no-op when the loop keeps no latencies ([`Plane::with_stats`]).
//!
//! The hook points, in a round's order:
//!
//! * [`Latencies::reply_taken`]: an SA or ACM reply taken from a queue or a CQ (its leg to the
//!   first answer starts; an SA reply's round trip ends);
//! * [`Latencies::request_taken`] / [`Latencies::request_given`]: a stamped request given to
//!   the node, before and after its outputs are carried out (its queue wait is recorded, and
//!   it is remembered until its answer, only once its query is out);
//! * [`Latencies::now`] + [`Latencies::query_out`] / [`Latencies::sent`]: a MAD posted (a
//!   request's leg to its first query ends; an SA query's round trip starts);
//! * [`Latencies::now`] + [`Latencies::answered`]: an answer handed to the core (a request's
//!   latency ends, and a reply's leg to it);
//! * [`Latencies::sa_done`]: an SA query's bookkeeping after the answers it led to;
//! * [`Latencies::drained`]: the outputs of one input all carried out;
//! * [`Latencies::forget`]: after a panic, what the old resolver held.
//!
//! [`Plane::with_stats`]: super::Plane::with_stats

use super::{Kind, LatencySink, Queued};
use crate::stats::{Clock, InFlight, Latency, MissClass, MissStamp};
use acm_core_nostd::resolver::{Answer, EpId, MsgBuf};
use acm_core_nostd::wire::client::AcmMsg;

/// The loop's latency bookkeeping: nothing when the loop keeps no latencies.
pub(super) struct Latencies(Option<Book>);

/// What is kept when latencies are on.
struct Book {
    clock: Clock,
    sink: LatencySink,
    /// Requests given to the resolver, by (client, tid): start, endpoint, route|address.
    misses: InFlight<(EpId, MissClass)>,
    /// SA queries sent, by token: send time, endpoint.
    sa: InFlight<EpId>,
    /// The leg being timed while the outputs of one input are carried out (cleared when
    /// they are all carried out).
    lap: Option<Lap>,
    /// The stamped request the round is giving the resolver now, and whether its answer is
    /// out already (one in those outputs is timed from here): its queue wait is recorded,
    /// and it is remembered in `misses` unless answered, only once its outputs are carried
    /// out ([`Latencies::request_given`]), so that this bookkeeping is not on the way to its
    /// query.
    entering: Option<(Entering, bool)>,
}

/// A stamped request being given to the resolver.
#[derive(Clone, Copy, Debug)]
struct Entering {
    key: u128,
    stamp: MissStamp,
    ep: EpId,
    /// When the round took it (clock ticks).
    taken: u64,
}

/// A leg of a miss that ends at an output of the input a round just gave the resolver.
#[derive(Clone, Copy, Debug)]
enum Lap {
    /// A missed request, taken by the round at `taken` (clock ticks): ends at the first
    /// query sent ([`Latency::MissToQuery`]).
    Request { taken: u64, ep: EpId },
    /// A reply, taken by the round at `taken`: ends at the first answer delivered
    /// ([`Latency::ReplyToAnswer`]).
    Reply { taken: u64 },
}

/// The (client, tid) key of a client message.
fn client_key(client: u64, msg: &[u8]) -> u128 {
    let tid = AcmMsg::new_checked(msg).map_or(0, |m| m.tid());
    (u128::from(client) << 64) | u128::from(tid)
}

/// Remembers `key` (dropping entries older than 10 min when full: answers that never came).
fn remember<V: Copy>(clock: &Clock, p: &mut InFlight<V>, key: u128, at: u64, v: V) {
    if !p.insert(key, at, v) {
        let stale = (600e9 * clock.ticks_per_ns()) as u64;
        p.expire(clock.now().saturating_sub(stale));
        let _ = p.insert(key, at, v);
    }
}

impl Latencies {
    /// No bookkeeping: every hook does nothing.
    pub(super) fn off() -> Self {
        Latencies(None)
    }

    /// Latencies into `sink`, timed by `clock`; the tables hold `capacity` entries each,
    /// allocated here.
    pub(super) fn on(clock: Clock, capacity: usize, sink: LatencySink) -> Self {
        Latencies(Some(Book {
            clock,
            sink,
            misses: InFlight::new(capacity),
            sa: InFlight::new(capacity),
            lap: None,
            entering: None,
        }))
    }

    /// The clock now (ticks), when latencies are kept.
    pub(super) fn now(&self) -> Option<u64> {
        self.0.as_ref().map(|b| b.clock.now())
    }

    /// A reply (SA or ACM) taken now: its leg to the first answer it leads to starts. The
    /// time it was taken (clock ticks).
    pub(super) fn reply_taken(&mut self) -> Option<u64> {
        let b = self.0.as_mut()?;
        let taken = b.clock.now();
        b.lap = Some(Lap::Reply { taken });
        Some(taken)
    }

    /// Request `r` is about to be given to the node: a stamped resolve's latency is kept.
    pub(super) fn request_taken(&mut self, r: &Queued) {
        let (Some(b), Some(stamp), Kind::Resolve) = (self.0.as_mut(), r.stamp, r.head.kind) else {
            return;
        };
        let taken = b.clock.now();
        let t = Entering {
            key: client_key(r.head.client, &r.msg[..usize::from(r.len)]),
            stamp,
            ep: r.head.ep,
            taken,
        };
        b.entering = Some((t, false));
        b.lap = Some(Lap::Request {
            taken,
            ep: r.head.ep,
        });
    }

    /// The request of [`request_taken`](Self::request_taken) is with the node and its outputs
    /// are carried out: its queue wait is recorded, and it is remembered until its answer
    /// unless that is out already.
    pub(super) fn request_given(&mut self) {
        let Some(b) = self.0.as_mut() else {
            return;
        };
        let Some((t, answered)) = b.entering.take() else {
            return;
        };
        (b.sink)(
            t.ep,
            Latency::MissQueued,
            b.clock.ns(t.stamp.handed, t.taken),
        );
        if !answered {
            remember(
                &b.clock,
                &mut b.misses,
                t.key,
                t.stamp.at,
                (t.ep, t.stamp.class),
            );
        }
    }

    /// A MAD that is not an SA query went out: a request's leg to its first query ends now.
    pub(super) fn sent(&mut self) {
        if let Some(b) = self.0.as_mut() {
            b.query_sent(None);
        }
    }

    /// SA query `token` of endpoint `ep` went out at `at` (clock ticks): its round trip
    /// starts, and a request's leg to its first query ends.
    pub(super) fn query_out(&mut self, token: u64, ep: EpId, at: Option<u64>) {
        if let (Some(b), Some(at)) = (self.0.as_mut(), at) {
            remember(&b.clock, &mut b.sa, u128::from(token), at, ep);
            b.query_sent(Some(at));
        }
    }

    /// SA query `token` left the transport it was sent on (its carrier closed): its round
    /// trip starts again where it goes on ([`query_out`](Self::query_out)).
    pub(super) fn query_moved(&mut self, token: u64) {
        if let Some(b) = self.0.as_mut() {
            let _ = b.sa.remove(u128::from(token));
        }
    }

    /// Answer `a` (its message in `msg`) was handed to the core at `end` (clock ticks, from
    /// [`now`](Self::now)): the latency of its request ends, and the leg of the reply that led
    /// to it.
    pub(super) fn answered(&mut self, a: &Answer, msg: &MsgBuf, end: Option<u64>) {
        let (Some(b), Some(end)) = (self.0.as_mut(), end) else {
            return;
        };
        let key = client_key(a.client, msg.message(a));
        let entering = match &mut b.entering {
            Some((t, answered)) if !*answered && t.key == key => {
                *answered = true;
                Some((t.stamp.at, (t.ep, t.stamp.class)))
            }
            _ => None,
        };
        if let Some((at, (ep, class))) = entering.or_else(|| b.misses.remove(key)) {
            (b.sink)(ep, class.latency(), b.clock.ns(at, end));
        }
        if let Some(Lap::Reply { taken }) = b.lap {
            (b.sink)(a.ep, Latency::ReplyToAnswer, b.clock.ns(taken, end));
            b.lap = None;
        }
    }

    /// Query `token` completed (`replied`: a reply or a whole table), taken at `taken` (clock
    /// ticks) after the core's SA thread handed it over at `handed` (0: not handed over):
    /// its round trip, and the hand-over's wait, go to their histograms.
    pub(super) fn sa_done(&mut self, token: u64, replied: bool, taken: Option<u64>, handed: u64) {
        let (Some(b), Some(taken)) = (self.0.as_mut(), taken.filter(|_| replied)) else {
            return;
        };
        if let Some((at, ep)) = b.sa.remove(u128::from(token)) {
            (b.sink)(ep, Latency::SaRtt, b.clock.ns(at, taken));
            if handed != 0 {
                (b.sink)(ep, Latency::ReplyWait, b.clock.ns(handed, taken));
            }
        }
    }

    /// The outputs of the input a leg was started for are carried out: a leg they did not
    /// end is not timed.
    pub(super) fn drained(&mut self) {
        if let Some(b) = self.0.as_mut() {
            b.lap = None;
        }
    }

    /// After a panic: what the old resolver held and did not answer will never be answered.
    pub(super) fn forget(&mut self) {
        if let Some(b) = self.0.as_mut() {
            b.misses.clear();
            b.sa.clear();
            b.entering = None;
        }
    }

    /// How many answered-to-be requests are remembered (tests).
    #[cfg(test)]
    pub(super) fn misses_tracked(&self) -> usize {
        self.0.as_ref().map_or(0, |b| b.misses.len())
    }
}

impl Book {
    /// A query (SA or ACM) left at `at` (`None`: now; the clock is read only if a request's
    /// [`Lap`] ends here).
    fn query_sent(&mut self, at: Option<u64>) {
        if let Some(Lap::Request { taken, ep }) = self.lap {
            let at = at.unwrap_or_else(|| self.clock.now());
            (self.sink)(ep, Latency::MissToQuery, self.clock.ns(taken, at));
            self.lap = None;
        }
    }
}
