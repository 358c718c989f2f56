//! rope: being written.
