//! The verbs IO layer: one UD endpoint per (port, partition) for the ACM class-0x2C protocol.
//!
//! [`UdEndpoint::open`] allocates everything once on the core's verbs context: a protection
//! domain, a completion channel, a CQ for receives (on the channel) and one for sends (on
//! none: a query posted while the loop waits does not wake it, only its answer does), a UD
//! QP taken
//! INIT→RTR→RTS with the endpoint's P_Key index and Q_Key, and **one** registered memory region
//! holding every receive buffer (40-byte GRH area + 256-byte MAD each) and every send buffer
//! (256 bytes each). All receives are posted at open. After that the data path performs no
//! allocation: [`UdEndpoint::send`] copies the MAD into a free send buffer and posts it,
//! [`UdEndpoint::poll`] drains both CQs in bursts, frees send buffers, hands received MADs to a
//! callback and re-posts their buffers. Unicast destinations get address handles from a small
//! fixed-size cache (CLOCK eviction); multicast groups get one AH each at [`UdEndpoint::attach`].
//!
//! Waiting: [`UdEndpoint::arm`] requests a completion event, [`UdEndpoint::event_fd`] is the
//! completion channel's (non-blocking) fd to put in `poll(2)`/epoll, and
//! [`UdEndpoint::ack_event`] consumes one event. The usual race-free order is: `poll` until
//! it returns 0, `arm`, `poll` once more (a completion may have arrived before the arm), then
//! wait on the fd, `ack_event`, and start over.
//!
//! Error completions (on hardware and in simverbs a local length/protection error puts a UD QP
//! into the error state — a peer sending a datagram larger than 256 bytes to our QPN does
//! that) are counted; the endpoint then moves the QP to ERR, waits until every outstanding
//! work request has been flushed back, and takes the QP RESET→INIT→RTR→RTS again with all
//! receives re-posted (multicast attachments stay). While that runs, [`UdEndpoint::send`]
//! answers [`SendError::Recovering`].
//!
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are inline in
//! verbs.h: they are called here through `context->ops`, checked for NULL (no `unwrap`).
//!
//! The loop uses an endpoint through [`crate::plane::Ud`] (its impl is at the end of this
//! file). [`port_attr`] is the one reader of `struct ibv_port_attr` (the plugin's port
//! attributes at `open_port`, [`UdEndpoint::sm_addr`]).
#![allow(unsafe_code)]

use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::ptr;

mod ah;
mod port;
#[cfg(test)]
mod send_alloc;

use ah::{AhKey, AhSlot};
pub use port::{pkey_index, port_attr, sa_pkey_index};

use crate::plane::{Ud, UdHealth};
use acm_core_nostd::resolver::{AcmDest, McGroup, RecvMeta};
use acm_core_nostd::sa_channel::SmAddr;
use acm_core_nostd::wire::gid::Gid;
use rdma_sys::{
    ibv_access_flags, ibv_ack_cq_events, ibv_ah, ibv_alloc_pd, ibv_attach_mcast, ibv_comp_channel,
    ibv_context, ibv_cq, ibv_create_ah, ibv_create_comp_channel, ibv_create_cq, ibv_create_qp,
    ibv_dealloc_pd, ibv_dereg_mr, ibv_destroy_ah, ibv_destroy_comp_channel, ibv_destroy_cq,
    ibv_destroy_qp, ibv_detach_mcast, ibv_get_cq_event, ibv_gid, ibv_modify_qp, ibv_mr, ibv_pd,
    ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr, ibv_qp_state, ibv_qp_type,
    ibv_recv_wr, ibv_reg_mr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc, ibv_wc_flags,
    ibv_wc_status, ibv_wr_opcode,
};

/// The verbs context type [`UdEndpoint::open`], [`pkey_index`] and [`port_attr`] take (the
/// core's `acm_device.verbs`).
pub use rdma_sys::ibv_context as IbvContext;
/// `struct ibv_port_attr`, as [`port_attr`] returns it.
pub use rdma_sys::ibv_port_attr as IbvPortAttr;

/// Bytes of the GRH area in front of every received datagram (`sizeof(struct ibv_grh)`).
pub const GRH_LEN: usize = 40;
/// Bytes of an ACM MAD (`ACM_SEND_SIZE`): one MAD.
pub use acm_core_nostd::wire::mad::MAD_LEN;
/// Bytes of one receive buffer (`ACM_RECV_SIZE`).
pub const RECV_LEN: usize = GRH_LEN + MAD_LEN;
/// Destination QPN of a multicast send.
pub const MCAST_QPN: u32 = 0x00FF_FFFF;
/// `ACM_QKEY`, the Q_Key of the ACM QP and groups.
pub use acm_core_nostd::wire::mcmember::ACM_QKEY;
/// Unicast address handles cached per endpoint.
pub const AH_CACHE_SLOTS: usize = 32;
/// Multicast groups attached at once per endpoint (ibacmp uses at most 2).
pub const MAX_GROUPS: usize = 4;
/// Work completions per `ibv_poll_cq` call.
pub const POLL_BURST: usize = 32;
/// Polls between two resets of a QP whose receive queue stays starved (see `refill`).
pub const STARVE_BACKOFF_POLLS: u32 = 1024;
/// Largest `recv_depth` / `send_depth` accepted.
pub const MAX_DEPTH: u32 = 1 << 15;
/// Completion events consumed before they are acknowledged in one `ibv_ack_cq_events`.
const ACK_BATCH: u32 = 16;
/// `wr_id` tag of send work requests (receives carry their buffer index alone).
const SEND_TAG: u64 = 1 << 63;

/// How to open a [`UdEndpoint`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdConfig {
    /// Port number (1-based).
    pub port_num: u8,
    /// P_Key table index of the endpoint's partition (see [`pkey_index`]).
    pub pkey_index: u16,
    /// The QP's Q_Key ([`ACM_QKEY`]).
    pub qkey: u32,
    /// Receive buffers, all posted (ibacmp's `recv_depth`, default 1024).
    pub recv_depth: u32,
    /// Send buffers, i.e. sends in flight at most (ibacmp: `resolve_depth + send_depth`).
    pub send_depth: u32,
}

/// Counters of one endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdStats {
    /// MADs posted (`ibv_post_send` accepted them).
    pub sends: u64,
    /// Failed `ibv_post_send` calls, sends to an unknown group, send error completions.
    pub send_errors: u64,
    /// Sends refused because every send buffer was in flight.
    pub no_buffer: u64,
    /// MADs received and handed to the callback.
    pub recvs: u64,
    /// Receive error completions (flushes included) and failed re-posts.
    pub recv_errors: u64,
    /// Receives shorter than a whole MAD (dropped).
    pub recv_short: u64,
    /// Address handles created (groups and unicast).
    pub ah_created: u64,
    /// Unicast address handles evicted from the cache.
    pub ah_evicted: u64,
    /// Sends refused because every cached unicast AH was still in use by a send in flight.
    pub ah_busy: u64,
    /// Times the QP was reset after an error completion, or to refill a starved receive
    /// queue.
    pub qp_resets: u64,
    /// Times the posted receives fell below half the depth with re-posts failing, so the QP
    /// was reset to refill them (each also counts in `qp_resets`).
    pub rq_starved: u64,
    /// Receive buffers currently posted.
    pub recv_posted: u32,
    /// Send buffers currently in flight.
    pub send_inflight: u32,
}

/// A failed verbs call: its name and the errno it gave. `Copy` and free to build: the send
/// paths ([`UdEndpoint::send`], its `ibv_create_ah`) return it as [`SendError::Verbs`], so a
/// flood of failed posts allocates nothing. The setup and teardown calls (open, modify QP,
/// attach, arm, close) return it boxed as the payload of an [`io::Error`]
/// (`err.get_ref()` → downcast to read [`VerbsError::errno`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerbsError {
    /// The `ibv_*` function.
    pub call: &'static str,
    /// The errno (0 when the call failed without setting one).
    pub errno: i32,
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {}",
            self.call,
            io::Error::from_raw_os_error(self.errno)
        )
    }
}

impl std::error::Error for VerbsError {}

impl VerbsError {
    /// A call that returns the errno (`ibv_modify_qp`, `ibv_post_send`, ...). No allocation.
    fn from_rc(call: &'static str, rc: i32) -> Self {
        // Some providers return -1 and set errno instead.
        let errno = if rc < 0 { last_errno() } else { rc };
        VerbsError { call, errno }
    }

    /// A call that returns NULL and sets errno (`ibv_create_*`). No allocation.
    fn from_errno(call: &'static str) -> Self {
        VerbsError {
            call,
            errno: last_errno(),
        }
    }

    /// Boxed into an [`io::Error`] of the errno's kind (setup paths only: this allocates).
    fn io(self) -> io::Error {
        io::Error::new(io::Error::from_raw_os_error(self.errno).kind(), self)
    }
}

/// A setup call's failure that returned the errno, as an [`io::Error`].
fn rc_err(call: &'static str, rc: i32) -> io::Error {
    VerbsError::from_rc(call, rc).io()
}

/// A setup call's failure that returned NULL and set errno, as an [`io::Error`].
fn errno_err(call: &'static str) -> io::Error {
    VerbsError::from_errno(call).io()
}

fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

pub use crate::plane::SendError;

/// An attached (or detached, still draining) multicast group.
struct GroupSlot {
    group: McGroup,
    ah: *mut ibv_ah,
    /// Sends in flight through `ah`.
    inflight: u32,
    /// False once detached: the AH is destroyed when `inflight` reaches 0.
    attached: bool,
}

/// Which AH a send in flight uses (released on its completion).
#[derive(Clone, Copy)]
enum Owner {
    Free,
    Group(usize),
    Unicast(usize),
}

/// A UD endpoint on one port and partition. See the module documentation.
pub struct UdEndpoint {
    cfg: UdConfig,
    pd: *mut ibv_pd,
    channel: *mut ibv_comp_channel,
    /// Receives (armed on `channel`).
    cq: *mut ibv_cq,
    /// Sends (no channel: never waited on).
    send_cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    mr: *mut ibv_mr,
    /// The registered region (mmap): receive buffers, then send buffers.
    region: *mut u8,
    region_len: usize,
    lkey: u32,
    qpn: u32,
    /// Free send buffer indices (a stack).
    send_free: Vec<u32>,
    /// Per send buffer: which AH its send in flight uses.
    send_owner: Vec<Owner>,
    groups: Vec<Option<GroupSlot>>,
    ahs: Vec<Option<AhSlot>>,
    clock_hand: usize,
    /// Per receive buffer: posted to the QP.
    recv_is_posted: Vec<bool>,
    /// Completion events gotten and not yet acknowledged.
    unacked: u32,
    /// An error completion was seen: the QP is being drained and reset.
    broken: bool,
    /// Polls left before a starved receive queue may trigger another reset (while the
    /// driver keeps refusing receives, the QP is not reset on every poll).
    starve_backoff: u32,
    stats: UdStats,
    // Per-burst scratch, allocated at open.
    wcs: Vec<ibv_wc>,
    rx_mad: Vec<[u8; MAD_LEN]>,
    rx_meta: Vec<RecvMeta>,
    rwr: Vec<ibv_recv_wr>,
    rsge: Vec<ibv_sge>,
}

// SAFETY: the endpoint exclusively owns every verbs object and the memory region it points
// to (nothing is shared with other Rust values); libibverbs objects may be used from any
// thread, one at a time, which `&mut self` guarantees.
unsafe impl Send for UdEndpoint {}

impl fmt::Debug for UdEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdEndpoint")
            .field("qpn", &self.qpn)
            .field("cfg", &self.cfg)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl UdEndpoint {
    /// Opens the endpoint on the core's verbs context (see the module documentation). On any
    /// failure everything created so far is destroyed again.
    ///
    /// # Safety
    /// `ctx` is an open verbs context (`acm_device.verbs`) that outlives the endpoint.
    pub unsafe fn open(ctx: *mut ibv_context, cfg: &UdConfig) -> io::Result<UdEndpoint> {
        if ctx.is_null() {
            return Err(invalid("UdEndpoint::open: NULL verbs context"));
        }
        if cfg.recv_depth == 0 || cfg.recv_depth > MAX_DEPTH {
            return Err(invalid("UdEndpoint::open: recv_depth must be 1..=32768"));
        }
        if cfg.send_depth == 0 || cfg.send_depth > MAX_DEPTH {
            return Err(invalid("UdEndpoint::open: send_depth must be 1..=32768"));
        }
        let nrecv = cfg.recv_depth as usize;
        let nsend = cfg.send_depth as usize;
        let mut ep = UdEndpoint {
            cfg: *cfg,
            pd: ptr::null_mut(),
            channel: ptr::null_mut(),
            cq: ptr::null_mut(),
            send_cq: ptr::null_mut(),
            qp: ptr::null_mut(),
            mr: ptr::null_mut(),
            region: ptr::null_mut(),
            region_len: 0,
            lkey: 0,
            qpn: 0,
            send_free: (0..cfg.send_depth).rev().collect(),
            send_owner: vec![Owner::Free; nsend],
            groups: (0..MAX_GROUPS).map(|_| None).collect(),
            ahs: (0..AH_CACHE_SLOTS).map(|_| None).collect(),
            clock_hand: 0,
            recv_is_posted: vec![false; nrecv],
            unacked: 0,
            broken: false,
            starve_backoff: 0,
            stats: UdStats::default(),
            // SAFETY: ibv_wc is plain old data (integers and a union of integers).
            wcs: (0..POLL_BURST)
                .map(|_| unsafe { std::mem::zeroed() })
                .collect(),
            rx_mad: vec![[0; MAD_LEN]; POLL_BURST],
            rx_meta: vec![
                RecvMeta {
                    slid: 0,
                    src_qp: 0,
                    sl: 0,
                    dlid_path_bits: 0,
                    pkey_index: 0,
                    ep_pkey_index: 0,
                    grh_sgid: None,
                };
                POLL_BURST
            ],
            rwr: (0..POLL_BURST)
                .map(|_| ibv_recv_wr {
                    wr_id: 0,
                    next: ptr::null_mut(),
                    sg_list: ptr::null_mut(),
                    num_sge: 0,
                })
                .collect(),
            rsge: vec![
                ibv_sge {
                    addr: 0,
                    length: 0,
                    lkey: 0,
                };
                POLL_BURST
            ],
        };
        // SAFETY: ctx is open (caller's contract); `ep` is dropped (tearing down what exists)
        // if a step fails.
        unsafe { ep.create(ctx)? };
        Ok(ep)
    }

    /// The verbs objects, in order; the partially built endpoint's Drop cleans up on error.
    unsafe fn create(&mut self, ctx: *mut ibv_context) -> io::Result<()> {
        let cfg = self.cfg;
        // SAFETY: ctx is an open context (caller's contract).
        self.pd = unsafe { ibv_alloc_pd(ctx) };
        if self.pd.is_null() {
            return Err(errno_err("ibv_alloc_pd"));
        }
        // SAFETY: as above.
        self.channel = unsafe { ibv_create_comp_channel(ctx) };
        if self.channel.is_null() {
            return Err(errno_err("ibv_create_comp_channel"));
        }
        // SAFETY: channel is a live completion channel; its fd is an open descriptor.
        let fd = unsafe { (*self.channel).fd };
        // SAFETY: fcntl on an open fd with valid commands.
        let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if fl < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::new(
                io::Error::last_os_error().kind(),
                "fcntl(O_NONBLOCK) on the completion channel failed",
            ));
        }
        // Receives and their flushes (every posted receive at most once).
        let cqe = cfg.recv_depth as i32;
        // SAFETY: ctx and channel are live; no cq_context.
        self.cq = unsafe { ibv_create_cq(ctx, cqe, ptr::null_mut(), self.channel, 0) };
        if self.cq.is_null() {
            return Err(errno_err("ibv_create_cq"));
        }
        // SAFETY: ctx is live; no channel, no cq_context.
        self.send_cq = unsafe {
            ibv_create_cq(
                ctx,
                cfg.send_depth as i32,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            )
        };
        if self.send_cq.is_null() {
            return Err(errno_err("ibv_create_cq (sends)"));
        }
        let mut init = ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: self.send_cq,
            recv_cq: self.cq,
            srq: ptr::null_mut(),
            cap: rdma_sys::ibv_qp_cap {
                max_send_wr: cfg.send_depth,
                max_recv_wr: cfg.recv_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ibv_qp_type::IBV_QPT_UD,
            sq_sig_all: 1,
        };
        // SAFETY: pd and cq are live; `init` is a valid, writable init attr.
        self.qp = unsafe { ibv_create_qp(self.pd, &mut init) };
        if self.qp.is_null() {
            return Err(errno_err("ibv_create_qp"));
        }
        // SAFETY: qp is a live QP.
        self.qpn = unsafe { (*self.qp).qp_num };
        // SAFETY: qp is live.
        unsafe { self.bring_up()? };

        let nrecv = cfg.recv_depth as usize;
        let nsend = cfg.send_depth as usize;
        let len = nrecv * RECV_LEN + nsend * MAD_LEN;
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096);
        let len = (len + page - 1) & !(page - 1);
        // SAFETY: an anonymous private mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::new(
                io::Error::last_os_error().kind(),
                "mmap of the endpoint's buffer region failed",
            ));
        }
        self.region = p as *mut u8;
        self.region_len = len;
        // SAFETY: pd is live; the range is our mapping, which lives until after dereg.
        self.mr = unsafe {
            ibv_reg_mr(
                self.pd,
                p,
                len,
                ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32,
            )
        };
        if self.mr.is_null() {
            return Err(errno_err("ibv_reg_mr"));
        }
        // SAFETY: mr is a live registration.
        self.lkey = unsafe { (*self.mr).lkey };
        self.post_all_receives()
    }

    /// INIT (P_Key index, port, Q_Key) → RTR → RTS (SQ PSN 0).
    unsafe fn bring_up(&mut self) -> io::Result<()> {
        let steps: [(ibv_qp_state::Type, ibv_qp_attr_mask); 3] = [
            (
                ibv_qp_state::IBV_QPS_INIT,
                ibv_qp_attr_mask::IBV_QP_STATE
                    | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                    | ibv_qp_attr_mask::IBV_QP_PORT
                    | ibv_qp_attr_mask::IBV_QP_QKEY,
            ),
            (ibv_qp_state::IBV_QPS_RTR, ibv_qp_attr_mask::IBV_QP_STATE),
            (
                ibv_qp_state::IBV_QPS_RTS,
                ibv_qp_attr_mask::IBV_QP_STATE | ibv_qp_attr_mask::IBV_QP_SQ_PSN,
            ),
        ];
        for (state, mask) in steps {
            // SAFETY: ibv_qp_attr is plain old data; all-zero is a valid start.
            let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
            a.qp_state = state;
            a.pkey_index = self.cfg.pkey_index;
            a.port_num = self.cfg.port_num;
            a.qkey = self.cfg.qkey;
            a.sq_psn = 0;
            // SAFETY: qp is live (caller's contract); `a` is a valid attr for `mask`.
            let rc = unsafe { ibv_modify_qp(self.qp, &mut a, mask.0 as i32) };
            if rc != 0 {
                return Err(rc_err("ibv_modify_qp", rc));
            }
        }
        Ok(())
    }

    /// Moves the QP to `state` with nothing else (ERR or RESET).
    fn modify_state(&mut self, state: ibv_qp_state::Type) -> io::Result<()> {
        // SAFETY: ibv_qp_attr is plain old data.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = state;
        // SAFETY: qp is live while self is; STATE alone is valid for →ERR and →RESET.
        let rc = unsafe { ibv_modify_qp(self.qp, &mut a, ibv_qp_attr_mask::IBV_QP_STATE.0 as i32) };
        if rc != 0 {
            return Err(rc_err("ibv_modify_qp", rc));
        }
        Ok(())
    }

    /// Posts every receive buffer that is not posted, in chains of [`POLL_BURST`].
    fn post_all_receives(&mut self) -> io::Result<()> {
        let mut batch = [0u32; POLL_BURST];
        let mut n = 0;
        let mut result = Ok(());
        for i in 0..self.recv_is_posted.len() {
            if self.recv_is_posted[i] {
                continue;
            }
            batch[n] = i as u32;
            n += 1;
            if n == POLL_BURST {
                if let Err(e) = self.post_receives(&batch[..n]) {
                    result = Err(e);
                }
                n = 0;
            }
        }
        if n > 0 {
            if let Err(e) = self.post_receives(&batch[..n]) {
                result = Err(e);
            }
        }
        result
    }

    /// Posts receive buffers `idx` (at most [`POLL_BURST`]) as one chain.
    fn post_receives(&mut self, idx: &[u32]) -> io::Result<()> {
        let n = idx.len().min(POLL_BURST);
        if n == 0 {
            return Ok(());
        }
        let base = self.region as u64;
        for (k, &i) in idx.iter().take(n).enumerate() {
            self.rsge[k] = ibv_sge {
                addr: base + u64::from(i) * RECV_LEN as u64,
                length: RECV_LEN as u32,
                lkey: self.lkey,
            };
        }
        let sge = self.rsge.as_mut_ptr();
        let wr = self.rwr.as_mut_ptr();
        for (k, &i) in idx.iter().take(n).enumerate() {
            // SAFETY: k < n <= POLL_BURST = the length of both scratch vectors, so the
            // pointers stay inside them; the chain lives until post_recv returns.
            unsafe {
                *wr.add(k) = ibv_recv_wr {
                    wr_id: u64::from(i),
                    next: if k + 1 < n {
                        wr.add(k + 1)
                    } else {
                        ptr::null_mut()
                    },
                    sg_list: sge.add(k),
                    num_sge: 1,
                };
            }
        }
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: qp is live; `wr` is a valid chain of n WRs with SGEs inside our MR.
        let rc = unsafe { post_recv(self.qp, wr, &mut bad) };
        // WRs before `bad` were posted (all of them when rc == 0).
        let posted = if rc == 0 || bad.is_null() {
            if rc == 0 {
                n
            } else {
                0
            }
        } else {
            // SAFETY: bad points into our scratch array (the provider returns an element of
            // the chain we gave it).
            let off = unsafe { bad.offset_from(wr) };
            usize::try_from(off).unwrap_or(0).min(n)
        };
        for &i in idx.iter().take(posted) {
            if let Some(p) = self.recv_is_posted.get_mut(i as usize) {
                *p = true;
            }
        }
        self.stats.recv_posted += posted as u32;
        if rc != 0 {
            self.stats.recv_errors += (n - posted) as u64;
            return Err(rc_err("ibv_post_recv", rc));
        }
        Ok(())
    }

    /// The QP number (the source QPN of everything this endpoint sends).
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The port's SM LID and SL as the port says now (`ibv_query_port`): where the `ud` SA
    /// transport sends. `None` if the query fails or the port knows no SM (LID 0).
    pub fn sm_addr(&self) -> Option<(u16, u8)> {
        // SAFETY: the PD is alive while the endpoint is; its context is the core's open one.
        let ctx = unsafe { (*self.pd).context };
        // SAFETY: an open context (above).
        let attr = unsafe { port_attr(ctx, self.cfg.port_num) }?;
        (attr.sm_lid != 0).then_some((attr.sm_lid, attr.sm_sl))
    }

    /// The configuration the endpoint was opened with.
    pub fn config(&self) -> &UdConfig {
        &self.cfg
    }

    /// Attaches the QP to `group` (`ibv_attach_mcast` with its MGID and MLID) and creates its
    /// address handle (dlid = MLID, GRH to the MGID from SGID index 0, SL, static rate, flow
    /// label, hop limit, traffic class). Attaching a group index already attached with the
    /// same parameters does nothing; with other parameters the old group is detached first.
    pub fn attach(&mut self, group: &McGroup) -> io::Result<()> {
        if let Some(i) = self.group_slot(group.index) {
            if self.groups[i].as_ref().is_some_and(|s| s.group == *group) {
                return Ok(());
            }
            self.detach_slot(i);
        }
        let Some(free) = self.groups.iter().position(Option::is_none) else {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "no free multicast group slot (detached groups still have sends in flight)",
            ));
        };
        let gid = ibv_gid { raw: group.mgid.0 };
        // SAFETY: qp is live; gid is a valid ibv_gid.
        let rc = unsafe { ibv_attach_mcast(self.qp, &gid, group.mlid) };
        if rc != 0 {
            return Err(rc_err("ibv_attach_mcast", rc));
        }
        let mut attr = AhKey::group(group).attr(self.cfg.port_num);
        // SAFETY: pd is live; attr is a valid AH attribute.
        let ah = unsafe { ibv_create_ah(self.pd, &mut attr) };
        if ah.is_null() {
            let e = errno_err("ibv_create_ah");
            // SAFETY: qp is live and attached to this group just now.
            unsafe { ibv_detach_mcast(self.qp, &gid, group.mlid) };
            return Err(e);
        }
        self.stats.ah_created += 1;
        self.groups[free] = Some(GroupSlot {
            group: *group,
            ah,
            inflight: 0,
            attached: true,
        });
        Ok(())
    }

    /// Detaches the QP from `group` (matched by index and MGID) and drops its address handle
    /// (at once, or when its last send in flight completes). Unknown groups are ignored.
    pub fn detach(&mut self, group: &McGroup) {
        if let Some(i) = self.group_slot(group.index) {
            if self.groups[i]
                .as_ref()
                .is_some_and(|s| s.group.mgid == group.mgid)
            {
                self.detach_slot(i);
            }
        }
    }

    /// The slot of the attached group with this index.
    fn group_slot(&self, index: u8) -> Option<usize> {
        self.groups.iter().position(|s| {
            s.as_ref()
                .is_some_and(|s| s.attached && s.group.index == index)
        })
    }

    fn detach_slot(&mut self, i: usize) {
        let qp = self.qp;
        let Some(s) = self.groups.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        if s.attached {
            let gid = ibv_gid {
                raw: s.group.mgid.0,
            };
            // SAFETY: qp is live and attached to this group. A failure leaves nothing we
            // could repair; the group is forgotten either way.
            unsafe { ibv_detach_mcast(qp, &gid, s.group.mlid) };
            s.attached = false;
        }
        if s.inflight == 0 {
            // SAFETY: ah is a live AH no send in flight uses.
            unsafe { ibv_destroy_ah(s.ah) };
            self.groups[i] = None;
        }
    }

    /// Posts one 256-byte MAD: to an attached group (its AH, QPN 0xFFFFFF, the group's Q_Key
    /// or the endpoint's when the group has none) or to a unicast peer (an AH from the cache,
    /// GRH to the AV's DGID, the AV's QPN and Q_Key). Never blocks.
    pub fn send(&mut self, to: &AcmDest, mad: &[u8; MAD_LEN]) -> Result<(), SendError> {
        if self.broken {
            self.stats.send_errors += 1;
            return Err(SendError::Recovering);
        }
        let Some(&buf) = self.send_free.last() else {
            self.stats.no_buffer += 1;
            return Err(SendError::NoBuffer);
        };
        let (owner, ah, qpn, qkey) = match to {
            AcmDest::Group(index) => {
                let Some(g) = self.group_slot(*index) else {
                    self.stats.send_errors += 1;
                    return Err(SendError::UnknownGroup(*index));
                };
                let Some(s) = self.groups[g].as_ref() else {
                    return Err(SendError::UnknownGroup(*index));
                };
                let qkey = if s.group.qkey != 0 {
                    s.group.qkey
                } else {
                    self.cfg.qkey
                };
                (Owner::Group(g), s.ah, MCAST_QPN, qkey)
            }
            AcmDest::Unicast(av) => {
                let slot = match self.unicast_ah(av) {
                    Ok(s) => s,
                    Err(e) => {
                        self.stats.send_errors += 1;
                        return Err(e);
                    }
                };
                let Some(s) = self.ahs[slot].as_ref() else {
                    return Err(SendError::AhBusy);
                };
                let qkey = if av.remote_qkey != 0 {
                    av.remote_qkey
                } else {
                    self.cfg.qkey
                };
                (Owner::Unicast(slot), s.ah, av.remote_qpn, qkey)
            }
        };
        let off = self.cfg.recv_depth as usize * RECV_LEN + buf as usize * MAD_LEN;
        // SAFETY: off + MAD_LEN <= region_len (layout from open); the buffer is free, so no
        // work request is reading it.
        unsafe { ptr::copy_nonoverlapping(mad.as_ptr(), self.region.add(off), MAD_LEN) };
        let mut sge = ibv_sge {
            addr: self.region as u64 + off as u64,
            length: MAD_LEN as u32,
            lkey: self.lkey,
        };
        // SAFETY: ibv_send_wr is plain old data (pointers, integers, unions of those).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = SEND_TAG | u64::from(buf);
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.ud = rdma_sys::ud_t {
            ah,
            remote_qpn: qpn,
            remote_qkey: qkey,
        };
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: qp is live; wr is one valid UD send WR whose SGE lies in our MR and whose
        // AH stays alive until the completion (inflight count).
        let rc = unsafe { post_send(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            self.stats.send_errors += 1;
            return Err(SendError::Verbs(VerbsError::from_rc("ibv_post_send", rc)));
        }
        self.send_free.pop();
        self.send_owner[buf as usize] = owner;
        match owner {
            Owner::Group(g) => {
                if let Some(s) = self.groups[g].as_mut() {
                    s.inflight += 1;
                }
            }
            Owner::Unicast(u) => {
                if let Some(s) = self.ahs[u].as_mut() {
                    s.inflight += 1;
                }
            }
            Owner::Free => {}
        }
        self.stats.sends += 1;
        self.stats.send_inflight += 1;
        Ok(())
    }

    /// A send completed: its buffer is free again, its AH one use lighter.
    fn complete_send(&mut self, buf: usize, ok: bool) {
        let Some(owner) = self.send_owner.get(buf).copied() else {
            return;
        };
        if matches!(owner, Owner::Free) {
            return; // not in flight (a stale completion)
        }
        self.send_owner[buf] = Owner::Free;
        self.send_free.push(buf as u32);
        self.stats.send_inflight = self.stats.send_inflight.saturating_sub(1);
        if !ok {
            self.stats.send_errors += 1;
        }
        match owner {
            Owner::Group(g) => {
                let done = match self.groups.get_mut(g).and_then(Option::as_mut) {
                    Some(s) => {
                        s.inflight = s.inflight.saturating_sub(1);
                        !s.attached && s.inflight == 0
                    }
                    None => false,
                };
                if done {
                    self.detach_slot(g);
                }
            }
            Owner::Unicast(u) => {
                if let Some(s) = self.ahs.get_mut(u).and_then(Option::as_mut) {
                    s.inflight = s.inflight.saturating_sub(1);
                }
            }
            Owner::Free => {}
        }
    }

    /// Drains the send CQ, then the receive CQ in bursts of [`POLL_BURST`] (at most
    /// `recv_depth + send_depth` completions per call): send completions free their buffers,
    /// each successful receive
    /// of a whole MAD is handed to `f` with its [`RecvMeta`] and the 256 bytes after the GRH,
    /// and its buffer is re-posted (before `f` runs: `f` sees a copy). Error completions are
    /// counted (and start the QP reset described in the module documentation). Returns the
    /// number of completions.
    pub fn poll(&mut self, mut f: impl FnMut(&RecvMeta, &[u8; MAD_LEN])) -> usize {
        let mut total = self.poll_sends();
        let budget = total + self.cfg.recv_depth as usize;
        while total < budget {
            // SAFETY: cq is live; wcs has room for POLL_BURST completions.
            let n = unsafe { poll_cq(self.cq, POLL_BURST as i32, self.wcs.as_mut_ptr()) };
            let Ok(n) = usize::try_from(n) else {
                self.stats.recv_errors += 1;
                break;
            };
            let n = n.min(POLL_BURST);
            if n == 0 {
                break;
            }
            total += n;
            let mut repost = [0u32; POLL_BURST];
            let mut nrepost = 0;
            let mut nrx = 0;
            for k in 0..n {
                let wc = &self.wcs[k];
                let (wr_id, status, byte_len, flags) =
                    (wc.wr_id, wc.status, wc.byte_len, wc.wc_flags);
                let ok = status == ibv_wc_status::IBV_WC_SUCCESS;
                // (Sends complete on `send_cq`: a send's tagged id is no receive buffer's.)
                let buf = wr_id as usize;
                match self.recv_is_posted.get_mut(buf) {
                    Some(p) if *p => *p = false,
                    _ => continue, // not ours / stale
                }
                self.stats.recv_posted = self.stats.recv_posted.saturating_sub(1);
                if !ok {
                    self.stats.recv_errors += 1;
                    self.broken = true;
                    continue; // re-posted by the reset
                }
                if (byte_len as usize) < RECV_LEN {
                    self.stats.recv_short += 1;
                } else {
                    let at = buf * RECV_LEN;
                    let mut sgid = None;
                    if flags & ibv_wc_flags::IBV_WC_GRH.0 != 0 {
                        let mut g = [0u8; 16];
                        // SAFETY: the receive completed, so the device is done with the
                        // buffer; bytes 8..24 of the GRH area are inside it.
                        unsafe {
                            ptr::copy_nonoverlapping(self.region.add(at + 8), g.as_mut_ptr(), 16)
                        };
                        sgid = Some(Gid(g));
                    }
                    // SAFETY: as above; the MAD follows the 40-byte GRH area.
                    unsafe {
                        ptr::copy_nonoverlapping(
                            self.region.add(at + GRH_LEN),
                            self.rx_mad[nrx].as_mut_ptr(),
                            MAD_LEN,
                        )
                    };
                    let wc = &self.wcs[k];
                    self.rx_meta[nrx] = RecvMeta {
                        slid: wc.slid,
                        src_qp: wc.src_qp,
                        sl: wc.sl,
                        dlid_path_bits: wc.dlid_path_bits,
                        // `wc.pkey_index` is defined for GSI QPs only (ibv_poll_cq(3)); a UD
                        // QP accepts only packets of its own P_Key (the HCA checks the BTH
                        // P_Key against the QP's), so a MAD here is on our partition.
                        pkey_index: self.cfg.pkey_index,
                        ep_pkey_index: self.cfg.pkey_index,
                        grh_sgid: sgid,
                    };
                    nrx += 1;
                }
                if !self.broken {
                    repost[nrepost] = buf as u32;
                    nrepost += 1;
                }
            }
            if nrepost > 0 && !self.broken {
                // A failure is counted in recv_errors; the buffers stay unposted until the
                // next reset.
                let _ = self.post_receives(&repost[..nrepost]);
            }
            self.stats.recvs += nrx as u64;
            for k in 0..nrx {
                f(&self.rx_meta[k], &self.rx_mad[k]);
            }
            if n < POLL_BURST {
                break;
            }
        }
        self.refill();
        if self.broken {
            self.recover();
        }
        total
    }

    /// Drains the send CQ (at most `send_depth` completions): each frees its buffer; an error
    /// completion starts the QP reset. Returns the number of completions.
    fn poll_sends(&mut self) -> usize {
        let budget = self.cfg.send_depth as usize;
        let mut total = 0;
        while total < budget {
            // SAFETY: send_cq is live; wcs has room for POLL_BURST completions.
            let n = unsafe { poll_cq(self.send_cq, POLL_BURST as i32, self.wcs.as_mut_ptr()) };
            let Ok(n) = usize::try_from(n) else {
                self.stats.recv_errors += 1;
                break;
            };
            let n = n.min(POLL_BURST);
            for k in 0..n {
                let (wr_id, status) = (self.wcs[k].wr_id, self.wcs[k].status);
                let ok = status == ibv_wc_status::IBV_WC_SUCCESS;
                if !ok {
                    self.broken = true;
                }
                if wr_id & SEND_TAG != 0 {
                    self.complete_send((wr_id & !SEND_TAG) as usize, ok);
                }
            }
            total += n;
            if n < POLL_BURST {
                break;
            }
        }
        total
    }

    /// A receive queue must not drain away: buffers a failed re-post left out are posted
    /// again on every poll, and if fewer than half the depth are posted even so (the driver
    /// keeps refusing them), the QP is reset and re-posted (`rq_starved`, `qp_resets`), at
    /// most once per [`STARVE_BACKOFF_POLLS`] polls.
    fn refill(&mut self) {
        self.starve_backoff = self.starve_backoff.saturating_sub(1);
        if self.broken || self.stats.recv_posted >= self.cfg.recv_depth {
            return;
        }
        let _ = self.post_all_receives();
        if self.stats.recv_posted < self.cfg.recv_depth.div_ceil(2) && self.starve_backoff == 0 {
            self.stats.rq_starved += 1;
            self.starve_backoff = STARVE_BACKOFF_POLLS;
            self.broken = true;
        }
    }

    /// After an error completion: QP to ERR (flushes every posted WR into the CQ); once every
    /// receive and send has come back, RESET→INIT→RTR→RTS and re-post all receives.
    fn recover(&mut self) {
        // SAFETY: qp is live while self is.
        let state = unsafe { (*self.qp).state };
        if state != ibv_qp_state::IBV_QPS_ERR && state != ibv_qp_state::IBV_QPS_RESET {
            let _ = self.modify_state(ibv_qp_state::IBV_QPS_ERR);
        }
        if self.stats.recv_posted > 0 || self.stats.send_inflight > 0 {
            return; // flushes still to come
        }
        if self.modify_state(ibv_qp_state::IBV_QPS_RESET).is_err() {
            return;
        }
        // SAFETY: qp is live and in RESET.
        if unsafe { self.bring_up() }.is_err() {
            return;
        }
        self.broken = false;
        self.stats.qp_resets += 1;
        let _ = self.post_all_receives();
    }

    /// Requests a completion event for the next completion (`ibv_req_notify_cq`, any kind).
    pub fn arm(&mut self) -> io::Result<()> {
        // SAFETY: cq is live while self is.
        let rc = unsafe { req_notify_cq(self.cq, 0) };
        if rc != 0 {
            return Err(rc_err("ibv_req_notify_cq", rc));
        }
        Ok(())
    }

    /// The completion channel's fd (non-blocking), readable when an armed CQ completed.
    pub fn event_fd(&self) -> RawFd {
        // SAFETY: channel is live while self is.
        unsafe { (*self.channel).fd }
    }

    /// Consumes one completion event without blocking (`ibv_get_cq_event`; acknowledged with
    /// `ibv_ack_cq_events` in batches). Returns whether there was one.
    pub fn ack_event(&mut self) -> bool {
        let mut cq: *mut ibv_cq = ptr::null_mut();
        let mut cq_ctx: *mut libc::c_void = ptr::null_mut();
        // SAFETY: channel is live; its fd is non-blocking, so this returns at once.
        let rc = unsafe { ibv_get_cq_event(self.channel, &mut cq, &mut cq_ctx) };
        if rc != 0 {
            return false;
        }
        self.unacked += 1;
        if self.unacked >= ACK_BATCH {
            // SAFETY: cq is live; `unacked` events of it were gotten.
            unsafe { ibv_ack_cq_events(self.cq, self.unacked) };
            self.unacked = 0;
        }
        true
    }

    /// The endpoint's counters.
    pub fn stats(&self) -> UdStats {
        self.stats
    }

    /// Tears everything down like `Drop`, reporting the first failed verbs call.
    pub fn close(mut self) -> io::Result<()> {
        self.teardown()
    }

    /// Detach every group, destroy the QP (no WR can use an AH any more), the AHs, ack the
    /// remaining events, destroy the CQ, the channel, deregister the MR, free the PD, unmap
    /// the region (only once nothing is registered on it). Idempotent.
    fn teardown(&mut self) -> io::Result<()> {
        let mut first: Option<io::Error> = None;
        let mut check = |call: &'static str, rc: i32| {
            if rc != 0 && first.is_none() {
                first = Some(rc_err(call, rc));
            }
        };
        let qp = self.qp;
        for s in self.groups.iter_mut().flatten() {
            if s.attached && !qp.is_null() {
                let gid = ibv_gid {
                    raw: s.group.mgid.0,
                };
                // SAFETY: qp is live and attached to this group.
                check("ibv_detach_mcast", unsafe {
                    ibv_detach_mcast(qp, &gid, s.group.mlid)
                });
                s.attached = false;
            }
        }
        let mut qp_gone = true;
        if !self.qp.is_null() {
            // SAFETY: qp is live; nothing uses it after this.
            let rc = unsafe { ibv_destroy_qp(self.qp) };
            check("ibv_destroy_qp", rc);
            if rc == 0 {
                self.qp = ptr::null_mut();
            } else {
                qp_gone = false;
            }
        }
        if qp_gone {
            for slot in self.groups.iter_mut() {
                if let Some(s) = slot.take() {
                    // SAFETY: a live AH; the QP that could use it is gone.
                    check("ibv_destroy_ah", unsafe { ibv_destroy_ah(s.ah) });
                }
            }
            for slot in self.ahs.iter_mut() {
                if let Some(s) = slot.take() {
                    // SAFETY: as above.
                    check("ibv_destroy_ah", unsafe { ibv_destroy_ah(s.ah) });
                }
            }
        }
        if !self.send_cq.is_null() && self.qp.is_null() {
            // SAFETY: send_cq is live and no QP uses it.
            let rc = unsafe { ibv_destroy_cq(self.send_cq) };
            check("ibv_destroy_cq", rc);
            if rc == 0 {
                self.send_cq = ptr::null_mut();
            }
        }
        if !self.cq.is_null() && self.qp.is_null() {
            if self.unacked > 0 {
                // SAFETY: cq is live; `unacked` events of it were gotten.
                unsafe { ibv_ack_cq_events(self.cq, self.unacked) };
                self.unacked = 0;
            }
            // SAFETY: cq is live and no QP uses it.
            let rc = unsafe { ibv_destroy_cq(self.cq) };
            check("ibv_destroy_cq", rc);
            if rc == 0 {
                self.cq = ptr::null_mut();
            }
        }
        if !self.channel.is_null() && self.cq.is_null() {
            // SAFETY: channel is live and no CQ uses it.
            let rc = unsafe { ibv_destroy_comp_channel(self.channel) };
            check("ibv_destroy_comp_channel", rc);
            if rc == 0 {
                self.channel = ptr::null_mut();
            }
        }
        if !self.mr.is_null() && self.qp.is_null() {
            // SAFETY: mr is live; no QP can access it any more.
            let rc = unsafe { ibv_dereg_mr(self.mr) };
            check("ibv_dereg_mr", rc);
            if rc == 0 {
                self.mr = ptr::null_mut();
            }
        }
        if !self.pd.is_null() && self.qp.is_null() && self.mr.is_null() {
            // SAFETY: pd is live; its QP, MR and AHs are gone.
            let rc = unsafe { ibv_dealloc_pd(self.pd) };
            check("ibv_dealloc_pd", rc);
            if rc == 0 {
                self.pd = ptr::null_mut();
            }
        }
        if !self.region.is_null() && self.mr.is_null() && self.qp.is_null() {
            // SAFETY: our own mapping of region_len bytes; nothing registered on it any more
            // (a region still registered is leaked rather than unmapped under the device).
            unsafe { libc::munmap(self.region as *mut libc::c_void, self.region_len) };
            self.region = ptr::null_mut();
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for UdEndpoint {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// The loop's view of the endpoint (`plane::Ud`): what it sends, polls, attaches and waits on.
impl Ud for UdEndpoint {
    fn send(&mut self, to: &AcmDest, mad: &[u8; 256]) -> Result<(), SendError> {
        UdEndpoint::send(self, to, mad)
    }

    fn poll(&mut self, f: &mut dyn FnMut(&RecvMeta, &[u8; 256])) -> usize {
        UdEndpoint::poll(self, |m, b| f(m, b))
    }

    fn attach(&mut self, group: &McGroup) -> Result<(), String> {
        UdEndpoint::attach(self, group).map_err(|e| e.to_string())
    }

    fn detach(&mut self, group: &McGroup) {
        UdEndpoint::detach(self, group)
    }

    fn arm(&mut self) -> Option<RawFd> {
        UdEndpoint::arm(self).ok()?;
        Some(self.event_fd())
    }

    fn ack_events(&mut self) {
        while self.ack_event() {}
    }

    fn sm_addr(&mut self) -> Option<SmAddr> {
        UdEndpoint::sm_addr(self).map(|(lid, sl)| SmAddr { lid, sl })
    }

    fn health(&self) -> UdHealth {
        let s = self.stats();
        UdHealth {
            short: s.recv_short,
            recv_errors: s.recv_errors,
            send_errors: s.send_errors + s.no_buffer,
            qp_resets: s.qp_resets,
            rq_starved: s.rq_starved,
        }
    }
}

/// `ibv_post_send` (inline in verbs.h: through `context->ops`).
unsafe fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> i32 {
    // SAFETY: qp is live (caller's contract), so is its context.
    match unsafe { (*(*qp).context).ops.post_send } {
        // SAFETY: the provider's post_send with the caller's valid arguments.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_recv` (inline in verbs.h: through `context->ops`).
unsafe fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> i32 {
    // SAFETY: qp is live (caller's contract), so is its context.
    match unsafe { (*(*qp).context).ops.post_recv } {
        // SAFETY: the provider's post_recv with the caller's valid arguments.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_poll_cq` (inline in verbs.h: through `context->ops`).
unsafe fn poll_cq(cq: *mut ibv_cq, n: i32, wc: *mut ibv_wc) -> i32 {
    // SAFETY: cq is live (caller's contract), so is its context.
    match unsafe { (*(*cq).context).ops.poll_cq } {
        // SAFETY: the provider's poll_cq; wc has room for n entries (caller's contract).
        Some(f) => unsafe { f(cq, n, wc) },
        None => -1,
    }
}

/// `ibv_req_notify_cq` (inline in verbs.h: through `context->ops`).
unsafe fn req_notify_cq(cq: *mut ibv_cq, solicited_only: i32) -> i32 {
    // SAFETY: cq is live (caller's contract), so is its context.
    match unsafe { (*(*cq).context).ops.req_notify_cq } {
        // SAFETY: the provider's req_notify_cq on a live CQ.
        Some(f) => unsafe { f(cq, solicited_only) },
        None => libc::EOPNOTSUPP,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_constants_match_acm() {
        assert_eq!(RECV_LEN, 296);
        assert_eq!(MCAST_QPN, 0xFF_FFFF);
        assert_eq!(ACM_QKEY, 0x8001_0000);
    }

    #[test]
    fn open_rejects_bad_arguments_before_touching_verbs() {
        let cfg = UdConfig {
            port_num: 1,
            pkey_index: 0,
            qkey: ACM_QKEY,
            recv_depth: 0,
            send_depth: 1,
        };
        // SAFETY: a NULL context is refused before any verbs call.
        let e = unsafe { UdEndpoint::open(ptr::null_mut(), &cfg) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = VerbsError {
            call: "ibv_create_qp",
            errno: libc::EINVAL,
        }
        .io();
        assert!(e.to_string().starts_with("ibv_create_qp failed"), "{e}");
        assert_eq!(
            e.get_ref()
                .and_then(|e| e.downcast_ref::<VerbsError>())
                .map(|v| v.errno),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn ah_key_attr_is_global_from_sgid_index_0() {
        let g = McGroup {
            index: 0,
            mgid: Gid([
                0xff, 0x15, 0x40, 0x01, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ]),
            mlid: 0xc001,
            sl: 3,
            flow_label: 7,
            hop_limit: 9,
            tclass: 5,
            rate: 3,
            mtu: 4,
            pkey: 0xffff,
            qkey: ACM_QKEY,
        };
        let a = AhKey::group(&g).attr(1);
        assert_eq!(a.dlid, 0xc001);
        assert_eq!(a.is_global, 1);
        assert_eq!(a.sl, 3);
        assert_eq!(a.static_rate, 3);
        assert_eq!(a.port_num, 1);
        assert_eq!(a.grh.sgid_index, 0);
        assert_eq!(a.grh.hop_limit, 9);
        assert_eq!(a.grh.traffic_class, 5);
        assert_eq!(a.grh.flow_label, 7);
        // SAFETY: raw is the union's byte view.
        assert_eq!(unsafe { a.grh.dgid.raw }, g.mgid.0);
    }
}
