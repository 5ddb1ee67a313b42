//! Partitions beyond the default one: what OpenSM's `partitions.conf` says, which node is a
//! full or a limited member, and the addresses each member serves in each partition.
//!
//! Spec form (the CLI's `--partition`, repeatable, and [`Partition::parse`]):
//!
//! ```text
//! 0x8001:Hca2,Hca3                     full members Hca2 and Hca3
//! 0x8002:Hca2=full,Hca3=limited,Hca4=limited
//! ```
//!
//! The P_Key is written with or without the membership bit (`0x8001` and `0x0001` are the same
//! partition); `0x7fff`/`0xffff` is the default partition, which every port is always a full
//! member of (OpenSM's `Default=0x7fff, ipoib, defmember=full : ALL ;`) and cannot be given.
//!
//! A member serves, in each partition it belongs to, a name `<name>-<pkey>` (`hca3-8001`), an
//! IPv4 `10.<41+i>.0.<k>` and an IPv6 `fd00:acf:<pkey>::<k>` (`i`: the partition's position in
//! the builder, `k`: the node's position among the topology's HCAs), written to its
//! `ibacm_addr.cfg` with the partition's P_Key (full-member form: the core matches address
//! lines to endpoints ignoring the membership bit).

use crate::{Error, Result};
use std::net::{Ipv4Addr, Ipv6Addr};

/// How a port belongs to a partition (IBA 10.9.1: the P_Key's top bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    /// Full member (P_Key with bit 15 set): reaches full and limited members.
    Full,
    /// Limited member (bit 15 clear): reaches full members only.
    Limited,
}

impl Membership {
    /// `full` or `limited`, as in `partitions.conf`.
    pub fn word(self) -> &'static str {
        match self {
            Membership::Full => "full",
            Membership::Limited => "limited",
        }
    }

    /// The P_Key a member of partition `pkey` holds in its table.
    pub fn pkey_in_table(self, pkey: u16) -> u16 {
        match self {
            Membership::Full => pkey | 0x8000,
            Membership::Limited => pkey & 0x7fff,
        }
    }
}

/// One partition besides the default: its P_Key and its members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// The partition's P_Key in full-member form (`0x8001`).
    pub pkey: u16,
    /// `(node, membership)` in the order given; a node appears once.
    pub members: Vec<(String, Membership)>,
}

impl Partition {
    /// A partition `pkey` (either membership form) with `members`. Errors: the default
    /// partition, P_Key 0, a node twice.
    pub fn new<I, S>(pkey: u16, members: I) -> Result<Partition>
    where
        I: IntoIterator<Item = (S, Membership)>,
        S: Into<String>,
    {
        let low = pkey & 0x7fff;
        if low == 0 || low == 0x7fff {
            return Err(Error::new(format!(
                "P_Key {pkey:#06x}: 0 is invalid and 0x7fff is the default partition, which \
                 every port is a full member of"
            )));
        }
        let members: Vec<(String, Membership)> =
            members.into_iter().map(|(n, m)| (n.into(), m)).collect();
        for (i, (n, _)) in members.iter().enumerate() {
            if members[..i].iter().any(|(o, _)| o == n) {
                return Err(Error::new(format!(
                    "node {n:?} listed twice in partition {:#06x}",
                    low | 0x8000
                )));
            }
        }
        if members.is_empty() {
            return Err(Error::new(format!(
                "partition {:#06x} has no members",
                low | 0x8000
            )));
        }
        Ok(Partition {
            pkey: low | 0x8000,
            members,
        })
    }

    /// Parses `PKEY:NODE[=full|limited],...` (see the module docs).
    pub fn parse(spec: &str) -> Result<Partition> {
        let (pkey, members) = spec.split_once(':').ok_or_else(|| {
            Error::new(format!(
                "partition {spec:?}: PKEY:NODE[=full|limited],... (e.g. 0x8001:Hca2,Hca3=limited)"
            ))
        })?;
        let p = pkey.trim();
        let digits = p
            .strip_prefix("0x")
            .or_else(|| p.strip_prefix("0X"))
            .unwrap_or(p);
        let pkey = u16::from_str_radix(digits, 16)
            .map_err(|_| Error::new(format!("partition {spec:?}: {p:?} is not a hex P_Key")))?;
        let mut list = Vec::new();
        for item in members.split(',') {
            let item = item.trim();
            let (node, m) = match item.split_once('=') {
                Some((n, m)) => (n.trim(), m.trim()),
                None => (item, "full"),
            };
            if node.is_empty() {
                return Err(Error::new(format!("partition {spec:?}: an empty member")));
            }
            let m = match m {
                "full" => Membership::Full,
                "limited" => Membership::Limited,
                other => {
                    return Err(Error::new(format!(
                        "partition {spec:?}: membership {other:?} of {node} is not full or limited"
                    )))
                }
            };
            list.push((node.to_string(), m));
        }
        Partition::new(pkey, list)
    }

    /// How `node` belongs to this partition, if it does.
    pub fn membership(&self, node: &str) -> Option<Membership> {
        self.members
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, m)| *m)
    }
}

/// Refuses a partition given twice (either membership form) and a member that is not an HCA
/// of `topology`.
pub fn check(parts: &[Partition], topology: &crate::Topology) -> Result<()> {
    let hcas = topology.hcas();
    for (i, p) in parts.iter().enumerate() {
        if parts[..i]
            .iter()
            .any(|o| o.pkey & 0x7fff == p.pkey & 0x7fff)
        {
            return Err(Error::new(format!("partition {:#06x} given twice", p.pkey)));
        }
        if let Some((n, _)) = p.members.iter().find(|(n, _)| !hcas.contains(n)) {
            return Err(Error::new(format!(
                "partition {:#06x}: member {n:?} is not an HCA of topology {}",
                p.pkey, topology.label
            )));
        }
    }
    Ok(())
}

/// A node's addresses in one partition (in its `ibacm_addr.cfg` with the partition's P_Key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionAddrs {
    /// The partition's P_Key, full-member form.
    pub pkey: u16,
    /// How the node belongs to it.
    pub membership: Membership,
    /// `<name>-<pkey hex>`, e.g. `hca3-8001`.
    pub name: String,
    /// `10.<41+i>.0.<k>`.
    pub ipv4: Ipv4Addr,
    /// `fd00:acf:<pkey>::<k>`.
    pub ipv6: Ipv6Addr,
}

impl PartitionAddrs {
    /// The addresses of the node named `host` (lower case), HCA number `k`, in the `i`-th
    /// partition `p`.
    pub fn new(host: &str, k: usize, i: usize, p: &Partition, m: Membership) -> PartitionAddrs {
        PartitionAddrs {
            pkey: p.pkey,
            membership: m,
            name: format!("{host}-{:04x}", p.pkey),
            ipv4: Ipv4Addr::new(10, 41 + i as u8, (k >> 8) as u8, k as u8),
            ipv6: Ipv6Addr::new(0xfd00, 0xacf, p.pkey, 0, 0, 0, (k >> 16) as u16, k as u16),
        }
    }
}

/// The MGID of partition `pkey`'s base ACM group with the options' default `min_rate` 10
/// (rate enum 3) and `min_mtu` 2048 (MTU enum 4): `ff15:4001:<pkey|8000>:0003:0400::`.
pub fn acm_base_mgid(pkey: u16) -> String {
    format!("ff15:4001:{:04x}:0003:0400::", pkey | 0x8000)
}

/// OpenSM's `partitions.conf` for `parts`, given each node's port GUID: the default partition
/// with every port a full member (OpenSM's own default), then one line per partition with its
/// members' GUIDs and memberships. Errors: a member without a GUID (not an HCA of the fabric).
///
/// A partition with limited members also gets its base ACM group defined in the file
/// ([`acm_base_mgid`], scope 5, Q_Key 0x80010000), so OpenSM creates it with the partition's
/// full P_Key. Without it the first join creates the group with the joiner's P_Key: a limited
/// member's makes it a limited group, and OpenSM then refuses every other limited member's
/// join ("Both limited P_Keys", ERR 1B31), so which limited member can resolve anything
/// depends on who joined first (seen with stock ibacmp and acmrs alike). A site with limited
/// members defines the group the same way.
pub fn partitions_conf(
    parts: &[Partition],
    guid_of: impl Fn(&str) -> Option<u64>,
) -> Result<String> {
    let mut s =
        String::from("# generated by acm-fabric\nDefault=0x7fff, ipoib, defmember=full : ALL ;\n");
    for (i, p) in parts.iter().enumerate() {
        let mut members = Vec::new();
        for (n, m) in &p.members {
            let g = guid_of(n).ok_or_else(|| {
                Error::new(format!(
                    "partition {:#06x}: member {n:?} is not an HCA of the fabric",
                    p.pkey
                ))
            })?;
            members.push(format!("{g:#018x}={}", m.word()));
        }
        let group = if p.members.iter().any(|(_, m)| *m == Membership::Limited) {
            format!(
                "\n    mgid={},scope=5,Q_Key=0x80010000,rate=3,mtu=4\n    ",
                acm_base_mgid(p.pkey)
            )
        } else {
            String::new()
        };
        s.push_str(&format!(
            "Part{}=0x{:04x}, ipoib : {group}{} ;\n",
            i + 1,
            p.pkey & 0x7fff,
            members.join(", ")
        ));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_refuse() {
        let p = Partition::parse("0x8002:Hca2=full, Hca3=limited,Hca4").unwrap();
        assert_eq!(p.pkey, 0x8002);
        assert_eq!(
            p.members,
            vec![
                ("Hca2".to_string(), Membership::Full),
                ("Hca3".to_string(), Membership::Limited),
                ("Hca4".to_string(), Membership::Full)
            ]
        );
        assert_eq!(Partition::parse("0001:Hca2").unwrap().pkey, 0x8001);
        assert_eq!(p.membership("Hca3"), Some(Membership::Limited));
        assert_eq!(p.membership("Hca1"), None);
        for bad in [
            "0x8001",
            "0x7fff:Hca2",
            "0xffff:Hca2",
            "0x8000:Hca2",
            "zz:Hca2",
            "0x8001:Hca2,Hca2",
            "0x8001:Hca2=half",
            "0x8001:,Hca2",
        ] {
            assert!(Partition::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn conf_lists_guids_with_memberships() {
        let p = Partition::parse("0x8002:Hca2,Hca3=limited").unwrap();
        let conf = partitions_conf(std::slice::from_ref(&p), |n| match n {
            "Hca2" => Some(0x20),
            "Hca3" => Some(0x30),
            _ => None,
        })
        .unwrap();
        assert!(conf.contains("Default=0x7fff, ipoib, defmember=full : ALL ;"));
        assert!(
            conf.contains(
                "Part1=0x0002, ipoib : \n    mgid=ff15:4001:8002:0003:0400::,scope=5,\
                 Q_Key=0x80010000,rate=3,mtu=4\n    \
                 0x0000000000000020=full, 0x0000000000000030=limited ;"
            ),
            "{conf}"
        );
        let full = Partition::parse("0x8001:Hca2").unwrap();
        let conf = partitions_conf(&[full], |_| Some(0x20)).unwrap();
        assert!(
            conf.contains("Part1=0x0001, ipoib : 0x0000000000000020=full ;"),
            "{conf}"
        );
        assert!(partitions_conf(&[p], |_| None).is_err());
    }

    #[test]
    fn partition_addresses_are_distinct_per_partition_and_node() {
        let a = Partition::parse("0x8001:Hca2").unwrap();
        let b = Partition::parse("0x8002:Hca2").unwrap();
        let x = PartitionAddrs::new("hca2", 2, 0, &a, Membership::Full);
        let y = PartitionAddrs::new("hca2", 2, 1, &b, Membership::Full);
        let z = PartitionAddrs::new("hca3", 3, 0, &a, Membership::Full);
        assert_eq!(x.name, "hca2-8001");
        assert_eq!(x.ipv4, Ipv4Addr::new(10, 41, 0, 2));
        assert_eq!(y.ipv4, Ipv4Addr::new(10, 42, 0, 2));
        assert_eq!(x.ipv6, "fd00:acf:8001::2".parse::<Ipv6Addr>().unwrap());
        assert_ne!(x.ipv4, z.ipv4);
        assert_ne!(x.name, y.name);
        assert_eq!(Membership::Limited.pkey_in_table(0x8001), 0x0001);
        assert_eq!(Membership::Full.pkey_in_table(0x0001), 0x8001);
    }
}
