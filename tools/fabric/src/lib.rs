//! `acm-fabric`: a simulated InfiniBand fabric with real `ibacm` daemons, for tests and for
//! people trying a configuration.
//!
//! One [`Fabric`] is: an `ibsim` on a [`Topology`] (a shipped Debian example or a generated
//! two-level fat-tree) under a unique fabric name (`IBSIM_SOCKNAME`); OpenSM as master under
//! `libumad2sim.so`; and one real `/usr/sbin/ibacm` per daemon node, preloaded with
//! `libumad2sim.so:libsimverbs.so` (`SIM_HOST=<node>`), each with its own `/run` (a private
//! mount namespace), opts file (the `ib_acme -O` template plus overrides), address file, hosts
//! file and provider directory holding a *copy* of the chosen [`Provider`] library.
//!
//! ```no_run
//! use acm_fabric::{Fabric, Provider, Topology};
//! use std::time::Duration;
//!
//! # fn main() -> acm_fabric::Result<()> {
//! let fabric = Fabric::builder(Topology::example("net.2sw2path4hca")?, ["Hca2", "Hca3", "Hca4"])
//!     .provider(Provider::Acmrs)          // or Stock, Custom { path, name }, Installed { name }
//!     .node_provider("Hca2", Provider::Stock) // a mixed fabric: Hca2 stock, the rest acmrs
//!     .name_prefix("my-test")             // fabric name / scratch dir label
//!     .option("route_prot", "sa")         // any ibacm_opts.cfg line, all nodes
//!     .start()?;                          // waits: SM master, LIDs, each daemon answers -e
//! let hca3 = fabric.node("Hca3")?;        // lid, gid, addrs {name, ipv4, ipv6}, dir, ...
//! let hca4 = fabric.node("Hca4")?;
//! let out = hca3.acme_until(
//!     &["-f", "n", "-s", &hca3.addrs.name, "-d", &hca4.addrs.name, "-v"],
//!     Duration::from_secs(10),
//!     |o| o.stdout.contains("SA verification: success"),
//! )?;
//! assert!(out.stdout.contains("SA verification: success"), "{out}\n{}", fabric.logs_report());
//! hca3.event("client_reregister")?;       // through the simverbs control socket
//! # Ok(()) }
//! // Dropping `fabric` stops every process it started (by process group) and removes the
//! // scratch directory; if the thread is panicking it first prints every node's log.
//! ```
//!
//! Other entry points: [`Node::acme`] (one `ib_acme` run, 30 s timeout), [`Node::run`] (any
//! program in the node's `/run` namespace), [`Node::log`], [`Node::simverbs_ctl`],
//! [`Node::stop_daemon`]; [`Fabric::run_tool`] (an infiniband-diags tool as some HCA, e.g.
//! `saquery -g`), [`Fabric::stop_sm`] / [`Fabric::start_sm`], [`Fabric::logs_report`],
//! [`Fabric::port_down`] / [`Fabric::port_up`] / [`Fabric::port_info`] (a link really going
//! down and up, through ibsim's console), [`Fabric::refresh_lids`], [`script`] (several
//! commands on one bring-up),
//! [`Fabric::pids`]; [`emergency_teardown`] for a signal handler; [`checks`] (panicking test
//! checks: an SA-verified path, the global counters). [`HostsFile`] says whether
//! the daemons get a hosts file; [`PortPool`] leases each daemon's `server_port` race-free;
//! [`ProviderChoice`] / [`OptSpec`] parse the CLI's `--provider` / `--opt` forms.
//!
//! Artifacts: `libsimverbs.so` and `libacmrs.so` are looked up next to the running executable
//! (`target/<profile>/`, or its parent for tests in `deps/`), or at `$ACM_FABRIC_SIMVERBS` /
//! `$ACM_FABRIC_ACMRS`. OpenSM always runs with the RMPP sender `libumad_rmpp.so` preloaded
//! ahead of umad2sim (built with acm-fabric into `deps/`; [`rmpp_shim`],
//! [`Fabric::rmpp_stats`], `docs/umad-rmpp.md`). Must run as root (mount namespaces). ibsim
//! serves at most 10 clients per fabric, so at most 8 daemon nodes. See `docs/fabric.md`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
pub mod checks;
pub mod client;
pub mod fabric;
pub mod host;
pub mod kernel;
pub mod partition;
pub mod ports;
pub mod process;
pub mod script;
pub mod spec;
pub mod testing;
pub mod topology;

pub use fabric::{
    find_artifact, rmpp_shim, Fabric, FabricBuilder, HostsFile, Node, NodeAddrs, PortInfo,
    Provider, DEFAULT_PROVIDER_DIR, STOCK_PROVIDER,
};
pub use host::{HostPort, HostSpec, PortRef, SubnetSpec};
pub use partition::{Membership, Partition, PartitionAddrs};
pub use ports::{PortLease, PortPool};
pub use process::{
    emergency_teardown, live_process_groups, pid_exists, teardown_on_signals, Output,
};
pub use spec::{OptSpec, ProviderChoice};
pub use topology::Topology;

/// What went wrong, in words meant for a person reading a test failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(String);

impl Error {
    /// An error with this message.
    pub fn new(msg: impl Into<String>) -> Error {
        Error(msg.into())
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
