//! Protection domains and memory regions.
