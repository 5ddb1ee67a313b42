//! ibsim topologies: the Debian ibsim examples (shipped in `tools/fabric/topologies/` and
//! embedded here) and a generator for two-level fat-trees.
//!
//! ibsim's net file is a list of node records separated by blank lines: a header
//! `Switch|Hca <ports> "<name>"`, then one `[<local port>] "<remote name>"[<remote port>]` line per
//! connected port, links listed on both ends.

use crate::{Error, Result};
use std::fmt::Write as _;

/// The Debian ibsim example topologies, by file name (copied from
/// `/usr/share/doc/ibsim-utils/net-examples/`).
const EXAMPLES: &[(&str, &str)] = &[
    ("net", include_str!("../topologies/net")),
    ("net.1", include_str!("../topologies/net.1")),
    ("net.2sw2path", include_str!("../topologies/net.2sw2path")),
    (
        "net.2sw2path4hca",
        include_str!("../topologies/net.2sw2path4hca"),
    ),
    (
        "net.2sw2path4hca2port",
        include_str!("../topologies/net.2sw2path4hca2port"),
    ),
];

/// An ibsim network description plus the names of its HCAs (in file order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// A short label (file name or `fattree-LxSxH`).
    pub label: String,
    /// The net file text given to `ibsim`.
    pub net: String,
}

impl Topology {
    /// Names of the shipped examples.
    pub fn example_names() -> Vec<&'static str> {
        EXAMPLES.iter().map(|(n, _)| *n).collect()
    }

    /// One of the shipped Debian examples, e.g. `net.2sw2path4hca` (Hca1..Hca4 behind two
    /// switches).
    pub fn example(name: &str) -> Result<Topology> {
        EXAMPLES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(n, text)| Topology {
                label: n.to_string(),
                net: text.to_string(),
            })
            .ok_or_else(|| {
                Error::new(format!(
                    "unknown topology {name:?}; shipped examples: {}",
                    Self::example_names().join(", ")
                ))
            })
    }

    /// Reads a net file from disk.
    pub fn from_file(path: &std::path::Path) -> Result<Topology> {
        let net = std::fs::read_to_string(path)
            .map_err(|e| Error::new(format!("cannot read topology {}: {e}", path.display())))?;
        let t = Topology {
            label: path
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "custom".into()),
            net,
        };
        if t.hcas().is_empty() {
            return Err(Error::new(format!(
                "topology {} declares no Hca node",
                path.display()
            )));
        }
        Ok(t)
    }

    /// A shipped example name, a `fattree:L,S,H` spec, or a path to a net file.
    pub fn parse(spec: &str) -> Result<Topology> {
        if let Some(rest) = spec.strip_prefix("fattree:") {
            let nums: Vec<&str> = rest.split(',').collect();
            let parse = |s: &str| -> Result<usize> {
                s.trim().parse::<usize>().map_err(|_| {
                    Error::new(format!(
                        "bad fat-tree spec {spec:?}: expected fattree:LEAVES,SPINES,HCAS_PER_LEAF"
                    ))
                })
            };
            if nums.len() != 3 {
                return Err(Error::new(format!(
                    "bad fat-tree spec {spec:?}: expected fattree:LEAVES,SPINES,HCAS_PER_LEAF"
                )));
            }
            return Topology::fat_tree(parse(nums[0])?, parse(nums[1])?, parse(nums[2])?);
        }
        if EXAMPLES.iter().any(|(n, _)| *n == spec) {
            return Topology::example(spec);
        }
        Topology::from_file(std::path::Path::new(spec))
    }

    /// A two-level fat-tree: `leaves` leaf switches `Leaf1..`, `spines` spine switches
    /// `Spine1..`, `hcas_per_leaf` single-port HCAs per leaf named `Hca1..` (leaf by leaf).
    /// Leaf `i` port `k` (1..=H) goes to its k-th HCA; leaf port `H+j` to spine `j` port `i`.
    pub fn fat_tree(leaves: usize, spines: usize, hcas_per_leaf: usize) -> Result<Topology> {
        if leaves == 0 || spines == 0 || hcas_per_leaf == 0 {
            return Err(Error::new(
                "fat-tree needs at least one leaf, one spine and one HCA per leaf",
            ));
        }
        if hcas_per_leaf + spines > 254 || leaves > 254 {
            return Err(Error::new(
                "fat-tree too large: a switch has at most 254 ports here",
            ));
        }
        let mut net = String::new();
        let _ = writeln!(
            net,
            "# Two-level fat-tree: {leaves} leaves x {spines} spines x {hcas_per_leaf} HCAs per leaf\n"
        );
        // Leaves first: ibsim uses the first node of the file as the default SM port.
        for l in 1..=leaves {
            let _ = writeln!(net, "Switch\t{} \"Leaf{l}\"", hcas_per_leaf + spines);
            for k in 1..=hcas_per_leaf {
                let h = (l - 1) * hcas_per_leaf + k;
                let _ = writeln!(net, "[{k}]\t\"Hca{h}\"[1]");
            }
            for s in 1..=spines {
                let _ = writeln!(net, "[{}]\t\"Spine{s}\"[{l}]", hcas_per_leaf + s);
            }
            net.push('\n');
        }
        for s in 1..=spines {
            let _ = writeln!(net, "Switch\t{leaves} \"Spine{s}\"");
            for l in 1..=leaves {
                let _ = writeln!(net, "[{l}]\t\"Leaf{l}\"[{}]", hcas_per_leaf + s);
            }
            net.push('\n');
        }
        for l in 1..=leaves {
            for k in 1..=hcas_per_leaf {
                let h = (l - 1) * hcas_per_leaf + k;
                let _ = writeln!(net, "Hca\t1 \"Hca{h}\"\n[1]\t\"Leaf{l}\"[{k}]\n");
            }
        }
        Ok(Topology {
            label: format!("fattree-{leaves}x{spines}x{hcas_per_leaf}"),
            net,
        })
    }

    /// The HCA node names, in file order.
    pub fn hcas(&self) -> Vec<String> {
        self.nodes_of_kind("Hca")
    }

    /// The switch node names, in file order.
    pub fn switches(&self) -> Vec<String> {
        self.nodes_of_kind("Switch")
    }

    fn nodes_of_kind(&self, kind: &str) -> Vec<String> {
        self.net
            .lines()
            .filter_map(|line| {
                let line = line.trim_start();
                let rest = line.strip_prefix(kind)?;
                if !rest.starts_with([' ', '\t']) {
                    return None;
                }
                let start = rest.find('"')? + 1;
                let len = rest[start..].find('"')?;
                Some(rest[start..start + len].to_string())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_hcas_in_file_order() {
        let t = Topology::example("net.2sw2path4hca").unwrap();
        assert_eq!(t.hcas(), ["Hca1", "Hca2", "Hca3", "Hca4"]);
        assert_eq!(t.switches(), ["Switch1", "Switch2"]);
    }

    #[test]
    fn unknown_example_is_an_error() {
        let e = Topology::example("nope").unwrap_err().to_string();
        assert!(e.contains("net.2sw2path4hca"), "{e}");
    }

    #[test]
    fn fat_tree_links_are_symmetric() {
        let t = Topology::fat_tree(3, 2, 2).unwrap();
        assert_eq!(t.hcas().len(), 6);
        assert_eq!(
            t.switches(),
            ["Leaf1", "Leaf2", "Leaf3", "Spine1", "Spine2"]
        );
        // Collect (node, port) -> (remote, rport) and check every link appears both ways.
        let mut links = std::collections::BTreeMap::new();
        let mut cur = String::new();
        for line in t.net.lines() {
            let l = line.trim();
            if l.starts_with("Switch") || l.starts_with("Hca") {
                cur = l.split('"').nth(1).unwrap().to_string();
            } else if let Some(rest) = l.strip_prefix('[') {
                let port: u32 = rest[..rest.find(']').unwrap()].parse().unwrap();
                let remote = l.split('"').nth(1).unwrap().to_string();
                let rport: u32 = l
                    .rsplit('[')
                    .next()
                    .unwrap()
                    .trim_end_matches(']')
                    .parse()
                    .unwrap();
                links.insert((cur.clone(), port), (remote, rport));
            }
        }
        assert_eq!(links.len(), 2 * (6 + 3 * 2));
        for ((n, p), (r, rp)) in &links {
            assert_eq!(links.get(&(r.clone(), *rp)), Some(&(n.clone(), *p)));
        }
    }

    #[test]
    fn parse_specs() {
        assert_eq!(Topology::parse("fattree:2,1,3").unwrap().hcas().len(), 6);
        assert!(Topology::parse("fattree:2,1").is_err());
        assert!(Topology::parse("fattree:0,1,1").is_err());
        assert!(Topology::parse("/nonexistent/net").is_err());
        assert_eq!(Topology::parse("net").unwrap().label, "net");
    }
}
