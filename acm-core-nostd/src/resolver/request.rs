//! Client requests: classification, cache keys and answers (pure functions).
//!
//! The provider's inline hit path and the [`Resolver`](super::Resolver) both use these, so a
//! request is read, keyed and answered one way everywhere. The codec is [`crate::wire::client`].
//!
//! * [`classify`] validates a RESOLVE message (the core's `acm_svr_verify_resolve` rules, plus
//!   the `src_out` rule for PATH requests) and says what it asks for: a route
//!   ([`Target::Route`], with the cache key and the SA query record) or an address
//!   ([`Target::Address`], looked up with
//!   [`PathCache::lookup_addr`](crate::cache::PathCache::lookup_addr)).
//! * [`normalise`] and [`cache_key`] turn a client PathRecord into the key requests coalesce
//!   and cache on: destination (DLID, else DGID) plus every constraint the client set.
//! * [`respond`] builds the answer with `wire::client`, and never panics on any input.

use crate::cache::key::{ep_word, DEST_GID, DEST_LID};
use crate::cache::{
    constraint, AddrKey, AddrKind, CacheEp, PackedPathKey, PathDest, PathKey, DEST_WORDS,
    PATH_KEY_WORDS,
};
use crate::wire::client::{
    build_error_response, build_query_response, build_resolve_response, AcmMsg, EpInfoType, Status,
    FLAGS_NODELAY, HDR_LEN,
};
use crate::wire::gid::Gid;
use crate::wire::path_record::{PathRecord, PathRecordRepr};
use crate::wire::Selector;

use super::{Via, MSG_LEN};

/// What classification needs to know about the endpoint a request arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpView {
    /// The caller's cache endpoint number
    /// ([`ep_number`](crate::cache::ep_number): flush generation << 8 | endpoint slot).
    pub cache_ep: CacheEp,
    /// Port GID index 0.
    pub port_gid: Gid,
    /// Port base LID (0 if unknown).
    pub lid: u16,
    /// The endpoint's P_Key.
    pub pkey: u16,
}

/// What a RESOLVE request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A route: look `key` up in the path cache (`None`: the request sets something a cache
    /// key cannot hold, so it always goes to the SA), else send `sa` to the SA.
    Route {
        /// Cache key, packed, if the request is cacheable.
        key: Option<PackedPathKey>,
        /// The normalised record, which gives the PathRecord to query the SA with
        /// ([`RouteRecord::query_record`]; a cache hit never builds it).
        record: RouteRecord,
        /// `ACM_FLAGS_NODELAY`: answer from the cache only (a miss answers ENODATA and primes).
        nodelay: bool,
    },
    /// A name or IP address: look `key` up with `PathCache::lookup_addr`.
    Address {
        /// The address key (the request's `cache_ep`, type, 64 bytes).
        key: AddrKey,
        /// `ACM_FLAGS_NODELAY`.
        nodelay: bool,
    },
    /// Answer at once with this status (EINVAL for malformed requests).
    Fail(Status),
}

/// Classifies a RESOLVE request (`msg` = the client's message, up to 592 bytes).
///
/// EINVAL for: a message `wire::client` rejects (length not 16 + 72·n with n ≥ 1, version,
/// opcode, indices); a PATH request with `src_out` whose source entry is not a NAME/IP/IP6
/// entry inside the message; a PATH request with neither DLID nor DGID; LID 0; an
/// unknown destination type.
pub fn classify(ep: &EpView, msg: &[u8]) -> Target {
    let Ok(m) = AcmMsg::new_checked(msg) else {
        return Target::Fail(Status::Einval);
    };
    let Ok(layout) = m.check_resolve() else {
        return Target::Fail(Status::Einval);
    };
    let Some(dest) = m.entry(layout.dest) else {
        return Target::Fail(Status::Einval);
    };
    let nodelay = dest.flags() & FLAGS_NODELAY != 0;
    let Ok(info) = <&[u8; 64]>::try_from(dest.info()) else {
        return Target::Fail(Status::Einval);
    };
    if layout.is_path {
        // The core does not preprocess `hdr.data` of PATH requests: an echoed source must be a
        // real address entry inside the message, or the client would get a bogus second path.
        if let Some(s) = layout.source {
            let ok = s < layout.count
                && m.entry(s)
                    .is_some_and(|e| AddrKind::try_from(e.info_type()).is_ok());
            if !ok {
                return Target::Fail(Status::Einval);
            }
        }
        let p = PathRecord::new_unchecked(&info[..]);
        if p.dlid() == 0 && p.dgid().is_zero() {
            return Target::Fail(Status::Einval);
        }
        return route(ep, info, nodelay);
    }
    let kind = match dest.info_type() {
        EpInfoType::Gid => {
            let mut r = gid_record(dest.info_gid(), 0);
            PathRecord::new_unchecked(&mut r[..]).set_reversible_numpath(true, 0);
            return route(ep, &r, nodelay);
        }
        EpInfoType::Lid => {
            let lid = dest.info_lid();
            if lid == 0 {
                return Target::Fail(Status::Einval);
            }
            let mut r = [0u8; 64];
            let mut p = PathRecord::new_unchecked(&mut r[..]);
            p.set_dlid(lid);
            p.set_reversible_numpath(true, 0);
            return route(ep, &r, nodelay);
        }
        t => match AddrKind::try_from(t) {
            Ok(kind) => kind,
            Err(_) => return Target::Fail(Status::Einval),
        },
    };
    Target::Address {
        key: AddrKey {
            ep: ep.cache_ep,
            kind,
            addr: *info,
        },
        nodelay,
    }
}

/// The destination of a PATH request (entry 0 a PATH entry), read before anything else of the
/// request is checked: a path is placed in the cache by its destination, so the caller can
/// start loading the slots of the request's key at once
/// ([`PathCache::prefetch_hint`](crate::cache::PathCache::prefetch_hint)). `None` for other
/// requests; a request that then fails [`classify`] only wasted that load.
#[inline]
pub fn route_dest(ep: &EpView, msg: &[u8]) -> Option<PathDest> {
    let m = AcmMsg::new_unchecked(msg);
    let e = m.entry(0)?;
    if e.info_type() != EpInfoType::Path {
        return None;
    }
    Words::of(<&[u8; 64]>::try_from(e.info()).ok()?).dest(ep.cache_ep)
}

/// The route target in one pass: the record read once as 8 words, normalised and keyed in
/// registers ([`Words`]).
#[inline]
fn route(ep: &EpView, record: &[u8; 64], nodelay: bool) -> Target {
    let n = Words::of(record).normalised(ep);
    Target::Route {
        key: n.key(ep.cache_ep),
        record: RouteRecord(n),
        nodelay,
    }
}

/// The cache key and SA query record of a plain request by GID and of one by LID for
/// `rec`'s destination, on `ep` (what a half-world table's record is filed under, and the
/// route jobs it answers).
pub(crate) fn plain_queries(ep: &EpView, rec: &[u8; 64]) -> [Option<(PathKey, [u8; 64])>; 2] {
    let p = PathRecord::new_unchecked(&rec[..]);
    let mut by_gid = gid_record(p.dgid(), 0);
    PathRecord::new_unchecked(&mut by_gid[..]).set_reversible_numpath(true, 0);
    let mut by_lid = [0u8; 64];
    let mut q = PathRecord::new_unchecked(&mut by_lid[..]);
    q.set_dlid(p.dlid());
    q.set_reversible_numpath(true, 0);
    let key = |r: &[u8; 64]| {
        let n = Words::of(r).normalised(ep);
        let k = n.key(ep.cache_ep)?.key();
        Some((k, n.with_query_fields(ep).bytes()))
    };
    [
        (!p.dgid().is_zero()).then(|| key(&by_gid)).flatten(),
        (p.dlid() != 0).then(|| key(&by_lid)).flatten(),
    ]
}

/// A route request's normalised PathRecord ([`normalise`]'s first half), kept as words.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RouteRecord(Words);

impl RouteRecord {
    /// The PathRecord to query the SA with ([`normalise`]'s second half): the endpoint's
    /// SGID and P_Key put back where the client gave none.
    pub fn query_record(&self, ep: &EpView) -> [u8; 64] {
        self.0.with_query_fields(ep).bytes()
    }
}

impl core::fmt::Debug for RouteRecord {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "RouteRecord({:02x?})", self.0.bytes())
    }
}

/// A PathRecord as 8 big-endian 64-bit words (bytes `8i..8i + 8` are word `i`), so that
/// normalising and keying it are a few register operations, not dozens of byte accesses
/// (and no narrow store is read back wide). Layout in `wire::path_record`:
///
/// ```text
/// 0 ServiceID   1-2 DGID   3-4 SGID   5 DLID:16 SLID:16 flow/hop:32
/// 6 TClass:8 Reversible/NumbPath:8 P_Key:16 QoS/SL:16 MTU:8 Rate:8
/// 7 PacketLife:8 Preference:8 reserved:48
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
struct Words([u64; 8]);

impl Words {
    #[inline(always)]
    fn of(r: &[u8; 64]) -> Self {
        let mut w = [0u64; 8];
        for (o, c) in w.iter_mut().zip(r.chunks_exact(8)) {
            *o = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        }
        Words(w)
    }

    #[inline(always)]
    fn bytes(&self) -> [u8; 64] {
        let mut r = [0u8; 64];
        for (c, w) in r.chunks_exact_mut(8).zip(self.0) {
            c.copy_from_slice(&w.to_be_bytes());
        }
        r
    }

    #[inline(always)]
    fn gid_pair(g: Gid) -> (u64, u64) {
        let b = g.0;
        (
            u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            u64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        )
    }

    /// Clears what names this endpoint itself (SLID = port LID, SGID = GID0, P_Key = the
    /// endpoint's partition, membership bit aside) and NumbPath, Preference and reserved.
    #[inline(always)]
    fn normalised(mut self, ep: &EpView) -> Self {
        let w = &mut self.0;
        let slid = (w[5] >> 32) as u16;
        if ep.lid != 0 && slid == ep.lid {
            w[5] &= !(0xffff << 32);
        }
        if (w[3], w[4]) == Self::gid_pair(ep.port_gid) {
            (w[3], w[4]) = (0, 0);
        }
        let pkey = (w[6] >> 32) as u16;
        if pkey & 0x7fff == ep.pkey & 0x7fff {
            w[6] &= !(0xffff << 32);
        }
        // NumbPath (bits 6..0 of byte 49); Preference and reserved (bytes 57..63).
        w[6] &= !(0x7f << 48);
        w[7] &= 0xff << 56;
        self
    }

    /// The SA query record of a normalised record: the endpoint's SGID when no source is
    /// given, its P_Key when none is.
    #[inline(always)]
    fn with_query_fields(mut self, ep: &EpView) -> Self {
        let w = &mut self.0;
        if w[3] | w[4] == 0 && (w[5] >> 32) as u16 == 0 {
            (w[3], w[4]) = Self::gid_pair(ep.port_gid);
        }
        if (w[6] >> 32) as u16 == 0 {
            w[6] |= u64::from(ep.pkey) << 32;
        }
        self
    }

    /// The endpoint and destination words of a key (DLID, else DGID; `None` for neither or
    /// both). Normalisation leaves both alone, so this is the same for the client's record.
    #[inline(always)]
    fn dest(&self, cache_ep: CacheEp) -> Option<PathDest> {
        let w = &self.0;
        let ep = ep_word(cache_ep, 0);
        match ((w[5] >> 48) as u16, w[1] | w[2] == 0) {
            (0, false) => Some(PathDest([
                ep | DEST_GID,
                (w[1] >> 32) as u32,
                w[1] as u32,
                (w[2] >> 32) as u32,
                w[2] as u32,
            ])),
            (l, true) if l != 0 => Some(PathDest([ep | DEST_LID, u32::from(l), 0, 0, 0])),
            _ => None,
        }
    }

    /// The packed cache key of a normalised record ([`cache_key`]).
    #[inline(always)]
    fn key(&self, cache_ep: CacheEp) -> Option<PackedPathKey> {
        let w = &self.0;
        let (slid, flow_hop) = ((w[5] >> 32) as u16, w[5] as u32);
        // A foreign source, flow label or hop limit: not cacheable (Preference is 0 here).
        if slid != 0 || w[3] | w[4] != 0 || flow_hop != 0 {
            return None;
        }
        let mut k = [0u32; PATH_KEY_WORDS];
        k[..DEST_WORDS].copy_from_slice(&self.dest(cache_ep)?.0);
        let sid = w[0];
        let (tclass, rev_numpath) = ((w[6] >> 56) as u8, (w[6] >> 48) as u8);
        let (pkey, qos_sl) = ((w[6] >> 32) as u16, (w[6] >> 16) as u16);
        let (qos_class, sl) = (qos_sl >> 4, (qos_sl & 0xf) as u8);
        let (mtu, rate, packet_life) = ((w[6] >> 8) as u8, w[6] as u8, (w[7] >> 56) as u8);
        // A field is a constraint exactly when the client set it (non-zero).
        let bit = |set: bool, b: u16| if set { b } else { 0 };
        let mask = bit(sid != 0, constraint::SERVICE_ID)
            | bit(pkey != 0, constraint::PKEY)
            | bit(qos_class != 0, constraint::QOS_CLASS)
            | bit(tclass != 0, constraint::TCLASS)
            | bit(sl != 0, constraint::SL)
            | bit(mtu != 0, constraint::MTU)
            | bit(rate != 0, constraint::RATE)
            | bit(packet_life != 0, constraint::PACKET_LIFE)
            | bit(rev_numpath != 0, constraint::REVERSIBLE_NUMPATH);
        // `Constraints::to_words`'s layout, packed here without building `Constraints` (through
        // it, `classify` measured 4–15 ns slower); the oracle test below holds the two equal.
        k[5] = sid as u32;
        k[6] = (sid >> 32) as u32;
        k[7] = u32::from(pkey) | (u32::from(qos_class) << 16);
        k[8] = u32::from(tclass)
            | (u32::from(sl) << 8)
            | (u32::from(mtu) << 16)
            | (u32::from(rate) << 24);
        k[9] = u32::from(packet_life) | (u32::from(rev_numpath) << 8) | (u32::from(mask) << 16);
        Some(PackedPathKey(k))
    }
}

/// A PathRecord asking for any path to `gid` (with traffic class `tclass`): what an address
/// resolves to (ibacmp's `{dgid, tclass}` before the SA query).
pub fn gid_record(gid: Gid, tclass: u8) -> [u8; 64] {
    let mut r = [0u8; 64];
    let mut p = PathRecord::new_unchecked(&mut r[..]);
    p.set_dgid(gid);
    p.set_tclass(tclass);
    r
}

/// The normalised key record and the SA query record for a client PathRecord.
///
/// Fields that name this endpoint itself (SLID = port LID, SGID = GID0, P_Key = the endpoint's
/// partition) and NumbPath/Preference/reserved are cleared in the key; every other field the
/// client set stays, so requests with other constraints never share a cached path. The SA
/// record puts the endpoint's SGID (when no source is given) and P_Key back.
pub fn normalise(ep: &EpView, record: &[u8; 64]) -> ([u8; 64], [u8; 64]) {
    let n = Words::of(record).normalised(ep);
    (n.bytes(), n.with_query_fields(ep).bytes())
}

/// The cache key of a normalised record: destination (DLID, else DGID) plus every constraint
/// the client set. `None` when the record sets something the key cannot hold (both DLID and
/// DGID, a foreign SLID/SGID, flow label, hop limit, preference): such requests always go to
/// the SA.
#[inline]
pub fn cache_key(cache_ep: CacheEp, normalised: &[u8; 64]) -> Option<PathKey> {
    let w = Words::of(normalised);
    // Preference is cleared by normalisation; a record that still has one is not a key.
    if (w.0[7] >> 48) as u8 != 0 {
        return None;
    }
    w.key(cache_ep).map(|k| k.key())
}

/// The loopback path of an endpoint (`loopback_prot local`): SGID = DGID = GID0, SLID = DLID =
/// port LID, reversible, the endpoint's P_Key, the port's MTU and rate without selector bits.
pub fn loopback_path(port_gid: Gid, lid: u16, pkey: u16, mtu: u8, rate: u8) -> [u8; 64] {
    let mut r = [0u8; 64];
    let mut p = PathRecord::new_unchecked(&mut r[..]);
    p.set_dgid(port_gid);
    p.set_sgid(port_gid);
    p.set_dlid(lid);
    p.set_slid(lid);
    p.set_reversible_numpath(true, 0);
    p.set_pkey(pkey);
    p.set_mtu(Selector::from_byte(0), mtu);
    p.set_rate(Selector::from_byte(0), rate);
    r
}

/// Builds the answer to `request` into `out` and returns its length.
///
/// [`Via::Resolve`]: on success (`status` 0 with a `path`) the resolve response (path at
/// index 0, flags 0x2B, the source echoed when `src_out`), otherwise the 16-byte error
/// response. [`Via::Query`]: the request with ACK, `status` and the SA's record (when given).
/// A request the codec rejects (too short, malformed) still gets a 16-byte answer with its
/// header bytes (zero-padded) and the status (EINVAL if a success cannot be built), with
/// `ACM_OP_ACK` for [`Via::Query`]; this never panics. Only the first (returned) length bytes
/// of `out` are written.
pub fn respond(
    request: &[u8],
    via: Via,
    status: Status,
    path: Option<&[u8; 64]>,
    out: &mut [u8; MSG_LEN],
) -> u16 {
    // No zeroing up front: each builder writes every byte of the length it returns (the
    // header, and for a resolve response entry 0 in full and the echoed source entry); the
    // bytes of `out` past that length are left as they were.
    let req = AcmMsg::new_unchecked(request);
    let built = match (via, status, path) {
        (Via::Resolve, Status::Success, Some(p)) => build_resolve_response(&req, p, &mut out[..]),
        (Via::Resolve, Status::Success, None) => {
            build_error_response(&req, Status::Einval, &mut out[..])
        }
        (Via::Resolve, s, _) => build_error_response(&req, s, &mut out[..]),
        (Via::Query, s, p) => {
            let repr = p.and_then(|p| PathRecordRepr::parse_bytes(p).ok());
            build_query_response(&req, s, repr.as_ref(), &mut out[..])
        }
    };
    if let Ok(n) = built {
        return n as u16;
    }
    // The codec refused the request: a bare header answer, so the client still gets one.
    out.fill(0);
    let n = request.len().min(HDR_LEN);
    out[..n].copy_from_slice(&request[..n]);
    let status = match status {
        Status::Success => Status::Einval,
        s => s,
    };
    let mut hdr = [0u8; HDR_LEN];
    hdr.copy_from_slice(&out[..HDR_LEN]);
    let fallback = build_error_response(&AcmMsg::new_unchecked(&hdr[..]), status, &mut out[..]);
    if via == Via::Query {
        // Every query() answer carries ACM_OP_ACK, the rejected ones too (as ibacmp's).
        AcmMsg::new_unchecked(&mut out[..]).set_ack();
    }
    fallback.map_or(HDR_LEN as u16, |n| n as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Dest;
    use crate::wire::client::{ClientRequest, EpInfoType, EP_FLAG_DEST, EP_FLAG_SOURCE, OP_ACK};

    fn view() -> EpView {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[15] = 4;
        EpView {
            // A wide generation: all 30 bits of the endpoint number survive packing.
            cache_ep: crate::cache::ep_number(0x2a_5a5a, 2),
            port_gid: Gid(g),
            lid: 4,
            pkey: 0xffff,
        }
    }

    /// A RESOLVE request of `entries` (flags, type, info) through the one builder, with the
    /// header's `data` bytes as given (also inconsistent ones).
    fn msg(entries: &[(u32, u16, [u8; 64])], hdr_data: [u8; 3]) -> [u8; MSG_LEN] {
        let mut r = ClientRequest::resolve(0x1122_3344_5566_7788);
        for (flags, t, info) in entries {
            r = r.address(*flags, EpInfoType::from(*t), info);
        }
        let mut b = *r.buf();
        let mut m = AcmMsg::new_unchecked(&mut b[..]);
        m.set_src_out(hdr_data[0]);
        m.set_src_index(hdr_data[1]);
        m.set_dst_index(hdr_data[2]);
        b
    }

    fn lid_path(lid: u16) -> [u8; 64] {
        let mut r = [0u8; 64];
        PathRecord::new_unchecked(&mut r[..]).set_dlid(lid);
        r
    }

    fn name(s: &str) -> [u8; 64] {
        let mut a = [0u8; 64];
        a[..s.len()].copy_from_slice(s.as_bytes());
        a
    }

    /// The normalisation and key rules field by field, with the record accessors: the
    /// specification the word-level [`Words`] code must match.
    fn reference(ep: &EpView, record: &[u8; 64]) -> ([u8; 64], [u8; 64], Option<PathKey>) {
        use crate::cache::{constraint, Constraints};
        let mut k = *record;
        let mut p = PathRecord::new_unchecked(&mut k[..]);
        if ep.lid != 0 && p.slid() == ep.lid {
            p.set_slid(0);
        }
        if p.sgid() == ep.port_gid {
            p.set_sgid(Gid::ZERO);
        }
        if p.pkey() & 0x7fff == ep.pkey & 0x7fff {
            p.set_pkey(0);
        }
        let reversible = p.reversible();
        p.set_reversible_numpath(reversible, 0);
        p.set_preference(0);
        p.clear_reserved();
        let mut q = k;
        let mut p = PathRecord::new_unchecked(&mut q[..]);
        if p.sgid().is_zero() && p.slid() == 0 {
            p.set_sgid(ep.port_gid);
        }
        if p.pkey() == 0 {
            p.set_pkey(ep.pkey);
        }
        let p = PathRecord::new_unchecked(&k[..]);
        let dest = match (p.dlid(), p.dgid()) {
            (0, g) if g.is_zero() => None,
            (0, g) => Some(Dest::Gid(g.0)),
            (l, g) if g.is_zero() => Some(Dest::Lid(l)),
            _ => None,
        };
        let foreign = p.slid() != 0 || !p.sgid().is_zero() || p.flowlabel_hoplimit() != 0;
        let key = dest.filter(|_| !foreign).map(|dest| {
            let mut c = Constraints {
                mask: 0,
                service_id: p.service_id(),
                pkey: p.pkey(),
                qos_class: p.qos_class(),
                tclass: p.tclass(),
                sl: p.sl(),
                mtu: p.mtu_byte(),
                rate: p.rate_byte(),
                packet_life: p.packet_life_byte(),
                reversible_numpath: p.reversible_numpath(),
            };
            for (set, bit) in [
                (c.service_id != 0, constraint::SERVICE_ID),
                (c.pkey != 0, constraint::PKEY),
                (c.qos_class != 0, constraint::QOS_CLASS),
                (c.tclass != 0, constraint::TCLASS),
                (c.sl != 0, constraint::SL),
                (c.mtu != 0, constraint::MTU),
                (c.rate != 0, constraint::RATE),
                (c.packet_life != 0, constraint::PACKET_LIFE),
                (c.reversible_numpath != 0, constraint::REVERSIBLE_NUMPATH),
            ] {
                if set {
                    c.mask |= bit;
                }
            }
            PathKey {
                ep: ep.cache_ep,
                dest,
                constraints: c,
            }
        });
        (k, q, key)
    }

    #[test]
    fn records_are_normalised_and_keyed_as_the_field_rules_say() {
        let v = view();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..20_000 {
            let mut r = [0u8; 64];
            for c in r.chunks_exact_mut(8) {
                c.copy_from_slice(&next().to_le_bytes());
            }
            // Mostly-zero records with some fields set, so that every branch is taken: each
            // field is kept, zeroed or set to this endpoint's own value.
            let sel = next();
            let mut p = PathRecord::new_unchecked(&mut r[..]);
            let pick = |n: u32| (sel >> (2 * n)) & 3;
            if pick(0) != 0 {
                p.set_service_id(0);
            }
            match pick(1) {
                0 => p.set_dgid(Gid::ZERO),
                1 => p.set_dgid(v.port_gid),
                _ => {}
            }
            match pick(2) {
                0 | 1 => p.set_sgid(Gid::ZERO),
                2 => p.set_sgid(v.port_gid),
                _ => {}
            }
            match pick(3) {
                0 | 1 => p.set_dlid(0),
                _ => {}
            }
            match pick(4) {
                0 | 1 => p.set_slid(0),
                2 => p.set_slid(v.lid),
                _ => {}
            }
            let flow_hop = pick(5) == 3;
            match pick(6) {
                0 => p.set_pkey(0),
                1 => p.set_pkey(v.pkey & 0x7fff),
                2 => p.set_pkey(v.pkey),
                _ => {}
            }
            if pick(7) != 3 {
                p.set_qosclass_sl(0, 0);
            }
            for (n, at) in [(8, 48), (9, 49), (10, 54), (11, 55), (12, 56), (13, 57)] {
                if pick(n) != 3 {
                    r[at] = 0;
                }
            }
            if !flow_hop {
                r[44..48].fill(0);
            }
            let (k, q, key) = reference(&v, &r);
            assert_eq!(normalise(&v, &r), (k, q), "record {i}: {r:?}");
            assert_eq!(cache_key(v.cache_ep, &k), key, "record {i}: {r:?}");
            let Target::Route {
                key: packed,
                record,
                ..
            } = route(&v, &r, false)
            else {
                panic!()
            };
            assert_eq!(packed.map(|p| p.key()), key, "record {i}");
            assert_eq!(packed, key.map(|k| k.packed()), "record {i}");
            assert_eq!(record.query_record(&v), q, "record {i}");
        }
    }

    #[test]
    fn path_by_lid_is_keyed_and_queried() {
        let m = msg(&[(0, 0x10, lid_path(6))], [0; 3]);
        let Target::Route {
            key,
            record,
            nodelay,
        } = classify(&view(), &m[..88])
        else {
            panic!()
        };
        let sa = record.query_record(&view());
        let key = key.unwrap().key();
        assert_eq!(key.ep, view().cache_ep);
        assert_eq!((key.ep.generation(), key.ep.slot()), (0x2a_5a5a, 2));
        assert_eq!(key.dest, Dest::Lid(6));
        assert_eq!(key.constraints.mask, 0);
        assert!(!nodelay);
        let p = PathRecord::new_unchecked(&sa[..]);
        assert_eq!((p.dlid(), p.pkey(), p.sgid()), (6, 0xffff, view().port_gid));
    }

    #[test]
    fn own_slid_sgid_pkey_are_normalised_foreign_ones_uncacheable() {
        let mut r = lid_path(6);
        {
            let mut p = PathRecord::new_unchecked(&mut r[..]);
            p.set_slid(4);
            p.set_sgid(view().port_gid);
            p.set_pkey(0x7fff);
            p.set_preference(3);
        }
        let m = msg(&[(FLAGS_NODELAY, 0x10, r)], [0; 3]);
        let Target::Route { key, nodelay, .. } = classify(&view(), &m[..88]) else {
            panic!()
        };
        assert_eq!(key.unwrap().key().constraints.mask, 0);
        assert!(nodelay);
        PathRecord::new_unchecked(&mut r[..]).set_slid(9);
        let m = msg(&[(0, 0x10, r)], [0; 3]);
        assert!(matches!(
            classify(&view(), &m[..88]),
            Target::Route { key: None, .. }
        ));
    }

    #[test]
    fn einval_rules() {
        let v = view();
        let ok = msg(&[(0, 0x10, lid_path(6))], [0; 3]);
        // Length 87, 16, 600-ish, not a multiple of 72.
        for len in [87usize, 16, 100] {
            let mut m = ok;
            m[6..8].copy_from_slice(&(len as u16).to_ne_bytes());
            assert_eq!(classify(&v, &m), Target::Fail(Status::Einval), "len {len}");
        }
        // Wrong opcode, wrong version.
        let mut m = ok;
        m[1] = 2;
        assert_eq!(classify(&v, &m), Target::Fail(Status::Einval));
        let mut m = ok;
        m[0] = 2;
        assert_eq!(classify(&v, &m), Target::Fail(Status::Einval));
        // No DLID/DGID.
        let m = msg(&[(0, 0x10, [0; 64])], [0; 3]);
        assert_eq!(classify(&v, &m), Target::Fail(Status::Einval));
        // G6: src_out pointing at the PATH entry itself, at an unknown type, past the end.
        let m = msg(&[(0, 0x10, lid_path(6))], [1, 0, 0]);
        assert_eq!(classify(&v, &m), Target::Fail(Status::Einval));
        let m = msg(&[(0, 0x10, lid_path(6)), (1, 0x99, name("x"))], [1, 1, 0]);
        assert_eq!(classify(&v, &m), Target::Fail(Status::Einval));
        let m = msg(&[(0, 0x10, lid_path(6))], [1, 1, 0]);
        assert_eq!(classify(&v, &m), Target::Fail(Status::Einval));
        let m = msg(&[(0, 0x10, lid_path(6)), (1, 1, name("a"))], [1, 1, 0]);
        assert!(matches!(classify(&v, &m), Target::Route { .. }));
        // dst_index out of range, LID 0, dest type 0x99.
        let m = msg(&[(EP_FLAG_DEST, 1, name("b"))], [0, 0, 1]);
        assert_eq!(classify(&v, &m), Target::Fail(Status::Einval));
        let m = msg(&[(EP_FLAG_DEST, 5, [0; 64])], [0; 3]);
        assert_eq!(classify(&v, &m), Target::Fail(Status::Einval));
        let m = msg(&[(EP_FLAG_DEST, 0x99, name("b"))], [0; 3]);
        assert_eq!(classify(&v, &m), Target::Fail(Status::Einval));
        // Short buffers never panic.
        for n in 0..20 {
            let _ = classify(&v, &ok[..n]);
        }
    }

    #[test]
    fn names_and_ips_are_addresses_gid_and_lid_are_routes() {
        let v = view();
        let m = msg(
            &[
                (EP_FLAG_DEST, 1, name("hca4")),
                (EP_FLAG_SOURCE, 1, name("hca3")),
            ],
            [0, 1, 0],
        );
        let Target::Address { key, nodelay } = classify(&v, &m) else {
            panic!()
        };
        assert_eq!(key, AddrKey::name(v.cache_ep, "hca4").unwrap());
        assert!(!nodelay);
        let mut ip = [0u8; 64];
        ip[..4].copy_from_slice(&[10, 0, 0, 6]);
        let m = msg(&[(EP_FLAG_DEST, 2, ip)], [1, 1, 0]);
        assert!(matches!(
            classify(&v, &m),
            Target::Address {
                key: AddrKey {
                    kind: AddrKind::Ipv4,
                    ..
                },
                ..
            }
        ));
        let mut lid = [0u8; 64];
        lid[1] = 6;
        let m = msg(&[(EP_FLAG_DEST, 5, lid)], [0; 3]);
        let Target::Route { key, .. } = classify(&v, &m) else {
            panic!()
        };
        assert_eq!(key.unwrap().key().dest, Dest::Lid(6));
        let m = msg(&[(EP_FLAG_DEST, 4, gid_record(v.port_gid, 0))], [0; 3]);
        assert!(matches!(classify(&v, &m), Target::Route { .. }));
    }

    #[test]
    fn responses() {
        let v = view();
        let m = msg(
            &[
                (EP_FLAG_DEST, 1, name("hca4")),
                (EP_FLAG_SOURCE, 1, name("hca3")),
            ],
            [1, 1, 0],
        );
        let path = loopback_path(v.port_gid, 4, 0xffff, 4, 3);
        let mut out = [0u8; MSG_LEN];
        let n = respond(
            &m[..160],
            Via::Resolve,
            Status::Success,
            Some(&path),
            &mut out,
        );
        assert_eq!(n, 160);
        assert_eq!(&out[8..16], &m[8..16], "tid");
        assert_eq!(&out[24..88], &path[..]);
        assert_eq!(u32::from_ne_bytes(out[16..20].try_into().unwrap()), 0x2b);
        assert_eq!(&out[88 + 8..88 + 72], &name("hca3")[..]);
        let n = respond(&m[..160], Via::Resolve, Status::Enodata, None, &mut out);
        assert_eq!((n, out[2]), (16, 3));
        let q = msg(&[(0, 0x10, lid_path(6))], [0; 3]);
        let n = respond(&q[..88], Via::Query, Status::Success, Some(&path), &mut out);
        assert_eq!((n, out[1], out[2]), (88, 1 | OP_ACK, 0));
        assert_eq!(&out[24..88], &path[..]);
        // Garbage in, a 16-byte answer out, never a panic.
        for n in 0..40 {
            for via in [Via::Resolve, Via::Query] {
                let len = respond(&q[..n], via, Status::Success, Some(&path), &mut out);
                assert!(len as usize >= HDR_LEN);
            }
        }
        // A rejected query (length 160, or 16) is still answered with ACK.
        for len in [160u16, 16] {
            let mut bad = q;
            bad[6..8].copy_from_slice(&len.to_ne_bytes());
            let n = respond(&bad[..], Via::Query, Status::Einval, None, &mut out);
            assert_eq!((n, out[1], out[2]), (16, 1 | OP_ACK, 2));
            assert_eq!(&out[8..16], &bad[8..16], "tid");
        }
    }
}
