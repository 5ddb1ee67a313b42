//! ibsim's client protocol: one client is one port of a simulated node.
//!
//! Wire facts (ibsim 0.10, `include/ibsim.h`, `umad2sim/sim_client.c`, `ibsim/ibsim.c`):
//! every abstract name ends in a NUL byte (`make_name` counts the terminator);
//! control datagrams are `struct sim_ctl` (80 bytes, host order) on `@<sock>:ctl`, answered to
//! the sender's bound address; data datagrams are `struct sim_request` (288 bytes: DLID and
//! SLID as `htons` values in 32-bit fields, QPNs `htonl`, status `htonl`, length `htobe64`,
//! the MAD at offset 32) from our `@<sock>:in<id>` to ibsim's `@<sock>:out<client>`.
//!
//! What ibsim does with a client's MADs: it answers SMPs to the client's own node itself and
//! routes everything else by LID through the topology; it rewrites TID bits 48–63 of every
//! request with the client's index, and gives a response to the client those bits name. A
//! request for QP > 1 goes to the client of the destination port whose `qp` is that QPN (set
//! once, at connect). A MAD nobody takes (no route, nobody on the destination QP) comes back
//! to the sender with status 110. At most [`MAX_CLIENTS`] clients per ibsim instance.
//!
//! ibsim attaches a client to the *first* port of its node (`sim_ctl_new_client`), so a client
//! is one port of one node: a host with several ports is several clients ([`crate::host`]).

use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Mutex;
use std::time::Duration;

/// The only datagram size a GSI or SMI accepts: one MAD.
pub const MAD_SIZE: usize = 256;
/// `IBSIM_MAX_CLIENTS`: clients one ibsim instance serves.
pub const MAX_CLIENTS: u32 = 10;
/// ibsim's status for a MAD it could not deliver (ETIMEDOUT).
pub const STATUS_UNDELIVERED: u32 = 110;

const SIM_MAGIC: u32 = 0xdead_beef;
const SIM_CTL_ERROR: u32 = 0;
const SIM_CTL_CONNECT: u32 = 1;
const SIM_CTL_DISCONNECT: u32 = 2;
const SIM_CTL_GET_NODEINFO: u32 = 7;
const SIM_CTL_GET_PORTINFO: u32 = 8;
const SIM_CTL_GET_PKEYS: u32 = 10;
const CTL_LEN: usize = 80;
const CTL_DATA: usize = 64;
const REQ_LEN: usize = 288;
const MAD_OFF: usize = 32;
/// First ibsim client "pid" tried; umad2sim uses the real PID, we stay above any PID.
const ID_BASE: u32 = 1_000_000_000;

/// ibsim's abstract addresses include the C string's terminating NUL (`make_name` counts it):
/// `@sim:ctl` is really the 8 bytes `sim:ctl\0` after the leading NUL.
fn abstract_addr(name: &str) -> std::io::Result<SocketAddr> {
    let mut b = name.as_bytes().to_vec();
    b.push(0);
    SocketAddr::from_abstract_name(&b)
}

/// Encodes a `struct sim_ctl`.
fn ctl_msg(clientid: u32, kind: u32, data: &[u8]) -> [u8; CTL_LEN] {
    let mut b = [0u8; CTL_LEN];
    b[0..4].copy_from_slice(&SIM_MAGIC.to_ne_bytes());
    b[4..8].copy_from_slice(&clientid.to_ne_bytes());
    b[8..12].copy_from_slice(&kind.to_ne_bytes());
    b[12..16].copy_from_slice(&(data.len() as u32).to_ne_bytes());
    let n = data.len().min(CTL_DATA);
    b[16..16 + n].copy_from_slice(&data[..n]);
    b
}

/// Encodes a `struct sim_client_info` for SIM_CTL_CONNECT.
fn client_info(id: u32, qp: u32, nodeid: &str) -> [u8; 44] {
    let mut b = [0u8; 44];
    b[0..4].copy_from_slice(&id.to_ne_bytes());
    b[4..8].copy_from_slice(&qp.to_ne_bytes());
    // issm = 0: we never take QP0/QP1 requests of our node.
    let n = nodeid.len().min(31);
    b[12..12 + n].copy_from_slice(&nodeid.as_bytes()[..n]);
    b
}

/// Encodes a `struct sim_request` carrying `mad` from (`slid`, `sqp`) to (`dlid`, `dqp`).
pub fn encode_request(dlid: u16, slid: u16, dqp: u32, sqp: u32, mad: &[u8]) -> [u8; REQ_LEN] {
    let mut b = [0u8; REQ_LEN];
    // ibsim reads the LIDs with ntohs() of the 32-bit field: the htons value, host order.
    b[0..4].copy_from_slice(&u32::from(dlid.to_be()).to_ne_bytes());
    b[4..8].copy_from_slice(&u32::from(slid.to_be()).to_ne_bytes());
    b[8..12].copy_from_slice(&dqp.to_be_bytes());
    b[12..16].copy_from_slice(&sqp.to_be_bytes());
    // status 0, padding
    let n = mad.len().min(MAD_SIZE);
    b[24..32].copy_from_slice(&(n as u64).to_be_bytes());
    b[MAD_OFF..MAD_OFF + n].copy_from_slice(&mad[..n]);
    b
}

/// A decoded `struct sim_request`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimRequest {
    pub dlid: u16,
    pub slid: u16,
    pub dqp: u32,
    pub sqp: u32,
    pub status: u32,
    pub mad: [u8; MAD_SIZE],
}

/// Decodes a `struct sim_request`; `None` unless it is exactly 288 bytes.
pub fn decode_request(b: &[u8]) -> Option<SimRequest> {
    if b.len() != REQ_LEN {
        return None;
    }
    let ne32 = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let be32 = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let mut mad = [0u8; MAD_SIZE];
    mad.copy_from_slice(&b[MAD_OFF..MAD_OFF + MAD_SIZE]);
    Some(SimRequest {
        dlid: u16::from_be(ne32(0) as u16),
        slid: u16::from_be(ne32(4) as u16),
        dqp: be32(8),
        sqp: be32(12),
        status: be32(16),
        mad,
    })
}

/// Binds `@<sock>:ctl<id>` and `@<sock>:in<id>` for the first free id from [`ID_BASE`].
fn bind_pair(sock: &str, hint: u32) -> std::io::Result<(u32, UnixDatagram, UnixDatagram)> {
    let mut last = std::io::Error::from_raw_os_error(libc::EADDRINUSE);
    for k in 0..64u32 {
        let id = ID_BASE + (hint & 0x00ff_ffff) + k * 0x0100_0000; // < i32::MAX for k < 64
        let ctl = match UnixDatagram::bind_addr(&abstract_addr(&format!("{sock}:ctl{id}"))?) {
            Ok(s) => s,
            Err(e) => {
                last = e;
                continue;
            }
        };
        let data = match UnixDatagram::bind_addr(&abstract_addr(&format!("{sock}:in{id}"))?) {
            Ok(s) => s,
            Err(e) => {
                last = e;
                continue;
            }
        };
        return Ok((id, ctl, data));
    }
    Err(last)
}

/// One ibsim client: the port of node `node` on the ibsim instance `sock`.
pub struct Client {
    /// ibsim's client index (0..10), as in TID bits 48–63.
    pub index: u32,
    /// The "pid" we connected with (names `@<sock>:in<id>` and `@<sock>:ctl<id>`).
    pub id: u32,
    /// The ibsim instance (`IBSIM_SOCKNAME`).
    pub sock: String,
    /// The node we are attached to.
    pub node: String,
    /// The QPN ibsim delivers unsolicited MADs for (`sim_client_info.qp`).
    pub qp: u32,
    /// Control socket; the lock spans request and answer.
    ctl: Mutex<UnixDatagram>,
    /// Data socket, connected to ibsim's `out<index>`.
    pub data: UnixDatagram,
}

impl Client {
    /// Connects a client at `node` on ibsim instance `sock`, taking unsolicited MADs for `qp`.
    pub fn connect(sock: &str, node: &str, qp: u32) -> Result<Client, String> {
        let hint = std::process::id().wrapping_mul(31).wrapping_add(qp);
        let (id, ctl, data) = bind_pair(sock, hint).map_err(|e| format!("bind: {e}"))?;
        let server = abstract_addr(&format!("{sock}:ctl")).map_err(|e| e.to_string())?;
        ctl.connect_addr(&server)
            .map_err(|e| format!("ibsim @{sock}:ctl: {e}"))?;
        ctl.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        let reply = ctl_call(
            &ctl,
            &ctl_msg(0, SIM_CTL_CONNECT, &client_info(id, qp, node)),
        )
        .map_err(|e| format!("connect to ibsim @{sock}: {e}"))?;
        if kind_of(&reply) == SIM_CTL_ERROR {
            return Err(format!(
                "ibsim @{sock} refused the connection (all {MAX_CLIENTS} clients taken, or no \
                 node '{node}')"
            ));
        }
        let index = u32::from_ne_bytes([reply[16], reply[17], reply[18], reply[19]]);
        let out = abstract_addr(&format!("{sock}:out{index}")).map_err(|e| e.to_string())?;
        data.connect_addr(&out)
            .map_err(|e| format!("ibsim @{sock}:out{index}: {e}"))?;
        // The timeout lets a reader notice a stop request even if the shutdown is missed.
        data.set_read_timeout(Some(Duration::from_millis(500)))
            .map_err(|e| e.to_string())?;
        crate::debug(format_args!(
            "ibsim @{sock}: client {index} (id {id}) at '{node}', qp {qp:#x}"
        ));
        Ok(Client {
            index,
            id,
            sock: sock.to_string(),
            node: node.to_string(),
            qp,
            ctl: Mutex::new(ctl),
            data,
        })
    }

    /// One control request with `data` (at most 64 bytes); the answer's 64 data bytes.
    fn call(&self, kind: u32, data: &[u8]) -> Option<[u8; CTL_DATA]> {
        let ctl = self.ctl.lock().ok()?;
        let reply = ctl_call(&ctl, &ctl_msg(self.index, kind, data)).ok()?;
        if kind_of(&reply) == SIM_CTL_ERROR {
            return None;
        }
        let mut d = [0u8; CTL_DATA];
        d.copy_from_slice(&reply[16..16 + CTL_DATA]);
        Some(d)
    }

    /// The node's NodeInfo attribute (IBA 14.2.5.3, 40 bytes used).
    pub fn node_info(&self) -> Option<[u8; CTL_DATA]> {
        self.call(SIM_CTL_GET_NODEINFO, &[0u8; CTL_DATA])
    }

    /// The live PortInfo attribute (IBA 14.2.5.6, 64 bytes) of the client's port: ibsim
    /// recomputes it on every call, so it follows the SM's changes and link state.
    pub fn port_info(&self) -> Option<[u8; CTL_DATA]> {
        self.call(SIM_CTL_GET_PORTINFO, &[0u8; CTL_DATA])
    }

    /// The first 32 entries of the port's P_Key table (host order; ibsim keeps the table in
    /// network order).
    pub fn pkeys(&self) -> Option<Vec<u16>> {
        let d = self.call(SIM_CTL_GET_PKEYS, &[0u8; CTL_DATA])?;
        Some(
            d.chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect(),
        )
    }

    /// Hands one MAD to ibsim. Never blocks; `false` if ibsim's socket did not take it.
    pub fn send(&self, dlid: u16, slid: u16, dqp: u32, sqp: u32, mad: &[u8]) -> bool {
        let req = encode_request(dlid, slid, dqp, sqp, mad);
        // SAFETY: the fd is our open, connected socket; `req` is a live buffer of req.len()
        // bytes; MSG_DONTWAIT keeps a sender from ever blocking.
        let n = unsafe {
            libc::send(
                self.data.as_raw_fd(),
                req.as_ptr().cast(),
                req.len(),
                libc::MSG_DONTWAIT,
            )
        };
        n == REQ_LEN as isize
    }

    /// Tells ibsim the client is gone (waits up to 2 s for the acknowledgement).
    pub fn disconnect(&self) {
        let _ = self.call(SIM_CTL_DISCONNECT, &[]);
    }

    /// Wakes a reader blocked on [`Client::data`].
    pub fn shutdown(&self) {
        // SAFETY: the fd is our open socket; shutdown makes a blocking recv on it return.
        unsafe { libc::shutdown(self.data.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

fn kind_of(reply: &[u8; CTL_LEN]) -> u32 {
    u32::from_ne_bytes([reply[8], reply[9], reply[10], reply[11]])
}

/// Sends one control message and waits (up to the socket's timeout) for its answer.
fn ctl_call(ctl: &UnixDatagram, msg: &[u8; CTL_LEN]) -> std::io::Result<[u8; CTL_LEN]> {
    ctl.send(msg)?;
    let mut b = [0u8; CTL_LEN];
    loop {
        let n = ctl.recv(&mut b)?;
        if n == CTL_LEN {
            return Ok(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_request_layout() {
        let mut mad = [0u8; MAD_SIZE];
        mad[0] = 1;
        mad[255] = 0xee;
        let b = encode_request(0x1234, 5, 1, 0xabcdef, &mad);
        assert_eq!(b.len(), 288);
        // ntohs() of the 32-bit field gives the LID back.
        let f = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        assert_eq!(u16::from_be(f as u16), 0x1234);
        assert_eq!(&b[8..12], &[0, 0, 0, 1]);
        assert_eq!(&b[12..16], &[0, 0xab, 0xcd, 0xef]);
        assert_eq!(&b[24..32], &256u64.to_be_bytes());
        let r = decode_request(&b).expect("decodes");
        assert_eq!(
            (r.dlid, r.slid, r.dqp, r.sqp, r.status),
            (0x1234, 5, 1, 0xabcdef, 0)
        );
        assert_eq!(r.mad, mad);
        assert!(decode_request(&b[..287]).is_none());
    }

    #[test]
    fn ctl_layout() {
        let m = ctl_msg(3, SIM_CTL_CONNECT, &client_info(7, 0x42, "Hca3"));
        assert_eq!(u32::from_ne_bytes([m[0], m[1], m[2], m[3]]), SIM_MAGIC);
        assert_eq!(u32::from_ne_bytes([m[4], m[5], m[6], m[7]]), 3);
        assert_eq!(u32::from_ne_bytes([m[12], m[13], m[14], m[15]]), 44);
        assert_eq!(u32::from_ne_bytes([m[16], m[17], m[18], m[19]]), 7);
        assert_eq!(u32::from_ne_bytes([m[20], m[21], m[22], m[23]]), 0x42);
        assert_eq!(&m[28..32], b"Hca3");
    }

    #[test]
    fn connecting_to_no_ibsim_is_an_error_not_a_hang() {
        let e = Client::connect("simverbs-test-nobody-here", "Hca1", 0x10)
            .err()
            .expect("no ibsim listens there");
        assert!(e.contains("simverbs-test-nobody-here"), "{e}");
    }
}
