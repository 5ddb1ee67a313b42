//! Client requests: classification, cache keys and answers (pure functions).
//!
//! The provider's inline hit path and the [`Resolver`](super::Resolver) both use these, so a
//! request is read, keyed and answered one way everywhere.
