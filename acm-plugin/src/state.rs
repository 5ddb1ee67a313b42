//! Provider objects shared between the ibacm main thread, the core's SA thread and the worker.
//!
//! * [`Shared`]: one per provider instance (created at the first `open_device`, torn down after
//!   the last `close_device`): options, the route table, the bounded queues into the worker.
//! * [`PortInfo`], [`Ep`]: copies of what the core told us, plus per-endpoint counters.
//!
//! Ownership rule: only the worker writes the route table; the main thread reads it lock-free.

use crate::core_api::CoreApi;
use crate::ffi::{cntr, AcmEndpoint, AcmMsg, AcmPort};
use acm_core_nostd::text::opts::ProviderOptions;
use acm_dataplane::route_table::{RouteKey, RouteTable};
use acm_dataplane::worker::Waker;
use crossbeam_queue::ArrayQueue;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What kind of client call a queued request came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `resolve()`: answer with `acm_resolve_response`.
    Resolve,
    /// `query()` (ACM_FLAGS_QUERY_SA): answer with `acm_query_response`, never cached.
    Query,
    /// A NODELAY miss already answered ENODATA: resolve only to prime the cache.
    Prime,
}

/// A request handed from `resolve()`/`query()` to the worker (a full copy: the core's buffer
/// dies when the call returns).
pub struct Request {
    /// Endpoint it arrived on.
    pub ep: Arc<Ep>,
    /// Core client index (0 = kernel).
    pub id: u64,
    /// Copy of the client message.
    pub msg: AcmMsg,
    /// Call kind.
    pub kind: Kind,
    /// Cache key (unused for [`Kind::Query`]).
    pub key: RouteKey,
    /// The PathRecord to send to the SA.
    pub sa_record: [u8; 64],
}

/// An SA completion copied out of the core's MAD on the SA thread.
pub struct SaReply {
    /// The context token given to `acm_alloc_sa_mad`.
    pub token: u64,
    /// `ib_user_mad.status` (nonzero = timeout / send failure).
    pub umad_status: u32,
    /// The 256-byte MAD.
    pub mad: [u8; 256],
}

/// Rare control messages from the main thread.
pub enum Control {
    /// The endpoint was closed: answer its requests, drop its routes.
    EpClosed(Arc<Ep>),
    /// CLIENT_REREGISTER on a port: drop learned routes of its endpoints (preloads stay).
    Reregister(u64),
    /// Preloaded routes for an endpoint (inserted by the worker, the only table writer).
    Preload(u64, Vec<(RouteKey, [u8; 64])>),
    /// Answer everything and stop.
    Shutdown,
}

/// One address-preload entry: ((ACM address type, zero-padded address), GID).
pub type HostEntry = ((u16, [u8; 64]), [u8; 16]);

/// One provider instance.
pub struct Shared {
    /// Core helpers.
    pub api: &'static CoreApi,
    /// Options from `acm_get_opts_file()`.
    pub opts: ProviderOptions,
    /// PathRecord cache (worker writes, main thread reads).
    pub routes: RouteTable,
    /// main → worker requests.
    pub requests: ArrayQueue<Request>,
    /// SA thread → worker replies.
    pub replies: ArrayQueue<SaReply>,
    /// Rare control messages.
    pub control: Mutex<Vec<Control>>,
    /// Wakes the worker; also the coarse clock.
    pub waker: Waker,
    /// Address preload (`acm_hosts`): sorted (type, address) → GID. Immutable after open.
    pub hosts: Vec<HostEntry>,
    /// Requests refused because a queue was full.
    pub overflows: AtomicU64,
    /// SA replies dropped because the reply queue was full.
    pub reply_drops: AtomicU64,
}

impl Shared {
    /// Queues a control message and wakes the worker.
    pub fn control(&self, c: Control) {
        match self.control.lock() {
            Ok(mut v) => v.push(c),
            Err(poisoned) => poisoned.into_inner().push(c),
        }
        self.waker.wake();
    }

    /// Logs if the level is enabled (avoids formatting otherwise).
    pub fn log_enabled(&self, level: u8) -> bool {
        level <= self.opts.effective_log_level()
    }

    /// Looks an address up in the hosts preload.
    pub fn host_gid(&self, type_: u16, addr: &[u8; 64]) -> Option<[u8; 16]> {
        self.hosts
            .binary_search_by(|(k, _)| k.cmp(&(type_, *addr)))
            .ok()
            .map(|i| self.hosts[i].1)
    }
}

/// What we learned about a port at `open_port`.
pub struct PortInfo {
    /// Unique id of this open (a reopen gets a new one).
    pub id: u64,
    /// The core's port (stable for the life of the process).
    pub port: *const AcmPort,
    /// Port number.
    pub port_num: u8,
    /// GID index 0.
    pub gid0: [u8; 16],
    /// Base LID (0 if unknown).
    pub lid: u16,
    /// Active MTU enum (ibv_mtu).
    pub mtu: u8,
    /// Rate enum (ibv_rate), 0 if unknown.
    pub rate: u8,
}

// SAFETY: `port` points to the core's acm_port, which lives for the whole process and is only
// read through core helpers that accept concurrent use.
unsafe impl Send for PortInfo {}
// SAFETY: as above; every other field is plain data.
unsafe impl Sync for PortInfo {}

/// A local address of an endpoint (for loopback).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LocalAddr {
    /// ACM address type.
    pub type_: u16,
    /// Zero-padded address.
    pub addr: [u8; 64],
}

/// One endpoint (port, partition).
pub struct Ep {
    /// Unique id (never reused), part of every cache key of this endpoint.
    pub id: u64,
    /// The instance.
    pub shared: Arc<Shared>,
    /// The port.
    pub port: Arc<PortInfo>,
    /// P_Key as the core gave it.
    pub pkey: u16,
    /// The core's `acm_endpoint*`; null once closed. Held while the worker uses it, so
    /// `close_endpoint` cannot return while an `acm_alloc_sa_mad` on it is in progress.
    pub endpoint: Mutex<usize>,
    /// Set by `close_endpoint`.
    pub closed: AtomicBool,
    /// `ACM_CNTR_*` counters of this endpoint.
    pub counters: [AtomicU64; cntr::MAX],
    /// Local addresses (main thread only; the lock is never contended).
    pub local: Mutex<Vec<LocalAddr>>,
    /// Address contexts handed to the core, freed at close if the core leaked them.
    pub addr_ctxs: Mutex<Vec<usize>>,
}

impl Ep {
    /// Creates an endpoint record.
    pub fn new(
        id: u64,
        shared: Arc<Shared>,
        port: Arc<PortInfo>,
        endpoint: *const AcmEndpoint,
        pkey: u16,
    ) -> Self {
        Ep {
            id,
            shared,
            port,
            pkey,
            endpoint: Mutex::new(endpoint as usize),
            closed: AtomicBool::new(false),
            counters: Default::default(),
            local: Mutex::new(Vec::new()),
            addr_ctxs: Mutex::new(Vec::new()),
        }
    }

    /// Bumps a per-endpoint counter.
    pub fn count(&self, which: usize) {
        self.counters[which].fetch_add(1, Ordering::Relaxed);
    }

    /// Bumps a per-endpoint counter and the core's global one.
    pub fn count_global(&self, which: usize) {
        self.count(which);
        self.shared.api.count(which);
    }

    /// Counts the status of a resolve answer (ERROR / NODATA), as ibacmp does per endpoint.
    pub fn count_status(&self, status: u8) {
        match status {
            0 => {}
            crate::ffi::ACM_STATUS_ENODATA => self.count(cntr::NODATA),
            _ => self.count(cntr::ERROR),
        }
    }
}
