//! acmrs dataplane: the IO owner of the provider, and everything of it that does not touch
//! the ibacm ABI.
//!
//! * [`plane`]: the loop that owns the node (`acm_core_nostd::node::Node`: the sans-IO
//!   resolver and its SA transport), the endpoints' UD queue pairs and every cache write; its
//!   IO sits behind two small traits so the same loop runs over verbs and the core's SA
//!   service, or over in-memory fakes. Its files: the round (`plane/mod.rs`), the inbox
//!   (`inbox.rs`), the endpoints (`eps.rs`), the node's events as log lines (`events.rs`),
//!   drop logging (`drops.rs`), panic recovery (`recovery.rs`), the latency hooks
//!   (`latency.rs`) and when an SA reply is due (`reply_due.rs`).
//! * [`verbs`]: one UD endpoint per (port, partition) over libibverbs (the loop's `Ud` in
//!   production), the P_Key lookups and the one reader of a port's attributes.
//! * [`worker`]: the thread the loop runs on: pinned busy-poll, or adaptive spin-then-block on
//!   the completion channels and a wake-up eventfd, and the loop's rounds on the producers'
//!   threads when it is free; keeps a coarse clock readers can use without a syscall.
//! * [`watchdog`]: the stall watchdog thread: requests waiting on a loop that runs no round
//!   are answered ETIMEDOUT (new ones at once) until it runs again; a worker stuck between
//!   rounds gets a round run by the watchdog.
//! * [`stats`]: latency histograms of one writer at a time (hit path, misses, SA round trips)
//!   and the latency clock (calibrated TSC).
//! * `count_allocs` (tests, and the `count-allocs` feature): the counting allocator of the
//!   "no allocation on this path" tests.
//! * [`export`]: the exporter thread: Prometheus textfile, stats socket (`acmrs-stat`).
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[cfg(any(test, feature = "count-allocs"))]
pub mod count_allocs;
pub mod export;
pub mod plane;
pub mod stats;
pub mod verbs;
pub mod watchdog;
pub mod worker;

// This crate's unit tests count allocations (`verbs::send_alloc`).
#[cfg(test)]
#[global_allocator]
static COUNTING: count_allocs::CountingAlloc = count_allocs::CountingAlloc;
