//! UD queue pairs, address handles and multicast attachment.
//!
//! A QP owns an abstract unix datagram socket `@simverbs/<fabric>/lid/<lid>/qp/<qpn>` (LID of
//! its port when created) and a receiver thread that turns arriving datagrams into receive
//! completions: state, destination QPN / multicast membership, Q_Key and P_Key are checked as
//! an HCA would, the 40-byte GRH area is filled when the sender used a GRH, and every
//! scatter/gather element is checked against the registered memory regions.
//! `post_send` runs in the caller's thread, never blocks, and completes at once.

use crate::cq::{Completion, CqInner, SimCq};
use crate::device::ContextState;
use crate::mem::{resolve_sge, SimPd};
use crate::transport::{self, Datagram, SendOutcome, MCAST_QPN};
use crate::{guard, set_errno};
use rdma_sys::*;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::os::raw::{c_int, c_void};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Largest number of QPs per context.
pub const MAX_QP: u32 = 4096;
/// Largest work queue.
pub const MAX_QP_WR: u32 = 16384;
/// Largest scatter/gather list.
pub const MAX_SGE: u32 = 16;
/// Largest inline send.
pub const MAX_INLINE: u32 = 512;
/// Bytes a UD receive buffer reserves in front of the payload for the GRH.
pub const GRH_LEN: usize = 40;

const QP_MAGIC: u64 = 0x5349_4d56_5150_3031; // "SIMVQP01"
const AH_MAGIC: u64 = 0x5349_4d56_4148_3031; // "SIMVAH01"

use ibv_qp_state::{IBV_QPS_ERR, IBV_QPS_INIT, IBV_QPS_RESET, IBV_QPS_RTR, IBV_QPS_RTS};

struct RecvWr {
    wr_id: u64,
    sges: Vec<ibv_sge>,
}

#[derive(Clone, Copy, Debug)]
struct QpAttrs {
    state: u32,
    qkey: u32,
    pkey_index: u16,
    port: u8,
    sq_psn: u32,
}

/// Counters of what the receive side dropped (also visible with `SIMVERBS_DEBUG`).
#[derive(Default)]
pub struct QpCounters {
    pub qkey_violations: AtomicU64,
    pub pkey_violations: AtomicU64,
    pub no_recv_wr: AtomicU64,
    pub not_ready: AtomicU64,
    pub not_member: AtomicU64,
    /// Datagrams dropped because this QP's port is not ACTIVE (link down).
    pub port_down: AtomicU64,
    /// GSI bridge: MADs handed to ibsim for a remote QP1.
    pub gsi_sent: AtomicU64,
    /// GSI bridge: sends to QP1 with an effective Q_Key other than 0x80010000 (the remote GSI
    /// drops them).
    pub gsi_qkey_drops: AtomicU64,
    /// GSI bridge: sends to QP1 whose length is not 256 (the remote GSI drops them).
    pub gsi_bad_length: AtomicU64,
    /// GSI bridge: sends lost before ibsim (no ibsim client, ibsim's socket full, loss knob).
    pub gsi_lost: AtomicU64,
    /// GSI bridge: our MADs ibsim returned as undeliverable (no route, nobody on that QP1).
    pub gsi_undelivered: AtomicU64,
    /// GSI bridge: MADs ibsim delivered to this QP (before the receive checks).
    pub gsi_received: AtomicU64,
}

impl QpCounters {
    /// `name=value` pairs of every counter (the control socket's `counters` reply).
    pub fn describe(&self) -> String {
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "qkey_violations={} pkey_violations={} no_recv_wr={} not_ready={} not_member={} \
             port_down={} gsi_sent={} gsi_qkey_drops={} gsi_bad_length={} gsi_lost={} \
             gsi_undelivered={} gsi_received={}",
            c(&self.qkey_violations),
            c(&self.pkey_violations),
            c(&self.no_recv_wr),
            c(&self.not_ready),
            c(&self.not_member),
            c(&self.port_down),
            c(&self.gsi_sent),
            c(&self.gsi_qkey_drops),
            c(&self.gsi_bad_length),
            c(&self.gsi_lost),
            c(&self.gsi_undelivered),
            c(&self.gsi_received),
        )
    }
}

/// A QP's GSI bridge state (see [`crate::gsi`]).
#[derive(Default)]
pub(crate) struct GsiState {
    /// The port the QP is a consumer of, and its tag there (set at its first send to QPN 1).
    pub port: Option<(&'static Arc<crate::host::HostPort>, u16)>,
    /// The upper TID bits of its requests in flight.
    pub tids: crate::gsi::TidTable,
}

/// Where a QP's receive socket is bound: its port, the port's fabric (ibsim instance) and
/// the port's LID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    pub port: u8,
    pub fabric: &'static str,
    pub lid: u16,
}

/// The fabric (ibsim sockname) of port `port` of the context's device.
fn port_fabric(ctx: &ContextState, port: u8) -> &'static str {
    crate::host::port(&ctx.device.ca.name, port)
        .map(|p| p.spec.sock.as_str())
        .unwrap_or("sim")
}

/// A QP's shared state (the receiver thread holds an `Arc`).
pub struct QpInner {
    pub qpn: u32,
    /// Where the receive socket is bound (follows the QP's port and LID changes, see
    /// [`rebind_qps`]).
    bound: Mutex<Bound>,
    pd: usize,
    ctx: Arc<ContextState>,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    attrs: Mutex<QpAttrs>,
    rq: Mutex<VecDeque<RecvWr>>,
    cap: ibv_qp_cap,
    sq_sig_all: bool,
    /// Bound receive socket (`@simverbs/<fabric>/lid/<lid>/qp/<qpn>`); replaced on a LID
    /// change, the receiver thread picks up the new one when the old one is shut down.
    sock: Mutex<Arc<UnixDatagram>>,
    /// Unbound, non-blocking send socket: a full or dead peer never blocks `post_send`.
    tx: UnixDatagram,
    mcast: Mutex<Vec<([u8; 16], u16)>>,
    stop: AtomicBool,
    qp_ptr: AtomicUsize,
    pub counters: QpCounters,
    pub(crate) gsi: Mutex<GsiState>,
    /// Back reference for the GSI bridge's reader thread.
    me: std::sync::Weak<QpInner>,
}

/// Our `ibv_qp`.
#[repr(C)]
pub struct SimQp {
    pub qp: ibv_qp,
    magic: u64,
    inner: Arc<QpInner>,
    rx: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl SimQp {
    /// # Safety
    /// `p` must be NULL or a pointer returned by [`ibv_create_qp`], not yet destroyed.
    unsafe fn from_ptr<'a>(p: *mut ibv_qp) -> Option<&'a SimQp> {
        // SAFETY: this function's contract is resolve's contract for this type.
        unsafe { crate::resolve_or_einval(p, |s: &SimQp| s.magic, QP_MAGIC) }
    }
}

/// Our `ibv_ah`.
#[repr(C)]
pub struct SimAh {
    pub ah: ibv_ah,
    magic: u64,
    attr: ibv_ah_attr,
}

impl SimAh {
    /// # Safety
    /// `p` must be NULL or a pointer returned by [`ibv_create_ah`], not yet destroyed.
    unsafe fn from_ptr<'a>(p: *mut ibv_ah) -> Option<&'a SimAh> {
        // SAFETY: this function's contract is resolve's contract for this type.
        unsafe { crate::resolve(p, |s: &SimAh| s.magic, AH_MAGIC) }
    }
}

/// Installs the QP entry points in a context's ops table.
pub fn fill_ops(ops: &mut ibv_context_ops) {
    ops.post_send = Some(sim_post_send);
    ops.post_recv = Some(sim_post_recv);
}

/// Bytes of an IBA MTU enum value.
fn mtu_bytes(mtu: u8) -> usize {
    match mtu {
        1 => 256,
        2 => 512,
        3 => 1024,
        4 => 2048,
        _ => 4096,
    }
}

/// P_Key match rule (IBA 10.9.3): same low 15 bits, at least one full member.
/// Whether a port moves datagrams: false once live PortInfo says it is not ACTIVE (ibsim
/// `Unlink`, a disabled switch port, ...). Ports known only from umad2sim's start-up snapshot
/// are trusted, so a process without an SMP agent keeps working as before.
pub fn port_carries_traffic(p: &crate::device::PortAttrs) -> bool {
    !p.live || p.state == ibv_port_state::IBV_PORT_ACTIVE as u8
}

fn pkey_matches(a: u16, b: u16) -> bool {
    (a & 0x7fff) != 0 && (a & 0x7fff) == (b & 0x7fff) && (a | b) & 0x8000 != 0
}

impl QpInner {
    fn set_state(&self, a: &mut QpAttrs, state: u32) {
        a.state = state;
        let p = self.qp_ptr.load(Ordering::Acquire);
        if p != 0 {
            // SAFETY: qp_ptr is our live SimQp (cleared before it is freed); `state` is an
            // informational field callers may read.
            unsafe { (*(p as *mut ibv_qp)).state = state };
        }
    }

    /// Moves to the error state and flushes the receive queue.
    fn enter_error(&self) {
        if let Ok(mut a) = self.attrs.lock() {
            self.set_state(&mut a, IBV_QPS_ERR);
        }
        self.flush_rq();
    }

    fn flush_rq(&self) {
        let drained: Vec<RecvWr> = match self.rq.lock() {
            Ok(mut q) => q.drain(..).collect(),
            Err(_) => return,
        };
        for wr in drained {
            self.recv_cq.push(Completion {
                wr_id: wr.wr_id,
                status: ibv_wc_status::IBV_WC_WR_FLUSH_ERR,
                opcode: ibv_wc_opcode::IBV_WC_RECV,
                qp_num: self.qpn,
                ..Default::default()
            });
        }
    }

    /// Receive-side processing of one datagram (runs in the receiver thread).
    pub(crate) fn deliver(&self, d: &Datagram) {
        let Ok(a) = self.attrs.lock().map(|a| *a) else {
            return;
        };
        if a.state != IBV_QPS_RTR && a.state != IBV_QPS_RTS {
            self.counters.not_ready.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if d.dst_qpn == MCAST_QPN {
            let member = self.mcast.lock().map(|m| {
                m.iter()
                    .any(|(g, l)| *l == d.dlid && (!d.grh || *g == d.dgid))
            });
            if member.ok() != Some(true) {
                self.counters.not_member.fetch_add(1, Ordering::Relaxed);
                return;
            }
        } else if d.dst_qpn != self.qpn {
            self.counters.not_member.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let port = self.ctx.port(a.port).unwrap_or_default();
        if !port_carries_traffic(&port) {
            // The link is down: nothing reaches this port (checked before the Q_Key so a
            // down port never counts violations either).
            self.counters.port_down.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if d.qkey != a.qkey {
            self.counters
                .qkey_violations
                .fetch_add(1, Ordering::Relaxed);
            crate::debug(format_args!(
                "QP {:#x}: Q_Key {:#x} != {:#x}, dropped",
                self.qpn, d.qkey, a.qkey
            ));
            return;
        }
        let own_pkey = port
            .pkeys
            .get(usize::from(a.pkey_index))
            .copied()
            .unwrap_or(0);
        if !pkey_matches(own_pkey, d.pkey) {
            self.counters
                .pkey_violations
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(wr) = self.rq.lock().ok().and_then(|mut q| q.pop_front()) else {
            // UD has no RNR: without a posted receive the datagram is silently dropped.
            self.counters.no_recv_wr.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let total = GRH_LEN + d.payload.len();
        let mut base = Completion {
            wr_id: wr.wr_id,
            opcode: ibv_wc_opcode::IBV_WC_RECV,
            qp_num: self.qpn,
            ..Default::default()
        };
        // Resolve every element first so a bad one writes nothing.
        let mut targets = Vec::with_capacity(wr.sges.len());
        for sge in &wr.sges {
            match resolve_sge(self.pd, sge, true) {
                Ok(p) => targets.push((p, sge.length as usize)),
                Err(_) => {
                    base.status = ibv_wc_status::IBV_WC_LOC_PROT_ERR;
                    self.recv_cq.push(base);
                    self.enter_error();
                    return;
                }
            }
        }
        if targets.iter().map(|t| t.1).sum::<usize>() < total {
            base.status = ibv_wc_status::IBV_WC_LOC_LEN_ERR;
            self.recv_cq.push(base);
            self.enter_error();
            return;
        }
        let grh = d.grh.then(|| d.grh_bytes());
        let mut off = 0usize; // offset in the (GRH area + payload) stream
        for (p, len) in targets {
            if off >= total {
                break;
            }
            let n = len.min(total - off);
            for i in 0..n {
                let pos = off + i;
                let byte = if pos < GRH_LEN {
                    match &grh {
                        Some(g) => g[pos],
                        None => continue, // GRH area is left untouched without a GRH
                    }
                } else {
                    d.payload[pos - GRH_LEN]
                };
                // SAFETY: resolve_sge checked that [p, p+len) lies inside a registered,
                // locally writable region of this QP's PD; i < n <= len.
                unsafe { p.add(i).write(byte) };
            }
            off += n;
        }
        let lmc_mask = (1u16 << port.lmc.min(7)) - 1;
        self.recv_cq.push(Completion {
            status: ibv_wc_status::IBV_WC_SUCCESS,
            byte_len: total as u32,
            imm: d.imm,
            src_qp: d.src_qpn,
            grh: d.grh,
            pkey_index: a.pkey_index,
            slid: d.slid,
            sl: d.sl,
            dlid_path_bits: if d.dlid >= 0xc000 {
                0
            } else {
                (d.dlid & lmc_mask) as u8
            },
            solicited: d.solicited,
            ..base
        });
    }
}

fn receiver_loop(qp: Arc<QpInner>) {
    let mut buf = vec![0u8; Datagram::HEADER_LEN + 65536];
    loop {
        let Ok(sock) = qp.sock.lock().map(|s| s.clone()) else {
            return;
        };
        match sock.recv(&mut buf) {
            Ok(n) => {
                if qp.stop.load(Ordering::Acquire) {
                    return;
                }
                if let Some(d) = Datagram::parse(&buf[..n]) {
                    crate::guard((), || qp.deliver(&d));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                if qp.stop.load(Ordering::Acquire) {
                    return;
                }
            }
            Err(_) => return,
        }
    }
}

/// Picks a QPN and binds its socket; QPNs start at a per-process base so processes of the
/// same node rarely collide, and a taken address moves on to the next number.
/// With `fixed`, only that QPN is tried (rebinding after a LID change).
fn bind_qp_socket(fabric: &str, lid: u16, fixed: Option<u32>) -> Option<(u32, UnixDatagram)> {
    let bind = |qpn: u32| {
        let s = crate::control::bind_abstract(&transport::qp_addr_name(fabric, lid, qpn)).ok()?;
        // The timeout lets the receiver notice `stop` even if a wake-up is missed.
        s.set_read_timeout(Some(std::time::Duration::from_millis(500)))
            .ok()?;
        Some((qpn, s))
    };
    if let Some(qpn) = fixed {
        return bind(qpn);
    }
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = ((std::process::id() & 0xfff) << 12) | 0x10;
    for _ in 0..4096 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let qpn = (base.wrapping_add(n)) & 0x00ff_ffff;
        if qpn < 2 || qpn == MCAST_QPN {
            continue;
        }
        if let Some(r) = bind(qpn) {
            return Some(r);
        }
    }
    None
}

impl QpInner {
    /// Where the receive socket is bound now.
    pub fn bound(&self) -> Bound {
        self.bound.lock().map(|b| *b).unwrap_or(Bound {
            port: 1,
            fabric: "sim",
            lid: 0,
        })
    }

    /// Re-binds the receive socket (and multicast memberships) under `to`.
    fn rebind(&self, to: Bound) {
        let old = self.bound();
        if old == to {
            return;
        }
        let Some((_, sock)) = bind_qp_socket(to.fabric, to.lid, Some(self.qpn)) else {
            crate::log(format_args!(
                "QP {:#x}: cannot rebind under {to:?}, stays at {old:?}",
                self.qpn
            ));
            return;
        };
        let old_sock = match self.sock.lock() {
            Ok(mut s) => std::mem::replace(&mut *s, Arc::new(sock)),
            Err(_) => return,
        };
        if let Ok(mut b) = self.bound.lock() {
            *b = to;
        }
        // SAFETY: `old_sock` is an open socket we own; shutdown makes the receiver's recv on
        // it return so that it switches to the new one.
        unsafe { libc::shutdown(old_sock.as_raw_fd(), libc::SHUT_RDWR) };
        if let Ok(m) = self.mcast.lock() {
            for (g, mlid) in m.iter() {
                transport::mcast_leave(old.fabric, g, old.lid, self.qpn);
                if let Err(e) = transport::mcast_join(to.fabric, g, *mlid, to.lid, self.qpn) {
                    crate::log(format_args!(
                        "QP {:#x}: multicast rejoin failed: {e}",
                        self.qpn
                    ));
                }
            }
        }
        crate::debug(format_args!("QP {:#x}: {old:?} -> {to:?}", self.qpn));
    }
}

impl QpInner {
    /// A unicast UD send to remote QPN 1: through the GSI bridge to that LID's QP1. The send
    /// always completes with success, as on a fabric; what the remote GSI would drop (not one
    /// 256-byte MAD, Q_Key not the GSI's) goes nowhere and is counted.
    fn gsi_send(&self, d: &Datagram) {
        if d.payload.len() != crate::gsi::MAD_SIZE {
            self.counters.gsi_bad_length.fetch_add(1, Ordering::Relaxed);
            crate::debug(format_args!(
                "QP {:#x}: {}-byte datagram to QP1 dropped (a GSI takes 256-byte MADs)",
                self.qpn,
                d.payload.len()
            ));
            return;
        }
        if d.qkey != crate::gsi::GSI_QKEY {
            self.counters.gsi_qkey_drops.fetch_add(1, Ordering::Relaxed);
            crate::debug(format_args!(
                "QP {:#x}: Q_Key {:#x} to QP1 dropped (the GSI takes {:#x})",
                self.qpn,
                d.qkey,
                crate::gsi::GSI_QKEY
            ));
            return;
        }
        let port = self.attrs.lock().map(|a| a.port).unwrap_or(1);
        let (Some(hp), Some(me)) = (
            crate::host::port(&self.ctx.device.ca.name, port),
            self.me.upgrade(),
        ) else {
            self.counters.gsi_lost.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if transport::lost_by_knob() || !crate::gsi::send(&me, hp, d.dlid, d.slid, &d.payload) {
            self.counters.gsi_lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.counters.gsi_sent.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counters of QP `qpn` in any open context, as `name=value` pairs.
pub fn describe_counters(qpn: u32) -> Option<String> {
    let mut out = None;
    crate::device::for_each_context(|c| {
        if out.is_some() {
            return;
        }
        if let Ok(v) = c.qps.lock() {
            if let Some(q) = v
                .iter()
                .filter_map(std::sync::Weak::upgrade)
                .find(|q| q.qpn == qpn)
            {
                out = Some(q.counters.describe());
            }
        }
    });
    out
}

/// Moves every QP of a context on `port` to `new_lid` (called by the port monitor on a LID
/// change).
pub fn rebind_qps(ctx: &ContextState, port: u8, new_lid: u16) {
    let qps: Vec<Arc<QpInner>> = match ctx.qps.lock() {
        Ok(v) => v.iter().filter_map(std::sync::Weak::upgrade).collect(),
        Err(_) => return,
    };
    for q in qps {
        let b = q.bound();
        if b.port == port {
            q.rebind(Bound { lid: new_lid, ..b });
        }
    }
}

/// `ibv_create_qp`: UD only.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        // SAFETY: verbs contract: pd came from ibv_alloc_pd.
        let Some(p) = (unsafe { SimPd::from_ptr(pd) }) else {
            return std::ptr::null_mut();
        };
        if init.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: init is a valid ibv_qp_init_attr (checked non-NULL).
        let ia = unsafe { &mut *init };
        if ia.qp_type != ibv_qp_type::IBV_QPT_UD {
            set_errno(libc::EOPNOTSUPP);
            return std::ptr::null_mut();
        }
        if !ia.srq.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: verbs contract: the CQs came from ibv_create_cq.
        let (Some(scq), Some(rcq)) = (unsafe { SimCq::from_ptr(ia.send_cq) }, unsafe {
            SimCq::from_ptr(ia.recv_cq)
        }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        let c = ia.cap;
        if c.max_send_wr > MAX_QP_WR
            || c.max_recv_wr > MAX_QP_WR
            || c.max_send_sge > MAX_SGE
            || c.max_recv_sge > MAX_SGE
            || c.max_inline_data > MAX_INLINE
        {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let cap = ibv_qp_cap {
            max_send_wr: c.max_send_wr.max(1),
            max_recv_wr: c.max_recv_wr.max(1),
            max_send_sge: c.max_send_sge.max(1),
            max_recv_sge: c.max_recv_sge.max(1),
            max_inline_data: MAX_INLINE,
        };
        ia.cap = cap;
        let lid = p.ctx.port(1).map(|a| a.lid).unwrap_or(0);
        let fabric = port_fabric(&p.ctx, 1);
        let Some((qpn, sock)) = bind_qp_socket(fabric, lid, None) else {
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        };
        let Ok(tx) = UnixDatagram::unbound() else {
            set_errno(libc::EMFILE);
            return std::ptr::null_mut();
        };
        if tx.set_nonblocking(true).is_err() {
            set_errno(libc::EIO);
            return std::ptr::null_mut();
        }
        let inner = Arc::new_cyclic(|me| QpInner {
            qpn,
            bound: Mutex::new(Bound {
                port: 1,
                fabric,
                lid,
            }),
            pd: pd as usize,
            ctx: p.ctx.clone(),
            send_cq: scq.inner.clone(),
            recv_cq: rcq.inner.clone(),
            attrs: Mutex::new(QpAttrs {
                state: IBV_QPS_RESET,
                qkey: 0,
                pkey_index: 0,
                port: 1,
                sq_psn: 0,
            }),
            rq: Mutex::new(VecDeque::new()),
            cap,
            sq_sig_all: ia.sq_sig_all != 0,
            sock: Mutex::new(Arc::new(sock)),
            tx,
            mcast: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            qp_ptr: AtomicUsize::new(0),
            counters: QpCounters::default(),
            gsi: Mutex::new(GsiState::default()),
            me: me.clone(),
        });
        // SAFETY: ibv_qp is plain old data (zeroed pthread objects are valid initialisers).
        let mut q: ibv_qp = unsafe { std::mem::zeroed() };
        q.context = p.pd.context;
        q.qp_context = ia.qp_context;
        q.pd = pd;
        q.send_cq = ia.send_cq;
        q.recv_cq = ia.recv_cq;
        q.handle = qpn;
        q.qp_num = qpn;
        q.state = IBV_QPS_RESET;
        q.qp_type = ibv_qp_type::IBV_QPT_UD;
        let rx_inner = inner.clone();
        let rx = match std::thread::Builder::new()
            .name(format!("simverbs-qp{qpn:x}"))
            .spawn(move || receiver_loop(rx_inner))
        {
            Ok(h) => h,
            Err(_) => {
                set_errno(libc::ENOMEM);
                return std::ptr::null_mut();
            }
        };
        p.users.fetch_add(1, Ordering::AcqRel);
        if let Ok(mut v) = p.ctx.qps.lock() {
            v.push(Arc::downgrade(&inner));
        }
        let shared = inner.clone();
        let b = Box::into_raw(Box::new(SimQp {
            qp: q,
            magic: QP_MAGIC,
            inner,
            rx: Mutex::new(Some(rx)),
        }));
        shared.qp_ptr.store(b as usize, Ordering::Release);
        crate::debug(format_args!("QP {qpn:#x} at LID {lid}"));
        b as *mut ibv_qp
    })
}

/// `ibv_destroy_qp`: stops the receiver, leaves all multicast groups, frees the QP.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: qp came from ibv_create_qp.
        let Some(q) = (unsafe { SimQp::from_ptr(qp) }) else {
            return libc::EINVAL;
        };
        let inner = &q.inner;
        inner.stop.store(true, Ordering::Release);
        inner.qp_ptr.store(0, Ordering::Release);
        if let Ok(s) = inner.sock.lock() {
            // SAFETY: the socket fd is open (the Arc keeps it); shutdown wakes the receiver's
            // blocking recv.
            unsafe { libc::shutdown(s.as_raw_fd(), libc::SHUT_RDWR) };
        }
        let h = q.rx.lock().ok().and_then(|mut h| h.take());
        if let Some(h) = h {
            let _ = h.join();
        }
        crate::gsi::release(inner);
        let b = inner.bound();
        if let Ok(mut m) = inner.mcast.lock() {
            for (g, _) in m.drain(..) {
                transport::mcast_leave(b.fabric, &g, b.lid, inner.qpn);
            }
        }
        if let Ok(mut v) = inner.ctx.qps.lock() {
            v.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(inner)));
        }
        // SAFETY: the PD outlives its QPs (dealloc_pd refuses while users != 0).
        if let Some(p) = unsafe { SimPd::from_ptr(q.qp.pd) } {
            p.users.fetch_sub(1, Ordering::AcqRel);
        }
        // SAFETY: checked live SimQp allocated by Box; the caller gives it up.
        let mut b = unsafe { Box::from_raw(qp as *mut SimQp) };
        b.magic = 0;
        drop(b);
        0
    })
}

const M_STATE: u32 = 1;
const M_CUR_STATE: u32 = 1 << 1;
const M_PKEY_INDEX: u32 = 1 << 4;
const M_PORT: u32 = 1 << 5;
const M_QKEY: u32 = 1 << 6;
const M_SQ_PSN: u32 = 1 << 16;

/// Required and optional attributes of a UD state transition (IBA 11.2.4.2 / table 91).
fn ud_transition(cur: u32, next: u32) -> Option<(u32, u32)> {
    Some(match (cur, next) {
        (_, IBV_QPS_RESET) | (_, IBV_QPS_ERR) => (0, 0),
        (IBV_QPS_RESET, IBV_QPS_INIT) => (M_PKEY_INDEX | M_PORT | M_QKEY, 0),
        (IBV_QPS_INIT, IBV_QPS_INIT) => (0, M_PKEY_INDEX | M_PORT | M_QKEY),
        (IBV_QPS_INIT, IBV_QPS_RTR) => (0, M_PKEY_INDEX | M_QKEY),
        (IBV_QPS_RTR, IBV_QPS_RTS) => (M_SQ_PSN, M_CUR_STATE | M_QKEY),
        (IBV_QPS_RTS, IBV_QPS_RTS) => (0, M_CUR_STATE | M_QKEY),
        _ => return None,
    })
}

/// `ibv_modify_qp`: the UD state machine with attribute-mask validation.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: qp came from ibv_create_qp.
        let Some(q) = (unsafe { SimQp::from_ptr(qp) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: attr is a valid ibv_qp_attr (checked non-NULL).
        let at = unsafe { &*attr };
        let mask = mask as u32;
        let inner = &q.inner;
        let Ok(mut a) = inner.attrs.lock() else {
            return libc::EIO;
        };
        if mask & M_CUR_STATE != 0 && at.cur_qp_state != a.state {
            return libc::EINVAL;
        }
        let next = if mask & M_STATE != 0 {
            at.qp_state
        } else {
            a.state
        };
        let Some((req, opt)) = ud_transition(a.state, next) else {
            return libc::EINVAL;
        };
        let given = mask & !M_STATE;
        if given & req != req || given & !(req | opt) != 0 {
            return libc::EINVAL;
        }
        if mask & M_PORT != 0 && inner.ctx.port(at.port_num).is_none() {
            return libc::EINVAL;
        }
        if mask & M_PKEY_INDEX != 0 {
            let port = if mask & M_PORT != 0 {
                at.port_num
            } else {
                a.port
            };
            let n = inner.ctx.port(port).map(|p| p.pkeys.len()).unwrap_or(0);
            if usize::from(at.pkey_index) >= n {
                return libc::EINVAL;
            }
            a.pkey_index = at.pkey_index;
        }
        if mask & M_PORT != 0 {
            a.port = at.port_num;
        }
        if mask & M_QKEY != 0 {
            a.qkey = at.qkey;
        }
        if mask & M_SQ_PSN != 0 {
            a.sq_psn = at.sq_psn & 0x00ff_ffff;
        }
        let prev = a.state;
        inner.set_state(&mut a, next);
        let port = a.port;
        drop(a);
        if inner.bound().port != port {
            // Bound to the port it now uses: its fabric and LID.
            let lid = inner.ctx.port(port).map(|p| p.lid).unwrap_or(0);
            inner.rebind(Bound {
                port,
                fabric: port_fabric(&inner.ctx, port),
                lid,
            });
        }
        match next {
            IBV_QPS_RESET if prev != IBV_QPS_RESET => {
                if let Ok(mut rq) = inner.rq.lock() {
                    rq.clear();
                }
            }
            IBV_QPS_ERR => inner.flush_rq(),
            _ => {}
        }
        0
    })
}

/// `ibv_query_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: qp came from ibv_create_qp.
        let Some(q) = (unsafe { SimQp::from_ptr(qp) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() || init.is_null() {
            return libc::EINVAL;
        }
        let Ok(a) = q.inner.attrs.lock().map(|a| *a) else {
            return libc::EIO;
        };
        // SAFETY: ibv_qp_attr is plain old data; all-zero is valid.
        let mut out: ibv_qp_attr = unsafe { std::mem::zeroed() };
        out.qp_state = a.state;
        out.cur_qp_state = a.state;
        out.qkey = a.qkey;
        out.sq_psn = a.sq_psn;
        out.pkey_index = a.pkey_index;
        out.port_num = a.port;
        out.cap = q.inner.cap;
        out.path_mtu = u32::from(q.inner.ctx.port(a.port).map(|p| p.active_mtu).unwrap_or(4));
        // SAFETY: attr and init are valid, writable (checked non-NULL).
        unsafe {
            attr.write(out);
            let i = &mut *init;
            i.qp_context = q.qp.qp_context;
            i.send_cq = q.qp.send_cq;
            i.recv_cq = q.qp.recv_cq;
            i.srq = std::ptr::null_mut();
            i.cap = q.inner.cap;
            i.qp_type = ibv_qp_type::IBV_QPT_UD;
            i.sq_sig_all = c_int::from(q.inner.sq_sig_all);
        }
        0
    })
}

/// Builds and routes one send work request. Returns the completion status.
fn send_one(q: &SimQp, a: &QpAttrs, wr: &ibv_send_wr) -> Result<u32, c_int> {
    let inner = &q.inner;
    if wr.opcode != ibv_wr_opcode::IBV_WR_SEND && wr.opcode != ibv_wr_opcode::IBV_WR_SEND_WITH_IMM {
        return Err(libc::EINVAL);
    }
    if wr.num_sge < 0
        || wr.num_sge as u32 > inner.cap.max_send_sge
        || (wr.num_sge > 0 && wr.sg_list.is_null())
    {
        return Err(libc::EINVAL);
    }
    // SAFETY: for a UD QP the `ud` member of the union is the one the caller filled.
    let ud = unsafe { wr.wr.ud };
    // SAFETY: verbs contract: the AH came from ibv_create_ah.
    let Some(ah) = (unsafe { SimAh::from_ptr(ud.ah) }) else {
        return Err(libc::EINVAL);
    };
    let sges: &[ibv_sge] = if wr.num_sge == 0 {
        &[]
    } else {
        // SAFETY: sg_list has num_sge elements (checked non-NULL when num_sge > 0).
        unsafe { std::slice::from_raw_parts(wr.sg_list, wr.num_sge as usize) }
    };
    let total: usize = sges.iter().map(|s| s.length as usize).sum();
    let inline = wr.send_flags & ibv_send_flags::IBV_SEND_INLINE.0 != 0;
    if inline && total > inner.cap.max_inline_data as usize {
        return Err(libc::EINVAL);
    }
    let port = inner.ctx.port(a.port).unwrap_or_default();
    if total > mtu_bytes(port.active_mtu) {
        return Ok(ibv_wc_status::IBV_WC_LOC_LEN_ERR);
    }
    if !port_carries_traffic(&port) {
        // A UD send on a port whose link is down completes but the packet goes nowhere.
        crate::debug(format_args!(
            "QP {:#x}: port {} not ACTIVE (state {}), datagram dropped",
            inner.qpn, a.port, port.state
        ));
        return Ok(ibv_wc_status::IBV_WC_SUCCESS);
    }
    let mut payload = Vec::with_capacity(total);
    for s in sges {
        let src = if inline {
            s.addr as *const u8
        } else {
            match resolve_sge(inner.pd, s, false) {
                Ok(p) => p as *const u8,
                Err(_) => return Ok(ibv_wc_status::IBV_WC_LOC_PROT_ERR),
            }
        };
        if s.length > 0 {
            // SAFETY: non-inline: inside a registered region (resolve_sge); inline: the
            // caller promises the buffer is readable, as libibverbs' providers assume.
            payload
                .extend_from_slice(unsafe { std::slice::from_raw_parts(src, s.length as usize) });
        }
    }
    let attr = ah.attr;
    let qkey = if ud.remote_qkey & 0x8000_0000 != 0 {
        a.qkey
    } else {
        ud.remote_qkey
    };
    let lmc_mask = (1u16 << port.lmc.min(7)) - 1;
    let d = Datagram {
        slid: port.lid | (u16::from(attr.src_path_bits) & lmc_mask),
        dlid: attr.dlid,
        src_qpn: inner.qpn,
        dst_qpn: if attr.dlid >= 0xc000 && attr.dlid < 0xffff {
            MCAST_QPN
        } else {
            ud.remote_qpn & 0x00ff_ffff
        },
        qkey,
        pkey: port
            .pkeys
            .get(usize::from(a.pkey_index))
            .copied()
            .unwrap_or(0xffff),
        sl: attr.sl,
        grh: attr.is_global != 0,
        imm: if wr.opcode == ibv_wr_opcode::IBV_WR_SEND_WITH_IMM {
            // SAFETY: for SEND_WITH_IMM the imm_data member is the one the caller filled.
            Some(unsafe { wr.imm_data_invalidated_rkey_union.imm_data })
        } else {
            None
        },
        solicited: wr.send_flags & ibv_send_flags::IBV_SEND_SOLICITED.0 != 0,
        flow_label: attr.grh.flow_label,
        hop_limit: attr.grh.hop_limit,
        traffic_class: attr.grh.traffic_class,
        sgid: port.gid0(),
        // SAFETY: ibv_gid is a 16-byte union; `raw` views any value.
        dgid: unsafe { attr.grh.dgid.raw },
        payload,
    };
    crate::capture::record(&d);
    if d.dst_qpn == 1 && d.dlid != 0 && d.dlid < 0xc000 {
        inner.gsi_send(&d);
        return Ok(ibv_wc_status::IBV_WC_SUCCESS);
    }
    let bytes = d.emit();
    if d.dst_qpn == MCAST_QPN {
        let b = inner.bound();
        let members = transport::mcast_members(b.fabric, d.grh.then_some(&d.dgid), d.dlid);
        for m in members {
            if m.lid == b.lid && m.qpn == inner.qpn {
                continue; // no loopback to the sending QP itself
            }
            let name = transport::qp_addr_name(b.fabric, m.lid, m.qpn);
            if transport::transmit(&inner.tx, &name, &bytes) == SendOutcome::NoPeer {
                let _ = std::fs::remove_file(&m.path); // stale member of a dead process
            }
        }
    } else if d.dlid != 0xffff && d.dlid != 0 {
        let _ = transport::transmit(
            &inner.tx,
            &transport::qp_addr_name(inner.bound().fabric, d.dlid, d.dst_qpn),
            &bytes,
        );
    }
    Ok(ibv_wc_status::IBV_WC_SUCCESS)
}

/// A work request of a chain handed to `post_send` / `post_recv`.
trait WorkRequest {
    /// The next request of the chain (NULL at the end).
    fn next(&self) -> *mut Self;
}

impl WorkRequest for ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

impl WorkRequest for ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

/// What `post_send` and `post_recv` share: resolves the QP, hands each work request of the
/// chain to `post`, and on the first `Err(code)` (or an unknown QP: EINVAL) stores that
/// request in `*bad_wr`, if given, and returns the code; 0 when every request was posted.
///
/// # Safety
/// `qp` comes from our ops table, `wr` is NULL or a valid chain of work requests and `bad_wr`
/// is NULL or a writable out-pointer.
unsafe fn post_chain<W: WorkRequest>(
    qp: *mut ibv_qp,
    wr: *mut W,
    bad_wr: *mut *mut W,
    mut post: impl FnMut(&SimQp, &W) -> Result<(), c_int>,
) -> c_int {
    let fail = |w: *mut W, code: c_int| {
        if !bad_wr.is_null() {
            // SAFETY: bad_wr is a valid out-pointer (checked non-NULL).
            unsafe { *bad_wr = w };
        }
        code
    };
    // SAFETY: called through our ops table with a QP of our context.
    let Some(q) = (unsafe { SimQp::from_ptr(qp) }) else {
        return fail(wr, libc::EINVAL);
    };
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the caller passes a valid chain of work requests.
        let w = unsafe { &*cur };
        if let Err(code) = post(q, w) {
            return fail(cur, code);
        }
        cur = w.next();
    }
    0
}

/// `ops.post_send`.
unsafe extern "C" fn sim_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        let post = |q: &SimQp, w: &ibv_send_wr| -> Result<(), c_int> {
            let Ok(a) = q.inner.attrs.lock().map(|a| *a) else {
                return Err(libc::EIO);
            };
            let signaled =
                q.inner.sq_sig_all || w.send_flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
            let status = match a.state {
                IBV_QPS_RTS => send_one(q, &a, w)?,
                IBV_QPS_ERR => ibv_wc_status::IBV_WC_WR_FLUSH_ERR,
                _ => return Err(libc::EINVAL),
            };
            let ok = status == ibv_wc_status::IBV_WC_SUCCESS;
            if signaled || !ok {
                q.inner.send_cq.push(Completion {
                    wr_id: w.wr_id,
                    status,
                    opcode: ibv_wc_opcode::IBV_WC_SEND,
                    qp_num: q.inner.qpn,
                    ..Default::default()
                });
            }
            if !ok && status != ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                q.inner.enter_error();
            }
            Ok(())
        };
        // SAFETY: the verbs contract for post calls is post_chain's.
        unsafe { post_chain(qp, wr, bad_wr, post) }
    })
}

/// Receive work requests still to refuse (the `fail_post_recv` knob).
static FAIL_POST_RECV: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Makes the process's next `n` receive work requests fail with ENOMEM (0: none).
pub fn fail_next_post_recvs(n: u64) {
    FAIL_POST_RECV.store(n, std::sync::atomic::Ordering::Release);
}

/// Whether this receive work request is one the knob refuses (and counts it).
fn refuse_post_recv() -> bool {
    use std::sync::atomic::Ordering;
    FAIL_POST_RECV
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

/// `ops.post_recv`.
unsafe extern "C" fn sim_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        let post = |q: &SimQp, w: &ibv_recv_wr| -> Result<(), c_int> {
            if refuse_post_recv() {
                return Err(libc::ENOMEM);
            }
            let inner = &q.inner;
            let state = inner.attrs.lock().map(|a| a.state).unwrap_or(IBV_QPS_RESET);
            if state == IBV_QPS_RESET {
                return Err(libc::EINVAL);
            }
            if w.num_sge < 0
                || w.num_sge as u32 > inner.cap.max_recv_sge
                || (w.num_sge > 0 && w.sg_list.is_null())
            {
                return Err(libc::EINVAL);
            }
            let sges = if w.num_sge == 0 {
                Vec::new()
            } else {
                // SAFETY: sg_list has num_sge elements (checked non-NULL).
                unsafe { std::slice::from_raw_parts(w.sg_list, w.num_sge as usize) }.to_vec()
            };
            if state == IBV_QPS_ERR {
                inner.recv_cq.push(Completion {
                    wr_id: w.wr_id,
                    status: ibv_wc_status::IBV_WC_WR_FLUSH_ERR,
                    opcode: ibv_wc_opcode::IBV_WC_RECV,
                    qp_num: inner.qpn,
                    ..Default::default()
                });
            } else {
                let Ok(mut rq) = inner.rq.lock() else {
                    return Err(libc::EIO);
                };
                if rq.len() >= inner.cap.max_recv_wr as usize {
                    return Err(libc::ENOMEM);
                }
                rq.push_back(RecvWr {
                    wr_id: w.wr_id,
                    sges,
                });
            }
            Ok(())
        };
        // SAFETY: the verbs contract for post calls is post_chain's.
        unsafe { post_chain(qp, wr, bad_wr, post) }
    })
}

/// `ibv_create_ah`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        // SAFETY: verbs contract: pd came from ibv_alloc_pd.
        let Some(p) = (unsafe { SimPd::from_ptr(pd) }) else {
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: attr is a valid ibv_ah_attr (checked non-NULL).
        let at = unsafe { *attr };
        if p.ctx.port(at.port_num).is_none()
            || (at.dlid == 0 && at.is_global == 0)
            || (at.is_global != 0 && at.grh.sgid_index != 0)
        {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        p.users.fetch_add(1, Ordering::AcqRel);
        let b = Box::new(SimAh {
            ah: ibv_ah {
                context: p.pd.context,
                pd,
                handle: 0,
            },
            magic: AH_MAGIC,
            attr: at,
        });
        Box::into_raw(b) as *mut ibv_ah
    })
}

/// `ibv_destroy_ah`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: ah came from ibv_create_ah.
        let Some(a) = (unsafe { SimAh::from_ptr(ah) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the PD outlives its AHs (dealloc_pd refuses while users != 0).
        if let Some(p) = unsafe { SimPd::from_ptr(a.ah.pd) } {
            p.users.fetch_sub(1, Ordering::AcqRel);
        }
        // SAFETY: checked live SimAh allocated by Box; the caller gives it up.
        let mut b = unsafe { Box::from_raw(ah as *mut SimAh) };
        b.magic = 0;
        drop(b);
        0
    })
}

/// `ibv_init_ah_from_wc`: an AH attribute answering the sender of a received datagram.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: verbs contract: context came from ibv_open_device.
        let Some(sc) = (unsafe { crate::device::context_state(context) }) else {
            return -1;
        };
        if wc.is_null() || ah_attr.is_null() || sc.state.port(port_num).is_none() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: wc is a valid ibv_wc (checked non-NULL).
        let w = unsafe { &*wc };
        // SAFETY: ibv_ah_attr is plain old data; all-zero is valid.
        let mut a: ibv_ah_attr = unsafe { std::mem::zeroed() };
        a.dlid = w.slid;
        a.sl = w.sl;
        a.src_path_bits = w.dlid_path_bits;
        a.port_num = port_num;
        if w.wc_flags & ibv_wc_flags::IBV_WC_GRH.0 != 0 {
            if grh.is_null() {
                set_errno(libc::EINVAL);
                return -1;
            }
            // SAFETY: with IBV_WC_GRH the caller passes the 40-byte GRH it received.
            let g = unsafe { std::slice::from_raw_parts(grh as *const u8, GRH_LEN) };
            let w0 = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
            a.is_global = 1;
            let mut sgid = [0u8; 16];
            sgid.copy_from_slice(&g[8..24]);
            a.grh.dgid = ibv_gid { raw: sgid };
            a.grh.flow_label = w0 & 0x000f_ffff;
            a.grh.traffic_class = ((w0 >> 20) & 0xff) as u8;
            a.grh.hop_limit = 0xff;
            a.grh.sgid_index = 0;
        }
        // SAFETY: ah_attr is valid and writable (checked non-NULL).
        unsafe { ah_attr.write(a) };
        0
    })
}

/// `ibv_create_ah_from_wc`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    port_num: u8,
) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        // SAFETY: verbs contract: pd came from ibv_alloc_pd.
        let Some(p) = (unsafe { SimPd::from_ptr(pd) }) else {
            return std::ptr::null_mut();
        };
        // SAFETY: ibv_ah_attr is plain old data; all-zero is valid.
        let mut a: ibv_ah_attr = unsafe { std::mem::zeroed() };
        // SAFETY: same contract as ours for wc/grh; the context is the PD's, `a` is writable.
        if unsafe { ibv_init_ah_from_wc(p.pd.context, port_num, wc, grh, &mut a) } != 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: pd was validated above; `a` is a valid ibv_ah_attr.
        unsafe { ibv_create_ah(pd, &mut a) }
    })
}

/// The QP and the raw GID of an attach/detach call; `None` if either is NULL or the QP is not
/// ours.
///
/// # Safety
/// `qp` is NULL or came from [`ibv_create_qp`]; `gid` is NULL or a valid `ibv_gid`.
unsafe fn mcast_args<'a>(qp: *mut ibv_qp, gid: *const ibv_gid) -> Option<(&'a SimQp, [u8; 16])> {
    // SAFETY: per the contract, qp is NULL or one of our QPs.
    let q = unsafe { SimQp::from_ptr(qp) }?;
    if gid.is_null() {
        return None;
    }
    // SAFETY: gid is a valid 16-byte ibv_gid (checked non-NULL).
    Some((q, unsafe { (*gid).raw }))
}

/// `ibv_attach_mcast`: joins the QP to (`gid`, `lid`) — the MLID the SA assigned.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: qp came from ibv_create_qp, gid is NULL or a valid ibv_gid.
        let Some((q, g)) = (unsafe { mcast_args(qp, gid) }) else {
            return libc::EINVAL;
        };
        if g[0] != 0xff || !(0xc000..0xffff).contains(&lid) {
            return libc::EINVAL;
        }
        let inner = &q.inner;
        let Ok(mut m) = inner.mcast.lock() else {
            return libc::EIO;
        };
        if !m.iter().any(|(mg, ml)| *mg == g && *ml == lid) {
            let b = inner.bound();
            if let Err(e) = transport::mcast_join(b.fabric, &g, lid, b.lid, inner.qpn) {
                return e.raw_os_error().unwrap_or(libc::EIO);
            }
            m.push((g, lid));
        }
        0
    })
}

/// `ibv_detach_mcast`.
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: qp came from ibv_create_qp, gid is NULL or a valid ibv_gid.
        let Some((q, g)) = (unsafe { mcast_args(qp, gid) }) else {
            return libc::EINVAL;
        };
        let inner = &q.inner;
        let Ok(mut m) = inner.mcast.lock() else {
            return libc::EIO;
        };
        let before = m.len();
        m.retain(|(mg, ml)| !(*mg == g && *ml == lid));
        if m.len() == before {
            return libc::EINVAL;
        }
        if !m.iter().any(|(mg, _)| *mg == g) {
            let b = inner.bound();
            transport::mcast_leave(b.fabric, &g, b.lid, inner.qpn);
        }
        0
    })
}

/// `ibv_create_srq`: shared receive queues are not simulated.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    _pd: *mut ibv_pd,
    _attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_rereg_mr`: not simulated (the old MR stays valid), errno EOPNOTSUPP.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    _mr: *mut ibv_mr,
    _flags: c_int,
    _pd: *mut ibv_pd,
    _addr: *mut c_void,
    _length: usize,
    _access: c_int,
) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    -1 // IBV_REREG_MR_ERR_INPUT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ud_state_machine() {
        assert_eq!(
            ud_transition(IBV_QPS_RESET, IBV_QPS_INIT),
            Some((M_PKEY_INDEX | M_PORT | M_QKEY, 0))
        );
        assert!(ud_transition(IBV_QPS_RESET, IBV_QPS_RTR).is_none());
        assert!(ud_transition(IBV_QPS_INIT, IBV_QPS_RTS).is_none());
        assert_eq!(
            ud_transition(IBV_QPS_RTR, IBV_QPS_RTS).map(|r| r.0),
            Some(M_SQ_PSN)
        );
        assert!(ud_transition(IBV_QPS_RTS, IBV_QPS_RESET).is_some());
        assert!(ud_transition(IBV_QPS_ERR, IBV_QPS_RTS).is_none());
    }

    #[test]
    fn pkey_rule() {
        assert!(pkey_matches(0xffff, 0xffff));
        assert!(pkey_matches(0xffff, 0x7fff));
        assert!(!pkey_matches(0x7fff, 0x7fff)); // two limited members
        assert!(!pkey_matches(0xffff, 0x8001));
        assert!(!pkey_matches(0, 0x8000));
    }

    #[test]
    fn only_a_live_non_active_port_stops_traffic() {
        let mut p = crate::device::PortAttrs {
            state: 1,
            ..Default::default()
        };
        assert!(port_carries_traffic(&p), "snapshot-only state is trusted");
        p.live = true;
        assert!(!port_carries_traffic(&p), "live Down");
        p.state = 2;
        assert!(!port_carries_traffic(&p), "live Init");
        p.state = 4;
        assert!(port_carries_traffic(&p), "live Active");
    }
}
