//! acmrs provider (placeholder).
