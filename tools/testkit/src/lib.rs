//! Test support for acmrs (not published).
//!
//! * [`request`]: client requests (PATH, destination) as ibacm hands them to the provider,
//!   built with `acm_core_nostd::wire::client`, and accessors for the answers.
//! * [`core`]: a fake ibacm core: the helpers `/usr/sbin/ibacm` exports to providers, exported
//!   from the executable linking this crate (link it with `-Wl,--export-dynamic` and call
//!   [`core::link`]), a fake SA service that holds every MAD until told what to do, and
//!   records of every answer, counter and log line.
//! * [`host`]: loading `libacmrs.so` and driving it as ibacm does (device, port, endpoints,
//!   addresses, `resolve()`/`query()`/`query_perf()`/`handle_event()`), with a dataplane
//!   barrier for assertions that something did *not* happen.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]

pub mod core;
pub mod host;
pub mod request;
