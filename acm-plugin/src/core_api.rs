//! The ibacm core's helper functions, found at run time in the host executable.
//!
//! The real `ibacm` exports `acm_write`, `acm_alloc_sa_mad`, … from its own binary. We never
//! link or define them: [`CoreApi::resolve`] looks each one up with `dlsym(RTLD_DEFAULT)` and
//! reports the missing names, so `provider_query` can refuse to load with a clear message
//! instead of crashing at the first call.

use crate::ffi::{AcmEndpoint, AcmMsg, AcmPort, AcmSaMad};
use core::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// Completion handler passed to `acm_alloc_sa_mad`.
pub type SaHandler = unsafe extern "C" fn(*mut AcmSaMad);

/// `acm_write`.
pub type WriteFn = unsafe extern "C" fn(c_int, *const c_char, ...);
/// `acm_alloc_sa_mad`.
pub type AllocFn =
    unsafe extern "C" fn(*const AcmEndpoint, *mut c_void, SaHandler) -> *mut AcmSaMad;
/// `acm_send_sa_mad`.
pub type SendFn = unsafe extern "C" fn(*mut AcmSaMad) -> c_int;
/// `acm_free_sa_mad`.
pub type FreeFn = unsafe extern "C" fn(*mut AcmSaMad);
/// `acm_resolve_response` / `acm_query_response`.
pub type ResponseFn = unsafe extern "C" fn(u64, *mut AcmMsg) -> c_int;
/// `acm_get_opts_file`.
pub type OptsFileFn = unsafe extern "C" fn() -> *const c_char;
/// `acm_increment_counter`.
pub type CounterFn = unsafe extern "C" fn(c_int);
/// `acm_get_gid`.
pub type GetGidFn = unsafe extern "C" fn(*const AcmPort, c_int, *mut [u8; 16]) -> c_int;

/// Function pointers into the host.
#[derive(Clone, Copy)]
pub struct CoreApi {
    /// `void acm_write(int level, const char *fmt, ...)`; called only as `(level, "%s", text)`.
    pub write: WriteFn,
    /// `acm_alloc_sa_mad`.
    pub alloc_sa_mad: AllocFn,
    /// `acm_send_sa_mad`.
    pub send_sa_mad: SendFn,
    /// `acm_free_sa_mad`.
    pub free_sa_mad: FreeFn,
    /// `acm_resolve_response`.
    pub resolve_response: ResponseFn,
    /// `acm_query_response`.
    pub query_response: ResponseFn,
    /// `acm_get_opts_file`.
    pub get_opts_file: OptsFileFn,
    /// `acm_increment_counter`.
    pub increment_counter: CounterFn,
    /// `acm_get_gid`.
    pub get_gid: GetGidFn,
}

static API: OnceLock<CoreApi> = OnceLock::new();

fn sym(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no preconditions; a null
    // result means "absent" and is checked by the caller.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

macro_rules! lookup {
    ($missing:ident, $name:literal) => {{
        let p = sym($name);
        if p.is_null() {
            $missing.push($name.to_str().unwrap_or("?"));
        }
        p
    }};
}

impl CoreApi {
    /// Looks the helpers up (once). Returns the names that are missing.
    pub fn resolve() -> Result<&'static CoreApi, Vec<&'static str>> {
        if let Some(api) = API.get() {
            return Ok(api);
        }
        let mut missing = Vec::new();
        let write = lookup!(missing, c"acm_write");
        let alloc = lookup!(missing, c"acm_alloc_sa_mad");
        let send = lookup!(missing, c"acm_send_sa_mad");
        let free = lookup!(missing, c"acm_free_sa_mad");
        let rr = lookup!(missing, c"acm_resolve_response");
        let qr = lookup!(missing, c"acm_query_response");
        let opts = lookup!(missing, c"acm_get_opts_file");
        let inc = lookup!(missing, c"acm_increment_counter");
        let gid = lookup!(missing, c"acm_get_gid");
        if !missing.is_empty() {
            return Err(missing);
        }
        // SAFETY: every pointer is a non-null symbol of the host with the C signature declared
        // in acm_prov.h; function pointers and data pointers have the same size on the
        // platforms ibacm supports.
        let api = unsafe {
            CoreApi {
                write: core::mem::transmute::<*mut c_void, WriteFn>(write),
                alloc_sa_mad: core::mem::transmute::<*mut c_void, AllocFn>(alloc),
                send_sa_mad: core::mem::transmute::<*mut c_void, SendFn>(send),
                free_sa_mad: core::mem::transmute::<*mut c_void, FreeFn>(free),
                resolve_response: core::mem::transmute::<*mut c_void, ResponseFn>(rr),
                query_response: core::mem::transmute::<*mut c_void, ResponseFn>(qr),
                get_opts_file: core::mem::transmute::<*mut c_void, OptsFileFn>(opts),
                increment_counter: core::mem::transmute::<*mut c_void, CounterFn>(inc),
                get_gid: core::mem::transmute::<*mut c_void, GetGidFn>(gid),
            }
        };
        Ok(API.get_or_init(|| api))
    }

    /// The resolved helpers, if [`CoreApi::resolve`] succeeded before.
    pub fn get() -> Option<&'static CoreApi> {
        API.get()
    }

    /// Logs one line through `acm_write` at ibacm's level (0 basic, 1 verbose, 2 operation).
    pub fn log(&self, level: i32, text: &str) {
        let mut buf = [0u8; 512];
        let n = text.len().min(buf.len() - 2);
        buf[..n].copy_from_slice(&text.as_bytes()[..n]);
        for b in &mut buf[..n] {
            if *b == 0 {
                *b = b'?';
            }
        }
        buf[n] = b'\n';
        buf[n + 1] = 0;
        // SAFETY: "%s" with one NUL-terminated string argument matches acm_write's printf
        // contract; both strings outlive the call.
        unsafe { (self.write)(level, c"acmrs: %s".as_ptr(), buf.as_ptr() as *const c_char) };
    }

    /// Answers client `id` with `msg` through the helper `via` names
    /// (`acm_resolve_response` or `acm_query_response`); the core's return code.
    pub fn respond(&self, via: acm_core_nostd::resolver::Via, id: u64, msg: &mut AcmMsg) -> c_int {
        use acm_core_nostd::resolver::Via;
        let f = match via {
            Via::Resolve => self.resolve_response,
            Via::Query => self.query_response,
        };
        // SAFETY: `msg` is a full, initialised acm_msg the caller owns; the core copies it
        // before returning.
        unsafe { f(id, msg) }
    }

    /// `acm_increment_counter(which)`.
    pub fn count(&self, which: usize) {
        // SAFETY: plain C call with an in-range counter index (ACM_CNTR_*).
        unsafe { (self.increment_counter)(which as c_int) };
    }

    /// The opts file path, if the core gives one.
    pub fn opts_file(&self) -> Option<std::path::PathBuf> {
        // SAFETY: acm_get_opts_file returns a pointer to a static NUL-terminated string (or NULL).
        let p = unsafe { (self.get_opts_file)() };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated, lives for the process.
        let s = unsafe { CStr::from_ptr(p) };
        use std::os::unix::ffi::OsStrExt;
        Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(
            s.to_bytes(),
        )))
    }
}

/// Logs through the core if the helpers are known, else to stderr.
pub fn log(level: i32, text: &str) {
    match CoreApi::get() {
        Some(api) => api.log(level, text),
        None => eprintln!("acmrs: {text}"),
    }
}

/// Runs `f`, turning a panic into `on_panic` (logged): every `extern "C"` body the core or
/// libibverbs calls runs inside it, so no panic unwinds across the C ABI.
pub fn guard<R>(what: &str, on_panic: R, f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            log(0, &format!("ERROR - internal error (panic) in {what}"));
            on_panic
        }
    }
}
