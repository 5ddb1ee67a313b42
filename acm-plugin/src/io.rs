//! The dataplane's [`CoreIo`] over the ibacm core's helpers: SA MADs through the core's SA
//! service (`acm_alloc_sa_mad` / `acm_send_sa_mad`, completions on the core's SA thread),
//! client answers through `acm_resolve_response` / `acm_query_response`, counters, logs.

use crate::core_api::CoreApi;
use crate::ffi::{AcmEndpoint, AcmMsg, AcmSaMad};
use crate::instance::{lock, Ep, Instance, LogReason};
use acm_core_nostd::resolver::{Answer, Counter, EpId};
use acm_dataplane::plane::{CoreIo, SaReply};
use core::ffi::c_void;
use std::sync::{Arc, OnceLock, Weak};

/// The instance the SA completion handler hands replies to (the handler is a plain C
/// function; the core gives it only the MAD).
static CURRENT: OnceLock<std::sync::Mutex<Weak<Instance>>> = OnceLock::new();

/// Makes `inst` the target of SA completions (at instance creation).
pub fn set_reply_target(inst: &Arc<Instance>) {
    let m = CURRENT.get_or_init(|| std::sync::Mutex::new(Weak::new()));
    *lock(m) = Arc::downgrade(inst);
}

fn reply_target() -> Option<Arc<Instance>> {
    CURRENT.get().and_then(|m| lock(m).upgrade())
}

/// The dataplane's IO towards the core.
pub struct PluginIo {
    inst: Arc<Instance>,
    /// A copy of the endpoint registry, refreshed when its version changes.
    eps: Vec<Option<Arc<Ep>>>,
    version: u64,
}

impl PluginIo {
    /// IO for `inst`.
    pub fn new(inst: Arc<Instance>) -> Self {
        PluginIo {
            eps: inst.eps.snapshot(),
            version: inst.eps.version(),
            inst,
        }
    }

    fn ep(&mut self, id: EpId) -> Option<Arc<Ep>> {
        let v = self.inst.eps.version();
        if v != self.version {
            self.eps = self.inst.eps.snapshot();
            self.version = v;
        }
        self.eps.get(id.index()).cloned().flatten()
    }
}

impl CoreIo for PluginIo {
    fn send_sa(&mut self, ep: EpId, token: u64, mad: &[u8; 256]) -> bool {
        let Some(ep) = self.ep(ep) else {
            return false;
        };
        let api = self.inst.api;
        // Held across the send: close_endpoint nulls the pointer under this lock, so the core's
        // endpoint cannot go away while we use it.
        let guard = lock(&ep.endpoint);
        let endpoint = *guard as *const AcmEndpoint;
        if endpoint.is_null() {
            return false;
        }
        // SAFETY: `endpoint` is the core's live acm_endpoint (see above); the context is an
        // integer token, never dereferenced.
        let m = unsafe { (api.alloc_sa_mad)(endpoint, token as usize as *mut c_void, sa_handler) };
        if m.is_null() {
            return false;
        }
        // SAFETY: `m` is a valid acm_sa_mad the core just allocated for us; we own it until
        // acm_send_sa_mad succeeds (then the core owns it until it calls our handler).
        unsafe {
            (*m).sa_mad.bytes = *mad;
            if (api.send_sa_mad)(m) != 0 {
                (api.free_sa_mad)(m);
                return false;
            }
        }
        true
    }

    fn answer(&mut self, a: &Answer) {
        let api = self.inst.api;
        let mut msg = AcmMsg::zeroed();
        msg.as_bytes_mut().copy_from_slice(&a.msg);
        let rc = api.respond(a.via, a.client, &mut msg);
        if rc != 0 && self.inst.log_enabled(1) {
            // On the answer path, maybe in a flood: formatted on the stack, no allocation.
            let mut line = Line::new();
            api.log(1, undelivered(&mut line, a.client, rc));
        }
    }

    fn count(&mut self, ep: EpId, counter: Counter) {
        let api = self.inst.api;
        if let Some(ep) = self.ep(ep) {
            ep.count_global(crate::instance::Writer::Plane, api, counter);
        }
    }

    fn log(&mut self, level: u8, text: &str) {
        if self.inst.log_enabled(level) {
            self.inst.api.log(i32::from(level), text);
        }
    }

    fn log_enabled(&self, level: u8) -> bool {
        self.inst.log_enabled(level)
    }
}

/// A log line formatted into a fixed stack buffer ([`core::fmt::Write`]), cut at
/// [`Line::CAP`] bytes (on a character boundary): formatting into it never allocates.
struct Line {
    buf: [u8; Line::CAP],
    len: usize,
}

impl Line {
    /// Bytes kept; the rest of a longer line is dropped.
    const CAP: usize = 96;

    fn new() -> Self {
        Line {
            buf: [0; Line::CAP],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        // Only whole characters are ever copied in (see `write_str`).
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl core::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let room = Line::CAP - self.len;
        let mut n = s.len().min(room);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// The line logged when the core refused a client's answer (`rc` from
/// `acm_resolve_response`/`acm_query_response`), formatted into `line`.
fn undelivered(line: &mut Line, client: u64, rc: i32) -> &str {
    use core::fmt::Write;
    let _ = write!(line, "client {client} answer not delivered ({rc})");
    line.as_str()
}

/// The SA completion handler given to `acm_alloc_sa_mad` (the core's SA thread): copy the
/// reply, free the MAD, hand the copy to the dataplane. Nothing else runs here.
///
/// # Safety
/// `mad` must be null or an `acm_sa_mad` the core allocated for us and completed (it is freed
/// here, once).
pub unsafe extern "C" fn sa_handler(mad: *mut AcmSaMad) {
    crate::core_api::guard("sa_handler", (), || {
        let Some(api) = CoreApi::get() else {
            return;
        };
        if mad.is_null() {
            return;
        }
        let token = {
            // SAFETY: the core passes the acm_sa_mad it allocated for us; it stays valid until
            // we free it below, and nobody else touches it meanwhile.
            unsafe { (*mad).context as usize as u64 }
        };
        if let Some(inst) = reply_target() {
            let handed = inst.clock.now();
            // Copied straight into the loop's buffer (or queue slot).
            let queued = inst.inbox.reply_with(|| {
                // SAFETY: as above; the MAD is read before it is freed below.
                let (umad_status, bytes) = unsafe { ((*mad).umad.status, (*mad).sa_mad.bytes) };
                SaReply {
                    token,
                    umad_status,
                    mad: bytes,
                    handed,
                }
            });
            if !queued {
                inst.log_limited(
                    LogReason::ReplyDrop,
                    "ERROR - SA reply queue full; the request will time out",
                );
            }
        }
        // SAFETY: the handler owns the MAD after completion and frees it exactly once (here).
        unsafe { (api.free_sa_mad)(mad) };
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// [`System`], counting the allocations of each thread while it is armed.
    struct Counting;

    thread_local! {
        /// `Some(n)`: armed, `n` allocations so far.
        static ALLOCS: Cell<Option<u64>> = const { Cell::new(None) };
    }

    fn note_alloc() {
        let _ = ALLOCS.try_with(|c| {
            if let Some(n) = c.get() {
                c.set(Some(n + 1));
            }
        });
    }

    // SAFETY: every call is forwarded to `System` unchanged; the counter is a
    // const-initialized thread-local `Cell` without a destructor, so touching it never
    // allocates or re-enters.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note_alloc();
            // SAFETY: the caller's contract is System's.
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            note_alloc();
            // SAFETY: as above.
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            note_alloc();
            // SAFETY: as above.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: as above.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// The allocations `f` makes on this thread.
    fn allocations<R>(f: impl FnOnce() -> R) -> (R, u64) {
        ALLOCS.with(|c| c.set(Some(0)));
        let r = f();
        let n = ALLOCS.with(|c| c.replace(None)).unwrap_or(0);
        (r, n)
    }

    #[test]
    fn undelivered_answer_line_does_not_allocate() {
        let mut line = Line::new();
        let (len, n) = allocations(|| undelivered(&mut line, u64::MAX, -32).len());
        assert_eq!(n, 0, "the line allocated {n} times");
        assert_eq!(
            &line.as_str()[..len],
            "client 18446744073709551615 answer not delivered (-32)"
        );
        // The counter itself counts: what the line was before.
        let (_, boxed) = allocations(|| format!("client {} answer not delivered", 7));
        assert!(boxed > 0);
    }

    #[test]
    fn a_long_line_is_cut_on_a_character_boundary() {
        use core::fmt::Write;
        let mut line = Line::new();
        let _ = write!(line, "{}", "x".repeat(Line::CAP - 1));
        let _ = line.write_str("\u{e9}\u{e9}");
        assert_eq!(line.as_str().len(), Line::CAP - 1);
        let _ = line.write_str("y");
        assert_eq!(line.as_str().len(), Line::CAP);
        assert!(line.as_str().ends_with('y'));
    }
}
