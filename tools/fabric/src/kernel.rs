//! The kernel's side of the RDMA netlink local service, for tests: what `ib_sa` sends the
//! ibacm daemon when a kernel consumer (NFS/RDMA, iSER, SRP, Lustre, `rdma_resolve_route` of
//! a kernel ULP) needs a PathRecord and `RDMA_NL_LS` has a listener, and how it reads the
//! answer. The daemon's netlink socket is simulated by simverbs (`SIMVERBS_NETLINK_DIR`, set
//! for every daemon to its node directory); [`KernelLs`] is the other end.
//!
//! Message format (`rdma/rdma_netlink.h`, the kernel's `ib_nl_set_path_rec_attrs` and
//! `ib_nl_handle_resolve_resp`): an `nlmsghdr` of type `RDMA_NL_GET_TYPE(RDMA_NL_LS,
//! RDMA_NL_LS_OP_RESOLVE)`, an `rdma_ls_resolve_header` (device name, port, path use), then
//! attributes flagged `RDMA_NLA_F_MANDATORY`: ServiceID (u64, host order), DGID, SGID (16
//! bytes each), TClass (u8), P_Key and QoS class (u16, host order). The answer carries
//! `RDMA_NL_LS_F_ERR` on failure, else a `LS_NLA_TYPE_PATH_RECORD` attribute holding a
//! `struct ib_path_rec_data` (flags, reserved, the 64-byte PathRecord). The kernel waits
//! `sa_local_svc_timeout_ms` (default 2000) and then sends the query to the SA itself.

use crate::{Error, Result};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::path_record::{PathRecord, PathRecordRepr};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The kernel's default `sa_local_svc_timeout_ms`.
pub const SA_LOCAL_SVC_TIMEOUT: Duration = Duration::from_millis(2000);

const RDMA_NL_LS: u16 = 4;
const RDMA_NL_LS_OP_RESOLVE: u16 = 0;
const RDMA_NL_LS_F_ERR: u16 = 0x0100;
const NLM_F_REQUEST: u16 = 1;
const RDMA_NLA_F_MANDATORY: u16 = 1 << 13;
const LS_NLA_TYPE_PATH_RECORD: u16 = 1;
const LS_NLA_TYPE_SERVICE_ID: u16 = 3;
const LS_NLA_TYPE_DGID: u16 = 4;
const LS_NLA_TYPE_SGID: u16 = 5;
const LS_NLA_TYPE_TCLASS: u16 = 6;
const LS_NLA_TYPE_PKEY: u16 = 7;
const LS_NLA_TYPE_QOS_CLASS: u16 = 8;
/// `LS_RESOLVE_PATH_USE_GMP` (a reversible path is asked for) and `_UNIDIRECTIONAL`.
const PATH_USE_UNIDIRECTIONAL: u8 = 1;
const PATH_USE_GMP: u8 = 2;
const NLMSG_HDRLEN: usize = 16;
/// `NLMSG_ALIGN(sizeof(struct rdma_ls_resolve_header))`: 64 + 1 + 1 → 68.
const RESOLVE_HDR_LEN: usize = 68;

/// What a kernel consumer asks for (the fields of `ib_nl_set_path_rec_attrs` it set).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LsQuery {
    /// Source GID (always set by the kernel).
    pub sgid: Gid,
    /// Destination GID (always set).
    pub dgid: Gid,
    /// ServiceID, if the consumer gave one.
    pub service_id: Option<u64>,
    /// Traffic class, if given.
    pub tclass: Option<u8>,
    /// P_Key, if given.
    pub pkey: Option<u16>,
    /// QoS class, if given.
    pub qos_class: Option<u16>,
    /// A reversible (GMP) path: `LS_RESOLVE_PATH_USE_GMP`, else unidirectional.
    pub reversible: bool,
}

/// How the daemon answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LsAnswer {
    /// A path (`ib_path_rec_data.flags`, the record).
    Path(u32, PathRecordRepr),
    /// `RDMA_NL_LS_F_ERR`.
    Error,
    /// Nothing within the timeout: the kernel would now ask the SA itself.
    TimedOut,
}

/// The simulated kernel end of one daemon's netlink socket.
pub struct KernelLs {
    sock: UnixDatagram,
    daemon: PathBuf,
    seq: u32,
}

fn io(what: &str, e: std::io::Error) -> Error {
    Error::new(format!("kernel netlink: {what}: {e}"))
}

impl KernelLs {
    /// Binds `<dir>/kernel-nl.sock` (replacing a stale one) to talk to the daemon whose
    /// simverbs serves `<dir>/ibacm-nl.sock`.
    pub fn bind(dir: &Path) -> Result<KernelLs> {
        let me = dir.join("kernel-nl.sock");
        let _ = std::fs::remove_file(&me);
        let sock = UnixDatagram::bind(&me).map_err(|e| io(&me.display().to_string(), e))?;
        Ok(KernelLs {
            sock,
            daemon: dir.join("ibacm-nl.sock"),
            seq: 0,
        })
    }

    /// The request message for `q` with sequence number `seq` (the kernel's layout).
    pub fn request(q: &LsQuery, seq: u32) -> Vec<u8> {
        let mut b = vec![0u8; NLMSG_HDRLEN + RESOLVE_HDR_LEN];
        let ty = (RDMA_NL_LS << 10) | RDMA_NL_LS_OP_RESOLVE;
        b[4..6].copy_from_slice(&ty.to_ne_bytes());
        b[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        b[8..12].copy_from_slice(&seq.to_ne_bytes());
        let h = NLMSG_HDRLEN;
        b[h..h + 6].copy_from_slice(b"ibsim0");
        b[h + 64] = 1;
        b[h + 65] = if q.reversible {
            PATH_USE_GMP
        } else {
            PATH_USE_UNIDIRECTIONAL
        };
        let mut attr = |ty: u16, data: &[u8]| {
            let len = 4 + data.len();
            b.extend_from_slice(&(len as u16).to_ne_bytes());
            b.extend_from_slice(&(ty | RDMA_NLA_F_MANDATORY).to_ne_bytes());
            b.extend_from_slice(data);
            b.resize(b.len().next_multiple_of(4), 0);
        };
        if let Some(sid) = q.service_id {
            attr(LS_NLA_TYPE_SERVICE_ID, &sid.to_ne_bytes());
        }
        attr(LS_NLA_TYPE_DGID, &q.dgid.0);
        attr(LS_NLA_TYPE_SGID, &q.sgid.0);
        if let Some(t) = q.tclass {
            attr(LS_NLA_TYPE_TCLASS, &[t]);
        }
        if let Some(p) = q.pkey {
            attr(LS_NLA_TYPE_PKEY, &p.to_ne_bytes());
        }
        if let Some(c) = q.qos_class {
            attr(LS_NLA_TYPE_QOS_CLASS, &c.to_ne_bytes());
        }
        let len = b.len() as u32;
        b[0..4].copy_from_slice(&len.to_ne_bytes());
        b
    }

    /// Parses an answer to request `seq` (`None`: not an answer to it).
    pub fn parse_answer(m: &[u8], seq: u32) -> Option<LsAnswer> {
        if m.len() < NLMSG_HDRLEN {
            return None;
        }
        let u16_at = |i: usize| u16::from_ne_bytes([m[i], m[i + 1]]);
        let len = u32::from_ne_bytes(m[0..4].try_into().ok()?) as usize;
        let got_seq = u32::from_ne_bytes(m[8..12].try_into().ok()?);
        if got_seq != seq || len > m.len() || len < NLMSG_HDRLEN {
            return None;
        }
        if u16_at(4) != (RDMA_NL_LS << 10) | RDMA_NL_LS_OP_RESOLVE {
            return None;
        }
        if u16_at(6) & RDMA_NL_LS_F_ERR != 0 {
            return Some(LsAnswer::Error);
        }
        let mut at = NLMSG_HDRLEN;
        while at + 4 <= len {
            let alen = usize::from(u16_at(at));
            if alen < 4 || at + alen > len {
                break;
            }
            if u16_at(at + 2) & !RDMA_NLA_F_MANDATORY == LS_NLA_TYPE_PATH_RECORD && alen >= 4 + 72 {
                let d = &m[at + 4..at + alen];
                let flags = u32::from_ne_bytes(d[0..4].try_into().ok()?);
                let rec = PathRecordRepr::parse(&PathRecord::new_checked(&d[8..72]).ok()?).ok()?;
                return Some(LsAnswer::Path(flags, rec));
            }
            at += alen.next_multiple_of(4);
        }
        Some(LsAnswer::Error)
    }

    /// Sends `q` to the daemon and waits up to `timeout` (the kernel's
    /// `sa_local_svc_timeout_ms`, [`SA_LOCAL_SVC_TIMEOUT`]) for its answer.
    pub fn resolve(&mut self, q: &LsQuery, timeout: Duration) -> Result<LsAnswer> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let msg = Self::request(q, seq);
        self.sock
            .send_to(&msg, &self.daemon)
            .map_err(|e| io(&format!("send to {}", self.daemon.display()), e))?;
        let end = Instant::now() + timeout;
        let mut buf = [0u8; 4096];
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(LsAnswer::TimedOut);
            }
            self.sock
                .set_read_timeout(Some(left))
                .map_err(|e| io("timeout", e))?;
            match self.sock.recv(&mut buf) {
                Ok(n) => {
                    if let Some(a) = Self::parse_answer(&buf[..n], seq) {
                        return Ok(a);
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(LsAnswer::TimedOut)
                }
                Err(e) => return Err(io("recv", e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_has_the_kernels_layout() {
        let q = LsQuery {
            sgid: Gid::from_parts(0xfe80_0000_0000_0000, 0x10),
            dgid: Gid::from_parts(0xfe80_0000_0000_0000, 0x20),
            service_id: Some(0x1060cbc),
            pkey: Some(0xffff),
            reversible: true,
            ..LsQuery::default()
        };
        let m = KernelLs::request(&q, 7);
        assert_eq!(m.len() % 4, 0);
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 4 << 10);
        assert_eq!(m[16 + 65], PATH_USE_GMP);
        // First attribute: ServiceID, mandatory, 12 bytes, host order.
        let a = 16 + 68;
        assert_eq!(u16::from_ne_bytes([m[a], m[a + 1]]), 12);
        assert_eq!(u16::from_ne_bytes([m[a + 2], m[a + 3]]), 3 | (1 << 13));
        assert_eq!(&m[a + 4..a + 12], &0x1060cbcu64.to_ne_bytes());
        // An answer with a path, and an error answer.
        let mut ans = vec![0u8; 16 + 4 + 72];
        let n = ans.len() as u32;
        ans[0..4].copy_from_slice(&n.to_ne_bytes());
        ans[4..6].copy_from_slice(&(4u16 << 10).to_ne_bytes());
        ans[8..12].copy_from_slice(&7u32.to_ne_bytes());
        ans[16..18].copy_from_slice(&76u16.to_ne_bytes());
        ans[18..20].copy_from_slice(&1u16.to_ne_bytes());
        ans[20..24].copy_from_slice(&3u32.to_ne_bytes());
        let mut p = PathRecordRepr::ZERO;
        p.dgid = q.dgid;
        p.sl = 5;
        p.emit(&mut PathRecord::new_unchecked(&mut ans[28..92]));
        match KernelLs::parse_answer(&ans, 7) {
            Some(LsAnswer::Path(3, r)) => assert_eq!((r.dgid, r.sl), (q.dgid, 5)),
            other => panic!("{other:?}"),
        }
        assert_eq!(KernelLs::parse_answer(&ans, 8), None);
        ans[6..8].copy_from_slice(&RDMA_NL_LS_F_ERR.to_ne_bytes());
        assert_eq!(KernelLs::parse_answer(&ans, 7), Some(LsAnswer::Error));
    }
}
