//! acmrs dataplane: the parts of the provider that do not touch the ibacm ABI.
//!
//! * [`route_table`]: a fixed-capacity PathRecord cache with one writer (the worker) and
//!   lock-free readers (the ibacm main thread answering cache hits inline). Seqlock per slot,
//!   all storage allocated at construction.
//! * [`worker`]: the provider's single worker thread, the place the pinned busy-poll loop lives.
//!   It runs a [`worker::Poller`] (the provider's engine) with adaptive spin-then-park and
//!   keeps a coarse clock readers can use without a syscall.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod route_table;
pub mod worker;
