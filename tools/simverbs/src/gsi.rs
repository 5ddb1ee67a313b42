//! The GSI bridge: UD datagrams between a simverbs QP and the GSI (QP1) of other nodes,
//! carried by ibsim.
//!
//! A UD send whose AH DLID is unicast and whose remote QPN is 1 does not go through the
//! simverbs transport: the MAD is handed to ibsim as if the QP were a umad agent, so it reaches
//! OpenSM's SA (or whatever ISSM client ibsim finds on that node's QP1). Each QP that does this
//! gets its own ibsim client, connected lazily at its first such send, with `qp` = its QPN, so
//! ibsim routes back to it (1) answers by the TID's bits 48–63 (ibsim's client id) and (2)
//! unsolicited MADs (SA Reports) whose destination QPN is that QPN. A thread per bridge reads the
//! client's in-socket and feeds what arrives into the QP's ordinary receive path
//! ([`crate::qp`]'s `deliver`).
//!
//! Wire facts (ibsim 0.10, `include/ibsim.h`, `umad2sim/sim_client.c`, `ibsim/ibsim.c`):
//! every abstract name ends in a NUL byte (`make_name` counts the terminator);
//! control datagrams are `struct sim_ctl` (80 bytes, host order) on `@<sock>:ctl`, answered to
//! the sender's bound address; data datagrams are `struct sim_request` (288 bytes: DLID and
//! SLID as `htons` values in 32-bit fields, QPNs `htonl`, status `htonl`, length `htobe64`,
//! the MAD at offset 32) from our `@<sock>:in<id>` to ibsim's `@<sock>:out<client>`. ibsim
//! rewrites TID bits 48–63 of every request with the client id; the bridge restores the
//! original bits on answers (see [`TidTable`]). A MAD nobody takes (no route, nobody on the
//! destination QP) comes back to the sender with status 110: counted, dropped.

use crate::qp::QpInner;
use crate::transport::Datagram;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The GSI's well-known Q_Key (IBA 13.4.6.1).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The only datagram size a GSI accepts: one MAD.
pub const MAD_SIZE: usize = 256;
/// Outstanding request TIDs remembered per bridge (oldest forgotten first).
pub const TID_TABLE_LEN: usize = 1024;

const SIM_MAGIC: u32 = 0xdead_beef;
const SIM_CTL_ERROR: u32 = 0;
const SIM_CTL_CONNECT: u32 = 1;
const SIM_CTL_DISCONNECT: u32 = 2;
const CTL_LEN: usize = 80;
const REQ_LEN: usize = 288;
const MAD_OFF: usize = 32;
/// ibsim's status for a MAD it could not deliver (ETIMEDOUT).
const STATUS_UNDELIVERED: u32 = 110;
/// First ibsim client "pid" tried; umad2sim uses the real PID, we stay above any PID.
const ID_BASE: u32 = 1_000_000_000;

/// ibsim's socket base name (`IBSIM_SOCKNAME`, default `sim`).
fn sock_base() -> String {
    crate::control::fabric_name()
}

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
    let n = data.len().min(64);
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

/// A MAD's TID (bytes 8..16, big-endian).
fn tid_of(mad: &[u8]) -> u64 {
    let mut t = [0u8; 8];
    t.copy_from_slice(&mad[8..16]);
    u64::from_be_bytes(t)
}

/// Whether a MAD is a response (method R bit).
fn is_response(mad: &[u8]) -> bool {
    mad[3] & 0x80 != 0
}

const TID_LOW: u64 = 0x0000_ffff_ffff_ffff;

/// The high 16 TID bits of requests sent through ibsim (which overwrites them with its client
/// id), keyed by the low 48 bits; bounded to [`TID_TABLE_LEN`] entries, oldest dropped first.
/// A request re-sent with the same low 48 bits updates its entry.
#[derive(Default)]
pub struct TidTable {
    entries: std::collections::VecDeque<(u64, u16)>,
}

impl TidTable {
    /// Remembers the high bits of `tid`.
    pub fn remember(&mut self, tid: u64) {
        let low = tid & TID_LOW;
        self.entries.retain(|(l, _)| *l != low);
        if self.entries.len() >= TID_TABLE_LEN {
            self.entries.pop_front();
        }
        self.entries.push_back((low, (tid >> 48) as u16));
    }

    /// `tid` with its original high bits, if its low 48 bits were remembered.
    pub fn restore(&self, tid: u64) -> Option<u64> {
        let low = tid & TID_LOW;
        self.entries
            .iter()
            .rev()
            .find(|(l, _)| *l == low)
            .map(|(_, h)| low | (u64::from(*h) << 48))
    }
}

/// One ibsim client serving one QP.
pub struct Bridge {
    /// ibsim's client index (0..10), as in TID bits 48–63.
    pub client: u32,
    /// The "pid" we connected with (names `@<sock>:in<id>` and `@<sock>:ctl<id>`).
    pub id: u32,
    ctl: UnixDatagram,
    data: UnixDatagram,
    tids: Mutex<TidTable>,
    stop: AtomicBool,
    disconnected: AtomicBool,
    rx: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn registry() -> &'static Mutex<Vec<Weak<Bridge>>> {
    static R: std::sync::OnceLock<Mutex<Vec<Weak<Bridge>>>> = std::sync::OnceLock::new();
    R.get_or_init(|| {
        extern "C" fn at_exit() {
            let live: Vec<Arc<Bridge>> = match registry().lock() {
                Ok(v) => v.iter().filter_map(Weak::upgrade).collect(),
                Err(_) => return,
            };
            for b in live {
                b.disconnect();
            }
        }
        // SAFETY: registers a plain function without arguments; it only takes a lock and
        // sends datagrams, which is fine while the process exits.
        unsafe { libc::atexit(at_exit) };
        Mutex::new(Vec::new())
    })
}

/// Live bridges of this process (ibsim clients held).
pub fn live_bridges() -> usize {
    registry()
        .lock()
        .map(|v| v.iter().filter(|w| w.strong_count() > 0).count())
        .unwrap_or(0)
}

/// Binds `@<sock>:ctl<id>` and `@<sock>:in<id>` for the first free id from [`ID_BASE`].
fn bind_pair(qpn: u32) -> std::io::Result<(u32, UnixDatagram, UnixDatagram)> {
    let base = sock_base();
    let mut last = std::io::Error::from_raw_os_error(libc::EADDRINUSE);
    for k in 0..64u32 {
        let id = ID_BASE + (qpn & 0x00ff_ffff) + k * 0x0100_0000; // < i32::MAX for k < 64
        let ctl = match UnixDatagram::bind_addr(&abstract_addr(&format!("{base}:ctl{id}"))?) {
            Ok(s) => s,
            Err(e) => {
                last = e;
                continue;
            }
        };
        let data = match UnixDatagram::bind_addr(&abstract_addr(&format!("{base}:in{id}"))?) {
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

/// Sends one control message and waits (up to 2 s) for its answer.
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

impl Bridge {
    /// Connects a new ibsim client for QP `qpn` at this process's node (`SIM_HOST`).
    pub fn connect(qpn: u32) -> Result<Arc<Bridge>, String> {
        let (id, ctl, data) = bind_pair(qpn).map_err(|e| format!("bind: {e}"))?;
        let base = sock_base();
        let server = abstract_addr(&format!("{base}:ctl")).map_err(|e| e.to_string())?;
        ctl.connect_addr(&server)
            .map_err(|e| format!("ibsim @{base}:ctl: {e}"))?;
        ctl.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        let node = std::env::var("SIM_HOST").unwrap_or_default();
        let reply = ctl_call(
            &ctl,
            &ctl_msg(0, SIM_CTL_CONNECT, &client_info(id, qpn, &node)),
        )
        .map_err(|e| format!("connect: {e}"))?;
        let kind = u32::from_ne_bytes([reply[8], reply[9], reply[10], reply[11]]);
        if kind == SIM_CTL_ERROR {
            return Err(format!(
                "ibsim refused the connection (all {} clients taken, or unknown node '{node}')",
                10
            ));
        }
        let client = u32::from_ne_bytes([reply[16], reply[17], reply[18], reply[19]]);
        let out = abstract_addr(&format!("{base}:out{client}")).map_err(|e| e.to_string())?;
        data.connect_addr(&out)
            .map_err(|e| format!("ibsim @{base}:out{client}: {e}"))?;
        // The timeout lets the reader notice `stop` even if the shutdown wake-up is missed.
        data.set_read_timeout(Some(Duration::from_millis(500)))
            .map_err(|e| e.to_string())?;
        let b = Arc::new(Bridge {
            client,
            id,
            ctl,
            data,
            tids: Mutex::new(TidTable::default()),
            stop: AtomicBool::new(false),
            disconnected: AtomicBool::new(false),
            rx: Mutex::new(None),
        });
        if let Ok(mut r) = registry().lock() {
            r.retain(|w| w.strong_count() > 0);
            r.push(Arc::downgrade(&b));
        }
        crate::debug(format_args!(
            "QP {qpn:#x}: GSI bridge = ibsim client {client} (id {id}) at '{node}'"
        ));
        Ok(b)
    }

    /// Starts the reader thread that hands arriving MADs to `qp`.
    pub fn start(self: &Arc<Self>, qp: Weak<QpInner>) -> std::io::Result<()> {
        let me = self.clone();
        let h = std::thread::Builder::new()
            .name(format!("simverbs-gsi{}", self.client))
            .spawn(move || me.reader(qp))?;
        if let Ok(mut g) = self.rx.lock() {
            *g = Some(h);
        }
        Ok(())
    }

    /// Sends one MAD from (`slid`, `sqp`) to QP1 at `dlid`. Never blocks; `false` if ibsim's
    /// socket did not take it.
    pub fn send(&self, dlid: u16, slid: u16, sqp: u32, mad: &[u8]) -> bool {
        if !is_response(mad) {
            if let Ok(mut t) = self.tids.lock() {
                t.remember(tid_of(mad));
            }
        }
        let req = encode_request(dlid, slid, 1, sqp, mad);
        // SAFETY: the fd is our open, connected socket; `req` is a live buffer of req.len()
        // bytes; MSG_DONTWAIT keeps post_send from ever blocking.
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

    fn reader(self: Arc<Self>, qp: Weak<QpInner>) {
        let mut buf = [0u8; 1024];
        loop {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let n = match self.data.recv(&mut buf) {
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
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let Some(q) = qp.upgrade() else { return };
            let Some(mut r) = decode_request(&buf[..n]) else {
                continue;
            };
            crate::guard((), || self.arrived(&q, &mut r));
        }
    }

    /// One datagram from ibsim: a MAD for the QP, or one of ours bounced as undeliverable.
    fn arrived(&self, q: &QpInner, r: &mut SimRequest) {
        if r.status != 0 {
            // Our own request, returned by ibsim: no route or nobody on that QP1 (on a fabric
            // it would simply be lost).
            q.counters.gsi_undelivered.fetch_add(1, Ordering::Relaxed);
            crate::debug(format_args!(
                "QP {:#x}: MAD to LID {} not delivered by ibsim (status {})",
                q.qpn, r.dlid, r.status
            ));
            if r.status != STATUS_UNDELIVERED {
                crate::debug(format_args!("unexpected ibsim status {}", r.status));
            }
            return;
        }
        if is_response(&r.mad) {
            if let Some(t) = self
                .tids
                .lock()
                .ok()
                .and_then(|t| t.restore(tid_of(&r.mad)))
            {
                r.mad[8..16].copy_from_slice(&t.to_be_bytes());
            }
        }
        q.counters.gsi_received.fetch_add(1, Ordering::Relaxed);
        let d = Datagram {
            slid: r.slid,
            dlid: r.dlid,
            src_qpn: r.sqp & 0x00ff_ffff,
            dst_qpn: r.dqp & 0x00ff_ffff,
            qkey: GSI_QKEY,
            pkey: 0xffff,
            sl: 0,
            payload: r.mad.to_vec(),
            ..Default::default()
        };
        crate::capture::record(&d);
        q.deliver(&d);
    }

    /// Tells ibsim the client is gone (once; waits up to 2 s for the acknowledgement).
    pub fn disconnect(&self) {
        if self.disconnected.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = ctl_call(&self.ctl, &ctl_msg(self.client, SIM_CTL_DISCONNECT, &[]));
    }

    /// Stops the reader thread and disconnects.
    pub fn close(&self) {
        self.stop.store(true, Ordering::Release);
        // SAFETY: the fd is our open socket; shutdown wakes the reader's blocking recv.
        unsafe { libc::shutdown(self.data.as_raw_fd(), libc::SHUT_RDWR) };
        let h = self.rx.lock().ok().and_then(|mut h| h.take());
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        self.disconnect();
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
    fn tids_are_restored_and_bounded() {
        let mut t = TidTable::default();
        t.remember(0xbeef_0000_0000_0001);
        let rewritten = 0x0003_0000_0000_0001;
        assert_eq!(t.restore(rewritten), Some(0xbeef_0000_0000_0001));
        assert_eq!(t.restore(0x0003_0000_0000_0002), None);
        for i in 0..TID_TABLE_LEN as u64 {
            t.remember(0x1111_0000_0000_1000 + i);
        }
        assert_eq!(t.restore(rewritten), None, "oldest entry forgotten");
        assert_eq!(
            t.restore(0x0003_0000_0000_1000),
            Some(0x1111_0000_0000_1000)
        );
        t.remember(0x2222_0000_0000_1000);
        assert_eq!(
            t.restore(0x0003_0000_0000_1000),
            Some(0x2222_0000_0000_1000)
        );
        assert!(t.entries.len() <= TID_TABLE_LEN);
    }

    #[test]
    fn an_rmpp_answer_keeps_its_tid_for_every_segment_and_ack() {
        // A GetTable (request), then its answer's segments interleaved with our ACKs (requests
        // with the same TID, GetTable 0x12) and other traffic: every segment gets our high
        // bits back, and the ACKs keep the entry from being forgotten.
        let mut t = TidTable::default();
        let ours = 0x7a11_0000_0000_0001u64;
        t.remember(ours);
        let wire = 0x0004_0000_0000_0001u64; // ibsim's client id in bits 48-63
        for seg in 0..3 * TID_TABLE_LEN as u64 {
            assert_eq!(t.restore(wire), Some(ours), "segment {seg}");
            if seg % 16 == 0 {
                t.remember(ours); // the ACK after a window
            }
            t.remember(0x1111_0000_0010_0000 + seg); // other queries meanwhile
        }
    }
}
