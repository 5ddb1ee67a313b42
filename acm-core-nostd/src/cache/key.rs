//! Cache keys: what a path record or an address is looked up by.
//!
//! Keys are packed into fixed arrays of 32-bit words and compared word for word, so two keys
//! share an entry only if *every* field is equal: there is no fingerprint that could collide.

use crate::wire::acm_mad::AddressType;
use crate::wire::client::EpInfoType;

/// Number of 32-bit words a packed [`PathKey`] occupies.
pub const PATH_KEY_WORDS: usize = 10;
/// Number of 32-bit words a packed [`AddrKey`] occupies.
pub const ADDR_KEY_WORDS: usize = 17;
/// Longest address an [`AddrKey`] holds (`ACM_MAX_ADDRESS`).
pub use crate::wire::client::MAX_ADDRESS;

/// Bits of a cache endpoint number ([`CacheEp`]): word 0 of a packed key is `ep << 2 | type`,
/// so the number has 30 bits.
pub const EP_BITS: u32 = 30;
/// The largest cache endpoint number.
pub const EP_MAX: u32 = (1 << EP_BITS) - 1;
/// Bits of the endpoint slot id, the low byte of a cache endpoint number
/// ([`CacheEp::slot`], the index of the writer's generation counters, `EP_GENERATIONS` of them).
pub const EP_SLOT_BITS: u32 = 8;
/// Bits of the flush generation above the slot id in a cache endpoint number (22): a
/// generation bumped `1 << EP_GEN_BITS` times (4,194,304) comes back to the same number.
pub const EP_GEN_BITS: u32 = EP_BITS - EP_SLOT_BITS;

/// An endpoint's number in the cache, its **cache number**: the endpoint slot id at a flush
/// generation, the endpoint part of every [`PathKey`] and [`AddrKey`]. Every layer (the
/// provider's hit path, its dataplane, the resolver, the cache) passes it as this type; it is
/// made only by [`ep_number`] (and, inside this module, read back from a packed key), its
/// parts are read with [`slot`](Self::slot) and [`generation`](Self::generation), and its
/// bits become a key word only where a key is packed (`ep_word`). It is at most [`EP_MAX`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct CacheEp(u32);

/// The cache endpoint number of endpoint slot `id` at flush generation `gen`:
/// `gen << 8 | id`, with `gen` taken modulo `1 << `[`EP_GEN_BITS`]. The one constructor of a
/// [`CacheEp`], which the provider's hit path, its dataplane and the tests use: bumping `gen`
/// gives a number no entry written under an earlier generation (fewer than 4,194,304 bumps
/// ago) has, so those entries stop matching at once, before the writer gets to
/// [`invalidate_ep`](super::CacheWriter::invalidate_ep). `ep_number(gen, id).slot() == id`,
/// so the writer's per-slot generation counters stay per slot.
#[inline(always)]
pub const fn ep_number(gen: u32, id: u8) -> CacheEp {
    CacheEp(((gen << EP_SLOT_BITS) | id as u32) & EP_MAX)
}

impl CacheEp {
    /// The endpoint slot id ([`ep_number`]'s `id`).
    #[inline(always)]
    pub const fn slot(self) -> u8 {
        self.0 as u8
    }

    /// The flush generation ([`ep_number`]'s `gen`, modulo `1 << `[`EP_GEN_BITS`]).
    #[inline]
    pub const fn generation(self) -> u32 {
        self.0 >> EP_SLOT_BITS
    }

    /// The same endpoint at the next flush generation (what a CLIENT_REREGISTER moves it to).
    #[inline]
    pub const fn next_generation(self) -> CacheEp {
        ep_number(self.generation().wrapping_add(1), self.slot())
    }
}

/// The destination half of a [`PathKey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dest {
    /// Destination LID (host order).
    Lid(u16),
    /// Destination GID, 16 bytes in network order.
    Gid([u8; 16]),
}

/// The reversible bit of [`Constraints::reversible_numpath`] (and of the PathRecord byte).
pub const REVERSIBLE: u8 = 0x80;

/// Bits of [`Constraints::mask`]: which constraint fields the request actually specified.
///
/// A request that leaves a field unspecified and one that specifies it as 0 are different keys.
pub mod constraint {
    /// `service_id` is specified.
    pub const SERVICE_ID: u16 = 1 << 0;
    /// `pkey` is specified.
    pub const PKEY: u16 = 1 << 1;
    /// `qos_class` is specified.
    pub const QOS_CLASS: u16 = 1 << 2;
    /// `tclass` is specified.
    pub const TCLASS: u16 = 1 << 3;
    /// `sl` is specified.
    pub const SL: u16 = 1 << 4;
    /// `mtu` (selector and value) is specified.
    pub const MTU: u16 = 1 << 5;
    /// `rate` (selector and value) is specified.
    pub const RATE: u16 = 1 << 6;
    /// `packet_life` (selector and value) is specified.
    pub const PACKET_LIFE: u16 = 1 << 7;
    /// `reversible_numpath` is specified.
    pub const REVERSIBLE_NUMPATH: u16 = 1 << 8;
}

/// The request constraints that select *which* path to a destination is wanted.
///
/// Requests whose constraints differ in any field do not share a cache entry. Fields whose bit is
/// clear in [`mask`](Self::mask) are ignored (canonicalised to 0 when packed), so callers may leave
/// garbage in them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Constraints {
    /// Which fields are specified: an OR of [`constraint`] bits.
    pub mask: u16,
    /// Service ID (host order).
    pub service_id: u64,
    /// Partition key (host order, full 16 bits including the membership bit).
    pub pkey: u16,
    /// QoS class (12 bits).
    pub qos_class: u16,
    /// Traffic class.
    pub tclass: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// MTU byte as in the SA PathRecord: selector in bits 7..6, MTU code in bits 5..0.
    pub mtu: u8,
    /// Rate byte as in the SA PathRecord: selector in bits 7..6, rate code in bits 5..0.
    pub rate: u8,
    /// Packet lifetime byte as in the SA PathRecord: selector in bits 7..6, value in bits 5..0.
    pub packet_life: u8,
    /// Reversible bit (bit 7) and NumbPath (bits 6..0) as in the SA PathRecord.
    pub reversible_numpath: u8,
}

impl Constraints {
    /// No constraints at all: any path to the destination will do.
    pub const ANY: Constraints = Constraints {
        mask: 0,
        service_id: 0,
        pkey: 0,
        qos_class: 0,
        tclass: 0,
        sl: 0,
        mtu: 0,
        rate: 0,
        packet_life: 0,
        reversible_numpath: 0,
    };

    /// Packs the specified fields into 5 words; unspecified fields become 0.
    #[inline]
    pub fn to_words(&self) -> [u32; 5] {
        let m = self.mask;
        if m == 0 {
            // The common request: no constraints at all.
            return [0; 5];
        }
        let on = |bit: u16| m & bit != 0;
        let sid = if on(constraint::SERVICE_ID) {
            self.service_id
        } else {
            0
        };
        let pick8 = |bit: u16, v: u8| if on(bit) { v as u32 } else { 0 };
        let pick16 = |bit: u16, v: u16| if on(bit) { v as u32 } else { 0 };
        [
            sid as u32,
            (sid >> 32) as u32,
            pick16(constraint::PKEY, self.pkey)
                | (pick16(constraint::QOS_CLASS, self.qos_class) << 16),
            pick8(constraint::TCLASS, self.tclass)
                | (pick8(constraint::SL, self.sl) << 8)
                | (pick8(constraint::MTU, self.mtu) << 16)
                | (pick8(constraint::RATE, self.rate) << 24),
            pick8(constraint::PACKET_LIFE, self.packet_life)
                | (pick8(constraint::REVERSIBLE_NUMPATH, self.reversible_numpath) << 8)
                | ((m as u32) << 16),
        ]
    }
}

/// Key of a path-record entry: endpoint, destination and request constraints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PathKey {
    /// The endpoint (local port / partition) the path was learned through, at its flush
    /// generation (its [`CacheEp`]); see
    /// [`CacheWriter::invalidate_ep`](super::CacheWriter::invalidate_ep).
    pub ep: CacheEp,
    /// Destination LID or GID.
    pub dest: Dest,
    /// Request constraints; see [`Constraints`].
    pub constraints: Constraints,
}

impl PathKey {
    /// A key for `dest` on endpoint `ep` with no constraints.
    pub const fn new(ep: CacheEp, dest: Dest) -> Self {
        PathKey {
            ep,
            dest,
            constraints: Constraints::ANY,
        }
    }

    /// Packs the key into words; equal keys pack equal and vice versa (after masking).
    #[inline]
    pub fn to_words(&self) -> [u32; PATH_KEY_WORDS] {
        let mut w = [0u32; PATH_KEY_WORDS];
        match self.dest {
            Dest::Lid(lid) => {
                w[0] = ep_word(self.ep, DEST_LID);
                w[1] = lid as u32;
            }
            Dest::Gid(gid) => {
                w[0] = ep_word(self.ep, DEST_GID);
                for (i, c) in gid.chunks_exact(4).enumerate() {
                    w[1 + i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
        w[5..].copy_from_slice(&self.constraints.to_words());
        w
    }
}

impl PathKey {
    /// The key packed ([`to_words`](Self::to_words)).
    #[inline]
    pub fn packed(&self) -> PackedPathKey {
        PackedPathKey(self.to_words())
    }

    /// The key as the path cache stores it, and whether the request needs a reversible path
    /// (see [`PackedPathKey::cache_words`]).
    #[inline]
    pub fn cache_words(&self) -> ([u32; PATH_KEY_WORDS], bool) {
        self.packed().cache_words()
    }

    /// The same key without the reversible bit: the one cache entry it shares with `self`,
    /// looked up without needing a reversible record.
    #[inline]
    pub fn without_reversible(&self) -> PathKey {
        let mut k = *self;
        k.constraints.reversible_numpath &= !REVERSIBLE;
        if k.constraints.reversible_numpath == 0 {
            k.constraints.mask &= !constraint::REVERSIBLE_NUMPATH;
        }
        k
    }
}

/// A [`PathKey`] packed into the words the caches compare and hash
/// ([`PathKey::to_words`]): what request classification derives straight from a PathRecord,
/// so a cache hit never builds the unpacked key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PackedPathKey(pub(crate) [u32; PATH_KEY_WORDS]);

/// The endpoint and destination of a path key: the first [`DEST_WORDS`] words of its packed
/// form, which alone place it in the path cache
/// ([`PathCache::prefetch_hint`](super::PathCache::prefetch_hint)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PathDest(pub(crate) [u32; DEST_WORDS]);

/// Words of a [`PathDest`]: endpoint and destination type, then the LID or the 4 GID words.
pub const DEST_WORDS: usize = 5;

/// Word 0 of a packed key: `ep << 2 | DEST_LID` or `DEST_GID` ([`ep_word`]).
pub(crate) const DEST_LID: u32 = 1;
pub(crate) const DEST_GID: u32 = 2;
/// Bits of the type (destination type, address kind) in word 0 of a packed key, below the
/// endpoint number.
pub(crate) const TYPE_BITS: u32 = 2;
const TYPE_MASK: u32 = (1 << TYPE_BITS) - 1;
const _: () = assert!(EP_BITS + TYPE_BITS == 32);
const _: () = assert!(DEST_GID <= TYPE_MASK && AddrKind::Ipv6 as u32 <= TYPE_MASK);

/// Word 0 of a packed key: the endpoint number ([`EP_BITS`]) above the 2-bit `type_`. The one
/// place a [`CacheEp`]'s bits are read.
#[inline(always)]
pub(crate) const fn ep_word(ep: CacheEp, type_: u32) -> u32 {
    (ep.0 << TYPE_BITS) | type_
}

/// The endpoint number of word 0 of a packed key ([`ep_word`] undone).
#[inline(always)]
pub(crate) const fn ep_of_word(w0: u32) -> CacheEp {
    CacheEp(w0 >> TYPE_BITS)
}
/// Where the reversible bit and the constraint mask sit in word 9 of a packed key.
const W9_REVERSIBLE: u32 = (REVERSIBLE as u32) << 8;
const W9_MASK_SHIFT: u32 = 16;

impl PackedPathKey {
    /// The endpoint and destination words.
    pub fn dest(&self) -> PathDest {
        let mut d = [0u32; DEST_WORDS];
        d.copy_from_slice(&self.0[..DEST_WORDS]);
        PathDest(d)
    }

    /// The key unpacked: `k.packed().key() == k` for every key whose unspecified constraint
    /// fields are 0 (as [`cache_key`](crate::resolver::request::cache_key) makes them).
    pub fn key(&self) -> PathKey {
        let w = &self.0;
        let ep = ep_of_word(w[0]);
        let dest = if w[0] & TYPE_MASK == DEST_LID {
            Dest::Lid(w[1] as u16)
        } else {
            let mut g = [0u8; 16];
            for (c, x) in g.chunks_exact_mut(4).zip(&w[1..5]) {
                c.copy_from_slice(&x.to_be_bytes());
            }
            Dest::Gid(g)
        };
        let constraints = Constraints {
            mask: (w[9] >> W9_MASK_SHIFT) as u16,
            service_id: u64::from(w[5]) | (u64::from(w[6]) << 32),
            pkey: w[7] as u16,
            qos_class: (w[7] >> 16) as u16,
            tclass: w[8] as u8,
            sl: (w[8] >> 8) as u8,
            mtu: (w[8] >> 16) as u8,
            rate: (w[8] >> 24) as u8,
            packet_life: w[9] as u8,
            reversible_numpath: (w[9] >> 8) as u8,
        };
        PathKey {
            ep,
            dest,
            constraints,
        }
    }

    /// The key as the path cache stores it, and whether the request needs a reversible path.
    /// The reversible bit is not part of a cache key: a reversible path also answers a request
    /// that does not ask for one, so one entry serves a destination with and without the bit
    /// (a preloaded route is two entries, by DLID and by DGID, not four). A lookup that wants
    /// a reversible path and finds a record without the bit is a miss. The resolver's route
    /// jobs keep the full key, so such requests are queried apart. (The words of
    /// [`PathKey::without_reversible`].)
    #[inline]
    pub fn cache_words(&self) -> ([u32; PATH_KEY_WORDS], bool) {
        let mut w = self.0;
        let rev_set = u32::from(constraint::REVERSIBLE_NUMPATH) << W9_MASK_SHIFT;
        if w[9] & rev_set == 0 || w[9] & W9_REVERSIBLE == 0 {
            return (w, false);
        }
        w[9] &= !W9_REVERSIBLE;
        if w[9] & (0xff << 8) == 0 {
            w[9] &= !rev_set;
        }
        (w, true)
    }
}

/// The kind of an address a client or the core names a destination or a local address by:
/// the kind of an [`AddrKey`], of the resolver's `add_address` / `remove_address` /
/// `preload_address` inputs and of a hosts-file entry, with ibacm's `ACM_ADDRESS_*` values.
///
/// Of the three address-type enums of the crate, this one is the address a client asks for.
/// [`AddressType`] is `ACM_ADDRESS_*` as a class 0x2C MAD carries it (also GID and LID, which
/// peers may name themselves by, and the wire's invalid/unknown values): the resolver's
/// address map holds it. [`EpInfoType`] is `ACM_EP_INFO_*` of a client message entry (also
/// PATH). The conversions below are the only mappings between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum AddrKind {
    /// A host name (`ACM_ADDRESS_NAME`).
    Name = 1,
    /// An IPv4 address (`ACM_ADDRESS_IP`).
    Ipv4 = 2,
    /// An IPv6 address (`ACM_ADDRESS_IP6`).
    Ipv6 = 3,
}

impl From<AddrKind> for AddressType {
    fn from(k: AddrKind) -> Self {
        match k {
            AddrKind::Name => AddressType::Name,
            AddrKind::Ipv4 => AddressType::Ip,
            AddrKind::Ipv6 => AddressType::Ip6,
        }
    }
}

impl TryFrom<AddressType> for AddrKind {
    /// The type, which names no address a client asks for (GID, LID, invalid, unknown).
    type Error = AddressType;
    fn try_from(t: AddressType) -> Result<Self, AddressType> {
        match t {
            AddressType::Name => Ok(AddrKind::Name),
            AddressType::Ip => Ok(AddrKind::Ipv4),
            AddressType::Ip6 => Ok(AddrKind::Ipv6),
            other => Err(other),
        }
    }
}

impl TryFrom<EpInfoType> for AddrKind {
    /// The type, which is no address (PATH, GID, LID, unknown).
    type Error = EpInfoType;
    fn try_from(t: EpInfoType) -> Result<Self, EpInfoType> {
        match t {
            EpInfoType::Name => Ok(AddrKind::Name),
            EpInfoType::AddressIp => Ok(AddrKind::Ipv4),
            EpInfoType::AddressIp6 => Ok(AddrKind::Ipv6),
            other => Err(other),
        }
    }
}

/// Key of an address entry: endpoint, address type and up to 64 address bytes.
///
/// Bytes beyond the address are zero, as in ibacm's 64-byte `memcmp` keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddrKey {
    /// The endpoint the address was resolved on, at its flush generation (as
    /// [`PathKey::ep`]).
    pub ep: CacheEp,
    /// Address type.
    pub kind: AddrKind,
    /// Address bytes, zero padded.
    pub addr: [u8; MAX_ADDRESS],
}

impl AddrKey {
    /// A key from raw bytes; `None` if `bytes` is longer than 64.
    pub fn new(ep: CacheEp, kind: AddrKind, bytes: &[u8]) -> Option<Self> {
        let mut addr = [0u8; MAX_ADDRESS];
        addr.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(AddrKey { ep, kind, addr })
    }

    /// A host-name key; `None` if the name is longer than 64 bytes.
    pub fn name(ep: CacheEp, name: &str) -> Option<Self> {
        Self::new(ep, AddrKind::Name, name.as_bytes())
    }

    /// An IPv4 key (network-order bytes).
    pub fn ipv4(ep: CacheEp, ip: [u8; 4]) -> Self {
        let mut addr = [0u8; MAX_ADDRESS];
        addr[..4].copy_from_slice(&ip);
        AddrKey {
            ep,
            kind: AddrKind::Ipv4,
            addr,
        }
    }

    /// An IPv6 key (network-order bytes).
    pub fn ipv6(ep: CacheEp, ip: [u8; 16]) -> Self {
        let mut addr = [0u8; MAX_ADDRESS];
        addr[..16].copy_from_slice(&ip);
        AddrKey {
            ep,
            kind: AddrKind::Ipv6,
            addr,
        }
    }

    /// Packs the key into words.
    #[inline]
    pub fn to_words(&self) -> [u32; ADDR_KEY_WORDS] {
        let mut w = [0u32; ADDR_KEY_WORDS];
        w[0] = ep_word(self.ep, self.kind as u32);
        for (i, c) in self.addr.chunks_exact(4).enumerate() {
            w[1 + i] = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraints_are_exact_and_masked() {
        let a = Constraints {
            mask: constraint::SERVICE_ID,
            service_id: 5,
            ..Constraints::ANY
        };
        let b = Constraints { service_id: 6, ..a };
        assert_ne!(a.to_words(), b.to_words());
        // Unspecified fields are canonicalised away.
        let c = Constraints { pkey: 0xffff, ..a };
        assert_eq!(a.to_words(), c.to_words());
        // Specified-as-zero differs from unspecified.
        let d = Constraints {
            mask: constraint::SERVICE_ID | constraint::SL,
            ..a
        };
        assert_ne!(a.to_words(), d.to_words());
        // Each single field matters when specified.
        let all = Constraints {
            mask: 0x1ff,
            ..Constraints::ANY
        };
        let variants = [
            Constraints {
                service_id: 1 << 40,
                ..all
            },
            Constraints { pkey: 1, ..all },
            Constraints {
                qos_class: 1,
                ..all
            },
            Constraints { tclass: 1, ..all },
            Constraints { sl: 1, ..all },
            Constraints { mtu: 1, ..all },
            Constraints { rate: 1, ..all },
            Constraints {
                packet_life: 1,
                ..all
            },
            Constraints {
                reversible_numpath: 0x80,
                ..all
            },
        ];
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(v.to_words(), all.to_words(), "field {i}");
        }
    }

    #[test]
    fn packed_keys_unpack_and_fold_the_reversible_bit_as_the_unpacked_do() {
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[15] = 9;
        let mut x = 0x1234_5678_9abc_def1u64;
        for i in 0..2000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            let mask = (x >> 40) as u16 & 0x1ff;
            let on = |bit: u16, v: u8| if mask & bit != 0 { v } else { 0 };
            // Canonical: an unspecified field is 0, as cache_key makes it.
            let c = Constraints {
                mask,
                service_id: if mask & constraint::SERVICE_ID != 0 {
                    x
                } else {
                    0
                },
                pkey: u16::from(on(constraint::PKEY, b[0])) << 8,
                qos_class: u16::from(on(constraint::QOS_CLASS, b[1])),
                tclass: on(constraint::TCLASS, b[2]),
                sl: on(constraint::SL, b[3] & 0xf),
                mtu: on(constraint::MTU, b[4]),
                rate: on(constraint::RATE, b[5]),
                packet_life: on(constraint::PACKET_LIFE, b[6]),
                reversible_numpath: on(constraint::REVERSIBLE_NUMPATH, b[7] & 0x81),
            };
            let dest = if i % 2 == 0 {
                Dest::Lid(b[1] as u16 | 1)
            } else {
                Dest::Gid(gid)
            };
            let k = PathKey {
                ep: ep_number(i.wrapping_mul(0x9e37_79b9), i as u8),
                dest,
                constraints: c,
            };
            assert_eq!(k.packed().key(), k, "{k:?}");
            let (w, wants) = k.packed().cache_words();
            let rev =
                mask & constraint::REVERSIBLE_NUMPATH != 0 && c.reversible_numpath & 0x80 != 0;
            assert_eq!(wants, rev, "{k:?}");
            let stored = if rev { k.without_reversible() } else { k };
            assert_eq!(w, stored.to_words(), "{k:?}");
        }
    }

    #[test]
    fn lid_and_gid_keys_differ() {
        let l = PathKey::new(ep_number(0, 1), Dest::Lid(0x0102));
        let mut gid = [0u8; 16];
        gid[15] = 2;
        gid[14] = 1;
        let g = PathKey::new(ep_number(0, 1), Dest::Gid(gid));
        assert_ne!(l.to_words(), g.to_words());
        assert_ne!(
            PathKey::new(ep_number(0, 2), Dest::Lid(0x0102)).to_words(),
            l.to_words()
        );
    }

    #[test]
    fn addr_kinds_convert_only_between_the_address_types() {
        for (k, t, e) in [
            (AddrKind::Name, AddressType::Name, EpInfoType::Name),
            (AddrKind::Ipv4, AddressType::Ip, EpInfoType::AddressIp),
            (AddrKind::Ipv6, AddressType::Ip6, EpInfoType::AddressIp6),
        ] {
            assert_eq!(AddressType::from(k), t);
            assert_eq!(u8::from(t), k as u8);
            assert_eq!(AddrKind::try_from(t), Ok(k));
            assert_eq!(AddrKind::try_from(e), Ok(k));
        }
        for b in [0u8, 4, 5, 6, 0xff] {
            let t = AddressType::from(b);
            assert_eq!(AddrKind::try_from(t), Err(t));
        }
        for t in [
            EpInfoType::Gid,
            EpInfoType::Lid,
            EpInfoType::Path,
            EpInfoType::from(9),
        ] {
            assert_eq!(AddrKind::try_from(t), Err(t));
        }
    }

    #[test]
    fn addr_keys() {
        assert!(AddrKey::new(ep_number(0, 0), AddrKind::Name, &[b'a'; 65]).is_none());
        let n = AddrKey::name(ep_number(0, 0), "host1").unwrap();
        assert_eq!(&n.addr[..5], b"host1");
        assert_ne!(
            n.to_words(),
            AddrKey::name(ep_number(0, 0), "host2").unwrap().to_words()
        );
        assert_ne!(
            AddrKey::ipv4(ep_number(0, 0), [1, 2, 3, 4]).to_words(),
            AddrKey::new(ep_number(0, 0), AddrKind::Ipv6, &[1, 2, 3, 4])
                .unwrap()
                .to_words()
        );
    }
}
