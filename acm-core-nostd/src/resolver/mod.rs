//! The resolver: every decision acmrs makes, as a sans-IO state machine.
//!
//! Modelled on quinn-proto's `Connection`: the resolver never performs IO, never reads a clock
//! and never allocates. Its caller (the dataplane loop on a host, a firmware main loop, a
//! simulation) feeds it **inputs** as method calls with the time passed in, and drains its
//! **outputs** by polling:
//!
//! ```text
//!  inputs                                     outputs (poll_output)
//!  open_endpoint / close_endpoint    ──┐   ┌──▶ Output::SendSa    (PathRecord GET, MCMember SET/DELETE)
//!  add_address / remove_address        │   ├──▶ Output::SendAcm   (class 0x2C over the endpoint's UD QP)
//!  preload_address / preload_route     │   ├──▶ Output::Answer    (a client's response, exactly once)
//!  reregister                          ├─▶ ├──▶ Output::Attach / Output::Detach (multicast group)
//!  request / request_classified        │   └──▶ Output::Count     (an ACM_CNTR_* event)
//!               (client, 592 B msg)    │
//!  handle_sa     (SA reply or error)   │
//!  handle_sa_table (GetTable answer)   │
//!  handle_report (SA Report: trap 64/65)│
//!  handle_acm    (received 0x2C MAD)   │
//!  handle_timeout(now)                 │      poll_timeout() → when to call handle_timeout
//!  shutdown                          ──┘
//! ```
//!
//! Those are every input there is; the owner also has `clear_cache`, `into_writer` (the cache's
//! writer back, ending the resolver), `stats`, `is_idle` and, with `sim`, `check_invariants`.
//!
//! Storage (request slots, route jobs, in-flight queries, address entries, endpoints) comes
//! from the caller as slices in a [`Storage`], like [`crate::cache::PathCache`]. The path cache
//! is shared with lock-free readers (the provider's inline hit path), who read it through their
//! own handle; its one writer, a [`CacheWriter`] over a handle `C` to the cache (an `Arc` on a
//! host, a `&'static` or a borrow in firmware), is taken once by the resolver's owner and given
//! to [`Resolver::new`]: the resolver owns it for its whole life, so no input takes a cache
//! argument, no write can be skipped for want of the writer, and no one else can write
//! meanwhile ([`PathCache::writer`] is an `Err` while a resolver lives). Its own lookups read
//! through it ([`Resolver::cache`]).
//!
//! Time is one monotonic clock in milliseconds ([`Millis`]), the same ticks the cache uses.
//!
//! Exactly-once: every [`Resolver::request`] of kind [`Kind::Resolve`] or [`Kind::Query`] leads
//! to exactly one [`Output::Answer`] carrying its `client` and the request's `tid`, on every
//! path (hit, miss, SA error, timeout, endpoint close, reregister, shutdown, full tables).

mod acm;
mod addr;
mod answers;
mod endpoints;
pub mod front;
mod groups;
use groups::Set;
mod inform;
mod mads;
mod output;
pub mod request;
mod route;
mod sa_window;
mod storage;
pub mod table;
mod timers;

#[cfg(feature = "std")]
pub use storage::HeapStorage;
pub use storage::{
    AddrEntry, ArrayStorage, Capacities, EpSlot, JobSlot, PreloadSlot, RequestSlot, Storage,
};

use crate::cache::{ep_number, AddrKind, CacheRef, CacheWriter, Lookup, PathCache};
use crate::text::opts::{AddrProt, LoopbackProt, ProviderOptions, RouteProt, SaTransport};
use crate::wire::acm_mad::AddressType;
use crate::wire::client::Status;
use crate::wire::gid::Gid;
use crate::wire::mad::MAD_LEN;
use crate::wire::rate::{Mtu, Rate};
use storage::{list_id, AddrState, GroupState, JobState, List, Table, ADDR_Q};
use timers::Timer;

/// Milliseconds on the caller's monotonic clock.
pub type Millis = u64;

/// Most endpoints one resolver serves (the cache's endpoint slots).
pub const MAX_EPS: usize = 256;

/// Largest client message (`sizeof(struct acm_msg)`).
pub const MSG_LEN: usize = crate::wire::client::MSG_LEN;

/// An endpoint: the caller's cache endpoint slot (0..[`MAX_EPS`]), unique among open endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EpId(pub u8);

/// What the resolver needs to know about an endpoint (one port, one partition).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpConfig {
    /// Port GID at index 0 (the source GID of everything this endpoint sends).
    pub port_gid: Gid,
    /// Port base LID.
    pub lid: u16,
    /// P_Key as the core gave it (full-membership bit included).
    pub pkey: u16,
    /// Active MTU (`enum ibv_mtu`).
    pub mtu: u8,
    /// Active rate (`enum ibv_rate`), 0 if unknown.
    pub rate: u8,
    /// The port's subnet timeout in ms, as ibacmp derives it (`1 << (SubnetTimeOut - 8)`).
    pub subnet_timeout_ms: u64,
    /// The endpoint's own UD QP number (the source QPN of its ACM MADs). 0 = the endpoint has
    /// no UD QP: it joins no group and speaks no ACM protocol (names and IPs resolve from the
    /// hosts preload and local addresses only, as with `addr_prot none`; routes via the SA).
    pub qpn: u32,
    /// The UD QP is on the port's SA P_Key (the default partition's key, as the core picks
    /// its own): the port's SA MADs leave on it and its Reports arrive on it, so only such an
    /// endpoint subscribes to Reports (`Config::sa_reports`). The SM's port is in the default
    /// partition only: a MAD of another partition never reaches it.
    pub sa_pkey: bool,
}

/// How a client is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `acm_resolve_response`.
    Resolve,
    /// `acm_query_response` (`ACM_FLAGS_QUERY_SA`).
    Query,
}

/// What kind of client call a request came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `resolve()`: answered with [`Via::Resolve`].
    Resolve,
    /// `query()`: a pass-through SA PathRecord GET, never cached, answered with [`Via::Query`].
    Query,
    /// A NODELAY miss the caller already answered ENODATA: resolve only to prime the cache.
    /// Never answered.
    Prime,
    /// A cache hit near expiry that the caller already answered: re-resolve and update the
    /// entry in place. Never answered.
    Refresh,
}

/// The `ACM_CNTR_*` counters (the index into `query_perf`'s array).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Counter {
    /// Answers with an error status other than ENODATA.
    Error = 0,
    /// `resolve()` calls.
    Resolve = 1,
    /// Answers with ENODATA.
    NoData = 2,
    /// ACM multicast address queries sent.
    AddrQuery = 3,
    /// Requests whose address was known but whose route was not.
    AddrCache = 4,
    /// SA PathRecord queries sent (query() included).
    RouteQuery = 5,
    /// Requests answered from the route cache.
    RouteCache = 6,
}

/// A multicast group the endpoint joined (from the SA's MCMemberRecord answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct McGroup {
    /// Group index (0 = the base group every node joins; 1 = the port's own rate/MTU).
    pub index: u8,
    /// The MGID.
    pub mgid: Gid,
    /// The MLID the SA assigned.
    pub mlid: u16,
    /// Service level.
    pub sl: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub tclass: u8,
    /// Static rate (`enum ibv_rate`, selector bits stripped).
    pub rate: u8,
    /// MTU (`enum ibv_mtu`, selector bits stripped).
    pub mtu: u8,
    /// P_Key of the group.
    pub pkey: u16,
    /// Q_Key of the group.
    pub qkey: u32,
}

/// An address vector for a unicast ACM MAD (a response to a peer's query).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnicastAv {
    /// Destination LID (the requester's `wc.slid`).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits (the request's `wc.dlid_path_bits`).
    pub src_path_bits: u8,
    /// Static rate (`enum ibv_rate`).
    pub static_rate: u8,
    /// GRH destination GID (the request's GRH source GID).
    pub dgid: Gid,
    /// GRH flow label.
    pub flow_label: u32,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// GRH traffic class.
    pub tclass: u8,
    /// Destination QP (the request's `wc.src_qp`).
    pub remote_qpn: u32,
    /// Q_Key to send with (`ACM_QKEY`).
    pub remote_qkey: u32,
}

/// Where an ACM MAD goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcmDest {
    /// Multicast on the endpoint's attached group with this index (QPN 0xFFFFFF, `ACM_QKEY`).
    Group(u8),
    /// Unicast to a peer.
    Unicast(UnicastAv),
}

/// What the receive completion of an ACM MAD said about its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvMeta {
    /// `wc.slid`.
    pub slid: u16,
    /// `wc.src_qp`.
    pub src_qp: u32,
    /// `wc.sl`.
    pub sl: u8,
    /// `wc.dlid_path_bits`.
    pub dlid_path_bits: u8,
    /// `wc.pkey_index`.
    pub pkey_index: u16,
    /// The endpoint's own P_Key index (a MAD that arrived on another is dropped).
    pub ep_pkey_index: u16,
    /// The source GID of the GRH (`None` when the completion had no `IBV_WC_GRH`).
    pub grh_sgid: Option<Gid>,
}

/// A whole SA GetTable answer (reassembled from its RMPP segments by
/// [`SaChannel`](crate::sa_channel::SaChannel)).
#[derive(Clone, Copy, Debug)]
pub struct SaTable<'a> {
    /// The first segment's MAD, RMPP and SA headers (status, AttributeOffset).
    pub header: &'a [u8; crate::wire::sa::DATA_OFFSET],
    /// The records back to back, each `8 × AttributeOffset` bytes.
    pub records: &'a [u8],
}

/// A client's answer: `len` bytes of `msg`, for `client` on endpoint `ep`, through `via`.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    /// Endpoint of the request.
    pub ep: EpId,
    /// The core's client index the request came with.
    pub client: u64,
    /// Which core helper sends it.
    pub via: Via,
    /// The ACM status in the answer (also in `msg`).
    pub status: Status,
    /// Valid length of `msg`.
    pub len: u16,
    /// The response message (built with `wire::client`).
    pub msg: [u8; MSG_LEN],
}

/// One thing for the caller to do.
// Every variant carries its MAD or message by value: no allocator, and the caller moves it out.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug)]
pub enum Output {
    /// Send this SA MAD (class 3) for endpoint `ep`; report its completion, reply or failure
    /// with [`Resolver::handle_sa`] and the same `token`.
    SendSa {
        /// Endpoint whose port the query goes out on.
        ep: EpId,
        /// Opaque; give it back to `handle_sa`.
        token: u64,
        /// The MAD (its TID's low 32 bits are unique among the resolver's queries).
        mad: [u8; MAD_LEN],
    },
    /// Send this ACM MAD (class 0x2C) on endpoint `ep`'s UD QP. Fire and forget: losses are
    /// the resolver's business (retries on its timers).
    SendAcm {
        /// Endpoint.
        ep: EpId,
        /// Destination.
        to: AcmDest,
        /// The MAD.
        mad: [u8; MAD_LEN],
    },
    /// Answer a client (exactly once per answered request).
    Answer(Answer),
    /// Attach endpoint `ep`'s QP to this group and make an address handle for it.
    Attach {
        /// Endpoint.
        ep: EpId,
        /// The group.
        group: McGroup,
    },
    /// Detach endpoint `ep`'s QP from this group and drop its address handle.
    Detach {
        /// Endpoint.
        ep: EpId,
        /// The group.
        group: McGroup,
    },
    /// Bump counter `counter` of endpoint `ep` (and the core's global one where ibacm has it).
    Count {
        /// Endpoint.
        ep: EpId,
        /// Which counter.
        counter: Counter,
    },
}

/// Why a resolver input was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The storage given to [`Resolver::new`] is empty or inconsistent.
    Storage,
    /// The endpoint is not open (or already open for `open_endpoint`, or the resolver was
    /// shut down).
    Endpoint,
    /// A table is full: no endpoint slot (`open_endpoint`), no address entry (`add_address`,
    /// `preload_address`).
    Capacity,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Error::Storage => "resolver storage is empty or inconsistent",
            Error::Endpoint => "endpoint not open (or already open)",
            Error::Capacity => "resolver table full",
        })
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Error {}

/// Counters of what the resolver dropped or refused, for logs and `query_perf`-like exports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Received ACM MADs dropped: wrong length/base/class/version/method/control, address
    /// types out of range, `gid_cnt` > 6, a response with a status or without a GID.
    pub acm_malformed: u64,
    /// ACM responses whose TID matches no outstanding query.
    pub acm_unknown_tid: u64,
    /// ACM MADs nobody can use: for an endpoint that is not open, or a response naming a
    /// multicast group we did not join.
    pub acm_unsolicited: u64,
    /// ACM MADs from an unexpected P_Key (index) or without a GRH.
    pub acm_wrong_key: u64,
    /// SA replies whose token/TID matches nothing in flight.
    pub sa_unknown: u64,
    /// Requests refused because a table was full (answered ENOMEM).
    pub full: u64,
    /// Malformed client requests (answered EINVAL).
    pub malformed: u64,
    /// Queries answered ETIMEDOUT.
    pub timeouts: u64,
    /// Peer requests dropped because we share no multicast group with the requester.
    pub acm_no_group: u64,
    /// Peer requests for an address of another of our endpoints (another partition of the
    /// port): never answered on this one.
    pub acm_other_partition: u64,
    /// SA BUSY answers (each halves the SA window and holds it; the query goes again after a
    /// backoff).
    pub sa_busy: u64,
    /// SA PathRecord queries that got no answer to any try (each halves the SA window; the
    /// query goes again after a jittered backoff while its retries and deadline allow).
    pub sa_lost: u64,
    /// SA Reports received (each acknowledged).
    pub reports: u64,
    /// SA MADs on the UD QP that are neither a known reply nor a valid Report, and
    /// InformInfo replies that refused a subscription.
    pub report_malformed: u64,
    /// Cache entries removed because a Report said their destination left or entered
    /// service.
    pub report_invalidated: u64,
    /// Half-world PathRecord tables received ([`table`]).
    pub sa_tables: u64,
    /// Records they brought into the cache.
    pub sa_table_records: u64,
    /// Tables asked for that brought nothing (lost, too big, refused).
    pub sa_table_failed: u64,
    /// Answers that found no request slot at all (only possible if the caller feeds more than
    /// `answer_reserve` requests without draining [`Resolver::poll_output`]; see its docs).
    pub lost: u64,
}

/// The resolver's settings (from `ibacm_opts.cfg`, see [`Config::from_options`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// `addr_prot`: resolve names/IPs by the ACM multicast protocol (`acm`), or only from the
    /// hosts preload and local addresses (`none`).
    pub addr_acm: bool,
    /// `route_prot acm`: build the path from the address response and the group instead of an
    /// SA PathRecord query.
    pub route_acm: bool,
    /// `loopback_prot local`: the endpoint's own addresses answer a loopback path at once.
    pub loopback_local: bool,
    /// Address mapping lifetime (`addr_timeout`), `None` = never expires.
    pub addr_ttl: Option<Millis>,
    /// Route lifetime (`route_timeout` / `acmrs_route_ttl_ms`), `None` = never expires.
    pub route_ttl: Option<Millis>,
    /// How long an SA "no record" answer is remembered (`acmrs_negative_ttl_ms`, 0 = not).
    pub negative_ttl: Millis,
    /// Per-try wait for an ACM response, before the port's subnet timeout is added (`timeout`).
    pub acm_timeout: Millis,
    /// ACM request retries (`retries`; tries = retries + 1).
    pub acm_retries: u32,
    /// ACM multicast queries in flight per endpoint: `max(acmrs_acm_window, resolve_depth)`
    /// (default 16; ibacmp's `resolve_depth` credits make it 1 there).
    pub acm_window: u32,
    /// SA queries in flight per resolver (the rest wait FIFO).
    pub sa_window: u32,
    /// The SA window a resolver starts with (`acmrs_sa_window_start`, default 1): it grows by
    /// one query per answer while round trips stay low (slow start), up to `sa_window`, so a
    /// whole cluster starting at once does not put `sa_window` queries per node into a slow
    /// SA's queue before any answer says how fast it is.
    pub sa_window_start: u32,
    /// SA BUSY retries (`acmrs_sa_retries`).
    pub sa_busy_retries: u32,
    /// First BUSY backoff, doubled per retry (`acmrs_sa_busy_backoff_ms`).
    pub sa_busy_backoff: Millis,
    /// An SA query with no reply after this long is answered ETIMEDOUT (plus `sa_tries` ×
    /// the port's subnet timeout).
    pub sa_deadline: Millis,
    /// Tries of one SA MAD by the caller's transport, when each try also waits the port's
    /// subnet timeout (the `ud` transport); 0 when the transport's budget is fixed (the core).
    pub sa_tries: u32,
    /// Subscribe to SA Reports (traps 64/65) on every endpoint with a UD QP and invalidate
    /// what they name (the `ud` transport: Reports arrive on the endpoint's QP).
    pub sa_reports: bool,
    /// `min_mtu` as `enum ibv_mtu` (base group).
    pub min_mtu: u8,
    /// `min_rate` as `enum ibv_rate` (base group).
    pub min_rate: u8,
    /// How long a request may wait in a queue (the SA backlog, the ACM window queue, an
    /// endpoint not joined yet) before it is answered (ETIMEDOUT; ENODATA while the endpoint
    /// has not joined its group): `sa_deadline × (retries + 1)`.
    pub queue_deadline: Millis,
    /// The caller's SA transport reassembles RMPP answers and takes
    /// [`Resolver::handle_sa_table`] (the `ud` transport's
    /// [`SaChannel`](crate::sa_channel::SaChannel) does; the core's service does not).
    pub sa_tables: bool,
    /// A port's backlog of route queries at which it asks for its half-world table instead
    /// (`acmrs_sa_table_min`; 0 = never). See [`table`].
    pub sa_table_min: u32,
    /// The SA's cost of one PathRecord Get, in ns: the table rule weighs it against
    /// [`sa_record_cost_ns`](Self::sa_record_cost_ns).
    pub sa_get_cost_ns: u32,
    /// The SA's cost of each further record of a half-world table, in ns.
    pub sa_record_cost_ns: u32,
    /// The most records of a table the caller takes ([`table::room_for`] of the path
    /// capacity): a table seen to be larger (by the highest LID) is not asked for.
    pub sa_table_room: u32,
    /// Warm start (`acmrs_route_prefetch`, 0 = off): an endpoint that opens asks for its
    /// port's half-world table at a random time within this many ms (so a whole cluster
    /// booting at once does not ask at once). See [`table`].
    pub route_prefetch: Millis,
}

impl Config {
    /// The settings an `ibacm_opts.cfg` gives (ibacmp's option names plus the `acmrs_*` ones).
    pub fn from_options(o: &ProviderOptions) -> Config {
        let sa_deadline = if o.acmrs_sa_timeout_ms > 0 {
            u64::from(o.acmrs_sa_timeout_ms)
        } else {
            // The core's whole budget for one MAD (timeout × tries) plus a margin.
            u64::from(o.timeout) * (u64::from(o.retries) + 1) + 1000
        };
        let ud = o.acmrs_sa_transport == SaTransport::Ud;
        let min_mtu = Mtu::from_bytes(u32::from(o.min_mtu)).unwrap_or(Mtu::Mtu2048);
        let min_rate = Rate::from_gbps(u32::from(o.min_rate)).unwrap_or(Rate::Gbps10);
        Config {
            addr_acm: o.addr_prot == AddrProt::Acm,
            route_acm: o.route_prot == RouteProt::Acm,
            loopback_local: o.loopback_prot == LoopbackProt::Local,
            addr_ttl: o.addr_timeout.as_millis(),
            route_ttl: o.route_ttl_ms(),
            negative_ttl: u64::from(o.acmrs_negative_ttl_ms),
            acm_timeout: u64::from(o.timeout),
            acm_retries: o.retries,
            // ibacmp's `resolve_depth` (its multicast credits) is honoured as a floor: a site
            // that raised it keeps at least that many queries in flight.
            acm_window: o.acmrs_acm_window.max(o.resolve_depth).max(1),
            // Over the core's service only `sa_depth` are sent at once: the rest wait here,
            // with a deadline, not in the core's queue, which has none.
            sa_window: if ud { o.acmrs_sa_window } else { o.sa_depth }.max(1),
            sa_window_start: o.acmrs_sa_window_start.max(1),
            sa_busy_retries: o.acmrs_sa_retries,
            sa_busy_backoff: u64::from(o.acmrs_sa_busy_backoff_ms),
            sa_deadline,
            sa_tries: if ud { o.retries.saturating_add(1) } else { 0 },
            sa_reports: ud,
            min_mtu: min_mtu.into(),
            min_rate: min_rate.into(),
            queue_deadline: sa_deadline.saturating_mul(u64::from(o.retries) + 1),
            sa_tables: ud,
            sa_table_min: o.acmrs_sa_table_min,
            sa_get_cost_ns: table::OPENSM_GET_NS,
            sa_record_cost_ns: table::OPENSM_RECORD_NS,
            sa_table_room: table::room_for(o.acmrs_path_capacity),
            route_prefetch: u64::from(o.acmrs_route_prefetch),
        }
    }
}

impl Default for Config {
    /// [`Config::from_options`] of the default options.
    fn default() -> Self {
        Config::from_options(&ProviderOptions::default())
    }
}

/// Route lifetime meaning "never expires".
const NEVER: Millis = u64::MAX;

/// One step of the crate's PRNG ([`crate::rng::Rng`]) over `x`.
pub(crate) fn splitmix64(x: &mut u64) -> u64 {
    let mut r = crate::rng::Rng(*x);
    let v = r.next_u64();
    *x = r.0;
    v
}

/// The resolver (see the [module docs](self)).
///
/// **Draining rule.** After every input call, call [`poll_output`](Self::poll_output) until it
/// returns `None`. Every output is derived from state the resolver holds anyway (request slots
/// on an answer FIFO, route jobs on a send FIFO, address entries with send flags, per-endpoint
/// flags and counters), so nothing is ever dropped while outputs wait; the one exception is an
/// immediate answer (hit, error, ENOMEM) arriving when every request slot is taken, which is
/// impossible under this rule as long as `answer_reserve ≥ 1` ([`Stats::lost`] counts it).
pub struct Resolver<S: Storage, C: CacheRef> {
    /// The path cache's one writer, owned for the resolver's whole life: every cache write
    /// the resolver makes goes through it, and its own lookups read through it.
    w: CacheWriter<C>,
    st: S,
    cfg: Config,
    tid: u32,
    /// Client requests: free slots, the answer FIFO ([`answers`]).
    answers: answers::Answers,
    /// Route jobs and the SA window ([`route`], [`sa_window`]).
    routes: route::Routes,
    /// The address table and its ACM send and removal lists ([`addr`], [`acm`]).
    addrs: addr::AddrTable,
    /// Which slot serves which endpoint, and which have outputs to poll ([`endpoints`]).
    eps: endpoints::Endpoints,
    /// Every timer, one entry per kind ([`timers`]).
    timers: timers::TimerTable,
    stats: Stats,
    done: bool,
}

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// A resolver over `storage` (every slot is reset) that writes the path cache through
    /// `writer`, the cache's one writer ([`CacheWriter::take`], taken once by the resolver's
    /// owner), for as long as it lives. `seed` picks the hash seed and the first TID (use a
    /// random one on hosts). Fails with [`Error::Storage`] if a table is empty or there are
    /// fewer request slots than `answer_reserve + 1`.
    pub fn new(
        config: Config,
        mut storage: S,
        writer: CacheWriter<C>,
        seed: u64,
    ) -> Result<Self, Error> {
        let reserve = storage.answer_reserve();
        let bad = storage.requests().len() <= reserve
            || storage.requests().len() >= u32::MAX as usize
            || storage.jobs().is_empty()
            || storage.jobs().len() > 0x00ff_ffff
            || storage.job_buckets().is_empty()
            || storage.addrs().is_empty()
            || storage.addrs().len() >= u32::MAX as usize
            || storage.addr_buckets().is_empty()
            || storage.endpoints().is_empty()
            || storage.sa_inflight() == 0;
        if bad {
            return Err(Error::Storage);
        }
        let mut s = seed;
        let seed = splitmix64(&mut s);
        let tid = splitmix64(&mut s) as u32;
        let t = storage.tables();
        t.requests.fill(RequestSlot::EMPTY);
        t.jobs.fill(JobSlot::EMPTY);
        t.job_buckets.fill(0);
        t.addrs.fill(AddrEntry::EMPTY);
        t.addr_buckets.fill(0);
        t.endpoints.fill(EpSlot::EMPTY);
        t.preloads.fill(PreloadSlot::EMPTY);
        let r = Resolver {
            w: writer,
            cfg: config,
            tid,
            answers: answers::Answers::new(t.requests, reserve),
            routes: route::Routes::new(t.jobs, seed, &config),
            addrs: addr::AddrTable::new(t.addrs, seed),
            eps: endpoints::Endpoints::new(),
            timers: timers::TimerTable::new(),
            stats: Stats::default(),
            done: false,
            st: storage,
        };
        Ok(r)
    }

    /// The settings in use.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The path cache the resolver writes (read it here; readers on other threads read it
    /// through their own handle).
    #[inline]
    pub fn cache(&self) -> &PathCache<C::Paths, C::Addrs> {
        self.w.cache()
    }

    /// Empties the path cache, every endpoint's entries (the dataplane does it at shutdown and
    /// when a fresh resolver takes over after a panic).
    pub fn clear_cache(&mut self) {
        self.w.clear();
    }

    /// Gives the cache's writer back, ending the resolver (e.g. to hand it to a fresh one).
    pub fn into_writer(self) -> CacheWriter<C> {
        self.w
    }

    /// Opens endpoint `ep` (call from the core's `open_endpoint`). With `addr_prot acm` or
    /// `route_prot acm` it starts the multicast join(s) ([`Output::SendSa`] with an
    /// MCMemberRecord SET); the endpoint serves names and IPs once group 0 is joined.
    /// [`Error::Endpoint`] if `ep` is open already, [`Error::Capacity`] if no endpoint slot is
    /// free.
    pub fn open_endpoint(&mut self, now: Millis, ep: EpId, cfg: EpConfig) -> Result<(), Error> {
        if self.ep_slot(ep).is_some() {
            return Err(Error::Endpoint);
        }
        if self.done {
            return Err(Error::Endpoint);
        }
        // Reuse this endpoint's old slot if it still has outputs to flush (its leaves go out
        // before the new joins), else any slot with nothing left to flush.
        let n = self.st.endpoints().len().min(MAX_EPS);
        let old = (0..n).find(|&i| {
            let e = &self.st.endpoints()[i];
            !e.open && e.id == ep.0 && self.eps.is_dirty(i)
        });
        let slot =
            old.or_else(|| (0..n).find(|&i| !self.st.endpoints()[i].open && !self.eps.is_dirty(i)));
        let Some(slot) = slot else {
            return Err(Error::Capacity);
        };
        let min = (self.cfg.min_rate, self.cfg.min_mtu);
        // QPN 0 is QP0 (SMI), never a UD QP: "this endpoint has none", so no ACM protocol.
        let want_groups = (self.cfg.addr_acm || self.cfg.route_acm) && cfg.qpn != 0;
        let second =
            want_groups && self.cfg.route_acm && cfg.rate != 0 && (cfg.rate, cfg.mtu) != min;
        {
            let e = &mut self.st.endpoints()[slot];
            let (groups, informs, attached, force, counts, record) = (
                e.groups,
                e.informs,
                e.attached,
                e.force_detach,
                e.counts,
                e.attached_record,
            );
            *e = EpSlot::EMPTY;
            // Outputs of a previous life of this slot (leaves, a detach, counts) still go out.
            e.attached = attached;
            e.force_detach = force || attached;
            e.attached_record = record;
            e.counts = counts;
            for (g, old) in e.groups.iter_mut().zip(groups) {
                g.leave = old.leave;
                g.leave_record = old.leave_record;
            }
            for (n, old) in e.informs.iter_mut().zip(informs) {
                n.leave = old.leave;
            }
            e.open = true;
            e.acm = want_groups;
            e.id = ep.0;
            e.port_gid = cfg.port_gid.0;
            e.lid = cfg.lid;
            e.pkey = cfg.pkey;
            e.mtu = cfg.mtu;
            e.rate = cfg.rate;
            e.subnet_timeout = cfg.subnet_timeout_ms;
            e.qpn = cfg.qpn;
            e.sa_pkey = cfg.sa_pkey;
            e.table.max_lid = cfg.lid;
            e.cache_ep = ep_number(0, ep.0);
            if want_groups {
                e.groups[0].rate = min.0;
                e.groups[0].mtu = min.1;
            }
            if second {
                e.groups[1].rate = cfg.rate;
                e.groups[1].mtu = cfg.mtu;
            }
        }
        self.eps.map(ep, Some(slot));
        if want_groups {
            self.start_join(now, slot, 0);
        }
        if second {
            self.start_join(now, slot, 1);
        }
        self.subscribe_all(now, slot);
        self.schedule_prefetch(now, slot);
        self.eps.recount_ports(self.st.tables_ref().endpoints);
        self.mark_dirty(slot);
        Ok(())
    }

    /// Closes endpoint `ep` (the core's `close_endpoint`): answers its waiters ENODATA, leaves
    /// its groups ([`Output::Detach`], MCMemberRecord DELETE fire-and-forget), forgets its
    /// addresses and preloads, and invalidates its cache entries (`invalidate_ep`). Queries of
    /// the endpoint still held by the caller are forgotten (their replies are ignored).
    pub fn close_endpoint(&mut self, now: Millis, ep: EpId) {
        let Some(slot) = self.ep_slot(ep) else {
            return;
        };
        self.drop_endpoint_work(now, slot, Status::Enodata, true);
        self.unsubscribe_all(slot);
        for i in 0..self.st.addrs().len() as u32 {
            let a = self.st.addrs()[i as usize];
            if a.state != AddrState::Free && usize::from(a.ep) == slot {
                self.free_addr(i);
            }
        }
        for p in self.st.preloads().iter_mut() {
            if p.used && usize::from(p.ep) == slot {
                *p = PreloadSlot::EMPTY;
            }
        }
        {
            let e = &mut self.st.endpoints()[slot];
            let (gid, pkey) = (Gid(e.port_gid), e.pkey);
            for g in e.groups.iter_mut() {
                if matches!(g.t.state, GroupState::Joining | GroupState::Joined) {
                    g.leave = true;
                    g.leave_record = mads::join_record(gid, pkey, g.rate, g.mtu);
                }
                g.t.state = GroupState::Off;
            }
            e.open = false;
            e.ack = false;
            e.queue = List::EMPTY;
            e.inflight = List::EMPTY;
            e.locals = List::EMPTY;
            e.acm_inflight = 0;
        }
        self.w.invalidate_ep(u32::from(ep.0));
        self.eps.map(ep, None);
        self.eps.recount_ports(self.st.tables_ref().endpoints);
        self.mark_dirty(slot);
        self.pump(now);
    }

    /// Adds a local address of `ep` (the core's `add_address`). Peers asking for it get a
    /// response. With `loopback_prot local` (and a known LID) it also answers requests for
    /// itself with the loopback path, cached and aliased under `cache_ep` so the caller's hit
    /// path finds it (never expires).
    pub fn add_address(
        &mut self,
        now: Millis,
        ep: EpId,
        cache_ep: u32,
        kind: AddrKind,
        addr: &[u8; 64],
    ) -> Result<(), Error> {
        let type_ = AddressType::from(kind);
        let slot = self.ep_slot(ep).ok_or(Error::Endpoint)?;
        let i = match self.find_addr(slot, type_, addr) {
            Some(i) => {
                let a = self.st.addrs()[i as usize];
                if a.state == AddrState::Local {
                    return Ok(());
                }
                // Someone may be waiting for what is now our own address.
                self.fail_addr_waiters(i, Status::Enodata);
                self.free_addr(i);
                self.alloc_addr(slot, type_, addr).ok_or(Error::Capacity)?
            }
            None => self.alloc_addr(slot, type_, addr).ok_or(Error::Capacity)?,
        };
        {
            let e = self.st.endpoints()[slot];
            let a = &mut self.st.addrs()[i as usize];
            a.state = AddrState::Local;
            a.gid = e.port_gid;
            a.lid = e.lid;
            a.qpn = e.qpn;
            a.expires = NEVER;
            a.cache_ep = cache_ep;
        }
        let t = self.st.tables();
        t.endpoints[slot]
            .locals
            .push_back(t.addrs, i, list_id::LOCALS, ADDR_Q);
        self.insert_loopback(now, slot, i, cache_ep);
        self.pump(now);
        Ok(())
    }

    /// Removes a local address (the core's `remove_address`). Its loopback alias is dropped
    /// from the cache at the next input that passes the cache ([`poll_timeout`](Self::poll_timeout)
    /// asks for an immediate [`handle_timeout`](Self::handle_timeout)).
    pub fn remove_address(&mut self, ep: EpId, kind: AddrKind, addr: &[u8; 64]) {
        let Some(slot) = self.ep_slot(ep) else {
            return;
        };
        let Some(i) = self.find_addr(slot, kind.into(), addr) else {
            return;
        };
        if self.st.addrs()[i as usize].state != AddrState::Local {
            return;
        }
        self.unlink_q(i);
        self.st.addrs()[i as usize].state = AddrState::Removing;
        self.addrs
            .removals
            .push_back(self.st.addrs(), i, list_id::REMOVALS, ADDR_Q);
        // No cache here: ask for a `handle_timeout` call, which drops the alias.
        self.timers.arm(Timer::Removal, 0);
    }

    /// A hosts-file mapping (`addr_preload acm_hosts`): `addr` of `kind` is `gid`.
    /// The entry is ADDR_RESOLVED: the first request for it queries the route. It expires after
    /// `addr_ttl` and is renewed on use (counted `AddrQuery`).
    pub fn preload_address(
        &mut self,
        now: Millis,
        ep: EpId,
        kind: AddrKind,
        addr: &[u8; 64],
        gid: Gid,
    ) -> Result<(), Error> {
        let type_ = AddressType::from(kind);
        let slot = self.ep_slot(ep).ok_or(Error::Endpoint)?;
        let i = match self.find_addr(slot, type_, addr) {
            Some(i) => {
                if self.st.addrs()[i as usize].state != AddrState::Resolved {
                    return Ok(());
                }
                i
            }
            None => self.alloc_addr(slot, type_, addr).ok_or(Error::Capacity)?,
        };
        let expires = self.addr_expiry(now);
        let cache_ep = self.st.endpoints()[slot].cache_ep;
        let a = &mut self.st.addrs()[i as usize];
        a.state = AddrState::Resolved;
        a.origin = storage::Origin::Preload;
        a.gid = gid.0;
        a.lid = 0;
        a.group = 0;
        a.expires = expires;
        a.cache_ep = cache_ep;
        Ok(())
    }

    /// A preloaded route (`route_preload`): `path` is cached as two path entries, by its DLID
    /// and by its DGID (no constraint; each answers requests with and without the reversible
    /// bit), never expires, and is inserted again after every [`reregister`](Self::reregister).
    pub fn preload_route(&mut self, now: Millis, ep: EpId, cache_ep: u32, path: &[u8; 64]) {
        let Some(slot) = self.ep_slot(ep) else {
            return;
        };
        if let Some(p) = self.st.preloads().iter_mut().find(|p| !p.used) {
            *p = PreloadSlot {
                used: true,
                ep: slot as u8,
                path: *path,
            };
        }
        self.insert_preload(now, slot, cache_ep, path);
    }

    /// CLIENT_REREGISTER (or an SM change) on `ep`'s port; `cache_ep` is the endpoint's cache
    /// number at the new flush generation. Learned routes and addresses of the endpoint are
    /// dropped (`invalidate_ep`); preloaded routes and loopback entries are inserted again under
    /// `cache_ep`; the groups are detached and joined again.
    pub fn reregister(&mut self, now: Millis, ep: EpId, cache_ep: u32) {
        let Some(slot) = self.ep_slot(ep) else {
            return;
        };
        self.w.invalidate_ep(u32::from(ep.0));
        self.st.endpoints()[slot].cache_ep = cache_ep;
        for i in 0..self.st.preloads().len() {
            let p = self.st.preloads()[i];
            if p.used && usize::from(p.ep) == slot {
                self.insert_preload(now, slot, cache_ep, &p.path);
            }
        }
        for i in 0..self.st.addrs().len() as u32 {
            let a = self.st.addrs()[i as usize];
            if usize::from(a.ep) != slot {
                continue;
            }
            match a.state {
                AddrState::Local => self.insert_loopback(now, slot, i, cache_ep),
                AddrState::Resolved
                    if a.origin == storage::Origin::Learned && a.job == 0 && !a.send_resp =>
                {
                    self.free_addr(i)
                }
                _ => {}
            }
        }
        let e = &mut self.st.endpoints()[slot];
        e.force_detach = e.attached;
        let wanted: [bool; 2] = [
            e.groups[0].t.state != GroupState::Off,
            e.groups[1].t.state != GroupState::Off,
        ];
        for (g, want) in wanted.into_iter().enumerate() {
            if want {
                self.st.endpoints()[slot].groups[g].t.tries = 0;
                self.start_join(now, slot, g);
            }
        }
        // A new SM (or the same one after a reregister) holds no subscription of ours.
        self.subscribe_all(now, slot);
        self.mark_dirty(slot);
        self.pump(now);
    }

    /// A client request (`resolve()` → [`Kind::Resolve`], `query()` → [`Kind::Query`], or a
    /// [`Kind::Prime`] / [`Kind::Refresh`] the caller already answered). `cache_ep` is the
    /// caller's cache endpoint number for `ep` (the key of every cache entry of this request);
    /// `msg` the client's message. Resolve and Query requests get exactly one
    /// [`Output::Answer`]; Prime and Refresh none. A caller whose front has classified the
    /// request already hands it over with [`request_classified`](Self::request_classified).
    pub fn request(
        &mut self,
        now: Millis,
        ep: EpId,
        cache_ep: u32,
        client: u64,
        kind: Kind,
        msg: &[u8],
    ) {
        let r = Request {
            ep,
            cache_ep,
            client,
            kind,
            msg,
        };
        let target = match self.ep_slot(ep) {
            Some(slot) if kind != Kind::Query => {
                Some(request::classify(&self.view(slot, cache_ep), msg))
            }
            _ => None,
        };
        self.take_request(now, &r, target.as_ref());
    }

    /// [`request`](Self::request) for a RESOLVE, Prime or Refresh request the caller's front
    /// has classified already ([`request::classify`] with the endpoint's view at `cache_ep`):
    /// it is not parsed again.
    pub fn request_classified(&mut self, now: Millis, r: &Request<'_>, target: &request::Target) {
        self.take_request(now, r, Some(target));
    }

    fn take_request(&mut self, now: Millis, r: &Request<'_>, target: Option<&request::Target>) {
        let slot = match self.ep_slot(r.ep) {
            Some(s) if !self.done => s,
            _ => {
                self.answer_now(r, Status::Enodata, None);
                return;
            }
        };
        self.st.endpoints()[slot].cache_ep = r.cache_ep;
        match target {
            Some(t) if r.kind != Kind::Query => self.resolve_request(now, slot, r, t),
            _ => self.query_request(now, slot, r),
        }
        self.pump(now);
    }

    /// A RESOLVE (or Prime, Refresh) request meets the cache again here: its entry may have
    /// arrived since the caller's front looked. [`front::decide`] says what follows, as it
    /// does on the caller's hit path.
    fn resolve_request(
        &mut self,
        now: Millis,
        slot: usize,
        r: &Request<'_>,
        target: &request::Target,
    ) {
        use front::Front;
        use request::Target;
        // A refresh renews the route whatever the cache holds now.
        let lookup = match r.kind {
            Kind::Refresh => Lookup::Miss,
            _ => front::look(self.w.cache(), target, now, false),
        };
        let (refresh, wait) = match (r.kind, front::decide(target, true, &lookup)) {
            (_, Front::Answer(status)) => {
                if matches!(target, Target::Fail(Status::Einval)) {
                    self.stats.malformed += 1;
                }
                self.answer_now(r, status, None);
                return;
            }
            (_, Front::Hit { refresh }) => {
                if let (Kind::Resolve, Lookup::Hit { record, .. }) = (r.kind, &lookup) {
                    self.count(r.ep, Counter::RouteCache);
                    self.answer_now(r, Status::Success, Some(record));
                }
                if !refresh {
                    return;
                }
                (true, false)
            }
            (Kind::Refresh, _) => (true, false),
            (_, Front::Prime) => {
                self.answer_now(r, Status::Enodata, None);
                (false, false)
            }
            (kind, Front::HandOver) => (false, kind == Kind::Resolve),
        };
        match target {
            Target::Route { key, record, .. } => {
                let sa = record.query_record(&self.view(slot, r.cache_ep));
                self.route_query(now, slot, r, key.map(|k| k.key()), &sa, wait);
            }
            Target::Address { key, .. } if refresh => self.addr_refresh(now, slot, r, key),
            Target::Address { key, .. } => self.addr_query(now, slot, r, key, wait),
            Target::Fail(_) => {}
        }
    }

    /// An SA completion for a [`Output::SendSa`] with `token`: the reply MAD (`umad_status`
    /// 0), or the MAD as sent with a non-zero `umad_status` (timeout, send failure). Replies
    /// whose token or TID matches nothing in flight are counted and dropped.
    pub fn handle_sa(&mut self, now: Millis, token: u64, umad_status: u32, mad: &[u8]) {
        let mad = mads::full_mad(mad);
        let (kind, index, tid) = mads::untoken(token);
        match kind {
            mads::TOKEN_ROUTE => self.route_reply(now, index, tid, umad_status, &mad),
            mads::TOKEN_JOIN => self.set_reply(now, Set::Join, index, tid, umad_status, &mad),
            mads::TOKEN_INFORM => self.set_reply(now, Set::Inform, index, tid, umad_status, &mad),
            mads::TOKEN_TABLE => self.table_reply(now, token, umad_status),
            mads::TOKEN_LEAVE | mads::TOKEN_NOTICE => {}
            _ => self.stats.sa_unknown += 1,
        }
        self.pump(now);
    }

    /// A class 0x2C MAD received on `ep`'s UD QP (`mad` = the 256 bytes after the GRH, `meta`
    /// from the completion). Requests for one of our addresses are answered (unicast); every
    /// valid request records its sender; responses complete our queries. Anything malformed,
    /// unexpected or from another partition is counted in [`Stats`] and dropped.
    pub fn handle_acm(&mut self, now: Millis, ep: EpId, meta: &RecvMeta, mad: &[u8]) {
        self.acm_receive(now, ep, meta, mad);
        self.pump(now);
    }

    /// Runs the timers due at `now` (SA deadlines, BUSY backoffs, ACM retries, queue
    /// deadlines, join retries). Call when [`poll_timeout`](Self::poll_timeout) has passed;
    /// calling it early or often is harmless.
    // Never inlined: a caller's loop calls it in several places, and each inlined copy is
    // kilobytes of flash on a microcontroller (docs/firmware.md).
    #[inline(never)]
    pub fn handle_timeout(&mut self, now: Millis) {
        let due = Timer::ALL.map(|t| self.timers.due(t, now));
        if !due.contains(&true) {
            return;
        }
        let fired = |t: Timer| due[t as usize];
        for t in [Timer::Backlog, Timer::SaReply, Timer::SaBusy] {
            if fired(t) {
                self.route_timers(now, t);
            }
        }
        // The endpoints' timers, one endpoint after the other.
        let (join, inform) = (fired(Timer::Join), fired(Timer::Inform));
        let (queue, retry) = (fired(Timer::AcmQueue), fired(Timer::AcmRetry));
        if join || inform || queue || retry {
            for slot in 0..self.st.tables_ref().endpoints.len() {
                if !self.st.tables_ref().endpoints[slot].open {
                    continue;
                }
                if join {
                    self.set_timers(now, Set::Join, slot);
                }
                if inform {
                    self.set_timers(now, Set::Inform, slot);
                }
                if queue {
                    self.acm_queue_timers(now, slot);
                }
                if retry {
                    self.acm_retry_timers(now, slot);
                }
            }
        }
        if fired(Timer::Prefetch) {
            self.prefetch_timers(now);
        }
        // `pump` drops the removals' aliases (the `Removal` timer's work).
        self.pump(now);
        for t in Timer::ALL {
            if fired(t) {
                self.rearm(t);
            }
        }
    }

    /// When to call [`handle_timeout`](Self::handle_timeout) next (`None` = no timer armed).
    /// It may be earlier than necessary, never later.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.timers.next()
    }

    /// Answers everything still waiting ENODATA and refuses all later requests (ENODATA).
    pub fn shutdown(&mut self, now: Millis) {
        self.done = true;
        for slot in 0..self.st.endpoints().len() {
            if self.st.endpoints()[slot].open {
                self.drop_endpoint_work(now, slot, Status::Enodata, true);
            }
        }
        for i in 0..self.st.addrs().len() as u32 {
            if self.st.addrs()[i as usize].state != AddrState::Free {
                self.fail_addr_waiters(i, Status::Enodata);
            }
        }
        self.timers.clear();
    }

    /// Drop and refusal counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// True if nothing is outstanding: no request waiting or unpolled, no SA query or ACM query
    /// in flight or queued.
    pub fn is_idle(&self) -> bool {
        self.routes.active == 0
            && self.addrs.active == 0
            && self.answers.waiting == 0
            && self.answers.fifo.is_empty()
    }
}

/// One client request as the resolver takes it ([`Resolver::request_classified`]).
#[derive(Clone, Copy, Debug)]
pub struct Request<'m> {
    /// The endpoint it arrived on.
    pub ep: EpId,
    /// The caller's cache endpoint number for `ep` ([`ep_number`]): the key of every cache
    /// entry of this request.
    pub cache_ep: u32,
    /// The caller's handle for the answer ([`Answer::client`]).
    pub client: u64,
    /// What kind of request it is.
    pub kind: Kind,
    /// The client's message.
    pub msg: &'m [u8],
}

impl<S: Storage, C: CacheRef> Resolver<S, C> {
    pub(crate) fn next_tid(&mut self) -> u32 {
        loop {
            self.tid = self.tid.wrapping_add(1);
            if self.tid != 0 {
                return self.tid;
            }
        }
    }

    /// Inserts `path` under the loopback key of local address `i` and aliases the address.
    fn insert_loopback(&mut self, now: Millis, slot: usize, i: u32, cache_ep: u32) {
        let e = self.st.endpoints()[slot];
        if !self.cfg.loopback_local || e.lid == 0 {
            return;
        }
        let path = request::loopback_path(Gid(e.port_gid), e.lid, e.pkey, e.mtu, e.rate);
        let view = self.view(slot, cache_ep);
        let (k, _) = request::normalise(&view, &request::gid_record(Gid(e.port_gid), 0));
        let Some(key) = request::cache_key(cache_ep, &k) else {
            return;
        };
        self.st.addrs()[i as usize].cache_ep = cache_ep;
        self.w.insert(&key, &path, now, NEVER);
        let a = self.st.addrs()[i as usize];
        addr::alias(&mut self.w, &a, &key, now, NEVER);
    }

    fn insert_preload(&mut self, now: Millis, slot: usize, cache_ep: u32, path: &[u8; 64]) {
        use crate::wire::path_record::PathRecord;
        let view = self.view(slot, cache_ep);
        let p = PathRecord::new_unchecked(&path[..]);
        let (dlid, dgid) = (p.dlid(), p.dgid());
        // Two keys for one route, by DLID and by DGID, each a path entry of its own: a hit is
        // one slot read whichever way the route is asked for. The reversible bit is not part
        // of a cache key, so each entry answers requests with and without it.
        for (valid, lid, gid) in [(dlid != 0, dlid, None), (!dgid.is_zero(), 0, Some(dgid))] {
            if !valid {
                continue;
            }
            let mut r = [0u8; 64];
            let mut k = PathRecord::new_unchecked(&mut r[..]);
            match gid {
                Some(g) => k.set_dgid(g),
                None => k.set_dlid(lid),
            }
            k.set_reversible_numpath(true, 0);
            let (k, _) = request::normalise(&view, &r);
            if let Some(key) = request::cache_key(cache_ep, &k) {
                self.w.insert(&key, path, now, NEVER);
            }
        }
    }

    /// After every input: drops removed addresses' cache aliases, lets backlog jobs into the
    /// SA window and queued address queries into the ACM windows.
    pub(crate) fn pump(&mut self, now: Millis) {
        self.drop_removed();
        self.pump_backlog(now);
        self.pump_acm_all(now);
    }

    /// Answers (with `status`) every route job and address query of endpoint `slot`, and
    /// forgets the queries the caller still holds when `forget_held`.
    fn drop_endpoint_work(&mut self, now: Millis, slot: usize, status: Status, forget_held: bool) {
        for j in 0..self.st.jobs().len() as u32 {
            let job = &self.st.jobs()[j as usize];
            if job.state == JobState::Free || usize::from(job.ep) != slot {
                continue;
            }
            self.finish_job(now, j, route::Completion::failed(status));
            if forget_held {
                self.free_zombie(j);
            }
        }
        for i in 0..self.st.addrs().len() as u32 {
            let a = self.st.addrs()[i as usize];
            if usize::from(a.ep) == slot
                && matches!(a.state, AddrState::Queued | AddrState::Querying)
            {
                self.fail_addr(i, status);
            }
        }
    }
}

#[cfg(feature = "std")]
impl<S: Storage, C: CacheRef> Resolver<S, C> {
    /// Checks the resolver's internal bookkeeping against its tables (counts, list
    /// memberships, the SA window), each part its own, and that every waiting request is on
    /// exactly one waiter list; for tests and simulations. O(table size).
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), std::string::String> {
        use std::format;
        let t = self.st.tables_ref();
        self.answers.check(t.requests)?;
        if !self.done {
            self.check_timers()?;
        }
        let waiters = self.routes.check(t.jobs)? + self.addrs.check(t.addrs)?;
        if waiters != self.answers.waiting {
            return Err(format!(
                "waiters on lists {waiters}, waiting {}",
                self.answers.waiting
            ));
        }
        let mut backlogged = std::vec![0u32; t.endpoints.len()];
        for j in self.routes.backlog.iter(t.jobs, storage::JOB) {
            backlogged[usize::from(t.jobs[j as usize].ep)] += 1;
        }
        for (i, e) in t.endpoints.iter().enumerate() {
            if e.open && e.acm_inflight != e.inflight.len {
                return Err(format!(
                    "acm_inflight {} list {}",
                    e.acm_inflight, e.inflight.len
                ));
            }
            if e.table.backlogged != backlogged[i] {
                return Err(format!(
                    "endpoint slot {i}: {} jobs counted in the backlog, {} there",
                    e.table.backlogged, backlogged[i]
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_default_options_is_ibacmps() {
        let c = Config::default();
        assert!(c.addr_acm && !c.route_acm && c.loopback_local);
        assert_eq!(c.addr_ttl, Some(1440 * 60_000));
        assert_eq!(c.route_ttl, None);
        assert_eq!((c.acm_timeout, c.acm_retries, c.acm_window), (2000, 2, 16));
        assert_eq!(
            (c.sa_window, c.sa_deadline, c.queue_deadline),
            (16, 7000, 21_000)
        );
        assert_eq!((c.sa_tries, c.sa_reports), (3, true));
        assert_eq!((c.min_mtu, c.min_rate), (4, 3), "2048 bytes, 10 Gb/s");
        assert_eq!(
            (c.sa_busy_retries, c.sa_busy_backoff, c.negative_ttl),
            (3, 100, 5000)
        );
    }

    #[test]
    fn config_follows_the_options() {
        let (o, _) = ProviderOptions::load(
            b"addr_prot none\nroute_prot acm\nloopback_prot none\nacmrs_sa_timeout_ms 1500\n\
              retries 1\nsa_depth 64\nmin_mtu 4096\nmin_rate 40\nacmrs_acm_window 3\n\
              route_timeout 2\naddr_timeout -1\n",
            |e| panic!("{e:?}"),
        );
        let c = Config::from_options(&o);
        assert!(!c.addr_acm && c.route_acm && !c.loopback_local);
        assert_eq!(
            (c.sa_deadline, c.queue_deadline, c.sa_window),
            (1500, 3000, 16)
        );
        // Over the core's service the window is the core's credits, and no Reports come.
        let (core_o, _) = ProviderOptions::load(
            b"acmrs_sa_transport core\nsa_depth 4\nacmrs_sa_window 99\n",
            |e| panic!("{e:?}"),
        );
        let core = Config::from_options(&core_o);
        assert_eq!(
            (core.sa_window, core.sa_tries, core.sa_reports),
            (4, 0, false)
        );
        let (w, _) = ProviderOptions::load(b"acmrs_sa_window 99\n", |e| panic!("{e:?}"));
        assert_eq!(Config::from_options(&w).sa_window, 99);
        assert_eq!((c.min_mtu, c.min_rate, c.acm_window), (5, 7, 3));
        assert_eq!((c.route_ttl, c.addr_ttl), (Some(120_000), None));
        // ibacmp's resolve_depth is a floor of the window.
        let (o, _) = ProviderOptions::load(b"resolve_depth 40\n", |e| panic!("{e:?}"));
        assert_eq!(Config::from_options(&o).acm_window, 40);
    }

    #[test]
    fn empty_or_inconsistent_storage_is_refused() {
        let caps = Capacities {
            requests: 4,
            answer_reserve: 4,
            ..Capacities::default()
        };
        let mut st = HeapStorage::new(caps);
        assert!(st.requests().len() > 4, "HeapStorage keeps one waiter slot");
        use crate::cache::{AddrSlot, CacheConfig, PathSlot};
        let cache = PathCache::new(
            PathSlot::boxed(8),
            AddrSlot::boxed(8),
            CacheConfig::default(),
        )
        .unwrap();
        let tiny: ArrayStorage<2, 2, 1, 1, 1, 1> = ArrayStorage::new();
        let w = cache.writer().unwrap();
        assert_eq!(
            Resolver::new(Config::default(), tiny, w, 0).err(),
            Some(Error::Storage)
        );
        let none: ArrayStorage<4, 1, 0, 1, 1, 1> = ArrayStorage::new();
        let w = cache.writer().unwrap();
        assert_eq!(
            Resolver::new(Config::default(), none, w, 0).err(),
            Some(Error::Storage)
        );
    }
}
