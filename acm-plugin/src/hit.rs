//! The bodies of `resolve()` and `query()` on the core's main thread: the **inline hit path**
//! and the hand-over of everything else to the dataplane.
//!
//! `resolve()` ([`resolve_impl`] → [`resolve_answer`]): the prefetch of a PATH request's cache
//! slots ([`start_lookup`]), `resolver::request::classify`, the answer's frame built in this
//! thread's buffer (`OUT`) while the load is in flight and one lock-free cache read
//! ([`answer_hit`]), the answer handed to the core ([`deliver`]) and what follows a hit
//! ([`hit_answered`]). A negative entry or an immediate failure is answered here too
//! ([`answer_inline`]); a miss is pushed into the dataplane's [`Inbox`] ([`hand_over`]),
//! and then, when the loop's lock is free (not in `busy` mode), the loop's round that takes
//! it runs on this thread ([`Waker::serve`]: its SA or ACM query leaves before `resolve()`
//! returns), else the dataplane thread is woken. `query()` ([`query_impl`]) is always handed
//! over.
//!
//! No lock, no allocation, no syscall of ours on a hit. Everything else (misses, the ACM
//! protocol, the SA, timers, every cache write) is done by the dataplane loop's rounds, one at
//! a time under its lock.
//!
//! [`Inbox`]: acm_dataplane::plane::Inbox
//! [`Waker::serve`]: acm_dataplane::worker::Waker::serve

use crate::ffi::AcmMsg;
use crate::instance::{LogReason, Writer};
use crate::lifecycle::AddrCtx;
use acm_core_nostd::cache::{HashedKey, Lookup, Place};
use acm_core_nostd::resolver::front::{self, Front};
use acm_core_nostd::resolver::request::{classify, respond, route_dest, Target};
use acm_core_nostd::resolver::{Counter, Kind, Request, RequestHead, Via};
use acm_core_nostd::wire::client::{
    build_resolve_frame, response_path_mut, AcmMsg as ClientMsg, Status,
};
use acm_dataplane::plane::HostCache;
use acm_dataplane::stats::{MissClass, MissStamp};
use core::ffi::c_int;
use std::sync::atomic::Ordering;

/// Answers on the core's thread (hit path and immediate failures).
pub(crate) fn answer_inline(
    ctx: &AddrCtx,
    via: Via,
    msg: &[u8],
    id: u64,
    status: Status,
    path: Option<&[u8; 64]>,
    answered: &mut bool,
) {
    let a = InlineAnswer {
        via,
        msg,
        id,
        status,
        path,
        hit_start: None,
    };
    answer_inline_timed(ctx, a, answered)
}

/// One answer given on the core's thread: the request it answers and what it says.
#[derive(Clone, Copy)]
struct InlineAnswer<'a> {
    via: Via,
    /// The request's bytes.
    msg: &'a [u8],
    /// The core's id of the request.
    id: u64,
    status: Status,
    path: Option<&'a [u8; 64]>,
    /// When the hit began (a clock reading): its latency up to the hand-off to the core is
    /// recorded. `None` for everything but a sampled hit.
    hit_start: Option<u64>,
}

/// [`answer_inline`]; with `a.hit_start`, the hit's latency up to the hand-off to the core is
/// recorded (the core's main thread is the hit histogram's only writer).
fn answer_inline_timed(ctx: &AddrCtx, a: InlineAnswer<'_>, answered: &mut bool) {
    // The answer is built in this thread's buffer: `respond` writes every byte of the length
    // it sets (header and 1–2 entries), so no 592-byte zeroing per answer; the bytes past it
    // are an earlier answer's (the core sends `hdr.length` bytes).
    OUT.with(|cell| {
        let mut fresh;
        let mut held = cell.try_borrow_mut();
        let out: &mut AcmMsg = match held.as_deref_mut() {
            Ok(o) => o,
            // Re-entered (a panic answer while the buffer is borrowed): a zeroed one.
            Err(_) => {
                fresh = AcmMsg::zeroed();
                &mut fresh
            }
        };
        answer_with(ctx, a, answered, out)
    })
}

thread_local! {
    /// The answer buffer of the thread that answers inline (the core's main thread).
    static OUT: core::cell::RefCell<AcmMsg> = const { core::cell::RefCell::new(AcmMsg::zeroed()) };
}

#[inline]
fn answer_with(ctx: &AddrCtx, a: InlineAnswer<'_>, answered: &mut bool, out: &mut AcmMsg) {
    respond(a.msg, a.via, a.status, a.path, out.as_bytes_mut());
    deliver(ctx, a.via, a.id, a.status, a.hit_start, answered, out)
}

/// Hands the answer built in `out` to the core; with `hit_start`, records the hit's latency
/// up to the hand-off.
#[inline(always)]
fn deliver(
    ctx: &AddrCtx,
    via: Via,
    id: u64,
    status: Status,
    hit_start: Option<u64>,
    answered: &mut bool,
    out: &mut AcmMsg,
) {
    // The span ends here; it is recorded once the client has its answer.
    let end = hit_start.map(|_| ctx.inst.clock.now());
    let _ = ctx.inst.api.respond(via, id, out);
    // Only now: a panic before this point (building the answer) leaves the request
    // unanswered, and the caller's guard answers it EINVAL; after it, never a second answer.
    *answered = true;
    // Counted after the hand-off, off the client's critical path (nothing reads the counters
    // inside this call).
    ctx.ep.count_status(Writer::Core, status);
    if let (Some(t0), Some(t1)) = (hit_start, end) {
        let n = u64::from(ctx.inst.opts.acmrs_hit_sample);
        ctx.ep.stats.hit.record_n(ctx.inst.clock.ns(t0, t1), n);
    }
}

/// The cache hit path of route request `msg` (the core's id `id`, classified as `target`)
/// whose slots' load was just started (`key`'s prefetch): the answer's frame is built in this
/// thread's buffer while the load is in flight, then the lookup; what the cache held goes to
/// the front decision ([`front::decide`], made here once for the request), and a hit gets its
/// path written into the frame and is answered: `Ok` with whether the entry wants a refresh
/// ([`hit_answered`] follows). `Err` for everything else: the decision and what the cache held
/// (a miss, a negative entry), or no decision when the lookup was not made (a closed
/// endpoint, no frame), which the caller then decides on.
#[inline(always)]
fn answer_hit(
    ctx: &AddrCtx,
    msg: &[u8],
    id: u64,
    target: &Target,
    key: &HashedKey,
    hit_start: Option<u64>,
    answered: &mut bool,
) -> Result<bool, (Option<Front>, Lookup)> {
    let (ep, inst) = (&ctx.ep, &ctx.inst);
    let refresh = OUT.with(|cell| {
        let Ok(mut out) = cell.try_borrow_mut() else {
            return Err((None, Lookup::Miss));
        };
        let frame = build_resolve_frame(&ClientMsg::new_unchecked(msg), out.as_bytes_mut());
        if frame.is_err() || ep.closed.load(Ordering::Acquire) {
            return Err((None, Lookup::Miss));
        }
        let Some(path) = response_path_mut(out.as_bytes_mut()) else {
            return Err((None, Lookup::Miss));
        };
        // The slot's record goes straight into the answer's path.
        let found = inst.cache.lookup_into(key, inst.now_ms(), path);
        // The endpoint was open just above.
        match front::decide(target, true, &found) {
            Front::Hit { refresh } => {
                deliver(
                    ctx,
                    Via::Resolve,
                    id,
                    Status::Success,
                    hit_start,
                    answered,
                    &mut out,
                );
                Ok(refresh)
            }
            other => Err((Some(other), found.with_record([0; 64]))),
        }
    })?;
    Ok(refresh)
}

/// What follows a cache hit once its answer is with the core: ROUTE_CACHE counted (the core's
/// counter is a locked add, kept off the client's critical path) and, for an entry near
/// expiry, `refresh`, a background refresh, handed to the dataplane (a full queue only loses
/// the refresh; the entry then expires and is resolved as a miss).
fn hit_answered(ctx: &AddrCtx, refresh: Option<Request<'_>>) {
    ctx.ep
        .count_global(Writer::Core, ctx.inst.api, Counter::RouteCache);
    if let Some(refresh) = refresh {
        let _ = hand_over(ctx, &refresh, None);
    }
}

/// Hands request `req` to the dataplane (a RESOLVE request with the front's classification
/// in its head, made with the endpoint's view at its `cache_ep`, so the dataplane does not
/// redo it; `stamp`: the start of a missed `resolve()`, whose latency the dataplane then records);
/// the status to answer it with at once (counted, logged) if it cannot take it: ENOMEM when
/// its queue is full, ENODATA when it has stopped (it gave up after a failure it could not
/// recover from, or its thread is gone), ETIMEDOUT while the watchdog finds it stuck
/// (`acmrs_stall_ms`).
fn hand_over(ctx: &AddrCtx, req: &Request<'_>, stamp: Option<MissStamp>) -> Result<(), Status> {
    let kind = req.head.kind;
    let inbox = &ctx.inst.inbox;
    let handed = inbox.hand_over(req, stamp);
    if handed {
        return Ok(());
    }
    let wants_answer = matches!(kind, Kind::Resolve | Kind::Query);
    if inbox.is_stalled() && !inbox.is_stopped() {
        if wants_answer {
            ctx.inst.log_limited(
                LogReason::Stalled,
                "ERROR - the acmrs dataplane is stuck, answering ETIMEDOUT",
            );
        }
        return Err(Status::Etimedout);
    }
    if inbox.is_stopped() {
        if wants_answer {
            ctx.inst.log_limited(
                LogReason::Stopped,
                "ERROR - the acmrs dataplane has stopped, answering ENODATA",
            );
        }
        return Err(Status::Enodata);
    }
    if wants_answer {
        ctx.inst.log_limited(
            LogReason::QueueFull,
            "ERROR - request queue full, answering ENOMEM",
        );
    }
    Err(Status::Enomem)
}

/// Starts the loads of a path lookup placed at `place` without waiting for them: the lines of
/// its preferred slots and its groups' tag lines, then, in a `large` cache, (the tags read)
/// the slots whose tag matches, where a key outside its preferred slots lives. Reading the
/// tags costs ~25 ns of work: hidden behind a DRAM miss, but on a cache-resident table (where
/// the second slot read is no DRAM trip either) pure cost (1k paths: p50 +25–30 ns).
#[inline(always)]
fn start_lookup(cache: &HostCache, large: bool, place: Place) {
    prefetch(cache.prefetch_hint(place));
    if large {
        prefetch(cache.prefetch_tagged(place));
    }
}

/// Starts loading the cache lines at `hint` without waiting for them.
#[inline(always)]
fn prefetch<const N: usize>(hint: [*const u8; N]) {
    #[cfg(target_arch = "x86_64")]
    for p in hint {
        // SAFETY: a prefetch is only a hint: it never faults, reads nothing into the program
        // and writes nothing, whatever the address (these are slots of our live cache).
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = hint;
}

pub(crate) fn resolve_impl(ctx: &AddrCtx, msg: &[u8], id: u64, answered: &mut bool) -> c_int {
    let r = resolve_answer(ctx, msg, id, answered);
    // Counted once the request is answered or handed over, off the client's critical path.
    ctx.ep.count(Writer::Core, Counter::Resolve);
    r
}

#[inline(always)]
fn resolve_answer(ctx: &AddrCtx, msg: &[u8], id: u64, answered: &mut bool) -> c_int {
    let ep = &ctx.ep;
    let inst = &ctx.inst;
    // Latency start (docs/stats.md): one TSC read, for one request in `acmrs_hit_sample` (a
    // hit is timed only then; a miss not sampled here starts its clock at the hand-over, a
    // few hundred ns later, against a miss of ~100 µs).
    let tick = ep.hit_tick.load(Ordering::Relaxed).wrapping_add(1);
    ep.hit_tick.store(tick, Ordering::Relaxed);
    let sample = inst.opts.acmrs_hit_sample;
    let t0 = (tick & (sample - 1) == 0).then(|| inst.clock.now());
    // The miss starts first: a path is placed in the cache by its destination, so a PATH
    // request's slots are requested before the request is checked and keyed, and their DRAM
    // miss overlaps all of that.
    let view = ep.view();
    let early = route_dest(&view, msg).map(|d| inst.cache.place(&d));
    if let Some(p) = early {
        start_lookup(&inst.cache, inst.large_cache, p);
    }
    // The request's classification, made here once; it goes with every request this call
    // hands over (a miss, a priming, a refresh), each built at its hand-over, with the
    // cache's writes when its lookup missed (`front_writes`: the resolver then does not look
    // again while the cache has had no write since).
    let target = &classify(&view, msg);
    let request = |client: u64, kind: Kind, front_writes: Option<u32>| Request {
        head: RequestHead {
            ep: ep.id,
            cache_ep: view.cache_ep,
            client,
            kind,
            target: Some(*target),
            front_writes,
        },
        msg,
    };
    // A route hit is answered from here; a route lookup's decision comes back with what the
    // cache held.
    let (decided, found, looked) = match target {
        Target::Route { key: Some(k), .. } => {
            let place = early.unwrap_or_else(|| {
                // A LID or GID entry: its destination is known only now.
                let p = inst.cache.place(&k.dest());
                start_lookup(&inst.cache, inst.large_cache, p);
                p
            });
            let h = inst.cache.hashed_at(k, place);
            match answer_hit(ctx, msg, id, target, &h, t0, answered) {
                Ok(refresh) => {
                    hit_answered(ctx, refresh.then(|| request(0, Kind::Refresh, None)));
                    return 0;
                }
                // Looked up (decided) or not (a closed endpoint, no frame).
                Err((decided, found)) => (decided, found, decided.is_some()),
            }
        }
        // A local address removed since the dataplane last caught up may still be aliased.
        Target::Address { .. } => {
            let stale = ep.removal_seq.load(Ordering::Acquire) > inst.inbox.controls_applied();
            (
                None,
                front::look(&inst.cache, target, inst.now_ms(), stale),
                !stale,
            )
        }
        // Nothing a cache key can hold (a malformed request, a route with no key).
        _ => (None, Lookup::Miss, false),
    };
    // Read after the lookup, and only for a request handed over (not on a hit's way): a
    // write the lookup did not see may be counted (one redundant query, never a wrong
    // answer).
    let front_writes = || looked.then(|| inst.cache.writes());
    let mut reply = |status: Status, path: Option<&[u8; 64]>| {
        // A path is answered only on a hit: its latency is recorded.
        let a = InlineAnswer {
            via: Via::Resolve,
            msg,
            id,
            status,
            path,
            hit_start: path.and(t0),
        };
        answer_inline_timed(ctx, a, answered);
        0
    };
    // Each request is decided once: here, unless the route lookup decided already.
    let decision = decided.unwrap_or_else(|| {
        let open = !ep.closed.load(Ordering::Acquire);
        front::decide(target, open, &found)
    });
    match decision {
        Front::Hit { refresh } => {
            // An address hit (a route hit was answered above).
            let Lookup::Hit { record, .. } = found else {
                return reply(Status::Enodata, None);
            };
            let r = reply(Status::Success, Some(&record));
            hit_answered(ctx, refresh.then(|| request(0, Kind::Refresh, None)));
            r
        }
        Front::Answer(status) => {
            if matches!(target, Target::Fail(Status::Einval)) {
                inst.log_limited(
                    LogReason::Malformed,
                    "ERROR - malformed resolve request rejected (EINVAL)",
                );
            }
            reply(status, None)
        }
        Front::Prime => {
            let r = reply(Status::Enodata, None);
            // Prime the cache; a full queue only loses the priming.
            let _ = hand_over(ctx, &request(id, Kind::Prime, front_writes()), None);
            r
        }
        Front::HandOver => {
            let handed = inst.clock.now();
            let stamp = MissStamp {
                at: t0.unwrap_or(handed),
                handed,
                class: match target {
                    Target::Address { .. } => MissClass::Address,
                    _ => MissClass::Route,
                },
            };
            match hand_over(
                ctx,
                &request(id, Kind::Resolve, front_writes()),
                Some(stamp),
            ) {
                Ok(()) => {
                    *answered = true;
                    0
                }
                Err(status) => reply(status, None),
            }
        }
    }
}

pub(crate) fn query_impl(ctx: &AddrCtx, msg: &[u8], id: u64, answered: &mut bool) -> c_int {
    let mut reply = |status: Status| {
        answer_inline(ctx, Via::Query, msg, id, status, None, answered);
        0
    };
    if ctx.ep.closed.load(Ordering::Acquire) {
        return reply(Status::Enodata);
    }
    // The dataplane validates it (EINVAL) and sends it to the SA.
    let req = Request::new(ctx.ep.id, ctx.ep.cache_ep(), id, Kind::Query, msg);
    match hand_over(ctx, &req, None) {
        Ok(()) => {
            *answered = true;
            0
        }
        Err(status) => reply(status),
    }
}
