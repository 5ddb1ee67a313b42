//! `#[repr(C)]` mirrors of the ibacm provider ABI (`<infiniband/acm_prov.h>`), the client wire
//! message (`<infiniband/acm.h>`) and the umad structures embedded in `struct acm_sa_mad`.
//!
//! Every layout here is checked against the installed C headers by `tests/layout.rs`, which
//! compiles a C program with `offsetof`/`sizeof` and compares it with [`layout_table`].

use acm_dataplane::verbs::IbvPortAttr;
use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

/// `ACM_PROV_VERSION`.
pub const ACM_PROV_VERSION: u32 = 1;

// The `<infiniband/acm.h>` names, for code written against the C ABI (the tests, the bench).
// Each value is defined once, in `acm-core-nostd` (the one codec); these are its C spellings.
use acm_core_nostd::cache::AddrKind;
use acm_core_nostd::resolver::{Counter, MsgBuf};
use acm_core_nostd::wire::client as wc;

/// `ACM_ADDRESS_NAME`, `_IP`, `_IP6` (the `ACM_EP_INFO_*` values 1..3).
pub const ACM_ADDRESS_NAME: u16 = AddrKind::Name as u16;
/// IPv4 address type.
pub const ACM_ADDRESS_IP: u16 = AddrKind::Ipv4 as u16;
/// IPv6 address type.
pub const ACM_ADDRESS_IP6: u16 = AddrKind::Ipv6 as u16;
/// GID address type (internal to ibacm; `wire::client::EpInfoType::Gid`).
pub const ACM_ADDRESS_GID: u16 = 4;
/// LID address type (internal to ibacm; `wire::client::EpInfoType::Lid`).
pub const ACM_ADDRESS_LID: u16 = 5;
/// `ACM_EP_INFO_PATH` (`wire::client::EpInfoType::Path`).
pub const ACM_EP_INFO_PATH: u16 = 0x10;

/// `ACM_OP_RESOLVE` (`wire::client::Opcode::Resolve`).
pub const ACM_OP_RESOLVE: u8 = 1;
/// `ACM_OP_ACK`.
pub const ACM_OP_ACK: u8 = wc::OP_ACK;
/// `ACM_OP_MASK`.
pub const ACM_OP_MASK: u8 = wc::OP_MASK;

// `ACM_STATUS_*`: `acm_core_nostd::wire::client::Status` (the one status vocabulary; an
// answer's byte is `u8::from(status)`, a received byte `Status::from(hdr.status)`).

/// `ACM_FLAGS_QUERY_SA`.
pub const ACM_FLAGS_QUERY_SA: u32 = wc::FLAGS_QUERY_SA;
/// `ACM_FLAGS_NODELAY`.
pub const ACM_FLAGS_NODELAY: u32 = wc::FLAGS_NODELAY;
/// `ACM_EP_FLAG_SOURCE`.
pub const ACM_EP_FLAG_SOURCE: u32 = wc::EP_FLAG_SOURCE;
/// `ACM_EP_FLAG_DEST`.
pub const ACM_EP_FLAG_DEST: u32 = wc::EP_FLAG_DEST;

/// `ACM_MSG_HDR_LENGTH`.
pub const ACM_MSG_HDR_LENGTH: usize = wc::HDR_LEN;
/// `ACM_MSG_EP_LENGTH`.
pub const ACM_MSG_EP_LENGTH: usize = wc::EP_LEN;
/// `ACM_MSG_DATA_LENGTH`.
pub const ACM_MSG_DATA_LENGTH: usize = wc::EP_LEN * wc::MAX_ENTRIES;
/// `ACM_MAX_ADDRESS`.
pub const ACM_MAX_ADDRESS: usize = wc::MAX_ADDRESS;

/// `IBV_PATH_FLAG_GMP | PRIMARY | BIDIRECTIONAL`.
pub const PATH_FLAGS_PRIMARY_BIDIR_GMP: u32 = wc::RESPONSE_PATH_FLAGS;

/// `ACM_CNTR_*`, in `query_perf` order (the resolver's [`Counter`]).
pub mod cntr {
    use super::Counter;
    /// Error Count.
    pub const ERROR: usize = Counter::Error as usize;
    /// Resolve Count.
    pub const RESOLVE: usize = Counter::Resolve as usize;
    /// No Data.
    pub const NODATA: usize = Counter::NoData as usize;
    /// Addr Query Count.
    pub const ADDR_QUERY: usize = Counter::AddrQuery as usize;
    /// Addr Cache Count.
    pub const ADDR_CACHE: usize = Counter::AddrCache as usize;
    /// Route Query Count.
    pub const ROUTE_QUERY: usize = Counter::RouteQuery as usize;
    /// Route Cache Count.
    pub const ROUTE_CACHE: usize = Counter::RouteCache as usize;
    /// `ACM_MAX_COUNTER`.
    pub const MAX: usize = acm_core_nostd::wire::client::MAX_COUNTER;
}

/// `IBV_EVENT_CLIENT_REREGISTER` (enum ibv_event_type).
pub const IBV_EVENT_CLIENT_REREGISTER: c_int = 17;

/// `struct acm_device`.
#[repr(C)]
pub struct AcmDevice {
    /// `struct ibv_context *` of the core.
    pub verbs: *mut c_void,
    /// Device GUID, network order.
    pub dev_guid: u64,
}

/// `struct acm_port`.
#[repr(C)]
pub struct AcmPort {
    /// Owning device.
    pub dev: *const AcmDevice,
    /// 1-based port number.
    pub port_num: u8,
}

/// `struct acm_endpoint`.
#[repr(C)]
pub struct AcmEndpoint {
    /// Owning port.
    pub port: *const AcmPort,
    /// P_Key of the partition (host order).
    pub pkey: u16,
}

/// `union acm_ep_info`: 64 bytes, 8-aligned (address, name or `ibv_path_record`).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct AcmEpInfo {
    /// Raw bytes (network order for paths).
    pub bytes: [u8; 64],
}

/// `struct acm_address`.
#[repr(C)]
pub struct AcmAddress {
    /// Owning endpoint.
    pub endpoint: *const AcmEndpoint,
    /// Zero-padded address.
    pub info: AcmEpInfo,
    /// Core's text form of the address (moves on realloc).
    pub id_string: *mut c_char,
    /// `ACM_ADDRESS_*`.
    pub type_: u16,
}

/// `struct acm_hdr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AcmHdr {
    /// `ACM_VERSION`.
    pub version: u8,
    /// `ACM_OP_*`.
    pub opcode: u8,
    /// `ACM_STATUS_*`.
    pub status: u8,
    /// `src_out`, `src_index`, `dst_index`.
    pub data: [u8; 3],
    /// Total length (host order for RESOLVE).
    pub length: u16,
    /// Request identity; a pointer for kernel requests. Never changed.
    pub tid: u64,
}

/// `struct acm_ep_addr_data`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AcmEpAddrData {
    /// `ACM_EP_FLAG_*` / `IBV_PATH_FLAG_*` / `ACM_FLAGS_*`.
    pub flags: u32,
    /// `ACM_EP_INFO_*`.
    pub type_: u16,
    /// Reserved.
    pub reserved: u16,
    /// Payload.
    pub info: AcmEpInfo,
}

/// `struct acm_msg`: header plus 576 bytes of entries.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AcmMsg {
    /// Header.
    pub hdr: AcmHdr,
    /// Up to 8 `acm_ep_addr_data` entries.
    pub resolve_data: [AcmEpAddrData; 8],
}

impl AcmMsg {
    /// An all-zero message.
    pub const fn zeroed() -> Self {
        AcmMsg {
            hdr: AcmHdr {
                version: 0,
                opcode: 0,
                status: 0,
                data: [0; 3],
                length: 0,
                tid: 0,
            },
            resolve_data: [AcmEpAddrData {
                flags: 0,
                type_: 0,
                reserved: 0,
                info: AcmEpInfo { bytes: [0; 64] },
            }; 8],
        }
    }

    /// The message as the 592 bytes the core exchanges (host-order header fields, as the core
    /// passes them to providers).
    pub fn as_bytes(&self) -> &[u8; MSG_BYTES] {
        // SAFETY: `AcmMsg` is `repr(C)`, exactly MSG_BYTES long with no padding (checked at
        // compile time below and against the C header by the layout test), and every byte
        // pattern is a valid `[u8; N]`.
        unsafe { &*(self as *const AcmMsg as *const [u8; MSG_BYTES]) }
    }

    /// The message as mutable bytes (every byte pattern is a valid `AcmMsg`: plain integers).
    pub fn as_bytes_mut(&mut self) -> &mut [u8; MSG_BYTES] {
        // SAFETY: as in `as_bytes`; `AcmMsg` holds only integers and byte arrays, so any bytes
        // written through the view leave a valid value.
        unsafe { &mut *(self as *mut AcmMsg as *mut [u8; MSG_BYTES]) }
    }

    /// The core's message over `buf`, where the node built an answer: handed to the core as it
    /// is, not copied.
    pub fn in_buf(buf: &mut MsgBuf) -> &mut AcmMsg {
        // SAFETY: `MsgBuf` is MSG_BYTES of bytes aligned at least as `AcmMsg` (checked at
        // compile time below), and every byte pattern is a valid `AcmMsg` (plain integers and
        // byte arrays); the view borrows `buf` mutably, so nothing else reads or writes it
        // meanwhile.
        unsafe { &mut *(buf as *mut MsgBuf).cast::<AcmMsg>() }
    }
}

const _: () = assert!(
    core::mem::size_of::<MsgBuf>() == MSG_BYTES
        && core::mem::align_of::<MsgBuf>() >= core::mem::align_of::<AcmMsg>()
);

/// `sizeof(struct acm_msg)`.
pub const MSG_BYTES: usize = 592;
const _: () = assert!(core::mem::size_of::<AcmMsg>() == MSG_BYTES);

/// `ib_mad_addr_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbMadAddr {
    /// Remote QPN (network order).
    pub qpn: u32,
    /// Q_Key (network order).
    pub qkey: u32,
    /// Remote LID (network order).
    pub lid: u16,
    /// Service level.
    pub sl: u8,
    /// Path bits.
    pub path_bits: u8,
    /// GRH present.
    pub grh_present: u8,
    /// GID index.
    pub gid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Remote GID.
    pub gid: [u8; 16],
    /// Flow label (network order).
    pub flow_label: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Reserved.
    pub reserved: [u8; 6],
}

/// `struct ib_user_mad` (without the flexible data member).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbUserMad {
    /// Agent id.
    pub agent_id: u32,
    /// 0 for a response, an errno (e.g. ETIMEDOUT) otherwise.
    pub status: u32,
    /// Timeout in ms.
    pub timeout_ms: u32,
    /// Retries.
    pub retries: u32,
    /// Length.
    pub length: u32,
    /// Address.
    pub addr: IbMadAddr,
}

/// `struct acm_sa_mad`: context, umad header, then the 256-byte SA MAD (`umad_sa_packet`).
#[repr(C)]
pub struct AcmSaMad {
    /// Provider context given to `acm_alloc_sa_mad`.
    pub context: *mut c_void,
    /// umad header; `status` nonzero means timeout or send failure.
    pub umad: IbUserMad,
    /// The 256-byte SA MAD (`struct umad_sa_packet`), network order, 8-aligned.
    pub sa_mad: SaPacket,
}

/// `struct umad_sa_packet` as raw bytes (the wire layout is handled by the SA codec).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct SaPacket {
    /// MAD bytes.
    pub bytes: [u8; 256],
}

/// `struct acm_provider`.
#[repr(C)]
pub struct AcmProvider {
    /// Must be `sizeof(struct acm_provider)`.
    pub size: usize,
    /// `ACM_PROV_VERSION`.
    pub version: u32,
    /// Provider name.
    pub name: *const c_char,
    /// Open a device.
    pub open_device: unsafe extern "C" fn(*const AcmDevice, *mut *mut c_void) -> c_int,
    /// Close a device.
    pub close_device: unsafe extern "C" fn(*mut c_void),
    /// Open a port.
    pub open_port: unsafe extern "C" fn(*const AcmPort, *mut c_void, *mut *mut c_void) -> c_int,
    /// Close a port.
    pub close_port: unsafe extern "C" fn(*mut c_void),
    /// Open an endpoint.
    pub open_endpoint:
        unsafe extern "C" fn(*const AcmEndpoint, *mut c_void, *mut *mut c_void) -> c_int,
    /// Close an endpoint.
    pub close_endpoint: unsafe extern "C" fn(*mut c_void),
    /// Add an address.
    pub add_address:
        unsafe extern "C" fn(*const AcmAddress, *mut c_void, *mut *mut c_void) -> c_int,
    /// Remove an address.
    pub remove_address: unsafe extern "C" fn(*mut c_void),
    /// Resolve request.
    pub resolve: unsafe extern "C" fn(*mut c_void, *mut AcmMsg, u64) -> c_int,
    /// SA query passthrough.
    pub query: unsafe extern "C" fn(*mut c_void, *mut AcmMsg, u64) -> c_int,
    /// Async event.
    pub handle_event: unsafe extern "C" fn(*mut c_void, c_int) -> c_int,
    /// Counters.
    pub query_perf: unsafe extern "C" fn(*mut c_void, *mut u64, *mut u8),
}

// SAFETY: the provider table is immutable after construction and only holds function pointers
// and a pointer to a static C string.
unsafe impl Sync for AcmProvider {}

/// One row of the layout table: (C expression, value computed on the Rust side).
pub type LayoutRow = (&'static str, usize);

/// `offsetof(struct ibv_port_attr, lid)` in rdma-sys's binding, through which the plugin reads
/// port attributes (`acm_dataplane::verbs::port_attr`); `tests/layout.rs` compares these with
/// the installed header (the in-process tests' fake `ibv_query_port` writes at them too).
pub const PORT_ATTR_LID: usize = offset_of!(IbvPortAttr, lid);
/// `offsetof(struct ibv_port_attr, active_mtu)` (see [`PORT_ATTR_LID`]).
pub const PORT_ATTR_ACTIVE_MTU: usize = offset_of!(IbvPortAttr, active_mtu);
/// `offsetof(struct ibv_port_attr, active_width)` (see [`PORT_ATTR_LID`]).
pub const PORT_ATTR_ACTIVE_WIDTH: usize = offset_of!(IbvPortAttr, active_width);
/// `offsetof(struct ibv_port_attr, active_speed)` (see [`PORT_ATTR_LID`]).
pub const PORT_ATTR_ACTIVE_SPEED: usize = offset_of!(IbvPortAttr, active_speed);

/// Sizes and offsets of every mirrored struct, named by the C expression that must equal them.
pub fn layout_table() -> Vec<LayoutRow> {
    vec![
        ("sizeof(struct acm_device)", size_of::<AcmDevice>()),
        (
            "offsetof(struct acm_device, dev_guid)",
            offset_of!(AcmDevice, dev_guid),
        ),
        ("sizeof(struct acm_port)", size_of::<AcmPort>()),
        (
            "offsetof(struct acm_port, port_num)",
            offset_of!(AcmPort, port_num),
        ),
        ("sizeof(struct acm_endpoint)", size_of::<AcmEndpoint>()),
        (
            "offsetof(struct acm_endpoint, pkey)",
            offset_of!(AcmEndpoint, pkey),
        ),
        ("sizeof(struct acm_address)", size_of::<AcmAddress>()),
        (
            "offsetof(struct acm_address, info)",
            offset_of!(AcmAddress, info),
        ),
        (
            "offsetof(struct acm_address, id_string)",
            offset_of!(AcmAddress, id_string),
        ),
        (
            "offsetof(struct acm_address, type)",
            offset_of!(AcmAddress, type_),
        ),
        ("sizeof(union acm_ep_info)", size_of::<AcmEpInfo>()),
        (
            "_Alignof(union acm_ep_info)",
            core::mem::align_of::<AcmEpInfo>(),
        ),
        ("sizeof(struct acm_hdr)", size_of::<AcmHdr>()),
        (
            "offsetof(struct acm_hdr, status)",
            offset_of!(AcmHdr, status),
        ),
        ("offsetof(struct acm_hdr, data)", offset_of!(AcmHdr, data)),
        (
            "offsetof(struct acm_hdr, length)",
            offset_of!(AcmHdr, length),
        ),
        ("offsetof(struct acm_hdr, tid)", offset_of!(AcmHdr, tid)),
        (
            "sizeof(struct acm_ep_addr_data)",
            size_of::<AcmEpAddrData>(),
        ),
        (
            "offsetof(struct acm_ep_addr_data, type)",
            offset_of!(AcmEpAddrData, type_),
        ),
        (
            "offsetof(struct acm_ep_addr_data, info)",
            offset_of!(AcmEpAddrData, info),
        ),
        ("sizeof(struct acm_msg)", size_of::<AcmMsg>()),
        (
            "offsetof(struct acm_msg, resolve_data)",
            offset_of!(AcmMsg, resolve_data),
        ),
        ("sizeof(ib_mad_addr_t)", size_of::<IbMadAddr>()),
        ("offsetof(ib_mad_addr_t, lid)", offset_of!(IbMadAddr, lid)),
        ("offsetof(ib_mad_addr_t, gid)", offset_of!(IbMadAddr, gid)),
        (
            "offsetof(ib_mad_addr_t, flow_label)",
            offset_of!(IbMadAddr, flow_label),
        ),
        (
            "offsetof(ib_mad_addr_t, pkey_index)",
            offset_of!(IbMadAddr, pkey_index),
        ),
        ("sizeof(struct ib_user_mad)", size_of::<IbUserMad>()),
        (
            "offsetof(struct ib_user_mad, status)",
            offset_of!(IbUserMad, status),
        ),
        (
            "offsetof(struct ib_user_mad, addr)",
            offset_of!(IbUserMad, addr),
        ),
        ("sizeof(struct umad_sa_packet)", size_of::<SaPacket>()),
        ("sizeof(struct acm_sa_mad)", size_of::<AcmSaMad>()),
        (
            "offsetof(struct acm_sa_mad, umad)",
            offset_of!(AcmSaMad, umad),
        ),
        (
            "offsetof(struct acm_sa_mad, sa_mad)",
            offset_of!(AcmSaMad, sa_mad),
        ),
        ("sizeof(struct acm_provider)", size_of::<AcmProvider>()),
        (
            "offsetof(struct acm_provider, version)",
            offset_of!(AcmProvider, version),
        ),
        (
            "offsetof(struct acm_provider, name)",
            offset_of!(AcmProvider, name),
        ),
        (
            "offsetof(struct acm_provider, open_device)",
            offset_of!(AcmProvider, open_device),
        ),
        (
            "offsetof(struct acm_provider, resolve)",
            offset_of!(AcmProvider, resolve),
        ),
        (
            "offsetof(struct acm_provider, query)",
            offset_of!(AcmProvider, query),
        ),
        (
            "offsetof(struct acm_provider, handle_event)",
            offset_of!(AcmProvider, handle_event),
        ),
        (
            "offsetof(struct acm_provider, query_perf)",
            offset_of!(AcmProvider, query_perf),
        ),
        ("sizeof(struct ibv_path_record)", 64),
        (
            "IBV_EVENT_CLIENT_REREGISTER",
            IBV_EVENT_CLIENT_REREGISTER as usize,
        ),
        ("ACM_MAX_COUNTER", cntr::MAX),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use acm_core_nostd::resolver::request::respond;
    use acm_core_nostd::resolver::Via;
    use acm_core_nostd::wire::client::{ClientRequest, PathQuery, Status};

    /// The answer the node built in a `MsgBuf` is the `acm_msg` the core is given: the same
    /// memory, its header read where `respond` wrote it, and a write through the core's view
    /// (its ACK bit) lands in the buffer.
    #[test]
    fn an_answer_is_handed_to_the_core_where_it_was_built() {
        let req = ClientRequest::path(0x1122_3344_5566_7788, 0, &PathQuery::lid(6));
        let mut buf = MsgBuf::new();
        let len = respond(req.bytes(), Via::Resolve, Status::Enodata, None, &mut buf.0);
        let at = buf.0.as_ptr() as usize;
        let msg = AcmMsg::in_buf(&mut buf);
        assert_eq!(msg as *mut AcmMsg as usize, at, "not a copy");
        assert_eq!(at % core::mem::align_of::<AcmMsg>(), 0);
        assert_eq!(msg.hdr.tid, 0x1122_3344_5566_7788);
        assert_eq!(msg.hdr.length, len);
        assert_eq!(msg.hdr.status, u8::from(Status::Enodata));
        msg.hdr.opcode |= 0x80;
        assert_eq!(buf.0[1] & 0x80, 0x80);
    }
}
