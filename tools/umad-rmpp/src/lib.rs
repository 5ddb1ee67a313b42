//! `libumad_rmpp.so`: the kernel MAD layer's RMPP sender for a process whose umad device is
//! simulated by umad2sim (OpenSM on an ibsim fabric). Preload it **before** umad2sim:
//! `LD_PRELOAD=libumad_rmpp.so:libumad2sim.so`.
//!
//! umad2sim turns every umad `write` into one 256-byte MAD, so OpenSM's multi-record SA answers
//! (GetTableResp with RMPP Active, any length) would reach their requester cut to one MAD. On
//! real hardware `ib_mad` segments such a send and paces it by the receiver's ACKs. This
//! library does that between OpenSM and umad2sim:
//!
//! * `write` on a umad fd (umad2sim's are 1024..2048) of a SubnAdm response with RMPPFlags
//!   Active is sent as RMPP DATA segments ([`sender`]), each one a umad write of the original
//!   umad header + 256 bytes through the next `write` (umad2sim's). A response that fits one
//!   MAD is sent as a one-segment transfer (First|Last, its own PayloadLength) and not
//!   followed. Everything else passes through untouched.
//! * `read` on a umad fd: an RMPP ACK / STOP / ABORT of class 3 sent by a receiver is taken
//!   here (it drives its transfer, or is counted as stray) and never reaches OpenSM, which
//!   would otherwise see a new GetTable request; so is one of our own segments that ibsim
//!   returns undeliverable. Then the next MAD is awaited (the next `poll` on the fd, no
//!   timeout: OpenSM's receiver thread reads with `umad_recv(..., -1)`).
//! * a timer thread sends again from the last ACK when no ACK moves a transfer within
//!   200 ms, and aborts after 5 such timeouts (ABORT 126) or 10 s (ABORT 118).
//!
//! Counters: `$UMAD_RMPP_STATS` names a file rewritten (`key=value` lines) whenever a transfer
//! starts or ends. `docs/umad-rmpp.md` has the details.
//!
//! `read`/`write` are exported only in the cdylib proper (not under `cfg(test)`): a program
//! that linked this code in any other way would have its own I/O replaced.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod sender;

#[cfg(not(test))]
mod shim;
