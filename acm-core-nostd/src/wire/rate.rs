//! Rate and MTU tables: `enum ibv_rate` and `enum ibv_mtu` (`<infiniband/verbs.h>`), the
//! PortInfo link width × speed → rate mapping (HDR, NDR, XDR and 2x aware, unlike ibacm's
//! `acm_get_rate`, which gives 0 past EDR), and Gbps ↔ rate.

use super::enum_with_unknown;

enum_with_unknown! {
    /// `enum ibv_rate` (the 6-bit rate code of PathRecord / MCMemberRecord / AH attributes).
    pub enum Rate(u8) {
        /// `IBV_RATE_MAX` (0): "no limit" / unknown.
        Max = 0,
        /// 2.5 Gb/s.
        Gbps2_5 = 2,
        /// 10 Gb/s.
        Gbps10 = 3,
        /// 30 Gb/s.
        Gbps30 = 4,
        /// 5 Gb/s.
        Gbps5 = 5,
        /// 20 Gb/s.
        Gbps20 = 6,
        /// 40 Gb/s.
        Gbps40 = 7,
        /// 60 Gb/s.
        Gbps60 = 8,
        /// 80 Gb/s.
        Gbps80 = 9,
        /// 120 Gb/s.
        Gbps120 = 10,
        /// 14 Gb/s.
        Gbps14 = 11,
        /// 56 Gb/s.
        Gbps56 = 12,
        /// 112 Gb/s.
        Gbps112 = 13,
        /// 168 Gb/s.
        Gbps168 = 14,
        /// 25 Gb/s.
        Gbps25 = 15,
        /// 100 Gb/s.
        Gbps100 = 16,
        /// 200 Gb/s.
        Gbps200 = 17,
        /// 300 Gb/s.
        Gbps300 = 18,
        /// 28 Gb/s.
        Gbps28 = 19,
        /// 50 Gb/s.
        Gbps50 = 20,
        /// 400 Gb/s.
        Gbps400 = 21,
        /// 600 Gb/s.
        Gbps600 = 22,
        /// 800 Gb/s.
        Gbps800 = 23,
        /// 1200 Gb/s.
        Gbps1200 = 24,
    }
}

/// Every named rate with its speed in Mb/s (like `ibv_rate_to_mbps`).
const RATE_MBPS: [(Rate, u32); 23] = [
    (Rate::Gbps2_5, 2_500),
    (Rate::Gbps5, 5_000),
    (Rate::Gbps10, 10_000),
    (Rate::Gbps14, 14_000),
    (Rate::Gbps20, 20_000),
    (Rate::Gbps25, 25_000),
    (Rate::Gbps28, 28_000),
    (Rate::Gbps30, 30_000),
    (Rate::Gbps40, 40_000),
    (Rate::Gbps50, 50_000),
    (Rate::Gbps56, 56_000),
    (Rate::Gbps60, 60_000),
    (Rate::Gbps80, 80_000),
    (Rate::Gbps100, 100_000),
    (Rate::Gbps112, 112_000),
    (Rate::Gbps120, 120_000),
    (Rate::Gbps168, 168_000),
    (Rate::Gbps200, 200_000),
    (Rate::Gbps300, 300_000),
    (Rate::Gbps400, 400_000),
    (Rate::Gbps600, 600_000),
    (Rate::Gbps800, 800_000),
    (Rate::Gbps1200, 1_200_000),
];

impl Rate {
    /// Speed in Mb/s; `None` for `Max` and unknown codes.
    pub fn to_mbps(self) -> Option<u32> {
        RATE_MBPS.iter().find(|(r, _)| *r == self).map(|&(_, m)| m)
    }
    /// The rate of exactly this many Mb/s, if `ibv_rate` has one.
    pub fn from_mbps(mbps: u32) -> Option<Rate> {
        RATE_MBPS.iter().find(|&&(_, m)| m == mbps).map(|&(r, _)| r)
    }
    /// Whole Gb/s as ibacm's options spell them (`min_rate 10`): 2 means 2.5. `None` if no
    /// `ibv_rate` exists for it (ibacm's `acm_convert_rate` falls back to 10 Gb/s instead, and
    /// does not know 28, 50, 400, 600, 800, 1200).
    pub fn from_gbps(gbps: u32) -> Option<Rate> {
        if gbps == 2 {
            return Some(Rate::Gbps2_5);
        }
        Self::from_mbps(gbps.checked_mul(1000)?)
    }
    /// Whole Gb/s (2.5 rounds down to 2, as ibacm writes it); `None` for `Max`/unknown.
    pub fn to_gbps(self) -> Option<u32> {
        self.to_mbps().map(|m| m / 1000)
    }
}

enum_with_unknown! {
    /// PortInfo LinkWidthActive (`ibv_port_attr.active_width`).
    pub enum LinkWidth(u8) {
        /// 1x.
        X1 = 1,
        /// 4x.
        X4 = 2,
        /// 8x.
        X8 = 4,
        /// 12x.
        X12 = 8,
        /// 2x.
        X2 = 16,
    }
}

impl LinkWidth {
    /// Number of lanes; `None` for unknown widths.
    pub fn lanes(self) -> Option<u32> {
        match self {
            LinkWidth::X1 => Some(1),
            LinkWidth::X2 => Some(2),
            LinkWidth::X4 => Some(4),
            LinkWidth::X8 => Some(8),
            LinkWidth::X12 => Some(12),
            LinkWidth::Unknown(_) => None,
        }
    }
}

enum_with_unknown! {
    /// Link speed as `ibv_port_attr.active_speed` reports it (XDR via `active_speed_ex`).
    pub enum LinkSpeed(u16) {
        /// SDR, 2.5 Gb/s per lane.
        Sdr = 1,
        /// DDR, 5 Gb/s per lane.
        Ddr = 2,
        /// QDR, 10 Gb/s per lane.
        Qdr = 4,
        /// FDR10, 10 Gb/s per lane (10.3125 signalling, 64/66b).
        Fdr10 = 8,
        /// FDR, 14 Gb/s per lane.
        Fdr = 16,
        /// EDR, 25 Gb/s per lane.
        Edr = 32,
        /// HDR, 50 Gb/s per lane.
        Hdr = 64,
        /// NDR, 100 Gb/s per lane.
        Ndr = 128,
        /// XDR, 200 Gb/s per lane.
        Xdr = 256,
    }
}

impl LinkSpeed {
    /// Per-lane data rate in Mb/s; `None` for unknown speeds.
    pub fn lane_mbps(self) -> Option<u32> {
        match self {
            LinkSpeed::Sdr => Some(2_500),
            LinkSpeed::Ddr => Some(5_000),
            LinkSpeed::Qdr | LinkSpeed::Fdr10 => Some(10_000),
            LinkSpeed::Fdr => Some(14_000),
            LinkSpeed::Edr => Some(25_000),
            LinkSpeed::Hdr => Some(50_000),
            LinkSpeed::Ndr => Some(100_000),
            LinkSpeed::Xdr => Some(200_000),
            LinkSpeed::Unknown(_) => None,
        }
    }
}

/// The `ibv_rate` of a port running `width` × `speed`. `None` if either is unknown or no
/// `ibv_rate` code exists for the product (8x/12x XDR: 1600/2400 Gb/s).
///
/// Agrees with ibacm's `acm_get_rate` for 1x/4x/8x/12x × SDR..EDR and extends it to 2x and
/// HDR/NDR/XDR (where ibacm returns `IBV_RATE_MAX`).
pub fn rate_from_link(width: LinkWidth, speed: LinkSpeed) -> Option<Rate> {
    Rate::from_mbps(width.lanes()?.checked_mul(speed.lane_mbps()?)?)
}

enum_with_unknown! {
    /// `enum ibv_mtu` (the 6-bit MTU code of PathRecord / MCMemberRecord).
    pub enum Mtu(u8) {
        /// 256 bytes.
        Mtu256 = 1,
        /// 512 bytes.
        Mtu512 = 2,
        /// 1024 bytes.
        Mtu1024 = 3,
        /// 2048 bytes.
        Mtu2048 = 4,
        /// 4096 bytes.
        Mtu4096 = 5,
    }
}

impl Mtu {
    /// Payload size in bytes; `None` for unknown codes.
    pub fn to_bytes(self) -> Option<u32> {
        match self {
            Mtu::Mtu256 => Some(256),
            Mtu::Mtu512 => Some(512),
            Mtu::Mtu1024 => Some(1024),
            Mtu::Mtu2048 => Some(2048),
            Mtu::Mtu4096 => Some(4096),
            Mtu::Unknown(_) => None,
        }
    }
    /// The code for exactly this many bytes (ibacm's `acm_convert_mtu` falls back to 2048).
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        match bytes {
            256 => Some(Mtu::Mtu256),
            512 => Some(Mtu::Mtu512),
            1024 => Some(Mtu::Mtu1024),
            2048 => Some(Mtu::Mtu2048),
            4096 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_values_match_verbs_h() {
        let expect: [(Rate, u8); 24] = [
            (Rate::Max, 0),
            (Rate::Gbps2_5, 2),
            (Rate::Gbps5, 5),
            (Rate::Gbps10, 3),
            (Rate::Gbps20, 6),
            (Rate::Gbps30, 4),
            (Rate::Gbps40, 7),
            (Rate::Gbps60, 8),
            (Rate::Gbps80, 9),
            (Rate::Gbps120, 10),
            (Rate::Gbps14, 11),
            (Rate::Gbps56, 12),
            (Rate::Gbps112, 13),
            (Rate::Gbps168, 14),
            (Rate::Gbps25, 15),
            (Rate::Gbps100, 16),
            (Rate::Gbps200, 17),
            (Rate::Gbps300, 18),
            (Rate::Gbps28, 19),
            (Rate::Gbps50, 20),
            (Rate::Gbps400, 21),
            (Rate::Gbps600, 22),
            (Rate::Gbps800, 23),
            (Rate::Gbps1200, 24),
        ];
        for (r, v) in expect {
            assert_eq!(u8::from(r), v);
            assert_eq!(Rate::from(v), r);
        }
        assert_eq!(Rate::from(25), Rate::Unknown(25));
        assert_eq!(Rate::Unknown(25).to_mbps(), None);
    }

    #[test]
    fn matches_acm_get_rate_up_to_edr() {
        use LinkSpeed::*;
        use LinkWidth::*;
        // The table of ibacm's acm_get_rate (acm.c:1969-2016).
        let table = [
            (
                X1,
                [
                    Rate::Gbps2_5,
                    Rate::Gbps5,
                    Rate::Gbps10,
                    Rate::Gbps10,
                    Rate::Gbps14,
                    Rate::Gbps25,
                ],
            ),
            (
                X4,
                [
                    Rate::Gbps10,
                    Rate::Gbps20,
                    Rate::Gbps40,
                    Rate::Gbps40,
                    Rate::Gbps56,
                    Rate::Gbps100,
                ],
            ),
            (
                X8,
                [
                    Rate::Gbps20,
                    Rate::Gbps40,
                    Rate::Gbps80,
                    Rate::Gbps80,
                    Rate::Gbps112,
                    Rate::Gbps200,
                ],
            ),
            (
                X12,
                [
                    Rate::Gbps30,
                    Rate::Gbps60,
                    Rate::Gbps120,
                    Rate::Gbps120,
                    Rate::Gbps168,
                    Rate::Gbps300,
                ],
            ),
        ];
        for (w, rates) in table {
            for (s, r) in [Sdr, Ddr, Qdr, Fdr10, Fdr, Edr].into_iter().zip(rates) {
                assert_eq!(rate_from_link(w, s), Some(r), "{w:?} {s:?}");
            }
        }
    }

    #[test]
    fn hdr_ndr_xdr_and_2x() {
        use LinkSpeed::*;
        use LinkWidth::*;
        assert_eq!(rate_from_link(X4, Hdr), Some(Rate::Gbps200));
        assert_eq!(rate_from_link(X4, Ndr), Some(Rate::Gbps400));
        assert_eq!(rate_from_link(X4, Xdr), Some(Rate::Gbps800));
        assert_eq!(rate_from_link(X8, Ndr), Some(Rate::Gbps800));
        assert_eq!(rate_from_link(X12, Hdr), Some(Rate::Gbps600));
        assert_eq!(rate_from_link(X12, Ndr), Some(Rate::Gbps1200));
        assert_eq!(rate_from_link(X1, Hdr), Some(Rate::Gbps50));
        assert_eq!(rate_from_link(X2, Fdr), Some(Rate::Gbps28));
        assert_eq!(rate_from_link(X2, Edr), Some(Rate::Gbps50));
        assert_eq!(rate_from_link(X2, Ndr), Some(Rate::Gbps200));
        assert_eq!(rate_from_link(X8, Xdr), None);
        assert_eq!(rate_from_link(LinkWidth::Unknown(3), Sdr), None);
        assert_eq!(rate_from_link(X4, LinkSpeed::Unknown(3)), None);
    }

    #[test]
    fn gbps_conversions() {
        assert_eq!(Rate::from_gbps(2), Some(Rate::Gbps2_5));
        assert_eq!(Rate::from_gbps(10), Some(Rate::Gbps10));
        assert_eq!(Rate::from_gbps(28), Some(Rate::Gbps28));
        assert_eq!(Rate::from_gbps(1200), Some(Rate::Gbps1200));
        assert_eq!(Rate::from_gbps(11), None);
        assert_eq!(Rate::from_gbps(u32::MAX), None);
        assert_eq!(Rate::Gbps2_5.to_gbps(), Some(2));
        assert_eq!(Rate::Gbps400.to_mbps(), Some(400_000));
        assert_eq!(Rate::Max.to_gbps(), None);
        for (r, _) in RATE_MBPS {
            assert_eq!(Rate::from_gbps(r.to_gbps().unwrap()), Some(r));
        }
    }

    #[test]
    fn mtu_table() {
        for (bytes, code) in [(256, 1u8), (512, 2), (1024, 3), (2048, 4), (4096, 5)] {
            let m = Mtu::from_bytes(bytes).unwrap();
            assert_eq!(u8::from(m), code);
            assert_eq!(Mtu::from(code).to_bytes(), Some(bytes));
        }
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::from(0).to_bytes(), None);
    }
}
