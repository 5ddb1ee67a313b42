//! libibumad, simulated: the `umad_*` API of `<infiniband/umad.h>` (rdma-core 44) over the
//! host's ports ([`crate::host`]), in place of the kernel's umad device.
//!
//! Preloaded, these definitions win over libibumad's for every caller in the process (the
//! ibacm core opens a umad port and an SA agent per port with them; tools' host cores do the
//! same), so umad and verbs see the same CAs, ports, GUIDs and LIDs, and a MAD an agent sends
//! on port k leaves through port k's ibsim client.
//!
//! What the kernel's MAD layer does and this does too:
//! * a CA per host CA, `umad_get_ca`/`umad_get_port` filled from the port's live PortInfo,
//!   NodeInfo and P_Key table (ibsim's control requests: they follow the SM's changes, where
//!   umad2sim's sysfs was a start-up snapshot);
//! * `umad_open_port` returns a pollable fd (an eventfd in semaphore mode: readable while MADs
//!   wait); `umad_register` agents; TID bits 32–47 of a request carry the agent's tag, only
//!   the low 32 bits come back as sent (ibsim writes 48–63), as with the kernel's `hi_tid`;
//! * a request sent with a timeout is re-sent `retries` times and then returned to its agent
//!   with status `ETIMEDOUT` (110), unless a response with its TID arrives first;
//! * `umad_recv` with a buffer too small returns `-ENOSPC` with the length needed and keeps
//!   the MAD queued;
//! * for an agent registered with an RMPP version, a multi-MAD answer is received as the
//!   kernel's RMPP receiver does (each DATA segment acknowledged to its sender, in order,
//!   window 32) and handed over whole: the first segment's headers, then every segment's data.
//!
//! Not done (as under umad2sim): unsolicited requests to agents (ibsim gives QP0/QP1 requests
//! only to SM clients), GRH addressing, RMPP sending (our agents send one-MAD requests).

use crate::host::{self, Consumer, HostPort};
use crate::ibsim::{SimRequest, MAD_SIZE};
use std::collections::VecDeque;
use std::os::raw::{c_char, c_int, c_long, c_void};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use umad_ffi::sys::{UmadCa, UmadPort, CA_MAX_PORTS, CA_NAME_LEN};

/// `UMAD_CA_MAX_PORTS`: port numbers 0..9.
pub const MAX_PORTS: usize = CA_MAX_PORTS;
/// `sizeof(struct ib_user_mad)`: the header before the MAD.
pub const UMAD_SIZE: usize = 64;

/// Byte offsets in `struct ib_user_mad` and its `ib_mad_addr_t` (checked against the installed
/// `umad.h` by the layout test).
pub mod off {
    pub const AGENT_ID: usize = 0;
    pub const STATUS: usize = 4;
    pub const TIMEOUT_MS: usize = 8;
    pub const RETRIES: usize = 12;
    pub const LENGTH: usize = 16;
    pub const ADDR: usize = 20;
    pub const ADDR_QPN: usize = ADDR;
    pub const ADDR_QKEY: usize = ADDR + 4;
    pub const ADDR_LID: usize = ADDR + 8;
    pub const ADDR_SL: usize = ADDR + 10;
    pub const ADDR_GRH_PRESENT: usize = ADDR + 12;
    pub const ADDR_PKEY_INDEX: usize = ADDR + 36;
    /// `sizeof(ib_mad_addr_t)`.
    pub const ADDR_LEN: usize = 44;
}
const ETIMEDOUT_STATUS: u32 = 110;
const LINK_LAYER_IB: &str = "InfiniBand";

/// One port as umad reports it (host byte order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortSnapshot {
    pub port_num: u8,
    pub lid: u16,
    pub lmc: u8,
    pub sm_lid: u16,
    pub sm_sl: u8,
    pub state: u8,
    pub phys_state: u8,
    /// Gb/s as umad reports it (e.g. 10 for 4X SDR).
    pub rate: u32,
    pub capmask: u32,
    pub gid_prefix: u64,
    pub port_guid: u64,
    pub pkeys: Vec<u16>,
}

/// One CA as umad reports it (host byte order).
#[derive(Clone, Debug, Default)]
pub struct CaSnapshot {
    pub name: String,
    pub node_type: u32,
    pub fw_ver: String,
    pub hw_ver: String,
    pub ca_type: String,
    pub node_guid: u64,
    pub system_guid: u64,
    pub ports: Vec<PortSnapshot>,
}

/// Live port attributes from a PortInfo attribute (host byte order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LivePortInfo {
    pub gid_prefix: u64,
    pub lid: u16,
    pub sm_lid: u16,
    pub capmask: u32,
    pub local_port: u8,
    pub link_width_active: u8,
    pub link_speed_active: u8,
    pub state: u8,
    pub phys_state: u8,
    pub lmc: u8,
    pub neighbor_mtu: u8,
    pub sm_sl: u8,
    pub vl_cap: u8,
    pub mtu_cap: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
}

impl LivePortInfo {
    /// Parses the 64-byte PortInfo attribute (IBA 14.2.5.6).
    pub fn parse(d: &[u8]) -> Option<LivePortInfo> {
        if d.len() < 64 {
            return None;
        }
        Some(LivePortInfo {
            gid_prefix: u64::from_be_bytes(d[8..16].try_into().ok()?),
            lid: u16::from_be_bytes([d[16], d[17]]),
            sm_lid: u16::from_be_bytes([d[18], d[19]]),
            capmask: u32::from_be_bytes(d[20..24].try_into().ok()?),
            local_port: d[28],
            link_width_active: d[31],
            state: d[32] & 0x0f,
            phys_state: d[33] >> 4,
            lmc: d[34] & 0x07,
            link_speed_active: d[35] >> 4,
            neighbor_mtu: d[36] >> 4,
            sm_sl: d[36] & 0x0f,
            vl_cap: d[37] >> 4,
            init_type_reply: d[41] >> 4,
            mtu_cap: d[41] & 0x0f,
            subnet_timeout: d[51] & 0x1f,
        })
    }

    /// The rate umad reports for the active width and speed, in Gb/s.
    pub fn rate(&self) -> u32 {
        let lanes = match self.link_width_active {
            1 => 1,
            4 => 8,
            8 => 12,
            _ => 4,
        };
        let per_lane_x10 = match self.link_speed_active {
            2 => 50,
            4 => 100,
            _ => 25,
        };
        lanes * per_lane_x10 / 10
    }
}

/// The node GUID (host order) from a NodeInfo attribute.
fn node_guid(ni: &[u8]) -> u64 {
    u64::from_be_bytes(ni[12..20].try_into().unwrap_or_default())
}

/// What umad reports of one host port, queried live.
pub fn port_snapshot(hp: &HostPort) -> Option<PortSnapshot> {
    let ni = hp.client.node_info()?;
    let pi = LivePortInfo::parse(&hp.client.port_info()?)?;
    hp.note_lid(pi.lid);
    // ibsim's port GUIDs are the node GUID plus the port number (`sim_net.c`).
    let port_guid = node_guid(&ni).wrapping_add(u64::from(pi.local_port.max(1)));
    let cap = usize::from(u16::from_be_bytes([ni[28], ni[29]])).clamp(1, 32);
    let mut pkeys = hp.client.pkeys()?;
    pkeys.truncate(cap);
    Some(PortSnapshot {
        port_num: hp.spec.port,
        lid: pi.lid,
        lmc: pi.lmc,
        sm_lid: pi.sm_lid,
        sm_sl: pi.sm_sl,
        state: pi.state,
        phys_state: pi.phys_state,
        rate: pi.rate(),
        capmask: pi.capmask,
        gid_prefix: pi.gid_prefix,
        port_guid,
        pkeys,
    })
}

/// What umad reports of CA `name` (ports whose query failed are left out).
pub fn read_ca(name: &str) -> Option<CaSnapshot> {
    let ports = host::ca_ports(name);
    let first = ports.first()?;
    let ni = first.client.node_info()?;
    // What umad2sim's sysfs said of an ibsim node: firmware 1, the NodeInfo revision.
    let revision = u32::from_be_bytes(ni[32..36].try_into().unwrap_or_default());
    Some(CaSnapshot {
        name: name.to_string(),
        node_type: 1,
        fw_ver: "1".into(),
        hw_ver: format!("{revision:x}"),
        ca_type: "simulator".into(),
        node_guid: node_guid(&ni),
        system_guid: u64::from_be_bytes(ni[4..12].try_into().unwrap_or_default()),
        ports: ports.iter().filter_map(|p| port_snapshot(p)).collect(),
    })
}

// ---------------------------------------------------------------------------------------
// Open umad ports, agents and their queues.

struct Agent {
    tag: u16,
    class: u8,
    /// Registered with an RMPP version: multi-MAD answers are reassembled for it.
    rmpp: bool,
}

/// An open umad port: the fd callers poll, its agents and the MADs waiting for `umad_recv`.
struct OpenPort {
    fd: c_int,
    hp: &'static Arc<HostPort>,
    agents: Mutex<Vec<Option<Agent>>>,
    queue: Mutex<VecDeque<Vec<u8>>>,
}

fn open_ports() -> &'static Mutex<Vec<Arc<OpenPort>>> {
    static OPEN: OnceLock<Mutex<Vec<Arc<OpenPort>>>> = OnceLock::new();
    OPEN.get_or_init(|| Mutex::new(Vec::new()))
}

fn open_port(fd: c_int) -> Option<Arc<OpenPort>> {
    open_ports()
        .lock()
        .ok()?
        .iter()
        .find(|p| p.fd == fd)
        .cloned()
}

impl OpenPort {
    /// Queues a whole umad (header + MAD) and makes the fd readable.
    fn push(&self, umad: Vec<u8>) {
        let Ok(mut q) = self.queue.lock() else {
            return;
        };
        q.push_back(umad);
        let one: u64 = 1;
        // SAFETY: `fd` is our open eventfd; the buffer is the 8 bytes eventfd takes.
        let n = unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
        if n != 8 {
            crate::log(format_args!("umad port {}: eventfd write failed", self.fd));
        }
    }

    /// Waits until a MAD is queued: `None` = forever, else at most that long. False on a
    /// timeout.
    fn wait(&self, timeout: Option<Duration>) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as c_int);
        loop {
            // SAFETY: `p` is one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, ms) };
            if r > 0 {
                return true;
            }
            if r == 0 {
                return false;
            }
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return false;
            }
        }
    }
}

fn put_header(umad: &mut [u8], agent: u32, status: u32, length: usize) {
    umad[off::AGENT_ID..off::AGENT_ID + 4].copy_from_slice(&agent.to_ne_bytes());
    umad[off::STATUS..off::STATUS + 4].copy_from_slice(&status.to_ne_bytes());
    umad[off::TIMEOUT_MS..off::RETRIES + 4].fill(0);
    umad[off::LENGTH..off::LENGTH + 4].copy_from_slice(&(length as u32).to_ne_bytes());
}

/// A MAD from ibsim for agent `agent` of umad port `fd` (called by the port's reader).
pub fn deliver(fd: c_int, agent: u32, r: &SimRequest) {
    let Some(p) = open_port(fd) else {
        return;
    };
    if r.status != 0 {
        // ibsim returned our request undeliverable; on a fabric it would be lost: the
        // request's timeout answers the agent.
        crate::debug(format_args!(
            "umad port {fd}: MAD to LID {} undeliverable (ibsim status {})",
            r.dlid, r.status
        ));
        return;
    }
    answered(fd, &r.mad);
    capture(r.slid, r.dlid, r.sqp, r.dqp, &r.mad);
    let rmpp = p
        .agents
        .lock()
        .ok()
        .and_then(|a| {
            a.get(agent as usize)
                .and_then(|x| x.as_ref().map(|x| x.rmpp))
        })
        .unwrap_or(false);
    let mad = if rmpp && r.mad[3] & 0x80 != 0 && r.mad[26] & RMPP_ACTIVE != 0 {
        match rmpp_segment(&p, agent, r) {
            Some(whole) => whole,
            None => return, // more to come (or not a data segment)
        }
    } else {
        r.mad.to_vec()
    };
    let mut u = vec![0u8; UMAD_SIZE + mad.len()];
    put_header(&mut u, agent, 0, UMAD_SIZE + mad.len());
    // ib_mad_addr: qpn, qkey (network order), lid, sl; no GRH, P_Key index 0.
    u[off::ADDR_QPN..off::ADDR_QPN + 4].copy_from_slice(&(r.sqp & 0x00ff_ffff).to_be_bytes());
    u[off::ADDR_QKEY..off::ADDR_QKEY + 4].copy_from_slice(&crate::gsi::GSI_QKEY.to_be_bytes());
    u[off::ADDR_LID..off::ADDR_LID + 2].copy_from_slice(&r.slid.to_be_bytes());
    u[UMAD_SIZE..].copy_from_slice(&mad);
    p.push(u);
}

// ---------------------------------------------------------------------------------------
// RMPP receiving (the kernel MAD layer's part, for agents registered with an RMPP version).

/// RMPP header (IBA 13.6.2) after the 24-byte MAD header: version, type, RRespTime/flags,
/// status, SegmentNumber, PayloadLength/NewWindowLast.
const RMPP_ACTIVE: u8 = 0x01;
const RMPP_FIRST: u8 = 0x02;
const RMPP_LAST: u8 = 0x04;
const RMPP_TYPE_DATA: u8 = 1;
const RMPP_TYPE_ACK: u8 = 2;
/// The MAD and class headers every segment repeats (the SA's: 24 + 12 + 20 bytes).
const RMPP_HDR: usize = 56;
/// The window the receiver grants (segments past the one acknowledged).
const RMPP_WINDOW: u32 = 32;
/// Transfers kept at once (the oldest is dropped for a new one).
const RMPP_TRANSFERS: usize = 64;

/// A multi-MAD answer being received: the first segment's headers and the data so far.
struct Transfer {
    fd: c_int,
    agent: u32,
    tid: u64,
    next: u32,
    mad: Vec<u8>,
}

fn transfers() -> &'static Mutex<VecDeque<Transfer>> {
    static T: OnceLock<Mutex<VecDeque<Transfer>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(VecDeque::new()))
}

/// Takes one RMPP segment of an answer for `agent`: acknowledges it to the sender (a request,
/// as the kernel's receiver sends them) and returns the whole reassembled MAD after the last
/// one: the first segment's 56 header bytes, then each segment's data (IBA's length rule: the
/// last segment's PayloadLength says how much of it is data).
fn rmpp_segment(p: &OpenPort, agent: u32, r: &SimRequest) -> Option<Vec<u8>> {
    let m = &r.mad;
    if m[25] != RMPP_TYPE_DATA {
        return None; // STOP/ABORT of a transfer: nothing to deliver
    }
    let seg = u32::from_be_bytes(m[28..32].try_into().ok()?);
    let paylen = u32::from_be_bytes(m[32..36].try_into().ok()?) as usize;
    let flags = m[26];
    let tid = tid_of(m);
    let mut t = transfers().lock().ok()?;
    let i = t
        .iter()
        .position(|x| x.fd == p.fd && x.agent == agent && x.tid == tid);
    if flags & RMPP_FIRST != 0 && seg == 1 {
        if let Some(i) = i {
            t.remove(i);
        }
        if t.len() >= RMPP_TRANSFERS {
            t.pop_front();
        }
        t.push_back(Transfer {
            fd: p.fd,
            agent,
            tid,
            next: 1,
            mad: m[..RMPP_HDR].to_vec(),
        });
    }
    let Some(i) = t
        .iter()
        .position(|x| x.fd == p.fd && x.agent == agent && x.tid == tid)
    else {
        return None; // a segment of a transfer we do not know (its first was lost)
    };
    let x = &mut t[i];
    if seg == x.next {
        let data = if flags & RMPP_LAST != 0 {
            paylen
                .saturating_sub(RMPP_HDR - 36)
                .min(MAD_SIZE - RMPP_HDR)
        } else {
            MAD_SIZE - RMPP_HDR
        };
        x.mad.extend_from_slice(&m[RMPP_HDR..RMPP_HDR + data]);
        x.next += 1;
    }
    // ACK the last segment received in order (a repeat or a gap re-acknowledges it).
    let acked = x.next - 1;
    let mut ack = [0u8; MAD_SIZE];
    ack[..36].copy_from_slice(&m[..36]);
    ack[3] &= !0x80;
    ack[25] = RMPP_TYPE_ACK;
    ack[26] = (m[26] & 0xf8) | RMPP_ACTIVE;
    ack[27] = 0;
    ack[28..32].copy_from_slice(&acked.to_be_bytes());
    ack[32..36].copy_from_slice(&(acked + RMPP_WINDOW).to_be_bytes());
    let slid = p.hp.cached_lid();
    capture(slid, r.slid, 1, r.sqp, &ack);
    p.hp.send(r.slid, slid, r.sqp & 0x00ff_ffff, 1, &ack);
    if flags & RMPP_LAST != 0 && seg + 1 == t[i].next {
        return t.remove(i).map(|done| done.mad);
    }
    None
}

/// With `SIMVERBS_PCAP`, a MAD an agent sends or receives goes into the capture as the
/// sender's frame (as the GSI bridge's do), so a capture holds the umad traffic too.
fn capture(slid: u16, dlid: u16, sqp: u32, dqp: u32, mad: &[u8]) {
    crate::capture::record(&crate::transport::Datagram {
        slid,
        dlid,
        src_qpn: sqp & 0x00ff_ffff,
        dst_qpn: dqp & 0x00ff_ffff,
        qkey: if sqp == 0 { 0 } else { crate::gsi::GSI_QKEY },
        pkey: 0xffff,
        payload: mad.to_vec(),
        ..Default::default()
    });
}

// ---------------------------------------------------------------------------------------
// Timeouts and retries of sent requests (the kernel MAD layer's part).

struct Pending {
    fd: c_int,
    agent: u32,
    /// TID bits 0–47 as sent (the tag in 32–47); ibsim owns 48–63.
    tid48: u64,
    deadline: Instant,
    timeout: Duration,
    retries_left: u32,
    /// Where it went, for a re-send.
    dlid: u16,
    slid: u16,
    dqp: u32,
    sqp: u32,
    /// The umad as sent (header + MAD), returned on a timeout.
    umad: Vec<u8>,
}

struct Timers {
    pending: Mutex<Vec<Pending>>,
    wake: Condvar,
}

fn timers() -> &'static Timers {
    static T: OnceLock<Timers> = OnceLock::new();
    T.get_or_init(|| {
        let _ = std::thread::Builder::new()
            .name("simverbs-umad-timer".into())
            .spawn(timer_loop);
        Timers {
            pending: Mutex::new(Vec::new()),
            wake: Condvar::new(),
        }
    })
}

const TID48: u64 = 0x0000_ffff_ffff_ffff;

fn tid_of(mad: &[u8]) -> u64 {
    u64::from_be_bytes(mad[8..16].try_into().unwrap_or_default())
}

/// A response arrived: its request no longer times out.
fn answered(fd: c_int, mad: &[u8]) {
    let t = tid_of(mad) & TID48;
    if let Ok(mut v) = timers().pending.lock() {
        v.retain(|p| !(p.fd == fd && p.tid48 == t));
    }
}

fn timer_loop() {
    let t = timers();
    let Ok(mut pending) = t.pending.lock() else {
        return;
    };
    loop {
        let now = Instant::now();
        let mut expired: Vec<Pending> = Vec::new();
        let mut i = 0;
        while i < pending.len() {
            if pending[i].deadline > now {
                i += 1;
                continue;
            }
            if pending[i].retries_left > 0 {
                let p = &mut pending[i];
                p.retries_left -= 1;
                p.deadline = now + p.timeout;
                if let Some(op) = open_port(p.fd) {
                    capture(p.slid, p.dlid, p.sqp, p.dqp, &p.umad[UMAD_SIZE..]);
                    op.hp
                        .send(p.dlid, p.slid, p.dqp, p.sqp, &p.umad[UMAD_SIZE..]);
                }
                i += 1;
            } else {
                expired.push(pending.swap_remove(i));
            }
        }
        if !expired.is_empty() {
            drop(pending);
            for p in expired {
                if let Some(op) = open_port(p.fd) {
                    let mut u = p.umad;
                    let len = u.len();
                    put_header(&mut u, p.agent, ETIMEDOUT_STATUS, len);
                    op.push(u);
                }
            }
            pending = match t.pending.lock() {
                Ok(g) => g,
                Err(_) => return,
            };
            continue;
        }
        let next = pending.iter().map(|p| p.deadline).min();
        pending = match next {
            None => match t.wake.wait(pending) {
                Ok(g) => g,
                Err(_) => return,
            },
            Some(d) => match t
                .wake
                .wait_timeout(pending, d.saturating_duration_since(Instant::now()))
            {
                Ok((g, _)) => g,
                Err(_) => return,
            },
        };
    }
}

// ---------------------------------------------------------------------------------------
// The exported API.

fn set_errno_ret(code: c_int) -> c_int {
    crate::set_errno(code);
    -code
}

/// # Safety
/// `s` must be NULL or a NUL-terminated string.
unsafe fn ca_arg(s: *const c_char) -> Option<String> {
    if s.is_null() {
        return host::ca_names().into_iter().next();
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let name = unsafe { std::ffi::CStr::from_ptr(s) }
        .to_string_lossy()
        .into_owned();
    host::ca_names().into_iter().find(|n| *n == name)
}

/// Port `portnum` of CA `ca`; 0 is the first ACTIVE port, else the first one (libibumad's
/// `resolve_ca_port`).
fn resolve_port(ca: &str, portnum: c_int) -> Option<&'static Arc<HostPort>> {
    if portnum != 0 {
        return u8::try_from(portnum).ok().and_then(|n| host::port(ca, n));
    }
    let ports = host::ca_ports(ca);
    ports
        .iter()
        .copied()
        .find(|p| {
            p.client
                .port_info()
                .and_then(|d| LivePortInfo::parse(&d))
                .is_some_and(|l| l.state == 4)
        })
        .or_else(|| ports.first().copied())
}

/// Fills a `umad_port_t`; its P_Key table is malloc'ed (freed by [`umad_release_port`]).
fn fill_port(dst: &mut UmadPort, ca: &str, p: &PortSnapshot) {
    crate::copy_cstr(&mut dst.ca_name, ca);
    dst.portnum = c_int::from(p.port_num);
    dst.base_lid = u32::from(p.lid);
    dst.lmc = u32::from(p.lmc);
    dst.sm_lid = u32::from(p.sm_lid);
    dst.sm_sl = u32::from(p.sm_sl);
    dst.state = u32::from(p.state);
    dst.phys_state = u32::from(p.phys_state);
    dst.rate = p.rate;
    dst.capmask = p.capmask.to_be();
    dst.gid_prefix = p.gid_prefix.to_be();
    dst.port_guid = p.port_guid.to_be();
    // SAFETY: malloc of the table's size; NULL is handled below.
    let keys = unsafe { libc::malloc(p.pkeys.len().max(1) * 2) } as *mut u16;
    if keys.is_null() {
        dst.pkeys = std::ptr::null_mut();
        dst.pkeys_size = 0;
    } else {
        for (i, k) in p.pkeys.iter().enumerate() {
            // SAFETY: `keys` has room for pkeys.len() entries.
            unsafe { *keys.add(i) = k.to_be() };
        }
        dst.pkeys = keys;
        dst.pkeys_size = p.pkeys.len() as u32;
    }
    crate::copy_cstr(&mut dst.link_layer, LINK_LAYER_IB);
}

#[no_mangle]
pub extern "C" fn umad_init() -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn umad_done() -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn umad_debug(level: c_int) -> c_int {
    static LEVEL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    if level >= 0 {
        LEVEL.store(level, std::sync::atomic::Ordering::Relaxed);
    }
    LEVEL.load(std::sync::atomic::Ordering::Relaxed)
}

#[no_mangle]
pub unsafe extern "C" fn umad_get_cas_names(cas: *mut [c_char; CA_NAME_LEN], max: c_int) -> c_int {
    crate::guard(-libc::EIO, || {
        if cas.is_null() || max < 0 {
            return set_errno_ret(libc::EINVAL);
        }
        let names = host::ca_names();
        let n = names.len().min(max as usize);
        for (i, name) in names.iter().take(n).enumerate() {
            // SAFETY: the caller gives room for `max` names.
            crate::copy_cstr(unsafe { &mut *cas.add(i) }, name);
        }
        n as c_int
    })
}

/// `struct umad_device_node`: a list of CA names.
#[repr(C)]
pub struct DeviceNode {
    next: *mut DeviceNode,
    ca_name: *const c_char,
}

#[no_mangle]
pub extern "C" fn umad_get_ca_device_list() -> *mut DeviceNode {
    crate::guard(std::ptr::null_mut(), || {
        let mut head: *mut DeviceNode = std::ptr::null_mut();
        for name in host::ca_names().iter().rev() {
            let size = std::mem::size_of::<DeviceNode>() + name.len() + 1;
            // SAFETY: one allocation holds the node and its name, as libibumad's does (the
            // caller frees it with umad_free_ca_device_list, or free()).
            let node = unsafe { libc::calloc(1, size) } as *mut DeviceNode;
            if node.is_null() {
                // SAFETY: the nodes made so far.
                unsafe { umad_free_ca_device_list(head) };
                crate::set_errno(libc::ENOMEM);
                return std::ptr::null_mut();
            }
            // SAFETY: `node` has room for the node and name.len() + 1 bytes after it.
            unsafe {
                let text = node.add(1) as *mut u8;
                std::ptr::copy_nonoverlapping(name.as_ptr(), text, name.len());
                (*node).ca_name = text as *const c_char;
                (*node).next = head;
            }
            head = node;
        }
        head
    })
}

#[no_mangle]
pub unsafe extern "C" fn umad_free_ca_device_list(head: *mut DeviceNode) {
    let mut n = head;
    while !n.is_null() {
        // SAFETY: a list made by umad_get_ca_device_list.
        let next = unsafe { (*n).next };
        // SAFETY: as above; each node is one calloc.
        unsafe { libc::free(n.cast()) };
        n = next;
    }
}

#[no_mangle]
pub unsafe extern "C" fn umad_sort_ca_device_list(
    head: *mut *mut DeviceNode,
    _size: usize,
) -> c_int {
    if head.is_null() {
        return libc::EINVAL;
    }
    let mut nodes: Vec<*mut DeviceNode> = Vec::new();
    // SAFETY: the caller's list head.
    let mut n = unsafe { *head };
    while !n.is_null() {
        nodes.push(n);
        // SAFETY: a list made by umad_get_ca_device_list.
        n = unsafe { (*n).next };
    }
    // SAFETY: every node's name is a C string.
    nodes.sort_by_key(|n| unsafe { std::ffi::CStr::from_ptr((**n).ca_name) }.to_owned());
    let mut next: *mut DeviceNode = std::ptr::null_mut();
    for n in nodes.iter().rev() {
        // SAFETY: as above.
        unsafe { (**n).next = next };
        next = *n;
    }
    // SAFETY: the caller's list head.
    unsafe { *head = next };
    0
}

#[no_mangle]
pub unsafe extern "C" fn umad_get_ca_portguids(
    ca_name: *const c_char,
    portguids: *mut u64,
    max: c_int,
) -> c_int {
    crate::guard(-libc::EIO, || {
        // SAFETY: per the API, ca_name is NULL or a C string.
        let Some(ca) = (unsafe { ca_arg(ca_name) }) else {
            return set_errno_ret(libc::ENODEV);
        };
        let Some(snap) = read_ca(&ca) else {
            return set_errno_ret(libc::ENODEV);
        };
        // Index 0 is port 0 (none on a CA), then ports 1..n, as libibumad lists them.
        let n = snap.ports.len() + 1;
        if portguids.is_null() || (max as usize) < n {
            return set_errno_ret(libc::ENOMEM);
        }
        // SAFETY: the caller gives room for `max` >= n GUIDs.
        unsafe { *portguids = 0 };
        for (i, p) in snap.ports.iter().enumerate() {
            // SAFETY: as above.
            unsafe { *portguids.add(i + 1) = p.port_guid.to_be() };
        }
        n as c_int
    })
}

#[no_mangle]
pub unsafe extern "C" fn umad_get_ca(ca_name: *const c_char, ca: *mut UmadCa) -> c_int {
    crate::guard(-libc::EIO, || {
        // SAFETY: per the API, ca_name is NULL or a C string.
        let Some(name) = (unsafe { ca_arg(ca_name) }) else {
            return set_errno_ret(libc::ENODEV);
        };
        if ca.is_null() {
            return set_errno_ret(libc::EINVAL);
        }
        let Some(snap) = read_ca(&name) else {
            return set_errno_ret(libc::ENODEV);
        };
        // SAFETY: `ca` is a writable umad_ca_t; all-zero is a valid value of it.
        let ca = unsafe {
            std::ptr::write_bytes(ca, 0, 1);
            &mut *ca
        };
        crate::copy_cstr(&mut ca.ca_name, &snap.name);
        ca.node_type = snap.node_type;
        ca.numports = snap.ports.len() as c_int;
        crate::copy_cstr(&mut ca.fw_ver, &snap.fw_ver);
        crate::copy_cstr(&mut ca.ca_type, &snap.ca_type);
        crate::copy_cstr(&mut ca.hw_ver, &snap.hw_ver);
        ca.node_guid = snap.node_guid.to_be();
        ca.system_guid = snap.system_guid.to_be();
        for p in &snap.ports {
            let i = usize::from(p.port_num);
            if i >= MAX_PORTS {
                continue;
            }
            // SAFETY: calloc of one umad_port_t (all-zero is valid); freed in release.
            let port = unsafe { libc::calloc(1, std::mem::size_of::<UmadPort>()) } as *mut UmadPort;
            if port.is_null() {
                continue;
            }
            // SAFETY: just allocated and zeroed.
            fill_port(unsafe { &mut *port }, &snap.name, p);
            ca.ports[i] = port;
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn umad_release_ca(ca: *mut UmadCa) -> c_int {
    crate::guard(-libc::EIO, || {
        if ca.is_null() {
            return set_errno_ret(libc::EINVAL);
        }
        // SAFETY: `ca` was filled by umad_get_ca.
        let ca = unsafe { &mut *ca };
        for p in ca.ports.iter_mut() {
            if !p.is_null() {
                // SAFETY: allocated by umad_get_ca with calloc, its table with malloc.
                unsafe {
                    libc::free((**p).pkeys.cast());
                    libc::free((*p).cast());
                }
                *p = std::ptr::null_mut();
            }
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn umad_get_port(
    ca_name: *const c_char,
    portnum: c_int,
    port: *mut UmadPort,
) -> c_int {
    crate::guard(-libc::EIO, || {
        // SAFETY: per the API, ca_name is NULL or a C string.
        let Some(name) = (unsafe { ca_arg(ca_name) }) else {
            return set_errno_ret(libc::ENODEV);
        };
        if port.is_null() {
            return set_errno_ret(libc::EINVAL);
        }
        let Some(hp) = resolve_port(&name, portnum) else {
            return set_errno_ret(libc::ENODEV);
        };
        let Some(snap) = port_snapshot(hp) else {
            return set_errno_ret(libc::EIO);
        };
        // SAFETY: `port` is a writable umad_port_t; all-zero is a valid value of it.
        let port = unsafe {
            std::ptr::write_bytes(port, 0, 1);
            &mut *port
        };
        fill_port(port, &name, &snap);
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn umad_release_port(port: *mut UmadPort) -> c_int {
    crate::guard(-libc::EIO, || {
        if port.is_null() {
            return set_errno_ret(libc::EINVAL);
        }
        // SAFETY: filled by umad_get_port; its table was malloc'ed there.
        unsafe {
            libc::free((*port).pkeys.cast());
            (*port).pkeys = std::ptr::null_mut();
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn umad_get_issm_path(
    _ca_name: *const c_char,
    _portnum: c_int,
    _path: *mut c_char,
    _max: c_int,
) -> c_int {
    // No issm device: a simulated host never becomes an SM through it.
    set_errno_ret(libc::ENOSYS)
}

#[no_mangle]
pub unsafe extern "C" fn umad_open_port(ca_name: *const c_char, portnum: c_int) -> c_int {
    crate::guard(-libc::EIO, || {
        // SAFETY: per the API, ca_name is NULL or a C string.
        let Some(name) = (unsafe { ca_arg(ca_name) }) else {
            return set_errno_ret(libc::ENODEV);
        };
        let Some(hp) = resolve_port(&name, portnum) else {
            return set_errno_ret(libc::ENODEV);
        };
        // SAFETY: plain eventfd creation.
        let fd = unsafe {
            libc::eventfd(
                0,
                libc::EFD_SEMAPHORE | libc::EFD_NONBLOCK | libc::EFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return set_errno_ret(libc::EMFILE);
        }
        let op = Arc::new(OpenPort {
            fd,
            hp,
            agents: Mutex::new(Vec::new()),
            queue: Mutex::new(VecDeque::new()),
        });
        match open_ports().lock() {
            Ok(mut v) => v.push(op),
            Err(_) => return set_errno_ret(libc::EIO),
        }
        crate::debug(format_args!(
            "umad port {fd} = {name} port {} ({}/{})",
            hp.spec.port, hp.spec.sock, hp.spec.node
        ));
        fd
    })
}

#[no_mangle]
pub extern "C" fn umad_close_port(portid: c_int) -> c_int {
    crate::guard(-libc::EIO, || {
        let op = match open_ports().lock() {
            Ok(mut v) => match v.iter().position(|p| p.fd == portid) {
                Some(i) => v.swap_remove(i),
                None => return set_errno_ret(libc::EINVAL),
            },
            Err(_) => return set_errno_ret(libc::EIO),
        };
        if let Ok(a) = op.agents.lock() {
            for ag in a.iter().flatten() {
                op.hp.remove_consumer(ag.tag);
            }
        }
        if let Ok(mut v) = timers().pending.lock() {
            v.retain(|p| p.fd != portid);
        }
        // SAFETY: our eventfd, closed once (the port left the table above).
        unsafe { libc::close(portid) };
        0
    })
}

#[no_mangle]
pub extern "C" fn umad_get_fd(portid: c_int) -> c_int {
    if open_port(portid).is_some() {
        portid
    } else {
        set_errno_ret(libc::EINVAL)
    }
}

fn register(portid: c_int, class: c_int, rmpp: bool) -> c_int {
    let Some(op) = open_port(portid) else {
        return set_errno_ret(libc::EINVAL);
    };
    let Ok(class) = u8::try_from(class) else {
        return set_errno_ret(libc::EINVAL);
    };
    let Ok(mut agents) = op.agents.lock() else {
        return set_errno_ret(libc::EIO);
    };
    if agents.iter().flatten().any(|a| a.class == class) {
        // The kernel refuses a second agent of a class on one port.
        return set_errno_ret(libc::EBUSY);
    }
    let id = agents
        .iter()
        .position(Option::is_none)
        .unwrap_or(agents.len());
    if id >= 32 {
        return set_errno_ret(libc::ENOMEM);
    }
    let Some(tag) = op.hp.add_consumer(Consumer::Agent {
        fd: portid,
        agent: id as u32,
    }) else {
        return set_errno_ret(libc::ENOMEM);
    };
    let a = Agent { tag, class, rmpp };
    if id == agents.len() {
        agents.push(Some(a));
    } else {
        agents[id] = Some(a);
    }
    id as c_int
}

#[no_mangle]
pub unsafe extern "C" fn umad_register(
    portid: c_int,
    mgmt_class: c_int,
    _mgmt_version: c_int,
    rmpp_version: u8,
    _method_mask: *mut c_long,
) -> c_int {
    crate::guard(-libc::EIO, || {
        register(portid, mgmt_class, rmpp_version != 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn umad_register_oui(
    portid: c_int,
    mgmt_class: c_int,
    rmpp_version: u8,
    _oui: *mut u8,
    _method_mask: *mut c_long,
) -> c_int {
    crate::guard(-libc::EIO, || {
        register(portid, mgmt_class, rmpp_version != 0)
    })
}

/// `struct umad_reg_attr`: the management class first, the RMPP version at byte 28.
#[no_mangle]
pub unsafe extern "C" fn umad_register2(
    port_fd: c_int,
    attr: *mut u8,
    agent_id: *mut u32,
) -> c_int {
    crate::guard(-libc::EIO, || {
        if attr.is_null() || agent_id.is_null() {
            return set_errno_ret(libc::EINVAL);
        }
        // SAFETY: attr points at a umad_reg_attr (32 bytes): mgmt_class first, rmpp_version
        // after flags, method_mask[2] and oui.
        let (class, rmpp) = unsafe { (*attr, *attr.add(28)) };
        let id = register(port_fd, c_int::from(class), rmpp != 0);
        if id < 0 {
            return id;
        }
        // SAFETY: the caller's out-parameter.
        unsafe { *agent_id = id as u32 };
        0
    })
}

#[no_mangle]
pub extern "C" fn umad_unregister(portid: c_int, agentid: c_int) -> c_int {
    crate::guard(-libc::EIO, || {
        let Some(op) = open_port(portid) else {
            return set_errno_ret(libc::EINVAL);
        };
        let Ok(mut agents) = op.agents.lock() else {
            return set_errno_ret(libc::EIO);
        };
        match usize::try_from(agentid)
            .ok()
            .and_then(|i| agents.get_mut(i))
            .and_then(Option::take)
        {
            Some(a) => {
                op.hp.remove_consumer(a.tag);
                0
            }
            None => set_errno_ret(libc::EINVAL),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn umad_get_mad(umad: *mut c_void) -> *mut c_void {
    // SAFETY: per the API the buffer holds at least the umad header.
    unsafe { umad.cast::<u8>().add(UMAD_SIZE).cast() }
}

#[no_mangle]
pub extern "C" fn umad_size() -> usize {
    UMAD_SIZE
}

#[no_mangle]
pub unsafe extern "C" fn umad_status(umad: *mut c_void) -> c_int {
    // SAFETY: per the API the buffer holds a umad header.
    unsafe { (umad.cast::<u8>().add(off::STATUS) as *const c_int).read_unaligned() }
}

#[no_mangle]
pub unsafe extern "C" fn umad_get_mad_addr(umad: *mut c_void) -> *mut c_void {
    // SAFETY: per the API the buffer holds a umad header.
    unsafe { umad.cast::<u8>().add(off::ADDR).cast() }
}

#[no_mangle]
pub unsafe extern "C" fn umad_set_addr_net(
    umad: *mut c_void,
    dlid: u16,
    dqp: u32,
    sl: c_int,
    qkey: u32,
) -> c_int {
    // SAFETY: per the API the buffer holds a umad header.
    let h = unsafe { std::slice::from_raw_parts_mut(umad.cast::<u8>(), UMAD_SIZE) };
    h[off::ADDR_QPN..off::ADDR_QPN + 4].copy_from_slice(&dqp.to_ne_bytes());
    h[off::ADDR_QKEY..off::ADDR_QKEY + 4].copy_from_slice(&qkey.to_ne_bytes());
    h[off::ADDR_LID..off::ADDR_LID + 2].copy_from_slice(&dlid.to_ne_bytes());
    h[off::ADDR_SL] = sl as u8;
    0
}

#[no_mangle]
pub unsafe extern "C" fn umad_set_addr(
    umad: *mut c_void,
    dlid: c_int,
    dqp: c_int,
    sl: c_int,
    qkey: c_int,
) -> c_int {
    // SAFETY: the caller's buffer, as for umad_set_addr_net.
    unsafe {
        umad_set_addr_net(
            umad,
            (dlid as u16).to_be(),
            (dqp as u32).to_be(),
            sl,
            (qkey as u32).to_be(),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn umad_set_grh(umad: *mut c_void, mad_addr: *mut c_void) -> c_int {
    // SAFETY: per the API the buffer holds a umad header.
    let h = unsafe { std::slice::from_raw_parts_mut(umad.cast::<u8>(), UMAD_SIZE) };
    if mad_addr.is_null() {
        h[off::ADDR_GRH_PRESENT] = 0;
        return 0;
    }
    // SAFETY: mad_addr is an ib_mad_addr_t; we take its GRH fields (gid_index .. flow_label).
    let a = unsafe { std::slice::from_raw_parts(mad_addr.cast::<u8>(), off::ADDR_LEN) };
    h[off::ADDR_GRH_PRESENT] = 1;
    let (from, to) = (
        off::ADDR_GRH_PRESENT - off::ADDR + 1,
        off::ADDR_PKEY_INDEX - off::ADDR,
    );
    h[off::ADDR + from..off::ADDR + to].copy_from_slice(&a[from..to]);
    0
}

#[no_mangle]
pub unsafe extern "C" fn umad_set_grh_net(umad: *mut c_void, mad_addr: *mut c_void) -> c_int {
    // SAFETY: as umad_set_grh.
    unsafe { umad_set_grh(umad, mad_addr) }
}

#[no_mangle]
pub unsafe extern "C" fn umad_set_pkey(umad: *mut c_void, pkey_index: c_int) -> c_int {
    // SAFETY: per the API the buffer holds a umad header.
    unsafe {
        (umad.cast::<u8>().add(off::ADDR_PKEY_INDEX) as *mut u16).write_unaligned(pkey_index as u16)
    };
    0
}

#[no_mangle]
pub unsafe extern "C" fn umad_get_pkey(umad: *mut c_void) -> c_int {
    // SAFETY: as umad_set_pkey.
    c_int::from(unsafe {
        (umad.cast::<u8>().add(off::ADDR_PKEY_INDEX) as *const u16).read_unaligned()
    })
}

#[no_mangle]
pub unsafe extern "C" fn umad_send(
    portid: c_int,
    agentid: c_int,
    umad: *mut c_void,
    length: c_int,
    timeout_ms: c_int,
    retries: c_int,
) -> c_int {
    crate::guard(-libc::EIO, || {
        let Some(op) = open_port(portid) else {
            return set_errno_ret(libc::EINVAL);
        };
        let tag = op.agents.lock().ok().and_then(|a| {
            usize::try_from(agentid)
                .ok()
                .and_then(|i| a.get(i).and_then(|x| x.as_ref().map(|x| x.tag)))
        });
        let Some(tag) = tag else {
            return set_errno_ret(libc::EINVAL);
        };
        if umad.is_null() || !(24..=MAD_SIZE as c_int).contains(&length) {
            return set_errno_ret(libc::EINVAL);
        }
        // SAFETY: the caller's buffer holds the header and `length` MAD bytes.
        let src =
            unsafe { std::slice::from_raw_parts(umad.cast::<u8>(), UMAD_SIZE + length as usize) };
        let mut u = vec![0u8; UMAD_SIZE + MAD_SIZE];
        u[..src.len()].copy_from_slice(src);
        u[off::AGENT_ID..off::AGENT_ID + 4].copy_from_slice(&(agentid as u32).to_ne_bytes());
        u[off::TIMEOUT_MS..off::TIMEOUT_MS + 4].copy_from_slice(&(timeout_ms as u32).to_ne_bytes());
        u[off::RETRIES..off::RETRIES + 4].copy_from_slice(&(retries as u32).to_ne_bytes());
        let dqp = u32::from_be_bytes(
            u[off::ADDR_QPN..off::ADDR_QPN + 4]
                .try_into()
                .unwrap_or_default(),
        ) & 0x00ff_ffff;
        let dlid = u16::from_be_bytes([u[off::ADDR_LID], u[off::ADDR_LID + 1]]);
        let mad = &mut u[UMAD_SIZE..];
        let class = mad[1];
        let request = mad[3] & 0x80 == 0;
        if request {
            let t = tid_of(mad);
            let t = (t & 0xffff_0000_ffff_ffff) | (u64::from(tag) << 32);
            mad[8..16].copy_from_slice(&t.to_be_bytes());
        }
        let sqp = if class == 0x01 || class == 0x81 { 0 } else { 1 };
        let slid = op.hp.cached_lid();
        if request && timeout_ms > 0 {
            if let Ok(mut v) = timers().pending.lock() {
                let timeout = Duration::from_millis(timeout_ms as u64);
                v.push(Pending {
                    fd: portid,
                    agent: agentid as u32,
                    tid48: tid_of(&u[UMAD_SIZE..]) & TID48,
                    deadline: Instant::now() + timeout,
                    timeout,
                    retries_left: retries.max(0) as u32,
                    dlid,
                    slid,
                    dqp,
                    sqp,
                    umad: u.clone(),
                });
                timers().wake.notify_all();
            }
        }
        capture(slid, dlid, sqp, dqp, &u[UMAD_SIZE..]);
        if !op.hp.send(dlid, slid, dqp, sqp, &u[UMAD_SIZE..]) {
            crate::debug(format_args!("umad port {portid}: ibsim did not take a MAD"));
            if request && timeout_ms > 0 {
                // Lost before the wire: the timeout will answer it, as for a lost packet.
                return 0;
            }
            return set_errno_ret(libc::EIO);
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn umad_recv(
    portid: c_int,
    umad: *mut c_void,
    length: *mut c_int,
    timeout_ms: c_int,
) -> c_int {
    crate::guard(-libc::EIO, || {
        let Some(op) = open_port(portid) else {
            return set_errno_ret(libc::EINVAL);
        };
        if umad.is_null() || length.is_null() {
            return set_errno_ret(libc::EINVAL);
        }
        // SAFETY: the caller's in/out length.
        let room = unsafe { *length }.max(0) as usize;
        let deadline =
            (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64));
        loop {
            {
                let Ok(mut q) = op.queue.lock() else {
                    return set_errno_ret(libc::EIO);
                };
                if let Some(front) = q.front() {
                    let mad_len = front.len() - UMAD_SIZE;
                    if mad_len > room {
                        // SAFETY: the caller's buffer holds at least the umad header.
                        let h =
                            unsafe { std::slice::from_raw_parts_mut(umad.cast::<u8>(), UMAD_SIZE) };
                        h.copy_from_slice(&front[..UMAD_SIZE]);
                        // SAFETY: the caller's in/out length.
                        unsafe { *length = mad_len as c_int };
                        return set_errno_ret(libc::ENOSPC);
                    }
                    let Some(m) = q.pop_front() else {
                        return set_errno_ret(libc::EIO);
                    };
                    let mut one = 0u64;
                    // SAFETY: our eventfd; it counts the queued MADs (semaphore mode).
                    unsafe { libc::read(op.fd, (&mut one as *mut u64).cast(), 8) };
                    // SAFETY: the caller's buffer holds the header and `room` >= mad_len bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(m.as_ptr(), umad.cast::<u8>(), m.len());
                        *length = mad_len as c_int;
                    }
                    return u32::from_ne_bytes(
                        m[off::AGENT_ID..off::AGENT_ID + 4]
                            .try_into()
                            .unwrap_or_default(),
                    ) as c_int;
                }
            }
            let wait = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return set_errno_ret(libc::ETIMEDOUT);
                    }
                    Some(left)
                }
                None if timeout_ms == 0 => {
                    // SAFETY: fcntl on our own fd.
                    let fl = unsafe { libc::fcntl(op.fd, libc::F_GETFL) };
                    if fl >= 0 && fl & libc::O_NONBLOCK != 0 {
                        return set_errno_ret(libc::EWOULDBLOCK);
                    }
                    None
                }
                None => None,
            };
            if !op.wait(wait) && deadline.is_some_and(|d| Instant::now() >= d) {
                return set_errno_ret(libc::ETIMEDOUT);
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn umad_poll(portid: c_int, timeout_ms: c_int) -> c_int {
    crate::guard(-libc::EIO, || {
        let Some(op) = open_port(portid) else {
            return set_errno_ret(libc::EINVAL);
        };
        let t = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
        if op.wait(t) {
            0
        } else {
            set_errno_ret(libc::ETIMEDOUT)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn umad_addr_dump(addr: *mut c_void) {
    if addr.is_null() {
        return;
    }
    // SAFETY: an ib_mad_addr_t (44 bytes).
    let a = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), 44) };
    eprintln!(
        "umad addr: qpn {:#x} qkey {:#x} lid {} sl {} grh {}",
        u32::from_be_bytes(a[0..4].try_into().unwrap_or_default()),
        u32::from_be_bytes(a[4..8].try_into().unwrap_or_default()),
        u16::from_be_bytes([a[8], a[9]]),
        a[10],
        a[12]
    );
}

#[no_mangle]
pub unsafe extern "C" fn umad_dump(umad: *mut c_void) {
    if umad.is_null() {
        return;
    }
    // SAFETY: a umad header.
    let h = unsafe { std::slice::from_raw_parts(umad.cast::<u8>(), UMAD_SIZE) };
    eprintln!(
        "umad: agent {} status {} timeout {} retries {} length {}",
        u32::from_ne_bytes(h[0..4].try_into().unwrap_or_default()),
        u32::from_ne_bytes(h[4..8].try_into().unwrap_or_default()),
        u32::from_ne_bytes(h[8..12].try_into().unwrap_or_default()),
        u32::from_ne_bytes(h[12..16].try_into().unwrap_or_default()),
        u32::from_ne_bytes(h[16..20].try_into().unwrap_or_default())
    );
    // SAFETY: the address follows the first 20 bytes.
    unsafe { umad_addr_dump(umad.cast::<u8>().add(20).cast()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_info_fields_and_rate() {
        let mut raw = [0u8; 64];
        raw[16..18].copy_from_slice(&5u16.to_be_bytes());
        raw[18..20].copy_from_slice(&1u16.to_be_bytes());
        raw[28] = 1;
        raw[31] = 2; // 4X
        raw[32] = 0x24; // ACTIVE
        raw[35] = 0x11; // SDR
        let l = LivePortInfo::parse(&raw).expect("parse");
        assert_eq!((l.lid, l.sm_lid, l.local_port, l.state), (5, 1, 1, 4));
        assert_eq!(l.rate(), 10);
        raw[31] = 8; // 12X
        raw[35] = 0x41; // QDR
        assert_eq!(LivePortInfo::parse(&raw).expect("parse").rate(), 120);
        assert!(LivePortInfo::parse(&raw[..63]).is_none());
    }

    #[test]
    fn header_writer_and_addr_setters_match_the_c_layout() {
        let mut u = vec![0u8; UMAD_SIZE + MAD_SIZE];
        put_header(&mut u, 3, 110, 320);
        // SAFETY: a full umad buffer.
        unsafe {
            umad_set_addr(u.as_mut_ptr().cast(), 0x1234, 1, 2, 0x8001_0000u32 as c_int);
            umad_set_pkey(u.as_mut_ptr().cast(), 5);
        }
        assert_eq!(u32::from_ne_bytes(u[0..4].try_into().unwrap()), 3);
        // SAFETY: as above.
        assert_eq!(unsafe { umad_status(u.as_mut_ptr().cast()) }, 110);
        assert_eq!(u32::from_ne_bytes(u[16..20].try_into().unwrap()), 320);
        assert_eq!(&u[20..24], &[0, 0, 0, 1]);
        assert_eq!(&u[24..28], &[0x80, 0x01, 0, 0]);
        assert_eq!(&u[28..30], &[0x12, 0x34]);
        assert_eq!(u[30], 2);
        // SAFETY: as above.
        assert_eq!(unsafe { umad_get_pkey(u.as_mut_ptr().cast()) }, 5);
        // SAFETY: as above.
        let mad = unsafe { umad_get_mad(u.as_mut_ptr().cast()) } as usize;
        assert_eq!(mad - u.as_ptr() as usize, 64);
    }
}
