//! The fake ibacm core: the helpers `/usr/sbin/ibacm` exports to its providers, exported from
//! the executable that links this crate, and a fake SA service behind them.
//!
//! The provider finds the helpers with `dlsym(RTLD_DEFAULT)` exactly as in the real daemon,
//! so the executable must export them: link it with `-Wl,--export-dynamic` (a build script's
//! `cargo:rustc-link-arg-tests=…` / `…-bin=NAME=…`) and call [`link`] once, which keeps the
//! functions in the link (a library's `#[no_mangle]` functions are linked into a binary only
//! when something references them).
//!
//! * **SA**: every MAD the provider sends is held until the caller decides its fate
//!   ([`sa_complete_next`] with an [`SaAction`]: an answer from the fake fabric's PathRecord
//!   table, BUSY, an SA error, a umad timeout, or never); [`AutoSa`] answers everything.
//! * **Answers**: every `acm_resolve_response` / `acm_query_response` is recorded
//!   ([`responses`], [`find`]) with the thread that made it, so tests check exactly-once
//!   ([`check_exactly_once`]) and who answered.
//! * **Counters**: allocations/frees/sends of SA MADs, the core's global `ACM_CNTR_*`.
//! * **Verbs** ([`fake_verbs`], on while a [`crate::host::Host`] is used): there is no verbs
//!   device: `ibv_query_port` reports LID [`PORT_LID`], MTU 2048, 4x QDR; `ibv_get_pkey_index`
//!   / `ibv_query_pkey` fail (no UD QP, SA-only endpoints). Off, they forward to libibverbs.

use acm_core_nostd::wire::client::Status;
use acmrs::ffi::*;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// An SA completion handler, as `acm_alloc_sa_mad` receives it.
pub type Handler = unsafe extern "C" fn(*mut AcmSaMad);

/// The core's allocation around an acm_sa_mad (the MAD first, as container_of needs).
#[repr(C)]
struct CoreSaReq {
    mad: AcmSaMad,
    handler: Handler,
    endpoint: usize,
}

/// One recorded answer.
#[derive(Clone)]
pub struct Response {
    /// The client id it was sent to.
    pub id: u64,
    /// `acm_query_response` (true) or `acm_resolve_response`.
    pub query: bool,
    /// The message.
    pub msg: AcmMsg,
    /// The thread that answered.
    pub thread: std::thread::ThreadId,
    /// That thread's name; only in [`Record::All`] mode (reading it is a syscall, which
    /// [`Record::Last`], the benchmarks' mode, keeps out of the loop it measures).
    pub thread_name: Option<String>,
    /// When.
    pub at: Instant,
    /// Which of the core's calls into the provider it was made inside, on the answering
    /// thread.
    pub inside: Inside,
}

/// Which of the core's calls into the provider a thread is inside (the fake core knows, as
/// it makes them): an answer made inside `resolve()` was made on the core's main thread, one
/// inside an SA completion handler on the core's SA thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inside {
    /// None: a thread of the provider's own (the dataplane, the watchdog).
    Nothing,
    /// `resolve()` or `query()`.
    ClientCall,
    /// An SA MAD's completion handler.
    SaHandler,
}

thread_local! {
    static INSIDE: std::cell::Cell<Inside> = const { std::cell::Cell::new(Inside::Nothing) };
}

/// Runs `f` marked as inside the core's call `what` (see [`Response::inside`]).
pub fn inside<R>(what: Inside, f: impl FnOnce() -> R) -> R {
    let before = INSIDE.with(|c| c.replace(what));
    let r = f();
    INSIDE.with(|c| c.set(before));
    r
}

impl Response {
    /// The answer's status.
    pub fn status(&self) -> Status {
        Status::from(self.msg.hdr.status)
    }

    /// True if the provider's dataplane thread sent it.
    pub fn from_dataplane(&self) -> bool {
        self.thread_name.as_deref() == Some(DATAPLANE_THREAD)
    }
}

/// The name of the provider's dataplane thread (as the OS keeps it: 15 bytes at most).
pub const DATAPLANE_THREAD: &str = "acmrs-dataplane";

/// `acm_alloc_sa_mad` calls that returned a MAD.
pub static ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// `acm_free_sa_mad` calls.
pub static FREES: AtomicUsize = AtomicUsize::new(0);
/// `acm_send_sa_mad` calls that succeeded.
pub static SENDS: AtomicUsize = AtomicUsize::new(0);
/// Of [`SENDS`], those made inside a `resolve()` or `query()` call (on the core's main
/// thread, before the call returned).
pub static SENDS_IN_CLIENT_CALL: AtomicUsize = AtomicUsize::new(0);
/// When set, `acm_send_sa_mad` fails (returns -1).
pub static SEND_FAIL: AtomicBool = AtomicBool::new(false);
/// SA MADs sent with a TID whose upper 32 bits are not zero.
pub static BAD_TID: AtomicUsize = AtomicUsize::new(0);
/// `acm_alloc_sa_mad` calls on an endpoint the core had already closed.
pub static DEAD_ENDPOINT_USE: AtomicUsize = AtomicUsize::new(0);
/// The core's global `ACM_CNTR_*` counters.
pub static GLOBAL_COUNTERS: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];
/// The LID `ibv_query_port` reports.
pub static PORT_LID: AtomicU64 = AtomicU64::new(7);
/// The client id whose answer blocks inside `acm_resolve_response` (`u64::MAX` = none): a
/// blocking `send()` to a stuck client.
pub static BLOCK_ID: AtomicU64 = AtomicU64::new(u64::MAX);
/// Answers with a `tid` at or above this are barrier answers (see [`is_barrier_tid`]): counted
/// in [`barrier_answers`], not recorded.
pub const BARRIER_TID: u64 = 0xba44_0000_0000_0000;

static SA_QUEUE: Mutex<VecDeque<usize>> = Mutex::new(VecDeque::new());
static SA_CV: Condvar = Condvar::new();
static RESPONSES: Mutex<Vec<Response>> = Mutex::new(Vec::new());
static ANSWERED: AtomicUsize = AtomicUsize::new(0);
static LAST: Mutex<Option<Response>> = Mutex::new(None);
static BARRIERS: AtomicUsize = AtomicUsize::new(0);
static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
static LOG_STDERR: AtomicBool = AtomicBool::new(false);
static LIVE_ENDPOINTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static OPTS_PATH: Mutex<Option<CString>> = Mutex::new(None);

/// The subnet prefix of the fake fabric.
pub const GID_PREFIX: [u8; 8] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0];
/// The port GUID of the fake core's port.
pub const OWN_GUID: u64 = 0x0002_c903_00a1_b2c3;

/// The GID of `guid` on the fake fabric.
pub fn gid_of(guid: u64) -> [u8; 16] {
    crate::request::gid(GID_PREFIX, guid)
}

/// Locks, ignoring poisoning (a failed test must not take the next ones down).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---- the exported "core" -------------------------------------------------------------------

/// `acm_write`. Non-variadic on purpose: the provider always calls
/// `acm_write(level, "acmrs: %s", text)`, and on x86-64 SysV a variadic call passes those three
/// arguments in the same registers. (So this fake serves acmrs only, not providers that log
/// with other formats.)
///
/// # Safety
/// `arg` must be null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn acm_write(_level: c_int, _fmt: *const c_char, arg: *const c_char) {
    if arg.is_null() {
        return;
    }
    // SAFETY: the caller passes a NUL-terminated string (see above).
    log_line(&unsafe { CStr::from_ptr(arg) }.to_string_lossy());
}

/// Records a log line of the provider, as `acm_write` does (for a host that exports its own
/// `acm_write` and forwards the formatted text here).
pub fn log_line(s: &str) {
    if LOG_STDERR.load(Ordering::Relaxed) {
        eprint!("{s}");
    }
    lock(&LOG).push(s.to_owned());
}

/// `acm_alloc_sa_mad`: a zeroed MAD with the context and handler (NULL for a NULL endpoint).
///
/// # Safety
/// As the core's: `endpoint` is compared by address only.
#[no_mangle]
pub unsafe extern "C" fn acm_alloc_sa_mad(
    endpoint: *const AcmEndpoint,
    context: *mut c_void,
    handler: Handler,
) -> *mut AcmSaMad {
    if endpoint.is_null() {
        return std::ptr::null_mut();
    }
    if !lock(&LIVE_ENDPOINTS).contains(&(endpoint as usize)) {
        DEAD_ENDPOINT_USE.fetch_add(1, Ordering::SeqCst);
    }
    ALLOCS.fetch_add(1, Ordering::SeqCst);
    let req = Box::new(CoreSaReq {
        mad: AcmSaMad {
            context,
            // SAFETY: `ib_user_mad` is plain integers and bytes: all zero is a valid value.
            umad: unsafe { std::mem::zeroed() },
            sa_mad: SaPacket { bytes: [0; 256] },
        },
        handler,
        endpoint: endpoint as usize,
    });
    Box::into_raw(req) as *mut AcmSaMad
}

/// `acm_send_sa_mad`: holds the MAD for the fake SA (or fails when [`SEND_FAIL`] is set).
///
/// # Safety
/// `mad` must come from [`acm_alloc_sa_mad`].
#[no_mangle]
pub unsafe extern "C" fn acm_send_sa_mad(mad: *mut AcmSaMad) -> c_int {
    if SEND_FAIL.load(Ordering::SeqCst) {
        return -1;
    }
    // SAFETY: a live MAD of ours (see above).
    let tid_high = unsafe {
        [
            (*mad).sa_mad.bytes[8],
            (*mad).sa_mad.bytes[9],
            (*mad).sa_mad.bytes[10],
            (*mad).sa_mad.bytes[11],
        ]
    };
    if tid_high != [0, 0, 0, 0] {
        BAD_TID.fetch_add(1, Ordering::SeqCst);
    }
    SENDS.fetch_add(1, Ordering::SeqCst);
    if INSIDE.with(|c| c.get()) == Inside::ClientCall {
        SENDS_IN_CLIENT_CALL.fetch_add(1, Ordering::SeqCst);
    }
    lock(&SA_QUEUE).push_back(mad as usize);
    SA_CV.notify_all();
    0
}

/// `acm_free_sa_mad`.
///
/// # Safety
/// `mad` must come from [`acm_alloc_sa_mad`] and not be freed yet.
#[no_mangle]
pub unsafe extern "C" fn acm_free_sa_mad(mad: *mut AcmSaMad) {
    FREES.fetch_add(1, Ordering::SeqCst);
    // SAFETY: allocated as a Box<CoreSaReq> whose first field is the MAD (see above).
    drop(unsafe { Box::from_raw(mad as *mut CoreSaReq) });
}

/// How answers are recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    /// Every answer, with its thread ([`responses`], [`find`]): tests.
    All,
    /// Only the last one ([`last_response`]) and the count: long runs that check answers.
    Last,
    /// Only the count and the last answer's time, tid and status ([`last_answer`]), no lock
    /// and no copy: benchmarks, where the core's hook is inside the measured call.
    Count,
}

static RECORD: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
static LAST_NS: AtomicU64 = AtomicU64::new(0);
static LAST_TID: AtomicU64 = AtomicU64::new(0);
static LAST_STATUS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Nanoseconds on this process's monotonic clock (since its first use).
pub fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Sets how answers are recorded (default [`Record::All`]).
pub fn record(mode: Record) {
    now_ns();
    RECORD.store(mode as u8, Ordering::Relaxed);
}

/// The last answer's [`now_ns`] time, tid and status (every [`Record`] mode).
pub fn last_answer() -> (u64, u64, u8) {
    (
        LAST_NS.load(Ordering::Acquire),
        LAST_TID.load(Ordering::Acquire),
        LAST_STATUS.load(Ordering::Acquire),
    )
}

/// Records an answer the way `acm_resolve_response` / `acm_query_response` do (for a host
/// that exports its own helpers and forwards its answers here). Always returns 0, as the
/// core does for a delivered answer.
///
/// # Safety
/// `msg` must be a full `acm_msg`, valid for the call.
pub unsafe fn record_answer(id: u64, msg: *const AcmMsg, query: bool) -> c_int {
    // SAFETY: the header of a full acm_msg (see above).
    let (tid, status) = unsafe { ((*msg).hdr.tid, (*msg).hdr.status) };
    if tid >= BARRIER_TID {
        BARRIERS.fetch_add(1, Ordering::SeqCst);
        return 0;
    }
    LAST_NS.store(now_ns(), Ordering::Release);
    LAST_TID.store(tid, Ordering::Release);
    LAST_STATUS.store(status, Ordering::Release);
    let mode = RECORD.load(Ordering::Relaxed);
    if mode != Record::Count as u8 {
        let r = Response {
            id,
            query,
            // SAFETY: a full acm_msg (see above).
            msg: unsafe { *msg },
            thread: std::thread::current().id(),
            thread_name: if mode == Record::All as u8 {
                os_thread_name()
            } else {
                None
            },
            at: Instant::now(),
            inside: INSIDE.with(|c| c.get()),
        };
        if mode == Record::All as u8 {
            lock(&RESPONSES).push(r);
        } else {
            *lock(&LAST) = Some(r);
        }
    }
    ANSWERED.fetch_add(1, Ordering::SeqCst);
    // A blocking send() to a stuck client: the answer for this id blocks.
    while BLOCK_ID.load(Ordering::SeqCst) == id {
        std::thread::sleep(Duration::from_millis(1));
    }
    0
}

fn record_response(id: u64, msg: *mut AcmMsg, query: bool) -> c_int {
    // SAFETY: the provider passes a full acm_msg, valid for the call.
    unsafe { record_answer(id, msg, query) }
}

/// The calling thread's name as the OS knows it (the provider's threads are spawned by the
/// provider's own copy of `std`, so this executable's `std::thread::current()` has no name
/// for them).
pub fn os_thread_name() -> Option<String> {
    let mut buf = [0u8; 64];
    // SAFETY: pthread_self() is the calling thread; the buffer is valid for its length.
    let rc = unsafe {
        libc::pthread_getname_np(libc::pthread_self(), buf.as_mut_ptr().cast(), buf.len())
    };
    if rc != 0 {
        return None;
    }
    let n = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// `acm_resolve_response`: counts ERROR / NODATA as the core does, records the answer.
///
/// # Safety
/// `msg` must be a full `acm_msg`.
#[no_mangle]
pub unsafe extern "C" fn acm_resolve_response(id: u64, msg: *mut AcmMsg) -> c_int {
    // SAFETY: a full acm_msg (see above).
    let status = unsafe { (*msg).hdr.status };
    match Status::from(status) {
        Status::Success => {}
        Status::Enodata => {
            GLOBAL_COUNTERS[cntr::NODATA].fetch_add(1, Ordering::SeqCst);
        }
        _ => {
            GLOBAL_COUNTERS[cntr::ERROR].fetch_add(1, Ordering::SeqCst);
        }
    }
    record_response(id, msg, false)
}

/// `acm_query_response`: records the answer (the core counts nothing here).
///
/// # Safety
/// `msg` must be a full `acm_msg`.
#[no_mangle]
pub unsafe extern "C" fn acm_query_response(id: u64, msg: *mut AcmMsg) -> c_int {
    record_response(id, msg, true)
}

/// `acm_get_opts_file`: the file [`set_opts_file`] named.
#[no_mangle]
pub extern "C" fn acm_get_opts_file() -> *const c_char {
    match &*lock(&OPTS_PATH) {
        Some(p) => p.as_ptr(),
        None => c"/nonexistent/ibacm_opts.cfg".as_ptr(),
    }
}

/// `acm_increment_counter`.
#[no_mangle]
pub extern "C" fn acm_increment_counter(which: c_int) {
    if let Some(c) = usize::try_from(which)
        .ok()
        .and_then(|i| GLOBAL_COUNTERS.get(i))
    {
        c.fetch_add(1, Ordering::SeqCst);
    }
}

/// `acm_get_gid`: GID index 0 is [`OWN_GUID`]'s, there is no other.
///
/// # Safety
/// `gid` must be valid for a 16-byte write.
#[no_mangle]
pub unsafe extern "C" fn acm_get_gid(
    _port: *const AcmPort,
    index: c_int,
    gid: *mut [u8; 16],
) -> c_int {
    if index != 0 {
        return -1;
    }
    // SAFETY: valid for writes (see above).
    unsafe { *gid = gid_of(OWN_GUID) };
    0
}

static FAKE_VERBS: AtomicBool = AtomicBool::new(false);

/// Turns the verbs fakes on (as [`crate::host::Host`] does) or off. Off (the default), the
/// three interposed verbs functions forward to the next definition (`dlsym(RTLD_NEXT)`: a
/// preloaded simulated libibverbs, or the real one): an executable that links this crate
/// exports them whenever it also links libibverbs, and a process with real verbs must keep
/// them.
pub fn fake_verbs(on: bool) {
    FAKE_VERBS.store(on, Ordering::SeqCst);
}

/// The next definition of `name` after this executable, if any.
fn next_symbol(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name has no preconditions.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }
}

type QueryPortFn = unsafe extern "C" fn(*mut c_void, u8, *mut u8) -> c_int;
type GetPkeyIndexFn = unsafe extern "C" fn(*mut c_void, u8, u16) -> c_int;
type QueryPkeyFn = unsafe extern "C" fn(*mut c_void, u8, c_int, *mut u16) -> c_int;

/// `ibv_query_port` (interposed over libibverbs'): with [`fake_verbs`] on, LID [`PORT_LID`],
/// MTU 2048, 4x QDR; else the next definition.
///
/// # Safety
/// As libibverbs': `attr` must be a zeroed `struct ibv_port_attr` (with the fakes on, any
/// buffer of at least 45 bytes).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(ctx: *mut c_void, port: u8, attr: *mut u8) -> c_int {
    if !FAKE_VERBS.load(Ordering::Relaxed) {
        let f = next_symbol(c"ibv_query_port");
        if f.is_null() {
            return -1;
        }
        // SAFETY: libibverbs' exported ibv_query_port has this signature; the arguments are
        // the caller's, passed through.
        return unsafe { std::mem::transmute::<*mut c_void, QueryPortFn>(f)(ctx, port, attr) };
    }
    let lid = PORT_LID.load(Ordering::SeqCst) as u16;
    // SAFETY: offsets inside struct ibv_port_attr (lid 34, active_mtu 8, active_width 43,
    // active_speed 44; checked by acm-plugin's layout test), buffer valid per the contract.
    unsafe {
        std::ptr::copy_nonoverlapping(lid.to_ne_bytes().as_ptr(), attr.add(34), 2);
        *attr.add(8) = 4; // IBV_MTU_2048
        *attr.add(43) = 2; // 4x
        *attr.add(44) = 4; // QDR
    }
    0
}

/// With [`fake_verbs`] on there is no verbs device: the P_Key lookups the provider makes
/// before it opens a UD QP fail, so an endpoint that asks for the ACM protocol (`route_prot
/// acm`, an explicit `addr_prot acm`) runs SA-only. Off, the next definition.
///
/// # Safety
/// As libibverbs'.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(ctx: *mut c_void, port: u8, pkey: u16) -> c_int {
    if FAKE_VERBS.load(Ordering::Relaxed) {
        return -1;
    }
    let f = next_symbol(c"ibv_get_pkey_index");
    if f.is_null() {
        return -1;
    }
    // SAFETY: libibverbs' signature; the caller's arguments passed through.
    unsafe { std::mem::transmute::<*mut c_void, GetPkeyIndexFn>(f)(ctx, port, pkey) }
}

/// See [`ibv_get_pkey_index`].
///
/// # Safety
/// As libibverbs'.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut c_void,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if FAKE_VERBS.load(Ordering::Relaxed) {
        return -1;
    }
    let f = next_symbol(c"ibv_query_pkey");
    if f.is_null() {
        return -1;
    }
    // SAFETY: libibverbs' signature; the caller's arguments passed through.
    unsafe { std::mem::transmute::<*mut c_void, QueryPkeyFn>(f)(ctx, port, index, pkey) }
}

/// The addresses of the exported helpers.
struct Exports([*const (); 12]);

// SAFETY: the table holds code addresses, never written and never dereferenced as data.
unsafe impl Sync for Exports {}

/// Every exported helper, referenced so that the linker keeps them (see [`link`]).
#[used]
static EXPORTS: Exports = Exports([
    acm_write as *const (),
    acm_alloc_sa_mad as *const (),
    acm_send_sa_mad as *const (),
    acm_free_sa_mad as *const (),
    acm_resolve_response as *const (),
    acm_query_response as *const (),
    acm_get_opts_file as *const (),
    acm_increment_counter as *const (),
    acm_get_gid as *const (),
    ibv_query_port as *const (),
    ibv_get_pkey_index as *const (),
    ibv_query_pkey as *const (),
]);

/// Keeps the exported helpers in the executable: call it before the provider is loaded
/// ([`crate::host::load`] does). Returns how many there are.
pub fn link() -> usize {
    std::hint::black_box(&EXPORTS.0)
        .iter()
        .filter(|p| !p.is_null())
        .count()
}

/// True if this process exports the helpers dynamically (linked with `--export-dynamic`).
pub fn exported() -> bool {
    link();
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no preconditions.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"acm_alloc_sa_mad".as_ptr()) };
    p as *const () == acm_alloc_sa_mad as *const ()
}

// ---- configuration and records ---------------------------------------------------------------

/// The opts file `acm_get_opts_file` returns from now on. (The previous string is leaked, not
/// freed: a provider may still hold the pointer it got.)
pub fn set_opts_file(path: &std::path::Path) {
    let new = CString::new(path.to_string_lossy().as_bytes()).ok();
    if let Some(old) = std::mem::replace(&mut *lock(&OPTS_PATH), new) {
        std::mem::forget(old);
    }
}

/// Whether the provider's log lines also go to stderr (default: if `ACMRS_TEST_LOG` is set).
pub fn log_to_stderr(on: bool) {
    LOG_STDERR.store(on, Ordering::Relaxed);
}

/// Registers / unregisters a core endpoint as live (for [`DEAD_ENDPOINT_USE`]).
pub fn endpoint_live(ep: *const AcmEndpoint, live: bool) {
    let mut l = lock(&LIVE_ENDPOINTS);
    if live {
        l.push(ep as usize);
    } else {
        l.retain(|p| *p != ep as usize);
    }
}

/// Forgets the recorded answers and log lines and zeroes the global counters.
pub fn reset_counters() {
    lock(&RESPONSES).clear();
    *lock(&LAST) = None;
    ANSWERED.store(0, Ordering::SeqCst);
    lock(&LOG).clear();
    for c in &GLOBAL_COUNTERS {
        c.store(0, Ordering::SeqCst);
    }
}

/// Every recorded answer, in order.
pub fn responses() -> Vec<Response> {
    lock(&RESPONSES).clone()
}

/// How many answers were recorded (also when they are not kept).
pub fn response_count() -> usize {
    ANSWERED.load(Ordering::SeqCst)
}

/// The last answer ([`Record::All`] and [`Record::Last`]).
pub fn last_response() -> Option<Response> {
    if RECORD.load(Ordering::Relaxed) == Record::All as u8 {
        lock(&RESPONSES).last().cloned()
    } else {
        lock(&LAST).clone()
    }
}

/// Barrier answers seen so far.
pub fn barrier_answers() -> usize {
    BARRIERS.load(Ordering::SeqCst)
}

/// True if `tid` is a barrier's.
pub fn is_barrier_tid(tid: u64) -> bool {
    tid >= BARRIER_TID
}

/// The answers with this `tid`.
pub fn find(tid: u64) -> Vec<Response> {
    lock(&RESPONSES)
        .iter()
        .filter(|r| r.msg.hdr.tid == tid)
        .cloned()
        .collect()
}

/// True if a logged line contains `s`.
pub fn log_contains(s: &str) -> bool {
    lock(&LOG).iter().any(|l| l.contains(s))
}

/// How many logged lines contain `s`.
pub fn log_count(s: &str) -> usize {
    lock(&LOG).iter().filter(|l| l.contains(s)).count()
}

/// The logged lines that contain `s`.
pub fn logged(s: &str) -> Vec<String> {
    lock(&LOG)
        .iter()
        .filter(|l| l.contains(s))
        .cloned()
        .collect()
}

/// Waits (polling every 200 µs) until `f` holds, at most `timeout`.
pub fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while !f() {
        if t0.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    true
}

/// Waits until at least `n` answers were recorded, at most `timeout`.
pub fn wait_responses(n: usize, timeout: Duration) -> bool {
    wait_for(timeout, || response_count() >= n)
}

/// Checks that no answer's tid appears twice and that every tid in `expected` has exactly
/// one answer, and no other tid any.
pub fn check_exactly_once(expected: &[u64]) -> Result<(), String> {
    let rs = responses();
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for r in &rs {
        *seen.entry(r.msg.hdr.tid).or_default() += 1;
    }
    for t in expected {
        match seen.get(t) {
            Some(1) => {}
            Some(n) => return Err(format!("tid {t:#x} answered {n} times")),
            None => return Err(format!("tid {t:#x} never answered")),
        }
    }
    if seen.len() != expected.len() {
        return Err(format!(
            "{} distinct tids answered, {} expected",
            seen.len(),
            expected.len()
        ));
    }
    Ok(())
}

// ---- the fake SA ---------------------------------------------------------------------------

/// What the fake SA does with a held MAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaAction {
    /// Answer from the table (ERR_NO_RECORDS if absent).
    Answer,
    /// MAD status BUSY.
    Busy,
    /// umad timeout (status ETIMEDOUT).
    Timeout,
    /// Invalid-field common status.
    InvalidField,
    /// Answer from the table, with the record's PacketLifeTime byte replaced (a path that
    /// changed at the SA).
    AnswerLife(u8),
    /// Keep it (answered later or never).
    Hold,
}

/// The fake fabric: any DLID in 1..0xC000 (GUID 0x1000 + DLID, our own LID is [`OWN_GUID`]),
/// and any GID on [`GID_PREFIX`] with a GUID above 0x1000 (LIDs wrap so 100k destinations
/// fit). SL, QoS class, TClass and service ID constraints of the query are honoured.
pub fn sa_record_for(req: &[u8; 64], mask: u64) -> Option<[u8; 64]> {
    let own = PORT_LID.load(Ordering::SeqCst) as u16;
    let dlid_req = u16::from_be_bytes([req[40], req[41]]);
    let mut dgid = [0u8; 16];
    let dlid = if mask & (1 << 4) != 0 {
        if dlid_req == 0 || dlid_req >= 0xc000 {
            return None;
        }
        let guid = if dlid_req == own {
            OWN_GUID
        } else {
            0x1000 + u64::from(dlid_req)
        };
        dgid = gid_of(guid);
        dlid_req
    } else if mask & (1 << 2) != 0 {
        dgid.copy_from_slice(&req[8..24]);
        let mut g = [0u8; 8];
        g.copy_from_slice(&req[16..24]);
        let guid = u64::from_be_bytes(g);
        if req[8..16] != GID_PREFIX {
            return None;
        }
        if guid == OWN_GUID {
            own
        } else {
            let n = guid.checked_sub(0x1000).filter(|n| *n != 0)?;
            ((n - 1) % 0xbffe + 1) as u16
        }
    } else {
        return None;
    };
    let mut r = [0u8; 64];
    r[8..24].copy_from_slice(&dgid);
    r[24..40].copy_from_slice(&gid_of(OWN_GUID));
    r[40..42].copy_from_slice(&dlid.to_be_bytes());
    r[42..44].copy_from_slice(&own.to_be_bytes());
    r[49] = 0x80;
    r[50..52].copy_from_slice(&0xffffu16.to_be_bytes());
    let sl = if mask & (1 << 15) != 0 {
        req[53] & 0xf
    } else {
        0
    };
    let qos = if mask & (1 << 14) != 0 {
        u16::from_be_bytes([req[52], req[53]]) >> 4
    } else {
        0
    };
    r[52..54].copy_from_slice(&((qos << 4) | u16::from(sl)).to_be_bytes());
    r[48] = if mask & (1 << 10) != 0 { req[48] } else { 0 };
    r[0..8].copy_from_slice(if mask & 3 != 0 { &req[0..8] } else { &[0; 8] });
    r[54] = 0x84;
    r[55] = 0x83;
    r[56] = 0x92;
    Some(r)
}

/// How many MADs the fake SA holds.
pub fn sa_pending() -> usize {
    lock(&SA_QUEUE).len()
}

/// One MAD the fake SA holds, as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldMad {
    /// MAD method (0x01 GET, 0x02 SET, 0x15 DELETE).
    pub method: u8,
    /// SA attribute ID (0x0035 PathRecord, 0x0038 MCMemberRecord).
    pub attr_id: u16,
}

/// The MADs the fake SA holds, oldest first.
pub fn sa_held() -> Vec<HeldMad> {
    lock(&SA_QUEUE)
        .iter()
        .map(|p| {
            let req = *p as *const CoreSaReq;
            // SAFETY: a MAD we hold in the queue (not freed: only sa_complete frees, after
            // taking it out under the same lock).
            let b = unsafe { &(*req).mad.sa_mad.bytes };
            HeldMad {
                method: b[3],
                attr_id: u16::from_be_bytes([b[16], b[17]]),
            }
        })
        .collect()
}

/// Completes the oldest held MAD with `action` (on the calling thread, as the core's SA
/// thread would). Returns false if none was held.
pub fn sa_complete_next(action: SaAction) -> bool {
    let Some(p) = lock(&SA_QUEUE).pop_front() else {
        return false;
    };
    sa_complete(p, action);
    true
}

/// Completes the MAD at position `i` of the queue.
pub fn sa_complete_at(i: usize, action: SaAction) -> bool {
    let p = {
        let mut q = lock(&SA_QUEUE);
        match q.remove(i) {
            Some(p) => p,
            None => return false,
        }
    };
    sa_complete(p, action);
    true
}

fn sa_complete(p: usize, action: SaAction) {
    if action == SaAction::Hold {
        lock(&SA_QUEUE).push_back(p);
        return;
    }
    let req = p as *mut CoreSaReq;
    // SAFETY: a MAD we held and just took out of the queue: nobody else touches it until its
    // handler (which owns it from then on) runs.
    let mad = unsafe { &mut (*req).mad };
    let bytes = &mut mad.sa_mad.bytes;
    match action {
        SaAction::Timeout => mad.umad.status = 110,
        SaAction::Busy => {
            bytes[3] = 0x81;
            bytes[4..6].copy_from_slice(&1u16.to_be_bytes());
        }
        SaAction::InvalidField => {
            bytes[3] = 0x81;
            bytes[4..6].copy_from_slice(&0x001cu16.to_be_bytes());
        }
        SaAction::Answer | SaAction::AnswerLife(_) => {
            let mut m = [0u8; 8];
            m.copy_from_slice(&bytes[48..56]);
            let mask = u64::from_be_bytes(m);
            let mut rec = [0u8; 64];
            rec.copy_from_slice(&bytes[56..120]);
            bytes[3] = 0x81;
            // The kernel/ibsim rewrite the upper TID half.
            bytes[8..12].copy_from_slice(&0xdead_beefu32.to_be_bytes());
            match sa_record_for(&rec, mask) {
                Some(mut r) => {
                    if let SaAction::AnswerLife(life) = action {
                        r[56] = life;
                    }
                    bytes[56..120].copy_from_slice(&r)
                }
                None => {
                    // "No records": status 3, no attribute data.
                    bytes[4..6].copy_from_slice(&0x0300u16.to_be_bytes());
                    bytes[56..120].fill(0);
                }
            }
        }
        SaAction::Hold => unreachable!("handled above"),
    }
    // SAFETY: the handler the provider gave for this MAD; it takes ownership of it.
    inside(Inside::SaHandler, || unsafe { ((*req).handler)(mad) });
}

/// Times out every held MAD (what the core's umad layer eventually does).
pub fn sa_drain_timeouts() {
    while sa_complete_next(SaAction::Timeout) {}
}

/// A background SA thread answering everything from the table until dropped.
pub struct AutoSa {
    stop: std::sync::Arc<AtomicBool>,
    t: Option<std::thread::JoinHandle<()>>,
}

impl AutoSa {
    /// Starts it.
    pub fn start() -> AutoSa {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let t = std::thread::Builder::new()
            .name("fake-sa".into())
            .spawn(move || {
                while !s.load(Ordering::SeqCst) {
                    let next = {
                        let q = lock(&SA_QUEUE);
                        let (mut q, _) = SA_CV
                            .wait_timeout_while(q, Duration::from_millis(20), |q| q.is_empty())
                            .unwrap_or_else(|p| p.into_inner());
                        q.pop_front()
                    };
                    if let Some(p) = next {
                        sa_complete(p, SaAction::Answer);
                    }
                }
            })
            .ok();
        AutoSa { stop, t }
    }
}

impl Drop for AutoSa {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.t.take() {
            let _ = t.join();
        }
    }
}

/// [`wait_for`] with the default bound [`crate::host::W`].
pub fn wait_until(f: impl FnMut() -> bool) -> bool {
    wait_for(crate::host::W, f)
}

/// Waits for the one SA MAD held, completes it with `action`, and waits until `responses`
/// answers were recorded in total (panics otherwise).
pub fn sa_one(action: SaAction, responses: usize) {
    assert!(wait_until(|| sa_pending() == 1), "one SA query in flight");
    assert!(sa_complete_next(action));
    assert!(
        wait_responses(responses, crate::host::W),
        "{responses} answers expected, {} recorded",
        response_count()
    );
}
