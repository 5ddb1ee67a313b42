//! acmrs dataplane (placeholder until the worker lands).
