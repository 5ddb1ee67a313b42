//! The resolver: every decision acmrs makes, as a sans-IO state machine.
//!
//! Modelled on quinn-proto's `Connection`: the resolver never performs IO, never reads a clock
//! and never allocates. Its caller (the dataplane loop on a host, a firmware main loop, a
//! simulation) feeds it **inputs** as method calls with the time passed in, and drains its
//! **outputs** by polling:
//!
//! ```text
//!  inputs                                   outputs (poll_output)
//!  open_endpoint / close_endpoint  ──┐   ┌──▶ Output::SendSa    (PathRecord GET, MCMember SET/DELETE)
//!  add_address / remove_address      │   ├──▶ Output::SendAcm   (class 0x2C over the endpoint's UD QP)
//!  reregister                        ├─▶ ├──▶ Output::Answer    (a client's response, exactly once)
//!  request      (client, 592 B msg)  │   ├──▶ Output::Attach / Output::Detach (multicast group)
//!  handle_sa    (SA reply or error)  │   └──▶ Output::Count     (an ACM_CNTR_* event)
//!  handle_acm   (received 0x2C MAD)  │
//!  handle_timeout(now)             ──┘        poll_timeout() → when to call handle_timeout
//! ```
//!
//! Storage (request slots, pending keys, in-flight queries, address entries, endpoints) comes
//! from the caller as slices in a [`Storage`], like [`crate::cache::PathCache`]. The path cache
//! itself is shared with lock-free readers (the provider's inline hit path), so it is passed to
//! every input that may write it; the resolver is its only writer.
//!
//! Time is one monotonic clock in milliseconds ([`Millis`]), the same ticks the cache uses.
//!
//! Exactly-once: every [`Resolver::request`] of kind [`Kind::Resolve`] or [`Kind::Query`] leads
//! to exactly one [`Output::Answer`] carrying its `client` and the request's `tid`, on every
//! path (hit, miss, SA error, timeout, endpoint close, reregister, shutdown, full tables).

pub mod request;

use crate::cache::PathCache;
use crate::wire::gid::Gid;
use crate::wire::mad::MAD_LEN;

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
    /// The endpoint's own UD QP number (the source QPN of its ACM MADs).
    pub qpn: u32,
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
    pub status: u8,
    /// Valid length of `msg`.
    pub len: u16,
    /// The response message (built with `wire::client`).
    pub msg: [u8; MSG_LEN],
}

/// One thing for the caller to do.
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
    /// The endpoint is not open (or already open for `open_endpoint`).
    Endpoint,
    /// The endpoint has no room for another local address.
    Capacity,
    /// An address type the ACM protocol does not carry.
    AddressType,
}

/// Counters of what the resolver dropped or refused, for logs and `query_perf`-like exports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Received ACM MADs dropped: wrong class/version/length/method/control.
    pub acm_malformed: u64,
    /// ACM responses whose TID matches no pending query.
    pub acm_unknown_tid: u64,
    /// ACM responses for an address nobody asked about.
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
    /// ACM multicast queries in flight per endpoint (`resolve_depth`, ibacmp: 1).
    pub acm_window: u32,
    /// SA queries in flight per resolver (the rest wait FIFO).
    pub sa_window: u32,
    /// SA BUSY retries (`acmrs_sa_retries`).
    pub sa_busy_retries: u32,
    /// First BUSY backoff, doubled per retry (`acmrs_sa_busy_backoff_ms`).
    pub sa_busy_backoff: Millis,
    /// An SA query with no reply after this long is answered ETIMEDOUT.
    pub sa_deadline: Millis,
    /// `min_mtu` as `enum ibv_mtu` (base group).
    pub min_mtu: u8,
    /// `min_rate` as `enum ibv_rate` (base group).
    pub min_rate: u8,
}
