//! The provider instance's life cycle, on the core's main thread: the bodies of the ten
//! callbacks that are not `resolve()`/`query()` (each run inside its guard by
//! [`crate::callbacks`]), and what they build.
//!
//! * **Instance**: the first `open_device` creates it (`create_instance`: options, the path
//!   cache and the resolver's storage sized from them, the inbox, the dataplane thread, the
//!   stats exporter); the last `close_device` shuts the dataplane down and joins it.
//! * **Ports**: `open_port` reads what the resolver needs of the port (GID 0 through the
//!   core; LID, active MTU, rate and SubnetTimeOut through
//!   [`acm_dataplane::verbs::port_attr`]).
//! * **Endpoints and addresses**: `open_endpoint` takes an endpoint slot, loads the route
//!   preload, opens the endpoint's UD QP (`open_ud`) and hands it all to the dataplane
//!   (`Control::Open`); `close_endpoint`, `add_address`, `remove_address` and
//!   `handle_event` (client reregister) keep the main thread's objects and tell the dataplane.
//! * The context objects the core holds for us (`DevCtx`, `PortCtx`, `EpCtx`, `AddrCtx`: the
//!   hit path's context).

use crate::core_api::{self, CoreApi};
use crate::ffi::*;
use crate::instance::{lock, Ep, EpRegistry, Instance, PortInfo};
use crate::io::{set_reply_target, PluginIo};
use crate::preload;
use acm_core_nostd::cache::{AddrKind, AddrSlot, CacheConfig, CacheWriter, PathCache};
use acm_core_nostd::node::SaConfig;
use acm_core_nostd::resolver::{
    Capacities, Config, Counter, EpConfig, HeapStorage, MsgBuf, Resolver,
};
use acm_core_nostd::text::opts::{PollMode, ProviderOptions, RoutePreload, SaTransport};
use acm_core_nostd::wire::acm_mad::AddressType;
use acm_core_nostd::wire::client::Status;
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::rate::{rate_from_link, LinkSpeed, LinkWidth};
use acm_dataplane::export::{ExportConfig, Exporter};
use acm_dataplane::plane::{Control, CoreIo, HostWriter, Inbox, Plane, Queued, Ud};
use acm_dataplane::stats::Clock;
use acm_dataplane::verbs::IbvContext;
use acm_dataplane::watchdog::Watchdog;
use acm_dataplane::worker::{Worker, WorkerConfig};
use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The one provider instance and its dataplane thread, shared by every device.
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
/// The instance's stall watchdog thread (`acmrs_stall_ms`), if any.
static WATCHDOG: Mutex<Option<Watchdog>> = Mutex::new(None);

fn next_serial() -> u64 {
    NEXT_SERIAL.fetch_add(1, Ordering::Relaxed)
}

/// What the core holds for us per device.
struct DevCtx {
    inst: Arc<Instance>,
}

/// What the core holds for us per port.
struct PortCtx {
    inst: Arc<Instance>,
    info: Arc<PortInfo>,
}

/// What the core holds for us per endpoint.
struct EpCtx {
    inst: Arc<Instance>,
    ep: Arc<Ep>,
}

/// What the core holds for us per address: the context of `resolve()` / `query()` on it.
pub(crate) struct AddrCtx {
    pub(crate) inst: Arc<Instance>,
    pub(crate) ep: Arc<Ep>,
    kind: AddrKind,
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
    let jobs = opts.acmrs_pending_capacity.max(1) as usize;
    Capacities {
        // Every request the dataplane holds has a slot; the route-job table bounds how many
        // distinct resolutions run at once.
        requests: jobs + 64,
        answer_reserve: 64,
        jobs,
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
    // The cache's one writer, taken once here and owned by the dataplane's resolver from now
    // on (handed from one resolver to the next after a caught panic).
    let writer = CacheWriter::take(cache)
        .map_err(|e| std::io::Error::other(format!("path cache writer: {e}")))?;
    let make = Box::new(move |w: HostWriter| {
        Resolver::new(config, HeapStorage::new(caps), w, random_seed()).ok()
    });
    let plane = Plane::new(
        make,
        writer,
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
    // On `ud`: room for every query the resolver may have out, plus each endpoint's two
    // joins, two subscriptions and their cancellations, and one half-world table at a time,
    // of at most half the path cache (each record is filed by GID and by LID), at most
    // 65 536 records (4 MiB, touched only as used).
    let table = acm_core_nostd::resolver::table::room_for(inst.opts.acmrs_path_capacity) as usize;
    let plane = plane.with_sa(
        SaConfig::from_options(&inst.opts),
        caps.sa_inflight + 8 * caps.endpoints,
        table,
    );
    // (spin after the last work, the most it learns to spin after work, spin for an SA reply
    // due within): `adaptive` polls on for a reply expected within 1 ms rather than pay a
    // wake-up for it, and after work for up to 500 µs while work comes that often (misses
    // one after another), so that the next reply finds it polling (docs/dataplane.md).
    let (spin, spin_learned, spin_for_reply) = match inst.opts.poll_mode() {
        // Never blocks (run to completion on the core it is given).
        PollMode::Busy => (Duration::MAX, Duration::ZERO, Duration::ZERO),
        PollMode::Adaptive => (
            Duration::from_micros(50),
            Duration::from_micros(500),
            Duration::from_millis(1),
        ),
        PollMode::Event => (Duration::ZERO, Duration::ZERO, Duration::ZERO),
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
    let owns_core = inst.opts.poll_mode() == PollMode::Busy;
    let wc = WorkerConfig {
        name: "acmrs-dataplane".into(),
        cpu: usize::try_from(inst.opts.acmrs_cpu).ok(),
        spin,
        spin_learned,
        spin_for_reply,
        max_park: Duration::from_millis(100),
        // `busy` owns its core and polls all the time (a hand-off to it is a cache-line
        // transfer). Otherwise the worker shares a core: its spins yield to what runs beside
        // it (the core's thread, an SA on the same host), and a request is served by a round
        // on the core's thread when the loop is free (docs/dataplane.md).
        yield_spin: !owns_core,
        inline: !owns_core,
    };
    set_reply_target(&inst);
    let worker = Worker::spawn(wc, waker, plane)?;
    start_exporter(&inst);
    start_watchdog(&inst);
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

/// Starts the stall watchdog (`acmrs_stall_ms`; `acm_dataplane::watchdog`): requests that
/// wait on a dataplane thread that runs no round are answered ETIMEDOUT from its thread,
/// through the same core helpers and counters as the dataplane's answers. A failure to start
/// it is logged and leaves the provider running without it.
fn start_watchdog(inst: &Arc<Instance>) {
    let ms = inst.opts.acmrs_stall_ms;
    if ms == 0 {
        return;
    }
    let mut io = PluginIo::new(inst.clone());
    let mut msg = Box::new(MsgBuf::new());
    let answer = move |r: &Queued, status: Status| {
        if let Some(a) = r.answer(status, &mut msg) {
            io.count(a.ep, Counter::Error);
            io.answer(&a, &mut msg);
        }
    };
    let logger = inst.clone();
    let log = move |level: u8, text: &str| {
        if logger.log_enabled(level) {
            logger.api.log(i32::from(level), text);
        }
    };
    let bound = Duration::from_millis(u64::from(ms));
    match Watchdog::spawn(inst.inbox.clone(), bound, answer, log) {
        Ok(d) => *lock(&WATCHDOG) = Some(d),
        Err(e) => inst
            .api
            .log(0, &format!("ERROR - stall watchdog not started: {e}")),
    }
}

/// The body of the `open_device` callback.
///
/// # Safety
/// `device` null or the core's device; `dev_context` null or valid for a write.
pub(crate) unsafe fn open_device(device: *const AcmDevice, dev_context: *mut *mut c_void) -> c_int {
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
}

/// The body of the `close_device` callback.
///
/// # Safety
/// `dev_context` null or from [`open_device`], closed once.
pub(crate) unsafe fn close_device(dev_context: *mut c_void) {
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
        if let Some(d) = lock(&WATCHDOG).take() {
            d.stop();
        }
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
}

/// What the port says of itself (zeros when it cannot be asked).
#[derive(Default)]
struct PortAttr {
    lid: u16,
    mtu: u8,
    rate: u8,
    subnet_timeout: u8,
}

fn query_port(port: *const AcmPort) -> PortAttr {
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
    // SAFETY: the core's open ibv_context of the port's device, alive while the port is.
    let Some(a) = (unsafe { acm_dataplane::verbs::port_attr(verbs as *mut IbvContext, num) })
    else {
        return PortAttr::default();
    };
    let rate = rate_from_link(
        LinkWidth::from(a.active_width),
        LinkSpeed::from(u16::from(a.active_speed)),
    )
    .map_or(0, u8::from);
    PortAttr {
        lid: a.lid,
        // An `enum ibv_mtu` code (1..=5).
        mtu: a.active_mtu as u8,
        rate,
        subnet_timeout: a.subnet_timeout,
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

/// The body of the `open_port` callback.
///
/// # Safety
/// `port` null or the core's port; `dev_context` null or from [`open_device`]; `port_context` null or valid for a write.
pub(crate) unsafe fn open_port(
    port: *const AcmPort,
    dev_context: *mut c_void,
    port_context: *mut *mut c_void,
) -> c_int {
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
    let a = query_port(port);
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
}

/// The body of the `close_port` callback.
///
/// # Safety
/// `port_context` null or from [`open_port`], closed once.
pub(crate) unsafe fn close_port(port_context: *mut c_void) {
    if !port_context.is_null() {
        // SAFETY: from Box::into_raw in open_port; closed once.
        let ctx = unsafe { Box::from_raw(port_context as *mut PortCtx) };
        ctx.inst
            .api
            .log(1, &format!("close_port {}", ctx.info.port_num));
    }
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
    let ctx = verbs as *mut IbvContext;
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

/// The body of the `open_endpoint` callback.
///
/// # Safety
/// `endpoint` null or the core's endpoint; `port_context` null or from [`open_port`]; `ep_context` null or valid for a write.
pub(crate) unsafe fn open_endpoint(
    endpoint: *const AcmEndpoint,
    port_context: *mut c_void,
    ep_context: *mut *mut c_void,
) -> c_int {
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
}

/// The body of the `close_endpoint` callback.
///
/// # Safety
/// `ep_context` null or from [`open_endpoint`], closed once.
pub(crate) unsafe fn close_endpoint(ep_context: *mut c_void) {
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
}

/// The body of the `add_address` callback.
///
/// # Safety
/// `addr` null or the core's address; `ep_context` null or from [`open_endpoint`]; `addr_context` null or valid for a write.
pub(crate) unsafe fn add_address(
    addr: *const AcmAddress,
    ep_context: *mut c_void,
    addr_context: *mut *mut c_void,
) -> c_int {
    if addr.is_null() || ep_context.is_null() || addr_context.is_null() {
        return -1;
    }
    // SAFETY: our EpCtx, alive until close_endpoint.
    let epc = unsafe { &*(ep_context as *const EpCtx) };
    // SAFETY: the core's acm_address, valid for this call only: copy what we need now.
    let (type_, bytes) = unsafe { ((*addr).type_, (*addr).info.bytes) };
    // The core's `ACM_ADDRESS_*` becomes a kind here, once: a name or an IP address.
    let kind = u8::try_from(type_)
        .ok()
        .and_then(|t| AddrKind::try_from(AddressType::from(t)).ok());
    let Some(kind) = kind else {
        epc.inst
            .api
            .log(0, &format!("ERROR - add_address: bad address type {type_}"));
        return -1;
    };
    let ep = epc.ep.clone();
    epc.inst.inbox.control(Control::AddAddress {
        ep: ep.id,
        cache_ep: ep.cache_ep(),
        kind,
        addr: bytes,
    });
    let raw = Box::into_raw(Box::new(AddrCtx {
        inst: epc.inst.clone(),
        ep: ep.clone(),
        kind,
        addr: bytes,
    }));
    lock(&ep.addr_ctxs).push(raw as usize);
    // SAFETY: valid out-pointer.
    unsafe { *addr_context = raw as *mut c_void };
    0
}

/// The body of the `remove_address` callback.
///
/// # Safety
/// `addr_context` null or from [`add_address`], removed once.
pub(crate) unsafe fn remove_address(addr_context: *mut c_void) {
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
        kind: ctx.kind,
        addr: ctx.addr,
    });
    ep.removal_seq.store(seq, Ordering::Release);
}

/// The body of the `handle_event` callback.
///
/// # Safety
/// `port_context` null or from [`open_port`].
pub(crate) unsafe fn handle_event(port_context: *mut c_void, event: c_int) -> c_int {
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
}

/// The body of the `query_perf` callback.
///
/// # Safety
/// `ep_context` null or from [`open_endpoint`]; `values` null or room for 7 `u64`; `cnt` null or valid for a write.
pub(crate) unsafe fn query_perf(ep_context: *mut c_void, values: *mut u64, cnt: *mut u8) {
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
}
