//! Several commands on one fabric bring-up: the `acm-fabric script` file format, its parser
//! and its runner.
//!
//! One step per line; blank lines and lines starting with `#` are ignored:
//!
//! ```text
//! # NODE[:] IB_ACME_ARGS...        ib_acme against NODE's daemon (`-S 127.0.0.1` is added)
//! Hca3: -f n -s hca3 -d hca4 -v
//! Hca3 -f l -s {Hca3.lid} -d {Hca4.lid} -v
//! port-down Hca3                   # ibsim unlinks Hca3's port 1 (see Fabric::port_down)
//! port-up Hca3                     # relink and wait until the SM made it ACTIVE again
//! sleep 0.5                        # seconds
//! refused Hca4: -f n -s hca4 -d hca3-8001    # must FAIL: run once, passes if ib_acme
//!                                  # exits non-zero with no path (a non-member, say)
//! ```
//!
//! Arguments are split on whitespace; `'...'` and `"..."` quote (no escapes). Placeholders
//! `{NODE.lid}`, `{NODE.gid}`, `{NODE.name}`, `{NODE.ipv4}`, `{NODE.ipv6}` are replaced by
//! that daemon node's values when the step runs (so a LID read after a change is current);
//! `{NODE.name@8001}` (also `ipv4@`, `ipv6@`) is the node's address in partition 0x8001 (four
//! hex digits); on a host of several ports ([`crate::FabricBuilder::host`]) `{NODE.lid@2}` is
//! the value of its second port (one or two digits: the port's place in the host spec) and
//! `{NODE.gid@ibsim1:1}` of port 1 of CA ibsim1. `port-down NODE@2` / `port-up NODE@ibsim0:2`
//! take a daemon host's port down and up ([`Fabric::port_down_at`]); `{Hca3.name@2@8001}` is that
//! port's address in partition 0x8001.

use crate::{Error, Fabric, Output, Result};
use std::io::Write;
use std::time::{Duration, Instant};

/// One step of a script.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// `ib_acme ARGS` against the daemon on `node`.
    Acme {
        /// Daemon node.
        node: String,
        /// ib_acme arguments, placeholders not yet expanded.
        args: Vec<String>,
        /// `refused`: the step passes when ib_acme fails (run once, never retried).
        refused: bool,
    },
    /// [`Fabric::port_down`] on an HCA.
    PortDown(String),
    /// [`Fabric::port_up`] on an HCA.
    PortUp(String),
    /// A pause.
    Sleep(Duration),
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Acme {
                node,
                args,
                refused,
            } => write!(
                f,
                "{}[{node}] ib_acme {}",
                if *refused { "refused " } else { "" },
                args.join(" ")
            ),
            Step::PortDown(n) => write!(f, "port-down {n}"),
            Step::PortUp(n) => write!(f, "port-up {n}"),
            Step::Sleep(d) => write!(f, "sleep {}", d.as_secs_f64()),
        }
    }
}

/// Splits a line into words: whitespace separates, `'...'` and `"..."` group.
pub fn split_words(line: &str) -> std::result::Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if let Some(q) = quote {
        return Err(format!("unterminated {q} quote"));
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// Parses one step (a script line, or a `--cmd` value); `None` for blank and comment lines.
/// `daemons` are the nodes running ibacm, `hcas` every HCA of the topology.
pub fn parse_step(
    line: &str,
    daemons: &[String],
    hcas: &[String],
) -> std::result::Result<Option<Step>, String> {
    let t = line.trim();
    if t.is_empty() || t.starts_with('#') {
        return Ok(None);
    }
    let mut words = split_words(t)?;
    let refused = words.first().is_some_and(|w| w == "refused");
    if refused {
        words.remove(0);
    }
    let (first, rest) = words.split_first().ok_or("empty line")?;
    if refused && matches!(first.as_str(), "port-down" | "port-up" | "sleep") {
        return Err(format!("refused applies to ib_acme steps, not {first}"));
    }
    let hca = |w: Option<&String>| -> std::result::Result<String, String> {
        let n = w.ok_or(format!("{first} needs an HCA name"))?;
        if rest.len() != 1 {
            return Err(format!("{first} takes exactly one HCA name"));
        }
        if let Some((node, port)) = n.split_once('@') {
            if !daemons.iter().any(|d| d == node) {
                return Err(format!("{node:?} in {n:?} is not a daemon node"));
            }
            port_ref(port)?;
            return Ok(n.clone());
        }
        if !hcas.contains(n) {
            return Err(format!("{n:?} is not an HCA of the topology"));
        }
        Ok(n.clone())
    };
    match first.as_str() {
        "port-down" => Ok(Some(Step::PortDown(hca(rest.first())?))),
        "port-up" => Ok(Some(Step::PortUp(hca(rest.first())?))),
        "sleep" => {
            let secs: f64 = match rest {
                [s] => s
                    .parse()
                    .map_err(|_| format!("sleep wants seconds, got {s:?}"))?,
                _ => return Err("sleep takes one number of seconds".into()),
            };
            if !(0.0..=600.0).contains(&secs) {
                return Err(format!("sleep {secs}: 0..=600 seconds"));
            }
            Ok(Some(Step::Sleep(Duration::from_secs_f64(secs))))
        }
        node => {
            let node = node.strip_suffix(':').unwrap_or(node);
            if !daemons.iter().any(|d| d == node) {
                return Err(format!(
                    "{node:?} is neither a daemon node ({}) nor port-down/port-up/sleep",
                    daemons.join(", ")
                ));
            }
            if rest.is_empty() {
                return Err(format!("no ib_acme arguments for {node}"));
            }
            Ok(Some(Step::Acme {
                node: node.to_string(),
                args: rest.to_vec(),
                refused,
            }))
        }
    }
}

/// A port of a host in a script: its place in the host spec (`2`) or `ibsimN:P`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortRefArg {
    Index(usize),
    CaPort(String, u8),
}

/// Parses the part after `@` naming a port (`2`, `ibsim1:1`).
pub fn port_ref(s: &str) -> std::result::Result<PortRefArg, String> {
    if let Some((ca, p)) = s.split_once(':') {
        let port = p
            .parse::<u8>()
            .ok()
            .filter(|p| *p >= 1)
            .ok_or(format!("{s:?}: port {p:?} is not a number from 1"))?;
        if !ca.starts_with("ibsim") {
            return Err(format!("{s:?}: the CA is ibsimN"));
        }
        return Ok(PortRefArg::CaPort(ca.to_string(), port));
    }
    if (1..=2).contains(&s.len()) {
        if let Some(i) = s.parse::<usize>().ok().filter(|i| *i >= 1) {
            return Ok(PortRefArg::Index(i));
        }
    }
    Err(format!("{s:?} is no port (2, ibsim0:2)"))
}

/// The port `r` of daemon node `node`.
fn host_port<'a>(fabric: &'a Fabric, node: &str, r: &PortRefArg) -> Result<&'a crate::HostPort> {
    let n = fabric.node(node)?;
    match r {
        PortRefArg::Index(i) => n.port_at(*i),
        PortRefArg::CaPort(ca, p) => n.port_of(ca, *p),
    }
}

/// `NODE@PORT` of a port-down/port-up step: the node and the port's place in its host.
fn step_port(fabric: &Fabric, arg: &str) -> Result<Option<(String, usize)>> {
    let Some((node, r)) = arg.split_once('@') else {
        return Ok(None);
    };
    let r = port_ref(r).map_err(Error::new)?;
    Ok(Some((node.to_string(), host_port(fabric, node, &r)?.index)))
}

/// Parses a whole script; errors name the line.
pub fn parse_script(text: &str, daemons: &[String], hcas: &[String]) -> Result<Vec<Step>> {
    let mut steps = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match parse_step(line, daemons, hcas) {
            Ok(Some(s)) => steps.push(s),
            Ok(None) => {}
            Err(e) => return Err(Error::new(format!("line {}: {e}: {line:?}", i + 1))),
        }
    }
    Ok(steps)
}

/// Replaces `{NODE.lid|gid|name|ipv4|ipv6}` with the fabric's current values; `name`, `ipv4`
/// and `ipv6` take a partition as `{NODE.name@8001}` (the node's address in that partition).
pub fn expand(arg: &str, fabric: &Fabric) -> Result<String> {
    let mut out = String::new();
    let mut rest = arg;
    while let Some(open) = rest.find('{') {
        let close = rest[open..]
            .find('}')
            .map(|c| open + c)
            .ok_or_else(|| Error::new(format!("unclosed {{ in {arg:?}")))?;
        out.push_str(&rest[..open]);
        let key = &rest[open + 1..close];
        let (node, field) = key
            .split_once('.')
            .ok_or_else(|| Error::new(format!("placeholder {{{key}}} is not {{NODE.field}}")))?;
        // `field`, `field@PORT`, `field@PKEY` or `field@PORT@PKEY`; no port is port 1 (the
        // node's own addresses).
        let mut parts = field.split('@');
        let f = parts.next().unwrap_or_default();
        let (r, pkey) = match (parts.next(), parts.next()) {
            (None, _) => (PortRefArg::Index(1), None),
            (Some(p), None) => match port_ref(p) {
                Ok(r) => (r, None),
                Err(_) => (PortRefArg::Index(1), Some(p)),
            },
            (Some(p), Some(k)) => (port_ref(p).map_err(Error::new)?, Some(k)),
        };
        let hp = host_port(fabric, node, &r)?;
        let part = match pkey {
            None => None,
            Some(k) => {
                let pkey = u16::from_str_radix(k.trim_start_matches("0x"), 16)
                    .map_err(|_| Error::new(format!("placeholder {{{key}}}: {k:?} is no P_Key")))?;
                Some(
                    hp.partitions
                        .iter()
                        .find(|a| a.pkey & 0x7fff == pkey & 0x7fff)
                        .ok_or_else(|| {
                            Error::new(format!(
                                "placeholder {{{key}}}: {node} is not in partition {k} there"
                            ))
                        })?,
                )
            }
        };
        out.push_str(&match (f, part) {
            ("lid", None) => hp.lid.to_string(),
            ("gid", None) => hp.gid.to_string(),
            ("name", None) => hp.name.clone(),
            ("ipv4", None) => hp.ipv4.to_string(),
            ("ipv6", None) => hp.ipv6.to_string(),
            ("name", Some(a)) => a.name.clone(),
            ("ipv4", Some(a)) => a.ipv4.to_string(),
            ("ipv6", Some(a)) => a.ipv6.to_string(),
            _ => {
                return Err(Error::new(format!(
                    "placeholder {{{key}}}: field must be lid, gid, name, ipv4 or ipv6"
                )))
            }
        });
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Runs every step in order (all of them, also after a failure), printing each command and
/// its output to `out`. An `ib_acme` step is repeated for up to `retry` while it exits non-zero
/// (0: run once). Returns the number of failed steps.
pub fn run_script(
    fabric: &mut Fabric,
    steps: &[Step],
    retry: Duration,
    out: &mut dyn Write,
) -> Result<usize> {
    let mut failed = 0;
    let io = |e: std::io::Error| Error::new(format!("cannot write output: {e}"));
    for (i, step) in steps.iter().enumerate() {
        // The ib_acme output, and whether the step wants it to fail.
        let res: Result<Option<(Output, bool)>> = match step {
            Step::Acme {
                node,
                args,
                refused,
            } => {
                let args = args
                    .iter()
                    .map(|a| expand(a, fabric))
                    .collect::<Result<Vec<_>>>();
                match args {
                    Ok(args) => {
                        let tag = if *refused { " (must be refused)" } else { "" };
                        writeln!(out, "$ [{node}] ib_acme {}{tag}", args.join(" ")).map_err(io)?;
                        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
                        let n = fabric.node(node)?;
                        let t0 = Instant::now();
                        loop {
                            let o = n.acme(&argv)?;
                            if *refused {
                                break Ok(Some((o, true)));
                            }
                            if o.success() || t0.elapsed() >= retry {
                                break Ok(Some((o, false)));
                            }
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    }
                    Err(e) => {
                        writeln!(out, "$ {step}").map_err(io)?;
                        Err(e)
                    }
                }
            }
            Step::PortDown(h) => {
                writeln!(out, "$ port-down {h}").map_err(io)?;
                match step_port(fabric, h) {
                    Ok(Some((n, i))) => fabric.port_down_at(&n, i).map(|()| None),
                    Ok(None) => fabric.port_down(h).map(|()| None),
                    Err(e) => Err(e),
                }
            }
            Step::PortUp(h) => {
                writeln!(out, "$ port-up {h}").map_err(io)?;
                let r = match step_port(fabric, h) {
                    Ok(Some((n, i))) => fabric.port_up_at(&n, i),
                    Ok(None) => fabric.port_up(h),
                    Err(e) => Err(e),
                };
                let what = if h.contains('@') {
                    h.clone()
                } else {
                    format!("{h} port 1")
                };
                r.map(|pi| {
                    let _ = writeln!(out, "{what}: {} lid {}", pi.state, pi.lid);
                    None
                })
            }
            Step::Sleep(d) => {
                writeln!(out, "$ sleep {}", d.as_secs_f64()).map_err(io)?;
                std::thread::sleep(*d);
                Ok(None)
            }
        };
        let ok = match res {
            Ok(None) => true,
            Ok(Some((o, refused))) => {
                write!(out, "{}", o.stdout).map_err(io)?;
                if !o.stderr.is_empty() {
                    write!(out, "{}", o.stderr).map_err(io)?;
                }
                if refused {
                    let ok = !o.success() && !o.stdout.contains("Path information");
                    if ok {
                        writeln!(out, "(refused, as it must be)").map_err(io)?;
                    }
                    ok
                } else {
                    o.success()
                }
            }
            Err(e) => {
                writeln!(out, "error: {e}").map_err(io)?;
                false
            }
        };
        if !ok {
            failed += 1;
            writeln!(out, "^^^ step {} FAILED", i + 1).map_err(io)?;
        }
        out.flush().map_err(io)?;
    }
    Ok(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ports_of_a_host_in_steps_and_placeholders() {
        assert_eq!(port_ref("2"), Ok(PortRefArg::Index(2)));
        assert_eq!(
            port_ref("ibsim1:1"),
            Ok(PortRefArg::CaPort("ibsim1".into(), 1))
        );
        for bad in ["0", "123", "8001", "x", "ibsim0:0", "mlx5_0:1", "ibsim0:x"] {
            assert!(port_ref(bad).is_err(), "{bad}");
        }
        let d = names(&["Hca3"]);
        let h = names(&["Hca1", "Hca3", "Hca7"]);
        assert_eq!(
            parse_step("port-down Hca3@2", &d, &h),
            Ok(Some(Step::PortDown("Hca3@2".into())))
        );
        assert!(parse_step("port-up Hca3@ibsim0:2", &d, &h)
            .unwrap()
            .is_some());
        assert!(
            parse_step("port-down Hca7@2", &d, &h).is_err(),
            "not a daemon"
        );
        assert!(parse_step("port-down Hca3@x", &d, &h).is_err());
    }

    #[test]
    fn words_and_quotes() {
        assert_eq!(
            split_words(" -f n  -s 'a b' -d \"c\"d ").unwrap(),
            names(&["-f", "n", "-s", "a b", "-d", "cd"])
        );
        assert_eq!(split_words("''").unwrap(), names(&[""]));
        assert!(split_words("-s 'open").is_err());
    }

    #[test]
    fn steps_parse_with_line_numbers_in_errors() {
        let d = names(&["Hca3", "Hca4"]);
        let h = names(&["Hca1", "Hca2", "Hca3", "Hca4"]);
        let s = parse_script(
            "# comment\n\nHca3: -f l -s {Hca3.lid} -d {Hca4.lid} -v\nHca4 -e\nport-down Hca2\nport-up Hca2\nsleep 0.25\nrefused Hca4: -f n -s a -d b\n",
            &d,
            &h,
        )
        .unwrap();
        assert_eq!(
            s,
            vec![
                Step::Acme {
                    node: "Hca3".into(),
                    args: names(&["-f", "l", "-s", "{Hca3.lid}", "-d", "{Hca4.lid}", "-v"]),
                    refused: false,
                },
                Step::Acme {
                    node: "Hca4".into(),
                    args: names(&["-e"]),
                    refused: false,
                },
                Step::PortDown("Hca2".into()),
                Step::PortUp("Hca2".into()),
                Step::Sleep(Duration::from_millis(250)),
                Step::Acme {
                    node: "Hca4".into(),
                    args: names(&["-f", "n", "-s", "a", "-d", "b"]),
                    refused: true,
                },
            ]
        );
        for (bad, why) in [
            ("Hca3 -e\nHca2 -e", "line 2"),
            ("Hca3:", "no ib_acme arguments"),
            ("port-down Hca9", "not an HCA"),
            ("port-up", "needs an HCA"),
            ("port-up Hca3 Hca4", "exactly one"),
            ("sleep x", "seconds"),
            ("sleep 1e9", "0..=600"),
            ("Hca3 -s 'x", "unterminated"),
            ("refused sleep 1", "ib_acme steps"),
            ("refused", "empty line"),
        ] {
            let e = parse_script(bad, &d, &h).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
