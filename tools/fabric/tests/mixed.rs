//! Mixed fabrics: daemons on one fabric loading different providers (Debian's `libibacmp.so`
//! and this project's `libacmrs.so`), per-node options, and fabrics with no hosts file.
//!
//! Needs root, the Debian packages of docs/fabric.md, and `libsimverbs.so` + `libacmrs.so`
//! built into the same target directory (`cargo build -p simverbs -p acm-plugin`).

use acm_fabric::checks;
use acm_fabric::{Fabric, HostsFile, Provider, Topology};
use std::time::Duration;

fn topo() -> Topology {
    Topology::example("net.2sw2path4hca").unwrap()
}

/// [`checks::resolve_verified`] within 15 s.
fn resolve_verified(f: &Fabric, on: &str, fmt: &str, src: &str, dst: &str, dst_node: &str) {
    checks::resolve_verified(f, on, fmt, src, dst, dst_node, Duration::from_secs(15));
}

fn opts_of(f: &Fabric, node: &str) -> String {
    std::fs::read_to_string(f.node(node).unwrap().dir.join("ibacm_opts.cfg")).unwrap()
}

/// The value of option `name` in an opts file (the last non-comment line of that name).
fn opt(opts: &str, name: &str) -> Option<String> {
    opts.lines()
        .rev()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_string())
}

#[test]
fn mixed_providers_each_daemon_loads_its_own_and_resolves_lid_paths() {
    // Hca2 and Hca4 stock (the default), Hca3 acmrs; per-node options over global ones.
    let f = Fabric::builder(topo(), ["Hca2", "Hca3", "Hca4"])
        .provider(Provider::Stock)
        .node_provider("Hca3", Provider::Acmrs)
        .option("retries", "2")
        .node_option("Hca2", "retries", "1")
        .node_option("Hca3", "timeout", "1500")
        .name_prefix("mixed-prov")
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    assert!(f.is_mixed());
    let want = [
        ("Hca2", "ibacmp", "libibacmp.so", "libacmrs.so"),
        ("Hca3", "acmrs", "libacmrs.so", "libibacmp.so"),
        ("Hca4", "ibacmp", "libibacmp.so", "libacmrs.so"),
    ];
    for (node, prov, lib, other) in want {
        let n = f.node(node).unwrap();
        assert_eq!(n.provider().name(), prov, "{node}");
        // Its opts file names its own provider and provider directory, which holds only its
        // own library.
        let opts = opts_of(&f, node);
        assert!(
            opts.contains(&format!("\nprovider {prov} default\n")),
            "{node}:\n{opts}"
        );
        let prov_dir = n.dir.join("prov");
        assert_eq!(
            opt(&opts, "provider_lib_path").as_deref(),
            Some(prov_dir.to_str().unwrap())
        );
        assert!(prov_dir.join(lib).is_file(), "{node}: no {lib}");
        assert!(!prov_dir.join(other).exists(), "{node}: {other} too");
        // The core loaded exactly that provider and made it the default.
        let log = n.log();
        let loaded = format!("Provider {prov} ({}) loaded", prov_dir.join(lib).display());
        assert!(log.contains(&loaded), "{node}: no {loaded:?}:\n{log}");
        assert!(
            log.contains(&format!("default provider: {prov}\n")),
            "{node}:\n{log}"
        );
        assert_eq!(log.matches(") loaded").count(), 1, "{node}:\n{log}");
        assert!(
            log.contains(&format!("assign default prov {prov} to ibsim0/1")),
            "{node}:\n{log}"
        );
        // `ib_acme -e` shows the endpoint served by that provider.
        let e = n.acme(&["-e"]).unwrap();
        let row = format!(
            ",1,0xffff,1,{prov},{},{},{}",
            n.addrs.name, n.addrs.ipv4, n.addrs.ipv6
        );
        assert!(e.stdout.contains(&row), "{node} -e:\n{e}");
    }
    // Per-node options: the node's line wins over the line for every node.
    assert_eq!(opt(&opts_of(&f, "Hca2"), "retries").as_deref(), Some("1"));
    assert_eq!(opt(&opts_of(&f, "Hca3"), "retries").as_deref(), Some("2"));
    assert_eq!(
        opt(&opts_of(&f, "Hca3"), "timeout").as_deref(),
        Some("1500")
    );
    assert_eq!(
        opt(&opts_of(&f, "Hca4"), "timeout").as_deref(),
        Some("2000")
    );
    // The acmrs daemon's own log lines carry its name; the stock daemons' logs have none.
    assert!(
        f.node("Hca3").unwrap().log().contains("acmrs: started"),
        "{}",
        f.logs_report()
    );
    for node in ["Hca2", "Hca4"] {
        assert!(!f.node(node).unwrap().log().contains("acmrs:"), "{node}");
    }

    // A LID path from every node to every other, each through its own provider and the SA.
    for (on, to) in [
        ("Hca3", "Hca2"),
        ("Hca2", "Hca3"),
        ("Hca3", "Hca4"),
        ("Hca4", "Hca3"),
        ("Hca2", "Hca4"),
    ] {
        let (s, d) = (f.node(on).unwrap().lid, f.node(to).unwrap().lid);
        resolve_verified(&f, on, "l", &s.to_string(), &d.to_string(), to);
    }
    // Each provider counted its own requests (acmrs per endpoint with -P 1).
    let p = f.node("Hca3").unwrap().acme(&["-P", "col"]).unwrap();
    assert!(p.stdout.contains("Resolve Count"), "{p}");
}

#[test]
fn no_hosts_file_stock_resolves_names_and_ips_over_the_address_protocol() {
    let f = Fabric::builder(topo(), ["Hca2", "Hca3", "Hca4"])
        .provider(Provider::Stock)
        .hosts_file(HostsFile::Absent)
        .name_prefix("mixed-nohosts")
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    for n in f.nodes() {
        assert!(!n.dir.join("ibacm_hosts.data").exists(), "{}", n.name);
        let opts = opts_of(&f, &n.name);
        assert_eq!(opt(&opts, "addr_preload").as_deref(), Some("none"));
        // Its address file lists only its own three addresses.
        let addr = std::fs::read_to_string(n.dir.join("ibacm_addr.cfg")).unwrap();
        let lines: Vec<&str> = addr.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                format!("{} ibsim0 1 default", n.addrs.name),
                format!("{} ibsim0 1 default", n.addrs.ipv4),
                format!("{} ibsim0 1 default", n.addrs.ipv6)
            ],
            "{}",
            n.name
        );
    }
    let (h2, h3, h4) = (
        f.node("Hca2").unwrap().addrs.clone(),
        f.node("Hca3").unwrap().addrs.clone(),
        f.node("Hca4").unwrap().addrs.clone(),
    );
    // Names, IPv4, IPv6 in both directions (what scripts/main-mixed.script asks of a mixed
    // fabric; stock on both ends works today).
    resolve_verified(&f, "Hca3", "n", &h3.name, &h2.name, "Hca2");
    resolve_verified(&f, "Hca2", "n", &h2.name, &h3.name, "Hca3");
    resolve_verified(
        &f,
        "Hca3",
        "i",
        &h3.ipv4.to_string(),
        &h2.ipv4.to_string(),
        "Hca2",
    );
    resolve_verified(
        &f,
        "Hca2",
        "i",
        &h2.ipv4.to_string(),
        &h3.ipv4.to_string(),
        "Hca3",
    );
    resolve_verified(
        &f,
        "Hca3",
        "i",
        &h3.ipv6.to_string(),
        &h4.ipv6.to_string(),
        "Hca4",
    );
    resolve_verified(
        &f,
        "Hca4",
        "i",
        &h4.ipv6.to_string(),
        &h3.ipv6.to_string(),
        "Hca3",
    );
    // Answered by the destination over the ACM multicast protocol (no preload to hit).
    let hca2_log = f.node("Hca2").unwrap().log();
    assert!(
        hca2_log.contains("acmp_send_addr_resp: hca3"),
        "{}",
        f.logs_report()
    );
}

#[test]
fn hosts_file_modes_write_the_right_files_and_refuse_contradictions() {
    // Preloaded: the file exists and every node preloads it (no daemons needed to see that).
    let f = Fabric::builder(topo(), ["Hca3", "Hca4"])
        .hosts_file(HostsFile::Preloaded)
        .node_provider("Hca4", Provider::Acmrs)
        .name_prefix("mixed-hostsmode")
        .start_daemons(false)
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    for n in f.nodes() {
        let hosts = std::fs::read_to_string(n.dir.join("ibacm_hosts.data")).unwrap();
        assert_eq!(hosts, f.hosts_data());
        assert!(hosts.contains(&format!("hca4 {}\n", f.node("Hca4").unwrap().gid)));
        let opts = opts_of(&f, &n.name);
        assert_eq!(opt(&opts, "addr_preload").as_deref(), Some("acm_hosts"));
    }
    // Each node's opts file names its provider even without daemons.
    assert!(opts_of(&f, "Hca3").contains("\nprovider ibacmp default\n"));
    assert!(opts_of(&f, "Hca4").contains("\nprovider acmrs default\n"));
    assert_eq!(f.node("Hca4").unwrap().provider(), &Provider::Acmrs);
    drop(f);

    // Written (the default): the file exists, the template's `addr_preload none` stays.
    let f = Fabric::builder(topo(), ["Hca3"])
        .name_prefix("mixed-hostsmode")
        .start_daemons(false)
        .start()
        .unwrap();
    let n = f.node("Hca3").unwrap();
    assert!(n.dir.join("ibacm_hosts.data").is_file());
    assert_eq!(
        opt(&opts_of(&f, "Hca3"), "addr_preload").as_deref(),
        Some("none")
    );
    drop(f);

    // Contradictions and unknown nodes are refused before anything starts.
    for (b, why) in [
        (
            Fabric::builder(topo(), ["Hca3"])
                .hosts_file(HostsFile::Absent)
                .option("addr_preload", "acm_hosts"),
            "contradicts HostsFile::Absent",
        ),
        (
            Fabric::builder(topo(), ["Hca3"])
                .hosts_file(HostsFile::Absent)
                .node_option("Hca3", "addr_preload", "acm_hosts"),
            "on Hca3",
        ),
        (
            Fabric::builder(topo(), ["Hca3"]).node_provider("Hca4", Provider::Acmrs),
            "given for \"Hca4\", which runs no daemon",
        ),
        (
            Fabric::builder(topo(), ["Hca3"]).node_option("Hca2", "timeout", "1"),
            "option timeout given for \"Hca2\"",
        ),
    ] {
        let e = b.start().unwrap_err().to_string();
        assert!(e.contains(why), "{why}: {e}");
    }
}
