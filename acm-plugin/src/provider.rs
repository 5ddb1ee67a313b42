//! The twelve provider callbacks and the provider instance's life cycle.
//!
//! Every `extern "C"` body runs inside `catch_unwind`: a panic is logged and turned into an
//! error return (and, for `resolve()`/`query()`, an EINVAL answer if none was sent yet); it
//! never unwinds into the core.
//!
//! The instance (options, route table, queues, worker thread) is created at the first
//! `open_device` and torn down after the last `close_device`, which answers everything still
//! pending and joins the worker.

use crate::core_api::{self, CoreApi};
use crate::engine::{self, Engine, MAX_INFLIGHT};
use crate::ffi::*;
use crate::respond::{self, Via};
use crate::state::{
    Cached, Control, Ep, HostEntry, Kind, LocalAddr, LogReason, PortInfo, Request, RouteKey, Shared,
};
use acm_core_nostd::cache::{AddrSlot, CacheConfig, PathCache};
use acm_core_nostd::text::dump_pr::{LidTable, LocalPaths, LocalPort};
use acm_core_nostd::text::hosts::HostLines;
use acm_core_nostd::text::opts::{
    AddrPreload, LoopbackProt, PollMode, ProviderOptions, RoutePreload, RouteProt,
};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::path_record::PathRecord;
use acm_core_nostd::wire::Selector;
use acm_dataplane::worker::{Worker, WorkerConfig};
use core::ffi::{c_int, c_void};
use crossbeam_queue::ArrayQueue;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Global {
    shared: Option<Arc<Shared>>,
    worker: Option<Worker>,
    devices: usize,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    shared: None,
    worker: None,
    devices: 0,
});
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn global() -> std::sync::MutexGuard<'static, Global> {
    match GLOBAL.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Runs `f`, turning a panic into `on_panic` (logged).
fn guard<R>(what: &str, on_panic: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            core_api::log(0, &format!("ERROR - internal error (panic) in {what}"));
            on_panic
        }
    }
}

struct DevCtx {
    shared: Arc<Shared>,
}

struct PortCtx {
    shared: Arc<Shared>,
    info: Arc<PortInfo>,
}

struct EpCtx {
    ep: Arc<Ep>,
}

struct AddrCtx {
    ep: Arc<Ep>,
    local: LocalAddr,
}

fn load_options(api: &CoreApi) -> ProviderOptions {
    let Some(path) = api.opts_file() else {
        return ProviderOptions::default();
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            api.log(
                1,
                &format!("opts file {}: {e}; defaults used", path.display()),
            );
            return ProviderOptions::default();
        }
    };
    let (opts, _stats) = ProviderOptions::load(&bytes, |e| {
        api.log(
            0,
            &format!(
                "ERROR - {} line {}: {}; default kept",
                path.display(),
                e.line,
                e.reason()
            ),
        )
    });
    if opts.route_prot == RouteProt::Acm {
        api.log(0, "route_prot acm is not implemented yet; using sa");
    }
    opts
}

fn load_hosts(api: &CoreApi, opts: &ProviderOptions) -> Vec<HostEntry> {
    if opts.addr_preload != AddrPreload::AcmHosts {
        return Vec::new();
    }
    let file = opts.addr_data_file.as_str();
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => {
            api.log(0, &format!("ERROR - addr_data_file {file}: {e}"));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    let cap = opts.acmrs_addr_capacity as usize;
    let mut dropped = 0usize;
    for entry in HostLines::new(&bytes) {
        match entry {
            // acmrs_addr_capacity bounds the address table (memory stays bounded whatever
            // the file holds); the rest is counted and reported below.
            Ok(_) if out.len() >= cap => dropped += 1,
            Ok(h) => out.push((
                (u16::from(h.address.acm_type()), h.address.to_acm_bytes()),
                h.gid,
            )),
            Err(e) => api.log(
                0,
                &format!("ERROR - {file} line {}: {}; skipped", e.line, e.reason()),
            ),
        }
    }
    if dropped > 0 {
        api.log(
            0,
            &format!(
                "ERROR - {file}: {dropped} addresses beyond acmrs_addr_capacity {cap} ignored"
            ),
        );
    }
    out.sort_by_key(|e| e.0);
    out.dedup_by(|a, b| a.0 == b.0);
    api.log(
        1,
        &format!("{} host addresses preloaded from {file}", out.len()),
    );
    out
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

fn new_cache(opts: &ProviderOptions) -> std::io::Result<crate::state::Cache> {
    // A per-instance seed so remote parties cannot aim at one bucket.
    let seed = {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(next_id());
        h.finish()
    };
    let config = CacheConfig {
        seed,
        refresh_ahead: refresh_ahead_ms(opts),
    };
    // Addresses are not aliased into the cache yet; the table only needs to exist.
    PathCache::new(
        crate::huge::path_slots(opts.acmrs_path_capacity as usize),
        AddrSlot::boxed(16),
        config,
    )
    .map_err(|e| std::io::Error::other(format!("path cache: {e:?}")))
}

fn create_instance(api: &'static CoreApi) -> std::io::Result<(Arc<Shared>, Worker)> {
    let opts = load_options(api);
    let hosts = load_hosts(api, &opts);
    let waker = Worker::new_waker();
    let now = waker.coarse_ms();
    let host_until = opts
        .addr_timeout
        .as_millis()
        .map_or(crate::state::NEVER, |t| now.saturating_add(t));
    let host_expiry = hosts.iter().map(|_| AtomicU64::new(host_until)).collect();
    let shared = Arc::new(Shared {
        api,
        cache: new_cache(&opts)?,
        requests: ArrayQueue::new(opts.acmrs_request_capacity.max(1) as usize),
        replies: ArrayQueue::new(MAX_INFLIGHT * 4),
        control: Mutex::new(Vec::new()),
        direct: if opts.acmrs_sa_direct {
            (0..MAX_INFLIGHT + crate::state::INLINE_SLOTS)
                .map(|_| Mutex::default())
                .collect()
        } else {
            Box::default()
        },
        waker: waker.clone(),
        hosts,
        host_expiry,
        flush_gen: AtomicU32::new(0),
        ep_slots: Mutex::new([false; 256]),
        pushed: AtomicU64::new(0),
        idle_seen: AtomicU64::new(0),
        inline_busy: Default::default(),
        inline_keys: Mutex::new([None; crate::state::INLINE_SLOTS]),
        overflows: AtomicU64::new(0),
        reply_drops: AtomicU64::new(0),
        malformed: AtomicU64::new(0),
        log_limits: Default::default(),
        opts,
    });
    let spin = match shared.opts.acmrs_poll_mode {
        PollMode::Busy => Duration::from_secs(3600),
        PollMode::Adaptive => Duration::from_micros(50),
        PollMode::Event => Duration::ZERO,
    };
    let config = WorkerConfig {
        name: "acmrs-worker".into(),
        cpu: usize::try_from(shared.opts.acmrs_cpu).ok(),
        spin,
        max_park: Duration::from_millis(100),
    };
    let engine = Engine::new(shared.clone(), sa_handler);
    let worker = Worker::spawn(config, waker, engine)?;
    api.log(
        0,
        &format!(
            "started: route cache {} slots, request queue {}, pending {}",
            shared.cache.capacity(),
            shared.opts.acmrs_request_capacity,
            shared.opts.acmrs_pending_capacity
        ),
    );
    Ok((shared, worker))
}

/// The SA completion handler given to `acm_alloc_sa_mad` (core SA thread).
unsafe extern "C" fn sa_handler(mad: *mut AcmSaMad) {
    guard("sa_handler", (), || {
        let Some(api) = CoreApi::get() else {
            return;
        };
        if mad.is_null() {
            return;
        }
        // SAFETY: the core hands us the completed, non-null MAD we allocated.
        let reply = unsafe { engine::take_sa_completion(mad, api) };
        let shared = global().shared.clone();
        if let Some(sh) = shared {
            // A successful reply answers the client that started the query right here (it is
            // claimed under the slot's lock, so the worker will not answer it again); the
            // worker still gets the reply to write the cache and answer coalesced waiters.
            let direct = engine::claim_direct(&sh, &reply);
            if sh.replies.push(reply).is_err() {
                sh.reply_drops.fetch_add(1, Ordering::Relaxed);
                sh.log_limited(
                    LogReason::ReplyDrop,
                    0,
                    "ERROR - SA reply queue full; the request will time out",
                );
            }
            if let Some((d, record)) = direct {
                engine::answer_direct(&sh, &d, &record);
            }
            sh.waker.wake();
        }
    })
}

unsafe extern "C" fn open_device(device: *const AcmDevice, dev_context: *mut *mut c_void) -> c_int {
    guard("open_device", -1, || {
        if device.is_null() || dev_context.is_null() {
            return -1;
        }
        let Some(api) = CoreApi::get() else {
            return -1;
        };
        let mut g = global();
        if g.shared.is_none() {
            match create_instance(api) {
                Ok((sh, w)) => {
                    g.shared = Some(sh);
                    g.worker = Some(w);
                }
                Err(e) => {
                    api.log(0, &format!("ERROR - cannot start worker: {e}"));
                    return -1;
                }
            }
        }
        let Some(shared) = g.shared.clone() else {
            return -1;
        };
        g.devices += 1;
        let ctx = Box::new(DevCtx { shared });
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
        let ctx = unsafe { Box::from_raw(dev_context as *mut DevCtx) };
        drop(ctx);
        let (shared, worker) = {
            let mut g = global();
            g.devices = g.devices.saturating_sub(1);
            if g.devices > 0 {
                return;
            }
            (g.shared.take(), g.worker.take())
        };
        if let Some(sh) = shared {
            sh.control(Control::Shutdown);
            if let Some(w) = worker {
                if w.join().is_err() {
                    sh.api.log(0, "ERROR - worker thread panicked");
                }
            }
            sh.api.log(1, "stopped");
        }
    })
}

/// Reads LID, MTU and rate of a port through `ibv_query_port` (when the host has it).
fn query_port(api: &CoreApi, port: *const AcmPort) -> (u16, u8, u8) {
    let Some(q) = api.ibv_query_port else {
        return (0, 0, 0);
    };
    // SAFETY: `port` and its device are the core's stable objects (checked non-null by caller).
    let (verbs, num) = unsafe {
        let dev = (*port).dev;
        if dev.is_null() {
            return (0, 0, 0);
        }
        ((*dev).verbs, (*port).port_num)
    };
    if verbs.is_null() {
        return (0, 0, 0);
    }
    // struct ibv_port_attr is 56 bytes in rdma-core 44; a larger zeroed buffer is harmless.
    let mut attr = [0u64; 32];
    // SAFETY: ibv_query_port(ctx, port, attr) fills at most sizeof(struct ibv_port_attr) bytes.
    let rc = unsafe { q(verbs, num, attr.as_mut_ptr() as *mut c_void) };
    if rc != 0 {
        return (0, 0, 0);
    }
    let b: Vec<u8> = attr.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let lid = u16::from_ne_bytes([b[PORT_ATTR_LID], b[PORT_ATTR_LID + 1]]);
    let mtu = b[PORT_ATTR_ACTIVE_MTU];
    let rate = ibv_rate(b[PORT_ATTR_ACTIVE_WIDTH], b[PORT_ATTR_ACTIVE_SPEED]);
    (lid, mtu, rate)
}

/// `offsetof(struct ibv_port_attr, lid)` (checked by the layout test).
pub const PORT_ATTR_LID: usize = 34;
/// `offsetof(struct ibv_port_attr, active_mtu)`.
pub const PORT_ATTR_ACTIVE_MTU: usize = 8;
/// `offsetof(struct ibv_port_attr, active_width)`.
pub const PORT_ATTR_ACTIVE_WIDTH: usize = 43;
/// `offsetof(struct ibv_port_attr, active_speed)`.
pub const PORT_ATTR_ACTIVE_SPEED: usize = 44;

/// `enum ibv_rate` for a port's width and speed codes (0 when unknown).
/// TEMPORARY: the wire engineer's `wire::rate` replaces this once it lands.
fn ibv_rate(width: u8, speed: u8) -> u8 {
    let lanes: u32 = match width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => return 0,
    };
    // Per-lane rate in units of 0.5 Gb/s, as ibv_rate enumerates it.
    let per_lane_half_gbps: u32 = match speed {
        1 => 5,
        2 => 10,
        4 | 8 => 20,
        16 => 28,
        32 => 50,
        64 => 100,
        128 => 200,
        _ => return 0,
    };
    match lanes * per_lane_half_gbps {
        5 => 2,
        20 => 3,
        60 => 4,
        10 => 5,
        40 => 6,
        80 => 7,
        120 => 8,
        160 => 9,
        240 => 10,
        28 => 11,
        112 => 12,
        224 => 13,
        336 => 14,
        50 => 15,
        200 => 16,
        400 => 17,
        600 => 18,
        56 => 19,
        100 => 20,
        800 => 21,
        1200 => 22,
        _ => 0,
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
        let api = dev.shared.api;
        let mut gid0 = [0u8; 16];
        // SAFETY: `port` is the core's acm_port; acm_get_gid writes one 16-byte GID.
        let rc = unsafe { (api.get_gid)(port, 0, &mut gid0) };
        if rc != 0 {
            api.log(0, "ERROR - open_port: no GID at index 0");
            return -1;
        }
        let (lid, mtu, rate) = query_port(api, port);
        // SAFETY: non-null core port.
        let port_num = unsafe { (*port).port_num };
        let info = Arc::new(PortInfo {
            id: next_id(),
            port,
            port_num,
            gid0,
            lid,
            mtu,
            rate,
        });
        if dev.shared.log_enabled(1) {
            api.log(1, &format!("open_port {port_num}: lid {lid}"));
        }
        let ctx = Box::new(PortCtx {
            shared: dev.shared.clone(),
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
            ctx.shared
                .api
                .log(1, &format!("close_port {}", ctx.info.port_num));
        }
    })
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
        // SAFETY: the core's live acm_endpoint.
        let pkey = unsafe { (*endpoint).pkey };
        let Some(slot) = port.shared.take_ep_slot() else {
            port.shared
                .api
                .log(0, "ERROR - open_endpoint: 256 endpoints already open");
            return -1;
        };
        let ep = Arc::new(Ep::new(
            next_id(),
            slot,
            port.shared.clone(),
            port.info.clone(),
            endpoint,
            pkey,
        ));
        if port.shared.opts.route_preload == RoutePreload::OpensmFullV1 {
            let list = preload_routes(&ep);
            if !list.is_empty() {
                ep.shared.control(Control::Preload(ep.clone(), list));
            }
        }
        let ctx = Box::new(EpCtx { ep });
        // SAFETY: valid out-pointer.
        unsafe { *ep_context = Box::into_raw(ctx) as *mut c_void };
        0
    })
}

/// `route_preload opensm_full_v1`: the local port's section of `route_data_file` (OpenSM's
/// `dump_pr` full format, parsed by `text::dump_pr`) as cache entries that never expire.
///
/// Each path is stored under the keys the common requests normalise to: by DLID and by DGID,
/// with and without the reversible bit (the constraints are empty, so any request with more
/// constraints still goes to the SA).
fn preload_routes(ep: &Ep) -> Vec<crate::state::PreloadedRoute> {
    let api = ep.shared.api;
    let file = ep.shared.opts.route_data_file.as_str();
    if ep.port.lid == 0 {
        api.log(
            0,
            "ERROR - route preload needs the port LID (ibv_query_port unavailable)",
        );
        return Vec::new();
    }
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => {
            api.log(0, &format!("ERROR - route_data_file {file}: {e}"));
            return Vec::new();
        }
    };
    let mut guid = [0u8; 8];
    guid.copy_from_slice(&ep.port.gid0[8..]);
    let local = LocalPort {
        guid: u64::from_be_bytes(guid),
        lid: ep.port.lid,
    };
    let mut table = vec![0u64; 0xc000];
    let report = |e: acm_core_nostd::text::LineError| {
        api.log(
            0,
            &format!("ERROR - {file} line {}: {}", e.line, e.reason()),
        );
    };
    let paths = match LocalPaths::new(&bytes, local, LidTable::Direct(&mut table), report) {
        Ok(p) => p,
        Err(e) => {
            api.log(0, &format!("ERROR - failed to preload EP from {file}: {e}"));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for p in paths {
        let p = match p {
            Ok(p) => p,
            Err(e) => {
                report(e);
                continue;
            }
        };
        let mut dgid = ep.port.gid0;
        dgid[8..].copy_from_slice(&p.guid.to_be_bytes());
        let mut r = [0u8; 64];
        {
            let mut pr = PathRecord::new_unchecked(&mut r[..]);
            pr.set_dgid(Gid(dgid));
            pr.set_sgid(Gid(ep.port.gid0));
            pr.set_dlid(p.dlid);
            pr.set_slid(ep.port.lid);
            pr.set_reversible_numpath(true, 0);
            pr.set_pkey(ep.pkey);
            pr.set_qosclass_sl(0, p.sl);
            // The dump's raw MTU and rate codes, selector bits 0, as ibacmp stores them.
            pr.set_mtu(Selector::from_byte(0), p.mtu);
            pr.set_rate(Selector::from_byte(0), p.rate);
        }
        for rev in [false, true] {
            let mut by_lid = [0u8; 64];
            let mut k = PathRecord::new_unchecked(&mut by_lid[..]);
            k.set_dlid(p.dlid);
            k.set_reversible_numpath(rev, 0);
            out.push((by_lid, r));
            let mut by_gid = [0u8; 64];
            let mut k = PathRecord::new_unchecked(&mut by_gid[..]);
            k.set_dgid(Gid(dgid));
            k.set_reversible_numpath(rev, 0);
            out.push((by_gid, r));
        }
    }
    api.log(
        1,
        &format!("{} routes preloaded from {file}", out.len() / 4),
    );
    out
}

unsafe extern "C" fn close_endpoint(ep_context: *mut c_void) {
    guard("close_endpoint", (), || {
        if ep_context.is_null() {
            return;
        }
        // SAFETY: from Box::into_raw in open_endpoint; closed once.
        let ctx = unsafe { Box::from_raw(ep_context as *mut EpCtx) };
        let ep = ctx.ep;
        {
            // After this the worker can no longer pass the endpoint to the core.
            let mut e = match ep.endpoint.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
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
        lock(&ep.local).clear();
        ep.shared.control(Control::EpClosed(ep.clone()));
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
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
        let ep = unsafe { &*(ep_context as *const EpCtx) }.ep.clone();
        // SAFETY: the core's acm_address, valid for this call only: copy what we need now.
        let (type_, bytes) = unsafe { ((*addr).type_, (*addr).info.bytes) };
        if !(ACM_ADDRESS_NAME..=ACM_ADDRESS_IP6).contains(&type_) {
            ep.shared
                .api
                .log(0, &format!("ERROR - add_address: bad address type {type_}"));
            return -1;
        }
        let local = LocalAddr { type_, addr: bytes };
        lock(&ep.local).push(local);
        let raw = Box::into_raw(Box::new(AddrCtx {
            ep: ep.clone(),
            local,
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
            ep.shared
                .api
                .log(0, "ERROR - remove_address: unknown context");
            return;
        };
        ctxs.swap_remove(pos);
        drop(ctxs);
        // SAFETY: registered, so not yet freed; we just unregistered it.
        let ctx = unsafe { Box::from_raw(addr_context as *mut AddrCtx) };
        let mut local = lock(&ep.local);
        if let Some(i) = local.iter().position(|l| *l == ctx.local) {
            local.swap_remove(i);
        }
    })
}

/// Where a resolve request points, after validation.
enum Target {
    /// A PathRecord to look up / ask the SA for (the client's constraints), NODELAY, the
    /// hosts entry whose expired mapping the worker must renew first, and whether a fresh
    /// hosts mapping gave the destination (ADDR_CACHE is counted if its route then misses).
    Path([u8; 64], bool, Option<u32>, bool),
    /// Answer now with this status.
    Fail(u8),
    /// Answer now with this path (loopback).
    Local([u8; 64]),
}

/// The normalised cache key record and the SA query record for a client record.
///
/// Fields that name this endpoint itself (SLID = port LID, SGID = GID0, P_Key = the endpoint's
/// partition) and NumbPath/Preference/reserved are cleared in the key; every other field the
/// client set stays, so requests with other constraints never share a cached path. The SA
/// record puts the endpoint's SGID (when no source is given) and P_Key back.
pub(crate) fn normalise(ep: &Ep, rec: &[u8; 64]) -> ([u8; 64], [u8; 64]) {
    let mut k = *rec;
    {
        let mut p = PathRecord::new_unchecked(&mut k[..]);
        if ep.port.lid != 0 && p.slid() == ep.port.lid {
            p.set_slid(0);
        }
        if p.sgid().0 == ep.port.gid0 {
            p.set_sgid(Gid([0; 16]));
        }
        if p.pkey() & 0x7fff == ep.pkey & 0x7fff {
            p.set_pkey(0);
        }
        let reversible = p.reversible();
        p.set_reversible_numpath(reversible, 0);
        p.set_preference(0);
        p.clear_reserved();
    }
    let mut q = k;
    {
        let mut p = PathRecord::new_unchecked(&mut q[..]);
        if p.sgid().is_zero() && p.slid() == 0 {
            p.set_sgid(Gid(ep.port.gid0));
        }
        if p.pkey() == 0 {
            p.set_pkey(ep.pkey);
        }
    }
    (k, q)
}

fn loopback_path(ep: &Ep) -> [u8; 64] {
    let mut r = [0u8; 64];
    let mut p = PathRecord::new_unchecked(&mut r[..]);
    p.set_dgid(Gid(ep.port.gid0));
    p.set_sgid(Gid(ep.port.gid0));
    p.set_dlid(ep.port.lid);
    p.set_slid(ep.port.lid);
    p.set_reversible_numpath(true, 0);
    p.set_pkey(ep.pkey);
    // The port's active MTU and rate, no selector bits (as ibacmp's loopback entries).
    p.set_mtu(Selector::from_byte(0), ep.port.mtu);
    p.set_rate(Selector::from_byte(0), ep.port.rate);
    r
}

fn gid_record(gid: &[u8; 16]) -> [u8; 64] {
    let mut r = [0u8; 64];
    let mut p = PathRecord::new_unchecked(&mut r[..]);
    p.set_dgid(Gid(*gid));
    p.set_reversible_numpath(true, 0);
    r
}

fn classify(ep: &Ep, msg: &AcmMsg) -> Target {
    let len = msg.hdr.length as usize;
    if (msg.hdr.opcode & ACM_OP_MASK) != ACM_OP_RESOLVE
        || !(ACM_MSG_HDR_LENGTH + ACM_MSG_EP_LENGTH..=ACM_MSG_HDR_LENGTH + ACM_MSG_DATA_LENGTH)
            .contains(&len)
        || (len - ACM_MSG_HDR_LENGTH) % ACM_MSG_EP_LENGTH != 0
    {
        return Target::Fail(ACM_STATUS_EINVAL);
    }
    let cnt = (len - ACM_MSG_HDR_LENGTH) / ACM_MSG_EP_LENGTH;
    let [src_out, src_index, dst_index] = msg.hdr.data;
    if src_out != 0 && src_index as usize >= cnt {
        return Target::Fail(ACM_STATUS_EINVAL);
    }
    let first = &msg.resolve_data[0];
    if first.type_ == ACM_EP_INFO_PATH {
        // The core does not preprocess `hdr.data` for PATH requests: an echoed source must be
        // a real address entry (never the PATH entry itself, never an unknown type), else the
        // client would get a bogus second "path" or a response libacm rejects (review G6).
        if src_out != 0
            && !msg.resolve_data.get(src_index as usize).is_some_and(|e| {
                matches!(e.type_, ACM_ADDRESS_NAME | ACM_ADDRESS_IP | ACM_ADDRESS_IP6)
            })
        {
            return Target::Fail(ACM_STATUS_EINVAL);
        }
        let rec = first.info.bytes;
        let p = PathRecord::new_unchecked(&rec[..]);
        if p.dlid() == 0 && p.dgid().is_zero() {
            return Target::Fail(ACM_STATUS_EINVAL);
        }
        return Target::Path(rec, first.flags & ACM_FLAGS_NODELAY != 0, None, false);
    }
    if dst_index as usize >= cnt {
        return Target::Fail(ACM_STATUS_EINVAL);
    }
    let dest = &msg.resolve_data[dst_index as usize];
    let nodelay = dest.flags & ACM_FLAGS_NODELAY != 0;
    let bytes = dest.info.bytes;
    match dest.type_ {
        ACM_ADDRESS_NAME | ACM_ADDRESS_IP | ACM_ADDRESS_IP6 => {
            if ep.shared.opts.loopback_prot == LoopbackProt::Local {
                let local = lock(&ep.local);
                if local
                    .iter()
                    .any(|l| l.type_ == dest.type_ && l.addr == bytes)
                {
                    if ep.port.lid != 0 {
                        return Target::Local(loopback_path(ep));
                    }
                    return Target::Path(gid_record(&ep.port.gid0), nodelay, None, false);
                }
            }
            let now = ep.shared.waker.coarse_ms();
            match ep.shared.host_gid(dest.type_, &bytes, now) {
                // ibacmp counts ADDR_CACHE only for a destination whose address is known but
                // whose route is not (ADDR_RESOLVED): resolve_impl counts it on a route miss.
                Some((_, gid, true)) => Target::Path(gid_record(&gid), nodelay, None, true),
                // Expired (addr_timeout): a miss; the worker re-resolves it.
                Some((i, gid, false)) => Target::Path(gid_record(&gid), nodelay, Some(i), false),
                // Unknown destination: the ACM multicast protocol is a later step.
                None => Target::Fail(ACM_STATUS_ENODATA),
            }
        }
        ACM_ADDRESS_GID => {
            let mut gid = [0u8; 16];
            gid.copy_from_slice(&bytes[..16]);
            Target::Path(gid_record(&gid), nodelay, None, false)
        }
        ACM_ADDRESS_LID => {
            let lid = u16::from_be_bytes([bytes[0], bytes[1]]);
            if lid == 0 {
                return Target::Fail(ACM_STATUS_EINVAL);
            }
            let mut r = [0u8; 64];
            let mut p = PathRecord::new_unchecked(&mut r[..]);
            p.set_dlid(lid);
            p.set_reversible_numpath(true, 0);
            Target::Path(r, nodelay, None, false)
        }
        _ => Target::Fail(ACM_STATUS_EINVAL),
    }
}

/// Hands a request to the worker; false if the queue is full.
fn enqueue(
    ep: &Arc<Ep>,
    id: u64,
    msg: &AcmMsg,
    kind: Kind,
    key: RouteKey,
    sa: [u8; 64],
    host: Option<u32>,
) -> bool {
    let req = Request {
        ep: ep.clone(),
        id,
        msg: *msg,
        kind,
        key,
        sa_record: sa,
        host,
        sent: None,
    };
    let ok = ep.shared.requests.push(req).is_ok();
    if ok {
        ep.shared.pushed.fetch_add(1, Ordering::Release);
        ep.shared.waker.wake();
    } else {
        ep.shared.overflows.fetch_add(1, Ordering::Relaxed);
    }
    ok
}

/// `acmrs_sa_inline`: sends a miss's SA query on the calling (core main) thread, as ibacmp
/// does, when the worker is idle (nothing pending, in flight or queued, so there is nothing to
/// coalesce with) and the reserved in-flight slot is free. The request is then handed to the
/// worker only for tracking (timeouts, retries, the cache write); the SA thread answers a
/// success directly (`acmrs_sa_direct`). Returns false (nothing sent, nothing armed) when any
/// condition fails: the caller queues the request as usual. Never waits on a lock another
/// thread may hold across slow work: the endpoint lock is only tried (the worker holds it
/// while sending), and the direct slot's lock is only ever held for a copy.
fn send_inline(ep: &Arc<Ep>, id: u64, msg: &AcmMsg, key: RouteKey, q: [u8; 64]) -> bool {
    let sh = &ep.shared;
    if sh.direct.is_empty()
        || sh.idle_seen.load(Ordering::Acquire) != sh.pushed.load(Ordering::Relaxed)
    {
        return false;
    }
    // Main thread only: never contended.
    let mut keys = sh
        .inline_keys
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut free = None;
    for (i, busy) in sh.inline_busy.iter().enumerate() {
        if busy.load(Ordering::Acquire) {
            if keys[i] == Some(key) {
                // The same route is being resolved inline: the worker coalesces it.
                return false;
            }
        } else if free.is_none() {
            free = Some(i);
        }
    }
    let Some(i) = free else {
        return false;
    };
    let fi = Shared::INLINE_SLOT + i;
    let Some(slot) = sh.direct.get(fi) else {
        return false;
    };
    sh.inline_busy[i].store(true, Ordering::Release);
    keys[i] = Some(key);
    drop(keys);
    let release = || sh.inline_busy[i].store(false, Ordering::Release);
    let guard = match ep.endpoint.try_lock() {
        Ok(g) => g,
        Err(_) => {
            release();
            return false;
        }
    };
    let endpoint = *guard as *const AcmEndpoint;
    if endpoint.is_null() {
        release();
        return false;
    }
    let (token, tid) = engine::next_ids(fi as u32);
    let disarm = || {
        *slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Default::default();
    };
    *slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = crate::state::DirectSlot {
        token,
        tid,
        req: Some(crate::state::DirectReq {
            ep: ep.clone(),
            id,
            msg: *msg,
            kind: Kind::Resolve,
        }),
        claimed: false,
    };
    let api = sh.api;
    // SAFETY: `endpoint` is the core's live acm_endpoint (close_endpoint nulls it under the lock
    // we hold, on this same thread); the context is an integer token.
    let mad = unsafe { (api.alloc_sa_mad)(endpoint, token as usize as *mut c_void, sa_handler) };
    if mad.is_null() {
        disarm();
        release();
        return false;
    }
    // SAFETY: `mad` is a valid acm_sa_mad the core just allocated for us; we own it until
    // acm_send_sa_mad succeeds (then the core owns it until it calls our handler).
    let sent = unsafe {
        crate::path::build_path_get(
            &mut (*mad).sa_mad.bytes,
            tid,
            &q,
            crate::path::comp_mask(&q),
        );
        if (api.send_sa_mad)(mad) != 0 {
            (api.free_sa_mad)(mad);
            false
        } else {
            true
        }
    };
    drop(guard);
    if !sent {
        disarm();
        release();
        return false;
    }
    ep.count_global(cntr::ROUTE_QUERY);
    let req = Request {
        ep: ep.clone(),
        id,
        msg: *msg,
        kind: Kind::Resolve,
        key,
        sa_record: q,
        host: None,
        sent: Some(crate::state::Sent {
            fi: fi as u32,
            token,
            tid,
            at: std::time::Instant::now(),
        }),
    };
    if sh.requests.push(req).is_err() {
        // Cannot happen (the worker was idle: the queue is empty and we are its only producer).
        // Keep exactly-once anyway: answer here unless the SA thread already has.
        let claimed = {
            let mut g = slot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let c = g.claimed;
            *g = Default::default();
            c
        };
        if !claimed {
            ep.count_status(ACM_STATUS_ENOMEM);
            respond::send(api, Via::Resolve, id, msg, ACM_STATUS_ENOMEM, None);
        }
        release();
        return true;
    }
    // No wake-up (the one syscall here is the core's umad send, as in ibacmp): the reply
    // wakes the worker (the SA thread pushes it), and the worker polls at least every
    // max_park anyway for the overdue timer.
    true
}

fn resolve_impl(ctx: &AddrCtx, msg: &AcmMsg, id: u64, answered: &mut bool) -> c_int {
    let ep = &ctx.ep;
    let sh = &ep.shared;
    let api = sh.api;
    ep.count(cntr::RESOLVE);
    let mut reply = |status: u8, rec: Option<&[u8; 64]>| {
        *answered = true;
        ep.count_status(status);
        respond::send(api, Via::Resolve, id, msg, status, rec)
    };
    if ep.closed.load(Ordering::Acquire) {
        return reply(ACM_STATUS_ENODATA, None);
    }
    let (rec, nodelay, host, addr_hit) = match classify(ep, msg) {
        Target::Fail(s) => {
            if s == ACM_STATUS_EINVAL {
                ep.shared.malformed.fetch_add(1, Ordering::Relaxed);
                ep.shared.log_limited(
                    LogReason::Malformed,
                    0,
                    "ERROR - malformed resolve request rejected (EINVAL)",
                );
            }
            return reply(s, None);
        }
        Target::Local(path) => {
            ep.count_global(cntr::ROUTE_CACHE);
            return reply(0, Some(&path));
        }
        Target::Path(rec, nodelay, host, addr_hit) => (rec, nodelay, host, addr_hit),
    };
    let (k, q) = normalise(ep, &rec);
    let key = RouteKey::new(ep, &k);
    // An expired address mapping is a miss even when its route is cached.
    let cached = match host {
        None => sh.lookup(&key, sh.waker.coarse_ms()),
        Some(_) => None,
    };
    match cached {
        Some(Cached::Path(path, refresh)) => {
            ep.count_global(cntr::ROUTE_CACHE);
            let r = reply(0, Some(&path));
            if refresh {
                // Near expiry: the worker re-queries in the background (a full queue only
                // loses the refresh; the entry then expires and is resolved as a miss).
                let _ = enqueue(ep, 0, msg, Kind::Refresh, key, q, None);
            }
            return r;
        }
        Some(Cached::Negative(status)) => {
            if addr_hit {
                ep.count_global(cntr::ADDR_CACHE);
            }
            return reply(status, None);
        }
        None => {}
    }
    // ibacmp's ADDR_RESOLVED state: the address is known, the route is not.
    if addr_hit {
        ep.count_global(cntr::ADDR_CACHE);
    }
    if nodelay {
        let r = reply(ACM_STATUS_ENODATA, None);
        // Prime the cache; a full queue only loses the priming.
        let _ = enqueue(ep, id, msg, Kind::Prime, key, q, host);
        return r;
    }
    if host.is_none() && sh.opts.acmrs_sa_inline && send_inline(ep, id, msg, key, q) {
        *answered = true;
        return 0;
    }
    if enqueue(ep, id, msg, Kind::Resolve, key, q, host) {
        *answered = true;
        return 0;
    }
    ep.shared.overflows.fetch_add(1, Ordering::Relaxed);
    ep.shared.log_limited(
        LogReason::QueueFull,
        0,
        "ERROR - request queue full, answering ENOMEM",
    );
    reply(ACM_STATUS_ENOMEM, None)
}

/// The body of `resolve()` / `query()`: null checks, a copy of the message, `catch_unwind`,
/// and an EINVAL answer (through `via`) if the implementation panicked before answering.
///
/// # Safety
/// `addr_context` must be null or our `AddrCtx`, `msg` null or a full `acm_msg` buffer.
unsafe fn client_call(
    what: &str,
    addr_context: *mut c_void,
    msg: *mut AcmMsg,
    id: u64,
    imp: fn(&AddrCtx, &AcmMsg, u64, &mut bool) -> c_int,
    via: Via,
) -> c_int {
    if addr_context.is_null() || msg.is_null() {
        core_api::log(0, &format!("ERROR - {what}: null argument"));
        return -1;
    }
    // SAFETY: the core passes a full acm_msg buffer (592 bytes) valid for this call.
    let copy = unsafe { *msg };
    // SAFETY: our AddrCtx, alive until remove_address / close_endpoint.
    let ctx = unsafe { &*(addr_context as *const AddrCtx) };
    let mut answered = false;
    let answered_ref = &mut answered;
    match catch_unwind(AssertUnwindSafe(|| imp(ctx, &copy, id, answered_ref))) {
        Ok(r) => r,
        Err(_) => {
            core_api::log(0, &format!("ERROR - internal error (panic) in {what}"));
            if !answered {
                let api = ctx.ep.shared.api;
                let _ = catch_unwind(AssertUnwindSafe(|| {
                    respond::send(api, via, id, &copy, ACM_STATUS_EINVAL, None)
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

fn query_impl(ctx: &AddrCtx, msg: &AcmMsg, id: u64, answered: &mut bool) -> c_int {
    let ep = &ctx.ep;
    let api = ep.shared.api;
    let mut reply = |status: u8| {
        *answered = true;
        ep.count_status(status);
        respond::send(api, Via::Query, id, msg, status, None)
    };
    let first = &msg.resolve_data[0];
    if msg.hdr.length as usize != ACM_MSG_HDR_LENGTH + ACM_MSG_EP_LENGTH
        || first.type_ != ACM_EP_INFO_PATH
    {
        ep.shared.malformed.fetch_add(1, Ordering::Relaxed);
        ep.shared.log_limited(
            LogReason::Malformed,
            0,
            "ERROR - malformed SA query rejected (EINVAL)",
        );
        return reply(ACM_STATUS_EINVAL);
    }
    if ep.closed.load(Ordering::Acquire) {
        return reply(ACM_STATUS_ENODATA);
    }
    let rec = first.info.bytes;
    let key = RouteKey::new(ep, &rec);
    if enqueue(ep, id, msg, Kind::Query, key, rec, None) {
        *answered = true;
        return 0;
    }
    ep.shared.overflows.fetch_add(1, Ordering::Relaxed);
    ep.shared.log_limited(
        LogReason::QueueFull,
        0,
        "ERROR - request queue full, answering ENOMEM",
    );
    reply(ACM_STATUS_ENOMEM)
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
            // From now on no request sees a route learned before the SM change.
            port.shared.flush_gen.fetch_add(1, Ordering::AcqRel);
            port.shared
                .api
                .log(1, "client reregister: flushing learned routes");
            port.shared.control(Control::Reregister(port.info.id));
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
        for (i, c) in ep.counters.iter().enumerate() {
            // SAFETY: the core's buffer holds 72 u64 (acm_msg data); we write 7.
            unsafe {
                values
                    .add(i)
                    .write_unaligned(c.load(Ordering::Relaxed).to_be())
            };
        }
        // SAFETY: valid out-pointer.
        unsafe { *cnt = cntr::MAX as u8 };
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
