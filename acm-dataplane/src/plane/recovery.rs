//! Recovery after a panic of a round (the worker catches it): the resolver's state cannot be
//! trusted, so what it held is answered and a fresh one takes over with the same endpoints
//! (`recover`); if that panics too, the loop runs on without a resolver (`give_up`,
//! `poll_dead`), answering everything ENODATA, and the inbox refuses new requests.

use super::{CoreIo, Current, Plane, BURST};
use crate::worker::PollOutcome;
use acm_core_nostd::node::Node;
use acm_core_nostd::resolver::Millis;
use acm_core_nostd::wire::client::Status;
use std::sync::atomic::Ordering;

impl<I: CoreIo> Plane<I> {
    /// After a panic of [`Plane::recover`] itself: nothing of the loop's state is trusted.
    /// From now on it runs without a resolver (every request that still reaches it is
    /// answered ENODATA, and the inbox refuses new ones so the core's thread answers them at
    /// once); what the old resolver held is answered if that still works. Each step is
    /// guarded: a panic in one does not stop the next.
    pub(super) fn give_up(&mut self) {
        use std::panic::{catch_unwind, AssertUnwindSafe};
        self.stop_resolving();
        self.inbox.gave_up.fetch_add(1, Ordering::Relaxed);
        let now = self.last_now;
        self.answer_held(now);
        if self.current_is == Current::Taken {
            let _ = catch_unwind(AssertUnwindSafe(|| self.answer_current(Status::Enodata)));
        }
        let _ = catch_unwind(AssertUnwindSafe(|| {
            self.io.log(
                0,
                "ERROR - acmrs dataplane recovery failed: every request is answered ENODATA \
                 from now on (restart ibacm)",
            )
        }));
    }

    /// After a caught panic: the resolver's state cannot be trusted, so it is answered out
    /// (every request it holds gets ENODATA once, as at shutdown, if that still works; the
    /// request that was in hand when it panicked too, unless that one was answered) and
    /// replaced by a fresh one with the same endpoints, addresses and preloads. If no fresh
    /// one can be had, the loop goes on without one, answering everything ENODATA.
    pub(super) fn recover(&mut self, message: &str) {
        self.io.log(
            0,
            &format!("ERROR - acmrs dataplane panicked ({message}); restarting the resolver"),
        );
        let now = self.last_now;
        if !self.answer_held(now) {
            self.io.log(
                0,
                "ERROR - the resolver could not answer its requests after the panic",
            );
        }
        if self.current_is == Current::Taken {
            // Not answered by the shutdown above (drain_outputs frees it when its answer goes).
            self.answer_current(Status::Enodata);
        }
        // What the old resolver held and did not answer will never be answered.
        self.lat.forget();
        // The old resolver gives the cache's writer back for the fresh one: one owner at a
        // time, never a second writer. The SA channel's storage stays, emptied: the old
        // resolver's tokens mean nothing to the new one.
        let Some(node) = self.node.take() else {
            self.stop_resolving();
            return;
        };
        let sa_cfg = node.sa_config();
        let (old, mut sa) = node.into_parts();
        sa.clear();
        let writer = old.into_writer();
        let fresh = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (self.make_resolver)(writer)
        }))
        .ok()
        .flatten();
        let Some(fresh) = fresh else {
            self.io.log(
                0,
                "ERROR - no new resolver: every request is answered ENODATA from now on",
            );
            self.stop_resolving();
            return;
        };
        self.node = Some(Node::from_parts(fresh, sa, sa_cfg));
        self.inbox.restarts.fetch_add(1, Ordering::Relaxed);
        self.n().clear_cache();
        for (ep, mut rec) in self.eps.take_all() {
            self.open_in_resolver(ep, &mut rec, now);
            self.eps.put(ep, rec);
        }
        self.drain_outputs(now);
    }

    /// A round without a resolver: control messages (the shutdown, closes) and every request
    /// answered ENODATA, SA replies and received MADs dropped.
    pub(super) fn poll_dead(&mut self, now: Millis) -> PollOutcome {
        let mut did = false;
        for _ in 0..BURST {
            let Some(request) = self.next_input(now) else {
                break;
            };
            did = true;
            if request {
                self.answer_current(Status::Enodata);
            }
            if self.done {
                self.answer_queued();
                return PollOutcome::default();
            }
        }
        while self.inbox.take_reply_into(&mut self.reply) {
            did = true;
        }
        for e in self.eps.iter_mut() {
            if let Some(ud) = e.ud.as_mut() {
                did |= ud.poll(&mut |_, _| {}) > 0;
            }
        }
        PollOutcome {
            did_work: did,
            ..PollOutcome::default()
        }
    }

    /// Shuts the resolver down, answering every request it holds (ENODATA, as at shutdown),
    /// its outputs carried out; a panic on the way is caught. Whether it all went through.
    fn answer_held(&mut self, now: Millis) -> bool {
        if self.node.is_none() {
            return false;
        }
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.n().handle_shutdown(now);
            self.drain_outputs(now);
        }))
        .is_ok()
    }

    /// The loop goes on without a resolver: what reaches it is answered ENODATA
    /// (`poll_dead`), and the inbox refuses new requests so the core's thread answers them.
    fn stop_resolving(&mut self) {
        self.dead = true;
        self.inbox.stopped.store(true, Ordering::Release);
    }
}
