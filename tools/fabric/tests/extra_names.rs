//! `FabricBuilder::extra_names`: more host names per node in `ibacm_addr.cfg`, each one a
//! destination its peers resolve over the ACM address protocol (no hosts file).
//!
//! Needs root, the Debian packages of docs/fabric.md and `libsimverbs.so` built into the same
//! target directory (`cargo build -p simverbs`).

use acm_fabric::{Fabric, HostsFile, Provider, Topology};
use std::time::Duration;

const VERIFIED: &str = "SA verification: success";

#[test]
fn extra_names_are_in_the_address_file_and_resolve_over_the_network() {
    let f = Fabric::builder(
        Topology::example("net.2sw2path4hca").unwrap(),
        ["Hca3", "Hca4"],
    )
    .provider(Provider::Stock)
    .hosts_file(HostsFile::Absent)
    .extra_names(3)
    .name_prefix("extra-names")
    .start()
    .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    for n in f.nodes() {
        let want: Vec<String> = (1..=3).map(|k| format!("{}-{k}", n.addrs.name)).collect();
        assert_eq!(n.addrs.extra_names, want, "{}", n.name);
        let addr = std::fs::read_to_string(n.dir.join("ibacm_addr.cfg")).unwrap();
        let lines: Vec<&str> = addr.lines().filter(|l| !l.starts_with('#')).collect();
        let mut expect = vec![
            format!("{} ibsim0 1 default", n.addrs.name),
            format!("{} ibsim0 1 default", n.addrs.ipv4),
            format!("{} ibsim0 1 default", n.addrs.ipv6),
        ];
        expect.extend(want.iter().map(|w| format!("{w} ibsim0 1 default")));
        assert_eq!(lines, expect, "{}", n.name);
        // The daemon serves all of them on its endpoint.
        let e = n.acme(&["-e"]).unwrap();
        assert!(e.stdout.contains(&want[2]), "{} -e: {e}", n.name);
    }
    // An extra name of Hca4 resolves from Hca3 to Hca4's path (multicast query, Hca4's
    // response, SA PathRecord), SA-verified.
    let (h3, h4) = (f.node("Hca3").unwrap(), f.node("Hca4").unwrap());
    let out = h3
        .acme_until(
            &["-f", "n", "-s", &h3.addrs.name, "-d", "hca4-2", "-v"],
            Duration::from_secs(15),
            |o| o.stdout.contains(VERIFIED),
        )
        .unwrap();
    assert!(out.stdout.contains(VERIFIED), "{out}\n{}", f.logs_report());
    assert!(out.stdout.contains(&format!("dlid: {}\n", h4.lid)), "{out}");
    // The default is none.
    let g = Fabric::builder(Topology::example("net.2sw2path4hca").unwrap(), ["Hca3"])
        .start_daemons(false)
        .name_prefix("extra-names-0")
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    assert!(g.node("Hca3").unwrap().addrs.extra_names.is_empty());
}
