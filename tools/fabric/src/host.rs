//! Hosts with several HCAs and ports, and a second subnet.
//!
//! A daemon node is a *host*: one or more CAs (`ibsim0`, `ibsim1`, ...), each with one or more
//! ports, each port the first port of one ibsim node, on the main subnet or on a second one (a
//! second ibsim instance with its own OpenSM and subnet prefix). simverbs presents the host to
//! the daemon (`SIMVERBS_HOST`, docs/simverbs.md), so the unmodified ibacm sees every device
//! and port and opens each with its own umad port and SA agent.
//!
//! ```text
//! --host Hca3=Hca3+Hca5          one dual-port HCA, both ports on the main subnet
//! --host Hca3=Hca3,Hca5          two HCAs of one port each
//! --host Hca3=Hca3+s2:Hca2       a dual-port HCA, port 2 on subnet s2 (node Hca2 there)
//! --subnet s2=net.2sw2path4hca@Hca1/0xfec0000000000002
//! ```
//!
//! A dual-port HCA on one subnet is two single-port ibsim nodes (ibsim attaches a client to
//! its node's first port only): OpenSM sees two CA nodes with their own node GUIDs where
//! hardware has one node of two ports. ibacm keys ports by (device, port number) and GIDs by
//! port GUID and never looks at node GUIDs, so nothing the daemon does changes.

use crate::partition::{Partition, PartitionAddrs};
use crate::topology::Topology;
use crate::{Error, Result};
use std::net::{Ipv4Addr, Ipv6Addr};

/// The prefix of a second subnet unless its spec names one (fe80::/64 is the main subnet's
/// unless `subnet_prefix` changes it).
pub const SECOND_PREFIX: u64 = 0xfec0_0000_0000_0002;

/// ibsim's clients per instance (`IBSIM_MAX_CLIENTS`) less OpenSM and one transient probe:
/// the daemon ports a subnet can carry.
pub const PORTS_PER_SUBNET: usize = 8;

/// One port of a host spec: an ibsim node, on the main subnet (`subnet` None) or another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRef {
    pub subnet: Option<String>,
    pub node: String,
}

/// A host's CAs, each its ports in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSpec {
    pub devices: Vec<Vec<PortRef>>,
}

impl HostSpec {
    /// `DEV[,DEV...]`, a DEV its ports joined by `+`, a port `[SUBNET:]NODE`.
    pub fn parse(s: &str) -> Result<HostSpec> {
        let mut devices = Vec::new();
        for dev in s.split(',') {
            let mut ports = Vec::new();
            for p in dev.split('+') {
                let p = p.trim();
                let (subnet, node) = match p.split_once(':') {
                    Some((s, n)) => (Some(s.trim().to_string()), n.trim()),
                    None => (None, p),
                };
                if node.is_empty() || subnet.as_ref().is_some_and(|s| s.is_empty()) {
                    return Err(Error::new(format!(
                        "host spec {s:?}: empty port in {dev:?} (ports are [SUBNET:]NODE joined by +)"
                    )));
                }
                ports.push(PortRef {
                    subnet,
                    node: node.to_string(),
                });
            }
            if ports.len() > 9 {
                return Err(Error::new(format!(
                    "host spec {s:?}: {} ports on one CA (umad numbers them 1..9)",
                    ports.len()
                )));
            }
            devices.push(ports);
        }
        Ok(HostSpec { devices })
    }

    /// The one-port host of `node`.
    pub fn single(node: &str) -> HostSpec {
        HostSpec {
            devices: vec![vec![PortRef {
                subnet: None,
                node: node.to_string(),
            }]],
        }
    }

    /// Every port as (CA name, port number, the port).
    pub fn ports(&self) -> Vec<(String, u8, &PortRef)> {
        let mut v = Vec::new();
        for (d, ports) in self.devices.iter().enumerate() {
            for (i, p) in ports.iter().enumerate() {
                v.push((format!("ibsim{d}"), (i + 1) as u8, p));
            }
        }
        v
    }
}

/// A second subnet: its topology, SM node and prefix.
#[derive(Debug, Clone)]
pub struct SubnetSpec {
    pub name: String,
    pub topology: Topology,
    pub sm_node: Option<String>,
    pub prefix: u64,
}

impl SubnetSpec {
    /// `NAME=TOPOLOGY[@SMNODE][/0xPREFIX]` (a shipped example, `fattree:L,S,H` or a file).
    pub fn parse(s: &str) -> Result<SubnetSpec> {
        let (name, rest) = s.split_once('=').ok_or_else(|| {
            Error::new(format!(
                "subnet {s:?}: expected NAME=TOPOLOGY[@SM][/PREFIX]"
            ))
        })?;
        let name = name.trim();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(Error::new(format!(
                "subnet name {name:?}: letters and digits only"
            )));
        }
        let (rest, prefix) = match rest.rsplit_once('/') {
            Some((r, p)) if p.starts_with("0x") => {
                let v = u64::from_str_radix(&p[2..], 16)
                    .map_err(|_| Error::new(format!("subnet {name}: prefix {p:?} is not hex")))?;
                (r, v)
            }
            _ => (rest, SECOND_PREFIX),
        };
        let (topo, sm) = match rest.split_once('@') {
            Some((t, n)) => (t, Some(n.trim().to_string())),
            None => (rest, None),
        };
        Ok(SubnetSpec {
            name: name.to_string(),
            topology: Topology::parse(topo.trim())?,
            sm_node: sm,
            prefix,
        })
    }
}

/// One port of a daemon's host, brought up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// CA (verbs device and umad CA) name.
    pub ca: String,
    /// Port number on the CA.
    pub port: u8,
    /// 1-based position among the host's ports (spec order): `{NODE.lid@2}`.
    pub index: usize,
    /// The subnet's name: `""` for the main one.
    pub subnet: String,
    /// The ibsim node behind the port.
    pub sim_node: String,
    /// The ibsim instance (`IBSIM_SOCKNAME`) of its subnet.
    pub sock: String,
    /// LID assigned by its subnet's OpenSM.
    pub lid: u16,
    /// GID 0: its subnet's prefix and its port GUID.
    pub gid: Ipv6Addr,
    /// Host name, IPv4 and IPv6 the daemon serves on this port.
    pub name: String,
    pub ipv4: Ipv4Addr,
    pub ipv6: Ipv6Addr,
    /// Its addresses in the partitions its ibsim node is a member of (main subnet only; port 1's
    /// are the node's `NodeAddrs::partitions`).
    pub partitions: Vec<PartitionAddrs>,
}

impl HostPort {
    /// The partition addresses of port `index` (2..) of host `host` whose ibsim node `sim_node`
    /// is HCA number `k` of the main subnet: `<host>-p<index>-<pkey>`, `10.<41+i>.<k>`..., the
    /// IPs numbered by the port's own HCA so that no two ports share one.
    pub fn partition_addrs(
        host: &str,
        index: usize,
        sim_node: &str,
        k: usize,
        parts: &[Partition],
    ) -> Vec<PartitionAddrs> {
        parts
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                p.membership(sim_node)
                    .map(|m| PartitionAddrs::new(&format!("{host}-p{index}"), k, i, p, m))
            })
            .collect()
    }

    /// The addresses of port `index` (2..) of the host named `host` (lower case) at HCA
    /// position `k`: `<host>-p<index>`, `10.40.<index-1>.<k>`, `fd00:acf:0:<index-1>::<k>`.
    /// Port 1 keeps the host's own addresses (`NodeAddrs`).
    pub fn addresses(host: &str, index: usize, k: usize) -> (String, Ipv4Addr, Ipv6Addr) {
        let j = (index - 1) as u32;
        (
            format!("{host}-p{index}"),
            Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 40, 0, 0)) + (j << 8) + k as u32),
            Ipv6Addr::new(0xfd00, 0xacf, 0, j as u16, 0, 0, (k >> 16) as u16, k as u16),
        )
    }

    /// The `SIMVERBS_HOST` entry of this port.
    pub fn simverbs_entry(&self) -> String {
        format!("{}:{}={}/{}", self.ca, self.port, self.sock, self.sim_node)
    }

    /// The node GUID of the CA whose port this is, as `ib_acme -e` prints it: ibsim's port
    /// GUIDs are the node GUID plus the port number, and a CA is its first port's node.
    pub fn ca_guid_of(first_port_gid: Ipv6Addr) -> u64 {
        (u128::from(first_port_gid) as u64).wrapping_sub(1)
    }
}

/// The value of `SIMVERBS_HOST` for these ports.
pub fn simverbs_host(ports: &[HostPort]) -> String {
    ports
        .iter()
        .map(HostPort::simverbs_entry)
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether `ib_acme -e` output lists an endpoint of one of `providers` on port `port` of the
/// CA whose node GUID is `ca_guid`.
pub fn lists_endpoint(e_output: &str, ca_guid: u64, port: u8, providers: &[String]) -> bool {
    let guid = format!("{ca_guid:#018x}");
    e_output.lines().any(|l| {
        let f: Vec<&str> = l.split(',').collect();
        f.len() >= 6
            && f[1].eq_ignore_ascii_case(&guid)
            && f[2] == port.to_string()
            && providers.iter().any(|p| p == f[5])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_specs_parse_and_bad_ones_say_why() {
        let h = HostSpec::parse("Hca3+s2:Hca2,Hca5").unwrap();
        let p = h.ports();
        assert_eq!(p.len(), 3);
        assert_eq!(
            (p[0].0.as_str(), p[0].1, p[0].2.node.as_str()),
            ("ibsim0", 1, "Hca3")
        );
        assert_eq!(p[1].2.subnet.as_deref(), Some("s2"));
        assert_eq!(
            (p[1].0.as_str(), p[1].1, p[1].2.node.as_str()),
            ("ibsim0", 2, "Hca2")
        );
        assert_eq!(
            (p[2].0.as_str(), p[2].1, p[2].2.node.as_str()),
            ("ibsim1", 1, "Hca5")
        );
        assert_eq!(HostSpec::single("Hca4").ports().len(), 1);
        for bad in ["Hca3+", "Hca3,,Hca4", ":Hca3", "s2:", "a+b+c+d+e+f+g+h+i+j"] {
            assert!(HostSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn subnet_specs_parse() {
        let s = SubnetSpec::parse("s2=net.2sw2path4hca@Hca2/0xfec0000000000009").unwrap();
        assert_eq!(
            (s.name.as_str(), s.sm_node.as_deref(), s.prefix),
            ("s2", Some("Hca2"), 0xfec0_0000_0000_0009)
        );
        let s = SubnetSpec::parse("b=fattree:2,1,4").unwrap();
        assert_eq!((s.sm_node, s.prefix), (None, SECOND_PREFIX));
        assert!(s.topology.hcas().len() == 8);
        for bad in [
            "s2",
            "=net.2sw2path4hca",
            "s-2=net.2sw2path4hca",
            "s2=net.2sw2path4hca/0xzz",
            "s2=nosuch",
        ] {
            assert!(SubnetSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn port_addresses_entries_and_endpoint_rows() {
        let (n, v4, v6) = HostPort::addresses("hca3", 2, 3);
        assert_eq!(n, "hca3-p2");
        assert_eq!(v4, Ipv4Addr::new(10, 40, 1, 3));
        assert_eq!(v6, "fd00:acf:0:1::3".parse::<Ipv6Addr>().unwrap());
        let p = HostPort {
            ca: "ibsim0".into(),
            port: 2,
            index: 2,
            subnet: "s2".into(),
            sim_node: "Hca2".into(),
            sock: "f-s2".into(),
            lid: 4,
            gid: "fec0:0:0:2::10:4".parse().unwrap(),
            name: n,
            ipv4: v4,
            ipv6: v6,
            partitions: Vec::new(),
        };
        assert_eq!(
            simverbs_host(&[p.clone(), p]),
            "ibsim0:2=f-s2/Hca2,ibsim0:2=f-s2/Hca2"
        );
        assert_eq!(
            HostPort::ca_guid_of("fe80::10:7".parse().unwrap()),
            0x100006
        );
        let e = "svc,guid,port,pkey,ep_index,prov,addr_0,addresses\n\
                 127.0.0.1,0x0000000000100006,1,0xffff,1,acmrs,hca3\n\
                 127.0.0.1,0x0000000000100006,2,0xffff,1,ibacmp,hca3-p2\n";
        let acmrs = ["acmrs".to_string()];
        assert!(lists_endpoint(e, 0x100006, 1, &acmrs));
        assert!(!lists_endpoint(e, 0x100006, 2, &acmrs));
        assert!(lists_endpoint(e, 0x100006, 2, &["ibacmp".to_string()]));
        assert!(!lists_endpoint(e, 0x100009, 1, &acmrs));
    }
}
