//! Bringing a simulated fabric up (ibsim → OpenSM → N real `ibacm` daemons), driving it, and
//! tearing it down.

use crate::host::{self, HostPort, HostSpec, SubnetSpec, PORTS_PER_SUBNET};
use crate::partition::{self, Partition, PartitionAddrs};
use crate::ports::{PortLease, PortPool};
use crate::process::{self, Output, Proc};
use crate::topology::Topology;
use crate::{Error, ProviderChoice, Result};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Debian's umad → ibsim preload.
pub const UMAD2SIM: &str = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so";
/// The RMPP sender preloaded into OpenSM ahead of umad2sim (`tools/umad-rmpp`,
/// docs/umad-rmpp.md), built into `target/<profile>/deps/` with acm-fabric.
pub const RMPP_SHIM: &str = "libumad_rmpp.so";
/// The file (in OpenSM's directory) where the RMPP sender keeps its counters.
pub const RMPP_STATS: &str = "umad-rmpp.stats";
/// The stock provider shipped with Debian's ibacm package.
pub const STOCK_PROVIDER: &str = "/usr/lib/x86_64-linux-gnu/ibacm/libibacmp.so";
/// ibacm's default provider directory (compiled into Debian's daemon; used when
/// `ibacm_opts.cfg` has no `provider_lib_path` line).
pub const DEFAULT_PROVIDER_DIR: &str = "/usr/lib/x86_64-linux-gnu/ibacm";
/// The real ibacm daemon.
pub const IBACM: &str = "/usr/sbin/ibacm";
/// The real ibacm client tool.
pub const IB_ACME: &str = "/usr/bin/ib_acme";

/// Which provider library a daemon loads. The library is COPIED into the node's provider
/// directory (the core skips symlinks) and selected with `provider <name> default`. Every node
/// has its own choice ([`FabricBuilder::node_provider`]); [`FabricBuilder::provider`] is the
/// default. [`Provider::Installed`] copies nothing and leaves `provider_lib_path` out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// Debian's `libibacmp.so` (provider name `ibacmp`).
    Stock,
    /// This project's `libacmrs.so` (provider name `acmrs`), found next to the running
    /// executable (`target/<profile>/`), or at `$ACM_FABRIC_ACMRS`.
    Acmrs,
    /// Any provider library and the name its `provider_query` reports.
    Custom {
        /// Path of the `.so`.
        path: PathBuf,
        /// The provider's name (`struct acm_provider.name`).
        name: String,
    },
    /// A provider installed in ibacm's default provider directory ([`DEFAULT_PROVIDER_DIR`],
    /// e.g. by the acmrs `.deb`): nothing is copied and the node's `ibacm_opts.cfg` has no
    /// `provider_lib_path` line, so its daemon loads every library of that directory, as an
    /// installed ibacm does, and `provider <name> default` picks this one.
    Installed {
        /// The provider's name (`struct acm_provider.name`).
        name: String,
    },
}

impl Provider {
    /// `stock`, `acmrs`, `installed:NAME`, or a path (then `name` is required).
    pub fn parse(spec: &str, name: Option<&str>) -> Result<Provider> {
        if let Some(p) = Provider::installed(spec) {
            return match name {
                None => p,
                Some(_) => Err(Error::new(
                    "a provider name only goes with a provider given as a path",
                )),
            };
        }
        match (spec, name) {
            ("stock", None) => Ok(Provider::Stock),
            ("acmrs", None) => Ok(Provider::Acmrs),
            ("stock" | "acmrs", Some(_)) => Err(Error::new(
                "a provider name only goes with a provider given as a path",
            )),
            (path, Some(name)) => Ok(Provider::Custom {
                path: PathBuf::from(path),
                name: name.to_string(),
            }),
            (path, None) => Err(Error::new(format!(
                "provider {path:?} is neither `stock` nor `acmrs`: give its provider name too"
            ))),
        }
    }

    /// The name used in `provider <name> default`.
    pub fn name(&self) -> &str {
        match self {
            Provider::Stock => "ibacmp",
            Provider::Acmrs => "acmrs",
            Provider::Custom { name, .. } | Provider::Installed { name } => name,
        }
    }

    /// `installed:NAME` as [`Provider::Installed`] (`None` if `spec` is not of that form; an
    /// error for an empty name).
    pub fn installed(spec: &str) -> Option<Result<Provider>> {
        let name = spec.strip_prefix("installed:")?.trim();
        Some(if name.is_empty() {
            Err(Error::new(
                "installed: needs a provider name (installed:acmrs)",
            ))
        } else {
            Ok(Provider::Installed { name: name.into() })
        })
    }

    /// Whether the daemon finds this provider in ibacm's default directory (nothing copied,
    /// no `provider_lib_path`).
    pub fn is_installed(&self) -> bool {
        matches!(self, Provider::Installed { .. })
    }

    /// Where the library is: the file to copy into the node's provider directory, or `None`
    /// for [`Provider::Installed`] (after checking that the default directory exists).
    pub fn library_to_copy(&self) -> Result<Option<PathBuf>> {
        match self {
            Provider::Installed { .. } => {
                if Path::new(DEFAULT_PROVIDER_DIR).is_dir() {
                    Ok(None)
                } else {
                    Err(Error::new(format!(
                        "{DEFAULT_PROVIDER_DIR} not found (install Debian's ibacm)"
                    )))
                }
            }
            p => p.library().map(Some),
        }
    }

    /// Where the library is (for [`Provider::Installed`]: the default provider directory).
    pub fn library(&self) -> Result<PathBuf> {
        match self {
            Provider::Stock => existing(PathBuf::from(STOCK_PROVIDER), "install Debian's ibacm"),
            Provider::Acmrs => find_artifact(
                "ACM_FABRIC_ACMRS",
                "libacmrs.so",
                "cargo build -p acm-plugin",
            ),
            Provider::Custom { path, .. } => existing(path.clone(), "check the path"),
            Provider::Installed { .. } => Ok(PathBuf::from(DEFAULT_PROVIDER_DIR)),
        }
    }
}

fn existing(p: PathBuf, hint: &str) -> Result<PathBuf> {
    if p.is_file() {
        Ok(p)
    } else {
        Err(Error::new(format!("{} not found ({hint})", p.display())))
    }
}

/// Finds a workspace build artifact: `$<env>` if set, else next to the running executable
/// (`target/<profile>/`) or one level up (tests run from `target/<profile>/deps/`).
pub fn find_artifact(env: &str, file: &str, build_hint: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return existing(PathBuf::from(p), &format!("${env} is set to it"));
    }
    let exe = std::env::current_exe()
        .map_err(|e| Error::new(format!("cannot locate the running executable: {e}")))?;
    let mut tried = Vec::new();
    let mut dir = exe.parent();
    for _ in 0..2 {
        let Some(d) = dir else { break };
        let candidate = d.join(file);
        if candidate.is_file() {
            return Ok(candidate);
        }
        tried.push(candidate.display().to_string());
        dir = d.parent();
    }
    Err(Error::new(format!(
        "{file} not found (looked at {}); run `{build_hint}` with the same CARGO_TARGET_DIR \
         and profile, or set ${env}",
        tried.join(", ")
    )))
}

/// The RMPP sender library OpenSM runs with ([`RMPP_SHIM`]): `$ACM_FABRIC_UMAD_RMPP` if set,
/// else next to the running executable, one level up, or in `deps/` of either (cargo builds
/// it there as a dependency of acm-fabric). Refuses a library older than any file of
/// `tools/umad-rmpp/src` when that directory exists (a stale build would test old code).
pub fn rmpp_shim() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("ACM_FABRIC_UMAD_RMPP") {
        return existing(PathBuf::from(p), "$ACM_FABRIC_UMAD_RMPP is set to it");
    }
    let exe = std::env::current_exe()
        .map_err(|e| Error::new(format!("cannot locate the running executable: {e}")))?;
    let mut tried = Vec::new();
    let mut found = None;
    let mut dir = exe.parent();
    for _ in 0..2 {
        let Some(d) = dir else { break };
        for c in [d.join(RMPP_SHIM), d.join("deps").join(RMPP_SHIM)] {
            if found.is_none() && c.is_file() {
                found = Some(c.clone());
            }
            tried.push(c.display().to_string());
        }
        dir = d.parent();
    }
    let Some(p) = found else {
        return Err(Error::new(format!(
            "{RMPP_SHIM} not found (looked at {}); run `cargo build -p umad-rmpp` with the same \
             CARGO_TARGET_DIR and profile, or set $ACM_FABRIC_UMAD_RMPP",
            tried.join(", ")
        )));
    };
    let built = std::fs::metadata(&p)
        .and_then(|m| m.modified())
        .map_err(|e| Error::new(format!("{}: {e}", p.display())))?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../umad-rmpp/src");
    if let Ok(entries) = std::fs::read_dir(&src) {
        for e in entries.flatten() {
            if let Ok(m) = e.metadata().and_then(|m| m.modified()) {
                if m > built {
                    return Err(Error::new(format!(
                        "{} is older than {}: run `cargo build -p umad-rmpp` first",
                        p.display(),
                        e.path().display()
                    )));
                }
            }
        }
    }
    Ok(p)
}

/// Addresses a node's daemon serves (written to its `ibacm_addr.cfg`) and that
/// `ibacm_hosts.data` maps to its GID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddrs {
    /// Host name: the node name in lower case (`Hca3` → `hca3`).
    pub name: String,
    /// `10.40.0.<k>` where `k` is the node's 1-based position among the topology's HCAs.
    pub ipv4: Ipv4Addr,
    /// `fd00:acf::<k>`.
    pub ipv6: Ipv6Addr,
    /// More host names of the node, `<name>-1` .. `<name>-<count>`
    /// ([`FabricBuilder::extra_names`]; empty by default). In `ibacm_addr.cfg` only, not in
    /// `ibacm_hosts.data`.
    pub extra_names: Vec<String>,
    /// The node's addresses in each partition it belongs to besides the default one
    /// ([`FabricBuilder::partition`]), in the builder's order.
    pub partitions: Vec<PartitionAddrs>,
}

impl NodeAddrs {
    fn for_index(node: &str, k: usize, extra_names: usize, parts: &[Partition]) -> NodeAddrs {
        let k32 = k as u32;
        let name = node.to_lowercase();
        NodeAddrs {
            extra_names: (1..=extra_names).map(|i| format!("{name}-{i}")).collect(),
            partitions: parts
                .iter()
                .enumerate()
                .filter_map(|(i, p)| {
                    p.membership(node)
                        .map(|m| PartitionAddrs::new(&name, k, i, p, m))
                })
                .collect(),
            name,
            ipv4: Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 40, 0, 0)) + k32),
            ipv6: Ipv6Addr::new(0xfd00, 0xacf, 0, 0, 0, 0, (k >> 16) as u16, k as u16),
        }
    }

    /// The node's addresses in partition `pkey` (either membership form), if it is a member.
    pub fn in_partition(&self, pkey: u16) -> Option<&PartitionAddrs> {
        self.partitions
            .iter()
            .find(|p| p.pkey & 0x7fff == pkey & 0x7fff)
    }
}

/// Whether the daemons get an `ibacm_hosts.data` (every daemon node's name, IPv4 and IPv6 →
/// its GID, see [`Fabric::hosts_data`]) and preload it (`addr_preload acm_hosts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostsFile {
    /// Written into every node's directory (`addr_data_file` names it), loaded only if an
    /// option says `addr_preload acm_hosts` (the template's `addr_preload none` otherwise).
    #[default]
    Written,
    /// Written, and `addr_preload acm_hosts` set on every node (an explicit `addr_preload`
    /// option still wins).
    Preloaded,
    /// Not written at all, and `addr_preload none` on every node: a daemon knows only its own
    /// addresses (`ibacm_addr.cfg`); names and IPs of other nodes must be resolved over the
    /// network (the ACM address protocol). [`FabricBuilder::start`] refuses an option
    /// `addr_preload acm_hosts` with it.
    Absent,
}

impl HostsFile {
    /// `written` | `preload` | `none` (the CLI's `--hosts-file`).
    pub fn parse(s: &str) -> Result<HostsFile> {
        match s {
            "written" => Ok(HostsFile::Written),
            "preload" | "preloaded" => Ok(HostsFile::Preloaded),
            "none" | "absent" => Ok(HostsFile::Absent),
            _ => Err(Error::new(format!(
                "hosts file mode {s:?}: written, preload or none"
            ))),
        }
    }
}

/// Configuration of a fabric; [`FabricBuilder::start`] brings it up.
#[derive(Debug, Clone)]
pub struct FabricBuilder {
    topology: Topology,
    nodes: Vec<String>,
    provider: Provider,
    node_providers: Vec<(String, Provider)>,
    hosts_file: HostsFile,
    extra_names: usize,
    port_pool: Option<PortPool>,
    sm_node: Option<String>,
    options: Vec<(Option<String>, String, String)>,
    daemon_env: Vec<(String, String)>,
    subnet_timeout: Option<u8>,
    prefix: String,
    keep: bool,
    ready_timeout: Duration,
    simverbs: Option<PathBuf>,
    start_daemons: bool,
    opensm_args: Vec<String>,
    partitions: Vec<Partition>,
    qos_policy: Option<String>,
    subnet_prefix: Option<u64>,
    extra_providers: Vec<(String, Provider)>,
    hosts: Vec<(String, HostSpec)>,
    subnets: Vec<SubnetSpec>,
}

/// A running fabric. Dropping it stops every process it started (by process group: daemons
/// TERM then KILL, OpenSM, ibsim) and removes its scratch directory (unless kept). If the
/// thread is panicking, every node's log is printed to stderr first.
#[derive(Debug)]
pub struct Fabric {
    name: String,
    scratch: PathBuf,
    keep: bool,
    topology: Topology,
    provider: Provider,
    sm_node: String,
    simverbs: PathBuf,
    ibsim: Option<Proc>,
    /// ibsim's console: a FIFO that ibsim holds open for reading *and* writing (so it never
    /// sees end-of-file, which would make it spin), written by [`Fabric::ibsim_command`].
    console: PathBuf,
    /// Serialises console commands; counts them (each one is followed by a marker line).
    console_seq: Mutex<u64>,
    sm: Option<Proc>,
    sm_starts: u32,
    /// OpenSM's directory (its log, its RMPP sender's counters), of the last start.
    sm_dir: PathBuf,
    /// The RMPP sender preloaded into OpenSM ahead of umad2sim.
    rmpp_shim: PathBuf,
    sm_args: Vec<String>,
    /// OpenSM's `partitions.conf` (`-P`) when the builder named partitions.
    partitions_conf: Option<PathBuf>,
    /// The partitions besides the default one, as OpenSM was last told.
    partitions: Vec<Partition>,
    /// Each HCA's port GUID (read before OpenSM starts when partitions need them).
    guids: Vec<(String, u64)>,
    nodes: Vec<Node>,
    /// The second subnets by name: each its own ibsim and OpenSM, without daemons of its own
    /// (the hosts' ports on it belong to daemons of this fabric).
    subnets: Vec<(String, Fabric)>,
}

/// One simulated HCA running a real `ibacm` daemon.
#[derive(Debug)]
pub struct Node {
    /// ibsim node name (`SIM_HOST`), e.g. `Hca3`.
    pub name: String,
    /// Base LID assigned by OpenSM.
    pub lid: u16,
    /// Port GID 0 (subnet prefix + port GUID).
    pub gid: Ipv6Addr,
    /// Addresses listed in the node's address file (of its first port).
    pub addrs: NodeAddrs,
    /// Every port of the node's host ([`FabricBuilder::host`]; one port, the node itself,
    /// by default), in spec order: `ports[0]` is the node's own (`lid`, `gid`, `addrs`).
    pub ports: Vec<HostPort>,
    /// TCP port the daemon serves (`server_mode loop`), leased from the shared
    /// [`PortPool`] for the node's life; changes if a daemon start found it taken.
    pub server_port: u16,
    /// The node's scratch directory (opts, addr, hosts files, provider dir, logs).
    pub dir: PathBuf,
    /// The directory bind-mounted on `/run` for the daemon and its `ib_acme` calls.
    pub run_dir: PathBuf,
    provider: Provider,
    /// Holds [`Node::server_port`] reserved (an exclusive lock) while the node exists.
    port_lease: PortLease,
    port_pool: PortPool,
    /// Ports this node's daemon failed to bind (log: `unable to bind listen socket`).
    port_retries: Vec<u16>,
    /// Logs of earlier daemon starts (the core truncates its log file at start, so each one
    /// is moved to `ibacm.log.<n>` first), oldest first.
    earlier_logs: Vec<PathBuf>,
    fabric: String,
    scratch: PathBuf,
    daemon: Option<Proc>,
    /// How the daemon was started (for [`Node::restart_daemon`]).
    launch: Option<Launch>,
}

/// What a daemon start needs, kept so a node's daemon can be started again.
#[derive(Debug, Clone)]
struct Launch {
    simverbs: PathBuf,
    shm: PathBuf,
    env: Vec<(String, String)>,
    /// The providers whose endpoint rows (`ib_acme -e`) mean the daemon serves: the node's
    /// default and its extra ones (a per-prefix `provider` line may pick one of those).
    providers: Vec<String>,
    ready_timeout: Duration,
}

impl Launch {
    /// Whether `ib_acme -e` output lists an endpoint of one of the node's providers on every
    /// port of `ports` (each port its CA's node GUID and its port number).
    fn serves(&self, e_output: &str, all: &[HostPort], ports: &[&HostPort]) -> bool {
        ports.iter().all(|p| {
            let first = all
                .iter()
                .find(|q| q.ca == p.ca && q.port == 1)
                .unwrap_or(p);
            host::lists_endpoint(
                e_output,
                HostPort::ca_guid_of(first.gid),
                p.port,
                &self.providers,
            )
        })
    }

    /// Whether it lists none on `port`.
    fn serves_none(&self, e_output: &str, all: &[HostPort], port: &HostPort) -> bool {
        !self.serves(e_output, all, &[port])
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

impl FabricBuilder {
    /// A fabric on `topology` whose daemons run on `nodes` (HCA names), with the stock provider.
    pub fn new<I, S>(topology: Topology, nodes: I) -> FabricBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        FabricBuilder {
            topology,
            nodes: nodes.into_iter().map(Into::into).collect(),
            provider: Provider::Stock,
            node_providers: Vec::new(),
            hosts_file: HostsFile::Written,
            extra_names: 0,
            port_pool: None,
            sm_node: None,
            options: Vec::new(),
            daemon_env: Vec::new(),
            subnet_timeout: None,
            prefix: "acmfab".into(),
            keep: false,
            ready_timeout: Duration::from_secs(30),
            simverbs: None,
            start_daemons: true,
            opensm_args: Vec::new(),
            partitions: Vec::new(),
            qos_policy: None,
            subnet_prefix: None,
            extra_providers: Vec::new(),
            hosts: Vec::new(),
            subnets: Vec::new(),
        }
    }

    /// The provider every daemon loads unless [`FabricBuilder::node_provider`] says otherwise
    /// (default [`Provider::Stock`]).
    pub fn provider(mut self, provider: Provider) -> Self {
        self.provider = provider;
        self
    }

    /// The provider `node`'s daemon loads (a later call for the same node wins), e.g.
    /// `.provider(Provider::Stock).node_provider("Hca3", Provider::Acmrs)` for a mixed fabric.
    /// [`FabricBuilder::start`] fails if `node` is not one of the daemon nodes.
    pub fn node_provider(mut self, node: &str, provider: Provider) -> Self {
        self.node_providers.retain(|(n, _)| n != node);
        self.node_providers.push((node.to_string(), provider));
        self
    }

    /// A default provider (if any) and per-node providers at once, as parsed from the CLI's
    /// `--provider` arguments ([`ProviderChoice::parse`]).
    pub fn providers(mut self, choice: &ProviderChoice) -> Self {
        if let Some(p) = &choice.default {
            self = self.provider(p.clone());
        }
        for (n, p) in &choice.per_node {
            self = self.node_provider(n, p.clone());
        }
        self
    }

    /// The provider `node` will load: its [`FabricBuilder::node_provider`], else the default.
    pub fn provider_of(&self, node: &str) -> &Provider {
        self.node_providers
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, p)| p)
            .unwrap_or(&self.provider)
    }

    /// Whether the daemons get (and preload) an `ibacm_hosts.data`; default
    /// [`HostsFile::Written`] (written, not preloaded). [`HostsFile::Absent`] is a fabric
    /// with no hosts file, where names and IPs must be resolved over the network.
    pub fn hosts_file(mut self, mode: HostsFile) -> Self {
        self.hosts_file = mode;
        self
    }

    /// `count` more host names per daemon node: `<name>-1` .. `<name>-<count>` (e.g.
    /// `hca3-1`), each an `ibacm_addr.cfg` line like the node's own name (default 0). With
    /// [`HostsFile::Absent`] every one of them is a distinct destination that peers resolve
    /// over the network, e.g. for benchmarks of address-resolution misses. Listed in
    /// [`NodeAddrs::extra_names`]; not written to `ibacm_hosts.data`.
    pub fn extra_names(mut self, count: usize) -> Self {
        self.extra_names = count;
        self
    }

    /// Where the daemons' `server_port`s are leased from (default [`PortPool::shared`]).
    pub fn port_pool(mut self, pool: PortPool) -> Self {
        self.port_pool = Some(pool);
        self
    }

    /// The HCA OpenSM runs as (default: the first HCA of the topology without a daemon).
    pub fn sm_node(mut self, node: &str) -> Self {
        self.sm_node = Some(node.to_string());
        self
    }

    /// Sets an `ibacm_opts.cfg` option on every node (replaces the template's line of that
    /// name, else appends). `provider` lines are appended, never replaced.
    pub fn option(mut self, name: &str, value: &str) -> Self {
        self.options.push((None, name.into(), value.into()));
        self
    }

    /// Sets an `ibacm_opts.cfg` option on one node only (after the options for every node, so
    /// it wins over them). [`FabricBuilder::start`] fails if `node` runs no daemon.
    pub fn node_option(mut self, node: &str, name: &str, value: &str) -> Self {
        self.options
            .push((Some(node.to_string()), name.into(), value.into()));
        self
    }

    /// Adds an environment variable for every daemon (e.g. `SIMVERBS_DEBUG=1`).
    pub fn daemon_env(mut self, key: &str, value: &str) -> Self {
        self.daemon_env.push((key.into(), value.into()));
        self
    }

    /// The PortInfo SubnetTimeOut code (0..=31) the daemons' `ibv_query_port` reports
    /// (`SIMVERBS_SUBNET_TIMEOUT` in their environment). Unset (the default), simverbs reports
    /// the fabric's value, except ibsim's placeholder 31, which it replaces with OpenSM's
    /// default 18. libibacmp waits `1 << (code - 8)` ms plus its `timeout` option per multicast
    /// try, so `8` (1 ms) makes unanswered requests fail fastest. A value above 31 makes
    /// [`FabricBuilder::start`] fail.
    pub fn subnet_timeout(mut self, code: u8) -> Self {
        self.subnet_timeout = Some(code);
        self
    }

    /// A label for the fabric name and scratch directory (default `acmfab`); a test name is a
    /// good choice. The fabric name is `<prefix>-<pid>-<seq>`.
    pub fn name_prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(24)
            .collect();
        self
    }

    /// Keep the scratch directory after teardown (processes are stopped regardless).
    pub fn keep_scratch(mut self, keep: bool) -> Self {
        self.keep = keep;
        self
    }

    /// How long to wait for OpenSM to become master and for each daemon to answer.
    pub fn ready_timeout(mut self, t: Duration) -> Self {
        self.ready_timeout = t;
        self
    }

    /// Path of `libsimverbs.so` (default: `$ACM_FABRIC_SIMVERBS` or next to the executable).
    pub fn simverbs(mut self, path: PathBuf) -> Self {
        self.simverbs = Some(path);
        self
    }

    /// A partition besides the default one ([`Partition`]): OpenSM gets a `partitions.conf`
    /// (`-P`) naming its members' port GUIDs, and each member's `ibacm_addr.cfg` lists its
    /// addresses in the partition ([`NodeAddrs::partitions`]) with its P_Key, so the core
    /// opens one endpoint per partition. A member need not run a daemon; it must be an HCA.
    pub fn partition(mut self, p: Partition) -> Self {
        self.partitions.push(p);
        self
    }

    /// OpenSM's `subnet_prefix` (an options file, `-F`): every port's GID prefix, so GIDs,
    /// paths and the core's per-prefix provider choice (`provider NAME 0x<prefix>`) see it.
    pub fn subnet_prefix(mut self, prefix: u64) -> Self {
        self.subnet_prefix = Some(prefix);
        self
    }

    /// One more provider library in `node`'s provider directory, besides the one its opts
    /// file names as `default`; a `provider NAME 0x<prefix>` option line (`node_option(node,
    /// "provider", "acmrs 0xfec0000000000001")`) then picks it for ports of that subnet.
    pub fn node_extra_provider(mut self, node: &str, provider: Provider) -> Self {
        self.extra_providers.push((node.to_string(), provider));
        self
    }

    /// Runs OpenSM with QoS on (`--qos`) and this `qos-policy.conf` text (`--qos_policy_file`),
    /// e.g. a `qos-ulps` section mapping ServiceID ranges to SLs: PathRecord queries carrying
    /// a ServiceID then get that SL from the SA.
    pub fn qos_policy(mut self, text: &str) -> Self {
        self.qos_policy = Some(text.to_string());
        self
    }

    /// Extra OpenSM arguments for every start, e.g. `["-P", "/path/partitions.conf"]`.
    pub fn opensm_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.opensm_args = args.into_iter().map(Into::into).collect();
        self
    }

    /// Whether to start the ibacm daemons (default true). Without them the fabric is just
    /// ibsim + OpenSM, and nodes only carry their LID/GID and generated files.
    /// Makes daemon node `node` a host of several CAs and ports ([`HostSpec`]: CAs separated
    /// by `,`, ports of a CA joined by `+`, each `[SUBNET:]NODE`); the first port must be
    /// `node` itself on the main subnet. The daemon sees every device and port (simverbs'
    /// `SIMVERBS_HOST`); each port's addresses go into the node's address file. A later call
    /// for the node wins.
    pub fn host(mut self, node: &str, spec: HostSpec) -> Self {
        self.hosts.retain(|(n, _)| n != node);
        self.hosts.push((node.to_string(), spec));
        self
    }

    /// A second subnet ([`SubnetSpec`]): its own ibsim and OpenSM (own subnet prefix), for
    /// the ports of hosts that name it.
    pub fn subnet(mut self, spec: SubnetSpec) -> Self {
        self.subnets.retain(|s| s.name != spec.name);
        self.subnets.push(spec);
        self
    }

    /// The host spec of `node` (its own one port unless [`FabricBuilder::host`] said more).
    pub fn host_of(&self, node: &str) -> HostSpec {
        self.hosts
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, h)| h.clone())
            .unwrap_or_else(|| HostSpec::single(node))
    }

    /// Checks the hosts and subnets against the topologies: every port an HCA of its subnet,
    /// not the subnet's SM, used once, the first port the node itself, at most
    /// [`PORTS_PER_SUBNET`] daemon ports per subnet.
    fn check_hosts(&self, main_sm: &str) -> Result<()> {
        for (n, _) in &self.hosts {
            if !self.nodes.contains(n) {
                return Err(Error::new(format!(
                    "host spec given for {n:?}, which runs no daemon (daemon nodes: {})",
                    self.nodes.join(", ")
                )));
            }
        }
        let mut names: Vec<&str> = self.subnets.iter().map(|s| s.name.as_str()).collect();
        names.sort();
        if names.windows(2).any(|w| w[0] == w[1]) || names.contains(&"") {
            return Err(Error::new("subnet names must be distinct and not empty"));
        }
        let mut used: Vec<(Option<String>, String)> = Vec::new();
        for node in &self.nodes {
            let spec = self.host_of(node);
            let ports = spec.ports();
            let first = ports[0].2;
            if first.subnet.is_some() || first.node != *node {
                return Err(Error::new(format!(
                    "host {node}: its first port must be {node} itself on the main subnet"
                )));
            }
            for (ca, port, p) in ports {
                let (topo, sm) = match &p.subnet {
                    None => (&self.topology, main_sm.to_string()),
                    Some(name) => {
                        let sub = self.subnets.iter().find(|s| s.name == *name).ok_or_else(|| {
                            Error::new(format!(
                                "host {node} {ca} port {port}: no subnet {name:?} (--subnet NAME=...)"
                            ))
                        })?;
                        let sm = sub
                            .sm_node
                            .clone()
                            .or_else(|| sub.topology.hcas().first().cloned());
                        (&sub.topology, sm.unwrap_or_default())
                    }
                };
                let on = p.subnet.as_deref().unwrap_or("the main subnet");
                if !topo.hcas().contains(&p.node) {
                    return Err(Error::new(format!(
                        "host {node} {ca} port {port}: {:?} is not an HCA of {on} ({})",
                        p.node, topo.label
                    )));
                }
                if p.node == sm {
                    return Err(Error::new(format!(
                        "host {node} {ca} port {port}: {} is {on}'s SM node",
                        p.node
                    )));
                }
                let key = (p.subnet.clone(), p.node.clone());
                if used.contains(&key) {
                    return Err(Error::new(format!(
                        "host {node} {ca} port {port}: {} on {on} is already a port of a host",
                        p.node
                    )));
                }
                if p.subnet.is_none() && p.node != *node && self.nodes.contains(&p.node) {
                    return Err(Error::new(format!(
                        "host {node} {ca} port {port}: {} runs a daemon of its own",
                        p.node
                    )));
                }
                used.push(key);
            }
        }
        for sub in std::iter::once(None).chain(self.subnets.iter().map(|s| Some(s.name.clone()))) {
            let n = used.iter().filter(|(s, _)| *s == sub).count();
            if n > PORTS_PER_SUBNET {
                return Err(Error::new(format!(
                    "{n} daemon ports on {}: ibsim serves 10 clients per instance (OpenSM + probe + {PORTS_PER_SUBNET} ports)",
                    sub.as_deref().unwrap_or("the main subnet")
                )));
            }
        }
        Ok(())
    }

    pub fn start_daemons(mut self, yes: bool) -> Self {
        self.start_daemons = yes;
        self
    }

    /// Brings everything up and waits until it is ready: ibsim, OpenSM master (polled with
    /// `sminfo`), LIDs assigned (`ibaddr` per node), then each daemon serving `ib_acme -e`.
    /// On any failure, everything started so far is stopped and the error carries the logs.
    pub fn start(self) -> Result<Fabric> {
        let hcas = self.topology.hcas();
        if self.nodes.is_empty() {
            return Err(Error::new("no daemon nodes given"));
        }
        for n in &self.nodes {
            if !hcas.contains(n) {
                return Err(Error::new(format!(
                    "node {n:?} is not an HCA of topology {} (HCAs: {})",
                    self.topology.label,
                    hcas.join(", ")
                )));
            }
        }
        if let Some(code) = self.subnet_timeout.filter(|c| *c > 31) {
            return Err(Error::new(format!(
                "subnet timeout {code} is not a PortInfo SubnetTimeOut code (0..=31)"
            )));
        }
        let mut uniq = self.nodes.clone();
        uniq.sort();
        uniq.dedup();
        if uniq.len() != self.nodes.len() {
            return Err(Error::new("a node is listed twice"));
        }
        for (n, p) in self.node_providers.iter().chain(&self.extra_providers) {
            if !self.nodes.contains(n) {
                return Err(Error::new(format!(
                    "provider {} given for {n:?}, which runs no daemon (daemon nodes: {})",
                    p.name(),
                    self.nodes.join(", ")
                )));
            }
        }
        for (n, k, _) in &self.options {
            if let Some(n) = n.as_ref().filter(|n| !self.nodes.contains(n)) {
                return Err(Error::new(format!(
                    "option {k} given for {n:?}, which runs no daemon (daemon nodes: {})",
                    self.nodes.join(", ")
                )));
            }
        }
        if self.hosts_file == HostsFile::Absent {
            if let Some((n, _, v)) = self.options.iter().find(|(_, k, v)| {
                k.eq_ignore_ascii_case("addr_preload") && !v.eq_ignore_ascii_case("none")
            }) {
                return Err(Error::new(format!(
                    "option addr_preload {v}{} contradicts HostsFile::Absent (no hosts file)",
                    n.as_ref().map(|n| format!(" on {n}")).unwrap_or_default()
                )));
            }
        }
        partition::check(&self.partitions, &self.topology)?;
        let sm_node = match &self.sm_node {
            Some(s) if hcas.contains(s) => s.clone(),
            Some(s) => {
                return Err(Error::new(format!(
                    "SM node {s:?} is not an HCA of the topology"
                )))
            }
            None => hcas
                .iter()
                .find(|h| !self.nodes.contains(h))
                .cloned()
                .ok_or_else(|| {
                    Error::new("every HCA has a daemon; leave one free for OpenSM or set sm_node")
                })?,
        };
        // ibsim serves at most 10 clients: OpenSM, one per daemon port, one transient probe.
        self.check_hosts(&sm_node)?;
        for tool in ["ibsim", "opensm", "sminfo", "ibaddr", "unshare"] {
            if which(tool).is_none() {
                return Err(Error::new(format!(
                    "`{tool}` not found in PATH (apt-get install ibsim-utils opensm infiniband-diags util-linux)"
                )));
            }
        }
        existing(PathBuf::from(UMAD2SIM), "apt-get install libumad2sim0")?;
        let rmpp_shim = rmpp_shim()?;
        // simverbs: the daemons' libibverbs and libibumad, and the tools' libibumad.
        let simverbs = match &self.simverbs {
            Some(p) => existing(p.clone(), "check the path")?,
            None => find_artifact(
                "ACM_FABRIC_SIMVERBS",
                "libsimverbs.so",
                "cargo build -p simverbs",
            )?,
        };
        let provider_libs = if self.start_daemons {
            existing(PathBuf::from(IBACM), "apt-get install ibacm")?;
            let libs = self
                .nodes
                .iter()
                .map(|n| {
                    let mut v: Vec<PathBuf> =
                        self.provider_of(n).library_to_copy()?.into_iter().collect();
                    for (_, p) in self.extra_providers.iter().filter(|(m, _)| m == n) {
                        v.extend(p.library_to_copy()?);
                    }
                    Ok(v)
                })
                .collect::<Result<Vec<_>>>()?;
            libs
        } else {
            vec![Vec::new(); self.nodes.len()]
        };
        let port_pool = match &self.port_pool {
            Some(p) => p.clone(),
            None => PortPool::shared()?,
        };

        let name = format!(
            "{}-{}-{}",
            self.prefix,
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let scratch = std::env::temp_dir().join(&name);
        let _ = std::fs::remove_dir_all(&scratch);
        mkdir(&scratch)?;
        process::register_scratch(scratch.clone());
        if self.keep {
            // Kept directories are never removed, not even by an emergency teardown.
            process::unregister_scratch(&scratch);
        }
        let mut fabric = Fabric {
            name,
            scratch,
            keep: self.keep,
            topology: self.topology.clone(),
            provider: self.provider.clone(),
            sm_node,
            simverbs,
            ibsim: None,
            console: PathBuf::new(),
            console_seq: Mutex::new(0),
            sm: None,
            sm_starts: 0,
            sm_dir: PathBuf::new(),
            rmpp_shim,
            sm_args: self.opensm_args.clone(),
            partitions_conf: None,
            partitions: self.partitions.clone(),
            guids: Vec::new(),
            nodes: Vec::new(),
            subnets: Vec::new(),
        };
        match fabric.bring_up(&self, &provider_libs, &port_pool, &hcas) {
            Ok(()) => Ok(fabric),
            Err(e) => {
                let report = fabric.logs_report();
                drop(fabric);
                Err(Error::new(format!("{e}\n{report}")))
            }
        }
    }
}

impl FabricBuilder {
    /// The daemons' extra environment: [`FabricBuilder::daemon_env`] plus the knobs that map to
    /// simverbs variables (an explicit `daemon_env` of the same name comes later and wins).
    fn daemon_env_with_knobs(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if let Some(code) = self.subnet_timeout {
            env.push(("SIMVERBS_SUBNET_TIMEOUT".to_string(), code.to_string()));
        }
        env.extend(self.daemon_env.iter().cloned());
        env
    }
}

impl Fabric {
    /// Shorthand for [`FabricBuilder::new`].
    pub fn builder<I, S>(topology: Topology, nodes: I) -> FabricBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        FabricBuilder::new(topology, nodes)
    }

    fn bring_up(
        &mut self,
        cfg: &FabricBuilder,
        provider_libs: &[Vec<PathBuf>],
        port_pool: &PortPool,
        hcas: &[String],
    ) -> Result<()> {
        // 1. ibsim.
        let net_path = self.scratch.join("topology.net");
        write(&net_path, &self.topology.net)?;
        let ibsim_dir = self.scratch.join("ibsim");
        mkdir(&ibsim_dir)?;
        self.console = ibsim_dir.join("console");
        let console = open_console_fifo(&self.console)?;
        let mut cmd = Command::new("ibsim");
        cmd.arg("-s")
            .arg(&net_path)
            .env("IBSIM_SOCKNAME", &self.name)
            .current_dir(&ibsim_dir)
            .stdout(file(&ibsim_dir.join("ibsim.log"))?)
            .stderr(file(&ibsim_dir.join("ibsim.err"))?);
        self.ibsim = Some(Proc::spawn_with_stdin(
            "ibsim",
            cmd,
            console.into(),
            Duration::from_secs(1),
        )?);
        let ctl = format!("@{}:ctl", self.name);
        wait_for(Duration::from_secs(10), "ibsim control socket", || {
            if let Some(p) = self.ibsim.as_mut() {
                if let Some(st) = p.try_wait() {
                    return Err(Error::new(format!("ibsim exited: {st}")));
                }
            }
            Ok(abstract_socket_exists(&ctl))
        })?;

        // 2. OpenSM, master (with the partitions, which need every member's port GUID).
        if !cfg.partitions.is_empty() {
            for h in hcas {
                let g = self.read_port_guid(h)?;
                self.guids.push((h.clone(), g));
            }
            let conf = self.scratch.join("partitions.conf");
            self.partitions_conf = Some(conf);
            self.write_partitions_conf()?;
        }
        if let Some(prefix) = cfg.subnet_prefix {
            let file = self.scratch.join("opensm.conf");
            write(&file, &format!("subnet_prefix {prefix:#018x}\n"))?;
            self.sm_args.push("-F".into());
            self.sm_args.push(file.display().to_string());
        }
        if let Some(policy) = &cfg.qos_policy {
            let file = self.scratch.join("qos-policy.conf");
            write(&file, policy)?;
            self.sm_args.push("--qos".into());
            self.sm_args.push("--qos_policy_file".into());
            self.sm_args.push(file.display().to_string());
        }
        self.start_sm_with_timeout(cfg.ready_timeout, false)?;

        // 2b. The second subnets: each its own ibsim and OpenSM, LIDs for the ports on it.
        for sub in &cfg.subnets {
            let on: Vec<String> = cfg
                .nodes
                .iter()
                .flat_map(|n| {
                    cfg.host_of(n)
                        .ports()
                        .into_iter()
                        .map(|(_, _, p)| p.clone())
                        .collect::<Vec<_>>()
                })
                .filter(|p| p.subnet.as_deref() == Some(sub.name.as_str()))
                .map(|p| p.node)
                .collect();
            if on.is_empty() {
                return Err(Error::new(format!(
                    "subnet {}: no host port is on it",
                    sub.name
                )));
            }
            let mut b = Fabric::builder(sub.topology.clone(), on)
                .name_prefix(&format!("{}-{}", self.name, sub.name))
                .subnet_prefix(sub.prefix)
                .keep_scratch(cfg.keep)
                .ready_timeout(cfg.ready_timeout)
                .port_pool(port_pool.clone())
                .start_daemons(false);
            if let Some(sm) = &sub.sm_node {
                b = b.sm_node(sm);
            }
            let f = b
                .start()
                .map_err(|e| Error::new(format!("subnet {}: {e}", sub.name)))?;
            self.subnets.push((sub.name.clone(), f));
        }

        // 3. Per-node identity, then files.
        let tools = self.tools_dir()?;
        for node in &cfg.nodes {
            let k = hcas.iter().position(|h| h == node).unwrap_or(0) + 1;
            let (lid, gid) = self.wait_lid(node, &tools, cfg.ready_timeout)?;
            let addrs = NodeAddrs::for_index(node, k, cfg.extra_names, &cfg.partitions);
            let mut ports = Vec::new();
            for (index, (ca, port, p)) in cfg.host_of(node).ports().into_iter().enumerate() {
                let index = index + 1;
                let (plid, pgid, sock) = match &p.subnet {
                    None if index == 1 => (lid, gid, self.name.clone()),
                    None => {
                        let (l, g) = self.wait_lid(&p.node, &tools, cfg.ready_timeout)?;
                        (l, g, self.name.clone())
                    }
                    Some(name) => {
                        let f = self.subnet(name)?;
                        let n = f.node(&p.node)?;
                        (n.lid, n.gid, f.name.clone())
                    }
                };
                let (name, ipv4, ipv6) = if index == 1 {
                    (addrs.name.clone(), addrs.ipv4, addrs.ipv6)
                } else {
                    HostPort::addresses(&addrs.name, index, k)
                };
                let partitions = match (&p.subnet, index) {
                    (None, 1) => addrs.partitions.clone(),
                    (None, _) => {
                        let kp = hcas.iter().position(|h| *h == p.node).unwrap_or(0) + 1;
                        HostPort::partition_addrs(&addrs.name, index, &p.node, kp, &cfg.partitions)
                    }
                    (Some(_), _) => Vec::new(),
                };
                ports.push(HostPort {
                    ca,
                    port,
                    index,
                    subnet: p.subnet.clone().unwrap_or_default(),
                    sim_node: p.node.clone(),
                    sock,
                    lid: plid,
                    gid: pgid,
                    name,
                    ipv4,
                    ipv6,
                    partitions,
                });
            }
            let dir = self.scratch.join(node);
            let run_dir = dir.join("run");
            mkdir(&run_dir)?;
            let lease = port_pool.reserve()?;
            self.nodes.push(Node {
                name: node.clone(),
                lid,
                gid,
                addrs,
                ports,
                server_port: lease.port(),
                dir,
                run_dir,
                provider: cfg.provider_of(node).clone(),
                port_lease: lease,
                port_pool: port_pool.clone(),
                port_retries: Vec::new(),
                earlier_logs: Vec::new(),
                fabric: self.name.clone(),
                scratch: self.scratch.clone(),
                daemon: None,
                launch: None,
            });
        }
        let hosts = self.hosts_data();
        for (i, libs) in provider_libs.iter().enumerate() {
            let node = &self.nodes[i];
            // The hosts-file mode first, then options for every node, then this node's own
            // (a later line of the same name replaces an earlier one).
            let mut extra: Vec<(String, String)> = match cfg.hosts_file {
                HostsFile::Written => Vec::new(),
                HostsFile::Preloaded => vec![("addr_preload".into(), "acm_hosts".into())],
                HostsFile::Absent => vec![("addr_preload".into(), "none".into())],
            };
            for global in [true, false] {
                extra.extend(
                    cfg.options
                        .iter()
                        .filter(|(only, _, _)| match only {
                            None => global,
                            Some(n) => !global && *n == node.name,
                        })
                        .map(|(_, k, v)| (k.clone(), v.clone())),
                );
            }
            if cfg.hosts_file != HostsFile::Absent {
                write(&node.dir.join("ibacm_hosts.data"), &hosts)?;
            }
            write(&node.dir.join("ibacm_addr.cfg"), &node.addr_cfg())?;
            let opts = node.opts_cfg(&node.provider, &extra)?;
            write(&node.dir.join("ibacm_opts.cfg"), &opts)?;
            let prov_dir = node.dir.join("prov");
            mkdir(&prov_dir)?;
            for lib in libs {
                let file_name = lib
                    .file_name()
                    .ok_or_else(|| Error::new("provider path has no file name"))?;
                std::fs::copy(lib, prov_dir.join(file_name)).map_err(|e| {
                    Error::new(format!(
                        "cannot copy {} to {}: {e}",
                        lib.display(),
                        prov_dir.display()
                    ))
                })?;
            }
        }
        if !cfg.start_daemons {
            return Ok(());
        }

        // 4. Daemons: start them all, then wait for each (restarting one on a new port if it
        // found its port taken).
        for node in &mut self.nodes {
            node.launch = Some(Launch {
                simverbs: self.simverbs.clone(),
                shm: self.scratch.clone(),
                env: cfg.daemon_env_with_knobs(),
                providers: std::iter::once(node.provider.name().to_string())
                    .chain(
                        cfg.extra_providers
                            .iter()
                            .filter(|(n, _)| *n == node.name)
                            .map(|(_, p)| p.name().to_string()),
                    )
                    .collect(),
                ready_timeout: cfg.ready_timeout,
            });
            node.start_daemon()?;
        }
        for node in &mut self.nodes {
            node.wait_ready_rebinding()?;
        }
        Ok(())
    }

    fn tools_dir(&self) -> Result<PathBuf> {
        let d = self.scratch.join("tools");
        mkdir(&d)?;
        Ok(d)
    }

    /// Runs an infiniband-diags style tool as HCA `host` (simverbs preloaded: the tool's
    /// libibumad, with the kernel's request timeouts and RMPP receiving, so `saquery` sees
    /// whole tables), e.g. `fabric.run_tool("Hca1", "saquery", &["-g"])`. Each call is a
    /// transient ibsim client: keep them sequential.
    pub fn run_tool(&self, host: &str, program: &str, args: &[&str]) -> Result<Output> {
        let tools = self.tools_dir()?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("LD_PRELOAD", &self.simverbs)
            .env("SIM_HOST", host)
            .env("IBSIM_SOCKNAME", &self.name)
            .current_dir(&tools);
        let out = process::run_with_timeout(program, cmd, Duration::from_secs(10), &tools)?;
        remove_sys_dirs(&tools);
        Ok(out)
    }

    /// HCA `host`'s port 1 GUID (`ibstat -p`; works before an SM runs).
    fn read_port_guid(&self, host: &str) -> Result<u64> {
        let out = self.run_tool(host, "ibstat", &["-p"])?;
        out.stdout
            .lines()
            .find_map(|l| u64::from_str_radix(l.trim().trim_start_matches("0x"), 16).ok())
            .ok_or_else(|| Error::new(format!("no port GUID of {host} in `ibstat -p`:\n{out}")))
    }

    fn write_partitions_conf(&self) -> Result<()> {
        let Some(path) = &self.partitions_conf else {
            return Ok(());
        };
        let conf = partition::partitions_conf(&self.partitions, |n| {
            self.guids.iter().find(|(h, _)| h == n).map(|(_, g)| *g)
        })?;
        write(path, &conf)
    }

    /// The partitions besides the default one, as OpenSM was last told.
    pub fn partitions(&self) -> &[Partition] {
        &self.partitions
    }

    /// Changes the partitions while everything runs: rewrites each daemon node's address
    /// file for its new memberships ([`NodeAddrs::partitions`] follows), then
    /// `partitions.conf`, and makes OpenSM re-read it (SIGHUP: a heavy sweep, which
    /// reprograms the P_Key tables). simverbs sees a table change within its monitor period
    /// and raises `IBV_EVENT_PKEY_CHANGE`; the core closes the port's endpoints and opens
    /// them again from the new table and address file. Only for a fabric started with at
    /// least one partition; see [`Fabric::wait_pkeys`] for waiting on the result.
    pub fn set_partitions(&mut self, parts: Vec<Partition>) -> Result<()> {
        if self.partitions_conf.is_none() {
            return Err(Error::new(
                "set_partitions: the fabric was started without partitions (no -P file)",
            ));
        }
        partition::check(&parts, &self.topology)?;
        let hcas = self.topology.hcas();
        for node in &mut self.nodes {
            let k = hcas.iter().position(|h| *h == node.name).unwrap_or(0) + 1;
            let extra = node.addrs.extra_names.len();
            node.addrs = NodeAddrs::for_index(&node.name, k, extra, &parts);
            node.ports[0].partitions = node.addrs.partitions.clone();
            for p in node
                .ports
                .iter_mut()
                .skip(1)
                .filter(|p| p.subnet.is_empty())
            {
                let kp = hcas.iter().position(|h| *h == p.sim_node).unwrap_or(0) + 1;
                p.partitions =
                    HostPort::partition_addrs(&node.addrs.name, p.index, &p.sim_node, kp, &parts);
            }
            write(&node.dir.join("ibacm_addr.cfg"), &node.addr_cfg())?;
        }
        self.partitions = parts;
        self.write_partitions_conf()?;
        self.signal_sm(libc::SIGHUP)
    }

    /// Waits (up to `within`) until HCA `host`'s P_Key table holds exactly `want` besides
    /// the default partition's key (order ignored, membership bits compared).
    pub fn wait_pkeys(&self, host: &str, want: &[u16], within: Duration) -> Result<()> {
        let mut want: Vec<u16> = want.to_vec();
        want.sort_unstable();
        let mut last = Vec::new();
        let r = wait_for(within, &format!("{host}'s P_Key table"), || {
            let mut t: Vec<u16> = self
                .pkey_table(host)?
                .into_iter()
                .filter(|k| k & 0x7fff != 0x7fff)
                .collect();
            t.sort_unstable();
            let ok = t == want;
            last = t;
            Ok(ok)
        });
        r.map_err(|e| Error::new(format!("{e}: table {last:04x?}, want {want:04x?}")))
    }

    /// The P_Key table of HCA `host`'s port 1 as the SM programmed it (`smpquery pkeys`),
    /// non-zero entries in table order.
    pub fn pkey_table(&self, host: &str) -> Result<Vec<u16>> {
        self.check_hca(host)?;
        let lid = self.node(host).map(|n| n.lid).ok();
        let out = match lid {
            Some(lid) => self.run_tool(&self.sm_node, "smpquery", &["pkeys", &lid.to_string()])?,
            None => self.run_tool(host, "smpquery", &["-D", "pkeys", "0"])?,
        };
        Ok(parse_pkeys(&out.stdout))
    }

    fn wait_lid(&self, node: &str, _tools: &Path, timeout: Duration) -> Result<(u16, Ipv6Addr)> {
        let mut last = String::new();
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.run_tool(node, "ibaddr", &[])?;
            if let Some((lid, gid)) = parse_ibaddr(&out.stdout) {
                if lid != 0 {
                    return Ok((lid, gid));
                }
            }
            last = format!("{last}{out}");
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "node {node} got no LID within {timeout:?}; last ibaddr:\n{last}"
                )));
            }
            last.clear();
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts OpenSM on `sm_node`; `fresh` gives it an empty cache directory of its own and
    /// `-r` (reassign LIDs).
    fn start_sm_with_timeout(&mut self, timeout: Duration, fresh: bool) -> Result<()> {
        if self.sm.is_some() {
            return Err(Error::new("OpenSM is already running"));
        }
        self.sm_starts += 1;
        let dir = if fresh {
            self.scratch
                .join(format!("opensm-fresh-{}", self.sm_starts))
        } else {
            self.scratch.join("opensm")
        };
        mkdir(&dir)?;
        let log = dir.join(format!("osm-{}.log", self.sm_starts));
        let mut cmd = Command::new("opensm");
        cmd.arg("-e")
            .arg("-f")
            .arg(&log)
            .args(["-s", "5"])
            .args(
                self.partitions_conf
                    .iter()
                    .flat_map(|p| [std::ffi::OsStr::new("-P"), p.as_os_str()]),
            )
            .args(&self.sm_args)
            .args(if fresh { &["-r"][..] } else { &[] })
            // The RMPP sender first: OpenSM's umad writes reach it before umad2sim's.
            .env(
                "LD_PRELOAD",
                format!("{}:{UMAD2SIM}", self.rmpp_shim.display()),
            )
            .env("UMAD_RMPP_STATS", dir.join(RMPP_STATS))
            .env("SIM_HOST", &self.sm_node)
            .env("IBSIM_SOCKNAME", &self.name)
            .env("OSM_TMP_DIR", &dir)
            .env("OSM_CACHE_DIR", &dir)
            .current_dir(&dir)
            .stdout(file(&dir.join(format!("osm-{}.out", self.sm_starts)))?)
            .stderr(std::process::Stdio::null());
        self.sm_dir = dir.clone();
        // OpenSM under umad2sim sometimes hangs on exit: short grace, then KILL.
        self.sm = Some(Proc::spawn("opensm", cmd, Duration::from_secs(2))?);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.sm.as_mut().and_then(|p| p.try_wait()) {
                self.sm = None;
                return Err(Error::new(format!("OpenSM exited during start: {st}")));
            }
            let out = self.run_tool(&self.sm_node, "sminfo", &[])?;
            if out.stdout.contains("SMINFO_MASTER") {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "OpenSM did not become master within {timeout:?}; last sminfo:\n{out}"
                )));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Starts OpenSM again (after [`Fabric::stop_sm`]) and waits until it is master.
    pub fn start_sm(&mut self) -> Result<()> {
        self.start_sm_with_timeout(Duration::from_secs(30), false)
    }

    /// Moves the SM: stops OpenSM and starts it on HCA `host`, waiting until it is master
    /// (every port's MasterSMLID changes). With `reassign_lids` the new OpenSM starts with an
    /// empty cache and `-r`, so LIDs may change; [`Node::lid`] keeps the bring-up value.
    pub fn move_sm(&mut self, host: &str, reassign_lids: bool) -> Result<()> {
        if !self.topology.hcas().iter().any(|h| h == host) {
            return Err(Error::new(format!(
                "SM node {host:?} is not an HCA of the topology"
            )));
        }
        self.stop_sm();
        self.sm_node = host.to_string();
        self.start_sm_with_timeout(Duration::from_secs(30), reassign_lids)
    }

    /// Force-disconnects (ibsim console `X <n>`) every ibsim client whose process is gone, and
    /// returns how many.
    ///
    /// ibsim has 10 client slots and notices a dead client only when a packet to it fails. A
    /// process that leaves without telling it (a daemon stopped with SIGTERM, a node process
    /// that skips its exit handlers) keeps its slots: without this, a fabric that sees such
    /// processes come and go runs out of slots (`sim_init: connect failed`).
    ///
    /// A client is alive while its input socket, `@<fabric>:in<id>` (abstract, `<id>` as
    /// ibsim lists it), is bound: umad2sim names it after its PID, simverbs' GSI bridges after
    /// an id of their own (not a PID), and a process's sockets go when it does.
    pub fn reap_dead_clients(&self) -> Result<usize> {
        let list = self.ibsim_command("Attached")?;
        let bound: std::collections::BTreeSet<String> = std::fs::read_to_string("/proc/net/unix")
            .map_err(|e| Error::new(format!("/proc/net/unix: {e}")))?
            .lines()
            .filter_map(|l| l.split_whitespace().nth(7))
            .filter(|p| p.starts_with('@'))
            // A NUL the binder counted into the name shows as a trailing '@'.
            .map(|p| p.trim_end_matches('@').to_string())
            .collect();
        let mut n = 0;
        // `Client 3: pid 1234 connected at "Hca3" port 0x..., lid 5, qp 0 ...`
        for line in list.lines() {
            let Some(rest) = line.trim().strip_prefix("Client ") else {
                continue;
            };
            let Some((slot, rest)) = rest.split_once(':') else {
                continue;
            };
            let id = rest
                .split_whitespace()
                .skip_while(|w| *w != "pid")
                .nth(1)
                .and_then(|p| p.parse::<i64>().ok());
            if let (Ok(slot), Some(id)) = (slot.trim().parse::<u32>(), id) {
                if !bound.contains(&format!("@{}:in{id}", self.name)) {
                    self.ibsim_command(&format!("X {slot}"))?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// Runs one command on ibsim's console (`Unlink "Hca3"[1]`, `ReLink "Hca3"[1]`,
    /// `Baselid ...`, `Dump "Hca3"`, see ibsim's `Help`) and returns what it printed (prompts
    /// removed). ibsim reports its errors as lines starting with `#`; this does not judge the
    /// output (see [`Fabric::port_down`] for a checked use). Commands are serialised; each one
    /// is followed by a `# acm-fabric N done` marker line whose echo in ibsim's log says it is done.
    pub fn ibsim_command(&self, line: &str) -> Result<String> {
        // ibsim reads console lines into a 128-byte buffer; longer ones would be split.
        if line.len() > 100 || line.contains(['\n', '\r']) || line.trim().is_empty() {
            return Err(Error::new(format!(
                "bad ibsim console command {line:?} (one line, 1..=100 bytes)"
            )));
        }
        if self.ibsim.is_none() {
            return Err(Error::new("ibsim is not running"));
        }
        let mut seq = self.console_seq.lock().unwrap_or_else(|e| e.into_inner());
        *seq += 1;
        let marker = format!("# acm-fabric {} done", *seq);
        let log = self.scratch.join("ibsim").join("ibsim.log");
        let start = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) as usize;
        // A reader (ibsim itself) always has the FIFO open, so a non-blocking open succeeds
        // at once and one write of < PIPE_BUF bytes is atomic.
        let mut w = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.console)
            .map_err(|e| {
                Error::new(format!(
                    "cannot open ibsim console {}: {e}",
                    self.console.display()
                ))
            })?;
        std::io::Write::write_all(&mut w, format!("{line}\n{marker}\n").as_bytes())
            .map_err(|e| Error::new(format!("cannot write to ibsim console: {e}")))?;
        drop(w);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read(&log).unwrap_or_default();
            let text = String::from_utf8_lossy(text.get(start..).unwrap_or(&[]));
            if let Some(i) = text.find(&marker) {
                return Ok(text[..i].replace("sim> ", "").trim().to_string());
            }
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "ibsim did not answer console command {line:?} within 10 s; log so far:\n{text}"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Takes HCA `host`'s port 1 link down, as pulling its cable would: ibsim `Unlink`s it, so
    /// its PortInfo reads Down/Polling (simverbs' port monitor then raises
    /// `IBV_EVENT_PORT_ERR` in the node's processes, and its datagrams stop), the switch sends
    /// trap 128 and OpenSM drops the port from the subnet. Returns once PortInfo reads Down
    /// and, if `host` runs a daemon, its core has closed the port (`ib_acme -e` lists no
    /// endpoint of the provider there). A daemon host's other ports: [`Fabric::port_down_at`].
    pub fn port_down(&self, host: &str) -> Result<()> {
        if self.nodes.iter().any(|n| n.name == host) {
            return self.port_down_at(host, 1);
        }
        self.unlink(host)
    }

    /// Brings HCA `host`'s port 1 link back (ibsim `ReLink` to its previous peer) and waits
    /// until the SM has made it ACTIVE again (up to 20 s; OpenSM sweeps on the switch's trap
    /// 128). simverbs then raises `IBV_EVENT_PORT_ACTIVE`; if `host` runs a daemon, this also
    /// waits (up to 15 s) until its core has reopened the port (`-e` lists the endpoint
    /// again). Fails if the port was not down or no SM brings it up in time.
    pub fn port_up(&self, host: &str) -> Result<PortInfo> {
        if self.nodes.iter().any(|n| n.name == host) {
            return self.port_up_at(host, 1);
        }
        self.relink(host)
    }

    /// [`Fabric::port_down`] of daemon node `node`'s port `index` (1-based, [`Node::ports`]):
    /// the ibsim node behind it is unlinked on its subnet, and this returns once the daemon
    /// closed that port's endpoints.
    pub fn port_down_at(&self, node: &str, index: usize) -> Result<()> {
        let n = self.node(node)?;
        let p = n.port_at(index)?;
        self.fabric_of(&p.subnet)?.unlink(&p.sim_node)?;
        n.wait_endpoint(index, false, Duration::from_secs(10))
    }

    /// [`Fabric::port_up`] of daemon node `node`'s port `index`.
    pub fn port_up_at(&self, node: &str, index: usize) -> Result<PortInfo> {
        let n = self.node(node)?;
        let p = n.port_at(index)?;
        let pi = self.fabric_of(&p.subnet)?.relink(&p.sim_node)?;
        n.wait_endpoint(index, true, Duration::from_secs(15))?;
        Ok(pi)
    }

    fn unlink(&self, host: &str) -> Result<()> {
        self.check_hca(host)?;
        let out = self.ibsim_command(&format!("Unlink \"{host}\"[1]"))?;
        if let Some(err) = out.lines().find(|l| l.starts_with('#')) {
            return Err(Error::new(format!("ibsim refused to unlink {host}: {err}")));
        }
        let pi = self.port_info(host)?;
        if pi.state != "Down" {
            return Err(Error::new(format!(
                "{host} port 1 reads {pi:?} after Unlink"
            )));
        }
        Ok(())
    }

    fn relink(&self, host: &str) -> Result<PortInfo> {
        self.check_hca(host)?;
        let out = self.ibsim_command(&format!("ReLink \"{host}\"[1]"))?;
        if let Some(err) = out.lines().find(|l| l.starts_with('#')) {
            return Err(Error::new(format!("ibsim refused to relink {host}: {err}")));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let pi = self.port_info(host)?;
            if pi.state == "Active" && pi.lid != 0 {
                return Ok(pi);
            }
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "{host} port 1 not ACTIVE 20 s after ReLink (is OpenSM running?): {pi:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The second subnet `name` ([`FabricBuilder::subnet`]): its own ibsim and OpenSM, for
    /// `stop_sm`, `pause_sm`, `port_info`, `ibsim_command`, ... on it.
    pub fn subnet(&self, name: &str) -> Result<&Fabric> {
        self.subnets
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, f)| f)
            .ok_or_else(|| Error::new(format!("no subnet {name:?}")))
    }

    /// [`Fabric::subnet`], mutably (to stop and start its OpenSM).
    pub fn subnet_mut(&mut self, name: &str) -> Result<&mut Fabric> {
        self.subnets
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, f)| f)
            .ok_or_else(|| Error::new(format!("no subnet {name:?}")))
    }

    /// This fabric for `""`, else the subnet of that name.
    pub fn fabric_of(&self, subnet: &str) -> Result<&Fabric> {
        if subnet.is_empty() {
            Ok(self)
        } else {
            self.subnet(subnet)
        }
    }

    /// Raises `IBV_EVENT_CLIENT_REREGISTER` on every daemon port of subnet `subnet` (`""`:
    /// the main one), as its SM would after a new sweep, and on no other; returns how many
    /// ports were told.
    pub fn client_reregister_subnet(&self, subnet: &str) -> Result<usize> {
        let mut told = 0;
        for node in self.nodes.iter().filter(|n| n.daemon.is_some()) {
            for p in node.ports.iter().filter(|p| p.subnet == subnet) {
                node.port_event(p.index, "client_reregister")?;
                told += 1;
            }
        }
        Ok(told)
    }

    /// HCA `host`'s port 1 as the fabric says right now (`smpquery -D portinfo 0 1` run as
    /// that HCA; a transient ibsim client).
    pub fn port_info(&self, host: &str) -> Result<PortInfo> {
        self.check_hca(host)?;
        let out = self.run_tool(host, "smpquery", &["-D", "portinfo", "0", "1"])?;
        PortInfo::parse(&out.stdout)
            .ok_or_else(|| Error::new(format!("cannot read {host}'s PortInfo:\n{out}")))
    }

    /// Re-reads every daemon node's LID and GID from the fabric (`ibaddr`), e.g. after
    /// [`Fabric::move_sm`] with `reassign_lids`; returns the nodes whose LID changed as
    /// `(name, old, new)`.
    pub fn refresh_lids(&mut self) -> Result<Vec<(String, u16, u16)>> {
        let mut changed = Vec::new();
        let tools = self.tools_dir()?;
        for i in 0..self.nodes.len() {
            let name = self.nodes[i].name.clone();
            let (lid, gid) = self.wait_lid(&name, &tools, Duration::from_secs(20))?;
            let n = &mut self.nodes[i];
            if n.lid != lid {
                changed.push((name.clone(), n.lid, lid));
            }
            n.lid = lid;
            n.gid = gid;
            n.ports[0].lid = lid;
            n.ports[0].gid = gid;
            for j in 1..self.nodes[i].ports.len() {
                let p = self.nodes[i].ports[j].clone();
                let (l, g) = if p.subnet.is_empty() {
                    self.wait_lid(&p.sim_node, &tools, Duration::from_secs(20))?
                } else {
                    let f = self.subnet(&p.subnet)?;
                    f.wait_lid(&p.sim_node, &f.tools_dir()?, Duration::from_secs(20))?
                };
                if p.lid != l {
                    changed.push((format!("{name}@{}", p.index), p.lid, l));
                }
                let q = &mut self.nodes[i].ports[j];
                q.lid = l;
                q.gid = g;
            }
        }
        Ok(changed)
    }

    /// Raises `IBV_EVENT_CLIENT_REREGISTER` in every daemon node (simverbs control socket).
    /// A real OpenSM sets PortInfo.ClientReregister on every port in its first sweep as a new
    /// master, and on ports it newly discovers (e.g. after a link comes up); ibsim drops that
    /// bit, so call this after [`Fabric::move_sm`] / [`Fabric::start_sm`] (or
    /// [`Fabric::port_up`]) when a test wants what a real SM would cause. Returns how many
    /// nodes were told.
    pub fn client_reregister_all(&self) -> Result<usize> {
        let mut n = 0;
        for node in &self.nodes {
            if node.daemon.is_some() {
                node.event("client_reregister")?;
                n += 1;
            }
        }
        Ok(n)
    }

    fn check_hca(&self, host: &str) -> Result<()> {
        if self.topology.hcas().iter().any(|h| h == host) {
            Ok(())
        } else {
            Err(Error::new(format!(
                "{host:?} is not an HCA of topology {}",
                self.topology.label
            )))
        }
    }

    /// Stops OpenSM (TERM, then KILL after 2 s).
    pub fn stop_sm(&mut self) {
        // A paused OpenSM would sit on its TERM until it was killed.
        let _ = self.resume_sm();
        if let Some(mut p) = self.sm.take() {
            p.stop();
        }
    }

    /// Freezes OpenSM (SIGSTOP): the SA is gone, as with a hung or overloaded SM, while its
    /// process, LIDs and subscriptions stay. [`resume_sm`](Self::resume_sm) continues it.
    pub fn pause_sm(&self) -> Result<()> {
        self.signal_sm(libc::SIGSTOP)
    }

    /// Continues OpenSM after [`pause_sm`](Self::pause_sm) (SIGCONT).
    pub fn resume_sm(&self) -> Result<()> {
        self.signal_sm(libc::SIGCONT)
    }

    fn signal_sm(&self, sig: i32) -> Result<()> {
        let pid = self
            .sm
            .as_ref()
            .map(|p| p.pid())
            .ok_or_else(|| Error::new("OpenSM is not running"))?;
        // SAFETY: kill has no memory preconditions; the PID is our own child's.
        if unsafe { libc::kill(pid, sig) } != 0 {
            return Err(Error::new(format!(
                "kill({pid}, {sig}): {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(())
    }

    /// Whether OpenSM is running.
    pub fn sm_running(&mut self) -> bool {
        match self.sm.as_mut() {
            Some(p) => p.try_wait().is_none(),
            None => false,
        }
    }

    /// The fabric's name (`IBSIM_SOCKNAME`, also the simverbs fabric name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The RMPP sender library OpenSM runs with.
    pub fn rmpp_shim(&self) -> &Path {
        &self.rmpp_shim
    }

    /// The RMPP sender's counters in the running (or last) OpenSM (docs/umad-rmpp.md):
    /// `transfers`, `completed`, `stopped`, `segments_sent`, ... Empty until OpenSM sent its
    /// first RMPP answer (the file is written when a transfer starts or ends).
    pub fn rmpp_stats(&self) -> Result<std::collections::BTreeMap<String, u64>> {
        let p = self.sm_dir.join(RMPP_STATS);
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(Error::new(format!("{}: {e}", p.display()))),
        };
        Ok(text
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once('=')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect())
    }

    /// The scratch directory (removed at teardown unless kept).
    pub fn scratch(&self) -> &Path {
        &self.scratch
    }

    /// The HCA OpenSM runs as.
    pub fn sm_node(&self) -> &str {
        &self.sm_node
    }

    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The default provider ([`FabricBuilder::provider`]); each node's own is
    /// [`Node::provider`].
    pub fn provider(&self) -> &Provider {
        &self.provider
    }

    /// Whether the daemon nodes do not all load the same provider.
    pub fn is_mixed(&self) -> bool {
        self.nodes
            .windows(2)
            .any(|w| w[0].provider.name() != w[1].provider.name())
    }

    /// All daemon nodes, in the order given.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// A daemon node by name (`Hca3`).
    pub fn node(&self, name: &str) -> Result<&Node> {
        self.nodes.iter().find(|n| n.name == name).ok_or_else(|| {
            Error::new(format!(
                "no daemon node {name:?} (nodes: {})",
                self.nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }

    /// A daemon node by name, mutably (to stop or restart its daemon).
    pub fn node_mut(&mut self, name: &str) -> Result<&mut Node> {
        let idx = self
            .nodes
            .iter()
            .position(|n| n.name == name)
            .ok_or_else(|| Error::new(format!("no daemon node {name:?}")))?;
        Ok(&mut self.nodes[idx])
    }

    /// PIDs of every process the fabric currently runs (ibsim, OpenSM, daemons).
    pub fn pids(&self) -> Vec<i32> {
        let mut v = Vec::new();
        v.extend(self.ibsim.as_ref().map(Proc::pid));
        v.extend(self.sm.as_ref().map(Proc::pid));
        v.extend(
            self.nodes
                .iter()
                .filter_map(|n| n.daemon.as_ref().map(Proc::pid)),
        );
        for (_, f) in &self.subnets {
            v.extend(f.pids());
        }
        v
    }

    /// `ibacm_hosts.data` content: every daemon node's name, IPv4 and IPv6 mapped to its GID.
    pub fn hosts_data(&self) -> String {
        let mut s = String::from("# generated by acm-fabric\n");
        for n in &self.nodes {
            let own = [
                n.addrs.name.clone(),
                n.addrs.ipv4.to_string(),
                n.addrs.ipv6.to_string(),
            ];
            let parts = n
                .addrs
                .partitions
                .iter()
                .flat_map(|p| [p.name.clone(), p.ipv4.to_string(), p.ipv6.to_string()]);
            for a in own.into_iter().chain(parts) {
                s.push_str(&format!("{a} {}\n", n.gid));
            }
            for p in n.ports.iter().skip(1) {
                let parts = p
                    .partitions
                    .iter()
                    .flat_map(|q| [q.name.clone(), q.ipv4.to_string(), q.ipv6.to_string()]);
                for a in [p.name.clone(), p.ipv4.to_string(), p.ipv6.to_string()]
                    .into_iter()
                    .chain(parts)
                {
                    s.push_str(&format!("{a} {}\n", p.gid));
                }
            }
        }
        s
    }

    /// Every node's daemon log tail, the OpenSM and ibsim logs: for failure messages.
    pub fn logs_report(&self) -> String {
        let mut s = format!(
            "==== fabric {} (scratch {}) ====\n",
            self.name,
            self.scratch.display()
        );
        for n in &self.nodes {
            s.push_str(&format!(
                "---- {} ibacm.log (tail) ----\n{}\n---- {} ibacm.out ----\n{}\n",
                n.name,
                tail(&n.log_path(), 80),
                n.name,
                tail(&n.dir.join("ibacm.out"), 20)
            ));
        }
        for i in 1..=self.sm_starts {
            let p = self.scratch.join("opensm").join(format!("osm-{i}.log"));
            s.push_str(&format!(
                "---- OpenSM log {i} (tail) ----\n{}\n",
                tail(&p, 25)
            ));
        }
        s.push_str(&format!(
            "---- ibsim (tail) ----\n{}\n",
            tail(&self.scratch.join("ibsim").join("ibsim.log"), 10)
        ));
        for (name, f) in &self.subnets {
            s.push_str(&format!("==== subnet {name} ====\n{}", f.logs_report()));
        }
        s
    }

    fn teardown(&mut self) {
        for n in &mut self.nodes {
            n.stop_daemon();
        }
        // The daemons are gone: the second subnets' ibsim and OpenSM next.
        self.subnets.clear();
        self.stop_sm();
        if let Some(mut p) = self.ibsim.take() {
            p.stop();
        }
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.scratch);
        }
        process::unregister_scratch(&self.scratch);
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs_report());
        }
        self.teardown();
    }
}

impl Node {
    /// Path of the daemon's log (`log_file`).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("ibacm.log")
    }

    /// The logs of the daemon's earlier runs on this node (`ibacm.log.1`, ...: each start
    /// moves the previous log there, since the core truncates its log file), oldest first.
    pub fn earlier_logs(&self) -> &[PathBuf] {
        &self.earlier_logs
    }

    /// The daemon's log so far (of its current or last run; see [`Node::earlier_logs`]).
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(self.log_path()).unwrap_or_default()).into_owned()
    }

    /// The provider this node's daemon loads ([`FabricBuilder::node_provider`], else the
    /// fabric's default).
    pub fn provider(&self) -> &Provider {
        &self.provider
    }

    /// Ports this node's daemon found taken at a start (`unable to bind listen socket` in its
    /// log) and was restarted away from, oldest first; normally empty.
    pub fn port_retries(&self) -> &[u16] {
        &self.port_retries
    }

    /// The daemon's PID, if running.
    pub fn pid(&self) -> Option<i32> {
        self.daemon.as_ref().map(Proc::pid)
    }

    /// Whether the daemon is running.
    pub fn daemon_running(&mut self) -> bool {
        match self.daemon.as_mut() {
            Some(p) => p.try_wait().is_none(),
            None => false,
        }
    }

    fn addr_cfg(&self) -> String {
        let mut s = format!(
            "# generated by acm-fabric for {}\n{} ibsim0 1 default\n{} ibsim0 1 default\n{} ibsim0 1 default\n",
            self.name, self.addrs.name, self.addrs.ipv4, self.addrs.ipv6
        );
        for n in &self.addrs.extra_names {
            s.push_str(&format!("{n} ibsim0 1 default\n"));
        }
        for p in &self.addrs.partitions {
            for a in [p.name.clone(), p.ipv4.to_string(), p.ipv6.to_string()] {
                s.push_str(&format!("{a} ibsim0 1 0x{:04x}\n", p.pkey));
            }
        }
        // The host's further ports: their own names and IPs, on their device and port.
        for p in self.ports.iter().skip(1) {
            for a in [p.name.clone(), p.ipv4.to_string(), p.ipv6.to_string()] {
                s.push_str(&format!("{a} {} {} default\n", p.ca, p.port));
            }
            for q in &p.partitions {
                for a in [q.name.clone(), q.ipv4.to_string(), q.ipv6.to_string()] {
                    s.push_str(&format!("{a} {} {} 0x{:04x}\n", p.ca, p.port, q.pkey));
                }
            }
        }
        s
    }

    fn opts_cfg(&self, provider: &Provider, extra: &[(String, String)]) -> Result<String> {
        // The template from the installed ib_acme, so every option the core and ibacmp know
        // is present with its default.
        let out = process::run_with_timeout(
            "ib_acme -O",
            {
                let mut c = Command::new(IB_ACME);
                c.args(["-O", "-D"]).arg(&self.dir);
                c
            },
            Duration::from_secs(10),
            &self.scratch,
        )?;
        let template_path = self.dir.join("ibacm_opts.cfg");
        let template = std::fs::read_to_string(&template_path).map_err(|e| {
            Error::new(format!(
                "`ib_acme -O -D {}` wrote no template ({e}); its output:\n{out}",
                self.dir.display()
            ))
        })?;
        let d = |p: &str| self.dir.join(p).display().to_string();
        let mut overrides: Vec<(String, String)> = vec![
            ("log_file".into(), d("ibacm.log")),
            ("log_level".into(), "2".into()),
            ("lock_file".into(), "/run/ibacm.pid".into()),
            ("server_mode".into(), "loop".into()),
            ("server_port".into(), self.server_port.to_string()),
            ("provider_lib_path".into(), d("prov")),
            ("support_ips_in_addr_cfg".into(), "1".into()),
            ("addr_data_file".into(), d("ibacm_hosts.data")),
            ("route_data_file".into(), d("ibacm_route.data")),
        ];
        if provider.is_installed() {
            // The daemon's compiled-in directory, as on an installed system (the template's
            // `provider_lib_path` line is a comment and stays one).
            overrides.retain(|(k, _)| k != "provider_lib_path");
        }
        overrides.extend(extra.iter().cloned());
        let mut lines: Vec<String> = template.lines().map(str::to_string).collect();
        let mut appended = Vec::new();
        for (k, v) in &overrides {
            let line = format!("{k} {v}");
            if line.len() >= 119 {
                return Err(Error::new(format!(
                    "option line too long for ibacm's 120-byte reader: {line}"
                )));
            }
            let slot = if k.eq_ignore_ascii_case("provider") {
                None
            } else {
                lines.iter().position(|l| {
                    !l.starts_with('#')
                        && l.split_whitespace()
                            .next()
                            .is_some_and(|w| w.eq_ignore_ascii_case(k))
                })
            };
            match slot {
                Some(i) => lines[i] = line,
                None => appended.push(line),
            }
        }
        lines.push(String::new());
        lines.push("# acm-fabric".into());
        lines.extend(appended);
        lines.push(format!("provider {} default", provider.name()));
        lines.push(String::new());
        Ok(lines.join("\n"))
    }

    fn ns_command(&self, program: &str) -> Command {
        let mut c = Command::new("unshare");
        c.args([
            "-m",
            "sh",
            "-c",
            r#"mount --bind "$1" /run && shift && exec "$@""#,
            "sh",
        ])
        .arg(&self.run_dir)
        .arg(program)
        .current_dir(&self.dir);
        c
    }

    fn start_daemon(&mut self) -> Result<()> {
        let Some(launch) = self.launch.clone() else {
            return Err(Error::new(format!(
                "{}: the fabric was started without daemons",
                self.name
            )));
        };
        let (simverbs, shm, env) = (&launch.simverbs, &launch.shm, &launch.env);
        if self.daemon.is_some() {
            return Err(Error::new(format!("{}: daemon already running", self.name)));
        }
        // Only the daemon gets the preloads (not unshare/sh/mount): `env` execs it in place.
        let mut cmd = self.ns_command("env");
        // simverbs is the daemon's libibverbs and libibumad: its host is every port.
        cmd.arg(format!("LD_PRELOAD={}", simverbs.display()))
            .arg(format!(
                "SIMVERBS_HOST={}",
                host::simverbs_host(&self.ports)
            ))
            .arg(IBACM)
            .arg("-P")
            .arg("-O")
            .arg(self.dir.join("ibacm_opts.cfg"))
            .arg("-A")
            .arg(self.dir.join("ibacm_addr.cfg"))
            .env("SIM_HOST", &self.name)
            .env("IBSIM_SOCKNAME", &self.fabric)
            .env("SIMVERBS_SHM_DIR", shm)
            // The kernel's RDMA netlink local service, simulated: Node::kernel is its other end.
            .env("SIMVERBS_NETLINK_DIR", &self.dir)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(file(&self.dir.join("ibacm.out"))?)
            .stderr(file_append(&self.dir.join("ibacm.out"))?);
        let _ = std::fs::remove_file(self.run_dir.join("ibacm-tcp.port"));
        let _ = std::fs::remove_file(self.run_dir.join("ibacm.port"));
        // The core truncates its log when it starts: keep the previous run's.
        if std::fs::metadata(self.log_path()).is_ok_and(|m| m.len() > 0) {
            let keep = self
                .dir
                .join(format!("ibacm.log.{}", self.earlier_logs.len() + 1));
            std::fs::rename(self.log_path(), &keep).map_err(|e| {
                Error::new(format!("cannot move {}: {e}", self.log_path().display()))
            })?;
            self.earlier_logs.push(keep);
        }
        self.daemon = Some(Proc::spawn(
            &format!("ibacm@{}", self.name),
            cmd,
            Duration::from_secs(3),
        )?);
        Ok(())
    }

    /// Starts the daemon again after [`Node::stop_daemon`] (same files, same port, unless the
    /// port was taken meanwhile: then a new one, see [`Node::port_retries`]) and waits until
    /// `ib_acme -e` lists its endpoint. The provider's caches start empty.
    pub fn restart_daemon(&mut self) -> Result<()> {
        self.start_daemon()?;
        self.wait_ready_rebinding()
    }

    /// Whether the core said, since the last start, that it could not bind `server_port`.
    fn bind_failed(&self) -> bool {
        let log = self.log();
        log.contains("ERROR - unable to bind listen socket")
            || log.contains("ERROR - server listen failed")
    }

    /// [`Node::wait_ready`]; if the daemon could not bind its port (another process took it
    /// between the lease's check and the daemon's bind), stops it, leases a new port, rewrites
    /// `server_port` in its opts file and starts it again (up to 5 times).
    fn wait_ready_rebinding(&mut self) -> Result<()> {
        const ATTEMPTS: usize = 5;
        for attempt in 1..=ATTEMPTS {
            match self.wait_ready() {
                Ok(()) => return Ok(()),
                Err(e) if self.bind_failed() && attempt < ATTEMPTS => {
                    let old = self.server_port;
                    self.stop_daemon();
                    // The old lease is still held, so it cannot come back.
                    let lease = self.port_pool.reserve_avoiding(&self.port_retries)?;
                    self.port_retries.push(old);
                    self.server_port = lease.port();
                    self.port_lease = lease;
                    self.set_opts_server_port()?;
                    eprintln!(
                        "acm-fabric: {}: ibacm could not bind port {old} ({e}); restarting on {}",
                        self.name, self.server_port
                    );
                    self.start_daemon()?;
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the last attempt returns")
    }

    /// Rewrites the `server_port` line of the node's `ibacm_opts.cfg` to [`Node::server_port`].
    fn set_opts_server_port(&self) -> Result<()> {
        let path = self.dir.join("ibacm_opts.cfg");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::new(format!("cannot read {}: {e}", path.display())))?;
        let mut found = false;
        let lines: Vec<String> = text
            .lines()
            .map(|l| {
                if l.split_whitespace().next() == Some("server_port") {
                    found = true;
                    format!("server_port {}", self.server_port)
                } else {
                    l.to_string()
                }
            })
            .collect();
        if !found {
            return Err(Error::new(format!(
                "{} has no server_port line",
                path.display()
            )));
        }
        write(&path, &(lines.join("\n") + "\n"))
    }

    /// If this node runs a daemon: waits until `ib_acme -e` does (`present`) or does not list
    /// an endpoint of its provider on its port `index` (1-based, [`Node::ports`]), i.e. until
    /// the core finished that port's open / close sequence (both run on the core's main
    /// thread, which also answers `-e`).
    fn wait_endpoint(&self, index: usize, present: bool, timeout: Duration) -> Result<()> {
        let (Some(launch), Some(_)) = (&self.launch, &self.daemon) else {
            return Ok(());
        };
        let port = self.port_at(index)?;
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.acme(&["-e"])?;
            let listed = !launch.serves_none(&out.stdout, &self.ports, port);
            if listed == present {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "{} {} port {}: the daemon {} its endpoint within {timeout:?}:\n{out}",
                    self.name,
                    port.ca,
                    port.port,
                    if present {
                        "did not reopen"
                    } else {
                        "did not close"
                    }
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_ready(&mut self) -> Result<()> {
        let Some(launch) = self.launch.clone() else {
            return Err(Error::new(format!("{}: no daemon", self.name)));
        };
        let (provider, timeout) = (launch.providers.join(" or "), launch.ready_timeout);
        let port_file = self.run_dir.join("ibacm-tcp.port");
        let name = self.name.clone();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.daemon.as_mut().and_then(|p| p.try_wait()) {
                self.daemon = None;
                return Err(Error::new(format!(
                    "{name}: ibacm exited during start: {st}"
                )));
            }
            // The core writes its port file *before* it binds: only a daemon that listens on
            // its port is asked (else `ib_acme` could reach whoever holds the port).
            if self.bind_failed() {
                return Err(Error::new(format!(
                    "{name}: ibacm could not bind server_port {}",
                    self.server_port
                )));
            }
            let listening = self
                .daemon
                .as_ref()
                .is_some_and(|p| listens_on(p.pid(), self.server_port));
            if port_file.exists() && listening {
                let out = self.acme(&["-e"])?;
                let all: Vec<&HostPort> = self.ports.iter().collect();
                if out.success() && launch.serves(&out.stdout, &self.ports, &all) {
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    return Err(Error::new(format!(
                        "{name}: `ib_acme -e` shows no endpoint of provider {provider} within {timeout:?}:\n{out}"
                    )));
                }
            } else if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "{name}: ibacm wrote no {} or does not listen on port {} within {timeout:?}",
                    port_file.display(),
                    self.server_port
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the daemon (TERM, then KILL after 3 s).
    pub fn stop_daemon(&mut self) {
        if let Some(mut p) = self.daemon.take() {
            p.stop();
        }
        remove_sys_dirs(&self.dir);
    }

    /// Runs the real `ib_acme` against this node's daemon (in its `/run` namespace), with a
    /// 30 s timeout, e.g. `node.acme(&["-f", "n", "-s", "hca3", "-d", "hca4", "-v"])`.
    /// (Some options exit non-zero even when they work, e.g. `-P`: check the output.)
    /// `-S 127.0.0.1` is added unless `args` has `-S` (in `server_mode loop` ib_acme only
    /// uses TCP when given a service address; it reads the port from `/run/ibacm.port`).
    pub fn acme(&self, args: &[&str]) -> Result<Output> {
        let mut argv: Vec<&str> = Vec::with_capacity(args.len() + 2);
        if !args.contains(&"-S") {
            argv.extend(["-S", "127.0.0.1"]);
        }
        argv.extend_from_slice(args);
        self.run(IB_ACME, &argv, Duration::from_secs(30))
    }

    /// Runs `ib_acme` repeatedly (every 200 ms) until `accept` returns true or `timeout`
    /// passes; returns the last output either way (check it).
    pub fn acme_until(
        &self,
        args: &[&str],
        timeout: Duration,
        accept: impl Fn(&Output) -> bool,
    ) -> Result<Output> {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.acme(args)?;
            if accept(&out) || Instant::now() >= deadline {
                return Ok(out);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The kernel's end of the daemon's RDMA netlink local-service socket (simulated by
    /// simverbs): requests as kernel consumers send them, answers as the kernel reads them.
    pub fn kernel(&self) -> Result<crate::kernel::KernelLs> {
        crate::kernel::KernelLs::bind(&self.dir)
    }

    /// A client connection to the daemon's socket (one request in flight at a time), for
    /// requests `ib_acme` cannot make (a PATH with a ServiceID, a QoS class, ...).
    pub fn client(&self) -> Result<crate::client::Conn> {
        crate::client::Conn::open(self.server_port).map_err(|e| {
            Error::new(format!(
                "{}: connect to 127.0.0.1:{}: {e}",
                self.name, self.server_port
            ))
        })
    }

    /// Runs any program in this node's `/run` namespace (no preloads), in the node directory.
    pub fn run(&self, program: &str, args: &[&str], timeout: Duration) -> Result<Output> {
        let mut cmd = self.ns_command(program);
        cmd.args(args);
        process::run_with_timeout(program, cmd, timeout, &self.scratch)
    }

    /// Sends a command to the node's simverbs control socket
    /// (`@simverbs/<fabric>/<node>/ctl`) and returns its reply (`ok ...`), e.g.
    /// `node.simverbs_ctl("event client_reregister 1")`.
    pub fn simverbs_ctl(&self, command: &str) -> Result<String> {
        simverbs_ctl(&self.fabric, &self.name, command)
    }

    /// Queues an async event on the node's simulated device, e.g. `client_reregister`.
    pub fn event(&self, event: &str) -> Result<String> {
        self.simverbs_ctl(&format!("event {event} 1"))
    }

    /// Queues an async event on the node's port `index` (1-based, [`Node::ports`]): on that
    /// port's CA only.
    pub fn port_event(&self, index: usize, event: &str) -> Result<String> {
        let p = self.port_at(index)?;
        self.simverbs_ctl(&format!("event {event} {} {}", p.port, p.ca))
    }

    /// The node's port `index` (1-based, spec order).
    pub fn port_at(&self, index: usize) -> Result<&HostPort> {
        index
            .checked_sub(1)
            .and_then(|i| self.ports.get(i))
            .ok_or_else(|| {
                Error::new(format!(
                    "{} has {} port(s), no port {index}",
                    self.name,
                    self.ports.len()
                ))
            })
    }

    /// The node's port `port` of CA `ca`.
    pub fn port_of(&self, ca: &str, port: u8) -> Result<&HostPort> {
        self.ports
            .iter()
            .find(|p| p.ca == ca && p.port == port)
            .ok_or_else(|| Error::new(format!("{} has no {ca} port {port}", self.name)))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop_daemon();
    }
}

/// Sends `command` to the simverbs control socket of the process that is HCA `node` on
/// fabric `fabric` (`@simverbs/<fabric>/<node>/ctl`) and returns its `ok ...` reply; an
/// error names what refused or did not answer. Any process running with simverbs (a daemon,
/// a test agent) serves one.
pub fn simverbs_ctl(fabric: &str, node: &str, command: &str) -> Result<String> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let me = format!(
        "acm-fabric/{fabric}/{}/{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let io = |e: std::io::Error| Error::new(format!("simverbs control of {node}: {e}"));
    let sock = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(me.as_bytes()).map_err(io)?)
        .map_err(io)?;
    sock.set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(io)?;
    let to = format!("simverbs/{fabric}/{node}/ctl");
    let to_addr = SocketAddr::from_abstract_name(to.as_bytes()).map_err(io)?;
    sock.send_to_addr(command.as_bytes(), &to_addr)
        .map_err(|e| {
            Error::new(format!(
                "cannot reach @{to} (is a process running there with simverbs?): {e}"
            ))
        })?;
    let mut buf = [0u8; 512];
    let n = sock
        .recv(&mut buf)
        .map_err(|e| Error::new(format!("no reply from @{to} to {command:?}: {e}")))?;
    let reply = String::from_utf8_lossy(&buf[..n]).trim().to_string();
    if reply.starts_with("ok") {
        Ok(reply)
    } else {
        Err(Error::new(format!("@{to} refused {command:?}: {reply}")))
    }
}

/// The non-zero P_Keys of `smpquery pkeys` output (`   0: 0xffff 0x8001 ...` rows).
pub fn parse_pkeys(s: &str) -> Vec<u16> {
    s.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(i, _)| i.trim().parse::<u32>().is_ok())
        .flat_map(|(_, v)| v.split_whitespace())
        .filter_map(|w| u16::from_str_radix(w.trim_start_matches("0x"), 16).ok())
        .filter(|k| *k & 0x7fff != 0)
        .collect()
}

/// Parses `ibaddr` output: `GID fe80::10:7 LID start 0x5 end 0x5`.
pub fn parse_ibaddr(s: &str) -> Option<(u16, Ipv6Addr)> {
    let line = s.lines().find(|l| l.trim_start().starts_with("GID "))?;
    let mut w = line.split_whitespace();
    let _ = w.next();
    let gid: Ipv6Addr = w.next()?.parse().ok()?;
    let rest: Vec<&str> = w.collect();
    let i = rest.iter().position(|t| *t == "start")?;
    let lid = rest.get(i + 1)?;
    let lid = u16::from_str_radix(lid.trim_start_matches("0x"), 16).ok()?;
    Some((lid, gid))
}

/// A port's state as `smpquery portinfo` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// `LinkState`: `Down`, `Initialize`, `Armed` or `Active`.
    pub state: String,
    /// `PhysLinkState`: `Polling`, `LinkUp`, ...
    pub phys_state: String,
    /// Base LID (0 while unassigned).
    pub lid: u16,
    /// The master SM's LID.
    pub sm_lid: u16,
}

impl PortInfo {
    /// Parses `smpquery portinfo` output (`Lid:....5`, `LinkState:....Active`, ...).
    pub fn parse(s: &str) -> Option<PortInfo> {
        let field = |name: &str| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim_start_matches('.').trim().to_string())
            })
        };
        let num = |v: String| {
            v.strip_prefix("0x")
                .map(|h| u16::from_str_radix(h, 16).ok())
                .unwrap_or_else(|| v.parse().ok())
        };
        Some(PortInfo {
            state: field("LinkState")?,
            phys_state: field("PhysLinkState")?,
            lid: num(field("Lid")?)?,
            sm_lid: num(field("SMLid")?)?,
        })
    }
}

/// Creates ibsim's console FIFO and opens it read+write: given to ibsim as stdin, ibsim is
/// then a writer itself and never reads end-of-file (at EOF ibsim busy-loops at 100% CPU).
fn open_console_fifo(path: &Path) -> Result<std::fs::File> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::new(format!("bad console path {}", path.display())))?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(Error::new(format!(
            "cannot create ibsim console FIFO {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        )));
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::new(format!("cannot open {}: {e}", path.display())))
}

fn wait_for(timeout: Duration, what: &str, mut cond: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if cond()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::new(format!(
                "timed out after {timeout:?} waiting for {what}"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn abstract_socket_exists(name_with_at: &str) -> bool {
    std::fs::read_to_string("/proc/net/unix")
        .map(|t| {
            // ibsim's names carry a trailing NUL, shown by the kernel as a second `@`.
            t.lines().any(|l| {
                l.split_whitespace()
                    .last()
                    .is_some_and(|n| n.trim_end_matches('@') == name_with_at)
            })
        })
        .unwrap_or(false)
}

/// Whether process `pid` holds a TCP socket listening on `port` (IPv4): a LISTEN row of
/// `/proc/<pid>/net/tcp` whose socket inode is one of the process's descriptors.
fn listens_on(pid: i32, port: u16) -> bool {
    let Ok(tcp) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
        return false;
    };
    let suffix = format!(":{port:04X}");
    let inodes: Vec<String> = tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode
            (f.len() > 9 && f[1].ends_with(&suffix) && f[3] == "0A")
                .then(|| format!("socket:[{}]", f[9]))
        })
        .collect();
    if inodes.is_empty() {
        return false;
    }
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|rd| {
            rd.flatten().any(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|t| inodes.iter().any(|i| t.as_os_str() == i.as_str()))
            })
        })
        .unwrap_or(false)
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

fn mkdir(p: &Path) -> Result<()> {
    std::fs::create_dir_all(p)
        .map_err(|e| Error::new(format!("cannot create {}: {e}", p.display())))
}

fn write(p: &Path, text: &str) -> Result<()> {
    std::fs::write(p, text).map_err(|e| Error::new(format!("cannot write {}: {e}", p.display())))
}

fn file(p: &Path) -> Result<std::fs::File> {
    std::fs::File::create(p).map_err(|e| Error::new(format!("cannot create {}: {e}", p.display())))
}

fn file_append(p: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(p)
        .map_err(|e| Error::new(format!("cannot open {}: {e}", p.display())))
}

fn tail(p: &Path, n: usize) -> String {
    match std::fs::read(p) {
        Ok(b) => {
            let t = String::from_utf8_lossy(&b);
            let lines: Vec<&str> = t.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("({}: {e})", p.display()),
    }
}

/// umad2sim leaves `sys-<pid>/` in the working directory of each process it ran in.
fn remove_sys_dirs(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("sys-") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portinfo_output_parses() {
        let up = "# Port info: DR path slid 65535; dlid 65535; 0 port 1\nLid:.............................5\nSMLid:...........................1\nLinkState:.......................Active\nPhysLinkState:...................LinkUp\n";
        assert_eq!(
            PortInfo::parse(up),
            Some(PortInfo {
                state: "Active".into(),
                phys_state: "LinkUp".into(),
                lid: 5,
                sm_lid: 1
            })
        );
        let down = up.replace("Active", "Down").replace("LinkUp", "Polling");
        assert_eq!(PortInfo::parse(&down).map(|p| p.state), Some("Down".into()));
        assert_eq!(PortInfo::parse("ibwarn: no answer"), None);
        assert_eq!(PortInfo::parse(&up.replace("Lid:......", "Lid: x")), None);
    }

    #[test]
    fn ibaddr_output_parses() {
        let (lid, gid) = parse_ibaddr("GID fe80::10:7 LID start 0x5 end 0x5\n").unwrap();
        assert_eq!(lid, 5);
        assert_eq!(gid, "fe80::10:7".parse::<Ipv6Addr>().unwrap());
        assert!(parse_ibaddr("ibwarn: something\n").is_none());
        assert!(parse_ibaddr("GID zz LID start 0x5").is_none());
    }

    #[test]
    fn provider_specs() {
        assert_eq!(Provider::parse("stock", None).unwrap(), Provider::Stock);
        assert_eq!(Provider::parse("acmrs", None).unwrap().name(), "acmrs");
        assert!(Provider::parse("/x/libfoo.so", None).is_err());
        assert_eq!(
            Provider::parse("/x/libfoo.so", Some("foo")).unwrap().name(),
            "foo"
        );
        assert!(Provider::parse("stock", Some("x")).is_err());
        let installed = Provider::parse("installed:acmrs", None).unwrap();
        assert_eq!(
            installed,
            Provider::Installed {
                name: "acmrs".into()
            }
        );
        assert_eq!(installed.name(), "acmrs");
        assert!(installed.is_installed() && !Provider::Acmrs.is_installed());
        assert!(Provider::parse("installed:", None).is_err());
        assert!(Provider::parse("installed:acmrs", Some("x")).is_err());
        let choice = crate::ProviderChoice::parse(&["Hca3=installed:acmrs"], None).unwrap();
        assert_eq!(choice.for_node("Hca3"), Some(&installed));
    }

    #[test]
    fn node_addresses_are_distinct() {
        let a = NodeAddrs::for_index("Hca3", 3, 0, &[]);
        let b = NodeAddrs::for_index("Hca4", 4, 2, &[]);
        assert_eq!(a.name, "hca3");
        assert_eq!(a.ipv4, Ipv4Addr::new(10, 40, 0, 3));
        assert_eq!(a.ipv6, "fd00:acf::3".parse::<Ipv6Addr>().unwrap());
        assert_ne!(a.ipv4, b.ipv4);
        assert_ne!(a.ipv6, b.ipv6);
        assert!(a.extra_names.is_empty());
        assert_eq!(b.extra_names, ["hca4-1", "hca4-2"]);
    }
}
