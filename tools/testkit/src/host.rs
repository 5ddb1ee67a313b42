//! Loading `libacmrs.so` and driving it as ibacm does: one device, one port, endpoints with
//! addresses, `resolve()` / `query()` / `query_perf()` / `handle_event()` calls.

use crate::core::{
    self, barrier_answers, endpoint_live, reset_counters, sa_drain_timeouts, wait_for, BARRIER_TID,
};
use crate::request::{dest_request, path_request};
use acmrs::ffi::*;
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// The provider under test.
pub struct Lib {
    /// Its table.
    pub prov: &'static AcmProvider,
    /// Where it was loaded from.
    pub path: PathBuf,
}

static LIB: OnceLock<Lib> = OnceLock::new();

/// `libacmrs.so` next to a test executable (`target/<profile>/deps/<test>` →
/// `target/<profile>/libacmrs.so`), refused when older than the sources it is built from
/// (`cargo test` does not relink the cdylib).
pub fn test_so_path() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let p = dir.join("libacmrs.so");
    assert!(
        p.exists(),
        "{} missing: run `cargo build -p acm-plugin`",
        p.display()
    );
    let so_time = std::fs::metadata(&p)
        .and_then(|m| m.modified())
        .expect("mtime");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for dir in [
        "acm-plugin/src",
        "acm-dataplane/src",
        "acm-core-nostd/src/resolver",
    ] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for f in entries.flatten() {
            let t = f.metadata().and_then(|m| m.modified()).expect("mtime");
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

/// `dlopen`s the provider library at `path` (`RTLD_NOW | RTLD_LOCAL`, never closed) and
/// returns its table, checked as the core checks it (`provider_query` returns 0, version 1,
/// table size 120). Any number of providers may be opened this way.
pub fn provider_table(path: &Path) -> Result<&'static AcmProvider, String> {
    let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: plain dlopen of a NUL-terminated path; the handle is kept for the process.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a static string or null.
        let e = unsafe { libc::dlerror() };
        let e = if e.is_null() {
            "?".into()
        } else {
            // SAFETY: non-null NUL-terminated string from dlerror.
            unsafe { std::ffi::CStr::from_ptr(e) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(format!("dlopen {}: {e}", path.display()));
    }
    // SAFETY: symbol lookup in a live handle with a NUL-terminated name.
    let sym = unsafe { libc::dlsym(h, c"provider_query".as_ptr()) };
    if sym.is_null() {
        return Err(format!("{}: no provider_query", path.display()));
    }
    type Pq = unsafe extern "C" fn(*mut *const AcmProvider, *mut u32) -> c_int;
    // SAFETY: provider_query has this signature (acm_prov.h).
    let pq: Pq = unsafe { std::mem::transmute::<*mut c_void, Pq>(sym) };
    let mut prov: *const AcmProvider = std::ptr::null();
    let mut version = 0u32;
    // SAFETY: valid out-pointers.
    let rc = unsafe { pq(&mut prov, &mut version) };
    if rc != 0 || version != ACM_PROV_VERSION || prov.is_null() {
        return Err(format!(
            "{}: provider_query rc {rc}, version {version} (does the host export the core \
             helpers?)",
            path.display()
        ));
    }
    // SAFETY: a static table inside the library, which is never unloaded.
    let prov = unsafe { &*prov };
    if prov.size != std::mem::size_of::<AcmProvider>() {
        return Err(format!(
            "{}: provider table size {}",
            path.display(),
            prov.size
        ));
    }
    Ok(prov)
}

/// Loads `libacmrs.so` from `path` for [`Host`] (once per process: later calls return the
/// first one), after [`core::link`]: the fake core must be what it binds to.
pub fn load(path: &Path) -> Result<&'static Lib, String> {
    if let Some(l) = LIB.get() {
        return Ok(l);
    }
    core::link();
    let prov = provider_table(path)?;
    Ok(LIB.get_or_init(|| Lib {
        prov,
        path: path.to_path_buf(),
    }))
}

/// The provider next to the test executable ([`test_so_path`]); panics if it cannot load.
pub fn lib() -> &'static Lib {
    load(&test_so_path()).unwrap_or_else(|e| panic!("{e}"))
}

/// The address of a test hook of the debug `libacmrs.so`; panics if the loaded library has
/// none (a release build).
fn debug_hook(name: &'static std::ffi::CStr, cell: &'static OnceLock<Option<usize>>) -> usize {
    let hook = cell.get_or_init(|| {
        let c = CString::new(lib_of().path.to_string_lossy().as_bytes()).ok()?;
        // SAFETY: looks up the library `load` already opened (RTLD_NOLOAD: no second load);
        // the handle stays open for the process, like the first one.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if h.is_null() {
            return None;
        }
        // SAFETY: symbol lookup in a live handle with a NUL-terminated name.
        let sym = unsafe { libc::dlsym(h, name.as_ptr()) };
        (!sym.is_null()).then_some(sym as usize)
    });
    hook.unwrap_or_else(|| {
        panic!(
            "{} exports no {name:?} (a release build?)",
            lib_of().path.display()
        )
    })
}

/// The debug provider's virtual clock (`acmrs_test_advance_clock`, exported by debug builds of
/// `libacmrs.so` only): moves the clock of its dataplane worker `d` ahead of real time and
/// returns once the worker observed it (its coarse clock, its poll rounds' `now` and timers).
/// Routes expire, enter their refresh window, SA retries and deadlines fire as if `d` had
/// passed, without sleeping. Panics if the loaded library has no such hook (a release build)
/// or the worker did not observe the move.
pub fn advance_clock(d: Duration) {
    static HOOK: OnceLock<Option<usize>> = OnceLock::new();
    let sym = debug_hook(c"acmrs_test_advance_clock", &HOOK);
    // SAFETY: the hook has this signature (acm-plugin/src/lib.rs).
    let hook = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(u64) -> c_int>(sym) };
    let ms = u64::try_from(d.as_millis()).expect("advance in range");
    // SAFETY: plain call of the library's hook with a value.
    let rc = unsafe { hook(ms) };
    assert_eq!(rc, 0, "the dataplane did not observe the clock advance");
}

/// The debug provider's stuck dataplane (`acmrs_test_stall`): its worker stops running for
/// `d`, as a thread stuck in the kernel would, inside a round with the loop's lock held
/// (`in_round`: no round runs anywhere) or between rounds (rounds still run on the threads
/// that bring work, and on the watchdog's); returns once it has stopped.
pub fn stall_dataplane(d: Duration, in_round: bool) {
    static HOOK: OnceLock<Option<usize>> = OnceLock::new();
    let sym = debug_hook(c"acmrs_test_stall", &HOOK);
    // SAFETY: the hook has this signature (acm-plugin/src/lib.rs).
    let hook =
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(u64, c_int) -> c_int>(sym) };
    let ms = u64::try_from(d.as_millis()).expect("stall in range");
    // SAFETY: plain call of the library's hook with two values.
    let rc = unsafe { hook(ms, c_int::from(in_round)) };
    assert_eq!(rc, 0, "the dataplane did not stop");
}

/// Serialises tests: the provider instance is process-wide.
pub fn serial() -> MutexGuard<'static, ()> {
    static S: Mutex<()> = Mutex::new(());
    core::lock(&S)
}

/// A process-unique number.
pub fn uniq() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

/// One endpoint the fake core opened.
pub struct Endpoint {
    /// The core's endpoint object (stable while open).
    pub ep: Box<AcmEndpoint>,
    /// The provider's context.
    pub ctx: *mut c_void,
    /// The provider's address contexts, in `add_address` order.
    pub addrs: Vec<*mut c_void>,
}

/// One fake device and port with its endpoints, opened on the provider as ibacm does.
pub struct Host {
    /// The core's device.
    pub device: Box<AcmDevice>,
    /// The core's port.
    pub port: Box<AcmPort>,
    /// The provider's device context.
    pub dev_ctx: *mut c_void,
    /// The provider's port context.
    pub port_ctx: *mut c_void,
    /// Open endpoints (indices shift on [`Host::close_ep`]).
    pub eps: Vec<Endpoint>,
    /// The scratch directory (`$DIR` in the options).
    pub dir: PathBuf,
    /// The last tid handed out by [`Host::tid`].
    pub next_tid: u64,
    barrier: Option<Endpoint>,
    closed: bool,
}

/// How long tests wait for something that must happen.
pub const W: Duration = Duration::from_secs(10);

impl Host {
    /// Writes `opts` (with `$DIR` replaced by a fresh scratch directory, plus `extra_files`
    /// there) as the opts file and opens device and port. Without an explicit `addr_prot` the
    /// endpoints run `addr_prot none`: this core has no verbs device (the ACM protocol is
    /// tested on the simulated fabric with the real daemon); without an explicit
    /// `acmrs_stat_socket`, no stats socket is served (these tests share the machine's /run).
    pub fn open(opts: &str, extra_files: &[(&str, &str)]) -> Host {
        Self::open_with(lib(), opts, extra_files)
    }

    /// [`Host::open`] on an already loaded provider.
    pub fn open_with(lib: &Lib, opts: &str, extra_files: &[(&str, &str)]) -> Host {
        // A failed test may leave MADs behind: time them out so tests stay independent.
        sa_drain_timeouts();
        core::fake_verbs(true);
        core::log_to_stderr(std::env::var_os("ACMRS_TEST_LOG").is_some());
        let dir =
            std::env::temp_dir().join(format!("acmrs-host-{}-{}", std::process::id(), uniq()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        for (name, text) in extra_files {
            std::fs::write(dir.join(name), text).expect("extra file");
        }
        let mut opts = opts.replace("$DIR", &dir.to_string_lossy());
        if !opts.contains("addr_prot") {
            opts = format!("{opts}\naddr_prot none\n");
        }
        // Tests run in the machine's own /run: no stats socket there unless a test asks.
        if !opts.contains("acmrs_stat_socket") {
            opts = format!("{opts}\nacmrs_stat_socket none\n");
        }
        let opts_path = dir.join("ibacm_opts.cfg");
        std::fs::write(&opts_path, opts).expect("opts file");
        core::set_opts_file(&opts_path);
        reset_counters();
        let prov = lib.prov;
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
        // SAFETY: the provider ABI with valid, stable core objects, as ibacm calls it.
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
            barrier: None,
            closed: false,
        }
    }

    fn new_ep(&self, pkey: u16) -> Endpoint {
        let prov = lib_of().prov;
        let ep = Box::new(AcmEndpoint {
            port: &*self.port,
            pkey,
        });
        endpoint_live(&*ep, true);
        let mut ctx = std::ptr::null_mut();
        // SAFETY: as ibacm calls it, with the core's stable endpoint object.
        unsafe { assert_eq!((prov.open_endpoint)(&*ep, self.port_ctx, &mut ctx), 0) };
        assert!(!ctx.is_null());
        Endpoint {
            ep,
            ctx,
            addrs: Vec::new(),
        }
    }

    /// Opens an endpoint with its first address (the core opens endpoints lazily, at the first
    /// address). Returns its index in [`Host::eps`].
    pub fn open_ep(&mut self, pkey: u16, first_addr: (u16, &[u8])) -> usize {
        let e = self.new_ep(pkey);
        self.eps.push(e);
        let i = self.eps.len() - 1;
        self.add_addr(i, first_addr.0, first_addr.1);
        i
    }

    /// `add_address` with an `acm_address` that is scribbled over right after the call (the
    /// core reallocs its array), to prove the provider copied it.
    pub fn add_addr(&mut self, ep: usize, type_: u16, addr: &[u8]) -> *mut c_void {
        let ctx = add_address(&self.eps[ep], type_, addr);
        self.eps[ep].addrs.push(ctx);
        ctx
    }

    /// `remove_address` of the `idx`-th address of `ep`.
    pub fn remove_addr(&mut self, ep: usize, idx: usize) {
        let ctx = self.eps[ep].addrs.remove(idx);
        // SAFETY: as ibacm calls it, with a context the provider gave us.
        unsafe { (lib_of().prov.remove_address)(ctx) };
    }

    /// `remove_address` for each address, then `close_endpoint`, then the core frees its
    /// endpoint (`acm_ep_down`).
    pub fn close_ep(&mut self, ep: usize) {
        let e = self.eps.remove(ep);
        close_endpoint(e);
    }

    /// `acm_shutdown_port` + `close_device`, as on port down.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        if let Some(b) = self.barrier.take() {
            close_endpoint(b);
        }
        while !self.eps.is_empty() {
            self.close_ep(0);
        }
        let prov = lib_of().prov;
        // SAFETY: as ibacm calls them, with the contexts the provider gave us.
        unsafe {
            (prov.close_port)(self.port_ctx);
            (prov.close_device)(self.dev_ctx);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// A fresh tid.
    pub fn tid(&mut self) -> u64 {
        self.next_tid += 1;
        0x5151_0000_0000 + self.next_tid
    }

    /// The first address context of endpoint `ep` (what the core passes to `resolve()`).
    pub fn addr_ctx(&self, ep: usize) -> *mut c_void {
        self.eps[ep].addrs[0]
    }

    /// `resolve()` with a copy of `msg` on endpoint `ep`; the copy is scribbled over after the
    /// call (the core frees its buffer). Returns the return value.
    pub fn resolve(&self, ep: usize, msg: &AcmMsg, id: u64) -> c_int {
        call(lib_of().prov.resolve, self.addr_ctx(ep), msg, id)
    }

    /// `query()`, as [`Host::resolve`].
    pub fn query(&self, ep: usize, msg: &AcmMsg, id: u64) -> c_int {
        call(lib_of().prov.query, self.addr_ctx(ep), msg, id)
    }

    /// `query_perf()` of endpoint `ep`: the 7 counters, host order.
    pub fn perf(&self, ep: usize) -> [u64; 7] {
        perf(&self.eps[ep])
    }

    /// `handle_event(IBV_EVENT_CLIENT_REREGISTER)` on the port.
    pub fn reregister(&self) {
        // SAFETY: as ibacm calls it.
        unsafe { (lib_of().prov.handle_event)(self.port_ctx, IBV_EVENT_CLIENT_REREGISTER) };
    }

    /// Waits until the dataplane has taken in everything handed to it before this call
    /// (requests and endpoint/address changes; not SA replies): a request it answers itself
    /// (an unknown name on a separate endpoint of its own, answered ENODATA with no SA or ACM
    /// traffic) goes through the same FIFO, so its answer comes after every earlier request
    /// was fed to the resolver and its outputs carried out. Barrier answers are not recorded
    /// as responses nor counted by the core. Needs `addr_prot none` (the default here).
    pub fn barrier(&mut self) {
        if self.barrier.is_none() {
            let b = self.new_ep(0x7ffe);
            let ctx = add_address(&b, ACM_ADDRESS_NAME, b"barrier");
            let mut b = b;
            b.addrs.push(ctx);
            self.barrier = Some(b);
        }
        let b = self
            .barrier
            .as_ref()
            .map_or(std::ptr::null_mut(), |b| b.addrs[0]);
        let before = barrier_answers();
        let m = dest_request(
            BARRIER_TID + uniq(),
            (ACM_ADDRESS_NAME, b"barrier"),
            (ACM_ADDRESS_NAME, b"no-such-barrier-name"),
            0,
        );
        call(lib_of().prov.resolve, b, &m, 0);
        assert!(
            wait_for(W, || barrier_answers() > before),
            "the dataplane did not answer the barrier"
        );
    }
}

/// A test that fails half-way still closes its instance, so later tests start clean.
impl Drop for Host {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn lib_of() -> &'static Lib {
    LIB.get().expect("provider loaded")
}

fn add_address(e: &Endpoint, type_: u16, addr: &[u8]) -> *mut c_void {
    let mut info = AcmEpInfo { bytes: [0; 64] };
    let n = addr.len().min(64);
    info.bytes[..n].copy_from_slice(&addr[..n]);
    let mut id = *b"addr-string\0";
    let mut a = Box::new(AcmAddress {
        endpoint: &*e.ep,
        info,
        id_string: id.as_mut_ptr() as *mut c_char,
        type_,
    });
    let mut ctx = std::ptr::null_mut();
    // SAFETY: as ibacm calls it; the address object lives across the call.
    unsafe { assert_eq!((lib_of().prov.add_address)(&*a, e.ctx, &mut ctx), 0) };
    assert!(!ctx.is_null());
    a.info.bytes = [0xAA; 64];
    a.type_ = 0x7777;
    id.fill(b'X');
    drop(a);
    ctx
}

fn close_endpoint(e: Endpoint) {
    let prov = lib_of().prov;
    // SAFETY: as ibacm calls them (acm_ep_down), with the provider's contexts.
    unsafe {
        for a in e.addrs {
            (prov.remove_address)(a);
        }
        (prov.close_endpoint)(e.ctx);
    }
    endpoint_live(&*e.ep, false);
    drop(e.ep);
}

fn perf(e: &Endpoint) -> [u64; 7] {
    let mut vals = [0u64; 72];
    let mut cnt = 0u8;
    // SAFETY: as ibacm calls it (values inside acm_msg data, cnt = &hdr.src_out).
    unsafe { (lib_of().prov.query_perf)(e.ctx, vals.as_mut_ptr(), &mut cnt) };
    assert_eq!(cnt, 7);
    let mut out = [0u64; 7];
    for (o, v) in out.iter_mut().zip(vals) {
        *o = u64::from_be(v);
    }
    out
}

type ClientCall = unsafe extern "C" fn(*mut c_void, *mut AcmMsg, u64) -> c_int;

fn call(f: ClientCall, ctx: *mut c_void, msg: &AcmMsg, id: u64) -> c_int {
    let mut m = *msg;
    // SAFETY: as ibacm calls it: our address context and a full message buffer that dies
    // after the call (we scribble over it).
    let rc = crate::core::inside(crate::core::Inside::ClientCall, || unsafe {
        f(ctx, &mut m, id)
    });
    m = AcmMsg::zeroed();
    std::hint::black_box(&m);
    rc
}

/// A PATH request on the fake fabric by DLID (shorthand for the tests).
pub fn lid_request(tid: u64, dlid: u16) -> AcmMsg {
    path_request(tid, dlid, None, 0)
}
