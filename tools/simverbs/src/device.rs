//! The simulated HCA: device list, open/close, the query verbs and asynchronous events.
//!
//! One [`SimDevice`] per CA of the host ([`crate::host`]; the umad CA of the same name),
//! built once per process from what the ports report and never freed (callers keep
//! `ibv_device` pointers forever). Each `ibv_open_device` returns a [`SimContext`]: a real
//! `ibv_context` (its `ops` table filled with the data-path functions, its `async_fd` the
//! read end of a pipe) followed by our state. A monitor thread per context re-reads every
//! port's PortInfo and P_Key table (ibsim's control requests, through the port's client)
//! every 200 ms and turns changes into async events; the control socket
//! ([`crate::control`]) injects more.

use crate::umad::{self, CaSnapshot, LivePortInfo};
use crate::{copy_cstr, guard, set_errno};
use rdma_sys::*;
use std::collections::VecDeque;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// OpenSM's default `subnet_timeout` (OpenSM 3.3.23: `opensm -c FILE` writes
/// `subnet_timeout 18`, i.e. 4.096 µs × 2^18 ≈ 1.07 s).
pub const OPENSM_DEFAULT_SUBNET_TIMEOUT: u8 = 18;

/// The SubnetTimeOut ibsim reports in every PortInfo: a placeholder, it ignores the value
/// OpenSM sets.
pub const IBSIM_PLACEHOLDER_SUBNET_TIMEOUT: u8 = 31;

/// The subnet timeout `ibv_query_port` reports, given what the fabric's PortInfo says and the
/// `SIMVERBS_SUBNET_TIMEOUT` override.
///
/// Why: ibsim always answers SubnetTimeOut 31, and consumers such as libibacmp wait
/// `1 << (subnet_timeout - 8)` ms (31 → 2.3 hours) per retry of a request nobody answers, so
/// their timeout paths could never run. 31 is therefore read as "not set" and replaced by the
/// value OpenSM would have programmed on real hardware. Any other value passes through; the
/// override, when given, always wins.
pub fn effective_subnet_timeout(reported: u8, override_code: Option<u8>) -> u8 {
    match override_code {
        Some(code) => code,
        None if reported == IBSIM_PLACEHOLDER_SUBNET_TIMEOUT => OPENSM_DEFAULT_SUBNET_TIMEOUT,
        None => reported,
    }
}

/// Parses a `SIMVERBS_SUBNET_TIMEOUT` value: the IBA 5-bit code, 0..=31.
pub fn parse_subnet_timeout(value: &str) -> Result<u8, String> {
    value
        .trim()
        .parse::<u8>()
        .ok()
        .filter(|c| *c <= 31)
        .ok_or_else(|| format!("'{value}' is not a subnet timeout code in 0..31"))
}

/// `SIMVERBS_SUBNET_TIMEOUT`, read once per process; an invalid value is reported on stderr
/// and ignored.
fn subnet_timeout_override() -> Option<u8> {
    static CODE: OnceLock<Option<u8>> = OnceLock::new();
    *CODE.get_or_init(|| {
        let v = std::env::var("SIMVERBS_SUBNET_TIMEOUT").ok()?;
        match parse_subnet_timeout(&v) {
            Ok(c) => Some(c),
            Err(e) => {
                crate::log(format_args!("ignoring SIMVERBS_SUBNET_TIMEOUT: {e}"));
                None
            }
        }
    })
}

/// Our `ibv_device`: the C struct first (callers see only that), then the CA snapshot.
#[repr(C)]
pub struct SimDevice {
    pub dev: ibv_device,
    pub ca: CaSnapshot,
    pub index: usize,
}

// SAFETY: SimDevice holds no pointers that are written after construction (ibv_device has only
// inline arrays and unused function pointers); it is built once and then only read.
unsafe impl Sync for SimDevice {}
// SAFETY: see the Sync impl above.
unsafe impl Send for SimDevice {}

/// The devices of this process, built on first use. Entries are leaked on purpose: `ibv_device`
/// pointers must stay valid for the life of the process.
fn devices() -> &'static [&'static SimDevice] {
    static DEVICES: OnceLock<Vec<&'static SimDevice>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let mut v: Vec<&'static SimDevice> = Vec::new();
        for name in crate::host::ca_names() {
            let Some(ca) = umad::read_ca(&name) else {
                continue;
            };
            // SAFETY: ibv_device is plain old data; all-zero is valid.
            let mut dev: ibv_device = unsafe { std::mem::zeroed() };
            dev.node_type = ibv_node_type::IBV_NODE_CA;
            dev.transport_type = ibv_transport_type::IBV_TRANSPORT_IB;
            copy_cstr(&mut dev.name, &ca.name);
            copy_cstr(&mut dev.dev_name, &format!("uverbs{}", v.len()));
            copy_cstr(
                &mut dev.dev_path,
                &format!("/sys/class/infiniband_verbs/uverbs{}", v.len()),
            );
            copy_cstr(
                &mut dev.ibdev_path,
                &format!("/sys/class/infiniband/{}", ca.name),
            );
            let index = v.len();
            v.push(Box::leak(Box::new(SimDevice { dev, ca, index })));
        }
        crate::debug(format_args!("{} simulated device(s)", v.len()));
        v
    })
}

/// Finds our device behind a C pointer; `None` for pointers we did not hand out.
pub fn device_from_ptr(p: *const ibv_device) -> Option<&'static SimDevice> {
    devices()
        .iter()
        .copied()
        .find(|d| std::ptr::eq(&d.dev as *const ibv_device, p))
}

/// Port attributes as the verbs consumer sees them (host byte order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortAttrs {
    pub state: u8,
    pub phys_state: u8,
    pub lid: u16,
    pub lmc: u8,
    pub sm_lid: u16,
    pub sm_sl: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub max_mtu: u8,
    pub active_mtu: u8,
    pub capmask: u32,
    pub gid_prefix: u64,
    pub port_guid: u64,
    pub pkeys: Vec<u16>,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub vl_cap: u8,
    /// True once an SMP PortInfo answer has been merged in.
    pub live: bool,
}

impl PortAttrs {
    /// Attributes from the sysfs snapshot alone (LID/SM/state as of process start).
    pub fn from_snapshot(p: &umad::PortSnapshot) -> PortAttrs {
        // umad reports the rate in Gb/s; map it back to IBA width/speed encodings.
        let (active_width, active_speed) = match p.rate {
            2 => (1, 1),
            5 => (1, 2),
            10 => (2, 1),
            20 => (2, 2),
            40 => (2, 4),
            30 => (8, 1),
            60 => (8, 2),
            120 => (8, 4),
            14 => (1, 16),
            56 => (2, 16),
            168 => (8, 16),
            25 => (1, 32),
            100 => (2, 32),
            300 => (8, 32),
            _ => (2, 1),
        };
        PortAttrs {
            state: p.state,
            phys_state: p.phys_state,
            lid: p.lid,
            lmc: p.lmc,
            sm_lid: p.sm_lid,
            sm_sl: p.sm_sl,
            active_width,
            active_speed,
            max_mtu: ibv_mtu::IBV_MTU_4096 as u8,
            active_mtu: ibv_mtu::IBV_MTU_2048 as u8,
            capmask: p.capmask,
            gid_prefix: p.gid_prefix,
            port_guid: p.port_guid,
            pkeys: p.pkeys.clone(),
            subnet_timeout: OPENSM_DEFAULT_SUBNET_TIMEOUT,
            init_type_reply: 0,
            vl_cap: 1,
            live: false,
        }
    }

    /// Merges a live SMP PortInfo answer (the authoritative source for what can change).
    pub fn merge_live(&mut self, l: &LivePortInfo) {
        self.state = l.state;
        self.phys_state = l.phys_state;
        self.lid = l.lid;
        self.lmc = l.lmc;
        self.sm_lid = l.sm_lid;
        self.sm_sl = l.sm_sl;
        if l.link_width_active != 0 {
            self.active_width = l.link_width_active;
        }
        if l.link_speed_active != 0 {
            self.active_speed = l.link_speed_active;
        }
        if (1..=5).contains(&l.mtu_cap) {
            self.max_mtu = l.mtu_cap;
            self.active_mtu = if (1..=5).contains(&l.neighbor_mtu) {
                l.neighbor_mtu.min(l.mtu_cap)
            } else {
                l.mtu_cap
            };
        }
        self.capmask = l.capmask;
        if l.gid_prefix != 0 {
            self.gid_prefix = l.gid_prefix;
        }
        self.subnet_timeout = l.subnet_timeout;
        self.init_type_reply = l.init_type_reply;
        if l.vl_cap != 0 {
            self.vl_cap = l.vl_cap;
        }
        self.live = true;
    }

    /// The GID at table index 0: subnet prefix and port GUID, network byte order.
    pub fn gid0(&self) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[..8].copy_from_slice(&self.gid_prefix.to_be_bytes());
        g[8..].copy_from_slice(&self.port_guid.to_be_bytes());
        g
    }
}

/// The element an async event refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventElement {
    Port(u8),
    Cq(usize),
    Qp(usize),
}

/// One queued asynchronous event.
#[derive(Clone, Copy, Debug)]
pub struct AsyncEvent {
    pub kind: ibv_event_type,
    pub element: EventElement,
}

/// Everything a context owns besides the C struct.
pub struct ContextState {
    pub device: &'static SimDevice,
    async_rd: c_int,
    async_wr: c_int,
    events: Mutex<VecDeque<AsyncEvent>>,
    /// Port attributes, index = port number - 1.
    pub ports: Mutex<Vec<PortAttrs>>,
    stop: AtomicBool,
    monitor: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Events delivered so far (diagnostics and tests).
    pub events_posted: AtomicUsize,
    /// QPs of this context, so a LID change can move their sockets.
    pub qps: Mutex<Vec<Weak<crate::qp::QpInner>>>,
}

impl ContextState {
    /// Queues an async event and makes `async_fd` readable.
    pub fn post_event(&self, kind: ibv_event_type, element: EventElement) {
        if let Ok(mut q) = self.events.lock() {
            q.push_back(AsyncEvent { kind, element });
        }
        let b = [1u8];
        // SAFETY: async_wr is the open write end of our pipe; the buffer is 1 valid byte.
        let r = unsafe { libc::write(self.async_wr, b.as_ptr() as *const c_void, 1) };
        if r != 1 {
            crate::log(format_args!(
                "async event pipe full, event {kind:?} may be delayed"
            ));
        }
        self.events_posted.fetch_add(1, Ordering::Relaxed);
        crate::debug(format_args!("async event {kind:?} {element:?}"));
    }

    /// Current attributes of `port` (1-based), if it exists.
    pub fn port(&self, port: u8) -> Option<PortAttrs> {
        let ports = self.ports.lock().ok()?;
        ports.get(usize::from(port).checked_sub(1)?).cloned()
    }
}

impl Drop for ContextState {
    fn drop(&mut self) {
        // SAFETY: both pipe ends were opened by `open_context` and are closed exactly once.
        unsafe {
            libc::close(self.async_rd);
            libc::close(self.async_wr);
        }
    }
}

/// Magic value marking a [`SimContext`] we allocated.
const CONTEXT_MAGIC: u64 = 0x5349_4d56_4354_5831; // "SIMVCTX1"

/// Our `ibv_context`: the C struct first, then our state.
#[repr(C)]
pub struct SimContext {
    pub ctx: ibv_context,
    magic: u64,
    pub state: Arc<ContextState>,
}

/// All open contexts of this process, for the control socket.
fn contexts() -> &'static Mutex<Vec<Weak<ContextState>>> {
    static CONTEXTS: OnceLock<Mutex<Vec<Weak<ContextState>>>> = OnceLock::new();
    CONTEXTS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Calls `f` for every open context of this process.
pub fn for_each_context(mut f: impl FnMut(&Arc<ContextState>)) {
    let live: Vec<Arc<ContextState>> = match contexts().lock() {
        Ok(mut v) => {
            v.retain(|w| w.strong_count() > 0);
            v.iter().filter_map(Weak::upgrade).collect()
        }
        Err(_) => return,
    };
    for c in &live {
        f(c);
    }
}

/// Resolves a C context pointer to our state; `None` (errno EINVAL) if it is not ours.
///
/// # Safety
/// `ctx` must be NULL or a pointer returned by [`ibv_open_device`] and not yet closed.
pub unsafe fn context_state<'a>(ctx: *mut ibv_context) -> Option<&'a SimContext> {
    // SAFETY: this function's contract is resolve's contract for this type.
    unsafe { crate::resolve_or_einval(ctx, |sc: &SimContext| sc.magic, CONTEXT_MAGIC) }
}

/// A snapshot of port `port_num` of `ctx`; `None`, with errno EINVAL, if the context is not
/// ours or has no such port.
///
/// # Safety
/// As [`context_state`].
unsafe fn context_port(ctx: *mut ibv_context, port_num: u8) -> Option<PortAttrs> {
    // SAFETY: the caller upholds context_state's contract.
    let port = unsafe { context_state(ctx) }?.state.port(port_num);
    if port.is_none() {
        set_errno(libc::EINVAL);
    }
    port
}

/// Reads live PortInfo and the P_Key table of every port of CA `ca`, merging into `ports`.
/// Returns false if no port answered.
fn refresh_ports(ca: &str, ports: &mut [PortAttrs]) -> bool {
    let mut any = false;
    for (i, p) in ports.iter_mut().enumerate() {
        let Some(hp) = crate::host::port(ca, (i + 1) as u8) else {
            continue;
        };
        let Some(l) = hp.client.port_info().and_then(|d| LivePortInfo::parse(&d)) else {
            continue;
        };
        hp.note_lid(l.lid);
        p.merge_live(&l);
        any = true;
        // The P_Key table is set by the SM after start-up: read it live too (a failed query
        // keeps the old table).
        if let Some(mut keys) = hp.client.pkeys() {
            keys.truncate(p.pkeys.len().max(1));
            p.pkeys = keys;
        }
    }
    any
}

/// The events implied by a port attribute change (IBA 11.6.3 affiliated/unaffiliated events).
pub fn diff_events(old: &PortAttrs, new: &PortAttrs) -> Vec<ibv_event_type> {
    let active = ibv_port_state::IBV_PORT_ACTIVE as u8;
    let mut ev = Vec::new();
    if old.state != active && new.state == active {
        ev.push(ibv_event_type::IBV_EVENT_PORT_ACTIVE);
    } else if old.state == active && new.state != active {
        ev.push(ibv_event_type::IBV_EVENT_PORT_ERR);
    }
    if old.lid != new.lid || old.lmc != new.lmc {
        ev.push(ibv_event_type::IBV_EVENT_LID_CHANGE);
    }
    if old.sm_lid != new.sm_lid || old.sm_sl != new.sm_sl {
        ev.push(ibv_event_type::IBV_EVENT_SM_CHANGE);
    }
    if old.pkeys != new.pkeys {
        ev.push(ibv_event_type::IBV_EVENT_PKEY_CHANGE);
    }
    if old.gid_prefix != new.gid_prefix {
        ev.push(ibv_event_type::IBV_EVENT_GID_CHANGE);
    }
    ev
}

/// Poll period of the port monitor (`SIMVERBS_MONITOR_MS`, default 200, 0 disables it).
fn monitor_period() -> Option<Duration> {
    let ms = std::env::var("SIMVERBS_MONITOR_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(200);
    (ms > 0).then(|| Duration::from_millis(ms))
}

fn monitor_loop(state: Weak<ContextState>, period: Duration) {
    loop {
        std::thread::sleep(period);
        let Some(st) = state.upgrade() else { return };
        if st.stop.load(Ordering::Acquire) {
            return;
        }
        let old = match st.ports.lock() {
            Ok(p) => p.clone(),
            Err(_) => return,
        };
        let mut new = old.clone();
        if !refresh_ports(&st.device.ca.name, &mut new) {
            continue;
        }
        if let Ok(mut p) = st.ports.lock() {
            *p = new.clone();
        }
        for (i, (o, n)) in old.iter().zip(new.iter()).enumerate() {
            if o.lid != n.lid && n.lid != 0 {
                // Sockets are keyed by LID: move them before telling the consumer.
                crate::qp::rebind_qps(&st, (i + 1) as u8, n.lid);
            }
            for kind in diff_events(o, n) {
                st.post_event(kind, EventElement::Port((i + 1) as u8));
            }
        }
    }
}

/// Builds a context for `dev`.
fn open_context(dev: &'static SimDevice) -> Option<*mut ibv_context> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // The write end must never block the monitor or the control thread.
    // SAFETY: fds[1] is a valid descriptor we just created.
    unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) };
    let mut ports: Vec<PortAttrs> = dev.ca.ports.iter().map(PortAttrs::from_snapshot).collect();
    refresh_ports(&dev.ca.name, &mut ports);
    let state = Arc::new(ContextState {
        device: dev,
        async_rd: fds[0],
        async_wr: fds[1],
        events: Mutex::new(VecDeque::new()),
        ports: Mutex::new(ports),
        stop: AtomicBool::new(false),
        monitor: Mutex::new(None),
        events_posted: AtomicUsize::new(0),
        qps: Mutex::new(Vec::new()),
    });
    if let Some(period) = monitor_period() {
        let weak = Arc::downgrade(&state);
        let h = std::thread::Builder::new()
            .name("simverbs-monitor".into())
            .spawn(move || monitor_loop(weak, period))
            .ok();
        if let Ok(mut m) = state.monitor.lock() {
            *m = h;
        }
    }
    if let Ok(mut v) = contexts().lock() {
        v.push(Arc::downgrade(&state));
    }
    crate::control::ensure_started(dev);
    // SAFETY: ibv_context is plain old data (pointers, ints, a pthread mutex for which
    // all-zero is PTHREAD_MUTEX_INITIALIZER on glibc); all-zero is a valid starting value.
    let mut ctx: ibv_context = unsafe { std::mem::zeroed() };
    ctx.device = &dev.dev as *const ibv_device as *mut ibv_device;
    ctx.cmd_fd = -1;
    ctx.async_fd = fds[0];
    ctx.num_comp_vectors = 1;
    ctx.abi_compat = std::ptr::null_mut(); // not an extended verbs_context
    crate::qp::fill_ops(&mut ctx.ops);
    crate::cq::fill_ops(&mut ctx.ops);
    let sc = Box::new(SimContext {
        ctx,
        magic: CONTEXT_MAGIC,
        state,
    });
    Some(Box::into_raw(sc) as *mut ibv_context)
}

// ---------------------------------------------------------------------------------------------
// Exported verbs
// ---------------------------------------------------------------------------------------------

/// `ibv_get_device_list`: a `malloc`ed, NULL-terminated array of our devices.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    guard(std::ptr::null_mut(), || {
        let devs = devices();
        let n = devs.len();
        // SAFETY: calloc of n+1 pointers; checked for NULL below.
        let list = unsafe { libc::calloc(n + 1, std::mem::size_of::<*mut ibv_device>()) }
            as *mut *mut ibv_device;
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: `list` has n+1 slots; i < n.
            unsafe { *list.add(i) = &d.dev as *const ibv_device as *mut ibv_device };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller passed a valid int pointer (or NULL, checked).
            unsafe { *num_devices = n as c_int };
        }
        list
    })
}

/// `ibv_free_device_list`: frees the array from [`ibv_get_device_list`] (devices live on).
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    guard((), || {
        // SAFETY: `list` came from calloc in ibv_get_device_list (or is NULL).
        unsafe { libc::free(list as *mut c_void) };
    })
}

/// `ibv_get_device_name`: the umad CA name (e.g. `ibsim0`).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const libc::c_char {
    guard(std::ptr::null(), || match device_from_ptr(device) {
        Some(d) => d.dev.name.as_ptr(),
        None => {
            set_errno(libc::EINVAL);
            std::ptr::null()
        }
    })
}

/// `ibv_get_device_guid`: the node GUID, network byte order.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    guard(0, || match device_from_ptr(device) {
        Some(d) => d.ca.node_guid.to_be(),
        None => {
            set_errno(libc::EINVAL);
            0
        }
    })
}

/// `ibv_get_device_index`: position in the device list.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    guard(-1, || match device_from_ptr(device) {
        Some(d) => d.index as c_int,
        None => {
            set_errno(libc::EINVAL);
            -1
        }
    })
}

/// `ibv_open_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        let Some(d) = device_from_ptr(device) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        open_context(d).unwrap_or_else(|| {
            set_errno(libc::EMFILE);
            std::ptr::null_mut()
        })
    })
}

/// `ibv_close_device`: stops the monitor and frees the context.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    guard(-1, || {
        // SAFETY: ibv_close_device's contract: context came from ibv_open_device.
        if unsafe { context_state(context) }.is_none() {
            return libc::EINVAL;
        }
        // SAFETY: checked above that this is a live SimContext allocated by Box; the caller
        // gives up the pointer by closing it.
        let sc = unsafe { Box::from_raw(context as *mut SimContext) };
        sc.state.stop.store(true, Ordering::Release);
        let h = sc.state.monitor.lock().ok().and_then(|mut m| m.take());
        if let Some(h) = h {
            let _ = h.join();
        }
        drop(sc);
        0
    })
}

/// Parses a firmware/hardware version string as hex (umad2sim writes `%x`).
fn parse_hex(s: &str) -> u32 {
    u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap_or(0)
}

/// `ibv_query_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: context comes from ibv_open_device per the verbs contract.
        let Some(sc) = (unsafe { context_state(context) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        let ca = &sc.state.device.ca;
        let npkeys = ca.ports.first().map(|p| p.pkeys.len()).unwrap_or(0);
        // SAFETY: ibv_device_attr is plain old data; all-zero is valid.
        let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
        copy_cstr(&mut a.fw_ver, &ca.fw_ver);
        a.node_guid = ca.node_guid.to_be();
        a.sys_image_guid = ca.system_guid.to_be();
        a.max_mr_size = u64::MAX;
        a.page_size_cap = 0x1000;
        a.hw_ver = parse_hex(&ca.hw_ver);
        a.max_qp = crate::qp::MAX_QP as c_int;
        a.max_qp_wr = crate::qp::MAX_QP_WR as c_int;
        a.device_cap_flags = ibv_device_cap_flags::IBV_DEVICE_PORT_ACTIVE_EVENT.0;
        a.max_sge = crate::qp::MAX_SGE as c_int;
        a.max_cq = 4096;
        a.max_cqe = crate::cq::MAX_CQE as c_int;
        a.max_mr = 65536;
        a.max_pd = 4096;
        a.atomic_cap = ibv_atomic_cap::IBV_ATOMIC_NONE;
        a.max_mcast_grp = 4096;
        a.max_mcast_qp_attach = 256;
        a.max_total_mcast_qp_attach = 65536;
        a.max_ah = 65536;
        a.max_pkeys = npkeys as u16;
        a.local_ca_ack_delay = 15;
        a.phys_port_cnt = ca.ports.len() as u8;
        // SAFETY: attr is a valid, writable ibv_device_attr (checked non-NULL).
        unsafe { attr.write(a) };
        0
    })
}

/// `ibv_query_port` (the exported, compat entry point the inline wrapper falls back to for
/// non-extended contexts). Writes the `_compat_ibv_port_attr` prefix of `ibv_port_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut _compat_ibv_port_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: context comes from ibv_open_device per the verbs contract.
        let Some(sc) = (unsafe { context_state(context) }) else {
            return libc::EINVAL;
        };
        if port_attr.is_null() {
            return libc::EINVAL;
        }
        let Some(p) = sc.state.port(port_num) else {
            return libc::EINVAL;
        };
        // SAFETY: ibv_port_attr is plain old data; all-zero is valid.
        let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
        a.state = u32::from(p.state);
        a.max_mtu = u32::from(p.max_mtu);
        a.active_mtu = u32::from(p.active_mtu);
        a.gid_tbl_len = 1;
        a.port_cap_flags = p.capmask;
        a.max_msg_sz = 1 << 31;
        a.pkey_tbl_len = p.pkeys.len() as u16;
        a.lid = p.lid;
        a.sm_lid = p.sm_lid;
        a.lmc = p.lmc;
        a.max_vl_num = p.vl_cap;
        a.sm_sl = p.sm_sl;
        a.subnet_timeout = effective_subnet_timeout(p.subnet_timeout, subnet_timeout_override());
        a.init_type_reply = p.init_type_reply;
        a.active_width = p.active_width;
        a.active_speed = p.active_speed;
        a.phys_state = p.phys_state;
        a.link_layer = 1; // IBV_LINK_LAYER_INFINIBAND;
                          // Old binaries pass the shorter compat struct: write only up to `flags`.
        let n = std::mem::offset_of!(ibv_port_attr, port_cap_flags2);
        // SAFETY: the caller's buffer holds at least a _compat_ibv_port_attr, which is the
        // first `n` bytes of ibv_port_attr (same field order, ends after `flags`).
        unsafe {
            std::ptr::copy_nonoverlapping(
                &a as *const ibv_port_attr as *const u8,
                port_attr as *mut u8,
                n,
            )
        };
        0
    })
}

/// `ibv_query_gid`: index 0 is the port GID (subnet prefix + port GUID); others are zero.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        // SAFETY: context comes from ibv_open_device per the verbs contract.
        let Some(p) = (unsafe { context_port(context, port_num) }) else {
            return -1;
        };
        if gid.is_null() || index != 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: gid is a valid, writable 16-byte ibv_gid (checked non-NULL).
        unsafe { (*gid).raw = p.gid0() };
        0
    })
}

/// `ibv_query_gid_type` (private libibverbs symbol used by `ibv_devinfo`): always IB.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: libc::c_uint,
    gid_type: *mut u32,
) -> c_int {
    guard(-1, || {
        // SAFETY: context comes from ibv_open_device per the verbs contract.
        let Some(sc) = (unsafe { context_state(context) }) else {
            return -1;
        };
        if sc.state.port(port_num).is_none() || index != 0 || gid_type.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: gid_type is a valid, writable pointer (checked non-NULL).
        unsafe { *gid_type = 0 }; // IBV_GID_TYPE_IB
        0
    })
}

/// `ibv_query_pkey`: P_Key table entry, network byte order.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: context comes from ibv_open_device per the verbs contract.
        let Some(p) = (unsafe { context_port(context, port_num) }) else {
            return -1;
        };
        let Some(k) = usize::try_from(index).ok().and_then(|i| p.pkeys.get(i)) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if pkey.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: pkey is a valid, writable pointer (checked non-NULL).
        unsafe { *pkey = k.to_be() };
        0
    })
}

/// `ibv_get_pkey_index`: index of `pkey` (network byte order) in the table, or -1/ENOENT.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: context comes from ibv_open_device per the verbs contract.
        let Some(p) = (unsafe { context_port(context, port_num) }) else {
            return -1;
        };
        let want = u16::from_be(pkey);
        match p.pkeys.iter().position(|k| *k == want) {
            Some(i) => i as c_int,
            None => {
                set_errno(libc::ENOENT);
                -1
            }
        }
    })
}

/// `ibv_get_async_event`: blocks on `async_fd` (unless the caller made it non-blocking).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    guard(-1, || {
        // SAFETY: context comes from ibv_open_device per the verbs contract.
        let Some(sc) = (unsafe { context_state(context) }) else {
            return -1;
        };
        if event.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // Hold our own reference while blocked: the pipe stays open even if the context is
        // closed meanwhile (which the verbs contract forbids, but must not crash us).
        let state = sc.state.clone();
        let mut b = [0u8; 1];
        loop {
            // SAFETY: async_rd is our open pipe read end (kept open by `state`); `b` is one
            // writable byte.
            let r = unsafe { libc::read(state.async_rd, b.as_mut_ptr() as *mut c_void, 1) };
            if r == 1 {
                break;
            }
            if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return -1; // errno from read (EAGAIN for a non-blocking fd)
        }
        let ev = state.events.lock().ok().and_then(|mut q| q.pop_front());
        let Some(ev) = ev else {
            set_errno(libc::EAGAIN);
            return -1;
        };
        // SAFETY: event is a valid, writable ibv_async_event (checked non-NULL).
        unsafe {
            (*event).event_type = ev.kind;
            match ev.element {
                EventElement::Port(p) => (*event).element.port_num = c_int::from(p),
                EventElement::Cq(cq) => (*event).element.cq = cq as *mut ibv_cq,
                EventElement::Qp(qp) => (*event).element.qp = qp as *mut ibv_qp,
            }
        }
        0
    })
}

/// `ibv_ack_async_event`: nothing to release (destroy does not wait for acks here).
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}

/// `ibv_fork_init`: nothing to prepare in a simulation.
#[no_mangle]
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn active() -> PortAttrs {
        PortAttrs {
            state: 4,
            lid: 5,
            sm_lid: 1,
            pkeys: vec![0xffff],
            gid_prefix: 0xfe80 << 48,
            ..Default::default()
        }
    }

    #[test]
    fn port_changes_map_to_events() {
        let a = active();
        assert!(diff_events(&a, &a).is_empty());
        let mut down = a.clone();
        down.state = 1;
        assert_eq!(
            diff_events(&a, &down),
            vec![ibv_event_type::IBV_EVENT_PORT_ERR]
        );
        assert_eq!(
            diff_events(&down, &a),
            vec![ibv_event_type::IBV_EVENT_PORT_ACTIVE]
        );
        let mut moved = a.clone();
        moved.lid = 9;
        moved.sm_lid = 4;
        assert_eq!(
            diff_events(&a, &moved),
            vec![
                ibv_event_type::IBV_EVENT_LID_CHANGE,
                ibv_event_type::IBV_EVENT_SM_CHANGE
            ]
        );
        let mut pk = a.clone();
        pk.pkeys.push(0x8001);
        assert_eq!(
            diff_events(&a, &pk),
            vec![ibv_event_type::IBV_EVENT_PKEY_CHANGE]
        );
    }

    #[test]
    fn ibsim_placeholder_subnet_timeout_becomes_opensm_default() {
        // ibsim's 31 → OpenSM's default; real values pass through; the override always wins.
        assert_eq!(effective_subnet_timeout(31, None), 18);
        for code in [0u8, 8, 17, 18, 19, 30] {
            assert_eq!(effective_subnet_timeout(code, None), code);
        }
        assert_eq!(effective_subnet_timeout(31, Some(8)), 8);
        assert_eq!(effective_subnet_timeout(31, Some(31)), 31);
        assert_eq!(effective_subnet_timeout(12, Some(0)), 0);
        // The live PortInfo field (byte 51, low 5 bits) is kept raw; the mapping is applied
        // when reporting.
        let mut raw = [0u8; 64];
        raw[51] = 0xe0 | 31;
        let l = crate::umad::LivePortInfo::parse(&raw).expect("parse");
        let mut p = active();
        p.merge_live(&l);
        assert_eq!(p.subnet_timeout, 31);
        assert_eq!(effective_subnet_timeout(p.subnet_timeout, None), 18);
    }

    #[test]
    fn subnet_timeout_knob_accepts_only_codes() {
        assert_eq!(parse_subnet_timeout("8"), Ok(8));
        assert_eq!(parse_subnet_timeout(" 0 "), Ok(0));
        assert_eq!(parse_subnet_timeout("31"), Ok(31));
        for bad in ["32", "-1", "", "eight", "1.5", "256"] {
            let e = parse_subnet_timeout(bad).expect_err(bad);
            assert!(e.contains("0..31"), "{e}");
        }
    }

    #[test]
    fn live_port_info_overrides_snapshot() {
        let mut p = active();
        let mut raw = [0u8; 64];
        raw[16..18].copy_from_slice(&7u16.to_be_bytes()); // LID
        raw[18..20].copy_from_slice(&3u16.to_be_bytes()); // SM LID
        raw[31] = 2; // 4X
        raw[32] = 0x24; // speed supported 2, state ACTIVE
        raw[33] = 0x52; // LinkUp
        raw[35] = 0x10; // SDR
        raw[36] = 0x45; // neighbour MTU 2048, SM SL 5
        raw[41] = 0x05; // MTU cap 4096
        let l = crate::umad::LivePortInfo::parse(&raw).expect("parse");
        p.merge_live(&l);
        assert_eq!(
            (p.lid, p.sm_lid, p.sm_sl, p.state, p.phys_state),
            (7, 3, 5, 4, 5)
        );
        assert_eq!((p.max_mtu, p.active_mtu), (5, 4));
        assert!(p.live);
        assert!(crate::umad::LivePortInfo::parse(&raw[..63]).is_none());
    }
}
