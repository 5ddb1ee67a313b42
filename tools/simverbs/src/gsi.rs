//! The GSI bridge: UD datagrams between a simverbs QP and the GSI (QP1) of other nodes,
//! carried by ibsim through the QP's port ([`crate::host`]).
//!
//! A UD send whose AH DLID is unicast and whose remote QPN is 1 does not go through the
//! simverbs transport: the MAD is handed to ibsim from the QP's port's client, as if the QP
//! were a umad agent, so it reaches OpenSM's SA (or whatever SM client ibsim finds on that
//! node's QP1). The QP is a consumer of its port ([`crate::host::Consumer::Qp`]): its requests
//! carry its tag in TID bits 32–47, so answers come back to it, and the bridge restores the
//! TID's upper 32 bits as the QP sent them ([`TidTable`]): through the bridge the whole TID
//! survives, unlike through umad.
//!
//! **Reports.** ibsim gives an unsolicited MAD for QPN q to the one client registered with
//! `qp = q`, and a port has one client, registered with [`crate::host::REPORT_QPN`]. OpenSM
//! sends its Reports to the source QP of the `Set(InformInfo)` and matches an unsubscription
//! by the InformInfo's QPN field. So a `Set(InformInfo)` a QP sends leaves from that QPN, with
//! it in the QPN field, the port counts the QP as a subscriber (an unsubscription uncounts
//! it), and the SA's Reports to that QPN are delivered to every QP of the port subscribed;
//! the answer to the Set gets the QP's own QPN back. The SA's InformInfo records therefore
//! show the port's Report QPN, one per port.
//!
//! A MAD nobody takes (no route, nobody on the destination QP) comes back from ibsim with
//! status 110: counted, dropped (on a fabric it would be lost).

use crate::host::{Consumer, HostPort};
use crate::ibsim::SimRequest;
use crate::qp::QpInner;
use crate::transport::Datagram;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use crate::ibsim::MAD_SIZE;

/// The GSI's well-known Q_Key (IBA 13.4.6.1).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// Outstanding request TIDs remembered per QP (oldest forgotten first).
pub const TID_TABLE_LEN: usize = 1024;

/// A MAD's TID (bytes 8..16, big-endian).
fn tid_of(mad: &[u8]) -> u64 {
    let mut t = [0u8; 8];
    t.copy_from_slice(&mad[8..16]);
    u64::from_be_bytes(t)
}

/// Whether a MAD is a response (method R bit).
fn is_response(mad: &[u8]) -> bool {
    mad[3] & 0x80 != 0
}

/// SubnAdm class, attribute InformInfo, and where its fields sit in an SA MAD (the SA header
/// ends at 56; IBA 13.4.8.3).
const CLASS_SA: u8 = 0x03;
const ATTR_INFORM_INFO: u16 = 0x0003;
const INFORM_SUBSCRIBE: usize = 56 + 23;
const INFORM_QPN: usize = 56 + 28;

fn is_inform_info(mad: &[u8]) -> bool {
    mad[1] == CLASS_SA && u16::from_be_bytes([mad[16], mad[17]]) == ATTR_INFORM_INFO
}

/// Replaces the 24-bit QPN of an InformInfo, keeping the 8 bits after it.
fn set_inform_qpn(mad: &mut [u8], qpn: u32) {
    let low = mad[INFORM_QPN + 3];
    mad[INFORM_QPN..INFORM_QPN + 4].copy_from_slice(&((qpn << 8) | u32::from(low)).to_be_bytes());
}

const TID_LOW: u64 = 0x0000_ffff_ffff_ffff;

/// The upper 32 TID bits of requests a QP sent through its port (the tag and ibsim overwrite
/// them), keyed by the low 48 bits as they go on the wire (tag and the QP's own low 32 bits);
/// bounded to [`TID_TABLE_LEN`] entries, oldest dropped first. A request re-sent with the same
/// wire bits updates its entry.
#[derive(Default)]
pub struct TidTable {
    entries: std::collections::VecDeque<(u64, u32)>,
}

impl TidTable {
    /// Remembers the upper 32 bits of `tid`, sent on the wire with low 48 bits `wire`.
    pub fn remember(&mut self, wire: u64, tid: u64) {
        let low = wire & TID_LOW;
        self.entries.retain(|(l, _)| *l != low);
        if self.entries.len() >= TID_TABLE_LEN {
            self.entries.pop_front();
        }
        self.entries.push_back((low, (tid >> 32) as u32));
    }

    /// `tid` as the QP sent it, if its low 48 bits were remembered.
    pub fn restore(&self, tid: u64) -> Option<u64> {
        let low = tid & TID_LOW;
        self.entries
            .iter()
            .rev()
            .find(|(l, _)| *l == low)
            .map(|(_, h)| (tid & 0xffff_ffff) | (u64::from(*h) << 32))
    }
}

/// The tag of `qp` on port `hp`, registering the QP as the port's consumer on first use.
fn tag(qp: &Arc<QpInner>, hp: &'static Arc<HostPort>) -> Option<u16> {
    let mut g = qp.gsi.lock().ok()?;
    if let Some((p, t)) = g.port {
        if std::ptr::eq(Arc::as_ptr(p), Arc::as_ptr(hp)) {
            return Some(t);
        }
        p.remove_consumer(t);
        g.port = None;
    }
    let t = hp.add_consumer(Consumer::Qp(Arc::downgrade(qp)))?;
    g.port = Some((hp, t));
    Some(t)
}

/// Forgets `qp` as a consumer of its port (the QP is destroyed).
pub fn release(qp: &QpInner) {
    if let Some((p, t)) = qp.gsi.lock().ok().and_then(|mut g| g.port.take()) {
        p.remove_consumer(t);
    }
}

/// Sends one MAD from `qp` (at `slid`) to QP1 at `dlid` through port `hp`. Never blocks;
/// `false` if ibsim's socket did not take it.
pub fn send(
    qp: &Arc<QpInner>,
    hp: &'static Arc<HostPort>,
    dlid: u16,
    slid: u16,
    mad: &[u8],
) -> bool {
    let Some(tag) = tag(qp, hp) else {
        return false;
    };
    let mut m = [0u8; MAD_SIZE];
    m.copy_from_slice(&mad[..MAD_SIZE]);
    let mut sqp = qp.qpn;
    if !is_response(&m) {
        let tid = tid_of(&m);
        let wire = (tid & 0xffff_0000_ffff_ffff) | (u64::from(tag) << 32);
        if let Ok(mut g) = qp.gsi.lock() {
            g.tids.remember(wire, tid);
        }
        m[8..16].copy_from_slice(&wire.to_be_bytes());
        if is_inform_info(&m) && m[3] == 0x02 {
            hp.subscribe(qp, m[INFORM_SUBSCRIBE] != 0);
            set_inform_qpn(&mut m, crate::host::REPORT_QPN);
            sqp = crate::host::REPORT_QPN;
        }
    }
    hp.send(dlid, slid, 1, sqp, &m)
}

/// One datagram from ibsim for `qp`: a MAD for it, or one of its own bounced as undeliverable.
pub fn arrived(q: &Arc<QpInner>, hp: &HostPort, mut r: SimRequest) {
    if r.status != 0 {
        // Our own request, returned by ibsim: no route or nobody on that QP1 (on a fabric it
        // would simply be lost).
        q.counters.gsi_undelivered.fetch_add(1, Ordering::Relaxed);
        crate::debug(format_args!(
            "QP {:#x}: MAD to LID {} not delivered by ibsim (status {})",
            q.qpn, r.dlid, r.status
        ));
        if r.status != crate::ibsim::STATUS_UNDELIVERED {
            crate::debug(format_args!("unexpected ibsim status {}", r.status));
        }
        return;
    }
    if is_response(&r.mad) {
        if let Some(t) = q
            .gsi
            .lock()
            .ok()
            .and_then(|g| g.tids.restore(tid_of(&r.mad)))
        {
            r.mad[8..16].copy_from_slice(&t.to_be_bytes());
        }
        if is_inform_info(&r.mad) {
            set_inform_qpn(&mut r.mad, q.qpn);
        }
    }
    q.counters.gsi_received.fetch_add(1, Ordering::Relaxed);
    let d = Datagram {
        slid: r.slid,
        dlid: r.dlid,
        src_qpn: r.sqp & 0x00ff_ffff,
        dst_qpn: q.qpn,
        qkey: GSI_QKEY,
        pkey: 0xffff,
        sl: 0,
        payload: r.mad.to_vec(),
        ..Default::default()
    };
    crate::capture::record(&d);
    crate::debug(format_args!(
        "QP {:#x}: MAD from LID {} through {} port {}",
        q.qpn, r.slid, hp.spec.ca, hp.spec.port
    ));
    q.deliver(&d);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tids_are_restored_and_bounded() {
        // Sent with tag 7 in bits 32-47; ibsim puts its client index 3 in 48-63.
        let mut t = TidTable::default();
        t.remember(0x0000_0007_0000_0001, 0xbeef_1234_0000_0001);
        let wire = 0x0003_0007_0000_0001;
        assert_eq!(t.restore(wire), Some(0xbeef_1234_0000_0001));
        assert_eq!(t.restore(0x0003_0007_0000_0002), None);
        assert_eq!(t.restore(0x0003_0008_0000_0001), None, "another tag");
        for i in 0..TID_TABLE_LEN as u64 {
            t.remember(0x0000_0007_0000_1000 + i, 0x1111_0000_0000_1000 + i);
        }
        assert_eq!(t.restore(wire), None, "oldest entry forgotten");
        assert_eq!(
            t.restore(0x0003_0007_0000_1000),
            Some(0x1111_0000_0000_1000)
        );
        t.remember(0x0000_0007_0000_1000, 0x2222_0000_0000_1000);
        assert_eq!(
            t.restore(0x0003_0007_0000_1000),
            Some(0x2222_0000_0000_1000)
        );
        assert!(t.entries.len() <= TID_TABLE_LEN);
    }

    #[test]
    fn an_rmpp_answer_keeps_its_tid_for_every_segment_and_ack() {
        // A GetTable (request), then its answer's segments interleaved with our ACKs (requests
        // with the same TID, GetTable 0x12) and other traffic: every segment gets our upper
        // bits back, and the ACKs keep the entry from being forgotten.
        let mut t = TidTable::default();
        let ours = 0x7a11_0042_0000_0001u64;
        let sent = 0x0000_0005_0000_0001u64; // tag 5
        t.remember(sent, ours);
        let wire = 0x0004_0005_0000_0001u64; // ibsim's client index in bits 48-63
        for seg in 0..3 * TID_TABLE_LEN as u64 {
            assert_eq!(t.restore(wire), Some(ours), "segment {seg}");
            if seg % 16 == 0 {
                t.remember(sent, ours); // the ACK after a window
            }
            t.remember(0x0000_0005_0010_0000 + seg, 0x1111_0000_0010_0000 + seg);
        }
    }

    #[test]
    fn inform_info_qpn_is_replaced_keeping_the_response_time() {
        let mut m = [0u8; MAD_SIZE];
        m[1] = CLASS_SA;
        m[16..18].copy_from_slice(&ATTR_INFORM_INFO.to_be_bytes());
        m[INFORM_QPN..INFORM_QPN + 4].copy_from_slice(&((0x12_3456u32 << 8) | 19).to_be_bytes());
        assert!(is_inform_info(&m));
        set_inform_qpn(&mut m, crate::host::REPORT_QPN);
        let w = u32::from_be_bytes(m[INFORM_QPN..INFORM_QPN + 4].try_into().unwrap());
        assert_eq!((w >> 8, w & 0xff), (crate::host::REPORT_QPN, 19));
        m[17] = 0xf3; // InformInfoRecord
        assert!(!is_inform_info(&m));
    }
}
