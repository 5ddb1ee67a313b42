//! A deterministic in-memory InfiniBand model to drive resolvers in virtual time (feature
//! `sim`, host only): UD unicast and multicast, an SA, loss, duplication, reordering, delay.
