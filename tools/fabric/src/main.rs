//! `acm-fabric`: bring a simulated fabric with real ibacm daemons up, use it, tear it down.
//! See `docs/fabric.md` and `acm-fabric help`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
use acm_fabric::{
    script, Fabric, FabricBuilder, HostsFile, OptSpec, Partition, ProviderChoice, Topology,
};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

const USAGE: &str = "\
usage:
  acm-fabric up  [FABRIC OPTIONS] [--keep]
        bring the fabric up, print how to reach it, wait for Ctrl-C, tear down
  acm-fabric run [FABRIC OPTIONS] --on NODE [--until TEXT] [--timeout SECS] -- IB_ACME_ARGS...
        bring up, run `ib_acme IB_ACME_ARGS` against NODE's daemon (repeating until the
        output contains TEXT, if given), print it, tear down; exit status is ib_acme's
  acm-fabric script [FABRIC OPTIONS] [--retry SECS] [--cmd STEP]... [FILE|-]
        bring up once, run every STEP (from --cmd, then from FILE or stdin `-`), printing each
        command and its output, tear down; exit status 1 if any step failed, 2 for a bad script.
        STEP: `NODE[:] IB_ACME_ARGS...` | `port-down HCA` | `port-up HCA` | `sleep SECS`;
        `#` comments; placeholders {NODE.lid} {NODE.gid} {NODE.name} {NODE.ipv4} {NODE.ipv6};
        --retry SECS repeats a failing ib_acme step for up to SECS (default 0: once)
        e.g. acm-fabric script --nodes Hca3,Hca4 --retry 10 --cmd 'Hca3: -f l -s {Hca3.lid} -d {Hca4.lid} -v'
  acm-fabric topology SPEC      print the ibsim net file of SPEC
  acm-fabric examples           list the shipped topologies

FABRIC OPTIONS:
  --topology SPEC      shipped example (net.2sw2path4hca, default), fattree:LEAVES,SPINES,HCAS,
                       or a path to an ibsim net file
  --nodes A,B,...      HCAs that run an ibacm daemon (default: Hca2,Hca3,Hca4)
  --provider P         stock (Debian libibacmp.so, default) | acmrs | PATH.so[@NAME] |
                       installed:NAME (already in ibacm's default provider directory, e.g.
                       from the acmrs .deb: no copy, no provider_lib_path line), for
                       every node; NODE=P for one node; repeatable, or comma-separated:
                       --provider stock --provider Hca3=acmrs
                       --provider Hca2=stock,Hca3=acmrs,Hca4=acmrs
  --provider-name N    the provider name of a PATH.so given without @NAME
  --sm-node HCA        HCA that OpenSM runs as (default: first HCA without a daemon)
  --opt NAME=VALUE     extra ibacm_opts.cfg line on every node (repeatable);
  --opt NODE:NAME=VALUE  on one node (wins over the line for every node)
  --hosts-file MODE    written (default: ibacm_hosts.data written, not preloaded) | preload
                       (written + addr_preload acm_hosts) | none (no hosts file, addr_preload
                       none: names/IPs of other nodes only over the ACM address protocol)
  --partition SPEC     a partition besides the default (repeatable): PKEY:NODE[=full|limited],..
                       e.g. 0x8001:Hca2,Hca3 or 0x8002:Hca2,Hca3=limited,Hca4=limited; OpenSM
                       gets a partitions.conf, each member's address file its addresses
                       there (hca3-8001, 10.41.0.3, fd00:acf:8001::3; scripts: {Hca3.name@8001})
  --qos-policy FILE    OpenSM runs with --qos and this qos-policy.conf (e.g. a qos-ulps section
                       mapping ServiceID ranges to SLs)
  --subnet-timeout N   PortInfo SubnetTimeOut code 0..31 the daemons see (default: simverbs's,
                       OpenSM's 18 in place of ibsim's placeholder 31; 8 = 1 ms)
  --keep               keep the scratch directory (logs) after teardown
  --name-prefix P      label of the fabric name and scratch dir (default acmfab-cli)
";

/// Set while `up` waits for a signal: a signal then means a graceful teardown.
static WAITING: AtomicBool = AtomicBool::new(false);

fn main() -> ExitCode {
    let (tx, rx) = mpsc::channel::<i32>();
    if let Err(e) = install_signal_thread(tx) {
        eprintln!("acm-fabric: {e}");
        return ExitCode::from(2);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    match real_main(&args, &rx) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("acm-fabric: {e}");
            ExitCode::from(1)
        }
    }
}

/// Blocks SIGINT/SIGTERM/SIGHUP in every thread and waits for them on a dedicated thread.
/// (Children get a clean signal mask: std resets it before exec.)
fn install_signal_thread(tx: mpsc::Sender<i32>) -> Result<(), String> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use; pthread_sigmask
    // runs before any other thread exists, so every later thread inherits the mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err("cannot block signals".into());
        }
        set
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` is a valid initialised sigset_t and `sig` a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                continue;
            }
            if WAITING.load(Ordering::SeqCst) && tx.send(sig).is_ok() {
                continue;
            }
            let n = acm_fabric::emergency_teardown();
            eprintln!("acm-fabric: signal {sig}: killed {n} process group(s), exiting");
            std::process::exit(128 + sig);
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(())
}

struct Opts {
    builder: FabricBuilder,
    on: Option<String>,
    until: Option<String>,
    timeout: Duration,
    rest: Vec<String>,
    keep: bool,
    /// `script`: `--cmd` steps, `--retry`, the positional FILE (`-` = stdin).
    cmds: Vec<String>,
    retry: Duration,
    file: Option<String>,
    /// Daemon nodes and every HCA of the topology (to check a script before bring-up).
    nodes: Vec<String>,
    hcas: Vec<String>,
}

fn parse_fabric_opts(args: &[String]) -> Result<Opts, String> {
    let mut topology = "net.2sw2path4hca".to_string();
    let mut nodes = vec!["Hca2".to_string(), "Hca3".into(), "Hca4".into()];
    let mut providers: Vec<String> = Vec::new();
    let mut provider_name: Option<String> = None;
    let mut hosts_file = HostsFile::Written;
    let mut sm_node = None;
    let mut subnet_timeout = None;
    let mut partitions = Vec::new();
    let mut qos_policy: Option<String> = None;
    let mut opts = Vec::new();
    let mut keep = false;
    let mut prefix = "acmfab-cli".to_string();
    let mut on = None;
    let mut until = None;
    let mut timeout = Duration::from_secs(15);
    let mut rest = Vec::new();
    let mut cmds = Vec::new();
    let mut retry = Duration::ZERO;
    let mut file = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--topology" => topology = val("--topology")?,
            "--nodes" => {
                nodes = val("--nodes")?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            }
            "--provider" => providers.push(val("--provider")?),
            "--hosts-file" => {
                hosts_file = HostsFile::parse(&val("--hosts-file")?).map_err(|e| e.to_string())?
            }
            "--provider-name" => provider_name = Some(val("--provider-name")?),
            "--sm-node" => sm_node = Some(val("--sm-node")?),
            "--qos-policy" => {
                let f = val("--qos-policy")?;
                qos_policy = Some(
                    std::fs::read_to_string(&f).map_err(|e| format!("--qos-policy {f}: {e}"))?,
                );
            }
            "--partition" => {
                partitions.push(Partition::parse(&val("--partition")?).map_err(|e| e.to_string())?)
            }
            "--opt" => opts.push(OptSpec::parse(&val("--opt")?).map_err(|e| e.to_string())?),
            "--subnet-timeout" => {
                let v = val("--subnet-timeout")?;
                subnet_timeout =
                    Some(v.parse::<u8>().ok().filter(|c| *c <= 31).ok_or_else(|| {
                        format!("--subnet-timeout wants a code in 0..31, got {v:?}")
                    })?);
            }
            "--keep" => keep = true,
            "--name-prefix" => prefix = val("--name-prefix")?,
            "--on" => on = Some(val("--on")?),
            "--until" => until = Some(val("--until")?),
            "--timeout" => {
                let v = val("--timeout")?;
                let secs: u64 = v
                    .parse()
                    .map_err(|_| format!("--timeout wants seconds, got {v:?}"))?;
                timeout = Duration::from_secs(secs);
            }
            "--cmd" => cmds.push(val("--cmd")?),
            "--retry" => {
                let v = val("--retry")?;
                let secs: f64 = v
                    .parse()
                    .ok()
                    .filter(|s| (0.0..=3600.0).contains(s))
                    .ok_or_else(|| format!("--retry wants seconds (0..3600), got {v:?}"))?;
                retry = Duration::from_secs_f64(secs);
            }
            "--" => {
                rest = it.cloned().collect();
                break;
            }
            other if (other == "-" || !other.starts_with('-')) && file.is_none() => {
                file = Some(other.to_string())
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let topology = Topology::parse(&topology).map_err(|e| e.to_string())?;
    let hcas = topology.hcas();
    let node_names = nodes.clone();
    let providers =
        ProviderChoice::parse(&providers, provider_name.as_deref()).map_err(|e| e.to_string())?;
    // Checked here too (start() checks again) so a script fails before anything starts.
    for (n, _) in &providers.per_node {
        if !node_names.contains(n) {
            return Err(format!(
                "--provider {n}=...: {n} is not a daemon node (--nodes {})",
                node_names.join(",")
            ));
        }
    }
    for o in &opts {
        if let Some(n) = o.node.as_ref().filter(|n| !node_names.contains(n)) {
            return Err(format!(
                "--opt {n}:{}=...: {n} is not a daemon node (--nodes {})",
                o.name,
                node_names.join(",")
            ));
        }
    }
    let mut builder = Fabric::builder(topology, nodes)
        .providers(&providers)
        .hosts_file(hosts_file)
        .keep_scratch(keep)
        .name_prefix(&prefix);
    if let Some(s) = sm_node {
        builder = builder.sm_node(&s);
    }
    if let Some(code) = subnet_timeout {
        builder = builder.subnet_timeout(code);
    }
    for p in partitions {
        builder = builder.partition(p);
    }
    if let Some(q) = &qos_policy {
        builder = builder.qos_policy(q);
    }
    for o in &opts {
        builder = match &o.node {
            None => builder.option(&o.name, &o.value),
            Some(n) => builder.node_option(n, &o.name, &o.value),
        };
    }
    Ok(Opts {
        builder,
        on,
        until,
        timeout,
        rest,
        keep,
        cmds,
        retry,
        file,
        nodes: node_names,
        hcas,
    })
}

fn real_main(args: &[String], signals: &mpsc::Receiver<i32>) -> Result<ExitCode, String> {
    let Some(cmd) = args.first() else {
        eprint!("{USAGE}");
        return Ok(ExitCode::from(2));
    };
    match cmd.as_str() {
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        "examples" => {
            for n in Topology::example_names() {
                println!("{n}");
            }
            Ok(ExitCode::SUCCESS)
        }
        "topology" => {
            let spec = args
                .get(1)
                .ok_or_else(|| format!("topology needs a SPEC\n{USAGE}"))?;
            print!("{}", Topology::parse(spec).map_err(|e| e.to_string())?.net);
            Ok(ExitCode::SUCCESS)
        }
        "up" => {
            let o = parse_fabric_opts(&args[1..])?;
            only_script_takes(&o)?;
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
        "run" => {
            let o = parse_fabric_opts(&args[1..])?;
            only_script_takes(&o)?;
            let on =
                o.on.ok_or_else(|| format!("run needs --on NODE\n{USAGE}"))?;
            if o.rest.is_empty() {
                return Err(format!("run needs ib_acme arguments after --\n{USAGE}"));
            }
            let fabric = o.builder.start().map_err(|e| e.to_string())?;
            print_summary(&fabric);
            let node = fabric.node(&on).map_err(|e| e.to_string())?;
            let argv: Vec<&str> = o.rest.iter().map(String::as_str).collect();
            let out = match &o.until {
                Some(text) => node.acme_until(&argv, o.timeout, |out| out.stdout.contains(text)),
                None => node.acme(&argv),
            }
            .map_err(|e| e.to_string())?;
            println!("$ ib_acme {}", o.rest.join(" "));
            print!("{}", out.stdout);
            eprint!("{}", out.stderr);
            let ok = out.success() && o.until.as_ref().is_none_or(|t| out.stdout.contains(t));
            if !ok {
                eprintln!("{}", fabric.logs_report());
            }
            Ok(match out.code {
                Some(0) if ok => ExitCode::SUCCESS,
                Some(c) if c > 0 && c < 256 => ExitCode::from(c as u8),
                _ => ExitCode::from(1),
            })
        }
        "script" => {
            let o = parse_fabric_opts(&args[1..])?;
            if o.on.is_some() || o.until.is_some() || !o.rest.is_empty() {
                return Err(format!(
                    "script takes its commands from --cmd and FILE, not --on/--until/--\n{USAGE}"
                ));
            }
            let mut text = o.cmds.join("\n");
            match o.file.as_deref() {
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
                    eprintln!("acm-fabric: script has no steps\n{USAGE}");
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
            let failed = script::run_script(&mut fabric, &steps, o.retry, &mut stdout)
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
        other => Err(format!("unknown command {other:?}\n{USAGE}")),
    }
}

/// `--cmd`, `--retry` and a positional FILE belong to `script`.
fn only_script_takes(o: &Opts) -> Result<(), String> {
    if let Some(f) = &o.file {
        return Err(format!("unknown argument {f:?}\n{USAGE}"));
    }
    if !o.cmds.is_empty() || !o.retry.is_zero() {
        return Err(format!("--cmd and --retry are for `script`\n{USAGE}"));
    }
    Ok(())
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

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn subnet_timeout_flag_is_validated() {
        let ok = parse_fabric_opts(&args(&["--subnet-timeout", "8"])).expect("8 is valid");
        assert!(
            format!("{:?}", ok.builder).contains("subnet_timeout: Some(8)"),
            "{:?}",
            ok.builder
        );
        let unset = parse_fabric_opts(&args(&[])).expect("defaults");
        assert!(format!("{:?}", unset.builder).contains("subnet_timeout: None"));
        for bad in ["32", "-1", "x", ""] {
            let e = parse_fabric_opts(&args(&["--subnet-timeout", bad]))
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(e.contains("0..31"), "{e}");
        }
        let e = parse_fabric_opts(&args(&["--subnet-timeout"]))
            .err()
            .expect("missing value accepted");
        assert!(e.contains("--subnet-timeout needs a value"), "{e}");
    }

    #[test]
    fn per_node_providers_and_options() {
        use acm_fabric::Provider;
        // The old form: one provider for every node.
        let o = parse_fabric_opts(&args(&["--provider", "acmrs"])).unwrap();
        for n in ["Hca2", "Hca3", "Hca4"] {
            assert_eq!(o.builder.provider_of(n), &Provider::Acmrs);
        }
        let o = parse_fabric_opts(&args(&[])).unwrap();
        assert_eq!(o.builder.provider_of("Hca3"), &Provider::Stock);
        // A default and one node.
        let o =
            parse_fabric_opts(&args(&["--provider", "stock", "--provider", "Hca3=acmrs"])).unwrap();
        assert_eq!(o.builder.provider_of("Hca2"), &Provider::Stock);
        assert_eq!(o.builder.provider_of("Hca3"), &Provider::Acmrs);
        assert_eq!(o.builder.provider_of("Hca4"), &Provider::Stock);
        // A list, no default (stock).
        let o = parse_fabric_opts(&args(&["--provider", "Hca3=acmrs,Hca4=acmrs"])).unwrap();
        assert_eq!(o.builder.provider_of("Hca2"), &Provider::Stock);
        assert_eq!(o.builder.provider_of("Hca4"), &Provider::Acmrs);
        // A path with --provider-name (the old form) and per node with @NAME.
        let o = parse_fabric_opts(&args(&[
            "--provider",
            "/x/libp.so",
            "--provider-name",
            "p",
            "--provider",
            "Hca4=/y/libq.so@q",
        ]))
        .unwrap();
        assert_eq!(o.builder.provider_of("Hca2").name(), "p");
        assert_eq!(o.builder.provider_of("Hca4").name(), "q");
        // Nodes that run no daemon are refused before anything starts.
        let e = parse_fabric_opts(&args(&["--nodes", "Hca3,Hca4", "--provider", "Hca2=acmrs"]))
            .err()
            .unwrap();
        assert!(e.contains("Hca2 is not a daemon node"), "{e}");
        let e = parse_fabric_opts(&args(&["--nodes", "Hca3", "--opt", "Hca4:timeout=5"]))
            .err()
            .unwrap();
        assert!(e.contains("Hca4 is not a daemon node"), "{e}");
        let e = parse_fabric_opts(&args(&["--provider", "stock,acmrs"]))
            .err()
            .unwrap();
        assert!(e.contains("two default providers"), "{e}");
        // Per-node and global options reach the builder.
        let o = parse_fabric_opts(&args(&[
            "--opt",
            "timeout=300",
            "--opt",
            "Hca3:retries=1",
            "--hosts-file",
            "none",
        ]))
        .unwrap();
        let dbg = format!("{:?}", o.builder);
        assert!(
            dbg.contains(r#"(None, "timeout", "300")"#)
                && dbg.contains(r#"(Some("Hca3"), "retries", "1")"#)
                && dbg.contains("hosts_file: Absent"),
            "{dbg}"
        );
        let e = parse_fabric_opts(&args(&["--hosts-file", "maybe"]))
            .err()
            .unwrap();
        assert!(e.contains("written, preload or none"), "{e}");
    }
}
