//! SA MCMemberRecord (attribute 0x0038): 56 bytes (52 + 4 pad), network byte order, the
//! layout of `struct umad_sa_mcmember_record` in `<infiniband/umad_sa_mcm.h>`; its component
//! mask; and ibacm's multicast GID layout `FF15:4001:<pkey|0x8000>:<tos><rate>:<mtu>00::`.
//!
//! ```text
//!  0 MGID (16)  16 PortGID (16)  32 Q_Key (4)  36 MLID (2)  38 MtuSel:2 Mtu:6  39 TClass
//! 40 P_Key (2)  42 RateSel:2 Rate:6  43 PktLifeSel:2 PktLife:6
//! 44 SL:4 FlowLabel:20 HopLimit:8 (4)  48 Scope:4 JoinState:4  49 ProxyJoin:1 rsv:7
//! 50 reserved (2)  52 pad (4)
//! ```

use super::gid::Gid;
use super::{array, be16, be32, put_be16, put_be32, view, Error, Result, Selector};

/// Length of an MCMemberRecord as carried in an SA MAD (with the 4-byte pad).
pub const MCMEMBER_RECORD_LEN: usize = 56;

/// JoinState bit: full member.
pub const JOIN_FULL_MEMBER: u8 = 1 << 0;
/// JoinState bit: non member.
pub const JOIN_NON_MEMBER: u8 = 1 << 1;
/// JoinState bit: send-only non member.
pub const JOIN_SEND_ONLY_NON_MEMBER: u8 = 1 << 2;
/// JoinState bit: send-only full member.
pub const JOIN_SEND_ONLY_FULL_MEMBER: u8 = 1 << 3;
/// Scope: link local.
pub const SCOPE_LINK_LOCAL: u8 = 0x2;
/// Scope: site local (what ibacm uses).
pub const SCOPE_SITE_LOCAL: u8 = 0x5;
/// Scope: organisation local.
pub const SCOPE_ORG_LOCAL: u8 = 0x8;
/// Scope: global.
pub const SCOPE_GLOBAL: u8 = 0xe;
/// ibacm's Q_Key (`ACM_QKEY`), the well-known GSI Q_Key.
pub const ACM_QKEY: u32 = 0x8001_0000;

mod field {
    use crate::wire::Field;
    pub const MGID: Field = 0..16;
    pub const PORT_GID: Field = 16..32;
    pub const QKEY: Field = 32..36;
    pub const MLID: Field = 36..38;
    pub const MTU: usize = 38;
    pub const TCLASS: usize = 39;
    pub const PKEY: Field = 40..42;
    pub const RATE: usize = 42;
    pub const PKT_LIFE: usize = 43;
    pub const SL_FLOW_HOP: Field = 44..48;
    pub const SCOPE_STATE: usize = 48;
    pub const PROXY_JOIN: usize = 49;
    pub const RESERVED: Field = 50..56;
}

view! {
    /// A read/write view of an MCMemberRecord.
    pub struct McMemberRecord(len = MCMEMBER_RECORD_LEN);
    /// Wraps a buffer and checks that it holds a whole record.
    fn new_checked;
    /// Checks the length (56 bytes); after success no accessor panics.
    fn check_len;
}

impl<T: AsRef<[u8]>> McMemberRecord<T> {
    /// Multicast GID.
    pub fn mgid(&self) -> Gid {
        Gid(array(self.b(), field::MGID.start))
    }
    /// Port GID of the member.
    pub fn port_gid(&self) -> Gid {
        Gid(array(self.b(), field::PORT_GID.start))
    }
    /// Q_Key.
    pub fn qkey(&self) -> u32 {
        be32(self.b(), field::QKEY.start)
    }
    /// Multicast LID (0xC000 and up).
    pub fn mlid(&self) -> u16 {
        be16(self.b(), field::MLID.start)
    }
    /// MTU selector.
    pub fn mtu_selector(&self) -> Selector {
        Selector::from_byte(self.b()[field::MTU])
    }
    /// MTU (`ibv_mtu`).
    pub fn mtu(&self) -> u8 {
        self.b()[field::MTU] & 0x3f
    }
    /// Traffic class.
    pub fn tclass(&self) -> u8 {
        self.b()[field::TCLASS]
    }
    /// P_Key.
    pub fn pkey(&self) -> u16 {
        be16(self.b(), field::PKEY.start)
    }
    /// Rate selector.
    pub fn rate_selector(&self) -> Selector {
        Selector::from_byte(self.b()[field::RATE])
    }
    /// Rate (`ibv_rate`).
    pub fn rate(&self) -> u8 {
        self.b()[field::RATE] & 0x3f
    }
    /// PacketLifeTime selector.
    pub fn packet_life_selector(&self) -> Selector {
        Selector::from_byte(self.b()[field::PKT_LIFE])
    }
    /// PacketLifeTime.
    pub fn packet_life(&self) -> u8 {
        self.b()[field::PKT_LIFE] & 0x3f
    }
    /// The raw SL/FlowLabel/HopLimit word.
    pub fn sl_flow_hop(&self) -> u32 {
        be32(self.b(), field::SL_FLOW_HOP.start)
    }
    /// Service level (4 bits).
    pub fn sl(&self) -> u8 {
        (self.sl_flow_hop() >> 28) as u8
    }
    /// FlowLabel (20 bits).
    pub fn flow_label(&self) -> u32 {
        (self.sl_flow_hop() >> 8) & 0xf_ffff
    }
    /// HopLimit.
    pub fn hop_limit(&self) -> u8 {
        self.sl_flow_hop() as u8
    }
    /// Scope (upper nibble of the scope/state byte).
    pub fn scope(&self) -> u8 {
        self.b()[field::SCOPE_STATE] >> 4
    }
    /// JoinState (lower nibble).
    pub fn join_state(&self) -> u8 {
        self.b()[field::SCOPE_STATE] & 0xf
    }
    /// ProxyJoin bit (bit 7 of byte 49).
    pub fn proxy_join(&self) -> bool {
        self.b()[field::PROXY_JOIN] & 0x80 != 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> McMemberRecord<T> {
    /// Sets the MGID.
    pub fn set_mgid(&mut self, v: Gid) {
        self.bm()[field::MGID].copy_from_slice(&v.0)
    }
    /// Sets the port GID.
    pub fn set_port_gid(&mut self, v: Gid) {
        self.bm()[field::PORT_GID].copy_from_slice(&v.0)
    }
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, v: u32) {
        put_be32(self.bm(), field::QKEY.start, v)
    }
    /// Sets the MLID.
    pub fn set_mlid(&mut self, v: u16) {
        put_be16(self.bm(), field::MLID.start, v)
    }
    /// Sets the MTU selector and value.
    pub fn set_mtu(&mut self, sel: Selector, v: u8) {
        self.bm()[field::MTU] = sel.pack(v)
    }
    /// Sets the traffic class.
    pub fn set_tclass(&mut self, v: u8) {
        self.bm()[field::TCLASS] = v
    }
    /// Sets the P_Key.
    pub fn set_pkey(&mut self, v: u16) {
        put_be16(self.bm(), field::PKEY.start, v)
    }
    /// Sets the rate selector and value.
    pub fn set_rate(&mut self, sel: Selector, v: u8) {
        self.bm()[field::RATE] = sel.pack(v)
    }
    /// Sets the packet-lifetime selector and value.
    pub fn set_packet_life(&mut self, sel: Selector, v: u8) {
        self.bm()[field::PKT_LIFE] = sel.pack(v)
    }
    /// Sets SL (4 bits), FlowLabel (20 bits) and HopLimit.
    pub fn set_sl_flow_hop(&mut self, sl: u8, flow_label: u32, hop_limit: u8) {
        let w = (u32::from(sl & 0xf) << 28) | ((flow_label & 0xf_ffff) << 8) | hop_limit as u32;
        put_be32(self.bm(), field::SL_FLOW_HOP.start, w)
    }
    /// Sets Scope (4 bits) and JoinState (4 bits).
    pub fn set_scope_state(&mut self, scope: u8, join_state: u8) {
        self.bm()[field::SCOPE_STATE] = (scope << 4) | (join_state & 0xf)
    }
    /// Sets the ProxyJoin bit (the other 7 bits become 0).
    pub fn set_proxy_join(&mut self, v: bool) {
        self.bm()[field::PROXY_JOIN] = u8::from(v) << 7
    }
    /// Zeroes the reserved and pad bytes.
    pub fn clear_reserved(&mut self) {
        self.bm()[field::RESERVED].fill(0)
    }
}

/// A parsed MCMemberRecord.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct McMemberRepr {
    /// Multicast GID.
    pub mgid: Gid,
    /// Port GID.
    pub port_gid: Gid,
    /// Q_Key.
    pub qkey: u32,
    /// MLID.
    pub mlid: u16,
    /// MTU selector.
    pub mtu_selector: Selector,
    /// MTU (6 bits).
    pub mtu: u8,
    /// Traffic class.
    pub tclass: u8,
    /// P_Key.
    pub pkey: u16,
    /// Rate selector.
    pub rate_selector: Selector,
    /// Rate (6 bits).
    pub rate: u8,
    /// PacketLifeTime selector.
    pub packet_life_selector: Selector,
    /// PacketLifeTime (6 bits).
    pub packet_life: u8,
    /// SL (4 bits).
    pub sl: u8,
    /// FlowLabel (20 bits).
    pub flow_label: u32,
    /// HopLimit.
    pub hop_limit: u8,
    /// Scope (4 bits).
    pub scope: u8,
    /// JoinState (4 bits).
    pub join_state: u8,
    /// ProxyJoin.
    pub proxy_join: bool,
}

impl McMemberRepr {
    /// The all-zero record.
    pub const ZERO: McMemberRepr = McMemberRepr {
        mgid: Gid::ZERO,
        port_gid: Gid::ZERO,
        qkey: 0,
        mlid: 0,
        mtu_selector: Selector::GreaterThan,
        mtu: 0,
        tclass: 0,
        pkey: 0,
        rate_selector: Selector::GreaterThan,
        rate: 0,
        packet_life_selector: Selector::GreaterThan,
        packet_life: 0,
        sl: 0,
        flow_label: 0,
        hop_limit: 0,
        scope: 0,
        join_state: 0,
        proxy_join: false,
    };

    /// The join record ibacm's `acmp_init_join` sends (with [`McMemberMask::ACM_JOIN`]):
    /// Q_Key 0x80010000, MTU and rate `Exactly`, TClass 0, SL/flow/hop 0, scope site-local,
    /// full member.
    pub const fn acm_join(mgid: Gid, port_gid: Gid, pkey: u16, rate: u8, mtu: u8) -> Self {
        McMemberRepr {
            mgid,
            port_gid,
            qkey: ACM_QKEY,
            mtu_selector: Selector::Exactly,
            mtu,
            pkey,
            rate_selector: Selector::Exactly,
            rate,
            scope: SCOPE_SITE_LOCAL,
            join_state: JOIN_FULL_MEMBER,
            ..Self::ZERO
        }
    }

    /// Parses a record.
    pub fn parse<T: AsRef<[u8]>>(r: &McMemberRecord<T>) -> Result<McMemberRepr> {
        r.check_len()?;
        Ok(McMemberRepr {
            mgid: r.mgid(),
            port_gid: r.port_gid(),
            qkey: r.qkey(),
            mlid: r.mlid(),
            mtu_selector: r.mtu_selector(),
            mtu: r.mtu(),
            tclass: r.tclass(),
            pkey: r.pkey(),
            rate_selector: r.rate_selector(),
            rate: r.rate(),
            packet_life_selector: r.packet_life_selector(),
            packet_life: r.packet_life(),
            sl: r.sl(),
            flow_label: r.flow_label(),
            hop_limit: r.hop_limit(),
            scope: r.scope(),
            join_state: r.join_state(),
            proxy_join: r.proxy_join(),
        })
    }
    /// Parses the first 56 bytes of `bytes`.
    pub fn parse_bytes(bytes: &[u8]) -> Result<McMemberRepr> {
        Self::parse(&McMemberRecord::new_checked(bytes)?)
    }
    /// Bytes needed by [`emit`](Self::emit).
    pub const fn buffer_len(&self) -> usize {
        MCMEMBER_RECORD_LEN
    }
    /// Writes every field; values are masked to their widths; reserved/pad bytes become 0.
    /// The buffer must be ≥ 56 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, r: &mut McMemberRecord<T>) {
        r.set_mgid(self.mgid);
        r.set_port_gid(self.port_gid);
        r.set_qkey(self.qkey);
        r.set_mlid(self.mlid);
        r.set_mtu(self.mtu_selector, self.mtu);
        r.set_tclass(self.tclass);
        r.set_pkey(self.pkey);
        r.set_rate(self.rate_selector, self.rate);
        r.set_packet_life(self.packet_life_selector, self.packet_life);
        r.set_sl_flow_hop(self.sl, self.flow_label, self.hop_limit);
        r.set_scope_state(self.scope & 0xf, self.join_state);
        r.set_proxy_join(self.proxy_join);
        r.clear_reserved();
    }
    /// Emits into a fresh 56-byte array.
    pub fn to_bytes(&self) -> [u8; MCMEMBER_RECORD_LEN] {
        let mut b = [0u8; MCMEMBER_RECORD_LEN];
        self.emit(&mut McMemberRecord::new_unchecked(&mut b[..]));
        b
    }
}

/// MCMemberRecord component mask (host value; bit numbers of `UMAD_SA_MCM_COMP_MASK_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct McMemberMask(pub u64);

impl McMemberMask {
    /// MGID (bit 0).
    pub const MGID: McMemberMask = McMemberMask(1 << 0);
    /// PortGID (bit 1).
    pub const PORT_GID: McMemberMask = McMemberMask(1 << 1);
    /// Q_Key (bit 2).
    pub const QKEY: McMemberMask = McMemberMask(1 << 2);
    /// MLID (bit 3).
    pub const MLID: McMemberMask = McMemberMask(1 << 3);
    /// MTUSelector (bit 4).
    pub const MTU_SELECTOR: McMemberMask = McMemberMask(1 << 4);
    /// MTU (bit 5).
    pub const MTU: McMemberMask = McMemberMask(1 << 5);
    /// TClass (bit 6).
    pub const TCLASS: McMemberMask = McMemberMask(1 << 6);
    /// P_Key (bit 7).
    pub const PKEY: McMemberMask = McMemberMask(1 << 7);
    /// RateSelector (bit 8).
    pub const RATE_SELECTOR: McMemberMask = McMemberMask(1 << 8);
    /// Rate (bit 9).
    pub const RATE: McMemberMask = McMemberMask(1 << 9);
    /// PacketLifeTimeSelector (bit 10).
    pub const PACKET_LIFE_SELECTOR: McMemberMask = McMemberMask(1 << 10);
    /// PacketLifeTime (bit 11).
    pub const PACKET_LIFE: McMemberMask = McMemberMask(1 << 11);
    /// SL (bit 12).
    pub const SL: McMemberMask = McMemberMask(1 << 12);
    /// FlowLabel (bit 13).
    pub const FLOW_LABEL: McMemberMask = McMemberMask(1 << 13);
    /// HopLimit (bit 14).
    pub const HOP_LIMIT: McMemberMask = McMemberMask(1 << 14);
    /// Scope (bit 15).
    pub const SCOPE: McMemberMask = McMemberMask(1 << 15);
    /// JoinState (bit 16).
    pub const JOIN_STATE: McMemberMask = McMemberMask(1 << 16);
    /// ProxyJoin (bit 17).
    pub const PROXY_JOIN: McMemberMask = McMemberMask(1 << 17);
    /// What ibacm's `acmp_init_join` sets: MGID, PortGID, Q_Key, MTU pair, TClass, P_Key,
    /// rate pair, SL, FlowLabel, Scope, JoinState (= 0x1B3F7).
    pub const ACM_JOIN: McMemberMask = McMemberMask(
        Self::MGID.0
            | Self::PORT_GID.0
            | Self::QKEY.0
            | Self::MTU_SELECTOR.0
            | Self::MTU.0
            | Self::TCLASS.0
            | Self::PKEY.0
            | Self::RATE_SELECTOR.0
            | Self::RATE.0
            | Self::SL.0
            | Self::FLOW_LABEL.0
            | Self::SCOPE.0
            | Self::JOIN_STATE.0,
    );
    /// Names and masks of every component, in bit order (for printing).
    pub const NAMES: [(&'static str, McMemberMask); 18] = [
        ("MGID", Self::MGID),
        ("PortGID", Self::PORT_GID),
        ("Q_Key", Self::QKEY),
        ("MLID", Self::MLID),
        ("MTUSelector", Self::MTU_SELECTOR),
        ("MTU", Self::MTU),
        ("TClass", Self::TCLASS),
        ("P_Key", Self::PKEY),
        ("RateSelector", Self::RATE_SELECTOR),
        ("Rate", Self::RATE),
        ("PacketLifeTimeSelector", Self::PACKET_LIFE_SELECTOR),
        ("PacketLifeTime", Self::PACKET_LIFE),
        ("SL", Self::SL),
        ("FlowLabel", Self::FLOW_LABEL),
        ("HopLimit", Self::HOP_LIMIT),
        ("Scope", Self::SCOPE),
        ("JoinState", Self::JOIN_STATE),
        ("ProxyJoin", Self::PROXY_JOIN),
    ];
    /// The host value.
    pub const fn bits(self) -> u64 {
        self.0
    }
    /// True if every bit of `other` is set here.
    pub const fn contains(self, other: McMemberMask) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for McMemberMask {
    type Output = McMemberMask;
    fn bitor(self, rhs: McMemberMask) -> McMemberMask {
        McMemberMask(self.0 | rhs.0)
    }
}

/// ibacm's multicast GID: `FF15:4001:<pkey|0x8000>:<tos><rate>:<mtu>00::` (acmp_format_mgid).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AcmMgid {
    /// Partition key; the full-member bit 0x8000 is always set in the GID.
    pub pkey: u16,
    /// Type of service byte.
    pub tos: u8,
    /// `ibv_rate` code.
    pub rate: u8,
    /// `ibv_mtu` code.
    pub mtu: u8,
}

impl AcmMgid {
    /// Builds the GID.
    pub const fn to_gid(&self) -> Gid {
        let p = (self.pkey | 0x8000).to_be_bytes();
        Gid([
            0xff, 0x15, 0x40, 0x01, p[0], p[1], self.tos, self.rate, self.mtu, 0, 0, 0, 0, 0, 0, 0,
        ])
    }
    /// Recognises an ibacm MGID: prefix `ff15:4001`, P_Key with 0x8000 set, bytes 9.. zero.
    /// The returned `pkey` includes the 0x8000 bit.
    pub fn parse(gid: &Gid) -> Result<AcmMgid> {
        let b = &gid.0;
        if b[..4] != [0xff, 0x15, 0x40, 0x01] || b[4] & 0x80 == 0 || b[9..].iter().any(|&x| x != 0)
        {
            return Err(Error::Malformed);
        }
        Ok(AcmMgid {
            pkey: u16::from_be_bytes([b[4], b[5]]),
            tos: b[6],
            rate: b[7],
            mtu: b[8],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ibacm base-group join for P_Key 0xffff, 10 Gb/s, MTU 2048, port GID 0x100004.
    static JOIN: [u8; 56] = [
        0xff, 0x15, 0x40, 0x01, 0xff, 0xff, 0x00, 0x03, 0x04, 0, 0, 0, 0, 0, 0, 0, // mgid
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0x04, // port gid
        0x80, 0x01, 0x00, 0x00, // qkey
        0x00, 0x00, // mlid
        0x84, 0x00, // mtu exactly 2048, tclass
        0xff, 0xff, // pkey
        0x83, 0x00, // rate exactly 10G, life
        0x00, 0x00, 0x00, 0x00, // sl/flow/hop
        0x51, 0x00, 0, 0, 0, 0, 0, 0, // scope 5 full member, proxy, rsv, pad
    ];

    fn join_repr() -> McMemberRepr {
        let mgid = AcmMgid {
            pkey: 0xffff,
            tos: 0,
            rate: 3,
            mtu: 4,
        }
        .to_gid();
        McMemberRepr::acm_join(mgid, Gid::from_parts(0xfe80 << 48, 0x10_0004), 0xffff, 3, 4)
    }

    #[test]
    fn acm_join_is_byte_exact() {
        assert_eq!(join_repr().to_bytes(), JOIN);
        assert_eq!(McMemberRepr::parse_bytes(&JOIN).unwrap(), join_repr());
        assert_eq!(McMemberMask::ACM_JOIN.bits(), 0x1_b3f7);
    }

    #[test]
    fn packings() {
        let mut b = JOIN;
        let mut r = McMemberRecord::new_unchecked(&mut b[..]);
        r.set_sl_flow_hop(0xb, 0xabcde, 0x7f);
        r.set_scope_state(SCOPE_GLOBAL, JOIN_SEND_ONLY_FULL_MEMBER);
        r.set_proxy_join(true);
        r.set_mlid(0xc001);
        r.set_packet_life(Selector::LessThan, 0x13);
        assert_eq!(b[44..50], [0xba, 0xbc, 0xde, 0x7f, 0xe8, 0x80]);
        let r = McMemberRecord::new_checked(&b[..]).unwrap();
        assert_eq!(
            (r.sl(), r.flow_label(), r.hop_limit()),
            (0xb, 0xabcde, 0x7f)
        );
        assert_eq!((r.scope(), r.join_state()), (0xe, 8));
        assert!(r.proxy_join());
        assert_eq!(r.mlid(), 0xc001);
        assert_eq!(
            (r.packet_life_selector(), r.packet_life()),
            (Selector::LessThan, 0x13)
        );
        let p = McMemberRepr::parse(&r).unwrap();
        assert_eq!(p.to_bytes(), b);
    }

    #[test]
    fn mgid_layout() {
        let m = AcmMgid {
            pkey: 0x7fff,
            tos: 0x12,
            rate: 0x10,
            mtu: 5,
        };
        let g = m.to_gid();
        assert_eq!(
            g.0,
            [0xff, 0x15, 0x40, 0x01, 0xff, 0xff, 0x12, 0x10, 5, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(AcmMgid::parse(&g), Ok(AcmMgid { pkey: 0xffff, ..m }));
        let mut bad = g;
        bad.0[15] = 1;
        assert_eq!(AcmMgid::parse(&bad), Err(Error::Malformed));
        bad = g;
        bad.0[1] = 0x12;
        assert_eq!(AcmMgid::parse(&bad), Err(Error::Malformed));
        bad = g;
        bad.0[4] = 0x7f;
        assert_eq!(AcmMgid::parse(&bad), Err(Error::Malformed));
    }

    #[test]
    fn truncated() {
        for n in 0..56 {
            assert_eq!(McMemberRepr::parse_bytes(&JOIN[..n]), Err(Error::Truncated));
        }
    }
}
