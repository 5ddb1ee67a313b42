//! Completion queues and completion channels.
//!
//! A CQ is a bounded queue of completions. `req_notify_cq` arms it; the next completion added
//! to an armed CQ disarms it and queues a completion event on its channel, whose `fd` (the
//! read end of a pipe) becomes readable; `ibv_get_cq_event` blocks on that fd like the kernel
//! one. A completion that finds the CQ full is lost and the CQ reports `IBV_EVENT_CQ_ERR`
//! through the context's async events (once), as on hardware; from then on the CQ is in the
//! error state and every later completion is lost too (the queued ones can still be polled).

use crate::device::{context_state, ContextState, EventElement};
use crate::{guard, set_errno};
use rdma_sys::*;
use std::collections::VecDeque;
use std::os::raw::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Largest CQ we accept.
pub const MAX_CQE: u32 = 65536;

const CQ_MAGIC: u64 = 0x5349_4d56_4351_3031; // "SIMVCQ01"
const CH_MAGIC: u64 = 0x5349_4d56_4348_3031; // "SIMVCH01"

/// One work completion, in our own form (copied into `ibv_wc` by `poll_cq`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
    /// Immediate data as it travelled (network byte order value), if any.
    pub imm: Option<u32>,
    pub qp_num: u32,
    pub src_qp: u32,
    pub grh: bool,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
    pub solicited: bool,
}

/// How a CQ is armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arm {
    Off,
    Any,
    Solicited,
}

struct CqQueue {
    entries: VecDeque<Completion>,
    capacity: usize,
    arm: Arm,
    overflowed: bool,
}

/// A completion channel's shared state.
pub struct ChannelInner {
    rd: c_int,
    wr: c_int,
    /// CQ pointers with a pending completion event, in order.
    pending: Mutex<VecDeque<usize>>,
    /// CQs created on this channel and not yet destroyed.
    cqs: AtomicUsize,
}

impl ChannelInner {
    fn notify(&self, cq: usize) {
        if let Ok(mut p) = self.pending.lock() {
            p.push_back(cq);
        }
        let b = [1u8];
        // SAFETY: `wr` is our open, non-blocking pipe write end; the buffer is 1 byte.
        unsafe { libc::write(self.wr, b.as_ptr() as *const c_void, 1) };
    }
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: both ends were opened by ibv_create_comp_channel and are closed once.
        unsafe {
            libc::close(self.rd);
            libc::close(self.wr);
        }
    }
}

/// A CQ's shared state (QPs hold an `Arc` to the CQs they complete into).
pub struct CqInner {
    queue: Mutex<CqQueue>,
    channel: Option<Arc<ChannelInner>>,
    ctx: Arc<ContextState>,
    /// The C `ibv_cq` pointer, for events.
    cq_ptr: AtomicUsize,
}

impl CqInner {
    /// Adds a completion; on overflow the completion is lost, `IBV_EVENT_CQ_ERR` is raised and
    /// the CQ stays in error (later completions are lost as well).
    pub fn push(&self, c: Completion) {
        let cq = self.cq_ptr.load(Ordering::Acquire);
        let (notify, overflow) = {
            let Ok(mut q) = self.queue.lock() else { return };
            if q.overflowed || q.entries.len() >= q.capacity {
                // Overrun: the CQ is in the error state from now on, as on hardware; it
                // takes no more completions (those already queued can still be polled).
                let first = !q.overflowed;
                q.overflowed = true;
                (false, first)
            } else {
                q.entries.push_back(c);
                let fire = match q.arm {
                    Arm::Off => false,
                    Arm::Any => true,
                    Arm::Solicited => c.solicited || c.status != 0,
                };
                if fire {
                    q.arm = Arm::Off;
                }
                (fire, false)
            }
        };
        if overflow {
            crate::debug(format_args!("CQ {cq:#x} overrun"));
            self.ctx
                .post_event(ibv_event_type::IBV_EVENT_CQ_ERR, EventElement::Cq(cq));
        }
        if notify {
            if let Some(ch) = &self.channel {
                ch.notify(cq);
            }
        }
    }
}

/// Our `ibv_cq`.
#[repr(C)]
pub struct SimCq {
    pub cq: ibv_cq,
    magic: u64,
    pub inner: Arc<CqInner>,
}

impl SimCq {
    /// Resolves a C pointer we handed out; `None` (errno EINVAL) otherwise.
    ///
    /// # Safety
    /// `p` must be NULL or a pointer returned by [`ibv_create_cq`] and not yet destroyed.
    pub unsafe fn from_ptr<'a>(p: *mut ibv_cq) -> Option<&'a SimCq> {
        // SAFETY: this function's contract is resolve's contract for this type.
        unsafe { crate::resolve_or_einval(p, |s: &SimCq| s.magic, CQ_MAGIC) }
    }
}

/// Our `ibv_comp_channel`.
#[repr(C)]
pub struct SimChannel {
    pub ch: ibv_comp_channel,
    magic: u64,
    inner: Arc<ChannelInner>,
}

impl SimChannel {
    /// # Safety
    /// `p` must be NULL or a pointer returned by [`ibv_create_comp_channel`], not destroyed.
    unsafe fn from_ptr<'a>(p: *mut ibv_comp_channel) -> Option<&'a SimChannel> {
        // SAFETY: this function's contract is resolve's contract for this type.
        unsafe { crate::resolve(p, |s: &SimChannel| s.magic, CH_MAGIC) }
    }
}

/// Installs the CQ entry points in a context's ops table.
pub fn fill_ops(ops: &mut ibv_context_ops) {
    ops.poll_cq = Some(sim_poll_cq);
    ops.req_notify_cq = Some(sim_req_notify_cq);
}

/// `ibv_create_comp_channel`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(std::ptr::null_mut(), || {
        // SAFETY: verbs contract: context came from ibv_open_device.
        if unsafe { context_state(context) }.is_none() {
            return std::ptr::null_mut();
        }
        let mut fds = [0 as c_int; 2];
        // SAFETY: `fds` has room for two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: fds[1] is a descriptor we own; the writer must never block.
        unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) };
        let ch = Box::new(SimChannel {
            ch: ibv_comp_channel {
                context,
                fd: fds[0],
                refcnt: 0,
            },
            magic: CH_MAGIC,
            inner: Arc::new(ChannelInner {
                rd: fds[0],
                wr: fds[1],
                pending: Mutex::new(VecDeque::new()),
                cqs: AtomicUsize::new(0),
            }),
        });
        Box::into_raw(ch) as *mut ibv_comp_channel
    })
}

/// `ibv_destroy_comp_channel`: EBUSY while CQs still use it.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: channel came from ibv_create_comp_channel.
        let Some(ch) = (unsafe { SimChannel::from_ptr(channel) }) else {
            return libc::EINVAL;
        };
        if ch.inner.cqs.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        // SAFETY: checked live SimChannel allocated by Box; the caller gives it up.
        let mut b = unsafe { Box::from_raw(channel as *mut SimChannel) };
        b.magic = 0;
        drop(b);
        0
    })
}

/// `ibv_create_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard(std::ptr::null_mut(), || {
        // SAFETY: verbs contract: context came from ibv_open_device.
        let Some(sc) = (unsafe { context_state(context) }) else {
            return std::ptr::null_mut();
        };
        if cqe < 1
            || cqe as u32 > MAX_CQE
            || comp_vector < 0
            || comp_vector >= sc.ctx.num_comp_vectors
        {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let chan = if channel.is_null() {
            None
        } else {
            // SAFETY: verbs contract: channel came from ibv_create_comp_channel.
            match unsafe { SimChannel::from_ptr(channel) } {
                Some(c) => {
                    c.inner.cqs.fetch_add(1, Ordering::AcqRel);
                    Some(c.inner.clone())
                }
                None => {
                    set_errno(libc::EINVAL);
                    return std::ptr::null_mut();
                }
            }
        };
        static HANDLE: AtomicU32 = AtomicU32::new(1);
        let inner = Arc::new(CqInner {
            queue: Mutex::new(CqQueue {
                entries: VecDeque::new(),
                capacity: cqe as usize,
                arm: Arm::Off,
                overflowed: false,
            }),
            channel: chan,
            ctx: sc.state.clone(),
            cq_ptr: AtomicUsize::new(0),
        });
        // SAFETY: ibv_cq is plain old data (pthread objects zero-initialised are the static
        // initialisers on glibc); all-zero is valid.
        let mut cq: ibv_cq = unsafe { std::mem::zeroed() };
        cq.context = context;
        cq.channel = channel;
        cq.cq_context = cq_context;
        cq.handle = HANDLE.fetch_add(1, Ordering::Relaxed);
        cq.cqe = cqe;
        let shared = inner.clone();
        let p = Box::into_raw(Box::new(SimCq {
            cq,
            magic: CQ_MAGIC,
            inner,
        }));
        shared.cq_ptr.store(p as usize, Ordering::Release);
        p as *mut ibv_cq
    })
}

/// `ibv_destroy_cq`: EBUSY while QPs still complete into it.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: cq came from ibv_create_cq.
        let Some(c) = (unsafe { SimCq::from_ptr(cq) }) else {
            return libc::EINVAL;
        };
        if Arc::strong_count(&c.inner) > 1 {
            return libc::EBUSY;
        }
        if let Some(ch) = &c.inner.channel {
            if let Ok(mut p) = ch.pending.lock() {
                p.retain(|x| *x != cq as usize);
            }
            ch.cqs.fetch_sub(1, Ordering::AcqRel);
        }
        // SAFETY: checked live SimCq allocated by Box; the caller gives it up.
        let mut b = unsafe { Box::from_raw(cq as *mut SimCq) };
        b.magic = 0;
        drop(b);
        0
    })
}

/// `ibv_resize_cq`: changes the capacity (EINVAL below the completions already queued).
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: cq came from ibv_create_cq.
        let Some(c) = (unsafe { SimCq::from_ptr(cq) }) else {
            return libc::EINVAL;
        };
        let Ok(mut q) = c.inner.queue.lock() else {
            return libc::EIO;
        };
        if cqe < 1 || cqe as u32 > MAX_CQE || (cqe as usize) < q.entries.len() {
            return libc::EINVAL;
        }
        q.capacity = cqe as usize;
        // SAFETY: cq is a live SimCq; `cqe` is the caller-visible capacity.
        unsafe { (*cq).cqe = cqe };
        0
    })
}

/// `ibv_get_cq_event`: blocks until an armed CQ of `channel` got a completion.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        // SAFETY: verbs contract: channel came from ibv_create_comp_channel.
        let Some(ch) = (unsafe { SimChannel::from_ptr(channel) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if cq.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // Our own reference keeps the pipe open while we block.
        let inner = ch.inner.clone();
        loop {
            let mut b = [0u8; 1];
            // SAFETY: rd is our open pipe read end (kept open by `inner`); `b` is one
            // writable byte.
            let r = unsafe { libc::read(inner.rd, b.as_mut_ptr() as *mut c_void, 1) };
            if r != 1 {
                if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return -1; // errno from read (EAGAIN on a non-blocking fd)
            }
            let next = inner.pending.lock().ok().and_then(|mut p| p.pop_front());
            // An event of a CQ destroyed meanwhile leaves a byte without an entry: skip it.
            let Some(p) = next else { continue };
            // SAFETY: p is a live SimCq (destroy_cq removes its pending entries first).
            let ctx_ptr = unsafe { (*(p as *const SimCq)).cq.cq_context };
            // SAFETY: both out-pointers were checked non-NULL.
            unsafe {
                *cq = p as *mut ibv_cq;
                *cq_context = ctx_ptr;
            }
            return 0;
        }
    })
}

/// `ibv_ack_cq_events`: counts acknowledged events (destroy does not wait for them here).
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    guard((), || {
        // SAFETY: verbs contract: cq came from ibv_create_cq.
        if unsafe { SimCq::from_ptr(cq) }.is_some() {
            // SAFETY: cq is a live SimCq; the counter is only informational.
            unsafe {
                (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents)
            };
        }
    })
}

/// `ops.poll_cq`.
unsafe extern "C" fn sim_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        // SAFETY: called through our ops table with a CQ of our context.
        let Some(c) = (unsafe { SimCq::from_ptr(cq) }) else {
            return -1;
        };
        if num_entries < 0 || (num_entries > 0 && wc.is_null()) {
            return -1;
        }
        let Ok(mut q) = c.inner.queue.lock() else {
            return -1;
        };
        let mut n = 0usize;
        while n < num_entries as usize {
            let Some(e) = q.entries.pop_front() else {
                break;
            };
            let mut flags = 0;
            if e.grh {
                flags |= ibv_wc_flags::IBV_WC_GRH.0;
            }
            if e.imm.is_some() {
                flags |= ibv_wc_flags::IBV_WC_WITH_IMM.0;
            }
            let w = ibv_wc {
                wr_id: e.wr_id,
                status: e.status,
                opcode: e.opcode,
                vendor_err: 0,
                byte_len: e.byte_len,
                imm_data_invalidated_rkey_union: imm_data_invalidated_rkey_union_t {
                    imm_data: e.imm.unwrap_or(0),
                },
                qp_num: e.qp_num,
                src_qp: e.src_qp,
                wc_flags: flags,
                pkey_index: e.pkey_index,
                slid: e.slid,
                sl: e.sl,
                dlid_path_bits: e.dlid_path_bits,
            };
            // SAFETY: the caller provides room for num_entries ibv_wc; n < num_entries.
            unsafe { wc.add(n).write(w) };
            n += 1;
        }
        n as c_int
    })
}

/// `ops.req_notify_cq`.
unsafe extern "C" fn sim_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: called through our ops table with a CQ of our context.
        let Some(c) = (unsafe { SimCq::from_ptr(cq) }) else {
            return libc::EINVAL;
        };
        // Without a channel the arm is accepted and the event goes nowhere, as in the kernel.
        let Ok(mut q) = c.inner.queue.lock() else {
            return libc::EIO;
        };
        q.arm = if solicited_only != 0 {
            Arm::Solicited
        } else {
            Arm::Any
        };
        0
    })
}
