//! ud-agent: drives one [`acm_dataplane::verbs::UdEndpoint`] line by line on stdin, for the
//! simulated-fabric tests (`tests/verbs_sim.rs`). Run it under
//! `LD_PRELOAD=libumad2sim.so:libsimverbs.so SIM_HOST=<node> IBSIM_SOCKNAME=<fabric>`.
//! One reply line per command (`recv` adds one line per MAD).
//!
//! ```text
//! open <recv_depth> <send_depth> [pkey]      ibv_open_device(first) + UdEndpoint::open
//!       -> ok lid=<lid> qpn=<qpn> gid=<hex32> pkey_index=<i>
//! attach|detach <index> <mgid-hex32> <mlid>  -> ok | err <reason>
//! send <dlid> <dqpn> <dgid-hex32> <tag> [count] [flow_label]   unicast MADs tagged tag,
//!       tag+1, ... (the flow label makes distinct AVs for the AH cache)
//! msend <index> <tag> [count]                multicast MADs on attached group <index>
//! raw <dlid> <dqpn> <dgid-hex32> <mad-hex512> [count] [off,off,...]   these 256 bytes,
//!       unicast (a test's rogue host: forged SA Reports and replies, ACM answers, replays,
//!       floods); with offsets, copy i carries i as a big-endian u32 at each offset (distinct
//!       TIDs, source names, ...)
//! mraw <index> <mad-hex512>                  these exact bytes on attached group <index>
//!       -> ok sent=<n> | err sent=<n> <nobuf|unknown-group|ah-busy|recovering|verbs> <text>
//! poll                                       one UdEndpoint::poll (MADs kept for recv)
//!       -> ok completions=<n>
//! recv <n> <timeout_ms>                      collect n MADs: arm, poll(2) on event_fd,
//!       ack_event, poll ... -> ok n=<k> then k lines
//!       mad tag=<t> intact=<0|1> slid=.. src_qp=.. sl=.. path_bits=.. pkey_index=..
//!           ep_pkey_index=.. sgid=<hex32|none> bytes=<hex512>
//! arm                                        UdEndpoint::arm -> ok | err <text>
//! wait <timeout_ms>                          poll(2) on event_fd only (no CQ poll, no arm)
//!       -> ok woke=<0|1> (events consumed and counted)
//! stats                                      -> ok sends=.. (every UdStats field) events=..
//! close                                      UdEndpoint::close
//!       -> ok fds=<before>,<after> threads=<before>,<after> | err <text>
//! quit                                       drop everything, ibv_close_device, exit 0
//! ```
//!
//! The MADs are ACM-shaped (base 1, class 0x2C, version 1), the tag is the TID, and bytes 16..
//! carry a pattern derived from the tag so the receiver can check all 256 bytes arrived.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use acm_core_nostd::resolver::{AcmDest, McGroup, RecvMeta, UnicastAv};
use acm_core_nostd::wire::gid::Gid;
use acm_dataplane::verbs::{self, SendError, UdConfig, UdEndpoint, ACM_QKEY, MAD_LEN};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex16(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 {
        return None;
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(g)
}

/// A unicast destination: LID, QPN, GID (zero: no GRH wanted), flow label; the ACM Q_Key.
fn unicast(dlid: u64, dqpn: u64, dgid: [u8; 16], flow_label: u32) -> AcmDest {
    AcmDest::Unicast(UnicastAv {
        dlid: dlid as u16,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        dgid: Gid(dgid),
        flow_label,
        hop_limit: 1,
        tclass: 0,
        remote_qpn: dqpn as u32,
        remote_qkey: ACM_QKEY,
    })
}

fn unhex_mad(s: &str) -> Option<[u8; MAD_LEN]> {
    if s.len() != 2 * MAD_LEN {
        return None;
    }
    let mut m = [0u8; MAD_LEN];
    for (i, b) in m.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(m)
}

fn num(s: Option<&str>) -> Option<u64> {
    let s = s?;
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn mad(tag: u64) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    m[0] = 1; // base version
    m[1] = 0x2c; // ACM class
    m[2] = 1; // class version
    m[3] = 1; // GET
    m[6..8].copy_from_slice(&1u16.to_be_bytes()); // control RESOLVE
    m[8..16].copy_from_slice(&tag.to_be_bytes());
    for (i, b) in m.iter_mut().enumerate().skip(16) {
        *b = (tag as usize).wrapping_mul(31).wrapping_add(i) as u8;
    }
    m
}

fn intact(m: &[u8; MAD_LEN]) -> (u64, bool) {
    let mut t = [0u8; 8];
    t.copy_from_slice(&m[8..16]);
    let tag = u64::from_be_bytes(t);
    (tag, *m == mad(tag))
}

fn group(index: u8, mgid: [u8; 16], mlid: u16) -> McGroup {
    McGroup {
        index,
        mgid: Gid(mgid),
        mlid,
        sl: 0,
        flow_label: 0,
        hop_limit: 1,
        tclass: 0,
        rate: 3, // IBV_RATE_10_GBPS
        mtu: 4,  // IBV_MTU_2048
        pkey: 0xffff,
        qkey: ACM_QKEY,
    }
}

fn send_error(e: &SendError) -> String {
    let kind = match e {
        SendError::NoBuffer => "nobuf",
        SendError::UnknownGroup(_) => "unknown-group",
        SendError::AhBusy => "ah-busy",
        SendError::Recovering => "recovering",
        SendError::Verbs(_) => "verbs",
    };
    format!("{kind} {e}")
}

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

struct Device {
    ctx: *mut rdma_sys::ibv_context,
}

impl Device {
    fn open() -> Result<Device, String> {
        let mut n = 0;
        // SAFETY: n is a writable int; the list is freed below.
        let list = unsafe { rdma_sys::ibv_get_device_list(&mut n) };
        if list.is_null() || n < 1 {
            if !list.is_null() {
                // SAFETY: the list came from ibv_get_device_list.
                unsafe { rdma_sys::ibv_free_device_list(list) };
            }
            return Err("no verbs device".into());
        }
        // SAFETY: list has n >= 1 entries.
        let ctx = unsafe { rdma_sys::ibv_open_device(*list) };
        // SAFETY: the list came from ibv_get_device_list; the context does not need it.
        unsafe { rdma_sys::ibv_free_device_list(list) };
        if ctx.is_null() {
            return Err(format!(
                "ibv_open_device: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Device { ctx })
    }

    fn lid_gid(&self) -> Result<(u16, [u8; 16]), String> {
        // SAFETY: plain old data.
        let mut pa: rdma_sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is open; pa is writable (verbs.h's inline ibv_query_port: the extended
        // op if the context has one, else the exported compat entry point).
        if unsafe { rdma_sys::___ibv_query_port(self.ctx, 1, &mut pa) } != 0 {
            return Err("ibv_query_port failed".into());
        }
        let mut gid = rdma_sys::ibv_gid { raw: [0; 16] };
        // SAFETY: ctx is open; gid is writable.
        if unsafe { rdma_sys::ibv_query_gid(self.ctx, 1, 0, &mut gid) } != 0 {
            return Err("ibv_query_gid failed".into());
        }
        // SAFETY: raw is the byte view of the union.
        Ok((pa.lid, unsafe { gid.raw }))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: ctx is open and every object on it is gone (the endpoint is dropped first).
        unsafe { rdma_sys::ibv_close_device(self.ctx) };
    }
}

struct Agent {
    ep: Option<UdEndpoint>,
    dev: Option<Device>,
    inbox: VecDeque<(RecvMeta, [u8; MAD_LEN])>,
    events: u64,
    fds_before: usize,
    threads_before: usize,
}

impl Agent {
    fn poll(&mut self) -> usize {
        let Some(ep) = self.ep.as_mut() else { return 0 };
        let inbox = &mut self.inbox;
        ep.poll(|m, b| inbox.push_back((*m, *b)))
    }

    fn recv(&mut self, n: usize, timeout: Duration, out: &mut impl Write) -> std::io::Result<()> {
        let t0 = Instant::now();
        loop {
            self.poll();
            if self.inbox.len() >= n {
                break;
            }
            let Some(ep) = self.ep.as_mut() else { break };
            if let Err(e) = ep.arm() {
                writeln!(out, "err {e}")?;
                return Ok(());
            }
            // A completion may have arrived before the arm.
            self.poll();
            if self.inbox.len() >= n {
                break;
            }
            let left = timeout.saturating_sub(t0.elapsed());
            if left.is_zero() {
                break;
            }
            let Some(ep) = self.ep.as_mut() else { break };
            let mut p = libc::pollfd {
                fd: ep.event_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            let r = unsafe { libc::poll(&mut p, 1, left.as_millis().min(60_000) as i32) };
            if r > 0 {
                while ep.ack_event() {
                    self.events += 1;
                }
            }
        }
        let k = n.min(self.inbox.len());
        writeln!(out, "ok n={k}")?;
        for (m, b) in self.inbox.drain(..k) {
            let (tag, ok) = intact(&b);
            writeln!(
                out,
                "mad tag={tag} intact={} slid={} src_qp={} sl={} path_bits={} pkey_index={} ep_pkey_index={} sgid={} bytes={}",
                u8::from(ok),
                m.slid,
                m.src_qp,
                m.sl,
                m.dlid_path_bits,
                m.pkey_index,
                m.ep_pkey_index,
                m.grh_sgid.map(|g| hex(&g.0)).unwrap_or_else(|| "none".into()),
                hex(&b)
            )?;
        }
        Ok(())
    }

    fn sends(
        &mut self,
        to: AcmDest,
        tag: u64,
        count: u64,
        out: &mut impl Write,
    ) -> std::io::Result<()> {
        self.send_each(to, count, false, |i| mad(tag + i), out)
    }

    /// Sends `count` MADs to `to`, the `i`-th being `make(i)`; with `wait`, polls for send
    /// completions when every send buffer is in flight (else that is an error).
    fn send_each(
        &mut self,
        to: AcmDest,
        count: u64,
        wait: bool,
        make: impl Fn(u64) -> [u8; MAD_LEN],
        out: &mut impl Write,
    ) -> std::io::Result<()> {
        if self.ep.is_none() {
            return writeln!(out, "err not open");
        }
        for i in 0..count {
            let m = make(i);
            let mut r = self.ep.as_mut().map_or(Ok(()), |ep| ep.send(&to, &m));
            if wait && matches!(r, Err(SendError::NoBuffer)) {
                // Take the send completions (received MADs are kept for `recv`).
                self.poll();
                r = self.ep.as_mut().map_or(Ok(()), |ep| ep.send(&to, &m));
            }
            if let Err(e) = r {
                return writeln!(out, "err sent={i} {}", send_error(&e));
            }
        }
        writeln!(out, "ok sent={count}")
    }

    fn command(&mut self, line: &str, out: &mut impl Write) -> std::io::Result<bool> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let arg = |i: usize| w.get(i).copied();
        match arg(0) {
            None => {}
            Some("quit") => return Ok(false),
            Some("open") => {
                let (Some(rd), Some(sd)) = (num(arg(1)), num(arg(2))) else {
                    writeln!(out, "err usage")?;
                    return Ok(true);
                };
                let pkey = num(arg(3)).unwrap_or(0xffff) as u16;
                if self.dev.is_none() {
                    match Device::open() {
                        Ok(d) => self.dev = Some(d),
                        Err(e) => {
                            writeln!(out, "err {e}")?;
                            return Ok(true);
                        }
                    }
                }
                let Some(dev) = self.dev.as_ref() else {
                    return Ok(true);
                };
                self.fds_before = count_dir("/proc/self/fd");
                self.threads_before = count_dir("/proc/self/task");
                // SAFETY: dev.ctx is open.
                let Some(pkey_index) = (unsafe { verbs::pkey_index(dev.ctx, 1, pkey) }) else {
                    writeln!(out, "err pkey {pkey:#x} not in the table")?;
                    return Ok(true);
                };
                let cfg = UdConfig {
                    port_num: 1,
                    pkey_index,
                    qkey: ACM_QKEY,
                    recv_depth: rd as u32,
                    send_depth: sd as u32,
                };
                let (lid, gid) = match dev.lid_gid() {
                    Ok(x) => x,
                    Err(e) => {
                        writeln!(out, "err {e}")?;
                        return Ok(true);
                    }
                };
                // SAFETY: dev.ctx is open and outlives the endpoint (dropped first).
                match unsafe { UdEndpoint::open(dev.ctx, &cfg) } {
                    Ok(ep) => {
                        writeln!(
                            out,
                            "ok lid={lid} qpn={} gid={} pkey_index={pkey_index}",
                            ep.qpn(),
                            hex(&gid)
                        )?;
                        self.ep = Some(ep);
                    }
                    Err(e) => writeln!(out, "err {e}")?,
                }
            }
            Some(c @ ("attach" | "detach")) => {
                let (Some(i), Some(g), Some(l)) =
                    (num(arg(1)), arg(2).and_then(unhex16), num(arg(3)))
                else {
                    writeln!(out, "err usage")?;
                    return Ok(true);
                };
                let g = group(i as u8, g, l as u16);
                let Some(ep) = self.ep.as_mut() else {
                    writeln!(out, "err not open")?;
                    return Ok(true);
                };
                if c == "attach" {
                    match ep.attach(&g) {
                        Ok(()) => writeln!(out, "ok")?,
                        Err(e) => writeln!(out, "err {e}")?,
                    }
                } else {
                    ep.detach(&g);
                    writeln!(out, "ok")?;
                }
            }
            Some("send") => {
                let (Some(dlid), Some(dqpn), Some(dgid), Some(tag)) = (
                    num(arg(1)),
                    num(arg(2)),
                    arg(3).and_then(unhex16),
                    num(arg(4)),
                ) else {
                    writeln!(out, "err usage")?;
                    return Ok(true);
                };
                let count = num(arg(5)).unwrap_or(1);
                // A distinct flow label makes a distinct AV (and address handle).
                let flow_label = num(arg(6)).unwrap_or(0) as u32;
                let to = unicast(dlid, dqpn, dgid, flow_label);
                self.sends(to, tag, count, out)?;
            }
            Some("raw") => {
                let (Some(dlid), Some(dqpn), Some(dgid), Some(bytes)) = (
                    num(arg(1)),
                    num(arg(2)),
                    arg(3).and_then(unhex16),
                    arg(4).and_then(unhex_mad),
                ) else {
                    writeln!(out, "err usage")?;
                    return Ok(true);
                };
                let count = num(arg(5)).unwrap_or(1);
                let Some(vary) = arg(6).map_or(Some(Vec::new()), |a| {
                    a.split(',')
                        .map(|o| o.parse::<usize>().ok().filter(|&o| o + 4 <= MAD_LEN))
                        .collect::<Option<Vec<usize>>>()
                }) else {
                    writeln!(
                        out,
                        "err usage: offsets are byte offsets below {}",
                        MAD_LEN - 3
                    )?;
                    return Ok(true);
                };
                let to = unicast(dlid, dqpn, dgid, 0);
                let copy = |i: u64| {
                    let mut m = bytes;
                    for &o in &vary {
                        m[o..o + 4].copy_from_slice(&(i as u32).to_be_bytes());
                    }
                    m
                };
                self.send_each(to, count, true, copy, out)?;
            }
            Some("mraw") => {
                let (Some(i), Some(bytes)) = (num(arg(1)), arg(2).and_then(unhex_mad)) else {
                    writeln!(out, "err usage")?;
                    return Ok(true);
                };
                self.send_each(AcmDest::Group(i as u8), 1, true, |_| bytes, out)?;
            }
            Some("msend") => {
                let (Some(i), Some(tag)) = (num(arg(1)), num(arg(2))) else {
                    writeln!(out, "err usage")?;
                    return Ok(true);
                };
                let count = num(arg(3)).unwrap_or(1);
                self.sends(AcmDest::Group(i as u8), tag, count, out)?;
            }
            Some("poll") => {
                let n = self.poll();
                writeln!(out, "ok completions={n}")?;
            }
            Some("recv") => {
                let n = num(arg(1)).unwrap_or(1) as usize;
                let ms = num(arg(2)).unwrap_or(3000);
                self.recv(n, Duration::from_millis(ms), out)?;
            }
            Some("arm") => match self.ep.as_mut().map(UdEndpoint::arm) {
                Some(Ok(())) => writeln!(out, "ok")?,
                Some(Err(e)) => writeln!(out, "err {e}")?,
                None => writeln!(out, "err not open")?,
            },
            Some("wait") => {
                let ms = num(arg(1)).unwrap_or(300);
                let Some(ep) = self.ep.as_mut() else {
                    writeln!(out, "err not open")?;
                    return Ok(true);
                };
                let mut p = libc::pollfd {
                    fd: ep.event_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one live pollfd.
                let r = unsafe { libc::poll(&mut p, 1, ms.min(60_000) as i32) };
                while r > 0 && ep.ack_event() {
                    self.events += 1;
                }
                writeln!(out, "ok woke={}", u8::from(r > 0))?;
            }
            Some("stats") => {
                let Some(ep) = self.ep.as_ref() else {
                    writeln!(out, "err not open")?;
                    return Ok(true);
                };
                let s = ep.stats();
                writeln!(
                    out,
                    "ok sends={} send_errors={} no_buffer={} recvs={} recv_errors={} recv_short={} ah_created={} ah_evicted={} ah_busy={} qp_resets={} rq_starved={} recv_posted={} send_inflight={} events={}",
                    s.sends, s.send_errors, s.no_buffer, s.recvs, s.recv_errors, s.recv_short,
                    s.ah_created, s.ah_evicted, s.ah_busy, s.qp_resets, s.rq_starved,
                    s.recv_posted, s.send_inflight, self.events
                )?;
            }
            Some("close") => match self.ep.take() {
                Some(ep) => match ep.close() {
                    Ok(()) => writeln!(
                        out,
                        "ok fds={},{} threads={},{}",
                        self.fds_before,
                        count_dir("/proc/self/fd"),
                        self.threads_before,
                        count_dir("/proc/self/task")
                    )?,
                    Err(e) => writeln!(out, "err {e}")?,
                },
                None => writeln!(out, "err not open")?,
            },
            Some(other) => writeln!(out, "err unknown command {other}")?,
        }
        Ok(true)
    }
}

fn main() {
    let mut agent = Agent {
        ep: None,
        dev: None,
        inbox: VecDeque::new(),
        events: 0,
        fds_before: 0,
        threads_before: 0,
    };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        match agent.command(&line, &mut out) {
            Ok(true) => {}
            Ok(false) | Err(_) => break,
        }
        if out.flush().is_err() {
            break;
        }
    }
    // Endpoint before device.
    agent.ep = None;
    agent.dev = None;
}
