//! simulated verbs (placeholder).
