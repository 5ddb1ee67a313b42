//! Client requests as ibacm hands them to `resolve()` / `query()`, built by the core's one
//! builder (`acm_core_nostd::wire::client::ClientRequest`) into the plugin's `acm_msg`, and
//! accessors for the answers.

use acm_core_nostd::wire::client::{ClientRequest, EpInfoType, PathQuery, EP_FLAG_DEST};
use acm_core_nostd::wire::gid::Gid;
use acm_core_nostd::wire::path_record::PathRecord;
use acmrs::ffi::AcmMsg;

/// A PATH request (`ACM_EP_INFO_PATH`, one entry, 88 bytes) for a PathRecord that sets only
/// what `ib_acme -f l` / `-f g` and the kernel set: DLID and SLID or DGID, and the
/// `reversible_numpath` byte. `flags` go into the entry (`ACM_FLAGS_NODELAY`,
/// `ACM_FLAGS_QUERY_SA`, `ACM_EP_FLAG_DEST`).
#[derive(Clone, Copy, Debug)]
pub struct PathRequest {
    /// `hdr.tid`.
    pub tid: u64,
    /// Destination LID (0 = not set).
    pub dlid: u16,
    /// Source LID (0 = not set).
    pub slid: u16,
    /// Destination GID (`None` = not set).
    pub dgid: Option<[u8; 16]>,
    /// The `reversible_numpath` byte (bit 7 reversible, low 7 bits NumbPath).
    pub reversible_numpath: u8,
    /// Entry flags.
    pub flags: u32,
}

impl PathRequest {
    /// A request for `dlid` (`dgid` if given), NumbPath 1, not reversible, no flags.
    pub fn new(tid: u64, dlid: u16, dgid: Option<[u8; 16]>) -> Self {
        PathRequest {
            tid,
            dlid,
            slid: 0,
            dgid,
            reversible_numpath: 1,
            flags: 0,
        }
    }

    /// The message.
    pub fn msg(&self) -> AcmMsg {
        let q = PathQuery {
            dlid: self.dlid,
            slid: self.slid,
            dgid: self.dgid.map(Gid),
            reversible_numpath: self.reversible_numpath,
        };
        to_ffi(&ClientRequest::path(self.tid, self.flags, &q))
    }
}

/// A PATH request for `dlid` or `dgid` with `flags | ACM_EP_FLAG_DEST`, NumbPath 1 (what the
/// plugin tests send).
pub fn path_request(tid: u64, dlid: u16, dgid: Option<[u8; 16]>, flags: u32) -> AcmMsg {
    PathRequest {
        flags: flags | EP_FLAG_DEST,
        ..PathRequest::new(tid, dlid, dgid)
    }
    .msg()
}

/// A destination request as the core hands it over after `acm_svr_verify_resolve`: the
/// source entry first (`src_out` set, `src_index` 0), the destination second (`dst_index` 1,
/// with `flags`). Addresses are `(ACM_ADDRESS_* type, bytes)`, zero-padded to 64.
pub fn dest_request(tid: u64, src: (u16, &[u8]), dst: (u16, &[u8]), flags: u32) -> AcmMsg {
    to_ffi(
        &ClientRequest::resolve(tid)
            .source(EpInfoType::from(src.0), src.1)
            .dest(flags, EpInfoType::from(dst.0), dst.1),
    )
}

/// The plugin's `acm_msg` holding the core builder's bytes.
fn to_ffi(r: &ClientRequest) -> AcmMsg {
    let mut m = AcmMsg::zeroed();
    m.as_bytes_mut().copy_from_slice(r.buf());
    m
}

/// A GID on prefix `prefix` (8 bytes) with interface id `guid`.
pub fn gid(prefix: [u8; 8], guid: u64) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&prefix);
    g[8..].copy_from_slice(&guid.to_be_bytes());
    g
}

/// The PathRecord of entry 0 of an answer.
pub fn path_of(m: &AcmMsg) -> [u8; 64] {
    m.resolve_data[0].info.bytes
}

/// The DLID of entry 0's PathRecord.
pub fn dlid_of(m: &AcmMsg) -> u16 {
    let p = path_of(m);
    PathRecord::new_unchecked(&p[..]).dlid()
}

/// The SLID of entry 0's PathRecord.
pub fn slid_of(m: &AcmMsg) -> u16 {
    let p = path_of(m);
    PathRecord::new_unchecked(&p[..]).slid()
}

/// The SL of entry 0's PathRecord.
pub fn sl_of(m: &AcmMsg) -> u8 {
    let p = path_of(m);
    PathRecord::new_unchecked(&p[..]).sl()
}

/// The DGID of entry 0's PathRecord.
pub fn dgid_of(m: &AcmMsg) -> [u8; 16] {
    let p = path_of(m);
    PathRecord::new_unchecked(&p[..]).dgid().0
}

#[cfg(test)]
mod tests {
    use super::*;
    use acm_core_nostd::wire::client::{AcmMsg as MsgView, EP_FLAG_SOURCE, FLAGS_NODELAY};

    #[test]
    fn path_request_bytes() {
        let m = path_request(0x55, 5, None, FLAGS_NODELAY);
        let b = m.as_bytes();
        assert_eq!((b[0], b[1], u16::from_ne_bytes([b[6], b[7]])), (1, 1, 88));
        assert_eq!(m.hdr.tid, 0x55);
        assert_eq!(m.resolve_data[0].type_, 0x10);
        assert_eq!(m.resolve_data[0].flags, FLAGS_NODELAY | EP_FLAG_DEST);
        let r = &m.resolve_data[0].info.bytes;
        assert_eq!(&r[40..42], &5u16.to_be_bytes());
        assert_eq!(r[49], 1);
        let v = MsgView::new_checked(&b[..88]).unwrap();
        assert!(v.check_resolve().unwrap().is_path);
        let g = gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0], 0x1009);
        let m = PathRequest {
            slid: 7,
            reversible_numpath: 0x81,
            ..PathRequest::new(1, 0, Some(g))
        }
        .msg();
        let r = &m.resolve_data[0].info.bytes;
        assert_eq!(&r[8..24], &g);
        assert_eq!((&r[42..44], r[49]), (&7u16.to_be_bytes()[..], 0x81));
        assert_eq!(dgid_of(&m), g);
    }

    #[test]
    fn dest_request_bytes() {
        let m = dest_request(9, (1, b"node7"), (2, &[10, 0, 0, 9]), FLAGS_NODELAY);
        assert_eq!(m.hdr.length, 160);
        assert_eq!(m.hdr.data, [1, 0, 1]);
        assert_eq!(
            (m.resolve_data[0].type_, m.resolve_data[0].flags),
            (1, EP_FLAG_SOURCE)
        );
        assert_eq!(&m.resolve_data[0].info.bytes[..5], b"node7");
        assert_eq!(
            (m.resolve_data[1].type_, m.resolve_data[1].flags),
            (2, EP_FLAG_DEST | FLAGS_NODELAY)
        );
        assert_eq!(&m.resolve_data[1].info.bytes[..4], &[10, 0, 0, 9]);
        let v = MsgView::new_checked(&m.as_bytes()[..160]).unwrap();
        let l = v.check_resolve().unwrap();
        assert_eq!((l.source, l.dest, l.is_path), (Some(0), 1, false));
    }
}
