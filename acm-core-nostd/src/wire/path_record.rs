//! SA PathRecord (attribute 0x0035): 64 bytes, network byte order, the layout of
//! `struct ibv_path_record` in `<infiniband/sa.h>`.
//!
//! ```text
//!  0 ServiceID (8)        8 DGID (16)          24 SGID (16)
//! 40 DLID (2)            42 SLID (2)
//! 44 RawTraffic:1 rsv:3 FlowLabel:20 HopLimit:8 (4)
//! 48 TClass  49 Reversible:1 NumbPath:7  50 P_Key (2)  52 QoSClass:12 SL:4 (2)
//! 54 MtuSel:2 Mtu:6   55 RateSel:2 Rate:6   56 PktLifeSel:2 PktLife:6   57 Preference
//! 58 reserved (6)
//! ```
//!
//! Also here: the component mask ([`PathRecordMask`], bit numbers of IBA / `IB_COMP_MASK_PR_*`),
//! a query builder that requires exactly the fields the caller names, zero values included
//! ([`PathRecordQuery`]), and ibacm's own "every non-zero field" rule ([`acm_path_comp_mask`]).

use super::gid::Gid;
use super::{array, be16, be32, be64, put_be16, put_be32, put_be64, view, Result, Selector};

/// Length of a PathRecord in bytes.
pub const PATH_RECORD_LEN: usize = 64;

mod field {
    use crate::wire::Field;
    pub const SERVICE_ID: Field = 0..8;
    pub const DGID: Field = 8..24;
    pub const SGID: Field = 24..40;
    pub const DLID: Field = 40..42;
    pub const SLID: Field = 42..44;
    pub const FLOW_HOP: Field = 44..48;
    pub const TCLASS: usize = 48;
    pub const REV_NUMPATH: usize = 49;
    pub const PKEY: Field = 50..52;
    pub const QOS_SL: Field = 52..54;
    pub const MTU: usize = 54;
    pub const RATE: usize = 55;
    pub const PKT_LIFE: usize = 56;
    pub const PREFERENCE: usize = 57;
    pub const RESERVED: Field = 58..64;
}

view! {
    /// A read/write view of a 64-byte PathRecord.
    pub struct PathRecord(len = PATH_RECORD_LEN);
    /// Wraps a buffer and checks that it holds a whole record.
    fn new_checked;
    /// Checks the length; after success no accessor panics.
    fn check_len;
}

impl<T: AsRef<[u8]>> PathRecord<T> {
    /// ServiceID (64 bits).
    pub fn service_id(&self) -> u64 {
        be64(self.b(), field::SERVICE_ID.start)
    }
    /// Destination GID.
    pub fn dgid(&self) -> Gid {
        Gid(array(self.b(), field::DGID.start))
    }
    /// Source GID.
    pub fn sgid(&self) -> Gid {
        Gid(array(self.b(), field::SGID.start))
    }
    /// Destination LID.
    pub fn dlid(&self) -> u16 {
        be16(self.b(), field::DLID.start)
    }
    /// Source LID.
    pub fn slid(&self) -> u16 {
        be16(self.b(), field::SLID.start)
    }
    /// The whole RawTraffic/FlowLabel/HopLimit word.
    pub fn flowlabel_hoplimit(&self) -> u32 {
        be32(self.b(), field::FLOW_HOP.start)
    }
    /// RawTraffic bit (bit 31 of the flow/hop word).
    pub fn raw_traffic(&self) -> bool {
        self.flowlabel_hoplimit() >> 31 != 0
    }
    /// FlowLabel (20 bits).
    pub fn flow_label(&self) -> u32 {
        (self.flowlabel_hoplimit() >> 8) & 0xf_ffff
    }
    /// HopLimit.
    pub fn hop_limit(&self) -> u8 {
        self.flowlabel_hoplimit() as u8
    }
    /// Traffic class.
    pub fn tclass(&self) -> u8 {
        self.b()[field::TCLASS]
    }
    /// The raw Reversible/NumbPath byte.
    pub fn reversible_numpath(&self) -> u8 {
        self.b()[field::REV_NUMPATH]
    }
    /// Reversible bit.
    pub fn reversible(&self) -> bool {
        self.reversible_numpath() & 0x80 != 0
    }
    /// NumbPath (7 bits; a query field, 0 in answers).
    pub fn num_path(&self) -> u8 {
        self.reversible_numpath() & 0x7f
    }
    /// P_Key.
    pub fn pkey(&self) -> u16 {
        be16(self.b(), field::PKEY.start)
    }
    /// The raw QoSClass/SL word.
    pub fn qosclass_sl(&self) -> u16 {
        be16(self.b(), field::QOS_SL.start)
    }
    /// QoS class (12 bits).
    pub fn qos_class(&self) -> u16 {
        self.qosclass_sl() >> 4
    }
    /// Service level (4 bits).
    pub fn sl(&self) -> u8 {
        (self.qosclass_sl() & 0xf) as u8
    }
    /// Raw MTU byte (selector + value).
    pub fn mtu_byte(&self) -> u8 {
        self.b()[field::MTU]
    }
    /// MTU selector.
    pub fn mtu_selector(&self) -> Selector {
        Selector::from_byte(self.mtu_byte())
    }
    /// MTU (`ibv_mtu` value, 6 bits).
    pub fn mtu(&self) -> u8 {
        self.mtu_byte() & 0x3f
    }
    /// Raw Rate byte (selector + value).
    pub fn rate_byte(&self) -> u8 {
        self.b()[field::RATE]
    }
    /// Rate selector.
    pub fn rate_selector(&self) -> Selector {
        Selector::from_byte(self.rate_byte())
    }
    /// Rate (`ibv_rate` value, 6 bits).
    pub fn rate(&self) -> u8 {
        self.rate_byte() & 0x3f
    }
    /// Raw PacketLifeTime byte (selector + value).
    pub fn packet_life_byte(&self) -> u8 {
        self.b()[field::PKT_LIFE]
    }
    /// PacketLifeTime selector.
    pub fn packet_life_selector(&self) -> Selector {
        Selector::from_byte(self.packet_life_byte())
    }
    /// PacketLifeTime (6 bits, 4.096 µs × 2^value).
    pub fn packet_life(&self) -> u8 {
        self.packet_life_byte() & 0x3f
    }
    /// Preference (0 = best path).
    pub fn preference(&self) -> u8 {
        self.b()[field::PREFERENCE]
    }
    /// The whole 64-byte record.
    pub fn as_bytes(&self) -> &[u8; PATH_RECORD_LEN] {
        // check_len guaranteed ≥ 64 bytes; the slice has exactly 64.
        self.b()[..PATH_RECORD_LEN]
            .try_into()
            .unwrap_or(&[0; PATH_RECORD_LEN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> PathRecord<T> {
    /// Sets the ServiceID.
    pub fn set_service_id(&mut self, v: u64) {
        put_be64(self.bm(), field::SERVICE_ID.start, v)
    }
    /// Sets the DGID.
    pub fn set_dgid(&mut self, v: Gid) {
        self.bm()[field::DGID].copy_from_slice(&v.0)
    }
    /// Sets the SGID.
    pub fn set_sgid(&mut self, v: Gid) {
        self.bm()[field::SGID].copy_from_slice(&v.0)
    }
    /// Sets the DLID.
    pub fn set_dlid(&mut self, v: u16) {
        put_be16(self.bm(), field::DLID.start, v)
    }
    /// Sets the SLID.
    pub fn set_slid(&mut self, v: u16) {
        put_be16(self.bm(), field::SLID.start, v)
    }
    /// Sets RawTraffic, FlowLabel (20 bits) and HopLimit at once; the 3 reserved bits become 0.
    pub fn set_flow(&mut self, raw_traffic: bool, flow_label: u32, hop_limit: u8) {
        let w = (u32::from(raw_traffic) << 31) | ((flow_label & 0xf_ffff) << 8) | hop_limit as u32;
        put_be32(self.bm(), field::FLOW_HOP.start, w)
    }
    /// Sets the traffic class.
    pub fn set_tclass(&mut self, v: u8) {
        self.bm()[field::TCLASS] = v
    }
    /// Sets Reversible and NumbPath (7 bits).
    pub fn set_reversible_numpath(&mut self, reversible: bool, num_path: u8) {
        self.bm()[field::REV_NUMPATH] = (u8::from(reversible) << 7) | (num_path & 0x7f)
    }
    /// Sets the P_Key.
    pub fn set_pkey(&mut self, v: u16) {
        put_be16(self.bm(), field::PKEY.start, v)
    }
    /// Sets QoS class (12 bits) and SL (4 bits).
    pub fn set_qosclass_sl(&mut self, qos_class: u16, sl: u8) {
        put_be16(
            self.bm(),
            field::QOS_SL.start,
            ((qos_class & 0xfff) << 4) | (sl & 0xf) as u16,
        )
    }
    /// Sets the MTU selector and value.
    pub fn set_mtu(&mut self, sel: Selector, mtu: u8) {
        self.bm()[field::MTU] = sel.pack(mtu)
    }
    /// Sets the rate selector and value.
    pub fn set_rate(&mut self, sel: Selector, rate: u8) {
        self.bm()[field::RATE] = sel.pack(rate)
    }
    /// Sets the packet-lifetime selector and value.
    pub fn set_packet_life(&mut self, sel: Selector, life: u8) {
        self.bm()[field::PKT_LIFE] = sel.pack(life)
    }
    /// Sets the preference.
    pub fn set_preference(&mut self, v: u8) {
        self.bm()[field::PREFERENCE] = v
    }
    /// Zeroes the 6 reserved bytes.
    pub fn clear_reserved(&mut self) {
        self.bm()[field::RESERVED].fill(0)
    }
}

/// A parsed PathRecord. Every field of the record, unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PathRecordRepr {
    /// ServiceID.
    pub service_id: u64,
    /// Destination GID.
    pub dgid: Gid,
    /// Source GID.
    pub sgid: Gid,
    /// Destination LID.
    pub dlid: u16,
    /// Source LID.
    pub slid: u16,
    /// RawTraffic bit.
    pub raw_traffic: bool,
    /// FlowLabel (20 bits).
    pub flow_label: u32,
    /// HopLimit.
    pub hop_limit: u8,
    /// Traffic class.
    pub tclass: u8,
    /// Reversible bit.
    pub reversible: bool,
    /// NumbPath (7 bits).
    pub num_path: u8,
    /// P_Key.
    pub pkey: u16,
    /// QoS class (12 bits).
    pub qos_class: u16,
    /// Service level (4 bits).
    pub sl: u8,
    /// MTU selector.
    pub mtu_selector: Selector,
    /// MTU (`ibv_mtu`, 6 bits).
    pub mtu: u8,
    /// Rate selector.
    pub rate_selector: Selector,
    /// Rate (`ibv_rate`, 6 bits).
    pub rate: u8,
    /// PacketLifeTime selector.
    pub packet_life_selector: Selector,
    /// PacketLifeTime (6 bits).
    pub packet_life: u8,
    /// Preference.
    pub preference: u8,
}

impl Default for PathRecordRepr {
    fn default() -> Self {
        PathRecordRepr::ZERO
    }
}

impl PathRecordRepr {
    /// The all-zero record.
    pub const ZERO: PathRecordRepr = PathRecordRepr {
        service_id: 0,
        dgid: Gid::ZERO,
        sgid: Gid::ZERO,
        dlid: 0,
        slid: 0,
        raw_traffic: false,
        flow_label: 0,
        hop_limit: 0,
        tclass: 0,
        reversible: false,
        num_path: 0,
        pkey: 0,
        qos_class: 0,
        sl: 0,
        mtu_selector: Selector::GreaterThan,
        mtu: 0,
        rate_selector: Selector::GreaterThan,
        rate: 0,
        packet_life_selector: Selector::GreaterThan,
        packet_life: 0,
        preference: 0,
    };

    /// Parses a record (reserved bits are ignored).
    pub fn parse<T: AsRef<[u8]>>(r: &PathRecord<T>) -> Result<PathRecordRepr> {
        r.check_len()?;
        Ok(PathRecordRepr {
            service_id: r.service_id(),
            dgid: r.dgid(),
            sgid: r.sgid(),
            dlid: r.dlid(),
            slid: r.slid(),
            raw_traffic: r.raw_traffic(),
            flow_label: r.flow_label(),
            hop_limit: r.hop_limit(),
            tclass: r.tclass(),
            reversible: r.reversible(),
            num_path: r.num_path(),
            pkey: r.pkey(),
            qos_class: r.qos_class(),
            sl: r.sl(),
            mtu_selector: r.mtu_selector(),
            mtu: r.mtu(),
            rate_selector: r.rate_selector(),
            rate: r.rate(),
            packet_life_selector: r.packet_life_selector(),
            packet_life: r.packet_life(),
            preference: r.preference(),
        })
    }

    /// Parses the first 64 bytes of `bytes`.
    pub fn parse_bytes(bytes: &[u8]) -> Result<PathRecordRepr> {
        Self::parse(&PathRecord::new_checked(bytes)?)
    }

    /// Bytes needed by [`emit`](Self::emit).
    pub const fn buffer_len(&self) -> usize {
        PATH_RECORD_LEN
    }

    /// Writes every field (and zero reserved bytes). Out-of-range values are masked to their
    /// field width. The buffer must be at least 64 bytes (else this panics, like smoltcp).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, r: &mut PathRecord<T>) {
        r.set_service_id(self.service_id);
        r.set_dgid(self.dgid);
        r.set_sgid(self.sgid);
        r.set_dlid(self.dlid);
        r.set_slid(self.slid);
        r.set_flow(self.raw_traffic, self.flow_label, self.hop_limit);
        r.set_tclass(self.tclass);
        r.set_reversible_numpath(self.reversible, self.num_path);
        r.set_pkey(self.pkey);
        r.set_qosclass_sl(self.qos_class, self.sl);
        r.set_mtu(self.mtu_selector, self.mtu);
        r.set_rate(self.rate_selector, self.rate);
        r.set_packet_life(self.packet_life_selector, self.packet_life);
        r.set_preference(self.preference);
        r.clear_reserved();
    }

    /// Emits into a fresh 64-byte array.
    pub fn to_bytes(&self) -> [u8; PATH_RECORD_LEN] {
        let mut b = [0u8; PATH_RECORD_LEN];
        self.emit(&mut PathRecord::new_unchecked(&mut b[..]));
        b
    }
}

/// PathRecord component mask (SA header ComponentMask for attribute 0x0035), host value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRecordMask(pub u64);

impl PathRecordMask {
    /// No component.
    pub const EMPTY: PathRecordMask = PathRecordMask(0);
    /// ServiceID: IBA splits it into two components (bits 0 and 1: ServiceID MSB/LSB).
    pub const SERVICE_ID: PathRecordMask = PathRecordMask(0b11);
    /// DGID (bit 2).
    pub const DGID: PathRecordMask = PathRecordMask(1 << 2);
    /// SGID (bit 3).
    pub const SGID: PathRecordMask = PathRecordMask(1 << 3);
    /// DLID (bit 4).
    pub const DLID: PathRecordMask = PathRecordMask(1 << 4);
    /// SLID (bit 5).
    pub const SLID: PathRecordMask = PathRecordMask(1 << 5);
    /// RawTraffic (bit 6).
    pub const RAW_TRAFFIC: PathRecordMask = PathRecordMask(1 << 6);
    /// FlowLabel (bit 8; bit 7 is reserved).
    pub const FLOW_LABEL: PathRecordMask = PathRecordMask(1 << 8);
    /// HopLimit (bit 9).
    pub const HOP_LIMIT: PathRecordMask = PathRecordMask(1 << 9);
    /// TClass (bit 10).
    pub const TCLASS: PathRecordMask = PathRecordMask(1 << 10);
    /// Reversible (bit 11).
    pub const REVERSIBLE: PathRecordMask = PathRecordMask(1 << 11);
    /// NumbPath (bit 12).
    pub const NUM_PATH: PathRecordMask = PathRecordMask(1 << 12);
    /// P_Key (bit 13).
    pub const PKEY: PathRecordMask = PathRecordMask(1 << 13);
    /// QoSClass (bit 14).
    pub const QOS_CLASS: PathRecordMask = PathRecordMask(1 << 14);
    /// SL (bit 15).
    pub const SL: PathRecordMask = PathRecordMask(1 << 15);
    /// MTUSelector (bit 16).
    pub const MTU_SELECTOR: PathRecordMask = PathRecordMask(1 << 16);
    /// MTU (bit 17).
    pub const MTU: PathRecordMask = PathRecordMask(1 << 17);
    /// RateSelector (bit 18).
    pub const RATE_SELECTOR: PathRecordMask = PathRecordMask(1 << 18);
    /// Rate (bit 19).
    pub const RATE: PathRecordMask = PathRecordMask(1 << 19);
    /// PacketLifeTimeSelector (bit 20).
    pub const PACKET_LIFE_SELECTOR: PathRecordMask = PathRecordMask(1 << 20);
    /// PacketLifeTime (bit 21).
    pub const PACKET_LIFE: PathRecordMask = PathRecordMask(1 << 21);
    /// Preference (bit 22).
    pub const PREFERENCE: PathRecordMask = PathRecordMask(1 << 22);

    /// The host value (write it big-endian into the SA header).
    pub const fn bits(self) -> u64 {
        self.0
    }
    /// True if every bit of `other` is set here.
    pub const fn contains(self, other: PathRecordMask) -> bool {
        self.0 & other.0 == other.0
    }
    /// Union.
    pub const fn union(self, other: PathRecordMask) -> PathRecordMask {
        PathRecordMask(self.0 | other.0)
    }
    /// Names and masks of every component, in bit order (for printing).
    pub const NAMES: [(&'static str, PathRecordMask); 21] = [
        ("ServiceID", Self::SERVICE_ID),
        ("DGID", Self::DGID),
        ("SGID", Self::SGID),
        ("DLID", Self::DLID),
        ("SLID", Self::SLID),
        ("RawTraffic", Self::RAW_TRAFFIC),
        ("FlowLabel", Self::FLOW_LABEL),
        ("HopLimit", Self::HOP_LIMIT),
        ("TClass", Self::TCLASS),
        ("Reversible", Self::REVERSIBLE),
        ("NumbPath", Self::NUM_PATH),
        ("P_Key", Self::PKEY),
        ("QoSClass", Self::QOS_CLASS),
        ("SL", Self::SL),
        ("MTUSelector", Self::MTU_SELECTOR),
        ("MTU", Self::MTU),
        ("RateSelector", Self::RATE_SELECTOR),
        ("Rate", Self::RATE),
        ("PacketLifeTimeSelector", Self::PACKET_LIFE_SELECTOR),
        ("PacketLifeTime", Self::PACKET_LIFE),
        ("Preference", Self::PREFERENCE),
    ];
}

impl core::ops::BitOr for PathRecordMask {
    type Output = PathRecordMask;
    fn bitor(self, rhs: PathRecordMask) -> PathRecordMask {
        self.union(rhs)
    }
}

impl core::ops::BitOrAssign for PathRecordMask {
    fn bitor_assign(&mut self, rhs: PathRecordMask) {
        self.0 |= rhs.0
    }
}

/// ibacm's `acm_path_comp_mask` rule (acm.c:446-497): a bit for every **non-zero** field.
///
/// Never sets RawTraffic, NumbPath or Preference, and cannot require a zero value (SL 0, a
/// GreaterThan selector). Provided for interoperability; new code should use
/// [`PathRecordQuery`].
pub fn acm_path_comp_mask(p: &PathRecordRepr) -> PathRecordMask {
    let mut m = PathRecordMask::EMPTY;
    let mut set = |cond: bool, bit: PathRecordMask| {
        if cond {
            m |= bit
        }
    };
    let flow_hop_upper = (u32::from(p.raw_traffic) << 23) | p.flow_label;
    set(p.service_id != 0, PathRecordMask::SERVICE_ID);
    set(!p.dgid.is_zero(), PathRecordMask::DGID);
    set(!p.sgid.is_zero(), PathRecordMask::SGID);
    set(p.dlid != 0, PathRecordMask::DLID);
    set(p.slid != 0, PathRecordMask::SLID);
    // ibacm tests `fl_hop >> 8`, which includes the RawTraffic bit.
    set(flow_hop_upper != 0, PathRecordMask::FLOW_LABEL);
    set(p.hop_limit != 0, PathRecordMask::HOP_LIMIT);
    set(p.tclass != 0, PathRecordMask::TCLASS);
    set(p.reversible, PathRecordMask::REVERSIBLE);
    set(p.pkey != 0, PathRecordMask::PKEY);
    set(p.qos_class & 0xfff != 0, PathRecordMask::QOS_CLASS);
    set(p.sl & 0xf != 0, PathRecordMask::SL);
    set(p.mtu_selector.bits() != 0, PathRecordMask::MTU_SELECTOR);
    set(p.mtu & 0x3f != 0, PathRecordMask::MTU);
    set(p.rate_selector.bits() != 0, PathRecordMask::RATE_SELECTOR);
    set(p.rate & 0x3f != 0, PathRecordMask::RATE);
    set(
        p.packet_life_selector.bits() != 0,
        PathRecordMask::PACKET_LIFE_SELECTOR,
    );
    set(p.packet_life & 0x3f != 0, PathRecordMask::PACKET_LIFE);
    m
}

/// Builds a PathRecord query: each setter stores the value **and** sets its component bit, so
/// a required zero (SL 0, HopLimit 0, GreaterThan selector) is still a constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathRecordQuery {
    record: PathRecordRepr,
    mask: PathRecordMask,
}

macro_rules! query_setter {
    ($(#[$m:meta])* $name:ident, $ty:ty, $field:ident, $bit:ident) => {
        $(#[$m])*
        pub const fn $name(mut self, v: $ty) -> Self {
            self.record.$field = v;
            self.mask = self.mask.union(PathRecordMask::$bit);
            self
        }
    };
}

impl PathRecordQuery {
    /// An empty query (no component required).
    pub const fn new() -> Self {
        PathRecordQuery {
            record: PathRecordRepr::ZERO,
            mask: PathRecordMask::EMPTY,
        }
    }
    query_setter!(/// Requires this ServiceID.
        service_id, u64, service_id, SERVICE_ID);
    query_setter!(/// Requires this DGID.
        dgid, Gid, dgid, DGID);
    query_setter!(/// Requires this SGID.
        sgid, Gid, sgid, SGID);
    query_setter!(/// Requires this DLID.
        dlid, u16, dlid, DLID);
    query_setter!(/// Requires this SLID.
        slid, u16, slid, SLID);
    query_setter!(/// Requires this RawTraffic bit.
        raw_traffic, bool, raw_traffic, RAW_TRAFFIC);
    query_setter!(/// Requires this FlowLabel.
        flow_label, u32, flow_label, FLOW_LABEL);
    query_setter!(/// Requires this HopLimit.
        hop_limit, u8, hop_limit, HOP_LIMIT);
    query_setter!(/// Requires this TClass.
        tclass, u8, tclass, TCLASS);
    query_setter!(/// Requires this Reversible bit.
        reversible, bool, reversible, REVERSIBLE);
    query_setter!(/// Asks for this many paths (NumbPath).
        num_path, u8, num_path, NUM_PATH);
    query_setter!(/// Requires this P_Key.
        pkey, u16, pkey, PKEY);
    query_setter!(/// Requires this QoS class.
        qos_class, u16, qos_class, QOS_CLASS);
    query_setter!(/// Requires this SL.
        sl, u8, sl, SL);
    query_setter!(/// Requires this Preference.
        preference, u8, preference, PREFERENCE);

    /// Requires an MTU relation (`Exactly`, `GreaterThan`, ...); sets both MTU bits.
    pub const fn mtu(mut self, sel: Selector, mtu: u8) -> Self {
        self.record.mtu_selector = sel;
        self.record.mtu = mtu;
        self.mask = self
            .mask
            .union(PathRecordMask::MTU_SELECTOR)
            .union(PathRecordMask::MTU);
        self
    }
    /// Requires a rate relation; sets both rate bits.
    pub const fn rate(mut self, sel: Selector, rate: u8) -> Self {
        self.record.rate_selector = sel;
        self.record.rate = rate;
        self.mask = self
            .mask
            .union(PathRecordMask::RATE_SELECTOR)
            .union(PathRecordMask::RATE);
        self
    }
    /// Requires a packet-lifetime relation; sets both lifetime bits.
    pub const fn packet_life(mut self, sel: Selector, life: u8) -> Self {
        self.record.packet_life_selector = sel;
        self.record.packet_life = life;
        self.mask = self
            .mask
            .union(PathRecordMask::PACKET_LIFE_SELECTOR)
            .union(PathRecordMask::PACKET_LIFE);
        self
    }
    /// The record to put in the SA MAD data.
    pub const fn record(&self) -> &PathRecordRepr {
        &self.record
    }
    /// The component mask to put in the SA header.
    pub const fn mask(&self) -> PathRecordMask {
        self.mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    /// A PathRecord as OpenSM answers Hca2(LID 4) → Hca4(LID 6) on the simulated fabric,
    /// with every field non-trivial so that a misplaced byte shows.
    static PR_BYTES: [u8; 64] = [
        0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // service id
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0x0a, // dgid
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0x04, // sgid
        0x00, 0x06, 0x00, 0x04, // dlid, slid
        0x81, 0x23, 0x45, 0x40, // raw 1, flow 0x12345, hop 0x40
        0x0c, 0x81, 0xff, 0xff, // tclass, reversible|1, pkey
        0xab, 0xc5, // qos 0xabc sl 5
        0x84, 0x83, 0x92,
        0x01, // mtu 2048 exactly, rate 10G exactly, life sel 2 val 18, pref 1
        0, 0, 0, 0, 0, 0,
    ];

    #[test]
    fn deconstruct() {
        let r = PathRecord::new_checked(&PR_BYTES[..]).unwrap();
        assert_eq!(r.service_id(), 0x1122_3344_5566_7788);
        assert_eq!(r.dgid(), Gid::from_parts(0xfe80 << 48, 0x10_000a));
        assert_eq!(r.sgid(), Gid::from_parts(0xfe80 << 48, 0x10_0004));
        assert_eq!((r.dlid(), r.slid()), (6, 4));
        assert!(r.raw_traffic());
        assert_eq!(r.flow_label(), 0x12345);
        assert_eq!(r.hop_limit(), 0x40);
        assert_eq!(r.tclass(), 0x0c);
        assert!(r.reversible());
        assert_eq!(r.num_path(), 1);
        assert_eq!(r.pkey(), 0xffff);
        assert_eq!((r.qos_class(), r.sl()), (0xabc, 5));
        assert_eq!((r.mtu_selector(), r.mtu()), (Selector::Exactly, 4));
        assert_eq!((r.rate_selector(), r.rate()), (Selector::Exactly, 3));
        assert_eq!(
            (r.packet_life_selector(), r.packet_life()),
            (Selector::Exactly, 18)
        );
        assert_eq!(r.preference(), 1);
        assert_eq!(r.as_bytes(), &PR_BYTES);
    }

    fn repr() -> PathRecordRepr {
        PathRecordRepr {
            service_id: 0x1122_3344_5566_7788,
            dgid: Gid::from_parts(0xfe80 << 48, 0x10_000a),
            sgid: Gid::from_parts(0xfe80 << 48, 0x10_0004),
            dlid: 6,
            slid: 4,
            raw_traffic: true,
            flow_label: 0x12345,
            hop_limit: 0x40,
            tclass: 0x0c,
            reversible: true,
            num_path: 1,
            pkey: 0xffff,
            qos_class: 0xabc,
            sl: 5,
            mtu_selector: Selector::Exactly,
            mtu: 4,
            rate_selector: Selector::Exactly,
            rate: 3,
            packet_life_selector: Selector::Exactly,
            packet_life: 18,
            preference: 1,
        }
    }

    #[test]
    fn parse_and_emit_are_byte_exact() {
        assert_eq!(PathRecordRepr::parse_bytes(&PR_BYTES).unwrap(), repr());
        assert_eq!(repr().to_bytes(), PR_BYTES);
        assert_eq!(repr().buffer_len(), 64);
    }

    #[test]
    fn emit_clears_reserved_and_masks() {
        let mut b = [0xffu8; 64];
        let mut r = repr();
        r.flow_label = 0xfff_ffff; // wider than 20 bits
        r.emit(&mut PathRecord::new_unchecked(&mut b[..]));
        assert_eq!(&b[58..], &[0; 6]);
        assert_eq!(b[44..48], [0x8f, 0xff, 0xff, 0x40]);
    }

    #[test]
    fn truncated_is_an_error() {
        for n in 0..64 {
            assert_eq!(
                PathRecordRepr::parse_bytes(&PR_BYTES[..n]),
                Err(Error::Truncated)
            );
        }
    }

    #[test]
    fn core_mask_sets_only_nonzero_fields() {
        let m = acm_path_comp_mask(&repr());
        // Everything except RawTraffic, NumbPath, Preference; FlowLabel via the raw bit too.
        let expect = 0b11 | (0xf << 2) | (0x7fff << 8) & !(1 << 12) & !(1 << 22);
        assert_eq!(m.bits(), expect);
        let z = acm_path_comp_mask(&PathRecordRepr::ZERO);
        assert_eq!(z, PathRecordMask::EMPTY);
        let mut only_raw = PathRecordRepr::ZERO;
        only_raw.raw_traffic = true;
        assert_eq!(acm_path_comp_mask(&only_raw), PathRecordMask::FLOW_LABEL);
    }

    #[test]
    fn query_requires_zero_values() {
        let q = PathRecordQuery::new()
            .dlid(6)
            .sl(0)
            .hop_limit(0)
            .rate(Selector::GreaterThan, 0)
            .reversible(true)
            .num_path(1);
        assert_eq!(
            q.mask(),
            PathRecordMask::DLID
                | PathRecordMask::SL
                | PathRecordMask::HOP_LIMIT
                | PathRecordMask::RATE_SELECTOR
                | PathRecordMask::RATE
                | PathRecordMask::REVERSIBLE
                | PathRecordMask::NUM_PATH
        );
        assert_eq!(q.mask().bits(), 0x000c_9a10);
        assert_eq!(q.record().dlid, 6);
        assert!(q.mask().contains(PathRecordMask::SL));
        // The core's rule would drop SL 0, HopLimit 0 and the rate pair.
        assert_eq!(
            acm_path_comp_mask(q.record()),
            PathRecordMask::DLID | PathRecordMask::REVERSIBLE
        );
    }

    #[test]
    fn mask_names_cover_distinct_bits() {
        let mut all = 0u64;
        for (_, m) in PathRecordMask::NAMES {
            assert_eq!(all & m.bits(), 0);
            all |= m.bits();
        }
        assert_eq!(all, 0x7f_ff7f);
    }
}
