//! `acm-core-nostd`: the allocation-free heart of acmrs.
//!
//! Everything here runs without `std` and without an allocator (but `sim`, and the
//! resolver's `HeapStorage`, behind the `std` feature), so the same code serves the ibacm
//! provider, the simulator and firmware experiments:
//!
//! * [`node`]: the central type: one provider instance as one sans-IO machine, the
//!   [`resolver`] and its SA transport ([`sa_channel`], the SA carriers, the SM addresses,
//!   the tries) composed; the dataplane, the simulator and the firmware drive a [`node::Node`].
//! * [`resolver`]: every decision the provider makes (route and address resolution, the ACM
//!   multicast protocol, joins, coalescing, retries, deadlines, half-world tables) as a
//!   sans-IO, allocation-free state machine over caller-provided storage.
//! * [`sa_channel`]: the SA client of a UD QP of our own (unpredictable TIDs, tries and
//!   timeouts, one completion per request, and only the SM's MADs taken).
//! * [`rmpp`]: the receiver of one RMPP transfer (IBA 13.6; a multi-segment SA GetTable answer):
//!   reassembly into caller storage, ACKs and windows, timeouts, STOP and ABORT.
//! * [`cache`]: fixed-capacity path-record and address caches over caller-provided storage, with
//!   one writer and lock-free readers, expiry, negative entries and eviction.
//! * [`wire`]: zero-copy views and parsed forms of the InfiniBand MAD common header, RMPP and SA
//!   headers, SA PathRecord and MCMemberRecord, the ACM class 0x2C resolve MAD, and the ibacm
//!   client protocol (`acm_msg`), plus rate/MTU tables that know HDR and NDR.
//! * [`text`]: line-by-line parsers for `ibacm_opts.cfg`, `ibacm_hosts.data`,
//!   `ibacm_addr.cfg` and OpenSM's `dump_pr` full path-record dump, and the address parsers.
//! * [`park`]: the park-flag handshake between a consumer that blocks when idle and the
//!   producers that wake it (the dataplane worker's), so that no wake-up is missed.
//! * [`rng`]: a tiny deterministic PRNG (splitmix64) for seeds, jitter and simulations.
//! * `sim` (feature `sim`, host only): a deterministic in-memory InfiniBand model (UD
//!   network, multicast, an SA) that drives resolvers in virtual time.
//! * `sync` (private): the atomics, from `core`, or from `loom` under `cfg(loom)` to
//!   model-check the cache's seqlock.
//!
//! The crate owns no clock: callers pass the current time in.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![deny(missing_docs)]
// No `unsafe` anywhere in the crate: enforced, not just observed.
#![forbid(unsafe_code)]

pub mod cache;
pub mod node;
pub mod park;
pub mod resolver;
pub mod rmpp;
pub mod rng;
pub mod sa_channel;
#[cfg(feature = "sim")]
pub mod sim;
mod sync;
pub mod text;
pub mod wire;
