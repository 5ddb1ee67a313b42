//! `SIMVERBS_PCAP=<path>`: every UD datagram this process *sends* is appended to a pcap file
//! as an InfiniBand frame that Wireshark/tshark decodes without options.
//!
//! * **Link type**: LINKTYPE_ERF (197), each record an ERF header of type 21 (INFINIBAND)
//!   followed by the frame. (tshark 4.0 rejects LINKTYPE_INFINIBAND 247; LINKTYPE_USER0 147
//!   works too but needs a `uat:user_dlts` option on every tshark call.)
//! * **Frame**: LRH (LNH 3 with a GRH when the send used a global AH, else 2) + GRH + BTH
//!   (opcode 0x64 UD SEND only, 0x65 with immediate; P_Key, destination QP, a per-process
//!   PSN) + DETH (Q_Key, source QP) + ImmDt + the payload, padded to 4 bytes (BTH PadCnt) +
//!   ICRC and VCRC **placeholders** (zeros; Wireshark does not check them).
//! * **Where**: at the sending port, after the checks that fail the send or drop it for a
//!   down port, *before* the loss/dup/reorder/delay knobs: a datagram the loss knob drops is
//!   still captured once, a duplicated one once. A multicast datagram is one record however
//!   many members receive it. Only senders write, so a fabric-wide capture (every daemon with
//!   the same path) holds each datagram exactly once.
//! * **Several processes, one file**: whoever creates the file writes the 24-byte global
//!   header into a private temporary file and `link(2)`s it into place (fails with EEXIST if
//!   someone else won), so no process ever sees the file without its header. Every process
//!   then opens it `O_APPEND` and writes each record with a single `write(2)`: records of
//!   different processes never interleave. `%p` in the path is replaced by the process id
//!   (one file per process; `madtool pcap` merges several files by timestamp).
//! * **Cost when unset**: [`record`] is one check of a value computed once per process.
//!
//! Errors (unwritable path, ...) are logged once on stderr and capture is then off for this
//! process; a failing write is logged once and the datagram is still sent.

use crate::transport::Datagram;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;

/// pcap link type of the records: ERF.
pub const LINKTYPE_ERF: u32 = 197;
/// ERF record type: InfiniBand.
pub const ERF_TYPE_INFINIBAND: u8 = 21;
/// BTH opcode: UD SEND only.
pub const OP_UD_SEND_ONLY: u8 = 0x64;
/// BTH opcode: UD SEND only with immediate.
pub const OP_UD_SEND_ONLY_IMM: u8 = 0x65;

/// The open capture file of this process.
struct Sink {
    file: std::fs::File,
    psn: AtomicU32,
    failed: AtomicBool,
}

fn sink() -> Option<&'static Sink> {
    static SINK: OnceLock<Option<Sink>> = OnceLock::new();
    SINK.get_or_init(|| {
        let path = std::env::var_os("SIMVERBS_PCAP")?;
        let path = expand(&path.to_string_lossy(), std::process::id());
        match open_shared(std::path::Path::new(&path)) {
            Ok(file) => {
                crate::debug(format_args!("capturing sent datagrams into {path}"));
                Some(Sink {
                    file,
                    psn: AtomicU32::new(0),
                    failed: AtomicBool::new(false),
                })
            }
            Err(e) => {
                crate::log(format_args!("SIMVERBS_PCAP={path}: {e}; capture is off"));
                None
            }
        }
    })
    .as_ref()
}

/// Appends `d` to the capture file if `SIMVERBS_PCAP` is set (else returns at once).
pub fn record(d: &Datagram) {
    if let Some(s) = sink() {
        s.write(d);
    }
}

impl Sink {
    fn write(&self, d: &Datagram) {
        let psn = self.psn.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
        let rec = pcap_record(&ib_frame(d, psn), now());
        // One write(2) per record on an O_APPEND file: never interleaved with other writers.
        if let Err(e) = (&self.file).write_all(&rec) {
            if !self.failed.swap(true, Ordering::Relaxed) {
                crate::log(format_args!("SIMVERBS_PCAP: write failed: {e}"));
            }
        }
    }
}

/// Replaces every `%p` of `path` by `pid`.
pub fn expand(path: &str, pid: u32) -> String {
    path.replace("%p", &pid.to_string())
}

/// Opens `path` for appending records, creating it with a pcap global header if it does not
/// exist. Safe against any number of processes doing the same at the same time: the header is
/// written to a private file that is then hard-linked into place, so the file never appears
/// without it.
pub fn open_shared(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    if std::fs::symlink_metadata(path).is_err() {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let tmp = path.with_file_name(format!(
            ".{}.{}.{}.tmp",
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&tmp)?;
            f.write_all(&global_header())?;
        }
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    std::fs::OpenOptions::new().append(true).open(path)
}

/// The 24-byte pcap global header (microsecond timestamps, little-endian, LINKTYPE_ERF).
pub fn global_header() -> [u8; 24] {
    let mut h = [0u8; 24];
    h[0..4].copy_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    h[4..6].copy_from_slice(&2u16.to_le_bytes());
    h[6..8].copy_from_slice(&4u16.to_le_bytes());
    // thiszone 0, sigfigs 0
    h[16..20].copy_from_slice(&65535u32.to_le_bytes());
    h[20..24].copy_from_slice(&LINKTYPE_ERF.to_le_bytes());
    h
}

/// Wall-clock time as (seconds, microseconds).
fn now() -> (u32, u32) {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.as_secs() as u32, t.subsec_micros())
}

/// One pcap record: record header + ERF header (type 21) + `frame`.
pub fn pcap_record(frame: &[u8], (sec, usec): (u32, u32)) -> Vec<u8> {
    let erf_len = 16 + frame.len();
    let mut r = Vec::with_capacity(16 + erf_len);
    r.extend_from_slice(&sec.to_le_bytes());
    r.extend_from_slice(&usec.to_le_bytes());
    r.extend_from_slice(&(erf_len as u32).to_le_bytes());
    r.extend_from_slice(&(erf_len as u32).to_le_bytes());
    // ERF timestamp: 32.32 fixed point seconds, little-endian.
    let frac = (u64::from(usec) << 32) / 1_000_000;
    r.extend_from_slice(&((u64::from(sec) << 32) | frac).to_le_bytes());
    r.push(ERF_TYPE_INFINIBAND);
    r.push(0x04); // flags: varying record length
    r.extend_from_slice(&(erf_len as u16).to_be_bytes()); // rlen
    r.extend_from_slice(&0u16.to_be_bytes()); // loss counter
    r.extend_from_slice(&(frame.len() as u16).to_be_bytes()); // wlen
    r.extend_from_slice(frame);
    r
}

/// The InfiniBand frame of `d`: LRH [+ GRH] + BTH + DETH [+ ImmDt] + payload + pad + ICRC +
/// VCRC (CRCs zero).
pub fn ib_frame(d: &Datagram, psn: u32) -> Vec<u8> {
    let pad = (4 - d.payload.len() % 4) % 4;
    let imm_len = if d.imm.is_some() { 4 } else { 0 };
    // From the BTH through the ICRC (what the GRH's PayLen counts).
    let transport_len = 12 + 8 + imm_len + d.payload.len() + pad + 4;
    let grh_len = if d.grh { 40 } else { 0 };
    let words = ((8 + grh_len + transport_len) / 4) as u16;
    let mut f = Vec::with_capacity(8 + grh_len + transport_len + 2);
    // LRH: VL 0, LVer 0 | SL, LNH (3 = IBA global, 2 = IBA local) | DLID | PktLen | SLID
    f.push(0x00);
    f.push(((d.sl & 0x0f) << 4) | if d.grh { 0x3 } else { 0x2 });
    f.extend_from_slice(&d.dlid.to_be_bytes());
    f.extend_from_slice(&(words & 0x07ff).to_be_bytes());
    f.extend_from_slice(&d.slid.to_be_bytes());
    if d.grh {
        let mut g = d.grh_bytes();
        g[4..6].copy_from_slice(&(transport_len as u16).to_be_bytes());
        f.extend_from_slice(&g);
    }
    // BTH: opcode | SE, M 0, PadCnt, TVer 0 | P_Key | reserved, DestQP | A 0, PSN
    f.push(if d.imm.is_some() {
        OP_UD_SEND_ONLY_IMM
    } else {
        OP_UD_SEND_ONLY
    });
    f.push((u8::from(d.solicited) << 7) | ((pad as u8) << 4));
    f.extend_from_slice(&d.pkey.to_be_bytes());
    f.extend_from_slice(&(d.dst_qpn & 0x00ff_ffff).to_be_bytes());
    f.extend_from_slice(&(psn & 0x00ff_ffff).to_be_bytes());
    // DETH: Q_Key | reserved, SrcQP
    f.extend_from_slice(&d.qkey.to_be_bytes());
    f.extend_from_slice(&(d.src_qpn & 0x00ff_ffff).to_be_bytes());
    if let Some(imm) = d.imm {
        // ImmDt carries the immediate as posted (network order on the wire).
        f.extend_from_slice(&imm.to_ne_bytes());
    }
    f.extend_from_slice(&d.payload);
    f.extend_from_slice(&[0u8; 3][..pad]);
    f.extend_from_slice(&[0; 6]); // ICRC, VCRC placeholders
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::MCAST_QPN;

    fn dgram(grh: bool, imm: Option<u32>, len: usize) -> Datagram {
        Datagram {
            slid: 5,
            dlid: if grh { 0xc001 } else { 6 },
            src_qpn: 0x5010,
            dst_qpn: if grh { MCAST_QPN } else { 0x6010 },
            qkey: 0x8001_0000,
            pkey: 0xffff,
            sl: 2,
            grh,
            imm,
            solicited: imm.is_some(),
            flow_label: 0x12345,
            hop_limit: 9,
            traffic_class: 3,
            sgid: [0xfe; 16],
            dgid: [0xff; 16],
            payload: (0..len).map(|i| i as u8).collect(),
        }
    }

    #[test]
    fn frame_with_grh_and_without() {
        let f = ib_frame(&dgram(true, None, 256), 7);
        assert_eq!(f.len(), 8 + 40 + 12 + 8 + 256 + 4 + 2);
        assert_eq!(f[1], 0x23, "SL 2, LNH 3 (GRH)");
        assert_eq!(&f[2..4], &[0xc0, 0x01]);
        assert_eq!(u16::from_be_bytes([f[4], f[5]]) as usize * 4, f.len() - 2);
        assert_eq!(&f[6..8], &[0, 5]);
        // GRH: IPVer 6, TClass 3, FlowLabel, PayLen = BTH..ICRC, NxtHdr 0x1B, HopLimit.
        assert_eq!(f[8] >> 4, 6);
        assert_eq!(
            u32::from_be_bytes([f[8], f[9], f[10], f[11]]) & 0x0fff_ffff,
            (3 << 20) | 0x12345
        );
        assert_eq!(u16::from_be_bytes([f[12], f[13]]), 12 + 8 + 256 + 4);
        assert_eq!((f[14], f[15]), (0x1b, 9));
        assert_eq!(&f[16..32], &[0xfe; 16]);
        assert_eq!(&f[32..48], &[0xff; 16]);
        let bth = &f[48..60];
        assert_eq!(bth[0], OP_UD_SEND_ONLY);
        assert_eq!(bth[1], 0, "no SE, PadCnt 0");
        assert_eq!(&bth[2..4], &[0xff, 0xff]);
        assert_eq!(&bth[4..8], &[0, 0xff, 0xff, 0xff]);
        assert_eq!(&bth[8..12], &[0, 0, 0, 7]);
        assert_eq!(&f[60..64], &[0x80, 0x01, 0, 0]);
        assert_eq!(&f[64..68], &[0, 0, 0x50, 0x10]);
        assert_eq!(&f[68..68 + 256], &dgram(true, None, 256).payload[..]);

        let f = ib_frame(&dgram(false, Some(0x0102_0304), 5), 1);
        assert_eq!(f.len(), 8 + 12 + 8 + 4 + 8 + 4 + 2);
        assert_eq!(f[1], 0x22, "LNH 2 (no GRH)");
        assert_eq!(u16::from_be_bytes([f[4], f[5]]) as usize * 4, f.len() - 2);
        assert_eq!(f[8], OP_UD_SEND_ONLY_IMM);
        assert_eq!(f[9], 0x80 | (3 << 4), "SE, PadCnt 3");
        assert_eq!(&f[12..16], &[0, 0, 0x60, 0x10]);
        assert_eq!(&f[28..32], &0x0102_0304u32.to_ne_bytes());
        assert_eq!(&f[32..37], &[0, 1, 2, 3, 4]);
        assert_eq!(&f[37..40], &[0, 0, 0], "pad");
    }

    #[test]
    fn record_framing() {
        let frame = vec![0xaa; 30];
        let r = pcap_record(&frame, (1_700_000_000, 500_000));
        assert_eq!(r.len(), 16 + 16 + 30);
        assert_eq!(&r[8..12], &46u32.to_le_bytes());
        assert_eq!(&r[12..16], &46u32.to_le_bytes());
        let ts = u64::from_le_bytes(r[16..24].try_into().unwrap());
        assert_eq!(ts >> 32, 1_700_000_000);
        assert_eq!(ts & 0xffff_ffff, 1 << 31, "half a second");
        assert_eq!((r[24], r[25]), (21, 4));
        assert_eq!(&r[26..28], &46u16.to_be_bytes());
        assert_eq!(&r[30..32], &30u16.to_be_bytes());
        assert_eq!(&r[32..], &frame[..]);
        assert_eq!(expand("/x/c-%p.pcap", 42), "/x/c-42.pcap");
    }

    /// Many writers (threads with their own descriptors, as processes would have) racing to
    /// create one file: one header, every record whole.
    #[test]
    fn concurrent_writers_share_one_file() {
        let dir = std::env::temp_dir().join(format!("simverbs-capture-ut-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("all.pcap");
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut f = open_shared(&path).unwrap();
                    for i in 0..50u8 {
                        let frame = vec![t; 20 + usize::from(i)];
                        f.write_all(&pcap_record(&frame, (1, 0))).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let b = std::fs::read(&path).unwrap();
        assert_eq!(&b[..24], &global_header());
        let (mut at, mut n) = (24, 0);
        while at < b.len() {
            let len = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
            let body = &b[at + 16 + 16..at + 16 + len];
            assert!(body.iter().all(|&x| x == body[0]), "interleaved record");
            at += 16 + len;
            n += 1;
        }
        assert_eq!((at, n), (b.len(), 400));
        let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(leftovers.len(), 1, "temporary header files removed");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
