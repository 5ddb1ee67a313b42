//! acmrs dataplane: the IO owner of the provider, and everything of it that does not touch
//! the ibacm ABI.
//!
//! * [`plane`]: the loop that owns the sans-IO resolver (`acm-core-nostd::resolver`), the
//!   endpoints' UD queue pairs and every cache write; its IO sits behind two small traits so
//!   the same loop runs over verbs and the core's SA service, or over in-memory fakes. Its
//!   files: the round (`plane/mod.rs`), the inbox, the `ud` SA transport, panic recovery and
//!   drop logging.
//! * [`verbs`]: one UD endpoint per (port, partition) over libibverbs (the loop's `Ud` in
//!   production), the P_Key lookups and the one reader of a port's attributes.
//! * [`worker`]: the thread the loop runs on: pinned busy-poll, or adaptive spin-then-block on
//!   the completion channels and a wake-up eventfd; keeps a coarse clock readers can use
//!   without a syscall.
//! * [`stats`]: single-writer latency histograms (hit path, misses, SA round trips) and the
//!   latency clock (calibrated TSC).
//! * [`export`]: the exporter thread: Prometheus textfile, stats socket (`acmrs-stat`).
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod export;
pub mod plane;
pub mod stats;
pub mod verbs;
pub mod watchdog;
pub mod worker;
