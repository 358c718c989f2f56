//! rope reference: being written.
