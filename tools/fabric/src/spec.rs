//! The command-line forms of provider and option choices, parsed (and unit-tested) here so the
//! CLI and tests agree on them.
//!
//! Providers (`--provider`, repeatable; items of one value separated by commas):
//!
//! ```text
//! stock | acmrs | PATH.so[@NAME]        the default for every daemon node
//! installed:NAME                        a provider already in ibacm's default directory
//!                                       (e.g. from the acmrs .deb): no copy, no
//!                                       provider_lib_path line
//! NODE=stock | NODE=acmrs | NODE=PATH.so[@NAME]   one node's provider
//! --provider stock --provider Hca3=acmrs
//! --provider Hca2=stock,Hca3=acmrs,Hca4=acmrs
//! ```
//!
//! A provider given as a path needs the name its `provider_query` reports: `@NAME` after the
//! path, or `--provider-name NAME` (for every path given without `@`).
//!
//! Options (`--opt`, repeatable): `NAME=VALUE` for every node, `NODE:NAME=VALUE` for one.

use crate::{Error, Provider, Result};

/// What the `--provider` arguments chose: a default (if given) and per-node providers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProviderChoice {
    /// The provider of every node not listed in `per_node` (`None`: the builder's default,
    /// stock).
    pub default: Option<Provider>,
    /// `(node, provider)` in the order given; a node appears once.
    pub per_node: Vec<(String, Provider)>,
}

impl ProviderChoice {
    /// Parses every `--provider` value (see the module docs) and an optional
    /// `--provider-name`. Errors: a node or the default given twice, an empty item, a path
    /// without a name, a name with no path to go with it.
    pub fn parse<S: AsRef<str>>(specs: &[S], name: Option<&str>) -> Result<ProviderChoice> {
        let mut choice = ProviderChoice::default();
        let mut used_name = false;
        for spec in specs {
            for item in spec.as_ref().split(',') {
                let item = item.trim();
                if item.is_empty() {
                    return Err(Error::new(format!(
                        "empty provider in {:?} (stock, acmrs, PATH.so[@NAME] or NODE=...)",
                        spec.as_ref()
                    )));
                }
                // `NODE=P`, unless what precedes `=` looks like a path.
                let (node, p) = match item.split_once('=') {
                    Some((n, p)) if !n.contains('/') => (Some(n.trim()), p.trim()),
                    _ => (None, item),
                };
                if node == Some("") {
                    return Err(Error::new(format!("provider {item:?} names no node")));
                }
                let provider = match p {
                    "stock" => Provider::Stock,
                    "acmrs" => Provider::Acmrs,
                    p if p.starts_with("installed:") => {
                        Provider::installed(p).unwrap_or_else(|| unreachable!())?
                    }
                    "" => return Err(Error::new(format!("provider {item:?} names no provider"))),
                    path => {
                        let (path, n) = match path.rsplit_once('@') {
                            Some((path, n)) if !n.is_empty() && !n.contains('/') => (path, Some(n)),
                            _ => (path, None),
                        };
                        let n = match (n, name) {
                            (Some(n), _) => n,
                            (None, Some(n)) => {
                                used_name = true;
                                n
                            }
                            (None, None) => {
                                return Err(Error::new(format!(
                                    "provider {path:?} is neither `stock` nor `acmrs`: give its \
                                     provider name too ({path}@NAME or --provider-name NAME)"
                                )))
                            }
                        };
                        Provider::Custom {
                            path: path.into(),
                            name: n.to_string(),
                        }
                    }
                };
                match node {
                    None if choice.default.is_some() => {
                        return Err(Error::new(format!(
                        "two default providers ({} and {item}); name a node for one: NODE={item}",
                        choice
                            .default
                            .as_ref()
                            .map(Provider::name)
                            .unwrap_or_default()
                    )))
                    }
                    None => choice.default = Some(provider),
                    Some(n) if choice.per_node.iter().any(|(m, _)| m == n) => {
                        return Err(Error::new(format!("provider for {n} given twice")))
                    }
                    Some(n) => choice.per_node.push((n.to_string(), provider)),
                }
            }
        }
        if name.is_some() && !used_name {
            return Err(Error::new(
                "a provider name only goes with a provider given as a path",
            ));
        }
        Ok(choice)
    }

    /// The provider `node` gets (the default if not listed; `None` if neither).
    pub fn for_node(&self, node: &str) -> Option<&Provider> {
        self.per_node
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, p)| p)
            .or(self.default.as_ref())
    }
}

/// One `--opt` value: an `ibacm_opts.cfg` line for every node or for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptSpec {
    /// `Some(node)` for `NODE:NAME=VALUE`.
    pub node: Option<String>,
    /// Option name.
    pub name: String,
    /// Option value (may contain `=` and `:`).
    pub value: String,
}

impl OptSpec {
    /// Parses `NAME=VALUE` or `NODE:NAME=VALUE` (option names contain neither `:` nor `=`).
    pub fn parse(s: &str) -> Result<OptSpec> {
        let (k, value) = s
            .split_once('=')
            .ok_or_else(|| Error::new(format!("--opt wants [NODE:]NAME=VALUE, got {s:?}")))?;
        let (node, name) = match k.split_once(':') {
            Some((n, k)) => (Some(n.trim().to_string()), k.trim()),
            None => (None, k.trim()),
        };
        if name.is_empty() || name.contains(char::is_whitespace) || node.as_deref() == Some("") {
            return Err(Error::new(format!(
                "--opt wants [NODE:]NAME=VALUE, got {s:?}"
            )));
        }
        Ok(OptSpec {
            node,
            name: name.to_string(),
            value: value.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn parse(specs: &[&str]) -> Result<ProviderChoice> {
        ProviderChoice::parse(specs, None)
    }

    #[test]
    fn old_single_provider_forms() {
        assert_eq!(parse(&["stock"]).unwrap().default, Some(Provider::Stock));
        assert_eq!(parse(&["acmrs"]).unwrap().default, Some(Provider::Acmrs));
        assert_eq!(parse(&[]).unwrap(), ProviderChoice::default());
        let c = ProviderChoice::parse(&["/x/libfoo.so"], Some("foo")).unwrap();
        assert_eq!(
            c.default,
            Some(Provider::Custom {
                path: PathBuf::from("/x/libfoo.so"),
                name: "foo".into()
            })
        );
        let e = parse(&["/x/libfoo.so"]).unwrap_err().to_string();
        assert!(e.contains("give its provider name"), "{e}");
        let e = ProviderChoice::parse(&["stock"], Some("x"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("only goes with a provider given as a path"),
            "{e}"
        );
    }

    #[test]
    fn per_node_forms() {
        let c = parse(&["stock", "Hca3=acmrs"]).unwrap();
        assert_eq!(c.default, Some(Provider::Stock));
        assert_eq!(c.per_node, vec![("Hca3".to_string(), Provider::Acmrs)]);
        assert_eq!(c.for_node("Hca3"), Some(&Provider::Acmrs));
        assert_eq!(c.for_node("Hca2"), Some(&Provider::Stock));

        let c = parse(&["Hca2=stock,Hca3=acmrs, Hca4=acmrs"]).unwrap();
        assert_eq!(c.default, None);
        assert_eq!(
            c.per_node,
            vec![
                ("Hca2".to_string(), Provider::Stock),
                ("Hca3".to_string(), Provider::Acmrs),
                ("Hca4".to_string(), Provider::Acmrs)
            ]
        );
        assert_eq!(c.for_node("Hca9"), None);

        // The default may come anywhere, also inside a list.
        let c = parse(&["Hca3=acmrs,stock"]).unwrap();
        assert_eq!(c.default, Some(Provider::Stock));

        // A path with its name, per node; `--provider-name` for paths without `@`.
        let c =
            ProviderChoice::parse(&["Hca3=/opt/p/libx.so@x", "/opt/p/liby.so"], Some("y")).unwrap();
        assert_eq!(c.for_node("Hca3").unwrap().name(), "x");
        assert_eq!(c.default.as_ref().unwrap().name(), "y");
        assert_eq!(
            c.for_node("Hca3"),
            Some(&Provider::Custom {
                path: PathBuf::from("/opt/p/libx.so"),
                name: "x".into()
            })
        );
        // `=` in a path is not a node.
        let c = parse(&["/opt/a=b/libz.so@z"]).unwrap();
        assert_eq!(c.default.as_ref().unwrap().name(), "z");
    }

    #[test]
    fn bad_provider_specs() {
        for (bad, why) in [
            (&["stock", "acmrs"][..], "two default providers"),
            (&["stock,acmrs"][..], "two default providers"),
            (&["Hca3=acmrs", "Hca3=stock"][..], "Hca3 given twice"),
            (&["Hca3="][..], "names no provider"),
            (&["=acmrs"][..], "names no node"),
            (&["stock,"][..], "empty provider"),
            (&["Hca3=/x/libq.so"][..], "give its provider name"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        // A name that no path uses is refused (per-node named paths do not count).
        let e = ProviderChoice::parse(&["Hca3=/x/libq.so@q"], Some("n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("only goes with"), "{e}");
    }

    #[test]
    fn opt_specs() {
        assert_eq!(
            OptSpec::parse("route_prot=sa").unwrap(),
            OptSpec {
                node: None,
                name: "route_prot".into(),
                value: "sa".into()
            }
        );
        assert_eq!(
            OptSpec::parse("Hca3:addr_data_file=/x/y=z:w").unwrap(),
            OptSpec {
                node: Some("Hca3".into()),
                name: "addr_data_file".into(),
                value: "/x/y=z:w".into()
            }
        );
        // Empty values are allowed (the line is `NAME `).
        assert_eq!(OptSpec::parse("Hca2:timeout=").unwrap().value, "");
        for bad in ["noequals", "=v", "Hca3:=v", ":k=v", "a b=c"] {
            assert!(OptSpec::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
