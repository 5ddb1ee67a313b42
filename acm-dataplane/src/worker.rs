//! The provider's single worker thread.
//!
//! One worker per provider instance runs a [`Poller`] (the engine that owns all mutable
//! provider state) in a loop: poll, and when nothing happened spin for a short while, then
//! block until woken, until one of the poller's file descriptors (its CQ completion channels)
//! is readable, or until the poller's next deadline. Producers (the ibacm main thread, the
//! core's SA thread) push into the inbox's bounded queues and call [`Waker::wake`], which makes a
//! syscall (an `eventfd` write) only when the worker is actually blocked. With `spin` set to a
//! large value this is the busy-poll mode of a pinned dataplane core: it never blocks.
//!
//! # Rounds on the producer's thread
//!
//! The poller sits behind a lock that the worker holds only while it polls (never while it
//! spins or blocks). With [`WorkerConfig::inline`] set, a producer may call [`Waker::serve`]
//! after its push instead of [`Waker::wake`]: if the lock is free, the producer runs the round
//! itself, on its own thread, and the worker is not woken for it (a missed `resolve()` sends
//! its SA query from inside the call, as the stock provider does). If the worker holds the
//! lock, the producer wakes it as before: the round it is in, or the look it takes after
//! announcing its park, sees the push. After a round of its own the producer still wakes a
//! parked worker when only the worker can do what is next: work left beyond one round's
//! burst, a timer earlier than the worker's wake-up, a reply due soon (so the worker is awake
//! and polling when it comes, the wake-up overlapping the round trip), the poller finished
//! or given up.
//!
//! # Virtual time
//!
//! Every instant the worker reads (the `now` of its poll rounds, hence the poller's timers and
//! the deadlines it returns, the coarse clock the cache hits read, park lengths) is the real
//! one plus a per-worker offset that only grows: [`Waker::advance_clock`] moves it ahead and
//! returns once the worker has run a round that observed it, so a test can let routes expire
//! or enter their refresh window without sleeping (`advance_all_clocks` does it for every
//! worker of the process; the debug `libacmrs.so` exports it to its tests). The offset is 0
//! unless a test moves it; the worker reads it once per round from a line of its own.

use acm_core_nostd::park::ParkFlag;
use crossbeam_utils::CachePadded;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

mod hooks;
mod spin;

#[cfg(debug_assertions)]
pub use hooks::stall_all;
#[cfg(debug_assertions)]
use hooks::stall_here;
use hooks::WAKERS;
pub use hooks::{advance_all_clocks, Stuck};
use spin::{next, pause, Next, SpinBudget};

/// What one poll round did.
#[derive(Clone, Copy, Debug, Default)]
pub struct PollOutcome {
    /// Whether any work was done (keeps the worker spinning).
    pub did_work: bool,
    /// The next time the poller must run even without a wake-up (timers).
    pub next_deadline: Option<Instant>,
    /// When a reply the poller waits for is expected (an SA query out): the worker keeps
    /// polling until then rather than park, if it is no more than
    /// [`WorkerConfig::spin_for_reply`] away.
    pub reply_due: Option<Instant>,
}

impl PollOutcome {
    /// Whether a reply is due after `now` and no more than `within` away: worth polling for
    /// rather than parking ([`WorkerConfig::spin_for_reply`]).
    fn reply_due_within(&self, now: Instant, within: Duration) -> bool {
        self.reply_due
            .is_some_and(|due| due > now && due.duration_since(now) <= within)
    }
}

/// The engine the worker runs.
pub trait Poller: Send + 'static {
    /// Does all available work. Called in a loop on the worker thread.
    fn poll(&mut self, now: Instant) -> PollOutcome;
    /// Whether the poller has finished its shutdown and the thread may exit.
    fn finished(&self) -> bool;
    /// Called on the worker thread after [`Poller::poll`] panicked (the panic was caught; the
    /// worker keeps running). `message` is the panic's text. The poller must bring its state
    /// back to a consistent one (e.g. answer everything it holds). The default does nothing.
    /// If this panics too, the worker calls [`Poller::give_up`].
    fn recover(&mut self, message: &str) {
        let _ = message;
    }
    /// Called on the worker thread when [`Poller::recover`] panicked: the poller's state
    /// cannot be trusted any more. It must stop taking work (answer whatever reaches it with
    /// an error from now on) and keep polling in that mode; the worker keeps calling
    /// [`Poller::poll`]. If this panics too, the worker thread exits, and [`Waker::exited`]
    /// says so. The default does nothing.
    fn give_up(&mut self) {}
    /// Called before the worker blocks: arm whatever event sources the poller has (e.g.
    /// `ibv_req_notify_cq`) and append their file descriptors to `fds`. The worker then polls
    /// once more (an event that raced with the arming is not lost) before blocking in
    /// `poll(2)` on the waker and these descriptors. The default has none.
    fn prepare_block(&mut self, fds: &mut Vec<RawFd>) {
        let _ = fds;
    }
    /// Called after a block ended (woken, readable descriptor or timeout): consume the events
    /// of the descriptors armed in [`Poller::prepare_block`] (non-blocking). Default: nothing.
    fn unblocked(&mut self) {}
    /// Whether work is queued for the poller that its last round left (more than one
    /// round's burst): a producer that ran a round on its own thread then wakes the worker.
    /// Default: none.
    fn waiting(&self) -> bool {
        false
    }
}

/// The text of a caught panic payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(non-string panic payload)"
    }
}

/// One poll round with panics caught: a panic becomes [`Poller::recover`] and a round that did
/// work; a panic of `recover` becomes [`Poller::give_up`]. `None` when `give_up` panicked as
/// well: the worker exits.
fn poll_guarded<P: Poller>(poller: &mut P, now: Instant) -> Option<PollOutcome> {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    match catch_unwind(AssertUnwindSafe(|| poller.poll(now))) {
        Ok(out) => Some(out),
        Err(payload) => {
            let msg = panic_message(&*payload);
            if catch_unwind(AssertUnwindSafe(|| poller.recover(msg))).is_err() {
                catch_unwind(AssertUnwindSafe(|| poller.give_up())).ok()?;
            }
            Some(PollOutcome {
                did_work: true,
                ..PollOutcome::default()
            })
        }
    }
}

/// Worker settings.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Thread name.
    pub name: String,
    /// CPU to pin to (`acmrs_cpu`), if any.
    pub cpu: Option<usize>,
    /// How long to keep polling after the last work before parking (at least; see
    /// `spin_learned`).
    pub spin: Duration,
    /// While work has been coming at intervals shorter than this (a smoothed mean of the idle
    /// gaps before the worker's rounds with work), keep polling after work for twice that
    /// interval, up to this, rather than `spin` only: the next piece of work (a miss's reply
    /// while misses follow one another) then finds the worker polling, not parked behind a
    /// thread wake-up, nor its CPU halted (a halted virtual CPU is the slowest wake-up of
    /// all). Work further apart than this spins `spin` only. 0: off.
    pub spin_learned: Duration,
    /// How far ahead an expected reply ([`PollOutcome::reply_due`]) may be for the worker to
    /// keep polling for it instead of parking (0: never; the SA's round trip is tens of µs,
    /// a thread wake-up several µs each way).
    pub spin_for_reply: Duration,
    /// Longest park; bounds the staleness of the coarse clock.
    pub max_park: Duration,
    /// While spinning (after work, or for a reply due), give the CPU to any other runnable
    /// thread between polls (`sched_yield`) instead of a CPU pause: on a host without a spare
    /// core the threads that produce the reply (the SA on the same host, the core's thread)
    /// run meanwhile, and the worker still never pays a park and a wake-up; with a spare core
    /// it returns at once. Off for a worker that owns its core (`busy`, pinned).
    pub yield_spin: bool,
    /// Producers run a round themselves when the poller is free ([`Waker::serve`]; see the
    /// module docs), so a request or reply costs no thread wake-up. Off for a worker that
    /// owns its core (`busy`): it polls all the time, a hand-off to it is a cache-line
    /// transfer, and a producer's round would only take the lock from it.
    pub inline: bool,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            name: "acmrs-worker".into(),
            cpu: None,
            spin: Duration::from_micros(50),
            spin_learned: Duration::ZERO,
            spin_for_reply: Duration::from_millis(1),
            max_park: Duration::from_millis(100),
            yield_spin: true,
            inline: true,
        }
    }
}

struct Shared {
    /// The park handshake with the producers (`acm_core_nostd::park`: a SeqCst fence on each
    /// side, so a push that races the park is never missed).
    parked: ParkFlag,
    /// The worker thread has exited (its poller finished, or gave up and failed at that too).
    exited: AtomicBool,
    /// The `eventfd` a blocked worker waits on (with the poller's descriptors); -1 if none
    /// could be made (then the worker parks its thread, and only wakes and deadlines end it).
    event: RawFd,
    thread: std::sync::OnceLock<Thread>,
    /// Milliseconds since `epoch`, refreshed by the worker every round: stored only when
    /// it changes, on a line of its own, so the `resolve()` hits that read it on another
    /// core miss on it at most once a millisecond (not after every poll round).
    coarse_ms: CachePadded<AtomicU64>,
    epoch: Instant,
    /// Virtual time (see the module docs): milliseconds added to every instant the worker
    /// reads. Only grows (`fetch_add`); `SeqCst` with `spawned`, so an advance that finds no
    /// thread spawned yet is seen by its first round.
    skew_ms: AtomicU64,
    /// The `skew_ms` of the last round the worker ran, stored (`Release`) after that round's
    /// coarse clock: a reader that sees it sees that clock too.
    seen_skew_ms: AtomicU64,
    /// [`Worker::spawn`] was called with this waker (and the thread could be created).
    spawned: AtomicBool,
    /// A round on the caller's thread, when the poller is free ([`WorkerConfig::inline`]):
    /// `false` if it was not (the caller then wakes the worker).
    round: std::sync::OnceLock<Box<InlineRound>>,
    /// When the parked worker will wake by itself (ns since `epoch`), stored under the
    /// poller's lock before it blocks: a producer's round that sets an earlier timer wakes it.
    park_until: AtomicU64,
    /// A producer's round gave up (the poller's `give_up` panicked): the worker exits.
    abandoned: AtomicBool,
}

/// A round run by a producer (see [`Shared::round`]).
type InlineRound = dyn Fn(&Shared) -> bool + Send + Sync;

/// The poller, shared by the worker and the producers' rounds; `None` once the worker exited.
type Cell<P> = Mutex<Option<P>>;

fn lock_cell<P>(cell: &Cell<P>) -> std::sync::MutexGuard<'_, Option<P>> {
    cell.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The poller's lock if it is free now; `None` while another thread runs a round.
fn try_lock_cell<P>(cell: &Cell<P>) -> Option<std::sync::MutexGuard<'_, Option<P>>> {
    match cell.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Wakes the worker; cheap when the worker is spinning.
#[derive(Clone)]
pub struct Waker(Arc<Shared>);

impl Waker {
    /// Makes sure the worker runs a poll round soon.
    pub fn wake(&self) {
        if self.0.parked.must_wake() {
            self.0.kick();
        }
    }

    /// Has what the caller just pushed taken: by a round on the caller's thread if the poller
    /// is free and [`WorkerConfig::inline`] is set, else by the worker ([`Waker::wake`]).
    /// See the module docs.
    pub fn serve(&self) {
        if let Some(round) = self.0.round.get() {
            if round(&self.0) {
                return;
            }
        }
        self.wake();
    }

    /// The coarse clock in milliseconds (no syscall; at most `max_park` stale). Once the
    /// worker thread has exited it reads `u64::MAX`: nothing the cache holds is fresh then
    /// (no one advances the clock any more, so no entry could ever be seen expiring).
    pub fn coarse_ms(&self) -> u64 {
        self.0.coarse_ms.load(Ordering::Relaxed)
    }

    /// Whether the worker thread has exited: nothing handed to it will be answered.
    pub fn exited(&self) -> bool {
        self.0.exited.load(Ordering::Acquire)
    }

    /// The instant the coarse clock counts from.
    pub fn epoch(&self) -> Instant {
        self.0.epoch
    }

    /// Converts an instant to the coarse clock's scale.
    pub fn to_coarse_ms(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.0.epoch).as_millis() as u64
    }

    /// Virtual time: moves this worker's clock `d` (whole milliseconds) ahead of real time for
    /// good, wakes the worker and waits until it has run a round that observed the move: from
    /// then on its coarse clock (what cache hits compare expiries against), the `now` it polls
    /// with and its timers (SA retries and deadlines, refresh, expiry) include it, and every
    /// request handed over after this returns is taken in at the new time. `true` then, or at
    /// once when the thread has exited; `false` if it did not observe it within `within`.
    pub fn advance_clock(&self, d: Duration, within: Duration) -> bool {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let target = self
            .0
            .skew_ms
            .fetch_add(ms, Ordering::SeqCst)
            .saturating_add(ms);
        self.0.wait_observed(target, within)
    }

    /// How far virtual time is ahead of real time for this worker.
    pub fn clock_skew(&self) -> Duration {
        Duration::from_millis(self.0.skew_ms.load(Ordering::SeqCst))
    }
}

impl Shared {
    /// The clock of a round about to run: real time plus the virtual-time offset; the coarse
    /// clock and the offset seen are published on the way.
    fn tick(&self) -> Instant {
        let skew = self.skew_ms.load(Ordering::SeqCst);
        let real = Instant::now();
        let now = match skew {
            0 => real,
            _ => real
                .checked_add(Duration::from_millis(skew))
                .unwrap_or(real),
        };
        let ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        if self.coarse_ms.load(Ordering::Relaxed) != ms {
            self.coarse_ms.store(ms, Ordering::Relaxed);
        }
        if self.seen_skew_ms.load(Ordering::Relaxed) != skew {
            self.seen_skew_ms.store(skew, Ordering::Release);
        }
        now
    }

    /// `t` in ns since the epoch (what `park_until` holds).
    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A round on the calling (producer's) thread if the poller is free: `false` if the
    /// worker holds it or is gone. Wakes a parked worker for what only it can do next (see
    /// the module docs).
    fn round_here<P: Poller>(&self, cell: &Cell<P>, spin_for_reply: Duration) -> bool {
        let Some(mut g) = try_lock_cell(cell) else {
            return false;
        };
        let Some(poller) = g.as_mut() else {
            return false;
        };
        if self.abandoned.load(Ordering::Acquire) {
            return false;
        }
        let now = self.tick();
        let kick = match poll_guarded(poller, now) {
            None => {
                self.abandoned.store(true, Ordering::Release);
                true
            }
            Some(_) if poller.finished() => true,
            Some(out) => {
                self.parked.must_wake()
                    && (poller.waiting()
                        || out
                            .next_deadline
                            .is_some_and(|d| self.ns(d) < self.park_until.load(Ordering::Relaxed))
                        || out.reply_due_within(now, spin_for_reply))
            }
        };
        drop(g);
        if kick {
            self.kick();
        }
        true
    }

    /// Kicks the worker until it has run a round with a virtual-time offset of at least
    /// `target` (or its thread has exited; a worker not spawned yet will use it in its first
    /// round). `false` after `within`.
    fn wait_observed(&self, target: u64, within: Duration) -> bool {
        let t0 = Instant::now();
        loop {
            if self.seen_skew_ms.load(Ordering::Acquire) >= target
                || self.exited.load(Ordering::Acquire)
                || !self.spawned.load(Ordering::SeqCst)
            {
                return true;
            }
            if t0.elapsed() >= within {
                return false;
            }
            self.kick();
            thread::sleep(Duration::from_micros(100));
        }
    }

    fn kick(&self) {
        if self.event >= 0 {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live local to our own eventfd (open until Drop).
            let _ = unsafe { libc::write(self.event, (&one as *const u64).cast(), 8) };
        } else if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// Blocks for at most `d` on the eventfd and `fds`; clears the eventfd.
    fn block(&self, d: Duration, fds: &[RawFd]) {
        if self.event < 0 {
            thread::park_timeout(d);
            return;
        }
        let mut set: Vec<libc::pollfd> = Vec::with_capacity(fds.len() + 1);
        set.push(libc::pollfd {
            fd: self.event,
            events: libc::POLLIN,
            revents: 0,
        });
        set.extend(fds.iter().map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }));
        let ms = d.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `set` is a live array of `set.len()` pollfd structs.
        let _ = unsafe { libc::poll(set.as_mut_ptr(), set.len() as libc::nfds_t, ms) };
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live local from our non-blocking eventfd.
        let _ = unsafe { libc::read(self.event, (&mut v as *mut u64).cast(), 8) };
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.event >= 0 {
            // SAFETY: our own descriptor, closed once (the last Waker is gone).
            unsafe { libc::close(self.event) };
        }
    }
}

/// A running worker. Dropping it does not stop the thread: call [`Worker::join`] after telling
/// the poller to finish.
pub struct Worker {
    handle: Option<JoinHandle<()>>,
    waker: Waker,
}

impl Worker {
    /// Whether `cpu` is one this process may run on (what pinning to it needs).
    pub fn cpu_available(cpu: usize) -> bool {
        core_affinity::get_core_ids().is_some_and(|ids| ids.iter().any(|c| c.id == cpu))
    }

    /// A waker/clock that exists before the thread does (so the poller can be built with it).
    pub fn new_waker() -> Waker {
        let epoch = Instant::now();
        // SAFETY: plain syscall with constant flags; the result is checked.
        let event = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        let shared = Arc::new(Shared {
            parked: ParkFlag::new(),
            exited: AtomicBool::new(false),
            event,
            thread: std::sync::OnceLock::new(),
            coarse_ms: CachePadded::new(AtomicU64::new(1)),
            epoch: epoch - Duration::from_millis(1),
            skew_ms: AtomicU64::new(0),
            seen_skew_ms: AtomicU64::new(0),
            spawned: AtomicBool::new(false),
            round: std::sync::OnceLock::new(),
            park_until: AtomicU64::new(0),
            abandoned: AtomicBool::new(false),
        });
        let mut all = WAKERS.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&shared));
        drop(all);
        Waker(shared)
    }

    /// Starts the worker thread running `poller`.
    pub fn spawn<P: Poller>(
        config: WorkerConfig,
        waker: Waker,
        poller: P,
    ) -> std::io::Result<Worker> {
        let shared = waker.0.clone();
        let cell: Arc<Cell<P>> = Arc::new(Mutex::new(Some(poller)));
        let mine = cell.clone();
        let (inline, spin_for_reply) = (config.inline, config.spin_for_reply);
        waker.0.spawned.store(true, Ordering::SeqCst);
        let handle = thread::Builder::new()
            .name(config.name.clone())
            .spawn(move || run(&config, &shared, &mine));
        let handle = handle.inspect_err(|_| waker.0.spawned.store(false, Ordering::SeqCst))?;
        if inline {
            let round = move |s: &Shared| s.round_here(&cell, spin_for_reply);
            let _ = waker.0.round.set(Box::new(round));
        }
        Ok(Worker {
            handle: Some(handle),
            waker,
        })
    }

    /// The waker of this worker.
    pub fn waker(&self) -> &Waker {
        &self.waker
    }

    /// Waits for the thread to exit (after the poller reported `finished`).
    pub fn join(mut self) -> thread::Result<()> {
        self.waker.wake();
        match self.handle.take() {
            Some(h) => {
                // Keep waking in case the poller parks between our wake and its finish check.
                while !h.is_finished() {
                    self.waker.0.kick();
                    thread::sleep(Duration::from_millis(1));
                }
                h.join()
            }
            None => Ok(()),
        }
    }
}

/// The worker thread: rounds under the poller's lock, spins and parks outside it.
fn run<P: Poller>(config: &WorkerConfig, shared: &Arc<Shared>, cell: &Cell<P>) {
    let _ = shared.thread.set(thread::current());
    // However the loop ends (finished, gave up, or a panic of the loop itself): the clock
    // reads "everything expired", producers learn the thread is gone, and the poller is
    // dropped here (no producer's round runs it any more).
    struct Exit<'a, P>(&'a Shared, &'a Cell<P>);
    impl<P> Drop for Exit<'_, P> {
        fn drop(&mut self) {
            self.0.coarse_ms.store(u64::MAX, Ordering::Relaxed);
            self.0.exited.store(true, Ordering::Release);
            let poller = lock_cell(self.1).take();
            drop(poller);
        }
    }
    let _exit = Exit(shared, cell);
    if let Some(cpu) = config.cpu {
        let _pinned = core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
    }
    let mut last_work = shared.tick();
    let mut budget = SpinBudget::new(config);
    // Whether the last round did no work (the next one with work ends an idle gap).
    let mut idle = false;
    let mut fds: Vec<RawFd> = Vec::new();
    // Since when a producer's round has held the lock while we wanted it.
    let mut held_since: Option<Instant> = None;
    loop {
        // The stall test hooks: stuck between rounds, or inside one with the lock held.
        #[cfg(debug_assertions)]
        stall_here(false);
        // A producer running a round takes what is queued, and wakes us if only we can do
        // what follows: wait by spinning, not on the lock (a futex wait would make its unlock
        // a wake-up syscall inside `resolve()`, and put us to sleep just before a reply we
        // spin for). For `spin` at most: a round that takes longer (a client that does not
        // read its socket blocks the answer) is waited for on the lock.
        let mut g = match try_lock_cell(cell) {
            Some(g) => g,
            None if held_since.get_or_insert_with(Instant::now).elapsed() < config.spin => {
                pause(config.yield_spin);
                continue;
            }
            None => lock_cell(cell),
        };
        held_since = None;
        let Some(poller) = g.as_mut() else {
            return;
        };
        #[cfg(debug_assertions)]
        stall_here(true);
        if shared.abandoned.load(Ordering::Acquire) {
            return;
        }
        let now = shared.tick();
        let Some(out) = poll_guarded(poller, now) else {
            return;
        };
        if poller.finished() {
            return;
        }
        drop(g);
        if out.did_work {
            if idle {
                budget.work_after(now.saturating_duration_since(last_work));
                idle = false;
            }
            last_work = now;
            continue;
        }
        idle = true;
        let spin = budget.after_work();
        if let Next::Spin = next(config, &out, now, last_work, spin) {
            pause(config.yield_spin);
            continue;
        }
        // A producer's round now: look again rather than park behind it.
        let Some(mut g) = try_lock_cell(cell) else {
            continue;
        };
        let Some(poller) = g.as_mut() else {
            return;
        };
        fds.clear();
        poller.prepare_block(&mut fds);
        shared.parked.announce();
        // Producers push, then check `parked`: look once more after announcing the park (and
        // arming the poller's event sources) so a push or completion that raced with the
        // announcement is not missed. A producer's round since the last look may have set a
        // timer or sent a query: the park is decided by this look's outcome.
        let now = shared.tick();
        let Some(again) = poll_guarded(poller, now) else {
            shared.parked.clear();
            return;
        };
        if poller.finished() {
            shared.parked.clear();
            return;
        }
        if again.did_work {
            shared.parked.clear();
            budget.work_after(now.saturating_duration_since(last_work));
            idle = false;
            last_work = now;
            continue;
        }
        let park_for = match next(config, &again, now, last_work, spin) {
            Next::Spin => {
                shared.parked.clear();
                drop(g);
                pause(config.yield_spin);
                continue;
            }
            Next::Park(d) => d,
        };
        // Under the lock: a producer's round after this look sees when we wake.
        let until = shared.ns(now).saturating_add(park_for.as_nanos() as u64);
        shared.park_until.store(until, Ordering::Relaxed);
        drop(g);
        if !park_for.is_zero() {
            shared.block(park_for, &fds);
        }
        shared.parked.clear();
        if let Some(poller) = lock_cell(cell).as_mut() {
            poller.unblocked();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Counter {
        inbox: Arc<AtomicUsize>,
        seen: Arc<AtomicUsize>,
        stop: Arc<AtomicBool>,
        done: bool,
    }

    impl Poller for Counter {
        fn poll(&mut self, _now: Instant) -> PollOutcome {
            let n = self.inbox.swap(0, Ordering::AcqRel);
            self.seen.fetch_add(n, Ordering::AcqRel);
            if self.stop.load(Ordering::Acquire) {
                self.done = true;
            }
            PollOutcome {
                did_work: n > 0,
                ..PollOutcome::default()
            }
        }
        fn finished(&self) -> bool {
            self.done
        }
    }

    struct Panicky {
        rounds: Arc<AtomicUsize>,
        recovered: Arc<std::sync::Mutex<Vec<String>>>,
        done: bool,
    }

    impl Poller for Panicky {
        fn poll(&mut self, _now: Instant) -> PollOutcome {
            let n = self.rounds.fetch_add(1, Ordering::AcqRel);
            if n == 2 {
                panic!("injected panic in round {n}");
            }
            if n >= 5 {
                self.done = true;
            }
            PollOutcome {
                did_work: true,
                ..PollOutcome::default()
            }
        }
        fn finished(&self) -> bool {
            self.done
        }
        fn recover(&mut self, message: &str) {
            self.recovered.lock().unwrap().push(message.to_string());
        }
    }

    #[test]
    fn a_panic_in_poll_is_recovered_and_the_worker_keeps_running() {
        let rounds = Arc::new(AtomicUsize::new(0));
        let recovered = Arc::new(std::sync::Mutex::new(Vec::new()));
        let w = Worker::spawn(
            WorkerConfig::default(),
            Worker::new_waker(),
            Panicky {
                rounds: rounds.clone(),
                recovered: recovered.clone(),
                done: false,
            },
        )
        .unwrap();
        w.join()
            .expect("the worker thread must not die of the panic");
        assert!(
            rounds.load(Ordering::Acquire) >= 6,
            "kept polling after the panic"
        );
        assert_eq!(
            *recovered.lock().unwrap(),
            vec!["injected panic in round 2".to_string()]
        );
    }

    /// Polls with a timer one hour after its first round; counts its rounds and those that saw
    /// the timer due.
    struct HourTimer {
        due: Option<Instant>,
        rounds: Arc<AtomicUsize>,
        fired: Arc<AtomicUsize>,
        stop: Arc<AtomicBool>,
        done: bool,
    }

    impl Poller for HourTimer {
        fn poll(&mut self, now: Instant) -> PollOutcome {
            let due = *self.due.get_or_insert(now + Duration::from_secs(3600));
            self.rounds.fetch_add(1, Ordering::AcqRel);
            if now >= due {
                self.fired.fetch_add(1, Ordering::AcqRel);
            }
            self.done = self.stop.load(Ordering::Acquire);
            PollOutcome {
                did_work: false,
                next_deadline: Some(due),
                ..PollOutcome::default()
            }
        }
        fn finished(&self) -> bool {
            self.done
        }
    }

    /// Says a reply is due `ahead` after its first round; records when the worker first
    /// prepares to block, and finishes then.
    struct ReplySoon {
        due: Option<Instant>,
        ahead: Duration,
        seen: Arc<Mutex<(Option<Instant>, Option<Instant>)>>,
        done: bool,
    }

    impl Poller for ReplySoon {
        fn poll(&mut self, now: Instant) -> PollOutcome {
            let due = *self.due.get_or_insert(now + self.ahead);
            let mut seen = self.seen.lock().unwrap();
            seen.0 = Some(due);
            self.done = seen.1.is_some();
            PollOutcome {
                reply_due: Some(due),
                ..PollOutcome::default()
            }
        }
        fn finished(&self) -> bool {
            self.done
        }
        fn prepare_block(&mut self, _fds: &mut Vec<RawFd>) {
            self.seen.lock().unwrap().1.get_or_insert(Instant::now());
        }
    }

    /// When the worker first prepared to block, and when the reply was due, for a reply due
    /// `ahead` and a worker that polls on for replies due within `spin_for_reply`.
    fn block_vs_due(ahead: Duration, spin_for_reply: Duration) -> (Instant, Instant) {
        let seen = Arc::new(Mutex::new((None, None)));
        let cfg = WorkerConfig {
            spin: Duration::ZERO,
            spin_for_reply,
            max_park: Duration::from_millis(5),
            ..WorkerConfig::default()
        };
        let p = ReplySoon {
            due: None,
            ahead,
            seen: seen.clone(),
            done: false,
        };
        Worker::spawn(cfg, Worker::new_waker(), p)
            .unwrap()
            .join()
            .unwrap();
        let (due, blocked) = *seen.lock().unwrap();
        (blocked.unwrap(), due.unwrap())
    }

    /// Work that keeps coming at short intervals is spun for (twice the interval, up to the
    /// bound); work far apart, or the learning off, gets the fixed spin. One long pause does
    /// not undo what was learned; two do.
    #[test]
    fn the_spin_after_work_follows_the_gaps_before_work() {
        let us = Duration::from_micros;
        let cfg = WorkerConfig {
            spin: us(50),
            spin_learned: us(500),
            ..WorkerConfig::default()
        };
        let mut b = SpinBudget::new(&cfg);
        assert_eq!(b.after_work(), us(50), "nothing learned yet");
        for _ in 0..20 {
            b.work_after(us(200));
        }
        assert_eq!(b.after_work(), us(400));
        b.work_after(us(20_000));
        assert!(b.after_work() > us(50), "one pause: {:?}", b.after_work());
        b.work_after(us(20_000));
        assert_eq!(b.after_work(), us(50), "two pauses: far apart now");
        for _ in 0..30 {
            b.work_after(us(10));
        }
        assert_eq!(b.after_work(), us(50), "never below the fixed spin");
        for _ in 0..30 {
            b.work_after(us(400));
        }
        assert_eq!(b.after_work(), us(500), "never above the bound");
        // Off: the fixed spin whatever comes.
        let mut off = SpinBudget::new(&WorkerConfig {
            spin_learned: Duration::ZERO,
            ..cfg.clone()
        });
        off.work_after(us(100));
        assert_eq!(off.after_work(), us(50));
        // The decision: spun while within the learned spin, parked after it.
        let t0 = Instant::now();
        let idle = PollOutcome::default();
        let spin = us(400);
        assert!(matches!(
            next(&cfg, &idle, t0 + us(300), t0, spin),
            Next::Spin
        ));
        assert!(matches!(
            next(&cfg, &idle, t0 + us(450), t0, spin),
            Next::Park(_)
        ));
    }

    #[test]
    fn the_worker_polls_on_for_a_reply_due_soon_and_parks_for_one_due_later() {
        let ms = Duration::from_millis;
        // Due within the bound: no park before it is due.
        let (blocked, due) = block_vs_due(ms(150), ms(1000));
        assert!(
            blocked >= due,
            "parked {:?} before the reply was due",
            due - blocked
        );
        // Due beyond the bound, or no bound: parks at once (150 ms early; only a stall of the
        // test thread that long could hide it).
        for spin_for_reply in [ms(50), Duration::ZERO] {
            let (blocked, due) = block_vs_due(ms(150), spin_for_reply);
            assert!(
                blocked < due,
                "spun for a reply {spin_for_reply:?} could not cover"
            );
        }
    }

    #[test]
    fn advancing_the_clock_moves_the_coarse_clock_and_the_pollers_timers() {
        let fired = Arc::new(AtomicUsize::new(0));
        let rounds = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let waker = Worker::new_waker();
        let cfg = WorkerConfig {
            // Only a wake-up or the timer can end a park: nothing happens by real time.
            max_park: Duration::from_secs(3600),
            ..WorkerConfig::default()
        };
        let timer = HourTimer {
            due: None,
            rounds: rounds.clone(),
            fired: fired.clone(),
            stop: stop.clone(),
            done: false,
        };
        let w = Worker::spawn(cfg, waker.clone(), timer).unwrap();
        let t0 = Instant::now();
        while rounds.load(Ordering::Acquire) == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the worker never polled"
            );
            thread::yield_now();
        }
        assert!(waker.coarse_ms() < 3_600_000);
        assert_eq!(fired.load(Ordering::Acquire), 0, "not due in real time");
        // An hour of virtual time: once advance_clock returns, the coarse clock shows it
        // (a barrier, not a sleep) and the worker polls past the timer's deadline.
        assert!(waker.advance_clock(Duration::from_secs(3600), Duration::from_secs(10)));
        assert_eq!(waker.clock_skew(), Duration::from_secs(3600));
        assert!(waker.coarse_ms() >= 3_600_000, "{}", waker.coarse_ms());
        let t0 = Instant::now();
        while fired.load(Ordering::Acquire) == 0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "timer never fired");
            thread::yield_now();
        }
        // (advance_all_clocks, which moves every worker of the process, is exercised by the
        // plugin's tests: here it would move the workers of the tests running beside this one.)
        stop.store(true, Ordering::Release);
        w.join().unwrap();
        // A worker that has exited does not hold an advance up.
        assert!(waker.advance_clock(Duration::from_secs(1), Duration::ZERO));
    }

    #[test]
    fn a_cpu_is_available_only_if_the_process_may_run_on_it() {
        let ids = core_affinity::get_core_ids().unwrap_or_default();
        assert!(ids.iter().all(|c| Worker::cpu_available(c.id)));
        assert!(!Worker::cpu_available(1 << 20));
    }

    /// What a [`Where`] poller shares with its test.
    #[derive(Clone, Default)]
    struct Probe {
        /// Work pushed, taken by the next round.
        queued: Arc<AtomicUsize>,
        /// The thread of every round.
        rounds: Arc<Mutex<Vec<thread::ThreadId>>>,
        /// The next round says a timer is due now.
        timer_now: Arc<AtomicBool>,
        /// The poller says work is left after its round.
        leave: Arc<AtomicBool>,
        stop: Arc<AtomicBool>,
        dropped: Arc<AtomicBool>,
    }

    impl Probe {
        fn rounds_on(&self, t: thread::ThreadId) -> usize {
            self.rounds
                .lock()
                .unwrap()
                .iter()
                .filter(|&&r| r == t)
                .count()
        }
        fn rounds_elsewhere(&self, t: thread::ThreadId) -> usize {
            self.rounds
                .lock()
                .unwrap()
                .iter()
                .filter(|&&r| r != t)
                .count()
        }
    }

    struct Where {
        p: Probe,
        done: bool,
    }

    impl Poller for Where {
        fn poll(&mut self, now: Instant) -> PollOutcome {
            let n = self.p.queued.swap(0, Ordering::AcqRel);
            self.p.rounds.lock().unwrap().push(thread::current().id());
            self.done = self.p.stop.load(Ordering::Acquire);
            let timer = self.p.timer_now.swap(false, Ordering::AcqRel);
            PollOutcome {
                did_work: n > 0,
                next_deadline: timer.then_some(now),
                ..PollOutcome::default()
            }
        }
        fn finished(&self) -> bool {
            self.done
        }
        fn waiting(&self) -> bool {
            self.p.leave.swap(false, Ordering::AcqRel)
        }
    }

    impl Drop for Where {
        fn drop(&mut self) {
            self.p.dropped.store(true, Ordering::Release);
        }
    }

    /// A worker around a [`Where`] that parks for an hour unless woken, once parked.
    fn parked_worker(inline: bool) -> (Worker, Probe) {
        let probe = Probe::default();
        let cfg = WorkerConfig {
            spin: Duration::ZERO,
            max_park: Duration::from_secs(3600),
            inline,
            ..WorkerConfig::default()
        };
        let p = Where {
            p: probe.clone(),
            done: false,
        };
        let w = Worker::spawn(cfg, Worker::new_waker(), p).unwrap();
        wait_for(|| w.waker().0.parked.must_wake(), "the worker never parked");
        (w, probe)
    }

    fn wait_for(f: impl Fn() -> bool, what: &str) {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < Duration::from_secs(10), "{what}");
            thread::yield_now();
        }
    }

    #[test]
    fn a_producer_runs_the_round_itself_when_the_poller_is_free() {
        let me = thread::current().id();
        let (w, probe) = parked_worker(true);
        let theirs = probe.rounds_elsewhere(me);
        probe.queued.fetch_add(1, Ordering::AcqRel);
        w.waker().serve();
        // Taken before serve() returned, on this thread; the worker was not woken for it.
        assert_eq!(probe.queued.load(Ordering::Acquire), 0);
        assert_eq!(probe.rounds_on(me), 1);
        assert!(w.waker().0.parked.must_wake(), "the worker stays parked");
        assert_eq!(probe.rounds_elsewhere(me), theirs);
        let waker = w.waker().clone();
        probe.stop.store(true, Ordering::Release);
        w.join().unwrap();
        // The poller is dropped with the worker: no round runs on a producer any more.
        assert!(probe.dropped.load(Ordering::Acquire));
        let n = probe.rounds.lock().unwrap().len();
        probe.queued.fetch_add(1, Ordering::AcqRel);
        waker.serve();
        assert_eq!(probe.rounds.lock().unwrap().len(), n);

        // Without `inline`, the worker takes it.
        let (w, probe) = parked_worker(false);
        probe.queued.fetch_add(1, Ordering::AcqRel);
        w.waker().serve();
        wait_for(|| probe.queued.load(Ordering::Acquire) == 0, "never taken");
        assert_eq!(probe.rounds_on(me), 0);
        probe.stop.store(true, Ordering::Release);
        w.join().unwrap();
    }

    #[test]
    fn a_producers_round_wakes_the_parked_worker_for_an_earlier_timer_and_for_work_left() {
        let me = thread::current().id();
        let (w, probe) = parked_worker(true);
        // The producer's round arms a timer due now, then leaves work it did not take (beyond
        // its burst): each time the worker, parked for an hour, must run.
        let cases = [
            (&probe.timer_now, "a timer a producer's round set"),
            (&probe.leave, "work a producer's round left"),
        ];
        for (i, (flag, what)) in cases.into_iter().enumerate() {
            wait_for(|| w.waker().0.parked.must_wake(), "never parked");
            let theirs = probe.rounds_elsewhere(me);
            flag.store(true, Ordering::Release);
            w.waker().serve();
            assert_eq!(probe.rounds_on(me), i + 1);
            let msg = format!("the worker slept through {what}");
            wait_for(|| probe.rounds_elsewhere(me) > theirs, &msg);
        }
        probe.stop.store(true, Ordering::Release);
        w.join().unwrap();
    }

    /// Polls for a reply due in an hour on the worker's thread (so the worker spins, wanting
    /// the lock all the time); a round on any other thread holds the lock for `hold` (a
    /// producer's round that cannot end soon: an answer to a client that does not read its
    /// socket) and reads the worker thread's CPU clock around it.
    struct Hold {
        worker_clock: Arc<std::sync::OnceLock<libc::clockid_t>>,
        hold: Duration,
        /// The worker's CPU time during the hold.
        spent: Arc<Mutex<Option<Duration>>>,
        stop: Arc<AtomicBool>,
        done: bool,
    }

    /// The CPU time of the thread whose clock is `id`.
    fn cpu_time(id: libc::clockid_t) -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a live out-parameter, and a thread CPU clock id of a live thread.
        let rc = unsafe { libc::clock_gettime(id, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime");
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    impl Poller for Hold {
        fn poll(&mut self, now: Instant) -> PollOutcome {
            if self.stop.load(Ordering::Acquire) {
                self.done = true;
            }
            if thread::current().name() == Some("hold-test") {
                self.worker_clock.get_or_init(|| {
                    let mut id: libc::clockid_t = 0;
                    // SAFETY: our own thread's handle and a live out-parameter.
                    let rc = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
                    assert_eq!(rc, 0, "pthread_getcpuclockid");
                    id
                });
                return PollOutcome {
                    reply_due: Some(now + Duration::from_secs(3600)),
                    ..PollOutcome::default()
                };
            }
            let id = *self.worker_clock.get().expect("the worker polled first");
            let before = cpu_time(id);
            thread::sleep(self.hold);
            *self.spent.lock().unwrap() = Some(cpu_time(id) - before);
            PollOutcome::default()
        }

        fn finished(&self) -> bool {
            self.done
        }
    }

    #[test]
    fn a_worker_behind_a_long_producers_round_waits_on_the_lock_not_in_a_spin() {
        let worker_clock = Arc::new(std::sync::OnceLock::new());
        let spent = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = WorkerConfig {
            name: "hold-test".into(),
            spin: Duration::from_millis(1),
            spin_for_reply: Duration::from_secs(7200),
            ..WorkerConfig::default()
        };
        let hold = Hold {
            worker_clock: worker_clock.clone(),
            hold: Duration::from_millis(500),
            spent: spent.clone(),
            stop: stop.clone(),
            done: false,
        };
        let w = Worker::spawn(cfg, Worker::new_waker(), hold).unwrap();
        wait_for(|| worker_clock.get().is_some(), "the worker never polled");
        // The producer's round, tried until the lock is free between two of the worker's.
        let t0 = Instant::now();
        while spent.lock().unwrap().is_none() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the lock was never free"
            );
            w.waker().serve();
        }
        // The worker wanted the lock all along: it spun for `spin` (1 ms), then slept on the
        // lock. Spinning through the whole 500 ms would have cost it far more CPU, even on a
        // loaded machine (each turn is a sched_yield).
        let spent = spent.lock().unwrap().unwrap();
        assert!(
            spent < Duration::from_millis(50),
            "{spent:?} of CPU in a 500 ms hold"
        );
        stop.store(true, Ordering::Release);
        w.join().unwrap();
    }

    #[test]
    fn wakes_processes_and_stops() {
        let inbox = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let waker = Worker::new_waker();
        let cfg = WorkerConfig {
            max_park: Duration::from_secs(30),
            ..WorkerConfig::default()
        };
        let w = Worker::spawn(
            cfg,
            waker.clone(),
            Counter {
                inbox: inbox.clone(),
                seen: seen.clone(),
                stop: stop.clone(),
                done: false,
            },
        )
        .unwrap();
        for _ in 0..1000 {
            inbox.fetch_add(1, Ordering::AcqRel);
            waker.wake();
            if seen.load(Ordering::Acquire) < 1000 {
                thread::sleep(Duration::from_micros(20));
            }
        }
        let t0 = Instant::now();
        while seen.load(Ordering::Acquire) != 1000 {
            assert!(t0.elapsed() < Duration::from_secs(5), "lost wake-up");
            thread::yield_now();
        }
        stop.store(true, Ordering::Release);
        w.join().unwrap();
    }
}
