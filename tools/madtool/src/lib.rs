//! The decoders behind `madtool` (the binary in `src/main.rs`), as a library so that other
//! code can run them on arbitrary bytes — the fuzz targets in `fuzz`
//! (`madtool_decode`, `madtool_pcap`) do.
//!
//! * [`decode`]: a MAD (SA PathRecord / MCMemberRecord, ibacm class 0x2C, any other class by
//!   its common header) or an ibacm client message as indented `Name: value` text, and the
//!   `--hex` input parser (`madtool decode`);
//! * [`pcap`]: pcap files of InfiniBand frames, their IB headers and the MADs they carry
//!   (`madtool pcap`).
//!
//! Every function here takes bytes and returns text or an error message; none panics on any
//! input. The libibumad capture code (`madtool capture`) stays in the binary.

pub mod decode;
pub mod pcap;
