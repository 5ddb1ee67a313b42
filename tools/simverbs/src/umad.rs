//! What the simulated HCA learns from libibumad (intercepted by umad2sim).
//!
//! Two sources:
//! * the sysfs snapshot that umad2sim writes when the process attaches to ibsim, read through
//!   `umad_get_ca`/`umad_get_port`: node/system GUIDs, GID prefix, port GUID, P_Key table,
//!   firmware strings. umad2sim never rewrites it, so its LID/SM/state are those at start-up;
//! * live directed-route SMP `Get(PortInfo)` queries to the local port (hop count 0) through a
//!   umad agent of class 0x81: LID, LMC, SM LID/SL, port state, width/speed, MTUs, capability
//!   mask. The port monitor uses these to notice LID/SM/state changes.

use std::ffi::CString;
use std::os::raw::{c_char, c_int};
use umad_ffi::sys::{self, CA_NAME_LEN};
use umad_ffi::{Addr, Port, MAD_LEN};

/// One port as seen in the umad2sim sysfs snapshot (host byte order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortSnapshot {
    pub port_num: u8,
    pub lid: u16,
    pub lmc: u8,
    pub sm_lid: u16,
    pub sm_sl: u8,
    pub state: u8,
    pub phys_state: u8,
    /// Gb/s as umad reports it (e.g. 10 for 4X SDR).
    pub rate: u32,
    pub capmask: u32,
    pub gid_prefix: u64,
    pub port_guid: u64,
    pub pkeys: Vec<u16>,
}

/// One CA as seen in the umad2sim sysfs snapshot (host byte order).
#[derive(Clone, Debug, Default)]
pub struct CaSnapshot {
    pub name: String,
    pub node_type: u32,
    pub fw_ver: String,
    pub hw_ver: String,
    pub ca_type: String,
    pub node_guid: u64,
    pub system_guid: u64,
    pub ports: Vec<PortSnapshot>,
}

/// Names of the umad CAs visible to this process (under umad2sim: `ibsim0`).
pub fn ca_names() -> Vec<String> {
    if !umad_ffi::init() {
        return Vec::new();
    }
    let mut names = [[0 as c_char; CA_NAME_LEN]; 32];
    // SAFETY: `names` has room for 32 entries of CA_NAME_LEN chars, as passed.
    let n = unsafe { sys::umad_get_cas_names(names.as_mut_ptr(), names.len() as c_int) };
    if n <= 0 {
        return Vec::new();
    }
    names[..(n as usize).min(names.len())]
        .iter()
        .map(|n| crate::read_cstr(n))
        .collect()
}

/// Reads the sysfs snapshot of CA `name` through `umad_get_ca`.
pub fn read_ca(name: &str) -> Option<CaSnapshot> {
    if !umad_ffi::init() {
        return None;
    }
    let cname = CString::new(name).ok()?;
    // SAFETY: UmadCa is plain old data; all-zero is a valid (empty) value.
    let mut ca: sys::UmadCa = unsafe { std::mem::zeroed() };
    // SAFETY: cname is NUL-terminated and `ca` is a valid, writable umad_ca_t.
    if unsafe { sys::umad_get_ca(cname.as_ptr(), &mut ca) } < 0 {
        return None;
    }
    let mut snap = CaSnapshot {
        name: crate::read_cstr(&ca.ca_name),
        node_type: ca.node_type,
        fw_ver: crate::read_cstr(&ca.fw_ver),
        hw_ver: crate::read_cstr(&ca.hw_ver),
        ca_type: crate::read_cstr(&ca.ca_type),
        node_guid: u64::from_be(ca.node_guid),
        system_guid: u64::from_be(ca.system_guid),
        ports: Vec::new(),
    };
    for p in ca.ports.iter() {
        if p.is_null() {
            continue;
        }
        // SAFETY: umad_get_ca filled non-NULL entries with valid umad_port_t pointers that
        // live until umad_release_ca below.
        let p = unsafe { &**p };
        let pkeys = if p.pkeys.is_null() {
            Vec::new()
        } else {
            // SAFETY: libibumad allocated `pkeys_size` entries at `pkeys`.
            unsafe { std::slice::from_raw_parts(p.pkeys, p.pkeys_size as usize) }
                .iter()
                .map(|k| u16::from_be(*k))
                .collect()
        };
        snap.ports.push(PortSnapshot {
            port_num: p.portnum as u8,
            lid: p.base_lid as u16,
            lmc: p.lmc as u8,
            sm_lid: p.sm_lid as u16,
            sm_sl: p.sm_sl as u8,
            state: p.state as u8,
            phys_state: p.phys_state as u8,
            rate: p.rate,
            capmask: u32::from_be(p.capmask),
            gid_prefix: u64::from_be(p.gid_prefix),
            port_guid: u64::from_be(p.port_guid),
            pkeys,
        });
    }
    // SAFETY: `ca` was filled by umad_get_ca and is released exactly once.
    unsafe { sys::umad_release_ca(&mut ca) };
    Some(snap)
}

/// Live port attributes from an SMP `Get(PortInfo)` (host byte order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LivePortInfo {
    pub gid_prefix: u64,
    pub lid: u16,
    pub sm_lid: u16,
    pub capmask: u32,
    pub link_width_active: u8,
    pub link_speed_active: u8,
    pub state: u8,
    pub phys_state: u8,
    pub lmc: u8,
    pub neighbor_mtu: u8,
    pub sm_sl: u8,
    pub vl_cap: u8,
    pub mtu_cap: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
}

impl LivePortInfo {
    /// Parses the 64-byte PortInfo attribute (IBA 14.2.5.6).
    pub fn parse(d: &[u8]) -> Option<LivePortInfo> {
        if d.len() < 64 {
            return None;
        }
        Some(LivePortInfo {
            gid_prefix: u64::from_be_bytes(d[8..16].try_into().ok()?),
            lid: u16::from_be_bytes([d[16], d[17]]),
            sm_lid: u16::from_be_bytes([d[18], d[19]]),
            capmask: u32::from_be_bytes(d[20..24].try_into().ok()?),
            link_width_active: d[31],
            state: d[32] & 0x0f,
            phys_state: d[33] >> 4,
            lmc: d[34] & 0x07,
            link_speed_active: d[35] >> 4,
            neighbor_mtu: d[36] >> 4,
            sm_sl: d[36] & 0x0f,
            vl_cap: d[37] >> 4,
            init_type_reply: d[41] >> 4,
            mtu_cap: d[41] & 0x0f,
            subnet_timeout: d[51] & 0x1f,
        })
    }
}

/// A umad port with a class 0x81 (directed-route SMP) agent, for PortInfo queries.
pub struct SmpAgent {
    port: Port,
    agent_id: c_int,
    tid: u32,
}

impl SmpAgent {
    /// Opens `ca`/`port` and registers a directed-route SMP agent.
    pub fn open(ca: &str, port: u8) -> Option<SmpAgent> {
        let cname = CString::new(ca).ok()?;
        let port = Port::open(Some(&cname), port).ok()?;
        // On failure the port is closed when `port` drops.
        let agent_id = port.register(0x81, 1, 0).ok()?;
        Some(SmpAgent {
            port,
            agent_id,
            tid: std::process::id().wrapping_mul(7919),
        })
    }

    /// Sends `Get(PortInfo)` for `port` to the local node (directed route, hop count 0) and
    /// waits up to `timeout_ms` for the answer.
    pub fn query_port_info(&mut self, port: u8, timeout_ms: i32) -> Option<LivePortInfo> {
        let d = self.get(0x0015, u32::from(port), timeout_ms)?;
        LivePortInfo::parse(&d)
    }

    /// Reads block `block` (32 entries, host byte order) of the local CA port's P_Key table.
    pub fn query_pkey_block(&mut self, block: u16, timeout_ms: i32) -> Option<[u16; 32]> {
        let d = self.get(0x0016, u32::from(block), timeout_ms)?;
        let mut keys = [0u16; 32];
        for (i, k) in keys.iter_mut().enumerate() {
            *k = u16::from_be_bytes([d[2 * i], d[2 * i + 1]]);
        }
        Some(keys)
    }

    /// One directed-route `SubnGet(attr_id, attr_mod)` to the local node; the 64-byte
    /// attribute data of a successful answer.
    fn get(&mut self, attr_id: u16, attr_mod: u32, timeout_ms: i32) -> Option<[u8; 64]> {
        self.tid = self.tid.wrapping_add(1);
        let tid = self.tid;
        let mut mad = [0u8; MAD_LEN];
        mad[0] = 1; // base version
        mad[1] = 0x81; // directed-route SMP
        mad[2] = 1; // class version
        mad[3] = 1; // Get
        mad[12..16].copy_from_slice(&tid.to_be_bytes());
        mad[16..18].copy_from_slice(&attr_id.to_be_bytes());
        mad[20..24].copy_from_slice(&attr_mod.to_be_bytes());
        mad[32..34].copy_from_slice(&0xffffu16.to_be_bytes()); // DrSLID: permissive
        mad[34..36].copy_from_slice(&0xffffu16.to_be_bytes()); // DrDLID: permissive
        let permissive = Addr {
            dlid: 0xffff,
            dqp: 0,
            sl: 0,
            qkey: 0,
        };
        self.port
            .send(self.agent_id, &mad, permissive, timeout_ms, 1)
            .ok()?;
        let deadline = std::time::Instant::now()
            + std::time::Duration::from_millis(timeout_ms.max(1) as u64 * 3);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            let got = self.port.recv(left.as_millis() as c_int).ok()?;
            if got.status != 0 {
                return None;
            }
            let mad = got.mad;
            // Only the low 32 TID bits survive umad2sim/ibsim (docs/simverbs.md).
            if mad[12..16] != tid.to_be_bytes() || mad[1] != 0x81 || mad[3] != 0x81 {
                continue;
            }
            // DR SMP status: 15 bits after the direction bit.
            if u16::from_be_bytes([mad[4], mad[5]]) & 0x7fff != 0 {
                return None;
            }
            let mut data = [0u8; 64];
            data.copy_from_slice(&mad[64..128]);
            return Some(data);
        }
    }
}
