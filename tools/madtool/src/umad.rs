//! Just enough libibumad to send SA MADs and read the replies, on top of the shared
//! `umad-ffi` crate.
//!
//! Every `unsafe` block is an FFI call; the invariants are stated next to each.

use std::ffi::{c_int, CStr};
use umad_ffi::{sys, Addr, Port, MAD_LEN};

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
    port: Port,
    agent: c_int,
    info: PortInfo,
}

impl SaAgent {
    /// `umad_init`, `umad_get_port`, `umad_open_port` and registers for SA class version 2.
    pub fn open() -> Result<SaAgent, String> {
        if !umad_ffi::init() {
            return Err("umad_init failed (is libibumad / umad2sim available?)".into());
        }
        // SAFETY: UmadPort is plain data; all-zero is a valid initial value.
        let mut p: sys::UmadPort = unsafe { std::mem::zeroed() };
        // SAFETY: NULL CA name and port 0 mean "first CA, first active port"; `p` is a valid
        // out-pointer to a struct of the C layout.
        let rc = unsafe { sys::umad_get_port(std::ptr::null(), 0, &mut p) };
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
        unsafe { sys::umad_release_port(&mut p) };
        // NULL CA / port 0 as above.
        let port = Port::open(None, 0).map_err(|rc| format!("umad_open_port failed: {rc}"))?;
        let agent = port
            .register(3, 2, 1)
            .map_err(|rc| format!("umad_register(SA) failed: {rc}"))?;
        Ok(SaAgent { port, agent, info })
    }

    /// The local port.
    pub fn info(&self) -> &PortInfo {
        &self.info
    }

    /// Sends a 256-byte SA MAD to the SM and waits for the reply whose low 32 TID bits match.
    pub fn query(&self, mad: &[u8; MAD_LEN], timeout_ms: i32) -> Result<[u8; MAD_LEN], String> {
        let sm = Addr {
            dlid: self.info.sm_lid,
            dqp: 1,
            sl: self.info.sm_sl,
            qkey: 0x8001_0000,
        };
        self.port
            .send(self.agent, mad, sm, timeout_ms, 2)
            .map_err(|rc| format!("umad_send failed: {rc}"))?;
        let want = u32::from_be_bytes([mad[12], mad[13], mad[14], mad[15]]);
        for _ in 0..8 {
            let got = self
                .port
                .recv(timeout_ms * 4)
                .map_err(|rc| format!("umad_recv failed or timed out: {rc}"))?;
            if got.status != 0 {
                return Err(format!(
                    "MAD completed with umad status {} (timeout?)",
                    got.status
                ));
            }
            let out = got.mad;
            if u32::from_be_bytes([out[12], out[13], out[14], out[15]]) == want {
                return Ok(out);
            }
        }
        Err("no reply with a matching TID".into())
    }
}
