//! acmrs dataplane: the parts of the provider that do not touch the ibacm ABI.
//!
//! The path cache itself is `acm-core-nostd::cache` (one writer: the worker).
//!
//! * [`worker`]: the provider's single worker thread, the place the pinned busy-poll loop lives.
//!   It runs a [`worker::Poller`] (the provider's engine) with adaptive spin-then-park and
//!   keeps a coarse clock readers can use without a syscall.
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod verbs;
pub mod worker;
