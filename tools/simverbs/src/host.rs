//! The simulated host: its HCAs and their ports, each port one ibsim client.
//!
//! `SIMVERBS_HOST` names every port of the process's host:
//!
//! ```text
//! SIMVERBS_HOST=<ca>:<port>=<ibsim sockname>/<ibsim node>[,<ca>:<port>=<sockname>/<node>...]
//! SIMVERBS_HOST=ibsim0:1=fab-1/Hca3,ibsim0:2=fab-1/Hca5,ibsim1:1=fab-1-s2/Hca2
//! ```
//!
//! A CA is one verbs device and one umad CA of the same name; its ports are numbered 1..n in
//! the order given. Each port is the first port of one ibsim node, on the ibsim instance
//! (subnet) its sockname names, so two ports of one CA may sit on two subnets. Unset, the host
//! is `ibsim0:1=$IBSIM_SOCKNAME/$SIM_HOST` (sockname default `sim`), the one port a process
//! had under umad2sim.
//!
//! Everything a port carries goes through its one ibsim client ([`HostPort`]): the umad
//! agents of [`crate::umad`] (the ibacm core's SA agent), the GSI bridge of every UD QP on the
//! port ([`crate::gsi`]) and the port queries of the device layer (ibsim's control requests,
//! answered live). A reader thread per port takes what ibsim delivers and hands it to its
//! consumer:
//!
//! * a **response** by TID bits 32–47, the tag of the agent or QP that sent the request (we
//!   write it there; ibsim writes its client index into bits 48–63, as the kernel writes its
//!   agent's `hi_tid` into the upper half);
//! * an unsolicited **request** for the client's QPN ([`REPORT_QPN`]): the SA's Reports, for
//!   the QPs that subscribed through this port ([`crate::gsi`] explains the QPN mapping).
//!
//! So a port costs one of ibsim's 10 clients however many agents and QPs it has.

use crate::ibsim::{Client, SimRequest};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// The QPN the port's ibsim client is registered with: ibsim gives it every unsolicited MAD
/// (an SA Report) addressed to this QPN. Never handed to a QP (QPNs are below 0xFF_F000).
pub const REPORT_QPN: u32 = 0x00ff_fffe;

/// One port of the host, as the spec names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortSpec {
    /// CA (device) name, e.g. `ibsim0`.
    pub ca: String,
    /// Port number on the CA, 1-based.
    pub port: u8,
    /// The ibsim instance (`IBSIM_SOCKNAME`) the port is on.
    pub sock: String,
    /// The ibsim node whose first port this is.
    pub node: String,
}

/// Parses a `SIMVERBS_HOST` value. Ports of a CA must be numbered 1, 2, ... in order; a CA's
/// ports are contiguous; no (sockname, node) twice.
pub fn parse_spec(s: &str) -> Result<Vec<PortSpec>, String> {
    let mut out: Vec<PortSpec> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (at, to) = item
            .split_once('=')
            .ok_or_else(|| format!("'{item}': expected <ca>:<port>=<sockname>/<node>"))?;
        let (ca, port) = at
            .split_once(':')
            .ok_or_else(|| format!("'{at}': expected <ca>:<port>"))?;
        let (sock, node) = to
            .split_once('/')
            .ok_or_else(|| format!("'{to}': expected <sockname>/<node>"))?;
        let port: u8 = port
            .parse()
            .ok()
            .filter(|p| (1..crate::umad::MAX_PORTS as u8).contains(p))
            .ok_or_else(|| format!("'{item}': port '{port}' is not a number in 1..9"))?;
        if ca.is_empty() || ca.len() >= 20 || sock.is_empty() || node.is_empty() {
            return Err(format!(
                "'{item}': empty name (or a CA name of 20 characters or more)"
            ));
        }
        let prev = out.iter().rev().find(|p| p.ca == ca).map(|p| p.port);
        let want = prev.map_or(1, |p| p + 1);
        if port != want {
            return Err(format!(
                "'{item}': port {port} of {ca}, expected port {want}"
            ));
        }
        if prev.is_some() && out.last().is_some_and(|l| l.ca != ca) {
            return Err(format!(
                "'{item}': the ports of {ca} must be listed together"
            ));
        }
        if out.iter().any(|p| p.sock == sock && p.node == node) {
            return Err(format!(
                "'{item}': {sock}/{node} is already a port of this host"
            ));
        }
        out.push(PortSpec {
            ca: ca.to_string(),
            port,
            sock: sock.to_string(),
            node: node.to_string(),
        });
    }
    if out.is_empty() {
        return Err("no ports".into());
    }
    Ok(out)
}

/// The spec of this process: `SIMVERBS_HOST`, else the single port of `SIM_HOST`.
fn spec_from_env() -> Result<Vec<PortSpec>, String> {
    if let Ok(v) = std::env::var("SIMVERBS_HOST") {
        return parse_spec(&v).map_err(|e| format!("SIMVERBS_HOST: {e}"));
    }
    let node = std::env::var("SIM_HOST")
        .ok()
        .filter(|s| !s.is_empty())
        .ok_or("neither SIMVERBS_HOST nor SIM_HOST is set")?;
    Ok(vec![PortSpec {
        ca: "ibsim0".into(),
        port: 1,
        sock: crate::control::fabric_name(),
        node,
    }])
}

/// What arrives for a consumer of a port.
pub enum Consumer {
    /// A umad agent: the umad port's fd and the agent id.
    Agent { fd: i32, agent: u32 },
    /// The GSI bridge of a UD QP.
    Qp(Weak<crate::qp::QpInner>),
}

/// One port of the host and its ibsim client.
pub struct HostPort {
    pub spec: PortSpec,
    pub client: Client,
    /// The port's LID as last queried (the source LID of what it sends).
    lid: AtomicU16,
    /// Consumers by tag (TID bits 32–47); tag 0 is never used.
    consumers: Mutex<Vec<Option<Consumer>>>,
    /// QPs subscribed to SA Reports through this port, with their subscription counts.
    subscribers: Mutex<Vec<(Weak<crate::qp::QpInner>, u32)>>,
    stop: AtomicBool,
    reader: Mutex<Option<std::thread::JoinHandle<()>>>,
}

static PORTS: OnceLock<Vec<Arc<HostPort>>> = OnceLock::new();

/// The host's ports, connected on first use; ports whose client could not connect are left
/// out with the ports after them on the same CA (logged).
pub fn ports() -> &'static [Arc<HostPort>] {
    PORTS.get_or_init(|| {
        let spec = match spec_from_env() {
            Ok(s) => s,
            Err(e) => {
                crate::log(format_args!("no simulated host: {e}"));
                return Vec::new();
            }
        };
        let mut v: Vec<Arc<HostPort>> = Vec::new();
        let mut broken: Vec<String> = Vec::new();
        for p in spec {
            if broken.contains(&p.ca) {
                continue;
            }
            match Client::connect(&p.sock, &p.node, REPORT_QPN) {
                Ok(client) => {
                    let hp = Arc::new(HostPort {
                        spec: p,
                        lid: AtomicU16::new(0),
                        client,
                        consumers: Mutex::new(vec![None]),
                        subscribers: Mutex::new(Vec::new()),
                        stop: AtomicBool::new(false),
                        reader: Mutex::new(None),
                    });
                    let me = hp.clone();
                    match std::thread::Builder::new()
                        .name(format!("simverbs-{}-{}", hp.spec.ca, hp.spec.port))
                        .spawn(move || me.read_loop())
                    {
                        Ok(h) => {
                            if let Ok(mut r) = hp.reader.lock() {
                                *r = Some(h);
                            }
                            v.push(hp);
                        }
                        Err(e) => {
                            crate::log(format_args!(
                                "{} port {}: reader: {e}",
                                hp.spec.ca, hp.spec.port
                            ));
                            hp.client.disconnect();
                            broken.push(hp.spec.ca.clone());
                        }
                    }
                }
                Err(e) => {
                    crate::log(format_args!(
                        "{} port {} ({}/{}) left out: {e}",
                        p.ca, p.port, p.sock, p.node
                    ));
                    broken.push(p.ca);
                }
            }
        }
        register_exit();
        v
    })
}

/// Disconnects every client when the process exits, so ibsim frees the slots at once.
fn register_exit() {
    extern "C" fn at_exit() {
        if let Some(ports) = PORTS.get() {
            for p in ports.iter() {
                p.stop.store(true, Ordering::Release);
                p.client.disconnect();
            }
        }
    }
    // SAFETY: registers a plain function without arguments; it only takes the clients'
    // locks and sends datagrams, which is fine while the process exits.
    unsafe { libc::atexit(at_exit) };
}

/// The names of the host's CAs, in order.
pub fn ca_names() -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for p in ports() {
        if !v.contains(&p.spec.ca) {
            v.push(p.spec.ca.clone());
        }
    }
    v
}

/// The ports of CA `ca`, in port order.
pub fn ca_ports(ca: &str) -> Vec<&'static Arc<HostPort>> {
    ports().iter().filter(|p| p.spec.ca == ca).collect()
}

/// Port `port` of CA `ca`.
pub fn port(ca: &str, port: u8) -> Option<&'static Arc<HostPort>> {
    ports()
        .iter()
        .find(|p| p.spec.ca == ca && p.spec.port == port)
}

/// ibsim clients this process holds.
pub fn clients() -> usize {
    ports().len()
}

impl HostPort {
    /// The port's LID as last queried ([`HostPort::note_lid`]; queried now if never).
    pub fn cached_lid(&self) -> u16 {
        match self.lid.load(Ordering::Acquire) {
            0 => {
                let lid = self
                    .client
                    .port_info()
                    .map(|d| u16::from_be_bytes([d[16], d[17]]))
                    .unwrap_or(0);
                self.note_lid(lid);
                lid
            }
            lid => lid,
        }
    }

    /// Records the LID a port query found (the device monitor queries every port).
    pub fn note_lid(&self, lid: u16) {
        self.lid.store(lid, Ordering::Release);
    }

    /// Registers a consumer; its tag goes into TID bits 32–47 of what it sends.
    pub fn add_consumer(&self, c: Consumer) -> Option<u16> {
        let mut v = self.consumers.lock().ok()?;
        if let Some(i) = v.iter().skip(1).position(Option::is_none) {
            v[i + 1] = Some(c);
            return Some((i + 1) as u16);
        }
        if v.len() > 0xffff {
            return None;
        }
        v.push(Some(c));
        Some((v.len() - 1) as u16)
    }

    /// Forgets the consumer of `tag`.
    pub fn remove_consumer(&self, tag: u16) {
        if let Ok(mut v) = self.consumers.lock() {
            if let Some(slot) = v.get_mut(usize::from(tag)) {
                *slot = None;
            }
        }
    }

    /// Counts a subscription (+1) or an unsubscription (-1) of `qp` to SA Reports.
    pub fn subscribe(&self, qp: &Arc<crate::qp::QpInner>, on: bool) {
        let Ok(mut v) = self.subscribers.lock() else {
            return;
        };
        v.retain(|(w, n)| w.strong_count() > 0 && *n > 0);
        match v
            .iter_mut()
            .find(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(qp)))
        {
            Some((_, n)) if on => *n += 1,
            Some((_, n)) => *n = n.saturating_sub(1),
            None if on => v.push((Arc::downgrade(qp), 1)),
            None => {}
        }
    }

    /// Hands a MAD to ibsim (see [`Client::send`]).
    pub fn send(&self, dlid: u16, slid: u16, dqp: u32, sqp: u32, mad: &[u8]) -> bool {
        self.client.send(dlid, slid, dqp, sqp, mad)
    }

    fn read_loop(self: Arc<Self>) {
        let mut buf = [0u8; 1024];
        loop {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let n = match self.client.data.recv(&mut buf) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::Interrupted
                            | std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(_) => return,
            };
            let Some(r) = crate::ibsim::decode_request(&buf[..n]) else {
                crate::debug(format_args!(
                    "{} port {}: {n}-byte datagram from ibsim ignored",
                    self.spec.ca, self.spec.port
                ));
                continue;
            };
            crate::guard((), || self.arrived(r));
        }
    }

    /// One datagram from ibsim, to its consumer.
    fn arrived(&self, r: SimRequest) {
        let response = r.mad[3] & 0x80 != 0;
        if response || r.status != 0 {
            // Ours, answered (or returned undeliverable): the tag says whose.
            let tag = ((u64::from_be_bytes(r.mad[8..16].try_into().unwrap_or_default()) >> 32)
                & 0xffff) as u16;
            let target = self.consumers.lock().ok().and_then(|v| {
                v.get(usize::from(tag)).and_then(|c| match c {
                    Some(Consumer::Agent { fd, agent }) => Some((Some((*fd, *agent)), None)),
                    Some(Consumer::Qp(w)) => Some((None, w.upgrade())),
                    None => None,
                })
            });
            match target {
                Some((Some((fd, agent)), _)) => crate::umad::deliver(fd, agent, &r),
                Some((None, Some(qp))) => crate::gsi::arrived(&qp, self, r),
                _ => crate::debug(format_args!(
                    "{} port {}: MAD with tag {tag} for nobody (gone) dropped",
                    self.spec.ca, self.spec.port
                )),
            }
            return;
        }
        if r.dqp & 0x00ff_ffff == REPORT_QPN {
            let subs: Vec<Arc<crate::qp::QpInner>> = self
                .subscribers
                .lock()
                .map(|v| {
                    v.iter()
                        .filter(|(_, n)| *n > 0)
                        .filter_map(|(w, _)| w.upgrade())
                        .collect()
                })
                .unwrap_or_default();
            if subs.is_empty() {
                crate::debug(format_args!(
                    "{} port {}: Report with no subscriber dropped",
                    self.spec.ca, self.spec.port
                ));
            }
            for q in subs {
                crate::gsi::arrived(&q, self, r.clone());
            }
            return;
        }
        crate::debug(format_args!(
            "{} port {}: unsolicited MAD for QP {:#x} dropped",
            self.spec.ca, self.spec.port, r.dqp
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        let s = parse_spec("ibsim0:1=f/Hca3,ibsim0:2=f/Hca5,ibsim1:1=g/Hca2").expect("ok");
        assert_eq!(s.len(), 3);
        assert_eq!(
            s[2],
            PortSpec {
                ca: "ibsim1".into(),
                port: 1,
                sock: "g".into(),
                node: "Hca2".into()
            }
        );
        assert_eq!(
            (s[1].ca.as_str(), s[1].port, s[1].node.as_str()),
            ("ibsim0", 2, "Hca5")
        );
        for (bad, why) in [
            ("", "no ports"),
            ("ibsim0:2=f/Hca3", "expected port 1"),
            ("ibsim0:1=f/Hca3,ibsim0:3=f/Hca4", "expected port 2"),
            (
                "ibsim0:1=f/Hca3,ibsim1:1=f/Hca4,ibsim0:2=f/Hca5",
                "listed together",
            ),
            ("ibsim0:1=f/Hca3,ibsim1:1=f/Hca3", "already a port"),
            ("ibsim0:x=f/Hca3", "not a number"),
            ("ibsim0:1=fHca3", "<sockname>/<node>"),
            ("ibsim0=f/Hca3", "<ca>:<port>"),
            ("ibsim0:1", "expected <ca>:<port>="),
            ("ibsim0:10=f/Hca3", "not a number in 1..9"),
        ] {
            let e = parse_spec(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
        // Same node on two subnets is two ports.
        assert!(parse_spec("ibsim0:1=f/Hca3,ibsim0:2=g/Hca3").is_ok());
    }
}
