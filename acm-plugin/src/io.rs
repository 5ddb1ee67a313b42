//! The dataplane's [`CoreIo`] over the ibacm core's helpers: SA MADs through the core's SA
//! service (`acm_alloc_sa_mad` / `acm_send_sa_mad`, completions on the core's SA thread),
//! client answers through `acm_resolve_response` / `acm_query_response`, counters, logs.

use crate::core_api::CoreApi;
use crate::ffi::{AcmEndpoint, AcmMsg, AcmSaMad};
use crate::instance::{lock, Ep, Instance, LogReason};
use acm_core_nostd::resolver::{Answer, Counter, EpId, MsgBuf};
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

    fn answer(&mut self, a: &Answer, msg: &mut MsgBuf) {
        let api = self.inst.api;
        let rc = api.respond(a.via, a.client, AcmMsg::in_buf(msg));
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

/// A log line on the stack: formatting into it never allocates (a longer line is cut).
type Line = heapless::String<96>;

/// The line logged when the core refused a client's answer (`rc` from
/// `acm_resolve_response`/`acm_query_response`), formatted into `line`.
fn undelivered(line: &mut Line, client: u64, rc: i32) -> &str {
    use core::fmt::Write;
    // Fits: at most 62 bytes (a u64 and an i32 in full).
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
    use acm_dataplane::count_allocs::{allocations, CountingAlloc};

    #[global_allocator]
    static COUNTING: CountingAlloc = CountingAlloc;

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
}
