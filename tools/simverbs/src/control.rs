//! The per-process control socket: `@simverbs/<fabric>/<node>/ctl`.
//!
//! An abstract unix datagram socket named after the host's first port (its ibsim sockname and
//! node: `IBSIM_SOCKNAME` and `SIM_HOST` of a one-port host) bound when the first context is
//! opened. Each datagram is
//! one text command; if the sender bound an address it gets one reply datagram, `ok ...` or
//! `err <reason>`. Commands:
//!
//! * `event <name> [port [ca]]`: queue an async event on every open context (of CA `ca`
//!   only, when given). Names: `port_active`, `port_err`, `lid_change`, `pkey_change`,
//!   `sm_change`, `client_reregister`, `gid_change`. Port defaults to 1.
//! * `set <knob> <value>`: transport knobs (`loss`, `dup`, `reorder` as probabilities 0..1,
//!   `delay_ms` as milliseconds), same meaning as the `SIMVERBS_*` environment variables.
//! * `get`: reply `ok loss=.. dup=.. reorder=.. delay_ms=..`.
//! * `ping`: reply `ok pong <pid>`.
//! * `counters <qpn>`: reply `ok qpn=<qpn> <name>=<value> ...`, the receive-drop and GSI
//!   bridge counters of that QP (see `qp::QpCounters`), plus `gsi_clients=<n>`, the ibsim
//!   clients this process holds (one per port of the host, whatever its QPs and agents).

use crate::device::{for_each_context, EventElement, SimDevice};
use rdma_sys::ibv_event_type;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::OnceLock;

/// The fabric name used in socket and directory names (`IBSIM_SOCKNAME`, default `sim`).
pub fn fabric_name() -> String {
    std::env::var("IBSIM_SOCKNAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "sim".to_string())
}

/// The abstract control socket name for `node` on `fabric` (without the leading NUL).
pub fn ctl_name(fabric: &str, node: &str) -> String {
    format!("simverbs/{fabric}/{node}/ctl")
}

/// Starts the control thread once per process (later calls do nothing).
pub fn ensure_started(dev: &SimDevice) {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let name = match crate::host::ports().first() {
            Some(p) => ctl_name(&p.spec.sock, &p.spec.node),
            None => ctl_name(&fabric_name(), &dev.ca.name),
        };
        let sock = match bind_abstract(&name) {
            Ok(s) => s,
            Err(e) => {
                crate::log(format_args!("control socket @{name} not bound: {e}"));
                return;
            }
        };
        crate::debug(format_args!("control socket @{name}"));
        let _ = std::thread::Builder::new()
            .name("simverbs-ctl".into())
            .spawn(move || serve(sock));
    });
}

/// Binds an abstract unix datagram socket.
pub fn bind_abstract(name: &str) -> std::io::Result<UnixDatagram> {
    use std::os::linux::net::SocketAddrExt;
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    UnixDatagram::bind_addr(&addr)
}

fn serve(sock: UnixDatagram) {
    let mut buf = [0u8; 512];
    loop {
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        let cmd = String::from_utf8_lossy(&buf[..n]).to_string();
        let reply = crate::guard("err internal error".to_string(), || handle(cmd.trim()));
        crate::debug(format_args!("ctl '{}' -> '{}'", cmd.trim(), reply));
        use std::os::linux::net::SocketAddrExt;
        if let Some(name) = from.as_abstract_name() {
            if let Ok(a) = SocketAddr::from_abstract_name(name) {
                let _ = sock.send_to_addr(reply.as_bytes(), &a);
            }
        } else if let Some(p) = from.as_pathname() {
            let _ = sock.send_to(reply.as_bytes(), p);
        }
    }
}

/// Maps an event name of the control protocol to the verbs event type.
pub fn event_by_name(name: &str) -> Option<ibv_event_type> {
    Some(match name {
        "port_active" => ibv_event_type::IBV_EVENT_PORT_ACTIVE,
        "port_err" => ibv_event_type::IBV_EVENT_PORT_ERR,
        "lid_change" => ibv_event_type::IBV_EVENT_LID_CHANGE,
        "pkey_change" => ibv_event_type::IBV_EVENT_PKEY_CHANGE,
        "sm_change" => ibv_event_type::IBV_EVENT_SM_CHANGE,
        "client_reregister" => ibv_event_type::IBV_EVENT_CLIENT_REREGISTER,
        "gid_change" => ibv_event_type::IBV_EVENT_GID_CHANGE,
        _ => return None,
    })
}

/// Executes one control command and returns the reply text.
pub fn handle(cmd: &str) -> String {
    let words: Vec<&str> = cmd.split_whitespace().collect();
    match words.as_slice() {
        ["ping"] => format!("ok pong {}", std::process::id()),
        ["event", name, rest @ ..] => {
            let Some(kind) = event_by_name(name) else {
                return format!("err unknown event '{name}'");
            };
            let (port, ca) = match rest {
                [] => (1u8, None),
                [p] | [p, _] => match p.parse::<u8>() {
                    Ok(n) if n >= 1 => (n, rest.get(1).copied()),
                    _ => return format!("err bad port '{p}'"),
                },
                _ => return "err usage: event <name> [port [ca]]".into(),
            };
            let mut n = 0;
            for_each_context(|c| {
                if c.port(port).is_some() && ca.is_none_or(|ca| c.device.ca.name == ca) {
                    c.post_event(kind, EventElement::Port(port));
                    n += 1;
                }
            });
            format!("ok {n} context(s)")
        }
        ["set", knob, value] => match crate::transport::set_knob(knob, value) {
            Ok(()) => "ok".into(),
            Err(e) => format!("err {e}"),
        },
        ["get"] => format!("ok {}", crate::transport::knobs()),
        ["counters", qpn] => {
            let n = match qpn.strip_prefix("0x") {
                Some(h) => u32::from_str_radix(h, 16),
                None => qpn.parse::<u32>(),
            };
            let Ok(n) = n else {
                return format!("err bad qpn '{qpn}'");
            };
            match crate::qp::describe_counters(n) {
                Some(c) => format!("ok qpn={n} {c} gsi_clients={}", crate::host::clients()),
                None => format!("err no QP {n}"),
            }
        }
        _ => format!("err unknown command '{cmd}'"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_validated() {
        assert!(handle("ping").starts_with("ok pong"));
        assert_eq!(handle("event client_reregister"), "ok 0 context(s)");
        assert!(handle("event nonsense").starts_with("err unknown event"));
        assert!(handle("event port_err 0").starts_with("err bad port"));
        assert!(handle("event port_err x").starts_with("err bad port"));
        assert_eq!(handle("event port_err 2 ibsim1"), "ok 0 context(s)");
        assert!(handle("event port_err 2 ibsim1 x").starts_with("err usage"));
        assert!(handle("set loss banana").starts_with("err"));
        assert!(handle("").starts_with("err unknown command"));
        assert!(handle("counters x").starts_with("err bad qpn"));
        assert!(handle("counters 0x12").starts_with("err no QP"));
        assert_eq!(
            event_by_name("sm_change"),
            Some(ibv_event_type::IBV_EVENT_SM_CHANGE)
        );
    }
}
