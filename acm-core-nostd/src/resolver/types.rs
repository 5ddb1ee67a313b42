//! The resolver's public types: its ids and settings per endpoint, its inputs' and outputs'
//! payloads, its counters and errors (re-exported as `acm_core_nostd::resolver::*`).

use crate::cache::CacheEp;
use crate::wire::client::Status;
use crate::wire::gid::Gid;
use crate::wire::mad::MAD_LEN;

/// Milliseconds on the caller's monotonic clock.
pub type Millis = u64;

/// Most endpoints one resolver serves (the cache's endpoint slots).
pub const MAX_EPS: usize = 256;

/// Largest client message (`sizeof(struct acm_msg)`).
pub const MSG_LEN: usize = crate::wire::client::MSG_LEN;

/// An endpoint: the caller's cache endpoint slot (0..[`MAX_EPS`]), unique among open endpoints.
/// The one name of an endpoint between the provider's layers (the plugin, the dataplane, the
/// node, the resolver's inputs and outputs); the resolver's storage slot of it is found from it
/// in one place (its endpoint map), its cache number is made from it by the caller
/// ([`ep_number`](crate::cache::ep_number)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EpId(pub u8);

impl EpId {
    /// Its place in a table of [`MAX_EPS`] entries, one per id.
    #[inline(always)]
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// The id of place `i` of such a table (`None` past [`MAX_EPS`]).
    #[inline]
    pub fn from_index(i: usize) -> Option<EpId> {
        u8::try_from(i).ok().map(EpId)
    }
}

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

impl EpConfig {
    /// What the request parser needs of this endpoint, at cache number `cache_ep` (what a
    /// caller's front classifies a request with).
    pub fn view(&self, cache_ep: CacheEp) -> super::request::EpView {
        super::request::EpView {
            cache_ep,
            port_gid: self.port_gid,
            lid: self.lid,
            pkey: self.pkey,
        }
    }
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

/// What the caller's SA transport does for the resolver besides carrying single-MAD queries
/// and their answers. The node sets it from its [`SaConfig`](crate::node::SaConfig)
/// ([`Resolver::set_transport`](super::Resolver::set_transport)); a resolver on its own has
/// [`Carries::ALL`]. It switches off the tables and Reports [`Config`](super::Config) asks
/// for where the transport cannot carry them, and replaces the configured SA window where the
/// transport has one of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Carries {
    /// Subnet timeouts an SA query's deadline adds, one per try of the transport, each of
    /// which waits its port's (0: the transport's budget is fixed).
    pub subnet_waits: u32,
    /// It reassembles RMPP answers: half-world tables may be asked for
    /// ([`Config::sa_tables`](super::Config::sa_tables)).
    pub tables: bool,
    /// SA Reports reach the endpoint's QP: subscriptions may be made
    /// ([`Config::sa_reports`](super::Config::sa_reports)).
    pub reports: bool,
    /// The SA window it sets instead of [`Config::sa_window`](super::Config::sa_window): the
    /// queries it takes at once per port (`None`: the configured window).
    pub window: Option<u32>,
}

impl Carries {
    /// Everything the configuration asks for (a resolver that is not in a node).
    pub const ALL: Carries = Carries {
        subnet_waits: 0,
        tables: true,
        reports: true,
        window: None,
    };
}

/// A client's answer, for `client` on endpoint `ep`, through `via`: its message is the first
/// `len` bytes of the [`MsgBuf`] the caller gave the poll that returned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Endpoint of the request.
    pub ep: EpId,
    /// The core's client index the request came with.
    pub client: u64,
    /// Which core helper sends it.
    pub via: Via,
    /// The ACM status in the answer (also in the message).
    pub status: Status,
    /// Length of the message (built with `wire::client`).
    pub len: u16,
}

/// A client message's bytes, aligned as the core's `struct acm_msg` (8): a poll that returns
/// an [`Output::Answer`] writes the answer's message here, and the plugin hands this buffer to
/// the core as its `acm_msg`, so the answer is never copied after it is built. Only the
/// answer's `len` bytes are written; the rest is left as it was.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsgBuf(pub [u8; MSG_LEN]);

impl MsgBuf {
    /// An all-zero buffer.
    pub const fn new() -> Self {
        MsgBuf([0; MSG_LEN])
    }

    /// The message of `answer`, which a poll wrote here.
    pub fn message(&self, answer: &Answer) -> &[u8] {
        &self.0[..usize::from(answer.len).min(MSG_LEN)]
    }
}

impl Default for MsgBuf {
    fn default() -> Self {
        MsgBuf::new()
    }
}

/// One thing for the caller to do.
// Every variant carries its MAD or message by value: no allocator, and the caller moves it out.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug)]
pub enum Output {
    /// Send this SA MAD (class 3) for endpoint `ep`; report its completion, reply or failure
    /// with [`Resolver::handle_sa`](super::Resolver::handle_sa) and the same `token`.
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
    /// The storage given to [`Resolver::new`](super::Resolver::new) is empty or inconsistent.
    Storage,
    /// The endpoint is not open (or already open for `handle_open`, or the resolver was
    /// shut down).
    Endpoint,
    /// A table is full: no endpoint slot (`handle_open`), no address entry (`add_address`,
    /// `handle_preload_address`).
    Capacity,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Error::Storage => "resolver storage is empty or inconsistent",
            Error::Endpoint => "endpoint not open (or already open)",
            Error::Capacity => "resolver slab full",
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
    /// SA MADs the node's SA channel refused as not from the SM or not on the asking QP
    /// (a wrong LID or QP, another endpoint's TID; [`Node::stats`](crate::node::Node::stats)
    /// fills it in, the resolver alone keeps it 0).
    pub sa_forged: u64,
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
    /// Half-world PathRecord tables received ([`table`](super::table)).
    pub sa_tables: u64,
    /// Records they brought into the cache.
    pub sa_table_records: u64,
    /// Slabs asked for that brought nothing (lost, too big, refused).
    pub sa_table_failed: u64,
    /// Answers that found no request slot at all (only possible if the caller feeds more than
    /// `answer_reserve` requests without draining [`Resolver::poll_output`](super::Resolver::poll_output); see its docs).
    pub lost: u64,
}

/// A client request's head: everything of it but the message, one type from the provider's
/// front through its inbox (which keeps it beside its copy of the message) to the resolver.
#[derive(Clone, Copy, Debug)]
pub struct RequestHead {
    /// The endpoint it arrived on.
    pub ep: EpId,
    /// The caller's cache endpoint number for `ep` ([`ep_number`](crate::cache::ep_number)):
    /// the key of every cache entry of this request.
    pub cache_ep: CacheEp,
    /// The caller's handle for the answer ([`Answer::client`]).
    pub client: u64,
    /// What kind of request it is.
    pub kind: Kind,
    /// How the caller's front classified it ([`request::classify`](super::request::classify)
    /// with the endpoint's view at `cache_ep`), so that it is not parsed again; `None`: the
    /// resolver classifies it (and a query is never classified).
    pub target: Option<super::request::Target>,
    /// The cache's [`writes`](crate::cache::PathCache::writes) when the caller's front
    /// decided (read after its lookup missed), so that the request is decided once: while
    /// the cache has had no write since, the front's miss stands (its decision is the
    /// request's `kind`) and the resolver does not look again. `None`: the resolver looks
    /// (the front did not look, or its look may have been stale).
    pub front_writes: Option<u32>,
}

/// One client request as the resolver takes it
/// ([`Resolver::handle_request`](super::Resolver::handle_request)): its head and its message
/// where the caller holds it.
#[derive(Clone, Copy, Debug)]
pub struct Request<'m> {
    /// Who asked, on which endpoint, what for, how it was classified.
    pub head: RequestHead,
    /// The client's message.
    pub msg: &'m [u8],
}

impl<'m> Request<'m> {
    /// A request not classified yet (the resolver classifies it).
    pub fn new(ep: EpId, cache_ep: CacheEp, client: u64, kind: Kind, msg: &'m [u8]) -> Self {
        let head = RequestHead {
            ep,
            cache_ep,
            client,
            kind,
            target: None,
            front_writes: None,
        };
        Request { head, msg }
    }
}
