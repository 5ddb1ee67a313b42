//! Datagram transport between simulated HCAs, and the loss/delay/duplication/reorder knobs.

use std::fmt;
use std::sync::Mutex;

/// Fault-injection knobs applied to every datagram sent by this process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Knobs {
    /// Probability that a datagram is silently lost.
    pub loss: f64,
    /// Probability that a datagram is delivered twice.
    pub dup: f64,
    /// Probability that a datagram is held back and sent after the next one.
    pub reorder: f64,
    /// Delay added before each datagram is sent, in milliseconds.
    pub delay_ms: u64,
}

impl fmt::Display for Knobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loss={} dup={} reorder={} delay_ms={}",
            self.loss, self.dup, self.reorder, self.delay_ms
        )
    }
}

fn knob_cell() -> &'static Mutex<Knobs> {
    static K: std::sync::OnceLock<Mutex<Knobs>> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let mut k = Knobs::default();
        for (env, name) in [
            ("SIMVERBS_LOSS", "loss"),
            ("SIMVERBS_DUP", "dup"),
            ("SIMVERBS_REORDER", "reorder"),
            ("SIMVERBS_DELAY_MS", "delay_ms"),
            ("SIMVERBS_FAIL_POST_RECV", "fail_post_recv"),
        ] {
            if let Ok(v) = std::env::var(env) {
                if let Err(e) = apply(&mut k, name, &v) {
                    crate::log(format_args!("ignoring {env}: {e}"));
                }
            }
        }
        Mutex::new(k)
    })
}

/// The current knobs.
pub fn knobs() -> Knobs {
    knob_cell().lock().map(|k| *k).unwrap_or_default()
}

fn apply(k: &mut Knobs, name: &str, value: &str) -> Result<(), String> {
    let prob = |v: &str| -> Result<f64, String> {
        match v.parse::<f64>() {
            Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
            _ => Err(format!("'{v}' is not a probability in 0..1")),
        }
    };
    match name {
        "loss" => k.loss = prob(value)?,
        "dup" => k.dup = prob(value)?,
        "reorder" => k.reorder = prob(value)?,
        "delay_ms" => {
            k.delay_ms = value
                .parse::<u64>()
                .ok()
                .filter(|d| *d <= 60_000)
                .ok_or_else(|| format!("'{value}' is not a delay in 0..60000 ms"))?
        }
        "fail_post_recv" => crate::qp::fail_next_post_recvs(
            value
                .parse::<u64>()
                .map_err(|_| format!("'{value}' is not a count of receives"))?,
        ),
        _ => return Err(format!("unknown knob '{name}'")),
    }
    Ok(())
}

/// Sets one knob by name (`loss`, `dup`, `reorder`, `delay_ms`; `fail_post_recv N`: the
/// process's next N receive work requests are refused with ENOMEM, as a driver out of
/// resources would).
pub fn set_knob(name: &str, value: &str) -> Result<(), String> {
    let mut k = knob_cell()
        .lock()
        .map_err(|_| "knob lock poisoned".to_string())?;
    apply(&mut k, name, value)
}

// ---------------------------------------------------------------------------------------------
// Wire format
// ---------------------------------------------------------------------------------------------

/// One UD datagram between simulated HCAs: what the LRH/BTH/DETH/GRH would carry, then the
/// payload. Fixed header of [`Datagram::HEADER_LEN`] bytes, integers big-endian:
///
/// ```text
///  0  magic "SVB1"   4 SLID    6 DLID     8 source QPN   12 destination QPN (0xFFFFFF: mcast)
/// 16  Q_Key         20 P_Key  22 SL      23 flags (1 = GRH, 2 = immediate, 4 = solicited)
/// 24  immediate (as posted)   28 flow label  32 hop limit  33 traffic class  34 payload length
/// 36  SGID (16)     52 DGID (16)          68 payload
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Datagram {
    pub slid: u16,
    pub dlid: u16,
    pub src_qpn: u32,
    pub dst_qpn: u32,
    pub qkey: u32,
    pub pkey: u16,
    pub sl: u8,
    pub grh: bool,
    pub imm: Option<u32>,
    /// The sender set `IBV_SEND_SOLICITED`.
    pub solicited: bool,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
    pub payload: Vec<u8>,
}

/// Destination QPN of multicast datagrams.
pub const MCAST_QPN: u32 = 0x00FF_FFFF;

const MAGIC: &[u8; 4] = b"SVB1";

impl Datagram {
    /// Bytes before the payload.
    pub const HEADER_LEN: usize = 68;

    /// Serialises the datagram.
    pub fn emit(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::HEADER_LEN + self.payload.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.slid.to_be_bytes());
        b.extend_from_slice(&self.dlid.to_be_bytes());
        b.extend_from_slice(&self.src_qpn.to_be_bytes());
        b.extend_from_slice(&self.dst_qpn.to_be_bytes());
        b.extend_from_slice(&self.qkey.to_be_bytes());
        b.extend_from_slice(&self.pkey.to_be_bytes());
        b.push(self.sl);
        b.push(
            u8::from(self.grh)
                | (u8::from(self.imm.is_some()) << 1)
                | (u8::from(self.solicited) << 2),
        );
        b.extend_from_slice(&self.imm.unwrap_or(0).to_be_bytes());
        b.extend_from_slice(&self.flow_label.to_be_bytes());
        b.push(self.hop_limit);
        b.push(self.traffic_class);
        b.extend_from_slice(&(self.payload.len() as u16).to_be_bytes());
        b.extend_from_slice(&self.sgid);
        b.extend_from_slice(&self.dgid);
        b.extend_from_slice(&self.payload);
        b
    }

    /// Parses a received datagram; `None` for anything malformed (it is then dropped).
    pub fn parse(b: &[u8]) -> Option<Datagram> {
        if b.len() < Self::HEADER_LEN || &b[0..4] != MAGIC {
            return None;
        }
        let u16_at = |o: usize| u16::from_be_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let len = usize::from(u16_at(34));
        if b.len() != Self::HEADER_LEN + len {
            return None;
        }
        let flags = b[23];
        let mut sgid = [0u8; 16];
        sgid.copy_from_slice(&b[36..52]);
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&b[52..68]);
        Some(Datagram {
            slid: u16_at(4),
            dlid: u16_at(6),
            src_qpn: u32_at(8),
            dst_qpn: u32_at(12),
            qkey: u32_at(16),
            pkey: u16_at(20),
            sl: b[22],
            grh: flags & 1 != 0,
            imm: (flags & 2 != 0).then(|| u32_at(24)),
            solicited: flags & 4 != 0,
            flow_label: u32_at(28),
            hop_limit: b[32],
            traffic_class: b[33],
            sgid,
            dgid,
            payload: b[Self::HEADER_LEN..].to_vec(),
        })
    }

    /// The 40-byte GRH (IBA 8.3) a receiver finds in front of the payload.
    pub fn grh_bytes(&self) -> [u8; 40] {
        let mut g = [0u8; 40];
        let w0: u32 =
            (6 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0x000F_FFFF);
        g[0..4].copy_from_slice(&w0.to_be_bytes());
        // PayLen counts the bytes after the GRH up to the ICRC: BTH + DETH + payload + ICRC.
        let paylen = (12 + 8 + self.payload.len() + 4) as u16;
        g[4..6].copy_from_slice(&paylen.to_be_bytes());
        g[6] = 0x1B; // NxtHdr: IBA transport
        g[7] = self.hop_limit;
        g[8..24].copy_from_slice(&self.sgid);
        g[24..40].copy_from_slice(&self.dgid);
        g
    }
}

// ---------------------------------------------------------------------------------------------
// Addresses and multicast membership
// ---------------------------------------------------------------------------------------------

/// Abstract socket name of QP `qpn` at `lid` on `fabric` (the ibsim instance of the QP's
/// port: LIDs are per subnet).
pub fn qp_addr_name(fabric: &str, lid: u16, qpn: u32) -> String {
    format!("simverbs/{fabric}/lid/{lid}/qp/{qpn}")
}

/// Root of `fabric`'s shared state (`/dev/shm/simverbs-<fabric>`, or
/// `$SIMVERBS_SHM_DIR/simverbs-<fabric>`).
pub fn fabric_dir(fabric: &str) -> std::path::PathBuf {
    let base = std::env::var_os("SIMVERBS_SHM_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("/dev/shm"));
    base.join(format!("simverbs-{fabric}"))
}

/// Hex name of a GID (32 lowercase hex digits).
pub fn gid_hex(gid: &[u8; 16]) -> String {
    gid.iter().map(|b| format!("{b:02x}")).collect()
}

fn mcast_dir(fabric: &str, mgid: &[u8; 16]) -> std::path::PathBuf {
    fabric_dir(fabric).join("mcast").join(gid_hex(mgid))
}

/// Records that QP (`lid`, `qpn`) of `fabric` is attached to `mgid` with `mlid`.
pub fn mcast_join(
    fabric: &str,
    mgid: &[u8; 16],
    mlid: u16,
    lid: u16,
    qpn: u32,
) -> std::io::Result<()> {
    let dir = mcast_dir(fabric, mgid);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join(format!("{lid}.{qpn}")),
        format!("mlid=0x{mlid:04x}\n"),
    )
}

/// Removes the membership of QP (`lid`, `qpn`) of `fabric` in `mgid`.
pub fn mcast_leave(fabric: &str, mgid: &[u8; 16], lid: u16, qpn: u32) {
    let _ = std::fs::remove_file(mcast_dir(fabric, mgid).join(format!("{lid}.{qpn}")));
}

/// One member of a multicast group, as found in the membership directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub mgid: [u8; 16],
    pub mlid: u16,
    pub lid: u16,
    pub qpn: u32,
    pub path: std::path::PathBuf,
}

fn parse_gid_hex(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 {
        return None;
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(g)
}

fn read_members(dir: &std::path::Path, mgid: [u8; 16], out: &mut Vec<Member>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some((lid, qpn)) = name.split_once('.') else {
            continue;
        };
        let (Ok(lid), Ok(qpn)) = (lid.parse::<u16>(), qpn.parse::<u32>()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let Some(mlid) = text
            .trim()
            .strip_prefix("mlid=0x")
            .and_then(|h| u16::from_str_radix(h, 16).ok())
        else {
            continue;
        };
        out.push(Member {
            mgid,
            mlid,
            lid,
            qpn,
            path: e.path(),
        });
    }
}

/// Members on `fabric` of the group addressed by `mlid` (and `mgid` when the sender used a
/// GRH).
pub fn mcast_members(fabric: &str, mgid: Option<&[u8; 16]>, mlid: u16) -> Vec<Member> {
    let mut out = Vec::new();
    match mgid {
        Some(g) => read_members(&mcast_dir(fabric, g), *g, &mut out),
        None => {
            if let Ok(rd) = std::fs::read_dir(fabric_dir(fabric).join("mcast")) {
                for e in rd.flatten() {
                    if let Some(g) = parse_gid_hex(&e.file_name().to_string_lossy()) {
                        read_members(&e.path(), g, &mut out);
                    }
                }
            }
        }
    }
    out.retain(|m| m.mlid == mlid);
    out
}

// ---------------------------------------------------------------------------------------------
// Sending, with fault injection
// ---------------------------------------------------------------------------------------------

/// Outcome of handing one datagram to the transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOutcome {
    /// Queued to the peer's socket (or scheduled for later delivery).
    Sent,
    /// No process listens at that address (dead or absent peer): lost, as on a real fabric.
    NoPeer,
    /// The peer's receive queue was full: lost.
    Congested,
    /// Dropped by the loss knob.
    Dropped,
}

/// A small xorshift generator; `SIMVERBS_SEED` makes fault injection reproducible.
fn random_unit() -> f64 {
    static STATE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut s = STATE.load(std::sync::atomic::Ordering::Relaxed);
    if s == 0 {
        s = std::env::var("SIMVERBS_SEED")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1);
                t ^ (u64::from(std::process::id()) << 32)
            })
            | 1;
    }
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    STATE.store(s, std::sync::atomic::Ordering::Relaxed);
    (s >> 11) as f64 / (1u64 << 53) as f64
}

fn send_now(sock: &std::os::unix::net::UnixDatagram, name: &str, bytes: &[u8]) -> SendOutcome {
    use std::os::linux::net::SocketAddrExt;
    let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()) else {
        return SendOutcome::NoPeer;
    };
    match sock.send_to_addr(bytes, &addr) {
        Ok(_) => SendOutcome::Sent,
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => SendOutcome::NoPeer,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => SendOutcome::NoPeer,
        Err(_) => SendOutcome::Congested,
    }
}

struct Scheduled {
    due: std::time::Instant,
    seq: u64,
    name: String,
    bytes: Vec<u8>,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        self.due == o.due && self.seq == o.seq
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Reversed: BinaryHeap is a max-heap and we want the earliest first.
        o.due.cmp(&self.due).then(o.seq.cmp(&self.seq))
    }
}

struct Scheduler {
    heap: Mutex<(std::collections::BinaryHeap<Scheduled>, u64)>,
    wake: std::sync::Condvar,
}

fn scheduler() -> &'static Scheduler {
    static S: std::sync::OnceLock<&'static Scheduler> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let s: &'static Scheduler = Box::leak(Box::new(Scheduler {
            heap: Mutex::new((std::collections::BinaryHeap::new(), 0)),
            wake: std::sync::Condvar::new(),
        }));
        let _ = std::thread::Builder::new()
            .name("simverbs-delay".into())
            .spawn(move || scheduler_loop(s));
        s
    })
}

fn scheduler_loop(s: &'static Scheduler) {
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else {
        return;
    };
    let _ = sock.set_nonblocking(true);
    let Ok(mut g) = s.heap.lock() else { return };
    loop {
        let now = std::time::Instant::now();
        match g.0.peek() {
            Some(top) if top.due <= now => {
                if let Some(item) = g.0.pop() {
                    drop(g);
                    let _ = send_now(&sock, &item.name, &item.bytes);
                    g = match s.heap.lock() {
                        Ok(g) => g,
                        Err(_) => return,
                    };
                }
            }
            Some(top) => {
                let wait = top.due - now;
                g = match s.wake.wait_timeout(g, wait) {
                    Ok((g, _)) => g,
                    Err(_) => return,
                };
            }
            None => {
                g = match s.wake.wait(g) {
                    Ok(g) => g,
                    Err(_) => return,
                };
            }
        }
    }
}

fn schedule(name: &str, bytes: Vec<u8>, after: std::time::Duration) {
    let s = scheduler();
    if let Ok(mut g) = s.heap.lock() {
        g.1 += 1;
        let seq = g.1;
        g.0.push(Scheduled {
            due: std::time::Instant::now() + after,
            seq,
            name: name.to_string(),
            bytes,
        });
        s.wake.notify_one();
    }
}

/// One draw of the loss knob: `true` if the datagram is to be lost (used by the GSI bridge,
/// which applies only this knob).
pub fn lost_by_knob() -> bool {
    let k = knobs();
    k.loss > 0.0 && random_unit() < k.loss
}

/// How long a datagram picked for reordering is held back.
const REORDER_HOLD: std::time::Duration = std::time::Duration::from_millis(100);

/// Sends one datagram to the abstract address `name`, applying the knobs. Never blocks.
pub fn transmit(sock: &std::os::unix::net::UnixDatagram, name: &str, bytes: &[u8]) -> SendOutcome {
    let k = knobs();
    if k.loss > 0.0 && random_unit() < k.loss {
        return SendOutcome::Dropped;
    }
    let copies = if k.dup > 0.0 && random_unit() < k.dup {
        2
    } else {
        1
    };
    let mut outcome = SendOutcome::Sent;
    for _ in 0..copies {
        let mut hold = std::time::Duration::from_millis(k.delay_ms);
        if k.reorder > 0.0 && random_unit() < k.reorder {
            hold += REORDER_HOLD;
        }
        if hold.is_zero() {
            outcome = send_now(sock, name, bytes);
        } else {
            schedule(name, bytes.to_vec(), hold);
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagram_round_trip() {
        let d = Datagram {
            slid: 5,
            dlid: 0xc001,
            src_qpn: 0x1234,
            dst_qpn: MCAST_QPN,
            qkey: 0x8001_0000,
            pkey: 0xffff,
            sl: 3,
            grh: true,
            imm: Some(0xdead_beef),
            solicited: true,
            flow_label: 0x12345,
            hop_limit: 64,
            traffic_class: 7,
            sgid: [1; 16],
            dgid: [0xff; 16],
            payload: b"hello".to_vec(),
        };
        let b = d.emit();
        assert_eq!(b.len(), Datagram::HEADER_LEN + 5);
        assert_eq!(Datagram::parse(&b), Some(d.clone()));
        // Truncated, padded and foreign datagrams are rejected, not trusted.
        assert_eq!(Datagram::parse(&b[..b.len() - 1]), None);
        let mut longer = b.clone();
        longer.push(0);
        assert_eq!(Datagram::parse(&longer), None);
        assert_eq!(Datagram::parse(b"SVB0"), None);
        let g = d.grh_bytes();
        assert_eq!(g[0] >> 4, 6);
        assert_eq!(g[6], 0x1B);
        assert_eq!(g[7], 64);
        assert_eq!(&g[8..24], &[1; 16]);
        assert_eq!(&g[24..40], &[0xff; 16]);
    }

    #[test]
    fn knob_validation() {
        let mut k = Knobs::default();
        assert!(apply(&mut k, "loss", "0.25").is_ok());
        assert_eq!(k.loss, 0.25);
        assert!(apply(&mut k, "loss", "1.5").is_err());
        assert!(apply(&mut k, "delay_ms", "abc").is_err());
        assert!(apply(&mut k, "nope", "1").is_err());
        assert!(apply(&mut k, "delay_ms", "30").is_ok());
        assert_eq!(k.delay_ms, 30);
    }

    #[test]
    fn gid_hex_round_trip() {
        let g = [
            0xff, 0x15, 0x40, 0x01, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
        ];
        assert_eq!(parse_gid_hex(&gid_hex(&g)), Some(g));
        assert_eq!(parse_gid_hex("zz"), None);
    }
}
