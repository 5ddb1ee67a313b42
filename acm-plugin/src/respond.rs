//! Building the answers clients need (contract 2.4) and handing them to the core.
//!
//! Responses are built on the stack: no allocation, and the core copies them before returning.

use crate::core_api::CoreApi;
use crate::ffi::{
    AcmMsg, ACM_EP_FLAG_SOURCE, ACM_EP_INFO_PATH, ACM_MSG_EP_LENGTH, ACM_MSG_HDR_LENGTH,
    ACM_OP_ACK, PATH_FLAGS_PRIMARY_BIDIR_GMP,
};
use core::ffi::c_int;

/// Builds the RESOLVE response to `req`: the same header (tid unchanged) with `status`; on
/// success the primary path at index 0 (GMP|PRIMARY|BIDIRECTIONAL) and, when the request had
/// `src_out` set, the source entry echoed at index 1.
pub fn build_resolve_response(req: &AcmMsg, status: u8, record: Option<&[u8; 64]>) -> AcmMsg {
    let mut rsp = AcmMsg::zeroed();
    rsp.hdr = req.hdr;
    rsp.hdr.status = status;
    rsp.hdr.data = [0; 3];
    rsp.hdr.length = ACM_MSG_HDR_LENGTH as u16;
    if status != 0 {
        return rsp;
    }
    let Some(record) = record else {
        return rsp;
    };
    let mut n = 1;
    rsp.resolve_data[0].flags = PATH_FLAGS_PRIMARY_BIDIR_GMP;
    rsp.resolve_data[0].type_ = ACM_EP_INFO_PATH;
    rsp.resolve_data[0].info.bytes = *record;
    let src_index = req.hdr.data[1] as usize;
    if req.hdr.data[0] != 0 && src_index < req.resolve_data.len() {
        rsp.resolve_data[1] = req.resolve_data[src_index];
        rsp.resolve_data[1].flags = ACM_EP_FLAG_SOURCE;
        n = 2;
    }
    rsp.hdr.length = (ACM_MSG_HDR_LENGTH + n * ACM_MSG_EP_LENGTH) as u16;
    rsp
}

/// Builds the QUERY_SA response: the request with ACK set, the status, and the SA's record
/// (when the SA answered; `None` leaves the request's record, as after a timeout).
pub fn build_query_response(req: &AcmMsg, status: u8, record: Option<&[u8; 64]>) -> AcmMsg {
    let mut rsp = *req;
    rsp.hdr.opcode |= ACM_OP_ACK;
    rsp.hdr.status = status;
    // Like ibacmp, whatever record the SA answered is returned, also with a failure status.
    if let Some(r) = record {
        rsp.resolve_data[0].info.bytes = *r;
    }
    rsp
}

/// Which core helper answers a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `acm_resolve_response` with [`build_resolve_response`].
    Resolve,
    /// `acm_query_response` with [`build_query_response`] (ACM_FLAGS_QUERY_SA).
    Query,
}

/// Builds the answer to `req` and hands it to the core.
pub fn send(
    api: &CoreApi,
    via: Via,
    id: u64,
    req: &AcmMsg,
    status: u8,
    record: Option<&[u8; 64]>,
) -> c_int {
    let (f, mut rsp) = match via {
        Via::Resolve => (
            api.resolve_response,
            build_resolve_response(req, status, record),
        ),
        Via::Query => (
            api.query_response,
            build_query_response(req, status, record),
        ),
    };
    // SAFETY: `rsp` is a valid acm_msg whose hdr.length covers only initialised entries; the
    // core copies it before returning.
    unsafe { f(id, &mut rsp) }
}
