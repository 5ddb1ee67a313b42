//! `ibacm_opts.cfg`: the flat `name value` option file shared by the ibacm core and providers.
//!
//! Format, as the core and ibacmp read it (contract 3.2, 4.2):
//!
//! * one `name value` pair per line; only the **first token** of the value is used;
//! * `#` starts a comment **only in column 0**;
//! * unknown names are ignored (every parser scans the whole file);
//! * names are case-insensitive.
//!
//! Decisions where ibacm is quirky (see `docs/text.md`):
//!
//! * **`route_timeout` case**: ibacmp matches it with `strcmp` (case-sensitively) while every
//!   other name is case-insensitive. We match it case-insensitively like the rest: a file that
//!   says `Route_Timeout 5` means it, and treating one name differently is a bug, not a feature.
//! * **Long lines**: the core and ibacmp read lines with `fgets` into 120-byte buffers, so a line
//!   longer than [`MAX_LINE`] bytes is split and its tail parsed as a line of its own. We do not
//!   reproduce that: a non-comment line longer than [`MAX_LINE`] is rejected with
//!   [`ErrorKind::LineTooLong`] and none of it is applied. Comment lines of any length are
//!   skipped.
//! * **Invalid values**: ibacmp uses `atoi` (garbage silently becomes 0) and keeps the old value
//!   for unknown keywords. We reject garbage numbers, out-of-range numbers and unknown keywords
//!   with a [`LineError`] and keep the previous value.
//! * **`route_preload`** accepts both `opensm_full_v1` (the code's spelling) and
//!   `full_opensm_v1` (the man page's), and `none`/`no`.
//! * Paths longer than [`PATH_MAX`] bytes are rejected (ibacmp would overflow its buffer).
//! * An indented `#` (not column 0) is, for ibacm, an unknown option name; we skip it quietly.

use super::{is_space, parse_i64, ErrorKind, LineError, Lines, Tokens};
use heapless::String;

/// Longest line (without its newline) ibacm reads whole: `fgets` into `char s[120]`.
pub const MAX_LINE: usize = 119;
/// Longest path value ibacmp can store (`char route_data_file[128]`, NUL included).
pub const PATH_MAX: usize = 127;
/// A fixed-capacity path string.
pub type PathString = String<128>;

/// One `name value` line as written, before interpretation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionLine<'a> {
    /// 1-based line number.
    pub line: u32,
    /// The option name as written (case preserved).
    pub name: &'a str,
    /// The first token of the value, if any.
    pub value: Option<&'a str>,
}

/// Iterator over the option lines of an `ibacm_opts.cfg` image; skips blank lines and comments.
#[derive(Debug, Clone)]
pub struct OptionLines<'a> {
    lines: Lines<'a>,
}

impl<'a> OptionLines<'a> {
    /// Option lines of `input`.
    pub const fn new(input: &'a [u8]) -> Self {
        OptionLines {
            lines: Lines::new(input),
        }
    }
}

impl<'a> Iterator for OptionLines<'a> {
    type Item = Result<OptionLine<'a>, LineError>;

    fn next(&mut self) -> Option<Self::Item> {
        for raw in self.lines.by_ref() {
            let err = |kind| {
                Some(Err(LineError {
                    line: raw.number,
                    kind,
                }))
            };
            if raw.bytes.first() == Some(&b'#') {
                continue;
            }
            let mut tokens = Tokens::new(raw.bytes);
            let Some(name) = tokens.next() else {
                continue;
            };
            if name.first() == Some(&b'#') {
                continue;
            }
            // Count the line as the core would see it, trailing whitespace included.
            if raw.bytes.len() > MAX_LINE {
                return err(ErrorKind::LineTooLong);
            }
            let Ok(name) = core::str::from_utf8(name) else {
                return err(ErrorKind::NotUtf8);
            };
            let value = match tokens.next().map(core::str::from_utf8) {
                None => None,
                Some(Ok(v)) => Some(v),
                Some(Err(_)) => return err(ErrorKind::NotUtf8),
            };
            return Some(Ok(OptionLine {
                line: raw.number,
                name,
                value,
            }));
        }
        None
    }
}

/// ibacmp's `addr_prot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrProt {
    /// The ACM multicast protocol (the only one ibacmp implements).
    Acm,
    /// acmrs only: no address protocol; names and IPs resolve only from the hosts preload and
    /// the endpoint's own addresses (anything else answers ENODATA at once).
    None,
}

/// ibacmp's `route_prot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteProt {
    /// SA PathRecord query.
    Sa,
    /// Build the path from multicast-group data.
    Acm,
}

/// `acmrs_sa_transport`: how SA MADs (PathRecord queries, group joins, InformInfo) travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaTransport {
    /// The dataplane's own UD QP sends to the SM's QP1 with the GSI Q_Key and the SA answers
    /// that QP: `acmrs_sa_window` queries in flight, and SA Reports (fabric changes) arrive.
    Ud,
    /// The core's SA service (`acm_send_sa_mad`): `sa_depth` in flight, no Reports.
    Core,
}

/// ibacmp's `loopback_prot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopbackProt {
    /// No special handling of the EP's own addresses.
    None,
    /// Pre-seed a READY self entry.
    Local,
}

/// ibacmp's `route_preload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutePreload {
    /// No route preload.
    None,
    /// OpenSM `dump_pr` full format (`opensm_full_v1`, alias `full_opensm_v1`).
    OpensmFullV1,
}

/// ibacmp's `addr_preload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrPreload {
    /// No address preload.
    None,
    /// `ibacm_hosts.data` format.
    AcmHosts,
}

/// `acmrs_poll_mode`: how the provider's worker waits for completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Spin without sleeping (lowest latency, burns a core).
    Busy,
    /// Spin for a while, then block on the completion channel.
    Adaptive,
    /// Always block on the completion channel.
    Event,
}

/// A cache-entry lifetime in minutes, as ibacmp's `addr_timeout`/`route_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// `-1`: never expires.
    Never,
    /// Expires after this many minutes.
    Minutes(u32),
}

impl Lifetime {
    /// The lifetime in milliseconds, `None` for [`Lifetime::Never`].
    pub const fn as_millis(self) -> Option<u64> {
        match self {
            Lifetime::Never => None,
            Lifetime::Minutes(m) => Some(m as u64 * 60_000),
        }
    }
}

/// Every option an acmrs provider reads from `ibacm_opts.cfg`, typed, with defaults.
///
/// Field names equal option names. Defaults are ibacmp's (acmp.c) and the core's (acm.c) for
/// their options, and ours for the `acmrs_*` ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderOptions {
    /// `addr_prot` (default `acm`).
    pub addr_prot: AddrProt,
    /// `addr_timeout` in minutes (default 1440, `-1` = never).
    pub addr_timeout: Lifetime,
    /// `route_prot` (default `sa`).
    pub route_prot: RouteProt,
    /// `route_timeout` in minutes (default `-1` = never).
    pub route_timeout: Lifetime,
    /// `loopback_prot` (default `local`).
    pub loopback_prot: LoopbackProt,
    /// `timeout` in ms (default 2000); shared with the core (SA MAD timeout).
    pub timeout: u32,
    /// `retries` (default 2); shared with the core (SA MAD retries).
    pub retries: u32,
    /// `resolve_depth` (default 1), credits for multicast resolves per EP.
    pub resolve_depth: u32,
    /// `send_depth` (default 1), credits for unicast ACM responses per EP.
    pub send_depth: u32,
    /// `recv_depth` (default 1024), receive buffers per EP.
    pub recv_depth: u32,
    /// `min_mtu` in bytes (default 2048; 256, 512, 1024, 2048 or 4096).
    pub min_mtu: u16,
    /// `min_rate` in Gb/s as `acm_convert_rate` takes it (default 10).
    pub min_rate: u16,
    /// `route_preload` (default `none`).
    pub route_preload: RoutePreload,
    /// `route_data_file` (default `/etc/rdma/ibacm_route.data`).
    pub route_data_file: PathString,
    /// `addr_preload` (default `none`).
    pub addr_preload: AddrPreload,
    /// `addr_data_file` (default `/etc/rdma/ibacm_hosts.data`).
    pub addr_data_file: PathString,
    /// Core `sa_depth` (default 1): outstanding SA MADs per port the core allows.
    pub sa_depth: u32,
    /// Core `log_level` (default 0; 0..=2).
    pub log_level: u8,
    /// `acmrs_path_capacity` (default 65536; 1..=16M): path-record cache entries.
    pub acmrs_path_capacity: u32,
    /// `acmrs_addr_capacity` (default 65536; 1..=16M): most addresses loaded from the
    /// `addr_data_file` preload (the rest is logged and ignored).
    pub acmrs_addr_capacity: u32,
    /// `acmrs_pending_capacity` (default 4096): distinct destinations in flight at once.
    pub acmrs_pending_capacity: u32,
    /// `acmrs_request_capacity` (default 16384): queued client requests.
    pub acmrs_request_capacity: u32,
    /// `acmrs_route_ttl_ms` (default 0 = use `route_timeout`): sub-minute route lifetime.
    pub acmrs_route_ttl_ms: u32,
    /// `acmrs_negative_ttl_ms` (default 5000; 0 = no negative caching).
    pub acmrs_negative_ttl_ms: u32,
    /// `acmrs_refresh_ahead_pct` (default 10; 0..=99): refresh a route in the background when
    /// less than this share of its lifetime remains (0 = never refresh ahead).
    pub acmrs_refresh_ahead_pct: u8,
    /// `acmrs_sa_timeout_ms` (default 0; 0..=3_600_000): how long a client waits for an SA
    /// answer before ETIMEDOUT; 0 = the core's whole budget, `timeout × (retries + 1)` + 1 s.
    pub acmrs_sa_timeout_ms: u32,
    /// `acmrs_sa_retries` (default 3): retries of our own layer on top of the core's.
    pub acmrs_sa_retries: u32,
    /// `acmrs_sa_busy_backoff_ms` (default 100): wait after an SA BUSY status.
    pub acmrs_sa_busy_backoff_ms: u32,
    /// `acmrs_poll_mode` (unset by default: `busy` when `acmrs_cpu` pins the dataplane thread
    /// to a core, else `adaptive`; see [`ProviderOptions::poll_mode`]).
    pub acmrs_poll_mode: Option<PollMode>,
    /// `acmrs_cpu` (default -1 = do not pin): CPU to pin the dataplane thread to.
    pub acmrs_cpu: i32,
    /// `acmrs_log_level` (default unset = follow `log_level`; 0..=4, `-1` = unset).
    pub acmrs_log_level: Option<u8>,
    /// `acmrs_acm_window` (default 16; 1..=65536): ACM multicast address queries in flight per
    /// endpoint at once (ibacmp: `resolve_depth`, 1); the rest wait FIFO.
    pub acmrs_acm_window: u32,
    /// `acmrs_sa_transport` (default `ud`; `ud` | `core`): see [`SaTransport`]. An endpoint
    /// without a UD QP uses the core's service whatever this says.
    pub acmrs_sa_transport: SaTransport,
    /// `acmrs_sa_window` (default 16; 1..=4096): the most SA queries in flight per port over
    /// the `ud` transport (halved on a BUSY or a lost query, shrunk when the SA's round trip
    /// grows, regrown by one per window of answers); with `core`, `sa_depth` is the window.
    pub acmrs_sa_window: u32,
    /// `acmrs_sa_window_start` (default 1; 1..=4096): the window an SA client starts with;
    /// it grows by one query per answer while the SA's round trip stays low (slow start), up
    /// to `acmrs_sa_window`.
    pub acmrs_sa_window_start: u32,
    /// `acmrs_sa_table_min` (default 32; 0..=1048576, 0 = never): over the `ud` transport, a
    /// port whose backlog holds this many route queries asks the SA for its whole half-world
    /// PathRecord table (one GetTable over RMPP) instead of one Get per destination; once a
    /// table's size is known, the backlog must also make the Gets cost the SA more than the
    /// table would (OpenSM's measured costs).
    pub acmrs_sa_table_min: u32,
    /// `acmrs_warm_start_ms` (default 0 = off; 0..=3600000 ms; its former name
    /// `acmrs_route_prefetch` is read as well): over the `ud` transport, an endpoint that
    /// comes up asks for its port's whole half-world PathRecord table (a warm cache) at a
    /// random time within this many ms, so that a cluster booting at once spreads its tables
    /// over that time.
    pub acmrs_warm_start_ms: u32,
    /// `acmrs_prom_file` (default none = off): Prometheus textfile the stats exporter
    /// rewrites atomically every `acmrs_prom_interval_s` (`none` turns it off).
    pub acmrs_prom_file: Option<PathString>,
    /// `acmrs_prom_interval_s` (default 10; 1..=86400): seconds between textfile writes.
    pub acmrs_prom_interval_s: u32,
    /// `acmrs_hit_sample` (default 16; 1..=65536, rounded up to a power of two): one cache hit
    /// in this many is timed for the hit-latency histogram (and counts for this many there),
    /// so timing costs a hit a nanosecond or two on average; 1 = time every hit.
    pub acmrs_hit_sample: u32,
    /// `acmrs_stall_ms` (default 2000; 0 = off, at most 3600000): requests that wait this long
    /// while the dataplane thread runs no round (stuck) are answered ETIMEDOUT by a watchdog
    /// thread, and new ones at once, until it runs again.
    pub acmrs_stall_ms: u32,
    /// `acmrs_stat_socket` (default `/run/acmrs.sock`; `none` = off): unix socket the stats
    /// exporter serves `acmrs-stat` on (at most 107 bytes, the `sun_path` limit).
    pub acmrs_stat_socket: Option<PathString>,
}

/// Most entries any capacity option accepts.
pub const MAX_CAPACITY: u32 = 1 << 24;

impl Default for ProviderOptions {
    fn default() -> Self {
        ProviderOptions {
            addr_prot: AddrProt::Acm,
            addr_timeout: Lifetime::Minutes(1440),
            route_prot: RouteProt::Sa,
            route_timeout: Lifetime::Never,
            loopback_prot: LoopbackProt::Local,
            timeout: 2000,
            retries: 2,
            resolve_depth: 1,
            send_depth: 1,
            recv_depth: 1024,
            min_mtu: 2048,
            min_rate: 10,
            route_preload: RoutePreload::None,
            route_data_file: fixed_path("/etc/rdma/ibacm_route.data"),
            addr_preload: AddrPreload::None,
            addr_data_file: fixed_path("/etc/rdma/ibacm_hosts.data"),
            sa_depth: 1,
            log_level: 0,
            acmrs_path_capacity: 65536,
            acmrs_addr_capacity: 65536,
            acmrs_pending_capacity: 4096,
            acmrs_request_capacity: 16384,
            acmrs_route_ttl_ms: 0,
            acmrs_negative_ttl_ms: 5000,
            acmrs_refresh_ahead_pct: 10,
            acmrs_sa_timeout_ms: 0,
            acmrs_sa_retries: 3,
            acmrs_sa_busy_backoff_ms: 100,
            acmrs_poll_mode: None,
            acmrs_cpu: -1,
            acmrs_log_level: None,
            acmrs_acm_window: 16,
            acmrs_sa_transport: SaTransport::Ud,
            acmrs_sa_window: 16,
            acmrs_sa_window_start: 1,
            acmrs_sa_table_min: 32,
            acmrs_warm_start_ms: 0,
            acmrs_prom_file: None,
            acmrs_prom_interval_s: 10,
            acmrs_hit_sample: 16,
            acmrs_stall_ms: 2000,
            acmrs_stat_socket: Some(fixed_path("/run/acmrs.sock")),
        }
    }
}

fn fixed_path(s: &str) -> PathString {
    let mut p = PathString::new();
    // The defaults are short constants; an impossible overflow leaves the path empty.
    let _ = p.push_str(s);
    p
}

/// What [`ProviderOptions::apply`] did with a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A field of [`ProviderOptions`] was set.
    Set,
    /// A known core option acmrs does not use (`log_file`, `provider`, `server_port`, …).
    Ignored,
    /// A name nobody we know of uses (maybe another provider's).
    Unknown,
}

/// Counts from [`ProviderOptions::update_from`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Option lines seen (not counting blanks and comments).
    pub options: u32,
    /// Options applied to a field.
    pub applied: u32,
    /// Known core options deliberately ignored.
    pub ignored: u32,
    /// Unknown names (ignored).
    pub unknown: u32,
    /// Lines rejected with a [`LineError`] (their value was not applied).
    pub errors: u32,
}

/// Core option names acmrs knows but does not use.
const CORE_IGNORED: &[&str] = &[
    "log_file",
    "umad_debug_level",
    "lock_file",
    "server_port",
    "server_mode",
    "acme_plus_kernel_only",
    "provider_lib_path",
    "support_ips_in_addr_cfg",
    "provider",
];

impl ProviderOptions {
    /// Parses a whole `ibacm_opts.cfg` image over the defaults. Each rejected line is passed to
    /// `on_error` (and its option keeps the default).
    pub fn load(input: &[u8], on_error: impl FnMut(LineError)) -> (Self, LoadStats) {
        let mut opts = ProviderOptions::default();
        let stats = opts.update_from(input, on_error);
        (opts, stats)
    }

    /// Applies every option line of `input` to `self`, in file order (a later line wins).
    pub fn update_from(&mut self, input: &[u8], mut on_error: impl FnMut(LineError)) -> LoadStats {
        let mut stats = LoadStats::default();
        for item in OptionLines::new(input) {
            stats.options = stats.options.saturating_add(1);
            let result = item.and_then(|l| {
                self.apply(l.name, l.value)
                    .map_err(|kind| LineError { line: l.line, kind })
            });
            let counter = match result {
                Ok(Applied::Set) => &mut stats.applied,
                Ok(Applied::Ignored) => &mut stats.ignored,
                Ok(Applied::Unknown) => &mut stats.unknown,
                Err(e) => {
                    on_error(e);
                    &mut stats.errors
                }
            };
            *counter = counter.saturating_add(1);
        }
        stats
    }

    /// Applies one option. `value` is the first value token (`None` if the line had none).
    /// On error `self` is unchanged.
    pub fn apply(&mut self, name: &str, value: Option<&str>) -> Result<Applied, ErrorKind> {
        let is = |n: &str| name.eq_ignore_ascii_case(n);
        if CORE_IGNORED.iter().any(|n| is(n)) {
            return Ok(Applied::Ignored);
        }
        macro_rules! options {
            ($($name:literal => $field:ident = $parse:expr;)*) => {
                $(if is($name) {
                    let v = value.ok_or(ErrorKind::MissingValue)?;
                    self.$field = $parse(v)?;
                    return Ok(Applied::Set);
                })*
            };
        }
        options! {
            "addr_prot" => addr_prot =
                |v| keyword(v, &[("acm", AddrProt::Acm), ("none", AddrProt::None)]);
            "addr_timeout" => addr_timeout = lifetime;
            "route_prot" => route_prot =
                |v| keyword(v, &[("sa", RouteProt::Sa), ("acm", RouteProt::Acm)]);
            "route_timeout" => route_timeout = lifetime;
            "loopback_prot" => loopback_prot = |v| keyword(
                v, &[("none", LoopbackProt::None), ("local", LoopbackProt::Local)]);
            "timeout" => timeout = |v| uint(v, 1, u32::MAX);
            "retries" => retries = |v| uint(v, 0, 1000);
            "resolve_depth" => resolve_depth = |v| uint(v, 1, 65536);
            "send_depth" => send_depth = |v| uint(v, 1, 65536);
            "recv_depth" => recv_depth = |v| uint(v, 1, 1 << 20);
            "min_mtu" => min_mtu = mtu;
            "min_rate" => min_rate = rate;
            "route_preload" => route_preload = |v| keyword(v, &[
                ("none", RoutePreload::None),
                ("no", RoutePreload::None),
                ("opensm_full_v1", RoutePreload::OpensmFullV1),
                ("full_opensm_v1", RoutePreload::OpensmFullV1),
            ]);
            "route_data_file" => route_data_file = path;
            "addr_preload" => addr_preload = |v| keyword(v, &[
                ("none", AddrPreload::None),
                ("no", AddrPreload::None),
                ("acm_hosts", AddrPreload::AcmHosts),
            ]);
            "addr_data_file" => addr_data_file = path;
            "sa_depth" => sa_depth = |v| uint(v, 1, 65536);
            "log_level" => log_level = |v| uint(v, 0, 2).map(|l| l as u8);
            "acmrs_path_capacity" => acmrs_path_capacity = |v| uint(v, 1, MAX_CAPACITY);
            "acmrs_addr_capacity" => acmrs_addr_capacity = |v| uint(v, 1, MAX_CAPACITY);
            "acmrs_pending_capacity" => acmrs_pending_capacity = |v| uint(v, 1, MAX_CAPACITY);
            "acmrs_request_capacity" => acmrs_request_capacity = |v| uint(v, 1, MAX_CAPACITY);
            "acmrs_route_ttl_ms" => acmrs_route_ttl_ms = |v| uint(v, 0, u32::MAX);
            "acmrs_negative_ttl_ms" => acmrs_negative_ttl_ms = |v| uint(v, 0, u32::MAX);
            "acmrs_refresh_ahead_pct" => acmrs_refresh_ahead_pct =
                |v| uint(v, 0, 99).map(|p| p as u8);
            "acmrs_sa_timeout_ms" => acmrs_sa_timeout_ms = |v| uint(v, 0, 3_600_000);
            "acmrs_sa_retries" => acmrs_sa_retries = |v| uint(v, 0, 1000);
            "acmrs_sa_busy_backoff_ms" => acmrs_sa_busy_backoff_ms = |v| uint(v, 0, 3_600_000);
            "acmrs_poll_mode" => acmrs_poll_mode = |v| keyword(v, &[
                ("busy", Some(PollMode::Busy)),
                ("adaptive", Some(PollMode::Adaptive)),
                ("event", Some(PollMode::Event)),
            ]);
            "acmrs_cpu" => acmrs_cpu = |v| int(v, -1, 65535).map(|c| c as i32);
            "acmrs_log_level" => acmrs_log_level =
                |v| int(v, -1, 4).map(|l| u8::try_from(l).ok());
            "acmrs_acm_window" => acmrs_acm_window = |v| uint(v, 1, 65536);
            "acmrs_sa_transport" => acmrs_sa_transport =
                |v| keyword(v, &[("ud", SaTransport::Ud), ("core", SaTransport::Core)]);
            "acmrs_sa_window" => acmrs_sa_window = |v| uint(v, 1, 4096);
            "acmrs_sa_window_start" => acmrs_sa_window_start = |v| uint(v, 1, 4096);
            "acmrs_sa_table_min" => acmrs_sa_table_min = |v| uint(v, 0, 1 << 20);
            "acmrs_warm_start_ms" => acmrs_warm_start_ms = |v| uint(v, 0, 3_600_000);
            // Its former name ("prefetch" is the CPU's word here).
            "acmrs_route_prefetch" => acmrs_warm_start_ms = |v| uint(v, 0, 3_600_000);
            "acmrs_prom_file" => acmrs_prom_file = |v| optional_path(v, PATH_MAX);
            "acmrs_prom_interval_s" => acmrs_prom_interval_s = |v| uint(v, 1, 86400);
            "acmrs_hit_sample" => acmrs_hit_sample = |v| uint(v, 1, 65536).map(u32::next_power_of_two);
            "acmrs_stall_ms" => acmrs_stall_ms = |v| uint(v, 0, 3_600_000);
            "acmrs_stat_socket" => acmrs_stat_socket = |v| optional_path(v, 107);
        }
        Ok(Applied::Unknown)
    }

    /// How the dataplane thread waits: `acmrs_poll_mode` if set, else `busy` when `acmrs_cpu`
    /// pins it to a core (DPDK-style run to completion on a core given to it) and `adaptive`
    /// otherwise (a small box must not lose a core).
    pub fn poll_mode(&self) -> PollMode {
        self.acmrs_poll_mode.unwrap_or(if self.acmrs_cpu >= 0 {
            PollMode::Busy
        } else {
            PollMode::Adaptive
        })
    }

    /// The log level to use: `acmrs_log_level` if set, else the core's `log_level`.
    pub fn effective_log_level(&self) -> u8 {
        self.acmrs_log_level.unwrap_or(self.log_level)
    }

    /// Route lifetime in ms: `acmrs_route_ttl_ms` if non-zero, else `route_timeout`
    /// (`None` = never expires).
    pub fn route_ttl_ms(&self) -> Option<u64> {
        match self.acmrs_route_ttl_ms {
            0 => self.route_timeout.as_millis(),
            ms => Some(u64::from(ms)),
        }
    }
}

fn keyword<T: Copy>(v: &str, words: &[(&str, T)]) -> Result<T, ErrorKind> {
    words
        .iter()
        .find(|(w, _)| v.eq_ignore_ascii_case(w))
        .map(|&(_, t)| t)
        .ok_or(ErrorKind::InvalidKeyword)
}

fn int(v: &str, min: i64, max: i64) -> Result<i64, ErrorKind> {
    let n = parse_i64(v.as_bytes()).ok_or(ErrorKind::InvalidNumber)?;
    if (min..=max).contains(&n) {
        Ok(n)
    } else {
        Err(ErrorKind::OutOfRange)
    }
}

fn uint(v: &str, min: u32, max: u32) -> Result<u32, ErrorKind> {
    int(v, i64::from(min), i64::from(max)).map(|n| n as u32)
}

fn lifetime(v: &str) -> Result<Lifetime, ErrorKind> {
    match int(v, -1, i64::from(u32::MAX))? {
        -1 => Ok(Lifetime::Never),
        m => Ok(Lifetime::Minutes(m as u32)),
    }
}

fn mtu(v: &str) -> Result<u16, ErrorKind> {
    match int(v, 0, 65535)? {
        m @ (256 | 512 | 1024 | 2048 | 4096) => Ok(m as u16),
        _ => Err(ErrorKind::OutOfRange),
    }
}

/// The rates `acm_convert_rate` knows (Gb/s; 2 means 2.5).
const RATES: &[i64] = &[
    2, 5, 10, 14, 20, 25, 30, 40, 56, 60, 80, 100, 112, 120, 168, 200, 300,
];

fn rate(v: &str) -> Result<u16, ErrorKind> {
    let r = int(v, 0, 65535)?;
    if RATES.contains(&r) {
        Ok(r as u16)
    } else {
        Err(ErrorKind::OutOfRange)
    }
}

fn path(v: &str) -> Result<PathString, ErrorKind> {
    if v.len() > PATH_MAX || v.bytes().any(is_space) {
        return Err(ErrorKind::PathTooLong);
    }
    let mut p = PathString::new();
    p.push_str(v).map_err(|_| ErrorKind::PathTooLong)?;
    Ok(p)
}

/// A path of at most `max` bytes, or `none` (case-insensitive) for off.
fn optional_path(v: &str, max: usize) -> Result<Option<PathString>, ErrorKind> {
    if v.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    if v.len() > max {
        return Err(ErrorKind::PathTooLong);
    }
    path(v).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(input: &str) -> (ProviderOptions, LoadStats, Vec<LineError>) {
        let mut errors = Vec::new();
        let (o, s) = ProviderOptions::load(input.as_bytes(), |e| errors.push(e));
        (o, s, errors)
    }

    #[test]
    fn poll_mode_defaults_to_busy_only_on_a_pinned_core() {
        assert_eq!(load("").0.poll_mode(), PollMode::Adaptive);
        assert_eq!(load("acmrs_cpu 1\n").0.poll_mode(), PollMode::Busy);
        assert_eq!(
            load("acmrs_cpu 1\nacmrs_poll_mode adaptive\n")
                .0
                .poll_mode(),
            PollMode::Adaptive
        );
        assert_eq!(
            load("acmrs_poll_mode event\n").0.poll_mode(),
            PollMode::Event
        );
        // The warm start under its name and its former one.
        for text in ["acmrs_warm_start_ms 5000\n", "acmrs_route_prefetch 5000\n"] {
            let (o, s, e) = load(text);
            assert!(e.is_empty() && s.unknown == 0, "{text}");
            assert_eq!(o.acmrs_warm_start_ms, 5000, "{text}");
        }
        // The removed miss-path modes are unknown names now, ignored like any other.
        let (_, s, e) = load("acmrs_sa_direct 1\nacmrs_sa_inline 1\n");
        assert!(e.is_empty());
        assert_eq!(s.unknown, 2);
    }

    #[test]
    fn defaults_match_ibacmp() {
        let o = ProviderOptions::default();
        assert_eq!(o.addr_timeout, Lifetime::Minutes(1440));
        assert_eq!(o.route_timeout, Lifetime::Never);
        assert_eq!(o.route_prot, RouteProt::Sa);
        assert_eq!(o.loopback_prot, LoopbackProt::Local);
        assert_eq!((o.timeout, o.retries), (2000, 2));
        assert_eq!((o.resolve_depth, o.send_depth, o.recv_depth), (1, 1, 1024));
        assert_eq!((o.min_mtu, o.min_rate), (2048, 10));
        assert_eq!(o.route_data_file.as_str(), "/etc/rdma/ibacm_route.data");
        assert_eq!(o.addr_data_file.as_str(), "/etc/rdma/ibacm_hosts.data");
        assert_eq!(o.route_ttl_ms(), None);
        assert_eq!(o.effective_log_level(), 0);
    }

    #[test]
    fn good_lines_apply() {
        let (o, s, e) = load(
            "# comment\n\
             \n\
             ADDR_TIMEOUT 10 trailing words\n\
             route_timeout 3\n\
             Route_Timeout 7\n\
             route_prot acm\n\
             loopback_prot NONE\n\
             route_preload full_opensm_v1\n\
             route_data_file /tmp/x.data\n\
             addr_preload acm_hosts\n\
             min_mtu 4096\n\
             min_rate 100\n\
             acmrs_path_capacity 1000000\n\
             acmrs_poll_mode busy\n\
             acmrs_cpu 1\n\
             acmrs_route_ttl_ms 500\n\
             acmrs_log_level 3\n\
             provider acmrs default\n\
             other_provider_option 1\n",
        );
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(o.addr_timeout, Lifetime::Minutes(10));
        assert_eq!(o.route_timeout, Lifetime::Minutes(7));
        assert_eq!(o.route_prot, RouteProt::Acm);
        assert_eq!(o.loopback_prot, LoopbackProt::None);
        assert_eq!(o.route_preload, RoutePreload::OpensmFullV1);
        assert_eq!(o.route_data_file.as_str(), "/tmp/x.data");
        assert_eq!(o.addr_preload, AddrPreload::AcmHosts);
        assert_eq!((o.min_mtu, o.min_rate), (4096, 100));
        assert_eq!(o.acmrs_path_capacity, 1_000_000);
        assert_eq!(o.acmrs_poll_mode, Some(PollMode::Busy));
        assert_eq!(o.acmrs_cpu, 1);
        assert_eq!(o.route_ttl_ms(), Some(500));
        assert_eq!(o.effective_log_level(), 3);
        assert_eq!(
            s,
            LoadStats {
                options: 17,
                applied: 15,
                ignored: 1,
                unknown: 1,
                errors: 0
            }
        );
    }

    #[test]
    fn bad_lines_report_number_and_keep_default() {
        let long = format!("route_data_file /{}\n", "a".repeat(130));
        let padded = format!("timeout 1{}", " ".repeat(120));
        let input = format!(
            "timeout abc\n\
             retries -3\n\
             min_mtu 3000\n\
             min_rate 7\n\
             route_preload yes\n\
             addr_timeout -2\n\
             sa_depth\n\
             {long}\
             acmrs_refresh_ahead_pct 100\n\
             {padded}\n\
             acmrs_poll_mode spin\n\
             retries 5\n"
        );
        let (o, s, e) = load(&input);
        let got: Vec<_> = e.iter().map(|e| (e.line, e.kind)).collect();
        assert_eq!(
            got,
            [
                (1, ErrorKind::InvalidNumber),
                (2, ErrorKind::OutOfRange),
                (3, ErrorKind::OutOfRange),
                (4, ErrorKind::OutOfRange),
                (5, ErrorKind::InvalidKeyword),
                (6, ErrorKind::OutOfRange),
                (7, ErrorKind::MissingValue),
                (8, ErrorKind::LineTooLong),
                (9, ErrorKind::OutOfRange),
                (10, ErrorKind::LineTooLong),
                (11, ErrorKind::InvalidKeyword),
            ]
        );
        let d = ProviderOptions::default();
        assert_eq!(o.timeout, d.timeout);
        assert_eq!(o.retries, 5);
        assert_eq!(o.min_mtu, d.min_mtu);
        assert_eq!(o.route_data_file, d.route_data_file);
        assert_eq!(o.acmrs_poll_mode, d.acmrs_poll_mode);
        assert_eq!((s.errors, s.applied), (11, 1));
    }

    #[test]
    fn acm_window_and_addr_prot_none() {
        let d = ProviderOptions::default();
        assert_eq!((d.acmrs_acm_window, d.addr_prot), (16, AddrProt::Acm));
        assert_eq!(
            (d.acmrs_sa_transport, d.acmrs_sa_window),
            (SaTransport::Ud, 16)
        );
        let (o2, _, e2) = load("acmrs_sa_transport core\nacmrs_sa_window 64\n");
        assert!(e2.is_empty());
        assert_eq!(
            (o2.acmrs_sa_transport, o2.acmrs_sa_window),
            (SaTransport::Core, 64)
        );
        let (o, _, e) = load("acmrs_acm_window 4\naddr_prot none\n");
        assert!(e.is_empty(), "{e:?}");
        assert_eq!((o.acmrs_acm_window, o.addr_prot), (4, AddrProt::None));
        let (o, _, e) = load("acmrs_acm_window 0\nacmrs_acm_window 65537\naddr_prot sa\n");
        let kinds: Vec<_> = e.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                ErrorKind::OutOfRange,
                ErrorKind::OutOfRange,
                ErrorKind::InvalidKeyword
            ]
        );
        assert_eq!((o.acmrs_acm_window, o.addr_prot), (16, AddrProt::Acm));
    }

    #[test]
    fn stats_export_options() {
        let d = ProviderOptions::default();
        assert_eq!(d.acmrs_prom_file, None);
        assert_eq!(d.acmrs_prom_interval_s, 10);
        assert_eq!(
            d.acmrs_stat_socket.as_ref().map(|p| p.as_str()),
            Some("/run/acmrs.sock")
        );
        let (o, _, e) = load(
            "acmrs_prom_file /var/lib/node_exporter/acmrs.prom\n\
             acmrs_prom_interval_s 2\n\
             acmrs_stat_socket none\n",
        );
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(
            o.acmrs_prom_file.as_ref().map(|p| p.as_str()),
            Some("/var/lib/node_exporter/acmrs.prom")
        );
        assert_eq!((o.acmrs_prom_interval_s, o.acmrs_stat_socket), (2, None));
        assert_eq!(d.acmrs_hit_sample, 16);
        assert_eq!(
            load("acmrs_hit_sample 10\n").0.acmrs_hit_sample,
            16,
            "a power of two"
        );
        assert_eq!(load("acmrs_hit_sample 1\n").0.acmrs_hit_sample, 1);
        assert_eq!(
            load("acmrs_hit_sample 0\n").0.acmrs_hit_sample,
            16,
            "0 keeps the default"
        );
        let (o, _, e) = load("acmrs_prom_interval_s 0\nacmrs_prom_interval_s x\nacmrs_prom_file\n");
        let kinds: Vec<_> = e.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                ErrorKind::OutOfRange,
                ErrorKind::InvalidNumber,
                ErrorKind::MissingValue
            ]
        );
        assert_eq!(o, d);
        // A socket path longer than sun_path allows keeps the default.
        let mut o = d.clone();
        let sock = format!("/{}", "s".repeat(107));
        assert_eq!(
            o.apply("acmrs_stat_socket", Some(&sock)),
            Err(ErrorKind::PathTooLong)
        );
        assert_eq!(
            o.apply("acmrs_stat_socket", Some(&sock[1..])),
            Ok(Applied::Set)
        );
        assert_eq!(o.acmrs_stat_socket.as_ref().map(|p| p.len()), Some(107));
    }

    #[test]
    fn path_limit_is_127() {
        let mut o = ProviderOptions::default();
        let ok = format!("/{}", "p".repeat(126));
        assert_eq!(o.apply("addr_data_file", Some(&ok)), Ok(Applied::Set));
        assert_eq!(o.addr_data_file.as_str(), ok);
        let too_long = format!("/{}", "p".repeat(127));
        assert_eq!(
            o.apply("addr_data_file", Some(&too_long)),
            Err(ErrorKind::PathTooLong)
        );
        assert_eq!(o.addr_data_file.as_str(), ok);
    }

    #[test]
    fn comments_only_in_column_zero_and_indented_hash_skipped() {
        let (o, s, e) = load("#timeout 5\n  # timeout 6\n\ttimeout 7\n");
        assert!(e.is_empty());
        assert_eq!(o.timeout, 7);
        assert_eq!(s.options, 1);
    }

    #[test]
    fn non_utf8_is_an_error_not_a_panic() {
        let mut errors = Vec::new();
        let (_, s) = ProviderOptions::load(b"timeout \xff\xfe\n\xc0 1\n", |e| errors.push(e));
        assert_eq!(s.errors, 2);
        assert_eq!(errors[0].kind, ErrorKind::NotUtf8);
        assert_eq!(errors[1].line, 2);
    }
}
