//! Provider adapters.
