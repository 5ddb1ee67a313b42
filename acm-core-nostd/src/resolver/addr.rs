//! The address entries: one per (endpoint, address type, 64 bytes), and how an address
//! request is answered from it.
//!
//! An entry's states map onto ibacmp's `acmp_dest`:
//!
//! ```text
//!  absent ──request──▶ Queued ──window/joined──▶ Querying ──response / peer's request──▶ Resolved
//!   (INIT)            (QUERY_ADDR, FIFO,          (QUERY_ADDR, retried every               (ADDR_RESOLVED;
//!                      queue_deadline)             timeout + subnet timeout)                QUERY_ROUTE while a
//!                         │                            │ retries exhausted                  route job runs, READY
//!                         └──deadline──▶ answered, freed ◀┘ (ETIMEDOUT)                    once cached + aliased)
//! ```
//!
//! Queued and Querying belong to the ACM protocol ([`acm`](super::acm)). Local addresses
//! (`add_address`) are `Local`; hosts-file entries are `Resolved` with origin `Preload`
//! (renewed on use when expired); entries learned from peers' requests are
//! `Resolved`/`Learned` and may be evicted when every entry is used and they are idle. A
//! removed local address is `Removing` until its cache alias is dropped.

use super::request;
use super::storage::chain;
use super::storage::{
    bucket_of, list_id, AddrState, List, Origin, Storage, ADDR_Q, ADDR_R, ADDR_S, REQ,
};
use super::timers::Timer;
use super::{AddrEntry, Config, EpSlot, JobSlot, Millis, RequestSlot, Shared, NEVER};
use crate::cache::{AddrKey, AddrKind, CacheEp, CacheRef, CacheWriter, PathKey};
use crate::wire::acm_mad::AddressType;
use crate::wire::client::{AcmMsg, EP_FLAG_SOURCE};
use crate::wire::gid::Gid;
use crate::wire::mcmember::McMemberRecord;

/// The cache address key of an entry (NAME/IP/IP6 only).
pub(crate) fn addr_key(a: &AddrEntry) -> Option<AddrKey> {
    let kind = AddrKind::try_from(a.type_).ok()?;
    Some(AddrKey {
        ep: a.cache_ep,
        kind,
        addr: a.addr,
    })
}

/// Aliases entry `a`'s address to the cached path `key` (expiring at `path_expires`), with
/// TTL = min(address lifetime, route lifetime).
pub(crate) fn alias<C: CacheRef>(
    w: &mut CacheWriter<C>,
    a: &AddrEntry,
    key: &PathKey,
    now: Millis,
    path_expires: Millis,
) {
    let Some(k) = addr_key(a) else {
        return;
    };
    let until = a.expires.min(path_expires);
    if until <= now {
        return;
    }
    // NoSuchPath: the path was evicted meanwhile, so there is nothing to alias it to.
    let _ = w.alias(&k, key, now, until - now);
}

/// How many probes an insert into a full address slab makes for an idle learned entry.
const EVICT_PROBES: u32 = 64;

/// The address entries, their index, lists and counts.
pub(crate) struct Addrs<S: Storage> {
    /// The entries.
    pub(crate) entries: S::Addrs,
    /// The index's buckets.
    buckets: S::AddrBuckets,
    /// The hash seed of the index.
    seed: u64,
    /// Free entries.
    pub(crate) free: List,
    /// Entries with an ACM MAD to send (our query, a response to a peer).
    pub(crate) send: List,
    /// Removed local addresses whose cache alias is still to be dropped.
    pub(crate) removals: List,
    /// Where the next eviction probe looks.
    evict_hand: u32,
    /// Entries Queued or Querying.
    pub(crate) active: u32,
}

impl<S: Storage> Addrs<S> {
    /// Every entry of `entries` free, an empty index over `buckets`.
    pub(crate) fn new(mut entries: S::Addrs, mut buckets: S::AddrBuckets, seed: u64) -> Self {
        entries.fill(AddrEntry::EMPTY);
        buckets.fill(0);
        let mut free = List::EMPTY;
        for i in 0..entries.len() as u32 {
            free.push_back(&mut entries, i, list_id::FREE, ADDR_Q);
        }
        Addrs {
            entries,
            buckets,
            seed: seed ^ 0xadd7,
            free,
            send: List::EMPTY,
            removals: List::EMPTY,
            evict_hand: 0,
            active: 0,
        }
    }

    fn bucket(&self, slot: usize, type_: AddressType, addr: &[u8; 64]) -> usize {
        let head = (slot as u32) << 8 | u32::from(u8::from(type_));
        bucket_of(self.seed, head, addr, self.buckets.len())
    }

    /// The entry for (endpoint slot, type, address).
    pub(crate) fn find(&self, slot: usize, type_: AddressType, addr: &[u8; 64]) -> Option<u32> {
        let b = self.bucket(slot, type_, addr);
        chain::find(&self.entries, &self.buckets, b, |a| {
            a.state != AddrState::Free
                && usize::from(a.slot) == slot
                && a.type_ == type_
                && a.addr == *addr
        })
    }

    /// A new entry (state Resolved, origin Learned, no mapping yet), evicting an idle learned
    /// entry (no waiters, no route job, no response to send) if every entry is used (an
    /// evicted entry leaves its endpoint's list in `eps`).
    pub(crate) fn alloc(
        &mut self,
        eps: &mut [EpSlot],
        slot: usize,
        type_: AddressType,
        addr: &[u8; 64],
    ) -> Option<u32> {
        if self.free.is_empty() {
            let n = self.entries.len() as u32;
            for _ in 0..EVICT_PROBES.min(n) {
                let i = self.evict_hand % n;
                self.evict_hand = self.evict_hand.wrapping_add(1);
                let a = &self.entries[i as usize];
                let idle = a.state == AddrState::Resolved
                    && a.origin == Origin::Learned
                    && a.job == 0
                    && !a.send_resp
                    && a.waiters.is_empty();
                if idle {
                    // Idle: on no job, so no job's list to leave.
                    self.free_entry(eps, &mut [], i);
                    break;
                }
            }
        }
        let i = self
            .free
            .pop_front(&mut self.entries, list_id::FREE, ADDR_Q)?;
        let b = self.bucket(slot, type_, addr);
        let a = &mut self.entries[i as usize];
        *a = AddrEntry::EMPTY;
        a.state = AddrState::Resolved;
        a.slot = slot as u8;
        a.type_ = type_;
        a.addr = *addr;
        chain::insert(&mut self.entries, &mut self.buckets, b, i);
        Some(i)
    }

    /// Takes entry `i` off the list its `qlink` is on (its endpoint's in `eps`, or the
    /// removals).
    pub(crate) fn unlink_q(&mut self, eps: &mut [EpSlot], i: u32) {
        let addrs = &mut *self.entries;
        let a = &addrs[i as usize];
        let (on, e) = (a.qlink.on, &mut eps[usize::from(a.slot)]);
        match on {
            list_id::ACM_QUEUE => {
                e.queue.remove(addrs, i, on, ADDR_Q);
            }
            list_id::ACM_INFLIGHT => {
                e.inflight.remove(addrs, i, on, ADDR_Q);
                e.acm_inflight = e.acm_inflight.saturating_sub(1);
            }
            list_id::LOCALS => {
                e.locals.remove(addrs, i, on, ADDR_Q);
            }
            list_id::REMOVALS => {
                self.removals.remove(addrs, i, on, ADDR_Q);
            }
            _ => {}
        }
    }

    /// Frees entry `i`: off every list (its endpoint's in `eps`), out of its route job's
    /// addresses (in `jobs`) and of the hash (its waiters must have been answered).
    pub(crate) fn free_entry(&mut self, eps: &mut [EpSlot], jobs: &mut [JobSlot], i: u32) {
        let a = self.entries[i as usize];
        if a.state == AddrState::Free {
            return;
        }
        if matches!(a.state, AddrState::Queued | AddrState::Querying) {
            self.active -= 1;
        }
        self.unlink_q(eps, i);
        let b = self.bucket(usize::from(a.slot), a.type_, &a.addr);
        let addrs = &mut *self.entries;
        self.send.remove(addrs, i, list_id::ACM_SEND, ADDR_S);
        if let Some(j) = a.job.checked_sub(1) {
            jobs[j as usize]
                .addrs
                .remove(addrs, i, list_id::ROUTE_ADDRS, ADDR_R);
        }
        chain::remove(addrs, &mut self.buckets, b, i);
        addrs[i as usize] = AddrEntry::EMPTY;
        self.free.push_back(addrs, i, list_id::FREE, ADDR_Q);
    }
}

#[cfg(feature = "std")]
impl<S: Storage> Addrs<S> {
    /// Every entry is on the list its state says, only queries have waiters, and the count of
    /// queries matches; returns how many requests wait on entries.
    pub(crate) fn check(&self) -> Result<u32, std::string::String> {
        use std::format;
        let (mut active, mut waiters) = (0u32, 0u32);
        for a in self.entries.iter() {
            let want = match a.state {
                AddrState::Free => list_id::FREE,
                AddrState::Queued => list_id::ACM_QUEUE,
                AddrState::Querying => list_id::ACM_INFLIGHT,
                AddrState::Local => list_id::LOCALS,
                AddrState::Removing => list_id::REMOVALS,
                AddrState::Resolved => 0,
            };
            if a.qlink.on != want {
                return Err(format!("address in {:?} on list {}", a.state, a.qlink.on));
            }
            if matches!(a.state, AddrState::Queued | AddrState::Querying) {
                active += 1;
            } else if !a.waiters.is_empty() {
                return Err(format!("address in {:?} with waiters", a.state));
            }
            waiters += a.waiters.len;
        }
        if active != self.active {
            return Err(format!("acm_active {active}/{}", self.active));
        }
        Ok(waiters)
    }
}

impl<S: Storage> Addrs<S> {
    /// Adds the requests of `waiters` (over the request slots `reqs`) to entry `i`'s waiters,
    /// leaving `waiters` empty.
    pub(crate) fn add_waiters(&mut self, reqs: &mut [RequestSlot], i: u32, waiters: &mut List) {
        self.entries[i as usize]
            .waiters
            .append(waiters, reqs, list_id::WAITERS, REQ);
    }

    /// Entry `i` becomes a local address of endpoint `e` (slot `slot`), under `cache_ep`.
    pub(crate) fn make_local(&mut self, e: &mut EpSlot, i: u32, cache_ep: CacheEp) {
        let a = &mut self.entries[i as usize];
        a.state = AddrState::Local;
        a.gid = e.port_gid;
        a.lid = e.lid;
        a.qpn = e.qpn;
        a.expires = NEVER;
        a.cache_ep = cache_ep;
        e.locals
            .push_back(&mut self.entries, i, list_id::LOCALS, ADDR_Q);
    }

    /// Local address `i` is removed: its cache alias is dropped at the next input that
    /// passes the cache (the `Removal` timer asks for one at once).
    pub(crate) fn remove_local(&mut self, eps: &mut [EpSlot], i: u32, sh: &mut Shared) {
        self.unlink_q(eps, i);
        self.entries[i as usize].state = AddrState::Removing;
        self.removals
            .push_back(&mut self.entries, i, list_id::REMOVALS, ADDR_Q);
        sh.timers.arm(Timer::Removal, 0);
    }

    /// A hosts-file mapping: entry `i` is `gid`, Resolved from the preload, expiring at
    /// `expires`, under `cache_ep`.
    pub(crate) fn preload(a: &mut AddrEntry, gid: Gid, expires: Millis, cache_ep: CacheEp) {
        a.state = AddrState::Resolved;
        a.origin = Origin::Preload;
        a.gid = gid.0;
        a.lid = 0;
        a.group = 0;
        a.expires = expires;
        a.cache_ep = cache_ep;
    }
}

/// When an address mapping made at `now` expires.
pub(crate) fn expiry(cfg: &Config, now: Millis) -> Millis {
    cfg.addr_ttl.map_or(NEVER, |t| now.saturating_add(t))
}

/// The key and SA record of entry `a`'s route from endpoint `e`: ibacmp's `{sgid, dgid,
/// pkey, tclass}`.
pub(crate) fn route_key(e: &EpSlot, a: &AddrEntry) -> (Option<PathKey>, [u8; 64]) {
    let tclass = e
        .groups
        .record(a.group)
        .map_or(0, |r| McMemberRecord::new_unchecked(&r[..]).tclass());
    let view = e.view(a.cache_ep);
    let (k, sa) = request::normalise(&view, &request::gid_record(Gid(a.gid), tclass));
    (request::cache_key(a.cache_ep, &k), sa)
}

/// A route job ended: the address entries of `list` (its addresses) wait on it no more, and
/// those Resolved are aliased to its path, `path` (its key and expiry as inserted), if it found
/// one.
pub(crate) fn routed<C: CacheRef>(
    addrs: &mut [AddrEntry],
    mut list: List,
    path: Option<(&PathKey, Millis)>,
    w: &mut CacheWriter<C>,
    now: Millis,
) {
    while let Some(a) = list.pop_front(addrs, list_id::ROUTE_ADDRS, ADDR_R) {
        addrs[a as usize].job = 0;
        if let Some((k, exp)) = path {
            let e = addrs[a as usize];
            if e.state == AddrState::Resolved {
                alias(w, &e, k, now, exp);
            }
        }
    }
}

/// The request's source entry (a name or IP address and its 64 bytes), if it names one: the
/// entry at `src_index` (where the core put the source the client gave, or the one it
/// selected with `src_out` set), else any entry flagged `ACM_EP_FLAG_SOURCE`.
pub(crate) fn source_entry(msg: &[u8]) -> Option<(AddrKind, [u8; 64])> {
    let m = AcmMsg::new_checked(msg).ok()?;
    let layout = m.check_resolve().ok()?;
    let pick = |i: usize| -> Option<(AddrKind, [u8; 64])> {
        let e = m.entry(i)?;
        if e.flags() & EP_FLAG_SOURCE == 0 && layout.source != Some(i) {
            return None;
        }
        let t = AddrKind::try_from(e.info_type()).ok()?;
        let mut a = [0u8; 64];
        a.copy_from_slice(e.info());
        (a != [0; 64]).then_some((t, a))
    };
    let first = usize::from(m.src_index());
    pick(first).or_else(|| {
        (0..=layout.count.min(7))
            .filter(|&i| i != first)
            .find_map(pick)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_keys_only_for_names_and_ips() {
        let mut a = AddrEntry::EMPTY;
        a.cache_ep = crate::cache::ep_number(2, 3);
        a.addr[..3].copy_from_slice(b"abc");
        for (t, kind) in [
            (1, AddrKind::Name),
            (2, AddrKind::Ipv4),
            (3, AddrKind::Ipv6),
        ] {
            a.type_ = AddressType::from(t);
            let k = addr_key(&a).unwrap();
            assert_eq!(
                (k.ep, k.kind, &k.addr[..3]),
                (a.cache_ep, kind, &b"abc"[..])
            );
        }
        for t in [0, 4, 5, 6] {
            a.type_ = AddressType::from(t);
            assert!(addr_key(&a).is_none());
        }
    }

    #[test]
    #[cfg(feature = "sim")]
    fn source_entry_is_the_requests_echoed_source() {
        let m = crate::sim::name_msg("dst", Some("src"), false, 1);
        let (t, a) = source_entry(&m).unwrap();
        assert_eq!((t, &a[..3]), (AddrKind::Name, &b"src"[..]));
        assert!(source_entry(&crate::sim::name_msg("dst", None, false, 1)).is_none());
        assert!(source_entry(&m[..20]).is_none());
        // A source the client gave: flagged SOURCE, src_out 0 (the core selected nothing).
        let mut m = m;
        m[3] = 0;
        let (t, a) = source_entry(&m).unwrap();
        assert_eq!((t, &a[..3]), (AddrKind::Name, &b"src"[..]));
        m[4] = 0; // src_index wrong: found by its flag
        assert_eq!(source_entry(&m).map(|s| s.0), Some(AddrKind::Name));
        m[88..92].copy_from_slice(&0u32.to_ne_bytes()); // no SOURCE flag any more
        assert!(source_entry(&m).is_none());
    }
}
