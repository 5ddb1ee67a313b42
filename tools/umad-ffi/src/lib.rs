//! The one hand-written FFI to libibumad (`<infiniband/umad.h>`, rdma-core 44) that the tools
//! share: `madtool` sends SA MADs with it, `simverbs` reads the umad2sim sysfs snapshot and
//! sends directed-route SMPs with it.
//!
//! * [`sys`]: the raw `extern "C"` declarations and the `umad_port_t` / `umad_ca_t` mirrors
//!   (their layout is checked against the installed header by simverbs' C layout test);
//! * a small safe layer: [`init`] (once per process), [`Port`] (an open umad port, closed on
//!   drop) with [`Port::register`], [`Port::send`] and [`Port::recv`] for 256-byte MADs.
//!
//! Errors are the negative return codes of libibumad, so callers word their own messages.
//! Every `unsafe` block is an FFI call; its invariants are stated next to it.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
use std::ffi::{c_int, c_void, CStr};

/// Raw libibumad declarations.
pub mod sys {
    use std::ffi::{c_char, c_int, c_long, c_uint, c_void};

    /// `UMAD_CA_NAME_LEN`.
    pub const CA_NAME_LEN: usize = 20;
    /// `UMAD_CA_MAX_PORTS`.
    pub const CA_MAX_PORTS: usize = 10;

    /// Mirror of `umad_port_t`.
    #[repr(C)]
    pub struct UmadPort {
        /// CA name (NUL-terminated).
        pub ca_name: [c_char; CA_NAME_LEN],
        /// Port number.
        pub portnum: c_int,
        /// Base LID.
        pub base_lid: c_uint,
        /// LMC.
        pub lmc: c_uint,
        /// SM LID.
        pub sm_lid: c_uint,
        /// SM SL.
        pub sm_sl: c_uint,
        /// Port state.
        pub state: c_uint,
        /// Physical port state.
        pub phys_state: c_uint,
        /// Rate in Gb/s.
        pub rate: c_uint,
        /// Capability mask (network order).
        pub capmask: u32,
        /// GID prefix (network order).
        pub gid_prefix: u64,
        /// Port GUID (network order).
        pub port_guid: u64,
        /// Entries at `pkeys`.
        pub pkeys_size: c_uint,
        /// P_Key table (network order), owned by libibumad.
        pub pkeys: *mut u16,
        /// Link layer name (NUL-terminated).
        pub link_layer: [c_char; CA_NAME_LEN],
    }

    /// Mirror of `umad_ca_t`.
    #[repr(C)]
    pub struct UmadCa {
        /// CA name (NUL-terminated).
        pub ca_name: [c_char; CA_NAME_LEN],
        /// Node type.
        pub node_type: c_uint,
        /// Number of ports.
        pub numports: c_int,
        /// Firmware version string.
        pub fw_ver: [c_char; 20],
        /// CA type string.
        pub ca_type: [c_char; 40],
        /// Hardware version string.
        pub hw_ver: [c_char; 20],
        /// Node GUID (network order).
        pub node_guid: u64,
        /// System image GUID (network order).
        pub system_guid: u64,
        /// Ports, owned by libibumad; NULL where absent.
        pub ports: [*mut UmadPort; CA_MAX_PORTS],
    }

    #[link(name = "ibumad")]
    extern "C" {
        pub fn umad_init() -> c_int;
        pub fn umad_get_cas_names(cas: *mut [c_char; CA_NAME_LEN], max: c_int) -> c_int;
        pub fn umad_get_ca(ca_name: *const c_char, ca: *mut UmadCa) -> c_int;
        pub fn umad_release_ca(ca: *mut UmadCa) -> c_int;
        pub fn umad_get_port(ca_name: *const c_char, portnum: c_int, port: *mut UmadPort) -> c_int;
        pub fn umad_release_port(port: *mut UmadPort) -> c_int;
        pub fn umad_open_port(ca_name: *const c_char, portnum: c_int) -> c_int;
        pub fn umad_close_port(portid: c_int) -> c_int;
        pub fn umad_register(
            portid: c_int,
            mgmt_class: c_int,
            mgmt_version: c_int,
            rmpp_version: u8,
            method_mask: *mut c_long,
        ) -> c_int;
        pub fn umad_send(
            portid: c_int,
            agentid: c_int,
            umad: *mut c_void,
            length: c_int,
            timeout_ms: c_int,
            retries: c_int,
        ) -> c_int;
        pub fn umad_recv(
            portid: c_int,
            umad: *mut c_void,
            length: *mut c_int,
            timeout_ms: c_int,
        ) -> c_int;
        pub fn umad_get_mad(umad: *mut c_void) -> *mut c_void;
        pub fn umad_size() -> usize;
        pub fn umad_set_addr(
            umad: *mut c_void,
            dlid: c_int,
            dqp: c_int,
            sl: c_int,
            qkey: c_int,
        ) -> c_int;
        pub fn umad_status(umad: *mut c_void) -> c_int;
    }
}

/// Length of the MADs [`Port::send`] and [`Port::recv`] carry.
pub const MAD_LEN: usize = 256;

/// Calls `umad_init` once per process (libibumad wants it before the other calls); false if
/// it failed.
pub fn init() -> bool {
    static INIT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: umad_init takes no arguments and may be called at any time.
    *INIT.get_or_init(|| unsafe { sys::umad_init() } >= 0)
}

/// Where [`Port::send`] sends a MAD (host byte order; `umad_set_addr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr {
    /// Destination LID (0xFFFF: permissive, for directed-route SMPs).
    pub dlid: u16,
    /// Destination QP.
    pub dqp: u32,
    /// Service level.
    pub sl: u8,
    /// Q_Key.
    pub qkey: u32,
}

/// A MAD [`Port::recv`] received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// `umad_status`: 0, or the errno of a send that failed (e.g. ETIMEDOUT).
    pub status: c_int,
    /// The MAD.
    pub mad: [u8; MAD_LEN],
}

/// A umad buffer: the `struct ib_user_mad` header and 256 MAD bytes, 8-byte aligned.
struct UmadBuf(Vec<u64>);

impl UmadBuf {
    fn new() -> UmadBuf {
        // SAFETY: umad_size takes no arguments.
        let hdr = unsafe { sys::umad_size() };
        UmadBuf(vec![0u64; (hdr + MAD_LEN).div_ceil(8)])
    }
    fn ptr(&mut self) -> *mut c_void {
        self.0.as_mut_ptr().cast()
    }
    fn mad(&mut self) -> &mut [u8] {
        let umad = self.ptr();
        // SAFETY: the buffer holds a umad header followed by MAD_LEN bytes, so the pointer
        // umad_get_mad returns (just past the header) starts MAD_LEN bytes inside it, and the
        // slice borrows `self` mutably.
        unsafe { std::slice::from_raw_parts_mut(sys::umad_get_mad(umad).cast::<u8>(), MAD_LEN) }
    }
}

/// An open umad port (`umad_open_port`), closed on drop (which also unregisters its agents).
#[derive(Debug)]
pub struct Port {
    id: c_int,
}

impl Port {
    /// Opens port `portnum` of CA `ca` (`None` and 0: the first CA, its first active port).
    /// Calls [`init`] first; a failed init gives `Err(-1)`.
    pub fn open(ca: Option<&CStr>, portnum: u8) -> Result<Port, c_int> {
        if !init() {
            return Err(-1);
        }
        let name = ca.map_or(std::ptr::null(), CStr::as_ptr);
        // SAFETY: `name` is NULL or a NUL-terminated string that outlives the call.
        let id = unsafe { sys::umad_open_port(name, c_int::from(portnum)) };
        if id < 0 {
            Err(id)
        } else {
            Ok(Port { id })
        }
    }

    /// Registers an agent for `mgmt_class`/`class_version` (no unsolicited methods); the
    /// agent id.
    pub fn register(
        &self,
        mgmt_class: u8,
        class_version: u8,
        rmpp_version: u8,
    ) -> Result<c_int, c_int> {
        // SAFETY: the port is open; a NULL method mask registers for responses only.
        let agent = unsafe {
            sys::umad_register(
                self.id,
                c_int::from(mgmt_class),
                c_int::from(class_version),
                rmpp_version,
                std::ptr::null_mut(),
            )
        };
        if agent < 0 {
            Err(agent)
        } else {
            Ok(agent)
        }
    }

    /// Sends a 256-byte MAD through `agent` to `addr`.
    pub fn send(
        &self,
        agent: c_int,
        mad: &[u8; MAD_LEN],
        addr: Addr,
        timeout_ms: i32,
        retries: i32,
    ) -> Result<(), c_int> {
        let mut buf = UmadBuf::new();
        buf.mad().copy_from_slice(mad);
        let umad = buf.ptr();
        // SAFETY: `umad` points at a whole umad buffer owned by `buf`. The casts keep the bit
        // patterns libibumad expects (it converts to network order itself).
        unsafe {
            sys::umad_set_addr(
                umad,
                c_int::from(addr.dlid),
                addr.dqp as c_int,
                c_int::from(addr.sl),
                addr.qkey as c_int,
            )
        };
        // SAFETY: the port is open and `umad` holds a header plus MAD_LEN bytes.
        let rc =
            unsafe { sys::umad_send(self.id, agent, umad, MAD_LEN as c_int, timeout_ms, retries) };
        if rc < 0 {
            Err(rc)
        } else {
            Ok(())
        }
    }

    /// Waits up to `timeout_ms` (-1: forever) for the next MAD on this port.
    pub fn recv(&self, timeout_ms: i32) -> Result<Received, c_int> {
        let mut buf = UmadBuf::new();
        let umad = buf.ptr();
        let mut len = MAD_LEN as c_int;
        // SAFETY: the port is open and `umad` has room for a header plus `len` bytes.
        let rc = unsafe { sys::umad_recv(self.id, umad, &mut len, timeout_ms) };
        if rc < 0 {
            return Err(rc);
        }
        // SAFETY: `umad` is the buffer umad_recv just filled.
        let status = unsafe { sys::umad_status(umad) };
        let mut mad = [0u8; MAD_LEN];
        mad.copy_from_slice(buf.mad());
        Ok(Received { status, mad })
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: the port was opened by Port::open and is closed exactly once.
        unsafe { sys::umad_close_port(self.id) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn umad_buffer_is_aligned_and_holds_a_mad_after_the_header() {
        let mut buf = UmadBuf::new();
        assert_eq!(buf.ptr() as usize % 8, 0);
        // SAFETY: umad_size takes no arguments.
        let hdr = unsafe { sys::umad_size() };
        let start = buf.ptr() as usize;
        let mad = buf.mad();
        assert_eq!(mad.len(), MAD_LEN);
        assert_eq!(mad.as_ptr() as usize - start, hdr);
        assert!(hdr + MAD_LEN <= buf.0.len() * 8);
    }

    #[test]
    fn opening_a_missing_ca_is_an_error_not_a_panic() {
        let ca = c"no-such-ca-acmrs";
        // Without a fabric (and without this CA under umad2sim) libibumad refuses the name.
        assert!(Port::open(Some(ca), 1).is_err());
    }
}
