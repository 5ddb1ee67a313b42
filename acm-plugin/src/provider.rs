//! The twelve provider callbacks and the provider instance's life cycle: a thin shell.
//!
//! Every `extern "C"` body runs inside `catch_unwind`: a panic is logged and turned into an
//! error return (and, for `resolve()`/`query()`, an EINVAL answer if none was sent yet); it
//! never unwinds into the core.
//!
//! What runs here, on the core's main thread: null checks, contexts, copies of what the core
//! hands us, and the **inline hit path** — classify the request (`resolver::request`), one
//! lock-free cache read, the answer. Everything else (misses, the ACM protocol, the SA, timers,
//! every cache write) is the dataplane loop's, reached through the bounded [`Inbox`] queues.

use crate::core_api::{self, guard, CoreApi};
use crate::ffi::*;
use crate::instance::{lock, Ep, EpRegistry, Instance, LogReason, PortInfo, Writer};
use crate::io::{set_reply_target, PluginIo};
use crate::preload;
use acm_core_nostd::cache::{AddrSlot, CacheConfig, HashedKey, Lookup, PathCache, Place};
use acm_core_nostd::resolver::request::{classify, respond, route_dest, Target};
use acm_core_nostd::resolver::{
    Capacities, Config, Counter, EpConfig, HeapStorage, Kind, Resolver, Via, MSG_LEN,
};
use acm_core_nostd::text::opts::{PollMode, ProviderOptions, RoutePreload, SaTransport};
use acm_core_nostd::wire::client::{
    build_resolve_frame, response_path_mut, AcmMsg as ClientMsg, Status,
};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::rate::{rate_from_link, LinkSpeed, LinkWidth};
use acm_dataplane::export::{ExportConfig, Exporter};
use acm_dataplane::plane::{Control, HostCache, Inbox, Plane, Ud};
use acm_dataplane::stats::{Clock, MissClass, MissStamp};
use acm_dataplane::worker::{Worker, WorkerConfig};
use core::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Global {
    inst: Option<Arc<Instance>>,
    worker: Option<Worker>,
    devices: usize,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    inst: None,
    worker: None,
    devices: 0,
});
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);
/// The instance's stats exporter thread (textfile, stats socket), if any.
static EXPORTER: Mutex<Option<Exporter>> = Mutex::new(None);

fn next_serial() -> u64 {
    NEXT_SERIAL.fetch_add(1, Ordering::Relaxed)
}

struct DevCtx {
    inst: Arc<Instance>,
}

struct PortCtx {
    inst: Arc<Instance>,
    info: Arc<PortInfo>,
}

struct EpCtx {
    inst: Arc<Instance>,
    ep: Arc<Ep>,
}

struct AddrCtx {
    inst: Arc<Instance>,
    ep: Arc<Ep>,
    type_: u8,
    addr: [u8; 64],
}

/// How long before a route expires its next hit starts a background refresh:
/// `acmrs_refresh_ahead_pct` of the route lifetime (0 = never; routes that never expire are
/// never refreshed either).
pub(crate) fn refresh_ahead_ms(opts: &ProviderOptions) -> u64 {
    match opts.route_ttl_ms() {
        Some(ttl) => ttl * u64::from(opts.acmrs_refresh_ahead_pct.min(99)) / 100,
        None => 0,
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(next_serial());
    h.finish()
}

fn new_cache(opts: &ProviderOptions) -> std::io::Result<acm_dataplane::plane::HostCache> {
    // A per-instance seed so remote parties cannot aim at one bucket.
    let config = CacheConfig {
        seed: random_seed(),
        refresh_ahead: refresh_ahead_ms(opts),
    };
    PathCache::new(
        crate::huge::path_slots_for(opts.acmrs_path_capacity as usize),
        AddrSlot::boxed(opts.acmrs_addr_capacity.max(16) as usize),
        config,
    )
    .map_err(|e| std::io::Error::other(format!("path cache: {e:?}")))
}

fn capacities(opts: &ProviderOptions) -> Capacities {
    let pending = opts.acmrs_pending_capacity.max(1) as usize;
    Capacities {
        // Every request the dataplane holds has a slot; the pending table bounds how many
        // distinct resolutions run at once.
        requests: pending + 64,
        answer_reserve: 64,
        pending,
        addrs: opts.acmrs_addr_capacity.max(16) as usize,
        endpoints: acm_core_nostd::resolver::MAX_EPS,
        ..Capacities::default()
    }
}

fn create_instance(api: &'static CoreApi) -> std::io::Result<(Arc<Instance>, Worker)> {
    let opts = preload::load_options(api);
    let hosts = Arc::new(preload::load_hosts(api, &opts));
    let waker = Worker::new_waker();
    let inbox = Arc::new(Inbox::new(
        opts.acmrs_request_capacity as usize,
        1024,
        waker.clone(),
    ));
    let cache = Arc::new(new_cache(&opts)?);
    let inst = Arc::new(Instance {
        api,
        large_cache: crate::huge::is_large(crate::huge::path_slot_count(
            opts.acmrs_path_capacity as usize,
        )),
        cache: cache.clone(),
        inbox: inbox.clone(),
        hosts,
        eps: EpRegistry::default(),
        log_limits: Default::default(),
        epoch: waker.epoch(),
        clock: Clock::calibrated(),
        opts,
    });
    let config = Config::from_options(&inst.opts);
    let caps = capacities(&inst.opts);
    let tracked = caps.requests;
    let make = Box::new(move || Resolver::new(config, HeapStorage::new(caps), random_seed()).ok());
    let plane = Plane::new(
        make,
        cache,
        inbox,
        PluginIo::new(inst.clone()),
        waker.epoch(),
    )
    .ok_or_else(|| std::io::Error::other("resolver storage refused"))?
    .with_stats(
        inst.clock,
        tracked,
        crate::instance::latency_sink(inst.clone()),
    );
    let plane = if inst.opts.acmrs_sa_transport == SaTransport::Ud {
        // Room for every query the resolver may have out, plus each endpoint's two joins, two
        // subscriptions and their cancellations.
        plane.with_ud_sa(caps.sa_inflight + 8 * caps.endpoints)
    } else {
        plane
    };
    let spin = match inst.opts.poll_mode() {
        // Never blocks (run to completion on the core it is given).
        PollMode::Busy => Duration::MAX,
        PollMode::Adaptive => Duration::from_micros(50),
        PollMode::Event => Duration::ZERO,
    };
    if let Ok(cpu) = usize::try_from(inst.opts.acmrs_cpu) {
        if !Worker::cpu_available(cpu) {
            api.log(
                0,
                &format!(
                    "ERROR - acmrs_cpu {cpu} is not a CPU this process may run on: not pinned"
                ),
            );
        }
    }
    let wc = WorkerConfig {
        name: "acmrs-dataplane".into(),
        cpu: usize::try_from(inst.opts.acmrs_cpu).ok(),
        spin,
        max_park: Duration::from_millis(100),
    };
    set_reply_target(&inst);
    let worker = Worker::spawn(wc, waker, plane)?;
    start_exporter(&inst);
    api.log(
        0,
        &format!(
            "started: route cache {} slots, request queue {}, pending {}",
            inst.cache.capacity(),
            inst.opts.acmrs_request_capacity,
            inst.opts.acmrs_pending_capacity
        ),
    );
    Ok((inst, worker))
}

/// Starts the stats exporter thread (docs/stats.md) if an option asks for it; a failure is
/// logged and leaves the provider running without it.
fn start_exporter(inst: &Arc<Instance>) {
    let path = |p: &Option<acm_core_nostd::text::opts::PathString>| {
        p.as_ref().map(|p| std::path::PathBuf::from(p.as_str()))
    };
    let cfg = ExportConfig {
        prom_file: path(&inst.opts.acmrs_prom_file),
        interval: Duration::from_secs(u64::from(inst.opts.acmrs_prom_interval_s)),
        socket: path(&inst.opts.acmrs_stat_socket),
    };
    let src = Box::new(crate::instance::StatsSource(inst.clone()));
    match Exporter::spawn(cfg, src) {
        Ok(e) => *lock(&EXPORTER) = e,
        Err(e) => inst
            .api
            .log(0, &format!("ERROR - stats exporter not started: {e}")),
    }
}

unsafe extern "C" fn open_device(device: *const AcmDevice, dev_context: *mut *mut c_void) -> c_int {
    guard("open_device", -1, || {
        if device.is_null() || dev_context.is_null() {
            return -1;
        }
        let Some(api) = CoreApi::get() else {
            return -1;
        };
        let mut g = lock(&GLOBAL);
        if g.inst.is_none() {
            match create_instance(api) {
                Ok((inst, w)) => {
                    g.inst = Some(inst);
                    g.worker = Some(w);
                }
                Err(e) => {
                    api.log(0, &format!("ERROR - cannot start the dataplane: {e}"));
                    return -1;
                }
            }
        }
        let Some(inst) = g.inst.clone() else {
            return -1;
        };
        g.devices += 1;
        let ctx = Box::new(DevCtx { inst });
        // SAFETY: dev_context is a valid out-pointer from the core (checked non-null).
        unsafe { *dev_context = Box::into_raw(ctx) as *mut c_void };
        0
    })
}

unsafe extern "C" fn close_device(dev_context: *mut c_void) {
    guard("close_device", (), || {
        if dev_context.is_null() {
            return;
        }
        // SAFETY: the pointer came from Box::into_raw in open_device; the core closes once.
        drop(unsafe { Box::from_raw(dev_context as *mut DevCtx) });
        let (inst, worker) = {
            let mut g = lock(&GLOBAL);
            g.devices = g.devices.saturating_sub(1);
            if g.devices > 0 {
                return;
            }
            (g.inst.take(), g.worker.take())
        };
        if let Some(inst) = inst {
            inst.inbox.control(Control::Shutdown);
            if let Some(e) = lock(&EXPORTER).take() {
                e.stop();
            }
            if let Some(w) = worker {
                if w.join().is_err() {
                    inst.api.log(0, "ERROR - dataplane thread panicked");
                }
            }
            inst.api.log(1, "stopped");
        }
    })
}

/// `offsetof(struct ibv_port_attr, lid)` (checked by the layout test).
pub const PORT_ATTR_LID: usize = 34;
/// `offsetof(struct ibv_port_attr, active_mtu)`.
pub const PORT_ATTR_ACTIVE_MTU: usize = 8;
/// `offsetof(struct ibv_port_attr, subnet_timeout)`.
pub const PORT_ATTR_SUBNET_TIMEOUT: usize = 41;
/// `offsetof(struct ibv_port_attr, active_width)`.
pub const PORT_ATTR_ACTIVE_WIDTH: usize = 43;
/// `offsetof(struct ibv_port_attr, active_speed)`.
pub const PORT_ATTR_ACTIVE_SPEED: usize = 44;

/// What `ibv_query_port` says of a port (zeros when the host does not have it).
#[derive(Default)]
struct PortAttr {
    lid: u16,
    mtu: u8,
    rate: u8,
    subnet_timeout: u8,
}

fn query_port(api: &CoreApi, port: *const AcmPort) -> PortAttr {
    let Some(q) = api.ibv_query_port else {
        return PortAttr::default();
    };
    // SAFETY: `port` and its device are the core's stable objects (checked non-null by caller).
    let (verbs, num) = unsafe {
        let dev = (*port).dev;
        if dev.is_null() {
            return PortAttr::default();
        }
        ((*dev).verbs, (*port).port_num)
    };
    if verbs.is_null() {
        return PortAttr::default();
    }
    // struct ibv_port_attr is 56 bytes in rdma-core 44; a larger zeroed buffer is harmless.
    let mut attr = [0u64; 32];
    // SAFETY: ibv_query_port(ctx, port, attr) fills at most sizeof(struct ibv_port_attr) bytes.
    let rc = unsafe { q(verbs, num, attr.as_mut_ptr() as *mut c_void) };
    if rc != 0 {
        return PortAttr::default();
    }
    let b: Vec<u8> = attr.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let rate = rate_from_link(
        LinkWidth::from(b[PORT_ATTR_ACTIVE_WIDTH]),
        LinkSpeed::from(u16::from(b[PORT_ATTR_ACTIVE_SPEED])),
    )
    .map_or(0, u8::from);
    PortAttr {
        lid: u16::from_ne_bytes([b[PORT_ATTR_LID], b[PORT_ATTR_LID + 1]]),
        mtu: b[PORT_ATTR_ACTIVE_MTU],
        rate,
        subnet_timeout: b[PORT_ATTR_SUBNET_TIMEOUT],
    }
}

/// ibacmp's subnet timeout in ms: `1 << (SubnetTimeOut - 8)` for codes ≥ 8, else 0.
pub fn subnet_timeout_ms(code: u8) -> u64 {
    if (8..=31).contains(&code) {
        1u64 << (code - 8)
    } else {
        0
    }
}

unsafe extern "C" fn open_port(
    port: *const AcmPort,
    dev_context: *mut c_void,
    port_context: *mut *mut c_void,
) -> c_int {
    guard("open_port", -1, || {
        if port.is_null() || dev_context.is_null() || port_context.is_null() {
            return -1;
        }
        // SAFETY: dev_context is our DevCtx (from open_device), alive until close_device.
        let dev = unsafe { &*(dev_context as *const DevCtx) };
        let api = dev.inst.api;
        let mut gid0 = [0u8; 16];
        // SAFETY: `port` is the core's acm_port; acm_get_gid writes one 16-byte GID.
        let rc = unsafe { (api.get_gid)(port, 0, &mut gid0) };
        if rc != 0 {
            api.log(0, "ERROR - open_port: no GID at index 0");
            return -1;
        }
        let a = query_port(api, port);
        // SAFETY: non-null core port.
        let port_num = unsafe { (*port).port_num };
        let info = Arc::new(PortInfo {
            id: next_serial(),
            port,
            port_num,
            gid0: Gid(gid0),
            lid: a.lid,
            mtu: a.mtu,
            rate: a.rate,
            subnet_timeout_ms: subnet_timeout_ms(a.subnet_timeout),
        });
        if dev.inst.log_enabled(1) {
            api.log(1, &format!("open_port {port_num}: lid {}", a.lid));
        }
        let ctx = Box::new(PortCtx {
            inst: dev.inst.clone(),
            info,
        });
        // SAFETY: valid out-pointer (checked).
        unsafe { *port_context = Box::into_raw(ctx) as *mut c_void };
        0
    })
}

unsafe extern "C" fn close_port(port_context: *mut c_void) {
    guard("close_port", (), || {
        if !port_context.is_null() {
            // SAFETY: from Box::into_raw in open_port; closed once.
            let ctx = unsafe { Box::from_raw(port_context as *mut PortCtx) };
            ctx.inst
                .api
                .log(1, &format!("close_port {}", ctx.info.port_num));
        }
    })
}

/// The endpoint's UD QP for the ACM protocol, on the core's verbs context, its QPN, and
/// whether it is on the port's SA P_Key (`verbs::sa_pkey_index`: only such a QP can reach the
/// SA). `None` (logged) when the host has no verbs device behind the port (the endpoint then
/// serves PATH/LID/GID requests through the SA only) or when the options need no ACM traffic.
fn open_ud(inst: &Instance, port: &PortInfo, pkey: u16) -> Option<(Box<dyn Ud>, u32, bool)> {
    use acm_core_nostd::text::opts::{AddrProt, RouteProt};
    // The QP carries the ACM protocol, the `ud` SA transport, or both.
    if inst.opts.addr_prot == AddrProt::None
        && inst.opts.route_prot != RouteProt::Acm
        && inst.opts.acmrs_sa_transport != SaTransport::Ud
    {
        return None;
    }
    // SAFETY: the core's port and device live for the whole process.
    let verbs = unsafe {
        let dev = (*port.port).dev;
        if dev.is_null() {
            std::ptr::null_mut()
        } else {
            (*dev).verbs
        }
    };
    if verbs.is_null() {
        inst.api.log(
            0,
            "ERROR - no verbs context: the ACM address protocol is off on this endpoint",
        );
        return None;
    }
    let ctx = verbs as *mut acm_dataplane::plane::IbvContext;
    // SAFETY: the core's open ibv_context for this port's device, alive while the port is.
    let Some(pkey_index) = (unsafe { acm_dataplane::verbs::pkey_index(ctx, port.port_num, pkey) })
    else {
        inst.api.log(
            0,
            &format!("ERROR - P_Key 0x{pkey:04x} not in the port's table: no ACM protocol"),
        );
        return None;
    };
    // SAFETY: as above.
    let sa_pkey = unsafe { acm_dataplane::verbs::sa_pkey_index(ctx, port.port_num) } == pkey_index;
    let cfg = acm_dataplane::verbs::UdConfig {
        port_num: port.port_num,
        pkey_index,
        qkey: acm_core_nostd::wire::mcmember::ACM_QKEY,
        recv_depth: inst.opts.recv_depth.clamp(8, 8192),
        send_depth: inst
            .opts
            .send_depth
            .max(inst.opts.acmrs_acm_window)
            .clamp(8, 1024)
            * 2,
    };
    // SAFETY: as above; the endpoint keeps its own verbs objects and frees them on drop.
    match unsafe { acm_dataplane::verbs::UdEndpoint::open(ctx, &cfg) } {
        Ok(ud) => {
            let qpn = ud.qpn();
            Some((Box::new(ud), qpn, sa_pkey))
        }
        Err(e) => {
            inst.api.log(
                0,
                &format!("ERROR - UD QP for the ACM protocol: {e}; SA-only endpoint"),
            );
            None
        }
    }
}

unsafe extern "C" fn open_endpoint(
    endpoint: *const AcmEndpoint,
    port_context: *mut c_void,
    ep_context: *mut *mut c_void,
) -> c_int {
    guard("open_endpoint", -1, || {
        if endpoint.is_null() || port_context.is_null() || ep_context.is_null() {
            return -1;
        }
        // SAFETY: our PortCtx, alive until close_port (which the core calls after every
        // close_endpoint of the port).
        let port = unsafe { &*(port_context as *const PortCtx) };
        let inst = &port.inst;
        // SAFETY: the core's live acm_endpoint.
        let pkey = unsafe { (*endpoint).pkey };
        let Some(ep) = inst.eps.insert(|id, gen| {
            Arc::new(Ep::new(
                id,
                next_serial(),
                port.info.clone(),
                pkey,
                gen,
                endpoint as usize,
            ))
        }) else {
            inst.api.log(
                0,
                &format!(
                    "ERROR - open_endpoint: {} endpoints already open",
                    acm_core_nostd::resolver::MAX_EPS
                ),
            );
            return -1;
        };
        let routes = if inst.opts.route_preload == RoutePreload::OpensmFullV1 {
            preload::load_routes(inst.api, &inst.opts, &port.info, pkey)
        } else {
            Vec::new()
        };
        let (ud, qpn, sa_pkey) = match open_ud(inst, &port.info, pkey) {
            Some((u, q, s)) => (Some(u), q, s),
            None => (None, 0, false),
        };
        let cfg = EpConfig {
            port_gid: port.info.gid0,
            lid: port.info.lid,
            pkey,
            mtu: port.info.mtu,
            rate: port.info.rate,
            subnet_timeout_ms: port.info.subnet_timeout_ms,
            qpn,
            sa_pkey,
        };
        inst.inbox.control(Control::Open {
            ep: ep.id,
            cache_ep: ep.cache_ep(),
            cfg,
            ud,
            routes,
            addrs: inst.hosts.clone(),
        });
        let ctx = Box::new(EpCtx {
            inst: inst.clone(),
            ep,
        });
        // SAFETY: valid out-pointer.
        unsafe { *ep_context = Box::into_raw(ctx) as *mut c_void };
        0
    })
}

unsafe extern "C" fn close_endpoint(ep_context: *mut c_void) {
    guard("close_endpoint", (), || {
        if ep_context.is_null() {
            return;
        }
        // SAFETY: from Box::into_raw in open_endpoint; closed once.
        let ctx = unsafe { Box::from_raw(ep_context as *mut EpCtx) };
        let ep = &ctx.ep;
        {
            // After this the dataplane can no longer pass the endpoint to the core.
            let mut e = lock(&ep.endpoint);
            *e = 0;
            ep.closed.store(true, Ordering::Release);
        }
        // Address contexts the core never removed (duplicate adds after a netlink resync).
        let leftovers = std::mem::take(&mut *lock(&ep.addr_ctxs));
        for p in leftovers {
            // SAFETY: each entry is a live Box<AddrCtx> registered by add_address and not yet
            // freed by remove_address (which unregisters it).
            drop(unsafe { Box::from_raw(p as *mut AddrCtx) });
        }
        ctx.inst.inbox.control(Control::Close(ep.id));
        ctx.inst.eps.remove(ep.id);
    })
}

unsafe extern "C" fn add_address(
    addr: *const AcmAddress,
    ep_context: *mut c_void,
    addr_context: *mut *mut c_void,
) -> c_int {
    guard("add_address", -1, || {
        if addr.is_null() || ep_context.is_null() || addr_context.is_null() {
            return -1;
        }
        // SAFETY: our EpCtx, alive until close_endpoint.
        let epc = unsafe { &*(ep_context as *const EpCtx) };
        // SAFETY: the core's acm_address, valid for this call only: copy what we need now.
        let (type_, bytes) = unsafe { ((*addr).type_, (*addr).info.bytes) };
        let Some(type_) = u8::try_from(type_).ok().filter(|t| (1..=3).contains(t)) else {
            epc.inst
                .api
                .log(0, &format!("ERROR - add_address: bad address type {type_}"));
            return -1;
        };
        let ep = epc.ep.clone();
        epc.inst.inbox.control(Control::AddAddress {
            ep: ep.id,
            cache_ep: ep.cache_ep(),
            type_,
            addr: bytes,
        });
        let raw = Box::into_raw(Box::new(AddrCtx {
            inst: epc.inst.clone(),
            ep: ep.clone(),
            type_,
            addr: bytes,
        }));
        lock(&ep.addr_ctxs).push(raw as usize);
        // SAFETY: valid out-pointer.
        unsafe { *addr_context = raw as *mut c_void };
        0
    })
}

unsafe extern "C" fn remove_address(addr_context: *mut c_void) {
    guard("remove_address", (), || {
        if addr_context.is_null() {
            return;
        }
        let raw = addr_context as usize;
        // SAFETY: our AddrCtx, registered in its endpoint (still open: the core removes
        // addresses before closing the endpoint).
        let ep = unsafe { &*(addr_context as *const AddrCtx) }.ep.clone();
        let mut ctxs = lock(&ep.addr_ctxs);
        let Some(pos) = ctxs.iter().position(|p| *p == raw) else {
            core_api::log(0, "ERROR - remove_address: unknown context");
            return;
        };
        ctxs.swap_remove(pos);
        drop(ctxs);
        // SAFETY: registered, so not yet freed; we just unregistered it.
        let ctx = unsafe { Box::from_raw(addr_context as *mut AddrCtx) };
        let seq = ctx.inst.inbox.control(Control::RemoveAddress {
            ep: ep.id,
            type_: ctx.type_,
            addr: ctx.addr,
        });
        ep.removal_seq.store(seq, Ordering::Release);
    })
}

/// Answers on the core's thread (hit path and immediate failures).
fn answer_inline(
    ctx: &AddrCtx,
    via: Via,
    msg: &[u8],
    id: u64,
    status: u8,
    path: Option<&[u8; 64]>,
    answered: &mut bool,
) {
    answer_inline_timed(ctx, via, msg, id, status, path, None, answered)
}

/// [`answer_inline`]; with `hit_start`, the hit's latency up to the hand-off to the core is
/// recorded (the core's main thread is the hit histogram's only writer).
#[allow(clippy::too_many_arguments)]
fn answer_inline_timed(
    ctx: &AddrCtx,
    via: Via,
    msg: &[u8],
    id: u64,
    status: u8,
    path: Option<&[u8; 64]>,
    hit_start: Option<u64>,
    answered: &mut bool,
) {
    // The answer is built in this thread's buffer: `respond` writes every byte of the length
    // it sets (header and 1–2 entries), so no 592-byte zeroing per answer; the bytes past it
    // are an earlier answer's (the core sends `hdr.length` bytes).
    OUT.with(|cell| {
        let mut fresh;
        let mut held = cell.try_borrow_mut();
        let out: &mut AcmMsg = match held.as_deref_mut() {
            Ok(o) => o,
            // Re-entered (a panic answer while the buffer is borrowed): a zeroed one.
            Err(_) => {
                fresh = AcmMsg::zeroed();
                &mut fresh
            }
        };
        answer_with(ctx, via, msg, id, status, path, hit_start, answered, out)
    })
}

thread_local! {
    /// The answer buffer of the thread that answers inline (the core's main thread).
    static OUT: core::cell::RefCell<AcmMsg> = const { core::cell::RefCell::new(AcmMsg::zeroed()) };
}

#[allow(clippy::too_many_arguments)]
#[inline]
fn answer_with(
    ctx: &AddrCtx,
    via: Via,
    msg: &[u8],
    id: u64,
    status: u8,
    path: Option<&[u8; 64]>,
    hit_start: Option<u64>,
    answered: &mut bool,
    out: &mut AcmMsg,
) {
    respond(msg, via, status, path, out.as_bytes_mut());
    deliver(ctx, via, id, status, hit_start, answered, out)
}

/// Hands the answer built in `out` to the core; with `hit_start`, records the hit's latency
/// up to the hand-off.
#[inline(always)]
fn deliver(
    ctx: &AddrCtx,
    via: Via,
    id: u64,
    status: u8,
    hit_start: Option<u64>,
    answered: &mut bool,
    out: &mut AcmMsg,
) {
    // The span ends here; it is recorded once the client has its answer.
    let end = hit_start.map(|_| ctx.inst.clock.now());
    let f = match via {
        Via::Resolve => ctx.inst.api.resolve_response,
        Via::Query => ctx.inst.api.query_response,
    };
    // SAFETY: `out` is a full, initialised acm_msg of ours; the core copies it before returning.
    let _ = unsafe { f(id, out) };
    // Only now: a panic before this point (building the answer) leaves the request
    // unanswered, and the caller's guard answers it EINVAL; after it, never a second answer.
    *answered = true;
    // Counted after the hand-off, off the client's critical path (nothing reads the counters
    // inside this call).
    ctx.ep.count_status(Writer::Core, status);
    if let (Some(t0), Some(t1)) = (hit_start, end) {
        let n = u64::from(ctx.inst.opts.acmrs_hit_sample);
        ctx.ep.stats.hit.record_n(ctx.inst.clock.ns(t0, t1), n);
    }
}

/// The cache hit path of a route request whose slots' load was just started (`key`'s
/// prefetch): the answer's frame is built in this thread's buffer while the load is in
/// flight, then the lookup; a hit gets its path written into the frame and is answered.
/// `Err` with the lookup result for everything else (a miss, a negative entry, a closed
/// endpoint), which the caller answers.
#[inline(always)]
fn answer_hit(
    ctx: &AddrCtx,
    msg: &[u8],
    id: u64,
    key: &HashedKey,
    hit_start: Option<u64>,
    answered: &mut bool,
) -> Result<c_int, Lookup> {
    let (ep, inst) = (&ctx.ep, &ctx.inst);
    let needs_refresh = OUT.with(|cell| {
        let Ok(mut out) = cell.try_borrow_mut() else {
            return Err(Lookup::Miss);
        };
        let frame = build_resolve_frame(&ClientMsg::new_unchecked(msg), out.as_bytes_mut());
        if frame.is_err() || ep.closed.load(Ordering::Acquire) {
            return Err(Lookup::Miss);
        }
        let Some(path) = response_path_mut(out.as_bytes_mut()) else {
            return Err(Lookup::Miss);
        };
        // The slot's record goes straight into the answer's path.
        match inst.cache.lookup_into(key, inst.now_ms(), path) {
            Lookup::Hit { needs_refresh, .. } => {
                deliver(ctx, Via::Resolve, id, 0, hit_start, answered, &mut out);
                Ok(needs_refresh)
            }
            other => Err(other.with_record([0; 64])),
        }
    })?;
    hit_answered(ctx, msg, needs_refresh);
    Ok(0)
}

/// What follows a cache hit once its answer is with the core: ROUTE_CACHE counted (the core's
/// counter is a locked add, kept off the client's critical path) and, for an entry near
/// expiry, a background refresh by the dataplane (a full queue only loses the refresh; the
/// entry then expires and is resolved as a miss).
fn hit_answered(ctx: &AddrCtx, msg: &[u8], needs_refresh: bool) {
    ctx.ep
        .count_global(Writer::Core, ctx.inst.api, Counter::RouteCache);
    if needs_refresh {
        let _ = hand_over(ctx, 0, Kind::Refresh, msg);
    }
}

/// Hands a request to the dataplane; the status to answer it with at once (counted, logged)
/// if it cannot take it: ENOMEM when its queue is full, ENODATA when it has stopped (it gave
/// up after a failure it could not recover from, or its thread is gone).
fn hand_over(ctx: &AddrCtx, id: u64, kind: Kind, msg: &[u8]) -> Result<(), Status> {
    hand_over_stamped(ctx, id, kind, msg, None)
}

/// [`hand_over`] with the start of a missed `resolve()` (the dataplane records its latency).
fn hand_over_stamped(
    ctx: &AddrCtx,
    id: u64,
    kind: Kind,
    msg: &[u8],
    stamp: Option<MissStamp>,
) -> Result<(), Status> {
    let (ep, cache_ep, bytes) = (ctx.ep.id, ctx.ep.cache_ep(), msg);
    let inbox = &ctx.inst.inbox;
    if inbox.request_stamped(ep, cache_ep, id, kind, bytes, stamp) {
        return Ok(());
    }
    let answered = matches!(kind, Kind::Resolve | Kind::Query);
    if inbox.is_stopped() {
        if answered {
            ctx.inst.log_limited(
                LogReason::Stopped,
                "ERROR - the acmrs dataplane has stopped, answering ENODATA",
            );
        }
        return Err(Status::Enodata);
    }
    if answered {
        ctx.inst.log_limited(
            LogReason::QueueFull,
            "ERROR - request queue full, answering ENOMEM",
        );
    }
    Err(Status::Enomem)
}

/// Starts the loads of a path lookup placed at `place` without waiting for them: the lines of
/// its preferred slots and its groups' tag lines, then, in a `large` cache, (the tags read)
/// the slots whose tag matches, where a key outside its preferred slots lives. Reading the
/// tags costs ~25 ns of work: hidden behind a DRAM miss, but on a cache-resident table (where
/// the second slot read is no DRAM trip either) pure cost (1k paths: p50 +25–30 ns).
#[inline(always)]
fn start_lookup(cache: &HostCache, large: bool, place: Place) {
    prefetch(cache.prefetch_hint(place));
    if large {
        prefetch(cache.prefetch_tagged(place));
    }
}

/// Starts loading the cache lines at `hint` without waiting for them.
#[inline(always)]
fn prefetch<const N: usize>(hint: [*const u8; N]) {
    #[cfg(target_arch = "x86_64")]
    for p in hint {
        // SAFETY: a prefetch is only a hint: it never faults, reads nothing into the program
        // and writes nothing, whatever the address (these are slots of our live cache).
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = hint;
}

fn resolve_impl(ctx: &AddrCtx, msg: &[u8], id: u64, answered: &mut bool) -> c_int {
    let r = resolve_answer(ctx, msg, id, answered);
    // Counted once the request is answered or handed over, off the client's critical path.
    ctx.ep.count(Writer::Core, Counter::Resolve);
    r
}

#[inline(always)]
fn resolve_answer(ctx: &AddrCtx, msg: &[u8], id: u64, answered: &mut bool) -> c_int {
    let ep = &ctx.ep;
    let inst = &ctx.inst;
    // Latency start (docs/stats.md): one TSC read, for one request in `acmrs_hit_sample` (a
    // hit is timed only then; a miss not sampled here starts its clock at the hand-over, a
    // few hundred ns later, against a miss of ~100 µs).
    let tick = ep.hit_tick.load(Ordering::Relaxed).wrapping_add(1);
    ep.hit_tick.store(tick, Ordering::Relaxed);
    let sample = inst.opts.acmrs_hit_sample;
    let t0 = (tick & (sample - 1) == 0).then(|| inst.clock.now());
    // The miss starts first: a path is placed in the cache by its destination, so a PATH
    // request's slots are requested before the request is checked and keyed, and their DRAM
    // miss overlaps all of that.
    let view = ep.view();
    let early = route_dest(&view, msg).map(|d| inst.cache.place(&d));
    if let Some(p) = early {
        start_lookup(&inst.cache, inst.large_cache, p);
    }
    let target = classify(&view, msg);
    // A route hit is answered from here.
    let hit = match &target {
        Target::Route { key: Some(k), .. } => {
            let place = early.unwrap_or_else(|| {
                // A LID or GID entry: its destination is known only now.
                let p = inst.cache.place(&k.dest());
                start_lookup(&inst.cache, inst.large_cache, p);
                p
            });
            let h = inst.cache.hashed_at(k, place);
            match answer_hit(ctx, msg, id, &h, t0, answered) {
                Ok(r) => return r,
                Err(other) => Some(other),
            }
        }
        _ => None,
    };
    let mut reply = |status: u8, path: Option<&[u8; 64]>| {
        // A path is answered only on a hit: its latency is recorded.
        answer_inline_timed(
            ctx,
            Via::Resolve,
            msg,
            id,
            status,
            path,
            path.and(t0),
            answered,
        );
        0
    };
    if ep.closed.load(Ordering::Acquire) {
        return reply(u8::from(Status::Enodata), None);
    }
    let now = inst.now_ms();
    let class = match target {
        Target::Address { .. } => MissClass::Address,
        _ => MissClass::Route,
    };
    let (lookup, nodelay) = match target {
        Target::Fail(s) => {
            if s == u8::from(Status::Einval) {
                inst.log_limited(
                    LogReason::Malformed,
                    "ERROR - malformed resolve request rejected (EINVAL)",
                );
            }
            return reply(s, None);
        }
        Target::Route { nodelay, .. } => (hit.unwrap_or(Lookup::Miss), nodelay),
        // A local address removed since the dataplane last caught up may still be aliased.
        Target::Address { nodelay, .. }
            if ep.removal_seq.load(Ordering::Acquire) > inst.inbox.controls_applied() =>
        {
            (Lookup::Miss, nodelay)
        }
        Target::Address { key, nodelay } => (inst.cache.lookup_addr(&key, now), nodelay),
    };
    match lookup {
        Lookup::Hit {
            record,
            needs_refresh,
            ..
        } => {
            // An address hit (a route hit was answered above).
            let r = reply(0, Some(&record));
            hit_answered(ctx, msg, needs_refresh);
            return r;
        }
        Lookup::Negative { status, .. } => return reply(status, None),
        Lookup::Miss | Lookup::Busy => {}
    }
    if nodelay {
        let r = reply(u8::from(Status::Enodata), None);
        // Prime the cache; a full queue only loses the priming.
        let _ = hand_over(ctx, id, Kind::Prime, msg);
        return r;
    }
    let stamp = MissStamp {
        at: t0.unwrap_or_else(|| inst.clock.now()),
        class,
    };
    match hand_over_stamped(ctx, id, Kind::Resolve, msg, Some(stamp)) {
        Ok(()) => {
            *answered = true;
            0
        }
        Err(status) => reply(u8::from(status), None),
    }
}

/// How many bytes of a request `client_call` reads: `hdr.length`, plus the entry at
/// `src_index` when `src_out` is set (the core writes the source it selected into the slot
/// after the last entry without growing `length`), at least the 16-byte header and at most the
/// 592-byte `acm_msg`. A bad length is the classifier's EINVAL, as with the whole buffer.
fn request_span(hdr: &[u8; HDR_LEN]) -> usize {
    let length = usize::from(u16::from_ne_bytes([hdr[6], hdr[7]]));
    let source = if hdr[3] != 0 {
        HDR_LEN + EP_LEN * (usize::from(hdr[4]) + 1)
    } else {
        0
    };
    length.max(source).clamp(HDR_LEN, MSG_BYTES)
}

const HDR_LEN: usize = acm_core_nostd::wire::client::HDR_LEN;
const EP_LEN: usize = acm_core_nostd::wire::client::EP_LEN;

/// The body of `resolve()` / `query()`: null checks, a view of the request's bytes, `catch_unwind`,
/// and an EINVAL answer (through `via`) if the implementation panicked before answering.
///
/// # Safety
/// `addr_context` must be null or our `AddrCtx`, `msg` null or a full `acm_msg` buffer.
unsafe fn client_call(
    what: &str,
    addr_context: *mut c_void,
    msg: *mut AcmMsg,
    id: u64,
    imp: fn(&AddrCtx, &[u8], u64, &mut bool) -> c_int,
    via: Via,
) -> c_int {
    if addr_context.is_null() || msg.is_null() {
        core_api::log(0, &format!("ERROR - {what}: null argument"));
        return -1;
    }
    // SAFETY: the core passes a full acm_msg buffer (592 bytes) valid for this call: its
    // 16-byte header is readable (byte arrays, no alignment needed).
    let hdr = unsafe { (msg as *const [u8; HDR_LEN]).read() };
    let n = request_span(&hdr);
    // SAFETY: `n <= MSG_BYTES` bytes of the core's 592-byte buffer, valid for this call and
    // written by no one while it runs (the core's thread is in this call, and we answer into
    // our own buffers, never into `msg`). Nothing keeps this view past the call: a request
    // handed to the dataplane is copied into its queue (`Inbox::request`).
    let request: &[u8] = unsafe { core::slice::from_raw_parts(msg as *const u8, n) };
    // SAFETY: our AddrCtx, alive until remove_address / close_endpoint.
    let ctx = unsafe { &*(addr_context as *const AddrCtx) };
    let mut answered = false;
    let answered_ref = &mut answered;
    match catch_unwind(AssertUnwindSafe(|| imp(ctx, request, id, answered_ref))) {
        Ok(r) => r,
        Err(_) => {
            core_api::log(0, &format!("ERROR - internal error (panic) in {what}"));
            if !answered {
                let _ = catch_unwind(AssertUnwindSafe(|| {
                    answer_inline(
                        ctx,
                        via,
                        request,
                        id,
                        u8::from(Status::Einval),
                        None,
                        &mut true,
                    )
                }));
            }
            0
        }
    }
}

unsafe extern "C" fn resolve(addr_context: *mut c_void, msg: *mut AcmMsg, id: u64) -> c_int {
    // SAFETY: the core's arguments, as client_call requires.
    unsafe { client_call("resolve", addr_context, msg, id, resolve_impl, Via::Resolve) }
}

fn query_impl(ctx: &AddrCtx, msg: &[u8], id: u64, answered: &mut bool) -> c_int {
    let mut reply = |status: u8| {
        answer_inline(ctx, Via::Query, msg, id, status, None, answered);
        0
    };
    if ctx.ep.closed.load(Ordering::Acquire) {
        return reply(u8::from(Status::Enodata));
    }
    // The dataplane validates it (EINVAL) and sends it to the SA.
    match hand_over(ctx, id, Kind::Query, msg) {
        Ok(()) => {
            *answered = true;
            0
        }
        Err(status) => reply(u8::from(status)),
    }
}

unsafe extern "C" fn query(addr_context: *mut c_void, msg: *mut AcmMsg, id: u64) -> c_int {
    // SAFETY: the core's arguments, as client_call requires.
    unsafe { client_call("query", addr_context, msg, id, query_impl, Via::Query) }
}

unsafe extern "C" fn handle_event(port_context: *mut c_void, event: c_int) -> c_int {
    guard("handle_event", -1, || {
        if port_context.is_null() {
            return -1;
        }
        // SAFETY: our PortCtx, alive until close_port.
        let port = unsafe { &*(port_context as *const PortCtx) };
        if event == IBV_EVENT_CLIENT_REREGISTER {
            let eps = port.inst.eps.of_port(port.info.id);
            for ep in &eps {
                // From now on no hit on this endpoint sees a route learned before the change.
                ep.bump_gen();
                port.inst.inbox.control(Control::Reregister(ep.id));
            }
            port.inst.api.log(
                1,
                &format!(
                    "client reregister on port {}: {} endpoints flushed and rejoining",
                    port.info.port_num,
                    eps.len()
                ),
            );
        }
        0
    })
}

unsafe extern "C" fn query_perf(ep_context: *mut c_void, values: *mut u64, cnt: *mut u8) {
    guard("query_perf", (), || {
        if ep_context.is_null() || values.is_null() || cnt.is_null() {
            return;
        }
        // SAFETY: our EpCtx.
        let ep = &unsafe { &*(ep_context as *const EpCtx) }.ep;
        let n = ep.counters[0].len();
        for i in 0..n {
            // SAFETY: the core's buffer holds 72 u64 (acm_msg data); we write 7.
            unsafe { values.add(i).write_unaligned(ep.counter(i).to_be()) };
        }
        // SAFETY: valid out-pointer.
        unsafe { *cnt = n as u8 };
    })
}

/// The provider table returned by `provider_query`.
pub static PROVIDER: AcmProvider = AcmProvider {
    size: core::mem::size_of::<AcmProvider>(),
    version: ACM_PROV_VERSION,
    name: c"acmrs".as_ptr(),
    open_device,
    close_device,
    open_port,
    close_port,
    open_endpoint,
    close_endpoint,
    add_address,
    remove_address,
    resolve,
    query,
    handle_event,
    query_perf,
};

const _: () = assert!(MSG_LEN == MSG_BYTES);
