//! The front decision: what a RESOLVE request gets from the cache before any resolver work.
//!
//! One rule set, written once, for every place a request meets the cache: the provider's
//! inline hit path on the core's thread, the simulator's model of it, and the resolver's own
//! second look at a request handed over to it (the entry may have arrived in between):
//!
//! | the request | the cache | decision |
//! |---|---|---|
//! | malformed (or refused by classification) | – | answer its status |
//! | on a closed endpoint | – | answer ENODATA |
//! | route or address | a fresh entry | answer it; hand over a refresh if the entry asks for one |
//! | route or address | a negative entry | answer its status |
//! | `ACM_FLAGS_NODELAY` | nothing usable | answer ENODATA, hand over a prime |
//! | anything else | nothing usable | hand over: the resolver answers it |
//!
//! [`look`] is the lookup that goes with it, for callers that do not look up themselves (the
//! provider reads route entries straight into its answer frame, `PathCache::lookup_into`, and
//! passes what it found to [`decide`]).

use core::ops::Deref;

use super::request::Target;
use super::Millis;
use crate::cache::{AddrSlot, Lookup, PathCache, PathSlot};
use crate::wire::client::Status;

/// What the front does with a RESOLVE request ([`decide`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Front {
    /// Answer it now from the entry the lookup found (status 0); then, with `refresh`, hand
    /// the request over as a [`Kind::Refresh`](super::Kind::Refresh) (the entry is near its
    /// expiry and this caller is the one asked to renew it).
    Hit {
        /// Hand over a refresh after answering.
        refresh: bool,
    },
    /// Answer it now with this status; nothing to hand over.
    Answer(Status),
    /// Answer it now with ENODATA (a NODELAY request that missed), then hand it over as a
    /// [`Kind::Prime`](super::Kind::Prime) so the next one finds the entry.
    Prime,
    /// Hand it over as a [`Kind::Resolve`](super::Kind::Resolve): the resolver answers it.
    HandOver,
}

/// The front decision for a RESOLVE request classified as `target`, on an endpoint that is
/// `open` or not, given what the cache held for it (`lookup`; [`Lookup::Miss`] if it was not
/// looked up). See the [module docs](self) for the rules.
#[inline(always)]
pub fn decide<R>(target: &Target, open: bool, lookup: &Lookup<R>) -> Front {
    let nodelay = match *target {
        Target::Fail(status) => return Front::Answer(status),
        Target::Route { nodelay, .. } | Target::Address { nodelay, .. } => nodelay,
    };
    if !open {
        return Front::Answer(Status::Enodata);
    }
    match *lookup {
        Lookup::Hit { needs_refresh, .. } => Front::Hit {
            refresh: needs_refresh,
        },
        // The cache stores a negative entry's status as the byte the resolver wrote
        // ([`Status`] as `u8`, never 0): read back, it is that status again.
        Lookup::Negative { status, .. } => Front::Answer(Status::from(status)),
        Lookup::Miss | Lookup::Busy if nodelay => Front::Prime,
        Lookup::Miss | Lookup::Busy => Front::HandOver,
    }
}

/// What `cache` holds at `now` for a request classified as `target`. `alias_stale`: an
/// address removed from this endpoint may still be aliased in the cache (its removal has not
/// been applied by the cache's writer yet), so address lookups must miss.
pub fn look<P, A>(
    cache: &PathCache<P, A>,
    target: &Target,
    now: Millis,
    alias_stale: bool,
) -> Lookup
where
    P: Deref<Target = [PathSlot]>,
    A: Deref<Target = [AddrSlot]>,
{
    match target {
        Target::Route { key: Some(k), .. } => cache.lookup_hashed(&cache.hashed(k), now),
        Target::Address { key, .. } if !alias_stale => cache.lookup_addr(key, now),
        _ => Lookup::Miss,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{ep_number, AddrKey};

    fn addr(nodelay: bool) -> Target {
        Target::Address {
            key: AddrKey::name(ep_number(0, 0), "n").unwrap(),
            nodelay,
        }
    }

    #[test]
    fn every_rule_of_the_table() {
        let hit = |needs_refresh| Lookup::Hit {
            record: (),
            expires_at: 9,
            needs_refresh,
        };
        let neg = Lookup::<()>::Negative {
            status: 4,
            until: 9,
        };
        let miss = Lookup::<()>::Miss;
        assert_eq!(
            decide(&Target::Fail(Status::Einval), true, &hit(false)),
            Front::Answer(Status::Einval)
        );
        assert_eq!(
            decide(&Target::Fail(Status::Einval), false, &miss),
            Front::Answer(Status::Einval)
        );
        for nodelay in [false, true] {
            let t = addr(nodelay);
            assert_eq!(
                decide(&t, false, &hit(false)),
                Front::Answer(Status::Enodata)
            );
            assert_eq!(decide(&t, true, &hit(false)), Front::Hit { refresh: false });
            assert_eq!(decide(&t, true, &hit(true)), Front::Hit { refresh: true });
            assert_eq!(decide(&t, true, &neg), Front::Answer(Status::Unknown(4)));
            let missed = if nodelay {
                Front::Prime
            } else {
                Front::HandOver
            };
            assert_eq!(decide(&t, true, &miss), missed);
            assert_eq!(decide(&t, true, &Lookup::<()>::Busy), missed);
        }
    }
}
