//! The ibacm client protocol (`<infiniband/acm.h>`): `struct acm_msg` (≤ 592 bytes) made of a
//! 16-byte `acm_hdr` and up to eight 72-byte `acm_ep_addr_data` entries.
//!
//! ```text
//! acm_hdr:          0 version  1 opcode  2 status  3 data[0]=src_out  4 src_index  5 dst_index
//!                   6 length (u16)       8 tid (u64)
//! acm_ep_addr_data: 0 flags (u32)  4 type (u16)  6 reserved (u16)  8 info (64: address,
//!                   name, or a network-order PathRecord)
//! ```
//!
//! **Byte order.** RESOLVE messages are in the *host* byte order of the machine running the
//! ibacm core (`hdr.length`, `flags`, `type`, `tid`); only the 64-byte `info` payload is network
//! order. The provider always runs in the same process as the core, so the plain accessors
//! ([`AcmMsg::length`], [`EpAddrData::flags`], ...) use **native** byte order. PERF_QUERY and
//! EP_QUERY messages carry a **big-endian** length: use [`AcmMsg::length_be`] for them. (On
//! x86-64 hosts "native" is little-endian, which is what captured RESOLVE messages contain.)
//! `tid` is opaque (for kernel requests a pointer): copy it, never interpret it.

use super::gid::Gid;
use super::path_record::{PathRecord, PathRecordRepr, PATH_RECORD_LEN};
use super::{array, be16, be64, enum_with_unknown, put_be16, put_be64, view, Error, Result};

/// `ACM_VERSION`.
pub const ACM_VERSION: u8 = 1;
/// `ACM_MSG_HDR_LENGTH`.
pub const HDR_LEN: usize = 16;
/// `ACM_MSG_EP_LENGTH`.
pub const EP_LEN: usize = 72;
/// `ACM_MAX_ADDRESS`: bytes of an address / name / path in an entry.
pub const MAX_ADDRESS: usize = 64;
/// Maximum number of entries in a message (`ACM_MSG_DATA_LENGTH / ACM_MSG_EP_LENGTH`).
pub const MAX_ENTRIES: usize = 8;
/// `sizeof(struct acm_msg)`.
pub const MSG_LEN: usize = HDR_LEN + MAX_ENTRIES * EP_LEN;

/// `ACM_OP_MASK`: the opcode bits of `hdr.opcode`.
pub const OP_MASK: u8 = 0x0f;
/// `ACM_OP_ACK`: set on responses.
pub const OP_ACK: u8 = 0x80;

/// `ACM_FLAGS_QUERY_SA`: in `resolve_data[0].flags` of a PATH request, do a raw SA query.
pub const FLAGS_QUERY_SA: u32 = 1 << 31;
/// `ACM_FLAGS_NODELAY`: answer from cache only (ENODATA on a miss).
pub const FLAGS_NODELAY: u32 = 1 << 30;
/// `ACM_EP_FLAG_SOURCE`: the entry is the source address.
pub const EP_FLAG_SOURCE: u32 = 1 << 0;
/// `ACM_EP_FLAG_DEST`: the entry is the destination address.
pub const EP_FLAG_DEST: u32 = 1 << 1;

/// `IBV_PATH_FLAG_GMP`.
pub const PATH_FLAG_GMP: u32 = 1 << 0;
/// `IBV_PATH_FLAG_PRIMARY`.
pub const PATH_FLAG_PRIMARY: u32 = 1 << 1;
/// `IBV_PATH_FLAG_ALTERNATE`.
pub const PATH_FLAG_ALTERNATE: u32 = 1 << 2;
/// `IBV_PATH_FLAG_OUTBOUND`.
pub const PATH_FLAG_OUTBOUND: u32 = 1 << 3;
/// `IBV_PATH_FLAG_INBOUND`.
pub const PATH_FLAG_INBOUND: u32 = 1 << 4;
/// `IBV_PATH_FLAG_INBOUND_REVERSE`.
pub const PATH_FLAG_INBOUND_REVERSE: u32 = 1 << 5;
/// `IBV_PATH_FLAG_BIDIRECTIONAL` = OUTBOUND | INBOUND_REVERSE.
pub const PATH_FLAG_BIDIRECTIONAL: u32 = PATH_FLAG_OUTBOUND | PATH_FLAG_INBOUND_REVERSE;
/// Flags of the path entry in a successful resolve response: GMP|PRIMARY|BIDIRECTIONAL = 0x2B.
pub const RESPONSE_PATH_FLAGS: u32 = PATH_FLAG_GMP | PATH_FLAG_PRIMARY | PATH_FLAG_BIDIRECTIONAL;

/// Number of per-EP counters (`ACM_MAX_COUNTER`).
pub const MAX_COUNTER: usize = 7;
/// Counter names in `ACM_CNTR_*` order (as `ib_acme -P` labels them).
pub const COUNTER_NAMES: [&str; MAX_COUNTER] = [
    "Error Count",
    "Resolve Count",
    "No Data",
    "Addr Query Count",
    "Addr Cache Count",
    "Route Query Count",
    "Route Cache Count",
];

enum_with_unknown! {
    /// `hdr.opcode & ACM_OP_MASK`.
    pub enum Opcode(u8) {
        /// `ACM_OP_RESOLVE`.
        Resolve = 0x01,
        /// `ACM_OP_PERF_QUERY`.
        PerfQuery = 0x02,
        /// `ACM_OP_EP_QUERY`.
        EpQuery = 0x03,
    }
}

enum_with_unknown! {
    /// `hdr.status` (`ACM_STATUS_*`; acmp also passes SA class status bytes through).
    pub enum Status(u8) {
        /// `ACM_STATUS_SUCCESS`.
        Success = 0,
        /// `ACM_STATUS_ENOMEM`.
        Enomem = 1,
        /// `ACM_STATUS_EINVAL`.
        Einval = 2,
        /// `ACM_STATUS_ENODATA`.
        Enodata = 3,
        /// `ACM_STATUS_ENOTCONN`.
        Enotconn = 5,
        /// `ACM_STATUS_ETIMEDOUT`.
        Etimedout = 6,
        /// `ACM_STATUS_ESRCADDR`.
        Esrcaddr = 7,
        /// `ACM_STATUS_ESRCTYPE`.
        Esrctype = 8,
        /// `ACM_STATUS_EDESTADDR`.
        Edestaddr = 9,
        /// `ACM_STATUS_EDESTTYPE`.
        Edesttype = 10,
    }
}

enum_with_unknown! {
    /// `acm_ep_addr_data.type` (`ACM_EP_INFO_*`; the core also uses GID 4 and LID 5 internally).
    pub enum EpInfoType(u16) {
        /// `ACM_EP_INFO_NAME`: NUL-padded host name.
        Name = 0x0001,
        /// `ACM_EP_INFO_ADDRESS_IP`: 4-byte IPv4 address.
        AddressIp = 0x0002,
        /// `ACM_EP_INFO_ADDRESS_IP6`: 16-byte IPv6 address.
        AddressIp6 = 0x0003,
        /// `ACM_ADDRESS_GID` (core-internal).
        Gid = 0x0004,
        /// `ACM_ADDRESS_LID` (core-internal).
        Lid = 0x0005,
        /// `ACM_EP_INFO_PATH`: a PathRecord.
        Path = 0x0010,
    }
}

mod hfield {
    use crate::wire::Field;
    pub const VERSION: usize = 0;
    pub const OPCODE: usize = 1;
    pub const STATUS: usize = 2;
    pub const SRC_OUT: usize = 3;
    pub const SRC_INDEX: usize = 4;
    pub const DST_INDEX: usize = 5;
    pub const LENGTH: Field = 6..8;
    pub const TID: Field = 8..16;
}

mod efield {
    use crate::wire::Field;
    pub const FLAGS: Field = 0..4;
    pub const TYPE: Field = 4..6;
    pub const RESERVED: Field = 6..8;
    pub const INFO: Field = 8..72;
}

fn ne16(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}
fn ne32(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

view! {
    /// A view of one 72-byte `acm_ep_addr_data` entry.
    pub struct EpAddrData(len = EP_LEN);
    /// Wraps a buffer and checks that it holds a whole entry.
    fn new_checked;
    /// Checks the length; after success no accessor panics.
    fn check_len;
}

impl<T: AsRef<[u8]>> EpAddrData<T> {
    /// Flags (native byte order): `ACM_EP_FLAG_*`, `IBV_PATH_FLAG_*`, `ACM_FLAGS_*`.
    pub fn flags(&self) -> u32 {
        ne32(self.b(), efield::FLAGS.start)
    }
    /// Entry type (native byte order).
    pub fn info_type(&self) -> EpInfoType {
        EpInfoType::from(ne16(self.b(), efield::TYPE.start))
    }
    /// Reserved 16 bits (native byte order).
    pub fn reserved(&self) -> u16 {
        ne16(self.b(), efield::RESERVED.start)
    }
    /// The 64-byte `info` union (address, name, or network-order PathRecord).
    pub fn info(&self) -> &[u8] {
        &self.b()[efield::INFO]
    }
    /// The `info` union read as a GID (`ACM_EP_INFO_GID`).
    pub fn info_gid(&self) -> Gid {
        Gid(array(self.b(), efield::INFO.start))
    }
    /// The `info` union read as a LID (`ACM_EP_INFO_LID`: network byte order, its first two
    /// bytes).
    pub fn info_lid(&self) -> u16 {
        be16(self.b(), efield::INFO.start)
    }
    /// The `info` union read as a PathRecord.
    pub fn path(&self) -> PathRecordRepr {
        // INFO is exactly PATH_RECORD_LEN bytes, so this cannot fail after check_len.
        PathRecordRepr::parse_bytes(self.info()).unwrap_or(PathRecordRepr::ZERO)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EpAddrData<T> {
    /// Sets the flags (native byte order).
    pub fn set_flags(&mut self, v: u32) {
        self.bm()[efield::FLAGS].copy_from_slice(&v.to_ne_bytes())
    }
    /// Sets the entry type (native byte order).
    pub fn set_info_type(&mut self, v: EpInfoType) {
        self.bm()[efield::TYPE].copy_from_slice(&u16::from(v).to_ne_bytes())
    }
    /// Sets the reserved field.
    pub fn set_reserved(&mut self, v: u16) {
        self.bm()[efield::RESERVED].copy_from_slice(&v.to_ne_bytes())
    }
    /// Mutable access to the 64-byte `info` union.
    pub fn info_mut(&mut self) -> &mut [u8] {
        &mut self.bm()[efield::INFO]
    }
}

/// A parsed `acm_ep_addr_data` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EpAddrDataRepr {
    /// Flags.
    pub flags: u32,
    /// Entry type.
    pub info_type: EpInfoType,
    /// The 64 info bytes, verbatim.
    pub info: [u8; MAX_ADDRESS],
}

impl EpAddrDataRepr {
    /// An all-zero entry.
    pub const ZERO: EpAddrDataRepr = EpAddrDataRepr {
        flags: 0,
        info_type: EpInfoType::Unknown(0),
        info: [0; MAX_ADDRESS],
    };

    /// A PATH entry carrying `path`.
    pub fn path(flags: u32, path: &PathRecordRepr) -> EpAddrDataRepr {
        EpAddrDataRepr {
            flags,
            info_type: EpInfoType::Path,
            info: path.to_bytes(),
        }
    }

    /// Parses an entry (the reserved field is ignored).
    pub fn parse<T: AsRef<[u8]>>(e: &EpAddrData<T>) -> Result<EpAddrDataRepr> {
        e.check_len()?;
        Ok(EpAddrDataRepr {
            flags: e.flags(),
            info_type: e.info_type(),
            info: array(e.buffer.as_ref(), efield::INFO.start),
        })
    }
    /// Bytes needed by [`emit`](Self::emit).
    pub const fn buffer_len(&self) -> usize {
        EP_LEN
    }
    /// Writes the entry (reserved = 0). The buffer must be ≥ 72 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, e: &mut EpAddrData<T>) {
        e.set_flags(self.flags);
        e.set_info_type(self.info_type);
        e.set_reserved(0);
        e.info_mut().copy_from_slice(&self.info);
    }
}

view! {
    /// A view of an `acm_msg` (header plus up to 8 entries).
    pub struct AcmMsg(len = HDR_LEN);
    /// Wraps a buffer and checks that it holds at least a header.
    fn new_checked;
    /// Checks that the buffer holds the 16-byte header; after success the header accessors
    /// do not panic, and [`entry`](Self::entry) returns `None` for slots past the buffer.
    fn check_len;
}

/// Which entries of a RESOLVE request matter, after [`AcmMsg::check_resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolveLayout {
    /// Number of entries covered by `hdr.length`.
    pub count: usize,
    /// True if `resolve_data[0]` is a PATH entry (a path request).
    pub is_path: bool,
    /// Index of the source entry to echo back, if `src_out` is set. It may equal `count`:
    /// the core writes the source it selected into the slot after the last entry without
    /// growing `length`.
    pub source: Option<usize>,
    /// Index of the destination entry (0 for path requests).
    pub dest: usize,
}

impl<T: AsRef<[u8]>> AcmMsg<T> {
    /// `hdr.version`.
    pub fn version(&self) -> u8 {
        self.b()[hfield::VERSION]
    }
    /// `hdr.opcode` as on the wire (with the ACK bit).
    pub fn opcode_raw(&self) -> u8 {
        self.b()[hfield::OPCODE]
    }
    /// `hdr.opcode & ACM_OP_MASK`.
    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.opcode_raw() & OP_MASK)
    }
    /// True if `ACM_OP_ACK` is set.
    pub fn is_ack(&self) -> bool {
        self.opcode_raw() & OP_ACK != 0
    }
    /// `hdr.status`.
    pub fn status(&self) -> Status {
        Status::from(self.b()[hfield::STATUS])
    }
    /// `hdr.data[0]` (`src_out`; the counter count in a PERF_QUERY response).
    pub fn src_out(&self) -> u8 {
        self.b()[hfield::SRC_OUT]
    }
    /// `hdr.data[1]` (`src_index`).
    pub fn src_index(&self) -> u8 {
        self.b()[hfield::SRC_INDEX]
    }
    /// `hdr.data[2]` (`dst_index`).
    pub fn dst_index(&self) -> u8 {
        self.b()[hfield::DST_INDEX]
    }
    /// `hdr.length` in native byte order (RESOLVE).
    pub fn length(&self) -> u16 {
        ne16(self.b(), hfield::LENGTH.start)
    }
    /// `hdr.length` read big-endian (PERF_QUERY, EP_QUERY).
    pub fn length_be(&self) -> u16 {
        be16(self.b(), hfield::LENGTH.start)
    }
    /// `hdr.tid` in native byte order (opaque: copy it unchanged into the response).
    pub fn tid(&self) -> u64 {
        u64::from_ne_bytes(array(self.b(), hfield::TID.start))
    }
    /// The 16 header bytes.
    pub fn header_bytes(&self) -> &[u8] {
        &self.b()[..HDR_LEN]
    }
    /// Entry `i` if the buffer holds it (regardless of `hdr.length`).
    pub fn entry(&self, i: usize) -> Option<EpAddrData<&[u8]>> {
        let start = HDR_LEN.checked_add(i.checked_mul(EP_LEN)?)?;
        let bytes = self.b().get(start..start + EP_LEN)?;
        Some(EpAddrData::new_unchecked(bytes))
    }
    /// `perf_data[i]` read big-endian (PERF_QUERY response).
    pub fn perf_counter(&self, i: usize) -> Option<u64> {
        let at = HDR_LEN.checked_add(i.checked_mul(8)?)?;
        let bytes = self.b().get(at..at + 8)?;
        Some(be64(bytes, 0))
    }

    /// Number of entries covered by a native-order `hdr.length`, after checking it:
    /// 16 ≤ length ≤ 592, (length − 16) a multiple of 72, and the buffer holds `length` bytes.
    pub fn entry_count(&self) -> Result<usize> {
        check_len_field(self.length() as usize, self.b().len())
    }

    /// Validates a RESOLVE request as the provider receives it and says where its entries are.
    ///
    /// Checks the length ([`entry_count`](Self::entry_count)), at least one entry, the version,
    /// and the header indices: `dst_index < count` for destination requests, and when
    /// `src_out` is set, `src_index ≤ count` and `< 8` (see [`ResolveLayout::source`]) with the
    /// buffer holding that slot.
    pub fn check_resolve(&self) -> Result<ResolveLayout> {
        self.check_len()?;
        if self.version() != ACM_VERSION || self.opcode() != Opcode::Resolve {
            return Err(Error::Malformed);
        }
        let count = self.entry_count()?;
        if count == 0 {
            return Err(Error::Malformed);
        }
        let first = self.entry(0).ok_or(Error::Truncated)?;
        let is_path = first.info_type() == EpInfoType::Path;
        let dest = if is_path {
            0
        } else {
            let d = self.dst_index() as usize;
            if d >= count {
                return Err(Error::Malformed);
            }
            d
        };
        let source = if self.src_out() != 0 {
            let s = self.src_index() as usize;
            if s > count || s >= MAX_ENTRIES {
                return Err(Error::Malformed);
            }
            if self.entry(s).is_none() {
                return Err(Error::Truncated);
            }
            Some(s)
        } else {
            None
        };
        Ok(ResolveLayout {
            count,
            is_path,
            source,
            dest,
        })
    }
}

fn check_len_field(length: usize, buffer_len: usize) -> Result<usize> {
    if !(HDR_LEN..=MSG_LEN).contains(&length) || (length - HDR_LEN) % EP_LEN != 0 {
        return Err(Error::Malformed);
    }
    if buffer_len < length {
        return Err(Error::Truncated);
    }
    Ok((length - HDR_LEN) / EP_LEN)
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AcmMsg<T> {
    /// Sets `hdr.version`.
    pub fn set_version(&mut self, v: u8) {
        self.bm()[hfield::VERSION] = v
    }
    /// Sets `hdr.opcode` (raw, including the ACK bit).
    pub fn set_opcode_raw(&mut self, v: u8) {
        self.bm()[hfield::OPCODE] = v
    }
    /// Sets `ACM_OP_ACK` in `hdr.opcode`, the opcode bits as they were.
    pub fn set_ack(&mut self) {
        self.bm()[hfield::OPCODE] |= OP_ACK
    }
    /// Sets `hdr.status`.
    pub fn set_status(&mut self, v: Status) {
        self.bm()[hfield::STATUS] = v.into()
    }
    /// Sets `hdr.data[0]` (`src_out`).
    pub fn set_src_out(&mut self, v: u8) {
        self.bm()[hfield::SRC_OUT] = v
    }
    /// Sets `hdr.data[1]` (`src_index`).
    pub fn set_src_index(&mut self, v: u8) {
        self.bm()[hfield::SRC_INDEX] = v
    }
    /// Sets `hdr.data[2]` (`dst_index`).
    pub fn set_dst_index(&mut self, v: u8) {
        self.bm()[hfield::DST_INDEX] = v
    }
    /// Sets `hdr.length` in native byte order (RESOLVE).
    pub fn set_length(&mut self, v: u16) {
        self.bm()[hfield::LENGTH].copy_from_slice(&v.to_ne_bytes())
    }
    /// Sets `hdr.length` big-endian (PERF_QUERY, EP_QUERY).
    pub fn set_length_be(&mut self, v: u16) {
        put_be16(self.bm(), hfield::LENGTH.start, v)
    }
    /// Sets `hdr.tid` in native byte order.
    pub fn set_tid(&mut self, v: u64) {
        self.bm()[hfield::TID].copy_from_slice(&v.to_ne_bytes())
    }
    /// Mutable entry `i` if the buffer holds it.
    pub fn entry_mut(&mut self, i: usize) -> Option<EpAddrData<&mut [u8]>> {
        let start = HDR_LEN.checked_add(i.checked_mul(EP_LEN)?)?;
        let bytes = self.bm().get_mut(start..start + EP_LEN)?;
        Some(EpAddrData::new_unchecked(bytes))
    }
    /// Writes `perf_data[i]` big-endian; `false` if the buffer is too short.
    pub fn set_perf_counter(&mut self, i: usize, v: u64) -> bool {
        let Some(at) = i.checked_mul(8).and_then(|x| x.checked_add(HDR_LEN)) else {
            return false;
        };
        match self.bm().get_mut(at..at + 8) {
            Some(bytes) => {
                put_be64(bytes, 0, v);
                true
            }
            None => false,
        }
    }
}

/// The 16-byte `acm_hdr` view: an [`AcmMsg`] needs only the header bytes for its header
/// accessors, so the same type serves (`AcmHdr::new_checked(&buf[..16])`).
pub type AcmHdr<T> = AcmMsg<T>;

/// A parsed `acm_hdr`. `length` and `tid` are in native byte order (RESOLVE); for PERF_QUERY /
/// EP_QUERY messages use [`AcmMsg::length_be`] instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AcmHdrRepr {
    /// `version`.
    pub version: u8,
    /// `opcode`, raw (ACK bit included).
    pub opcode: u8,
    /// `status`.
    pub status: Status,
    /// `data[0..3]`: src_out, src_index, dst_index.
    pub data: [u8; 3],
    /// `length` (native byte order).
    pub length: u16,
    /// `tid` (native byte order, opaque).
    pub tid: u64,
}

impl AcmHdrRepr {
    /// Parses the header (no check of `length` against the buffer).
    pub fn parse<T: AsRef<[u8]>>(h: &AcmHdr<T>) -> Result<AcmHdrRepr> {
        h.check_len()?;
        Ok(AcmHdrRepr {
            version: h.version(),
            opcode: h.opcode_raw(),
            status: h.status(),
            data: [h.src_out(), h.src_index(), h.dst_index()],
            length: h.length(),
            tid: h.tid(),
        })
    }
    /// Bytes needed by [`emit`](Self::emit).
    pub const fn buffer_len(&self) -> usize {
        HDR_LEN
    }
    /// Writes the header. The buffer must be ≥ 16 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AcmHdr<T>) {
        h.set_version(self.version);
        h.set_opcode_raw(self.opcode);
        h.set_status(self.status);
        h.set_src_out(self.data[0]);
        h.set_src_index(self.data[1]);
        h.set_dst_index(self.data[2]);
        h.set_length(self.length);
        h.set_tid(self.tid);
    }
}

/// Builds a PERF_QUERY request as `ib_acme -P` sends it: `src_index = ep_index` (0 = the
/// core's global counters), big-endian length 16. Returns 16.
pub fn build_perf_request(ep_index: u8, tid: u64, out: &mut [u8]) -> Result<usize> {
    if out.len() < HDR_LEN {
        return Err(Error::Truncated);
    }
    out[..HDR_LEN].fill(0);
    let mut m = AcmMsg::new_unchecked(&mut out[..]);
    m.set_version(ACM_VERSION);
    m.set_opcode_raw(Opcode::PerfQuery.into());
    m.set_src_index(ep_index);
    m.set_length_be(HDR_LEN as u16);
    m.set_tid(tid);
    Ok(HDR_LEN)
}

/// A parsed RESOLVE message: header plus the entries `hdr.length` covers (native byte order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcmMsgRepr {
    /// `hdr.version`.
    pub version: u8,
    /// `hdr.opcode`, raw (ACK bit included).
    pub opcode: u8,
    /// `hdr.status`.
    pub status: Status,
    /// `hdr.data[0..3]`: src_out, src_index, dst_index.
    pub data: [u8; 3],
    /// `hdr.tid` (native order, opaque).
    pub tid: u64,
    /// Number of valid entries in `entries`.
    pub count: usize,
    /// The entries; only `entries[..count]` are meaningful.
    pub entries: [EpAddrDataRepr; MAX_ENTRIES],
}

impl AcmMsgRepr {
    /// Parses a native-order message; the length is checked as in
    /// [`AcmMsg::entry_count`]. The header indices are not interpreted (see
    /// [`AcmMsg::check_resolve`]).
    pub fn parse<T: AsRef<[u8]>>(m: &AcmMsg<T>) -> Result<AcmMsgRepr> {
        m.check_len()?;
        let count = m.entry_count()?;
        let mut entries = [EpAddrDataRepr::ZERO; MAX_ENTRIES];
        for (i, slot) in entries.iter_mut().enumerate().take(count) {
            *slot = EpAddrDataRepr::parse(&m.entry(i).ok_or(Error::Truncated)?)?;
        }
        Ok(AcmMsgRepr {
            version: m.version(),
            opcode: m.opcode_raw(),
            status: m.status(),
            data: [m.src_out(), m.src_index(), m.dst_index()],
            tid: m.tid(),
            count,
            entries,
        })
    }
    /// The valid entries.
    pub fn entries(&self) -> &[EpAddrDataRepr] {
        &self.entries[..self.count.min(MAX_ENTRIES)]
    }
    /// `hdr.length` of this message.
    pub fn buffer_len(&self) -> usize {
        HDR_LEN + EP_LEN * self.count.min(MAX_ENTRIES)
    }
    /// Writes the message (native order). Fails with `Malformed` if `count > 8` and with
    /// `Truncated` if the buffer is shorter than [`buffer_len`](Self::buffer_len).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut AcmMsg<T>) -> Result<usize> {
        if self.count > MAX_ENTRIES {
            return Err(Error::Malformed);
        }
        let len = self.buffer_len();
        if m.buffer.as_ref().len() < len {
            return Err(Error::Truncated);
        }
        m.set_version(self.version);
        m.set_opcode_raw(self.opcode);
        m.set_status(self.status);
        m.set_src_out(self.data[0]);
        m.set_src_index(self.data[1]);
        m.set_dst_index(self.data[2]);
        m.set_length(len as u16);
        m.set_tid(self.tid);
        for (i, e) in self.entries().iter().enumerate() {
            let mut view = m.entry_mut(i).ok_or(Error::Truncated)?;
            e.emit(&mut view);
        }
        Ok(len)
    }
}

/// Builds the provider's success response to a RESOLVE request into `out`.
///
/// Layout (as acmp writes it and librdmacm / libacm / the kernel need it): the request header
/// with `status = 0`, `data[0..3] = 0` and the same `tid`; entry 0 = PATH entry with flags
/// [`RESPONSE_PATH_FLAGS`] (0x2B) carrying `path` (the 64 PathRecord bytes as the SA sent
/// them, copied as they are: a cached record goes out without a parse and re-emit); entry 1 =
/// a verbatim copy of the source entry if the request had `src_out` set;
/// `length = 16 + 72·n`. Returns the length.
///
/// It is [`build_resolve_frame`] and then [`set_response_path`]: a caller that learns `path`
/// later (a cache lookup whose memory load is in flight) builds the frame first.
pub fn build_resolve_response<R: AsRef<[u8]>>(
    request: &AcmMsg<R>,
    path: &[u8; PATH_RECORD_LEN],
    out: &mut [u8],
) -> Result<usize> {
    let len = build_resolve_frame(request, out)?;
    set_response_path(out, path);
    Ok(len)
}

/// Everything of [`build_resolve_response`] except the 64 path bytes of entry 0 (header,
/// entry 0's flags, type and reserved word, the echoed source entry); the path bytes are
/// left as they were until [`set_response_path`] writes them. Returns the length.
pub fn build_resolve_frame<R: AsRef<[u8]>>(request: &AcmMsg<R>, out: &mut [u8]) -> Result<usize> {
    let layout = request.check_resolve()?;
    let source = match layout.source {
        Some(i) => Some(request.entry(i).ok_or(Error::Truncated)?),
        None => None,
    };
    let len = HDR_LEN + EP_LEN * (1 + usize::from(source.is_some()));
    if out.len() < len {
        return Err(Error::Truncated);
    }
    out[..HDR_LEN].copy_from_slice(request.header_bytes());
    let mut m = AcmMsg::new_unchecked(&mut out[..]);
    m.set_status(Status::Success);
    m.set_src_out(0);
    m.set_src_index(0);
    m.set_dst_index(0);
    m.set_length(len as u16);
    let mut e = m.entry_mut(0).ok_or(Error::Truncated)?;
    e.set_flags(RESPONSE_PATH_FLAGS);
    e.set_info_type(EpInfoType::Path);
    e.set_reserved(0);
    if let Some(src) = source {
        let dst = m.entry_mut(1).ok_or(Error::Truncated)?;
        dst.into_inner()
            .copy_from_slice(&src.into_inner()[..EP_LEN]);
    }
    Ok(len)
}

/// Writes `path` into entry 0 of a frame [`build_resolve_frame`] built in `out` (a no-op on a
/// buffer too short to hold entry 0, which the frame builder has already refused).
#[inline]
pub fn set_response_path(out: &mut [u8], path: &[u8; PATH_RECORD_LEN]) {
    if let Some(d) = response_path_mut(out) {
        *d = *path;
    }
}

/// The 64 bytes of entry 0's path in a frame [`build_resolve_frame`] built in `out`, for a
/// caller that writes the path there itself (the cache's `lookup_into`); `None` on a buffer
/// too short to hold entry 0.
#[inline]
pub fn response_path_mut(out: &mut [u8]) -> Option<&mut [u8; PATH_RECORD_LEN]> {
    let at = HDR_LEN + efield::INFO.start;
    out.get_mut(at..at + PATH_RECORD_LEN)?.try_into().ok()
}

/// Builds an error response: the request header with `status`, `data[0..3] = 0`, the same
/// `tid`, and `length = 16`. Needs only the 16 header bytes of the request. Returns 16.
pub fn build_error_response<R: AsRef<[u8]>>(
    request: &AcmMsg<R>,
    status: Status,
    out: &mut [u8],
) -> Result<usize> {
    request.check_len()?;
    if out.len() < HDR_LEN {
        return Err(Error::Truncated);
    }
    out[..HDR_LEN].copy_from_slice(request.header_bytes());
    let mut m = AcmMsg::new_unchecked(&mut out[..]);
    m.set_status(status);
    m.set_src_out(0);
    m.set_src_index(0);
    m.set_dst_index(0);
    m.set_length(HDR_LEN as u16);
    Ok(HDR_LEN)
}

/// Builds the answer to a `query()` (`ACM_FLAGS_QUERY_SA`) PATH request: the request (88 bytes)
/// with `ACM_OP_ACK` set, `status`, and the SA's record in entry 0; flags are left as they were.
pub fn build_query_response<R: AsRef<[u8]>>(
    request: &AcmMsg<R>,
    status: Status,
    path: Option<&PathRecordRepr>,
    out: &mut [u8],
) -> Result<usize> {
    let layout = request.check_resolve()?;
    if !layout.is_path || layout.count != 1 {
        return Err(Error::Malformed);
    }
    let len = HDR_LEN + EP_LEN;
    if out.len() < len {
        return Err(Error::Truncated);
    }
    out[..len].copy_from_slice(&request.buffer.as_ref()[..len]);
    let mut m = AcmMsg::new_unchecked(&mut out[..]);
    m.set_opcode_raw(request.opcode_raw() | OP_ACK);
    m.set_status(status);
    if let Some(p) = path {
        let mut e = m.entry_mut(0).ok_or(Error::Truncated)?;
        p.emit(&mut super::path_record::PathRecord::new_unchecked(
            &mut e.info_mut()[..PATH_RECORD_LEN],
        ));
    }
    Ok(len)
}

/// A PERF_QUERY response: big-endian length, `src_out` = counter count, `perf_data` be64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerfResponseRepr {
    /// `hdr.status`.
    pub status: Status,
    /// `hdr.src_index` (the EP index asked for; 0 = global counters).
    pub ep_index: u8,
    /// `hdr.tid` (native order, opaque).
    pub tid: u64,
    /// Number of valid counters (≤ 7).
    pub count: u8,
    /// Counters in `ACM_CNTR_*` order.
    pub counters: [u64; MAX_COUNTER],
}

impl PerfResponseRepr {
    /// Parses a PERF_QUERY response (opcode PERF_QUERY, length = 16 + 8·count, count ≤ 7).
    pub fn parse<T: AsRef<[u8]>>(m: &AcmMsg<T>) -> Result<PerfResponseRepr> {
        m.check_len()?;
        if m.opcode() != Opcode::PerfQuery {
            return Err(Error::Malformed);
        }
        let count = m.src_out();
        if count as usize > MAX_COUNTER || m.length_be() as usize != HDR_LEN + 8 * count as usize {
            return Err(Error::Malformed);
        }
        let mut counters = [0u64; MAX_COUNTER];
        for (i, c) in counters.iter_mut().enumerate().take(count as usize) {
            *c = m.perf_counter(i).ok_or(Error::Truncated)?;
        }
        Ok(PerfResponseRepr {
            status: m.status(),
            ep_index: m.src_index(),
            tid: m.tid(),
            count,
            counters,
        })
    }
    /// `hdr.length` of this message.
    pub fn buffer_len(&self) -> usize {
        HDR_LEN + 8 * (self.count as usize).min(MAX_COUNTER)
    }
    /// Writes the response (opcode PERF_QUERY|ACK). Fails if `count > 7` or the buffer is short.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut AcmMsg<T>) -> Result<usize> {
        if self.count as usize > MAX_COUNTER {
            return Err(Error::Malformed);
        }
        let len = self.buffer_len();
        if m.buffer.as_ref().len() < len {
            return Err(Error::Truncated);
        }
        m.set_version(ACM_VERSION);
        m.set_opcode_raw(u8::from(Opcode::PerfQuery) | OP_ACK);
        m.set_status(self.status);
        m.set_src_out(self.count);
        m.set_src_index(self.ep_index);
        m.set_dst_index(0);
        m.set_length_be(len as u16);
        m.set_tid(self.tid);
        for (i, c) in self.counters.iter().enumerate().take(self.count as usize) {
            m.set_perf_counter(i, *c);
        }
        Ok(len)
    }
}

/// What a PATH request's PathRecord sets: what `ib_acme -f l` / `-f g` and the kernel set
/// (DLID and SLID or DGID, and the `reversible_numpath` byte); everything else is zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathQuery {
    /// Destination LID (0 = not set).
    pub dlid: u16,
    /// Source LID (0 = not set).
    pub slid: u16,
    /// Destination GID (`None` = not set).
    pub dgid: Option<Gid>,
    /// The `reversible_numpath` byte (bit 7 reversible, low 7 bits NumbPath).
    pub reversible_numpath: u8,
}

impl PathQuery {
    /// A query for `dlid` only.
    pub const fn lid(dlid: u16) -> PathQuery {
        PathQuery {
            dlid,
            slid: 0,
            dgid: None,
            reversible_numpath: 0,
        }
    }
    /// A query for `dgid` only.
    pub const fn gid(dgid: Gid) -> PathQuery {
        PathQuery {
            dlid: 0,
            slid: 0,
            dgid: Some(dgid),
            reversible_numpath: 0,
        }
    }
}

/// A client RESOLVE request as the ibacm core hands it to a provider's `resolve()` / `query()`:
/// the one builder of that byte layout (tests, the simulator, the firmware scenario, the
/// plugin's test kit), allocation-free, through the views of this module.
///
/// The header (version, `ACM_OP_RESOLVE`, length, TID) is kept up to date as entries are
/// appended, in call order; [`ClientRequest::source`] and [`ClientRequest::dest`] also set
/// `src_out`/`src_index` and `dst_index` to where their entry went, so either order can be
/// built. At most [`MAX_ENTRIES`] entries: more are ignored.
///
/// ```
/// use acm_core_nostd::wire::client::{AcmMsg, ClientRequest, EpInfoType, PathQuery};
/// let path = ClientRequest::path(7, 0, &PathQuery::lid(6));
/// assert_eq!(path.len(), 88);
/// let name = ClientRequest::resolve(8)
///     .dest(0, EpInfoType::Name, b"hca4")
///     .source(EpInfoType::Name, b"hca3");
/// let m = AcmMsg::new_checked(name.bytes()).unwrap();
/// let l = m.check_resolve().unwrap();
/// assert_eq!((l.dest, l.source, l.is_path), (0, Some(1), false));
/// ```
#[derive(Clone, Copy)]
pub struct ClientRequest {
    buf: [u8; MSG_LEN],
    entries: usize,
}

impl core::fmt::Debug for ClientRequest {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ClientRequest")
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl ClientRequest {
    /// A RESOLVE request with TID `tid` and no entry yet (16 bytes).
    pub fn resolve(tid: u64) -> ClientRequest {
        let mut r = ClientRequest {
            buf: [0; MSG_LEN],
            entries: 0,
        };
        let mut m = AcmMsg::new_unchecked(&mut r.buf[..]);
        m.set_version(ACM_VERSION);
        m.set_opcode_raw(Opcode::Resolve.into());
        m.set_tid(tid);
        m.set_length(HDR_LEN as u16);
        r
    }

    /// A RESOLVE of one PATH entry (`ACM_EP_INFO_PATH`, 88 bytes) with entry flags `flags`
    /// ([`FLAGS_NODELAY`], [`FLAGS_QUERY_SA`], [`EP_FLAG_DEST`], or 0 as `ib_acme` sends).
    pub fn path(tid: u64, flags: u32, q: &PathQuery) -> ClientRequest {
        ClientRequest::resolve(tid).path_entry(flags, q)
    }

    /// A `query()` (QUERY_SA) of one PATH entry: [`ClientRequest::path`] with
    /// [`FLAGS_QUERY_SA`].
    pub fn query(tid: u64, q: &PathQuery) -> ClientRequest {
        ClientRequest::path(tid, FLAGS_QUERY_SA, q)
    }

    /// Appends a PATH entry with `flags` whose PathRecord sets what `q` gives.
    pub fn path_entry(self, flags: u32, q: &PathQuery) -> ClientRequest {
        self.entry(flags, EpInfoType::Path, |info| {
            let mut p = PathRecord::new_unchecked(info);
            p.set_dlid(q.dlid);
            p.set_slid(q.slid);
            if let Some(g) = q.dgid {
                p.set_dgid(g);
            }
            p.set_reversible_numpath(q.reversible_numpath & 0x80 != 0, q.reversible_numpath);
        })
    }

    /// Appends a PATH entry with `flags` holding the whole record `path` (an SGID, a
    /// ServiceID, a P_Key: what a kernel consumer's request carries).
    pub fn path_record(self, flags: u32, path: &PathRecordRepr) -> ClientRequest {
        self.entry(flags, EpInfoType::Path, |info| {
            path.emit(&mut PathRecord::new_unchecked(info))
        })
    }

    /// Appends the destination entry: `kind` with `addr` (NUL-padded, cut at 64 bytes),
    /// flags [`EP_FLAG_DEST`]` | flags`; `dst_index` names it.
    pub fn dest(self, flags: u32, kind: EpInfoType, addr: &[u8]) -> ClientRequest {
        let at = self.entries;
        let mut r = self.address(EP_FLAG_DEST | flags, kind, addr);
        if r.entries > at {
            AcmMsg::new_unchecked(&mut r.buf[..]).set_dst_index(at as u8);
        }
        r
    }

    /// Appends the source entry: `kind` with `addr`, flags [`EP_FLAG_SOURCE`]; `src_out` is
    /// set (the source is echoed, as the core sets it after `acm_svr_verify_resolve`) and
    /// `src_index` names it.
    pub fn source(self, kind: EpInfoType, addr: &[u8]) -> ClientRequest {
        let at = self.entries;
        let mut r = self.address(EP_FLAG_SOURCE, kind, addr);
        if r.entries > at {
            let mut m = AcmMsg::new_unchecked(&mut r.buf[..]);
            m.set_src_out(1);
            m.set_src_index(at as u8);
        }
        r
    }

    /// Appends an address entry (`kind`, `addr` NUL-padded, cut at 64 bytes) with `flags`.
    pub fn address(self, flags: u32, kind: EpInfoType, addr: &[u8]) -> ClientRequest {
        self.entry(flags, kind, |info| {
            let n = addr.len().min(MAX_ADDRESS);
            info[..n].copy_from_slice(&addr[..n]);
        })
    }

    fn entry(mut self, flags: u32, kind: EpInfoType, fill: impl FnOnce(&mut [u8])) -> Self {
        if self.entries >= MAX_ENTRIES {
            return self;
        }
        let i = self.entries;
        self.entries += 1;
        let mut m = AcmMsg::new_unchecked(&mut self.buf[..]);
        m.set_length((HDR_LEN + self.entries * EP_LEN) as u16);
        if let Some(mut e) = m.entry_mut(i) {
            e.set_flags(flags);
            e.set_info_type(kind);
            fill(e.info_mut());
        }
        self
    }

    /// The message (`hdr.length` bytes).
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len()]
    }

    /// `hdr.length`: 16 + 72 per entry.
    pub fn len(&self) -> usize {
        HDR_LEN + self.entries * EP_LEN
    }

    /// No entry yet.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// The whole buffer (`struct acm_msg`, zero past [`len`](Self::len)).
    pub fn buf(&self) -> &[u8; MSG_LEN] {
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_as_gid_and_lid_and_the_ack_bit() {
        let mut e = [0u8; EP_LEN];
        e[8..24].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34]);
        let v = EpAddrData::new_checked(&e[..]).unwrap();
        assert_eq!(v.info_gid().0[..2], [0xfe, 0x80]);
        assert_eq!(v.info_gid().0[14..], [0x12, 0x34]);
        assert_eq!(v.info_lid(), 0xfe80);
        let mut h = [0u8; HDR_LEN];
        h[1] = 0x41;
        AcmMsg::new_unchecked(&mut h[..]).set_ack();
        assert_eq!(h[1], 0x41 | OP_ACK);
    }
    use crate::wire::gid::Gid;
    use crate::wire::Selector;

    #[test]
    fn client_request_layout() {
        // PATH by DLID, as `ib_acme -f l` and the kernel send it (flags only NODELAY).
        let r = ClientRequest::path(0x55, FLAGS_NODELAY, &PathQuery::lid(6));
        let b = r.bytes();
        assert_eq!(b.len(), HDR_LEN + EP_LEN);
        assert_eq!((b[0], b[1], &b[2..6]), (1, 1, &[0u8; 4][..]));
        assert_eq!(&b[6..8], &88u16.to_ne_bytes());
        assert_eq!(&b[8..16], &0x55u64.to_ne_bytes());
        assert_eq!(&b[16..20], &FLAGS_NODELAY.to_ne_bytes());
        assert_eq!(&b[20..24], &[0x10, 0, 0, 0][..]);
        let mut p = [0u8; 64];
        PathRecord::new_unchecked(&mut p[..]).set_dlid(6);
        assert_eq!(&b[24..88], &p[..]);
        assert!(r.buf()[88..].iter().all(|&x| x == 0));
        let q = ClientRequest::query(1, &PathQuery::gid(Gid::from_parts(0xfe80 << 48, 9)));
        let m = AcmMsg::new_checked(q.bytes()).unwrap();
        let e = m.entry(0).unwrap();
        assert_eq!(e.flags(), FLAGS_QUERY_SA);
        assert_eq!(e.path().dgid, Gid::from_parts(0xfe80 << 48, 9));
        // Destination then source (the simulator's order), and source then destination (the
        // core's, after `acm_svr_verify_resolve`).
        for (src_first, data) in [(false, [1, 1, 0]), (true, [1, 0, 1])] {
            let r = ClientRequest::resolve(2);
            let r = if src_first {
                r.source(EpInfoType::Name, b"a")
                    .dest(FLAGS_NODELAY, EpInfoType::Name, b"b")
            } else {
                r.dest(FLAGS_NODELAY, EpInfoType::Name, b"b")
                    .source(EpInfoType::Name, b"a")
            };
            let m = AcmMsg::new_checked(r.bytes()).unwrap();
            assert_eq!([m.src_out(), m.src_index(), m.dst_index()], data);
            let l = m.check_resolve().unwrap();
            let (d, s) = (
                m.entry(l.dest).unwrap(),
                m.entry(usize::from(data[1])).unwrap(),
            );
            assert_eq!(d.flags(), EP_FLAG_DEST | FLAGS_NODELAY);
            assert_eq!((s.flags(), &s.info()[..2]), (EP_FLAG_SOURCE, &b"a\0"[..]));
        }
        // Nine entries: the ninth is ignored.
        let mut r = ClientRequest::resolve(3);
        for _ in 0..9 {
            r = r.address(0, EpInfoType::AddressIp, &[10, 0, 0, 1]);
        }
        assert_eq!(r.len(), MSG_LEN);
    }

    /// An IPv4 RESOLVE request as librdmacm sends it on x86-64 (native = little-endian):
    /// dest 10.0.0.6 flagged DEST, src 10.0.0.4 flagged SOURCE, tid 0x1122334455667788.
    fn request_le() -> [u8; 16 + 144] {
        let mut b = [0u8; 160];
        b[..16].copy_from_slice(&[
            1, 1, 0, 0, 1, 0, 0xa0, 0x00, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
        ]);
        b[16..24].copy_from_slice(&[2, 0, 0, 0, 2, 0, 0, 0]);
        b[24..28].copy_from_slice(&[10, 0, 0, 6]);
        b[88..96].copy_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        b[96..100].copy_from_slice(&[10, 0, 0, 4]);
        b
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn deconstruct_request() {
        let b = request_le();
        let m = AcmMsg::new_checked(&b[..]).unwrap();
        assert_eq!(m.version(), 1);
        assert_eq!(m.opcode(), Opcode::Resolve);
        assert!(!m.is_ack());
        assert_eq!(m.length(), 160);
        assert_eq!(m.length_be(), 0xa000);
        assert_eq!(m.tid(), 0x1122_3344_5566_7788);
        assert_eq!(m.entry_count(), Ok(2));
        let e = m.entry(0).unwrap();
        assert_eq!(e.flags(), EP_FLAG_DEST);
        assert_eq!(e.info_type(), EpInfoType::AddressIp);
        assert_eq!(&e.info()[..4], &[10, 0, 0, 6]);
        assert_eq!(
            m.check_resolve(),
            Ok(ResolveLayout {
                count: 2,
                is_path: false,
                source: None,
                dest: 0
            })
        );
        let r = AcmMsgRepr::parse(&m).unwrap();
        assert_eq!(r.count, 2);
        assert_eq!(r.entries()[1].flags, EP_FLAG_SOURCE);
        let mut out = [0u8; MSG_LEN];
        assert_eq!(r.emit(&mut AcmMsg::new_unchecked(&mut out[..])), Ok(160));
        assert_eq!(out[..160], b[..]);
    }

    fn sample_path() -> PathRecordRepr {
        PathRecordRepr {
            dgid: Gid::from_parts(0xfe80 << 48, 0x10_000a),
            sgid: Gid::from_parts(0xfe80 << 48, 0x10_0004),
            dlid: 6,
            slid: 4,
            reversible: true,
            pkey: 0xffff,
            mtu_selector: Selector::Exactly,
            mtu: 4,
            rate_selector: Selector::Exactly,
            rate: 3,
            packet_life_selector: Selector::Exactly,
            packet_life: 18,
            ..PathRecordRepr::ZERO
        }
    }

    #[test]
    fn response_with_selected_source() {
        // The core selected a source: src_out = 1, src_index = 1 = count, slot 1 filled.
        let mut b = [0u8; MSG_LEN];
        let req = request_le();
        b[..88].copy_from_slice(&req[..88]);
        b[6..8].copy_from_slice(&88u16.to_ne_bytes());
        b[3] = 1;
        b[4] = 1;
        let mut src = EpAddrData::new_unchecked(&mut b[88..160]);
        src.set_flags(EP_FLAG_SOURCE);
        src.set_info_type(EpInfoType::AddressIp);
        b[96..100].copy_from_slice(&[10, 0, 0, 4]);
        let m = AcmMsg::new_checked(&b[..]).unwrap();
        let layout = m.check_resolve().unwrap();
        assert_eq!(layout.count, 1);
        assert_eq!(layout.source, Some(1));
        let mut out = [0xeeu8; MSG_LEN];
        let n = build_resolve_response(&m, &sample_path().to_bytes(), &mut out).unwrap();
        assert_eq!(n, 16 + 144);
        let r = AcmMsg::new_checked(&out[..n]).unwrap();
        assert_eq!(r.length() as usize, n);
        assert_eq!(r.status(), Status::Success);
        assert_eq!((r.src_out(), r.src_index(), r.dst_index()), (0, 0, 0));
        assert_eq!(r.tid(), m.tid());
        assert_eq!(r.opcode_raw(), 1);
        let e0 = r.entry(0).unwrap();
        assert_eq!(e0.flags(), 0x2b);
        assert_eq!(e0.info_type(), EpInfoType::Path);
        assert_eq!(e0.path(), sample_path());
        assert_eq!(e0.reserved(), 0);
        assert_eq!(r.entry(1).unwrap().into_inner(), &b[88..160]);
    }

    #[test]
    fn response_without_source_and_error_response() {
        let req = request_le();
        let mut b = req;
        b[3] = 0;
        let m = AcmMsg::new_checked(&b[..]).unwrap();
        let mut out = [0u8; MSG_LEN];
        assert_eq!(
            build_resolve_response(&m, &sample_path().to_bytes(), &mut out),
            Ok(88)
        );
        assert_eq!(out[6..8], 88u16.to_ne_bytes());
        assert_eq!(
            build_resolve_response(&m, &sample_path().to_bytes(), &mut out[..87]),
            Err(Error::Truncated)
        );
        let mut e = [0u8; 16];
        assert_eq!(build_error_response(&m, Status::Enodata, &mut e), Ok(16));
        assert_eq!(e[2], 3);
        assert_eq!(e[6..8], 16u16.to_ne_bytes());
        assert_eq!(e[8..16], req[8..16]);
        assert_eq!(e[..2], [1, 1]);
    }

    #[test]
    fn resolve_validation_rejects_bad_headers() {
        let good = request_le();
        let check = |f: &dyn Fn(&mut [u8; 160])| {
            let mut b = good;
            f(&mut b);
            AcmMsg::new_unchecked(&b[..]).check_resolve()
        };
        assert!(check(&|_| {}).is_ok());
        assert_eq!(
            check(&|b| b[6..8].copy_from_slice(&15u16.to_ne_bytes())),
            Err(Error::Malformed)
        );
        assert_eq!(
            check(&|b| b[6..8].copy_from_slice(&16u16.to_ne_bytes())),
            Err(Error::Malformed)
        );
        assert_eq!(
            check(&|b| b[6..8].copy_from_slice(&100u16.to_ne_bytes())),
            Err(Error::Malformed)
        );
        assert_eq!(
            check(&|b| b[6..8].copy_from_slice(&600u16.to_ne_bytes())),
            Err(Error::Malformed)
        );
        assert_eq!(
            check(&|b| b[6..8].copy_from_slice(&232u16.to_ne_bytes())),
            Err(Error::Truncated)
        );
        assert_eq!(check(&|b| b[5] = 2), Err(Error::Malformed)); // dst_index = count
        assert_eq!(
            check(&|b| {
                b[3] = 1;
                b[4] = 3
            }),
            Err(Error::Malformed)
        ); // src > count
        assert_eq!(
            check(&|b| {
                b[3] = 1;
                b[4] = 2
            }),
            Err(Error::Truncated)
        ); // slot past buffer
        assert_eq!(check(&|b| b[0] = 2), Err(Error::Malformed));
        assert_eq!(check(&|b| b[1] = 2), Err(Error::Malformed));
        // 8 entries plus src_out = 1 and src_index = 8 (the core's overflow case).
        let mut full = [0u8; MSG_LEN];
        full[..16].copy_from_slice(&good[..16]);
        full[6..8].copy_from_slice(&(MSG_LEN as u16).to_ne_bytes());
        full[3] = 1;
        full[4] = 8;
        assert_eq!(
            AcmMsg::new_unchecked(&full[..]).check_resolve(),
            Err(Error::Malformed)
        );
    }

    #[test]
    fn query_response_sets_ack_and_path() {
        let mut b = [0u8; 88];
        b[..8].copy_from_slice(&[1, 1, 0, 0, 0, 0, 88, 0]);
        b[6..8].copy_from_slice(&88u16.to_ne_bytes());
        let mut e = EpAddrData::new_unchecked(&mut b[16..]);
        e.set_flags(FLAGS_QUERY_SA);
        e.set_info_type(EpInfoType::Path);
        let m = AcmMsg::new_checked(&b[..]).unwrap();
        let mut out = [0u8; 88];
        assert_eq!(
            build_query_response(&m, Status::Success, Some(&sample_path()), &mut out),
            Ok(88)
        );
        let r = AcmMsg::new_checked(&out[..]).unwrap();
        assert!(r.is_ack());
        assert_eq!(r.entry(0).unwrap().flags(), FLAGS_QUERY_SA);
        assert_eq!(r.entry(0).unwrap().path(), sample_path());
    }

    #[test]
    fn perf_roundtrip_is_big_endian() {
        let p = PerfResponseRepr {
            status: Status::Success,
            ep_index: 1,
            tid: 9,
            count: 7,
            counters: [1, 2, 3, 4, 5, 6, 0x0102_0304_0506_0708],
        };
        let mut b = [0u8; MSG_LEN];
        let n = p.emit(&mut AcmMsg::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(n, 72);
        assert_eq!(b[6..8], [0, 72]);
        assert_eq!(b[1], 0x82);
        assert_eq!(b[3], 7);
        assert_eq!(b[16..24], [0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(b[64..72], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            PerfResponseRepr::parse(&AcmMsg::new_unchecked(&b[..n])),
            Ok(p)
        );
        assert_eq!(
            PerfResponseRepr::parse(&AcmMsg::new_unchecked(&b[..n - 1])),
            Err(Error::Truncated)
        );
        b[3] = 8;
        assert_eq!(
            PerfResponseRepr::parse(&AcmMsg::new_unchecked(&b[..])),
            Err(Error::Malformed)
        );
    }

    #[test]
    fn header_repr_and_perf_request() {
        let req = request_le();
        let h = AcmHdrRepr::parse(&AcmHdr::new_checked(&req[..16]).unwrap()).unwrap();
        assert_eq!(h.length as usize, req.len());
        assert_eq!(h.data, [0, 1, 0]);
        let mut b = [0u8; 16];
        h.emit(&mut AcmHdr::new_unchecked(&mut b[..]));
        assert_eq!(b[..], req[..16]);
        assert_eq!(
            AcmHdrRepr::parse(&AcmHdr::new_unchecked(&req[..15])),
            Err(Error::Truncated)
        );
        let mut p = [0xffu8; 16];
        assert_eq!(build_perf_request(2, 5, &mut p), Ok(16));
        assert_eq!(p[..8], [1, 2, 0, 0, 2, 0, 0, 16]);
        assert_eq!(
            build_perf_request(2, 5, &mut p[..15]),
            Err(Error::Truncated)
        );
    }

    #[test]
    fn parsers_are_total_on_short_input() {
        let req = request_le();
        for n in 0..req.len() {
            let m = AcmMsg::new_unchecked(&req[..n]);
            assert!(AcmMsgRepr::parse(&m).is_err());
            assert!(m.check_resolve().is_err());
            assert!(PerfResponseRepr::parse(&m).is_err());
            let _ = m.entry(usize::MAX);
            let _ = m.perf_counter(usize::MAX);
        }
    }
}
