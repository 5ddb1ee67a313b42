//! A fake ibacm core for driving `libacmrs.so` in-process.
//!
//! The test executable exports the core's helpers (`acm_write`, `acm_alloc_sa_mad`, …) as
//! dynamic symbols (build.rs links tests with `--export-dynamic`), so the library finds them
//! with `dlsym(RTLD_DEFAULT)` exactly as in `/usr/sbin/ibacm`. The fake SA keeps every MAD the
//! provider sends until the test decides its fate: answer from a PathRecord table, BUSY, an SA
//! error, a umad timeout, or never. Every helper call is counted so tests can check that every
//! MAD is freed and every request answered exactly once.
#![allow(dead_code)]

use acmrs::ffi::*;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

pub type Handler = unsafe extern "C" fn(*mut AcmSaMad);

/// The core's allocation around an acm_sa_mad (the MAD first, as container_of needs).
#[repr(C)]
struct CoreSaReq {
    mad: AcmSaMad,
    handler: Handler,
    endpoint: usize,
}

#[derive(Clone)]
pub struct Response {
    pub id: u64,
    pub query: bool,
    pub msg: AcmMsg,
    pub thread: std::thread::ThreadId,
}

pub static ALLOCS: AtomicUsize = AtomicUsize::new(0);
pub static FREES: AtomicUsize = AtomicUsize::new(0);
pub static SENDS: AtomicUsize = AtomicUsize::new(0);
pub static SEND_FAIL: AtomicBool = AtomicBool::new(false);
pub static BAD_TID: AtomicUsize = AtomicUsize::new(0);
pub static DEAD_ENDPOINT_USE: AtomicUsize = AtomicUsize::new(0);
pub static GLOBAL_COUNTERS: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];
pub static PORT_LID: AtomicU64 = AtomicU64::new(7);
/// The client id whose answer blocks in `acm_resolve_response` (`u64::MAX` = none).
pub static BLOCK_ID: AtomicU64 = AtomicU64::new(u64::MAX);

static SA_QUEUE: Mutex<VecDeque<usize>> = Mutex::new(VecDeque::new());
static RESPONSES: Mutex<Vec<Response>> = Mutex::new(Vec::new());
static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
static LIVE_ENDPOINTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static OPTS_PATH: Mutex<Option<CString>> = Mutex::new(None);

pub const GID_PREFIX: [u8; 8] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0];
pub const OWN_GUID: u64 = 0x0002_c903_00a1_b2c3;

pub fn gid_of(guid: u64) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&GID_PREFIX);
    g[8..].copy_from_slice(&guid.to_be_bytes());
    g
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---- the exported "core" -------------------------------------------------------------------

/// Non-variadic on purpose: the provider always calls `acm_write(level, "%s"-style fmt, str)`,
/// and on x86-64 SysV a variadic call passes those three arguments in the same registers.
#[no_mangle]
pub unsafe extern "C" fn acm_write(_level: c_int, _fmt: *const c_char, arg: *const c_char) {
    if arg.is_null() {
        return;
    }
    let s = CStr::from_ptr(arg).to_string_lossy().into_owned();
    if std::env::var_os("ACMRS_TEST_LOG").is_some() {
        eprint!("{s}");
    }
    lock(&LOG).push(s);
}

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
        // SAFETY-free: zeroed POD.
        mad: AcmSaMad {
            context,
            umad: std::mem::zeroed(),
            sa_mad: SaPacket { bytes: [0; 256] },
        },
        handler,
        endpoint: endpoint as usize,
    });
    Box::into_raw(req) as *mut AcmSaMad
}

#[no_mangle]
pub unsafe extern "C" fn acm_send_sa_mad(mad: *mut AcmSaMad) -> c_int {
    if SEND_FAIL.load(Ordering::SeqCst) {
        return -1;
    }
    if (&(*mad).sa_mad.bytes)[8..12] != [0, 0, 0, 0] {
        BAD_TID.fetch_add(1, Ordering::SeqCst);
    }
    SENDS.fetch_add(1, Ordering::SeqCst);
    lock(&SA_QUEUE).push_back(mad as usize);
    0
}

#[no_mangle]
pub unsafe extern "C" fn acm_free_sa_mad(mad: *mut AcmSaMad) {
    FREES.fetch_add(1, Ordering::SeqCst);
    drop(Box::from_raw(mad as *mut CoreSaReq));
}

fn record_response(id: u64, msg: *mut AcmMsg, query: bool) -> c_int {
    // SAFETY: the provider passes a full acm_msg.
    let m = unsafe { *msg };
    lock(&RESPONSES).push(Response {
        id,
        query,
        msg: m,
        thread: std::thread::current().id(),
    });
    // Plays a blocking send() to a stuck client (review G1): the answer for this id blocks.
    while BLOCK_ID.load(Ordering::SeqCst) == id {
        std::thread::sleep(Duration::from_millis(1));
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn acm_resolve_response(id: u64, msg: *mut AcmMsg) -> c_int {
    let status = (*msg).hdr.status;
    if status == ACM_STATUS_ENODATA {
        GLOBAL_COUNTERS[cntr::NODATA].fetch_add(1, Ordering::SeqCst);
    } else if status != 0 {
        GLOBAL_COUNTERS[cntr::ERROR].fetch_add(1, Ordering::SeqCst);
    }
    record_response(id, msg, false)
}

#[no_mangle]
pub unsafe extern "C" fn acm_query_response(id: u64, msg: *mut AcmMsg) -> c_int {
    record_response(id, msg, true)
}

#[no_mangle]
pub unsafe extern "C" fn acm_get_opts_file() -> *const c_char {
    match &*lock(&OPTS_PATH) {
        Some(p) => p.as_ptr(),
        None => c"/nonexistent/ibacm_opts.cfg".as_ptr(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn acm_increment_counter(which: c_int) {
    if (0..7).contains(&which) {
        GLOBAL_COUNTERS[which as usize].fetch_add(1, Ordering::SeqCst);
    }
}

#[no_mangle]
pub unsafe extern "C" fn acm_get_gid(
    _port: *const AcmPort,
    index: c_int,
    gid: *mut [u8; 16],
) -> c_int {
    if index != 0 {
        return -1;
    }
    *gid = gid_of(OWN_GUID);
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(_ctx: *mut c_void, _port: u8, attr: *mut u8) -> c_int {
    let lid = PORT_LID.load(Ordering::SeqCst) as u16;
    std::ptr::copy_nonoverlapping(lid.to_ne_bytes().as_ptr(), attr.add(34), 2);
    *attr.add(8) = 4; // IBV_MTU_2048 enum 4
    *attr.add(43) = 2; // 4x
    *attr.add(44) = 4; // QDR
    0
}

/// This fake core has no verbs device: the P_Key lookups the provider makes before it opens a
/// UD QP fail (interposed over libibverbs', as `ibv_query_port` is), so an endpoint that asks
/// for the ACM protocol (`route_prot acm`, an explicit `addr_prot acm`) runs SA-only.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(_ctx: *mut c_void, _port: u8, _pkey: u16) -> c_int {
    -1
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    _ctx: *mut c_void,
    _port: u8,
    _index: c_int,
    _pkey: *mut u16,
) -> c_int {
    -1
}

// ---- the provider under test ---------------------------------------------------------------

pub struct Lib {
    pub prov: &'static AcmProvider,
    pub path: std::path::PathBuf,
}

pub fn so_path() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let p = dir.join("libacmrs.so");
    assert!(
        p.exists(),
        "{} missing: run `cargo build -p acm-plugin`",
        p.display()
    );
    // `cargo test` does not relink the cdylib: refuse to test a library older than its sources.
    let so_time = std::fs::metadata(&p).and_then(|m| m.modified()).unwrap();
    for dir in [
        "src",
        "../acm-dataplane/src",
        "../acm-core-nostd/src/resolver",
    ] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        for f in std::fs::read_dir(&dir).unwrap().flatten() {
            let t = f.metadata().and_then(|m| m.modified()).unwrap();
            assert!(
                t <= so_time,
                "{} is older than {}: run `cargo build -p acm-plugin` first",
                p.display(),
                f.path().display()
            );
        }
    }
    p
}

pub fn lib() -> &'static Lib {
    static LIB: OnceLock<Lib> = OnceLock::new();
    LIB.get_or_init(|| {
        let path = so_path();
        let c = CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: plain dlopen of our library; the handle is kept for the process.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen failed");
        // SAFETY: symbol lookup in that handle.
        let sym = unsafe { libc::dlsym(h, c"provider_query".as_ptr()) };
        assert!(!sym.is_null());
        type Pq = unsafe extern "C" fn(*mut *const AcmProvider, *mut u32) -> c_int;
        // SAFETY: provider_query has this signature.
        let pq: Pq = unsafe { std::mem::transmute(sym) };
        let mut prov: *const AcmProvider = std::ptr::null();
        let mut version = 0u32;
        // SAFETY: valid out-pointers.
        let rc = unsafe { pq(&mut prov, &mut version) };
        assert_eq!(rc, 0);
        assert_eq!(version, 1);
        // SAFETY: static table inside the library, never unloaded.
        Lib {
            prov: unsafe { &*prov },
            path,
        }
    })
}

/// Serialises tests: the provider instance is process-wide.
pub fn serial() -> MutexGuard<'static, ()> {
    static S: Mutex<()> = Mutex::new(());
    lock(&S)
}

// ---- one fake device/port/endpoint set -----------------------------------------------------

pub struct Host {
    pub device: Box<AcmDevice>,
    pub port: Box<AcmPort>,
    pub dev_ctx: *mut c_void,
    pub port_ctx: *mut c_void,
    pub eps: Vec<Endpoint>,
    pub dir: std::path::PathBuf,
    pub next_tid: u64,
    closed: bool,
}

pub struct Endpoint {
    pub ep: Box<AcmEndpoint>,
    pub ctx: *mut c_void,
    pub addrs: Vec<*mut c_void>,
}

pub fn reset_counters() {
    lock(&RESPONSES).clear();
    lock(&LOG).clear();
    for c in &GLOBAL_COUNTERS {
        c.store(0, Ordering::SeqCst);
    }
}

impl Host {
    /// Writes `opts` (plus `extra_files`) into a scratch dir and opens device + port.
    pub fn open(opts: &str, extra_files: &[(&str, &str)]) -> Host {
        // A failed test may leave MADs behind: time them out so tests stay independent.
        sa_drain_timeouts();
        let dir = std::env::temp_dir().join(format!(
            "acmrs-host-{}-{}",
            std::process::id(),
            crate::common::uniq()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in extra_files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let mut opts = opts.replace("$DIR", dir.to_str().unwrap());
        // This fake core has no verbs device (its context is a dummy pointer): without an
        // explicit choice, the endpoints run SA-only (`addr_prot none`), the hosts preload and
        // local addresses still answer names and IPs. The ACM protocol is tested on the
        // simulated fabric with the real daemon (real_ibacm_acm.rs).
        if !opts.contains("addr_prot") {
            opts = format!("{opts}\naddr_prot none\n");
        }
        let opts_path = dir.join("ibacm_opts.cfg");
        std::fs::write(&opts_path, opts).unwrap();
        *lock(&OPTS_PATH) = Some(CString::new(opts_path.to_str().unwrap()).unwrap());
        reset_counters();
        let prov = lib().prov;
        let device = Box::new(AcmDevice {
            verbs: 0x1000 as *mut c_void,
            dev_guid: 0x0002_c903_00a1_b2c0u64.to_be(),
        });
        let port = Box::new(AcmPort {
            dev: &*device,
            port_num: 1,
        });
        let mut dev_ctx = std::ptr::null_mut();
        let mut port_ctx = std::ptr::null_mut();
        // SAFETY: calling the provider with valid core objects, as ibacm does.
        unsafe {
            assert_eq!((prov.open_device)(&*device, &mut dev_ctx), 0);
            assert!(!dev_ctx.is_null());
            assert_eq!((prov.open_port)(&*port, dev_ctx, &mut port_ctx), 0);
            assert!(!port_ctx.is_null());
        }
        Host {
            device,
            port,
            dev_ctx,
            port_ctx,
            eps: Vec::new(),
            dir,
            next_tid: 1,
            closed: false,
        }
    }

    /// Opens an endpoint lazily with its first address (as the core does). Returns its index.
    pub fn open_ep(&mut self, pkey: u16, first_addr: (u16, &[u8])) -> usize {
        let prov = lib().prov;
        let ep = Box::new(AcmEndpoint {
            port: &*self.port,
            pkey,
        });
        lock(&LIVE_ENDPOINTS).push(&*ep as *const AcmEndpoint as usize);
        let mut ctx = std::ptr::null_mut();
        // SAFETY: as ibacm calls it.
        unsafe { assert_eq!((prov.open_endpoint)(&*ep, self.port_ctx, &mut ctx), 0) };
        assert!(!ctx.is_null());
        self.eps.push(Endpoint {
            ep,
            ctx,
            addrs: Vec::new(),
        });
        let i = self.eps.len() - 1;
        self.add_addr(i, first_addr.0, first_addr.1);
        i
    }

    /// add_address with an acm_address that is scribbled over right after the call (the core
    /// reallocs its array), to prove the provider copied it.
    pub fn add_addr(&mut self, ep: usize, type_: u16, addr: &[u8]) -> *mut c_void {
        let prov = lib().prov;
        let mut info = AcmEpInfo { bytes: [0; 64] };
        info.bytes[..addr.len()].copy_from_slice(addr);
        let mut id = *b"addr-string\0";
        let mut a = Box::new(AcmAddress {
            endpoint: &*self.eps[ep].ep,
            info,
            id_string: id.as_mut_ptr() as *mut c_char,
            type_,
        });
        let mut ctx = std::ptr::null_mut();
        // SAFETY: as ibacm calls it.
        unsafe { assert_eq!((prov.add_address)(&*a, self.eps[ep].ctx, &mut ctx), 0) };
        assert!(!ctx.is_null());
        a.info.bytes = [0xAA; 64];
        a.type_ = 0x7777;
        id.fill(b'X');
        drop(a);
        self.eps[ep].addrs.push(ctx);
        ctx
    }

    pub fn remove_addr(&mut self, ep: usize, idx: usize) {
        let ctx = self.eps[ep].addrs.remove(idx);
        // SAFETY: as ibacm calls it.
        unsafe { (lib().prov.remove_address)(ctx) };
    }

    /// remove_address for each address, then close_endpoint, then free (acm_ep_down).
    pub fn close_ep(&mut self, ep: usize) {
        let prov = lib().prov;
        let e = self.eps.remove(ep);
        // SAFETY: as ibacm calls them.
        unsafe {
            for a in e.addrs {
                (prov.remove_address)(a);
            }
            (prov.close_endpoint)(e.ctx);
        }
        lock(&LIVE_ENDPOINTS).retain(|p| *p != &*e.ep as *const AcmEndpoint as usize);
        drop(e.ep);
    }

    /// acm_shutdown_port + close_device, as on port down.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        while !self.eps.is_empty() {
            self.close_ep(0);
        }
        let prov = lib().prov;
        // SAFETY: as ibacm calls them.
        unsafe {
            (prov.close_port)(self.port_ctx);
            (prov.close_device)(self.dev_ctx);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    pub fn tid(&mut self) -> u64 {
        self.next_tid += 1;
        0x5151_0000_0000 + self.next_tid
    }

    pub fn addr_ctx(&self, ep: usize) -> *mut c_void {
        self.eps[ep].addrs[0]
    }

    /// Calls resolve() with `msg` on endpoint `ep`'s first address; returns the return value.
    pub fn resolve(&self, ep: usize, msg: &AcmMsg, id: u64) -> c_int {
        let mut m = *msg;
        // SAFETY: as ibacm calls it; the buffer dies after the call (we scribble over it).
        let rc = unsafe { (lib().prov.resolve)(self.addr_ctx(ep), &mut m, id) };
        m = AcmMsg::zeroed();
        let _ = m;
        rc
    }

    pub fn query(&self, ep: usize, msg: &AcmMsg, id: u64) -> c_int {
        let mut m = *msg;
        // SAFETY: as ibacm calls it.
        unsafe { (lib().prov.query)(self.addr_ctx(ep), &mut m, id) }
    }

    pub fn perf(&self, ep: usize) -> [u64; 7] {
        let mut vals = [0u64; 72];
        let mut cnt = 0u8;
        // SAFETY: as ibacm calls it (values inside acm_msg data, cnt = &hdr.src_out).
        unsafe { (lib().prov.query_perf)(self.eps[ep].ctx, vals.as_mut_ptr(), &mut cnt) };
        assert_eq!(cnt, 7);
        let mut out = [0u64; 7];
        for i in 0..7 {
            out[i] = u64::from_be(vals[i]);
        }
        out
    }

    pub fn reregister(&self) {
        // SAFETY: as ibacm calls it.
        unsafe { (lib().prov.handle_event)(self.port_ctx, IBV_EVENT_CLIENT_REREGISTER) };
    }
}

pub fn uniq() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

/// A test that fails half-way still closes its instance, so later tests start clean.
impl Drop for Host {
    fn drop(&mut self) {
        self.shutdown();
    }
}

// ---- requests ------------------------------------------------------------------------------

pub fn path_request(tid: u64, dlid: u16, dgid: Option<[u8; 16]>, flags: u32) -> AcmMsg {
    let mut m = AcmMsg::zeroed();
    m.hdr.version = 1;
    m.hdr.opcode = ACM_OP_RESOLVE;
    m.hdr.length = 88;
    m.hdr.tid = tid;
    m.resolve_data[0].type_ = ACM_EP_INFO_PATH;
    m.resolve_data[0].flags = flags | ACM_EP_FLAG_DEST;
    let r = &mut m.resolve_data[0].info.bytes;
    r[40..42].copy_from_slice(&dlid.to_be_bytes());
    r[49] = 1; // reversible_numpath as ib_acme sends
    if let Some(g) = dgid {
        r[8..24].copy_from_slice(&g);
    }
    m
}

/// A dest request as the core hands it over: source first (src_out set), dest second.
pub fn dest_request(tid: u64, src: (u16, &[u8]), dst: (u16, &[u8]), flags: u32) -> AcmMsg {
    let mut m = AcmMsg::zeroed();
    m.hdr.version = 1;
    m.hdr.opcode = ACM_OP_RESOLVE;
    m.hdr.length = 16 + 2 * 72;
    m.hdr.tid = tid;
    m.hdr.data = [1, 0, 1];
    m.resolve_data[0].type_ = src.0;
    m.resolve_data[0].flags = ACM_EP_FLAG_SOURCE;
    m.resolve_data[0].info.bytes[..src.1.len()].copy_from_slice(src.1);
    m.resolve_data[1].type_ = dst.0;
    m.resolve_data[1].flags = ACM_EP_FLAG_DEST | flags;
    m.resolve_data[1].info.bytes[..dst.1.len()].copy_from_slice(dst.1);
    m
}

pub fn responses() -> Vec<Response> {
    lock(&RESPONSES).clone()
}

pub fn response_count() -> usize {
    lock(&RESPONSES).len()
}

pub fn log_contains(s: &str) -> bool {
    lock(&LOG).iter().any(|l| l.contains(s))
}

/// How many logged lines contain `s`.
pub fn log_count(s: &str) -> usize {
    lock(&LOG).iter().filter(|l| l.contains(s)).count()
}

/// Waits until at least `n` responses were recorded.
pub fn wait_responses(n: usize, timeout: Duration) -> bool {
    let t0 = Instant::now();
    while response_count() < n {
        if t0.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    true
}

pub fn find(tid: u64) -> Vec<Response> {
    lock(&RESPONSES)
        .iter()
        .filter(|r| r.msg.hdr.tid == tid)
        .cloned()
        .collect()
}

// ---- the fake SA ---------------------------------------------------------------------------

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

/// The fabric the fake SA knows: DLID 1..=n, GUID = 0x1000 + dlid.
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
        let guid = u64::from_be_bytes(req[16..24].try_into().unwrap());
        if req[8..16] != GID_PREFIX {
            return None;
        }
        if guid == OWN_GUID {
            own
        } else {
            // Any GUID above 0x1000 exists; LIDs wrap so 100k destinations fit.
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
    // Honour the constraints the query carried, like a real SA would.
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

pub fn sa_pending() -> usize {
    lock(&SA_QUEUE).len()
}

/// Completes the oldest held MAD with `action` (on the calling thread, as the core's SA
/// thread would). Returns false if none was queued.
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
        if i >= q.len() {
            return false;
        }
        q.remove(i).unwrap()
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
    // SAFETY: a MAD we queued in acm_send_sa_mad and nobody else holds.
    unsafe {
        let mad = &mut (*req).mad;
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
                let mask = u64::from_be_bytes(bytes[48..56].try_into().unwrap());
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
            SaAction::Hold => unreachable!(),
        }
        ((*req).handler)(mad);
    }
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
    pub fn start() -> AutoSa {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let t = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                if !sa_complete_next(SaAction::Answer) {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        });
        AutoSa { stop, t: Some(t) }
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

pub fn path_of(r: &Response) -> [u8; 64] {
    r.msg.resolve_data[0].info.bytes
}

pub fn dlid_of(r: &Response) -> u16 {
    let p = path_of(r);
    u16::from_be_bytes([p[40], p[41]])
}

/// Checks that no response tid appears twice and that every tid in `expected` has exactly one.
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
