//! The exported `read` / `write` and the timer thread: [`crate::sender`] wired to umad2sim's
//! functions (found with `dlsym(RTLD_NEXT)`, never called through our own symbols).

use crate::sender::{self, End, Step, Timers, Transfer, DATA_OFFSET};
use acm_core_nostd::wire::mad::MAD_LEN;
use libc::{c_int, c_void, nfds_t, pollfd, size_t, ssize_t};
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// `sizeof(struct ib_user_mad)`: agent_id, status, timeout_ms, retries, length, then the
/// 44-byte `ib_mad_addr` (qpn at 20, lid at 28, both in network order).
const UMAD_HDR: usize = 64;
/// umad2sim's umad device fds: 1024 + device × FD_PER_DEVICE + index (2048.. are ISSM fds).
const UMAD_FDS: std::ops::Range<c_int> = 1024..2048;

type ReadFn = unsafe extern "C-unwind" fn(c_int, *mut c_void, size_t) -> ssize_t;
type WriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t;
// "C-unwind": OpenSM stops its receiver thread with pthread_cancel, which unwinds (forced) out
// of umad2sim's poll; when that thread waits in our `read`, the unwind must pass through it.
type PollFn = unsafe extern "C-unwind" fn(*mut pollfd, nfds_t, c_int) -> c_int;

static NEXT_READ: AtomicUsize = AtomicUsize::new(0);
static NEXT_WRITE: AtomicUsize = AtomicUsize::new(0);
static NEXT_POLL: AtomicUsize = AtomicUsize::new(0);
static PANICS: AtomicU64 = AtomicU64::new(0);

/// The next definition of `name` after this library (umad2sim's, or libc's), cached.
fn next_sym(slot: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    let p = slot.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    // SAFETY: dlsym with the RTLD_NEXT pseudo-handle and a NUL-terminated name; it only looks
    // the symbol up.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    slot.store(p, Ordering::Release);
    p
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// The next `write` (umad2sim's): `fd`, `len` bytes at `buf`.
///
/// # Safety
/// `buf` must be readable for `len` bytes.
unsafe fn next_write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    let p = next_sym(&NEXT_WRITE, c"write");
    if p == 0 {
        set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: p is the address of a function with write(2)'s signature (dlsym of "write").
    let f: WriteFn = unsafe { std::mem::transmute::<usize, WriteFn>(p) };
    // SAFETY: the caller guarantees buf/len.
    unsafe { f(fd, buf, len) }
}

/// The next `read`.
///
/// # Safety
/// `buf` must be writable for `len` bytes.
unsafe fn next_read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    let p = next_sym(&NEXT_READ, c"read");
    if p == 0 {
        set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: p is the address of a function with read(2)'s signature (dlsym of "read").
    let f: ReadFn = unsafe { std::mem::transmute::<usize, ReadFn>(p) };
    // SAFETY: the caller guarantees buf/len.
    unsafe { f(fd, buf, len) }
}

/// The next `poll` on `fd` alone, waiting for input without a timeout.
fn next_poll_forever(fd: c_int) -> c_int {
    let p = next_sym(&NEXT_POLL, c"poll");
    if p == 0 {
        return -1;
    }
    // SAFETY: p is the address of a function with poll(2)'s signature (dlsym of "poll").
    let f: PollFn = unsafe { std::mem::transmute::<usize, PollFn>(p) };
    let mut pfd = pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on our stack.
    unsafe { f(&mut pfd, 1, -1) }
}

/// Sends one MAD through the next `write` with the umad header `umad`.
fn send_mad(fd: c_int, umad: &[u8; UMAD_HDR], mad: &[u8; MAD_LEN]) -> bool {
    let mut b = [0u8; UMAD_HDR + MAD_LEN];
    b[..UMAD_HDR].copy_from_slice(umad);
    b[UMAD_HDR..].copy_from_slice(mad);
    // SAFETY: b is a live buffer of b.len() bytes.
    let n = unsafe { next_write(fd, b.as_ptr().cast(), b.len()) };
    n == b.len() as ssize_t
}

/// A transfer's peer: TID, destination LID and QPN as the umad header holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    tid: u64,
    lid: u16,
    qpn: u32,
}

impl Key {
    fn of(umad: &[u8], mad: &[u8]) -> Key {
        Key {
            tid: sender::tid(mad),
            qpn: u32::from_be_bytes([umad[20], umad[21], umad[22], umad[23]]),
            lid: u16::from_be_bytes([umad[28], umad[29]]),
        }
    }
}

struct Active {
    key: Key,
    fd: c_int,
    umad: [u8; UMAD_HDR],
    tx: Transfer,
    started: Instant,
}

/// What the library counts (written to `$UMAD_RMPP_STATS`).
#[derive(Default)]
struct Counters {
    /// Multi-segment transfers started.
    transfers: u64,
    /// One-MAD RMPP answers sent as a single First|Last segment.
    single_segment: u64,
    completed: u64,
    stopped: u64,
    aborted_by_receiver: u64,
    aborted_retries: u64,
    aborted_total_time: u64,
    aborted_bad_ack: u64,
    undeliverable: u64,
    /// A new answer with the key of a running transfer replaced it.
    replaced: u64,
    segments_sent: u64,
    segments_resent: u64,
    timeouts: u64,
    acks: u64,
    stale_acks: u64,
    stops_received: u64,
    aborts_received: u64,
    /// ACK/STOP/ABORT for no running transfer (taken, so OpenSM never sees them).
    stray_controls: u64,
    /// Our segments ibsim returned undeliverable.
    bounced: u64,
    write_errors: u64,
    /// Segments of the largest transfer.
    max_segments: u64,
    /// Segments and milliseconds of the last completed transfer.
    last_segments: u64,
    last_ms: u64,
}

struct State {
    active: Vec<Active>,
    c: Counters,
    timer: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    active: Vec::new(),
    c: Counters {
        transfers: 0,
        single_segment: 0,
        completed: 0,
        stopped: 0,
        aborted_by_receiver: 0,
        aborted_retries: 0,
        aborted_total_time: 0,
        aborted_bad_ack: 0,
        undeliverable: 0,
        replaced: 0,
        segments_sent: 0,
        segments_resent: 0,
        timeouts: 0,
        acks: 0,
        stale_acks: 0,
        stops_received: 0,
        aborts_received: 0,
        stray_controls: 0,
        bounced: 0,
        write_errors: 0,
        max_segments: 0,
        last_segments: 0,
        last_ms: 0,
    },
    timer: false,
});
static WAKE: Condvar = Condvar::new();

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_ms() -> u64 {
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_millis() as u64
}

fn stats_path() -> Option<&'static PathBuf> {
    static P: OnceLock<Option<PathBuf>> = OnceLock::new();
    P.get_or_init(|| std::env::var_os("UMAD_RMPP_STATS").map(PathBuf::from))
        .as_ref()
}

impl State {
    fn render(&self) -> String {
        let c = &self.c;
        let mut s = String::new();
        for (k, v) in [
            ("transfers", c.transfers),
            ("single_segment", c.single_segment),
            ("completed", c.completed),
            ("stopped", c.stopped),
            ("aborted_by_receiver", c.aborted_by_receiver),
            ("aborted_retries", c.aborted_retries),
            ("aborted_total_time", c.aborted_total_time),
            ("aborted_bad_ack", c.aborted_bad_ack),
            ("undeliverable", c.undeliverable),
            ("replaced", c.replaced),
            ("active", self.active.len() as u64),
            ("segments_sent", c.segments_sent),
            ("segments_resent", c.segments_resent),
            ("timeouts", c.timeouts),
            ("acks", c.acks),
            ("stale_acks", c.stale_acks),
            ("stops_received", c.stops_received),
            ("aborts_received", c.aborts_received),
            ("stray_controls", c.stray_controls),
            ("bounced", c.bounced),
            ("write_errors", c.write_errors),
            ("max_segments", c.max_segments),
            ("last_segments", c.last_segments),
            ("last_ms", c.last_ms),
            ("panics", PANICS.load(Ordering::Relaxed)),
        ] {
            let _ = writeln!(s, "{k}={v}");
        }
        s
    }

    /// Rewrites the stats file (if asked for) atomically: temporary file, then rename.
    fn publish(&self) {
        let Some(p) = stats_path() else { return };
        let mut tmp = p.clone().into_os_string();
        tmp.push(".tmp");
        if std::fs::write(&tmp, self.render()).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }

    /// Sends what a step asks for on transfer `i`, counts it, and removes the transfer if it
    /// ended.
    fn apply(&mut self, i: usize, step: Step) {
        let (fd, umad) = (self.active[i].fd, self.active[i].umad);
        for m in &step.send {
            if !send_mad(fd, &umad, m) {
                self.c.write_errors += 1;
            }
        }
        let data_segments = step.send.iter().filter(|m| m[25] == 1).count() as u64;
        self.c.segments_sent += data_segments;
        self.c.segments_resent += u64::from(step.resent);
        self.c.stale_acks += u64::from(step.stale_ack);
        if let Some(end) = step.end {
            let a = self.active.swap_remove(i);
            match end {
                End::Completed => {
                    self.c.completed += 1;
                    self.c.last_segments = u64::from(a.tx.total());
                    self.c.last_ms = a.started.elapsed().as_millis() as u64;
                }
                End::Stopped(_) => self.c.stopped += 1,
                End::AbortedByReceiver(_) => self.c.aborted_by_receiver += 1,
                End::Aborted(126) => self.c.aborted_retries += 1,
                End::Aborted(118) => self.c.aborted_total_time += 1,
                End::Aborted(_) => self.c.aborted_bad_ack += 1,
                End::Undeliverable => self.c.undeliverable += 1,
            }
            self.publish();
        }
    }

    fn find(&self, key: Key) -> Option<usize> {
        self.active.iter().position(|a| a.key == key).or_else(|| {
            // The peer's address as the ACK shows it should be the one OpenSM answered;
            // if not, a TID that names exactly one transfer is enough.
            let mut it = self
                .active
                .iter()
                .enumerate()
                .filter(|(_, a)| a.key.tid == key.tid);
            match (it.next(), it.next()) {
                (Some((i, _)), None) => Some(i),
                _ => None,
            }
        })
    }
}

/// Runs `f`, turning a panic into `None` (never across the C ABI).
fn guard<T>(f: impl FnOnce() -> T) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(_) => {
            PANICS.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Starts the timer thread once.
fn ensure_timer(st: &mut State) {
    if st.timer {
        return;
    }
    st.timer = std::thread::Builder::new()
        .name("umad-rmpp-timer".into())
        .spawn(|| loop {
            if guard(timer_tick).is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .is_ok();
}

/// One round of the timer thread: every due transfer's timeout, then sleep until the next
/// deadline (or a new transfer).
fn timer_tick() {
    let mut st = state();
    let now = now_ms();
    let mut i = 0;
    while i < st.active.len() {
        if st.active[i].tx.deadline().is_some_and(|d| d <= now) {
            st.c.timeouts += 1;
            let step = st.active[i].tx.on_timeout(now);
            let ended = step.end.is_some();
            st.apply(i, step);
            if ended {
                continue;
            }
        }
        i += 1;
    }
    let next = st.active.iter().filter_map(|a| a.tx.deadline()).min();
    let wait = next.map_or(Duration::from_secs(1), |d| {
        Duration::from_millis(d.saturating_sub(now_ms()).max(1))
    });
    drop(WAKE.wait_timeout(st, wait));
}

/// A umad write of an RMPP-active SubnAdm response: segments it. `bytes` is the whole write.
fn rmpp_write(fd: c_int, bytes: &[u8]) -> ssize_t {
    let mut umad = [0u8; UMAD_HDR];
    umad.copy_from_slice(&bytes[..UMAD_HDR]);
    let mad = &bytes[UMAD_HDR..];
    if mad.len() <= MAD_LEN {
        // One MAD: the RMPP header a kernel sender would put on a one-segment transfer, the
        // write's length kept (umad2sim clients count records by the length they read).
        let seg = sender::segments(mad)[0];
        let mut b = bytes.to_vec();
        b[UMAD_HDR + 24..UMAD_HDR + DATA_OFFSET].copy_from_slice(&seg[24..DATA_OFFSET]);
        state().c.single_segment += 1;
        // SAFETY: b is a live buffer of b.len() bytes.
        return unsafe { next_write(fd, b.as_ptr().cast(), b.len()) };
    }
    let key = Key::of(&umad, mad);
    let mut st = state();
    if let Some(i) = st.active.iter().position(|a| a.key == key) {
        st.active.swap_remove(i);
        st.c.replaced += 1;
    }
    let (tx, step) = Transfer::start(now_ms(), mad, Timers::DEFAULT);
    st.c.transfers += 1;
    st.c.max_segments = st.c.max_segments.max(u64::from(tx.total()));
    st.active.push(Active {
        key,
        fd,
        umad,
        tx,
        started: Instant::now(),
    });
    let i = st.active.len() - 1;
    st.apply(i, step);
    ensure_timer(&mut st);
    st.publish();
    WAKE.notify_all();
    bytes.len() as ssize_t
}

/// A MAD read from a umad fd (`bytes`: umad header + MAD): whether it is ours to take.
fn take(bytes: &[u8]) -> bool {
    let (umad, mad) = bytes.split_at(UMAD_HDR);
    let status = u32::from_ne_bytes([umad[4], umad[5], umad[6], umad[7]]);
    if status != 0 && sender::is_rmpp_response(mad) {
        // One of our segments (or ABORTs) that ibsim could not deliver.
        let mut st = state();
        st.c.bounced += 1;
        let tid = sender::tid(mad);
        if let Some(i) = st.active.iter().position(|a| a.key.tid == tid) {
            let step = st.active[i].tx.on_undeliverable();
            st.apply(i, step);
        }
        return true;
    }
    let Some((kind, seg, win, rstatus)) = sender::receiver_control(mad) else {
        return false;
    };
    let mut st = state();
    match kind {
        acm_core_nostd::wire::mad::RmppType::Stop => st.c.stops_received += 1,
        acm_core_nostd::wire::mad::RmppType::Abort => st.c.aborts_received += 1,
        _ => st.c.acks += 1,
    }
    match st.find(Key::of(umad, mad)) {
        Some(i) => {
            let step = st.active[i]
                .tx
                .on_control(now_ms(), kind, seg, win, rstatus);
            st.apply(i, step);
        }
        None => {
            st.c.stray_controls += 1;
            st.publish();
        }
    }
    WAKE.notify_all();
    true
}

/// `write(2)`, as seen by the whole process.
///
/// # Safety
/// write(2)'s contract: `buf` readable for `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    if !UMAD_FDS.contains(&fd) || buf.is_null() || count <= UMAD_HDR + DATA_OFFSET {
        // SAFETY: the caller's buffer, passed on unchanged.
        return unsafe { next_write(fd, buf, count) };
    }
    // SAFETY: write(2)'s contract: buf is readable for count bytes.
    let bytes = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), count) };
    if !sender::is_rmpp_response(&bytes[UMAD_HDR..]) {
        // SAFETY: as above.
        return unsafe { next_write(fd, buf, count) };
    }
    match guard(|| rmpp_write(fd, bytes)) {
        Some(n) => n,
        None => {
            set_errno(libc::EIO);
            -1
        }
    }
}

/// `read(2)`, as seen by the whole process. `C-unwind`: a thread cancelled while this waits in
/// umad2sim's `poll` (a cancellation point) unwinds through it; the frame holds nothing to drop
/// there, and the work that could panic runs under [`guard`].
///
/// # Safety
/// read(2)'s contract: `buf` writable for `count` bytes.
#[no_mangle]
pub unsafe extern "C-unwind" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    if !UMAD_FDS.contains(&fd) || buf.is_null() {
        // SAFETY: the caller's buffer, passed on unchanged.
        return unsafe { next_read(fd, buf, count) };
    }
    let mut taken = false;
    loop {
        // SAFETY: the caller's buffer and length.
        let n = unsafe { next_read(fd, buf, count) };
        if taken && n == -(libc::EWOULDBLOCK as ssize_t) {
            // We ate what the caller polled for: wait for the next MAD as it did.
            if next_poll_forever(fd) < 0 {
                return n;
            }
            continue;
        }
        if n <= (UMAD_HDR + DATA_OFFSET) as ssize_t {
            return n;
        }
        let len = (n as usize).min(count);
        // SAFETY: next_read wrote `len` (≤ count) bytes into the caller's buffer.
        let bytes = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
        if guard(|| take(bytes)) != Some(true) {
            return n;
        }
        taken = true;
    }
}
