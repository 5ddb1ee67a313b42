//! The resolver's settings ([`Config`]) and how an `ibacm_opts.cfg` gives them.

use super::table;
use super::Millis;
use crate::text::opts::{AddrProt, LoopbackProt, ProviderOptions, RouteProt};
use crate::wire::rate::{Mtu, Rate};

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
    /// SA queries in flight per port (the rest wait FIFO), unless the transport sets its own
    /// ([`Carries::window`](super::Carries::window): the core's service, `sa_depth`).
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
    /// An SA query with no reply after this long is answered ETIMEDOUT (plus, on a transport
    /// whose tries each wait the port's subnet timeout, one subnet timeout per try:
    /// [`Carries::subnet_waits`](super::Carries::subnet_waits)).
    pub sa_deadline: Millis,
    /// Subscribe to SA Reports (traps 64/65) on every endpoint with a UD QP and invalidate
    /// what they name, where the transport brings them to that QP
    /// ([`Carries::reports`](super::Carries::reports): the `ud` transport's do).
    pub sa_reports: bool,
    /// `min_mtu` as `enum ibv_mtu` (base group).
    pub min_mtu: u8,
    /// `min_rate` as `enum ibv_rate` (base group).
    pub min_rate: u8,
    /// How long a request may wait in a queue (the SA backlog, the ACM window queue, an
    /// endpoint not joined yet) before it is answered (ETIMEDOUT; ENODATA while the endpoint
    /// has not joined its group): `sa_deadline × (retries + 1)`.
    pub queue_deadline: Millis,
    /// Ask for half-world tables, where the transport reassembles RMPP answers and gives them
    /// to [`Resolver::handle_sa_table`](super::Resolver::handle_sa_table)
    /// ([`Carries::tables`](super::Carries::tables): the `ud` transport's
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
    /// Warm start (`acmrs_warm_start_ms`, 0 = off): an endpoint that opens asks for its
    /// port's half-world table at a random time within this many ms (so a whole cluster
    /// booting at once does not ask at once). See [`table`].
    pub warm_start: Millis,
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
            sa_window: o.acmrs_sa_window.max(1),
            sa_window_start: o.acmrs_sa_window_start.max(1),
            sa_busy_retries: o.acmrs_sa_retries,
            sa_busy_backoff: u64::from(o.acmrs_sa_busy_backoff_ms),
            sa_deadline,
            sa_reports: true,
            min_mtu: min_mtu.into(),
            min_rate: min_rate.into(),
            queue_deadline: sa_deadline.saturating_mul(u64::from(o.retries) + 1),
            sa_tables: true,
            sa_table_min: o.acmrs_sa_table_min,
            sa_get_cost_ns: table::OPENSM_GET_NS,
            sa_record_cost_ns: table::OPENSM_RECORD_NS,
            sa_table_room: table::room_for(o.acmrs_path_capacity),
            warm_start: u64::from(o.acmrs_warm_start_ms),
        }
    }
}

impl Default for Config {
    /// [`Config::from_options`] of the default options.
    fn default() -> Self {
        Config::from_options(&ProviderOptions::default())
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
        assert!(c.sa_reports);
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
        // The transport is not the resolver's: what it asks for is the same on both (the node
        // limits it to what its transport carries, `SaConfig::carries`).
        let (core_o, _) = ProviderOptions::load(
            b"acmrs_sa_transport core\nsa_depth 4\nacmrs_sa_window 99\n",
            |e| panic!("{e:?}"),
        );
        let core = Config::from_options(&core_o);
        assert_eq!(
            (core.sa_window, core.sa_reports, core.sa_tables),
            (99, true, true)
        );
        let (w, _) = ProviderOptions::load(b"acmrs_sa_window 99\n", |e| panic!("{e:?}"));
        assert_eq!(Config::from_options(&w).sa_window, 99);
        assert_eq!((c.min_mtu, c.min_rate, c.acm_window), (5, 7, 3));
        assert_eq!((c.route_ttl, c.addr_ttl), (Some(120_000), None));
        // ibacmp's resolve_depth is a floor of the window.
        let (o, _) = ProviderOptions::load(b"resolve_depth 40\n", |e| panic!("{e:?}"));
        assert_eq!(Config::from_options(&o).acm_window, 40);
    }
}
