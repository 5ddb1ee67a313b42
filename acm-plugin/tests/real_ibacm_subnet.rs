//! A subnet prefix other than the default fe80::/64 (OpenSM's `subnet_prefix`), and the core's
//! per-prefix provider choice (`provider acmrs 0x<prefix>` next to `provider ibacmp default`):
//! real ibacm, real OpenSM, real `ib_acme`, mixed stock and acmrs, no hosts file.
//!
//! Needs root and `libsimverbs.so` + `libacmrs.so` in the target directory.

use acm_fabric::checks::{self, require_root};
use acm_fabric::{Fabric, HostsFile, Provider, Topology};
use std::time::Duration;

const PREFIX: u64 = 0xfec0_0000_0000_0001;

#[test]
fn a_site_prefix_reaches_gids_paths_and_the_cores_provider_choice() {
    require_root();
    // Hca2: acmrs by default. Hca3: stock by default, acmrs for ports of PREFIX: acmrs.
    // Hca4: the same but acmrs for fe80::/64 only: stock.
    let f = Fabric::builder(
        Topology::example("net.2sw2path4hca").unwrap(),
        ["Hca2", "Hca3", "Hca4"],
    )
    .provider(Provider::Stock)
    .node_provider("Hca2", Provider::Acmrs)
    .node_extra_provider("Hca3", Provider::Acmrs)
    .node_option("Hca3", "provider", &format!("acmrs {PREFIX:#x}"))
    .node_extra_provider("Hca4", Provider::Acmrs)
    .node_option("Hca4", "provider", "acmrs 0xfe80000000000000")
    .subnet_prefix(PREFIX)
    .hosts_file(HostsFile::Absent)
    .name_prefix("subnet")
    .option("timeout", "500")
    .start()
    .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    for (n, prov) in [
        ("Hca2", ",acmrs,"),
        ("Hca3", ",acmrs,"),
        ("Hca4", ",ibacmp,"),
    ] {
        let node = f.node(n).unwrap();
        assert_eq!(
            u128::from(node.gid) >> 64,
            u128::from(PREFIX),
            "{n}'s GID {} has the site prefix",
            node.gid
        );
        let e = node.acme(&["-e"]).unwrap();
        assert!(e.stdout.contains(prov), "{n} -e: {e}\n{}", node.log());
    }
    assert!(f
        .node("Hca3")
        .unwrap()
        .log()
        .contains("Found provider acmrs for port ibsim0/1"));
    for on in ["Hca2", "Hca3", "Hca4"] {
        for to in ["Hca2", "Hca3", "Hca4"].iter().filter(|t| **t != on) {
            let (s, d) = (&f.node(on).unwrap().addrs, &f.node(to).unwrap().addrs);
            checks::resolve_verified(&f, on, "n", &s.name, &d.name, to, Duration::from_secs(20));
            checks::resolve_verified(
                &f,
                on,
                "i",
                &s.ipv6.to_string(),
                &d.ipv6.to_string(),
                to,
                Duration::from_secs(20),
            );
        }
        let (s, d) = (f.node(on).unwrap(), f.node("Hca2").unwrap());
        if on != "Hca2" {
            checks::resolve_verified(
                &f,
                on,
                "g",
                &s.gid.to_string(),
                &d.gid.to_string(),
                "Hca2",
                Duration::from_secs(20),
            );
        }
    }
}
