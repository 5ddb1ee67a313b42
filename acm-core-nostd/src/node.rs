//! One provider instance as one sans-IO machine: the [`Resolver`] and its SA transport
//! composed, so that the dataplane, the simulator and the firmware run the same logic.
//!
//! A [`Node`] owns:
//! * the resolver (requests, the cache's one writer, ACM, groups, subscriptions, tables);
//! * the [`SaChannel`] with its RMPP receivers (the `ud` transport: SA MADs on our own QPs);
//! * the SA carrier of each endpoint (which endpoint's UD QP carries its SA MADs);
//! * the SM address of each endpoint's port, and when it is read again ([`SM_CHECK_MS`]);
//! * the tries and the per-try wait of an SA MAD ([`SaConfig`]: `timeout` + the port's subnet
//!   timeout, `retries + 1` tries).
//!
//! The caller moves bytes. It feeds the node typed inputs (`handle_*`, each with the time)
//! and carries out what [`Node::poll_output`] gives until it gives nothing: post a MAD on a
//! QP ([`Output::Transmit`]), hand one to the core's SA service ([`Output::CoreSa`]), answer
//! a client, attach or detach a group, count, read a port's SM address ([`Output::ReadSm`]),
//! log an [`Event`], or note that an SA query is done ([`Output::QueryDone`]).
//! [`Node::poll_timeout`] says when to call [`Node::handle_timeout`].
//!
//! The transport is the node's ([`Transport`]): with [`Transport::Ud`], every endpoint whose
//! port has a carrier and a known SM sends its SA MADs on that carrier's QP to the SM's QP1
//! and gets the replies back on it; the others, and every endpoint with [`Transport::Core`],
//! hand theirs to the core's service (one MAD per answer: no half-world tables through it).

use crate::cache::{AddrKind, CacheEp, CacheRef};
use crate::resolver::table::TableError;
use crate::resolver::{
    AcmDest, Answer, Carries, Counter, EpConfig, EpId, McGroup, Millis, MsgBuf, RecvMeta, Request,
    Resolver, Stats, Storage, MAX_EPS,
};
use crate::rmpp::Failure;
use crate::sa_channel::{Expired, Received, SaChannel, SaEntry, SmAddr, TableSlot, TIMED_OUT};
use crate::text::opts::{ProviderOptions, SaTransport};
use crate::wire::gid::Gid;
use crate::wire::inform::NoticeRepr;
use crate::wire::mad::{Header, Method, MgmtClass, HEADER_LEN, MAD_LEN};
use crate::wire::path_record::PATH_RECORD_LEN;
use crate::wire::sa::DATA_OFFSET as SA_DATA;
use core::ops::DerefMut;

/// How often the node has each port's SM address read again (the core forwards no SM_CHANGE
/// event to a provider).
pub const SM_CHECK_MS: Millis = 1000;

/// The umad status a query completes with when the core's SA service refused to send it
/// ([`Node::handle_unsent`] with [`Unsent::Refused`]): EIO, as a send that never left.
pub const UNSENT: u32 = 5;

/// Why a MAD the node asked for did not leave ([`Node::handle_unsent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsent {
    /// The QP had no send buffer or address handle free, or was being reset: the query's try
    /// is spent and it goes again in [`UNSENT_RETRY_MS`](crate::sa_channel::UNSENT_RETRY_MS)
    /// (`ud`).
    Busy,
    /// The post failed outright (a verbs error, no such group): the try stands as a loss, and
    /// the query goes again after its wait, as after any loss (`ud`).
    Failed,
    /// The core's SA service refused [`Output::CoreSa`]: the query fails at once (the core's
    /// service has no tries of ours to spend).
    Refused,
}

/// How SA MADs leave ([`SaConfig::transport`]; `acmrs_sa_transport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Every SA MAD through the core's umad service ([`Output::CoreSa`]).
    Core,
    /// On the endpoints' own UD QPs to the SM ([`Output::Transmit`]), through the node's
    /// [`SaChannel`]; an endpoint with no carrier or no known SM uses the core's service.
    Ud,
}

/// How a node's SA MADs leave, and the tries and per-try wait of each on the `ud` transport:
/// the one place an SA MAD's tries and timeouts are set ([`SaConfig::from_options`]), and
/// the one place that knows what each transport carries ([`SaConfig::carries`]: tables,
/// Reports, the core's window). The resolver's own deadline for a query covers every try
/// ([`Config::sa_deadline`](crate::resolver::Config::sa_deadline), plus one subnet timeout
/// of the query's port per try: the node tells the resolver how many when it is made,
/// [`Resolver::set_transport`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaConfig {
    /// How SA MADs leave (`acmrs_sa_transport`).
    pub transport: Transport,
    /// Tries of one SA MAD on its carrier's QP (`retries` + 1; at least 1).
    pub tries: u32,
    /// Each try's wait before the port's subnet timeout is added (`timeout`, ms).
    pub try_wait: Millis,
    /// SA MADs the core's service sends at once per port (`sa_depth`): the resolver's SA
    /// window on [`Transport::Core`], whose queue beyond that has no deadline.
    pub core_depth: u32,
}

impl SaConfig {
    /// What an `ibacm_opts.cfg` gives: `acmrs_sa_transport`, `retries` + 1 tries, `timeout`.
    pub fn from_options(o: &ProviderOptions) -> SaConfig {
        SaConfig {
            transport: match o.acmrs_sa_transport {
                SaTransport::Ud => Transport::Ud,
                SaTransport::Core => Transport::Core,
            },
            tries: o.retries.saturating_add(1),
            try_wait: u64::from(o.timeout),
            core_depth: o.sa_depth,
        }
    }

    /// The same, on `transport`.
    pub fn on(self, transport: Transport) -> SaConfig {
        SaConfig { transport, ..self }
    }

    /// The tries of one SA MAD: [`tries`](Self::tries), at least one.
    pub fn try_count(&self) -> u32 {
        self.tries.max(1)
    }

    /// One try's whole wait on a port whose subnet timeout is `subnet_ms`.
    pub fn per_try(&self, subnet_ms: u32) -> Millis {
        self.try_wait.saturating_add(u64::from(subnet_ms))
    }

    /// What the transport carries for the resolver. `ud`: half-world tables (the SA
    /// channel's RMPP receiver), Reports (they arrive on the endpoint's QP), the configured
    /// window, and one subnet timeout per try added to a query's deadline (each try waits
    /// its port's). The core's service: one MAD per answer, no Reports, `sa_depth` at once,
    /// a fixed budget.
    pub fn carries(&self) -> Carries {
        match self.transport {
            Transport::Ud => Carries {
                subnet_waits: self.try_count(),
                ..Carries::ALL
            },
            Transport::Core => Carries {
                subnet_waits: 0,
                tables: false,
                reports: false,
                window: Some(self.core_depth.max(1)),
            },
        }
    }
}

impl Default for SaConfig {
    /// [`SaConfig::from_options`] of the default options (`ud`, 3 tries of 2 s).
    fn default() -> Self {
        SaConfig::from_options(&ProviderOptions::default())
    }
}

/// One thing for the caller to do ([`Node::poll_output`]).
// Every variant carries its MAD or message by value: no allocator, and the caller moves it out.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug)]
pub enum Output {
    /// Post `mad` on endpoint `qp`'s UD QP to `to`. A post of an SA query (`query`) that fails
    /// goes back as [`Node::handle_unsent`]; any other failed post is a loss, which the
    /// node's tries (SA re-sends) or the resolver's (ACM MADs) cover.
    Transmit {
        /// The endpoint whose QP sends it.
        qp: EpId,
        /// Where to.
        to: AcmDest,
        /// The MAD.
        mad: [u8; MAD_LEN],
        /// The token of the SA query this is the first send of (`None`: an ACM MAD, a
        /// re-send, an RMPP ACK, a response).
        query: Option<u64>,
    },
    /// Hand `mad` to the core's SA service for endpoint `ep`; report its completion with
    /// [`Node::handle_core_sa`], or its refusal with [`Node::handle_unsent`]
    /// ([`Unsent::Refused`]), with this token.
    CoreSa {
        /// The endpoint whose port it goes out on.
        ep: EpId,
        /// Give it back with the completion.
        token: u64,
        /// The MAD.
        mad: [u8; MAD_LEN],
        /// The `ud` query `token` left on a QP before, whose carrier closed: it goes on here
        /// (no [`Output::QueryDone`] follows for its `ud` sends; what the caller keeps of
        /// them starts again).
        moved: bool,
    },
    /// Answer a client (exactly once per answered request), with the message the poll built
    /// into its [`MsgBuf`].
    Answer(Answer),
    /// Attach endpoint `ep`'s QP to this group and make an address handle for it.
    Attach {
        /// Endpoint.
        ep: EpId,
        /// The group.
        group: McGroup,
    },
    /// Detach endpoint `ep`'s QP from this group.
    Detach {
        /// Endpoint.
        ep: EpId,
        /// The group.
        group: McGroup,
    },
    /// Bump counter `counter` of endpoint `ep`.
    Count {
        /// Endpoint.
        ep: EpId,
        /// Which counter.
        counter: Counter,
    },
    /// Read where endpoint `ep`'s port's SM is now and give it to [`Node::handle_sm`].
    ReadSm {
        /// Endpoint.
        ep: EpId,
    },
    /// The `ud` SA query `token` is done: `replied` to by the SA (a reply or a whole table), or
    /// failed (out of tries, a table that brought nothing). After the outputs it led to, but
    /// for a GetTable whose carrier closed, which the core's service cannot carry: before
    /// the Gets that replace it. (A Get whose carrier closed goes on through the core's
    /// service under the same token, as [`Output::CoreSa`].)
    QueryDone {
        /// The token of its [`Output::Transmit`].
        token: u64,
        /// By the SA.
        replied: bool,
    },
    /// Something worth a log line.
    Event(Event),
}

/// What the node tells the log ([`Output::Event`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// No room in the SA channel: endpoint `ep`'s query failed at once (an error).
    SaFull {
        /// Endpoint.
        ep: EpId,
    },
    /// A half-world PathRecord table came in whole, with `records` records.
    TableReceived {
        /// Records.
        records: usize,
    },
    /// A half-world table brought nothing (an error); the Gets go on.
    TableFailed {
        /// Why.
        failure: Failure,
    },
    /// Endpoint `ep`'s port has a new SM: what was learned from the old one is dropped and
    /// its subscriptions renewed (an error-level line, as a fabric change is).
    SmChanged {
        /// Endpoint.
        ep: EpId,
        /// The SM before.
        old: SmAddr,
        /// The SM now.
        new: SmAddr,
    },
    /// A Report (trap 64/65) taken on endpoint `ep`.
    Report {
        /// Endpoint.
        ep: EpId,
        /// Trap number.
        trap: u16,
        /// The port it names.
        gid: Gid,
        /// Cache entries it invalidated.
        invalidated: u64,
    },
}

/// What the node keeps of an endpoint for its SA MADs (kept after a close until the slot is
/// opened again, so the outputs of the close still find their way).
#[derive(Clone, Copy, Debug)]
struct EpSa {
    open: bool,
    /// It has a UD QP ([`EpConfig::qpn`] ≠ 0).
    qp: bool,
    /// [`EpConfig::sa_pkey`].
    sa_pkey: bool,
    port_gid: Gid,
    subnet_timeout_ms: u32,
    /// Where its port's SM is, as last read (`ud` transport).
    sm: Option<SmAddr>,
}

impl EpSa {
    const NONE: EpSa = EpSa {
        open: false,
        qp: false,
        sa_pkey: false,
        port_gid: Gid::ZERO,
        subnet_timeout_ms: 0,
        sm: None,
    };

    /// It can carry its port's SA MADs on its own QP.
    fn carries(&self) -> bool {
        self.open && self.qp && self.sa_pkey
    }
}

/// The resolver and its SA transport (see the module docs), for endpoint ids below `EPS`
/// (what it keeps per endpoint is `EPS` small records: a firmware of one endpoint keeps
/// one).
pub struct Node<S, C, E, T, B, const EPS: usize = MAX_EPS>
where
    S: Storage,
    C: CacheRef,
    E: DerefMut<Target = [SaEntry]>,
    T: DerefMut<Target = [TableSlot<B>]>,
    B: DerefMut<Target = [u8]>,
{
    resolver: Resolver<S, C>,
    sa: SaChannel<E, T, B>,
    sa_cfg: SaConfig,
    eps: [EpSa; EPS],
    /// When the SM addresses are read again (`ud`).
    next_sm_check: Millis,
    /// The SM check in progress: the next endpoint id to ask [`Output::ReadSm`] for.
    sm_reading: Option<usize>,
    /// An event of the last input, not yet polled.
    event: Option<Event>,
    /// A `ud` query done by the last input, not yet polled (after the outputs it led to).
    done: Option<(u64, bool)>,
}

impl<S, C, E, T, B, const EPS: usize> Node<S, C, E, T, B, EPS>
where
    S: Storage,
    C: CacheRef,
    E: DerefMut<Target = [SaEntry]>,
    T: DerefMut<Target = [TableSlot<B>]>,
    B: DerefMut<Target = [u8]>,
{
    /// A node of `resolver` whose SA MADs go as `sa` says. The `ud` transport's SA channel
    /// holds up to `entries.len()` outstanding requests and `tables.len()` half-world tables
    /// at once (empty storage is fine for [`Transport::Core`]); `key` keys its wire TIDs
    /// (random, secret from the fabric).
    pub fn new(
        resolver: Resolver<S, C>,
        sa: SaConfig,
        entries: E,
        tables: T,
        key: [u64; 2],
    ) -> Self {
        Self::from_parts(resolver, SaChannel::new(entries, tables, key), sa)
    }

    /// A node of `resolver` and the SA channel `channel` (as [`into_parts`](Self::into_parts)
    /// gave it back, emptied or not).
    pub fn from_parts(
        mut resolver: Resolver<S, C>,
        channel: SaChannel<E, T, B>,
        sa: SaConfig,
    ) -> Self {
        resolver.set_transport(sa.carries());
        Node {
            resolver,
            sa: channel,
            sa_cfg: sa,
            eps: [EpSa::NONE; EPS],
            next_sm_check: 0,
            sm_reading: None,
            event: None,
            done: None,
        }
    }

    /// The resolver (its cache, stats, config).
    pub fn resolver(&self) -> &Resolver<S, C> {
        &self.resolver
    }

    /// The SA channel (its counters: forged, unknown, re-sends, timeouts).
    pub fn sa(&self) -> &SaChannel<E, T, B> {
        &self.sa
    }

    /// Nothing outstanding: the resolver idle ([`Resolver::is_idle`]) and no SA request
    /// in the channel.
    pub fn is_idle(&self) -> bool {
        self.resolver.is_idle() && self.sa.is_empty()
    }

    /// How SA MADs leave.
    pub fn transport(&self) -> Transport {
        self.sa_cfg.transport
    }

    /// How SA MADs leave, their tries and per-try wait.
    pub fn sa_config(&self) -> SaConfig {
        self.sa_cfg
    }

    /// The resolver's counters, with the SA channel's: its replies that matched nothing
    /// counted as the resolver's own unknown replies, and what it refused as forged.
    pub fn stats(&self) -> Stats {
        let mut s = self.resolver.stats();
        s.sa_unknown += self.sa.unknown;
        s.sa_forged = self.sa.forged;
        s
    }

    /// The resolver and the SA channel back (after a caught panic the caller builds a fresh
    /// resolver around the cache's writer and reuses the channel's storage).
    pub fn into_parts(self) -> (Resolver<S, C>, SaChannel<E, T, B>) {
        (self.resolver, self.sa)
    }

    /// Opens endpoint `ep` at cache number `cache_ep` ([`Resolver::handle_open`]); `sm`:
    /// where its port's SM is now (`None`: not known yet; read again every [`SM_CHECK_MS`]).
    pub fn handle_open(
        &mut self,
        now: Millis,
        ep: EpId,
        cache_ep: CacheEp,
        cfg: EpConfig,
        sm: Option<SmAddr>,
    ) -> Result<(), crate::resolver::Error> {
        if ep.index() >= EPS {
            return Err(crate::resolver::Error::Capacity);
        }
        self.resolver.handle_open(now, ep, cache_ep, cfg)?;
        self.eps[ep.index()] = EpSa {
            open: true,
            qp: cfg.qpn != 0,
            sa_pkey: cfg.sa_pkey,
            port_gid: cfg.port_gid,
            subnet_timeout_ms: cfg.subnet_timeout_ms.min(u64::from(u32::MAX)) as u32,
            sm: if self.sa_cfg.transport == Transport::Ud {
                sm
            } else {
                None
            },
        };
        Ok(())
    }

    /// Closes endpoint `ep` ([`Resolver::handle_close`]); its SA requests are forgotten (the
    /// resolver forgot their queries: their replies match nothing). If its QP carried other
    /// endpoints' SA MADs, their requests in flight go again at once on what carries them
    /// now: another endpoint of the port on the SA's P_Key, or the core's service
    /// ([`SaChannel::handle_carrier_gone`]).
    pub fn handle_close(&mut self, now: Millis, ep: EpId) {
        self.resolver.handle_close(now, ep);
        self.sa.drop_endpoint(ep, |_, _| {});
        let Some(closed) = self.eps.get(ep.index()).copied() else {
            return;
        };
        // The endpoints it carries, asked while it is still open (their requests only go
        // again at the next poll, routed as the endpoints are then).
        if closed.carries() {
            let others = (0..EPS).filter(|&i| i != ep.index() && self.eps[i].open);
            for owner in others.filter_map(EpId::from_index) {
                if carrier_in(&self.eps, owner) == Some(ep) {
                    self.sa.handle_carrier_gone(now, owner);
                }
            }
        }
        self.eps[ep.index()].open = false;
    }

    /// A client reregister on `ep`'s port ([`Resolver::handle_reregister`]).
    pub fn handle_reregister(&mut self, now: Millis, ep: EpId, cache_ep: CacheEp) {
        self.resolver.handle_reregister(now, ep, cache_ep);
    }

    /// Answers everything waiting ENODATA and refuses what comes later
    /// ([`Resolver::handle_shutdown`]); poll its outputs, then [`clear`](Self::clear).
    pub fn handle_shutdown(&mut self, now: Millis) {
        self.resolver.handle_shutdown(now);
    }

    /// Empties the path cache, every endpoint's entries ([`Resolver::clear_cache`]); what is
    /// outstanding stays.
    pub fn clear_cache(&mut self) {
        self.resolver.clear_cache();
    }

    /// Empties the cache and the SA channel (after a shutdown, or before a fresh resolver).
    pub fn clear(&mut self) {
        self.resolver.clear_cache();
        self.sa.clear();
        self.event = None;
        self.done = None;
    }

    /// A local address of `ep` ([`Resolver::handle_add_address`]).
    pub fn handle_add_address(
        &mut self,
        now: Millis,
        ep: EpId,
        cache_ep: CacheEp,
        kind: AddrKind,
        addr: &[u8; 64],
    ) -> Result<(), crate::resolver::Error> {
        self.resolver
            .handle_add_address(now, ep, cache_ep, kind, addr)
    }

    /// A local address of `ep` removed ([`Resolver::handle_remove_address`]).
    pub fn handle_remove_address(
        &mut self,
        now: Millis,
        ep: EpId,
        kind: AddrKind,
        addr: &[u8; 64],
    ) {
        self.resolver.handle_remove_address(now, ep, kind, addr);
    }

    /// A hosts-file mapping of `ep`: `addr` is `gid` ([`Resolver::handle_preload_address`]).
    pub fn handle_preload_address(
        &mut self,
        now: Millis,
        ep: EpId,
        kind: AddrKind,
        addr: &[u8; 64],
        gid: Gid,
    ) -> Result<(), crate::resolver::Error> {
        self.resolver
            .handle_preload_address(now, ep, kind, addr, gid)
    }

    /// A preloaded route of `ep` ([`Resolver::handle_preload_route`]).
    pub fn handle_preload_route(
        &mut self,
        now: Millis,
        ep: EpId,
        cache_ep: CacheEp,
        path: &[u8; 64],
    ) {
        self.resolver.handle_preload_route(now, ep, cache_ep, path);
    }

    /// A client request, classified by the caller's front already (`req.head.target`) or to be
    /// classified here (`None`) ([`Resolver::handle_request`]).
    pub fn handle_request(&mut self, now: Millis, req: &Request<'_>) {
        self.resolver.handle_request(now, req);
    }

    /// The core's SA service completed [`Output::CoreSa`] `token`: the reply (`umad_status`
    /// 0) or the MAD as sent with the service's failure status.
    pub fn handle_core_sa(&mut self, now: Millis, token: u64, umad_status: u32, mad: &[u8]) {
        self.resolver.handle_sa(now, token, umad_status, mad);
    }

    /// SA query `token` did not leave (its [`Output::Transmit`] or [`Output::CoreSa`]), for
    /// reason `why`, handled once here: see [`Unsent`]. A token that is not outstanding is
    /// ignored.
    pub fn handle_unsent(&mut self, now: Millis, token: u64, why: Unsent) {
        match why {
            Unsent::Refused => self.resolver.handle_sa(now, token, UNSENT, &[]),
            Unsent::Busy => {
                let _ = self.sa.handle_unsent(now, token);
            }
            Unsent::Failed => {}
        }
    }

    /// A MAD received on endpoint `ep`'s UD QP (`mad`: the 256 bytes after the GRH; `meta`
    /// from its completion). Class 3 goes to the SA channel (only the SM speaks it to us; a
    /// reply completes its query, a Report goes to the resolver), the rest to the resolver as
    /// ACM.
    pub fn handle_receive(&mut self, now: Millis, ep: EpId, meta: &RecvMeta, mad: &[u8; MAD_LEN]) {
        let class = Header::new_unchecked(&mad[..HEADER_LEN]).mgmt_class();
        if class != MgmtClass::SubnAdm {
            self.resolver.handle_acm(now, ep, meta, &mad[..]);
            return;
        }
        let sm = self.eps.get(ep.index()).and_then(|e| e.sm);
        let eps = &self.eps;
        let carries = |owner: EpId| carrier_in(eps, owner) == Some(ep);
        match self.sa.handle_receive(now, meta, sm, carries, mad) {
            Received::Reply { token, mad } => {
                self.resolver.handle_sa(now, token, 0, &mad);
                self.done = Some((token, true));
            }
            Received::Table { token, slot } => {
                let table = self.sa.table(slot);
                let records = table.map_or(0, |t| t.records.len() / PATH_RECORD_LEN);
                self.event = Some(Event::TableReceived { records });
                let table = table.ok_or(TableError::Failed);
                self.resolver.handle_sa_table(now, token, table);
                self.done = Some((token, true));
            }
            Received::TableFailed { token, failure } => self.table_failed(now, token, failure),
            Received::Report => self.report(now, ep, mad),
            // Counted by the channel (`forged`, `unknown`; `stats` adds the unknown).
            Received::Segment | Received::Forged | Received::Unknown => {}
        }
    }

    /// Where endpoint `ep`'s port's SM is now (asked for by [`Output::ReadSm`]), its cache
    /// number `cache_ep`. A new SM LID drops what was learned from the old fabric state and
    /// subscribes again, as a client reregister does.
    pub fn handle_sm(&mut self, now: Millis, ep: EpId, cache_ep: CacheEp, sm: Option<SmAddr>) {
        let Some(e) = self.eps.get_mut(ep.index()) else {
            return;
        };
        let Some(sm) = sm else {
            return;
        };
        if self.sa_cfg.transport != Transport::Ud || !e.open || e.sm == Some(sm) {
            return;
        }
        if let Some(old) = e.sm.replace(sm) {
            self.event = Some(Event::SmChanged { ep, old, new: sm });
            self.resolver.handle_reregister(now, ep, cache_ep);
        }
    }

    /// Runs what is due at `now`: the resolver's timers, the SA channel's tries and transfer
    /// timers, the SM check. Calling it early or often is harmless.
    pub fn handle_timeout(&mut self, now: Millis) {
        if self.resolver.poll_timeout().is_some_and(|at| at <= now) {
            self.resolver.handle_timeout(now);
        }
        if self.sa.poll_timeout().is_some_and(|at| at <= now) {
            self.sa.handle_timeout(now);
        }
        if self.sa_cfg.transport == Transport::Ud && now >= self.next_sm_check {
            self.next_sm_check = now.saturating_add(SM_CHECK_MS);
            self.sm_reading = Some(0);
        }
    }

    /// When to call [`handle_timeout`](Self::handle_timeout) next (`None`: nothing armed). It
    /// may be early, never late.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        let sm = (self.sa_cfg.transport == Transport::Ud).then_some(self.next_sm_check);
        [self.resolver.poll_timeout(), self.sa.poll_timeout(), sm]
            .into_iter()
            .flatten()
            .min()
    }

    /// The next thing for the caller to do at `now`, `None` when there is nothing. Call it
    /// until `None` after every input. An [`Output::Answer`]'s message is built into `msg`
    /// (its first `len` bytes, [`MsgBuf::message`]), where the caller hands it on; other
    /// outputs leave `msg` alone.
    #[must_use]
    pub fn poll_output(&mut self, now: Millis, msg: &mut MsgBuf) -> Option<Output> {
        loop {
            // What the channel has to send: RMPP ACKs/STOPs/ABORTs, requests whose try ran out
            // or whose carrier closed.
            if let Some(send) = self.sa.poll_transmit() {
                if let Some((qp, sm)) = self.route(send.ep) {
                    return Some(transmit(qp, sm, send.mad, None));
                }
                // No carrier (it closed) or no SM any more: a request goes on through the
                // core's service, as one that found no carrier at its first send does; an
                // ACK is dropped (the transfer's timers go on without it).
                let Some(token) = send.request else {
                    continue;
                };
                let Some(mad) = self.sa.withdraw(token) else {
                    continue;
                };
                // Its `ud` query is over either way; refused (a GetTable), it says so now.
                return Some(self.for_core(now, (send.ep, token), &mad, true).unwrap_or(
                    Output::QueryDone {
                        token,
                        replied: false,
                    },
                ));
            }
            if let Some(e) = self.event.take() {
                return Some(Output::Event(e));
            }
            if self.done.is_none() {
                match self.sa.poll_expired() {
                    Some(Expired::Failed { token, mad }) => {
                        self.resolver.handle_sa(now, token, TIMED_OUT, &mad);
                        self.done = Some((token, false));
                        continue;
                    }
                    Some(Expired::TableFailed { token, failure }) => {
                        self.table_failed(now, token, failure);
                        continue;
                    }
                    None => {}
                }
            }
            if let Some(ep) = self.next_sm_read() {
                return Some(Output::ReadSm { ep });
            }
            // Looked at where it was returned, not moved out of its `Option` (a copy as large
            // as the largest output), and each field copied once into the node's output.
            use crate::resolver::Output as R;
            let o = self.resolver.poll_output(msg);
            let Some(o) = &o else {
                return self
                    .done
                    .take()
                    .map(|(token, replied)| Output::QueryDone { token, replied });
            };
            if let R::SendSa { ep, token, mad } = o {
                match self.send_sa(now, *ep, *token, mad) {
                    Some(o) => return Some(o),
                    None => continue,
                }
            }
            return Some(passed(o));
        }
    }

    /// The resolver's SA MAD `mad` of endpoint `ep` on its way: on the carrier's QP to the
    /// SM (tracked for its tries unless it is a response), or to the core's service; `None`
    /// when it was settled here (no room, or a table the core's service cannot carry).
    fn send_sa(
        &mut self,
        now: Millis,
        ep: EpId,
        token: u64,
        mad: &[u8; MAD_LEN],
    ) -> Option<Output> {
        let Some((qp, sm)) = self.route(ep) else {
            return self.for_core(now, (ep, token), mad, false);
        };
        let subnet = self.eps.get(qp.index()).map_or(0, |e| e.subnet_timeout_ms);
        let (per_try, tries) = (self.sa_cfg.per_try(subnet), self.sa_cfg.try_count());
        // A response (a ReportResp) goes as it is: no query, nothing to complete.
        let query = (!Header::new_unchecked(&mad[..HEADER_LEN])
            .method()
            .is_response())
        .then_some(token);
        match self.sa.start(now, ep, token, mad, per_try, tries) {
            Some(wire) => Some(transmit(qp, sm, wire, query)),
            None => {
                self.event = Some(Event::SaFull { ep });
                self.resolver.handle_sa(now, token, UNSENT, &[]);
                None
            }
        }
    }

    /// SA MAD `mad` of endpoint `ep` for the core's service, `None` when it was settled here:
    /// a GetTable, which the core's service cannot carry (it reads one MAD per answer), goes
    /// back to the resolver refused.
    fn for_core(
        &mut self,
        now: Millis,
        (ep, token): (EpId, u64),
        mad: &[u8; MAD_LEN],
        moved: bool,
    ) -> Option<Output> {
        if Header::new_unchecked(&mad[..HEADER_LEN]).method() == Method::GetTable {
            let e = Err(TableError::NotCarried);
            self.resolver.handle_sa_table(now, token, e);
            return None;
        }
        Some(Output::CoreSa {
            ep,
            token,
            mad: *mad,
            moved,
        })
    }

    /// The carrier of `ep`'s SA MADs and its port's SM (`ud` transport), `None` when they go
    /// through the core's service.
    fn route(&self, ep: EpId) -> Option<(EpId, SmAddr)> {
        if self.sa_cfg.transport != Transport::Ud {
            return None;
        }
        let qp = carrier_in(&self.eps, ep)?;
        Some((qp, self.eps.get(qp.index())?.sm?))
    }

    /// The next endpoint of the SM check in progress (one with a QP).
    fn next_sm_read(&mut self) -> Option<EpId> {
        let from = self.sm_reading?;
        match (from..EPS).find(|&i| self.eps[i].open && self.eps[i].qp) {
            Some(i) => {
                self.sm_reading = Some(i + 1);
                EpId::from_index(i)
            }
            None => {
                self.sm_reading = None;
                None
            }
        }
    }

    /// A half-world table that brought nothing: the resolver goes on with Gets.
    fn table_failed(&mut self, now: Millis, token: u64, failure: Failure) {
        let err = match failure {
            Failure::TooBig { .. } => TableError::TooBig,
            _ => TableError::Failed,
        };
        self.event = Some(Event::TableFailed { failure });
        self.resolver.handle_sa_table(now, token, Err(err));
        self.done = Some((token, false));
    }

    /// A Report from the SM (trap 64/65): the resolver's; an event when it took it.
    fn report(&mut self, now: Millis, ep: EpId, mad: &[u8; MAD_LEN]) {
        let before = self.resolver.stats();
        self.resolver.handle_report(now, ep, mad);
        let after = self.resolver.stats();
        if after.reports > before.reports {
            // The resolver took it as a Report, so its Notice parses.
            let notice = NoticeRepr::parse_bytes(&mad[SA_DATA..]).ok();
            self.event = Some(Event::Report {
                ep,
                trap: notice.map_or(0, |n| n.trap),
                gid: notice.and_then(|n| n.subject_gid()).map_or(Gid::ZERO, Gid),
                invalidated: after.report_invalidated - before.report_invalidated,
            });
        }
    }
}

/// A node whose SA channel's storage is on the heap (a host's: the plugin's loop, the
/// simulator, the benches, the fuzz targets).
#[cfg(feature = "std")]
pub type HeapNode<S, C> = Node<S, C, Vec<SaEntry>, Vec<TableSlot<Vec<u8>>>, Vec<u8>>;

#[cfg(feature = "std")]
impl<S: Storage, C: CacheRef> HeapNode<S, C> {
    /// A node of `resolver` whose SA MADs go as `sa` says, its SA channel on the heap: room
    /// for `requests` outstanding SA requests and `tables` half-world tables of up to
    /// `records` PathRecords each (all 0 for [`Transport::Core`]); `key` keys its wire TIDs.
    pub fn on_heap(
        resolver: Resolver<S, C>,
        sa: SaConfig,
        requests: usize,
        tables: usize,
        records: usize,
        key: [u64; 2],
    ) -> Self {
        let slot = || TableSlot::new(vec![0u8; records * PATH_RECORD_LEN], Default::default());
        let tables = (0..tables).map(|_| slot()).collect();
        Node::new(resolver, sa, vec![SaEntry::EMPTY; requests], tables, key)
    }
}

/// The endpoint whose UD QP carries `ep`'s SA MADs: `ep` itself if its QP is on the port's SA
/// P_Key ([`EpConfig::sa_pkey`]), else an open endpoint of the same port (same GID 0) whose
/// QP is. The SM's port drops MADs of a partition it is not in, so an endpoint of another
/// partition cannot reach the SA on its own QP; with no carrier on the port, its MADs go
/// through the core's service. Replies come back on that QP and are matched to `ep`'s query
/// by the SA channel. An endpoint being closed still carries its own last MADs (its leaves).
fn carrier_in(eps: &[EpSa], ep: EpId) -> Option<EpId> {
    let own = eps.get(ep.index())?;
    if own.qp && own.sa_pkey {
        return Some(ep);
    }
    let gid = own.port_gid;
    eps.iter()
        .position(|e| e.carries() && e.port_gid == gid)
        .and_then(EpId::from_index)
}

/// `mad` on `qp`'s QP to the SM's QP1.
fn transmit(qp: EpId, sm: SmAddr, mad: [u8; MAD_LEN], query: Option<u64>) -> Output {
    Output::Transmit {
        qp,
        to: sm.dest(),
        mad,
        query,
    }
}

/// The node's output for the resolver's output `o`, passed on as it is, each field copied
/// once: an output is the size of its largest variant (a MAD's), and one moved by value
/// from one enum to the other is taken apart and put together again field by field. Kept out
/// of line: inlined into a caller's drain loop, that took kilobytes of flash and thousands of
/// instructions per output on a Cortex-M4 (docs/firmware.md). [`Node::poll_output`] routes
/// an SA MAD through [`Node::send_sa`] before it gets here (its carrier, tries and table
/// rules); one that came here unrouted would be the core's service's, as one with no carrier.
#[inline(never)]
fn passed(o: &crate::resolver::Output) -> Output {
    use crate::resolver::Output as R;
    match o {
        R::SendSa { ep, token, mad } => Output::CoreSa {
            ep: *ep,
            token: *token,
            mad: *mad,
            moved: false,
        },
        R::SendAcm { ep, to, mad } => Output::Transmit {
            qp: *ep,
            to: *to,
            mad: *mad,
            query: None,
        },
        R::Answer(a) => Output::Answer(*a),
        R::Attach { ep, group } => Output::Attach {
            ep: *ep,
            group: *group,
        },
        R::Detach { ep, group } => Output::Detach {
            ep: *ep,
            group: *group,
        },
        R::Count { ep, counter } => Output::Count {
            ep: *ep,
            counter: *counter,
        },
    }
}
