//! `acm-fabric`: bring a simulated fabric with real ibacm daemons up, use it, tear it down.
//! See `docs/fabric.md` and `acm-fabric help`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
use acm_fabric::{
    script, Fabric, FabricBuilder, HostSpec, HostsFile, OptSpec, Partition, Provider,
    ProviderChoice, SubnetSpec, Topology,
};
use acm_report::cli::num;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// Bring a simulated InfiniBand fabric with real ibacm daemons up (ibsim, OpenSM, ibacm with
/// the stock or the acmrs provider per node), use it, tear it down (docs/fabric.md).
///
/// Exit codes: 0 done; 1 a failure (bring-up, a failed script step); 2 a bad command line or a
/// bad script (nothing started); `run` exits with ib_acme's status.
#[derive(Parser)]
#[command(name = "acm-fabric", version, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Bring the fabric up, print how to reach it, wait for Ctrl-C (or SIGTERM), tear down
    Up {
        #[command(flatten)]
        fabric: FabricArgs,
    },
    /// Bring up, run `ib_acme IB_ACME_ARGS` against NODE's daemon (repeating until the output
    /// contains TEXT, if given), print it, tear down; the exit status is ib_acme's
    Run {
        #[command(flatten)]
        fabric: FabricArgs,
        /// The daemon node ib_acme talks to
        #[arg(long, value_name = "NODE")]
        on: String,
        /// Repeat ib_acme until its output contains TEXT (up to --timeout)
        #[arg(long, value_name = "TEXT")]
        until: Option<String>,
        /// How long --until repeats
        #[arg(long, value_name = "SECS", default_value = "15", value_parser = num::<u64>)]
        timeout: u64,
        /// ib_acme's arguments, after --
        #[arg(last = true, required = true, value_name = "IB_ACME_ARGS")]
        acme: Vec<String>,
    },
    /// Bring up once, run every STEP (from --cmd, then from FILE or stdin `-`), printing each
    /// command and its output, tear down; exit 1 if any step failed, 2 for a bad script
    ///
    /// STEP: `NODE[:] IB_ACME_ARGS...` | `port-down HCA` | `port-up HCA` | `sleep SECS` |
    /// `refused NODE[:] IB_ACME_ARGS...`; `#` comments; placeholders {NODE.lid} {NODE.gid}
    /// {NODE.name} {NODE.ipv4} {NODE.ipv6} {NODE.name@PKEY}. E.g. acm-fabric script --nodes
    /// Hca3,Hca4 --retry 10 --cmd 'Hca3: -f l -s {Hca3.lid} -d {Hca4.lid} -v'
    Script {
        #[command(flatten)]
        fabric: FabricArgs,
        /// Repeat a failing ib_acme step for up to SECS (0..3600; default: once)
        #[arg(long, value_name = "SECS", default_value = "0", value_parser = retry_secs)]
        retry: Duration,
        /// A step, run before FILE's (repeatable)
        #[arg(long = "cmd", value_name = "STEP")]
        cmds: Vec<String>,
        /// A script file, or - for stdin
        #[arg(value_name = "FILE|-")]
        file: Option<String>,
    },
    /// Print the ibsim net file of SPEC
    Topology {
        /// A shipped example, fattree:LEAVES,SPINES,HCAS, or a net file
        #[arg(value_name = "SPEC")]
        spec: String,
    },
    /// List the shipped topologies
    Examples,
}

/// The fabric options of `up`, `run` and `script`.
#[derive(Args, Debug)]
struct FabricArgs {
    /// A shipped example, fattree:LEAVES,SPINES,HCAS, or the path of an ibsim net file
    #[arg(long, value_name = "SPEC", default_value = "net.2sw2path4hca")]
    topology: String,
    /// HCAs that run an ibacm daemon, comma-separated
    #[arg(long, value_name = "A,B,...", default_value = "Hca2,Hca3,Hca4")]
    nodes: String,
    /// stock (Debian libibacmp.so, the default) | acmrs | PATH.so[@NAME] | installed:NAME
    /// (already in ibacm's default provider directory, e.g. from the acmrs .deb) for every
    /// node; NODE=P for one node; repeatable or comma-separated (--provider stock --provider
    /// Hca3=acmrs, --provider Hca2=stock,Hca3=acmrs,Hca4=acmrs)
    #[arg(long = "provider", value_name = "P")]
    providers: Vec<String>,
    /// The provider name of a PATH.so given without @NAME
    #[arg(long, value_name = "N")]
    provider_name: Option<String>,
    /// The HCA OpenSM runs as [default: the first HCA without a daemon]
    #[arg(long, value_name = "HCA")]
    sm_node: Option<String>,
    /// An extra ibacm_opts.cfg line on every node, or with NODE: on one node (which wins over
    /// the line for every node); repeatable
    #[arg(long = "opt", value_name = "[NODE:]NAME=VALUE", value_parser = OptSpec::parse)]
    opts: Vec<OptSpec>,
    /// written: ibacm_hosts.data written, not preloaded | preload: written and addr_preload
    /// acm_hosts | none: no hosts file, addr_preload none (other nodes' names and IPs only over
    /// the ACM address protocol)
    #[arg(long, value_name = "MODE", default_value = "written", value_parser = HostsFile::parse)]
    hosts_file: HostsFile,
    /// A partition besides the default, PKEY:NODE[=full|limited],.. (repeatable), e.g.
    /// 0x8001:Hca2,Hca3 or 0x8002:Hca2,Hca3=limited,Hca4=limited: OpenSM gets a
    /// partitions.conf, each member's address file its addresses there (hca3-8001, 10.41.0.3,
    /// fd00:acf:8001::3; in scripts {Hca3.name@8001})
    #[arg(long = "partition", value_name = "SPEC", value_parser = Partition::parse)]
    partitions: Vec<Partition>,
    /// A daemon node as a host of several CAs and ports, NODE=SPEC (repeatable): CAs separated
    /// by `,`, the ports of a CA joined by `+`, a port [SUBNET:]HCA, the first port NODE itself:
    /// Hca3=Hca3+Hca5 (a dual-port HCA), Hca3=Hca3,Hca5 (two HCAs), Hca3=Hca3+s2:Hca2 (port
    /// 2 on subnet s2); further ports serve hca3-p2, 10.40.1.3, fd00:acf:0:1::3 (in scripts
    /// {Hca3.name@2}, {Hca3.lid@ibsim0:2})
    #[arg(long = "host", value_name = "NODE=SPEC", value_parser = host_arg)]
    hosts: Vec<(String, HostSpec)>,
    /// One more provider library in NODE's provider directory, NODE=stock|acmrs|PATH.so@NAME
    /// (repeatable), for a `provider NAME 0x<prefix>` line (--opt NODE:provider=NAME 0x...)
    /// to pick for the ports of that subnet
    #[arg(long = "extra-provider", value_name = "NODE=P", value_parser = extra_provider_arg)]
    extra_providers: Vec<(String, Provider)>,
    /// A second subnet, NAME=TOPOLOGY[@SMHCA][/0xPREFIX] (repeatable): its own ibsim and
    /// OpenSM [default prefix 0xfec0000000000002], for ports of --host specs that name it
    #[arg(long = "subnet", value_name = "SPEC", value_parser = subnet_arg)]
    subnets: Vec<SubnetSpec>,
    /// OpenSM runs with --qos and this qos-policy.conf (e.g. a qos-ulps section mapping
    /// ServiceID ranges to SLs)
    #[arg(long, value_name = "FILE")]
    qos_policy: Option<PathBuf>,
    /// The PortInfo SubnetTimeOut code 0..31 the daemons see [default: simverbs's, OpenSM's 18
    /// in place of ibsim's placeholder 31; 8 = 1 ms]
    #[arg(long, value_name = "N", value_parser = subnet_timeout, allow_negative_numbers = true)]
    subnet_timeout: Option<u8>,
    /// Keep the scratch directory (logs) after teardown
    #[arg(long)]
    keep: bool,
    /// Label of the fabric name and the scratch directory
    #[arg(long, value_name = "P", default_value = "acmfab-cli")]
    name_prefix: String,
}

/// `--host NODE=SPEC`.
fn host_arg(v: &str) -> Result<(String, HostSpec), String> {
    let (node, spec) = v
        .split_once('=')
        .ok_or_else(|| format!("wants NODE=SPEC, got {v:?}"))?;
    Ok((
        node.to_string(),
        HostSpec::parse(spec).map_err(|e| e.to_string())?,
    ))
}

/// `--extra-provider NODE=P`.
fn extra_provider_arg(v: &str) -> Result<(String, Provider), String> {
    let (node, p) = v
        .split_once('=')
        .ok_or_else(|| format!("wants NODE=PROVIDER, got {v:?}"))?;
    let (spec, name) = match p.rsplit_once('@') {
        Some((path, name)) if path.ends_with(".so") => (path, Some(name)),
        _ => (p, None),
    };
    Ok((
        node.to_string(),
        Provider::parse(spec, name).map_err(|e| e.to_string())?,
    ))
}

/// `--subnet NAME=TOPOLOGY[@SM][/PREFIX]`.
fn subnet_arg(v: &str) -> Result<SubnetSpec, String> {
    SubnetSpec::parse(v).map_err(|e| e.to_string())
}

/// `--subnet-timeout`: a SubnetTimeOut code.
fn subnet_timeout(v: &str) -> Result<u8, String> {
    v.parse::<u8>()
        .ok()
        .filter(|c| *c <= 31)
        .ok_or_else(|| format!("wants a code in 0..31, got {v:?}"))
}

/// `--retry`: seconds, fractions allowed, 0..3600.
fn retry_secs(v: &str) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .filter(|s| (0.0..=3600.0).contains(s))
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("wants seconds (0..3600), got {v:?}"))
}

/// Set while `up` waits for a signal: a signal then means a graceful teardown.
static WAITING: AtomicBool = AtomicBool::new(false);

fn main() -> ExitCode {
    let (tx, rx) = mpsc::channel::<i32>();
    // A signal while `up` waits is its cue for a graceful teardown; any other tears down at once.
    let claim = move |sig| WAITING.load(Ordering::SeqCst) && tx.send(sig).is_ok();
    if let Err(e) = acm_fabric::teardown_on_signals("acm-fabric", claim) {
        eprintln!("acm-fabric: {e}");
        return ExitCode::from(2);
    }
    let cli: Cli = acm_report::cli::parse(2);
    match real_main(cli.cmd, &rx) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("acm-fabric: {e}");
            ExitCode::from(1)
        }
    }
}

/// What the fabric options make: the builder, and what a script is checked against.
struct Setup {
    builder: FabricBuilder,
    keep: bool,
    /// Daemon nodes and every HCA of the topology (to check a script before bring-up).
    nodes: Vec<String>,
    hcas: Vec<String>,
}

impl FabricArgs {
    /// The fabric builder of these options; what start() would refuse is refused here already,
    /// so a script fails before anything starts.
    fn setup(&self) -> Result<Setup, String> {
        let topology = Topology::parse(&self.topology).map_err(|e| e.to_string())?;
        let hcas = topology.hcas();
        let nodes: Vec<String> = self
            .nodes
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let providers = ProviderChoice::parse(&self.providers, self.provider_name.as_deref())
            .map_err(|e| e.to_string())?;
        for (n, _) in &providers.per_node {
            if !nodes.contains(n) {
                return Err(format!(
                    "--provider {n}=...: {n} is not a daemon node (--nodes {})",
                    nodes.join(",")
                ));
            }
        }
        for o in &self.opts {
            if let Some(n) = o.node.as_ref().filter(|n| !nodes.contains(n)) {
                return Err(format!(
                    "--opt {n}:{}=...: {n} is not a daemon node (--nodes {})",
                    o.name,
                    nodes.join(",")
                ));
            }
        }
        let mut builder = Fabric::builder(topology, nodes.clone())
            .providers(&providers)
            .hosts_file(self.hosts_file)
            .keep_scratch(self.keep)
            .name_prefix(&self.name_prefix);
        if let Some(s) = &self.sm_node {
            builder = builder.sm_node(s);
        }
        if let Some(code) = self.subnet_timeout {
            builder = builder.subnet_timeout(code);
        }
        for p in &self.partitions {
            builder = builder.partition(p.clone());
        }
        for s in &self.subnets {
            builder = builder.subnet(s.clone());
        }
        for (n, h) in &self.hosts {
            builder = builder.host(n, h.clone());
        }
        for (n, p) in &self.extra_providers {
            builder = builder.node_extra_provider(n, p.clone());
        }
        if let Some(f) = &self.qos_policy {
            let q = std::fs::read_to_string(f)
                .map_err(|e| format!("--qos-policy {}: {e}", f.display()))?;
            builder = builder.qos_policy(&q);
        }
        for o in &self.opts {
            builder = match &o.node {
                None => builder.option(&o.name, &o.value),
                Some(n) => builder.node_option(n, &o.name, &o.value),
            };
        }
        Ok(Setup {
            builder,
            keep: self.keep,
            nodes,
            hcas,
        })
    }
}

fn real_main(cmd: Cmd, signals: &mpsc::Receiver<i32>) -> Result<ExitCode, String> {
    match cmd {
        Cmd::Examples => {
            for n in Topology::example_names() {
                println!("{n}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Topology { spec } => {
            print!("{}", Topology::parse(&spec).map_err(|e| e.to_string())?.net);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Up { fabric } => {
            let o = fabric.setup()?;
            let fabric = o.builder.start().map_err(|e| e.to_string())?;
            print_summary(&fabric);
            if o.keep {
                println!("scratch kept at {}", fabric.scratch().display());
            }
            // Armed before the announcement: whoever reacts to it with a signal must get the
            // graceful teardown, not the bring-up emergency path.
            WAITING.store(true, Ordering::SeqCst);
            println!("fabric is up; Ctrl-C (or SIGTERM) tears it down");
            let _ = signals.recv();
            println!("tearing down");
            drop(fabric);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run {
            fabric,
            on,
            until,
            timeout,
            acme,
        } => {
            let o = fabric.setup()?;
            let fabric = o.builder.start().map_err(|e| e.to_string())?;
            print_summary(&fabric);
            let node = fabric.node(&on).map_err(|e| e.to_string())?;
            let argv: Vec<&str> = acme.iter().map(String::as_str).collect();
            let out = match &until {
                Some(text) => node.acme_until(&argv, Duration::from_secs(timeout), |out| {
                    out.stdout.contains(text)
                }),
                None => node.acme(&argv),
            }
            .map_err(|e| e.to_string())?;
            println!("$ ib_acme {}", acme.join(" "));
            print!("{}", out.stdout);
            eprint!("{}", out.stderr);
            let ok = out.success() && until.as_ref().is_none_or(|t| out.stdout.contains(t));
            if !ok {
                eprintln!("{}", fabric.logs_report());
            }
            Ok(match out.code {
                Some(0) if ok => ExitCode::SUCCESS,
                Some(c) if c > 0 && c < 256 => ExitCode::from(c as u8),
                _ => ExitCode::from(1),
            })
        }
        Cmd::Script {
            fabric,
            retry,
            cmds,
            file,
        } => {
            let o = fabric.setup()?;
            let mut text = cmds.join("\n");
            match file.as_deref() {
                Some("-") => {
                    let mut s = String::new();
                    std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                        .map_err(|e| format!("cannot read the script from stdin: {e}"))?;
                    text = format!("{text}\n{s}");
                }
                Some(path) => {
                    let s = std::fs::read_to_string(path)
                        .map_err(|e| format!("cannot read script {path}: {e}"))?;
                    text = format!("{text}\n{s}");
                }
                None => {}
            }
            // Check the whole script before starting anything; `--cmd` lines come first.
            let steps = match script::parse_script(&text, &o.nodes, &o.hcas) {
                Ok(s) if s.is_empty() => {
                    eprintln!(
                        "acm-fabric: script has no steps (--cmd STEP or FILE|-; \
                         acm-fabric script --help)"
                    );
                    return Ok(ExitCode::from(2));
                }
                Ok(s) => s,
                Err(e) => {
                    eprintln!("acm-fabric: bad script: {e}");
                    return Ok(ExitCode::from(2));
                }
            };
            let mut fabric = o.builder.start().map_err(|e| e.to_string())?;
            print_summary(&fabric);
            let mut stdout = std::io::stdout().lock();
            let failed = script::run_script(&mut fabric, &steps, retry, &mut stdout)
                .map_err(|e| e.to_string())?;
            println!("{} step(s), {failed} failed", steps.len());
            if failed > 0 {
                eprintln!("{}", fabric.logs_report());
            }
            drop(fabric);
            Ok(if failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

fn print_summary(f: &Fabric) {
    println!(
        "fabric {} on {} (OpenSM as {}), provider {}, scratch {}",
        f.name(),
        f.topology().label,
        f.sm_node(),
        if f.is_mixed() {
            "per node"
        } else {
            f.nodes()
                .first()
                .map(|n| n.provider().name())
                .unwrap_or(f.provider().name())
        },
        f.scratch().display()
    );
    for n in f.nodes() {
        println!(
            "  {:<8} {:<7} lid {:<4} gid {:<18} name {:<8} ipv4 {:<12} ipv6 {:<14} port {} pid {}",
            n.name,
            n.provider().name(),
            n.lid,
            n.gid.to_string(),
            n.addrs.name,
            n.addrs.ipv4.to_string(),
            n.addrs.ipv6.to_string(),
            n.server_port,
            n.pid().map(|p| p.to_string()).unwrap_or_else(|| "-".into())
        );
        if n.ports.len() > 1 {
            for p in &n.ports {
                println!(
                    "    @{} {}:{} {:<6} {:<7} lid {:<4} gid {:<24} name {:<10} ipv4 {:<12} ipv6 {}",
                    p.index,
                    p.ca,
                    p.port,
                    p.sim_node,
                    if p.subnet.is_empty() { "main" } else { p.subnet.as_str() },
                    p.lid,
                    p.gid.to_string(),
                    p.name,
                    p.ipv4.to_string(),
                    p.ipv6
                );
            }
        }
    }
    if let Some(n) = f.nodes().first() {
        println!(
            "  ib_acme on {}: unshare -m sh -c 'mount --bind {} /run && exec ib_acme -S 127.0.0.1 -e'",
            n.name,
            n.run_dir.display()
        );
        println!(
            "  link of {} down/up: echo 'Unlink \"{}\"[1]' > {}   (then 'ReLink \"{}\"[1]'; output in {})",
            n.name,
            n.name,
            f.scratch().join("ibsim").join("console").display(),
            n.name,
            f.scratch().join("ibsim").join("ibsim.log").display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `acm-fabric <cmd> <a…>` as the binary parses it.
    fn cli(a: &[&str]) -> Result<Cmd, String> {
        acm_report::cli::try_parse_from::<Cli, _, _>(["acm-fabric"].iter().chain(a).copied())
            .map(|c| c.cmd)
            .map_err(|e| acm_report::cli::message(&e))
    }

    /// The setup of `acm-fabric up <a…>`.
    fn setup(a: &[&str]) -> Result<Setup, String> {
        match cli(&[&["up"], a].concat())? {
            Cmd::Up { fabric } => fabric.setup(),
            _ => unreachable!("up parses as Up"),
        }
    }

    #[test]
    fn subnet_timeout_flag_is_validated() {
        let ok = setup(&["--subnet-timeout", "8"]).expect("8 is valid");
        assert!(
            format!("{:?}", ok.builder).contains("subnet_timeout: Some(8)"),
            "{:?}",
            ok.builder
        );
        let unset = setup(&[]).expect("defaults");
        assert!(format!("{:?}", unset.builder).contains("subnet_timeout: None"));
        for bad in ["32", "-1", "x", ""] {
            let e = setup(&["--subnet-timeout", bad])
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(
                e.contains("0..31") || e.contains("a value is required"),
                "{e}"
            );
        }
        let e = setup(&["--subnet-timeout"])
            .err()
            .expect("missing value accepted");
        assert!(
            e.contains("a value is required for '--subnet-timeout <N>'"),
            "{e}"
        );
    }

    #[test]
    fn subcommands_take_their_own_options() {
        match cli(&["run", "--on", "Hca3", "--until", "x", "--", "-f", "l", "-v"]).unwrap() {
            Cmd::Run {
                on,
                until,
                timeout,
                acme,
                ..
            } => {
                assert_eq!(
                    (on.as_str(), until.as_deref(), timeout),
                    ("Hca3", Some("x"), 15)
                );
                assert_eq!(acme, ["-f", "l", "-v"]);
            }
            _ => panic!("not run"),
        }
        assert!(cli(&["run", "--", "-e"])
            .unwrap_err()
            .contains("needs --on <NODE>"));
        assert!(cli(&["run", "--on", "Hca3"])
            .unwrap_err()
            .contains("IB_ACME_ARGS"));
        match cli(&[
            "script", "--retry", "2.5", "--cmd", "Hca3 -e", "--cmd", "sleep 1", "-",
        ])
        .unwrap()
        {
            Cmd::Script {
                retry, cmds, file, ..
            } => {
                assert_eq!(retry, Duration::from_millis(2500));
                assert_eq!(cmds, ["Hca3 -e", "sleep 1"]);
                assert_eq!(file.as_deref(), Some("-"));
            }
            _ => panic!("not script"),
        }
        assert!(cli(&["script", "--retry", "4000"])
            .unwrap_err()
            .contains("0..3600"));
        // --cmd and a FILE belong to `script`.
        assert!(cli(&["up", "--cmd", "Hca3 -e"])
            .unwrap_err()
            .contains("unexpected option '--cmd'"));
        assert!(cli(&["up", "file"])
            .unwrap_err()
            .contains("unexpected argument 'file'"));
        assert!(cli(&["frobnicate"])
            .unwrap_err()
            .contains("unknown command 'frobnicate'"));
        // The last of a repeated single-value option wins, as before clap.
        let o = setup(&["--nodes", "Hca2", "--nodes", "Hca3,Hca4"]).unwrap();
        assert_eq!(o.nodes, ["Hca3", "Hca4"]);
    }

    #[test]
    fn per_node_providers_and_options() {
        use acm_fabric::Provider;
        // The old form: one provider for every node.
        let o = setup(&["--provider", "acmrs"]).unwrap();
        for n in ["Hca2", "Hca3", "Hca4"] {
            assert_eq!(o.builder.provider_of(n), &Provider::Acmrs);
        }
        let o = setup(&[]).unwrap();
        assert_eq!(o.builder.provider_of("Hca3"), &Provider::Stock);
        // A default and one node.
        let o = setup(&["--provider", "stock", "--provider", "Hca3=acmrs"]).unwrap();
        assert_eq!(o.builder.provider_of("Hca2"), &Provider::Stock);
        assert_eq!(o.builder.provider_of("Hca3"), &Provider::Acmrs);
        assert_eq!(o.builder.provider_of("Hca4"), &Provider::Stock);
        // A list, no default (stock).
        let o = setup(&["--provider", "Hca3=acmrs,Hca4=acmrs"]).unwrap();
        assert_eq!(o.builder.provider_of("Hca2"), &Provider::Stock);
        assert_eq!(o.builder.provider_of("Hca4"), &Provider::Acmrs);
        // A path with --provider-name (the old form) and per node with @NAME.
        let o = setup(&[
            "--provider",
            "/x/libp.so",
            "--provider-name",
            "p",
            "--provider",
            "Hca4=/y/libq.so@q",
        ])
        .unwrap();
        assert_eq!(o.builder.provider_of("Hca2").name(), "p");
        assert_eq!(o.builder.provider_of("Hca4").name(), "q");
        // Nodes that run no daemon are refused before anything starts.
        let e = setup(&["--nodes", "Hca3,Hca4", "--provider", "Hca2=acmrs"])
            .err()
            .unwrap();
        assert!(e.contains("Hca2 is not a daemon node"), "{e}");
        let e = setup(&["--nodes", "Hca3", "--opt", "Hca4:timeout=5"])
            .err()
            .unwrap();
        assert!(e.contains("Hca4 is not a daemon node"), "{e}");
        let e = setup(&["--provider", "stock,acmrs"]).err().unwrap();
        assert!(e.contains("two default providers"), "{e}");
        // Per-node and global options reach the builder.
        let o = setup(&[
            "--opt",
            "timeout=300",
            "--opt",
            "Hca3:retries=1",
            "--hosts-file",
            "none",
        ])
        .unwrap();
        let dbg = format!("{:?}", o.builder);
        assert!(
            dbg.contains(r#"(None, "timeout", "300")"#)
                && dbg.contains(r#"(Some("Hca3"), "retries", "1")"#)
                && dbg.contains("hosts_file: Absent"),
            "{dbg}"
        );
        let e = setup(&["--hosts-file", "maybe"]).err().unwrap();
        assert!(e.contains("written, preload or none"), "{e}");
    }
}
