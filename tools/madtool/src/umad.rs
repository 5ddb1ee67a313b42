//! A tiny hand-written FFI to libibumad: just enough to send SA MADs and read the replies.
//!
//! Every `unsafe` block is an FFI call; the invariants are stated next to each.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

const UMAD_CA_NAME_LEN: usize = 20;

/// `umad_port_t` from `<infiniband/umad.h>` (rdma-core 44).
#[repr(C)]
struct UmadPort {
    ca_name: [c_char; UMAD_CA_NAME_LEN],
    portnum: c_int,
    base_lid: c_uint,
    lmc: c_uint,
    sm_lid: c_uint,
    sm_sl: c_uint,
    state: c_uint,
    phys_state: c_uint,
    rate: c_uint,
    capmask: u32,
    gid_prefix: u64,
    port_guid: u64,
    pkeys_size: c_uint,
    pkeys: *mut u16,
    link_layer: [c_char; UMAD_CA_NAME_LEN],
}

#[link(name = "ibumad")]
extern "C" {
    fn umad_init() -> c_int;
    fn umad_get_port(ca_name: *const c_char, portnum: c_int, port: *mut UmadPort) -> c_int;
    fn umad_release_port(port: *mut UmadPort) -> c_int;
    fn umad_open_port(ca_name: *const c_char, portnum: c_int) -> c_int;
    fn umad_close_port(portid: c_int) -> c_int;
    fn umad_register(
        portid: c_int,
        mgmt_class: c_int,
        mgmt_version: c_int,
        rmpp_version: u8,
        method_mask: *mut std::ffi::c_long,
    ) -> c_int;
    fn umad_size() -> usize;
    fn umad_set_addr(umad: *mut c_void, dlid: c_int, dqp: c_int, sl: c_int, qkey: c_int) -> c_int;
    fn umad_send(
        portid: c_int,
        agentid: c_int,
        umad: *mut c_void,
        length: c_int,
        timeout_ms: c_int,
        retries: c_int,
    ) -> c_int;
    fn umad_recv(portid: c_int, umad: *mut c_void, length: *mut c_int, timeout_ms: c_int) -> c_int;
    fn umad_status(umad: *mut c_void) -> c_int;
}

/// What the local port looks like (host byte order).
#[derive(Debug, Clone)]
pub struct PortInfo {
    /// CA name, e.g. `ibsim0`.
    pub ca_name: String,
    /// Port number.
    pub port: i32,
    /// Base LID.
    pub lid: u16,
    /// SM LID.
    pub sm_lid: u16,
    /// SM SL.
    pub sm_sl: u8,
    /// GID prefix.
    pub gid_prefix: u64,
    /// Port GUID.
    pub port_guid: u64,
}

/// An open umad port with one SA agent.
pub struct SaAgent {
    fd: c_int,
    agent: c_int,
    info: PortInfo,
}

const MAD_LEN: usize = 256;

impl SaAgent {
    /// `umad_init`, `umad_get_port`, `umad_open_port` and registers for SA class version 2.
    pub fn open() -> Result<SaAgent, String> {
        // SAFETY: no preconditions.
        if unsafe { umad_init() } < 0 {
            return Err("umad_init failed (is libibumad / umad2sim available?)".into());
        }
        // SAFETY: UmadPort is plain data; all-zero is a valid initial value.
        let mut p: UmadPort = unsafe { std::mem::zeroed() };
        // SAFETY: NULL CA name and port 0 mean "first CA, first active port"; `p` is a valid
        // out-pointer to a struct of the C layout.
        let rc = unsafe { umad_get_port(std::ptr::null(), 0, &mut p) };
        if rc < 0 {
            return Err(format!("umad_get_port failed: {rc}"));
        }
        // SAFETY: umad_get_port NUL-terminates ca_name inside its fixed array.
        let ca_name = unsafe { CStr::from_ptr(p.ca_name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let info = PortInfo {
            ca_name,
            port: p.portnum,
            lid: p.base_lid as u16,
            sm_lid: p.sm_lid as u16,
            sm_sl: p.sm_sl as u8,
            gid_prefix: u64::from_be(p.gid_prefix),
            port_guid: u64::from_be(p.port_guid),
        };
        // SAFETY: `p` was filled by umad_get_port and is released exactly once.
        unsafe { umad_release_port(&mut p) };
        // SAFETY: NULL CA / port 0 as above.
        let fd = unsafe { umad_open_port(std::ptr::null(), 0) };
        if fd < 0 {
            return Err(format!("umad_open_port failed: {fd}"));
        }
        // SAFETY: fd is an open umad port; a NULL method mask registers for responses only.
        let agent = unsafe { umad_register(fd, 3, 2, 1, std::ptr::null_mut()) };
        if agent < 0 {
            // SAFETY: fd was opened above.
            unsafe { umad_close_port(fd) };
            return Err(format!("umad_register(SA) failed: {agent}"));
        }
        Ok(SaAgent { fd, agent, info })
    }

    /// The local port.
    pub fn info(&self) -> &PortInfo {
        &self.info
    }

    /// Sends a 256-byte SA MAD to the SM and waits for the reply whose low 32 TID bits match.
    pub fn query(&self, mad: &[u8; MAD_LEN], timeout_ms: i32) -> Result<[u8; MAD_LEN], String> {
        // SAFETY: no preconditions.
        let hdr = unsafe { umad_size() };
        // u64 storage keeps the buffer 8-byte aligned, as struct ib_user_mad requires.
        let words = (hdr + MAD_LEN).div_ceil(8);
        let mut send = vec![0u64; words];
        let base = send.as_mut_ptr() as *mut u8;
        // SAFETY: `send` has hdr + 256 bytes; the MAD goes right after the umad header.
        unsafe {
            std::ptr::copy_nonoverlapping(mad.as_ptr(), base.add(hdr), MAD_LEN);
            umad_set_addr(
                base as *mut c_void,
                self.info.sm_lid as c_int,
                1,
                self.info.sm_sl as c_int,
                0x8001_0000u32 as c_int,
            );
        }
        // SAFETY: fd/agent are open; the buffer holds a umad header plus 256 bytes.
        let rc = unsafe {
            umad_send(
                self.fd,
                self.agent,
                base as *mut c_void,
                MAD_LEN as c_int,
                timeout_ms,
                2,
            )
        };
        if rc < 0 {
            return Err(format!("umad_send failed: {rc}"));
        }
        let want = u32::from_be_bytes([mad[12], mad[13], mad[14], mad[15]]);
        let mut recv = vec![0u64; words];
        for _ in 0..8 {
            let rbase = recv.as_mut_ptr() as *mut u8;
            let mut len: c_int = MAD_LEN as c_int;
            // SAFETY: the buffer holds a umad header plus `len` bytes of MAD.
            let rc = unsafe { umad_recv(self.fd, rbase as *mut c_void, &mut len, timeout_ms * 4) };
            if rc < 0 {
                return Err(format!("umad_recv failed or timed out: {rc}"));
            }
            // SAFETY: rbase points to a umad header filled by umad_recv.
            let status = unsafe { umad_status(rbase as *mut c_void) };
            let mut out = [0u8; MAD_LEN];
            // SAFETY: the MAD area is hdr..hdr+256 of `recv`.
            unsafe { std::ptr::copy_nonoverlapping(rbase.add(hdr), out.as_mut_ptr(), MAD_LEN) };
            if status != 0 {
                return Err(format!(
                    "MAD completed with umad status {status} (timeout?)"
                ));
            }
            if u32::from_be_bytes([out[12], out[13], out[14], out[15]]) == want {
                return Ok(out);
            }
        }
        Err("no reply with a matching TID".into())
    }
}

impl Drop for SaAgent {
    fn drop(&mut self) {
        // SAFETY: fd was opened by umad_open_port and is closed once.
        unsafe { umad_close_port(self.fd) };
    }
}
